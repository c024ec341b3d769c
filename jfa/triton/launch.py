"""Launchers of the portable Triton kernels: tile tables, configs, grids. No host synchronisation.

Everything a kernel needs about the batch comes from the offsets on the device (jfa.jagged.tile_table), and
the grid is sized from the tensor shapes alone, so the launches can be captured in a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..bias import grad_buffers
from ..bias import grads as bias_grads
from ..bwd_common import block_d, delta, scaled_rows, sum_broadcast_dq
from ..jagged import tile_table
from ..problem import Problem
from ..runtime import check_runnable, interpreting, launch
from ..variants import score_args, score_fn
from . import kernels


def supports(head_dim: int, dtype: torch.dtype) -> bool:
    return 16 <= head_dim <= 256 and dtype in (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class TileConfig:
    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class Configs:
    fwd: TileConfig
    dkdv: TileConfig  # the dK/dV pass owns key tiles of block_n rows, walks query blocks of block_m
    dq: TileConfig


# Interpreter (CPU): small, unequal tiles so the awkward lengths cross several blocks in both directions.
_INTERPRETER = Configs(TileConfig(32, 16), TileConfig(16, 32), TileConfig(32, 16))


def select_config(device: torch.device, head_dim: int, dtype: torch.dtype) -> Configs:
    """Tile shapes per device, head dim and dtype.

    GPU: wgmma needs 64 rows per warpgroup in the first operand (fwd/dq: block_m, dK/dV: block_n). A
    portable baseline picked by the compiler's spill report (tests/test_aot.py), not tuned by timing.
    """
    if device.type != "cuda":
        return _INTERPRETER
    if dtype == torch.float32:  # exact fp32 (no tf32): plain FMA dots, small tiles
        return Configs(TileConfig(64, 32), TileConfig(32, 64), TileConfig(64, 32))
    # sm_90 ptxas, bf16 (docs/perf-notes.md, "AOT"): 0 spills at D<=64 and for the D=128 forward; the D=128
    # backward spills least with these (dK/dV 748 B, dQ 32 B); D=256 spills everywhere.
    if head_dim <= 64:
        return Configs(TileConfig(128, 64, 8, 3), TileConfig(64, 64, 8, 2), TileConfig(64, 64, 8, 2))
    if head_dim <= 128:
        return Configs(TileConfig(128, 64, 8, 2), TileConfig(16, 64, 4, 2), TileConfig(64, 16, 4, 2))
    return Configs(TileConfig(64, 32, 4, 2), TileConfig(32, 64, 4, 1), TileConfig(64, 32, 4, 1))


def dot_mode(dtype: torch.dtype) -> str:
    """See DOT in kernels/common.py."""
    if dtype == torch.float32:
        return "ieee"
    return "upcast" if dtype == torch.bfloat16 and interpreting() else "tf32"  # tf32: no-op for 16-bit


@dataclass(frozen=True)
class Form:
    """The kernels' compile-time arguments besides the score function, as one constexpr (FORM): the tile config's,
    the problem's and the machine's."""
    block_m: int
    block_n: int
    head_dim: int
    block_d: int  # the head dim padded to what tl.arange takes
    group: int  # query heads per kv head
    broadcast: bool
    dot: str  # DOT in kernels/common.py
    fast: bool  # jfa.variants' FAST: not in Triton's interpreter


def constexprs(cfg: TileConfig, p: Problem) -> dict:
    """The compile-time arguments of a kernel run with this config on this problem, and its launch options (the
    launchers' and jfa.triton.aot's one mapping)."""
    form = Form(cfg.block_m, cfg.block_n, p.head_dim, block_d(p.head_dim), p.group, p.broadcast, dot_mode(p.q.dtype),
                not interpreting())
    return dict(FORM=form, SCORE=score_fn(p.activation), num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def rows(x):
    """A [rows, heads, D] tensor as the kernels take it: (pointer, row stride, head stride)."""
    return (x, x.stride(0), x.stride(1))


def fwd_args(p: Problem, out, lse, tiles) -> tuple:
    """attention_fwd_kernel's run-time arguments (the launcher's, and jfa.triton.aot's on meta tensors)."""
    return (rows(p.q), rows(p.k), rows(p.v), rows(out), (lse, lse.stride(0)), (p.q_offsets, p.kv_offsets),
            (tiles, tiles.shape[1]), score_args(p), p.mask_args(), p.page_args(), p.bias_args())


def bwd_args(p: Problem, dout, lse, delta, grads: tuple, tiles, tables=None) -> tuple:
    """The backward kernels' run-time arguments: grads = (dk, dv) for the dK/dV pass, (dq, ) for the dQ pass, which
    also sums the bias tables' gradients into tables (jfa.bias.grad_buffers)."""
    return (rows(p.q), rows(p.k), rows(p.v), rows(dout), (lse, delta, lse.stride(0)), *(rows(g) for g in grads),
            (p.q_offsets, p.kv_offsets), (tiles, tiles.shape[1]), score_args(p), p.mask_args(), p.bias_args(tables))


def forward(p: Problem, configs: Configs | None = None):
    """-> (out [rows, Hq, D], lse [Hq, rows] float32); configs: select_config's by default."""
    q = p.q
    out = torch.empty(p.rows, p.heads, p.head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(p.heads, p.lse_rows, dtype=torch.float32, device=q.device)
    if p.rows == 0 or p.batch == 0:
        return out, lse
    check_runnable(q.device)
    cfg = (configs or select_config(q.device, p.head_dim, q.dtype)).fwd
    tiles = tile_table(p.q_offsets, cfg.block_m, p.rows)
    launch(kernels.attention_fwd_kernel, (tiles.shape[1], p.heads), *fwd_args(p, out, lse, tiles),
           **constexprs(cfg, p))
    return scaled_rows(out, p), lse


def backward(p: Problem, out, lse, dout, dlse, configs: Configs | None = None):
    """-> (dq, dk, dv), and with a relative bias its tables' gradients (dposition, dtime; None for an absent table).
    dlse (the gradient of the returned lse) may be None. Deterministic whatever p.deterministic says: no atomics
    (broadcast q's dQ is summed from per-sequence float32 partials), but for the bias tables' gradients (float32
    atomics)."""
    q, k = p.q, p.k
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(p.v, memory_format=torch.contiguous_format)
    dq = torch.empty(p.rows, p.heads, p.head_dim, device=q.device,
                     dtype=torch.float32 if p.broadcast else q.dtype)
    tables = None if p.bias is None else grad_buffers(p.bias, q.device)
    if p.batch == 0:
        return (torch.zeros_like(q), dk.zero_(), dv.zero_()) + (() if tables is None else bias_grads(tables))
    check_runnable(q.device)
    configs = configs or select_config(q.device, p.head_dim, q.dtype)
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    if p.softmax:
        grads = _Grads(dout, lse, delta(out, dout, dlse, lse))
    else:  # no Delta; a per-row out scale is a factor of dO
        grads = _Grads(scaled_rows(dout, p), lse, lse)
    if k.shape[0] > 0:
        _bwd_dkdv(p, grads, dk, dv, configs.dkdv)
    if p.rows > 0:
        _bwd_dq(p, grads, dq, configs.dq, tables)
    return (sum_broadcast_dq(dq, q, p.batch, p.broadcast), dk, dv) + (() if tables is None else bias_grads(tables))


@dataclass(frozen=True)
class _Grads:
    """What both backward passes read besides the problem."""
    dout: torch.Tensor
    lse: torch.Tensor
    delta: torch.Tensor


def _bwd_dkdv(p: Problem, g: _Grads, dk, dv, cfg: TileConfig):
    """The dK/dV pass into dk, dv (one program per key tile and kv head; GQA reduced in registers)."""
    tiles = tile_table(p.kv_offsets, cfg.block_n, p.k.shape[0])
    launch(kernels.attention_bwd_dkdv_kernel, (tiles.shape[1], p.heads_kv),
           *bwd_args(p, g.dout, g.lse, g.delta, (dk, dv), tiles), **constexprs(cfg, p))


def _bwd_dq(p: Problem, g: _Grads, dq, cfg: TileConfig, tables=None):
    """The dQ pass into dq (per-sequence float32 partials in broadcast mode), and the bias tables' gradients."""
    tiles = tile_table(p.q_offsets, cfg.block_m, dq.shape[0])
    launch(kernels.attention_bwd_dq_kernel, (tiles.shape[1], p.heads),
           *bwd_args(p, g.dout, g.lse, g.delta, (dq, ), tiles, tables), **constexprs(cfg, p))
