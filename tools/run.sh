#!/usr/bin/env bash
# run.sh: the main job. Sets up and builds Teq (tools/setup.sh), then runs a
# model through the pipeline. With no argument it builds the built-in model
# (build-model tiny-cnn) and runs it on the CPU executor.
#
#   tools/run.sh [MODEL.onnx] [run-model options...]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh

model="${1:-}"
if [ -z "$model" ] || [ "${model#-}" != "$model" ]; then
  mkdir -p .cache/models
  model=.cache/models/tiny-cnn.onnx
  build/tools/build-model tiny-cnn "$model"
else
  shift
fi
exec build/tools/run-model --repeat 10 "$@" "$model"
