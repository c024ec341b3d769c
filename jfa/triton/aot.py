"""Ahead-of-time compile of the portable kernels for sm_90 on any machine (no GPU needed), to read the PTX
and ptxas's resource report: are the matmuls wgmma, how many registers, any spills.

    TRITON_INTERPRET=0 python -m jfa.triton.aot      # table of every kernel x head dim x dtype

Needs triton in compiled mode (TRITON_INTERPRET=0 before importing jfa on a machine with no GPU).
"""
from __future__ import annotations

import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ..bwd_common import attention_bwd_preprocess_kernel, block_d
from ..ptxas import Report, meta_problem, report
from . import kernels
from .launch import constexprs, select_config

_TL = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_DEVICE = torch.device("cuda")  # configs for the GPU; nothing is allocated


def _signature(fn, types: dict, constexprs: dict):
    return {name: ("constexpr" if name in constexprs else types.get(name, "i32")) for name in fn.arg_names}


def compile_kernel(name: str, head_dim: int, dtype: torch.dtype, broadcast: bool = False,
                   activation: str = "softmax") -> Report:
    """Compile one kernel for sm_90 with the config the launcher would pick."""
    t, cfgs = _TL[dtype], select_config(_DEVICE, head_dim, dtype)
    ptr = {"q_offsets": "*i32", "kv_offsets": "*i32", "tiles": "*i32", "LSE": "*fp32", "DELTA": "*fp32",
           "DLSE": "*fp32", "qk_scale": "fp32", "scale": "fp32", "out_scale": "fp32", "NUM_TARGETS": "*i32"}
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
        fn, cfg = attention_bwd_preprocess_kernel, None
    else:
        raise ValueError(name)
    if cfg is None:
        consts, options = dict(D=head_dim, BLOCK_D=block_d(head_dim), BLOCK_T=64, HAS_DLSE=True), {}
    else:
        consts = constexprs(cfg, meta_problem(head_dim, dtype, broadcast, activation=activation))
        options = dict(num_warps=consts.pop("num_warps"), num_stages=consts.pop("num_stages"))
    src = ASTSource(fn=fn, signature=_signature(fn, ptr, consts), constexprs=consts)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(dict(num_warps=4, num_stages=2),
                                                                               **options))
    return report(name, head_dim, t, compiled.asm["ptx"])


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
