#!/usr/bin/env bash
# Session 5, the last ~4 minutes of device time: the dK/dV pass with K/V double-buffered across items
# (variant kv2): its GPU tests (every mode, D 64 and 128), then its A/B against the two-pass default on the
# workloads with short items (pma-*, d64) and one long one.
set -uo pipefail
export PYTHONUNBUFFERED=1
bash scripts/setup_venv.sh > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }
PY=.venv/bin/python
step() { local limit=$1; shift; timeout $limit "$@"; local rc=$?; pkill -9 -f "pytest|benchmarks/ab_" 2>/dev/null;
         sleep 1; echo "== rc $rc (limit ${limit}s): $*" | cut -c1-160; }
step 100 $PY -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/test_hopper.py -k "backward_variants and kv2" \
  > $OUT/tests.txt 2>&1
grep -v "^  \|^$\|Warn" $OUT/tests.txt | tail -8
step 75 $PY benchmarks/ab_backward.py --variants gluon-two-pass,gluon-kv2 \
  --only pma-64,pma-256,d64-uniform-512,self-skewed-8k > $OUT/ab.txt 2>&1
grep -v "Warn\|return Var" $OUT/ab.txt | tail -8
