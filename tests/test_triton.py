"""The portable Triton kernels (here in Triton's interpreter) against the float64 reference, forward and
backward, every mode, on awkward lengths. Tolerance: jfa.testing (2x PyTorch's own error at the dtype + one
rounding step)."""
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jfa
import jfa.reference
import jfa.variants
from jfa.testing import CPU_MODES, compare, each_once, make_case, run_backend, serving_lens

pytestmark = pytest.mark.interpreter

CASES = {  # every mode, then the corners of the mask and the batch
    **CPU_MODES,
    "self-window-left16": dict(q_lens=[1, 65, 129], window=(16, -1)),
    "self-window-right5": dict(q_lens=[63, 129], window=(-1, 5)),
    "self-window-7-7": dict(q_lens=[1, 64, 129], window=(7, 7)),
    "self-causal-window-20": dict(q_lens=[65, 129], causal=True, window=(20, -1)),
    "cross-lq>lk": dict(q_lens=[129, 65], kv_lens=[63, 1]),
    "cross-lq>lk-causal": dict(q_lens=[129, 65], kv_lens=[63, 1], causal=True),
    "cross-lq<lk-causal": dict(q_lens=[1, 63], kv_lens=[129, 65], causal=True),
    "cross-lq<lk-window": dict(q_lens=[17, 33], kv_lens=[129, 65], window=(9, 2)),
    "empty-kv-nonempty-q": dict(q_lens=[5, 63, 3], kv_lens=[0, 65, 0]),
    "empty-q-nonempty-kv": dict(q_lens=[0, 65], kv_lens=[33, 0]),
    "all-empty": dict(q_lens=[0, 0]),
    "no-sequences": dict(q_lens=[]),
    "gqa-4-2": dict(q_lens=[63, 129], hq=4, hkv=2),
    "mqa-4-1-causal": dict(q_lens=[65, 1], hq=4, hkv=1, causal=True),
    "broadcast": dict(q_lens=None, kv_lens=[0, 1, 63, 65, 129], broadcast_lq=40),
    "broadcast-causal": dict(q_lens=None, kv_lens=[1, 63, 129], broadcast_lq=64, causal=True),
    "broadcast-window-gqa": dict(q_lens=None, kv_lens=[65, 17], broadcast_lq=33, window=(10, 10), hq=4, hkv=2),
    "int64-offsets": dict(q_lens=[63, 65], offsets_dtype=torch.int64),
}


def run_triton(case):
    return run_backend(case, "triton")


@pytest.mark.parametrize("name", list(CASES))
def test_triton_matches_reference(name):
    case = make_case(**CASES[name])
    out, lse, grads = run_triton(case)
    if grads is None:
        assert out.numel() == 0
        return
    assert not compare(case, out, lse, grads), "\n".join(compare(case, out, lse, grads))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mode", ["causal", "broadcast"])
def test_triton_half_precision(dtype, mode):
    kwargs = dict(q_lens=[1, 63, 129], causal=True) if mode == "causal" else \
        dict(q_lens=None, kv_lens=[0, 65, 129], broadcast_lq=33)
    case = make_case(**kwargs, dtype=dtype, seed=3)
    out, lse, grads = run_triton(case)
    assert out.dtype == dtype and lse.dtype == torch.float32
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("d", [32, 64, 96, 128, 256])
def test_triton_head_dims(d):
    case = make_case([1, 33, 65], d=d, causal=d in (96, 256), hq=2, hkv=2, seed=d)
    out, lse, grads = run_triton(case)
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


def test_lse_gradient():
    """Gradients flow through the returned lse too (dLSE enters the Delta preprocess)."""
    case = make_case([5, 0, 65], kv_lens=[9, 4, 0], causal=True)
    results = {}
    for backend in ("reference", "triton"):
        q, k, v = (x.detach().clone().requires_grad_() for x in (case.q, case.k, case.v))
        out, lse = jfa.jagged_attention(q, k, v, case.q_offsets, case.kv_offsets, causal=True, return_lse=True,
                                        backend=backend)
        loss = (out * case.dout).sum() + torch.where(torch.isinf(lse), 0.0, lse * 0.7).sum()
        results[backend] = torch.autograd.grad(loss, (q, k, v))
    for got, want in zip(results["triton"], results["reference"]):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    q_lens=st.lists(st.integers(0, 70), min_size=0, max_size=4),
    cross=st.booleans(),
    kv_extra=st.lists(st.integers(0, 70), min_size=4, max_size=4),
    left=st.sampled_from([-1, 0, 3, 17]),
    right=st.sampled_from([-1, 0, 5]),
    heads=st.sampled_from([(2, 2), (2, 1), (3, 1)]),
    seed=st.integers(0, 1000),
)
def test_triton_random_offsets(q_lens, cross, kv_extra, left, right, heads, seed):
    kv_lens = kv_extra[:len(q_lens)] if cross else None
    case = make_case(q_lens, kv_lens, hq=heads[0], hkv=heads[1], window=(left, right), seed=seed)
    out, lse, grads = run_triton(case)
    if grads is None:
        return
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


ACTIVATIONS = list(jfa.variants.ACTIVATIONS)


@triton.jit
def _score_elements(x_ptr, f_ptr, g_ptr, w_ptr, h_ptr, k, N: tl.constexpr, SCORE: tl.constexpr):
    offs = tl.arange(0, N)
    s = tl.load(x_ptr + offs)
    f, g = SCORE(s * k, False)
    tl.store(f_ptr + offs, f)
    tl.store(g_ptr + offs, g)
    if jfa.variants.weight_coeff(SCORE) != 0.0:
        w, h = jfa.variants.folded(SCORE)(s, k, False)
        tl.store(w_ptr + offs, w * (jfa.variants.weight_coeff(SCORE) * k))
        tl.store(h_ptr + offs, h)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("sign", [1, -1])
def test_score_functions_elementwise(activation, sign):
    """Each activation's (f, f') and its folded form's (weights times C k, f'; jfa.variants.folded) on scores x =
    s k from -11.6 to 11.6 (k = 128^-0.5, and -k: jfa takes any scale, and a folded form must hold for both signs),
    against the reference's float64 (f, f'): float32's error (the interpreter's tanh is exact; measured <= 1.5e-6 and
    4.4e-6 of 1 + |x|, the fitted gelu the largest)."""
    n, k = 4096, sign * 128 ** -0.5
    s = torch.linspace(-131.0, 131.0, n + 1, dtype=torch.float32)[1:]  # (no score at exactly 0: relu's kink)
    f, g, w, h = (torch.full_like(s, float("nan")) for _ in range(4))
    _score_elements[(1, )](s, f, g, w, h, k, N=n, SCORE=jfa.variants.ACTIVATIONS[activation])
    ref_f, ref_g = jfa.reference.ACTIVATIONS[activation]
    x = s.double() * k
    scale = 1.0 + x.abs()
    assert ((f.double() - ref_f(x)).abs() / scale).max() < 5e-6, activation
    assert ((g.double() - ref_g(x)).abs() / scale).max() < 1e-5, activation
    if activation in ("gelu", "gelu_tanh", "identity"):  # (the folded form's weights and f')
        assert ((w.double() - ref_f(x)).abs() / scale).max() < 5e-6, activation
        assert ((h.double() - ref_g(x)).abs() / scale).max() < 1e-5, activation
    else:
        assert w.isnan().all() and h.isnan().all()


@pytest.mark.parametrize("activation,mode", each_once(ACTIVATIONS, CPU_MODES, "silu", "causal"))
def test_triton_activations(activation, mode):
    """Every activation in softmax's place (on the causal batch), and every mode (with silu), on the awkward lengths
    mixed in one batch, forward and backward against the float64 formula (jfa.reference): a constant out scale, and
    a per-row one in GQA and broadcast modes. (The score policy and the mask are independent seams; the GPU tests run
    every pair.)"""
    out_scale = "rows" if mode in ("gqa", "broadcast") else 0.3
    case = make_case(**CPU_MODES[mode], activation=activation, out_scale=out_scale, seed=7)
    out, lse, grads = run_triton(case)
    if grads is None:
        assert out.numel() == 0
        return
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_triton_activations_half_precision(activation, dtype):
    case = make_case(q_lens=[1, 63, 129], causal=True, activation=activation, out_scale=0.5, dtype=dtype, seed=4)
    out, lse, grads = run_triton(case)
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


def test_triton_activation_deterministic():
    """deterministic=True: the same bits twice (the portable backward has no atomics at all)."""
    case = make_case(**CPU_MODES["broadcast-causal-gqa"], activation="silu", seed=2)
    first, again = (run_backend(case, "triton", deterministic=True) for _ in range(2))
    for a, b in zip((first[0], *first[2]), (again[0], *again[2])):
        assert torch.equal(a, b)


TARGETS = {  # HSTU's mask: lengths, contextual_len, window (HSTU's max_attn_len; -1: none)[, min_full_attn_len]
    "targets": (CPU_MODES["causal"]["q_lens"], 0, -1),
    "targets-window": (CPU_MODES["causal"]["q_lens"], 0, 20),
    "targets-context-1": (CPU_MODES["causal"]["q_lens"], 1, -1),
    "targets-context-5-window": (CPU_MODES["causal"]["q_lens"], 5, 33),
    "serving-context-5-window": (CPU_MODES["causal"]["q_lens"], 5, 33),  # each sequence's last rows as queries
    "targets-window-full-40": (CPU_MODES["causal"]["q_lens"], 0, 20, 40),  # the last 40 rows see past the window
    "serving-context-5-window-full-9": (CPU_MODES["causal"]["q_lens"], 5, 33, 9),
}


@pytest.mark.parametrize("name,activation", each_once(TARGETS, ["softmax", "silu", "gelu_tanh"],
                                                       "targets-context-5-window", "softmax"))
def test_triton_target_masks(name, activation):
    """HSTU's mask (targets that see the history and themselves, a contextual prefix, a window over positions)
    against the float64 rule (jfa.jagged.target_mask), forward and backward, GQA, random target counts with 0 and
    all-target sequences: every case with softmax, and the hardest with the activations HSTU and GDPA use."""
    lens, context, window, *full = TARGETS[name]
    q_lens, kv_lens = (serving_lens(lens), lens) if name.startswith("serving") else (lens, None)
    case = make_case(q_lens, kv_lens, causal=True, window=(window, -1), num_targets="random", contextual_len=context,
                     hq=4, hkv=2, activation=activation, out_scale=1.0 if activation == "softmax" else 0.1, seed=9,
                     min_full_attn_len=full[0] if full else 0)
    out, lse, grads = run_triton(case)
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64])
def test_zero_keyless_rows(offsets_dtype):
    """jfa.bwd_common.zero_keyless_rows: exactly the rows of the sequences with no key become zeros (the dK/dV pass
    that stores every other row's dQ relies on it), rows of 0 to 2,000 elements' worth of blocks."""
    from jfa.bwd_common import zero_keyless_rows
    q_lens, kv_lens = [3, 0, 5, 129, 1, 7], [0, 0, 4, 0, 1, 9]
    q_off = torch.tensor([0] + q_lens, dtype=offsets_dtype).cumsum(0).to(offsets_dtype)
    kv_off = torch.tensor([0] + kv_lens, dtype=offsets_dtype).cumsum(0).to(offsets_dtype)
    x = torch.randn(sum(q_lens), 3, 5).to(torch.bfloat16) + 10  # (no zero anywhere before)
    want = x.clone()
    for b, (start, n) in enumerate(zip(q_off.tolist(), q_lens)):
        if kv_lens[b] == 0:
            want[start:start + n] = 0
    assert torch.equal(zero_keyless_rows(x, q_off, kv_off), want)


@pytest.mark.parametrize("hq,hkv,n", [(4, 2, 2), (4, 4, 1), (2, 1, 2)])
def test_triton_softmax_heads(hq, hkv, n):
    """HSTU's num_softmax_heads: the first heads take softmax, the rest silu with its out scale, under HSTU's mask
    (targets, a contextual prefix), against the float64 rule per head, forward and backward; GQA (a kv head a
    score function), and every head softmax."""
    case = make_case(CPU_MODES["causal"]["q_lens"], causal=True, num_targets="random", contextual_len=2, hq=hq,
                     hkv=hkv, activation="silu", out_scale=0.1, num_softmax_heads=n, seed=5)
    out, lse, grads = run_triton(case)
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)
