"""The shared-memory buffers of the Hopper kernels with their mbarriers: what the 1-warp producer fills and the
consumer warpgroups read.

  Ring           a STAGES-deep ring of two operands' blocks streamed by the producer (K and V, or Q and dO)
  RowStats       beside a Ring's blocks, their rows' statistics (the backward's LSE and Delta)
  ItemOperands   operands loaded once per item, one block per consumer warpgroup (Q; K and V; Q and dO), and
                 the item's bookkeeping beside them, so the consumers read it from shared memory

The barrier protocol is the same everywhere: a ready barrier (count 1) completes when the producer's TMA bytes
land (expect-tx); an empty barrier counts one release per consumer, and the producer waits on it with the
phase flipped (a fresh barrier passes a wait on phase 1). Producer and consumers count items (t) and blocks
(it) the same way, so every wait has exactly one matching completion.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from ..variants import LOG2E
from ..geometry import TARGETS, has_prefix
from .common import aggregate
from .items import Item


@aggregate
class Ring:
    """STAGES slots of one block of each of two operands, refilled by the producer as the consumers release
    them. SPLIT: a ready and an empty barrier per operand (a consumer can start on the first operand alone, and
    release it alone: the forward's K once S is done, its V once P V is, so the producer loads the next K blocks a
    whole block earlier), else one of each; B_READY: a ready barrier per operand, one empty (the backward's Q and
    dO: S^T goes to the tensor cores once Q has landed)."""
    a: gl.shared_memory_descriptor
    b: gl.shared_memory_descriptor
    a_ready: gl.shared_memory_descriptor
    b_ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    b_empty: gl.shared_memory_descriptor
    STAGES: gl.constexpr
    SPLIT: gl.constexpr
    B_READY: gl.constexpr

    @constexpr_function
    def __init__(self, a, b, a_ready, b_ready, empty, b_empty, STAGES, SPLIT, B_READY=False):
        self.a = a
        self.b = b
        self.a_ready = a_ready
        self.b_ready = b_ready
        self.empty = empty
        self.b_empty = b_empty
        self.STAGES = gl.constexpr(STAGES)
        self.SPLIT = gl.constexpr(SPLIT)
        self.B_READY = gl.constexpr(B_READY)

    @gluon.jit
    def alloc(a_desc, b_desc, STAGES: gl.constexpr, CONSUMERS: gl.constexpr, SPLIT: gl.constexpr,
              B_READY: gl.constexpr = False):
        a = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_shape, a_desc.layout)
        b = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_shape, b_desc.layout)
        a_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        b_ready = a_ready
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        b_empty = empty
        READY_B: gl.constexpr = SPLIT or B_READY  # (SPLIT's second operand has its own ready barrier too)
        if READY_B:
            b_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        if SPLIT:
            b_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(a_ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=CONSUMERS)
            if READY_B:
                mbarrier.init(b_ready.index(i), count=1)
            if SPLIT:
                mbarrier.init(b_empty.index(i), count=CONSUMERS)
        return Ring(a, b, a_ready, b_ready, empty, b_empty, STAGES, SPLIT, READY_B)

    @gluon.jit
    def fill(self, it, a_desc, a_coord, b_desc, b_coord):
        """Producer (not SPLIT, whose operands fill_a and fill_b load, each when its own half of the slot is free):
        wait until block `it`'s slot is free, then TMA-load both operands into it."""
        self.claim(it)
        self.issue(it, a_desc, a_coord, b_desc, b_coord)

    @gluon.jit
    def fill_a(self, it, a_desc, a_coord):
        """Producer (SPLIT): wait until block `it`'s first operand's half of its slot is free, then TMA-load it."""
        self._fill_half(it, self.empty, self.a_ready, self.a, a_desc, a_coord)

    @gluon.jit
    def fill_b(self, it, b_desc, b_coord):
        """Producer (SPLIT): fill_a's for the second operand."""
        self._fill_half(it, self.b_empty, self.b_ready, self.b, b_desc, b_coord)

    @gluon.jit
    def _fill_half(self, it, empty, ready, buf, desc, coord):
        slot = it % self.STAGES
        mbarrier.wait(empty.index(slot), ((it // self.STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, coord, ready.index(slot), buf.index(slot))

    @gluon.jit
    def claim(self, it):
        """Producer: wait until block `it`'s slot is free (not SPLIT)."""
        mbarrier.wait(self.empty.index(it % self.STAGES), ((it // self.STAGES) & 1) ^ 1)

    @gluon.jit
    def issue(self, it, a_desc, a_coord, b_desc, b_coord):
        """Producer (after claim; not SPLIT, whose operands fill_a and fill_b load): arm the ready barrier and
        TMA-load both operands into block `it`'s slot."""
        slot = it % self.STAGES
        if self.B_READY:
            mbarrier.expect(self.a_ready.index(slot), a_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, a_coord, self.a_ready.index(slot), self.a.index(slot))
            mbarrier.expect(self.b_ready.index(slot), b_desc.block_type.nbytes)
        else:
            mbarrier.expect(self.a_ready.index(slot), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, a_coord, self.a_ready.index(slot), self.a.index(slot))
        tma.async_copy_global_to_shared(b_desc, b_coord, self.b_ready.index(slot), self.b.index(slot))

    @gluon.jit
    def wait(self, it):
        """Consumer: block `it`'s two operands, once they have landed."""
        slot = it % self.STAGES
        mbarrier.wait(self.a_ready.index(slot), (it // self.STAGES) & 1)
        if self.B_READY:
            mbarrier.wait(self.b_ready.index(slot), (it // self.STAGES) & 1)
        return self.a.index(slot), self.b.index(slot)

    @gluon.jit
    def wait_a(self, it):
        """Consumer: block `it`'s first operand, once it has landed."""
        slot = it % self.STAGES
        mbarrier.wait(self.a_ready.index(slot), (it // self.STAGES) & 1)
        return self.a.index(slot)

    @gluon.jit
    def wait_b(self, it):
        """Consumer: block `it`'s second operand, once it has landed (with one ready barrier, wait_a's wait)."""
        slot = it % self.STAGES
        if self.B_READY:
            mbarrier.wait(self.b_ready.index(slot), (it // self.STAGES) & 1)
        return self.b.index(slot)

    @gluon.jit
    def release(self, it):
        """Consumer: done reading block `it`'s slot (after the MMAs that read it completed)."""
        self.release_a(it)
        if self.SPLIT:
            self.release_b(it)

    @gluon.jit
    def release_a(self, it):
        """Consumer: done reading block `it`'s first operand (SPLIT; else the whole slot, as release)."""
        mbarrier.arrive(self.empty.index(it % self.STAGES), count=1)

    @gluon.jit
    def release_b(self, it):
        """Consumer (SPLIT): done reading block `it`'s second operand."""
        mbarrier.arrive(self.b_empty.index(it % self.STAGES), count=1)


@aggregate
class RowStats:
    """Beside each block of a Ring, its rows' statistics (the backward's log2-scaled LSE and Delta, BLOCK_M
    float32 each): the producer loads them and stores them to shared memory before it arms the slot's ready
    barrier (whose arrival releases the stores; the consumers' release of the slot orders their reads before
    the next round's stores), so the consumers read shared memory instead of waiting on global
    loads in the middle of the block. (A TMA load of a [2, 64] float32 box faulted as an illegal instruction on the
    H200 with triton 3.6.)"""
    buf: gl.shared_memory_descriptor  # [STAGES * 2, BLOCK_M]
    STAGES: gl.constexpr

    @constexpr_function
    def __init__(self, buf, STAGES):
        self.buf = buf
        self.STAGES = gl.constexpr(STAGES)

    @gluon.jit
    def alloc(BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
        plain: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        return RowStats(gl.allocate_shared_memory(gl.float32, [STAGES * 2, BLOCK_M], plain), STAGES)

    @gluon.jit
    def put(self, it, LSE, DELTA, row0, rows):
        """Producer (1 warp), between ring.claim(it) and ring.issue(it): rows [row0, row0 + BLOCK_M) of LSE
        (times log2 e) and -DELTA (dP^T's accumulator starts at it: bwd_block._dpt), zero past `rows`."""
        BLOCK_M: gl.constexpr = self.buf.shape[1]
        layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
        offs = row0 + gl.arange(0, BLOCK_M, layout=layout)
        lse = gl.load(LSE + offs, mask=offs < rows, other=0.0)
        delta = gl.load(DELTA + offs, mask=offs < rows, other=0.0)
        slot = it % self.STAGES
        self.buf.index(2 * slot).store(lse * LOG2E)
        self.buf.index(2 * slot + 1).store(-delta)
        # every lane's stores before the one elected lane's arrive on the ready barrier (which releases them)
        gl.thread_barrier()

    @gluon.jit
    def read(self, it, layout: gl.constexpr, which: gl.constexpr):
        """Consumer (after the ring's wait): block `it`'s log2 e * LSE (which 0) or -Delta (1) in `layout` (each read
        where it is used: held together they are 32 registers a thread at D=128)."""
        return self.buf.index(2 * (it % self.STAGES) + which).load(layout)


RECORD = gl.constexpr(16)  # int32 fields of a posted item's record (ItemOperands.post fills ten)


@gluon.jit
def _field(rec, k, i: gl.constexpr):
    """Field i of a posted record (every lane holds all of it: an in-thread sum)."""
    return gl.sum(gl.where(k == i, rec, 0), axis=0)


@aggregate
class ItemOperands:
    """One block of one or two operands per consumer warpgroup, loaded once per item, in SLOTS sets used by items in
    turn (item t takes set t % SLOTS: with two, the next item's blocks load while this one runs): ready[set, w]
    completes when consumer w's block lands; empty[set] counts one release per consumer."""
    a: gl.shared_memory_descriptor  # [SLOTS * CONSUMERS, rows, cols]
    b: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    meta: gl.shared_memory_descriptor  # POSTED: [SLOTS, RECORD] int32, each set's Item (post, item)
    TWO: gl.constexpr
    CONSUMERS: gl.constexpr
    SLOTS: gl.constexpr
    POSTED: gl.constexpr
    RECORDS: gl.constexpr  # POSTED: the readers take the record's Item (item), else its slot's (posted)

    @constexpr_function
    def __init__(self, a, b, ready, empty, meta, TWO, CONSUMERS, SLOTS, POSTED, RECORDS):
        self.a = a
        self.b = b
        self.ready = ready
        self.empty = empty
        self.meta = meta
        self.TWO = gl.constexpr(TWO)
        self.CONSUMERS = gl.constexpr(CONSUMERS)
        self.SLOTS = gl.constexpr(SLOTS)
        self.POSTED = gl.constexpr(POSTED)
        self.RECORDS = gl.constexpr(RECORDS)

    @gluon.jit
    def alloc(a_desc, b_desc, CONSUMERS: gl.constexpr, TWO: gl.constexpr, SLOTS: gl.constexpr = 1,
              POSTED: gl.constexpr = False, WRITER: gl.constexpr = False, RECORDS: gl.constexpr = True):
        """WRITER: a writer warp reads the posted records too (a work queue's items: jfa.hopper.items.WorkList.take)
        and releases each set once it has (its arrival counts on empty beside the consumers'). RECORDS: the readers
        take each posted Item whole (item), else from its posted slot as the schedule gives it (posted)."""
        a = gl.allocate_shared_memory(a_desc.dtype, [SLOTS * CONSUMERS] + a_desc.block_shape, a_desc.layout)
        b = a
        if TWO:
            b = gl.allocate_shared_memory(b_desc.dtype, [SLOTS * CONSUMERS] + b_desc.block_shape, b_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [SLOTS * CONSUMERS, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(SLOTS):
            mbarrier.init(empty.index(i), count=CONSUMERS + WRITER)
        for i in gl.static_range(SLOTS * CONSUMERS):
            mbarrier.init(ready.index(i), count=1)
        meta = empty
        if POSTED and RECORDS:
            plain: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
            meta = gl.allocate_shared_memory(gl.int32, [SLOTS, RECORD], plain)
        return ItemOperands(a, b, ready, empty, meta, TWO, CONSUMERS, SLOTS, POSTED, RECORDS)

    @gluon.jit
    def post(self, t, tile, slot, work):
        """Producer (1 warp), after acquire and before load: item t's bookkeeping into its set (RECORDS: its Item, so
        the consumers skip WorkList's three dependent global loads per item, ncu: 15-20% of the consumers' stall
        samples on targets-32), or its schedule slot through global memory (WorkList.post). The load's ready
        barriers release the stores, the set's empty barrier orders the readers' reads before the next item's."""
        if self.RECORDS:
            k = gl.arange(0, RECORD, layout=gl.BlockedLayout([RECORD], [32], [1], [0]))
            targets = 0
            if len(tile.seq) == 3:  # HSTU's mask (jfa.geometry.sequence): the sequence's target count
                targets = tile.seq[2]
            fields = (tile.head, tile.start, tile.q_start, tile.q_len, tile.kv_start, tile.kv_len, tile.lo, tile.hi,
                      tile.pre, targets)  # Item's fields in order, valid aside (item: head >= 0)
            rec = gl.full([RECORD], 0, gl.int32, layout=k.type.layout)
            for i in gl.static_range(len(fields)):
                rec = gl.where(k == i, fields[i], rec)
            self.meta.index(t % self.SLOTS).store(rec)
        else:
            work.post(t % self.SLOTS, slot)
        gl.thread_barrier()  # every lane's stores before the one elected lane's arrive

    @gluon.jit
    def close(self, t, work):
        """Producer, after its last item t - 1: set t says no item, its ready barriers complete empty (the readers'
        loop over posted items ends there)."""
        self.acquire(t)
        if self.RECORDS:
            layout: gl.constexpr = gl.BlockedLayout([RECORD], [32], [1], [0])
            self.meta.index(t % self.SLOTS).store(gl.full([RECORD], -1, gl.int32, layout=layout))
        else:
            work.post(t % self.SLOTS, -1)
        gl.thread_barrier()
        for w in gl.static_range(self.CONSUMERS):
            self.skip(t, w)

    @gluon.jit
    def item(self, t, WARPS: gl.constexpr, rule, KEY_TILES: gl.constexpr):
        """A reader (WARPS warps, after wait): item t's Item, as the producer posted it, for the kernel's mask rule
        (jfa.geometry.Rule) and kind of tile."""
        k = gl.arange(0, RECORD, layout=gl.BlockedLayout([RECORD], [32], [WARPS], [0]))
        rec = self.meta.index(t % self.SLOTS).load(k.type.layout)
        head = _field(rec, k, 0)
        q_len, kv_len = _field(rec, k, 3), _field(rec, k, 5)
        seq = (q_len, kv_len)
        if rule.KIND == TARGETS:
            seq = (q_len, kv_len, _field(rec, k, 9))
        return Item(head >= 0, head, _field(rec, k, 1), _field(rec, k, 2), q_len, _field(rec, k, 4), kv_len, seq,
                    _field(rec, k, 8), _field(rec, k, 6), _field(rec, k, 7), has_prefix(rule.KIND, KEY_TILES))

    @gluon.jit
    def more(self, t, WARPS: gl.constexpr, work):
        """A reader (WARPS warps, after wait): whether set t holds an item (not the end mark)."""
        if self.RECORDS:
            k = gl.arange(0, RECORD, layout=gl.BlockedLayout([RECORD], [32], [WARPS], [0]))
            return _field(self.meta.index(t % self.SLOTS).load(k.type.layout), k, 0) >= 0
        else:
            return work.post_read(t % self.SLOTS) >= 0

    @gluon.jit
    def posted(self, t, WARPS: gl.constexpr, work, batch, shape, KEY_TILES: gl.constexpr):
        """A reader (after wait, while more): item t's Item, from its record (RECORDS), or computed afresh from its
        posted slot as the unposted readers compute theirs (jfa.hopper.items.WorkList.tile: with the records' ten
        fields live, the D=128 one pass spilled 948 -> 1188 B and ran 10-23% slower)."""
        if self.RECORDS:
            return self.item(t, WARPS, batch.rule, KEY_TILES)
        else:
            return work.tile(work.post_read(t % self.SLOTS), batch, shape, KEY_TILES)

    @gluon.jit
    def acquire(self, t):
        """Producer: wait until every consumer has released the blocks of item t - SLOTS (the same set)."""
        mbarrier.wait(self.empty.index(t % self.SLOTS), ((t // self.SLOTS) & 1) ^ 1)

    @gluon.jit
    def load(self, t, w: gl.constexpr, a_desc, a_coord, b_desc, b_coord):
        """Producer: TMA-load consumer w's block(s) of item t (after acquire)."""
        i = (t % self.SLOTS) * self.CONSUMERS + w
        bar = self.ready.index(i)
        if self.TWO:
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, a_coord, bar, self.a.index(i))
            tma.async_copy_global_to_shared(b_desc, b_coord, bar, self.b.index(i))
        else:
            mbarrier.expect(bar, a_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, a_coord, bar, self.a.index(i))

    @gluon.jit
    def skip(self, t, w: gl.constexpr):
        """Producer: consumer w has no rows in item t (it reads no block): complete its ready barrier empty."""
        mbarrier.arrive(self.ready.index((t % self.SLOTS) * self.CONSUMERS + w), count=1)

    @gluon.jit
    def wait(self, t, w: gl.constexpr):
        """Consumer w: item t's blocks have landed."""
        mbarrier.wait(self.ready.index((t % self.SLOTS) * self.CONSUMERS + w), (t // self.SLOTS) & 1)

    @gluon.jit
    def a_block(self, t, w):
        """Consumer w's (or, for a shared read, consumer w's neighbour's) first operand of item t."""
        return self.a.index((t % self.SLOTS) * self.CONSUMERS + w)

    @gluon.jit
    def b_block(self, t, w):
        return self.b.index((t % self.SLOTS) * self.CONSUMERS + w)

    @gluon.jit
    def release(self, t):
        """Consumer: done reading item t's blocks."""
        mbarrier.arrive(self.empty.index(t % self.SLOTS), count=1)
