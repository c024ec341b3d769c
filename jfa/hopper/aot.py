"""Compile the Gluon Hopper kernels for sm_90 on any machine (no GPU): PTX, wgmma/TMA counts, ptxas report.

    TRITON_INTERPRET=0 python -m jfa.hopper.aot
"""
import re

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

from ..triton.aot import Report, ptxas_report
from . import bwd, bwd_dq, fwd
from .config import DQ_DIRECT, DQ_NONE, DQ_REDUCE, select_dkdv, select_dq, select_fwd

_TL = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_SCHEDULE = ("q_offsets", "kv_offsets", "tiles", "order", "sm_start")


def _compile(name, kernel, descs, constexprs, types, head_dim, dtype, **options) -> Report:
    """Compile `kernel` with descriptor args `descs`, `constexprs`, pointer/float `types` (others: i32).
    The Report's ptx field holds the PTX; its .ttgir attribute the TTGIR (for IR-level checks)."""
    types = dict(types, **{arg: "*i32" for arg in _SCHEDULE})
    sig = {arg: "constexpr" if arg in constexprs else mangle_type(descs[arg]) if arg in descs
           else types.get(arg, "i32") for arg in kernel.arg_names}
    # as a launch specializes them: pointers 16-byte aligned, q/k/v/o-shaped row and head strides multiples of 16
    # elements (not LSE's head stride, which is the row count)
    aligned = [i for i, arg in enumerate(kernel.arg_names)
               if sig[arg].startswith("*") or (arg.startswith("stride_") and arg != "stride_lh")]
    attrs = {(i, ): [["tt.divisibility", 16]] for i in aligned}
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, **options))
    asm = compiled.asm
    regs, spills = ptxas_report(asm["ptx"])
    report = Report(name, head_dim, _TL[dtype], len(re.findall(r"wgmma\.mma_async", asm["ptx"])), regs, spills,
                    asm["ptx"])
    report.ttgir = asm["ttgir"]
    report.shared = compiled.metadata.shared
    return report


def producer_loop_bounds_are_per_item(ttgir: str) -> bool:
    """In the 1-warp TMA producer partition, are the bounds of the K/V loop computed inside the loop over
    items? triton 3.6 once hoisted them to the first item's values (a prefetched form, docs/hopper.md), which
    deadlocks the kernel; this checks the compiled IR for that."""
    text = re.sub(r" loc\([^)]*\)", "", ttgir)
    start = text.index("num_warps(1)")
    body = text[start:]
    loops = list(re.finditer(r"scf\.for %\S+ = (%[\w#]+) to (%[\w#]+) step", body))
    if len(loops) < 2:
        raise ValueError("producer loops not found in the TTGIR")
    item_loop, kv_loop = loops[0], loops[1]  # the producer's two loops: over its items, over an item's blocks
    for bound in kv_loop.groups():
        define = re.search(re.escape(bound) + r" = ", body)
        if define is None or not item_loop.start() < define.start() < kv_loop.start():
            return False
    return True


def _host_tensor(head_dim, dtype):
    return torch.empty(128, 2, head_dim, dtype=dtype)  # host descriptors only read shapes and strides here


def compile_fwd(head_dim: int, dtype: torch.dtype, broadcast=False, mean_kv_len=float("inf")) -> Report:
    """The forward (jfa.hopper.fwd) as configured for batches of this mean key length."""
    cfg = select_fwd(head_dim, mean_kv_len)
    x = _host_tensor(head_dim, dtype)
    descs = dict(zip(("q_desc", "k_desc", "v_desc"), fwd.descriptors(x, x, x, cfg)))
    constexprs = dict(GROUP=1, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CONSUMERS=cfg.consumers,
                      BROADCAST=broadcast, COALESCED=cfg.coalesced_store, POSTED=cfg.posted_items, num_warps=4)
    types = {"O": f"*{_TL[dtype]}", "LSE": "*fp32", "qk_scale": "fp32"}
    return _compile("hopper_fwd", fwd.hopper_fwd_kernel, descs, constexprs, types, head_dim, dtype,
                    **cfg.launch_options())


def compile_dkdv(head_dim: int, dtype: torch.dtype, broadcast=False, route=DQ_NONE,
                 mean_q_len=float("inf")) -> Report:
    """The dK/dV kernel (jfa.hopper.bwd) with dQ by `route` (jfa.hopper.config), as configured for batches of this
    many query rows per sequence: reported as hopper_dkdv (none), hopper_bwd (the one pass, DQ_REDUCE) or
    hopper_dkdv_dq (DQ_DIRECT)."""
    cfg = select_dkdv(head_dim, route, mean_q_len)
    x = _host_tensor(head_dim, dtype)
    dq = _host_tensor(head_dim, torch.float32)
    names = ("q_desc", "do_desc", "k_desc", "v_desc", "dq_desc")
    descs = dict(zip(names, bwd.descriptors(x, x, x, x, cfg, dq)))
    constexprs = dict(GROUP=1, BLOCK_M=cfg.block_m, STAGES=cfg.stages, DQ_STAGES=cfg.dq_stages, SERIAL=cfg.serial,
                      BROADCAST=broadcast, ONE_PASS=cfg.one_pass,
                      DIRECT=route == DQ_DIRECT, KV_SLOTS=cfg.kv_slots, POSTED=cfg.posted_items, num_warps=4)
    types = {"DK": f"*{_TL[dtype]}", "DV": f"*{_TL[dtype]}", "DQ": f"*{_TL[dtype]}", "LSE": "*fp32",
             "DELTA": "*fp32", "scale": "fp32", "qk_scale": "fp32"}
    name = {DQ_NONE: "hopper_dkdv", DQ_REDUCE: "hopper_bwd", DQ_DIRECT: "hopper_dkdv_dq"}[route]
    return _compile(name, bwd.hopper_dkdv_kernel, descs, constexprs, types, head_dim, dtype)


def compile_dq(head_dim: int, dtype: torch.dtype, broadcast=False, skip_kv=0) -> Report:
    """The dQ kernel (jfa.hopper.bwd_dq); broadcast writes float32 partials; skip_kv > 0: it skips the sequences
    of at most that many keys (jfa.hopper.config.DQ_DIRECT)."""
    cfg = select_dq(head_dim)
    x = _host_tensor(head_dim, dtype)
    descs = dict(zip(("q_desc", "do_desc", "k_desc", "v_desc"), bwd_dq.descriptors(x, x, x, x, cfg)))
    constexprs = dict(GROUP=1, BLOCK_N=cfg.block_n, STAGES=cfg.stages, BROADCAST=broadcast, SKIP_KV=skip_kv,
                      num_warps=4)
    types = {"DQ": "*fp32" if broadcast else f"*{_TL[dtype]}", "LSE": "*fp32", "DELTA": "*fp32", "scale": "fp32",
             "qk_scale": "fp32"}
    return _compile("hopper_dq", bwd_dq.hopper_dq_kernel, descs, constexprs, types, head_dim, dtype)


if __name__ == "__main__":
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128):
            for r in (compile_fwd(d, dtype), compile_dkdv(d, dtype), compile_dq(d, dtype, broadcast=True)):
                nreg = sorted(set(re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", r.ptx)), key=int)
                print(f"{r.kernel} D={d} {r.dtype}: wgmma {r.wgmma}, TMA {r.ptx.count('cp.async.bulk.tensor')}, "
                      f"setmaxnreg {nreg}, launch regs {r.registers}, spill {r.spill_bytes} B")
