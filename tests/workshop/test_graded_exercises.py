"""Every grader check says FAIL, or NOT ATTEMPTED YET for a name never set, on the untouched exercise
(nbval checks it says PASS on the solution: those cells' stored outputs are the solution's verdicts)."""

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT
from scaledl.hpc import launchers

CHECK_TAG = "nbval-check-output"
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


def is_check(cell) -> bool:
    return cell.cell_type == "code" and CHECK_TAG in cell.metadata.get("tags", [])


# Cells before the last check that only measure or draw, which no check reads: minutes of runs (lesson 7's link
# fit and its second sweep, lesson 10's accumulated runs) that cannot change what an untouched exercise's checks
# say.  A check that came to read one would stop with a NameError instead of FAIL, and the test would fail.
MEASUREMENTS = {"07_scaling": ("from scaledl.perf.bench.common import Options\nfrom scaledl.perf.bench.prediction",
                               "large = show_sweep("),
                "10_memory": ('launch = [str(Path(sys.executable).with_name("scaledl"))',)}


def through_last_check(notebook, stem: str = ""):
    """The cells up to the last check but the measurements above, and the ones after it that stop the
    ranks: what follows (launching a rung) does not depend on the exercise."""
    last = max(i for i, cell in enumerate(notebook.cells) if is_check(cell))
    starts = MEASUREMENTS.get(stem, ())
    left_out = [cell for cell in notebook.cells[:last] if cell.cell_type == "code" and cell.source.startswith(starts)]
    assert len(left_out) == len(starts), (stem, "a measurement cell moved: update MEASUREMENTS")
    notebook.cells = [cell for cell in notebook.cells[:last + 1] if cell not in left_out] + [
        cell for cell in notebook.cells[last + 1:] if "stop_cluster_sync" in cell.source]
    return notebook


def verdicts(cell) -> str:
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")


def test_every_solution_has_a_check_and_a_parameters_cell():
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        assert any(is_check(cell) for cell in notebook.cells), path.name
        assert any("parameters" in cell.metadata.get("tags", []) for cell in notebook.cells), path.name
        for cell in filter(is_check, notebook.cells):
            assert verdicts(cell).startswith("PASS: "), (path.name, cell.source)


@pytest.mark.slow
@pytest.mark.parametrize("path", EXERCISES, ids=[path.stem for path in EXERCISES])
def test_untouched_exercise_fails_its_checks(path, monkeypatch):
    for name, value in launchers.local_env(2).items():
        monkeypatch.setenv(name, value)
    notebook = through_last_check(nbformat.read(path, as_version=4), path.stem)
    # allow_errors: the exercise cells raise NotImplementedError, as a learner's first run does.
    NotebookClient(notebook, timeout=300, allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    checks = [cell for cell in notebook.cells if is_check(cell)]
    assert checks
    for cell in checks:
        text = verdicts(cell)
        assert ("FAIL: " in text or "NOT ATTEMPTED YET: " in text) and "PASS: " not in text, (cell.source, text,
                                                                                          cell.outputs)
    # Each exercise fails where it stands: the cell holding the blank is the one that raises.
    for cell in notebook.cells:
        if cell.cell_type == "code" and "raise NotImplementedError" in cell.source:
            assert "NotImplementedError" in str(cell.get("outputs", [])), (path.name, cell.source)


LESSONS = sorted((ROOT / "solutions").glob("*.ipynb")) + sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem)
def test_papermill_overrides_the_parameters_cell(path, tmp_path):
    import papermill

    notebook = nbformat.read(path, as_version=4)
    params_cell = next(cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", []))
    name = params_cell.source.split("=")[0].strip()
    out = tmp_path / path.name
    papermill.execute_notebook(str(path), str(out), parameters={name: 4}, prepare_only=True, progress_bar=False)
    cells = nbformat.read(out, as_version=4).cells
    injected = next(i for i, cell in enumerate(cells) if "injected-parameters" in cell.metadata.get("tags", []))
    assert f"{name} = 4" in cells[injected].source
    assert "parameters" in cells[injected - 1].metadata.get("tags", [])  # right after the defaults


def test_lesson_0_binding_exercises_pass_with_the_right_answers():
    """The two binding checks of lesson 0's appendix, run in the notebook itself, top to bottom,
    with the answers filled in (its stored cells hold None, for the learner to fill in): every
    check says PASS, the four ranks keep 16 CPUs each next to their GPUs, and the launch is drawn.
    The appendix starts no live ranks."""
    notebook = nbformat.read(ROOT / "notebooks" / "00_appendix_placement.ipynb", as_version=4)
    answers = {"VERDICTS = ": 'VERDICTS = {0: "split", 1: "far", 2: "far", 3: "split"}\n',
               "CPU_BIND = ": 'CPU_BIND = "list:0-7,32-39:8-15,40-47:16-23,48-55:24-31,56-63"\n'}
    assert not any("engines.start" in cell.source for cell in notebook.cells if cell.cell_type == "code")
    filled = []
    for cell in notebook.cells:
        for prefix, answer in answers.items():
            if cell.cell_type == "code" and cell.source.startswith(prefix):
                cell.source, filled = answer, filled + [prefix]
    assert sorted(filled) == sorted(answers)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    lines = [line for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
             if output.output_type == "stream" for line in output.text.splitlines()]
    verdicts = [line for line in lines if line.startswith(("PASS", "FAIL"))]
    assert len(verdicts) == 2 and all(line.startswith("PASS") for line in verdicts), verdicts
    assert "mpiexec -n 4 --ppn 4 --depth 16 --cpu-bind list:0-7,32-39:8-15,40-47" in "\n".join(lines)
    assert "OMP_NUM_THREADS=16" in "\n".join(lines)
    assert sum("image/png" in output.get("data", {}) for cell in notebook.cells if cell.cell_type == "code"
               for output in cell.outputs) == 3  # the node, the launch, Aurora's two launches
