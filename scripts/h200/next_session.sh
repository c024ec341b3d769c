#!/usr/bin/env bash
# Next H200 session, one call: the GPU tests (incl. the Hopper draft and the persistent forward), then the
# forward A/B (grid vs persistent vs Hopper draft, FA2/FA4 beside when FA4 is installed under /tmp/fa4site).
set -uo pipefail
export PYTHONUNBUFFERED=1
[ -d .venv ] || bash scripts/setup_venv.sh > $OUT/setup.log 2>&1
PY=.venv/bin/python
timeout 300 $PY -m pytest -q -m gpu -p no:cacheprovider tests/ 2>&1 | tee $OUT/test-gpu.log | tail -15
[ -d /tmp/fa4site ] && export PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
timeout 240 $PY benchmarks/ab_forward.py 2>&1 | tee $OUT/ab_forward.txt | tail -20
