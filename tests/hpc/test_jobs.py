"""Job scripts: committed == generated, valid shell, right directives, and they really launch."""
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, tool
from scaledl.hpc import jobs
from scaledl.ladder import RUNGS

ALL_SCRIPTS = sorted(f"{system}/{name}.sh" for system in jobs.SCHEDULERS for name in [*RUNGS, "sweep"])


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("jobs")
    jobs.generate(out)
    return out


def test_committed_jobs_are_generated_from_the_template():
    result = subprocess.run([tool("scaledl"), "jobs", "--check", "--out", str(ROOT / "jobs")],
                            capture_output=True, text=True)
    assert result.returncode == 0, "jobs/ is out of date: run `scaledl jobs`\n" + result.stdout + result.stderr
    assert sorted(str(p.relative_to(ROOT / "jobs")) for p in (ROOT / "jobs").glob("*/*.sh")) == ALL_SCRIPTS


def test_every_script_passes_bash_n_and_shellcheck(generated):
    scripts = [str(generated / name) for name in ALL_SCRIPTS]
    for script in scripts:
        subprocess.run(["bash", "-n", script], check=True)
    result = subprocess.run([tool("shellcheck"), "--shell=bash", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def directives(path: Path, prefix: str) -> list[str]:
    return [line[len(prefix):].strip() for line in path.read_text().splitlines() if line.startswith(prefix)]


def test_pbs_and_slurm_directives(generated):
    polaris = directives(generated / "polaris/ddp.sh", "#PBS")
    assert {"-l select=2:system=polaris", "-l filesystems=home:eagle", "-q debug", "-A YOUR_PROJECT"} <= set(polaris)
    aurora = directives(generated / "aurora/sweep.sh", "#PBS")
    assert {"-l select=8", "-l filesystems=home:flare", "-q debug-scaling"} <= set(aurora)
    slurm = directives(generated / "slurm/fsdp.sh", "#SBATCH")
    assert {"--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4"} <= set(slurm)
    assert "--ntasks-per-node=1" in directives(generated / "slurm/single_torch.sh", "#SBATCH")


@pytest.mark.parametrize("system, nodes, queue", [
    ("polaris", 1, "debug"), ("polaris", 2, "debug"), ("polaris", 8, "debug-scaling"), ("polaris", 16, "prod"),
    ("aurora", 16, "debug-scaling"), ("aurora", 64, "debug-scaling"), ("aurora", 256, "debug-scaling"),
    ("aurora", 512, "prod"),  # ALCF's queue table since 2026-02: debug-scaling 2-256 nodes
])
def test_queue_follows_the_node_count(system, nodes, queue):
    assert jobs.queue(system, nodes) == queue


def test_flags_reach_the_scripts(tmp_path):
    result = subprocess.run([tool("scaledl"), "jobs", "--out", str(tmp_path), "--system", "aurora",
                             "--project", "MyAlloc"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert sorted(p.parent.name for p in tmp_path.glob("*/*.sh")) == ["aurora"] * (len(RUNGS) + 1)
    assert "-A MyAlloc" in directives(tmp_path / "aurora/zero3.sh", "#PBS")
    assert "--zero-stage 3" in (tmp_path / "aurora/zero3.sh").read_text()


def test_cpu_partition_scripts_ask_for_no_gpus(tmp_path):
    result = subprocess.run([tool("scaledl"), "jobs", "--out", str(tmp_path), "--system", "slurm",
                             "--slurm-gpus-per-node", "0", "--max-nodes", "1", "--slurm-partition", "cpu"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for name in [*RUNGS, "sweep"]:
        script = tmp_path / "slurm" / f"{name}.sh"
        found = directives(script, "#SBATCH")
        assert not [d for d in found if d.startswith("--gpus")], (name, found)
        # Whole nodes, so that `scaledl launch` shares the node's CPUs out among the ranks (srun -c).
        assert {"--nodes=1", "--partition=cpu", "--exclusive"} <= set(found), (name, found)
        assert "# A CPU partition (scaledl jobs --slurm-gpus-per-node 0)" in script.read_text()
    # Two ranks a node without GPUs (the lessons' CPU ranks), unless asked for more.
    assert "--ntasks-per-node=2" in directives(tmp_path / "slurm/ddp.sh", "#SBATCH")
    subprocess.run([tool("scaledl"), "jobs", "--out", str(tmp_path / "more"), "--system", "slurm",
                    "--slurm-gpus-per-node", "0", "--slurm-ranks-per-node", "8"], check=True, capture_output=True)
    assert {"--nodes=2", "--ntasks-per-node=8"} <= set(directives(tmp_path / "more/slurm/ddp.sh", "#SBATCH"))


@pytest.mark.parametrize("flags, message", [
    (["--slurm-gpus-per-node", "-1"], "--slurm-gpus-per-node must be between 0 (a CPU partition) and 16, got -1"),
    (["--slurm-gpus-per-node", "17"], "--slurm-gpus-per-node must be between 0"),
    (["--slurm-ranks-per-node", "0"], "--slurm-ranks-per-node must be between 1 and 256, got 0"),
    (["--max-nodes", "0"], "--max-nodes must be at least 1, got 0"),
    (["--slurm-partition", "cpu\n#SBATCH --x"], "is not a partition name"),
])
def test_bad_cluster_flags_are_one_line_and_write_nothing(tmp_path, flags, message):
    result = subprocess.run([tool("scaledl"), "jobs", "--out", str(tmp_path / "out"), *flags],
                            capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def run_script(script: Path, env: dict, tmp_path: Path) -> list[list[str]]:
    """Run a job script with `scaledl launch --dry-run`; return the launch command of each launch."""
    full_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SCALEDL_VENV": str(ROOT / ".venv"),
                "SCALEDL_LAUNCH_FLAGS": "--dry-run", **env}
    result = subprocess.run(["bash", str(script)], env=full_env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines() if line.startswith(("mpiexec ", "srun "))]


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.mark.slow
def test_polaris_sweep_launches_1_2_4_8_nodes(generated, tmp_path):
    hosts = tmp_path / "nodefile"
    hosts.write_text("".join(f"x3005c0s{i}b0n0.hsn.cm.polaris.alcf.anl.gov\n" for i in range(8)))
    launches = run_script(generated / "polaris/sweep.sh",
                          {"PBS_NODEFILE": str(hosts), "PBS_O_WORKDIR": str(tmp_path), "PBS_JOBID": "1.polaris-pbs-01"},
                          tmp_path)
    assert [option(c, "-n") for c in launches] == ["4", "8", "16", "32"]
    assert {option(c, "--ppn") for c in launches} == {"4"}
    assert [option(c, "--out-dir") for c in launches] == [f"runs/sweep/{n}nodes" for n in (1, 2, 4, 8)]
    assert all(option(c, "--hostfile") == str(hosts) for c in launches)


@pytest.mark.slow
def test_slurm_rung_script_launches_every_gpu_of_the_job(generated, tmp_path):
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4",
           "SLURM_SUBMIT_DIR": str(tmp_path)}
    [launch] = run_script(generated / "slurm/ddp.sh", env, tmp_path)
    assert launch[:8] == ["srun", "-N", "2", "-n", "8", "--ntasks-per-node", "4", "--gpus-per-task"]
    assert launch[launch.index("-m") + 1] == "scaledl.ladder.ddp"


@pytest.mark.slow
def test_cpu_partition_script_launches_without_gpus_and_passes_run_flags(tmp_path):
    jobs.generate(tmp_path / "jobs", ["slurm"], slurm_gpus_per_node=0, max_nodes=1)
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "1", "SLURM_SUBMIT_DIR": str(tmp_path),
           "SCALEDL_RUN_FLAGS": "--epochs 1 --train-limit 256"}
    [launch] = run_script(tmp_path / "jobs/slurm/ddp.sh", env, tmp_path)
    assert launch[:7] == ["srun", "-N", "1", "-n", "2", "--ntasks-per-node", "2"]
    assert "--gpus-per-task" not in launch
    assert launch[-6:] == ["--out-dir", "runs/ddp/1nodes", "--epochs", "1", "--train-limit", "256"]
    # A requeued job finds its checkpoint and goes on from it.
    (tmp_path / "runs/ddp/1nodes").mkdir(parents=True)
    (tmp_path / "runs/ddp/1nodes/checkpoint.pt").write_bytes(b"")
    [launch] = run_script(tmp_path / "jobs/slurm/ddp.sh", env, tmp_path)
    assert launch[-5:-4] == ["--resume"] and launch[-7:-5] == ["--out-dir", "runs/ddp/1nodes"]


@pytest.mark.parametrize("script", [name for name in ALL_SCRIPTS if not name.startswith("slurm/")])
def test_a_pbs_script_outside_a_job_is_one_line_that_says_how_to_see_its_launch(script, tmp_path):
    # On a login node, before any module loads: no $PBS_NODEFILE, no hosts to launch on.
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SCALEDL_LAUNCH_FLAGS": "--dry-run"}
    result = subprocess.run(["bash", str(ROOT / "jobs" / script)], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "PBS_NODEFILE=hosts.txt SCALEDL_LAUNCH_FLAGS=--dry-run bash" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_the_dry_run_the_pbs_scripts_name_shows_their_launch(tmp_path):
    # The line each PBS script's header gives, as a learner types it on a login node.
    script = (ROOT / "jobs" / "polaris" / "ddp.sh").read_text()
    line = next(line for line in script.splitlines() if "SCALEDL_LAUNCH_FLAGS=--dry-run" in line).lstrip("# ")
    assert line == "PBS_NODEFILE=hosts.txt SCALEDL_LAUNCH_FLAGS=--dry-run bash jobs/polaris/ddp.sh"
    (tmp_path / "hosts.txt").write_text("x3005c0s1b0n0\nx3005c0s2b0n0\n")
    [launch] = run_script(ROOT / "jobs" / "polaris" / "ddp.sh", {"PBS_NODEFILE": "hosts.txt"}, tmp_path)
    assert launch[0] == "mpiexec" and option(launch, "-n") == "8" and option(launch, "--hostfile") == "hosts.txt"


def test_horovod_rungs_on_aurora_say_where_horovod_is(tmp_path):
    # Aurora: TensorFlow's Horovod lives in the tensorflow module with a venv of its own; no Horovod for
    # PyTorch at all.  Outside a job (no module command) each script stops with one line, status 2.
    env = {"PATH": "/usr/bin:/bin", "PBS_NODEFILE": os.devnull}
    tf = subprocess.run(["bash", str(ROOT / "jobs" / "aurora" / "horovod_tf.sh")], cwd=tmp_path, env=env,
                        capture_output=True, text=True)
    assert tf.returncode == 2 and tf.stderr.count("\n") == 1 and "tools/setup_site.sh site --venv .venv-tf" in tf.stderr
    assert "module load tensorflow" in (ROOT / "jobs" / "aurora" / "horovod_tf.sh").read_text()
    torch = subprocess.run(["bash", str(ROOT / "jobs" / "aurora" / "horovod_torch.sh")], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    if subprocess.run(["python3", "-c", "import horovod.torch"], env=env, capture_output=True).returncode == 0:
        pytest.skip("this machine's python3 has Horovod for PyTorch")
    assert torch.returncode == 2 and torch.stderr == "error: no Horovod for PyTorch on Aurora: run horovod_torch " \
                                                     "on Polaris or a laptop\n"
    assert "HOROVOD=1" in (ROOT / "jobs" / "polaris" / "horovod_torch.sh").read_text()


def test_aurora_tensorflow_rungs_load_the_tensorflow_module_and_the_others_frameworks():
    # `frameworks` has had no TensorFlow since TensorFlow got a module of its own; ALCF's TensorFlow page
    # loads an MPICH beside it (src/scaledl/hpc/jobs.py, AURORA_TF).
    for path in sorted((ROOT / "jobs" / "aurora").glob("*.sh")):
        loads = re.findall(r"^\s+module load (.+)$", path.read_text(), re.M)
        if path.stem in ("single_tf", "horovod_tf"):
            assert loads == ["tensorflow mpich/opt/develop-git.6037a7a"], path.name
            assert ".venv-tf" in path.read_text(), path.name
        else:
            assert loads == ["frameworks"], path.name


def test_every_job_chooses_its_python_environment_once():
    # One SCALEDL_VENV default a script: a second, after the first, is dead and misleads its reader.
    for path in sorted((ROOT / "jobs").glob("*/*.sh")):
        defaults = re.findall(r"^SCALEDL_VENV=\$\{SCALEDL_VENV:-(.+)\}$", path.read_text(), re.M)
        assert len(defaults) == 1, (path, defaults)
        assert defaults[0] == ("$PWD/.venv-tf" if path.parts[-2] == "aurora" and path.stem.endswith("_tf")
                               else "$PWD/.venv"), path
