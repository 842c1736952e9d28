"""`scaledl doctor`: what this machine has for distributed training, and what will go wrong.

Each finding is `ok`, `info` (worth knowing, not wrong: a laptop without a GPU trains on the
CPU with gloo) or `PROBLEM` with the fix.  The exit status is 1 when there is a problem.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import site
import sys
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Mapping

from scaledl.hpc import binding, launchers
from scaledl.errors import UserError
from scaledl.hpc.systems import (NCCL_PLUGIN_FILE, POLARIS_NCCL_PLUGIN_FOLDERS, RESERVED_CPUS, SYSTEMS, detect_system,
                             nccl_plugin_folder, polaris_plugin_path)

FRAMEWORKS = {  # distribution -> (rungs that need it, extra to install)
    "torch": ("every PyTorch rung", "torch"),
    "tensorflow-cpu": ("single_tf, horovod_tf", "tensorflow"),
    "horovod": ("horovod_tf, horovod_torch", "horovod"),
    "deepspeed": ("deepspeed, zero1-3", "deepspeed"),
    "mpi4py": ("rendezvous under mpiexec", "mpi"),
}


@dataclass(frozen=True)
class Finding:
    level: str  # "ok", "info" or "problem"
    text: str
    fix: str = ""


def ok(text: str) -> Finding:
    return Finding("ok", text)


def info(text: str) -> Finding:
    return Finding("info", text)


def problem(text: str, fix: str) -> Finding:
    return Finding("problem", text, fix)


def version(distribution: str) -> str | None:
    names = (distribution, "tensorflow") if distribution == "tensorflow-cpu" else (distribution,)
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_frameworks() -> list[Finding]:
    found = []
    for distribution, (needed_by, extra) in FRAMEWORKS.items():
        installed = version(distribution)
        if installed:
            found.append(ok(f"{distribution} {installed}"))
        elif distribution == "torch":
            found.append(problem("torch is not installed", "make setup, or pip install -e '.[torch]'"))
        else:
            found.append(info(f"{distribution} is not installed ({needed_by} need it): pip install -e '.[{extra}]'"))
    tf = version("tensorflow-cpu") or version("tensorflow")
    if tf and version("horovod") and tuple(int(x) for x in re.findall(r"\d+", tf)[:2]) >= (2, 16):
        # Not a problem for the rungs (horovod_tf averages in a train step of its own), but a script
        # of the user's written for Horovod's Keras API would train each rank alone, silently.
        found.append(info(f"tensorflow {tf} brings Keras 3: Horovod's Keras API (hvd.keras.DistributedOptimizer, "
                          "its callbacks) does not average there; average in a train step of your own, as "
                          "scaledl.ladder.harness.horovod_keras_fit.AveragingModel does"))
    return found


def check_horovod(gpus: int) -> list[Finding]:
    if not version("horovod"):
        return []
    try:
        import horovod.torch as hvd
    except Exception as error:  # a Horovod built against another torch fails to load its extension
        return [problem(f"horovod.torch does not load: {str(error).splitlines()[0]}",
                        "rebuild Horovod against this torch: tools/build_horovod.sh (make setup does)")]
    flags = {name: bool(getattr(hvd, f"{name}_built")()) for name in ("mpi", "gloo", "nccl", "cuda", "ccl")}
    built = ", ".join(name for name, on in flags.items() if on) or "nothing"
    found = [ok(f"horovod built with: {built}")]
    if not (flags["mpi"] or flags["gloo"]):
        found.append(problem("horovod has neither MPI nor Gloo: horovodrun cannot start it",
                             "rebuild with HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1"))
    if gpus and not flags["nccl"]:
        found.append(problem("this machine has GPUs but Horovod was built without NCCL: allreduce goes through "
                             "host memory",
                             "rebuild Horovod with HOROVOD_GPU_OPERATIONS=NCCL"))
    return found


def mpi_family(text: str) -> str | None:
    """'openmpi' or 'mpich' (MPICH, Cray MPICH, Intel MPI, PALS) from a version string."""
    lowered = text.lower()
    if "open mpi" in lowered or "openrte" in lowered or "open-mpi" in lowered:
        return "openmpi"
    if any(word in lowered for word in ("mpich", "hydra", "pals", "intel(r) mpi", "cray")):
        return "mpich"
    return None


def check_mpi(env: Mapping[str, str]) -> list[Finding]:
    found = []
    library = None
    if version("mpi4py"):
        import mpi4py

        mpi4py.rc.initialize = False  # only ask for the library's name: no MPI_Init here
        from mpi4py import MPI

        library = MPI.Get_library_version().strip().splitlines()[0]
        found.append(ok(f"mpi4py uses {library[:70]}"))
    mpiexec = shutil.which("mpiexec", path=env.get("PATH"))
    if not mpiexec:
        found.append(info("no mpiexec on PATH: MPI launches (Horovod, PBS systems) need one"))
        return found
    result = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    launcher = (result.stdout or result.stderr).strip().splitlines()[0] if (result.stdout or result.stderr) else "?"
    found.append(ok(f"mpiexec: {mpiexec} ({launcher})"))
    if library and mpi_family(library) and mpi_family(launcher) and mpi_family(library) != mpi_family(launcher):
        found.append(problem(f"mpi4py is built for {mpi_family(library)} but {mpiexec} is {mpi_family(launcher)}: "
                             "every rank would see itself as rank 0 of 1",
                             "rebuild mpi4py with the system's MPI (MPICC=mpicc pip install --no-binary mpi4py "
                             "mpi4py) or put the matching mpiexec first on PATH"))
    return found


# What a site module provides and a venv on top of it must not install again: a pip copy lacks the
# site's CUDA/XPU, NCCL/oneCCL and MPI builds, and shadows the module's without a word.
SITE_FRAMEWORKS = ("torch", "tensorflow", "tensorflow-cpu", "deepspeed", "horovod", "mpi4py", "numpy",
                   "intel-extension-for-pytorch", "oneccl-bind-pt")
PACKAGING_TOOLS = {"pip", "setuptools", "wheel", "scaledl"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_in(folders: list[str]) -> dict[str, tuple[str, str]]:
    """name -> (version, folder) of the distributions installed in these folders (first wins)."""
    found = {}
    for folder in folders:
        for distribution in metadata.distributions(path=[folder]):
            name = distribution.metadata["Name"]
            if name:
                found.setdefault(_canonical(name), (distribution.version, folder))
    return found


def venv_layers(prefix: str | None = None, base_prefix: str | None = None) -> tuple[list[str], list[str], bool]:
    """(the venv's site-packages, the site's site-packages, whether the venv sees the site's)."""
    prefix, base_prefix = prefix or sys.prefix, base_prefix or sys.base_prefix
    config = Path(prefix, "pyvenv.cfg")
    system_site = False
    if config.exists():
        for line in config.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "include-system-site-packages":
                system_site = value.strip().lower() == "true"
    existing = lambda folders: [f for f in dict.fromkeys(folders) if Path(f).is_dir()]  # noqa: E731
    return existing(site.getsitepackages([prefix])), existing(site.getsitepackages([base_prefix])), system_site


def check_site(prefix: str | None = None, base_prefix: str | None = None) -> list[Finding]:
    """Which environment this is, where each framework comes from, and what a venv shadows."""
    prefix, base_prefix = prefix or sys.prefix, base_prefix or sys.base_prefix
    if Path(prefix).resolve() == Path(base_prefix).resolve():
        return [ok(f"python environment: {prefix} (no venv)")]
    own, base, system_site = venv_layers(prefix, base_prefix)
    if not system_site:
        return [ok(f"python environment: venv {prefix} (its own packages only)")]
    marker = Path(prefix, "scaledl-site")
    made_by = f", made by setup for {marker.read_text().strip()}" if marker.exists() else ""
    found = [ok(f"python environment: venv {prefix} over the site environment {base_prefix} "
                f"(--system-site-packages{made_by})")]
    mine, theirs = installed_in(own), installed_in(base)
    for name in SITE_FRAMEWORKS:
        if name in mine and name not in theirs:
            found.append(ok(f"{name} {mine[name][0]} from this venv"))
        elif name in theirs and name not in mine:
            found.append(ok(f"{name} {theirs[name][0]} from the site environment"))
    shadowed = sorted(set(mine) & set(theirs) - PACKAGING_TOOLS)
    for name in shadowed:
        text = (f"{name} {mine[name][0]} in this venv shadows the site's {name} {theirs[name][0]}")
        if name in SITE_FRAMEWORKS:
            found.append(problem(text + ": the venv's copy runs, without the site's GPU, network and MPI builds",
                                 f"{prefix}/bin/python -m pip uninstall {name}  (the site's then shows through)"))
        else:
            found.append(info(text))
    return found


def check_devices(system: str) -> tuple[list[Finding], int]:
    if not version("torch"):
        return [], 0
    import torch
    import torch.distributed as dist

    from scaledl import devices

    gpus, kind = devices.device_count(), (devices.accelerator() or "cuda").upper()
    found = []
    if gpus:
        found.append(ok(f"{gpus} {kind} device{'s' * (gpus != 1)} on this node"))
        expected = SYSTEMS[system].ranks_per_node
        if expected and gpus != expected:
            found.append(info(f"a {system} node has {expected} ranks' worth of devices; this one shows {gpus} "
                              "(CUDA_VISIBLE_DEVICES / ZE_AFFINITY_MASK set?)"))
    else:
        found.append(info("no GPU here: ranks train on the CPU with the gloo backend, which is how the "
                          "workshop runs on a laptop; on Polaris or Aurora run doctor inside a job"))
        if torch.version.cuda is None and shutil.which("nvidia-smi"):
            found.append(problem("this torch is the CPU build but the machine has NVIDIA GPUs",
                                 "install the CUDA wheel of the same torch version"))
    backends = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
                "mpi": dist.is_mpi_available(),
                "xccl": getattr(dist, "is_xccl_available", lambda: False)()}
    available = ", ".join(name for name, on in backends.items() if on) or "none"
    found.append(ok(f"torch.distributed backends: {available}"))
    needed = {"CUDA": "nccl", "XPU": "xccl"}.get(kind) if gpus else "gloo"
    if not backends.get(needed):
        found.append(problem(f"{needed}, the backend for this node's devices, is not available",
                             "install the torch build for this machine's devices (the system's framework module)"))
    return found, gpus


BINDING_KIND = {"polaris": "cuda", "aurora": "xpu"}  # the systems whose launch binds CPUs and GPUs itself
BINDING_FIX = ("launch with scaledl launch (or engines.start()), which pairs them; a variable you set yourself "
               "(CUDA_VISIBLE_DEVICES, ZE_AFFINITY_MASK, ZE_FLAT_DEVICE_HIERARCHY) is kept: unset it")


def check_binding(system: str, env: Mapping[str, str], root: str = binding.SYSFS) -> list[Finding]:
    """Each GPU's NUMA node, and on Polaris and Aurora where each local rank of a launch would run."""
    addresses = binding.gpus(root)
    if not addresses:
        return [info("no GPU on this node's PCI bus: no CPU-GPU binding to check")]
    nodes = binding.numa_nodes(root)
    found = []
    for address in addresses:
        node = binding.gpu_numa_node(address, root)
        where = f"NUMA node {node} (CPUs {binding.format_cpulist(nodes.get(node, ()))})" if node is not None \
            else "a machine with one NUMA node"
        found.append(ok(f"GPU {address} on {where}"))
    kind = BINDING_KIND.get(system)
    if kind is None:
        return found + [info(f"binding of ranks to cores on {system} is the launcher's: check it inside the ranks "
                             "(scaledl.hpc.binding.this_rank)")]
    from scaledl.hpc.launch import Target, build_plan

    ppn = SYSTEMS[system].ranks_per_node
    try:
        plan = build_plan(ppn, Target("scaledl.hpc.binding"), ppn=ppn, system=system, env=env, dry_run=True)
    except UserError as error:
        return found + [problem(f"no launch to check the binding of: {error}", "see the launch error above")]
    placements = binding.plan(plan.command, {**env, **plan.env}, kind, ppn, root, RESERVED_CPUS.get(system, ()))
    for placement in placements:
        text = f"binding of scaledl launch: {placement.line()}"
        if placement.verdict == "unknown":  # the kernel knows no NUMA nodes: nothing can be far
            found.append(info(text))
        else:
            found.append(ok(text) if placement.verdict == "local" else problem(text, BINDING_FIX))
    return found


def check_launcher(system: str, env: Mapping[str, str]) -> list[Finding]:
    name = SYSTEMS[system].launcher
    path = launchers.tool(name) if name == "torchrun" else shutil.which(name, path=env.get("PATH"))
    if path and (os.path.isabs(path) and os.path.exists(path)):
        found = [ok(f"launcher for {system}: {path}")]
    else:
        fix = {"torchrun": "install torch", "srun": "load Slurm's module or run on a Slurm login node",
               "mpiexec": "run inside a PBS job on a compute node, where PALS mpiexec is on PATH"}[name]
        found = [problem(f"{name}, the launcher for {system}, is not on PATH", fix)]
    for tool in ("horovodrun", "deepspeed"):
        if not os.path.exists(launchers.tool(tool)) and not shutil.which(tool):
            found.append(info(f"no {tool}: its rung's demo launch needs it (scaledl launch works without)"))
    return found


def check_data(env: Mapping[str, str]) -> list[Finding]:
    embedded = resources.files("scaledl").joinpath("embedded", "mnist-t10k")
    found = [ok("embedded MNIST (mnist-embedded) is packaged") if embedded.is_dir() else
             problem("the embedded MNIST is missing from the package", "reinstall scaledl: pip install -e .")]
    folder = env.get("SCALEDL_DATA")
    if not folder:
        found.append(info("SCALEDL_DATA is not set: --dataset mnist and cifar10 need it (mnist-embedded and "
                          "synthetic do not)"))
    elif not Path(folder).is_dir():
        found.append(problem(f"SCALEDL_DATA={folder} is not a directory",
                             "stage the data there (on a file system every node mounts), or unset it"))
    else:
        entries = sorted(p.name for p in Path(folder).iterdir())[:6]
        found.append(ok(f"SCALEDL_DATA={folder}: {', '.join(entries) or 'empty'}"))
    return found


def check_comm_env(system: str, env: Mapping[str, str]) -> list[Finding]:
    presets = SYSTEMS[system].comm_env
    if not presets:
        return [info(f"no communication presets for {system}: the launcher's defaults apply")]
    found = []
    for preset in presets:
        current = env.get(preset.name)
        if current is None:
            found.append(info(f"{preset.name} unset: scaledl launch exports {preset.value!r} ({preset.why})"))
        elif current == preset.value:
            found.append(ok(f"{preset.name}={current}"))
        else:
            found.append(info(f"{preset.name}={current}, recommended {preset.value!r} ({preset.why}; {preset.docs})"))
    if system == "polaris" and env.get("NCCL_NET", "AWS Libfabric") == "AWS Libfabric":
        folder = nccl_plugin_folder(env)
        with_plugin = polaris_plugin_path(env)
        if folder:
            found.append(ok(f"NCCL's network plugin (aws-ofi-nccl): {Path(folder, NCCL_PLUGIN_FILE)}"))
        elif with_plugin and nccl_plugin_folder({"LD_LIBRARY_PATH": with_plugin.value}):
            folder = with_plugin.value.split(":")[0]
            found.append(info(f"NCCL's network plugin is on no LD_LIBRARY_PATH folder: scaledl launch and "
                              f"engines.start() put ALCF's {folder} first; an mpiexec line of your own needs "
                              f"export LD_LIBRARY_PATH={folder}:$LD_LIBRARY_PATH"))
        else:
            found.append(problem(f"NCCL_NET='AWS Libfabric' needs the aws-ofi-nccl plugin ({NCCL_PLUGIN_FILE}), "
                                 f"which is neither on LD_LIBRARY_PATH nor in {POLARIS_NCCL_PLUGIN_FOLDERS[0]}: "
                                 "NCCL will fail to start between nodes",
                                 "prepend the plugin's folder (ls /soft/libraries/aws-ofi-nccl) to LD_LIBRARY_PATH, "
                                 "or unset NCCL_NET to use sockets"))
    return found


def diagnose(env: Mapping[str, str] | None = None, system: str | None = None,
             sysfs: str = binding.SYSFS) -> tuple[str, list[Finding]]:
    env = dict(os.environ if env is None else env)
    findings = []
    if system is None:
        try:
            system, reason = detect_system(env)
            findings.append(ok(f"system: {system} ({reason})"))
        except UserError as error:
            system = "local"
            findings.append(problem(str(error), "scaledl doctor --system polaris (or aurora)"))
    else:
        findings.append(ok(f"system: {system} (--system)"))
    findings += check_site() + check_frameworks()
    device_findings, gpus = check_devices(system)
    findings += device_findings + check_binding(system, env, sysfs)
    findings += check_horovod(gpus) + check_mpi(env) + check_launcher(system, env)
    findings += check_data(env) + check_comm_env(system, env)
    return system, findings


def format_report(system: str, findings: list[Finding]) -> str:
    lines = [f"scaledl doctor on {socket.gethostname()} ({system})"]
    for finding in findings:
        lines.append(f"  {finding.level.upper() if finding.level == 'problem' else finding.level:8} {finding.text}")
        if finding.fix:
            lines.append(f"  {'':8} fix: {finding.fix}")
    problems = sum(f.level == "problem" for f in findings)
    lines.append(f"{problems} problem{'s' * (problems != 1)}" if problems else "no problems")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Report frameworks, devices, CPU-GPU binding, MPI, launchers, data and communication settings."
    parser.add_argument("--system", choices=sorted(SYSTEMS), help="check for this system (default: detected)")
    parser.add_argument("--sysfs", default=binding.SYSFS, metavar="ROOT",
                        help="read the node's topology from ROOT/sys (a copy of another node's; default /)")


def run(args: argparse.Namespace) -> int:
    if not Path(args.sysfs, "sys").is_dir():
        print(f"scaledl doctor: error: --sysfs {args.sysfs}: no sys folder there", file=sys.stderr)
        return 2
    system, findings = diagnose(system=args.system, sysfs=args.sysfs)
    print(format_report(system, findings))
    return 1 if any(f.level == "problem" for f in findings) else 0
