"""The schedules' bookkeeping in one kernel: the jagged tile table and each tile's key-block count.

The same table as jfa.jagged.tile_table and the same counts as jfa.schedule.key_block_counts (the spec,
written in torch ops: about 80 small kernels on a GPU, where this is one). Glossary as common.py.
"""
import triton
import triton.language as tl

from .common import key_range, sequence_bounds


@triton.jit
def tile_table_kernel(q_offsets, kv_offsets, tile_ends, tiles, costs, batch, capacity, LEFT, RIGHT,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                      BLOCK: tl.constexpr):
    """Tile ids [pid * BLOCK, ...): tiles[0] = sequence (-1: unused capacity), tiles[1] = query tile index,
    costs = key blocks the tile visits (-1: unused). tile_ends[b] = tiles of sequences 0..b (cumulative)."""
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # sequence of tile idx = how many sequences end at or before it (binary search over tile_ends)
    lo = tl.zeros([BLOCK], tl.int32)
    hi = tl.zeros([BLOCK], tl.int32) + batch
    for _ in tl.static_range(SEARCH_STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        right = (tl.load(tile_ends + mid, mask=active, other=0) <= idx) & active
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    valid = lo < batch
    seq = tl.minimum(lo, batch - 1)
    q_start, q_len, kv_start, kv_len = sequence_bounds(q_offsets, kv_offsets, seq)
    tile = idx - (tl.load(tile_ends + seq) - tl.cdiv(q_len, BLOCK_M))
    k_lo, k_hi = key_range(tile * BLOCK_M, q_len, kv_len, LEFT, RIGHT, BLOCK_M, BLOCK_N)
    count = tl.maximum(tl.cdiv(k_hi - k_lo, BLOCK_N), 0)
    keep = idx < capacity
    tl.store(tiles + idx, tl.where(valid, seq, -1), mask=keep)
    tl.store(tiles + capacity + idx, tl.where(valid, tile, 0), mask=keep)
    tl.store(costs + idx, tl.where(valid, count, -1), mask=keep)
