#!/usr/bin/env bash
# Session 5, call 2 (~9 min): the fused dQ (jfa.hopper.bwd, Config.fuse_dq: dK/dV pass + dQ by float32 atomics,
# the hopper backward's default now) and deterministic=True (the two-pass backward), every step under a limit:
#   1. GPU tests: every hopper backward test (default = fused, through the public API, every mode and dtype),
#      the variants two-pass / fused / m32 against the reference, determinism, test_gpu (graphs, compile);
#   2. the backward A/B: two-pass (= deterministic=True) vs fused, every workload of the suite.
set -uo pipefail
export PYTHONUNBUFFERED=1
source scripts/h200/lib.sh
setup
PY=.venv/bin/python
T="-q -p no:cacheprovider -m gpu -n 4"
step 300 $PY -m pytest $T tests/test_hopper.py tests/test_gpu.py \
  -k "(not forward_variants) and (not backward_variants or fused or two or m32)" > $OUT/tests.txt 2>&1
grep -v "^  \|^$\|Warn" $OUT/tests.txt | tail -25
step 220 $PY benchmarks/ab_backward.py --variants gluon-two-pass,gluon-fused > $OUT/ab_backward.txt 2>&1
tail -25 $OUT/ab_backward.txt
