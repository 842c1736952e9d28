"""The tensor-parallel rung with its row-wise layers' all-reduce left out: each rank goes on with its
own partial sums (RowwiseParallel's output declared Partial, so nothing reduces it): the control that
tests/ladder/test_tensor_parallel.py shows to end far from one process."""
import sys

from torch.distributed.tensor import Partial
from torch.distributed.tensor.parallel import RowwiseParallel

from scaledl.ladder import harness
from scaledl.ladder import tensor_parallel

tensor_parallel.RowwiseParallel = lambda: RowwiseParallel(output_layouts=Partial())
harness.exit_process(tensor_parallel.main(sys.argv[1:]))
