"""The DRAFT Gluon Hopper forward (jfa.hopper.fwd) against the reference on the GPU. Not yet run: the
hopper kernels become a backend only once these pass on the H200."""
import pytest
import torch

from jfa.testing import GPU_MODES, compare, make_case

pytestmark = pytest.mark.gpu

MODES = GPU_MODES


@pytest.fixture(autouse=True)
def _needs_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")


def _kernels():
    from jfa.hopper import fwd, fwd_ws
    return {"draft": fwd.forward, "ws": fwd_ws.forward,
            "ws-3stages": lambda *a: fwd_ws.forward(*a, stages=3)}


@pytest.mark.parametrize("kernel", ["draft", "ws", "ws-3stages"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mode", list(MODES))
def test_hopper_forward(mode, d, kernel):
    if kernel == "ws-3stages" and d != 128:
        pytest.skip("3 stages is the D=128 variant (D=64 has 3 by default)")
    kw = dict(MODES[mode])
    kw.setdefault("hq", 4)
    kw.setdefault("hkv", 4)
    case = make_case(**kw, d=d, dtype=torch.bfloat16, device="cuda", seed=d)
    out, lse = _kernels()[kernel](case.q, case.k, case.v, case.q_offsets, case.kv_offsets, case.scale, case.left,
                           case.right, case.broadcast)
    failures = compare(case, out, lse)
    assert not failures, "\n".join(failures)
