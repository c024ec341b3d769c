#!/usr/bin/env bash
# Next H200 session, call 1 (~8 min): every step under its own time limit (a deadlock shows as a timeout).
#   1. the Hopper backend tests (fwd through Gluon, bwd portable) and the forward variants, prefetch included;
#   2. the first run of the DRAFT Gluon backward (dK/dV + dQ passes): its GPU tests;
#   3. the forward A/B of every variant (benchmarks/ab_forward.py).
# Then: sanitize.sh (backward A/B, compute-sanitizer), and the bench: fa4_half1.sh, stage2.sh A, stage2.sh B
# back to back.
# If the draft backward passes and wins, make it the default (jfa/hopper/__init__.py BWD) before the bench.
set -uo pipefail
export PYTHONUNBUFFERED=1
bash scripts/setup_venv.sh > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }
PY=.venv/bin/python
step() { local limit=$1; shift; timeout $limit "$@"; local rc=$?; pkill -9 -f "pytest|jfa bench|ab_forward" 2>/dev/null;
         sleep 1; echo "== rc $rc (limit ${limit}s): $*" | cut -c1-160; }
T="-q -p no:cacheprovider -m gpu -n 4"
step 150 $PY -m pytest $T tests/test_hopper.py -k "not draft" 2>&1 | grep -v "^  \|^$\|Warn" | tail -6
step 120 $PY -m pytest $T tests/test_hopper.py -k backward_draft 2>&1 | grep -v "^  \|^$\|Warn" | tail -12
step 240 $PY benchmarks/ab_forward.py 2>&1 | grep -v "fa4: RuntimeError" | tee $OUT/ab_forward.txt | tail -12
