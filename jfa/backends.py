"""The backends behind the one custom op, and how "auto" picks one.

  reference  pure PyTorch, any device, any head dim (jfa.reference; its backward is autograd over it)
  triton     portable Triton kernels (jfa.triton): CUDA, or CPU tensors through Triton's interpreter
  hopper     sm_90 fast path (jfa.hopper): warp-specialized Gluon forward, D 64/128, bf16/fp16; "auto"'s
             pick where it applies
A backend is a pair forward(problem) -> (out, lse) and backward(problem, out, lse, dout, dlse) -> (dq, dk, dv)
(and the tables' gradients after them where the problem has a relative bias: jfa.bias),
problem a jfa.problem.Problem (its ``deterministic``: the same bits run to run, which the reference and triton
backends always give; its ``max_kv_len``: the caller's bound on any sequence's keys, by which hopper skips work).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import hopper as hopper_backend
from . import reference
from . import triton as triton_backend
from .jagged import paged_rows


def _reference_args(p) -> dict:
    """The reference's keyword arguments of a problem (its mask's and score's fields)."""
    return dict(scale=p.scale, left=p.left, right=p.right, broadcast=p.broadcast, activation=p.activation,
                out_scale=p.scales, num_targets=p.num_targets, contextual_len=p.contextual_len, rel_bias=p.bias,
                min_full_attn_len=p.min_full_attn_len)


def _reference_forward(p):
    k, v = p.k, p.v
    if p.paged:  # the keys gathered from their pages (jfa.jagged.paged_rows)
        rows = paged_rows(p.page_table, p.kv_offsets, p.page_size)
        k, v = k[rows], v[rows]
    return reference.attention(p.q, k, v, p.q_offsets, p.kv_offsets, **_reference_args(p))


def _reference_backward(p, out, lse, dout, dlse):
    return reference.attention_backward(dout, dlse, p.q, p.k, p.v, out, p.q_offsets, p.kv_offsets,
                                        **_reference_args(p))


@dataclass(frozen=True)
class Backend:
    name: str
    forward: Callable
    backward: Callable
    supports: Callable[[torch.device, int, torch.dtype], bool]


def _triton_supports(device, head_dim, dtype):
    if not triton_backend.supports(head_dim, dtype):
        return False
    return device.type == "cuda" or (device.type == "cpu" and triton_backend.launch.interpreting())


BACKENDS = {
    "reference": Backend("reference", _reference_forward, _reference_backward, lambda device, d, dt: True),
    "triton": Backend("triton", triton_backend.forward, triton_backend.backward, _triton_supports),
    "hopper": Backend("hopper", hopper_backend.forward, hopper_backend.backward, hopper_backend.supports),
}


def available_backends(device="cpu", head_dim=128, dtype=torch.bfloat16):
    """Names of the backends that take this device, head dim and dtype."""
    device = torch.device(device)
    return [name for name, b in BACKENDS.items() if b.supports(device, head_dim, dtype)]


def select(backend: str, device: torch.device, head_dim: int, dtype: torch.dtype) -> str:
    """Resolve "auto" (the fastest correct backend for the device; the reference on the CPU) and check."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    if backend == "auto":
        for name in ("hopper", "triton"):
            if device.type == "cuda" and BACKENDS[name].supports(device, head_dim, dtype):
                return name
        return "reference"
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected 'auto' or one of {sorted(BACKENDS)}")
    if not BACKENDS[backend].supports(device, head_dim, dtype):
        takers = available_backends(device, head_dim, dtype)
        raise ValueError(f"backend {backend!r} does not take head dim {head_dim} with {dtype} on "
                         f"{device.type}; backends that do: {takers}")
    return backend
