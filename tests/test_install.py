"""Installing where the users are: into an environment that already has its own numpy and matplotlib,
on top of a site's framework module (Polaris, Aurora, or a stand-in made here), and from PyPI's
CUDA torch (a documented, opt-in run)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

# The helpers that need no framework, as a user's own script would call them.
HELPERS_WITHOUT_FRAMEWORKS = """
import json, sys, numpy, matplotlib, tqdm
import scaledl
from scaledl import metrics, sharding
data = scaledl.load_dataset("mnist-embedded")
shards = [sharding.eval_indices(len(data.y_test), rank, 2) for rank in range(2)]
assert sorted(numpy.concatenate(shards).tolist()) == list(range(len(data.y_test)))
x = data.normalized(data.x_train[:64])
rows = numpy.array([[2.0, 30, 64, 2, 0.5], [1.0, 34, 64, 2, 0.25]])
summary = metrics.summarize(rows)
log = sys.argv[1]
with open(log, "w") as f:
    for step in (1, 2):
        f.write(json.dumps({"type": "log", "step": step, "loss": 1.0 / step, "samples_per_s": 100.0}) + "\\n")
png = metrics.plot_history(log)
bar = list(scaledl.progress(range(3), is_main=True, disable=True))
print(json.dumps({"numpy": numpy.__version__, "matplotlib": matplotlib.__version__, "tqdm": tqdm.__version__,
                  "x_mean": round(float(x.mean()), 3), "accuracy": summary["accuracy"], "png": png.stat().st_size}))
"""


def sh(command: list, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, command))} exited {result.returncode}\n" \
                                   f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def new_venv(path: Path, *packages: str, system_site: bool = False) -> Path:
    """A venv of the interpreter these tests run on, with these packages; returns its python."""
    sh([sys.executable, "-m", "venv", *(["--system-site-packages"] if system_site else []), path])
    python = path / "bin" / "python"
    if packages:
        sh([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages])
    return python


def freeze(python: Path) -> dict[str, str]:
    out = sh([python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"]).stdout
    return {p["name"].lower(): p["version"] for p in json.loads(out)}


@pytest.mark.slow
@pytest.mark.parametrize("packages", [
    ["numpy==2.4.6", "matplotlib==3.10.9", "tqdm==4.70.1"],  # numpy 2 and another matplotlib than the pins
    ["numpy==1.23.5", "matplotlib==3.7.5", "tqdm==4.62.3"],  # the oldest pyproject.toml allows
], ids=["numpy2", "oldest"])
def test_pip_install_into_an_existing_environment_changes_nothing(tmp_path, packages):
    python = new_venv(tmp_path / "theirs", *packages)
    before = freeze(python)
    # A plain install with pip's own dependency resolution, as a user does it, from a copy of the
    # checkout: setuptools writes build/ and *.egg-info into the folder it builds.
    source = tmp_path / "scaledl"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "runs", "build", "*.egg-info",
                                                                "__pycache__", ".pytest_cache"))
    sh([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", source])
    after = freeze(python)
    added = {name: after[name] for name in set(after) - set(before)}
    changed = {name: (before[name], after.get(name)) for name in before if after.get(name) != before[name]}
    print(f"\nbefore: {before}\nadded: {added}\nchanged: {changed}")
    assert changed == {}
    assert set(added) == {"scaledl"}
    used = json.loads(sh([python, "-c", HELPERS_WITHOUT_FRAMEWORKS, tmp_path / "metrics.jsonl"],
                         cwd=tmp_path).stdout.splitlines()[-1])
    assert {name: used[name] for name in ("numpy", "matplotlib", "tqdm")} == \
        {p.split("==")[0]: p.split("==")[1] for p in packages}
    assert used["accuracy"] == pytest.approx(64 / 128) and used["png"] > 1000


def dry_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", ROOT / "tools" / "setup_site.sh", *args, "--dry-run"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)


def test_polaris_dry_run_puts_a_venv_over_the_conda_module_and_builds_horovod_with_nccl():
    result = dry_run("polaris", "--horovod")
    assert result.returncode == 0, result.stderr
    print(result.stdout)
    assert result.stdout.splitlines() == [
        "module use /soft/modulefiles",
        "module load conda",
        "conda activate base",
        "python3 -m venv --system-site-packages .venv",
        "echo polaris > .venv/scaledl-site",
        "python3 tools/pins.py --site > .venv/site-constraints.txt",
        ".venv/bin/python -m pip install --disable-pip-version-check -q -c .venv/site-constraints.txt "
        "--no-binary mpi4py -e '.[mpi,notebooks]'",
        "mkdir -p .venv/wheels",
        "env VENV=.venv CC=cc CXX=CC HOROVOD_GPU_OPERATIONS=NCCL bash tools/build_horovod.sh .venv/wheels",
        ".venv/bin/python -m pip install --disable-pip-version-check -q --no-deps '.venv/wheels/horovod-*.whl'",
        ".venv/bin/python -m pip install --disable-pip-version-check -q -c .venv/site-constraints.txt "
        "-e '.[horovod]'",
        ".venv/bin/python tools/site_report.py .venv",
    ]


def test_aurora_dry_run_loads_frameworks_and_installs_no_framework():
    result = dry_run("aurora")
    assert result.returncode == 0, result.stderr
    print(result.stdout)
    lines = result.stdout.splitlines()
    assert lines[:2] == ["module load frameworks", "python3 -m venv --system-site-packages .venv"]
    assert not any(word in result.stdout for word in ("torch", "tensorflow", "deepspeed", "build_horovod"))
    assert lines[2] == "echo aurora > .venv/scaledl-site"
    assert lines[-1] == ".venv/bin/python tools/site_report.py .venv"


@pytest.mark.parametrize("args, message", [
    (["aurora", "--horovod"], "Aurora's frameworks module has no Horovod for PyTorch"),
    (["summit"], "unknown system 'summit'"),
    (["polaris", "--venv"], "--venv needs a value"),
    (["polaris", "--bogus"], "unknown argument --bogus"),
])
def test_site_setup_refuses_bad_input_in_one_line(args, message):
    result = dry_run(*args)
    assert result.returncode in (1, 2) and result.stdout == ""
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_make_setup_passes_the_system_on():
    result = sh(["make", "-n", "-B", "setup", "SYSTEM=polaris", "HOROVOD=1"], cwd=ROOT)
    assert 'SCALEDL_SYSTEM="polaris" HOROVOD="1" bash tools/setup.sh' in result.stdout


def pyenv_pythons(*versions: str) -> list[Path]:
    """The newest interpreter of each of `versions` that this machine's pyenv has (none without pyenv)."""
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip() \
        if shutil.which("pyenv") else ""
    found = []
    for version in versions:
        found += sorted(Path(root, "versions").glob(f"{version}.*/bin/python"))[-1:] if root else []
    return found


def other_pythons() -> list[Path]:
    """Interpreters outside the supported range that this machine has."""
    return pyenv_pythons("2.7", "3.6", "3.9", "3.14")


@pytest.mark.slow
def test_pip_resolves_the_pins_on_each_supported_python(tmp_path):
    # Ubuntu 22.04 ships 3.10, Ubuntu 24.04 3.12, Debian 13 3.13 (this machine: 3.11, which make
    # setup installs for real).  pip's own resolver, on the real index, must find every pin
    # there: a wheel or sdist whose Requires-Python admits it.  (Horovod and DeepSpeed are built
    # from their sdists by make setup; mpi4py too.)  The resolutions wait on the index, not the
    # CPU: they run side by side.
    found = {version: pyenv_pythons(version) for version in ("3.10", "3.12", "3.13")}
    interpreters = {version: pythons[0] for version, pythons in found.items() if pythons}
    if not interpreters:
        pytest.skip("no Python 3.10, 3.12 or 3.13 here")
    running = {}
    for version, interpreter in interpreters.items():
        folder = tmp_path / version
        sh([interpreter, "-m", "venv", folder / "venv"])
        python = folder / "venv" / "bin" / "python"
        pins = sh([python, ROOT / "tools" / "pins.py", "core", "torch", "tensorflow", "mpi", "horovod", "deepspeed",
                   "notebooks", "test"]).stdout.split()
        wheels = [pin for pin in pins if not pin.startswith(("horovod==", "deepspeed==", "mpi4py=="))]
        command = [str(c) for c in (python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                                    "--report", folder / "report.json", "-c", ROOT / "constraints.txt", *wheels)]
        running[version] = (wheels, folder, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                             text=True))
    for version, (wheels, folder, process) in running.items():
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, \
            f"Python {version}: pip exited {process.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
        resolved = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
                    for item in json.loads((folder / "report.json").read_text())["install"]}
        for pin in wheels:
            name, pinned = pin.split("==")
            assert resolved.get(name, "").split("+")[0] == pinned, (version, name, resolved.get(name))


def test_make_setup_names_an_interpreter_it_cannot_use_in_one_line_before_installing_anything(tmp_path):
    # Debian 13 and Ubuntu 24.04 ship 3.13 and 3.12; an old or too-new Python, a name that is not
    # there, or a shim that does not run, each must be one line from `make setup`, before apt-get,
    # the venv or pip.
    clone = tmp_path / "clone"
    sh(["git", "clone", "-q", ROOT, clone])
    for name in ("tools/setup.sh", "tools/pins.py", "constraints.txt"):  # the working tree's, committed or not
        shutil.copy(ROOT / name, clone / name)
    not_there = tmp_path / "python3.99"
    shim = tmp_path / "python3.12"
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.12: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    cases = [(p, f"this is Python {p.parent.parent.name.rsplit('.', 1)[0]}") for p in other_pythons()]
    cases += [(not_there, f"no '{not_there}' on PATH"), (shim, "does not run (pyenv: python3.12: command not found)")]
    assert len(cases) >= 2
    for python, says in cases:
        result = subprocess.run(["make", "setup", f"PYTHON={python}"], cwd=clone, capture_output=True, text=True,
                                env={**os.environ, "PYTHON": str(python)}, timeout=120)
        ours = [line for line in result.stderr.splitlines() if line.startswith("setup: ")]
        assert result.returncode != 0 and len(ours) == 1 and says in ours[0], (python, result.stderr)
        assert "PYTHON=" in ours[0] and "[setup" not in result.stdout, result.stdout
        assert not (clone / ".venv").exists()


def base_python(prefix: Path) -> Path:
    """A Python installation of its own at `prefix`, as a site module's conda environment is (a venv
    made from a venv would see the first one's base, not it): this interpreter's binary and standard
    library (linked, not copied) with an empty site-packages and pip."""
    base, version = Path(sys.base_prefix), f"python{sys.version_info.major}.{sys.version_info.minor}"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(base / "bin" / version, prefix / "bin" / "python3")
    stdlib = prefix / "lib" / version
    stdlib.mkdir(parents=True)
    for entry in (base / "lib" / version).iterdir():
        if entry.name != "site-packages":
            (stdlib / entry.name).symlink_to(entry)
    (stdlib / "site-packages").mkdir()
    python = prefix / "bin" / "python3"
    sh([python, "-m", "ensurepip"])
    assert sh([python, "-c", "import sys; print(sys.prefix)"]).stdout.strip() == str(prefix)
    return python


@pytest.fixture(scope="module")
def stand_in_site(tmp_path_factory):
    """A 'site module' made here: a Python installation with its own torch, a numpy 2 and mpi4py, then
    tools/setup_site.sh run over it for real.  Returns (site python, venv, site packages before)."""
    root = tmp_path_factory.mktemp("site")
    site_python = base_python(root / "module")
    sh([site_python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
        "torch==2.13.0", "numpy==2.4.6", "mpi4py==4.1.2"])
    before = freeze(site_python)
    venv = root / "venv"
    started = time.perf_counter()
    result = sh(["bash", ROOT / "tools" / "setup_site.sh", "site", "--python", site_python, "--venv", venv],
                cwd=ROOT, timeout=900)
    print(f"\nsetup_site.sh over the stand-in site: {time.perf_counter() - started:.0f} s\n{result.stdout}")
    return site_python, venv, before


@pytest.mark.slow
def test_venv_over_a_site_installs_scaledl_and_changes_nothing_of_the_site(stand_in_site):
    site_python, venv, before = stand_in_site
    assert freeze(site_python) == before, "the site's packages changed"
    theirs, ours = freeze(site_python), freeze(venv / "bin" / "python")
    own = {p.name.split("-")[0].lower() for p in (venv / "lib").glob("python3*/site-packages/*.dist-info")}
    print(f"site: torch {theirs['torch']}, numpy {theirs['numpy']}, mpi4py {theirs['mpi4py']}; "
          f"installed into the venv: {sorted(own)}")
    assert not own & {"torch", "numpy", "mpi4py", "tensorflow", "tensorflow_cpu", "deepspeed"}
    assert {"scaledl", "jupyterlab", "ipyparallel"} <= own
    assert ours["torch"] == theirs["torch"] and ours["numpy"] == theirs["numpy"] == "2.4.6"
    where = sh([venv / "bin" / "python", "-c", "import torch, numpy, scaledl; print(torch.__file__); "
                "print(numpy.__file__); data = scaledl.load_dataset('synthetic'); "
                "from scaledl import sharding; loader = sharding.torch_train_loader(data, 32, 0, 1, 0); "
                "x, y = next(iter(loader)); print(tuple(x.shape))"]).stdout.splitlines()
    module = str(site_python.parent.parent)
    assert where[0].startswith(module) and where[1].startswith(module) and where[2] == "(32, 1, 28, 28)"
    assert (venv / "scaledl-site").read_text().strip() == "site"


@pytest.mark.slow
def test_doctor_reports_the_site_and_warns_when_the_venv_shadows_it(stand_in_site):
    site_python, venv, _ = stand_in_site
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "SLURM_", "PALS_"))}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    report = subprocess.run([venv / "bin" / "scaledl", "doctor"], capture_output=True, text=True, env=env,
                            timeout=300).stdout
    print(report)
    assert f"over the site environment {site_python.parent.parent}" in report
    assert "torch 2.13.0+cpu from the site environment" in report and "shadows" not in report
    # A second numpy in the venv: the user's pip install pulled one in over the module's.
    sh([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", "numpy==2.2.6"])
    try:
        report = subprocess.run([venv / "bin" / "scaledl", "doctor"], capture_output=True, text=True, env=env,
                                timeout=300).stdout
        lines = report.splitlines()
        at = next(i for i, line in enumerate(lines) if "shadows" in line)
        assert lines[at].split()[0] == "PROBLEM" and "numpy 2.2.6 in this venv shadows the site's numpy 2.4.6" \
            in lines[at]
        assert "pip uninstall numpy" in lines[at + 1]
        check = subprocess.run([venv / "bin" / "python", ROOT / "tools" / "site_report.py", venv],
                               capture_output=True, text=True)
        assert check.returncode == 1 and "shadows" in check.stdout
    finally:
        sh([venv / "bin" / "python", "-m", "pip", "uninstall", "-q", "-y", "numpy"])


@pytest.mark.slow
def test_job_script_sources_the_venv_that_setup_made(stand_in_site, tmp_path):
    _, venv, _ = stand_in_site
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("node-a\nnode-b\n")
    env = {**os.environ, "PBS_NODEFILE": str(nodefile), "PBS_O_WORKDIR": str(tmp_path),
           "SCALEDL_LAUNCH_FLAGS": "--dry-run", "SCALEDL_VENV": str(venv)}
    result = subprocess.run(["bash", ROOT / "jobs" / "polaris" / "ddp.sh"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mpiexec" in result.stdout and f"{venv}/bin/python" in result.stdout
    env["SCALEDL_VENV"] = str(tmp_path / "missing")
    result = subprocess.run(["bash", ROOT / "jobs" / "polaris" / "ddp.sh"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 2 and "make setup SYSTEM=polaris" in result.stderr


# The run a new user makes on a Linux machine without this image's CPU wheel: PyPI's CUDA torch.
# It downloads about 2.6 GB and builds Horovod and DeepSpeed (30-40 min on 2 cores), so it runs only
# when asked:  SCALEDL_TEST_PYPI_SETUP=1 pytest -s tests/test_install.py -k pypi
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SCALEDL_TEST_PYPI_SETUP") != "1", reason="set SCALEDL_TEST_PYPI_SETUP=1")
def test_make_setup_with_pypi_cuda_torch(tmp_path):
    clone = tmp_path / "clone"
    sh(["git", "clone", "-q", ROOT, clone])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    # pip's configuration, local mirrors and find-links out of reach; separate pip and wheel caches.
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_CACHE_DIR=str(tmp_path / "pip-cache"),
               SCALEDL_WHEEL_CACHE=str(tmp_path / "wheels"), PATH=os.environ["PATH"])
    started = time.perf_counter()
    log = tmp_path / "setup.log"
    with open(log, "w") as out:
        result = subprocess.run(["make", "setup"], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT,
                                timeout=3 * 3600)
    minutes = (time.perf_counter() - started) / 60
    assert result.returncode == 0, log.read_text()[-5000:]
    python = clone / ".venv" / "bin" / "python"
    torch_build = sh([python, "-c", "import torch; print(torch.__version__, torch.version.cuda)"]).stdout.split()
    check = sh([clone / ".venv" / "bin" / "horovodrun", "--check-build"]).stdout
    disk = sh(["du", "-sh", clone / ".venv", tmp_path / "wheels", tmp_path / "pip-cache"]).stdout
    print(f"\nmake setup with PyPI's torch {torch_build}: {minutes:.1f} min\n{disk}\n{check}")
    assert torch_build[1] != "None" and "+cpu" not in torch_build[0]
    for feature in ("TensorFlow", "PyTorch", "MPI", "Gloo"):
        assert f"[X] {feature}" in check
    sh([python, "-c", "import horovod.torch.mpi_lib_v2; from horovod.tensorflow import mpi_ops; import deepspeed"])
    if shutil.which("nvidia-smi"):
        assert "[X] NCCL" in check


# A fresh Debian 13 (Python 3.13) made from Debian's packages, and the README's two commands run in
# it (tools/debian_root.sh): a clone, PyPI's CUDA torch (several GB) and both builds, so it runs only
# when asked:  SCALEDL_TEST_DEBIAN_ROOT=1 pytest -s tests/test_install.py -k debian
DEBIAN_ROOT = Path(os.environ.get("SCALEDL_DEBIAN_ROOT", "/var/tmp/scaledl-trixie"))


def mounts_under(root: Path) -> list[str]:
    with open("/proc/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(str(root) + "/")]


@pytest.mark.parametrize("root, says", [("/etc", "would clobber the system"), ("FILE", "is a file, not a folder")])
def test_debian_root_refuses_a_root_it_must_not_use_in_one_line(tmp_path, root, says):
    if root == "FILE":
        root = tmp_path / "a-file"
        root.write_text("")
    result = subprocess.run(["bash", ROOT / "tools" / "debian_root.sh", str(root)], capture_output=True, text=True,
                            timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and says in lines[0], result.stderr
    assert "[debian_root" not in result.stdout


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SCALEDL_TEST_DEBIAN_ROOT") != "1", reason="set SCALEDL_TEST_DEBIAN_ROOT=1")
def test_the_two_commands_in_a_fresh_debian_13_root():
    started = time.perf_counter()
    result = subprocess.run(["bash", ROOT / "tools" / "debian_root.sh", str(DEBIAN_ROOT)], capture_output=True,
                            text=True, timeout=3 * 3600)
    print(f"\n{result.stdout[-6000:]}\n{(time.perf_counter() - started) / 60:.1f} min")
    assert mounts_under(DEBIAN_ROOT) == []
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Python 3.13" in result.stdout
    assert all(f"{step} passed" in result.stdout for step in ("make demo", "make check", "horovod_tf equivalence"))


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SCALEDL_TEST_DEBIAN_ROOT") != "1", reason="set SCALEDL_TEST_DEBIAN_ROOT=1")
def test_ctrl_c_in_the_debian_root_leaves_nothing_mounted():
    if not (DEBIAN_ROOT / "usr" / "bin" / "python3").exists():
        pytest.skip("make the root first (the test above)")
    script = subprocess.Popen(["bash", ROOT / "tools" / "debian_root.sh", str(DEBIAN_ROOT)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not mounts_under(DEBIAN_ROOT) and time.monotonic() < deadline and script.poll() is None:
        time.sleep(0.2)
    assert mounts_under(DEBIAN_ROOT), "the script never mounted /proc and /dev in the root"
    time.sleep(5)
    os.killpg(script.pid, 2)  # Ctrl-C at a terminal signals the whole foreground group
    script.wait(timeout=120)
    assert mounts_under(DEBIAN_ROOT) == []
