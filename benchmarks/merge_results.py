"""Merge the results.json of several `jfa bench --only ...` runs of one session (the device allows 10 minutes a
command, so the suite runs in parts) into one, in suite order, and render report.md and the plots.

    python benchmarks/merge_results.py OUT_DIR part1/results.json part2/results.json [--commit SHA]
"""
import argparse
import json

from jfa.bench import report, suite


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("parts", nargs="+")
    p.add_argument("--commit", help="jfa commit the runs used (the device's copy of the tree has no .git)")
    args = p.parse_args()
    parts = [json.load(open(path)) for path in args.parts]
    merged = dict(parts[0])
    order = {w.name: i for i, w in enumerate(suite.load_suite()[1])}
    merged["workloads"] = sorted((w for part in parts for w in part["workloads"]),
                                 key=lambda w: order.get(w["name"], len(order)))
    merged["env"] = dict(merged["env"], parts=[part["env"].get("date") for part in parts])
    merged["ceiling_tflops"] = min(part["ceiling_tflops"] for part in parts)
    if args.commit:
        merged["env"]["jfa_commit"] = args.commit
    for path in report.render(merged, args.out_dir):
        print("wrote", path)


if __name__ == "__main__":
    main()
