"""HSTU's mask's geometry (jfa.jagged.target_mask; rule.KIND == TARGETS): which keys a query tile sees, which
queries a key tile is seen by, which blocks need no mask, and the mask's element test, for the rule's parameters
(W, RIGHT, c, num_targets, F) and a sequence's (Lq, Lk, T) as jfa.geometry's module doc describes them. Plain
``@triton.jit`` helpers that jfa.geometry's dispatchers call for this kind of mask, and that the Hopper forward calls
for its cheaper tests (context_keys, window_keys). It reads only the rule's fields, so it imports nothing of
jfa.geometry (which imports it).

Positions (position): the contextual prefix's rows [0, c) all sit at position 0, the history's rows after it at
their row - (c - 1), and every target at the history's end U. A row at position p sees the keys at positions p - W
to p - 1 and itself; a context row (position 0) also every key before position U, and with rule.FULL the rows from
position U - F on every earlier position.
"""
import triton
import triton.language as tl


@triton.jit
def rows(seq, rule):
    """HSTU's mask: (n, shift), the sequence's rows and query i's row in it, i + shift (see the module doc)."""
    if rule.LAST_ROWS:
        return seq[1], seq[1] - seq[0]
    else:
        return seq[0], 0


@triton.jit
def position(x, seq, rule):
    """HSTU's position of the sequence's rows x (jfa.jagged.target_mask; a query's row is i + shift), the history's
    end U (every target sits there), c - 1."""
    n, _ = rows(seq, rule)
    c1 = tl.maximum(rule.p[2] - 1, 0)
    u = n - seq[2] - c1
    return tl.minimum(tl.maximum(x - c1, 0), u), u, c1


@triton.jit
def visible(i, j, seq, rule):
    """The mask's element test: which pairs of query rows i and key rows j are visible (broadcastable)."""
    _, shift = rows(seq, rule)
    i = i + shift
    pi, u, c1 = position(i, seq, rule)
    pj, _, _ = position(j, seq, rule)
    d = pi - pj
    if rule.FULL:  # (rows from position U - F on: past the window's reach)
        vis = (i == j) | ((d > 0) & ((d <= rule.p[0]) | (pi >= u - rule.p[4])))
    else:
        vis = (i == j) | ((d > 0) & (d <= rule.p[0]))
    return vis | ((rule.p[2] > 0) & (pi == 0) & (pj < u))


@triton.jit
def key_range(m0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """HSTU's mask: keys [lo, hi) (lo aligned down to BLOCK_N) holding every key queries [m0, m0 + BLOCK_M) see:
    from the first row's window (a context row's: 0) to the last row's diagonal (with context rows: the history's
    end). (Rows as the sequence's from here: m0 and m_last shifted.)"""
    n, shift = rows(seq, rule)
    c = rule.p[2]
    m_last = tl.minimum(m0 + BLOCK_M, seq[0]) - 1 + shift
    m0 = m0 + shift
    p0, u, c1 = position(m0, seq, rule)
    lo_key = tl.where((m0 < c) | (p0 - rule.p[0] <= 0), 0, p0 - rule.p[0] + c1)
    if rule.FULL:  # the tile's last row sees the whole history
        p_last, _, _ = position(m_last, seq, rule)
        lo_key = tl.where(p_last >= u - rule.p[4], 0, lo_key)
    lo_key = tl.where(u > 0, lo_key, m0)  # no history position: every row sees itself alone
    hi = tl.minimum(tl.maximum(m_last + 1, tl.where((m0 < c) & (u > 0), n - seq[2], 0)), n)
    return (tl.maximum(lo_key, 0) // BLOCK_N) * BLOCK_N, hi


@triton.jit
def query_ranges(n0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """HSTU's mask, the queries that see keys [n0, n0 + BLOCK_N): (prefix end, lo, hi): the context rows [0,
    prefix end) (aligned up to BLOCK_M; 0 when none, or when they join [lo, hi)), then from the first key's diagonal
    (lo aligned down to BLOCK_M) to the last query that sees a history key of the tile (every target, unless the
    window ends first), or the tile's last target key's diagonal."""
    n, shift = rows(seq, rule)  # (found as the sequence's rows, returned as query rows)
    c = rule.p[2]
    h = n - seq[2]  # the history's end: keys from h on are targets, seen by themselves alone
    k_last = tl.minimum(n0 + BLOCK_N, n) - 1
    has_history = n0 < h
    pjh, u, c1 = position(tl.minimum(k_last, h - 1), seq, rule)
    i_max = tl.where(pjh + rule.p[0] >= u, n - 1, pjh + rule.p[0] + c1)
    if rule.FULL:  # the last row (a target, or the history's last: position U or U - 1 >= U - F) sees every
        i_max = n - 1  # history key before it, and itself
    i_max = tl.where(u > 0, i_max, tl.minimum(k_last, h - 1))  # no history position: itself alone
    hi = tl.where(has_history, i_max + 1, 0)
    hi = tl.minimum(tl.maximum(hi, tl.where(k_last >= h, k_last + 1, 0)), n) - shift
    if rule.LAST_ROWS:  # (the first key's diagonal may lie before the first query row)
        lo = (tl.maximum(n0 - shift, 0) // BLOCK_M) * BLOCK_M
    else:
        lo = (n0 // BLOCK_M) * BLOCK_M
    pre = tl.where(has_history & (c > shift) & (u > 0), tl.cdiv(c - shift, BLOCK_M) * BLOCK_M, 0)
    joined = pre >= lo
    return tl.where(joined, 0, pre), tl.where(joined, 0, lo), hi


@triton.jit
def full_blocks(m0, lo, n_blocks, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """HSTU's mask is the causal window's on positions: rows from c on see keys from c on as the window says (p(i) -
    p(j) = i - j), a target row (position U) the history's keys as its row h = n - T would, and a context key (position
    0) wherever the window reaches back to position 0 or to the key itself. So a tile past the context has the window's
    full blocks of its rows, its targets as row h, over the keys before h; a tile with context rows or with no history
    position (U = 0) none. (Masked whole, the targets put each sequence's last tile on HSTU's rule over its walk.)"""
    n, shift = rows(seq, rule)
    first = m0 + shift
    h = n - seq[2]
    last = tl.minimum(tl.minimum(m0 + BLOCK_M, seq[0]) - 1 + shift, h)  # (targets as row h)
    p0, u, c1 = position(first, seq, rule)
    left = rule.p[0]
    if rule.FULL:  # a tile whose rows all see the whole history: the causal window's full blocks, unbounded
        left = tl.where(p0 >= u - rule.p[4], 1 << 30, left)
    # the block's keys are history keys its first row sees: n0 + BLOCK_N - 1 <= min(h - 1, first + RIGHT)
    top = tl.minimum(h - BLOCK_N, first + rule.p[1] - BLOCK_N + 1) - lo
    j_hi = tl.where(top >= 0, top // BLOCK_N + 1, 0)
    # its last row (or row h) sees the block's first key: n0 >= last - LEFT, or from 0 if that reaches position 0
    bottom = tl.where(last - left > c1, last - left, 0) - lo
    j_lo = tl.minimum(tl.where(bottom > 0, (bottom + BLOCK_N - 1) // BLOCK_N, 0), n_blocks)
    plain = (first >= rule.p[2]) & (u > 0)
    j_lo = tl.where(plain, j_lo, 0)
    return j_lo, tl.where(plain, tl.maximum(tl.minimum(j_hi, n_blocks), j_lo), 0)


@triton.jit
def context_keys(m0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """HSTU's mask with a contextual prefix: keys [lo, hi), whole blocks of BLOCK_N from a multiple of it, that
    queries [m0, m0 + BLOCK_M) see from their context rows alone, which see every one of them (context_rows says
    which rows those are): the history's keys past the diagonal of the tile's last row (so that row is no target:
    a target row sees history keys past its diagonal), where the history has positions past the context's (else
    a context row sees itself alone). Empty (lo == hi == 0) for tiles without context rows. Such blocks need only a
    test of the rows, not key_blocks' mask of every pair."""
    n, shift = rows(seq, rule)
    c = rule.p[2]
    h = n - seq[2]  # the history's end: keys from h on are targets
    m_last = tl.minimum(m0 + BLOCK_M, seq[0]) - 1 + shift
    _, u, _ = position(m_last, seq, rule)
    lo = tl.cdiv(m_last + 1, BLOCK_N) * BLOCK_N
    hi = (h // BLOCK_N) * BLOCK_N
    has = (m0 + shift < c) & (u > 0) & (lo < hi)
    return tl.where(has, lo, 0), tl.where(has, hi, 0)


@triton.constexpr_function
def has_window_keys(last_rows, full):
    """Whether window_keys can find any key under a rule with these LAST_ROWS and FULL (Rule's constexprs)."""
    return not last_rows and not full


@triton.jit
def window_keys(m0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """HSTU's mask: the first key (a multiple of BLOCK_N) from which, for queries [m0, m0 + BLOCK_M), it is the causal
    window's on the sequence's rows (window_visible): rows in the history past the context and keys past the
    context see each other at p(i) - p(j) = i - j, and the targets past such rows are unseen, as past the diagonal.
    1 << 30 (no such key) for tiles with context or target rows, with rows past the window's reach (rule.FULL,
    whose rows see the whole history), and in cross-attention (rule.LAST_ROWS: serving's query rows are mostly
    targets, and the test's shift cost the Hopper forward's serving forms 200-270 B of spills)."""
    if not has_window_keys(rule.LAST_ROWS, rule.FULL):
        return 1 << 30
    else:
        n, shift = rows(seq, rule)
        c = rule.p[2]
        m_last = tl.minimum(m0 + BLOCK_M, seq[0]) - 1 + shift
        plain = (m0 + shift >= c) & (m_last < n - seq[2])
        return tl.where(plain, tl.cdiv(c, BLOCK_N) * BLOCK_N, 1 << 30)


@triton.jit
def context_rows(i, seq, rule):
    """HSTU's mask: which query rows i are context rows (each sees every history key; context_keys)."""
    _, shift = rows(seq, rule)
    return i + shift < rule.p[2]


@triton.jit
def key_tile_tests(k0, pre, m_lo, m_hi, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The cheaper tests of HSTU's mask for a key tile's walk, for keys [k0, k0 + BLOCK_N) (k0 a multiple of
    BLOCK_N): whether the query blocks of its prefix [0, pre) see them from their context rows alone (context_rows;
    context_keys, checked at the prefix's last block: its lo grows with the block's rows, its hi is the history's),
    and whether in each block of BLOCK_M real rows from m_lo to m_hi (multiples of BLOCK_M) the mask is the causal
    window's (window_visible; window_keys, checked at both ends: its tiles are those from the context's end to the
    last before the targets)."""
    lo, hi = context_keys(tl.maximum(pre - BLOCK_M, 0), seq, rule, BLOCK_M, BLOCK_N)
    by_rows = (pre > 0) & (k0 >= lo) & (k0 < hi)
    by_window = (m_hi <= seq[0]) & (k0 >= window_keys(m_lo, seq, rule, BLOCK_M, BLOCK_N)) & \
        (k0 >= window_keys(tl.maximum(m_hi - BLOCK_M, m_lo), seq, rule, BLOCK_M, BLOCK_N))
    return by_rows, by_window


@triton.jit
def tail_seen(k0, m_tail, seq, rule, BLOCK_N: tl.constexpr):
    """HSTU's mask: whether every real query row from m_tail on sees every key of [k0, k0 + BLOCK_N): history keys,
    an unbounded window, rows past the keys' diagonal (the history's rows see them causally, the context's rows and
    the targets the whole history)."""
    n, shift = rows(seq, rule)
    _, u, _ = position(n - 1, seq, rule)
    return (rule.p[0] >= 1 << 30) & (u > 0) & (k0 + BLOCK_N <= n - seq[2]) & (m_tail + shift >= k0 + BLOCK_N - 1)
