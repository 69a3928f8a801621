#!/usr/bin/env bash
# test_builders.sh: every model build-model makes is valid ONNX, and Teq's CPU executor
# computes on it what ONNX Runtime computes.
#
#   tests/scripts/test_builders.sh [MODEL...]     (default: all of build-model --list, and
#                                                  nasrnn@2: NasRNN at --scale 2)
#
# Per model: build-model --seed 1 writes model.onnx; onnx.checker (full_check, which
# also runs ONNX shape inference) accepts it; seeded uniform [-1, 1) float32 inputs are
# written for every graph input; run-model and ONNX Runtime (tools/ort/run.js) run it on
# them (run-model also as the GPU's memory plan lays it out, on the host, --planned, and
# fails where that differs); tools/compare.py holds each output of Teq to ONNX Runtime's. One line per model,
# "ok"/"FAIL", with the operator count, the output's scale (max|y| and rms: random
# weights must keep it O(1)) and both run times.
# Exit: 0 all ok, 1 any failure, 77 (skipped) if python3's onnx/numpy, node or
# onnxruntime-node is missing.
# Environment: TEQ_BUILD (build dir, default build), TEQ_PYTHON (default /usr/bin/python3),
# TEQ_MODEL_RTOL (default 1e-4; see tools/compare.py), TEQ_BUILDERS_REPEAT (timed runs
# of each executor, default 3), TEQ_MODEL_TIMEOUT (seconds per command, default 600),
# TEQ_KEEP_WORK=1 keeps models, inputs, outputs and logs in the directory it prints.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/scripts/oracles.sh
. "$ROOT/tests/scripts/oracles.sh"
BUILD=$(abspath "${TEQ_BUILD:-build}")
PY=${TEQ_PYTHON:-/usr/bin/python3}
RTOL=${TEQ_MODEL_RTOL:-1e-4}
REPEAT=${TEQ_BUILDERS_REPEAT:-3}
TMO=${TEQ_MODEL_TIMEOUT:-600}
BUILD_MODEL=$BUILD/tools/build-model
RUN_MODEL=$BUILD/tools/run-model
ORT_DIR=$ROOT/tools/ort

# --- prerequisites: skip (77) when an oracle is missing, fail when Teq is.
require_python "$PY" onnx numpy
require_ort "$ORT_DIR"
for tool in "$BUILD_MODEL" "$RUN_MODEL"; do
  if [[ ! -x $tool ]]; then
    echo "FAIL: $tool not built (set TEQ_BUILD to the build directory)"
    exit 1
  fi
done

if (($# > 0)); then
  MODELS=("$@")
else
  mapfile -t MODELS < <("$BUILD_MODEL" --list | awk '{print $1}')
  MODELS+=(nasrnn@2)
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/teq-builders.XXXXXX")
if [[ -n ${TEQ_KEEP_WORK:-} ]]; then
  echo "keeping models, outputs and logs in $WORK"
else
  trap 'rm -rf "$WORK"' EXIT
fi

# Checks MODEL, writes one input file per graph input (input i from seed 1000 + i) into
# DIR, and prints "--input NAME=FILE" argument pairs, one per line.
PREPARE='
import sys, numpy as np, onnx
path, out = sys.argv[1], sys.argv[2]
model = onnx.load(path)
onnx.checker.check_model(model, full_check=True)
inits = {t.name for t in model.graph.initializer}
feeds = [v for v in model.graph.input if v.name not in inits]
for i, v in enumerate(feeds):
    dims = [d.dim_value for d in v.type.tensor_type.shape.dim]
    x = np.random.default_rng(1000 + i).uniform(-1, 1, dims).astype("<f4")
    f = f"{out}/input_{i}.bin"
    x.tofile(f)
    print("--input"); print(f"{v.name}={f}")
'
# Prints "max|y| M rms R" of a raw float32 file.
SCALE='
import sys, numpy as np
y = np.fromfile(sys.argv[1], dtype="<f4").astype(np.float64)
print(f"max|y| {np.max(np.abs(y)):.3g} rms {np.sqrt(np.mean(y * y)):.3g}")
'

failures=0
# run LOG CMD...: runs CMD with a timeout, stdout+stderr into LOG; returns its status.
run() {
  local log=$1; shift
  timeout "$TMO" "$@" >"$log" 2>&1
}
# why RC LOG: one-line reason for a failed command.
why() {
  local rc=$1 log=$2 what last
  if ((rc == 124)); then what="timed out after ${TMO}s"
  elif ((rc >= 128)); then what="crashed (signal $((rc - 128)))"
  else what="exited $rc"; fi
  last=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1 | cut -c1-200 || true)
  printf '%s: %s' "$what" "${last:-(no output)}"
}
fail() { # model message
  printf 'FAIL %s %s\n' "$1" "$2"
  failures=$((failures + 1))
}

# check_model MODEL: all checks of one model; returns 1 after printing why it failed.
check_model() {
  local m=$1 w=$WORK/$1 rc=0 scale=()
  [[ $m == *@* ]] && scale=(--scale "${m#*@}")
  mkdir -p "$w/teq" "$w/ort"
  run "$w/build.log" "$BUILD_MODEL" --seed 1 "${scale[@]}" "${m%@*}" "$w/model.onnx" || rc=$?
  ((rc == 0)) || { fail "$m" "build-model $(why "$rc" "$w/build.log")"; return 1; }
  run "$w/prepare.log" "$PY" -c "$PREPARE" "$w/model.onnx" "$w" || rc=$?
  ((rc == 0)) || { fail "$m" "onnx.checker or inputs $(why "$rc" "$w/prepare.log")"; return 1; }
  local inputs=()
  mapfile -t inputs <"$w/prepare.log"
  run "$w/teq.log" "$RUN_MODEL" --repeat "$REPEAT" --planned "${inputs[@]}" \
    --output-dir "$w/teq" "$w/model.onnx" || rc=$?
  ((rc == 0)) || { fail "$m" "run-model $(why "$rc" "$w/teq.log")"; return 1; }
  run "$w/ort.log" node "$ORT_DIR/run.js" "$w/model.onnx" "${inputs[@]}" --repeat "$REPEAT" \
    --output-dir "$w/ort" || rc=$?
  ((rc == 0)) || { fail "$m" "ONNX Runtime $(why "$rc" "$w/ort.log")"; return 1; }
  compare_outputs "$m" "$w"
}

# compare_outputs MODEL DIR: each of ONNX Runtime's outputs against Teq's, then the line.
compare_outputs() {
  local m=$1 w=$2 ref j line rc=0 worst=""
  local n_out=0
  for ref in "$w"/ort/output_*.bin; do
    [[ -e $ref ]] || break
    j=${ref##*/}
    n_out=$((n_out + 1))
    if [[ ! -f $w/teq/$j ]]; then fail "$m" "run-model wrote no $j"; return 1; fi
    line=$("$PY" "$ROOT/tools/compare.py" --rtol "$RTOL" "$w/teq/$j" "$ref" 2>&1) || rc=$?
    if ((rc != 0)); then fail "$m" "$j vs ONNX Runtime: $line"; return 1; fi
    worst=$(sed -n 's/.* rel \([^ ]*\) .*/\1/p' <<<"$line")
  done
  ((n_out > 0)) || { fail "$m" "ONNX Runtime wrote no outputs"; return 1; }
  local ops teq_ms ort_ms scale
  ops=$(sed -n 's/.*(\([0-9]*\) operators).*/\1/p' "$w/build.log")
  teq_ms=$(sed -n 's/^time \([0-9.]*\) ms.*/\1/p' "$w/teq.log")
  ort_ms=$(sed -n 's/^time_ms \([0-9.]*\).*/\1/p' "$w/ort.log")
  scale=$("$PY" -c "$SCALE" "$w/teq/output_0.bin")
  printf 'ok   %-12s %4s ops  %s  rel %s  teq %s ms  ort %s ms  (%s KiB)\n' "$m" "$ops" \
    "$scale" "$worst" "$teq_ms" "$ort_ms" "$(du -k "$w/model.onnx" | cut -f1)"
}

for model in "${MODELS[@]}"; do
  check_model "$model" || true
  [[ -n ${TEQ_KEEP_WORK:-} ]] || rm -rf "${WORK:?}/$model"   # bert is 400 MB
done

# --scale repeats the unit and nothing else: NasRNN's operators double with its steps
# (its weights are shared); a model without a unit, or a scale out of range, is refused.
ops_at() {
  "$BUILD_MODEL" --scale "$1" nasrnn "$WORK/scaled.onnx" 2>&1 | sed -n 's/.*(\([0-9]*\) operators).*/\1/p'
}
if (($# == 0)); then
  one=$(ops_at 1) two=$(ops_at 2) four=$(ops_at 4)
  if [[ -z $one || $two != $((2 * one)) || $four != $((4 * one)) ]]; then
    fail "nasrnn --scale" "operators at 1, 2, 4: '$one' '$two' '$four', not in proportion"
  else
    echo "ok   nasrnn --scale 1, 2, 4: $one, $two, $four operators"
  fi
  for bad in "--scale 2 csrnet" "--scale 2 tiny-cnn" "--scale 0 nasrnn" "--scale 65 nasrnn" \
             "--scale x nasrnn"; do
    rc=0
    # shellcheck disable=SC2086
    "$BUILD_MODEL" $bad "$WORK/bad.onnx" >"$WORK/bad.log" 2>&1 || rc=$?
    if ((rc != 2)) || ! grep -q 'build-model: ' "$WORK/bad.log"; then
      fail "build-model $bad" "exit $rc, expected 2 with a message: $(head -1 "$WORK/bad.log")"
    else
      echo "ok   build-model $bad refused: $(head -1 "$WORK/bad.log")"
    fi
  done
fi

echo "$((${#MODELS[@]} - failures))/${#MODELS[@]} models ok"
((failures == 0))
