"""What the host path keeps from one call to the next, and that it keeps it right: the forward's launches by the
problem's host key (jfa.hopper.fwd.plan), and Triton's compiled kernels by their arguments' classes
(jfa.runtime.launch: a kernel launched again with arguments of the same classes runs the kernel Triton compiled for
the first launch, with every parameter in Triton's order; anything Triton would compile anew goes through Triton).
On the CPU (Triton's specialization is plain Python and C++ here); every GPU test launches through both."""
import os
import subprocess
import sys

import pytest
import torch
from triton.backends.compiler import BaseBackend
from triton.runtime.jit import JITFunction

from jfa import runtime
from jfa.hopper.common import tma_descriptor
from jfa.testing import offsets_of


def _spec(a):
    """Triton's binder's specialization of one argument (a specialized, aligned parameter)."""
    return runtime.native_specialize_impl(BaseBackend, a, False, True, True)


def test_a_descriptors_class_holds_what_triton_compiles_for():
    """_classes keys a Gluon TMA descriptor by its block, dtype and layout in place of Triton's specialization: the
    descriptors it calls the same must specialize the same (their tensors' shape, strides and address are run-time
    arguments), and those that specialize differently must differ in it."""
    x = torch.zeros(300, 4, 128, dtype=torch.bfloat16)
    same = [tma_descriptor(x, 64), tma_descriptor(x[1:], 64), tma_descriptor(x[:7], 64),
            tma_descriptor(torch.zeros(65, 2, 128, dtype=torch.bfloat16), 64),
            tma_descriptor(x.transpose(0, 1).contiguous().transpose(0, 1), 64)]
    other = [tma_descriptor(x, 128), tma_descriptor(x.half(), 64), tma_descriptor(x[..., :64].contiguous(), 64),
             tma_descriptor(x, 64, 64)]
    classes = lambda d: runtime._classes((d, ), BaseBackend)
    assert len({classes(d) for d in same}) == 1 and len({_spec(d) for d in same}) == 1
    for d in other:
        assert classes(d) != classes(same[0]) and _spec(d) != _spec(same[0])


def test_kept_launches_get_what_tritons_path_gives_in_every_mode():
    """jfa.bench.host.check_modes in a process with Triton in compiled mode (its compiles and launcher faked): every
    mode and variant of the GPU tests and the backward's other routes, D 64 and 128, forward and backward, launch
    every kernel a second time through jfa.runtime.launch's kept kernels with the arguments (kernels, grids, every
    argument's dtype, shape, alignment or value) that Triton's own path gave its launcher the first time."""
    res = subprocess.run([sys.executable, "-m", "jfa.bench.host"], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TRITON_INTERPRET": "0"})
    assert res.returncode == 0, res.stderr[-3000:]
    words = res.stdout.split()
    assert words[:2] == ["kept", "launches:"] and int(words[2]) >= 200 and int(words[5]) >= 40, res.stdout


def _plain(a, b, N, FLAG: "tl.constexpr", WIDTH: "tl.constexpr" = 8):  # noqa: F821 (a kernel's signature only)
    pass


class _Compiled:
    """Triton's compiled kernel as launch uses it: compiled[grid](*every parameter)."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args: self.calls.append((grid, args))


def test_launch_runs_the_compiled_kernel_for_arguments_of_the_same_classes(monkeypatch):
    kernel = JITFunction(_plain)
    slow = []
    compiled = _Compiled()

    def run(*args, grid, warmup, **options):  # Triton's path: binds, specializes, compiles or finds, launches
        slow.append((grid, args, options))
        return compiled
    kernel.run = run
    kernel.device_caches[0] = ({}, {}, None, BaseBackend, None)
    monkeypatch.setattr(runtime, "_current_device", lambda: 0)
    monkeypatch.setattr(runtime, "_KERNELS", {})
    t = torch.zeros(64, dtype=torch.float32)
    u = torch.zeros(64, dtype=torch.float32)

    runtime.launch(kernel, (3, ), t, (t, 32), 48, FLAG=True, num_warps=4)
    assert len(slow) == 1 and compiled.calls == []
    # other tensors, other values of the same classes: the compiled kernel, every parameter in order
    runtime.launch(kernel, (5, ), u, (u, 64), 16, FLAG=True, num_warps=4)
    assert len(slow) == 1 and compiled.calls == [((5, 1, 1), (u, (u, 64), 16, True, 8))]
    # what Triton specializes differently goes through Triton: an int of 1, one not a multiple of 16, a tensor
    # not 16-byte aligned, another dtype, another constexpr or launch option
    for args, options in (((t, (t, 32), 1), dict(FLAG=True, num_warps=4)),
                          ((t, (t, 33), 48), dict(FLAG=True, num_warps=4)),
                          ((t[1:], (t, 32), 48), dict(FLAG=True, num_warps=4)),
                          ((t.double(), (t, 32), 48), dict(FLAG=True, num_warps=4)),
                          ((t, (t, 32), 48), dict(FLAG=False, num_warps=4)),
                          ((t, (t, 32), 48), dict(FLAG=True, WIDTH=16, num_warps=4)),
                          ((t, (t, 32), 48), dict(FLAG=True, num_warps=8))):
        before = len(slow)
        runtime.launch(kernel, (3, ), *args, **options)
        assert len(slow) == before + 1, (args, options)
    assert len(compiled.calls) == 1
    # and each of those is kept too
    runtime.launch(kernel, (2, 2), t, (t, 32), 1, FLAG=True, num_warps=4)
    assert len(compiled.calls) == 2 and compiled.calls[-1] == ((2, 2, 1), (t, (t, 32), 1, True, 8))


def test_launch_leaves_other_kernels_to_their_own_launch():
    """The interpreter's kernels (and a test's stubs) are launched as kernel[grid](...)."""
    seen = []

    class Stub:
        def __getitem__(self, grid):
            return lambda *args, **options: seen.append((grid, args, options))
    runtime.launch(Stub(), (2, ), 1, 2, X=3)
    assert seen == [((2, ), (1, 2), {"X": 3})]


def test_forward_plan_is_kept_by_the_host_key():
    """jfa.hopper.fwd.plan: the launches kept for a problem's host key (jfa.problem.Problem.host_key) are the ones
    chosen afresh for every problem of a sequence that changes one field at a time (a scalar, a tensor's shape, an
    optional tensor given), problems that differ only in their tensors' values share them, and a page size the
    forward cannot read is refused on every call."""
    from jfa.api import problem
    from jfa.hopper import fwd
    from jfa.hopper.config import fwd_classes

    def fresh(p):
        return tuple(fwd._launch(p, c, r) for c, r in fwd_classes(p))

    lens = [40] * 63 + [4096]
    q = torch.zeros(sum(lens), 4, 128, dtype=torch.bfloat16)
    off = offsets_of(lens)
    base = dict(causal=True, max_q_len=4096, max_kv_len=4096, backend="reference")
    variants = [dict(), dict(max_kv_len=None, max_q_len=None), dict(activation="silu", out_scale=0.5),
                dict(causal=False), dict(window=(64, 0)), dict(num_targets=torch.ones(64, dtype=torch.int32)),
                dict(num_targets=torch.ones(64, dtype=torch.int32), contextual_len=3), dict(scale=0.3)]
    for kw in variants + variants[::-1]:
        p = problem(q, q, q, off, **{**base, **kw})
        assert fwd.plan(p) == fresh(p), kw
    for args in ((q, q[:, :2], q[:, :2], off), (q, q[:2560], q[:2560], off, offsets_of([40] * 64)),
                 (q[:4096], q[:4096], q[:4096], offsets_of([4096]))):  # GQA, cross-attention, one sequence
        p = problem(*args, **base)
        assert fwd.plan(p) == fresh(p)
    first = problem(q, q, q, off, **base)
    again = problem(torch.ones_like(q), torch.ones_like(q), torch.ones_like(q), off.clone(), **base)
    assert fwd.plan(first) is fwd.plan(again)
    pages = torch.zeros(64, 64, dtype=torch.int32)
    for _ in range(2):
        with pytest.raises(ValueError, match="page_size"):
            fwd.plan(problem(q[:64], q, q, offsets_of([1] * 64), off, page_table=pages, page_size=64, **base))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["causal", "cross", "broadcast"])
def test_gpu_kept_launches_compute_what_tritons_do(mode, monkeypatch):
    """On the GPU: a public call's forward and backward with nothing kept (every kernel down Triton's path), then
    another case of the same shapes and other values, which runs every kernel as kept by jfa.runtime.launch (none
    down Triton's path): both against the float64 reference."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    from jfa.testing import GPU_MODES, compare, make_case, run_backend
    kw = dict(GPU_MODES[mode], hq=4, hkv=2, d=128, dtype=torch.bfloat16, device="cuda")
    monkeypatch.setattr(runtime, "_KERNELS", {})
    cases = [make_case(**kw, seed=seed) for seed in (1, 2)]
    assert not compare(cases[0], *run_backend(cases[0], "hopper"))
    kept = dict(runtime._KERNELS)
    assert kept
    down_tritons_path = []
    run = JITFunction.run
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **k: down_tritons_path.append(self) or run(self, *a, **k))
    assert not compare(cases[1], *run_backend(cases[1], "hopper"))
    assert not down_tritons_path and runtime._KERNELS == kept
