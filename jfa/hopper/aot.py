"""Compile the Gluon Hopper kernels for sm_90 on any machine (no GPU): PTX, wgmma/TMA counts, ptxas report.

    TRITON_INTERPRET=0 python -m jfa.hopper.aot
"""
import re

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource

from ..ptxas import Report, aot_signature, meta_problem, report
from ..schedule import ScheduleSpec, allocate
from . import bwd, bwd_dq, fwd
from .config import DkdvConfig, DqConfig, DqRoute, FwdConfig, for_problem, select_dkdv, select_dq, select_fwd

_TL = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def _compile(name, kernel, args, constexprs, head_dim, dtype, **options) -> Report:
    """Compile `kernel` with its launcher's run-time arguments `args` (descriptors over host tensors, the rest on
    meta tensors: jfa.ptxas.aot_signature) and `constexprs`. The Report's ptx field holds the PTX; its .ttgir
    attribute the TTGIR (for IR-level checks)."""
    sig, constexprs = aot_signature(kernel, args, constexprs)
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=_aligned(args))
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, **options))
    result = report(name, head_dim, _TL[dtype], compiled.asm["ptx"])
    result.ttgir = compiled.asm["ttgir"]
    result.shared = compiled.metadata.shared
    return result


def _aligned(args) -> dict:
    """The divisibility a launch specializes on: every pointer 16-byte aligned, and the row and head strides of
    [rows, heads, D] tensors multiples of 16 elements (not LSE's head stride, which is the row count)."""
    attrs = {}

    def walk(x, path, strides):
        if isinstance(x, tuple):
            rows = len(x) == 3 and isinstance(x[0], torch.Tensor) and x[0].dim() == 3
            for i, y in enumerate(x):
                walk(y, path + (i, ), rows)
        elif isinstance(x, torch.Tensor) or (strides and isinstance(x, int)):
            attrs[path] = [["tt.divisibility", 16]]
    for i, x in enumerate(args):
        walk(x, (i, ), False)
    return attrs


def producer_loop_bounds_are_per_item(ttgir: str) -> bool:
    """In the 1-warp TMA producer partition, are the bounds of the K/V loop computed inside the loop over
    items? triton 3.6 once hoisted them to the first item's values (a prefetched form, docs/hopper.md), which
    deadlocks the kernel; this checks the compiled IR for that."""
    text = re.sub(r" loc\([^)]*\)", "", ttgir)
    start = text.index("num_warps(1)")
    body = text[start:]
    # the producer's two loops: over its items (an scf.for over its dealt slots, or a work queue's scf.while), then
    # over an item's blocks
    item_loop = re.search(r"scf\.(for|while) ", body)
    kv_loop = item_loop and re.compile(r"scf\.for %\S+ = (%[\w#]+) to (%[\w#]+) step").search(body, item_loop.end())
    if kv_loop is None:
        raise ValueError("producer loops not found in the TTGIR")
    for bound in kv_loop.groups():
        define = re.search(re.escape(bound) + r" = ", body)
        if define is None or not item_loop.start() < define.start() < kv_loop.start():
            return False
    return True


def _host_tensor(head_dim, dtype):
    return torch.empty(128, 2, head_dim, dtype=dtype)  # host descriptors only read shapes and strides here


def _outputs(p):
    """Meta tensors for what the kernels write and read besides the problem: O-shaped rows, and per-head rows
    (LSE, Delta) of a count that is no multiple of 16, as a launch's in general."""
    return p.q.new_empty(p.rows, p.heads, p.head_dim), p.q.new_empty(p.heads, p.rows + 1, dtype=torch.float32)


def _schedule(p):
    return allocate(ScheduleSpec(128, p.heads, 128, 128, 1), p.batch, 128, "meta")


def compile_fwd(head_dim: int, dtype: torch.dtype, broadcast=False, cfg: FwdConfig | None = None, **fields) -> Report:
    """The forward (jfa.hopper.fwd) in config cfg (select_fwd's for an unbounded mean key length by default), on a
    problem of these shapes and Problem fields (jfa.ptxas.meta_problem: activation=..., targets=True, ...)."""
    p = meta_problem(head_dim, dtype, broadcast, **fields)
    cfg = for_problem(cfg or select_fwd(head_dim), p)  # (as the problem runs it)
    x = _host_tensor(head_dim, dtype)
    out, lse = _outputs(p)
    args = fwd.kernel_args(p, fwd.descriptors(x, x, x, cfg), out, lse, _schedule(p))
    return _compile("hopper_fwd", fwd.hopper_fwd_kernel, args, fwd.constexprs(cfg, p), head_dim, dtype,
                    **cfg.launch_options())


def compile_dkdv(head_dim: int, dtype: torch.dtype, broadcast=False, cfg: DkdvConfig | None = None,
                 **fields) -> Report:
    """The dK/dV kernel (jfa.hopper.bwd) in config cfg (select_dkdv's without dQ by default), reported as
    hopper_dkdv (no dQ), hopper_bwd (the one pass, DqRoute.REDUCE) or hopper_dkdv_dq (DqRoute.DIRECT)."""
    p = meta_problem(head_dim, dtype, broadcast, **fields)
    cfg = for_problem(cfg or select_dkdv(head_dim), p)  # (as the problem runs it)
    x = _host_tensor(head_dim, dtype)
    dq = _host_tensor(head_dim, torch.float32)
    out, lse = _outputs(p)
    args = bwd.kernel_args(p, bwd.descriptors(x, x, x, x, cfg, dq), (out, out, out), lse, lse, _schedule(p))
    name = {DqRoute.NONE: "hopper_dkdv", DqRoute.REDUCE: "hopper_bwd", DqRoute.DIRECT: "hopper_dkdv_dq"}[cfg.dq]
    return _compile(name, bwd.hopper_dkdv_kernel, args, bwd.constexprs(cfg, p), head_dim, dtype)


def compile_dq(head_dim: int, dtype: torch.dtype, broadcast=False, skip_kv=0, cfg: DqConfig | None = None,
               **fields) -> Report:
    """The dQ kernel (jfa.hopper.bwd_dq); broadcast writes float32 partials; skip_kv > 0: it skips the sequences
    of at most that many keys (DqRoute.DIRECT)."""
    cfg = cfg or select_dq(head_dim)
    p = meta_problem(head_dim, dtype, broadcast, **fields)
    x = _host_tensor(head_dim, dtype)
    out, lse = _outputs(p)
    dq = out.float() if broadcast else out
    args = bwd_dq.kernel_args(p, bwd_dq.descriptors(x, x, x, x, cfg), dq, lse, lse, _schedule(p))
    return _compile("hopper_dq", bwd_dq.hopper_dq_kernel, args, bwd_dq.constexprs(cfg, p, skip_kv), head_dim, dtype)


def compile_refresh(offsets_dtype=torch.int32, targets=False, key_tiles=False) -> str:
    """The PTX of the schedule's refresh kernel (jfa.schedule.refresh_kernel) for these offsets, with HSTU's mask's
    target counts or not, for key tiles or query tiles."""
    from .. import schedule

    def meta(dtype=torch.int32):
        return torch.empty(4, dtype=dtype, device="meta")
    offsets = meta(offsets_dtype)
    mask = meta_problem(64, torch.bfloat16, num_targets=meta(offsets_dtype) if targets else None).mask_args()
    sched = (meta(), meta(), meta(), meta(), meta())  # (tiles, tile_cost, order, sm_start, ticket)
    args = ((offsets, offsets), meta(torch.int64), meta(), sched, (1, 2, 3, 4, 5, 6), mask,
            (0, 1 << 30))  # (a schedule of every length: ScheduleSpec.kv_range's default)
    consts = dict(BLOCK_M=128, BLOCK_N=128, SEARCH_STEPS=10, BLOCK=schedule.REFRESH_BLOCK, KEY_TILES=key_tiles)
    sig, consts = aot_signature(schedule.refresh_kernel, args, consts)
    src = ASTSource(fn=schedule.refresh_kernel, signature=sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=schedule.REFRESH_BLOCK // 256)).asm["ptx"]


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
                    routes += [(DqRoute.REDUCE, 32, "reduce-shortq"), (DqRoute.NONE, 64, "none-shortq")]
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
