"""The SASS lines where a kernel's warps wait longest, from an ncu report's source page.

    ncu --set full --import-source no -o REPORT ...      (one launch: scripts/profile.sh's flags)
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > REPORT.csv
    python scripts/ncu_lines.py REPORT.csv [N] [FIRST LAST]
    python scripts/ncu_lines.py REPORT.csv --parts

Prints the N lines (default 30) with the most warp-stall samples, each with its share, execution count and
largest stall reasons; FIRST LAST: only SASS lines FIRST..LAST (one partition's code: the partitions lie one after
another between the `USETMAXREG` lines, and a warp-specialized kernel's idle warps park at its last barrier, a
large share that costs nothing). A line's preceding `TRYWAIT` names the barrier a wait loop spins on.
--parts: each partition's samples (its lines between `USETMAXREG`s), those in its MMA loops (innermost backward
branches around an `HGMMA`) and the rest (a consumer's per-item code), with the rest's largest kinds of instruction.
"""
import collections
import csv
import re
import sys

from sass_loops import innermost  # (this folder: python puts a script's own directory first on sys.path)


def _num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def parts(body, samples, sass) -> list[str]:
    """--parts' lines: per partition, all / in MMA loops / the rest, as shares of the kernel's samples."""
    count = [_num(r[samples]) for r in body]
    text = [r[sass].strip() for r in body]
    total = sum(count) or 1.0
    at = {}
    for i, r in enumerate(body):
        try:
            at[int(r[0], 16)] = i
        except ValueError:
            pass
    spans = []
    for i, t in enumerate(text):  # backward branches (their targets' lines), the innermost ones holding an HGMMA
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)\s*$", t)
        target = at.get(int(m.group(1), 16), i + 1) if m else i + 1
        if target <= i:
            spans.append((target, i))
    loops = [(a, b) for a, b in innermost(spans) if any("HGMMA" in t for t in text[a:b + 1])]
    cuts = [0] + [i for i, t in enumerate(text) if "USETMAXREG" in t] + [len(body)]
    out = []
    for a, b in zip(cuts, cuts[1:]):
        mine = sum(count[a:b])
        if mine < 0.005 * total:
            continue
        in_loops = sum(sum(count[c:d + 1]) for c, d in loops if a <= c and d < b)
        rest = collections.Counter()
        for i in range(a, b):
            if not any(c <= i <= d for c, d in loops):
                rest[re.sub(r"^@!?U?P\w+\s+", "", text[i]).split(" ")[0].split(".")[0]] += count[i]
        kinds = ", ".join(f"{k} {v / total:.1%}" for k, v in rest.most_common(4))
        out.append(f"lines {a:5d}..{b:5d}: {mine / total:6.1%} of the samples; in MMA loops {in_loops / total:6.1%}, "
                   f"the rest {(mine - in_loops) / total:6.1%} ({kinds})")
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with open(sys.argv[1], errors="replace") as f:
        rows = list(csv.reader(f))
    n = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "--parts" else 30
    head_at = next((i for i, r in enumerate(rows) if "Warp Stall Sampling (All Samples)" in r), None)
    if head_at is None:  # (a kernel built without line info, or a page of another kind: HSTU's CUDA kernels)
        sys.exit(f"{sys.argv[1]}: no 'Warp Stall Sampling' column (a source page of {len(rows)} rows)")
    head, body = rows[head_at], rows[head_at + 1:]
    samples, executed, sass = (head.index(c) for c in ("Warp Stall Sampling (All Samples)", "Instructions Executed",
                                                         "Source"))
    reasons = [i for i, c in enumerate(head) if c.startswith("stall_") and "Not Iss" not in c]
    if "--parts" in sys.argv:
        print("\n".join(parts(body, samples, sass)))
        return
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
