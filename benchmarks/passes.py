"""Time the hopper backend's parts apart on the suite (bf16, an sm_90 GPU): the schedule refresh on a cache hit
and with a rebuild, the forward, Delta, the one-pass backward kernel (also in its short-q form: 32-row (Q, dO)
blocks and two K/V sets at D=128, whatever the batch), the two-pass backward's dK/dV pass (without
and with the direct dQ of single-key-tile sequences) and dQ pass (whole, and skipping those sequences), and each
whole backward (Delta, zeroing, casts included; given the longest sequence's keys, as `jfa bench`'s calls are).
Every workload of the suite, the score functions' and HSTU's mask's included.

    python benchmarks/passes.py [--only NAME,...] [--parts PART,...] [--rep-ms 100] [--calls N] [--clocks]

One line per workload: each part's median ms (triton.testing.do_bench) and, for the kernels, TF/s over the
matmuls each one does (forward 2 of 2; one pass 5, dK/dV 4 and dQ 3 of the backward's 5). Use it to see which part a
change moved; `jfa bench` is the end-to-end number against the peers. --calls N: no timing, each part called N
times, for a profiler (scripts/profile.sh runs ncu on it). --clocks: each timed part's mean SM clock and power draw
beside it (jfa.bench.clocks: a GPU at its power limit clocks down by how much its operands make it draw).
"""
import argparse
import contextlib

import torch
from triton.testing import do_bench

from jfa import hopper
from jfa.bench import suite
from jfa.bench.clocks import Clocks
from jfa.hopper import bwd, bwd_dq
from jfa.hopper.config import (SHORT_Q, DqRoute, for_problem, fwd_config, query_tile_schedule, select_dkdv,
                               select_dq)
from jfa.runtime import num_sms
from jfa.schedule import CACHE


def parts(inp):
    """name -> (fn, share of the phase's FLOPs it does, phase)."""
    w = inp.workload
    p = inp.problem("hopper", max_kv_len=None)
    q, k = p.q, p.k
    out, lse = hopper.forward(p)
    dout, delta = hopper.row_stats(p, out, lse, inp.dout, None)  # (an activation: no Delta, dO scaled per row)
    dk, dv = torch.empty_like(k), torch.empty_like(p.v)
    dq = torch.empty(out.shape, device=q.device, dtype=torch.float32 if w.broadcast else q.dtype)
    dq32 = torch.zeros(out.shape, device=q.device, dtype=torch.float32)  # sums of every timed run: unread
    cfg = fwd_config(p)
    spec = query_tile_schedule(p, p.rows, cfg.block_m, num_sms(q.device) * cfg.ctas_per_sm)
    sched = CACHE.get(p.q_offsets, p.kv_offsets, spec, k.shape[0], p.num_targets)
    one_pass = for_problem(select_dkdv(p.head_dim, DqRoute.REDUCE, p.rows / p.batch), p)
    one_pass_32 = for_problem(select_dkdv(p.head_dim, DqRoute.REDUCE, SHORT_Q), p)  # (at D=128: 32-row blocks)
    bounded = p.replace(max_kv_len=inp.max_kv)  # as `jfa bench` calls it

    def rebuild():
        sched.seen.fill_(-1)  # forget the offsets: the refresh rebuilds
        CACHE.get(p.q_offsets, p.kv_offsets, spec, k.shape[0], p.num_targets)

    def dkdv(route, into=None):
        cfg = for_problem(select_dkdv(p.head_dim, route, p.rows / p.batch), p)
        return lambda: bwd.dkdv(p, dout, lse, delta, dk, dv, cfg, into)

    timed = {"refresh (hit)": (lambda: CACHE.get(p.q_offsets, p.kv_offsets, spec, k.shape[0], p.num_targets), 0,
                               None),
             "refresh (rebuild)": (rebuild, 0, None),
             "forward": (lambda: hopper.forward(p), 1, "fwd"),
             "delta": (lambda: hopper.row_stats(p, out, lse, inp.dout, None), 0, None),
             "one pass": (lambda: bwd.dkdv(p, dout, lse, delta, dk, dv, one_pass, dq32), 1, "bwd"),
             "one pass (short-q form)": (lambda: bwd.dkdv(p, dout, lse, delta, dk, dv, one_pass_32, dq32), 1, "bwd"),
             "dkdv": (dkdv(DqRoute.NONE), 4 / 5, "bwd"),
             "dkdv+direct dq": (dkdv(DqRoute.DIRECT, dq), 1, "bwd"),
             "dq": (lambda: bwd_dq.dq_pass(p, dout, lse, delta, dq, select_dq(p.head_dim)), 3 / 5, "bwd"),
             "dq (skip <= 128 keys)": (lambda: bwd_dq.dq_pass(p, dout, lse, delta, dq, select_dq(p.head_dim),
                                                               skip_kv=128), 0, None),
             "backward (default)": (lambda: hopper.backward(bounded, out, lse, inp.dout, None), 1, "bwd"),
             "backward (deterministic)": (lambda: hopper.backward(bounded.replace(deterministic=True), out, lse,
                                                                  inp.dout, None), 1, "bwd")}
    if w.broadcast:  # broadcast q's dQ sums over the batch: no item has it whole
        del timed["dkdv+direct dq"], timed["dq (skip <= 128 keys)"]
    return timed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help="comma-separated workload names (default: the whole suite)")
    p.add_argument("--parts", help="comma-separated parts to time (default: all), e.g. 'forward,backward (default)'")
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--calls", type=int, help="call each part this many times, untimed (for a profiler)")
    p.add_argument("--clocks", action="store_true", help="each part's mean SM clock and power draw (nvidia-smi)")
    args = p.parse_args(argv)
    wanted = None if args.parts is None else set(args.parts.split(","))
    _, workloads = suite.load_suite()
    for w in suite.select(workloads, args.only):
        inp = suite.make_inputs(w, device="cuda", dtype=torch.bfloat16)
        fwd_flops, bwd_flops = suite.flops(w, inp.kv_lens)
        cells = []
        for name, (fn, share, phase) in parts(inp).items():
            if wanted is not None and name not in wanted:
                continue
            if args.calls:
                for _ in range(args.calls):
                    fn()
                torch.cuda.synchronize()
                cells.append(f"{name} called {args.calls}x")
                continue
            clocks = Clocks() if args.clocks else contextlib.nullcontext()
            with clocks:
                ms = do_bench(fn, warmup=25, rep=args.rep_ms, return_mode="median")
            flops = {"fwd": fwd_flops, "bwd": bwd_flops}.get(phase, 0) * share
            cells.append(f"{name} {ms:.3f} ms" + (f" {flops / ms / 1e9:.0f} TF/s" if flops else "")
                         + (f" @ {clocks.text()}" if args.clocks else ""))
        print(f"{w.name:<18} " + " | ".join(cells), flush=True)
        del inp
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
