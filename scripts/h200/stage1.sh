#!/usr/bin/env bash
# H200 session, call 1: set up, GPU tests, jfa check, jfa demo; keeps FA4 half 1 in /tmp for call 2.
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p /tmp/fa4 && cp .fa4/part1/* /tmp/fa4/ 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee $OUT/nvidia-smi.txt
bash scripts/setup_venv.sh > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }
PY=.venv/bin/python
$PY -m jfa info 2>&1 | tee $OUT/info.txt
# 4 workers; the forward variants have their own run (verify_hopper.sh)
timeout 300 $PY -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/ -k "not variants" 2>&1 \
  | tee $OUT/test-gpu.log | grep -v "^  \|^$\|Warn" | tail -25
pkill -9 -f pytest 2>/dev/null
timeout 120 $PY -m jfa check 2>&1 | tee $OUT/check.txt | tail -25
timeout 60 $PY -m jfa demo 2>&1 | tee $OUT/demo.txt
