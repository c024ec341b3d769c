"""What a visible (query, key) pair contributes, written once for every kernel: the score policy. Plain
``@triton.jit`` helpers on blocks of scores, called by the portable Triton kernels (jfa.triton.kernels) and the
Gluon kernels (jfa.hopper) alike, whatever layout their tiles have (row statistics arrive already broadcast to the
block's shape). With jfa.geometry (which pairs are visible, which blocks an item walks) this is the seam a new
attention variant changes (docs/hopper.md, "Adding an attention variant").

A kernel takes the score function as the constexpr SCORE (score_fn: SOFTMAX, or an activation's function from
ACTIVATIONS) and its run-time scales as one group, ``score = (qk_scale, out_scale, grad_scale)`` (score_args), and
calls, never asking which score it runs:

  forward   row_state(rows) -> state; per key block: weights -> (P, state, alpha: the factor that rescales what
            was summed before), the mask's hidden pairs hidden before them where masks_scores (softmax: a -inf
            score), else after (an activation: a 0 weight): hide; at the end out_factor (the rows' factor on O) and
            lse, stored where has_lse
  backward  row statistics (log2(e) LSE and Delta) are loaded where has_lse; bwd_weights -> (P into dV, G),
            mask_grads, dscores -> dS into dQ and dK; dv_factor (dV's factor)

Softmax, in base 2: qk_scale = scale * log2(e) turns a score into a base-2 logit; the forward's online softmax keeps
the running row max and sum (state), alpha = exp2 of the max's step; P = exp2(s qk_scale - lse2) in the backward,
lse2 = lse log2(e), dS = P (dP - Delta), Delta = rowsum(dO O) - dLSE (jfa.bwd_common); G is P (no second factor).
An activation f (GDPA, HSTU): qk_scale = scale, x = s qk_scale; P = f(x), no running state (alpha 1), no lse;
O = c P V (c: the out scale); G = f'(x), dS = f'(x) dP; dK and dQ take grad_scale = scale c, dV c.

The activations are one table, ACTIVATIONS: name -> one function of (x, FAST) returning (f(x), f'(x)), sharing
what they share; a kernel that needs one of the two leaves the other to the compiler's dead-code elimination.
Where folding the scale k (x = s k) into f's constants saves operations an element, an activation may also have a
folded form, of (s, k, FAST), returning (f(x) / (C k), f'(x)) (folded, weight_coeff: O and dV take C k).
FAST: tanh by the MUFU's tanh.approx (the GPU; max relative error ~2^-11, the bf16/fp16 operands' rounding is
larger), else exactly (Triton's interpreter, which runs no PTX). sigmoid(x) = 0.5 + 0.5 tanh(x / 2): one MUFU
operation per score, as softmax's exp2.
"""
import math

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e), every kernel's
LN2 = tl.constexpr(0.6931471805599453)
SOFTMAX = tl.constexpr("softmax")  # SCORE of softmax (an activation's SCORE is its function)
_C0 = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi), the tanh form of GELU
_C1 = tl.constexpr(0.044715)
# GELU's Phi(x) = (1 + tanh(y(x))) / 2 with y = atanh(erf(x / sqrt(2))) fitted by an odd polynomial of degree 9
# (minimax in Phi on [0, 6], monotone past it; |Phi error| <= 1.5e-6 with an exact tanh): one MUFU an element
# where libdevice's erf took ~31 instructions. On the GPU tanh.approx's 2^-11 dominates, as in silu and
# gelu_tanh. _G: y's coefficients.
_G1 = tl.constexpr(0.7978695631027222)
_G3 = tl.constexpr(0.036392807960510254)
_G5 = tl.constexpr(-8.821956726023927e-05)
_G7 = tl.constexpr(-3.660002039396204e-05)
_G9 = tl.constexpr(1.418530814589758e-06)
_RSQRT2PI = tl.constexpr(0.3989422804014327)  # Phi'(0) = 1 / sqrt(2 pi)
_LOG2_RSQRT2PI = tl.constexpr(-1.3257480647361592)  # log2(1 / sqrt(2 pi))


@triton.jit
def _tanh(x, FAST: tl.constexpr):
    if FAST:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        return tl.where(x >= 0, t, -t)


# ---- the activations: (f, f') of x, float32, elementwise

@triton.jit
def silu(x, FAST: tl.constexpr):
    """x sigmoid(x) = h + h tanh(h), h = x / 2."""
    h = 0.5 * x
    t = _tanh(h, FAST)
    f = h + h * t
    sig = 0.5 + 0.5 * t
    return f, sig + f * (1.0 - sig)


@triton.jit
def gelu(x, FAST: tl.constexpr):
    """x Phi(x) (erf's GELU) with Phi by tanh of the polynomial y (_G); f' = Phi + x Phi', Phi' = exp(-x^2 / 2) /
    sqrt(2 pi) (by exp2, the factor's log2 in the exponent: one FMUL an element fewer, D=128's one pass loop 746 ->
    715 instructions; y's derivative, 5 more terms beside t, spilled the dK/dV forms)."""
    x2 = x * x
    e = 0.5 + 0.5 * _tanh(x * (_G1 + x2 * (_G3 + x2 * (_G5 + x2 * (_G7 + x2 * _G9)))), FAST)
    return x * e, e + x * tl.exp2((-0.5 * LOG2E) * x2 + _LOG2_RSQRT2PI)


@triton.jit
def gelu_tanh(x, FAST: tl.constexpr):
    """GELU's tanh form: x e, e = (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2; f' = e + 2 x e (1 - e) (c0 + 3 c0
    c1 x^2), written (e - e^2) x (2 c0 + 6 c0 c1 x^2): ~14.7 float32 operations an element in the one pass's SASS where
    the left-to-right form took ~16.7 (softmax: ~7.7)."""
    e = 0.5 + 0.5 * _tanh(x * (_C0 + (_C0 * _C1) * x * x), FAST)
    return x * e, e + (e - e * e) * (x * ((2.0 * _C0) + (6.0 * _C0 * _C1) * x * x))


@triton.jit
def relu(x, FAST: tl.constexpr):
    return tl.maximum(x, 0.0), tl.where(x > 0.0, 1.0, 0.0)


@triton.jit
def relu2(x, FAST: tl.constexpr):
    """relu(x)^2."""
    r = tl.maximum(x, 0.0)
    return r * r, 2.0 * r


@triton.jit
def sigmoid(x, FAST: tl.constexpr):
    sig = 0.5 + 0.5 * _tanh(0.5 * x, FAST)
    return sig, sig * (1.0 - sig)


@triton.jit
def identity(x, FAST: tl.constexpr):
    return x, tl.where(True, 1.0, x)  # (f' a constant: dS is dP, and S is dead where no mask reads it)


# name -> (f, f'): the activations that may take softmax's place (the reference has the same table in PyTorch)
ACTIVATIONS = {"silu": silu, "gelu": gelu, "gelu_tanh": gelu_tanh, "relu": relu, "relu2": relu2, "sigmoid": sigmoid,
               "identity": identity}
SCORE_NAMES = ("softmax", *ACTIVATIONS)  # what the API takes as activation=


# ---- the folded forms, where folding the scale k into f's constants pays: (f(s k) / (C k), f'(s k)), the forward's
# and (fold_backward) the backward's (O and dV take the factor C k: out_factor, dv_factor). (In fp16 a weight
# overflows where |f(x)| > 65504 C k: |x| > ~2,900 for gelu and gelu_tanh, ~5,800 for identity at D=128.)

@triton.jit
def gelu_tanh_folded(s, k, FAST: tl.constexpr):
    """gelu_tanh(s k) / (k / 2) = s + s t, k in tanh's polynomial (4 float32 operations an element, 6 as gelu_tanh's
    f); f' = e + x e' = e + (1 - t^2) x (c0 + 3 c0 c1 x^2) / 2, x's polynomial folded the same way (9, 12 as
    gelu_tanh's (f, f'))."""
    s2 = s * s
    t = _tanh(s * ((_C0 * k) + (_C0 * _C1 * k * k * k) * s2), FAST)
    de = s * ((0.5 * _C0 * k) + (1.5 * _C0 * _C1 * k * k * k) * s2)
    return s + s * t, (0.5 + 0.5 * t) + (1.0 - t * t) * de


@triton.jit
def gelu_folded(s, k, FAST: tl.constexpr):
    """gelu(s k) / (k / 2) = s + s t, k in the polynomial's coefficients (7 float32 operations an element, 9 as gelu's
    f); f' = e + x exp(-x^2 / 2) / sqrt(2 pi), k folded into its factors too."""
    k2 = k * k
    s2 = s * s
    y = s * ((_G1 * k) + s2 * ((_G3 * k * k2) + s2 * ((_G5 * k * k2 * k2) + s2 * ((_G7 * k * k2 * k2 * k2) + s2 * (
        _G9 * k * k2 * k2 * k2 * k2)))))
    t = _tanh(y, FAST)
    return s + s * t, (0.5 + 0.5 * t) + (s * tl.exp2(((-0.5 * LOG2E) * k2) * s2)) * (_RSQRT2PI * k)


@triton.jit
def identity_folded(s, k, FAST: tl.constexpr):
    """identity(s k) / k = s; f' = 1."""
    return s, tl.where(True, 1.0, s)


@triton.constexpr_function
def folded(SCORE):
    """An activation's folded form (ACTIVATIONS' name -> a function of (s, k, FAST) returning (f(s k) / (C k),
    f'(s k))), or None: the kernels then take SCORE's (f, f') of x = s k."""
    return {"gelu": gelu_folded, "gelu_tanh": gelu_tanh_folded, "identity": identity_folded}.get(
        getattr(SCORE, "__name__", ""))


@triton.constexpr_function
def fold_backward(HEAD_DIM):
    """Whether the Hopper backward takes an activation's folded form (bwd_weights' and dv_factor's FOLD) at this head
    dim: at D=64 the blocks are bound by their elementwise work (gelu_tanh's backward 3-6% faster folded, H100); at
    D=128 the folded (f, f') spill beside the MMA accumulators (the one pass 380 -> 816 B; broadcast q 15% slower)."""
    return HEAD_DIM <= 64


@triton.constexpr_function
def weight_coeff(SCORE):
    """C of the folded form's weights (f(x) / (C k)); 0 where there is none (softmax too)."""
    return {"gelu": 0.5, "gelu_tanh": 0.5, "identity": 1.0}.get(getattr(SCORE, "__name__", ""), 0.0)


@triton.constexpr_function
def takes_folded(SCORE, FOLD=True):
    """Whether a kernel takes SCORE's folded form: it has one, and FOLD (the backward's: fold_backward). The weights
    (weights, bwd_weights) and the factor that undoes C k (out_factor, dv_factor) ask the same question."""
    return bool(FOLD) and weight_coeff(SCORE) != 0.0


def score_fn(activation: str):
    """The kernels' SCORE constexpr of a score function's name."""
    return SOFTMAX if activation == "softmax" else ACTIVATIONS[activation]


def score_scale(scale: float, activation: str) -> float:
    """What the kernels multiply a score q . k by: into base-2 logits for softmax, the plain scale otherwise."""
    return scale * math.log2(math.e) if activation == "softmax" else scale


def score_args(p) -> tuple:
    """The kernels' run-time score group of a jfa.problem.Problem: (qk_scale, out_scale, grad_scale), the factor of
    the scores, of an activation's output (a per-row scale is applied outside the kernels, jfa.bwd_common), and of
    dK and dQ (with an activation, the constant out scale folded in: dV takes out_scale, dv_factor)."""
    qk_scale = score_scale(p.scale, p.activation)  # (floats: Triton specializes an int equal to 1 as a constexpr)
    return (float(qk_scale), float(p.out_scale), float(p.scale if p.softmax else p.scale * p.out_scale))


@triton.constexpr_function
def has_lse(SCORE):
    """Whether the score has row statistics: the forward stores the rows' lse, the backward reads LSE and Delta."""
    return SCORE == SOFTMAX.value


# ---- the forward

@triton.jit
def row_state(rows):
    """The running row state before the first block, from a float32 vector of zeros of the rows' shape: (row max of
    the raw scores, row sum); an activation keeps none (it passes the state through unread)."""
    return rows + float("-inf"), rows


@triton.constexpr_function
def masks_scores(SCORE):
    """Where the forward hides a pair that is not visible: before the weights, as a -inf score (softmax), or after
    them, as a 0 weight (an activation). (A kernel asks, so that the mask's test is computed where it is used.)"""
    return SCORE == SOFTMAX.value


@triton.jit
def hide(x, vis, SCORE: tl.constexpr):
    """Scores (masks_scores) or weights x with the pairs outside vis hidden: -inf scores or 0 weights."""
    if SCORE == SOFTMAX:
        return tl.where(vis, x, float("-inf"))
    else:
        return tl.where(vis, x, 0.0)


@triton.jit
def weights(s, state, score, SCORE: tl.constexpr, FIRST: tl.constexpr = False, EMPTY_ROWS: tl.constexpr = True,
            FAST: tl.constexpr = True):
    """One key block's scores s -> (P, the new state, alpha). Softmax: the online softmax in base 2 (state: row max
    of s and row sum; alpha: what to rescale the earlier sum by; FIRST: the first block, nothing summed before;
    EMPTY_ROWS: a row may have seen nothing yet, whose P and alpha must be 0, not NaN). An activation: f(s qk_scale)
    (or its folded form's f / (C qk_scale)), the state passed through, alpha 1 (the rescale folds away)."""
    qk_scale = score[0]
    m_i, l_i = state
    if SCORE == SOFTMAX:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if EMPTY_ROWS:
            m_scaled = tl.where(m_new == float("-inf"), 0.0, m_new * qk_scale)
        else:
            m_scaled = m_new * qk_scale
        p = tl.exp2(s * qk_scale - tl.expand_dims(m_scaled, 1))
        alpha = tl.exp2(m_i * qk_scale - m_scaled)
        if FIRST:
            l_i = tl.sum(p, 1)
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
        return p, (m_new, l_i), alpha
    else:
        if takes_folded(SCORE):
            p, _ = folded(SCORE)(s, qk_scale, FAST)  # (out_factor puts C k on O)
        else:
            p, _ = SCORE(s * qk_scale, FAST)
        return p, state, tl.where(True, 1.0, m_i)


@triton.jit
def out_factor(state, score, SCORE: tl.constexpr):
    """The rows' factor on the summed P V: softmax's 1 / row sum (1 for a row that saw no key: its O is 0), an
    activation's out scale (times C k where the weights are f(x) / (C k): folded), dV's factor (dv_factor)."""
    m_i, l_i = state
    if SCORE == SOFTMAX:
        return 1.0 / tl.where(l_i > 0.0, l_i, 1.0)
    else:  # (the forward always takes the folded form where there is one)
        return tl.where(True, dv_factor(score, SCORE), l_i)


@triton.jit
def lse(state, score):
    """Softmax's natural-log LSE of the rows (has_lse); -inf for a row that saw no key."""
    m_i, l_i = state
    seen = l_i > 0.0
    return tl.where(seen, (m_i * score[0] + tl.log2(tl.where(seen, l_i, 1.0))) * LN2, float("-inf"))


# ---- the backward

@triton.jit
def bwd_weights(s, lse2, score, SCORE: tl.constexpr, FAST: tl.constexpr = True, FOLD: tl.constexpr = True):
    """A block's scores s -> (P, into dV; G, dP's factor in dS): softmax's P = exp2(s qk_scale - lse2) (lse2 = log2(e)
    LSE broadcast to s's shape; G unused, P again), an activation's (f, f')(s qk_scale) (lse2 unread, None), or its
    folded form's where it has one and FOLD (dv_factor then takes the same FOLD; see fold_backward)."""
    if SCORE == SOFTMAX:
        p = tl.exp2(s * score[0] - lse2)
        return p, p
    elif takes_folded(SCORE, FOLD):
        return folded(SCORE)(s, score[0], FAST)  # (dv_factor puts C k on dV)
    else:
        return SCORE(s * score[0], FAST)


@triton.jit
def mask_grads(p, g, vis, SCORE: tl.constexpr):
    """(P, G) with the pairs outside vis at 0 (softmax's G is unused)."""
    if SCORE == SOFTMAX:
        p = tl.where(vis, p, 0.0)
        return p, p
    else:
        return tl.where(vis, p, 0.0), tl.where(vis, g, 0.0)


@triton.jit
def dscores(p, dp, g, delta, SCORE: tl.constexpr):
    """dS of a block from P, dP = dO V^T and G: softmax's P (dP - Delta) (delta broadcast to p's shape; 0 wherever P
    is), an activation's G dP (delta unread, None)."""
    if SCORE == SOFTMAX:
        if delta is None:  # (dp already holds dP - Delta: the Hopper one pass's dP^T accumulator starts at -Delta)
            return p * dp
        else:
            return p * (dp - delta)
    else:
        return g * dp


@triton.jit
def dv_factor(score, SCORE: tl.constexpr, FOLD: tl.constexpr = True):
    """dV's factor: an activation's constant out scale (times C k where bwd_weights, with the same FOLD, took the folded
    form's f(x) / (C k); dK's and dQ's is grad_scale), 1 for softmax (folds away)."""
    if takes_folded(SCORE, FOLD):
        return score[1] * (weight_coeff(SCORE) * score[0])
    else:
        return out_scale(score, SCORE)


@triton.jit
def out_scale(score, SCORE: tl.constexpr):
    """An activation's constant out scale, 1 for softmax: the factor of dS in dL/dscore (beside the scale)."""
    if SCORE == SOFTMAX:
        return 1.0
    else:
        return score[1]
