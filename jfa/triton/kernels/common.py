"""The portable kernels' matmul (the jagged geometry they share with every kernel is jfa.geometry).

  DOT   "ieee" (fp32 inputs), "tf32" (16-bit inputs: tensor cores), or "upcast" (bf16 in Triton's interpreter,
        whose bf16 dot is wrong in 3.6: operands go to fp32, exact for bf16 products)
"""
import triton
import triton.language as tl


@triton.jit
def mma(a, b, FORM: tl.constexpr):
    """tl.dot with float32 accumulation; see DOT above (FORM.dot: jfa.triton.launch.Form)."""
    DOT: tl.constexpr = FORM.dot
    if DOT == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=DOT)
