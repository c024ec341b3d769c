"""Where Triton kernels run: compiled on a CUDA device, or on CPU tensors in Triton's interpreter; how jfa launches
them (launch); and the size of a persistent grid."""
from __future__ import annotations

import functools

import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.runtime.jit import JITFunction


def interpreting() -> bool:
    """Whether Triton runs in its interpreter in this process (decided when triton was first imported)."""
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(triton.language.standard.zeros, InterpretedFunction)


def check_runnable(device: torch.device) -> None:
    """CPU tensors need Triton's interpreter (jfa turns it on at import on a machine with no CUDA device;
    elsewhere set TRITON_INTERPRET=1 before importing triton)."""
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(
            "Triton kernels run CPU tensors in Triton's interpreter, but triton was imported in compiled mode "
            "(this machine has CUDA, or triton was imported before jfa). Set TRITON_INTERPRET=1 in the "
            "environment before importing triton, or use CUDA tensors, or backend='reference'.")


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """The SMs a persistent grid is sized by: the CUDA device's; 4 under the interpreter, so that the tests see
    several programs share the work."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _classes(args, backend) -> tuple:
    """What Triton compiles a kernel for, of each argument: its specialization (Triton's native_specialize_impl, as
    its binder calls it: a tensor by dtype and 16-byte alignment, an int by being 1, a multiple of 16 and its width,
    a tuple by its members'; finer than the binder where a parameter is not specialized), but a TMA descriptor by its
    block, dtype and layout (the rest, its tensor's address, shape and strides, is passed at run time; Triton's
    specialization of one builds a string of its layout, a quarter of the binder's time)."""
    return tuple([(type(a), a.base.dtype, tuple(a.block_shape), a.layout) if type(a) in _DESCRIPTORS
                  else native_specialize_impl(backend, a, False, True, True) for a in args])


def _descriptor_types() -> frozenset:
    """Gluon's TMA descriptors (jfa's Hopper kernels'); Triton's own take its specialization."""
    try:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        return frozenset([TensorDescriptor])
    except ImportError:  # (a triton without Gluon: its descriptors are not launched)
        return frozenset()


_DESCRIPTORS = _descriptor_types()
_KERNELS: dict = {}  # (kernel, device, options, argument classes) -> (Triton's compiled kernel, constexpr values)


def _current_device() -> int:
    return torch.cuda.current_device()


def launch(kernel, grid: tuple, *args, **options) -> None:
    """kernel[grid](*args, **options): jfa's one way to launch a Triton or Gluon kernel (kernel arguments positional,
    constexprs and launch options by name). A launch whose kernel, device, options and arguments' classes (_classes:
    what Triton compiles a kernel for) match an earlier one's calls the kernel that launch compiled, through Triton's
    CompiledKernel (its launcher, stream, hooks and scratch as Triton's own path), skipping what Triton's path redoes
    on every call: binding, every argument's specialization, the cache key (on the H200's host a short forward's two
    launches took 90-100 us of the call's 320-520, which do_bench's span holds: docs/perf-notes.md)."""
    if not isinstance(kernel, JITFunction):  # (the interpreter's kernels, a test's stubs)
        kernel[grid](*args, **options)
        return
    device = _current_device()
    try:
        key = (kernel, device, tuple(options.items()), _classes(args, kernel.device_caches[device][3]))
        hit = _KERNELS.get(key)
    except TypeError:  # (an argument Triton cannot specialize, an option that does not hash: Triton's path says)
        kernel[grid](*args, **options)
        return
    if hit is not None:
        compiled, constexprs = hit
        compiled[(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)](*args, *constexprs)
        return
    compiled = kernel[grid](*args, **options)
    if compiled is not None and not hasattr(compiled, "result"):  # (not an asynchronous compile's future)
        if len(_KERNELS) >= 256:
            _KERNELS.clear()
        # the parameters after the positional ones, as Triton binds them (its launcher takes every parameter)
        rest = tuple(options[p.name] if p.name in options else p.default for p in kernel.params[len(args):])
        _KERNELS[key] = (compiled, rest)
