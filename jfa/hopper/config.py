"""The Hopper kernels' configurations, chosen by shape: one frozen dataclass and one ``select_*`` per kernel.
Each choice cites the H200 measurement behind it (docs/perf-notes.md); what lost is in the notes and in git
history, not here."""
from __future__ import annotations

from dataclasses import dataclass

from ..schedule import ScheduleSpec

WG = 64  # rows of one consumer warpgroup's tile (a wgmma m64 instruction)
SCHEDULE_BLOCK_N = 128  # the forward's and the dQ pass's items are costed in key blocks of this many rows


@dataclass(frozen=True)
class FwdConfig:
    consumers: int  # consumer warpgroups per CTA, WG query rows each
    block_n: int = 128  # keys per K/V block
    stages: int = 3  # K/V ring depth (the ring and Q fit in the 227 KB of shared memory at D=128)
    coalesced_store: bool = False  # O in 16-byte pieces through a shared-memory layout conversion (fwd._store)
    posted_items: bool = False  # the producer posts each item beside its Q, then an end mark (ItemOperands.post)

    @property
    def block_m(self) -> int:
        return self.consumers * WG

    @property
    def ctas_per_sm(self) -> int:
        """One CTA of two consumers per SM, or two of one consumer each."""
        return 3 - self.consumers

    def launch_options(self) -> dict:
        """Two CTAs per SM need each to launch with at most half the register file (256 threads x 128)."""
        return {"maxnreg": 128} if self.ctas_per_sm == 2 else {}


def select_fwd(head_dim: int, mean_kv_len: float = float("inf")) -> FwdConfig:
    """D=64: 64-row tiles at two CTAs per SM (d64-uniform-512: 149 vs 139 TF/s with two consumers, session
    3). D=128: 128-row tiles whose two warpgroups share each K/V block. Both by the batch's mean key length (keys /
    sequences, known on the host without a sync): up to SHORT_KV, 2 K/V stages and O stored in 16-byte pieces
    through the shared memory the third stage would take (short-128 1.03 -> 0.94 ms, self-full-512 1.67 -> 1.45,
    session 8; D=64: d64-uniform-512 0.91-0.93 -> 0.81-0.86, pma-32-d64 0.342 -> 0.335, session 9), else 3
    stages (+3-12% over 2, session 3; self-skewed-8k 2.62 vs 2.70-2.85 with the short form, targets-32 0.61 vs
    0.63, pma-64 0.570 vs 0.580). Tried and lost: ping-pong of the two consumers (+-3%), prefetching the next item's
    bookkeeping (+-3%), pairs of heads per tile for short query blocks (+4% on pma-64 only) (sessions 3-4), O's
    rescale moved behind the next S as FlashAttention-3 does (-2% to +2%, session 8), a second Q buffer for the next
    item (no effect), each short block's K/V as two 64-row boxes, the second only where it holds keys (short-128
    -3.5%) (session 9). The one-consumer short forms take posted items (the note after select_dkdv): short-128
    0.730 / 0.735 -> 0.671 / 0.685 ms, pma-32-d64 0.328 / 0.328 -> 0.322 / 0.324; the two-consumer and long forms
    even (session 14)."""
    if head_dim > 64 and mean_kv_len <= SHORT_TILE_KV:  # see SHORT_TILE_KV
        return FwdConfig(consumers=1, block_n=64, stages=2, coalesced_store=True, posted_items=True)
    consumers = 1 if head_dim <= 64 else 2
    if mean_kv_len <= SHORT_KV:
        return FwdConfig(consumers=consumers, stages=2, coalesced_store=True, posted_items=consumers == 1)
    return FwdConfig(consumers=consumers)


# mean keys per sequence: the short form won at 63-513 (8-13%), was mixed at 1,030-1,070 (gqa-uniform-2k -2%,
# causal-skewed-4k even, targets-32 +3%) and lost above (docs/perf-notes.md, session 8)
SHORT_KV = 768
# up to this mean key length D=128 takes 64-row tiles and 64-key blocks at two CTAs per SM (0 spills at 128
# registers, 90 KB of shared memory): two items in flight per SM, since the short forward waits on per-item latency,
# not bytes (ncu, session 9). short-128 forward 0.913 / 0.923 -> 0.768 / 0.759 ms (main / this, one call, session 10)
SHORT_TILE_KV = 128


# How the dK/dV kernel treats dQ (DkdvConfig.dq; jfa.hopper.bwd):
DQ_NONE = 0  # not at all: the dQ pass computes it
DQ_REDUCE = 1  # the one pass: dQ too, by TMA reduce-add into float32 from a writer warp (jfa.hopper.dq_reduce)
DQ_DIRECT = 2  # for sequences whose keys fit one key tile (their dQ is complete there), stored in q's dtype; the
# dQ pass skips those sequences and computes the rest


@dataclass(frozen=True)
class DkdvConfig:
    block_m: int = 64  # query rows per (Q, dO) block
    serial: bool = False  # S^T, dV, dP^T, dK one after another (fewer live registers), else S^T and dP^T together
    stages: int = 3  # (Q, dO) ring depth
    block_n: int = 2 * WG  # keys per item: one WG block per consumer
    dq: int = DQ_NONE  # DQ_NONE, DQ_REDUCE or DQ_DIRECT
    dq_stages: int = 1  # DQ_REDUCE: float32 dQ chunks in flight per consumer
    kv_slots: int = 1  # K/V sets: 2 loads the next item's K/V while this item runs
    posted_items: bool = False  # each item posted beside its K/V, then an end mark (the note after select_dkdv)

    @property
    def one_pass(self) -> bool:
        """The kernel computes dQ (some or all of it): P^T and dS^T through shared memory, LSE and Delta too."""
        return self.dq != DQ_NONE


def select_dkdv(head_dim: int, dq: int = DQ_NONE, mean_q_len: float = float("inf")) -> DkdvConfig:
    """dq: how the kernel treats dQ (where: dq_route); mean_q_len: query rows per sequence (host-known).
    Every item runs its query blocks as a masked head, a mask-free bulk and a masked tail (+3-8% over a
    test per block, session 5). D=128: serial, which spills (400 B now) and still beat 32-row blocks by 8-17%
    (session 5). Tried and lost: dQ fused by float32 atomics (0.71-0.95x), K/V double-buffered across items at
    D=128 with 64-row blocks (0.98-1.01x) (session 5; at D=64 it wins: KV_SLOTS, and at D=128 beside 32-row
    blocks: SHORT_Q, DIRECT_STAGES)."""
    if dq == DQ_REDUCE and head_dim > 64 and mean_q_len <= SHORT_Q:  # see SHORT_Q
        return DkdvConfig(block_m=32, dq=dq, stages=2, dq_stages=1, kv_slots=KV_SLOTS, posted_items=True)
    if dq == DQ_DIRECT and head_dim > 64:  # see DIRECT_STAGES
        return DkdvConfig(block_m=32, dq=dq, stages=DIRECT_STAGES, dq_stages=1, kv_slots=KV_SLOTS,
                          posted_items=True)
    if dq != DQ_NONE:  # shared memory at D=128: K, V 64 KB + (Q, dO) ring 2 x 32 KB + dS 32 KB + dQ chunks 2 x 16
        # KB + the dK/dV stores' 16 KB layout conversion (3 ring stages: within 1%, session 7)
        return DkdvConfig(dq=dq, stages=3 if head_dim <= 64 else 2, dq_stages=2 if head_dim <= 64 else 1,
                          kv_slots=KV_SLOTS if head_dim <= 64 else 1, posted_items=head_dim <= 64)
    return DkdvConfig(serial=head_dim > 64, kv_slots=KV_SLOTS if head_dim <= 64 else 1, posted_items=True)


# K/V sets of the dK/dV kernel at D=64: two, so the next item's K/V load while this one runs (short items wait on
# that latency: pma-32-d64's see one (Q, dO) block each). pma-32-d64 backward 1.466 / 1.459 -> 1.110 / 1.113 ms,
# d64-uniform-512 2.252 / 2.266 -> 2.190 / 2.190, pma-64 (D=128: one set) even (main / this, one call, session 11).
# D=128 has no room (a set is 64 KB there; the one pass takes 181 KB with one)
KV_SLOTS = 2
# up to this many query rows per sequence (targets-32: 32 target queries per user) the one pass at D=128 takes
# (Q, dO) blocks of 32 rows (its 64-row blocks were half empty), dQ computed transposed (K^T dS^T: wgmma's M is then
# the head dim, not the 32 rows), and the room this frees (ring, dS and dQ staging at half size) holds a second K/V
# set, so the next item's K/V load while this one runs (209 KiB, 124 B of spills against the 64-row one pass's 804).
# targets-32 one pass 2.197 / 2.187 -> 1.566 / 1.563 ms, backward 2.253 / 2.254 -> 1.629 / 1.627 (main / this, one
# call, session 12). Tried with it and lost (same call as the direct route's below): 3 ring stages 1.678 / 1.679 ms,
# two float32 dQ chunks in flight 1.751 / 1.748, against 1.641 / 1.644
SHORT_Q = 32
# The direct route at D=128 (short sequences, every one a single item) takes the same 32-row blocks with transposed
# dQ and two K/V sets, with this many ring stages (209 KiB, 304 B of spills; the 64-row form: 181 KB, 1004 B):
# short-128 backward 2.579 / 2.567 -> 2.312 / 2.315 ms with 2 stages, 2.294 / 2.300 with 3 (dK/dV with dQ 2.176 ->
# 1.90 / 1.88) (main / these, one call, session 12)
DIRECT_STAGES = 3
# DkdvConfig.posted_items, where the K/V sets are two (D=64, and the 32-row forms at D=128): the producer writes each
# item's bookkeeping beside its K/V (ItemOperands.post) and an end mark after the last (close), so the consumers
# never read the schedule: ncu put 15-20% of targets-32's consumer stall samples on WorkList.item's three dependent
# loads per item and on the slot counter's spill reload before the next. Backward, main -> posted -> with the end
# mark (one call each, session 13): short-128 2.139 / 2.141 -> 2.056 / 2.057 -> 1.932 / 1.937 ms, targets-32
# 1.638 / 1.653 -> 1.527 / 1.524 -> 1.391 / 1.390, pma-32-d64 1.126 / 1.129 -> 1.055 / 1.050 -> 1.025 / 1.022.
# The 64-row one pass at D=128 (one set) keeps the schedule: posting there compiled to 2,048 B of spills (804).
# The pass without dQ posts too (D=128 spills 396 -> 340 B): pma-64 backward 2.340 / 2.356 -> 2.123 / 2.116 ms,
# pma-256 even (5.768 / 5.768 -> 5.767 / 5.763) (main / this, one call, session 14)


def dq_route(head_dim: int, broadcast: bool, mean_kv_len: float = float("inf"), deterministic: bool = False) -> int:
    """How the backward computes dQ (the dK/dV kernel's DkdvConfig.dq; the dQ pass runs unless DQ_REDUCE).
    DQ_REDUCE, the one pass (not deterministic: float32 adds in any order), except broadcast q at D=128, where it
    reduce-adds Lq x D float32 into dQ per key tile (pma-256: 6.51 vs 5.81 ms, pma-64: 2.43 vs 2.37 ms); everywhere
    else one pass measured 0.96-1.18x (session 7, docs/perf-notes.md). Batches of at most 128 keys per sequence
    take two passes, where the float32 dQ's zero fill and cast are not paid back (short-128, whole backward, one
    pass / two passes: 3.50 / 3.37 ms (session 7), 3.480 / 3.386 and 3.485 / 3.404 (session 8); main / this
    default in one call: 3.492 / 3.388 and 3.470 / 3.389 (session 9); at 256-1,034 keys one pass won by 5-18%).
    There, and for deterministic batches as short, the dK/dV kernel stores the dQ of the sequences whose keys fit
    its key tile (DQ_DIRECT: no float32, no adds) and the dQ pass skips them: short-128, whole backward 3.366 /
    3.389 -> 2.780 / 2.781 ms (dK/dV 1.83 -> 2.19, dQ pass 1.13 -> 0.175; main / this, one call, session 10)."""
    short = mean_kv_len <= 128
    if short and not broadcast:
        return DQ_DIRECT
    if deterministic or short or (broadcast and head_dim > 64):
        return DQ_NONE
    return DQ_REDUCE


@dataclass(frozen=True)
class DqConfig:
    block_n: int  # keys per K/V block (S and dP are [64, block_n] float32 each in registers)
    stages: int = 3
    block_m: int = 2 * WG  # query rows per item: two consumers


def select_dq(head_dim: int) -> DqConfig:
    return DqConfig(block_n=128 if head_dim <= 64 else 64)


def query_tile_schedule(rows: int, heads: int, block_m: int, left: int, right: int, ctas: int) -> ScheduleSpec:
    """The forward's and the dQ pass's items: query tiles of block_m rows x heads, costed in key blocks of
    SCHEDULE_BLOCK_N whatever the kernel's block (the cost only balances the CTAs), so at D=128 the dQ pass
    runs on the forward's schedule: one build per batch for both."""
    return ScheduleSpec(rows, heads, block_m, SCHEDULE_BLOCK_N, left, right, ctas)


def key_tile_schedule(kv_rows: int, heads_kv: int, cfg: DkdvConfig, left: int, right: int, ctas: int):
    """The dK/dV pass's items: key tiles x kv heads, costed by the query blocks that see them (the schedule of
    the transposed problem: sides swapped, window mirrored; jfa.geometry)."""
    return ScheduleSpec(kv_rows, heads_kv, cfg.block_n, cfg.block_m, right, left, ctas)
