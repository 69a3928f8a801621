#!/usr/bin/env bash
# test_includes.sh: each directory's public headers are its only door. Code
# outside runtime/ may include only the public runtime headers; internal
# headers (runtime/ops/family.h, runtime/onnx/*.h) stay inside runtime/, and
# gen/gen_int.h inside gen/ (and its tests).
# And the registry is the only place that knows what an operator is: no
# `case OP_...:` switch over operator kinds outside runtime/ops/.
set -euo pipefail
cd "$(dirname "$0")/../.."
public="err.h tensor.h modp.h ops.h ops.def graph.h exec.h onnx.h cuda.h cost.h plan.h"
bad=0
while IFS= read -r line; do
  file=${line%%:*}
  header=$(sed -n 's/.*#include "runtime\/\([^"]*\)".*/\1/p' <<<"$line")
  case " $public " in *" $header "*) continue ;; esac
  echo "FAIL: $file includes internal header runtime/$header"
  bad=1
done < <(grep -rn --include='*.c' --include='*.h' '#include "runtime/' . \
           | grep -v '^\./runtime/' | grep -v '^\./build' || true)
# gen/gen_int.h is gen's own: only gen/ and its tests use it.
for f in $(grep -rl --include='*.c' --include='*.h' '#include "gen/gen_int.h"' . \
             | grep -v '^\./gen/' | grep -v '^\./tests/gen/' | grep -v '^\./build' || true); do
  echo "FAIL: $f includes gen/gen_int.h; use gen/gen.h"
  bad=1
done
switches=$(grep -rln --include='*.c' --include='*.h' 'case OP_[A-Z0-9_]*:' . \
             | grep -v '^\./runtime/ops/' | grep -v '^\./build' || true)
for f in $switches; do
  echo "FAIL: $f switches over operator kinds; ask the registry row instead"
  bad=1
done
[ $bad = 0 ] && echo "ok: only public runtime headers are included outside runtime/"
exit $bad
