"""torch.nested jagged tensors (NJT) in and out of jfa, and the packed <-> padded conversions.

An NJT of shape ``[B, j, H, D]`` (``layout=torch.jagged``, ragged dim 1) is exactly jfa's packed layout:
``nt.values()`` is ``[T, H, D]`` and ``nt.offsets()`` the int64 ``[B+1]`` offsets. So

    out = jfa.jagged_attention(nq, nk, nv, causal=True)     # NJT [B, j, Hq, D] in -> NJT out

costs no copy (for a contiguous NJT; one with holes, ``nt.lengths() is not None``, is compacted first).
The output shares q's offsets, so it has q's ragged size ``j`` and adds to ``nq`` directly. k/v may be NJTs
with other offsets (cross-attention). Every conversion here is differentiable.
"""
from __future__ import annotations

import logging

import torch


class _NoFxNotice(logging.Filter):
    """torch (2.13) logs a notice of its own the first time nested_tensor_from_jagged asks torch.fx whether it is
    tracing ("is_fx_tracing will return true for ..."): torch's business, not an NJT user's. jfa's NJT outputs
    leave it out (torch logs it once per process, so a user's later call does not print it either)."""

    def filter(self, record):
        return "is_fx_tracing" not in record.getMessage()


def is_njt(x) -> bool:
    """Whether x is a nested tensor with the jagged layout."""
    return isinstance(x, torch.Tensor) and x.is_nested and x.layout == torch.jagged


def from_njt(nt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NJT ``[B, j, *rest]`` (ragged dim 1) -> (values ``[T, *rest]``, offsets int64 ``[B+1]``). No copy
    unless the NJT has holes (``lengths`` set), in which case it is compacted first."""
    if not is_njt(nt):
        raise TypeError(f"expected a nested tensor with layout=torch.jagged, got {_describe(nt)}")
    if nt._ragged_idx != 1:
        raise ValueError(f"the ragged dimension must be dim 1 ([B, j, H, D]), got dim {nt._ragged_idx} of a "
                         f"{nt.dim()}-D NJT; for the SDPA layout [B, H, j, D] pass nt.transpose(1, 2)")
    if nt.lengths() is not None:
        nt = nt.contiguous()
    return nt.values(), nt.offsets()


def to_njt(values: torch.Tensor, offsets: torch.Tensor, *, max_len=None, min_len=None) -> torch.Tensor:
    """(values ``[T, *rest]``, offsets ``[B+1]``) -> NJT ``[B, j, *rest]`` viewing values (no copy).

    Reusing the offsets tensor of an existing NJT gives the result that NJT's ragged size ``j``.
    ``max_len``/``min_len`` (ints) are cached on the NJT when given, so later users need no host sync.
    """
    if torch.compiler.is_compiling():  # (torch.compile traces no logging; nor does it print the notice)
        return torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=min_len, max_seqlen=max_len)
    log, quiet = logging.getLogger("torch.fx._symbolic_trace"), _NoFxNotice()
    log.addFilter(quiet)
    try:
        return torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=min_len, max_seqlen=max_len)
    finally:
        log.removeFilter(quiet)


def to_padded(values: torch.Tensor, offsets: torch.Tensor, max_len=None, padding_value=0.0):
    """Packed ``[T, *rest]`` -> (padded ``[B, L, *rest]``, lengths ``[B]``); rows past a sequence's length
    hold ``padding_value``. ``L = max_len``, or the longest length (one host sync for GPU offsets)."""
    offsets = offsets.long()
    lens = offsets[1:] - offsets[:-1]
    batch, total = lens.numel(), values.shape[0]
    if max_len is None:
        max_len = int(lens.max()) if batch > 0 else 0
    seq = torch.repeat_interleave(torch.arange(batch, device=values.device), lens, output_size=total)
    pos = torch.arange(total, device=values.device) - offsets[:-1][seq]
    padded = values.new_full((batch, max_len) + tuple(values.shape[1:]), padding_value)
    padded = padded.index_put((seq, pos), values)  # out of place: differentiable w.r.t. values
    return padded, lens


def from_padded(padded: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded ``[B, L, *rest]`` + lengths ``[B]`` -> (values ``[T, *rest]``, offsets ``[B+1]``); offsets take
    lengths' dtype when it is int32/int64, else int64."""
    dtype = lengths.dtype if lengths.dtype in (torch.int32, torch.int64) else torch.int64
    lengths = lengths.to(padded.device, dtype)
    keep = torch.arange(padded.shape[1], device=padded.device).unsqueeze(0) < lengths.unsqueeze(1)  # [B, L]
    offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0, dtype=dtype)])
    return padded[keep], offsets


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {'nested ' if x.is_nested else ''}tensor with layout {x.layout}"
    return type(x).__name__


def cached_max_len(nt):
    """The NJT's cached max length as a Python int, or None (never computed here: that would sync)."""
    if torch.compiler.is_compiling():
        return None  # a SymInt under tracing; the hints are not needed there (the checks are skipped)
    m = nt._maybe_max_seqlen
    return m if isinstance(m, int) and not isinstance(m, bool) else None


def unpack_qkv(q, k, v, q_offsets=None, kv_offsets=None, max_q_len=None, max_kv_len=None):
    """NJT q ``[B, j, Hq, D]`` and k, v ``[B, j', Hkv, D]`` -> packed values and offsets, as
    jfa.jagged_attention takes them: (q, k, v, q_offsets, kv_offsets or None for self-attention, max_q_len,
    max_kv_len), the max lengths filled from the NJTs' caches where the caller passed none.

    Offsets come from the NJTs (passing q_offsets/kv_offsets too is an error). k and v must share their
    ragged structure; kv with offsets other than q's is cross-attention.
    """
    if q_offsets is not None or kv_offsets is not None:
        raise ValueError("with NJT inputs the offsets come from the nested tensors: do not pass q_offsets or "
                         "kv_offsets")
    if not (is_njt(k) and is_njt(v)):
        raise TypeError(f"q is an NJT, so k and v must be NJTs too; got k: {_describe(k)}, v: {_describe(v)}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"NJT q, k, v must be [B, j, H, D], got {q.dim()}-D, {k.dim()}-D, {v.dim()}-D")
    q_values, q_off = from_njt(q)
    k_values, k_off = from_njt(k)
    v_values, v_off = from_njt(v)
    if v_off is not k_off and not torch.compiler.is_compiling():
        if v_off.shape != k_off.shape or not torch.equal(v_off, k_off.to(v_off.device)):
            raise ValueError("k and v NJTs must have the same ragged structure (offsets)")
    self_attention = k_off is q_off
    if max_q_len is None:
        max_q_len = cached_max_len(q)
    if max_kv_len is None:
        max_kv_len = max_q_len if self_attention else cached_max_len(k)
    return (q_values, k_values, v_values, q_off, None if self_attention else k_off, max_q_len, max_kv_len)
