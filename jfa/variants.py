"""What a visible (query, key) pair contributes, written once for every kernel: the score -> weight step of the
forward and its derivative in the backward. Plain ``@triton.jit`` helpers on blocks of scores, called by the
portable Triton kernels (jfa.triton.kernels) and the Gluon kernels (jfa.hopper) alike, whatever layout their
tiles have (row statistics arrive already broadcast to the block's shape). With jfa.geometry (which pairs are
visible, and which blocks an item walks) this is the seam a new attention variant changes (docs/hopper.md,
"Adding an attention variant").

The kernels take the score function as a constexpr ACT (its index in ACTIVATIONS; SOFTMAX = 0) and the scores'
scale as s_scale (score_scale).

Softmax, in base 2: s_scale = scale * log2(e) turns a score into a base-2 logit.
  forward   online_softmax per key block: p = exp2(s s_scale - m) with the running row max m, and alpha, the
            factor that rescales what was summed before; softmax_lse at the end
  backward  softmax_weights: P = exp2(s s_scale - lse2) from the saved lse2 = lse log2(e);
            softmax_dscores: dS = P (dP - Delta), Delta = rowsum(dO O) - dLSE (jfa.bwd_common)
An activation f (GDPA, HSTU): s_scale = scale, x = s s_scale.
  forward   P = f(x), no running max, no rescale, no lse; O = c P V at the end (c: the rows' out scale)
  backward  P = f(x) into dV (dO times c), dS = f'(x) dP; no Delta (activation_with_grad: f and f' from one
            tanh, kept in place of the scores; the masked pairs are zeroed in both).
FAST: tanh by the MUFU's tanh.approx (the GPU; max relative error ~2^-11, the bf16/fp16 operands' rounding is
larger), else exactly (Triton's interpreter, which runs no PTX). sigmoid(x) = 0.5 + 0.5 tanh(x / 2): one MUFU
operation per score, as softmax's exp2.
"""
import math

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)
ACTIVATIONS = ("softmax", "silu", "gelu", "gelu_tanh", "relu", "relu2", "sigmoid", "identity")
SOFTMAX = tl.constexpr(0)
SILU = tl.constexpr(1)
GELU = tl.constexpr(2)
GELU_TANH = tl.constexpr(3)
RELU = tl.constexpr(4)
RELU2 = tl.constexpr(5)
SIGMOID = tl.constexpr(6)
IDENTITY = tl.constexpr(7)
_C0 = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi), the tanh form of GELU
_C1 = tl.constexpr(0.044715)
_RSQRT2 = tl.constexpr(0.7071067811865476)
_RSQRT2PI = tl.constexpr(0.3989422804014327)


def act_code(activation: str) -> int:
    return ACTIVATIONS.index(activation)


def score_scale(scale: float, activation: str) -> float:
    """What the kernels multiply a score q . k by: into base-2 logits for softmax, the plain scale otherwise."""
    return scale * math.log2(math.e) if activation == "softmax" else scale


@triton.jit
def _tanh(x, FAST: tl.constexpr):
    if FAST:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        return tl.where(x >= 0, t, -t)


@triton.jit
def activation(x, ACT: tl.constexpr, FAST: tl.constexpr):
    """f(x), elementwise (float32)."""
    if ACT == SILU:
        h = 0.5 * x
        return h + h * _tanh(h, FAST)
    elif ACT == GELU:
        return 0.5 * x * (1.0 + tl.erf(x * _RSQRT2))
    elif ACT == GELU_TANH:
        h = 0.5 * x
        return h + h * _tanh(x * (_C0 + (_C0 * _C1) * x * x), FAST)
    elif ACT == RELU:
        return tl.maximum(x, 0.0)
    elif ACT == RELU2:
        r = tl.maximum(x, 0.0)
        return r * r
    elif ACT == SIGMOID:
        return 0.5 + 0.5 * _tanh(0.5 * x, FAST)
    else:
        return x


@triton.jit
def activation_with_grad(x, ACT: tl.constexpr, FAST: tl.constexpr):
    """(f(x), f'(x)), sharing what they share (one tanh, erf or max)."""
    if ACT == SILU:
        sig = 0.5 + 0.5 * _tanh(0.5 * x, FAST)
        f = x * sig
        return f, sig + f * (1.0 - sig)
    elif ACT == GELU:
        e = 0.5 + 0.5 * tl.erf(x * _RSQRT2)
        return x * e, e + x * (_RSQRT2PI * tl.exp(-0.5 * x * x))
    elif ACT == GELU_TANH:
        e = 0.5 + 0.5 * _tanh(x * (_C0 + (_C0 * _C1) * x * x), FAST)
        return x * e, e + 2.0 * x * e * (1.0 - e) * (_C0 + (3.0 * _C0 * _C1) * x * x)
    elif ACT == RELU:
        return tl.maximum(x, 0.0), tl.where(x > 0.0, 1.0, 0.0)
    elif ACT == RELU2:
        r = tl.maximum(x, 0.0)
        return r * r, 2.0 * r
    elif ACT == SIGMOID:
        sig = 0.5 + 0.5 * _tanh(0.5 * x, FAST)
        return sig, sig * (1.0 - sig)
    else:
        return x, 1.0 + 0.0 * x


@triton.jit
def activation_grad(x, ACT: tl.constexpr, FAST: tl.constexpr):
    """f'(x), elementwise (float32)."""
    if ACT == SILU:
        sig = 0.5 + 0.5 * _tanh(0.5 * x, FAST)
        return sig + x * sig * (1.0 - sig)
    elif ACT == GELU:
        return 0.5 * (1.0 + tl.erf(x * _RSQRT2)) + x * (_RSQRT2PI * tl.exp(-0.5 * x * x))
    elif ACT == GELU_TANH:
        t = _tanh(x * (_C0 + (_C0 * _C1) * x * x), FAST)
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (_C0 + (3.0 * _C0 * _C1) * x * x)
    elif ACT == RELU:
        return tl.where(x > 0.0, 1.0, 0.0)
    elif ACT == RELU2:
        return 2.0 * tl.maximum(x, 0.0)
    elif ACT == SIGMOID:
        sig = 0.5 + 0.5 * _tanh(0.5 * x, FAST)
        return sig * (1.0 - sig)
    else:
        return 1.0 + 0.0 * x


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
