"""The public contract: defaults, shapes, and a clear error for every bad input (never a wrong answer, a crash
in a kernel, or an input modified in place)."""
import math

import pytest
import torch

import jfa
from jfa.testing import make_case, offsets_of


def qkv(tq=10, tk=10, hq=2, hkv=1, d=32, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tq, hq, d, generator=g, dtype=dtype), torch.randn(tk, hkv, d, generator=g, dtype=dtype),
            torch.randn(tk, hkv, d, generator=g, dtype=dtype))


OFF = offsets_of([4, 6])


def test_defaults_self_attention_scale_and_shapes():
    q, k, v = qkv()
    out, lse = jfa.jagged_attention(q, k, v, OFF, return_lse=True, backend="reference")
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (2, 10) and lse.dtype == torch.float32
    same = jfa.jagged_attention(q, k, v, OFF, OFF, scale=1 / math.sqrt(32), backend="reference")
    torch.testing.assert_close(out, same, rtol=0, atol=0)


def test_broadcast_shapes_and_lse_row_order():
    q, k, v = qkv(tq=3)
    out, lse = jfa.broadcast_attention(q, k, v, OFF, return_lse=True, backend="reference")
    assert out.shape == (2, 3, 2, 32) and lse.shape == (2, 6)
    # rows of lse follow out.reshape(B*Lq, H, D): row b*Lq + i is query i of sequence b
    one, lse1 = jfa.jagged_attention(q, k[4:], v[4:], offsets_of([3]), offsets_of([6]), return_lse=True,
                                     backend="reference")
    torch.testing.assert_close(out[1], one)
    torch.testing.assert_close(lse[:, 3:], lse1)


def test_broadcast_row_offsets_are_one_tensor_per_shape(monkeypatch):
    """The schedule cache matches offsets by identity: broadcast q must hand the kernels the same row-offsets
    tensor call after call (a fresh one cost a 1.5-2 ms schedule build per call on the H200)."""
    import jfa.api
    seen = []
    real = jfa.api.attend
    monkeypatch.setattr(jfa.api, "attend", lambda p: seen.append(p.q_offsets) or real(p))
    q, k, v = qkv(tq=3)
    jfa.broadcast_attention(q, k, v, OFF, backend="reference")
    jfa.broadcast_attention(q * 2, k, v, OFF.clone(), backend="reference")
    jfa.broadcast_attention(q[:2], k, v, OFF, backend="reference")
    assert seen[0] is seen[1] and seen[2] is not seen[0]
    assert seen[0].tolist() == [0, 3, 6] and seen[2].tolist() == [0, 2, 4]


def test_causal_combines_with_window():
    case = make_case([9], causal=True, window=(3, 4))
    assert (case.left, case.right) == (3, 0)
    q, k, v = qkv(tq=9, tk=9)
    a = jfa.jagged_attention(q, k, v, offsets_of([9]), causal=True, window=(3, 4), backend="reference")
    b = jfa.jagged_attention(q, k, v, offsets_of([9]), window=(3, 0), backend="reference")
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.interpreter
def test_inputs_not_modified_and_noncontiguous_inputs_copied():
    q, k, v = qkv()
    wide = torch.randn(10, 2, 64)
    q_nc = wide[:, :, ::2]  # head dim not contiguous: copied, documented
    before = [t.clone() for t in (q_nc, k, v, OFF)]
    out = jfa.jagged_attention(q_nc, k, v, OFF, backend="triton")
    ref = jfa.jagged_attention(q_nc.contiguous(), k, v, OFF, backend="reference")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for t, b in zip((q_nc, k, v, OFF), before):
        assert torch.equal(t, b)


@pytest.mark.interpreter
def test_row_strided_inputs_are_taken_as_they_are():
    qkv_packed = torch.randn(10, 3, 2, 32)  # a fused projection: q, k, v are strided views
    q, k, v = qkv_packed.unbind(1)
    out = jfa.jagged_attention(q, k, v, OFF, backend="triton")
    ref = jfa.jagged_attention(q.contiguous(), k.contiguous(), v.contiguous(), OFF, backend="reference")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_max_len_hints():
    q, k, v = qkv()
    ok = jfa.jagged_attention(q, k, v, OFF, max_q_len=6, max_kv_len=6, backend="reference")
    bigger = jfa.jagged_attention(q, k, v, OFF, max_q_len=100, max_kv_len=100, backend="reference")
    torch.testing.assert_close(ok, bigger, rtol=0, atol=0)
    with pytest.raises(ValueError, match="max_q_len=5 is smaller than the longest"):
        jfa.jagged_attention(q, k, v, OFF, max_q_len=5, backend="reference")
    with pytest.raises(ValueError, match="max_kv_len=2"):
        jfa.broadcast_attention(q[:3], k, v, OFF, max_kv_len=2, backend="reference")


BAD = {
    "offsets-float": (lambda q, k, v: (q, k, v, OFF.float()), TypeError, "q_offsets must be int32 or int64"),
    "offsets-2d": (lambda q, k, v: (q, k, v, OFF.view(1, 3)), ValueError, "q_offsets must be 1-D"),
    "offsets-not-tensor": (lambda q, k, v: (q, k, v, [0, 4, 10]), TypeError, "q_offsets must be a torch.Tensor"),
    "offsets-start": (lambda q, k, v: (q, k, v, torch.tensor([1, 4, 10])), ValueError, "must start at 0"),
    "offsets-decreasing": (lambda q, k, v: (q, k, v, torch.tensor([0, 6, 4, 10])), ValueError, "non-decreasing"),
    "offsets-end": (lambda q, k, v: (q, k, v, torch.tensor([0, 4, 9])), ValueError, "must end at the number of rows"),
    "kv-offsets-end": (lambda q, k, v: (q, k, v, OFF, torch.tensor([0, 4, 11])), ValueError,
                       "kv_offsets must end at the number of rows of k"),
    "batch-mismatch": (lambda q, k, v: (q, k, v, OFF, torch.tensor([0, 10])), ValueError, "same batch"),
    "q-2d": (lambda q, k, v: (q[:, 0], k, v, OFF), ValueError, "q must be 3-D"),
    "k-4d": (lambda q, k, v: (q, k[None], v, OFF), ValueError, "k must be 3-D"),
    "heads": (lambda q, k, v: (q[:, :1].expand(10, 3, 32), torch.randn(10, 2, 32), torch.randn(10, 2, 32), OFF),
              ValueError, "multiple of the kv heads"),
    "head-dim": (lambda q, k, v: (q, k, v[..., :16], OFF), ValueError, "head dims differ"),
    "kv-rows": (lambda q, k, v: (q, k, v[:9], OFF), ValueError, "k and v must have the same rows"),
    "dtype-mismatch": (lambda q, k, v: (q, k.double().float().half(), v, OFF), TypeError, "share a dtype"),
    "dtype-int": (lambda q, k, v: (q.long(), k, v, OFF), TypeError, "q has dtype"),
    "device-mismatch": (lambda q, k, v: (q, k.to("meta"), v, OFF), ValueError, "one device"),
    "offsets-device": (lambda q, k, v: (q, k, v, OFF.to("meta")), ValueError, "q_offsets is on meta"),
    "self-rows": (lambda q, k, v: (q, torch.randn(12, 1, 32), torch.randn(12, 1, 32), OFF), ValueError,
                  "needs as many k rows"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_raises_clear_error(name):
    make, exc, msg = BAD[name]
    with pytest.raises(exc, match=msg):
        jfa.jagged_attention(*make(*qkv()), backend="reference")


@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(window=(-2, 0)), ValueError, "window left must be >= -1"),
    (dict(window=(0, -5)), ValueError, "window right must be >= -1"),
    (dict(window=(1,)), ValueError, "window must be a pair"),
    (dict(window=(1.5, 0)), TypeError, "window left must be an int"),
    (dict(causal=1), TypeError, "causal must be a bool"),
    (dict(scale="x"), TypeError, "scale must be a finite float"),
    (dict(max_q_len=-1), TypeError, "max_q_len must be a non-negative"),
    (dict(max_q_len=4.0), TypeError, "max_q_len must be a non-negative"),
    (dict(backend="cuda"), ValueError, "unknown backend 'cuda'"),
    (dict(deterministic=None), TypeError, "deterministic must be a bool"),
    (dict(activation="tanh"), ValueError, "unknown activation 'tanh'"),
    (dict(activation=None), ValueError, "unknown activation None"),
    (dict(activation="silu", return_lse=True), ValueError, "return_lse=True: an lse is softmax's"),
    (dict(out_scale=0.5), ValueError, "out_scale scales an activation's output"),
    (dict(activation="silu", out_scale="x"), TypeError, "out_scale must be a finite float or a float32 tensor"),
    (dict(activation="silu", out_scale=float("nan")), TypeError, "out_scale must be a finite float"),
    (dict(activation="silu", out_scale=torch.ones(3)), ValueError, r"one value per output row: shape \(10,\)"),
    (dict(activation="silu", out_scale=torch.ones(10, dtype=torch.float64)), TypeError, "must be float32"),
    (dict(activation="silu", out_scale=torch.ones(10, device="meta")), ValueError, "out_scale is on meta"),
    (dict(out_scale=torch.ones(10)), ValueError, "out_scale scales an activation's output"),
])
def test_bad_options(kwargs, exc, msg):
    q, k, v = qkv()
    with pytest.raises(exc, match=msg):
        jfa.jagged_attention(q, k, v, OFF, **kwargs)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("broadcast", [False, True])
@pytest.mark.parametrize("max_kv_len", [None, 6, 100])
def test_deterministic_and_max_kv_len_reach_the_backward(monkeypatch, deterministic, broadcast, max_kv_len):
    """The flag and the bound go through the op and its autograd to the backend's backward (where the hopper
    backend chooses its dQ pass by them), once per backward. (That the hopper backend keeps its promises is checked
    on the GPU: tests/test_hopper.py, same bits twice, the dQ pass skipped by the bound.)"""
    from jfa.backends import BACKENDS
    seen = []
    ref = BACKENDS["reference"]
    def spy(p, *args):
        seen.append((p.deterministic, p.max_kv_len))
        return ref.backward(p, *args)
    monkeypatch.setitem(BACKENDS, "reference", ref.__class__(ref.name, ref.forward, spy, ref.supports))
    q, k, v = (x.requires_grad_() for x in qkv())
    if broadcast:
        out = jfa.broadcast_attention(q[:3], k, v, OFF, max_kv_len=max_kv_len, backend="reference",
                                      deterministic=deterministic)
    else:
        out = jfa.jagged_attention(q, k, v, OFF, max_kv_len=max_kv_len, backend="reference",
                                   deterministic=deterministic)
    out.sum().backward()
    assert seen == [(deterministic, max_kv_len)]
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.interpreter
def test_unsupported_head_dim_names_the_backends_that_take_it():
    q, k, v = qkv(d=8)
    with pytest.raises(ValueError, match=r"backend 'triton' does not take head dim 8.*\['reference'\]"):
        jfa.jagged_attention(q, k, v, OFF, backend="triton")
    out = jfa.jagged_attention(q, k, v, OFF)  # auto falls back to one that takes it
    assert out.shape == q.shape


def test_broadcast_bad_inputs():
    q, k, v = qkv(tq=3)
    with pytest.raises(ValueError, match=r"shape \(6,\)"):  # B * Lq rows
        jfa.broadcast_attention(q, k, v, OFF, activation="gelu", out_scale=torch.ones(3))
    with pytest.raises(ValueError, match="return_lse"):
        jfa.broadcast_attention(q, k, v, OFF, activation="gelu", return_lse=True)
    with pytest.raises(ValueError, match="q must be 3-D"):
        jfa.broadcast_attention(q[None], k, v, OFF)
    with pytest.raises(ValueError, match="kv_offsets must end"):
        jfa.broadcast_attention(q, k, v, torch.tensor([0, 4, 8]))


@pytest.mark.interpreter
def test_available_backends():
    assert "reference" in jfa.available_backends("cpu", 64, torch.float32)
    assert "triton" in jfa.available_backends("cpu", 64, torch.float32)
    assert "triton" not in jfa.available_backends("cpu", 512, torch.float32)


def test_jfa_check_covers_every_score_function_and_hstus_mask(capsys):
    """`jfa check` runs the variants beside the modes (here through the reference, so it is fast: the kernels' own
    runs of the same cases are tests/test_triton.py's and `jfa check` itself)."""
    from jfa.cli import main
    from jfa.testing import CPU_MODES, CPU_VARIANTS
    from jfa.variants import ACTIVATIONS
    assert set(ACTIVATIONS) <= {k.split("-")[0] for k in CPU_VARIANTS} and any("targets" in k for k in CPU_VARIANTS)
    assert main(["check", "--backend", "reference", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert f"{len(CPU_MODES) + len(CPU_VARIANTS)} modes and variants fwd+bwd: ok" in out, out


@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(causal=True, num_targets=torch.tensor([1, 2]), contextual_len=5), ValueError,
     r"contextual_len=5 is longer than sequence 0 \(4 rows\)"),
    (dict(causal=True, contextual_len=-1), ValueError, "contextual_len must be >= 0"),
    (dict(causal=True, contextual_len=2.0), TypeError, "contextual_len must be a Python int"),
    (dict(causal=True, window=(5, 3), num_targets=torch.tensor([1, 2])), ValueError,
     r"take window=\(W, 0\).*got window=\(5, 3\)"),
    (dict(window=(5, 0), num_targets=torch.tensor([1, 2])), ValueError, "need causal=True"),
    (dict(causal=True, num_targets=torch.tensor([1, 2], device="meta")), ValueError,
     "num_targets is on meta but the offsets are on cpu"),
    (dict(activation="silu", out_scale=torch.tensor([1.0] * 9 + [float("nan")])), ValueError,
     r"out_scale\[9\] = nan is not finite"),
    (dict(causal=True, min_full_attn_len=3), ValueError, r"min_full_attn_len takes HSTU's window=\(W, 0\)"),
    (dict(causal=True, window=(4, 0), min_full_attn_len=-1), ValueError, "min_full_attn_len must be a Python int"),
    (dict(num_softmax_heads=1), ValueError, "with activation='softmax' every head does"),
    (dict(activation="silu", num_softmax_heads=5), ValueError, r"num_softmax_heads must be in \[0, 2\]"),
    (dict(activation="silu", num_softmax_heads=1.0), TypeError, "num_softmax_heads must be a Python int"),
    (dict(activation="silu", num_softmax_heads=1, return_lse=True), ValueError, "an lse is softmax's"),
])
def test_bad_recommendation_inputs(kwargs, exc, msg):
    """HSTU's mask's and the per-row out scale's bad values: one clear error naming the argument (and the sequence or
    row), never a quiet result."""
    q, k, v = qkv()
    with pytest.raises(exc, match=msg):
        jfa.jagged_attention(q, k, v, OFF, **kwargs)


def test_trusted_offsets_skip_the_value_checks_but_not_the_rule():
    """With both max lengths for CPU offsets the values are still checked (only GPU offsets are trusted): the context
    error stands; a sequence as long as the prefix is fine."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match="longer than sequence 0"):
        jfa.jagged_attention(q, k, v, OFF, causal=True, contextual_len=5, max_q_len=6, max_kv_len=6)
    out = jfa.jagged_attention(q, k, v, OFF, causal=True, contextual_len=4, activation="silu")
    assert torch.isfinite(out).all()


def test_njt_targets_on_separate_offsets_attend_as_on_one():
    """NJTs built each with their own offsets take HSTU's mask as cross-attention whose queries are each sequence's
    last rows: with equal lengths, all of them, the same result as on one offsets tensor."""
    q, k, v = qkv()
    nq = torch.nested.nested_tensor_from_jagged(q, OFF.long())
    nk, nv = (torch.nested.nested_tensor_from_jagged(x, OFF.long().clone()) for x in (k, v))
    apart = jfa.jagged_attention(nq, nk, nv, causal=True, num_targets=torch.tensor([1, 2]))
    nk, nv = (torch.nested.nested_tensor_from_jagged(x, nq.offsets()) for x in (k, v))
    together = jfa.jagged_attention(nq, nk, nv, causal=True, num_targets=torch.tensor([1, 2]))
    torch.testing.assert_close(apart.values(), together.values(), atol=1e-6, rtol=1e-5)


def test_min_full_attn_len_alone_is_hstus_mask_without_targets():
    """min_full_attn_len with a window and neither targets nor a context: HSTU's mask with zero targets (the last rows
    see the whole history), as the reference computes it by hand."""
    from jfa import reference
    from jfa.jagged import resolve_window
    q, k, v = qkv()
    got = jfa.jagged_attention(q, k, v, OFF, causal=True, window=(2, 0), min_full_attn_len=3, backend="reference")
    left, right = resolve_window(True, (2, 0))
    want = reference.attention(q, k, v, OFF, OFF, left=left, right=right, num_targets=torch.zeros(2, dtype=OFF.dtype),
                               min_full_attn_len=3)[0]
    plain = jfa.jagged_attention(q, k, v, OFF, causal=True, window=(2, 0), backend="reference")
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, plain)  # (its last rows see past the window)
