#!/usr/bin/env bash
# One H200 call for the Hopper forward work: its GPU tests (correctness of every kernel variant in every mode),
# then the forward A/B of the variants beside FA2 (and FA4 when installed under /tmp/fa4site).
#   run: bash scripts/h200/hopper_ab.sh [pytest -k expr] [ab_forward --only list]
set -uo pipefail
export PYTHONUNBUFFERED=1
[ -d .venv ] || bash scripts/setup_venv.sh > $OUT/setup.log 2>&1
PY=.venv/bin/python
K=${1:-}
# smoke first: a deadlocked pipeline shows as a timeout here, not as a stuck test run
timeout 60 $PY -c "
import torch; from jfa.hopper import fwd; from jfa.testing import make_case, compare
c = make_case(q_lens=[1, 63, 65, 129, 300], d=128, dtype=torch.bfloat16, device='cuda', hq=2, hkv=2)
o, l = fwd.forward(c.q, c.k, c.v, c.q_offsets, c.kv_offsets, c.scale, c.left, c.right, c.broadcast)
torch.cuda.synchronize(); print('smoke', compare(c, o, l) or 'ok')" 2>&1 | tail -5
[ ${PIPESTATUS[0]} = 124 ] && { echo "smoke timed out (deadlock?)"; exit 1; }
timeout 240 $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_hopper.py ${K:+-k "$K"} 2>&1 \
  | tee $OUT/test-hopper.log | grep -v "^  \|^$" | tail -25
[ -d /tmp/fa4site ] && export PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
timeout 300 $PY benchmarks/ab_forward.py ${2:+--only $2} 2>&1 | tee $OUT/ab_forward.txt | tail -30
