"""Shared by the Hopper kernels' launchers: TMA descriptors over packed jagged tensors."""
from __future__ import annotations

import torch
from triton.experimental.gluon import language as gl

_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def tma_descriptor(x: torch.Tensor, block_rows: int):
    """A Gluon TMA descriptor over x [rows, H, D] viewed as [rows, H*D], in [block_rows, D] boxes (one head).

    A box that runs past a sequence reads the next sequence's rows (the kernels mask them); past the tensor's
    end TMA fills zeros. Needs a 16-byte aligned base (callers clone() an unaligned view) and rows whose
    H*D elements are contiguous (any row stride that is a multiple of 16 bytes).
    """
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    d = x.shape[2]
    x2 = x.reshape(x.shape[0], x.shape[1] * d)
    layout = gl.NVMMASharedLayout.get_default_for([block_rows, d], _GL_DTYPES[x.dtype])
    return TensorDescriptor(x2, list(x2.shape), list(x2.stride()), [block_rows, d], layout)


def aligned(*tensors):
    """The tensors, each cloned if its base is not 16-byte aligned (TMA's requirement)."""
    return tuple(x if x.data_ptr() % 16 == 0 else x.clone() for x in tensors)
