"""Host time per call of jfa's public functions above the backend: the same calls over a stub backend that does
no work (it returns preallocated outputs and gradients), so what is timed is validation, autograd and dispatch.
Runs on the CPU (no GPU needed) or on a GPU; A/B two commits by PYTHONPATH, alternating runs:

    python benchmarks/api_overhead.py [--calls 500] [--rounds 5] [--device cpu]
    PYTHONPATH=/path/to/other/jfa python benchmarks/api_overhead.py      (the same, for another copy of jfa)

Cases: broadcast q (32 x 8 heads x D=64, as pma-32-d64) and cross-attention (32 queries per sequence, causal,
4 heads x D=128, as targets-32), each forward with grad and forward + backward (torch.autograd.grad). Prints
the median and minimum over rounds of microseconds per call.
"""
import argparse
import time

import torch

import jfa
import jfa.checks
from jfa.backends import BACKENDS, Backend

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


def _cases(device):
    leaf = lambda *shape: torch.randn(*shape, dtype=torch.bfloat16, device=device).requires_grad_()
    offsets = lambda n: torch.arange(BATCH + 1, dtype=torch.int32, device=device) * n
    q, k, v = leaf(32, 8, 64), leaf(BATCH * 64, 8, 64), leaf(BATCH * 64, 8, 64)
    qc, kc, vc = leaf(BATCH * 32, 4, 128), leaf(BATCH * 64, 4, 128), leaf(BATCH * 64, 4, 128)
    ko, qo = offsets(64), offsets(32)
    pma = (lambda: jfa.broadcast_attention(q, k, v, ko, max_kv_len=64, backend="stub"), (q, k, v))
    cross = (lambda: jfa.jagged_attention(qc, kc, vc, qo, ko, max_q_len=32, max_kv_len=64, causal=True,
                                          backend="stub"), (qc, kc, vc))
    cases = {}
    for name, (fn, leaves) in (("broadcast", pma), ("cross", cross)):
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
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    BACKENDS["stub"] = _stub_backend()
    # as GPU offsets with both max lengths given: not read on the host (CPU offsets would be value-checked)
    jfa.checks.offsets_values_checked = lambda offsets, hints_given: False
    for name, fn in _cases(torch.device(args.device)).items():
        per_round = []
        for _ in range(args.rounds):
            for _ in range(args.calls // 10):
                fn()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            per_round.append((time.perf_counter() - t0) / args.calls * 1e6)
        per_round.sort()
        print(f"{name:28s} median {per_round[len(per_round) // 2]:7.1f} us  min {per_round[0]:7.1f} us")


if __name__ == "__main__":
    main()
