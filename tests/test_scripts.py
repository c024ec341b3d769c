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
