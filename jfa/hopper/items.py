"""The work items of the persistent Hopper kernels: this CTA's slots of a jfa.schedule (WorkList) and what each
is (Item: a tile of one sequence and head, and the walk over the other side's blocks it sees, from jfa.geometry).

Every partition of a kernel (producer, consumers, dQ writer) computes its items from the same WorkList, or reads
the producer's posted copy of them (jfa.hopper.buffers.ItemOperands), so that all walk the same blocks.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function

from ..geometry import block_count, key_range, query_prefix, query_range, sequence_bounds, sequence_rule
from .common import aggregate


@aggregate
class Item:
    """Rows [start, start + BLOCK) of one side of sequence seq (queries, or keys for the dK/dV pass), one head
    (a query head, or a kv head), and [lo, hi): the rows of the other side it sees (jfa.geometry); with TARGETS
    (HSTU's mask) the sequence's targets, and for a key tile the context rows [0, pre) it walks first."""
    valid: gl.tensor
    head: gl.tensor
    start: gl.tensor
    q_start: gl.tensor
    q_len: gl.tensor
    kv_start: gl.tensor
    kv_len: gl.tensor
    lo: gl.tensor
    hi: gl.tensor
    n_targets: gl.tensor
    pre: gl.tensor
    TARGETS: gl.constexpr

    @constexpr_function
    def __init__(self, valid, head, start, q_start, q_len, kv_start, kv_len, lo, hi, n_targets, pre, TARGETS):
        self.valid = valid
        self.head = head
        self.start = start
        self.q_start = q_start
        self.q_len = q_len
        self.kv_start = kv_start
        self.kv_len = kv_len
        self.lo = lo
        self.hi = hi
        self.n_targets = n_targets
        self.pre = pre
        self.TARGETS = gl.constexpr(TARGETS)

    @gluon.jit
    def seq(self):
        """The sequence's lengths (and targets) as jfa.geometry takes them."""
        if self.TARGETS:
            return (self.q_len, self.kv_len, self.n_targets)
        else:
            return (self.q_len, self.kv_len)

    @gluon.jit
    def n_blocks(self, BLOCK: gl.constexpr):
        """Blocks of the item's walk over [lo, hi) (the producer's loop over range(lo, hi, BLOCK) visits as many),
        without a key tile's prefix (n_pre)."""
        return block_count(self.lo, self.hi, BLOCK)

    @gluon.jit
    def n_pre(self, BLOCK: gl.constexpr):
        """Blocks of a key tile's walk over the context rows [0, pre) before [lo, hi) (0 but with HSTU's mask)."""
        return self.pre // BLOCK

    @gluon.jit
    def block_start(self, j, BLOCK: gl.constexpr):
        """The first row of block j of the walk: the prefix's blocks, then [lo, hi)'s."""
        if self.TARGETS:
            n_pre = self.pre // BLOCK
            return gl.where(j < n_pre, j * BLOCK, self.lo + (j - n_pre) * BLOCK)
        else:
            return self.lo + j * BLOCK


@aggregate
class WorkList:
    """This CTA's slots of a schedule (jfa.schedule.Schedule: tiles, order, sm_start)."""
    tiles: gl.tensor
    order: gl.tensor
    sm_start: gl.tensor
    tile_capacity: gl.tensor
    heads: gl.tensor

    @constexpr_function
    def __init__(self, tiles, order, sm_start, tile_capacity, heads):
        self.tiles = tiles
        self.order = order
        self.sm_start = sm_start
        self.tile_capacity = tile_capacity
        self.heads = heads

    @gluon.jit
    def create(tiles, order, sm_start, tile_capacity, heads):
        return WorkList(tiles, order, sm_start, gl.to_tensor(tile_capacity), gl.to_tensor(heads))

    @gluon.jit
    def bounds(self):
        """[first, end): this CTA's slots of the schedule's order."""
        i_sm = gl.program_id(0)
        return gl.load(self.sm_start + i_sm), gl.load(self.sm_start + i_sm + 1)

    @gluon.jit
    def query_tile(self, idx, batch, shape):
        """Slot idx's Item when the items are query tiles of shape.BLOCK_M rows (forward, dQ pass): their keys."""
        return self._item(idx, batch, shape.BLOCK_M, shape.BLOCK_N, False)

    @gluon.jit
    def key_tile(self, idx, batch, shape):
        """Slot idx's Item when the items are key tiles of shape.BLOCK_N keys (dK/dV): the queries that see them."""
        return self._item(idx, batch, shape.BLOCK_N, shape.BLOCK_M, True)

    @gluon.jit
    def _item(self, idx, batch, BLOCK: gl.constexpr, OTHER_BLOCK: gl.constexpr, KEY_TILES: gl.constexpr):
        """Each partition computes its items afresh every turn (docs/hopper.md: values carried across turns once
        miscompiled)."""
        item = gl.load(self.order + idx)
        i_tile = gl.maximum(item, 0) // self.heads
        seq = gl.maximum(gl.load(self.tiles + i_tile), 0)
        start = gl.load(self.tiles + self.tile_capacity + i_tile) * BLOCK
        q_start, kv_start, lens = sequence_bounds(batch.q_offsets, batch.kv_offsets, seq)
        seq_t, rule = sequence_rule(seq, lens, batch.LEFT, batch.RIGHT, batch.num_targets, batch.CONTEXT,
                                    batch.TARGETS)
        pre = gl.to_tensor(0)
        if KEY_TILES:
            lo, hi = query_range(start, seq_t, rule, OTHER_BLOCK, BLOCK)
            if batch.TARGETS:
                pre = query_prefix(start, seq_t, rule, OTHER_BLOCK, BLOCK)
        else:
            lo, hi = key_range(start, seq_t, rule, BLOCK, OTHER_BLOCK)
        n_targets = seq_t[2] if batch.TARGETS else gl.to_tensor(0)
        return Item(item >= 0, gl.maximum(item, 0) % self.heads, start, q_start, lens[0], kv_start, lens[1], lo,
                    hi, n_targets, pre, batch.TARGETS)
