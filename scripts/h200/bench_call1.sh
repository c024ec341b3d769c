#!/usr/bin/env bash
# Bench call 1 of 3 (carry .fa4/part1), session 5: FA4's first half into /tmp/fa4, set-up, device info, then
# the Gluon backward's passes timed apart (benchmarks/ab_backward.py --passes). stage2.sh A and B follow at
# once (the machine stays warm ~30 s).
set -uo pipefail
export PYTHONUNBUFFERED=1
bash scripts/h200/fa4_half1.sh > /dev/null || exit 1
timeout 200 .venv/bin/python benchmarks/ab_backward.py --passes > $OUT/passes.txt 2>&1; echo "== rc $?"
grep -v Warning $OUT/passes.txt | tail -12
