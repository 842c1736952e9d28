"""Write checkpoints of a ~40 MB model in a loop until killed: `python checkpoint_writer.py PATH`.

Every tensor of checkpoint N holds the value N, so a reader can tell a whole checkpoint from
a mix of two.
"""
import sys

import torch

from scaledl import checkpoint

path = sys.argv[1]
for step in range(1, 10_000):
    state = {f"layer{i}": torch.full((1_000_000,), float(step)) for i in range(10)}
    checkpoint.save(path, model=state, step=step)
    print("saved", step, flush=True)
