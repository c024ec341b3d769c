"""Merge the results.json of several `jfa bench --only ...` runs (the device allows 10 minutes a command, so the
suite runs in parts, and a session may re-run only the workloads its changes touch) into one, in suite order, and
render report.md and the plots. A workload in a later part replaces the same workload of an earlier part (a re-run
after a change: the latest run counts). Each workload keeps the commit and date of the run it came from; the header
lists the parts.

    python benchmarks/merge_results.py benchmarks/results/h200 part1/results.json part2/results.json --commit SHA1 SHA2
    python benchmarks/merge_results.py benchmarks/results/h200 benchmarks/results/h200.json new.json --commit - SHA

writes OUT.json, OUT.md and OUT-plots/*.png (the names kept in benchmarks/results/). --commit: one per part, the
jfa commit that part ran ("-": the one the part records; the device's copy of the tree has no usable .git).
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
    p.add_argument("--commit", nargs="+", default=[], help="one per part: the jfa commit it ran, or - (its own)")
    args = p.parse_args()
    if args.commit and len(args.commit) != len(args.parts):
        p.error(f"--commit needs one value per part ({len(args.parts)})")
    parts = [json.load(open(path)) for path in args.parts]
    for i, part in enumerate(parts):  # each workload keeps its run's commit and date (an earlier merge's have them)
        given = args.commit[i] if args.commit else "-"
        for w in part["workloads"]:
            w.setdefault("jfa_commit", part["env"].get("jfa_commit") if given == "-" else given)
            w.setdefault("date", part["env"].get("date"))
    merged = dict(parts[0])
    order = {w.name: i for i, w in enumerate(suite.load_suite()[1])}
    latest = {w["name"]: w for part in parts for w in part["workloads"]}
    merged["workloads"] = sorted(latest.values(), key=lambda w: order.get(w["name"], len(order)))
    runs = {}  # (date, commit) -> the merged workloads from that run
    for w in merged["workloads"]:
        runs.setdefault((w["date"], w["jfa_commit"]), []).append(w["name"])
    env = {k: v for k, v in merged["env"].items() if k != "parts"}
    env["runs"] = [{"date": d, "jfa_commit": c, "workloads": names} for (d, c), names in runs.items()]
    env["jfa_commit"] = ", ".join(dict.fromkeys(c for _, c in runs))
    env["date"] = max(d for d, _ in runs)
    merged["env"] = env
    merged["ceiling_tflops"] = min(part["ceiling_tflops"] for part in parts)
    merged["bandwidth_gbs"] = min((part["bandwidth_gbs"] for part in parts if part.get("bandwidth_gbs")), default=None)
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
