"""The Hopper (sm_90) backend: the warp-specialized Gluon forward (jfa.hopper.fwd) and, for now, the portable
Triton backward. Head dims 64 and 128 in bf16/fp16; others fall back (backends.select says so).

The Gluon dK/dV pass (jfa.hopper.bwd) is a DRAFT not yet run on a GPU: ``JFA_HOPPER_BWD=gluon`` plugs it into
the backward for its first H200 tests and measurements (``scripts/h200/next_session.sh``).
"""
from __future__ import annotations

import os

import torch

from .. import triton as triton_backend
from ..schedule import ScheduleCache

HEAD_DIMS = (64, 128)
SCHEDULES = ScheduleCache()  # shared by the forward and the backward passes


def supports(device: torch.device, head_dim: int, dtype: torch.dtype) -> bool:
    if device.type != "cuda" or head_dim not in HEAD_DIMS or dtype not in (torch.bfloat16, torch.float16):
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


def forward(q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast):
    from . import fwd
    return fwd.forward(q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast, schedules=SCHEDULES)


BWD = os.environ.get("JFA_HOPPER_BWD", "triton")


def backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast):
    if BWD == "gluon":
        from . import bwd
        return bwd.backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast)
    if BWD != "triton":
        raise ValueError(f"JFA_HOPPER_BWD={BWD!r}: 'triton' or 'gluon'")
    return triton_backend.backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right,
                                   broadcast)

__all__ = ["supports", "forward", "backward", "HEAD_DIMS"]
