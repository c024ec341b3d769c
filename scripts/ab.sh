#!/usr/bin/env bash
# usage: scripts/ab.sh OTHER WORKLOADS [PARTS] [ROUNDS]
# A/B on the GPU machine: benchmarks/passes.py for OTHER (a copy of jfa at another commit, carried with the call)
# and for this checkout, alternately, ROUNDS times (default 2), on WORKLOADS (comma-separated suite names), PARTS
# (passes.py's part names, comma-separated; default "forward,backward (default)"). Make OTHER here first, e.g.
#   mkdir -p .ab/base && git archive HEAD jfa benchmarks | tar -x -C .ab/base     (.ab/ is git-ignored)
# and carry it: run with carry [".ab"]. OTHER needs the passes.py --parts option (commits from 2026-12-01 on).
# Every line is tagged "other" or "this"; compare within one call only (machines differ by up to ~10%).
set -uo pipefail
source scripts/lib.sh
other=${1:?usage: scripts/ab.sh OTHER WORKLOADS [PARTS] [ROUNDS]}
only=${2:?usage: scripts/ab.sh OTHER WORKLOADS [PARTS] [ROUNDS]}
parts=${3:-forward,backward (default)}
rounds=${4:-2}
[ -d .venv ] || setup
triton_cache
for r in $(seq "$rounds"); do
  step 280 env PYTHONPATH="$other" $PY "$other/benchmarks/passes.py" --only "$only" --parts "$parts" | sed 's/^/other /'
  step 280 $PY benchmarks/passes.py --only "$only" --parts "$parts" | sed 's/^/this  /'
done
