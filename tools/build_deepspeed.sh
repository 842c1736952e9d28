#!/usr/bin/env bash
# Build a DeepSpeed wheel with its ops compiled in, so nothing is JIT-compiled at the first run
# (that takes minutes, in every rank at once): the CPU ops (shared-memory allreduce, CPU Adam)
# here, CPU Adam and fused Adam for the GPUs when a GPU and a CUDA torch are here.
set -euo pipefail
out=$1
venv=${VENV:-.venv}
python="$venv/bin/python"
version=$("$python" "$(dirname "$0")/pins.py" --pin deepspeed | sed 's/^deepspeed==//')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
torch_cuda=$("$python" -c 'import torch; print(torch.version.cuda or "")')
if [ -n "$torch_cuda" ] && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
        # nvcc says where its toolkit is (`nvcc` on PATH may be a wrapper script or a symlink).
        toolkit=$(nvcc --dryrun -v -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
        export CUDA_HOME=$(readlink -f "$toolkit")
    fi
    export DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 DS_BUILD_FUSED_ADAM=1 DS_ACCELERATOR=cuda
else
    export DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 DS_BUILD_SHM_COMM=1 DS_ACCELERATOR=cpu
fi
export MAX_JOBS=${BUILD_JOBS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}  # at most 4 compilers: see build_horovod.sh
echo "building deepspeed $version for accelerator $DS_ACCELERATOR (torch CUDA ${torch_cuda:-none})"
# --no-cache-dir: never take a wheel pip built earlier against another torch.
PATH="$(cd "$venv/bin" && pwd):$PATH" "$python" -m pip wheel --disable-pip-version-check --no-cache-dir \
    --no-build-isolation --no-deps -w "$work/dist" "deepspeed==$version"
mv "$work"/dist/deepspeed-*.whl "$out/"
