"""The attention problem, described once.

jfa.api builds one ``Problem`` per call, after jfa.checks has validated the inputs; everything below it takes the
problem whole: the custom op (jfa.op, which flattens it into its fields only because torch.library needs plain
arguments, its schema made from the fields), the backends, the FLOP counter (jfa.flops) and the bench. A new kind
of attention adds its fields here, with their defaults meaning "as before", and reads them where it acts.

Fields are the tensors first (q, k, v lead: the op returns their gradients in field order), then what the mask and
the score need, then what the caller knows about the lengths, then how to run it.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Optional

from torch import Tensor


@dataclass(frozen=True, eq=False)
class Problem:
    q: Tensor  # [Tq, Hq, D] packed, or [Lq, Hq, D] dense in broadcast mode
    k: Tensor  # [Tk, Hkv, D], Hq % Hkv == 0
    v: Tensor  # [Tk, Hkv, D]
    q_offsets: Tensor  # [B+1] rows of the output (b * Lq in broadcast mode); kv_offsets itself in self-attention
    kv_offsets: Tensor  # [B+1]
    scale: float  # of the scores q . k
    left: int  # the window in jfa.jagged.resolve_window's form (an unbounded side is jfa.jagged.UNBOUNDED)
    right: int
    broadcast: bool = False  # one dense q block attended by every kv sequence
    activation: str = "softmax"  # or one of jfa.variants.ACTIVATIONS' names: out_i = c_i sum_j f(scale q_i . k_j) v_j
    out_scale: float = 1.0  # c_i with an activation: this, times row_scale[i] if given
    row_scale: Optional[Tensor] = None  # [rows] float32, one factor per output row (with an activation)
    num_targets: Optional[Tensor] = None  # [B] int: each sequence's last targets see the history and themselves
    contextual_len: int = 0  # HSTU's contextual prefix (with num_targets: jfa.jagged.target_mask)
    min_full_attn_len: int = 0  # HSTU's rows past the window's reach (jfa.jagged.target_mask's F)
    bias_position: Optional[Tensor] = None  # a relative bias's tables (jfa.bias: Tables, each [Hq, L] float32, a
    bias_time: Optional[Tensor] = None  # shared one expanded) and the rows' times (int64 [Tq], [Tk]); the op returns
    q_times: Optional[Tensor] = None  # the tables' gradients after q's, k's and v's
    k_times: Optional[Tensor] = None
    time_divisor: float = 0.301
    page_table: Optional[Tensor] = None  # [B, pages] int32: paged k/v (serving, forward only): key j of sequence b
    page_size: int = 0  # at row page_table[b, j // page_size] * page_size + j % page_size (jfa.jagged.paged_rows)
    max_q_len: Optional[int] = None  # the caller's bounds on the lengths (or None): they never change a result,
    max_kv_len: Optional[int] = None  # and the hopper backward skips work by max_kv_len
    backend: str = "reference"  # a name of jfa.backends.BACKENDS
    deterministic: bool = False  # the backward gives the same bits run to run

    # ---- derived (nothing below is stored)
    @property
    def batch(self) -> int:
        return self.kv_offsets.shape[0] - 1

    @property
    def rows(self) -> int:
        """Output rows: Tq, or B * Lq in broadcast mode."""
        return self.batch * self.q.shape[0] if self.broadcast else self.q.shape[0]

    @property
    def heads(self) -> int:
        return self.q.shape[1]

    @property
    def heads_kv(self) -> int:
        return self.k.shape[1]

    @property
    def group(self) -> int:
        """Query heads per kv head (GQA)."""
        return self.q.shape[1] // self.k.shape[1]

    @property
    def head_dim(self) -> int:
        return self.q.shape[2]

    @property
    def softmax(self) -> bool:
        return self.activation == "softmax"

    @property
    def lse_rows(self) -> int:
        """Columns of the returned lse [Hq, lse_rows]: the output rows with softmax, none with an activation."""
        return self.rows if self.softmax else 0

    @property
    def targets(self) -> bool:
        """HSTU's mask (num_targets, contextual_len) in place of the window's."""
        return self.num_targets is not None

    @property
    def scales(self):
        """The rows' out scale c: a float, or a [rows] tensor (row_scale times out_scale)."""
        return self.out_scale if self.row_scale is None else self.row_scale * self.out_scale

    @property
    def self_attention(self) -> bool:
        """One offsets tensor for both sides, as self-attention's callers pass it."""
        return self.q_offsets is self.kv_offsets

    def mask_scalars(self) -> tuple:
        """The mask's scalar parameters: the window (left, right), HSTU's contextual prefix and its rows that see the
        whole history (jfa.geometry.mask_group)."""
        return self.left, self.right, self.contextual_len, self.min_full_attn_len

    @property
    def paged(self) -> bool:
        """k and v are a page pool read through page_table; kv_offsets count each sequence's keys."""
        return self.page_table is not None

    @property
    def last_rows(self) -> bool:
        """HSTU's mask in cross-attention: each sequence's queries are its last rows (serving)."""
        return self.targets and not self.self_attention

    def page_args(self):
        """The forward kernels' page group: None (k and v packed by kv_offsets), or (page_table, its row stride, PAGE:
        rows per page, a constexpr) for paged k and v."""
        if not self.paged:
            return None
        import triton.language as tl
        return (self.page_table, self.page_table.stride(0), tl.constexpr(self.page_size))

    def key_rows_bound(self) -> int:
        """At least the batch's keys, from shapes alone: k's rows, or for paged k/v what the page table holds."""
        return self.page_table.numel() * self.page_size if self.paged else self.k.shape[0]

    def mask_args(self, fold_right: bool = False) -> tuple:
        """The kernels' mask group (jfa.geometry.mask_group, fold_right as there: jfa.geometry.mask_rule reads it)."""
        from .geometry import mask_group
        return mask_group(self.num_targets, self.mask_scalars(), self.last_rows, fold_right)

    @property
    def bias(self):
        """The relative bias's jfa.bias.Tables, or None."""
        if self.bias_position is None and self.bias_time is None:
            return None
        from .bias import Tables
        return Tables(self.bias_position, self.bias_time, self.q_times, self.k_times, self.time_divisor)

    def bias_args(self, grads=None):
        """The kernels' bias group (jfa.bias.group): None without a bias; grads = (dposition, dtime) buffers."""
        from .bias import group
        return group(self.bias, self.scale, grads)

    def replace(self, **changes) -> "Problem":
        return dataclasses.replace(self, **changes)

    def flat(self) -> tuple:
        """The fields' values in order: the op's arguments."""
        return tuple(getattr(self, name) for name in FIELDS)

    def host_key(self) -> tuple:
        """Everything about the problem but its tensors' values: the fields that are not tensors, each tensor field's
        shape and dtype (None where it is not given), the device, and whether one offsets tensor serves both sides.
        What a backend decides on the host (kernel configs, schedule specs, compile-time arguments) is a function of
        it, and may be cached by it."""
        return (self.q.device, self.q_offsets is self.kv_offsets, *[getattr(self, name) for name in _SCALARS],
                *[None if (t := getattr(self, name)) is None else (t.shape, t.dtype) for name in TENSOR_FIELDS])


FIELDS = tuple(f.name for f in dataclasses.fields(Problem))
TYPES = typing.get_type_hints(Problem)  # real types (this module's annotations are strings): the op's schema
DEFAULTS = tuple(f.default for f in dataclasses.fields(Problem) if f.default is not dataclasses.MISSING)
IS_TENSOR = tuple(TYPES[name] in (Tensor, Optional[Tensor]) for name in FIELDS)
TENSOR_FIELDS = tuple(name for name, is_tensor in zip(FIELDS, IS_TENSOR) if is_tensor)
_SCALARS = tuple(name for name, is_tensor in zip(FIELDS, IS_TENSOR) if not is_tensor)


def from_flat(args) -> Problem:
    """A Problem from the op's arguments (trailing defaults may be left out, as a direct caller of the op may)."""
    return Problem(*args)


def filled(args) -> tuple:
    """The op's arguments with the trailing defaults a caller left out filled in."""
    missing = len(FIELDS) - len(args)
    return tuple(args) + (DEFAULTS[len(DEFAULTS) - missing:] if missing else ())
