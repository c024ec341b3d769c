"""Load-balanced tile schedules for persistent kernels (one CTA per SM looping over its tiles).

A work item is (sequence, query tile, head). Its cost is the number of key blocks its rows see (the blocks
the kernel loop visits, jfa.jagged's visibility rule); items are sorted heaviest first and dealt to the SMs
in a zigzag (round r deals SM 0..S-1 when r is even, S-1..0 when odd), the scheme of Meta's TLX jagged
kernel. Built with torch ops on the offsets' device, sized from shapes alone: no host sync, capturable in a
CUDA graph. ``Schedule.order`` lists item ids grouped by SM; SM s runs ``order[sm_start[s]:sm_start[s+1]]``.
Unused capacity (tiles of the jagged tile table's padding) has cost -1, sorts last, and is marked -1.
"""
from __future__ import annotations

import functools
import os
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch

from .jagged import kernel_window, lengths, tile_table


@dataclass(frozen=True)
class Schedule:
    tiles: torch.Tensor  # int32 [2, capacity]: (sequence, query tile) per tile id (jagged.tile_table)
    order: torch.Tensor  # int32 [capacity * heads]: item ids (tile * heads + head), grouped by SM; -1 = none
    sm_start: torch.Tensor  # int32 [num_sms + 1]: SM s owns order[sm_start[s]:sm_start[s + 1]]
    cost: torch.Tensor  # int32 [capacity * heads]: key blocks per item id (-1 for unused slots)
    heads: int


def key_block_counts(q_offsets, kv_offsets, tiles, block_m: int, block_n: int, left: int, right: int):
    """Key blocks visited by each tile of a tile table (int64 [capacity]; -1 for unused slots).

    Same ranges as the kernels' common.key_blocks: keys [lo, hi) with lo aligned down to block_n.
    """
    seq, blk = tiles[0].long(), tiles[1].long()
    valid = seq >= 0
    s = torch.clamp(seq, min=0)
    q_off, kv_off = q_offsets.long(), kv_offsets.long()
    lq = q_off[s + 1] - q_off[s]
    lk = kv_off[s + 1] - kv_off[s]
    shift = lk - lq
    m0 = blk * block_m
    m_last = torch.minimum(m0 + block_m, lq) - 1
    lo = torch.clamp(m0 + shift - left, min=0) if left >= 0 else torch.zeros_like(m0)
    hi = torch.minimum(m_last + shift + right + 1, lk) if right >= 0 else lk
    lo = (lo // block_n) * block_n
    count = torch.clamp((hi - lo + block_n - 1) // block_n, min=0)
    return torch.where(valid, count, torch.full_like(count, -1))


# The one-kernel bookkeeping on CUDA: checked against the spec in Triton's interpreter, and every GPU test of the
# hopper backend passed through it on the H200 (docs/perf-notes.md). JFA_FUSED_SCHEDULE=0 goes back to the spec.
FUSED_ON_CUDA = os.environ.get("JFA_FUSED_SCHEDULE", "1") == "1"


def tiles_and_costs(q_offsets, kv_offsets, rows: int, block_m: int, block_n: int, left: int, right: int,
                    fused: bool | None = None):
    """(jagged.tile_table, key_block_counts) of one call. fused (default: on CUDA when FUSED_ON_CUDA): computed
    by one Triton kernel (jfa.triton.kernels.tiles; counts in int32) instead of the spec's ~80 small torch ops."""
    if fused is None:
        fused = q_offsets.is_cuda and FUSED_ON_CUDA
    batch = q_offsets.numel() - 1
    capacity = rows // block_m + batch
    if not fused or batch <= 0 or capacity == 0:
        tiles = tile_table(q_offsets, block_m, rows)
        return tiles, key_block_counts(q_offsets, kv_offsets, tiles, block_m, block_n, left, right)
    from .triton.launch import kernels_for
    tile_ends = torch.cumsum((lengths(q_offsets) + block_m - 1) // block_m, 0, dtype=torch.int32)
    tiles = torch.empty(2, capacity, dtype=torch.int32, device=q_offsets.device)
    costs = torch.empty(capacity, dtype=torch.int32, device=q_offsets.device)
    block = 256
    lk, rk = kernel_window(left, right)
    kernels_for(q_offsets.device).tile_table_kernel[(-(-capacity // block), )](
        q_offsets, kv_offsets, tile_ends, tiles, costs, batch, capacity, lk, rk, BLOCK_M=block_m, BLOCK_N=block_n,
        SEARCH_STEPS=batch.bit_length() + 1, BLOCK=block)
    return tiles, costs


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """The SMs a persistent grid is sized by: the CUDA device's; 4 under the interpreter, so that the tests see
    several programs share the work."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def zigzag_sm(rank: torch.Tensor, num_sms: int) -> torch.Tensor:
    """SM of the item at position `rank` of the heaviest-first order."""
    r, i = rank // num_sms, rank % num_sms
    return torch.where(r % 2 == 0, i, num_sms - 1 - i)


def zigzag_sm_start(n: int, num_sms: int, device) -> torch.Tensor:
    """First position of each SM's items when n items are dealt in a zigzag (int64 [num_sms + 1]).

    Closed form, from shapes alone: every full round gives each SM one item; the last, partial round of
    n % num_sms items goes to SMs 0.. (an even round) or ..num_sms-1 (an odd one)."""
    full, rest = divmod(n, num_sms)
    s = torch.arange(num_sms + 1, device=device)
    extra = torch.clamp(s, max=rest) if full % 2 == 0 else torch.clamp(s - (num_sms - rest), min=0)
    return s * full + extra


def build(q_offsets, kv_offsets, rows: int, heads: int, block_m: int, block_n: int, left: int, right: int,
          num_sms: int) -> Schedule:
    """The schedule of one attention call (see module doc). rows = query rows (B*Lq in broadcast mode)."""
    tiles, per_tile = tiles_and_costs(q_offsets, kv_offsets, rows, block_m, block_n, left, right)
    cost = per_tile.repeat_interleave(heads)  # item id = tile * heads + head
    n = cost.numel()
    ranked = torch.sort(cost, descending=True, stable=True).indices  # heaviest first; unused (-1) last
    # The item of rank r goes to SM zigzag(r), as that SM's (r // num_sms)-th item: one scatter, no second sort.
    rank = torch.arange(n, device=cost.device)
    sm_start = zigzag_sm_start(n, num_sms, cost.device)
    order = torch.empty_like(ranked)
    order[sm_start[zigzag_sm(rank, num_sms)] + rank // num_sms] = torch.where(cost[ranked] >= 0, ranked, -1)
    return Schedule(tiles, order.to(torch.int32), sm_start.to(torch.int32), cost.to(torch.int32), heads)


def sm_loads(schedule: Schedule, num_sms: int) -> torch.Tensor:
    """Total cost per SM (float64 [num_sms])."""
    order = schedule.order.long()
    counts = schedule.sm_start[1:].long() - schedule.sm_start[:-1].long()
    sm = torch.repeat_interleave(torch.arange(num_sms, device=order.device), counts)
    cost = torch.where(order >= 0, schedule.cost.double()[order.clamp(min=0)], 0.0)
    return torch.zeros(num_sms, dtype=torch.float64, device=order.device).scatter_add_(0, sm, cost)


class ScheduleCache:
    """Schedules of recent offsets (fwd, bwd and every layer of a step share one batch's offsets).

    A hit needs the very same offsets tensors (held by weak reference, so a freed tensor whose memory is
    reused never matches) at the same version counter (bumped by in-place writes, e.g. a CUDA graph's static
    offsets buffer refilled), with the same parameters. Bypassed while a CUDA graph is being captured.
    """

    def __init__(self, size: int = 8):
        self.size = size
        self.entries: OrderedDict = OrderedDict()

    def get(self, q_offsets, kv_offsets, *params) -> Schedule:
        key = (id(q_offsets), id(kv_offsets), params)
        versions = (q_offsets._version, kv_offsets._version)
        if q_offsets.is_cuda and torch.cuda.is_current_stream_capturing():
            return build(q_offsets, kv_offsets, *params)
        hit = self.entries.get(key)
        if hit is not None and hit[0]() is q_offsets and hit[1]() is kv_offsets and hit[2] == versions:
            self.entries.move_to_end(key)
            return hit[3]
        sched = build(q_offsets, kv_offsets, *params)
        self.entries[key] = (weakref.ref(q_offsets), weakref.ref(kv_offsets), versions, sched)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return sched
