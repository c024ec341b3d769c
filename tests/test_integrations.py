"""jfa in a real training loop (issue 6), the CPU-testable parts: NJT in/out, FLOP counting, torch.compile
without recompiles when the offsets change, the GEM-style model (vs padded SDPA) and its DDP training with
cost-balanced rank partitions (2 gloo processes)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import jfa
from jfa import flops, models, nested
from jfa.jagged import visible_pairs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF = "reference"


def _offsets(lens):
    lens = torch.as_tensor(lens, dtype=torch.long)
    return torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lens, 0)])


def _qkv(rows_q, rows_kv, hq=4, hkv=2, d=8, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows_q, hq, d, generator=g)
    k, v = (torch.randn(rows_kv, hkv, d, generator=g) for _ in range(2))
    return [t.requires_grad_(grad) for t in (q, k, v)]


# ------------------------------------------------------------------------------------------------------ NJT
def test_padded_round_trip_with_empty_and_single_sequences():
    lens = [3, 0, 1, 5]
    off = _offsets(lens)
    values = torch.randn(int(off[-1]), 2, 4)
    padded, got_lens = nested.to_padded(values, off, padding_value=-7.0)
    assert padded.shape == (4, 5, 2, 4) and got_lens.tolist() == lens
    assert torch.equal(padded[0, :3], values[:3]) and torch.equal(padded[3], values[4:9])
    assert (padded[1] == -7).all() and (padded[2, 1:] == -7).all()
    back, back_off = nested.from_padded(padded, got_lens)
    assert torch.equal(back, values) and torch.equal(back_off, off)
    assert nested.from_padded(padded, got_lens.int())[1].dtype == torch.int32
    wide, _ = nested.to_padded(values, off, max_len=8)
    assert wide.shape[1] == 8 and torch.equal(nested.from_padded(wide, got_lens)[0], values)


def test_njt_round_trip_shares_structure():
    off = _offsets([2, 0, 4])
    values = torch.randn(6, 3, 4)
    nt = nested.to_njt(values, off, max_len=4)
    assert nested.is_njt(nt) and nt.shape[0] == 3 and nt.shape[2:] == (3, 4)
    v, o = nested.from_njt(nt)
    assert v is values or torch.equal(v, values)
    assert o is off
    assert not nested.is_njt(values)
    with pytest.raises(TypeError, match="layout=torch.jagged"):
        nested.from_njt(values)
    with pytest.raises(ValueError, match="ragged dimension"):
        nested.from_njt(nt.transpose(1, 2))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_njt_self_attention_matches_packed(causal):
    off = _offsets([5, 1, 0, 9])
    q, k, v = _qkv(15, 15, grad=True)
    nq, nk, nv = (nested.to_njt(t, off) for t in (q, k, v))
    out = jfa.jagged_attention(nq, nk, nv, causal=causal, backend=REF)
    ref = jfa.jagged_attention(q, k, v, off, causal=causal, backend=REF)
    assert nested.is_njt(out) and out.shape[0] == 4 and out.shape[1] == nq.shape[1]
    torch.testing.assert_close(out.values(), ref, rtol=0, atol=0)
    (out + nq).values().sum().backward()  # same ragged size j as q; gradients flow to the packed values
    g_njt = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    (ref + q).sum().backward()
    for a, b in zip(g_njt, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_njt_cross_attention_lse_and_errors():
    q_off, kv_off = _offsets([2, 3, 1]), _offsets([4, 0, 7])
    q, k, v = _qkv(6, 11)
    nq = nested.to_njt(q, q_off)
    nk, nv = nested.to_njt(k, kv_off), nested.to_njt(v, kv_off)
    out, lse = jfa.jagged_attention(nq, nk, nv, window=(2, 1), return_lse=True, backend=REF)
    ref, ref_lse = jfa.jagged_attention(q, k, v, q_off, kv_off, window=(2, 1), return_lse=True, backend=REF)
    torch.testing.assert_close(out.values(), ref, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)
    with pytest.raises(ValueError, match="offsets come from the nested tensors"):
        jfa.jagged_attention(nq, nk, nv, q_off, backend=REF)
    with pytest.raises(TypeError, match="k and v must be NJTs"):
        jfa.jagged_attention(nq, k, v, backend=REF)
    with pytest.raises(ValueError, match="same ragged structure"):
        jfa.jagged_attention(nq, nk, nested.to_njt(v[:10], _offsets([4, 0, 6])), backend=REF)


def test_njt_with_holes_is_compacted():
    base = torch.randn(4, 6, 2, 8)
    starts, lens = torch.tensor([0, 2, 1, 0]), torch.tensor([3, 4, 0, 6])
    nt = torch.nested.narrow(base, 1, starts, lens, layout=torch.jagged)
    assert nt.lengths() is not None
    out = jfa.jagged_attention(nt, nt, nt, causal=True, backend=REF)
    packed = torch.cat([base[b, s:s + n] for b, (s, n) in enumerate(zip(starts.tolist(), lens.tolist()))])
    ref = jfa.jagged_attention(packed, packed, packed, _offsets(lens), causal=True, backend=REF)
    torch.testing.assert_close(out.values(), ref, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------- FLOPs
FLOP_CASES = {  # name: (q lens or Lq for broadcast, kv lens, hq, hkv, d, window, broadcast)
    "self-full": ([5, 1, 0, 9], None, 4, 4, 8, (-1, -1), False),
    "self-causal-gqa": ([5, 1, 0, 9], None, 4, 2, 8, (-1, 0), False),
    "cross-window": ([2, 3, 1], [4, 0, 7], 2, 1, 16, (2, 1), False),
    "broadcast": (3, [4, 0, 7, 1], 2, 2, 8, (-1, -1), True),
    "broadcast-causal": (3, [4, 0, 7, 1], 2, 2, 8, (-1, 0), True),
}


@pytest.mark.parametrize("case", list(FLOP_CASES), ids=list(FLOP_CASES))
def test_flop_counter_counts_exact_visible_pairs(case):
    q_lens, kv_lens, hq, hkv, d, window, broadcast = FLOP_CASES[case]
    kv_lens = q_lens if kv_lens is None else kv_lens
    kv_off = _offsets(kv_lens)
    if broadcast:
        q, k, v = _qkv(q_lens, int(kv_off[-1]), hq, hkv, d, grad=True)
        pairs = visible_pairs([q_lens] * len(kv_lens), kv_lens, *window)
        call = lambda: jfa.broadcast_attention(q, k, v, kv_off, window=window, backend=REF)  # noqa: E731
    else:
        q_off = _offsets(q_lens)
        q, k, v = _qkv(int(q_off[-1]), int(kv_off[-1]), hq, hkv, d, grad=True)
        pairs = visible_pairs(q_lens, kv_lens, *window)
        call = lambda: jfa.jagged_attention(q, k, v, q_off, kv_off, window=window, backend=REF)  # noqa: E731
    assert pairs > 0
    with FlopCounterMode(display=False) as fwd_only:
        call()
    assert fwd_only.get_total_flops() == 4 * hq * d * pairs
    with FlopCounterMode(display=False) as both:
        call().sum().backward()
    counts = both.get_flop_counts()["Global"]
    assert counts[torch.ops.jfa.attention] == 4 * hq * d * pairs
    assert counts[torch.ops.jfa.attention_backward] == 10 * hq * d * pairs
    assert both.get_total_flops() == 14 * hq * d * pairs


def test_flop_formula_falls_back_to_an_upper_bound_on_fake_offsets():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k = torch.empty(10, 4, 8), torch.empty(12, 2, 8)
        off = torch.zeros(4, dtype=torch.long)
        full = flops.attention_flop(q, k, k, off, off, 1.0, -1, -1, False, REF)
        window = flops.attention_flop(q, k, k, off, off, 1.0, 2, 1, False, REF)
        bwd = flops.attention_backward_flop(q, None, q, None, q, k, k, off, off, 1.0, -1, -1, False)  # dout, dlse,
        # out, lse, then the problem's fields
    assert full == 4 * 4 * 8 * 10 * 12 and window == 4 * 4 * 8 * 10 * 4 and bwd == 10 * 4 * 8 * 10 * 12


# ------------------------------------------------------------------------------------------- torch.compile
LENGTH_SETS = ([3, 5, 2], [7, 1, 4], [2, 2, 9], [6, 3, 8])  # same B, different lengths and totals


def _compile_counting(fn, **kw):
    calls = []

    def backend(gm, example_inputs):
        calls.append(gm)
        return gm
    return torch.compile(fn, backend=backend, fullgraph=True, **kw), calls


@pytest.mark.parametrize("pass_max_lens", [False, True], ids=["no-max-lens", "max-lens"])
def test_compile_does_not_recompile_when_offsets_change(pass_max_lens):
    def step(q, k, v, off, pq, max_len):
        if pass_max_lens:
            o = jfa.jagged_attention(q, k, v, off, max_q_len=max_len, max_kv_len=max_len, causal=True, backend=REF)
        else:
            o = jfa.jagged_attention(q, k, v, off, causal=True, backend=REF)
        return o * 2, jfa.broadcast_attention(pq, k, v, off, backend=REF)

    compiled, graphs = _compile_counting(step, dynamic=True)
    for lens in LENGTH_SETS:
        off = _offsets(lens)
        q, k, v = _qkv(int(off[-1]), int(off[-1]))
        pq = torch.randn(2, 4, 8)
        got = compiled(q, k, v, off, pq, max(lens))
        want = step(q, k, v, off, pq, max(lens))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    assert len(graphs) == 1


def test_compile_default_dynamic_recompiles_once_then_never():
    """Default dynamic=None: the first change of a size marks it dynamic (one recompile), then none."""
    def step(q, k, v, off):
        return jfa.jagged_attention(q, k, v, off, backend=REF).sum()

    compiled, graphs = _compile_counting(step)
    for lens in LENGTH_SETS:
        off = _offsets(lens)
        compiled(*_qkv(int(off[-1]), int(off[-1])), off)
    assert len(graphs) == 2


def test_compile_njt_inputs_no_recompile():
    def step(nq, nk, nv):
        return jfa.jagged_attention(nq, nk, nv, causal=True, backend=REF)

    compiled, graphs = _compile_counting(step)
    for lens in LENGTH_SETS:
        off = _offsets(lens)
        nq, nk, nv = (nested.to_njt(t, off) for t in _qkv(int(off[-1]), int(off[-1])))
        torch.testing.assert_close(compiled(nq, nk, nv).values(), step(nq, nk, nv).values())
    assert len(graphs) == 1


# -------------------------------------------------------------------------------------------------- model
@pytest.mark.parametrize("causal,kv_heads,kw", [(False, None, {}), (True, 1, {}),
                                                (True, 1, dict(activation="gelu_tanh")), (True, None, dict(hstu=True))],
                         ids=["full", "causal-gqa", "gdpa", "hstu"])
def test_model_jfa_matches_padded_sdpa(causal, kv_heads, kw):
    """The model with jfa's attention and with the padded PyTorch layers (SDPA, or an activation's formula) in the
    same places: the same logits and gradients; GDPA attention and HSTU layers too."""
    items, off, _ = models.synthetic_batch(6, 24, 50, torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    a = models.GEMModel(50, d_model=16, heads=2, kv_heads=kv_heads, layers=2, causal=causal, impl="jfa",
                        backend=REF, **kw)
    b = models.GEMModel(50, d_model=16, heads=2, kv_heads=kv_heads, layers=2, causal=causal, impl="padded", **kw)
    b.load_state_dict(a.state_dict())
    out_a, out_b = a(items, off), b(items, off)
    torch.testing.assert_close(out_a, out_b, rtol=1e-5, atol=1e-5)
    out_a.sum().backward()
    out_b.sum().backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.interpreter
def test_hstu_model_with_the_relative_bias_portable_kernels_match_the_reference():
    """GEMModel's HSTU layers with HSTU's relative bias (num_buckets; timestamps a row): the portable kernels (on CPU
    tensors, Triton's interpreter) and the reference backend give the same logits and gradients, the bias tables'
    included, and the tables move the logits (a bias the layers dropped would not)."""
    items, off, _ = models.synthetic_batch(4, 20, 50, torch.Generator().manual_seed(2))
    times = torch.cumsum(torch.randint(1, 86_401, (items.shape[0], ), generator=torch.Generator().manual_seed(3)), 0)
    torch.manual_seed(0)
    kw = dict(d_model=32, heads=2, layers=2, max_pos=32, hstu=True, num_buckets=16)
    a = models.GEMModel(50, backend=REF, **kw)
    b = models.GEMModel(50, backend="triton", **kw)
    b.load_state_dict(a.state_dict())
    out_a, out_b = a(items, off, timestamps=times), b(items, off, timestamps=times)
    torch.testing.assert_close(out_b, out_a, rtol=1e-4, atol=1e-5)
    out_a.sum().backward()
    out_b.sum().backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-3, atol=1e-5, msg=name)
    assert a.blocks[0].ts_w.grad.abs().sum() > 0 and a.blocks[0].pos_w.grad.abs().sum() > 0
    with torch.no_grad():
        for blk in a.blocks:
            blk.ts_w.add_(1.0)
            blk.pos_w.add_(torch.linspace(-1, 1, blk.pos_w.shape[0]))
    assert not torch.allclose(a(items, off, timestamps=times), out_a.detach())
    with pytest.raises(ValueError, match="needs timestamps"):
        a(items, off)
    with pytest.raises(ValueError, match="impl='jfa'"):
        models.GEMModel(50, impl="padded", **kw)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (varlen_attn)")
def test_model_jfa_matches_fa2_on_gpu():
    items, off, _ = models.synthetic_batch(32, 512, 1000, torch.Generator().manual_seed(1))
    items, off = items.cuda(), off.cuda()
    torch.manual_seed(0)
    a = models.GEMModel(1000, d_model=128, heads=2, causal=True, impl="jfa").cuda()
    b = models.GEMModel(1000, d_model=128, heads=2, causal=True, impl="fa2").cuda()
    b.load_state_dict(a.state_dict())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out_a, out_b = a(items, off), b(items, off)
    torch.testing.assert_close(out_a.float(), out_b.float(), rtol=5e-2, atol=5e-2)


def test_synthetic_batch_label_is_trigger_presence():
    items, off, labels = models.synthetic_batch(64, 100, 500, torch.Generator().manual_seed(3), num_triggers=8)
    lens = (off[1:] - off[:-1]).tolist()
    assert min(lens) >= 1 and max(lens) <= 100
    has = torch.stack([(items[s:e] <= 8).any() for s, e in zip(off[:-1].tolist(), off[1:].tolist())])
    assert torch.equal(has.float(), labels) and 0 < labels.mean() < 1 and (items >= 1).all()


# ---------------------------------------------------------------------------------------------- partitions
@pytest.mark.parametrize("world", [2, 3, 8])
def test_lpt_partition_beats_count_partition_on_skewed_lengths(world):
    for seed in range(5):
        lens = models.skewed_lengths(world * 16, 4096, torch.Generator().manual_seed(seed))
        costs = models.attention_cost(lens)
        lpt, chunks = models.lpt_partition(costs, world), models.chunk_partition(lens.numel(), world)
        for parts in (lpt, chunks):
            assert sorted(i for p in parts for i in p) == list(range(lens.numel()))  # each exactly once
            assert all(parts)
        assert max(models.rank_loads(costs, lpt)) <= max(models.rank_loads(costs, chunks))
        # Graham's list-scheduling bound: makespan <= mean load + the largest single cost.
        assert max(models.rank_loads(costs, lpt)) <= int(costs.sum()) / world + int(costs.max())


def test_select_sequences():
    items, off, labels = torch.arange(10), _offsets([2, 3, 0, 5]), torch.tensor([0.0, 1.0, 0.0, 1.0])
    got_items, got_off, got_labels = models.select_sequences(items, off, labels, [3, 0, 2])
    assert got_items.tolist() == [5, 6, 7, 8, 9, 0, 1] and got_off.tolist() == [0, 5, 7, 7]
    assert got_labels.tolist() == [1.0, 0.0, 0.0]


# --------------------------------------------------------------------------------------------- DDP training
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gem_model_trains_with_ddp_on_two_gloo_processes():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), os.path.join(REPO, "examples", "gem_model.py"),
           "--device", "cpu", "--backend", REF, "--steps", "20", "--batch", "16", "--max-len", "32",
           "--num-items", "64", "--d-model", "16", "--heads", "2", "--kv-heads", "1", "--layers", "1",
           "--pma-queries", "2", "--lr", "1e-2", "--lr-warmup", "2", "--trigger-rate", "0.1", "--threads", "1",
           "--balance", "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert summary["world"] == 2 and summary["balance"] and summary["steps"] == 20
    assert summary["final_loss"] < summary["first_loss"] - 0.05, summary
    assert summary["median_tokens_per_s"] > 0 and summary["peak_mem_mb"] > 0


def _example(*args):
    """examples/gem_model.py's main() in this process: its summary (the final JSON line)."""
    sys.path.insert(0, os.path.join(REPO, "examples"))
    try:
        import gem_model
    finally:
        sys.path.pop(0)
    return gem_model.main(["--device", "cpu", "--backend", REF, "--quiet", *args])


def test_gem_example_learns_its_default_task_on_cpu():
    """The example's default data (--trigger-rate 0.02) is learnable: 40 steps of a small model (its warm-up
    shortened to 5 steps) take the loss from chance (ln 2 = 0.693) below 0.6 and the AUC past 0.75 (200 steps
    reach ~0.04 and 1.0)."""
    learns = _example("--steps", "40", "--batch", "32", "--max-len", "256", "--d-model", "64", "--heads", "4",
                      "--pma-queries", "4", "--num-items", "1000", "--threads", "2", "--lr-warmup", "5")
    assert learns["first_loss"] > 0.65 and learns["final_loss"] < 0.6, learns
    assert learns["final_auc"] > 0.75, learns


def test_gem_example_compiles_once_lengths_vary():
    """--compile: the whole model under torch.compile(fullgraph=True) (no graph break around jfa); the first two
    steps compile (static, then dynamic sizes), the later ones, with other lengths, none."""
    summary = _example("--steps", "5", "--batch", "8", "--max-len", "64", "--d-model", "32", "--heads", "2",
                       "--layers", "1", "--pma-queries", "2", "--num-items", "100", "--threads", "2", "--compile")
    assert summary["compiled_graphs"] >= 1 and summary["recompiles_after_step_2"] == 0, summary


def test_gem_example_records_what_it_ran_and_scores_targets():
    """--hstu --targets 2: HSTU layers with each history's last 2 items as candidates (HSTU's mask); the summary
    says so (layers, activation, causal, targets). A missing peer or a mask without causal attention is one line."""
    summary = _example("--steps", "2", "--batch", "4", "--max-len", "32", "--num-items", "50", "--d-model", "16",
                       "--heads", "2", "--layers", "1", "--pma-queries", "2", "--hstu", "--targets", "2")
    assert (summary["layers_kind"], summary["activation"], summary["causal"], summary["targets"]) == \
        ("hstu", "silu", True, 2), summary
    with pytest.raises(SystemExit, match="needs causal attention"):
        _example("--steps", "1", "--targets", "2")
    biased = _example("--steps", "2", "--batch", "4", "--max-len", "32", "--num-items", "50", "--d-model", "16",
                      "--heads", "2", "--layers", "1", "--pma-queries", "2", "--hstu", "--rel-bias", "16")
    assert biased["rel_bias"] == 16 and biased["layers_kind"] == "hstu", biased
    with pytest.raises(SystemExit, match="needs --hstu"):
        _example("--steps", "1", "--rel-bias", "16")
    from jfa import peers
    if peers.hstu_available():
        with pytest.raises(SystemExit, match="scripts/carry_hstu.sh"):
            _example("--steps", "1", "--attention", "hstu", "--hstu")
