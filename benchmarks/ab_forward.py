"""A/B of jfa's forward variants on the suite, in one run, with the peers' forward beside them (bf16, CUDA).

    python benchmarks/ab_forward.py [--only NAME,...]

Variants: the portable Triton forward on its grid ("triton-grid") and persistent over the load-balanced
schedule ("triton-persistent"), and the DRAFT Gluon Hopper forward ("hopper-draft"); peers: FA2 (torch
varlen_attn) and FA4 when importable. Each variant is first checked against the reference on the suite's
first sequences (jfa.testing tolerance); a variant that fails is reported, not timed. Prints TF/s (exact
visible pairs) and the ratio to the grid forward. The numbers go into docs/perf-notes.md.
"""
import argparse

import torch

import jfa  # noqa: F401  (first: on a machine without CUDA it turns on Triton's interpreter)
import triton  # noqa: E402
from jfa import reference
from jfa.bench import suite
from jfa.testing import allowed_error, error_report
from jfa.triton import launch


def variants():
    from jfa.hopper import fwd as hopper
    return {
        "triton-grid": lambda i: launch.forward(*_args(i), schedule="grid")[0],
        "triton-persistent": lambda i: launch.forward(*_args(i), schedule="persistent")[0],
        "hopper-draft": lambda i: hopper.forward(*_args(i))[0],
    }


def peers():
    out = {}
    try:
        from torch.nn.attention.varlen import varlen_attn

        def fa2(i):
            q = _expanded_q(i)
            k, v = i.k, i.v
            if q.shape[1] != k.shape[1]:
                k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
            return varlen_attn(q, k, v, i.q_offsets, i.kv_offsets, i.max_q, i.max_kv, window_size=i.window)
        out["fa2"] = fa2
    except ImportError:
        pass
    try:
        from flash_attn.cute import flash_attn_varlen_func

        def fa4(i):
            left, right = i.window
            causal = left < 0 and right == 0
            window = (None, None) if causal else (None if left < 0 else left, None if right < 0 else right)
            o = flash_attn_varlen_func(_expanded_q(i), i.k, i.v, cu_seqlens_q=i.q_offsets, cu_seqlens_k=i.kv_offsets,
                                       max_seqlen_q=i.max_q, max_seqlen_k=i.max_kv, causal=causal,
                                       window_size=window)
            return o[0] if isinstance(o, tuple) else o
        out["fa4"] = fa4
    except ImportError:
        pass
    return out


def _expanded_q(i):
    return i.q.detach().repeat(i.batch, 1, 1) if i.workload.broadcast else i.q.detach()


def _args(i):
    left, right = i.window
    return (i.q.detach(), i.k.detach(), i.v.detach(), i.q_offsets, i.kv_offsets, i.scale, left, right,
            i.workload.broadcast)


def check(fn, inp, n):
    """Forward of the first n sequences against the float64 reference."""
    sub = inp.prefix(n)
    left, right = sub.window
    kw = dict(scale=sub.scale, left=left, right=right, broadcast=sub.workload.broadcast)
    truth, _ = reference.attention(sub.q.detach(), sub.k.detach(), sub.v.detach(), sub.q_offsets, sub.kv_offsets,
                                   **kw, compute_dtype=torch.float64)
    lowp, _ = reference.attention(sub.q.detach(), sub.k.detach(), sub.v.detach(), sub.q_offsets, sub.kv_offsets,
                                  **kw, compute_dtype=None)
    got = fn(sub).reshape(truth.shape)
    return error_report("out", got, truth, allowed_error(sub.q.dtype, lowp, truth))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only")
    p.add_argument("--cpu-check", action="store_true",
                   help="no GPU: check the variants on a scaled-down suite in the interpreter, no timing")
    args = p.parse_args()
    _, workloads = suite.load_suite()
    workloads = suite.select(workloads, args.only)
    device = "cpu" if args.cpu_check else "cuda"
    if args.cpu_check:
        workloads = [suite.scale_down(w) for w in workloads]
    fns = dict(variants(), **peers())
    print(f"{'workload':<18}" + "".join(f"{name:>19}" for name in fns))
    for w in workloads:
        inp = suite.make_inputs(w, device=device, dtype=torch.bfloat16)
        fwd_flops = 4 * w.heads_q * w.head_dim * suite.pairs(w, inp.kv_lens)
        n = min(inp.batch, 8)
        row, base = [], None
        for name, fn in fns.items():
            try:
                bad = check(fn, inp, n)
                if bad:
                    row.append("WRONG")
                    print(f"  {w.name} {name}: {bad}")
                    continue
                if args.cpu_check:
                    row.append("ok")
                    continue
                with torch.no_grad():
                    ms = triton.testing.do_bench(lambda: fn(inp), warmup=25, rep=100, return_mode="median")
            except Exception as e:  # report and go on: a failing variant must not hide the others
                row.append("error")
                print(f"  {w.name} {name}: {type(e).__name__}: {str(e)[:300]}")
                continue
            tflops = fwd_flops / ms / 1e9
            base = base or (tflops if name == "triton-grid" else None)
            ratio = f" ({tflops / base:.2f}x)" if base else ""
            row.append(f"{tflops:.0f}{ratio}")
        print(f"{w.name:<18}" + "".join(f"{c:>19}" for c in row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
