#!/usr/bin/env bash
# gen-rules from the outside: bad arguments and databases are refused with status 2,
# runs are deterministic for a seed, a finished database is left alone, and a run
# killed with SIGKILL at any phase leaves an intact database that the same command
# completes to the same rules as an uninterrupted run.
#
#   tests/scripts/test_gen_rules.sh
#
# Queries the databases with the sqlite3 command-line tool; exit 77 (skip) without it.
# Environment: TEQ_BUILD (build dir, default build), TEQ_GEN_TIMEOUT (seconds per
# gen-rules run, default 120).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/scripts/oracles.sh
. "$ROOT/tests/scripts/oracles.sh"
BUILD=$(abspath "${TEQ_BUILD:-build}")
TMO=${TEQ_GEN_TIMEOUT:-120}
GEN=$BUILD/gen/gen-rules

if ! command -v sqlite3 >/dev/null 2>&1; then
  echo "SKIP: the sqlite3 command-line tool is not installed (Debian: apt-get install sqlite3)"
  exit 77
fi
if [[ ! -x $GEN ]]; then
  echo "FAIL: $GEN not built (set TEQ_BUILD to the build directory)"
  exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/teq-gen.XXXXXX")
bg_pid=
cleanup() {
  if [[ -n $bg_pid ]]; then kill -9 "$bg_pid" 2>/dev/null || true; fi
  chmod -R u+w "$WORK" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
W=$WORK
cd "$W"

SANITIZER_RE='AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:|Segmentation fault|core dumped'

fail() {
  echo "FAIL: $*"
  exit 1
}
ok() { echo "ok: $*"; }

# first_line FILE: the first non-blank line, for messages.
first_line() { grep -v '^[[:space:]]*$' "$1" | head -n 1 | cut -c1-200 || true; }

# gen LABEL ARGS...: runs gen-rules with stdout in LABEL.out and stderr in LABEL.err; sets
# rc. A hang, a signal or a sanitizer report fails at once.
rc=0
gen() {
  local label=$1; shift
  rc=0
  timeout "$TMO" "$GEN" "$@" >"$W/$label.out" 2>"$W/$label.err" || rc=$?
  if ((rc == 124)); then fail "$label: gen-rules $* hung (killed after ${TMO}s)"; fi
  if ((rc >= 128)); then fail "$label: gen-rules $* died of signal $((rc - 128)): $(first_line "$W/$label.err")"; fi
  if grep -Eq "$SANITIZER_RE" "$W/$label.err"; then
    fail "$label: gen-rules $*: sanitizer report: $(grep -Em1 "$SANITIZER_RE" "$W/$label.err" | cut -c1-200)"
  fi
}

# gen_ok LABEL ARGS...: gen-rules must succeed.
gen_ok() {
  local label=$1
  gen "$@"
  ((rc == 0)) || fail "$label: gen-rules ${*:2}: exit $rc: $(first_line "$W/$label.err")"
}

# sql DB QUERY: the query's rows ('|'-separated).
sql() { sqlite3 -batch "$1" "$2"; }

# integrity DB LABEL: PRAGMA integrity_check must say ok.
integrity() {
  local out
  out=$(sql "$1" 'PRAGMA integrity_check' 2>&1) || fail "$2: sqlite3 cannot read $1: $out"
  [[ $out == ok ]] || fail "$2: integrity_check on $1: $(head -c 300 <<<"$out")"
}

# stored OUT: the number after 'new rules stored' in a summary.
stored() { awk '/new rules stored/ { print $NF }' "$1"; }

# no_workdirs DB LABEL: no <db>.gen-* work directory is left beside DB.
no_workdirs() {
  local left
  left=$(compgen -G "$1.gen-*" || true)
  [[ -z $left ]] || fail "$2: work directory left behind: $left"
}

# ---- 1. bad arguments: exit 2, a message naming the problem, no database created ----

# bad_arg LABEL "REQUIRED;STRINGS" ARGS...
bad_arg() {
  local label=$1 required=$2 s; shift 2
  rm -f "$W/arg.db"
  gen "$label" --db "$W/arg.db" --quiet "$@"
  ((rc == 2)) || fail "$label: gen-rules $*: exit $rc, expected 2: $(first_line "$W/$label.err")"
  [[ -s $W/$label.err ]] || fail "$label: gen-rules $*: exit 2 but nothing on stderr"
  IFS=';' read -ra want <<<"$required"
  for s in "${want[@]}"; do
    grep -qF -- "$s" "$W/$label.err" ||
      fail "$label: gen-rules $*: message does not name '$s': $(first_line "$W/$label.err")"
  done
  [[ ! -e $W/arg.db ]] || fail "$label: gen-rules $*: created the database although the arguments are bad"
  ok "$label: exit 2: $(first_line "$W/$label.err")"
}

bad_arg depth-0         "--depth;0"         --depth 0
bad_arg depth-x         "--depth;x"         --depth x
bad_arg depth-9         "--depth;9"         --depth 9
bad_arg threads-0       "--threads;0"       --threads 0
bad_arg seed-negative   "--seed;-1"         --seed -1
bad_arg unknown-option  "unknown option;--frobnicate" --frobnicate 1
bad_arg unknown-novalue "unknown option;--frobnicate" --frobnicate
bad_arg missing-value   "--depth;needs a value" --depth
bad_arg ops-unknown     "nosuchop"          --depth 1 --ops nosuchop
bad_arg ops-resize      "resize"            --depth 1 --ops resize
bad_arg ops-mixed       "--ops"             --depth 1 --ops +relu,matmul
bad_arg ops-empty       "--ops"             --depth 1 --ops ''

# ---- 2. databases that are not Teq's, and places it cannot write ----

# bad_db LABEL "REQUIRED;STRINGS" DB: exit 2 naming DB's problem; an existing DB is unchanged.
bad_db() {
  local label=$1 required=$2 db=$3 before='' after s
  [[ -e $db ]] && before=$(cksum <"$db")
  gen "$label" --depth 1 --quiet --db "$db"
  ((rc == 2)) || fail "$label: gen-rules --db $db: exit $rc, expected 2: $(first_line "$W/$label.err")"
  IFS=';' read -ra want <<<"$required"
  for s in "${want[@]}"; do
    grep -qF -- "$s" "$W/$label.err" ||
      fail "$label: gen-rules --db $db: message does not name '$s': $(first_line "$W/$label.err")"
  done
  if [[ -n $before ]]; then
    after=$(cksum <"$db")
    [[ $before == "$after" ]] || fail "$label: gen-rules changed $db although it refused it"
  fi
  no_workdirs "$db" "$label"
  ok "$label: exit 2: $(first_line "$W/$label.err")"
}

printf 'these are not the rules you are looking for\n' >"$W/text.db"
bad_db text-file "text.db;not a SQLite database" "$W/text.db"
sql "$W/foreign.db" 'create table foo(x); insert into foo values (1)'
bad_db foreign-sqlite "foreign.db" "$W/foreign.db"
[[ $(sql "$W/foreign.db" "select group_concat(name) from sqlite_master") == foo ]] ||
  fail "foreign-sqlite: gen-rules added tables to another application's database"
bad_db no-directory "nonexistent" "$W/nonexistent/rules.db"

# An empty file (what a run killed right after creating the database leaves) is a new database.
: >"$W/empty.db"
gen_ok empty-file --depth 1 --quiet --db "$W/empty.db"
[[ $(sql "$W/empty.db" "select status from runs") == "done" ]] || fail "empty-file: no finished run in the database"
integrity "$W/empty.db" empty-file
ok "empty-file: an empty --db file is taken as a new database ($(sql "$W/empty.db" 'select count(*) from rules') rules)"

if [ "$(id -u)" = 0 ]; then
  echo "ok: read-only-dir: skipped (running as root, permissions do not apply)"
else
  mkdir "$W/ro"
  chmod 555 "$W/ro"
  gen read-only-dir --depth 1 --quiet --db "$W/ro/rules.db"
  ((rc != 0)) || fail "read-only-dir: gen-rules wrote into a read-only directory (exit 0)"
  [[ -s $W/read-only-dir.err ]] || fail "read-only-dir: exit $rc but nothing on stderr"
  ok "read-only-dir: exit $rc: $(first_line "$W/read-only-dir.err")"
fi

# ---- 3. determinism ----

SMALL=(--depth 2)
ROWS='select key, text, status, depth, hex(src), hex(dst) from rules order by key'
KEYS='select key from rules order by key'

gen_ok det-a "${SMALL[@]}" --quiet --db "$W/a.db"
gen_ok det-b "${SMALL[@]}" --quiet --db "$W/b.db"
grep -q 'candidate pairs' "$W/det-a.out" || fail "det-a: no 'candidate pairs' in the summary: $(head -c 300 "$W/det-a.out")"
grep -q 'new rules stored' "$W/det-a.out" || fail "det-a: no 'new rules stored' in the summary: $(head -c 300 "$W/det-a.out")"
[[ ! -e $W/a.db.gen-1 ]] || fail "det-a: the work directory a.db.gen-1 is left after a finished run"
no_workdirs "$W/a.db" det-a
integrity "$W/a.db" det-a
n_a=$(sql "$W/a.db" 'select count(*) from rules')
((n_a > 0)) || fail "det-a: gen-rules ${SMALL[*]} stored no rules"
[[ $(stored "$W/det-a.out") == "$n_a" ]] ||
  fail "det-a: the summary says $(stored "$W/det-a.out") new rules stored, the database holds $n_a"
[[ $(sql "$W/a.db" "select status from runs") == "done" ]] || fail "det-a: the run is not marked done"
sql "$W/a.db" "$ROWS" >"$W/a.rows"
sql "$W/b.db" "$ROWS" >"$W/b.rows"
cmp -s "$W/a.rows" "$W/b.rows" ||
  fail "determinism: two runs with seed 1 stored different rules: $(diff "$W/a.rows" "$W/b.rows" | head -n 4 | cut -c1-200)"
ok "determinism: two runs of ${SMALL[*]} with seed 1 store the same $n_a rules"

gen_ok det-t1 "${SMALL[@]}" --threads 1 --quiet --db "$W/t1.db"
sql "$W/t1.db" "$ROWS" >"$W/t1.rows"
cmp -s "$W/a.rows" "$W/t1.rows" ||
  fail "determinism: --threads 1 stored different rules: $(diff "$W/a.rows" "$W/t1.rows" | head -n 4 | cut -c1-200)"
ok "determinism: --threads 1 stores the same rules"

gen_ok det-seed7 "${SMALL[@]}" --seed 7 --quiet --db "$W/s7.db"
sql "$W/a.db" "$KEYS" >"$W/a.keys"
sql "$W/s7.db" "$KEYS" >"$W/s7.keys"
cmp -s "$W/a.keys" "$W/s7.keys" ||
  fail "determinism: --seed 7 found other rules than seed 1: $(diff "$W/a.keys" "$W/s7.keys" | head -n 4 | cut -c1-200)"
ok "determinism: --seed 7 finds the same rule keys"

# ---- 4. a rerun on a finished database adds nothing ----

gen_ok rerun "${SMALL[@]}" --quiet --db "$W/a.db"
[[ $(stored "$W/rerun.out") == 0 ]] ||
  fail "rerun: the summary says $(stored "$W/rerun.out") new rules stored on a finished database, expected 0"
n=$(sql "$W/a.db" 'select count(*) from rules')
((n == n_a)) || fail "rerun: the rule count went from $n_a to $n"
! grep -q '(resumed)' "$W/rerun.out" || fail "rerun: a finished run was 'resumed': $(head -n 1 "$W/rerun.out")"
no_workdirs "$W/a.db" rerun
integrity "$W/a.db" rerun
ok "rerun: exit 0, 0 new rules, still $n rules"

# ---- 5. crash safety: SIGKILL at several points, then the same command completes ----

BIG=(--depth 3 --ops 'ewadd,concat,split')
t0=$SECONDS
gen_ok clean "${BIG[@]}" --db "$W/clean.db"
t_clean=$((SECONDS - t0))
sql "$W/clean.db" "$KEYS" >"$W/clean.keys"
n_clean=$(wc -l <"$W/clean.keys")
((n_clean > 0)) || fail "clean: gen-rules ${BIG[*]} stored no rules"
no_workdirs "$W/clean.db" clean
ok "clean: ${BIG[*]} stores $n_clean rules in ${t_clean}s"

# wait_for SECONDS COMMAND...: polls COMMAND every 0.05 s until it succeeds, the
# background run ends or SECONDS pass; false unless COMMAND succeeded while it ran.
wait_for() {
  local limit=$1 i; shift
  for ((i = 0; i < limit * 20; i++)); do
    kill -0 "$bg_pid" 2>/dev/null || return 1
    "$@" && return 0
    sleep 0.05
  done
  return 1
}

# units_at_least DB N: at least N buckets of the run are stored (WAL: reading does not
# block the writer).
units_at_least() {
  local n
  [[ -s $1 ]] || return 1 # sqlite3 would create the file
  n=$(sql "$1" 'select count(*) from run_units' 2>/dev/null) || return 1
  [[ -n $n ]] && ((n >= $2))
}

# crash LABEL DB WHEN: starts the run on DB in the background, kills it with SIGKILL at
# WHEN (a delay in seconds; 'buckets': once 6 of the 16 buckets are stored; 'prune': once
# all 16 are), checks a copy of the database, then reruns the same command in the
# foreground and compares its rules with the clean run's.
crash() {
  local label=$1 db=$2 when=$3 at
  "$GEN" "${BIG[@]}" --db "$db" >"$W/$label.kill.out" 2>"$W/$label.kill.err" &
  bg_pid=$!
  case $when in
    buckets) wait_for "$TMO" units_at_least "$db" 6 || : ;;
    prune) if wait_for "$TMO" units_at_least "$db" 16; then sleep 0.2; fi ;;
    *) sleep "$when" ;;
  esac
  case $when in
    buckets | prune) at="in the $when phase" ;;
    *) at="after ${when}s" ;;
  esac
  if kill -9 "$bg_pid" 2>/dev/null; then
    at="killed $at"
  else
    at="not killed: it had finished before it was to be killed $at"
  fi
  wait "$bg_pid" 2>/dev/null || true
  bg_pid=
  if grep -Eq "$SANITIZER_RE" "$W/$label.kill.err"; then
    fail "$label: sanitizer report before the kill: $(grep -Em1 "$SANITIZER_RE" "$W/$label.kill.err" | cut -c1-200)"
  fi
  # Inspect a copy, so that the rerun itself must recover the WAL the kill left.
  local recorded=0 units=0 phase='before the database' snap=$W/$label.snap/rules.db
  if [[ -e $db ]]; then
    rm -rf "$W/$label.snap"
    mkdir "$W/$label.snap"
    cp "$db" "$snap"
    if [[ -e $db-wal ]]; then cp "$db-wal" "$snap-wal"; fi
    integrity "$snap" "$label (after the kill)"
  fi
  if [[ -e $db && $(sql "$snap" "select count(*) from sqlite_master where name = 'run_units'") == 0 ]]; then
    phase="database created, schema not yet written ($(stat -c %s "$db") bytes)"
  elif [[ -e $db ]]; then
    recorded=$(sql "$snap" "select count(*) from runs where status = 'running'")
    units=$(sql "$snap" "select count(*) from run_units")
    if ((units == 16 && recorded > 0)); then phase='pruning, all 16 buckets stored'
    elif [[ -e $db.gen-1/enumerated ]]; then phase="in the buckets, $units/16 stored"
    elif [[ -d $db.gen-1 ]]; then phase='enumerating'
    elif ((recorded > 0)); then phase='run recorded'
    elif [[ $(sql "$snap" "select count(*) from runs") != 0 ]]; then phase='finished'
    else phase='database opened, run not recorded'
    fi
  fi
  gen_ok "$label" "${BIG[@]}" --db "$db"
  if ((recorded > 0)); then
    grep -q '(resumed)' "$W/$label.out" ||
      fail "$label: the killed run was recorded but the rerun did not resume it: $(head -n 1 "$W/$label.out")"
    [[ $(stored "$W/$label.out") == "$n_clean" ]] ||
      fail "$label: the resumed run says $(stored "$W/$label.out") new rules stored, expected $n_clean"
  fi
  integrity "$db" "$label"
  [[ $(sql "$db" "select count(*) from runs where status = 'running'") == 0 ]] ||
    fail "$label: a run is still marked running after the rerun"
  sql "$db" "$KEYS" >"$W/$label.keys"
  cmp -s "$W/clean.keys" "$W/$label.keys" ||
    fail "$label: after the kill and rerun the rules differ from an uninterrupted run ($n_clean vs $(wc -l <"$W/$label.keys") keys): $(diff "$W/clean.keys" "$W/$label.keys" | head -n 4 | cut -c1-200)"
  no_workdirs "$db" "$label"
  local how=fresh
  ((recorded > 0)) && how=resumed
  ok "$label: $at ($phase), database intact, rerun ($how) stores the same $n_clean rules"
}

crash kill-0.5s    "$W/k1.db" 0.5
crash kill-2s      "$W/k2.db" 2
crash kill-buckets "$W/k3.db" buckets
crash kill-prune   "$W/k4.db" prune

# Killed twice: in the buckets, then the rerun killed again in the prune phase.
db=$W/k5.db
"$GEN" "${BIG[@]}" --db "$db" >"$W/k5a.out" 2>"$W/k5a.err" &
bg_pid=$!
wait_for "$TMO" units_at_least "$db" 4 || :
kill -9 "$bg_pid" 2>/dev/null || true
wait "$bg_pid" 2>/dev/null || true
bg_pid=
mkdir "$W/k5.snap"
cp "$db" "$W/k5.snap/rules.db"
if [[ -e $db-wal ]]; then cp "$db-wal" "$W/k5.snap/rules.db-wal"; fi
integrity "$W/k5.snap/rules.db" "kill-twice (first kill)"
crash kill-twice "$db" prune

echo "ok: all gen-rules checks passed"
