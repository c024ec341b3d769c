"""The Hopper backward: Delta (the portable preprocess), then two persistent, warp-specialized Gluon passes,
dK/dV (this file) and dQ (jfa.hopper.bwd_dq). Deterministic: no atomics anywhere.

Glossary as jfa/geometry.py, aggregates and barrier protocol as jfa/hopper/common.py, the math as
jfa/triton/kernels/bwd.py, computed transposed (S^T = K Q^T, so no tile is transposed in registers).

The dK/dV pass: each CTA loops over its items (key tile of BLOCK_N = 128 keys, kv head), costed by the query
blocks that see the tile (jfa.hopper.config.key_tile_schedule). Partitions:

  load      1 warp: per item, the K and V rows of both consumers (ItemOperands), then (Q, dO) blocks of
            BLOCK_M query rows, for every query head of the GQA group, through a STAGES-deep Ring.
  dkdv      2 x 4 warps (consumer w owns keys [n0 + 64 w, n0 + 64 w + 64)): per (Q, dO) block, on wgmma:
  (x2)      S^T = K Q^T and dP^T = V dO^T; P^T = exp2(S^T - lse), dS^T = P^T (dP^T - Delta);
            dV += P^T dO and dK += dS^T Q with P^T, dS^T from registers. dK and dV stay in registers over the
            whole item (GQA group included: no atomics) and are stored once. Each item's blocks run as three
            loops: masked head, mask-free bulk, masked tail (jfa.geometry.full_query_blocks per warpgroup).
"""
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from ..geometry import full_query_blocks, in_window
from ..runtime import num_sms
from ..schedule import CACHE
from ..triton.launch import bwd_delta, sum_broadcast_dq
from .bwd_dq import dq_pass
from .common import WG_ROWS, Batch, ItemOperands, Ring, Shape, WorkList, aggregate, aligned, tma_descriptor
from .config import DkdvConfig, key_tile_schedule, select_dkdv

LOG2E = gl.constexpr(1.4426950408889634)


@aggregate
class DkdvGrads:
    """What the consumers read per row (LSE, Delta) and write per item (dK, dV), with the scales."""
    DK: gl.tensor
    DV: gl.tensor
    LSE: gl.tensor
    DELTA: gl.tensor
    stride_dkt: gl.tensor
    stride_dkh: gl.tensor
    stride_dvt: gl.tensor
    stride_dvh: gl.tensor
    stride_lh: gl.tensor
    scale: gl.tensor
    qk_scale: gl.tensor

    @constexpr_function
    def __init__(self, DK, DV, LSE, DELTA, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_lh, scale,
                 qk_scale):
        self.DK = DK
        self.DV = DV
        self.LSE = LSE
        self.DELTA = DELTA
        self.stride_dkt = stride_dkt
        self.stride_dkh = stride_dkh
        self.stride_dvt = stride_dvt
        self.stride_dvh = stride_dvh
        self.stride_lh = stride_lh
        self.scale = scale
        self.qk_scale = qk_scale

    @gluon.jit
    def create(DK, DV, LSE, DELTA, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_lh, scale, qk_scale):
        return DkdvGrads(DK, DV, LSE, DELTA, gl.to_tensor(stride_dkt), gl.to_tensor(stride_dkh),
                         gl.to_tensor(stride_dvt), gl.to_tensor(stride_dvh), gl.to_tensor(stride_lh), scale,
                         qk_scale)


@gluon.jit
def _load_partition(shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo):
    HEAD_DIM: gl.constexpr = q_desc.block_shape[1]
    BLOCK_M: gl.constexpr = shape.BLOCK_M
    it = 0  # (Q, dO) blocks loaded so far
    t = 0  # items loaded so far
    first, end = work.bounds()
    for idx in range(first, end):
        tile = work.item(idx, batch, shape.BLOCK_N, BLOCK_M, True)
        if tile.valid:
            kv_ops.acquire(t)  # both consumers have stored the previous item's dK, dV
            for w in gl.static_range(2):
                row = tile.kv_start + tile.start + w * WG_ROWS
                kv_ops.load(w, k_desc, [row, tile.head * HEAD_DIM], v_desc, [row, tile.head * HEAD_DIM])
            for g in range(shape.GROUP):
                col = (tile.head * shape.GROUP + g) * HEAD_DIM
                for m0 in range(tile.lo, tile.hi, BLOCK_M):
                    q_row = m0 if shape.BROADCAST else tile.q_start + m0  # broadcast: one dense q
                    qdo.fill(it, q_desc, [q_row, col], do_desc, [tile.q_start + m0, col])
                    it += 1
            t += 1


@gluon.jit
def _dkdv_block(m0, it, dk, dv, k_buf, v_buf, qdo, grads, i_h, tile, offs_n, batch, BLOCK_M: gl.constexpr,
                MASKED: gl.constexpr, SERIAL: gl.constexpr):
    """One (Q, dO) block of BLOCK_M query rows against this warpgroup's keys: dV += P^T dO, dK += dS^T Q.
    MASKED: zero the pairs outside the window and the queries past the sequence's end (else a bulk block).
    SERIAL: S^T, then dV's MMA, then dP^T, then dK's (fewer live registers); else S^T and dP^T together."""
    dtype: gl.constexpr = k_buf.dtype
    HEAD_DIM: gl.constexpr = k_buf.shape[1]
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
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
def _dkdv_partition(WG: gl.constexpr, shape, work, batch, kv_ops, qdo, grads):
    dtype: gl.constexpr = kv_ops.a.dtype
    HEAD_DIM: gl.constexpr = kv_ops.a.shape[2]
    BLOCK_M: gl.constexpr = shape.BLOCK_M
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    key_rows: gl.constexpr = gl.SliceLayout(1, st_layout)
    acc_rows: gl.constexpr = gl.SliceLayout(1, acc_layout)
    acc_cols: gl.constexpr = gl.SliceLayout(0, acc_layout)
    k_buf = kv_ops.a.index(WG)
    v_buf = kv_ops.b.index(WG)

    it = 0
    t = 0
    first, end = work.bounds()
    for idx in range(first, end):
        tile = work.item(idx, batch, shape.BLOCK_N, BLOCK_M, True)
        if tile.valid:
            k0 = tile.start + WG * WG_ROWS  # this warpgroup's first key
            offs_n = k0 + gl.arange(0, WG_ROWS, layout=key_rows)
            dk = gl.full([WG_ROWS, HEAD_DIM], 0.0, gl.float32, layout=acc_layout)
            dv = gl.full([WG_ROWS, HEAD_DIM], 0.0, gl.float32, layout=acc_layout)
            n_blocks = gl.maximum(gl.cdiv(tile.hi - tile.lo, BLOCK_M), 0)
            kv_ops.wait(t, WG)
            # blocks [0, j_lo) and [j_hi, n_blocks) need the mask; [j_lo, j_hi) is this warpgroup's bulk
            j_lo, j_hi = full_query_blocks(k0, tile.lo, n_blocks, tile.q_len, tile.kv_len, batch.LEFT, batch.RIGHT,
                                           BLOCK_M, WG_ROWS)
            for g in range(shape.GROUP):
                i_h = tile.head * shape.GROUP + g
                for seg in gl.static_range(3):
                    begin = 0 if seg == 0 else (j_lo if seg == 1 else j_hi)
                    end_j = j_lo if seg == 0 else (j_hi if seg == 1 else n_blocks)
                    for j in range(begin, end_j):
                        dk, dv = _dkdv_block(tile.lo + j * BLOCK_M, it, dk, dv, k_buf, v_buf, qdo, grads, i_h, tile,
                                             offs_n, batch, BLOCK_M, seg != 1, shape.SERIAL)
                        it += 1
            kv_ops.release()  # K/V read for the last time: the producer may load the next item's
            t += 1
            rows = k0 + gl.arange(0, WG_ROWS, layout=acc_rows)
            cols = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=acc_cols), 0)
            keep = gl.expand_dims(rows < tile.kv_len, 1)
            row_off = gl.expand_dims((tile.kv_start + rows).to(gl.int64), 1)
            gl.store(grads.DK + row_off * grads.stride_dkt + tile.head * grads.stride_dkh + cols,
                     (dk * grads.scale).to(dtype), mask=keep)
            gl.store(grads.DV + row_off * grads.stride_dvt + tile.head * grads.stride_dvh + cols, dv.to(dtype),
                     mask=keep)


@gluon.jit
def hopper_dkdv_kernel(q_desc, do_desc, k_desc, v_desc, DK, DV, LSE, DELTA, q_offsets, kv_offsets, tiles, order,
                       sm_start, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_lh, tile_capacity, heads_kv,
                       scale, qk_scale, LEFT, RIGHT, GROUP: gl.constexpr, BLOCK_M: gl.constexpr,
                       STAGES: gl.constexpr, SERIAL: gl.constexpr, BROADCAST: gl.constexpr,
                       num_warps: gl.constexpr):
    shape = Shape(GROUP, BLOCK_M, 2 * WG_ROWS, 2, SERIAL, BROADCAST)
    work = WorkList.create(tiles, order, sm_start, tile_capacity, heads_kv)
    batch = Batch.create(q_offsets, kv_offsets, LEFT, RIGHT)
    grads = DkdvGrads.create(DK, DV, LSE, DELTA, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_lh, scale,
                             qk_scale)
    kv_ops = ItemOperands.alloc(k_desc, v_desc, 2, True)
    qdo = Ring.alloc(q_desc, do_desc, STAGES, 2, False)
    gl.warp_specialize([
        (_dkdv_partition, (0, shape, work, batch, kv_ops, qdo, grads)),
        (_dkdv_partition, (1, shape, work, batch, kv_ops, qdo, grads)),
        (_load_partition, (shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo)),
    ], [4, 1], [240, 24])


def descriptors(q, dout, k, v, cfg: DkdvConfig):
    """TMA descriptors: q and dO in block_m-row boxes, k and v in WG_ROWS-row boxes (one per consumer)."""
    rows = WG_ROWS.value
    return (tma_descriptor(q, cfg.block_m), tma_descriptor(dout, cfg.block_m), tma_descriptor(k, rows),
            tma_descriptor(v, rows))


def dkdv(q, k, v, dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast, dk, dv):
    """The dK/dV pass into dk, dv (k has rows; D 64/128; bf16/fp16)."""
    cfg = select_dkdv(q.shape[2])
    sms = num_sms(q.device)
    dq_rows = dout.shape[0]  # the query side's rows (B * Lq in broadcast mode)
    spec = key_tile_schedule(k.shape[0], k.shape[1], cfg, left, right, sms)
    sched = CACHE.get(kv_offsets, q_offsets, spec, dq_rows)
    q, dout, k, v = aligned(q, dout, k, v)
    hopper_dkdv_kernel[(sms, )](
        *descriptors(q, dout, k, v, cfg), dk, dv, lse, delta, q_offsets, kv_offsets, sched.tiles, sched.order,
        sched.sm_start, dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), lse.stride(0),
        sched.tiles.shape[1], k.shape[1], scale, scale * math.log2(math.e), left, right,
        GROUP=q.shape[1] // k.shape[1], BLOCK_M=cfg.block_m, STAGES=cfg.stages, SERIAL=cfg.serial,
        BROADCAST=broadcast, num_warps=4)


def backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast,
             deterministic=False):
    """-> (dq, dk, dv) as jfa.triton.launch.backward: Delta, the dK/dV pass, the dQ pass (jfa.hopper.bwd_dq),
    and in broadcast mode the sum of dQ's per-sequence partials. Deterministic whatever `deterministic` says."""
    batch = kv_offsets.numel() - 1
    rows = out.shape[0]
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    if batch == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    delta = bwd_delta(out, dout, dlse, lse)
    args = (q, k, v, dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast)
    dq = torch.empty(rows, q.shape[1], q.shape[2], device=q.device, dtype=torch.float32 if broadcast else q.dtype)
    if k.shape[0] == 0:  # no keys anywhere (a TMA descriptor needs rows): every query saw nothing
        return sum_broadcast_dq(dq.zero_(), q, batch, broadcast), dk, dv
    dkdv(*args, dk, dv)
    if rows > 0:
        dq_pass(*args, dq)
    return sum_broadcast_dq(dq, q, batch, broadcast), dk, dv
