"""The bench's peers on the CPU: their masks against jfa's reference (FlexAttention's, the padded formula's) and
what each peer kernel refuses (HSTU's, GDPA's, HSTU's cached kernel) before the bench would time it wrongly."""
import pytest
import torch

import jfa
from jfa.bench import suite


def test_flex_provider_masks_windows_like_the_reference():
    """FlexAttention peer on the CPU (forward): its document + window mask must match jfa's visibility rule,
    also when a second workload recompiles the mask with other window bounds (as a bench run does: a bound
    captured as a Python int then turned into a SymInt and broke create_block_mask on the H200)."""
    import dataclasses

    import jfa
    from jfa.bench import peer_providers, suite
    base = next(w for w in suite.load_suite()[1] if w.name == "window-256")
    for window in ([20, 3], [7, 0], [-1, 0]):
        w = dataclasses.replace(base, batch=3, max_len=160, heads_q=2, heads_kv=2, head_dim=32, window=window)
        inp = suite.make_inputs(w, device="cpu", dtype=torch.float32)
        for t in (inp.q, inp.k, inp.v):
            t.requires_grad_(False)  # FlexAttention has no CPU backward
        fn, _ = peer_providers.Flex().build(inp)
        ref = jfa.jagged_attention(inp.q, inp.k, inp.v, inp.q_offsets, inp.kv_offsets, window=tuple(window),
                                   backend="reference")
        torch.testing.assert_close(fn(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("serving", [False, True], ids=["self", "serving"])
@pytest.mark.parametrize("contextual_len,window", [(0, -1), (2, 9)], ids=str)
def test_peers_mask_targets_like_the_reference(contextual_len, window, serving):
    """The FlexAttention peer on the CPU (forward; its mask_mod from per-row positions) and the padded formula with
    HSTU's mask against jfa's reference of jfa.jagged.target_mask, 0 and all-target sequences among them; serving:
    each sequence's last rows as queries."""
    import dataclasses

    from jfa.bench import peer_providers
    from jfa.peers import padded_attention
    base = next(w for w in suite.load_suite()[1] if w.name == "softmax-targets")
    w = dataclasses.replace(base, batch=4, max_len=150, heads_q=2, heads_kv=2, head_dim=32, window=(window, 0),
                            contextual_len=contextual_len, **(dict(mode="cross", q_len=20) if serving else {}))
    inp = suite.make_inputs(w, device="cpu", dtype=torch.float32)
    inp.num_targets[0], inp.num_targets[1] = 0, inp.kv_lens[1]
    for t in (inp.q, inp.k, inp.v):
        t.requires_grad_(False)  # FlexAttention has no CPU backward
    fn, _ = peer_providers.Flex().build(inp)
    kv_offsets = inp.kv_offsets if serving else None
    ref = jfa.jagged_attention(inp.q, inp.k, inp.v, inp.q_offsets, kv_offsets, backend="reference", **inp.score())
    torch.testing.assert_close(fn(), ref, atol=1e-5, rtol=1e-5)
    padded = padded_attention(inp.q, inp.k, inp.v, inp.q_offsets, kv_offsets, **inp.score())
    torch.testing.assert_close(padded, ref, atol=1e-5, rtol=1e-5)


def test_hstu_peer_refuses_what_its_kernel_cannot_compute():
    from jfa.peers import hstu_refusal
    assert hstu_refusal(True, 0, "silu", 1 / 4096, 4096) is None
    assert "N = 1 / out_scale = 512" in hstu_refusal(True, 0, "silu", 1 / 512, 600)  # its grid would miss rows
    for args in ((False, 0, "silu", 1 / 64), (True, -1, "silu", 1 / 64), (True, 0, "softmax", 1 / 64),
                 (True, 0, "silu", 0.3), (True, 0, "silu", torch.ones(3))):
        assert "causal silu self-attention" in hstu_refusal(*args, 10)


def test_hstu3_peer_refuses_what_its_build_cannot_compute():
    """NVIDIA's HSTU kernel as scripts/build_hstu3_cuda.sh builds it: causal silu self-attention scaled by 1 / N (its
    scaling_seqlen: any N, not a grid bound), no window; without the built library it says how to build it."""
    from jfa.peers import hstu3_cuda_available, hstu3_refusal
    assert hstu3_refusal(True, -1, 0, "silu", 1 / 512) is None  # (N below the longest sequence: only a scale here)
    assert "without windows" in hstu3_refusal(True, 100, 0, "silu", 1 / 4096)
    for args in ((False, -1, 0, "silu", 1 / 64), (True, -1, -1, "silu", 1 / 64), (True, -1, 0, "gelu", 1 / 64),
                 (True, -1, 0, "silu", 0.3)):
        assert "causal silu self-attention" in hstu3_refusal(*args)
    import jfa.peers
    if not (jfa.peers.HSTU3_DIR / "hstu" / "fbgemm_gpu_experimental_hstu.so").exists():
        assert "scripts/build_hstu3_cuda.sh" in hstu3_cuda_available()


def test_gdpa_peer_takes_the_activations_it_has_without_a_causal_mask():
    from jfa.peers import GDPA_ACTIVATIONS, gdpa_refusal
    from jfa.reference import ACTIVATIONS
    assert set(GDPA_ACTIVATIONS) <= set(ACTIVATIONS)  # (jfa's names for GDPA's Activation values)
    for activation in GDPA_ACTIVATIONS:
        assert gdpa_refusal(activation, (-1, -1), 1.0) is None
        assert gdpa_refusal(activation, (64, 64), 0.5) is None  # its window: |i - j| <= W
    assert "no softmax" in gdpa_refusal("softmax", (-1, -1), 1.0)
    assert "no sigmoid" in gdpa_refusal("sigmoid", (-1, -1), 1.0)
    for window in ((-1, 0), (128, 0), (64, 32)):
        assert "no causal mask" in gdpa_refusal("silu", window, 1.0)
    assert "one output scale" in gdpa_refusal("silu", (-1, -1), torch.ones(3))


def test_hstu_cached_peer_refuses_jagged_new_rows():
    from jfa.peers import hstu_cached_refusal
    assert hstu_cached_refusal(torch.tensor([4, 4, 4]), 0, "silu", 1 / 64, 64) is None
    assert "same number of new rows" in hstu_cached_refusal(torch.tensor([4, 3]), 0, "silu", 1 / 64, 64)
    assert "causal silu attention" in hstu_cached_refusal(torch.tensor([4]), 0, "softmax", 1 / 64, 64)
