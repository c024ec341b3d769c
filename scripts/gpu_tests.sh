#!/usr/bin/env bash
# usage: scripts/gpu_tests.sh [LIMIT_SECONDS] [PYTEST_ARGS...]
# The GPU tests (pytest -m gpu, 4 workers) under a time limit (default 300 s); the log in $OUT/gpu-tests.log.
set -uo pipefail
source scripts/lib.sh
limit=${1:-300}; shift || true
setup
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
step "$limit" $PY -m pytest -q -p no:cacheprovider -m gpu -n 4 "$@" > "$OUT/gpu-tests.log" 2>&1
grep -v "^  \|^$\|Warn" "$OUT/gpu-tests.log" | tail -20
