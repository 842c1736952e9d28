#!/usr/bin/env bash
# Create .venv with every pinned framework, Open MPI and Horovod; safe to run again.
# Called by `make setup`; the Makefile skips it when nothing it depends on has changed.
# On Polaris or Aurora (`make setup SYSTEM=polaris|aurora` sets SCALEDL_SYSTEM) it hands over to
# tools/setup_site.sh, which puts a venv on top of the site's framework module instead.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv
system=${SCALEDL_SYSTEM:-}
# A venv made over a site module remembers it, so a later plain `make setup` there does not
# install a second torch into it.
[ -n "$system" ] || system=$(cat "$venv/scaledl-site" 2>/dev/null || echo local)
if [ "$system" != local ]; then
    exec bash tools/setup_site.sh "$system" --venv "$venv"
fi

python=${PYTHON:-python3}
# The interpreter first, before anything is installed: the pins exist for Python 3.10-3.13 only.
if ! command -v "$python" >/dev/null; then
    echo "setup: error: no '$python' on PATH: install Python 3.10-3.13 (apt-get install python3 python3-venv)," \
         "or point at one with PYTHON=/path/to/python3 make setup" >&2
    exit 2
fi
# (Python 2.7 on: the question must be answerable by any interpreter the name finds.)
if ! found=$("$python" -c 'import sys; print("%d %d" % sys.version_info[:2])' 2>&1); then
    echo "setup: error: '$python' does not run ($(head -1 <<< "$found")): point at a Python 3.10-3.13 with" \
         "PYTHON=/path/to/python3 make setup" >&2
    exit 2
fi
read -r major minor <<< "$found"
if [ "$major" -lt 3 ] || { [ "$major" -eq 3 ] && [ "$minor" -lt 7 ]; }; then
    echo "setup: error: this is Python $major.$minor ($(command -v "$python")); the pinned stack needs Python 3.10" \
         "to 3.13: point at another with PYTHON=python3.13 make setup, or use conda's environment.yml" >&2
    exit 2
fi
"$python" tools/pins.py --check-python || exit 2
if [ ! -x "$venv/bin/python" ] && ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "setup: error: $("$python" -V 2>&1) cannot make a venv (Debian and Ubuntu ship that part apart):" \
         "apt-get install python3-venv, then make setup again" >&2
    exit 2
fi
cache=${SCALEDL_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaledl/wheels}
log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Horovod and mpi4py need an MPI with its headers; Debian's Open MPI is the one we test.
if ! command -v mpirun >/dev/null || ! command -v mpicxx >/dev/null; then
    log "installing Open MPI from Debian's packages"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi
# The test tiers' schedulers: a one-node Slurm cluster (tools/slurm_cluster.sh, tests/hpc/test_slurm.py)
# and MPICH's hydra mpiexec, used by its full path /usr/bin/mpiexec.mpich (tests/hpc/test_mpich.py).
# Debian ranks MPICH's alternatives below Open MPI's (priority 40 against 50), so mpirun, mpicc
# and libmpi.so stay Open MPI's, which Horovod and mpi4py are built and run with: checked below.
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || [ ! -x /usr/bin/mpiexec.mpich ]; then
    if command -v apt-get >/dev/null; then
        log "installing Slurm, munge and MPICH from Debian's packages (for the slurm and mpich tests)"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge mpich >/dev/null
    else
        log "no apt-get here: the slurm and mpich tests will be skipped"
    fi
fi
if ! mpirun --version 2>&1 | grep -q "Open MPI"; then
    echo "setup: error: mpirun is $(readlink -f "$(command -v mpirun)"), not Open MPI's: run" \
         "'update-alternatives --set mpirun /usr/bin/mpirun.openmpi' (and --set mpi /usr/bin/mpicc.openmpi)" >&2
    exit 2
fi
bash tools/install_chromium.sh  # Debian's Chromium for the browser test (tests/workshop/test_browser.py)

[ -x "$venv/bin/python" ] || { log "creating $venv"; "$python" -m venv "$venv"; }
# Every install is held to the exact versions of constraints.txt; pyproject.toml only has ranges.
# (Some machines configure index paths that do not exist; pip warns once per package about them.)
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@" -c constraints.txt \
            2> >(grep -v 'is ignored: it is neither' >&2); }
pins() { "$venv/bin/python" tools/pins.py "$@"; }

log "installing torch and TensorFlow (needed before Horovod and DeepSpeed are built)"
mapfile -t before_builds < <(pins core torch tensorflow mpi; pins horovod | grep -v '^horovod=='
                              pins deepspeed | grep -v '^deepspeed==')
pip install "${before_builds[@]}" wheel

# Both compiled packages are built once per set of inputs into a cache outside the clone, so a
# fresh clone (as CI uses) only installs the cached wheels.  The inputs include the exact torch
# build (2.13.0+cpu and 2.13.0+cu130 are different ABIs) and whether a GPU asks for NCCL.
built_against=$("$venv/bin/python" -c 'import sys, torch, tensorflow as tf
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}),",
      f"tensorflow {tf.__version__}")' 2>/dev/null)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
key=$( { cat tools/build_horovod.sh tools/build_deepspeed.sh; pins torch tensorflow horovod deepspeed
         echo "$built_against, gpus: $((gpus > 0)), ${HOROVOD_GPU_OPERATIONS:-}"; mpirun --version | head -1; } |
       sha256sum | cut -c1-12)
wheels="$cache/$key"
mkdir -p "$wheels"
echo "$built_against, GPUs: $gpus, $(mpirun --version | head -1)" > "$wheels/built-against.txt"
if ! ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
    log "building Horovod against $built_against into $wheels (about 4.4 min on 2 cores, once: README, Setup times)"
    VENV="$venv" bash tools/build_horovod.sh "$wheels"
fi
if ! ls "$wheels"/deepspeed-*.whl >/dev/null 2>&1; then
    log "building DeepSpeed with its CPU ops into $wheels (about 2.5 min, once)"
    VENV="$venv" bash tools/build_deepspeed.sh "$wheels"
fi

log "installing Horovod, DeepSpeed, the notebook and test tools, and scaledl (editable)"
pip install --no-deps "$wheels"/horovod-*.whl "$wheels"/deepspeed-*.whl
mapfile -t rest < <(pins deepspeed horovod tensorboard notebooks test)
pip install "${rest[@]}" -e ".[torch,tensorflow,tensorboard,mpi,horovod,deepspeed,notebooks,test]"
log "done: $("$venv/bin/python" -c 'import torch, tensorflow as tf, horovod, deepspeed
print(f"torch {torch.__version__}, tensorflow {tf.__version__}, horovod {horovod.__version__},",
      f"deepspeed {deepspeed.__version__}")' 2>/dev/null | tail -1)"
