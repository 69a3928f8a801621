#!/usr/bin/env bash
# verify-rules from the outside: malformed axiom files give file:line:col and exit 2,
# databases gen-rules did not make are refused with exit 2, a depth-2 database is
# proved whole and a rerun skips it, and a wrong axiom added to a copy of
# specs/ops.axioms is reported FALSE by --check-axioms (exit 1).
#
#   tests/scripts/test_verify_rules.sh
#
# Queries the databases with the sqlite3 command-line tool; exit 77 (skip) without it.
# Environment: TEQ_BUILD (build dir, default build).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/scripts/oracles.sh
. "$ROOT/tests/scripts/oracles.sh"
BUILD=$(abspath "${TEQ_BUILD:-build}")
GEN=$BUILD/gen/gen-rules
VERIFY=$BUILD/verify/verify-rules
AXIOMS=$ROOT/specs/ops.axioms

if ! command -v sqlite3 >/dev/null 2>&1; then
  echo "SKIP: the sqlite3 command-line tool is not installed (Debian: apt-get install sqlite3)"
  exit 77
fi
for exe in "$GEN" "$VERIFY"; do
  if [[ ! -x $exe ]]; then
    echo "FAIL: $exe not built (set TEQ_BUILD to the build directory)"
    exit 1
  fi
done

W=$(mktemp -d "${TMPDIR:-/tmp}/teq-verify.XXXXXX")
trap 'rm -rf "$W"' EXIT
cd "$W"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
SANITIZER_RE='AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:|Segmentation fault|core dumped'

# run NAME EXPECTED_STATUS CMD...: runs CMD, checks its exit status, keeps its output in NAME.out
run() {
  local name=$1 want=$2
  shift 2
  local got=0
  "$@" >"$name.out" 2>&1 || got=$?
  if [[ $got != "$want" ]]; then fail "$name: exit status $got, expected $want"; sed 's/^/    /' "$name.out"; fi
  if grep -Eq "$SANITIZER_RE" "$name.out"; then fail "$name: sanitizer report"; sed 's/^/    /' "$name.out"; fi
}
expect_text() { grep -q -- "$2" "$1.out" || { fail "$1: output lacks '$2'"; sed 's/^/    /' "$1.out"; }; }

# ---- malformed axiom files ----
cat >head.axioms <<'AX'
op ewadd = ewadd(x, y)
op relu = relu(x)
AX
bad() { # name line:col expected-text axiom-text
  { cat head.axioms; printf '# why\n%s\n' "$4"; } >"$1.axioms"
  run "$1" 2 "$VERIFY" --check-axioms "$1.axioms"
  expect_text "$1" "$1.axioms:$2:"
  expect_text "$1" "$3"
}
bad unknown_op 4:20 "unknown operator" "axiom a: forall x. sigmoidal(x) = x"
bad wrong_arity 4:22 "wrong arity" "axiom a: forall x y. relu(x, y) = x"
bad unbalanced 4 "unbalanced parentheses" "axiom a: forall x y. ewadd(x, relu(y) = x"
bad unbound 4:29 "unbound" "axiom a: forall x. ewadd(x, y) = x"
run missing 2 "$VERIFY" --check-axioms no-such.axioms
expect_text missing "no-such.axioms"

# ---- databases gen-rules did not make ----
sqlite3 foreign.sqlite "CREATE TABLE t (x); INSERT INTO t VALUES (1);"
run foreign 2 "$VERIFY" --db foreign.sqlite "$AXIOMS"
expect_text foreign "not a Teq rule database"
printf 'not a database at all\n' >text.sqlite
run text 2 "$VERIFY" --db text.sqlite "$AXIOMS"
run nofile 2 "$VERIFY" --db nofile.sqlite "$AXIOMS"
[[ -e nofile.sqlite ]] && fail "nofile: verify-rules created the database"
: >empty.sqlite
run empty 2 "$VERIFY" --db empty.sqlite "$AXIOMS"
expect_text empty "not a rule database made by gen-rules"
run badarg 2 "$VERIFY" --jobs 0 "$AXIOMS"

# ---- a depth-2 database: all proved, stored, skipped on a rerun ----
"$GEN" --depth 2 --db d2.sqlite --quiet >/dev/null
n=$(sqlite3 d2.sqlite "SELECT count(*) FROM rules")
run prove 0 "$VERIFY" --db d2.sqlite --jobs 2 "$AXIOMS"
proved=$(sqlite3 d2.sqlite "SELECT count(*) FROM rules WHERE status = 'proved'")
[[ $proved == "$n" ]] || fail "prove: $proved of $n rules proved"
v=$(sqlite3 d2.sqlite "SELECT count(*) FROM verifications WHERE result = 'proved' AND axioms_hash != ''")
[[ $v == "$n" ]] || fail "prove: $v verifications stored for $n rules"
runs=$(sqlite3 d2.sqlite "SELECT count(*) FROM runs WHERE command = 'verify-rules' AND status = 'done'")
[[ $runs == 1 ]] || fail "prove: $runs finished verify-rules runs"
run rerun 0 "$VERIFY" --db d2.sqlite --jobs 2 "$AXIOMS"
grep -Eq "decided earlier \(skipped\) +$n\$" rerun.out || { fail "rerun: not all skipped"; cat rerun.out; }
v2=$(sqlite3 d2.sqlite "SELECT count(*) FROM verifications")
[[ $v2 == "$v" ]] || fail "rerun: $v2 verifications after the rerun, $v before"

# ---- gen-rules and verify-rules agree: relu with scalars at depth 4 ----
# Z_p's polynomial stand-in for relu lets false candidates through unless
# gen-rules' float32 check meets both signs of every scalar (for instance
# (relu s1)^2 (s1 + relu s1) = (s1 relu s1 + relu s1)^2 holds for s1 <= 0
# only): none of what gen-rules stores may be refuted.
"$GEN" --depth 4 --ops ewadd,ewmul,relu,smul --db relu4.sqlite --quiet >/dev/null
run relu4 0 "$VERIFY" --db relu4.sqlite --jobs 2 --quiet "$AXIOMS"
refuted=$(sqlite3 relu4.sqlite "SELECT count(*) FROM rules WHERE status = 'refuted'")
[[ $refuted == 0 ]] || fail "relu4: verify-rules refuted $refuted rules gen-rules stored: $(sqlite3 relu4.sqlite "SELECT text FROM rules WHERE status = 'refuted' LIMIT 1")"

# ---- a deliberately wrong axiom is caught ----
cp "$AXIOMS" wrong.axioms
printf '# wrong on purpose: relu is not additive\naxiom relu_additive: forall x y. relu(ewadd(x, y)) = ewadd(relu(x), relu(y))\n' >>wrong.axioms
run wrong 1 "$VERIFY" --check-axioms --no-redundancy --no-consistency --axiom-budget-ms 150 --jobs 2 --quiet wrong.axioms
expect_text wrong "FALSE *relu_additive"
expect_text wrong "smallest counterexample"

if [[ $fails -gt 0 ]]; then
  echo "$fails failure(s)"
  exit 1
fi
echo "ok: verify-rules command line"
