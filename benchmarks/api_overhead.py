"""Host time per call of jfa's public functions: above the backend (--backend stub: a stub backend that does no
work, returning preallocated outputs and gradients, so what is timed is validation, autograd and dispatch), or
down through the hopper backend's host path and Triton's own launch path (--backend hopper: configs, schedules,
descriptors, allocations, arguments, and each launch's binding, specialization and cache key or jfa.runtime.launch's
compiled-kernel path; only Triton's compiles and its C launcher are faked, so neither the driver's launch nor the GPU
is in these numbers: benchmarks/host_time.py measures those on the device). Runs on the CPU (no GPU needed; Triton
in compiled mode, whatever TRITON_INTERPRET says); A/B two commits by PYTHONPATH, alternating runs:

    python benchmarks/api_overhead.py [--calls 500] [--rounds 5] [--backend stub|hopper] [--device cpu]
    PYTHONPATH=/path/to/other/jfa python benchmarks/api_overhead.py      (the same, for another copy of jfa)

Cases: broadcast q (32 x 8 heads x D=64, as pma-32-d64) and cross-attention (32 queries per sequence, causal,
4 heads x D=128, as targets-32), each forward with grad and forward + backward (torch.autograd.grad); with
--backend hopper also gelu_tanh cross-attention (up to 64 keys, as gdpa-cross-short-kv), and the forward's
time from the call to its kernel's launch ("to launch": a short forward's do_bench span holds it wherever the
host is slower than the GPU, docs/perf-notes.md). Prints the median and minimum over rounds of microseconds per
call. With the hopper backend, out and lse are the CPU's allocations (a few microseconds more than the CUDA
caching allocator's at these sizes), and it first checks, per case, that a repeated call launches every kernel
with the arguments Triton's own path gives its launcher (jfa.runtime.launch's kept kernels).
"""
import argparse
import ctypes
import importlib.util
import os
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # (before triton's import: its kernels as on the GPU, their launch faked)
import torch  # noqa: E402

import jfa  # noqa: E402
import jfa.checks  # noqa: E402
from jfa import runtime  # noqa: E402
from jfa.backends import BACKENDS, Backend  # noqa: E402

# the CPU host harness from this checkout's jfa/bench/host.py, whichever jfa is imported (an A/B by PYTHONPATH)
_spec = importlib.util.spec_from_file_location("_host", Path(__file__).resolve().parents[1] / "jfa/bench/host.py")
host = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(host)

BATCH = 16  # the stub's cost does not depend on the sizes


def _stub_backend():
    """A backend (jfa.backends: forward(problem) -> (out, lse), backward(problem, out, lse, dout, dlse) -> grads)
    that returns preallocated tensors of the right shapes."""
    outputs, grads = {}, {}

    def forward(p):
        q, rows = p.q, p.rows
        key = (rows, q.shape, q.dtype)
        if key not in outputs:
            outputs[key] = (q.new_zeros(rows, q.shape[1], q.shape[2]),
                            q.new_zeros(q.shape[1], rows, dtype=torch.float32))
        return outputs[key]

    def backward(p, out, lse, dout, dlse):
        key = (p.q.shape, p.k.shape, p.q.dtype)
        if key not in grads:
            grads[key] = (torch.zeros_like(p.q), torch.zeros_like(p.k), torch.zeros_like(p.v))
        return grads[key]

    return Backend("stub", forward, backward, lambda device, head_dim, dtype: True)


def _cases(device, backend):
    leaf = lambda *shape: torch.randn(*shape, dtype=torch.bfloat16, device=device).requires_grad_()
    offsets = lambda n: torch.arange(BATCH + 1, dtype=torch.int32, device=device) * n
    q, k, v = leaf(32, 8, 64), leaf(BATCH * 64, 8, 64), leaf(BATCH * 64, 8, 64)
    qc, kc, vc = leaf(BATCH * 32, 4, 128), leaf(BATCH * 64, 4, 128), leaf(BATCH * 64, 4, 128)
    ko, qo = offsets(64), offsets(32)
    pma = (lambda: jfa.broadcast_attention(q, k, v, ko, max_kv_len=64, backend=backend), (q, k, v))
    cross = (lambda: jfa.jagged_attention(qc, kc, vc, qo, ko, max_q_len=32, max_kv_len=64, causal=True,
                                          backend=backend), (qc, kc, vc))
    gelu = (lambda: jfa.jagged_attention(qc, kc, vc, qo, ko, max_q_len=32, max_kv_len=64, activation="gelu_tanh",
                                         scale=1.0, backend=backend), (qc, kc, vc))
    cases = {}
    for name, (fn, leaves) in (("broadcast", pma), ("cross", cross), ("gelu cross", gelu))[:2 + (backend != "stub")]:
        dout = torch.zeros_like(fn())

        def both(fn=fn, leaves=leaves, dout=dout):
            torch.autograd.grad(fn(), leaves, dout)
        cases[f"{name} forward"] = fn
        cases[f"{name} forward+backward"] = both
    return cases


def _steady_allocations():
    """glibc: the CPU tensors' allocations (up to 32 MB) from the heap and kept there when freed, not a fresh mmap
    each (their page faults moved this machine's backward numbers by 10-40% from run to run)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (glibc's largest)
    libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", default="stub", choices=("stub", "hopper"))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    _steady_allocations()
    BACKENDS["stub"] = _stub_backend()
    launches = host.fake_launches() if args.backend == "hopper" else None
    # as GPU offsets with both max lengths given: not read on the host (CPU offsets would be value-checked)
    jfa.checks.offsets_values_checked = lambda offsets, hints_given: False
    cases = _cases(torch.device(args.device), args.backend)
    if launches is not None and hasattr(runtime, "launch"):  # (a jfa from before jfa.runtime.launch has none kept)
        counts = [host.check_kept_launches(fn, launches) for fn in cases.values()]
        print(f"kept launches: {sum(counts)} launches in {len(counts)} cases as Triton's path gives them")
    for name, fn in cases.items():
        per_round, to_launch = [], []
        for _ in range(args.rounds):
            for _ in range(args.calls // 10):
                fn()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            per_round.append((time.perf_counter() - t0) / args.calls * 1e6)
            if launches is not None and name.endswith("forward"):
                total = 0.0
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    fn()
                    total += launches.at["hopper_fwd_kernel"] - t0
                to_launch.append(total / args.calls * 1e6)
        per_round.sort()
        line = f"{name:28s} median {per_round[len(per_round) // 2]:7.1f} us  min {per_round[0]:7.1f} us"
        if to_launch:
            line += f"  (to launch: min {min(to_launch):7.1f} us)"
        print(line)


if __name__ == "__main__":
    main()
