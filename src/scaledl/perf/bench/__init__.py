"""Benchmarks the user runs: `scaledl bench <suite>` (or `all`), one module per suite.

    overhead   the plain loop vs DDP, Horovod and DeepSpeed at world size 1
    scaling    weak scaling, 1 -> N ranks, for every data-parallel rung
    comm       collective bandwidth, the alpha-beta model, DDP buckets, Horovod fusion
    memory     ZeRO stages: bytes counted vs formulas vs DeepSpeed's estimator
    input      the loader's throughput vs the training step's demand
    metrics    the metrics history's cost per step
    synthetic  images/s per device on random data (Horovod's synthetic benchmark)

`stats` holds the statistics, `variants` the training steps, `worker` the launched process,
`launch` how it is started, `runner` the JSON, plots and markdown.
"""
