"""The rate of Hopper's warpgroup MMA (wgmma) on the operand shapes jfa's backward issues, with and without other
shared-memory traffic beside it: is a product with both operands in shared memory and N = 64 held to the
shared memory's bandwidth (its operands, 4 KB per 64 x 64 x 16 step, arrive at 128 bytes a cycle, the bandwidth of
an SM's shared memory, where the tensor cores' dense peak takes 32 cycles for the step), so that every other byte
through shared memory (TMA loads, stores of dS or dQ chunks) takes cycles from the MMAs? docs/perf-notes.md's
model of the one pass (session 42) says yes; this measures it.

    python benchmarks/wgmma_rates.py [--iters 2048] [--rep-ms 100]
    python benchmarks/wgmma_rates.py --check       (any machine: compiles each form for sm_90, counts its SASS)

Each form: CTAS_PER_SM CTAs an SM (one warpgroup each, so the SM's tensor cores always have a warpgroup's MMAs to
run), each ITERS times dS-like products acc[64, N] += A[64, 128] B[128, N] (bf16, float32 accumulate), A from
shared memory (ss) or registers (rs), B from shared memory; "+sts" also stores a [64, 64] float32 tile into shared
memory each iteration (16 KB, without bank conflicts: a dQ chunk's staging), "+sts4" four (64 KB: where the store
alone needs 512 cycles at 128 B a cycle, 256 at 256, beside the MMAs' 256 cycles at their peak). One line a form:
TFLOP/s, the share of torch.matmul's dense rate (8192^3 bf16, this run), and the bytes through shared memory a FLOP
of MMA.
"""
import argparse
import re
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

K = gl.constexpr(128)
CTAS_PER_SM = 4
# name -> (N, A from registers, float32 [64, 64] tiles stored each iteration)
FORMS = {
    "ss n64": (64, False, 0),
    "rs n64": (64, True, 0),
    "ss n128": (128, False, 0),
    "rs n128": (128, True, 0),
    "ss n64 +sts": (64, False, 1),
    "rs n64 +sts": (64, True, 1),
    "ss n64 +sts4": (64, False, 4),
    "rs n64 +sts4": (64, True, 4),
}


@gluon.jit
def _mma_loop(out_ptr, iters, N: gl.constexpr, RS: gl.constexpr, STORE: gl.constexpr):
    """STORE: float32 [64, 64] tiles stored into shared memory an iteration (0: none)."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 16])
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, K], gl.bfloat16)
    b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([N, K], gl.bfloat16)
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    a_s = gl.allocate_shared_memory(gl.bfloat16, [64, K], a_layout)
    b_s = gl.allocate_shared_memory(gl.bfloat16, [N, K], b_layout)
    # small values (the products' sums stay exact over any iterations): 1/64 everywhere
    a_s.store(gl.full([64, K], 0.015625, gl.bfloat16, layout=blocked))
    b_s.store(gl.full([N, K], 0.015625, gl.bfloat16, layout=blocked))
    # the float32 tile stored 16 bytes a thread, rows in order: 4 wavefronts a warp's 512 bytes, no bank conflict
    stage_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    if STORE:  # (only where stored: four CTAs an SM fit with n128's operands)
        stage = gl.allocate_shared_memory(gl.float32, [64, 64], stage_layout)
    tile_layout: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])
    tile = gl.full([64, 64], 1.0, gl.float32, layout=tile_layout)
    fence_async_shared()  # (the generic proxy's stores made visible to wgmma's reads: the async proxy)
    gl.thread_barrier()
    acc = gl.full([64, N], 0.0, gl.float32, layout=acc_layout)
    if RS:
        a = a_s.load(gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2))
    else:
        a = a_s
    for i in range(iters):
        acc = warpgroup_mma(a, b_s.permute((1, 0)), acc, is_async=True)
        for k in gl.static_range(STORE):  # (i + k: a new value each time, so the stores stay in the loop)
            stage.store(tile + (i + k))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, N, layout=gl.SliceLayout(0, acc_layout))
    extra = 0.0
    if STORE:
        extra = gl.sum(gl.sum(stage.load(tile_layout), axis=1), axis=0)
    ptrs = out_ptr + gl.program_id(0) * 64 * N + gl.expand_dims(rows, 1) * N + gl.expand_dims(cols, 0)
    gl.store(ptrs, acc + extra)


def _launch(form, ctas, iters, out=None):
    n, rs, sts = FORMS[form]
    out = torch.empty(ctas * 64 * n, device="cuda") if out is None else out
    _mma_loop[(ctas, )](out, iters, N=n, RS=rs, STORE=sts, num_warps=4)
    return out


def check() -> int:
    """Compile every form for sm_90a and count its SASS operations in the loop (no GPU)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from jfa.ptxas import sass
    for form, (n, rs, sts) in FORMS.items():
        src = GluonASTSource(fn=_mma_loop, signature={"out_ptr": "*fp32", "iters": "i32", "N": "constexpr",
                                                      "RS": "constexpr", "STORE": "constexpr"},
                             constexprs={"N": n, "RS": rs, "STORE": sts})
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"]
        ops = re.findall(r"/\*[0-9a-f]+\*/\s+(HGMMA\.\w+|STS\S*|LDS\S*|STL|LDL)", sass(ptx))
        print(f"{form:<12} SASS: {dict(sorted({o: ops.count(o) for o in set(ops)}.items()))}")
    return 0


def measure(iters: int, rep_ms: int) -> int:
    from triton.testing import do_bench
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ctas = sms * CTAS_PER_SM
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    peak = 2 * 8192 ** 3 / (do_bench(lambda: x @ x, rep=rep_ms) * 1e-3) / 1e12
    print(f"{torch.cuda.get_device_name(dev)}, {sms} SMs, {CTAS_PER_SM} CTAs an SM, {iters} iterations; "
          f"torch.matmul 8192^3 bf16: {peak:.0f} TFLOP/s")
    for form, (n, rs, sts) in FORMS.items():
        out = _launch(form, ctas, iters)
        k = K.value
        # every product k x (1/64)^2, iters times; +sts adds its last tile's sum (4,096 elements of iters + sts - 1)
        expect = k / 64 / 64 * iters + (64 * 64 * (iters + sts - 1) if sts else 0)
        got = out.view(ctas, 64, n)
        assert torch.equal(got, torch.full_like(got, expect)), \
            f"{form}: wrong products ({got.min().item()}..{got.max().item()}, expected {expect})"
        ms = do_bench(lambda: _launch(form, ctas, iters, out), rep=rep_ms)
        tflops = 2 * 64 * n * k * iters * ctas / (ms * 1e-3) / 1e12
        smem = (0 if rs else 64 * k * 2) + n * k * 2 + 64 * 64 * 4 * sts
        print(f"{form:<12} {tflops:7.1f} TFLOP/s  {tflops / peak:6.1%} of matmul  "
              f"{smem / (2 * 64 * n * k):.3f} B of shared memory a FLOP")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=2048)
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--check", action="store_true", help="compile each form for sm_90 (no GPU)")
    args = p.parse_args(argv)
    return check() if args.check else measure(args.iters, args.rep_ms)


if __name__ == "__main__":
    sys.exit(main())
