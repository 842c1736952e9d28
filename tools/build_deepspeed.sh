#!/usr/bin/env bash
# Build a DeepSpeed wheel with its CPU ops (shared-memory allreduce, CPU Adam) compiled in,
# so nothing is JIT-compiled at the first run (that takes minutes, in every rank at once).
set -euo pipefail
out=$1
venv=${VENV:-.venv}
version=$("$venv/bin/python" tools/pins.py deepspeed | sed -n 's/^deepspeed==//p')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 DS_BUILD_SHM_COMM=1 DS_ACCELERATOR=cpu
export MAX_JOBS=$(nproc)
PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" -m pip wheel --disable-pip-version-check \
    --no-build-isolation --no-deps -w "$work/dist" "deepspeed==$version"
mv "$work"/dist/deepspeed-*.whl "$out/"
