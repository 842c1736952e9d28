"""`scaledl jobs`: PBS job scripts for Polaris and Aurora and sbatch scripts for Slurm.

One script per rung of the ladder and one scaling sweep (1, 2, 4, ... nodes) per system, all
rendered from `templates/job.sh.template`: only the scheduler's directives, the module set-up
and the list of node counts differ, so the scripts cannot drift apart.  Each script calls
`scaledl launch`, which builds the mpiexec/srun line, so that line lives in one place too.

    scaledl jobs                        # (re)write jobs/ for every system
    scaledl jobs --check                # list scripts that differ from what would be written
    scaledl jobs --system slurm --slurm-gpus-per-node 0 --max-nodes 1 --out my_jobs
                                        # a CPU partition of one node (tools/slurm_cluster.sh's)
"""
from __future__ import annotations

import argparse
import re
import shlex
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from scaledl import meshes
from scaledl.errors import UserError
from scaledl.ladder import RUNGS
from scaledl.models import TRANSFORMER_DEFAULTS

SCHEDULERS = ("polaris", "aurora", "slurm")
SINGLE_RANK_RUNGS = ("single_torch", "single_tf")
PIPELINE_RANKS = 2  # the pipeline rung splits the model over exactly 2 ranks
RUNG_NODES = 2  # multi-node from the start: the debug queues take 1 or 2 nodes
SWEEP_NODES = 8
SWEEP_RUNG = "ddp"
# What a scheduler accepts as an account (PBS -A, sbatch --account): letters, digits, _ . -.
# Anything else, a newline above all, would become part of the script and run with the job.
PROJECT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_GPUS_PER_NODE = 16
MAX_RANKS_PER_NODE = 256
CPU_RANKS_PER_NODE = 2  # without GPUs, as the lessons' engines: enough ranks to see every collective


class JobsError(UserError, ValueError):
    """A value that cannot go into a job script."""


def check_project(project: str) -> str:
    if not PROJECT_PATTERN.fullmatch(project):
        raise JobsError(f"--project {project!r} is not an allocation name: use letters, digits, '_', '.' and '-' "
                        "(at most 64), as in your scheduler's account")
    return project


def check_gpus_per_node(count: int) -> int:
    if not 0 <= count <= MAX_GPUS_PER_NODE:
        raise JobsError(f"--slurm-gpus-per-node must be between 0 (a CPU partition) and {MAX_GPUS_PER_NODE}, "
                        f"got {count}")
    return count


def check_ranks_per_node(count: int | None) -> int | None:
    if count is not None and not 1 <= count <= MAX_RANKS_PER_NODE:
        raise JobsError(f"--slurm-ranks-per-node must be between 1 and {MAX_RANKS_PER_NODE}, got {count}")
    return count


def check_max_nodes(count: int | None) -> int | None:
    if count is not None and count < 1:
        raise JobsError(f"--max-nodes must be at least 1, got {count}")
    return count


def check_partition(name: str | None) -> str | None:
    if name is not None and not PROJECT_PATTERN.fullmatch(name):
        raise JobsError(f"--slurm-partition {name!r} is not a partition name: use letters, digits, '_', '.' "
                        "and '-', as `sinfo` lists them")
    return name


def ranks_per_slurm_node(gpus_per_node: int, ranks_per_node: int | None = None) -> int:
    """One rank per GPU; on a CPU partition CPU_RANKS_PER_NODE, unless given."""
    return ranks_per_node or gpus_per_node or CPU_RANKS_PER_NODE


@dataclass(frozen=True)
class Job:
    system: str
    name: str  # file name without .sh, and the runs/ folder
    title: str
    target: list[str]  # module and its flags
    nodes: int
    ppn: int
    sweep: bool = False


def queue(system: str, nodes: int) -> str:
    """The ALCF queue for a job of `nodes` nodes: debug for 1-2 nodes; debug-scaling up to 10 on
    Polaris and 256 on Aurora; prod above (the queue tables of ALCF's running-jobs pages,
    docs/polaris/running-jobs/index.md and docs/aurora/running-jobs-aurora.md, argonne-lcf/user-guides
    2026-08: Aurora's debug-scaling takes 2-256 nodes since 2026-02, its prod 256 and more)."""
    if nodes <= 2:
        return "debug"
    return "debug-scaling" if nodes <= {"polaris": 10, "aurora": 256}[system] else "prod"


def _directives(job: Job, project: str, slurm_gpus_per_node: int, partition: str | None = None) -> str:
    walltime = "01:00:00" if job.sweep else "00:30:00"
    if job.system == "slurm":
        gpus = min(job.ppn, slurm_gpus_per_node)
        lines = [f"--job-name=scaledl-{job.name}", f"--account={project}",
                 *([f"--partition={partition}"] if partition else []), f"--nodes={job.nodes}",
                 f"--ntasks-per-node={job.ppn}", *([f"--gpus-per-node={gpus}"] if gpus else []),
                 # Whole nodes: `scaledl launch` then gives each rank the node's CPUs / ranks per node
                 # (srun --cpus-per-task), not Slurm's default of one CPU per task.
                 "--exclusive",
                 f"--time={walltime}", f"--signal=B:USR1@{TIME_LIMIT_WARNING_S}", "--requeue",
                 "--output=%x-%j.out", "--open-mode=append"]
        text = "\n".join(f"#SBATCH {line}" for line in lines)
        if not gpus:
            text += ("\n# A CPU partition (scaledl jobs --slurm-gpus-per-node 0): no GPUs asked for; each rank\n"
                     "# trains on the CPU with gloo.")
        return text
    select = f"{job.nodes}:system=polaris" if job.system == "polaris" else f"{job.nodes}"
    filesystems = "home:eagle" if job.system == "polaris" else "home:flare"
    lines = [f"-A {project}", f"-q {queue(job.system, job.nodes)}", f"-l select={select}", "-l place=scatter",
             f"-l walltime={walltime}", f"-l filesystems={filesystems}", f"-N scaledl-{job.name}", "-j oe"]
    if job.system == "aurora":
        lines.append("-k doe")  # write output straight to its final place, readable while it runs
    return "\n".join(f"#PBS {line}" for line in lines)


SETUP = {
    "polaris": ("# Polaris: the conda module has PyTorch built for CUDA, and NCCL.\n"
                "# ALCF's NCCL page loads NCCL's aws-ofi-nccl plugin, outside the module, from\n"
                "# /soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib: scaledl launch puts that folder and hwloc's\n"
                "# first on LD_LIBRARY_PATH when no folder there holds the plugin.\n"
                "if command -v module >/dev/null 2>&1; then\n"
                "    module use /soft/modulefiles\n"
                "    module load conda\n"
                "    conda activate base\n"
                "fi\n"),
    "aurora": ("# Aurora: the frameworks module has PyTorch for Intel GPUs (XPU), oneCCL and MPICH.\n"
               "if command -v module >/dev/null 2>&1; then\n"
               "    module load frameworks\n"
               "fi\n"),
    "slurm": ("# Load your site's CUDA and MPI modules here (module load ...).\n"
              "# The Horovod rungs need MPI in every task: where srun starts tasks without an MPI plugin\n"
              "# (scontrol show config | grep MpiDefault says none), export SLURM_MPI_TYPE=pmix (srun --mpi=pmix).\n"
              "# The other rungs need no MPI under srun.\n"),
}

# Rungs whose framework is not in the system's module.  Polaris' conda module has had no Horovod
# since conda/2025-09-25 (ALCF, Polaris system updates); `make setup SYSTEM=polaris HOROVOD=1`
# builds it into .venv.  Aurora: TensorFlow 2.15 and Intel's Horovod are in the tensorflow module,
# not in frameworks (ALCF, TensorFlow on Aurora), and nothing on Aurora has Horovod for PyTorch
# (ALCF, PyTorch on Aurora).
POLARIS_HOROVOD = ("# Horovod: not in the conda module since conda/2025-09-25; `make setup SYSTEM=polaris HOROVOD=1`\n"
                   "# builds it into .venv.\n")
# Aurora's TensorFlow rungs: the tensorflow module, with the MPICH that ALCF's TensorFlow page loads beside
# it (docs.alcf.anl.gov/aurora/data-science/frameworks/tensorflow: `module load tensorflow` then
# `module load mpich/opt/develop-git.6037a7a` explicitly: ALCF's system updates rolled the default back to it in
# the next-eval queue on 2025-10-07, an image that reached most Aurora nodes on 2025-10-13, and a later
# programming environment lists another MPICH).
# The module gets a venv of its own, .venv-tf.
AURORA_TF_MODULES = "tensorflow mpich/opt/develop-git.6037a7a"
AURORA_TF = (
    "# Aurora: TensorFlow and Intel's Horovod are in the tensorflow module, not in frameworks; ALCF's page\n"
    "# (docs.alcf.anl.gov/aurora/data-science/frameworks/tensorflow) loads this MPICH beside it.\n"
    "if command -v module >/dev/null 2>&1; then\n"
    f"    module load {AURORA_TF_MODULES}\n"
    "fi\n")
# The Python environment that has scaledl, made by `make setup` over the system's module.
VENV = (
    "# The Python environment that has scaledl: $SCALEDL_VENV, else .venv in this directory, which\n"
    "# `make setup SYSTEM={system}` makes over {base} (nothing of it reinstalled).\n"
    "SCALEDL_VENV=${{SCALEDL_VENV:-$PWD/.venv}}\n"
    "if [ ! -f \"$SCALEDL_VENV/bin/activate\" ]; then\n"
    "    echo \"error: no Python environment at $SCALEDL_VENV: run 'make setup SYSTEM={system}' in your clone\" \\\n"
    "         \"and submit from there, or export SCALEDL_VENV=<that clone>/.venv\" >&2\n"
    "    exit 2\n"
    "fi")
# Aurora's tensorflow module gets a venv of its own, .venv-tf, made once on a login node.
AURORA_TF_VENV = (
    "# The Python environment that has scaledl over the tensorflow module: $SCALEDL_VENV, else .venv-tf in\n"
    f"# this directory, made once on a login node: module load {AURORA_TF_MODULES} &&\n"
    "# tools/setup_site.sh site --venv .venv-tf\n"
    "SCALEDL_VENV=${SCALEDL_VENV:-$PWD/.venv-tf}\n"
    "if [ ! -f \"$SCALEDL_VENV/bin/activate\" ]; then\n"
    "    echo \"error: no Python environment at $SCALEDL_VENV: make it once on a login node with\" \\\n"
    f"         \"'module load {AURORA_TF_MODULES} && tools/setup_site.sh site --venv .venv-tf'\" >&2\n"
    "    exit 2\n"
    "fi")
RUNG_VENV = {("aurora", "horovod_tf"): AURORA_TF_VENV, ("aurora", "single_tf"): AURORA_TF_VENV}
RUNG_SETUP = {
    ("polaris", "horovod_tf"): SETUP["polaris"] + POLARIS_HOROVOD,
    ("polaris", "horovod_torch"): SETUP["polaris"] + POLARIS_HOROVOD,
    ("aurora", "horovod_tf"): AURORA_TF,
    ("aurora", "single_tf"): AURORA_TF,
    ("aurora", "horovod_torch"): SETUP["aurora"] + (
        "# The frameworks module has no Horovod for PyTorch (docs.alcf.anl.gov/aurora/data-science/frameworks/\n"
        "# pytorch): this job stops here unless a Horovod for PyTorch is importable, from the module or from\n"
        "# the venv below.\n"
        "horovod_python=\"${SCALEDL_VENV:-$PWD/.venv}/bin/python\"\n"
        "[ -x \"$horovod_python\" ] || horovod_python=python3\n"
        "if ! \"$horovod_python\" -c 'import horovod.torch' 2>/dev/null; then\n"
        "    echo \"error: no Horovod for PyTorch on Aurora: run horovod_torch on Polaris or a laptop\" >&2\n"
        "    exit 2\n"
        "fi\n"),
}

# Slurm: the warning before the time limit (sbatch --signal=B:USR1@WARNING_S) and what the script does
# with it.  Bash runs a trap only between commands, so the launch runs in the background and the
# script waits for it.  On the warning the script passes SIGUSR1 on to the ranks with `scancel
# --signal=USR1` (by default scancel signals the job's steps, not the batch script: scancel(1),
# --batch); every rank stops at the next metrics line (--log-interval steps at most), the step
# they agree on, after saving a checkpoint there (scaledl.signals, scaledl.ladder.harness), well before
# Slurm's SIGTERM and SIGKILL at the limit.  The job then requeues itself (--requeue) and resumes.
TIME_LIMIT_WARNING_S = 120
SLURM_TIME_LIMIT = (
    "# Near the time limit Slurm sends this script SIGUSR1 (#SBATCH --signal): it passes the signal on to\n"
    "# the ranks, which save a checkpoint at the next metrics line (keep --log-interval steps well under\n"
    "# 120 s) and stop; then the job requeues itself and, run again, resumes from that checkpoint.\n"
    "requeue=\"\"\n"
    "on_time_limit() {\n"
    "    echo \"time limit near: the ranks save a checkpoint and stop, then job $SLURM_JOB_ID is requeued\" >&2\n"
    "    requeue=1\n"
    "    scancel --signal=USR1 \"$SLURM_JOB_ID\"  # the job's steps (the ranks), not this script\n"
    "}\n"
    "trap on_time_limit USR1\n")
# Slurm sends the warning at its first time-limit check (every 30 s) once fewer than the warning's seconds
# plus 30 remain (send_job_warn_signal in src/slurmctld/job_mgr.c; sbatch(1): "up to 60 seconds earlier"),
# so it may come before a launch, between two launches of a sweep, or while the ranks are still starting:
# no launch starts after it, and it is passed on again until the launch has ended (a rank that was not yet
# listening would otherwise run on into the limit; one that did not yet handle it ends, and the job requeues).
SLURM_LOOP_START = "    if [ -n \"$requeue\" ]; then break; fi  # the warning came: start nothing more\n"
SLURM_LAUNCH_END = (" &\n"
                    "    launch_pid=$!\n"
                    "    status=0\n"
                    "    wait \"$launch_pid\" || status=$?\n"
                    "    if [ -n \"$requeue\" ]; then\n"
                    "        # Ranks still starting when the warning came missed it: pass it on until they stop.\n"
                    "        while kill -0 \"$launch_pid\" 2>/dev/null; do\n"
                    "            sleep 5\n"
                    "            if kill -0 \"$launch_pid\" 2>/dev/null; then\n"
                    "                scancel --signal=USR1 \"$SLURM_JOB_ID\"\n"
                    "            fi\n"
                    "        done\n"
                    "        wait \"$launch_pid\" || true\n"
                    "        break\n"
                    "    fi\n"
                    "    if [ \"$status\" -ne 0 ]; then exit \"$status\"; fi")
SLURM_AFTER_LOOP = ("\nif [ -n \"$requeue\" ]; then\n"
                    "    scontrol requeue \"$SLURM_JOB_ID\"\n"
                    "fi")

RUNG_NODE_COUNTS = 'node_counts=("$NNODES")'
SWEEP_NODE_COUNTS = ("# The sweep: 1, 2, 4, ... nodes, up to the nodes of this job (the per-rank batch stays\n"
                     "# the same, so the global batch grows with the nodes: weak scaling).\n"
                     "node_counts=()\n"
                     "for ((n = 1; n <= NNODES; n *= 2)); do node_counts+=(\"$n\"); done")


def jobs_for(system: str, ranks_per_node: int, max_nodes: int | None = None) -> list[Job]:
    """Every rung's job and the sweep's; `max_nodes` caps their node counts (a small cluster)."""
    cap = max_nodes or SWEEP_NODES
    jobs = []
    tp = meshes.tp_in_node(TRANSFORMER_DEFAULTS["heads"], ranks_per_node)  # its all-reduces stay inside a node
    for rung, (module, _launcher, flags) in RUNGS.items():
        nodes, ppn = (1, 1) if rung in SINGLE_RANK_RUNGS else (1, PIPELINE_RANKS) if rung == "pipeline" \
            else (1, tp) if rung == "tensor_parallel" else (min(RUNG_NODES, cap), ranks_per_node)
        if rung == "fsdp_tp":  # tensor parallelism inside each node, data parallelism (FSDP2) across nodes
            flags = [*flags, "--tp", str(tp)]
        jobs.append(Job(system, rung, f"The ladder's {rung} rung on {system}.",
                        [f"scaledl.ladder.{module}", *flags], nodes, ppn))
    module, _launcher, flags = RUNGS[SWEEP_RUNG]
    jobs.append(Job(system, "sweep", f"Scaling sweep of the {SWEEP_RUNG} rung on {system}: 1, 2, 4, ... nodes.",
                    [f"scaledl.ladder.{module}", *flags], min(SWEEP_NODES, cap), ranks_per_node, sweep=True))
    return jobs


# A PBS script run outside a job (bash jobs/polaris/ddp.sh on a login node) has no $PBS_NODEFILE: one line
# that says what to do, exit 2, before any module is loaded.
PBS_OUTSIDE_JOB = """if [ -z "${PBS_NODEFILE:-}" ]; then
    echo "$0: PBS_NODEFILE is not set (not inside a job): submit it with qsub, or see its launch with" \\
        "PBS_NODEFILE=hosts.txt SCALEDL_LAUNCH_FLAGS=--dry-run bash $0 (hosts.txt: host names, one per line)" >&2
    exit 2
fi
"""


def render(job: Job, project: str = "YOUR_PROJECT", slurm_gpus_per_node: int = 4,
           slurm_partition: str | None = None) -> str:
    check_project(project)
    check_gpus_per_node(slurm_gpus_per_node)
    check_partition(slurm_partition)
    pbs = job.system != "slurm"
    values = {
        "directives": _directives(job, project, slurm_gpus_per_node, slurm_partition),
        "title": job.title,
        "submit": f"qsub -A {project}" if pbs else f"sbatch -A {project}",  # -A: the account, as the README submits
        "system": job.system,
        "name": job.name,
        "launcher": "mpiexec" if pbs else "srun",
        "workdir": "${PBS_O_WORKDIR:-.}" if pbs else "${SLURM_SUBMIT_DIR:-.}",
        "setup": RUNG_SETUP.get((job.system, job.name), SETUP[job.system]),
        "count_nodes": '$(sort -u "$PBS_NODEFILE" | wc -l)' if pbs else "${SLURM_JOB_NUM_NODES:-1}",
        # Outside a job PBS names no nodes: a dry run on a login node reads them from a file of host names.
        "dry_run_where": " (outside a job, from a file of host names, one per line)" if pbs else "",
        "dry_run_env": "PBS_NODEFILE=hosts.txt " if pbs else "",
        "outside_job": PBS_OUTSIDE_JOB if pbs else "",
        "ppn": str(job.ppn),
        "node_counts": SWEEP_NODE_COUNTS if job.sweep else RUNG_NODE_COUNTS,
        "target": shlex.join(job.target),
        "time_limit": "" if pbs else SLURM_TIME_LIMIT,
        "loop_start": "" if pbs else SLURM_LOOP_START,
        "launch_end": "" if pbs else SLURM_LAUNCH_END,
        "after_loop": "" if pbs else SLURM_AFTER_LOOP,
        "comm": (f" and exports {job.system}'s recommended\n# communication variables unless you set them first; "
                 "--dry-run prints both." if pbs else "; --dry-run prints it (a Slurm cluster\n# has no "
                 "communication presets here: export your site's NCCL variables in the set-up above)."),
    }
    base = "the module loaded above" if pbs else "the Python of the modules you load above"
    values["venv"] = RUNG_VENV.get((job.system, job.name)) or VENV.format(system=job.system, base=base)
    template = resources.files("scaledl.hpc").joinpath("templates", "job.sh.template").read_text()
    return re.sub(r"\{\{(\w+)\}\}", lambda match: values[match.group(1)], template)


def generate(out: str | Path = "jobs", systems=SCHEDULERS, project: str = "YOUR_PROJECT",
             slurm_gpus_per_node: int = 4, check: bool = False, *, slurm_ranks_per_node: int | None = None,
             slurm_partition: str | None = None, max_nodes: int | None = None) -> list[Path]:
    """Write every job script under `out`; return those that changed (with check: would change)."""
    from scaledl.hpc.systems import SYSTEMS

    changed = []
    for system in systems:
        ranks_per_node = SYSTEMS[system].ranks_per_node or ranks_per_slurm_node(slurm_gpus_per_node,
                                                                                 slurm_ranks_per_node)
        for job in jobs_for(system, ranks_per_node, max_nodes):
            path = Path(out, system, f"{job.name}.sh")
            text = render(job, project, slurm_gpus_per_node, slurm_partition)
            if path.is_file() and path.read_text() == text:
                continue
            changed.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                path.chmod(0o755)
    return changed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Write PBS job scripts for Polaris and Aurora and sbatch scripts for Slurm."
    parser.add_argument("--out", default="jobs", help="directory to write <system>/<rung>.sh into")
    parser.add_argument("--system", nargs="+", choices=SCHEDULERS, default=list(SCHEDULERS))
    parser.add_argument("--project", default="YOUR_PROJECT", help="allocation to charge (#PBS -A, --account)")
    parser.add_argument("--slurm-gpus-per-node", type=int, default=4,
                        help="GPUs a node of your Slurm cluster has (0: a CPU partition)")
    parser.add_argument("--slurm-ranks-per-node", type=int,
                        help=f"ranks a Slurm node runs (default: one per GPU; {CPU_RANKS_PER_NODE} without GPUs)")
    parser.add_argument("--slurm-partition", help="the Slurm partition to submit to (default: the cluster's)")
    parser.add_argument("--max-nodes", type=int,
                        help=f"most nodes a job asks for (default: {RUNG_NODES} for a rung, {SWEEP_NODES} for "
                             "the sweep)")
    parser.add_argument("--check", action="store_true", help="only list scripts that are out of date (exit 1 if any)")


def run(args: argparse.Namespace) -> int:
    from scaledl.output_paths import check_dir, describe_os_error

    try:
        check_project(args.project)
        check_gpus_per_node(args.slurm_gpus_per_node)
        check_ranks_per_node(args.slurm_ranks_per_node)
        check_partition(args.slurm_partition)
        check_max_nodes(args.max_nodes)
        if not args.check:
            check_dir(args.out, "--out")
        changed = generate(args.out, args.system, args.project, args.slurm_gpus_per_node, args.check,
                           slurm_ranks_per_node=args.slurm_ranks_per_node, slurm_partition=args.slurm_partition,
                           max_nodes=args.max_nodes)
    except UserError as error:
        print(f"scaledl jobs: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"scaledl jobs: error: {describe_os_error(error, error.filename or args.out)}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"{'out of date' if args.check else 'wrote'}: {path}")
    return 1 if args.check and changed else 0
