#!/usr/bin/env bash
# Next H200 session, call 1 (~8 min), every step under its own time limit (a deadlock shows as a timeout):
#   1. GPU tests of what changed after session 4's runs: the schedule's one-kernel bookkeeping
#      (JFA_FUSED_SCHEDULE=1; every hopper test and the CUDA-graph tests go through it; if green, make it the
#      default in jfa/schedule.py, and bring back the closed-form deal of docs/perf-notes.md), the dQ pass on
#      the forward's schedule, the dK/dV pass's refactor and variants (peel, serial, serial-peel), every mode;
#   2. the backward A/B of the dK/dV variants and the portable backward (benchmarks/ab_backward.py).
# Call 2: benchmarks/ab_forward.py (now timed with cached schedules) and, if a variant wins, the bench (its
# "new offsets" note, with and without JFA_FUSED_SCHEDULE=1, measures the schedule build).
set -uo pipefail
export PYTHONUNBUFFERED=1
source scripts/h200/lib.sh
setup
PY=.venv/bin/python
T="-q -p no:cacheprovider -m gpu -n 4"
step 240 env JFA_FUSED_SCHEDULE=1 $PY -m pytest $T tests/test_hopper.py tests/test_gpu.py -k "not forward_variants" \
  > $OUT/tests.txt 2>&1
grep -v "^  \|^$\|Warn" $OUT/tests.txt | tail -15
step 240 $PY benchmarks/ab_backward.py > $OUT/ab_backward.txt 2>&1; tail -20 $OUT/ab_backward.txt
