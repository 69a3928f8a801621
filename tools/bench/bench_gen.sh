#!/usr/bin/env bash
# bench_gen.sh: gen-rules at each depth with TASO's operator set, one fresh
# database per depth. Prints a table (depth, wall time, peak RSS, graphs
# enumerated and fingerprinted, pairs and the count after each pruning
# step) and writes it as CSV and Markdown. Targets on a 2-core machine:
# depth 3 in <= 30 s, depth 4 in <= 30 min with <= 8 GB peak RSS.
#
#   tools/bench/bench_gen.sh [DEPTH...]        # default: 3 4
#
# Environment: TEQ_BENCH_BUILD (default build-release), TEQ_BENCH_OUT
# (default tools/bench), TEQ_GEN_THREADS (default: online CPUs).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${TEQ_BENCH_BUILD:-build-release}
out=${TEQ_BENCH_OUT:-tools/bench}
gen="$build/gen/gen-rules"
[ -x "$gen" ] || { echo "bench_gen: $gen not built (see tools/bench/README.md)" >&2; exit 2; }
depths=("$@")
[ ${#depths[@]} = 0 ] && depths=(3 4)
threads=${TEQ_GEN_THREADS:-$(nproc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

csv="$out/results_gen.csv"
md="$out/results_gen.md"
echo "depth,wall_s,cpu_s,enumerate_s,buckets_s,merge_s,peak_rss_mb,graphs,fingerprinted,collisions,shape_specific,pairs,after_renaming,after_common,after_disjoint,after_float32" >"$csv"
field() { sed -n "s/^  $1 *\([0-9]*\)\$/\1/p" "$2"; }
for depth in "${depths[@]}"; do
  log="$work/d$depth.out"
  start=$(date +%s.%N)
  # CPU time (user + system) next to wall time: on a shared machine the
  # wall time says how busy the machine was as much as how fast we are.
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f "%U %S" -o "$work/d$depth.cpu" \
      "$gen" --depth "$depth" --threads "$threads" --db "$work/d$depth.sqlite" --quiet >"$log"
    cpu=$(awk '{printf "%.1f", $1 + $2}' "$work/d$depth.cpu")
  else
    "$gen" --depth "$depth" --threads "$threads" --db "$work/d$depth.sqlite" --quiet >"$log"
    cpu=
  fi
  end=$(date +%s.%N)
  rss=$(sed -n 's/.*peak RSS \([0-9.]*\) MB.*/\1/p' "$log")
  phase() { sed -n "s/.*$1 \([0-9.]*\) s.*/\1/p" "$log"; }
  printf '%s,%.1f,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' "$depth" "$(echo "$end - $start" | bc)" \
    "$cpu" "$(phase 'enumerate')" "$(phase 'buckets')" "$(phase 'merge+store')" "$rss" \
    "$(field 'graphs enumerated' "$log")" "$(field 'graphs fingerprinted' "$log")" \
    "$(field 'fingerprint collisions' "$log")" "$(field 'equal at one shape only' "$log")" \
    "$(field 'candidate pairs (initial)' "$log")" "$(field 'after input renaming' "$log")" \
    "$(field 'after common subgraphs' "$log")" "$(field 'after disjoint unions' "$log")" \
    "$(field 'after float32 check' "$log")" >>"$csv"
done
{
  echo "gen-rules, TASO's operator set, $threads threads; $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"
  echo
  head -1 "$csv" | sed 's/^/| /; s/$/ |/; s/,/ | /g'
  head -1 "$csv" | sed 's/[^,]*/---/g; s/^/| /; s/$/ |/; s/,/ | /g'
  tail -n +2 "$csv" | sed 's/^/| /; s/$/ |/; s/,/ | /g'
} >"$md"
cat "$md"
