"""A small case of every Hopper kernel (forward, the one-pass backward, and the deterministic backward's dK/dV and
dQ passes; D 64 and 128; causal GQA and broadcast q, softmax and silu), checked
against the reference: the workload for compute-sanitizer (scripts/sanitize.sh) and a quick smoke test.

    python benchmarks/small_case.py
"""
import sys

import torch

from jfa.testing import compare, make_case, run_backend


def main() -> int:
    bad = 0
    for d in (64, 128):
        for name, kw in (("causal-gqa", dict(q_lens=[1, 65, 129, 300], hq=4, hkv=2, causal=True)),
                         ("broadcast", dict(q_lens=None, kv_lens=[0, 1, 65, 129], broadcast_lq=64, hq=4, hkv=4)),
                         ("silu-causal-gqa", dict(q_lens=[1, 65, 129, 300], hq=4, hkv=2, causal=True,
                                                  activation="silu", out_scale=0.01))):
            case = make_case(**kw, d=d, dtype=torch.bfloat16, device="cuda", seed=d)
            for deterministic in (False, True):
                out, lse, grads = run_backend(case, "hopper", deterministic=deterministic)
                torch.cuda.synchronize()
                failures = compare(case, out, lse, grads)
                bad += bool(failures)
                print(f"D={d} {name} {'two passes' if deterministic else 'one pass'}: {failures or 'ok'}",
                      flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
