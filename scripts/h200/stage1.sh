#!/usr/bin/env bash
# H200 session, call 1: set up, GPU tests, jfa check, jfa demo; keeps FA4 half 1 in /tmp for call 2.
set -uo pipefail
export PYTHONUNBUFFERED=1
bash scripts/h200/fa4_half1.sh || exit 1  # FA4's first half into /tmp/fa4, set-up, device info
PY=.venv/bin/python
# 4 workers; the forward variants have their own run (verify_hopper.sh)
timeout 300 $PY -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/ -k "not variants" 2>&1 \
  | tee $OUT/test-gpu.log | grep -v "^  \|^$\|Warn" | tail -25
pkill -9 -f pytest 2>/dev/null
timeout 120 $PY -m jfa check 2>&1 | tee $OUT/check.txt | tail -25
timeout 60 $PY -m jfa demo 2>&1 | tee $OUT/demo.txt
