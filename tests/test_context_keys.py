"""jfa.geometry's cheaper tests of HSTU's mask, against jfa.jagged.target_mask on test_schedule's HSTU cases (in
Triton's interpreter): context_keys and context_rows (the key blocks a query tile sees from its context rows alone
are seen by exactly those rows), window_keys and window_visible (where the mask is the causal window's)."""
import pytest
import torch
import triton
import triton.language as tl

from jfa.testing import offsets_of
from test_schedule import FULL_ROWS, TARGET_CASES, _target_case


@triton.jit
def _context_kernel(q_offsets, kv_offsets, num_targets, OUT, ROWS, context, window, full, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, TILES: tl.constexpr, LAST_ROWS: tl.constexpr, FULL: tl.constexpr):
    """Per sequence and query tile: context_keys' (lo, hi) and window_keys, and context_rows of the tile's rows."""
    from jfa.geometry import mask_rule, sequence, sequence_bounds
    from jfa.targets import context_keys, context_rows, window_keys
    b = tl.program_id(0)
    t = tl.program_id(1)
    _, _, lens = sequence_bounds(q_offsets, kv_offsets, b)
    rule = mask_rule((num_targets, window, 0, context, LAST_ROWS, full, FULL))
    seq = sequence(b, lens, rule)
    lo, hi = context_keys(t * BLOCK_M, seq, rule, BLOCK_M, BLOCK_N)
    tl.store(OUT + (b * TILES + t) * 3, lo)
    tl.store(OUT + (b * TILES + t) * 3 + 1, hi)
    tl.store(OUT + (b * TILES + t) * 3 + 2, window_keys(t * BLOCK_M, seq, rule, BLOCK_M, BLOCK_N))
    rows = t * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(ROWS + (b * TILES + t) * BLOCK_M + tl.arange(0, BLOCK_M), context_rows(rows, seq, rule).to(tl.int32))


def _run(name, block_m, block_n):
    """_context_kernel over TARGET_CASES[name] -> (out [B, tiles, 3], rows [B, tiles, block_m], and per sequence
    (its query and key counts, the reference mask [Lq, Lk]), the window, the FULL rows' F, whether serving)."""
    from jfa.jagged import UNBOUNDED, visible_mask
    lens, q_lens, targets, context, window = _target_case(name)
    full = FULL_ROWS.get(name, 0)
    tiles = max(-(-n // block_m) for n in q_lens) + 1
    out = torch.full((len(lens), tiles, 3), -7, dtype=torch.int32)
    rows = torch.full((len(lens), tiles, block_m), -7, dtype=torch.int32)
    w = UNBOUNDED if window < 0 else window
    _context_kernel[(len(lens), tiles)](offsets_of(q_lens), offsets_of(lens), torch.tensor(targets, dtype=torch.int32),
                                        out, rows, context, w, full, BLOCK_M=block_m, BLOCK_N=block_n, TILES=tiles,
                                        LAST_ROWS=q_lens is not lens, FULL=full > 0)
    seqs = [(lq, n, visible_mask(lq, n, window, 0, targets=(t, context, full)))
            for lq, n, t in zip(q_lens, lens, targets)]
    return out, rows, seqs, context, w, full, q_lens is not lens


@pytest.mark.parametrize("name", list(TARGET_CASES))
@pytest.mark.parametrize("block_m,block_n", [(32, 16), (64, 64), (16, 32)])
def test_context_keys_are_seen_by_the_context_rows_alone(name, block_m, block_n):
    out, rows, seqs, context, _, _, _ = _run(name, block_m, block_n)
    blocks = 0
    for b, (lq, n, mask) in enumerate(seqs):
        shift = n - lq
        for tile in range(-(-lq // block_m)):
            lo, hi, _ = out[b, tile].tolist()
            real = slice(tile * block_m, min((tile + 1) * block_m, lq))
            is_context = rows[b, tile, :real.stop - real.start].bool()
            assert torch.equal(is_context, torch.arange(real.start, real.stop) + shift < context), (name, b, tile)
            assert lo % block_n == 0 and hi % block_n == 0 and (lo < hi or lo == hi == 0), (name, b, tile, lo, hi)
            assert hi <= n
            if lo < hi:
                assert is_context.any(), (name, b, tile, lo, hi)
                seen = mask[real, lo:hi]
                assert torch.equal(seen, is_context[:, None].expand_as(seen)), (name, b, tile, lo, hi)
                blocks += (hi - lo) // block_n
    if name in ("context", "context-window", "context-window-full"):  # (long histories past a context: not vacuous)
        assert blocks > 0, name


@pytest.mark.parametrize("name", list(TARGET_CASES))
@pytest.mark.parametrize("block_m,block_n", [(32, 16), (64, 64), (16, 32)])
def test_window_keys_are_where_the_mask_is_the_causal_windows(name, block_m, block_n):
    """From window_keys on, a query tile's real rows see exactly the keys the causal window (on the sequence's rows)
    shows them: what window_visible tests."""
    out, _, seqs, _, w, full, serving = _run(name, block_m, block_n)
    checked = 0
    for b, (lq, n, mask) in enumerate(seqs):
        shift = n - lq
        i = torch.arange(lq)[:, None] + shift
        j = torch.arange(n)[None, :]
        causal_window = (j <= i) & (j >= i - w)
        for tile in range(-(-lq // block_m)):
            start = out[b, tile, 2].item()
            if full or serving:  # (rule.FULL, rule.LAST_ROWS: none)
                assert start == 1 << 30, (name, b, tile)
            if start >= n:
                continue
            assert start % block_n == 0, (name, b, tile, start)
            real = slice(tile * block_m, min((tile + 1) * block_m, lq))
            assert torch.equal(mask[real, start:], causal_window[real, start:]), (name, b, tile, start)
            checked += 1
    if not full and not serving and not name.startswith(("context-longer", "context-all")):  # (not vacuous)
        assert checked > 0, name


@triton.jit
def _key_tile_kernel(q_offsets, kv_offsets, num_targets, OUT, context, window, full, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, TILES: tl.constexpr, LAST_ROWS: tl.constexpr, FULL: tl.constexpr):
    """Per sequence and key block of BLOCK_N (key tiles of two, as the Hopper backward's two consumers hold them):
    the walk's prefix end, the head's rows [lo, head end), the tail's first row and key_tile_tests' answers."""
    from jfa.geometry import block_count, full_query_blocks, mask_rule, sequence, sequence_bounds, tail_seen, tile_walk
    from jfa.targets import key_tile_tests
    b = tl.program_id(0)
    t = tl.program_id(1)
    _, _, lens = sequence_bounds(q_offsets, kv_offsets, b)
    rule = mask_rule((num_targets, window, 0, context, LAST_ROWS, full, FULL))
    seq = sequence(b, lens, rule)
    k0 = t * BLOCK_N
    pre, lo, hi = tile_walk(k0 - k0 % (2 * BLOCK_N), seq, rule, 2 * BLOCK_N, BLOCK_M, True)
    j_lo, j_hi = full_query_blocks(k0, lo, block_count(lo, hi, BLOCK_M), seq, rule, BLOCK_M, BLOCK_N)
    by_rows, by_window = key_tile_tests(k0, pre, lo, lo + j_lo * BLOCK_M, seq, rule, BLOCK_M, BLOCK_N)
    seen = tail_seen(k0, lo + j_hi * BLOCK_M, seq, rule, BLOCK_N)
    base = OUT + (b * TILES + t) * 7
    tl.store(base, pre)
    tl.store(base + 1, lo)
    tl.store(base + 2, lo + j_lo * BLOCK_M)
    tl.store(base + 3, by_rows.to(tl.int32))
    tl.store(base + 4, by_window.to(tl.int32))
    tl.store(base + 5, lo + j_hi * BLOCK_M)
    tl.store(base + 6, seen.to(tl.int32))


@pytest.mark.parametrize("name", list(TARGET_CASES))
@pytest.mark.parametrize("block_m,block_n", [(32, 16), (64, 64), (16, 32)])
def test_key_tile_tests_hold_over_the_walks_they_cover(name, block_m, block_n):
    """The Hopper backward masks a key block's prefix by the context rows' test, its head by the causal window's and
    its tail by the real rows' where key_tile_tests says so: there, each block of the range sees exactly what that
    test says (rows past the sequence's end none: no context rows, and the window's blocks have none)."""
    from jfa.jagged import UNBOUNDED, visible_mask
    lens, q_lens, targets, context, window = _target_case(name)
    full = FULL_ROWS.get(name, 0)
    serving = q_lens is not lens
    tiles = max(-(-n // block_n) for n in lens) + 2
    out = torch.full((len(lens), tiles, 7), -7, dtype=torch.int32)
    w = UNBOUNDED if window < 0 else window
    _key_tile_kernel[(len(lens), tiles)](offsets_of(q_lens), offsets_of(lens), torch.tensor(targets, dtype=torch.int32),
                                         out, context, w, full, BLOCK_M=block_m, BLOCK_N=block_n, TILES=tiles,
                                         LAST_ROWS=serving, FULL=full > 0)
    by_rows_seen = by_window_seen = seen_tails = 0
    for b, (lq, n, t) in enumerate(zip(q_lens, lens, targets)):
        mask = visible_mask(lq, n, window, 0, targets=(t, context, full))
        shift = n - lq
        i = torch.arange(lq)[:, None] + shift
        j = torch.arange(n)[None, :]
        causal_window = (j <= i) & (j >= i - w)
        for tile in range(-(-n // block_n)):
            pre, lo, head_end, by_rows, by_window, tail, seen = out[b, tile].tolist()
            keys = slice(tile * block_n, min((tile + 1) * block_n, n))
            if by_rows:
                assert pre > 0 and keys.stop - keys.start == block_n, (name, b, tile)
                rows = torch.arange(0, min(pre, lq))
                is_context = rows + shift < context
                assert not (torch.arange(lq, max(pre, lq)) + shift < context).any(), (name, b, tile)
                assert torch.equal(mask[rows, keys], is_context[:, None].expand(-1, block_n)), (name, b, tile)
                by_rows_seen += 1
            if by_window and head_end > lo:
                assert not full and not serving, (name, b, tile)
                assert head_end <= lq, (name, b, tile, head_end)
                assert torch.equal(mask[lo:head_end, keys], causal_window[lo:head_end, keys]), (name, b, tile)
                by_window_seen += 1
            if seen and tail < lq:
                assert window < 0 and keys.stop - keys.start == block_n, (name, b, tile)
                assert mask[tail:, keys].all(), (name, b, tile, tail)
                seen_tails += 1
    if name in ("context", "context-window"):  # (not vacuous)
        assert by_rows_seen > 0 and by_window_seen > 0, (name, by_rows_seen, by_window_seen)
    if name in ("targets", "context"):
        assert seen_tails > 0, name


def _check_tail_seen(out, seqs, block_m, block_n, tag):
    """Wherever a tail_seen kernel's out [B, tiles, blocks] holds for a key block from a real row on, the keys exist
    and every row from there on sees every one of them in the reference mask (seqs: per sequence (Lq, Lk, mask)):
    how many such blocks there were."""
    checked = 0
    for b, (lq, n, mask) in enumerate(seqs):
        for tile in range(out.shape[1]):
            keys = slice(tile * block_n, (tile + 1) * block_n)
            for m in range(out.shape[2]):
                if out[b, tile, m] and m * block_m < lq:
                    assert keys.stop <= n and mask[m * block_m:, keys].all(), (tag, b, tile, m)
                    checked += 1
    return checked


@triton.jit
def _seen_kernel(q_offsets, kv_offsets, num_targets, OUT, context, window, full, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, TILES: tl.constexpr, BLOCKS: tl.constexpr, LAST_ROWS: tl.constexpr,
                 FULL: tl.constexpr):
    """jfa.geometry.tail_seen for every key block and every first row of the tail (a multiple of BLOCK_M)."""
    from jfa.geometry import mask_rule, sequence, sequence_bounds, tail_seen
    b = tl.program_id(0)
    t = tl.program_id(1)
    m = tl.program_id(2)
    _, _, lens = sequence_bounds(q_offsets, kv_offsets, b)
    rule = mask_rule((num_targets, window, 0, context, LAST_ROWS, full, FULL))
    seq = sequence(b, lens, rule)
    seen = tail_seen(t * BLOCK_N, m * BLOCK_M, seq, rule, BLOCK_N)
    tl.store(OUT + (b * TILES + t) * BLOCKS + m, seen.to(tl.int32))


@pytest.mark.parametrize("name", ["targets", "context", "context-window", "serving-context",
                                  "context-longer-than-history", "context-all-but-one-position"])
@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 64)])
def test_key_tile_tests_tail_is_seen_by_every_real_row(name, block_m, block_n):
    """Wherever tail_seen says a key block is seen by every real row from a row on, for any such row (not only a
    walk's tail), the reference mask agrees."""
    from jfa.jagged import UNBOUNDED, visible_mask
    lens, q_lens, targets, context, window = _target_case(name)
    serving = q_lens is not lens
    tiles = max(-(-n // block_n) for n in lens) + 1
    blocks = max(-(-n // block_m) for n in q_lens) + 1
    out = torch.full((len(lens), tiles, blocks), -7, dtype=torch.int32)
    w = UNBOUNDED if window < 0 else window
    _seen_kernel[(len(lens), tiles, blocks)](offsets_of(q_lens), offsets_of(lens),
                                             torch.tensor(targets, dtype=torch.int32), out, context, w, 0,
                                             BLOCK_M=block_m, BLOCK_N=block_n, TILES=tiles, BLOCKS=blocks,
                                             LAST_ROWS=serving, FULL=False)
    seqs = [(lq, n, visible_mask(lq, n, window, 0, targets=(t, context, 0))) for lq, n, t in zip(q_lens, lens, targets)]
    checked = _check_tail_seen(out, seqs, block_m, block_n, name)
    if window < 0 and name != "context-longer-than-history":  # (not vacuous)
        assert checked > 0, name


@triton.jit
def _window_sequence(q_offsets, kv_offsets, b, left, right):
    """Sequence b's (rule, seq) under the window (left, right) alone: the window tests' kernels' common start."""
    from jfa.geometry import mask_rule, sequence, sequence_bounds
    _, _, lens = sequence_bounds(q_offsets, kv_offsets, b)
    rule = mask_rule((None, left, right))
    return rule, sequence(b, lens, rule)


def _window_batch(cross, block_m, block_n):
    """The window tests' batch: (key lengths, query lengths, key tiles, query blocks), the counts one past the
    longest sequence's (a block wholly past every end tested too)."""
    lens = [1, 2, 40, 63, 64, 65, 129, 200]
    q_lens = [1, 5, 40, 70, 64, 3, 100, 200] if cross else lens
    return lens, q_lens, max(-(-n // block_n) for n in lens) + 1, max(-(-n // block_m) for n in q_lens) + 1


@triton.jit
def _window_seen_kernel(q_offsets, kv_offsets, OUT, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        TILES: tl.constexpr, BLOCKS: tl.constexpr):
    """jfa.geometry.tail_seen under a window rule, for every key block and every first row (a multiple of BLOCK_M)."""
    from jfa.geometry import tail_seen
    b = tl.program_id(0)
    t = tl.program_id(1)
    m = tl.program_id(2)
    rule, seq = _window_sequence(q_offsets, kv_offsets, b, left, right)
    tl.store(OUT + (b * TILES + t) * BLOCKS + m, tail_seen(t * BLOCK_N, m * BLOCK_M, seq, rule, BLOCK_N).to(tl.int32))


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (16, 0), (-1, 5), (7, 7)])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 64)])
def test_tail_seen_under_a_window(window, cross, block_m, block_n):
    """tail_seen under a window (no HSTU mask): wherever it holds, every real row from that row on sees every key of
    the block, and the keys exist; and it holds for a full attention's last blocks (not vacuous)."""
    from jfa.jagged import UNBOUNDED, visible_mask
    lens, q_lens, tiles, blocks = _window_batch(cross, block_m, block_n)
    out = torch.full((len(lens), tiles, blocks), -7, dtype=torch.int32)
    left, right = (UNBOUNDED if w < 0 else w for w in window)
    _window_seen_kernel[(len(lens), tiles, blocks)](offsets_of(q_lens), offsets_of(lens), out, left, right,
                                                    BLOCK_M=block_m, BLOCK_N=block_n, TILES=tiles, BLOCKS=blocks)
    seqs = [(lq, n, visible_mask(lq, n, *window)) for lq, n in zip(q_lens, lens)]
    checked = _check_tail_seen(out, seqs, block_m, block_n, window)
    if window == (-1, -1):
        assert checked > 0


@triton.jit
def _row_edge_kernel(q_offsets, kv_offsets, OUT, EDGE, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     TILES: tl.constexpr, BLOCKS: tl.constexpr):
    """The forward's cheaper test under a window, per query tile and key block: whether it takes the right edge alone
    (past full_blocks' first block, with edge_in_keys or every key of the block real), and right_edge on the pairs
    as the forward holds them (rows first)."""
    from jfa.geometry import edge_in_keys, key_blocks, right_edge, right_edge_alone
    b = tl.program_id(0)
    m = tl.program_id(1)
    t = tl.program_id(2)
    rule, seq = _window_sequence(q_offsets, kv_offsets, b, left, right)
    _, full_lo, _, _ = key_blocks(m * BLOCK_M, seq, rule, BLOCK_M, BLOCK_N)
    n0 = t * BLOCK_N
    takes = right_edge_alone(n0, full_lo, edge_in_keys(m * BLOCK_M, seq, rule, BLOCK_M), seq, BLOCK_N)
    tile = (b * BLOCKS + m) * TILES + t
    tl.store(OUT + tile, takes.to(tl.int32))
    i = tl.expand_dims(m * BLOCK_M + tl.arange(0, BLOCK_M), 1)
    j = tl.expand_dims(n0 + tl.arange(0, BLOCK_N), 0)
    offs = tl.expand_dims(tl.arange(0, BLOCK_M), 1) * BLOCK_N + tl.expand_dims(tl.arange(0, BLOCK_N), 0)
    tl.store(EDGE + tile * BLOCK_M * BLOCK_N + offs, right_edge(i, j, seq, rule).to(tl.int32))


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (16, 0), (-1, 5), (7, 7), (100, 3), (40, 40)])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 64)])
def test_the_forwards_right_edge_is_the_mask_where_it_is_taken(window, cross, block_m, block_n):
    """Wherever the forward takes the right edge alone for a query tile's key block, right_edge is the reference mask
    on the tile's real rows against every key of the block (keys past the sequence's end unseen); and the causal
    diagonal takes it (not vacuous)."""
    from jfa.jagged import UNBOUNDED, visible_mask
    lens, q_lens, tiles, blocks = _window_batch(cross, block_m, block_n)
    out = torch.full((len(lens), blocks, tiles), -7, dtype=torch.int32)
    edge = torch.full((len(lens), blocks, tiles, block_m, block_n), -7, dtype=torch.int32)
    left, right = (UNBOUNDED if w < 0 else w for w in window)
    _row_edge_kernel[(len(lens), blocks, tiles)](offsets_of(q_lens), offsets_of(lens), out, edge, left, right,
                                                 BLOCK_M=block_m, BLOCK_N=block_n, TILES=tiles, BLOCKS=blocks)
    checked = 0
    for b, (lq, n) in enumerate(zip(q_lens, lens)):
        mask = torch.zeros(blocks * block_m, tiles * block_n, dtype=torch.bool)
        mask[:lq, :n] = visible_mask(lq, n, *window)
        for m in range(blocks):
            real = slice(m * block_m, min((m + 1) * block_m, lq))
            if real.start >= real.stop:
                continue
            for tile in range(tiles):
                if out[b, m, tile]:
                    keys = slice(tile * block_n, (tile + 1) * block_n)
                    got = edge[b, m, tile][:real.stop - real.start].bool()
                    assert torch.equal(got, mask[real, keys]), (window, b, m, tile)
                    checked += 1
    if window == (-1, 0):
        assert checked > 0
