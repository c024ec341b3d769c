"""The reference: jagged attention in plain PyTorch, one sequence at a time. It is the spec.

Shapes (packed jagged): q ``[Tq, Hq, D]``, k/v ``[Tk, Hkv, D]``, offsets ``[B+1]``. Broadcast mode: q is one
dense ``[Lq, Hq, D]`` block attended by every kv sequence; the output has ``B*Lq`` rows (sequence-major).
Returns ``out [rows, Hq, D]`` (q's dtype) and ``lse [Hq, rows]`` (float32, natural log, ``-inf`` for a row
that sees no key; such a row's output is 0). Differentiable with autograd, with no NaN for empty rows.

``compute_dtype`` picks the arithmetic (float32 by default; float64 for the tests' ground truth; ``None``
keeps the input dtype, which the tests use to measure what PyTorch itself loses in bf16/fp16).
"""
from __future__ import annotations

import math

import torch

from .jagged import visible_mask


def attention_one(q, k, v, scale, left, right, compute_dtype=torch.float32):
    """One sequence. q ``[Lq, Hq, D]``, k/v ``[Lk, Hkv, D]`` -> (out ``[Lq, Hq, D]``, lse ``[Hq, Lq]``)."""
    lq, hq, _ = q.shape
    lk, hkv, _ = k.shape
    dt = compute_dtype or q.dtype
    group = hq // hkv
    qh = q.to(dt).transpose(0, 1)  # [Hq, Lq, D]
    kh = k.to(dt).transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, Lk, D]
    vh = v.to(dt).transpose(0, 1).repeat_interleave(group, dim=0)
    mask = visible_mask(lq, lk, left, right, device=q.device)  # [Lq, Lk]
    row_sees = mask.any(dim=-1)  # [Lq]
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale  # [Hq, Lq, Lk]
    # Hidden keys get -inf; rows that see nothing are set to 0 (then zeroed below) so nothing is NaN.
    s = s.masked_fill(~mask, float("-inf")).masked_fill(~row_sees.unsqueeze(-1), 0.0)
    lse = torch.logsumexp(s, dim=-1)  # [Hq, Lq]
    p = torch.exp(s - lse.unsqueeze(-1)) * row_sees.unsqueeze(-1)
    out = torch.matmul(p, vh)  # [Hq, Lq, D]
    lse = lse.float().masked_fill(~row_sees, float("-inf"))
    return out.transpose(0, 1).to(q.dtype), lse


def attention(q, k, v, q_offsets, kv_offsets, *, scale=None, left=-1, right=-1, broadcast=False,
              compute_dtype=torch.float32):
    """Packed jagged attention (see module doc). ``q_offsets`` is ignored in broadcast mode."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    kv_off = kv_offsets.tolist()
    q_off = [b * q.shape[0] for b in range(len(kv_off))] if broadcast else q_offsets.tolist()
    outs, lses = [], []
    for b in range(len(kv_off) - 1):
        qb = q if broadcast else q[q_off[b]:q_off[b + 1]]
        kb, vb = k[kv_off[b]:kv_off[b + 1]], v[kv_off[b]:kv_off[b + 1]]
        o, l = attention_one(qb, kb, vb, scale, left, right, compute_dtype)
        outs.append(o)
        lses.append(l)
    if not outs:
        return q.new_zeros(0, q.shape[1], v.shape[2]), q.new_zeros(q.shape[1], 0, dtype=torch.float32)
    return torch.cat(outs, 0), torch.cat(lses, 1)


def attention_one_backward(q, k, v, out, dout, dlse, scale, left, right, compute_dtype=torch.float32,
                           magnitudes=False):
    """Explicit gradients for one sequence (what the kernels compute), checked against autograd in the tests.

    P = exp(S - lse), dV = P^T dO, dP = dO V^T, Delta = rowsum(dO * O) - dLSE, dS = P * (dP - Delta),
    dQ = scale * dS K, dK = scale * dS^T Q; GQA sums dK/dV over the query heads of a group.
    ``magnitudes=True`` computes the same sums over absolute values (|dO|, |V|, |Q|, |K|, |dP| + |Delta|):
    the size of the terms whose rounding the gradients carry (the tests' error bound for float32).
    """
    lq, hq, d = q.shape
    lk, hkv, _ = k.shape
    dt, group = compute_dtype, hq // hkv
    qh, oh, doh = (x.to(dt).transpose(0, 1) for x in (q, out, dout))  # [Hq, Lq, D]
    kh = k.to(dt).transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, Lk, D]
    vh = v.to(dt).transpose(0, 1).repeat_interleave(group, dim=0)
    mask = visible_mask(lq, lk, left, right, device=q.device)
    row_sees = mask.any(dim=-1)
    s = (torch.matmul(qh, kh.transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf"))
    s = s.masked_fill(~row_sees.unsqueeze(-1), 0.0)
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
    return dq.transpose(0, 1), dk.transpose(0, 1), dv.transpose(0, 1)


def attention_backward(dout, dlse, q, k, v, out, q_offsets, kv_offsets, *, scale, left=-1, right=-1,
                       broadcast=False, compute_dtype=torch.float32, magnitudes=False):
    """Gradients (dq, dk, dv) of ``attention`` for upstream grads dout ``[rows, Hq, D]`` and dlse
    ``[Hq, rows]`` (or None). Broadcast: dq sums the batch's contributions in float32."""
    kv_off = kv_offsets.tolist()
    q_off = [b * q.shape[0] for b in range(len(kv_off))] if broadcast else q_offsets.tolist()
    dq = torch.zeros(q.shape, dtype=compute_dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=compute_dtype, device=q.device)
    dv = torch.zeros(v.shape, dtype=compute_dtype, device=q.device)
    for b in range(len(kv_off) - 1):
        qs, ks = slice(q_off[b], q_off[b + 1]), slice(kv_off[b], kv_off[b + 1])
        qb = q if broadcast else q[qs]
        g = attention_one_backward(qb, k[ks], v[ks], out[qs], dout[qs], None if dlse is None else dlse[:, qs],
                                   scale, left, right, compute_dtype, magnitudes)
        if broadcast:
            dq += g[0]
        else:
            dq[qs] = g[0]
        dk[ks], dv[ks] = g[1], g[2]
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
