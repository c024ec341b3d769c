"""The relative bias's kernel helpers (jfa.bias: the time buckets at their edges, a block's bias and its two-bucket
path, the position gradient by diagonals), each in a small test kernel, run in Triton's interpreter and on the GPU,
against the spec; and those test kernels compiled for sm_90 here, since the interpreter runs a branch on a Python
value that compiled Triton may not (a plain False assigned in a jit function becomes a tensor)."""
import math
import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

import jfa
from jfa import bias as rel

DIVISOR = 0.301

# the time buckets' edges: (divisor, buckets); the last case's top edges are past float32's largest
EDGE_CASES = [(DIVISOR, 129), (1.0, 42), (0.05, 800), (2.0, 50), (0.001, 20000)]  # (0.001: the least divisor)


def _below(x: float) -> float:
    """The integer float32 just below x (an integer float32: what a time difference rounds to)."""
    if x <= 2 ** 24:
        return x - 1
    return float(torch.nextafter(torch.tensor(x, dtype=torch.float32), torch.tensor(-math.inf)))


@pytest.mark.parametrize("divisor,buckets", EDGE_CASES)
def test_time_edges_are_where_the_floor_of_the_log_steps(divisor, buckets):
    """time_edges: edge b is the least integer float32 f with ln(f) / divisor >= b (in double precision, up to its
    rounding), and the spec's bucket is floor(ln(float32(dt)) / divisor) clamped, wherever double precision decides
    it."""
    edges = rel.time_edges(buckets, divisor, torch.device("cpu")).tolist()
    assert len(edges) == buckets and edges == sorted(edges) and edges[0] >= 2
    for b, e in enumerate(edges, 1):
        if math.isinf(e):
            assert b * divisor > 88
            continue
        assert math.log(e) / divisor >= b * (1 - 1e-14), (b, e)
        assert math.log(_below(e)) / divisor < b * (1 + 1e-14), (b, e)
    g = torch.Generator().manual_seed(0)
    dt = torch.cat([torch.arange(1, 3000), torch.randint(1, 1 << 62, (20000, ), generator=g)])
    _, got = rel.indices(1, dt.numel(), torch.zeros(1, dtype=torch.int64), dt, 0, buckets + 1, divisor, "cpu")
    x = torch.log(dt.float().double()) / divisor
    decided = (x - x.round()).abs() > 1e-9
    want = x.floor().clamp(0, buckets).long()
    assert torch.equal(got[0][decided], want[decided])
    _, none = rel.indices(1, dt.numel(), torch.zeros(1, dtype=torch.int64), dt, 0, 1, divisor, "cpu")
    assert not none.any()  # (one time entry: every pair reads it)


@triton.jit
def _time_buckets(bias, out, n, BLOCK: tl.constexpr, FAST: tl.constexpr):
    """The kernels' time bucket (bias._bucket) of pairs (row 0, key j): q_times[0] - k_times[j] = the dt."""
    j = tl.arange(0, BLOCK)[None, :]
    te = rel._bucket(rel._dt(tl.load(bias[6]), tl.load(bias[7] + j, mask=j < n, other=0)), bias, FAST)
    tl.store(out + j, te, mask=j < n)


# the kernel tests' two runs: Triton's interpreter (exact logarithm), the GPU (MUFU.LG2: jfa.bias._log2's FAST)
ON_DEVICES = pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.interpreter),
                                                pytest.param("cuda", marks=pytest.mark.gpu)])


@ON_DEVICES
@pytest.mark.parametrize("divisor,buckets", EDGE_CASES + [(DIVISOR, 0)])
def test_kernels_time_buckets_are_the_specs_at_every_edge(divisor, buckets, device):
    """The kernels' time bucket of a dt at each edge, one float32 below it and an integer either side of each
    equals the spec's (a float32 logarithm alone flips many of these: at edge 60 of 0.301, ln(dt) moves 1.5e-8
    from one float32 to the next)."""
    edges = [e for e in rel.time_edges(buckets, divisor, torch.device("cpu")).tolist() if e < 2 ** 62]
    points = [int(x) for e in edges for x in (e, _below(e))]
    dt = torch.tensor(sorted({p + d for p in points for d in (-1, 0, 1)} | set(range(1, 64))), dtype=torch.int64)
    q_times = torch.zeros(1, dtype=torch.int64, device=device)
    table = torch.zeros(buckets + 1, device=device)
    tables = rel.check(jfa.RelativeBias(None, table, q_times, -dt.to(device), divisor), torch.zeros(1, 1, 8,
                       device=device), torch.zeros(dt.numel(), 1, 8, device=device), False, False, 1.0)
    got = torch.full((dt.numel(), ), -1, dtype=torch.int32, device=device)
    _time_buckets[(1, )](rel.group(tables, 1.0), got, dt.numel(), BLOCK=triton.next_power_of_2(dt.numel()),
                         FAST=device == "cuda")
    _, want = rel.indices(1, dt.numel(), q_times.cpu(), -dt, 0, buckets + 1, divisor, "cpu")
    assert want[0].max() == len(edges)
    assert torch.equal(got.cpu().long(), want[0])


@triton.jit
def _bias_block(bias, out, uniform, dtime, lq, lk, M: tl.constexpr, N: tl.constexpr, TRANSPOSED: tl.constexpr,
                FAST: tl.constexpr):
    """One block of pairs (queries [0, M), keys [0, N) of one sequence, head 0): rel.block's values into out [M, N],
    whether its queries took one time entry each, and add_grads of ones into dtime (its pairs' count a bucket);
    TRANSPOSED: the pairs as the dK/dV kernels pass them (keys on the rows)."""
    if TRANSPOSED:
        i = tl.arange(0, M)[None, :]
        j = tl.arange(0, N)[:, None]
    else:
        i = tl.arange(0, M)[:, None]
        j = tl.arange(0, N)[None, :]
    pairs = (i + (lk - lq), j, i, j, i < lq, j < lk)
    tl.store(out + i * N + j, rel.block(bias, 0, pairs, FAST))
    _, one, _, _ = rel._time_block(bias, pairs, 0 if TRANSPOSED else 1, FAST)
    tl.store(uniform, one.to(tl.int32))
    rel.add_grads(bias, 0, pairs, tl.full(pairs[0].shape, 1.0, tl.float32) + 0.0 * j, FAST)


# bucket 46's edge (0.301): queries whose keys' differences reach it or stop short of it
_E46 = int(rel.time_edges(128, DIVISOR, torch.device("cpu"))[45])
# (query times, key times, whether each query's pairs lie in at most two adjacent buckets): keys a few seconds apart,
# queries days later; the same across an edge; keys a day apart; a query among the keys; keys beyond lk (masked)
# far from the rest, and one query past lq
BLOCK_CASES = {"one-bucket": ([10 ** 6 + 7 * t for t in range(8)], [1000 + t for t in range(16)], True),
               "one-edge": ([1000 + _E46 + 3 * t - 12 for t in range(8)], [1000 + t for t in range(16)], True),
               "wide-keys": ([2 * 10 ** 6 + t for t in range(8)], [86400 * t for t in range(16)], False),
               "query-among-keys": ([1000, 1008] + [10 ** 6] * 6, [1000 + t for t in range(16)], False),
               "masked-keys-far": ([10 ** 6] * 8, [1000 + t for t in range(12)] + [10 ** 9] * 4, True)}


@ON_DEVICES
@pytest.mark.parametrize("transposed", [False, True], ids=["query-rows", "key-rows"])
@pytest.mark.parametrize("name", list(BLOCK_CASES))
def test_bias_block_takes_two_buckets_a_query_where_its_keys_allow(name, transposed, device):
    """rel.block and rel.add_grads: a block whose every query sees its keys within two adjacent buckets takes two
    time entries a query and a compare a pair (and two atomics a query); the values and the time table's gradient
    are the spec's either way."""
    q_times, k_times, one = BLOCK_CASES[name]
    lq, lk = (7, 12) if name == "masked-keys-far" else (len(q_times), len(k_times))
    g = torch.Generator().manual_seed(3)
    pos, tim = torch.randn(2 * 16 - 1, generator=g), torch.randn(129, generator=g)  # (buckets past 40: none clamped)
    pos, tim, qt, kt = (x.to(device) for x in (pos, tim, torch.tensor(q_times), torch.tensor(k_times)))
    tables = rel.check(jfa.RelativeBias(pos, tim, qt, kt, DIVISOR), torch.zeros(8, 1, 8, device=device),
                       torch.zeros(16, 1, 8, device=device), False, False, 0.5)
    out, uniform = torch.zeros(8, 16, device=device), torch.zeros(1, dtype=torch.int32, device=device)
    buffers = rel.grad_buffers(tables, device)
    group = rel.group(tables, 0.5, buffers)
    _bias_block[(1, )](group, out, uniform, buffers[1], lq, lk, M=8, N=16, TRANSPOSED=transposed,
                       FAST=device == "cuda")
    _, dtim = rel.grads(buffers)
    assert bool(uniform.item()) == one
    want = rel.matrix(tables, slice(0, lq), slice(0, lk), lq, lk, torch.float32)[0] / 0.5
    torch.testing.assert_close(out[:lq, :lk], want, rtol=0, atol=1e-6)
    _, te = rel.entries(tables, slice(0, lq), slice(0, lk), lq, lk)
    assert torch.equal(dtim[0].cpu(), torch.bincount(te.flatten().cpu(), minlength=129).float())


@triton.jit
def _position_grads(bias, ds, a0, b0, lq, lk, M: tl.constexpr, N: tl.constexpr, TRANSPOSED: tl.constexpr):
    """rel.add_grads of one block of ds [M, N] (queries at positions a0 + i, keys at b0 + j; pairs past lq, lk
    masked), pairs as the dQ pass passes them, or transposed as the dK/dV kernels do."""
    i = tl.arange(0, M)[:, None]
    j = tl.arange(0, N)[None, :]
    x = tl.load(ds + i * N + j)
    if TRANSPOSED:
        i = tl.arange(0, M)[None, :]
        j = tl.arange(0, N)[:, None]
        x = tl.trans(x)
    rel.add_grads(bias, 0, (a0 + i, b0 + j, i, j, i < lq, j < lk), x, False)


# (P, first query's and key's positions, lq, lk): diagonals inside the table; clamped ones; padding rows and keys
DIAGONAL_CASES = {"inside": (100, 40, 10, 32, 64), "clamped": (20, 40, 0, 32, 64), "masked": (100, 0, 30, 27, 50)}


@ON_DEVICES
@pytest.mark.parametrize("transposed", [False, True], ids=["query-rows", "key-rows"])
@pytest.mark.parametrize("name", list(DIAGONAL_CASES))
def test_position_gradient_by_diagonals_is_the_pairs_sum(name, transposed, device):
    """rel.add_grads's position gradient (summed by diagonals where the block allows, else a pair at a time) equals
    the sum of ds over the pairs reading each entry."""
    P, a0, b0, lq, lk = DIAGONAL_CASES[name]
    g = torch.Generator().manual_seed(4)
    ds = torch.randn(32, 64, generator=g).to(device)
    pos = torch.zeros(2 * P - 1, device=device)
    tables = rel.check(jfa.RelativeBias(pos), torch.zeros(1, 1, 8, device=device), torch.zeros(1, 1, 8,
                       device=device), False, False, 1.0)
    dpos = torch.zeros(1, 2 * P - 1, device=device)
    _position_grads[(1, )](rel.group(tables, 1.0, (dpos, None)), ds, a0, b0, lq, lk, M=32, N=64,
                           TRANSPOSED=transposed)
    i, j = torch.arange(32).view(-1, 1), torch.arange(64).view(1, -1)
    entry = ((b0 + j) - (a0 + i)).clamp(1 - P, P - 1) + P - 1
    keep = (i < lq) & (j < lk)
    want = torch.zeros(2 * P - 1, dtype=torch.float64).index_add_(0, entry[keep], ds.cpu().double()[keep])
    torch.testing.assert_close(dpos[0].cpu().double(), want, rtol=1e-5, atol=1e-5)


COMPILE = r"""
import sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from jfa import bias as rel
from jfa.ptxas import aot_signature
sys.path.insert(0, "tests")
import test_bias_helpers as t
pos, tim, times = torch.zeros(1, 31), torch.zeros(1, 129), torch.zeros(16, dtype=torch.int64)
both = rel.Tables(pos, tim, times, times, 0.301)
position = rel.Tables(pos, None, None, None, 0.301)
for transposed in (False, True):
    for fn, args, consts in (
            (t._bias_block, (rel.group(both, 0.5, rel.grad_buffers(both, "cpu")), torch.zeros(128), torch.zeros(1,
             dtype=torch.int32), torch.zeros(1), 8, 16), dict(M=8, N=16, TRANSPOSED=transposed, FAST=True)),
            (t._position_grads, (rel.group(position, 1.0, rel.grad_buffers(position, "cpu")), torch.zeros(2048), 0,
             0, 32, 64), dict(M=32, N=64, TRANSPOSED=transposed))):
        sig, constexprs = aot_signature(fn, args, consts)
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32))
print("compiled")
"""


def test_helper_kernels_compile_for_sm90():
    """The test kernels above, both layouts, compile for sm_90 (no GPU needed): what the GPU runs of them."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    res = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=900,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert res.returncode == 0 and "compiled" in res.stdout, res.stderr[-3000:]
