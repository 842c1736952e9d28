"""Initialize Horovod for one framework, all-reduce each rank's number, report the result."""
from report import report
import sys

framework = sys.argv[1]
if framework == "torch":
    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
else:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    total = float(hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum).numpy()[0])
report(rank=hvd.rank(), local_rank=hvd.local_rank(), world_size=hvd.size(), allreduce_sum=total,
       mpi=hvd.mpi_enabled(), gloo=hvd.gloo_enabled())
hvd.shutdown()
