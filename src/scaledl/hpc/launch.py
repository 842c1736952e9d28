"""`scaledl launch`: start N ranks of a module or script with the right launcher for this machine.

    scaledl launch -n 2 -- scaledl.ladder.ddp --epochs 1          # torchrun on this machine
    scaledl launch -n 8 -- scaledl.ladder.ddp                     # in a 2-node Polaris job: mpiexec
    scaledl launch -n 24 --dry-run --system aurora -- train.py    # print the command, run nothing

The command is built from the system (`scaledl.hpc.systems`: detected, or named with --system)
and the environment it runs in (PBS_NODEFILE, Slurm's allocation); ranks then find their
place from the launcher's variables (`scaledl.launch_env`), whichever launcher it was.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from typing import Mapping

from scaledl.hpc import launchers
from scaledl.errors import UserError
from scaledl.launch_env import LaunchError, host_name_problem
from scaledl.hpc.systems import (AURORA_CPU_LISTS, POLARIS_CORES_PER_GPU, POLARIS_GPU_BIND, SYSTEMS, Preset,
                             detect_system, node_list, polaris_plugin_path, preset_value, slurm_binds_cpus,
                             slurm_gpus_per_node, slurm_nodes)

PROG = "scaledl launch"


@dataclass(frozen=True)
class Target:
    """What each rank runs: a script (ends in .py) or a module, and its arguments."""

    program: str
    args: tuple[str, ...] = ()

    @property
    def is_script(self) -> bool:
        return self.program.endswith(".py")

    def python_command(self, python: str) -> list[str]:
        if self.is_script:
            return [python, self.program, *self.args]
        return [python, "-m", self.program, *self.args]


@dataclass(frozen=True)
class LaunchPlan:
    system: str
    reason: str  # why this system
    nodes: int
    ppn: int
    command: list[str]
    env: dict[str, str]  # set over the caller's environment
    presets: tuple[Preset, ...] = ()  # the recommended variables among `env`
    kept: dict[str, str] = field(default_factory=dict)  # presets the caller had already set: name -> theirs
    unset: tuple[str, ...] = ()  # removed from the ranks' environment (--nccl-fallback)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ppn


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# ALCF's fallback for an application that hangs or times out in NCCL with the plugin's settings
# ("unset NCCL_NET_GDR_LEVEL NCCL_CROSS_NIC NCCL_COLLNET_ENABLE NCCL_NET": argonne-lcf/user-guides,
# docs/polaris/applications-and-libraries/libraries/nccl.md, its warning), in its order.
NCCL_FALLBACK_UNSET = ("NCCL_NET_GDR_LEVEL", "NCCL_CROSS_NIC", "NCCL_COLLNET_ENABLE", "NCCL_NET")
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def parse_target(words: list[str]) -> Target:
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise LaunchError("nothing to launch: put the module or script after --, "
                          "e.g. scaledl launch -n 2 -- scaledl.ladder.ddp --epochs 1")
    program = words[0]
    if not (program.endswith(".py") or MODULE_NAME.fullmatch(program)) or any(ord(c) < 32 for c in program):
        raise LaunchError(f"{program!r} is neither a module (scaledl.ladder.ddp) nor a .py script: "
                          "put the module or script right after --")
    return Target(program, tuple(words[1:]))


def parse_env_overrides(pairs: list[str]) -> dict[str, str]:
    """--env NAME=VALUE pairs, each checked so that `export NAME=VALUE` is one valid shell line."""
    overrides = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise LaunchError(f"--env {pair!r}: expected NAME=VALUE")
        if not ENV_NAME.fullmatch(name):
            raise LaunchError(f"--env {pair!r}: {name!r} is not a variable name (letters, digits and _, "
                              "not starting with a digit)")
        if any(ord(c) < 32 and c != "\t" for c in value):
            raise LaunchError(f"--env {pair!r}: the value holds a newline or another control character")
        overrides[name] = value
    return overrides


def ranks_per_node(system: str, nranks: int, ppn: int | None, env: Mapping[str, str]) -> int:
    """--ppn as given, else one rank per GPU (per tile on Aurora), at most -n."""
    if ppn is None:
        ppn = SYSTEMS[system].ranks_per_node
        if system == "slurm":
            nodes = slurm_nodes(env)
            ppn = slurm_gpus_per_node(env) or (nranks // nodes if nodes and nranks % nodes == 0 else nranks)
        ppn = min(nranks, ppn) if ppn else nranks
    if ppn < 1 or nranks < 1:
        raise LaunchError(f"-n and --ppn must be at least 1, got -n {nranks} --ppn {ppn}")
    if nranks % ppn:
        raise LaunchError(f"-n {nranks} is not a multiple of --ppn {ppn}: every node runs the same number of ranks")
    limit = SYSTEMS[system].ranks_per_node
    if system in ("polaris", "aurora") and ppn > limit:
        unit = "GPU tiles" if system == "aurora" else "GPUs"
        raise LaunchError(f"--ppn {ppn} is more than the {limit} {unit} a {system.capitalize()} node has")
    return ppn


def build_plan(nranks: int, target: Target, ppn: int | None = None, system: str | None = None,
               env: Mapping[str, str] | None = None, hostname: str | None = None,
               python: str = sys.executable, overrides: Mapping[str, str] | None = None,
               comm_env: bool = True, dry_run: bool = False, nccl_fallback: bool = False) -> LaunchPlan:
    """The command and environment that start `nranks` ranks of `target` here.  nccl_fallback: ALCF's
    fallback, the four NCCL variables neither exported nor inherited, and NCCL_DEBUG=INFO unless set,
    so that the job's output says which network NCCL used."""
    env = dict(os.environ if env is None else env)
    clash = sorted(set(overrides or {}) & set(NCCL_FALLBACK_UNSET)) if nccl_fallback else []
    if clash:
        raise LaunchError(f"--nccl-fallback removes {clash[0]}, and --env sets it: drop one of the two")
    if system is None:
        system, reason = detect_system(env, hostname)
    elif system in SYSTEMS:
        reason = "--system"
    else:
        raise LaunchError(f"unknown system {system!r}: use one of {', '.join(SYSTEMS)}")
    ppn = ranks_per_node(system, nranks, ppn, env)
    nodes = nranks // ppn
    builders = {"local": _local, "polaris": _polaris, "aurora": _aurora, "slurm": _slurm}
    command, extra_env = builders[system](nranks, nodes, ppn, target, env, python, dry_run)
    presets = SYSTEMS[system].comm_env if comm_env else ()
    unset = NCCL_FALLBACK_UNSET if nccl_fallback else ()
    presets = tuple(p for p in presets if p.name not in unset)
    env = {name: value for name, value in env.items() if name not in unset}  # what the ranks will inherit
    applied = tuple(p for p in presets if p.name not in env)
    # Without NCCL_NET nothing asks for the plugin by name: its folder is not added.
    plugin = polaris_plugin_path(env) if comm_env and system == "polaris" and not nccl_fallback else None
    applied += (plugin,) if plugin else ()
    kept = {p.name: env[p.name] for p in presets if p.name in env}
    debug = {"NCCL_DEBUG": "INFO"} if nccl_fallback and "NCCL_DEBUG" not in env else {}
    plan_env = {**{p.name: preset_value(p, env) for p in applied}, **debug, **extra_env, **(overrides or {})}
    return LaunchPlan(system, reason, nodes, ppn, command, plan_env, applied, kept, unset)


def _local(nranks, nodes, ppn, target, env, python, dry_run):
    if nodes > 1:
        raise LaunchError(f"-n {nranks} --ppn {ppn} asks for {nodes} nodes, and this machine is one: "
                          "leave out --ppn, or run inside a PBS or Slurm job")
    problem = None if dry_run else host_name_problem()
    if problem:  # torchrun's agent would retry for minutes without a word
        raise LaunchError(f"{problem}; torchrun's rendezvous needs it")
    if target.is_script:
        command = [*launchers.launcher_command("torchrun"), "--standalone", f"--nproc_per_node={nranks}",
                   target.program, *target.args]
    else:
        command = launchers.torchrun(nranks, target.program, target.args)
    full = launchers.local_env(nranks, env)
    return command, {k: v for k, v in full.items() if env.get(k) != v}


def _pbs_hostfile(nodes: int, env, dry_run: bool) -> str:
    hosts = node_list(env)
    if not hosts:
        if dry_run:
            return "$PBS_NODEFILE"
        raise LaunchError("no PBS_NODEFILE here: run inside a PBS job (e.g. qsub -I -l select=2 ...), "
                          "or add --dry-run to see the command")
    if len(hosts) < nodes:
        raise LaunchError(f"PBS_NODEFILE names {len(hosts)} node{'s' * (len(hosts) != 1)} but this launch needs "
                          f"{nodes}: ask qsub for -l select={nodes}, or lower -n")
    return env["PBS_NODEFILE"]


def _polaris(nranks, nodes, ppn, target, env, python, dry_run):
    # Local rank r: cores 8r..8r+7 (NUMA node r) and GPU 3 - r, the GPU on that NUMA node
    # (scaledl.hpc.systems.POLARIS_GPU_BIND says why), for any --ppn up to 4.
    depth = POLARIS_CORES_PER_GPU
    command = ["mpiexec", "-n", str(nranks), "--ppn", str(ppn), "--depth", str(depth), "--cpu-bind", "depth",
               "--hostfile", _pbs_hostfile(nodes, env, dry_run), "--env", f"OMP_NUM_THREADS={depth}",
               "bash", "-c", POLARIS_GPU_BIND, "gpu-bind", *target.python_command(python)]
    return command, {}


def _aurora(nranks, nodes, ppn, target, env, python, dry_run):
    # Local rank r: 8 cores of its socket and xpu:<r>, a tile of a GPU on that socket
    # (scaledl.hpc.systems.AURORA_CPU_LISTS says why); no device mask.
    cores = "list:" + ":".join(AURORA_CPU_LISTS[:ppn])
    command = ["mpiexec", "-n", str(nranks), "--ppn", str(ppn), "--cpu-bind", cores,
               "--hostfile", _pbs_hostfile(nodes, env, dry_run), "--env", "OMP_NUM_THREADS=8",
               *target.python_command(python)]
    return command, {}


def _slurm_cpus_per_task(env: Mapping[str, str], ppn: int) -> list[str]:
    """srun's --cpus-per-task for each rank: the allocation's, else the node's CPUs shared out.

    Without it every task gets one CPU under --cpu-bind=cores (srun(1), -c: the default is one
    processor per task), so a rank's data loader and intra-op threads share one core.  From
    Slurm 22.05 to 23.02 srun did not inherit sbatch/salloc's --cpus-per-task (Slurm's RELEASE_NOTES
    for 22.05; 23.11 restored it through SLURM_CPUS_PER_TASK): passed on explicitly, which is
    harmless where srun inherits it.  A job that asked for none (the job scripts ask for whole
    nodes, #SBATCH --exclusive) gets SLURM_CPUS_ON_NODE // ppn.  SRUN_CPUS_PER_TASK (srun's own
    setting in 22.05-23.02; 23.11 and later ignore it) is the user's choice and is left to srun.
    """
    if "SRUN_CPUS_PER_TASK" in env:
        return []
    cpus = env.get("SLURM_CPUS_PER_TASK", "")
    if cpus.isdigit():
        return [f"--cpus-per-task={cpus}"]
    on_node = env.get("SLURM_CPUS_ON_NODE", "")
    if on_node.isdigit() and int(on_node) // ppn > 1:
        return [f"--cpus-per-task={int(on_node) // ppn}"]
    return []


def _slurm(nranks, nodes, ppn, target, env, python, dry_run):
    allocated = slurm_nodes(env)
    if allocated is not None and allocated < nodes:
        raise LaunchError(f"the Slurm job has {allocated} node{'s' * (allocated != 1)} but this launch needs "
                          f"{nodes}: ask sbatch/salloc for --nodes={nodes}, or lower -n")
    gpus = ["--gpus-per-task", "1"] if slurm_gpus_per_node(env) else []  # none on a CPU partition
    # Each rank on cores of its own, where the cluster can bind (task/affinity) and the user has
    # not chosen a binding (SLURM_CPU_BIND); elsewhere srun would only print that it cannot.
    bind = [] if "SLURM_CPU_BIND" in env or slurm_binds_cpus(env) is False else ["--cpu-bind=cores"]
    per_task = _slurm_cpus_per_task(env, ppn)
    command = ["srun", "-N", str(nodes), "-n", str(nranks), "--ntasks-per-node", str(ppn), *gpus, *per_task,
               *bind, *target.python_command(python)]
    return command, _cpu_job_env(env) if not gpus else {}


def _cpu_job_env(env: Mapping[str, str]) -> dict[str, str]:
    """A job without GPUs on a node without any: DS_ACCELERATOR=cpu, as `launchers.local_env` sets
    for local ranks.  Otherwise DeepSpeed finds no GPU at `import deepspeed` and every rank warns
    "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect
    it." (`get_accelerator`, deepspeed/accelerator/real_accelerator.py, 0.19.8): the CPU is what
    the job asked for.  The node is asked too (a cluster that gives GPUs without telling Slurm
    would otherwise train on the CPU)."""
    if "DS_ACCELERATOR" in env:
        return {}
    from scaledl.hpc.launchers import visible_accelerators

    return {"DS_ACCELERATOR": "cpu"} if visible_accelerators(dict(env))[1] == 0 else {}


def export_line(plan: LaunchPlan, name: str) -> str:
    """`export NAME=VALUE` for one variable of the plan; a search path the plan puts folders in
    front of is written as those folders and the shell's own value after them."""
    prepended = {p.name: p.value for p in plan.presets if p.prepend}
    if name in prepended:
        return f"export {name}={shlex.quote(prepended[name])}:${name}"
    return f"export {name}={shlex.quote(plan.env[name])}"


def describe(plan: LaunchPlan) -> str:
    """The plan as shell lines a user can read, copy and change."""
    lines = [f"# system: {plan.system} ({plan.reason}); {plan.nodes} node{'s' * (plan.nodes != 1)} x "
             f"{plan.ppn} rank{'s' * (plan.ppn != 1)} = {plan.world_size} ranks",
             "# environment set for the ranks (a variable you already set is kept; --env NAME=VALUE overrides):"]
    if plan.unset:
        lines.append(f"unset {' '.join(plan.unset)}  # ALCF's fallback for a job that hangs in NCCL (--nccl-fallback)")
    why = {p.name: f"  # {p.why} [the value: {p.docs}]" for p in plan.presets}
    lines += [export_line(plan, name) + why.get(name, "") for name in plan.env]
    lines += [f"# kept your {name}={shlex.quote(value)}" for name, value in plan.kept.items()]
    # Outside a job the node file is the variable PBS will set: leave it for the shell to expand.
    lines.append(shlex.join(plan.command).replace("'$PBS_NODEFILE'", '"$PBS_NODEFILE"'))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Start N ranks of a module or script with the launcher this machine needs."
    parser.add_argument("-n", "--nranks", type=int, required=True, help="ranks in all (the world size)")
    parser.add_argument("--ppn", type=int, help="ranks per node (default: one per GPU, per tile on Aurora)")
    parser.add_argument("--system", choices=sorted(SYSTEMS), help="where this runs (default: detected)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set a variable for the ranks (repeatable); wins over the presets")
    parser.add_argument("--no-comm-env", dest="comm_env", action="store_false",
                        help="do not export the system's recommended communication variables")
    parser.add_argument("--nccl-fallback", action="store_true",
                        help="ALCF's fallback for a multi-node job that hangs or times out in NCCL: the ranks run "
                             f"without {', '.join(NCCL_FALLBACK_UNSET)} (a module's values removed too), with "
                             "NCCL_DEBUG=INFO unless set")
    parser.add_argument("--dry-run", action="store_true", help="print the command and environment; run nothing")
    parser.add_argument("target", nargs=argparse.REMAINDER, metavar="-- MODULE_OR_SCRIPT ARGS",
                        help="a module (python -m) or a .py script, and its arguments")


def _missing_target(target: Target) -> str | None:
    """Why every rank would fail at once to start `target` here (checked before any rank starts), or None."""
    if target.is_script:
        if not os.path.isfile(target.program):
            return f"{target.program} is not a file: name a script that exists (from {os.getcwd()}), or a module"
        return None
    import importlib.util

    try:
        found = importlib.util.find_spec(target.program) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or is not a package
        found = False
    if not found:
        return (f"no module named {target.program} in this Python ({sys.executable}): check the name, "
                "or install the package that has it")
    return None


def run(args: argparse.Namespace) -> int:
    try:
        plan = build_plan(args.nranks, parse_target(args.target), args.ppn, args.system,
                          overrides=parse_env_overrides(args.env), comm_env=args.comm_env, dry_run=args.dry_run,
                          nccl_fallback=args.nccl_fallback)
    except UserError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(describe(plan))
        return 0
    missing = _missing_target(parse_target(args.target))
    if missing:
        print(f"{PROG}: error: {missing}", file=sys.stderr)
        return 2
    print(f"{PROG}: {shlex.join(plan.command)}", file=sys.stderr, flush=True)
    try:
        # Signals reach every rank, and a rank's one-line error comes last with its status.
        inherited = {name: value for name, value in os.environ.items() if name not in plan.unset}
        return launchers.run_launcher(plan.command, {**inherited, **plan.env})
    except FileNotFoundError:
        print(f"{PROG}: error: {plan.command[0]} not found: load the system's MPI or Slurm module, "
              "or check `scaledl doctor`", file=sys.stderr)
        return 2
