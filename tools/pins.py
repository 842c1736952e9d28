"""The exact pins `make setup` installs, per extra of pyproject.toml; or a site's installed versions.

pyproject.toml names each extra's packages with the ranges the code works with; constraints.txt
holds the exact version of each that `make setup` and environment.yml install.  A package whose
pin depends on the interpreter has one line per range of Python, each with an environment marker
(`tensorflow-cpu==2.21.0; python_version >= "3.12"`): pip's constraint files honour markers,
and the pins here are those whose marker holds for the Python that runs this script.

  python tools/pins.py EXTRA [EXTRA ...]   exact pins of those extras' packages ("core" = dependencies)
  python tools/pins.py --pin NAME          the exact pin of one package (name==version)
  python tools/pins.py --check-python     exit 2 with one line if no pin set holds for this Python
  python tools/pins.py --site              name==version of every distribution this python sees: the
                                           constraints that keep a site module's packages as they are

Everything here runs under any Python from 3.10 (a site module's, Aurora's is 3.10) with the
standard library alone, and pip's own vendored TOML parser where the standard library has none.
"""
from __future__ import annotations  # parsed by the Python being checked, from 3.7 on

import operator
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUPPORTED = ((3, 10), (3, 13))  # the Pythons every pinned package has wheels (or a building sdist) for
COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
           "!=": operator.ne}


class PinError(Exception):
    """constraints.txt or pyproject.toml says something this script cannot honour."""


def marker_holds(marker: str, python: tuple[int, int]) -> bool:
    """Whether `python_version OP "X.Y"` (joined by `and`) holds: the only markers constraints.txt uses.

    pip evaluates any PEP 508 marker; this reads only the ones written here, and refuses others,
    so that the two can never disagree silently."""
    for clause in marker.split(" and "):
        found = re.fullmatch(r"\s*python_version\s*(<=|>=|==|!=|<|>)\s*[\"']([0-9]+)\.([0-9]+)[\"']\s*", clause)
        if not found:
            raise PinError(f"constraints.txt: marker {marker!r} is not python_version OP \"X.Y\" (joined by and)")
        op, major, minor = found.groups()
        if not COMPARE[op](python, (int(major), int(minor))):
            return False
    return True


def pin_lines() -> list[tuple[str, str]]:
    """(pin, marker) for every line of constraints.txt; marker "" when the pin holds for every Python."""
    lines = []
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        text = line.split("#")[0].strip()
        if text:
            pin, _, marker = text.partition(";")
            lines.append((pin.strip(), marker.strip()))
    return lines


def name_of(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def constraints(python: tuple[int, int] | None = None) -> dict[str, str]:
    """name -> its exact pin (name==version) for `python` (default: the one running this)."""
    python = python or sys.version_info[:2]
    exact: dict[str, str] = {}
    for pin, marker in pin_lines():
        if not marker or marker_holds(marker, python):
            if name_of(pin) in exact:
                raise PinError(f"constraints.txt pins {name_of(pin)} twice for Python {python[0]}.{python[1]}: "
                               "make the markers exclusive")
            exact[name_of(pin)] = pin
    return exact


def check_python(python: tuple[int, int] | None = None) -> None:
    """One line and exit 2 when this Python is outside the range the pins were chosen (and tested) for."""
    python = python or sys.version_info[:2]
    if not SUPPORTED[0] <= python <= SUPPORTED[1]:
        low, high = (f"{v[0]}.{v[1]}" for v in SUPPORTED)
        raise PinError(f"this is Python {python[0]}.{python[1]} ({sys.executable}); the pinned stack needs "
                       f"Python {low} to {high} (TensorFlow and Horovod have no build for others): point at "
                       f"another with PYTHON=python3.{SUPPORTED[1][1]} make setup, or use conda's environment.yml")


def load_toml(text: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pip (in every venv) vendors tomli, which became tomllib
        from pip._vendor import tomli as tomllib
    return tomllib.loads(text)


def extra_pins(extra: str) -> list[str]:
    project = load_toml((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] if extra == "core" else project["optional-dependencies"][extra]
    exact = constraints()
    missing = [r for r in requirements if name_of(r) not in exact]
    if missing:
        raise PinError(f"constraints.txt has no pin for {', '.join(missing)} on this Python: add one")
    return [exact[name_of(r)] for r in requirements]


def site_pins() -> list[str]:
    from importlib import metadata

    pins = {}
    for distribution in metadata.distributions():
        name, version = distribution.metadata["Name"], distribution.version
        # Conda may record versions pip cannot parse; such a package cannot be constrained anyway.
        if name and version and re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version):
            pins.setdefault(name_of(name), f"{name_of(name)}=={version}")
    return sorted(pins.values())


def main(argv: list[str]) -> int:
    if argv == ["--site"]:
        print("\n".join(site_pins()))
    elif argv == ["--check-python"]:
        check_python()
    elif argv[:1] == ["--pin"]:
        print(constraints()[name_of(argv[1])])
    else:
        for extra in argv:
            print("\n".join(extra_pins(extra)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except PinError as error:
        sys.exit(print(f"setup: error: {error}", file=sys.stderr) or 2)
