"""Launch and site tooling: starting ranks on a real machine, and knowing the machine.

`launch` (`scaledl launch`) starts N ranks of a module with the launcher the machine needs
(torchrun, mpiexec, srun, horovodrun, deepspeed), through the command lines of `launchers`;
`systems` knows Polaris, Aurora, Slurm clusters and laptops (their launchers, communication
variables, CPU and GPU binding); `jobs` (`scaledl jobs`) writes their PBS and sbatch scripts from
`templates/`; `binding` reads a node's sysfs to tell whether each rank's CPUs sit next to its GPU,
`copy_cost` measures what a far rank pays for it, and `doctor` (`scaledl doctor`) reports what this
machine has and what will go wrong.

May import: the helpers (scaledl.*) and scaledl.ladder; never scaledl.perf, scaledl.workshop or
scaledl.cli.
"""
