"""Workloads: the suite file, the length recipe, exact pair/FLOP counts, and the inputs every provider shares.

The suite file (default: the packaged ``jfa/workloads.json``) holds ``{"about": ..., "workloads": [...]}``; its
"about" string is the spec of the length recipe, implemented by ``draw_lengths``:

    g = torch.Generator().manual_seed(seed); u = torch.rand(batch, generator=g)   # float32, on the CPU
    uniform: L = max(1, floor(u * max_len))
    skewed:  L = max(1, floor(u**3 * max_len)), then L[0] = max_len
    full:    L = max_len for every sequence
    spike:   L = max(1, floor(u * 64)), then L[0] = max_len (one long history among many short ones)

HSTU's mask (targets [lo, hi]: each sequence's last targets, drawn uniformly with seed + 2 and clamped to its
length; contextual_len) goes with causal self-attention, or cross-attention with q_len (serving: each sequence's
last q_len rows against the whole sequence; lengths raised to q_len). Modes: "self" (q, k, v share the lengths), "cross" (each sequence's min(q_len, L) queries, e.g. target items,
attend its L keys, aligned bottom-right; with q_max_len, query lengths of their own, drawn by the same recipe with
seed + 1), "broadcast" (one dense q of q_len rows for every sequence). activation and out_scale: softmax, or an
activation in its place (jfa.jagged_attention's). rel_bias [P, NB] (self-attention): HSTU's relative attention bias
(jfa.RelativeBias.hstu) with a position table of 2P - 1 entries and a time table of NB + 1, both N(0, 0.5^2) with
seed + 3, learned (their gradients are part of the backward), over timestamps whose gaps are drawn uniformly in
[1, 86400] with seed + 3.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path

import torch

from ..jagged import causal_window, visible_pairs

DISTS = ("uniform", "skewed", "full", "spike")
SPIKE_REST = 64  # dist "spike": the short sequences' bound
MODES = ("self", "cross", "broadcast")


@dataclass(frozen=True)
class Workload:
    """One benchmark case. ``lengths`` (kv lengths, tuple) overrides the recipe when given (``--lengths``)."""
    name: str
    mode: str = "self"
    batch: int = 1
    max_len: int = 1
    dist: str = "uniform"
    seed: int = 1
    heads_q: int = 4
    heads_kv: int = 4
    head_dim: int = 128
    window: tuple = (-1, -1)
    q_len: int = 0
    q_max_len: int = 0
    activation: str = "softmax"
    out_scale: float = 1.0
    targets: tuple | None = None  # HSTU's mask: [lo, hi] targets per sequence, drawn uniformly (seed + 2)
    contextual_len: int = 0
    rel_bias: tuple | None = None  # HSTU's relative attention bias: [P, NB] (see the module doc)
    lengths: tuple | None = field(default=None, repr=False)

    @classmethod
    def from_dict(cls, d: dict) -> "Workload":
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"workload {d.get('name')!r}: unknown keys {sorted(unknown)}")
        lengths = d.get("lengths")
        targets, rel_bias = d.get("targets"), d.get("rel_bias")
        w = cls(**{**d, "window": tuple(d.get("window", (-1, -1))),
                   "lengths": None if lengths is None else tuple(lengths),
                   "targets": None if targets is None else tuple(targets),
                   "rel_bias": None if rel_bias is None else tuple(rel_bias)})
        w.validate()
        return w

    def validate(self):
        if self.mode not in MODES:
            raise ValueError(f"workload {self.name!r}: mode must be one of {MODES}, got {self.mode!r}")
        if self.dist not in DISTS and self.lengths is None:
            raise ValueError(f"workload {self.name!r}: dist must be one of {DISTS}, got {self.dist!r}")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"workload {self.name!r}: heads_q {self.heads_q} not a multiple of {self.heads_kv}")
        if self.targets is not None and (self.mode not in ("self", "cross") or self.q_max_len or self.window[1] != 0):
            raise ValueError(f"workload {self.name!r}: targets need causal self-attention, or cross-attention whose "
                             f"queries are each sequence's last q_len rows (serving), window [W, 0]")
        if self.contextual_len and self.targets is None:
            raise ValueError(f"workload {self.name!r}: contextual_len is HSTU's mask's: give targets too "
                             f"(0,0 for none)")
        from ..variants import SCORE_NAMES
        if self.activation not in SCORE_NAMES:
            raise ValueError(f"workload {self.name!r}: activation must be one of {list(SCORE_NAMES)}")
        if self.mode in ("broadcast", "cross") and self.q_len < 1 and not self.q_max_len:
            raise ValueError(f"workload {self.name!r}: {self.mode} mode needs q_len >= 1")
        if len(self.window) != 2:
            raise ValueError(f"workload {self.name!r}: window must be [left, right]")
        if self.rel_bias is not None and (self.mode != "self" or len(self.rel_bias) != 2 or min(self.rel_bias) < 1):
            raise ValueError(f"workload {self.name!r}: rel_bias is [P, NB] (positive), in self-attention")

    @property
    def broadcast(self) -> bool:
        return self.mode == "broadcast"

    def describe(self) -> str:
        """One line: the batch, the heads, the mask and the score (`jfa bench --list`)."""
        lens = f"{len(self.lengths)} sequences from a file" if self.lengths is not None else \
            f"{self.batch} x {self.dist} up to {self.max_len}"
        queries = {"self": "self", "cross": f"cross, queries up to {self.q_max_len or self.q_len}",
                   "broadcast": f"broadcast q of {self.q_len} rows"}[self.mode]
        left, right = self.window
        mask = "causal" if (left, right) == (-1, 0) else "full" if (left, right) == (-1, -1) else \
            f"window ({left}, {right})"
        parts = [f"{queries}, {lens}", f"H {self.heads_q}/{self.heads_kv}, D {self.head_dim}", mask]
        if self.activation != "softmax":
            parts.append(self.activation + (f" (out scale {self.out_scale:g})" if self.out_scale != 1.0 else ""))
        if self.targets is not None:
            parts.append(f"HSTU targets {self.targets[0]}-{self.targets[1]} a sequence"
                         + (f", context {self.contextual_len}" if self.contextual_len else ""))
        if self.rel_bias is not None:
            parts.append(f"relative bias ({self.rel_bias[0]} positions, {self.rel_bias[1]} time buckets)")
        return "; ".join(parts)

    def spec(self) -> dict:
        """The workload as the suite file writes it (what results.json records)."""
        d = asdict(self)
        d["window"] = list(self.window)
        if d["lengths"] is None:
            del d["lengths"]
        else:
            d["lengths"] = list(d["lengths"])
        if self.mode == "self":
            del d["q_len"]
        for name, default in (("q_max_len", 0), ("activation", "softmax"), ("out_scale", 1.0), ("targets", None),
                              ("contextual_len", 0), ("rel_bias", None)):
            if d[name] == default:
                del d[name]
        for name in ("targets", "rel_bias"):
            if getattr(self, name) is not None:
                d[name] = list(getattr(self, name))
        return d


def load_suite(path=None) -> tuple[str, list[Workload]]:
    """(about, workloads) of a suite file; the packaged jfa/workloads.json when path is None."""
    if path is None:
        text = resources.files("jfa").joinpath("workloads.json").read_text()
    else:
        text = Path(path).read_text()
    data = json.loads(text)
    workloads = [Workload.from_dict(d) for d in data["workloads"]]
    names = [w.name for w in workloads]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate workload names in the suite: {names}")
    return data.get("about", ""), workloads


def select(workloads: list[Workload], only: str | None) -> list[Workload]:
    """The workloads named in a comma-separated list (in the suite's order), or all of them."""
    if not only:
        return workloads
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    missing = [n for n in wanted if n not in {w.name for w in workloads}]
    if missing:
        raise ValueError(f"--only: no workload named {', '.join(missing)}; the suite has "
                         f"{', '.join(w.name for w in workloads)} (jfa bench --list describes them)")
    return [w for w in workloads if w.name in wanted]


def draw_lengths(batch: int, max_len: int, dist: str, seed: int) -> torch.Tensor:
    """The suite's length recipe (see module doc): int64 ``[batch]`` on the CPU."""
    if dist == "full":
        return torch.full((batch,), max_len, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(batch, generator=g)
    if dist == "uniform":
        x = u * max_len
    elif dist == "spike":
        x = u * SPIKE_REST
    elif dist == "skewed":
        x = u ** 3 * max_len
    else:
        raise ValueError(f"unknown dist {dist!r}; expected one of {DISTS}")
    lens = torch.clamp(torch.floor(x).to(torch.int64), min=1)
    if dist in ("skewed", "spike") and batch > 0:
        lens[0] = max_len
    return lens


def kv_lengths(w: Workload) -> torch.Tensor:
    """The kv lengths (int64 [B]): the file's, or the recipe's; with a contextual prefix at least its length (every
    history holds its context rows; jfa refuses a shorter sequence where it checks the offsets); serving (cross with
    targets) at least q_len (every user's request has its q_len new rows, as HSTU's cached attention takes them)."""
    lens = torch.tensor(w.lengths, dtype=torch.int64) if w.lengths is not None else \
        draw_lengths(w.batch, w.max_len, w.dist, w.seed)
    least = max(w.contextual_len, w.q_len if w.mode == "cross" and w.targets is not None else 0)
    return torch.clamp(lens, min=least) if least else lens


def q_lengths(w: Workload, kv_lens: torch.Tensor) -> torch.Tensor:
    if w.broadcast:
        return torch.full_like(kv_lens, w.q_len)
    if w.mode == "cross" and w.q_max_len:
        return draw_lengths(w.batch, w.q_max_len, w.dist, w.seed + 1)
    return torch.clamp(kv_lens, max=w.q_len) if w.mode == "cross" else kv_lens


def read_lengths_file(path) -> list[int]:
    """Lengths from a text file (one per line; blank lines and # comments skipped), a .npy or a .pt file."""
    path = Path(path)
    if path.suffix == ".npy":
        import numpy as np
        values = np.load(path).reshape(-1).tolist()
    elif path.suffix in (".pt", ".pth"):
        values = torch.as_tensor(torch.load(path, map_location="cpu")).reshape(-1).tolist()
    else:
        values = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
        values = [v for v in values if v]
    lens = [int(v) for v in values]
    if not lens or min(lens) < 0:
        raise ValueError(f"{path}: need one or more non-negative lengths")
    return lens


def workload_from_lengths(path, *, heads_q=4, heads_kv=None, head_dim=128, mode="self", q_len=64,
                          window=(-1, -1), causal=False, activation="softmax", out_scale=1.0, targets=None,
                          contextual_len=0) -> Workload:
    """A workload over the kv lengths in a file (`jfa bench --lengths`), with the suite's options: the mode, the
    mask (targets = (lo, hi): HSTU's target counts drawn per sequence, as the suite's), the score function."""
    lens = read_lengths_file(path)
    left, right = causal_window(causal, tuple(window))
    w = Workload(name=Path(path).stem, mode=mode, batch=len(lens), max_len=max(lens), dist="file", seed=0,
                 heads_q=heads_q, heads_kv=heads_kv or heads_q, head_dim=head_dim, window=(left, right),
                 q_len=q_len if mode != "self" else 0, lengths=tuple(lens), activation=activation,
                 out_scale=out_scale, targets=None if targets is None else tuple(targets),
                 contextual_len=contextual_len)
    w.validate()
    return w


def scale_down(w: Workload, batch_div: int = 256, len_div: int = 64, heads_div: int = 4, min_batch: int = 2,
               min_len: int = 16) -> Workload:
    """A small version of a workload for the CPU smoke run (same kind of problem, seconds of work): batch,
    lengths, window and kv heads divided (the GQA group and the head dim are kept)."""
    def shrink(x, div, lo):
        return max(lo, x // div) if x > 0 else x
    window = tuple(x if x < 0 else max(1, x // len_div) if x > 0 else 0 for x in w.window)
    lengths = None
    if w.lengths is not None:
        lengths = tuple(max(1, x // len_div) for x in w.lengths[:max(min_batch, len(w.lengths) // batch_div)])
    group = w.heads_q // w.heads_kv
    heads_kv = max(1, w.heads_kv // heads_div)
    return replace(w, batch=shrink(w.batch, batch_div, min_batch), max_len=shrink(w.max_len, len_div, min_len),
                   q_len=shrink(w.q_len, len_div // 4 or 1, 4), q_max_len=shrink(w.q_max_len, len_div, 4),
                   window=window, lengths=lengths,
                   heads_kv=heads_kv, heads_q=heads_kv * group)


def num_targets(w: Workload, kv_lens: torch.Tensor) -> torch.Tensor | None:
    """HSTU's target counts per sequence (int64 [B], on the CPU), or None."""
    if w.targets is None:
        return None
    g = torch.Generator().manual_seed(w.seed + 2)
    lo, hi = w.targets
    return torch.minimum(torch.randint(lo, hi + 1, (kv_lens.numel(), ), generator=g), kv_lens)


def pairs(w: Workload, kv_lens: torch.Tensor | None = None) -> int:
    """Exact number of visible (query, key) pairs of the workload."""
    kv_lens = kv_lengths(w) if kv_lens is None else kv_lens
    targets = None if w.targets is None else (num_targets(w, kv_lens), w.contextual_len)
    return visible_pairs(q_lengths(w, kv_lens), kv_lens, *w.window, targets=targets)


def flops(w: Workload, kv_lens: torch.Tensor | None = None) -> tuple[float, float]:
    """(forward, backward) FLOPs: 4 * Hq * D * pairs, and 2.5x that."""
    fwd = 4.0 * w.heads_q * w.head_dim * pairs(w, kv_lens)
    return fwd, 2.5 * fwd


def bytes_moved(w: Workload, kv_lens: torch.Tensor | None = None, elt: int = 2) -> tuple[float, float]:
    """(forward, backward) bytes that must cross device memory at least once: forward reads q, k, v and writes
    o and the float32 lse; backward reads q, k, v, o, dO, lse and writes dq, dk, dv. Broadcast q (and its dq)
    counts once; elt = bytes per element of q, k, v."""
    kv_lens = kv_lengths(w) if kv_lens is None else kv_lens
    rows = int(q_lengths(w, kv_lens).sum())  # output rows
    q_rows = w.q_len if w.broadcast else rows
    q = q_rows * w.heads_q * w.head_dim * elt
    kv = int(kv_lens.sum()) * w.heads_kv * w.head_dim * elt
    o = rows * w.heads_q * w.head_dim * elt
    lse = rows * w.heads_q * 4
    return float(q + 2 * kv + o + lse), float(2 * q + 4 * kv + 2 * o + lse)


@dataclass
class Inputs:
    """What every provider gets: packed leaf tensors (requires_grad), offsets, lengths, the upstream grad."""
    workload: Workload
    q: torch.Tensor           # [Tq, Hq, D] packed, or [Lq, Hq, D] dense in broadcast mode
    k: torch.Tensor           # [Tk, Hkv, D]
    v: torch.Tensor           # [Tk, Hkv, D]
    q_offsets: torch.Tensor   # [B+1] int32 rows of the output (b * Lq in broadcast mode)
    kv_offsets: torch.Tensor  # [B+1] int32
    q_lens: torch.Tensor      # [B] int64, CPU
    kv_lens: torch.Tensor     # [B] int64, CPU
    dout: torch.Tensor        # [rows, Hq, D]: the upstream gradient of the output in packed row order
    num_targets: torch.Tensor | None = None  # [B] int32 on the device: HSTU's mask
    tables: tuple = ()  # HSTU's relative bias: (position, time) float32 leaves (requires_grad), and
    timestamps: torch.Tensor | None = None  # the rows' times, int64 [Tq] on the device

    @property
    def batch(self) -> int:
        return self.kv_lens.numel()

    @property
    def max_q(self) -> int:
        return int(self.q_lens.max()) if self.batch else 0

    @property
    def max_kv(self) -> int:
        return int(self.kv_lens.max()) if self.batch else 0

    @property
    def window(self) -> tuple[int, int]:
        return tuple(self.workload.window)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.workload.head_dim)

    def leaves(self):
        """What the backward differentiates: q, k, v and the bias tables."""
        return [self.q, self.k, self.v, *self.tables]

    def rel_bias(self, tables=None):
        """The workload's jfa.RelativeBias (HSTU's) over these tables (the inputs' by default), or None."""
        if not self.tables:
            return None
        from ..bias import RelativeBias
        return RelativeBias.hstu(*(tables or self.tables), self.timestamps, self.q_offsets)

    def score(self) -> dict:
        """The public functions' mask and score arguments for this workload."""
        w = self.workload
        opts = dict(window=self.window, activation=w.activation, out_scale=w.out_scale)
        if self.num_targets is not None:
            opts.update(num_targets=self.num_targets, contextual_len=w.contextual_len, causal=True)
        if self.tables:
            opts.update(rel_bias=self.rel_bias())
        return opts

    def problem(self, backend: str = "auto", **fields):
        """The jfa.problem.Problem of the jfa provider's call on these inputs (detached leaves, both max lengths
        given), with `fields` replaced: what benchmarks/ hand to a backend's parts."""
        from ..api import problem
        q, k, v = (t.detach() for t in self.leaves()[:3])
        if self.workload.broadcast:
            p = problem(q, k, v, self.kv_offsets, broadcast=True, max_kv_len=self.max_kv, backend=backend,
                        **self.score())
        else:
            kv_offsets = None if self.kv_offsets is self.q_offsets else self.kv_offsets
            p = problem(q, k, v, self.q_offsets, kv_offsets, max_q_len=self.max_q, max_kv_len=self.max_kv,
                        backend=backend, **self.score())
        return p.replace(**fields) if fields else p

    def prefix(self, n: int, heads: int | None = None) -> "Inputs":
        """The first n sequences and the first `heads` query heads (whole GQA groups; default all), a copy of the same
        data as new leaves: the correctness gate's subset."""
        qo, ko = int(self.q_offsets[n]), int(self.kv_offsets[n])
        hq = self.q.shape[1] if heads is None else heads
        hk = hq * self.k.shape[1] // self.q.shape[1]
        q = (self.q if self.workload.broadcast else self.q[:qo])[:, :hq]
        leaf = lambda t: t.detach().clone().requires_grad_(True)  # noqa: E731
        q_offsets = self.q_offsets[:n + 1]
        kv_offsets = q_offsets if self.kv_offsets is self.q_offsets else self.kv_offsets[:n + 1]
        return Inputs(self.workload, leaf(q), leaf(self.k[:ko, :hk]), leaf(self.v[:ko, :hk]), q_offsets, kv_offsets,
                      self.q_lens[:n], self.kv_lens[:n], self.dout[:qo, :hq],
                      None if self.num_targets is None else self.num_targets[:n], tuple(leaf(t) for t in self.tables),
                      None if self.timestamps is None else self.timestamps[:qo])


def offsets_of(lens: torch.Tensor, device) -> torch.Tensor:
    off = torch.zeros(lens.numel() + 1, dtype=torch.int64)
    off[1:] = torch.cumsum(lens, 0)
    return off.to(device=device, dtype=torch.int32)


def make_inputs(w: Workload, device="cuda", dtype=torch.bfloat16, seed: int = 0) -> Inputs:
    """Random q, k, v (N(0, 1)) and upstream gradient for a workload, on the device."""
    kv_lens = kv_lengths(w)
    q_lens = q_lengths(w, kv_lens)
    g = torch.Generator(device=device).manual_seed(seed)
    tq = w.q_len if w.broadcast else int(q_lens.sum())
    rows = int(q_lens.sum())
    tk = int(kv_lens.sum())

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    q = randn(tq, w.heads_q, w.head_dim).requires_grad_(True)
    k = randn(tk, w.heads_kv, w.head_dim).requires_grad_(True)
    v = randn(tk, w.heads_kv, w.head_dim).requires_grad_(True)
    dout = randn(rows, w.heads_q, w.head_dim)
    q_offsets = offsets_of(q_lens, device)
    # self-attention: one offsets tensor for both sides, as its callers pass it (jfa: kv_offsets=None; the
    # FlashAttention peers: the same cu_seqlens twice)
    kv_offsets = q_offsets if w.mode == "self" else offsets_of(kv_lens, device)
    targets = num_targets(w, kv_lens)
    targets = None if targets is None else targets.to(device=device, dtype=torch.int32)
    tables, timestamps = (), None
    if w.rel_bias is not None:  # (see the module doc)
        gb = torch.Generator().manual_seed(w.seed + 3)
        (p, nb), rows = w.rel_bias, int(q_lens.sum())
        tables = tuple((torch.randn(n, generator=gb) * 0.5).to(device).requires_grad_(True) for n in (2 * p - 1, nb + 1))
        timestamps = torch.cumsum(torch.randint(1, 86401, (rows, ), generator=gb), 0).to(device)
    return Inputs(w, q, k, v, q_offsets, kv_offsets, q_lens, kv_lens, dout, targets, tables, timestamps)
