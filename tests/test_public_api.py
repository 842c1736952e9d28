"""The helpers a user's own script imports, as the README lists them: each row imports in a fresh
interpreter, names what it says, and imports no framework by being imported."""
import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT

FRAMEWORKS = ("torch", "tensorflow", "horovod", "deepspeed", "mpi4py", "ipyparallel")


def rows() -> list[tuple[str, list[str]]]:
    text = (ROOT / "README.md").read_text()
    table = text.split("<!-- public-api -->", 1)[1].strip().split("\n\n", 1)[0]
    found = []
    for line in table.splitlines()[2:]:
        statement, names = line.split("|")[1:3]
        found.append((statement.strip().strip("`"), re.findall(r"`(\w+)`", names)))
    return found


def test_the_readme_lists_the_helpers():
    statements = [statement for statement, _ in rows()]
    assert statements[0] == "import scaledl" and len(statements) >= 15
    assert all(s == "import scaledl" or s.startswith("from scaledl") for s in statements)


def holder_of(statement: str) -> str:
    """The module whose attributes the row names: scaledl, scaledl.X for `from scaledl import X`, else
    the module imported from."""
    words = statement.split()
    if words[0] == "import":
        return words[1]
    return f"scaledl.{words[3]}" if words[1] == "scaledl" else words[1]


@pytest.mark.parametrize("statement, names", rows(), ids=[statement for statement, _ in rows()])
def test_each_row_imports_as_a_users_script_would(statement, names):
    source = "\n".join([
        "import importlib, json, sys",
        statement,
        f"holder = importlib.import_module({holder_of(statement)!r})",
        f"print(json.dumps([[n for n in {names!r} if not hasattr(holder, n)], "
        f"[n for n in {FRAMEWORKS!r} if n in sys.modules]]))",
    ])
    result = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{statement}: {result.stderr.strip().splitlines()[-1:]}"
    missing, loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert not missing, f"{statement}: the README names {missing}, which {holder_of(statement)} does not have"
    assert not loaded, f"{statement} imported {loaded} by itself"
