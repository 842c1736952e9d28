"""The README's own training script runs as printed, under mpiexec and under torchrun."""
import re

import pytest

from conftest import ROOT, run, tool


def readme_script() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- my_train.py -->\s*```python\n(.*?)```", text, re.S)
    assert match, "README lost its my_train.py block"
    return match.group(1)


def test_the_script_is_about_twenty_lines():
    assert len(readme_script().strip().splitlines()) <= 25


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_readme_script_trains_under_each_launcher(tmp_path, launcher):
    script = tmp_path / "my_train.py"
    script.write_text(readme_script())
    args = [str(script), "--epochs", "1", "--out-dir", str(tmp_path / "out")]
    command = (["mpiexec", "-n", "2", "python"] if launcher == "mpiexec"
               else [tool("torchrun"), "--standalone", "--nproc_per_node=2"]) + args
    output = run(command, timeout=300).stdout
    accuracy = float(re.search(r"epoch 0 test accuracy (\d\.\d+)", output).group(1))
    assert accuracy > 0.9
    assert output.count("test accuracy") == 1  # only the main rank logs


# Setup facts live once: the README's blocks and its Setup times table; lesson 0 repeats the blocks
# word for word and quotes the table, and the job scripts and tools/setup_site.sh use the same
# modules and the same .venv.

def lesson_0_text() -> str:
    import json

    cells = json.loads((ROOT / "notebooks" / "00_setup.ipynb").read_text())["cells"]
    return "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")


def marked_block(text: str, marker: str) -> str:
    match = re.search(rf"<!-- {marker} -->\s*```bash\n(.*?)```", text, re.S)
    assert match, f"no {marker} block"
    return "\n".join(line.strip() for line in match.group(1).strip().splitlines())


@pytest.mark.parametrize("system", ["polaris", "aurora"])
def test_lesson_0_and_the_readme_give_the_same_setup(system):
    from scaledl.hpc.jobs import SETUP

    block = marked_block((ROOT / "README.md").read_text(), f"setup:{system}")
    assert marked_block(lesson_0_text(), f"setup:{system}") == block
    assert f"make setup SYSTEM={system}" in block and "source .venv/bin/activate" in block
    # The job scripts source the same .venv, after loading the same modules.
    assert "SCALEDL_VENV=${SCALEDL_VENV:-$PWD/.venv}\n" in (ROOT / "jobs" / system / "ddp.sh").read_text()
    job_modules = [line.strip() for line in SETUP[system].splitlines() if line.strip().startswith(("module", "conda"))]
    site = re.search(rf"^\s*{system}\) modules=\((.*?)\) ;;", (ROOT / "tools" / "setup_site.sh").read_text(), re.M)
    assert job_modules and re.findall(r'"([^"]+)"', site.group(1)) == job_modules
    assert all(command in block for command in job_modules), (job_modules, block)


def test_setup_times_come_from_the_readmes_table():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- setup-times -->", 1)[1].split("<!-- /setup-times -->", 1)[0]
    measured = set(re.findall(r"(\d+(?:\.\d+)?) min", table))
    quoted = re.findall(r"(\d+(?:\.\d+)?) min", lesson_0_text())
    assert measured and quoted and set(quoted) <= measured, (quoted, measured)
    # make setup's own progress lines say how long its builds take: the table's numbers too.
    said = re.findall(r"about (\d+(?:\.\d+)?) min", (ROOT / "tools" / "setup.sh").read_text())
    assert said and set(said) <= measured, (said, measured)
    outside = readme.replace(table, "")
    assert not re.search(r"setup\b[^.]*\b\d+(?:\.\d+)? min", outside.split("### Setup times")[0]), \
        "a setup time outside the table"


def test_lesson_0_knows_one_environment_and_where_horovod_comes_from():
    lesson = lesson_0_text()
    assert "~/venvs" not in lesson and ".venv" in lesson
    for text in (lesson, (ROOT / "README.md").read_text()):
        assert "HOROVOD=1" in text and "no longer" in text
