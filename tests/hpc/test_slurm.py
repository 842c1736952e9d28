"""A real one-node Slurm cluster (tools/slurm_cluster.sh, Debian's slurm-wlm): the job scripts that
`scaledl jobs` writes for it, srun under salloc, the lessons' engines, scancel and host lists.

Every test here is marked `slurm` and `slow` (tests/conftest.py) and skips with one line where
there is no Slurm.  Runs are short (1 epoch of 512 samples); each prints its job's id and state.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cluster_processes, tool
from scaledl.hpc import jobs
from test_launch_env import BAD_NODELISTS, NODELISTS

QUICK = "--epochs 1 --train-limit 512 --log-interval 2"
DAEMONS = {"slurmctld", "slurmscriptd", "slurmd", "munged"}
# The states a job ends in (`scontrol show job` says COMPLETING until its epilog and steps are done).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE")


@pytest.fixture(scope="module")
def cpu_jobs(tmp_path_factory):
    """The scripts for this cluster: a CPU partition of one node."""
    out = tmp_path_factory.mktemp("jobs")
    jobs.generate(out, ["slurm"], slurm_gpus_per_node=0, max_nodes=1)
    return out / "slurm"


def test_scontrol_expands_host_lists_as_scaledl_does(slurm_cluster):
    for nodelist, hosts in NODELISTS.items():
        assert slurm_cluster.run(["scontrol", "show", "hostnames", nodelist]).stdout.split() == hosts, nodelist
    for nodelist in ["node[1-2]-ib", "a[1-2]]", "a[x]", "a[3-1]"]:
        assert nodelist in BAD_NODELISTS  # scaledl refuses these (tests/test_launch_env.py); so does scontrol:
        result = slurm_cluster.run(["scontrol", "show", "hostnames", nodelist])
        assert "Invalid hostlist" in result.stdout + result.stderr, nodelist


def submit(cluster, script: Path, cwd: Path, wait: bool = True, options=(), **env) -> tuple[str, str]:
    """sbatch a script from `cwd`; (job id, its output so far).  `wait` polls the job every 0.5 s until it
    has ended, rather than `sbatch --wait`, whose polls back off to every 32 s (2, 8, then 32 s: a job of
    11 s is seen done at 42 s)."""
    command = ["sbatch", "--parsable", *options, str(script)]
    result = cluster.run(command, cwd=cwd, timeout=600, **env)
    job_id = result.stdout.strip().split(";")[0]
    assert job_id.isdigit(), result.stderr
    if wait:
        cluster.wait_for(job_id, ENDED, timeout=600)
    outputs = list(cwd.glob(f"*-{job_id}.out"))
    return job_id, outputs[0].read_text() if outputs else ""


@pytest.mark.parametrize("name", ["ddp", "deepspeed", "horovod_torch", "fsdp", "sweep"])
def test_sbatch_runs_the_script_scaledl_jobs_wrote_to_its_summary_line(slurm_cluster, cpu_jobs, tmp_path, name):
    # Horovod needs MPI in every task: Open MPI through srun's PMIx plugin (the cluster's default is none).
    extra = {"SLURM_MPI_TYPE": "pmix"} if name.startswith("horovod") else {}
    started = time.monotonic()
    job_id, output = submit(slurm_cluster, cpu_jobs / f"{name}.sh", tmp_path, SCALEDL_RUN_FLAGS=QUICK, **extra)
    state = slurm_cluster.job(job_id)
    rung = "ddp" if name == "sweep" else name
    summary = [line for line in output.splitlines() if line.startswith(f"summary rung={rung} world_size=2 ")]
    print(f"job {job_id} ({name}.sh): {state.get('JobState')} {state.get('ExitCode')} in "
          f"{time.monotonic() - started:.0f} s; {summary[0] if summary else 'no summary line'}")
    assert state.get("JobState") == "COMPLETED" and state.get("ExitCode") == "0:0", output[-3000:]
    assert len(summary) == 1 and "params_in_sync=True" in summary[0], output[-3000:]
    assert "srun -N 1 -n 2 --ntasks-per-node 2 " in output and "--gpus" not in output
    assert "lacks support for cpu binding" not in output  # this cluster has no task/affinity: no --cpu-bind
    assert json.loads((tmp_path / f"runs/{name}/1nodes/summary.json").read_text())["world_size"] == 2
    # Quiet when it works: none of the library lines a learner cannot act on (DeepSpeed's accelerator
    # guess, its op build, its optimizer caution; torch's deprecations), and the summary is the last word.
    noise = [line for line in output.splitlines() if any(text in line for text in (
        "Setting accelerator to CPU", "built successfully", "untested optimizer", "Warning:"))]
    assert not noise, "\n".join(noise)
    if name != "sweep":
        assert output.strip().splitlines()[-1] == summary[0], output[-3000:]


def test_srun_under_salloc_runs_the_ddp_rung_without_mpi(slurm_cluster, tmp_path):
    # --mpi=none: the ranks find rank 0 from srun's variables; Open MPI could not initialize here.
    ddp = [sys.executable, "-m", "scaledl.ladder.ddp", *QUICK.split()]
    result = slurm_cluster.run(["salloc", "-n", "2", "srun", "--mpi=none", "-n", "2", *ddp,
                                "--out-dir", str(tmp_path / "srun")], timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "summary rung=ddp world_size=2 " in result.stdout
    launched = slurm_cluster.run(["salloc", "-n", "2", tool("scaledl"), "launch", "--system", "slurm", "-n", "2",
                                  "--", "scaledl.ladder.ddp", *QUICK.split(), "--out-dir", str(tmp_path / "launch")],
                                 timeout=300)
    assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-2000:]
    assert "scaledl launch: srun -N 1 -n 2 --ntasks-per-node 2 " in launched.stderr
    assert "summary rung=ddp world_size=2 " in launched.stdout
    for run in ("srun", "launch"):
        assert json.loads((tmp_path / run / "summary.json").read_text())["params_in_sync"] is True


ENGINES = """
import json
from scaledl.workshop import engines
cluster, view = engines.start()
view.execute("import scaledl, torch, torch.distributed as dist\\n"
             "d = scaledl.setup(timeout_s=60)\\n"
             "t = torch.tensor([d.rank + 1.0])\\n"
             "dist.all_reduce(t)\\n"
             "found = [d.rank, d.world_size, d.launcher, t.item()]\\n"
             "scaledl.teardown()")
print("ENGINES", json.dumps(dict(zip(view.targets, view.pull("found")))))
cluster.stop_cluster_sync()
"""


def test_lesson_engines_run_a_live_rank_cell_inside_an_allocation(slurm_cluster, tmp_path):
    script = tmp_path / "engines.py"
    script.write_text(ENGINES)
    result = slurm_cluster.run(["salloc", "-n", "2", sys.executable, str(script)], timeout=240, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "2 ranks up (slurm: srun -n 2 " in result.stdout
    found = json.loads(result.stdout.split("ENGINES ", 1)[1].splitlines()[0])
    # Engine i is srun's task i, and the two really all-reduced (1 + 2).
    assert found == {"0": [0, 2, "slurm", 3.0], "1": [1, 2, "slurm", 3.0]}


def job_processes(slurm_conf: str) -> list[int]:
    """What the cluster runs besides its daemons: job steps and ranks."""
    def name(pid):
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return None
    return [pid for pid in cluster_processes(slurm_conf) if name(pid) not in DAEMONS | {None}]


def command(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def deepspeed_buffers() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("deepspeed_")}


@pytest.mark.serial  # counts every DeepSpeed buffer in /dev/shm
def test_scancel_ends_every_rank_and_leaves_nothing(slurm_cluster, cpu_jobs, tmp_path):
    before = deepspeed_buffers()
    job_id, _ = submit(slurm_cluster, cpu_jobs / "deepspeed.sh", tmp_path, wait=False,
                       SCALEDL_RUN_FLAGS="--epochs 500 --train-limit 2048 --log-interval 2")
    metrics = tmp_path / "runs/deepspeed/1nodes/metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):  # training, every rank up
        assert time.monotonic() < deadline, f"job {job_id} never trained: {slurm_cluster.job(job_id)}"
        time.sleep(1)
    conf = slurm_cluster.env["SLURM_CONF"]
    ranks = [pid for pid in job_processes(conf) if command(pid)[1:3] == ["-m", "scaledl.ladder.deepspeed"]]
    assert len(ranks) == 2, [command(pid) for pid in job_processes(conf)]
    cancelled = time.monotonic()
    assert slurm_cluster.run(["scancel", job_id]).returncode == 0
    state = slurm_cluster.wait_for(job_id, ("CANCELLED",), timeout=60)
    deadline = time.monotonic() + 30
    while job_processes(conf) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = job_processes(conf)
    print(f"job {job_id} (deepspeed.sh): {state['JobState']} after scancel, all gone in "
          f"{time.monotonic() - cancelled:.1f} s; left: {left or 'nothing'}, "
          f"new /dev/shm files: {sorted(deepspeed_buffers() - before) or 'none'}")
    assert not left
    assert not [pid for pid in ranks if os.path.exists(f"/proc/{pid}")]
    assert deepspeed_buffers() - before == set()


def logged_steps(metrics: Path) -> list[list[int]]:
    """The steps metrics.jsonl logged, one list per run that wrote to it (a resumed run appends)."""
    runs = []
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "config":
            runs.append([])
        elif record.get("type") == "log" and runs:
            runs[-1].append(record["step"])
    return runs


def test_time_limit_warning_saves_a_checkpoint_and_the_requeued_job_resumes_from_it(slurm_cluster, cpu_jobs, tmp_path):
    # A 2-minute limit with the warning 75 s before it (the script's own is 120 s before 30 min).  Slurm sends
    # it at its first 30-s check once fewer than 75 + 30 s remain (send_job_warn_signal, job_mgr.c): 15-45 s
    # in, after the ranks have started (a 1-minute limit with 50 s let it come at once, before the launch).
    # No --checkpoint-every: the only checkpoint is the one the ranks save when the warning comes.
    flags = "--epochs 500 --train-limit 2048 --log-interval 4"
    job_id, _ = submit(slurm_cluster, cpu_jobs / "ddp.sh", tmp_path, wait=False,
                       options=["--time=2", "--signal=B:USR1@75"], SCALEDL_RUN_FLAGS=flags)
    deadline = time.monotonic() + 180
    while not ((requeued := slurm_cluster.job(job_id)).get("Restarts", "0") != "0"
               and requeued.get("JobState") == "PENDING"):
        assert time.monotonic() < deadline, f"job {job_id} never requeued: {requeued}"
        time.sleep(1)
    # Slurm holds a requeued job (Reason=BeginTime) until its old job credential has expired (cred_expire,
    # 10 s in tools/slurm_cluster.sh); started earlier, slurmd refuses it ("Job credential revoked").
    metrics = tmp_path / "runs/ddp/1nodes/metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (len(logged_steps(metrics)) == 2 and logged_steps(metrics)[1]):
        assert time.monotonic() < deadline, f"job {job_id} did not resume: {slurm_cluster.job(job_id)}"
        time.sleep(1)
    slurm_cluster.run(["scancel", job_id])
    slurm_cluster.wait_for(job_id, ("CANCELLED",), timeout=60)
    output = next(tmp_path.glob(f"*-{job_id}.out")).read_text()
    first, second = logged_steps(metrics)
    saved = re.search(r"saved a checkpoint at step (\d+) on SIGUSR1", output)
    print(f"job {job_id} (ddp.sh, --time=2 --signal=B:USR1@75): {requeued['JobState']} after the warning, "
          f"Restarts={requeued['Restarts']}; saved at step {saved and saved.group(1)} (last logged {first[-1]}), "
          f"resumed with first logged step {second[0]}")
    before, after = output.split("time limit near: the ranks save a checkpoint and stop", 1)
    # The ranks stopped together at a metrics line after saving there, not stopped by a signal or killed.
    assert saved and int(saved.group(1)) == first[-1], output[-3000:]
    assert "stopped by SIG" not in after.split("--resume")[0] and "Killed" not in after.split("--resume")[0], \
        output[-3000:]
    assert "--out-dir runs/ddp/1nodes --resume " in after
    assert second[0] == first[-1] + 4  # the requeued run went on from the step it saved, nothing trained twice


def test_learners_jobs_at_once_each_leave_their_run_in_the_class(slurm_cluster, cpu_jobs, tmp_path):
    """Three learners' jobs (one shared training account: SCALEDL_CLASS_LEARNER tells them apart) run at
    the same time and write their runs into one class directory; the report reads all three."""
    from scaledl import class_records
    from scaledl.workshop import class_report

    folder = tmp_path / "class"
    subprocess.run([tool("scaledl"), "class", "init", str(folder), "--system", "slurm"], check=True)
    job_ids = []
    for learner in ("ann", "bob", "cy"):
        cwd = tmp_path / learner
        cwd.mkdir()
        job_id, _ = submit(slurm_cluster, cpu_jobs / "ddp.sh", cwd, wait=False, SCALEDL_RUN_FLAGS=QUICK,
                           **{class_records.ENV: str(folder), class_records.LEARNER_ENV: learner})
        job_ids.append(job_id)
    for job_id in job_ids:
        state = slurm_cluster.wait_for(job_id, ENDED, timeout=600)
        assert state.get("JobState") == "COMPLETED", state
    report = class_report.build(folder)
    assert report.records.skipped == [] and len(report.records.runs) == 3
    klass = report.records.klass
    learners = {class_records.learner(klass, user) for user in ("ann", "bob", "cy")}
    assert {r["learner"] for r in report.records.runs} == learners
    assert all(r["nodes"] == 1 and r["summary"]["world_size"] == 2 for r in report.records.runs)
    (point,) = [p for p in report.points if p["series"] == "weak"]
    assert len(point["learners"]) == 3 and point["runs"] == 3
    print(report.text)
