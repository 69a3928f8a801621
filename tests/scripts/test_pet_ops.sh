#!/usr/bin/env bash
# test_pet_ops.sh: bench-pet-ops (PET's operator benchmark, its Table 3)
# runs end to end on its conv cases: every corrected mutant computes what
# the original does (the tool fails above 1e-4), and the mutants PET's
# paper names are among them: the dilated conv as a dense conv on phase
# images (Fig. 3) and the two 1x1 convs on one input as one conv on
# concatenated kernels (Fig. 10a), both exact. An unknown option is refused
# with exit status 2. Timings are not checked.
# Environment: TEQ_BUILD (build dir, default build).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/scripts/oracles.sh
. "$ROOT/tests/scripts/oracles.sh"
TOOL=$(abspath "${TEQ_BUILD:-build}")/tools/bench-pet-ops
WORK=$(mktemp -d "${TMPDIR:-/tmp}/teq-pet-ops.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

rc=0
"$TOOL" --cases conv,dilatedconv,groupconv --repeat 1 >"$WORK/out" 2>"$WORK/err" || rc=$?
cat "$WORK/out"
check "bench-pet-ops exits 0" "$rc" "exit $rc: $(tail -n 3 "$WORK/err" | tr '\n' ' ')"
for c in conv dilatedconv groupconv; do
  n=$(grep -c "^### $c " "$WORK/out" || true)
  check "a table for $c" "$((n == 1 ? 0 : 1))" "$n tables"
done
has_row() { grep -qF -- "| $1 | none (exact) |" "$WORK/out" && echo 0 || echo 1; }
check "dilated conv -> dense conv on phase images, exact" \
  "$(has_row 'layout H,W phases 2 -> batch, conv2d pads=(1 1 1 1), layout batch -> H,W phases 2')" "row missing"
check "two 1x1 convs -> one conv and a split, exact" \
  "$(has_row 'kernels concatenated on axis 0, conv2d, split on axis 1')" "row missing"
# every program's row ends with its largest relative difference from the original
bad=$(awk -F'|' '/^\| / && $2 !~ /program|---/ { if ($(NF-1) + 0 > 1e-4) print }' "$WORK/out")
check "every program within 1e-4 of the original" "$([[ -z $bad ]] && echo 0 || echo 1)" "$bad"

rc=0
"$TOOL" --no-such-option 1 >/dev/null 2>"$WORK/err" || rc=$?
check "unknown option: exit 2" "$((rc == 2 ? 0 : 1))" "exit $rc"
((failures == 0))
