"""The Hopper dQ pass: a persistent, warp-specialized Gluon kernel (the second pass of jfa.hopper.bwd).

Deterministic, no atomics: the forward's structure (jfa.hopper.fwd) with a second operand. Items are query
tiles of 128 rows x heads on the forward's kind of schedule (at D=128 the very same one). Partitions:

  load      1 warp: per item, the Q and dO rows of both consumers (ItemOperands, 64 rows each), then the
            tile's K/V blocks through a STAGES-deep Ring.
  dq (x2)   4 warps each: per K/V block, S = Q K^T and dP = dO V^T (wgmma), P = exp2(S - lse),
            dS = P (dP - Delta) (with an activation f: dS = f'(scale S) dP, no P, LSE or Delta: jfa.variants),
            dQ += dS K (wgmma, dS from registers). dQ is stored once per item.

In broadcast mode it writes per-sequence float32 partials, summed over the batch afterwards. With SKIP_KV > 0 it
skips the sequences of at most SKIP_KV keys, whose dQ the dK/dV pass stored (jfa.hopper.config.DQ_DIRECT).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from ..geometry import key_blocks, visible
from ..problem import Problem
from ..runtime import num_sms
from ..schedule import CACHE
from ..bwd_common import backward_scales
from ..variants import SOFTMAX, act_code, activation_grad, softmax_dscores, softmax_weights
from .buffers import ItemOperands, Ring
from .common import WG_ROWS, Batch, Shape, aggregate, aligned, mma_layout, tma_descriptor
from .config import DqConfig, query_tile_schedule
from .items import WorkList

LOG2E = gl.constexpr(1.4426950408889634)


@aggregate
class DqGrads:
    """What the consumers read per row (LSE, Delta) and write per item (dQ), with the scales."""
    DQ: gl.tensor
    LSE: gl.tensor
    DELTA: gl.tensor
    stride_dqt: gl.tensor
    stride_dqh: gl.tensor
    stride_lh: gl.tensor
    scale: gl.tensor
    qk_scale: gl.tensor

    @constexpr_function
    def __init__(self, DQ, LSE, DELTA, stride_dqt, stride_dqh, stride_lh, scale, qk_scale):
        self.DQ = DQ
        self.LSE = LSE
        self.DELTA = DELTA
        self.stride_dqt = stride_dqt
        self.stride_dqh = stride_dqh
        self.stride_lh = stride_lh
        self.scale = scale
        self.qk_scale = qk_scale

    @gluon.jit
    def create(DQ, LSE, DELTA, stride_dqt, stride_dqh, stride_lh, scale, qk_scale):
        return DqGrads(DQ, LSE, DELTA, gl.to_tensor(stride_dqt), gl.to_tensor(stride_dqh), gl.to_tensor(stride_lh),
                       scale, qk_scale)


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
            for n0 in range(tile.lo, tile.hi, BLOCK_N):  # the item's walk (Item.n_blocks blocks)
                kv.fill(it, k_desc, [tile.kv_start + n0, kv_col], v_desc, [tile.kv_start + n0, kv_col])
                it += 1
            t += 1


@gluon.jit
def _dq_partition(WG: gl.constexpr, shape, work, batch, qdo_ops, kv, grads, SKIP_KV: gl.constexpr):
    HEAD_DIM: gl.constexpr = qdo_ops.a.shape[2]
    BLOCK_N: gl.constexpr = shape.BLOCK_N
    s_layout: gl.constexpr = mma_layout(BLOCK_N)
    acc_layout: gl.constexpr = mma_layout(HEAD_DIM)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    s_zero = gl.full([WG_ROWS, BLOCK_N], 0.0, gl.float32, layout=s_layout)
    q_buf = qdo_ops.a.index(WG)
    do_buf = qdo_ops.b.index(WG)

    it = 0
    t = 0
    first, end = work.bounds()
    for idx in range(first, end):
        tile = work.query_tile(idx, batch, shape)
        if tile.valid & (tile.kv_len > SKIP_KV):
            row0 = tile.start + WG * WG_ROWS
            q_len = tile.q_len
            n_blocks = tile.n_blocks(BLOCK_N)
            _, full_lo, full_hi, _ = key_blocks(row0, tile.seq(), batch.rule(), WG_ROWS, BLOCK_N)
            offs_m = row0 + gl.arange(0, WG_ROWS, layout=s_rows)
            in_q = offs_m < q_len
            row_off = tile.head * grads.stride_lh + tile.q_start + offs_m
            lse2 = offs_m  # (an activation has neither)
            delta = offs_m
            if shape.ACT == SOFTMAX:
                lse2 = gl.load(grads.LSE + row_off, mask=in_q, other=0.0) * LOG2E
                delta = gl.load(grads.DELTA + row_off, mask=in_q, other=0.0)
            dq = gl.full([WG_ROWS, HEAD_DIM], 0.0, gl.float32, layout=acc_layout)
            qdo_ops.wait(t, WG)
            if (row0 < q_len) & (n_blocks > 0):
                for j in range(0, n_blocks):
                    dq = _dq_block(tile, tile.lo + j * BLOCK_N, it + j, dq, q_buf, do_buf, kv, batch, grads, offs_m,
                                   (lse2, delta), (full_lo, full_hi), s_zero, shape.ACT)
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
def _dq_block(tile, n0, it, dq, q_buf, do_buf, kv, batch, grads, offs_m, stats, band, s_zero, ACT: gl.constexpr):
    """Key block n0 (ring block it) of this warpgroup's rows: dQ += dS K, dS = P (dP - Delta) from the rows'
    stats = (lse2, Delta), or with an activation f'(scale S) dP; blocks outside band = [full_lo, full_hi) take the
    mask."""
    dtype: gl.constexpr = q_buf.dtype
    s_cols: gl.constexpr = gl.SliceLayout(0, s_zero.type.layout)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq.type.layout, k_width=2)
    lse2, delta = stats
    full_lo, full_hi = band
    k_buf, v_buf = kv.wait(it)
    s = warpgroup_mma(q_buf, k_buf.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    dp = warpgroup_mma(do_buf, v_buf.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
    if ACT == SOFTMAX:
        p = softmax_weights(s, grads.qk_scale, gl.expand_dims(lse2, 1))
        if (n0 < full_lo) | (n0 >= full_hi):  # edge block: zero the pairs a row may not see
            key = gl.expand_dims(n0 + gl.arange(0, s_zero.shape[1], layout=s_cols), 0)
            p = gl.where(visible(gl.expand_dims(offs_m, 1), key, tile.seq(), batch.rule()), p, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
        ds = softmax_dscores(p, dp, gl.expand_dims(delta, 1))
    else:  # (dQ needs no P)
        df = activation_grad(s * grads.qk_scale, ACT, True)
        if (n0 < full_lo) | (n0 >= full_hi):
            key = gl.expand_dims(n0 + gl.arange(0, s_zero.shape[1], layout=s_cols), 0)
            df = gl.where(visible(gl.expand_dims(offs_m, 1), key, tile.seq(), batch.rule()), df, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
        ds = df * dp
    ds_op = gl.convert_layout(ds.to(dtype), op_layout)
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
    ptrs = (grads.DQ + gl.expand_dims((tile.q_start + rows).to(gl.int64), 1) * grads.stride_dqt
            + tile.head * grads.stride_dqh + cols)
    gl.store(ptrs, (dq * grads.scale).to(grads.DQ.dtype.element_ty), mask=gl.expand_dims(rows < tile.q_len, 1))


@gluon.jit
def hopper_dq_kernel(q_desc, do_desc, k_desc, v_desc, DQ, LSE, DELTA, q_offsets, kv_offsets, tiles, order, sm_start,
                     stride_dqt, stride_dqh, stride_lh, tile_capacity, heads, scale, qk_scale, LEFT, RIGHT,
                     num_targets, CONTEXT, GROUP: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     BROADCAST: gl.constexpr, SKIP_KV: gl.constexpr, ACT: gl.constexpr, TARGETS: gl.constexpr,
                     num_warps: gl.constexpr):
    shape = Shape(GROUP, 2 * WG_ROWS, BLOCK_N, 2, False, BROADCAST, ACT)
    work = WorkList.create(tiles, order, sm_start, tile_capacity, heads)
    batch = Batch.create(q_offsets, kv_offsets, LEFT, RIGHT, num_targets, CONTEXT, TARGETS)
    qdo_ops = ItemOperands.alloc(q_desc, do_desc, 2, True)
    kv = Ring.alloc(k_desc, v_desc, STAGES, 2, False)
    grads = DqGrads.create(DQ, LSE, DELTA, stride_dqt, stride_dqh, stride_lh, scale, qk_scale)
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
    return dict(GROUP=p.group, BROADCAST=p.broadcast, SKIP_KV=skip_kv, **cfg.constexprs(), ACT=act_code(p.activation),
                TARGETS=p.targets, num_warps=4)


def dq_pass(p: Problem, dout, lse, delta, dq, cfg: DqConfig, skip_kv: int = 0):
    """The dQ pass into dq (k has rows; float32 per-sequence partials in broadcast mode), but for the sequences of
    at most skip_kv keys."""
    q, k, v = p.q, p.k, p.v
    sms = num_sms(q.device)
    spec = query_tile_schedule(p, dq.shape[0], cfg.block_m, sms)
    sched = CACHE.get(p.q_offsets, p.kv_offsets, spec, k.shape[0], p.num_targets)
    q, dout, k, v = aligned(q, dout, k, v)
    hopper_dq_kernel[(sms, )](
        *descriptors(q, dout, k, v, cfg), dq, lse, delta, p.q_offsets, p.kv_offsets, sched.tiles, sched.order,
        sched.sm_start, dq.stride(0), dq.stride(1), lse.stride(0), sched.tiles.shape[1], q.shape[1],
        *backward_scales(p), *p.mask_args(), **constexprs(cfg, p, skip_kv))
