"""Rank, world and rendezvous from every launcher: recorded environments, then real launches."""
import sys

import pytest

from conftest import PROBES, reports, run, tool
from scaledl import launchers
from scaledl.launch_env import LaunchError, detect, expand_slurm_nodelist, high_speed_name, job_port


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


def test_slurm_srun_two_nodes():
    # Recorded from `srun -N 2 --ntasks-per-node 2` (rank 3).
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2",
           "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "987654",
           "SLURM_JOB_NODELIST": "nid[001002-001003]", "SLURM_STEP_NODELIST": "nid[001002-001003]"}
    info = detect(env)
    assert (info.launcher, info.rank, info.local_rank, info.world_size, info.local_world_size) == ("slurm", 3, 1, 4, 2)
    assert info.master_addr == "nid001002"
    assert job_port(env) == 29500 + 987654 % 10000


def test_slurm_nodelist_forms():
    assert expand_slurm_nodelist("nid[001-003,007],login1") == ["nid001", "nid002", "nid003", "nid007", "login1"]
    assert expand_slurm_nodelist("gpu17") == ["gpu17"]


def test_mpich_hydra():
    info = detect({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert (info.launcher, info.rank, info.local_rank, info.world_size, info.master_addr) == ("mpich", 1, 1, 2, "127.0.0.1")


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
