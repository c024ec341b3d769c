"""The Hopper dQ pass: a persistent, warp-specialized Gluon kernel (the second pass of jfa.hopper.bwd).

Deterministic, no atomics: the forward's structure (jfa.hopper.fwd) with a second operand. Items are query
tiles of 128 rows x heads on the forward's kind of schedule (at D=128 the very same one). Partitions:

  load      1 warp: per item, the Q and dO rows of both consumers (ItemOperands, 64 rows each), then the
            tile's K/V blocks through a STAGES-deep Ring.
  dq (x2)   4 warps each: per K/V block, S = Q K^T and dP = dO V^T (wgmma), P = exp2(S - lse),
            dS = P (dP - Delta) (with an activation f: dS = f'(scale S) dP, no P, LSE or Delta: jfa.variants'
            score policy),
            dQ += dS K (wgmma, dS from registers). dQ is stored once per item.

In broadcast mode it writes per-sequence float32 partials, summed over the batch afterwards. With SKIP_KV > 0 it
skips the sequences of at most SKIP_KV keys, whose dQ the dK/dV pass stored (jfa.hopper.config.DQ_DIRECT).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from .. import variants
from ..geometry import key_blocks, visible
from ..jagged import UNBOUNDED
from ..problem import Problem
from ..runtime import launch, num_sms
from ..schedule import CACHE
from ..variants import score_args, score_fn
from .buffers import ItemOperands, Ring
from .common import WG_ROWS, Batch, Rows, Shape, aggregate, aligned, mma_layout, rows, tma_descriptor
from .config import DqConfig, query_tile_schedule
from .items import WorkList


@aggregate
class DqGrads:
    """What the consumers read per row (LSE, Delta: where the score has them) and write per item (dQ), with the
    score group (jfa.variants.score_args)."""
    dq: Rows
    LSE: gl.tensor
    DELTA: gl.tensor
    stride_lh: gl.tensor
    score: gl.tuple

    @constexpr_function
    def __init__(self, dq, LSE, DELTA, stride_lh, score):
        self.dq = dq
        self.LSE = LSE
        self.DELTA = DELTA
        self.stride_lh = stride_lh
        self.score = score

    @gluon.jit
    def create(dq, stats, score):
        return DqGrads(Rows.create(dq), stats[0], stats[1], gl.to_tensor(stats[2]), score)

    @gluon.jit
    def row_stats(self, tile, offs_m):
        """The rows' (log2(e) LSE, Delta) of the item's head, broadcast along the keys (where the score has them:
        variants.has_lse)."""
        in_q = offs_m < tile.q_len
        rows = tile.head * self.stride_lh + tile.q_start + offs_m
        return (gl.expand_dims(gl.load(self.LSE + rows, mask=in_q, other=0.0) * variants.LOG2E, 1),
                gl.expand_dims(gl.load(self.DELTA + rows, mask=in_q, other=0.0), 1))


@gluon.jit
def _load_partition(shape, work, batch, q_desc, do_desc, k_desc, v_desc, qdo_ops, kv, SKIP_KV: gl.constexpr):
    """(Q, dO) of both consumers per item, then its K/V blocks."""
    HEAD_DIM: gl.constexpr = q_desc.block_shape[1]
    BLOCK_N: gl.constexpr = shape.BLOCK_N
    it = 0
    t = 0
    first, end = work.bounds()
    for idx in range(first, end):
        tile = work.query_tile(idx, batch, shape)
        if tile.valid & (tile.kv_len > SKIP_KV):
            q_row0 = tile.start if shape.BROADCAST else tile.q_start + tile.start  # broadcast: one dense q
            col = tile.head * HEAD_DIM
            qdo_ops.acquire(t)
            for w in gl.static_range(2):
                if tile.start + w * WG_ROWS < tile.q_len:
                    qdo_ops.load(t, w, q_desc, [q_row0 + w * WG_ROWS, col], do_desc,
                                 [tile.q_start + tile.start + w * WG_ROWS, col])
                else:  # no rows for consumer w: it reads neither
                    qdo_ops.skip(t, w)
            kv_col = (tile.head // shape.GROUP) * HEAD_DIM
            for part in gl.static_range(tile.PARTS):  # the item's walk (Item.part)
                lo, hi = tile.part(part)
                for n0 in range(lo, hi, BLOCK_N):
                    kv.fill(it, k_desc, [tile.kv_start + n0, kv_col], v_desc, [tile.kv_start + n0, kv_col])
                    it += 1
            t += 1


@gluon.jit
def _dq_partition(WG: gl.constexpr, shape, work, batch, qdo_ops, kv, grads, SKIP_KV: gl.constexpr):
    """Consumer WG's rows of each item: their dQ."""
    HEAD_DIM: gl.constexpr = qdo_ops.a.shape[2]
    BLOCK_N: gl.constexpr = shape.BLOCK_N
    s_layout: gl.constexpr = mma_layout(BLOCK_N)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_zero = gl.full([WG_ROWS, BLOCK_N], 0.0, gl.float32, layout=s_layout)
    qdo = (qdo_ops.a.index(WG), qdo_ops.b.index(WG))
    it = 0
    t = 0
    first, end = work.bounds()
    for idx in range(first, end):
        tile = work.query_tile(idx, batch, shape)
        if tile.valid & (tile.kv_len > SKIP_KV):
            row0 = tile.start + WG * WG_ROWS
            q_len = tile.q_len
            n_blocks = tile.n_blocks(BLOCK_N)
            _, full_lo, full_hi, _ = key_blocks(row0, tile.seq, batch.rule, WG_ROWS, BLOCK_N)
            offs_m = row0 + gl.arange(0, WG_ROWS, layout=s_rows)
            stats = (None, None)  # (a Triton function cannot return None)
            if variants.has_lse(shape.SCORE):
                stats = grads.row_stats(tile, offs_m)
            dq = gl.full([WG_ROWS, HEAD_DIM], 0.0, gl.float32, layout=mma_layout(HEAD_DIM))
            qdo_ops.wait(t, WG)
            if (row0 < q_len) & (n_blocks > 0):
                for j in range(0, n_blocks):
                    dq = _dq_block(tile, tile.lo + j * BLOCK_N, it + j, dq, qdo, kv, batch, grads, offs_m, stats,
                                   (full_lo, full_hi), s_zero, shape.SCORE)
                qdo_ops.release(t)
            else:  # rows past the sequence's end, or no keys: hand the buffers back
                qdo_ops.release(t)
                for j in range(0, n_blocks):
                    kv.wait(it + j)
                    kv.release(it + j)
            it += n_blocks
            t += 1
            if row0 < q_len:
                _store_dq(grads, dq, row0, tile)


@gluon.jit
def _dq_block(tile, n0, it, dq, qdo, kv, batch, grads, offs_m, stats, band, s_zero, SCORE: gl.constexpr):
    """Key block n0 (ring block it) of this warpgroup's rows (qdo: its Q and dO): dQ += dS K, dS from the score
    policy (jfa.variants; stats: the rows' (log2(e) LSE, Delta) where the score has them); blocks outside band =
    [full_lo, full_hi) take the mask."""
    q_buf, do_buf = qdo
    dtype: gl.constexpr = q_buf.dtype
    s_cols: gl.constexpr = gl.SliceLayout(0, s_zero.type.layout)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq.type.layout, k_width=2)
    full_lo, full_hi = band
    k_buf, v_buf = kv.wait(it)
    s = warpgroup_mma(q_buf, k_buf.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    dp = warpgroup_mma(do_buf, v_buf.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
    # (an activation's P is not needed: dead)
    p, g = variants.bwd_weights(s, stats[0], grads.score, SCORE, FOLD=variants.fold_backward(dq.type.shape[1]))
    if (n0 < full_lo) | (n0 >= full_hi):  # edge block: zero the pairs a row may not see
        key = gl.expand_dims(n0 + gl.arange(0, s_zero.shape[1], layout=s_cols), 0)
        p, g = variants.mask_grads(p, g, visible(gl.expand_dims(offs_m, 1), key, tile.seq, batch.rule), SCORE)
    dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
    ds_op = gl.convert_layout(variants.dscores(p, dp, g, stats[1], SCORE).to(dtype), op_layout)
    dq = warpgroup_mma(ds_op, k_buf, dq, is_async=True)
    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds_op))[0]
    kv.release(it)
    return dq


@gluon.jit
def _store_dq(grads, dq, row0, tile):
    HEAD_DIM: gl.constexpr = dq.shape[1]
    acc_rows: gl.constexpr = gl.SliceLayout(1, dq.type.layout)
    acc_cols: gl.constexpr = gl.SliceLayout(0, dq.type.layout)
    rows = row0 + gl.arange(0, WG_ROWS, layout=acc_rows)
    cols = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=acc_cols), 0)
    ptrs = (grads.dq.ptr + gl.expand_dims((tile.q_start + rows).to(gl.int64), 1) * grads.dq.stride_t
            + tile.head * grads.dq.stride_h + cols)
    gl.store(ptrs, (dq * grads.score[2]).to(grads.dq.ptr.dtype.element_ty), mask=gl.expand_dims(rows < tile.q_len, 1))


@gluon.jit
def hopper_dq_kernel(q_desc, do_desc, k_desc, v_desc, dq, stats, offsets, sched, score, mask, GROUP: gl.constexpr,
                     BROADCAST: gl.constexpr, CFG: gl.constexpr, SCORE: gl.constexpr, SKIP_KV: gl.constexpr):
    """dq: dQ as (pointer, row stride, head stride); stats: (LSE, Delta, their head stride); the rest as
    jfa.hopper.fwd's kernel; CFG: a DqConfig; SKIP_KV: the sequences of at most that many keys are skipped."""
    STAGES: gl.constexpr = CFG.stages
    shape = Shape(GROUP, 2 * WG_ROWS, CFG.block_n, 2, False, BROADCAST, SCORE)
    work = WorkList.create(sched)
    batch = Batch.create(offsets, mask)
    qdo_ops = ItemOperands.alloc(q_desc, do_desc, 2, True)
    kv = Ring.alloc(k_desc, v_desc, STAGES, 2, False)
    grads = DqGrads.create(dq, stats, score)
    gl.warp_specialize([
        (_dq_partition, (0, shape, work, batch, qdo_ops, kv, grads, SKIP_KV)),
        (_dq_partition, (1, shape, work, batch, qdo_ops, kv, grads, SKIP_KV)),
        (_load_partition, (shape, work, batch, q_desc, do_desc, k_desc, v_desc, qdo_ops, kv, SKIP_KV)),
    ], [4, 1], [232, 40])


def descriptors(q, dout, k, v, cfg: DqConfig):
    """TMA descriptors: q and dO in WG_ROWS-row boxes (one per consumer), k and v in block_n-row boxes."""
    rows = WG_ROWS.value
    return (tma_descriptor(q, rows), tma_descriptor(dout, rows), tma_descriptor(k, cfg.block_n),
            tma_descriptor(v, cfg.block_n))


def constexprs(cfg: DqConfig, p: Problem, skip_kv: int) -> dict:
    """The kernel's compile-time arguments for this config and problem (the launcher's and jfa.hopper.aot's)."""
    return dict(GROUP=p.group, BROADCAST=p.broadcast, CFG=cfg, SCORE=score_fn(p.activation), SKIP_KV=skip_kv)


def kernel_args(p: Problem, descs, dq, lse, delta, sched) -> tuple:
    """The kernel's run-time arguments (the launcher's, and jfa.hopper.aot's on meta tensors)."""
    return (*descs, rows(dq), (lse, delta, lse.stride(0)), (p.q_offsets, p.kv_offsets), sched.kernel_args(),
            score_args(p), p.mask_args())


def dq_pass(p: Problem, dout, lse, delta, dq, cfg: DqConfig, skip_kv: int = 0, kv_range=(0, UNBOUNDED)):
    """The dQ pass into dq (k has rows; float32 per-sequence partials in broadcast mode), but for the sequences of
    at most skip_kv keys, over the sequences whose key count lies in kv_range (a length class)."""
    q, k, v = p.q, p.k, p.v
    sms = num_sms(q.device)
    spec = query_tile_schedule(p, dq.shape[0], cfg.block_m, sms, kv_range)
    sched = CACHE.get(p.q_offsets, p.kv_offsets, spec, k.shape[0], p.num_targets)
    q, dout, k, v = aligned(q, dout, k, v)
    launch(hopper_dq_kernel, (sms, ), *kernel_args(p, descriptors(q, dout, k, v, cfg), dq, lse, delta, sched),
           **constexprs(cfg, p, skip_kv), num_warps=4)
