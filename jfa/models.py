"""A small GEM/Kunlun-style click model over jagged user histories, to run jfa inside a real training loop.

    item ids [T] + offsets [B+1] -> embedding (+ position) -> N x (pre-norm jagged self-attention + MLP)
        -> PMA pooling (learned queries [Lq, H, D] attending each history: broadcast attention)
        -> MLP head -> one click logit per user [B]

The attention implementation is a switch, so one model measures each end to end:
  "jfa"     jfa.jagged_attention / jfa.broadcast_attention (``backend`` picks the backend, "auto" by default)
  "fa2"     torch.nn.attention.varlen.varlen_attn (CUDA only); broadcast by expanding q to B copies
  "padded"  pad to [B, L, H, D] and F.scaled_dot_product_attention with a boolean mask
Also here: the synthetic click data (skewed lengths, as the benchmark suite) and the rank partitions.
"""
from __future__ import annotations

import heapq
import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn

from .nested import from_padded, to_padded

IMPLS = ("jfa", "fa2", "padded")


# ----------------------------------------------------------------------------------------------- attention
def _max_len(offsets, max_len):
    return int((offsets[1:] - offsets[:-1]).max()) if max_len is None else max_len


def _padded_mask(lens, lq, lk, causal):
    """Boolean [B, 1, lq, lk]: key valid (and, for self-attention, causal). Rows that would see nothing
    (padding) see key 0 instead, so SDPA gives no NaN; those rows are dropped afterwards."""
    j = torch.arange(lk, device=lens.device)
    mask = (j.view(1, 1, lk) < lens.view(-1, 1, 1)).expand(-1, lq, lk)  # [B, lq, lk]
    if causal:  # self-attention: query i and key j share positions, so causal is j <= i
        mask = mask & (j.view(1, 1, lk) <= torch.arange(lq, device=lens.device).view(1, lq, 1))
    mask = mask | (~mask.any(-1, keepdim=True) & (j == 0).view(1, 1, lk))
    return mask.unsqueeze(1)


def _fa2(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, -1)):
    """torch's varlen_attn (FA2); GQA through enable_gqa where torch has it, else k/v repeated per q head."""
    from torch.nn.attention.varlen import varlen_attn
    kw = {"window_size": window_size}
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in inspect.signature(varlen_attn).parameters:
            kw["enable_gqa"] = True
        else:
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


def self_attention(q, k, v, offsets, *, causal=False, impl="jfa", backend="auto", max_len=None):
    """Jagged self-attention: q ``[T, Hq, D]``, k/v ``[T, Hkv, D]``, offsets ``[B+1]`` -> ``[T, Hq, D]``."""
    gqa = q.shape[1] != k.shape[1]
    if impl == "jfa":
        from .api import jagged_attention
        return jagged_attention(q, k, v, offsets, max_q_len=max_len, max_kv_len=max_len, causal=causal,
                                backend=backend)
    if impl == "fa2":
        m, cu = _max_len(offsets, max_len), offsets.to(torch.int32)
        return _fa2(q, k, v, cu, cu, m, m, window_size=(-1, 0) if causal else (-1, -1))
    if impl == "padded":
        m = _max_len(offsets, max_len)
        qp, lens = to_padded(q, offsets, m)  # [B, L, Hq, D]
        kp, _ = to_padded(k, offsets, m)
        vp, _ = to_padded(v, offsets, m)
        out = F.scaled_dot_product_attention(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2),
                                             attn_mask=_padded_mask(lens, m, m, causal), enable_gqa=gqa)
        return from_padded(out.transpose(1, 2), lens)[0]
    raise ValueError(f"unknown attention impl {impl!r}; expected one of {IMPLS}")


def pool_attention(q, k, v, offsets, *, impl="jfa", backend="auto", max_len=None):
    """PMA pooling: dense q ``[Lq, Hq, D]`` attends each sequence of k/v ``[T, Hkv, D]`` -> ``[B, Lq, Hq, D]``."""
    batch, lq = offsets.numel() - 1, q.shape[0]
    gqa = q.shape[1] != k.shape[1]
    if impl == "jfa":
        from .api import broadcast_attention
        return broadcast_attention(q, k, v, offsets, max_kv_len=max_len, backend=backend)
    if impl == "fa2":
        qx = q.unsqueeze(0).expand(batch, -1, -1, -1).reshape(batch * lq, q.shape[1], q.shape[2])
        cu_q = torch.arange(batch + 1, device=q.device, dtype=torch.int32) * lq
        out = _fa2(qx, k, v, cu_q, offsets.to(torch.int32), lq, _max_len(offsets, max_len))
        return out.view(batch, lq, q.shape[1], q.shape[2])
    if impl == "padded":
        m = _max_len(offsets, max_len)
        kp, lens = to_padded(k, offsets, m)
        vp, _ = to_padded(v, offsets, m)
        qp = q.transpose(0, 1).unsqueeze(0).expand(batch, -1, -1, -1)  # [B, Hq, Lq, D]
        mask = _padded_mask(lens, lq, m, causal=False)
        out = F.scaled_dot_product_attention(qp, kp.transpose(1, 2), vp.transpose(1, 2), attn_mask=mask,
                                             enable_gqa=gqa)
        return out.transpose(1, 2)
    raise ValueError(f"unknown attention impl {impl!r}; expected one of {IMPLS}")


# -------------------------------------------------------------------------------------------------- model
class JaggedBlock(nn.Module):
    """Pre-norm transformer block over packed histories: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, d_model, heads, kv_heads, head_dim, causal, impl, backend):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.causal, self.impl, self.backend = causal, impl, backend
        self.norm1 = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, heads * head_dim)
        self.kv = nn.Linear(d_model, 2 * kv_heads * head_dim)
        self.proj = nn.Linear(heads * head_dim, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x, offsets, max_len=None):
        h = self.norm1(x)
        q = self.q(h).view(-1, self.heads, self.head_dim)
        k, v = self.kv(h).view(-1, 2, self.kv_heads, self.head_dim).unbind(1)
        a = self_attention(q, k, v, offsets, causal=self.causal, impl=self.impl, backend=self.backend,
                           max_len=max_len)
        x = x + self.proj(a.reshape(x.shape[0], -1))
        return x + self.mlp(self.norm2(x))


class GEMModel(nn.Module):
    """Click model: item ids ``[T]`` + offsets ``[B+1]`` -> logits ``[B]`` (see module doc).

    heads/kv_heads: GQA when kv_heads < heads. pma_queries: Lq of the pooling. impl/backend: the attention.
    """

    def __init__(self, num_items, d_model=64, heads=4, kv_heads=None, layers=2, pma_queries=4, max_pos=4096,
                 causal=False, impl="jfa", backend="auto"):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"unknown attention impl {impl!r}; expected one of {IMPLS}")
        kv_heads = kv_heads or heads
        if d_model % heads or heads % kv_heads:
            raise ValueError(f"d_model ({d_model}) % heads ({heads}) and heads % kv_heads ({kv_heads}) must be 0")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d_model // heads
        self.impl, self.backend, self.max_pos = impl, backend, max_pos
        self.item = nn.Embedding(num_items, d_model)
        self.pos = nn.Embedding(max_pos, d_model)
        self.blocks = nn.ModuleList(JaggedBlock(d_model, heads, kv_heads, self.head_dim, causal, impl, backend)
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.pma_q = nn.Parameter(torch.randn(pma_queries, heads, self.head_dim) / math.sqrt(self.head_dim))
        self.pma_kv = nn.Linear(d_model, 2 * kv_heads * self.head_dim)
        self.head = nn.Sequential(nn.Linear(pma_queries * d_model, d_model), nn.GELU(), nn.Linear(d_model, 1))

    def forward(self, items, offsets, max_len=None):
        total, batch = items.shape[0], offsets.numel() - 1
        offsets = offsets.to(items.device)
        lens = offsets[1:] - offsets[:-1]
        seq = torch.repeat_interleave(torch.arange(batch, device=items.device), lens, output_size=total)
        pos = (torch.arange(total, device=items.device) - offsets[:-1][seq]).clamp_(max=self.max_pos - 1)
        x = self.item(items) + self.pos(pos)  # [T, d_model]
        for block in self.blocks:
            x = block(x, offsets, max_len)
        k, v = self.pma_kv(self.norm(x)).view(total, 2, self.kv_heads, self.head_dim).unbind(1)
        q = self.pma_q.to(k.dtype)
        pooled = pool_attention(q, k, v, offsets, impl=self.impl, backend=self.backend, max_len=max_len)
        return self.head(pooled.reshape(batch, -1).to(x.dtype)).squeeze(-1)


# --------------------------------------------------------------------------------------------------- data
def skewed_lengths(batch, max_len, generator):
    """The benchmark suite's skewed recipe: ``L = max(1, floor(u**3 * max_len))``, u ~ U[0, 1) (int64 [B])."""
    u = torch.rand(batch, generator=generator)
    return torch.clamp(torch.floor(u ** 3 * max_len), min=1).long()


def synthetic_batch(batch, max_len, num_items, generator, num_triggers=8, trigger_rate=0.0):
    """A learnable click batch: (items int64 [T], offsets int64 [B+1], labels float32 [B]), on the CPU.

    Half the users click. Non-clickers' histories hold only non-trigger ids (> num_triggers); a clicker's
    history holds one "trigger" item (ids 1..num_triggers) at a random position, and each other position
    is also a trigger with probability ``trigger_rate`` (0: a needle in the haystack; higher: easier).
    """
    lens = skewed_lengths(batch, max_len, generator)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lens, 0)])
    total = int(offsets[-1])
    seq = torch.repeat_interleave(torch.arange(batch), lens, output_size=total)
    items = torch.randint(num_triggers + 1, num_items, (total,), generator=generator)
    labels = (torch.rand(batch, generator=generator) < 0.5).float()
    where = offsets[:-1] + (torch.rand(batch, generator=generator) * lens).long()
    planted = torch.zeros(total, dtype=torch.bool)
    planted[where] = True
    planted |= torch.rand(total, generator=generator) < trigger_rate
    planted &= labels.bool()[seq]
    items[planted] = torch.randint(1, num_triggers + 1, (total,), generator=generator)[planted]
    return items, offsets, labels


def select_sequences(items, offsets, labels, index):
    """The sub-batch of the sequences in ``index`` (in that order): (items, offsets, labels)."""
    index = torch.as_tensor(index, dtype=torch.long)
    lens = (offsets[1:] - offsets[:-1])[index]
    starts = offsets[:-1][index]
    total = int(lens.sum())
    seq = torch.repeat_interleave(torch.arange(index.numel()), lens, output_size=total)
    new_offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lens, 0)])
    rows = starts[seq] + torch.arange(total) - new_offsets[:-1][seq]
    return items[rows], new_offsets, labels[index]


# ---------------------------------------------------------------------------------------------- partition
def attention_cost(lens, q_lens=None):
    """Per-sequence attention cost ``Lq * Lk`` (self-attention: ``L * L``), int64."""
    lens = torch.as_tensor(lens).long()
    return lens * (lens if q_lens is None else torch.as_tensor(q_lens).long())


def chunk_partition(n, world):
    """Contiguous, equal-count chunks (the first ``n % world`` ranks get one more): list of index lists."""
    base, extra = divmod(n, world)
    out, start = [], 0
    for r in range(world):
        size = base + (r < extra)
        out.append(list(range(start, start + size)))
        start += size
    return out


def lpt_partition(costs, world):
    """Greedy LPT: sequences by decreasing cost, each to the least-loaded rank. List of index lists (each in
    increasing order). Max load <= 4/3 of optimal; every rank gets a sequence when ``n >= world``."""
    costs = [int(c) for c in torch.as_tensor(costs).tolist()]
    heap = [(0, r) for r in range(world)]
    parts = [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, r = heapq.heappop(heap)
        parts[r].append(i)
        heapq.heappush(heap, (load + costs[i], r))
    return [sorted(p) for p in parts]


def rank_loads(costs, parts):
    """Total cost of each rank's part."""
    costs = torch.as_tensor(costs).long()
    return [int(costs[torch.as_tensor(p, dtype=torch.long)].sum()) if p else 0 for p in parts]
