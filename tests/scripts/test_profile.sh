#!/usr/bin/env bash
# teq-profile without a GPU: the configurations a model runs are recorded,
# a table of measurements is calibrated, and a model is priced from it.
#
#   tests/scripts/test_profile.sh
#
# The calibration is checked on a table made here with known answers: relus
# of every size timed as launch + bytes / 2000 GB/s, and one sigmoid of 512
# elements, whose time is all launch. The relus must give back about that
# bandwidth; the sigmoid must not be fitted at all (its bytes are 1/1000 of
# a launch: any efficiency explains them), and a large sigmoid priced from
# the table must cost what moving its bytes costs, not what a fit to launch
# noise would say. A table measured again in part merges into it. The
# recorded configurations need no oracle. `ways` needs a model, and says so
# without a GPU.
# Environment: TEQ_BUILD (build dir), TEQ_PYTHON (/usr/bin/python3).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/scripts/oracles.sh
. "$ROOT/tests/scripts/oracles.sh"
BUILD=$(abspath "${TEQ_BUILD:-build}")
PY=${TEQ_PYTHON:-/usr/bin/python3}
PROF=$BUILD/tools/teq-profile
require_python "$PY" numpy onnx

WORK=$(mktemp -d "${TMPDIR:-/tmp}/teq-profile.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# --- record: every configuration of a model, once each, each one a table key.
"$BUILD/tools/build-model" tiny-cnn "$WORK/tiny.onnx" 2>/dev/null
"$PROF" record -o "$WORK/configs.txt" "$WORK/tiny.onnx" 2>"$WORK/err.log"
n=$(grep -c . "$WORK/configs.txt" || true)
dups=$(sort "$WORK/configs.txt" | uniq -d | wc -l)
if ((n > 3 && dups == 0)) && grep -q '^conv2d \[' "$WORK/configs.txt"; then
  ok "record: $n configurations of tiny-cnn, none twice"
else
  fail "record: $n configurations, $dups repeated: $(head -n3 "$WORK/configs.txt" | tr '\n' ';')"
fi

# --- calibrate a table with known answers.
"$PY" - "$WORK/table.tsv" <<'PY'
import sys
launch, gbps = 1.5, 2000.0
rows = ["# device\tconfiguration\tmedian_us\tmin_us\talgo"]
for c, hw in ((16, 8), (64, 28), (128, 56), (64, 112), (128, 112), (256, 112), (512, 112)):
    numel = c * hw * hw
    us = launch + 2 * 4 * numel / (gbps * 1e3)      # read and write float32
    rows.append(f"Test GPU\trelu [1,{c},{hw},{hw}] {{}}\t{us:.3f}\t{us:.3f}\t-")
rows.append("Test GPU\tsigmoid [1,512] {}\t1.605\t1.603\t-")
open(sys.argv[1], "w").write("\n".join(rows) + "\n")
PY
if "$PROF" calibrate -o "$WORK/cal.tsv" "$WORK/table.tsv" >"$WORK/cal.log" 2>"$WORK/err.log"; then
  ok "calibrate: $(grep -m1 'launch overhead' "$WORK/cal.log")"
else
  fail "calibrate: $(tail -n1 "$WORK/err.log")"
fi
relu=$(awk -F'\t' '$1 == "#calib" && $2 ~ /^relu / {split($2, a, " "); print a[3]}' "$WORK/cal.tsv")
if [[ -n $relu ]] && "$PY" -c "import sys; e = float(sys.argv[1]); sys.exit(not 0.5 < e < 0.7)" "$relu"; then
  ok "calibrate: relu's bandwidth efficiency $relu (2000 of 3350 GB/s is 0.60)"
else
  fail "calibrate: relu's bandwidth efficiency '${relu:-none}', expected about 0.60"
fi
if grep -q $'^#calib\tsigmoid' "$WORK/cal.tsv"; then
  fail "calibrate: fitted sigmoid from one launch-bound sample: $(grep $'^#calib\tsigmoid' "$WORK/cal.tsv")"
else
  ok "calibrate: a sigmoid of 512 elements fits no efficiency"
fi

# --- merge: a table measured again in part. Two relus measured anew (one the
# table has, one it lacks) replace and join its rows; the calibrated table's
# #calib lines are dropped (calibrate makes them again); a table of another
# device, or a row that is no measurement, is refused with exit 2.
printf 'Test GPU\trelu [1,16,8,8] {}\t9.000\t9.000\t-\nTest GPU\trelu [1,8,8,8] {}\t1.700\t1.700\t-\n' \
  >"$WORK/again.tsv"
if "$PROF" merge -o "$WORK/merged.tsv" "$WORK/cal.tsv" "$WORK/again.tsv" >"$WORK/merge.log" 2>&1 &&
   [[ $(grep -vc '^#' "$WORK/merged.tsv") == 9 ]] && ! grep -q '^#calib' "$WORK/merged.tsv" &&
   [[ $(grep -c $'relu \[1,16,8,8\] {}\t9.000' "$WORK/merged.tsv") == 1 ]] &&
   [[ $(grep -c 'relu \[1,16,8,8\]' "$WORK/merged.tsv") == 1 ]]; then
  ok "merge: $(cat "$WORK/merge.log")"
else
  fail "merge: $(cat "$WORK/merge.log"): $(grep -c . "$WORK/merged.tsv") lines"
fi
sed 's/^Test GPU/Other GPU/' "$WORK/again.tsv" >"$WORK/other.tsv"
printf 'no tabs here\n' >"$WORK/junk.tsv"
for bad in other junk; do
  rc=0; "$PROF" merge -o "$WORK/bad.tsv" "$WORK/cal.tsv" "$WORK/$bad.tsv" 2>"$WORK/err.log" || rc=$?
  if ((rc == 2)) && grep -Eq "one device|not a measurement" "$WORK/err.log"; then
    ok "merge refuses $bad.tsv: $(tail -n1 "$WORK/err.log")"
  else
    fail "merge of $bad.tsv: exit $rc, $(tail -n1 "$WORK/err.log")"
  fi
done

# --- cost: a large sigmoid priced from that table, against moving its bytes at full speed.
"$PY" - "$WORK/sigmoid.onnx" <<'PY'
import sys
import onnx
from onnx import TensorProto, helper
shape = [1, 96, 112, 112]
g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"])], "s",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
"$PROF" cost --table "$WORK/cal.tsv" "$WORK/sigmoid.onnx" >"$WORK/cost.log" 2>&1 || true
us=$(sed -n 's/.* \([0-9.]*\) us in all.*/\1/p' "$WORK/cost.log")
# 9.6 MB: 2.9 us at 3350 GB/s plus the launch; a fit to the small sample said about 250 us.
if [[ -n $us ]] && "$PY" -c "import sys; sys.exit(not 3 < float(sys.argv[1]) < 12)" "$us"; then
  ok "cost: sigmoid [1,96,112,112] priced $us us"
else
  fail "cost: sigmoid [1,96,112,112] priced '${us:-?}' us: $(head -n2 "$WORK/cost.log" | tr '\n' ';')"
fi

# --- ways: a model is required; without a GPU the command says so, with one
# it lists every distinct convolution of tiny-cnn.
rc=0; "$PROF" ways 2>"$WORK/err.log" || rc=$?
if ((rc == 2)) && grep -q "no model given" "$WORK/err.log"; then
  ok "ways without a model: exit 2"
else
  fail "ways without a model: exit $rc, $(tail -n1 "$WORK/err.log")"
fi
rc=0; "$PROF" ways "$WORK/tiny.onnx" >"$WORK/ways.log" 2>"$WORK/err.log" || rc=$?
if ((rc == 0)) && grep -q "distinct convolutions and products" "$WORK/ways.log"; then
  ok "ways: $(tail -n1 "$WORK/ways.log")"
elif ((rc != 0)) && grep -Eq "GPU|CUDA" "$WORK/err.log"; then
  ok "ways without a GPU: exit $rc, $(tail -n1 "$WORK/err.log")"
else
  fail "ways: exit $rc, $(tail -n1 "$WORK/err.log") $(tail -n1 "$WORK/ways.log")"
fi

echo "$((checks - failures))/$checks checks ok"
((failures == 0))
