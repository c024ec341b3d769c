"""The custom op: torch.library.opcheck (schema, fake tensors, autograd registration) and
torch.compile(fullgraph=True) through forward and backward."""
import contextlib

import pytest
import torch

import jfa
from jfa.problem import Problem
from jfa.testing import make_case


def _problem(case, backend, q, k, v):
    row_scale = case.out_scale if isinstance(case.out_scale, torch.Tensor) else None
    out_scale = 1.0 if row_scale is not None else case.out_scale
    return Problem(q, k, v, case.q_offsets, case.kv_offsets, case.scale, case.left, case.right, case.broadcast,
                   activation=case.activation, out_scale=out_scale, row_scale=row_scale, backend=backend)


def op_args(case, backend):
    """The op's arguments: a Problem's fields."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (case.q, case.k, case.v))
    return _problem(case, backend, q, k, v).flat()


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("mode", ["self-causal", "cross-window", "broadcast", "silu-rows", "gelu-broadcast"])
def test_opcheck(backend, mode):
    kwargs = {"self-causal": dict(q_lens=[3, 0, 17], causal=True),
              "cross-window": dict(q_lens=[5, 9], kv_lens=[20, 0], window=(3, 2), hq=4, hkv=2),
              "broadcast": dict(q_lens=None, kv_lens=[7, 0, 18], broadcast_lq=5),
              "silu-rows": dict(q_lens=[3, 0, 17], causal=True, activation="silu", out_scale="rows"),
              "gelu-broadcast": dict(q_lens=None, kv_lens=[7, 0, 18], broadcast_lq=5, activation="gelu",
                                     out_scale=0.5)}[mode]
    case = make_case(**kwargs)
    torch.library.opcheck(torch.ops.jfa.attention.default, op_args(case, backend))
    out, lse = torch.ops.jfa.attention(*op_args(case, backend))
    problem = _problem(case, backend, case.q, case.k, case.v)
    bwd_args = (case.dout, None, out.detach(), lse.detach(), *problem.flat())
    torch.library.opcheck(torch.ops.jfa.attention_backward.default, bwd_args)


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_compile_fullgraph_forward_backward(backend):
    case = make_case([5, 17, 0, 9], causal=True, hq=4, hkv=2)
    qb = torch.randn(6, 4, 32)

    def step(q, k, v, qb, offsets):
        out = jfa.jagged_attention(q, k, v, offsets, causal=True, backend=backend)
        pooled = jfa.broadcast_attention(qb, k, v, offsets, max_kv_len=17, backend=backend)  # the bound traced too
        hstu = jfa.jagged_attention(q, k, v, offsets, causal=True, activation="silu", out_scale=1 / 17,
                                    backend=backend)
        return (out.float().square().sum() + pooled.float().square().sum() + hstu.float().square().sum())

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    grads = {}
    for name, fn in (("eager", step), ("compiled", compiled)):
        inputs = [x.detach().clone().requires_grad_() for x in (case.q, case.k, case.v, qb)]
        loss = fn(*inputs, case.q_offsets)
        grads[name] = (loss.detach(), *torch.autograd.grad(loss, inputs))
    for a, b in zip(grads["eager"], grads["compiled"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


class _Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    """A dispatch mode that records the ops it sees and runs them unchanged."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("broadcast", [False, True])
def test_eager_path_with_and_without_dispatch_mode(broadcast):
    """Eager calls run the op's implementation directly (jfa.op.Attention); with a dispatch mode active they go
    through jfa::attention and jfa::attention_backward, which the mode sees. Same values and gradients both ways."""
    case = (make_case(kv_lens=[7, 0, 18], q_lens=None, broadcast_lq=5) if broadcast
            else make_case([3, 0, 17], causal=True, hq=4, hkv=2))
    fn = jfa.broadcast_attention if broadcast else jfa.jagged_attention
    offsets = (case.kv_offsets, ) if broadcast else (case.q_offsets, )
    results = []
    for mode in (None, _Recorder()):
        q, k, v = (x.detach().clone().requires_grad_() for x in (case.q, case.k, case.v))
        with mode if mode is not None else contextlib.nullcontext():
            out = fn(q, k, v, *offsets, causal=not broadcast, backend="reference")
            grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        if mode is not None:
            assert "jfa.attention.default" in mode.ops and "jfa.attention_backward.default" in mode.ops
        results.append((out.detach(), *grads))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
