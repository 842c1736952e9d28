"""The Polaris and Aurora recipes a lesson prints: the PBS header, the module and environment lines
and the PALS `mpiexec` line of one rung, each taken from what writes it for real (`scaledl jobs`
for the header and the modules, `scaledl launch --system polaris|aurora` for the launch), so a
lesson's recipe is the job script's and cannot drift from it.

    from scaledl.workshop import recipes
    print(recipes.polaris("ddp", full=True))      # the batch job of the DDP rung on 2 nodes, as lesson 0 reads it
    print(recipes.polaris("ddp", live_ranks=4))   # the short form a later lesson prints, with its live ranks
                                                  # and the script's `scaledl launch` line
    print(recipes.aurora("ddp"))                  # the same job on Aurora: 12 ranks a node, one per tile
"""
from __future__ import annotations

import shlex
from pathlib import Path

from scaledl.hpc import jobs
from scaledl.errors import UserError
from scaledl.hpc.launch import Target, build_plan, describe, export_line
from scaledl.hpc.systems import SYSTEMS

SYSTEM = "polaris"  # what the functions below default to
PYTHON = "python"  # the venv's python once it is activated; `scaledl launch` writes its full path


def job(rung: str, system: str = SYSTEM) -> jobs.Job:
    """The job `scaledl jobs` writes to jobs/<system>/<rung>.sh."""
    found = {job.name: job for job in jobs.jobs_for(system, SYSTEMS[system].ranks_per_node)}
    if rung not in found:
        raise UserError(f"no {system.capitalize()} job for {rung!r}: use one of {', '.join(found)}")
    return found[rung]


def header(rung: str, system: str = SYSTEM) -> list[str]:
    """The job script's #PBS lines."""
    return [line for line in jobs.render(job(rung, system)).splitlines() if line.startswith("#PBS ")]


def module_lines(rung: str, system: str = SYSTEM) -> list[str]:
    """The script's module set-up: its comments after the first, then its commands on one line."""
    setup = jobs.RUNG_SETUP.get((system, rung), jobs.SETUP[system])
    comments = [line for line in setup.splitlines()[1:] if line.startswith("#")]
    return [*comments, _commands(setup)]


def _commands(setup: str) -> str:
    """A set-up block's module and conda commands, on one line."""
    return "; ".join(line.strip() for line in setup.splitlines() if line.startswith(("    module ", "    conda ")))


def venv_line(rung: str, system: str = SYSTEM) -> str:
    """The job script's `source` line: the clone's .venv, or Aurora's TensorFlow venv for horovod_tf."""
    if ".venv-tf" in jobs.RUNG_VENV.get((system, rung), ""):  # the job template's venv block for this rung
        return (f"source .venv-tf/bin/activate  # made once: module load {jobs.AURORA_TF_MODULES} && "
                "tools/setup_site.sh site --venv .venv-tf")
    return f"source .venv/bin/activate  # the venv `make setup SYSTEM={system}` made in your clone"


def launch_lines(nranks: int, ppn: int, target: list[str], system: str = SYSTEM) -> list[str]:
    """What `scaledl launch --system SYSTEM -n NRANKS --ppn PPN -- TARGET` exports and runs,
    without the reasons it prints beside each variable."""
    plan = build_plan(nranks, Target(target[0], tuple(target[1:])), ppn=ppn, system=system, env={},
                      python=PYTHON, dry_run=True)
    return [export_line(plan, name) for name in plan.env] + [describe(plan).splitlines()[-1]]


def brief(rung: str, *flags: str, live_ranks: int = 0, system: str = SYSTEM) -> str:
    """What a lesson after lesson 0 prints, two lines where it can: the job script to submit with its
    nodes, then its `scaledl launch` line; its modules between them where they are not lesson 0's;
    with `live_ranks`, a comment first that names the notebook's own ranks.  Lesson 0 reads a whole
    script line by line (`full=True`), and its interactive job (`qsub -I`)."""
    the_job = job(rung, system)
    lines = []
    if live_ranks:
        lines += [f"# this notebook's {live_ranks} live ranks: engines.start({live_ranks}) in lesson 0's interactive "
                  "job on one node"]
    select = next(line for line in header(rung, system) if line.startswith("#PBS -l select="))
    nodes = (f"{the_job.nodes} node{'s' if the_job.nodes > 1 else ''} x "
             f"{the_job.ppn} rank{'s' if the_job.ppn > 1 else ''}")
    # The script's own launch line, not the mpiexec line it becomes: lesson 0's batch-jobs page reads that
    # one once (its GPU wrapper is the answer to an exercise of lesson 0's appendix).
    own_modules = _own_modules(rung, system)  # modules of its own, not the ones lesson 0 loads
    lines += [f"{_submit(rung, system)}  # {nodes} ({select}); it {'loads' if own_modules else 'runs'}"]
    if own_modules:
        lines += [module_lines(rung, system)[-1], venv_line(rung, system), "# and runs"]
    lines += [launch_command(rung, *flags, system=system)]
    return "\n".join(lines)


def launch_command(rung: str, *flags: str, system: str = SYSTEM) -> str:
    """The job script's `scaledl launch` line for the rung's whole job, without its --out-dir and --resume."""
    the_job = job(rung, system)
    return shlex.join(["scaledl", "launch", "--system", system, "-n", str(the_job.nodes * the_job.ppn),
                       "--ppn", str(the_job.ppn), "--", *the_job.target, *flags])


def _own_modules(rung: str, system: str) -> bool:
    """Whether the rung's job loads other modules or another venv than lesson 0's."""
    return (module_lines(rung, system)[-1] != _commands(jobs.SETUP[system])
            or ".venv-tf" in jobs.RUNG_SETUP.get((system, rung), ""))


def _submit(rung: str, system: str) -> str:
    """The command that submits the rung's job script: on ALCF's PBS with `-A` (the scripts' `#PBS -A` holds a
    placeholder, and a job without a real project is refused), under Slurm plain `sbatch`."""
    script = f"jobs/{system}/{job(rung, system).name}.sh"
    if system not in ("polaris", "aurora"):
        return f"sbatch {script}"
    return f"qsub -A {_account(rung, system)} {script}"


def _account(rung: str, system: str) -> str:
    """The allocation the rung's PBS header charges (`#PBS -A`)."""
    return next(line.split(" ", 2)[2] for line in header(rung, system) if line.startswith("#PBS -A "))


def _interactive(rung: str, system: str) -> str:
    """`qsub -I` for one node of the rung's job: its allocation and file systems, the debug queue, an hour."""
    limits = [line.split(" ", 2)[2] for line in header(rung, system) if line.startswith("#PBS -l ")]
    select = next(limit for limit in limits if limit.startswith("select="))
    one_node = "select=1" + select[len(select.split(":")[0]):]
    filesystems = next(limit for limit in limits if limit.startswith("filesystems="))
    return f"qsub -I -A {_account(rung, system)} -q debug -l {one_node} -l walltime=01:00:00 -l {filesystems}"


# The exports that are not network settings, and what they set (lesson 0 folds the exports into one comment).
NOT_NETWORK = {"CUDA_DEVICE_ORDER": "the GPU numbering", "ZE_FLAT_DEVICE_HIERARCHY": "the GPU numbering",
               "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "the GPU numbering", "LD_LIBRARY_PATH": "the plugin path"}


def exports_comment(exports: list[str]) -> str:
    """One comment that counts `export NAME=value` lines and says what they set: the network settings, then
    what the others set, e.g. `# 9 exports: 7 network settings, the GPU numbering and the plugin path`."""
    names = [line.split()[1].split("=", 1)[0] for line in exports]
    others = list(dict.fromkeys(NOT_NETWORK[name] for name in names if name in NOT_NETWORK))
    network = sum(name not in NOT_NETWORK for name in names)
    parts = [f"{network} network setting{'' if network == 1 else 's'}", *others]
    listed = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    return f"# {len(names)} exports: {listed} (the presets table says what each does)"


def recipe(rung: str, *flags: str, live_ranks: int = 0, system: str = SYSTEM, full: bool = True,
           fold_exports: bool = False) -> str:
    """The recipe for `rung` (with the rung's `flags`) as lines to read and copy; with
    `live_ranks`, first the interactive job and the engines' launch that runs a notebook's
    `%%px` cells on one node.  `full=False`: the short form, `brief`.  `fold_exports`: the
    launch's export lines as one comment that counts them (lesson 0 lists them in a box)."""
    if not full:
        return brief(rung, *flags, live_ranks=live_ranks, system=system)
    the_job = job(rung, system)
    nranks = the_job.nodes * the_job.ppn
    target = [*the_job.target, *flags]
    lines = []
    if live_ranks:
        lines += ["# This notebook's live ranks: an interactive job on one node (lesson 0 starts JupyterLab there)",
                  _interactive(rung, system),
                  "# ... in it, engines.start(WORLD_SIZE) runs the engines as the rungs' ranks run (ipyparallel"
                  " adds --mpi and its cluster's profile and id: start them from the notebook, not by hand):",
                  launch_lines(live_ranks, live_ranks, ["ipyparallel.engine"], system)[-1],
                  ""]
    # A complete job script, the file's shell line first: lesson 0 says to save it and submit it as it is.
    script = f"jobs/{system}/{the_job.name}.sh"
    lines += [] if live_ranks else ["#!/bin/bash -l"]
    launch = launch_lines(nranks, the_job.ppn, target, system)
    if fold_exports:  # every line but the mpiexec line is an export
        launch = [exports_comment(launch[:-1]), "# the ranks' launch, explained below under \"The mpiexec line\":",
                  launch[-1]]
        title = f"# {script} with its `scaledl launch` written out, its export lines folded into one comment."
    else:
        title = (f"# A complete job script: {script} with its `scaledl launch` written out. "
                 f"Save it as a file; {_submit(rung, system).replace(script, 'FILE')} submits it.")
    lines += [title,
              *header(rung, system),
              'cd "$PBS_O_WORKDIR"',
              *module_lines(rung, system),
              venv_line(rung, system),
              f"# scaledl launch --system {system} -n {nranks} --ppn {the_job.ppn} -- {shlex.join(target)}"
              f" exports and runs ({script} also passes --out-dir runs/{the_job.name}/<N>nodes, and --resume"
              " once a checkpoint is there):",
              *launch]
    return "\n".join(lines)


def polaris(rung: str, *flags: str, live_ranks: int = 0, full: bool = False, fold_exports: bool = False) -> str:
    """The recipe on Polaris: 4 ranks a node, one per A100, NCCL between them; the short form
    unless `full` (a complete job script, `scaledl launch` written out, as lesson 0 reads it;
    `fold_exports`: its export lines as one comment)."""
    return recipe(rung, *flags, live_ranks=live_ranks, system="polaris", full=full, fold_exports=fold_exports)


def aurora(rung: str, *flags: str, live_ranks: int = 0, full: bool = False) -> str:
    """The same recipe on Aurora: 12 ranks a node, one per GPU tile, oneCCL (torch's `xccl`) between them."""
    return recipe(rung, *flags, live_ranks=live_ranks, system="aurora", full=full)


RECORDED_NODES = Path(__file__).resolve().parents[3] / "tests" / "data" / "sysfs"  # in a clone of the repository


def polaris_node_figure(ranks_per_node: int = 4):
    """Lesson 0's node diagram for the recipe's own launch line, read from the recorded sysfs of a
    Polaris node: each local rank's cores (`--depth 8 --cpu-bind depth`), their NUMA node, and the
    GPU the wrapper gives it (3 - local rank), green where the two share a NUMA node."""
    from scaledl.hpc import binding
    from scaledl.workshop import plots

    root = RECORDED_NODES / SYSTEM
    if not root.is_dir():
        raise UserError(f"no recorded Polaris node at {root}: this figure needs a clone of the repository")
    plan = build_plan(ranks_per_node, Target("ipyparallel.engine", ()), ppn=ranks_per_node, system=SYSTEM, env={},
                      python=PYTHON, dry_run=True)
    placements = binding.plan(list(plan.command), dict(plan.env), "cuda", ranks_per_node, root)
    gpu_nodes = binding.gpu_numa_nodes(root, "cuda")
    return plots.node_binding({"a Polaris node under the recipe's mpiexec line": placements},
                              binding.numa_nodes(root), gpu_nodes)


def presets_table(system: str = SYSTEM) -> str:
    """The system's communication presets, as `scaledl launch --system SYSTEM --dry-run` exports them for a
    job of 2 nodes: each variable with its reason, and after them the sources the reasons cite, each
    numbered once, in the order the presets first cite it.  A reason that ends with the page of the
    library that reads the variable, "(NCCL's ...)" or "(libfabric's ...)", cites that page beside the
    page its value comes from."""
    import re

    ppn = SYSTEMS[system].ranks_per_node
    plan = build_plan(2 * ppn, Target("scaledl.ladder.ddp", ()), ppn=ppn, system=system, env={}, python=PYTHON,
                      dry_run=True)
    presets = {preset.name: preset for preset in plan.presets}
    lines, sources = [], []
    for name in (name for name in plan.env if name in presets):
        reason, cited = presets[name].why, [presets[name].docs]
        library = re.search(r" \(((?:NCCL|libfabric)'s (?:[^()]|\(\d\))*)\)$", reason)  # the reading library's page
        if library:
            reason = reason[:library.start()]
            cited.append(re.sub(r", [A-Z_]+$", "", library.group(1)))  # the page, without the variable's name
        sources += [source for source in cited if source not in sources]
        numbers = sorted(sources.index(source) + 1 for source in cited)
        lines += [export_line(plan, name).removeprefix("export "), f"    {reason} [{', '.join(map(str, numbers))}]"]
    return "\n".join([*lines, "", "Sources:", *(f"[{n}] {source}" for n, source in enumerate(sources, 1))])
