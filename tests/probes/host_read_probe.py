"""Count the reads of a tensor's value on the host (each one makes the host wait for the device) in a
real run of the single-device rung, in this process.

    python host_read_probe.py --max-steps 10 --log-interval 1000 ...

A `TorchFunctionMode` sees every call of `Tensor.item`, `.tolist` and the conversions `float()`,
`int()` and `bool()` make; the count covers the whole run (setup, training, test, summary).
"""
import sys

import torch
from torch.overrides import TorchFunctionMode

from report import report

READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__,
         torch.Tensor.__index__}


class CountReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS:
            self.reads += 1
        return func(*args, **(kwargs or {}))


from scaledl.ladder import single_torch  # noqa: E402

counter = CountReads()
with counter:
    single_torch.main(sys.argv[1:])
report(reads=counter.reads)
