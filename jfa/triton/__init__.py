"""The portable Triton backend: FlashAttention-2-style kernels over a flat tile table (GPU, or CPU through
Triton's interpreter). Deterministic: no atomics."""
from .launch import backward, forward, supports

__all__ = ["forward", "backward", "supports"]
