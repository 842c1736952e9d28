#!/bin/bash -l
#SBATCH --job-name=scaledl-deepspeed
#SBATCH --account=YOUR_PROJECT
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --exclusive
#SBATCH --time=00:30:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
#
# The ladder's deepspeed rung on slurm.
# Written by `scaledl jobs` from scaledl/hpc/templates/job.sh.template, the one template of every
# job script: change the template or the flags of `scaledl jobs`, not this file.
#
# Submit from the directory that holds your runs:  sbatch -A YOUR_PROJECT jobs/slurm/deepspeed.sh
# See each launch without running it:
#   SCALEDL_LAUNCH_FLAGS=--dry-run bash jobs/slurm/deepspeed.sh
# `scaledl launch` builds the srun command; --dry-run prints it (a Slurm cluster
# has no communication presets here: export your site's NCCL variables in the set-up above).
set -eo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"

# Load your site's CUDA and MPI modules here (module load ...).
# The Horovod rungs need MPI in every task: where srun starts tasks without an MPI plugin
# (scontrol show config | grep MpiDefault says none), export SLURM_MPI_TYPE=pmix (srun --mpi=pmix).
# The other rungs need no MPI under srun.

# The Python environment that has scaledl: $SCALEDL_VENV, else .venv in this directory, which
# `make setup SYSTEM=slurm` makes over the Python of the modules you load above (nothing of it reinstalled).
SCALEDL_VENV=${SCALEDL_VENV:-$PWD/.venv}
if [ ! -f "$SCALEDL_VENV/bin/activate" ]; then
    echo "error: no Python environment at $SCALEDL_VENV: run 'make setup SYSTEM=slurm' in your clone" \
         "and submit from there, or export SCALEDL_VENV=<that clone>/.venv" >&2
    exit 2
fi
# shellcheck source=/dev/null
source "$SCALEDL_VENV/bin/activate"

NNODES=${SLURM_JOB_NUM_NODES:-1}
PPN=4
# Extra flags for `scaledl launch` (e.g. --dry-run) and for the rung (e.g. "--epochs 1").
read -ra launch_flags <<< "${SCALEDL_LAUNCH_FLAGS:-}"
read -ra run_flags <<< "${SCALEDL_RUN_FLAGS:-}"

node_counts=("$NNODES")
# Near the time limit Slurm sends this script SIGUSR1 (#SBATCH --signal): it passes the signal on to
# the ranks, which save a checkpoint at the next metrics line (keep --log-interval steps well under
# 120 s) and stop; then the job requeues itself and, run again, resumes from that checkpoint.
requeue=""
on_time_limit() {
    echo "time limit near: the ranks save a checkpoint and stop, then job $SLURM_JOB_ID is requeued" >&2
    requeue=1
    scancel --signal=USR1 "$SLURM_JOB_ID"  # the job's steps (the ranks), not this script
}
trap on_time_limit USR1
for nodes in "${node_counts[@]}"; do
    if [ -n "$requeue" ]; then break; fi  # the warning came: start nothing more
    out="runs/deepspeed/${nodes}nodes"
    # A requeued or resubmitted job goes on from the checkpoint its last run left there.
    resume=()
    if [ -e "$out/checkpoint.pt" ] || [ -d "$out/checkpoint" ]; then resume=(--resume); fi
    scaledl launch --system slurm -n "$((nodes * PPN))" --ppn "$PPN" "${launch_flags[@]}" \
        -- scaledl.ladder.deepspeed --zero-stage 0 --out-dir "$out" "${resume[@]}" "${run_flags[@]}" &
    launch_pid=$!
    status=0
    wait "$launch_pid" || status=$?
    if [ -n "$requeue" ]; then
        # Ranks still starting when the warning came missed it: pass it on until they stop.
        while kill -0 "$launch_pid" 2>/dev/null; do
            sleep 5
            if kill -0 "$launch_pid" 2>/dev/null; then
                scancel --signal=USR1 "$SLURM_JOB_ID"
            fi
        done
        wait "$launch_pid" || true
        break
    fi
    if [ "$status" -ne 0 ]; then exit "$status"; fi
done
if [ -n "$requeue" ]; then
    scontrol requeue "$SLURM_JOB_ID"
fi
