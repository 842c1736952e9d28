"""What a learner reads in a committed notebook is the lesson's output, not noise: no stderr
(warnings, library log lines, link errors) in any stored output, unless the cell is tagged
`show-stderr` because the stderr is the point; and a number one lesson quotes from another's stored
output is the one that lesson stores."""
import re

import nbformat
import pytest

from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "solutions").glob("*.ipynb")) + sorted((ROOT / "notebooks").glob("*.ipynb"))
TAG = "show-stderr"


def stderr_of(output) -> str:
    """The stderr text an output holds: a kernel's stderr stream, or a live rank's `[stderr:N]`
    block (ipyparallel shows each engine's stderr as display data of that name)."""
    if output.get("output_type") == "stream":
        return output.get("text", "") if output.get("name") == "stderr" else ""
    text = output.get("data", {}).get("text/plain", "")
    text = "".join(text) if isinstance(text, list) else text
    return text if text.startswith("[stderr:") else ""


def untagged_stderr(path) -> list[str]:
    found = []
    for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type != "code" or TAG in cell.metadata.get("tags", []):
            continue
        for output in cell.get("outputs", []):
            text = stderr_of(output)
            if text.strip():
                found.append(f"{path.name} cell {index}: {text.strip().splitlines()[0][:160]}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_no_stray_stderr_in_stored_outputs(path):
    assert not untagged_stderr(path), "\n".join(untagged_stderr(path))


def test_stderr_is_found_in_both_forms_and_a_tag_lets_it_show(tmp_path):
    notebook = nbformat.v4.new_notebook()
    warning = nbformat.v4.new_output("stream", name="stderr", text="FutureWarning: deprecated\n")
    rank = nbformat.v4.new_output("display_data", data={"text/plain": "[stderr:1] /usr/bin/ld: cannot find -laio"})
    quiet = nbformat.v4.new_output("stream", name="stdout", text="rank 0 of 2\n")
    notebook.cells = [nbformat.v4.new_code_cell("a", outputs=[warning]), nbformat.v4.new_code_cell("b", outputs=[rank]),
                      nbformat.v4.new_code_cell("c", outputs=[quiet])]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(notebook, path)
    assert [line.split(":", 1)[0] for line in untagged_stderr(path)] == ["lesson.ipynb cell 0", "lesson.ipynb cell 1"]
    notebook.cells[0].metadata["tags"] = [TAG]
    notebook.cells[1].metadata["tags"] = [TAG]
    nbformat.write(notebook, path)
    assert untagged_stderr(path) == []


def stored_text(path) -> str:
    """Every stored text output of a notebook, stream and plain-text display alike."""
    texts = []
    for cell in nbformat.read(path, as_version=4).cells:
        for output in cell.get("outputs", []):
            text = output.get("text", "") or output.get("data", {}).get("text/plain", "")
            texts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(texts)


def test_lesson_7_quotes_the_fit_lesson_3_stores():
    """Lesson 7 prints its alpha in a step beside lesson 3's alpha, read from lesson 3's stored output when it
    runs: a lesson 3 re-executed after lesson 7 leaves two different fits on the path for one run."""
    fit = re.search(r"measured here: alpha (\d+) us, beta ([\d.]+) GB/s", stored_text(ROOT / "solutions" /
                                                                                       "03_collectives.ipynb"))
    assert fit, "lesson 3 stores no 'measured here: alpha .. us, beta .. GB/s' line"
    quoted = re.search(r"^lesson 3's alpha\D*?(\d+) us a ring step \(bandwidth ([\d.]+) GB/s\)",
                       stored_text(ROOT / "solutions" / "07_scaling.ipynb"), re.M)
    assert quoted, "lesson 7 stores no line for lesson 3's alpha"
    assert quoted.groups() == fit.groups(), \
        f"lesson 7 quotes alpha {quoted[1]} us, {quoted[2]} GB/s; lesson 3 stores {fit[1]} us, {fit[2]} GB/s: " \
        "re-execute lesson 7 after lesson 3"
