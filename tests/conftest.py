"""Shared test helpers: run real launchers on this machine and read what ranks report."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scaledl import launchers

ROOT = Path(__file__).resolve().parent.parent
PROBES = Path(__file__).resolve().parent / "probes"


def run(command: list[str], timeout: float = 300, env: dict | None = None, nproc: int = 2,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a launcher command to completion; fail the test with its output if it does not exit 0."""
    full_env = launchers.local_env(nproc, {**os.environ, **(env or {})})
    full_env["PYTHONPATH"] = os.pathsep.join([str(PROBES), full_env.get("PYTHONPATH", "")])
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
                    f"\n--- stderr\n{result.stderr[-4000:]}")
    return result


def reports(output: str, tag: str = "REPORT") -> list[dict]:
    """JSON objects that ranks printed as `TAG {...}` lines, sorted by rank."""
    # Launchers may prefix each line ("[1,0]<stdout>:", "[0]<stdout>:"); the tag finds the JSON.
    decoder = json.JSONDecoder()
    found = [decoder.raw_decode(output, match.end())[0] for match in re.finditer(rf"{tag} (?=\{{)", output)]
    return sorted(found, key=lambda r: r.get("rank", 0))


def tool(name: str) -> str:
    return os.path.join(os.path.dirname(sys.executable), name)
