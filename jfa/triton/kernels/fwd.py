"""Portable Triton forward: FlashAttention-2 over a flat table of real (sequence, query tile) pairs.

Program (i_tile, i_h): query tile tiles[1][i_tile] of sequence tiles[0][i_tile], head i_h. It walks the key
blocks its rows can see (jfa.geometry.key_blocks) in three loops: masked head, branch-free bulk, masked tail.
The score step is jfa.variants' (SCORE): online softmax in base 2 (qk_scale = scale * log2(e)), the natural-log
LSE saved for the backward; or an activation (qk_scale = scale), the output times out_scale, no LSE.
In broadcast mode every sequence reads the same dense q rows [0, Lq); output rows follow q_offsets.

Arguments (jfa.triton.launch): each tensor with its strides as one tuple (q, k, v, o: (pointer, row stride, head
stride); lse: (pointer, head stride)), offsets = (q_offsets, kv_offsets), tiles = (table, capacity), the score
and mask groups (jfa.variants.score_args, jfa.problem.Problem.mask_args), the page group (Problem.page_args: None,
or paged k and v for serving), and two constexprs: FORM (launch.Form: tiles, head dim, GQA group, modes) and SCORE.
"""
import triton
import triton.language as tl

from ... import bias as rel
from ... import variants
from ...geometry import key_blocks, visible
from .common import key_rows, mma, tile_of


@triton.jit
def _fwd_blocks(acc, state, b_q, kv, offs_m, start, end, seq, rule, score, bias, at, FORM: tl.constexpr,
                MASKED: tl.constexpr, SCORE: tl.constexpr):
    """Key blocks [start, end) of kv = (K, V, stride_kt, stride_vt, pages) into (acc, state): K and V at the
    sequence's key 0, pages None; or paged, at the pool's row 0, pages = (the sequence's page table row, PAGE).
    bias: the relative bias's group (jfa.bias) or None; at = (head, first query row, first key row)."""
    K, V, stride_kt, stride_vt, pages = kv
    FAST: tl.constexpr = FORM.fast
    offs_n = tl.arange(0, FORM.block_n)
    offs_d = tl.arange(0, FORM.block_d)
    m_d = offs_d < FORM.head_dim
    for n0 in range(start, end, FORM.block_n):
        o_n = n0 + offs_n
        m_n = o_n < seq[1]
        r_n = key_rows(o_n, pages[0], pages[1], m_n)
        p_k = K + r_n[None, :] * stride_kt + offs_d[:, None]
        b_kt = tl.load(p_k, mask=m_d[:, None] & m_n[None, :], other=0.0)  # [BLOCK_D, BLOCK_N]
        b_s = mma(b_q, b_kt, FORM)  # [BLOCK_M, BLOCK_N]
        if bias is not None:  # (over the scale: so that the score's scaling applies to it too)
            b_s += rel.block(bias, at[0], (offs_m[:, None] + (seq[1] - seq[0]), o_n[None, :], at[1] + offs_m[:, None],
                                           at[2] + o_n[None, :], (offs_m < seq[0])[:, None], m_n[None, :]), FAST)
        b_s = b_s * score[0]  # base-2 logits with softmax
        if MASKED and variants.masks_scores(SCORE):
            b_s = variants.hide(b_s, visible(offs_m[:, None], o_n[None, :], seq, rule), SCORE)
        # (the scores are scaled already: the policy's qk_scale is 1)
        b_p, state, alpha = variants.weights(b_s, state, (1.0, ), SCORE, EMPTY_ROWS=MASKED, FAST=FAST)
        if MASKED and not variants.masks_scores(SCORE):
            b_p = variants.hide(b_p, visible(offs_m[:, None], o_n[None, :], seq, rule), SCORE)
        p_v = V + r_n[:, None] * stride_vt + offs_d[None, :]
        b_v = tl.load(p_v, mask=m_n[:, None] & m_d[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        acc = acc * alpha[:, None] + mma(b_p.to(b_v.dtype), b_v, FORM)
    return acc, state


@triton.jit
def attention_fwd_kernel(q, k, v, o, lse, offsets, tiles, score, mask, pages, bias, FORM: tl.constexpr,
                         SCORE: tl.constexpr):
    """One program per (tile of the tile table, head): query rows [m0, m0 + BLOCK_M) of one sequence, its output
    and (has_lse) lse. pages: None, or paged k and v (jfa.problem.Problem.page_args); bias: None, or a relative
    bias (Problem.bias_args)."""
    i_tile = tl.program_id(0)
    i_h = tl.program_id(1)
    seq_id = tl.load(tiles[0] + i_tile)
    if seq_id < 0:  # an unused slot of the tile table
        return
    BLOCK_M: tl.constexpr = FORM.block_m
    BLOCK_D: tl.constexpr = FORM.block_d
    m0, q_start, kv_start, lens, rule, seq = tile_of(seq_id, tiles, offsets, mask, BLOCK_M)
    Q = q[0] + i_h * q[2]
    if not FORM.broadcast:  # broadcast: every sequence reads the same dense q rows
        Q += q_start.to(tl.int64) * q[1]
    i_hk = i_h // FORM.group
    if pages is None:
        kv = (k[0] + (kv_start.to(tl.int64) * k[1] + i_hk * k[2]), v[0] + (kv_start.to(tl.int64) * v[1] + i_hk * v[2]),
              k[1], v[1], (None, 1))
    else:  # the pool's rows through the sequence's row of the page table
        kv = (k[0] + i_hk * k[2], v[0] + i_hk * v[2], k[1], v[1], (pages[0] + seq_id.to(tl.int64) * pages[1], pages[2]))

    offs_m = m0 + tl.arange(0, FORM.block_m)
    offs_d = tl.arange(0, FORM.block_d)
    m_m = offs_m < lens[0]
    m_d = offs_d < FORM.head_dim
    b_q = tl.load(Q + offs_m[:, None] * q[1] + offs_d[None, :], mask=m_m[:, None] & m_d[None, :], other=0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    state = variants.row_state(tl.zeros([BLOCK_M], dtype=tl.float32))

    lo, full_lo, full_hi, hi = key_blocks(m0, seq, rule, FORM.block_m, FORM.block_n)
    at = (i_h, q_start, kv_start)
    acc, state = _fwd_blocks(acc, state, b_q, kv, offs_m, lo, full_lo, seq, rule, score, bias, at, FORM,
                             True, SCORE)
    acc, state = _fwd_blocks(acc, state, b_q, kv, offs_m, full_lo, full_hi, seq, rule, score, bias, at, FORM,
                             False, SCORE)
    acc, state = _fwd_blocks(acc, state, b_q, kv, offs_m, full_hi, hi, seq, rule, score, bias, at, FORM,
                             True, SCORE)

    b_o = acc * variants.out_factor(state, (1.0, score[1]), SCORE)[:, None]  # a row that saw no key: 0
    p_o = o[0] + q_start.to(tl.int64) * o[1] + i_h * o[2] + offs_m[:, None] * o[1] + offs_d[None, :]
    tl.store(p_o, b_o.to(o[0].dtype.element_ty), mask=m_m[:, None] & m_d[None, :])
    if variants.has_lse(SCORE):
        tl.store(lse[0] + i_h * lse[1] + q_start + offs_m, variants.lse(state, (1.0, )), mask=m_m)
