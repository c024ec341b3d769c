"""The Hopper (sm_90) backend: persistent, warp-specialized Gluon kernels over load-balanced schedules, the
forward (jfa.hopper.fwd) and the backward (jfa.hopper.bwd: one pass with dQ by TMA reduce-add, or, by shape and
always with deterministic=True, the dK/dV pass, then the dQ pass of jfa.hopper.bwd_dq). Head dims 64 and 128 in
bf16/fp16; others fall back (jfa.backends.select says so). docs/hopper.md describes the kernels."""
from __future__ import annotations

import torch

HEAD_DIMS = (64, 128)


def supports(device: torch.device, head_dim: int, dtype: torch.dtype) -> bool:
    if device.type != "cuda" or head_dim not in HEAD_DIMS or dtype not in (torch.bfloat16, torch.float16):
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


def forward(q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast):
    from .fwd import forward
    return forward(q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast)


def backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast,
             deterministic=False, max_kv_len=None):
    from .bwd import backward
    return backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast,
                    deterministic=deterministic, max_kv_len=max_kv_len)


__all__ = ["supports", "forward", "backward", "HEAD_DIMS"]
