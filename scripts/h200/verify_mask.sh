#!/usr/bin/env bash
# Session 5, last call (~6 min): the dK/dV pass with the kv_len mask only in the fused variant (the two-pass
# default is then opcode-identical to the peel / serial-peel kernels measured in call 1): GPU tests of the
# hopper backend (default backward through the API, every mode and dtype), the two-pass and fused variants,
# determinism; then the backward A/B two-pass vs fused vs m32.
set -uo pipefail
export PYTHONUNBUFFERED=1
source scripts/h200/lib.sh
setup
PY=.venv/bin/python
step 170 $PY -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/test_hopper.py \
  -k "backend or deterministic or reuses or (backward_variants and (fused or two))" > $OUT/tests.txt 2>&1
grep -v "^  \|^$\|Warn" $OUT/tests.txt | tail -12
step 150 $PY benchmarks/ab_backward.py --variants gluon-two-pass,gluon-fused,gluon-m32 > $OUT/ab.txt 2>&1
grep -v "Warn\|return Var" $OUT/ab.txt | tail -12
