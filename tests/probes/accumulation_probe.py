"""Count the gradient reductions a rung's run issues, with --grad-accum or without: the real rung's
`main`, its gradient collective counted where it happens.  Reports the count.

    torchrun --nproc_per_node=2 accumulation_probe.py ddp  --epochs 1 --train-limit 512 --grad-accum 4 ...
    torchrun --nproc_per_node=2 accumulation_probe.py fsdp --epochs 1 --train-limit 512 --grad-accum 4 ...

DDP's buckets are all-reduced by its C++ reducer, which calls a registered communication hook
instead: the probe registers one that counts, then does what the default does (all-reduce and
average).  FSDP2 reduce-scatters through `torch.distributed`'s reduce-scatter, looked up at each
call: the probe counts those.  Reports the count and the optimizer steps the run took.
"""
import sys

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from report import report
from scaledl.ladder import harness

rung_name, argv = sys.argv[1], sys.argv[2:]
count = [0]

if rung_name == "ddp":
    from scaledl.ladder import ddp as rung

    plain_wrap = rung.wrap

    def counting_hook(state, bucket):
        count[0] += 1
        return default_hooks.allreduce_hook(state, bucket)

    def wrap(model, device, **options):
        wrapped = plain_wrap(model, device, **options)
        wrapped.register_comm_hook(None, counting_hook)
        return wrapped

    rung.wrap = wrap
else:
    from scaledl.ladder import fsdp as rung

    def counting(plain):
        def reduce_scatter(*args, **kwargs):
            count[0] += 1
            return plain(*args, **kwargs)
        return reduce_scatter

    # FSDP2 calls reduce_scatter_single in torch 2.13 (_fsdp_collectives.py); earlier ones, reduce_scatter_tensor.
    for name in ("reduce_scatter_tensor", "reduce_scatter_single"):
        if hasattr(dist, name):
            setattr(dist, name, counting(getattr(dist, name)))

code = rung.main(argv)
report(reductions=count[0])
# As the rungs leave: past gloo's workers, without interpreter finalization (see harness.exit_process).
harness.exit_process(code)
