"""jfa: Jagged Flash Attention for PyTorch.

    out = jfa.jagged_attention(q, k, v, q_offsets, kv_offsets=None, causal=False, window=(-1, -1), ...)
    out = jfa.broadcast_attention(q, k, v, kv_offsets, ...)   # one dense q shared by every kv sequence
    layer = jfa.nn.JaggedSelfAttention(embed_dim, num_heads, ...)  # and JaggedCrossAttention, PMAPooling, HSTULayer
    out = jfa.jagged_attention(q, k, v, offsets, causal=True, activation="silu", num_targets=t)  # HSTU, GDPA
    cache = jfa.KVCache(batch, capacity, heads, head_dim); cache.append(k, v, new_offsets)      # serving
    out = cache.attend(q_new, new_offsets, causal=True)  # the new rows against each user's cached history
    bias = jfa.RelativeBias(position=pos_w, time=ts_w, q_times=..., k_times=...)   # HSTU's relative bias, learned
    out = jfa.jagged_attention(q, k, v, offsets, causal=True, activation="silu", rel_bias=bias)

On a machine with no CUDA device, importing jfa (before triton) turns on Triton's interpreter
(TRITON_INTERPRET=1) so the portable Triton kernels run on CPU tensors; an explicit TRITON_INTERPRET is kept.
"""
import os as _os
import sys as _sys

import torch as _torch

if "TRITON_INTERPRET" not in _os.environ and "triton" not in _sys.modules and not _torch.cuda.is_available():
    _os.environ["TRITON_INTERPRET"] = "1"

from . import nn  # noqa: E402  (layers: jfa.nn.JaggedSelfAttention, JaggedCrossAttention, PMAPooling, HSTULayer)
from .api import broadcast_attention, jagged_attention  # noqa: E402
from .backends import available_backends  # noqa: E402
from .bias import RelativeBias  # noqa: E402
from .cache import KVCache  # noqa: E402

__version__ = "0.1.0"
__all__ = ["jagged_attention", "broadcast_attention", "available_backends", "KVCache", "RelativeBias", "nn",
           "__version__"]

from . import flops as _flops  # noqa: E402,F401  (registers the FLOP formulas with torch.utils.flop_counter)
