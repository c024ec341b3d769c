"""Compile the Gluon Hopper kernels for sm_90 on any machine (no GPU): PTX, wgmma/TMA counts, ptxas report.

    TRITON_INTERPRET=0 python -m jfa.hopper.aot
"""
import re

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

from ..triton.aot import Report, _ptxas_report
from . import bwd, bwd_dq, fwd

_TL = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def compile_fwd(head_dim: int, dtype: torch.dtype, broadcast=False, variant=None) -> Report:
    cfg = fwd.config(head_dim, variant)
    q = torch.empty(128, 2, head_dim, dtype=dtype)  # host descriptors only read shapes and strides here
    descs = dict(zip(("q_desc", "k_desc", "v_desc"), fwd.descriptors(q, q, q, cfg.block_n)))
    kernel = fwd.hopper_fwd_ws_kernel
    constexprs = dict(GROUP=1, HEAD_DIM=head_dim, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CONSUMERS=cfg.consumers,
                      PINGPONG=cfg.pingpong, BROADCAST=broadcast, num_warps=4)
    types = {"O": f"*{_TL[dtype]}", "LSE": "*fp32", "qk_scale": "fp32"}
    types.update({name: "*i32" for name in ("q_offsets", "kv_offsets", "tiles", "order", "sm_start")})
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in descs:
            sig[name] = mangle_type(descs[name])
        else:
            sig[name] = types.get(name, "i32")
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=constexprs)
    options = dict(num_warps=4, **cfg.launch_options())
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    regs, spills = _ptxas_report(ptx)
    return Report("hopper_fwd", head_dim, _TL[dtype], len(re.findall(r"wgmma\.mma_async", ptx)), regs, spills, ptx)


def compile_dkdv(head_dim: int, dtype: torch.dtype, broadcast=False) -> Report:
    """The DRAFT dK/dV kernel (jfa.hopper.bwd)."""
    x = torch.empty(128, 2, head_dim, dtype=dtype)
    block_m = bwd.BLOCK_M[head_dim]
    descs = dict(zip(("q_desc", "do_desc", "k_desc", "v_desc"), bwd.descriptors(x, x, x, x, block_m)))
    kernel = bwd.hopper_dkdv_kernel
    constexprs = dict(GROUP=1, HEAD_DIM=head_dim, BLOCK_M=block_m, STAGES=bwd.STAGES, BROADCAST=broadcast,
                      num_warps=4)
    types = {"DK": f"*{_TL[dtype]}", "DV": f"*{_TL[dtype]}", "LSE": "*fp32", "DELTA": "*fp32", "scale": "fp32",
             "qk_scale": "fp32"}
    types.update({name: "*i32" for name in ("q_offsets", "kv_offsets", "tiles", "order", "sm_start")})
    sig = {name: "constexpr" if name in constexprs else mangle_type(descs[name]) if name in descs
           else types.get(name, "i32") for name in kernel.arg_names}
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=constexprs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"]
    regs, spills = _ptxas_report(ptx)
    return Report("hopper_dkdv", head_dim, _TL[dtype], len(re.findall(r"wgmma\.mma_async", ptx)), regs, spills,
                  ptx)


def compile_dq(head_dim: int, dtype: torch.dtype, broadcast=False) -> Report:
    """The DRAFT dQ kernel (jfa.hopper.bwd_dq)."""
    x = torch.empty(128, 2, head_dim, dtype=dtype)
    block_n = bwd_dq.BLOCK_N[head_dim]
    descs = dict(zip(("q_desc", "do_desc", "k_desc", "v_desc"), bwd_dq.descriptors(x, x, x, x, block_n)))
    kernel = bwd_dq.hopper_dq_kernel
    constexprs = dict(GROUP=1, HEAD_DIM=head_dim, BLOCK_N=block_n, STAGES=bwd_dq.STAGES, BROADCAST=broadcast,
                      num_warps=4)
    types = {"DQ": "*fp32" if broadcast else f"*{_TL[dtype]}", "LSE": "*fp32", "DELTA": "*fp32", "scale": "fp32",
             "qk_scale": "fp32"}
    types.update({name: "*i32" for name in ("q_offsets", "kv_offsets", "tiles", "order", "sm_start")})
    sig = {name: "constexpr" if name in constexprs else mangle_type(descs[name]) if name in descs
           else types.get(name, "i32") for name in kernel.arg_names}
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=constexprs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"]
    regs, spills = _ptxas_report(ptx)
    return Report("hopper_dq", head_dim, _TL[dtype], len(re.findall(r"wgmma\.mma_async", ptx)), regs, spills, ptx)


if __name__ == "__main__":
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128):
            r = compile_fwd(d, dtype)
            tma = r.ptx.count("cp.async.bulk.tensor")
            nreg = sorted(set(re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", r.ptx)), key=int)
            print(f"hopper_fwd D={d} {r.dtype} ({fwd.config(d)}): wgmma {r.wgmma}, TMA {tma}, setmaxnreg {nreg}, "
                  f"launch regs {r.registers}, spill {r.spill_bytes} B")
            for r in (compile_dkdv(d, dtype), compile_dq(d, dtype), compile_dq(d, dtype, broadcast=True)):
                print(f"{r.kernel} (DRAFT) D={d} {r.dtype}: wgmma {r.wgmma}, "
                      f"TMA {r.ptx.count('cp.async.bulk.tensor')}, launch regs {r.registers}, spill {r.spill_bytes} B")
