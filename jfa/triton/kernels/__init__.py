"""The portable Triton kernels (compiled for the GPU, or run by Triton's interpreter on CPU tensors)."""
from .bwd import attention_bwd_dkdv_kernel, attention_bwd_dq_kernel
from .fwd import attention_fwd_kernel

__all__ = ["attention_fwd_kernel", "attention_bwd_dkdv_kernel", "attention_bwd_dq_kernel"]
