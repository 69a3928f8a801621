# oracles.sh: sourced by the script tests. Each check skips the test (exit
# 77, meson's code for a skipped test) when an independent oracle is missing
# on this machine, with the command that installs it.

# Needs ROOT (the repository root) set by the caller, and is sourced right
# after it.

# abspath PATH: PATH, relative to the repository root unless absolute.
abspath() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$ROOT/$1" ;; esac; }

# free_mb DIR: megabytes free on DIR's file system.
free_mb() { df -Pm "$1" | awk 'NR == 2 { print $4 }'; }

# ok MSG, fail MSG: one check passed or failed, counted in checks and
# failures for the caller's summary (ort_same_outputs reports through them;
# a script with its own wording defines its own after sourcing this).
checks=0
failures=0
ok() { printf 'ok   %s\n' "$*"; checks=$((checks + 1)); }
fail() { printf 'FAIL %s\n' "$*"; failures=$((failures + 1)); checks=$((checks + 1)); }
# check NAME STATUS DETAIL: ok NAME when STATUS is 0, else fail NAME: DETAIL.
check() { if [[ $2 == 0 ]]; then ok "$1"; else fail "$1: $3"; fi; }

# require_python PY MODULE...: PY can import every MODULE.
require_python() {
  local py=$1; shift
  local mods
  mods=$(IFS=,; echo "$*")
  if ! "$py" -c "import $mods" 2>/dev/null; then
    echo "SKIP: $py lacks $mods (Debian: apt-get install python3-torchvision python3-onnx)"
    exit 77
  fi
}

# require_ort DIR: node is installed and DIR (tools/ort) has onnxruntime-node.
require_ort() {
  if ! command -v node >/dev/null 2>&1; then
    echo "SKIP: node is not installed"
    exit 77
  fi
  if ! (cd "$1" && node -e "require('onnxruntime-node')") >/dev/null 2>&1; then
    echo "SKIP: onnxruntime-node is missing; run: (cd tools/ort && ONNXRUNTIME_NODE_INSTALL=skip npm ci)"
    exit 77
  fi
}

# ort_same_outputs NAME ORIG OPT DIR [INPUTS]: seeded inputs for ORIG's
# graph inputs (uniform [-1, 1) floats from seed 1, zeros for int64)
# written into DIR, or the model's own input_K.bin files in directory
# INPUTS, both models run in ONNX Runtime on them, every output of OPT held
# to ORIG's by tools/compare.py (rel <= 1e-4). Reports through ok and fail
# (above); returns 1 when ONNX Runtime could not run a model. Needs ROOT,
# PY and ORT_DIR.
ort_same_outputs() {
  local name=$1 orig=$2 opt=$3 w=$4 given=${5:-} iname file ref out line
  local args=()
  while IFS=' ' read -r iname file; do args+=(--input "$iname=$file"); done < <(
    "$PY" - "$orig" "$w" "$given" <<'PYEOF'
import os, sys, numpy as np, onnx
m = onnx.load(sys.argv[1], load_external_data=False)
init = {i.name for i in m.graph.initializer}
rng = np.random.default_rng(1)
for k, vi in enumerate(x for x in m.graph.input if x.name not in init):
    if sys.argv[3]:  # the model's own input, as its preprocessing makes it
        print(vi.name, os.path.join(sys.argv[3], f"input_{k}.bin"))
        continue
    t = vi.type.tensor_type
    dims = [d.dim_value if d.dim_value > 0 else 1 for d in t.shape.dim]
    if t.elem_type == onnx.TensorProto.INT64:
        a = np.zeros(dims, dtype=np.int64)
    else:
        a = rng.uniform(-1, 1, dims).astype(np.float32)
    path = f"{sys.argv[2]}/in{k}.bin"
    a.tofile(path)
    print(vi.name, path)
PYEOF
  )
  if ! node "$ORT_DIR/run.js" "$orig" "${args[@]}" --output-dir "$w/ref" --quiet >"$w/ort.log" 2>&1; then
    fail "$name: ONNX Runtime on the original: $(tail -n1 "$w/ort.log")"
    return 1
  fi
  if ! node "$ORT_DIR/run.js" "$opt" "${args[@]}" --output-dir "$w/got" --quiet >"$w/ort_opt.log" 2>&1; then
    fail "$name: ONNX Runtime on the optimized model: $(tail -n1 "$w/ort_opt.log")"
    return 1
  fi
  for ref in "$w"/ref/output_*.bin; do
    out=$(basename "$ref")
    # compare.py's line starts with its own verdict; ok and fail print theirs
    if line=$("$PY" "$ROOT/tools/compare.py" --rtol 1e-4 --label "$name $out" "$w/got/$out" "$ref" 2>&1); then
      ok "${line#ok   }"
    else
      fail "${line#FAIL }"
    fi
  done
}
