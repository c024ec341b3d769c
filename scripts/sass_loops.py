"""The block loops of a Hopper kernel form in its SASS (compiled for sm_90, no GPU needed): each innermost loop that
issues an MMA (HGMMA), with its instruction count, its opcodes and its local-memory (spill) traffic. The CPU's proxy
for a change to a block's elementwise or address work, read before a device call (docs/perf-notes.md: gelu-u's
loops 681 -> 649 instructions; a loop's LDL is a spill reload every block).

    TRITON_INTERPRET=0 python scripts/sass_loops.py FORM [--head-dim D] [--activation A] [--broadcast] [--targets]
                                                         [--mean-kv N] [--top N] [--sass FILE]

FORM: fwd (select_fwd's form for --mean-kv, default the long one), one-pass (the dK/dV kernel with dQ,
DqRoute.REDUCE), direct (DqRoute.DIRECT), dkdv (no dQ), dq (the dQ pass). --sass writes the whole SASS there.
"""
import argparse
import collections
import re
import sys

_INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"\s*(\.L_x_\d+):")


def instructions(sass: str) -> tuple[list, dict]:
    """SASS text -> ([(address, opcode, text)], {label: address of the instruction after it}); the opcode without
    its predicate (@P0, @!UP1) and modifiers (HGMMA.64x64x16.F32.BF16 -> HGMMA)."""
    out, labels, pending = [], {}, []
    for line in sass.splitlines():
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTRUCTION.match(line)
        if m:
            address, text = int(m.group(1), 16), m.group(2)
            op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]
            out.append((address, op, text))
            labels.update((label, address) for label in pending)
            pending = []
    return out, labels


def innermost(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (first, last) instruction spans of backward branches that hold no other such span (also ncu_lines.py's)."""
    return [(lo, hi) for lo, hi in spans if not any(lo <= l2 and h2 <= hi and (l2, h2) != (lo, hi) for l2, h2 in spans)]


def loops(sass: str, op: str = "HGMMA") -> list[tuple[int, int, int, collections.Counter]]:
    """The innermost loops (a backward branch's span holding no other) that hold an `op`, longest first: (instruction
    count, first address, last address, opcode counts)."""
    ins, labels = instructions(sass)
    index = {a: i for i, (a, _, _) in enumerate(ins)}
    spans = []
    for i, (a, name, text) in enumerate(ins):
        m = re.search(r"(\.L_x_\d+)", text) if name == "BRA" else None
        if m and m.group(1) in labels and labels[m.group(1)] <= a:
            spans.append((index[labels[m.group(1)]], i))
    found = []
    for lo, hi in innermost(spans):
        ops = collections.Counter(name for _, name, _ in ins[lo:hi + 1])
        if ops[op]:
            found.append((hi - lo + 1, ins[lo][0], ins[hi][0], ops))
    return sorted(found, key=lambda x: -x[0])


def _compile(args):
    """The form's Report, compiled as jfa.hopper.aot does (each config as the problem runs it: for_problem)."""
    import torch

    from jfa.hopper import aot
    from jfa.hopper.config import DqRoute, select_dkdv, select_fwd
    fields = dict(broadcast=args.broadcast, targets=args.targets)
    if args.activation:
        fields["activation"] = args.activation
    bf16, d = torch.bfloat16, args.head_dim
    if args.form == "fwd":
        return aot.compile_fwd(d, bf16, cfg=select_fwd(d, args.mean_kv), **fields)
    if args.form == "dq":
        return aot.compile_dq(d, bf16, **fields)
    route = {"one-pass": DqRoute.REDUCE, "direct": DqRoute.DIRECT, "dkdv": DqRoute.NONE}[args.form]
    return aot.compile_dkdv(d, bf16, cfg=select_dkdv(d, route), **fields)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("form", choices=("fwd", "one-pass", "direct", "dkdv", "dq"))
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--activation")
    ap.add_argument("--broadcast", action="store_true")
    ap.add_argument("--targets", action="store_true", help="HSTU's mask")
    ap.add_argument("--mean-kv", type=float, default=float("inf"), help="the forward's mean key length (its form)")
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument("--sass", help="write the whole SASS here")
    args = ap.parse_args(argv)
    from jfa.ptxas import sass as to_sass
    report = _compile(args)
    code = to_sass(report.ptx)
    if args.sass:
        with open(args.sass, "w") as f:
            f.write(code)
    print(f"{report.kernel} D={args.head_dim}: {report.registers} registers, {report.spill_bytes} B of spills, "
          f"{report.wgmma} wgmma")
    for count, first, last, ops in loops(code)[:args.top]:
        spills = ops["LDL"] + ops["STL"]
        print(f"loop {first:#x}-{last:#x}: {count} instructions, {spills} spill loads/stores")
        print("   ", ", ".join(f"{k} {v}" for k, v in ops.most_common(24)))


if __name__ == "__main__":
    sys.exit(main())
