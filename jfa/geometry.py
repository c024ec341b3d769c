"""The jagged tile geometry, written once: which keys a query tile sees, which queries a key tile is seen by, how
many blocks an item walks, which blocks need no mask, and the mask itself. Plain ``@triton.jit`` helpers, called
by the schedule kernel (jfa.schedule), the portable Triton kernels (jfa.triton.kernels) and the Gluon kernels
(jfa.hopper); the spec they implement is jfa.jagged's visibility rule, and tests/test_schedule.py checks them
against it. Together with jfa.variants (what a visible pair contributes) this is the seam a new attention variant
changes (docs/hopper.md, "Adding an attention variant").

Two tuples carry what the rule needs, so that a rule with more parameters changes where they are made, not the
kernels that pass them through:
  seq         one sequence's lengths, (Lq, Lk) (sequence_bounds makes it)
  rule        the mask's parameters, (LEFT, RIGHT): key j is visible to query i when i' - LEFT <= j <= i' + RIGHT,
              i' = i + shift; unbounded sides arrive as jfa.jagged.UNBOUNDED (2**30), so no branch is needed

Glossary (all kernels):
  Lq, Lk      lengths of the current sequence's queries and keys (q_len, kv_len)
  shift       Lk - Lq: query i sits at key position i' = i + shift (bottom-right alignment)
  BLOCK_M     query rows per tile, BLOCK_N key rows per tile
  walk        the blocks of the other side an item visits: [lo, hi) in steps of its block, block_count of them
              (the producer loads them, the consumers compute them, the dQ writer drains them, the schedule costs
              them: all from key_range / query_range and block_count)
  full block  a block in which every (real query, real key) pair is visible: it needs no mask; the blocks at
              the edges of the visible band do (loop peeling)

Transposition: the queries that see the keys [n0, n0 + BLOCK_N) are the keys that rows [n0, n0 + BLOCK_N) of
the mirrored problem see (queries and keys swapped, LEFT and RIGHT swapped: mirror): query_range and query_blocks
are key_range and key_blocks called that way, and the backward's schedule is built the same way.
"""
import triton
import triton.language as tl


@triton.jit
def sequence_bounds(q_offsets, kv_offsets, seq):
    """(q_start, kv_start, (q_len, kv_len)) of sequence `seq` (int32: TMA coordinates are 32-bit)."""
    q_start = tl.load(q_offsets + seq).to(tl.int32)
    q_len = tl.load(q_offsets + seq + 1).to(tl.int32) - q_start
    kv_start = tl.load(kv_offsets + seq).to(tl.int32)
    kv_len = tl.load(kv_offsets + seq + 1).to(tl.int32) - kv_start
    return q_start, kv_start, (q_len, kv_len)


@triton.jit
def mirror(seq, rule):
    """The transposed problem's (seq, rule): keys as rows."""
    return (seq[1], seq[0]), (rule[1], rule[0])


@triton.jit
def key_range(m0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys [lo, hi) seen by queries [m0, m0 + BLOCK_M), lo aligned down to BLOCK_N (scalars or vectors).
    The range is empty (hi <= lo) when no real query of the tile sees a key."""
    q_len, kv_len = seq[0], seq[1]
    shift = kv_len - q_len
    m_last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    lo = (tl.maximum(m0 + shift - rule[0], 0) // BLOCK_N) * BLOCK_N
    hi = tl.minimum(m_last + shift + rule[1] + 1, kv_len)
    return lo, hi


@triton.jit
def block_count(lo, hi, BLOCK: tl.constexpr):
    """Blocks of a walk over [lo, hi) (0 when empty)."""
    return tl.maximum(tl.cdiv(hi - lo, BLOCK), 0)


@triton.jit
def full_blocks(m0, lo, n_blocks, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Of the key blocks [lo + j BLOCK_N, lo + (j + 1) BLOCK_N), j < n_blocks, that queries [m0, m0 + BLOCK_M)
    see, the ones [j_lo, j_hi) that need no mask: their keys exist and every real query row sees all of them.

    (This index form, with its non-negative divisions, is what the dK/dV consumers loop over: computed as
    block positions it cost the D=128 kernel 120-210 B more spills, some inside its dK MMA; perf-notes.)"""
    q_len, kv_len = seq[0], seq[1]
    shift = kv_len - q_len
    m_last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    # the block's last key exists and the first row sees it: n0 + BLOCK_N - 1 <= min(kv_len - 1, m0 + shift + RIGHT)
    top = tl.minimum(kv_len - BLOCK_N, m0 + shift + rule[1] - BLOCK_N + 1) - lo
    j_hi = tl.where(top >= 0, top // BLOCK_N + 1, 0)
    # the last real row sees the block's first key: n0 >= m_last + shift - LEFT
    bottom = m_last + shift - rule[0] - lo
    j_lo = tl.minimum(tl.where(bottom > 0, (bottom + BLOCK_N - 1) // BLOCK_N, 0), n_blocks)
    return j_lo, tl.maximum(tl.minimum(j_hi, n_blocks), j_lo)


@triton.jit
def key_blocks(m0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key ranges seen by queries [m0, m0 + BLOCK_M): (lo, full_lo, full_hi, hi).

    Blocks start at lo (a multiple of BLOCK_N). [lo, full_lo) and [full_hi, hi) need the mask; [full_lo,
    full_hi) holds whole blocks visible to every real query row of the tile (none when they are equal).
    """
    lo, hi = key_range(m0, seq, rule, BLOCK_M, BLOCK_N)
    n_blocks = block_count(lo, hi, BLOCK_N)
    j_lo, j_hi = full_blocks(m0, lo, n_blocks, seq, rule, BLOCK_M, BLOCK_N)
    return lo, lo + j_lo * BLOCK_N, lo + j_hi * BLOCK_N, hi


@triton.jit
def query_range(n0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Queries [lo, hi) that see keys [n0, n0 + BLOCK_N), lo aligned down to BLOCK_M (see Transposition)."""
    seq_t, rule_t = mirror(seq, rule)
    return key_range(n0, seq_t, rule_t, BLOCK_N, BLOCK_M)


@triton.jit
def query_blocks(n0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query ranges that see keys [n0, n0 + BLOCK_N): (lo, full_lo, full_hi, hi), as key_blocks: a full
    block's rows all exist and see every real key of the tile."""
    seq_t, rule_t = mirror(seq, rule)
    return key_blocks(n0, seq_t, rule_t, BLOCK_N, BLOCK_M)


@triton.jit
def full_query_blocks(n0, lo, n_blocks, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """full_blocks transposed: of the query blocks [lo + j BLOCK_M, ...), j < n_blocks, that see keys [n0, n0 +
    BLOCK_N), the ones [j_lo, j_hi) that need no mask."""
    seq_t, rule_t = mirror(seq, rule)
    return full_blocks(n0, lo, n_blocks, seq_t, rule_t, BLOCK_N, BLOCK_M)


@triton.jit
def in_window(i, j, seq, rule):
    """Whether key rows j lie in the window of query rows i (broadcastable, e.g. [M, 1] and [1, N])."""
    i_shifted = i + (seq[1] - seq[0])
    return (j >= i_shifted - rule[0]) & (j <= i_shifted + rule[1])


@triton.jit
def _rule(i, j, seq, rule, KEY_MAJOR: tl.constexpr):
    if KEY_MAJOR:
        seq_t, rule_t = mirror(seq, rule)
        return in_window(j, i, seq_t, rule_t)
    else:
        return in_window(i, j, seq, rule)


@triton.jit
def visible(i, j, seq, rule, QUERIES: tl.constexpr = True, KEYS: tl.constexpr = True,
            KEY_MAJOR: tl.constexpr = False):
    """The mask of visible pairs, every kernel's one element test: query rows i and key rows j (broadcastable, e.g.
    [M, 1] and [1, N], or [1, M] and [N, 1] for a tile held keys first) inside the rule, and with QUERIES / KEYS,
    real rows of the sequence (a kernel that never stores rows past a sequence's end, or whose values there never
    reach what it stores, leaves that side untested). KEY_MAJOR evaluates the rule on the mirrored problem (the
    same pairs), as the dK/dV kernels hold their tiles: their register allocation moved with the form of this
    arithmetic (docs/hopper.md, pitfalls)."""
    if KEY_MAJOR:  # the key rows' window and existence, then the query columns'
        vis = _rule(i, j, seq, rule, True)
        if KEYS:
            vis = vis & (j < seq[1])
        if QUERIES:
            vis = (i < seq[0]) & vis
        return vis
    if QUERIES:
        if KEYS:
            return (i < seq[0]) & (j < seq[1]) & _rule(i, j, seq, rule, KEY_MAJOR)
        else:
            return (i < seq[0]) & _rule(i, j, seq, rule, KEY_MAJOR)
    else:
        if KEYS:
            return (j < seq[1]) & _rule(i, j, seq, rule, KEY_MAJOR)
        else:
            return _rule(i, j, seq, rule, KEY_MAJOR)
