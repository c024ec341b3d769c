"""What a visible (query, key) pair contributes, written once for every kernel: the score -> weight step of the
forward and its derivative in the backward. Plain ``@triton.jit`` helpers on blocks of scores, called by the
portable Triton kernels (jfa.triton.kernels) and the Gluon kernels (jfa.hopper) alike, whatever layout their
tiles have (row statistics arrive already broadcast to the block's shape). With jfa.geometry (which pairs are
visible, and which blocks an item walks) this is the seam a new attention variant changes (docs/hopper.md,
"Adding an attention variant").

Softmax, in base 2: s_scale = scale * log2(e) turns a score into a base-2 logit.
  forward   online_softmax per key block: p = exp2(s s_scale - m) with the running row max m, and alpha, the
            factor that rescales what was summed before; softmax_lse at the end
  backward  softmax_weights: P = exp2(s s_scale - lse2) from the saved lse2 = lse log2(e);
            softmax_dscores: dS = P (dP - Delta), Delta = rowsum(dO O) - dLSE (jfa.bwd_common)
"""
import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def online_softmax(s, m_i, s_scale, EMPTY_ROWS: tl.constexpr = True):
    """-> (p, the new row max of s, alpha = exp2 of the max's step, in s_scale units), for one block of scores s
    (a kernel that scales the scores itself passes s_scale = 1). EMPTY_ROWS: a row may have seen nothing yet
    (max -inf), whose p and alpha must be 0, not NaN."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if EMPTY_ROWS:
        m_scaled = tl.where(m_new == float("-inf"), 0.0, m_new * s_scale)
    else:
        m_scaled = m_new * s_scale
    p = tl.exp2(s * s_scale - tl.expand_dims(m_scaled, 1))
    alpha = tl.exp2(m_i * s_scale - m_scaled)
    return p, m_new, alpha


@triton.jit
def softmax_lse(m_i, l_i, s_scale):
    """The natural-log LSE of rows with running max m_i (of s) and sum l_i; -inf for a row that saw no key."""
    seen = l_i > 0.0
    return tl.where(seen, (m_i * s_scale + tl.log2(tl.where(seen, l_i, 1.0))) * LN2, float("-inf"))


@triton.jit
def softmax_weights(s, s_scale, lse2):
    """P = exp2(s s_scale - lse2), lse2 = log2(e) lse broadcast to s's shape."""
    return tl.exp2(s * s_scale - lse2)


@triton.jit
def softmax_dscores(p, dp, delta):
    """dS = P (dP - Delta), Delta broadcast to p's shape (0 wherever P is)."""
    return p * (dp - delta)
