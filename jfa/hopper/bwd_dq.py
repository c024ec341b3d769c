"""The Hopper dQ pass: a persistent, warp-specialized Gluon kernel (the hopper backend's, beside the dK/dV pass
of jfa.hopper.bwd).

Deterministic, no atomics: the structure of the forward (jfa.hopper.fwd) with a second operand. Items are
the forward's (sequence, query tile of 128 rows, head), on the same load-balanced schedule. Partitions:

  load      1 warp: per item, the Q and dO rows of both consumers (64 each), then the tile's K/V blocks
            through a STAGES-deep ring.
  dq (x2)   4 warps each: per K/V block, S = Q K^T and dP = dO V^T (wgmma), P = exp2(S - lse),
            dS = P (dP - Delta), dQ += dS K (wgmma, dS from registers). dQ is stored once per item.

In broadcast mode it writes the per-sequence float32 partials that jfa.triton.launch.backward sums over the
batch, as the portable dQ pass does.
"""
from __future__ import annotations

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from ..schedule import num_sms
from .common import aligned, tma_descriptor
from .fwd import WG_ROWS, _item

LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _load_partition(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, q_empty, kv_ready,
                    kv_empty, q_offsets, kv_offsets, tiles, order, sm_start, tile_capacity, heads, LEFT, RIGHT,
                    GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, BROADCAST: gl.constexpr):
    i_sm = gl.program_id(0)
    it = 0
    t = 0
    for idx in range(gl.load(sm_start + i_sm), gl.load(sm_start + i_sm + 1)):
        valid, i_h, m0, q_start, q_len, kv_start, kv_len, lo, hi = _item(
            tiles, order, q_offsets, kv_offsets, idx, heads, tile_capacity, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        if valid:
            q_row0 = m0 if BROADCAST else q_start + m0
            mbarrier.wait(q_empty, (t & 1) ^ 1)
            for w in gl.static_range(2):
                bar = q_ready.index(w)
                mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [q_row0 + w * WG_ROWS, i_h * HEAD_DIM], bar, q_smem.index(w))
                tma.async_copy_global_to_shared(do_desc, [q_start + m0 + w * WG_ROWS, i_h * HEAD_DIM], bar,
                                                do_smem.index(w))
            col = (i_h // GROUP) * HEAD_DIM
            for n0 in range(lo, hi, BLOCK_N):
                slot = it % STAGES
                mbarrier.wait(kv_empty.index(slot), ((it // STAGES) & 1) ^ 1)
                bar = kv_ready.index(slot)
                mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(k_desc, [kv_start + n0, col], bar, k_smem.index(slot))
                tma.async_copy_global_to_shared(v_desc, [kv_start + n0, col], bar, v_smem.index(slot))
                it += 1
            t += 1


@gluon.jit
def _dq_partition(WG: gl.constexpr, q_smem, do_smem, k_smem, v_smem, q_ready, q_empty, kv_ready, kv_empty, DQ, LSE,
                  DELTA, q_offsets, kv_offsets, tiles, order, sm_start, stride_dqt, stride_dqh, stride_lh,
                  tile_capacity, heads, scale, qk_scale, LEFT, RIGHT, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
    acc_rows: gl.constexpr = gl.SliceLayout(1, acc_layout)
    acc_cols: gl.constexpr = gl.SliceLayout(0, acc_layout)
    s_zero = gl.full([WG_ROWS, BLOCK_N], 0.0, gl.float32, layout=s_layout)
    q_buf = q_smem.index(WG)
    do_buf = do_smem.index(WG)

    i_sm = gl.program_id(0)
    it = 0
    t = 0
    for idx in range(gl.load(sm_start + i_sm), gl.load(sm_start + i_sm + 1)):
        valid, i_h, m0, q_start, q_len, kv_start, kv_len, lo, hi = _item(
            tiles, order, q_offsets, kv_offsets, idx, heads, tile_capacity, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        if valid:
            row0 = m0 + WG * WG_ROWS
            shift = kv_len - q_len
            n_blocks = gl.maximum(gl.cdiv(hi - lo, BLOCK_N), 0)
            row_last = gl.minimum(row0 + WG_ROWS, q_len) - 1
            full_lo = gl.maximum(gl.cdiv(row_last + shift - LEFT, BLOCK_N) * BLOCK_N, lo)
            full_hi = (gl.minimum(row0 + shift + RIGHT + 1, kv_len) // BLOCK_N) * BLOCK_N
            offs_m = row0 + gl.arange(0, WG_ROWS, layout=s_rows)
            in_q = offs_m < q_len
            lse2 = gl.load(LSE + i_h * stride_lh + q_start + offs_m, mask=in_q, other=0.0) * LOG2E
            delta = gl.load(DELTA + i_h * stride_lh + q_start + offs_m, mask=in_q, other=0.0)
            dq = gl.full([WG_ROWS, HEAD_DIM], 0.0, gl.float32, layout=acc_layout)
            mbarrier.wait(q_ready.index(WG), t & 1)
            if (row0 < q_len) & (n_blocks > 0):
                for j in range(0, n_blocks):
                    n0 = lo + j * BLOCK_N
                    slot = (it + j) % STAGES
                    mbarrier.wait(kv_ready.index(slot), ((it + j) // STAGES) & 1)
                    k_buf = k_smem.index(slot)
                    s = warpgroup_mma(q_buf, k_buf.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                    dp = warpgroup_mma(do_buf, v_smem.index(slot).permute((1, 0)), s_zero, use_acc=False,
                                       is_async=True)
                    s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
                    p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
                    if (n0 < full_lo) | (n0 >= full_hi):  # edge block: zero the pairs a row may not see
                        i_shift = gl.expand_dims(offs_m + shift, 1)
                        key = gl.expand_dims(n0 + gl.arange(0, BLOCK_N, layout=s_cols), 0)
                        vis = (gl.expand_dims(in_q, 1) & (key < kv_len) & (key >= i_shift - LEFT)
                               & (key <= i_shift + RIGHT))
                        p = gl.where(vis, p, 0.0)
                    dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
                    ds_op = gl.convert_layout((p * (dp - gl.expand_dims(delta, 1))).to(dtype), op_layout)
                    dq = warpgroup_mma(ds_op, k_buf, dq, is_async=True)
                    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds_op))[0]
                    mbarrier.arrive(kv_empty.index(slot), count=1)
                mbarrier.arrive(q_empty, count=1)
            else:  # rows past the sequence's end, or no keys: hand the buffers back
                mbarrier.arrive(q_empty, count=1)
                for j in range(0, n_blocks):
                    slot = (it + j) % STAGES
                    mbarrier.wait(kv_ready.index(slot), ((it + j) // STAGES) & 1)
                    mbarrier.arrive(kv_empty.index(slot), count=1)
            it += n_blocks
            t += 1
            if row0 < q_len:
                rows = row0 + gl.arange(0, WG_ROWS, layout=acc_rows)
                cols = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=acc_cols), 0)
                ptrs = DQ + gl.expand_dims((q_start + rows).to(gl.int64), 1) * stride_dqt + i_h * stride_dqh + cols
                gl.store(ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=gl.expand_dims(rows < q_len, 1))


@gluon.jit
def hopper_dq_kernel(q_desc, do_desc, k_desc, v_desc, DQ, LSE, DELTA, q_offsets, kv_offsets, tiles, order, sm_start,
                     stride_dqt, stride_dqh, stride_lh, tile_capacity, heads, scale, qk_scale, LEFT, RIGHT,
                     GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     BROADCAST: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = 2 * WG_ROWS
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2, WG_ROWS, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [2, WG_ROWS, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_empty, count=2)
    for w in gl.static_range(2):
        mbarrier.init(q_ready.index(w), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)
    gl.warp_specialize([
        (_dq_partition, (0, q_smem, do_smem, k_smem, v_smem, q_ready, q_empty, kv_ready, kv_empty, DQ, LSE, DELTA,
                         q_offsets, kv_offsets, tiles, order, sm_start, stride_dqt, stride_dqh, stride_lh,
                         tile_capacity, heads, scale, qk_scale, LEFT, RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES)),
        (_dq_partition, (1, q_smem, do_smem, k_smem, v_smem, q_ready, q_empty, kv_ready, kv_empty, DQ, LSE, DELTA,
                         q_offsets, kv_offsets, tiles, order, sm_start, stride_dqt, stride_dqh, stride_lh,
                         tile_capacity, heads, scale, qk_scale, LEFT, RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES)),
        (_load_partition, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_ready, q_empty,
                           kv_ready, kv_empty, q_offsets, kv_offsets, tiles, order, sm_start, tile_capacity, heads,
                           LEFT, RIGHT, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, BROADCAST)),
    ], [4, 1], [232, 40])


BLOCK_N = {64: 128, 128: 64}  # keys per block (registers: S and dP are [64, BLOCK_N] fp32 each)
STAGES = 3
# Items are costed in key blocks of 128 whatever BLOCK_N is (the cost only balances the SMs; the kernel
# computes its own key ranges): at D=128 the forward's default schedule has these very parameters, so the
# backward finds it in the cache instead of building another (1.5-2 ms on the H200, docs/perf-notes.md).
SCHEDULE_BLOCK_N = 128


def descriptors(q, dout, k, v, block_n: int):
    """TMA descriptors: q and dO in 64-row boxes (one per consumer), k and v in block_n-row boxes."""
    rows = WG_ROWS.value
    return tma_descriptor(q, rows), tma_descriptor(dout, rows), tma_descriptor(k, block_n), tma_descriptor(v, block_n)


def dq_pass(q, k, v, dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast, dq):
    """The dQ pass into dq, as jfa.triton.launch.bwd_dq (float32 per-sequence partials in broadcast mode)."""
    from ..jagged import kernel_window
    from . import SCHEDULES  # the hopper backend's schedule cache: one build per offsets, not per call
    block_n = BLOCK_N[q.shape[2]]
    sms = num_sms(q.device)
    sched = SCHEDULES.get(q_offsets, kv_offsets, dq.shape[0], q.shape[1], 2 * WG_ROWS.value, SCHEDULE_BLOCK_N, left,
                          right, sms)
    q, dout, k, v = aligned(q, dout, k, v)
    lk, rk = kernel_window(left, right)
    hopper_dq_kernel[(sms, )](
        *descriptors(q, dout, k, v, block_n), dq, lse, delta, q_offsets, kv_offsets, sched.tiles, sched.order,
        sched.sm_start, dq.stride(0), dq.stride(1), lse.stride(0), sched.tiles.shape[1], q.shape[1], scale,
        scale * math.log2(math.e), lk, rk, GROUP=q.shape[1] // k.shape[1], HEAD_DIM=q.shape[2], BLOCK_N=block_n,
        STAGES=STAGES, BROADCAST=broadcast, num_warps=4)
