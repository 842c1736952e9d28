"""The workshop: what the lessons in notebooks/ and solutions/ run on, and nothing a training script needs.

`engines` starts live ranks for a notebook (ipyparallel engines launched the way a job launches
its ranks: Open MPI on a laptop, PALS's mpiexec on Polaris and Aurora, srun on Slurm); `checks`
holds each lesson's exercise checks, one module per lesson; `exercises` generates exercises/ from
solutions/; `plots`, `async_timeline`, `fsdp_timeline` and `traces` draw the lessons' figures from
what they measure; `deepspeed_windows` records a DeepSpeed engine's accumulation windows for lesson 8;
`recipes` prints the Polaris and Aurora lines a lesson shows.

May import: everything below it (the helpers, scaledl.ladder, scaledl.hpc, scaledl.perf); never
scaledl.cli.
"""
