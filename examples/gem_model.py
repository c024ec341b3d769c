"""Train the GEM-style click model (jfa.models.GEMModel) on synthetic jagged histories; measure each attention.

    python examples/gem_model.py --steps 300 --plot loss.png                  # learns: loss and AUC per step
    python examples/gem_model.py --attention fa4 --compile --steps 50         # one process (GPU if any)
    torchrun --nproc_per_node 8 examples/gem_model.py --attention fa2 --balance
    torchrun --nproc_per_node 2 examples/gem_model.py --device cpu --backend reference --steps 20

The task: half the users click, and a clicker's history holds trigger items (ids 1..8) among the others
(--trigger-rate: the share of a clicker's items that are triggers, one at least; 0 makes it a needle in a
haystack that a few hundred steps do not learn). --compile runs the whole model under torch.compile
(fullgraph: no graph break around jfa) and counts its compiles: after the first steps, whose changing lengths
mark the sizes dynamic, there are none.

Every rank draws the same global batch (seed + step) of ``world * batch`` histories with skewed lengths
(the benchmark suite's recipe) and keeps its share: contiguous equal-count chunks, or with ``--balance`` a
greedy LPT partition by attention cost (sum of Lq*Lk per rank). The loss is a sum over the rank's users
scaled so DDP's gradient average equals the global-batch mean. Prints one line per step (time, tokens/s,
peak memory, loss, rank cost imbalance) and a final JSON summary line (medians over steps after --warmup).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from jfa import models, peers  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attention", choices=models.IMPLS, default="jfa")
    p.add_argument("--backend", default="auto", help="jfa backend (auto, reference, triton)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None,
                   help="autocast dtype (default: bf16 on cuda, fp32 on cpu)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the summary's medians")
    p.add_argument("--batch", type=int, default=64, help="users per rank (the global batch is world x this)")
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--num-items", type=int, default=10000)
    p.add_argument("--trigger-rate", type=float, default=0.02, help="data difficulty, see synthetic_batch")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=None, help="GQA: fewer kv heads than heads")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--pma-queries", type=int, default=8)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--activation", default="softmax", help="GDPA: an activation in softmax's place in the blocks "
                                                            "(silu, gelu, gelu_tanh, ...)")
    p.add_argument("--hstu", action="store_true", help="HSTU layers (causal SiLU attention) in place of the blocks")
    p.add_argument("--targets", type=int, default=0, help="HSTU's mask: each history's last N items are candidates "
                                                          "(they see the history, not one another; needs --causal or "
                                                          "--hstu)")
    p.add_argument("--rel-bias", type=int, default=None, metavar="BUCKETS",
                   help="HSTU's relative attention bias in the HSTU layers (--hstu, --attention jfa): learned "
                        "position and time tables of BUCKETS + 1 log time buckets, over synthetic timestamps")
    p.add_argument("--compile", action="store_true", help="the model under torch.compile(fullgraph=True)")
    p.add_argument("--plot", default=None, help="save the loss and AUC per step to this PNG (needs matplotlib)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-warmup", type=int, default=50, help="steps of linear learning-rate warm-up")
    p.add_argument("--balance", action="store_true", help="assign users to ranks by attention cost (LPT)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per process")
    p.add_argument("--quiet", action="store_true", help="only the final JSON line")
    return p.parse_args(argv)


def setup(args):
    """-> (rank, world, device); starts the process group under torchrun (NCCL on GPUs, gloo on CPU)."""
    want_cuda = args.device == "cuda" or (args.device is None and torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if want_cuda else torch.device("cpu")
    if want_cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if want_cuda else "gloo", device_id=device if want_cuda else None)
    return rank, world, device


def rank_batch(args, step, rank, world):
    """This rank's (items, offsets, labels) of the global batch of `step`, and every rank's cost."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    items, offsets, labels = models.synthetic_batch(world * args.batch, args.max_len, args.num_items, g,
                                                    trigger_rate=args.trigger_rate)
    lens = offsets[1:] - offsets[:-1]
    costs = models.attention_cost(lens)
    if args.balance:
        parts = models.lpt_partition(costs, world)
    else:
        parts = models.chunk_partition(lens.numel(), world)
    loads = models.rank_loads(costs, parts)
    return models.select_sequences(items, offsets, labels, parts[rank]), loads


def peak_memory_mb(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak RSS (Linux: KiB)


def save_plot(path, losses, aucs):
    """Loss and AUC per step, one PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(losses, label="loss (BCE)", color="tab:blue")
    ax.axhline(0.6931, color="tab:blue", linestyle=":", linewidth=1, label="chance (ln 2)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (axis cut at 1.2)")
    ax.set_ylim(0, 1.2)
    ax2 = ax.twinx()
    ax2.plot(aucs, label="AUC", color="tab:orange")
    ax2.set_ylabel("AUC")
    ax2.set_ylim(0.4, 1.0)
    fig.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rank, world, device = setup(args)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[args.dtype or
                                                                          ("bf16" if device.type == "cuda" else "fp32")]
    if args.attention in ("fa2", "fa4") and (device.type != "cuda" or dtype is None):
        raise SystemExit(f"--attention {args.attention} needs CUDA and --dtype bf16/fp16")
    if args.attention == "fa4":
        try:
            import flash_attn.cute  # noqa: F401
        except Exception as e:  # not installed, or no usable CUDA DSL
            raise SystemExit(f"--attention fa4 needs flash-attn-4 (pip install 'jfa[peers]'): {type(e).__name__}")
    if args.attention == "hstu" and peers.hstu_available():
        raise SystemExit(f"--attention hstu needs generative-recommenders' HSTU kernels: {peers.hstu_available()}")
    if args.attention == "hstu-cuda" and peers.hstu_cuda_available():
        raise SystemExit(f"--attention hstu-cuda needs HSTU's CUDA kernel: {peers.hstu_cuda_available()}")
    if args.attention == "hstu3-cuda" and peers.hstu3_cuda_available():
        raise SystemExit(f"--attention hstu3-cuda needs NVIDIA's HSTU kernel: {peers.hstu3_cuda_available()}")
    if args.attention == "gdpa":
        refusal = peers.gdpa_available() or peers.gdpa_refusal(args.activation, (-1, 0) if args.causal else (-1, -1),
                                                               1.0)
        if refusal or args.hstu:
            raise SystemExit(f"--attention gdpa needs GDPA's kernel (scripts/carry_gdpa.sh) and an --activation "
                             f"without --causal or --hstu: {refusal or 'HSTU layers'}")
    causal = args.causal or args.hstu  # (HSTU's layers are causal)
    if args.targets and not causal:
        raise SystemExit("--targets (HSTU's mask) needs causal attention: add --causal or --hstu")
    if args.rel_bias is not None and not (args.hstu and args.attention == "jfa"):
        raise SystemExit("--rel-bias (HSTU's relative bias) needs --hstu and --attention jfa (the peers' kernels "
                         "take no bias)")
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts them)
    model = models.GEMModel(args.num_items, d_model=args.d_model, heads=args.heads, kv_heads=args.kv_heads,
                            layers=args.layers, pma_queries=args.pma_queries, max_pos=max(args.max_len, 1),
                            causal=causal, impl=args.attention, backend=args.backend,
                            activation=args.activation, hstu=args.hstu, num_buckets=args.rel_bias).to(device)
    compile_counts = torch._dynamo.utils.counters["stats"]
    if args.compile:
        model.compile(fullgraph=True)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                                          else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / max(1, args.lr_warmup)))
    global_batch = world * args.batch
    log, losses, aucs, compiles = [], [], [], []
    for step in range(args.steps):
        (items, offsets, labels), loads = rank_batch(args, step, rank, world)
        max_len = int((offsets[1:] - offsets[:-1]).max())  # known on the host already: no sync
        num_targets = (offsets[1:] - offsets[:-1]).clamp(max=args.targets) if args.targets else None
        items, offsets, labels = (t.to(device, non_blocking=True) for t in (items, offsets, labels))
        mask = {} if num_targets is None else {"num_targets": num_targets.to(device, non_blocking=True)}
        if args.rel_bias is not None:  # the items' times: gaps of 1 s to a day (a sequence reads differences only)
            g = torch.Generator().manual_seed(args.seed * 1_000_033 + step)
            gaps = torch.randint(1, 86_401, (items.shape[0], ), generator=g)
            mask["timestamps"] = torch.cumsum(gaps, 0).to(device, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(items, offsets, max_len=max_len, **mask)
        loss_sum = F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="sum")
        (loss_sum * (world / global_batch)).backward()  # DDP averages over ranks -> the global mean
        opt.step()
        warmup.step()
        opt.zero_grad(set_to_none=True)
        auc = models.auc(logits.detach().float(), labels)
        stats = torch.stack([loss_sum.detach().float(), torch.tensor(float(items.numel()), device=device),
                             torch.tensor(auc / world, device=device)])
        if world > 1:
            dist.all_reduce(stats)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        loss, tokens, auc = stats[0].item() / global_batch, stats[1].item(), stats[2].item()
        losses.append(loss)
        aucs.append(auc)
        compiles.append(compile_counts["unique_graphs"])
        rec = {"step": step, "time_s": dt, "tokens_per_s": tokens / dt, "loss": loss, "auc": auc,
               "peak_mem_mb": peak_memory_mb(device), "cost_imbalance": max(loads) / max(1, sum(loads) / world)}
        log.append(rec)
        if rank == 0 and not args.quiet:
            print(f"step {step:4d}  {dt * 1e3:8.1f} ms  {rec['tokens_per_s']:10.0f} tok/s  "
                  f"peak {rec['peak_mem_mb']:8.1f} MiB  loss {loss:.4f}  AUC {auc:.3f}  max/mean rank cost "
                  f"{rec['cost_imbalance']:.2f}" + (f"  graphs compiled {compiles[-1]}" if args.compile else ""),
                  flush=True)
    timed = log[args.warmup:] or log
    k = max(1, min(5, len(losses) // 4))
    summary = {"attention": args.attention, "backend": args.backend, "device": device.type, "world": world,
               "balance": args.balance, "causal": causal, "layers_kind": "hstu" if args.hstu else "transformer",
               "activation": "silu" if args.hstu else args.activation, "targets": args.targets,
               "rel_bias": args.rel_bias,
               "compile": args.compile, "steps": args.steps,
               "batch_per_rank": args.batch, "max_len": args.max_len, "d_model": args.d_model,
               "layers": args.layers, "heads": args.heads,
               "median_step_s": statistics.median(r["time_s"] for r in timed),
               "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
               "peak_mem_mb": max(r["peak_mem_mb"] for r in log),
               "mean_cost_imbalance": statistics.fmean(r["cost_imbalance"] for r in log),
               "first_loss": statistics.fmean(losses[:k]), "final_loss": statistics.fmean(losses[-k:]),
               "first_auc": statistics.fmean(aucs[:k]), "final_auc": statistics.fmean(aucs[-k:]),
               "losses": [round(x, 5) for x in losses]}  # the curve, to lay implementations side by side
    if args.compile:  # graphs compiled in all, and after the first two steps (their lengths mark sizes dynamic)
        summary.update(compiled_graphs=compiles[-1],
                       recompiles_after_step_2=compiles[-1] - compiles[min(1, len(compiles) - 1)])
    if rank == 0:
        print(json.dumps(summary), flush=True)
        if args.plot:
            save_plot(args.plot, losses, aucs)
    if world > 1:
        dist.barrier()  # every rank done before any tears gloo down (else, under load, a rank can abort at exit)
        dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # under torchrun, leave without the interpreter's teardown: a thread of the process group still joinable
        # there aborts the process ("terminate called without an active exception", SIGABRT) now and then under
        # load, after the run's summary is out (seen in `make test` with two test workers)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
