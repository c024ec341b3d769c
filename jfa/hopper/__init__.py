"""The Hopper (sm_90) backend: the warp-specialized Gluon forward (jfa.hopper.fwd) and, for now, the portable
Triton backward (a Hopper backward is the next step). Head dims 64 and 128 in bf16/fp16; others fall back."""
from __future__ import annotations

import torch

from .. import triton as triton_backend
from ..schedule import ScheduleCache

HEAD_DIMS = (64, 128)
_SCHEDULES = ScheduleCache()


def supports(device: torch.device, head_dim: int, dtype: torch.dtype) -> bool:
    if device.type != "cuda" or head_dim not in HEAD_DIMS or dtype not in (torch.bfloat16, torch.float16):
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


def forward(q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast):
    from . import fwd
    return fwd.forward(q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast, schedules=_SCHEDULES)


backward = triton_backend.backward

__all__ = ["supports", "forward", "backward", "HEAD_DIMS"]
