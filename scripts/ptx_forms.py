"""Compile every default kernel form for sm_90 (no GPU needed) and compare two such dumps modulo numbering: the check
that a refactor left the kernels as they were (docs/perf-notes.md; CONTRIBUTING.md).

    TRITON_INTERPRET=0 python scripts/ptx_forms.py dump DIR [--only SUBSTRING] [--variants]
    python scripts/ptx_forms.py diff DIR_BEFORE DIR_AFTER

`dump` writes one DIR/<form>.ptx per form: the Hopper kernels (jfa.hopper.aot.default_forms), the portable Triton
kernels (jfa.triton.aot, each kernel x head dim x dtype) and the schedule's refresh kernel; with --variants, the score
functions' and HSTU's mask's forms instead (silu, gelu_tanh; targets with softmax and silu; a relative bias).
`diff` renumbers registers and labels by first use, drops debug lines, and prints per form: same, or the first
differing lines and the instruction counts of both (exit status 1 if any form differs or is missing).
"""
import argparse
import collections
import dataclasses
import os
import re
import sys


def _hopper_forms():
    from jfa.hopper.aot import default_forms
    return {name: (lambda f=f: f().ptx) for name, f in default_forms().items()}


def _triton_forms():
    import torch

    from jfa.triton.aot import KERNELS, compile_kernel
    forms = {}
    for dtype, t in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.float32, "fp32")):
        for d in ((64, 128, 256) if t != "fp32" else (64, )):
            for name in KERNELS:
                forms[f"t{name}-{t}-d{d}"] = lambda n=name, d=d, dt=dtype: compile_kernel(n, d, dt).ptx
            forms[f"tdq-{t}-d{d}-b1"] = lambda d=d, dt=dtype: compile_kernel("dq", d, dt, True).ptx
    return forms


def _variant_forms():
    """The attention variants' forms (bf16, self-attention): every Hopper kernel form with silu and gelu_tanh, the
    HSTU mask's with softmax and silu (and with silu in serving: each sequence's last rows as queries), the forward
    on paged k/v, and the portable kernels with the activations and with a relative bias."""
    import torch

    from jfa.hopper.aot import compile_dkdv, compile_dq, compile_fwd
    from jfa.hopper.config import DqRoute, select_dkdv, select_fwd
    from jfa.triton.aot import compile_kernel
    bf16, forms = torch.bfloat16, {}
    for d in (64, 128):
        variants = [(a, False, False) for a in ("silu", "gelu_tanh")] + [(a, True, False) for a in ("softmax", "silu")]
        for act, targets, serving in variants + [("silu", True, True)]:
            tag = f"bf16-d{d}-{act}{'-targets' if targets else ''}{'-serving' if serving else ''}"
            kw = dict(activation=act, targets=targets, serving=serving)

            def cfg(c, targets=targets):  # (HSTU's mask posts no items: jfa.hopper.config)
                return dataclasses.replace(c, posted_items=False) if targets else c
            for mean, name in ((float("inf"), "long"), (64, "tile")):
                forms[f"hfwd-{tag}-{name}"] = lambda d=d, kw=kw, f=cfg, m=mean: compile_fwd(
                    d, bf16, False, f(select_fwd(d, m)), **kw).ptx
            for route, name in ((DqRoute.NONE, "none"), (DqRoute.REDUCE, "reduce"), (DqRoute.DIRECT, "direct")):
                forms[f"hdkdv-{tag}-{name}"] = lambda d=d, kw=kw, r=route, f=cfg: compile_dkdv(
                    d, bf16, False, f(select_dkdv(d, r)), **kw).ptx
            forms[f"hdq-{tag}-skip0"] = lambda d=d, kw=kw: compile_dq(d, bf16, False, **kw).ptx
        for mean, name in ((float("inf"), "long"), (300, "short"), (64, "tile")):  # paged k/v (serving)
            forms[f"hfwd-bf16-d{d}-paged-{name}"] = lambda d=d, m=mean: compile_fwd(d, bf16, False, select_fwd(d, m),
                                                                                    paged=True).ptx
        for act in ("silu", "gelu_tanh"):
            for name in ("fwd", "dkdv", "dq"):
                forms[f"t{name}-bf16-d{d}-{act}"] = lambda n=name, d=d, a=act: compile_kernel(n, d, bf16,
                                                                                          activation=a).ptx
        for act in ("softmax", "silu"):  # a relative bias (jfa.bias)
            for name in ("fwd", "dkdv", "dq"):
                forms[f"t{name}-bf16-d{d}-{act}-bias"] = lambda n=name, d=d, a=act: compile_kernel(
                    n, d, bf16, activation=a, bias=True).ptx
    return forms


def _schedule_forms():
    import torch

    from jfa.hopper.aot import compile_refresh
    return {f"refresh-{t}": (lambda d=d: compile_refresh(d)) for t, d in (("i32", torch.int32), ("i64", torch.int64))}


def dump(out_dir, only=None, variants=False):
    os.makedirs(out_dir, exist_ok=True)
    forms = _variant_forms() if variants else {**_hopper_forms(), **_triton_forms(), **_schedule_forms()}
    failed = 0
    for name, compile_ptx in forms.items():
        if only and only not in name:
            continue
        try:
            ptx = compile_ptx()
        except Exception as e:  # report and go on: the other forms still tell
            print(f"{name}: FAILED to compile: {type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}",
                  flush=True)
            failed += 1
            continue
        with open(os.path.join(out_dir, name + ".ptx"), "w") as f:
            f.write(ptx)
        print(name, flush=True)
    return failed


_TOKEN = re.compile(r"%[a-z]+\d+|\$L__[A-Za-z_]+\d+|__unnamed_\d+|_param_\d+")


def normalize(ptx: str, erase: bool = False, params: bool = True) -> list[str]:
    """PTX code lines without debug info and comments, registers and labels renumbered by first use (erase: with
    no numbers at all, so that one inserted instruction does not renumber the rest; params=False: without the
    parameter declarations and loads, so that the order of the kernel's parameters does not matter)."""
    names: dict = {}
    counts: collections.Counter = collections.Counter()
    lines = []
    for line in ptx.split("\t.section\t.debug")[0].splitlines():
        line = line.split("//")[0].strip()
        if not line or line.startswith((".loc", ".file")) or re.fullmatch(r"\$L__tmp\d+:", line):
            continue
        if not params and (line.startswith((".param", "ld.param")) or line in ("(", ")")):
            continue

        def rename(m):
            tok = m.group(0)
            kind = re.sub(r"\d+$", "", tok)
            if erase:
                return kind
            if tok not in names:
                counts[kind] += 1
                names[tok] = f"{kind}#{counts[kind]}"
            return names[tok]
        line = re.sub(r"(\.reg \S+\s+%\w+)<\d+>", r"\1<N>", line) if erase else line
        lines.append(_TOKEN.sub(rename, line))
    return lines


def _instructions(lines):
    return collections.Counter(line.split()[0] for line in lines if not line.startswith((".", "}", "{", "#")))


def diff(before, after) -> int:
    status = 0
    names = sorted(set(os.listdir(before)) | set(os.listdir(after)))
    for name in names:
        a_path, b_path = os.path.join(before, name), os.path.join(after, name)
        if not (os.path.exists(a_path) and os.path.exists(b_path)):
            print(f"{name}: only in {'before' if os.path.exists(a_path) else 'after'}")
            status = 1
            continue
        a_ptx, b_ptx = open(a_path).read(), open(b_path).read()
        a, b = normalize(a_ptx), normalize(b_ptx)
        if a == b:
            print(f"{name}: same ({len(a)} lines)")
            continue
        status = 1
        a, b = normalize(a_ptx, erase=True), normalize(b_ptx, erase=True)
        if a == b:
            print(f"{name}: the same instructions in the same order, other register numbering ({len(a)} lines)")
            continue
        code_a, code_b = ([x for x in lines if not x.startswith(".param")] for lines in (a, b))
        if code_a == code_b:
            print(f"{name}: the same instructions; the kernel's parameter list differs (an argument it does not "
                  f"read: {len(a) - len(code_a)} vs {len(b) - len(code_b)} parameters)")
            continue
        loads = [sorted(x.split()[0] for x in lines if x.startswith("ld.param")) for lines in (a, b)]
        if loads[0] == loads[1] and normalize(a_ptx, params=False) == normalize(b_ptx, params=False):
            print(f"{name}: the same instructions modulo the order of the kernel's parameters ({len(a)} lines; "
                  f"their loads: the same {len(loads[0])})")
            continue
        first = next(i for i, (x, y) in enumerate(zip(a + [""], b + [""])) if x != y)
        ia, ib = _instructions(a), _instructions(b)
        moved = {k: (ia[k], ib[k]) for k in set(ia) | set(ib) if ia[k] != ib[k]}
        print(f"{name}: DIFFERS from line {first} ({len(a)} vs {len(b)} lines); instruction counts that differ: "
              f"{moved or 'none (the same instructions in another order or with other operands)'}")
        print(f"    before: {a[first] if first < len(a) else '<end>'}")
        print(f"    after:  {b[first] if first < len(b) else '<end>'}")
    return status


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("dir")
    d.add_argument("--only", help="only the forms whose name holds this")
    d.add_argument("--variants", action="store_true", help="the score functions' and masks' forms instead")
    c = sub.add_parser("diff")
    c.add_argument("before")
    c.add_argument("after")
    args = p.parse_args(argv)
    if args.cmd == "dump":
        return 1 if dump(args.dir, args.only, args.variants) else 0
    return diff(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
