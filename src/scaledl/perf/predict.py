"""Predict a training step before measuring it: compute plus the communication left exposed.

The model (each formula below cites where it comes from):

* One message of n bytes over one link costs alpha + n / bandwidth (Hockney's latency-bandwidth
  model; `scaledl bench comm` fits it, scaledl.perf.bench.stats.fit_alpha_beta).
* Ring all-reduce over N ranks: 2(N-1) steps, each moving n/N bytes, so
  2(N-1) alpha + 2(N-1)/N n / bandwidth (Patarasuk & Yuan, "Bandwidth optimal all-reduce
  algorithms for clusters of workstations", JPDC 2009; nccl-tests' PERFORMANCE.md uses the same
  2(N-1)/N factor for allreduce busbw).  Reduce-scatter and all-gather are each half of it:
  (N-1) alpha + (N-1)/N n / bandwidth.
* Two levels (ranks within a node, nodes): a ring that leaves the node is as slow as its slowest
  link, so beyond one node the inter-node alpha and bandwidth apply to the whole ring.  The
  inter-node bandwidth is the node's injection bandwidth (all its NICs: NCCL spreads rings over them).
* DDP (torch.nn.parallel.DistributedDataParallel) all-reduces gradients in buckets of
  `bucket_cap_mb` (25 MB) as backward produces them.  Without overlap every bucket waits for the
  end of backward; with overlap the buckets run one after another during backward, and what is
  left exposed is the larger of the last bucket (launched when backward ends) and the
  communication that did not fit under backward.  That estimate is this module's own, from two
  assumptions; the overlap it rests on (a bucket's all-reduce launched asynchronously once it is
  full, in bucket order, all awaited at the end of backward) is what Li et al., "PyTorch
  Distributed", VLDB 2020, sec. 3.2, and PyTorch's DDP design note (notes/ddp.rst) describe.
  Overlap needs somewhere else for the communication to run (`Link.overlaps`): a GPU's copy
  engines and a second stream do; a CPU whose cores the ranks' compute already fills does not.
* Horovod fuses gradients that are ready into one all-reduce of at most the fusion threshold, once
  per cycle; defaults 128 MB and 1 ms (horovodrun --help, horovod/runner/launch.py, 0.28.1).  A
  gradient waits on average half a cycle before its cycle starts.
* ZeRO stages 1 and 2, as the paper counts them, move 2 Psi bytes per rank, as all-reduce does (a
  reduce-scatter of the gradients, an all-gather of the updated parameters); stage 3 and FSDP2
  gather the parameters again for backward: 3 Psi (Rajbhandari et al., "ZeRO", SC 2020, sec. 7.2).
  FSDP2 does so by default (`reshard_after_forward=True`, all but the root), one unit at a time:
  each `fully_shard` module is gathered before its forward and its backward and reduce-scatters its
  own gradients (`fsdp2_collectives`).  DeepSpeed's stage 3 gathers otherwise
  (`deepspeed_zero3_gathers` replays its PartitionedParameterCoordinator, runtime/zero/, 0.19.8): a
  parameter of at most `stage3_param_persistence_threshold` elements (1e5) stays whole through
  forward and backward and is gathered again after each optimizer step, one collective each; the
  others are fetched as their module runs and prefetched along the order recorded in the previous
  step, up to `stage3_prefetch_bucket_size` elements (5e7) per collective, so a small model is
  gathered in one collective; and a gathered parameter is freed after its module runs only when it
  does not run again within `stage3_max_reuse_distance` elements (1e9) and no prefetch has run past
  its next use.
  DeepSpeed 0.19.8 runs stages 1 and 2 otherwise by default: it all-reduces each gradient bucket
  and keeps its own part (stage_1_and_2.py, `average_tensor` -> `allreduce_and_scatter`, with
  `use_multi_rank_bucket_allreduce=True`), then all-gathers the updated parameters
  (`all_gather_dp_groups`): 3 Psi, predicted so here.  Only the number of collectives and the
  bytes they move enter the latency-bandwidth model: `gathers` collectives pay `gathers` alphas.
* Tensor parallelism over t ranks (Megatron-LM's split, Shoeybi et al. 2019, arXiv:1909.08053,
  sec. 3): each rank computes 1/t of the layers it splits and the rest whole, and all-reduces the
  activations (micro batch x sequence x width) after each row-wise layer in forward and into each
  column-wise layer's input in backward.  Megatron-LM's f operator shares one backward all-reduce
  among q, k and v: 4 a block; PyTorch's ColwiseParallel gives each of q, k, v and the MLP's first
  layer its own: 6 a block (`tensor_parallel_collectives`; torch/distributed/tensor/parallel/style.py,
  torch 2.13).  Strong scaling: the ideal step is 1/t of the single-device one.
* Pipeline with p stages and m micro batches: the bubble is (p-1)/(m+p-1) of the step
  (Huang et al., "GPipe", NeurIPS 2019, sec. 2.3; Narayanan et al., SC 2021, sec. 2.2.1).
* Backward takes 2/3 of forward+backward unless measured: a layer's backward costs two matmuls
  for its forward's one (Kaplan et al., "Scaling Laws for Neural Language Models", 2020, sec. 2.1:
  6N flops per token, 2N of them forward).
* Full recomputation (`--recompute full`) runs each block's forward again inside backward: the step
  grows by one forward, 1/3 of it (Korthikanti et al. 2022, arXiv:2205.05198, measure a little more
  for a whole layer in sec. 6.2), and
  backward, which communication overlaps, by the same.  Selective recomputation reruns only the
  cheap operations, whose time no flop count gives: pass the measured share of the forward it
  reruns (`rerun_share`).
* Gradient accumulation over N micro batches (`--grad-accum N`): N micro batches' compute, and the
  data-parallel reduction once, overlapping the last micro batch's backward (DDP skips the
  all-reduce in the others, `require_backward_grad_sync`; Horovod's `backward_passes_per_step`).
  Modelled for DDP and Horovod; FSDP2 and ZeRO-3 still gather parameters every micro batch.

Where its alpha and bandwidth come from matters as much as the formulas.  A collective that the
ranks reach from compute, as a step reaches most of its collectives, waits for the rank whose compute
ran slower this time and for a communication thread that slept through the compute; a collective in
a loop after a barrier (`scaledl bench comm`, nccl-tests) pays neither.  `scaledl bench predict`
therefore fits its links inside a synthetic step (scaledl.perf.bench.prediction.fit_links), and keeps the
loop's fit for what follows without compute between (DDP's later buckets: `bucket_link`; DeepSpeed's
persistent parameters: `persistent_link`).

What the model leaves out: compute slowed by communication sharing its memory, stragglers (unless
the single-device step given is the slowest of N copies run side by side, as `scaledl bench predict`
measures it), FSDP2's copy of each rank's shard into the all-gather's input (1/N
of the bytes per gather; on one rank FSDP2 skips the all-gather but still copies every parameter into its
unsharded buffer, and copies the whole gradient where N ranks reduce-scatter it: `if world_size == 1` in
torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py and `foreach_reduce` in _fsdp_collectives.py,
torch 2.13, so the single-device step holds the other copies),
framework work per step (measured at world size 1, so it is in the single-device step), and
collectives other than ring (trees, NVLink SHARP).  Data parallelism scales weakly (the micro batch per rank
is fixed); pipeline and tensor parallelism strongly (one batch split across the ranks).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

STRATEGIES = ("ddp", "ddp_no_overlap", "horovod", "zero1", "zero2", "zero3", "fsdp2", "pipeline", "tensor_parallel")
BACKWARD_FRACTION = 2 / 3
DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel(bucket_cap_mb=25), torch/nn/parallel/distributed.py
HOROVOD_FUSION_BYTES = 128 * 2**20  # horovodrun --fusion-threshold-mb default (horovod 0.28.1)
HOROVOD_CYCLE_S = 1e-3  # horovodrun --cycle-time-ms default (horovod 0.28.1)
TENSOR_PARALLEL_KNOBS = ("split_share", "tp_allreduces", "activation_bytes")
SPLIT = ("pipeline", "tensor_parallel")  # one batch split across the ranks: strong scaling


@dataclass(frozen=True)
class Link:
    """alpha: seconds per ring step; bandwidth: bytes per second one way; source: where they come from.

    overlaps: whether communication can run beside compute.  On GPUs it can: NCCL's kernels run on
    their own stream while backward's run on another.  Gloo's ring on a CPU copies and reduces on
    the host's cores; when the ranks' compute already fills every core, nothing hides behind
    backward, and each bucket's all-reduce adds to the step."""

    alpha_s: float
    bandwidth_Bps: float
    source: str = ""
    overlaps: bool = True


@dataclass(frozen=True)
class System:
    name: str
    ranks_per_node: int
    intra: Link
    inter: Link
    source: str = ""


# Polaris (docs.alcf.anl.gov/polaris/): 4 A100 per node
# "connected via NVLink"; 600 GB/s of NVLink per A100 (NVIDIA's A100 datasheet: both directions, 12
# links of 25 GB/s each way; ALCF's table puts the figure in its column of node totals), and the
# affinity table shows NV4 between every pair: a ring's edge (one pair) carries 4 x 25 GB/s each way.
# Between nodes, "a pair of Slingshot 11 network adapters" (the overview as it reads now; its 2022
# text said Slingshot 10, to be upgraded); a Slingshot 11 port runs at 200 Gb/s = 25 GB/s (the
# switch's port speed, as ALCF's Aurora interconnect page gives it for the same Slingshot 11 hardware,
# alcf.anl.gov/support-center/aurora/interconnect: "64 200 Gbps ports"), so a node injects 2 x 25 GB/s.
# Nominal peaks, not measured; the alphas are nominal too (order of an NCCL
# ring step on NVLink and of a Slingshot MPI latency), so replace both with a `scaledl bench comm`
# fit taken on the nodes when you have one.
POLARIS = System(
    "polaris", 4,
    Link(5e-6, 100e9, "NV4 between each pair of A100s (ALCF Polaris machine overview), 4 x 25 GB/s each way "
                      "(NVIDIA A100 datasheet); alpha nominal"),
    Link(10e-6, 2 * 25e9, "2 Slingshot NICs per node (ALCF Polaris machine overview) at Slingshot 11's 200 Gb/s "
                          "(Slingshot 11's 200 Gb/s ports, ALCF's Aurora interconnect page); alpha nominal"),
    "https://docs.alcf.anl.gov/polaris/")
# Aurora (docs.alcf.anl.gov/aurora/): 6 GPUs of 2 tiles (12 ranks
# per node), "connected all-to-all with Intel Xe Link", "8 HPE Slingshot-11 NICs" per node: 8 x 25 GB/s.
# ALCF's overview gives no Xe Link bandwidth, but its "Single node GPU-Peak benchmarks" page measures it
# (docs.alcf.anl.gov/aurora/node-performance-overview/node-performance-overview/): 15 GB/s one way from a
# tile to a tile of another GPU, 185 GB/s between the two tiles of one GPU.  A ring over a node's 12 tiles
# crosses GPUs, so its slowest edge is the 15 GB/s one.
AURORA = System(
    "aurora", 12,
    Link(5e-6, 15e9, "GPU2GPU 15 GB/s one way, a tile to a tile of another GPU (ALCF Aurora node performance "
                     "overview, Single node GPU-Peak benchmarks); alpha nominal"),
    Link(10e-6, 8 * 25e9, "8 Slingshot 11 NICs x 200 Gb/s per node (ALCF Aurora machine overview); alpha nominal"),
    "https://docs.alcf.anl.gov/aurora/")
SYSTEMS = {"polaris": POLARIS, "aurora": AURORA}


def link_for(ranks: int, system: System) -> Link:
    """The link a ring over `ranks` runs at: within one node the intra link, else the slower of the two."""
    if ranks <= system.ranks_per_node:
        return system.intra
    return Link(max(system.intra.alpha_s, system.inter.alpha_s),
                min(system.intra.bandwidth_Bps, system.inter.bandwidth_Bps), system.inter.source)


def allreduce_s(nbytes: float, ranks: int, link: Link) -> float:
    """Ring all-reduce: 2(N-1) alpha + 2(N-1)/N n / bandwidth."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (ranks - 1) * link.alpha_s + 2 * (ranks - 1) / ranks * nbytes / link.bandwidth_Bps


def reduce_scatter_s(nbytes: float, ranks: int, link: Link) -> float:
    """Ring reduce-scatter of n bytes (each rank keeps n/N): (N-1) alpha + (N-1)/N n / bandwidth."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return (ranks - 1) * link.alpha_s + (ranks - 1) / ranks * nbytes / link.bandwidth_Bps


all_gather_s = reduce_scatter_s  # the same ring run the other way: n is the gathered size


def chunks(total: float, size: float) -> list[float]:
    """`total` bytes cut into messages of at most `size` (the last one is the remainder)."""
    if total <= 0:
        return []
    full = int(total // size)
    rest = total - full * size
    return [size] * full + ([rest] if rest > 0 else [])


def bucketed_s(messages: list[float], ranks: int, link: Link, backward_s: float, overlap: bool,
               wait_s: float = 0.0, later_link: Link | None = None) -> float:
    """Exposed time of all-reduces issued one after another as backward produces their gradients.

    `later_link`: where it differs, what the buckets after the first cost: they queue behind it on the
    communication thread, with no compute between them there (a fit in a loop, not inside a step)."""
    each = [allreduce_s(m, ranks, link if i == 0 else later_link or link) + wait_s for i, m in enumerate(messages)]
    if not each or ranks <= 1:
        return 0.0
    total = sum(each)
    return max(each[-1], total - backward_s) if overlap else total


DEEPSPEED_PERSISTENCE_THRESHOLD = 1e5  # stage3_param_persistence_threshold default (runtime/zero/config.py, 0.19.8)
DEEPSPEED_MAX_REUSE_DISTANCE = 1e9  # stage3_max_reuse_distance default (the same file)
DEEPSPEED_PREFETCH_BUCKET = 5e7  # stage3_prefetch_bucket_size default (the same file)
DEEPSPEED_REDUCE_BUCKET = 5e8  # reduce_bucket_size default (the same file)
DEEPSPEED_MAX_LIVE = 1e9  # stage3_max_live_parameters default (the same file)


def deepspeed_zero3_gathers(unit_numels: list[list[int]],
                            persistence_threshold: float = DEEPSPEED_PERSISTENCE_THRESHOLD,
                            max_reuse_distance: float = DEEPSPEED_MAX_REUSE_DISTANCE,
                            prefetch_bucket: float = DEEPSPEED_PREFETCH_BUCKET,
                            reduce_bucket: float = DEEPSPEED_REDUCE_BUCKET,
                            max_live: float = DEEPSPEED_MAX_LIVE, backward_order: list[int] | None = None,
                            param_groups: int = 1) -> dict:
    """The collectives DeepSpeed's stage 3 issues per step, from the element counts of each module's own
    parameters (each parameter once: a tied weight in one module only), every module in the order
    forward enters them (`model.modules()` for a model whose forward calls its children in order; a
    container holds none of its own, `[]`, but still runs its hooks): the `exposed_comm_s` knobs.
    `backward_order`: the modules' indices in the order backward reaches them, the reverse of the
    order forward leaves them (`module_orders`); by default the reverse of forward, right for a
    root over leaves.

    Its PartitionedParameterCoordinator (runtime/zero/partitioned_param_coordinator.py, 0.19.8) walks
    the order the modules ran in the step before, parameter by parameter, and this replays it:
    * A parameter of at most the persistence threshold (`ds_persist`) stays whole through forward and
      backward.  After each optimizer step they are gathered again, one all-gather each
      (`_post_step` in runtime/zero/stage3.py -> `_allgather_params_coalesced` in
      partition_parameters.py launches one `all_gather_into_tensor` per parameter).
    * `fetch_sub_module`: a module whose parameters are not all there yet fetches the rest (one
      all-gather), then prefetches the parameters that come next in the recorded order, adding them
      until the collective holds at least the prefetch bucket in elements (or `max_live` elements
      are gathered), in one all-gather (`__all_gather_params` -> `all_gather_coalesced`, which
      flattens them into one tensor).
    * `release_sub_module` frees a module's parameters after it runs, unless their next use comes
      within `max_reuse_distance` elements of the modules that run in between, or a prefetch already
      ran past it (`__params_to_release`: "Don't release params whose reuse was skipped by prefetch").
      Its step counter has moved on by then, so a prefetch that covered only the next module's use
      does not keep it.
    * Gradients are reduce-scattered in buckets: a bucket goes out when the next parameter, in the
      order backward produces them, would take it over `reduce_bucket` elements
      (`reduce_independent_p_g_buckets_and_remove_grads`, stage3.py); the step all-reduces the
      gradient norm once per parameter group (`_get_norm_groups` -> `get_grad_norm_direct`, stage3.py).

    Returns `gathers`, `gathered` (all-gathers in forward, and the share of the parameter bytes they
    move), `regathers`, `regathered` (the same in backward), `persistent` and `persistent_gathers`
    (after the step), `scatters` and `norm_allreduces`."""
    total = sum(sum(unit) for unit in unit_numels)
    if total <= 0:
        return {"gathers": 0, "gathered": 0.0, "regathers": 0, "regathered": 0.0, "persistent": 0.0,
                "persistent_gathers": 0, "scatters": 0, "norm_allreduces": 0}
    params = [(u, n) for u, unit in enumerate(unit_numels) for n in unit if n > persistence_threshold]
    owned = [[p for p, (owner, _) in enumerate(params) if owner == u] for u in range(len(unit_numels))]
    size = [sum(unit) for unit in unit_numels]
    units = len(unit_numels)
    backward_order = list(reversed(range(units))) if backward_order is None else list(backward_order)
    order = list(range(units)) + backward_order
    queue = deque((p, step) for step, u in enumerate(order) for p in owned[u])
    available, fetched_for, live = [False] * len(params), [-1] * len(params), 0
    forward, backward = {"count": 0, "moved": 0}, {"count": 0, "moved": 0}
    for step, u in enumerate(order):
        phase = forward if step < units else backward
        missing = [p for p in owned[u] if not available[p]]
        if missing:  # its own fetch
            for p in missing:
                available[p] = True
            live += sum(params[p][1] for p in missing)
            phase["count"] += 1
            phase["moved"] += sum(params[p][1] for p in missing)
        while queue and params[queue[0][0]][0] == u and queue[0][1] <= step:  # its own uses leave the queue
            p, use = queue.popleft()
            fetched_for[p] = max(fetched_for[p], use)
        prefetched, most = 0, min(max_live - live, prefetch_bucket)
        while queue and prefetched < most:
            p, use = queue.popleft()
            fetched_for[p] = max(fetched_for[p], use)
            if not available[p]:
                available[p] = True
                prefetched += params[p][1]
        live += prefetched
        if prefetched:
            phase["count"] += 1
            phase["moved"] += prefetched
        if _reused_within(u, order[step + 1:], size, max_reuse_distance):
            continue
        for p in owned[u]:  # released, unless a prefetch covered a use after the next step
            if available[p] and fetched_for[p] <= step + 1:
                available[p] = False
                live -= params[p][1]
    persistent = [n for unit in unit_numels for n in unit if n <= persistence_threshold]
    return {"gathers": forward["count"], "gathered": forward["moved"] / total, "regathers": backward["count"],
            "regathered": backward["moved"] / total, "persistent": sum(persistent) / total,
            "persistent_gathers": len(persistent),
            "scatters": _buckets([n for u in reversed(range(units)) for n in reversed(unit_numels[u])], reduce_bucket),
            "norm_allreduces": param_groups}


def _reused_within(unit: int, later: list[int], size: list[int], distance: float) -> bool:
    """Whether `unit` runs again before `distance` elements of other modules have run."""
    between = 0
    for other in later:
        if between >= distance:
            return False
        if other == unit:
            return True
        between += size[other]
    return False


def _buckets(numels: list[int], cap: float) -> int:
    """How many buckets DeepSpeed fills with these parameters in order: a bucket goes out when the next
    parameter would take it over `cap`."""
    count, filled = 0, 0
    for n in numels:
        if filled and filled + n > cap:
            count, filled = count + 1, 0
        filled += n
    return count + (1 if filled else 0)


def module_orders(model) -> tuple[list[list[int]], list[int]]:
    """`deepspeed_zero3_gathers`'s inputs for a torch module: each module's own parameters' element counts
    in the order forward enters them (pre-order, for a forward that calls its children in order), and
    the order backward reaches them: the reverse of the order forward leaves them (post-order).
    A parameter shared by two modules is counted in the first only."""
    modules = list(model.modules())
    index = {id(module): i for i, module in enumerate(modules)}
    seen, units = set(), []
    for module in modules:
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        units.append([p.numel() for p in own])
    left = []

    def leave(module):
        for child in module.children():
            leave(child)
        left.append(index[id(module)])

    leave(model)
    return units, list(reversed(left))


def fsdp2_collectives(unit_numels: list[int], root_numel: int = 0) -> dict:
    """The collectives FSDP2 issues per step for `fully_shard` units of these element counts (the root's
    own parameters apart): the `exposed_comm_s` knobs.  Each unit is all-gathered before its forward
    and, resharded after it (`reshard_after_forward=True`, the default for all but the root), again
    before its backward; its gradients are reduce-scattered in its own post-backward
    (`FSDPParamGroup.post_backward` -> `foreach_reduce`, torch/distributed/fsdp/_fully_shard/, torch 2.13)."""
    units = sum(1 for n in unit_numels if n)
    total = sum(unit_numels) + root_numel
    if total <= 0:
        return {"gathers": 0, "gathered": 0.0, "regathers": 0, "regathered": 0.0, "scatters": 0}
    root = 1 if root_numel else 0  # gathered once: the root stays whole from forward to backward
    return {"gathers": units + root, "gathered": 1.0, "regathers": units, "regathered": sum(unit_numels) / total,
            "scatters": units + root}


# The all-reduces one transformer block makes in a tensor-parallel step.  scaledl's tensor-parallel rung, with
# ColwiseParallel and RowwiseParallel: 2 in forward (after the attention's output and the MLP's second layer) and 4
# in backward (into q, k and v, unfused, and the MLP's first layer); counted in real steps by
# tests/perf/test_predict.py.  Megatron-LM fuses q, k and v into one layer: 2 and 2 (Shoeybi et al. 2019, sec. 3).
RUNG_TP_ALLREDUCES_PER_BLOCK = 6
MEGATRON_TP_ALLREDUCES_PER_BLOCK = 4


def tensor_parallel_collectives(depth: int, micro_batch_size: int, seq_len: int, width: int,
                                bytes_per_value: int = 4, per_block: int = RUNG_TP_ALLREDUCES_PER_BLOCK) -> dict:
    """The all-reduces of one tensor-parallel step of `depth` transformer blocks: `per_block` of them a
    block (RUNG_TP_ALLREDUCES_PER_BLOCK by default), each of the block's activations."""
    return {"tp_allreduces": per_block * depth,
            "activation_bytes": micro_batch_size * seq_len * width * bytes_per_value}


def transformer_split_share(width: int, depth: int, seq_len: int, num_classes: int = 10) -> float:
    """The share of a transformer's flops in the layers tensor parallelism splits: every block's q, k, v,
    output and MLP weights (12 w^2 a block, 6 flops per weight per token: Kaplan et al. 2020, sec. 2.1)
    and its attention over the sequence (per token, 2 x 2 L w forward, split by heads), against those
    plus the head (w x classes per token).  Embedding lookups, norms and the loss are left out: few
    flops, but on a CPU with small layers their time is not, so measure where you can."""
    split = depth * (6 * 12 * width * width + 3 * 4 * seq_len * width)
    return split / (split + 6 * width * num_classes)


def exposed_comm_s(strategy: str, grad_bytes: float, ranks: int, link: Link, backward_s: float,
                   bucket_bytes: float = DDP_BUCKET_BYTES, fusion_bytes: float = HOROVOD_FUSION_BYTES,
                   cycle_s: float = HOROVOD_CYCLE_S, gathers: int = 1, gather_link: Link | None = None,
                   scatter_link: Link | None = None, gathered: float = 1.0, regathers: int | None = None,
                   regathered: float | None = None, persistent: float = 0.0, persistent_gathers: int = 1,
                   scatters: int = 1, norm_allreduces: int = 0, persistent_link: Link | None = None,
                   bucket_link: Link | None = None) -> float:
    """Seconds per step that communication adds to the single-device step, for one strategy.

    `gather_link`, `scatter_link`: the sharded strategies' all-gather and reduce-scatter read from
    their own fits (`half_link_from_fit`) where the backend does not run them as half a ring (in a
    `scaledl bench predict` run here, Gloo's reduce-scatter of 16 MB on 2 ranks took 13.2 ms, about as
    long as the whole all-reduce's 13.9); else `link`.  ZeRO-3 and FSDP2 gather `gathered` of the
    parameter bytes in `gathers` collectives for forward, `regathered` of them in `regathers` for
    backward (by default all of them again, as the paper counts it), and `persistent` of them in
    `persistent_gathers` after the optimizer step (issued one after another: `persistent_link`, where
    a fit in a loop differs from one inside a step); they reduce-scatter the gradients in `scatters`
    collectives (FSDP2: one per unit, in its post-backward; DeepSpeed: per reduce bucket) and
    all-reduce a few bytes `norm_allreduces` times (`deepspeed_zero3_gathers` gives DeepSpeed's own).
    With the latency-bandwidth model only the number of collectives and the bytes they move matter,
    so each pass's bytes are split evenly between its collectives."""
    if strategy in ("ddp", "ddp_no_overlap"):  # `bucket_link`: DDP's buckets after the first (`bucketed_s`)
        return bucketed_s(chunks(grad_bytes, bucket_bytes), ranks, link, backward_s,
                          strategy == "ddp" and link.overlaps, later_link=bucket_link)
    if strategy == "horovod":
        return bucketed_s(chunks(grad_bytes, fusion_bytes or grad_bytes), ranks, link, backward_s, link.overlaps,
                          cycle_s / 2 if ranks > 1 else 0.0)
    if strategy in ("zero1", "zero2"):  # DeepSpeed: all-reduce the gradients, all-gather the parameters
        return allreduce_s(grad_bytes, ranks, link) + all_gather_s(grad_bytes, ranks, gather_link or link)
    if strategy in ("zero3", "fsdp2"):  # up to 3 Psi: parameters gathered for forward and again for backward, per unit
        regathers = gathers if regathers is None else regathers
        regathered = gathered if regathered is None else regathered
        gather = gather_link or link
        passes = [(gathers, gathered, gather), (regathers, regathered, gather),
                  (persistent_gathers, persistent, persistent_link or gather)]
        return (max(scatters, 1) * reduce_scatter_s(grad_bytes / max(scatters, 1), ranks, scatter_link or link)
                + sum(units * all_gather_s(share * grad_bytes / units, ranks, passes_link)
                      for units, share, passes_link in passes if units > 0 and share > 0)
                + norm_allreduces * allreduce_s(8, ranks, link))
    raise ValueError(f"exposed_comm_s: no strategy {strategy!r} (pipeline and tensor_parallel split the compute: "
                     f"predict_step_s); choose from {', '.join(s for s in STRATEGIES if s not in SPLIT)}")


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """GPipe's idle share of a step: (p-1)/(m+p-1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def pipeline_step_s(step_s: float, stages: int, micro_batches: int) -> float:
    """The model split over p stages does 1/p of the work each, stretched by the bubble."""
    return step_s / stages / (1 - bubble_fraction(stages, micro_batches))


RERUN_SHARE = {"none": 0.0, "full": 1.0}  # of the forward, run again in backward; selective: measured
ACCUMULATES = ("ddp", "ddp_no_overlap", "horovod")  # one reduction per optimizer step, whatever N


def recomputed_step_s(step_s: float, recompute: str = "none", backward_fraction: float = BACKWARD_FRACTION,
                      rerun_share: float | None = None) -> tuple[float, float]:
    """(step, its backward) in seconds with `recompute`, from a step measured without: backward gains
    `rerun_share` of a forward (1 for full recomputation; selective's must be given)."""
    share = RERUN_SHARE.get(recompute) if rerun_share is None else rerun_share
    if share is None:
        raise ValueError(f"recompute {recompute!r} reruns a share of the forward no flop count gives: pass "
                         "rerun_share (measured), or recompute none or full")
    extra = share * (1 - backward_fraction) * step_s
    return step_s + extra, backward_fraction * step_s + extra


def predict_step_s(strategy: str, step_s: float, grad_bytes: float, ranks: int, link: Link,
                   backward_fraction: float = BACKWARD_FRACTION, micro_batches: int = 8, recompute: str = "none",
                   rerun_share: float | None = None, grad_accum: int = 1, **knobs) -> float:
    """Predicted seconds per step at `ranks` from the measured single-device `step_s` (one micro batch,
    without recomputation).

    `recompute` and `rerun_share`: the forward run again in backward (`recomputed_step_s`); `grad_accum`:
    micro batches per optimizer step, their reduction once (DDP and Horovod).
    Tensor parallelism takes `split_share` (the share of `step_s` in the layers it splits;
    `transformer_split_share`), `tp_allreduces` and `activation_bytes` (`tensor_parallel_collectives`).
    Where `step_s` is already one rank's step at that degree, measured without communication (as
    `scaledl bench predict` measures it), pass `split_share=0`."""
    if grad_accum > 1 and strategy not in ACCUMULATES:
        raise ValueError(f"gradient accumulation is modelled for {', '.join(ACCUMULATES)}, not {strategy}")
    if recompute != "none" or rerun_share is not None:
        micro_s, backward_s = recomputed_step_s(step_s, recompute, backward_fraction, rerun_share)
        if strategy in SPLIT:
            raise ValueError(f"recomputation is modelled for the data-parallel strategies, not {strategy}")
        others = {k: v for k, v in knobs.items() if k not in TENSOR_PARALLEL_KNOBS}
        return grad_accum * micro_s + exposed_comm_s(strategy, grad_bytes, ranks, link, backward_s, **others)
    if strategy == "pipeline":  # ranks are the stages: the same batch, split by layers
        return pipeline_step_s(step_s, ranks, micro_batches)
    if strategy == "tensor_parallel":  # ranks are the TP degree: the same batch, each layer split
        missing = [name for name in TENSOR_PARALLEL_KNOBS if name not in knobs]
        if missing:
            raise ValueError(f"tensor_parallel needs {', '.join(missing)} (predict.tensor_parallel_collectives, "
                             "predict.transformer_split_share)")
        compute = step_s * (1 - knobs["split_share"] + knobs["split_share"] / ranks)
        return compute + knobs["tp_allreduces"] * allreduce_s(knobs["activation_bytes"], ranks, link)
    others = {k: v for k, v in knobs.items() if k not in TENSOR_PARALLEL_KNOBS}
    return grad_accum * step_s + exposed_comm_s(strategy, grad_bytes, ranks, link, step_s * backward_fraction,
                                                **others)


def table(step_s: float, num_params: int, system: System | None = None, link: Link | None = None,
          ranks: list[int] | tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
          strategies: tuple[str, ...] = ("ddp", "ddp_no_overlap", "horovod", "zero3"),
          bytes_per_param: int = 4, **knobs) -> list[dict]:
    """Rows per (strategy, ranks): predicted step, exposed communication, efficiency (weak scaling for the
    data-parallel strategies, t(1) / t(N); strong for the split ones, t(1) / (N t(N))).  Tensor
    parallelism's rows take `step_s` as the 1-rank step (its `split_share` knob below 1).

    `system` picks the link per rank count (one node, or the slower inter-node link); `link` fixes
    one link for every count (a `scaledl bench comm` fit taken on this machine)."""
    if (system is None) == (link is None):
        raise ValueError("give a system or a link (one of them)")
    grad_bytes = num_params * bytes_per_param
    # One device's step doing the same work: recomputation's forward and every micro batch included.
    local_s = knobs.get("grad_accum", 1) * recomputed_step_s(
        step_s, knobs.get("recompute", "none"), knobs.get("backward_fraction", BACKWARD_FRACTION),
        knobs.get("rerun_share"))[0]
    rows = []
    for strategy in strategies:
        for n in ranks:
            chosen = link or link_for(n, system)
            t = predict_step_s(strategy, step_s, grad_bytes, n, chosen, **knobs)
            split = strategy in SPLIT
            work = step_s / n if split else local_s  # ideal: the work per rank, nothing else
            rows.append({"strategy": strategy, "ranks": n,
                         "nodes": math.ceil(n / system.ranks_per_node) if system else None,
                         "step_ms": t * 1e3, "comm_ms": None if split else (t - local_s) * 1e3,
                         "efficiency": work / t})
    return rows


def figure(rows: list[dict], measured: list[dict] | None = None, title: str = ""):
    """Predicted efficiency per strategy against nodes (ranks without a system); measured points on top.

    `measured`: dicts with strategy, ranks or nodes, and efficiency."""
    from matplotlib.figure import Figure  # no pyplot: leaves a notebook's backend alone

    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    x_key = "nodes" if rows and rows[0]["nodes"] is not None else "ranks"
    colors = {}
    styles = {"ddp_no_overlap": ":", "horovod": "-."}  # where lines coincide, the dotted one stays visible
    for strategy in dict.fromkeys(row["strategy"] for row in rows):
        points = [row for row in rows if row["strategy"] == strategy]
        if x_key == "nodes":  # per node count, the full nodes: 1 rank and 4 ranks are both "1 node"
            fullest = {}
            for row in points:
                if row["nodes"] not in fullest or row["ranks"] > fullest[row["nodes"]]["ranks"]:
                    fullest[row["nodes"]] = row
            points = sorted(fullest.values(), key=lambda row: row["nodes"])
        line, = ax.plot([row[x_key] for row in points], [row["efficiency"] for row in points],
                        styles.get(strategy, "-"), lw=2 if strategy in styles else 1.5, label=strategy)
        colors[strategy] = line.get_color()
    for point in measured or []:
        ax.plot(point.get(x_key, point.get("ranks")), point["efficiency"], "o", ms=8, mec="black",
                color=colors.get(point["strategy"], "black"))
    if measured:
        ax.plot([], [], "o", color="gray", mec="black", label="measured")
    xs = [row[x_key] for row in rows]
    wide = bool(xs) and max(xs) / max(min(xs), 1) > 8
    xlabel = x_key
    if x_key == "nodes":  # a node holds several ranks; the efficiency is still against one rank
        per_node = max(row["ranks"] for row in rows if row["nodes"] == 1)
        xlabel = f"nodes ({per_node} ranks each); efficiency against 1 rank"
    ax.set(xscale="log" if wide else "linear", xlabel=xlabel, ylabel="efficiency against 1 rank",
           ylim=(0, 1.05), title=title or "predicted (lines) and measured (points)")
    if xs:  # the counts themselves as ticks, written as whole numbers (not 10^0, 2x10^0)
        from matplotlib.ticker import NullFormatter, ScalarFormatter

        ax.set_xticks(sorted(set(xs)))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axhline(1.0, color="gray", lw=0.6, ls=(0, (1, 3)), zorder=0)  # ideal, faint: a line at 0.99 stays visible
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def link_from_fit(fit: dict, ranks: int, source: str = "", overlaps: bool = True) -> Link:
    """Per-link alpha and bandwidth from an all-reduce fit t = a + b n taken on `ranks` ranks
    (`scaledl bench comm`'s fits["allreduce"]): the ring formula read backwards,
    alpha = a / (2(N-1)), bandwidth = 2(N-1)/N / b."""
    if ranks < 2:
        raise ValueError("an all-reduce fit needs at least 2 ranks")
    return Link(fit["alpha_s"] / (2 * (ranks - 1)), _per_byte(2 * (ranks - 1) / ranks, fit["beta_s_per_byte"]),
                source or f"all-reduce fit on {ranks} ranks", overlaps)


def half_link_from_fit(fit: dict, ranks: int, source: str = "", overlaps: bool = True) -> Link:
    """The same for a reduce-scatter or all-gather fit (size: the full buffer), each half a ring:
    t = (N-1) alpha + (N-1)/N n / bandwidth, so alpha = a / (N-1), bandwidth = (N-1)/N / b."""
    if ranks < 2:
        raise ValueError("a reduce-scatter or all-gather fit needs at least 2 ranks")
    return Link(fit["alpha_s"] / (ranks - 1), _per_byte((ranks - 1) / ranks, fit["beta_s_per_byte"]),
                source or f"fit on {ranks} ranks", overlaps)


def _per_byte(share: float, beta_s_per_byte: float) -> float:
    """A link's bandwidth from a fit's time per byte: infinite where the fit found none (held at 0)."""
    return share / beta_s_per_byte if beta_s_per_byte > 0 else float("inf")


def predict(step_s: float, num_params: int, system: str | System = "polaris", measured: list[dict] | None = None,
            step_label: str | None = None, **options):
    """What a lesson calls: (rows, figure) for a single-device step and a model size.  `step_label`
    says where the step came from when it was not measured ("assumed", "from flops"): the title says it."""
    chosen = SYSTEMS[system] if isinstance(system, str) else system
    rows = table(step_s, num_params, chosen, **options)
    step = f"step {step_s * 1e3:.3g} ms" + (f" ({step_label})" if step_label else "")
    return rows, figure(rows, measured, f"{chosen.name}: {step}, {num_params:,} parameters")
