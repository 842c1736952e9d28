"""Generate exercise notebooks from solution notebooks (`make exercises`).

In `solutions/`, each answer sits between marker lines, as nbgrader and otter do:

    # BEGIN SOLUTION hint: pass the GLOBAL rank to the sampler
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    # END SOLUTION

In the generated `exercises/` copy the block becomes a TODO with the hint and
`raise NotImplementedError`, and all outputs are cleared.  Markdown cells tagged `answers`
(the answers to a lesson's closing questions) stay in the solution only.  Exercises are never
edited by hand: a test regenerates them and compares with what is committed.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION(?:\s+hint:\s*(?P<hint>.*))?$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
ANSWERS_TAG = "answers"


class MarkerError(ValueError):
    """Unbalanced BEGIN/END SOLUTION markers; the message names the notebook and cell."""


def strip_solutions(source: str, where: str = "cell") -> str:
    out, inside = [], False
    for line in source.split("\n"):
        begin = BEGIN.match(line)
        if begin:
            if inside:
                raise MarkerError(f"{where}: BEGIN SOLUTION inside another solution block")
            inside = True
            indent, hint = begin.group("indent"), (begin.group("hint") or "").strip()
            out.append(f"{indent}# TODO: {hint}" if hint else f"{indent}# TODO: your code here")
            out.append(f'{indent}raise NotImplementedError("exercise: {hint or "fill in this block"}")')
        elif END.match(line):
            if not inside:
                raise MarkerError(f"{where}: END SOLUTION without BEGIN SOLUTION")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise MarkerError(f"{where}: BEGIN SOLUTION without END SOLUTION")
    return "\n".join(out)


def exercise_notebook(notebook: dict, where: str) -> dict:
    notebook = json.loads(json.dumps(notebook))  # a deep copy
    notebook["cells"] = [cell for cell in notebook["cells"]
                         if ANSWERS_TAG not in cell.get("metadata", {}).get("tags", [])]
    for index, cell in enumerate(notebook["cells"]):
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "code":
            source = strip_solutions(source, f"{where} cell {index}")
            cell["outputs"], cell["execution_count"] = [], None
        cell["source"] = source.splitlines(keepends=True)
    return notebook


def render(notebook: dict) -> str:
    return json.dumps(notebook, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def generate(solutions: Path, exercises: Path, check: bool = False) -> list[Path]:
    """Write (or, with check, compare) every exercise; return the files that differ/were written."""
    changed = []
    for solution in sorted(Path(solutions).glob("*.ipynb")):
        target = Path(exercises) / solution.name
        text = render(exercise_notebook(json.loads(solution.read_text()), solution.name))
        if not target.exists() or target.read_text() != text:
            changed.append(target)
            if not check:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
    return changed
