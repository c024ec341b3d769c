"""Host (CPU) time per call of jfa's forward and backward on suite workloads (bf16, an sm_90 GPU): what a call
costs before its kernels run, which do_bench counts whenever it exceeds the GPU time (short batches).

    python benchmarks/host_time.py [--only NAME,...] [--batch N] [--calls 300] [--profile]

Per workload, for each layer of the call (the public function as `jfa bench` calls it, with and without grad,
and forward + backward as the bench times it; jfa.hopper.forward and jfa.hopper.backward alone; the forward's
TMA descriptors, schedule cache refresh launch and output allocations): "issue" = CPU time per call over `calls`
calls issued without a sync, "wall" = the same until the GPU is done (issue ~ wall: the loop is host-bound).
A loop whose GPU time exceeds its host time fills the launch queue, and then issue time includes the wait: --batch
N runs each workload with N sequences of the same length distribution (the same kernel configurations), so the GPU
keeps up and issue time is the host's. The forward kernel's launch is also split into Triton's parts (its
JITFunction.run, the argument binder that specializes and keys the kernel, and the compiled kernel's launcher),
beside jfa's own launch of it (jfa.runtime.launch, the compiled kernel kept).
--profile adds cProfile's top functions of the public call and of forward + backward.
"""
import argparse
import cProfile
import dataclasses
import io
import pstats
import time

import torch
from triton import knobs

from jfa import hopper, runtime
from jfa.bench import providers, suite
from jfa.hopper import fwd
from jfa.hopper.config import fwd_config, query_tile_schedule
from jfa.runtime import num_sms
from jfa.schedule import CACHE


def per_call_us(fn, calls):
    """(issue, wall) microseconds per call."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def launch_parts(kernel, call):
    """name -> fn: the kernel's next launch inside call() replayed whole (JITFunction.run), its binder alone and its
    compiled kernel's launcher alone (Triton 3.6's JITFunction.run, step by step), and as jfa launches it again
    (jfa.runtime.launch: the kernel kept from the first launch)."""
    seen = {}

    def spy(*args, grid, warmup, **kwargs):
        seen.update(args=args, kwargs=kwargs, grid=grid)
        return type(kernel).run(kernel, *args, grid=grid, warmup=warmup, **kwargs)

    kernel.run = spy  # an instance attribute shadows the method for this one call
    runtime._KERNELS.clear()  # (so that the call goes down Triton's path)
    try:
        call()
    finally:
        del kernel.run
    args, kwargs, grid = seen["args"], seen["kwargs"], seen["grid"]
    compiled = kernel.run(*args, grid=grid, warmup=False, **kwargs)
    device = torch.cuda.current_device()
    binder = kernel.device_caches[device][4]
    bind_kwargs = dict(kwargs, debug=False, instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound = list(binder(*args, **bind_kwargs)[0].values())
    stream = torch.cuda.current_stream().cuda_stream
    return {
        "fwd kernel: jit.run": lambda: kernel.run(*args, grid=grid, warmup=False, **kwargs),
        "fwd kernel: binder": lambda: binder(*args, **bind_kwargs),
        "fwd kernel: launcher": lambda: compiled.run(grid[0], 1, 1, stream, compiled.function,
                                                     compiled.packed_metadata, None, None, None, *bound),
        "fwd kernel: jfa.runtime.launch": lambda: runtime.launch(kernel, grid, *args, **kwargs),
    }


def layers(inp):
    """name -> fn: the forward's host work, from the public call down."""
    public, _ = providers.Jfa().build(inp)
    p = inp.problem("hopper")  # the public call's problem
    q, k, v, rows = p.q, p.k, p.v, p.rows
    cfg = fwd_config(p)
    spec = query_tile_schedule(p, rows, cfg.block_m, num_sms(q.device) * cfg.ctas_per_sm)

    def no_grad():
        with torch.no_grad():
            return public()

    def fwd_bwd():  # as jfa.bench.runner.measure (do_bench sets the leaves' grads to None)
        for t in inp.leaves():
            t.grad = None
        public().backward(inp.dout)

    out, lse = hopper.forward(p)

    return {
        "public call, grad": public,
        "public call, no_grad": no_grad,
        "public fwd + bwd": fwd_bwd,
        "jfa.hopper.backward": lambda: hopper.backward(p, out, lse, inp.dout, None),
        "jfa.hopper.forward": lambda: hopper.forward(p),
        "TMA descriptors x3": lambda: fwd.descriptors(q, k, v, cfg),
        "schedule cache get": lambda: CACHE.get(p.q_offsets, p.kv_offsets, spec, k.shape[0]),
        **launch_parts(fwd.hopper_fwd_kernel, lambda: hopper.forward(p)),
        "torch.empty x2": lambda: (torch.empty(rows, q.shape[1], q.shape[2], dtype=q.dtype, device=q.device),
                                   torch.empty(q.shape[1], rows, dtype=torch.float32, device=q.device)),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="pma-32-d64,targets-32", help="comma-separated suite workloads")
    p.add_argument("--batch", type=int, help="sequences per workload (default: the suite's)")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--profile", action="store_true", help="cProfile of the public call, top 20 by own time")
    args = p.parse_args(argv)
    _, workloads = suite.load_suite()
    for w in (w for w in workloads if w.name in args.only.split(",")):
        w = dataclasses.replace(w, batch=args.batch) if args.batch else w
        inp = suite.make_inputs(w, device="cuda", dtype=torch.bfloat16)
        fns = layers(inp)
        for name, fn in fns.items():
            issue, wall = per_call_us(fn, args.calls)
            print(f"{w.name:18s} {name:22s} issue {issue:7.1f} us/call  wall {wall:7.1f} us/call", flush=True)
        for name in ("public call, grad", "public fwd + bwd") if args.profile else ():
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                fns[name]()
            prof.disable()
            torch.cuda.synchronize()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
            print(f"== {name}\n{out.getvalue()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
