#!/usr/bin/env bash
# bench_verify.sh: verify-rules on gen-rules' depth-3 candidate set (TASO's
# operator set) and verify-rules --check-axioms on specs/ops.axioms. Prints a
# table (wall time, rules, proved/refuted/unknown, slowest rule, axiom
# instances; --check-axioms wall time and its verdicts) and writes it as
# Markdown. Targets on a 2-core machine: every valid depth-3 rule proved,
# none unknown, in <= 30 s; --check-axioms in <= 10 min.
#
#   tools/bench/bench_verify.sh [DEPTH...]        # default: 3
#
# Environment: TEQ_BENCH_BUILD (default build-release), TEQ_BENCH_OUT
# (default tools/bench), TEQ_VERIFY_JOBS (default: online CPUs),
# TEQ_BENCH_DB_DIR (reuse gen-rules databases named dN.sqlite there; they
# are copied, never written).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${TEQ_BENCH_BUILD:-build-release}
out=${TEQ_BENCH_OUT:-tools/bench}
gen="$build/gen/gen-rules"
verify="$build/verify/verify-rules"
for exe in "$gen" "$verify"; do
  [ -x "$exe" ] || { echo "bench_verify: $exe not built (see tools/bench/README.md)" >&2; exit 2; }
done
depths=("$@")
[ ${#depths[@]} = 0 ] && depths=(3)
jobs=${TEQ_VERIFY_JOBS:-$(nproc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

field() { sed -n "s/^ *$1 *\([0-9.]*\).*/\1/p" "$2" | head -1; }
md="$out/results_verify.md"
{
  echo "verify-rules, specs/ops.axioms, $jobs jobs; $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"
  echo
  echo "| depth | rules | wall s | proved | refuted | unknown | slowest rule ms | axiom instances |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$md"
for depth in "${depths[@]}"; do
  db="$work/d$depth.sqlite"
  if [ -n "${TEQ_BENCH_DB_DIR:-}" ] && [ -f "$TEQ_BENCH_DB_DIR/d$depth.sqlite" ]; then
    cp "$TEQ_BENCH_DB_DIR/d$depth.sqlite" "$db"
  else
    "$gen" --depth "$depth" --db "$db" --quiet >/dev/null
  fi
  log="$work/v$depth.out"
  start=$(date +%s.%N)
  "$verify" --db "$db" --jobs "$jobs" --quiet specs/ops.axioms >"$log"
  end=$(date +%s.%N)
  printf '| %s | %s | %.1f | %s | %s | %s | %s | %s |\n' "$depth" "$(field 'rules in the database' "$log")" \
    "$(echo "$end - $start" | bc)" "$(field proved "$log")" "$(field refuted "$log")" \
    "$(field unknown "$log")" "$(field 'slowest rule' "$log")" \
    "$(field 'axiom instances given to Z3' "$log")" >>"$md"
done
log="$work/check.out"
start=$(date +%s.%N)
status=0
"$verify" --check-axioms --jobs "$jobs" --quiet specs/ops.axioms >"$log" || status=$?
end=$(date +%s.%N)
{
  echo
  printf -- '--check-axioms: %.0f s wall, exit status %s\n\n' "$(echo "$end - $start" | bc)" "$status"
  grep -E '^(validation|redundancy|consistency):' "$log" | sed 's/^/    /'
} >>"$md"
cat "$md"
