#!/usr/bin/env bash
# Next H200 session, call 1 (carry .fa4/part1; then stage2.sh twice, back to back, for the full bench):
#   1. the Hopper forward smoke and backend tests (time-limited: a deadlock shows as a timeout);
#   2. the first run of the DRAFT Gluon backward (dK/dV + dQ passes): its GPU tests, then a backward A/B
#      through `jfa bench` (provider jfa-hopper with JFA_HOPPER_BWD=gluon vs the portable backward);
#   3. compute-sanitizer memcheck and racecheck on a small case of the hopper kernels.
# If the draft passes and wins, make it the default (jfa/hopper/__init__.py BWD) before the bench calls.
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p /tmp/fa4 && cp .fa4/part1/* /tmp/fa4/ 2>/dev/null
bash scripts/setup_venv.sh > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }
PY=.venv/bin/python
step() { local limit=$1; shift; timeout $limit "$@"; local rc=$?; pkill -9 -f "pytest|jfa bench" 2>/dev/null; sleep 1;
         echo "== rc $rc (limit ${limit}s): $*" | cut -c1-160; }
T="-q -p no:cacheprovider -m gpu -n 4"
step 120 $PY -m pytest $T tests/test_hopper.py -k "backend or auto or int64 or unaligned" 2>&1 | grep -v "^  \|^$\|Warn" | tail -6
step 150 $PY -m pytest $T tests/test_hopper.py -k backward_draft 2>&1 | grep -v "^  \|^$\|Warn" | tail -12
W=self-skewed-8k,causal-skewed-4k,gqa-uniform-2k,pma-64
step 120 $PY -m jfa bench --only $W --providers jfa-hopper --out $OUT/bwd-triton 2>&1 | tail -8
JFA_HOPPER_BWD=gluon step 120 $PY -m jfa bench --only $W --providers jfa-hopper --out $OUT/bwd-gluon 2>&1 | tail -8
cat > /tmp/small.py <<'PYEOF'
import os, torch
from jfa.testing import make_case, run_backend
c = make_case([1, 65, 129, 300], hq=4, hkv=2, d=128, dtype=torch.bfloat16, device="cuda", causal=True)
run_backend(c, "hopper"); torch.cuda.synchronize(); print("ok", os.environ.get("JFA_HOPPER_BWD"))
PYEOF
for tool in memcheck racecheck; do
  JFA_HOPPER_BWD=gluon step 90 compute-sanitizer --tool $tool --print-limit 20 $PY /tmp/small.py 2>&1 | tail -6
done
