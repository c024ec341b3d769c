"""Attention layers over jagged batches, with torch.nn's conventions (constructor arguments, ``device`` and
``dtype`` factory kwargs, ``reset_parameters``, ``extra_repr``).

    attn = jfa.nn.JaggedSelfAttention(512, num_heads=8, num_kv_heads=2, causal=True)
    y = attn(x, offsets)                          # x [T, 512] packed, offsets [B+1] -> y [T, 512]
    y = attn(nx)                                  # or an NJT [B, j, 512] -> an NJT
    cross = jfa.nn.JaggedCrossAttention(512, 8, causal=True)
    t = cross(targets, history, t_offsets, h_offsets)   # target items against each user's history
    pool = jfa.nn.PMAPooling(512, 8, num_seeds=4)
    z = pool(x, offsets)                          # [B, 4, 512]: learned seed queries attend each sequence
    hstu = jfa.nn.HSTULayer(512, 4, max_seq_len=4096)
    y = hstu(x, offsets)                          # HSTU's block: SiLU attention gated by U, residual
    cache = hstu.make_cache(batch=B, capacity=4096)
    y_new = hstu.serve(x_new, new_offsets, cache) # serving: new rows against each user's cached history

Every layer projects to heads (GQA when ``num_kv_heads < num_heads``), calls jfa's attention and projects back.
``max_len`` hints (the longest sequence, a Python int) make a call on CUDA free of host syncs. ``attention``
swaps the kernel while keeping the layer (a function with the signature of jfa.jagged_attention, or of
jfa.broadcast_attention for PMAPooling): the end-to-end example measures other kernels that way. ``activation``
and ``out_scale`` put an activation in softmax's place (GDPA; jfa.jagged_attention).
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from . import nested
from .api import broadcast_attention, jagged_attention
from .bias import RelativeBias


def _unpack(x, offsets, max_len):
    """(values [T, E], offsets, max_len, is_njt) of a packed tensor with offsets or an NJT [B, j, E]."""
    if nested.is_njt(x):
        if offsets is not None:
            raise ValueError("with an NJT input the offsets come from it: do not pass offsets")
        values, offsets = nested.from_njt(x)
        return values, offsets, nested.cached_max_len(x) if max_len is None else max_len, True
    if offsets is None:
        raise ValueError("a packed input [T, E] needs its offsets [B+1]")
    if x.dim() != 2:
        raise ValueError(f"expected a packed [T, E] tensor or an NJT [B, j, E], got shape {tuple(x.shape)}")
    return x, offsets, max_len, False


def _repack(y, offsets, max_len, was_njt):
    return nested.to_njt(y, offsets, max_len=max_len) if was_njt else y


class _Heads(nn.Module):
    """What the layers share: head geometry, the query/key/value and output projections' creation and init."""

    def _init_heads(self, embed_dim, num_heads, num_kv_heads, head_dim, scale, backend, attention,
                    activation="softmax", out_scale=1.0):
        num_kv_heads = num_kv_heads or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        if head_dim is None:
            if embed_dim % num_heads:
                raise ValueError(f"embed_dim ({embed_dim}) is not a multiple of num_heads ({num_heads}): pass "
                                 f"head_dim")
            head_dim = embed_dim // num_heads
        self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim = embed_dim, num_heads, num_kv_heads, head_dim
        self.scale, self.backend = scale, backend
        self.attention = attention
        self.activation, self.out_scale = activation, out_scale

    def _score(self) -> dict:
        """The attention call's score arguments (left out for softmax: a swapped-in kernel need not take them)."""
        return {} if self.activation == "softmax" else dict(activation=self.activation, out_scale=self.out_scale)

    def _heads(self, x, heads):
        return x.unflatten(-1, (heads, self.head_dim))

    def reset_parameters(self):
        for m in self.children():
            if isinstance(m, nn.Linear):
                m.reset_parameters()

    def _extra(self):
        s = f"{self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"
        if self.scale is not None:
            s += f", scale={self.scale}"
        if self.activation != "softmax":
            s += f", activation={self.activation!r}, out_scale={self.out_scale}"
        return s + (f", backend={self.backend!r}" if self.attention is None else ", attention=custom")


class JaggedSelfAttention(_Heads):
    """Multi-head self-attention over each sequence of a packed batch.

    Args:
        embed_dim, num_heads: model width and query heads; num_kv_heads: key/value heads (GQA, default
            num_heads); head_dim: default embed_dim // num_heads.
        causal, window: the mask of jfa.jagged_attention (key j visible to query i when i - left <= j <= i + right).
        bias: biases in the projections. fused_qkv: one Linear for q, k and v (``qkv_proj``), else three
            (``q_proj``, ``k_proj``, ``v_proj``). scale: default 1/sqrt(head_dim).
        activation, out_scale: softmax, or an activation in its place with its output scale (a float).
        backend: jfa's backend ("auto"). attention: another kernel with jfa.jagged_attention's signature.
    Shapes: x ``[T, embed_dim]`` with offsets ``[B+1]``, or an NJT ``[B, j, embed_dim]``; the output is the same.
    """

    def __init__(self, embed_dim, num_heads, num_kv_heads=None, *, head_dim=None, causal=False, window=(-1, -1),
                 bias=True, fused_qkv=True, scale=None, activation="softmax", out_scale=1.0, backend="auto",
                 attention=None, device=None, dtype=None):
        super().__init__()
        self._init_heads(embed_dim, num_heads, num_kv_heads, head_dim, scale, backend, attention, activation,
                         out_scale)
        self.causal, self.window, self.fused_qkv = causal, tuple(window), fused_qkv
        kw = dict(bias=bias, device=device, dtype=dtype)
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if fused_qkv:
            self.qkv_proj = nn.Linear(embed_dim, q_width + 2 * kv_width, **kw)
        else:
            self.q_proj = nn.Linear(embed_dim, q_width, **kw)
            self.k_proj = nn.Linear(embed_dim, kv_width, **kw)
            self.v_proj = nn.Linear(embed_dim, kv_width, **kw)
        self.out_proj = nn.Linear(q_width, embed_dim, **kw)

    def forward(self, x, offsets=None, *, max_len=None, num_targets=None, contextual_len=0):
        """num_targets, contextual_len: HSTU's mask (jfa.jagged_attention's; needs causal=True)."""
        values, offsets, max_len, was_njt = _unpack(x, offsets, max_len)
        q, k, v = self._qkv(values)
        attend = self.attention or functools.partial(jagged_attention, backend=self.backend)
        out = attend(self._heads(q, self.num_heads), self._heads(k, self.num_kv_heads),
                     self._heads(v, self.num_kv_heads), offsets, max_q_len=max_len, max_kv_len=max_len,
                     causal=self.causal, window=self.window, scale=self.scale,
                     **_targets(num_targets, contextual_len), **self._score())
        return _repack(self.out_proj(out.flatten(-2)), offsets, max_len, was_njt)

    def make_cache(self, batch: int, capacity: int, **kw):
        """A jfa.KVCache for this layer's keys and values (kw: page_size, dtype, device)."""
        from .cache import KVCache
        return KVCache(batch, capacity, self.num_kv_heads, self.head_dim, **kw)

    def _qkv(self, values):
        if self.fused_qkv:
            q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            return self.qkv_proj(values).split((q_width, kv_width, kv_width), dim=-1)
        return self.q_proj(values), self.k_proj(values), self.v_proj(values)

    @torch.no_grad()
    def serve(self, x, offsets, cache, *, max_len=None, num_targets=None, contextual_len=0):
        """Serving (causal): each user's new rows x ``[T, embed_dim]`` (offsets ``[B+1]``, zero rows allowed)
        appended to this layer's cache (make_cache), then attended against each user's whole sequence: the rows
        forward gives for them on the whole sequences. max_len: the most new rows of a user (no host sync on
        CUDA with it); num_targets, contextual_len: HSTU's mask, counted on the whole sequences (a contextual
        prefix sees the whole history: its rows, once served, are not served again as the history grows)."""
        _check_serving(self.causal, self.attention)
        q, k, v = self._qkv(x)
        cache.append(self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads), offsets)
        out = cache.attend(self._heads(q, self.num_heads), offsets, max_q_len=max_len, window=self.window,
                           scale=self.scale, backend=self.backend, causal=True, **_targets(num_targets, contextual_len),
                           **self._score())
        return self.out_proj(out.flatten(-2))

    def extra_repr(self):
        return f"{self._extra()}, causal={self.causal}, window={self.window}, fused_qkv={self.fused_qkv}"


def _check_serving(causal, attention):
    if not causal:
        raise ValueError("serve() needs causal=True: a served row sees the rows before it, never later ones")
    if attention is not None:
        raise ValueError("serve() reads the cache with jfa's kernels: the layer's attention callable takes no cache")


def _targets(num_targets, contextual_len):
    """HSTU's mask's arguments, only where used (an `attention` callable need not take them)."""
    return {} if num_targets is None and contextual_len == 0 else dict(num_targets=num_targets,
                                                                       contextual_len=contextual_len)


class JaggedCrossAttention(_Heads):
    """Multi-head cross-attention: the queries of each sequence (e.g. target items) attend the keys of the same
    sequence in another jagged tensor (e.g. the user's history). The mask aligns the queries bottom-right:
    with causal=True, query i of Lq sees the first Lk - Lq + i + 1 keys (targets at the end of a history).

    Args as JaggedSelfAttention; kdim: the memory's width (default embed_dim); k and v come from one Linear
    (``kv_proj``). Shapes: x ``[Tq, embed_dim]``, memory ``[Tk, kdim]`` with their offsets (or two NJTs) ->
    ``[Tq, embed_dim]``.
    """

    def __init__(self, embed_dim, num_heads, num_kv_heads=None, *, kdim=None, head_dim=None, causal=False,
                 window=(-1, -1), bias=True, scale=None, activation="softmax", out_scale=1.0, backend="auto",
                 attention=None, device=None, dtype=None):
        super().__init__()
        self._init_heads(embed_dim, num_heads, num_kv_heads, head_dim, scale, backend, attention, activation,
                         out_scale)
        self.kdim, self.causal, self.window = kdim or embed_dim, causal, tuple(window)
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.q_proj = nn.Linear(embed_dim, self.num_heads * self.head_dim, **kw)
        self.kv_proj = nn.Linear(self.kdim, 2 * self.num_kv_heads * self.head_dim, **kw)
        self.out_proj = nn.Linear(self.num_heads * self.head_dim, embed_dim, **kw)

    def forward(self, x, memory, x_offsets=None, memory_offsets=None, *, max_q_len=None, max_kv_len=None):
        q_values, q_offsets, max_q_len, was_njt = _unpack(x, x_offsets, max_q_len)
        kv_values, kv_offsets, max_kv_len, _ = _unpack(memory, memory_offsets, max_kv_len)
        k, v = self._heads(self.kv_proj(kv_values), 2 * self.num_kv_heads).chunk(2, dim=-2)
        attend = self.attention or functools.partial(jagged_attention, backend=self.backend)
        out = attend(self._heads(self.q_proj(q_values), self.num_heads), k, v, q_offsets, kv_offsets,
                     max_q_len=max_q_len, max_kv_len=max_kv_len, causal=self.causal, window=self.window,
                     scale=self.scale, **self._score())
        return _repack(self.out_proj(out.flatten(-2)), q_offsets, max_q_len, was_njt)

    def extra_repr(self):
        return f"{self._extra()}, kdim={self.kdim}, causal={self.causal}, window={self.window}"


class PMAPooling(_Heads):
    """Pooling by multi-head attention (Set Transformer's PMA): num_seeds learned queries attend every sequence
    of a jagged batch, one dense query block for the whole batch (jfa.broadcast_attention).

    Args as JaggedSelfAttention; num_seeds: pooled vectors per sequence; kdim: the input's width (default
    embed_dim). The seeds are per-head query vectors, ``seeds [num_seeds, num_heads, head_dim]``.
    Shapes: x ``[T, kdim]`` with offsets ``[B+1]`` (or an NJT) -> ``[B, num_seeds, embed_dim]``.
    """

    def __init__(self, embed_dim, num_heads, num_seeds, num_kv_heads=None, *, kdim=None, head_dim=None, bias=True,
                 scale=None, activation="softmax", out_scale=1.0, backend="auto", attention=None, device=None,
                 dtype=None):
        super().__init__()
        self._init_heads(embed_dim, num_heads, num_kv_heads, head_dim, scale, backend, attention, activation,
                         out_scale)
        self.num_seeds, self.kdim = num_seeds, kdim or embed_dim
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.seeds = nn.Parameter(torch.empty(num_seeds, self.num_heads, self.head_dim, device=device, dtype=dtype))
        self.kv_proj = nn.Linear(self.kdim, 2 * self.num_kv_heads * self.head_dim, **kw)
        self.out_proj = nn.Linear(self.num_heads * self.head_dim, embed_dim, **kw)
        self.reset_parameters()

    def reset_parameters(self):
        super().reset_parameters()
        nn.init.normal_(self.seeds, std=1 / math.sqrt(self.head_dim))

    def forward(self, x, offsets=None, *, max_len=None):
        values, offsets, max_len, _ = _unpack(x, offsets, max_len)
        k, v = self._heads(self.kv_proj(values), 2 * self.num_kv_heads).chunk(2, dim=-2)
        attend = self.attention or functools.partial(broadcast_attention, backend=self.backend)
        out = attend(self.seeds.to(k.dtype), k, v, offsets, max_kv_len=max_len, scale=self.scale, **self._score())
        return self.out_proj(out.flatten(-2))  # [B, num_seeds, embed_dim]

    def extra_repr(self):
        return f"{self._extra()}, num_seeds={self.num_seeds}, kdim={self.kdim}"


class HSTULayer(nn.Module):
    """The HSTU block of generative recommenders (Zhai et al. 2024) over packed histories:

        U, V, Q, K = split(silu(uvqk(norm(x))))                       per head: U, V [head_dim], Q, K [attn_dim]
        A = sum_j silu(scale q_i . k_j) v_j / N over the visible keys  jfa.jagged_attention(activation="silu")
        y = x + out_proj(attn_norm(A) * U)

    Args:
        embed_dim, num_heads; head_dim: U and V's width per head (default embed_dim // num_heads); attn_dim: Q and
            K's (default head_dim); causal (HSTU's default), window.
        max_seq_len: N, the out scale's 1/N (HSTU divides by the longest sequence the model takes); None: the
            batch's longest (max_len, or read from the offsets: one host sync).
        scale: of q . k (default 1/sqrt(attn_dim)). backend, attention: as JaggedSelfAttention.
        num_buckets: with it (and max_seq_len), HSTU's relative attention bias, learned: a position table of
            2 max_seq_len - 1 entries and a time table of num_buckets + 1 (shared by the heads, HSTU's pos_w and
            ts_w), added to the scores inside the kernels (jfa.RelativeBias.hstu); forward then takes timestamps.
        num_softmax_heads: the first heads attend by softmax in place of silu / N (HSTU's num_softmax_heads;
            jfa.jagged_attention's).
    forward(x, offsets, max_len=None, num_targets=None, contextual_len=0, timestamps=None): num_targets (an int
        tensor [B] on the offsets' device) and contextual_len are HSTU's mask (jfa.jagged_attention's; causal only):
        each history's last num_targets[b] rows are candidates that see the history and themselves, never one
        another, and its first contextual_len rows are features every row sees; timestamps (int64 [T]) the rows'
        times, for the relative bias.
    Shapes: x ``[T, embed_dim]`` with offsets ``[B+1]``, or an NJT ``[B, j, embed_dim]``; the output is the same.
    Not here, against HSTU's own block: dropout.
    """

    def __init__(self, embed_dim, num_heads, *, head_dim=None, attn_dim=None, causal=True, window=(-1, -1),
                 max_seq_len=None, scale=None, bias=True, num_buckets=None, num_softmax_heads=0, backend="auto",
                 attention=None, device=None, dtype=None):
        super().__init__()
        if head_dim is None:
            if embed_dim % num_heads:
                raise ValueError(f"embed_dim ({embed_dim}) is not a multiple of num_heads ({num_heads}): pass "
                                 f"head_dim")
            head_dim = embed_dim // num_heads
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, head_dim
        self.attn_dim = attn_dim or head_dim
        self.causal, self.window, self.max_seq_len, self.scale = causal, tuple(window), max_seq_len, scale
        self.backend, self.attention = backend, attention
        self.num_softmax_heads = num_softmax_heads
        kw = dict(device=device, dtype=dtype)
        self.norm = nn.LayerNorm(embed_dim, **kw)
        self.uvqk = nn.Linear(embed_dim, num_heads * (2 * head_dim + 2 * self.attn_dim), bias=bias, **kw)
        self.attn_norm = nn.LayerNorm(num_heads * head_dim, **kw)
        self.out_proj = nn.Linear(num_heads * head_dim, embed_dim, bias=bias, **kw)
        self.pos_w = self.ts_w = None
        if num_buckets is not None:
            if max_seq_len is None:
                raise ValueError("HSTULayer's relative bias (num_buckets) needs max_seq_len (its positions' range)")
            self.pos_w = nn.Parameter(torch.empty(2 * max_seq_len - 1, device=device))
            self.ts_w = nn.Parameter(torch.empty(num_buckets + 1, device=device))
            self._reset_bias()

    def _reset_bias(self):
        if self.pos_w is not None:  # (HSTU's initialization)
            nn.init.normal_(self.pos_w, std=0.02)
            nn.init.normal_(self.ts_w, std=0.02)

    def reset_parameters(self):
        for m in self.children():
            m.reset_parameters()
        self._reset_bias()

    def forward(self, x, offsets=None, *, max_len=None, num_targets=None, contextual_len=0, timestamps=None):
        """num_targets, contextual_len: HSTU's mask (jfa.jagged_attention's): candidates scored in one pass;
        timestamps: the rows' times (int64 [T]), for the relative bias (num_buckets)."""
        values, offsets, max_len, was_njt = _unpack(x, offsets, max_len)
        extra = self._score_heads(_targets(num_targets, contextual_len))
        if self.pos_w is not None:
            if timestamps is None:
                raise ValueError("this HSTULayer has a relative bias (num_buckets): forward needs timestamps")
            extra["rel_bias"] = RelativeBias.hstu(self.pos_w, self.ts_w, timestamps, offsets)
        width_v, width_qk = self.num_heads * self.head_dim, self.num_heads * self.attn_dim
        u, v, q, k = F.silu(self.uvqk(self.norm(values))).split((width_v, width_v, width_qk, width_qk), dim=-1)
        n = self.max_seq_len or max_len or int((offsets[1:] - offsets[:-1]).max().clamp(min=1))
        attend = self.attention or functools.partial(jagged_attention, backend=self.backend)
        heads = functools.partial(torch.Tensor.unflatten, dim=-1, sizes=(self.num_heads, -1))
        a = attend(heads(q), heads(k), heads(v), offsets, max_q_len=max_len, max_kv_len=max_len, causal=self.causal,
                   window=self.window, scale=self.scale, activation="silu", out_scale=1.0 / n, **extra)
        y = values + self.out_proj(self.attn_norm(a.flatten(-2)) * u)
        return _repack(y, offsets, max_len, was_njt)

    def make_cache(self, batch: int, capacity: int, **kw):
        """A jfa.KVCache for this layer's keys and values (kw: page_size, dtype, device)."""
        from .cache import KVCache
        if self.attn_dim != self.head_dim:
            raise ValueError(f"a cache holds keys and values of one width: attn_dim {self.attn_dim} != head_dim "
                             f"{self.head_dim}")
        return KVCache(batch, capacity, self.num_heads, self.head_dim, **kw)

    @torch.no_grad()
    def serve(self, x, offsets, cache, *, max_len=None, num_targets=None, contextual_len=0):
        """Serving: each user's new rows x ``[T, embed_dim]`` (offsets ``[B+1]``) appended to this layer's cache
        (make_cache) and attended against each user's whole sequence, as JaggedSelfAttention.serve: the rows forward
        gives for them on the whole sequences (N: max_seq_len, else the cache's longest sequence, one host sync)."""
        _check_serving(self.causal, self.attention)
        if self.pos_w is not None:
            raise NotImplementedError("HSTULayer.serve with a relative bias: the cache keeps no timestamps yet")
        width_v, width_qk = self.num_heads * self.head_dim, self.num_heads * self.attn_dim
        u, v, q, k = F.silu(self.uvqk(self.norm(x))).split((width_v, width_v, width_qk, width_qk), dim=-1)
        heads = functools.partial(torch.Tensor.unflatten, dim=-1, sizes=(self.num_heads, -1))
        cache.append(heads(k), heads(v), offsets)
        n = self.max_seq_len or int(cache.lengths.max().clamp(min=1))
        a = cache.attend(heads(q), offsets, max_q_len=max_len, window=self.window, scale=self.scale,
                         backend=self.backend, causal=True, activation="silu", out_scale=1.0 / n,
                         **self._score_heads(_targets(num_targets, contextual_len)))
        return x + self.out_proj(self.attn_norm(a.flatten(-2)) * u)

    def _score_heads(self, extra: dict) -> dict:
        return dict(extra, num_softmax_heads=self.num_softmax_heads) if self.num_softmax_heads else extra

    def extra_repr(self):
        return (f"{self.embed_dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, attn_dim={self.attn_dim}, "
                f"causal={self.causal}, max_seq_len={self.max_seq_len}"
                + (f", num_softmax_heads={self.num_softmax_heads}" if self.num_softmax_heads else ""))


__all__ = ["JaggedSelfAttention", "JaggedCrossAttention", "PMAPooling", "HSTULayer"]
