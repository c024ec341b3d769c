"""The bench's correctness gate (jfa.bench.runner): a provider is checked against jfa's reference before it is timed;
one that is wrong, crashes, is missing, has no backward (serving) or whose backward fails is reported as such."""
import pytest
import torch

import jfa
from jfa.bench import report, runner, suite
from jfa.bench.peer_providers import SdpaPadded
from jfa.bench.providers import Jfa, Provider
from test_bench import brute_pairs


class WrongScale(Provider):
    """A peer that gets the softmax scale wrong (1.25x): the gate must reject it."""
    name = "wrong-scale"

    def build(self, inp):
        def fn():
            return jfa.jagged_attention(inp.q, inp.k, inp.v, inp.q_offsets, inp.kv_offsets, window=inp.window,
                                        scale=1.25 * inp.scale, backend="reference")
        return fn, {}


class Crashes(Provider):
    name = "crashes"

    def build(self, inp):
        raise RuntimeError("CUDA out of memory (pretend)")


class NotHere(Provider):
    name = "not-here"

    def skip_reason(self, inp):
        return "not installed"


def test_gate_rejects_a_wrong_provider():
    w = suite.Workload("tiny", "self", batch=3, max_len=12, dist="file", heads_q=2, heads_kv=1, head_dim=16,
                       window=(-1, 0), lengths=(12, 3, 7))
    providers = [Jfa("reference", explicit=True), WrongScale(), Crashes(), NotHere(), SdpaPadded()]
    res = runner.run_workload(w, providers, "cpu", cpu_reps=1)
    r = res["results"]
    assert r["jfa-reference"]["correct"] is True and r["jfa-reference"]["fwd_ms"] > 0
    assert r["sdpa-padded"]["correct"] is True and r["sdpa-padded"]["fwd_tflops"] > 0
    assert r["wrong-scale"]["correct"] is False and "fwd_ms" not in r["wrong-scale"]
    err, tol = r["wrong-scale"]["check"]["errors"]["out"]
    assert err > tol
    assert "out of memory" in r["crashes"]["error"] and "fwd_ms" not in r["crashes"]
    assert r["not-here"] == {"skip": "not installed", "correct": None}
    assert res["best_peer"]["fwd"]["provider"] == "sdpa-padded"
    assert set(res["ratios"]) == {"jfa-reference"}
    assert res["pairs"] == brute_pairs([12, 3, 7], [12, 3, 7], -1, 0)
    assert report.provider_status(r["wrong-scale"]).startswith("WRONG (d")  # worst: a gradient


def test_gate_checks_leading_heads_of_a_sequence_over_its_budget(monkeypatch):
    """A first sequence alone over the gate's budget (spike-32k's 32K keys on an 80 GB card) is checked on its leading
    GQA groups: the reference runs on those heads, the provider on the whole batch with the other heads' upstream
    gradient zero; a wrong provider is still caught."""
    w = suite.Workload("spike", "self", batch=3, max_len=40, dist="file", heads_q=4, heads_kv=2, head_dim=16,
                       window=(-1, 0), lengths=(40, 3, 7))
    monkeypatch.setattr(runner, "GATE_BUDGET", 4 * 40 * 40 // 2)  # half the first sequence's heads
    inp = suite.make_inputs(w, device="cpu", dtype=torch.float32)
    assert runner.gate_prefix(inp, runner.GATE_BUDGET) == 1 and runner.gate_heads(inp, 1) == 2
    monkeypatch.setattr(runner, "GATE_BUDGET", 4 * 40 * 40 // 4)  # a quarter: still one whole group of two
    assert runner.gate_heads(inp, 1) == 2
    res = runner.run_workload(w, [Jfa("reference", explicit=True), WrongScale()], "cpu", cpu_reps=1)
    assert res["gate"] == {"sequences": 1, "heads": 2}
    r = res["results"]
    assert r["jfa-reference"]["correct"] is True
    assert r["wrong-scale"]["correct"] is False


def test_a_failed_reference_marks_its_workload_and_the_run_goes_on(monkeypatch):
    """The gate's reference out of memory (spike-32k's on an H100, before gate_heads) stopped the whole run with no
    results.json: now that workload's providers carry the error, untimed, and the next workload runs."""
    small = dict(batch=2, max_len=12, dist="file", heads_q=1, heads_kv=1, head_dim=16, window=(-1, 0), lengths=(12, 5))
    ws = [suite.Workload("oom", "self", **small), suite.Workload("fine", "self", **small)]
    real = runner.reference_results

    def reference(inp, like=None):
        if inp.workload.name == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")
        return real(inp, like)
    monkeypatch.setattr(runner, "reference_results", reference)
    data = runner.run(ws, [Jfa("reference", explicit=True), NotHere()], device="cpu", cpu_reps=1)
    oom, fine = data["workloads"]
    assert "reference failed: OutOfMemoryError" in oom["results"]["jfa-reference"]["error"]
    assert "fwd_ms" not in oom["results"]["jfa-reference"] and oom["results"]["jfa-reference"]["correct"] is None
    assert oom["results"]["not-here"] == {"skip": "not installed", "correct": None}
    assert fine["results"]["jfa-reference"]["correct"] is True and fine["results"]["jfa-reference"]["fwd_ms"] > 0


@pytest.mark.interpreter
def test_gate_on_a_prefix_broadcast_with_triton():
    """The interpreter's Triton kernels pass the gate on a prefix of a broadcast batch."""
    w = suite.Workload("pma", "broadcast", batch=3, max_len=20, dist="file", q_len=4, heads_q=1, heads_kv=1,
                       head_dim=16, lengths=(20, 6, 9))
    inp = suite.make_inputs(w, device="cpu", dtype=torch.bfloat16)
    n = runner.gate_prefix(inp, budget=4 * 20 + 4 * 6)
    assert n == 2
    ref = runner.reference_results(inp.prefix(n))
    fn, _ = Jfa("triton").build(inp)
    verdict = runner.check(fn, inp, ref, n)
    assert verdict["correct"], verdict
    fn, _ = Jfa("reference").build(inp)
    assert runner.check(fn, inp, ref, n)["correct"]
    assert not runner.check(lambda: 1.05 * fn(), inp, ref, n)["correct"]
    assert runner.check(fn, inp, runner.reference_results(inp), 3)["correct"]  # the whole batch


def test_forward_only_providers_are_checked_on_the_output_and_timed_forward(monkeypatch):
    """A serving kernel (no backward): the gate compares its output alone, and only its forward is timed; a wrong
    output still fails the gate."""
    w = suite.Workload("t", "cross", batch=2, max_len=9, dist="file", heads_q=2, heads_kv=2, head_dim=16, q_len=3,
                       window=(-1, 0), lengths=(9, 4))
    inp = suite.make_inputs(w, device="cpu", dtype=torch.float32)
    ref = runner.reference_results(inp)

    def served(scale=1.0):
        with torch.no_grad():
            out = jfa.jagged_attention(inp.q, inp.k, inp.v, inp.q_offsets, inp.kv_offsets, causal=True)
        return lambda: out * scale
    assert runner.check(served(), inp, ref, forward_only=True)["correct"]
    assert not runner.check(served(1.25), inp, ref, forward_only=True)["correct"]
    m = runner.measure(served(), inp, 1e9, 2.5e9, forward_only=True)
    assert m["fwd_ms"] > 0 and m["bwd_ms"] is None


class _NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("InductorError: pretend the backward does not compile")


class BackwardFails(Provider):
    """The reference's forward (times `scale`) through a function whose backward raises (as Flex's on a bias)."""
    name = "backward-fails"
    scale = 1.0

    def build(self, inp):
        return lambda: _NoBackward.apply(jfa.jagged_attention(inp.q, inp.k, inp.v, inp.q_offsets, causal=True,
                                                              backend="reference") * self.scale), {}


def test_a_provider_whose_backward_fails_is_gated_and_timed_on_its_forward():
    w = suite.Workload("tiny", "self", batch=2, max_len=9, dist="file", heads_q=2, heads_kv=2, head_dim=16,
                       window=(-1, 0), lengths=(9, 4))
    wrong = type("WrongForward", (BackwardFails, ), dict(name="wrong-forward", scale=1.25))()
    r = runner.run_workload(w, [BackwardFails(), wrong], "cpu", cpu_reps=1)["results"]
    ok = r["backward-fails"]
    assert ok["correct"] is True and ok["fwd_ms"] > 0 and ok["bwd_ms"] is None
    assert ok["note"].startswith("backward failed (RuntimeError: InductorError") and "error" not in ok
    assert r["wrong-forward"]["correct"] is False and "fwd_ms" not in r["wrong-forward"]
