"""The host path on the CPU: jfa's hopper backend over CPU tensors, every kernel launched down Triton's own launch path
(binding, specialization, cache key) and jfa.runtime.launch's, with only Triton's compiles and its C launcher faked.
benchmarks/api_overhead.py times calls this way; ``check_modes`` checks that the kernels jfa.runtime.launch keeps get
exactly the arguments Triton's path gives its launcher, over every mode and variant the GPU tests run:

    TRITON_INTERPRET=0 python -m jfa.bench.host        (exit 0 when every mode's launches agree)

Triton must be in compiled mode (TRITON_INTERPRET=0 before it is imported): in the interpreter there is nothing to
launch. What this cannot see is the GPU: the GPU tests run the kernels themselves.
"""
from __future__ import annotations

import sys
import time

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import CompiledKernel
from triton.runtime.jit import JITFunction

from jfa import checks, runtime, schedule  # (absolute: benchmarks/api_overhead.py loads this file by its path to
from jfa.backends import BACKENDS, Backend  # time another checkout's jfa, on PYTHONPATH, by the same harness)


class _Driver:
    """Triton's active driver as its launch path asks it: device 0 of an sm_90 target, stream 0."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


class Launches:
    """What the faked launches saw: when each kernel was last launched (at, by name), and, while seen is a list, each
    launch's (kernel name, grid, arguments as the launcher takes them)."""

    def __init__(self):
        self.at = {}
        self.seen = None

    def compile(self, fn, key, signature, device, constexprs, options, attrs, warmup):
        """JITFunction._do_compile's stand-in: a compiled kernel whose launcher only notes its launch, kept where
        Triton keeps what it compiles."""
        kernel = CompiledKernel.__new__(CompiledKernel)
        kernel.module, kernel.function, kernel.packed_metadata, kernel.src = object(), 0, None, None
        kernel.name = fn.__name__

        def run(*args):  # (grid x, y, z, stream, function, metadata, launch metadata, hooks, then the arguments)
            self.at[kernel.name] = time.perf_counter()
            if self.seen is not None:
                self.seen.append((kernel.name, args[:3], args[9:]))
        kernel._run = run
        fn.device_caches[device][0][key] = kernel
        return kernel


def fake_launches() -> Launches:
    """For this process: the hopper backend takes CPU tensors (whose offsets are not read on the host, as GPU offsets
    with both max lengths given), and every kernel launch goes down Triton's path and jfa.runtime.launch's with Triton's
    compiles and launcher faked."""
    if runtime.interpreting():
        raise RuntimeError("Triton is in its interpreter: set TRITON_INTERPRET=0 before importing triton (or jfa)")
    BACKENDS["hopper"] = Backend("hopper", BACKENDS["hopper"].forward, BACKENDS["hopper"].backward,
                                 lambda device, head_dim, dtype: True)
    schedule.check_runnable = lambda device: None
    checks.offsets_values_checked = lambda offsets, hints_given: False
    runtime._current_device = lambda: 0
    triton.runtime.driver.set_active(_Driver())
    launches = Launches()
    JITFunction._do_compile = lambda fn, *args: launches.compile(fn, *args)
    return launches


def _summary(x):
    """An argument as its launcher takes it: a tensor's dtype, shape and alignment, a descriptor's too, else x."""
    if isinstance(x, tuple):
        return tuple(_summary(y) for y in x)
    if isinstance(x, torch.Tensor):
        return x.dtype, tuple(x.shape), x.data_ptr() % 16
    if hasattr(x, "block_shape"):
        return _summary(x.base), tuple(x.shape), tuple(x.strides), tuple(x.block_shape), x.layout
    return x


def check_kept_launches(fn, launches: Launches) -> int:
    """fn's launches, first down Triton's path (nothing kept), then again (every kernel kept by jfa.runtime.launch):
    the same kernels, grids and arguments, and none down Triton's path the second time. Returns the launch count."""
    runtime._KERNELS.clear()
    launches.seen = []
    fn()
    fresh = [(name, grid, _summary(args)) for name, grid, args in launches.seen]
    launches.seen = []
    again = []
    run = JITFunction.run
    JITFunction.run = lambda self, *a, **k: again.append(self.__name__) or run(self, *a, **k)
    try:
        fn()
    finally:
        JITFunction.run = run
    kept = [(name, grid, _summary(args)) for name, grid, args in launches.seen]
    launches.seen = None
    assert not again, f"launched down Triton's path again: {again}"
    assert kept == fresh, [(a, b) for a, b in zip(fresh, kept) if a != b][:1] or (len(fresh), len(kept))
    return len(kept)


def check_modes() -> tuple[int, int]:
    """check_kept_launches over the GPU tests' modes and variants (jfa.testing.GPU_MODES, GPU_VARIANTS), and the
    backward's other routes (short sequences: DIRECT and the dQ pass skipping them; a mixed batch: two length
    classes; deterministic: two passes), at D 64 and 128, each a public forward and backward: -> (cases, launches)."""
    from jfa.testing import AWKWARD_LENS, GPU_MODES, GPU_VARIANTS, make_case, run_backend
    launches = fake_launches()
    modes = {name: (kw, {}) for name, kw in {**GPU_MODES, **GPU_VARIANTS}.items()}
    modes.update({"short": (dict(q_lens=AWKWARD_LENS, causal=True), {}),
                  "mixed": (dict(q_lens=[40] * 63 + [4096], causal=True), {}),
                  "deterministic": (GPU_MODES["causal"], dict(deterministic=True))})
    cases = total = 0
    for name, (kw, run_kw) in modes.items():
        for d in (64, 128):
            case = make_case(**{"hq": 4, "hkv": 2, **kw}, d=d, dtype=torch.bfloat16, seed=d)
            try:
                total += check_kept_launches(lambda: run_backend(case, "hopper", max_lens=True, **run_kw), launches)
            except AssertionError as e:
                raise AssertionError(f"{name}, D={d}: {e}") from None
            cases += 1
    return cases, total


if __name__ == "__main__":
    n_cases, n_launches = check_modes()
    print(f"kept launches: {n_launches} launches in {n_cases} cases as Triton's path gives them")
    sys.exit(0)
