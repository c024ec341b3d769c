"""GPU tests (skipped without CUDA): the Triton backend on larger jagged batches in bf16/fp16/fp32, every mode,
forward and backward; CUDA graph capture and replay with new offsets; no host sync when max lens are given
(these two through backend "auto", the hopper backend on an sm_90 GPU)."""
from dataclasses import replace

import pytest
import torch
import triton
import triton.language as tl

import jfa
from jfa.testing import GPU_MODES, compare, make_case, offsets_of, run_backend, serving_lens

pytestmark = pytest.mark.gpu

MODES = GPU_MODES


def run(case):
    return run_backend(case, "triton")


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mode", list(MODES))
def test_gpu_modes(mode, dtype, d):
    kw = dict(MODES[mode])
    kw.setdefault("hq", 4)
    kw.setdefault("hkv", 4)
    case = make_case(**kw, d=d, dtype=dtype, device="cuda", seed=d)
    out, lse, grads = run(case)
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("d,dtype", [(32, torch.bfloat16), (96, torch.bfloat16), (256, torch.bfloat16),
                                     (64, torch.float32), (128, torch.float32)])
def test_gpu_head_dims_and_fp32(d, dtype):
    case = make_case([1, 65, 129, 700], hq=4, hkv=2, d=d, dtype=dtype, device="cuda", causal=True, seed=d)
    out, lse, grads = run(case)
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


def test_gpu_auto_is_a_kernel_backend():
    assert jfa.backends.select("auto", torch.device("cuda"), 128, torch.bfloat16) != "reference"


@pytest.mark.parametrize("activation", ["softmax", "silu"])
@pytest.mark.parametrize("context,window,serving,full", [(0, -1, False, 0), (0, 100, False, 0), (1, -1, False, 0),
                                                         (5, 300, False, 0), (5, 300, True, 0), (0, 100, False, 150),
                                                         (5, 60, True, 40)], ids=str)
def test_gpu_target_masks(context, window, serving, full, activation):
    """HSTU's mask in the compiled Triton kernels against the float64 rule (jfa.jagged.target_mask): random target
    counts with 0 and all-target sequences, contextual prefixes, windows, GQA, forward and backward; serving: each
    sequence's last rows as queries; full: the history's last rows see past the window (min_full_attn_len)."""
    lens = GPU_MODES["causal"]["q_lens"]
    case = make_case(*((serving_lens(lens), lens) if serving else (lens, None)), causal=True, window=(window, -1),
                     num_targets="random", contextual_len=context, hq=4, hkv=2, d=128, dtype=torch.bfloat16,
                     device="cuda", seed=context, activation=activation,
                     out_scale=1.0 if activation == "softmax" else 1 / 512, min_full_attn_len=full)
    out, lse, grads = run(case)
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("backend", ["hopper", "triton"])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_softmax_heads(d, backend):
    """HSTU's num_softmax_heads on the GPU: the first heads softmax, the rest silu, under HSTU's mask with targets
    and a context, GQA, forward and backward, against the float64 rule per head."""
    lens = GPU_MODES["causal"]["q_lens"]
    case = make_case(lens, causal=True, num_targets="random", contextual_len=3, hq=4, hkv=2, d=d, dtype=torch.bfloat16,
                     device="cuda", seed=d, activation="silu", out_scale=1 / 512, num_softmax_heads=2)
    out, lse, grads = run_backend(case, backend)
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


def test_gpu_no_host_sync_with_max_lens():
    case = make_case([63, 129, 0, 65], hq=4, hkv=4, d=64, dtype=torch.bfloat16, device="cuda")
    q, k, v = (x.detach().clone().requires_grad_() for x in (case.q, case.k, case.v))
    targets = torch.tensor([5, 129, 0, 1], device="cuda", dtype=case.q_offsets.dtype)  # (a copy to the device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = jfa.jagged_attention(q, k, v, case.q_offsets, max_q_len=129, max_kv_len=129, causal=True)
        out.backward(case.dout)
        pooled = jfa.broadcast_attention(q[:16], k, v, case.kv_offsets, max_kv_len=129)
        pooled.sum().backward()
        scored = jfa.jagged_attention(q, k, v, case.q_offsets, max_q_len=129, max_kv_len=129, causal=True,
                                      num_targets=targets, contextual_len=2, activation="silu", out_scale=0.01)
        scored.backward(case.dout)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_gpu_cache_append_and_attend_without_host_sync():
    """Serving on the GPU: jfa.KVCache appends and the new rows' attention through the page table, with no host sync
    (both max lengths given), equal to the packed call on the histories; then the same step captured in a CUDA
    graph and replayed on new rows."""
    g = torch.Generator().manual_seed(4)
    cache = jfa.KVCache(4, capacity=300, heads=2, head_dim=64, page_size=64, device="cuda")
    lens = [[0, 70, 129, 3], [1, 0, 64, 5]]
    rows = [torch.randn(sum(n), 2, 64, generator=g).to("cuda", torch.bfloat16) for n in lens]
    offsets = [offsets_of(n, "cuda") for n in lens]
    q = torch.randn(sum(lens[1]), 4, 64, generator=g).to("cuda", torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for r, o in zip(rows, offsets):
            cache.append(r, r * 0.5, o)
        served = cache.attend(q, offsets[1], max_q_len=64, causal=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    history = [torch.cat([r[o[b]:o[b + 1]] for r, o in zip(rows, offsets)]) for b in range(4)]
    k_all = torch.cat(history)
    want = jfa.jagged_attention(q, k_all, k_all * 0.5, offsets[1], cache.offsets, causal=True, backend="triton")
    assert torch.equal(served, want)
    graph, step_q = torch.cuda.CUDAGraph(), q.clone()
    cache.clear()
    with torch.cuda.graph(graph):
        cache.append(rows[1], rows[1] * 0.5, offsets[1])
        out = cache.attend(step_q, offsets[1], max_q_len=64, causal=True)
    cache.clear()
    graph.replay()
    torch.cuda.synchronize()
    fresh = jfa.jagged_attention(step_q, rows[1], rows[1] * 0.5, offsets[1], offsets[1].clone(), causal=True,
                                 backend="triton")
    assert torch.equal(out, fresh)


def test_gpu_cuda_graph_replay_with_new_offsets():
    """Capture forward + backward once; replay with other lengths (same B and total) in the same buffers."""
    d, h = 64, 4
    first, second = [100, 0, 300, 112], [1, 255, 200, 56]
    case = make_case(first, hq=h, hkv=h, d=d, dtype=torch.bfloat16, device="cuda")
    q, k, v = (x.detach().clone().requires_grad_() for x in (case.q, case.k, case.v))
    offsets, dout = case.q_offsets.clone(), case.dout.clone()

    def step():
        out = jfa.jagged_attention(q, k, v, offsets, max_q_len=512, max_kv_len=512, causal=True)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        return out, grads

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_grads = step()
    for lens in (second, first):
        offsets.copy_(torch.tensor([0] + lens, device="cuda").cumsum(0).to(offsets.dtype))
        graph.replay()
        eager_out, eager_grads = step()
        torch.testing.assert_close(g_out, eager_out, rtol=0, atol=0)
        for a, b in zip(g_grads, eager_grads):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@triton.jit
def _store_kernel(dst, src, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(dst + o, tl.load(src + o, mask=o < n), mask=o < n)


def _rewrite(offsets, new, how):
    """Write `new` into `offsets` in place, the ways a data pipeline does; .data and a kernel's stores leave the
    version counter alone."""
    if how == "copy_":
        offsets.copy_(new)
    elif how == ".data":
        offsets.data[:] = new
    else:
        _store_kernel[(1,)](offsets, new, new.numel(), BLOCK=triton.next_power_of_2(new.numel()))


@pytest.mark.parametrize("how", ["copy_", ".data", "kernel"])
@pytest.mark.parametrize("mode", ["self-causal", "broadcast"])
def test_gpu_offsets_rewritten_in_place(mode, how):
    """The same offsets tensor, rewritten in place between two calls (same batch and total rows), gives the
    reference's answer both times, forward and backward: a cached schedule never outlives its offsets (#16)."""
    first, second = [300, 5, 900, 64], [64, 900, 5, 300]
    kw = dict(q_lens=first, causal=True) if mode == "self-causal" else dict(q_lens=None, kv_lens=first,
                                                                          broadcast_lq=64)
    case = make_case(**kw, hq=4, hkv=4, d=128, dtype=torch.bfloat16, device="cuda", seed=5)
    offsets = case.kv_offsets.clone()
    for lens in (first, second):
        if lens is second:
            version = offsets._version
            _rewrite(offsets, torch.tensor([0] + lens, device="cuda").cumsum(0).to(offsets.dtype), how)
            assert how == "copy_" or offsets._version == version
        this = replace(case, kv_offsets=offsets, q_offsets=case.q_offsets if case.broadcast else offsets)
        out, lse, grads = run_backend(this, "auto")
        failures = compare(replace(this, kv_offsets=offsets.clone(), q_offsets=this.q_offsets.clone()), out, lse,
                           grads)
        assert not failures, f"lengths {lens}:\n" + "\n".join(failures)
