"""The `scaledl` command: thin subcommands over the package (`demo` lives here, the others in their rooms).

May import anything in scaledl: it is the top floor, and nothing imports it.
"""
from __future__ import annotations

import importlib

from scaledl.config import OneLineParser
from scaledl.errors import UserError

# Subcommands that live in their own module: name -> (module, help). Each module has
# `add_arguments(parser)` and `run(args) -> int`, and imports its heavy dependencies
# (torch, TensorFlow) inside functions so that `scaledl --help` stays fast.
COMMANDS: dict[str, tuple[str, str]] = {
    "launch": ("scaledl.hpc.launch", "start N ranks with the launcher this machine needs (torchrun, mpiexec, srun)"),
    "jobs": ("scaledl.hpc.jobs", "write PBS (Polaris, Aurora) and Slurm job scripts"),
    "doctor": ("scaledl.hpc.doctor", "report what this machine has and what will go wrong"),
    "predict": ("scaledl.perf.predict_cli", "predict step time and scaling efficiency at N ranks from a measured step"),
    "bench": ("scaledl.perf.bench.cli",
              "benchmarks: overhead, scaling, communication, memory, input, metrics, synthetic"),
    "class": ("scaledl.cli.class_command",
              "a workshop's class in one shared directory: its curve, every learner's checks"),
}


def main(argv=None) -> int:
    parser = OneLineParser(prog="scaledl", description="Scale deep-learning training from one device to many.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run every rung of the ladder on the embedded MNIST")
    demo.add_argument("--out-dir", default="runs/demo")
    demo.add_argument("--rungs", nargs="+", help="only these rungs (default: all)")
    demo.add_argument("-n", "--nproc", type=int, help="processes per multi-process rung (default: devices, or 2)")
    demo.add_argument("--overwrite", action="store_true", help="replace the demo already in --out-dir")
    exercises = commands.add_parser("exercises", help="generate exercises/ from solutions/")
    exercises.add_argument("--solutions", default="solutions")
    exercises.add_argument("--out", default="exercises")
    exercises.add_argument("--check", action="store_true", help="only report exercises that are out of date")
    for name, (module, help_text) in COMMANDS.items():
        importlib.import_module(module).add_arguments(commands.add_parser(name, help=help_text))
    args, rest = parser.parse_known_args(argv)
    if args.command in COMMANDS:
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return importlib.import_module(COMMANDS[args.command][0]).run(args)
    if args.command != "demo" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "exercises":
        from scaledl.workshop.exercises import MarkerError, generate
        from scaledl.output_paths import OutputPathError, check_dir

        from pathlib import Path

        try:
            if not Path(args.solutions).is_dir() or not any(Path(args.solutions).glob("*.ipynb")):
                what = "is not a folder" if not Path(args.solutions).is_dir() else "holds no notebook (*.ipynb)"
                raise OutputPathError(f"--solutions {args.solutions} {what}: name the folder of the lessons' "
                                      "solutions (solutions/ in the repository)")
            if not args.check:
                check_dir(args.out, "--out")
            changed = generate(args.solutions, args.out, args.check)
        except (MarkerError, OutputPathError) as error:
            parser.error(str(error))
        for path in changed:
            print(f"{'out of date' if args.check else 'wrote'}: {path}")
        return 1 if args.check and changed else 0
    if args.command == "demo":
        from scaledl.cli import demo as demo_lib
        from scaledl.ladder import RUNGS

        unknown = sorted(set(args.rungs or []) - set(RUNGS))
        if unknown:
            parser.error(f"argument --rungs: unknown rung {', '.join(unknown)} (choose from {', '.join(RUNGS)})")
        try:
            rows = demo_lib.main(args.out_dir, args.rungs, args.nproc, rest, overwrite=args.overwrite)
        except UserError as error:
            parser.exit(2, f"scaledl demo: error: {error}\n")
        return 0 if all(row["ok"] for row in rows) else 1
    return 2

