"""Portable Triton backward, FlashAttention-2 structure, deterministic (no atomics):

1. Delta = rowsum(dO * O) - dLSE, float32 [Hq, rows] (jfa.bwd_common; dLSE is the gradient of the returned lse).
2. dK/dV pass, program (i_tile, i_hk): one key tile of one kv head; it loops over the GROUP query heads that
   read that kv head and over the query blocks that see the tile (jfa.geometry.query_blocks), so a GQA group is
   reduced in registers. Computed transposed (S^T = K Q^T) so no tile needs a transpose.
3. dQ pass, program (i_tile, i_h): one query tile, over the key blocks it sees (jfa.geometry.key_blocks).
   In broadcast mode it writes per-sequence float32 partials that the launcher sums over the batch.

With S = scale * Q K^T, P = exp(S - lse): dV = P^T dO, dP = dO V^T, dS = P * (dP - Delta),
dK = scale * dS^T Q, dQ = scale * dS K. The kernels work in base 2: qk_scale = scale * log2(e). With an activation
f (ACT, jfa.variants) in softmax's place: qk_scale = scale, P = f(S), dS = f'(S) dP, no LSE, no Delta; a constant out
scale c arrives folded into the factors dK and dQ take (scale = scale * c) and dV's is scale / qk_scale.
"""
import triton
import triton.language as tl

from ...geometry import key_blocks, query_blocks, query_prefix, sequence_bounds, sequence_rule, visible
from ...variants import SOFTMAX, activation_grad, activation_with_grad, softmax_dscores, softmax_weights
from .common import mma

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _dkdv_blocks(dk, dv, b_k, b_v, p_qt, p_do, LSE, DELTA, offs_n, start, end, seq, rule, qk_scale,
                 BLOCK_M: tl.constexpr, MASKED: tl.constexpr, DOT: tl.constexpr, ACT: tl.constexpr,
                 FAST: tl.constexpr):
    """Query blocks [start, end) of one head: p_qt / p_do are block pointers at query 0 (advanced here);
    LSE / DELTA point at the head's row 0 of this sequence."""
    p_qt = tl.advance(p_qt, (0, start))
    p_do = tl.advance(p_do, (start, 0))
    for m0 in range(start, end, BLOCK_M):
        o_m = m0 + tl.arange(0, BLOCK_M)
        b_qt = tl.load(p_qt, boundary_check=(0, 1), padding_option="zero")  # [BLOCK_D, BLOCK_M]
        b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")  # [BLOCK_M, BLOCK_D]
        if ACT == SOFTMAX:
            b_lse = tl.load(LSE + o_m, mask=o_m < seq[0], other=0.0) * LOG2E
            b_lse = tl.where(b_lse == float("-inf"), float("inf"), b_lse)  # a row that sees nothing: P = 0
            b_delta = tl.load(DELTA + o_m, mask=o_m < seq[0], other=0.0)
            b_pt = softmax_weights(mma(b_k, b_qt, DOT), qk_scale, b_lse[None, :])  # [BLOCK_N, BLOCK_M]
            if MASKED:
                b_pt = tl.where(visible(o_m[None, :], offs_n[:, None], seq, rule), b_pt, 0.0)
            dv += mma(b_pt.to(b_do.dtype), b_do, DOT)
            b_dpt = mma(b_v, tl.trans(b_do), DOT)  # [BLOCK_N, BLOCK_M]
            b_dst = softmax_dscores(b_pt, b_dpt, b_delta[None, :])
        else:
            b_pt, b_dft = activation_with_grad(mma(b_k, b_qt, DOT) * qk_scale, ACT, FAST)  # [BLOCK_N, BLOCK_M]
            if MASKED:
                vis = visible(o_m[None, :], offs_n[:, None], seq, rule)
                b_pt = tl.where(vis, b_pt, 0.0)
                b_dft = tl.where(vis, b_dft, 0.0)
            dv += mma(b_pt.to(b_do.dtype), b_do, DOT)
            b_dst = b_dft * mma(b_v, tl.trans(b_do), DOT)
        dk += mma(b_dst.to(b_qt.dtype), tl.trans(b_qt), DOT)
        p_qt = tl.advance(p_qt, (0, BLOCK_M))
        p_do = tl.advance(p_do, (BLOCK_M, 0))
    return dk, dv


@triton.jit
def attention_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, q_offsets, kv_offsets, tiles,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_lh,
    tile_capacity, scale, qk_scale, LEFT, RIGHT, NUM_TARGETS, CONTEXT,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BROADCAST: tl.constexpr, DOT: tl.constexpr, ACT: tl.constexpr,
    FAST: tl.constexpr, TARGETS: tl.constexpr,
):
    i_tile = tl.program_id(0)
    i_hk = tl.program_id(1)
    seq = tl.load(tiles + i_tile)
    if seq < 0:
        return
    n0 = tl.load(tiles + tile_capacity + i_tile) * BLOCK_N
    q_start, kv_start, lens = sequence_bounds(q_offsets, kv_offsets, seq)
    q_len, kv_len = lens[0], lens[1]
    lens, rule = sequence_rule(seq, lens, LEFT, RIGHT, NUM_TARGETS, CONTEXT, TARGETS)
    Q_seq = Q if BROADCAST else Q + q_start.to(tl.int64) * stride_qt  # broadcast: the same dense q rows
    DO += q_start.to(tl.int64) * stride_dot
    LSE += q_start
    DELTA += q_start

    offs_n = n0 + tl.arange(0, BLOCK_N)
    kv_rows = kv_start.to(tl.int64)
    p_k = tl.make_block_ptr(K + kv_rows * stride_kt + i_hk * stride_kh, (kv_len, D), (stride_kt, 1), (n0, 0),
                            (BLOCK_N, BLOCK_D), (1, 0))
    p_v = tl.make_block_ptr(V + kv_rows * stride_vt + i_hk * stride_vh, (kv_len, D), (stride_vt, 1), (n0, 0),
                            (BLOCK_N, BLOCK_D), (1, 0))
    b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")  # [BLOCK_N, BLOCK_D]
    b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero")
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    lo, full_lo, full_hi, hi = query_blocks(n0, lens, rule, BLOCK_M, BLOCK_N)
    for g in range(GROUP):  # the query heads of this kv head's group, reduced here (no atomics)
        i_h = i_hk * GROUP + g
        p_qt = tl.make_block_ptr(Q_seq + i_h * stride_qh, (D, q_len), (1, stride_qt), (0, 0), (BLOCK_D, BLOCK_M),
                                 (0, 1))
        p_do = tl.make_block_ptr(DO + i_h * stride_doh, (q_len, D), (stride_dot, 1), (0, 0), (BLOCK_M, BLOCK_D),
                                 (1, 0))
        LSEh = LSE + i_h * stride_lh
        DELTAh = DELTA + i_h * stride_lh
        if TARGETS:  # HSTU's mask: the context rows before the tile's queries (jfa.geometry.query_prefix)
            dk, dv = _dkdv_blocks(dk, dv, b_k, b_v, p_qt, p_do, LSEh, DELTAh, offs_n, 0,
                                  query_prefix(n0, lens, rule, BLOCK_M, BLOCK_N), lens, rule, qk_scale, BLOCK_M,
                                  True, DOT, ACT, FAST)
        dk, dv = _dkdv_blocks(dk, dv, b_k, b_v, p_qt, p_do, LSEh, DELTAh, offs_n, lo, full_lo, lens, rule,
                              qk_scale, BLOCK_M, True, DOT, ACT, FAST)
        dk, dv = _dkdv_blocks(dk, dv, b_k, b_v, p_qt, p_do, LSEh, DELTAh, offs_n, full_lo, full_hi, lens, rule,
                              qk_scale, BLOCK_M, False, DOT, ACT, FAST)
        dk, dv = _dkdv_blocks(dk, dv, b_k, b_v, p_qt, p_do, LSEh, DELTAh, offs_n, full_hi, hi, lens, rule,
                              qk_scale, BLOCK_M, True, DOT, ACT, FAST)

    p_dk = tl.make_block_ptr(DK + kv_rows * stride_dkt + i_hk * stride_dkh, (kv_len, D), (stride_dkt, 1), (n0, 0),
                             (BLOCK_N, BLOCK_D), (1, 0))
    p_dv = tl.make_block_ptr(DV + kv_rows * stride_dvt + i_hk * stride_dvh, (kv_len, D), (stride_dvt, 1), (n0, 0),
                             (BLOCK_N, BLOCK_D), (1, 0))
    tl.store(p_dk, (dk * scale).to(DK.dtype.element_ty), boundary_check=(0, 1))
    if ACT != SOFTMAX:  # the out scale (see module doc)
        dv = dv * (scale / qk_scale)
    tl.store(p_dv, dv.to(DV.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def _dq_blocks(dq, b_q, b_do, b_lse, b_delta, p_k, p_vt, offs_m, start, end, seq, rule, qk_scale,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, DOT: tl.constexpr, ACT: tl.constexpr,
               FAST: tl.constexpr):
    """Key blocks [start, end): p_k / p_vt are block pointers at the sequence's key 0 (advanced here)."""
    p_k = tl.advance(p_k, (start, 0))
    p_vt = tl.advance(p_vt, (0, start))
    for n0 in range(start, end, BLOCK_N):
        b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")  # [BLOCK_N, BLOCK_D]
        b_vt = tl.load(p_vt, boundary_check=(0, 1), padding_option="zero")  # [BLOCK_D, BLOCK_N]
        if ACT == SOFTMAX:
            b_p = softmax_weights(mma(b_q, tl.trans(b_k), DOT), qk_scale, b_lse[:, None])  # [BLOCK_M, BLOCK_N]
            if MASKED:
                o_n = n0 + tl.arange(0, BLOCK_N)
                b_p = tl.where(visible(offs_m[:, None], o_n[None, :], seq, rule), b_p, 0.0)
            b_dp = mma(b_do, b_vt, DOT)  # [BLOCK_M, BLOCK_N]
            b_ds = softmax_dscores(b_p, b_dp, b_delta[:, None])
        else:  # (dQ needs no P)
            b_ds = activation_grad(mma(b_q, tl.trans(b_k), DOT) * qk_scale, ACT, FAST) * mma(b_do, b_vt, DOT)
            if MASKED:
                o_n = n0 + tl.arange(0, BLOCK_N)
                b_ds = tl.where(visible(offs_m[:, None], o_n[None, :], seq, rule), b_ds, 0.0)
        dq += mma(b_ds.to(b_k.dtype), b_k, DOT)
        p_k = tl.advance(p_k, (BLOCK_N, 0))
        p_vt = tl.advance(p_vt, (0, BLOCK_N))
    return dq


@triton.jit
def attention_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, q_offsets, kv_offsets, tiles,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dqt, stride_dqh, stride_lh,
    tile_capacity, scale, qk_scale, LEFT, RIGHT, NUM_TARGETS, CONTEXT,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BROADCAST: tl.constexpr, DOT: tl.constexpr, ACT: tl.constexpr,
    FAST: tl.constexpr, TARGETS: tl.constexpr,
):
    i_tile = tl.program_id(0)
    i_h = tl.program_id(1)
    seq = tl.load(tiles + i_tile)
    if seq < 0:
        return
    m0 = tl.load(tiles + tile_capacity + i_tile) * BLOCK_M
    q_start, kv_start, lens = sequence_bounds(q_offsets, kv_offsets, seq)
    q_len, kv_len = lens[0], lens[1]
    lens, rule = sequence_rule(seq, lens, LEFT, RIGHT, NUM_TARGETS, CONTEXT, TARGETS)
    Q_seq = Q if BROADCAST else Q + q_start.to(tl.int64) * stride_qt  # broadcast: the same dense q rows
    q_rows, kv_rows, i_hk = q_start.to(tl.int64), kv_start.to(tl.int64), i_h // GROUP

    offs_m = m0 + tl.arange(0, BLOCK_M)
    p_q = tl.make_block_ptr(Q_seq + i_h * stride_qh, (q_len, D), (stride_qt, 1), (m0, 0), (BLOCK_M, BLOCK_D),
                            (1, 0))
    p_do = tl.make_block_ptr(DO + q_rows * stride_dot + i_h * stride_doh, (q_len, D), (stride_dot, 1), (m0, 0),
                             (BLOCK_M, BLOCK_D), (1, 0))
    b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")  # [BLOCK_M, BLOCK_D]
    b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
    if ACT == SOFTMAX:
        b_lse = tl.load(LSE + i_h * stride_lh + q_start + offs_m, mask=offs_m < q_len, other=0.0) * LOG2E
        b_lse = tl.where(b_lse == float("-inf"), float("inf"), b_lse)
        b_delta = tl.load(DELTA + i_h * stride_lh + q_start + offs_m, mask=offs_m < q_len, other=0.0)
    else:  # (no LSE, no Delta)
        b_lse = tl.zeros([BLOCK_M], dtype=tl.float32)
        b_delta = b_lse
    p_k = tl.make_block_ptr(K + kv_rows * stride_kt + i_hk * stride_kh, (kv_len, D), (stride_kt, 1), (0, 0),
                            (BLOCK_N, BLOCK_D), (1, 0))
    p_vt = tl.make_block_ptr(V + kv_rows * stride_vt + i_hk * stride_vh, (D, kv_len), (1, stride_vt), (0, 0),
                             (BLOCK_D, BLOCK_N), (0, 1))

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, full_lo, full_hi, hi = key_blocks(m0, lens, rule, BLOCK_M, BLOCK_N)
    dq = _dq_blocks(dq, b_q, b_do, b_lse, b_delta, p_k, p_vt, offs_m, lo, full_lo, lens, rule, qk_scale, BLOCK_N,
                    True, DOT, ACT, FAST)
    dq = _dq_blocks(dq, b_q, b_do, b_lse, b_delta, p_k, p_vt, offs_m, full_lo, full_hi, lens, rule, qk_scale,
                    BLOCK_N, False, DOT, ACT, FAST)
    dq = _dq_blocks(dq, b_q, b_do, b_lse, b_delta, p_k, p_vt, offs_m, full_hi, hi, lens, rule, qk_scale, BLOCK_N,
                    True, DOT, ACT, FAST)
    # Broadcast: DQ is a float32 buffer of per-sequence partials (rows follow q_offsets), summed afterwards.
    p_dq = tl.make_block_ptr(DQ + q_rows * stride_dqt + i_h * stride_dqh, (q_len, D), (stride_dqt, 1), (m0, 0),
                             (BLOCK_M, BLOCK_D), (1, 0))
    tl.store(p_dq, (dq * scale).to(DQ.dtype.element_ty), boundary_check=(0, 1))
