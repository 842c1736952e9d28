"""Bad input, class by class: each row runs the real command and expects one line, exit status 2, nothing written.

Classes: MNIST files, CIFAR-10 batches, data folders on read-only file systems, node files,
unavailable backends, the commands' own output paths, values that go into job scripts and
dry-run lines, damaged DeepSpeed checkpoints, busy ports, and errors that reach the user
through a launcher the package starts.  The last line on stderr is the error; it is the only
line that says `error:` and no traceback is printed.
"""
from __future__ import annotations

import contextlib
import gzip
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import tool
from mounts import read_only
from scaledl.hpc import launchers

MNIST_STEMS = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
               "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}
RUNG = [sys.executable, "-m", "scaledl.ladder.single_torch", "--epochs", "1"]


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PBS_", "SLURM_", "PALS_", "PMI_", "OMPI_COMM", "HOROVOD_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, **extra}


def run_command(command: list[str], env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, env=env or clean_env(), timeout=timeout)


def assert_one_line(result: subprocess.CompletedProcess, message: str, through_launcher: bool = False) -> None:
    """Exit status 2; the last line of stderr is the error and names `message`.

    Run directly, that is the only `error:` line and there is no traceback; through a launcher
    (which adds its own report of a failed rank) the error is still the last line."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, f"exit status {result.returncode}\n{result.stderr[-3000:]}"
    assert lines and ": error: " in lines[-1] and message in lines[-1], result.stderr[-3000:]
    if not through_launcher:
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        assert sum(": error: " in line for line in lines) == 1, result.stderr[-3000:]


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))} if folder.exists() else {}


# -- MNIST files ---------------------------------------------------------------------------

def idx_bytes(array: np.ndarray) -> bytes:
    header = b"\x00\x00\x08" + bytes([array.ndim]) + b"".join(n.to_bytes(4, "big") for n in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_mnist(folder: Path, train: int = 128, test: int = 64, **replace: bytes) -> Path:
    """A small, valid MNIST in IDX files (gzipped), with any file's bytes replaced by `replace`."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.integers(0, 256, (train, 28, 28)), "y_train": rng.integers(0, 10, train),
              "x_test": rng.integers(0, 256, (test, 28, 28)), "y_test": rng.integers(0, 10, test)}
    for key, stem in MNIST_STEMS.items():
        data = replace.get(key, gzip.compress(idx_bytes(arrays[key])))
        (folder / f"{stem}.gz").write_bytes(data)
    return folder


def gz(data: bytes) -> bytes:
    return gzip.compress(data)


MNIST_ROWS = {
    "not gzip": ({"x_train": b"plain bytes, not gzip"}, "is not a whole gzip file"),
    "truncated gzip": ({"x_train": gz(idx_bytes(np.random.default_rng(1).integers(0, 256, (128, 28, 28))))[:3000]},
                       "is not a whole gzip file"),
    "bad magic": ({"y_train": gz(b"\x08\x03\x00\x01" + bytes(100))}, "bad magic number"),
    "damaged header": ({"x_test": gz(b"\x00\x00\x08\x09" + bytes(8))}, "damaged IDX header"),
    "truncated data": ({"x_train": gz(idx_bytes(np.zeros((128, 28, 28)))[:-100])}, "is truncated"),
    "longer than header": ({"y_test": gz(idx_bytes(np.zeros(64)) + bytes(7))}, "longer than its header says"),
    "count mismatch": ({"y_train": gz(idx_bytes(np.zeros(100)))}, "has 128 images but"),
    "labels out of range": ({"y_train": gz(idx_bytes(np.full(128, 12)))}, "labels outside 0..9"),
    "not 28x28 images": ({"x_test": gz(idx_bytes(np.zeros((64, 10, 10))))}, "not images of (28, 28)"),
}


@pytest.mark.parametrize("row", list(MNIST_ROWS))
def test_mnist_files(tmp_path, row):
    replace, message = MNIST_ROWS[row]
    data = write_mnist(tmp_path / "data", **replace)
    out_dir = tmp_path / "out"
    result = run_command([*RUNG, "--dataset", "mnist", "--data-dir", str(data), "--out-dir", str(out_dir)])
    assert_one_line(result, message)
    assert not out_dir.exists()


@pytest.mark.parametrize("depth", [1, 3], ids=["a mistyped folder", "a mistyped path three folders deep"])
def test_a_mistyped_data_dir_is_not_left_behind(tmp_path, depth):
    # With no internet the download of the first file fails: the folders it made for it go with it.
    data = tmp_path.joinpath(*["typo"] * depth)
    result = run_command([*RUNG, "--dataset", "mnist", "--data-dir", str(data), "--out-dir", str(tmp_path / "out")])
    assert_one_line(result, "MNIST file train-images-idx3-ubyte")
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))


# -- CIFAR-10 batches ------------------------------------------------------------------------

class _Payload:
    """A pickle that would run a command when loaded (a file from somewhere else)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def cifar_batch(n: int = 100, change: dict | None = None) -> bytes:
    rng = np.random.default_rng(0)
    entry = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": list(rng.integers(0, 10, n)),
             b"batch_label": b"training batch"}
    entry.update(change or {})
    return pickle.dumps(entry)


def write_cifar(folder: Path, bad: bytes) -> Path:
    batches = folder / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (batches / name).write_bytes(bad if name == "data_batch_3" else cifar_batch())
    return folder


def cifar_rows(marker: Path) -> dict:
    return {
        "not a pickle": (b"\x89PNG not a pickle", "is not a CIFAR-10 python batch"),
        "truncated pickle": (cifar_batch()[:5000], "is not a CIFAR-10 python batch"),
        "a list, not a dict": (pickle.dumps([1, 2, 3]), "expected a dict with b'data' and b'labels'"),
        "str keys (not bytes)": (pickle.dumps({"data": 1, "labels": 2}), "expected a dict with b'data'"),
        "float pixels": (cifar_batch(change={b"data": np.zeros((100, 3072), np.float32)}), "must be a uint8 array"),
        "wrong row length": (cifar_batch(change={b"data": np.zeros((100, 1024), np.uint8)}), "N x 3072 pixels"),
        "labels not integers": (cifar_batch(change={b"labels": ["cat"] * 100}), "must be a list of integers"),
        "fewer labels": (cifar_batch(change={b"labels": [1] * 99}), "has 100 images but"),
        "code inside": (pickle.dumps({b"data": _Payload(marker)}), "it refers to posix.system"),
    }


@pytest.mark.parametrize("row", list(cifar_rows(Path("x"))))
def test_cifar_batches(tmp_path, row):
    marker = tmp_path / "code-ran"
    bad, message = cifar_rows(marker)[row]
    data = write_cifar(tmp_path / "data", bad)
    out_dir = tmp_path / "out"
    result = run_command([*RUNG, "--dataset", "cifar10", "--data-dir", str(data), "--out-dir", str(out_dir)])
    assert_one_line(result, message)
    assert not out_dir.exists() and not marker.exists()


# -- data folders on read-only file systems ----------------------------------------------------

@pytest.mark.parametrize("sub", ["", "not-yet-made"])
def test_read_only_data_folder(tmp_path, sub):
    (tmp_path / "empty").mkdir()
    with read_only(tmp_path / "empty", tmp_path / "ro") as folder:
        data = folder / sub if sub else folder
        out_dir = tmp_path / "out"
        result = run_command([*RUNG, "--dataset", "mnist", "--data-dir", str(data), "--out-dir", str(out_dir)])
        assert_one_line(result, "is read-only, so they cannot be downloaded there")
        assert not out_dir.exists()


# -- node files ---------------------------------------------------------------------------------

def node_file_rows(tmp_path: Path) -> dict:
    (tmp_path / "empty").write_text("")
    (tmp_path / "blank").write_text("\n  \n# a comment\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00host")
    (tmp_path / "slots").write_text("x3005c0s13b0n0 slots=4\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "shell").write_text("x3005c0s13b0n0\n$(touch pwned)\n")
    return {"empty": "names no host", "blank": "names no host", "binary": "is not a text file of host names",
            "slots": "line 1: 'x3005c0s13b0n0 slots=4' is not a host name", "folder": "is not a file",
            "shell": "line 2: '$(touch pwned)' is not a host name", "missing": "does not exist"}


@pytest.mark.parametrize("row", ["empty", "blank", "binary", "slots", "folder", "shell", "missing"])
def test_node_files_for_scaledl_launch(tmp_path, row):
    message = node_file_rows(tmp_path)[row]
    env = clean_env(PBS_NODEFILE=str(tmp_path / row), PBS_JOBID="123.polaris-pbs-01")
    result = run_command([tool("scaledl"), "launch", "--system", "polaris", "-n", "4", "--", "scaledl.ladder.ddp",
                          "--out-dir", str(tmp_path / "out")], env=env)
    assert_one_line(result, message)
    assert not (tmp_path / "out").exists() and not Path("pwned").exists()


def test_node_file_read_by_a_rank(tmp_path):
    # A rank of a two-node job finds rank 0's host in the node file.
    message = node_file_rows(tmp_path)["slots"]
    env = clean_env(PBS_NODEFILE=str(tmp_path / "slots"), OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_LOCAL_RANK="0",
                    OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_SIZE="1")
    result = run_command([sys.executable, "-m", "scaledl.ladder.ddp", "--out-dir", str(tmp_path / "out")], env=env)
    assert_one_line(result, message)
    assert not (tmp_path / "out").exists()


# -- unavailable backends -----------------------------------------------------------------------

@pytest.mark.parametrize("backend, message", [
    ("mpi", "this PyTorch was built without the MPI backend"),
    ("nccl", "NCCL"),
    ("xccl", "XCCL"),
    ("ccl", "backend"),
])
def test_unavailable_backend(tmp_path, backend, message):
    import torch

    if backend == "nccl" and torch.cuda.is_available():
        pytest.skip("nccl is available here")
    if backend == "nccl":  # a CPU build has no NCCL; a CUDA build (PyPI's) has it, but no GPU here
        message = "needs CUDA GPUs and this host has none" if torch.version.cuda else "without the NCCL backend"
    out_dir = tmp_path / "out"
    result = run_command([sys.executable, "-m", "scaledl.ladder.ddp", "--backend", backend, "--epochs", "1",
                          "--out-dir", str(out_dir)])
    assert_one_line(result, message)
    assert "leave out --backend" in result.stderr or "--backend gloo" in result.stderr
    assert not out_dir.exists()


# -- the commands' own output paths -------------------------------------------------------------

def output_path_rows(tmp_path: Path, ro: Path) -> dict:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    return {
        "jobs --out empty": (["jobs", "--out", ""], "--out is empty"),
        "jobs --out a file": (["jobs", "--out", str(a_file)], "is a file, not a directory"),
        "jobs --out under a file": (["jobs", "--out", str(a_file / "jobs")], "is a file, so"),
        "jobs --out read-only": (["jobs", "--out", str(ro / "jobs")], "read-only file system"),
        "bench --out-dir empty": (["bench", "overhead", "--out-dir", ""], "argument --out-dir: is empty"),
        "bench --out-dir read-only": (["bench", "overhead", "--out-dir", str(ro / "bench")], "read-only file system"),
        "bench --markdown a folder": (["bench", "overhead", "--markdown", str(tmp_path)], "is a directory"),
        "bench --markdown read-only": (["bench", "overhead", "--markdown", str(ro / "b.md")], "read-only file system"),
        "exercises --out empty": (["exercises", "--out", ""], "--out is empty"),
        "exercises --out read-only": (["exercises", "--out", str(ro / "ex")], "read-only file system"),
    }


ROW_NAMES = ["jobs --out empty", "jobs --out a file", "jobs --out under a file", "jobs --out read-only",
             "bench --out-dir empty", "bench --out-dir read-only", "bench --markdown a folder",
             "bench --markdown read-only", "exercises --out empty", "exercises --out read-only"]


@pytest.mark.parametrize("row", ROW_NAMES)
def test_cli_output_paths(tmp_path, row):
    (tmp_path / "empty").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    with read_only(tmp_path / "empty", tmp_path / "ro") as ro:
        args, message = output_path_rows(tmp_path, ro)[row]
        before = snapshot(tmp_path / "empty"), snapshot(work)
        result = subprocess.run([tool("scaledl"), *args], capture_output=True, text=True, env=clean_env(),
                                cwd=work if "exercises" not in row else Path(__file__).parent.parent, timeout=120)
        assert_one_line(result, message)
        assert (snapshot(tmp_path / "empty"), snapshot(work)) == before


# -- values that go into job scripts and dry-run lines ------------------------------------------

SCRIPT_ROWS = {
    "newline in --project": (["jobs", "--project", "proj\ntouch pwned"], "is not an allocation name"),
    "space in --project": (["jobs", "--project", "my project"], "is not an allocation name"),
    "quote in --project": (["jobs", "--project", "p'; touch pwned; '"], "is not an allocation name"),
    "--slurm-gpus-per-node -1": (["jobs", "--slurm-gpus-per-node", "-1"], "between 0 (a CPU partition) and 16"),
    "newline in --slurm-partition": (["jobs", "--slurm-partition", "cpu\n#SBATCH --x"], "is not a partition name"),
    "--env name with a space": (["launch", "-n", "2", "--dry-run", "--env", "BAD NAME=2", "--", "m"],
                                "is not a variable name"),
    "--env name with $": (["launch", "-n", "2", "--dry-run", "--env", "X$(touch pwned)=1", "--", "m"],
                          "is not a variable name"),
    "--env value with a newline": (["launch", "-n", "2", "--dry-run", "--env", "X=1\ntouch pwned", "--", "m"],
                                   "the value holds a newline"),
    "target with a newline": (["launch", "-n", "2", "--dry-run", "--", "m\ntouch pwned"],
                              "is neither a module"),
}


@pytest.mark.parametrize("row", list(SCRIPT_ROWS))
def test_values_for_job_scripts_and_dry_runs(tmp_path, row):
    args, message = SCRIPT_ROWS[row]
    result = subprocess.run([tool("scaledl"), *args, *(["--out", str(tmp_path / "jobs")] if args[0] == "jobs" else [])],
                            capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=120)
    assert_one_line(result, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == [] and not result.stdout


# -- damaged DeepSpeed checkpoints -----------------------------------------------------------------

DEEPSPEED = [sys.executable, "-m", "scaledl.ladder.deepspeed", "--epochs", "1", "--train-limit", "256",
             "--batch-size", "32"]


@pytest.fixture(scope="module")
def deepspeed_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ds") / "run"
    result = run_command([*DEEPSPEED, "--checkpoint-every", "4", "--out-dir", str(out_dir)],
                         env=launchers.local_env(1, clean_env()))
    assert result.returncode == 0, result.stderr[-3000:]
    assert list((out_dir / "checkpoint").glob("global_step*")), sorted(p.name for p in out_dir.rglob("*"))
    return out_dir


def damage(checkpoint: Path, how: str) -> None:
    newest = max(checkpoint.glob("global_step*"), key=lambda p: int(p.name.removeprefix("global_step")))
    if how == "truncated model states":
        path = next(newest.glob("*model_states.pt"))
        path.write_bytes(path.read_bytes()[:1000])
    elif how == "truncated optimizer states":
        path = next(newest.glob("*optim_states.pt"))
        path.write_bytes(path.read_bytes()[:1000])
    elif how == "garbage model states":
        next(newest.glob("*model_states.pt")).write_bytes(b"garbage" * 100)
    elif how == "step folder deleted":
        for path in newest.iterdir():
            path.unlink()
        newest.rmdir()
    elif how == "latest names no step":
        (checkpoint / "latest").write_text("global_step999999")


# (The optimizer's own file is not read back at ZeRO stage 0, the rung's default: no row for it.)
@pytest.mark.slow  # a DeepSpeed run and four launches: make test, not the edit-test loop
@pytest.mark.parametrize("how", ["truncated model states", "garbage model states", "step folder deleted",
                                 "latest names no step"])
def test_damaged_deepspeed_checkpoint(tmp_path, deepspeed_run, how):
    import shutil

    out_dir = tmp_path / "run"
    shutil.copytree(deepspeed_run, out_dir)
    damage(out_dir / "checkpoint", how)
    before = snapshot(out_dir)
    result = run_command([*DEEPSPEED, "--resume", "--out-dir", str(out_dir)], env=launchers.local_env(1, clean_env()))
    assert_one_line(result, "checkpoint")
    assert snapshot(out_dir) == before


# -- a busy port ----------------------------------------------------------------------------------

@contextlib.contextmanager
def a_busy_port():
    """A port on 127.0.0.1 that something listens on while the block runs."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


@pytest.mark.slow
def test_a_busy_port_says_so_and_how_to_pick_another(tmp_path):
    with a_busy_port() as port:
        command = launchers.deepspeed(2, "scaledl.ladder.deepspeed", ["--epochs", "1", "--out-dir",
                                                                      str(tmp_path / "out"), "--timeout", "20"])
        command = [a if not a.startswith("--master_port=") else f"--master_port={port}" for a in command]
        env = launchers.local_env(2, clean_env())
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert result.returncode != 0
    assert f"port {port} is already taken" in result.stderr and "MASTER_PORT" in result.stderr, result.stderr[-3000:]
    assert "lost a peer rank" not in result.stderr.split(f"port {port} is already taken")[0][-300:]


@pytest.mark.slow
def test_a_busy_port_under_horovodrun_is_the_main_ranks_one_line(tmp_path):
    # horovodrun starts the DDP rung too; its ranks meet at MASTER_PORT.
    with a_busy_port() as port:
        command = launchers.horovodrun(2, "scaledl.ladder.ddp", ["--epochs", "1", "--timeout", "20",
                                                                 "--out-dir", str(tmp_path / "out")])
        env = launchers.local_env(2, clean_env(MASTER_PORT=str(port)))
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert result.returncode != 0
    # horovodrun tags each rank's line; everything else is its own report.
    ranks = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("[")]
    errors = [line for line in ranks if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith("[0]<stderr>:scaledl.ladder.ddp: error: "), ranks
    assert f"port {port} is already taken" in errors[0] and "MASTER_PORT" in errors[0], ranks
    # horovodrun then stops rank 1; where its handler was already in place it says so in one line
    # (on a busy machine), else it says nothing: never a traceback, never a second error.
    others = [line for line in ranks if line not in errors]
    assert all(line == "[1]<stderr>:scaledl.ladder.ddp: stopped by SIGTERM (rank 1 of 2)" for line in others), ranks
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_adasum_on_gloo_is_one_line_that_names_mpi(tmp_path):
    # Horovod 0.28.1 has Adasum operations for MPI only; on Gloo every rank's first all-reduce fails
    # with "No Adasum operation enabled", which is not a lost peer.
    command = launchers.horovodrun(2, "scaledl.ladder.horovod_torch", ["--epochs", "1", "--adasum", "--train-limit",
                                                                       "256", "--out-dir", str(tmp_path / "out")])
    result = subprocess.run(command, capture_output=True, text=True, env=launchers.local_env(2, clean_env()),
                            timeout=240)
    assert result.returncode != 0
    ranks = [line for line in (result.stdout + result.stderr).splitlines() if "<stderr>:" in line]
    errors = [line for line in ranks if ": error: " in line]
    assert errors and all("Adasum runs over MPI only" in line and "mpirun" in line for line in errors), ranks
    assert not any("is gone" in line for line in ranks), ranks


# -- every command checks the flags and paths it takes, or passes on, before it does anything ------

def command_rows(a_file: Path) -> dict:
    return {
        "demo --epochs 0 (passed on)": (["demo", "--rungs", "single_torch", "--epochs", "0"], "--epochs must be > 0"),
        "demo --lr nan (passed on)": (["demo", "--rungs", "ddp", "--lr", "nan"], "--lr must be a finite number"),
        "demo flag a rung refuses": (["demo", "--rungs", "single_torch", "ddp", "--backend", "gloo"],
                                     "rung single_torch refuses the flags the demo passes on (--backend gloo)"),
        "demo unknown flag": (["demo", "--rungs", "ddp", "--bogus"], "unrecognized arguments: --bogus"),
        "demo -n 0": (["demo", "-n", "0"], "must be at least 1, got 0"),
        "demo --out-dir a file": (["demo", "--out-dir", str(a_file)], "is a file, not a directory"),
        "demo --out-dir under a file": (["demo", "--out-dir", str(a_file / "demo")], "is a file, so"),
        "exercises --solutions missing": (["exercises", "--solutions", "nowhere", "--out", "ex"], "is not a folder"),
        "exercises --solutions without notebooks": (["exercises", "--solutions", ".", "--out", "ex"],
                                                    "holds no notebook"),
        "bench -n 0": (["bench", "overhead", "-n", "0", "--out-dir", "b"], "must be at least 1"),
        "jobs --max-nodes 0": (["jobs", "--max-nodes", "0", "--out", "j"], "--max-nodes must be at least 1"),
        "launch -n 0": (["launch", "-n", "0", "--", "scaledl.ladder.ddp", "--out-dir", "o"], "must be at least 1"),
        "launch a script that is not there": (["launch", "-n", "2", "--", "train.py", "--out-dir", "o"],
                                              "train.py is not a file"),
        "launch a module that is not there": (["launch", "-n", "2", "--", "scaledl.ladder.nope", "--out-dir", "o"],
                                              "no module named scaledl.ladder.nope"),
        "doctor --sysfs missing": (["doctor", "--sysfs", "nowhere"], "no sys folder there"),
    }


@pytest.mark.parametrize("row", list(command_rows(Path("x"))))
def test_every_command_refuses_bad_input_before_doing_anything(tmp_path, row):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    work = tmp_path / "work"
    work.mkdir()
    args, message = command_rows(a_file)[row]
    result = subprocess.run([tool("scaledl"), *args], capture_output=True, text=True, env=clean_env(), cwd=work,
                            timeout=240)
    assert_one_line(result, message)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a-file", "work"], "created: " + str(list(work.rglob("*")))


# -- errors that come through a launcher the package starts ----------------------------------------

@pytest.mark.slow  # scaledl launch starts torchrun twice
@pytest.mark.parametrize("args, message", [
    (["--lr", "-1"], "--lr must be > 0"),
    (["--dataset", "mnist", "--data-dir", "{tmp}/nowhere"], "MNIST file train-images-idx3-ubyte"),
])
def test_scaledl_launch_shows_the_ranks_error_last_with_status_2(tmp_path, args, message):
    out_dir = tmp_path / "out"
    args = [a.format(tmp=tmp_path) for a in args]
    result = run_command([tool("scaledl"), "launch", "-n", "2", "--", "scaledl.ladder.ddp", *args,
                          "--out-dir", str(out_dir)])
    assert_one_line(result, message, through_launcher=True)
    # The rank's line comes once from the main rank (unless the launcher killed it first, when another
    # rank's error ended the job), and once more at the end: never once per rank.
    assert 1 <= sum(message in line for line in result.stderr.splitlines()) <= 2, result.stderr[-3000:]
    assert not out_dir.exists()


@pytest.mark.slow
def test_run_launcher_puts_the_line_in_the_callers_log(tmp_path):
    log = tmp_path / "log.txt"
    command = launchers.torchrun(2, "scaledl.ladder.ddp", ["--lr", "-1", "--out-dir", str(tmp_path / "out")])
    with open(log, "w") as out:
        code = launchers.run_launcher(command, launchers.local_env(2, clean_env()), stdout=out,
                                      stderr=subprocess.STDOUT)
    assert code == 2
    assert "--lr must be > 0" in log.read_text().strip().splitlines()[-1]
