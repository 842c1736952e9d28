"""One training step of the ladder's CNN (or transformer), built the way each rung builds it.

Every variant trains the same model on the same fixed batch with the same optimizer, so
the only difference between two variants' step times is what the framework adds.  The
batch is made once on the device: the input pipeline has its own suite (`input`).

    variant = build("ddp", micro_batch_size=32)    # joins the job the launcher started
    variant.step()
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from scaledl.ladder import RUNGS

# Variant name -> (ZeRO stage for DeepSpeed variants, offload).  The plain loop is rung 1.
DEEPSPEED_VARIANTS = {"deepspeed": (0, False), "zero1": (1, False), "zero2": (2, False), "zero3": (3, False),
                      "zero3_offload": (3, True)}
VARIANTS = ("plain", "ddp", "horovod", *DEEPSPEED_VARIANTS, "fsdp", "tensor_parallel", "fsdp_tp")
# The variants that split layers: the transformer's only (scaledl.models.COLUMNWISE, ROWWISE).
TENSOR_PARALLEL_VARIANTS = ("tensor_parallel", "fsdp_tp")
# How each variant is started with more than one rank (scaledl.hpc.launchers.for_launcher): the
# rung's own launcher, and one that starts in half the time (horovodrun and deepspeed's
# launcher import TensorFlow or DeepSpeed themselves before they start the ranks).  The
# launcher does not change what is timed: the same steps, after warm-up, inside the ranks.
# The rung each variant times; its launcher comes from the ladder's one table (scaledl.ladder.RUNGS).
RUNG_OF = {"plain": "single_torch", "ddp": "ddp", "horovod": "horovod_torch", "fsdp": "fsdp",
           **{name: "deepspeed" for name in DEEPSPEED_VARIANTS}, **{name: name for name in TENSOR_PARALLEL_VARIANTS}}
LAUNCHER = {name: RUNGS[rung][1] for name, rung in RUNG_OF.items()}
QUICK_LAUNCHER = {**{name: "torchrun" for name in LAUNCHER}, "plain": "python", "horovod": "mpirun"}


def launcher_for(variant: str, quick: bool) -> str:
    return (QUICK_LAUNCHER if quick else LAUNCHER)[variant]


@dataclass
class Variant:
    name: str
    rank: int
    world_size: int
    device: object
    step: Callable[[], None]
    num_params: int
    batch: tuple = ()
    engine: object = None  # the DeepSpeed engine, for scaledl.zero_memory.measure


# What --recompute and --grad-accum apply to here: the transformer's blocks, and the loops of these variants.
ACCUMULATING_VARIANTS = ("plain", "ddp")


def build(name: str, micro_batch_size: int = 32, threads: int | None = None, bucket_cap_mb: float | None = None,
          seed: int = 0, model_name: str = "cnn", recompute: str = "none", grad_accum: int = 1) -> Variant:
    """`recompute` (the transformer's `--recompute`) and `grad_accum` (micro batches a step, as the
    rungs' loop: the data-parallel reduction in the last one's backward only) for plain and ddp."""
    import torch

    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: choose from {', '.join(VARIANTS)}")
    if (recompute != "none" or grad_accum != 1) and name not in ACCUMULATING_VARIANTS:
        raise ValueError(f"--recompute and --grad-accum are built for {', '.join(ACCUMULATING_VARIANTS)}, not {name}")
    if recompute != "none" and not model_name.startswith("transformer"):
        raise ValueError("recomputation is the transformer's blocks': pass model_name='transformer...'")
    if name in TENSOR_PARALLEL_VARIANTS and not model_name.startswith("transformer"):
        raise ValueError(f"variant {name} splits the transformer's layers: pass model_name='transformer'")
    if threads:
        torch.set_num_threads(threads)
    if name in ACCUMULATING_VARIANTS:
        return globals()[f"_{name}"](name, micro_batch_size, bucket_cap_mb, seed, model_name, recompute, grad_accum)
    builder = _deepspeed if name in DEEPSPEED_VARIANTS else globals()[f"_{name}"]
    return builder(name, micro_batch_size, bucket_cap_mb, seed, model_name)


def transformer_sizes(model_name: str) -> dict:
    """`transformer` is the default size (scaledl.models.TRANSFORMER_DEFAULTS); `transformer:W,D,H,L` names
    width, depth, heads and sequence length (`transformer:64,2,4,32` runs in seconds on a CPU)."""
    from scaledl.models import TRANSFORMER_DEFAULTS

    if model_name == "transformer":
        return dict(TRANSFORMER_DEFAULTS)
    if not model_name.startswith("transformer:"):
        raise ValueError(f"model {model_name!r}: write transformer or transformer:WIDTH,DEPTH,HEADS,SEQ_LEN")
    values = model_name.removeprefix("transformer:").split(",")
    if len(values) != 4 or not all(v.isdigit() and int(v) > 0 for v in values):
        raise ValueError(f"model {model_name!r}: write transformer:WIDTH,DEPTH,HEADS,SEQ_LEN (transformer:64,2,4,32)")
    return dict(zip(("width", "depth", "heads", "seq_len"), map(int, values)))


def model_name(text: str) -> str:
    """An argparse type: cnn, resnet50, transformer or transformer:W,D,H,L."""
    import argparse

    if text in ("cnn", "resnet50"):
        return text
    try:
        transformer_sizes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error}; or cnn, resnet50") from None
    return text


def model_and_batch(device, micro_batch_size: int, rank: int, seed: int, model_name: str = "cnn",
                    recompute: str = "none"):
    """The model on `device` and one random batch for it (different on every rank)."""
    import torch

    from scaledl import models

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + rank)
    if model_name.startswith("transformer"):  # a batch of random token ids, in the loaders' layout
        sizes = transformer_sizes(model_name)
        model = models.transformer(**sizes, recompute=recompute)
        x = torch.randint(0, models.VOCAB_SIZE, (micro_batch_size, 1, sizes["seq_len"], 1), generator=generator)
        y = torch.randint(0, 10, (micro_batch_size,), generator=generator)
        return model.to(device), x.float().to(device), y.to(device)
    if model_name == "resnet50":  # Horovod's synthetic benchmark's default
        import torchvision

        model, shape, classes = torchvision.models.resnet50(), (3, 224, 224), 1000
    else:
        model, shape, classes = models.torch_cnn(), (1, 28, 28), 10
    x = torch.randn(micro_batch_size, *shape, generator=generator).to(device)
    y = torch.randint(0, classes, (micro_batch_size,), generator=generator).to(device)
    return model.to(device), x, y


def _sgd(model, **options):
    import torch

    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, **options)


def _torch_step(model, optimizer, x, y, grad_accum: int = 1) -> Callable[[], None]:
    """One optimizer step: `grad_accum` micro batches (the same one again), gradients added up; a DDP
    model reduces in the last one's backward only, as the rungs' loop does."""
    import torch.nn.functional as F

    def step() -> None:
        for micro_batch in range(grad_accum):
            if hasattr(model, "require_backward_grad_sync"):
                model.require_backward_grad_sync = micro_batch == grad_accum - 1
            (F.cross_entropy(model(x), y) / grad_accum).backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


# Each variant builds its model the way its rung does, by calling the rung's own `wrap` (and
# Horovod's `distributed_optimizer`, DeepSpeed's `deepspeed_config`): what is timed here is
# the wiring a learner reads in the rung, not a copy of it.
def _plain(name, micro_batch_size, bucket_cap_mb, seed, model_name, recompute="none", grad_accum=1) -> Variant:
    from scaledl import devices
    from scaledl.ladder import single_torch

    # No process group: the in-process suites build this variant in the parent, whose
    # environment the launched jobs inherit.
    device = devices.pick_device()
    model, x, y = model_and_batch(device, micro_batch_size, 0, seed, model_name, recompute)
    model = single_torch.wrap(model, device)
    return Variant(name, 0, 1, device, _torch_step(model, _sgd(model), x, y, grad_accum), _count(model), (x, y))


def _ddp(name, micro_batch_size, bucket_cap_mb, seed, model_name, recompute="none", grad_accum=1) -> Variant:
    from scaledl import distributed
    from scaledl.ladder import ddp

    dist = distributed.setup(seed=seed)
    model, x, y = model_and_batch(dist.device, micro_batch_size, dist.rank, seed, model_name, recompute)
    options = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    wrapped = ddp.wrap(model, dist.device, **options)
    return Variant(name, dist.rank, dist.world_size, dist.device,
                   _torch_step(wrapped, _sgd(wrapped), x, y, grad_accum), _count(model), (x, y))


def _horovod(name, micro_batch_size, bucket_cap_mb, seed, model_name) -> Variant:
    import horovod.torch as hvd

    from scaledl import distributed
    from scaledl.ladder import horovod_torch

    hvd.init()
    dist = distributed.setup(init_process_group=False, seed=seed)
    model, x, y = model_and_batch(dist.device, micro_batch_size, dist.rank, seed, model_name)
    model = horovod_torch.wrap(model, dist.device)
    optimizer = horovod_torch.distributed_optimizer(_sgd(model), model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return Variant(name, hvd.rank(), hvd.size(), dist.device, _torch_step(model, optimizer, x, y), _count(model),
                   (x, y))


def _fsdp(name, micro_batch_size, bucket_cap_mb, seed, model_name) -> Variant:
    from scaledl import distributed
    from scaledl.ladder import fsdp

    dist = distributed.setup(seed=seed)
    model, x, y = model_and_batch(dist.device, micro_batch_size, dist.rank, seed, model_name)
    num_params = _count(model)
    model = fsdp.wrap(model, dist.device)
    return Variant(name, dist.rank, dist.world_size, dist.device, _torch_step(model, _sgd(model), x, y), num_params,
                   (x, y))


def _deepspeed(name, micro_batch_size, bucket_cap_mb, seed, model_name) -> Variant:
    import torch.nn.functional as F

    from scaledl import Config, distributed
    from scaledl.ladder import deepspeed as deepspeed_rung

    stage, offload = DEEPSPEED_VARIANTS[name]
    dist = distributed.setup(seed=seed)
    model, x, y = model_and_batch("cpu", micro_batch_size, dist.rank, seed, model_name)
    x, y = x.to(dist.device), y.to(dist.device)
    num_params = _count(model)
    config = deepspeed_rung.deepspeed_config(Config(batch_size=micro_batch_size), stage, offload, offload,
                                             dist.world_size)
    engine, _, _ = deepspeed_rung.wrap(model, _sgd(model), None, config, dist.device)

    def step() -> None:
        engine.backward(F.cross_entropy(engine(x), y))
        engine.step()

    return Variant(name, dist.rank, dist.world_size, dist.device, step, num_params, (x, y), engine)


def _tensor_parallel(name, micro_batch_size, bucket_cap_mb, seed, model_name) -> Variant:
    from torch.distributed.device_mesh import init_device_mesh

    from scaledl import distributed
    from scaledl.ladder import tensor_parallel

    dist = distributed.setup(seed=seed)
    # Every rank of a tensor-parallel group trains on the same batch: rank 0's.
    model, x, y = model_and_batch(dist.device, micro_batch_size, 0, seed, model_name)
    num_params = _count(model)
    mesh = init_device_mesh(dist.device.type, (dist.world_size,), mesh_dim_names=("tp",))
    model = tensor_parallel.wrap(model, dist.device, mesh)
    optimizer = _sgd(model, foreach=False)  # as the rung: a GPU's foreach refuses DTensors mixed with plain tensors
    return Variant(name, dist.rank, dist.world_size, dist.device, _torch_step(model, optimizer, x, y), num_params,
                   (x, y))


def _fsdp_tp(name, micro_batch_size, bucket_cap_mb, seed, model_name) -> Variant:
    from torch.distributed.device_mesh import init_device_mesh

    from scaledl import distributed, meshes
    from scaledl.ladder import fsdp_tp

    dist = distributed.setup(seed=seed)
    tp = meshes.tp_in_node(transformer_sizes(model_name)["heads"], dist.local_world_size)
    mesh = init_device_mesh(dist.device.type, (dist.world_size // tp, tp), mesh_dim_names=("dp", "tp"))
    # The ranks of a tp row share a batch; the rows' batches differ (data parallelism).
    model, x, y = model_and_batch(dist.device, micro_batch_size, mesh["dp"].get_local_rank(), seed, model_name)
    num_params = _count(model)
    model = fsdp_tp.wrap(model, dist.device, mesh)
    return Variant(name, dist.rank, dist.world_size, dist.device, _torch_step(model, _sgd(model), x, y), num_params,
                   (x, y))
