"""A serving step of an HSTU model (#38): L jfa.nn.HSTULayers, each with its jfa.KVCache of every user's history;
a step takes each user's new rows through every layer (HSTULayer.serve: append the rows' keys and values to that
layer's cache, attend them against the whole history, silu with HSTU's 1 / N) and returns the rows' output. Timed
eagerly and as one CUDA graph (the step captured once, replayed), with no host sync inside (max lengths given).
Each timed step first rewinds the caches to the histories (one copy of the offsets a layer), so every step appends
the same rows at the same places.

    python benchmarks/serving_step.py [--layers 4] [--batch 1024] [--history 2048] [--new 64] [--embed 512]
                                      [--heads 4] [--page-size 128] [--smoke]

Prints the step's eager and graph times (median of triton.testing.do_bench, ms), the graph's speed-up, and checks
that the replayed step gives the eager step's output bit for bit. --smoke: a tiny model on the CPU, eager only.
"""
import argparse
import time

import torch

import jfa


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--history", type=int, default=2048, help="the longest history (lengths uniform up to it)")
    p.add_argument("--new", type=int, default=64, help="new rows a user (the same count for every user)")
    p.add_argument("--embed", type=int, default=512)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--page-size", type=int, default=128)
    p.add_argument("--rep-ms", type=int, default=200)
    p.add_argument("--smoke", action="store_true", help="a tiny model on the CPU, eager only")
    a = p.parse_args()
    if a.smoke:
        a.layers, a.batch, a.history, a.new, a.embed, a.heads, a.page_size = 2, 3, 40, 4, 64, 2, 16
    dev = torch.device("cpu" if a.smoke else "cuda")
    dt = torch.float32 if a.smoke else torch.bfloat16
    torch.manual_seed(0)
    capacity = a.history + a.new
    layers = [jfa.nn.HSTULayer(a.embed, a.heads, max_seq_len=capacity, device=dev, dtype=dt).eval()
              for _ in range(a.layers)]
    caches = [layer.make_cache(a.batch, capacity, page_size=a.page_size, dtype=dt, device=dev) for layer in layers]
    g = torch.Generator().manual_seed(1)
    hist = torch.randint(1, a.history + 1, (a.batch, ), generator=g)
    hist_off = torch.nn.functional.pad(hist.cumsum(0), (1, 0)).to(torch.int32).to(dev)
    new_off = (torch.arange(a.batch + 1, dtype=torch.int32) * a.new).to(dev)
    with torch.no_grad():  # the histories through the layers: each layer's cache filled with its keys and values
        x = torch.randn(int(hist.sum()), a.embed, generator=g).to(dev, dt)
        for layer, cache in zip(layers, caches):
            x = layer.serve(x, hist_off, cache, max_len=a.history)
    saved = [c.offsets.clone() for c in caches]
    x_new = torch.randn(a.batch * a.new, a.embed, generator=g).to(dev, dt)

    def step():
        for cache, offsets in zip(caches, saved):
            cache.offsets.copy_(offsets)  # rewind to the histories
        y = x_new
        for layer, cache in zip(layers, caches):
            y = layer.serve(y, new_off, cache, max_len=a.new)
        return y

    eager = step()
    print(f"{a.layers} HSTU layers (embed {a.embed}, {a.heads} heads), {a.batch} users, histories up to {a.history} "
          f"(mean {hist.float().mean():.0f}), {a.new} new rows a user, pages of {a.page_size}, {dt}, {dev.type}")
    if dev.type != "cuda":
        t0 = time.perf_counter()
        step()
        print(f"  eager step {1e3 * (time.perf_counter() - t0):.1f} ms (CPU smoke)")
        return
    from triton.testing import do_bench
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # the step must not sync: a graph cannot hold one
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    eager_ms = do_bench(step, warmup=50, rep=a.rep_ms)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # (warm on the capture stream)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    torch.cuda.synchronize()
    same = torch.equal(out, eager)
    graph_ms = do_bench(graph.replay, warmup=50, rep=a.rep_ms)
    print(f"  eager step {eager_ms:.3f} ms, CUDA graph {graph_ms:.3f} ms (x{eager_ms / graph_ms:.2f}); "
          f"replay = eager output: {same}")
    if not same:
        raise SystemExit("the replayed step differs from the eager step")


if __name__ == "__main__":
    main()
