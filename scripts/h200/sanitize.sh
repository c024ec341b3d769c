#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck on a small case of every Hopper kernel (forward, and the DRAFT
# backward passes through JFA_HOPPER_BWD=gluon), each under a time limit.
set -uo pipefail
export PYTHONUNBUFFERED=1
[ -d .venv ] || bash scripts/setup_venv.sh > $OUT/setup.log 2>&1
PY=.venv/bin/python
cat > /tmp/small.py <<'PYEOF'
import torch
from jfa.testing import compare, make_case, run_backend
for d in (64, 128):
    c = make_case([1, 65, 129, 300], hq=4, hkv=2, d=d, dtype=torch.bfloat16, device="cuda", causal=True)
    out, lse, grads = run_backend(c, "hopper"); torch.cuda.synchronize()
    print(d, compare(c, out, lse, grads) or "ok")
PYEOF
for tool in memcheck racecheck; do
  JFA_HOPPER_BWD=gluon timeout 150 compute-sanitizer --tool $tool --print-limit 20 $PY /tmp/small.py 2>&1 \
    | tee $OUT/sanitizer-$tool.txt | tail -8
  echo "== $tool rc ${PIPESTATUS[0]}"
done
