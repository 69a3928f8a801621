#!/usr/bin/env bash
# End-to-end check of the runtime on real models: for each model, Teq's CPU executor
# (run-model) must reproduce PyTorch's output, and Teq's ONNX import->export round trip
# must give a model that ONNX Runtime accepts and that computes what the original does.
#
#   tests/scripts/test_models.sh [MODEL...]     (default: all of export_torchvision.py)
#
# Checks per model, one line each, "ok"/"FAIL" with the numbers:
#   teq-vs-torch      run-model --input input_0.pb         vs PyTorch's output_0 (and
#                     --planned: the GPU's memory plan run on the host, vs the executor)
#   teq-bin-vs-torch  run-model --input input_0.bin --save vs PyTorch's output_0
#   rt-checker        onnx.checker accepts the round-tripped rt.onnx
#   ort-rt-vs-ort     ONNX Runtime on rt.onnx vs ONNX Runtime on the original
#   ort-vs-torch      ONNX Runtime on the original vs PyTorch (sanity of the oracle)
# Exit: 0 all ok, 1 any failure, 77 (skipped) if PyTorch or onnxruntime-node is missing.
# Environment: TEQ_BUILD (build dir, default build), TEQ_CACHE (model cache, default
# .cache/models), TEQ_PYTHON (default /usr/bin/python3: Debian's, which has torch),
# TEQ_MODEL_RTOL (default 1e-4; see tools/compare.py for the metric),
# TEQ_MODEL_TIMEOUT (seconds per command, default 600), TEQ_KEEP_WORK=1 keeps the
# outputs, logs and round-tripped models in the temporary directory it prints.
# Disk: a model not in the cache is exported into it only while more than
# TEQ_CACHE_AMPLE_MB (default 16384) is free; otherwise into the temporary
# directory, and removed after its checks. A model whose weights twice and
# TEQ_DISK_RESERVE_MB (default 1024, room for the tests running beside this one)
# do not fit is left out and named; the run is skipped if every model was.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/scripts/oracles.sh
. "$ROOT/tests/scripts/oracles.sh"
BUILD=$(abspath "${TEQ_BUILD:-build}")
CACHE=$(abspath "${TEQ_CACHE:-.cache/models}")
PY=${TEQ_PYTHON:-/usr/bin/python3}
RTOL=${TEQ_MODEL_RTOL:-1e-4}
TMO=${TEQ_MODEL_TIMEOUT:-600}
AMPLE_MB=${TEQ_CACHE_AMPLE_MB:-16384}
RESERVE_MB=${TEQ_DISK_RESERVE_MB:-1024}
RUN_MODEL=$BUILD/tools/run-model
ORT_DIR=$ROOT/tools/ort
INPUT_NAME=input   # export_torchvision.py names every model's input "input"

# --- prerequisites: skip (77) when an oracle is missing, fail when Teq is.
require_python "$PY" torch torchvision onnx numpy
require_ort "$ORT_DIR"
if [[ ! -x $RUN_MODEL ]]; then
  echo "FAIL: $RUN_MODEL not built (set TEQ_BUILD to the build directory)"
  exit 1
fi

if (($# > 0)); then
  MODELS=("$@")
else
  mapfile -t MODELS < <("$PY" "$ROOT/tools/models/export_torchvision.py" --list | cut -f1)
fi

mkdir -p "$CACHE"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/teq-models.XXXXXX")
if [[ -n ${TEQ_KEEP_WORK:-} ]]; then
  echo "keeping outputs and logs in $WORK"
else
  trap 'rm -rf "$WORK"' EXIT
fi

failures=0
checks=0
fail() { # model check message
  printf 'FAIL %s %s %s\n' "$1" "$2" "$3"
  failures=$((failures + 1)); checks=$((checks + 1))
}
pass() {
  printf 'ok   %s %s %s\n' "$1" "$2" "$3"
  checks=$((checks + 1))
}
# run LOG CMD...: runs CMD with a timeout, stdout+stderr into LOG; returns its status,
# or 99 where a sanitizer reported something (UBSan keeps going and exits 0 by default).
SANITIZER_RE='AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:'
run() {
  local log=$1; shift
  local rc=0
  timeout "$TMO" "$@" >"$log" 2>&1 || rc=$?
  if ((rc == 0)) && grep -Eq "$SANITIZER_RE" "$log"; then
    local first
    first=$(grep -Em1 "$SANITIZER_RE" "$log")
    echo "$first" >>"$log"   # why() shows the last line
    rc=99
  fi
  return "$rc"
}
# why RC LOG: one-line reason for a failed command.
why() {
  local rc=$1 log=$2 what
  if ((rc == 124)); then what="timed out after ${TMO}s"
  elif ((rc >= 128)); then what="crashed (signal $((rc - 128)))"
  elif ((rc == 99)); then what="sanitizer report"
  else what="exited $rc"; fi
  local last
  last=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1 | cut -c1-200 || true)
  printf '%s: %s' "$what" "${last:-(no output)}"
}
# compare MODEL CHECK GOT REF: one line from tools/compare.py.
compare() {
  local model=$1 check=$2 got=$3 ref=$4 line rc=0
  line=$("$PY" "$ROOT/tools/compare.py" --rtol "$RTOL" --label "$model $check" "$got" "$ref" 2>&1) || rc=$?
  if ((rc == 0)); then
    echo "$line"; checks=$((checks + 1))
  elif ((rc == 1)); then
    echo "$line"; failures=$((failures + 1)); checks=$((checks + 1))
  else
    fail "$model" "$check" "compare: $line"
  fi
}

left_out=()
for model in "${MODELS[@]}"; do
  src=$CACHE/$model
  w=$WORK/$model
  mkdir -p "$w"
  t0=$(date +%s.%N)

  # 0. The model, its input and PyTorch's output: from the cache, or exported now.
  if ! "$PY" "$ROOT/tools/models/export_torchvision.py" "$CACHE" --models "$model" --cached 2>/dev/null; then
    dest=$CACHE
    (($(free_mb "$CACHE") > AMPLE_MB)) || dest=$WORK/export
    rc=0
    "$PY" "$ROOT/tools/models/export_torchvision.py" "$dest" --models "$model" \
      --reserve "$RESERVE_MB" >"$w/export.log" 2>&1 || rc=$?
    if ((rc == 4)); then
      echo "skip $(tail -n 1 "$w/export.log")"
      left_out+=("$model")
      rm -rf "$w" "$WORK/export"
      continue
    elif ((rc != 0)); then
      fail "$model" export "$(why "$rc" "$w/export.log")"
      rm -rf "$WORK/export"
      continue
    fi
    sed 's/^/     /' "$w/export.log"
    src=$dest/$model
  fi

  # 1. Teq's executor, TensorProto input; and the GPU's memory plan run on the host
  #    (--planned: its aliases, offsets and strides) against it.
  rc=0
  run "$w/teq.log" "$RUN_MODEL" --quiet --planned --input "$INPUT_NAME=$src/input_0.pb" \
    --output-dir "$w/teq" "$src/model.onnx" || rc=$?
  if ((rc != 0)); then
    fail "$model" teq-vs-torch "run-model $(why "$rc" "$w/teq.log")"
  elif [[ -f $w/teq/output_0.pb ]]; then
    compare "$model" teq-vs-torch "$w/teq/output_0.pb" "$src/output_0.pb"
  else
    fail "$model" teq-vs-torch "run-model wrote no $w/teq/output_0.pb"
  fi

  # 2. Raw float32 input, and the import->export round trip.
  rc=0
  run "$w/rt.log" "$RUN_MODEL" --quiet --input "$INPUT_NAME=$src/input_0.bin" \
    --output-dir "$w/teq_bin" --save "$w/rt.onnx" "$src/model.onnx" || rc=$?
  if ((rc != 0)); then
    fail "$model" teq-bin-vs-torch "run-model --save $(why "$rc" "$w/rt.log")"
  elif [[ -f $w/teq_bin/output_0.bin ]]; then
    compare "$model" teq-bin-vs-torch "$w/teq_bin/output_0.bin" "$src/output_0.pb"
  else
    fail "$model" teq-bin-vs-torch "run-model wrote no $w/teq_bin/output_0.bin"
  fi

  # 3. The round-tripped model is valid ONNX.
  if [[ -f $w/rt.onnx ]]; then
    rc=0
    run "$w/checker.log" "$PY" -c 'import sys, onnx; onnx.checker.check_model(onnx.load(sys.argv[1]))' \
      "$w/rt.onnx" || rc=$?
    if ((rc == 0)); then
      pass "$model" rt-checker "onnx.checker accepts rt.onnx ($(du -k "$w/rt.onnx" | cut -f1) KiB)"
    else
      fail "$model" rt-checker "$(why "$rc" "$w/checker.log")"
    fi
  else
    fail "$model" rt-checker "run-model --save wrote no rt.onnx"
  fi

  # 4. ONNX Runtime on the original and on the round trip.
  ort_ok=0
  rc=0
  run "$w/ort.log" node "$ORT_DIR/run.js" "$src/model.onnx" --input "$INPUT_NAME=$src/input_0.bin" \
    --output-dir "$w/ort" || rc=$?
  if ((rc == 0)); then
    ort_ok=1
  else
    fail "$model" ort-vs-torch "ONNX Runtime on the original $(why "$rc" "$w/ort.log")"
  fi
  if [[ -f $w/rt.onnx ]]; then
    rc=0
    run "$w/ort_rt.log" node "$ORT_DIR/run.js" "$w/rt.onnx" --input "$INPUT_NAME=$src/input_0.bin" \
      --output-dir "$w/ort_rt" || rc=$?
    if ((rc != 0)); then
      fail "$model" ort-rt-vs-ort "ONNX Runtime on rt.onnx $(why "$rc" "$w/ort_rt.log")"
    elif ((ort_ok)); then
      compare "$model" ort-rt-vs-ort "$w/ort_rt/output_0.bin" "$w/ort/output_0.bin"
    fi
  else
    fail "$model" ort-rt-vs-ort "no rt.onnx"
  fi
  if ((ort_ok)); then
    compare "$model" ort-vs-torch "$w/ort/output_0.bin" "$src/output_0.pb"
  fi

  awk -v m="$model" -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "     %s: %.1f s\n", m, b - a }'
  [[ -n ${TEQ_KEEP_WORK:-} ]] || rm -rf "$w" "$WORK/export"   # the models are large
done

echo "$((checks - failures))/$checks checks ok"
if ((${#left_out[@]} > 0)); then
  echo "left out for want of disk: ${left_out[*]}"
  if ((checks == 0)); then exit 77; fi
fi
((failures == 0))
