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
    out = {"draft": fwd.forward}
    for name in fwd_ws.VARIANTS:
        out[f"ws-{name}"] = (lambda v: lambda *a: fwd_ws.forward(*a, cfg=fwd_ws.config(a[0].shape[2], v)))(name)
    return out


@pytest.mark.parametrize("kernel", ["draft", "ws-s2", "ws-s3", "ws-pingpong", "ws-m64"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mode", list(MODES))
def test_hopper_forward(mode, d, kernel):
    kw = dict(MODES[mode])
    kw.setdefault("hq", 4)
    kw.setdefault("hkv", 4)
    case = make_case(**kw, d=d, dtype=torch.bfloat16, device="cuda", seed=d)
    out, lse = _kernels()[kernel](case.q, case.k, case.v, case.q_offsets, case.kv_offsets, case.scale, case.left,
                           case.right, case.broadcast)
    failures = compare(case, out, lse)
    assert not failures, "\n".join(failures)
