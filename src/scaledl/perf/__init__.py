"""Prediction and benchmarks: a training step's time predicted before it runs, and measured after.

`predict` is the step-time model (compute plus the communication left exposed, per strategy:
DDP's buckets, Horovod's fusion, ZeRO 1-3 as DeepSpeed issues its collectives, FSDP2, tensor
parallelism) with `scaledl predict` over it (`predict_cli`); `comm_estimate` is the arithmetic
lessons 6 and 8 do before they measure; `bench` (`scaledl bench`) times the rungs' own steps and
checks the predictions against them.  ZeRO's memory formula is a helper (`scaledl.zero_memory`),
since the harness counts with it.

May import: the helpers (scaledl.*), scaledl.ladder and scaledl.hpc; never scaledl.workshop or
scaledl.cli.
"""
