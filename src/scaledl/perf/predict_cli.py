"""`scaledl predict`: predicted step time and efficiency per rank count (scaledl.perf.predict).

    scaledl predict --system polaris --step-ms 12 --model transformer --nodes 1 2 4 8 16
    scaledl predict --comm-json runs/bench/comm.json --step-json runs/bench/overhead.json --model cnn --ranks 2

The single-device step comes from --step-ms or a benchmark's JSON (`scaledl bench overhead`:
the plain loop's step; `scaledl bench predict`: its first setting's); the link from a system
preset, a `scaledl bench comm` fit (all-reduces in a loop) or a `bench predict` one (all-reduces
inside a step: what a step pays on the machine it ran on), read back to one link, or --alpha-us
with --bandwidth-gbps.  Every flag is checked before anything is written.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

from scaledl.perf import predict


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
        return value
    return parse


def _fraction(text: str) -> float:
    value = _positive(float)(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1 (backward's share of the step)")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def model_name(text: str) -> str:
    """An argparse type: the bench's models (cnn, resnet50, transformer[:W,D,H,L]) or a language model's
    size, gpt:PRESET (scaledl.models.GPT_PRESETS, counted by formula: a 2.7B model is never built)."""
    from scaledl.models import GPT_PRESETS
    from scaledl.perf.bench import variants

    if text.startswith("gpt:"):
        if text.removeprefix("gpt:") not in GPT_PRESETS:
            raise argparse.ArgumentTypeError(f"model {text!r}: write gpt:PRESET, PRESET one of "
                                             f"{', '.join(GPT_PRESETS)}")
        return text
    try:
        return variants.model_name(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{error}; or gpt:PRESET ({', '.join(GPT_PRESETS)})") from None


def model_sizes(model: str) -> dict:
    """width, depth, heads and seq_len of transformer[:...] or gpt:PRESET."""
    from scaledl.models import GPT_PRESETS
    from scaledl.perf.bench.variants import transformer_sizes

    return dict(GPT_PRESETS[model.removeprefix("gpt:")]) if model.startswith("gpt:") else transformer_sizes(model)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Predict step time and efficiency at N ranks before measuring it."
    link = parser.add_mutually_exclusive_group(required=True)
    link.add_argument("--system", choices=sorted(predict.SYSTEMS),
                      help="a system preset (scaledl.perf.predict cites its numbers)")
    link.add_argument("--comm-json", type=Path, help="a `scaledl bench comm` result (comm.json or bench.json)")
    link.add_argument("--alpha-us", type=_non_negative,
                      help="latency per ring step, microseconds (with --bandwidth-gbps)")
    parser.add_argument("--bandwidth-gbps", type=_positive(float),
                        help="link bandwidth one way, GB/s (with --alpha-us)")
    step = parser.add_mutually_exclusive_group(required=True)
    step.add_argument("--step-ms", type=_positive(float), help="measured single-device step (forward+backward+update)")
    step.add_argument("--step-json", type=Path, help="a `scaledl bench overhead` or `bench predict` result")
    parser.add_argument("--backward-fraction", type=_fraction, default=predict.BACKWARD_FRACTION,
                        help="backward's share of the step (measured by the profiler; default 2/3)")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--params", type=_positive(float), help="parameter count (1e9 for a 1B model)")
    size.add_argument("--model", type=model_name,
                      help="count the parameters of cnn, resnet50, transformer:W,D,H,L or gpt:PRESET (gpt:gpt3-2.7b)")
    parser.add_argument("--bytes-per-param", type=int, choices=(2, 4), default=4, help="gradient bytes per parameter")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--ranks", type=_positive(int), nargs="+", help="rank counts (default 1 2 4 ... 256)")
    where.add_argument("--nodes", type=_positive(int), nargs="+", help="node counts (with --system)")
    parser.add_argument("--strategy", choices=predict.STRATEGIES, nargs="+", default=["ddp", "ddp_no_overlap", "zero3"])
    parser.add_argument("--bucket-mb", type=_positive(float), default=25.0, help="DDP bucket_cap_mb")
    parser.add_argument("--fusion-mb", type=_positive(float), default=128.0, help="Horovod fusion threshold, MiB")
    parser.add_argument("--cycle-ms", type=_non_negative, default=1.0, help="Horovod cycle time, ms")
    parser.add_argument("--gathers", type=_positive(int), default=1,
                        help="ZeRO-3/FSDP2: units gathered one at a time per pass (layers or modules)")
    parser.add_argument("--micro-batches", type=_positive(int), default=8, help="pipeline micro batches per step")
    parser.add_argument("--recompute", choices=("none", "selective", "full"), default="none",
                        help="data-parallel strategies: the forward run again in backward (selective needs "
                        "--rerun-share)")
    parser.add_argument("--rerun-share", type=_fraction, help="--recompute selective: the measured share of the "
                        "forward it reruns")
    parser.add_argument("--grad-accum", type=_positive(int), default=1,
                        help="micro batches per optimizer step, reduced once (ddp, ddp_no_overlap, horovod)")
    parser.add_argument("--micro-batch-size", type=_positive(int), default=8,
                        help="tensor_parallel: sequences per step (its activations' size, with --model)")
    parser.add_argument("--plot", type=Path, help="write the efficiency figure here (.png)")
    parser.add_argument("--json", type=Path, help="write the rows here")


class InputError(ValueError):
    pass


def _read_json(path: Path, flag: str) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{flag} {path}: cannot read it ({error.strerror or error})") from None
    except json.JSONDecodeError:
        raise InputError(f"{flag} {path}: not JSON; name a file that `scaledl bench` wrote") from None


def _suite(data: dict, name: str) -> dict:
    return data.get("suites", {}).get(name, data) if isinstance(data, dict) else {}


def link_from_comm_json(path: Path) -> predict.Link:
    comm = _suite(_read_json(path, "--comm-json"), "comm")
    try:
        fit, ranks = comm["fits"]["allreduce"], int(comm["ranks"])
        # `scaledl bench predict` records whether its link could overlap backward; the comm suite does not
        found = predict.link_from_fit(fit, ranks, f"all-reduce fit in {path}",
                                      bool((comm.get("link") or {}).get("overlaps", True)))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise InputError(f"--comm-json {path}: no all-reduce fit on 2 or more ranks in it; "
                         "name the comm.json that `scaledl bench comm` wrote") from None
    if not (math.isfinite(found.bandwidth_Bps) and found.bandwidth_Bps > 0):
        raise InputError(f"--comm-json {path}: its all-reduce fit has no positive bandwidth; measure again")
    return found


def step_from_json(path: Path) -> float:
    """Seconds: the plain loop's step (overhead suite) or the first setting's (predict suite)."""
    data = _read_json(path, "--step-json")
    for name, pick in (("overhead", lambda rows: next(r["step_ms"] for r in rows if r["variant"] == "plain")),
                       ("predict", lambda rows: rows[0]["single_ms"])):
        suite = _suite(data, name)
        if isinstance(suite, dict) and suite.get("suite") == name:
            try:
                value = float(pick(suite["rows"]))
            except (KeyError, StopIteration, IndexError, TypeError, ValueError):
                break
            if math.isfinite(value) and value > 0:
                return value / 1e3
    raise InputError(f"--step-json {path}: no single-device step in it; name the overhead.json or predict.json "
                     "that `scaledl bench` wrote, or pass --step-ms")


def count_params(model: str) -> int:
    from scaledl import models

    if model.startswith("gpt:"):
        sizes = model_sizes(model)
        return models.gpt_num_params(sizes["width"], sizes["depth"], sizes["seq_len"])
    if model.startswith("transformer"):
        sizes = model_sizes(model)
        return models.transformer_num_params(sizes["width"], sizes["depth"], sizes["seq_len"])
    import torch  # noqa: F401  (cnn and resnet50 are counted by building them)

    from scaledl.perf.bench.variants import model_and_batch

    built, _, _ = model_and_batch("cpu", 1, 0, 0, model)
    return sum(p.numel() for p in built.parameters())


def resolve(args) -> dict:
    """Every input checked and read; nothing written yet."""
    from scaledl.output_paths import check_file

    if (args.alpha_us is None) != (args.bandwidth_gbps is None):
        raise InputError("--alpha-us and --bandwidth-gbps go together: give both, or --system, or --comm-json")
    if args.nodes and not args.system:
        raise InputError("--nodes needs --system (it knows the ranks per node); give --ranks otherwise")
    if args.recompute == "selective" and args.rerun_share is None:
        raise InputError("--recompute selective reruns a share of the forward that no flop count gives: add "
                         "--rerun-share (measured), or use --recompute full")
    if args.rerun_share is not None and args.recompute != "selective":
        raise InputError("--rerun-share is --recompute selective's: add it, or leave out --rerun-share")
    others = [s for s in args.strategy if s not in predict.ACCUMULATES]
    if args.grad_accum > 1 and others:
        raise InputError(f"--grad-accum is modelled for {', '.join(predict.ACCUMULATES)}; leave out --strategy "
                         f"{' '.join(others)} or --grad-accum")
    split = [s for s in args.strategy if s in predict.SPLIT]
    if args.recompute != "none" and split:
        raise InputError(f"--recompute is modelled for the data-parallel strategies; leave out --strategy "
                         f"{' '.join(split)} or --recompute")
    for flag, path in (("--plot", args.plot), ("--json", args.json)):
        if path is not None:
            check_file(path, flag)
    if args.plot is not None and args.plot.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise InputError(f"--plot {args.plot}: name a .png, .pdf or .svg file")
    system = predict.SYSTEMS[args.system] if args.system else None
    link = (link_from_comm_json(args.comm_json) if args.comm_json else None if system else
            predict.Link(args.alpha_us * 1e-6, args.bandwidth_gbps * 1e9, "--alpha-us/--bandwidth-gbps"))
    ranks = ([n * system.ranks_per_node for n in args.nodes] if args.nodes else
             args.ranks or [2**i for i in range(9)])
    split = {}
    if "tensor_parallel" in args.strategy:
        if not (args.model or "").startswith(("transformer", "gpt:")):
            raise InputError("--strategy tensor_parallel needs --model transformer:WIDTH,DEPTH,HEADS,SEQ_LEN "
                             "or gpt:PRESET (its layers' activations are what it all-reduces)")
        sizes = model_sizes(args.model)
        from scaledl.models import VOCAB_SIZE

        # The language model's head (width x vocabulary, whole on every rank) is its unsplit share.
        vocab = {"num_classes": VOCAB_SIZE} if args.model.startswith("gpt:") else {}
        uneven = [n for n in ranks if sizes["heads"] % n]
        if uneven:
            raise InputError(f"--strategy tensor_parallel splits the model's {sizes['heads']} heads over the ranks: "
                             f"{', '.join(map(str, uneven))} ranks do not divide them; give --ranks that do")
        split = {**predict.tensor_parallel_collectives(sizes["depth"], args.micro_batch_size, sizes["seq_len"],
                                                       sizes["width"], args.bytes_per_param),
                 "split_share": predict.transformer_split_share(sizes["width"], sizes["depth"], sizes["seq_len"],
                                                                **vocab)}
    return {"step_s": args.step_ms / 1e3 if args.step_ms else step_from_json(args.step_json),
            "num_params": int(args.params) if args.params else count_params(args.model),
            "system": system, "link": link, "ranks": sorted(set(ranks)), "tensor_parallel": split}


def run(args) -> int:
    from scaledl.perf.bench.runner import text_table
    from scaledl.output_paths import OutputPathError, describe_os_error

    try:
        inputs = resolve(args)
    except (InputError, OutputPathError) as error:
        print(f"scaledl predict: error: {error}", file=sys.stderr)
        return 2
    knobs = {"bucket_bytes": args.bucket_mb * 2**20, "fusion_bytes": args.fusion_mb * 2**20,
             "cycle_s": args.cycle_ms / 1e3, "gathers": args.gathers, "recompute": args.recompute,
             "rerun_share": args.rerun_share, "grad_accum": args.grad_accum, **inputs["tensor_parallel"]}
    rows = predict.table(inputs["step_s"], inputs["num_params"], inputs["system"], inputs["link"], inputs["ranks"],
                         tuple(args.strategy), args.bytes_per_param, backward_fraction=args.backward_fraction,
                         micro_batches=args.micro_batches, **knobs)
    where = inputs["system"] or inputs["link"]
    print(f"step {inputs['step_s'] * 1e3:.4g} ms on one device, {inputs['num_params']:,} parameters, "
          f"link: {where.name if inputs['system'] else where.source} "
          f"({(where.source if inputs['system'] else '')})".replace(" ()", ""))
    shown = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()} for row in rows]
    print(text_table(list(shown[0]), shown))
    try:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            shared = {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v) for k, v in inputs.items()}
            args.json.write_text(json.dumps({"inputs": shared, "rows": rows}, indent=1) + "\n")
        if args.plot:
            args.plot.parent.mkdir(parents=True, exist_ok=True)
            predict.figure(rows).savefig(args.plot, dpi=100)
    except OSError as error:  # a path that passed the checks and still refused the write (a special file system)
        print(f"scaledl predict: error: {describe_os_error(error, error.filename or args.json or args.plot)}",
              file=sys.stderr)
        return 2
    return 0
