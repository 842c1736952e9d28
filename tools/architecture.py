"""Draw the package's layout from its own imports, and refuse a circle or an upward arrow.

    python tools/architecture.py            # rewrite docs/architecture.md
    python tools/architecture.py --check    # exit 1 if the file is stale, a circle or an upward arrow exists

Every `import scaledl...` and `from scaledl... import ...` counts, at module level or inside a
function: an import deferred to call time is still a dependency.  The rooms, lowest first, are
ROOMS below; a module may import from its own room and the rooms beneath it.
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
OUT = ROOT / "docs" / "architecture.md"
# (room, what it is for), lowest floor first: imports may only point down this list or stay in a room.
ROOMS = [
    ("scaledl", "the helpers a training script imports"),
    ("scaledl.ladder", "the rungs, and the harness beneath them"),
    ("scaledl.hpc", "launch and site tooling"),
    ("scaledl.perf", "prediction and benchmarks"),
    ("scaledl.workshop", "the lessons' machinery"),
    ("scaledl.cli", "the `scaledl` command"),
]


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / "scaledl").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if parts[-1] != "__main__":
            found[name] = path
    return found


def room_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and ".".join(parts[:2]) in dict(ROOMS) else "scaledl"


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the scaledl modules it imports (a name imported from a package counts as its module
    when it is one, else as the package)."""
    edges = defaultdict(set)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                if base == "scaledl" or base.startswith("scaledl."):
                    for alias in node.names:
                        full = f"{base}.{alias.name}"
                        edges[name].add(full if full in mods else base)
            elif isinstance(node, ast.Import):
                edges[name].update(a.name for a in node.names if a.name.split(".")[0] == "scaledl")
        edges[name].discard(name)
        # `import scaledl.ladder` names the package itself: drop the parents a submodule implies.
        edges[name] = {target for target in edges[name] if not name.startswith(target + ".")}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan's algorithm)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def missing(mods: dict[str, Path], edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, name) pairs where the name is no module of the package (a module that moved)."""
    return [(source, target) for source, targets in sorted(edges.items()) for target in sorted(targets)
            if target not in mods]


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module's room is above the importer's."""
    floor = {room: i for i, (room, _) in enumerate(ROOMS)}
    return sorted((source, target) for source, targets in edges.items() for target in targets
                  if floor[room_of(target)] > floor[room_of(source)])


def first_paragraph(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def render(mods: dict[str, Path], edges: dict[str, set[str]]) -> str:
    by_room = defaultdict(list)
    for name in mods:
        by_room[room_of(name)].append(name)
    arrows = defaultdict(int)
    for source, targets in edges.items():
        for target in targets:
            if room_of(source) != room_of(target):
                arrows[(room_of(source), room_of(target))] += 1
    out = ["# The layout of the package", "",
           "Drawn from the code's own imports by `tools/architecture.py` (`make architecture` rewrites it;",
           "tests/test_architecture.py fails when it is stale, when two modules import each other through any",
           "chain, or when a module imports from a room above its own). Every import counts, the ones deferred",
           "into a function too.", "",
           "Rooms, lowest first; an arrow is \"imports from\", labelled with the number of module-to-module imports.",
           "", "```mermaid", "flowchart BT"]
    for i, (room, what) in enumerate(ROOMS):
        out.append(f'    r{i}["{room}<br/>{what}<br/>{len(by_room[room])} modules"]')
    ids = {room: f"r{i}" for i, (room, _) in enumerate(ROOMS)}
    for (source, target), count in sorted(arrows.items(), key=lambda kv: (ids[kv[0][0]], ids[kv[0][1]])):
        out.append(f"    {ids[source]} -->|{count}| {ids[target]}")
    out += ["```", "", f"Circles: {len(circles(edges))}. Upward arrows: {len(upward(edges))}.", ""]
    for room, what in ROOMS:
        names = sorted(by_room[room])
        package = mods[room]
        out += [f"## `{room}`: {what}", "", first_paragraph(package), ""]
        out += ["| module | imports from scaledl | what it is |", "| --- | --- | --- |"]
        for name in names:
            if name == room:
                continue
            targets = ", ".join(sorted(t.removeprefix("scaledl.") for t in edges.get(name, ()))) or "-"
            out.append(f"| `{name}` | {targets} | {first_paragraph(mods[name])} |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; write nothing")
    args = parser.parse_args(argv)
    mods = modules()
    edges = imports(mods)
    problems = [f"missing: {source} imports {target}, which is no module of the package"
                for source, target in missing(mods, edges)]
    problems += [f"circle: {' <-> '.join(group)}" for group in circles(edges)]
    problems += [f"upward: {source} imports {target} ({room_of(source)} is below {room_of(target)})"
                 for source, target in upward(edges)]
    text = render(mods, edges)
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            problems.append(f"{OUT.relative_to(ROOT)} is stale: run python tools/architecture.py")
    else:
        OUT.write_text(text)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
