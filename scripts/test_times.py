"""Where a test run's time went, from the lines pytest's --times option wrote (tests/conftest.py: seconds, outcome and
id a test, appended as each ends, so a run that a time limit cut still has them): the tests ended by outcome, the
slowest test functions (their cases' seconds summed) and the slowest cases.

    python scripts/test_times.py FILE [--top N]

scripts/gpu_tests.sh prints it after every run; the per-function sums are what --shard's parts should balance.
"""
import argparse
import collections


def read(path: str) -> list[tuple[float, str, str]]:
    """FILE -> [(seconds, outcome, test id)]."""
    rows = []
    with open(path) as f:
        for line in f:
            seconds, outcome, nodeid = line.rstrip("\n").split("\t", 2)
            rows.append((float(seconds), outcome, nodeid))
    return rows


def function(nodeid: str) -> str:
    """A case's test function: its id without the parameters."""
    return nodeid.split("[", 1)[0]


def summary(rows, top: int = 12) -> str:
    outcomes = collections.Counter(outcome for _, outcome, _ in rows)
    total = sum(seconds for seconds, _, _ in rows)
    counts = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items(), key=lambda kv: (-kv[1], kv[0])))
    lines = [f"{len(rows)} tests ended ({counts}), {total:.0f} s of test time"]
    by_function = collections.defaultdict(lambda: [0.0, 0])
    for seconds, _, nodeid in rows:
        by_function[function(nodeid)][0] += seconds
        by_function[function(nodeid)][1] += 1
    lines.append("slowest functions (seconds, cases, share of the test time):")
    for name, (seconds, n) in sorted(by_function.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {seconds:8.1f} {n:4d} {seconds / max(total, 1e-9):6.1%}  {name}")
    lines.append("slowest cases:")
    for seconds, outcome, nodeid in sorted(rows, key=lambda r: -r[0])[:top]:
        lines.append(f"  {seconds:8.1f}  {outcome:7s}  {nodeid}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    print(summary(read(args.file), args.top))


if __name__ == "__main__":
    main()
