"""The Hopper backward: a persistent, warp-specialized Gluon dK/dV pass (the hopper backend's backward, with the
dQ pass of jfa.hopper.bwd_dq; tests/test_hopper.py checks it in every mode, tests/test_aot.py its build).

Glossary as jfa/triton/kernels/common.py and the backward's math as jfa/triton/kernels/bwd.py (computed
transposed: S^T = K Q^T, so no tile is transposed in registers). Delta comes from the portable preprocess
(jfa.triton.launch.bwd_delta) and dQ from the Gluon dQ pass (jfa.hopper.bwd_dq).

Each CTA loops over its schedule's items (sequence, key tile of BLOCK_N = 128 keys, kv head), costed by the
query blocks that see the tile (jfa.schedule with the roles of q and kv swapped). Partitions:

  load      1 warp: per item, TMA-loads the K and V rows of both consumers, then streams (Q, dO) blocks of
            BLOCK_M query rows, for every query head of the GQA group, through a STAGES-deep ring.
  dkdv      2 x 4 warps (consumer w owns keys [n0 + 64 w, n0 + 64 w + 64)): per (Q, dO) block, on wgmma:
  (x2)      S^T = K Q^T and dP^T = V dO^T; P^T = exp2(S^T - lse), dS^T = P^T (dP^T - Delta);
            dV += P^T dO and dK += dS^T Q with P^T, dS^T from registers. dK and dV stay in registers over
            the whole item (GQA group included: deterministic, no atomics) and are stored once.

Config.fuse_dq (variant "fused") makes it the whole backward: dS^T goes through shared memory and each
consumer adds its half of D of dQ = dS K with float32 atomics (_dk_and_dq), so the dQ pass is not needed. It
is correct in every mode on the H200 but measured 0.76-0.98x of the two passes (docs/perf-notes.md).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ..schedule import num_sms
from .common import aligned, tma_descriptor

KEYS_PER_WG = gl.constexpr(64)  # keys per consumer warpgroup (one wgmma m64 instruction tall)
LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _kv_item(tiles, order, q_offsets, kv_offsets, idx, heads_kv, tile_capacity, LEFT, RIGHT,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Schedule slot idx -> (valid, kv head, first key n0, q_start, q_len, kv_start, kv_len, query rows
    [lo, hi) that see keys [n0, n0 + BLOCK_N)): the transpose of common.key_blocks (common.query_blocks)."""
    item = gl.load(order + idx)
    valid = item >= 0
    item = gl.maximum(item, 0)
    i_tile = item // heads_kv
    i_hk = item % heads_kv
    seq = gl.maximum(gl.load(tiles + i_tile), 0)
    n0 = gl.load(tiles + tile_capacity + i_tile) * BLOCK_N
    q_start = gl.load(q_offsets + seq).to(gl.int32)
    q_len = gl.load(q_offsets + seq + 1).to(gl.int32) - q_start
    kv_start = gl.load(kv_offsets + seq).to(gl.int32)
    kv_len = gl.load(kv_offsets + seq + 1).to(gl.int32) - kv_start
    shift = kv_len - q_len
    n_last = gl.minimum(n0 + BLOCK_N, kv_len) - 1
    lo = (gl.maximum(n0 - shift - RIGHT, 0) // BLOCK_M) * BLOCK_M
    hi = gl.minimum(n_last - shift + LEFT + 1, q_len)
    return valid, i_hk, n0, q_start, q_len, kv_start, kv_len, lo, hi


@gluon.jit
def _load_partition(q_desc, do_desc, k_desc, v_desc, k_smem, v_smem, q_smem, do_smem, kv_ready, kv_empty,
                    qdo_ready, qdo_empty, q_offsets, kv_offsets, tiles, order, sm_start, tile_capacity, heads_kv,
                    LEFT, RIGHT, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, BROADCAST: gl.constexpr):
    i_sm = gl.program_id(0)
    it = 0  # (Q, dO) blocks loaded so far: ring slot it % STAGES, phase (it // STAGES) & 1
    t = 0  # items loaded so far: K/V buffer phase t & 1
    for idx in range(gl.load(sm_start + i_sm), gl.load(sm_start + i_sm + 1)):
        valid, i_hk, n0, q_start, q_len, kv_start, kv_len, lo, hi = _kv_item(
            tiles, order, q_offsets, kv_offsets, idx, heads_kv, tile_capacity, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        if valid:
            mbarrier.wait(kv_empty, (t & 1) ^ 1)  # both consumers have stored the previous item's dK, dV
            for w in gl.static_range(2):
                bar = kv_ready.index(w)
                mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
                row = kv_start + n0 + w * KEYS_PER_WG
                tma.async_copy_global_to_shared(k_desc, [row, i_hk * HEAD_DIM], bar, k_smem.index(w))
                tma.async_copy_global_to_shared(v_desc, [row, i_hk * HEAD_DIM], bar, v_smem.index(w))
            for g in range(GROUP):
                col = (i_hk * GROUP + g) * HEAD_DIM
                for m0 in range(lo, hi, BLOCK_M):
                    slot = it % STAGES
                    mbarrier.wait(qdo_empty.index(slot), ((it // STAGES) & 1) ^ 1)
                    bar = qdo_ready.index(slot)
                    mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
                    q_row = m0 if BROADCAST else q_start + m0
                    tma.async_copy_global_to_shared(q_desc, [q_row, col], bar, q_smem.index(slot))
                    tma.async_copy_global_to_shared(do_desc, [q_start + m0, col], bar, do_smem.index(slot))
                    it += 1
            t += 1


@gluon.jit
def _full_blocks(lo, n_blocks, k0, q_len, shift, LEFT, RIGHT, BLOCK_M: gl.constexpr):
    """-> [j_lo, j_hi): the query blocks j (rows lo + j*BLOCK_M, ...) that need no mask for the keys
    [k0, k0 + KEYS_PER_WG): every row exists and sees every key (the `full` test of _dkdv_block, solved for j)."""
    # the last row exists: m0 <= q_len - BLOCK_M; it sees the first key: m0 <= k0 - BLOCK_M + 1 - shift + LEFT
    top = gl.minimum(q_len - BLOCK_M, k0 - BLOCK_M + 1 - shift + LEFT) - lo
    j_hi = gl.where(top >= 0, top // BLOCK_M + 1, 0)
    # the first row sees the last key: m0 >= k0 + KEYS_PER_WG - 1 - shift - RIGHT
    bottom = k0 + KEYS_PER_WG - 1 - shift - RIGHT - lo
    j_lo = gl.where(bottom > 0, (bottom + BLOCK_M - 1) // BLOCK_M, 0)
    j_lo = gl.minimum(j_lo, n_blocks)
    return j_lo, gl.maximum(gl.minimum(j_hi, n_blocks), j_lo)


@gluon.jit
def _visible(pt, offs_m, in_q, offs_n, kv_len, shift, LEFT, RIGHT, FUSE_DQ: gl.constexpr):
    """P^T with the pairs outside the window (or past the sequence's queries) zeroed; with FUSE_DQ, past its
    keys too: such a key only feeds its own dK/dV row, which is never stored, but the fused dQ sums over keys.
    (Only there: the test costs 3-9% in the two-pass backward, docs/perf-notes.md.)"""
    i_shift = gl.expand_dims(offs_m + shift, 0)
    key = gl.expand_dims(offs_n, 1)
    vis = gl.expand_dims(in_q, 0) & (key >= i_shift - LEFT) & (key <= i_shift + RIGHT)
    if FUSE_DQ:
        vis = vis & (key < kv_len)
    return gl.where(vis, pt, 0.0)


@gluon.jit
def _dk_and_dq(dst, dk, it, WG: gl.constexpr, q_buf, k_smem, ds_smem, ds_ready, ds_free, DQ, stride_dqt, stride_dqh,
               i_h, q_start, q_len, m0, scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr):
    """The fused dQ (FUSE_DQ): dS^T goes through shared memory, where it is dK's A operand and, with the other
    warpgroup's, dQ's: warpgroup WG computes dQ[:, WG half of D] = dS (all 128 keys) K[:, half] and adds it to
    DQ (float32) with atomics. -> dk (waited). ds buffer it % 2 is double-buffered across the two warpgroups:
    ds_ready (both halves stored) and ds_free (both warpgroups' MMAs done reading)."""
    dtype: gl.constexpr = q_buf.dtype
    DQ_COLS: gl.constexpr = HEAD_DIM // 2
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_COLS, 16])
    b = it % 2
    phase = (it // 2) & 1
    mbarrier.wait(ds_free.index(b), phase ^ 1)
    ds_buf = ds_smem.index(2 * b + WG)
    ds_buf.store(dst.to(dtype))
    fence_async_shared()
    mbarrier.arrive(ds_ready.index(b), count=1)
    dk = warpgroup_mma(ds_buf, q_buf, dk, is_async=True)
    mbarrier.wait(ds_ready.index(b), phase)
    dq = gl.full([BLOCK_M, DQ_COLS], 0.0, gl.float32, layout=dq_layout)
    for w in gl.static_range(2):
        dq = warpgroup_mma(ds_smem.index(2 * b + w).permute((1, 0)), k_smem.index(w).slice(WG * DQ_COLS, DQ_COLS, 1),
                           dq, use_acc=w > 0, is_async=True)
    done = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dq))
    mbarrier.arrive(ds_free.index(b), count=1)
    rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    cols = WG * DQ_COLS + gl.arange(0, DQ_COLS, layout=gl.SliceLayout(0, dq_layout))
    ptrs = (DQ + gl.expand_dims((q_start + rows).to(gl.int64), 1) * stride_dqt + i_h * stride_dqh
            + gl.expand_dims(cols, 0))
    keep = gl.expand_dims(rows < q_len, 1) & gl.expand_dims(cols < HEAD_DIM, 0)
    gl.atomic_add(ptrs, done[1] * scale, mask=keep, sem="relaxed")
    return done[0]


@gluon.jit
def _dkdv_block(m0, it, dk, dv, WG: gl.constexpr, k_smem, v_smem, q_smem, do_smem, qdo_ready, qdo_empty, ds_smem,
                ds_ready, ds_free, LSE, DELTA, DQ, stride_dqt, stride_dqh, i_h, stride_lh, q_start, q_len, kv_len, k0,
                offs_n, shift, scale, qk_scale, LEFT, RIGHT, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                STAGES: gl.constexpr, MASK: gl.constexpr, SERIAL: gl.constexpr, FUSE_DQ: gl.constexpr):
    """One (Q, dO) block of BLOCK_M query rows against this warpgroup's keys: dV += P^T dO, dK += dS^T Q
    (and, FUSE_DQ, dQ += dS K by atomics: _dk_and_dq).
    MASK: 0 = the block needs no mask (a peeled bulk block), 1 = always masked, 2 = tested at run time.
    SERIAL: S^T, then dV's MMA, then dP^T, then dK's (fewer live registers: 64-row blocks at D=128); else
    S^T and dP^T are issued together (more overlap, more registers)."""
    dtype: gl.constexpr = q_smem.dtype
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    q_cols: gl.constexpr = gl.SliceLayout(0, st_layout)
    st_zero = gl.full([KEYS_PER_WG, BLOCK_M], 0.0, gl.float32, layout=st_layout)
    k_buf = k_smem.index(WG)
    v_buf = v_smem.index(WG)
    slot = it % STAGES
    mbarrier.wait(qdo_ready.index(slot), (it // STAGES) & 1)
    q_buf = q_smem.index(slot)
    do_buf = do_smem.index(slot)
    st = warpgroup_mma(k_buf, q_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    if not SERIAL:
        dpt = warpgroup_mma(v_buf, do_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    offs_m = m0 + gl.arange(0, BLOCK_M, layout=q_cols)
    in_q = offs_m < q_len
    lse2 = gl.load(LSE + i_h * stride_lh + q_start + offs_m, mask=in_q, other=0.0) * LOG2E
    if not SERIAL:
        delta = gl.load(DELTA + i_h * stride_lh + q_start + offs_m, mask=in_q, other=0.0)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
    else:
        st = warpgroup_mma_wait(num_outstanding=0, deps=(st, ))
    pt = gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0))
    if MASK == 2:
        # the block needs the mask unless all its queries exist and see all this warpgroup's keys
        full = ((m0 + BLOCK_M <= q_len) & (k0 >= m0 + BLOCK_M - 1 + shift - LEFT)
                & (k0 + KEYS_PER_WG - 1 <= m0 + shift + RIGHT))
        if FUSE_DQ:
            full = full & (k0 + KEYS_PER_WG <= kv_len)
        if not full:
            pt = _visible(pt, offs_m, in_q, offs_n, kv_len, shift, LEFT, RIGHT, FUSE_DQ)
    if MASK == 1:
        pt = _visible(pt, offs_m, in_q, offs_n, kv_len, shift, LEFT, RIGHT, FUSE_DQ)
    if SERIAL:
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        dv = warpgroup_mma(pt_op, do_buf, dv, is_async=True)
        dpt = warpgroup_mma(v_buf, do_buf.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        delta = gl.load(DELTA + i_h * stride_lh + q_start + offs_m, mask=in_q, other=0.0)
        done = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dpt, pt_op))
        dv = done[0]
        dst = pt * (done[1] - gl.expand_dims(delta, 0))
        if FUSE_DQ:
            dk = _dk_and_dq(dst, dk, it, WG, q_buf, k_smem, ds_smem, ds_ready, ds_free, DQ, stride_dqt, stride_dqh,
                            i_h, q_start, q_len, m0, scale, HEAD_DIM, BLOCK_M)
        else:
            dst_op = gl.convert_layout(dst.to(dtype), op_layout)
            dk = warpgroup_mma(dst_op, q_buf, dk, is_async=True)
            dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dst_op))[0]
    else:
        dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt, ))
        dst = pt * (dpt - gl.expand_dims(delta, 0))
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        if FUSE_DQ:
            dv = warpgroup_mma(pt_op, do_buf, dv, is_async=True)
            dk = _dk_and_dq(dst, dk, it, WG, q_buf, k_smem, ds_smem, ds_ready, ds_free, DQ, stride_dqt, stride_dqh,
                            i_h, q_start, q_len, m0, scale, HEAD_DIM, BLOCK_M)
            dv = warpgroup_mma_wait(num_outstanding=0, deps=(dv, pt_op))[0]  # already done: waited with dk
        else:
            dst_op = gl.convert_layout(dst.to(dtype), op_layout)
            dv = warpgroup_mma(pt_op, do_buf, dv, is_async=True)
            dk = warpgroup_mma(dst_op, q_buf, dk, is_async=True)
            done = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, pt_op, dst_op))
            dv = done[0]
            dk = done[1]
    mbarrier.arrive(qdo_empty.index(slot), count=1)
    return dk, dv


@gluon.jit
def _dkdv_partition(WG: gl.constexpr, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_ready, kv_empty, qdo_ready,
                    qdo_empty, ds_ready, ds_free, DK, DV, DQ, LSE, DELTA, q_offsets, kv_offsets, tiles, order,
                    sm_start, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt, stride_dqh, stride_lh,
                    tile_capacity, heads_kv, scale, qk_scale, LEFT, RIGHT, GROUP: gl.constexpr,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    PEEL: gl.constexpr, SERIAL: gl.constexpr, FUSE_DQ: gl.constexpr):
    """PEEL: each item's query blocks run as three loops (masked head, mask-free bulk, masked tail) instead of
    one loop that tests every block. FUSE_DQ: the two warpgroups also compute dQ (_dk_and_dq), in lockstep:
    both walk the same blocks in the same order."""
    dtype: gl.constexpr = q_smem.dtype
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    key_rows: gl.constexpr = gl.SliceLayout(1, st_layout)
    acc_rows: gl.constexpr = gl.SliceLayout(1, acc_layout)
    acc_cols: gl.constexpr = gl.SliceLayout(0, acc_layout)

    i_sm = gl.program_id(0)
    it = 0
    t = 0
    for idx in range(gl.load(sm_start + i_sm), gl.load(sm_start + i_sm + 1)):
        valid, i_hk, n0, q_start, q_len, kv_start, kv_len, lo, hi = _kv_item(
            tiles, order, q_offsets, kv_offsets, idx, heads_kv, tile_capacity, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        if valid:
            k0 = n0 + WG * KEYS_PER_WG  # this warpgroup's first key
            shift = kv_len - q_len
            offs_n = k0 + gl.arange(0, KEYS_PER_WG, layout=key_rows)
            dk = gl.full([KEYS_PER_WG, HEAD_DIM], 0.0, gl.float32, layout=acc_layout)
            dv = gl.full([KEYS_PER_WG, HEAD_DIM], 0.0, gl.float32, layout=acc_layout)
            n_blocks = gl.maximum(gl.cdiv(hi - lo, BLOCK_M), 0)
            mbarrier.wait(kv_ready.index(WG), t & 1)
            if FUSE_DQ:  # dQ reads the other warpgroup's keys too
                mbarrier.wait(kv_ready.index(1 - WG), t & 1)
            if PEEL:  # masked head [0, j_lo), mask-free bulk [j_lo, j_hi), masked tail [j_hi, n_blocks)
                j_lo, j_hi = _full_blocks(lo, n_blocks, k0, q_len, shift, LEFT, RIGHT, BLOCK_M)
                if FUSE_DQ:
                    if k0 + KEYS_PER_WG > kv_len:  # keys past the sequence: every block masked (_visible)
                        j_lo = n_blocks
                        j_hi = n_blocks
            else:  # one loop over every block, each tested at run time
                j_lo = n_blocks
                j_hi = n_blocks
            for g in range(GROUP):
                i_h = i_hk * GROUP + g
                for seg in gl.static_range(3 if PEEL else 1):
                    begin = 0 if seg == 0 else (j_lo if seg == 1 else j_hi)
                    end = j_lo if seg == 0 else (j_hi if seg == 1 else n_blocks)
                    for j in range(begin, end):
                        dk, dv = _dkdv_block(lo + j * BLOCK_M, it, dk, dv, WG, k_smem, v_smem, q_smem, do_smem,
                                             qdo_ready, qdo_empty, ds_smem, ds_ready, ds_free, LSE, DELTA, DQ,
                                             stride_dqt, stride_dqh, i_h, stride_lh, q_start, q_len, kv_len, k0,
                                             offs_n, shift, scale, qk_scale, LEFT, RIGHT, HEAD_DIM, BLOCK_M, STAGES,
                                             2 if not PEEL else (0 if seg == 1 else 1), SERIAL, FUSE_DQ)  # MASK
                        it += 1
            mbarrier.arrive(kv_empty, count=1)  # K/V read for the last time: the producer may load the next
            t += 1
            rows = k0 + gl.arange(0, KEYS_PER_WG, layout=acc_rows)
            cols = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=acc_cols), 0)
            keep = gl.expand_dims(rows < kv_len, 1)
            row_off = gl.expand_dims((kv_start + rows).to(gl.int64), 1)
            gl.store(DK + row_off * stride_dkt + i_hk * stride_dkh + cols, (dk * scale).to(dtype), mask=keep)
            gl.store(DV + row_off * stride_dvt + i_hk * stride_dvh + cols, dv.to(dtype), mask=keep)


@gluon.jit
def hopper_dkdv_kernel(q_desc, do_desc, k_desc, v_desc, DK, DV, DQ, LSE, DELTA, q_offsets, kv_offsets, tiles, order,
                       sm_start, stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt, stride_dqh, stride_lh,
                       tile_capacity, heads_kv, scale, qk_scale, LEFT, RIGHT, GROUP: gl.constexpr,
                       HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, BROADCAST: gl.constexpr,
                       PEEL: gl.constexpr, SERIAL: gl.constexpr, FUSE_DQ: gl.constexpr, num_warps: gl.constexpr):
    """DQ (FUSE_DQ): float32 [rows, Hq, D], zeroed, where dQ is added (per-sequence partials in broadcast mode);
    unused otherwise."""
    BLOCK_N: gl.constexpr = 2 * KEYS_PER_WG
    dtype: gl.constexpr = q_desc.dtype
    k_smem = gl.allocate_shared_memory(dtype, [2, KEYS_PER_WG, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, KEYS_PER_WG, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    # dS^T of (2 buffers) x (2 warpgroups) for the fused dQ; one unused buffer otherwise
    ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    ds_smem = gl.allocate_shared_memory(dtype, [4 if FUSE_DQ else 1, KEYS_PER_WG, BLOCK_M], ds_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    qdo_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qdo_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_empty, count=2)
    for w in gl.static_range(2):
        mbarrier.init(kv_ready.index(w), count=1)
        if FUSE_DQ:
            mbarrier.init(ds_ready.index(w), count=2)
            mbarrier.init(ds_free.index(w), count=2)
    for i in gl.static_range(STAGES):
        mbarrier.init(qdo_ready.index(i), count=1)
        mbarrier.init(qdo_empty.index(i), count=2)
    gl.warp_specialize([
        (_dkdv_partition, (0, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_ready, kv_empty, qdo_ready, qdo_empty,
                           ds_ready, ds_free, DK, DV, DQ, LSE, DELTA, q_offsets, kv_offsets, tiles, order, sm_start,
                           stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt, stride_dqh, stride_lh,
                           tile_capacity, heads_kv, scale, qk_scale, LEFT, RIGHT, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N,
                           STAGES, PEEL, SERIAL, FUSE_DQ)),
        (_dkdv_partition, (1, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_ready, kv_empty, qdo_ready, qdo_empty,
                           ds_ready, ds_free, DK, DV, DQ, LSE, DELTA, q_offsets, kv_offsets, tiles, order, sm_start,
                           stride_dkt, stride_dkh, stride_dvt, stride_dvh, stride_dqt, stride_dqh, stride_lh,
                           tile_capacity, heads_kv, scale, qk_scale, LEFT, RIGHT, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N,
                           STAGES, PEEL, SERIAL, FUSE_DQ)),
        (_load_partition, (q_desc, do_desc, k_desc, v_desc, k_smem, v_smem, q_smem, do_smem, kv_ready, kv_empty,
                           qdo_ready, qdo_empty, q_offsets, kv_offsets, tiles, order, sm_start, tile_capacity,
                           heads_kv, LEFT, RIGHT, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, BROADCAST)),
    ], [4, 1], [240, 24])


def descriptors(q, dout, k, v, block_m: int):
    """TMA descriptors: q and dO in block_m-row boxes, k and v in 64-row boxes (one per consumer)."""
    rows = KEYS_PER_WG.value
    return tma_descriptor(q, block_m), tma_descriptor(dout, block_m), tma_descriptor(k, rows), tma_descriptor(v, rows)


@dataclass(frozen=True)
class Config:
    block_m: int  # query rows per (Q, dO) block
    peel: bool = False  # masked head / mask-free bulk / masked tail loops instead of a test per block
    serial: bool = False  # S^T, dV, dP^T, dK one after another (fewer live registers)
    fuse_dq: bool = False  # dQ too, added with float32 atomics (one pass; not bit-reproducible run to run)


VARIANTS = {  # name -> head dim -> Config; A/B'd by benchmarks/ab_backward.py
    # at D=128, 64-row blocks with S^T and dP^T in flight together spill (ptxas: 836 B at 240 registers)
    "m32": {64: Config(64), 128: Config(32)},
    "peel": {64: Config(64, peel=True), 128: Config(32, peel=True)},
    "serial": {64: Config(64, serial=True), 128: Config(64, serial=True)},
    "serial-peel": {64: Config(64, peel=True, serial=True), 128: Config(64, peel=True, serial=True)},
    # the fastest two-pass variant per head dim on the H200 (docs/perf-notes.md, session 5)
    "two-pass": {64: Config(64, peel=True), 128: Config(64, peel=True, serial=True)},
    "fused": {64: Config(64, peel=True, fuse_dq=True), 128: Config(64, peel=True, serial=True, fuse_dq=True)},
}
DEFAULT = "two-pass"
STAGES = 3


def config(head_dim: int, variant: str | None = None) -> Config:
    return VARIANTS[variant or DEFAULT][head_dim]


def dkdv(q, k, v, dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast, dk, dv, dq=None, cfg=None):
    """The dK/dV pass into dk, dv, as jfa.triton.launch.bwd_dkdv (k has rows; D 64/128; bf16/fp16); with
    cfg.fuse_dq, dQ is added into dq (float32, zeroed; per-sequence partials in broadcast mode) as well."""
    from ..jagged import kernel_window
    from . import SCHEDULES  # the hopper backend's schedule cache: one build per offsets, not per call
    cfg = cfg or config(q.shape[2])
    if cfg.fuse_dq != (dq is not None):
        raise ValueError("a fused dQ needs its float32 dq buffer, and only it")
    block_n = 2 * KEYS_PER_WG.value
    sms = num_sms(q.device)
    # items are key tiles: the schedule with the roles of q and kv swapped (and the window mirrored)
    sched = SCHEDULES.get(kv_offsets, q_offsets, k.shape[0], k.shape[1], block_n, cfg.block_m, right, left, sms)
    q, dout, k, v = aligned(q, dout, k, v)
    descs = descriptors(q, dout, k, v, cfg.block_m)
    lk, rk = kernel_window(left, right)
    dq_arg, dq_strides = (dq, dq.stride()[:2]) if cfg.fuse_dq else (dk, (0, 0))
    hopper_dkdv_kernel[(sms, )](
        *descs, dk, dv, dq_arg, lse, delta, q_offsets, kv_offsets, sched.tiles, sched.order, sched.sm_start,
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), *dq_strides, lse.stride(0), sched.tiles.shape[1],
        k.shape[1], scale, scale * math.log2(math.e), lk, rk, GROUP=q.shape[1] // k.shape[1], HEAD_DIM=q.shape[2],
        BLOCK_M=cfg.block_m, STAGES=STAGES, BROADCAST=broadcast, PEEL=cfg.peel, SERIAL=cfg.serial,
        FUSE_DQ=cfg.fuse_dq, num_warps=4)


def backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast, cfg=None,
             deterministic=False):
    """-> (dq, dk, dv): the portable backward's steps (Delta, the broadcast dq sum) with the Gluon passes plugged
    in: the dK/dV pass with a fused dQ (cfg.fuse_dq), or the dK/dV pass and the dQ pass (jfa.hopper.bwd_dq).
    cfg: the dK/dV pass's Config (default: config(D)); deterministic: never the fused dQ (its atomics add in
    no fixed order), so the same bits run to run."""
    from ..triton import launch
    from .bwd_dq import dq_pass
    cfg = cfg or config(q.shape[2])
    if deterministic and cfg.fuse_dq:
        cfg = replace(cfg, fuse_dq=False)
    args = (dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast)
    if cfg.fuse_dq:
        return launch.backward(*args, fused=functools.partial(dkdv, cfg=cfg))
    return launch.backward(*args, dkdv=functools.partial(dkdv, cfg=cfg), dq_pass=dq_pass)
