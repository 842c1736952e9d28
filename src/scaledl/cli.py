"""The `scaledl` command: thin subcommands over the package."""
from __future__ import annotations

import argparse
import sys

from scaledl.config import _OneLineParser


def main(argv=None) -> int:
    parser = _OneLineParser(prog="scaledl", description="Scale deep-learning training from one device to many.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run every rung of the ladder on the embedded MNIST")
    demo.add_argument("--out-dir", default="runs/demo")
    demo.add_argument("--rungs", nargs="+", help="only these rungs (default: all)")
    demo.add_argument("-n", "--nproc", type=int, help="processes per multi-process rung (default: devices, or 2)")
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from scaledl import demo as demo_lib
        from scaledl.ladder import RUNGS

        unknown = sorted(set(args.rungs or []) - set(RUNGS))
        if unknown:
            parser.error(f"argument --rungs: unknown rung {', '.join(unknown)} (choose from {', '.join(RUNGS)})")
        rows = demo_lib.main(args.out_dir, args.rungs, args.nproc, rest)
        return 0 if all(row["ok"] for row in rows) else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
