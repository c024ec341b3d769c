"""The Hopper forward: a persistent, warp-specialized Gluon kernel over a load-balanced jfa.schedule.

Glossary as jfa/geometry.py; the score policy as jfa/variants.py; aggregates and the barrier protocol as
jfa/hopper/items.py and buffers.py. Each CTA loops over its items (query tile, head); its partitions share shared
memory and talk through mbarriers:

  load      1 warp (jfa.hopper.fwd_load): per item, TMA-loads the Q tile (one WG_ROWS box per consumer:
            ItemOperands, in FwdConfig.q_slots sets), then streams the tile's K/V blocks through a STAGES-deep
            Ring (a slot is refilled once every consumer has released it).
  softmax   CONSUMERS x 4 warps (consumer w owns Q rows [m0 + 64 w, m0 + 64 w + 64)): per K/V block,
            S = Q K^T (wgmma), online softmax in base 2 (or with an activation, P = f(scale S): no running max,
            no rescale), O += P V (wgmma, P from registers). The loop is pipelined as in FlashAttention-3: S of
            block j is issued before P V of block j-1, so the exponentials of block j run while the tensor cores
            multiply.

CONSUMERS = 2 (128-row tiles, one CTA per SM) lets two warpgroups share every K/V block; CONSUMERS = 1 (64-row
tiles, two CTAs per SM) suits D=64 (jfa.hopper.config). A block that runs past its sequence reads the next
sequence's rows (the key mask hides them; stores skip query rows past the end); a consumer whose rows all lie
past the end skips the math and only releases the buffers.
"""

from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from .. import variants
from ..bwd_common import scaled_rows
from ..geometry import (TARGETS, WINDOW, block_count, edge_in_keys, key_blocks, key_range, right_edge,
                        right_edge_alone, target_tests, visible, window_visible)
from ..jagged import UNBOUNDED
from ..problem import Problem
from ..runtime import launch, num_sms
from ..schedule import CACHE, ScheduleSpec
from ..targets import context_keys, context_rows, has_window_keys, window_keys
from ..variants import score_args, score_fn
from .buffers import ItemOperands, Ring
from .common import WG_ROWS, Batch, Rows, Shape, aggregate, aligned, mma_layout, rows, store_rows, tma_descriptor
from .config import FwdConfig, fwd_classes, query_tile_schedule
from .fwd_load import load_partition
from .items import WorkList


@aggregate
class FwdOutput:
    """Where O and LSE go (LSE: where the score has one), the score group (jfa.variants.score_args), and how O is
    stored in 16-byte pieces (store_rows), converted IN_WARPS or through the warpgroup's scratch
    (jfa.hopper.config.FwdConfig.store_in_warps)."""
    o: Rows
    LSE: gl.tensor
    stride_lh: gl.tensor
    score: gl.tuple
    IN_WARPS: gl.constexpr
    # (FwdConfig.pingpong and weights_in_arms: carried here for want of a forward aggregate of the config)
    PINGPONG: gl.constexpr
    ARMS: gl.constexpr

    @constexpr_function
    def __init__(self, o, LSE, stride_lh, score, IN_WARPS, PINGPONG, ARMS):
        self.o = o
        self.LSE = LSE
        self.stride_lh = stride_lh
        self.score = score
        self.IN_WARPS = gl.constexpr(IN_WARPS)
        self.PINGPONG = gl.constexpr(PINGPONG)
        self.ARMS = gl.constexpr(ARMS)

    @gluon.jit
    def create(o, lse, score, IN_WARPS: gl.constexpr, PINGPONG: gl.constexpr, ARMS: gl.constexpr):
        return FwdOutput(Rows.create(o), lse[0], gl.to_tensor(lse[1]), score, IN_WARPS, PINGPONG, ARMS)


@gluon.jit
def _visible(i_row, n0, tile, batch, BLOCK_N: gl.constexpr, s_cols: gl.constexpr):
    """Which pairs of rows i_row and key block n0 are visible (rows past the sequence's end are never stored, so
    only the keys are tested for existence)."""
    j = gl.expand_dims(n0 + gl.arange(0, BLOCK_N, layout=s_cols), 0)
    return visible(i_row, j, tile.seq, batch.rule, QUERIES=False)


@gluon.jit
def _hide(x, i_row, n0, edges, tile, batch, s_cols: gl.constexpr, SCORE: gl.constexpr):
    """x (scores or weights) of block n0, outside its rows' mask-free blocks, with the invisible pairs hidden: under
    HSTU's mask (jfa.geometry.target_tests), the blocks its context rows alone see (jfa.targets.context_keys) by a
    test of the rows, and where it is the causal window's (window_keys: a history tile's diagonal) by the window's
    test; else, under softmax and the window's rule, past the rows' left edge, where their right edge stays inside
    the keys (edges[3]: edge_in_keys) or the block's keys all exist, by the right edge alone (the causal diagonal:
    one comparison a pair where the test of every pair took two and three selects); else the mask of every pair
    (HSTU's rule takes several operations a pair)."""
    BLOCK_N: gl.constexpr = x.shape[1]
    rule = batch.rule
    if target_tests(rule.KIND, rule.FULL):
        if (n0 >= edges[3]) & (n0 < edges[4]):
            x = variants.hide(x, context_rows(i_row, tile.seq, rule), SCORE)
        elif len(edges) > 5:  # (window_keys given: _softmax_item)
            if n0 >= edges[5]:
                j = gl.expand_dims(n0 + gl.arange(0, BLOCK_N, layout=s_cols), 0)
                x = variants.hide(x, window_visible(i_row, j, tile.seq, rule), SCORE)
            else:
                x = variants.hide(x, _visible(i_row, n0, tile, batch, BLOCK_N, s_cols), SCORE)
        else:
            x = variants.hide(x, _visible(i_row, n0, tile, batch, BLOCK_N, s_cols), SCORE)
    elif variants.masks_scores(SCORE) and rule.KIND == WINDOW:  # (softmax's: an activation's forward ran no faster
        # by it, perf-notes; HSTU's rule with rows past the window's reach, rule.FULL, is not its right edge alone)
        if right_edge_alone(n0, edges[1], edges[3], tile.seq, BLOCK_N):
            j = gl.expand_dims(n0 + gl.arange(0, BLOCK_N, layout=s_cols), 0)
            x = variants.hide(x, right_edge(i_row, j, tile.seq, rule), SCORE)
        else:
            x = variants.hide(x, _visible(i_row, n0, tile, batch, BLOCK_N, s_cols), SCORE)
    else:
        x = variants.hide(x, _visible(i_row, n0, tile, batch, BLOCK_N, s_cols), SCORE)
    return x


@gluon.jit
def _weights(s, state, n0, edges, tile, batch, score, s_cols: gl.constexpr, FIRST: gl.constexpr,
             SCORE: gl.constexpr, ARMS: gl.constexpr):
    """Block n0's scores s -> (its weights P, the running state, alpha: jfa.variants.weights); edges = (the rows,
    their mask-free blocks [full_lo, full_hi), under HSTU's mask the keys [lo, hi) only their context rows see):
    blocks outside the mask-free ones take the mask (_hide). ARMS (FwdConfig.weights_in_arms): a score that masks its
    scores (softmax) computes its weights in both arms of the mask's branch."""
    i_row, full_lo, full_hi = edges[0], edges[1], edges[2]
    # (the edge test written where it is used: held across an activation's weights, it cost the silu forward ~4%)
    if not variants.masks_scores(SCORE):
        p, state, alpha = variants.weights(s, state, score, SCORE, FIRST)
        if (n0 < full_lo) | (n0 >= full_hi):
            p = _hide(p, i_row, n0, edges, tile, batch, s_cols, SCORE)
    elif (batch.rule.KIND == TARGETS) | (not ARMS):  # (in the arms below, HSTU's three masks took 2.5x the code,
        # 112 B of spills)
        if (n0 < full_lo) | (n0 >= full_hi):
            s = _hide(s, i_row, n0, edges, tile, batch, s_cols, SCORE)
        p, state, alpha = variants.weights(s, state, score, SCORE, FIRST)
    elif (n0 < full_lo) | (n0 >= full_hi):  # the weights in both arms: ptxas puts the wait for this consumer's P V
        # at the top of the block after the branch, so with the exponentials after the join they waited for it; in
        # the arms they run under it. A mask-free block's rows all see a key: no empty-row test there
        s = _hide(s, i_row, n0, edges, tile, batch, s_cols, SCORE)
        p, state, alpha = variants.weights(s, state, score, SCORE, FIRST)
    else:
        p, state, alpha = variants.weights(s, state, score, SCORE, FIRST, EMPTY_ROWS=False)
    return p, state, alpha


@constexpr_function
def _turn_asm(WG, WAIT):
    """_turn's instruction: consumer WG waits on named barrier 14 + WG, and arrives on the other's."""
    return f"bar.sync {14 + WG}, 256; mov.b32 $0, $1;" if WAIT else f"bar.arrive {15 - WG}, 256; mov.b32 $0, $1;"


@gluon.jit
def _turn(WG: gl.constexpr, PINGPONG: gl.constexpr, WAIT: gl.constexpr):
    """FlashAttention-3's ping-pong: WAIT: consumer WG waits for its turn to issue a block's MMAs (named barrier
    14 + WG over 256 threads: its own 128 and the other consumer's arrival; Triton's partitions use the low ones);
    else it hands the turn to the other (arrives on the other's barrier), so that one consumer's weights phase runs
    beside the other's MMAs."""
    if PINGPONG:
        gl.inline_asm_elementwise(_turn_asm(WG, WAIT), "=r,r", [gl.to_tensor(0)], dtype=gl.int32, is_pure=False,
                                  pack=1)


@gluon.jit
def _softmax_partition(WG: gl.constexpr, shape, work, batch, q_ops, kv, out):
    """Consumer WG's items: as posted (read after its Q wait, up to the end mark: FwdConfig.posted_items), or
    from the schedule (WorkList.item's three dependent loads per slot)."""
    it = 0
    t = 0
    if WG == 1:  # (ping-pong: consumer 0 issues first)
        _turn(WG, out.PINGPONG, False)
    if q_ops.POSTED:
        q_ops.wait(0, WG)
        valid = q_ops.more(0, 4, work)
        while valid:
            tile = q_ops.posted(t, 4, work, batch, shape, False)
            it = _softmax_item(WG, shape, batch, tile, t, it, q_ops, kv, out)
            t += 1
            q_ops.wait(t, WG)
            valid = q_ops.more(t, 4, work)
    else:
        first, end = work.bounds()
        for idx in range(first, end):
            tile = work.query_tile(idx, batch, shape)
            if tile.valid:
                it = _softmax_item(WG, shape, batch, tile, t, it, q_ops, kv, out)
                t += 1


@gluon.jit
def _softmax_item(WG: gl.constexpr, shape, batch, tile, t, it, q_ops, kv, out):
    """Item t (its Q waited for here unless posted) from K/V block it on: O and LSE of its rows -> the next
    block's count."""
    BLOCK_N: gl.constexpr = shape.BLOCK_N
    HEAD_DIM: gl.constexpr = q_ops.a.shape[2]
    s_rows: gl.constexpr = gl.SliceLayout(1, mma_layout(BLOCK_N))
    row0 = tile.start + WG * WG_ROWS
    n_blocks = tile.n_blocks(BLOCK_N)
    # this warpgroup's fully visible key blocks [full_lo, full_hi): no mask needed there
    _, full_lo, full_hi, _ = key_blocks(row0, tile.seq, batch.rule, WG_ROWS, BLOCK_N)
    n_own = n_blocks
    if WG == 1:  # the tile's walk past this warpgroup's last key (HSTU's context tile: consumer 0's context rows see
        # the whole history, consumer 1's rows up to their diagonal) is handed back unread, so the tensor cores
        # are consumer 0's there (consumer 0 holds the tile's first rows: its walk is the tile's; computed for it
        # too, the key range spilled the gelu_tanh forward)
        _, hi = key_range(row0, tile.seq, batch.rule, WG_ROWS, BLOCK_N)
        n_own = gl.minimum(block_count(tile.lo, hi, BLOCK_N), n_blocks)
    i_row = gl.expand_dims(row0 + gl.arange(0, WG_ROWS, layout=s_rows), 1)
    if target_tests(batch.rule.KIND, batch.rule.FULL):  # (HSTU's cheaper tests: the ranges they take)
        ctx_lo, ctx_hi = context_keys(row0, tile.seq, batch.rule, WG_ROWS, BLOCK_N)
        edges = (i_row, full_lo, full_hi, ctx_lo, ctx_hi)
        if has_window_keys(batch.rule.LAST_ROWS, batch.rule.FULL) and HEAD_DIM > 64:  # (at D=64 its test spilled
            edges = edges + (window_keys(row0, tile.seq, batch.rule, WG_ROWS, BLOCK_N), )  # 28-156 B)
    else:
        edges = (i_row, full_lo, full_hi, edge_in_keys(row0, tile.seq, batch.rule, WG_ROWS))
    state = variants.row_state(gl.full([WG_ROWS], 0.0, gl.float32, layout=s_rows))
    acc = gl.full([WG_ROWS, HEAD_DIM], 0.0, gl.float32, layout=mma_layout(HEAD_DIM))
    if not q_ops.POSTED:
        q_ops.wait(t, WG)
    if (row0 < tile.q_len) & (n_own > 0):
        acc, state = _attend(WG, shape, batch, tile, t, it, n_own, edges, (acc, state), q_ops, kv, out)
    else:  # rows past the sequence's end, or no keys: hand the buffers back
        q_ops.release(t)
        n_own = 0
    for jb in range(n_own, n_blocks):
        _turn(WG, out.PINGPONG, True)  # (the other consumer's turns go on)
        _turn(WG, out.PINGPONG, False)
        kv.wait_b(it + jb)
        kv.wait_a(it + jb)
        kv.release(it + jb)
    if row0 < tile.q_len:
        _store(out, acc, state, row0, tile, s_rows, q_ops.a.dtype, shape.SCORE)
    return it + n_blocks


@gluon.jit
def _attend(WG: gl.constexpr, shape, batch, tile, t, it, n_blocks, edges, carry, q_ops, kv, out):
    """Consumer WG's rows of item t against its n_blocks K/V blocks from block it on (FlashAttention-3's overlap:
    S of block j is issued before P V of block j-1); edges: the rows (i_row) and their mask-free blocks [full_lo,
    full_hi); carry: (acc, the score's running state) -> the same after the item."""
    BLOCK_N: gl.constexpr = shape.BLOCK_N
    SCORE: gl.constexpr = shape.SCORE
    dtype: gl.constexpr = q_ops.a.dtype
    acc, state = carry
    s_layout: gl.constexpr = mma_layout(BLOCK_N)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    s_zero = gl.full([WG_ROWS, BLOCK_N], 0.0, gl.float32, layout=s_layout)
    q_buf = q_ops.a_block(t, WG)
    lo = tile.lo
    # prologue: S of the first block and its weights
    k_first = kv.wait_a(it)
    _turn(WG, out.PINGPONG, True)
    s = warpgroup_mma(q_buf, k_first.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    _turn(WG, out.PINGPONG, False)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    kv.release_a(it)  # (K read: the producer may load the block STAGES on)
    p, state, alpha = _weights(s, state, lo, edges, tile, batch, out.score, s_cols, True, SCORE, out.ARMS)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    for jb in range(1, n_blocks):
        n0 = lo + jb * BLOCK_N
        k_buf = kv.wait_a(it + jb)
        _turn(WG, out.PINGPONG, True)
        s = warpgroup_mma(q_buf, k_buf.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        v_buf = kv.wait_b(it + jb - 1)  # (V_{j-1} is loaded after K_j: S_j goes to the tensor cores without it)
        acc = warpgroup_mma(p_op, v_buf, acc, is_async=True)
        _turn(WG, out.PINGPONG, False)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))  # S_j done, P V_{j-1} in flight
        kv.release_a(it + jb)
        p, state, alpha = _weights(s, state, n0, edges, tile, batch, out.score, s_cols, False, SCORE, out.ARMS)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))[0]
        kv.release_b(it + jb - 1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)  # (an activation's alpha is 1: folds away)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
    q_ops.release(t)  # last S issued and done: the producer may load the next Q
    last = it + n_blocks - 1
    acc = warpgroup_mma(p_op, kv.wait_b(last), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))[0]
    kv.release_b(last)
    return acc, state


@gluon.jit
def _store(out, acc, state, row0, tile, s_rows: gl.constexpr, dtype: gl.constexpr, SCORE: gl.constexpr):
    """This warpgroup's rows of O (acc times the score's row factor: 1 / the row sum, 0 for a row that saw no key;
    an activation's out scale) and, where the score has one, their natural-log LSE."""
    o_rows: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    if variants.has_lse(SCORE):
        lse = variants.lse(state, out.score)
    factor = gl.convert_layout(variants.out_factor(state, out.score, SCORE), o_rows)
    o = (acc * gl.expand_dims(factor, 1)).to(dtype)
    base = out.o.head(tile.head)
    # (the stride zero-extended: its sign, a value held across the items, was spilled under HSTU's mask)
    store_rows(base, out.o.stride_t.to(gl.uint32).to(gl.int64), o, row0, tile.q_start, tile.q_len, out.IN_WARPS)
    if variants.has_lse(SCORE):
        offs_m = row0 + gl.arange(0, WG_ROWS, layout=s_rows)
        gl.store(out.LSE + tile.head * out.stride_lh + tile.q_start + offs_m, lse, mask=offs_m < tile.q_len)


@gluon.jit
def hopper_fwd_kernel(q_desc, k_desc, v_desc, o, lse, offsets, sched, score, mask, pages, GROUP: gl.constexpr,
                      BROADCAST: gl.constexpr, CFG: gl.constexpr, SCORE: gl.constexpr):
    """o: O as (pointer, row stride, head stride); lse: (LSE, head stride); offsets: (q_offsets, kv_offsets);
    sched: the schedule's (jfa.schedule.Schedule.kernel_args); score, mask, pages: jfa.variants.score_args,
    jfa.problem.Problem.mask_args, .page_args; CFG: the FwdConfig; SCORE: jfa.variants.score_fn."""
    CONSUMERS: gl.constexpr = CFG.consumers
    STAGES: gl.constexpr = CFG.stages
    POSTED: gl.constexpr = CFG.posts
    IN_WARPS: gl.constexpr = CFG.store_in_warps
    shape = Shape(GROUP, CONSUMERS * WG_ROWS, CFG.block_n, CONSUMERS, False, BROADCAST, SCORE)
    work = WorkList.create(sched, CFG.queue)
    batch = Batch.create(offsets, mask)
    out = FwdOutput.create(o, lse, score, IN_WARPS, CFG.pingpong, CFG.weights_in_arms)
    q_ops = ItemOperands.alloc(q_desc, q_desc, CONSUMERS, False, CFG.q_slots, POSTED, False, CFG.posted_items)
    kv = Ring.alloc(k_desc, v_desc, STAGES, CONSUMERS, True)
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_softmax_partition, (0, shape, work, batch, q_ops, kv, out)),
            (_softmax_partition, (1, shape, work, batch, q_ops, kv, out)),
            (load_partition, (shape, work, batch, q_desc, k_desc, v_desc, q_ops, kv, pages)),
        ], [4, 1], [232, 40])
    else:
        gl.warp_specialize([
            (_softmax_partition, (0, shape, work, batch, q_ops, kv, out)),
            (load_partition, (shape, work, batch, q_desc, k_desc, v_desc, q_ops, kv, pages)),
        ], [1], [24])


def descriptors(q, k, v, cfg: FwdConfig):
    """TMA descriptors: q in WG_ROWS-row boxes (one per consumer), k and v in block_n-row boxes."""
    return tma_descriptor(q, WG_ROWS.value), tma_descriptor(k, cfg.block_n), tma_descriptor(v, cfg.block_n)


def constexprs(cfg: FwdConfig, p: Problem) -> dict:
    """The kernel's compile-time arguments for this config and problem (the launcher's and jfa.hopper.aot's)."""
    return dict(GROUP=p.group, BROADCAST=p.broadcast, CFG=cfg, SCORE=score_fn(p.activation))


def kernel_args(p: Problem, descs, out, lse, sched) -> tuple:
    """The kernel's run-time arguments (the launcher's, and jfa.hopper.aot's on meta tensors); the mask group with
    HSTU's right side folded (jfa.geometry.mask_group: it spares the forward two spills)."""
    return (*descs, rows(out), (lse, lse.stride(0)), (p.q_offsets, p.kv_offsets), sched.kernel_args(),
            score_args(p), p.mask_args(fold_right=True), p.page_args())


@dataclass(frozen=True)
class Launch:
    """One launch of the forward kernel as far as the problem's host key decides it (jfa.problem.Problem.host_key):
    its config, grid, schedule spec and the kernel's compile-time arguments and launch options."""
    cfg: FwdConfig
    ctas: int
    spec: ScheduleSpec
    key_rows: int  # the schedule's bound on the keys (jfa.problem.Problem.key_rows_bound)
    options: dict


_PLANS: dict = {}  # (host key, cfg) -> plan's launches (emptied when full)


def plan(p: Problem, cfg: FwdConfig | None = None) -> tuple:
    """The forward's launches: one in cfg, else fwd_classes(p)'s (one a key-length class). Kept by the problem's host
    key, so that a model's layers (and do_bench's calls) choose them once: choosing them per call was ~6 us of the
    host time that a short forward's do_bench span holds (docs/perf-notes.md)."""
    key = (p.host_key(), cfg)
    launches = _PLANS.get(key)
    if launches is None:
        classes = fwd_classes(p) if cfg is None else [(cfg, (0, UNBOUNDED))]
        for c, _ in classes:
            if p.paged and p.page_size % c.block_n:
                raise ValueError(f"paged k/v: page_size {p.page_size} is not a multiple of the forward's key block "
                                 f"{c.block_n}")
        launches = tuple(_launch(p, c, kv_range) for c, kv_range in classes)
        if len(_PLANS) >= 64:
            _PLANS.clear()
        _PLANS[key] = launches
    return launches


def _launch(p: Problem, cfg: FwdConfig, kv_range: tuple) -> Launch:
    ctas = num_sms(p.q.device) * cfg.ctas_per_sm
    return Launch(cfg, ctas, query_tile_schedule(p, p.rows, cfg.block_m, ctas, kv_range), p.key_rows_bound(),
                  dict(constexprs(cfg, p), num_warps=4, **cfg.launch_options()))


def forward(p: Problem, cfg: FwdConfig | None = None):
    """-> (out, lse) as jfa.triton.launch.forward, by plan(p, cfg). Needs an sm_90 device, bf16/fp16, D in (64,
    128)."""
    launches = plan(p, cfg)
    q, k, v = p.q, p.k, p.v
    out = torch.empty(p.rows, p.heads, p.head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(p.heads, p.lse_rows, dtype=torch.float32, device=q.device)
    if p.rows == 0 or p.batch == 0 or q.shape[0] == 0:
        return out, lse
    if k.shape[0] == 0:  # no keys anywhere (a TMA descriptor needs rows): every query sees nothing
        return out.zero_(), lse.fill_(float("-inf"))
    q, k, v = aligned(q, k, v)
    for one in launches:  # (each length class writes its sequences' rows)
        sched = CACHE.get(p.q_offsets, p.kv_offsets, one.spec, one.key_rows, p.num_targets)
        launch(hopper_fwd_kernel, (one.ctas, ), *kernel_args(p, descriptors(q, k, v, one.cfg), out, lse, sched),
               **one.options)
    return scaled_rows(out, p), lse  # (a per-row out scale: times the output afterwards)
