"""Ahead-of-time compile of the portable kernels for sm_90 on any machine (no GPU needed), to read the PTX
and ptxas's resource report: are the matmuls wgmma, how many registers, any spills.

    TRITON_INTERPRET=0 python -m jfa.triton.aot      # table of every kernel x head dim x dtype

Needs triton in compiled mode (TRITON_INTERPRET=0 before importing jfa on a machine with no GPU).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import kernels
from .launch import dot_mode, select_config

_TL = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_DEVICE = torch.device("cuda")  # configs for the GPU; nothing is allocated


@dataclass
class Report:
    kernel: str
    head_dim: int
    dtype: str
    wgmma: int  # wgmma.mma_async instructions in the PTX
    registers: int
    spill_bytes: int  # spill stores + loads reported by ptxas
    ptx: str


def ptxas_report(ptx: str) -> tuple[int, int]:
    """(registers, spill bytes) of a PTX module, from ptxas -v for sm_90a (the ptxas in Triton's wheel)."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
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
    return regs, spills


def _signature(fn, types: dict, constexprs: dict):
    return {name: ("constexpr" if name in constexprs else types.get(name, "i32")) for name in fn.arg_names}


def compile_kernel(name: str, head_dim: int, dtype: torch.dtype, broadcast: bool = False) -> Report:
    """Compile one kernel for sm_90 with the config the launcher would pick."""
    t, cfgs = _TL[dtype], select_config(_DEVICE, head_dim, dtype)
    common = dict(GROUP=1, D=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), DOT=dot_mode(dtype),
                  BROADCAST=broadcast)
    ptr = {"q_offsets": "*i32", "kv_offsets": "*i32", "tiles": "*i32", "LSE": "*fp32", "DELTA": "*fp32",
           "DLSE": "*fp32", "qk_scale": "fp32", "scale": "fp32"}
    for x in ("Q", "K", "V", "O", "DO", "DK", "DV"):
        ptr[x] = f"*{t}"
    if name == "fwd":
        fn, cfg = kernels.attention_fwd_kernel, cfgs.fwd
    elif name == "dkdv":
        fn, cfg = kernels.attention_bwd_dkdv_kernel, cfgs.dkdv
    elif name == "dq":
        fn, cfg = kernels.attention_bwd_dq_kernel, cfgs.dq
        ptr["DQ"] = "*fp32" if broadcast else f"*{t}"
    elif name == "preprocess":
        fn, cfg = kernels.attention_bwd_preprocess_kernel, None
        common = dict(D=head_dim, BLOCK_D=common["BLOCK_D"], BLOCK_T=64, HAS_DLSE=True)
    else:
        raise ValueError(name)
    constexprs = dict(common)
    if cfg is not None:
        constexprs.update(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
    options = dict(num_warps=cfg.num_warps if cfg else 4, num_stages=cfg.num_stages if cfg else 2)
    src = ASTSource(fn=fn, signature=_signature(fn, ptr, constexprs), constexprs=constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = compiled.asm["ptx"]
    regs, spills = ptxas_report(ptx)
    return Report(name, head_dim, t, len(re.findall(r"wgmma\.mma_async", ptx)), regs, spills, ptx)


KERNELS = ("fwd", "dkdv", "dq", "preprocess")


def main() -> int:
    print(f"{'kernel':<11}{'D':>5}{'dtype':>6}{'wgmma':>7}{'regs':>6}{'spill B':>9}")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for d in (64, 128, 256) if dtype != torch.float32 else (64,):
            for name in KERNELS:
                r = compile_kernel(name, d, dtype)
                print(f"{r.kernel:<11}{r.head_dim:>5}{r.dtype:>6}{r.wgmma:>7}{r.registers:>6}{r.spill_bytes:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
