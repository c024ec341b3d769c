"""Other attention kernels behind jfa's signatures (jfa.jagged_attention's, or with broadcast_of, jfa.broadcast
attention's), written once for the end-to-end model (jfa.models, through jfa.nn's ``attention``) and the bench
(jfa.bench.providers): each called as its own users call it. Benchmark peers only, never a dependency: each is
imported when called.

  fa2_attention      torch.nn.attention.varlen.varlen_attn (FlashAttention 2 inside PyTorch; CUDA)
  fa4_attention      flash_attn.cute.flash_attn_varlen_func (flash-attn-4, its sm90 path on Hopper; when installed)
  PaddedSDPA         F.scaled_dot_product_attention on [B, H, L, D] copies with a boolean mask (any device)
  broadcast_of(f)    broadcast q for a kernel that has no such mode: q repeated per sequence (timed with it)
"""
from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F

from .jagged import causal_window, pair_mask
from .nested import from_padded, to_padded


def _max_len(offsets, max_len):
    return int((offsets[1:] - offsets[:-1]).max()) if max_len is None else max_len


@functools.lru_cache(maxsize=None)
def varlen_params() -> frozenset:
    from torch.nn.attention.varlen import varlen_attn
    return frozenset(inspect.signature(varlen_attn).parameters)


def fa2_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                  window=(-1, -1), scale=None):
    """torch's varlen_attn (FA2); GQA through enable_gqa where torch has it, else k/v repeated per q head."""
    from torch.nn.attention.varlen import varlen_attn
    kv_offsets = q_offsets if kv_offsets is None else kv_offsets
    kw = {"scale": scale}
    left, right = causal_window(causal, window)
    if (left, right) != (-1, -1):
        kw["window_size"] = (left, right)
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in varlen_params():
            kw["enable_gqa"] = True
        else:
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    return varlen_attn(q, k, v, q_offsets.to(torch.int32), kv_offsets.to(torch.int32), _max_len(q_offsets, max_q_len),
                       _max_len(kv_offsets, max_kv_len), **kw)


def fa4_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                  window=(-1, -1), scale=None):
    """flash-attn-4's varlen function (its sm90 path on Hopper)."""
    from flash_attn.cute import flash_attn_varlen_func
    kv_offsets = q_offsets if kv_offsets is None else kv_offsets
    left, right = causal_window(causal, window)
    is_causal = (left, right) == (-1, 0)
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=q_offsets.to(torch.int32),
                                 cu_seqlens_k=kv_offsets.to(torch.int32), max_seqlen_q=_max_len(q_offsets, max_q_len),
                                 max_seqlen_k=_max_len(kv_offsets, max_kv_len), softmax_scale=scale, causal=is_causal,
                                 window_size=(None, None) if is_causal else
                                 (None if left < 0 else left, None if right < 0 else right))
    return out[0] if isinstance(out, tuple) else out


class PaddedSDPA:
    """Dense SDPA over padded copies: made once per batch (the mask, from jfa.jagged's rule, bottom-right aligned),
    called per layer with packed q, k, v -> packed out. A row that sees no key sees key 0 instead (SDPA would give
    NaN); jfa gives 0 there."""

    def __init__(self, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False, window=(-1, -1)):
        self.q_offsets = q_offsets
        self.kv_offsets = q_offsets if kv_offsets is None else kv_offsets
        self.lq, self.lk = _max_len(q_offsets, max_q_len), _max_len(self.kv_offsets, max_kv_len)
        self.q_lens = q_offsets[1:] - q_offsets[:-1]
        self.kv_lens = self.kv_offsets[1:] - self.kv_offsets[:-1]
        device = q_offsets.device
        i = torch.arange(self.lq, device=device).view(1, self.lq, 1)
        j = torch.arange(self.lk, device=device).view(1, 1, self.lk)
        mask = pair_mask(i, j, self.q_lens.view(-1, 1, 1), self.kv_lens.view(-1, 1, 1), *causal_window(causal, window))
        self.mask = (mask | (~mask.any(-1, keepdim=True) & (j == 0))).unsqueeze(1)  # [B, 1, Lq, Lk]

    def __call__(self, q, k, v, scale=None):
        qp, _ = to_padded(q, self.q_offsets, self.lq)
        kp, _ = to_padded(k, self.kv_offsets, self.lk)
        vp, _ = to_padded(v, self.kv_offsets, self.lk)
        out = F.scaled_dot_product_attention(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2),
                                             attn_mask=self.mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
        return from_padded(out.transpose(1, 2), self.q_lens)[0]


def padded_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                     window=(-1, -1), scale=None):
    """PaddedSDPA made and called at once: a model's layer without a jagged kernel."""
    return PaddedSDPA(q_offsets, kv_offsets, max_q_len=max_q_len, max_kv_len=max_kv_len, causal=causal,
                      window=window)(q, k, v, scale)


def broadcast_rows(q, kv_offsets):
    """Broadcast q as these libraries' users run it: q repeated per sequence, [B * Lq, H, D], and its offsets."""
    batch, lq = kv_offsets.numel() - 1, q.shape[0]
    rows = q.unsqueeze(0).expand(batch, -1, -1, -1).reshape(batch * lq, q.shape[1], q.shape[2])
    return rows, torch.arange(batch + 1, device=q.device, dtype=torch.int32) * lq


def broadcast_of(attention):
    """jfa.broadcast_attention's signature over a jagged kernel: q repeated per sequence (timed with it)."""
    def broadcast(q, k, v, kv_offsets, *, max_kv_len=None, causal=False, window=(-1, -1), scale=None):
        rows, q_offsets = broadcast_rows(q, kv_offsets)
        out = attention(rows, k, v, q_offsets, kv_offsets, max_q_len=q.shape[0], max_kv_len=max_kv_len,
                        causal=causal, window=window, scale=scale)
        return out.view(kv_offsets.numel() - 1, q.shape[0], q.shape[1], q.shape[2])
    return broadcast


KERNELS = {  # impl -> (jagged attention, broadcast attention) for jfa.nn's `attention`; None: jfa's own
    "jfa": (None, None),
    "fa2": (fa2_attention, broadcast_of(fa2_attention)),
    "fa4": (fa4_attention, broadcast_of(fa4_attention)),
    "padded": (padded_attention, broadcast_of(padded_attention)),
}
