"""FLOP formulas for torch.utils.flop_counter, so FlopCounterMode reports jfa's ops as it reports SDPA's.

    forward  (torch.ops.jfa.attention):          4 * Hq * D * pairs      (QK^T and PV: 2 matmuls x 2 FLOPs)
    backward (torch.ops.jfa.attention_backward): 10 * Hq * D * pairs     (2.5 x forward: 5 matmuls)

``pairs`` is the exact number of visible (query, key) pairs (jfa.jagged.visible_pairs), the same count as
the benchmark suite's. Counting it reads the offsets (a host sync for GPU offsets: FlopCounterMode is a
measuring tool). When the offsets hold no data (fake/meta tensors, under torch.compile tracing) the count
falls back to an upper bound from the shapes alone: ``Tq * Tk``, tightened to ``Lq * Tk`` in broadcast mode
(exact there without a mask) and to ``Tq * (left + right + 1)`` for a two-sided window.
Registered when jfa is imported.
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula

from .jagged import lengths, visible_pairs
from .problem import Problem, from_flat

FORWARD_FLOPS_PER_PAIR = 4  # x Hq x D
BACKWARD_FLOPS_PER_PAIR = 10  # x Hq x D (2.5 x forward)


def _has_data(t: torch.Tensor) -> bool:
    """Whether t's values can be read (not a fake/meta tensor, nor a functional wrapper of one)."""
    from torch._subclasses.fake_tensor import is_fake
    return t.device.type != "meta" and not is_fake(t)


def pairs_upper_bound(q_rows, kv_rows, broadcast, left, right):
    """Visible pairs bounded from shapes only: q_rows = Tq (or Lq in broadcast mode), kv_rows = Tk."""
    per_query = kv_rows if (left < 0 or right < 0) else min(kv_rows, left + right + 1)
    return q_rows * per_query


def attention_pairs(p: Problem) -> int:
    """Exact visible pairs of one jfa.attention call, or the upper bound when the offsets hold no data."""
    targets = p.targets and _has_data(p.num_targets)
    if _has_data(p.q_offsets) and _has_data(p.kv_offsets) and (targets or not p.targets):
        q_lens = lengths(p.q_offsets.detach().long().cpu())
        if p.broadcast:  # every sequence has the Lq rows of the dense q
            q_lens = torch.full_like(q_lens, p.q.shape[0])
        return visible_pairs(q_lens, lengths(p.kv_offsets.detach().long().cpu()), p.left, p.right,
                             (p.num_targets.cpu(), p.contextual_len, p.min_full_attn_len) if targets else None)
    return pairs_upper_bound(p.q.shape[0], p.k.shape[0], p.broadcast, p.left, p.right)


@register_flop_formula(torch.ops.jfa.attention, get_raw=True)
def attention_flop(*args, out_val=None, **kwargs) -> int:
    p = from_flat(args)
    return FORWARD_FLOPS_PER_PAIR * p.heads * p.head_dim * attention_pairs(p)


@register_flop_formula(torch.ops.jfa.attention_backward, get_raw=True)
def attention_backward_flop(dout, dlse, out, lse, *args, out_val=None, **kwargs) -> int:
    p = from_flat(args)
    return BACKWARD_FLOPS_PER_PAIR * p.heads * p.head_dim * attention_pairs(p)
