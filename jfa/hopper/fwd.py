"""The Hopper forward: a persistent, warp-specialized Gluon kernel over a load-balanced jfa.schedule.

Glossary as jfa/triton/kernels/common.py. Each CTA loops over its schedule's items (sequence, query tile,
head); its partitions share shared memory and talk through mbarriers:

  load      1 warp: per item, TMA-loads the Q tile (one 64-row box per consumer), then streams the tile's K/V
            blocks into a STAGES-deep ring (a slot is refilled once every consumer has released it).
  softmax   CONSUMERS x 4 warps (consumer w owns Q rows [m0 + 64 w, m0 + 64 w + 64)): per K/V block,
            S = Q K^T (wgmma), online softmax in base 2, O += P V (wgmma, P from registers). The loop is
            pipelined as in FlashAttention-3: S of block j is issued before P V of block j-1, so the
            exponentials of block j run while the tensor cores multiply.

CONSUMERS = 2 (128-row tiles, one CTA per SM) lets two warpgroups share every K/V block; CONSUMERS = 1 (64-row
tiles, two CTAs per SM) suits short query tiles. A block that runs past its sequence reads the next
sequence's rows (the key mask hides them; stores skip query rows past the end); a consumer whose rows all lie
past the end skips the math and only releases the buffers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton  # noqa: F401  (jfa.hopper.aot compiles these kernels through triton.compile)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .common import aligned, tma_descriptor

LN2 = gl.constexpr(0.6931471805599453)
WG_ROWS = gl.constexpr(64)  # query rows per consumer warpgroup (one wgmma m64 instruction tall)


@gluon.jit
def _fetch(tiles, order, q_offsets, kv_offsets, idx, heads, tile_capacity):
    """The global loads of schedule slot idx: (item, query tile index, q_start, q_end, kv_start, kv_end)."""
    item = gl.load(order + idx)
    i_tile = gl.maximum(item, 0) // heads
    seq = gl.maximum(gl.load(tiles + i_tile), 0)
    m_tile = gl.load(tiles + tile_capacity + i_tile)
    q_start = gl.load(q_offsets + seq).to(gl.int32)  # offsets may be int64; TMA coordinates are int32
    q_end = gl.load(q_offsets + seq + 1).to(gl.int32)
    kv_start = gl.load(kv_offsets + seq).to(gl.int32)
    kv_end = gl.load(kv_offsets + seq + 1).to(gl.int32)
    return item, m_tile, q_start, q_end, kv_start, kv_end


@gluon.jit
def _geometry(item, m_tile, q_start, q_end, kv_start, kv_end, heads, LEFT, RIGHT, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr):
    """-> (valid, head, first query row m0, q_start, q_len, kv_start, kv_len, key blocks [lo, hi)): the
    tile's key range, as common.key_blocks."""
    q_len = q_end - q_start
    kv_len = kv_end - kv_start
    m0 = m_tile * BLOCK_M
    shift = kv_len - q_len
    m_last = gl.minimum(m0 + BLOCK_M, q_len) - 1
    lo = (gl.maximum(m0 + shift - LEFT, 0) // BLOCK_N) * BLOCK_N
    hi = gl.minimum(m_last + shift + RIGHT + 1, kv_len)
    return item >= 0, gl.maximum(item, 0) % heads, m0, q_start, q_len, kv_start, kv_len, lo, hi


@gluon.jit
def _item(tiles, order, q_offsets, kv_offsets, idx, heads, tile_capacity, LEFT, RIGHT,
          BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Schedule slot idx -> _geometry of its item."""
    item, m_tile, q_start, q_end, kv_start, kv_end = _fetch(tiles, order, q_offsets, kv_offsets, idx, heads,
                                                           tile_capacity)
    return _geometry(item, m_tile, q_start, q_end, kv_start, kv_end, heads, LEFT, RIGHT, BLOCK_M, BLOCK_N)


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty,
                    q_offsets, kv_offsets, tiles, order, sm_start, tile_capacity, heads, LEFT, RIGHT,
                    GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, BROADCAST: gl.constexpr, CONSUMERS: gl.constexpr, PAIRS: gl.constexpr):
    KV_PER_SLOT: gl.constexpr = 2 if PAIRS else 1  # PAIRS: each consumer has its own head, so its own K/V
    i_sm = gl.program_id(0)
    it = 0  # K/V blocks loaded so far: ring slot it % STAGES, phase (it // STAGES) & 1
    t = 0  # items loaded so far: Q buffer phase t & 1
    for idx in range(gl.load(sm_start + i_sm), gl.load(sm_start + i_sm + 1)):
        # no PREFETCH here: the producer runs ahead of the consumers, and triton 3.6 miscompiled the prefetched
        # form in this partition (the key range of every item became the first item's; docs/perf-notes.md)
        valid, i_h, m0, q_start, q_len, kv_start, kv_len, lo, hi = _item(
            tiles, order, q_offsets, kv_offsets, idx, heads, tile_capacity, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        if valid:
            q_row0 = m0 if BROADCAST else q_start + m0
            mbarrier.wait(q_empty, (t & 1) ^ 1)  # the consumers are done with the previous item's Q
            for w in gl.static_range(CONSUMERS):
                row = q_row0 if PAIRS else q_row0 + w * WG_ROWS
                head = 2 * i_h + w if PAIRS else i_h
                mbarrier.expect(q_ready.index(w), q_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [row, head * HEAD_DIM], q_ready.index(w), q_smem.index(w))
            for n0 in range(lo, hi, BLOCK_N):
                slot = it % STAGES
                mbarrier.wait(kv_empty.index(slot), ((it // STAGES) & 1) ^ 1)
                mbarrier.expect(k_ready.index(slot), KV_PER_SLOT * k_desc.block_type.nbytes)
                mbarrier.expect(v_ready.index(slot), KV_PER_SLOT * v_desc.block_type.nbytes)
                for w in gl.static_range(KV_PER_SLOT):  # PAIRS: the two heads' rows are adjacent in memory
                    col = ((2 * i_h + w if PAIRS else i_h) // GROUP) * HEAD_DIM
                    buf = slot * KV_PER_SLOT + w
                    tma.async_copy_global_to_shared(k_desc, [kv_start + n0, col], k_ready.index(slot),
                                                    k_smem.index(buf))
                    tma.async_copy_global_to_shared(v_desc, [kv_start + n0, col], v_ready.index(slot),
                                                    v_smem.index(buf))
                it += 1
            t += 1


@gluon.jit
def _masked_scores(s, n0, offs_m, shift, kv_len, LEFT, RIGHT, s_cols: gl.constexpr, BLOCK_N: gl.constexpr):
    """Scores of key block n0 with the keys a row may not see set to -inf (jfa.jagged's rule)."""
    offs_n = n0 + gl.arange(0, BLOCK_N, layout=s_cols)
    i_shift = gl.expand_dims(offs_m + shift, 1)
    j = gl.expand_dims(offs_n, 0)
    vis = (j < kv_len) & (j >= i_shift - LEFT) & (j <= i_shift + RIGHT)
    return gl.where(vis, s, float("-inf"))


@gluon.jit
def _take_turn(turn, WG: gl.constexpr, g, PINGPONG: gl.constexpr):
    """Ping-pong (FlashAttention-3): the two consumer warpgroups issue their matmuls in strict alternation, so
    one's softmax runs while the other's matmuls occupy the tensor cores. Wait for this warpgroup's turn."""
    if PINGPONG:
        mbarrier.wait(turn.index(WG), (g & 1) ^ (1 - WG))


@gluon.jit
def _pass_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG), count=1)


@gluon.jit
def _softmax_partition(WG: gl.constexpr, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty,
                       turn, O, LSE, q_offsets, kv_offsets, tiles, order, sm_start, stride_ot, stride_oh, stride_lh,
                       tile_capacity, heads, qk_scale, LEFT, RIGHT, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                       BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                       PREFETCH: gl.constexpr, PAIRS: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    o_cols: gl.constexpr = gl.SliceLayout(0, o_layout)
    s_zero = gl.full([WG_ROWS, BLOCK_N], 0.0, gl.float32, layout=s_layout)
    q_buf = q_smem.index(WG)
    KV_PER_SLOT: gl.constexpr = 2 if PAIRS else 1
    KV_SUB: gl.constexpr = WG if PAIRS else 0  # this consumer's K/V buffer within a ring slot

    i_sm = gl.program_id(0)
    it = 0
    t = 0
    g = 0  # matmul turns taken (ping-pong)
    first = gl.load(sm_start + i_sm)
    end = gl.load(sm_start + i_sm + 1)
    # PREFETCH: the next slot's global loads are issued one item ahead, off the critical path.
    f_item, f_tile, f_qs, f_qe, f_ks, f_ke = _fetch(tiles, order, q_offsets, kv_offsets,
                                                    gl.maximum(gl.minimum(first, end - 1), 0), heads, tile_capacity)
    for idx in range(first, end):
        if PREFETCH:
            valid, i_h, m0, q_start, q_len, kv_start, kv_len, lo, hi = _geometry(
                f_item, f_tile, f_qs, f_qe, f_ks, f_ke, heads, LEFT, RIGHT, BLOCK_M, BLOCK_N)
            f_item, f_tile, f_qs, f_qe, f_ks, f_ke = _fetch(tiles, order, q_offsets, kv_offsets,
                                                            gl.minimum(idx + 1, end - 1), heads, tile_capacity)
        else:
            valid, i_h, m0, q_start, q_len, kv_start, kv_len, lo, hi = _item(
                tiles, order, q_offsets, kv_offsets, idx, heads, tile_capacity, LEFT, RIGHT, BLOCK_M, BLOCK_N)
        if valid:
            row0 = m0 if PAIRS else m0 + WG * WG_ROWS  # PAIRS: both consumers take the same rows, two heads
            if PAIRS:
                i_h = 2 * i_h + WG
            shift = kv_len - q_len
            n_blocks = gl.maximum(gl.cdiv(hi - lo, BLOCK_N), 0)
            # this warpgroup's fully visible key blocks [full_lo, full_hi): no mask needed there
            row_last = gl.minimum(row0 + WG_ROWS, q_len) - 1
            full_lo = gl.maximum(gl.cdiv(row_last + shift - LEFT, BLOCK_N) * BLOCK_N, lo)
            full_hi = (gl.minimum(row0 + shift + RIGHT + 1, kv_len) // BLOCK_N) * BLOCK_N
            offs_m = row0 + gl.arange(0, WG_ROWS, layout=s_rows)
            m_i = gl.full([WG_ROWS], float("-inf"), gl.float32, layout=s_rows)  # row max of raw scores
            l_i = gl.full([WG_ROWS], 0.0, gl.float32, layout=s_rows)
            acc = gl.full([WG_ROWS, HEAD_DIM], 0.0, gl.float32, layout=o_layout)
            mbarrier.wait(q_ready.index(WG), t & 1)
            if (row0 < q_len) & (n_blocks > 0):
                # prologue: S of the first block and its softmax
                slot = it % STAGES
                mbarrier.wait(k_ready.index(slot), (it // STAGES) & 1)
                _take_turn(turn, WG, g, PINGPONG)
                s = warpgroup_mma(q_buf, k_smem.index(slot * KV_PER_SLOT + KV_SUB).permute((1, 0)), s_zero, use_acc=False, is_async=True)
                _pass_turn(turn, WG, PINGPONG)
                g += 1
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
                if (lo < full_lo) | (lo >= full_hi):
                    s = _masked_scores(s, lo, offs_m, shift, kv_len, LEFT, RIGHT, s_cols, BLOCK_N)
                m_i = gl.max(s, axis=1)
                m_scaled = gl.where(m_i == float("-inf"), 0.0, m_i * qk_scale)
                p = gl.exp2(s * qk_scale - gl.expand_dims(m_scaled, 1))
                l_i = gl.sum(p, axis=1)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
                for j in range(1, n_blocks):
                    n0 = lo + j * BLOCK_N
                    prev = (it + j - 1) % STAGES
                    slot = (it + j) % STAGES
                    mbarrier.wait(k_ready.index(slot), ((it + j) // STAGES) & 1)
                    mbarrier.wait(v_ready.index(prev), ((it + j - 1) // STAGES) & 1)
                    _take_turn(turn, WG, g, PINGPONG)
                    s = warpgroup_mma(q_buf, k_smem.index(slot * KV_PER_SLOT + KV_SUB).permute((1, 0)), s_zero, use_acc=False,
                                      is_async=True)
                    acc = warpgroup_mma(p_op, v_smem.index(prev * KV_PER_SLOT + KV_SUB), acc, is_async=True)
                    _pass_turn(turn, WG, PINGPONG)
                    g += 1
                    s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))  # S_j done, P V_{j-1} in flight
                    if (n0 < full_lo) | (n0 >= full_hi):
                        s = _masked_scores(s, n0, offs_m, shift, kv_len, LEFT, RIGHT, s_cols, BLOCK_N)
                    m_new = gl.maximum(m_i, gl.max(s, axis=1))
                    m_scaled = gl.where(m_new == float("-inf"), 0.0, m_new * qk_scale)
                    p = gl.exp2(s * qk_scale - gl.expand_dims(m_scaled, 1))
                    alpha = gl.exp2(m_i * qk_scale - m_scaled)
                    l_i = l_i * alpha + gl.sum(p, axis=1)
                    m_i = m_new
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))[0]
                    mbarrier.arrive(kv_empty.index(prev), count=1)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
                    p_op = gl.convert_layout(p.to(dtype), p_layout)
                mbarrier.arrive(q_empty, count=1)  # last S issued and done: the producer may load the next Q
                last = (it + n_blocks - 1) % STAGES
                mbarrier.wait(v_ready.index(last), ((it + n_blocks - 1) // STAGES) & 1)
                _take_turn(turn, WG, g, PINGPONG)
                acc = warpgroup_mma(p_op, v_smem.index(last * KV_PER_SLOT + KV_SUB), acc, is_async=True)
                _pass_turn(turn, WG, PINGPONG)
                g += 1
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))[0]
                mbarrier.arrive(kv_empty.index(last), count=1)
            else:  # rows past the sequence's end, or no keys: hand the buffers back, keep the turns in step
                mbarrier.arrive(q_empty, count=1)
                for j in range(0, n_blocks):
                    slot = (it + j) % STAGES
                    _take_turn(turn, WG, g, PINGPONG)
                    _pass_turn(turn, WG, PINGPONG)
                    g += 1
                    mbarrier.wait(v_ready.index(slot), ((it + j) // STAGES) & 1)
                    mbarrier.wait(k_ready.index(slot), ((it + j) // STAGES) & 1)
                    mbarrier.arrive(kv_empty.index(slot), count=1)
                if n_blocks > 0:
                    _take_turn(turn, WG, g, PINGPONG)
                    _pass_turn(turn, WG, PINGPONG)
                    g += 1
            it += n_blocks
            t += 1
            if row0 < q_len:
                seen = l_i > 0.0
                lse = gl.where(seen, (m_i * qk_scale + gl.log2(gl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
                inv = gl.convert_layout(1.0 / gl.where(seen, l_i, 1.0), o_rows)
                out = (acc * gl.expand_dims(inv, 1)).to(dtype)
                o_m = row0 + gl.arange(0, WG_ROWS, layout=o_rows)
                o_d = gl.arange(0, HEAD_DIM, layout=o_cols)
                p_o = (O + q_start.to(gl.int64) * stride_ot + i_h * stride_oh
                       + gl.expand_dims(o_m, 1) * stride_ot + gl.expand_dims(o_d, 0))
                gl.store(p_o, out, mask=gl.expand_dims(o_m < q_len, 1))
                gl.store(LSE + i_h * stride_lh + q_start + offs_m, lse, mask=offs_m < q_len)


@gluon.jit
def hopper_fwd_ws_kernel(q_desc, k_desc, v_desc, O, LSE, q_offsets, kv_offsets, tiles, order, sm_start,
                         stride_ot, stride_oh, stride_lh, tile_capacity, heads, qk_scale, LEFT, RIGHT,
                         GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                         CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr, PREFETCH: gl.constexpr,
                         PAIRS: gl.constexpr, BROADCAST: gl.constexpr, num_warps: gl.constexpr):
    """CONSUMERS = 2: 128-row tiles, both warpgroups share each K/V block (one CTA per SM). CONSUMERS = 1:
    64-row tiles, one warpgroup (two CTAs per SM: for short query tiles). PAIRS (with 2 consumers): 64-row
    tiles of a pair of heads, one head per consumer, the two heads' K/V loaded side by side (for query tiles
    of at most 64 rows, e.g. broadcast q of 64 rows, where a 128-row tile would leave a consumer idle)."""
    BLOCK_M: gl.constexpr = WG_ROWS if PAIRS else CONSUMERS * WG_ROWS
    KV_PER_SLOT: gl.constexpr = 2 if PAIRS else 1
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, WG_ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES * KV_PER_SLOT, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES * KV_PER_SLOT, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_empty, count=CONSUMERS)
    for w in gl.static_range(CONSUMERS):
        mbarrier.init(q_ready.index(w), count=1)
    for w in gl.static_range(2):
        mbarrier.init(turn.index(w), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=CONSUMERS)

    if CONSUMERS == 2:
        gl.warp_specialize([
            (_softmax_partition, (0, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty, turn, O,
                                  LSE, q_offsets, kv_offsets, tiles, order, sm_start, stride_ot, stride_oh,
                                  stride_lh, tile_capacity, heads, qk_scale, LEFT, RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N,
                                  STAGES, PINGPONG, PREFETCH, PAIRS)),
            (_softmax_partition, (1, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty, turn, O,
                                  LSE, q_offsets, kv_offsets, tiles, order, sm_start, stride_ot, stride_oh,
                                  stride_lh, tile_capacity, heads, qk_scale, LEFT, RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N,
                                  STAGES, PINGPONG, PREFETCH, PAIRS)),
            (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready,
                               kv_empty, q_offsets, kv_offsets, tiles, order, sm_start, tile_capacity, heads, LEFT,
                               RIGHT, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, BROADCAST, CONSUMERS, PAIRS)),
        ], [4, 1], [232, 40])
    else:
        gl.warp_specialize([
            (_softmax_partition, (0, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty, turn, O,
                                  LSE, q_offsets, kv_offsets, tiles, order, sm_start, stride_ot, stride_oh,
                                  stride_lh, tile_capacity, heads, qk_scale, LEFT, RIGHT, HEAD_DIM, BLOCK_M, BLOCK_N,
                                  STAGES, False, PREFETCH, False)),
            (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready,
                               kv_empty, q_offsets, kv_offsets, tiles, order, sm_start, tile_capacity, heads, LEFT,
                               RIGHT, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, BROADCAST, CONSUMERS, False)),
        ], [1], [24])


def descriptors(q, k, v, block_n: int):
    """TMA descriptors: q in 64-row boxes (one per consumer), k and v in block_n-row boxes."""
    return tma_descriptor(q, WG_ROWS.value), tma_descriptor(k, block_n), tma_descriptor(v, block_n)


@dataclass(frozen=True)
class Config:
    consumers: int = 2  # warpgroups per CTA; 1 = 64-row tiles at two CTAs per SM
    block_n: int = 128
    stages: int = 2  # K/V ring depth; the ring + Q must fit the 227 KB of shared memory
    pingpong: bool = False
    prefetch: bool = False  # the consumers load each item's bookkeeping one item ahead
    pairs: bool = False  # 64-row tiles of two heads, one per consumer (needs 2 consumers and an even head count)

    def ctas_per_sm(self):
        return 3 - self.consumers

    def launch_options(self):
        """Two CTAs per SM need each to launch with at most half the register file (256 threads x 128)."""
        return {"maxnreg": 128} if self.ctas_per_sm() == 2 else {}


VARIANTS = {  # name -> head dim -> Config; A/B'd by benchmarks/ab_forward.py
    "s2": {64: Config(stages=2), 128: Config(stages=2)},
    "s3": {64: Config(stages=3), 128: Config(stages=3)},
    "pingpong": {64: Config(stages=3, pingpong=True), 128: Config(stages=3, pingpong=True)},
    "m64": {64: Config(consumers=1, stages=3), 128: Config(consumers=1, block_n=64, stages=3)},
    "prefetch": {64: Config(consumers=1, stages=3, prefetch=True), 128: Config(stages=3, prefetch=True)},
    "pairs": {64: Config(stages=3, pairs=True), 128: Config(block_n=64, stages=3, pairs=True)},
}


DEFAULT = {64: "m64", 128: "s3"}  # the fastest variant per head dim on the H200 (docs/perf-notes.md)


def config(head_dim: int, variant: str | None = None) -> Config:
    return VARIANTS[variant or DEFAULT[head_dim]][head_dim]


def forward(q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast, schedules=None, cfg=None):
    """-> (out, lse) as jfa.triton.launch.forward. Needs an sm_90 device, bf16/fp16, D in (64, 128)."""
    from ..jagged import kernel_window
    from ..schedule import build, num_sms
    cfg = cfg or config(q.shape[2])
    if cfg.pairs and q.shape[1] % 2:
        cfg = config(q.shape[2])  # an odd head count has no pairs
    block_m = (1 if cfg.pairs else cfg.consumers) * WG_ROWS.value
    batch = kv_offsets.numel() - 1
    rows = batch * q.shape[0] if broadcast else q.shape[0]
    hq, d = q.shape[1], q.shape[2]
    out = torch.empty(rows, hq, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(hq, rows, dtype=torch.float32, device=q.device)
    if rows == 0 or batch == 0 or q.shape[0] == 0:
        return out, lse
    if k.shape[0] == 0:  # no keys anywhere (a TMA descriptor needs rows): every query sees nothing
        return out.zero_(), lse.fill_(float("-inf"))
    ctas = num_sms(q.device) * cfg.ctas_per_sm()
    items_per_tile = hq // 2 if cfg.pairs else hq  # PAIRS: an item is a tile of a pair of heads
    params = (rows, items_per_tile, block_m, cfg.block_n, left, right, ctas)
    sched = schedules.get(q_offsets, kv_offsets, *params) if schedules else build(q_offsets, kv_offsets, *params)
    q, k, v = aligned(q, k, v)
    q_desc, k_desc, v_desc = descriptors(q, k, v, cfg.block_n)
    lk, rk = kernel_window(left, right)
    hopper_fwd_ws_kernel[(ctas, )](
        q_desc, k_desc, v_desc, out, lse, q_offsets, kv_offsets, sched.tiles, sched.order, sched.sm_start,
        out.stride(0), out.stride(1), lse.stride(0), sched.tiles.shape[1], items_per_tile, scale * math.log2(math.e),
        lk, rk,
        GROUP=hq // k.shape[1], HEAD_DIM=d, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CONSUMERS=cfg.consumers,
        PINGPONG=cfg.pingpong, PREFETCH=cfg.prefetch, PAIRS=cfg.pairs, BROADCAST=broadcast, num_warps=4,
        **cfg.launch_options())
    return out, lse
