"""Host time per call of jfa's public functions: above the backend (--backend stub: a stub backend that does no
work, returning preallocated outputs and gradients, so what is timed is validation, autograd and dispatch), or
down through the hopper backend's host path with its kernels' launches stubbed out (--backend hopper: configs,
schedules, descriptors, allocations, arguments; not Triton's launch itself, nor the GPU: benchmarks/host_time.py
measures those on the device). Runs on the CPU (no GPU needed); A/B two commits by PYTHONPATH, alternating runs:

    python benchmarks/api_overhead.py [--calls 500] [--rounds 5] [--backend stub|hopper] [--device cpu]
    PYTHONPATH=/path/to/other/jfa python benchmarks/api_overhead.py      (the same, for another copy of jfa)

Cases: broadcast q (32 x 8 heads x D=64, as pma-32-d64) and cross-attention (32 queries per sequence, causal,
4 heads x D=128, as targets-32), each forward with grad and forward + backward (torch.autograd.grad); with
--backend hopper also gelu_tanh cross-attention (up to 64 keys, as gdpa-cross-short-kv), and the forward's
time from the call to its kernel's launch ("to launch": a short forward's do_bench span holds it wherever the
host is slower than the GPU, docs/perf-notes.md). Prints the median and minimum over rounds of microseconds per
call. With the hopper backend, out and lse are the CPU's allocations (a few microseconds more than the CUDA
caching allocator's at these sizes).
"""
import argparse
import time

import torch

import jfa
import jfa.checks
from jfa import bwd_common, schedule
from jfa.backends import BACKENDS, Backend
from jfa.hopper import bwd, bwd_dq, fwd

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


class _Launch:
    """A kernel whose launches do nothing but note when (kernel[grid](...))."""

    def __init__(self):
        self.at = 0.0

    def __getitem__(self, grid):
        return self._launch

    def _launch(self, *args, **kwargs):
        self.at = time.perf_counter()


def _stub_launches():
    """The hopper backend taking CPU tensors with every kernel it launches stubbed (for this process: nothing here
    computes attention afterwards). Returns the forward kernel's stub."""
    BACKENDS["hopper"] = Backend("hopper", BACKENDS["hopper"].forward, BACKENDS["hopper"].backward,
                                 lambda device, head_dim, dtype: True)
    schedule.check_runnable = lambda device: None
    for module, name in ((fwd, "hopper_fwd_kernel"), (schedule, "refresh_kernel"), (bwd, "hopper_dkdv_kernel"),
                         (bwd_dq, "hopper_dq_kernel"), (bwd_common, "attention_bwd_preprocess_kernel"),
                         (bwd_common, "zero_keyless_rows_kernel")):
        setattr(module, name, _Launch())
    return fwd.hopper_fwd_kernel


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", default="stub", choices=("stub", "hopper"))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    BACKENDS["stub"] = _stub_backend()
    launched = _stub_launches() if args.backend == "hopper" else None
    # as GPU offsets with both max lengths given: not read on the host (CPU offsets would be value-checked)
    jfa.checks.offsets_values_checked = lambda offsets, hints_given: False
    for name, fn in _cases(torch.device(args.device), args.backend).items():
        per_round, to_launch = [], []
        for _ in range(args.rounds):
            for _ in range(args.calls // 10):
                fn()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            per_round.append((time.perf_counter() - t0) / args.calls * 1e6)
            if launched is not None and name.endswith("forward"):
                total = 0.0
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    fn()
                    total += launched.at - t0
                to_launch.append(total / args.calls * 1e6)
        per_round.sort()
        line = f"{name:28s} median {per_round[len(per_round) // 2]:7.1f} us  min {per_round[0]:7.1f} us"
        if to_launch:
            line += f"  (to launch: min {min(to_launch):7.1f} us)"
        print(line)


if __name__ == "__main__":
    main()
