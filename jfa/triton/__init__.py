"""The portable Triton backend: FlashAttention-2-style kernels over a flat tile table (GPU, or CPU through
Triton's interpreter)."""
from .launch import forward, supports
from .launch import backward as _backward


def backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast,
             deterministic=False):
    """The portable backward: deterministic whatever `deterministic` says (no atomics)."""
    return _backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast)


__all__ = ["forward", "backward", "supports"]
