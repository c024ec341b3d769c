"""Other attention kernels behind jfa's signatures (jfa.jagged_attention's, or with broadcast_of, jfa.broadcast
attention's), written once for the end-to-end model (jfa.models, through jfa.nn's ``attention``) and the bench
(jfa.bench.peer_providers): each called as its own users call it. Benchmark peers only, never a dependency: each is
imported when called.

  fa2_attention      torch.nn.attention.varlen.varlen_attn (FlashAttention 2 inside PyTorch; CUDA)
  fa4_attention      flash_attn.cute.flash_attn_varlen_func (flash-attn-4, its sm90 path on Hopper; when installed)
  PaddedSDPA         F.scaled_dot_product_attention on [B, H, L, D] copies with a boolean mask (any device); with
                     an activation, the same formula written out in PyTorch (eager, or compiled: torch.compile)
  hstu_attention     HSTU's Triton kernel (meta-recsys/generative-recommenders, when importable: scripts/carry_hstu.sh)
                     for silu attention, causal, with a 1 / N out scale
  hstu_cuda_attention  HSTU's CUDA kernel (FA3-based, sm_90a; built by scripts/build_hstu_cuda.sh), the same terms
  hstu3_cuda_attention  NVIDIA's HSTU kernel (pytorch/FBGEMM experimental/hstu, "HSTU-3", sm_90a; built by
                     scripts/build_hstu3_cuda.sh), the same terms without a window
  gdpa_attention     GDPA's Triton kernel (ads_model_kernel_library, when importable: scripts/carry_gdpa.sh) for
                     activation attention without a causal mask
  broadcast_of(f)    broadcast q for a kernel that has no such mode: q repeated per sequence (timed with it)
"""
from __future__ import annotations

import functools
import inspect
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from .jagged import causal_window, pair_mask, target_mask
from .nested import from_padded, to_padded
from .reference import ACTIVATIONS


def kv_per_q_head(q, k, v):
    """k and v repeated per query head (GQA for a kernel that has none: each query head's k/v head, packed)."""
    if q.shape[1] == k.shape[1]:
        return k, v
    return tuple(x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))


def _max_len(offsets, max_len):
    return int((offsets[1:] - offsets[:-1]).max()) if max_len is None else max_len


@functools.lru_cache(maxsize=None)
def varlen_params() -> frozenset:
    from torch.nn.attention.varlen import varlen_attn
    return frozenset(inspect.signature(varlen_attn).parameters)


def fa2_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                  window=(-1, -1), scale=None):
    """torch's varlen_attn (FA2); GQA through enable_gqa where torch has it, else k/v repeated per q head."""
    from torch.nn.attention.varlen import varlen_attn
    kv_offsets = q_offsets if kv_offsets is None else kv_offsets
    kw = {"scale": scale}
    left, right = causal_window(causal, window)
    if (left, right) != (-1, -1):
        kw["window_size"] = (left, right)
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in varlen_params():
            kw["enable_gqa"] = True
        else:
            k, v = kv_per_q_head(q, k, v)
    return varlen_attn(q, k, v, q_offsets.to(torch.int32), kv_offsets.to(torch.int32), _max_len(q_offsets, max_q_len),
                       _max_len(kv_offsets, max_kv_len), **kw)


def fa4_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                  window=(-1, -1), scale=None):
    """flash-attn-4's varlen function (its sm90 path on Hopper)."""
    from flash_attn.cute import flash_attn_varlen_func
    kv_offsets = q_offsets if kv_offsets is None else kv_offsets
    left, right = causal_window(causal, window)
    is_causal = (left, right) == (-1, 0)
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=q_offsets.to(torch.int32),
                                 cu_seqlens_k=kv_offsets.to(torch.int32), max_seqlen_q=_max_len(q_offsets, max_q_len),
                                 max_seqlen_k=_max_len(kv_offsets, max_kv_len), softmax_scale=scale, causal=is_causal,
                                 window_size=(None, None) if is_causal else
                                 (None if left < 0 else left, None if right < 0 else right))
    return out[0] if isinstance(out, tuple) else out


def padded_formula(q, k, v, mask, scale, activation, out_scale, bias=None):
    """An activation's attention as users write it in PyTorch: [B, H, L, D] operands, a [B, 1, Lq, Lk] mask, a bias
    added to the scores ([B, 1 or H, Lq, Lk], or None)."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias
    p = ACTIVATIONS[activation][0](s).masked_fill(~mask, 0.0)
    out = torch.matmul(p.to(v.dtype), v)
    return out * out_scale


@functools.lru_cache(maxsize=None)
def _compiled_formula():
    return torch.compile(padded_formula, dynamic=False)


class PaddedSDPA:
    """Dense attention over padded copies: made once per batch (the mask, from jfa.jagged's rule, bottom-right
    aligned), called per layer with packed q, k, v -> packed out. Softmax by F.scaled_dot_product_attention (a row
    that sees no key sees key 0 instead: SDPA would give NaN; jfa gives 0 there); an activation by padded_formula,
    compiled with torch.compile when compiled=True. GQA repeats k and v per query head for the formula. rel_bias (a
    jfa.RelativeBias, self-attention): its entries' indices made once per batch, the dense [B, H, Lq, Lk] bias
    gathered from the tables per call (as HSTU's module builds it), added to the scores."""

    def __init__(self, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False, window=(-1, -1),
                 activation="softmax", out_scale=1.0, compiled=False, num_targets=None, contextual_len=0,
                 rel_bias=None):
        self.q_offsets = q_offsets
        self.kv_offsets = q_offsets if kv_offsets is None else kv_offsets
        self.lq, self.lk = _max_len(q_offsets, max_q_len), _max_len(self.kv_offsets, max_kv_len)
        self.q_lens = q_offsets[1:] - q_offsets[:-1]
        self.kv_lens = self.kv_offsets[1:] - self.kv_offsets[:-1]
        device = q_offsets.device
        i = torch.arange(self.lq, device=device).view(1, self.lq, 1)
        j = torch.arange(self.lk, device=device).view(1, 1, self.lk)
        if num_targets is not None:  # HSTU's mask: the queries are each sequence's last rows
            shift = (self.kv_lens - self.q_lens).view(-1, 1, 1)
            mask = target_mask(i + shift, j, self.kv_lens.view(-1, 1, 1), num_targets.view(-1, 1, 1).long(),
                               contextual_len, causal_window(causal, window)[0])
        else:
            mask = pair_mask(i, j, self.q_lens.view(-1, 1, 1), self.kv_lens.view(-1, 1, 1),
                             *causal_window(causal, window))
        if activation == "softmax":
            mask = mask | (~mask.any(-1, keepdim=True) & (j == 0))
        self.mask = mask.unsqueeze(1)  # [B, 1, Lq, Lk]
        self.activation, self.out_scale, self.compiled = activation, out_scale, compiled
        self.rel_bias, self.entries = rel_bias, None
        if rel_bias is not None:  # each padded pair's table entries (padding reads entry 0: masked anyway)
            p, nb = (rel_bias.position.shape[-1] + 1) // 2, rel_bias.time.shape[-1] - 1
            qt, _ = to_padded(rel_bias.q_times.view(-1, 1), q_offsets, self.lq)
            kt, _ = to_padded(rel_bias.k_times.view(-1, 1), self.kv_offsets, self.lk)
            dt = (qt.view(-1, self.lq, 1) - kt.view(-1, 1, self.lk)).abs().clamp(min=1).double()
            self.entries = ((j - i).clamp(1 - p, p - 1) + (p - 1),
                            torch.floor(torch.log(dt) / rel_bias.time_divisor).clamp(0, nb).long())
        if isinstance(out_scale, torch.Tensor):  # per output row: to the padded layout [B, 1, Lq, 1]
            self.out_scale = to_padded(out_scale.view(-1, 1), q_offsets, self.lq)[0].view(-1, 1, self.lq, 1)

    def __call__(self, q, k, v, scale=None):
        qp, _ = to_padded(q, self.q_offsets, self.lq)
        kp, _ = to_padded(k, self.kv_offsets, self.lk)
        vp, _ = to_padded(v, self.kv_offsets, self.lk)
        qp, kp, vp = qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2)
        bias = None
        if self.rel_bias is not None:  # [B, 1 or Hq, Lq, Lk] (a table per head: [Hq, L])
            pos, tim = self.rel_bias.position, self.rel_bias.time
            bias = pos[..., self.entries[0]] + tim[..., self.entries[1]]
            bias = bias.unsqueeze(1) if pos.dim() == 1 else bias.transpose(0, 1)
        if self.activation == "softmax":
            mask = self.mask
            if bias is not None:
                mask = bias.to(qp.dtype).masked_fill(~self.mask, float("-inf"))
            out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=scale,
                                                 enable_gqa=q.shape[1] != k.shape[1])
        else:
            kp, vp = kv_per_q_head(qp, kp, vp)  # ([B, H, L, D]: heads on dim 1 too)
            formula = _compiled_formula() if self.compiled else padded_formula
            scale = q.shape[-1] ** -0.5 if scale is None else scale
            out = formula(qp, kp, vp, self.mask, scale, self.activation, self.out_scale,
                          None if bias is None else bias.to(qp.dtype))
        return from_padded(out.transpose(1, 2), self.q_lens)[0]


def padded_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                     window=(-1, -1), scale=None, activation="softmax", out_scale=1.0, num_targets=None,
                     contextual_len=0):
    """PaddedSDPA made and called at once: a model's layer without a jagged kernel."""
    return PaddedSDPA(q_offsets, kv_offsets, max_q_len=max_q_len, max_kv_len=max_kv_len, causal=causal,
                      window=window, activation=activation, out_scale=out_scale, num_targets=num_targets,
                      contextual_len=contextual_len)(q, k, v, scale)


# HSTU's training kernels' autotune configs that run on the H200 (BLOCK_M, BLOCK_N, num_warps, num_stages,
# SEQUENCE_PARALLEL): with its whole lists, autotuning faults (illegal memory access) under triton 3.6 and CUDA 13
# (triton-lang/triton#10573 reports such faults in attention backwards from 3.6 on). Its serving kernel runs as is.
HSTU_RUNNING_CONFIGS = {
    "_hstu_attn_fwd": {(128, 64, 8, 2, None), (128, 64, 4, 2, None), (64, 64, 8, 4, None), (128, 128, 4, 4, None)},
    "_hstu_attn_bwd": {(64, 64, 8, 2, False), (32, 128, 8, 2, False), (32, 128, 8, 3, False), (64, 64, 4, 2, True)},
}


@functools.lru_cache(maxsize=None)
def hstu_triton():
    """HSTU's Triton attention module (scripts/carry_hstu.sh), its training kernels' autotune cut to
    HSTU_RUNNING_CONFIGS (UNROLL 1, no TLX)."""
    import generative_recommenders.ops.triton.triton_hstu_attention as module
    for name, keep in HSTU_RUNNING_CONFIGS.items():
        tuner = getattr(module, name)
        tuner.configs = [c for c in tuner.configs
                         if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages,
                             c.kwargs.get("SEQUENCE_PARALLEL")) in keep
                         and c.kwargs.get("UNROLL", 1) == 1 and not c.kwargs.get("USE_TLX", False)]
        if len(tuner.configs) != len(keep):
            raise RuntimeError(f"HSTU's {name} has {len(tuner.configs)} of the {len(keep)} configs that run here")
    return module


def hstu_available() -> str | None:
    """None, or why HSTU's Triton kernel cannot be imported here."""
    try:
        hstu_triton()
    except Exception as e:  # ImportError, an incompatible triton, or other autotune lists
        return f"{type(e).__name__}: {str(e)[:120]} (scripts/carry_hstu.sh)"
    return None


def hstu_refusal(self_attention, right, activation, out_scale, max_len, what="self-attention") -> str | None:
    """None, or why HSTU's kernel cannot compute this: it takes causal silu self-attention (what: the kind its
    kernel takes) scaled by 1 / N, where N (its MAX_SEQ_LEN, which sizes its grid) is at least the longest
    sequence."""
    n = 0 if isinstance(out_scale, torch.Tensor) or out_scale <= 0 else round(1.0 / out_scale)
    if not self_attention or right != 0 or activation != "silu" or n <= 0 or abs(n * out_scale - 1.0) > 1e-6:
        return f"HSTU's kernel takes causal silu {what} with out_scale 1 / N only"
    if n < max_len:
        return f"HSTU's kernel covers N = 1 / out_scale = {n} rows a sequence, fewer than the longest ({max_len})"
    return None


def hstu_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                   window=(-1, -1), scale=None, activation="softmax", out_scale=1.0, num_targets=None,
                   contextual_len=0):
    """HSTU's kernel: self-attention only, causal, silu with out_scale 1 / N (N an int); window (W, 0) is its
    max_attn_len. Its own GQA has none: k and v are repeated per query head."""
    left, right = causal_window(causal, window)
    refusal = hstu_refusal(kv_offsets is None or kv_offsets is q_offsets, right, activation, out_scale,
                           _max_len(q_offsets, max_q_len))
    if refusal:
        raise ValueError(refusal)
    n = round(1.0 / out_scale)
    k, v = kv_per_q_head(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    targets = None if num_targets is None else num_targets.to(torch.int64)
    return hstu_triton().triton_hstu_mha(n, scale, q, k, v, q_offsets.to(torch.int64), targets, max(left, 0),
                                         contextual_len)


HSTU_CUDA_LIB = Path(__file__).resolve().parents[1] / ".peers" / "hstu_cuda" / "hstu_C.so"


def hstu_cuda_available() -> str | None:
    """None, or why HSTU's CUDA kernel (its FA3-based one, built by scripts/build_hstu_cuda.sh into .peers/) is not
    here: loaded once, it registers torch.ops.hstu.hstu_mha."""
    if hasattr(torch.ops.hstu, "hstu_mha"):
        return None
    if not HSTU_CUDA_LIB.exists():
        return f"no {HSTU_CUDA_LIB.relative_to(HSTU_CUDA_LIB.parents[2])} (scripts/build_hstu_cuda.sh)"
    try:
        torch.ops.load_library(str(HSTU_CUDA_LIB))
    except Exception as e:  # an ABI or CUDA mismatch
        return f"{type(e).__name__}: {str(e)[:120]}"
    return None if hasattr(torch.ops.hstu, "hstu_mha") else "its library registers no hstu_mha"


def hstu_cuda_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                        window=(-1, -1), scale=None, activation="softmax", out_scale=1.0, num_targets=None,
                        contextual_len=0):
    """HSTU's CUDA kernel (torch.ops.hstu.hstu_mha, with its own autograd), called as cuda_hstu_mha calls it: the
    terms of hstu_refusal (causal silu self-attention, out_scale 1 / N with N its max_seq_len); int32 offsets and
    targets; k and v repeated per query head (no GQA)."""
    left, right = causal_window(causal, window)
    refusal = hstu_refusal(kv_offsets is None or kv_offsets is q_offsets, right, activation, out_scale,
                           _max_len(q_offsets, max_q_len))
    if refusal:
        raise ValueError(refusal)
    k, v = kv_per_q_head(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    targets = None if num_targets is None else num_targets.to(torch.int32)
    return torch.ops.hstu.hstu_mha(round(1.0 / out_scale), scale, q, k, v, q_offsets.to(torch.int32), True, targets,
                                   None, max(left, 0), 0, contextual_len, None, None, None, False, False)


HSTU3_DIR = Path(__file__).resolve().parents[1] / ".peers" / "hstu3_cuda"


@functools.lru_cache(maxsize=None)
def hstu3_cuda():
    """NVIDIA's HSTU package (its hstu_attn_varlen_func, an autograd.Function over torch.ops.fbgemm.hstu_varlen_*_90),
    imported from .peers/hstu3_cuda (scripts/build_hstu3_cuda.sh) under the name fbgemm_hstu; its library.py loads
    the built .so on import."""
    import importlib.util
    import sys
    init = HSTU3_DIR / "hstu" / "__init__.py"
    spec = importlib.util.spec_from_file_location("fbgemm_hstu", init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["fbgemm_hstu"] = module  # (its modules import each other relatively)
    spec.loader.exec_module(module)
    return module


def hstu3_cuda_available() -> str | None:
    """None, or why NVIDIA's HSTU kernel is not here."""
    lib = HSTU3_DIR / "hstu" / "fbgemm_gpu_experimental_hstu.so"
    if not lib.exists():
        return f"no {lib.relative_to(HSTU3_DIR.parents[1])} (scripts/build_hstu3_cuda.sh)"
    try:
        hstu3_cuda()
    except Exception as e:  # an ABI or CUDA mismatch
        return f"{type(e).__name__}: {str(e)[:120]}"
    return None if hasattr(torch.ops.fbgemm, "hstu_varlen_fwd_90") else "its library registers no hstu_varlen_fwd_90"


def hstu3_refusal(self_attention, left, right, activation, out_scale) -> str | None:
    """None, or why NVIDIA's HSTU kernel as built (scripts/build_hstu3_cuda.sh: causal, context and targets; no
    window) cannot compute this: causal silu self-attention, out_scale 1 / N for an int N (its scaling_seqlen)."""
    return hstu_refusal(self_attention, right, activation, out_scale, 0) or (
        "NVIDIA's HSTU kernel is built without windows (HSTU_DISABLE_LOCAL)" if left >= 0 else None)


def hstu3_cuda_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                         window=(-1, -1), scale=None, activation="softmax", out_scale=1.0, num_targets=None,
                         contextual_len=0):
    """NVIDIA's HSTU kernel as its users call it (hstu_attn_varlen_func): silu(alpha q k^T) v / scaling_seqlen, alpha
    = scale, scaling_seqlen = N = 1 / out_scale; causal as window (-1, 0); int32 offsets, targets and contexts per
    sequence (its context: a sequence's first rows see every key before its targets, as HSTU's); k and v repeated
    per query head (no GQA)."""
    left, right = causal_window(causal, window)
    refusal = hstu3_refusal(kv_offsets is None or kv_offsets is q_offsets, left, right, activation, out_scale)
    if refusal:
        raise ValueError(refusal)
    k, v = kv_per_q_head(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    offsets = q_offsets.to(torch.int32)
    max_len = _max_len(q_offsets, max_q_len)
    batch = offsets.numel() - 1
    targets = None if num_targets is None else num_targets.to(torch.int32)
    contexts = None if not contextual_len else torch.full((batch, ), contextual_len, dtype=torch.int32,
                                                          device=q.device)
    return hstu3_cuda().hstu_attn_varlen_func(q, k, v, offsets, offsets, None, None, max_len, max_len,
                                              round(1.0 / out_scale), contexts, targets, 1, (-1, 0), scale)


def hstu_cached_refusal(q_lens, right, activation, out_scale, max_len) -> str | None:
    """None, or why HSTU's cached kernel (serving) cannot compute this: besides hstu_refusal's terms, every
    sequence's queries are its last rows, one count for all (its DeltaSize: rows // B)."""
    refusal = hstu_refusal(True, right, activation, out_scale, max_len, what="attention")
    if refusal:
        return refusal
    if len(q_lens) and bool((q_lens != q_lens[0]).any()):
        return "HSTU's cached kernel takes the same number of new rows for every sequence"
    return None


def hstu_cached_attention(q, k, v, q_offsets, kv_offsets, *, max_q_len=None, max_kv_len=None, causal=False,
                          window=(-1, -1), scale=None, activation="softmax", out_scale=1.0, num_targets=None,
                          contextual_len=0):
    """HSTU's cached kernel (triton_cached_hstu_mha, serving): each sequence's last Lq rows (one Lq for all) as
    queries against the whole sequence, causal silu with out_scale 1 / N; checked by hstu_cached_refusal on the
    caller's side (it reads the lengths). k and v are repeated per query head (no GQA)."""
    left, _ = causal_window(causal, window)
    k, v = kv_per_q_head(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    targets = None if num_targets is None else num_targets.to(torch.int64)
    return hstu_triton().triton_cached_hstu_mha(round(1.0 / out_scale), scale, q, k, v, kv_offsets.to(torch.int64),
                                  num_targets=targets, max_attn_len=max(left, 0), contextual_seq_len=contextual_len)


# jfa's score functions by GDPA's names (gdpa/triton/math.py's Activation; "raw" is the identity)
GDPA_ACTIVATIONS = {"identity": "raw", "gelu": "gelu", "gelu_tanh": "gelu_approx", "relu": "relu",
                    "relu2": "relu_square", "silu": "silu"}


def gdpa_available() -> str | None:
    """None, or why GDPA's Triton kernel cannot be imported here (scripts/carry_gdpa.sh puts it in .peers/)."""
    try:
        _gdpa_module()
    except Exception as e:  # ImportError, no CUDA (its import reads the device), an incompatible triton
        return f"{type(e).__name__}: {str(e)[:120]} (scripts/carry_gdpa.sh)"
    return None


@functools.lru_cache(maxsize=None)
def _gdpa_module():
    # its own cut of the autotune lists (8 forward, 3 backward configs), read when the module is imported
    os.environ.setdefault("GDPA_AUTOTUNE_CONFIG_SET", "omnifm_v2")
    import ads_mkl.ops.oss.gdpa.triton.triton_generalized_dot_product_attention as module
    return module


def gdpa_refusal(activation, window, out_scale) -> str | None:
    """None, or why GDPA's kernel cannot compute this: an activation (not softmax) it has, no causal mask, a window
    only if symmetric (|i - j| <= W), one output scale for every row."""
    if activation not in GDPA_ACTIVATIONS:
        return f"GDPA's kernel has no {activation} (it takes {', '.join(GDPA_ACTIVATIONS)})"
    left, right = window
    if left != right:
        return "GDPA's kernel takes no causal mask, and only symmetric windows"
    if isinstance(out_scale, torch.Tensor):
        return "GDPA's kernel takes one output scale, not one a row"
    return None


def gdpa_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                   window=(-1, -1), scale=None, activation="silu", out_scale=1.0, broadcast=False, persistent=False):
    """GDPA's Triton kernel (generalized_dot_product_attention, its own autograd): f(scale q k^T) v times out_scale.
    It takes no pre-activation scale (its users fold 1/sqrt(D) into a projection): the scale multiplies the
    smaller of q and k here, a pass timed with the call. broadcast: q [Lq, H, D] against every sequence (its
    broadcast_q), out [B * Lq, H, D]; persistent: its persistent forward."""
    left, right = causal_window(causal, window)
    refusal = gdpa_refusal(activation, (left, right), out_scale)
    if refusal:
        raise ValueError(refusal)
    kv_offsets = q_offsets if kv_offsets is None else kv_offsets
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if scale != 1.0:
        if q.shape[0] <= k.shape[0]:
            q = q * scale
        else:
            k = k * scale
    out_offsets = None
    if broadcast:  # every sequence reads q's rows [0, Lq) and writes rows b * Lq of the output (its output_offset)
        lq = q.shape[0]
        q_offsets = torch.tensor([0, lq], device=q.device, dtype=kv_offsets.dtype)
        out_offsets = torch.arange(kv_offsets.numel(), device=q.device, dtype=kv_offsets.dtype) * lq
    return _gdpa_module().generalized_dot_product_attention(
        q, k, v, q_offsets, kv_offsets, q.shape[0] if broadcast else _max_len(q_offsets, max_q_len),
        _max_len(kv_offsets, max_kv_len), qk_scale=out_scale, output_offset=out_offsets,
        window_size=None if left < 0 else left, broadcast_q=broadcast, activation=GDPA_ACTIVATIONS[activation],
        enable_persistent=persistent, enable_tma=False)


def broadcast_rows(q, kv_offsets):
    """Broadcast q as these libraries' users run it: q repeated per sequence, [B * Lq, H, D], and its offsets."""
    batch, lq = kv_offsets.numel() - 1, q.shape[0]
    rows = q.unsqueeze(0).expand(batch, -1, -1, -1).reshape(batch * lq, q.shape[1], q.shape[2])
    return rows, torch.arange(batch + 1, device=q.device, dtype=torch.int32) * lq


def broadcast_of(attention):
    """jfa.broadcast_attention's signature over a jagged kernel: q repeated per sequence (timed with it)."""
    def broadcast(q, k, v, kv_offsets, *, max_kv_len=None, causal=False, window=(-1, -1), scale=None, **score):
        rows, q_offsets = broadcast_rows(q, kv_offsets)
        out = attention(rows, k, v, q_offsets, kv_offsets, max_q_len=q.shape[0], max_kv_len=max_kv_len,
                        causal=causal, window=window, scale=scale, **score)
        return out.view(kv_offsets.numel() - 1, q.shape[0], q.shape[1], q.shape[2])
    return broadcast


KERNELS = {  # impl -> (jagged attention, broadcast attention) for jfa.nn's `attention`; None: jfa's own
    "jfa": (None, None),
    "fa2": (fa2_attention, broadcast_of(fa2_attention)),
    "fa4": (fa4_attention, broadcast_of(fa4_attention)),
    "padded": (padded_attention, broadcast_of(padded_attention)),
    "hstu": (hstu_attention, None),
    "hstu-cuda": (hstu_cuda_attention, None),
    "hstu3-cuda": (hstu3_cuda_attention, None),
    "gdpa": (gdpa_attention, None),
}
