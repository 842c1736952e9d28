#!/usr/bin/env bash
# Put scaledl on top of a site's framework module: a venv made with --system-site-packages over
# the module's Python, holding scaledl and only what the module lacks.  Never a second torch,
# TensorFlow or DeepSpeed: a pip copy would lack the site's CUDA/XPU, NCCL/oneCCL and MPI builds.
#
#   tools/setup_site.sh polaris|aurora|slurm|site [--venv DIR] [--python PYTHON] [--extras LIST]
#                       [--horovod] [--dry-run]
#
#   polaris   module use /soft/modulefiles; module load conda; conda activate base
#   aurora    module load frameworks
#   site, slurm  no module loaded here: the Python given by --python (default python3 on PATH), e.g.
#             the module of another cluster that you have loaded yourself
#   --horovod build Horovod against the module's torch (Polaris: with NCCL, from the CUDA toolkit and
#             NCCL the module provides; Aurora's frameworks module has no Horovod for PyTorch)
#   --dry-run print the commands, run nothing
# `make setup SYSTEM=polaris` runs this with --venv .venv; set HOROVOD=1 for --horovod.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "error: $*" >&2; exit 2; }
usage="usage: tools/setup_site.sh polaris|aurora|slurm|site [--venv DIR] [--python PYTHON] [--extras LIST]"
usage+=" [--horovod] [--dry-run]"
[ $# -ge 1 ] || fail "$usage"
system=$1
shift
venv=.venv python=python3 extras=mpi,notebooks horovod=${HOROVOD:-0} dry_run=0
# value OPTION VALUE: VALUE, unless it is missing or is the next option.
value() { [ -n "${2:-}" ] && [[ $2 != --* ]] || fail "$1 needs a value; $usage"; echo "$2"; }
while [ $# -gt 0 ]; do
    case $1 in
        --venv) venv=$(value "$@"); shift ;;
        --python) python=$(value "$@"); shift ;;
        --extras) extras=${2?--extras needs a list (may be empty)}; shift ;;
        --horovod) horovod=1 ;;
        --dry-run) dry_run=1 ;;
        *) fail "unknown argument $1; $usage" ;;
    esac
    shift
done
case $system in
    polaris) modules=("module use /soft/modulefiles" "module load conda" "conda activate base") ;;
    aurora) modules=("module load frameworks") ;;
    site | slurm) modules=() ;;
    *) fail "unknown system '$system': use polaris, aurora, slurm or site; $usage" ;;
esac
if [ "$horovod" = 1 ] && [ "$system" = aurora ]; then
    fail "Aurora's frameworks module has no Horovod for PyTorch and Horovod does not build for XPU;" \
         "run the horovod_tf rung in Aurora's TensorFlow module, which carries Horovod"
fi

log() { [ "$dry_run" = 1 ] || printf '[setup %s %s] %s\n' "$system" "$(date +%H:%M:%S)" "$*"; }
# Print a command as it could be pasted into a shell.
show() {
    local words=() word
    for word in "$@"; do
        if [[ $word =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then words+=("$word"); else words+=("'$word'"); fi
    done
    echo "${words[*]}"
}
step() { if [ "$dry_run" = 1 ]; then show "$@"; else "$@"; fi; }
# step_to FILE CMD...: CMD's output into FILE.
step_to() {
    local file=$1
    shift
    if [ "$dry_run" = 1 ]; then echo "$(show "$@") > $file"; else "$@" > "$file"; fi
}

# 1. The site's module, in this shell (module and conda are shell functions).
for command in "${modules[@]}"; do
    if [ "$dry_run" = 1 ]; then echo "$command"; continue; fi
    if ! type module >/dev/null 2>&1; then
        for init in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh /usr/share/lmod/lmod/init/bash; do
            # shellcheck source=/dev/null
            [ -r "$init" ] && source "$init" && break
        done
    fi
    type module >/dev/null 2>&1 || fail "no 'module' command here: run this on a $system login node"
    log "$command"
    set +u  # module files and conda's activate read unset variables
    eval "$command"
    set -u
done
[ "$dry_run" = 1 ] || command -v "$python" >/dev/null || fail "no $python on PATH after loading the module"

# 2. The venv, seeing every package of the module.
log "creating $venv over $(command -v "$python" || echo "$python") (--system-site-packages)"
step "$python" -m venv --system-site-packages "$venv"
# The venv remembers its site at once, so that a plain `make setup` later never installs the local stack in it.
step_to "$venv/scaledl-site" echo "$system"
# 3. What the module has, exactly: installing into the venv may add packages, never change these.
step_to "$venv/site-constraints.txt" "$python" tools/pins.py --site
# 4. scaledl and what the module lacks.  The frameworks' extras are never asked for; mpi4py, if
#    the module lacks it, is built against the site's MPI rather than taken as a wheel with its own.
log "installing scaledl (editable) and what the module lacks"
spec=.
[ -z "$extras" ] || spec=".[$extras]"
step "$venv/bin/python" -m pip install --disable-pip-version-check -q -c "$venv/site-constraints.txt" \
    --no-binary mpi4py -e "$spec"
# 5. Horovod, built against the module's torch (and TensorFlow, if the module has it).
if [ "$horovod" = 1 ]; then
    build_env=(env "VENV=$venv")
    [ "$system" = polaris ] && build_env+=(CC=cc CXX=CC HOROVOD_GPU_OPERATIONS=NCCL)
    log "building Horovod against the module's frameworks"
    step mkdir -p "$venv/wheels"
    step "${build_env[@]}" bash tools/build_horovod.sh "$venv/wheels"
    wheel="$venv/wheels/horovod-*.whl"
    [ "$dry_run" = 1 ] || wheel=$(ls -t "$venv"/wheels/horovod-*.whl | head -1)
    step "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps "$wheel"
    step "$venv/bin/python" -m pip install --disable-pip-version-check -q -c "$venv/site-constraints.txt" \
        -e ".[horovod]"
fi
# 6. Check that the venv holds no second copy of anything the module has.
step "$venv/bin/python" tools/site_report.py "$venv"
