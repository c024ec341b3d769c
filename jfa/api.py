"""The public functions. One path down: validate (jfa.checks) -> one jfa.problem.Problem -> torch.ops.jfa.attention
(jfa.op.attend) -> a backend.

Layout: q ``[Tq, Hq, D]``, k/v ``[Tk, Hkv, D]``, packed back to back; offsets ``[B+1]`` int32/int64.
Visibility: key j of a sequence is visible to its query i when ``i' - left <= j <= i' + right`` with
``i' = i + (Lk - Lq)`` (bottom-right alignment); -1 = unbounded; causal means right = 0 and combines with
window. A query row that sees no key outputs 0 with lse -inf, and no NaN anywhere (gradients included).
Score: softmax, or an activation f in its place (``out_i = out_scale_i * sum_j f(scale * q_i . k_j) v_j``).
"""
from __future__ import annotations

import torch

from . import bias, checks, nested
from .backends import select
from .jagged import resolve_window, score_heads
from .op import attend
from .problem import Problem


def jagged_attention(q, k, v, q_offsets=None, kv_offsets=None, *, max_q_len=None, max_kv_len=None, causal=False,
                     window=(-1, -1), scale=None, activation="softmax", out_scale=1.0, num_targets=None,
                     contextual_len=0, min_full_attn_len=0, num_softmax_heads=0, rel_bias=None, page_table=None,
                     page_size=None, return_lse=False, backend="auto", deterministic=False):
    """Attention over a packed jagged batch (self-attention, or cross-attention with other kv offsets).

    Args:
        q: ``[Tq, Hq, D]``; k, v: ``[Tk, Hkv, D]`` with ``Hq % Hkv == 0`` (GQA: query head h reads kv head
            ``h // (Hq // Hkv)``). float16/bfloat16 (fast paths) or float32.
        q_offsets: ``[B+1]`` int32/int64 row offsets of the sequences in q; ``kv_offsets``: the same for k/v
            (None: same as q_offsets, i.e. self-attention).
        max_q_len, max_kv_len: optional Python ints, bounds on the sequences' lengths. Never needed for a
            correct result (the kernels take the lengths from the offsets on the device); passing both for GPU
            offsets makes the call free of host syncs (the offsets and bounds are then trusted: a bound below the
            longest sequence gives wrong gradients). Checked against the offsets otherwise. The hopper backward
            skips its dQ pass when max_kv_len says every sequence's dQ is done in the dK/dV pass (<= 128 keys).
        causal, window: the mask (see module doc). scale: defaults to ``1/sqrt(D)``.
        activation: "softmax", or an activation taking its place: "silu", "gelu" (erf), "gelu_tanh", "relu",
            "relu2" (relu squared), "sigmoid", "identity": ``out_i = out_scale_i * sum over the keys j visible to
            query i of f(scale * q_i . k_j) v_j`` (GDPA; HSTU's attention is silu with out_scale 1 / N).
        out_scale: with an activation, a float or a float32 tensor ``[Tq]`` on q's device (one factor per output
            row), a constant (no gradient).
        num_targets, contextual_len: HSTU's mask for generative recommenders (causal=True): the last
            ``num_targets[b]`` rows of sequence b (an int tensor ``[B]`` on the offsets' device) are targets, which
            see the history and themselves and never each other, and the history never sees them; the first
            ``contextual_len`` rows (an int) are a contextual prefix that every row sees and that sees the whole
            history; ``window=(W, 0)`` bounds the distance in HSTU's positions. The rule: jfa.jagged.target_mask.
            A sequence's rows are its keys; in cross-attention (serving: new rows against a cached history and
            themselves, HSTU's cached attention) its queries are its last rows, at most as many as its keys, and
            each query's score is the one its row has in self-attention over the whole sequence.
            Where the offsets are checked, a prefix longer than a (non-empty) sequence, or more queries than keys,
            is an error; where they are trusted (both max lengths for GPU offsets) such a sequence is all prefix,
            as the rule says, and the results of a sequence with more queries than keys are unspecified.
        min_full_attn_len: with HSTU's mask and ``window=(W, 0)``, the history's last ``min_full_attn_len`` rows
            and the targets see the whole history, past the window (HSTU's min_full_attn_seq_len).
        num_softmax_heads: the first ``num_softmax_heads`` query heads (a multiple of the GQA group) take softmax
            (no out scale: softmax normalises its rows) and the rest ``activation`` (HSTU's num_softmax_heads):
            one launch of each kind, over its heads, the outputs concatenated by head.
        rel_bias: a jfa.RelativeBias: learned tables of a relative position and a bucketed time difference added
            to every score (HSTU's relative attention bias; the rule: jfa.bias), with the tables' gradients. The
            portable kernels compute it ("auto" takes them); not with broadcast q.
        page_table, page_size: paged k and v (serving a cache, jfa.KVCache; forward only): k and v are a pool of
            pages of ``page_size`` rows, and key j of sequence b lies at row ``page_table[b, j // page_size] *
            page_size + j % page_size`` (``page_table`` int32 ``[B, pages]`` on q's device); ``kv_offsets`` (needed)
            count each sequence's keys as if packed. The same bits as the packed call. The hopper backend reads
            pages of a multiple of 128 rows ("auto" gives smaller ones to the portable kernels).
        return_lse: also return the float32 natural-log logsumexp, ``[Hq, Tq]`` (softmax only).
        backend: "auto", "reference", "triton" or "hopper".
        deterministic: the backward gives the same bits run to run (the hopper backend's default backward adds
            dQ with TMA reduce-adds in a varying order; this takes two passes with no atomics instead). Not the
            rel_bias tables' gradients: the portable kernels sum them by float32 atomics, whatever this says.
    Returns:
        out ``[Tq, Hq, D]`` in q's dtype, or ``(out, lse)``.
    NJT inputs (torch.nested, layout=torch.jagged, ``[B, j, H, D]``, offsets taken from them) give an NJT out.
    """
    options = dict(causal=causal, window=window, scale=scale, activation=activation, out_scale=out_scale,
                   num_targets=num_targets, contextual_len=contextual_len, min_full_attn_len=min_full_attn_len,
                   rel_bias=rel_bias, backend=backend, deterministic=deterministic, page_table=page_table,
                   page_size=page_size)
    if num_softmax_heads:
        options["num_softmax_heads"] = num_softmax_heads
    if nested.is_njt(q):  # NJT inputs: unpack to packed + offsets, attend, repack the output on q's offsets
        q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len = nested.unpack_qkv(
            q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len)
        result = jagged_attention(q, k, v, q_offsets, kv_offsets, max_q_len=max_q_len, max_kv_len=max_kv_len,
                                  return_lse=return_lse, **options)
        out = nested.to_njt(result[0] if return_lse else result, q_offsets, max_len=max_q_len)
        return (out, result[1]) if return_lse else out
    if num_softmax_heads:
        checks.check_return_lse(return_lse, activation)
        return _by_score(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, options)
    p = problem(q, k, v, q_offsets, kv_offsets, max_q_len=max_q_len, max_kv_len=max_kv_len, **options)
    checks.check_return_lse(return_lse, p.activation)
    out, lse = attend(p)
    return (out, lse) if return_lse else out


def _by_score(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, options):
    """num_softmax_heads: the softmax heads' call and the activation heads', concatenated by head (each a kv head
    slice of its own: the group divides the softmax heads)."""
    n = options.pop("num_softmax_heads")
    checks.check_qkv(q, k, v)
    checks.check_softmax_heads(n, q, k, options["activation"], options["rel_bias"])
    parts = score_heads(q.shape[1], k.shape[1], n)
    # torch.split, not slices: its backward is one concatenation of the parts' gradients, where each slice's filled
    # a zeroed whole-size gradient and autograd added them (hstu-targets' backward +6 ms, 2 + 2 heads)
    qs, ks, vs = (torch.split(x, [part[i] for part in parts], 1) for x, i in ((q, 0), (k, 1), (v, 1)))
    outs = [jagged_attention(*qkv, q_offsets, kv_offsets, max_q_len=max_q_len, max_kv_len=max_kv_len,
                             **{**options, **score}) for *qkv, (_, _, score) in zip(qs, ks, vs, parts)]
    return torch.cat(outs, 1) if len(outs) > 1 else outs[0]


def problem(q, k, v, q_offsets=None, kv_offsets=None, *, broadcast=False, max_q_len=None, max_kv_len=None,
            **options) -> Problem:
    """The jfa.problem.Problem that jagged_attention (or with broadcast=True, broadcast_attention, whose kv
    offsets are then the fourth argument) solves for these arguments (options: causal, window, scale,
    activation, out_scale, num_targets, contextual_len, min_full_attn_len, backend, deterministic, as there),
    validated: what the benchmarks and tests hand to a backend directly."""
    if broadcast:
        return _broadcast_problem(q, k, v, q_offsets, max_kv_len, options)
    q, k, v = checks.check_qkv(q, k, v)
    self_attention = kv_offsets is None
    kv_offsets = q_offsets if self_attention else kv_offsets
    checks.check_offsets_meta("q_offsets", q_offsets, q.device)
    checks.check_offsets_meta("kv_offsets", kv_offsets, q.device)
    if q_offsets.numel() != kv_offsets.numel():
        raise ValueError(f"q_offsets and kv_offsets must describe the same batch: {q_offsets.numel() - 1} vs "
                         f"{kv_offsets.numel() - 1} sequences")
    checks.check_max_len("max_q_len", max_q_len)
    checks.check_max_len("max_kv_len", max_kv_len)
    options["page_size"] = checks.check_pages(options.get("page_table"), options.get("page_size"), q, k, v,
                                              kv_offsets, self_attention)
    if checks.offsets_values_checked([q_offsets, kv_offsets], max_q_len is not None and max_kv_len is not None):
        if self_attention:  # one look at the shared offsets checks both hints
            if k.shape[0] != q.shape[0]:
                raise ValueError(f"self-attention (kv_offsets=None) needs as many k rows as q rows: "
                                 f"{k.shape[0]} vs {q.shape[0]}")
            checks.check_offsets_values("q_offsets", q_offsets, q.shape[0], "q",
                                        [("max_q_len", max_q_len), ("max_kv_len", max_kv_len)],
                                        options.get("num_targets"), options.get("contextual_len", 0))
        else:
            paged = options.get("page_table") is not None  # (the pool's rows are not the keys')
            q_lens = checks.check_offsets_values("q_offsets", q_offsets, q.shape[0], "q", [("max_q_len", max_q_len)])
            kv_lens = checks.check_offsets_values("kv_offsets", kv_offsets, None if paged else k.shape[0], "k",
                                                  [("max_kv_len", max_kv_len)], options.get("num_targets"),
                                                  options.get("contextual_len", 0))
            if paged:
                checks.check_page_values(options["page_table"], options["page_size"], k.shape[0], kv_lens)
            if (options.get("num_targets") is not None or options.get("contextual_len", 0)
                    or options.get("min_full_attn_len", 0)):
                checks.check_last_rows(q_lens, kv_lens)
    return _finish(q, k, v, q_offsets, kv_offsets, False, max_q_len, max_kv_len, **options)


def broadcast_attention(q, k, v, kv_offsets, *, max_kv_len=None, causal=False, window=(-1, -1), scale=None,
                        activation="softmax", out_scale=1.0, return_lse=False, backend="auto", deterministic=False):
    """One dense query block attended by every kv sequence of a jagged batch (PMA pooling).

    Args:
        q: ``[Lq, Hq, D]`` shared by all B sequences; k, v: ``[Tk, Hkv, D]`` packed; kv_offsets ``[B+1]``.
        The rest as jagged_attention (the mask aligns q's Lq rows bottom-right in each sequence; a per-row
        out_scale has ``B*Lq`` values, in the order of ``out.reshape(B*Lq, Hq, D)``).
    Returns:
        out ``[B, Lq, Hq, D]``, or ``(out, lse)`` with lse ``[Hq, B*Lq]`` (rows in the order of
        ``out.reshape(B*Lq, Hq, D)``). The gradient of q is the sum over the batch (accumulated in float32).
    """
    p = problem(q, k, v, kv_offsets, broadcast=True, max_kv_len=max_kv_len, causal=causal, window=window,
                scale=scale, activation=activation, out_scale=out_scale, backend=backend,
                deterministic=deterministic)
    checks.check_return_lse(return_lse, p.activation)
    out, lse = attend(p)
    out = out.view(p.batch, p.q.shape[0], p.heads, p.head_dim)
    return (out, lse) if return_lse else out


def _broadcast_problem(q, k, v, kv_offsets, max_kv_len, options):
    q, k, v = checks.check_qkv(q, k, v, dense_q=True)
    checks.check_offsets_meta("kv_offsets", kv_offsets, q.device)
    checks.check_max_len("max_kv_len", max_kv_len)
    if checks.offsets_values_checked([kv_offsets], max_kv_len is not None):
        checks.check_offsets_values("kv_offsets", kv_offsets, k.shape[0], "k", [("max_kv_len", max_kv_len)])
    q_offsets = _broadcast_row_offsets(kv_offsets.numel() - 1, q.shape[0], kv_offsets.dtype, q.device)
    return _finish(q, k, v, q_offsets, kv_offsets, True, q.shape[0], max_kv_len, **options)


_ROW_OFFSETS: dict = {}


def _broadcast_row_offsets(batch, lq, dtype, device):
    """Output row offsets of broadcast q: sequence b owns rows [b*Lq, (b+1)*Lq) (built on the device, no sync).

    One tensor per (batch, Lq, dtype, device), reused call after call: the kernels' schedule cache matches
    offsets by identity, so a fresh tensor per call would allocate and build a schedule every time (0.1-0.2
    ms per forward on the H200). Not stored while a CUDA graph is being captured or under torch.compile
    (whose graph makes its own)."""
    if torch.compiler.is_compiling():
        return torch.arange(batch + 1, device=device, dtype=dtype) * lq
    key = (batch, lq, dtype, device)
    offsets = _ROW_OFFSETS.get(key)
    if offsets is None:
        offsets = torch.arange(batch + 1, device=device, dtype=dtype) * lq
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            if len(_ROW_OFFSETS) >= 16:
                _ROW_OFFSETS.pop(next(iter(_ROW_OFFSETS)))
            _ROW_OFFSETS[key] = offsets
    return offsets


def _finish(q, k, v, q_offsets, kv_offsets, broadcast, max_q_len, max_kv_len, *, causal=False, window=(-1, -1),
            scale=None, activation="softmax", out_scale=1.0, num_targets=None, contextual_len=0, min_full_attn_len=0,
            backend="auto", deterministic=False, page_table=None, page_size=0, rel_bias=None) -> Problem:
    """The checks every call shares, then the Problem."""
    checks.check_window(causal, window)
    left, right = resolve_window(causal, tuple(window))
    num_targets = checks.check_targets(num_targets, contextual_len, causal, window, broadcast, kv_offsets,
                                       min_full_attn_len)
    scale = checks.check_scale(scale, q.shape[2])
    checks.check_activation(activation)
    rows = (kv_offsets.shape[0] - 1) * q.shape[0] if broadcast else q.shape[0]
    values = checks.offsets_values_checked([q_offsets, kv_offsets], max_q_len is not None and max_kv_len is not None)
    out_scale, row_scale = checks.check_out_scale(out_scale, activation, rows, q.device, values)
    if page_table is not None and backend == "hopper" and page_size % 128:
        raise ValueError(f"backend 'hopper' reads pages of a multiple of 128 rows (a key block never crosses a "
                         f"page), got page_size={page_size}")
    tables = bias.check(rel_bias, q, k, broadcast, q_offsets is kv_offsets, scale)
    if tables is not None and backend == "hopper":
        raise ValueError("backend 'hopper' does not compute a relative bias (rel_bias) yet: use 'triton' or 'auto'")
    portable = backend == "auto" and ((page_table is not None and page_size % 128) or tables is not None)
    backend = select(backend, q.device, q.shape[2], q.dtype)
    backend = "triton" if portable and backend == "hopper" else backend  # (hopper's key blocks span no page)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    bias_fields = {} if tables is None else dict(bias_position=tables.position, bias_time=tables.time,
                                                 q_times=tables.q_times, k_times=tables.k_times,
                                                 time_divisor=tables.time_divisor)
    return Problem(q, k, v, q_offsets, kv_offsets, scale, left, right, broadcast=broadcast, activation=activation,
                   out_scale=out_scale, row_scale=row_scale, num_targets=num_targets, contextual_len=contextual_len,
                   min_full_attn_len=min_full_attn_len, **bias_fields, page_table=page_table, page_size=page_size,
                   max_q_len=max_q_len, max_kv_len=max_kv_len, backend=backend, deterministic=deterministic)
