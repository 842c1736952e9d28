"""Lesson 9's live count of FSDP2's collectives in one forward and backward, under each setting of
`reshard_after_forward`.

For each setting the model is built afresh, the chosen layers are sharded on their own with
`fully_shard`, then the whole model (the root), all with the same setting (None: `fully_shard`'s
default, the argument left out).  One forward and backward run under torch's `CommDebugMode`
(torch.distributed.tensor.debug), which counts by op every collective issued under it, FSDP2's c10d
all-gathers and reduce-scatters among them.  Between forward and backward it also notes how many
of the layers still hold whole (not sharded) parameters.
"""
from __future__ import annotations

import warnings


def count_collectives(make_model, layers_of, x, y, settings=(None, True, False)) -> dict:
    """{str(setting): {"all_gathers", "reduce_scatters", "layers", "whole_after_forward",
    "root_holds_params"}} for one forward and backward of `make_model()` on the batch `(x, y)`,
    with `layers_of(model)` sharded each on its own under a root `fully_shard` of the whole model.
    The keys are strings because ipyparallel sorts a dict's keys, and None does not sort with bools."""
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    counted = {}
    for setting in settings:
        model = make_model()
        layers = list(layers_of(model))
        given = {} if setting is None else {"reshard_after_forward": setting}  # None: fully_shard's default
        for layer in layers:
            fully_shard(layer, **given)
        fully_shard(model, **given)  # the root: whatever parameters no layer above took
        with CommDebugMode() as comm, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # its hooks warn that the input needs no gradient
            loss = F.cross_entropy(model(x), y)
            whole = sum(not isinstance(next(layer.parameters()), DTensor) for layer in layers)  # not given back
            loss.backward()
        own = len(list(model.parameters())) - sum(len(list(layer.parameters())) for layer in layers)
        counted[str(setting)] = {**tally(comm.get_comm_counts()), "layers": len(layers), "whole_after_forward": whole,
                                 "root_holds_params": own > 0}
    return counted


def tally(comm_counts: dict) -> dict:
    """CommDebugMode's counts by op (such as `c10d._allgather_base_`, `c10d._reduce_scatter_base_`)
    summed into {"all_gathers", "reduce_scatters"}; other collectives are left out."""
    ops = {str(op).replace("_", ""): count for op, count in comm_counts.items()}
    return {"all_gathers": sum(n for op, n in ops.items() if "allgather" in op),
            "reduce_scatters": sum(n for op, n in ops.items() if "reducescatter" in op)}
