"""``jfa info | check | demo | bench``: what is here, is it correct here, show it, and how fast.

    jfa info    versions, the device, the backends available
    jfa check   the correctness matrix on this device, fwd + bwd, every backend: each mode, score function and HSTU's
                mask at one dtype and head dim, and each other dtype and head dim once (--full: all crossed)
    jfa demo    a small GEM-like jagged batch through the best backend, checked against the reference
    jfa bench   the benchmark suite against the peers (see jfa.bench)
"""
from __future__ import annotations

import argparse
import platform
import sys
import time

import torch

import jfa
from jfa import bench
from jfa.backends import BACKENDS, available_backends, select
from jfa.testing import CPU_MODES as MODES  # the correctness matrix: the named modes on awkward lengths
from jfa.testing import CPU_VARIANTS as VARIANTS  # and the score functions and HSTU's mask
from jfa.testing import compare, each_once, make_case, run_backend


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def info(_args) -> int:
    import numpy
    import triton

    from jfa.triton.launch import interpreting
    dev = _device()
    print(f"jfa {jfa.__version__}  python {platform.python_version()}  torch {torch.__version__}  "
          f"triton {triton.__version__}  numpy {numpy.__version__}")
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(0)
        print(f"device: {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
              f"{p.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}")
    else:
        print(f"device: CPU ({platform.processor() or platform.machine()}), no CUDA; "
              f"Triton interpreter {'on' if interpreting() else 'off'}")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for d in (64, 128, 256):
            names = available_backends(dev, d, dtype)
            print(f"  {str(dtype).replace('torch.', ''):>8} D={d:<4} backends: {', '.join(names)}  "
                  f"(auto -> {select('auto', dev, d, dtype)})")
    return 0


def check(args) -> int:
    """Each mode and variant at the flagship dtype and head dim, and each other dtype and each other head dim once (in
    causal mode): what a kernel form depends on is covered without crossing it all (--full crosses it all: on the GPU,
    minutes of compiling)."""
    dev = _device()
    if dev.type == "cuda":
        dtypes, dims, flagship = (torch.bfloat16, torch.float16, torch.float32), (32, 64, 96, 128, 256), 128
    else:
        dtypes, dims, flagship = (torch.float32, torch.bfloat16), (64,), 64
    if args.dtype:
        dtypes = tuple(getattr(torch, name) for name in args.dtype.split(","))
    backends = [b for b in BACKENDS if b != "reference"] if not args.backend else args.backend.split(",")
    cases = {**MODES, **VARIANTS}
    flagship = flagship if flagship in dims else dims[0]
    if args.full:
        runs = [(mode, (dtype, d)) for dtype in dtypes for d in dims for mode in cases]
    else:  # each head dim at the first dtype, each dtype at the flagship head dim: a kernel form depends on each alone
        shapes = [(dtypes[0], d) for d in dims] + [(dtype, flagship) for dtype in dtypes[1:]]
        runs = each_once(list(cases), shapes, "causal", (dtypes[0], flagship))
    print(f"jfa check on {torch.cuda.get_device_name(0) if dev.type == 'cuda' else 'CPU'}: {len(backends)} backend(s); "
          f"{len(MODES)} modes + {len(VARIANTS)} variants (each score function, HSTU's mask) "
          + ("x every dtype and head dim" if args.full else
             f"at {str(runs[0][1][0])[6:]} D={runs[0][1][1]}, and each other dtype and head dim in causal mode"),
          flush=True)
    failures = total = 0
    for backend in backends:
        for shape in dict.fromkeys(shape for _, shape in runs):
            dtype, d = shape
            if not BACKENDS[backend].supports(dev, d, dtype):
                print(f"  {backend:<9} {str(dtype)[6:]:>8} D={d:<4} not supported here: skipped", flush=True)
                continue
            t0, bad = time.perf_counter(), []
            group = [mode for mode, s in runs if s == shape]
            for mode in group:
                case = make_case(**cases[mode], d=d, dtype=dtype, device=dev, seed=d + len(mode))
                total += 1
                errs = compare(case, *run_backend(case, backend))
                if errs:
                    bad.append(f"{mode}: {errs[0]}")
            failures += len(bad)
            what = f"{len(group)} modes and variants" if len(group) > 1 else group[0]
            status = "ok" if not bad else f"FAIL ({len(bad)})"
            print(f"  {backend:<9} {str(dtype)[6:]:>8} D={d:<4} {what} fwd+bwd: {status}  "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
            for line in bad:
                print(f"      {line}")
    print(f"{total - failures}/{total} passed")
    return 1 if failures else 0


def _timed(fn, dev, reps):
    fn()  # warm-up (compiles on the GPU)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3


def demo(_args) -> int:
    """GEM-like: skewed user histories (L = max_len * u^3) with self-attention, then PMA pooling."""
    dev = _device()
    gpu = dev.type == "cuda"
    backend = select("auto", dev, 128, torch.bfloat16) if gpu else "triton"
    batch, max_len, heads, d, lq = (256, 2048, 8, 128, 64) if gpu else (6, 160, 2, 64, 16)
    g = torch.Generator().manual_seed(0)
    lens = torch.clamp((torch.rand(batch, generator=g) ** 3 * max_len).long(), min=1)
    lens[0] = max_len
    print(f"jfa demo on {torch.cuda.get_device_name(0) if gpu else 'CPU (Triton interpreter)'}: backend "
          f"'{backend}' vs the reference; {batch} user histories, lengths {int(lens.min())}..{int(lens.max())} "
          f"(skewed), {int(lens.sum())} tokens, {heads} heads, D={d}, bf16")
    rows = []
    for name, kw in (("self, causal", dict(q_lens=lens.tolist(), causal=True)),
                     (f"PMA pooling (q={lq})", dict(q_lens=None, kv_lens=lens.tolist(), broadcast_lq=lq))):
        case = make_case(**kw, hq=heads, hkv=heads, d=d, dtype=torch.bfloat16, device=dev, seed=1)
        out, lse, grads = run_backend(case, backend)
        ok = not compare(case, out, lse, grads)
        ref_out, _, ref_grads = run_backend(case, "reference")
        err_f = ((out.float() - ref_out.float()).norm() / ref_out.float().norm()).item()
        err_b = max(((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()
                    for a, b in zip(grads, ref_grads))
        reps = 10 if gpu else 1
        step_ms = _timed(lambda: run_backend(case, backend), dev, reps)
        rows.append((name, tuple(case.q.shape), tuple(case.k.shape), err_f, err_b, step_ms, ok))
    print(f"{'mode':<22}{'q':>16}{'k/v':>16}{'rel err fwd':>13}{'rel err bwd':>13}{'fwd+bwd ms':>12}  check")
    for name, qs, ks, ef, eb, ms, ok in rows:
        print(f"{name:<22}{str(qs):>16}{str(ks):>16}{ef:>13.2e}{eb:>13.2e}{ms:>12.2f}  {'ok' if ok else 'FAIL'}")
    return 0 if all(r[-1] for r in rows) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="jfa", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, device, backends").set_defaults(fn=info)
    p = sub.add_parser("check", help="the correctness matrix on this device")
    p.add_argument("--backend", help="comma-separated backends (default: all but the reference)")
    p.add_argument("--dtype", help="comma-separated dtypes, e.g. float32 (default: all for the device; the first one "
                   "takes every mode)")
    p.add_argument("--full", action="store_true", help="every mode and variant at every dtype and head dim")
    p.set_defaults(fn=check)
    sub.add_parser("demo", help="a GEM-like batch through the best backend, checked").set_defaults(fn=demo)
    p = sub.add_parser("bench", help="the benchmark suite against the peers")
    bench.build_parser(p)
    p.set_defaults(fn=lambda a: bench.main(a))
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
