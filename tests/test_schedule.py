"""The persistent kernels' tile schedule (jfa.schedule, its kernel run by Triton's interpreter here): the tile
table, each tile's cost and the zigzag deal (sequences together, heaviest first in windows) against a brute-force
spec written from the visibility rule; the load balance on the suite's skewed workloads; and reuse that stays
correct whatever rewrote the offsets in place (#16)."""
import dataclasses
import itertools

import pytest
import torch
import triton
import triton.language as tl

from jfa import schedule
from jfa.bench import suite
from jfa.jagged import resolve_window, visible_mask
from jfa.schedule import ScheduleSpec, deal_slot
from jfa.testing import offsets_of

pytestmark = pytest.mark.interpreter


def _tile_cost(mask, rows, block, key_tiles, targets):
    """Blocks of `block` a tile walks: from its first visible pair's block to its last (a key tile's: rows are keys
    here, mask[:, rows] their queries); a key tile with HSTU's mask also its context rows' blocks before those (the
    queries before its first key's diagonal, query row rows.start - shift)."""
    if key_tiles and not targets:
        mask = mask.T
    elif key_tiles:
        seen = torch.nonzero(mask[:, rows].any(1)).flatten()
        if not len(seen):
            return 0
        diagonal = rows.start - (mask.shape[1] - mask.shape[0])
        diag = seen[seen >= diagonal]
        before = seen[seen < diagonal]
        pre = -((-int(before.max()) - 1) // block) if len(before) else 0
        first = int(diag.min()) // block * block if len(diag) else 0
        if pre * block >= first:
            return -(-(int(seen.max()) + 1) // block)
        return pre + -(-(int(seen.max()) + 1 - first) // block)
    keys = torch.nonzero(mask[rows].any(0)).flatten()
    first = int(keys.min()) // block * block if len(keys) else 0
    return -(-(int(keys.max()) + 1 - first) // block) if len(keys) else 0


def spec_schedule(q_lens, kv_lens, spec: ScheduleSpec, num_targets=None):
    """Brute force: (tiles [(seq, tile)], cost per tile slot, per-CTA list of item costs in deal order, the items
    (tile slot x heads + head) in rank order).

    A tile of rows [m0, m0 + block_m) visits the key blocks from the first visible key, aligned down to
    block_n, to the last visible key. Tiles are ranked by their sequence's heaviest tile cost, heaviest first
    (ties in id order: a sequence's tiles together), then cut into windows of window_tiles and ranked by window,
    then by cost class (of the heaviest cost; spare capacity last), then by id; inside each (window, cost class)
    bucket the items go head by head; the item of rank r goes to CTA zigzag(r), turned by ROTATE per window of
    complete rounds."""
    tiles, costs, heaviest = [], [], []
    for b, (lq, lk) in enumerate(zip(q_lens, kv_lens)):
        first_tile = len(costs)
        left, right, context, *full = spec.mask
        if num_targets is None:
            mask = visible_mask(lq, lk, left, right)
        else:  # HSTU's mask: the window is the spec's left
            mask = visible_mask(lq, lk, left, 0, targets=(num_targets[b], context, *full))
        if spec.key_tiles:  # rows are keys here, mask[:, rows] their queries
            lq = lk
        for t in range(-(-lq // spec.block_m)):
            rows = slice(t * spec.block_m, (t + 1) * spec.block_m)
            costs.append(_tile_cost(mask, rows, spec.block_n, spec.key_tiles, num_targets is not None))
            tiles.append((b, t))
        heaviest += [max(costs[first_tile:], default=0)] * (len(costs) - first_tile)
    costs += [-1] * (schedule.capacity(spec, len(q_lens)) - len(costs))
    heaviest += [-1] * (len(costs) - len(heaviest))
    first = sorted(range(len(costs)), key=lambda i: -heaviest[i])
    top = max(costs) + 1
    window = schedule.window_tiles(spec)

    def cost_class(i):
        return 1 + costs[i] * schedule.CLASSES // top if costs[i] >= 0 else 0

    final = sorted(range(len(first)), key=lambda r: (r // window, -cost_class(first[r]), first[r]))
    # inside a (window, cost class) bucket, head by head: the items of head 0 of its tiles, then head 1's, ...
    buckets = [list(g) for _, g in itertools.groupby(final, key=lambda r: (r // window, cost_class(first[r])))]
    items = [first[f] * spec.heads + h for b in buckets for h in range(spec.heads) for f in b]
    per_cta, ranked = [[] for _ in range(spec.ctas)], []
    full_rounds = len(costs) * spec.heads // spec.ctas
    for r, i in enumerate(items):
        rnd, k = divmod(r, spec.ctas)
        cta = k if rnd % 2 == 0 else spec.ctas - 1 - k
        if rnd < full_rounds:
            cta = (cta + rnd // schedule.WINDOW_ROUNDS * schedule.ROTATE) % spec.ctas
        per_cta[cta].append(costs[i // spec.heads])
        ranked.append(i)
    return tiles, costs, per_cta, ranked


def check_against_spec(sched, q_lens, kv_lens, spec, num_targets=None):
    tiles, costs, per_cta, _ = spec_schedule(q_lens, kv_lens, spec, num_targets)
    got_tiles = [(int(b), int(t)) for b, t in zip(*sched.tiles.tolist()) if b >= 0]
    assert got_tiles == tiles
    assert sched.tile_cost.tolist() == costs
    start, order = sched.sm_start.tolist(), sched.order.tolist()
    got = [[costs[i // spec.heads] if i >= 0 else -1 for i in order[start[k]:start[k + 1]]] for k in range(spec.ctas)]
    assert got == per_cta
    real = [i for i in range(len(costs) * spec.heads) if costs[i // spec.heads] >= 0]
    assert sorted(i for i in order if i >= 0) == real


CASES = {
    "self": ([0, 1, 63, 64, 65, 129, 300], None, False, (-1, -1)),
    "causal": ([1, 63, 65, 129, 300], None, True, (-1, -1)),
    "window": ([1, 65, 300], None, False, (40, 7)),
    "cross-causal": ([129, 5, 70], [17, 300, 0], True, (-1, -1)),
    "cross-window": ([17, 300], [129, 65], False, (3, 90)),
    "empty-sequences": ([0, 0, 5, 0], None, False, (-1, -1)),
    "one-sequence": ([129], [200], True, (-1, -1)),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("block_m,block_n,heads,ctas", [(64, 32, 2, 3), (128, 128, 3, 5), (32, 64, 1, 4)])
@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64])
def test_schedule_matches_the_spec(name, block_m, block_n, heads, ctas, offsets_dtype):
    q_lens, kv_lens, causal, window = CASES[name]
    kv_lens = kv_lens or q_lens
    qo, ko = offsets_of(q_lens, dtype=offsets_dtype), offsets_of(kv_lens, dtype=offsets_dtype)
    spec = ScheduleSpec(int(qo[-1]), heads, block_m, block_n, ctas, (*resolve_window(causal, window), 0))
    check_against_spec(schedule.build(qo, ko, spec, int(ko[-1])), q_lens, kv_lens, spec)


@triton.jit
def _deal_slots_kernel(sm_start, OUT, n, ctas, full_rounds, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    tl.store(OUT + r, deal_slot(r, ctas, full_rounds, sm_start, r < n), mask=r < n)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("block_m,block_n,heads,ctas", [(64, 32, 2, 3), (32, 64, 1, 4)])
def test_work_queue_walks_the_ranks(name, block_m, block_n, heads, ctas):
    """A work queue (jfa.hopper.items.WorkList.take) reads rank r's item at deal_slot(r): walked in rank order it
    gives the spec's items in the spec's order (by cost and head: equal buckets may order their tiles either way),
    every item once."""
    q_lens, kv_lens, causal, window = CASES[name]
    kv_lens = kv_lens or q_lens
    qo, ko = offsets_of(q_lens), offsets_of(kv_lens)
    spec = ScheduleSpec(int(qo[-1]), heads, block_m, block_n, ctas, (*resolve_window(causal, window), 0))
    sched = schedule.build(qo, ko, spec, int(ko[-1]))
    n = sched.order.numel()
    slots = torch.empty(n, dtype=torch.int32)
    _deal_slots_kernel[(1, )](sched.sm_start, slots, n, ctas, n // ctas, BLOCK=triton.next_power_of_2(n))
    items = sched.order[slots.long()].tolist()
    _, costs, _, ranked = spec_schedule(q_lens, kv_lens, spec)
    assert [costs[i // heads] if i >= 0 else -1 for i in items] == [costs[i // heads] for i in ranked]
    # (a spare tile's items are -1 in the schedule: their heads are the spec's too, by rank)
    assert [i % heads for i in items if i >= 0] == [i % heads for i in ranked if costs[i // heads] >= 0]
    assert sorted(items) == sorted(sched.order.tolist())


def test_many_tiles_match_the_spec():
    """More tiles than the kernel handles in one chunk (REFRESH_BLOCK), and cost buckets spread over several
    chunks."""
    q_lens = [(7 * i) % 5 for i in range(2 * schedule.REFRESH_BLOCK)] + [2000]
    qo = offsets_of(q_lens)
    spec = ScheduleSpec(int(qo[-1]), 2, 32, 1, 7, (*resolve_window(True, (-1, -1)), 0))
    check_against_spec(schedule.build(qo, qo, spec, int(qo[-1])), q_lens, q_lens, spec)


def test_broadcast_and_transposed_schedules_match_the_spec():
    """Broadcast q (row offsets b * Lq) and the dK/dV pass's schedule (key tiles: sides swapped, window
    mirrored) are the same construction."""
    kv_lens = [0, 1, 65, 300, 7]
    qo, ko = torch.arange(len(kv_lens) + 1) * 3, offsets_of(kv_lens)
    left, right = resolve_window(True, (-1, -1))
    spec = ScheduleSpec(int(qo[-1]), 2, 32, 64, 3, (left, right, 0))
    check_against_spec(schedule.build(qo, ko, spec, int(ko[-1])), [3] * len(kv_lens), kv_lens, spec)
    key_tiles = ScheduleSpec(int(ko[-1]), 2, 64, 32, 3, (left, right, 0), key_tiles=True)
    check_against_spec(schedule.build(qo, ko, key_tiles, int(qo[-1])), [3] * len(kv_lens), kv_lens, key_tiles)


SKEWED = ["self-skewed-8k", "causal-skewed-4k", "pma-256"]


@pytest.mark.parametrize("name", SKEWED)
def test_zigzag_balances_skewed_workloads(name):
    """max CTA load / mean <= 1.05 with 128x128 tiles on the H200's 132 SMs."""
    w = next(w for w in suite.load_suite()[1] if w.name == name)
    kv = suite.kv_lengths(w)
    ko = offsets_of(kv.tolist())
    qo = torch.arange(kv.numel() + 1, dtype=torch.int32) * w.q_len if w.mode == "broadcast" else ko
    spec = ScheduleSpec(int(qo[-1]), w.heads_q, 128, 128, 132, (*resolve_window(False, tuple(w.window)), 0))
    loads = schedule.sm_loads(schedule.build(qo, ko, spec, int(ko[-1])), 132)
    ratio = (loads.max() / loads.mean()).item()
    assert ratio <= 1.05, f"{name}: max/mean CTA load {ratio:.3f}"


@triton.jit
def _copy_kernel(dst, src, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(dst + o, tl.load(src + o, mask=o < n), mask=o < n)


def _rewrite(offsets, new, how):
    """Write `new` into `offsets` in place, the ways a data pipeline does (#16)."""
    if how == "copy_":
        offsets.copy_(new)
    elif how == ".data":  # bypasses the version counter
        offsets.data[:] = new
    elif how == "kernel":  # a kernel storing into a preallocated buffer: invisible to PyTorch
        _copy_kernel[(1,)](offsets, new, new.numel(), BLOCK=triton.next_power_of_2(new.numel()))
    else:
        raise ValueError(how)


@pytest.mark.parametrize("how", ["copy_", ".data", "kernel"])
def test_cached_schedule_follows_offsets_rewritten_in_place(how):
    """The same offsets tensors with new values (same batch and total): the cache hands back its schedule,
    refreshed on the device to match a fresh build, however the values were written."""
    cache = schedule.ScheduleCache()
    first, second = [100, 0, 300, 112], [1, 255, 200, 56]
    qo = offsets_of(first)
    version = qo._version
    spec = ScheduleSpec(512, 2, 64, 32, 3, (*resolve_window(True, (-1, -1)), 0))
    a = cache.get(qo, qo, spec, 512)
    check_against_spec(a, first, first, spec)
    _rewrite(qo, offsets_of(second), how)
    if how == ".data":
        assert qo._version == version, "the rewrite was meant to leave the version counter alone"
    b = cache.get(qo, qo, spec, 512)
    assert b is a  # the same buffers, rebuilt in place
    check_against_spec(b, second, second, spec)


def test_cache_refresh_rebuilds_only_when_the_offsets_change():
    """A hit with unchanged offsets leaves the schedule's buffers alone (the refresh kernel compares and stops);
    a change rebuilds them; an equal but different tensor gets an entry of its own."""
    cache = schedule.ScheduleCache()
    qo = offsets_of([5, 300, 64])
    spec = ScheduleSpec(int(qo[-1]), 2, 64, 64, 4, (*resolve_window(False, (-1, -1)), 0))
    a = cache.get(qo, qo, spec, int(qo[-1]))
    a.order.fill_(-7)  # poison: a rebuild would overwrite it
    assert cache.get(qo, qo, spec, int(qo[-1])) is a and bool((a.order == -7).all())
    qo[1:].copy_(offsets_of([100, 205, 64])[1:])
    assert cache.get(qo, qo, spec, int(qo[-1])) is a and not bool((a.order == -7).any())
    check_against_spec(a, [100, 205, 64], [100, 205, 64], spec)
    other = qo.clone()
    assert cache.get(other, other, spec, int(qo[-1])) is not a


def test_every_refresh_restarts_the_work_queue():
    """Schedule.ticket (a work queue's next rank) is zeroed by every refresh, a hit with unchanged offsets too: each
    launch after its refresh walks the queue from rank 0."""
    cache = schedule.ScheduleCache()
    qo = offsets_of([5, 300, 64])
    spec = ScheduleSpec(int(qo[-1]), 2, 64, 64, 4, (*resolve_window(False, (-1, -1)), 0))
    a = cache.get(qo, qo, spec, int(qo[-1]))
    assert a.ticket.shape == (1 + 2 * spec.ctas,) and a.ticket[0].item() == 0  # the ticket, then the mailboxes
    a.ticket.fill_(41)  # as a kernel leaves it
    assert cache.get(qo, qo, spec, int(qo[-1])) is a and a.ticket[0].item() == 0


@triton.jit
def _target_geometry_kernel(q_offsets, kv_offsets, num_targets, OUT, context, window, full, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, TILES: tl.constexpr, LAST_ROWS: tl.constexpr, FULL: tl.constexpr):
    """Per sequence and tile: a query tile's (lo, hi, full_lo, full_hi) and a key tile's (prefix end, lo, hi,
    full_lo, full_hi) (query tiles of BLOCK_M rows over key blocks of BLOCK_N, key tiles the same way round)."""
    from jfa.geometry import key_blocks, mask_rule, query_blocks, query_prefix, sequence, sequence_bounds
    b = tl.program_id(0)
    t = tl.program_id(1)
    q_start, kv_start, lens = sequence_bounds(q_offsets, kv_offsets, b)
    rule = mask_rule((num_targets, window, 0, context, LAST_ROWS, full, FULL))
    seq = sequence(b, lens, rule)
    base = OUT + (b * TILES + t) * 9
    lo, f_lo, f_hi, hi = key_blocks(t * BLOCK_M, seq, rule, BLOCK_M, BLOCK_N)
    tl.store(base + 0, lo)
    tl.store(base + 1, hi)
    tl.store(base + 2, f_lo)
    tl.store(base + 3, f_hi)
    lo, f_lo, f_hi, hi = query_blocks(t * BLOCK_M, seq, rule, BLOCK_N, BLOCK_M)
    tl.store(base + 4, query_prefix(t * BLOCK_M, seq, rule, BLOCK_N, BLOCK_M))
    tl.store(base + 5, lo)
    tl.store(base + 6, hi)
    tl.store(base + 7, f_lo)
    tl.store(base + 8, f_hi)


TARGET_CASES = {  # lengths, targets, contextual_len, window (HSTU's max_attn_len)[, query rows: serving]
    "targets": ([1, 2, 40, 63, 64, 65, 129, 200], [0, 2, 5, 1, 64, 3, 20, 200], 0, -1),
    "targets-window": ([1, 40, 65, 129, 200], [1, 0, 3, 20, 7], 0, 17),
    "context": ([1, 2, 40, 65, 129, 200], [0, 1, 5, 0, 20, 3], 5, -1),
    "context-window": ([3, 40, 65, 129, 200], [1, 0, 3, 20, 7], 9, 30),
    "context-longer-than-history": ([4, 6, 30], [2, 6, 1], 8, -1),
    "context-all-but-one-position": ([64, 90], [5, 3], 60, -1),  # (64: the history's one position, the context's)
    # each sequence's last rows as queries (HSTU's cached attention): none, a few, all, some context rows among them
    "serving": ([1, 2, 40, 65, 129, 200, 200], [0, 1, 5, 20, 3, 7, 0], 0, -1, [1, 0, 7, 65, 30, 200, 33]),
    "serving-context-window": ([3, 40, 40, 65, 129, 200, 300], [1, 0, 3, 3, 20, 7, 40], 9, 30,
                               [1, 40, 35, 2, 100, 64, 33]),
    "serving-context": ([12, 40, 129, 200], [2, 5, 0, 200], 9, -1, [10, 39, 129, 190]),
    # the history's last rows past the window's reach (min_full_attn_len: FULL_ROWS)
    "targets-window-full": ([1, 40, 65, 129, 200], [1, 0, 3, 20, 7], 0, 17),
    "context-window-full": ([3, 40, 65, 129, 200], [1, 0, 3, 20, 0], 9, 30),
    "serving-context-window-full": ([3, 40, 40, 65, 129, 200, 300], [1, 0, 3, 3, 20, 7, 40], 9, 30,
                                    [1, 40, 35, 2, 100, 64, 33]),
}
FULL_ROWS = {"targets-window-full": 50, "context-window-full": 3, "serving-context-window-full": 70}


def _target_case(name):
    """(kv lengths, query lengths, targets, contextual_len, window) of TARGET_CASES[name]."""
    lens, targets, context, window, *q_lens = TARGET_CASES[name]
    return lens, (q_lens[0] if q_lens else lens), targets, context, window


def _full_rows(n, t, context, full, rows):
    """Which of a sequence's rows see the whole history past the window (jfa.jagged.target_mask's F)."""
    c1 = max(context - 1, 0)
    u = n - t - c1
    p = torch.clamp(torch.clamp(torch.as_tensor(rows) - c1, min=0), max=u)
    return (p >= u - full) if full else torch.zeros(p.shape, dtype=torch.bool)


@pytest.mark.parametrize("name", list(TARGET_CASES))
@pytest.mark.parametrize("block_m,block_n", [(32, 16), (64, 64), (16, 32)])
def test_target_geometry_matches_the_rule(name, block_m, block_n):
    """HSTU's mask (jfa.jagged.target_mask) in jfa.geometry: every pair a tile's rows see lies in its walk (a query
    tile's key range; a key tile's context prefix and query range), the walk's ends are the first and last visible
    pairs' blocks, and every pair in a full block is visible."""
    from jfa.jagged import UNBOUNDED, visible_mask
    lens, q_lens, targets, context, window = _target_case(name)
    full = FULL_ROWS.get(name, 0)
    kv_offsets, q_offsets = offsets_of(lens), offsets_of(q_lens)
    nt = torch.tensor(targets, dtype=torch.int32)
    tiles = max(-(-n // min(block_m, block_n)) for n in lens) + 1
    out = torch.full((len(lens), tiles, 9), -7, dtype=torch.int32)
    w = UNBOUNDED if window < 0 else window
    _target_geometry_kernel[(len(lens), tiles)](q_offsets, kv_offsets, nt, out, context, w, full, BLOCK_M=block_m,
                                                BLOCK_N=block_n, TILES=tiles, LAST_ROWS=q_lens is not lens,
                                                FULL=full > 0)
    for b, (lq, n, t) in enumerate(zip(q_lens, lens, targets)):
        mask = visible_mask(lq, n, window, 0, targets=(t, context, full))  # [lq, n]
        shift = n - lq
        is_full = _full_rows(n, t, context, full, torch.arange(lq) + shift)  # (query rows)
        for tile in range(-(-lq // block_m)):  # query tiles: every row sees at least itself
            lo, hi, f_lo, f_hi = out[b, tile, :4].tolist()
            rows = slice(tile * block_m, (tile + 1) * block_m)
            keys = torch.nonzero(mask[rows].any(0)).flatten()
            walk = torch.zeros(n, dtype=torch.bool)
            walk[lo:hi] = True
            assert walk[keys].all(), (name, b, tile, lo, hi, keys.tolist())
            assert lo == int(keys.min()) // block_n * block_n and hi == int(keys.max()) + 1, (b, tile, lo, hi)
            assert mask[rows, lo + (f_lo - lo):f_hi].all(), (b, tile, f_lo, f_hi)
            mixed = bool(is_full[rows].any()) and not bool(is_full[rows].all())  # (those peel the window's)
            if tile * block_m + shift >= context and n - t - max(context - 1, 0) > 0 and not mixed:
                # rows past the context (history rows, targets): no whole block they all see is left masked
                whole = [k for k in range(lo, hi - block_n + 1, block_n) if mask[rows, k:k + block_n].all()]
                assert all(f_lo <= k < f_hi for k in whole), (name, b, tile, f_lo, f_hi, whole)
        for tile in range(-(-n // block_m)):  # key tiles of the same size: the queries that see its keys
            pre, qlo, qhi, qf_lo, qf_hi = out[b, tile, 4:].tolist()
            rows = slice(tile * block_m, (tile + 1) * block_m)
            queries = torch.nonzero(mask[:, rows].any(1)).flatten()
            qwalk = torch.zeros(max(lq, qhi, pre, 1), dtype=torch.bool)
            qwalk[:pre] = True
            qwalk[max(qlo, 0):max(qhi, 0)] = True
            assert pre % block_n == 0 and pre <= qlo or pre == 0, (b, tile, pre, qlo)
            assert qwalk[queries].all(), (name, b, tile, pre, qlo, qhi, queries.tolist())
            if not len(queries):  # (serving: keys no query row sees) an empty walk
                assert pre == 0 and qhi <= qlo, (name, b, tile, pre, qlo, qhi)
                continue
            inner = queries[queries >= max(qlo, pre)]
            assert qhi == int(queries.max()) + 1 and (not len(inner) or qlo == int(inner.min()) // block_n * block_n)
            assert mask[qf_lo:qf_hi, rows].all(), (b, tile, qf_lo, qf_hi)
            if min((tile + 1) * block_m, n) <= n - t:  # history keys: the whole blocks of history rows that see them
                top = lq if window < 0 else n - t - shift  # (a bounded window: the blocks below the targets)
                whole = [m for m in range(max(qlo, pre), min(qhi, top) - block_n + 1, block_n)
                         if m + shift >= context and mask[m:m + block_n, rows].all()
                         and not is_full[m:m + block_n].any()]  # (rows past the window: masked, not peeled)
                assert all(qf_lo <= m < qf_hi for m in whole), (name, b, tile, qf_lo, qf_hi, whole)


@pytest.mark.parametrize("name", list(TARGET_CASES))
@pytest.mark.parametrize("key_tiles", [False, True], ids=["query-tiles", "key-tiles"])
def test_target_schedule_matches_the_spec(name, key_tiles):
    """HSTU's mask's tile classes in the schedule: each tile costed by its walk (a key tile's context prefix too),
    dealt as the spec says."""
    lens, q_lens, targets, context, window = _target_case(name)
    ko, nt = offsets_of(lens), torch.tensor(targets, dtype=torch.int32)
    qo = ko if q_lens is lens else offsets_of(q_lens)
    left, right = resolve_window(True, (window, -1))
    tiles, other = (int(ko[-1]), int(qo[-1])) if key_tiles else (int(qo[-1]), int(ko[-1]))
    spec = ScheduleSpec(tiles, 2, 32, 16, 5, (left, right, context, FULL_ROWS.get(name, 0)), targets=True,
                        key_tiles=key_tiles, last_rows=q_lens is not lens)
    check_against_spec(schedule.build(qo, ko, spec, other, nt), q_lens, lens, spec, targets)


@pytest.mark.parametrize("key_tiles", [False, True])
def test_length_classes_split_the_items(key_tiles):
    """ScheduleSpec.kv_range: a schedule holds exactly the tiles of the sequences whose key count lies in its range,
    each item once, and two classes that cover every length hold every item of the whole schedule between them."""
    q_lens, kv_lens = [5, 300, 0, 70, 129, 1, 900], [9, 300, 4, 70, 800, 1, 1000]
    qo, ko = offsets_of(q_lens), offsets_of(kv_lens)
    tiled, other = (ko, qo) if key_tiles else (qo, ko)
    base = ScheduleSpec(int(tiled[-1]), 2, 64, 32, 3, (*resolve_window(True, (-1, -1)), 0), key_tiles=key_tiles)
    rows = int(qo[-1]) if key_tiles else int(ko[-1])

    def items(spec):
        s = schedule.build(qo, ko, spec, rows)
        tiles = [(int(b), int(t)) for b, t in zip(*s.tiles.tolist())]
        got = [(tiles[i // spec.heads], i % spec.heads) for i in s.order.tolist() if i >= 0]
        assert len(got) == len(set(got))
        return got

    whole = items(base)
    short = items(dataclasses.replace(base, kv_range=(0, 129)))
    long = items(dataclasses.replace(base, kv_range=(129, 1 << 30)))
    assert {b for (b, _), _ in short} == {b for b, n in enumerate(kv_lens) if n < 129 and (key_tiles and n or
                                                                                          not key_tiles and q_lens[b])}
    assert all(kv_lens[b] >= 129 for (b, _), _ in long)
    assert sorted(short + long) == sorted(whole)


def test_length_classes_follow_the_hint():
    """jfa.hopper.config.fwd_classes, bwd_classes: one launch by the mean key length, unless the mean is short and
    max_kv_len allows a long sequence: then the short form over at most SHORT_KV keys and the long form over the
    rest."""
    from jfa.api import problem
    from jfa.hopper.config import SHORT_KV, fwd_classes, select_fwd
    lens = [40] * 63 + [4096]
    q = torch.zeros(sum(lens), 2, 128, dtype=torch.bfloat16)
    off = offsets_of(lens)
    one = fwd_classes(problem(q, q, q, off, causal=True, backend="reference"))
    assert len(one) == 1 and one[0][1] == (0, 1 << 30)
    hinted = fwd_classes(problem(q, q, q, off, causal=True, max_q_len=4096, max_kv_len=4096, backend="reference"))
    assert [r for _, r in hinted] == [(0, SHORT_KV + 1), (SHORT_KV + 1, 1 << 30)]
    assert hinted[0][0] == one[0][0] and hinted[1][0] == select_fwd(128)
    from jfa.hopper.config import DqRoute, bwd_classes
    plans = bwd_classes(problem(q, q, q, off, causal=True, max_q_len=4096, max_kv_len=4096, backend="reference"))
    assert [r for _, r in plans] == [(0, SHORT_KV + 1), (SHORT_KV + 1, 1 << 30)]
    assert plans[0][0].dkdv.dq == DqRoute.DIRECT and plans[1][0].dkdv.dq == DqRoute.REDUCE
    long_mean = fwd_classes(problem(q[:4096], q[:4096], q[:4096], offsets_of([4096]), causal=True, max_q_len=4096,
                                    max_kv_len=4096, backend="reference"))
    assert len(long_mean) == 1
