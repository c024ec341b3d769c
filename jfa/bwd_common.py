"""The backward's steps outside the attention kernels, shared by both kernel backends (jfa.triton, jfa.hopper):
Delta before them (a small Triton kernel), broadcast q's dQ sum after them, and how an activation's out scale
reaches them (a per-row factor of dO; a constant one is the kernels' business, jfa.variants.score_args)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .problem import Problem
from .runtime import launch


@triton.jit
def attention_bwd_preprocess_kernel(O, DO, DLSE, DELTA, rows, stride_ot, stride_oh, stride_dot, stride_doh,
                                    stride_lh, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
                                    HAS_DLSE: tl.constexpr):
    """Delta = rowsum(dO * O) - dLSE for BLOCK_T rows of head program_id(1)."""
    i_t = tl.program_id(0)
    i_h = tl.program_id(1)
    o_t = i_t * BLOCK_T + tl.arange(0, BLOCK_T)
    o_d = tl.arange(0, BLOCK_D)
    m = (o_t < rows)[:, None] & (o_d < D)[None, :]
    b_o = tl.load(O + o_t[:, None].to(tl.int64) * stride_ot + i_h * stride_oh + o_d[None, :], mask=m, other=0.0)
    b_do = tl.load(DO + o_t[:, None].to(tl.int64) * stride_dot + i_h * stride_doh + o_d[None, :], mask=m,
                   other=0.0)
    b_delta = tl.sum(b_o.to(tl.float32) * b_do.to(tl.float32), 1)  # [BLOCK_T]
    if HAS_DLSE:
        b_delta -= tl.load(DLSE + i_h * stride_lh + o_t, mask=o_t < rows, other=0.0)
    tl.store(DELTA + i_h * stride_lh + o_t, b_delta, mask=o_t < rows)


def block_d(head_dim: int) -> int:
    """The head dim padded to what tl.arange takes (plain integer arithmetic: triton.next_power_of_2 is a
    constexpr_function, ~1.2 us a call from the host)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def delta(out, dout, dlse, lse):
    """Delta = rowsum(dO * O) - dLSE, float32 [Hq, rows], dLSE the gradient of the returned lse (or None)."""
    rows, hq, head_dim = out.shape
    result = torch.empty_like(lse)
    dlse = None if dlse is None else dlse.contiguous()  # read with lse's strides
    if rows > 0:
        block_t = 64 if out.device.type == "cuda" else 16
        launch(attention_bwd_preprocess_kernel, ((rows + block_t - 1) // block_t, hq),
               out, dout, dlse if dlse is not None else lse, result, rows,
               out.stride(0), out.stride(1), dout.stride(0), dout.stride(1), lse.stride(0),
               D=head_dim, BLOCK_D=block_d(head_dim), BLOCK_T=block_t, HAS_DLSE=dlse is not None)
    return result


@triton.jit
def zero_keyless_rows_kernel(X, q_offsets, kv_offsets, row_elems, BLOCK: tl.constexpr):
    """Zero X's rows of sequence program_id(0) (row_elems elements a row) if it has no key, else nothing."""
    b = tl.program_id(0)
    start = tl.load(q_offsets + b).to(tl.int64) * row_elems
    keyless = tl.load(kv_offsets + b + 1) == tl.load(kv_offsets + b)
    end = tl.where(keyless, tl.load(q_offsets + b + 1).to(tl.int64) * row_elems, start)
    offs = tl.arange(0, BLOCK)
    for i in range(start, end, BLOCK):
        tl.store(X + i + offs, tl.zeros([BLOCK], X.dtype.element_ty), mask=i + offs < end)


def zero_keyless_rows(x, q_offsets, kv_offsets):
    """Zero x's rows ([rows, ...], contiguous) of the sequences with no key: one small program a sequence, no host
    sync; the other rows untouched."""
    batch = q_offsets.shape[0] - 1
    if batch > 0 and x.numel() > 0:
        launch(zero_keyless_rows_kernel, (batch, ), x, q_offsets, kv_offsets, x[0].numel(), BLOCK=1024)
    return x


def sum_broadcast_dq(dq, q, batch: int, broadcast: bool):
    """dq in q's dtype: in broadcast mode the float32 partials [batch * Lq, Hq, D] summed over their batch (a
    fixed order: deterministic); one partial (broadcast q's one pass: jfa.hopper.dq_reduce's one slab) is
    only cast."""
    if broadcast and batch != 1:
        dq = dq.view(batch, q.shape[0], q.shape[1], q.shape[2]).sum(0)
    return dq.to(q.dtype)


def scaled_rows(x, p: Problem):
    """x [rows, Hq, D] times the rows' out scale where it is per row (an activation's row_scale), else x."""
    return x if p.row_scale is None else (x.float() * p.row_scale.view(-1, 1, 1)).to(x.dtype)
