"""Jagged helpers shared by the portable Triton kernels: which block ranges a tile sees, and the mask.

Glossary (all kernels):
  Lq, Lk      lengths of the current sequence's queries and keys
  SHIFT       Lk - Lq: query i sits at key position i' = i + SHIFT (bottom-right alignment)
  LEFT, RIGHT window bounds; key j is visible to query i when i' - LEFT <= j <= i' + RIGHT.
              Unbounded sides arrive as jfa.jagged.UNBOUNDED (2**30), so no branch is needed.
  BLOCK_M     query rows per tile, BLOCK_N key rows per tile, BLOCK_D head dim padded to a power of 2
  DOT         "ieee" (fp32 inputs), "tf32" (16-bit inputs: tensor cores), or "upcast" (bf16 in Triton's
              interpreter, whose bf16 dot is wrong in 3.6: operands go to fp32, exact for bf16 products)
  full block  a block in which every (real query, real key) pair is visible: it runs the branch-free loop;
              the blocks at the edges of the visible band run the masked loop (loop peeling).
"""
import triton
import triton.language as tl


@triton.jit
def sequence_bounds(q_offsets, kv_offsets, seq):
    """Start rows and lengths of sequence `seq` on both sides."""
    q_start = tl.load(q_offsets + seq).to(tl.int32)
    q_len = tl.load(q_offsets + seq + 1).to(tl.int32) - q_start
    kv_start = tl.load(kv_offsets + seq).to(tl.int32)
    kv_len = tl.load(kv_offsets + seq + 1).to(tl.int32) - kv_start
    return q_start, q_len, kv_start, kv_len


@triton.jit
def key_range(m0, q_len, kv_len, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys [lo, hi) seen by queries [m0, m0 + BLOCK_M), lo aligned down to BLOCK_N (scalars or vectors)."""
    shift = kv_len - q_len
    m_last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    lo = (tl.maximum(m0 + shift - LEFT, 0) // BLOCK_N) * BLOCK_N
    hi = tl.minimum(m_last + shift + RIGHT + 1, kv_len)
    return lo, hi


@triton.jit
def key_blocks(m0, q_len, kv_len, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key ranges seen by queries [m0, m0 + BLOCK_M): (lo, full_lo, full_hi, hi).

    Blocks start at lo (a multiple of BLOCK_N). [lo, full_lo) and [full_hi, hi) need the mask;
    [full_lo, full_hi) holds whole blocks visible to every real query row of the tile.
    """
    shift = kv_len - q_len
    m_last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    lo, hi = key_range(m0, q_len, kv_len, LEFT, RIGHT, BLOCK_M, BLOCK_N)
    full_lo = tl.maximum(tl.cdiv(m_last + shift - LEFT, BLOCK_N) * BLOCK_N, lo)
    full_hi = (tl.minimum(m0 + shift + RIGHT + 1, kv_len) // BLOCK_N) * BLOCK_N
    if full_hi < full_lo:  # no full block: everything goes through the masked loop
        full_lo = lo
        full_hi = lo
    return lo, full_lo, full_hi, hi


@triton.jit
def query_blocks(n0, q_len, kv_len, LEFT, RIGHT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query ranges that see keys [n0, n0 + BLOCK_N): (lo, full_lo, full_hi, hi), as key_blocks."""
    shift = kv_len - q_len
    n_last = tl.minimum(n0 + BLOCK_N, kv_len) - 1
    lo = tl.maximum(n0 - RIGHT - shift, 0)
    hi = tl.minimum(n_last + LEFT - shift + 1, q_len)
    lo = (lo // BLOCK_M) * BLOCK_M
    full_lo = tl.maximum(tl.cdiv(n_last - RIGHT - shift, BLOCK_M) * BLOCK_M, lo)
    full_hi = (tl.minimum(n0 + LEFT - shift + 1, q_len) // BLOCK_M) * BLOCK_M
    if full_hi < full_lo:
        full_lo = lo
        full_hi = lo
    return lo, full_lo, full_hi, hi


@triton.jit
def visible(i, j, q_len, kv_len, LEFT, RIGHT):
    """Mask of visible pairs: query rows i and key rows j, given broadcastable (e.g. [M, 1] and [1, N]).

    True for a real query, a real key, inside the window.
    """
    i_shifted = i + (kv_len - q_len)
    return (i < q_len) & (j < kv_len) & (j >= i_shifted - LEFT) & (j <= i_shifted + RIGHT)


@triton.jit
def mma(a, b, DOT: tl.constexpr):
    """tl.dot with float32 accumulation; see DOT in the glossary."""
    if DOT == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=DOT)
