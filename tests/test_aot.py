"""Every portable Triton kernel compiles for sm_90 on this (GPU-less) machine: its matmuls are wgmma and, at
the head dims that are the fast paths' business (64, 128), ptxas reports what we measured when choosing the
tile configs (docs/perf-notes.md). Runs in a subprocess: the interpreter must be off for triton.compile."""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, sys, torch
from jfa.triton.aot import compile_kernel
rows = []
for name, d, dtype in json.loads(sys.argv[1]):
    r = compile_kernel(name, d, getattr(torch, dtype))
    rows.append(dict(kernel=name, d=d, dtype=dtype, wgmma=r.wgmma, regs=r.registers, spill=r.spill_bytes,
                     bulk=r.ptx.count("ld.global")))
print(json.dumps(rows))
"""

# Spill budget per kernel at the chosen configs (bytes, ptxas -v for sm_90a); 0 = must not spill.
SPILL_BUDGET = {("fwd", 64): 0, ("fwd_persistent", 64): 0, ("fwd_persistent", 128): 0, ("dkdv", 64): 0, ("dq", 64): 0, ("fwd", 128): 0, ("dkdv", 128): 1024,
                ("dq", 128): 64, ("preprocess", 64): 0, ("preprocess", 128): 0}


@pytest.fixture(scope="module")
def reports():
    jobs = [[name, d, "bfloat16"] for (name, d) in SPILL_BUDGET] + [["fwd", 128, "float16"], ["dq", 64, "float16"]]
    env = dict(os.environ, TRITON_INTERPRET="0")
    res = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(jobs)], capture_output=True, text=True,
                         env=env, timeout=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_matmuls_are_wgmma(reports):
    for r in reports:
        if r["kernel"] != "preprocess":
            assert r["wgmma"] > 0, f"{r}: no wgmma.mma_async in the PTX"


def test_register_spills_within_budget(reports):
    for r in reports:
        budget = SPILL_BUDGET.get((r["kernel"], r["d"]), 0)
        assert r["spill"] <= budget, f"{r}: {r['spill']} bytes of spills > budget {budget}"
        assert r["regs"] <= 255


# The dK/dV pass's spills (bytes, ptxas for sm_90a) where a variant that spills measured faster on the H200 than
# the spill-free ones (docs/perf-notes.md, session 5): the default two-pass (64-row blocks at D=128, serial) and
# the fused dQ. Every other Hopper kernel and variant below must not spill.
HOPPER_SPILL_BUDGET = {("two-pass", 128): 488, ("fused", 128): 1600}


@pytest.fixture(scope="module")
def hopper_reports():
    script = r"""
import json, torch
from jfa.hopper.aot import compile_dkdv, compile_dq, compile_fwd, producer_loop_bounds_are_per_item
rows = []
for d in (64, 128):
    for variant, r in ((None, compile_fwd(d, torch.bfloat16)),
                       ("prefetch", compile_fwd(d, torch.bfloat16, variant="prefetch")),
                       ("pairs", compile_fwd(d, torch.bfloat16, broadcast=True, variant="pairs")),
                       ("m32", compile_dkdv(d, torch.bfloat16, variant="m32")),
                       ("peel", compile_dkdv(d, torch.bfloat16, variant="peel")),
                       ("two-pass", compile_dkdv(d, torch.bfloat16, variant="two-pass")),
                       ("fused", compile_dkdv(d, torch.bfloat16, variant="fused")),
                       (None, compile_dq(d, torch.bfloat16, True))):
        rows.append(dict(kernel=r.kernel, variant=variant, d=d, wgmma=r.wgmma,
                         tma=r.ptx.count("cp.async.bulk.tensor"), regs=r.registers, spill=r.spill_bytes,
                         setmaxnreg=r.ptx.count("setmaxnreg"), atomics=r.ptx.count("atom.global"),
                         producer_ok=producer_loop_bounds_are_per_item(r.ttgir)))
print(json.dumps(rows))
"""
    env = dict(os.environ, TRITON_INTERPRET="0")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_hopper_kernels_are_warp_specialized_tma_and_wgmma_without_spills(hopper_reports):
    """The forward and the dK/dV and dQ passes, D 64 and 128; spills only where HOPPER_SPILL_BUDGET allows."""
    assert {r["kernel"] for r in hopper_reports} == {"hopper_fwd", "hopper_dkdv", "hopper_dq"}
    for r in hopper_reports:
        budget = HOPPER_SPILL_BUDGET.get((r["variant"], r["d"]), 0)
        assert r["wgmma"] > 0 and r["tma"] > 0 and r["spill"] <= budget and r["regs"] <= 255, r
        assert r["setmaxnreg"] > 0, f"{r}: no setmaxnreg, so no register hand-off between the partitions"
        assert r["producer_ok"], f"{r}: the TMA producer's K/V loop bounds are not recomputed per item"
        # atomics only in the fused dQ: every other backward path is deterministic
        assert (r["atomics"] > 0) == (r["variant"] == "fused"), r


def test_tile_table_kernel_compiles_for_sm90():
    """The schedules' one-kernel bookkeeping (run by the interpreter in tests/test_schedule.py) also builds for
    the GPU: the interpreter accepts code that the compiler rejects."""
    script = r"""
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from jfa.triton.kernels import tile_table_kernel as fn
consts = dict(BLOCK_M=128, BLOCK_N=128, SEARCH_STEPS=10, BLOCK=256)
for offsets in ("*i32", "*i64"):
    sig = {a: "constexpr" if a in consts else offsets if a.endswith("offsets") else "*i32"
           if a in ("tile_ends", "tiles", "costs") else "i32" for a in fn.arg_names}
    ptx = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    print(offsets, ptx.count("st.global"))
"""
    env = dict(os.environ, TRITON_INTERPRET="0")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    stores = [int(line.split()[1]) for line in res.stdout.strip().splitlines()[-2:]]
    assert len(stores) == 2 and all(n > 0 for n in stores), res.stdout
