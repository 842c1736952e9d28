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
