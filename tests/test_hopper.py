"""The DRAFT Gluon Hopper forward (jfa.hopper.fwd) against the reference on the GPU. Not yet run: the
hopper kernels become a backend only once these pass on the H200."""
import pytest
import torch

from jfa.testing import compare, make_case

pytestmark = pytest.mark.gpu

LENS = [0, 1, 63, 64, 65, 127, 129, 511, 1000, 2047]
MODES = {
    "self": dict(q_lens=LENS),
    "causal": dict(q_lens=LENS, causal=True),
    "window": dict(q_lens=LENS, window=(256, 256)),
    "cross-causal": dict(q_lens=LENS, kv_lens=LENS[::-1], causal=True),
    "gqa": dict(q_lens=LENS, hq=8, hkv=2),
    "broadcast": dict(q_lens=None, kv_lens=LENS, broadcast_lq=256),
    "empty-kv": dict(q_lens=[5, 7], kv_lens=[0, 0]),
}


@pytest.fixture(autouse=True)
def _needs_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mode", list(MODES))
def test_hopper_forward_draft(mode, d):
    from jfa.hopper import fwd
    kw = dict(MODES[mode])
    kw.setdefault("hq", 4)
    kw.setdefault("hkv", 4)
    case = make_case(**kw, d=d, dtype=torch.bfloat16, device="cuda", seed=d)
    out, lse = fwd.forward(case.q, case.k, case.v, case.q_offsets, case.kv_offsets, case.scale, case.left,
                           case.right, case.broadcast)
    failures = compare(case, out, lse)
    assert not failures, "\n".join(failures)
