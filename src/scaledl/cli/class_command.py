"""`scaledl class`: one shared directory is a workshop's class.

    scaledl class init /eagle/PROJ/class --name atpesc26          # the instructor, once
    scaledl class assign /eagle/PROJ/class --nodes 1 2 4 8 16 32 64
    scaledl class join /eagle/PROJ/class                          # a learner: the export line and their point
    scaledl class report /eagle/PROJ/class                        # the curves, the verdicts: report/index.html
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from scaledl import class_records
from scaledl.errors import UserError

SYSTEMS = ("polaris", "aurora", "slurm", "local")

README = """# Class {name}

This directory is the class: every learner who sets `SCALEDL_CLASS_DIR={folder}` (or runs
`class_records.join("{folder}")` in a notebook) leaves here one line per check they run
(`verdicts/<learner>.jsonl`) and one file per training run (`runs/`).  Nothing else is needed: no
server, no database.

- Let the class write here: the learners need write access to `verdicts/` and `runs/`, for example
  `chgrp -R <your project's group> {folder} && chmod -R g+rwX {folder}` (the folders are set-group-ID,
  so new files keep the group).
- Learners are {names}.
- Give each learner a node count, so that together the class measures the whole curve:
  `scaledl class assign {folder} --nodes 1 2 4 8 16 32 64` (round-robin over the learners seen so
  far, or over the user names in `--users FILE`, in order; a learner who joins later gets a count
  from their pseudonym).  Each learner then sees their count and the command to submit with
  `scaledl class join {folder}` or in lesson 7.
- See the class: `scaledl class report {folder}` prints the points, who disagrees with the rest and
  each learner's verdicts, and writes `report/scaling.png` and `report/index.html` (open it from
  the file system).  `notebooks/class_report.ipynb` shows the same and refreshes.
- A file the report cannot trust (torn, foreign, hand-edited, of another class) is skipped with one
  line naming it; nothing else in the directory is touched.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "A workshop's class in one shared directory: its scaling curve and every learner's checks."
    actions = parser.add_subparsers(dest="action", required=True)
    init = actions.add_parser("init", help="make DIR a class (the instructor, once)")
    init.add_argument("dir")
    init.add_argument("--name", help="the class's name (default: the directory's)")
    init.add_argument("--system", choices=SYSTEMS, default="polaris",
                      help="where the class runs (the predictor's preset)")
    init.add_argument("--real-names", action="store_true", help="show user names instead of pseudonyms")
    assign = actions.add_parser("assign", help="give each learner a node count")
    assign.add_argument("dir")
    assign.add_argument("--nodes", type=int, nargs="+", required=True, help="the node counts to spread over the class")
    assign.add_argument("--users", type=Path, help="a file of user names, one a line: assigned in this order")
    assign.add_argument("--rung", default="ddp", help="the rung each learner runs (default: ddp)")
    assign.add_argument("--run-flags", default="--epochs 3", help="the rung's flags (SCALEDL_RUN_FLAGS)")
    join = actions.add_parser("join", help="a learner: how to join, and the point to run")
    join.add_argument("dir")
    join.add_argument("--system", choices=SYSTEMS, help="where you run (default: the class's)")
    report = actions.add_parser("report", help="print the class's curves and verdicts; write report/")
    report.add_argument("dir")
    report.add_argument("--system", choices=SYSTEMS, help="the predictor's preset (default: the class's)")
    report.add_argument("--out", help="where to write scaling.png and index.html (default: DIR/report)")


def _init(args) -> int:
    from scaledl.output_paths import check_dir

    folder = check_dir(args.dir, "DIR")
    if (folder / class_records.CLASS_FILE).exists():
        raise class_records.ClassError(f"{folder} already holds a class ({class_records.CLASS_FILE}): one class per "
                                       "directory; choose an empty one")
    klass = class_records.new_class(args.name or folder.resolve().name or "class", args.real_names, args.system)
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for part in (class_records.VERDICTS, class_records.RUNS):
            (folder / part).mkdir(exist_ok=True)
            os.chmod(folder / part, 0o2775)  # set-group-ID: the class's files keep the directory's group
        (folder / "README.md").write_text(README.format(
            name=klass["name"], folder=folder.resolve(),
            names="shown by their user names" if args.real_names else
            "pseudonyms (a hash of the user name with this class's salt); --real-names shows user names"))
        partial = folder / f".{class_records.CLASS_FILE}.partial"
        partial.write_text(json.dumps(klass, indent=1) + "\n")
        os.replace(partial, folder / class_records.CLASS_FILE)  # last: a directory with class.json is whole
    except OSError:
        if made:  # nothing a failed command writes outlives it
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
        raise
    print(f"class {klass['name']} in {folder}: learners `export {class_records.ENV}={folder.resolve()}`; "
          f"see {folder / 'README.md'}")
    return 0


def _users(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    try:
        users = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    except (OSError, UnicodeDecodeError) as error:
        raise class_records.ClassError(f"--users {path}: cannot be read ({error})") from None
    if not users:
        raise class_records.ClassError(f"--users {path} names nobody: one user name a line")
    return users


def run(args: argparse.Namespace) -> int:
    from scaledl.workshop import class_report, classroom

    try:
        if args.action == "init":
            return _init(args)
        folder = Path(args.dir).expanduser()
        klass = class_records.read_class(folder)
        if args.action == "assign":
            plan = classroom.assign(folder, args.nodes, _users(args.users), args.rung, args.run_flags)
            for name, nodes in plan["by_learner"].items():
                print(f"{name}: {nodes} node{'s' * (nodes > 1)}")
            print(f"{len(plan['by_learner'])} learners assigned; later ones get one of {plan['nodes']} by pseudonym")
            return 0
        if args.action == "join":
            print(f"export {class_records.ENV}={folder.resolve()}   # you are {class_records.learner(klass)}")
            part = class_records.assignment(folder)
            if part:
                print(f"your point: {part['nodes']} node{'s' * (part['nodes'] > 1)} of {part['rung']}; submit:\n  "
                      + classroom.submit_command(part, args.system or klass.get("system", "polaris"), folder.resolve()))
            else:
                print("no node count assigned yet: your instructor runs `scaledl class assign`")
            return 0
        report = class_report.build(folder, args.system)
        png, page = class_report.write(report, args.out or folder / "report")
        print(report.text)
        print(f"wrote {png} and {page}")
        return 0
    except UserError as error:
        print(f"scaledl class: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        from scaledl.output_paths import describe_os_error

        print(f"scaledl class: error: {describe_os_error(error, getattr(error, 'filename', None) or args.dir)}",
              file=sys.stderr)
        return 2
