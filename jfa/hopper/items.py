"""The work items of the persistent Hopper kernels: this CTA's slots of a jfa.schedule (WorkList) and what each
is (Item: a tile of one sequence and head, and the walk over the other side's blocks it sees, from jfa.geometry).

Every partition of a kernel (producer, consumers, dQ writer) computes its items from the same WorkList, or reads
the producer's posted copy of them (jfa.hopper.buffers.ItemOperands), so that all walk the same blocks.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function

from ..geometry import block_count, has_prefix, sequence, sequence_bounds, tile_walk
from ..schedule import deal_slot
from .common import aggregate


@aggregate
class Item:
    """Rows [start, start + BLOCK) of one side of a sequence (queries, or keys for the dK/dV pass), one head (a query
    head, or a kv head), and the walk over the other side's rows it sees (jfa.geometry.tile_walk): with PREFIX (a key
    tile's walk under HSTU's mask) the rows [0, pre) first, then [lo, hi). seq: the sequence as jfa.geometry takes it.

    Every site walks it the same way: per part (part(p), for p in static_range(PARTS)) the rows range(lo, hi, BLOCK)
    (the producer, the dQ writer), or by block index j < n_walk(BLOCK) from block_start(j) (the consumers)."""
    valid: gl.tensor
    head: gl.tensor
    start: gl.tensor
    q_start: gl.tensor
    q_len: gl.tensor
    kv_start: gl.tensor
    kv_len: gl.tensor
    seq: gl.tuple
    pre: gl.tensor
    lo: gl.tensor
    hi: gl.tensor
    PREFIX: gl.constexpr
    PARTS: gl.constexpr

    @constexpr_function
    def __init__(self, valid, head, start, q_start, q_len, kv_start, kv_len, seq, pre, lo, hi, PREFIX):
        self.valid = valid
        self.head = head
        self.start = start
        self.q_start = q_start
        self.q_len = q_len
        self.kv_start = kv_start
        self.kv_len = kv_len
        self.seq = seq
        self.pre = pre
        self.lo = lo
        self.hi = hi
        self.PREFIX = gl.constexpr(PREFIX)
        self.PARTS = gl.constexpr(2 if PREFIX else 1)

    @gluon.jit
    def part(self, p: gl.constexpr):
        """Part p of the walk, (first row, end): the prefix [0, pre) then [lo, hi), or [lo, hi) alone."""
        if self.PREFIX and p == 0:
            return 0, self.pre
        else:
            return self.lo, self.hi

    @gluon.jit
    def n_blocks(self, BLOCK: gl.constexpr):
        """Blocks of the walk over [lo, hi) (the producer's loop over range(lo, hi, BLOCK) visits as many)."""
        return block_count(self.lo, self.hi, BLOCK)

    @gluon.jit
    def n_pre(self, BLOCK: gl.constexpr):
        """Blocks of the prefix [0, pre) (a multiple of BLOCK; none without PREFIX)."""
        if self.PREFIX:
            return self.pre // BLOCK
        else:
            return 0

    @gluon.jit
    def block_start(self, j, BLOCK: gl.constexpr):
        """The first row of block j of the whole walk: the prefix's blocks, then [lo, hi)'s."""
        if self.PREFIX:
            n_pre = self.pre // BLOCK
            return gl.where(j < n_pre, j * BLOCK, self.lo + (j - n_pre) * BLOCK)
        else:
            return self.lo + j * BLOCK


# one lane adds 1 to the ticket, its old value goes to the warp by a shuffle: triton's scalar atomic_add broadcasts
# its result through shared memory, and with it the dK/dV kernel's default partition (a consumer) moved its block
# loops' indices out of uniform registers (R2UR 27 -> 53, LDL 4 -> 21 per block at D=128: ptxas, by compiles)
_TAKE = gl.constexpr("""{
    .reg .pred first;
    .reg .b32 lane;
    mov.u32 lane, %laneid;
    setp.eq.u32 first, lane, 0;
    mov.u32 $0, 0;
    @first atom.global.add.u32 $0, [$1], 1;
    shfl.sync.idx.b32 $0, $0, 0, 0x1f, 0xffffffff;
}""")


@aggregate
class WorkList:
    """This CTA's slots of a schedule (jfa.schedule.Schedule: tiles, order, sm_start), or with QUEUE the schedule's
    ranks as a work queue: the producer takes the next rank (an atomic ticket) whenever it has room for an item and
    posts its slot to the other partitions (jfa.hopper.buffers.ItemOperands.post, WorkList.post)."""
    tiles: gl.tensor
    order: gl.tensor
    sm_start: gl.tensor
    tile_capacity: gl.tensor
    heads: gl.tensor
    ticket: gl.tensor
    QUEUE: gl.constexpr

    @constexpr_function
    def __init__(self, tiles, order, sm_start, tile_capacity, heads, ticket, QUEUE):
        self.tiles = tiles
        self.order = order
        self.sm_start = sm_start
        self.tile_capacity = tile_capacity
        self.heads = heads
        self.ticket = ticket
        self.QUEUE = gl.constexpr(QUEUE)

    @gluon.jit
    def create(sched, QUEUE: gl.constexpr = False):
        """From the launcher's jfa.schedule.Schedule.kernel_args (to_tensor: an int of 1 arrives as a constexpr)."""
        return WorkList(sched[0], sched[1], sched[2], gl.to_tensor(sched[3]), gl.to_tensor(sched[4]), sched[5],
                        QUEUE)

    @gluon.jit
    def bounds(self):
        """[first, end): this CTA's slots of the schedule's order."""
        i_sm = gl.program_id(0)
        return gl.load(self.sm_start + i_sm), gl.load(self.sm_start + i_sm + 1)

    @gluon.jit
    def take(self):
        """Producer (QUEUE): the slot of the queue's next rank (jfa.schedule.deal_slot), -1 once none is left."""
        r = gl.inline_asm_elementwise(_TAKE, "=r,l", [self.ticket], dtype=gl.int32, is_pure=False, pack=1)
        n = self.tile_capacity * self.heads
        ctas = gl.num_programs(0)
        slot = deal_slot(r, ctas, n // ctas, self.sm_start, r < n)
        return gl.where(r < n, slot, -1)

    @gluon.jit
    def post(self, box, slot):
        """Producer (QUEUE): the slot of its next item (or -1, none) into this CTA's mailbox box (0, 1), read from
        global memory by the readers after their barrier wait (post_read): a slot read from shared memory made the
        default partition's block loops carry their indices in regular registers (R2UR 27 -> 53 per block, LDL
        4 -> 21 at D=128), a global load keeps them uniform as the dealt schedule's."""
        gl.store(self.ticket + 1 + 2 * gl.program_id(0) + box, slot)

    @gluon.jit
    def post_read(self, box):
        """A reader (after the barrier wait that follows the post): the slot in mailbox box."""
        return gl.load(self.ticket + 1 + 2 * gl.program_id(0) + box, cache_modifier=".cg")

    @gluon.jit
    def sequence(self, idx):
        """Slot idx's sequence (its index in the batch)."""
        item = gl.load(self.order + idx)
        return gl.maximum(gl.load(self.tiles + gl.maximum(item, 0) // self.heads), 0)

    @gluon.jit
    def query_tile(self, idx, batch, shape):
        """Slot idx's Item when the items are query tiles of shape.BLOCK_M rows (forward, dQ pass): their keys."""
        return self._item(idx, batch, shape.BLOCK_M, shape.BLOCK_N, False)

    @gluon.jit
    def key_tile(self, idx, batch, shape):
        """Slot idx's Item when the items are key tiles of shape.BLOCK_N keys (dK/dV): the queries that see them."""
        return self._item(idx, batch, shape.BLOCK_N, shape.BLOCK_M, True)

    @gluon.jit
    def tile(self, idx, batch, shape, KEY_TILES: gl.constexpr):
        """Slot idx's key tile (KEY_TILES) or query tile."""
        if KEY_TILES:
            return self.key_tile(idx, batch, shape)
        else:
            return self.query_tile(idx, batch, shape)

    @gluon.jit
    def _item(self, idx, batch, BLOCK: gl.constexpr, OTHER_BLOCK: gl.constexpr, KEY_TILES: gl.constexpr):
        """Each partition computes its items afresh every turn (docs/hopper.md: values carried across turns once
        miscompiled)."""
        item = gl.load(self.order + idx)
        i_tile = gl.maximum(item, 0) // self.heads
        seq = gl.maximum(gl.load(self.tiles + i_tile), 0)
        start = gl.load(self.tiles + self.tile_capacity + i_tile) * BLOCK
        q_start, kv_start, lens = sequence_bounds(batch.q_offsets, batch.kv_offsets, seq)
        seq_t = sequence(seq, lens, batch.rule)
        pre, lo, hi = tile_walk(start, seq_t, batch.rule, BLOCK, OTHER_BLOCK, KEY_TILES)
        return Item(item >= 0, gl.maximum(item, 0) % self.heads, start, q_start, lens[0], kv_start, lens[1], seq_t,
                    pre, lo, hi, has_prefix(batch.rule.KIND, KEY_TILES))
