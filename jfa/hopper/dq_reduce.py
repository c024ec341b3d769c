"""The one-pass backward's dQ path (jfa.hopper.bwd): each consumer warpgroup's dQ = dS K for its keys goes
through shared memory to a 1-warp writer partition that adds it into a float32 dQ accumulator with TMA
reduce-adds (cp.reduce.async.bulk.tensor ... .add), so the MMA warpgroups never wait on global memory.

  DqStage    per consumer: dS^T (bf16/fp16, the operand of the dK and dQ MMAs) and a STAGES-deep ring of float32
             [BLOCK_M, DQ_COLS] dQ chunks with full/empty barriers (count 1 each: one consumer, one writer); the
             ring only where dQ is reduce-added (jfa.hopper.config.DQ_REDUCE)
  writer     1 warp: walks the same items and (Q, dO) blocks as the producer; per block and chunk, for both
             consumers in turn: wait full, reduce-add the chunk at (q_start + m0, head * D + chunk), wait until
             the TMA has read the shared memory, arrive empty.

Rows past a sequence's end: the consumers zero dS for queries past it and keys past it (masked blocks), so the
chunk's tail rows add zeros into the next sequence's rows; TMA clips rows past the tensor's end.

From 64-row blocks (DkdvConfig.dq_xor) the accumulator's rows are permuted: a consumer stores its chunk straight
from wgmma's layout, 8 bytes a thread, a half-warp 4 rows x 32 bytes at once; in the 128-byte NVMMA swizzle rows r
and r ^ 1 share banks (4 wavefronts a store where 2 do: ncu, causal-skewed-4k, 43.5 M excess wavefronts, 8% of the
kernel's), and the 32-byte swizzle, conflict-free, cost 8 TMA messages a chunk and ran 4% slower. So the chunk is
stored with its 32-byte groups permuted by the row (XOR_GROUP, XOR_PHASES: row r's group g at g ^ (r % 8); 4 rows
take 4 bank groups) and copied as is, row by row (one message a chunk); each dQ row's columns c then hold
c ^ (8 * ((row - its block's first row) % 8)), and dq_from_acc undoes it as it casts. A row's value is only ever
added by blocks that start where its own does (other sequences' blocks add zeros, permuted or not).
"""
import torch
import triton
import triton.language as tl
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma

from ..runtime import launch
from ..schedule import ends_before
from .common import WG_ROWS, aggregate, mma_layout

DQ_COLS = gl.constexpr(64)  # dQ columns per chunk: a [64, 64] float32 tile is 16 KB of shared memory
XOR_GROUP = gl.constexpr(8)  # float32 columns a permuted group: 32 bytes, 8 of the 32 banks
XOR_PHASES = gl.constexpr(8)  # a row's groups are XORed with row % XOR_PHASES (DQ_COLS / XOR_GROUP groups a chunk)


@builtin
def async_reduce_add(tensor_desc, coord, src, _semantic=None):
    """TMA reduce-add of the shared-memory tile `src` into the global box of `tensor_desc` at `coord` (Gluon 3.6
    exposes the builder's op but no wrapper). Completes like a TMA store: fence_async_shared() after the
    shared-memory writes, tma.store_wait(n) before reusing `src`."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@aggregate
class DqStage:
    ds: gl.shared_memory_descriptor  # [2, CONSUMERS, WG_ROWS, BLOCK_M]: P^T then dS^T per block, keys as rows
    ds_full: gl.shared_memory_descriptor  # [2]: both consumers' dS^T of a block are in shared memory
    ds_free: gl.shared_memory_descriptor  # [2]: both consumers are done reading a block's dS^T for dQ
    dq: gl.shared_memory_descriptor  # [CONSUMERS * STAGES, BLOCK_M, DQ_COLS] float32
    full: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    STAGES: gl.constexpr
    CHUNKS: gl.constexpr  # chunks per (Q, dO) block: HEAD_DIM // DQ_COLS

    @constexpr_function
    def __init__(self, ds, ds_full, ds_free, dq, full, empty, STAGES, CHUNKS):
        self.ds = ds
        self.ds_full = ds_full
        self.ds_free = ds_free
        self.dq = dq
        self.full = full
        self.empty = empty
        self.STAGES = gl.constexpr(STAGES)
        self.CHUNKS = gl.constexpr(CHUNKS)

    @gluon.jit
    def alloc(dtype: gl.constexpr, dq_desc, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
              CONSUMERS: gl.constexpr, STAGES: gl.constexpr, REDUCE: gl.constexpr):
        """REDUCE: with the float32 chunk ring for the writer; else (dQ stored by the consumers themselves,
        jfa.hopper.config.DQ_DIRECT) only dS^T and its barriers, and the ring's fields alias them, unused."""
        # dS^T stored keys-contiguous (stmatrix .trans, as FA4 stores dS): dQ = dS K reads dS as a K-major A operand,
        # not a transposed one; the D=128 one pass spills 788 -> 468 B (no reload left in its block loops) and runs
        # causal-skewed-4k 3.65 -> 3.49 ms, hstu-silu 15.66 -> 15.34 (self-skewed-8k, D=64 even, gdpa-self +1%)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2,
                                                       transposed=True)
        ds = gl.allocate_shared_memory(dtype, [2 * CONSUMERS, WG_ROWS, BLOCK_M], ds_layout)
        ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(ds_full.index(i), count=CONSUMERS)
            mbarrier.init(ds_free.index(i), count=CONSUMERS)
        if REDUCE:
            dq = gl.allocate_shared_memory(gl.float32, [CONSUMERS * STAGES] + dq_desc.block_shape, dq_desc.layout)
            full = gl.allocate_shared_memory(gl.int64, [CONSUMERS * STAGES, 1], mbarrier.MBarrierLayout())
            empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS * STAGES, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(CONSUMERS * STAGES):
                mbarrier.init(full.index(i), count=1)
                mbarrier.init(empty.index(i), count=1)
            return DqStage(ds, ds_full, ds_free, dq, full, empty, STAGES, HEAD_DIM // DQ_COLS)
        else:
            return DqStage(ds, ds_full, ds_free, ds, ds_full, ds_free, STAGES, HEAD_DIM // DQ_COLS)

    @gluon.jit
    def owner(self, it, c: gl.constexpr):
        """(w, n): chunk c of block it is consumer w's n-th. Two chunks (D=128): consumer c computes chunk c of
        every block; one chunk (D=64): the consumers take the blocks in turn."""
        if self.CHUNKS == 2:
            return c, it
        else:
            return it % 2, it // 2

    @gluon.jit
    def ds_buffer(self, it, w: gl.constexpr):
        """Consumer w's P^T / dS^T buffer for block it (double-buffered: a block's dS^T may still be read for
        dQ by the other consumer while this one starts the next block)."""
        return self.ds.index((it % 2) * 2 + w)

    @gluon.jit
    def claim_ds(self, it):
        """Consumer: wait until both consumers have finished reading block it - 2's dS^T."""
        mbarrier.wait(self.ds_free.index(it % 2), ((it // 2) & 1) ^ 1)

    @gluon.jit
    def publish_ds(self, it):
        mbarrier.arrive(self.ds_full.index(it % 2), count=1)

    @gluon.jit
    def wait_ds(self, it):
        """Consumer: both consumers' dS^T of block it are in shared memory."""
        mbarrier.wait(self.ds_full.index(it % 2), (it // 2) & 1)

    @gluon.jit
    def free_ds(self, it):
        mbarrier.arrive(self.ds_free.index(it % 2), count=1)

    @gluon.jit
    def put(self, w: gl.constexpr, n, chunk, TRANSPOSED: gl.constexpr = False):
        """Consumer w: its n-th dQ chunk (float32 registers; TRANSPOSED: [DQ_COLS, BLOCK_M]) into its ring, for
        the writer."""
        slot = w * self.STAGES + n % self.STAGES
        mbarrier.wait(self.empty.index(slot), ((n // self.STAGES) & 1) ^ 1)
        buf = self.dq.index(slot)
        if TRANSPOSED:
            buf.permute((1, 0)).store(chunk)
        elif _row_by_row(buf.layout):  # the TMA copies the tile as it lies: the permuted groups go to global memory
            xor_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=XOR_GROUP, per_phase=1, max_phase=XOR_PHASES,
                                                               order=[1, 0])
            buf._reinterpret(gl.float32, buf.shape, xor_layout).store(chunk)
        else:
            buf.store(chunk)
        fence_async_shared()
        mbarrier.arrive(self.full.index(slot), count=1)

    @gluon.jit
    def drain(self, w, n, dq_desc, coord, prev):
        """Writer: consumer w's n-th chunk, reduce-added at coord. The previous chunk's slot (`prev`, -1 for
        none) is handed back once the TMA has read it, so one reduce is in flight while the next is waited for.
        -> this chunk's slot."""
        slot = w * self.STAGES + n % self.STAGES
        mbarrier.wait(self.full.index(slot), (n // self.STAGES) & 1)
        async_reduce_add(dq_desc, coord, self.dq.index(slot))
        tma.store_wait(1)  # (waiting for 0 here measured the same)
        if prev >= 0:
            mbarrier.arrive(self.empty.index(prev), count=1)
        return slot


@constexpr_function
def _row_by_row(layout):
    """The staging tile's TMA layout copies it unswizzled: the consumers store it with its groups permuted."""
    return layout.swizzle_byte_width == 0


@gluon.jit
def dq_chunk(it, t, C: gl.constexpr, kv_ops, stage, BLOCK_M: gl.constexpr):
    """dQ[:, chunk C] of block it = dS_0 K_0[:, C] + dS_1 K_1[:, C] (both consumers' keys), issued (async) once
    both dS^T are in shared memory. Blocks of fewer than 64 rows (jfa.hopper.config.SHORT_Q) get it transposed,
    dQ^T[chunk C] = K_0[:, C]^T dS_0^T + K_1[:, C]^T dS_1^T ([DQ_COLS, BLOCK_M]: wgmma's M is 64 rows at least)."""
    stage.wait_ds(it)
    if BLOCK_M < WG_ROWS:
        dqt_layout: gl.constexpr = mma_layout(BLOCK_M)
        dq = gl.full([DQ_COLS, BLOCK_M], 0.0, gl.float32, layout=dqt_layout)
        for k in gl.static_range(2):
            k_cols_t = kv_ops.a_block(t, k).slice(C * DQ_COLS, DQ_COLS, dim=1).permute((1, 0))
            dq = warpgroup_mma(k_cols_t, stage.ds_buffer(it, k), dq, use_acc=k > 0, is_async=True)
    else:
        dq_layout: gl.constexpr = mma_layout(DQ_COLS)
        dq = gl.full([BLOCK_M, DQ_COLS], 0.0, gl.float32, layout=dq_layout)
        for k in gl.static_range(2):
            k_cols = kv_ops.a_block(t, k).slice(C * DQ_COLS, DQ_COLS, dim=1)
            dq = warpgroup_mma(stage.ds_buffer(it, k).permute((1, 0)), k_cols, dq, use_acc=k > 0, is_async=True)
    return dq


@gluon.jit
def _drain_block(it, m0, col, prev, tile, shape, dq_desc, stage):
    """Writer: block it's chunks (rows m0..), in order from their owners -> (the next block's count, the last slot)."""
    # broadcast q: every CTA adds into one float32 slab of Lq rows, which stays in L2 under the streaming K/V (a slab
    # a CTA, 132 x Lq x D, missed it: ncu moved 6.5 GB for 4.4 GB of operands; pma-256's backward 6.23 -> 4.57 ms)
    row = m0 if shape.BROADCAST else tile.q_start + m0
    for c in gl.static_range(stage.CHUNKS):
        w, n = stage.owner(it, c)
        prev = stage.drain(w, n, dq_desc, [row, col + c * DQ_COLS], prev)
    return it + 1, prev


@gluon.jit
def dq_writer_partition(shape, work, batch, dq_desc, stage, kv_ops):
    """The writer warp: the (Q, dO) blocks of every item in the producer's order, each block's chunks in order
    (from their owners). A work queue's items (work.QUEUE): each as kv_ops posted it (ItemOperands.posted: its slot,
    or its record), then its set released, as the consumers read them."""
    it = 0  # (Q, dO) blocks so far
    prev = -1
    if work.QUEUE:
        t = 0
        kv_ops.wait(0, 0)
        valid = kv_ops.more(0, 1, work)
        while valid:
            tile = kv_ops.posted(t, 1, work, batch, shape, True)
            kv_ops.release(t)  # (the record read)
            it, prev = _drain_item(tile, it, prev, shape, dq_desc, stage)
            t += 1
            kv_ops.wait(t, 0)
            valid = kv_ops.more(t, 1, work)
    else:
        first, end = work.bounds()
        for idx in range(first, end):
            tile = work.key_tile(idx, batch, shape)
            if tile.valid:
                it, prev = _drain_item(tile, it, prev, shape, dq_desc, stage)
    tma.store_wait(0)


@gluon.jit
def _drain_item(tile, it, prev, shape, dq_desc, stage):
    """Writer: an item's blocks, for every query head of its group, in the producer's walk -> (the next block's
    count, the last slot)."""
    CHUNKS: gl.constexpr = stage.CHUNKS
    HEAD_DIM: gl.constexpr = CHUNKS * DQ_COLS
    for g in range(shape.GROUP):
        col = (tile.head * shape.GROUP + g) * HEAD_DIM
        for part in gl.static_range(tile.PARTS):  # the item's walk (Item.part), as the producer's
            lo, hi = tile.part(part)
            for m0 in range(lo, hi, shape.BLOCK_M):
                it, prev = _drain_block(it, m0, col, prev, tile, shape, dq_desc, stage)
    return it, prev


@triton.jit
def _dq_from_acc_kernel(ACC, DQ, q_offsets, batch, rows, row_elems, scale, BLOCK_R: tl.constexpr,
                        BLOCK_G: tl.constexpr, SEARCH_STEPS: tl.constexpr, ADD: tl.constexpr):
    """DQ[row, c] (+)= scale ACC[row, c ^ (8 * phase)], phase = (row - its sequence's first row) % 8, in [BLOCK_R rows,
    BLOCK_G groups, 8] tiles (each group's 32 bytes one vector); the sequence found by jfa.schedule.ends_before over
    q_offsets[1:]; with SEARCH_STEPS 0, one sequence from row 0 (broadcast q's slab)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    g = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    e = tl.arange(0, XOR_GROUP)
    start = tl.zeros([BLOCK_R], tl.int32)
    if SEARCH_STEPS > 0:
        start = tl.load(q_offsets + ends_before(r, q_offsets + 1, batch, SEARCH_STEPS))
    phase = (r - start) % XOR_PHASES
    base = r[:, None, None].to(tl.int64) * row_elems
    dst = base + g[None, :, None] * XOR_GROUP + e[None, None, :]
    src = base + (g[None, :, None] ^ phase[:, None, None]) * XOR_GROUP + e[None, None, :]
    keep = (r[:, None, None] < rows) & (g[None, :, None] * XOR_GROUP < row_elems)
    x = tl.load(ACC + src, mask=keep, other=0.0) * scale
    if ADD:
        x += tl.load(DQ + dst, mask=keep, other=0.0).to(tl.float32)
    tl.store(DQ + dst, x.to(DQ.dtype.element_ty), mask=keep)


def dq_from_acc(acc: torch.Tensor, q_offsets: torch.Tensor | None, dtype: torch.dtype, scale: float = 1.0,
                into=None) -> torch.Tensor:
    """dQ in `dtype` from a float32 accumulator [rows, H, D] reduce-added by 64-row blocks (DkdvConfig.dq_xor),
    its groups put back in order and times scale (the blocks stage dQ without grad_scale: bwd_block.staged_dq);
    q_offsets: the sequences' first rows (blocks start at them), None for broadcast q's slab (blocks from row 0).
    into: a tensor of dtype to add it into (returned), else a new one."""
    rows = acc.shape[0]
    row_elems = acc[0].numel() if rows else 0
    out = torch.empty(acc.shape, device=acc.device, dtype=dtype) if into is None else into
    if rows == 0 or row_elems == 0:
        return out
    batch = 0 if q_offsets is None else q_offsets.shape[0] - 1
    groups = row_elems // XOR_GROUP.value
    block_r, block_g = 16, min(32, triton.next_power_of_2(groups))
    grid = (triton.cdiv(rows, block_r), triton.cdiv(groups, block_g))
    search_steps = 0 if q_offsets is None else batch.bit_length() + 1
    launch(_dq_from_acc_kernel, grid, acc, out, acc if q_offsets is None else q_offsets, batch, rows, row_elems,
           float(scale), BLOCK_R=block_r, BLOCK_G=block_g, SEARCH_STEPS=search_steps, ADD=into is not None)
    return out
