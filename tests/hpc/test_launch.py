"""`scaledl launch`: golden commands from recorded environments, its errors, and one real launch."""
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tool
from scaledl.hpc import launchers
from scaledl.cli import main
from scaledl.hpc.launch import Target, build_plan, describe, parse_target
from scaledl.launch_env import LaunchError
from scaledl.sharding import worker_context
from scaledl.hpc.systems import (AURORA_COMM_ENV, POLARIS_COMM_ENV, POLARIS_GPU_BIND, detect_system,
                                 task_plugin_binds_cpus)

DDP = Target("scaledl.ladder.ddp", ("--epochs", "1"))
POLARIS_HOSTS = ("x3005c0s13b0n0.hsn.cm.polaris.alcf.anl.gov", "x3005c0s13b1n0.hsn.cm.polaris.alcf.anl.gov")
AURORA_HOSTS = ("x4102c5s2b0n0.hostmgmt2102.cm.aurora.alcf.anl.gov",
                "x4102c5s3b0n0.hostmgmt2102.cm.aurora.alcf.anl.gov")


def nodefile(tmp_path, *hosts):
    path = tmp_path / "nodefile"
    path.write_text("".join(h + "\n" for h in hosts))
    return str(path)


def polaris_job(tmp_path, nodes):
    # Recorded in the batch shell of a PBS job on Polaris (where the job script runs mpiexec).
    return {"PBS_JOBID": "1234567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov", "PBS_O_WORKDIR": "/home/u/run",
            "PBS_NODEFILE": nodefile(tmp_path, *POLARIS_HOSTS[:nodes]), "PBS_QUEUE": "debug"}


def test_local_runs_torchrun_with_a_share_of_the_cores_each():
    plan = build_plan(2, DDP, env={}, hostname="laptop", python="python")
    assert (plan.system, plan.nodes, plan.ppn) == ("local", 1, 2)
    assert Path(plan.command[0]).name == "torchrun"
    assert plan.command[1:] == ["--standalone", "--nproc_per_node=2", "-m", "scaledl.ladder.ddp", "--epochs", "1"]
    assert plan.env == launchers.local_env(2, {})  # nothing was set before, so all of it is new
    assert not plan.presets


def test_local_script_is_run_by_path():
    plan = build_plan(3, Target("train.py", ("--lr", "0.1")), env={}, hostname="laptop")
    assert plan.command[1:] == ["--standalone", "--nproc_per_node=3", "train.py", "--lr", "0.1"]


def test_polaris_one_node(tmp_path):
    env = polaris_job(tmp_path, 1)
    plan = build_plan(4, DDP, env=env, hostname="x3005c0s13b0n0", python="python")
    assert plan.command == ["mpiexec", "-n", "4", "--ppn", "4", "--depth", "8", "--cpu-bind", "depth",
                            "--hostfile", env["PBS_NODEFILE"], "--env", "OMP_NUM_THREADS=8",
                            "bash", "-c", POLARIS_GPU_BIND, "gpu-bind",
                            "python", "-m", "scaledl.ladder.ddp", "--epochs", "1"]
    plugin = {"LD_LIBRARY_PATH": "/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:/soft/libraries/hwloc/lib"}
    assert plan.env == {**{p.name: p.value for p in POLARIS_COMM_ENV}, **plugin}
    assert plan.env["NCCL_NET"] == "AWS Libfabric"


def test_polaris_puts_the_nccl_plugin_first_on_the_library_path_only_where_it_is_missing(tmp_path):
    # NCCL_NET='AWS Libfabric' fails every communicator if libnccl-net.so cannot be loaded.
    job = polaris_job(tmp_path, 2)
    plan = build_plan(8, DDP, env={**job, "LD_LIBRARY_PATH": "/opt/cray/lib64"}, hostname="x3005c0s13b0n0")
    assert plan.env["LD_LIBRARY_PATH"] == ("/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:/soft/libraries/hwloc/lib:"
                                           "/opt/cray/lib64")
    [line] = [line for line in describe(plan).splitlines() if line.startswith("export LD_LIBRARY_PATH=")]
    assert line.startswith("export LD_LIBRARY_PATH=/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:"
                           "/soft/libraries/hwloc/lib:$LD_LIBRARY_PATH  # the aws-ofi-nccl plugin"), line
    # A plugin already on the path (the module's, or the user's own build) is left alone.
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "libnccl-net.so").write_bytes(b"")
    has_one = {**job, "LD_LIBRARY_PATH": f"/opt/cray/lib64:{tmp_path / 'plugin'}"}
    assert "LD_LIBRARY_PATH" not in build_plan(8, DDP, env=has_one, hostname="x3005c0s13b0n0").env
    # So is a job that asks NCCL for another network, or for no presets at all.
    sockets = {**job, "NCCL_NET": "Socket"}
    assert "LD_LIBRARY_PATH" not in build_plan(8, DDP, env=sockets, hostname="x3005c0s13b0n0").env
    assert build_plan(8, DDP, env=job, hostname="x3005c0s13b0n0", comm_env=False).env == {}


def test_polaris_two_nodes_keeps_what_the_user_set(tmp_path):
    env = {**polaris_job(tmp_path, 2), "NCCL_CROSS_NIC": "0"}
    plan = build_plan(8, Target("train.py"), env=env, hostname="x3005c0s13b0n0", python="python",
                      overrides={"NCCL_DEBUG": "INFO"})
    assert plan.command == ["mpiexec", "-n", "8", "--ppn", "4", "--depth", "8", "--cpu-bind", "depth",
                            "--hostfile", env["PBS_NODEFILE"], "--env", "OMP_NUM_THREADS=8",
                            "bash", "-c", POLARIS_GPU_BIND, "gpu-bind", "python", "train.py"]
    assert (plan.nodes, plan.world_size) == (2, 8)
    assert "NCCL_CROSS_NIC" not in plan.env and plan.kept == {"NCCL_CROSS_NIC": "0"}
    assert plan.env["NCCL_DEBUG"] == "INFO" and plan.env["FI_MR_CACHE_MONITOR"] == "userfaultfd"


def test_polaris_single_rank_gets_the_numa_node_of_its_gpu(tmp_path):
    # Cores 0-7 (NUMA node 0) and GPU 3, the one on that node; tests/hpc/test_binding.py checks every --ppn.
    plan = build_plan(1, DDP, env=polaris_job(tmp_path, 1), python="python")
    assert plan.command[:9] == ["mpiexec", "-n", "1", "--ppn", "1", "--depth", "8", "--cpu-bind", "depth"]


def test_polaris_wrapper_gives_local_rank_r_gpu_3_minus_r():
    devices = []
    for local_rank in range(4):
        env = {"PATH": os.environ["PATH"], "PALS_LOCAL_RANKID": str(local_rank)}
        result = subprocess.run(["bash", "-c", POLARIS_GPU_BIND, "gpu-bind", "printenv", "CUDA_VISIBLE_DEVICES"],
                                env=env, capture_output=True, text=True, check=True)
        devices.append(result.stdout.strip())
    assert devices == ["3", "2", "1", "0"]  # ALCF's set_affinity_gpu_polaris.sh


def test_aurora_two_nodes_binds_one_tile_per_rank(tmp_path):
    env = {"PBS_JOBID": "8901.aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov",
           "PBS_NODEFILE": nodefile(tmp_path, *AURORA_HOSTS)}
    plan = build_plan(24, DDP, env=env, hostname="x4102c5s2b0n0", python="python")
    assert plan.command == [
        "mpiexec", "-n", "24", "--ppn", "12",
        "--cpu-bind", "list:1-8:9-16:17-24:25-32:33-40:41-48:53-60:61-68:69-76:77-84:85-92:93-100",
        "--hostfile", env["PBS_NODEFILE"], "--env", "OMP_NUM_THREADS=8",
        "python", "-m", "scaledl.ladder.ddp", "--epochs", "1"]  # no mask: local rank r takes xpu:<r>
    assert plan.env == {p.name: p.value for p in AURORA_COMM_ENV}
    assert plan.env["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT"
    assert plan.env["CCL_PROCESS_LAUNCHER"] == "pmix" and plan.env["FI_PROVIDER"] == "cxi"


def test_slurm_two_nodes():
    # Recorded in `sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-node=4`.
    env = {"SLURM_JOB_ID": "987654", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4",
           "SLURM_JOB_NODELIST": "nid[001002-001003]", "SLURM_NTASKS_PER_NODE": "4"}
    plan = build_plan(8, DDP, env=env, hostname="nid001002", python="python")
    assert plan.command == ["srun", "-N", "2", "-n", "8", "--ntasks-per-node", "4", "--gpus-per-task", "1",
                            "--cpu-bind=cores", "python", "-m", "scaledl.ladder.ddp", "--epochs", "1"]
    assert plan.env == {}


def test_slurm_passes_the_allocations_cpus_per_task_on():
    # `salloc --cpus-per-task=8` sets SLURM_CPUS_PER_TASK; srun >= 22.05 does not inherit it.
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_PER_TASK": "8"}
    assert "--cpus-per-task=8" in build_plan(4, DDP, system="slurm", env=env, python="python").command
    # SRUN_CPUS_PER_TASK is srun's own way to say it (the user set it): left to srun, as is no value at all.
    for extra in ({"SRUN_CPUS_PER_TASK": "8"}, {"SLURM_CPUS_PER_TASK": ""}):
        command = build_plan(4, DDP, system="slurm", env={**env, **extra}, python="python").command
        assert not any(part.startswith("--cpus-per-task") for part in command)


def test_slurm_shares_a_whole_nodes_cpus_out_when_the_job_asked_for_no_cpus_per_task():
    # `sbatch --exclusive --ntasks-per-node=4` on a 64-CPU node: SLURM_CPUS_ON_NODE=64, no SLURM_CPUS_PER_TASK;
    # without -c each of the 4 ranks would be bound to one CPU.
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_ON_NODE": "64"}
    assert "--cpus-per-task=16" in build_plan(4, DDP, system="slurm", env=env, python="python").command
    assert "--cpus-per-task=21" in build_plan(3, DDP, system="slurm", env=env, python="python").command
    # The allocation's own -c wins; srun's own setting is the user's; a node with one CPU a rank adds nothing.
    assert "--cpus-per-task=8" in build_plan(4, DDP, system="slurm", env={**env, "SLURM_CPUS_PER_TASK": "8"},
                                              python="python").command
    for extra in ({"SRUN_CPUS_PER_TASK": "2"}, {"SLURM_CPUS_ON_NODE": "4"}, {"SLURM_CPUS_ON_NODE": "x"}):
        command = build_plan(4, DDP, system="slurm", env={**env, **extra}, python="python").command
        assert not any(part.startswith("--cpus-per-task") for part in command), extra


def test_a_slurm_job_without_gpus_tells_deepspeed_it_trains_on_the_cpu():
    from scaledl import devices

    cpu_job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1"}
    plan = build_plan(2, DDP, system="slurm", env=cpu_job, python="python")
    # On a node without GPUs (this one, unless a GPU is at hand) the ranks get DS_ACCELERATOR=cpu.
    assert plan.env.get("DS_ACCELERATOR") == (None if devices.accelerator_count() else "cpu")
    # The user's own choice, and a job Slurm gave GPUs, are left alone.
    assert "DS_ACCELERATOR" not in build_plan(2, DDP, system="slurm", env={**cpu_job, "DS_ACCELERATOR": "cuda"},
                                              python="python").env
    assert "DS_ACCELERATOR" not in build_plan(2, DDP, system="slurm", env={**cpu_job, "SLURM_GPUS_ON_NODE": "4"},
                                              python="python").env


def test_slurm_binds_cores_only_where_the_cluster_can():
    assert task_plugin_binds_cpus("TaskPlugin              = task/affinity,task/cgroup\n") is True
    assert task_plugin_binds_cpus("TaskPlugin              = task/none\nTaskPluginParam = (null type)\n") is False
    assert task_plugin_binds_cpus("no such line") is None
    # A binding the user chose (SLURM_CPU_BIND, which srun reads) is left to srun.
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPU_BIND": "sockets"}
    assert "--cpu-bind=cores" not in build_plan(2, DDP, system="slurm", env=env, python="python").command


@pytest.mark.parametrize("env, hostname, system", [
    ({}, "polaris-login-02", "polaris"),
    ({"PBS_JOBID": "55.aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov"}, "x4102c5s2b0n0", "aurora"),
    ({"PBS_JOBID": "55"}, "x3005c0s13b0n0", "polaris"),
    ({"SLURM_JOB_ID": "7"}, "polaris-login-02", "slurm"),
    ({}, "laptop", "local"),
])
def test_system_is_detected(env, hostname, system):
    assert detect_system(env, hostname)[0] == system


def test_unknown_pbs_system_must_be_named():
    with pytest.raises(LaunchError, match="--system"):
        detect_system({"PBS_JOBID": "55.pbs01"}, "node7")


def test_target_after_double_dash():
    assert parse_target(["--", "m", "--", "-x"]) == Target("m", ("--", "-x"))
    assert Target("a/b.py").python_command("py") == ["py", "a/b.py"]


@pytest.mark.parametrize("argv, env, message", [
    (["--system", "summit", "-n", "2", "--", "m"], {}, "argument --system: invalid choice"),
    (["--system", "polaris", "-n", "6", "--ppn", "4", "--dry-run", "--", "m"], {}, "-n 6 is not a multiple of --ppn 4"),
    (["-n", "2"], {}, "nothing to launch"),
    (["-n", "2", "--"], {}, "nothing to launch"),
    (["--system", "polaris", "-n", "12", "--", "m"], "nodefile", "PBS_NODEFILE names 2 nodes but this launch needs 3"),
    (["--system", "polaris", "-n", "8", "--ppn", "8", "--", "m"], "nodefile", "more than the 4 GPUs"),
    (["--system", "polaris", "-n", "4", "--", "m"], {}, "no PBS_NODEFILE here"),
    (["--env", "NOEQUALS", "-n", "2", "--", "m"], {}, "expected NAME=VALUE"),
    (["--nccl-fallback", "--env", "NCCL_NET=Socket", "-n", "2", "--dry-run", "--", "m"], {},
     "--nccl-fallback removes NCCL_NET, and --env sets it"),
])
def test_bad_input_is_one_line_and_exit_2(argv, env, message, tmp_path, monkeypatch, capsys):
    for name in [n for n in os.environ if n.startswith(("PBS_", "SLURM_", "PALS_"))]:
        monkeypatch.delenv(name)
    if env == "nodefile":
        monkeypatch.setenv("PBS_NODEFILE", nodefile(tmp_path, *POLARIS_HOSTS))
    try:
        code = main(["launch", *argv])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("scaledl launch: error: ") and err.count("\n") == 1 and message in err


def test_dry_run_prints_the_environment_and_the_command(tmp_path):
    env = {**polaris_job(tmp_path, 2), "PATH": os.environ["PATH"], "FI_CXI_DEFAULT_CQ_SIZE": "262144"}
    result = subprocess.run([tool("scaledl"), "launch", "-n", "8", "--dry-run", "--", "scaledl.ladder.ddp"],
                            env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    plan = build_plan(8, Target("scaledl.ladder.ddp"), env=env, python=tool("python"))  # scaledl's own interpreter
    assert shlex.split(lines[-1]) == plan.command  # a line the shell reads back as the same words
    exports = [line for line in lines if line.startswith("export ")]
    assert [line.split("=")[0][len("export "):] for line in exports] == list(plan.env)
    # what it is for, where documented (ALCF's guide; NVIDIA's for CUDA's own variable)
    assert all(" # " in line and ("docs.alcf.anl.gov" in line or "docs.nvidia.com" in line) for line in exports)
    assert "# kept your FI_CXI_DEFAULT_CQ_SIZE=262144" in lines
    assert not (tmp_path / "runs").exists()


def test_nccl_fallback_drops_alcfs_four_variables_from_the_presets_and_from_what_a_module_set(tmp_path):
    # A module (conda on Polaris may) set two of the four; the plugin's folder is then not added either.
    job = {**polaris_job(tmp_path, 2), "NCCL_NET": "AWS Libfabric", "NCCL_CROSS_NIC": "1",
           "FI_CXI_DEFAULT_CQ_SIZE": "9"}
    normal = build_plan(8, DDP, env=job, hostname=POLARIS_HOSTS[0])
    plan = build_plan(8, DDP, env=job, hostname=POLARIS_HOSTS[0], nccl_fallback=True)
    four = ["NCCL_NET_GDR_LEVEL", "NCCL_CROSS_NIC", "NCCL_COLLNET_ENABLE", "NCCL_NET"]
    assert plan.unset == tuple(four) and not set(four) & set(plan.env)
    assert {"NCCL_NET_GDR_LEVEL", "NCCL_COLLNET_ENABLE", "LD_LIBRARY_PATH"} <= set(normal.env)
    assert "LD_LIBRARY_PATH" not in plan.env and plan.env["NCCL_DEBUG"] == "INFO"
    # every other preset as without the flag, and what the job set is still kept
    assert {k: v for k, v in normal.env.items() if k not in four and k != "LD_LIBRARY_PATH"} == \
        {k: v for k, v in plan.env.items() if k != "NCCL_DEBUG"}
    assert plan.kept == {"FI_CXI_DEFAULT_CQ_SIZE": "9"} and plan.command == normal.command
    assert build_plan(8, DDP, env={**job, "NCCL_DEBUG": "WARN"}, hostname=POLARIS_HOSTS[0],
                      nccl_fallback=True).env.get("NCCL_DEBUG") is None  # the job's own NCCL_DEBUG is left alone
    assert describe(plan).splitlines()[2].startswith("unset " + " ".join(four) + "  # ALCF's fallback")


@pytest.mark.slow
def test_nccl_fallback_ranks_do_not_inherit_the_four_variables(tmp_path):
    """A real launch (torchrun here) with the four set in the caller's shell, as a module leaves them: the ranks
    see none of them, and NCCL_DEBUG=INFO."""
    script = tmp_path / "show_env.py"
    script.write_text("import os\n"
                      "names = ['NCCL_NET_GDR_LEVEL', 'NCCL_CROSS_NIC', 'NCCL_COLLNET_ENABLE', 'NCCL_NET',\n"
                      "         'NCCL_DEBUG']\n"
                      "print('rank', os.environ['RANK'], [os.environ.get(n) for n in names], flush=True)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "SLURM_", "PALS_", "PMI_", "OMPI_COMM"))}
    env.update(NCCL_NET_GDR_LEVEL="PHB", NCCL_CROSS_NIC="1", NCCL_COLLNET_ENABLE="1", NCCL_NET="AWS Libfabric")
    ran = {}
    for flags in ([], ["--nccl-fallback"]):
        result = subprocess.run([tool("scaledl"), "launch", "-n", "2", *flags, "--", str(script)], env=env,
                                capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        ran[bool(flags)] = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    assert ran[False] == [f"rank {r} ['PHB', '1', '1', 'AWS Libfabric', None]" for r in (0, 1)]
    assert ran[True] == [f"rank {r} [None, None, None, None, 'INFO']" for r in (0, 1)]


def test_dataloader_workers_avoid_fork_once_mpi_is_up():
    assert worker_context(0, mpi_initialized=True) is None
    assert worker_context(2, mpi_initialized=True) == "forkserver"
    assert worker_context(2, mpi_initialized=False) is None


@pytest.mark.slow
def test_dataloader_workers_under_initialized_mpi_load_the_same_batches():
    code = (
        "from mpi4py import MPI\n"
        "from scaledl import datasets, sharding\n"
        "data = datasets.synthetic(num_train=256, num_test=16)\n"
        "with_workers = sharding.torch_train_loader(data, 32, 0, 1, seed=3, num_workers=2)\n"
        "plain = sharding.torch_train_loader(data, 32, 0, 1, seed=3)\n"
        "same = all((a[0] == b[0]).all() and (a[1] == b[1]).all() for a, b in zip(with_workers, plain))\n"
        "print(MPI.Is_initialized(), with_workers.multiprocessing_context.get_start_method(), bool(same))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=launchers.local_env(1))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-3:] == ["True", "forkserver", "True"]


@pytest.mark.slow
def test_launch_runs_a_rung_on_two_local_ranks(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "SLURM_", "PALS_", "PMI_", "OMPI_COMM"))}
    out_dir = tmp_path / "ddp"
    command = [tool("scaledl"), "launch", "-n", "2", "--", "scaledl.ladder.ddp", "--epochs", "1",
               "--train-limit", "512", "--out-dir", str(out_dir)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "scaledl launch: " in result.stderr and "--nproc_per_node=2" in result.stderr  # the command it ran
    summary_line = next(line for line in result.stdout.splitlines() if line.startswith("summary "))
    assert "rung=ddp" in summary_line and "world_size=2" in summary_line and "params_in_sync=True" in summary_line
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["rung"] == "ddp"
    assert 0.0 < summary["test_accuracy"] <= 1.0
