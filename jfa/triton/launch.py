"""Launchers of the portable Triton kernels: tile tables, configs, grids. No host synchronisation.

Everything a kernel needs about the batch comes from the offsets on the device (jfa.jagged.tile_table), and
the grid is sized from the tensor shapes alone, so the launches can be captured in a CUDA graph.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton

from ..jagged import kernel_window, tile_table
from ..schedule import ScheduleCache, num_sms



def supports(head_dim: int, dtype: torch.dtype) -> bool:
    return 16 <= head_dim <= 256 and dtype in (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """Whether Triton runs in its interpreter in this process (decided when triton was first imported)."""
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(triton.language.standard.zeros, InterpretedFunction)


def kernels_for(device: torch.device):
    """The kernel module; CPU tensors need Triton's interpreter (jfa turns it on at import on a machine with
    no CUDA device; elsewhere set TRITON_INTERPRET=1 before importing triton)."""
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(
            "backend='triton' runs CPU tensors in Triton's interpreter, but triton was imported in compiled "
            "mode (this machine has CUDA, or triton was imported before jfa). Set TRITON_INTERPRET=1 in the "
            "environment before importing triton, or use CUDA tensors, or backend='reference'.")
    from . import kernels
    return kernels


@dataclass(frozen=True)
class TileConfig:
    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class Configs:
    fwd: TileConfig
    fwd_persistent: TileConfig  # the same tile body inside a loop over the SM's schedule
    dkdv: TileConfig  # the dK/dV pass owns key tiles of block_n rows, walks query blocks of block_m
    dq: TileConfig


# Interpreter (CPU): small, unequal tiles so the awkward lengths cross several blocks in both directions.
_INTERPRETER = Configs(TileConfig(32, 16), TileConfig(32, 16), TileConfig(16, 32), TileConfig(32, 16))


def configs(device: torch.device, head_dim: int, dtype: torch.dtype) -> Configs:
    """Tile shapes per device, head dim and dtype.

    GPU: wgmma needs 64 rows per warpgroup in the first operand (fwd/dq: block_m, dK/dV: block_n). A
    portable baseline picked by the compiler's spill report (tests/test_aot.py), not tuned by timing.
    """
    if device.type != "cuda":
        return _INTERPRETER
    if dtype == torch.float32:  # exact fp32 (no tf32): plain FMA dots, small tiles
        return Configs(TileConfig(64, 32), TileConfig(64, 32), TileConfig(32, 64), TileConfig(64, 32))
    # sm_90 ptxas, bf16 (docs/perf-notes.md, "AOT"): 0 spills at D<=64 and for the D=128 forwards (the
    # persistent one needs 128x32: 296 B at 128x64); the D=128 backward spills least with these (dK/dV
    # 748 B, dQ 32 B); D=256 spills everywhere.
    if head_dim <= 64:
        return Configs(TileConfig(128, 64, 8, 3), TileConfig(128, 64, 8, 3), TileConfig(64, 64, 8, 2),
                       TileConfig(64, 64, 8, 2))
    if head_dim <= 128:
        return Configs(TileConfig(128, 64, 8, 2), TileConfig(128, 32, 8, 2), TileConfig(16, 64, 4, 2),
                       TileConfig(64, 16, 4, 2))
    return Configs(TileConfig(64, 32, 4, 2), TileConfig(64, 32, 4, 2), TileConfig(32, 64, 4, 1),
                   TileConfig(64, 32, 4, 1))


def _dot_mode(dtype: torch.dtype) -> str:
    """See DOT in kernels/common.py."""
    if dtype == torch.float32:
        return "ieee"
    return "upcast" if dtype == torch.bfloat16 and interpreting() else "tf32"  # tf32: no-op for 16-bit


def _block_d(head_dim):
    return max(16, triton.next_power_of_2(head_dim))


def _common(q, k, head_dim):
    return dict(GROUP=q.shape[1] // k.shape[1], D=head_dim, BLOCK_D=_block_d(head_dim), DOT=_dot_mode(q.dtype))


# Forward schedule: "grid" (one program per tile and head) or "persistent" (one program per SM over a
# load-balanced jfa.schedule). "grid" stays the default until the H200 measures the persistent one
# (docs/perf-notes.md); JFA_TRITON_FWD_SCHEDULE=persistent selects it for that measurement.
FWD_SCHEDULE = os.environ.get("JFA_TRITON_FWD_SCHEDULE", "grid")
_SCHEDULES = ScheduleCache()


def forward(q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast, schedule=None):
    """-> (out [rows, Hq, D], lse [Hq, rows] float32). q_offsets give the output rows (b*Lq in broadcast)."""
    batch = kv_offsets.numel() - 1
    rows = batch * q.shape[0] if broadcast else q.shape[0]
    hq, head_dim = q.shape[1], q.shape[2]
    out = torch.empty(rows, hq, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(hq, rows, dtype=torch.float32, device=q.device)
    if rows == 0 or batch == 0:
        return out, lse
    schedule = schedule or FWD_SCHEDULE
    cfgs = configs(q.device, head_dim, q.dtype)
    cfg = cfgs.fwd_persistent if schedule == "persistent" else cfgs.fwd
    lk, rk = kernel_window(left, right)
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
               out.stride(0), out.stride(1), lse.stride(0))
    meta = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BROADCAST=broadcast, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages, **_common(q, k, head_dim))
    kernels = kernels_for(q.device)
    if schedule == "persistent":
        sms = num_sms(q.device)
        sched = _SCHEDULES.get(q_offsets, kv_offsets, rows, hq, cfg.block_m, cfg.block_n, left, right, sms)
        kernels.attention_fwd_persistent_kernel[(sms,)](
            q, k, v, out, lse, q_offsets, kv_offsets, sched.tiles, sched.order, sched.sm_start, *strides,
            sched.tiles.shape[1], hq, scale * math.log2(math.e), lk, rk, **meta)
    elif schedule == "grid":
        tiles = tile_table(q_offsets, cfg.block_m, rows)
        kernels.attention_fwd_kernel[(tiles.shape[1], hq)](
            q, k, v, out, lse, q_offsets, kv_offsets, tiles, *strides,
            tiles.shape[1], scale * math.log2(math.e), lk, rk, **meta)
    else:
        raise ValueError(f"unknown forward schedule {schedule!r}: 'grid' or 'persistent'")
    return out, lse


def backward(dout, dlse, q, k, v, out, lse, q_offsets, kv_offsets, scale, left, right, broadcast, dkdv=None,
             dq_pass=None, fused=None):
    """-> (dq, dk, dv). dlse (the gradient of the returned lse) may be None. dkdv, dq_pass: other
    implementations of the two passes, with bwd_dkdv's and bwd_dq's signatures (the Hopper backward plugs its
    kernels in here); fused: one pass instead of both, bwd_dkdv's signature plus a dq to add into (float32,
    zeroed)."""
    batch = kv_offsets.numel() - 1
    rows = out.shape[0]
    hq, head_dim = q.shape[1], q.shape[2]
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    # Broadcast (and fused): float32 dq (per-sequence partials in broadcast mode, summed over the batch below).
    f32 = broadcast or fused is not None
    dq = torch.empty(rows, hq, head_dim, device=q.device, dtype=torch.float32 if f32 else q.dtype)
    if batch == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    dlse = None if dlse is None else dlse.contiguous()  # read with lse's strides
    delta = bwd_delta(out, dout, dlse, lse)
    args = (q, k, v, dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast)
    if fused is not None:
        dq.zero_()
        if k.shape[0] > 0:
            fused(*args, dk, dv, dq)
    else:
        if k.shape[0] > 0:
            (dkdv or bwd_dkdv)(*args, dk, dv)
        if rows > 0 and k.shape[0] == 0:  # no keys anywhere: every query saw nothing (and TMA needs rows)
            dq.zero_()
        elif rows > 0:
            (dq_pass or bwd_dq)(*args, dq)
    if broadcast:
        dq = dq.view(batch, q.shape[0], hq, head_dim).sum(0)
    return dq.to(q.dtype), dk, dv


def bwd_delta(out, dout, dlse, lse):
    """Delta = rowsum(dO * O) - dLSE, float32 [Hq, rows]."""
    rows, hq, head_dim = out.shape
    delta = torch.empty_like(lse)
    if rows > 0:
        block_t = 64 if out.device.type == "cuda" else 16
        kernels_for(out.device).attention_bwd_preprocess_kernel[(triton.cdiv(rows, block_t), hq)](
            out, dout, dlse if dlse is not None else lse, delta, rows,
            out.stride(0), out.stride(1), dout.stride(0), dout.stride(1), lse.stride(0),
            D=head_dim, BLOCK_D=_block_d(head_dim), BLOCK_T=block_t, HAS_DLSE=dlse is not None)
    return delta


def bwd_dkdv(q, k, v, dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast, dk, dv):
    """The dK/dV pass into dk, dv (one program per key tile and kv head; GQA reduced in registers)."""
    cfg = configs(q.device, q.shape[2], q.dtype).dkdv
    lk, rk = kernel_window(left, right)
    tiles = tile_table(kv_offsets, cfg.block_n, k.shape[0])
    kernels_for(q.device).attention_bwd_dkdv_kernel[(tiles.shape[1], k.shape[1])](
        q, k, v, dout, lse, delta, dk, dv, q_offsets, kv_offsets, tiles,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        dout.stride(0), dout.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), lse.stride(0),
        tiles.shape[1], scale, scale * math.log2(math.e), lk, rk,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BROADCAST=broadcast,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_common(q, k, q.shape[2]))


def bwd_dq(q, k, v, dout, lse, delta, q_offsets, kv_offsets, scale, left, right, broadcast, dq):
    """The dQ pass into dq (per-sequence float32 partials in broadcast mode)."""
    cfg = configs(q.device, q.shape[2], q.dtype).dq
    lk, rk = kernel_window(left, right)
    tiles = tile_table(q_offsets, cfg.block_m, dq.shape[0])
    kernels_for(q.device).attention_bwd_dq_kernel[(tiles.shape[1], q.shape[1])](
        q, k, v, dout, lse, delta, dq, q_offsets, kv_offsets, tiles,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        dout.stride(0), dout.stride(1), dq.stride(0), dq.stride(1), lse.stride(0),
        tiles.shape[1], scale, scale * math.log2(math.e), lk, rk,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BROADCAST=broadcast,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_common(q, k, q.shape[2]))
