"""Compile the Gluon Hopper kernels for sm_90 on any machine (no GPU): PTX, wgmma/TMA counts, ptxas report.

    TRITON_INTERPRET=0 python -m jfa.hopper.aot
"""
import re

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

from ..ptxas import Report, meta_problem, report
from . import bwd, bwd_dq, fwd
from .config import DkdvConfig, DqConfig, DqRoute, FwdConfig, select_dkdv, select_dq, select_fwd

_TL = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_SCHEDULE = ("q_offsets", "kv_offsets", "tiles", "order", "sm_start", "num_targets")


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
    result = report(name, head_dim, _TL[dtype], compiled.asm["ptx"])
    result.ttgir = compiled.asm["ttgir"]
    result.shared = compiled.metadata.shared
    return result


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


def compile_fwd(head_dim: int, dtype: torch.dtype, broadcast=False, cfg: FwdConfig | None = None,
                activation="softmax", targets=False) -> Report:
    """The forward (jfa.hopper.fwd) in config cfg (select_fwd's for an unbounded mean key length by default);
    targets: with HSTU's mask."""
    cfg = cfg or select_fwd(head_dim)
    x = _host_tensor(head_dim, dtype)
    descs = dict(zip(("q_desc", "k_desc", "v_desc"), fwd.descriptors(x, x, x, cfg)))
    constexprs = fwd.constexprs(cfg, meta_problem(head_dim, dtype, broadcast, activation=activation, targets=targets))
    types = {"O": f"*{_TL[dtype]}", "LSE": "*fp32", "qk_scale": "fp32", "out_scale": "fp32"}
    return _compile("hopper_fwd", fwd.hopper_fwd_kernel, descs, constexprs, types, head_dim, dtype,
                    **cfg.launch_options())


def compile_dkdv(head_dim: int, dtype: torch.dtype, broadcast=False, cfg: DkdvConfig | None = None,
                 activation="softmax", targets=False) -> Report:
    """The dK/dV kernel (jfa.hopper.bwd) in config cfg (select_dkdv's without dQ by default), reported as
    hopper_dkdv (no dQ), hopper_bwd (the one pass, DqRoute.REDUCE) or hopper_dkdv_dq (DqRoute.DIRECT)."""
    cfg = cfg or select_dkdv(head_dim)
    x = _host_tensor(head_dim, dtype)
    dq = _host_tensor(head_dim, torch.float32)
    names = ("q_desc", "do_desc", "k_desc", "v_desc", "dq_desc")
    descs = dict(zip(names, bwd.descriptors(x, x, x, x, cfg, dq)))
    constexprs = bwd.constexprs(cfg, meta_problem(head_dim, dtype, broadcast, activation=activation, targets=targets))
    types = {"DK": f"*{_TL[dtype]}", "DV": f"*{_TL[dtype]}", "DQ": f"*{_TL[dtype]}", "LSE": "*fp32",
             "DELTA": "*fp32", "scale": "fp32", "qk_scale": "fp32"}
    name = {DqRoute.NONE: "hopper_dkdv", DqRoute.REDUCE: "hopper_bwd", DqRoute.DIRECT: "hopper_dkdv_dq"}[cfg.dq]
    return _compile(name, bwd.hopper_dkdv_kernel, descs, constexprs, types, head_dim, dtype)


def compile_dq(head_dim: int, dtype: torch.dtype, broadcast=False, skip_kv=0, cfg: DqConfig | None = None,
               activation="softmax", targets=False) -> Report:
    """The dQ kernel (jfa.hopper.bwd_dq); broadcast writes float32 partials; skip_kv > 0: it skips the sequences
    of at most that many keys (DqRoute.DIRECT)."""
    cfg = cfg or select_dq(head_dim)
    x = _host_tensor(head_dim, dtype)
    descs = dict(zip(("q_desc", "do_desc", "k_desc", "v_desc"), bwd_dq.descriptors(x, x, x, x, cfg)))
    constexprs = bwd_dq.constexprs(cfg, meta_problem(head_dim, dtype, broadcast, activation=activation,
                                                     targets=targets), skip_kv)
    types = {"DQ": "*fp32" if broadcast else f"*{_TL[dtype]}", "LSE": "*fp32", "DELTA": "*fp32", "scale": "fp32",
             "qk_scale": "fp32"}
    return _compile("hopper_dq", bwd_dq.hopper_dq_kernel, descs, constexprs, types, head_dim, dtype)


def default_forms():
    """name -> a thunk compiling it: every form the select_* functions choose, D 64/128, bf16 (and fp16 for the
    long forms), self and broadcast: what a change must compile to the same PTX as before, or be timed."""
    forms = {}
    for dtype, t in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        for d in (64, 128):
            for b in (False, True):
                tag = f"{t}-d{d}-b{int(b)}"
                for mean, name in ((float("inf"), "long"), (300, "short"), (64, "tile")):
                    if t == "bf16" or name == "long":
                        forms[f"hfwd-{tag}-{name}"] = (compile_fwd, d, dtype, b, select_fwd(d, mean))
                routes = [(DqRoute.NONE, float("inf"), "none"), (DqRoute.REDUCE, float("inf"), "reduce")]
                if d == 128:
                    routes.append((DqRoute.REDUCE, 32, "reduce-shortq"))
                if not b:  # (broadcast q's dQ is summed over the batch: never complete in one item)
                    routes.append((DqRoute.DIRECT, float("inf"), "direct"))
                for route, mean_q, name in routes:
                    if t == "bf16" or name == "reduce":
                        forms[f"hdkdv-{tag}-{name}"] = (compile_dkdv, d, dtype, b, select_dkdv(d, route, mean_q))
                for skip in ((0, 128) if not b else (0, )):
                    if t == "bf16" or not skip:
                        forms[f"hdq-{tag}-skip{skip}"] = (compile_dq, d, dtype, b, skip)
    return {name: (lambda f=f: f[0](*f[1:])) for name, f in forms.items()}


if __name__ == "__main__":
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128):
            for r in (compile_fwd(d, dtype), compile_dkdv(d, dtype), compile_dq(d, dtype, broadcast=True)):
                nreg = sorted(set(re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", r.ptx)), key=int)
                print(f"{r.kernel} D={d} {r.dtype}: wgmma {r.wgmma}, TMA {r.ptx.count('cp.async.bulk.tensor')}, "
                      f"setmaxnreg {nreg}, launch regs {r.registers}, spill {r.spill_bytes} B")
