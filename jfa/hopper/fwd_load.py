"""The Hopper forward's producer partition (jfa.hopper.fwd): one warp that, per item, TMA-loads the Q tile (one
WG_ROWS box per consumer: ItemOperands) and then streams the tile's K/V blocks through the Ring, each into a slot
every consumer has released. Items come from the shared queue (WorkList.take) or the CTA's slice of the schedule,
in the consumers' order; with posted items the producer also writes each item's record for them."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .common import WG_ROWS


@gluon.jit
def _page_row(work, idx, pages):
    """Paged k and v (pages: the page table, its row stride, PAGE rows a page; jfa.problem.Problem.page_args): the
    item's row of the page table; packed (pages None): 0, unread (a jit function returns no None)."""
    if pages is None:
        return 0
    else:
        return pages[0] + work.sequence(idx).to(gl.int64) * pages[1]


@gluon.jit
def _key_row(tile, n0, page_row, pages):
    """The row of k and v that holds the tile's key n0: kv_start + n0 packed; paged, through the page table (BLOCK_N
    divides PAGE: a block never crosses a page)."""
    if pages is None:
        return tile.kv_start + n0
    else:
        return gl.load(page_row + n0 // pages[2]) * pages[2] + n0 % pages[2]


@gluon.jit
def load_partition(shape, work, batch, q_desc, k_desc, v_desc, q_ops, kv, pages):
    it = 0  # K/V blocks loaded so far
    t = 0  # items loaded so far
    if work.QUEUE:  # the next item whenever the last one's loads are issued (WorkList.take)
        idx = work.take()
        while idx >= 0:
            tile = work.query_tile(idx, batch, shape)
            if tile.valid:
                it = _load_item(t, it, idx, tile, shape, work, q_desc, k_desc, v_desc, q_ops, kv, pages)
                t += 1
            idx = work.take()
    else:
        first, end = work.bounds()
        for idx in range(first, end):
            tile = work.query_tile(idx, batch, shape)
            if tile.valid:
                it = _load_item(t, it, idx, tile, shape, work, q_desc, k_desc, v_desc, q_ops, kv, pages)
                t += 1
    if q_ops.POSTED:
        q_ops.close(t, work)  # the consumers' end mark


@gluon.jit
def _load_item(t, it, idx, tile, shape, work, q_desc, k_desc, v_desc, q_ops, kv, pages):
    """Producer: item t (schedule slot idx): its Q (posted: its record or slot first), then its K/V blocks from ring
    block it on -> the next block's count."""
    HEAD_DIM: gl.constexpr = q_desc.block_shape[1]
    q_row0 = tile.start if shape.BROADCAST else tile.q_start + tile.start  # broadcast: one dense q
    q_ops.acquire(t)
    if q_ops.POSTED:
        q_ops.post(t, tile, idx, work)
    for w in gl.static_range(shape.CONSUMERS):
        if tile.start + w * WG_ROWS < tile.q_len:
            q_ops.load(t, w, q_desc, [q_row0 + w * WG_ROWS, tile.head * HEAD_DIM], q_desc, None)
        else:  # no rows for consumer w: it reads no Q
            q_ops.skip(t, w)
    col = (tile.head // shape.GROUP) * HEAD_DIM
    page_row = _page_row(work, idx, pages)
    first = it
    prev = 0  # the row of block it - 1's V, loaded after block it's K: the consumers take K_j before V_{j-1}
    for part in gl.static_range(tile.PARTS):  # the item's walk (Item.part)
        lo, hi = tile.part(part)
        for n0 in range(lo, hi, shape.BLOCK_N):
            row = _key_row(tile, n0, page_row, pages)
            kv.fill_a(it, k_desc, [row, col])
            if it > first:
                kv.fill_b(it - 1, v_desc, [prev, col])
            prev = row
            it += 1
    if it > first:
        kv.fill_b(it - 1, v_desc, [prev, col])
    return it
