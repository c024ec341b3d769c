"""jfa's kernels beside a peer's under ncu, kernel by kernel: one forward + backward of each provider on a suite
workload (bf16, an sm_90 GPU), every kernel it launches profiled, and a table of what bounds each (time, tensor
pipe, issue slots, shared memory, DRAM bytes, L2 hits, registers, grid). Where a peer's kernel is faster at the
same FLOPs, the table says which resource it uses better: read it before building a lever (session 30 found jfa's
one pass moving 3.3x NVIDIA HSTU's DRAM bytes this way, and the work queue came of it).

    python benchmarks/peer_kernels.py --only WORKLOAD [--providers jfa,fa4] [--out DIR] [--set full]
    python benchmarks/peer_kernels.py --only WORKLOAD --stalls fwd      (the longest *fwd* kernel's stall lines)
    python benchmarks/peer_kernels.py --only WORKLOAD --providers P --calls 2      (the profiled program itself)

Each provider runs in its own ncu process: a warm-up call (compiles, autotunes), then one call between the
profiler's start and stop, which alone is profiled (--profile-from-start off). The table, with each provider's
longest kernel's top stall lines (scripts/ncu_lines.py), goes to DIR/peer-WORKLOAD.txt and those kernels' source
pages to DIR/peer-WORKLOAD-PROVIDER.source.csv; the reports and their raw pages (tens of MB) stay in the temporary
folder (peer-WORKLOAD-PROVIDER.ncu-rep: `ncu -i REPORT --page details`). FA4 needs its carried install
(scripts/lib.sh's fa4).
"""
import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# raw-page metrics worth a column: (column title, regex over ncu's metric names, {ncu unit: factor to the title's
# unit}); every match is shown
_MS = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0}
_GB = {"byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0}
COLUMNS = [
    ("ms", r"^gpu__time_duration\.sum$", _MS),
    ("tensor %", r"^sm__pipe_tensor_op_gmma_cycles_active\.avg\.pct_of_peak_sustained_active$|"
                 r"^sm__inst_executed_pipe_tensor_op_gmma\.avg\.pct_of_peak_sustained_active$", {}),
    ("issue %", r"^smsp__issue_active\.avg\.pct_of_peak_sustained_active$", {}),
    ("smem %", r"^l1tex__data_pipe_lsu_wavefronts_mem_shared\.sum\.pct_of_peak_sustained_elapsed$", {}),
    ("bank confl", r"^l1tex__data_bank_conflicts_pipe_lsu_mem_shared\.sum$", {}),
    ("DRAM rd GB", r"^dram__bytes_read\.sum$", _GB),
    ("DRAM wr GB", r"^dram__bytes_write\.sum$", _GB),
    ("L2 hit %", r"^lts__t_sector_hit_rate\.pct$", {}),
    ("regs", r"^launch__registers_per_thread$", {}),
    ("grid", r"^launch__grid_size$", {}),
    ("block", r"^launch__block_size$", {}),
    ("smem KB", r"^launch__shared_mem_per_block_dynamic$", {"byte": 1 / 1024, "Kbyte": 1.0}),
]
# any other raw metric whose name matches this goes to the long listing under the table
EXTRA = re.compile(r"pipe_tensor.*pct|issue_active.*pct|mem_shared.*pct|lsu_mem_local|"
                   r"warp_latency_issue_stalled|pipe_.*cycles_active.*pct_of_peak_sustained_active|"
                   r"^l1tex__data_pipe_lsu_wavefronts_mem_shared.*\.sum$|^l1tex__data_bank_conflicts.*\.sum$|"
                   r"^sm__cycles_elapsed\.avg$|^smsp__inst_executed\.sum$|^lts__t_sectors_op_red\.sum$")


def calls(only: str, provider: str, n: int) -> None:
    """The profiled program: provider's forward + backward on the workload, n - 1 warm-up calls, then one inside the
    profiler's start and stop."""
    import torch

    from jfa.bench import providers, suite
    from jfa.bench.runner import run_provider_once
    [w] = suite.select(suite.load_suite()[1], only)
    inp = suite.make_inputs(w, device="cuda", dtype=torch.bfloat16)
    [prov] = providers.select(provider)
    why = prov.skip_reason(inp)
    if why:
        sys.exit(f"{provider} skips {only}: {why}")
    fn, _ = prov.build(inp)
    for _ in range(n - 1):
        run_provider_once(fn, inp)
    torch.cuda.synchronize()
    # the profiler's start and stop, not an NVTX range: those are per thread, and autograd launches the backward's
    # kernels from a thread of its own (an NVTX range profiled the forward's alone)
    torch.cuda.cudart().cudaProfilerStart()
    run_provider_once(fn, inp)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def _scaled(factors: dict, unit: str, value: str) -> str:
    try:
        x = float(value.replace(",", ""))
    except ValueError:
        return value
    return f"{x * factors.get(unit, 1.0):.3g}"


def table(raw_csv: str, provider: str) -> tuple[list[str], list[str]]:
    """(table rows, the extra metrics' lines) of one report's raw page: a row per profiled kernel."""
    rows = list(csv.reader(raw_csv.splitlines()))
    if len(rows) < 3:
        return [f"| {provider} | (no kernel profiled) |"], []
    head, units, body = rows[0], rows[1], rows[2:]
    name_at = head.index("Kernel Name")
    out, extra = [], []
    for row in body:
        cells = []
        for _, pattern, factors in COLUMNS:
            hits = [_scaled(factors, units[i], row[i]) for i, k in enumerate(head) if re.search(pattern, k)]
            cells.append(" / ".join(hits) if hits else "-")
        kernel = row[name_at][:60]
        out.append(f"| {provider} | {kernel} | " + " | ".join(cells) + " |")
        extra += [f"{provider} {kernel}: {k} = {row[i]} {units[i]}" for i, k in enumerate(head) if EXTRA.search(k)]
    return out, extra


def profile(only: str, provider: str, out: Path, section_set: str, stalls: str = "") -> tuple[list[str], list[str]]:
    # the report and its raw page in the temporary folder (tens of MB: more than the device tool brings back)
    rep = Path(tempfile.gettempdir()) / f"peer-{only}-{provider}"
    cmd = ["ncu", "--set", section_set, "--import-source", "no", "--clock-control", "none",
           "--profile-from-start", "off", "-f", "-o", str(rep), sys.executable, __file__, "--only", only,
           "--providers", provider, "--calls", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return [f"| {provider} | ncu rc {r.returncode}: {r.stderr.strip()[-300:]} |"], []
    raw = subprocess.run(["ncu", "-i", f"{rep}.ncu-rep", "--page", "raw", "--csv"], capture_output=True,
                         text=True).stdout
    Path(f"{rep}.csv").write_text(raw)
    rows, extra = table(raw, provider)
    return rows, extra + stall_lines(f"{rep}.ncu-rep", raw, provider, out, stalls)


def longest_kernel(raw_csv: str, pick: str = "") -> str | None:
    """The name of the longest kernel of a raw page, among those whose name matches the regex pick ("": all)."""
    rows = list(csv.reader(raw_csv.splitlines()))
    if len(rows) < 3:
        return None
    head, body = rows[0], rows[2:]
    at, name_at = head.index("gpu__time_duration.sum"), head.index("Kernel Name")
    body = [r for r in body if re.search(pick, r[name_at])]
    return max(body, key=lambda r: float(r[at].replace(",", "") or 0))[name_at] if body else None


def stall_lines(report: str, raw_csv: str, provider: str, out: Path, pick: str = "", n: int = 12) -> list[str]:
    """scripts/ncu_lines.py's top lines (where the warps wait) of the provider's longest kernel whose name matches
    pick."""
    longest = longest_kernel(raw_csv, pick)
    if longest is None:
        return [f"{provider}: no kernel named like {pick!r}"]
    base = re.sub(r"[^A-Za-z0-9_].*", "", longest)  # (demangled names carry templates and arguments)
    src = subprocess.run(["ncu", "-i", report, "--page", "source", "--csv", "--print-source", "sass",
                          "--kernel-name", f"regex:{re.escape(base)}", "--launch-count", "1"],
                         capture_output=True, text=True).stdout
    path = out / (Path(report).stem + (f"-{pick}" if pick else "") + ".source.csv")
    path.write_text(src)
    top = subprocess.run([sys.executable, str(ROOT / "scripts" / "ncu_lines.py"), str(path), str(n)],
                         capture_output=True, text=True)
    return [f"{provider} {base}: where its warps wait (scripts/ncu_lines.py)"] + (top.stdout or top.stderr).splitlines()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", required=True, help="one suite workload")
    p.add_argument("--providers", default="jfa,fa4", help="comma-separated jfa bench providers")
    p.add_argument("--calls", type=int, help="(the profiled program) calls of one provider, the last profiled")
    p.add_argument("--set", default="full", help="ncu's section set (default full)")
    p.add_argument("--out", default=os.environ.get("OUT", "peer-out"))
    p.add_argument("--stalls", default="", help="the stall lines of the longest kernel whose name matches this "
                   "regex (default: the longest kernel)")
    args = p.parse_args(argv)
    if args.calls:
        calls(args.only, args.providers, args.calls)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"{args.only}: every kernel of one forward + backward",
             "| provider | kernel | " + " | ".join(t for t, _, _ in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    extras = []
    for provider in args.providers.split(","):
        rows, extra = profile(args.only, provider, out, args.set, args.stalls)
        lines += rows
        extras += extra
        print("\n".join(rows), flush=True)
    text = "\n".join(lines + [""] + extras) + "\n"
    (out / f"peer-{args.only}.txt").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
