"""The Hopper backward: Delta (the portable preprocess), then by default one persistent, warp-specialized Gluon
pass that computes dK, dV and dQ (dQ through shared memory to a writer warp that adds it into float32 with TMA
reduce-adds: jfa.hopper.dq_reduce), or with deterministic=True two passes with no atomics: dK/dV (this file,
the same kernel without dQ) and dQ (jfa.hopper.bwd_dq). docs/hopper.md describes both.

Glossary as jfa/geometry.py, aggregates and barrier protocol as jfa/hopper/common.py, the math as
jfa/triton/kernels/bwd.py, computed transposed (S^T = K Q^T, so no tile is transposed in registers).

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

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from ..geometry import full_query_blocks, in_window
from ..runtime import num_sms
from ..schedule import CACHE
from ..triton.launch import bwd_delta, sum_broadcast_dq
from .bwd_dq import dq_pass
from .common import (WG_ROWS, Batch, ItemOperands, Ring, RowStats, Shape, WorkList, aggregate, aligned, store_rows,
                     tma_descriptor)
from .config import DQ_DIRECT, DQ_NONE, DQ_REDUCE, DkdvConfig, dq_route, key_tile_schedule, select_dkdv
from .dq_reduce import DQ_COLS, DqStage, dq_writer_partition

LOG2E = gl.constexpr(1.4426950408889634)


@aggregate
class DkdvGrads:
    """What the consumers read per row (LSE, Delta) and write per item (dK, dV) and, with DQ_DIRECT, per block
    (dQ), with the scales."""
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


@constexpr_function
def _mma_layout(n):
    """wgmma's register layout for a consumer warpgroup's [64, n] accumulator."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.jit
def _load_partition(shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, stats):
    HEAD_DIM: gl.constexpr = q_desc.block_shape[1]
    BLOCK_M: gl.constexpr = shape.BLOCK_M
    it = 0  # (Q, dO) blocks loaded so far
    t = 0  # items loaded so far
    first, end = work.bounds()
    for idx in range(first, end):
        tile = work.item(idx, batch, shape.BLOCK_N, BLOCK_M, True)
        if tile.valid:
            kv_ops.acquire(t)  # both consumers have stored the previous item's dK, dV
            if kv_ops.POSTED:
                kv_ops.post(t, tile)
            for w in gl.static_range(2):
                row = tile.kv_start + tile.start + w * WG_ROWS
                kv_ops.load(t, w, k_desc, [row, tile.head * HEAD_DIM], v_desc, [row, tile.head * HEAD_DIM])
            for g in range(shape.GROUP):
                col = (tile.head * shape.GROUP + g) * HEAD_DIM
                for m0 in range(tile.lo, tile.hi, BLOCK_M):
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
def _dkdv_block(m0, it, t, dk, dv, kv_ops, qdo, grads, i_h, tile, offs_n, batch, WG: gl.constexpr,
                BLOCK_M: gl.constexpr, MASKED: gl.constexpr, SERIAL: gl.constexpr):
    """One (Q, dO) block of BLOCK_M query rows against this warpgroup's keys: dV += P^T dO, dK += dS^T Q.
    MASKED: zero the pairs outside the window and the queries past the sequence's end (else a bulk block).
    SERIAL: S^T, then dV's MMA, then dP^T, then dK's (fewer live registers); else S^T and dP^T together.
    K and V are taken from item t's set per block: made once per item, this path's MMAs read shared memory out of
    bounds at D=64 with two sets (compute-sanitizer, session 10; per block: 0 errors, session 11)."""
    k_buf = kv_ops.a_block(t, WG)
    v_buf = kv_ops.b_block(t, WG)
    dtype: gl.constexpr = kv_ops.a.dtype
    HEAD_DIM: gl.constexpr = kv_ops.a.shape[2]
    st_layout: gl.constexpr = _mma_layout(BLOCK_M)
    acc_layout: gl.constexpr = _mma_layout(HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    q_cols: gl.constexpr = gl.SliceLayout(0, st_layout)
    st_zero = gl.full([WG_ROWS, BLOCK_M], 0.0, gl.float32, layout=st_layout)
    q_buf, do_buf = qdo.wait(it)
    st = warpgroup_mma(k_buf, q_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    if not SERIAL:
        dpt = warpgroup_mma(v_buf, do_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    offs_m = m0 + gl.arange(0, BLOCK_M, layout=q_cols)
    in_q = offs_m < tile.q_len
    rows = grads.LSE + i_h * grads.stride_lh + tile.q_start + offs_m
    lse2 = gl.load(rows, mask=in_q, other=0.0) * LOG2E
    if not SERIAL:
        delta = gl.load(grads.DELTA + i_h * grads.stride_lh + tile.q_start + offs_m, mask=in_q, other=0.0)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
    else:
        st = warpgroup_mma_wait(num_outstanding=0, deps=(st, ))
    pt = gl.exp2(st * grads.qk_scale - gl.expand_dims(lse2, 0))
    if MASKED:  # keys past the sequence's end only feed dK/dV rows that are never stored: not tested
        # the window of the transposed problem (keys as rows), as full_query_blocks sees it
        key_sees = in_window(gl.expand_dims(offs_n, 1), gl.expand_dims(offs_m, 0), tile.kv_len, tile.q_len,
                             batch.RIGHT, batch.LEFT)
        pt = gl.where(gl.expand_dims(in_q, 0) & key_sees, pt, 0.0)
    if SERIAL:
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        dv = warpgroup_mma(pt_op, do_buf, dv, is_async=True)
        dpt = warpgroup_mma(v_buf, do_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        delta = gl.load(grads.DELTA + i_h * grads.stride_lh + tile.q_start + offs_m, mask=in_q, other=0.0)
        done = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dpt, pt_op))
        dv = done[0]
        dst_op = gl.convert_layout((pt * (done[1] - gl.expand_dims(delta, 0))).to(dtype), op_layout)
        dk = warpgroup_mma(dst_op, q_buf, dk, is_async=True)
        dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dst_op))[0]
    else:
        dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt, ))
        dst = pt * (dpt - gl.expand_dims(delta, 0))
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        dst_op = gl.convert_layout(dst.to(dtype), op_layout)
        dv = warpgroup_mma(pt_op, do_buf, dv, is_async=True)
        dk = warpgroup_mma(dst_op, q_buf, dk, is_async=True)
        done = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, pt_op, dst_op))
        dv = done[0]
        dk = done[1]
    qdo.release(it)
    return dk, dv


@gluon.jit
def _dq_chunk(it, t, C: gl.constexpr, kv_ops, stage, BLOCK_M: gl.constexpr):
    """dQ[:, chunk C] of block it = dS_0 K_0[:, C] + dS_1 K_1[:, C] (both consumers' keys), issued (async) once
    both dS^T are in shared memory. Blocks of fewer than 64 rows (jfa.hopper.config.SHORT_Q) get it transposed,
    dQ^T[chunk C] = K_0[:, C]^T dS_0^T + K_1[:, C]^T dS_1^T ([DQ_COLS, BLOCK_M]: wgmma's M is 64 rows at least)."""
    stage.wait_ds(it)
    if BLOCK_M < WG_ROWS:
        dqt_layout: gl.constexpr = _mma_layout(BLOCK_M)
        dq = gl.full([DQ_COLS, BLOCK_M], 0.0, gl.float32, layout=dqt_layout)
        for k in gl.static_range(2):
            k_cols_t = kv_ops.a_block(t, k).slice(C * DQ_COLS, DQ_COLS, dim=1).permute((1, 0))
            dq = warpgroup_mma(k_cols_t, stage.ds_buffer(it, k), dq, use_acc=k > 0, is_async=True)
    else:
        dq_layout: gl.constexpr = _mma_layout(DQ_COLS)
        dq = gl.full([BLOCK_M, DQ_COLS], 0.0, gl.float32, layout=dq_layout)
        for k in gl.static_range(2):
            k_cols = kv_ops.a_block(t, k).slice(C * DQ_COLS, DQ_COLS, dim=1)
            dq = warpgroup_mma(stage.ds_buffer(it, k).permute((1, 0)), k_cols, dq, use_acc=k > 0, is_async=True)
    return dq


@gluon.jit
def _one_pass_block(m0, it, t, dk, dv, kv_ops, qdo, stats, stage, grads, tile, offs_n, batch, i_h, want_dq,
                    WG: gl.constexpr, BLOCK_M: gl.constexpr, MASKED: gl.constexpr, DIRECT: gl.constexpr):
    """_dkdv_block's MMAs one after another with P^T, then dS^T, in shared memory (the A operands of dV's and
    dK's MMAs), and the block's dQ = dS K: both consumers' dS^T (each over its 64 keys) feed each DQ_COLS-column
    chunk, computed by its owner (jfa.hopper.dq_reduce) and handed to the writer warp, or with DIRECT, where the
    item holds every key of its sequence (want_dq), complete, stored by its owner (else the block computes no dQ:
    the dQ pass does). MASKED also zeroes keys past the sequence's end (they would reach dQ)."""
    dtype: gl.constexpr = kv_ops.a.dtype
    k_buf = kv_ops.a_block(t, WG)
    v_buf = kv_ops.b_block(t, WG)
    st_layout: gl.constexpr = _mma_layout(BLOCK_M)
    q_cols: gl.constexpr = gl.SliceLayout(0, st_layout)
    st_zero = gl.full([WG_ROWS, BLOCK_M], 0.0, gl.float32, layout=st_layout)
    q_buf, do_buf = qdo.wait(it)
    st = warpgroup_mma(k_buf, q_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    lse2, delta = stats.read(it, q_cols)
    st = warpgroup_mma_wait(num_outstanding=0, deps=(st, ))
    pt = gl.exp2(st * grads.qk_scale - gl.expand_dims(lse2, 0))
    if MASKED:
        offs_m = m0 + gl.arange(0, BLOCK_M, layout=q_cols)
        key_sees = in_window(gl.expand_dims(offs_n, 1), gl.expand_dims(offs_m, 0), tile.kv_len, tile.q_len,
                             batch.RIGHT, batch.LEFT) & gl.expand_dims(offs_n < tile.kv_len, 1)
        pt = gl.where(gl.expand_dims(offs_m < tile.q_len, 0) & key_sees, pt, 0.0)
    ds_buf = stage.ds_buffer(it, WG)
    stage.claim_ds(it)
    ds_buf.store(pt.to(dtype))
    fence_async_shared()
    dv = warpgroup_mma(ds_buf, do_buf, dv, is_async=True)
    dpt = warpgroup_mma(v_buf, do_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    done = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dpt))
    dv = done[0]
    ds_buf.store((pt * (done[1] - gl.expand_dims(delta, 0))).to(dtype))
    fence_async_shared()
    stage.publish_ds(it)
    if DIRECT:  # dK first; dQ (if this item has it) after, stored in place: chunk WG, or every other block at D=64
        dk = warpgroup_mma(ds_buf, q_buf, dk, is_async=True)
        if want_dq & ((stage.CHUNKS == 2) | (it % 2 == WG)):
            C: gl.constexpr = WG if stage.CHUNKS == 2 else 0
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(_dq_chunk(it, t, C, kv_ops, stage, BLOCK_M), ))
            if BLOCK_M < WG_ROWS:  # computed transposed (_dq_chunk)
                dq = gl.permute(dq, (1, 0))
            store_rows(grads.DQ + i_h * grads.stride_dqh + C * DQ_COLS, grads.stride_dqt,
                       (dq * grads.scale).to(dtype), m0, tile.q_start, tile.q_len)
        stage.free_ds(it)
    elif stage.CHUNKS == 2:  # consumer WG computes chunk WG of every block, before dK: the hand-over overlaps dK
        dq = _dq_chunk(it, t, WG, kv_ops, stage, BLOCK_M)
        dk = warpgroup_mma(ds_buf, q_buf, dk, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=1, deps=(dq, ))
        stage.free_ds(it)
        stage.put(WG, it, dq * grads.scale, BLOCK_M < WG_ROWS)
    else:  # one chunk: the consumers take the blocks in turn
        dk = warpgroup_mma(ds_buf, q_buf, dk, is_async=True)
        if it % 2 == WG:
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(_dq_chunk(it, t, 0, kv_ops, stage, BLOCK_M), ))
            stage.put(WG, it // 2, dq * grads.scale, BLOCK_M < WG_ROWS)
        stage.free_ds(it)
    dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk, ))
    qdo.release(it)
    return dk, dv


@gluon.jit
def _dkdv_item(WG: gl.constexpr, shape, batch, tile, t, it, kv_ops, qdo, grads, stats, stage, DIRECT: gl.constexpr):
    """Item t (its K/V landed, or waited for here) from block it on: dK, dV (and dQ) -> the next block's count."""
    dtype: gl.constexpr = kv_ops.a.dtype
    HEAD_DIM: gl.constexpr = kv_ops.a.shape[2]
    BLOCK_M: gl.constexpr = shape.BLOCK_M
    st_layout: gl.constexpr = _mma_layout(BLOCK_M)
    acc_layout: gl.constexpr = _mma_layout(HEAD_DIM)
    key_rows: gl.constexpr = gl.SliceLayout(1, st_layout)
    ONE_PASS: gl.constexpr = stage is not None
    k0 = tile.start + WG * WG_ROWS  # this warpgroup's first key
    offs_n = k0 + gl.arange(0, WG_ROWS, layout=key_rows)
    dk = gl.full([WG_ROWS, HEAD_DIM], 0.0, gl.float32, layout=acc_layout)
    dv = gl.full([WG_ROWS, HEAD_DIM], 0.0, gl.float32, layout=acc_layout)
    n_blocks = gl.maximum(gl.cdiv(tile.hi - tile.lo, BLOCK_M), 0)
    if not kv_ops.POSTED:
        kv_ops.wait(t, WG)
    # blocks [0, j_lo) and [j_hi, n_blocks) need the mask; [j_lo, j_hi) is this warpgroup's bulk
    j_lo, j_hi = full_query_blocks(k0, tile.lo, n_blocks, tile.q_len, tile.kv_len, batch.LEFT, batch.RIGHT,
                                   BLOCK_M, WG_ROWS)
    if ONE_PASS:  # keys past the sequence's end reach dQ: their blocks take the mask
        j_hi = gl.where(k0 + WG_ROWS > tile.kv_len, j_lo, j_hi)
    want_dq = tile.kv_len <= shape.BLOCK_N  # DIRECT: this item holds every key of its sequence
    for g in range(shape.GROUP):
        i_h = tile.head * shape.GROUP + g
        for seg in gl.static_range(3):
            begin = 0 if seg == 0 else (j_lo if seg == 1 else j_hi)
            end_j = j_lo if seg == 0 else (j_hi if seg == 1 else n_blocks)
            for j in range(begin, end_j):
                if ONE_PASS:
                    dk, dv = _one_pass_block(tile.lo + j * BLOCK_M, it, t, dk, dv, kv_ops, qdo, stats, stage,
                                             grads, tile, offs_n, batch, i_h, want_dq, WG, BLOCK_M, seg != 1,
                                             DIRECT)
                else:
                    dk, dv = _dkdv_block(tile.lo + j * BLOCK_M, it, t, dk, dv, kv_ops, qdo, grads, i_h,
                                         tile, offs_n, batch, WG, BLOCK_M, seg != 1, shape.SERIAL)
                it += 1
    kv_ops.release(t)  # K/V read for the last time: the producer may load the next item's
    store_rows(grads.DK + tile.head * grads.stride_dkh, grads.stride_dkt, (dk * grads.scale).to(dtype), k0,
               tile.kv_start, tile.kv_len)
    store_rows(grads.DV + tile.head * grads.stride_dvh, grads.stride_dvt, dv.to(dtype), k0, tile.kv_start,
               tile.kv_len)
    return it


@gluon.jit
def _dkdv_partition(WG: gl.constexpr, shape, work, batch, kv_ops, qdo, grads, stats, stage, DIRECT: gl.constexpr):
    """Consumer WG's items: as posted (each read after its K/V wait, up to the end mark: no global load per
    item, DkdvConfig.posted_items), or from the schedule (WorkList.item's three dependent loads per slot)."""
    BLOCK_M: gl.constexpr = shape.BLOCK_M
    it = 0
    t = 0
    if kv_ops.POSTED:
        kv_ops.wait(0, WG)
        valid = kv_ops.item(0, 4).valid
        while valid:
            it = _dkdv_item(WG, shape, batch, kv_ops.item(t, 4), t, it, kv_ops, qdo, grads, stats, stage, DIRECT)
            t += 1
            kv_ops.wait(t, WG)
            valid = kv_ops.item(t, 4).valid
    else:
        first, end = work.bounds()
        for idx in range(first, end):
            tile = work.item(idx, batch, shape.BLOCK_N, BLOCK_M, True)
            if tile.valid:
                it = _dkdv_item(WG, shape, batch, tile, t, it, kv_ops, qdo, grads, stats, stage, DIRECT)
                t += 1


@gluon.jit
def hopper_dkdv_kernel(q_desc, do_desc, k_desc, v_desc, dq_desc, DK, DV, DQ, LSE, DELTA, q_offsets, kv_offsets, tiles,
                       order, sm_start, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt, stride_dqh,
                       stride_lh, tile_capacity, heads_kv, scale, qk_scale, LEFT, RIGHT, GROUP: gl.constexpr,
                       BLOCK_M: gl.constexpr, STAGES: gl.constexpr, DQ_STAGES: gl.constexpr, SERIAL: gl.constexpr,
                       BROADCAST: gl.constexpr, ONE_PASS: gl.constexpr, DIRECT: gl.constexpr,
                       KV_SLOTS: gl.constexpr, POSTED: gl.constexpr, num_warps: gl.constexpr):
    """ONE_PASS: dQ too (DkdvConfig.one_pass), with the rows' LSE and Delta through shared memory (RowStats):
    through the writer warp into dq_desc's float32 accumulator (DQ_REDUCE), or with DIRECT, only for the sequences
    whose keys fit one item, stored into DQ (q's dtype) by the consumers (DQ_DIRECT). Else neither dq_desc nor DQ
    is used."""
    shape = Shape(GROUP, BLOCK_M, 2 * WG_ROWS, 2, SERIAL, BROADCAST)
    work = WorkList.create(tiles, order, sm_start, tile_capacity, heads_kv)
    batch = Batch.create(q_offsets, kv_offsets, LEFT, RIGHT)
    grads = DkdvGrads.create(DK, DV, DQ, LSE, DELTA, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt,
                             stride_dqh, stride_lh, scale, qk_scale)
    kv_ops = ItemOperands.alloc(k_desc, v_desc, 2, True, KV_SLOTS, POSTED)
    qdo = Ring.alloc(q_desc, do_desc, STAGES, 2, False)
    if ONE_PASS:
        stats = RowStats.alloc(BLOCK_M, STAGES)
        stage = DqStage.alloc(k_desc.dtype, dq_desc, k_desc.block_shape[1], BLOCK_M, 2, DQ_STAGES, not DIRECT)
        if DIRECT:
            gl.warp_specialize([
                (_dkdv_partition, (0, shape, work, batch, kv_ops, qdo, grads, stats, stage, True)),
                (_dkdv_partition, (1, shape, work, batch, kv_ops, qdo, grads, stats, stage, True)),
                (_load_partition, (shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, stats)),
            ], [4, 1], [240, 24])
        else:
            gl.warp_specialize([
                (_dkdv_partition, (0, shape, work, batch, kv_ops, qdo, grads, stats, stage, False)),
                (_dkdv_partition, (1, shape, work, batch, kv_ops, qdo, grads, stats, stage, False)),
                (_load_partition, (shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, stats)),
                (dq_writer_partition, (shape, work, batch, dq_desc, stage)),
            ], [4, 1, 1], [240, 24, 24])
    else:
        gl.warp_specialize([
            (_dkdv_partition, (0, shape, work, batch, kv_ops, qdo, grads, None, None, False)),
            (_dkdv_partition, (1, shape, work, batch, kv_ops, qdo, grads, None, None, False)),
            (_load_partition, (shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, None)),
        ], [4, 1], [240, 24])


def descriptors(q, dout, k, v, cfg: DkdvConfig, dq=None):
    """TMA descriptors: q and dO in block_m-row boxes, k and v in WG_ROWS-row boxes (one per consumer); DQ_REDUCE:
    the float32 dQ accumulator in [block_m, DQ_COLS] boxes (else k's stands in, unused)."""
    rows = WG_ROWS.value
    k_desc = tma_descriptor(k, rows)
    dq_desc = tma_descriptor(dq, cfg.block_m, DQ_COLS.value) if cfg.dq == DQ_REDUCE else k_desc
    return (tma_descriptor(q, cfg.block_m), tma_descriptor(dout, cfg.block_m), k_desc, tma_descriptor(v, rows),
            dq_desc)


def dkdv(q, k, v, dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast, dk, dv, dq=None,
         route=DQ_NONE):
    """dK, dV into dk, dv (k has rows; D 64/128; bf16/fp16), and dQ by `route` (jfa.hopper.config): DQ_REDUCE,
    added into dq (float32, zeroed) in the same pass: rows as dout's, or in broadcast mode one slab of Lq rows per
    CTA (num_sms of them); DQ_DIRECT, stored into dq (q's dtype) for the sequences whose keys fit one key tile."""
    dq_rows = dout.shape[0]  # the query side's rows (B * Lq in broadcast mode)
    cfg = select_dkdv(q.shape[2], route, dq_rows / max(kv_offsets.numel() - 1, 1))
    sms = num_sms(q.device)
    spec = key_tile_schedule(k.shape[0], k.shape[1], cfg, left, right, sms)
    sched = CACHE.get(kv_offsets, q_offsets, spec, dq_rows)
    q, dout, k, v = aligned(q, dout, k, v)
    dq_out = dq if route == DQ_DIRECT else dk  # (dk stands in, unused)
    hopper_dkdv_kernel[(sms, )](
        *descriptors(q, dout, k, v, cfg, dq), dk, dv, dq_out, lse, delta, q_offsets, kv_offsets, sched.tiles,
        sched.order, sched.sm_start, dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), dq_out.stride(0),
        dq_out.stride(1), lse.stride(0), sched.tiles.shape[1], k.shape[1], scale, scale * math.log2(math.e), left,
        right, GROUP=q.shape[1] // k.shape[1], BLOCK_M=cfg.block_m, STAGES=cfg.stages, DQ_STAGES=cfg.dq_stages,
        SERIAL=cfg.serial, BROADCAST=broadcast, ONE_PASS=cfg.one_pass, DIRECT=cfg.dq == DQ_DIRECT,
        KV_SLOTS=cfg.kv_slots, POSTED=cfg.posted_items, num_warps=4)


def dq_buffer(shape, dtype, device, every_row_stored: bool):
    """dQ's buffer, zeroed (the rows of queries that see no key are written by no kernel) unless every row is
    stored: in self-attention every query sees its own key, so where the dK/dV pass stores every sequence's dQ
    (DQ_DIRECT, max_kv_len <= its key tile) it writes every row."""
    return (torch.empty if every_row_stored else torch.zeros)(shape, device=device, dtype=dtype)


def backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast,
             deterministic=False, max_kv_len=None):
    """-> (dq, dk, dv) as jfa.triton.launch.backward: Delta, then by jfa.hopper.config.dq_route one pass for dK,
    dV and dQ (DQ_REDUCE: dQ reduce-added into float32; in broadcast mode one slab per CTA, summed afterwards), or
    the dK/dV pass and the dQ pass (jfa.hopper.bwd_dq), no atomics, the same bits run to run (always with
    `deterministic`), the first storing the dQ of sequences whose keys fit its key tile (DQ_DIRECT) and the second
    the rest, which is nothing when max_kv_len (the caller's bound) is at most the key tile: the dQ pass is
    skipped (walking every item to skip it took 0.2-0.3 ms on short-128)."""
    batch = kv_offsets.numel() - 1
    rows = out.shape[0]
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    if batch == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    delta = bwd_delta(out, dout, dlse, lse)
    args = (q, k, v, dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast)
    route = dq_route(q.shape[2], broadcast, k.shape[0] / batch, deterministic)
    if route == DQ_REDUCE and broadcast:  # one slab of Lq rows per CTA, summed afterwards
        batch = num_sms(q.device)
        rows = batch * q.shape[0]
    dq_dtype = torch.float32 if broadcast or route == DQ_REDUCE else q.dtype
    # DQ_DIRECT: the dK/dV pass stores the dQ of the sequences with at most its key tile of keys; the dQ pass the
    # rest, if the caller's bound does not say there is none
    skip_kv = select_dkdv(q.shape[2], route).block_n if route == DQ_DIRECT else 0
    direct_only = route == DQ_DIRECT and max_kv_len is not None and max_kv_len <= skip_kv
    dq = dq_buffer((rows, q.shape[1], q.shape[2]), dq_dtype, q.device, direct_only and q_offsets is kv_offsets)
    # no keys anywhere (a TMA descriptor needs rows: every query saw nothing), or no queries (no key was seen)
    if k.shape[0] == 0 or rows == 0:
        return sum_broadcast_dq(dq.zero_(), q, batch, broadcast), dk.zero_(), dv.zero_()
    dkdv(*args, dk, dv, dq, route)
    if route != DQ_REDUCE and not direct_only:
        dq_pass(*args, dq, skip_kv=skip_kv)
    return sum_broadcast_dq(dq, q, batch, broadcast), dk, dv
