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
  (x2)      S^T = K Q^T and dP^T = V dO^T; P^T = exp2(S^T - lse), dS^T = P^T (dP^T - Delta) (with an activation
            f: P^T = f(scale S^T), dS^T = f'(scale S^T) dP^T, no LSE or Delta: jfa.variants);
            dV += P^T dO and dK += dS^T Q; one pass: dQ chunks = dS K (_one_pass_block). dK and dV stay in
            registers over the whole item (GQA group included: no atomics) and are stored once. Each item's
            blocks run as three loops: masked head, mask-free bulk, masked tail (jfa.geometry.full_query_blocks
            per warpgroup).
  writer    1 warp, one pass only: the dQ chunks' TMA reduce-adds (jfa.hopper.dq_reduce).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function

from .. import variants
from ..geometry import full_query_blocks, tail_seen, target_tests
from ..jagged import UNBOUNDED
from ..problem import Problem
from ..runtime import launch, num_sms
from ..schedule import CACHE
from ..targets import key_tile_tests
from ..variants import score_args, score_fn
from .buffers import ItemOperands, Ring, RowStats
from .bwd_block import (MASK_NONE, MASK_PAIRS, MASK_REAL, MASK_ROWS, MASK_WINDOW, Consumer, DkdvGrads, OnePass,
                        QBlock, deferred_dq, dkdv_block, one_pass_block)
from .common import WG_ROWS, Batch, KvPrefetch, Shape, aligned, mma_layout, rows, store_rows, tma_descriptor
from .config import DkdvConfig, DqRoute, key_tile_schedule
from .dq_reduce import DQ_COLS, DqStage, dq_writer_partition
from .items import WorkList


@gluon.jit
def _load_partition(shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, stats, kv):
    it = 0  # (Q, dO) blocks loaded so far
    t = 0  # items loaded so far
    if work.QUEUE:  # the next item whenever the last one's loads are issued (WorkList.take)
        idx = work.take()
        while idx >= 0:
            tile = work.key_tile(idx, batch, shape)
            if tile.valid:
                it = _load_item(t, it, idx, tile, shape, work, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads,
                                stats, kv)
                t += 1
            idx = work.take()
    else:
        first, end = work.bounds()
        for idx in range(first, end):
            tile = work.key_tile(idx, batch, shape)
            if tile.valid:
                it = _load_item(t, it, idx, tile, shape, work, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads,
                                stats, kv)
                t += 1
    if kv_ops.POSTED:
        kv_ops.close(t, work)  # the readers' end mark


@gluon.jit
def _load_item(t, it, idx, tile, shape, work, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, stats, kv):
    """Producer: item t (schedule slot idx): its K/V (a short item's into L2 first, kv: KvPrefetch; posted: its
    record or slot first), then its (Q, dO) blocks from ring block it on -> the next block's count."""
    HEAD_DIM: gl.constexpr = q_desc.block_shape[1]
    BLOCK_M: gl.constexpr = shape.BLOCK_M
    kv.item(tile, shape.BLOCK_N, k_desc, v_desc)
    kv_ops.acquire(t)  # both consumers have stored the previous item's dK, dV
    if kv_ops.POSTED:
        kv_ops.post(t, tile, idx, work)
    for w in gl.static_range(2):
        row = tile.kv_start + tile.start + w * WG_ROWS
        kv_ops.load(t, w, k_desc, [row, tile.head * HEAD_DIM], v_desc, [row, tile.head * HEAD_DIM])
    for g in range(shape.GROUP):
        for part in gl.static_range(tile.PARTS):  # the item's walk (Item.part)
            lo, hi = tile.part(part)
            for m0 in range(lo, hi, BLOCK_M):
                it = _load_block(it, m0, g, tile, shape, q_desc, do_desc, qdo, grads, stats)
    return it


@gluon.jit
def _load_block(it, m0, g, tile, shape, q_desc, do_desc, qdo, grads, stats):
    """Producer: the (Q, dO) block of rows m0.. of query head g of the item's group into ring block it (and the
    rows' LSE and Delta beside it in the one pass) -> the next block's count."""
    HEAD_DIM: gl.constexpr = q_desc.block_shape[1]
    col = (tile.head * shape.GROUP + g) * HEAD_DIM
    q_row = m0 if shape.BROADCAST else tile.q_start + m0  # broadcast: one dense q
    qdo.claim(it)
    if (stats is not None) and variants.has_lse(shape.SCORE):  # (the rows' statistics, where the score has them)
        head_row = (tile.head * shape.GROUP + g) * grads.stride_lh
        stats.put(it, grads.LSE + head_row, grads.DELTA + head_row, tile.q_start + m0, grads.stride_lh)
    qdo.issue(it, q_desc, [q_row, col], do_desc, [tile.q_start + m0, col])
    return it + 1


@constexpr_function
def _real_tail(kind, full, score, head_dim, reduce, block_m):
    """Whether a key tile's tail takes MASK_REAL where tail_seen holds: under HSTU's cheaper tests, and in the one
    pass with dQ by TMA reduce (DqRoute.REDUCE) from 64-row blocks at D=64 or with softmax (sm_90 SASS, its loop a
    block 606-624 -> 462 instructions at D=128; H100, backward: d64-uniform-512 -4.3%, pma-32-d64 -12%,
    softmax-targets -3.4%, causal-skewed-4k -1%); not D=128's 32-row short-query form, whose items are a few blocks
    (pma-64 +2.8..6.2%, the tail loop's setup on every item), nor where the extra loop spilled inside the block loops:
    D=128's activations under a window (silu's one pass 380 -> 964 B, 21-25 spill accesses a block; gelu_tanh's
    alike), D=128's dK/dV pass without dQ (340 -> 572 B), the direct route's (D=64 gelu_tanh 196 -> 316 B)."""
    return target_tests(kind, full) or (reduce and block_m == 64 and (head_dim <= 64 or score == variants.SOFTMAX))


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
    j_lo, j_hi = full_query_blocks(k0, tile.lo, n_blocks, tile.seq, c.batch.rule, BLOCK_M, WG_ROWS)
    n_pre = tile.n_pre(BLOCK_M)
    if tile.PREFIX:  # the walk's prefix: its (masked) blocks first (Item.block_start)
        n_blocks, j_lo, j_hi = n_blocks + n_pre, j_lo + n_pre, j_hi + n_pre
    if ONE_PASS:  # keys past the sequence's end reach dQ: their blocks take the mask
        j_hi = gl.where(k0 + WG_ROWS > tile.kv_len, j_lo, j_hi)
    want_dq = tile.kv_len <= c.shape.BLOCK_N  # DIRECT: this item holds every key of its sequence
    # DIRECT: this warpgroup holds none of a short sequence's keys (one_pass_block): gdpa-cross-short-kv's dK/dV +
    # direct dQ 0.982 / 0.989 -> 0.913 / 0.901 ms, short-128 1.680 -> 1.660
    idle = False
    if DIRECT and (WG == 1):
        idle = tile.kv_len <= WG_ROWS
    # the walk's segments, each with its mask: the tail's blocks by a test of the rows where every real row sees
    # every key (tail_seen: the sequence's last, partial, block; _real_tail), and under HSTU's mask (target_tests)
    # the prefix's blocks by a test of the context rows and the head's by the causal window's, where they hold
    # (key_tile_tests; else the test of every pair), each a loop of its own (a branch between the tests in one loop
    # spilled: 640 -> 1,084 B)
    REAL_TAIL: gl.constexpr = _real_tail(c.batch.rule.KIND, c.batch.rule.FULL, c.shape.SCORE, HEAD_DIM,
                                         ONE_PASS and not DIRECT, BLOCK_M)
    if REAL_TAIL:
        seen = tail_seen(k0, tile.lo + (j_hi - n_pre) * BLOCK_M, tile.seq, c.batch.rule, WG_ROWS)
        n_seen = gl.where(seen, j_hi, n_blocks)
    if target_tests(c.batch.rule.KIND, c.batch.rule.FULL):
        by_rows, by_window = key_tile_tests(k0, tile.pre, tile.lo, tile.lo + (j_lo - n_pre) * BLOCK_M, tile.seq,
                                            c.batch.rule, BLOCK_M, WG_ROWS)
        bounds = (0, gl.where(by_rows, n_pre, 0), gl.where(by_window, n_pre, j_lo), j_lo, j_hi, n_seen, n_blocks)
        masks: gl.constexpr = (MASK_ROWS, MASK_PAIRS, MASK_WINDOW, MASK_NONE, MASK_PAIRS, MASK_REAL)
    elif REAL_TAIL:
        bounds = (0, j_lo, j_hi, n_seen, n_blocks)
        masks: gl.constexpr = (MASK_PAIRS, MASK_NONE, MASK_PAIRS, MASK_REAL)
    else:
        bounds = (0, j_lo, j_hi, n_blocks)
        masks: gl.constexpr = (MASK_PAIRS, MASK_NONE, MASK_PAIRS)
    it0 = it
    for g in range(c.shape.GROUP):
        i_h = tile.head * c.shape.GROUP + g
        for seg in gl.static_range(len(masks)):
            for j in range(bounds[seg], bounds[seg + 1]):
                blk = QBlock(tile.block_start(j, BLOCK_M), it, t, i_h, it0)
                if ONE_PASS:
                    dk, dv = one_pass_block(c, d, blk, dk, dv, tile, offs_n, want_dq, MASKED=masks[seg],
                                             DIRECT=DIRECT, idle=idle)
                else:
                    dk, dv = dkdv_block(c, blk, dk, dv, tile, offs_n, MASKED=masks[seg])
                it += 1
    if ONE_PASS:
        if not DIRECT:
            if d.stage.CHUNKS == 2:
                if it > it0:  # the item's last block's dQ chunk (deferred_dq), while K is still here
                    deferred_dq(c, d.stage, it - 1, t)
    c.kv_ops.release(t)  # K/V read for the last time: the producer may load the next item's
    store_rows(grads.dk.head(tile.head), grads.dk.stride_t, (dk * grads.score[2]).to(dtype), k0, tile.kv_start,
               tile.kv_len)
    dv = dv * variants.dv_factor(grads.score, c.shape.SCORE, FOLD=variants.fold_backward(dv.type.shape[1]))
    store_rows(grads.dv.head(tile.head), grads.dv.stride_t, dv.to(dtype), k0, tile.kv_start, tile.kv_len)
    return it


@gluon.jit
def _dkdv_partition(c, work, d, DIRECT: gl.constexpr):
    """Consumer c.WG's items: as posted, each read after its K/V wait up to the end mark (DkdvConfig.posted_items:
    the record, no global load per item; a work queue's slot, DkdvConfig.queue), or from the schedule (WorkList's
    three dependent loads per slot)."""
    kv_ops = c.kv_ops
    it = 0
    t = 0
    if kv_ops.POSTED:
        kv_ops.wait(0, c.WG)
        valid = kv_ops.more(0, 4, work)
        while valid:
            it = _dkdv_item(c, d, kv_ops.posted(t, 4, work, c.batch, c.shape, True), t, it, DIRECT)
            t += 1
            kv_ops.wait(t, c.WG)
            valid = kv_ops.more(t, 4, work)
    else:
        first, end = work.bounds()
        for idx in range(first, end):
            tile = work.key_tile(idx, c.batch, c.shape)
            if tile.valid:
                it = _dkdv_item(c, d, tile, t, it, DIRECT)
                t += 1


@gluon.jit
def hopper_dkdv_kernel(q_desc, do_desc, k_desc, v_desc, dq_desc, grads, stats, kv, offsets, sched, score, mask,
                       GROUP: gl.constexpr, BROADCAST: gl.constexpr, CFG: gl.constexpr, SCORE: gl.constexpr):
    """grads: (dK, dV, dQ), each (pointer, row stride, head stride); stats: (LSE, Delta, their head stride); kv:
    the k and v descriptors' tensors, the same way (KvPrefetch); the rest as jfa.hopper.fwd's kernel. CFG (a
    DkdvConfig) with one_pass: dQ too, with the rows' LSE and Delta through shared memory (RowStats): through the
    writer warp into dq_desc's float32 accumulator (DqRoute.REDUCE), or with
    DqRoute.DIRECT, only for the sequences whose keys fit one item, stored into grads' dQ (q's dtype) by the
    consumers. Else neither dq_desc nor dQ is used."""
    BLOCK_M: gl.constexpr = CFG.block_m
    STAGES: gl.constexpr = CFG.stages
    DQ_STAGES: gl.constexpr = CFG.dq_stages
    DIRECT: gl.constexpr = CFG.direct
    shape = Shape(GROUP, BLOCK_M, 2 * WG_ROWS, 2, CFG.serial, BROADCAST, SCORE)
    work = WorkList.create(sched, CFG.queue)
    batch = Batch.create(offsets, mask)
    grads = DkdvGrads.create(grads, stats, score)
    kv_rows = KvPrefetch.create(kv, CFG.kv_prefetch_rows)
    # a work queue's items are posted: the one pass's writer warp reads them too (a reader on each set's empty)
    kv_ops = ItemOperands.alloc(k_desc, v_desc, 2, True, CFG.kv_slots, CFG.posts,
                                CFG.queue and CFG.one_pass and not DIRECT, CFG.posted_items)
    # Q and dO each with its own ready barrier at D=128 but in the direct route (with it there, softmax's spills
    # went 80 -> 92 B, and at D=64 gelu_tanh's one pass 196 -> 208 B)
    qdo = Ring.alloc(q_desc, do_desc, STAGES, 2, False, (q_desc.block_shape[1] > 64) and not DIRECT)
    c0 = Consumer(shape, kv_ops, qdo, grads, batch, 0)
    c1 = Consumer(shape, kv_ops, qdo, grads, batch, 1)
    # three literal partition lists: triton 3.6 turns a list, or a None, held in a variable into tensors, which
    # cannot carry the partitions' functions (tried: such a shared list does not compile)
    if not CFG.one_pass:  # (DqRoute.NONE: the dQ pass computes dQ)
        gl.warp_specialize([
            (_dkdv_partition, (c0, work, None, False)),
            (_dkdv_partition, (c1, work, None, False)),
            (_load_partition, (shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, None, kv_rows)),
        ], [4, 1], [240, 24])
    else:
        row_stats = RowStats.alloc(BLOCK_M, STAGES)
        d = OnePass(row_stats, DqStage.alloc(k_desc.dtype, dq_desc, k_desc.block_shape[1], BLOCK_M, 2, DQ_STAGES,
                                             not DIRECT))
        if DIRECT:
            gl.warp_specialize([
                (_dkdv_partition, (c0, work, d, True)),
                (_dkdv_partition, (c1, work, d, True)),
                (_load_partition, (shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, row_stats,
                                   kv_rows)),
            ], [4, 1], [240, 24])
        else:
            gl.warp_specialize([
                (_dkdv_partition, (c0, work, d, False)),
                (_dkdv_partition, (c1, work, d, False)),
                (_load_partition, (shape, work, batch, q_desc, do_desc, k_desc, v_desc, kv_ops, qdo, grads, row_stats,
                                   kv_rows)),
                (dq_writer_partition, (shape, work, batch, dq_desc, d.stage, kv_ops)),
            ], [4, 1, 1], [240, 24, 24])


def descriptors(q, dout, k, v, cfg: DkdvConfig, dq=None):
    """TMA descriptors: q and dO in block_m-row boxes, k and v in WG_ROWS-row boxes (one per consumer);
    DqRoute.REDUCE: the float32 dQ accumulator in [block_m, DQ_COLS] boxes (else k's stands in, unused), copied
    row by row where the consumers stage each chunk with its groups permuted (cfg.dq_xor: jfa.hopper.dq_reduce)."""
    rows = WG_ROWS.value
    k_desc = tma_descriptor(k, rows)
    dq_desc = (tma_descriptor(dq, cfg.block_m, DQ_COLS.value, swizzled=not cfg.dq_xor) if cfg.dq == DqRoute.REDUCE
               else k_desc)
    return (tma_descriptor(q, cfg.block_m), tma_descriptor(dout, cfg.block_m), k_desc, tma_descriptor(v, rows),
            dq_desc)


def constexprs(cfg: DkdvConfig, p: Problem) -> dict:
    """The kernel's compile-time arguments for this config and problem (the launcher's and jfa.hopper.aot's)."""
    return dict(GROUP=p.group, BROADCAST=p.broadcast, CFG=cfg, SCORE=score_fn(p.activation))


def kernel_args(p: Problem, descs, grads: tuple, lse, delta, sched) -> tuple:
    """The kernel's run-time arguments (the launcher's, and jfa.hopper.aot's on meta tensors): grads = (dk, dv, dq)
    tensors (where no dQ is stored, any [rows, heads, D] tensor stands in); K and V as their descriptors read them
    (KvPrefetch's rows)."""
    kv = (rows(descs[2].base), rows(descs[3].base))
    return (*descs, tuple(rows(g) for g in grads), (lse, delta, lse.stride(0)), kv, (p.q_offsets, p.kv_offsets),
            sched.kernel_args(), score_args(p), p.mask_args())


def dkdv(p: Problem, dout, lse, delta, dk, dv, cfg: DkdvConfig, dq=None, kv_range=(0, UNBOUNDED)):
    """dK, dV into dk, dv (k has rows; D 64/128; bf16/fp16), and dQ by cfg.dq: DqRoute.REDUCE, added into dq
    (float32, zeroed) in the same pass: rows as dout's, or in broadcast mode one slab of Lq rows;
    DqRoute.DIRECT, stored into dq (q's dtype) for the sequences whose keys fit one key tile. Only the
    sequences whose key count lies in kv_range (a length class: jfa.hopper.config.bwd_classes)."""
    q, k, v = p.q, p.k, p.v
    sms = num_sms(q.device)
    spec = key_tile_schedule(p, cfg, sms, kv_range)
    sched = CACHE.get(p.q_offsets, p.kv_offsets, spec, dout.shape[0], p.num_targets)
    q, dout, k, v = aligned(q, dout, k, v)
    dq_out = dq if cfg.dq == DqRoute.DIRECT else dk  # (dk stands in, unused)
    launch(hopper_dkdv_kernel, (sms, ), *kernel_args(p, descriptors(q, dout, k, v, cfg, dq), (dk, dv, dq_out), lse,
                                                     delta, sched), **constexprs(cfg, p), num_warps=4)
