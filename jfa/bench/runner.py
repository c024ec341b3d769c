"""The run: for each workload, build the shared inputs, check every provider against jfa's reference, time
the ones that agree, and collect results.json's structure.

Correctness gate (per provider, before any timing). Ground truth: jfa.reference on float32 copies of the
inputs (float32 arithmetic). Yardstick: the same reference run in the inputs' dtype end to end (what plain
PyTorch loses in bf16). For the output and each of dq, dk, dv the provider passes when

    max|x - truth| <= 2 * max|torch_same_dtype - truth| + eps(dtype) * max|truth|

(FA4's rule: at most twice PyTorch's own error plus one rounding step), with no NaN. A provider that fails
is reported ``"correct": false`` and not timed. One whose backward raises (FlexAttention's on a biased score_mod
does not compile) is gated and timed on its forward alone, run without autograd, the error in its note. To keep the
reference fast the gate checks a prefix of the batch: the first n sequences with sum(Hq * Lq * Lk) <= GATE_BUDGET,
at most GATE_SEQS of them (always at least one sequence; the skewed workloads' first sequence is the longest),
recorded as ``check.seqs`` of ``check.batch``. The provider itself runs on the whole batch, with the upstream gradient zeroed past the prefix
(see ``check``).

Timing: triton.testing.do_bench (median, p20, p80) of the forward and of forward+backward on CUDA;
backward = (forward+backward) - forward. On the CPU (smoke run) a plain perf_counter loop.
A second method on CUDA (gpu_busy_ms): the GPU's busy time per call, the sum of the kernels' durations in a
torch.profiler trace (after the same L2 flush do_bench does, the flush's own time taken out). Where the host issues a
call more slowly than the GPU runs it, do_bench's span holds the host's time and its forward exceeds the busy time;
the forward+backward hides the forward's host time behind its kernels, so "fwd+bwd - fwd" then undercounts the
backward. A provider is noted host-bound where its do_bench forward exceeds its busy time by more than HOST_BOUND
and the host's own time to issue a call (issue_ms, fwd_issue_ms) is at least HOST_SHARE of the busy time (so that
the host can be what the span holds: without it, forwards of 2-6 ms whose do_bench ran 10-11% above their busy time,
with 0.3-0.6 ms of host time a call, were noted host-bound); its backward is then the busy times' difference.
TF/s from exact visible pair counts (jfa.jagged.visible_pairs): forward 4 * Hq * D * pairs, backward 2.5x.

Roofline: each run measures the dense matmul rate (ceiling_tflops) and the copy bandwidth (bandwidth_gbs, a
large device-to-device copy, bytes read plus written). A phase's floor is max(FLOPs / ceiling, bytes /
bandwidth), the bytes being what must cross memory once (suite.bytes_moved); each provider's ``*_floor_pct``
is floor / time: 100% = at the roofline.
"""
from __future__ import annotations

import gc
import math
import statistics
import time

import torch

from .. import bias as rel
from .. import reference
from . import providers as providers_mod
from .suite import Inputs, bytes_moved, flops, make_inputs

GATE_BUDGET = 1 << 28  # sum over the checked sequences of Hq * Lq * Lk (one fp32 score tensor ~1 GiB)
GATE_SEQS = 1024  # the reference loops over sequences in Python: short-128's 8,192 took tens of seconds per run
HOST_BOUND = 1.10  # do_bench forward / GPU busy forward above which the forward is host-bound (see Timing)
HOST_SHARE = 0.5  # ... where the host's issue time a call is at least this share of the GPU busy time


def gate_prefix(inp: Inputs, budget: int | None = None, max_seqs: int = GATE_SEQS) -> int:
    """How many leading sequences the correctness gate checks (within GATE_BUDGET by default)."""
    budget = GATE_BUDGET if budget is None else budget
    cost = (inp.q_lens * inp.kv_lens * inp.workload.heads_q).tolist()
    n, total = 0, 0
    for c in cost:
        if n and (total + c > budget or n == max_seqs):
            break
        n, total = n + 1, total + c
    return max(n, min(1, inp.batch))


def gate_heads(inp: Inputs, n: int, budget: int | None = None) -> int:
    """How many leading query heads the gate checks on its n sequences: all, unless one sequence alone is over the
    budget (spike-32k's 32K keys: the reference's float32 scores and their gradients, ~20 bytes a pair, did not fit
    an H100's 80 GB with 4 heads); then the fewest whole GQA groups within it, one group at least. Not with a
    relative bias (its tables' gradients sum over the heads)."""
    budget = GATE_BUDGET if budget is None else budget
    hq, hk = inp.q.shape[1], inp.k.shape[1]
    cost = int((inp.q_lens[:n] * inp.kv_lens[:n]).sum()) * hq
    if n != 1 or cost <= budget or inp.tables:
        return hq
    group = hq // hk
    return group * max(1, budget * hk // cost)


def _run_reference(inp: Inputs, dtype, like=None):
    """(out, dq, dk, dv) of jfa.reference with inputs and arithmetic in `dtype` (float32 or the inputs'); like: a
    provider's check_like (its output is another score's or mask's on these inputs)."""
    q, k, v = (t.detach().to(dtype).requires_grad_(True) for t in inp.leaves()[:3])
    left, right = inp.window
    w = inp.workload
    score = dict(activation=w.activation, out_scale=w.out_scale, num_targets=inp.num_targets,
                 contextual_len=w.contextual_len, rel_bias=None)
    tables = ()
    if inp.tables and "rel_bias" not in (like or {}):  # (float32 leaves; the reference takes jfa.bias.Tables)
        tables = tuple(t.detach().clone().requires_grad_(True) for t in inp.tables)
        score["rel_bias"] = rel.check(inp.rel_bias(tables), q, k, False, True, inp.scale)
    score.update(like or {})
    out, _ = reference.attention(q, k, v, inp.q_offsets, inp.kv_offsets, scale=inp.scale, left=left, right=right,
                                 broadcast=w.broadcast, compute_dtype=dtype, **score)
    out.backward(inp.dout.to(dtype))
    return [out.detach(), q.grad, k.grad, v.grad] + [t.grad for t in tables]


def reference_results(inp: Inputs, like=None):
    """(truth, yardstick error per tensor) for the gate (like: see _run_reference)."""
    truth = _run_reference(inp, torch.float32, like)
    same = _run_reference(inp, inp.q.dtype, like)
    return truth, [_max_err(s, t) for s, t in zip(same, truth)]


def _max_err(x, truth):
    if x is None:
        return math.inf
    return float((x.float() - truth).abs().max()) if truth.numel() else 0.0


def run_provider_once(fn, inp: Inputs, dout=None, forward_only=False):
    """(out, dq, dk, dv) of one forward + backward through a provider; [out] of a forward-only one (serving)."""
    for t in inp.leaves():
        t.grad = None
    out = fn()
    if forward_only:
        return [out.detach()]
    out.backward(inp.dout if dout is None else dout)
    grads = [t.grad for t in inp.leaves()]
    for t in inp.leaves():
        t.grad = None
    return [out.detach()] + grads


def check(fn, inp: Inputs, ref, n: int | None = None, forward_only=False, heads: int | None = None) -> dict:
    """The gate (see module doc): {"correct": bool, "errors": {name: [err, tol]}}.

    fn runs on the whole batch (one build, one compile, the inputs that are timed); the upstream gradient is
    zero past the first n sequences and the first `heads` query heads (gate_heads; default all), so out, dk, dv
    of those and dq (also in broadcast mode, where it sums over the batch) depend on them alone and compare with
    ``ref = reference_results(inp.prefix(n, heads))``.
    A forward-only provider (serving) is checked on out alone.
    """
    n = inp.batch if n is None else n
    truth, torch_err = ref
    rows, kv_rows = int(inp.q_offsets[n]), int(inp.kv_offsets[n])
    hq = inp.q.shape[1] if heads is None else heads
    hk = hq * inp.k.shape[1] // inp.q.shape[1]
    dout = inp.dout
    if n < inp.batch or hq < inp.q.shape[1]:
        dout = dout.clone()
        dout[rows:] = 0
        dout[:, hq:] = 0
    got = run_provider_once(fn, inp, dout, forward_only)
    q_cut = inp.q.shape[0] if inp.workload.broadcast else rows
    cut = [(slice(rows), slice(hq)), (slice(q_cut), slice(hq)), (slice(kv_rows), slice(hk)), (slice(kv_rows),
           slice(hk)), (), ()]  # (the bias tables' gradients whole)
    eps = torch.finfo(inp.q.dtype).eps
    errors, ok = {}, True
    for name, x, c, t, e in zip(("out", "dq", "dk", "dv", "dposition", "dtime"), got, cut, truth, torch_err):
        x = None if x is None else x[c]
        if x is None or tuple(x.shape) != tuple(t.shape):
            errors[name] = ["missing" if x is None else f"shape {tuple(x.shape)} != {tuple(t.shape)}", None]
            ok = False
            continue
        err = _max_err(x, t)
        tol = 2 * e + eps * (float(t.abs().max()) if t.numel() else 0.0)
        nan = bool(torch.isnan(x).any())
        errors[name] = [err, tol]
        ok = ok and not nan and err <= tol
    return {"correct": ok, "errors": errors}


def _quantiles(samples):
    s = sorted(samples)
    pick = lambda f: s[min(len(s) - 1, int(round(f * (len(s) - 1))))]  # noqa: E731
    return statistics.median(s), pick(0.2), pick(0.8)


def time_ms(fn, device, leaves=(), warmup_ms=25, rep_ms=100, cpu_reps=3, cpu_warmup=True):
    """(median, p20, p80) in ms: do_bench on CUDA, a perf_counter loop of cpu_reps calls on the CPU."""
    if torch.device(device).type == "cuda":
        from triton.testing import do_bench
        return tuple(do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=list(leaves),
                              quantiles=[0.5, 0.2, 0.8]))
    if cpu_warmup:
        fn()  # warm-up (compilation, caches)
    samples = []
    for _ in range(cpu_reps):
        for t in leaves:
            t.grad = None
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return _quantiles(samples)


def gpu_busy_ms(fn, device, leaves=(), reps=10) -> float | None:
    """The GPU's busy time per call of fn (ms; the second method, see Timing), or None off CUDA or where the profiler
    gives no kernel times."""
    if torch.device(device).type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    flush = torch.empty(256 << 20, dtype=torch.int8, device=device)  # (do_bench's L2 flush)

    def busy(call):
        fn()  # (warm: compiled, cached)
        torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                for t in leaves:
                    t.grad = None
                flush.zero_()
                call()
            torch.cuda.synchronize(device)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return sum(e.device_time for e in kernels) / 1e3 / reps if kernels else None

    total, flush_only = busy(fn), busy(lambda: None)
    return None if total is None else max(total - (flush_only or 0.0), 0.0)


def issue_ms(fn, device, leaves=(), calls=10) -> float | None:
    """The host's time to issue one call of fn (ms), or None off CUDA: calls issued back to back after a sync and not
    waited for (the GPU's launch queue holds them), so the GPU's time is not in it unless fn waits on the GPU."""
    if torch.device(device).type != "cuda":
        return None
    fn()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        for t in leaves:
            t.grad = None
        fn()
    per_call = (time.perf_counter() - t0) / calls * 1e3
    torch.cuda.synchronize(device)
    return per_call


def host_bound(fwd_ms: float, busy_ms: float | None, host_ms: float | None) -> bool:
    """Whether a forward's do_bench time holds the host's (see Timing): above its GPU busy time by more than
    HOST_BOUND, with a host slow enough to be the cause."""
    return bool(busy_ms) and host_ms is not None and fwd_ms > HOST_BOUND * busy_ms and host_ms >= HOST_SHARE * busy_ms


def measure(fn, inp: Inputs, fwd_flops, bwd_flops, forward_only=False, **timing) -> dict:
    device = inp.q.device
    leaves = inp.leaves()
    if forward_only:  # (serving: no backward exists)
        fwd = time_ms(fn, device, leaves, **timing)
        return {"fwd_ms": fwd[0], "fwd_p20_ms": fwd[1], "fwd_p80_ms": fwd[2], "fwd_tflops": fwd_flops / fwd[0] / 1e9,
                "fwd_gpu_ms": gpu_busy_ms(fn, device, leaves), "bwd_ms": None, "peak_mb": None}

    def fwd_bwd():
        fn().backward(inp.dout)

    fwd = time_ms(fn, device, leaves, **timing)
    fb = time_ms(fwd_bwd, device, leaves, **timing)
    busy = {"fwd_gpu_ms": gpu_busy_ms(fn, device, leaves), "fwdbwd_gpu_ms": gpu_busy_ms(fwd_bwd, device, leaves),
            "fwd_issue_ms": issue_ms(fn, device, leaves)}
    # Noise can make forward+backward time below forward alone (CPU smoke runs): then no backward number.
    bwd_ms = fb[0] - fwd[0] if fb[0] > fwd[0] else None
    bound = host_bound(fwd[0], busy["fwd_gpu_ms"], busy["fwd_issue_ms"])
    if bound and busy["fwdbwd_gpu_ms"]:
        bwd_ms = busy["fwdbwd_gpu_ms"] - busy["fwd_gpu_ms"]
    res = {"fwd_ms": fwd[0], "bwd_ms": bwd_ms, "fwdbwd_ms": fb[0],
           "fwd_p20_ms": fwd[1], "fwd_p80_ms": fwd[2], "fwdbwd_p20_ms": fb[1], "fwdbwd_p80_ms": fb[2],
           "fwd_tflops": fwd_flops / fwd[0] / 1e9, "bwd_tflops": bwd_flops / bwd_ms / 1e9 if bwd_ms else None,
           "fwdbwd_tflops": (fwd_flops + bwd_flops) / fb[0] / 1e9, "peak_mb": None, **busy}
    if busy["fwd_gpu_ms"] and busy["fwdbwd_gpu_ms"]:
        res["bwd_gpu_ms"] = busy["fwdbwd_gpu_ms"] - busy["fwd_gpu_ms"]
    if bwd_ms is None:
        res["note"] = "backward not resolved (fwd+bwd timed below fwd)"
    elif bound:
        res["note"] = (f"host-bound forward (host {busy['fwd_issue_ms']:.3f} ms a call, GPU busy "
                       f"{busy['fwd_gpu_ms']:.3f} ms): backward from the GPU busy times")
    for t in leaves:
        t.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fwd_bwd()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        res["peak_mb"] = peak / 2**20
        res["extra_peak_mb"] = (peak - before) / 2**20
        for t in leaves:
            t.grad = None
    return res


def ceiling_tflops(device) -> tuple[float, str]:
    """The device's dense matmul rate, measured now: 8192^3 bf16 on CUDA (1024^3 fp32 on the CPU smoke run)."""
    if torch.device(device).type == "cuda":
        n, dtype = 8192, torch.bfloat16
    else:
        n, dtype = 1024, torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = time_ms(lambda: torch.matmul(a, b), device, cpu_reps=5)[0]
    return 2 * n ** 3 / ms / 1e9, f"torch.matmul {n}x{n}x{n} {str(dtype).replace('torch.', '')}"


def bandwidth_gbs(device) -> tuple[float, str]:
    """The device's copy bandwidth, measured now: bytes read plus written per second by a large copy."""
    n = (1 << 28) if torch.device(device).type == "cuda" else (1 << 24)  # 1 GiB / 64 MiB of float32
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, cpu_reps=5)[0]
    return 2 * 4 * n / ms / 1e6, f"copy of {4 * n >> 20} MiB"


def _free(device):
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _without_autograd(fn):
    """fn under torch.no_grad: a compiled provider then compiles its forward alone (with grad it compiles the
    backward too, at its first call)."""
    def call():
        with torch.no_grad():
            return fn()
    return call


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def run_workload(w, providers, device, dtype=torch.bfloat16, progress=None, roofline=None, **timing) -> dict:
    """Results of one workload: {"name", "spec", "pairs", "fwd_flops", "bwd_flops", "fwd_bytes", "bwd_bytes",
    "floor_fwd_ms", "floor_bwd_ms", "results", ratios}; roofline = (ceiling TF/s, bandwidth GB/s) or None."""
    inp = make_inputs(w, device=device, dtype=dtype)
    fwd_flops, bwd_flops = flops(w, inp.kv_lens)
    fwd_bytes, bwd_bytes = bytes_moved(w, inp.kv_lens, torch.finfo(dtype).bits // 8)
    floors = {}
    if roofline:
        tflops, gbs = roofline
        floors = {f"floor_{ph}_ms": max(f / tflops / 1e9, b / gbs / 1e6)
                  for ph, f, b in (("fwd", fwd_flops, fwd_bytes), ("bwd", bwd_flops, bwd_bytes))}
    n = gate_prefix(inp)
    heads = gate_heads(inp, n)
    gated = inp if n == inp.batch and heads == inp.q.shape[1] else inp.prefix(n, heads)
    refs, ref_error = {}, None  # per provider.check_like (jfa-softmax, jfa-causal, jfa-nobias) too
    try:
        refs[None] = reference_results(gated)
    except Exception as e:  # (out of memory): no provider can be checked, so none is timed; the run goes on
        ref_error = f"the gate's reference failed: {_error_text(e)}"
        _free(device)
    results = {}
    for p in providers:
        if progress:
            progress(w.name, p.name)
        res = results[p.name] = {}
        try:
            reason = p.skip_reason(inp)
            if reason:
                res.update(skip=reason, correct=None)
                continue
            if ref_error:
                res.update(error=ref_error, correct=None)
                continue
            fn, extras = p.build(inp)
            res.update(extras)
            like = getattr(p, "check_like", None)  # (the peers compute the workload as it is)
            key = None if like is None else tuple(sorted(like.items()))
            if key not in refs:
                refs[key] = reference_results(gated, like)
            forward_only = getattr(p, "forward_only", False)
            try:
                verdict = check(fn, inp, refs[key], n, forward_only, heads)
            except Exception as e:  # its backward may be what fails (Flex on a biased score): the forward alone
                if forward_only:
                    raise
                fn, forward_only = _without_autograd(fn), True
                verdict = check(fn, inp, refs[key], n, forward_only, heads)
                res["note"] = f"backward failed ({_error_text(e)}): forward alone, without autograd"
            res["check"] = {"seqs": n, "batch": inp.batch, "errors": verdict["errors"]}
            res["correct"] = verdict["correct"]
            if verdict["correct"]:
                m = measure(fn, inp, fwd_flops, bwd_flops, forward_only, **timing)
                for ph in ("fwd", "bwd"):
                    if floors and m.get(f"{ph}_ms"):
                        m[f"{ph}_floor_pct"] = 100 * floors[f"floor_{ph}_ms"] / m[f"{ph}_ms"]
                if res.get("note") and m.get("note"):
                    m["note"] = res["note"] + "; " + m["note"]
                res.update(m)
            del fn
        except Exception as e:  # a provider must never take the run down (OOM, compile errors, ...)
            res.update(error=_error_text(e), correct=res.get("correct"))
        finally:
            for t in inp.leaves():
                t.grad = None
            _free(device)
    out = {"name": w.name, "spec": w.spec(), "pairs": int(fwd_flops / (4 * w.heads_q * w.head_dim)),
           "fwd_flops": fwd_flops, "bwd_flops": bwd_flops, "fwd_bytes": fwd_bytes, "bwd_bytes": bwd_bytes,
           **floors, "gate": {"sequences": n, "heads": heads}, "results": results}
    out.update(ratios(results, {p.name: p.peer for p in providers if not p.yardstick}))
    del inp, refs
    _free(device)
    return out


def ratios(results: dict, is_peer: dict) -> dict:
    """jfa providers' TF/s over the fastest correct peer's, per phase: {"best_peer": {...}, "ratios": {...}}.
    is_peer: provider name -> whether it is a peer (jfa's own: False); a name not in it is in no ratio."""
    best, rat = {}, {}
    for phase in ("fwd", "bwd"):
        key = f"{phase}_tflops"
        peers = [(r[key], name) for name, r in results.items() if is_peer.get(name) and r.get(key)]
        if not peers:
            continue
        top, top_name = max(peers)
        best[phase] = {"provider": top_name, "tflops": top}
        for name, r in results.items():
            if is_peer.get(name) is False and r.get(key):
                rat.setdefault(name, {})[phase] = r[key] / top
    return {"best_peer": best, "ratios": rat}


def run(workloads, providers=None, device="cuda", dtype=torch.bfloat16, env=None, progress=None, on_result=None,
        **timing) -> dict:
    """The whole run: results.json's structure."""
    providers = providers if providers is not None else providers_mod.all_providers()
    ceiling, ceiling_how = ceiling_tflops(device)
    bandwidth, bandwidth_how = bandwidth_gbs(device)
    data = {"env": env or {}, "ceiling_tflops": ceiling, "ceiling": ceiling_how, "bandwidth_gbs": bandwidth,
            "bandwidth": bandwidth_how, "dtype": str(dtype).replace(
        "torch.", ""), "workloads": []}
    for w in workloads:
        wres = run_workload(w, providers, device, dtype, progress=progress, roofline=(ceiling, bandwidth), **timing)
        data["workloads"].append(wres)
        if on_result:
            on_result(wres)
    return data
