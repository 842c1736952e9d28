"""Choose a layout: every way to lay a language model over a machine's ranks, ranked by predicted step
time among those that fit in a device's memory (`scaledl predict --layouts`).

A layout is dp x tp x pp ranks (tp inside a node, dividing the heads; pp dividing the blocks; dp the
rest), a ZeRO stage, a recomputation mode and a micro batch size, at a fixed global batch.  The
Ultra-Scale Playbook (Hugging Face, 2025) finds its configurations the same way in three steps:
fit the model in memory (shard the state, recompute, split the layers), reach the global batch
(micro batches, accumulation, data parallelism), then keep the fastest.  Here each step is the
arithmetic the lessons derive, so a ranking can be checked line by line:

Memory per rank, mixed precision (bf16 weights and gradients) with Adam, the most common setup:
- the state: `zero_memory.bytes_per_param(precision, stage, optimizer_state_bytes=8)` (16-bit
  weights and gradients, an fp32 master copy and Adam's two fp32 moments: 2 + 2 + 12 bytes a
  parameter), partitioned over dp as the ZeRO stage says, of the parameters the rank holds: its
  stage's blocks (depth/pp of them) with their split layers over tp, and the embeddings or the head;
- the activations (`scaledl.activations`): a stage's blocks for one micro batch, times the micro
  batches a stage holds (1F1B's first stage: min(m, pp)).  DeepSpeed's bf16 runs the model in bf16
  without autocast, so each value a layer keeps is 2 bytes: the fp32 count (derived and measured in
  lessons 10 and 13, with its split over tp) at 2 bytes a value;
- `headroom` (10% by default) kept free for CUDA's context, the allocator's slack and workspaces.

Time per step:
- compute: the model's flops for the global batch (`models.gpt_flops_per_token`, with full
  recomputation's extra forward, a third of 6N) at `mfu` of the devices' peak (`scaledl.flops`),
  over all the ranks, stretched by the pipeline's bubble (p-1)/(m+p-1) (`predict.bubble_fraction`);
- tensor parallelism: 4 all-reduces of a micro batch's activations per block and micro batch
  (Megatron-LM's count, Shoeybi et al. 2019, section 3), inside a node, not overlapped;
- pipeline: each micro batch's activations sent to the next stage and its gradient back;
- data parallelism: `predict.exposed_comm_s` for DDP (stage 0) and ZeRO 1-3, the reduction once a
  step, but ZeRO-2 all-reduces the gradients in every micro batch's backward (m of them, then one
  all-gather of the updated weights; exposed, as stage 2's `overlap_comm` is off by default) and
  ZeRO-3 gathers the weights every micro batch; only stage 0
  without a pipeline (DDP) hides it behind the last micro batch's backward: a DeepSpeed pipeline
  reduces after that backward (deepspeed/runtime/pipe/schedule.py, `TrainSchedule` ends with
  ReduceGrads), hiding nothing.
  A ring that leaves a node shares the node's injection bandwidth with the node's other dp rings.
DeepSpeed refuses ZeRO-2 and -3 with pipeline parallelism ("ZeRO-2 and ZeRO-3 are incompatible with
pipeline parallelism", deepspeed/runtime/pipe/engine.py, 0.19.8): those layouts are left out.

What it leaves out: a small micro batch's lower efficiency (every layout is at the same `mfu`),
the overlap of tensor-parallel communication with compute, and stragglers.  It ranks layouts; a
measurement on the machine decides between the first few.  `scaledl bench layouts`
(scaledl.perf.bench.layouts) checks the ranking against the rungs' runs on this machine's ranks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from scaledl import activations, models, zero_memory
from scaledl.perf import predict

ADAM_STATE_BYTES = 8  # Adam's two fp32 moments a parameter (torch.optim.Adam: exp_avg, exp_avg_sq)
HEADROOM = 0.1  # of a device's memory kept free; a layout fits in the rest (the fit rule of lessons 1, 9, 10, 14)
RECOMPUTE = ("none", "full")  # selective reruns a measured share: not predicted here


@dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: int
    peak_flops: float  # dense bf16
    source: str


# Polaris: A100 SXM4 40GB (ALCF Polaris machine overview; NVIDIA A100 datasheet: 312 TFLOP/s bf16).
# Aurora: one tile of a Max 1550, 64 GiB of the GPU's 128 (ALCF Aurora machine overview), 419 TFLOP/s bf16
# (half the GPU's 839: scaledl.flops).
DEVICES = {"polaris": Device("A100 SXM4 40GB", 40 * 2**30, 312e12, "ALCF Polaris overview, NVIDIA A100 datasheet"),
           "aurora": Device("Max 1550 tile", 64 * 2**30, 419e12, "ALCF Aurora overview, scaledl.flops")}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def params_per_rank(width: int, depth: int, seq_len: int, tp: int, pp: int,
                    vocab_size: int = models.VOCAB_SIZE) -> float:
    """Parameters the largest stage's rank holds: depth/pp blocks, their split layers over tp, plus the
    embeddings (the first stage) or the head (the last), whichever is larger."""
    block_split = models.transformer_sharded_params(width, 1)
    block_whole = (12 * width * width + 13 * width) - block_split  # norms and the row-wise layers' biases
    blocks = depth // pp * (block_split / tp + block_whole)
    embed = (vocab_size + seq_len) * width
    head = 2 * width + width * vocab_size + vocab_size
    return blocks + (embed + head if pp == 1 else max(embed, head))


def activation_bytes(seq_len: int, micro_batch_size: int, width: int, blocks: int, heads: int, recompute: str,
                     precision: str, tp: int) -> float:
    """One micro batch's activations on a stage of `blocks` blocks (with the head), split over tp.  The state above
    is DeepSpeed's: with bf16 (or fp16) it casts the model itself and runs without autocast
    (deepspeed/runtime/engine.py, _configure_distributed_model), so every value a layer keeps, the residual
    stream too, is 16-bit: lesson 10's count of fp32's values at 2 bytes each (its LayerNorm statistics, fp32,
    counted at 2: a few bytes a token), and no 16-bit copies of the weights."""
    return activations.model_bytes(seq_len, micro_batch_size, width, blocks, heads, recompute,
                                   bytes_per_value=4 if precision == "fp32" else 2, tp=tp)


# The default MFU, 0.45: PaLM's 46.2% on TPU v4 rounded down, the highest of Chowdhery et al. 2022's table 3
# (arXiv:2204.02311, beside GPT-3's 21.3% and Gopher's 32.5%): a well-tuned run's share of the peak.
def evaluate(sizes: dict, system: predict.System, device: Device, nodes: int, global_batch_size: int, dp: int,
             tp: int, pp: int, stage: int, recompute: str, micro_batch_size: int, precision: str = "bf16",
             mfu: float = 0.45, headroom: float = HEADROOM,
             tp_allreduces_per_block: int = predict.MEGATRON_TP_ALLREDUCES_PER_BLOCK) -> dict:
    """One layout's memory per rank and predicted step (see the module docstring).  `tp_allreduces_per_block`:
    Megatron-LM's (the default, q, k and v fused into one layer) or scaledl's tensor-parallel rung's
    (`predict.RUNG_TP_ALLREDUCES_PER_BLOCK`)."""
    width, depth, heads, seq_len = sizes["width"], sizes["depth"], sizes["heads"], sizes["seq_len"]
    world = nodes * system.ranks_per_node
    micro_batches = global_batch_size // (dp * micro_batch_size)  # per step, on each pipeline or rank
    held = params_per_rank(width, depth, seq_len, tp, pp)
    weight, grad, state = zero_memory.bytes_per_param(precision, stage, ADAM_STATE_BYTES)
    state_bytes = zero_memory.predict(math.ceil(held), dp, stage, weight, grad, state)["total"]
    in_flight = min(micro_batches, pp) if pp > 1 else 1
    activation = in_flight * activation_bytes(seq_len, micro_batch_size, width, depth // pp, heads, recompute,
                                              precision, tp)
    memory = state_bytes + activation
    flops = models.gpt_flops_per_token(width, depth, seq_len) * global_batch_size * seq_len
    if recompute == "full":
        flops *= 8 / 6  # one more forward: 2N of the 6N
    compute_s = flops / (world * device.peak_flops * mfu)
    bubble = predict.bubble_fraction(pp, micro_batches) if pp > 1 else 0.0
    compute_s /= 1 - bubble
    value_bytes = 2 if precision != "fp32" else 4
    activation_message = micro_batch_size * seq_len * width * value_bytes
    tp_s = (micro_batches * depth // pp * tp_allreduces_per_block
            * predict.allreduce_s(activation_message, tp, system.intra))
    pp_link = system.intra if tp * pp <= system.ranks_per_node else system.inter
    pp_s = 2 * (micro_batches + pp - 1) * (pp_link.alpha_s + activation_message / pp_link.bandwidth_Bps) if pp > 1 \
        else 0.0
    dp_link = system.intra
    if nodes > 1 and dp > 1:  # the dp rings leave the node, sharing its NICs with its other dp rings
        rings = min(tp * pp, system.ranks_per_node)
        dp_link = predict.Link(system.inter.alpha_s, system.inter.bandwidth_Bps / rings, system.inter.source,
                               system.inter.overlaps)
    one_backward = compute_s / micro_batches * predict.BACKWARD_FRACTION
    strategy = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[stage]
    if stage == 0 and pp > 1:  # DeepSpeed's pipe TrainSchedule reduces after the last backward: ReduceGrads()
        strategy = "ddp_no_overlap"
    dp_s = predict.exposed_comm_s(strategy, held * grad, dp, dp_link, one_backward) if dp > 1 else 0.0
    if stage == 3:
        dp_s *= micro_batches  # the weights gathered again for every micro batch
    if stage == 2 and dp > 1:
        # ZeRO-2 reduces in every micro batch's backward, ZeRO-1 only at the accumulation boundary (DeepSpeed 0.19.8,
        # runtime/zero/stage_1_and_2.py: each gradient's hook, grad_handling_hook -> process_gradients ->
        # reduce_ready_partitions_and_remove_grads, reduces when partition_gradients (stage 2) whatever the
        # boundary, and reduce_independent_p_g_buckets_and_remove_grads reduces each bucket as it fills; engine.py,
        # allreduce_gradients, runs stage 2's epilogue every micro batch and stage 1's reduce_gradients only at the
        # boundary).  m all-reduces, then the one all-gather: (m - 1) all-reduces more than ZeRO-1.  All exposed:
        # stage 2's overlap_comm defaults to off (runtime/zero/config.py, overlap_comm_valid: on for stage 3 only).
        dp_s += (micro_batches - 1) * predict.allreduce_s(held * grad, dp, dp_link)
    step_s = compute_s + tp_s + pp_s + dp_s
    return {"dp": dp, "tp": tp, "pp": pp, "zero": stage, "recompute": recompute,
            "micro_batch_size": micro_batch_size, "micro_batches": micro_batches,
            "memory_gib": memory / 2**30, "fits": memory <= (1 - headroom) * device.memory_bytes,
            "step_s": step_s, "tokens_per_s": global_batch_size * seq_len / step_s,
            "mfu": flops / (8 / 6 if recompute == "full" else 1) / (world * device.peak_flops * step_s),
            "bubble": bubble, "tp_s": tp_s, "pp_s": pp_s, "dp_s": dp_s}


def refusal(sizes: dict, system: predict.System, nodes: int, global_batch_size: int, dp: int, tp: int, pp: int,
            stage: int, recompute: str, micro_batch_size: int) -> str | None:
    """Why the machine or DeepSpeed does not allow this layout (a sentence), or None: the rules that
    `layouts` enumerates by and the capstone's check names."""
    ranks, per_node = nodes * system.ranks_per_node, system.ranks_per_node
    if dp * tp * pp != ranks:
        return f"dp x tp x pp is {dp * tp * pp}: the layout must use the {ranks} ranks, no more, no fewer"
    if per_node % tp or sizes["heads"] % tp:
        return (f"tp {tp}: tensor parallelism all-reduces every block, so it stays inside a node ({per_node} GPUs "
                f"on {system.name}) and must divide the {sizes['heads']} heads")
    if sizes["depth"] % pp:
        return f"pp {pp} does not divide the {sizes['depth']} blocks into equal stages"
    if stage >= 2 and pp > 1:
        return ("DeepSpeed refuses ZeRO-2 and ZeRO-3 with pipeline parallelism (deepspeed/runtime/pipe/engine.py): "
                "use ZeRO-0 or 1 with pp > 1")
    if stage and dp == 1:
        return ("ZeRO partitions the state over the data-parallel ranks: with dp 1 there is nothing to partition; "
                "use zero 0")
    if recompute not in RECOMPUTE:
        return f"recompute is one of {', '.join(RECOMPUTE)}"
    if global_batch_size % (dp * micro_batch_size):
        return (f"the global batch of {global_batch_size} sequences must split into dp x micro_batch_size = "
                f"{dp * micro_batch_size} equal parts")
    return None


def layouts(sizes: dict, system: predict.System, device: Device, nodes: int, global_batch_size: int,
            **options) -> list[dict]:
    """Every layout `refusal` allows (see the module docstring): the fitting ones first, fastest first, and of
    two as fast the one that needs less memory."""
    world = nodes * system.ranks_per_node
    rows = []
    for tp in divisors(system.ranks_per_node):
        for pp in (d for d in divisors(world // tp) if world % (tp * d) == 0):
            dp = world // (tp * pp)
            for micro_batch_size in divisors(global_batch_size):
                for stage in (0, 1, 2, 3):
                    for recompute in RECOMPUTE:
                        if refusal(sizes, system, nodes, global_batch_size, dp, tp, pp, stage, recompute,
                                   micro_batch_size) is None:
                            rows.append(evaluate(sizes, system, device, nodes, global_batch_size, dp, tp, pp, stage,
                                                 recompute, micro_batch_size, **options))
    return sorted(rows, key=lambda row: (not row["fits"], round(row["step_s"], 9), row["memory_gib"]))
