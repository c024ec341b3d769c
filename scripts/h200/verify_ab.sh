#!/usr/bin/env bash
# H200 call (carry .fa4/part1; it doubles as the bench's first call, fa4_half1.sh): set up, keep FA4's first
# half in /tmp/fa4, then the GPU tests of the hopper backend (Gluon backward by default; the forward variants
# have their own run) and of the public API, and the forward A/B of every variant, each under a time limit.
# stage2.sh A and B follow at once (the machine stays warm ~30 s).
set -uo pipefail
export PYTHONUNBUFFERED=1
source scripts/h200/lib.sh
bash scripts/h200/fa4_half1.sh > /dev/null || exit 1  # FA4's first half into /tmp/fa4, set-up, device info
PY=.venv/bin/python
T="-q -p no:cacheprovider -m gpu -n 4"
step 200 $PY -m pytest $T tests/test_hopper.py tests/test_gpu.py tests/test_integrations.py -k "not variants" 2>&1 \
  | grep -v "^  \|^$\|Warn" | tail -12
step 200 $PY benchmarks/ab_forward.py > $OUT/ab_forward.txt 2>&1; grep -v "fa4: RuntimeError" $OUT/ab_forward.txt | tail -40
