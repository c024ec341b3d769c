"""The persistent kernels' tile schedule (jfa.schedule): exact per-tile costs, every item exactly once, and
the load balance the zigzag deal reaches on the suite's skewed workloads."""
import pytest
import torch

from jfa import schedule
from jfa.bench import suite
from jfa.jagged import resolve_window, tile_table, visible_mask
from jfa.testing import offsets_of

CASES = {
    "self": ([0, 1, 63, 64, 65, 129, 300], None, False, (-1, -1)),
    "causal": ([1, 63, 65, 129, 300], None, True, (-1, -1)),
    "window": ([1, 65, 300], None, False, (40, 7)),
    "cross-causal": ([129, 5, 70], [17, 300, 0], True, (-1, -1)),
    "cross-window": ([17, 300], [129, 65], False, (3, 90)),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("block_m,block_n", [(64, 32), (128, 128)])
def test_key_block_counts_match_brute_force(name, block_m, block_n):
    q_lens, kv_lens, causal, window = CASES[name]
    kv_lens = kv_lens or q_lens
    left, right = resolve_window(causal, window)
    qo, ko = offsets_of(q_lens), offsets_of(kv_lens)
    tiles = tile_table(qo, block_m, int(qo[-1]))
    got = schedule.key_block_counts(qo, ko, tiles, block_m, block_n, left, right)
    for t in range(tiles.shape[1]):
        b, m = int(tiles[0, t]), int(tiles[1, t])
        if b < 0:
            assert got[t] == -1
            continue
        mask = visible_mask(q_lens[b], kv_lens[b], left, right)[m * block_m:(m + 1) * block_m]
        blocks_seen = set((torch.nonzero(mask.any(0)).flatten() // block_n).tolist())
        assert int(got[t]) == len(blocks_seen), (b, m)


@pytest.mark.parametrize("name", list(CASES) + ["broadcast", "empty-sequences", "one-sequence"])
@pytest.mark.parametrize("block_m,block_n", [(64, 32), (128, 128), (32, 64)])
@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64])
def test_fused_tile_table_and_costs_match_the_spec(name, block_m, block_n, offsets_dtype):
    """The one-kernel bookkeeping (Triton; the interpreter here) gives the torch spec's table and counts."""
    if name == "broadcast":  # 3 rows of q against each of 5 kv sequences: row offsets b * 3
        qo, ko = torch.arange(6) * 3, offsets_of([0, 1, 65, 300, 7])
        rows, window = 15, (-1, 0)
    else:
        q_lens, kv_lens, causal, window = CASES.get(name, ([0, 0, 5, 0], None, False, (-1, -1)) if name ==
                                                    "empty-sequences" else ([129], [200], True, (-1, -1)))
        qo, ko = offsets_of(q_lens), offsets_of(kv_lens or q_lens)
        rows, window = int(qo[-1]), resolve_window(causal, window)
    qo, ko = qo.to(offsets_dtype), ko.to(offsets_dtype)
    want = schedule.tiles_and_costs(qo, ko, rows, block_m, block_n, *window, fused=False)
    got = schedule.tiles_and_costs(qo, ko, rows, block_m, block_n, *window, fused=True)
    assert got[0].tolist() == want[0].tolist()
    assert got[1].tolist() == want[1].tolist()


def test_every_item_exactly_once_and_heaviest_first_per_sm():
    lens = [0, 1, 63, 65, 129, 1000, 4000, 17]
    qo = offsets_of(lens)
    sched = schedule.build(qo, qo, int(qo[-1]), 4, 128, 128, -1, 0, num_sms=7)
    order = sched.order.long()
    valid = order[order >= 0]
    real_items = torch.nonzero(sched.cost >= 0).flatten()
    assert sorted(valid.tolist()) == real_items.tolist()
    start = sched.sm_start.tolist()
    assert start[0] == 0 and start[-1] == order.numel()
    for s in range(7):
        costs = sched.cost[order[start[s]:start[s + 1]].clamp(min=0)]
        costs = costs[order[start[s]:start[s + 1]] >= 0]
        assert torch.all(costs[:-1] >= costs[1:])  # heaviest first within each SM


@pytest.mark.parametrize("n,num_sms", [(0, 5), (3, 5), (5, 5), (7, 5), (12, 5), (23, 4), (1000, 132)])
def test_items_are_dealt_in_a_zigzag(n, num_sms):
    """The item of rank r sits on SM zigzag(r) (0..S-1 on even rounds, S-1..0 on odd ones), after the ones of
    lower rank on that SM: the deal written out item by item, against build's closed form."""
    cost = torch.randint(0, 9, (n,), generator=torch.Generator().manual_seed(n))
    qo = offsets_of([128] * n)  # one 128-row tile per sequence, one head: item id = sequence
    ko = offsets_of([int(c) * 16 for c in cost])  # cost = key blocks of 16
    sched = schedule.build(qo, ko, 128 * n, 1, 128, 16, -1, -1, num_sms)
    full = sched.cost.tolist()  # the tile table's spare capacity: cost -1, dealt last, marked -1
    assert full[:n] == cost.tolist() and all(c == -1 for c in full[n:])
    ranked = sorted(range(len(full)), key=lambda i: -full[i])  # stable: ties keep the lower id first
    per_sm = [[] for _ in range(num_sms)]
    for r, item in enumerate(ranked):
        rnd, i = divmod(r, num_sms)
        per_sm[i if rnd % 2 == 0 else num_sms - 1 - i].append(item if full[item] >= 0 else -1)
    start = sched.sm_start.tolist()
    assert [sched.order[start[s]:start[s + 1]].tolist() for s in range(num_sms)] == per_sm


SKEWED = ["self-skewed-8k", "causal-skewed-4k", "pma-256"]


@pytest.mark.parametrize("name", SKEWED)
def test_zigzag_balances_skewed_workloads(name):
    """max SM load / mean <= 1.05 with 128x128 tiles on the H200's 132 SMs (issue target)."""
    w = next(w for w in suite.load_suite()[1] if w.name == name)
    kv = suite.kv_lengths(w)
    ko = offsets_of(kv.tolist())
    if w.mode == "broadcast":
        qo = torch.arange(kv.numel() + 1, dtype=torch.int32) * w.q_len
    else:
        qo = ko
    left, right = resolve_window(False, tuple(w.window))
    sched = schedule.build(qo, ko, int(qo[-1]), w.heads_q, 128, 128, left, right, num_sms=132)
    loads = schedule.sm_loads(sched, 132)
    ratio = (loads.max() / loads.mean()).item()
    assert ratio <= 1.05, f"{name}: max/mean SM load {ratio:.3f}"


def test_cache_hits_same_tensor_and_rebuilds_after_in_place_change():
    cache = schedule.ScheduleCache()
    qo = offsets_of([5, 300, 64])
    params = (int(qo[-1]), 2, 64, 64, -1, -1, 4)
    a = cache.get(qo, qo, *params)
    assert cache.get(qo, qo, *params) is a
    qo[1:].copy_(offsets_of([100, 205, 64])[1:])  # same total, new lengths, in place
    b = cache.get(qo, qo, *params)
    assert b is not a and not torch.equal(a.cost, b.cost)
    other = qo.clone()
    assert cache.get(other, other, *params) is not b  # an equal but different tensor: built anew
