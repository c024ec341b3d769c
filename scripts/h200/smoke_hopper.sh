#!/usr/bin/env bash
# H200 call 1 of a short bench session (carry .fa4/part1): set up, then a quick check of the Hopper backend
# (forward in every GPU mode at D 64/128, each under a time limit so a deadlock shows as a timeout; then the
# graph-capture, int64-offsets and no-sync tests). Keeps FA4 half 1 in /tmp/fa4 for stage2.sh.
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p /tmp/fa4 && cp .fa4/part1/* /tmp/fa4/ 2>/dev/null
bash scripts/setup_venv.sh > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }
PY=.venv/bin/python
timeout 60 $PY - <<'PYEOF' 2>&1 | grep -v Warning | tee $OUT/smoke.txt
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
echo "smoke rc ${PIPESTATUS[0]}"
timeout 90 $PY -m pytest -q -x -p no:cacheprovider tests/test_gpu.py::test_gpu_cuda_graph_replay_with_new_offsets \
  tests/test_hopper.py::test_hopper_int64_offsets tests/test_gpu.py::test_gpu_no_host_sync_with_max_lens \
  tests/test_hopper.py::test_hopper_unaligned_and_strided_inputs 2>&1 | tail -3
