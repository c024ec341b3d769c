"""The one pass's permuted float32 dQ accumulator (jfa.hopper.dq_reduce: from 64-row blocks each chunk is staged in
Gluon's SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8) and copied to global memory as it lies) undone by
dq_from_acc, on the CPU (Triton's interpreter): against a model of that layout's addressing, on awkward lengths."""
import pytest
import torch

from jfa.hopper import dq_reduce
from jfa.hopper.dq_reduce import dq_from_acc
from jfa.testing import offsets_of

pytestmark = pytest.mark.interpreter

BLOCK_M = 64  # the rows of a (Q, dO) block: every block starts at a multiple of it from its sequence's first row


def _staged(dq: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """What the TMA reduce-adds leave in global memory for dQ [rows, H, D]: each row's DQ_COLS-column chunks as a
    consumer wrote them into the staging tile, element (r, c) of a block at r * DQ_COLS + ((c // vec) ^ ((r //
    per_phase) % max_phase)) * vec + c % vec (Triton's swizzled shared layout), r the row within its block."""
    rows, cols = dq.shape[0], dq_reduce.DQ_COLS.value
    flat = dq.reshape(rows, -1, cols)
    r = (torch.arange(rows) - starts) % BLOCK_M
    c = torch.arange(cols)
    vec, per_phase, max_phase = dq_reduce.XOR_GROUP.value, 1, dq_reduce.XOR_PHASES.value
    dest = ((c[None, :] // vec) ^ ((r[:, None] // per_phase) % max_phase)) * vec + c[None, :] % vec
    out = torch.empty_like(flat)
    out.scatter_(2, dest[:, None, :].expand_as(flat), flat)
    return out.reshape(dq.shape)


def _starts(lengths) -> torch.Tensor:
    """Each row's sequence's first row."""
    return torch.cat([torch.full((n, ), s, dtype=torch.int64) for s, n in zip(offsets_of(lengths).tolist(), lengths)]
                     + [torch.zeros(0, dtype=torch.int64)])


@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("lengths", [[0, 1, 63, 65, 129, 0, 200], [1], [0, 0, 7]])
def test_dq_from_acc_undoes_the_staged_layout(lengths, d, offsets_dtype):
    gen = torch.Generator().manual_seed(d + len(lengths))
    dq = torch.randn(sum(lengths), 3, d, generator=gen)
    acc = _staged(dq, _starts(lengths))
    if max(lengths) > 1:
        assert not torch.equal(acc, dq)  # (the model permutes something: a block's rows past its first)
    offsets = offsets_of(lengths, dtype=offsets_dtype)
    # float32 out: exact on every machine (the interpreter rounds float32 to bf16 toward zero, the GPU to nearest;
    # the bf16 and fp16 casts run on the GPU in tests/test_hopper.py's backward tests)
    torch.testing.assert_close(dq_from_acc(acc, offsets, torch.float32), dq, rtol=0, atol=0)
    # added into a tensor (a mixed batch's class: jfa.hopper._backward_by_class)
    into = torch.randn(dq.shape, generator=gen)
    got = dq_from_acc(acc, offsets, torch.float32, into=into.clone())
    torch.testing.assert_close(got, into + dq, rtol=0, atol=0)
    # grad_scale applied as it casts (the blocks stage dQ without it: jfa.hopper.bwd_block.staged_dq); a power of
    # two keeps the products exact
    torch.testing.assert_close(dq_from_acc(acc, offsets, torch.float32, 0.125), dq * 0.125, rtol=0, atol=0)
    got = dq_from_acc(acc, offsets, torch.float32, 0.125, into=into.clone())
    torch.testing.assert_close(got, into + dq * 0.125, rtol=0, atol=0)


def test_dq_from_acc_of_broadcast_slab():
    """Broadcast q's slab: one sequence of Lq rows from row 0 (no offsets)."""
    dq = torch.randn(131, 2, 128, generator=torch.Generator().manual_seed(3))
    acc = _staged(dq, torch.zeros(131, dtype=torch.int64))
    torch.testing.assert_close(dq_from_acc(acc, None, torch.float32), dq, rtol=0, atol=0)
    torch.testing.assert_close(dq_from_acc(acc, None, torch.float32, 0.5), dq * 0.5, rtol=0, atol=0)
