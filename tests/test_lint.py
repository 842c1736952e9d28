"""The package, the tests and the tools pass the linter configured in pyproject.toml."""
import os
import subprocess
import sys

from conftest import ROOT


def test_ruff_finds_nothing():
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    result = subprocess.run([ruff, "check", "--no-cache", "src", "tests", "tools"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_would_catch_a_long_line(tmp_path):
    """The configuration is the one in pyproject.toml, and it does flag what it should."""
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    (tmp_path / "long.py").write_text("x = " + "1 + " * 40 + "1\n")
    result = subprocess.run([ruff, "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
                             str(tmp_path / "long.py")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "E501" in result.stdout
