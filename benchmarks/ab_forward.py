"""A/B of jfa's forward variants on the suite, in one run, with the peers' forward beside them (bf16, CUDA).

    python benchmarks/ab_forward.py [--only NAME,...]

Variants: the portable Triton forward on its grid ("triton-grid") and every configuration of the Hopper
forward in jfa.hopper.fwd.VARIANTS ("hopper-<name>"); peers: FA2 (torch varlen_attn) and FA4 when importable. Each variant is first checked against the reference on the suite's
first sequences (jfa.testing tolerance); a variant that fails is reported, not timed. Prints TF/s (exact
visible pairs) and the ratio to the grid forward. The numbers go into docs/perf-notes.md.
"""
import argparse

import torch

import jfa  # noqa: F401  (first: on a machine without CUDA it turns on Triton's interpreter)
import triton  # noqa: E402
from jfa import reference
from jfa.bench import providers, suite
from jfa.schedule import ScheduleCache
from jfa.testing import allowed_error, error_report
from jfa.triton import launch


def variants():
    """name -> build(inputs) -> fn() computing the forward output: jfa's variants, then the bench's peers."""
    from jfa.hopper import fwd as hopper
    out = {
        "triton-grid": lambda i: (lambda: launch.forward(*_args(i), schedule="grid")[0]),
    }
    for name in hopper.VARIANTS:  # each with its own schedule cache: timed as the backend runs (built once)
        out[f"hopper-{name}"] = (lambda v, cache: lambda i: (
            lambda: hopper.forward(*_args(i), schedules=cache, cfg=hopper.config(i.q.shape[2], v))[0]))(
                name, ScheduleCache())
    for peer in (providers.TorchVarlen(), providers.FA4()):  # called exactly as `jfa bench` calls them
        out[peer.name] = (lambda p: lambda i: _peer_fn(p, i))(peer)
    return out


def _peer_fn(peer, inp):
    reason = peer.skip_reason(inp)
    if reason:
        raise RuntimeError(f"skipped: {reason}")
    return peer.build(inp)[0]


def _args(i):
    left, right = i.window
    return (i.q.detach(), i.k.detach(), i.v.detach(), i.q_offsets, i.kv_offsets, i.scale, left, right,
            i.workload.broadcast)


def check(build, inp, n):
    """Forward of the first n sequences against the float64 reference."""
    sub = inp.prefix(n)
    left, right = sub.window
    kw = dict(scale=sub.scale, left=left, right=right, broadcast=sub.workload.broadcast)
    truth, _ = reference.attention(sub.q.detach(), sub.k.detach(), sub.v.detach(), sub.q_offsets, sub.kv_offsets,
                                   **kw, compute_dtype=torch.float64)
    lowp, _ = reference.attention(sub.q.detach(), sub.k.detach(), sub.v.detach(), sub.q_offsets, sub.kv_offsets,
                                  **kw, compute_dtype=None)
    with torch.no_grad():
        got = build(sub)().reshape(truth.shape)
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
    fns = variants()
    print(f"{'workload':<18}" + "".join(f"{name:>19}" for name in fns))
    for w in workloads:
        inp = suite.make_inputs(w, device=device, dtype=torch.bfloat16)
        fwd_flops = 4 * w.heads_q * w.head_dim * suite.pairs(w, inp.kv_lens)
        n = min(inp.batch, 8)
        row, base = [], None
        for name, build in fns.items():
            try:
                bad = check(build, inp, n)
                if bad:
                    row.append("WRONG")
                    print(f"  {w.name} {name}: {bad}")
                    continue
                if args.cpu_check:
                    row.append("ok")
                    continue
                with torch.no_grad():
                    ms = triton.testing.do_bench(build(inp), warmup=25, rep=100, return_mode="median")
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
