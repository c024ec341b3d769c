"""Portable Triton forward: FlashAttention-2 over a flat table of real (sequence, query tile) pairs.

Program (i_tile, i_h): query tile tiles[1][i_tile] of sequence tiles[0][i_tile], head i_h. It walks the key
blocks its rows can see (jfa.geometry.key_blocks) in three loops: masked head, branch-free bulk, masked tail.
The score step is jfa.variants' (ACT): online softmax in base 2 (qk_scale = scale * log2(e)), the natural-log LSE
saved for the backward; or an activation (qk_scale = scale), the output times out_scale, no LSE.
In broadcast mode every sequence reads the same dense q rows [0, Lq); output rows follow q_offsets.
"""
import triton
import triton.language as tl

from ...geometry import key_blocks, sequence_bounds, sequence_rule, visible
from ...variants import SOFTMAX, activation, online_softmax, softmax_lse
from .common import mma


@triton.jit
def _fwd_blocks(acc, l_i, m_i, b_q, K, V, offs_m, offs_d, start, end, seq, rule, qk_scale, stride_kt, stride_vt,
                D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, DOT: tl.constexpr, ACT: tl.constexpr,
                FAST: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    m_d = offs_d < D
    for n0 in range(start, end, BLOCK_N):
        o_n = n0 + offs_n
        m_n = o_n < seq[1]
        p_k = K + o_n[None, :] * stride_kt + offs_d[:, None]
        b_kt = tl.load(p_k, mask=m_d[:, None] & m_n[None, :], other=0.0)  # [BLOCK_D, BLOCK_N]
        b_s = mma(b_q, b_kt, DOT) * qk_scale  # [BLOCK_M, BLOCK_N], base-2 logits with softmax
        if ACT == SOFTMAX:
            if MASKED:
                b_s = tl.where(visible(offs_m[:, None], o_n[None, :], seq, rule), b_s, float("-inf"))
            b_p, m_new, alpha = online_softmax(b_s, m_i, 1.0, MASKED)  # (rows that saw nothing: masked blocks)
            l_i = l_i * alpha + tl.sum(b_p, 1)
            p_v = V + o_n[:, None] * stride_vt + offs_d[None, :]
            b_v = tl.load(p_v, mask=m_n[:, None] & m_d[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
            acc = acc * alpha[:, None] + mma(b_p.to(b_v.dtype), b_v, DOT)
            m_i = m_new
        else:
            b_p = activation(b_s, ACT, FAST)
            if MASKED:
                b_p = tl.where(visible(offs_m[:, None], o_n[None, :], seq, rule), b_p, 0.0)
            p_v = V + o_n[:, None] * stride_vt + offs_d[None, :]
            b_v = tl.load(p_v, mask=m_n[:, None] & m_d[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
            acc += mma(b_p.to(b_v.dtype), b_v, DOT)
    return acc, l_i, m_i


@triton.jit
def _fwd_tile(Q, K, V, O, LSE, q_offsets, kv_offsets, seq, m0, i_h,
              stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_lh,
              qk_scale, out_scale, LEFT, RIGHT, NUM_TARGETS, CONTEXT, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BROADCAST: tl.constexpr, DOT: tl.constexpr,
              ACT: tl.constexpr, FAST: tl.constexpr, TARGETS: tl.constexpr):
    """Query rows [m0, m0 + BLOCK_M) of sequence `seq`, head i_h: output and (softmax) lse."""
    q_start, kv_start, lens = sequence_bounds(q_offsets, kv_offsets, seq)
    q_len = lens[0]
    lens, rule = sequence_rule(seq, lens, LEFT, RIGHT, NUM_TARGETS, CONTEXT, TARGETS)
    Q += i_h * stride_qh
    if not BROADCAST:  # broadcast: every sequence reads the same dense q rows
        Q += q_start.to(tl.int64) * stride_qt
    K += kv_start.to(tl.int64) * stride_kt + (i_h // GROUP) * stride_kh
    V += kv_start.to(tl.int64) * stride_vt + (i_h // GROUP) * stride_vh

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_m = offs_m < q_len
    m_d = offs_d < D
    p_q = Q + offs_m[:, None] * stride_qt + offs_d[None, :]
    b_q = tl.load(p_q, mask=m_m[:, None] & m_d[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    lo, full_lo, full_hi, hi = key_blocks(m0, lens, rule, BLOCK_M, BLOCK_N)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, b_q, K, V, offs_m, offs_d, lo, full_lo, lens, rule, qk_scale,
                                stride_kt, stride_vt, D, BLOCK_N, True, DOT, ACT, FAST)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, b_q, K, V, offs_m, offs_d, full_lo, full_hi, lens, rule, qk_scale,
                                stride_kt, stride_vt, D, BLOCK_N, False, DOT, ACT, FAST)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, b_q, K, V, offs_m, offs_d, full_hi, hi, lens, rule, qk_scale,
                                stride_kt, stride_vt, D, BLOCK_N, True, DOT, ACT, FAST)

    if ACT == SOFTMAX:  # a row that saw no key: output 0, lse -inf
        seen = l_i > 0.0
        b_o = acc / tl.where(seen, l_i, 1.0)[:, None]
        b_lse = softmax_lse(m_i, l_i, 1.0)
    else:
        b_o = acc * out_scale
    p_o = O + q_start.to(tl.int64) * stride_ot + i_h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :]
    tl.store(p_o, b_o.to(O.dtype.element_ty), mask=m_m[:, None] & m_d[None, :])
    if ACT == SOFTMAX:
        tl.store(LSE + i_h * stride_lh + q_start + offs_m, b_lse, mask=m_m)


@triton.jit
def attention_fwd_kernel(
    Q, K, V, O, LSE, q_offsets, kv_offsets, tiles,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_lh,
    tile_capacity, qk_scale, out_scale, LEFT, RIGHT, NUM_TARGETS, CONTEXT,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BROADCAST: tl.constexpr, DOT: tl.constexpr, ACT: tl.constexpr,
    FAST: tl.constexpr, TARGETS: tl.constexpr,
):
    """One program per (tile of the tile table, head)."""
    i_tile = tl.program_id(0)
    i_h = tl.program_id(1)
    seq = tl.load(tiles + i_tile)
    if seq >= 0:  # else an unused slot of the tile table
        m0 = tl.load(tiles + tile_capacity + i_tile) * BLOCK_M
        _fwd_tile(Q, K, V, O, LSE, q_offsets, kv_offsets, seq, m0, i_h, stride_qt, stride_qh, stride_kt,
                  stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_lh, qk_scale, out_scale, LEFT,
                  RIGHT, NUM_TARGETS, CONTEXT, GROUP, D, BLOCK_D, BLOCK_M, BLOCK_N, BROADCAST, DOT, ACT, FAST, TARGETS)

