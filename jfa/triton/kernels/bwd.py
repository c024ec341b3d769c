"""Portable Triton backward, FlashAttention-2 structure, deterministic (no atomics):

1. Delta = rowsum(dO * O) - dLSE, float32 [Hq, rows] (jfa.bwd_common; dLSE is the gradient of the returned lse).
2. dK/dV pass, program (i_tile, i_hk): one key tile of one kv head; it loops over the GROUP query heads that
   read that kv head and over the query blocks that see the tile (jfa.geometry: query_prefix's, then
   query_blocks'), so a GQA group is reduced in registers. Computed transposed (S^T = K Q^T) so no tile needs a
   transpose.
3. dQ pass, program (i_tile, i_h): one query tile, over the key blocks it sees (jfa.geometry.key_blocks).
   In broadcast mode it writes per-sequence float32 partials that the launcher sums over the batch.

With S = scale * Q K^T, P = exp(S - lse): dV = P^T dO, dP = dO V^T, dS = P * (dP - Delta),
dK = scale * dS^T Q, dQ = scale * dS K, in base 2 (qk_scale = scale * log2(e)); with an activation f in softmax's
place, P = f(S), dS = f'(S) dP, no LSE, no Delta: jfa.variants' score policy (SCORE) says which, and its
grad_scale and dv_factor carry the out scale. Arguments as jfa.triton.kernels.fwd's; rows = (LSE, DELTA, head
stride), read where the score has them (variants.has_lse).
"""
import triton
import triton.language as tl

from ... import bias as rel
from ... import variants
from ...geometry import key_blocks, query_blocks, query_prefix, visible
from .common import mma, tile_of


@triton.jit
def _row_stats(rows, offs, in_rows):
    """(log2(e) LSE, Delta) of rows offs of rows = (LSE, DELTA) (where the score has them: variants.has_lse). A row
    that saw no key has LSE -inf: +inf, so its P is 0. (Callers start from None for a score without them: a Triton
    function cannot return None.)"""
    b_lse = tl.load(rows[0] + offs, mask=in_rows, other=0.0) * variants.LOG2E
    b_lse = tl.where(b_lse == float("-inf"), float("inf"), b_lse)
    return b_lse, tl.load(rows[1] + offs, mask=in_rows, other=0.0)


@triton.jit
def _dkdv_blocks(dk, dv, b_k, b_v, qdo, rows, offs_n, start, end, seq, rule, score, bias, at, FORM: tl.constexpr,
                 MASKED: tl.constexpr, SCORE: tl.constexpr):
    """Query blocks [start, end) of one head into (dk, dv): qdo = (Q^T, dO) block pointers at query 0 (advanced
    here); rows = (LSE, DELTA) at the head's row 0 of this sequence; bias, at: as jfa.triton.kernels.fwd's."""
    FAST: tl.constexpr = FORM.fast
    p_qt = tl.advance(qdo[0], (0, start))
    p_do = tl.advance(qdo[1], (start, 0))
    for m0 in range(start, end, FORM.block_m):
        o_m = m0 + tl.arange(0, FORM.block_m)
        b_qt = tl.load(p_qt, boundary_check=(0, 1), padding_option="zero")  # [BLOCK_D, BLOCK_M]
        b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")  # [BLOCK_M, BLOCK_D]
        b_lse, b_delta = None, None  # the rows' statistics, broadcast along the keys, where the score has them
        if variants.has_lse(SCORE):
            b_lse, b_delta = _row_stats(rows, o_m, o_m < seq[0])
            b_lse, b_delta = b_lse[None, :], b_delta[None, :]
        b_st = mma(b_k, b_qt, FORM)  # [BLOCK_N, BLOCK_M]
        if bias is not None:
            pairs = (o_m[None, :] + (seq[1] - seq[0]), offs_n[:, None], at[1] + o_m[None, :], at[2] + offs_n[:, None],
                     (o_m < seq[0])[None, :], (offs_n < seq[1])[:, None])  # (transposed: keys first)
            b_st += rel.block(bias, at[0], pairs, FAST)
        b_pt, b_gt = variants.bwd_weights(b_st, b_lse, score, SCORE, FAST)
        if MASKED:
            b_pt, b_gt = variants.mask_grads(b_pt, b_gt, visible(o_m[None, :], offs_n[:, None], seq, rule), SCORE)
        dv += mma(b_pt.to(b_do.dtype), b_do, FORM)
        b_dst = variants.dscores(b_pt, mma(b_v, tl.trans(b_do), FORM), b_gt, b_delta, SCORE)
        dk += mma(b_dst.to(b_qt.dtype), tl.trans(b_qt), FORM)
        p_qt = tl.advance(p_qt, (0, FORM.block_m))
        p_do = tl.advance(p_do, (FORM.block_m, 0))
    return dk, dv


@triton.jit
def attention_bwd_dkdv_kernel(q, k, v, do, rows, dk, dv, offsets, tiles, score, mask, bias, FORM: tl.constexpr,
                              SCORE: tl.constexpr):
    """Key rows [n0, n0 + BLOCK_N) of one sequence and kv head: their dK and dV."""
    i_tile = tl.program_id(0)
    i_hk = tl.program_id(1)
    seq_id = tl.load(tiles[0] + i_tile)
    if seq_id < 0:
        return
    BLOCK_N: tl.constexpr = FORM.block_n
    BLOCK_D: tl.constexpr = FORM.block_d
    n0, q_start, kv_start, lens, rule, seq = tile_of(seq_id, tiles, offsets, mask, BLOCK_N)
    q_len, kv_len = lens[0], lens[1]
    Q_seq = q[0] if FORM.broadcast else q[0] + q_start.to(tl.int64) * q[1]  # broadcast: the same dense q rows
    DO = do[0] + q_start.to(tl.int64) * do[1]

    offs_n = n0 + tl.arange(0, FORM.block_n)
    kv_rows = kv_start.to(tl.int64)
    p_k = tl.make_block_ptr(k[0] + kv_rows * k[1] + i_hk * k[2], (kv_len, FORM.head_dim), (k[1], 1), (n0, 0),
                            (FORM.block_n, FORM.block_d), (1, 0))
    p_v = tl.make_block_ptr(v[0] + kv_rows * v[1] + i_hk * v[2], (kv_len, FORM.head_dim), (v[1], 1), (n0, 0),
                            (FORM.block_n, FORM.block_d), (1, 0))
    b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")  # [BLOCK_N, BLOCK_D]
    b_v = tl.load(p_v, boundary_check=(0, 1), padding_option="zero")
    b_dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    b_dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # the tile's walk: the prefix (HSTU's context rows; none for a window), then masked head, bulk, masked tail
    pre = query_prefix(n0, seq, rule, FORM.block_m, FORM.block_n)
    lo, full_lo, full_hi, hi = query_blocks(n0, seq, rule, FORM.block_m, FORM.block_n)
    for g in range(FORM.group):  # the query heads of this kv head's group, reduced here (no atomics)
        i_h = i_hk * FORM.group + g
        qdo = (tl.make_block_ptr(Q_seq + i_h * q[2], (FORM.head_dim, q_len), (1, q[1]), (0, 0),
                                 (FORM.block_d, FORM.block_m), (0, 1)),
               tl.make_block_ptr(DO + i_h * do[2], (q_len, FORM.head_dim), (do[1], 1), (0, 0),
                                 (FORM.block_m, FORM.block_d), (1, 0)))
        rows_h = (rows[0] + q_start + i_h * rows[2], rows[1] + q_start + i_h * rows[2])
        for part in tl.static_range(4):  # (MASKED: every part but the bulk)
            start = 0 if part == 0 else (lo if part == 1 else (full_lo if part == 2 else full_hi))
            end = pre if part == 0 else (full_lo if part == 1 else (full_hi if part == 2 else hi))
            b_dk, b_dv = _dkdv_blocks(b_dk, b_dv, b_k, b_v, qdo, rows_h, offs_n, start, end, seq, rule, score, bias,
                                      (i_h, q_start, kv_start), FORM, part != 2, SCORE)

    p_dk = tl.make_block_ptr(dk[0] + kv_rows * dk[1] + i_hk * dk[2], (kv_len, FORM.head_dim), (dk[1], 1), (n0, 0),
                             (FORM.block_n, FORM.block_d), (1, 0))
    p_dv = tl.make_block_ptr(dv[0] + kv_rows * dv[1] + i_hk * dv[2], (kv_len, FORM.head_dim), (dv[1], 1), (n0, 0),
                             (FORM.block_n, FORM.block_d), (1, 0))
    tl.store(p_dk, (b_dk * score[2]).to(dk[0].dtype.element_ty), boundary_check=(0, 1))
    tl.store(p_dv, (b_dv * variants.dv_factor(score, SCORE)).to(dv[0].dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def _dq_blocks(dq, b_q, b_do, stats, kv, offs_m, start, end, seq, rule, score, bias, at, FORM: tl.constexpr,
               MASKED: tl.constexpr, SCORE: tl.constexpr):
    """Key blocks [start, end) into dq: kv = (K, V^T) block pointers at the sequence's key 0 (advanced here);
    stats = the rows' (log2(e) LSE, Delta), broadcast along the keys (None with an activation); bias, at: as
    jfa.triton.kernels.fwd's, and the bias tables' gradients summed here."""
    FAST: tl.constexpr = FORM.fast
    p_k = tl.advance(kv[0], (start, 0))
    p_vt = tl.advance(kv[1], (0, start))
    for n0 in range(start, end, FORM.block_n):
        b_k = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")  # [BLOCK_N, BLOCK_D]
        b_vt = tl.load(p_vt, boundary_check=(0, 1), padding_option="zero")  # [BLOCK_D, BLOCK_N]
        b_s = mma(b_q, tl.trans(b_k), FORM)  # [BLOCK_M, BLOCK_N]
        if bias is not None:
            o_n = n0 + tl.arange(0, FORM.block_n)
            pairs = (offs_m[:, None] + (seq[1] - seq[0]), o_n[None, :], at[1] + offs_m[:, None], at[2] + o_n[None, :],
                     (offs_m < seq[0])[:, None], (o_n < seq[1])[None, :])
            b_s += rel.block(bias, at[0], pairs, FAST)
        b_p, b_g = variants.bwd_weights(b_s, stats[0], score, SCORE, FAST)
        if MASKED:
            o_n = n0 + tl.arange(0, FORM.block_n)
            b_p, b_g = variants.mask_grads(b_p, b_g, visible(offs_m[:, None], o_n[None, :], seq, rule), SCORE)
        b_ds = variants.dscores(b_p, mma(b_do, b_vt, FORM), b_g, stats[1], SCORE)  # (an activation: no P)
        if bias is not None:  # dL/dscore: dS, times an activation's constant out scale
            rel.add_grads(bias, at[0], pairs, b_ds * variants.out_scale(score, SCORE), FAST)
        dq += mma(b_ds.to(b_k.dtype), b_k, FORM)
        p_k = tl.advance(p_k, (FORM.block_n, 0))
        p_vt = tl.advance(p_vt, (0, FORM.block_n))
    return dq


@triton.jit
def attention_bwd_dq_kernel(q, k, v, do, rows, dq, offsets, tiles, score, mask, bias, FORM: tl.constexpr,
                            SCORE: tl.constexpr):
    """Query rows [m0, m0 + BLOCK_M) of one sequence and head: their dQ (in broadcast mode a float32 partial)."""
    i_tile = tl.program_id(0)
    i_h = tl.program_id(1)
    seq_id = tl.load(tiles[0] + i_tile)
    if seq_id < 0:
        return
    BLOCK_M: tl.constexpr = FORM.block_m
    BLOCK_D: tl.constexpr = FORM.block_d
    m0, q_start, kv_start, lens, rule, seq = tile_of(seq_id, tiles, offsets, mask, BLOCK_M)
    q_len, kv_len = lens[0], lens[1]
    Q_seq = q[0] if FORM.broadcast else q[0] + q_start.to(tl.int64) * q[1]  # broadcast: the same dense q rows
    q_rows, kv_rows, i_hk = q_start.to(tl.int64), kv_start.to(tl.int64), i_h // FORM.group

    offs_m = m0 + tl.arange(0, FORM.block_m)
    p_q = tl.make_block_ptr(Q_seq + i_h * q[2], (q_len, FORM.head_dim), (q[1], 1), (m0, 0),
                            (FORM.block_m, FORM.block_d), (1, 0))
    p_do = tl.make_block_ptr(do[0] + q_rows * do[1] + i_h * do[2], (q_len, FORM.head_dim), (do[1], 1), (m0, 0),
                             (FORM.block_m, FORM.block_d), (1, 0))
    b_q = tl.load(p_q, boundary_check=(0, 1), padding_option="zero")  # [BLOCK_M, BLOCK_D]
    b_do = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
    stats = (None, None)  # the rows' statistics, broadcast along the keys, where the score has them
    if variants.has_lse(SCORE):
        b_lse, b_delta = _row_stats((rows[0] + i_h * rows[2] + q_start, rows[1] + i_h * rows[2] + q_start), offs_m,
                                    offs_m < q_len)
        stats = (b_lse[:, None], b_delta[:, None])
    kv = (tl.make_block_ptr(k[0] + kv_rows * k[1] + i_hk * k[2], (kv_len, FORM.head_dim), (k[1], 1), (0, 0),
                            (FORM.block_n, FORM.block_d), (1, 0)),
          tl.make_block_ptr(v[0] + kv_rows * v[1] + i_hk * v[2], (FORM.head_dim, kv_len), (1, v[1]), (0, 0),
                            (FORM.block_d, FORM.block_n), (0, 1)))

    b_dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, full_lo, full_hi, hi = key_blocks(m0, seq, rule, FORM.block_m, FORM.block_n)
    at = (i_h, q_start, kv_start)
    b_dq = _dq_blocks(b_dq, b_q, b_do, stats, kv, offs_m, lo, full_lo, seq, rule, score, bias, at, FORM,
                      True, SCORE)
    b_dq = _dq_blocks(b_dq, b_q, b_do, stats, kv, offs_m, full_lo, full_hi, seq, rule, score, bias, at, FORM,
                      False, SCORE)
    b_dq = _dq_blocks(b_dq, b_q, b_do, stats, kv, offs_m, full_hi, hi, seq, rule, score, bias, at, FORM,
                      True, SCORE)
    # Broadcast: dq is a float32 buffer of per-sequence partials (rows follow q_offsets), summed afterwards.
    p_dq = tl.make_block_ptr(dq[0] + q_rows * dq[1] + i_h * dq[2], (q_len, FORM.head_dim), (dq[1], 1), (m0, 0),
                             (FORM.block_m, FORM.block_d), (1, 0))
    tl.store(p_dq, (b_dq * score[2]).to(dq[0].dtype.element_ty), boundary_check=(0, 1))
