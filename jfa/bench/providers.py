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
  jfa-causal     jfa with plain causal attention on a workload with HSTU's mask: the time the mask is held to
  jfa-nobias     jfa on the same call without the relative bias
The peers (FlashAttention 2 and 4, Flex, padded SDPA, HSTU's and GDPA's kernels) are in jfa.bench.peer_providers.
"""
from __future__ import annotations

import time

import torch

import jfa
from jfa import peers
from jfa.backends import BACKENDS, available_backends
from jfa.jagged import visible_pairs

from .suite import Inputs


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def expand_q(inp: Inputs):
    """Broadcast mode, as a peer's user does it: the dense q repeated per sequence, [B*Lq, Hq, D]."""
    return peers.broadcast_rows(inp.q, inp.kv_offsets)[0] if inp.workload.broadcast else inp.q


def peer_checks(inp: Inputs, need_cuda=True, softmax_only=False, windows_only=False, bias=False):
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
    yardstick = False  # another computation on the workload's shape (fa4-softmax): timed, in no ratio

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
        max_q, max_kv = inp.max_q, inp.max_kv  # (host ints, read once: not the timed call's work)
        if w.broadcast:
            def call(q_offsets, kv_offsets):
                out = jfa.broadcast_attention(inp.q, inp.k, inp.v, kv_offsets, max_kv_len=max_kv,
                                              backend=self.backend, **score)
                return out.view(-1, out.shape[2], out.shape[3])
        else:
            def call(q_offsets, kv_offsets):
                kv_offsets = None if kv_offsets is q_offsets else kv_offsets  # self-attention, as users call it
                return jfa.jagged_attention(inp.q, inp.k, inp.v, q_offsets, kv_offsets, max_q_len=max_q,
                                            max_kv_len=max_kv, backend=self.backend, **score)
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
            sync(inp.q.device)
            t0 = time.perf_counter()
            with torch.no_grad():
                call(qo, ko)
            sync(inp.q.device)
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[reps // 2]
    median_ms(True)  # compiles whatever the first call compiles
    return max(median_ms(True) - median_ms(False), 0.0)


def all_providers() -> list[Provider]:
    """jfa (auto), one jfa-<backend> per registered backend, jfa-softmax, then the peers (jfa.bench.peer_providers)."""
    from .peer_providers import PEERS  # (they build on Provider, defined here)
    return ([Jfa("auto")] + [Jfa(name) for name in BACKENDS] + [JfaSoftmax(), JfaCausal(), JfaNoBias()]
            + [peer() for peer in PEERS])


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
