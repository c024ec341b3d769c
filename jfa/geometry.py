"""The jagged tile geometry, written once: which keys a query tile sees, which queries a key tile is seen by,
which blocks need no mask, and the mask itself. Plain ``@triton.jit`` helpers, called by the schedule kernel
(jfa.schedule), the portable Triton kernels (jfa.triton.kernels) and the Gluon kernels (jfa.hopper); the spec
they implement is jfa.jagged's visibility rule, and tests/test_schedule.py checks them against it.

Glossary (all kernels):
  Lq, Lk      lengths of the current sequence's queries and keys (q_len, kv_len)
  shift       Lk - Lq: query i sits at key position i' = i + shift (bottom-right alignment)
  LEFT, RIGHT window bounds; key j is visible to query i when i' - LEFT <= j <= i' + RIGHT. Unbounded sides
              arrive as jfa.jagged.UNBOUNDED (2**30), so no branch is needed.
  BLOCK_M     query rows per tile, BLOCK_N key rows per tile
  full block  a block in which every (real query, real key) pair is visible: it needs no mask; the blocks at
              the edges of the visible band do (loop peeling).

Transposition: the queries that see the keys [n0, n0 + BLOCK_N) are the keys that rows [n0, n0 + BLOCK_N) of
the mirrored problem see (queries and keys swapped, LEFT and RIGHT swapped): query_range and query_blocks are
key_range and key_blocks called that way, and the backward's schedule is built the same way.
"""
import triton
import triton.language as tl


@triton.jit
def sequence_bounds(q_offsets, kv_offsets, seq):
    """Start rows and lengths of sequence `seq` on both sides (int32: TMA coordinates are 32-bit)."""
    q_start = tl.load(q_offsets + seq).to(tl.int32)
    q_len = tl.load(q_offsets + seq + 1).to(tl.int32) - q_start
    kv_start = tl.load(kv_offsets + seq).to(tl.int32)
    kv_len = tl.load(kv_offsets + seq + 1).to(tl.int32) - kv_start
    return q_start, q_len, kv_start, kv_len


@triton.jit
def key_range(m0, q_len, kv_len, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys [lo, hi) seen by queries [m0, m0 + BLOCK_M), lo aligned down to BLOCK_N (scalars or vectors).
    The range is empty (hi <= lo) when no real query of the tile sees a key."""
    shift = kv_len - q_len
    m_last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    lo = (tl.maximum(m0 + shift - LEFT, 0) // BLOCK_N) * BLOCK_N
    hi = tl.minimum(m_last + shift + RIGHT + 1, kv_len)
    return lo, hi


@triton.jit
def full_blocks(m0, lo, n_blocks, q_len, kv_len, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Of the key blocks [lo + j BLOCK_N, lo + (j + 1) BLOCK_N), j < n_blocks, that queries [m0, m0 + BLOCK_M)
    see, the ones [j_lo, j_hi) that need no mask: their keys exist and every real query row sees all of them.

    (This index form, with its non-negative divisions, is what the dK/dV consumers loop over: computed as
    block positions it cost the D=128 kernel 120-210 B more spills, some inside its dK MMA; perf-notes.)"""
    shift = kv_len - q_len
    m_last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    # the block's last key exists and the first row sees it: n0 + BLOCK_N - 1 <= min(kv_len - 1, m0 + shift + RIGHT)
    top = tl.minimum(kv_len - BLOCK_N, m0 + shift + RIGHT - BLOCK_N + 1) - lo
    j_hi = tl.where(top >= 0, top // BLOCK_N + 1, 0)
    # the last real row sees the block's first key: n0 >= m_last + shift - LEFT
    bottom = m_last + shift - LEFT - lo
    j_lo = tl.minimum(tl.where(bottom > 0, (bottom + BLOCK_N - 1) // BLOCK_N, 0), n_blocks)
    return j_lo, tl.maximum(tl.minimum(j_hi, n_blocks), j_lo)


@triton.jit
def key_blocks(m0, q_len, kv_len, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key ranges seen by queries [m0, m0 + BLOCK_M): (lo, full_lo, full_hi, hi).

    Blocks start at lo (a multiple of BLOCK_N). [lo, full_lo) and [full_hi, hi) need the mask; [full_lo,
    full_hi) holds whole blocks visible to every real query row of the tile (none when they are equal).
    """
    lo, hi = key_range(m0, q_len, kv_len, LEFT, RIGHT, BLOCK_M, BLOCK_N)
    n_blocks = tl.maximum(tl.cdiv(hi - lo, BLOCK_N), 0)
    j_lo, j_hi = full_blocks(m0, lo, n_blocks, q_len, kv_len, LEFT, RIGHT, BLOCK_M, BLOCK_N)
    return lo, lo + j_lo * BLOCK_N, lo + j_hi * BLOCK_N, hi


@triton.jit
def query_range(n0, q_len, kv_len, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Queries [lo, hi) that see keys [n0, n0 + BLOCK_N), lo aligned down to BLOCK_M (see Transposition)."""
    return key_range(n0, kv_len, q_len, RIGHT, LEFT, BLOCK_N, BLOCK_M)


@triton.jit
def query_blocks(n0, q_len, kv_len, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query ranges that see keys [n0, n0 + BLOCK_N): (lo, full_lo, full_hi, hi), as key_blocks: a full
    block's rows all exist and see every real key of the tile."""
    return key_blocks(n0, kv_len, q_len, RIGHT, LEFT, BLOCK_N, BLOCK_M)


@triton.jit
def full_query_blocks(n0, lo, n_blocks, q_len, kv_len, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """full_blocks transposed: of the query blocks [lo + j BLOCK_M, ...), j < n_blocks, that see keys [n0, n0 +
    BLOCK_N), the ones [j_lo, j_hi) that need no mask."""
    return full_blocks(n0, lo, n_blocks, kv_len, q_len, RIGHT, LEFT, BLOCK_N, BLOCK_M)


@triton.jit
def in_window(i, j, q_len, kv_len, LEFT, RIGHT):
    """Whether key rows j lie in the window of query rows i (broadcastable, e.g. [M, 1] and [1, N])."""
    i_shifted = i + (kv_len - q_len)
    return (j >= i_shifted - LEFT) & (j <= i_shifted + RIGHT)


@triton.jit
def visible(i, j, q_len, kv_len, LEFT, RIGHT):
    """Mask of visible pairs: a real query, a real key, inside the window. A kernel whose rows past a
    sequence's end are never stored (or whose keys past it are never stored) may test in_window and the other
    side alone."""
    return (i < q_len) & (j < kv_len) & in_window(i, j, q_len, kv_len, LEFT, RIGHT)
