"""A small GEM/Kunlun-style click model over jagged user histories, built from jfa.nn's layers, to run jfa inside
a real training loop and to compare it end to end with other attention kernels.

    item ids [T] + offsets [B+1] -> embedding (+ position) -> N x (pre-norm jfa.nn.JaggedSelfAttention + MLP)
        -> jfa.nn.PMAPooling (learned seed queries attend each history: broadcast attention)
        -> MLP head -> one click logit per user [B]

``impl`` swaps the attention kernel inside the same layers (jfa.nn's ``attention`` argument; jfa.peers.KERNELS):
  "jfa"     jfa.jagged_attention / jfa.broadcast_attention (``backend`` picks jfa's backend, "auto" by default)
  "fa2"     torch.nn.attention.varlen.varlen_attn (CUDA only); broadcast by expanding q to B copies
  "fa4"     flash_attn.cute.flash_attn_varlen_func (flash-attn-4, CUDA only, when installed); the same
  "padded"  pad to [B, L, H, D] and F.scaled_dot_product_attention with a boolean mask
  "hstu", "hstu-cuda"  HSTU's Triton and CUDA kernels in HSTU layers (hstu=True; the pooling stays jfa's)
  "hstu3-cuda"  NVIDIA's HSTU kernel (FBGEMM's), the same way
  "gdpa"    GDPA's Triton kernel in the blocks (an activation, not causal; the pooling stays jfa's)
Also here: the synthetic click data (skewed lengths, as the benchmark suite), AUC, and the rank partitions.
"""
from __future__ import annotations

import heapq

import torch
from torch import nn

from .nn import HSTULayer, JaggedSelfAttention, PMAPooling
from .peers import KERNELS

IMPLS = tuple(KERNELS)


# -------------------------------------------------------------------------------------------------- model
class JaggedBlock(nn.Module):
    """Pre-norm transformer block over packed histories: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, d_model, heads, kv_heads, causal, attention=None, backend="auto", activation="softmax",
                 out_scale=1.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = JaggedSelfAttention(d_model, heads, kv_heads, causal=causal, backend=backend,
                                        attention=attention, activation=activation, out_scale=out_scale)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x, offsets, max_len=None, **mask):
        x = x + self.attn(self.norm1(x), offsets, max_len=max_len, **mask)
        return x + self.mlp(self.norm2(x))


class GEMModel(nn.Module):
    """Click model: item ids ``[T]`` + offsets ``[B+1]`` -> logits ``[B]`` (see module doc).

    heads/kv_heads: GQA when kv_heads < heads. pma_queries: the pooling's seeds. impl/backend: the attention.
    activation: GDPA's, in the transformer blocks' attention (with out_scale 1 / max_pos). hstu: HSTU layers
    (jfa.nn.HSTULayer, causal SiLU attention) in place of the transformer blocks; num_buckets (with hstu): their
    relative attention bias, HSTU's position and time tables (HSTULayer's), and forward takes the items' timestamps.
    forward's num_targets (with causal attention): HSTU's mask, each history's last num_targets[b] items scored as
    candidates in the same pass.
    """

    def __init__(self, num_items, d_model=64, heads=4, kv_heads=None, layers=2, pma_queries=4, max_pos=4096,
                 causal=False, impl="jfa", backend="auto", activation="softmax", hstu=False, num_buckets=None):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"unknown attention impl {impl!r}; expected one of {IMPLS}")
        jagged, broadcast = KERNELS[impl]
        self.impl, self.max_pos = impl, max_pos
        self.item = nn.Embedding(num_items, d_model)
        self.pos = nn.Embedding(max_pos, d_model)
        if num_buckets is not None and not (hstu and impl == "jfa"):
            raise ValueError("num_buckets (HSTU's relative bias) needs hstu=True and impl='jfa' (the peers' kernels "
                             "take no bias)")
        self.timed = num_buckets is not None
        if hstu:
            self.blocks = nn.ModuleList(HSTULayer(d_model, heads, max_seq_len=max_pos, num_buckets=num_buckets,
                                                  backend=backend, attention=jagged) for _ in range(layers))
        else:
            out_scale = 1.0 if activation == "softmax" else 1.0 / max_pos
            self.blocks = nn.ModuleList(JaggedBlock(d_model, heads, kv_heads, causal, jagged, backend, activation,
                                                    out_scale) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.pool = PMAPooling(d_model, heads, pma_queries, kv_heads, backend=backend, attention=broadcast)
        self.head = nn.Sequential(nn.Linear(pma_queries * d_model, d_model), nn.GELU(), nn.Linear(d_model, 1))

    def forward(self, items, offsets, max_len=None, num_targets=None, timestamps=None):
        total, batch = items.shape[0], offsets.numel() - 1
        mask = {} if num_targets is None else {"num_targets": num_targets}
        if self.timed:
            if timestamps is None:
                raise ValueError("this GEMModel has a relative bias (num_buckets): forward needs timestamps")
            mask["timestamps"] = timestamps
        offsets = offsets.to(items.device)
        lens = offsets[1:] - offsets[:-1]
        seq = torch.repeat_interleave(torch.arange(batch, device=items.device), lens, output_size=total)
        pos = (torch.arange(total, device=items.device) - offsets[:-1][seq]).clamp_(max=self.max_pos - 1)
        x = self.item(items) + self.pos(pos)  # [T, d_model]
        for block in self.blocks:
            x = block(x, offsets, max_len=max_len, **mask)
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
