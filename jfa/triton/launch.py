"""Launchers of the portable Triton kernels: tile tables, configs, grids. No host synchronisation.

Everything a kernel needs about the batch comes from the offsets on the device (jfa.jagged.tile_table), and
the grid is sized from the tensor shapes alone, so the launches can be captured in a CUDA graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from ..jagged import tile_table
from ..runtime import check_runnable, interpreting
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


def _block_d(head_dim):
    return max(16, triton.next_power_of_2(head_dim))


def _common(q, k, head_dim):
    return dict(GROUP=q.shape[1] // k.shape[1], D=head_dim, BLOCK_D=_block_d(head_dim), DOT=dot_mode(q.dtype))


def forward(q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast):
    """-> (out [rows, Hq, D], lse [Hq, rows] float32). q_offsets give the output rows (b*Lq in broadcast);
    left, right in jfa.jagged.resolve_window's form."""
    batch = kv_offsets.numel() - 1
    rows = batch * q.shape[0] if broadcast else q.shape[0]
    hq, head_dim = q.shape[1], q.shape[2]
    out = torch.empty(rows, hq, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(hq, rows, dtype=torch.float32, device=q.device)
    if rows == 0 or batch == 0:
        return out, lse
    check_runnable(q.device)
    cfg = select_config(q.device, head_dim, q.dtype).fwd
    tiles = tile_table(q_offsets, cfg.block_m, rows)
    kernels.attention_fwd_kernel[(tiles.shape[1], hq)](
        q, k, v, out, lse, q_offsets, kv_offsets, tiles, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), out.stride(0), out.stride(1), lse.stride(0), tiles.shape[1],
        scale * math.log2(math.e), left, right, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BROADCAST=broadcast,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_common(q, k, head_dim))
    return out, lse


def backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast,
             deterministic=False, max_kv_len=None):
    """-> (dq, dk, dv). dlse (the gradient of the returned lse) may be None. Deterministic whatever
    `deterministic` says: no atomics (broadcast q's dQ is summed from per-sequence float32 partials). max_kv_len
    is not used."""
    batch = kv_offsets.numel() - 1
    rows = out.shape[0]
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    dq = torch.empty(rows, q.shape[1], q.shape[2], device=q.device,
                     dtype=torch.float32 if broadcast else q.dtype)
    if batch == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    check_runnable(q.device)
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    delta = bwd_delta(out, dout, dlse, lse)
    args = (q, k, v, dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast)
    if k.shape[0] > 0:
        _bwd_dkdv(*args, dk, dv)
    if rows > 0:
        _bwd_dq(*args, dq)
    return sum_broadcast_dq(dq, q, batch, broadcast), dk, dv


def sum_broadcast_dq(dq, q, batch: int, broadcast: bool):
    """dq in q's dtype: in broadcast mode the per-sequence float32 partials [B * Lq, Hq, D] summed over the
    batch (a fixed order: deterministic)."""
    if broadcast:
        dq = dq.view(batch, q.shape[0], q.shape[1], q.shape[2]).sum(0)
    return dq.to(q.dtype)


def bwd_delta(out, dout, dlse, lse):
    """Delta = rowsum(dO * O) - dLSE, float32 [Hq, rows] (the preprocess of every backward here)."""
    rows, hq, head_dim = out.shape
    delta = torch.empty_like(lse)
    dlse = None if dlse is None else dlse.contiguous()  # read with lse's strides
    if rows > 0:
        block_t = 64 if out.device.type == "cuda" else 16
        kernels.attention_bwd_preprocess_kernel[(triton.cdiv(rows, block_t), hq)](
            out, dout, dlse if dlse is not None else lse, delta, rows,
            out.stride(0), out.stride(1), dout.stride(0), dout.stride(1), lse.stride(0),
            D=head_dim, BLOCK_D=_block_d(head_dim), BLOCK_T=block_t, HAS_DLSE=dlse is not None)
    return delta


def _bwd_dkdv(q, k, v, dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast, dk, dv):
    """The dK/dV pass into dk, dv (one program per key tile and kv head; GQA reduced in registers)."""
    cfg = select_config(q.device, q.shape[2], q.dtype).dkdv
    tiles = tile_table(kv_offsets, cfg.block_n, k.shape[0])
    kernels.attention_bwd_dkdv_kernel[(tiles.shape[1], k.shape[1])](
        q, k, v, dout, lse, delta, dk, dv, q_offsets, kv_offsets, tiles,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        dout.stride(0), dout.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), lse.stride(0),
        tiles.shape[1], scale, scale * math.log2(math.e), left, right,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BROADCAST=broadcast,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_common(q, k, q.shape[2]))


def _bwd_dq(q, k, v, dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast, dq):
    """The dQ pass into dq (per-sequence float32 partials in broadcast mode)."""
    cfg = select_config(q.device, q.shape[2], q.dtype).dq
    tiles = tile_table(q_offsets, cfg.block_m, dq.shape[0])
    kernels.attention_bwd_dq_kernel[(tiles.shape[1], q.shape[1])](
        q, k, v, dout, lse, delta, dq, q_offsets, kv_offsets, tiles,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        dout.stride(0), dout.stride(1), dq.stride(0), dq.stride(1), lse.stride(0),
        tiles.shape[1], scale, scale * math.log2(math.e), left, right,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BROADCAST=broadcast,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_common(q, k, q.shape[2]))
