#!/usr/bin/env bash
# The backward A/B through `jfa bench` (provider jfa-hopper: JFA_HOPPER_BWD=triton, the portable backward, vs
# the Gluon passes), then compute-sanitizer memcheck and racecheck on a small case of every Hopper kernel,
# each step under a time limit.
set -uo pipefail
export PYTHONUNBUFFERED=1
[ -d .venv ] || bash scripts/setup_venv.sh > $OUT/setup.log 2>&1
PY=.venv/bin/python
W=self-skewed-8k,causal-skewed-4k,gqa-uniform-2k,pma-64
JFA_HOPPER_BWD=triton timeout 90 $PY -m jfa bench --only $W --providers jfa-hopper --out $OUT/bwd-triton 2>&1 | tail -7
timeout 90 $PY -m jfa bench --only $W --providers jfa-hopper --out $OUT/bwd-gluon 2>&1 | tail -7
cat > /tmp/small.py <<'PYEOF'
import torch
from jfa.testing import compare, make_case, run_backend
for d in (64, 128):
    c = make_case([1, 65, 129, 300], hq=4, hkv=2, d=d, dtype=torch.bfloat16, device="cuda", causal=True)
    out, lse, grads = run_backend(c, "hopper"); torch.cuda.synchronize()
    print(d, compare(c, out, lse, grads) or "ok")
PYEOF
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --print-limit 20 $PY /tmp/small.py 2>&1 \
    | tee $OUT/sanitizer-$tool.txt | tail -8
  echo "== $tool rc ${PIPESTATUS[0]}"
done
