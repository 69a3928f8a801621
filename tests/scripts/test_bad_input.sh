#!/usr/bin/env bash
# Bad ONNX files must be reported, never crash: run-model on each malformed model (or
# input) must exit with status 2 and print a message naming the file, and the node or
# tensor at fault where there is one. A crash (signal, exit >= 128), a hang, or any
# sanitizer report in stderr is a failure, whatever the exit status.
#
#   tests/scripts/test_bad_input.sh
#
# The bad files are built in a temporary directory with onnx.helper (Debian's
# /usr/bin/python3 with python3-onnx; override with TEQ_PYTHON); exit 77 (skip) without it.
# Environment: TEQ_BUILD (build dir, default build), TEQ_BAD_TIMEOUT (seconds, default 60).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/scripts/oracles.sh
. "$ROOT/tests/scripts/oracles.sh"
BUILD=$(abspath "${TEQ_BUILD:-build}")
PY=${TEQ_PYTHON:-/usr/bin/python3}
TMO=${TEQ_BAD_TIMEOUT:-60}
RUN_MODEL=$BUILD/tools/run-model

if ! "$PY" -c 'import onnx, numpy' 2>/dev/null; then
  echo "SKIP: $PY lacks onnx/numpy (Debian: apt-get install python3-onnx)"
  exit 77
fi
if [[ ! -x $RUN_MODEL ]]; then
  echo "FAIL: $RUN_MODEL not built (set TEQ_BUILD to the build directory)"
  exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/teq-bad.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# Build the bad files. Each model is small and deterministic.
"$PY" - "$WORK" <<'EOF'
import os, random, sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out = sys.argv[1]
F = TensorProto.FLOAT
rng = np.random.default_rng(7)


def model(nodes, inputs, outputs, inits=(), name="bad"):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                             producer_name="teq-test-bad-input")


def save(m, fname):
    with open(os.path.join(out, fname), "wb") as f:
        f.write(m.SerializeToString())


def weights(name, shape):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


# A small, valid CNN: Conv-Relu-MaxPool-Conv-GlobalAveragePool-Flatten-Gemm.
good = model(
    [helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
     helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
     helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
     helper.make_node("Conv", ["p1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
     helper.make_node("GlobalAveragePool", ["c2"], ["g"], name="gap"),
     helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
     helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["output"], name="fc", transB=1)],
    [helper.make_tensor_value_info("input", F, [1, 3, 32, 32])],
    [helper.make_tensor_value_info("output", F, [1, 10])],
    [weights("w1", [16, 3, 3, 3]), weights("b1", [16]), weights("w2", [32, 16, 3, 3]),
     weights("fc_w", [10, 32]), weights("fc_b", [10])], name="small_cnn")
onnx.checker.check_model(good)
save(good, "good.onnx")
np.zeros((1, 3, 32, 32), np.float32).tofile(os.path.join(out, "good_input.bin"))
# 1000 floats where 3072 are needed.
np.zeros(1000, np.float32).tofile(os.path.join(out, "short_input.bin"))

# Empty file.
open(os.path.join(out, "empty.onnx"), "wb").close()

# The valid model cut inside its largest initializer (w2's raw_data, ~60% in).
data = good.SerializeToString()
with open(os.path.join(out, "truncated.onnx"), "wb") as f:
    f.write(data[: int(len(data) * 0.6)])

# Random bytes (fixed seed).
with open(os.path.join(out, "garbage.onnx"), "wb") as f:
    f.write(random.Random(1234).randbytes(4096))

# A Conv whose weight is neither an initializer nor a graph input nor a node output.
save(model([helper.make_node("Conv", ["input", "W_missing"], ["output"], name="conv_missing_w")],
           [helper.make_tensor_value_info("input", F, [1, 3, 8, 8])],
           [helper.make_tensor_value_info("output", F, None)]), "missing_init.onnx")

# MatMul [2,3] x [4,5].
save(model([helper.make_node("MatMul", ["a", "b"], ["output"], name="matmul_bad")],
           [helper.make_tensor_value_info("a", F, [2, 3]),
            helper.make_tensor_value_info("b", F, [4, 5])],
           [helper.make_tensor_value_info("output", F, None)]), "matmul_mismatch.onnx")

# Conv with auto_pad="FOO".
save(model([helper.make_node("Conv", ["input", "w"], ["output"], name="conv_autopad_foo",
                             auto_pad="FOO")],
           [helper.make_tensor_value_info("input", F, [1, 3, 8, 8])],
           [helper.make_tensor_value_info("output", F, None)],
           [weights("w", [4, 3, 3, 3])]), "conv_autopad.onnx")

# Conv with group=0 (a division by zero waiting to happen).
save(model([helper.make_node("Conv", ["input", "w"], ["output"], name="conv_group_zero", group=0)],
           [helper.make_tensor_value_info("input", F, [1, 4, 8, 8])],
           [helper.make_tensor_value_info("output", F, None)],
           [weights("w", [4, 4, 3, 3])]), "conv_group0.onnx")

# Reshape of 6 elements to [4,2], shape from an initializer.
save(model([helper.make_node("Reshape", ["input", "shape"], ["output"], name="reshape_bad")],
           [helper.make_tensor_value_info("input", F, [2, 3])],
           [helper.make_tensor_value_info("output", F, None)],
           [numpy_helper.from_array(np.array([4, 2], np.int64), "shape")]), "reshape_mismatch.onnx")

# An initializer whose raw_data holds 10 floats where its dims say 4x3x3x3 = 108.
# (built by hand: helper.make_tensor refuses the mismatch)
short = TensorProto(name="W_short", data_type=F, dims=[4, 3, 3, 3],
                    raw_data=np.zeros(10, np.float32).tobytes())
save(model([helper.make_node("Conv", ["input", "W_short"], ["output"], name="conv_short_w")],
           [helper.make_tensor_value_info("input", F, [1, 3, 8, 8])],
           [helper.make_tensor_value_info("output", F, None)],
           [short]), "short_initializer.onnx")

# Two nodes feeding each other: a cycle.
save(model([helper.make_node("Relu", ["y_b"], ["y_a"], name="cycle_a"),
            helper.make_node("Add", ["input", "y_a"], ["y_b"], name="cycle_b")],
           [helper.make_tensor_value_info("input", F, [1, 4])],
           [helper.make_tensor_value_info("y_b", F, [1, 4])]), "cycle.onnx")

# A model without a graph.
with open(os.path.join(out, "no_graph.onnx"), "wb") as f:
    f.write(onnx.ModelProto(ir_version=8, opset_import=[helper.make_opsetid("", 13)])
            .SerializeToString())
EOF

failures=0
checks=0
SANITIZER_RE='AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:|MemorySanitizer|ThreadSanitizer|Segmentation fault|core dumped'

# check LABEL "REQUIRED;STRINGS" RUN-MODEL-ARGS...: run-model must exit 2 and its stderr
# must contain every required string (file names, node and tensor names).
check() {
  local label=$1 required=$2; shift 2
  local err=$WORK/$label.stderr rc=0 problems=() s
  timeout "$TMO" "$RUN_MODEL" --quiet --seed 1 "$@" >"$WORK/$label.stdout" 2>"$err" || rc=$?
  if ((rc == 124)); then problems+=("hung (killed after ${TMO}s)")
  elif ((rc >= 128)); then problems+=("crashed with signal $((rc - 128))")
  elif ((rc != 2)); then problems+=("exit $rc, expected 2")
  fi
  if grep -Eq "$SANITIZER_RE" "$err"; then
    problems+=("sanitizer/crash report: $(grep -Em1 "$SANITIZER_RE" "$err" | cut -c1-160)")
  fi
  IFS=';' read -ra want <<<"$required"
  for s in "${want[@]}"; do
    [[ -z $s ]] || grep -qF -- "$s" "$err" || problems+=("message does not name '$s'")
  done
  local msg
  msg=$(grep -v '^[[:space:]]*$' "$err" | head -n 1 | cut -c1-200 || true)
  checks=$((checks + 1))
  if ((${#problems[@]} == 0)); then
    printf 'ok   %-22s exit 2: %s\n' "$label" "$msg"
  else
    failures=$((failures + 1))
    local joined
    joined=$(printf '%s; ' "${problems[@]}")
    printf 'FAIL %-22s %sstderr: %s\n' "$label" "$joined" "${msg:-(empty)}"
  fi
}

W=$WORK
# Sanity: the valid model runs (otherwise every "exit 2" below proves nothing).
rc=0
timeout "$TMO" "$RUN_MODEL" --quiet --seed 1 "$W/good.onnx" >"$W/good.out" 2>"$W/good.err" || rc=$?
checks=$((checks + 1))
if ((rc == 0)) && ! grep -Eq "$SANITIZER_RE" "$W/good.err"; then
  echo "ok   good.onnx              runs (exit 0)"
else
  failures=$((failures + 1))
  echo "FAIL good.onnx              the valid control model: exit $rc: $(head -c 200 "$W/good.err")"
fi

check empty             "empty.onnx"                                   "$W/empty.onnx"
check truncated         "truncated.onnx"                               "$W/truncated.onnx"
check garbage           "garbage.onnx"                                 "$W/garbage.onnx"
check missing-file      "does_not_exist.onnx"                          "$W/does_not_exist.onnx"
check no-graph          "no_graph.onnx"                                "$W/no_graph.onnx"
check missing-init      "missing_init.onnx;conv_missing_w"             "$W/missing_init.onnx"
check matmul-mismatch   "matmul_mismatch.onnx;matmul_bad"              "$W/matmul_mismatch.onnx"
check conv-autopad      "conv_autopad.onnx;conv_autopad_foo"           "$W/conv_autopad.onnx"
check conv-group0       "conv_group0.onnx;conv_group_zero"             "$W/conv_group0.onnx"
check reshape-mismatch  "reshape_mismatch.onnx;reshape_bad"            "$W/reshape_mismatch.onnx"
check short-initializer "short_initializer.onnx;W_short"               "$W/short_initializer.onnx"
check cycle             "cycle.onnx"                                   "$W/cycle.onnx"
# The bad models test_onnx checks message by message (tests/data/onnx/bad_*.onnx, each
# once a crash, an overflow or a silent failure): through run-model each must exit 2,
# naming its file, with no sanitizer report.
for f in "$ROOT"/tests/data/onnx/bad_*.onnx; do
  name=$(basename "$f")
  check "${name%.onnx}" "$name" "$f"
done
check short-input-file  "short_input.bin"      --input "input=$W/short_input.bin" "$W/good.onnx"
check missing-input     "no_such_input.bin"    --input "input=$W/no_such_input.bin" "$W/good.onnx"
check unknown-input     "not_an_input"         --input "not_an_input=$W/good_input.bin" "$W/good.onnx"

echo "$((checks - failures))/$checks checks ok"
((failures == 0))
