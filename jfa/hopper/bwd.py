"""The Hopper dK/dV kernel: one persistent, warp-specialized Gluon kernel that computes dK and dV and, by its
config's dQ route (jfa.hopper.config.DqRoute), dQ too: the one pass (dQ through shared memory to a writer warp that
adds it into float32 with TMA reduce-adds: jfa.hopper.dq_reduce), the direct route (dQ of the sequences whose keys
fit one item, stored), or none (the dQ pass computes it: jfa.hopper.bwd_dq). jfa.hopper.backward runs them;
docs/hopper.md describes both.

Glossary as jfa/geometry.py, the score step as jfa/variants.py, aggregates and barrier protocol as
jfa/hopper/items.py and buffers.py, the math as jfa/triton/kernels/bwd.py, computed transposed (S^T = K Q^T, so
no tile is transposed in registers).

Each CTA loops over its items (key tile of BLOCK_N = 128 keys, kv head), costed by the query blocks that see
the tile (jfa.hopper.config.key_tile_schedule). Partitions:

  load      1 warp: per item, the K and V rows of both consumers (ItemOperands; with posted_items the item's
            bookkeeping beside them, and after the last item an end mark), then (Q, dO) blocks of BLOCK_M query
            rows, for every query head of the GQA group, through a STAGES-deep Ring (one pass: with the rows' LSE
            and Delta, RowStats).
  dkdv      2 x 4 warps (consumer w owns keys [n0 + 64 w, n0 + 64 w + 64)): per (Q, dO) block, on wgmma:
  (x2)      S^T = K Q^T and dP^T = V dO^T; P^T = exp2(S^T - lse), dS^T = P^T (dP^T - Delta);
            dV += P^T dO and dK += dS^T Q; one pass: dQ chunks = dS K (_one_pass_block). dK and dV stay in
            registers over the whole item (GQA group included: no atomics) and are stored once. Each item's
            blocks run as three loops: masked head, mask-free bulk, masked tail (jfa.geometry.full_query_blocks
            per warpgroup).
  writer    1 warp, one pass only: the dQ chunks' TMA reduce-adds (jfa.hopper.dq_reduce).
"""
import math

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from ..geometry import full_query_blocks, visible
from ..problem import Problem
from ..runtime import num_sms
from ..schedule import CACHE
from ..variants import softmax_dscores, softmax_weights
from .buffers import ItemOperands, Ring, RowStats
from .common import WG_ROWS, Batch, Shape, aggregate, aligned, mma_layout, store_rows, tma_descriptor
from .config import DkdvConfig, DqRoute, key_tile_schedule
from .dq_reduce import DQ_COLS, DqStage, dq_chunk, dq_writer_partition
from .items import WorkList

LOG2E = gl.constexpr(1.4426950408889634)


@aggregate
class DkdvGrads:
    """What the consumers read per row (LSE, Delta) and write per item (dK, dV) and, with DqRoute.DIRECT, per
    block (dQ), with the scales."""
    DK: gl.tensor
    DV: gl.tensor
    DQ: gl.tensor
    LSE: gl.tensor
    DELTA: gl.tensor
    stride_dkt: gl.tensor
    stride_dkh: gl.tensor
    stride_dvt: gl.tensor
    stride_dvh: gl.tensor
    stride_dqt: gl.tensor
    stride_dqh: gl.tensor
    stride_lh: gl.tensor
    scale: gl.tensor
    qk_scale: gl.tensor

    @constexpr_function
    def __init__(self, DK, DV, DQ, LSE, DELTA, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt, stride_dqh,
                 stride_lh, scale, qk_scale):
        self.DK = DK
        self.DV = DV
        self.DQ = DQ
        self.LSE = LSE
        self.DELTA = DELTA
        self.stride_dkt = stride_dkt
        self.stride_dkh = stride_dkh
        self.stride_dvt = stride_dvt
        self.stride_dvh = stride_dvh
        self.stride_dqt = stride_dqt
        self.stride_dqh = stride_dqh
        self.stride_lh = stride_lh
        self.scale = scale
        self.qk_scale = qk_scale

    @gluon.jit
    def create(DK, DV, DQ, LSE, DELTA, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt, stride_dqh,
               stride_lh, scale, qk_scale):
        return DkdvGrads(DK, DV, DQ, LSE, DELTA, gl.to_tensor(stride_dkt), gl.to_tensor(stride_dkh),
                         gl.to_tensor(stride_dvt), gl.to_tensor(stride_dvh), gl.to_tensor(stride_dqt),
                         gl.to_tensor(stride_dqh), gl.to_tensor(stride_lh), scale, qk_scale)


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
    (t) and the query head."""
    m0: gl.tensor
    it: gl.tensor
    t: gl.tensor
    head: gl.tensor

    @constexpr_function
    def __init__(self, m0, it, t, head):
        self.m0 = m0
        self.it = it
        self.t = t
        self.head = head


@gluon.jit
def _load_partition(shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, stats):
    HEAD_DIM: gl.constexpr = q_desc.block_shape[1]
    BLOCK_M: gl.constexpr = shape.BLOCK_M
    it = 0  # (Q, dO) blocks loaded so far
    t = 0  # items loaded so far
    first, end = work.bounds()
    for idx in range(first, end):
        tile = work.key_tile(idx, batch, shape)
        if tile.valid:
            kv_ops.acquire(t)  # both consumers have stored the previous item's dK, dV
            if kv_ops.POSTED:
                kv_ops.post(t, tile)
            for w in gl.static_range(2):
                row = tile.kv_start + tile.start + w * WG_ROWS
                kv_ops.load(t, w, k_desc, [row, tile.head * HEAD_DIM], v_desc, [row, tile.head * HEAD_DIM])
            for g in range(shape.GROUP):
                col = (tile.head * shape.GROUP + g) * HEAD_DIM
                for m0 in range(tile.lo, tile.hi, BLOCK_M):  # the item's walk (Item.n_blocks blocks)
                    q_row = m0 if shape.BROADCAST else tile.q_start + m0  # broadcast: one dense q
                    qdo.claim(it)
                    if stats is not None:
                        head_row = (tile.head * shape.GROUP + g) * grads.stride_lh
                        stats.put(it, grads.LSE + head_row, grads.DELTA + head_row, tile.q_start + m0,
                                  grads.stride_lh)
                    qdo.issue(it, q_desc, [q_row, col], do_desc, [tile.q_start + m0, col])
                    it += 1
            t += 1
    if kv_ops.POSTED:
        kv_ops.close(t)  # the consumers' end mark


@gluon.jit
def _dkdv_block(c, blk, dk, dv, tile, offs_n, MASKED: gl.constexpr):
    """One (Q, dO) block of BLOCK_M query rows against this warpgroup's keys: dV += P^T dO, dK += dS^T Q.
    MASKED: zero the pairs outside the window and the queries past the sequence's end (else a bulk block).
    SERIAL: S^T, then dV's MMA, then dP^T, then dK's (fewer live registers); else S^T and dP^T together.
    K and V are taken from item t's set per block: made once per item, this path's MMAs read shared memory out of
    bounds at D=64 with two sets (compute-sanitizer; per block: 0 errors)."""
    BLOCK_M: gl.constexpr = c.shape.BLOCK_M
    SERIAL: gl.constexpr = c.shape.SERIAL
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
    q_buf, do_buf = c.qdo.wait(blk.it)
    st = warpgroup_mma(k_buf, q_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    if not SERIAL:
        dpt = warpgroup_mma(v_buf, do_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    offs_m = blk.m0 + gl.arange(0, BLOCK_M, layout=q_cols)
    in_q = offs_m < tile.q_len
    rows = grads.LSE + blk.head * grads.stride_lh + tile.q_start + offs_m
    lse2 = gl.load(rows, mask=in_q, other=0.0) * LOG2E
    if not SERIAL:
        delta = gl.load(grads.DELTA + blk.head * grads.stride_lh + tile.q_start + offs_m, mask=in_q, other=0.0)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
    else:
        st = warpgroup_mma_wait(num_outstanding=0, deps=(st, ))
    pt = softmax_weights(st, grads.qk_scale, gl.expand_dims(lse2, 0))
    if MASKED:  # keys past the sequence's end only feed dK/dV rows that are never stored: not tested
        vis = visible(gl.expand_dims(offs_m, 0), gl.expand_dims(offs_n, 1), tile.seq(), c.batch.rule(),
                      QUERIES=False, KEYS=False, KEY_MAJOR=True)
        pt = gl.where(gl.expand_dims(in_q, 0) & vis, pt, 0.0)
    if SERIAL:
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        dv = warpgroup_mma(pt_op, do_buf, dv, is_async=True)
        dpt = warpgroup_mma(v_buf, do_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        delta = gl.load(grads.DELTA + blk.head * grads.stride_lh + tile.q_start + offs_m, mask=in_q, other=0.0)
        done = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dpt, pt_op))
        dv = done[0]
        dst_op = gl.convert_layout(softmax_dscores(pt, done[1], gl.expand_dims(delta, 0)).to(dtype), op_layout)
        dk = warpgroup_mma(dst_op, q_buf, dk, is_async=True)
        dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dst_op))[0]
    else:
        dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt, ))
        dst = softmax_dscores(pt, dpt, gl.expand_dims(delta, 0))
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
def _one_pass_block(c, d, blk, dk, dv, tile, offs_n, want_dq, MASKED: gl.constexpr, DIRECT: gl.constexpr):
    """_dkdv_block's MMAs one after another with P^T, then dS^T, in shared memory (the A operands of dV's and
    dK's MMAs), and the block's dQ = dS K: both consumers' dS^T (each over its 64 keys) feed each DQ_COLS-column
    chunk, computed by its owner (jfa.hopper.dq_reduce) and handed to the writer warp, or with DIRECT, where the
    item holds every key of its sequence (want_dq), complete, stored by its owner (else the block computes no dQ:
    the dQ pass does). MASKED also zeroes keys past the sequence's end (they would reach dQ)."""
    BLOCK_M: gl.constexpr = c.shape.BLOCK_M
    WG: gl.constexpr = c.WG
    grads = c.grads
    stage = d.stage
    it = blk.it
    dtype: gl.constexpr = c.kv_ops.a.dtype
    k_buf = c.kv_ops.a_block(blk.t, WG)
    v_buf = c.kv_ops.b_block(blk.t, WG)
    st_layout: gl.constexpr = mma_layout(BLOCK_M)
    q_cols: gl.constexpr = gl.SliceLayout(0, st_layout)
    st_zero = gl.full([WG_ROWS, BLOCK_M], 0.0, gl.float32, layout=st_layout)
    q_buf, do_buf = c.qdo.wait(it)
    st = warpgroup_mma(k_buf, q_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    lse2, delta = d.stats.read(it, q_cols)
    st = warpgroup_mma_wait(num_outstanding=0, deps=(st, ))
    pt = softmax_weights(st, grads.qk_scale, gl.expand_dims(lse2, 0))
    if MASKED:
        offs_m = blk.m0 + gl.arange(0, BLOCK_M, layout=q_cols)
        vis = visible(gl.expand_dims(offs_m, 0), gl.expand_dims(offs_n, 1), tile.seq(), c.batch.rule(),
                      KEY_MAJOR=True)
        pt = gl.where(vis, pt, 0.0)
    ds_buf = stage.ds_buffer(it, WG)
    stage.claim_ds(it)
    ds_buf.store(pt.to(dtype))
    fence_async_shared()
    dv = warpgroup_mma(ds_buf, do_buf, dv, is_async=True)
    dpt = warpgroup_mma(v_buf, do_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    done = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dpt))
    dv = done[0]
    ds_buf.store(softmax_dscores(pt, done[1], gl.expand_dims(delta, 0)).to(dtype))
    fence_async_shared()
    stage.publish_ds(it)
    if DIRECT:  # dK first; dQ (if this item has it) after, stored in place: chunk WG, or every other block at D=64
        dk = warpgroup_mma(ds_buf, q_buf, dk, is_async=True)
        if want_dq & ((stage.CHUNKS == 2) | (it % 2 == WG)):
            C: gl.constexpr = WG if stage.CHUNKS == 2 else 0
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq_chunk(it, blk.t, C, c.kv_ops, stage, BLOCK_M), ))
            if BLOCK_M < WG_ROWS:  # computed transposed (_dq_chunk)
                dq = gl.permute(dq, (1, 0))
            store_rows(grads.DQ + blk.head * grads.stride_dqh + C * DQ_COLS, grads.stride_dqt,
                       (dq * grads.scale).to(dtype), blk.m0, tile.q_start, tile.q_len)
        stage.free_ds(it)
    elif stage.CHUNKS == 2:  # consumer WG computes chunk WG of every block, before dK: the hand-over overlaps dK
        dq = dq_chunk(it, blk.t, WG, c.kv_ops, stage, BLOCK_M)
        dk = warpgroup_mma(ds_buf, q_buf, dk, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=1, deps=(dq, ))
        stage.free_ds(it)
        stage.put(WG, it, dq * grads.scale, BLOCK_M < WG_ROWS)
    else:  # one chunk: the consumers take the blocks in turn
        dk = warpgroup_mma(ds_buf, q_buf, dk, is_async=True)
        if it % 2 == WG:
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq_chunk(it, blk.t, 0, c.kv_ops, stage, BLOCK_M), ))
            stage.put(WG, it // 2, dq * grads.scale, BLOCK_M < WG_ROWS)
        stage.free_ds(it)
    dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk, ))
    c.qdo.release(it)
    return dk, dv


@gluon.jit
def _dkdv_item(c, d, tile, t, it, DIRECT: gl.constexpr):
    """Item t (its K/V landed, or waited for here) from block it on: dK, dV (and dQ; d: the one pass's buffers, or
    None) -> the next block's count."""
    WG: gl.constexpr = c.WG
    dtype: gl.constexpr = c.kv_ops.a.dtype
    HEAD_DIM: gl.constexpr = c.kv_ops.a.shape[2]
    BLOCK_M: gl.constexpr = c.shape.BLOCK_M
    st_layout: gl.constexpr = mma_layout(BLOCK_M)
    acc_layout: gl.constexpr = mma_layout(HEAD_DIM)
    key_rows: gl.constexpr = gl.SliceLayout(1, st_layout)
    ONE_PASS: gl.constexpr = d is not None
    grads = c.grads
    k0 = tile.start + WG * WG_ROWS  # this warpgroup's first key
    offs_n = k0 + gl.arange(0, WG_ROWS, layout=key_rows)
    dk = gl.full([WG_ROWS, HEAD_DIM], 0.0, gl.float32, layout=acc_layout)
    dv = gl.full([WG_ROWS, HEAD_DIM], 0.0, gl.float32, layout=acc_layout)
    n_blocks = tile.n_blocks(BLOCK_M)
    if not c.kv_ops.POSTED:
        c.kv_ops.wait(t, WG)
    # blocks [0, j_lo) and [j_hi, n_blocks) need the mask; [j_lo, j_hi) is this warpgroup's bulk
    j_lo, j_hi = full_query_blocks(k0, tile.lo, n_blocks, tile.seq(), c.batch.rule(), BLOCK_M, WG_ROWS)
    if ONE_PASS:  # keys past the sequence's end reach dQ: their blocks take the mask
        j_hi = gl.where(k0 + WG_ROWS > tile.kv_len, j_lo, j_hi)
    want_dq = tile.kv_len <= c.shape.BLOCK_N  # DIRECT: this item holds every key of its sequence
    for g in range(c.shape.GROUP):
        i_h = tile.head * c.shape.GROUP + g
        for seg in gl.static_range(3):
            begin = 0 if seg == 0 else (j_lo if seg == 1 else j_hi)
            end_j = j_lo if seg == 0 else (j_hi if seg == 1 else n_blocks)
            for j in range(begin, end_j):
                blk = QBlock(tile.lo + j * BLOCK_M, it, t, i_h)
                if ONE_PASS:
                    dk, dv = _one_pass_block(c, d, blk, dk, dv, tile, offs_n, want_dq, MASKED=seg != 1,
                                             DIRECT=DIRECT)
                else:
                    dk, dv = _dkdv_block(c, blk, dk, dv, tile, offs_n, MASKED=seg != 1)
                it += 1
    c.kv_ops.release(t)  # K/V read for the last time: the producer may load the next item's
    store_rows(grads.DK + tile.head * grads.stride_dkh, grads.stride_dkt, (dk * grads.scale).to(dtype), k0,
               tile.kv_start, tile.kv_len)
    store_rows(grads.DV + tile.head * grads.stride_dvh, grads.stride_dvt, dv.to(dtype), k0, tile.kv_start,
               tile.kv_len)
    return it


@gluon.jit
def _dkdv_partition(c, work, d, DIRECT: gl.constexpr):
    """Consumer c.WG's items: as posted (each read after its K/V wait, up to the end mark: no global load per
    item, DkdvConfig.posted_items), or from the schedule (WorkList's three dependent loads per slot)."""
    kv_ops = c.kv_ops
    it = 0
    t = 0
    if kv_ops.POSTED:
        kv_ops.wait(0, c.WG)
        valid = kv_ops.item(0, 4).valid
        while valid:
            it = _dkdv_item(c, d, kv_ops.item(t, 4), t, it, DIRECT)
            t += 1
            kv_ops.wait(t, c.WG)
            valid = kv_ops.item(t, 4).valid
    else:
        first, end = work.bounds()
        for idx in range(first, end):
            tile = work.key_tile(idx, c.batch, c.shape)
            if tile.valid:
                it = _dkdv_item(c, d, tile, t, it, DIRECT)
                t += 1


@gluon.jit
def hopper_dkdv_kernel(q_desc, do_desc, k_desc, v_desc, dq_desc, DK, DV, DQ, LSE, DELTA, q_offsets, kv_offsets, tiles,
                       order, sm_start, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt, stride_dqh,
                       stride_lh, tile_capacity, heads_kv, scale, qk_scale, LEFT, RIGHT, GROUP: gl.constexpr,
                       BLOCK_M: gl.constexpr, STAGES: gl.constexpr, DQ_STAGES: gl.constexpr, SERIAL: gl.constexpr,
                       BROADCAST: gl.constexpr, ONE_PASS: gl.constexpr, DIRECT: gl.constexpr,
                       KV_SLOTS: gl.constexpr, POSTED: gl.constexpr, num_warps: gl.constexpr):
    """ONE_PASS: dQ too (DkdvConfig.one_pass), with the rows' LSE and Delta through shared memory (RowStats):
    through the writer warp into dq_desc's float32 accumulator (DqRoute.REDUCE), or with DIRECT, only for the
    sequences whose keys fit one item, stored into DQ (q's dtype) by the consumers (DqRoute.DIRECT). Else neither
    dq_desc nor DQ is used."""
    shape = Shape(GROUP, BLOCK_M, 2 * WG_ROWS, 2, SERIAL, BROADCAST)
    work = WorkList.create(tiles, order, sm_start, tile_capacity, heads_kv)
    batch = Batch.create(q_offsets, kv_offsets, LEFT, RIGHT)
    grads = DkdvGrads.create(DK, DV, DQ, LSE, DELTA, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt,
                             stride_dqh, stride_lh, scale, qk_scale)
    kv_ops = ItemOperands.alloc(k_desc, v_desc, 2, True, KV_SLOTS, POSTED)
    qdo = Ring.alloc(q_desc, do_desc, STAGES, 2, False)
    if ONE_PASS:
        stats = RowStats.alloc(BLOCK_M, STAGES)
        d = OnePass(stats, DqStage.alloc(k_desc.dtype, dq_desc, k_desc.block_shape[1], BLOCK_M, 2, DQ_STAGES,
                                         not DIRECT))
        if DIRECT:
            gl.warp_specialize([
                (_dkdv_partition, (Consumer(shape, kv_ops, qdo, grads, batch, 0), work, d, True)),
                (_dkdv_partition, (Consumer(shape, kv_ops, qdo, grads, batch, 1), work, d, True)),
                (_load_partition, (shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, stats)),
            ], [4, 1], [240, 24])
        else:
            gl.warp_specialize([
                (_dkdv_partition, (Consumer(shape, kv_ops, qdo, grads, batch, 0), work, d, False)),
                (_dkdv_partition, (Consumer(shape, kv_ops, qdo, grads, batch, 1), work, d, False)),
                (_load_partition, (shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, stats)),
                (dq_writer_partition, (shape, work, batch, dq_desc, d.stage)),
            ], [4, 1, 1], [240, 24, 24])
    else:
        gl.warp_specialize([
            (_dkdv_partition, (Consumer(shape, kv_ops, qdo, grads, batch, 0), work, None, False)),
            (_dkdv_partition, (Consumer(shape, kv_ops, qdo, grads, batch, 1), work, None, False)),
            (_load_partition, (shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, None)),
        ], [4, 1], [240, 24])


def descriptors(q, dout, k, v, cfg: DkdvConfig, dq=None):
    """TMA descriptors: q and dO in block_m-row boxes, k and v in WG_ROWS-row boxes (one per consumer);
    DqRoute.REDUCE: the float32 dQ accumulator in [block_m, DQ_COLS] boxes (else k's stands in, unused)."""
    rows = WG_ROWS.value
    k_desc = tma_descriptor(k, rows)
    dq_desc = tma_descriptor(dq, cfg.block_m, DQ_COLS.value) if cfg.dq == DqRoute.REDUCE else k_desc
    return (tma_descriptor(q, cfg.block_m), tma_descriptor(dout, cfg.block_m), k_desc, tma_descriptor(v, rows),
            dq_desc)


def constexprs(cfg: DkdvConfig, p: Problem) -> dict:
    """The kernel's compile-time arguments for this config and problem (the launcher's and jfa.hopper.aot's)."""
    return dict(GROUP=p.group, BROADCAST=p.broadcast, **cfg.constexprs(), num_warps=4)


def dkdv(p: Problem, dout, lse, delta, dk, dv, cfg: DkdvConfig, dq=None):
    """dK, dV into dk, dv (k has rows; D 64/128; bf16/fp16), and dQ by cfg.dq: DqRoute.REDUCE, added into dq
    (float32, zeroed) in the same pass: rows as dout's, or in broadcast mode one slab of Lq rows per CTA (num_sms
    of them); DqRoute.DIRECT, stored into dq (q's dtype) for the sequences whose keys fit one key tile."""
    q, k, v = p.q, p.k, p.v
    sms = num_sms(q.device)
    spec = key_tile_schedule(k.shape[0], k.shape[1], cfg, p.left, p.right, sms)
    sched = CACHE.get(p.kv_offsets, p.q_offsets, spec, dout.shape[0])
    q, dout, k, v = aligned(q, dout, k, v)
    dq_out = dq if cfg.dq == DqRoute.DIRECT else dk  # (dk stands in, unused)
    hopper_dkdv_kernel[(sms, )](
        *descriptors(q, dout, k, v, cfg, dq), dk, dv, dq_out, lse, delta, p.q_offsets, p.kv_offsets, sched.tiles,
        sched.order, sched.sm_start, dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), dq_out.stride(0),
        dq_out.stride(1), lse.stride(0), sched.tiles.shape[1], k.shape[1], p.scale, p.scale * math.log2(math.e),
        p.left, p.right, **constexprs(cfg, p))
