"""What a run leaves behind: the header (environment), the terminal table, report.md and the PNG plots.

Everything here reads results.json's structure only, so a saved results.json can be re-rendered
(``render(json.load(...), out_dir)``) without a GPU.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

import torch

PHASES = ("fwd", "bwd")


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (commit + ("-dirty" if dirty else "")) if commit else None


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device) -> dict:
    """The header: GPU, driver, CUDA, torch, triton, jfa commit, date."""
    import triton

    import jfa
    device = torch.device(device)
    env = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
           "device": device.type, "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version(), "jfa": jfa.__version__,
           "jfa_commit": _git_commit(), "host": platform.node()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, sms=props.multi_processor_count, capability=f"{props.major}.{props.minor}",
                   gpu_memory_gb=round(props.total_memory / 2**30, 1), driver=_driver())
    else:
        env.update(gpu=None, cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads(),
                   triton_interpret=os.environ.get("TRITON_INTERPRET"))
    return env


def _fmt(x, digits=1):
    if x is None:
        return "-"
    if isinstance(x, float):
        if x != 0 and abs(x) < 10 ** (1 - digits):
            return f"{x:.2g}"
        return f"{x:.{digits}f}" if abs(x) < 1e5 else f"{x:.3g}"
    return str(x)


def provider_status(r: dict) -> str:
    if r.get("skip"):
        return "skip: " + r["skip"]
    if r.get("error"):
        return "error: " + r["error"]
    if r.get("correct") is False:
        worst = max(((k, e) for k, e in r.get("check", {}).get("errors", {}).items() if e[1] is not None
                     and e[0] > e[1]), key=lambda ke: ke[1][0] / max(ke[1][1], 1e-30), default=None)
        return "WRONG" + (f" ({worst[0]} err {worst[1][0]:.3g} > tol {worst[1][1]:.3g})" if worst else "")
    return "ok"


def header_lines(data: dict) -> list[str]:
    env = data.get("env", {})
    where = env.get("gpu") or f"CPU ({env.get('cpu', '?')}, smoke run)"
    lines = [f"device: {where}" + (f", {env['sms']} SMs" if env.get("sms") else ""),
             f"driver {env.get('driver') or '-'}, CUDA {env.get('cuda') or '-'}, torch {env.get('torch')}, "
             f"triton {env.get('triton')}, jfa {env.get('jfa')} @ {env.get('jfa_commit') or '?'}, {env.get('date')}"]
    if len(env.get("runs", [])) > 1:  # merged from several runs (benchmarks/merge_results.py)
        lines.append("runs: " + "; ".join(f"{', '.join(r['workloads'])} @ {r['jfa_commit']}, {r['date']}"
                                          for r in env["runs"]))
    which = "the lowest of the runs; each floor from its workload's run" if len(env.get("runs", [])) > 1 else "same run"
    if data.get("ceiling_tflops"):
        lines.append(f"ceiling: {data['ceiling_tflops']:.1f} TF/s ({data.get('ceiling', 'dense matmul')}, {which})")
    if data.get("bandwidth_gbs"):
        lines.append(f"bandwidth: {data['bandwidth_gbs']:.0f} GB/s ({data.get('bandwidth', 'copy')}, read + write, "
                     f"{which})")
    return lines


def workload_rows(w: dict) -> list[list[str]]:
    rows = []
    for name, r in w["results"].items():
        rows.append([name, _fmt(r.get("fwd_ms"), 3), _fmt(r.get("bwd_ms"), 3), _fmt(r.get("fwd_tflops")),
                     _fmt(r.get("bwd_tflops")), _fmt(r.get("fwd_floor_pct"), 0), _fmt(r.get("bwd_floor_pct"), 0),
                     _fmt(r.get("peak_mb"), 0),
                     {True: "yes", False: "NO", None: "-"}[r.get("correct")],
                     provider_status(r) if provider_status(r) != "ok" else (r.get("note") or "")
                     + (f" mask build {r['build_ms']:.1f} ms" if r.get("build_ms") is not None else "")
                     + (f" new offsets +{r['new_offsets_ms']:.2f} ms" if r.get("new_offsets_ms") is not None
                        else "")])
    return rows


COLUMNS = ["provider", "fwd ms", "bwd ms", "fwd TF/s", "bwd TF/s", "fwd % floor", "bwd % floor", "peak MB",
           "correct", "note"]


def ratio_text(w: dict) -> str:
    parts = []
    for name, rr in w.get("ratios", {}).items():
        bits = [f"{ph} {rr[ph]:.2f}x vs {w['best_peer'][ph]['provider']}" for ph in PHASES if ph in rr]
        parts.append(f"{name}: " + ", ".join(bits))
    return "; ".join(parts) if parts else "no peer ran: no ratio"


def terminal_table(w: dict) -> str:
    rows = [COLUMNS] + workload_rows(w)
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    lines = [f"== {w['name']}  ({_spec_text(w['spec'])}; {w['pairs']:,} visible pairs{_floor_text(w)})"]
    for r in rows:
        lines.append("  ".join(c.rjust(wd) if i else c.ljust(wd) for i, (c, wd) in enumerate(zip(r, widths)))
                     + "  " + r[-1])
    lines.append("   ratio to the fastest peer: " + ratio_text(w))
    return "\n".join(lines)


def _floor_text(w: dict) -> str:
    if w.get("floor_fwd_ms") is None:
        return ""
    return (f"; floor fwd {w['floor_fwd_ms']:.3f} ms, bwd {w['floor_bwd_ms']:.3f} ms ({w['fwd_bytes'] / 1e9:.2f} / "
            f"{w['bwd_bytes'] / 1e9:.2f} GB)")


def _spec_text(s: dict) -> str:
    bits = [s["mode"], f"B={s['batch']}", f"max_len={s['max_len']}", s["dist"],
            f"H={s['heads_q']}/{s['heads_kv']}", f"D={s['head_dim']}"]
    if s["mode"] != "self":
        bits.append(f"q_len={s['q_len']}")
    if list(s["window"]) != [-1, -1]:
        bits.append(f"window={list(s['window'])}")
    return " ".join(bits)


def markdown(data: dict) -> str:
    out = ["# jfa bench", ""] + [f"- {x}" for x in header_lines(data)] + [
        "", "TF/s count only visible (query, key) pairs: forward 4·Hq·D·pairs, backward 2.5x that. Median of "
        "triton.testing.do_bench; backward = (forward+backward) − forward. Ratios: jfa over the fastest "
        "correct peer of this run, per phase (> 1: jfa is faster). % floor: the phase's roofline floor, max(FLOPs / "
        "ceiling, bytes / bandwidth) with the bytes that must cross memory once, over the provider's time (100% = at "
        "the floor).", ""]
    summary = [w for w in data["workloads"] if w.get("ratios")]
    if summary:
        names = sorted({n for w in summary for n in w["ratios"]})
        out += ["## Speed-up over the fastest peer", "",
                "| workload | " + " | ".join(f"{n} fwd | {n} bwd" for n in names) + " | best peer fwd / bwd |",
                "|---|" + "---|---|" * len(names) + "---|"]
        for w in summary:
            cells = [_fmt(w["ratios"].get(n, {}).get(ph), 2) for n in names for ph in PHASES]
            bp = w.get("best_peer", {})
            peer = " / ".join(f"{bp[ph]['provider']} {_fmt(bp[ph]['tflops'], 0)}" if ph in bp else "-" for ph in PHASES)
            out.append(f"| {w['name']} | " + " | ".join(cells) + f" | {peer} |")
        out.append("")
    for w in data["workloads"]:
        out += [f"## {w['name']}", "", f"{_spec_text(w['spec'])}; {w['pairs']:,} visible pairs{_floor_text(w)}.", "",
                "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        out += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in workload_rows(w)]
        out += ["", f"Ratio to the fastest peer: {ratio_text(w)}.", ""]
        plot = f"plots/{_slug(w['name'])}.png"
        out += [f"![{w['name']}]({plot})", ""]
    if summary:
        out += ["![speed-up over the fastest peer](plots/speedup.png)", ""]
    return "\n".join(out)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def plot_workload(w: dict, ceiling: float | None, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [n for n, r in w["results"].items() if r.get("fwd_tflops")]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(names) + 2), 3.6))
    xs = range(len(names))
    width = 0.38
    for i, ph in enumerate(PHASES):
        vals = [w["results"][n].get(f"{ph}_tflops") or 0.0 for n in names]  # None: not resolved
        pct = [w["results"][n].get(f"{ph}_floor_pct") for n in names]
        bars = ax.bar([x + (i - 0.5) * width for x in xs], vals, width, label=ph)
        ax.bar_label(bars, labels=[f"{v:.0f}" + (f"\n{p:.0f}%" if p else "") for v, p in zip(vals, pct)],
                     fontsize=7)
    if ceiling:
        ax.axhline(ceiling, color="k", linestyle="--", linewidth=1, label=f"dense matmul {ceiling:.0f}")
    ax.set_xticks(list(xs), names, rotation=20, ha="right")
    ax.set_ylabel("TF/s (visible pairs); % of floor")
    ax.set_title(w["name"] + ("" if names else " (no provider timed)"))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_speedup(data: dict, path: Path) -> bool:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ws = [w for w in data["workloads"] if w.get("ratios")]
    if not ws:
        return False
    provider = "jfa" if any("jfa" in w["ratios"] for w in ws) else next(iter(ws[0]["ratios"]))
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(ws) + 2), 3.6))
    width = 0.38
    for i, ph in enumerate(PHASES):
        vals = [w["ratios"].get(provider, {}).get(ph, 0.0) for w in ws]
        bars = ax.bar([x + (i - 0.5) * width for x in range(len(ws))], vals, width, label=ph)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="k", linewidth=1)
    ax.set_xticks(range(len(ws)), [w["name"] for w in ws], rotation=25, ha="right")
    ax.set_ylabel(f"{provider} / fastest peer (TF/s)")
    ax.set_title("speed-up over the fastest peer of the same run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render(data: dict, out_dir, plots: bool = True) -> list[Path]:
    """Write results.json, report.md and plots/*.png under out_dir; returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "results.json", out_dir / "report.md"]
    written[0].write_text(json.dumps(data, indent=1, default=str) + "\n")
    written[1].write_text(markdown(data))
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("jfa bench: matplotlib not installed, no plots (pip install -e '.[bench]')")
            return written
        (out_dir / "plots").mkdir(exist_ok=True)
        for w in data["workloads"]:
            path = out_dir / "plots" / f"{_slug(w['name'])}.png"
            plot_workload(w, data.get("ceiling_tflops"), path)
            written.append(path)
        path = out_dir / "plots" / "speedup.png"
        if plot_speedup(data, path):
            written.append(path)
    return written
