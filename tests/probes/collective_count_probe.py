"""Count the collectives one training step issues, by phase (forward, backward, step), and the elements
they move; report them with the model's parameters per module (in `model.modules()` order).

    collective_count_probe.py fsdp transformer:256,2,4,32        # the FSDP2 rung's wrap
    collective_count_probe.py tp transformer:64,2,4,8             # the tensor-parallel rung's wrap
    collective_count_probe.py zero3 64,400,400,64 '{"stage3_prefetch_bucket_size": 0}' '{}' ...

For zero3 the model is a Sequential of Linear layers of those widths, built into the DeepSpeed
rung's engine with its stage 3 config plus each JSON's settings in turn, one report each.  The
count is of the last of four steps: DeepSpeed prefetches only once it has recorded a whole step's
module order.
"""
import json
import sys
from collections import Counter

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from report import report

COLLECTIVES = ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor",
               "all_reduce")
phase, calls, numel = ["setup"], Counter(), Counter()


def counting(name):
    """torch.distributed's own function, counted: FSDP2 and DeepSpeed look it up on the module at each call."""
    original = getattr(dist, name)

    def collective(*args, **kwargs):
        key = f"{phase[0]} {name.replace('_single', '').replace('_into_tensor', '').replace('_tensor', '')}"
        calls[key] += 1
        numel[key] += (args[0] if args else next(iter(kwargs.values()))).numel()
        return original(*args, **kwargs)

    return collective


for name in COLLECTIVES:
    if hasattr(dist, name):
        setattr(dist, name, counting(name))
functional_all_reduce = funcol.all_reduce


def counted_all_reduce(tensor, *args, **kwargs):
    """DTensor (tensor parallelism) reduces through the functional collectives, looked up at each call too."""
    calls[f"{phase[0]} all_reduce"] += 1
    numel[f"{phase[0]} all_reduce"] += tensor.numel()
    return functional_all_reduce(tensor, *args, **kwargs)


funcol.all_reduce = counted_all_reduce

from scaledl import Config, distributed  # noqa: E402  (after the counting wrappers are in place)
from scaledl.perf import predict  # noqa: E402



def count(forward, backward, step) -> None:
    for _ in range(4):
        calls.clear()
        numel.clear()
        phase[0] = "forward"
        loss = forward()
        phase[0] = "backward"
        backward(loss)
        phase[0] = "step"
        step()
        phase[0] = "setup"


variant, model_arg = sys.argv[1], sys.argv[2]
setup = distributed.setup(seed=0)
if variant == "fsdp":
    from scaledl.perf.bench.variants import model_and_batch
    from scaledl.ladder import fsdp

    model, x, y = model_and_batch(setup.device, 4, setup.rank, 0, model_arg)
    top_level = [sum(p.numel() for p in layer.parameters()) for layer in model]
    wrapped = fsdp.wrap(model, setup.device)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01)

    def backward(loss):
        optimizer.zero_grad()
        loss.backward()

    count(lambda: F.cross_entropy(wrapped(x), y), backward, optimizer.step)
    report(rank=setup.rank, world_size=setup.world_size, top_level=top_level, calls=dict(calls), numel=dict(numel))
elif variant == "tp":
    from torch.distributed.device_mesh import init_device_mesh

    from scaledl.perf.bench.variants import model_and_batch
    from scaledl.ladder import tensor_parallel

    model, x, y = model_and_batch(setup.device, 4, 0, 0, model_arg)
    mesh = init_device_mesh(setup.device.type, (setup.world_size,), mesh_dim_names=("tp",))
    wrapped = tensor_parallel.wrap(model, setup.device, mesh)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01, foreach=False)

    def backward(loss):
        optimizer.zero_grad()
        loss.backward()

    count(lambda: F.cross_entropy(wrapped(x), y), backward, optimizer.step)
    report(rank=setup.rank, world_size=setup.world_size, micro_batch_size=4, calls=dict(calls), numel=dict(numel))
else:
    from scaledl.ladder import deepspeed as deepspeed_rung

    widths = [int(w) for w in model_arg.split(",")]
    for settings in sys.argv[3:]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:])))
        units, backward_order = predict.module_orders(model)
        config = deepspeed_rung.deepspeed_config(Config(batch_size=4), 3, world_size=setup.world_size)
        config["zero_optimization"].update(json.loads(settings))
        engine, _, _ = deepspeed_rung.wrap(model, torch.optim.SGD(model.parameters(), lr=0.01), None, config,
                                           setup.device)
        x, y = torch.randn(4, widths[0]), torch.randn(4, widths[-1])
        count(lambda: F.mse_loss(engine(x), y), engine.backward, engine.step)
        report(rank=setup.rank, world_size=setup.world_size, settings=json.loads(settings), units=units,
               backward_order=backward_order, calls=dict(calls), numel=dict(numel))
        engine.destroy()
# Leave as the rungs do (scaledl.distributed.exit_process): every group's collectives finished, past gloo's
# workers, without interpreter finalization, which can abort a finished rank while a group is still held.
distributed.teardown()
distributed.exit_process(0)
