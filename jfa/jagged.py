"""Jagged bookkeeping, written once: offsets, lengths, the visibility rule, tile tables, pair counts.

A jagged batch packs B sequences back to back along the first dimension of a tensor; ``offsets`` (``[B+1]``,
int32 or int64, ``offsets[0] == 0``, non-decreasing, ``offsets[B] == rows``) marks where each one starts.

Visibility (the spec every backend follows). In a sequence with ``Lq`` queries and ``Lk`` keys, key ``j`` is
visible to query ``i`` when ``i' - left <= j <= i' + right`` with ``i' = i + (Lk - Lq)`` (bottom-right
alignment, as FlashAttention 2.1+), a bound of ``-1`` meaning unbounded. ``causal`` is ``right = 0``.
"""
from __future__ import annotations

import torch

# An unbounded side of the window, as every layer below the public functions takes it: a bound larger than any
# length, so that the kernels' range arithmetic needs no branch.
UNBOUNDED = 1 << 30


def causal_window(causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    """The user's window (-1 = unbounded) combined with the causal flag, in the user's form: causal caps right
    at 0."""
    left, right = int(window[0]), int(window[1])
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def resolve_window(causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    """The user's window and causal flag -> (left, right), the one form the op, the backends, the schedules and
    the kernels take: causal_window with an unbounded side as UNBOUNDED.

    Converted once, in the public functions; the functions of this module accept both forms."""
    left, right = causal_window(causal, window)
    return (UNBOUNDED if left < 0 else left), (UNBOUNDED if right < 0 else right)


def lengths(offsets: torch.Tensor) -> torch.Tensor:
    return offsets[1:] - offsets[:-1]


def pair_mask(i, j, q_len, kv_len, left: int, right: int) -> torch.Tensor:
    """The visibility rule on broadcastable tensors: whether key j of a sequence with kv_len keys is visible to its
    query i of q_len (lengths: ints, or tensors broadcast with i and j, e.g. [B, 1, 1] for a padded batch); a
    bound of -1 (or UNBOUNDED) is no bound. Rows and keys past the lengths are not visible."""
    i_shifted = i + (kv_len - q_len)
    mask = (i < q_len) & (j < kv_len)
    if 0 <= left < UNBOUNDED:
        mask = mask & (j >= i_shifted - left)
    if 0 <= right < UNBOUNDED:
        mask = mask & (j <= i_shifted + right)
    return mask


def target_mask(i, j, n, num_targets, contextual_len: int, window: int, min_full_attn_len: int = 0) -> torch.Tensor:
    """HSTU's mask (generative recommenders: targets, a contextual prefix, a window over positions), on
    broadcastable tensors of positions i (queries) and j (keys), for a sequence of n rows (causal) whose last
    num_targets rows are targets:

        p(x) = x if c == 0, else max(x - c + 1, 0);  U = n - T if c == 0, else n - T - c + 1;  p(x) = min(p(x), U)
        visible = (i == j) or (p(i) - p(j) > 0)
        with a window W >= 0:  visible = visible and (i == j or p(i) - p(j) <= W or p(i) >= U - F)
        with c > 0:            visible = visible or (p(i) == 0 and p(j) < U)

    (c = contextual_len, T = num_targets, W = window: -1 or UNBOUNDED for none, F = min_full_attn_len: the rows
    from position U - F on, the history's last F rows and the targets, see the whole history past the window, as
    HSTU's min_full_attn_seq_len). Targets see the history and
    themselves, never each other; history never sees targets. With T = 0 and c = 0 this is the causal window.
    In cross-attention the queries are the sequence's last rows (visible_mask), as HSTU serves: a cached history's
    keys and values, and the new rows' queries (its cached attention takes the full mask's last rows)."""
    c1 = max(contextual_len - 1, 0)
    u = torch.as_tensor(n - num_targets - c1)
    pi = torch.minimum(torch.clamp(i - c1, min=0), u)
    pj = torch.minimum(torch.clamp(j - c1, min=0), u)
    d = pi - pj
    step = d > 0
    if 0 <= window < UNBOUNDED:
        near = d <= window
        if min_full_attn_len > 0:
            near = near | (pi >= u - min_full_attn_len)
        step = step & near
    vis = (i == j) | step
    if contextual_len > 0:
        vis = vis | ((pi == 0) & (pj < u))
    return vis & (i < n) & (j < n)


def visible_mask(q_len: int, kv_len: int, left: int, right: int, device=None, targets=None) -> torch.Tensor:
    """Boolean ``[q_len, kv_len]``: which keys each query of one sequence sees; targets = (num_targets,
    contextual_len[, min_full_attn_len]) for HSTU's mask (target_mask: left is its window, the sequence's rows are
    its kv_len keys and the queries its last q_len rows, q_len <= kv_len; targets count the sequence's rows)."""
    i = torch.arange(q_len, device=device).unsqueeze(1)
    j = torch.arange(kv_len, device=device).unsqueeze(0)
    if targets is not None:
        if q_len > kv_len:
            raise ValueError(f"HSTU's mask takes a sequence's last rows as queries: {q_len} queries, {kv_len} keys")
        return target_mask(i + (kv_len - q_len), j, kv_len, targets[0], targets[1], left, *targets[2:])
    return pair_mask(i, j, q_len, kv_len, left, right)


def visible_counts_per_row(q_lens: torch.Tensor, kv_lens: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """Number of visible keys of every query row, in packed order (int64 ``[sum(q_lens)]``)."""
    q_lens = q_lens.long().cpu()
    kv_lens = kv_lens.long().cpu()
    total = int(q_lens.sum())
    seq = torch.repeat_interleave(torch.arange(q_lens.numel()), q_lens, output_size=total)
    starts = torch.cumsum(q_lens, 0) - q_lens
    i = torch.arange(total) - starts[seq]
    lk = kv_lens[seq]
    ishift = i + lk - q_lens[seq]
    lo = torch.clamp(ishift - left, min=0) if left >= 0 else torch.zeros_like(ishift)
    hi = torch.minimum(ishift + right, lk - 1) if right >= 0 else lk - 1
    return torch.clamp(hi - lo + 1, min=0)


def visible_pairs(q_lens, kv_lens, left: int = -1, right: int = -1, targets=None) -> int:
    """Exact number of visible (query, key) pairs of a batch: the FLOP count's unit (4*Hq*D per pair fwd);
    targets = (num_targets [B], contextual_len[, min_full_attn_len]) for HSTU's mask (per sequence, from
    target_mask: the queries are each sequence's last rows)."""
    q_lens = torch.as_tensor(q_lens)
    kv_lens = torch.as_tensor(kv_lens)
    if targets is not None:
        num_targets, c = torch.as_tensor(targets[0]).long().tolist(), targets[1]
        return sum(_target_pairs(n, t, c, left, lq, *targets[2:])
                   for lq, n, t in zip(q_lens.long().tolist(), kv_lens.long().tolist(), num_targets))
    return int(visible_counts_per_row(q_lens, kv_lens, left, right).sum())


def _target_pairs(n: int, t: int, c: int, window: int, q_len: int, full: int = 0) -> int:
    """Visible pairs of target_mask in one sequence of n rows whose last q_len rows are queries, counted row by row
    from the positions (the mask itself where the history has no position, U <= 0)."""
    c1 = max(c - 1, 0)
    u = n - t - c1
    if n == 0 or q_len == 0:
        return 0
    if u <= 0:
        return int(visible_mask(q_len, n, window, 0, targets=(t, c, full)).sum())
    w = window if 0 <= window < UNBOUNDED else n
    i = torch.arange(n)
    pi = torch.clamp(torch.clamp(i - c1, min=0), max=u)
    a, b = torch.clamp(pi - w, min=0), pi - 1  # the positions of the keys a row sees (besides itself)
    if full > 0 and 0 <= window < UNBOUNDED:  # (rows from U - full on: the whole history)
        a = torch.where(pi >= u - full, 0, a)

    def keys_at(lo, hi):  # keys whose position lies in [lo, hi]: c1 + 1 at 0, one at each of 1..u-1, t at u
        zero = ((lo <= 0) & (hi >= 0)).long() * (c1 + 1)
        middle = torch.clamp(torch.minimum(hi, torch.tensor(u - 1)) - torch.clamp(lo, min=1) + 1, min=0)
        return zero + middle + ((lo <= u) & (hi >= u)).long() * t
    counts = 1 + keys_at(a, b)
    if c > 0:  # the context rows (position 0) see every key of the history, themselves among them
        counts = torch.where(pi == 0, torch.tensor(n - t), counts)
    return int(counts[n - q_len:].sum())


def pool_rows(page_table: torch.Tensor, seq: torch.Tensor, j: torch.Tensor, page_size: int) -> torch.Tensor:
    """Paged k/v (serving): the rows of the page pool that hold key j of sequence seq (int64, broadcast):
    ``page_table[seq, j // page_size] * page_size + j % page_size``."""
    return page_table[seq, j // page_size].long() * page_size + j % page_size


def paged_rows(page_table: torch.Tensor, kv_offsets: torch.Tensor, page_size: int) -> torch.Tensor:
    """The pool rows (pool_rows) of a batch's keys in packed order (int64 [Tk]), so that ``k[rows]`` is the packed
    k of kv_offsets. (One host sync: the reference's and the tests' gather.)"""
    lens = lengths(kv_offsets.long())
    total = int(kv_offsets[-1]) if kv_offsets.numel() else 0
    seq = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens, output_size=total)
    j = torch.arange(total, device=lens.device) - kv_offsets.long()[:-1][seq]
    return pool_rows(page_table, seq, j, page_size)


def tile_capacity(rows: int, block: int, batch: int) -> int:
    """The most tiles of ``block`` rows that B sequences of ``rows`` rows in all can have: ``rows // block + B``
    (each sequence adds at most one partial tile), known from the shapes alone, so tile tables and schedules are
    sized with no host sync."""
    return rows // block + batch


def tile_table(offsets: torch.Tensor, block: int, rows: int) -> torch.Tensor:
    """Flat table of the real tiles of a jagged batch: int32 ``[2, tile_capacity]`` of (sequence, tile index).

    Sequence b of length L owns ``ceil(L / block)`` tiles. The table is built on the offsets' device with no host
    sync (it can be captured in a CUDA graph); unused entries have sequence -1 and their programs exit at once.
    """
    batch = offsets.numel() - 1
    capacity = tile_capacity(rows, block, batch)
    device = offsets.device
    if batch <= 0 or capacity == 0:
        return torch.full((2, capacity), -1, dtype=torch.int32, device=device)
    lens = lengths(offsets.long())
    tiles = (lens + block - 1) // block
    ends = torch.cumsum(tiles, 0)
    idx = torch.arange(capacity, device=device)
    seq = torch.searchsorted(ends, idx, right=True)
    valid = seq < batch
    seq_c = torch.clamp(seq, max=batch - 1)
    tile = idx - (ends - tiles)[seq_c]
    table = torch.stack([torch.where(valid, seq_c, -1), torch.where(valid, tile, 0)])
    return table.to(torch.int32)


def score_heads(num_heads: int, num_kv_heads: int, num_softmax_heads: int) -> list:
    """HSTU's num_softmax_heads: [(query heads, kv heads, score arguments)] in head order, the first
    num_softmax_heads query heads (a multiple of the GQA group) by softmax (its own normalisation, no out scale),
    the rest by the call's activation ({}: the call's own); a part without heads left out."""
    group = num_heads // num_kv_heads
    n = num_softmax_heads
    parts = [(n, n // group, dict(activation="softmax", out_scale=1.0)), (num_heads - n, num_kv_heads - n // group, {})]
    return [part for part in parts if part[0]]
