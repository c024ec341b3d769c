"""The Hopper kernels' configurations: one frozen dataclass per kernel, chosen by shape (``select_fwd``,
``select_bwd``), or handed in whole (``jfa.hopper.forward(p, cfg)``, ``backward(..., plan)``: the tests run every
form that way). A kernel takes its config whole, as one constexpr (CFG: a frozen dataclass is hashable and prints
the same every time, which is what Triton's compile cache keys on). Each choice cites the H200 measurement behind
it (ms, main / this, one call); docs/perf-notes.md has the runs and what lost.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from ..jagged import UNBOUNDED
from ..problem import Problem
from ..schedule import ScheduleSpec

WG = 64  # rows of one consumer warpgroup's tile (a wgmma m64 instruction)
SCHEDULE_BLOCK_N = 128  # the forward's and the dQ pass's items are costed in key blocks of this many rows

# mean keys per sequence up to which the forward takes 2 K/V stages and stores O in 16-byte pieces through the
# shared memory a third stage would take: the short form won at 63-513 keys (8-13%), was mixed at 1,030-1,070
# and lost above (self-skewed-8k 2.62 vs 2.70-2.85 ms with it)
SHORT_KV = 768
# up to this mean key length D=128 takes 64-row tiles and 64-key blocks at two CTAs per SM (0 spills at 128
# registers, 90 KB of shared memory): two items in flight per SM, since the short forward waits on per-item
# latency, not bytes (ncu). short-128 forward 0.913 / 0.923 -> 0.768 / 0.759 ms
SHORT_TILE_KV = 128
# up to this many query rows per sequence the one pass at D=128 takes (Q, dO) blocks of 32 rows (64-row blocks
# were half empty on targets-32), dQ computed transposed (K^T dS^T: wgmma's M is then the head dim), and the room
# this frees holds a second K/V set. targets-32 backward 2.253 / 2.254 -> 1.629 / 1.627 ms
SHORT_Q = 32
# up to this many query rows per sequence the dK/dV pass without dQ at D=128 takes the same 32-row blocks and second
# K/V set (an item of broadcast q's 64 rows waited on its K/V load: ncu put gdpa-pma's pass at 69% of DRAM bandwidth).
# dK/dV pass gdpa-pma 1.391 / 1.391 -> 1.190 / 1.231 ms, pma-64 1.479 / 1.480 -> 1.433 / 1.428; at 256 rows
# (pma-256) 3.283 / 3.302 -> 3.578 / 3.584: 64-row blocks win there
SHORT_Q_DKDV = 64
# ring stages of the direct route at D=128 (32-row blocks, two K/V sets, 209 KiB): short-128 backward 2.579 /
# 2.567 -> 2.312 / 2.315 ms with 2 stages, 2.294 / 2.300 with 3
DIRECT_STAGES = 3
# K/V sets of the dK/dV kernel where they fit (D=64; D=128 beside 32-row blocks): the next item's K/V load while
# this one runs. pma-32-d64 backward 1.466 / 1.459 -> 1.110 / 1.113 ms (its items see one (Q, dO) block each).
# A D=128 set is 64 KB: no room beside 64-row blocks (the one pass takes 181 KB with one)
KV_SLOTS = 2
# where the dK/dV kernel has one K/V set, its producer prefetches into L2 the K and V of broadcast q's items that walk
# at most this many query rows (their TMA load from DRAM, once the set frees, was most of a short item's wait).
# Whole backward, 3 rounds: pma-256 -6.5% (H100), -2.3% (H100), -4.8% (H200); self-attention's D=128 rows lost
# (self-skewed-8k +1.8%, +1.0%, +0.9%; causal-skewed-4k and window-256 +0.9%, +1.2% on the H200), so for_problem
# gives it to broadcast q alone. With two sets the next item's K/V loads ahead anyway, and the producer's prefetch work
# only delays the tiny items (pma-64's backward +10%)
KV_PREFETCH_ROWS = 512


class DqRoute(enum.IntEnum):
    """How the backward computes dQ (DkdvConfig.dq)."""
    NONE = 0  # the dK/dV kernel does not: the dQ pass computes it
    REDUCE = 1  # the one pass: dQ too, reduce-added into float32 by TMA from a writer warp (jfa.hopper.dq_reduce)
    DIRECT = 2  # for sequences whose keys fit one key tile (their dQ is complete there), stored in q's dtype; the
    # dQ pass skips those sequences and computes the rest


@dataclass(frozen=True)
class FwdConfig:
    consumers: int  # consumer warpgroups per CTA, WG query rows each
    block_n: int = 128  # keys per K/V block
    stages: int = 3  # K/V ring depth (the ring and Q fit in the 227 KB of shared memory at D=128)
    # O's 16-byte pieces (store_rows) converted within each warp, else through the warpgroup's scratch (a warpgroup
    # barrier an item). H100, 3-5 rounds, from 4-byte stores: hstu-silu -6.1%, hstu-targets -6.3%, gqa-uniform-2k
    # -5.2%, causal-skewed-4k and self-skewed-8k -2.0%; the short forms kept the warpgroup's (short-128 +0.8%,
    # d64-uniform-512 +1.4% within each warp)
    store_in_warps: bool = True
    posted_items: bool = False  # the producer posts each item beside its Q, then an end mark (ItemOperands.post)
    pingpong: bool = False  # two consumers take turns issuing a block's MMAs (jfa.hopper.fwd._turn)
    queue: bool = False  # items from a work queue, posted (as DkdvConfig.queue: for K/V's reuse in L2)
    # softmax's weights inside both arms of the mask's branch (jfa.hopper.fwd._weights): after the join, ptxas
    # put the consumer's wait for its own P V before them
    weights_in_arms: bool = False
    # Q tiles in shared memory: with 2, the producer loads the next item's Q (and so the item's first K/V blocks)
    # while this one runs (ItemOperands' sets), where one slot frees only after the item's last S. D=64, 3 rounds:
    # d64-uniform-512 0.797 -> 0.757 ms (H200), 0.821 -> 0.752 (H100); D=128's long form (select_fwd). Not D=128's
    # short forms: one consumer, short-128 0.816 -> 1.104 (H100); two, self-uniform-1k and self-full-512 even (H200)
    q_slots: int = 1

    @property
    def block_m(self) -> int:
        return self.consumers * WG

    @property
    def posts(self) -> bool:
        """The producer posts each item (jfa.hopper.buffers.ItemOperands.post): posted_items, or a work queue's."""
        return self.posted_items or self.queue

    @property
    def ctas_per_sm(self) -> int:
        """One CTA of two consumers per SM, or two of one consumer each."""
        return 3 - self.consumers

    def launch_options(self) -> dict:
        """Two CTAs per SM need each to launch with at most half the register file (256 threads x 128)."""
        return {"maxnreg": 128} if self.ctas_per_sm == 2 else {}


def select_fwd(head_dim: int, mean_kv_len: float = float("inf")) -> FwdConfig:
    """By head dim and the batch's mean key length (keys / sequences, known on the host without a sync).
    D=128: 128-row tiles whose two warpgroups share each K/V block, or up to SHORT_TILE_KV 64-row tiles. D=64 up
    to SHORT_KV: 64-row tiles at two CTAs per SM (d64-uniform-512: 149 vs 139 TF/s with two consumers, before the
    ping-pong). Up to SHORT_KV, 2 K/V stages and O in 16-byte stores (short-128 1.03 -> 0.94 ms, self-full-512 1.67
    -> 1.45, d64-uniform-512 0.91 -> 0.81; the long forms' came later: FwdConfig.store_in_warps), else 3 stages
    (+3-12% over 2). The long forms, D=64's too, take two consumers in ping-pong where they took two CTAs of one
    consumer (128 x uniform up to 4,096 keys, D=64: softmax 4.107 -> 3.799 ms, gelu_tanh 4.505 -> 3.932;
    gdpa-self-d64's gelu_tanh 2.121 -> 2.059). The one-consumer short forms post their items (short-128 0.730 ->
    0.671, pma-32-d64 0.328 -> 0.322; the two-consumer and long forms even)."""
    if head_dim > 64 and mean_kv_len <= SHORT_TILE_KV:
        return FwdConfig(consumers=1, block_n=64, stages=2, store_in_warps=False, posted_items=True)
    if mean_kv_len <= SHORT_KV:
        consumers = 1 if head_dim <= 64 else 2
        return FwdConfig(consumers=consumers, stages=2, store_in_warps=False, posted_items=consumers == 1,
                         pingpong=consumers == 2, q_slots=2 if head_dim <= 64 else 1)
    # D=128's long form from a work queue, posting whole records (3 rounds, ms, dealt -> queued: hstu-silu 6.25 ->
    # 5.72, window-256 3.75 -> 3.52, causal-skewed-4k 1.55 -> 1.51, self-skewed-8k 2.60 -> 2.55, gqa-uniform-2k
    # even; posting the slot alone: even). D=64's is untimed. Two Q slots (the next item's Q and first K/V blocks
    # load while this item runs), whose shared memory D=128 takes from a third K/V stage (H100, 3 rounds: window-256
    # -2.5%, gqa-uniform-2k -2.7%, hstu-silu -2.4%, causal-skewed-4k -1.5%, self-skewed-8k and spike-32k even)
    return FwdConfig(consumers=2, pingpong=True, queue=head_dim > 64, posted_items=head_dim > 64,
                     weights_in_arms=True, q_slots=2, stages=2 if head_dim > 64 else 3)


@dataclass(frozen=True)
class DkdvConfig:
    block_m: int = 64  # query rows per (Q, dO) block
    # S^T, dV, dP^T, dK one after another (fewer live registers), else S^T and dP^T together; in the one pass
    # (dq != NONE) S^T waited for alone, then dV and dP^T together, else dP^T beside S^T (for_problem)
    serial: bool = False
    stages: int = 3  # (Q, dO) ring depth
    block_n: int = 2 * WG  # keys per item: one WG block per consumer
    dq: DqRoute = DqRoute.NONE
    dq_stages: int = 1  # DqRoute.REDUCE: float32 dQ chunks in flight per consumer
    kv_slots: int = 1  # K/V sets: 2 loads the next item's K/V while this item runs
    posted_items: bool = False  # each item posted beside its K/V, then an end mark (ItemOperands.post)
    # items taken from a work queue in the schedule's rank order (jfa.hopper.items.WorkList.take), not dealt to the
    # CTAs ahead, and posted (each item's slot, or with posted_items its record): the running items stay a window of
    # consecutive ranks, whose Q, dO and float32 dQ stay in L2 (hstu-silu's one pass, ncu: DRAM read 23.2 -> 8.7
    # GB, L2 hits 59 -> 83%, 16.5 -> 15.9 ms)
    queue: bool = False
    # the producer's L2 prefetch of K and V for the items that walk at most this many query rows (0: none compiled;
    # jfa.hopper.common.KvPrefetch; for_problem sets it for broadcast q)
    kv_prefetch_rows: int = 0

    @property
    def posts(self) -> bool:
        """The producer posts each item (jfa.hopper.buffers.ItemOperands.post): posted_items, or a work queue's."""
        return self.posted_items or self.queue

    @property
    def one_pass(self) -> bool:
        """The kernel computes dQ (some or all of it): P^T and dS^T through shared memory, LSE and Delta too."""
        return self.dq != DqRoute.NONE

    @property
    def dq_xor(self) -> bool:
        """DqRoute.REDUCE from 64-row blocks: the float32 dQ accumulator holds each row's 64-column chunks with their
        32-byte groups permuted by row (jfa.hopper.dq_reduce), which only jfa.hopper.dq_reduce.dq_from_acc reads."""
        return self.dq == DqRoute.REDUCE and self.block_m == WG

    @property
    def direct(self) -> bool:
        """DqRoute.DIRECT: dQ of the sequences whose keys fit one item, stored by the consumers."""
        return self.dq == DqRoute.DIRECT


def select_dkdv(head_dim: int, dq: DqRoute = DqRoute.NONE, mean_q_len: float = float("inf"),
                broadcast: bool = False) -> DkdvConfig:
    """mean_q_len: query rows per sequence (host-known; broadcast q: its Lq). Every item runs its query blocks as a
    masked head, a mask-free bulk and a masked tail (+3-8% over a test per block). D=128 without dQ: serial, which
    spills (340 B) and still beat 32-row blocks by 8-17%, but where sequences have at most SHORT_Q_DKDV query rows.
    Posted items wherever the K/V sets are two, and in the pass without dQ: ncu put 15-20% of targets-32's consumer
    stall samples on WorkList.item's dependent loads (targets-32 backward 1.638 -> 1.390 ms, short-128 2.139 -> 1.932,
    pma-64 2.340 -> 2.123); the 64-row one pass at D=128 posts no records (they spilled 2,048 B). The one
    pass at D=128 takes 32-row blocks and two K/V sets up to SHORT_Q query rows, or broadcast q's SHORT_Q_DKDV
    (dq_route); its 64-row form takes its items from a work queue (DkdvConfig.queue: whole backward, 3 rounds, ms,
    dealt -> queued: window-256 11.51 -> 10.34, gqa-uniform-2k 19.38 -> 17.96, hstu-targets 20.61 -> 19.48,
    hstu-silu 19.60 -> 18.78, causal-skewed-4k 4.54 -> 4.33, self-skewed-8k and gdpa-self even)."""
    if dq == DqRoute.REDUCE and head_dim > 64 and mean_q_len <= (SHORT_Q_DKDV if broadcast else SHORT_Q):
        return DkdvConfig(block_m=32, dq=dq, serial=True, stages=2, dq_stages=1, kv_slots=KV_SLOTS,
                          posted_items=True)
    if dq == DqRoute.DIRECT and head_dim > 64:
        return DkdvConfig(block_m=32, dq=dq, serial=True, stages=DIRECT_STAGES, dq_stages=1, kv_slots=KV_SLOTS,
                          posted_items=True)
    if dq != DqRoute.NONE:  # shared memory at D=128: K, V 64 KB + (Q, dO) ring 2 x 32 KB + dS 32 KB + dQ chunks 2 x
        # 16 KB + the dK/dV stores' 16 KB layout conversion (3 ring stages: within 1%)
        return DkdvConfig(dq=dq, serial=head_dim <= 64, stages=3 if head_dim <= 64 else 2,
                          dq_stages=2 if head_dim <= 64 else 1, kv_slots=KV_SLOTS if head_dim <= 64 else 1,
                          posted_items=head_dim <= 64, queue=head_dim > 64)
    if head_dim > 64 and mean_q_len <= SHORT_Q_DKDV:
        return DkdvConfig(block_m=32, serial=True, stages=2, kv_slots=KV_SLOTS, posted_items=True)
    return DkdvConfig(serial=head_dim > 64, kv_slots=KV_SLOTS if head_dim <= 64 else 1, posted_items=True)


def dq_route(broadcast: bool, mean_kv_len: float = float("inf"), deterministic: bool = False) -> DqRoute:
    """REDUCE (not deterministic: float32 adds in any order) except batches of at most 128 mean keys per sequence,
    where the float32 dQ's zero fill and cast are not paid back (short-128 3.48 vs 3.39 ms; at 256-1,034 keys one pass
    won by 5-18%): there (not broadcast, and also when deterministic) DIRECT, whose dQ pass skips the sequences the
    dK/dV pass covered (short-128 3.37 -> 2.78 ms). Broadcast q takes the one pass at every Lq since its dQ went into
    one float32 slab of Lq rows (jfa.hopper.dq_reduce._drain_block; with a slab a CTA, pma-256's one pass had lost:
    6.51 vs 5.81 ms two passes)."""
    short = mean_kv_len <= 128
    if short and not broadcast:
        return DqRoute.DIRECT
    if deterministic or short:
        return DqRoute.NONE
    return DqRoute.REDUCE


@dataclass(frozen=True)
class DqConfig:
    block_n: int  # keys per K/V block (S and dP are [64, block_n] float32 each in registers)
    stages: int = 3
    block_m: int = 2 * WG  # query rows per item: two consumers


def select_dq(head_dim: int) -> DqConfig:
    return DqConfig(block_n=128 if head_dim <= 64 else 64)


@dataclass(frozen=True)
class BwdPlan:
    """The backward's kernels: dK/dV (with dQ by dkdv.dq), then the dQ pass unless dq is None, skipping the
    sequences of at most skip_kv keys (whose dQ the dK/dV pass stored: DqRoute.DIRECT)."""
    dkdv: DkdvConfig
    dq: DqConfig | None
    skip_kv: int = 0


def select_bwd(p: Problem) -> BwdPlan:
    """The backward's plan for this problem. DIRECT's dQ pass is left out when the caller's max_kv_len says no
    sequence has more keys than the dK/dV pass's key tile (walking every item to skip it took 0.2-0.3 ms on
    short-128)."""
    batch = max(p.batch, 1)
    route = dq_route(p.broadcast, p.k.shape[0] / batch, p.deterministic)
    dkdv = for_problem(select_dkdv(p.head_dim, route, p.rows / batch, p.broadcast), p)
    if route == DqRoute.REDUCE:
        return BwdPlan(dkdv, None)
    skip_kv = dkdv.block_n if route == DqRoute.DIRECT else 0
    direct_only = route == DqRoute.DIRECT and p.max_kv_len is not None and p.max_kv_len <= skip_kv
    return BwdPlan(dkdv, None if direct_only else select_dq(p.head_dim), skip_kv)


def _mixed(p: Problem) -> bool:
    """A mixed batch (fwd_classes): the mean key length within SHORT_TILE_KV (where the short forms are farthest
    from the long ones), the caller's max_kv_len past SHORT_KV. (Means up to SHORT_KV with longer sequences, as
    self-uniform-1k, gdpa-self and pma-256 are, keep one form until the split is timed there.)"""
    return p.max_kv_len is not None and p.max_kv_len > SHORT_KV and p.k.shape[0] / max(p.batch, 1) <= SHORT_TILE_KV


def bwd_classes(p: Problem) -> list:
    """[(plan, kv_range)]: the backward's kernels by key-length class, as fwd_classes: one plan (select_bwd's), or
    for a mixed batch (not broadcast) the mean's plan over the sequences of at most SHORT_KV keys and the long
    plan (the one pass, or two passes where deterministic) over the rest."""
    plan = select_bwd(p)
    if not _mixed(p) or p.broadcast:
        return [(plan, (0, UNBOUNDED))]
    route = dq_route(False, float("inf"), p.deterministic)
    dkdv = for_problem(select_dkdv(p.head_dim, route), p)
    long = BwdPlan(dkdv, None) if route == DqRoute.REDUCE else BwdPlan(dkdv, select_dq(p.head_dim))
    return [(plan, (0, SHORT_KV + 1)), (long, (SHORT_KV + 1, UNBOUNDED))]


def fwd_config(p: Problem) -> FwdConfig:
    """select_fwd's for the problem's shape; an activation past SHORT_TILE_KV takes the long form (3 K/V stages):
    the short form's 2 stages were chosen on softmax, whose weights phase is shorter (gdpa-self: gelu_tanh's
    forward 0.86x softmax's in the short form)."""
    mean = p.k.shape[0] / max(p.batch, 1)
    if not p.softmax and mean > SHORT_TILE_KV:
        mean = float("inf")
    return for_problem(select_fwd(p.head_dim, mean), p)


def fwd_classes(p: Problem) -> list:
    """[(config, kv_range)]: the forward's launches by key-length class. One, fwd_config's for the whole batch; or
    where the batch's mean key length is short but the caller's max_kv_len lets a sequence pass SHORT_KV (a mixed
    batch, _mixed: a long history among short ones, whose pairs are nearly all the long one's), two: the mean's form
    over the sequences of at most SHORT_KV keys and the long form over the rest, split on the device by their
    schedules (ScheduleSpec.kv_range: no host sync). Where max_kv_len is a loose bound and no sequence is long, the
    second launch finds no items."""
    cfg = fwd_config(p)
    if _mixed(p):
        return [(cfg, (0, SHORT_KV + 1)), (for_problem(select_fwd(p.head_dim), p), (SHORT_KV + 1, UNBOUNDED))]
    return [(cfg, (0, UNBOUNDED))]


# score functions whose D=128 one pass issues dP^T beside S^T (DkdvConfig.serial False), dV under dS^T: compiled for
# sm_90, spills softmax 468 -> 428 B, silu 420 -> 380, relu and relu2 420 -> 360, identity 428 -> 348; not gelu_tanh
# (556 -> 1,000), gelu (512 -> 1,596), sigmoid (spill reloads in a block loop) or silu under HSTU's mask (648 -> 952)
TOGETHER = ("softmax", "silu", "relu", "relu2", "identity")


def for_problem(cfg, p: Problem):
    """A config chosen by shape (FwdConfig, DkdvConfig), as this problem runs it: with HSTU's mask, a dK/dV form posts
    no records (those forms were timed without the mask; a record carries the mask's fields, ItemOperands.post; the
    forward posts them with the mask as without); a one pass with dP^T beside S^T only for the TOGETHER score
    functions without HSTU's mask (else serial); broadcast q's dK/dV forms of one K/V set prefetch K and V into L2."""
    if p.targets and cfg.posted_items and isinstance(cfg, DkdvConfig):
        cfg = dataclasses.replace(cfg, posted_items=False)
    if isinstance(cfg, DkdvConfig) and cfg.one_pass and not cfg.serial and (p.targets or p.activation not in TOGETHER):
        cfg = dataclasses.replace(cfg, serial=True)
    if isinstance(cfg, DkdvConfig) and p.broadcast and cfg.kv_slots == 1:
        cfg = dataclasses.replace(cfg, kv_prefetch_rows=KV_PREFETCH_ROWS)  # (where and why: KV_PREFETCH_ROWS)
    return cfg


def query_tile_schedule(p: Problem, rows: int, block_m: int, ctas: int,
                        kv_range: tuple = (0, UNBOUNDED)) -> ScheduleSpec:
    """The forward's and the dQ pass's items: query tiles of block_m rows x heads, costed in key blocks of
    SCHEDULE_BLOCK_N whatever the kernel's block (the cost only balances the CTAs), so at D=128 the dQ pass
    runs on the forward's schedule: one build per batch for both. kv_range: a length class's (fwd_classes)."""
    return ScheduleSpec(rows, p.heads, block_m, SCHEDULE_BLOCK_N, ctas, p.mask_scalars(), p.targets,
                        last_rows=p.last_rows, kv_range=kv_range)


def key_tile_schedule(p: Problem, cfg: DkdvConfig, ctas: int, kv_range: tuple = (0, UNBOUNDED)) -> ScheduleSpec:
    """The dK/dV pass's items: key tiles x kv heads, costed by the query blocks that see them (jfa.geometry's walk
    of key tiles). kv_range: a length class's (bwd_classes)."""
    return ScheduleSpec(p.k.shape[0], p.heads_kv, cfg.block_n, cfg.block_m, ctas, p.mask_scalars(), p.targets,
                        key_tiles=True, last_rows=p.last_rows, kv_range=kv_range)
