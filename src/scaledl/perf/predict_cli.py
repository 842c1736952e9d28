"""`scaledl predict`: predicted step time and efficiency per rank count (scaledl.perf.predict).

    scaledl predict --system polaris --step-ms 12 --model transformer --nodes 1 2 4 8 16
    scaledl predict --comm-json runs/bench/comm.json --step-json runs/bench/overhead.json --model cnn --ranks 2
    scaledl predict --layouts --system polaris --model gpt:gpt3-2.7b --nodes 4 --global-batch-size 512

The single-device step comes from --step-ms or a benchmark's JSON (`scaledl bench overhead`:
the plain loop's step; `scaledl bench predict`: its first setting's); the link from a system
preset, a `scaledl bench comm` fit (all-reduces in a loop) or a `bench predict` one (all-reduces
inside a step: what a step pays on the machine it ran on), read back to one link, or --alpha-us
with --bandwidth-gbps.  `--layouts` needs no measured step: it ranks every dp x tp x pp layout of a
language model on a system's nodes (with a ZeRO stage, recomputation and a micro batch size) by
the step its flops and communication predict, among those that fit in a device's memory
(scaledl.perf.choose).  Every flag is checked before anything is written.
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


# The flags of a prediction from a measured step, at their defaults: --layouts refuses them changed.
STEP_DEFAULTS = {"strategy": ["ddp", "ddp_no_overlap", "zero3"], "recompute": "none", "grad_accum": 1,
                 "micro_batches": 8, "micro_batch_size": 8, "bucket_mb": 25.0, "fusion_mb": 128.0, "cycle_ms": 1.0,
                 "gathers": 1, "bytes_per_param": 4, "backward_fraction": predict.BACKWARD_FRACTION}
LAYOUT_DEFAULTS = {"global_batch_size": None, "mfu": 0.45, "top": 10}  # --layouts' own


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
    step = parser.add_mutually_exclusive_group()  # one of them, unless --layouts
    step.add_argument("--step-ms", type=_positive(float), help="measured single-device step (forward+backward+update)")
    step.add_argument("--step-json", type=Path, help="a `scaledl bench overhead` or `bench predict` result")
    parser.add_argument("--backward-fraction", type=_fraction,
                        help="backward's share of the step (measured by the profiler; default 2/3)")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--params", type=_positive(float), help="parameter count (1e9 for a 1B model)")
    size.add_argument("--model", type=model_name,
                      help="count the parameters of cnn, resnet50, transformer:W,D,H,L or gpt:PRESET (gpt:gpt3-2.7b)")
    parser.add_argument("--bytes-per-param", type=int, choices=(2, 4), help="gradient bytes per parameter")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--ranks", type=_positive(int), nargs="+", help="rank counts (default 1 2 4 ... 256)")
    where.add_argument("--nodes", type=_positive(int), nargs="+", help="node counts (with --system)")
    parser.add_argument("--strategy", choices=predict.STRATEGIES, nargs="+")
    parser.add_argument("--bucket-mb", type=_positive(float), help="DDP bucket_cap_mb")
    parser.add_argument("--fusion-mb", type=_positive(float), help="Horovod fusion threshold, MiB")
    parser.add_argument("--cycle-ms", type=_non_negative, help="Horovod cycle time, ms")
    parser.add_argument("--gathers", type=_positive(int),
                        help="ZeRO-3/FSDP2: units gathered one at a time per pass (layers or modules)")
    parser.add_argument("--micro-batches", type=_positive(int), help="pipeline micro batches per step")
    parser.add_argument("--recompute", choices=("none", "selective", "full"),
                        help="data-parallel strategies: the forward run again in backward (selective needs "
                        "--rerun-share)")
    parser.add_argument("--rerun-share", type=_fraction, help="--recompute selective: the measured share of the "
                        "forward it reruns")
    parser.add_argument("--grad-accum", type=_positive(int),
                        help="micro batches per optimizer step, reduced once (ddp, ddp_no_overlap, horovod)")
    parser.add_argument("--micro-batch-size", type=_positive(int),
                        help="tensor_parallel: sequences per step (its activations' size, with --model)")
    parser.add_argument("--layouts", action="store_true",
                        help="rank the layouts of --model gpt:PRESET on --nodes N of --system (dp x tp x pp, ZeRO "
                        "stage, recomputation, micro batch) by predicted step, among those that fit")
    parser.add_argument("--global-batch-size", type=_positive(int), help="--layouts: sequences per optimizer step")
    parser.add_argument("--mfu", type=_fraction,
                        help="--layouts: the share of the devices' peak a step's compute reaches (default 0.45)")
    parser.add_argument("--top", type=_positive(int),
                        help="--layouts: how many fitting layouts to show")
    parser.add_argument("--plot", type=Path, help="write the efficiency figure here (.png)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    # The defaults in one place: --layouts refuses the step flags changed from them, and the step prediction
    # the layout flags.
    parser.set_defaults(**STEP_DEFAULTS, **LAYOUT_DEFAULTS)


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


def resolve_layouts(args) -> dict:
    """--layouts' inputs, checked: a system, a language model, one node count and the global batch."""
    from scaledl.output_paths import check_file
    from scaledl.perf import choose

    if not args.system:
        raise InputError("--layouts needs --system (polaris or aurora: its nodes, links and devices)")
    if not (args.model or "").startswith("gpt:"):
        raise InputError("--layouts lays out a language model: give --model gpt:PRESET (gpt:gpt3-2.7b)")
    if not args.nodes or len(args.nodes) != 1:
        raise InputError("--layouts needs one node count: --nodes N")
    if args.global_batch_size is None:
        raise InputError("--layouts needs --global-batch-size (sequences per optimizer step)")
    ignored = [flag for flag, value in (("--step-ms", args.step_ms), ("--step-json", args.step_json),
                                        ("--plot", args.plot), ("--ranks", args.ranks),
                                        ("--rerun-share", args.rerun_share)) if value is not None]
    ignored += [f"--{name.replace('_', '-')}" for name, default in STEP_DEFAULTS.items()
                if getattr(args, name) != default]
    if ignored:
        raise InputError(f"--layouts predicts each layout from the model's flops and chooses its own strategy, "
                         f"recomputation and micro batches: leave out {' '.join(ignored)}")
    if args.json is not None:
        check_file(args.json, "--json")
    return {"sizes": model_sizes(args.model), "system": predict.SYSTEMS[args.system],
            "device": choose.DEVICES[args.system], "nodes": args.nodes[0]}


def run_layouts(args) -> int:
    from scaledl.output_paths import OutputPathError, describe_os_error
    from scaledl.perf import choose
    from scaledl.perf.bench.runner import text_table

    try:
        inputs = resolve_layouts(args)
    except (InputError, OutputPathError) as error:
        print(f"scaledl predict: error: {error}", file=sys.stderr)
        return 2
    rows = choose.layouts(inputs["sizes"], inputs["system"], inputs["device"], inputs["nodes"], args.global_batch_size,
                          mfu=args.mfu)
    fitting = [row for row in rows if row["fits"]]
    device, ranks = inputs["device"], inputs["nodes"] * inputs["system"].ranks_per_node
    print(f"{args.model} on {inputs['nodes']} {args.system} node(s), {ranks} ranks of {device.name} "
          f"({device.memory_bytes / 2**30:.0f} GiB), global batch {args.global_batch_size} sequences, "
          f"compute at {args.mfu:.0%} of peak: {len(fitting)} of {len(rows)} layouts fit")
    columns = ["dp", "tp", "pp", "zero", "recompute", "micro_batch_size", "micro_batches", "memory_gib", "step_ms",
               "tokens_per_s", "mfu", "bubble", "tp_ms", "pp_ms", "dp_ms"]
    shown = []
    for row in fitting[:args.top]:
        row = {**row, **{name.replace("_s", "_ms"): row[name] * 1e3 for name in ("step_s", "tp_s", "pp_s", "dp_s")}}
        shown.append({k: (round(row[k]) if k == "tokens_per_s" else float(f"{row[k]:.4g}") if isinstance(row[k], float)
                          else row[k]) for k in columns})
    if shown:
        print(text_table(columns, shown))
    else:
        smallest = min(rows, key=lambda row: row["memory_gib"])
        print(f"none fits: the smallest needs {smallest['memory_gib']:.1f} GiB a rank (dp {smallest['dp']}, tp "
              f"{smallest['tp']}, pp {smallest['pp']}, ZeRO-{smallest['zero']}, recompute {smallest['recompute']}); "
              "add nodes or shrink the model")
    try:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"inputs": {"model": args.model, "system": args.system,
                                                        "nodes": inputs["nodes"], "mfu": args.mfu,
                                                        "global_batch_size": args.global_batch_size},
                                             "rows": rows}, indent=1) + "\n")
    except OSError as error:
        print(f"scaledl predict: error: {describe_os_error(error, error.filename or args.json)}", file=sys.stderr)
        return 2
    return 0


def resolve(args) -> dict:
    """Every input checked and read; nothing written yet."""
    from scaledl.output_paths import check_file

    if args.step_ms is None and args.step_json is None:
        raise InputError("give the single-device step: --step-ms or --step-json (or --layouts, which predicts it)")
    stray = [f"--{name.replace('_', '-')}" for name, default in LAYOUT_DEFAULTS.items()
             if getattr(args, name) != default]
    if stray:
        raise InputError(f"{' '.join(stray)} go with --layouts: add it, or leave them out")

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

    if args.layouts:
        return run_layouts(args)
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
