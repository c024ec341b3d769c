"""Serving (#38): each sequence's new rows as queries against its whole history (HSTU's cached attention,
`pytorch_cached_hstu_mha`: the delta rows' scores under the full sequence's mask), through jfa's cross-attention
with HSTU's mask, against HSTU's formula written out here on padded tensors, and against the training-time call
(self-attention over the whole sequence) row for row; forward and backward, on the reference and the portable
Triton kernels (in Triton's interpreter)."""
import pytest
import torch
import torch.nn.functional as F

import jfa
from jfa import reference
from jfa.testing import offsets_of


def attend(backend, q, k, v, q_offsets, kv_offsets, *, window, **opts):
    """Causal attention with HSTU's mask: the float64 reference itself (the public functions take no float64), or
    the public function on the portable kernels in float32."""
    if backend == "reference":
        scale = opts.pop("scale", 1.0 / q.shape[-1] ** 0.5)
        return reference.attention(q, k, v, q_offsets, kv_offsets, scale=scale, left=window[0], right=0,
                                   compute_dtype=torch.float64, **opts)[0]
    out = jfa.jagged_attention(q.float(), k.float(), v.float(), q_offsets, kv_offsets, causal=True, window=window,
                               backend=backend, **opts)
    return out.double()


def hstu_cached_formula(delta_q, k, v, seq_lens, delta, alpha, n, num_targets, max_attn_len, contextual_len):
    """HSTU's cached attention as its PyTorch reference defines it, on padded [B, N] tensors: ids are the rows'
    positions, remapped past a contextual prefix (id - c + 1, at least 0) and clamped at the history's end (every
    target shares its id); a row sees a key when they are one row or the key's id is smaller (by at most
    max_attn_len when > 0); with a prefix, rows of id 0 also see every key below the history's end. Scores are
    silu(alpha q.k) / N; the queries are the last `delta` rows of each sequence."""
    b, hq, d = len(seq_lens), delta_q.shape[1], delta_q.shape[2]
    lens = torch.tensor(seq_lens)
    pad_k = torch.zeros(b, n, hq, d, dtype=k.dtype)
    pad_v = torch.zeros(b, n, hq, d, dtype=v.dtype)
    start = 0
    for s, length in enumerate(seq_lens):
        pad_k[s, :length], pad_v[s, :length] = k[start:start + length], v[start:start + length]
        start += length
    ids = torch.arange(n).view(1, n)
    max_ids = lens.view(-1, 1)
    if contextual_len > 0:
        ids = torch.clamp(ids - contextual_len + 1, min=0)
        max_ids = max_ids - contextual_len + 1
    max_ids = max_ids - num_targets.view(-1, 1)
    ids = torch.minimum(ids, max_ids)  # [B, N]
    dist = ids.view(b, n, 1) - ids.view(b, 1, n)
    valid = torch.eye(n, dtype=torch.bool).view(1, n, n) | (dist > 0)
    if max_attn_len > 0:
        valid = valid & (dist <= max_attn_len)
    if contextual_len > 0:
        valid = valid | ((ids.view(b, n, 1) == 0) & (ids.view(b, 1, n) < max_ids.view(b, 1, 1)))
    rows = torch.arange(n).view(1, n)
    last = (rows >= (lens - delta).view(-1, 1)) & (rows < lens.view(-1, 1))  # [B, N]: the delta rows
    mask = valid[last].view(b, delta, n)
    q = delta_q.view(b, delta, hq, d)
    scores = torch.einsum("bxhd,byhd->bhxy", q, pad_k) * alpha
    attn = F.silu(scores) / n * mask.unsqueeze(1)
    return torch.einsum("bhxy,byhd->bxhd", attn, pad_v).reshape(b * delta, hq, d)


SERVING = {  # sequence lengths, new rows per sequence (HSTU's delta: one count for all), contextual_len, window
    "delta-1": ([5, 40, 1, 66, 129], 1, 0, 0),
    "delta-3-targets-window": ([3, 40, 17, 66, 130], 3, 0, 9),
    "delta-7-context": ([8, 40, 17, 66, 130], 7, 4, 0),
    "delta-20-context-window": ([20, 64, 129, 33], 20, 3, 16),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("name", list(SERVING))
def test_serving_matches_hstus_cached_formula(name, backend):
    """jfa.jagged_attention(new rows' q, the histories' k and v, causal, silu, num_targets, contextual_len) equals
    HSTU's cached formula, forward and the gradients of q, k and v, float64, random targets (0 and all-target
    sequences among them)."""
    seq_lens, delta, context, max_attn_len = SERVING[name]
    g = torch.Generator().manual_seed(len(name))
    b, h, d, n = len(seq_lens), 2, 16, max(seq_lens)
    num_targets = (torch.rand(b, generator=g) * (torch.tensor(seq_lens) + 1)).long()
    num_targets[0], num_targets[-1] = 0, seq_lens[-1]
    q = torch.randn(b * delta, h, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(sum(seq_lens), h, d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(sum(seq_lens), h, d, generator=g, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(b * delta, h, d, generator=g, dtype=torch.float64)
    alpha = 1.0 / d
    want = hstu_cached_formula(q, k, v, seq_lens, delta, alpha, n, num_targets, max_attn_len, context)
    want_grads = torch.autograd.grad(want, (q, k, v), dout)
    got = attend(backend, q, k, v, offsets_of([delta] * b), offsets_of(seq_lens),
                 window=(max_attn_len if max_attn_len > 0 else -1, 0), scale=alpha, activation="silu",
                 out_scale=1.0 / n, num_targets=num_targets, contextual_len=context)
    got_grads = torch.autograd.grad(got, (q, k, v), dout)
    tol = dict(atol=1e-5, rtol=1e-4) if backend == "triton" else dict(atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(got, want, **tol)
    for x, y, what in zip(got_grads, want_grads, "qkv"):
        torch.testing.assert_close(x, y, **tol, msg=lambda m: f"d{what}: {m}")


@pytest.mark.interpreter
@pytest.mark.parametrize("activation", ["softmax", "silu"])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_served_rows_equal_the_training_rows(backend, activation):
    """A served score is its training-time row: the last rows of each sequence (jagged counts: none, some, all)
    against the whole sequence give what self-attention over the whole sequence gives on those rows, outputs and
    every gradient that reaches them."""
    seq_lens, new = [0, 9, 40, 66, 129, 3], [0, 2, 40, 17, 65, 3]
    num_targets, context = torch.tensor([0, 2, 5, 17, 1, 3]), 4
    seq_lens = [x if x == 0 else max(x, context) for x in seq_lens]
    g = torch.Generator().manual_seed(5)
    x_q, x_k, x_v = (torch.randn(sum(seq_lens), 2, 16, generator=g, dtype=torch.float64) for _ in range(3))
    offsets = offsets_of(seq_lens)
    opts = dict(window=(30, 0), activation=activation, num_targets=num_targets, contextual_len=context,
                **({} if activation == "softmax" else dict(out_scale=0.1)))
    last = torch.cat([torch.arange(o + n - m, o + n) for o, n, m in zip(offsets.tolist(), seq_lens, new)])
    tol = dict(atol=1e-12, rtol=1e-10) if backend == "reference" else dict(atol=2e-6, rtol=1e-5)
    # an upstream gradient on the served rows only, through both calls
    dout = torch.randn(len(last), 2, 16, generator=g, dtype=torch.float64)
    q, k, v = (t.clone().requires_grad_() for t in (x_q, x_k, x_v))
    full = attend(backend, q, k, v, offsets, offsets, **opts)[last]
    full_grads = torch.autograd.grad(full, (q, k, v), dout)
    qs, k2, v2 = x_q[last].clone().requires_grad_(), x_k.clone().requires_grad_(), x_v.clone().requires_grad_()
    served = attend(backend, qs, k2, v2, offsets_of(new), offsets, **opts)
    served_grads = torch.autograd.grad(served, (qs, k2, v2), dout)
    torch.testing.assert_close(served, full, **tol)
    torch.testing.assert_close(served_grads[0], full_grads[0][last], **tol)
    torch.testing.assert_close(served_grads[1], full_grads[1], **tol)
    torch.testing.assert_close(served_grads[2], full_grads[2], **tol)


def test_serving_refuses_more_queries_than_keys():
    q, k = torch.randn(5, 1, 8), torch.randn(6, 1, 8)
    with pytest.raises(ValueError, match=r"last rows as queries.*sequence 1 has 4 queries but 2 keys"):
        jfa.jagged_attention(q, k, k, offsets_of([1, 4]), offsets_of([4, 2]), causal=True, activation="silu",
                             num_targets=torch.tensor([0, 1]))


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_paged_keys_give_the_packed_bits(backend):
    """k and v read through a page table (pages of 16 rows, scattered and out of order in a pool with spare pages)
    give the same bits as the packed call: softmax and silu with HSTU's mask, sequences with no keys, one page, and
    several."""
    g = torch.Generator().manual_seed(1)
    page, lens, q_lens = 16, [0, 5, 40, 33, 16], [0, 2, 7, 33, 1]
    pool_pages = len(lens) * 3 + 2
    table = torch.randperm(pool_pages, generator=g)[:len(lens) * 3].view(len(lens), 3).to(torch.int32)
    k_pool, v_pool = (torch.randn(pool_pages * page, 2, 32, generator=g) for _ in range(2))
    kv_offsets, q_offsets = offsets_of(lens), offsets_of(q_lens)
    rows = jfa.jagged.paged_rows(table, kv_offsets, page)
    q = torch.randn(sum(q_lens), 4, 32, generator=g)
    for opts in (dict(causal=True), dict(activation="silu", out_scale=0.1, num_targets=torch.tensor([0, 1, 3, 0, 1]),
                                           contextual_len=1, causal=True, window=(9, 0))):
        with torch.no_grad():
            paged = jfa.jagged_attention(q, k_pool, v_pool, q_offsets, kv_offsets, page_table=table, page_size=page,
                                         backend=backend, **opts)
            packed = jfa.jagged_attention(q, k_pool[rows], v_pool[rows], q_offsets, kv_offsets, backend=backend,
                                          **opts)
        assert torch.equal(paged, packed), (paged - packed).abs().max()


@pytest.mark.interpreter
def test_cache_appends_and_serves_the_histories():
    """jfa.KVCache: three appends (some users with no new rows, one with no history at all, rows crossing pages),
    then the new rows' queries against each whole history: what the packed call on the histories gives."""
    g = torch.Generator().manual_seed(2)
    batch, h, d = 4, 2, 16
    cache = jfa.KVCache(batch, capacity=70, heads=h, head_dim=d, page_size=16, dtype=torch.float32)
    history = [[] for _ in range(batch)]
    for step_lens in ([5, 0, 20, 1], [0, 0, 17, 3], [2, 0, 30, 16]):
        new = offsets_of(step_lens)
        k_new, v_new = (torch.randn(sum(step_lens), h, d, generator=g) for _ in range(2))
        cache.append(k_new, v_new, new)
        for b, (lo, hi) in enumerate(zip(new[:-1].tolist(), new[1:].tolist())):
            history[b].append((k_new[lo:hi], v_new[lo:hi]))
    assert cache.lengths.tolist() == [7, 0, 67, 20]
    k_all = torch.cat([torch.cat([kv[0] for kv in hist]) for hist in history])
    v_all = torch.cat([torch.cat([kv[1] for kv in hist]) for hist in history])
    q_lens = [2, 0, 30, 16]  # the last append's rows
    q = torch.randn(sum(q_lens), h, d, generator=g)
    for backend in ("reference", "triton"):
        served = cache.attend(q, offsets_of(q_lens), causal=True, backend=backend)
        want = jfa.jagged_attention(q, k_all, v_all, offsets_of(q_lens), cache.offsets, causal=True,
                                    backend=backend)
        assert torch.equal(served, want), backend
    assert cache.capacity == 80  # (70 rounded up to whole pages)
    with pytest.raises(RuntimeError, match="capacity"):
        cache.append(torch.zeros(14, h, d), torch.zeros(14, h, d), offsets_of([0, 0, 14, 0]))


def test_paged_keys_are_forward_only_and_checked():
    g = torch.Generator().manual_seed(3)
    k = torch.randn(64, 1, 8, generator=g)
    q, table, kvo, qo = torch.randn(3, 1, 8, generator=g), torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), \
        offsets_of([20, 9]), offsets_of([1, 2])
    with pytest.raises(ValueError, match="forward only"):
        jfa.jagged_attention(q.requires_grad_(), k, k, qo, kvo, page_table=table, page_size=16)
    q = q.detach()
    with pytest.raises(ValueError, match=r"sequence 0 has 40 keys but its page table row holds 32"):
        jfa.jagged_attention(q, k, k, qo, offsets_of([40, 9]), page_table=table, page_size=16)
    with pytest.raises(ValueError, match=r"page_table\[1, 0\] = 7 is not a page of the pool \(0 to 3\)"):
        jfa.jagged_attention(q, k, k, qo, kvo, page_table=torch.tensor([[0, 1], [7, 3]], dtype=torch.int32),
                             page_size=16)
    with pytest.raises(ValueError, match="not a multiple of page_size"):
        jfa.jagged_attention(q, k[:40], k[:40], qo, kvo, page_table=table, page_size=16)
    with pytest.raises(ValueError, match="kv_offsets of their own"):
        jfa.jagged_attention(k[:29], k[:29], k[:29], kvo, page_table=table, page_size=16)


@pytest.mark.interpreter
@pytest.mark.parametrize("layer", ["self-attention", "hstu", "hstu-1-softmax-head"])
def test_layers_serve_the_rows_forward_gives(layer):
    """A layer's serve(): the histories appended first (their rows served: forward's on the histories), then a
    request's new rows with HSTU's targets among them: forward's rows on the whole sequences (causal; one user with
    no new rows, one with no history). (A contextual prefix sees the whole history, so its rows served before the
    new rows came are the histories', not the whole sequences'.)"""
    torch.manual_seed(0)
    if layer.startswith("hstu"):
        m = jfa.nn.HSTULayer(32, 2, max_seq_len=64, backend="triton", num_softmax_heads=int(layer != "hstu"))
    else:
        m = jfa.nn.JaggedSelfAttention(32, 2, num_kv_heads=1, causal=True, window=(20, 0), backend="triton")
    hist, new = [9, 30, 0, 17], [3, 0, 5, 2]
    whole = [h + n for h, n in zip(hist, new)]
    x = torch.randn(sum(whole), 32)
    offsets = offsets_of(whole)
    parts = [torch.arange(o, o + h) for o, h in zip(offsets.tolist(), hist)]
    new_rows = torch.cat([torch.arange(o + h, o + h + n) for o, h, n in zip(offsets.tolist(), hist, new)])
    hist_rows = torch.cat(parts)
    targets = torch.tensor([2, 0, 5, 1])
    no_targets = torch.zeros(4, dtype=torch.int64)
    with torch.no_grad():
        want = m(x, offsets, num_targets=targets, contextual_len=2)
        want_hist = m(x[hist_rows], offsets_of(hist), num_targets=no_targets, contextual_len=2)
    cache = m.make_cache(batch=4, capacity=48, page_size=16, dtype=torch.float32)
    served_hist = m.serve(x[hist_rows], offsets_of(hist), cache, num_targets=no_targets, contextual_len=2)
    served_new = m.serve(x[new_rows], offsets_of(new), cache, num_targets=targets, contextual_len=2)
    torch.testing.assert_close(served_hist, want_hist, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(served_new, want[new_rows], atol=2e-5, rtol=1e-4)
