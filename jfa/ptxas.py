"""ptxas's resource report of a compiled kernel (registers, spills), read on any machine: the ptxas in Triton's
wheel assembles the PTX for sm_90a. Both AOT modules (jfa.triton.aot, jfa.hopper.aot) report through it."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch
import triton

from .problem import Problem


@dataclass
class Report:
    kernel: str
    head_dim: int
    dtype: str
    wgmma: int  # wgmma.mma_async instructions in the PTX
    registers: int
    spill_bytes: int  # spill stores + loads reported by ptxas
    ptx: str
    # warpgroup waits ptxas adds where a register an MMA in flight defines is touched (its note C7517/C7510): each
    # serializes that MMA with what follows, so that MMAs meant to overlap do not
    injected_waits: int = 0


def _tool(name: str) -> str:
    """A CUDA tool Triton's wheel ships (ptxas, nvdisasm, cuobjdump)."""
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def sass(ptx: str) -> str:
    """The SASS of a PTX module assembled for sm_90a (ptxas, then nvdisasm), to read or count instructions in."""
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx_path, "w") as f:
            f.write(ptx)
        subprocess.run([_tool("ptxas"), "--gpu-name=sm_90a", ptx_path, "-o", cubin], check=True)
        return subprocess.run([_tool("nvdisasm"), "-c", cubin], check=True, capture_output=True, text=True).stdout


def ptxas_report(ptx: str) -> tuple[int, int, int]:
    """(registers, spill bytes, injected warpgroup waits) of a PTX module, from ptxas -v for sm_90a."""
    ptxas = _tool("ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        res = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True)
    finally:
        os.unlink(f.name)
    log = res.stderr + res.stdout
    regs = max(int(x) for x in re.findall(r"Used (\d+) registers", log))
    spills = sum(int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log))
    waits = re.findall(r"warpgroup\.wait is injected|wgmma\.mma_async instructions are serialized", log)
    return regs, spills, len(waits)


def report(name: str, head_dim: int, dtype: str, ptx: str) -> Report:
    regs, spills, waits = ptxas_report(ptx)
    return Report(name, head_dim, dtype, len(re.findall(r"wgmma\.mma_async", ptx)), regs, spills, ptx, waits)


_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
          torch.int64: "i64"}


def aot_signature(fn, args: tuple, constexprs: dict):
    """(signature, constexprs) for triton.compile of kernel fn called with these run-time arguments (its launcher's,
    on meta tensors) and constexprs, unspecialized as a launch would see values it cannot specialize: a tensor is a
    pointer of its dtype, an int i32, a float fp32, None a constexpr (keyed by its path in a tuple), a tuple a
    tuple of those, a tl.constexpr a constexpr; anything else (a TMA descriptor) by triton's own mangling."""
    import triton.language as tl
    from triton.runtime.jit import mangle_type
    nones = {}

    def kind(x, path):
        if isinstance(x, tuple):
            return tuple(kind(y, path + (i, )) for i, y in enumerate(x))
        if x is None or isinstance(x, tl.constexpr):
            nones[path] = x
            return "constexpr"
        if isinstance(x, torch.Tensor):
            return "*" + _TYPES[x.dtype]
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return mangle_type(x)
        return "i32" if isinstance(x, int) else "fp32"
    names = [n for n in fn.arg_names if n not in constexprs]
    sig = {n: kind(a, (fn.arg_names.index(n), )) for n, a in zip(names, args)}
    sig.update({n: "constexpr" for n in constexprs})
    return {n: sig[n] for n in fn.arg_names}, {**constexprs, **nones}


def meta_problem(head_dim: int, dtype: torch.dtype, broadcast: bool = False, group: int = 1, targets: bool = False,
                 serving: bool = False, paged: bool = False, bias: bool = False, **fields) -> Problem:
    """A Problem of meta tensors with these shapes: what a kernel's compile-time arguments are read from when it is
    compiled ahead of time (no data, no GPU); targets: with HSTU's mask; serving: in cross-attention (each
    sequence's last rows as queries); paged: k and v in pages of 128 rows (serving a cache); bias: a relative bias,
    both tables per head (jfa.bias)."""
    def meta(heads):
        return torch.empty(128, heads, head_dim, dtype=dtype, device="meta")
    offsets = torch.empty(3, dtype=torch.int32, device="meta")
    kv_offsets = torch.empty(3, dtype=torch.int32, device="meta") if serving or paged else offsets
    if paged:
        fields.update(page_table=torch.empty(2, 4, dtype=torch.int32, device="meta"), page_size=128)
    if targets:
        fields.update(num_targets=torch.empty(2, dtype=torch.int32, device="meta"))
    if bias:
        times = torch.empty(128, dtype=torch.int64, device="meta")
        fields.update(bias_position=torch.empty(group, 47, device="meta"), bias_time=torch.empty(group, 11,
                      device="meta"), q_times=times, k_times=times)
    right = 0 if targets else 1 << 30  # (HSTU's mask is causal)
    return Problem(meta(group), meta(1), meta(1), offsets, kv_offsets, 1.0, 1 << 30, right, broadcast, **fields)
