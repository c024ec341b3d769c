"""Input validation for the public functions: a clear ValueError/TypeError naming the argument, never a wrong
answer or a crash deep in a kernel. Inputs are never modified in place.

Checks that need the offsets' values (start at 0, non-decreasing, end at the row count, max lengths) cost a
host sync when the offsets live on a GPU. They run in eager mode, except when the caller passed both
``max_q_len`` and ``max_kv_len`` for GPU offsets (the caller asked for a sync-free call: the offsets are then
trusted, as FlashAttention's varlen functions trust them), and never inside torch.compile tracing or CUDA
graph capture. The kernels take every length from the offsets on the device, so the ``max_*_len`` hints
cannot change a result: a hint smaller than the real maximum raises ValueError when checked.
"""
from __future__ import annotations

import math

import torch

from .variants import SCORE_NAMES

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _tensor(name, x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_qkv(q, k, v, *, dense_q=False):
    """Shapes, dtypes, devices, heads. Returns q, k, v with a unit stride on the head dim (copied if not)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _tensor(name, x)
        if x.dim() != 3:
            layout = "[Lq, Hq, D] (one dense block)" if dense_q and name == "q" else "[T, H, D] (packed jagged)"
            raise ValueError(f"{name} must be 3-D {layout}, got shape {tuple(x.shape)}")
        if x.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {x.dtype}; expected one of float16, bfloat16, float32")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape[:2] != v.shape[:2]:
        raise ValueError(f"k and v must have the same rows and heads, got {tuple(k.shape)} and {tuple(v.shape)}")
    if not (q.shape[2] == k.shape[2] == v.shape[2]):
        raise ValueError(f"head dims differ: q {q.shape[2]}, k {k.shape[2]}, v {v.shape[2]}")
    hq, hkv = q.shape[1], k.shape[1]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"the query heads ({hq}) must be a multiple of the kv heads ({hkv}) (GQA/MQA)")
    # The kernels take any row and head strides but need the head dim contiguous: copy otherwise.
    return tuple(x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))


def check_offsets_meta(name, offsets, device):
    _tensor(name, offsets)
    if offsets.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {offsets.dtype}")
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"{name} must be 1-D [B+1] (B >= 0), got shape {tuple(offsets.shape)}")
    if offsets.device != device:
        raise ValueError(f"{name} is on {offsets.device} but q, k, v are on {device}")


def check_window(causal, window):
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"window must be a pair (left, right), got {window!r}")
    for side, w in zip(("left", "right"), window):
        if isinstance(w, bool) or not isinstance(w, int):
            raise TypeError(f"window {side} must be an int, got {w!r}")
        if w < -1:
            raise ValueError(f"window {side} must be >= -1 (-1 = unbounded), got {w}")


def check_scale(scale, head_dim):
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite float or None, got {scale!r}")
    return float(scale)


def _finite(x: float) -> bool:
    return x == x and abs(x) != math.inf  # (math.isfinite breaks torch.compile's graph)


def check_activation(activation):
    if not isinstance(activation, str) or activation not in SCORE_NAMES:
        raise ValueError(f"unknown activation {activation!r}; expected one of {list(SCORE_NAMES)}")


def check_out_scale(out_scale, activation, rows, device, values=True):
    """-> (out_scale as a float, the per-row tensor or None). values: check a per-row tensor's values too (where the
    offsets' values are checked: a host sync on a GPU)."""
    if isinstance(out_scale, torch.Tensor):
        if activation == "softmax":
            raise ValueError("out_scale scales an activation's output; softmax's rows are normalized (use "
                             "activation=... or scale the output)")
        if out_scale.dtype != torch.float32:
            raise TypeError(f"a per-row out_scale must be float32, got {out_scale.dtype}")
        if out_scale.shape != (rows, ):
            raise ValueError(f"a per-row out_scale must have one value per output row: shape ({rows},), got "
                             f"{tuple(out_scale.shape)}")
        if out_scale.device != device:
            raise ValueError(f"out_scale is on {out_scale.device} but q, k, v are on {device}")
        if values and not bool(torch.isfinite(out_scale).all()):  # (one host sync on a GPU, where values are checked)
            row = int(torch.nonzero(~torch.isfinite(out_scale))[0])
            raise ValueError(f"out_scale[{row}] = {out_scale[row].item()} is not finite: a per-row out scale must be "
                             f"finite (it would spread into the gradients of every key the row sees)")
        return 1.0, out_scale.detach()
    if isinstance(out_scale, bool) or not isinstance(out_scale, (int, float)) or not _finite(out_scale):
        raise TypeError(f"out_scale must be a finite float or a float32 tensor, got {out_scale!r}")
    if activation == "softmax" and out_scale != 1.0:
        raise ValueError("out_scale scales an activation's output; softmax's rows are normalized (use "
                         "activation=... or scale the output)")
    return float(out_scale), None


def check_targets(num_targets, contextual_len, causal, window, broadcast, offsets, min_full_attn_len=0):
    """HSTU's mask's arguments (jfa.jagged.target_mask) -> num_targets as the kernels take it (a contextual prefix
    alone: zero targets), or None. Their values are checked with the offsets' (check_offsets_values: the kv
    offsets', whose sequences the targets count; in cross-attention the queries are each sequence's last rows,
    check_last_rows)."""
    if isinstance(contextual_len, bool) or not isinstance(contextual_len, int):
        raise TypeError(f"contextual_len must be a Python int, got {contextual_len!r}")
    if contextual_len < 0:
        raise ValueError(f"contextual_len must be >= 0 (the rows of each sequence's contextual prefix), got "
                         f"{contextual_len}")
    if isinstance(min_full_attn_len, bool) or not isinstance(min_full_attn_len, int) or min_full_attn_len < 0:
        raise ValueError(f"min_full_attn_len must be a Python int >= 0 (the history's last rows that see all of it), "
                         f"got {min_full_attn_len!r}")
    if min_full_attn_len and not 0 <= window[0]:
        raise ValueError("min_full_attn_len takes HSTU's window=(W, 0) with W >= 0: its rows see past the window (it "
                         f"has no meaning without one), got window={tuple(window)}")
    if num_targets is None and contextual_len == 0 and min_full_attn_len == 0:
        return None
    if broadcast:
        raise ValueError("num_targets / contextual_len are for self-attention over histories, not broadcast q")
    if not causal:
        raise ValueError("num_targets / contextual_len need causal=True (HSTU's mask is causal; window=(W, 0) "
                         "bounds its distance)")
    if window[1] > 0:
        raise ValueError(f"num_targets / contextual_len take window=(W, 0) (W: the distance in HSTU's positions, its "
                         f"max_attn_len; -1 for none): got window={tuple(window)}, whose right side is not 0")
    batch = offsets.numel() - 1
    if num_targets is None:
        return torch.zeros(batch, dtype=offsets.dtype, device=offsets.device)
    _tensor("num_targets", num_targets)
    if num_targets.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"num_targets must be int32 or int64, got {num_targets.dtype}")
    if num_targets.shape != (batch, ):
        raise ValueError(f"num_targets must have one count per sequence: shape ({batch},), got "
                         f"{tuple(num_targets.shape)}")
    if num_targets.device != offsets.device:
        raise ValueError(f"num_targets is on {num_targets.device} but the offsets are on {offsets.device}")
    return num_targets


def check_last_rows(lq, lk):
    """HSTU's mask in cross-attention: each sequence's queries are its last rows (serving: the new rows against the
    cached history and themselves), so no sequence has more queries than keys (lq, lk: the lengths on the host,
    check_offsets_values'). (Where the offsets' values are not checked, such a sequence's results are
    unspecified.)"""
    bad = lq > lk
    if bad.any():
        b = int(torch.nonzero(bad)[0])
        raise ValueError(f"num_targets / contextual_len in cross-attention take each sequence's last rows as queries "
                         f"(HSTU's cached attention): sequence {b} has {lq[b].item()} queries but {lk[b].item()} keys")


def check_pages(page_table, page_size, q, k, v, kv_offsets, one_offsets) -> int:
    """Paged k/v's arguments (jfa.jagged_attention: page_table, page_size) -> page_size as the Problem takes it (0:
    not paged). Forward only: serving reads a cache; nothing may want a gradient through it."""
    if page_table is None:
        if page_size is not None:
            raise ValueError("page_size is paged k/v's: give page_table too")
        return 0
    if one_offsets:
        raise ValueError("paged k/v take kv_offsets of their own (cross-attention: the new rows' queries against "
                         "the cached keys), not self-attention or broadcast q")
    _tensor("page_table", page_table)
    if page_table.dtype != torch.int32 or page_table.dim() != 2:
        raise TypeError(f"page_table must be int32 [B, pages], got {page_table.dtype} of shape "
                        f"{tuple(page_table.shape)}")
    if page_table.shape[0] != kv_offsets.numel() - 1 or page_table.device != q.device:
        raise ValueError(f"page_table must have one row per sequence ({kv_offsets.numel() - 1}) on {q.device}, got "
                         f"shape {tuple(page_table.shape)} on {page_table.device}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise TypeError(f"page_size must be a positive Python int (rows per page), got {page_size!r}")
    if k.shape[0] % page_size:
        raise ValueError(f"k and v must be a pool of whole pages: {k.shape[0]} rows is not a multiple of page_size "
                         f"{page_size}")
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise ValueError("paged k/v are forward only (serving a cache): call under torch.no_grad(), or with "
                         "tensors that need no gradient")
    return page_size


def check_page_values(page_table, page_size, pool_rows, lens):
    """Every sequence fits its row of the page table, and the pages it reads lie in the pool (lens: the sequences'
    key counts on the host, check_offsets_values'; the table's copy is one host sync)."""
    table = page_table.cpu().long()
    room = table.shape[1] * page_size
    if (lens > room).any():
        b = int(torch.nonzero(lens > room)[0])
        raise ValueError(f"sequence {b} has {lens[b].item()} keys but its page table row holds {room} "
                         f"({table.shape[1]} pages of {page_size})")
    used = torch.arange(table.shape[1]).view(1, -1) * page_size < lens.view(-1, 1)
    pages = pool_rows // page_size
    bad = used & ((table < 0) | (table >= pages))
    if bad.any():
        b, i = (int(x) for x in torch.nonzero(bad)[0])
        raise ValueError(f"page_table[{b}, {i}] = {table[b, i].item()} is not a page of the pool (0 to {pages - 1})")


def check_softmax_heads(num_softmax_heads, q, k, activation, rel_bias):
    """num_softmax_heads (HSTU's): the first query heads take softmax, the rest the activation."""
    if isinstance(num_softmax_heads, bool) or not isinstance(num_softmax_heads, int):
        raise TypeError(f"num_softmax_heads must be a Python int, got {num_softmax_heads!r}")
    if not 0 <= num_softmax_heads <= q.shape[1]:
        raise ValueError(f"num_softmax_heads must be in [0, {q.shape[1]}] (the query heads), got {num_softmax_heads}")
    if num_softmax_heads == 0:
        return
    if activation == "softmax":
        raise ValueError("num_softmax_heads: the first heads take softmax in place of the activation the rest take; "
                         "with activation='softmax' every head does")
    group = q.shape[1] // k.shape[1]
    if num_softmax_heads % group:
        raise ValueError(f"num_softmax_heads must be a multiple of the GQA group ({group} query heads a kv head): a "
                         f"kv head serves one score function, got {num_softmax_heads}")
    if rel_bias is not None:
        raise ValueError("num_softmax_heads does not take a relative bias (rel_bias) yet")


def check_return_lse(return_lse, activation):
    if return_lse and activation != "softmax":
        raise ValueError(f"return_lse=True: an lse is softmax's; activation={activation!r} has none")


def check_max_len(name, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise TypeError(f"{name} must be a non-negative Python int or None, got {value!r}")


def _tracing() -> bool:
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def offsets_values_checked(offsets_list, hints_given: bool) -> bool:
    """Whether the value checks run (see module doc)."""
    if _tracing():
        return False
    on_gpu = any(o.device.type != "cpu" for o in offsets_list)
    return not (on_gpu and hints_given)


def check_offsets_values(name, offsets, rows, rows_name, hints=(), num_targets=None, contextual_len=0):
    """Start 0, non-decreasing, end == rows (None: unchecked), and each (hint_name, value) in hints (when the value
    is given) >= the longest sequence; num_targets (a tensor) between 0 and each sequence's length; a contextual
    prefix no longer than any non-empty sequence. One host sync for GPU offsets, however many hints. Returns the
    sequences' lengths on the host (int64), for the checks that follow."""
    o, t = offsets.detach().to(torch.int64), None
    if isinstance(num_targets, torch.Tensor) and num_targets.shape == (o.numel() - 1, ) and \
            num_targets.device == o.device:  # (one copy to the host; anything else is check_targets' error)
        o, t = torch.cat([o, num_targets.detach().to(torch.int64)]).cpu().split([o.numel(), o.numel() - 1])
    o = o.cpu()
    if t is not None:
        bad = (t < 0) | (t > o[1:] - o[:-1])
        if bad.any():
            b = int(torch.nonzero(bad)[0])
            raise ValueError(f"num_targets[{b}] = {t[b].item()} is not between 0 and the length of sequence {b} "
                             f"({(o[b + 1] - o[b]).item()})")
    if o[0].item() != 0:
        raise ValueError(f"{name} must start at 0, got {o[0].item()}")
    lens = o[1:] - o[:-1]
    if (lens < 0).any():
        b = int(torch.nonzero(lens < 0)[0])
        raise ValueError(f"{name} must be non-decreasing; {name}[{b + 1}] = {o[b + 1].item()} < "
                         f"{name}[{b}] = {o[b].item()}")
    if rows is not None and o[-1].item() != rows:  # (None: paged k/v, whose pool has rows of its own)
        raise ValueError(f"{name} must end at the number of rows of {rows_name} ({rows}), got {o[-1].item()}")
    if isinstance(contextual_len, int) and contextual_len > 0:
        short = (lens > 0) & (lens < contextual_len)
        if short.any():
            b = int(torch.nonzero(short)[0])
            raise ValueError(f"contextual_len={contextual_len} is longer than sequence {b} ({lens[b].item()} rows): "
                             f"a contextual prefix is part of every sequence")
    longest = int(lens.max()) if lens.numel() else 0
    for hint_name, value in hints:
        if value is not None and value < longest:
            raise ValueError(f"{hint_name}={value} is smaller than the longest sequence in {name} ({longest})")
    return lens
