#!/usr/bin/env bash
# test.sh: sets up (tools/setup.sh --test) and runs every test under
# AddressSanitizer and UBSan, then prints one line: "N passed, N failed,
# N skipped". Exits non-zero if any test failed.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh --test || { echo "0 passed, 1 failed"; exit 1; }

# Leaks are errors; UBSan findings abort so a test cannot pass over them.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
export TEQ_BUILD=build-asan

log=$(mktemp)
meson test -C build-asan --print-errorlogs --num-processes 2 "$@" 2>&1 | tee "$log"
count() { sed -n "s/^$1: *\([0-9][0-9]*\).*/\1/p" "$log" | tail -n 1; }
ok=$(count "Ok"); xfail=$(count "Expected Fail"); fail=$(count "Fail")
xpass=$(count "Unexpected Pass"); skip=$(count "Skipped"); timeout=$(count "Timeout")
rm -f "$log"
passed=$(( ${ok:-0} + ${xfail:-0} ))
failed=$(( ${fail:-0} + ${xpass:-0} + ${timeout:-0} ))
[ -z "$ok" ] && failed=$(( failed + 1 ))   # meson printed no summary: it broke
echo
echo "${passed} passed, ${failed} failed, ${skip:-0} skipped"
[ "$failed" = 0 ]
