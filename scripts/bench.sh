#!/usr/bin/env bash
# usage: scripts/bench.sh NAME WORKLOADS [PROVIDERS] [OTHER_CHECKOUT]
# `jfa bench --only WORKLOADS --providers PROVIDERS` (default jfa,fa2,fa4,flex,sdpa-padded) into $OUT/NAME.
# FA4 is installed first when its two halves are here (.fa4/part1 and .fa4/part2, see scripts/fetch_fa4.sh;
# a half already copied to /tmp/fa4 by an earlier call on the same machine counts). With OTHER_CHECKOUT (a
# copy of jfa at another commit, carried with the call), the same command runs there first, into
# $OUT/NAME-other: the two runs back to back, for a before/after comparison.
set -uo pipefail
source scripts/lib.sh
name=${1:?usage: scripts/bench.sh NAME WORKLOADS [PROVIDERS] [OTHER_CHECKOUT]}
only=${2:?usage: scripts/bench.sh NAME WORKLOADS [PROVIDERS] [OTHER_CHECKOUT]}
providers=${3:-jfa,fa2,fa4,flex,sdpa-padded}
other=${4:-}
[ -d .venv ] || setup
mkdir -p /tmp/fa4
cp .fa4/part1/* .fa4/part2/* /tmp/fa4/ 2>/dev/null
if [ ! -d /tmp/fa4site ] && ls /tmp/fa4/*.part-01 > /dev/null 2>&1; then
  bash scripts/install_fa4.sh /tmp/fa4 /tmp/fa4site > "$OUT/fa4-install.log" 2>&1 || tail -5 "$OUT/fa4-install.log"
fi
[ -d /tmp/fa4site ] && export PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
args=(-m jfa bench --only "$only" --providers "$providers" --no-plots)
if [ -n "$other" ]; then  # python -m runs jfa from the current directory: the other checkout's
  (cd "$other" && step 540 "../$PY" "${args[@]}" --out "$OUT/$name-other" > "$OUT/$name-other.log" 2>&1)
  grep -A3 "^workload\|TF/s" "$OUT/$name-other.log" | tail -40
fi
step 540 $PY "${args[@]}" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
tail -60 "$OUT/$name.log"
