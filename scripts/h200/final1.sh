#!/usr/bin/env bash
# H200 call 1 of a bench session (carry .fa4/part1): set up, GPU tests, forward A/B of the Hopper variants;
# keeps FA4 half 1 in /tmp/fa4 for stage2.sh, which must follow within the ~30 s the machine stays warm.
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p /tmp/fa4 && cp .fa4/part1/* /tmp/fa4/ 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee $OUT/nvidia-smi.txt
bash scripts/setup_venv.sh > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }
PY=.venv/bin/python
$PY -m jfa info 2>&1 | tee $OUT/info.txt
timeout 280 $PY -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/ 2>&1 | tee $OUT/test-gpu.log | grep -v "^  \|^$" | tail -25
timeout 200 $PY benchmarks/ab_forward.py 2>&1 | grep -v "fa4: RuntimeError: skipped" | tee $OUT/ab_forward.txt | tail -12
