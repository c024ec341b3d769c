"""The benchmark tools on the CPU: what they compile or edit still matches today's kernels, so a stale tool fails
here and not in a device call."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest


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
    titles = [t for t, _ in peer["COLUMNS"]]
    assert cells[:2] == ["jfa", "hopper_dkdv_kernel"]
    got = dict(zip(titles, cells[2:]))
    assert (got["ms"], got["DRAM rd GB"], got["smem KB"], got["issue %"], got["regs"]) == ("6.43", "1.75", "200",
                                                                                       "52.6", "-")
    assert dict(zip(titles, [c.strip() for c in rows[1].strip("|").split("|")][2:]))["ms"] == "0.08"
    assert any("issue_active" in line for line in extra)
    assert peer["table"]('"ID"\n""', "fa4")[0] == ["| fa4 | (no kernel profiled) |"]
