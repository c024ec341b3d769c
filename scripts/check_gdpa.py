"""Check jfa's adapter of GDPA's Triton kernel (jfa.peers.gdpa_attention, the bench's gdpa providers) against jfa's
reference on the CPU, GDPA's kernels run by the Triton interpreter: out, dq, dk, dv in self, cross and broadcast
modes, plain and persistent, a window, several activations. No GPU needed: a wrong convention (offsets, scale,
activation names) shows here before device time is spent.

    python scripts/check_gdpa.py            (after scripts/carry_gdpa.sh GIT_DIR)

GDPA's module is imported as on a Hopper GPU (its import reads the device's capability), with no CPU kernel
registered for its op (its CPU kernel is softmax attention), and its autotuner's timing replaced by a constant (the
interpreter has no GPU driver to time with), so every config runs once and the first is kept. Each case calls
the kernel twice and checks the second call: its autotuning adds every config's dQ into broadcast q's buffer on
the first (the bench's providers call it once before the gate). gelu (erf) is not run: the interpreter has no erf.
"""
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
import torch  # noqa: E402
import triton.runtime.autotuner as autotuner  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / ".peers")]
autotuner.Autotuner.do_bench = property(lambda self: lambda fn, quantiles=None, **kw: (fn(), [1.0, 1.0, 1.0])[1])
torch.cuda.get_device_capability = lambda *a, **kw: (9, 0)
torch.library.register_kernel = lambda *a, **kw: (lambda f: f)

import jfa  # noqa: E402
from jfa import peers  # noqa: E402
from jfa.testing import offsets_of  # noqa: E402

CASES = [  # (mode, activation, persistent, window, key lengths)
    ("self", "gelu_tanh", False, (-1, -1), [5, 0, 33, 17]),
    ("self", "relu2", True, (-1, -1), [5, 0, 33, 17]),
    ("self", "silu", False, (8, 8), [5, 0, 33, 17]),
    ("cross", "silu", True, (-1, -1), [5, 0, 33, 17]),
    ("cross", "identity", False, (-1, -1), [5, 0, 33, 17]),
    ("cross", "relu", False, (-1, -1), [64, 1, 70]),
    ("broadcast", "gelu_tanh", False, (-1, -1), [5, 2, 33, 17]),
    ("broadcast", "gelu_tanh", True, (-1, -1), [5, 0, 33, 17]),
    ("broadcast", "relu2", False, (-1, -1), [64, 64]),
]


def grads(fn, leaves, dout):
    out = fn()
    out.backward(dout)
    got = [out.detach()] + [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    return got


def main() -> int:
    reason = peers.gdpa_available()
    if reason:
        print(f"check_gdpa: GDPA's kernel does not import: {reason}")
        return 2
    g = torch.Generator().manual_seed(0)
    heads, d, failed = 2, 16, 0
    for mode, act, persistent, window, kv_lens in CASES:
        q_lens = kv_lens if mode == "self" else [min(7, n + 2) for n in kv_lens]
        kv_off = offsets_of(kv_lens)
        k, v = (torch.randn(sum(kv_lens), heads, d, generator=g).requires_grad_() for _ in range(2))
        score = dict(window=window, activation=act, out_scale=0.5)
        if mode == "broadcast":
            q = torch.randn(4, heads, d, generator=g).requires_grad_()
            dout = torch.randn(4 * len(kv_lens), heads, d, generator=g)

            def ref_fn():
                return jfa.broadcast_attention(q, k, v, kv_off, backend="reference", **score).reshape(dout.shape)

            def peer_fn():
                return peers.gdpa_attention(q, k, v, None, kv_off, max_kv_len=max(kv_lens), broadcast=True,
                                            persistent=persistent, **score)
        else:
            q_off = offsets_of(q_lens)
            q = torch.randn(sum(q_lens), heads, d, generator=g).requires_grad_()
            dout = torch.randn(sum(q_lens), heads, d, generator=g)

            def ref_fn():
                return jfa.jagged_attention(q, k, v, q_off, None if mode == "self" else kv_off, backend="reference",
                                            **score)

            def peer_fn():
                return peers.gdpa_attention(q, k, v, q_off, kv_off, persistent=persistent, **score)
        ref = grads(ref_fn, [q, k, v], dout)
        grads(peer_fn, [q, k, v], dout)  # (autotuning)
        errs = [float((a - b).abs().max()) if a.numel() else 0.0 for a, b in zip(grads(peer_fn, [q, k, v], dout), ref)]
        ok = all(e < 1e-4 for e in errs)
        failed += not ok
        print(f"{mode:<9} {act:<9} {'persistent' if persistent else 'plain':<10} window {window} kv {kv_lens}: "
              f"max |diff| out {errs[0]:.1e} dq {errs[1]:.1e} dk {errs[2]:.1e} dv {errs[3]:.1e} "
              f"{'ok' if ok else 'FAILED'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
