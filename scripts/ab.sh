#!/usr/bin/env bash
# usage: scripts/ab.sh OTHER[,OTHER...] WORKLOADS [PARTS] [ROUNDS]
# A/B on the GPU machine: benchmarks/passes.py for each OTHER (a copy of jfa at another commit, or with a patch,
# carried with the call) and for this checkout, in turn, ROUNDS times (default 2), on WORKLOADS (comma-separated
# suite names), PARTS (passes.py's part names, comma-separated; default "forward,backward (default)"). Make each
# OTHER here first with scripts/ab_tree.sh NAME [PATCH...] (this commit's jfa/ and benchmarks/ in .ab/NAME, git-ignored,
# with the patches applied) or from another commit (git archive COMMIT jfa benchmarks | tar -x -C .ab/NAME), and carry
# them: run with carry [".ab"]. Each OTHER needs the passes.py --parts option (commits from 2026-12-01 on).
# Every line is tagged with its tree (OTHER's folder name, or "this"); compare within one call only (machines differ
# by up to ~10%). Before the rounds, every tree's kernels for these workloads compile in parallel (AB_JOBS processes
# at once, default 4: each calls the parts once, untimed; a cold Hopper kernel takes one core 5-30 s, and the trees'
# first rounds compiled them one after another); the rounds then load them from Triton's cache. At the end, each
# workload's means over the rounds and each tree's change against this checkout (scripts/ab_summary.py), with each
# tree's SM clock where its passes.py has --clocks.
set -uo pipefail
source scripts/lib.sh
others=${1:?usage: scripts/ab.sh OTHER[,OTHER...] WORKLOADS [PARTS] [ROUNDS]}
only=${2:?usage: scripts/ab.sh OTHER[,OTHER...] WORKLOADS [PARTS] [ROUNDS]}
parts=${3:-forward,backward (default)}
rounds=${4:-2}
[ -d .venv ] || setup
triton_cache
start=$SECONDS
for tree in ${others//,/ } .; do
  for w in ${only//,/ }; do
    while [ "$(jobs -rp | wc -l)" -ge "${AB_JOBS:-4}" ]; do sleep 1; done
    timeout -k 10 280 env PYTHONPATH="$tree" $PY "$tree/benchmarks/passes.py" --only "$w" --parts "$parts" --calls 1 \
      > /dev/null 2>&1 &
  done
done
wait
echo "== compiled in parallel: $((SECONDS - start)) s"
clocks() { grep -q -- --clocks "$1/benchmarks/passes.py" 2> /dev/null && echo --clocks; }  # (trees before it lack it)
for r in $(seq "$rounds"); do
  for other in ${others//,/ }; do
    step 280 env PYTHONPATH="$other" $PY "$other/benchmarks/passes.py" --only "$only" --parts "$parts" \
      $(clocks "$other") | sed "s/^/$(basename "$other") /"
  done
  step 280 $PY benchmarks/passes.py --only "$only" --parts "$parts" $(clocks .) | sed 's/^/this  /'
done | tee "$OUT/ab-rounds.txt"
echo "== means over the rounds (scripts/ab_summary.py)"
$PY scripts/ab_summary.py "$OUT/ab-rounds.txt"
