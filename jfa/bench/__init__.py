"""``jfa bench``: jfa against its peers on a suite of jagged workloads (``jfa bench --list`` names them).

    python -m jfa.bench --list
    python -m jfa.bench [--suite FILE] [--only NAME,...] [--providers NAME,...] [--out DIR]
    python -m jfa.bench --lengths lens.txt --heads 8 --head-dim 128 --causal [--activation silu --out-scale 0.01]

Modules: suite (workloads, the length recipe, inputs), providers (jfa's backends; peer_providers: the peers), runner
(the correctness gate, timing, results), report (terminal table, report.md, plots). See benchmarks/README.md.
On a machine with no CUDA device it runs a scaled-down smoke version on the CPU (reference vs the Triton
interpreter), so the command is never a dead end.
"""
from __future__ import annotations

import argparse
import sys

import torch

__all__ = ["main", "build_parser"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# The CPU smoke run's default: one of each kind (self, causal on skewed lengths, GQA, broadcast); --only for more.
SMOKE_WORKLOADS = ("self-uniform-1k", "causal-skewed-4k", "gqa-uniform-2k", "pma-64")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The bench options (added to `parser` when given, e.g. a `jfa bench` sub-parser)."""
    p = parser or argparse.ArgumentParser(prog="jfa bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--list", action="store_true", help="the suite's workloads and the providers, what each is and "
                                                        "needs, then exit")
    p.add_argument("--suite", help="suite file in the workloads.json format (default: the packaged one)")
    p.add_argument("--only", help="comma-separated workload names to run (--list names them)")
    p.add_argument("--providers", help="comma-separated providers (default: all; --list names them)")
    p.add_argument("--out", help="directory for results.json, report.md and plots/")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--warmup-ms", type=int, default=25, help="do_bench warm-up (ms)")
    p.add_argument("--rep-ms", type=int, default=100, help="do_bench repetition time (ms)")
    p.add_argument("--smoke", action="store_true",
                   help="the CPU smoke run (scaled-down suite); the default without a CUDA device")
    g = p.add_argument_group("a workload from a lengths file (instead of the suite)")
    g.add_argument("--lengths", help="kv lengths: text (one per line), .npy or .pt")
    g.add_argument("--heads", type=int, default=4, help="query heads")
    g.add_argument("--kv-heads", type=int, help="kv heads (default: --heads)")
    g.add_argument("--head-dim", type=int, default=128)
    g.add_argument("--mode", choices=("self", "cross", "broadcast"), default="self")
    g.add_argument("--q-len", type=int, default=64, help="dense q rows (broadcast), or queries per sequence at most "
                                                         "(cross)")
    g.add_argument("--window", type=int, nargs=2, default=(-1, -1), metavar=("LEFT", "RIGHT"))
    g.add_argument("--causal", action="store_true")
    g.add_argument("--activation", default="softmax", help="the score function (jfa.jagged_attention's activation)")
    g.add_argument("--out-scale", type=float, default=1.0, help="an activation's output scale")
    g.add_argument("--targets", type=_pair, metavar="LO,HI", help="HSTU's mask: target counts drawn in [LO, HI] per "
                                                                  "sequence (self-attention, --causal)")
    g.add_argument("--contextual-len", type=int, default=0, help="HSTU's contextual prefix (with --targets)")
    return p


def _pair(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI (two ints), got {text!r}") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 0 <= LO <= HI, got {text!r}")
    return lo, hi


def list_suite(suite_path=None) -> str:
    """`jfa bench --list`: the workloads (name and what each is) and the providers (what each is and needs)."""
    from . import providers as providers_mod
    from . import suite
    _, workloads = suite.load_suite(suite_path)
    width = max(len(w.name) for w in workloads)
    lines = ["workloads (--only):"] + [f"  {w.name:<{width}}  {w.describe()}" for w in workloads]
    provs = providers_mod.all_providers()
    width = max(len(p.name) for p in provs)
    lines += ["providers (--providers):"] + [f"  {p.name:<{width}}  {p.describe()}" for p in provs]
    return "\n".join(lines)


def _progress(total: int):
    """(callback(workload, provider), close) with tqdm when importable, else one line per step."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None and sys.stderr.isatty():
        bar = tqdm(total=total, unit="run", dynamic_ncols=True)

        def step(w, p):
            bar.set_description(f"{w} / {p}")
            bar.update(1)
        return step, bar.close
    count = [0]

    def step(w, p):
        count[0] += 1
        print(f"[{count[0]}/{total}] {w} / {p}", file=sys.stderr, flush=True)
    return step, lambda: None


def main(argv=None) -> int:
    """Entry point of ``jfa bench`` (argv: the bench options; an argparse.Namespace from a parent CLI works)."""
    if isinstance(argv, argparse.Namespace):
        args = argv
    else:
        args = build_parser().parse_args(argv)
    import jfa  # noqa: F401  (sets TRITON_INTERPRET on CPU-only machines before triton is imported)

    from . import providers as providers_mod
    from . import report, runner, suite

    if args.list:
        print(list_suite(args.suite))
        return 0
    cuda = torch.cuda.is_available()
    smoke = args.smoke or not cuda
    device = torch.device("cuda" if cuda and not args.smoke else "cpu")
    try:  # a wrong name or option is one line, naming the choices
        if args.lengths:
            workloads = [suite.workload_from_lengths(
                args.lengths, heads_q=args.heads, heads_kv=args.kv_heads, head_dim=args.head_dim, mode=args.mode,
                q_len=args.q_len, window=tuple(args.window), causal=args.causal, activation=args.activation,
                out_scale=args.out_scale, targets=args.targets, contextual_len=args.contextual_len)]
        else:
            _, workloads = suite.load_suite(args.suite)
            workloads = suite.select(workloads, args.only)
        providers = providers_mod.select(args.providers)
    except ValueError as e:
        print(f"jfa bench: {e}", file=sys.stderr)
        return 2
    timing = {"warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms}
    if smoke:
        print("jfa bench: no CUDA device" if not cuda else "jfa bench: --smoke", "-> CPU smoke run: a scaled-down "
              "suite (batch/256, lengths/64, kv heads/4), the reference against the Triton interpreter. Timings are CPU "
              "numbers, not GPU performance.", file=sys.stderr)
        if not (args.only or args.suite or args.lengths):
            workloads = [w for w in workloads if w.name in SMOKE_WORKLOADS] or workloads
        workloads = [suite.scale_down(w) for w in workloads]
        if not args.providers:  # the peers need CUDA; the padded baseline runs on the CPU too
            providers = [p for p in providers if not p.peer or p.name == "sdpa-padded"]
        timing = {"cpu_reps": 1, "cpu_warmup": False}
    env = report.environment(device)
    env["smoke"] = smoke
    print("\n".join(report.header_lines({"env": env})), flush=True)
    step, close = _progress(len(workloads) * len(providers))

    def on_result(w):
        close_line = "\n" + report.terminal_table(w) + "\n"
        print(close_line, flush=True)

    try:
        data = runner.run(workloads, providers, device=device, dtype=DTYPES[args.dtype], env=env, progress=step,
                          on_result=on_result, **timing)
    finally:
        close()
    print(f"ceiling: {data['ceiling_tflops']:.1f} TF/s ({data['ceiling']}); bandwidth: {data['bandwidth_gbs']:.0f} GB/s "
          f"({data['bandwidth']})")
    if args.out:
        files = report.render(data, args.out, plots=not args.no_plots)
        print(f"wrote {', '.join(str(f) for f in files[:2])} and {len(files) - 2} plots")
    wrong = [f"{w['name']}/{n}" for w in data["workloads"] for n, r in w["results"].items() if r.get("correct") is False]
    if wrong:
        print(f"providers that disagree with the reference (not timed): {', '.join(wrong)}")
    jfa_wrong = [x for x in wrong if x.split("/")[1].startswith("jfa")]
    return 1 if jfa_wrong else 0
