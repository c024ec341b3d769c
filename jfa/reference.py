"""The reference: jagged attention in plain PyTorch, one sequence at a time. It is the spec.

Shapes (packed jagged): q ``[Tq, Hq, D]``, k/v ``[Tk, Hkv, D]``, offsets ``[B+1]``. Broadcast mode: q is one
dense ``[Lq, Hq, D]`` block attended by every kv sequence; the output has ``B*Lq`` rows (sequence-major).

Softmax (the default): returns ``out [rows, Hq, D]`` (q's dtype) and ``lse [Hq, rows]`` (float32, natural log,
``-inf`` for a row that sees no key; such a row's output is 0). Another activation f (ACTIVATIONS):
``out[i] = out_scale[i] * sum over the keys j visible to query i of f(scale * q_i . k_j) v_j`` (out_scale a float
or a tensor of one value per output row; a row that sees no key outputs 0), and lse has no columns
(``[Hq, 0]``). Differentiable with autograd, with no NaN for empty rows.

``compute_dtype`` picks the arithmetic (float32 by default; float64 for the tests' ground truth; ``None``
keeps the input dtype, which the tests use to measure what PyTorch itself loses in bf16/fp16).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import bias as rel
from .jagged import score_heads, visible_mask

_C0, _C1 = math.sqrt(2.0 / math.pi), 0.044715  # the tanh form of GELU


def _dgelu(x):
    return 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _dgelu_tanh(x):
    t = torch.tanh(_C0 * (x + _C1 * x ** 3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _C0 * (1.0 + 3.0 * _C1 * x * x)


# name -> (f, f'): the activations that may take softmax's place
ACTIVATIONS = {
    "silu": (F.silu, lambda x: torch.sigmoid(x) * (1.0 + x * (1.0 - torch.sigmoid(x)))),
    "gelu": (F.gelu, _dgelu),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), _dgelu_tanh),
    "relu": (F.relu, lambda x: (x > 0).to(x.dtype)),
    "relu2": (lambda x: F.relu(x).square(), lambda x: 2.0 * F.relu(x)),
    "sigmoid": (torch.sigmoid, lambda x: torch.sigmoid(x) * (1.0 - torch.sigmoid(x))),
    "identity": (lambda x: x, torch.ones_like),
}


def _heads(q, k, v, dt):
    group = q.shape[1] // k.shape[1]
    qh = q.to(dt).transpose(0, 1)  # [Hq, Lq, D]
    kh = k.to(dt).transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, Lk, D]
    vh = v.to(dt).transpose(0, 1).repeat_interleave(group, dim=0)
    return qh, kh, vh


def attention_one(q, k, v, scale, left, right, compute_dtype=torch.float32, activation="softmax", targets=None,
                  bias=None):
    """One sequence. q ``[Lq, Hq, D]``, k/v ``[Lk, Hkv, D]`` -> (out ``[Lq, Hq, D]``, lse ``[Hq, Lq]``, or
    ``[Hq, 0]`` for an activation), before any out_scale; targets = (its targets, contextual_len): HSTU's mask
    (jfa.jagged.target_mask) in place of the window's; bias ``[Hq, Lq, Lk]`` added to the scaled scores (jfa.bias)."""
    lq, hq, _ = q.shape
    lk = k.shape[0]
    dt = compute_dtype or q.dtype
    qh, kh, vh = _heads(q, k, v, dt)
    mask = visible_mask(lq, lk, left, right, device=q.device, targets=targets)  # [Lq, Lk]
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale  # [Hq, Lq, Lk]
    if bias is not None:
        s = s + bias
    if activation != "softmax":
        p = ACTIVATIONS[activation][0](s).masked_fill(~mask, 0.0)
        return torch.matmul(p, vh).transpose(0, 1).to(q.dtype), q.new_zeros(hq, 0, dtype=torch.float32)
    row_sees = mask.any(dim=-1)  # [Lq]
    # Hidden keys get -inf; rows that see nothing are set to 0 (then zeroed below) so nothing is NaN.
    s = s.masked_fill(~mask, float("-inf")).masked_fill(~row_sees.unsqueeze(-1), 0.0)
    lse = torch.logsumexp(s, dim=-1)  # [Hq, Lq]
    p = torch.exp(s - lse.unsqueeze(-1)) * row_sees.unsqueeze(-1)
    out = torch.matmul(p, vh)  # [Hq, Lq, D]
    lse = lse.float().masked_fill(~row_sees, float("-inf"))
    return out.transpose(0, 1).to(q.dtype), lse


def _rows_scaled(x, out_scale):
    """x [rows, H, D] times out_scale (a float, or one value per row)."""
    if isinstance(out_scale, torch.Tensor):
        return x * out_scale.to(device=x.device, dtype=x.dtype).view(-1, 1, 1)
    return x if out_scale == 1.0 else x * out_scale


def _targets(num_targets, contextual_len, batch, min_full_attn_len=0):
    """Per sequence: (its targets, contextual_len, min_full_attn_len), or None (the window's mask)."""
    if num_targets is None:
        return [None] * batch
    return [(t, contextual_len, min_full_attn_len) for t in num_targets.tolist()]


def _score_parts(q, k, num_softmax_heads):
    """jfa.jagged.score_heads as (query head slice, kv head slice, score arguments)."""
    parts, hq, hk = [], 0, 0
    for nq, nk, score in score_heads(q.shape[1], k.shape[1], num_softmax_heads):
        parts.append((slice(hq, hq + nq), slice(hk, hk + nk), score))
        hq, hk = hq + nq, hk + nk
    return parts


def attention(q, k, v, q_offsets, kv_offsets, *, scale=None, left=-1, right=-1, broadcast=False,
              compute_dtype=torch.float32, activation="softmax", out_scale=1.0, num_targets=None, contextual_len=0,
              rel_bias=None, min_full_attn_len=0, num_softmax_heads=0):
    """Packed jagged attention (see module doc). ``q_offsets`` is ignored in broadcast mode. num_targets ``[B]``
    (with contextual_len, min_full_attn_len): HSTU's mask, jfa.jagged.target_mask (self-attention; left is its
    window). rel_bias: a jfa.bias.Tables (differentiable in its tables). num_softmax_heads: the first query heads
    (a multiple of the GQA group) take softmax, the rest the activation (out concatenated by head)."""
    if num_softmax_heads:
        kw = dict(scale=scale, left=left, right=right, broadcast=broadcast, compute_dtype=compute_dtype,
                  activation=activation, out_scale=out_scale, num_targets=num_targets, contextual_len=contextual_len,
                  rel_bias=rel_bias, min_full_attn_len=min_full_attn_len)
        parts = [attention(q[:, hq], k[:, hk], v[:, hk], q_offsets, kv_offsets, **{**kw, **score})
                 for hq, hk, score in _score_parts(q, k, num_softmax_heads)]
        return torch.cat([o for o, _ in parts], 1), parts[-1][1]  # (with activation heads, their lse: none)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    kv_off = kv_offsets.tolist()
    q_off = [b * q.shape[0] for b in range(len(kv_off))] if broadcast else q_offsets.tolist()
    targets = _targets(num_targets, contextual_len, len(kv_off) - 1, min_full_attn_len)
    outs, lses = [], []
    for b in range(len(kv_off) - 1):
        qb = q if broadcast else q[q_off[b]:q_off[b + 1]]
        kb, vb = k[kv_off[b]:kv_off[b + 1]], v[kv_off[b]:kv_off[b + 1]]
        bias = rel.matrix(rel_bias, slice(q_off[b], q_off[b + 1]), slice(kv_off[b], kv_off[b + 1]), qb.shape[0],
                          kb.shape[0], compute_dtype or q.dtype)
        o, l = attention_one(qb, kb, vb, scale, left, right, compute_dtype, activation, targets[b], bias)
        outs.append(o)
        lses.append(l)
    if not outs:
        return q.new_zeros(0, q.shape[1], v.shape[2]), q.new_zeros(q.shape[1], 0, dtype=torch.float32)
    return _rows_scaled(torch.cat(outs, 0), out_scale), torch.cat(lses, 1)


def attention_one_backward(q, k, v, out, dout, dlse, scale, left, right, compute_dtype=torch.float32,
                           magnitudes=False, activation="softmax", targets=None, bias=None):
    """Explicit gradients for one sequence (what the kernels compute), checked against autograd in the tests;
    dout already times the rows' out_scale for an activation.

    Softmax: P = exp(S - lse), dV = P^T dO, dP = dO V^T, Delta = rowsum(dO * O) - dLSE, dS = P * (dP - Delta).
    An activation f: P = f(S), dV = P^T dO, dP = dO V^T, dS = f'(S) dP (no Delta, no lse).
    Both: dQ = scale * dS K, dK = scale * dS^T Q; GQA sums dK/dV over the query heads of a group. dS (returned
    fourth, [Hq, Lq, Lk]) is dL/dscore: a bias's gradient (jfa.bias).
    ``magnitudes=True`` computes the same sums over absolute values (|dO|, |V|, |Q|, |K|, |dP| + |Delta|):
    the size of the terms whose rounding the gradients carry (the tests' error bound for float32).
    """
    lq, hq, d = q.shape
    lk, hkv, _ = k.shape
    dt, group = compute_dtype, hq // hkv
    qh, kh, vh = _heads(q, k, v, dt)
    oh, doh = (x.to(dt).transpose(0, 1) for x in (out, dout))  # [Hq, Lq, D]
    mask = visible_mask(lq, lk, left, right, device=q.device, targets=targets)
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias
    if activation != "softmax":
        f, df = ACTIVATIONS[activation]
        p, dfs = f(s).masked_fill(~mask, 0.0), df(s).masked_fill(~mask, 0.0)
        if magnitudes:
            qh, kh, vh, doh, p, dfs = qh.abs(), kh.abs(), vh.abs(), doh.abs(), p.abs(), dfs.abs()
        dv = torch.matmul(p.transpose(-1, -2), doh)
        ds = dfs * torch.matmul(doh, vh.transpose(-1, -2))
    else:
        row_sees = mask.any(dim=-1)
        s = s.masked_fill(~mask, float("-inf")).masked_fill(~row_sees.unsqueeze(-1), 0.0)
        p = torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True)) * row_sees.unsqueeze(-1)  # [Hq, Lq, Lk]
        if magnitudes:
            qh, kh, vh, oh, doh = qh.abs(), kh.abs(), vh.abs(), oh.abs(), doh.abs()
            dlse = None if dlse is None else -dlse.abs()
        delta = (doh * oh).sum(-1)  # [Hq, Lq]
        if dlse is not None:
            delta = delta - dlse.to(dt).masked_fill(~row_sees, 0.0)
        dv = torch.matmul(p.transpose(-1, -2), doh)
        dp = torch.matmul(doh, vh.transpose(-1, -2))
        ds = p * (dp + delta.unsqueeze(-1)) if magnitudes else p * (dp - delta.unsqueeze(-1))
    dq = torch.matmul(ds, kh) * scale
    dk = torch.matmul(ds.transpose(-1, -2), qh) * scale
    dk = dk.view(hkv, group, lk, d).sum(1)
    dv = dv.view(hkv, group, lk, d).sum(1)
    return dq.transpose(0, 1), dk.transpose(0, 1), dv.transpose(0, 1), ds


def attention_backward(dout, dlse, q, k, v, out, q_offsets, kv_offsets, *, scale, left=-1, right=-1,
                       broadcast=False, compute_dtype=torch.float32, magnitudes=False, activation="softmax",
                       out_scale=1.0, num_targets=None, contextual_len=0, rel_bias=None, min_full_attn_len=0,
                       num_softmax_heads=0):
    """Gradients (dq, dk, dv) of ``attention`` for upstream grads dout ``[rows, Hq, D]`` and dlse
    ``[Hq, rows]`` (or None), and with rel_bias (jfa.bias.Tables) the tables' (dposition, dtime), float32 [Hq, L]
    (None for an absent table). Broadcast: dq sums the batch's contributions in float32."""
    if num_softmax_heads:
        kw = dict(scale=scale, left=left, right=right, broadcast=broadcast, compute_dtype=compute_dtype,
                  magnitudes=magnitudes, activation=activation, out_scale=out_scale, num_targets=num_targets,
                  contextual_len=contextual_len, min_full_attn_len=min_full_attn_len)
        parts = [attention_backward(dout[:, hq], None if dlse is None else dlse[hq], q[:, hq], k[:, hk], v[:, hk],
                                    out[:, hq], q_offsets, kv_offsets, **{**kw, **score})
                 for hq, hk, score in _score_parts(q, k, num_softmax_heads)]
        return tuple(torch.cat(grads, 1) for grads in zip(*parts))
    kv_off = kv_offsets.tolist()
    q_off = [b * q.shape[0] for b in range(len(kv_off))] if broadcast else q_offsets.tolist()
    if activation != "softmax":  # the out scale is a constant factor of each row's output: of its dO
        dout = _rows_scaled(dout.to(compute_dtype or dout.dtype), out_scale)
    dq = torch.zeros(q.shape, dtype=compute_dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=compute_dtype, device=q.device)
    dv = torch.zeros(v.shape, dtype=compute_dtype, device=q.device)
    targets = _targets(num_targets, contextual_len, len(kv_off) - 1, min_full_attn_len)
    tables = None if rel_bias is None else [
        None if t is None else torch.zeros(t.shape, dtype=compute_dtype, device=q.device)
        for t in (rel_bias.position, rel_bias.time)]
    for b in range(len(kv_off) - 1):
        qs, ks = slice(q_off[b], q_off[b + 1]), slice(kv_off[b], kv_off[b + 1])
        qb = q if broadcast else q[qs]
        lq, lk = qb.shape[0], ks.stop - ks.start
        at = None if rel_bias is None else rel.entries(rel_bias, qs, ks, lq, lk)
        bias = rel.matrix(rel_bias, qs, ks, lq, lk, compute_dtype, at)
        g = attention_one_backward(qb, k[ks], v[ks], out[qs], dout[qs], None if dlse is None else dlse[:, qs],
                                   scale, left, right, compute_dtype, magnitudes, activation, targets[b], bias)
        if rel_bias is not None:  # each table entry's gradient: dS summed over the pairs that read it
            for grad, index in zip(tables, at):
                if grad is not None:
                    grad.index_add_(1, index.reshape(-1), g[3].reshape(grad.shape[0], -1))
        if broadcast:
            dq += g[0]
        else:
            dq[qs] = g[0]
        dk[ks], dv[ks] = g[1], g[2]
    grads = dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    return grads if rel_bias is None else grads + tuple(None if t is None else t.float() for t in tables)
