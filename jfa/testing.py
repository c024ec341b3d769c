"""Test helpers shared by the test suite and `jfa check`: random jagged inputs, ground truth, and a tolerance
tied to what the dtype can do.

Tolerance rule (as FlashAttention's tests): compute the ground truth in float64, and the same function in
PyTorch at the input dtype; the kernel passes when its worst error is at most twice PyTorch's worst error
plus one rounding step of the dtype at the size of the values (``eps(dtype) * max|truth|``).
For float32 both errors sit at the level of accumulation-order noise, where "twice PyTorch's" is no bound
(PyTorch may round a sum exactly where the kernel's order loses an ulp, or a gradient may be exactly 0
by cancellation), so the rounding term there is the forward error bound of a sum of K terms: ``sqrt(K)``
rounding steps at the size of the summed terms (the same sums over absolute values:
jfa.reference.attention_backward(magnitudes=True)), K the longest reduction (rows x GQA group).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import reference
from .jagged import lengths, resolve_window


def modes(lens, window, causal_left, lq):
    """The named modes every backend is tested in (make_case's arguments), on these lengths mixed in one batch:
    windows of `window` (both sides) and `causal_left` (causal), broadcast q of `lq` rows and of a quarter of them."""
    return {
        "self": dict(q_lens=lens),
        "causal": dict(q_lens=lens, causal=True),
        "window": dict(q_lens=lens, window=(window, window)),
        "causal-window": dict(q_lens=lens, causal=True, window=(causal_left, -1)),
        "cross": dict(q_lens=lens, kv_lens=lens[::-1], causal=True),
        "gqa": dict(q_lens=lens, hq=8, hkv=2),
        "broadcast": dict(q_lens=None, kv_lens=lens, broadcast_lq=lq),
        "broadcast-causal-gqa": dict(q_lens=None, kv_lens=lens, broadcast_lq=lq // 4, causal=True, hq=8, hkv=4),
        "empty-kv": dict(q_lens=[5, 7], kv_lens=[0, 0]),
    }


# Awkward lengths: 0, 1, 2 and the edges of 64- and 128-row blocks (the CPU's tests and `jfa check`), and up to a few
# thousand rows on the GPU.
AWKWARD_LENS = [0, 1, 2, 63, 64, 65, 127, 128, 129]
GPU_LENS = AWKWARD_LENS + [511, 1000, 2047]
CPU_MODES = modes(AWKWARD_LENS, 17, 20, 40)
GPU_MODES = modes(GPU_LENS, 256, 100, 256)


def variant_modes(lens, window) -> dict:
    """The attention variants as named modes (make_case's arguments) on these lengths: each score function in softmax's
    place once (causal; a per-row out scale on one), and HSTU's mask (targets, a contextual prefix and a window over
    positions) with softmax and with silu, in self-attention and serving (each sequence's last 0 to all rows as
    queries: HSTU's cached attention). (`jfa check`'s; the tests cross the variants with every mode.)"""
    from .variants import ACTIVATIONS
    out = {f"{a}-causal": dict(q_lens=lens, causal=True, activation=a, out_scale=0.3) for a in ACTIVATIONS}
    out["silu-gqa-rows-scale"] = dict(q_lens=lens, hq=8, hkv=2, activation="silu", out_scale="rows")
    for a, scale in (("softmax", 1.0), ("silu", 0.1)):
        out[f"targets-context-window-{a}"] = dict(q_lens=lens, causal=True, window=(window, -1), num_targets="random",
                                                  contextual_len=3, activation=a, out_scale=scale)
        out[f"targets-serving-{a}"] = dict(q_lens=serving_lens(lens), kv_lens=lens, causal=True, window=(window, -1),
                                           num_targets="random", contextual_len=3, activation=a, out_scale=scale)
    return out


def serving_lens(kv_lens, new_rows=(1, 0, 2, 20, 65, 7, 130, 3, 1, 0, 130, 65)) -> list[int]:
    """Query rows per sequence for serving (its last rows: new events or candidates against the cached history):
    none, a few, more than a block, and a whole sequence among them."""
    return [min(n, new_rows[b % len(new_rows)]) for b, n in enumerate(kv_lens)]


CPU_VARIANTS = variant_modes(AWKWARD_LENS, 20)
GPU_VARIANTS = variant_modes(GPU_LENS, 300)


def each_once(firsts, seconds, first, second) -> list[tuple]:
    """Pairs that take every one of firsts once (with `second`) and every one of seconds once (with `first`): the
    CPU tests of two independent seams (a score function and a mask mode, say), which the GPU tests cross whole."""
    return [(a, second) for a in firsts] + [(first, b) for b in seconds if b != second]


@dataclass
class Case:
    """One jagged attention problem with its inputs and upstream gradients."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_offsets: torch.Tensor
    kv_offsets: torch.Tensor
    dout: torch.Tensor
    left: int
    right: int
    broadcast: bool
    scale: float
    activation: str = "softmax"
    out_scale: object = 1.0  # a float, or a float32 tensor [rows] (one factor per output row)
    num_targets: torch.Tensor | None = None  # HSTU's mask (jfa.jagged.target_mask), with contextual_len
    contextual_len: int = 0
    min_full_attn_len: int = 0  # (HSTU's: with its window, the history's last rows see all of it)
    num_softmax_heads: int = 0  # (HSTU's: the first heads take softmax, the rest the activation)

    def options(self) -> dict:
        """The public functions' mask and score arguments for this case."""
        opts = dict(window=(self.left, self.right), scale=self.scale, activation=self.activation,
                    out_scale=self.out_scale)
        if self.num_targets is not None:
            opts.update(num_targets=self.num_targets, contextual_len=self.contextual_len, causal=True)
            if self.min_full_attn_len:
                opts.update(min_full_attn_len=self.min_full_attn_len)
        if self.num_softmax_heads:
            opts.update(num_softmax_heads=self.num_softmax_heads)
        return opts

    def mask(self) -> dict:
        """The reference's mask and score arguments."""
        return dict(scale=self.scale, left=self.left, right=self.right, broadcast=self.broadcast,
                    activation=self.activation, out_scale=self.out_scale, num_targets=self.num_targets,
                    contextual_len=self.contextual_len, min_full_attn_len=self.min_full_attn_len,
                    num_softmax_heads=self.num_softmax_heads)


def offsets_of(lengths, device="cpu", dtype=torch.int32):
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    if len(lengths):
        out[1:] = torch.cumsum(torch.as_tensor(lengths, dtype=torch.int64), 0)
    return out.to(device=device, dtype=dtype)


def make_case(q_lens, kv_lens=None, *, hq=2, hkv=1, d=32, dtype=torch.float32, device="cpu", causal=False,
              window=(-1, -1), broadcast_lq=None, seed=0, offsets_dtype=torch.int32, activation="softmax",
              out_scale=1.0, num_targets=None, contextual_len=0, min_full_attn_len=0, num_softmax_heads=0) -> Case:
    """Random inputs. Self-attention when kv_lens is None; broadcast mode when broadcast_lq is an int
    (then q_lens is ignored and kv_lens gives the B sequences). out_scale="rows": a random factor per output row.
    num_targets: counts per sequence (HSTU's mask: causal; in cross-attention the queries are each sequence's last
    rows, q_lens <= kv_lens, and the targets count its keys), or "random" (0 to the length, all-target sequences
    among them). With a contextual_len, every non-empty sequence holds its prefix: shorter lengths are raised to it
    (the API refuses shorter ones where it checks the offsets)."""
    g = torch.Generator().manual_seed(seed)
    if contextual_len and isinstance(contextual_len, int) and contextual_len > 0 and q_lens is not None:
        raised = [n if n == 0 else max(n, contextual_len) for n in (q_lens if kv_lens is None else kv_lens)]
        q_lens, kv_lens = (raised, None) if kv_lens is None else (q_lens, raised)
    broadcast = broadcast_lq is not None
    self_attention = kv_lens is None and not broadcast
    kv_lens = q_lens if kv_lens is None else kv_lens
    if broadcast:
        rows_q, q_offsets = broadcast_lq, offsets_of([broadcast_lq] * len(kv_lens), device, offsets_dtype)
        rows_out = broadcast_lq * len(kv_lens)
    else:
        q_offsets = offsets_of(q_lens, device, offsets_dtype)
        rows_q = rows_out = int(sum(q_lens))
    rows_k = int(sum(kv_lens))

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    left, right = resolve_window(causal, window)
    # self-attention: one offsets tensor for both sides, as its callers pass it
    kv_offsets = q_offsets if self_attention else offsets_of(kv_lens, device, offsets_dtype)
    tensors = (rnd(rows_q, hq, d), rnd(rows_k, hkv, d), rnd(rows_k, hkv, d), q_offsets, kv_offsets,
               rnd(rows_out, hq, d))
    if isinstance(out_scale, str) and out_scale == "rows":
        out_scale = (0.5 + torch.rand(rows_out, generator=g)).to(device)
    if isinstance(num_targets, str) and num_targets == "random":  # every length once all targets, else at random
        lens = torch.as_tensor(kv_lens, dtype=torch.int64)
        num_targets = (torch.rand(len(kv_lens), generator=g) * (lens + 1).double()).long().clamp(max=lens)
        num_targets[::3] = torch.minimum(lens[::3], torch.tensor(2))
        num_targets[1::5] = lens[1::5]
    if num_targets is not None:
        num_targets = torch.as_tensor(num_targets).to(device=device, dtype=offsets_dtype)
    return Case(*tensors, left, right, broadcast, 1.0 / math.sqrt(d), activation, out_scale, num_targets,
                contextual_len, min_full_attn_len, num_softmax_heads)


def reference_results(case: Case, compute_dtype=torch.float64):
    """(out, lse, dq, dk, dv) of the reference.

    float64: the truth, gradients by autograd (independent of any backward formula). ``None``: the same
    computation in PyTorch at the input dtype, with the backward written as FlashAttention computes it
    (jfa.reference.attention_backward: Delta = rowsum(dO * O)), so that its error is the error this
    algorithm has at this dtype.
    """
    kw = case.mask()
    if compute_dtype is None:
        dt = case.q.dtype
        out, lse = reference.attention(case.q, case.k, case.v, case.q_offsets, case.kv_offsets, **kw,
                                       compute_dtype=dt)
        grads = reference.attention_backward(case.dout, None, case.q, case.k, case.v, out, case.q_offsets,
                                             case.kv_offsets, **kw, compute_dtype=dt)
        return (out, lse, *grads)
    q, k, v = (x.detach().to(compute_dtype).requires_grad_() for x in (case.q, case.k, case.v))
    out, lse = reference.attention(q, k, v, case.q_offsets, case.kv_offsets, **kw, compute_dtype=compute_dtype)
    grads = torch.autograd.grad(out, (q, k, v), case.dout.to(compute_dtype)) if out.numel() else (
        torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v))
    return (out.detach(), lse.detach(), *grads)


def _lengths_given(case: Case, max_lens: bool):
    return [max(lengths(o.cpu()).tolist(), default=0) if max_lens else None for o in (case.q_offsets, case.kv_offsets)]


def case_problem(case: Case, backend: str, deterministic: bool = False, max_lens: bool = False):
    """The jfa.problem.Problem of a case, as the public functions build it (max_lens: with the longest sequences'
    lengths as max_q_len / max_kv_len)."""
    from jfa.api import problem
    longest = _lengths_given(case, max_lens)
    if case.broadcast:
        return problem(case.q, case.k, case.v, case.kv_offsets, broadcast=True, max_kv_len=longest[1],
                       backend=backend, deterministic=deterministic, **case.options())
    kv_offsets = None if case.kv_offsets is case.q_offsets else case.kv_offsets
    return problem(case.q, case.k, case.v, case.q_offsets, kv_offsets, max_q_len=longest[0], max_kv_len=longest[1],
                   backend=backend, deterministic=deterministic, **case.options())


def run_kernels(case: Case, forward, backward, backend: str, **problem_kw):
    """(out, lse, (dq, dk, dv)) of a case through a backend's own forward(problem) and backward(problem, out, lse,
    dout, dlse), e.g. with a kernel config handed in (grads None when the output is empty)."""
    p = case_problem(case, backend, **problem_kw)
    out, lse = forward(p)
    grads = backward(p, out, lse, case.dout, None) if out.numel() else None
    return out, lse, grads


def run_backend(case: Case, backend: str, deterministic: bool = False, max_lens: bool = False):
    """(out, lse, (dq, dk, dv)) of one case through the public API (lse None with an activation); grads None when
    the output is empty. max_lens: pass the longest sequences' lengths as max_q_len / max_kv_len."""
    import jfa
    q, k, v = (x.detach().clone().requires_grad_() for x in (case.q, case.k, case.v))
    longest = _lengths_given(case, max_lens)
    kw = dict(return_lse=case.activation == "softmax", backend=backend, deterministic=deterministic,
              **case.options())
    if case.broadcast:
        result = jfa.broadcast_attention(q, k, v, case.kv_offsets, max_kv_len=longest[1], **kw)
    else:
        result = jfa.jagged_attention(q, k, v, case.q_offsets, case.kv_offsets, max_q_len=longest[0],
                                      max_kv_len=longest[1], **kw)
    out, lse = result if kw["return_lse"] else (result, None)
    out = out.reshape(-1, q.shape[1], q.shape[2])
    grads = torch.autograd.grad(out, (q, k, v), case.dout) if out.numel() else None
    return out.detach(), None if lse is None else lse.detach(), grads


def error_report(name: str, actual: torch.Tensor, truth: torch.Tensor, allowed: float) -> str | None:
    """None when within `allowed` (max abs error); else a message with the worst index, count and NaNs."""
    if actual.shape != truth.shape:
        return f"{name}: shape {tuple(actual.shape)} != {tuple(truth.shape)}"
    a, t = actual.detach().double().cpu(), truth.detach().double().cpu()
    nan = torch.isnan(a)
    inf_match = torch.isinf(t) & (a == t)
    diff = torch.where(inf_match, torch.zeros_like(a), (a - t).abs())
    diff = torch.where(nan, torch.full_like(diff, math.inf), diff)
    if diff.numel() == 0 or diff.max() <= allowed:
        return None
    worst = int(diff.argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), diff.shape))
    return (f"{name}: max abs error {diff.max().item():.3g} > allowed {allowed:.3g} at {idx} "
            f"(got {a.flatten()[worst].item():.6g}, want {t.flatten()[worst].item():.6g}); "
            f"{int((diff > allowed).sum())}/{diff.numel()} elements off, {int(nan.sum())} NaN")


def allowed_error(dtype: torch.dtype, lowp: torch.Tensor, truth: torch.Tensor, reduction: int = 1,
                  magnitude: torch.Tensor | None = None) -> float:
    t = truth.detach().double().cpu()
    fin = torch.isfinite(t)
    if not fin.any():
        return 0.0
    torch_err = (lowp.detach().double().cpu() - t)[fin].abs().max().item()
    size = t[fin].abs().max().item()
    if dtype != torch.float32:
        return 2 * torch_err + torch.finfo(dtype).eps * size
    if magnitude is not None and magnitude.numel():
        size = max(size, magnitude.detach().double().abs().max().item())
    return 2 * torch_err + math.sqrt(max(reduction, 1)) * torch.finfo(dtype).eps * size


def compare(case: Case, out, lse, grads=None, names=("out", "lse", "dq", "dk", "dv")) -> list[str]:
    """Check a backend's (out, lse[, (dq, dk, dv)]) against the float64 truth; returns the failures."""
    truth = reference_results(case, torch.float64)
    lowp = reference_results(case, None)
    if case.activation != "softmax":  # no lse: compare what there is
        if lse is not None and lse.numel():
            return [f"lse: an activation returns none, got shape {tuple(lse.shape)}"]
        lse = truth[1]
    got = [out, lse] + (list(grads) if grads is not None else [])
    reduction = max(case.q.shape[0], case.k.shape[0], case.dout.shape[0]) * (case.q.shape[1] // case.k.shape[1])
    sizes = [None, None]
    if grads is not None and case.q.dtype == torch.float32:
        sizes += list(reference.attention_backward(
            case.dout.double(), None, case.q.double(), case.k.double(), case.v.double(), truth[0].double(),
            case.q_offsets, case.kv_offsets, compute_dtype=torch.float64, magnitudes=True, **case.mask()))
    failures = []
    for name, a, t, p, size in zip(names, got, truth, lowp, sizes + [None] * 3):
        dtype = torch.float32 if name == "lse" else case.q.dtype
        msg = error_report(name, a, t, allowed_error(dtype, p, t, reduction, size))
        if msg:
            failures.append(msg)
    return failures
