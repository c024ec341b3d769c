"""The peers' providers (jfa.bench.providers says what a provider is): other attention kernels, each called the way
its own users call it, through jfa.peers.

  fa2            torch.nn.attention.varlen.varlen_attn (FlashAttention 2 inside PyTorch)
  fa4            flash_attn.cute.flash_attn_varlen_func (flash-attn-4), when it imports
  flex           torch.compile(flex_attention) with a document-id block mask
  sdpa-padded    dense scaled_dot_product_attention on [B, H, Lmax, D] with a boolean mask; with an activation,
                 its formula written out in PyTorch on the same padded tensors (jfa.peers.PaddedSDPA)
  compiled-padded  the same formula under torch.compile (activation workloads)
  hstu, hstu-cuda  HSTU's Triton and CUDA kernels (causal silu self-attention, out scale 1 / N)
  hstu3-cuda       NVIDIA's HSTU kernel (FBGEMM's experimental/hstu: the same terms, no window)
  hstu-cached    HSTU's cached Triton kernel (serving, forward only)
  gdpa, gdpa-persistent  GDPA's Triton kernel (activations, no causal mask)
  fa4-softmax    FA4 in softmax on an activation workload's shape (a yardstick: not in the ratios)
The FlashAttention peers and Flex compute softmax only: they skip activation workloads.
"""
from __future__ import annotations

import inspect
import time

import torch

from jfa import peers
from jfa.jagged import UNBOUNDED

from .providers import Provider, expand_q, peer_checks, sync
from .suite import Inputs


class TorchVarlen(Provider):
    """FlashAttention 2 as shipped in PyTorch: torch.nn.attention.varlen.varlen_attn."""
    name = "fa2"
    needs = "a CUDA build of torch with torch.nn.attention.varlen (2.10 and later)"

    def skip_reason(self, inp):
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError as e:
            return f"torch {torch.__version__} has no torch.nn.attention.varlen ({e})"
        params = inspect.signature(varlen_attn).parameters
        if inp.window != (-1, -1) and "window_size" not in params:
            return f"varlen_attn of torch {torch.__version__} takes no window_size"
        if inp.workload.head_dim > 256 or inp.workload.head_dim % 8:
            return f"head dim {inp.workload.head_dim} not supported by FA2"
        return peer_checks(inp, softmax_only=True, windows_only=True)

    def build(self, inp):
        w = inp.workload
        group = w.heads_q // w.heads_kv

        max_q, max_kv, window = inp.max_q, inp.max_kv, inp.window  # (read once: not the timed call's work)

        def fn():
            return peers.fa2_attention(expand_q(inp), inp.k, inp.v, inp.q_offsets, inp.kv_offsets,
                                       max_q_len=max_q, max_kv_len=max_kv, window=window, scale=inp.scale)
        native = "enable_gqa" in peers.varlen_params()
        note = ("GQA: enable_gqa=True" if native else "GQA: k, v repeated per q head") if group > 1 else ""
        return fn, ({"note": note} if note else {})


def _fa4_missing() -> str | None:
    """Why flash_attn.cute cannot be used here, or None."""
    try:
        import flash_attn.cute  # noqa: F401
    except Exception as e:  # ImportError, or a broken CUDA/DSL install
        return f"flash_attn.cute does not import ({type(e).__name__}: {str(e)[:120]}); see scripts/fetch_fa4.sh"
    return None


class FA4(Provider):
    """flash-attn-4 (CuTe DSL): flash_attn.cute.flash_attn_varlen_func."""
    name = "fa4"
    needs = "flash-attn-4 (pip install 'jfa[peers]'; on the H200 without network: scripts/fetch_fa4.sh, then " \
            "scripts/bench.sh installs the carried wheels)"

    def skip_reason(self, inp):
        return _fa4_missing() or peer_checks(inp, softmax_only=True, windows_only=True)

    def build(self, inp):
        max_q, max_kv, window = inp.max_q, inp.max_kv, inp.window  # (read once: not the timed call's work)

        def fn():
            return peers.fa4_attention(expand_q(inp), inp.k, inp.v, inp.q_offsets, inp.kv_offsets,
                                       max_q_len=max_q, max_kv_len=max_kv, window=window, scale=inp.scale)
        return fn, {}


class FA4Softmax(FA4):
    """flash-attn-4 with softmax on an activation workload's shape (its window kept): the fastest softmax kernel
    beside jfa's activation, a yardstick rather than a peer computing the same (left out of the ratios). Its output
    is softmax attention's, so the gate holds it to that reference (check_like)."""
    name = "fa4-softmax"
    yardstick = True
    check_like = dict(activation="softmax", out_scale=1.0)

    def skip_reason(self, inp):
        if inp.workload.activation == "softmax":
            return "a softmax workload: fa4 itself"
        return _fa4_missing() or peer_checks(inp, windows_only=True)


_FLEX = None


def _compiled_flex():
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention
        # One static compile per workload shape (and per gate prefix): raise dynamo's recompile limit (8 by
        # default), past which it would silently fall back to the eager, unfused flex_attention.
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(64, getattr(torch._dynamo.config, knob)))
        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


def _doc_positions(lens: torch.Tensor, device):
    """(document id, position in its document) of every packed row, int32 on the device."""
    lens = lens.to(device)
    rows = int(lens.sum())
    doc = torch.repeat_interleave(torch.arange(lens.numel(), device=device), lens, output_size=rows)
    starts = torch.cumsum(lens, 0) - lens
    pos = torch.arange(rows, device=device) - starts[doc]
    return doc.to(torch.int32), pos.to(torch.int32)


def _flex_bias(inp: Inputs):
    """HSTU's relative bias as a FlexAttention score_mod over the packed rows (self-attention: a pair's position
    difference is its rows'), the tables captured (Flex differentiates them), the buckets computed per pair."""
    bias = inp.rel_bias()
    pos, tim, qt, kt = bias.position, bias.time, bias.q_times, bias.k_times
    p, nb, div = (pos.shape[0] + 1) // 2, tim.shape[0] - 1, bias.time_divisor

    def score_mod(score, b, h, q_idx, kv_idx):
        r = torch.clamp(kv_idx - q_idx, 1 - p, p - 1) + (p - 1)
        dt = torch.clamp(torch.abs(qt[q_idx] - kt[kv_idx]), min=1).to(torch.float32)
        bucket = torch.clamp(torch.floor(torch.log(dt) / div), 0, nb).to(torch.int64)
        return score + pos[r] + tim[bucket]
    return score_mod


class Flex(Provider):
    """FlexAttention: torch.compile(flex_attention) on the packed batch ([1, H, T, D]) with a document mask."""
    name = "flex"
    needs = "softmax workloads; a CUDA device for the backward"

    def skip_reason(self, inp):
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
        except ImportError as e:
            return f"no FlexAttention in torch {torch.__version__} ({e})"
        return peer_checks(inp, softmax_only=True, bias=True)

    def build(self, inp):
        from torch.nn.attention.flex_attention import create_block_mask
        device = inp.q.device
        left, right = inp.window
        doc_q, pos_q = _doc_positions(inp.q_lens, device)
        doc_k, pos_k = _doc_positions(inp.kv_lens, device)
        shift = (inp.kv_lens - inp.q_lens).to(device=device, dtype=torch.int32)
        ipos_q = pos_q + shift[doc_q]  # bottom-right aligned query position
        # The window as per-query key bounds, precomputed: a Python int inside mask_mod becomes a SymInt under
        # create_block_mask(_compile=True), which the vmap'd int32 tensor arithmetic rejects.
        lo_q = ipos_q - left if left >= 0 else None
        hi_q = ipos_q + right if right >= 0 else None
        if inp.num_targets is not None:  # HSTU's mask (jfa.jagged.target_mask): each row's position, and U
            c1 = max(inp.workload.contextual_len - 1, 0)
            u = (inp.kv_lens.to(device) - inp.num_targets.to(device=device, dtype=torch.int64) - c1).to(torch.int32)
            u_q = u[doc_q]
            hpos_q = torch.minimum(torch.clamp(ipos_q - c1, min=0), u_q)  # (the queries: the sequence's last rows)
            hpos_k = torch.minimum(torch.clamp(pos_k - c1, min=0), u[doc_k])
            w, ctx = (left if left >= 0 else UNBOUNDED), inp.workload.contextual_len > 0

            def mask_mod(b, h, q_idx, kv_idx):
                pi, pj = hpos_q[q_idx], hpos_k[kv_idx]
                d = pi - pj
                vis = (ipos_q[q_idx] == pos_k[kv_idx]) | ((d > 0) & (d <= w))
                if ctx:
                    vis = vis | ((pi == 0) & (pj < u_q[q_idx]))
                return (doc_q[q_idx] == doc_k[kv_idx]) & vis
        else:
            def mask_mod(b, h, q_idx, kv_idx):
                m = doc_q[q_idx] == doc_k[kv_idx]
                if lo_q is not None:
                    m = m & (pos_k[kv_idx] >= lo_q[q_idx])
                if hi_q is not None:
                    m = m & (pos_k[kv_idx] <= hi_q[q_idx])
                return m

        rows, tk = doc_q.numel(), doc_k.numel()
        times = []
        for _ in range(2):  # the first build compiles; the second is what a user pays per batch
            sync(device)
            t0 = time.perf_counter()
            block_mask = create_block_mask(mask_mod, None, None, rows, tk, device=device, _compile=True)
            sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
        flex = _compiled_flex()
        gqa = inp.workload.heads_q != inp.workload.heads_kv
        score_mod = _flex_bias(inp) if inp.tables else None

        def fn():
            q = expand_q(inp).transpose(0, 1).unsqueeze(0)  # [1, Hq, rows, D]
            k, v = inp.k.transpose(0, 1).unsqueeze(0), inp.v.transpose(0, 1).unsqueeze(0)
            out = flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=inp.scale, enable_gqa=gqa)
            return out[0].transpose(0, 1)
        return fn, {"build_ms": times[1], "build_first_ms": times[0]}


def sdpa_padded_bytes(inp: Inputs) -> int:
    """Rough peak bytes of the padded SDPA baseline: padded q/k/v/out and their grads, the mask, on the CPU (math
    kernel) or for an activation's formula the score matrices (scores, weights and their gradients), and with a
    relative bias its pairs' two table entries (int64) and the dense bias with its gradient (float32, per head)."""
    w, b = inp.workload, inp.batch
    elt = inp.q.element_size()
    padded = b * (inp.max_q * w.heads_q + 2 * inp.max_kv * w.heads_kv) * w.head_dim * elt * 3
    mask = b * inp.max_q * inp.max_kv * 3
    scores = 0
    if inp.q.device.type == "cpu" or w.activation != "softmax":
        scores = b * w.heads_q * inp.max_q * inp.max_kv * 4 * 3
    bias = b * inp.max_q * inp.max_kv * (16 + 8 * w.heads_q) if inp.tables else 0
    return padded + mask + scores + bias


class SdpaPadded(Provider):
    """The dense baseline: pad to [B, H, Lmax, D], run scaled_dot_product_attention with a boolean mask (an
    activation: its formula in PyTorch; compiled: under torch.compile)."""
    name = "sdpa-padded"
    compiled = False

    def skip_reason(self, inp):
        need = sdpa_padded_bytes(inp)
        if inp.q.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(inp.q.device)
            budget = int(0.6 * free)
        else:
            budget = 2 << 30
        if need > budget:
            return f"padded tensors and mask need ~{need / 2**30:.1f} GiB, over the {budget / 2**30:.1f} GiB budget"
        return None

    def build(self, inp):
        """The mask is made once per batch (jfa.peers.PaddedSDPA: as a model's layers would share it); padding q,
        k, v is timed."""
        w = inp.workload
        padded = peers.PaddedSDPA(inp.q_offsets, inp.kv_offsets, max_q_len=inp.max_q, max_kv_len=inp.max_kv,
                                  window=inp.window, activation=w.activation, out_scale=w.out_scale,
                                  compiled=self.compiled, num_targets=inp.num_targets,
                                  contextual_len=w.contextual_len, rel_bias=inp.rel_bias())

        def fn():
            return padded(expand_q(inp), inp.k, inp.v, inp.scale)
        return fn, {}


class CompiledPadded(SdpaPadded):
    """An activation's formula on padded tensors under torch.compile: what its users write today, compiled."""
    name = "compiled-padded"
    compiled = True

    def skip_reason(self, inp):
        if inp.workload.activation == "softmax":
            return "activation workloads only (softmax: sdpa-padded)"
        return super().skip_reason(inp)


class HSTU(Provider):
    """HSTU's Triton kernel (meta-recsys/generative-recommenders), called as its users call it (triton_hstu_mha)."""
    name = "hstu"
    needs = "generative-recommenders' ops on the path (scripts/carry_hstu.sh); causal silu self-attention"
    attention = staticmethod(peers.hstu_attention)  # (the kernel, and why it is not here: None when it is)
    available = staticmethod(peers.hstu_available)

    def skip_reason(self, inp):
        w = inp.workload
        return (peers.hstu_refusal(w.mode == "self", inp.window[1], w.activation, w.out_scale, inp.max_q)
                or self.available() or peer_checks(inp))

    def build(self, inp):
        w = inp.workload
        max_q, max_kv, window = inp.max_q, inp.max_kv, inp.window  # (read once: not the timed call's work)

        def fn():
            return self.attention(inp.q, inp.k, inp.v, inp.q_offsets, max_q_len=max_q, max_kv_len=max_kv,
                                  window=window, scale=inp.scale, activation=w.activation,
                                  out_scale=w.out_scale, num_targets=inp.num_targets, contextual_len=w.contextual_len)
        return fn, {"note": "k, v repeated per q head (no GQA)"} if w.heads_q != w.heads_kv else {}


class HSTUCuda(HSTU):
    """HSTU's CUDA kernel (generative-recommenders ops/cpp/hstu_attention, FlashAttention-3-based), as its users call
    it (cuda_hstu_mha)."""
    name = "hstu-cuda"
    needs = "scripts/build_hstu_cuda.sh (objects anywhere, link on the GPU machine); causal silu self-attention"
    attention = staticmethod(peers.hstu_cuda_attention)
    available = staticmethod(peers.hstu_cuda_available)


class HSTU3Cuda(HSTU):
    """NVIDIA's HSTU kernel (pytorch/FBGEMM fbgemm_gpu/experimental/hstu, "HSTU-3", FlashAttention-3-based), as its
    users call it (hstu_attn_varlen_func)."""
    name = "hstu3-cuda"
    needs = "scripts/build_hstu3_cuda.sh (objects anywhere, link on the GPU machine); causal silu self-attention"
    attention = staticmethod(peers.hstu3_cuda_attention)
    available = staticmethod(peers.hstu3_cuda_available)

    def skip_reason(self, inp):
        w = inp.workload
        return (peers.hstu3_refusal(w.mode == "self", inp.window[0], inp.window[1], w.activation, w.out_scale)
                or self.available() or peer_checks(inp))


class HSTUCached(Provider):
    """HSTU's cached Triton kernel (serving: the new rows against each cached history), as its users call it
    (triton_cached_hstu_mha)."""
    name = "hstu-cached"
    needs = "generative-recommenders' ops on the path (scripts/carry_hstu.sh); serving workloads (cross with targets)"
    forward_only = True  # (it has no backward)

    def skip_reason(self, inp):
        w = inp.workload
        if w.mode != "cross" or inp.num_targets is None:
            return "serving workloads only (cross-attention with HSTU's mask)"
        return (peers.hstu_cached_refusal(inp.q_lens.cpu(), inp.window[1], w.activation, w.out_scale, inp.max_kv)
                or peers.hstu_available() or peer_checks(inp))

    def build(self, inp):
        w = inp.workload

        def fn():
            return peers.hstu_cached_attention(inp.q, inp.k, inp.v, inp.q_offsets, inp.kv_offsets, window=inp.window,
                                               scale=inp.scale, activation=w.activation, out_scale=w.out_scale,
                                               num_targets=inp.num_targets, contextual_len=w.contextual_len)
        return fn, {"note": "forward only (serving)"}


def run_once(fn, inp: Inputs) -> None:
    """One forward and backward of fn on the inputs, the gradients dropped (a peer's autotuning, before the gate)."""
    fn().backward(inp.dout)
    for t in inp.leaves():
        t.grad = None


class Gdpa(Provider):
    """GDPA's Triton kernel (facebookresearch/ads_model_kernel_library gdpa/triton), as its users call it
    (generalized_dot_product_attention; its omnifm_v2 autotune set)."""
    name = "gdpa"
    needs = "ads_mkl's gdpa on the path (scripts/carry_gdpa.sh); activation attention without a causal mask"
    persistent = False

    def skip_reason(self, inp):
        w = inp.workload
        return (peers.gdpa_refusal(w.activation, inp.window, w.out_scale) or peers.gdpa_available()
                or peer_checks(inp, windows_only=True))

    def build(self, inp):
        w = inp.workload
        max_q, max_kv, window = inp.max_q, inp.max_kv, inp.window  # (read once: not the timed call's work)

        def fn():
            return peers.gdpa_attention(inp.q, inp.k, inp.v, inp.q_offsets, inp.kv_offsets, max_q_len=max_q,
                                        max_kv_len=max_kv, window=window, scale=inp.scale,
                                        activation=w.activation, out_scale=w.out_scale, broadcast=w.broadcast,
                                        persistent=self.persistent)
        # Autotuned once before the gate: its autotuning runs every config's backward into the same buffers, and
        # broadcast q's dQ (float32 atomic adds) keeps all of them on that first call (seen in the interpreter).
        run_once(fn, inp)
        return fn, {"note": "the scale applied to the smaller of q and k (a pass: GDPA takes no pre-activation scale)"}


class GdpaPersistent(Gdpa):
    """GDPA's Triton kernel with its persistent forward (enable_persistent)."""
    name = "gdpa-persistent"
    persistent = True


PEERS = (TorchVarlen, FA4, FA4Softmax, Flex, SdpaPadded, CompiledPadded, HSTU, HSTUCuda, HSTU3Cuda, HSTUCached, Gdpa,
         GdpaPersistent)
