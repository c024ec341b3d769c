"""A/B of jfa's backward variants on the suite, in one run (bf16, an sm_90 GPU).

    python benchmarks/ab_backward.py [--only NAME,...] [--variants triton,gluon-fused,...]
    python benchmarks/ab_backward.py --passes [--only NAME,...]

Variants: the portable Triton backward ("triton") and the Gluon backward with every configuration of its dK/dV
pass in jfa.hopper.bwd.VARIANTS ("gluon-<name>"), all from the same forward output. Each is first checked
against the float64 reference on the suite's first sequences (jfa.testing.compare, the tests' tolerance); a
variant that fails is reported, not timed. Timed: the backward alone (median of do_bench, schedules cached as
the backend caches them). Prints TF/s (2.5 x the forward's exact visible-pair FLOPs) and the ratio to the
first variant. --passes: the Gluon backward's parts timed apart instead (Delta, the two-pass dK/dV and dQ
passes, the fused dK/dV/dQ pass), each with TF/s over its share of the 5 matmuls. Peers' backward: `jfa bench`.
The numbers go into docs/perf-notes.md.
"""
import argparse

import torch

import jfa  # noqa: F401  (first: sets up Triton for the device)
import triton  # noqa: E402
from jfa.bench import suite
from jfa.hopper import bwd, fwd
from jfa.testing import Case, compare
from jfa.triton import launch


def variants():
    """name -> fn(inputs, out, lse) computing (dq, dk, dv)."""
    out = {"triton": lambda i, o, lse: launch.backward(i.dout, None, *_args(i, o, lse))}
    for name in bwd.VARIANTS:
        out[f"gluon-{name}"] = (lambda v: lambda i, o, lse: bwd.backward(
            i.dout, None, *_args(i, o, lse), cfg=bwd.config(i.q.shape[2], v)))(name)
    return out


def _args(i, out, lse):
    left, right = i.window
    return (i.q.detach(), i.k.detach(), i.v.detach(), out, lse, i.q_offsets, i.kv_offsets, i.scale, left, right,
            i.workload.broadcast)


def _forward(i):
    left, right = i.window
    from jfa.hopper import SCHEDULES
    return fwd.forward(i.q.detach(), i.k.detach(), i.v.detach(), i.q_offsets, i.kv_offsets, i.scale, left, right,
                       i.workload.broadcast, schedules=SCHEDULES)


def check(fn, inp, n):
    sub = inp.prefix(n)
    left, right = sub.window
    case = Case(sub.q.detach(), sub.k.detach(), sub.v.detach(), sub.q_offsets, sub.kv_offsets, sub.dout, left, right,
                sub.workload.broadcast, sub.scale)
    out, lse = _forward(sub)
    shape = (-1, ) + tuple(sub.q.shape[1:])
    return compare(case, out.reshape(shape), lse, fn(sub, out, lse))


def _passes(w, inp, out, lse, bwd_flops):
    """One line: ms of each part of the Gluon backward, and TF/s over its own matmuls (of the 5)."""
    from jfa.hopper import bwd_dq
    q, k, v, _, _, q_offsets, kv_offsets, scale, left, right, broadcast = _args(inp, out, lse)
    delta = launch.bwd_delta(out, inp.dout, None, lse)
    args = (q, k, v, inp.dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq = torch.empty(out.shape, device=q.device, dtype=torch.float32 if broadcast else q.dtype)
    dq32 = torch.zeros(out.shape, device=q.device, dtype=torch.float32)
    d = q.shape[2]
    parts = {"delta": (lambda: launch.bwd_delta(out, inp.dout, None, lse), 0),
             "dkdv": (lambda: bwd.dkdv(*args, dk, dv, cfg=bwd.config(d, "two-pass")), 4),
             "dq": (lambda: bwd_dq.dq_pass(*args, dq), 3),
             "fused": (lambda: bwd.dkdv(*args, dk, dv, dq32.zero_(), cfg=bwd.config(d, "fused")), 5)}
    cells = []
    for name, (fn, matmuls) in parts.items():
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        rate = f" {bwd_flops * matmuls / 5 / ms / 1e9:.0f} TF/s" if matmuls else ""
        cells.append(f"{name} {ms:.3f} ms{rate}")
    print(f"{w.name:<18} " + " | ".join(cells), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only")
    p.add_argument("--variants", help="comma-separated names (default: all); the first is the ratios' base")
    p.add_argument("--passes", action="store_true", help="time the Gluon backward's passes apart")
    args = p.parse_args()
    _, workloads = suite.load_suite()
    fns = variants()
    if args.variants:
        fns = {name: fns[name] for name in args.variants.split(",")}
    print(f"{'workload':<18}" + "".join(f"{name:>22}" for name in fns))
    for w in suite.select(workloads, args.only):
        inp = suite.make_inputs(w, device="cuda", dtype=torch.bfloat16)
        bwd_flops = 2.5 * 4 * w.heads_q * w.head_dim * suite.pairs(w, inp.kv_lens)
        out, lse = _forward(inp)
        if args.passes:
            _passes(w, inp, out, lse, bwd_flops)
            continue
        row, base = [], None
        for name, fn in fns.items():
            try:
                bad = check(fn, inp, min(inp.batch, 8))
                if bad:
                    row.append("WRONG")
                    print(f"  {w.name} {name}: {bad}")
                    continue
                ms = triton.testing.do_bench(lambda: fn(inp, out, lse), warmup=25, rep=100, return_mode="median")
            except Exception as e:  # report and go on: a failing variant must not hide the others
                row.append("error")
                print(f"  {w.name} {name}: {type(e).__name__}: {str(e)[:300]}")
                continue
            tflops = bwd_flops / ms / 1e9
            base = base or (tflops if name == next(iter(fns)) else None)
            row.append(f"{tflops:.0f}" + (f" ({tflops / base:.2f}x)" if base else ""))
        print(f"{w.name:<18}" + "".join(f"{c:>22}" for c in row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
