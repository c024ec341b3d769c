"""What the Hopper kernels share besides their buffers and work items: TMA descriptors over packed jagged tensors,
16-byte row stores, and the aggregates of a kernel's shape and batch.

  Shape          a kernel's compile-time shape: GQA group, tile rows, consumers, modes, score function
  Batch          the jagged batch as the kernels see it: both offsets tensors and the mask's rule (jfa.geometry)
  Rows           a [rows, heads, D] tensor by pointer and strides (O; dK, dV, dQ)
  KvPrefetch     the dK/dV producer's L2 prefetch of a short item's K and V

jfa.hopper.items has the work items (WorkList, Item), jfa.hopper.buffers the shared-memory buffers with their
barriers (Ring, RowStats, ItemOperands) and the protocol they keep.

(No ``from __future__ import annotations`` in a module that defines an aggregate: its fields' annotations must
be types, which the aggregate checks values against.)
"""
import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.core import _aggregate as aggregate  # Gluon 3.6's aggregate (no public name yet)

from ..geometry import Rule, mask_rule

_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}
WG_ROWS = gl.constexpr(64)  # rows of a consumer warpgroup's tile (one wgmma m64 instruction tall)


def tma_descriptor(x: torch.Tensor, block_rows: int, block_cols: int = 0, swizzled: bool = True):
    """A Gluon TMA descriptor over x [rows, H, D] viewed as [rows, H*D], in [block_rows, D] boxes (one head), or
    [block_rows, block_cols] boxes; in shared memory swizzled as the box's default NVMMA layout, else (swizzled
    False) row by row as in global memory.

    A box that runs past a sequence reads the next sequence's rows (the kernels mask them); past the tensor's
    end TMA fills zeros. Needs a 16-byte aligned base (see aligned) and a row stride that is a multiple of 16
    bytes; rows whose H*D elements are not contiguous are copied first. x itself is the descriptor's base (TMA
    takes only its address and dtype from it): building the [rows, H*D] view cost two thirds of a descriptor's
    host time, and every launch builds its descriptors.
    """
    rows, heads, d = x.shape
    if heads > 1 and x.stride(1) != d:
        x = x.contiguous()
    box = (block_rows, block_cols or d)
    return TensorDescriptor(x, [rows, heads * d], [x.stride(0), 1], list(box), _box_layout(box, x.dtype, swizzled))


@functools.lru_cache(maxsize=64)
def _box_layout(box, dtype, swizzled=True):
    """The shared-memory layout of a TMA box (a pure function of its arguments, cached: every launch builds its
    descriptors, and computing the layout was a quarter of their host time)."""
    if not swizzled:
        return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=dtype.itemsize * 8, rank=len(box))
    return gl.NVMMASharedLayout.get_default_for(list(box), _GL_DTYPES[dtype])


def aligned(*tensors):
    """The tensors, each cloned if its base is not 16-byte aligned (TMA's requirement)."""
    return tuple(x if x.data_ptr() % 16 == 0 else x.clone() for x in tensors)


@gluon.jit
def store_rows(base, stride_t, x, r0, start, length, IN_WARPS: gl.constexpr = False):
    """Rows r0.. of a warpgroup's [64, D] result (O, dK or dV), those before `length`, at base + (start + row) *
    stride_t, in 16-byte pieces: straight from the wgmma layout each store would write 4 bytes per thread (16 of
    every row's bytes per warp instruction), which filled L2 with partial-sector writes where items are short, in 4x
    the store instructions. The layout conversion goes through shared memory: IN_WARPS (x in wgmma's layout) within
    each warp (_row_pieces), else through D x 128 bytes of scratch per warpgroup after a warpgroup barrier."""
    HEAD_DIM: gl.constexpr = x.shape[1]
    layout: gl.constexpr = _row_pieces(x.type.shape, IN_WARPS)
    x = gl.convert_layout(x, layout)
    rows = r0 + gl.arange(0, x.shape[0], layout=gl.SliceLayout(1, layout))
    cols = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout)), 0)
    gl.store(base + gl.expand_dims((start + rows).to(gl.int64) * stride_t, 1) + cols, x,
             mask=gl.expand_dims(rows < length, 1))


@constexpr_function
def _row_pieces(shape, IN_WARPS):
    """store_rows' layout: 8 consecutive 16-bit elements (16 bytes) of one row a thread and piece. IN_WARPS: from
    wgmma's layout of [64, N] each warp keeps its 16 rows and each quad of lanes its two rows, so the conversion
    stays inside each warp (a transpose of each quad's 4-byte pairs through 512 bytes of shared memory a warp:
    st.shared, ldmatrix; no warpgroup barrier)."""
    rows, cols = shape
    if IN_WARPS:
        assert rows == 64 and cols % 32 == 0, shape
        registers = [[0, 1], [0, 2], [0, 4], [8, 0]] + [[0, 32 << i] for i in range((cols // 32).bit_length() - 1)]
        return gl.DistributedLinearLayout(reg_bases=registers, lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
                                          warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[rows, cols])
    vec = 8  # 16-bit elements per 16 bytes
    return gl.BlockedLayout([1, vec], [32 // (cols // vec), cols // vec], [4, 1], [1, 0])


@constexpr_function
def mma_layout(n):
    """wgmma's register layout for a consumer warpgroup's [64, n] float32 accumulator."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@aggregate
class Shape:
    """The compile-time shape of one kernel (its config's and the problem's): rows per item and per block of the
    other side, the consumers, the modes and the score function."""
    GROUP: gl.constexpr  # query heads per kv head
    BLOCK_M: gl.constexpr  # query rows per tile (forward, dQ: per item; dK/dV: per (Q, dO) block)
    BLOCK_N: gl.constexpr  # key rows per tile (forward, dQ: per K/V block; dK/dV: per item)
    CONSUMERS: gl.constexpr  # consumer warpgroups
    SERIAL: gl.constexpr  # dK/dV: the MMAs one after another
    BROADCAST: gl.constexpr  # one dense q for every sequence
    SCORE: gl.constexpr  # the score function (jfa.variants.score_fn)

    @constexpr_function
    def __init__(self, GROUP, BLOCK_M, BLOCK_N, CONSUMERS, SERIAL, BROADCAST, SCORE):
        self.GROUP = gl.constexpr(GROUP)
        self.BLOCK_M = gl.constexpr(BLOCK_M)
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.CONSUMERS = gl.constexpr(CONSUMERS)
        self.SERIAL = gl.constexpr(SERIAL)
        self.BROADCAST = gl.constexpr(BROADCAST)
        self.SCORE = gl.constexpr(SCORE)


@aggregate
class Batch:
    """Both offsets tensors and the mask's rule (jfa.geometry.Rule, made once per kernel from the mask group)."""
    q_offsets: gl.tensor
    kv_offsets: gl.tensor
    rule: Rule

    @constexpr_function
    def __init__(self, q_offsets, kv_offsets, rule):
        self.q_offsets = q_offsets
        self.kv_offsets = kv_offsets
        self.rule = rule

    @gluon.jit
    def create(offsets, mask):
        """From the kernels' offsets = (q_offsets, kv_offsets) and mask group (jfa.problem.Problem.mask_args)."""
        return Batch(offsets[0], offsets[1], mask_rule(mask))


@aggregate
class Rows:
    """A [rows, heads, D] tensor a kernel writes or reads by pointer: (pointer, row stride, head stride)."""
    ptr: gl.tensor
    stride_t: gl.tensor
    stride_h: gl.tensor

    @constexpr_function
    def __init__(self, ptr, stride_t, stride_h):
        self.ptr = ptr
        self.stride_t = stride_t
        self.stride_h = stride_h

    @gluon.jit
    def create(x):
        """From the launcher's (pointer, row stride, head stride) (to_tensor: a stride of 1 arrives as a constexpr)."""
        return Rows(x[0], gl.to_tensor(x[1]), gl.to_tensor(x[2]))

    @gluon.jit
    def head(self, h):
        """Head h's row 0."""
        return self.ptr + h * self.stride_h


@gluon.jit
def prefetch_rows(x, row0, n_rows, head, ROWS: gl.constexpr, desc):
    """Rows [row0, row0 + min(n_rows, ROWS)) of head `head` of x (Rows; desc: its TMA descriptor, for the dtype and
    D) into L2: a prefetch a 128-byte line from the one warp of a producer (8 lines a lane for 128 rows at D=128)."""
    HEAD_DIM: gl.constexpr = desc.block_shape[1]
    LINE: gl.constexpr = 1024 // desc.dtype.primitive_bitwidth  # elements a 128-byte line
    LINES: gl.constexpr = HEAD_DIM // LINE
    layout: gl.constexpr = gl.BlockedLayout([1, LINES], [32, 1], [1, 1], [1, 0])
    r = gl.expand_dims(gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout)), 1)
    c = gl.expand_dims(gl.arange(0, LINES, layout=gl.SliceLayout(0, layout)), 0) * LINE
    ptrs = x.head(head) + (row0 + r).to(gl.int64) * x.stride_t + c
    keep = (r + c * 0 < n_rows).to(gl.int32)
    gl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
                              "=r,l,r", [ptrs, keep], dtype=gl.int32, is_pure=False, pack=1)


@aggregate
class KvPrefetch:
    """The dK/dV kernels' producer prefetches a short item's K and V rows into L2 when it takes the item, blocks
    before they have their shared-memory slot: read once, their TMA load would otherwise come from DRAM while the
    consumers wait for it, which is most of a short item's cost. Items that walk more than MAX_ROWS query rows
    skip it (their slot's wait is a small part of them, and prefetching theirs cost self-skewed-8k 1.8%);
    MAX_ROWS = 0 compiles none of it (jfa.hopper.config.DkdvConfig.kv_prefetch_rows)."""
    k: Rows
    v: Rows
    MAX_ROWS: gl.constexpr

    @constexpr_function
    def __init__(self, k, v, MAX_ROWS):
        self.k = k
        self.v = v
        self.MAX_ROWS = gl.constexpr(MAX_ROWS)

    @gluon.jit
    def create(kv, MAX_ROWS: gl.constexpr):
        """kv: the K and V tensors as rows() gives them."""
        return KvPrefetch(Rows.create(kv[0]), Rows.create(kv[1]), MAX_ROWS)

    @gluon.jit
    def item(self, tile, BLOCK_N: gl.constexpr, k_desc, v_desc):
        """tile's keys (an Item of key tiles), if its walk is short."""
        if self.MAX_ROWS > 0:
            short = tile.pre + tile.hi - tile.lo <= self.MAX_ROWS
            n = gl.where(short, tile.kv_len - tile.start, 0)
            k0 = tile.kv_start + tile.start
            prefetch_rows(self.k, k0, n, tile.head, BLOCK_N, k_desc)
            prefetch_rows(self.v, k0, n, tile.head, BLOCK_N, v_desc)


def rows(x):
    """A [rows, heads, D] tensor as the kernels take it (Rows.create): (pointer, row stride, head stride)."""
    return (x, x.stride(0), x.stride(1))
