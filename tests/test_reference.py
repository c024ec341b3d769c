"""The reference is the spec: check it against padded SDPA per sequence, and its explicit backward
against autograd."""
import pytest
import torch
import torch.nn.functional as F

from jfa import reference
from jfa.jagged import visible_mask
from jfa.testing import CPU_MODES, each_once, make_case, reference_results

CASES = {  # every mode, then more corners of the mask
    **CPU_MODES,
    "window-16-3": dict(q_lens=[5, 63, 129], window=(16, 3)),
    "cross-lq>lk-causal": dict(q_lens=[65, 40], kv_lens=[17, 3], causal=True),
    "cross-lq<lk-window": dict(q_lens=[17, 3], kv_lens=[65, 40], window=(8, 0)),
    "gqa-4-2": dict(q_lens=[33, 64], hq=4, hkv=2),
    "empty-kv": dict(q_lens=[5, 7], kv_lens=[0, 9]),
}


def sdpa_per_sequence(case):
    """Padded F.scaled_dot_product_attention, one sequence at a time, float64."""
    outs = []
    q_off, kv_off = case.q_offsets.tolist(), case.kv_offsets.tolist()
    group = case.q.shape[1] // case.k.shape[1]
    for b in range(len(kv_off) - 1):
        q = case.q if case.broadcast else case.q[q_off[b]:q_off[b + 1]]
        k, v = case.k[kv_off[b]:kv_off[b + 1]], case.v[kv_off[b]:kv_off[b + 1]]
        mask = visible_mask(q.shape[0], k.shape[0], case.left, case.right)
        qh = q.double().transpose(0, 1)
        kh = k.double().transpose(0, 1).repeat_interleave(group, 0)
        vh = v.double().transpose(0, 1).repeat_interleave(group, 0)
        if k.shape[0] == 0:
            o = torch.zeros_like(qh)
        else:
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=case.scale)
            o = torch.where(mask.any(-1)[None, :, None], o, 0.0)  # rows that see no key: 0 by our contract
        outs.append(o.transpose(0, 1))
    return torch.cat(outs) if outs else case.q.new_zeros(0, case.q.shape[1], case.q.shape[2]).double()


@pytest.mark.parametrize("name", list(CASES))
def test_reference_matches_padded_sdpa(name):
    case = make_case(**CASES[name], dtype=torch.float64)
    out, lse = reference.attention(case.q, case.k, case.v, case.q_offsets, case.kv_offsets, scale=case.scale,
                                   left=case.left, right=case.right, broadcast=case.broadcast,
                                   compute_dtype=torch.float64)
    torch.testing.assert_close(out, sdpa_per_sequence(case), atol=1e-12, rtol=1e-10)
    assert not torch.isnan(lse).any()


def test_reference_broadcast_matches_sdpa():
    case = make_case(None, kv_lens=[0, 1, 63, 65], broadcast_lq=16, causal=True, dtype=torch.float64)
    out, _ = reference.attention(case.q, case.k, case.v, case.q_offsets, case.kv_offsets, scale=case.scale,
                                 left=case.left, right=case.right, broadcast=True, compute_dtype=torch.float64)
    torch.testing.assert_close(out, sdpa_per_sequence(case), atol=1e-12, rtol=1e-10)


BWD_CASES = dict(CASES, broadcast=dict(q_lens=None, kv_lens=[0, 3, 65], broadcast_lq=8, window=(4, 4)))


@pytest.mark.parametrize("name", list(BWD_CASES))
def test_reference_backward_matches_autograd(name):
    case = make_case(**BWD_CASES[name], dtype=torch.float64)
    out, lse, *want = reference_results(case, torch.float64)
    dlse = torch.randn_like(lse).masked_fill(torch.isinf(lse), 0.0)
    # autograd through out and lse together
    q, k, v = (x.detach().clone().requires_grad_() for x in (case.q, case.k, case.v))
    o2, l2 = reference.attention(q, k, v, case.q_offsets, case.kv_offsets, scale=case.scale, left=case.left,
                                 right=case.right, broadcast=case.broadcast, compute_dtype=torch.float64)
    auto = torch.autograd.grad((o2, l2), (q, k, v), (case.dout, dlse), allow_unused=True)
    got = reference.attention_backward(case.dout, dlse, case.q, case.k, case.v, out, case.q_offsets,
                                       case.kv_offsets, scale=case.scale, left=case.left, right=case.right,
                                       broadcast=case.broadcast, compute_dtype=torch.float64)
    for g, a in zip(got, auto):
        a = torch.zeros_like(g) if a is None else a
        torch.testing.assert_close(g, a, atol=1e-10, rtol=1e-8)


def test_rows_that_see_nothing_are_zero_with_minus_inf_lse_and_finite_grads():
    # causal with Lq > Lk: the first Lq - Lk queries see no key; sequence 1 has no keys at all.
    case = make_case([6, 4], kv_lens=[2, 0], causal=True, dtype=torch.float64)
    out, lse, dq, dk, dv = reference_results(case, torch.float64)
    assert torch.equal(out[:4], torch.zeros_like(out[:4])) and torch.equal(out[6:], torch.zeros_like(out[6:]))
    assert torch.isinf(lse[:, :4]).all() and (lse[:, :4] < 0).all() and torch.isinf(lse[:, 6:]).all()
    assert torch.isfinite(lse[:, 4:6]).all()
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert torch.equal(dq[:4], torch.zeros_like(dq[:4]))


ACTIVATION_FNS = {  # f written independently of jfa.reference (its formulas, not its code)
    "silu": lambda x: x / (1 + torch.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / 2 ** 0.5)),
    "gelu_tanh": lambda x: 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3))),
    "relu": lambda x: torch.clamp(x, min=0),
    "relu2": lambda x: torch.clamp(x, min=0) ** 2,
    "sigmoid": lambda x: 1 / (1 + torch.exp(-x)),
    "identity": lambda x: x,
}


@pytest.mark.parametrize("activation,mode", each_once(list(ACTIVATION_FNS), ["causal", "window", "cross", "gqa",
                                                                          "broadcast", "empty-kv"], "silu", "causal"))
def test_reference_activation_matches_the_formula(activation, mode):
    """out_i = c_i sum over visible j of f(scale q_i . k_j) v_j, pair by pair in float64, c per row: every activation
    (causal), every mode (silu)."""
    case = make_case(**CPU_MODES[mode], activation=activation, out_scale="rows", dtype=torch.float64, seed=5)
    out, lse = reference.attention(case.q, case.k, case.v, case.q_offsets, case.kv_offsets, scale=case.scale,
                                   left=case.left, right=case.right, broadcast=case.broadcast,
                                   compute_dtype=torch.float64, activation=activation, out_scale=case.out_scale)
    assert lse.shape == (case.q.shape[1], 0)
    want = torch.zeros_like(out)
    q_off, kv_off = case.q_offsets.tolist(), case.kv_offsets.tolist()
    lq = case.q.shape[0] if case.broadcast else None
    group = case.q.shape[1] // case.k.shape[1]
    f = ACTIVATION_FNS[activation]
    for b in range(len(kv_off) - 1):
        rows = range(b * lq, (b + 1) * lq) if case.broadcast else range(q_off[b], q_off[b + 1])
        mask = visible_mask(len(rows), kv_off[b + 1] - kv_off[b], case.left, case.right)
        for i, r in enumerate(rows):
            qi = case.q[i] if case.broadcast else case.q[r]
            for j in torch.nonzero(mask[i]).flatten().tolist():
                key = kv_off[b] + j
                for h in range(case.q.shape[1]):
                    want[r, h] += f(case.scale * (qi[h] @ case.k[key, h // group])) * case.v[key, h // group]
    want *= case.out_scale.view(-1, 1, 1)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("activation,mode", each_once(list(ACTIVATION_FNS), ["causal", "cross", "gqa", "broadcast"],
                                                      "silu", "causal"))
def test_reference_activation_backward_matches_autograd(activation, mode):
    case = make_case(**CPU_MODES[mode], activation=activation, out_scale="rows", dtype=torch.float64, seed=6)
    kw = dict(scale=case.scale, left=case.left, right=case.right, broadcast=case.broadcast,
              compute_dtype=torch.float64, activation=activation, out_scale=case.out_scale)
    q, k, v = (x.detach().clone().requires_grad_() for x in (case.q, case.k, case.v))
    out, _ = reference.attention(q, k, v, case.q_offsets, case.kv_offsets, **kw)
    auto = torch.autograd.grad(out, (q, k, v), case.dout)
    got = reference.attention_backward(case.dout, None, case.q, case.k, case.v, out.detach(), case.q_offsets,
                                       case.kv_offsets, **kw)
    for g, a in zip(got, auto):
        torch.testing.assert_close(g, a, atol=1e-10, rtol=1e-8)


def _hstu_valid_mask(n, num_targets, contextual_len, max_attn_len, min_full_attn_len):
    """HSTU's own rule for one sequence of n rows, as generative-recommenders' PyTorch reference states it (its ids
    shifted by the context and clamped at the targets, causal, the window max_attn_len unless a row's id reaches
    max_ids - min_full_attn_len, the first id seeing the history): bool [n, n]."""
    ids = torch.arange(n)
    max_ids = n
    if contextual_len > 0:
        ids = torch.clamp(ids - contextual_len + 1, min=0)
        max_ids = max_ids - contextual_len + 1
    max_ids = max_ids - num_targets
    ids = torch.clamp(ids, max=max_ids)
    row, col = ids.view(n, 1), ids.view(1, n)
    dist = row - col
    valid = torch.eye(n, dtype=torch.bool) | (dist > 0)
    if max_attn_len > 0:
        near = dist <= max_attn_len
        if min_full_attn_len > 0:
            near = near | (row >= max_ids - min_full_attn_len)
        valid = valid & near
    if contextual_len > 0:
        valid = valid | ((row == 0) & (col < max_ids))
    return valid


def test_target_mask_with_full_rows_is_hstus_rule():
    """jfa.jagged.target_mask with min_full_attn_len (and targets, a context, a window) is HSTU's rule, for every
    target count of sequences of 0 to 40 rows. (HSTU's max_attn_len 0 is no window: jfa's -1; jfa's 0, a row seeing
    itself alone, HSTU cannot say.)"""
    for n in (0, 1, 2, 7, 40):
        for t in range(n + 1):
            for c, w, f in ((0, 5, 3), (0, 5, 0), (3, 4, 6), (1, 10, 1), (6, 2, 50), (2, 1, 4), (2, -1, 0)):
                if c > n:
                    continue
                got = visible_mask(n, n, w, 0, targets=(t, c, f))
                assert torch.equal(got, _hstu_valid_mask(n, t, c, max(w, 0), f)), (n, t, c, w, f)
