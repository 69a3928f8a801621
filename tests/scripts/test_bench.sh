#!/usr/bin/env bash
# test_bench.sh: the benchmark suite's harness runs end to end on the smallest model.
#
# tools/bench/bench_suite.py on tiny-cnn with depth-2 rules it makes itself: gen-rules,
# verify-rules, optimize, Teq's CPU executor and ONNX Runtime on the original and the
# optimized model. Checks that it exits 0, that its CSV has the model's row with every
# number filled in and the optimized model's outputs within 1e-4 of the original's, that
# the Markdown has the gen-rules and verify-rules rows and the PET table (tiny-cnn also
# optimized with the rules alone), and that the plot was drawn; that SIGTERM during the
# second of two models still writes the report of the first; and
# that an unknown model name is refused with exit status 2; and that bench_scaling.py
# reports NasRNN at scales 1 and 2. Timings are not checked.
# Exit: 0 ok, 1 failure, 77 (skipped) if python3's onnx/numpy, node or onnxruntime-node
# is missing.
# Environment: TEQ_BUILD (build dir, default build), TEQ_PYTHON (default /usr/bin/python3).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/scripts/oracles.sh
. "$ROOT/tests/scripts/oracles.sh"
BUILD=$(abspath "${TEQ_BUILD:-build}")
PY=${TEQ_PYTHON:-/usr/bin/python3}

require_python "$PY" onnx numpy
require_ort "$ROOT/tools/ort"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/teq-bench-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

rc=0
"$PY" "$ROOT/tools/bench/bench_suite.py" --build "$BUILD" --models tiny-cnn --depth 2 \
  --repeat 2 --budget 10 --time-limit 30 --gpu off --pet-models tiny-cnn --out "$WORK/out" \
  --cache "$WORK/cache" --keep >"$WORK/stdout" 2>"$WORK/stderr" || rc=$?
check "harness exits 0" "$rc" "exit $rc: $(tail -n 5 "$WORK/stderr" | tr '\n' ' ')"
kept=$(sed -n 's/^bench_suite: kept //p' "$WORK/stderr" | tail -1)
trap 'rm -rf "$WORK" ${kept:+"$kept"}' EXIT

# Every column of tiny-cnn's row is a number, and the optimized model computes what the
# original does.
row_ok=0
"$PY" - "$WORK/out/results_suite.csv" >"$WORK/csv.log" 2>&1 <<'PYEOF' || row_ok=$?
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 1 and rows[0]["model"] == "tiny-cnn", rows
r = rows[0]
for key in ("ops_before", "ops_after", "cost_before_us", "cost_after_us", "search_s",
            "optimize_s", "cpu_ms_before", "cpu_ms_after", "ort_ms_before", "ort_ms_after",
            "max_rel_diff", "diff_ort", "diff_teq", "rules_cost_after_us", "rules_search_s",
            "pet_mutants", "pet_applied", "pet_s"):
    float(r[key])  # raises on an empty cell
# Its five relus fused into their convs at import, its two residual adds (with the
# relus after them) into the convs before them, and its 2x2 max pool into the conv before it.
assert int(r["ops_before"]) == 11, r["ops_before"]
assert float(r["cost_after_us"]) <= float(r["cost_before_us"]), (r["cost_before_us"], r["cost_after_us"])
assert float(r["max_rel_diff"]) <= 1e-4, r["max_rel_diff"]
assert r["status"] == "ok", r["status"]
PYEOF
check "CSV row of tiny-cnn" "$row_ok" "$(tail -n 3 "$WORK/csv.log" | tr '\n' ' ')"

md_ok=0
grep -q '^| gen-rules | 2 |' "$WORK/out/results_suite.md" &&
  grep -q '^| verify-rules | 2 | .* proved, 0 refuted, 0 unknown |$' "$WORK/out/results_suite.md" &&
  grep -q '^| tiny-cnn | 11 |' "$WORK/out/results_suite.md" &&
  grep -q '^| model | est. us before | est. us, rules | est. us, rules + PET |' "$WORK/out/results_suite.md" &&
  [[ $(grep -c '^| tiny-cnn |' "$WORK/out/results_suite.md") == 2 ]] || md_ok=1
check "Markdown table" "$md_ok" "$(cat "$WORK/out/results_suite.md" 2>/dev/null | head -20)"

if command -v gnuplot >/dev/null 2>&1; then
  png_ok=0
  [[ $(head -c 8 "$WORK/out/results_suite.png" 2>/dev/null | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] ||
    png_ok=1
  check "plot is a PNG" "$png_ok" "no PNG at $WORK/out/results_suite.png"
else
  echo "note: gnuplot is not installed, so the plot is not checked (apt-get install gnuplot-nox)"
fi

# SIGTERM (an outer time limit) while the second model runs: the report still comes,
# with the first model's row whole and the second listed as not run.
"$PY" "$ROOT/tools/bench/bench_suite.py" --build "$BUILD" --models tiny-cnn,nasrnn --depth 2 \
  --repeat 2 --budget 10 --time-limit 30 --gpu off --ort off --pet-models none --no-plot \
  --out "$WORK/out3" --cache "$WORK/cache" >"$WORK/term.out" 2>"$WORK/term.err" &
suite=$!
for _ in $(seq 1200); do
  grep -q "^bench_suite: nasrnn: optimize" "$WORK/term.err" 2>/dev/null && break
  kill -0 "$suite" 2>/dev/null || break
  sleep 0.1
done
kill -TERM "$suite" 2>/dev/null || true
rc=0
wait "$suite" || rc=$?
term_ok=0
"$PY" - "$WORK/out3/results_suite.csv" >"$WORK/term.log" 2>&1 <<'PYEOF' || term_ok=$?
import csv, sys
rows = {r["model"]: r for r in csv.DictReader(open(sys.argv[1]))}
assert rows["tiny-cnn"]["status"] == "ok" and float(rows["tiny-cnn"]["cost_after_us"]) > 0, rows
assert rows["nasrnn"]["status"].startswith("not run"), rows["nasrnn"]["status"]
PYEOF
[[ $rc == 1 ]] || term_ok=1
check "SIGTERM: a report of the models done" "$term_ok" \
  "exit $rc; $(tail -n 3 "$WORK/term.log" "$WORK/term.err" 2>/dev/null | tr '\n' ' ')"

# bench_scaling.py with the depth-2 rules of the first run: NasRNN at scales 1 and 2, a
# row each, operators in proportion, and the growth line.
rc=0
"$PY" "$ROOT/tools/bench/bench_scaling.py" --build "$BUILD" --rules "$kept/rules_d2.sqlite" \
  --models nasrnn:1,2 --repeat 1 --no-pet >"$WORK/scaling.md" 2>"$WORK/scaling.err" || rc=$?
scaling_ok=0
[[ $rc == 0 ]] && grep -Eq '^\| nasrnn \| 1 \| 222 \|' "$WORK/scaling.md" &&
  grep -Eq '^\| nasrnn \| 2 \| 452 \|' "$WORK/scaling.md" &&
  grep -Eq '^nasrnn: x2 over x1: operators 2\.04x, search seconds [0-9.]+x$' "$WORK/scaling.md" ||
  scaling_ok=1
check "bench_scaling on NasRNN x1, x2" "$scaling_ok" \
  "exit $rc: $(cat "$WORK/scaling.md" "$WORK/scaling.err" 2>/dev/null | tail -n 6 | tr '\n' ' ')"

rc=0
"$PY" "$ROOT/tools/bench/bench_suite.py" --build "$BUILD" --models no-such-model \
  --out "$WORK/out2" >"$WORK/bad.out" 2>&1 || rc=$?
bad_ok=1
[[ $rc == 2 ]] && grep -q "unknown model(s) no-such-model" "$WORK/bad.out" && bad_ok=0
check "unknown model refused with exit 2" "$bad_ok" "exit $rc: $(cat "$WORK/bad.out")"

((failures == 0))
