"""One (Q, dO) block of a dK/dV consumer warpgroup (jfa.hopper.bwd): the block's MMAs, its score policy (jfa.variants),
its mask (jfa.geometry) and, in the one pass, its dQ (jfa.hopper.dq_reduce); and the aggregates a consumer is
written with.

  DkdvGrads   what the consumers read per row (LSE, Delta) and write (dK, dV, dQ), with the scales
  Consumer    a consumer warpgroup's view of the kernel: its shape, K/V, the (Q, dO) ring, DkdvGrads, the batch
  QBlock      one (Q, dO) block of an item: its first row, its ring and item counts, its query head
  OnePass     the one pass's buffers besides: RowStats and DqStage

(No ``from __future__ import annotations`` in a module that defines an aggregate.)
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from .. import variants
from ..geometry import visible, window_visible
from ..targets import context_rows
from .buffers import ItemOperands, Ring, RowStats
from .common import WG_ROWS, Batch, Rows, Shape, aggregate, mma_layout, store_rows
from .dq_reduce import DQ_COLS, DqStage, dq_chunk


@aggregate
class DkdvGrads:
    """What the consumers read per row (LSE, Delta: where the score has them) and write per item (dK, dV) and, with
    DqRoute.DIRECT, per block (dQ), with the score group (jfa.variants.score_args: score[0] the scores' scale,
    score[2] dK's and dQ's factor)."""
    dk: Rows
    dv: Rows
    dq: Rows
    LSE: gl.tensor
    DELTA: gl.tensor
    stride_lh: gl.tensor
    score: gl.tuple

    @constexpr_function
    def __init__(self, dk, dv, dq, LSE, DELTA, stride_lh, score):
        self.dk = dk
        self.dv = dv
        self.dq = dq
        self.LSE = LSE
        self.DELTA = DELTA
        self.stride_lh = stride_lh
        self.score = score

    @gluon.jit
    def create(grads, stats, score):
        """From the launcher's grads = (dK, dV, dQ) as (pointer, row stride, head stride) each and stats = (LSE,
        Delta, their head stride)."""
        return DkdvGrads(Rows.create(grads[0]), Rows.create(grads[1]), Rows.create(grads[2]), stats[0], stats[1],
                         gl.to_tensor(stats[2]), score)

    @gluon.jit
    def lse2(self, head, q_start, offs_m, in_q):
        """Rows q_start + offs_m of head's LSE times log2(e), broadcast along the keys (tiles are held keys first)."""
        x = gl.load(self.LSE + head * self.stride_lh + q_start + offs_m, mask=in_q, other=0.0)
        return gl.expand_dims(x * variants.LOG2E, 0)

    @gluon.jit
    def delta(self, head, q_start, offs_m, in_q):
        """The same rows of head's Delta."""
        return gl.expand_dims(gl.load(self.DELTA + head * self.stride_lh + q_start + offs_m, mask=in_q, other=0.0), 0)


@aggregate
class Consumer:
    """A consumer warpgroup's view of the kernel: its shape, the item operands (K, V) and the (Q, dO) ring it reads,
    the gradients it writes, the batch, and which warpgroup it is (WG: keys [n0 + 64 WG, n0 + 64 WG + 64) of
    each item)."""
    shape: Shape
    kv_ops: ItemOperands
    qdo: Ring
    grads: DkdvGrads
    batch: Batch
    WG: gl.constexpr

    @constexpr_function
    def __init__(self, shape, kv_ops, qdo, grads, batch, WG):
        self.shape = shape
        self.kv_ops = kv_ops
        self.qdo = qdo
        self.grads = grads
        self.batch = batch
        self.WG = gl.constexpr(WG)


@aggregate
class QBlock:
    """One (Q, dO) block of a consumer's item: its first query row, its count in the ring (it), the item's count
    (t), the query head, and the count of the item's first block (it0: the one pass defers a block's dQ to the
    next block of the same item, _block_dq)."""
    m0: gl.tensor
    it: gl.tensor
    t: gl.tensor
    head: gl.tensor
    it0: gl.tensor

    @constexpr_function
    def __init__(self, m0, it, t, head, it0):
        self.m0 = m0
        self.it = it
        self.t = t
        self.head = head
        self.it0 = it0


# how a block is masked (dkdv_block's and one_pass_block's MASKED): not at all (a bulk block), by the test of every
# pair, by its real rows alone (MASK_REAL: jfa.geometry.tail_seen), and under HSTU's mask (jfa.geometry.target_tests)
# by the cheaper tests of a key tile's walk (jfa.targets.key_tile_tests): its context rows alone (MASK_ROWS) or the
# causal window's (MASK_WINDOW). HSTU's rule takes several operations a pair: the D=128 one pass's masked loops ran
# 1,030-1,100 instructions a block, the causal ones 720-740
MASK_NONE = gl.constexpr(0)
MASK_PAIRS = gl.constexpr(1)
MASK_ROWS = gl.constexpr(2)
MASK_WINDOW = gl.constexpr(3)
MASK_REAL = gl.constexpr(4)


@gluon.jit
def _mask(pt, gt, c, offs_m, offs_n, tile, in_q, MASKED: gl.constexpr):
    """A masked block's (P^T, G^T) with the invisible pairs at 0: the queries past the sequence's end (in_q: the real
    ones; None in the one pass, which also zeroes the keys past it: they would reach dQ), and the pairs outside the
    rule. MASK_ROWS and MASK_WINDOW blocks hold no such row, and MASK_ROWS and MASK_REAL no such key (the history's
    keys; window_visible tests them)."""
    SCORE: gl.constexpr = c.shape.SCORE
    i = gl.expand_dims(offs_m, 0)
    j = gl.expand_dims(offs_n, 1)
    if MASKED == MASK_ROWS:
        vis = context_rows(i, tile.seq, c.batch.rule)
    elif MASKED == MASK_WINDOW:
        vis = window_visible(i, j, tile.seq, c.batch.rule)
    elif MASKED == MASK_REAL:
        vis = i < tile.q_len
    elif in_q is None:
        vis = visible(i, j, tile.seq, c.batch.rule, KEY_MAJOR=True)
    else:
        vis = gl.expand_dims(in_q, 0) & visible(i, j, tile.seq, c.batch.rule, QUERIES=False, KEYS=False,
                                                KEY_MAJOR=True)
    return variants.mask_grads(pt, gt, vis, SCORE)


@gluon.jit
def dkdv_block(c, blk, dk, dv, tile, offs_n, MASKED: gl.constexpr):
    """One (Q, dO) block of BLOCK_M query rows against this warpgroup's keys: dV += P^T dO, dK += dS^T Q.
    MASKED (MASK_*): zero the pairs outside the window and the queries past the sequence's end (else a bulk block).
    SERIAL: S^T, then dV's MMA, then dP^T, then dK's (fewer live registers); else S^T and dP^T together.
    K and V are taken from item t's set per block: made once per item, this path's MMAs read shared memory out of
    bounds at D=64 with two sets (compute-sanitizer; per block: 0 errors)."""
    BLOCK_M: gl.constexpr = c.shape.BLOCK_M
    SERIAL: gl.constexpr = c.shape.SERIAL
    SCORE: gl.constexpr = c.shape.SCORE
    grads = c.grads
    k_buf = c.kv_ops.a_block(blk.t, c.WG)
    v_buf = c.kv_ops.b_block(blk.t, c.WG)
    dtype: gl.constexpr = c.kv_ops.a.dtype
    HEAD_DIM: gl.constexpr = c.kv_ops.a.shape[2]
    st_layout: gl.constexpr = mma_layout(BLOCK_M)
    acc_layout: gl.constexpr = mma_layout(HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    q_cols: gl.constexpr = gl.SliceLayout(0, st_layout)
    st_zero = gl.full([WG_ROWS, BLOCK_M], 0.0, gl.float32, layout=st_layout)
    q_buf = c.qdo.wait_a(blk.it)
    st = warpgroup_mma(k_buf, q_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    do_buf = c.qdo.wait_b(blk.it)  # (dO lands after Q: S^T goes without it)
    if not SERIAL:
        dpt = warpgroup_mma(v_buf, do_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    offs_m = blk.m0 + gl.arange(0, BLOCK_M, layout=q_cols)
    in_q = offs_m < tile.q_len
    lse2 = None  # the rows' statistics, where the score has them (loaded early: their latency hides behind S^T)
    delta = None
    if variants.has_lse(SCORE):
        lse2 = grads.lse2(blk.head, tile.q_start, offs_m, in_q)
    if not SERIAL:
        if variants.has_lse(SCORE):
            delta = grads.delta(blk.head, tile.q_start, offs_m, in_q)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
    else:
        st = warpgroup_mma_wait(num_outstanding=0, deps=(st, ))
    pt, gt = variants.bwd_weights(st, lse2, grads.score, SCORE, FOLD=variants.fold_backward(dv.type.shape[1]))
    if MASKED:  # keys past the sequence's end only feed dK/dV rows that are never stored: not tested
        pt, gt = _mask(pt, gt, c, offs_m, offs_n, tile, in_q, MASKED)
    if SERIAL:
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        dv = warpgroup_mma(pt_op, do_buf, dv, is_async=True)
        dpt = warpgroup_mma(v_buf, do_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        if variants.has_lse(SCORE):
            delta = grads.delta(blk.head, tile.q_start, offs_m, in_q)
        done = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dpt, pt_op))
        dv = done[0]
        dst_op = gl.convert_layout(variants.dscores(pt, done[1], gt, delta, SCORE).to(dtype), op_layout)
        dk = warpgroup_mma(dst_op, q_buf, dk, is_async=True)
        dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dst_op))[0]
    else:
        dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt, ))
        dst = variants.dscores(pt, dpt, gt, delta, SCORE)
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        dst_op = gl.convert_layout(dst.to(dtype), op_layout)
        dv = warpgroup_mma(pt_op, do_buf, dv, is_async=True)
        dk = warpgroup_mma(dst_op, q_buf, dk, is_async=True)
        done = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, pt_op, dst_op))
        dv = done[0]
        dk = done[1]
    c.qdo.release(blk.it)
    return dk, dv


@aggregate
class OnePass:
    """The one pass's buffers besides the consumer's: the rows' LSE and Delta (RowStats) and dQ's stage (dS^T
    buffers, and with DqRoute.REDUCE the float32 chunk ring the writer drains)."""
    stats: RowStats
    stage: DqStage

    @constexpr_function
    def __init__(self, stats, stage):
        self.stats = stats
        self.stage = stage


@gluon.jit
def one_pass_block(c, d, blk, dk, dv, tile, offs_n, want_dq, MASKED: gl.constexpr, DIRECT: gl.constexpr, idle=False):
    """dkdv_block's MMAs, P^T and dS^T as dV's and dK's register operands, dS^T also in shared memory (dQ's A
    operand, for both consumers), and the block's dQ (_block_dq). MASKED also zeroes keys past the sequence's end
    (they would reach dQ). idle (DqRoute.DIRECT): this warpgroup holds no key of the item's sequence (at most 64
    keys: consumer 1): no score, no dV MMA, its dS^T zeros, so only the block's dQ share and its dK MMA (on zeros:
    the MMA behind a branch of its own failed triton 3.6's lowering) remain."""
    BLOCK_M: gl.constexpr = c.shape.BLOCK_M
    WG: gl.constexpr = c.WG
    stage = d.stage
    it = blk.it
    q_buf = c.qdo.wait_a(it)
    if idle:  # (the direct route's alone, whose ring has one ready barrier: dO has landed with Q, and the slot's
        # release cannot let the producer refill it under dO's load)
        dst = gl.full([WG_ROWS, BLOCK_M], 0.0, c.kv_ops.a.dtype, layout=mma_layout(BLOCK_M))
        stage.claim_ds(it)
        stage.ds_buffer(it, WG).store(dst)
    else:
        dv, dst = _scores_and_dv(c, d, blk, dv, tile, offs_n, q_buf, MASKED)
    # dK += dS^T Q with dS^T from registers (FA3's Mma_dKV_is_RS), issued before dS^T's fence and hand-over, which
    # it then overlaps (idle: on zeros, as an MMA behind a branch of its own failed triton 3.6's lowering)
    acc_layout: gl.constexpr = mma_layout(c.kv_ops.a.shape[2])
    dst_op = gl.convert_layout(dst, gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2))
    dk = warpgroup_mma(dst_op, q_buf, dk, is_async=True)
    fence_async_shared()
    stage.publish_ds(it)
    _block_dq(c, stage, blk, tile, want_dq, DIRECT)
    dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dst_op))[0]
    c.qdo.release(it)
    return dk, dv


@gluon.jit
def _scores_and_dv(c, d, blk, dv, tile, offs_n, q_buf, MASKED: gl.constexpr):
    """one_pass_block's score step: S^T, dV += P^T dO (P^T from registers), dP^T (SERIAL: issued beside dV, after
    the exponentials; else beside S^T), then dS^T into the block's buffer (claimed here; not yet fenced or
    published), with 64-row blocks under dV's MMA -> (dV, dS^T)."""
    BLOCK_M: gl.constexpr = c.shape.BLOCK_M
    SCORE: gl.constexpr = c.shape.SCORE
    WG: gl.constexpr = c.WG
    stage = d.stage
    it = blk.it
    dtype: gl.constexpr = c.kv_ops.a.dtype
    k_buf = c.kv_ops.a_block(blk.t, WG)
    v_buf = c.kv_ops.b_block(blk.t, WG)
    st_layout: gl.constexpr = mma_layout(BLOCK_M)
    q_cols: gl.constexpr = gl.SliceLayout(0, st_layout)
    st_zero = gl.full([WG_ROWS, BLOCK_M], 0.0, gl.float32, layout=st_layout)
    lse2 = None  # the rows' LSE (and beside S^T -Delta) where the score has them, from shared memory (RowStats),
    neg_delta = None  # read before S^T's issue: their latency under S^T's MMAs
    if variants.has_lse(SCORE):
        lse2 = gl.expand_dims(d.stats.read(it, q_cols, 0), 0)
        if not c.shape.SERIAL:
            neg_delta = gl.expand_dims(d.stats.read(it, q_cols, 1), 0)
    st = warpgroup_mma(k_buf, q_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    do_buf = c.qdo.wait_b(it)  # (dO lands after Q: S^T goes without it)
    if not c.shape.SERIAL:  # dP^T beside S^T: the exponentials overlap this consumer's dP^T
        dpt = _dpt(c, d, it, v_buf, do_buf, st_zero, neg_delta)
    if c.shape.SERIAL:
        st = warpgroup_mma_wait(num_outstanding=0, deps=(st, ))
    else:
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
    pt, gt = variants.bwd_weights(st, lse2, c.grads.score, SCORE,
                                    FOLD=variants.fold_backward(dv.type.shape[1]))
    if MASKED:
        offs_m = blk.m0 + gl.arange(0, BLOCK_M, layout=q_cols)
        pt, gt = _mask(pt, gt, c, offs_m, offs_n, tile, None, MASKED)
    # P^T as dV's register A operand (FA3's Mma_dKV_is_RS): no trip through shared memory, so no store, fence and
    # warpgroup barrier before dV's MMA, and no barrier before dS^T takes the buffer
    acc_layout: gl.constexpr = mma_layout(c.kv_ops.a.shape[2])
    pt_op = gl.convert_layout(pt.to(dtype), gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2))
    # 64-row blocks: dP^T before dV, so that waiting for dP^T alone leaves dV's MMA running under dS^T's math and
    # stores (waited for below; the 32-row forms spilled more with it: 48-108 -> 96-164 B)
    DV_LATE: gl.constexpr = BLOCK_M == WG_ROWS
    if c.shape.SERIAL and DV_LATE:
        dpt = _dpt(c, d, it, v_buf, do_buf, st_zero, None)
    dv = warpgroup_mma(pt_op, do_buf, dv, is_async=True)
    if DV_LATE:
        dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, ))
    else:
        dpt = _dpt(c, d, it, v_buf, do_buf, st_zero, None)
        done = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dpt, pt_op))
        dv, dpt = done[0], done[1]
    dst = variants.dscores(pt, dpt, gt, None, SCORE).to(dtype)  # (dP^T - Delta: _dpt)
    stage.claim_ds(it)
    stage.ds_buffer(it, WG).store(dst)
    if DV_LATE:  # (an accumulator in flight may not leave: one_pass_block branches on idle)
        dv = warpgroup_mma_wait(num_outstanding=0, deps=(dv, pt_op))[0]
    return dv, dst


@gluon.jit
def _dpt(c, d, it, v_buf, do_buf, zero, neg_delta):
    """dP^T = V dO^T of block it, issued; where the score has Delta (neg_delta: -Delta as RowStats holds it, or read
    here if None), on an accumulator holding -Delta, so that dS^T = P^T (dP^T - Delta) is one product an element and
    Delta's shared-memory read comes before the MMA (read after dP^T's wait, at its use, its latency was ~10% of a
    consumer's stall samples: ncu). Stored negated, it is only copied into the accumulator (zero - Delta negated
    16 values a thread a block)."""
    if variants.has_lse(c.shape.SCORE):
        if neg_delta is None:
            q_cols: gl.constexpr = gl.SliceLayout(0, zero.type.layout)
            neg_delta = gl.expand_dims(d.stats.read(it, q_cols, 1), 0)
        init = gl.broadcast(neg_delta, zero)[0]
        return warpgroup_mma(v_buf, do_buf.permute((1, 0)), init, use_acc=True, is_async=True)
    return warpgroup_mma(v_buf, do_buf.permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def deferred_dq(c, stage, it, t):
    """Chunk c.WG of block it's dQ, computed while the consumer is at block it + 1 of the same item (or done with
    the item: jfa.hopper.bwd flushes its last block before releasing K/V): by then the other consumer has long
    published block it's dS^T, so the two are not held in lockstep by the wait for it (that wait cost 9% of the
    D=128 one pass: the "no dS wait" ablation), and a consumer may run a block ahead of the other."""
    BLOCK_M: gl.constexpr = c.shape.BLOCK_M
    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq_chunk(it, t, c.WG, c.kv_ops, stage, BLOCK_M), ))
    stage.free_ds(it)
    stage.put(c.WG, it, staged_dq(dq, c.grads, BLOCK_M), BLOCK_M < WG_ROWS)


@gluon.jit
def staged_dq(dq, grads, BLOCK_M: gl.constexpr):
    """A dQ chunk as staged for the reduce: 64-row blocks' (DkdvConfig.dq_xor) without grad_scale, which
    jfa.hopper.dq_reduce.dq_from_acc applies once a row as it casts (32 FMUL a thread a block off the consumers'
    path); the 32-row forms' accumulator is cast by torch, so theirs take it here."""
    if BLOCK_M == WG_ROWS:
        return dq
    return dq * grads.score[2]


@gluon.jit
def _block_dq(c, stage, blk, tile, want_dq, DIRECT: gl.constexpr):
    """The block's dQ = dS K: both consumers' dS^T (each over its 64 keys) feed each DQ_COLS-column chunk, computed by
    its owner (jfa.hopper.dq_reduce) and handed to the writer warp, or with DIRECT, where the item holds every key of
    its sequence (want_dq), complete, stored by its owner (else the block computes no dQ: the dQ pass does)."""
    BLOCK_M: gl.constexpr = c.shape.BLOCK_M
    WG: gl.constexpr = c.WG
    dtype: gl.constexpr = c.kv_ops.a.dtype
    grads = c.grads
    it = blk.it
    if DIRECT:  # dQ (if this item has it) stored in place: chunk WG, or every other block at D=64
        if want_dq & ((stage.CHUNKS == 2) | (it % 2 == WG)):
            C: gl.constexpr = WG if stage.CHUNKS == 2 else 0
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq_chunk(it, blk.t, C, c.kv_ops, stage, BLOCK_M), ))
            if BLOCK_M < WG_ROWS:  # computed transposed (dq_chunk)
                dq = gl.permute(dq, (1, 0))
            store_rows(grads.dq.head(blk.head) + C * DQ_COLS, grads.dq.stride_t, (dq * grads.score[2]).to(dtype),
                       blk.m0, tile.q_start, tile.q_len)
        stage.free_ds(it)
    elif stage.CHUNKS == 2:  # consumer WG computes chunk WG of every block, one block late (deferred_dq)
        if it > blk.it0:
            deferred_dq(c, stage, it - 1, blk.t)
    else:  # one chunk: the consumers take the blocks in turn
        if it % 2 == WG:
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq_chunk(it, blk.t, 0, c.kv_ops, stage, BLOCK_M), ))
            stage.put(WG, it // 2, staged_dq(dq, grads, BLOCK_M), BLOCK_M < WG_ROWS)
        stage.free_ds(it)
