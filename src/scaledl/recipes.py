"""The Polaris recipe a lesson prints: the PBS header, the module and environment lines and the
PALS `mpiexec` line of one rung, each taken from what writes it for real (`scaledl jobs` for
the header and the modules, `scaledl launch --system polaris` for the launch), so a lesson's
recipe is the job script's and cannot drift from it.

    from scaledl import recipes
    print(recipes.polaris("ddp"))                 # the batch job of the DDP rung on 2 nodes
    print(recipes.polaris("ddp", live_ranks=4))   # and the notebook's live ranks on one node
"""
from __future__ import annotations

import shlex

from scaledl import jobs
from scaledl.errors import UserError
from scaledl.launch import Target, build_plan, describe, export_line
from scaledl.systems import SYSTEMS

SYSTEM = "polaris"
PYTHON = "python"  # the venv's python once it is activated; `scaledl launch` writes its full path


def job(rung: str) -> jobs.Job:
    """The job `scaledl jobs` writes to jobs/polaris/<rung>.sh."""
    found = {job.name: job for job in jobs.jobs_for(SYSTEM, SYSTEMS[SYSTEM].ranks_per_node)}
    if rung not in found:
        raise UserError(f"no Polaris job for {rung!r}: use one of {', '.join(found)}")
    return found[rung]


def header(rung: str) -> list[str]:
    """The job script's #PBS lines."""
    return [line for line in jobs.render(job(rung)).splitlines() if line.startswith("#PBS ")]


def module_lines(rung: str) -> list[str]:
    """The script's module set-up: its comments after the first, then its commands on one line."""
    setup = jobs.RUNG_SETUP.get((SYSTEM, rung), jobs.SETUP[SYSTEM]).splitlines()
    comments = [line for line in setup[1:] if line.startswith("#")]
    commands = [line.strip() for line in setup if line.startswith("    ")]
    return [*comments, "; ".join(commands)]


def launch_lines(nranks: int, ppn: int, target: list[str]) -> list[str]:
    """What `scaledl launch --system polaris -n NRANKS --ppn PPN -- TARGET` exports and runs,
    without the reasons it prints beside each variable."""
    plan = build_plan(nranks, Target(target[0], tuple(target[1:])), ppn=ppn, system=SYSTEM, env={},
                      python=PYTHON, dry_run=True)
    return [export_line(plan, name) for name in plan.env] + [describe(plan).splitlines()[-1]]


def polaris(rung: str, *flags: str, live_ranks: int = 0) -> str:
    """The recipe for `rung` (with the rung's `flags`) as lines to read and copy; with
    `live_ranks`, first the interactive job and the engines' launch that runs a notebook's
    `%%px` cells on one node."""
    the_job = job(rung)
    nranks = the_job.nodes * the_job.ppn
    target = [*the_job.target, *flags]
    lines = []
    if live_ranks:
        directives = dict(line.split(" ", 2)[1:] for line in header(rung) if not line.startswith("#PBS -l "))
        limits = [line.split(" ", 2)[2] for line in header(rung) if line.startswith("#PBS -l ")]
        select = next(limit for limit in limits if limit.startswith("select="))
        one_node = "select=1" + select[select.index(":"):]
        filesystems = next(limit for limit in limits if limit.startswith("filesystems="))
        lines += ["# This notebook's live ranks: an interactive job on one node (lesson 0 starts JupyterLab there)",
                  f"qsub -I -A {directives['-A']} -q debug -l {one_node} -l walltime=01:00:00 -l {filesystems}",
                  "# ... in it, engines.start(WORLD_SIZE) runs the engines as the rungs' ranks run:",
                  launch_lines(live_ranks, live_ranks, ["ipyparallel.engine"])[-1],
                  ""]
    lines += [f"# jobs/polaris/{the_job.name}.sh, the lines that matter (submit the whole script: "
              f"qsub jobs/polaris/{the_job.name}.sh)",
              *header(rung),
              'cd "$PBS_O_WORKDIR"',
              *module_lines(rung),
              "source .venv/bin/activate  # the venv `make setup SYSTEM=polaris` made in your clone",
              f"# scaledl launch --system polaris -n {nranks} --ppn {the_job.ppn} -- {shlex.join(target)}"
              " exports and runs:",
              *launch_lines(nranks, the_job.ppn, target)]
    return "\n".join(lines)
