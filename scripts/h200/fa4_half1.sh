#!/usr/bin/env bash
# Bench call 1 of 3 (carry .fa4/part1): set up and keep FA4's first half in /tmp/fa4; stage2.sh follows at
# once (the machine stays warm ~30 s) with the second half and the first part of the bench.
set -uo pipefail
mkdir -p /tmp/fa4 && cp .fa4/part1/* /tmp/fa4/
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee $OUT/nvidia-smi.txt
source scripts/h200/lib.sh
setup
.venv/bin/python -m jfa info 2>&1 | tee $OUT/info.txt
