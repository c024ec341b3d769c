"""The providers: jfa's backends and the peers, each called the way its own users call it.

A provider is asked ``skip_reason(inp)`` (None, or why it cannot run this workload here: not installed, no
CUDA, an unsupported mode) and then ``build(inp) -> (fn, extras)``: ``fn()`` runs the forward on the shared
leaf tensors ``inp.q, inp.k, inp.v`` and returns the output as ``[rows, Hq, D]`` in packed row order
(``rows = B * Lq`` in broadcast mode), differentiable, so that ``fn().backward(inp.dout)`` fills their
gradients. Whatever a user must do around the kernel (expanding the broadcast q, padding for SDPA,
repeating k/v heads where a peer has no GQA) happens inside ``fn`` and is timed; one-off set-up that a user
can cache (FlexAttention's block mask) happens in ``build`` and is reported in ``extras``.

  jfa-<backend>  every backend of jfa.backends.BACKENDS that takes the device, head dim and dtype
  jfa            backend="auto"
  jfa-softmax    jfa with softmax on an activation workload's shape: the speed an activation is held to (not a peer)
  fa2            torch.nn.attention.varlen.varlen_attn (FlashAttention 2 inside PyTorch)
  fa4            flash_attn.cute.flash_attn_varlen_func (flash-attn-4), when it imports
  flex           torch.compile(flex_attention) with a document-id block mask
  sdpa-padded    dense scaled_dot_product_attention on [B, H, Lmax, D] with a boolean mask; with an activation,
                 its formula written out in PyTorch on the same padded tensors (jfa.peers.PaddedSDPA)
  compiled-padded  the same formula under torch.compile (activation workloads)
  hstu           HSTU's Triton kernel (jfa.peers.hstu_attention: causal silu self-attention, out scale 1 / N)
  hstu-cached    HSTU's cached Triton kernel (jfa.peers.hstu_cached_attention: serving, forward only)
The FlashAttention peers and Flex compute softmax only: they skip activation workloads.
"""
from __future__ import annotations

import inspect
import time

import torch

import jfa
from jfa import peers
from jfa.backends import BACKENDS, available_backends
from jfa.jagged import UNBOUNDED, visible_pairs

from .suite import Inputs


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _expand_q(inp: Inputs):
    """Broadcast mode, as a peer's user does it: the dense q repeated per sequence, [B*Lq, Hq, D]."""
    return peers.broadcast_rows(inp.q, inp.kv_offsets)[0] if inp.workload.broadcast else inp.q


def _peer_checks(inp: Inputs, need_cuda=True, softmax_only=False, windows_only=False, bias=False):
    if inp.tables and not bias:
        return "no relative attention bias"
    if softmax_only and inp.workload.activation != "softmax":
        return f"softmax attention only (this workload's score is {inp.workload.activation})"
    if windows_only and inp.num_targets is not None:
        return "no target mask (HSTU's targets and contextual prefix)"
    if need_cuda and inp.q.device.type != "cuda":
        return "needs a CUDA device"
    if inp.q.dtype not in (torch.float16, torch.bfloat16):
        return f"takes fp16/bf16 only, not {inp.q.dtype}"
    return None


class Provider:
    name = "?"
    peer = True  # False for jfa's own providers (the ratios compare jfa with the fastest peer)
    needs = ""  # what it needs besides jfa's own install (`jfa bench --list`)
    forward_only = False  # (serving kernels: checked on the output, timed forward alone)

    def describe(self) -> str:
        """One line: what it is (its docstring's first sentence) and what it needs."""
        doc = " ".join((type(self).__doc__ or self.name).strip().split("\n\n")[0].split())
        return doc + (f" Needs: {self.needs}." if self.needs else "")

    def skip_reason(self, inp: Inputs) -> str | None:
        return None

    def build(self, inp: Inputs):
        raise NotImplementedError


class Jfa(Provider):
    """jfa.jagged_attention / broadcast_attention with both max lengths given (no host sync), one offsets tensor
    call after call (its schedule cached, as a model's layers share it)."""
    peer = False
    check_like: dict | None = None  # the call's score or mask arguments in place of the workload's (and the gate's)

    def describe(self) -> str:
        if type(self) is not Jfa:
            return super().describe()
        which = "the fastest backend here" if self.backend == "auto" else f"backend={self.backend!r}"
        return f"jfa, {which}, with both max lengths (no host sync) and one offsets tensor call after call."

    def __init__(self, backend="auto", explicit=False):
        self.backend = backend
        self.explicit = explicit
        self.name = "jfa" if backend == "auto" else f"jfa-{backend}"

    def skip_reason(self, inp):
        if self.backend == "auto":
            return None
        takers = available_backends(inp.q.device, inp.workload.head_dim, inp.q.dtype)
        if self.backend not in takers:
            return f"backend {self.backend!r} does not take this device/head dim/dtype"
        if self.backend == "reference" and inp.q.device.type == "cuda" and not self.explicit:
            return "the reference is the correctness spec, not a fast path (ask for it with --providers)"
        return None

    def build(self, inp):
        w = inp.workload
        # Both max lengths given: no host sync inside the timed region (the offsets are trusted).
        score = self.score(inp)
        if w.broadcast:
            def call(q_offsets, kv_offsets):
                out = jfa.broadcast_attention(inp.q, inp.k, inp.v, kv_offsets, max_kv_len=inp.max_kv,
                                              backend=self.backend, **score)
                return out.view(-1, out.shape[2], out.shape[3])
        else:
            def call(q_offsets, kv_offsets):
                kv_offsets = None if kv_offsets is q_offsets else kv_offsets  # self-attention, as users call it
                return jfa.jagged_attention(inp.q, inp.k, inp.v, q_offsets, kv_offsets, max_q_len=inp.max_q,
                                            max_kv_len=inp.max_kv, backend=self.backend, **score)
        extras = {}
        if inp.q.device.type == "cuda":
            extras["new_offsets_ms"] = _new_offsets_ms(call, inp)
        return (lambda: call(inp.q_offsets, inp.kv_offsets)), extras

    def score(self, inp):
        """The call's mask and score arguments: the workload's, with check_like's in their place."""
        return dict(inp.score(), **(self.check_like or {}))


class JfaSoftmax(Jfa):
    """jfa (auto) with softmax on an activation workload's shape (its mask kept): the speed an activation is held
    to. Its output is softmax attention's, so the gate holds it to that reference (check_like)."""
    check_like = dict(activation="softmax", out_scale=1.0)

    def __init__(self):
        super().__init__("auto")
        self.name = "jfa-softmax"

    def skip_reason(self, inp):
        return "a softmax workload: jfa itself" if inp.workload.activation == "softmax" else None


class JfaCausal(Jfa):
    """jfa (auto) with plain causal attention on a workload with HSTU's mask (its score kept): the time the mask is
    held to, per visible pair (extras: its pairs)."""
    check_like = dict(num_targets=None, contextual_len=0)

    def __init__(self):
        super().__init__("auto")
        self.name = "jfa-causal"

    def skip_reason(self, inp):
        return None if inp.num_targets is not None else "a workload without HSTU's mask: jfa itself"

    def build(self, inp):
        fn, extras = super().build(inp)
        extras["pairs"] = visible_pairs(inp.q_lens, inp.kv_lens, *inp.window)
        return fn, extras


class JfaNoBias(Jfa):
    """jfa (auto) without the relative bias on a workload that has one (score and mask kept): the time the bias is
    held to."""
    check_like = dict(rel_bias=None)

    def __init__(self):
        super().__init__("auto")
        self.name = "jfa-nobias"

    def skip_reason(self, inp):
        return None if inp.tables else "a workload without a relative bias: jfa itself"


def _new_offsets_ms(call, inp, reps: int = 7) -> float:
    """What a forward costs on top when its offsets are new tensors, as on a training step's first layer (the
    hopper backend builds its schedules then, and caches them by offsets identity for the other layers and
    the backward). Median over reps of synchronized wall time, fresh offsets minus the same offsets."""
    def median_ms(fresh: bool) -> float:
        times = []
        for _ in range(reps):
            qo, ko = inp.q_offsets, inp.kv_offsets
            if fresh:  # (self-attention's one tensor stays one)
                shared = ko is qo
                qo = qo.clone()
                ko = qo if shared else ko.clone()
            _sync(inp.q.device)
            t0 = time.perf_counter()
            with torch.no_grad():
                call(qo, ko)
            _sync(inp.q.device)
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[reps // 2]
    median_ms(True)  # compiles whatever the first call compiles
    return max(median_ms(True) - median_ms(False), 0.0)


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
        return _peer_checks(inp, softmax_only=True, windows_only=True)

    def build(self, inp):
        w = inp.workload
        group = w.heads_q // w.heads_kv

        def fn():
            return peers.fa2_attention(_expand_q(inp), inp.k, inp.v, inp.q_offsets, inp.kv_offsets,
                                       max_q_len=inp.max_q, max_kv_len=inp.max_kv, window=inp.window,
                                       scale=inp.scale)
        native = "enable_gqa" in peers.varlen_params()
        note = ("GQA: enable_gqa=True" if native else "GQA: k, v repeated per q head") if group > 1 else ""
        return fn, ({"note": note} if note else {})


class FA4(Provider):
    """flash-attn-4 (CuTe DSL): flash_attn.cute.flash_attn_varlen_func."""
    name = "fa4"
    needs = "flash-attn-4 (pip install 'jfa[peers]'; on the H200 without network: scripts/fetch_fa4.sh, then " \
            "scripts/bench.sh installs the carried wheels)"

    def skip_reason(self, inp):
        try:
            import flash_attn.cute  # noqa: F401
        except Exception as e:  # ImportError, or a broken CUDA/DSL install
            return f"flash_attn.cute does not import ({type(e).__name__}: {str(e)[:120]}); see scripts/fetch_fa4.sh"
        return _peer_checks(inp, softmax_only=True, windows_only=True)

    def build(self, inp):
        def fn():
            return peers.fa4_attention(_expand_q(inp), inp.k, inp.v, inp.q_offsets, inp.kv_offsets,
                                       max_q_len=inp.max_q, max_kv_len=inp.max_kv, window=inp.window,
                                       scale=inp.scale)
        return fn, {}


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
        return _peer_checks(inp, softmax_only=True, bias=True)

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
            _sync(device)
            t0 = time.perf_counter()
            block_mask = create_block_mask(mask_mod, None, None, rows, tk, device=device, _compile=True)
            _sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
        flex = _compiled_flex()
        gqa = inp.workload.heads_q != inp.workload.heads_kv
        score_mod = _flex_bias(inp) if inp.tables else None

        def fn():
            q = _expand_q(inp).transpose(0, 1).unsqueeze(0)  # [1, Hq, rows, D]
            k, v = inp.k.transpose(0, 1).unsqueeze(0), inp.v.transpose(0, 1).unsqueeze(0)
            out = flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=inp.scale, enable_gqa=gqa)
            return out[0].transpose(0, 1)
        return fn, {"build_ms": times[1], "build_first_ms": times[0]}


def sdpa_padded_bytes(inp: Inputs) -> int:
    """Rough peak bytes of the padded SDPA baseline: padded q/k/v/out and their grads, the mask, and on the
    CPU (math kernel) or for an activation's formula the score matrices (scores, weights and their gradients)."""
    w, b = inp.workload, inp.batch
    elt = inp.q.element_size()
    padded = b * (inp.max_q * w.heads_q + 2 * inp.max_kv * w.heads_kv) * w.head_dim * elt * 3
    mask = b * inp.max_q * inp.max_kv * 3
    scores = 0
    if inp.q.device.type == "cpu" or w.activation != "softmax":
        scores = b * w.heads_q * inp.max_q * inp.max_kv * 4 * 3
    return padded + mask + scores


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
            return padded(_expand_q(inp), inp.k, inp.v, inp.scale)
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
                or self.available() or _peer_checks(inp))

    def build(self, inp):
        w = inp.workload

        def fn():
            return self.attention(inp.q, inp.k, inp.v, inp.q_offsets, max_q_len=inp.max_q, max_kv_len=inp.max_kv,
                                  window=inp.window, scale=inp.scale, activation=w.activation,
                                  out_scale=w.out_scale, num_targets=inp.num_targets, contextual_len=w.contextual_len)
        return fn, {"note": "k, v repeated per q head (no GQA)"} if w.heads_q != w.heads_kv else {}


class HSTUCuda(HSTU):
    """HSTU's CUDA kernel (generative-recommenders ops/cpp/hstu_attention, FlashAttention-3-based), as its users call
    it (cuda_hstu_mha)."""
    name = "hstu-cuda"
    needs = "scripts/build_hstu_cuda.sh (objects anywhere, link on the GPU machine); causal silu self-attention"
    attention = staticmethod(peers.hstu_cuda_attention)
    available = staticmethod(peers.hstu_cuda_available)


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
                or peers.hstu_available() or _peer_checks(inp))

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
                or _peer_checks(inp, windows_only=True))

    def build(self, inp):
        w = inp.workload

        def fn():
            return peers.gdpa_attention(inp.q, inp.k, inp.v, inp.q_offsets, inp.kv_offsets, max_q_len=inp.max_q,
                                        max_kv_len=inp.max_kv, window=inp.window, scale=inp.scale,
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


def all_providers() -> list[Provider]:
    """jfa (auto), one jfa-<backend> per registered backend, jfa-softmax, then the peers."""
    return ([Jfa("auto")] + [Jfa(name) for name in BACKENDS] + [JfaSoftmax(), JfaCausal(), JfaNoBias()]
            + [TorchVarlen(), FA4(), Flex(), SdpaPadded(), CompiledPadded(), HSTU(), HSTUCuda(), HSTUCached(), Gdpa(),
               GdpaPersistent()])


def select(names: str | None) -> list[Provider]:
    providers = all_providers()
    if not names:
        return providers
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {p.name: p for p in providers}
    missing = [n for n in wanted if n not in known]
    if missing:
        raise ValueError(f"--providers: no provider named {', '.join(missing)}; the providers are "
                         f"{', '.join(known)} (jfa bench --list describes them)")
    chosen = [known[n] for n in wanted]
    # An explicit request for the reference lifts its "not a fast path" skip.
    for p in chosen:
        if isinstance(p, Jfa) and p.backend == "reference":
            p.explicit = True
    return chosen
