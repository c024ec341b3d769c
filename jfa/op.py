"""The one custom op every public call goes through: ``jfa::attention`` (+ its backward op), with fake (meta)
implementations so torch.compile(fullgraph=True) traces it, and autograd registered on it.

Both ops take the fields of jfa.problem.Problem as their arguments, in field order (the backward op after dout,
dlse, out and lse): their schemas are made from the dataclass, so a field added there reaches every backend with
no edit here.

The public functions reach the op through ``Attention``, a plain autograd.Function around the two ops: the op's
own autograd registration (kept for callers of torch.ops.jfa.attention and for torch.compile) costs more host
time per call in eager mode, which short batches feel (targets-32, a forward with grad: 621 -> 357 us of issue
time per call on the H200's host; docs/perf-notes.md). In eager mode with plain tensors and no dispatch mode
active, ``Attention`` also calls the backend itself rather than through the op's dispatcher (~70 us per call on
its own), with the Problem whole rather than its fields (each argument autograd inspects, and the Problem rebuilt
from them, is host time before the kernels launch, which do_bench's span of a short forward holds); a dispatch
mode (FlopCounterMode, fake tensors) or a tensor subclass still sees the op.
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from .backends import BACKENDS
from .problem import FIELDS, IS_TENSOR, TENSOR_FIELDS, TYPES, Problem, filled, from_flat


def _with_signature(fn, leading: tuple, returns):
    """fn(*args) given the signature (leading params, then Problem's fields) that torch.library reads."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(name, kind, annotation=t) for name, t in leading]
    params += [inspect.Parameter(name, kind, annotation=TYPES[name]) for name in FIELDS]
    fn.__signature__ = inspect.Signature(params, return_annotation=returns)
    return fn


def _forward_impl(*args) -> tuple[Tensor, Tensor]:
    p = from_flat(args)
    return BACKENDS[p.backend].forward(p)


def _forward_fake(*args):
    p = from_flat(args)
    q = p.q
    return q.new_empty(p.rows, q.shape[1], q.shape[2]), q.new_empty(q.shape[1], p.lse_rows, dtype=torch.float32)


_GRADS = (("dout", Tensor), ("dlse", Optional[Tensor]), ("out", Tensor), ("lse", Tensor))


_TABLES = ("bias_position", "bias_time")  # the fields with a gradient besides q, k and v (jfa.bias)
_BACKWARD_RETURNS = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


def _table_grads(p, grads) -> tuple:
    """A table's gradient where the problem has the table, else an empty tensor (an op returns no None)."""
    return tuple(g if g is not None else p.q.new_empty(0, dtype=torch.float32)
                 for g in (grads or (None, None)))


def _backward_impl(dout, dlse, out, lse, *args) -> _BACKWARD_RETURNS:
    """(dq, dk, dv, dposition, dtime): a backend's backward returns the tables' gradients after dv where the
    problem has a relative bias."""
    p = from_flat(args)
    dq, dk, dv, *tables = BACKENDS[p.backend].backward(p, out, lse, dout, dlse)
    return (dq, dk, dv) + _table_grads(p, tables)


def _backward_fake(dout, dlse, out, lse, *args):
    p = from_flat(args)
    tables = [None if t is None else torch.empty_like(t, dtype=torch.float32, memory_format=torch.contiguous_format)
              for t in (p.bias_position, p.bias_time)]
    return (torch.empty_like(p.q), torch.empty_like(p.k), torch.empty_like(p.v)) + _table_grads(p, tables)


attention = torch.library.custom_op("jfa::attention", _with_signature(_forward_impl, (), tuple[Tensor, Tensor]),
                                    mutates_args=())
attention.register_fake(_with_signature(_forward_fake, (), tuple[Tensor, Tensor]))
attention_backward = torch.library.custom_op(
    "jfa::attention_backward", _with_signature(_backward_impl, _GRADS, _BACKWARD_RETURNS), mutates_args=())
attention_backward.register_fake(_with_signature(_backward_fake, _GRADS, _BACKWARD_RETURNS))


def _dispatch_free(tensors) -> bool:
    """Whether Attention may run the op's implementation without the op: plain tensors, no dispatch mode."""
    return not is_in_torch_dispatch_mode() and all(t is None or type(t) is Tensor for t in tensors)


def _setup_context(ctx, inputs, output):
    inputs = filled(inputs)
    ctx.save_for_backward(*(x for x, is_tensor in zip(inputs, IS_TENSOR) if is_tensor), *output)
    ctx.attrs = tuple(None if is_tensor else x for x, is_tensor in zip(inputs, IS_TENSOR))


def _saved(ctx):
    """(the op's arguments, out, lse) as saved by _setup_context."""
    saved = iter(ctx.saved_tensors)
    args = tuple(next(saved) if is_tensor else a for a, is_tensor in zip(ctx.attrs, IS_TENSOR))
    return args, next(saved), next(saved)


def _backward(ctx, dout, dlse):
    """The gradient of every field (None where a field has none): q's, k's and v's, and the tables' where given."""
    args, out, lse = _saved(ctx)
    if dout is None:
        dout = torch.zeros_like(out)
    backward_op = attention_backward
    if getattr(ctx, "dispatch_free", False) and _dispatch_free((dout, dlse)):
        backward_op = _backward_impl
    dq, dk, dv, *tables = backward_op(dout, dlse, out, lse, *args)
    grads = [dq, dk, dv] + [None] * (len(FIELDS) - 3)  # q, k, v lead the fields; the tables have theirs too
    for name, g in zip(_TABLES, tables):
        if args[FIELDS.index(name)] is not None:
            grads[FIELDS.index(name)] = g
    return tuple(grads)


attention.register_autograd(_backward, setup_context=_setup_context)


_GRAD_FIELDS = ("q", "k", "v", *_TABLES)  # the fields a gradient flows to: Attention's inputs after the problem
_GRAD_INDEX = tuple(FIELDS.index(name) for name in _GRAD_FIELDS)


class Attention(torch.autograd.Function):
    """(out, lse) = jfa::attention(...) with jfa::attention_backward as its gradient (see module doc), given the
    problem whole and, after it, the tensors of its fields a gradient may flow to (_GRAD_FIELDS: autograd links only
    the tensors it is handed). Inside forward grad mode is off, so the op skips its own autograd; gradients the
    caller leaves unused arrive as None (dout None: zeros; dlse None: no LSE term)."""

    @staticmethod
    def forward(ctx, p, *grad_inputs):
        ctx.set_materialize_grads(False)
        ctx.dispatch_free = _dispatch_free([getattr(p, name) for name in TENSOR_FIELDS])
        args = p.flat()
        out, lse = BACKENDS[p.backend].forward(p) if ctx.dispatch_free else attention(*args)
        _setup_context(ctx, args, (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        grads = _backward(ctx, dout, dlse)
        return (None, *(grads[i] for i in _GRAD_INDEX))


def attend(p: Problem) -> tuple[Tensor, Tensor]:
    """What the public functions call: Attention in eager mode; under torch.compile the op itself, with its
    registered autograd (the compiled graph has no per-call host cost to save, and dynamo rejects an
    autograd.Function given the same tensor twice, as self-attention's offsets are)."""
    if torch.compiler.is_compiling():
        return attention(*p.flat())
    return Attention.apply(p, *(getattr(p, name) for name in _GRAD_FIELDS))
