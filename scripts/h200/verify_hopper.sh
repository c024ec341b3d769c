#!/usr/bin/env bash
# H200: check the Hopper backend, every step under its own time limit (a deadlocked kernel shows as a timeout
# and its leftover processes are killed before the next step): forward smoke in every GPU mode, then the
# backend tests (fwd+bwd through the public API), the kernel variants, and the rest of the GPU tests.
set -uo pipefail
export PYTHONUNBUFFERED=1
source scripts/h200/lib.sh
[ -d .venv ] || bash scripts/setup_venv.sh > $OUT/setup.log 2>&1
PY=.venv/bin/python
cat > /tmp/smoke.py <<'PYEOF'
import torch
from jfa.hopper import fwd
from jfa.testing import GPU_MODES, compare, make_case
for d in (64, 128):
    for mode, kw in GPU_MODES.items():
        kw = dict(kw); kw.setdefault("hq", 4); kw.setdefault("hkv", 4)
        c = make_case(**kw, d=d, dtype=torch.bfloat16, device="cuda", seed=d)
        o, l = fwd.forward(c.q, c.k, c.v, c.q_offsets, c.kv_offsets, c.scale, c.left, c.right, c.broadcast)
        torch.cuda.synchronize()
        print(d, mode, compare(c, o, l) or "ok", flush=True)
PYEOF
step 60 $PY /tmp/smoke.py 2>&1 | grep -v Warn | tail -20
T="-q -p no:cacheprovider -m gpu -n 4"
step 170 $PY -m pytest $T tests/test_hopper.py -k "backend or auto or int64 or unaligned" 2>&1 | grep -v "^  \|^$\|Warn" | tail -8
step 100 $PY -m pytest $T tests/test_hopper.py -k variants 2>&1 | grep -v "^  \|^$\|Warn" | tail -8
step 100 $PY -m pytest $T tests/test_gpu.py tests/test_integrations.py 2>&1 | grep -v "^  \|^$\|Warn" | tail -8
