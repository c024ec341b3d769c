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
