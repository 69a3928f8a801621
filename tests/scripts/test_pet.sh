#!/usr/bin/env bash
# PET inside optimize, end to end: CSRNet (dilated convs), ResNet-18 and
# Inception-v3 optimized with PET's mutations competing with the proved
# rules (optimize's default), each optimized model run in ONNX Runtime (onnxruntime-node) and
# compared with the original (rel <= 1e-4). Prints per model what PET
# considered and applied.
#
#   tests/scripts/test_pet.sh
#
# The search is bounded (--budget, --time-limit, --pet-max-flops: every
# mutant is tested by running both programs in Z_p on the CPU, which is
# what costs time under ASan): this checks that what optimize writes with
# PET on is right, not how far it gets. --check-derived builds and
# post-optimizes every PET candidate the search derives unbuilt as well, and
# optimize fails if one differs.
# Environment: TEQ_BUILD (build dir), TEQ_CACHE (.cache/models),
# TEQ_PYTHON (/usr/bin/python3).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/scripts/oracles.sh
. "$ROOT/tests/scripts/oracles.sh"
BUILD=$(abspath "${TEQ_BUILD:-build}")
CACHE=$(abspath "${TEQ_CACHE:-.cache/models}")
PY=${TEQ_PYTHON:-/usr/bin/python3}
ORT_DIR=$ROOT/tools/ort
OPT=$BUILD/optimize/optimize
require_ort "$ORT_DIR"
require_python "$PY" numpy onnx

WORK=$(mktemp -d "${TMPDIR:-/tmp}/teq-pet.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# --- rules, as tests/scripts/test_optimize.sh makes them.
db=$WORK/rules.sqlite
"$BUILD/gen/gen-rules" --depth 3 --db "$db" --quiet >"$WORK/gen.log"
"$BUILD/gen/gen-rules" --depth 2 --ops matmul,transpose,gemm,relu,matmul_relu --db "$db" --quiet >>"$WORK/gen.log"
"$BUILD/verify/verify-rules" --db "$db" --quiet "$ROOT/specs/ops.axioms" >"$WORK/verify.log"

# --- bad PET options are refused with status 2.
"$BUILD/tools/build-model" tiny-cnn "$WORK/tiny.onnx" 2>/dev/null
for bad in "--pet-depth 0" "--pet-trials -1" "--pet-mutants 0" "--pet-max-flops x" \
  "--pet-max-elements -1"; do
  rc=0
  # shellcheck disable=SC2086
  "$OPT" --rules "$db" --pet $bad "$WORK/tiny.onnx" >/dev/null 2>"$WORK/err.log" || rc=$?
  if ((rc == 2)) && grep -q -- "${bad%% *}" "$WORK/err.log"; then ok "refused: $bad"
  else fail "$bad: exit $rc: $(tail -n1 "$WORK/err.log")"; fi
done

# --- PET is on by default, and --no-pet leaves it out.
for flag in "" --no-pet; do
  rc=0
  # shellcheck disable=SC2086
  "$OPT" --rules "$db" --quiet --budget 5 --no-check $flag --json "$WORK/flag.json" \
    -o "$WORK/flag.onnx" "$WORK/tiny.onnx" >/dev/null 2>"$WORK/err.log" || rc=$?
  want=$([ -z "$flag" ] && echo on || echo off)
  got=$("$PY" -c 'import json, sys; print("off" if json.load(open(sys.argv[1]))["pet"] is None else "on")' \
    "$WORK/flag.json" 2>/dev/null || echo "no report")
  if ((rc == 0)) && [ "$got" = "$want" ]; then ok "PET ${want} with '${flag:-no flag}'"
  else fail "'${flag:-no flag}': exit $rc, PET $got (want $want)"; fi
done

# --- --pet-max-elements: with tensors of at most 1000 elements allowed, tiny-cnn's
# subprograms (each [1,16,32,32] or larger) are all skipped as too large.
rc=0
"$OPT" --rules "$db" --quiet --budget 5 --no-check --pet-max-elements 1000 --json "$WORK/el.json" \
  -o "$WORK/el.onnx" "$WORK/tiny.onnx" >/dev/null 2>"$WORK/err.log" || rc=$?
got=$("$PY" -c 'import json, sys; p = json.load(open(sys.argv[1]))["pet"]
print(p["subprograms"], p["too_large"] > 0, p["max_elements"])' "$WORK/el.json" 2>/dev/null || echo "no report")
if ((rc == 0)) && [ "$got" = "0 True 1000" ]; then ok "--pet-max-elements 1000: every subprogram skipped"
else fail "--pet-max-elements 1000: exit $rc, subprograms / skipped / limit: $got"; fi

# --- models.
models=()
"$BUILD/tools/build-model" csrnet "$WORK/csrnet.onnx" 2>/dev/null && models+=("csrnet:$WORK/csrnet.onnx")
if "$PY" -c "import torch, torchvision" 2>/dev/null; then
  "$PY" "$ROOT/tools/models/export_torchvision.py" "$CACHE" --models resnet18,inception_v3 >/dev/null
  models+=("resnet18:$CACHE/resnet18/model.onnx" "inception_v3:$CACHE/inception_v3/model.onnx")
else
  echo "(PyTorch missing: ResNet-18 and Inception-v3 are left out)"
fi

for entry in "${models[@]}"; do
  name=${entry%%:*} model=${entry#*:}
  w=$WORK/$name
  mkdir -p "$w"
  t0=$(date +%s)
  rc=0
  "$OPT" --rules "$db" --cost-table "$ROOT/tests/data/h100-2026-11-22.tsv" --quiet --budget 10 \
    --time-limit 40 --pet-max-flops 1e8 --check-derived \
    --json "$w/report.json" -o "$w/opt.onnx" "$model" >"$w/report.txt" 2>"$w/err.log" || rc=$?
  if ((rc != 0)); then
    fail "$name: optimize --pet exited $rc: $(tail -n1 "$w/err.log")"
    continue
  fi
  if "$PY" - "$w/report.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["check"]["ok"], r["check"]
p = r["pet"]
assert p is not None and p["subprograms"] + p["too_large"] > 0, p
assert all(p["post"][w][k] >= 0 for w in ("candidates", "result")
           for k in ("moved", "removed", "fused")), p["post"]
assert p["derived"] > 0, p  # --check-derived built each of them too
for a in p["applied"]:
    assert a["log2_bound"] <= -60 and a["mutation"], a
PYEOF
  then ok "$name: report.json: PET ran, CPU check ok"
  else fail "$name: report.json"; continue; fi
  ort_same_outputs "$name" "$model" "$w/opt.onnx" "$w" || continue
  summary=$(grep -E '^  (operators|estimated cost)' "$w/report.txt" | tr -s ' ' | tr '\n' ';')
  echo "     $name: $summary $(($(date +%s) - t0)) s"
  # what PET did: the summary line and each applied mutation
  sed -n '/^  PET /,/^  rules applied/p' "$w/report.txt" | sed '$d' | sed 's/^/     /'
done

# --- BERT: PET mutates nothing there, but its post-optimization of the result hoists each
# layer's head layouts above the split of the merged Q K V product; ONNX Runtime agrees.
if "$BUILD/tools/build-model" bert "$WORK/bert.onnx" 2>/dev/null; then
  w=$WORK/bert
  mkdir -p "$w"
  if "$OPT" --rules "$db" --cost-table "$ROOT/tests/data/h100-2026-11-22.tsv" --quiet --budget 20 \
       --time-limit 60 --json "$w/report.json" -o "$w/opt.onnx" "$WORK/bert.onnx" \
       >"$w/report.txt" 2>"$w/err.log" &&
     "$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["check"]["ok"] and r["pet"]["post"]["result"]["hoisted"] >= 8, r["pet"]["post"]
' "$w/report.json"
  then
    ok "bert: $(grep -o '[0-9]* hoisted$' "$w/report.txt") (layers' Q K V heads)"
    ort_same_outputs bert "$WORK/bert.onnx" "$w/opt.onnx" "$w" || true
  else
    fail "bert: heads not hoisted: $(grep 'PET post' "$w/report.txt" | tr -s ' ') $(tail -n1 "$w/err.log")"
  fi
fi

echo "$((checks - failures))/$checks checks ok"
((failures == 0))
