#!/usr/bin/env bash
# run.sh: the main job. Sets up and builds Teq (tools/setup.sh), then runs
# the whole pipeline on a model: gen-rules (depth 3, and at depth 2 the rules
# of matrix products: layouts through gemm's flags, and fused relus) and verify-rules into
# .cache/ruledb.sqlite (reused when it is already complete), optimize with
# the proved rules, and the report. With no argument the model is the
# built-in one: TASO's NasRNN cell (build-model nasrnn), whose matrix
# products the rules merge.
#
#   tools/run.sh [MODEL.onnx] [optimize options...]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh

model="${1:-}"
if [ -z "$model" ] || [ "${model#-}" != "$model" ]; then
  mkdir -p .cache/models
  model=.cache/models/nasrnn.onnx
  build/tools/build-model nasrnn "$model"
else
  shift
fi
db=.cache/ruledb.sqlite
build/gen/gen-rules --depth 3 --db "$db"
# Matrix products: transposed operands as gemm's flags, and a relu fused into the product.
build/gen/gen-rules --depth 2 --ops matmul,transpose,gemm,relu,matmul_relu --db "$db"
build/verify/verify-rules --db "$db" specs/ops.axioms
exec build/optimize/optimize --rules "$db" "$@" "$model"
