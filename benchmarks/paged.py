"""The forward over a paged KV cache against the same keys packed contiguously, per backend (bf16, a CUDA GPU):
what reading k and v through a page table costs. The queries are each user's last rows (serving: the new rows
against the whole history, causal, optionally HSTU's silu with targets).

    python benchmarks/paged.py [--batch 1024] [--history 4096] [--new 64] [--page-size 128,256]
                               [--backends triton,hopper] [--activation silu] [--rep-ms 100]

One line per (backend, layout): the median ms (triton.testing.do_bench) and the ratio to that backend's
contiguous run. Pages are handed out shuffled, so consecutive pages of a user are not neighbours in the pool.
"""
import argparse

import torch
from triton.testing import do_bench

import jfa
from jfa.jagged import pool_rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--history", type=int, default=4096, help="the longest history (lengths uniform up to it)")
    p.add_argument("--new", type=int, default=64, help="the new rows a user (uniform from 1)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page-size", default="128,256")
    p.add_argument("--backends", default="triton,hopper")
    p.add_argument("--activation", default="softmax")
    p.add_argument("--rep-ms", type=int, default=100)
    a = p.parse_args()
    dev, dt, h, d = "cuda", torch.bfloat16, a.heads, a.head_dim
    g = torch.Generator().manual_seed(0)
    new = torch.randint(1, a.new + 1, (a.batch,), generator=g)
    hist = torch.maximum(torch.randint(1, a.history + 1, (a.batch,), generator=g), new)
    q_off = torch.nn.functional.pad(new.cumsum(0), (1, 0)).to(torch.int32).to(dev)
    kv_off = torch.nn.functional.pad(hist.cumsum(0), (1, 0)).to(torch.int32).to(dev)
    q = torch.randn(int(new.sum()), h, d, device=dev, dtype=dt)
    k = torch.randn(int(hist.sum()), h, d, device=dev, dtype=dt)
    v = torch.randn_like(k)
    opts = dict(causal=True, activation=a.activation, max_q_len=int(new.max()), max_kv_len=int(hist.max()))
    if a.activation != "softmax":
        opts["out_scale"] = 1.0 / a.history
    user = torch.repeat_interleave(torch.arange(a.batch), hist).to(dev)
    pos = torch.arange(k.shape[0], device=dev) - kv_off[:-1].long()[user]
    print(f"batch {a.batch}, history up to {a.history} (mean {hist.float().mean():.0f}), new rows up to {a.new}, "
          f"H {h} D {d}, {a.activation}")
    for backend in a.backends.split(","):
        base = None
        for ps in [0] + [int(s) for s in a.page_size.split(",")]:
            if ps:
                pages = -(-a.history // ps)
                table = torch.randperm(a.batch * pages, generator=g).to(torch.int32).view(a.batch, pages).to(dev)
                at = pool_rows(table, user, pos, ps)
                pool_k = torch.zeros(a.batch * pages * ps, h, d, device=dev, dtype=dt)
                pool_v = torch.zeros_like(pool_k)
                pool_k[at], pool_v[at] = k, v
                args, extra = (q, pool_k, pool_v), dict(page_table=table, page_size=ps)
            else:
                args, extra = (q, k, v), {}

            def fn():
                return jfa.jagged_attention(*args, q_off, kv_off, backend=backend, **opts, **extra)
            out = fn()
            ms = do_bench(fn, warmup=25, rep=a.rep_ms)
            if ps == 0:
                base, ref = ms, out
            err = (out.float() - ref.float()).abs().max().item()
            print(f"  {backend:<7} {'contiguous' if ps == 0 else f'pages of {ps}':<13} {ms:7.3f} ms  "
                  f"x{ms / base:.3f} of contiguous   max |diff| {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
