"""The Hopper (sm_90) backend: the warp-specialized Gluon forward (jfa.hopper.fwd) and backward (the dK/dV pass
jfa.hopper.bwd and the dQ pass jfa.hopper.bwd_dq, inside the portable backward's steps). Head dims 64 and 128
in bf16/fp16; others fall back (backends.select says so).

``JFA_HOPPER_BWD=triton`` swaps in the portable Triton backward (for A/B runs; the Gluon passes measured 1.3-2.1x
faster on every workload of the H200 suite, docs/perf-notes.md). The default backward is deterministic (no
atomics, the same bits run to run); the dK/dV pass's "fused" variant (dQ added with atomics, one pass instead of
two) measured 0.76-0.98x of it, so it is an option for A/B only and deterministic=True never takes it.
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


BWD = os.environ.get("JFA_HOPPER_BWD", "gluon")


def backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast,
             deterministic=False):
    if BWD == "gluon":
        from . import bwd
        return bwd.backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast,
                            deterministic=deterministic)
    if BWD != "triton":
        raise ValueError(f"JFA_HOPPER_BWD={BWD!r}: 'gluon' or 'triton'")
    return triton_backend.backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right,
                                   broadcast)


__all__ = ["supports", "forward", "backward", "HEAD_DIMS"]
