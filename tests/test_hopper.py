"""GPU tests of the Hopper backend (sm_90 only): every mode forward and backward through the public API, the
fallbacks, determinism, schedule sharing, and inputs TMA cannot take as they are."""
import dataclasses

import pytest
import torch

import jfa
import jfa.variants
from jfa import hopper
from jfa.hopper import config
from jfa.testing import (GPU_LENS, GPU_MODES, case_problem, compare, make_case, offsets_of, run_backend,
                         run_kernels, serving_lens)

pytestmark = pytest.mark.gpu

MODES = GPU_MODES


@pytest.fixture(autouse=True)
def _needs_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")


def _case(mode, d, dtype=torch.bfloat16):
    kw = dict(MODES[mode])
    kw.setdefault("hq", 4)
    kw.setdefault("hkv", 4)
    return make_case(**kw, d=d, dtype=dtype, device="cuda", seed=d)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mode", list(MODES))
def test_hopper_backend(mode, dtype, d):
    case = _case(mode, d, dtype)
    out, lse, grads = run_backend(case, "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


FWD_FORMS = {"short-tile": config.select_fwd(128, 64), "short": config.select_fwd(128, 300),
             "long": config.select_fwd(128)}


@pytest.mark.parametrize("form", list(FWD_FORMS))
@pytest.mark.parametrize("mode", list(MODES))
def test_hopper_forward_forms(mode, form):
    """Every D=128 forward form (jfa.hopper.config.select_fwd picks one by the batch's mean key length), handed in
    whatever the lengths of the test batch: every mode against the reference."""
    cfg = FWD_FORMS[form]
    case = _case(mode, 128)
    out, lse, grads = run_kernels(case, lambda p: hopper.forward(p, cfg), hopper.backward, "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


D64_FWD_FORMS = {"short": config.select_fwd(64, 300), "long": config.select_fwd(64)}


@pytest.mark.parametrize("activation", ["softmax", "gelu_tanh"])
@pytest.mark.parametrize("form", list(D64_FWD_FORMS))
@pytest.mark.parametrize("mode", list(MODES))
def test_hopper_d64_forward_forms(mode, form, activation):
    """Both D=64 forward forms (one consumer a CTA, two CTAs an SM; two consumers in ping-pong past SHORT_KV), handed
    in whatever the test batch's lengths (which alone pick the short form), softmax and an activation: every mode
    against the reference."""
    cfg = D64_FWD_FORMS[form]
    kw = dict(activation=activation, out_scale=0.01) if activation != "softmax" else {}
    case = make_case(**dict(dict(hq=4, hkv=4), **MODES[mode]), d=64, dtype=torch.bfloat16, device="cuda", seed=64,
                     **kw)
    out, lse, grads = run_kernels(case, lambda p: hopper.forward(p, cfg), hopper.backward, "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("form", list(FWD_FORMS) + ["d64-short", "d64-long"])
@pytest.mark.parametrize("mode", list(MODES))
def test_hopper_forward_work_queue(mode, form):
    """The forward taking its items from a work queue (FwdConfig.queue: an atomic ticket over the schedule's ranks,
    each item posted to the consumers) in every form: every mode against the reference."""
    d = 64 if form.startswith("d64") else 128
    cfg = dataclasses.replace(D64_FWD_FORMS[form[4:]] if d == 64 else FWD_FORMS[form], queue=True)
    case = _case(mode, d)
    out, lse, grads = run_kernels(case, lambda p: hopper.forward(p, cfg), hopper.backward, "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


def _plan(route, d, mean_q_len=float("inf")):
    """The backward of dQ route `route` (a DqRoute), whatever the batch."""
    dkdv = config.select_dkdv(d, route, mean_q_len)
    if route == config.DqRoute.REDUCE:
        return config.BwdPlan(dkdv, None)
    return config.BwdPlan(dkdv, config.select_dq(d), dkdv.block_n if route == config.DqRoute.DIRECT else 0)


@pytest.mark.parametrize("mode", list(MODES))
def test_hopper_one_pass_short_query_blocks(mode):
    """The one pass at D=128 with 32-row (Q, dO) blocks, dQ computed transposed and two K/V sets
    (jfa.hopper.config.SHORT_Q, chosen by the mean query rows per sequence), whatever the test batch's lengths:
    every mode against the reference."""
    plan = _plan(config.DqRoute.REDUCE, 128, mean_q_len=config.SHORT_Q)
    assert plan.dkdv.block_m == 32
    case = _case(mode, 128)
    out, lse, grads = run_kernels(case, hopper.forward, lambda *args: hopper.backward(*args, plan=plan), "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("mode", list(MODES))
def test_hopper_dkdv_pass_short_query_blocks(mode):
    """The two passes at D=128 with the dK/dV pass's 32-row (Q, dO) blocks and two K/V sets
    (jfa.hopper.config.SHORT_Q_DKDV: broadcast q of 64 rows takes them), whatever the test batch's lengths."""
    plan = _plan(config.DqRoute.NONE, 128, mean_q_len=config.SHORT_Q_DKDV)
    assert plan.dkdv.block_m == 32 and plan.dkdv.kv_slots == 2
    case = _case(mode, 128)
    out, lse, grads = run_kernels(case, hopper.forward, lambda *args: hopper.backward(*args, plan=plan), "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mode", [m for m in MODES if MODES[m].get("broadcast_lq")])
def test_hopper_broadcast_dq_slab(mode, d):
    """Broadcast q's one pass with every CTA adding dQ into the same float32 slab of Lq rows, in the 64-row and the
    32-row forms."""
    case = _case(mode, d)
    forms = {_plan(config.DqRoute.REDUCE, d, mean_q_len).dkdv for mean_q_len in (float("inf"), config.SHORT_Q)}
    for dkdv in forms:  # (one form at D=64)
        plan = config.BwdPlan(dkdv, None)
        out, lse, grads = run_kernels(case, hopper.forward, lambda *args: hopper.backward(*args, plan=plan), "hopper")
        failures = compare(case, out, lse, grads)
        assert not failures, f"block_m {plan.dkdv.block_m}: " + "\n".join(failures)


@pytest.mark.parametrize("route", list(config.DqRoute), ids=lambda r: r.name.lower())
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mode", list(MODES))
def test_hopper_backward_work_queue(mode, d, route):
    """The dK/dV kernel taking its items from a work queue (DkdvConfig.queue: an atomic ticket over the schedule's
    ranks, each item posted to the consumers and the dQ writer) in every route, and at D=128 in the one pass's
    short-q form too: every mode against the reference."""
    if route == config.DqRoute.DIRECT and MODES[mode].get("broadcast_lq"):
        pytest.skip("broadcast q never takes the direct route")
    plans = [_plan(route, d)] + ([_plan(route, d, config.SHORT_Q)] if route == config.DqRoute.REDUCE else [])
    case = _case(mode, d)
    for plan in {dataclasses.replace(plan, dkdv=dataclasses.replace(plan.dkdv, queue=True)) for plan in plans}:
        out, lse, grads = run_kernels(case, hopper.forward, lambda *args: hopper.backward(*args, plan=plan), "hopper")
        failures = compare(case, out, lse, grads)
        assert not failures, f"{plan.dkdv}: " + "\n".join(failures)


@pytest.mark.parametrize("route", list(config.DqRoute), ids=lambda r: r.name.lower())
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mode", list(MODES))
def test_hopper_backward_routes(mode, d, route):
    """Every way the backward computes dQ (jfa.hopper.config.dq_route picks one by shape), whatever the lengths of
    the test batch: the dQ pass alone, the one pass's reduce-adds, and the dK/dV pass storing the dQ of the
    sequences whose keys fit its key tile with the dQ pass doing the rest (the batch mixes both kinds; not for
    broadcast q, whose dQ sums over the batch)."""
    if route == config.DqRoute.DIRECT and MODES[mode].get("broadcast_lq"):
        pytest.skip("broadcast q never takes the direct route")
    plan = _plan(route, d)
    case = _case(mode, d)
    out, lse, grads = run_kernels(case, hopper.forward, lambda *args: hopper.backward(*args, plan=plan), "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mode", list(MODES))
def test_hopper_deterministic_backward(mode, d):
    """deterministic=True takes the two-pass backward (no atomics): the same checks."""
    case = _case(mode, d)
    out, lse, grads = run_backend(case, "hopper", deterministic=True)
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


def test_auto_picks_hopper_where_it_applies_and_falls_back_elsewhere():
    cuda = torch.device("cuda")
    assert jfa.backends.select("auto", cuda, 128, torch.bfloat16) == "hopper"
    assert jfa.backends.select("auto", cuda, 64, torch.float16) == "hopper"
    assert jfa.backends.select("auto", cuda, 96, torch.bfloat16) == "triton"
    assert jfa.backends.select("auto", cuda, 128, torch.float32) == "triton"
    with pytest.raises(ValueError, match="hopper"):
        jfa.backends.select("hopper", cuda, 96, torch.bfloat16)


def test_hopper_unaligned_and_strided_inputs():
    """q/k/v that are views (a fused qkv projection, an odd element offset) give the same result."""
    case = make_case([1, 63, 65, 129, 300], hq=4, hkv=4, d=128, dtype=torch.bfloat16, device="cuda", causal=True)
    t = case.q.shape[0]
    fused = torch.empty(t, 3, 4, 128, dtype=case.q.dtype, device="cuda")
    fused[:, 0], fused[:, 1], fused[:, 2] = case.q, case.k, case.v
    flat = torch.empty(case.q.numel() + 1, dtype=case.q.dtype, device="cuda")
    odd = flat[1:].view_as(case.q)
    odd.copy_(case.q)
    for q, k, v in ((fused[:, 0], fused[:, 1], fused[:, 2]), (odd, case.k, case.v)):
        out = jfa.jagged_attention(q, k, v, case.q_offsets, window=(-1, 0), scale=case.scale, backend="hopper")
        ref = jfa.jagged_attention(case.q, case.k, case.v, case.q_offsets, window=(-1, 0), scale=case.scale,
                                   backend="triton")
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=0)


def test_hopper_heads_not_packed_in_a_row():
    """q, k, v, dO from head-major [H, T, D] buffers seen as [T, H, D] (a row's heads are not contiguous, so TMA
    cannot take them as they are), forward and backward against the reference."""
    case = make_case([1, 63, 65, 129, 300], hq=4, hkv=2, d=128, dtype=torch.bfloat16, device="cuda", causal=True)
    case = dataclasses.replace(case, **{n: getattr(case, n).transpose(0, 1).contiguous().transpose(0, 1)
                                        for n in ("q", "k", "v", "dout")})
    assert case.q.stride(1) != 128 and case.q.clone().stride() == case.q.stride()  # as run_backend passes it
    out, lse, grads = run_backend(case, "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


def test_hopper_int64_offsets():
    case = make_case([0, 1, 63, 65, 129, 300], [5, 0, 64, 130, 129, 1], hq=4, hkv=2, d=64, dtype=torch.float16,
                     device="cuda", causal=True, offsets_dtype=torch.int64)
    out, lse, grads = run_backend(case, "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


SHORT_LENS = [0, 1, 2, 63, 64, 65, 127, 128, 3]  # GPU_LENS up to the dK/dV pass's key tile


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mode", [m for m in MODES if not MODES[m].get("broadcast_lq") and m != "empty-kv"]
                         + ["cross-unmasked"])
def test_hopper_backward_skips_the_dq_pass_by_max_kv_len(mode, d):
    """A max_kv_len within the dK/dV pass's key tile: every dQ comes from the dK/dV pass (DqRoute.DIRECT) and the
    plan has no dQ pass; against the reference. Without the bound the dQ pass runs (it cannot know). cross-unmasked:
    dQ's buffer is not zero-filled there either, but for its sequence of 3 queries and no key (jfa.hopper.dq_buffer)."""
    kw = dict(MODES.get(mode, dict(kv_lens=None)), q_lens=SHORT_LENS)
    if "kv_lens" in kw:
        kw["kv_lens"] = SHORT_LENS[::-1]
    kw.setdefault("hq", 4)
    kw.setdefault("hkv", 4)
    case = make_case(**kw, d=d, dtype=torch.bfloat16, device="cuda", seed=d)
    for max_lens in (True, False):
        plan = config.select_bwd(case_problem(case, "hopper", max_lens=max_lens))
        assert plan.dkdv.dq == config.DqRoute.DIRECT and (plan.dq is None) == max_lens
        # freed NaNs for the caching allocator to hand out again: in self-attention and unmasked cross attention with
        # the bound dQ's buffer is not zero-filled (jfa.hopper.dq_buffer), and a row no kernel writes cannot pass as
        # zeros
        torch.full((1 << 24, ), float("nan"), device="cuda")
        out, lse, grads = run_backend(case, "hopper", max_lens=max_lens)
        failures = compare(case, out, lse, grads)
        assert not failures, "\n".join(failures)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("activation", ["softmax", "silu"])
def test_hopper_by_length_class(d, activation):
    """A mixed batch (short mean, a long sequence allowed by max_kv_len: jfa.hopper.config.fwd_classes and
    bwd_classes): the forward's and the backward's kernels once a class, each over its class's sequences, together
    every row and key; against the reference."""
    lens = [0, 1, 63, 65, 129, 40, 5, 17, 33, 100, 2, 70, 9, 1, 64, 900]  # mean 94, one past SHORT_KV
    case = make_case(lens, hq=4, hkv=2, d=d, dtype=torch.bfloat16, device="cuda", causal=True, seed=d,
                     activation=activation)
    p = case_problem(case, "hopper", max_lens=True)
    assert len(config.fwd_classes(p)) == 2 and len(config.bwd_classes(p)) == 2
    torch.full((1 << 24, ), float("nan"), device="cuda")  # (a row no launch wrote cannot pass as zeros)
    out, lse, grads = run_backend(case, "hopper", max_lens=True)
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


def test_hopper_backward_is_deterministic():
    """deterministic=True: same inputs, same bits, run to run. GQA and broadcast are the cases where a reduction
    could reorder (dK/dV over a GQA group, dQ over the batch); "short" is a batch of at most 128 keys per sequence,
    where the dK/dV pass stores some of dQ itself (jfa.hopper.config.DQ_DIRECT)."""
    short = dict(q_lens=[0, 1, 2, 63, 64, 65, 127, 128, 129, 3], hq=8, hkv=2, causal=True)
    for mode in ("gqa", "broadcast-causal-gqa", "short"):
        case = make_case(**short, d=128, dtype=torch.bfloat16, device="cuda", seed=1) if mode == "short" else _case(mode, 128)
        first = run_backend(case, "hopper", deterministic=True)
        again = run_backend(case, "hopper", deterministic=True)
        for a, b in zip((first[0], first[1]) + tuple(first[2]), (again[0], again[1]) + tuple(again[2])):
            assert torch.equal(a, b), f"{mode}: results differ between two identical runs"


def test_hopper_backward_reuses_the_forward_schedule():
    """At D=128 the dQ pass runs on the forward's schedule (same cache entry): a forward and backward keep two
    schedules (forward/dQ, dK/dV), not three; a second step on the same offsets allocates none."""
    from jfa.schedule import CACHE
    case = _case("causal", 128)
    CACHE.entries.clear()
    run_backend(case, "hopper")
    assert len(CACHE.entries) == 2
    before = [e[2] for e in CACHE.entries.values()]
    run_backend(case, "hopper")
    assert [e[2] for e in CACHE.entries.values()] == before


@pytest.mark.parametrize("score", ["softmax", "silu-targets"])
@pytest.mark.parametrize("form", list(FWD_FORMS))
def test_hopper_forward_reads_pages(form, score):
    """Paged k and v (pages of 128 rows scattered through a pool with spare pages: jfa.KVCache's layout) through
    every D=128 forward form: the packed call's bits, serving's queries (each sequence's last rows)."""
    from jfa.api import problem
    g = torch.Generator().manual_seed(21)
    page, lens = 128, GPU_LENS
    q_lens = serving_lens(lens)
    per_seq = -(-max(lens) // page)
    pool_pages = len(lens) * per_seq + 3
    table = torch.randperm(pool_pages, generator=g)[:len(lens) * per_seq].view(len(lens), per_seq)
    k_pool, v_pool = (torch.randn(pool_pages * page, 2, 128, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    q = torch.randn(sum(q_lens), 4, 128, generator=g).to("cuda", torch.bfloat16)
    qo, ko = offsets_of(q_lens, "cuda"), offsets_of(lens, "cuda")
    table = table.to("cuda", torch.int32)
    rows = jfa.jagged.paged_rows(table, ko, page)
    opts = dict(causal=True) if score == "softmax" else dict(
        causal=True, activation="silu", out_scale=1 / 2048, contextual_len=1,
        num_targets=torch.tensor([0, 1, 2, 5, 0, 1, 9, 3, 1, 0, 20, 7], dtype=torch.int32, device="cuda"))
    paged = problem(q, k_pool, v_pool, qo, ko, page_table=table, page_size=page, backend="hopper", **opts)
    packed = problem(q, k_pool[rows], v_pool[rows], qo, ko, backend="hopper", **opts)
    cfg = config.for_problem(FWD_FORMS[form], paged)
    assert torch.equal(hopper.forward(paged, cfg)[0], hopper.forward(packed, cfg)[0])
