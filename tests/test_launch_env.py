"""Rank, world and rendezvous from every launcher: recorded environments, then real launches."""
import sys

import pytest

from conftest import PROBES, reports, run, tool
from scaledl.hpc import launchers
from scaledl.launch_env import LaunchError, detect, expand_slurm_nodelist, high_speed_name, job_port, slurm_port


def nodefile(tmp_path, *hosts):
    path = tmp_path / "nodefile"
    path.write_text("".join(h + "\n" for h in hosts))
    return str(path)


def test_single_process_without_launcher():
    info = detect({})
    assert (info.launcher, info.rank, info.local_rank, info.world_size) == ("single", 0, 0, 1)
    assert info.master_addr == "127.0.0.1" and info.is_main


def test_polaris_pals_two_nodes(tmp_path):
    # Recorded from `mpiexec -n 8 --ppn 4` in a 2-node PBS job on Polaris (rank 5).
    env = {"PALS_RANKID": "5", "PALS_LOCAL_RANKID": "1", "PALS_LOCAL_SIZE": "4", "PALS_NODEID": "1",
           "PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "4",
           "PBS_JOBID": "1234567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",
           "PBS_NODEFILE": nodefile(tmp_path, "x3005c0s13b0n0.hsn.cm.polaris.alcf.anl.gov",
                                    "x3005c0s13b1n0.hsn.cm.polaris.alcf.anl.gov")}
    info = detect(env)
    assert (info.launcher, info.rank, info.local_rank, info.world_size, info.local_world_size) == ("pals", 5, 1, 8, 4)
    assert info.master_addr == "x3005c0s13b0n0.hsn.cm.polaris.alcf.anl.gov"
    assert info.master_port is None  # rank 0 picks one and broadcasts it over MPI
    assert job_port(env) == 29500 + 1234567 % 10000


def test_aurora_host_gets_high_speed_suffix(tmp_path):
    env = {"PALS_RANKID": "0", "PALS_LOCAL_RANKID": "0", "PALS_LOCAL_SIZE": "12", "PMI_RANK": "0",
           "PMI_SIZE": "24", "PMI_LOCAL_RANK": "0", "PMI_LOCAL_SIZE": "12",
           "PBS_NODEFILE": nodefile(tmp_path, "x4102c5s2b0n0.hostmgmt2102.cm.aurora.alcf.anl.gov",
                                    "x4102c5s3b0n0.hostmgmt2102.cm.aurora.alcf.anl.gov")}
    info = detect(env)
    assert (info.world_size, info.local_world_size) == (24, 12)
    assert info.master_addr == "x4102c5s2b0n0.hsn.cm.aurora.alcf.anl.gov"


def test_high_speed_name_leaves_other_hosts_alone():
    assert high_speed_name("node17.cluster.example.org") == "node17.cluster.example.org"
    assert high_speed_name("x3005c0s13b0n0.hsn.cm.polaris.alcf.anl.gov") == "x3005c0s13b0n0.hsn.cm.polaris.alcf.anl.gov"


# The environments of a job of `sbatch --nodes=2 --ntasks-per-node=2`, as sbatch(1) and srun(1) list
# them in OUTPUT ENVIRONMENT VARIABLES (tests/hpc/test_slurm.py runs the one-node case for real).  The batch step (the
# shell running the script) carries the job's SLURM_NTASKS and a SLURM_PROCID/SLURM_LOCALID of 0,
# as if it were rank 0; srun's tasks also carry the step's variables (SLURM_STEP_ID,
# SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, ...).
SBATCH_BATCH_STEP = {
    "SLURM_JOB_ID": "987654", "SLURM_JOBID": "987654", "SLURM_JOB_NAME": "train", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "nid[001002-001003]", "SLURM_NODELIST": "nid[001002-001003]",
    "SLURM_NTASKS": "4", "SLURM_NPROCS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_TASK_PID": "41230",
    "SLURM_CPUS_ON_NODE": "64", "SLURM_SUBMIT_DIR": "/home/u/run", "SLURM_SUBMIT_HOST": "login1",
    "SLURMD_NODENAME": "nid001002", "SLURM_CLUSTER_NAME": "example",
}
SRUN_RANK_3 = {
    **SBATCH_BATCH_STEP,
    "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NODELIST": "nid[001002-001003]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_LAUNCHER_PORT": "40123", "SLURM_SRUN_COMM_HOST": "10.100.0.2", "SLURM_SRUN_COMM_PORT": "40124",
    "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURMD_NODENAME": "nid001003",
    "SLURM_LAUNCH_NODE_IPADDR": "10.100.0.2", "SLURM_DISTRIBUTION": "block", "SLURM_TASK_PID": "51877",
}


def test_slurm_srun_two_nodes():
    info = detect(SRUN_RANK_3)
    assert (info.launcher, info.rank, info.local_rank, info.world_size, info.local_world_size) == ("slurm", 3, 1, 4, 2)
    # Rank 0's host and the port come from srun's own variables: no MPI is asked.
    assert (info.master_addr, info.master_port) == ("nid001002", 20000 + 654 * 10 + 0)


def test_slurm_port_is_the_same_on_every_rank_and_differs_between_steps_and_jobs():
    rank_0 = {**SRUN_RANK_3, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "nid001002"}
    assert detect(rank_0).master_port == detect(SRUN_RANK_3).master_port
    next_step = {**SRUN_RANK_3, "SLURM_STEP_ID": "1", "SLURM_STEPID": "1"}
    other_job = {**SRUN_RANK_3, "SLURM_JOB_ID": "987655"}
    ports = {slurm_port(env) for env in (SRUN_RANK_3, next_step, other_job)}
    assert len(ports) == 3 and all(20000 <= port < 32768 for port in ports)  # below the ephemeral range
    assert slurm_port({}) is None
    # MASTER_PORT given wins; a single task picks a free port itself (two may share a job).
    assert detect({**SRUN_RANK_3, "MASTER_PORT": "4321"}).master_port == 4321
    single = {**SRUN_RANK_3, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": "1",
              "SLURM_NTASKS_PER_NODE": "1"}
    assert detect(single).master_port is None


def test_job_port_without_a_batch_job():
    assert job_port({"PBS_JOBID": "1234.pbs"}) == 29500 + 1234
    assert job_port({"OMPI_MCA_ess_base_jobid": "1484980225"}) == 29500 + 1484980225 % 10000
    # Ranks that all run on one node share their launcher's per-node process.
    assert job_port({}, parent_pid=4242) == 20000 + 4242
    assert job_port({}) == 29500


def test_slurm_batch_step_is_not_a_rank():
    # `python -m scaledl.ladder.single_torch` in the sbatch script itself: one process, all the data.
    info = detect(SBATCH_BATCH_STEP)
    assert (info.launcher, info.rank, info.world_size) == ("single", 0, 1)
    # Where a site exports the batch step's own id, it is the batch-script step, still not srun's.
    info = detect({**SBATCH_BATCH_STEP, "SLURM_STEP_ID": "4294967294", "SLURM_STEP_NUM_TASKS": "1"})
    assert (info.launcher, info.world_size) == ("single", 1)


def test_torchrun_in_the_batch_step_wins_over_the_allocation():
    # `torchrun --nproc_per_node=2` run from the sbatch script: torchrun's rank 1 of 2.
    env = {**SBATCH_BATCH_STEP, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511", "TORCHELASTIC_RUN_ID": "none"}
    info = detect(env)
    assert (info.launcher, info.rank, info.world_size, info.master_port) == ("torchrun", 1, 2, 29511)


def test_torchrun_inside_srun_wins_over_the_slurm_task():
    # `srun -N 2 --ntasks-per-node=1 torchrun --nnodes=2 --nproc_per_node=4 ...`: Slurm's task 1 of 2
    # runs torchrun, whose rank 6 of 8 this is.
    env = {**SRUN_RANK_3, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
           "SLURM_NTASKS_PER_NODE": "1", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
           "RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "nid001002", "MASTER_PORT": "29400"}
    info = detect(env)
    assert (info.launcher, info.rank, info.local_rank, info.world_size) == ("torchrun", 6, 2, 8)


def test_mpi_launchers_that_disagree_are_still_refused():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
           "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    with pytest.raises(LaunchError, match="contradictory launcher environment"):
        detect(env)


# Slurm host lists and what `scontrol show hostnames` (Slurm 22.05) prints for them; tests/hpc/test_slurm.py
# checks every one against scontrol itself.
NODELISTS = {
    "nid[001-003,007],gpu01": ["nid001", "nid002", "nid003", "nid007", "gpu01"],
    "gpu17": ["gpu17"],
    "r[1-2]n[01-02]": ["r1n01", "r1n02", "r2n01", "r2n02"],
    "nid[8-10]": ["nid8", "nid9", "nid10"],
    "nid[08-10]": ["nid08", "nid09", "nid10"],
    "a[1-2],b[3] c": ["a1", "a2", "b3", "c"],
    "x[1-010]": [f"x{n}" for n in range(1, 11)],
}
BAD_NODELISTS = ["node[1-2]-ib", "a[1-2", "a[1-2]]", "a[x]", "a[3-1]", ""]


def test_slurm_nodelist_forms():
    for nodelist, hosts in NODELISTS.items():
        assert expand_slurm_nodelist(nodelist) == hosts, nodelist


@pytest.mark.parametrize("nodelist", BAD_NODELISTS)
def test_a_bad_slurm_nodelist_is_one_line(nodelist):
    with pytest.raises(LaunchError, match="Slurm node list"):
        expand_slurm_nodelist(nodelist)


def test_mpich_hydra():
    info = detect({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    found = (info.launcher, info.rank, info.local_rank, info.world_size, info.master_addr)
    assert found == ("mpich", 1, 1, 2, "127.0.0.1")


def test_explicit_rendezvous_wins(tmp_path):
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "8",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "4242",
           "PBS_NODEFILE": nodefile(tmp_path, "other-host")}
    info = detect(env)
    assert (info.master_addr, info.master_port) == ("10.1.2.3", 4242)


@pytest.mark.parametrize("env, message", [
    ({"RANK": "0"}, "half-set torchrun environment"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_LOCAL_RANK missing"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "inconsistent torchrun environment"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "OMPI_COMM_WORLD_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "contradictory launcher environment"),
])
def test_partial_or_contradictory_environment_is_an_error(env, message):
    with pytest.raises(LaunchError, match=message):
        detect(env)


def test_multi_node_without_rendezvous_or_mpi_is_an_error():
    import scaledl

    env = {"HOROVOD_RANK": "1", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_SIZE": "1"}
    with pytest.raises(LaunchError, match="MASTER_ADDR"):
        scaledl.setup(env=env, init_process_group=False)


def test_an_mpi4py_for_another_mpi_is_one_line_not_an_mpi_init():
    # Hydra's variables for rank 1 of 2 on two nodes, and this machine's mpi4py, which loads Open MPI:
    # its MPI_Init would start a singleton (rank 0 of 1) whose broadcast never reaches rank 0.
    import scaledl
    from scaledl import distributed

    if not distributed._mpi4py_available() or "Open MPI" not in distributed._mpi_library():
        pytest.skip("mpi4py here does not load Open MPI")
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
    with pytest.raises(LaunchError, match=r"mpi4py loads Open MPI v.*MPICH's launcher.*MASTER_ADDR") as error:
        scaledl.setup(env=env, init_process_group=False)
    assert "\n" not in str(error.value)
    from mpi4py import MPI

    assert not MPI.Is_initialized()  # looked at, never started


def check_two_local_ranks(found, launcher, master_addr=None):
    assert [r["rank"] for r in found] == [0, 1]
    for report in found:
        assert report["world_size"] == 2 and report["local_world_size"] == 2
        assert report["local_rank"] == report["rank"]
        assert report["launcher"] == launcher
        assert (report["device"], report["backend"]) == ("cpu", "gloo")
        assert report["allreduce_sum"] == 3.0  # 1 + 2: the ranks really talked
    assert found[0]["master_addr"] == found[1]["master_addr"]
    assert found[0]["master_port"] == found[1]["master_port"]
    if master_addr:
        assert found[0]["master_addr"] == master_addr


@pytest.mark.slow
def test_torchrun():
    result = run([tool("torchrun"), "--standalone", "--nproc_per_node=2", str(PROBES / "env_probe.py")])
    check_two_local_ranks(reports(result.stdout), "torchrun")


def test_launchers_without_their_scripts_run_with_this_python(tmp_path, monkeypatch):
    # A venv over a site's module has no torchrun or deepspeed script of its own: the launcher then
    # runs as this Python's module, so that its ranks see this Python's packages; then for real.
    assert launchers.launcher_command("torchrun") == [tool("torchrun")]  # this venv has the script
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert launchers.launcher_command("torchrun") == [str(tmp_path / "python"), "-m", "torch.distributed.run"]
    assert launchers.launcher_command("deepspeed")[1:] == ["-m", "deepspeed.launcher.runner"]
    monkeypatch.undo()
    result = run([sys.executable, "-m", launchers.LAUNCHER_MODULES["torchrun"], "--standalone", "--nproc_per_node=2",
                  str(PROBES / "env_probe.py")])
    check_two_local_ranks(reports(result.stdout), "torchrun")


@pytest.mark.slow
def test_open_mpi_mpirun():
    result = run(["mpirun", "-np", "2", sys.executable, str(PROBES / "env_probe.py")])
    check_two_local_ranks(reports(result.stdout), "openmpi", "127.0.0.1")


@pytest.mark.slow
def test_horovodrun_gloo():
    result = run(launchers.horovodrun(2, "env_probe", controller="gloo"))
    check_two_local_ranks(reports(result.stdout), "horovodrun", "127.0.0.1")


@pytest.mark.slow
def test_deepspeed_launcher():
    result = run(launchers.deepspeed(2, "env_probe"), timeout=400)
    check_two_local_ranks(reports(result.stdout), "torchrun")


def test_a_host_whose_name_does_not_resolve_is_one_line_before_horovods_gloo_crashes(monkeypatch):
    # Horovod 0.28.1's Gloo checks getaddrinfo for -1 only: a name that does not resolve is a
    # segmentation fault in every rank's hvd.init() (seen in a Debian root without its hostname
    # in /etc/hosts).  The horovod rungs ask first.
    import horovod  # noqa: F401  the check is for processes that use Horovod
    from scaledl.distributed import gloo_host_problem

    gloo = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "1234"}
    line = gloo_host_problem(gloo, hostname="no-such-host.invalid")
    assert line and "'no-such-host.invalid' does not resolve" in line and "/etc/hosts" in line
    assert "Horovod's Gloo" in line and "--mpi" in line and "\n" not in line
    assert gloo_host_problem(gloo, hostname="localhost") is None
    # Naming Gloo's interface does not help: Horovod does not pass it to its process sets' devices.
    assert gloo_host_problem({**gloo, "HOROVOD_GLOO_IFACE": "lo"}, hostname="no-such-host.invalid")
    assert gloo_host_problem({}, hostname="no-such-host.invalid") is None  # not under horovodrun's Gloo


def test_launches_on_a_host_whose_name_does_not_resolve_stop_at_one_line(monkeypatch, tmp_path):
    # torchrun's agent retries such a name for minutes without a word (seen in a Debian root
    # whose /etc/hosts lacked it); scaledl launch and the demo say so before starting anything.
    import socket

    from scaledl.cli import demo
    from scaledl.hpc.launch import Target, build_plan
    from scaledl.launch_env import host_name_problem

    assert host_name_problem("localhost") is None
    monkeypatch.setattr(socket, "gethostname", lambda: "no-such-host.invalid")
    line = host_name_problem()
    assert line.startswith("this host's name 'no-such-host.invalid' does not resolve") and "/etc/hosts" in line
    with pytest.raises(LaunchError, match="does not resolve .*; torchrun's rendezvous needs it"):
        build_plan(2, Target("scaledl.ladder.ddp"), env={}, hostname="laptop")
    assert build_plan(2, Target("scaledl.ladder.ddp"), env={}, hostname="laptop", dry_run=True).command
    with pytest.raises(demo.UserError, match="does not resolve"):
        demo.check(tmp_path / "demo", ["ddp"], overwrite=False, nproc=None)
    demo.check(tmp_path / "demo", ["single_torch"], overwrite=False, nproc=None)  # one process: no launcher
    assert not (tmp_path / "demo").exists()


def test_deepspeed_is_pointed_at_the_device_the_rank_sees():
    """DeepSpeed reads LOCAL_RANK as the GPU's index: where a rank sees only its own GPU (Polaris'
    wrapper: local rank 3 on cuda:0) LOCAL_RANK follows the device, and Open MPI's copy with it; a rank
    that sees every GPU (cuda:<local_rank>) and a CPU rank keep theirs."""
    import torch

    from scaledl import distributed

    wrapped = {"LOCAL_RANK": "3", "PALS_LOCAL_RANKID": "3"}
    distributed.deepspeed_sees(torch.device("cuda", 0), wrapped)
    assert wrapped == {"LOCAL_RANK": "0", "PALS_LOCAL_RANKID": "3"}
    under_openmpi = {"LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "2"}
    distributed.deepspeed_sees(torch.device("xpu", 0), under_openmpi)
    assert under_openmpi == {"LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    every_gpu = {"LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "2"}
    distributed.deepspeed_sees(torch.device("cuda", 2), every_gpu)
    assert every_gpu == {"LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "2"}
    on_cpu = {"LOCAL_RANK": "1"}
    distributed.deepspeed_sees(torch.device("cpu"), on_cpu)
    assert on_cpu == {"LOCAL_RANK": "1"}
