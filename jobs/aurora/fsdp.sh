#!/bin/bash -l
#PBS -A YOUR_PROJECT
#PBS -q debug
#PBS -l select=2
#PBS -l place=scatter
#PBS -l walltime=00:30:00
#PBS -l filesystems=home:flare
#PBS -N scaledl-fsdp
#PBS -j oe
#PBS -k doe
#
# The ladder's fsdp rung on aurora.
# Written by `scaledl jobs` from scaledl/hpc/templates/job.sh.template, the one template of every
# job script: change the template or the flags of `scaledl jobs`, not this file.
#
# Submit from the directory that holds your runs:  qsub -A YOUR_PROJECT jobs/aurora/fsdp.sh
# See each launch without running it (outside a job, from a file of host names, one per line):
#   PBS_NODEFILE=hosts.txt SCALEDL_LAUNCH_FLAGS=--dry-run bash jobs/aurora/fsdp.sh
# `scaledl launch` builds the mpiexec command and exports aurora's recommended
# communication variables unless you set them first; --dry-run prints both.
set -eo pipefail
if [ -z "${PBS_NODEFILE:-}" ]; then
    echo "$0: PBS_NODEFILE is not set (not inside a job): submit it with qsub, or see its launch with" \
        "PBS_NODEFILE=hosts.txt SCALEDL_LAUNCH_FLAGS=--dry-run bash $0 (hosts.txt: host names, one per line)" >&2
    exit 2
fi
cd "${PBS_O_WORKDIR:-.}"

# Aurora: the frameworks module has PyTorch for Intel GPUs (XPU), oneCCL and MPICH.
if command -v module >/dev/null 2>&1; then
    module load frameworks
fi

# The Python environment that has scaledl: $SCALEDL_VENV, else .venv in this directory, which
# `make setup SYSTEM=aurora` makes over the module loaded above (nothing of it reinstalled).
SCALEDL_VENV=${SCALEDL_VENV:-$PWD/.venv}
if [ ! -f "$SCALEDL_VENV/bin/activate" ]; then
    echo "error: no Python environment at $SCALEDL_VENV: run 'make setup SYSTEM=aurora' in your clone" \
         "and submit from there, or export SCALEDL_VENV=<that clone>/.venv" >&2
    exit 2
fi
# shellcheck source=/dev/null
source "$SCALEDL_VENV/bin/activate"

NNODES=$(sort -u "$PBS_NODEFILE" | wc -l)
PPN=12
# Extra flags for `scaledl launch` (e.g. --dry-run) and for the rung (e.g. "--epochs 1").
read -ra launch_flags <<< "${SCALEDL_LAUNCH_FLAGS:-}"
read -ra run_flags <<< "${SCALEDL_RUN_FLAGS:-}"

node_counts=("$NNODES")
for nodes in "${node_counts[@]}"; do
    out="runs/fsdp/${nodes}nodes"
    # A requeued or resubmitted job goes on from the checkpoint its last run left there.
    resume=()
    if [ -e "$out/checkpoint.pt" ] || [ -d "$out/checkpoint" ]; then resume=(--resume); fi
    scaledl launch --system aurora -n "$((nodes * PPN))" --ppn "$PPN" "${launch_flags[@]}" \
        -- scaledl.ladder.fsdp --out-dir "$out" "${resume[@]}" "${run_flags[@]}"
done
