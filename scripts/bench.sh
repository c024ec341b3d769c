#!/usr/bin/env bash
# usage: scripts/bench.sh NAME WORKLOADS [PROVIDERS] [OTHER_CHECKOUT]
# `jfa bench --only WORKLOADS --providers PROVIDERS` (default jfa,fa2,fa4,flex,sdpa-padded) into $OUT/NAME.
# FA4 is installed first when both its halves have come (see fa4 in scripts/lib.sh). With OTHER_CHECKOUT (a
# copy of jfa at another commit, carried with the call), the same command runs there first, into
# $OUT/NAME-other: the two runs back to back, for a before/after comparison.
set -uo pipefail
source scripts/lib.sh
name=${1:?usage: scripts/bench.sh NAME WORKLOADS [PROVIDERS] [OTHER_CHECKOUT]}
only=${2:?usage: scripts/bench.sh NAME WORKLOADS [PROVIDERS] [OTHER_CHECKOUT]}
providers=${3:-jfa,fa2,fa4,flex,sdpa-padded}
other=${4:-}
[ -d .venv ] || setup
triton_cache
fa4
args=(-m jfa bench --only "$only" --providers "$providers" --no-plots)
if [ -n "$other" ]; then  # python -m runs jfa from the current directory: the other checkout's
  (cd "$other" && step 540 "../$PY" "${args[@]}" --out "$OUT/$name-other" > "$OUT/$name-other.log" 2>&1)
  grep -A3 "^workload\|TF/s" "$OUT/$name-other.log" | tail -40
fi
step 540 $PY "${args[@]}" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
tail -60 "$OUT/$name.log"
