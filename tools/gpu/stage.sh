#!/usr/bin/env bash
# stage.sh: gathers what a GPU machine needs to run Teq's GPU tests and
# benchmarks into one directory (default .gpu, which git ignores): the
# release build's GPU-side binaries, the shared libraries that machine may
# lack (protobuf-c), and the ONNX node tests. session.sh unpacks and runs
# them there.
#
#   tools/gpu/stage.sh [STAGE_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
stage="${1:-.gpu}"
build=build-gpu
[ -d "$build" ] || meson setup "$build" --buildtype=release -Dcuda=enabled >/dev/null
ninja -C "$build" tools/run-model tools/teq-profile tools/build-model \
  tests/runtime_test_cuda tests/runtime_test_cuda_elementwise tests/runtime_test_cuda_reduce \
  tests/runtime_test_cuda_layout tests/runtime_test_cuda_linear tests/runtime_test_cuda_profile \
  tests/runtime_test_conformance_gpu >/dev/null
rm -rf "$stage"
mkdir -p "$stage/tools" "$stage/tests" "$stage/lib"
cp "$build"/tools/run-model "$build"/tools/teq-profile "$build"/tools/build-model "$stage/tools/"
for t in "$build"/tests/runtime_test_cuda "$build"/tests/runtime_test_cuda_* "$build"/tests/runtime_test_conformance_gpu; do [ -f "$t" ] && cp "$t" "$stage/tests/"; done
# Shared libraries the binaries need besides CUDA's, in case that machine lacks them.
for lib in $(ldd "$build/tools/run-model" | awk '/=>/ {print $3}' | grep -E 'protobuf-c|openblas|gfortran|quadmath'); do
  cp -L "$lib" "$stage/lib/"
done
strip "$stage"/tools/* "$stage"/tests/*
# Every binary holds the same kernels: one compressed archive of them all
# is a few MB where the files are 60.
XZ_OPT=-9 tar cJf "$stage/bin.tar.xz" -C "$stage" tools tests lib
rm -rf "$stage/tools" "$stage/tests" "$stage/lib"
tar czf "$stage/node-tests.tgz" -C /usr/share/libonnx-testdata/data node
du -sh "$stage"
