"""Lay the loss curves of several end-to-end runs side by side: one line per run of examples/gem_model.py.

    python benchmarks/loss_curves.py RUNS.jsonl OUT.png [--title TEXT]

RUNS.jsonl holds gem_model.py's final JSON lines (scripts/e2e.sh appends them to $OUT/e2e.jsonl), each with its
per-step ``losses``. Prints each run's step time and peak memory, and the largest gap between any run's curve and
the first's (same seed, same data: implementations that agree differ only by rounding).
"""
from __future__ import annotations

import argparse
import json


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs")
    p.add_argument("out")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    runs = [json.loads(line) for line in open(args.runs) if line.startswith("{")]
    runs = [r for r in runs if r.get("losses")]
    if not runs:
        raise SystemExit(f"{args.runs}: no run with a 'losses' curve")
    base = runs[0]["losses"]
    for r in runs:
        gap = max(abs(a - b) for a, b in zip(r["losses"], base))
        print(f"{r['attention']:10s} step {r['median_step_s'] * 1e3:8.1f} ms  peak {r['peak_mem_mb']:8.0f} MiB  "
              f"loss {r['first_loss']:.4f} -> {r['final_loss']:.4f}  max |curve - {runs[0]['attention']}| {gap:.4f}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for r in runs:
        ax.plot(r["losses"], label=f"{r['attention']} ({r['median_step_s'] * 1e3:.0f} ms/step)", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (BCE)")
    ax.set_title(args.title or f"{runs[0].get('layers_kind', '')} model, {runs[0]['layers']} layers", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
