"""The exact pins `make setup` installs, per extra of pyproject.toml; or a site's installed versions.

pyproject.toml names each extra's packages with the ranges the code works with; constraints.txt
holds the one exact version of each that `make setup` and environment.yml install.

  python tools/pins.py EXTRA [EXTRA ...]   exact pins of those extras' packages ("core" = dependencies)
  python tools/pins.py --pin NAME          the exact pin of one package (name==version)
  python tools/pins.py --site              name==version of every distribution this python sees: the
                                           constraints that keep a site module's packages as they are

--site and --pin run under a site module's python (3.10 on Aurora, without tomllib): they need only
the standard library.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def name_of(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def constraints() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = [line.split("#")[0].strip() for line in lines]
    return {name_of(pin): pin for pin in pins if pin}


def extra_pins(extra: str) -> list[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] if extra == "core" else project["optional-dependencies"][extra]
    exact = constraints()
    missing = [r for r in requirements if name_of(r) not in exact]
    if missing:
        sys.exit(f"error: constraints.txt has no pin for {', '.join(missing)}: add one")
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


if __name__ == "__main__":
    if sys.argv[1:] == ["--site"]:
        print("\n".join(site_pins()))
    elif sys.argv[1:2] == ["--pin"]:
        print(constraints()[name_of(sys.argv[2])])
    else:
        for extra in sys.argv[1:]:
            print("\n".join(extra_pins(extra)))
