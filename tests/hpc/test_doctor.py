"""`scaledl doctor`: runs here without a GPU, and names each problem with its fix."""
import os
import subprocess
import sys
from importlib import metadata

import pytest

from conftest import DATA, tool
from scaledl.hpc import doctor, systems


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PBS_", "SLURM_", "PALS_", "SCALEDL_DATA", "NCCL_", "FI_", "CCL_"))}
    return {**env, **extra}


def run_doctor(env, *args):
    return subprocess.run([tool("scaledl"), "doctor", *args], env=env, capture_output=True, text=True, timeout=300)


def test_doctor_here_reports_a_missing_gpu_as_information():
    import torch

    result = run_doctor(clean_env())
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert f"torch {metadata.version('torch')}" in result.stdout
    assert "system: local" in result.stdout
    if torch.cuda.device_count() == 0:
        assert any(line.split()[0] == "info" and "no GPU" in line for line in lines[1:-1])
    assert "horovod built with:" in result.stdout and "mpiexec:" in result.stdout
    assert lines[-1] == "no problems"


def test_doctor_names_a_problem_and_its_fix(tmp_path):
    missing = tmp_path / "no-such-data"
    result = run_doctor(clean_env(SCALEDL_DATA=str(missing)))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[0] == "PROBLEM")
    assert f"SCALEDL_DATA={missing} is not a directory" in lines[at]
    assert lines[at + 1].strip().startswith("fix: ")
    assert lines[-1] == "1 problem"


@pytest.mark.parametrize("text, family", [
    ("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4", "openmpi"),
    ("mpiexec (OpenRTE) 4.1.4", "openmpi"),
    ("MPICH Version:      4.1.2", "mpich"),
    ("HYDRA build details:", "mpich"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10", "mpich"),
    ("something else", None),
])
def test_mpi_family(text, family):
    assert doctor.mpi_family(text) == family


def test_mpi4py_built_for_another_mpi_than_mpiexec_is_a_problem(tmp_path):
    # An MPICH-family mpiexec first on PATH, in front of the Open MPI that mpi4py is built with.
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'HYDRA build details:'\n")
    fake.chmod(0o755)
    findings = doctor.check_mpi({"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    problems = [f for f in findings if f.level == "problem"]
    if "open mpi" not in " ".join(f.text.lower() for f in findings):
        pytest.skip("mpi4py here is not built with Open MPI")
    assert len(problems) == 1 and "rank 0 of 1" in problems[0].text and "mpi4py" in problems[0].fix


def test_polaris_without_the_nccl_plugin_is_a_problem(tmp_path):
    findings = doctor.check_comm_env("polaris", {"LD_LIBRARY_PATH": str(tmp_path), "NCCL_CROSS_NIC": "0"})
    [plugin] = [f for f in findings if f.level == "problem"]
    assert "libnccl-net.so" in plugin.text and "LD_LIBRARY_PATH" in plugin.fix and "unset NCCL_NET" in plugin.fix
    cross_nic = next(f for f in findings if f.text.startswith("NCCL_CROSS_NIC"))
    assert cross_nic.level == "info" and "recommended '1'" in cross_nic.text
    (tmp_path / "libnccl-net.so").write_bytes(b"")
    findings = doctor.check_comm_env("polaris", {"LD_LIBRARY_PATH": str(tmp_path)})
    assert not [f for f in findings if f.level == "problem"]
    plugin = ok_text(findings, "NCCL's network plugin")
    assert plugin == f"NCCL's network plugin (aws-ofi-nccl): {tmp_path}/libnccl-net.so"


def test_polaris_with_the_plugin_only_in_alcfs_folder_is_what_scaledl_launch_adds(tmp_path, monkeypatch):
    # As on a Polaris node whose LD_LIBRARY_PATH lacks the plugin: ALCF's folder has it, and
    # scaledl launch puts that folder first.
    alcf = tmp_path / "aws-ofi-nccl" / "lib"
    alcf.mkdir(parents=True)
    (alcf / "libnccl-net.so").write_bytes(b"")
    monkeypatch.setattr(systems, "POLARIS_NCCL_PLUGIN_FOLDERS", (str(alcf), str(tmp_path / "hwloc")))
    findings = doctor.check_comm_env("polaris", {"LD_LIBRARY_PATH": "/usr/lib"})
    assert not [f for f in findings if f.level == "problem"]
    [note] = [f.text for f in findings if "network plugin" in f.text]
    assert f"export LD_LIBRARY_PATH={alcf}:$LD_LIBRARY_PATH" in note and "scaledl launch" in note
    # Someone else's NCCL_NET (sockets) needs no plugin at all.
    assert not [f for f in doctor.check_comm_env("polaris", {"NCCL_NET": "Socket"}) if "network plugin" in f.text]


def ok_text(findings, start):
    [text] = [f.text for f in findings if f.level == "ok" and f.text.startswith(start)]
    return text


@pytest.mark.slow
def test_a_venv_over_a_site_says_where_each_framework_comes_from_and_what_it_shadows(tmp_path):
    # The environment these tests run in stands in for the site module; a venv goes on top of it.
    site = sys.prefix
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], check=True)
    findings = doctor.check_site(str(venv), site)
    assert findings[0].text == f"python environment: venv {venv} over the site environment {site} " \
                               "(--system-site-packages)"
    assert ok_text(findings, "torch ") == f"torch {metadata.version('torch')} from the site environment"
    assert ok_text(findings, "numpy ") == f"numpy {metadata.version('numpy')} from the site environment"
    assert not [f for f in findings if f.level == "problem"]

    # A user's `pip install` put a second numpy into the venv, in front of the site's.
    other = "2.2.6" if metadata.version("numpy") != "2.2.6" else "2.4.6"
    own_site_packages = doctor.venv_layers(str(venv), site)[0][0]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--target", own_site_packages, f"numpy=={other}"], check=True)
    findings = doctor.check_site(str(venv), site)
    [shadow] = [f for f in findings if f.level == "problem"]
    assert shadow.text.startswith(f"numpy {other} in this venv shadows the site's numpy {metadata.version('numpy')}")
    assert shadow.fix.startswith(f"{venv}/bin/python -m pip uninstall numpy")


def test_a_plain_environment_is_reported_as_such():
    findings = doctor.check_site()
    assert len(findings) == 1 and findings[0].level == "ok"
    assert findings[0].text.startswith("python environment: ")


SYSFS = DATA / "sysfs"


def test_binding_on_a_recorded_polaris_node_is_local_for_every_rank():
    findings = doctor.check_binding("polaris", {}, str(SYSFS / "polaris"))
    assert [f.level for f in findings] == ["ok"] * 8
    gpu0 = next(f.text for f in findings if f.text.startswith("GPU 0000:07:00.0"))
    assert gpu0 == "GPU 0000:07:00.0 on NUMA node 3 (CPUs 24-31,56-63)"  # the reverse order, as ALCF says
    ranks = [f.text for f in findings if f.text.startswith("binding of scaledl launch")]
    assert len(ranks) == 4 and all(text.endswith(": local") for text in ranks)


def test_binding_on_aurora_flags_ranks_whose_tile_is_on_the_other_socket():
    # The user's own ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE is kept: 6 devices, so ranks 3-8 cross sockets.
    findings = doctor.check_binding("aurora", {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, str(SYSFS / "aurora"))
    problems = [f for f in findings if f.level == "problem"]
    assert [f.text.split(":")[1].strip() for f in problems] == [f"local rank {r}" for r in range(3, 9)]
    assert all(f.text.endswith(": far") and "unset it" in f.fix for f in problems)
    assert not [f for f in doctor.check_binding("aurora", {}, str(SYSFS / "aurora")) if f.level != "ok"]


def test_doctor_reads_another_nodes_sysfs_and_refuses_a_missing_one(tmp_path):
    result = run_doctor(clean_env(), "--system", "polaris", "--sysfs", str(SYSFS / "polaris"))
    assert "binding of scaledl launch: local rank 3: CPUs 24-31 (NUMA 3), GPU 0000:07:00.0" in result.stdout
    missing = run_doctor(clean_env(), "--sysfs", str(tmp_path))
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr == f"scaledl doctor: error: --sysfs {tmp_path}: no sys folder there\n"


def test_doctor_here_says_there_is_no_gpu_binding_to_check():
    from scaledl.hpc import binding

    if binding.gpus():
        pytest.skip("this node has GPUs: the gpu tier checks its binding")
    assert doctor.check_binding("local", {}) == [doctor.info("no GPU on this node's PCI bus: no CPU-GPU binding "
                                                              "to check")]
