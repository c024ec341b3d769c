"""A small GEM/Kunlun-style click model over jagged user histories, built from jfa.nn's layers, to run jfa inside
a real training loop and to compare it end to end with other attention kernels.

    item ids [T] + offsets [B+1] -> embedding (+ position) -> N x (pre-norm jfa.nn.JaggedSelfAttention + MLP)
        -> jfa.nn.PMAPooling (learned seed queries attend each history: broadcast attention)
        -> MLP head -> one click logit per user [B]

``impl`` swaps the attention kernel inside the same layers (jfa.nn's ``attention`` argument):
  "jfa"     jfa.jagged_attention / jfa.broadcast_attention (``backend`` picks jfa's backend, "auto" by default)
  "fa2"     torch.nn.attention.varlen.varlen_attn (CUDA only); broadcast by expanding q to B copies
  "fa4"     flash_attn.cute.flash_attn_varlen_func (flash-attn-4, CUDA only, when installed); the same
  "padded"  pad to [B, L, H, D] and F.scaled_dot_product_attention with a boolean mask
Also here: the synthetic click data (skewed lengths, as the benchmark suite), AUC, and the rank partitions.
"""
from __future__ import annotations

import heapq
import inspect

import torch
import torch.nn.functional as F
from torch import nn

from .jagged import causal_window
from .nested import from_padded, to_padded
from .nn import JaggedSelfAttention, PMAPooling

IMPLS = ("jfa", "fa2", "fa4", "padded")


# ----------------------------------------------------------------------------------------------- attention
# Other kernels behind jfa's signatures (jfa.jagged_attention, jfa.broadcast_attention), for jfa.nn's layers.
def _max_len(offsets, max_len):
    return int((offsets[1:] - offsets[:-1]).max()) if max_len is None else max_len


def _broadcast_rows(q, kv_offsets):
    """Broadcast q as these libraries' users run it: q repeated per sequence, [B * Lq, H, D], and its offsets."""
    batch, lq = kv_offsets.numel() - 1, q.shape[0]
    rows = q.unsqueeze(0).expand(batch, -1, -1, -1).reshape(batch * lq, q.shape[1], q.shape[2])
    return rows, torch.arange(batch + 1, device=q.device, dtype=torch.int32) * lq


def fa2_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                  window=(-1, -1), scale=None):
    """torch's varlen_attn (FA2); GQA through enable_gqa where torch has it, else k/v repeated per q head."""
    from torch.nn.attention.varlen import varlen_attn
    kv_offsets = q_offsets if kv_offsets is None else kv_offsets
    kw = {"window_size": causal_window(causal, window), "scale": scale}
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in inspect.signature(varlen_attn).parameters:
            kw["enable_gqa"] = True
        else:
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    return varlen_attn(q, k, v, q_offsets.to(torch.int32), kv_offsets.to(torch.int32), _max_len(q_offsets, max_q_len),
                       _max_len(kv_offsets, max_kv_len), **kw)


def fa4_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                  window=(-1, -1), scale=None):
    """flash-attn-4's varlen function (its sm90 path on Hopper)."""
    from flash_attn.cute import flash_attn_varlen_func
    kv_offsets = q_offsets if kv_offsets is None else kv_offsets
    left, right = causal_window(causal, window)
    is_causal = (left, right) == (-1, 0)
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=q_offsets.to(torch.int32),
                                 cu_seqlens_k=kv_offsets.to(torch.int32), max_seqlen_q=_max_len(q_offsets, max_q_len),
                                 max_seqlen_k=_max_len(kv_offsets, max_kv_len), softmax_scale=scale, causal=is_causal,
                                 window_size=(None, None) if is_causal else
                                 (None if left < 0 else left, None if right < 0 else right))
    return out[0] if isinstance(out, tuple) else out


def padded_attention(q, k, v, q_offsets, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                     window=(-1, -1), scale=None):
    """Pad to [B, H, L, D] and run F.scaled_dot_product_attention with a boolean mask (bottom-right aligned).
    A row that sees no key sees key 0 instead (SDPA would give NaN); jfa gives 0 there."""
    kv_offsets = q_offsets if kv_offsets is None else kv_offsets
    left, right = causal_window(causal, window)
    lq, lk = _max_len(q_offsets, max_q_len), _max_len(kv_offsets, max_kv_len)
    qp, q_lens = to_padded(q, q_offsets, lq)
    kp, kv_lens = to_padded(k, kv_offsets, lk)
    vp, _ = to_padded(v, kv_offsets, lk)
    i = torch.arange(lq, device=q.device).view(1, lq, 1) + (kv_lens - q_lens).view(-1, 1, 1)
    j = torch.arange(lk, device=q.device).view(1, 1, lk)
    mask = j < kv_lens.view(-1, 1, 1)
    if left >= 0:
        mask = mask & (j >= i - left)
    if right >= 0:
        mask = mask & (j <= i + right)
    mask = mask | (~mask.any(-1, keepdim=True) & (j == 0))
    out = F.scaled_dot_product_attention(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2),
                                         attn_mask=mask.unsqueeze(1), scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return from_padded(out.transpose(1, 2), q_lens)[0]


def _broadcast(attention):
    """jfa.broadcast_attention's signature over a jagged kernel: q repeated per sequence (timed with it)."""
    def broadcast(q, k, v, kv_offsets, *, max_kv_len=None, causal=False, window=(-1, -1), scale=None):
        rows, q_offsets = _broadcast_rows(q, kv_offsets)
        out = attention(rows, k, v, q_offsets, kv_offsets, max_q_len=q.shape[0], max_kv_len=max_kv_len,
                        causal=causal, window=window, scale=scale)
        return out.view(kv_offsets.numel() - 1, q.shape[0], q.shape[1], q.shape[2])
    return broadcast


KERNELS = {  # impl -> (jagged attention, broadcast attention) for jfa.nn's `attention`; None: jfa's own
    "jfa": (None, None),
    "fa2": (fa2_attention, _broadcast(fa2_attention)),
    "fa4": (fa4_attention, _broadcast(fa4_attention)),
    "padded": (padded_attention, _broadcast(padded_attention)),
}


# -------------------------------------------------------------------------------------------------- model
class JaggedBlock(nn.Module):
    """Pre-norm transformer block over packed histories: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, d_model, heads, kv_heads, causal, attention=None, backend="auto"):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = JaggedSelfAttention(d_model, heads, kv_heads, causal=causal, backend=backend,
                                        attention=attention)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x, offsets, max_len=None):
        x = x + self.attn(self.norm1(x), offsets, max_len=max_len)
        return x + self.mlp(self.norm2(x))


class GEMModel(nn.Module):
    """Click model: item ids ``[T]`` + offsets ``[B+1]`` -> logits ``[B]`` (see module doc).

    heads/kv_heads: GQA when kv_heads < heads. pma_queries: the pooling's seeds. impl/backend: the attention.
    """

    def __init__(self, num_items, d_model=64, heads=4, kv_heads=None, layers=2, pma_queries=4, max_pos=4096,
                 causal=False, impl="jfa", backend="auto"):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"unknown attention impl {impl!r}; expected one of {IMPLS}")
        jagged, broadcast = KERNELS[impl]
        self.impl, self.max_pos = impl, max_pos
        self.item = nn.Embedding(num_items, d_model)
        self.pos = nn.Embedding(max_pos, d_model)
        self.blocks = nn.ModuleList(JaggedBlock(d_model, heads, kv_heads, causal, jagged, backend)
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.pool = PMAPooling(d_model, heads, pma_queries, kv_heads, backend=backend, attention=broadcast)
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
        pooled = self.pool(self.norm(x), offsets, max_len=max_len)  # [B, pma_queries, d_model]
        return self.head(pooled.reshape(batch, -1)).squeeze(-1)


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


def auc(scores, labels) -> float:
    """Area under the ROC curve of scores for binary labels (the Mann-Whitney rank statistic; ties count half);
    0.5 when one class is absent."""
    scores, labels = scores.detach().double().cpu(), labels.detach().bool().cpu()
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return 0.5
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, scores.numel() + 1, dtype=torch.float64)
    for value in torch.unique(scores):  # average ranks over ties
        tied = scores == value
        ranks[tied] = ranks[tied].mean()
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


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
