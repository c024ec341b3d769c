"""Portable Triton backward, FlashAttention-2 structure, deterministic (no atomics):

1. preprocess: Delta = rowsum(dO * O) - dLSE, float32 [Hq, rows] (dLSE is the gradient of the returned lse).
2. dK/dV pass, program (i_tile, i_hk): one key tile of one kv head; it loops over the GROUP query heads that
   read that kv head and over the query blocks that see the tile (common.query_blocks), so a GQA group is
   reduced in registers. Computed transposed (S^T = K Q^T) so no tile needs a transpose.
3. dQ pass, program (i_tile, i_h): one query tile, over the key blocks it sees (common.key_blocks).
   In broadcast mode it writes per-sequence float32 partials that the launcher sums over the batch.

With S = scale * Q K^T, P = exp(S - lse): dV = P^T dO, dP = dO V^T, dS = P * (dP - Delta),
dK = scale * dS^T Q, dQ = scale * dS K. The kernels work in base 2: qk_scale = scale * log2(e).
"""
import triton
import triton.language as tl

from .common import key_blocks, mma, query_blocks, sequence_bounds, visible

LOG2E: tl.constexpr = 1.4426950408889634


@triton.jit
def attention_bwd_preprocess_kernel(O, DO, DLSE, DELTA, rows, stride_ot, stride_oh, stride_dot, stride_doh,
                                    stride_lh, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
                                    HAS_DLSE: tl.constexpr):
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


@triton.jit
def _dkdv_blocks(dk, dv, b_k, b_v, Q, DO, LSE, DELTA, q_row0, o_row0, offs_n, offs_d, start, end,
                 q_len, kv_len, LEFT, RIGHT, qk_scale, stride_qt, stride_dot,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, DOT: tl.constexpr):
    m_d = offs_d < D
    for m0 in range(start, end, BLOCK_M):
        o_m = m0 + tl.arange(0, BLOCK_M)
        m_m = o_m < q_len
        p_qt = Q + (q_row0 + o_m)[None, :].to(tl.int64) * stride_qt + offs_d[:, None]
        b_qt = tl.load(p_qt, mask=m_d[:, None] & m_m[None, :], other=0.0)  # [BLOCK_D, BLOCK_M]
        p_do = DO + (o_row0 + o_m)[:, None].to(tl.int64) * stride_dot + offs_d[None, :]
        b_do = tl.load(p_do, mask=m_m[:, None] & m_d[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
        b_lse = tl.load(LSE + o_row0 + o_m, mask=m_m, other=0.0) * LOG2E
        b_lse = tl.where(b_lse == float("-inf"), float("inf"), b_lse)  # a row that sees nothing: P = 0
        b_delta = tl.load(DELTA + o_row0 + o_m, mask=m_m, other=0.0)
        b_pt = tl.exp2(mma(b_k, b_qt, DOT) * qk_scale - b_lse[None, :])  # [BLOCK_N, BLOCK_M]
        if MASKED:
            b_pt = tl.where(visible(o_m[None, :], offs_n[:, None], q_len, kv_len, LEFT, RIGHT), b_pt, 0.0)
        dv += mma(b_pt.to(b_do.dtype), b_do, DOT)
        b_dpt = mma(b_v, tl.trans(b_do), DOT)  # [BLOCK_N, BLOCK_M]
        b_dst = b_pt * (b_dpt - b_delta[None, :])
        dk += mma(b_dst.to(b_qt.dtype), tl.trans(b_qt), DOT)
    return dk, dv


@triton.jit
def attention_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, q_offsets, kv_offsets, tiles,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_lh,
    tile_capacity, scale, qk_scale, LEFT, RIGHT,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BROADCAST: tl.constexpr, DOT: tl.constexpr,
):
    i_tile = tl.program_id(0)
    i_hk = tl.program_id(1)
    seq = tl.load(tiles + i_tile)
    if seq < 0:
        return
    n0 = tl.load(tiles + tile_capacity + i_tile) * BLOCK_N
    q_start, q_len, kv_start, kv_len = sequence_bounds(q_offsets, kv_offsets, seq)
    q_row0 = 0 if BROADCAST else q_start

    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_kv = (offs_n < kv_len)[:, None] & (offs_d < D)[None, :]
    p_k = K + (kv_start + offs_n)[:, None].to(tl.int64) * stride_kt + i_hk * stride_kh + offs_d[None, :]
    p_v = V + (kv_start + offs_n)[:, None].to(tl.int64) * stride_vt + i_hk * stride_vh + offs_d[None, :]
    b_k = tl.load(p_k, mask=m_kv, other=0.0)  # [BLOCK_N, BLOCK_D]
    b_v = tl.load(p_v, mask=m_kv, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    lo, full_lo, full_hi, hi = query_blocks(n0, q_len, kv_len, LEFT, RIGHT, BLOCK_M, BLOCK_N)
    for g in range(GROUP):  # the query heads of this kv head's group, reduced here (no atomics)
        i_h = i_hk * GROUP + g
        Qh = Q + i_h * stride_qh
        DOh = DO + i_h * stride_doh
        LSEh = LSE + i_h * stride_lh
        DELTAh = DELTA + i_h * stride_lh
        dk, dv = _dkdv_blocks(dk, dv, b_k, b_v, Qh, DOh, LSEh, DELTAh, q_row0, q_start, offs_n, offs_d, lo,
                              full_lo, q_len, kv_len, LEFT, RIGHT, qk_scale, stride_qt, stride_dot,
                              D, BLOCK_M, True, DOT)
        dk, dv = _dkdv_blocks(dk, dv, b_k, b_v, Qh, DOh, LSEh, DELTAh, q_row0, q_start, offs_n, offs_d, full_lo,
                              full_hi, q_len, kv_len, LEFT, RIGHT, qk_scale, stride_qt, stride_dot,
                              D, BLOCK_M, False, DOT)
        dk, dv = _dkdv_blocks(dk, dv, b_k, b_v, Qh, DOh, LSEh, DELTAh, q_row0, q_start, offs_n, offs_d, full_hi,
                              hi, q_len, kv_len, LEFT, RIGHT, qk_scale, stride_qt, stride_dot,
                              D, BLOCK_M, True, DOT)

    p_dk = DK + (kv_start + offs_n)[:, None].to(tl.int64) * stride_dkt + i_hk * stride_dkh + offs_d[None, :]
    p_dv = DV + (kv_start + offs_n)[:, None].to(tl.int64) * stride_dvt + i_hk * stride_dvh + offs_d[None, :]
    tl.store(p_dk, (dk * scale).to(DK.dtype.element_ty), mask=m_kv)
    tl.store(p_dv, dv.to(DV.dtype.element_ty), mask=m_kv)


@triton.jit
def _dq_blocks(dq, b_q, b_do, b_lse, b_delta, K, V, kv_start, offs_m, offs_d, start, end, q_len, kv_len,
               LEFT, RIGHT, qk_scale, stride_kt, stride_vt,
               D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, DOT: tl.constexpr):
    m_d = offs_d < D
    for n0 in range(start, end, BLOCK_N):
        o_n = n0 + tl.arange(0, BLOCK_N)
        m_n = o_n < kv_len
        b_k = tl.load(K + (kv_start + o_n)[:, None].to(tl.int64) * stride_kt + offs_d[None, :],
                      mask=m_n[:, None] & m_d[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        b_vt = tl.load(V + (kv_start + o_n)[None, :].to(tl.int64) * stride_vt + offs_d[:, None],
                       mask=m_d[:, None] & m_n[None, :], other=0.0)  # [BLOCK_D, BLOCK_N]
        b_p = tl.exp2(mma(b_q, tl.trans(b_k), DOT) * qk_scale - b_lse[:, None])
        if MASKED:
            b_p = tl.where(visible(offs_m[:, None], o_n[None, :], q_len, kv_len, LEFT, RIGHT), b_p, 0.0)
        b_dp = mma(b_do, b_vt, DOT)  # [BLOCK_M, BLOCK_N]
        b_ds = b_p * (b_dp - b_delta[:, None])
        dq += mma(b_ds.to(b_k.dtype), b_k, DOT)
    return dq


@triton.jit
def attention_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, q_offsets, kv_offsets, tiles,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dqt, stride_dqh, stride_lh,
    tile_capacity, scale, qk_scale, LEFT, RIGHT,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BROADCAST: tl.constexpr, DOT: tl.constexpr,
):
    i_tile = tl.program_id(0)
    i_h = tl.program_id(1)
    seq = tl.load(tiles + i_tile)
    if seq < 0:
        return
    m0 = tl.load(tiles + tile_capacity + i_tile) * BLOCK_M
    q_start, q_len, kv_start, kv_len = sequence_bounds(q_offsets, kv_offsets, seq)
    q_row0 = 0 if BROADCAST else q_start

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_q = (offs_m < q_len)[:, None] & (offs_d < D)[None, :]
    b_q = tl.load(Q + (q_row0 + offs_m)[:, None].to(tl.int64) * stride_qt + i_h * stride_qh + offs_d[None, :],
                  mask=m_q, other=0.0)  # [BLOCK_M, BLOCK_D]
    b_do = tl.load(DO + (q_start + offs_m)[:, None].to(tl.int64) * stride_dot + i_h * stride_doh
                   + offs_d[None, :], mask=m_q, other=0.0)
    b_lse = tl.load(LSE + i_h * stride_lh + q_start + offs_m, mask=offs_m < q_len, other=0.0) * LOG2E
    b_lse = tl.where(b_lse == float("-inf"), float("inf"), b_lse)
    b_delta = tl.load(DELTA + i_h * stride_lh + q_start + offs_m, mask=offs_m < q_len, other=0.0)

    K += (i_h // GROUP) * stride_kh
    V += (i_h // GROUP) * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, full_lo, full_hi, hi = key_blocks(m0, q_len, kv_len, LEFT, RIGHT, BLOCK_M, BLOCK_N)
    dq = _dq_blocks(dq, b_q, b_do, b_lse, b_delta, K, V, kv_start, offs_m, offs_d, lo, full_lo, q_len, kv_len,
                    LEFT, RIGHT, qk_scale, stride_kt, stride_vt, D, BLOCK_N, True, DOT)
    dq = _dq_blocks(dq, b_q, b_do, b_lse, b_delta, K, V, kv_start, offs_m, offs_d, full_lo, full_hi, q_len,
                    kv_len, LEFT, RIGHT, qk_scale, stride_kt, stride_vt, D, BLOCK_N, False, DOT)
    dq = _dq_blocks(dq, b_q, b_do, b_lse, b_delta, K, V, kv_start, offs_m, offs_d, full_hi, hi, q_len, kv_len,
                    LEFT, RIGHT, qk_scale, stride_kt, stride_vt, D, BLOCK_N, True, DOT)
    # Broadcast: DQ is a float32 buffer of per-sequence partials (rows follow q_offsets), summed afterwards.
    p_dq = DQ + (q_start + offs_m)[:, None].to(tl.int64) * stride_dqt + i_h * stride_dqh + offs_d[None, :]
    tl.store(p_dq, (dq * scale).to(DQ.dtype.element_ty), mask=m_q)
