"""The lessons' live ranks start with each system's own launcher, one per GPU of the node."""
import sys

import pytest

from scaledl import launch_env
from scaledl.hpc import launchers
from scaledl.workshop import engines


def test_without_a_gpu_two_cpu_ranks():
    assert engines.accelerator_count() == 0  # this machine; the gpu tier checks the other case
    assert engines.default_world_size() == 2


@pytest.mark.parametrize("accelerators, expected", [(0, 2), (1, 2), (2, 2), (4, 4), (12, 12)])
def test_one_rank_per_gpu_where_there_are_two_or_more(accelerators, expected):
    assert engines.default_world_size(accelerators) == expected


def test_ranks_that_outnumber_the_gpus_run_on_the_cpu():
    """NCCL refuses two ranks on one GPU: on a 1-GPU laptop the lessons' 2 ranks hide the GPU and use gloo."""
    plan = engines.plan(None, env={"PATH": "/usr/bin"}, hostname="laptop", accelerators=("cuda", 1))
    assert plan.world_size == 2 and plan.env["CUDA_VISIBLE_DEVICES"] == ""
    assert "1 GPU cannot give each of 2 ranks its own" in plan.note
    plan = engines.plan(3, env={"PATH": "/usr/bin"}, hostname="laptop", accelerators=("cuda", 2))
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "" and "2 GPUs" in plan.note
    for world_size in (None, 1, 4):
        plan = engines.plan(world_size, env={"PATH": "/usr/bin"}, hostname="laptop", accelerators=("cuda", 4))
        assert "CUDA_VISIBLE_DEVICES" not in plan.env and plan.note == ""
    with pytest.raises(launch_env.LaunchError, match="more ranks than this node's 2 xpu devices"):
        engines.plan(3, env={"PATH": "/usr/bin"}, hostname="laptop", accelerators=("xpu", 2))


def test_local_uses_open_mpis_mpiexec():
    plan = engines.plan(None, env={"PATH": "/usr/bin"}, hostname="laptop")
    assert plan.system == "local" and plan.world_size == 2
    assert plan.mpi_cmd == [launchers.tool("mpiexec")] and plan.mpi_args == []
    # Lesson 0 prints this line: no mpi_args leaves single spaces, not `-n 2  python`.
    mpiexec = launchers.tool("mpiexec")
    assert plan.line("python", "-m", "ipyparallel.engine") == f"{mpiexec} -n 2 python -m ipyparallel.engine"
    assert plan.line() == f"{mpiexec} -n 2"


def test_polaris_binds_cpus_next_to_each_gpu(tmp_path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x3005c0s13b0n0\nx3005c0s13b1n0\n")
    env = {"PBS_NODEFILE": str(nodefile), "PBS_JOBID": "1.polaris-pbs-01"}
    plan = engines.plan(4, env=env, hostname="x3005c0s13b0n0")
    assert plan.system == "polaris" and plan.mpi_cmd == ["mpiexec"]
    args = " ".join(plan.mpi_args)
    assert "--ppn 4 --depth 8 --cpu-bind depth" in args and f"--hostfile {nodefile}" in args
    assert "CUDA_VISIBLE_DEVICES=$((3 - r % 4))" in args  # local rank r on NUMA node r takes GPU 3 - r
    assert "-n" not in plan.mpi_args  # ipyparallel adds `-n 4` itself
    assert plan.line("python").startswith("mpiexec -n 4 --ppn 4 --depth 8") and "  " not in plan.line("python")
    assert plan.env["NCCL_NET"] == "AWS Libfabric"


def test_aurora_one_rank_per_tile_with_oneccl_variables(tmp_path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x4102c5s2b0n0\n")
    plan = engines.plan(12, env={"PBS_NODEFILE": str(nodefile), "PBS_JOBID": "1.aurora-pbs-01"})
    assert plan.system == "aurora"
    assert "--ppn 12" in " ".join(plan.mpi_args) and "--cpu-bind" in plan.mpi_args
    assert "list:1-8:9-16" in " ".join(plan.mpi_args)  # ALCF's lists: 6 ranks on each socket
    assert plan.env["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT"  # 12 tile devices: local rank r takes xpu:<r>
    assert plan.env["CCL_ATL_TRANSPORT"] == "mpi" and plan.env["FI_PROVIDER"] == "cxi"
    assert sys.executable not in plan.mpi_args


def test_slurm_gives_each_rank_one_gpu():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_ON_NODE": "4"}
    plan = engines.plan(4, env=env)
    assert plan.system == "slurm" and plan.mpi_cmd == ["srun"]
    assert "--gpus-per-task 1" in " ".join(plan.mpi_args) and "--cpu-bind=cores" in plan.mpi_args


@pytest.mark.parametrize("world_size", [0, -1, 2.5, "4"])
def test_a_bad_world_size_is_a_one_line_error(world_size):
    with pytest.raises(launch_env.LaunchError, match="WORLD_SIZE must be a whole number"):
        engines.plan(world_size, env={})


def test_more_ranks_than_a_polaris_node_has_gpus(tmp_path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x3005c0s13b0n0\n")
    with pytest.raises(launch_env.LaunchError, match="more than the 4 GPUs"):
        engines.plan(8, env={"PBS_NODEFILE": str(nodefile), "PBS_JOBID": "1.polaris-pbs-01"})


@pytest.mark.parametrize("accelerators, nproc, largest, base, hidden, ds", [
    (("cuda", 1), 2, None, {}, True, "cpu"),          # 2 ranks, 1 GPU: both on the CPU
    (("cuda", 1), 1, None, {}, False, "cuda"),        # 1 rank keeps the GPU ...
    (("cuda", 1), 1, 2, {}, True, "cpu"),             # ... unless a 2-rank run it is compared with cannot
    (("cuda", 4), 4, 4, {}, False, "cuda"),
    (("cuda", 4), 1, None, {"CUDA_VISIBLE_DEVICES": ""}, True, "cpu"),   # a notebook whose engines hid the GPUs
    (("cuda", 4), 2, None, {"CUDA_VISIBLE_DEVICES": "0", "DS_ACCELERATOR": "cuda"}, True, "cpu"),
    (("xpu", 12), 12, None, {}, False, "xpu"),
    ((None, 0), 2, None, {}, False, "cpu"),
])
def test_local_ranks_that_outnumber_the_gpus_run_on_the_cpu(accelerators, nproc, largest, base, hidden, ds):
    """What a lesson's own torchrun/deepspeed runs get: NCCL refuses two ranks on one GPU, and
    DeepSpeed's launcher refuses DS_ACCELERATOR=cuda with no GPU visible."""
    env = launchers.local_env(nproc, base, largest=largest, accelerators=accelerators)
    assert (env.get("CUDA_VISIBLE_DEVICES") == "") == hidden
    assert env["DS_ACCELERATOR"] == ds
