"""Merge the results.json of several `jfa bench --only ...` runs of one session (the device allows 10 minutes a
command, so the suite runs in parts) into one, in suite order, and render report.md and the plots. A workload
in a later part replaces the same workload of an earlier part (a re-run after a fix: the latest run counts).

    python benchmarks/merge_results.py benchmarks/results/h200 part1/results.json part2/results.json --commit SHA

writes OUT.json, OUT.md and OUT-plots/*.png (the names kept in benchmarks/results/).
"""
import argparse
import json
import shutil
import tempfile
from pathlib import Path

from jfa.bench import report, suite


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out", help="path prefix: writes OUT.json, OUT.md, OUT-plots/")
    p.add_argument("parts", nargs="+")
    p.add_argument("--commit", help="jfa commit the runs used (the device's copy of the tree has no .git)")
    args = p.parse_args()
    parts = [json.load(open(path)) for path in args.parts]
    merged = dict(parts[0])
    order = {w.name: i for i, w in enumerate(suite.load_suite()[1])}
    latest = {w["name"]: w for part in parts for w in part["workloads"]}
    merged["workloads"] = sorted(latest.values(), key=lambda w: order.get(w["name"], len(order)))
    merged["env"] = dict(merged["env"], parts=[part["env"].get("date") for part in parts])
    merged["ceiling_tflops"] = min(part["ceiling_tflops"] for part in parts)
    if args.commit:
        merged["env"]["jfa_commit"] = args.commit
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        report.render(merged, tmp)
        shutil.copy(Path(tmp) / "results.json", out.with_suffix(".json"))
        md = (Path(tmp) / "report.md").read_text().replace("](plots/", f"]({out.name}-plots/")
        out.with_suffix(".md").write_text(md)
        plots = out.parent / f"{out.name}-plots"
        shutil.rmtree(plots, ignore_errors=True)
        shutil.copytree(Path(tmp) / "plots", plots)
    print(f"wrote {out}.json, {out}.md, {out.name}-plots/")


if __name__ == "__main__":
    main()
