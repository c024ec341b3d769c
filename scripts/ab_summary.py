"""usage: python scripts/ab_summary.py AB_OUTPUT...   (or scripts/ab.sh ... | python scripts/ab_summary.py)

scripts/ab.sh's lines ("TREE WORKLOAD PART MS ms ...", one a round) summed up: per workload and part, this checkout's
mean time and each other tree's mean with its change against it, the rounds' times beside (compare within one
call only), and where the lines carry it (passes.py --clocks) each tree's mean SM clock: a tree that draws less power
may run at a higher clock (jfa.bench.clocks)."""
import collections
import re
import sys

LINE = re.compile(r"^(\S+)\s+(\S+)\s+(.+)$")
PART = re.compile(r"^\s*(.+?)\s+([\d.]+) ms\b(?:[^|]*?@ (\d+) MHz)?")  # one part of a line: "PART MS ms ... @ MHz"


def summary(lines) -> list[str]:
    times = collections.defaultdict(list)  # (workload, part) -> [(tree, ms)]
    clocks = collections.defaultdict(list)  # (workload, part, tree) -> [MHz]
    trees = []
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        tree, workload = m.group(1), m.group(2)
        for cell in m.group(3).split(" | "):  # (passes.py puts every part on the line, " | " between)
            p = PART.match(cell)
            if not p:
                continue
            part, ms = p.group(1).strip(), float(p.group(2))
            times[(workload, part)].append((tree, ms))
            if p.group(3):
                clocks[(workload, part, tree)].append(float(p.group(3)))
            if tree not in trees:
                trees.append(tree)
    out = []
    for (workload, part), rows in times.items():
        by_tree = collections.defaultdict(list)
        for tree, ms in rows:
            by_tree[tree].append(ms)
        base = by_tree.get("this")
        mean = {t: sum(v) / len(v) for t, v in by_tree.items()}
        cells = []
        for t in trees:
            if t not in by_tree:
                continue
            change = f" {100 * (mean[t] / mean['this'] - 1):+.1f}%" if base and t != "this" else ""
            mhz = clocks.get((workload, part, t))
            cells.append(f"{t} {mean[t]:.3f}{change} ({', '.join(f'{x:.3f}' for x in by_tree[t])})"
                         + (f" {sum(mhz) / len(mhz):.0f} MHz" if mhz else ""))
        out.append(f"{workload:<22} {part:<20} " + " | ".join(cells))
    return out


def main(argv) -> int:
    lines = [line for path in argv for line in open(path)] if argv else sys.stdin.readlines()
    print("\n".join(summary(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
