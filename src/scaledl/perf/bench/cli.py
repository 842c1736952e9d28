"""`scaledl bench <suite>`: run benchmark suites, print their tables, write JSON and plots."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

SUITE_NAMES = ("overhead", "scaling", "comm", "memory", "input", "metrics", "synthetic")
# Run by name only, not by `all`: each launches a job or two per setting (a few minutes with --quick).
NAMED_ONLY = ("predict", "layouts")


def _path(text: str) -> Path:
    """Path("") is ".", so an unset variable would write into the working directory: refuse it."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (an unset variable?): name a path")
    return Path(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", choices=[*SUITE_NAMES, *NAMED_ONLY, "all"],
                        help=f"which suite to run (all: every one but {', '.join(NAMED_ONLY)})")
    parser.add_argument("--quick", action="store_true",
                        help="fewer steps, sizes and rounds (a check, not a measurement)")
    parser.add_argument("--out-dir", type=_path, default=Path("runs/bench"), help="JSON, plots and logs go here")
    parser.add_argument("--markdown", type=_path,
                        help="also render the results as markdown here (e.g. docs/benchmarks.md)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process, the same for every variant")
    parser.add_argument("--micro-batch-size", type=int, default=32, help="batch per rank")
    parser.add_argument("-n", "--nproc", type=int, help="ranks for multi-rank suites (default: local devices, or 2)")
    parser.add_argument("--predict-params", type=float, default=7.5e9,
                        help="memory suite: parameter count for the predictor table")
    parser.add_argument("--predict-world-size", type=int, default=64,
                        help="memory suite: ranks for the predictor table")


def run(args) -> int:
    from scaledl.perf.bench import runner
    from scaledl.perf.bench.common import Options

    from scaledl.output_paths import OutputPathError, check_dir, check_file

    for name in ("threads", "micro_batch_size", "nproc", "predict_world_size", "predict_params"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"scaledl bench: error: argument --{name.replace('_', '-')}: must be at least 1", file=sys.stderr)
            return 2
    try:  # before any suite runs: a path that cannot be written would lose the whole measurement
        check_dir(args.out_dir, "--out-dir")
        if args.markdown is not None:
            check_file(args.markdown, "--markdown")
    except OutputPathError as error:
        print(f"scaledl bench: error: {error}", file=sys.stderr)
        return 2
    options = Options(out_dir=args.out_dir, quick=args.quick, threads=args.threads,
                      micro_batch_size=args.micro_batch_size, nproc=args.nproc,
                      predict_params=int(args.predict_params), predict_world_size=args.predict_world_size)
    names = list(SUITE_NAMES) if args.suite == "all" else [args.suite]
    report = runner.run(names, options, command_line(args), args.markdown)
    return 1 if any("error" in data for data in report["suites"].values()) else 0


def command_line(args) -> str:
    """The command that reproduces this run (it heads the markdown page)."""
    parts = ["scaledl bench", args.suite] + (["--quick"] if args.quick else [])
    defaults = {"out_dir": Path("runs/bench"), "threads": 1, "micro_batch_size": 32, "nproc": None,
                "predict_params": 7.5e9, "predict_world_size": 64, "markdown": None}
    for name, default in defaults.items():
        value = getattr(args, name)
        if value != default:
            shown = f"{value:g}" if isinstance(value, float) else value
            parts.append(f"--{name.replace('_', '-')} {shown}")
    return " ".join(parts)
