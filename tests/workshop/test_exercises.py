import subprocess

import pytest

from conftest import ROOT, tool
from scaledl.workshop.exercises import MarkerError, exercise_notebook, strip_solutions


def test_solution_block_becomes_a_todo_with_its_hint():
    source = "x = 1\n    # BEGIN SOLUTION hint: shard by global rank\n    y = rank\n    # END SOLUTION\nprint(y)"
    assert strip_solutions(source) == ("x = 1\n    # TODO: shard by global rank\n"
                                       '    raise NotImplementedError("exercise: shard by global rank")\nprint(y)')


@pytest.mark.parametrize("source, message", [
    ("# BEGIN SOLUTION\nx = 1", "without END"),
    ("x = 1\n# END SOLUTION", "without BEGIN"),
    ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION", "inside another"),
])
def test_unbalanced_markers_are_errors(source, message):
    with pytest.raises(MarkerError, match=message):
        strip_solutions(source)


def test_outputs_are_cleared_and_markdown_kept():
    notebook = {"cells": [{"cell_type": "markdown", "source": ["# Title\n"], "metadata": {}},
                          {"cell_type": "code", "source": ["# BEGIN SOLUTION\n", "a = 2\n", "# END SOLUTION\n"],
                           "outputs": [{"output_type": "stream", "text": "2"}], "execution_count": 3, "metadata": {}}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    exercise = exercise_notebook(notebook, "nb")
    assert exercise["cells"][0]["source"] == ["# Title\n"]
    assert exercise["cells"][1]["outputs"] == [] and exercise["cells"][1]["execution_count"] is None
    assert "a = 2" not in "".join(exercise["cells"][1]["source"])
    assert notebook["cells"][1]["outputs"]  # the solution itself is untouched


def test_committed_exercises_are_generated_from_the_solutions():
    result = subprocess.run([tool("scaledl"), "exercises", "--check", "--solutions", str(ROOT / "solutions"),
                             "--out", str(ROOT / "exercises")], capture_output=True, text=True)
    assert result.returncode == 0, "exercises/ is out of date: run `make exercises`\n" + result.stdout
    solutions = sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))
    assert solutions == sorted(p.name for p in (ROOT / "exercises").glob("*.ipynb"))
