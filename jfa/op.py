"""The one custom op every public call goes through: ``jfa::attention`` (+ its backward op), with fake
(meta) implementations so torch.compile(fullgraph=True) traces it, and autograd registered on it.

The public functions reach it through ``Attention``, a plain autograd.Function around the two ops: the op's own
autograd registration (kept for callers of torch.ops.jfa.attention and for torch.compile) costs more host time
per call in eager mode, which short batches feel directly (H200 host, a forward with grad, issue time per call
with the cached box layouts of jfa.hopper.common: targets-32 621 -> 357 us, pma-32-d64 569 -> 549; session 9).
In eager mode with plain tensors and no dispatch mode active, ``Attention`` also calls the op's implementation
(the backend) itself rather than through the op's dispatcher, which costs ~70 us per call on its own (this
repo's 2-core CPU machine, a stub backend; session 10); a dispatch mode (FlopCounterMode, fake tensors) or a
tensor subclass still sees the op.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from .backends import BACKENDS


def forward_impl(q: Tensor, k: Tensor, v: Tensor, q_offsets: Tensor, kv_offsets: Tensor, scale: float,
                 window_left: int, window_right: int, broadcast: bool, backend: str, deterministic: bool,
                 max_kv_len: Optional[int] = None) -> tuple[Tensor, Tensor]:
    """-> (out [rows, Hq, D], lse [Hq, rows]); rows = Tq, or B * Lq in broadcast mode. deterministic and
    max_kv_len (the caller's bound on the keys per sequence, or None) only concern the backward."""
    return BACKENDS[backend].forward(q, k, v, q_offsets, kv_offsets, scale, window_left, window_right, broadcast)


attention = torch.library.custom_op("jfa::attention", forward_impl, mutates_args=())


def _rows(q, kv_offsets, broadcast):
    return (kv_offsets.shape[0] - 1) * q.shape[0] if broadcast else q.shape[0]


@attention.register_fake
def _(q, k, v, q_offsets, kv_offsets, scale, window_left, window_right, broadcast, backend, deterministic,
      max_kv_len=None):
    rows = _rows(q, kv_offsets, broadcast)
    return q.new_empty(rows, q.shape[1], q.shape[2]), q.new_empty(q.shape[1], rows, dtype=torch.float32)


def backward_impl(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  q_offsets: Tensor, kv_offsets: Tensor, scale: float, window_left: int, window_right: int,
                  broadcast: bool, backend: str, deterministic: bool,
                  max_kv_len: Optional[int] = None) -> tuple[Tensor, Tensor, Tensor]:
    return BACKENDS[backend].backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, window_left,
                                      window_right, broadcast, deterministic=deterministic, max_kv_len=max_kv_len)


attention_backward = torch.library.custom_op("jfa::attention_backward", backward_impl, mutates_args=())


@attention_backward.register_fake
def _(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, window_left, window_right, broadcast, backend,
      deterministic, max_kv_len=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _dispatch_free(*tensors) -> bool:
    """Whether Attention may run the op's implementation without the op: plain tensors, no dispatch mode."""
    return not is_in_torch_dispatch_mode() and all(t is None or type(t) is Tensor for t in tensors)


def _setup_context(ctx, inputs, output):
    # max_kv_len is the op's optional last argument: a direct caller of torch.ops.jfa.attention may leave it out
    q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast, backend, deterministic, *max_kv_len = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets)
    ctx.attrs = (scale, left, right, broadcast, backend, deterministic, *max_kv_len)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, q_offsets, kv_offsets = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    backward_op = attention_backward
    if getattr(ctx, "dispatch_free", False) and _dispatch_free(dout, dlse):
        backward_op = backward_impl
    dq, dk, dv = backward_op(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, *ctx.attrs)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


attention.register_autograd(_backward, setup_context=_setup_context)


class Attention(torch.autograd.Function):
    """(out, lse) = jfa::attention(...) with jfa::attention_backward as its gradient (see module doc). Inside
    forward grad mode is off, so the op skips its own autograd; gradients the caller leaves unused arrive as
    None (dout None: zeros; dlse None: no LSE term)."""

    @staticmethod
    def forward(ctx, q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast, backend, deterministic,
                max_kv_len):
        ctx.set_materialize_grads(False)
        ctx.dispatch_free = _dispatch_free(q, k, v, q_offsets, kv_offsets)
        forward_op = forward_impl if ctx.dispatch_free else attention
        args = (q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast, backend, deterministic, max_kv_len)
        out, lse = forward_op(*args)
        _setup_context(ctx, args, (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return _backward(ctx, dout, dlse)


def attend(q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast, backend, deterministic, max_kv_len=None):
    """What the public functions call: Attention in eager mode; under torch.compile the op itself, with its
    registered autograd (the compiled graph has no per-call host cost to save, and dynamo rejects an
    autograd.Function given the same tensor twice, as self-attention's offsets are)."""
    args = (q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast, backend, deterministic, max_kv_len)
    return attention(*args) if torch.compiler.is_compiling() else Attention.apply(*args)
