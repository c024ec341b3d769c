"""The relative attention bias (#39, jfa.bias): HSTU's position and time buckets inside the score, with the tables'
gradients. The spec (jfa.bias.matrix) against HSTU's module written out here; the reference's explicit backward
(the tables' gradients included) against autograd through its forward, in float64; the portable Triton kernels (in
Triton's interpreter) against the float64 reference; the checks' errors. The kernels' helpers: test_bias_helpers.py."""
import math

import pytest
import torch
import torch.nn.functional as F

import jfa
from jfa import bias as rel
from jfa import peers, reference
from jfa.testing import allowed_error, offsets_of

DIVISOR = 0.301


def times_away_from_edges(lengths, divisor=DIVISOR, seed=0):
    """Increasing int64 timestamps [T] per sequence whose every pair's log(|dt|) / divisor lies at least 1e-3 from a
    bucket edge (HSTU's module buckets in float32, the spec exactly: only a pair at an edge may differ)."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for n in lengths:
        while True:
            t = torch.cumsum(torch.randint(1, 20000, (n, ), generator=g), 0)
            dt = (t.view(-1, 1) - t.view(1, -1)).abs().clamp(min=1).double()
            x = torch.log(dt) / divisor
            near = ((x - x.round()).abs() < 1e-3) & (dt > 1)
            if not near.any():
                break
        parts.append(t)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)


def hstu_module_bias(pos_w, ts_w, timestamps, n, divisor=DIVISOR):
    """HSTU's RelativeBucketedTimeAndPositionBasedBias on a dense [B, N] batch of timestamps, as its module builds it:
    the position table laid out by pad-repeat-reshape (row i, column j reads pos_w[N - 1 + j - i]) and the time
    buckets of (next item's timestamp, the last repeating its own) minus each key's."""
    b = timestamps.shape[0]
    t = F.pad(pos_w[:2 * n - 1], [0, n]).repeat(n)
    t = t[..., :-n].reshape(1, n, 3 * n - 2)
    r = (2 * n - 1) // 2
    ext = torch.cat([timestamps, timestamps[:, n - 1:n]], dim=1)
    buckets = (torch.log((ext[:, 1:].unsqueeze(2) - ext[:, :-1].unsqueeze(1)).abs().clamp(min=1)) / divisor).long()
    buckets = torch.clamp(buckets, min=0, max=ts_w.shape[0] - 1)
    return t[:, :, r:-r] + torch.index_select(ts_w, 0, buckets.view(-1)).view(b, n, n)


def test_the_spec_is_hstus_module():
    """jfa.RelativeBias.hstu's bias matrix per sequence equals HSTU's module's on full-length sequences."""
    b, n, nb = 3, 24, 12
    g = torch.Generator().manual_seed(1)
    pos_w, ts_w = torch.randn(2 * n - 1, generator=g), torch.randn(nb + 1, generator=g)
    ts = times_away_from_edges([n] * b)
    offsets = offsets_of([n] * b)
    want = hstu_module_bias(pos_w, ts_w, ts.view(b, n), n)
    bias = jfa.RelativeBias.hstu(pos_w, ts_w, ts, offsets)
    tables = rel.check(bias, torch.zeros(b * n, 1, 8), torch.zeros(b * n, 1, 8), False, True, 1.0)
    for s in range(b):
        rows = slice(s * n, (s + 1) * n)
        got = rel.matrix(tables, rows, rows, n, n, torch.float32)[0]
        torch.testing.assert_close(got, want[s], rtol=0, atol=0)


def test_hstu_attention_with_the_bias_is_hstus_formula():
    """jfa's silu attention with HSTU's bias = HSTU's padded formula silu(alpha q.k + bias) / N with its module's bias
    (full-length sequences, causal), forward and the tables' gradients."""
    b, n, h, d, nb = 2, 20, 2, 16, 10
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(b * n, h, d, generator=g, dtype=torch.float64) for _ in range(3))
    pos_w = torch.randn(2 * n - 1, generator=g, dtype=torch.float64).float().requires_grad_()
    ts_w = torch.randn(nb + 1, generator=g, dtype=torch.float64).float().requires_grad_()
    ts = times_away_from_edges([n] * b, seed=2)
    offsets = offsets_of([n] * b)
    alpha = 1.0 / math.sqrt(d)
    bias = jfa.RelativeBias.hstu(pos_w, ts_w, ts, offsets)
    out = jfa.jagged_attention(q.float(), k.float(), v.float(), offsets, causal=True, activation="silu",
                               out_scale=1.0 / n, rel_bias=bias, backend="reference")
    qd, kd, vd = (x.view(b, n, h, d) for x in (q, k, v))
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    scores = torch.einsum("bxhd,byhd->bhxy", qd, kd) * alpha + hstu_module_bias(pos_w.double(), ts_w.double(),
                                                                                  ts.view(b, n), n).unsqueeze(1)
    want = torch.einsum("bhxy,byhd->bxhd", F.silu(scores) / n * mask, vd).reshape(b * n, h, d)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-6)
    dout = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, (pos_w, ts_w), dout)
    pos_d, ts_d = pos_w.detach().double().requires_grad_(), ts_w.detach().double().requires_grad_()
    scores = torch.einsum("bxhd,byhd->bhxy", qd, kd) * alpha + hstu_module_bias(pos_d, ts_d, ts.view(b, n),
                                                                                  n).unsqueeze(1)
    want = torch.einsum("bhxy,byhd->bxhd", F.silu(scores) / n * mask, vd).reshape(b * n, h, d)
    truth = torch.autograd.grad(want, (pos_d, ts_d), dout.double())
    for a, t in zip(got, truth):
        torch.testing.assert_close(a.double(), t.double(), rtol=1e-4, atol=1e-5 * t.abs().max().item())


def _problem(kind, per_head, seed=0, hq=2, hkv=1, d=16, device="cpu", dtype=torch.float32):
    """Inputs of a biased call: self-attention over awkward lengths, or cross-attention whose queries are the last
    rows of each sequence; the tables shared by the heads or per head, position and time, or one of them."""
    g = torch.Generator().manual_seed(seed)
    kv_lens = [0, 1, 63, 65, 29, 40]
    q_lens = kv_lens if kind == "self" else [min(x, y) for x, y in zip(kv_lens, [0, 1, 5, 65, 30, 17])]
    q_off, kv_off = offsets_of(q_lens, device), offsets_of(kv_lens, device)
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(device, dtype)
    k, v = (torch.randn(sum(kv_lens), hkv, d, generator=g).to(device, dtype) for _ in range(2))
    p, nb = 24, 9

    def table(length):
        return (torch.randn(*((hq, length) if per_head else (length, )), generator=g) * 0.5).to(device)

    k_times = times_away_from_edges(kv_lens, seed=seed)
    if kind == "self":
        bias = jfa.RelativeBias.hstu(table(2 * p - 1), table(nb + 1), k_times.to(device), kv_off)
    else:  # each query at its sequence's last rows: its time is the next key's (the last, its own)
        ends = offsets_of(kv_lens)[1:].tolist()
        q_times = torch.cat([k_times[e - n:e].roll(-1) for e, n in zip(ends, q_lens)])
        bias = jfa.RelativeBias(table(2 * p - 1), table(nb + 1), q_times.to(device), k_times.to(device))
    return q, k, v, q_off, (None if kind == "self" else kv_off), bias


def _leaves(bias, which):
    """The bias with its tables (those named in which) as float32 leaves that require grad."""
    pos = bias.position.clone().requires_grad_() if "position" in which else None
    tim = bias.time.clone().requires_grad_() if "time" in which else None
    return jfa.RelativeBias(pos, tim, bias.q_times, bias.k_times, bias.time_divisor), [t for t in (pos, tim) if
                                                                                       t is not None]


CASES = [("self", False, "softmax", (-1, -1), ("position", "time")),
         ("self", True, "silu", (-1, 0), ("position", "time")),
         ("self", True, "softmax", (7, 0), ("time", )),
         ("cross", False, "gelu_tanh", (-1, -1), ("position", )),
         ("cross", True, "softmax", (-1, 0), ("position", "time"))]


@pytest.mark.parametrize("kind,per_head,activation,window,which", CASES)
def test_reference_backward_is_autograd_of_its_forward(kind, per_head, activation, window, which):
    """The reference's explicit backward (what the op returns: dq, dk, dv and the tables') = autograd through the
    reference's forward, in float64."""
    q, k, v, q_off, kv_off, bias = _problem(kind, per_head)
    bias, tables = _leaves(bias, which)
    q, k, v = (x.double().requires_grad_() for x in (q, k, v))
    opts = dict(window=window, activation=activation, out_scale=0.05 if activation != "softmax" else 1.0)
    p = jfa.api.problem(q.float(), k.float(), v.float(), q_off, kv_off, rel_bias=bias, backend="reference", **opts)
    out, lse = reference.attention(q, k, v, q_off, p.kv_offsets, scale=p.scale, left=p.left, right=p.right,
                                   activation=activation, out_scale=p.out_scale, rel_bias=p.bias,
                                   compute_dtype=torch.float64)
    dout = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    truth = torch.autograd.grad(out, (q, k, v, *tables), dout)
    grads = reference.attention_backward(dout, None, q, k, v, out.detach(), q_off, p.kv_offsets, scale=p.scale,
                                         left=p.left, right=p.right, activation=activation, out_scale=p.out_scale,
                                         rel_bias=p.bias, compute_dtype=torch.float64)
    grads = grads[:3] + tuple(g for g in grads[3:] if g is not None)
    for name, a, t in zip(("dq", "dk", "dv", *which), grads, truth):
        a = a.sum(0) if a.dim() > t.dim() else a  # (a shared table: the op's [Hq, L], summed over the heads)
        tol = 1e-9 if name.startswith("d") else 2 ** -23  # (the tables' gradients come back float32, as the tables)
        torch.testing.assert_close(a.double(), t.double(), rtol=tol, atol=tol * t.abs().max().item(),
                                   msg=lambda m, name=name: f"{name}: {m}")


def _results(kind, per_head, activation, window, which, backend, device="cpu", dtype=torch.float32,
             compute_dtype=torch.float64):
    """(out, dq, dk, dv, the tables' gradients) of a biased call through autograd: the public function on a backend,
    or with backend "spec" the reference itself in compute_dtype (float64: the truth; None: q's dtype)."""
    q, k, v, q_off, kv_off, bias = _problem(kind, per_head, seed=3, device=device, dtype=dtype)
    opts = dict(window=window, activation=activation, out_scale=0.05 if activation != "softmax" else 1.0)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(6)).to(device)
    b, tables = _leaves(bias, which)
    x = [t.clone().requires_grad_() for t in (q, k, v)]
    if backend == "spec":  # (the public functions take float32 at most)
        p = jfa.api.problem(*x, q_off, kv_off, rel_bias=b, backend="reference", **opts)
        xd = [t.to(compute_dtype) if compute_dtype else t for t in x]
        out = reference.attention(*xd, q_off, p.kv_offsets, scale=p.scale, left=p.left, right=p.right,
                                  activation=activation, out_scale=p.out_scale, rel_bias=p.bias,
                                  compute_dtype=compute_dtype)[0]
    else:
        out = jfa.jagged_attention(*x, q_off, kv_off, rel_bias=b, backend=backend, **opts)
    return (out, *torch.autograd.grad(out, (*x, *tables), dout.to(out.dtype)))


def _assert_close(names, got, truth, allowed):
    for name, a, t in zip(names, got, truth):
        a, t = a.detach().double().cpu(), t.detach().double().cpu()
        err = (a - t).abs().max().item() if t.numel() else 0.0
        tol = allowed(a, t)
        assert err <= tol, f"{name}: max abs error {err:.3g} > {tol:.3g}"


@pytest.mark.interpreter
@pytest.mark.parametrize("kind,per_head,activation,window,which", CASES)
def test_triton_matches_the_reference(kind, per_head, activation, window, which):
    """The portable kernels (interpreter, float32) against the float64 reference: out, dq, dk, dv and the tables'
    gradients, through the public function and autograd."""
    got = _results(kind, per_head, activation, window, which, "triton")
    truth = _results(kind, per_head, activation, window, which, "spec")
    _assert_close(("out", "dq", "dk", "dv", *which), got, truth,
                  lambda a, t: 1e-4 * t.abs().max().item() + 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind,per_head,activation,window,which", CASES)
def test_gpu_triton_matches_the_reference(kind, per_head, activation, window, which, dtype):
    """The portable kernels on the GPU against the float64 reference: in float32 as in the interpreter; in bf16
    within twice what the reference itself loses computing in bf16 (jfa.testing.allowed_error)."""
    case = (kind, per_head, activation, window, which)
    got = _results(*case, "triton", "cuda", dtype)
    truth = _results(*case, "spec", "cuda", dtype)
    if dtype == torch.float32:
        allowed = lambda a, t: 1e-4 * t.abs().max().item() + 1e-5  # noqa: E731
    else:
        lowp = iter(_results(*case, "spec", "cuda", dtype, compute_dtype=None))
        allowed = lambda a, t: allowed_error(dtype, next(lowp), t)  # noqa: E731
    _assert_close(("out", "dq", "dk", "dv", *which), got, truth, allowed)


def test_bias_checks():
    q = torch.zeros(10, 2, 8)
    off = offsets_of([4, 6])
    ts = torch.arange(10)
    call = lambda b, **kw: jfa.jagged_attention(q, q, q, off, causal=True, rel_bias=b, **kw)  # noqa: E731
    with pytest.raises(TypeError, match="float32"):
        call(jfa.RelativeBias(position=torch.zeros(7, dtype=torch.float64)))
    with pytest.raises(ValueError, match="odd length"):
        call(jfa.RelativeBias(position=torch.zeros(8)))
    with pytest.raises(ValueError, match=r"\[Hq=2, L\]"):
        call(jfa.RelativeBias(position=torch.zeros(3, 7)))
    with pytest.raises(ValueError, match="q_times must be an int64 tensor of 10"):
        call(jfa.RelativeBias(time=torch.zeros(5), q_times=ts[:9]))
    with pytest.raises(ValueError, match="q_times must be an int64"):
        call(jfa.RelativeBias(time=torch.zeros(5), q_times=ts.float()))
    with pytest.raises(ValueError, match="time_divisor"):
        call(jfa.RelativeBias(time=torch.zeros(5), q_times=ts, time_divisor=0.0))
    with pytest.raises(ValueError, match="time_divisor"):  # (past what the kernels' float32 log decides: check)
        call(jfa.RelativeBias(time=torch.zeros(5), q_times=ts, time_divisor=1e-4))
    with pytest.raises(ValueError, match="k_times is needed in cross-attention"):
        jfa.jagged_attention(q, q, q, off, off.clone(), rel_bias=jfa.RelativeBias(time=torch.zeros(5), q_times=ts))
    with pytest.raises(TypeError, match="jfa.RelativeBias"):
        call(torch.zeros(7))
    with pytest.raises(ValueError, match="broadcast q"):
        jfa.api.problem(q[:3], q, q, off, broadcast=True, rel_bias=jfa.RelativeBias(position=torch.zeros(7)))
    with pytest.raises(ValueError, match="nonzero scale"):
        call(jfa.RelativeBias(position=torch.zeros(7)), scale=0.0)


@pytest.mark.interpreter
def test_hstu_layer_learns_its_bias_tables():
    """HSTULayer(num_buckets=...) owns HSTU's pos_w and ts_w and adds them inside the kernels: the portable
    kernels' output and the tables' gradients equal the reference backend's; without timestamps it says so."""
    torch.manual_seed(0)
    lens = [5, 0, 33, 17]
    offsets = offsets_of(lens)
    ts = times_away_from_edges(lens, seed=4)
    layers = {}
    for backend in ("reference", "triton"):
        torch.manual_seed(1)
        layers[backend] = jfa.nn.HSTULayer(32, num_heads=2, max_seq_len=40, num_buckets=12, backend=backend)
    x = torch.randn(sum(lens), 32)
    res = {}
    for backend, layer in layers.items():
        y = layer(x, offsets, timestamps=ts)
        res[backend] = (y, *torch.autograd.grad(y.square().sum(), (layer.pos_w, layer.ts_w)))
    assert res["reference"][1].abs().sum() > 0 and res["reference"][2].abs().sum() > 0
    _assert_close(("y", "pos_w", "ts_w"), res["triton"], res["reference"],
                  lambda a, t: 1e-4 * t.abs().max().item() + 1e-6)
    with pytest.raises(ValueError, match="needs timestamps"):
        layers["reference"](x, offsets)
    with pytest.raises(ValueError, match="needs max_seq_len"):
        jfa.nn.HSTULayer(32, num_heads=2, num_buckets=12)


def test_compiled_biased_call_is_the_eager_one():
    """torch.compile(fullgraph=True) traces a biased call (RelativeBias.hstu included: no host sync) through the op's
    fake implementation, with the tables' gradients: the same values as eager."""
    offsets = offsets_of([5, 0, 7])
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(12, 2, 16, generator=g).requires_grad_() for _ in range(3))
    ts = times_away_from_edges([5, 0, 7], seed=7)
    pos, tim = torch.randn(31, generator=g).requires_grad_(), torch.randn(2, 9, generator=g).requires_grad_()

    def f(q, k, v, ts):
        b = jfa.RelativeBias.hstu(pos, tim, ts, offsets)
        return jfa.jagged_attention(q, k, v, offsets, max_q_len=7, max_kv_len=7, causal=True, rel_bias=b,
                                    backend="reference")
    eager = f(q, k, v, ts)
    compiled = torch.compile(f, fullgraph=True)(q, k, v, ts)
    for a, b in zip(torch.autograd.grad(eager.sum(), (q, pos, tim)), torch.autograd.grad(compiled.sum(),
                                                                                       (q, pos, tim))):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(eager, compiled)


@pytest.mark.parametrize("activation", ["softmax", "silu"])
def test_padded_peer_computes_the_same_bias(activation):
    """The bench's padded peer (jfa.peers.PaddedSDPA with rel_bias: the dense bias gathered from the tables, as HSTU's
    module builds it) gives the float64 reference's output and tables' gradients (float32 tolerances)."""
    q, k, v, q_off, _, bias = _problem("self", True, seed=8)
    out_scale = 0.05 if activation != "softmax" else 1.0
    results = []
    for dtype in (torch.float32, torch.float64):  # the peer in float32, the reference in float64
        b, tables = _leaves(bias, ("position", "time"))
        if dtype == torch.float32:
            padded = peers.PaddedSDPA(q_off, causal=True, activation=activation, out_scale=out_scale, rel_bias=b)
            out = padded(q, k, v)
        else:
            p = jfa.api.problem(q, k, v, q_off, causal=True, activation=activation, out_scale=out_scale, rel_bias=b,
                                backend="reference")
            out = reference.attention(q.double(), k.double(), v.double(), q_off, q_off, scale=p.scale, left=p.left,
                                      right=p.right, activation=activation, out_scale=out_scale, rel_bias=p.bias,
                                      compute_dtype=torch.float64)[0]
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
        results.append((out, *torch.autograd.grad(out, tables, dout.to(out.dtype))))
    _assert_close(("out", "position", "time"), results[0], results[1],
                  lambda a, t: 1e-4 * t.abs().max().item() + 1e-5)
