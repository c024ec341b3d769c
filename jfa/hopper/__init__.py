"""The Hopper (sm_90) backend: persistent, warp-specialized Gluon kernels over load-balanced schedules, the
forward (jfa.hopper.fwd) and the backward: Delta, then the dK/dV kernel (jfa.hopper.bwd) with dQ in the same pass
by TMA reduce-add, or stored where a sequence fits one key tile, and where it computes no dQ (or not all), the dQ
pass (jfa.hopper.bwd_dq); always two passes with no atomics when deterministic. The kernels' configurations are
values (jfa.hopper.config): chosen by shape, or handed in. Head dims 64 and 128 in bf16/fp16; others fall back
(jfa.backends.select says so). docs/hopper.md describes the kernels."""
from __future__ import annotations

import torch

from ..bwd_common import delta, scaled_rows, sum_broadcast_dq, zero_keyless_rows
from ..jagged import UNBOUNDED
from ..problem import Problem
from ..variants import score_args
from .config import BwdPlan, DqRoute, FwdConfig, bwd_classes

HEAD_DIMS = (64, 128)


def supports(device: torch.device, head_dim: int, dtype: torch.dtype) -> bool:
    if device.type != "cuda" or head_dim not in HEAD_DIMS or dtype not in (torch.bfloat16, torch.float16):
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


def forward(p: Problem, cfg: FwdConfig | None = None):
    """-> (out [rows, Hq, D], lse [Hq, rows] float32), in config cfg, else one launch a key-length class
    (jfa.hopper.config.fwd_classes)."""
    from .fwd import forward
    return forward(p, cfg)


def dq_buffer(p: Problem, shape, dtype, stored_by_dkdv: bool):
    """dQ's buffer, zeroed where no kernel writes: the rows of queries that see no key. Where the dK/dV pass stores
    every sequence's dQ (DqRoute.DIRECT, max_kv_len <= its key tile) those are none in self-attention (every query
    sees its own key) and, in cross attention without a mask, the rows of the sequences with no key: only they are
    zeroed (zeroing the whole buffer cost gdpa-cross-short-kv's backward ~0.13 of 1.06 ms)."""
    unmasked = p.left == UNBOUNDED and p.right == UNBOUNDED and not p.targets and not p.broadcast
    if not stored_by_dkdv or not (p.self_attention or unmasked):
        return torch.zeros(shape, device=p.q.device, dtype=dtype)
    dq = torch.empty(shape, device=p.q.device, dtype=dtype)
    return dq if p.self_attention else zero_keyless_rows(dq, p.q_offsets, p.kv_offsets)


def row_stats(p: Problem, out, lse, dout, dlse):
    """(dO as the kernels take it, Delta): softmax's Delta = rowsum(dO O) - dLSE; an activation has none (lse, with no
    columns, stands in) and a per-row out scale is a factor of dO."""
    if p.softmax:
        return dout, delta(out, dout, dlse, lse)
    return scaled_rows(dout, p), lse


def backward(p: Problem, out, lse, dout, dlse, plan: BwdPlan | None = None):
    """-> (dq, dk, dv) as jfa.triton.launch.backward, by plan, else by key-length class (jfa.hopper.config.
    bwd_classes: one plan, or a mixed batch's two, _backward_by_class): Delta, the dK/dV kernel with dQ by
    plan.dkdv.dq (REDUCE: reduce-added into float32; in broadcast mode into one slab of Lq rows, then cast), then
    the dQ pass unless plan.dq is None. NONE and DIRECT add nothing with atomics: the same bits run to run."""
    from .bwd import dkdv
    from .bwd_dq import dq_pass
    from .dq_reduce import dq_from_acc
    classes = bwd_classes(p) if plan is None else [(plan, None)]
    if len(classes) > 1:
        return _backward_by_class(p, out, lse, dout, dlse, classes)
    plan = classes[0][0]
    q, k = p.q, p.k
    batch, rows = p.batch, p.rows
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(p.v, memory_format=torch.contiguous_format)
    if batch == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    route = plan.dkdv.dq
    if route == DqRoute.REDUCE and p.broadcast:  # one slab of Lq rows that every CTA adds into
        batch, rows = 1, q.shape[0]
    dq_dtype = torch.float32 if p.broadcast or route == DqRoute.REDUCE else q.dtype
    dq = dq_buffer(p, (rows, p.heads, p.head_dim), dq_dtype, route == DqRoute.DIRECT and plan.dq is None)
    # no keys anywhere (a TMA descriptor needs rows: every query saw nothing), or no queries (no key was seen)
    if k.shape[0] == 0 or rows == 0:
        return sum_broadcast_dq(dq.zero_(), q, batch, p.broadcast), dk.zero_(), dv.zero_()
    dout, d = row_stats(p, out, lse, dout, dlse)
    dkdv(p, dout, lse, d, dk, dv, plan.dkdv, dq)
    if plan.dq is not None:
        dq_pass(p, dout, lse, d, dq, plan.dq, plan.skip_kv)
    if plan.dkdv.dq_xor:  # (its columns permuted by row: jfa.hopper.dq_reduce)
        return dq_from_acc(dq, None if p.broadcast else p.q_offsets, q.dtype, score_args(p)[2]), dk, dv
    return sum_broadcast_dq(dq, q, batch, p.broadcast), dk, dv


def _backward_by_class(p: Problem, out, lse, dout, dlse, classes):
    """A mixed batch's backward (not broadcast): each class's plan over its sequences (their key tiles and query
    tiles only), dQ into one zeroed buffer of q's dtype; a class that reduce-adds dQ does it into a zeroed float32
    buffer added in afterwards (its rows are the other class's zeros there, and the other class's rows are zeros in
    it: the sum is each row's own dQ)."""
    from .bwd import dkdv
    from .bwd_dq import dq_pass
    from .dq_reduce import dq_from_acc
    q, k = p.q, p.k
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(p.v, memory_format=torch.contiguous_format)
    dq = torch.zeros(p.rows, p.heads, p.head_dim, device=q.device, dtype=q.dtype)
    if k.shape[0] == 0 or p.rows == 0:
        return dq, dk.zero_(), dv.zero_()
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    dout, d = row_stats(p, out, lse, dout, dlse)
    for plan, kv_range in classes:
        if plan.dkdv.dq == DqRoute.REDUCE:
            acc = torch.zeros(dq.shape, device=q.device, dtype=torch.float32)
            dkdv(p, dout, lse, d, dk, dv, plan.dkdv, acc, kv_range)
            if plan.dkdv.dq_xor:
                dq_from_acc(acc, p.q_offsets, dq.dtype, score_args(p)[2], into=dq)
            else:
                dq.add_(acc)
        else:
            dkdv(p, dout, lse, d, dk, dv, plan.dkdv, dq, kv_range)
        if plan.dq is not None:
            dq_pass(p, dout, lse, d, dq, plan.dq, plan.skip_kv, kv_range)
    return dq, dk, dv


__all__ = ["supports", "forward", "backward", "row_stats", "HEAD_DIMS"]
