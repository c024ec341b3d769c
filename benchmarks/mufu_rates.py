"""The rates of the float32 operations a score function is built from, on this GPU: the multi-function unit's
ex2 (softmax), tanh (silu, gelu_tanh, sigmoid: tanh.approx) and rcp, against FFMA. A score function's form is
chosen by what its operations cost; the CUDA guide lists ex2's and rcp's rate but not tanh's.

    python benchmarks/mufu_rates.py [--iters 512] [--rep-ms 100]
    python benchmarks/mufu_rates.py --check        (any machine: compiles each chain for sm_90, counts its SASS ops)

Each chain applies its operation ITERS times to every element, x = op(x) * a + b (a, b keep x bounded; the FFMA is
the same in every chain, so "ffma" alone is the baseline), over enough CTAs to fill every SM with 16 independent
chains a thread. One line per operation: Gop/s of the operation, ops per clock per SM at the clock torch reports,
and the rate over ex2's.
"""
import argparse
import re
import sys

import torch
import triton
import triton.language as tl

# name -> (PTX of y = op(x), a, b): x = op(x) * a + b stays within op's well-conditioned range
OPS = {
    "ffma": (None, 0.5, 0.25),
    "ex2": ("ex2.approx.ftz.f32 $0, $1;", -0.5, 0.25),
    "tanh": ("tanh.approx.f32 $0, $1;", -0.5, 0.25),
    "rcp": ("rcp.approx.ftz.f32 $0, $1;", 0.5, 1.0),
}
BLOCK = 2048  # elements a CTA: 4 warps, 16 a thread (chains enough to hide the MUFU's latency)
WARPS = 4


@triton.jit
def _chain(x_ptr, out_ptr, a, b, ITERS: tl.constexpr, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in range(ITERS):
        if ASM is not None:
            x = tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
        x = x * a + b
    tl.store(out_ptr + offs, x)


def _sass_counts(op: str, iters: int) -> dict:
    """Counts of the SASS operations in op's chain compiled for sm_90a (ptxas and nvdisasm from Triton's wheel)."""
    from triton.backends.compiler import GPUTarget
    src = triton.compiler.ASTSource(_chain, {"x_ptr": "*fp32", "out_ptr": "*fp32", "a": "fp32", "b": "fp32",
                                             "ITERS": "constexpr", "ASM": "constexpr", "BLOCK": "constexpr"},
                                    constexprs={"ITERS": iters, "ASM": OPS[op][0], "BLOCK": BLOCK})
    from jfa.ptxas import sass  # (here: importing jfa first turns Triton's interpreter on where there is no GPU)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": WARPS}).asm["ptx"]
    ops = re.findall(r"/\*[0-9a-f]+\*/\s+((?:MUFU\.\w+)|FFMA|FMUL|FADD)\b", sass(ptx))
    return {k: ops.count(k) for k in sorted(set(ops))}


def check(iters: int) -> int:
    for op in OPS:
        print(f"{op:<5} SASS: {_sass_counts(op, iters)}")
    return 0


def measure(iters: int, rep_ms: int) -> int:
    from triton.testing import do_bench
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ctas = sms * 32  # 32 CTAs an SM, 16 resident at a time (64 warps): 16 warps a scheduler
    x = torch.empty(ctas * BLOCK, device=dev).uniform_(-0.5, 0.5)
    out = torch.empty_like(x)
    try:
        mhz = torch.cuda.clock_rate(dev)
    except Exception:  # (no NVML)
        mhz = 0
    rates = {}
    for op, (asm, a, b) in OPS.items():
        def run():
            _chain[(ctas,)](x, out, a, b, ITERS=iters, ASM=asm, BLOCK=BLOCK, num_warps=WARPS)
        run()
        assert torch.isfinite(out).all(), f"{op}: the chain left its range"
        ms = do_bench(run, rep=rep_ms)
        rates[op] = x.numel() * iters / (ms * 1e-3)
    print(f"{torch.cuda.get_device_name(dev)}, {sms} SMs, clock {mhz} MHz (torch.cuda.clock_rate), "
          f"{iters} iterations a chain")
    for op, r in rates.items():
        per_clk = f"{r / (sms * mhz * 1e6):6.1f}" if mhz else "     -"
        print(f"{op:<5} {r / 1e9:9.1f} Gop/s  {per_clk} /clk/SM  x{r / rates['ex2']:.2f} of ex2")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=512)
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--check", action="store_true", help="compile each chain for sm_90 (no GPU)")
    args = p.parse_args(argv)
    return check(args.iters) if args.check else measure(args.iters, args.rep_ms)


if __name__ == "__main__":
    sys.exit(main())
