"""jfa.nn's layers against the same layers written by hand with the reference attention (jfa.reference, float64):
outputs and every parameter's gradient, packed and NJT inputs; and torch.nn's conventions (factory kwargs,
reset_parameters, extra_repr). The layers run jfa's Triton kernels (the interpreter here)."""
import math

import pytest
import torch
import torch.nn.functional as F

import jfa
from jfa import nested, reference
from jfa.jagged import resolve_window
from jfa.testing import offsets_of

pytestmark = pytest.mark.interpreter
LENS, OTHER = [5, 0, 17, 1, 33], [9, 4, 0, 20, 2]


def _heads(x, h):
    return x.unflatten(-1, (h, -1))


def _ref_attention(q, k, v, q_off, kv_off, causal=False, window=(-1, -1), broadcast=False):
    left, right = resolve_window(causal, window)
    out, _ = reference.attention(q, k, v, q_off, kv_off, scale=1 / math.sqrt(q.shape[-1]), left=left, right=right,
                                 broadcast=broadcast, compute_dtype=torch.float64)
    return out


def _check(layer, by_hand, *inputs):
    """Outputs and parameter gradients of the layer (float32, jfa's kernels) and of by_hand (float64 copies of
    the same parameters, the reference attention); layer may be (a call, the module that holds the parameters)."""
    call, module = layer if isinstance(layer, tuple) else (layer, layer)
    params = dict(module.named_parameters())
    ref = {name: p.detach().double().requires_grad_() for name, p in params.items()}
    out = call(*inputs)
    out_ref = by_hand(ref, *[x.double() if x.is_floating_point() else x for x in inputs])
    torch.testing.assert_close(out.double(), out_ref, atol=2e-5, rtol=1e-4)
    g = torch.randn_like(out)
    out.backward(g)
    out_ref.backward(g.double())
    for name, p in params.items():
        torch.testing.assert_close(p.grad.double(), ref[name].grad, atol=5e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("fused,kv_heads,causal,window", [(True, None, False, (-1, -1)), (False, 2, True, (-1, -1)),
                                                          (True, 1, False, (3, 2))],
                         ids=["fused", "separate-gqa-causal", "mqa-window"])
def test_self_attention_matches_by_hand(fused, kv_heads, causal, window):
    torch.manual_seed(0)
    layer = jfa.nn.JaggedSelfAttention(64, 4, kv_heads, causal=causal, window=window, fused_qkv=fused,
                                       backend="triton")  # head_dim 16: the smallest the Triton kernels take
    off = offsets_of(LENS)
    x = torch.randn(int(off[-1]), 64)
    hkv = kv_heads or 4

    def by_hand(p, x, off):
        if fused:
            q, k, v = F.linear(x, p["qkv_proj.weight"], p["qkv_proj.bias"]).split((64, 16 * hkv, 16 * hkv), -1)
        else:
            q, k, v = (F.linear(x, p[f"{n}_proj.weight"], p[f"{n}_proj.bias"]) for n in "qkv")
        out = _ref_attention(_heads(q, 4), _heads(k, hkv), _heads(v, hkv), off, off, causal, window)
        return F.linear(out.flatten(-2), p["out_proj.weight"], p["out_proj.bias"])
    _check(layer, by_hand, x, off)


def test_self_attention_takes_njt_and_gives_njt():
    torch.manual_seed(0)
    layer = jfa.nn.JaggedSelfAttention(32, 2, causal=True, backend="triton")
    off = offsets_of(LENS, dtype=torch.int64)
    x = torch.randn(int(off[-1]), 32)
    out = layer(nested.to_njt(x, off))
    assert nested.is_njt(out) and out.offsets() is off
    torch.testing.assert_close(out.values(), layer(x, off))


def test_cross_attention_matches_by_hand():
    """Target items (their own offsets) against a history, causal bottom-right, kdim != embed_dim, GQA."""
    torch.manual_seed(0)
    layer = jfa.nn.JaggedCrossAttention(32, 2, 1, kdim=24, causal=True, backend="triton")
    q_off, kv_off = offsets_of([min(3, n) for n in OTHER]), offsets_of(OTHER)
    x, mem = torch.randn(int(q_off[-1]), 32), torch.randn(int(kv_off[-1]), 24)

    def by_hand(p, x, mem, q_off, kv_off):
        q = _heads(F.linear(x, p["q_proj.weight"], p["q_proj.bias"]), 2)
        k, v = _heads(F.linear(mem, p["kv_proj.weight"], p["kv_proj.bias"]), 2).chunk(2, dim=-2)
        out = _ref_attention(q, k, v, q_off, kv_off, causal=True)
        return F.linear(out.flatten(-2), p["out_proj.weight"], p["out_proj.bias"])
    _check(layer, by_hand, x, mem, q_off, kv_off)


def test_pma_pooling_matches_by_hand():
    torch.manual_seed(0)
    layer = jfa.nn.PMAPooling(32, 2, num_seeds=3, backend="triton")
    off = offsets_of([4, 1, 9])
    x = torch.randn(int(off[-1]), 32)

    def by_hand(p, x, off):
        k, v = _heads(F.linear(x, p["kv_proj.weight"], p["kv_proj.bias"]), 4).chunk(2, dim=-2)
        out = _ref_attention(p["seeds"], k, v, None, off, broadcast=True).view(3, 3, 2, 16)
        return F.linear(out.flatten(-2), p["out_proj.weight"], p["out_proj.bias"])
    _check(layer, by_hand, x, off)


def test_torch_nn_conventions():
    layer = jfa.nn.JaggedSelfAttention(16, 4, 2, causal=True, dtype=torch.float64, device="cpu")
    assert all(p.dtype == torch.float64 for p in layer.parameters())
    assert "num_heads=4, num_kv_heads=2, head_dim=4" in repr(layer) and "causal=True" in repr(layer)
    pool = jfa.nn.PMAPooling(16, 4, num_seeds=2)
    torch.manual_seed(1)
    pool.reset_parameters()
    first = [p.clone() for p in pool.parameters()]
    torch.manual_seed(1)
    pool.reset_parameters()
    assert all(torch.equal(a, b) for a, b in zip(first, pool.parameters()))
    assert pool.seeds.std().item() == pytest.approx(1 / 2, rel=0.6)  # seeds ~ N(0, 1/head_dim)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        jfa.nn.JaggedSelfAttention(16, 4, 3)
    with pytest.raises(ValueError, match="needs its offsets"):
        layer(torch.randn(3, 16, dtype=torch.float64))


@pytest.mark.parametrize("causal,window,softmax_heads", [(True, (-1, -1), 0), (True, (6, -1), 0),
                                                        (False, (-1, -1), 0), (True, (-1, -1), 1)],
                         ids=["causal", "causal-window", "full", "causal-1-softmax-head"])
def test_hstu_layer_matches_by_hand(causal, window, softmax_heads):
    """jfa.nn.HSTULayer against the HSTU block written out with the reference's SiLU attention: U, V, Q, K =
    split(silu(uvqk(norm(x)))), A = silu(scale q . k) v / N over the visible keys (softmax on the first
    num_softmax_heads), x + out_proj(norm(A) * U)."""
    torch.manual_seed(0)
    layer = jfa.nn.HSTULayer(64, 4, attn_dim=16, causal=causal, window=window, max_seq_len=40, backend="triton",
                             num_softmax_heads=softmax_heads)
    off = offsets_of(LENS)
    x = torch.randn(int(off[-1]), 64)
    left, right = resolve_window(causal, window)

    def by_hand(p, x, off):
        h = F.layer_norm(x, (64, ), p["norm.weight"], p["norm.bias"])
        u, v, q, k = F.silu(F.linear(h, p["uvqk.weight"], p["uvqk.bias"])).split((64, 64, 64, 64), -1)
        a, _ = reference.attention(_heads(q, 4), _heads(k, 4), _heads(v, 4), off, off, scale=1 / math.sqrt(16),
                                   left=left, right=right, compute_dtype=torch.float64, activation="silu",
                                   out_scale=1 / 40, num_softmax_heads=softmax_heads)
        a = F.layer_norm(a.flatten(-2), (64, ), p["attn_norm.weight"], p["attn_norm.bias"])
        return x + F.linear(a * u, p["out_proj.weight"], p["out_proj.bias"])
    _check(layer, by_hand, x, off)


def test_layers_take_target_masks():
    """HSTU's mask through the layers (candidates scored in one pass): HSTULayer and JaggedSelfAttention with
    num_targets and a contextual prefix, as by hand with the reference's mask (jfa.jagged.target_mask)."""
    torch.manual_seed(2)
    off = offsets_of([5, 0, 17, 2, 33])  # (every non-empty sequence holds the 2-row prefix)
    targets, context = torch.tensor([2, 0, 5, 1, 33]), 2  # 0 targets, and an all-target sequence
    x = torch.randn(int(off[-1]), 32)
    hstu = jfa.nn.HSTULayer(32, 2, max_seq_len=40, backend="triton")

    def hstu_by_hand(p, x, off):
        h = F.layer_norm(x, (32, ), p["norm.weight"], p["norm.bias"])
        u, v, q, k = F.silu(F.linear(h, p["uvqk.weight"], p["uvqk.bias"])).split((32, 32, 32, 32), -1)
        a, _ = reference.attention(_heads(q, 2), _heads(k, 2), _heads(v, 2), off, off, scale=1 / 4, left=-1,
                                   right=0, compute_dtype=torch.float64, activation="silu", out_scale=1 / 40,
                                   num_targets=targets, contextual_len=context)
        a = F.layer_norm(a.flatten(-2), (32, ), p["attn_norm.weight"], p["attn_norm.bias"])
        return x + F.linear(a * u, p["out_proj.weight"], p["out_proj.bias"])
    _check((lambda x, off: hstu(x, off, num_targets=targets, contextual_len=context), hstu), hstu_by_hand, x, off)
    attn = jfa.nn.JaggedSelfAttention(32, 2, causal=True, backend="triton")

    def attn_by_hand(p, x, off):
        q, k, v = F.linear(x, p["qkv_proj.weight"], p["qkv_proj.bias"]).split((32, 32, 32), -1)
        out, _ = reference.attention(_heads(q, 2), _heads(k, 2), _heads(v, 2), off, off, scale=1 / 4, left=-1,
                                     right=0, compute_dtype=torch.float64, num_targets=targets, contextual_len=context)
        return F.linear(out.flatten(-2), p["out_proj.weight"], p["out_proj.bias"])
    _check((lambda x, off: attn(x, off, num_targets=targets, contextual_len=context), attn), attn_by_hand, x,
           off)
    plain = attn(x, off)  # the mask matters: without it, targets see one another
    assert not torch.allclose(plain, attn(x, off, num_targets=targets, contextual_len=context))


def test_layers_take_an_activation():
    """GDPA in the attention layers: the self-attention layer with gelu_tanh and an out scale, as by hand."""
    torch.manual_seed(1)
    layer = jfa.nn.JaggedSelfAttention(32, 2, causal=True, activation="gelu_tanh", out_scale=0.25, backend="triton")
    off = offsets_of(LENS)
    x = torch.randn(int(off[-1]), 32)

    def by_hand(p, x, off):
        q, k, v = F.linear(x, p["qkv_proj.weight"], p["qkv_proj.bias"]).split((32, 32, 32), -1)
        left, right = resolve_window(True, (-1, -1))
        out, _ = reference.attention(_heads(q, 2), _heads(k, 2), _heads(v, 2), off, off, scale=1 / 4, left=left,
                                     right=right, compute_dtype=torch.float64, activation="gelu_tanh",
                                     out_scale=0.25)
        return F.linear(out.flatten(-2), p["out_proj.weight"], p["out_proj.bias"])
    _check(layer, by_hand, x, off)
    assert "activation='gelu_tanh'" in repr(layer)
