#!/usr/bin/env bash
# Build a Horovod 0.28.1 wheel with PyTorch, TensorFlow, Gloo and MPI into $1.
#
# Its last release pins C++14 in its CMakeLists, but PyTorch's and TensorFlow's headers need
# C++17 (horovod issues #3996, #3941, fixed on master, never released), and CXXFLAGS cannot
# override it because CMake appends its own -std flag last.  A CMake toolchain file that
# remaps CMake's C++14 compile option to C++17 fixes that without patching Horovod.
set -euo pipefail
out=$1
venv=${VENV:-.venv}
version=$("$venv/bin/python" tools/pins.py horovod | sed -n 's/^horovod==//p')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/cxx17-rules.cmake" <<'CMAKE'
set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++17")
set(CMAKE_CXX14_EXTENSION_COMPILE_OPTION "-std=gnu++17")
CMAKE
cat > "$work/toolchain.cmake" <<CMAKE
set(CMAKE_USER_MAKE_RULES_OVERRIDE_CXX "$work/cxx17-rules.cmake")
CMAKE

export CMAKE_TOOLCHAIN_FILE="$work/toolchain.cmake"
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1
export HOROVOD_WITHOUT_MXNET=1
export MAKEFLAGS="-j$(nproc)"
# A CPU torch build: keep Horovod from switching its CUDA code on because nvcc is installed.
unset HOROVOD_GPU_OPERATIONS HOROVOD_CUDA_HOME CUDA_HOME
PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" -m pip wheel --disable-pip-version-check \
    --no-build-isolation --no-deps --no-binary horovod -w "$work/dist" "horovod==$version"
mv "$work"/dist/horovod-*.whl "$out/"
