"""GPU tests of the Hopper backend's score functions and HSTU's masks (sm_90 only): every activation in softmax's
place, their folded forms and dQ routes, and the target masks through every forward form and dQ route, against the
reference."""
import dataclasses

import pytest
import torch

import jfa.variants
from jfa import hopper
from jfa.hopper import config
from jfa.testing import GPU_LENS, compare, make_case, run_backend, run_kernels, serving_lens
from test_hopper import FWD_FORMS, MODES, _plan

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_hopper():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")


ACTIVATIONS = list(jfa.variants.ACTIVATIONS)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_hopper_activations(activation, mode):
    """Every activation in softmax's place, every mode, D=128 bf16, forward and backward against the float64
    formula: a constant out scale, and a per-row one in the GQA and broadcast modes."""
    case = make_case(**dict(dict(hq=4, hkv=4), **MODES[mode]), d=128, dtype=torch.bfloat16, device="cuda", seed=11,
                     activation=activation, out_scale="rows" if "gqa" in mode or mode == "broadcast" else 1 / 256)
    out, lse, grads = run_backend(case, "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mode", ["causal", "cross", "broadcast-causal-gqa", "window"])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "gelu", "identity"])
def test_hopper_activations_d64(activation, mode, dtype):
    case = make_case(**dict(dict(hq=4, hkv=4), **MODES[mode]), d=64, dtype=dtype, device="cuda", seed=12,
                     activation=activation, out_scale=0.01)
    out, lse, grads = run_backend(case, "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("form", list(FWD_FORMS))
@pytest.mark.parametrize("route", list(config.DqRoute), ids=lambda r: r.name.lower())
@pytest.mark.parametrize("mode", ["causal", "gqa", "broadcast"])
def test_hopper_activation_forms(mode, route, form):
    """silu through every forward form and every dQ route (handed in), as the softmax tests do."""
    if route == config.DqRoute.DIRECT and MODES[mode].get("broadcast_lq"):
        pytest.skip("broadcast q never takes the direct route")
    cfg, plan = FWD_FORMS[form], _plan(route, 128)
    case = make_case(**dict(dict(hq=4, hkv=4), **MODES[mode]), d=128, dtype=torch.bfloat16, device="cuda",
                     seed=13, activation="silu", out_scale=1 / 128)
    out, lse, grads = run_kernels(case, lambda p: hopper.forward(p, cfg),
                                  lambda *args: hopper.backward(*args, plan=plan), "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("route", list(config.DqRoute), ids=lambda r: r.name.lower())
@pytest.mark.parametrize("mode", ["causal", "gqa", "broadcast"])
def test_hopper_folded_backward_d64_routes(mode, route):
    """gelu_tanh at D=64, whose backward takes its folded form (jfa.variants.fold_backward: dV takes C k), through
    every dQ route (handed in)."""
    if route == config.DqRoute.DIRECT and MODES[mode].get("broadcast_lq"):
        pytest.skip("broadcast q never takes the direct route")
    case = make_case(**dict(dict(hq=4, hkv=4), **MODES[mode]), d=64, dtype=torch.bfloat16, device="cuda", seed=14,
                     activation="gelu_tanh", out_scale=0.01)
    out, lse, grads = run_kernels(case, hopper.forward, lambda *args: hopper.backward(*args, plan=_plan(route, 64)),
                                  "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


def test_hopper_activation_deterministic_and_short_q():
    """deterministic=True: the same bits twice; and the one pass's 32-row blocks with an activation."""
    case = make_case(**MODES["broadcast-causal-gqa"], d=128, dtype=torch.bfloat16, device="cuda", seed=3,
                     activation="gelu_tanh")
    first, again = (run_backend(case, "hopper", deterministic=True) for _ in range(2))
    for a, b in zip((first[0], *first[2]), (again[0], *again[2])):
        assert torch.equal(a, b)
    plan = _plan(config.DqRoute.REDUCE, 128, mean_q_len=config.SHORT_Q)
    case = make_case(**dict(MODES["cross"], hq=4, hkv=2), d=128, dtype=torch.bfloat16, device="cuda", seed=4,
                     activation="silu", out_scale=0.1)
    out, lse, grads = run_kernels(case, hopper.forward, lambda *args: hopper.backward(*args, plan=plan), "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


TARGET_MASKS = {  # HSTU's mask on the GPU lengths: contextual_len, window (HSTU's max_attn_len; -1: none),
    # min_full_attn_len (the history's last rows see past the window); serving: each sequence's last rows as queries
    # (jfa.testing.serving_lens)
    "targets": (0, -1, 0), "targets-window": (0, 100, 0), "context-1": (1, -1, 0), "context-5-window": (5, 300, 0),
    "serving-context-5-window": (5, 300, 0), "full-150-window-100": (0, 100, 150),
    "serving-context-5-full-40-window-60": (5, 60, 40),
}


def _target_lens(mask):
    """(q_lens, kv_lens) of a TARGET_MASKS case for make_case."""
    return (serving_lens(GPU_LENS), GPU_LENS) if mask.startswith("serving") else (GPU_LENS, None)


@pytest.mark.parametrize("activation", ["softmax", "silu", "gelu_tanh"])
@pytest.mark.parametrize("mask", list(TARGET_MASKS))
@pytest.mark.parametrize("d", [64, 128])
def test_hopper_target_masks(mask, activation, d):
    """HSTU's mask (jfa.jagged.target_mask) against the float64 rule, forward and backward, GQA, random target
    counts (0 and all-target sequences among them)."""
    context, window, full = TARGET_MASKS[mask]
    case = make_case(*_target_lens(mask), causal=True, window=(window, -1), num_targets="random",
                     contextual_len=context, hq=8, hkv=2, d=d, dtype=torch.bfloat16, device="cuda", seed=17,
                     activation=activation, out_scale=1.0 if activation == "softmax" else 1 / 2048,
                     min_full_attn_len=full)
    out, lse, grads = run_backend(case, "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("mask", ["context-5-window", "serving-context-5-window", "full-150-window-100"])
@pytest.mark.parametrize("route", list(config.DqRoute), ids=lambda r: r.name.lower())
@pytest.mark.parametrize("form", list(FWD_FORMS))
def test_hopper_target_mask_forms(form, route, mask):
    """HSTU's mask through every forward form and dQ route (handed in), with a context and a window, in
    self-attention and serving, and with the history's last rows past the window (min_full_attn_len)."""
    cfg, plan = dataclasses.replace(FWD_FORMS[form], posted_items=False), _plan(route, 128)
    plan = dataclasses.replace(plan, dkdv=dataclasses.replace(plan.dkdv, posted_items=False))
    full = TARGET_MASKS[mask][2]
    case = make_case(*_target_lens(mask), causal=True, window=(100 if full else 200, -1), num_targets="random",
                     contextual_len=3, hq=4, hkv=4, d=128, dtype=torch.bfloat16, device="cuda", seed=18,
                     activation="silu", out_scale=0.01, min_full_attn_len=full)
    out, lse, grads = run_kernels(case, lambda p: hopper.forward(p, cfg),
                                  lambda *args: hopper.backward(*args, plan=plan), "hopper")
    failures = compare(case, out, lse, grads)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("mask", ["context-5-window", "serving-context-5-window", "full-150-window-100"])
@pytest.mark.parametrize("route", list(config.DqRoute), ids=lambda r: r.name.lower())
def test_hopper_target_mask_posted_items(route, mask):
    """HSTU's mask with posted items (a record carries the target count and a key tile's prefix:
    ItemOperands.post): the short forward form posting its items with the dK/dV kernel posting them, the long
    forward form and the dK/dV kernel taking theirs from a work queue (FwdConfig.queue, DkdvConfig.queue)."""
    plan = _plan(route, 128)
    full = TARGET_MASKS[mask][2]
    case = make_case(*_target_lens(mask), causal=True, window=(100 if full else 200, -1), num_targets="random",
                     contextual_len=3, hq=4, hkv=4, d=128, dtype=torch.bfloat16, device="cuda", seed=19,
                     activation="silu", out_scale=0.01, min_full_attn_len=full)
    assert FWD_FORMS["short-tile"].posted_items
    for cfg, fields in ((FWD_FORMS["short-tile"], dict(posted_items=True)),
                        (dataclasses.replace(FWD_FORMS["long"], queue=True), dict(queue=True))):
        bwd_plan = dataclasses.replace(plan, dkdv=dataclasses.replace(plan.dkdv, **fields))
        out, lse, grads = run_kernels(case, lambda p: hopper.forward(p, cfg),
                                      lambda *args: hopper.backward(*args, plan=bwd_plan), "hopper")
        failures = compare(case, out, lse, grads)
        assert not failures, f"{cfg}, {fields}: " + "\n".join(failures)
