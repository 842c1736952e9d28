#!/usr/bin/env bash
# Build a Horovod 0.28.1 wheel into $1 against the torch and TensorFlow of $VENV (default .venv),
# with Gloo and MPI; with CUDA code when torch is a CUDA build, and NCCL operations when a GPU is
# here (or HOROVOD_GPU_OPERATIONS=NCCL asks for them).
#
# Its last release pins C++14 in its CMakeLists, but PyTorch's and TensorFlow's headers need
# C++17, and torch 2.14's C++20 (horovod issues #3996, #3941, fixed on master, never released);
# CXXFLAGS cannot override it because CMake appends its own -std flag last.  A CMake toolchain
# file that remaps CMake's C++14 compile option fixes that without patching Horovod.
set -euo pipefail
out=$1
venv=${VENV:-.venv}
python="$venv/bin/python"
version=$("$python" "$(dirname "$0")/pins.py" --pin horovod | sed 's/^horovod==//')
fail() { echo "error: $*" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# What this venv has decides what gets built: a framework that is absent is switched off, not failed.
torch_cuda=$("$python" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null) && has_torch=1 || has_torch=0
"$python" -c 'import tensorflow' 2>/dev/null && has_tf=1 || has_tf=0
[ $has_torch = 1 ] || [ $has_tf = 1 ] || fail "$venv has neither torch nor tensorflow: install one before Horovod"
if [ $has_torch = 1 ]; then export HOROVOD_WITH_PYTORCH=1; else export HOROVOD_WITHOUT_PYTORCH=1; fi
if [ $has_tf = 1 ]; then export HOROVOD_WITH_TENSORFLOW=1; else export HOROVOD_WITHOUT_TENSORFLOW=1; fi

std=17
torch_include=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))' \
                2>/dev/null || true)
# torch >= 2.14's headers use C++20 (std::strong_ordering); older ones build with C++17.
if [ -n "$torch_include" ] && grep -qs strong_ordering "$torch_include/c10/util/intrusive_ptr.h"; then std=20; fi
cat > "$work/cxx-rules.cmake" <<CMAKE
set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++$std")
set(CMAKE_CXX14_EXTENSION_COMPILE_OPTION "-std=gnu++$std")
CMAKE
# GCC 13 and later no longer include <stdexcept> and <cstdint> through other standard headers, and
# Horovod's horovod/common/common.h uses std::logic_error without including it (Debian 13's GCC 14
# stops there): force both headers into every C++ file instead of patching Horovod.
cat > "$work/toolchain.cmake" <<CMAKE
set(CMAKE_USER_MAKE_RULES_OVERRIDE_CXX "$work/cxx-rules.cmake")
set(CMAKE_CXX_FLAGS_INIT "-include stdexcept -include cstdint")
CMAKE
export CMAKE_TOOLCHAIN_FILE="$work/toolchain.cmake"
if [ $has_tf = 1 ]; then
    # TensorFlow >= 2.19 moved headers that Horovod's horovod/tensorflow/xla_mpi_ops.cc includes:
    # XLA's builder now lives at xla/hlo/builder/xla_builder.h (a one-line forwarding header at the
    # old path fixes it), and highwayhash and farmhash sit under the wheel's include/external/.
    tf_include=$("$python" -c 'import tensorflow as tf; print(tf.sysconfig.get_include())' 2>/dev/null)
    old=tensorflow/compiler/xla/client/xla_builder.h
    if [ ! -e "$tf_include/$old" ] && [ -e "$tf_include/xla/hlo/builder/xla_builder.h" ]; then
        mkdir -p "$work/include/$(dirname "$old")"
        echo '#include "xla/hlo/builder/xla_builder.h"' > "$work/include/$old"
        CPLUS_INCLUDE_PATH="$work/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
    fi
    for folder in external/highwayhash external/farmhash_archive/src; do
        if [ -d "$tf_include/$folder" ]; then
            CPLUS_INCLUDE_PATH="${CPLUS_INCLUDE_PATH:+$CPLUS_INCLUDE_PATH:}$tf_include/$folder"
        fi
    done
    export CPLUS_INCLUDE_PATH=${CPLUS_INCLUDE_PATH:-}
fi
export HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_MXNET=1
# At most 4 compilers at once (BUILD_JOBS to change it): a shared login node, where this build runs on
# Polaris and Aurora, is not ours to fill (a Polaris login node gives a user 8 cores: ALCF docs/polaris/system-updates.md).
export MAKEFLAGS="-j${BUILD_JOBS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}"

if [ -n "${torch_cuda:-}" ]; then
    # A CUDA torch that finds a toolkit makes Horovod compile its CUDA code (no variable switches
    # that off), so it needs the toolkit's headers and cudart: the caller's CUDA_HOME, else the nvcc on PATH.
    toolkit=${HOROVOD_CUDA_HOME:-${CUDA_HOME:-}}
    if [ -z "$toolkit" ] && command -v nvcc >/dev/null; then
        # nvcc says where its toolkit is (`nvcc` on PATH may be a wrapper script or a symlink).
        toolkit=$(nvcc --dryrun -v -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
        toolkit=$(readlink -f "$toolkit")
    fi
    # Horovod compiles CUDA code for a CUDA torch only where torch itself finds a toolkit
    # (FindPytorch.cmake: torch.version.cuda and torch.utils.cpp_extension.CUDA_HOME, which is
    # $CUDA_HOME, the nvcc on PATH or /usr/local/cuda).  A machine with none, and no GPU (PyPI's
    # CUDA torch on a fresh laptop or CI box), gets the CPU build: Gloo and MPI on CPU tensors.
    torch_toolkit=$("$python" -c 'from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME or "")' \
                    2>/dev/null | tail -1)
    gpus_here=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    if [ -z "$toolkit" ] && [ -z "$torch_toolkit" ] && [ "$gpus_here" -eq 0 ] && [ -z "${HOROVOD_GPU_OPERATIONS:-}" ]; then
        echo "note: torch is a CUDA $torch_cuda build, but this machine has no CUDA toolkit and no GPU: Horovod is" \
             "built for CPU tensors (Gloo, MPI); on GPU nodes install a CUDA $torch_cuda toolkit (nvcc) first" >&2
        torch_cuda=""
    else
        toolkit=${toolkit:-$torch_toolkit}
        [ -n "$toolkit" ] && [ -e "$toolkit/include/cuda_runtime.h" ] ||
            fail "torch ${torch_cuda:+(CUDA $torch_cuda) }is a CUDA build, and Horovod then compiles CUDA code:" \
                 "install a CUDA $torch_cuda toolkit (nvcc) or set CUDA_HOME to one"
        export CUDA_HOME=$toolkit HOROVOD_CUDA_HOME=$toolkit
    fi
fi
if [ -n "${torch_cuda:-}" ]; then
    if [ -z "${HOROVOD_GPU_OPERATIONS:-}" ] && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
        export HOROVOD_GPU_OPERATIONS=NCCL
    fi
    if [ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ] && [ -z "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ]; then
        # Horovod's own GPU list has architectures that CUDA 13 dropped: build for the ones torch was built for.
        HOROVOD_BUILD_CUDA_CC_LIST=$("$python" -c 'import torch
print(",".join(a.split("_")[1] for a in torch.cuda.get_arch_list() if a.startswith("sm_")))')
        export HOROVOD_BUILD_CUDA_CC_LIST
    fi
    if [ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ] && [ -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_INCLUDE:-}" ]; then
        # PyPI's CUDA torch brings NCCL as the nvidia-nccl wheel (libnccl.so.2, no libnccl.so link):
        # give Horovod's CMake the layout it searches, a folder with include/ and lib/.
        nccl_h=$("$python" - <<'PY'
import glob, os, site
for root in site.getsitepackages():
    for found in sorted(glob.glob(os.path.join(root, "nvidia", "**", "include", "nccl.h"), recursive=True)):
        print(found)
        raise SystemExit
PY
)
        [ -n "$nccl_h" ] || fail "HOROVOD_GPU_OPERATIONS=NCCL but no NCCL here: set HOROVOD_NCCL_HOME to one"
        nccl=$(dirname "$(dirname "$nccl_h")")
        mkdir -p "$work/nccl/lib"
        ln -s "$nccl/include" "$work/nccl/include"
        for library in "$nccl"/lib/libnccl.so*; do ln -s "$library" "$work/nccl/lib/"; done
        [ -e "$work/nccl/lib/libnccl.so" ] ||
            ln -s "$(ls "$nccl"/lib/libnccl.so.* | head -1)" "$work/nccl/lib/libnccl.so"
        export HOROVOD_NCCL_HOME="$work/nccl" HOROVOD_NCCL_LINK=SHARED
        # torch loads that libnccl itself, TensorFlow does not: Horovod's libraries find it beside
        # them in site-packages (horovod/<framework>/ -> nvidia/nccl/lib).
        echo 'set(CMAKE_BUILD_RPATH "$ORIGIN/../../nvidia/nccl/lib")' >> "$work/toolchain.cmake"
    fi
    if [ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ] && [ $has_tf = 1 ] &&
       [ "$("$python" -c 'import tensorflow as tf; print(tf.test.is_built_with_cuda())' 2>/dev/null)" != True ]; then
        # Horovod's NCCL build of its TensorFlow part calls TensorFlow's GPU kernels, which
        # tensorflow-cpu lacks (the library would not load): leave that part out rather than break it.
        echo "note: this TensorFlow has no GPU kernels (tensorflow-cpu): Horovod is built without its TensorFlow" \
             "part; install TensorFlow with GPU support to run horovod_tf on the GPUs" >&2
        has_tf=0
        unset HOROVOD_WITH_TENSORFLOW
        export HOROVOD_WITHOUT_TENSORFLOW=1
    fi
else
    # A CPU torch build: keep Horovod from switching its CUDA code on because nvcc is installed.
    unset HOROVOD_GPU_OPERATIONS HOROVOD_CUDA_HOME CUDA_HOME
fi
on_off=(off on)
echo "building horovod $version: torch ${on_off[has_torch]} (CUDA ${torch_cuda:-none}, C++$std)," \
     "tensorflow ${on_off[has_tf]}, GPU operations ${HOROVOD_GPU_OPERATIONS:-none} ${HOROVOD_BUILD_CUDA_CC_LIST:-}"
# The sdist, unpacked here: Horovod vendors flatbuffers 1.12, whose span declares `const size_type
# count_` yet assigns it in operator=, which GCC 14 (Debian 13) rejects even where it is never
# used.  Upstream flatbuffers made the member non-const (google/flatbuffers#7227); the same
# one-word change is made to this copy.  --no-cache-dir: pip would otherwise hand back a wheel it
# once built from the same sdist against another torch, without building anything.
"$python" -m pip download --disable-pip-version-check --no-cache-dir --no-deps --no-binary :all: \
    -d "$work/sdist" "horovod==$version" >/dev/null
tar -xzf "$work"/sdist/horovod-*.tar.gz -C "$work/sdist"
source_dir=$work/sdist/horovod-$version
sed -i 's/^\(\s*\)const size_type count_;/\1size_type count_;/' \
    "$source_dir/third_party/flatbuffers/include/flatbuffers/stl_emulation.h"
PATH="$(cd "$venv/bin" && pwd):$PATH" "$python" -m pip wheel --disable-pip-version-check --no-cache-dir \
    --no-build-isolation --no-deps -w "$work/dist" "$source_dir"
mv "$work"/dist/horovod-*.whl "$out/"
