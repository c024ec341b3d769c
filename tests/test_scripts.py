"""The benchmark tools on the CPU: what they compile or edit still matches today's kernels, so a stale tool fails
here and not in a device call."""
import ast
import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def test_ablations_still_apply(tmp_path):
    """benchmarks/ablate.py: every ablation's edits find their text exactly once in today's kernels (a kernel
    change that moves one makes the script fail here, not on the device), and a text found twice is refused."""
    import runpy
    ablate = runpy.run_path(str(Path(__file__).parents[1] / "benchmarks" / "ablate.py"))
    dirs = ablate["build"](list(ablate["ABLATIONS"]), tmp_path)
    bwd_py = "hopper/bwd.py"
    assert "dq_writer_partition, (shape" not in (dirs["no dQ"] / "jfa" / bwd_py).read_text()
    assert "dq_writer_partition, (shape" in (dirs["main"] / "jfa" / bwd_py).read_text()
    with pytest.raises(ValueError, match="occurs 3 times"):
        ablate["apply"](dirs["main"] / "jfa", [(bwd_py, "gl.warp_specialize([", "")])


def test_mufu_chains_compile_to_one_operation_an_iteration():
    """benchmarks/mufu_rates.py --check: each chain compiles for sm_90 to its MUFU operation and the common FFMA,
    one each an iteration and element (so the rates it reports are the operations'), the FFMA chain to FFMAs
    alone. (In a subprocess: the interpreter must be off for triton.compile.)"""
    script = Path(__file__).parents[1] / "benchmarks" / "mufu_rates.py"
    res = subprocess.run([sys.executable, str(script), "--check", "--iters", "8"], capture_output=True, text=True,
                         env=dict(os.environ, TRITON_INTERPRET="0"), timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    per_thread = 2048 // 128  # BLOCK elements over 4 warps
    lines = dict(line.split(" SASS: ") for line in res.stdout.strip().splitlines())
    for op, want in (("ex2", "MUFU.EX2"), ("tanh", "MUFU.TANH"), ("rcp", "MUFU.RCP"), ("ffma", None)):
        counts = ast.literal_eval(lines[op.ljust(5)])
        expect = {"FFMA": 8 * per_thread, **({want: 8 * per_thread} if want else {})}
        assert counts == expect, (op, counts)


def test_wgmma_forms_compile_to_the_products_they_time():
    """benchmarks/wgmma_rates.py --check: each form's loop compiles for sm_90 to wgmma of its N (64 x N x 16), with A
    loaded into registers (ldmatrix) exactly in the rs forms, and one or four tiles' stores into shared memory an
    iteration in the +sts and +sts4 forms (so the rates it reports are of those operands)."""
    script = Path(__file__).parents[1] / "benchmarks" / "wgmma_rates.py"
    res = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True,
                         env=dict(os.environ, TRITON_INTERPRET="0"), timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    forms = {name.strip(): ast.literal_eval(counts) for name, counts in
             (line.split(" SASS: ") for line in res.stdout.strip().splitlines())}
    assert set(forms) == {"ss n64", "rs n64", "ss n128", "rs n128", "ss n64 +sts", "rs n64 +sts", "ss n64 +sts4",
                          "rs n64 +sts4"}, forms
    for name, counts in forms.items():
        n = name.split()[1][1:]
        assert [op for op in counts if op.startswith("HGMMA")] == [f"HGMMA.64x{n}x16"], (name, counts)
        assert ("LDSM.16.M88.4" in counts) == name.startswith("rs"), (name, counts)
        assert "STL" not in counts and "LDL" not in counts, (name, counts)
    for a in ("ss", "rs"):
        plain, one, four = forms[f"{a} n64"], forms[f"{a} n64 +sts"], forms[f"{a} n64 +sts4"]
        # (the operands' setup stores alike in all three; the loops hold one and four tiles' stores)
        assert plain["STS.128"] < one["STS.128"] < four["STS.128"], (a, plain, one, four)
        assert four["STS.128"] - plain["STS.128"] == 4 * (one["STS.128"] - plain["STS.128"]), (a, one, four)


def test_gpu_suite_shards_split_it_whole():
    """tests/conftest.py's --shard I/N (the GPU suite in device calls of at most 10 minutes): the parts of the GPU
    tests are disjoint, together every test, each test function's cases in one part, and about even."""
    root = Path(__file__).parents[1]

    def collected(*args):
        res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "-m", "gpu", *args, "tests"], capture_output=True, text=True, cwd=root, timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        return {line for line in res.stdout.splitlines() if "::" in line}

    whole = collected()
    parts = [collected("--shard", f"{i}/3") for i in (1, 2, 3)]
    assert len(whole) > 100 and set().union(*parts) == whole and sum(map(len, parts)) == len(whole)
    functions = [{n.split("[")[0] for n in part} for part in parts]
    assert not (functions[0] & functions[1]) and not (functions[0] & functions[2]) and not (functions[1] & functions[2])
    assert max(map(len, parts)) < 0.5 * len(whole)


def test_gpu_tests_script_runs_a_shard(tmp_path):
    """scripts/gpu_tests.sh as a device call runs it (a shard, no test path named, two xdist workers, the times log
    under $OUT); here, with no GPU, every GPU test skips. Its pytest command line must reach conftest.py's options
    in every worker: a times file given as a separate word was once taken for a test path by the workers (the
    controller had created it), whose rootdir became $OUT, with no conftest."""
    root = Path(__file__).parents[1]
    if not (root / ".venv" / "bin" / "python").exists():
        pytest.skip("scripts/gpu_tests.sh runs the repo's .venv (make test builds it)")
    if torch.cuda.is_available():
        pytest.skip("with a GPU the shard would run the GPU tests themselves (minutes): the device runs the script")
    (tmp_path / "cache").mkdir()
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), GPU_WORKERS="2", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run(["bash", "scripts/gpu_tests.sh", "240", "--shard", "1/3"], capture_output=True, text=True,
                         cwd=root, env=env, timeout=300)
    log = (out / "gpu-tests.log").read_text()
    assert "== rc 0 " in res.stdout and "node down" not in log, res.stdout[-2000:] + log[-2000:]
    ended = (out / "gpu-test-times.tsv").read_text().splitlines()
    assert len(ended) > 30 and f"{len(ended)} skipped in" in log, log[-2000:]


def test_test_times_log_each_test_once_under_xdist(tmp_path):
    """tests/conftest.py's --times FILE (what a GPU run cut by its time limit still reports): a run under two xdist
    workers writes one line a test with its outcome (a failure, a skip, a pass), and scripts/test_times.py sums the
    cases' seconds by test function."""
    root = Path(__file__).parents[1]
    probe = tmp_path / "test_probe.py"
    probe.write_text("import time, pytest\n"
                     "@pytest.mark.parametrize('n', [1, 2, 3])\n"
                     "def test_sleeps(n):\n    time.sleep(0.2 * n)\n"
                     "def test_fails():\n    assert False\n"
                     "def test_skips():\n    pytest.skip('no')\n")
    (tmp_path / "conftest.py").write_text((root / "tests" / "conftest.py").read_text())
    times = tmp_path / "times.tsv"
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--times",
                          str(times), str(probe)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]  # (test_fails)
    sys.path.insert(0, str(root / "scripts"))
    try:
        import test_times
    finally:
        sys.path.pop(0)
    rows = test_times.read(str(times))
    outcome = {nodeid.split("::")[1]: o for _, o, nodeid in rows}
    assert len(rows) == 5 and outcome == {"test_sleeps[1]": "passed", "test_sleeps[2]": "passed",
                                          "test_sleeps[3]": "passed", "test_fails": "failed", "test_skips": "skipped"}
    text = test_times.summary(rows)
    sleeps = sum(s for s, _, nodeid in rows if "test_sleeps" in nodeid)
    assert sleeps >= 1.19 and "5 tests ended (3 passed, 1 failed, 1 skipped)" in text
    assert f"{sleeps:8.1f}    3" in text.splitlines()[2]  # (the slowest function first: its three cases summed)


def test_ncu_lines_parts_split_partitions_and_their_mma_loops(tmp_path):
    """scripts/ncu_lines.py --parts: each partition (its lines between USETMAXREGs) with its samples in MMA loops (an
    innermost backward branch around an HGMMA; a loop without one is the rest) and the rest by instruction kind."""
    code = [("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8", 0), ("MOV R1, R2", 4),  # a consumer: 4 + 40 + 6
            ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24", 30), ("MUFU.TANH R3, R4", 8),
            ("@!P0  BRA 0x{:x}", 2), ("STG.E desc[UR52][R4.64], R89", 6),
            ("USETMAXREG.DEALLOC.CTAPOOL 0x28", 0), ("SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR8], R2", 10),  # producer
            ("@!P1  BRA 0x{:x}", 40)]
    base = 0x7f0000000000
    rows = [["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]]
    for i, (text, n) in enumerate(code):
        target = base + 16 * (2 if i == 4 else 7)  # the consumer's loop from its HGMMA, the producer's spin loop
        rows.append([hex(base + 16 * i), "      " + text.format(target), str(n), "1"])
    path = tmp_path / "page.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows([["Kernel Name", "k"]] + rows)
    res = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "scripts" / "ncu_lines.py"), str(path),
                          "--parts"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    consumer, producer = res.stdout.splitlines()
    assert "50.0% of the samples; in MMA loops  40.0%, the rest  10.0% (STG 6.0%, MOV 4.0%" in consumer, consumer
    assert "50.0% of the samples; in MMA loops   0.0%, the rest  50.0% (BRA 40.0%, SYNCS 10.0%" in producer, producer


def test_peer_kernels_table_reads_ncu_raw_pages():
    """benchmarks/peer_kernels.py: a raw page of two kernels (ncu's header, units, a row a kernel) becomes a row a
    kernel, each column the metric its pattern names in the table's unit (ms, GB, KB), "-" where the report has
    none, and the extra metrics' lines."""
    import runpy
    peer = runpy.run_path(str(Path(__file__).parents[1] / "benchmarks" / "peer_kernels.py"))
    raw = "\n".join([
        '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","launch__shared_mem_per_block_dynamic",'
        '"smsp__issue_active.avg.pct_of_peak_sustained_active"',
        '"","","usecond","Gbyte","Kbyte","%"',
        '"0","hopper_dkdv_kernel","6,430.5","1.75","200","52.6"',
        '"1","delta_kernel","80","0.3","0","9.1"'])
    rows, extra = peer["table"](raw, "jfa")
    assert len(rows) == 2
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    titles = [t for t, _, _ in peer["COLUMNS"]]
    assert cells[:2] == ["jfa", "hopper_dkdv_kernel"]
    got = dict(zip(titles, cells[2:]))
    assert (got["ms"], got["DRAM rd GB"], got["smem KB"], got["issue %"], got["regs"]) == ("6.43", "1.75", "200",
                                                                                       "52.6", "-")
    assert dict(zip(titles, [c.strip() for c in rows[1].strip("|").split("|")][2:]))["ms"] == "0.08"
    assert any("issue_active" in line for line in extra)
    assert peer["table"]('"ID"\n""', "fa4")[0] == ["| fa4 | (no kernel profiled) |"]
    # the kernel whose stall lines are read: the longest, or the longest of those named like --stalls
    assert peer["longest_kernel"](raw) == "hopper_dkdv_kernel"
    assert peer["longest_kernel"](raw, "delta") == "delta_kernel"
    assert peer["longest_kernel"](raw, "fwd") is None


def test_triton_cache_travels_whole_or_not_at_all(tmp_path, monkeypatch):
    """scripts/triton_cache.py: pack keeps each entry's binary, metadata, PTX and TTGIR (not its LLVM IR), newest
    first within the budget, in parts; unpack restores them with the metadata group's paths pointed at the new
    cache, keeps entries already there, and a missing part unpacks nothing instead of failing the call."""
    import json
    import runpy
    import time
    tool = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "triton_cache.py"))
    src, dst, out = tmp_path / "src", tmp_path / "dst", tmp_path / "out"
    rng = __import__("random").Random(0)
    for i in range(6):
        d = src / f"ENTRY{i}"
        d.mkdir(parents=True)
        blob = bytes(rng.getrandbits(8) for _ in range(40_000))  # incompressible: the budget bites
        for ext, data in ((".cubin", blob), (".json", b"{}"), (".ptx", b"ptx"), (".llir", b"llir")):
            (d / f"k{ext}").write_bytes(data)
        (d / "__grp__k.json").write_text(json.dumps({"child_paths": {
            f"k{e}": str(d / f"k{e}") for e in (".cubin", ".json", ".ptx", ".llir")}}))
        os.utime(d / "k.cubin", (time.time() + i, time.time() + i))  # ENTRY5 newest
    unpack, pack = tool["unpack"], tool["pack"]
    monkeypatch.setitem(tool["cache_dir"].__globals__, "cache_dir", lambda: src)
    assert pack(out, "c", budget=150_000, part_bytes=50_000) == 0
    parts = sorted(out.glob("c.tar.xz.*"))
    assert len(parts) >= 2 and all(p.stat().st_size <= 50_000 for p in parts)
    monkeypatch.setitem(tool["cache_dir"].__globals__, "cache_dir", lambda: dst)
    (dst / "ENTRY5").mkdir(parents=True)  # already there: kept as it is
    assert unpack(out, "c") == 0
    got = sorted(p.name for p in dst.iterdir())
    assert "ENTRY5" in got and "ENTRY0" not in got and 3 <= len(got) < 6  # newest first, within the budget
    e4 = dst / "ENTRY4"
    assert sorted(p.name for p in e4.iterdir()) == ["__grp__k.json", "k.cubin", "k.json", "k.ptx"]
    assert (e4 / "k.cubin").read_bytes() == (src / "ENTRY4" / "k.cubin").read_bytes()
    paths = json.loads((e4 / "__grp__k.json").read_text())["child_paths"]
    assert paths == {f"k{e}": str(e4 / f"k{e}") for e in (".cubin", ".json", ".ptx")}
    assert not list((dst / "ENTRY5").iterdir())
    parts[1].unlink()
    fresh = tmp_path / "fresh"
    monkeypatch.setitem(tool["cache_dir"].__globals__, "cache_dir", lambda: fresh)
    assert unpack(out, "c") == 0 and not fresh.exists()


def test_api_overhead_runs_over_todays_backend_interface():
    """benchmarks/api_overhead.py (the public functions' host time on the CPU, over a stub backend or down the
    hopper backend's host path and Triton's launch path with its compiles and launcher faked): its stubs follow
    jfa.backends' interface and Triton's, so each case runs and prints its time (a stub of an older interface failed
    every call); the hopper forward's launch falls inside each call; and a repeated call launches every kernel
    through jfa.runtime.launch's kept kernels with the arguments Triton's own path gives them (the script asserts
    it, case by case)."""
    script = Path(__file__).parents[1] / "benchmarks" / "api_overhead.py"
    for backend, cases in (("stub", ["broadcast", "cross"]), ("hopper", ["broadcast", "cross", "gelu cross"])):
        res = subprocess.run([sys.executable, str(script), "--calls", "20", "--rounds", "1", "--backend", backend],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        lines = res.stdout.strip().splitlines()
        if backend == "hopper":
            kept = lines.pop(0)
            assert kept.startswith("kept launches:") and int(kept.split()[2]) >= 2 * len(cases) * 2, kept
        assert [line.split(" median")[0].strip() for line in lines] == [
            f"{case} {part}" for case in cases for part in ("forward", "forward+backward")]
        assert all(float(line.split("median")[1].split("us")[0]) > 0 for line in lines)
        for line in lines:  # (a launch before the call's start, or none, would read as a negative time)
            if backend == "hopper" and line.split(" median")[0].strip().endswith("forward"):
                assert float(line.split("launch: min")[1].split("us")[0]) > 0, line


def test_bank_conflict_model_matches_ncu_and_finds_the_conflict_free_swizzle():
    """scripts/bank_conflicts.py: its model gives the 4 wavefronts a store that ncu measured for the one pass's dQ
    chunk under the 128-byte swizzle (causal-skewed-4k: 87.7 M wavefronts for 22.1 M STS.64, 43.5 M excessive), the
    ideal 2 under the 32-byte swizzle and with the row-permuted groups, and the ideal 1 for the short-q form's
    transposed chunk under the 128-byte one."""
    import runpy
    bc = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "bank_conflicts.py"))
    acc, tr = bc["accumulator_stores"](64), bc["transposed_stores"](32)
    assert bc["wavefronts"](acc, 128, 64) == 4.0
    assert bc["wavefronts"](acc, 32, 64) == 2.0
    assert bc["wavefronts"](tr, 128, 64) == 1.0
    assert bc["wavefronts"](acc, 0, 64) == 8.0  # unswizzled rows of 256 bytes: every row on the same banks
    assert bc["wavefronts"](acc, "xor", 64) == 2.0  # 32-byte groups permuted by the row (docs/experiments/dq-xor)


def test_sass_loops_finds_the_innermost_mma_loops():
    """scripts/sass_loops.py on a SASS fragment in cuobjdump's form: an outer loop around an inner one with an HGMMA
    (predicated branches and labels as ptxas writes them), and a loop without one. Only the inner MMA loop is
    reported, with its count, its opcodes without modifiers and its spill reload."""
    import runpy
    sl = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "sass_loops.py"))
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   IMAD R2, R2, 0x2, RZ ;
.L_x_2:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R152, gdesc[UR48], RZ, !UPT ;
        /*0030*/                   LDL R3, [R1+0x4] ;
        /*0040*/                   FMUL R4, R4, UR29 ;
        /*0050*/              @!P3 BRA `(.L_x_2) ;
        /*0060*/                   ISETP.GE.AND P0, PT, R2, 0x4, PT ;
        /*0070*/               @P0 BRA `(.L_x_1) ;
.L_x_3:
        /*0080*/                   FADD R5, R5, R5 ;
        /*0090*/                   BRA `(.L_x_3) ;
        /*00a0*/                   EXIT ;
"""
    found = sl["loops"](sass)
    assert [(n, first, last) for n, first, last, _ in found] == [(4, 0x20, 0x50)]
    ops = found[0][3]
    assert ops["HGMMA"] == 1 and ops["LDL"] == 1 and ops["FMUL"] == 1 and ops["BRA"] == 1
    assert sl["loops"](sass, op="FADD")[0][:3] == (2, 0x80, 0x90)  # the MMA-free loop, by another opcode


def test_experiment_patches_apply(tmp_path):
    """docs/experiments: every waiting patch still applies to this commit's jfa/ through scripts/ab_tree.sh (after
    the patch its subject says it is on top of), so a stale patch fails here, not in a device call."""
    import re
    root = Path(__file__).parents[1]
    patches = sorted((root / "docs" / "experiments").glob("*.patch"))

    def stack(name):
        head = (root / "docs" / "experiments" / f"{name}.patch").read_text()[:2000]
        base = re.search(r"on top of ([\w-]+)\.patch", " ".join(head.split()))
        return (stack(base.group(1)) if base else []) + [name]
    for patch in patches:
        names = stack(patch.stem)
        res = subprocess.run(["bash", "scripts/ab_tree.sh", patch.stem, *names], cwd=root, capture_output=True,
                             text=True, env=dict(os.environ, AB_ROOT=str(tmp_path)), timeout=120)
        assert res.returncode == 0, (names, res.stderr[-2000:])
        changed = [f for f in re.findall(r"^\+\+\+ b/(jfa/\S+)", patch.read_text(), re.M)
                   if not (root / f).exists() or (root / f).read_bytes() != (tmp_path / patch.stem / f).read_bytes()]
        assert changed, (patch.name, "changed nothing")


def test_ab_compiles_every_tree_before_the_timed_rounds(tmp_path):
    """scripts/ab.sh with a stand-in python (it logs each call): first every tree's parts called once per workload,
    untimed (the parallel compile), then the timed rounds, each tree's lines tagged with its name."""
    root = Path(__file__).parents[1]
    (tmp_path / "scripts").mkdir()
    for name in ("ab.sh", "lib.sh"):
        (tmp_path / "scripts" / name).write_text((root / "scripts" / name).read_text())
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    fake = tmp_path / ".venv" / "bin" / "python"
    fake.write_text('#!/usr/bin/env bash\necho "${PYTHONPATH:-this} $*" >> calls.log\necho "timed $*"\n')
    fake.chmod(0o755)
    (tmp_path / ".ab" / "x" / "benchmarks").mkdir(parents=True)
    (tmp_path / ".ab" / "x" / "benchmarks" / "passes.py").write_text('p.add_argument("--clocks")\n')  # (x has it)
    res = subprocess.run(["bash", "scripts/ab.sh", ".ab/x", "w1,w2", "one pass", "2"], cwd=tmp_path,
                         capture_output=True, text=True, env=dict(os.environ, OUT=str(tmp_path / "out")), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    calls = (tmp_path / "calls.log").read_text().splitlines()
    warm = {c for c in calls if c.endswith("--calls 1")}
    assert warm == {f"{tree} {tree}/benchmarks/passes.py --only {w} --parts one pass --calls 1"
                    for tree in (".ab/x", ".") for w in ("w1", "w2")}, calls
    assert all(c.endswith("--calls 1") for c in calls[:4]) and len(calls) == 4 + 2 * 2 + 1, calls
    assert calls[-1] == f"this scripts/ab_summary.py {tmp_path / 'out' / 'ab-rounds.txt'}", calls  # the means, last
    rounds = calls[4:-1]  # the timed calls: with --clocks where the tree's passes.py has it (this one's has none)
    assert [c.endswith("--clocks") for c in rounds] == [True, False] * 2, rounds
    timed = [line.split()[0] for line in res.stdout.splitlines() if "timed" in line]
    assert timed == ["x", "this"] * 2 + ["timed"], res.stdout  # (the stand-in's own line for the means' call)


def test_ab_summary_means_each_tree_against_this():
    """scripts/ab_summary.py: per workload and part, each tree's mean over its rounds and its change against this
    checkout's mean (parts with spaces in their names, other lines ignored)."""
    import runpy
    summary = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "ab_summary.py"))["summary"]
    lines = ["x w1  one pass 2.000 ms 100 TF/s", "this  w1  one pass 4.000 ms 50 TF/s", "== rc 0 (limit 280s): x",
             "x w1  one pass 4.000 ms 50 TF/s", "this  w1  one pass 4.000 ms 50 TF/s",
             "x w2  backward (default) 1.100 ms"]
    out = summary(lines)
    assert out[0].split() == ["w1", "one", "pass", "x", "3.000", "-25.0%", "(2.000,", "4.000)", "|", "this", "4.000",
                              "(4.000,", "4.000)"], out
    assert out[1].split()[:6] == ["w2", "backward", "(default)", "x", "1.100", "(1.100)"], out
    clocked = summary(["x w1  forward 2.000 ms 100 TF/s @ 1700 MHz 600 W", "x w1  forward 2.000 ms @ 1800 MHz 650 W",
                       "this  w1  forward 2.000 ms 100 TF/s @ 1500 MHz 700 W"])  # (passes.py --clocks)
    assert clocked[0].endswith("(2.000, 2.000) 1750 MHz | this 2.000 (2.000) 1500 MHz"), clocked
    both = summary(["x w1  forward 2.000 ms 100 TF/s @ 1700 MHz 600 W | backward (default) 6.000 ms 90 TF/s",
                    "this  w1  forward 4.000 ms 50 TF/s @ 1500 MHz 700 W | backward (default) 3.000 ms 80 TF/s"])
    assert [o.split()[:5] for o in both] == [["w1", "forward", "x", "2.000", "-50.0%"],
                                             ["w1", "backward", "(default)", "x", "6.000"]], both  # (every part)
    assert both[1].split()[5] == "+100.0%", both
