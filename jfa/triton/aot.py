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

from ..bias import grad_buffers
from ..bwd_common import attention_bwd_preprocess_kernel, block_d
from ..ptxas import Report, aot_signature, meta_problem, report
from . import kernels, launch
from .launch import select_config

_TL = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_DEVICE = torch.device("cuda")  # configs for the GPU; nothing is allocated


def compile_kernel(name: str, head_dim: int, dtype: torch.dtype, broadcast: bool = False,
                   activation: str = "softmax", targets: bool = False, bias: bool = False) -> Report:
    """Compile one kernel for sm_90 with the config the launcher would pick, its arguments the launcher's own on a
    meta problem (jfa.ptxas.meta_problem; targets: with HSTU's mask; bias: with a relative bias)."""
    t, cfgs = _TL[dtype], select_config(_DEVICE, head_dim, dtype)
    if name == "preprocess":
        fn, cfg = attention_bwd_preprocess_kernel, None
        sig = {a: "*fp32" if a in ("DLSE", "DELTA") else f"*{t}" if a in ("O", "DO") else "i32" for a in fn.arg_names}
        consts, options = dict(D=head_dim, BLOCK_D=block_d(head_dim), BLOCK_T=64, HAS_DLSE=True), {}
        sig.update({a: "constexpr" for a in consts})
    else:
        p = meta_problem(head_dim, dtype, broadcast, activation=activation, targets=targets, bias=bias)
        x = p.q.new_empty(p.q.shape)
        rows = p.q.new_empty(p.heads, p.rows, dtype=torch.float32)
        tiles = p.q_offsets.new_empty(2, 4)
        if name == "fwd":
            fn, cfg, args = kernels.attention_fwd_kernel, cfgs.fwd, launch.fwd_args(p, x, rows, tiles)
        elif name == "dkdv":
            fn, cfg = kernels.attention_bwd_dkdv_kernel, cfgs.dkdv
            args = launch.bwd_args(p, x, rows, rows, (x, x), tiles)
        elif name == "dq":
            fn, cfg = kernels.attention_bwd_dq_kernel, cfgs.dq
            dq = x.float() if broadcast else x
            tables = grad_buffers(p.bias, p.q.device) if bias else None
            args = launch.bwd_args(p, x, rows, rows, (dq, ), tiles, tables)
        else:
            raise ValueError(name)
        consts = launch.constexprs(cfg, p)
        options = dict(num_warps=consts.pop("num_warps"), num_stages=consts.pop("num_stages"))
        sig, consts = aot_signature(fn, args, consts)
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
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
