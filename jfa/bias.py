"""A relative attention bias from learned tables, inside the score: HSTU's position and time buckets.

For query row i of a sequence, at position a (bottom-right aligned: a = i + Lk - Lq) with time q_times[i], and key
j at position b with time k_times[j], the score becomes ``scale * q_i . k_j + bias(i, j)`` (then softmax or the
activation, with every mask), where

    bias = position[P - 1 + clamp(b - a, 1 - P, P - 1)]
         + time[clamp(floor(ln(float32(max(|q_times[i] - k_times[j]|, 1))) / time_divisor), 0, NB)]

``position`` has 2P - 1 entries and ``time`` NB + 1, each shared by the heads ([L]) or one row per query head
([Hq, L]), float32; either may be None. The tables are parameters: their gradients are the sums of dL/dscore over
the pairs that read each entry. HSTU's ``RelativeBucketedTimeAndPositionBasedBias`` is this with position = its
pos_w, time = its ts_w, k_times = the items' timestamps and q_times = the next item's (the last row repeating its
own): ``RelativeBias.hstu``.

Here: the user's object (RelativeBias), its checks and its fields of jfa.problem.Problem (tables), the spec as
dense per-sequence matrices (matrix, the reference's), and the kernels' helpers (block, add_grads): the kernels add
the bias to the raw scores q . k divided by the scale, so that every score function's own scaling applies to it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, localcontext
from typing import Optional

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class RelativeBias:
    """The tables and the times of a relative bias (see the module doc); pass it as ``rel_bias=`` to
    jfa.jagged_attention. k_times defaults to q_times (self-attention)."""
    position: Optional[torch.Tensor] = None  # [2P - 1] or [Hq, 2P - 1]
    time: Optional[torch.Tensor] = None  # [NB + 1] or [Hq, NB + 1]
    q_times: Optional[torch.Tensor] = None  # int64 [Tq]
    k_times: Optional[torch.Tensor] = None  # int64 [Tk]
    time_divisor: float = 0.301

    @staticmethod
    def hstu(pos_w, ts_w, timestamps, offsets, time_divisor: float = 0.301) -> "RelativeBias":
        """HSTU's bias for self-attention over packed sequences (timestamps int64 [T], offsets [B+1]): each row's
        query time is the next row's timestamp, the last row of a sequence its own."""
        rows = timestamps.shape[0]
        ends = offsets[1:].long()
        last = torch.zeros(rows + 1, dtype=torch.bool, device=timestamps.device)  # (no host sync: row T is a bin)
        last[torch.where(ends > offsets[:-1], ends - 1, rows)] = True
        nxt = torch.where(last[:rows], timestamps, torch.roll(timestamps, -1))
        return RelativeBias(pos_w, ts_w, nxt, timestamps, time_divisor)


@dataclass(frozen=True)
class Tables:
    """A RelativeBias as jfa.problem.Problem holds it: each table [Hq, L] (a shared one expanded, stride 0 along the
    heads, so its gradient sums over them), the times, the divisor."""
    position: Optional[torch.Tensor]
    time: Optional[torch.Tensor]
    q_times: Optional[torch.Tensor]
    k_times: Optional[torch.Tensor]
    time_divisor: float


def _table(name, t, heads, device):
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"rel_bias.{name} must be a tensor or None, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"rel_bias.{name} must be float32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"rel_bias.{name} must be on q's device ({device}), got {t.device}")
    if t.dim() == 1:
        t = t.unsqueeze(0).expand(heads, -1)
    if t.dim() != 2 or t.shape[0] != heads or t.shape[1] < 1:
        raise ValueError(f"rel_bias.{name} must be [L] or [Hq={heads}, L] with L >= 1, got {tuple(t.shape)}")
    return t


def _times(name, t, rows, device):
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.shape != (rows, ):
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"rel_bias.{name} must be an int64 tensor of {rows} values (one a row), got "
                         f"{got}{'' if not isinstance(t, torch.Tensor) else ' ' + str(t.dtype)}")
    if t.device != device:
        raise ValueError(f"rel_bias.{name} must be on q's device ({device}), got {t.device}")
    return t


def check(rel, q, k, broadcast: bool, self_attention: bool, scale: float) -> Optional[Tables]:
    """The Problem's tables of a user's rel_bias (None: no bias), or a clear error."""
    if rel is None:
        return None
    if not isinstance(rel, RelativeBias):
        raise TypeError(f"rel_bias must be a jfa.RelativeBias or None, got {type(rel).__name__}")
    if broadcast:
        raise ValueError("rel_bias is not supported with broadcast q (its rows have no positions in the sequences)")
    if scale == 0.0:
        raise ValueError("rel_bias needs a nonzero scale (the kernels add it to the scores divided by the scale)")
    heads, device = q.shape[1], q.device
    position = _table("position", rel.position, heads, device)
    time = _table("time", rel.time, heads, device)
    if position is not None and position.shape[1] % 2 == 0:
        raise ValueError(f"rel_bias.position must have an odd length 2P - 1, got {position.shape[1]}")
    q_times = k_times = None
    if time is not None:
        q_times = _times("q_times", rel.q_times, q.shape[0], device)
        k_times = rel.k_times if rel.k_times is not None else (q_times if self_attention else None)
        if k_times is None:
            raise ValueError("rel_bias.k_times is needed in cross-attention (it defaults to q_times in "
                             "self-attention only)")
        k_times = _times("k_times", k_times, k.shape[0], device)
        # (at least 1e-3: the kernels' log2, within 2^-22 relative, then stays within 1/64 of ln(dt) / divisor)
        if not (isinstance(rel.time_divisor, (int, float)) and math.isfinite(rel.time_divisor)
                and rel.time_divisor >= 1e-3):
            raise ValueError(f"rel_bias.time_divisor must be a finite number >= 0.001, got {rel.time_divisor!r}")
    if position is None and time is None:
        return None
    return Tables(position, time, q_times, k_times, float(rel.time_divisor))


# ---- the spec (the reference's): one sequence's bias as a dense matrix

def indices(lq: int, lk: int, q_times, k_times, length_pos: int, length_time: int, divisor: float, device):
    """(position entry [Lq, Lk] or None, time entry [Lq, Lk] or None) that each pair reads (int64)."""
    pos = tim = None
    if length_pos:
        p = (length_pos + 1) // 2
        a = torch.arange(lq, device=device).view(-1, 1) + (lk - lq)
        b = torch.arange(lk, device=device).view(1, -1)
        pos = (b - a).clamp(1 - p, p - 1) + (p - 1)
    if length_time:  # (the count of edges at or below the time difference rounded to float32: see time_edges)
        dt = (q_times.view(-1, 1) - k_times.view(1, -1)).abs().clamp(min=1).float().double()
        tim = torch.searchsorted(time_edges(length_time - 1, divisor, device).double(), dt.contiguous(), right=True)
    return pos, tim


@functools.lru_cache(maxsize=64)
def time_edges(buckets: int, divisor: float, device) -> torch.Tensor:
    """float32 [max(buckets, 1)]: entry b - 1 is the least integer float32 at or above exp(b * divisor), exactly
    (divisor as the double it is; infinite past float32's largest, and the one entry where buckets is 0), so that
    the time bucket of a difference dt is the number of edges at or below float32(dt): floor(ln(float32(dt)) /
    divisor) clamped to [0, buckets], exactly. The difference is taken in float32 as HSTU's module takes it; the
    logarithm is not: in floating point a bucket flips at its edges (the GPU's float32 log: ~2 pairs in a million
    on hstu-bias's times, moving out and the gradients past the bench's gate), so the spec and the kernels both
    bucket by these edges."""
    edges = []
    with localcontext() as ctx:
        ctx.prec = 60
        for b in range(1, buckets + 1):
            if Decimal(divisor) * b > 88:  # (past float32's largest)
                edges.append(math.inf)
                continue
            e = int((Decimal(divisor) * b).exp().to_integral_value(rounding=ROUND_CEILING))  # the least integer
            shift = max(e.bit_length() - 24, 0)  # (then the least float32 at or above it: 24 significant bits)
            edges.append(float(-(-e >> shift) << shift))
    return torch.tensor(edges or [math.inf], dtype=torch.float32, device=device)


def entries(t: Tables, q_rows: slice, k_rows: slice, lq: int, lk: int):
    """A sequence's (position entry, time entry) of each pair (indices' for its rows and times)."""
    lp = 0 if t.position is None else t.position.shape[1]
    lt = 0 if t.time is None else t.time.shape[1]
    qt = None if t.time is None else t.q_times[q_rows]
    kt = None if t.time is None else t.k_times[k_rows]
    return indices(lq, lk, qt, kt, lp, lt, t.time_divisor, (t.position if lp else t.time).device)


def matrix(t: Tables, q_rows: slice, k_rows: slice, lq: int, lk: int, dtype, at=None):
    """Sequence's bias [Hq, Lq, Lk] in dtype (differentiable in the tables), or None without tables; at: its
    entries, where the caller has them."""
    if t is None:
        return None
    pos, tim = entries(t, q_rows, k_rows, lq, lk) if at is None else at
    out = 0
    if pos is not None:
        out = out + t.position.to(dtype)[:, pos]
    if tim is not None:
        out = out + t.time.to(dtype)[:, tim]
    return out


# ---- the kernels' helpers

GRAD_COPIES = tl.constexpr(64)  # copies of each head's time gradient row (add_grads): a power of two


def grad_buffers(t: Tables, device):
    """The dQ pass's float32 buffers for the tables' gradients, zeroed: dposition [Hq, 2P - 1], and dtime as
    GRAD_COPIES copies of each head's row, [Hq, GRAD_COPIES, NB + 1] (grads sums them); None for an absent table.
    A batch's pairs fall in a few dozen time buckets: one row took every query's atomics on a few addresses, which
    L2 serializes (~1-2 G/s: the biased backward spent ~90% of its time there, docs/perf-notes.md)."""
    pos, tim = t.position, t.time
    return (None if pos is None else torch.zeros(pos.shape, dtype=torch.float32, device=device),
            None if tim is None else torch.zeros(tim.shape[0], GRAD_COPIES.value, tim.shape[1], dtype=torch.float32,
                                                 device=device))


def grads(buffers):
    """The tables' gradients (dposition, dtime), each [Hq, L] or None, from grad_buffers' after the dQ pass."""
    dpos, dtim = buffers
    return dpos, None if dtim is None else dtim.sum(1)


def group(t: Optional[Tables], scale: float, grads=None):
    """The kernels' bias group: None (no bias: the kernels compile as without one), or (position, its head stride,
    P, time, its head stride, NB, q_times, k_times, ln 2 / time_divisor, 1 / scale, dposition, dtime, the time edges,
    HAS_POSITION, HAS_TIME, HAS_GRADS); grads: grad_buffers'."""
    if t is None:
        return None
    pos, tim = t.position, t.time
    dpos, dtim = grads if grads is not None else (None, None)
    group = (pos, 0 if pos is None else pos.stride(0), 0 if pos is None else (pos.shape[1] + 1) // 2,
             tim, 0 if tim is None else tim.stride(0), 0 if tim is None else tim.shape[1] - 1,
             t.q_times, t.k_times, math.log(2) / t.time_divisor, 1.0 / scale, dpos, dtim,
             None if tim is None else time_edges(tim.shape[1] - 1, t.time_divisor, tim.device))
    # (a None inside a tuple fails to compile where the tuple is passed on: an absent entry is a constexpr 0, and
    # three constexpr flags say what is present: the position table, the time table, the gradients' buffers)
    flags = (pos is not None, tim is not None, grads is not None)
    return tuple(tl.constexpr(0) if x is None else x for x in group) + tuple(tl.constexpr(f) for f in flags)


_ROUND = tl.constexpr(12582912.0)  # 1.5 * 2**23: x + _ROUND holds rint(x) in its low mantissa bits (|x| < 2**22)


@triton.jit
def _log2(x, FAST: tl.constexpr):
    """log2 of float32s >= 1: MUFU.LG2 on the GPU (absolute error ~2^-22; .ftz spares the subnormal fix-up, four
    instructions; Triton's log2 is libdevice's, ~20), Triton's in the interpreter, which runs no PTX."""
    if FAST:
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return tl.log2(x)


@triton.jit
def _dt(qt, kt):
    """A pair's time difference as the bucket takes it, float32(max(|qt - kt|, 1)) (as max(|float32(qt - kt)|, 1):
    rounding to nearest is symmetric; no int64 compare)."""
    return tl.maximum(tl.abs((qt - kt).to(tl.float32)), 1.0)


@triton.jit
def _bucket(dt, bias, FAST: tl.constexpr):
    """The time bucket of differences dt (_dt), exactly time_edges' (int32)."""
    # x = log2(dt) ln2 / divisor is within ~1e-5 of ln(dt) / divisor (check bounds the divisor): floor(x) is right
    # except within 1/64 of an integer r in [1, NB], where the bucket is r or r - 1 as dt reaches edge r or not
    # (time_edges: exact); those pairs alone load it. rint and floor by _ROUND's bits: no conversion unit
    x = _log2(dt, FAST) * bias[8]
    y = x + _ROUND
    r = y - _ROUND
    ri = y.to(tl.int32, bitcast=True) - 0x4B400000
    near = (tl.abs(x - r) < 0.015625) & (ri >= 1) & (ri <= bias[5])
    edge = tl.load(bias[12] + (ri - 1), mask=near, other=0.0)
    te = ri - tl.where(near, dt < edge, x < r).to(tl.int32)
    return tl.minimum(tl.maximum(te, 0), bias[5])


@triton.jit
def _position(bias, pairs):
    """The position entry of a block's pairs (see block)."""
    P = bias[2]
    return tl.minimum(tl.maximum(pairs[1] - pairs[0], 1 - P), P - 1) + (P - 1)


@triton.constexpr_function
def _keys_axis(key_shape):
    """The keys' axis of a block of pairs, from the keys' operand's shape ([1, N], or [N, 1] transposed)."""
    return 1 if key_shape[0] == 1 else 0


@triton.jit
def _time_block(bias, pairs, KEYS: tl.constexpr, FAST: tl.constexpr):
    """(the queries' times, split, their first bucket, their cut), the vectors along the queries' axis, and whether
    every real query's pairs in the block lie in at most two buckets: its first, and the next from the cut (the next
    bucket's edge; inf for none) on. The block's keys span times [k_lo, k_hi]; a query before or after all of them
    sees differences from its nearest key's to its farthest's, and buckets grow with the difference: where the two
    ends' buckets are equal or adjacent, a pair's bucket is one compare of its difference with the cut. Far from the
    diagonal a block's keys are a sliver of a logarithmic bucket: the block takes two gathers a query and a compare
    a pair, not a logarithm, an edge test and a gather a pair. (The per-query work is done on vectors: a [M, 1]
    tensor in an MMA layout holds each row 8 times a thread; the keys' times are loaded here with their own cache
    hint, so that the per-pair path loads them again rather than keep 16 int64 columns live across the branch:
    they spilled inside the loop.)"""
    q_in = tl.max(pairs[4].to(tl.int32), axis=KEYS) != 0  # (reductions over a length-1 axis: the vectors)
    q1 = tl.load(bias[6] + tl.max(pairs[2], axis=KEYS), mask=q_in, other=0)
    k_in = tl.max(pairs[5].to(tl.int32), axis=1 - KEYS) != 0
    k1 = tl.load(bias[7] + tl.max(pairs[3], axis=1 - KEYS), mask=k_in, other=0, cache_modifier=".ca")
    k_lo = tl.min(tl.where(k_in, k1, 1 << 62), axis=0)  # (no key: the ends meet no query)
    k_hi = tl.max(tl.where(k_in, k1, -(1 << 62)), axis=0)
    after = q1 >= k_hi
    near = _bucket(_dt(q1, tl.where(after, k_hi, k_lo)), bias, FAST)
    far = _bucket(_dt(q1, tl.where(after, k_lo, k_hi)), bias, FAST)
    # (time_edges: bucket >= far exactly where float32(dt) >= its entry far - 1; every edge is at least 2)
    cut = tl.load(bias[12] + (far - 1), mask=far > near, other=float("inf"))
    ok = ((after | (q1 <= k_lo)) & (far - near <= 1)) | (q_in == 0)
    return q1, tl.min(ok.to(tl.int32), axis=0) == 1, near, cut


@triton.jit
def _key_times(bias, pairs):
    return tl.load(bias[7] + pairs[3], mask=pairs[5], other=0)


@triton.jit
def _past_cut(q1, kt, cut, KEYS: tl.constexpr):
    """Whether each pair's difference reaches its query's cut (float32(|dt|): max(., 1) is not needed, cuts >= 2)."""
    return tl.abs((tl.expand_dims(q1, KEYS) - kt).to(tl.float32)) >= tl.expand_dims(cut, KEYS)


@triton.jit
def _pair_buckets(bias, pairs, q1, KEYS: tl.constexpr, FAST: tl.constexpr):
    """Each pair's time bucket (the queries' times q1 from _time_block)."""
    return _bucket(_dt(tl.expand_dims(q1, KEYS), _key_times(bias, pairs)), bias, FAST)


@triton.jit
def block(bias, i_h, pairs, FAST: tl.constexpr):
    """The bias of a block of pairs over the scale (what the kernels add to the raw scores q . k). pairs = (a, b, qi,
    kj, q_in, k_in): the queries' positions in their sequence, packed rows and existence on the query side of the
    block's shape, the keys' on the key side (each broadcast to the block: [M, 1] and [1, N], or transposed). Pairs
    outside get a finite value (the entries are clamped into the tables): the kernels' masks hide them."""
    if bias[14]:
        KEYS: tl.constexpr = _keys_axis(pairs[3].shape)
        q1, split, first, cut = _time_block(bias, pairs, KEYS, FAST)
        table = bias[3] + i_h * bias[4]
        if split:  # two time entries a query, a compare a pair (see _time_block)
            x = tl.where(_past_cut(q1, _key_times(bias, pairs), cut, KEYS),
                         tl.expand_dims(tl.load(table + tl.minimum(first + 1, bias[5])), KEYS),
                         tl.expand_dims(tl.load(table + first), KEYS))
        else:
            x = tl.load(table + _pair_buckets(bias, pairs, q1, KEYS, FAST))
        if bias[13]:
            x += tl.load(bias[0] + i_h * bias[1] + _position(bias, pairs))
    else:
        x = tl.load(bias[0] + i_h * bias[1] + _position(bias, pairs))
    return x * bias[9]


@triton.constexpr_function
def _by_diagonals(keys_axis, M, N):
    """Whether add_grads sums a block's position gradient by diagonals (_add_diagonal_sums): queries on the rows,
    8-row and 8-column groups, tl.dot's dimensions (at least 16)."""
    return keys_axis == 1 and M % 8 == 0 and N % 8 == 0 and M * N >= 16 * 64


@triton.jit
def _add_diagonal_sums(dst, x, M: tl.constexpr, N: tl.constexpr):
    """dst[t] += the sum of x's diagonal j - i = t (x: [M, N] float32; t from 1 - M to N - 1): two small matmuls and
    one atomic per (8-row, 8-column) diagonal pair, ~(M / 8 + N / 8 - 1) x 15 of them, where a pair each took one
    (M N: 4,096 at 64 x 64, most on a few addresses). With i = 8a + b and j = 8c + e, j - i = 8 (c - a) + (e - b):
    first each 8 x 8 group's 15 diagonals (e - b), then the groups' diagonals (c - a), both as one-hot products."""
    A: tl.constexpr = M // 8
    C: tl.constexpr = N // 8
    G: tl.constexpr = triton.next_power_of_2(A + C - 1)  # (the groups' diagonals, padded for tl.dot)
    x = tl.reshape(tl.permute(tl.reshape(x, (A, 8, C, 8)), (0, 2, 1, 3)), (A * C, 64))  # [(a, c), (b, e)]
    be = tl.arange(0, 64)
    inner = (((be % 8) - (be // 8) + 7)[:, None] == tl.arange(0, 16)[None, :]).to(tl.float32)  # (b, e) -> e - b + 7
    r = tl.dot(x, inner, input_precision="ieee")  # [(a, c), 16]
    r = tl.reshape(tl.permute(tl.reshape(r, (A, C, 16)), (2, 0, 1)), (16, A * C))  # [e - b + 7, (a, c)]
    ac = tl.arange(0, A * C)
    outer = (((ac % C) - (ac // C) + A - 1)[:, None] == tl.arange(0, G)[None, :]).to(tl.float32)  # c - a + A - 1
    s = tl.dot(r, outer, input_precision="ieee")  # [e - b + 7, c - a + A - 1]
    t = tl.arange(0, 16)[:, None]
    g = tl.arange(0, G)[None, :]
    tl.atomic_add(dst + 8 * (g - (A - 1)) + (t - 7), s, mask=(t < 15) & (g < A + C - 1), sem="relaxed")


@triton.jit
def add_grads(bias, i_h, pairs, ds, FAST: tl.constexpr):
    """The tables' gradients += ds (dL/dscore of the block's pairs) at the entries each pair reads (float32 atomics
    into [Hq, L] buffers: the order of the sums varies run to run); a block whose queries each read at most two time
    entries (_time_block) sums each query's pairs first, and its position gradient by diagonals where it can."""
    in_pairs = pairs[4] & pairs[5]
    if bias[13] and bias[15]:
        dpos = bias[10] + i_h * (2 * bias[2] - 1)
        M: tl.constexpr = ds.shape[0]
        N: tl.constexpr = ds.shape[1]
        P = bias[2]
        diagonals: tl.constexpr = False  # (a compile-time False where the block's shape does not allow the sums)
        if _by_diagonals(_keys_axis(pairs[3].shape), M, N):
            a = tl.max(pairs[0], axis=1)  # (the queries' and keys' positions: consecutive, as every kernel's blocks)
            b = tl.max(pairs[1], axis=0)
            lo = tl.min(b, axis=0) - tl.max(a, axis=0)
            hi = tl.max(b, axis=0) - tl.min(a, axis=0)
            diagonals = (lo >= 1 - P) & (hi <= P - 1)  # no entry clamped: the diagonals are consecutive entries
            origin = tl.min(b, axis=0) - tl.min(a, axis=0) + P - 1  # (the entry of the block's own diagonal 0)
        if diagonals:
            _add_diagonal_sums(dpos + origin, tl.where(in_pairs, ds, 0.0), M, N)
        else:
            tl.atomic_add(dpos + _position(bias, pairs), ds, mask=in_pairs, sem="relaxed")
    if bias[14] and bias[15]:
        KEYS: tl.constexpr = _keys_axis(pairs[3].shape)
        # (block's _time_block again: its vectors kept from there across the dQ pass's MMAs spilled the D=64 pass)
        q1, split, first, cut = _time_block(bias, pairs, KEYS, FAST)
        # (into one of the head's GRAD_COPIES rows, grad_buffers': a query's by its row's low bits; a pair's by its
        # row's and key's low 3 bits, distinct across a warp's MMA fragment)
        width = bias[5] + 1  # (a row: NB + 1 entries)
        row = bias[11] + i_h * (GRAD_COPIES * width)
        if split:  # each query's pairs summed on either side of its cut: two atomics a query at most
            q_row = row + (tl.max(pairs[2], axis=KEYS) % GRAD_COPIES) * width
            past = _past_cut(q1, _key_times(bias, pairs), cut, KEYS)
            tl.atomic_add(q_row + first, tl.sum(tl.where(in_pairs & ~past, ds, 0.0), axis=KEYS), sem="relaxed")
            tl.atomic_add(q_row + tl.minimum(first + 1, bias[5]),
                          tl.sum(tl.where(in_pairs & past, ds, 0.0), axis=KEYS), mask=cut < float("inf"), sem="relaxed")
        else:
            copy = (pairs[2] % 8) * 8 + pairs[3] % 8
            tl.atomic_add(row + copy * width + _pair_buckets(bias, pairs, q1, KEYS, FAST), ds, mask=in_pairs,
                          sem="relaxed")
