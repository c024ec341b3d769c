"""The jagged tile geometry, written once: which keys a query tile sees, which queries a key tile is seen by, how
many blocks an item walks, which blocks need no mask, and the mask itself. Plain ``@triton.jit`` helpers, called
by the schedule kernel (jfa.schedule), the portable Triton kernels (jfa.triton.kernels) and the Gluon kernels
(jfa.hopper); the spec they implement is jfa.jagged's visibility rule, and tests/test_schedule.py checks them
against it. Together with jfa.variants (what a visible pair contributes) this is the seam a new attention variant
changes (docs/hopper.md, "Adding an attention variant"). HSTU's mask's own helpers are jfa.targets, which the
dispatchers here call for rule.KIND == TARGETS; the ones that compose it with the window's (a history tile's causal
window) are here.

Two tuples carry what the mask needs, so that a mask with more parameters changes where they are made (mask_rule,
sequence), not the kernels that pass them through:
  mask        the kernels' mask group, as the launchers pass it (mask_group, from jfa.problem.Problem.mask_args): the
              per-sequence tensor (HSTU's target counts, or None), the scalars (left, right, contextual_len), then
              LAST_ROWS, a constexpr, then HSTU's min_full_attn_len F (a constexpr 0 where it is 0) and FULL (F > 0,
              a constexpr)
  rule        the mask's parameters (mask_rule, once per kernel): a Rule, its kind named (rule.KIND, a constexpr
              that survives returns, which a tuple's elements do not) and its parameters (rule.p):
              WINDOW, (LEFT, RIGHT): key j is visible to query i when i' - LEFT <= j <= i' + RIGHT, i' = i + shift;
                unbounded sides arrive as jfa.jagged.UNBOUNDED (2**30), so no branch is needed;
              TARGETS, (W, RIGHT, c, num_targets, F): HSTU's mask (jfa.jagged.target_mask: causal), the window
                over positions, the contextual prefix's length, the target counts, the rows from position U - F on
                seeing the whole history (rule.FULL: F > 0, a constexpr); its rows are the sequence's keys, and
                with rule.LAST_ROWS (cross-attention: serving, HSTU's cached attention) the queries are the last Lq
                of them, query i at row i + shift (bottom-right); without it (self-attention) shift is a constant 0,
                so that self-attention's kernels compile as if no shift existed (jfa.targets.rows)
  seq         one sequence's values (sequence): its lengths (Lq, Lk), and with TARGETS its targets (Lq, Lk, T)

Glossary (all kernels):
  Lq, Lk      lengths of the current sequence's queries and keys (q_len, kv_len)
  shift       Lk - Lq: query i sits at key position i' = i + shift (bottom-right alignment)
  BLOCK_M     query rows per tile, BLOCK_N key rows per tile
  walk        the blocks of the other side an item visits: [lo, hi) in steps of its block, block_count of them
              (the producer loads them, the consumers compute them, the dQ writer drains them, the schedule costs
              them: all from key_range / query_range and block_count)
  full block  a block in which every (real query, real key) pair is visible: it needs no mask; the blocks at
              the edges of the visible band do (loop peeling)

Transposition: the queries that see the keys [n0, n0 + BLOCK_N) are the keys that rows [n0, n0 + BLOCK_N) of
the mirrored problem see (queries and keys swapped, LEFT and RIGHT swapped: mirror): query_range and query_blocks
are key_range and key_blocks called that way, and the backward's schedule is built the same way.
"""
import triton
import triton.language as tl
from triton.language.core import _aggregate as aggregate  # (no public name in triton 3.6)

from . import targets

WINDOW = tl.constexpr(0)  # the rule kinds (Rule.KIND)
TARGETS = tl.constexpr(1)


@aggregate
class Rule:
    """A mask's rule: its kind and its parameters (see the module doc). An aggregate, so that the kind stays a
    compile-time constant wherever the rule goes (a tuple's constexprs become tensors when assigned or returned)."""
    KIND: tl.constexpr
    p: (tl.tuple, tuple)  # (a plain tuple in Triton's interpreter)
    LAST_ROWS: tl.constexpr  # TARGETS: the queries are each sequence's last rows (see the module doc)
    FULL: tl.constexpr  # TARGETS: rows past the window's reach (F > 0); without, the kernels compile as before it

    @triton.constexpr_function
    def __init__(self, KIND, p, LAST_ROWS=False, FULL=False):
        self.KIND = tl.constexpr(KIND)
        self.LAST_ROWS = tl.constexpr(bool(LAST_ROWS))
        self.FULL = tl.constexpr(bool(FULL))
        # (a scalar equal to 1 arrives as a constexpr, unwrapped to an int here: an aggregate's tuple holds Triton
        # values, so it is wrapped again; the interpreter's plain tuple holds anything)
        self.p = p if isinstance(p, tuple) else tl.tuple([tl.constexpr(x) if isinstance(x, int) else x for x in p])


def mask_group(num_targets, scalars, last_rows: bool, fold_right: bool = False) -> tuple:
    """A kernel's mask group (see the module doc): what the launchers pass, mask_rule reads. scalars: (left, right,
    contextual_len[, min_full_attn_len]); F = 0 passes as a constexpr, so that the kernels compile without it.
    fold_right: HSTU's right side, always 0 (its mask is causal: jfa.checks.check_targets), as a constexpr too: the
    Hopper forward's (as a value it held right - (BLOCK_N - 1) across its items, spilled, and reloaded it from local
    memory at each item's start); folded in the backward's kernels, ptxas spilled more (one pass 768 -> 900 B)."""
    full = scalars[3] if len(scalars) > 3 else 0
    left, right, context = scalars[:3]
    if fold_right and num_targets is not None and right == 0:
        right = _ZERO
    return (num_targets, left, right, context, _BOOLS[bool(last_rows)], full if full > 0 else _ZERO, _BOOLS[full > 0])


# mask_group's constexprs, made once (three built per launch were 0.9 of its 1.1 us a launch)
_BOOLS, _ZERO = (tl.constexpr(False), tl.constexpr(True)), tl.constexpr(0)


@triton.jit
def mask_rule(mask):
    """The rule of a kernel's mask group (see the module doc): a window, or HSTU's mask where target counts are
    given (a scalar equal to 1 may arrive as a constexpr: Triton specializes it)."""
    if mask[0] is None:
        return Rule(WINDOW, (mask[1], mask[2]))
    else:
        return Rule(TARGETS, (mask[1], mask[2], mask[3], mask[0], mask[5]), mask[4], mask[6])



@triton.jit
def sequence_bounds(q_offsets, kv_offsets, seq):
    """(q_start, kv_start, (q_len, kv_len)) of sequence `seq` (int32: TMA coordinates are 32-bit)."""
    q_start = tl.load(q_offsets + seq).to(tl.int32)
    q_len = tl.load(q_offsets + seq + 1).to(tl.int32) - q_start
    kv_start = tl.load(kv_offsets + seq).to(tl.int32)
    kv_len = tl.load(kv_offsets + seq + 1).to(tl.int32) - kv_start
    return q_start, kv_start, (q_len, kv_len)


@triton.jit
def sequence(seq_id, lens, rule):
    """Sequence seq_id's seq as the helpers below take it: its lengths, and with TARGETS its target count."""
    if rule.KIND == TARGETS:
        return (lens[0], lens[1], tl.load(rule.p[3] + seq_id).to(tl.int32))
    else:
        return lens


@triton.jit
def mirror(seq, rule):
    """The transposed problem's (seq, rule) of a window: keys as rows."""
    return (seq[1], seq[0]), Rule(WINDOW, (rule.p[1], rule.p[0]))


@triton.jit
def _causal_window(seq, rule):
    """HSTU's mask's window on positions as a WINDOW rule of the sequence (where the two agree)."""
    n, shift = targets.rows(seq, rule)
    return (n - shift, n), Rule(WINDOW, (rule.p[0], rule.p[1]))


@triton.jit
def key_range(m0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys [lo, hi) seen by queries [m0, m0 + BLOCK_M), lo aligned down to BLOCK_N (scalars or vectors).
    The range is empty (hi <= lo) when no real query of the tile sees a key."""
    if rule.KIND == TARGETS:
        return targets.key_range(m0, seq, rule, BLOCK_M, BLOCK_N)
    q_len, kv_len = seq[0], seq[1]
    shift = kv_len - q_len
    m_last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    lo = (tl.maximum(m0 + shift - rule.p[0], 0) // BLOCK_N) * BLOCK_N
    hi = tl.minimum(m_last + shift + rule.p[1] + 1, kv_len)
    return lo, hi


@triton.jit
def block_count(lo, hi, BLOCK: tl.constexpr):
    """Blocks of a walk over [lo, hi) (0 when empty)."""
    return tl.maximum(tl.cdiv(hi - lo, BLOCK), 0)


@triton.jit
def full_blocks(m0, lo, n_blocks, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Of the key blocks [lo + j BLOCK_N, lo + (j + 1) BLOCK_N), j < n_blocks, that queries [m0, m0 + BLOCK_M)
    see, the ones [j_lo, j_hi) that need no mask: their keys exist and every real query row sees all of them.

    (This index form, with its non-negative divisions, is what the dK/dV consumers loop over: computed as
    block positions it cost the D=128 kernel 120-210 B more spills, some inside its dK MMA; perf-notes.)"""
    if rule.KIND == TARGETS:  # HSTU's mask: the window's full blocks where it agrees (rows in the history, keys past c)
        return targets.full_blocks(m0, lo, n_blocks, seq, rule, BLOCK_M, BLOCK_N)
    q_len, kv_len = seq[0], seq[1]
    shift = kv_len - q_len
    m_last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    # the block's last key exists and the first row sees it: n0 + BLOCK_N - 1 <= min(kv_len - 1, m0 + shift + RIGHT)
    top = tl.minimum(kv_len - BLOCK_N, m0 + shift + rule.p[1] - BLOCK_N + 1) - lo
    j_hi = tl.where(top >= 0, top // BLOCK_N + 1, 0)
    # the last real row sees the block's first key: n0 >= m_last + shift - LEFT
    bottom = m_last + shift - rule.p[0] - lo
    j_lo = tl.minimum(tl.where(bottom > 0, (bottom + BLOCK_N - 1) // BLOCK_N, 0), n_blocks)
    return j_lo, tl.maximum(tl.minimum(j_hi, n_blocks), j_lo)


@triton.jit
def _target_full_query_blocks(n0, lo, n_blocks, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """jfa.targets.full_blocks transposed: history keys (context keys too), the window's full query blocks of rows from
    c on, and with a bounded window only those below the targets (whose window starts at the history's end: query
    row h - shift)."""
    n, shift = targets.rows(seq, rule)
    c = rule.p[2]
    h = n - seq[2]
    k_last = tl.minimum(n0 + BLOCK_N, n) - 1
    seq_w, rule_w = _causal_window(seq, rule)
    seq_t, rule_t = mirror(seq_w, rule_w)
    j_lo, j_hi = full_blocks(n0, lo, n_blocks, seq_t, rule_t, BLOCK_N, BLOCK_M)
    j_hi = tl.where(rule.p[0] < 1 << 30, tl.minimum(j_hi, tl.maximum(h - shift - lo, 0) // BLOCK_M), j_hi)
    j_lo = tl.maximum(j_lo, tl.where(c - shift > lo, tl.cdiv(c - shift - lo, BLOCK_M), 0))  # no context row
    plain = k_last < h
    j_lo = tl.where(plain, tl.minimum(j_lo, n_blocks), 0)
    return j_lo, tl.where(plain, tl.maximum(j_hi, j_lo), 0)


@triton.jit
def key_blocks(m0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key ranges seen by queries [m0, m0 + BLOCK_M): (lo, full_lo, full_hi, hi).

    Blocks start at lo (a multiple of BLOCK_N). [lo, full_lo) and [full_hi, hi) need the mask; [full_lo,
    full_hi) holds whole blocks visible to every real query row of the tile (none when they are equal).
    """
    lo, hi = key_range(m0, seq, rule, BLOCK_M, BLOCK_N)
    n_blocks = block_count(lo, hi, BLOCK_N)
    j_lo, j_hi = full_blocks(m0, lo, n_blocks, seq, rule, BLOCK_M, BLOCK_N)
    return lo, lo + j_lo * BLOCK_N, lo + j_hi * BLOCK_N, hi


@triton.jit
def window_visible(i, j, seq, rule):
    """HSTU's mask where window_keys says it is the causal window's: key rows j that exist, in query rows i's window."""
    seq_w, rule_w = _causal_window(seq, rule)
    return in_window(i, j, seq_w, rule_w) & (j < seq_w[1])


@triton.jit
def query_range(n0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Queries [lo, hi) that see keys [n0, n0 + BLOCK_N), lo aligned down to BLOCK_M (see Transposition); with
    HSTU's mask, the range after query_prefix's."""
    if rule.KIND == TARGETS:
        _, lo, hi = targets.query_ranges(n0, seq, rule, BLOCK_M, BLOCK_N)
        return lo, hi
    seq_t, rule_t = mirror(seq, rule)
    return key_range(n0, seq_t, rule_t, BLOCK_N, BLOCK_M)


@triton.jit
def query_prefix(n0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The end of the rows [0, end) that see keys [n0, n0 + BLOCK_N) before query_range's range (a multiple of
    BLOCK_M, 0 for none): with HSTU's mask, a key tile's context prefix (a key tile's walk is both); a window has
    none (a constant 0)."""
    if rule.KIND == TARGETS:
        pre, _, _ = targets.query_ranges(n0, seq, rule, BLOCK_M, BLOCK_N)
        return pre
    else:
        return 0


@triton.constexpr_function
def has_prefix(kind, key_tiles):
    """Whether a tile's walk may start with a prefix (query_prefix) under a rule of this kind (Rule.KIND): key tiles
    under HSTU's mask."""
    return bool(key_tiles) and kind == TARGETS.value


@triton.constexpr_function
def target_tests(kind, full):
    """Whether a kernel may mask a block by HSTU's cheaper tests (jfa.targets.context_keys, window_keys): under HSTU's
    mask, but not with rows past the window's reach (rule.FULL: with them there, the D=128 forward spilled 436-936
    B)."""
    return kind == TARGETS.value and not full


@triton.jit
def tail_seen(k0, m_tail, seq, rule, BLOCK_N: tl.constexpr):
    """Whether every real query row from m_tail on sees every key of [k0, k0 + BLOCK_N), all of them real: a key
    tile's walk past its mask-free blocks whose mask is only the rows' (the sequence's last, partial, block)."""
    if rule.KIND == TARGETS:
        return targets.tail_seen(k0, m_tail, seq, rule, BLOCK_N)
    shift = seq[1] - seq[0]
    return (k0 + BLOCK_N <= seq[1]) & (k0 + BLOCK_N - 1 <= m_tail + shift + rule.p[1]) & \
        (k0 >= seq[0] - 1 + shift - rule.p[0])


@triton.jit
def right_edge(i, j, seq, rule):
    """Query rows i [M, 1] within the right edge of their window for key rows j [1, N], one comparison a pair against
    a bound a row (where edge_in_keys or the block's keys say it is the mask, past the rows' left edge). The window's
    rule only (rule.KIND == WINDOW): HSTU's rule reads rule.p otherwise, and its targets and full rows are no edge."""
    return j <= i + (seq[1] - seq[0]) + rule.p[1]


@triton.jit
def edge_in_keys(m0, seq, rule, BLOCK_M: tl.constexpr):
    """Whether the right edge of every real query row of [m0, m0 + BLOCK_M) stays inside the keys (causal self
    attention's does): past its left edge (a key block from full_blocks' first on), such a tile's mask is right_edge
    alone, key blocks that run past the sequence's end included. The window's rule only, as right_edge."""
    return tl.minimum(m0 + BLOCK_M, seq[0]) - 1 + (seq[1] - seq[0]) + rule.p[1] < seq[1]


@triton.jit
def right_edge_alone(n0, full_lo, in_keys, seq, BLOCK_N: tl.constexpr):
    """Whether key block n0's mask for a query tile is right_edge alone: past the rows' left edge (full_lo, the
    tile's first mask-free block, on) with their right edge inside the keys (in_keys: edge_in_keys) or every key of
    the block real. The window's rule only, as right_edge."""
    return (n0 >= full_lo) & (in_keys | (n0 + BLOCK_N <= seq[1]))


@triton.jit
def tile_walk(start, seq, rule, BLOCK: tl.constexpr, OTHER_BLOCK: tl.constexpr, KEY_TILES: tl.constexpr):
    """The walk of the tile of BLOCK rows at `start`, every kernel's and the schedule's: (pre, lo, hi), the other
    side's rows [0, pre) first (query_prefix: 0, a constant, unless has_prefix), then [lo, hi) (lo aligned down
    to OTHER_BLOCK). Query tiles walk the keys they see (key_range), key tiles the queries that see them
    (query_range)."""
    if KEY_TILES:
        lo, hi = query_range(start, seq, rule, OTHER_BLOCK, BLOCK)
        pre = query_prefix(start, seq, rule, OTHER_BLOCK, BLOCK)
    else:
        lo, hi = key_range(start, seq, rule, BLOCK, OTHER_BLOCK)
        pre = 0
    return pre, lo, hi


@triton.jit
def query_blocks(n0, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query ranges that see keys [n0, n0 + BLOCK_N): (lo, full_lo, full_hi, hi), as key_blocks: a full
    block's rows all exist and see every real key of the tile (with HSTU's mask, after query_prefix's blocks)."""
    if rule.KIND == TARGETS:
        lo, hi = query_range(n0, seq, rule, BLOCK_M, BLOCK_N)
        n_blocks = block_count(lo, hi, BLOCK_M)
        j_lo, j_hi = full_query_blocks(n0, lo, n_blocks, seq, rule, BLOCK_M, BLOCK_N)
        return lo, lo + j_lo * BLOCK_M, lo + j_hi * BLOCK_M, hi
    seq_t, rule_t = mirror(seq, rule)
    return key_blocks(n0, seq_t, rule_t, BLOCK_N, BLOCK_M)


@triton.jit
def full_query_blocks(n0, lo, n_blocks, seq, rule, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """full_blocks transposed: of the query blocks [lo + j BLOCK_M, ...), j < n_blocks, that see keys [n0, n0 +
    BLOCK_N), the ones [j_lo, j_hi) that need no mask."""
    if rule.KIND == TARGETS:
        return _target_full_query_blocks(n0, lo, n_blocks, seq, rule, BLOCK_M, BLOCK_N)
    seq_t, rule_t = mirror(seq, rule)
    return full_blocks(n0, lo, n_blocks, seq_t, rule_t, BLOCK_N, BLOCK_M)


@triton.jit
def in_window(i, j, seq, rule):
    """Whether key rows j lie in the window of query rows i (broadcastable, e.g. [M, 1] and [1, N])."""
    i_shifted = i + (seq[1] - seq[0])
    return (j >= i_shifted - rule.p[0]) & (j <= i_shifted + rule.p[1])


@triton.jit
def _rule(i, j, seq, rule, KEY_MAJOR: tl.constexpr):
    if rule.KIND == TARGETS:
        return targets.visible(i, j, seq, rule)
    if KEY_MAJOR:
        seq_t, rule_t = mirror(seq, rule)
        return in_window(j, i, seq_t, rule_t)
    else:
        return in_window(i, j, seq, rule)


@triton.jit
def visible(i, j, seq, rule, QUERIES: tl.constexpr = True, KEYS: tl.constexpr = True,
            KEY_MAJOR: tl.constexpr = False):
    """The mask of visible pairs, every kernel's one element test: query rows i and key rows j (broadcastable, e.g.
    [M, 1] and [1, N], or [1, M] and [N, 1] for a tile held keys first) inside the rule, and with QUERIES / KEYS,
    real rows of the sequence (a kernel that never stores rows past a sequence's end, or whose values there never
    reach what it stores, leaves that side untested). KEY_MAJOR evaluates the rule on the mirrored problem (the
    same pairs), as the dK/dV kernels hold their tiles: their register allocation moved with the form of this
    arithmetic (docs/hopper.md, pitfalls)."""
    if KEY_MAJOR:  # the key rows' window and existence, then the query columns'
        vis = _rule(i, j, seq, rule, True)
        if KEYS:
            vis = vis & (j < seq[1])
        if QUERIES:
            vis = (i < seq[0]) & vis
        return vis
    if QUERIES:
        if KEYS:
            return (i < seq[0]) & (j < seq[1]) & _rule(i, j, seq, rule, KEY_MAJOR)
        else:
            return (i < seq[0]) & _rule(i, j, seq, rule, KEY_MAJOR)
    else:
        if KEYS:
            return (j < seq[1]) & _rule(i, j, seq, rule, KEY_MAJOR)
        else:
            return _rule(i, j, seq, rule, KEY_MAJOR)
