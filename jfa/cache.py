"""A jagged KV cache for serving: per layer, the keys and values of many users' histories in pages of a pool,
appended to with no host sync and read in place by jfa.jagged_attention through its page table (a growing history
never moves).

    cache = jfa.KVCache(batch=B, capacity=4096, heads=4, head_dim=128, dtype=torch.bfloat16, device="cuda")
    cache.append(k_new, v_new, new_offsets)          # each user's new rows after its history (packed, [B+1] offsets)
    out = cache.attend(q_new, new_offsets, causal=True, activation="silu", num_targets=t)   # the new rows' queries

The queries are each sequence's last rows (bottom-right aligned), so the new rows' scores are the ones they would
have in self-attention over the whole history (with HSTU's mask too: jfa.jagged.target_mask).
Pages of 128 rows (the default) or a multiple are read by the Hopper forward (within 1% of packed keys on the
H200), smaller ones by the portable kernels. Each user owns capacity / page_size pages of the pool from the start (the
page table is a plain tensor: a caller with an allocator of its own may rewrite it). Forward only: the pool is a
buffer, not a parameter.
"""
from __future__ import annotations

import torch

from .api import jagged_attention
from .jagged import pool_rows


class KVCache:
    def __init__(self, batch: int, capacity: int, heads: int, head_dim: int, *, page_size: int = 128,
                 dtype=torch.bfloat16, device=None):
        if min(batch, capacity, heads, head_dim, page_size) < 1:
            raise ValueError(f"KVCache needs positive sizes, got batch={batch}, capacity={capacity}, heads={heads}, "
                             f"head_dim={head_dim}, page_size={page_size}")
        pages = -(-capacity // page_size)
        self.capacity, self.page_size = pages * page_size, page_size
        self.k = torch.zeros(batch * pages * page_size, heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.page_table = torch.arange(batch * pages, dtype=torch.int32, device=device).view(batch, pages)
        self.offsets = torch.zeros(batch + 1, dtype=torch.int32, device=device)  # the histories as if packed

    @property
    def batch(self) -> int:
        return self.page_table.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """Rows held per user (int32 [B], on the cache's device)."""
        return self.offsets[1:] - self.offsets[:-1]

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor, new_offsets: torch.Tensor) -> None:
        """Each user's new rows (k_new, v_new: packed [T, H, D]; new_offsets [B+1], zero rows allowed) after its
        history. No host sync (CUDA-graph capturable): a user pushed past the capacity fails a device-side assert."""
        if k_new.shape != v_new.shape or k_new.shape[1:] != self.k.shape[1:]:
            raise ValueError(f"k_new and v_new must be [T, {self.k.shape[1]}, {self.k.shape[2]}], got "
                             f"{tuple(k_new.shape)} and {tuple(v_new.shape)}")
        if new_offsets.shape != self.offsets.shape:
            raise ValueError(f"new_offsets must be [{self.batch + 1}], got {tuple(new_offsets.shape)}")
        added = (new_offsets[1:] - new_offsets[:-1]).to(torch.int32)
        lengths = self.lengths
        torch._assert_async(((lengths + added) <= self.capacity).all(), "KVCache.append: a user's rows exceed the "
                            "capacity")
        rows = k_new.shape[0]
        user = torch.repeat_interleave(torch.arange(self.batch, device=added.device), added, output_size=rows)
        pos = (lengths[user] + torch.arange(rows, device=added.device) - new_offsets[:-1][user]).long()
        at = pool_rows(self.page_table, user, pos, self.page_size)
        self.k[at] = k_new.to(self.k.dtype)
        self.v[at] = v_new.to(self.v.dtype)
        self.offsets[1:] += torch.cumsum(added, 0, dtype=torch.int32)

    def clear(self) -> None:
        """Every user's history dropped (the pool's values stay, unread)."""
        self.offsets.zero_()

    @torch.no_grad()
    def attend(self, q: torch.Tensor, q_offsets: torch.Tensor, *, max_q_len: int | None = None, **options):
        """jfa.jagged_attention of q (each user's last rows: [Tq, Hq, D], q_offsets [B+1]) against the cached
        histories, read through the page table (options: causal, window, scale, activation, out_scale,
        num_targets, contextual_len, backend, return_lse). With max_q_len the call is free of host syncs."""
        return jagged_attention(q, self.k, self.v, q_offsets, self.offsets, max_q_len=max_q_len,
                                max_kv_len=self.capacity, page_table=self.page_table, page_size=self.page_size,
                                **options)
