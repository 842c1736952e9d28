"""Print the pinned requirements of pyproject.toml's extras, one per line.

The pins live in one place (pyproject.toml); the setup script and the environment.yml test
read them from there.  Usage: python tools/pins.py EXTRA [EXTRA ...]   ("core" = dependencies)
"""
import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
for extra in sys.argv[1:]:
    requirements = project["dependencies"] if extra == "core" else project["optional-dependencies"][extra]
    print("\n".join(requirements))
