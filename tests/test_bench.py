"""jfa bench on the CPU: pair counts, the suite and its length recipe, the report (the correctness gate:
test_bench_gate.py)."""
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from jfa.bench import main, report, runner, suite
from jfa.jagged import visible_mask, visible_pairs

FIXTURE = Path(__file__).parent / "fixtures" / "bench_results.json"


def brute_pairs(q_lens, kv_lens, left, right):
    """Count visible pairs by walking every (query, key) of every sequence (bottom-right aligned)."""
    total = 0
    for lq, lk in zip(q_lens, kv_lens):
        for i in range(lq):
            ii = i + lk - lq
            for j in range(lk):
                if (left < 0 or j >= ii - left) and (right < 0 or j <= ii + right):
                    total += 1
    return total


PAIR_CASES = {
    "self-full": ([5, 1, 17, 0, 9], None, -1, -1),
    "causal": ([5, 1, 17, 0, 9], None, -1, 0),
    "window-3-2": ([5, 1, 17, 0, 9], None, 3, 2),
    "window-left-only": ([40, 7], None, 4, -1),
    "cross": ([3, 8, 1, 0], [10, 2, 5, 4], -1, -1),
    "cross-causal": ([3, 8, 1, 0], [10, 2, 5, 4], -1, 0),
    "cross-window": ([3, 8, 1, 6], [10, 2, 5, 0], 2, 1),
}


@pytest.mark.parametrize("q_lens, kv_lens, left, right", PAIR_CASES.values(), ids=PAIR_CASES.keys())
def test_visible_pairs_exact(q_lens, kv_lens, left, right):
    kv_lens = q_lens if kv_lens is None else kv_lens
    assert visible_pairs(q_lens, kv_lens, left, right) == brute_pairs(q_lens, kv_lens, left, right)


@pytest.mark.parametrize("context,window", [(0, -1), (3, -1), (3, 5)], ids=["targets", "context", "context-window"])
@pytest.mark.parametrize("serving", [False, True], ids=["self", "serving"])
def test_visible_pairs_with_targets_count_the_mask(context, window, serving):
    """HSTU's mask's pair count (counted from the positions) equals the mask's own count, each sequence's last rows
    as queries when serving."""
    kv_lens, targets = [0, 1, 4, 9, 17, 30, 30], [0, 1, 4, 2, 0, 5, 30]
    kv_lens = [n if n == 0 else max(n, context) for n in kv_lens]
    q_lens = [min(n, m) for n, m in zip(kv_lens, [0, 1, 2, 9, 3, 30, 7])] if serving else kv_lens
    brute = sum(int(visible_mask(lq, n, window, 0, targets=(t, context)).sum())
                for lq, n, t in zip(q_lens, kv_lens, targets))
    assert visible_pairs(q_lens, kv_lens, window, 0, targets=(torch.tensor(targets), context)) == brute


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 3)], ids=["full", "causal", "window"])
def test_workload_pairs_and_flops(window):
    lens = (7, 1, 12, 3)
    self_w = suite.Workload("s", "self", batch=4, max_len=12, dist="file", heads_q=4, heads_kv=2, head_dim=32,
                            window=window, lengths=lens)
    assert suite.pairs(self_w) == brute_pairs(lens, lens, *window)
    fwd, bwd = suite.flops(self_w)
    assert fwd == 4 * 4 * 32 * brute_pairs(lens, lens, *window) and bwd == 2.5 * fwd
    bc = suite.Workload("b", "broadcast", batch=4, max_len=12, dist="file", q_len=5, window=window, lengths=lens)
    assert suite.pairs(bc) == brute_pairs([5] * 4, lens, *window)


def recipe(batch, max_len, dist, seed):
    """The "about" string of workloads.json, written out again."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(batch, generator=g)
    if dist == "full":
        return [max_len] * batch
    vals = u if dist == "uniform" else u * 64 / max_len if dist == "spike" else u ** 3
    lens = [max(1, math.floor(float(x) * max_len)) for x in vals]
    if dist in ("skewed", "spike"):
        lens[0] = max_len
    return lens


def test_packaged_suite_lengths_follow_the_recipe():
    about, workloads = suite.load_suite()
    assert "floor(u**3 * max_len)" in about and len(workloads) >= 9
    for w in workloads:
        want = recipe(w.batch, w.max_len, w.dist, w.seed)  # (raised to a contextual prefix and serving's q_len)
        least = max(w.contextual_len, w.q_len if w.mode == "cross" and w.targets else 0)
        assert suite.kv_lengths(w).tolist() == [max(n, least) for n in want], w.name
        lens = suite.kv_lengths(w)
        assert lens.min() >= 1 and lens.max() <= w.max_len
    names = [w.name for w in workloads]
    assert [w.name for w in suite.select(workloads, "pma-64,self-full-512")] == ["self-full-512", "pma-64"]
    assert suite.select(workloads, None) == workloads
    with pytest.raises(ValueError, match="no workload named"):
        suite.select(workloads, "nope")
    assert len(set(names)) == len(names)


def test_bytes_moved_counts_each_tensor_once():
    """Forward: q, k, v read, o and the float32 lse written; backward: q, k, v, o, dO, lse read, dq, dk, dv
    written; broadcast q (and its dq) once; cross-attention q rows = min(q_len, L)."""
    kv = [5, 40, 1]
    H, Hkv, D, e = 4, 2, 16, 2
    self_ = suite.Workload("s", "self", batch=3, heads_q=H, heads_kv=Hkv, head_dim=D, lengths=tuple(kv), dist="file")
    rows, k_rows = sum(kv), sum(kv)
    q, kvb, o, lse = rows * H * D * e, k_rows * Hkv * D * e, rows * H * D * e, rows * H * 4
    assert suite.bytes_moved(self_) == (q + 2 * kvb + o + lse, 2 * q + 4 * kvb + 2 * o + lse)
    bc = suite.Workload("b", "broadcast", batch=3, q_len=8, heads_q=H, heads_kv=Hkv, head_dim=D, lengths=tuple(kv),
                        dist="file")
    q, o, lse = 8 * H * D * e, 24 * H * D * e, 24 * H * 4
    assert suite.bytes_moved(bc) == (q + 2 * kvb + o + lse, 2 * q + 4 * kvb + 2 * o + lse)
    cross = suite.Workload("c", "cross", batch=3, q_len=8, heads_q=H, heads_kv=Hkv, head_dim=D, lengths=tuple(kv),
                           dist="file")
    assert suite.q_lengths(cross, suite.kv_lengths(cross)).tolist() == [5, 8, 1]
    q = 14 * H * D * e
    assert suite.bytes_moved(cross) == (2 * q + 2 * kvb + 14 * H * 4, 4 * q + 4 * kvb + 14 * H * 4)


def test_cross_mode_inputs_and_pairs():
    """Target queries at the end of each history (bottom-right, causal): min(q_len, L) query rows per sequence,
    packed, with their own offsets; pairs counted exactly."""
    w = suite.Workload("t", "cross", batch=3, q_len=4, heads_q=2, heads_kv=2, head_dim=16, lengths=(9, 2, 5),
                       dist="file", window=(-1, 0))
    inp = suite.make_inputs(w, device="cpu", dtype=torch.bfloat16)
    assert inp.q_offsets.tolist() == [0, 4, 6, 10] and inp.kv_offsets.tolist() == [0, 9, 11, 16]
    assert inp.q.shape == (10, 2, 16) and inp.dout.shape == (10, 2, 16)
    assert suite.pairs(w) == brute_pairs([4, 2, 4], [9, 2, 5], -1, 0) == (6 + 7 + 8 + 9) + (1 + 2) + (2 + 3 + 4 + 5)
    assert w.spec()["q_len"] == 4 and suite.Workload.from_dict(w.spec()) == w


def test_suite_file_parsing(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"about": "x", "workloads": [
        {"name": "a", "mode": "broadcast", "q_len": 8, "batch": 5, "max_len": 64, "dist": "skewed", "seed": 3,
         "heads_q": 4, "heads_kv": 2, "head_dim": 64, "window": [-1, 0]}]}))
    about, (w,) = suite.load_suite(path)
    assert (about, w.mode, w.q_len, w.window, w.heads_kv) == ("x", "broadcast", 8, (-1, 0), 2)
    assert w.spec()["window"] == [-1, 0] and "lengths" not in w.spec()
    assert suite.kv_lengths(w).tolist() == recipe(5, 64, "skewed", 3)
    path.write_text(json.dumps({"workloads": [{"name": "a", "batch": 1, "max_len": 4, "colour": "red"}]}))
    with pytest.raises(ValueError, match="unknown keys"):
        suite.load_suite(path)
    path.write_text(json.dumps({"workloads": [{"name": "a", "batch": 1, "max_len": 4, "heads_q": 3, "heads_kv": 2}]}))
    with pytest.raises(ValueError, match="multiple"):
        suite.load_suite(path)


def test_lengths_files(tmp_path):
    import numpy as np
    (tmp_path / "l.txt").write_text("# lengths\n5\n\n17\n1  # short\n")
    np.save(tmp_path / "l.npy", np.array([5, 17, 1]))
    torch.save(torch.tensor([5, 17, 1]), tmp_path / "l.pt")
    for name in ("l.txt", "l.npy", "l.pt"):
        assert suite.read_lengths_file(tmp_path / name) == [5, 17, 1]
    w = suite.workload_from_lengths(tmp_path / "l.txt", heads_q=4, heads_kv=2, head_dim=32, causal=True)
    assert (w.batch, w.max_len, w.window, suite.kv_lengths(w).tolist()) == (3, 17, (-1, 0), [5, 17, 1])
    small = suite.scale_down(w, batch_div=1, len_div=2, heads_div=2)
    assert small.lengths == (2, 8, 1) and (small.heads_q, small.heads_kv) == (2, 1)


def test_inputs_and_prefix():
    w = suite.Workload("t", "broadcast", batch=3, max_len=9, dist="file", q_len=4, heads_q=2, heads_kv=1,
                       head_dim=16, lengths=(9, 2, 5))
    inp = suite.make_inputs(w, device="cpu", dtype=torch.bfloat16)
    assert inp.q.shape == (4, 2, 16) and inp.k.shape == (16, 1, 16) and inp.dout.shape == (12, 2, 16)
    assert inp.q_offsets.tolist() == [0, 4, 8, 12] and inp.kv_offsets.tolist() == [0, 9, 11, 16]
    sub = inp.prefix(2)
    assert sub.k.shape[0] == 11 and sub.dout.shape[0] == 8 and sub.q.shape == inp.q.shape
    assert runner.gate_prefix(inp, budget=2 * 4 * 9) == 1  # the first sequence always
    assert runner.gate_prefix(inp, budget=1 << 20) == 3
    assert runner.gate_prefix(inp, budget=1 << 20, max_seqs=2) == 2


def test_self_attention_inputs_share_one_offsets_tensor(monkeypatch):
    """Self-attention's callers pass one offsets tensor (jfa: kv_offsets=None): the suite's inputs hold one, its
    prefix and the fresh-offsets probe keep it one, and jfa's provider calls jfa that way."""
    from jfa.bench import providers
    from jfa.bench.providers import _new_offsets_ms
    w = suite.Workload("t", "self", batch=2, max_len=9, dist="file", heads_q=2, heads_kv=2, head_dim=16,
                       lengths=(9, 2))
    inp = suite.make_inputs(w, device="cpu", dtype=torch.float32)
    assert inp.kv_offsets is inp.q_offsets and inp.q_offsets.tolist() == [0, 9, 11]
    sub = inp.prefix(1)
    assert sub.kv_offsets is sub.q_offsets and sub.q_offsets.tolist() == [0, 9]
    seen = []
    _new_offsets_ms(lambda qo, ko: seen.append(ko is qo), inp, reps=1)
    assert seen and all(seen)
    cross = suite.Workload("c", "cross", batch=3, q_len=4, heads_q=2, heads_kv=2, head_dim=16, lengths=(9, 2, 5),
                           dist="file", window=(-1, 0))
    assert suite.make_inputs(cross, device="cpu", dtype=torch.float32).kv_offsets is not None
    calls = []
    monkeypatch.setattr(providers.jfa, "jagged_attention", lambda *a, **kw: calls.append(a[4]))
    fn, _ = providers.Jfa("reference").build(inp)
    fn()
    assert calls == [None]


def test_new_offsets_cost_is_the_extra_time_of_fresh_offsets():
    """jfa's "new offsets" column: the forward's extra wall time when its offsets are new tensors (a schedule
    build on the hopper backend), measured here on a call that takes 30 ms longer for unseen offsets."""
    import time

    from jfa.bench.providers import _new_offsets_ms
    w = suite.Workload("t", "self", batch=2, max_len=9, dist="file", heads_q=2, heads_kv=2, head_dim=16,
                       lengths=(9, 2))
    inp = suite.make_inputs(w, device="cpu", dtype=torch.float32)

    def call(q_offsets, kv_offsets):
        time.sleep(0.03 if q_offsets is not inp.q_offsets else 0.0)
    assert 25 <= _new_offsets_ms(call, inp, reps=3) <= 60
    assert _new_offsets_ms(lambda qo, ko: None, inp, reps=3) < 5


@pytest.mark.parametrize("host_ms,issue,note", [(0.9, 0.5, "host-bound"), (0.42, 0.5, None), (0.9, 0.1, None)],
                         ids=["host-bound", "gpu-bound", "fast-host"])
def test_backward_of_a_host_bound_forward_comes_from_the_gpu_busy_times(monkeypatch, host_ms, issue, note):
    """do_bench's forward holds the host's time where the host issues a call more slowly than the GPU runs it (the
    forward+backward hides it behind the kernels): the backward is then the busy times' difference, and the result
    says so; a GPU-bound forward keeps do_bench's split, and so does one whose do_bench time is above its busy time
    while the host issues a call in a fraction of it (the host cannot be what the span holds)."""
    w = suite.Workload("t", "self", batch=2, max_len=9, dist="file", heads_q=2, heads_kv=2, head_dim=16,
                       lengths=(9, 2))
    inp = suite.make_inputs(w, device="cpu", dtype=torch.float32)
    timed = {"fn": (host_ms, host_ms, host_ms), "fwd_bwd": (1.55, 1.55, 1.55)}
    busy = {"fn": 0.40, "fwd_bwd": 1.50}
    monkeypatch.setattr(runner, "time_ms", lambda f, *a, **k: timed[f.__name__])
    monkeypatch.setattr(runner, "gpu_busy_ms", lambda f, *a, **k: busy[f.__name__])
    monkeypatch.setattr(runner, "issue_ms", lambda f, *a, **k: issue)

    def fn():
        return inp.q * 1.0
    m = runner.measure(fn, inp, 1e9, 2.5e9)
    assert m["fwd_gpu_ms"] == 0.40 and m["fwdbwd_gpu_ms"] == 1.50 and m["bwd_gpu_ms"] == pytest.approx(1.10)
    assert m["fwd_issue_ms"] == issue
    if note:
        assert m["bwd_ms"] == pytest.approx(1.10) and note in m["note"] and "host 0.500 ms a call" in m["note"]
    else:
        assert m["bwd_ms"] == pytest.approx(1.55 - host_ms) and "note" not in m


def test_host_bound_needs_a_host_slow_enough_to_be_the_cause():
    """The H200 run's rows: gdpa-cross-short-kv's jfa forward (do_bench 0.786 ms, busy 0.402, ~0.5 ms of host a call)
    is host-bound; hstu-silu's (5.830 against 5.238, flagged by the ratio alone) is not; neither is a row without a
    busy time or an issue time (off CUDA)."""
    assert runner.host_bound(0.786, 0.402, 0.5)
    assert not runner.host_bound(5.830, 5.238, 0.5)
    assert not runner.host_bound(0.786, 0.402, None) and not runner.host_bound(0.786, None, 0.5)
    assert not runner.host_bound(0.41, 0.402, 0.5)


def test_issue_time_is_cuda_only():
    assert runner.issue_ms(lambda: None, "cpu") is None


def test_gpu_busy_time_is_cuda_only():
    assert runner.gpu_busy_ms(lambda: None, "cpu") is None


def test_ratios_pick_the_fastest_correct_peer():
    results = {"jfa": {"fwd_tflops": 300.0, "bwd_tflops": 100.0}, "fa2": {"fwd_tflops": 200.0, "bwd_tflops": 200.0},
               "fa4": {"fwd_tflops": 150.0, "bwd_tflops": 250.0}, "bad": {"correct": False}}
    out = runner.ratios(results, {"jfa": False, "fa2": True, "fa4": True, "bad": True})
    assert out["best_peer"]["fwd"]["provider"] == "fa2" and out["best_peer"]["bwd"]["provider"] == "fa4"
    assert out["ratios"]["jfa"] == {"fwd": 1.5, "bwd": 0.4}
    # a yardstick (fa4-softmax: another computation on the shape) is left out of the mapping: no ratio, not a peer
    results["fa4-softmax"] = {"fwd_tflops": 900.0, "bwd_tflops": 900.0}
    out = runner.ratios(results, {"jfa": False, "fa2": True, "fa4": True})
    assert out["best_peer"]["fwd"]["provider"] == "fa2" and set(out["ratios"]) == {"jfa"}


def test_fa4_softmax_is_a_yardstick_held_to_softmax():
    from jfa.bench.peer_providers import FA4Softmax
    p = FA4Softmax()
    assert p.yardstick and p.check_like == {"activation": "softmax", "out_scale": 1.0}
    w = suite.Workload("t", "self", batch=2, heads_q=2, heads_kv=2, head_dim=16, lengths=(5, 3), dist="file",
                       window=(-1, -1))
    assert p.skip_reason(suite.make_inputs(w, device="cpu")) == "a softmax workload: fa4 itself"
    # an activation workload: refused here for the CPU or a missing FA4, never for its score
    reason = p.skip_reason(suite.make_inputs(dataclasses.replace(w, activation="gelu_tanh"), device="cpu"))
    assert reason and "softmax" not in reason


def test_report_and_plots_from_fixture(tmp_path):
    data = json.loads(FIXTURE.read_text())
    files = report.render(data, tmp_path)
    names = {f.relative_to(tmp_path).as_posix() for f in files}
    assert {"results.json", "report.md", "plots/self-uniform-1k.png", "plots/pma-64.png", "plots/speedup.png"} <= names
    for f in files:
        if f.suffix == ".png":
            assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f.stat().st_size > 1000
    md = (tmp_path / "report.md").read_text()
    assert "NVIDIA H200" in md and "726.0 TF/s" in md and "eda947a" in md
    assert "| self-uniform-1k |" in md and "WRONG" in md and "skip: backend 'hopper'" in md
    assert "1.13" in md  # jfa fwd 400 over fa4 354 on self-uniform-1k
    assert json.loads((tmp_path / "results.json").read_text()) == data
    table = report.terminal_table(data["workloads"][0])
    assert "jfa-triton" in table and "mask build 3.2 ms" in table and "new offsets +0.42 ms" in table
    assert "new offsets +0.42 ms" in md


def test_merge_keeps_each_workloads_run(tmp_path):
    """benchmarks/merge_results.py: a later part's workload replaces an earlier one's, each workload keeps the
    commit and date of its run (--commit per part, - for the part's own), and the header lists the runs."""
    import runpy
    import sys
    first = json.loads(FIXTURE.read_text())
    second = json.loads(FIXTURE.read_text())
    second["workloads"] = [w for w in second["workloads"] if w["name"] == "pma-64"]
    second["workloads"][0]["results"]["jfa"]["fwd_ms"] = 0.5
    second["env"] = dict(second["env"], date="2026-12-01T00:00:00+00:00", jfa_commit="0c24516-dirty")
    second["ceiling_tflops"] = 700.0
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, data in zip(paths, (first, second)):
        path.write_text(json.dumps(data))
    argv = sys.argv
    sys.argv = ["merge_results.py", str(tmp_path / "h200"), *map(str, paths), "--commit", "-", "feed123"]
    try:
        runpy.run_path(str(Path(__file__).parents[1] / "benchmarks" / "merge_results.py"), run_name="__main__")
    finally:
        sys.argv = argv
    merged = json.loads((tmp_path / "h200.json").read_text())
    by_name = {w["name"]: w for w in merged["workloads"]}
    assert [w["name"] for w in merged["workloads"]] == ["self-uniform-1k", "pma-64"]  # suite order
    assert by_name["pma-64"]["results"]["jfa"]["fwd_ms"] == 0.5 and by_name["pma-64"]["jfa_commit"] == "feed123"
    assert by_name["self-uniform-1k"]["jfa_commit"] == "eda947a00000"
    assert merged["ceiling_tflops"] == 700.0 and merged["env"]["date"] == "2026-12-01T00:00:00+00:00"
    md = (tmp_path / "h200.md").read_text()
    assert "self-uniform-1k @ eda947a00000, 2026-11-30T12:00:00+00:00; pma-64 @ feed123" in md
    assert "the lowest of the runs" in md


def test_report_with_missing_numbers(tmp_path):
    """A backward lost in noise (None), a workload with no peer, a workload with nothing timed."""
    data = json.loads(FIXTURE.read_text())
    w0, w1 = data["workloads"]
    w0["results"]["fa2"].update(bwd_ms=None, bwd_tflops=None)
    w1["results"] = {"jfa": {"skip": "no", "correct": None}}
    w1["ratios"], w1["best_peer"] = {}, {}
    data["ceiling_tflops"] = None
    files = report.render(data, tmp_path)
    assert len([f for f in files if f.suffix == ".png"]) == 3
    assert "no peer ran" in (tmp_path / "report.md").read_text()


def test_cli_smoke_from_a_lengths_file(tmp_path, capsys):
    (tmp_path / "lens.txt").write_text("6\n2\n")
    rc = main(["--smoke", "--lengths", str(tmp_path / "lens.txt"), "--heads", "4", "--head-dim", "16",
               "--providers", "jfa,sdpa-padded", "--out", str(tmp_path / "out"), "--no-plots"])
    assert rc == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    (w,) = data["workloads"]
    assert w["spec"]["lengths"] == [1, 1]  # scaled down by the smoke run (lengths / 64, at least 1)
    assert set(w["results"]) == {"jfa", "sdpa-padded"}
    assert all(r["correct"] for r in w["results"].values())
    assert data["env"]["smoke"] is True and data["ceiling_tflops"] > 0 and data["bandwidth_gbs"] > 0
    floor = max(w["fwd_flops"] / data["ceiling_tflops"] / 1e9, w["fwd_bytes"] / data["bandwidth_gbs"] / 1e6)
    assert w["floor_fwd_ms"] == pytest.approx(floor)
    r = w["results"]["jfa"]
    assert r["fwd_floor_pct"] == pytest.approx(100 * floor / r["fwd_ms"])
    assert "lens" in capsys.readouterr().out and "% floor" in (tmp_path / "out" / "report.md").read_text()


def test_cli_smoke_cross_workload(tmp_path):
    """The packaged targets-32 (cross mode), scaled down, through the smoke run: jfa's Triton kernels and the
    padded baseline agree with the reference."""
    rc = main(["--smoke", "--only", "targets-32", "--providers", "jfa,sdpa-padded", "--out", str(tmp_path),
               "--no-plots"])
    assert rc == 0
    (w,) = json.loads((tmp_path / "results.json").read_text())["workloads"]
    assert w["spec"]["mode"] == "cross" and all(r["correct"] for r in w["results"].values())


def test_bench_list_names_every_workload_and_provider_with_what_each_needs(capsys):
    """`jfa bench --list`: the HSTU/GDPA workloads with their score and mask, the providers with what they need."""
    from jfa.bench import main
    assert main(["--list"]) == 0
    text = capsys.readouterr().out
    for name in ("hstu-silu", "hstu-targets", "hstu-targets-context", "gdpa-self", "gdpa-cross-short-kv",
                 "softmax-targets"):
        line = next(x for x in text.splitlines() if x.strip().startswith(name + " "))
        assert ("silu" in line or "gelu_tanh" in line or "targets" in line), line
    assert "context 8" in text and "HSTU targets 1-20" in text
    hstu = next(x for x in text.splitlines() if x.strip().startswith("hstu "))
    assert "scripts/carry_hstu.sh" in hstu
    assert "scripts/fetch_fa4.sh" in next(x for x in text.splitlines() if x.strip().startswith("fa4 "))
    assert "scripts/carry_gdpa.sh" in next(x for x in text.splitlines() if x.strip().startswith("gdpa "))


def test_bench_wrong_name_is_one_line_naming_the_choices(capsys):
    from jfa.bench import main
    assert main(["--only", "hstu-silu,nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nope" in err and "hstu-targets" in err and "--list" in err
    assert main(["--providers", "jfa,fa5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "fa5" in err and "hstu" in err


def test_lengths_workload_takes_the_score_and_hstus_mask(tmp_path):
    """`--lengths` workloads: --activation, --out-scale, --targets LO,HI, --contextual-len, validated."""
    from jfa.bench import build_parser, suite
    path = tmp_path / "lens.txt"
    path.write_text("5\n40\n17\n")
    args = build_parser().parse_args(["--lengths", str(path), "--causal", "--activation", "silu", "--out-scale",
                                      "0.25", "--targets", "1,3", "--contextual-len", "2"])
    w = suite.workload_from_lengths(args.lengths, causal=args.causal, activation=args.activation,
                                    out_scale=args.out_scale, targets=args.targets, contextual_len=args.contextual_len)
    assert (w.activation, w.out_scale, w.targets, w.contextual_len, w.window) == ("silu", 0.25, (1, 3), 2, (-1, 0))
    inp = suite.make_inputs(w, device="cpu", dtype=torch.float32)
    assert inp.num_targets is not None and bool((inp.num_targets <= inp.kv_lens).all())
    assert "HSTU targets 1-3" in w.describe() and "silu" in w.describe()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--lengths", str(path), "--targets", "3"])
    with pytest.raises(ValueError, match="causal"):
        suite.workload_from_lengths(path, targets=(1, 2))
    with pytest.raises(ValueError, match="activation"):
        suite.workload_from_lengths(path, activation="tanh")


def test_clocks_average_the_rows_sampled_inside_the_block(tmp_path, monkeypatch):
    """jfa.bench.clocks.Clocks with a stand-in nvidia-smi: the rows printed while the block runs are averaged, the
    row printed before it (the sampler's start) is not; unreadable rows are skipped; no nvidia-smi, no clock."""
    import os
    import time

    from jfa.bench.clocks import Clocks, parse
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/usr/bin/env bash\necho "0, 0"\nwhile true; do echo "1800, 600"; echo "[N/A], 1"; '
                    'echo "1700, 500"; sleep 0.01; done\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with Clocks() as c:
        time.sleep(0.5)
    mhz, watts = c.mean
    assert 1700 <= mhz <= 1800 and 500 <= watts <= 600, c.mean  # (0 / 0, the first row, would pull it below)
    assert abs(mhz - 1750) <= 10 and c.text().endswith(" W")
    assert parse("1500, 400\n[N/A], [N/A]\n1600,") == (1500.0, 400.0) and parse("") is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with Clocks() as c:
        pass
    assert c.mean is None and c.text() == ""
