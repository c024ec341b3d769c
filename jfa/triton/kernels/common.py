"""The portable kernels' matmul and their tile of the tile table (the jagged geometry they share with every kernel
is jfa.geometry).

  DOT   "ieee" (fp32 inputs), "tf32" (16-bit inputs: tensor cores), or "upcast" (bf16 in Triton's interpreter,
        whose bf16 dot is wrong in 3.6: operands go to fp32, exact for bf16 products)
"""
import triton
import triton.language as tl

from ...geometry import mask_rule, sequence, sequence_bounds


@triton.jit
def mma(a, b, FORM: tl.constexpr):
    """tl.dot with float32 accumulation; see DOT above (FORM.dot: jfa.triton.launch.Form)."""
    DOT: tl.constexpr = FORM.dot
    if DOT == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=DOT)


@triton.jit
def key_rows(o_n, table, PAGE: tl.constexpr, m_n):
    """Rows of k and v that hold keys o_n of the current sequence: o_n itself (packed: k and v based at the
    sequence's first key), or paged (table: the sequence's row of the page table, PAGE rows a page) page * PAGE +
    o_n % PAGE from the pool's first row (keys outside m_n read page 0)."""
    if table is None:
        return o_n
    else:
        page = tl.load(table + o_n // PAGE, mask=m_n, other=0)
        return page.to(tl.int64) * PAGE + o_n % PAGE


@triton.jit
def tile_of(seq_id, tiles, offsets, mask, BLOCK: tl.constexpr):
    """Program i_tile's tile of the tile table (a real one: seq_id = tiles[0][i_tile] >= 0), of BLOCK rows: (its
    first row, q_start, kv_start, (Lq, Lk), the mask's rule and the sequence as jfa.geometry takes them)."""
    start = tl.load(tiles[0] + tiles[1] + tl.program_id(0)) * BLOCK
    q_start, kv_start, lens = sequence_bounds(offsets[0], offsets[1], seq_id)
    rule = mask_rule(mask)
    return start, q_start, kv_start, lens, rule, sequence(seq_id, lens, rule)
