"""Shared-memory wavefronts of a consumer's stores from wgmma's float32 accumulator layout into an NVMMA-swizzled
tile, by swizzle, or into rows whose 32-byte groups are permuted by the row (Triton's SwizzledSharedLayout(vec=8,
per_phase=1, max_phase=8) for float32: group g of row r at g ^ (r % 8)): what ncu's "L1 Wavefronts Shared
Excessive" counts, predicted on any machine (the one pass's dQ chunk under the 128-byte swizzle took 4 wavefronts a
store where 2 would do: ncu on causal-skewed-4k).

    python scripts/bank_conflicts.py [--cols 64]

Model (Hopper): a warp's 8-byte stores go in two half-warp phases (4-byte stores: one phase); a phase takes as many
wavefronts as the most distinct 4-byte words any of the 32 banks serves. NVMMA layout of a [rows, cols] tile with
swizzle S bytes: column blocks S bytes wide, each all rows x S bytes contiguous; in a block, 16-byte chunk c of row r
sits at chunk c ^ ((r // (128 // S)) % (S // 16)). wgmma's [64, n] float32 accumulator: warp w holds rows 16 w..,
lane l rows l // 4 and l // 4 + 8, columns 2 (l % 4) + 8 j and the next.
"""
import argparse


def address(r: int, c: int, swizzle: int, cols: int, elem: int = 4) -> int:
    """Byte address of element (r, c) of a [rows, cols] tile of elem-byte elements under the swizzle (0: none)."""
    width = swizzle or cols * elem
    block, cc = divmod(c * elem, width)
    chunk, offset = divmod(cc, 16)
    if swizzle:
        chunk ^= (r // (128 // swizzle)) % (swizzle // 16)
    return block * 64 * width + r * width + chunk * 16 + offset  # (blocks spaced for up to 64 rows: only a word's
    # bank and identity count)


def xor_address(r: int, c: int, cols: int, elem: int = 4, group: int = 8, phases: int = 8) -> int:
    """Byte address of element (r, c) of a [rows, cols] tile whose rows hold their `group`-element groups permuted,
    group g at g ^ (r % phases) (Triton's SwizzledSharedLayout(vec=group, per_phase=1, max_phase=phases))."""
    return (r * cols + ((c // group) ^ (r % phases)) * group + c % group) * elem


def wavefronts(stores, swizzle, cols: int) -> float:
    """Mean wavefronts a warp store, over stores: each a list of phases, each phase a list of (row, col) words;
    swizzle: an NVMMA swizzle's bytes, or "xor" (xor_address)."""
    total = 0
    for phases in stores:
        for words in phases:
            banks = {}
            for r, c in words:
                a = xor_address(r, c, cols) if swizzle == "xor" else address(r, c, swizzle, cols)
                banks.setdefault(a // 4 % 32, set()).add(a // 4)
            total += max(len(v) for v in banks.values())
    return total / len(stores)


def accumulator_stores(cols: int):
    """Straight from the accumulator (STS.64): for each 8-column group and row half, lanes 0-15 then 16-31."""
    out = []
    for j in range(cols // 8):
        for half in (0, 8):
            out.append([[(l // 4 + half, 2 * (l % 4) + 8 * j + e) for l in lanes for e in (0, 1)]
                        for lanes in (range(16), range(16, 32))])
    return out


def transposed_stores(rows: int):
    """A [64, rows] accumulator stored through a permuted view into [rows, 64] (STS.32: a thread's two registers
    are two rows): the short-q form's dQ^T chunk."""
    return [[[(2 * (l % 4) + 8 * j + e, l // 4 + half) for l in range(32)]]
            for j in range(rows // 8) for half in (0, 8) for e in (0, 1)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cols", type=int, default=64, help="float32 columns of the tile (the dQ chunk: 64)")
    args = p.parse_args(argv)
    for swizzle in (0, 32, 64, 128, "xor"):
        a = wavefronts(accumulator_stores(args.cols), swizzle, args.cols)
        t = wavefronts(transposed_stores(32), swizzle, 64)
        print(f"swizzle {swizzle:>3}: [64, {args.cols}] from the accumulator {a:.1f} wavefronts a store (ideal 2); "
              f"[32, 64] through a permuted view {t:.1f} (ideal 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
