"""The SASS lines where a kernel's warps wait longest, from an ncu report's source page.

    ncu --set full --import-source no -o REPORT ...      (one launch: scripts/profile.sh's flags)
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > REPORT.csv
    python scripts/ncu_lines.py REPORT.csv [N] [FIRST LAST]

Prints the N lines (default 30) with the most warp-stall samples, each with its share, execution count and
largest stall reasons; FIRST LAST: only SASS lines FIRST..LAST (one partition's code: the partitions lie one after
another between the `USETMAXREG` lines, and a warp-specialized kernel's idle warps park at its last barrier, a
large share that costs nothing). A line's preceding `TRYWAIT` names the barrier a wait loop spins on.
"""
import csv
import sys


def _num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with open(sys.argv[1], errors="replace") as f:
        rows = list(csv.reader(f))
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    head_at = next((i for i, r in enumerate(rows) if "Warp Stall Sampling (All Samples)" in r), None)
    if head_at is None:  # (a kernel built without line info, or a page of another kind: HSTU's CUDA kernels)
        sys.exit(f"{sys.argv[1]}: no 'Warp Stall Sampling' column (a source page of {len(rows)} rows)")
    head, body = rows[head_at], rows[head_at + 1:]
    samples, executed, sass = (head.index(c) for c in ("Warp Stall Sampling (All Samples)", "Instructions Executed",
                                                         "Source"))
    reasons = [i for i, c in enumerate(head) if c.startswith("stall_") and "Not Iss" not in c]
    first, last = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (0, len(body))
    lines = range(first, min(last, len(body)))
    total = sum(_num(body[i][samples]) for i in lines) or 1.0
    print(f"{len(body)} SASS lines; {total:.0f} samples in lines {first}..{lines.stop}")
    for i in sorted(lines, key=lambda i: -_num(body[i][samples]))[:n]:
        r = body[i]
        top = sorted(((_num(r[k]), head[k]) for k in reasons), reverse=True)[:2]
        spin = next((body[j][sass].strip() for j in range(i - 1, max(i - 20, -1), -1) if "TRYWAIT" in body[j][sass]),
                    "") if "BRA" in r[sass] else ""
        print(f"{i:5d} {_num(r[samples]) / total * 100:5.1f}% x{_num(r[executed]):9.0f}  {r[sass].strip()[:56]:56s} "
              + " ".join(f"{name}={v:.0f}" for v, name in top if v) + (f"  <- {spin[:50]}" if spin else ""))


if __name__ == "__main__":
    main()
