"""Run a rung once from a lesson: the plumbing behind lesson 12's cell that runs the tensor-parallel and 2D rungs.

`run` launches a rung (`scaledl.ladder.<name>`) on this machine's ranks with torchrun, as the rung's own job would
on one node, in a fresh output folder.  It returns the summary line the rung printed, the fields rank 0 wrote to
summary.json, and the folder (which holds the checkpoint).  A rung that fails raises with its last error lines.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from scaledl.hpc import launchers


def run(module: str, nproc: int, args=()) -> tuple[str, dict, Path]:
    """Run `module` (e.g. "scaledl.ladder.tensor_parallel") on `nproc` local ranks: (its summary line,
    summary.json, its output folder)."""
    out_dir = Path(tempfile.mkdtemp(prefix=f"{module.rsplit('.', 1)[-1]}-"))
    command = launchers.torchrun(nproc, module, [*args, "--out-dir", str(out_dir)])
    result = subprocess.run(command, capture_output=True, text=True, env=launchers.local_env(nproc))
    if result.returncode != 0:
        raise RuntimeError(f"{module} failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    line = next((line for line in result.stdout.splitlines() if line.startswith("summary")), None)
    if line is None:
        raise RuntimeError(f"{module} printed no summary line:\n{result.stdout[-2000:]}")
    return line, json.loads((out_dir / "summary.json").read_text()), out_dir
