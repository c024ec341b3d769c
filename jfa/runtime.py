"""Where Triton kernels run: compiled on a CUDA device, or on CPU tensors in Triton's interpreter; and the size
of a persistent grid."""
from __future__ import annotations

import functools

import torch
import triton


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
