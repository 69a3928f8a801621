#!/usr/bin/env bash
# CPU benchmark: Teq's float32 CPU executor (run-model) against ONNX Runtime's CPU
# provider (tools/ort/run.js) on the same models, inputs and machine, in one run; plus
# the time Teq takes to import resnet50. Prints a table and writes
# tools/bench/results_cpu.csv and tools/bench/results_cpu.md.
#
#   tools/bench/bench_cpu.sh [MODEL...]          (default: resnet18 resnet50)
#
# Each model is timed twice: with every thread each tool uses by default, and with one
# thread (Teq: OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1; ONNX Runtime: --threads 1).
# Both tools run once to warm up, then report the median of --repeat runs.
# Environment: TEQ_BENCH_BUILD (an optimized, non-sanitizer build; default
# build-release, made with: tools/build/meson-setup.sh build-release --buildtype=release -Db_ndebug=true),
# TEQ_BENCH_REPEAT (default 10), TEQ_CACHE, TEQ_PYTHON (default /usr/bin/python3),
# TEQ_BENCH_OUT (directory for the results, default tools/bench).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abspath() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$ROOT/$1" ;; esac; }
BUILD=$(abspath "${TEQ_BENCH_BUILD:-build-release}")
CACHE=$(abspath "${TEQ_CACHE:-.cache/models}")
OUTDIR=$(abspath "${TEQ_BENCH_OUT:-tools/bench}")
PY=${TEQ_PYTHON:-/usr/bin/python3}
REPEAT=${TEQ_BENCH_REPEAT:-10}
RUN_MODEL=$BUILD/tools/run-model
ORT_DIR=$ROOT/tools/ort
INPUT_NAME=input   # export_torchvision.py names every model's input "input"

if (($# > 0)); then MODELS=("$@"); else MODELS=(resnet18 resnet50); fi

die() { echo "bench_cpu: $*" >&2; exit 1; }
[[ -x $RUN_MODEL ]] || die "$RUN_MODEL not built; make an optimized build: tools/build/meson-setup.sh $(basename "$BUILD") --buildtype=release -Db_ndebug=true && ninja -C $(basename "$BUILD")"
"$PY" -c 'import torch, torchvision, onnx, numpy' 2>/dev/null || die "$PY lacks torch/torchvision/onnx (set TEQ_PYTHON)"
command -v node >/dev/null 2>&1 || die "node is not installed"
(cd "$ORT_DIR" && node -e "require('onnxruntime-node')") >/dev/null 2>&1 ||
  die "onnxruntime-node is missing; run: (cd tools/ort && ONNXRUNTIME_NODE_INSTALL=skip npm ci)"

# Which build is this? A sanitizer or unoptimized build makes the numbers meaningless.
BUILD_DESC=$("$PY" - "$BUILD" <<'EOF'
import json, os, sys
try:
    opts = {o["name"]: o["value"] for o in
            json.load(open(os.path.join(sys.argv[1], "meson-info", "intro-buildoptions.json")))}
except (OSError, ValueError):
    print("unknown (no meson-info)"); sys.exit(0)
desc = f"buildtype={opts.get('buildtype')} b_sanitize={opts.get('b_sanitize')} b_ndebug={opts.get('b_ndebug')}"
bad = opts.get("b_sanitize", "none") != "none" or opts.get("optimization") in ("0", "g", "plain")
print(desc + ("  WARNING: not an optimized non-sanitizer build" if bad else ""))
EOF
)
echo "build: $BUILD ($BUILD_DESC)"

"$PY" "$ROOT/tools/models/export_torchvision.py" "$CACHE" --models "$(IFS=,; echo "${MODELS[*]}")"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/teq-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
RAW=$WORK/raw.tsv   # model, threads, tool, exit status, wall ms, stdout file
: >"$RAW"

# timed MODEL THREADS TOOL CMD...: runs CMD, records its exit status, wall time and stdout.
timed() {
  local model=$1 threads=$2 tool=$3; shift 3
  local out=$WORK/$model.$threads.$tool.out rc=0 t0 t1
  t0=$EPOCHREALTIME
  "$@" >"$out" 2>"$out.err" || rc=$?
  t1=$EPOCHREALTIME
  if ((rc != 0)); then
    echo "bench_cpu: $tool on $model (threads $threads) exited $rc: $(tail -n 2 "$out.err" | tr '\n' ' ')" >&2
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$model" "$threads" "$tool" "$rc" \
    "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) * 1000 }')" "$out" >>"$RAW"
}

for model in "${MODELS[@]}"; do
  src=$CACHE/$model
  echo "timing $model ..." >&2
  timed "$model" all teq "$RUN_MODEL" --quiet --repeat "$REPEAT" --input "$INPUT_NAME=$src/input_0.bin" "$src/model.onnx"
  timed "$model" all ort node "$ORT_DIR/run.js" --quiet --repeat "$REPEAT" --input "$INPUT_NAME=$src/input_0.bin" "$src/model.onnx"
  timed "$model" 1 teq env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
    "$RUN_MODEL" --quiet --repeat "$REPEAT" --input "$INPUT_NAME=$src/input_0.bin" "$src/model.onnx"
  timed "$model" 1 ort node "$ORT_DIR/run.js" --quiet --threads 1 --repeat "$REPEAT" --input "$INPUT_NAME=$src/input_0.bin" "$src/model.onnx"
done

# Import time of resnet50: run-model with --repeat 0 imports (and prepares) without
# executing; if run-model refuses --repeat 0, the helper falls back to the wall time of
# one run minus the run time it reports.
echo "timing the import of resnet50 ..." >&2
"$PY" "$ROOT/tools/models/export_torchvision.py" "$CACHE" --models resnet50 >/dev/null
r50=$CACHE/resnet50
timed resnet50 import teq0 "$RUN_MODEL" --quiet --repeat 0 --input "$INPUT_NAME=$r50/input_0.bin" "$r50/model.onnx"
timed resnet50 import teq1 "$RUN_MODEL" --quiet --repeat 1 --input "$INPUT_NAME=$r50/input_0.bin" "$r50/model.onnx"
timed resnet50 import ort node "$ORT_DIR/run.js" --quiet --input "$INPUT_NAME=$r50/input_0.bin" "$r50/model.onnx"

mkdir -p "$OUTDIR"
"$PY" "$ROOT/tools/bench/bench_report.py" "$RAW" --csv "$OUTDIR/results_cpu.csv" --md "$OUTDIR/results_cpu.md" \
  --note "build: $(basename "$BUILD") ($BUILD_DESC)" --note "repeat: $REPEAT (median, after 1 warm-up)" \
  --note "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with local changes)')" \
  --note "onnxruntime-node: $(cd "$ORT_DIR" && node -p "require('onnxruntime-node/package.json').version")"
