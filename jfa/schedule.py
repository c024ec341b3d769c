"""Load-balanced tile schedules for the persistent kernels (one CTA per SM looping over its work items), built
and kept on the device.

A work item is (tile, head): a tile of ``block_m`` rows of one sequence (query rows, or key rows for the
backward's dK/dV pass: ScheduleSpec.key_tiles), times one of ``heads``. Its cost is the number of ``block_n``
blocks of the other side it visits (jfa.geometry.tile_walk, the kernels' own walk). Items are dealt to the
CTAs in a zigzag (round r deals CTA 0..S-1 when r is even, S-1..0 when odd), the scheme of Meta's TLX jagged
kernel, in this order: tiles ranked by their sequence's heaviest tile (heaviest first, a sequence's tiles
together), cut into windows of WINDOW_ROUNDS rounds, heaviest first inside each window (costs in CLASSES classes),
and inside a window's cost class head by head (so the concurrent items hold fewer heads' K/V, _deal: forward 1-3%
faster on most long batches, backward even); each window's complete rounds turned by ROTATE CTAs from the last (every
window ends with its lightest items, which would otherwise land on the same CTAs every time: window-256 1.07).
Ranked by each tile's own cost alone (as before), a causal batch's concurrent tiles came from ~100 sequences and
the forward read K/V from DRAM (causal-skewed-4k: DRAM 79% busy); ranked by sequence alone, the CTA loads were
uneven (max/mean 1.18). Windows of two rounds: 1.02, with a working set of ~22 MB (docs/perf-notes.md).
CTA s runs ``order[sm_start[s]:sm_start[s + 1]]``; -1 marks the tile table's spare capacity (sized from shapes
alone: ``rows // block_m + B`` tiles).

Reuse is safe whatever wrote the offsets. A schedule remembers the offsets it was built from (a copy on the
device), and every use starts with one small kernel (``refresh_kernel``, one CTA) that compares them with the
live offsets and, if anything differs, rebuilds the schedule in place: no host sync, so it is capturable in a
CUDA graph and replays correctly with refilled offsets. ``ScheduleCache`` keeps one schedule per (offsets
tensors, ScheduleSpec), so a training step's layers, forward and backward share one build per batch.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .geometry import block_count, mask_group, mask_rule, sequence, sequence_bounds, tile_walk
from .jagged import UNBOUNDED, tile_capacity
from .runtime import check_runnable, launch


@dataclass(frozen=True)
class ScheduleSpec:
    """What a schedule depends on besides the offsets' values (the cache's explicit key)."""
    rows: int  # rows of the tiled side (the query rows: B * Lq in broadcast mode; the key rows for key tiles)
    heads: int  # items per tile
    block_m: int  # rows per tile
    block_n: int  # the other side's rows per cost unit
    ctas: int  # the persistent grid
    mask: tuple = (UNBOUNDED, UNBOUNDED, 0)  # the mask's scalars (jfa.problem.Problem.mask_scalars)
    targets: bool = False  # HSTU's mask (jfa.jagged.target_mask): the costs take the sequences' targets
    key_tiles: bool = False  # the tiles are key tiles (the kv offsets'), costed by the queries that see them
    last_rows: bool = False  # HSTU's mask in cross-attention (jfa.problem.Problem.last_rows)
    kv_range: tuple = (0, UNBOUNDED)  # a length class: only the sequences whose key count lies in [lo, hi)


@dataclass(frozen=True)
class Schedule:
    tiles: torch.Tensor  # int32 [2, capacity]: (sequence, tile index within it); sequence -1 = spare
    tile_cost: torch.Tensor  # int32 [capacity]: blocks visited by each tile (-1 for spare capacity)
    order: torch.Tensor  # int32 [capacity * heads]: item ids (tile * heads + head) grouped by CTA; -1 = none
    sm_start: torch.Tensor  # int32 [ctas + 1]: CTA s owns order[sm_start[s]:sm_start[s + 1]]
    heads: int
    seen: torch.Tensor  # int64 [2 (B + 1)]: the tiled then the other side's offsets the schedule was built from
    scratch: torch.Tensor  # int32: per-sequence tile ends and keys [B] each, two histograms [buckets] each, the first
    # ranks [capacity], three window histograms [windows * CLASSES] each (_scratch_size)
    # int32 [1 + 2 ctas]: a work queue's next rank (zeroed by every refresh: deal_slot), then each CTA's two
    # mailboxes, where its producer posts the slot of each item it takes (jfa.hopper.items.WorkList.post)
    ticket: torch.Tensor

    def kernel_args(self) -> tuple:
        """What a persistent kernel reads of it (jfa.hopper.items.WorkList): tiles, order, sm_start, the tile
        table's capacity, heads, ticket."""
        return (self.tiles, self.order, self.sm_start, self.tiles.shape[1], self.heads, self.ticket)


WINDOW_ROUNDS = 2  # rounds of the deal per window
CLASSES = 32  # cost classes inside a window
ROTATE = 37  # CTAs the deal turns by from one window to the next (complete rounds only)
_WINDOW_ROUNDS, _CLASSES, _ROTATE = tl.constexpr(WINDOW_ROUNDS), tl.constexpr(CLASSES), tl.constexpr(ROTATE)
# tiles per step of the one-CTA refresh, 8 per thread of 16 warps: its sequential passes are latency-bound steps
# (1024 on 4 warps: a rebuild took 0.23-0.49 ms on the suite, 4096 on 16: 0.12-0.23 on the H200)
REFRESH_BLOCK = 4096


def window_tiles(spec: ScheduleSpec) -> int:
    """Tiles per window (WINDOW_ROUNDS rounds of spec.ctas items)."""
    return max(1, WINDOW_ROUNDS * spec.ctas // spec.heads)


def capacity(spec: ScheduleSpec, batch: int) -> int:
    """Tiles the table holds: enough for any lengths that sum to spec.rows."""
    return tile_capacity(spec.rows, spec.block_m, batch)


def zigzag_sm_start(n: int, num_sms: int, device) -> torch.Tensor:
    """First position of each CTA's items when n items are dealt in a zigzag (int64 [num_sms + 1]).

    Closed form, from shapes alone: every full round gives each CTA one item; the last, partial round of
    n % num_sms items goes to CTAs 0.. (an even round) or ..num_sms-1 (an odd one)."""
    full, rest = divmod(n, num_sms)
    s = torch.arange(num_sms + 1, device=device)
    extra = torch.clamp(s, max=rest) if full % 2 == 0 else torch.clamp(s - (num_sms - rest), min=0)
    return s * full + extra


@triton.jit
def _offsets_changed(q_offsets, kv_offsets, seen, batch, BLOCK: tl.constexpr):
    # (here and in _record_offsets q_offsets are the tiled side's: the kv offsets for key tiles)
    """Whether the live offsets differ from the ones the schedule was built from."""
    changed = 0
    for i in range(0, batch + 1, BLOCK):
        o = i + tl.arange(0, BLOCK)
        m = o <= batch
        q = tl.load(q_offsets + o, mask=m, other=0).to(tl.int64)
        k = tl.load(kv_offsets + o, mask=m, other=0).to(tl.int64)
        q_seen = tl.load(seen + o, mask=m, other=0)
        k_seen = tl.load(seen + batch + 1 + o, mask=m, other=0)
        changed += tl.sum(((q != q_seen) | (k != k_seen)).to(tl.int32), 0)
    return changed > 0


@triton.jit
def _record_offsets(q_offsets, kv_offsets, keys, kv_range, seen, tile_ends, batch, BLOCK_M: tl.constexpr,
                    BLOCK: tl.constexpr):
    """seen = the live offsets; tile_ends[b] = tiles of sequences 0..b (cumulative), none for a sequence whose key
    count (keys: the kv offsets) lies outside kv_range."""
    carry = 0
    for i in range(0, batch + 1, BLOCK):
        o = i + tl.arange(0, BLOCK)
        m = o <= batch
        q = tl.load(q_offsets + o, mask=m, other=0).to(tl.int64)
        tl.store(seen + o, q, mask=m)
        tl.store(seen + batch + 1 + o, tl.load(kv_offsets + o, mask=m, other=0).to(tl.int64), mask=m)
        has = o < batch
        q_len = tl.load(q_offsets + o + 1, mask=has, other=0).to(tl.int32) - q.to(tl.int32)
        n_keys = (tl.load(keys + o + 1, mask=has, other=0) - tl.load(keys + o, mask=has, other=0)).to(tl.int32)
        has = has & (n_keys >= kv_range[0]) & (n_keys < kv_range[1])
        ends = tl.cumsum(tl.where(has, tl.cdiv(q_len, BLOCK_M), 0), 0) + carry
        tl.store(tile_ends + o, ends, mask=o < batch)
        carry = tl.max(tl.where(o < batch, ends, 0), 0)


@triton.jit
def ends_before(idx, ends, batch, SEARCH_STEPS: tl.constexpr):
    """How many of the batch ascending `ends` are at or before each of idx (a binary search of SEARCH_STEPS >=
    log2(batch) + 1 halvings): the sequence of tile ids idx over the tiles' ends, or of rows idx over q_offsets[1:]."""
    lo = tl.zeros_like(idx)
    hi = tl.zeros_like(idx) + batch
    for _ in tl.static_range(SEARCH_STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        right = (tl.load(ends + mid, mask=active, other=0) <= idx) & active
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    return lo


@triton.jit
def _walk_cost(tile, seq_id, lens, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KEY_TILES: tl.constexpr):
    """Blocks of BLOCK_N rows that tile `tile` (of BLOCK_M rows) walks: the kernels' own walk (jfa.geometry.tile_walk:
    a query tile's keys, or a key tile's queries, a prefix first where it has one)."""
    pre, lo, hi = tile_walk(tile * BLOCK_M, sequence(seq_id, lens, rule), rule, BLOCK_M, BLOCK_N, KEY_TILES)
    return pre // BLOCK_N + block_count(lo, hi, BLOCK_N)


@triton.jit
def refresh_kernel(offsets, seen, scratch, sched, sizes, mask, kv_range, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, SEARCH_STEPS: tl.constexpr, BLOCK: tl.constexpr,
                   KEY_TILES: tl.constexpr = False):
    """One CTA: if the offsets changed since the last build, rebuild the schedule (see module doc). offsets = (q,
    kv), the tiled side's the kv offsets where KEY_TILES; seen, scratch: Schedule's; sched = (tiles, tile_cost, order,
    sm_start, ticket), written (the ticket zeroed every time); sizes = (batch, capacity, heads, ctas, buckets,
    window); mask: the kernels' mask group;
    kv_range = (lo, hi): the sequences of other key counts get no tiles (ScheduleSpec.kv_range).

    Two counting sorts. The first: a tile's key is its sequence's heaviest tile cost (atomic max), its bucket key + 1
    (0 for spare capacity), a histogram, its suffix sums (heavier buckets first), then each tile takes the next rank
    of its bucket. The second, likewise: by window (first rank // window), earlier first, then by cost class (cost *
    CLASSES // (the heaviest cost + 1)), heavier first. The order among tiles of equal bucket may differ run to run
    (atomics); every item is still computed by exactly one CTA."""
    tiled, other = (offsets[1], offsets[0]) if KEY_TILES else (offsets[0], offsets[1])
    batch, capacity, heads, ctas, buckets, window = sizes
    tl.store(sched[4], 0)  # the work queue starts over (Schedule.ticket)
    if _offsets_changed(tiled, other, seen, batch, BLOCK):
        # scratch: tile_ends, seq_key [batch] each, hist, cursor [buckets] each, rank1 [capacity], hist2, cursor2,
        # starts2 [windows] each, top [1] (the heaviest tile cost of all)
        tile_ends = scratch
        seq_key = tile_ends + batch
        hist = seq_key + batch
        cursor = hist + buckets
        rank1 = cursor + buckets
        nwin = (capacity + window - 1) // window
        windows = nwin * (_CLASSES + 1)
        hist2 = rank1 + capacity
        cursor2 = hist2 + windows
        starts2 = cursor2 + windows
        top = starts2 + windows
        full_rounds = capacity * heads // ctas  # complete rounds of the deal
        _record_offsets(tiled, other, offsets[1], kv_range, seen, tile_ends, batch, BLOCK_M, BLOCK)
        _fill(hist, buckets, BLOCK)
        _fill(hist2, windows, BLOCK)
        _fill(seq_key, batch, BLOCK)
        _fill(top, 1, BLOCK)
        tl.debug_barrier()
        _tile_costs(offsets, (tile_ends, seq_key, top), sched, sizes, mask_rule(mask), BLOCK_M, BLOCK_N, SEARCH_STEPS,
                    BLOCK, KEY_TILES)
        tl.debug_barrier()
        classes_over = tl.load(top, cache_modifier=".cg") + 1  # cost class = cost * CLASSES // classes_over
        _rank_by_sequence((seq_key, hist, cursor, rank1, hist2), sched, sizes, nwin, classes_over, BLOCK)
        tl.debug_barrier()
        _suffix_starts(hist2, cursor2, windows, BLOCK)
        _suffix_starts(hist2, starts2, windows, BLOCK)  # (kept: the deal's atomics move cursor2)
        tl.debug_barrier()
        _deal((cursor2, starts2, hist2), rank1, sched, sizes, (nwin, classes_over, full_rounds), BLOCK)


@triton.jit
def _tile_costs(offsets, parts, sched, sizes, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                SEARCH_STEPS: tl.constexpr, BLOCK: tl.constexpr, KEY_TILES: tl.constexpr):
    """The tile table, each tile's cost (sched[0], sched[1]), each sequence's heaviest (parts: tile_ends, seq_key,
    top), the heaviest of all (top)."""
    tiles, tile_cost = sched[0], sched[1]
    batch, capacity = sizes[0], sizes[1]
    tile_ends, seq_key, top = parts
    for t0 in range(0, capacity, BLOCK):
        idx = t0 + tl.arange(0, BLOCK)
        keep = idx < capacity
        seq = ends_before(idx, tile_ends, batch, SEARCH_STEPS)
        valid = seq < batch
        seq = tl.minimum(seq, batch - 1)
        q_start, kv_start, lens = sequence_bounds(offsets[0], offsets[1], seq)
        tile = idx - (tl.load(tile_ends + seq) - tl.cdiv(lens[1] if KEY_TILES else lens[0], BLOCK_M))
        cost = tl.where(valid, _walk_cost(tile, seq, lens, rule, BLOCK_M, BLOCK_N, KEY_TILES), -1)
        tl.store(tiles + idx, tl.where(valid, seq, -1), mask=keep)
        tl.store(tiles + capacity + idx, tl.where(valid, tile, 0), mask=keep)
        tl.store(tile_cost + idx, cost, mask=keep)
        tl.atomic_max(seq_key + seq, cost, mask=keep & valid)
        tl.atomic_max(top + idx * 0, cost, mask=keep & valid)


@triton.jit
def _rank_by_sequence(parts, sched, sizes, nwin, classes_over, BLOCK: tl.constexpr):
    """The first sort: the histogram of the sequence keys (hist), its suffix starts (cursor), each tile's first rank
    (rank1); and the histogram of (window, cost class) of the second (hist2). parts: (seq_key, hist, cursor, rank1,
    hist2)."""
    tiles, tile_cost = sched[0], sched[1]
    capacity, buckets, window = sizes[1], sizes[4], sizes[5]
    seq_key, hist, cursor, rank1, hist2 = parts
    for t0 in range(0, capacity, BLOCK):
        idx = t0 + tl.arange(0, BLOCK)
        keep = idx < capacity
        tl.atomic_add(hist + _sequence_bucket(idx, tiles, seq_key, keep, buckets), 1, mask=keep)
    tl.debug_barrier()
    _suffix_starts(hist, cursor, buckets, BLOCK)
    tl.debug_barrier()
    for t0 in range(0, capacity, BLOCK):
        idx = t0 + tl.arange(0, BLOCK)
        keep = idx < capacity
        rank = tl.atomic_add(cursor + _sequence_bucket(idx, tiles, seq_key, keep, buckets), 1, mask=keep)
        tl.store(rank1 + idx, rank, mask=keep)
        cost = tl.load(tile_cost + idx, mask=keep, other=-1)
        tl.atomic_add(hist2 + _window_bucket(rank, cost, window, nwin, classes_over, _CLASSES), 1, mask=keep)


@triton.jit
def _deal(buckets, rank1, sched, sizes, counts, BLOCK: tl.constexpr):
    """The second sort's final ranks, each tile's items dealt to the CTAs in a zigzag (order, by sm_start), head by
    head inside each (window, cost class) bucket: item (tile of rank r, head h) of a bucket of n tiles from rank s
    takes rank s heads + h n + (r - s), so the concurrent items share fewer heads' K/V (equal-cost items only change
    places: the balance is the tile-major deal's). buckets: (the cursors, their starts, their sizes); counts:
    (windows, the cost classes' divisor, complete rounds of the deal)."""
    tile_cost, order, sm_start = sched[1], sched[2], sched[3]
    capacity, heads, ctas, window = sizes[1], sizes[2], sizes[3], sizes[5]
    nwin, classes_over, full_rounds = counts
    cursor2, starts2, hist2 = buckets
    for t0 in range(0, capacity, BLOCK):
        idx = t0 + tl.arange(0, BLOCK)
        keep = idx < capacity
        cost = tl.load(tile_cost + idx, mask=keep, other=-1)
        rank = tl.load(rank1 + idx, mask=keep, other=0)
        bucket = _window_bucket(rank, cost, window, nwin, classes_over, _CLASSES)
        rank = tl.atomic_add(cursor2 + bucket, 1, mask=keep)
        first = tl.load(starts2 + bucket, mask=keep, other=0, cache_modifier=".cg")
        size = tl.load(hist2 + bucket, mask=keep, other=1, cache_modifier=".cg")  # (written by atomics in L2)
        for h in range(0, heads):
            slot = deal_slot(first * heads + h * size + rank - first, ctas, full_rounds, sm_start, keep)
            tl.store(order + slot, tl.where(cost >= 0, idx * heads + h, -1), mask=keep)


@triton.jit
def deal_slot(r, ctas, full_rounds, sm_start, mask):
    """The slot of order that holds the item of (second sort) rank r: round r // ctas, its CTA by the zigzag, turned
    by ROTATE a window over the complete rounds. A work queue (jfa.hopper.items.WorkList.take) walks the ranks in
    order, each CTA taking the next when it has room, where the deal gives CTA s its rounds' items whatever their
    time: the concurrent items stay a window of consecutive ranks (a sequence's, whose dQ and Q stay in L2)."""
    rnd = r // ctas
    sm = tl.where(rnd % 2 == 0, r % ctas, ctas - 1 - r % ctas)
    sm = tl.where(rnd < full_rounds, (sm + (rnd // _WINDOW_ROUNDS) * _ROTATE) % ctas, sm)
    return tl.load(sm_start + sm, mask=mask, other=0) + rnd


@triton.jit
def _fill(x, n, BLOCK: tl.constexpr):
    for i in range(0, n, BLOCK):
        o = i + tl.arange(0, BLOCK)
        tl.store(x + o, 0, mask=o < n)


@triton.jit
def _suffix_starts(hist, cursor, n, BLOCK: tl.constexpr):
    """cursor[b] = entries in buckets above b (the highest bucket first)."""
    carry = 0
    for i in range(0, n, BLOCK):
        o = n - BLOCK - i + tl.arange(0, BLOCK)
        h = tl.load(hist + o, mask=o >= 0, other=0, cache_modifier=".cg")  # written by atomics in L2
        tl.store(cursor + o, tl.cumsum(h, 0, reverse=True) - h + carry, mask=o >= 0)
        carry += tl.sum(h, 0)


@triton.jit
def _sequence_bucket(idx, tiles, seq_key, keep, buckets):
    """First sort's bucket of tiles idx: their sequence's key + 1, or 0 for spare capacity."""
    seq = tl.load(tiles + idx, mask=keep, other=-1)
    key = tl.load(seq_key + tl.maximum(seq, 0), mask=keep & (seq >= 0), other=-1)
    return tl.minimum(key + 1, buckets - 1)


@triton.jit
def _window_bucket(rank, cost, window, nwin, classes_over, CLASSES: tl.constexpr):
    """Second sort's bucket of tiles of first rank `rank` (higher buckets first): earlier windows first, in a window
    heavier cost classes first, spare capacity last."""
    cls = tl.where(cost >= 0, 1 + (cost * CLASSES) // classes_over, 0)
    return (nwin - 1 - rank // window) * (CLASSES + 1) + cls


def _buckets(spec: ScheduleSpec, other_rows: int) -> int:
    """Histogram size: every possible cost (at most the other side's rows in blocks, + 1 for the alignment of
    a range), + 1 for spare capacity."""
    return other_rows // spec.block_n + 3


def _scratch_size(spec: ScheduleSpec, batch: int, other_rows: int) -> int:
    """refresh_kernel's scratch (Schedule.scratch): int32 entries."""
    cap = capacity(spec, batch)
    return 2 * batch + 2 * _buckets(spec, other_rows) + cap + 3 * (-(-cap // window_tiles(spec))) * (CLASSES + 1) + 1


def allocate(spec: ScheduleSpec, batch: int, other_rows: int, device) -> Schedule:
    """A schedule's buffers, remembering offsets no batch has (-1), so its first refresh builds it."""
    cap = capacity(spec, batch)
    n = cap * spec.heads
    return Schedule(
        tiles=torch.empty(2, cap, dtype=torch.int32, device=device),
        tile_cost=torch.empty(cap, dtype=torch.int32, device=device),
        order=torch.empty(n, dtype=torch.int32, device=device),
        sm_start=zigzag_sm_start(n, spec.ctas, device).to(torch.int32),
        heads=spec.heads,
        seen=torch.full((2 * (batch + 1),), -1, dtype=torch.int64, device=device),
        scratch=torch.empty(_scratch_size(spec, batch, other_rows), dtype=torch.int32, device=device),
        ticket=torch.zeros(1 + 2 * spec.ctas, dtype=torch.int32, device=device))


def refresh(sched: Schedule, spec: ScheduleSpec, q_offsets, kv_offsets, other_rows: int, num_targets=None) -> Schedule:
    """Launch refresh_kernel (see module doc): the schedule matches the live offsets once it has run (num_targets:
    with spec.targets, the sequences' targets, read for the costs alone)."""
    batch = q_offsets.numel() - 1  # (the tiled side's: the same count)
    check_runnable(q_offsets.device)
    cap = sched.tiles.shape[1]
    if batch > 0 and cap > 0:
        launch(refresh_kernel, (1, ),
               (q_offsets, kv_offsets), sched.seen, sched.scratch, (sched.tiles, sched.tile_cost, sched.order,
                                                                    sched.sm_start, sched.ticket),
               (batch, cap, spec.heads, spec.ctas, _buckets(spec, other_rows), window_tiles(spec)),
               mask_group(num_targets if spec.targets else None, spec.mask, spec.last_rows), spec.kv_range,
               BLOCK_M=spec.block_m, BLOCK_N=spec.block_n, SEARCH_STEPS=batch.bit_length() + 1, BLOCK=REFRESH_BLOCK,
               KEY_TILES=spec.key_tiles, num_warps=REFRESH_BLOCK // 256)
    elif cap > 0:  # no sequences: every slot is spare
        sched.tiles.fill_(-1)
        sched.order.fill_(-1)
    return sched


def build(q_offsets, kv_offsets, spec: ScheduleSpec, other_rows: int, num_targets=None) -> Schedule:
    """A schedule of its own (not cached) for these offsets (the tiled side's the kv offsets with spec.key_tiles);
    other_rows = rows of the other side (its last offset), which bounds the costs."""
    batch = q_offsets.numel() - 1
    return refresh(allocate(spec, batch, other_rows, q_offsets.device), spec, q_offsets, kv_offsets, other_rows,
                   num_targets)


def sm_loads(schedule: Schedule, num_sms: int) -> torch.Tensor:
    """Total cost per CTA (float64 [num_sms])."""
    order = schedule.order.long()
    counts = schedule.sm_start[1:].long() - schedule.sm_start[:-1].long()
    sm = torch.repeat_interleave(torch.arange(num_sms, device=order.device), counts)
    cost = schedule.tile_cost.double()[order.clamp(min=0) // schedule.heads]
    cost = torch.where(order >= 0, cost, 0.0)
    return torch.zeros(num_sms, dtype=torch.float64, device=order.device).scatter_add_(0, sm, cost)


class ScheduleCache:
    """The schedules of recent offsets tensors (every layer of a step, forward and backward, shares one
    batch's offsets). An entry matches the very same offsets tensors (held by weak reference, so a freed
    tensor whose memory is reused never matches) and the same ScheduleSpec; every ``get`` refreshes it on the
    device (see module doc), so what wrote the offsets in between does not matter. While a CUDA graph is
    being captured, a schedule of the graph's own is built instead (its buffers belong to the graph)."""

    def __init__(self, size: int = 8):
        self.size = size
        self.entries: OrderedDict = OrderedDict()

    def get(self, q_offsets, kv_offsets, spec: ScheduleSpec, other_rows: int, num_targets=None) -> Schedule:
        """(num_targets: with spec.targets; they set the costs only, so a schedule built with other counts is still
        a correct one: every item computed once.)"""
        if q_offsets.is_cuda and torch.cuda.is_current_stream_capturing():
            return build(q_offsets, kv_offsets, spec, other_rows, num_targets)
        key = (id(q_offsets), id(kv_offsets), spec, other_rows)
        hit = self.entries.get(key)
        if hit is not None and hit[0]() is q_offsets and hit[1]() is kv_offsets:
            self.entries.move_to_end(key)
            return refresh(hit[2], spec, q_offsets, kv_offsets, other_rows, num_targets)
        sched = allocate(spec, q_offsets.numel() - 1, other_rows, q_offsets.device)
        self.entries[key] = (weakref.ref(q_offsets), weakref.ref(kv_offsets), sched)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return refresh(sched, spec, q_offsets, kv_offsets, other_rows, num_targets)


CACHE = ScheduleCache()  # the one cache, shared by every kernel that takes a schedule
