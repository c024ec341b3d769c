"""Ablations of the Hopper kernels (the dK/dV kernel, jfa.hopper.bwd, by default its one pass, DqRoute.REDUCE; the
score functions' work in the forward too): the same kernel with one part removed, each in a throwaway copy of jfa,
timed with benchmarks/passes.py's "one pass" (or --part: "dkdv+direct dq" for the DIRECT route that short key sets
take, "backward (default)", "forward" for the score ablations) and, with --ncu, profiled
(tensor-pipe and issue activity, the top stall lines by scripts/ncu_lines.py). What the time falls by when a part
is gone bounds what a lever on that part can pay: run this before building one (docs/perf-notes.md keeps the
table). An ablated kernel computes wrong gradients by design; only its time counts.

    python benchmarks/ablate.py --check [--ablations NAME,...]                 (any machine: compiles for sm_90)
    python benchmarks/ablate.py [--only WORKLOADS] [--part PART] [--ablations NAME,...] [--rounds 3] [--ncu]
                                [--out DIR]
    python benchmarks/ablate.py --list

--check builds every copy and compiles its D=128 one pass and DIRECT form and its softmax and gelu_tanh forwards for
sm_90 on the CPU (wgmma count, registers, spills), so a stale edit or a form that does not compile costs no device
time. On the GPU the copies compile in parallel, then the rounds time main and every ablation in turn (compare
within one run only); --ncu adds one profiled launch of each. Output: a table on stdout; with --ncu, the reports
and their summaries under --out ($OUT if set).
"""
import argparse
import csv
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the writer warp, gone from the one pass's partitions (nothing may then hand it a dQ chunk)
_NO_WRITER = ("hopper/bwd.py",
              "                (dq_writer_partition, (shape, work, batch, dq_desc, d.stage, kv_ops)),\n"
              "            ], [4, 1, 1], [240, 24, 24])",
              "            ], [4, 1], [240, 24])")
# ... and with a work queue, no writer among the posted items' readers (its release would never come)
_NO_QUEUE_WRITER = ("hopper/bwd.py", "CFG.queue and CFG.one_pass and not DIRECT, CFG.posted_items)",
                    "False, CFG.posted_items)")

# name -> (what it removes, [(file under jfa/, text, its replacement)]): each text must occur exactly once
ABLATIONS = {
    "main": ("nothing (the kernel as it is)", []),
    "no dQ": ("the dQ chunks' MMAs, the consumers' dS^T handshake for them, the hand-over and the writer warp", [
        ("hopper/bwd_block.py", "            deferred_dq(c, stage, it - 1, blk.t)",
         "            stage.free_ds(it - 1)"),
        ("hopper/bwd.py", "                    deferred_dq(c, d.stage, it - 1, t)",
         "                    d.stage.free_ds(it - 1)"),
        ("hopper/bwd_block.py", "        if it % 2 == WG:\n", "        if False:\n"),
        _NO_WRITER, _NO_QUEUE_WRITER]),
    "no direct dQ": ("DqRoute.DIRECT's dQ (short key sets: --part 'dkdv+direct dq'): the chunks' MMAs, the wait for "
                     "the other consumer's dS^T, the stores", [
        ("hopper/bwd_block.py", "        if want_dq & ((stage.CHUNKS == 2) | (it % 2 == WG)):\n",
         "        if False:\n")]),
    "no dS wait": ("the consumers' waits on each other's dS^T: before the dQ MMA (for the other's) and before the next "
                   "block's (for its release); dQ reads whatever is there", [
        ("hopper/dq_reduce.py", "    stage.wait_ds(it)\n", ""),
        ("hopper/dq_reduce.py", "        mbarrier.wait(self.ds_free.index(it % 2), ((it // 2) & 1) ^ 1)\n",
         "        pass\n")]),
    "dQ own keys": ("half of each dQ chunk's MMA and the wait for the other consumer's dS^T: a consumer's chunk over "
                    "its own 64 keys", [
        ("hopper/dq_reduce.py", "    stage.wait_ds(it)\n", ""),
        ("hopper/dq_reduce.py", "        for k in gl.static_range(2):\n            k_cols = kv_ops.a_block(t, k)",
         "        for k in gl.static_range(C, C + 1):\n            k_cols = kv_ops.a_block(t, k)")]),
    "no TMA reduce": ("the writer's reduce-adds into dQ (it still drains every chunk)", [
        ("hopper/dq_reduce.py", "async_reduce_add(dq_desc, coord, self.dq.index(slot))", "pass")]),
    "no exp": ("the exponential of P (P = the scaled S minus LSE)", [
        ("variants.py", "p = tl.exp2(s * score[0] - lse2)", "p = s * score[0] - lse2")]),
    "no LSE/Delta loads": ("the producer's global loads of the rows' LSE and Delta (the consumers read stale ones)", [
        ("hopper/bwd.py", "if (stats is not None) and variants.has_lse(shape.SCORE):", "if False:")]),
    "producer only": ("every consumer's math: each block is waited for and released, no writer", [
        ("hopper/bwd.py",
         "                    dk, dv = one_pass_block(c, d, blk, dk, dv, tile, offs_n, want_dq, MASKED=masks[seg],\n"
         "                                             DIRECT=DIRECT, idle=idle)",
         "                    c.qdo.wait(blk.it)\n"
         "                    c.qdo.release(blk.it)"),
        # (the item's last deferred dQ would wait for a dS^T that no block published: the kernel hung)
        ("hopper/bwd.py", "                    deferred_dq(c, d.stage, it - 1, t)", "                    pass"),
        _NO_WRITER, _NO_QUEUE_WRITER]),
    "tanh as ex2": ("nothing of the activations' work but MUFU.TANH's rate: tanh.approx becomes ex2.approx (one MUFU "
                    "operation each; silu, gelu_tanh and sigmoid compute wrong values), forward and backward", [
        ("variants.py", '"tanh.approx.f32 $0, $1;"', '"ex2.approx.ftz.f32 $0, $1;"')]),
    "no activation": ("the activation's forward (P = the scaled S; with --part forward)", [
        ("variants.py", "        p, _ = SCORE(s * qk_scale, FAST)\n", "        p = s * qk_scale\n")]),
    "fwd no exp": ("softmax's exponential in the forward (P = the scaled S minus the row max; with --part forward)", [
        ("variants.py", "p = tl.exp2(s * qk_scale - tl.expand_dims(m_scaled, 1))",
         "p = s * qk_scale - tl.expand_dims(m_scaled, 1)")]),
    "fwd no pingpong": ("the two consumers' hand-off of the tensor cores in the forward (FlashAttention-3's ping-pong: "
                        "each issues its MMAs without waiting for its turn; with --part forward)", [
        ("hopper/fwd.py", "    if PINGPONG:\n        gl.inline_asm_elementwise(_turn_asm",
         "    if False:\n        gl.inline_asm_elementwise(_turn_asm")]),
    "fwd no rescale": ("softmax's rescale of O by alpha in the forward's block loop (O comes out wrong; with --part "
                       "forward)", [
        ("hopper/fwd.py", "        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)",
         "        pass")]),
    "fwd no O store": ("the forward's O and LSE stores (the math stays: a store whose test no row passes; with "
                       "--part forward)", [
        ("hopper/fwd.py", "    if row0 < tile.q_len:\n        _store(",
         "    if row0 + tile.q_len < 0:\n        _store(")]),
    "fwd Q always ready": ("the forward's Q loads: an item's Q block is ready once its slot is free (with --part "
                           "forward)", [
        ("hopper/buffers.py",
         "            mbarrier.expect(bar, a_desc.block_type.nbytes)\n"
         "            tma.async_copy_global_to_shared(a_desc, a_coord, bar, self.a.index(i))",
         "            mbarrier.arrive(bar, count=1)")]),
    "fwd Q loaded once": ("the forward's Q loads after each consumer's first item: a later item's Q block is "
                          "ready once its slot is free and holds the first item's rows (real data: an ablation "
                          "whose operands stay zero also lowers the tensor cores' power draw; with --part forward)", [
        ("hopper/buffers.py",
         "            mbarrier.expect(bar, a_desc.block_type.nbytes)\n"
         "            tma.async_copy_global_to_shared(a_desc, a_coord, bar, self.a.index(i))",
         "            if t < self.SLOTS:\n"
         "                mbarrier.expect(bar, a_desc.block_type.nbytes)\n"
         "                tma.async_copy_global_to_shared(a_desc, a_coord, bar, self.a.index(i))\n"
         "            else:\n"
         "                mbarrier.arrive(bar, count=1)")]),
    "fwd K/V loaded once": ("the forward's K/V loads after each ring slot's first: a slot is ready once claimed and "
                            "holds its first block's rows (real data, as 'fwd Q loaded once'; with --part forward)", [
        ("hopper/buffers.py",
         "        mbarrier.expect(ready.index(slot), desc.block_type.nbytes)\n"
         "        tma.async_copy_global_to_shared(desc, coord, ready.index(slot), buf.index(slot))",
         "        if it < self.STAGES:\n"
         "            mbarrier.expect(ready.index(slot), desc.block_type.nbytes)\n"
         "            tma.async_copy_global_to_shared(desc, coord, ready.index(slot), buf.index(slot))\n"
         "        else:\n"
         "            mbarrier.arrive(ready.index(slot), count=1)")]),
    "ring always full": ("the (Q, dO) ring's TMA loads: a slot is ready once claimed (the forward's K/V ring too)", [
        ("hopper/buffers.py",  # the forward's K and V (Ring.fill_a, fill_b)
         "        mbarrier.expect(ready.index(slot), desc.block_type.nbytes)\n"
         "        tma.async_copy_global_to_shared(desc, coord, ready.index(slot), buf.index(slot))",
         "        mbarrier.arrive(ready.index(slot), count=1)"),
        ("hopper/buffers.py",  # the backward's (Q, dO) (Ring.issue; B_READY: dO's ready barrier its own)
         "        if self.B_READY:\n"
         "            mbarrier.expect(self.a_ready.index(slot), a_desc.block_type.nbytes)\n"
         "            tma.async_copy_global_to_shared(a_desc, a_coord, self.a_ready.index(slot), self.a.index(slot))\n"
         "            mbarrier.expect(self.b_ready.index(slot), b_desc.block_type.nbytes)\n"
         "        else:\n"
         "            mbarrier.expect(self.a_ready.index(slot), a_desc.block_type.nbytes + b_desc.block_type.nbytes)\n"
         "            tma.async_copy_global_to_shared(a_desc, a_coord, self.a_ready.index(slot), self.a.index(slot))\n"
         "        tma.async_copy_global_to_shared(b_desc, b_coord, self.b_ready.index(slot), self.b.index(slot))",
         "        mbarrier.arrive(self.a_ready.index(slot), count=1)\n"
         "        if self.B_READY:\n"
         "            mbarrier.arrive(self.b_ready.index(slot), count=1)")]),
}

DEFAULT_WORKLOADS = "self-skewed-8k,causal-skewed-4k"  # D=128, where jfa's backward trails FA4
_KERNEL = {"forward": "hopper_fwd"}  # the kernel --ncu profiles, by part (else the dK/dV kernel)
# ncu's details lines worth a table column, and its raw metrics for the tensor pipe and issue slots
_DETAILS = re.compile(r"Duration|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|No Eligible|"
                      r"Warp Cycles Per Issued Instruction|Registers Per Thread|DRAM Throughput")
_RAW = re.compile(r"pipe_tensor.*pct|issue_active.*pct|inst_issued.*pct|data_bank_conflicts_pipe_lsu_mem_shared")


def apply(src: Path, edits) -> None:
    """The edits, in place, on the copy of jfa at src; a text not found exactly once is an error (the kernel
    changed under the ablation: update its text here)."""
    for rel, old, new in edits:
        path = src / rel
        text = path.read_text()
        if text.count(old) != 1:
            raise ValueError(f"{rel}: the ablated text occurs {text.count(old)} times, not once:\n{old}")
        path.write_text(text.replace(old, new))


def build(names, into: Path) -> dict:
    """name -> a directory holding that ablation's copy of jfa (for PYTHONPATH)."""
    dirs = {}
    for i, name in enumerate(names):
        d = into / f"a{i}"
        shutil.copytree(ROOT / "jfa", d / "jfa", ignore=shutil.ignore_patterns("__pycache__"))
        apply(d / "jfa", ABLATIONS[name][1])
        dirs[name] = d
    return dirs


WARM_S = 240  # a copy's first call: its kernels' compile (in parallel with the others') and one run


def _run(cmd, path: Path, timeout: int, **env) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(path), **env)  # (run in path: no other jfa ahead of the copy)
    try:
        return subprocess.run(cmd, env=env, cwd=path, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:  # (a protocol bug in an ablation hangs its kernel)
        return subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {timeout} s")


_CHECK = """
import torch
from jfa.hopper.aot import compile_dkdv, compile_fwd
from jfa.hopper.config import DqRoute, select_dkdv, select_fwd
for route in (DqRoute.REDUCE, DqRoute.DIRECT):
    r = compile_dkdv(128, torch.bfloat16, cfg=select_dkdv(128, route))
    print(f"{route.name}: wgmma {r.wgmma}, regs {r.registers}, spill {r.spill_bytes} B", end="; ")
print()
for act in ("softmax", "gelu_tanh"):
    r = compile_fwd(128, torch.bfloat16, activation=act)
    print(f"fwd {act}: regs {r.registers}, spill {r.spill_bytes} B", end="; ")
    r = compile_fwd(128, torch.bfloat16, cfg=select_fwd(128, 64), activation=act)  # (the short-tile form)
    print(f"short fwd {act}: wgmma {r.wgmma}, regs {r.registers}, spill {r.spill_bytes} B", end="; ")
print()
"""


def check(dirs: dict) -> int:
    def one(item):
        name, d = item
        r = _run([sys.executable, "-c", _CHECK], d, 900, TRITON_INTERPRET="0")
        last = " ".join(r.stdout.split("\n")) if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]
        return name, r.returncode, last
    failed = 0
    with ThreadPoolExecutor(2) as pool:
        for name, rc, last in pool.map(one, dirs.items()):
            print(f"{name:<20} {'ok' if rc == 0 else f'FAILED (rc {rc})'}: {last}", flush=True)
            failed += rc != 0
    return 1 if failed else 0


def _passes(only: str, part: str, *extra) -> list:
    return [sys.executable, str(ROOT / "benchmarks" / "passes.py"), "--only", only, "--parts", part, *extra]


def time_rounds(dirs: dict, only: str, part: str, rounds: int, rep_ms: int) -> tuple[dict, dict]:
    """(ablation, workload) -> [ms per round] of passes.py's part, and -> [the SM clock of each round, MHz]
    (passes.py --clocks: an ablation that leaves shared memory unwritten multiplies zeros, draws less power, and may
    run at a higher clock than main). Every copy is compiled first, in parallel (one
    call each, WARM_S at most: an ablation whose kernel hangs, a protocol it broke, is dropped there). Each time is
    printed as it comes, so that a run cut short by the device's limit still leaves its numbers."""
    line = re.compile(r"^(\S+)\s+" + re.escape(part) + r" ([\d.]+) ms(?:[^|]*?@ (\d+) MHz)?")
    with ThreadPoolExecutor(len(dirs)) as pool:
        warm = dict(zip(dirs, pool.map(lambda d: _run(_passes(only, part, "--calls", "1"), d, WARM_S),
                                       dirs.values())))
    for name, w in warm.items():
        if w.returncode != 0:
            print(f"{name}: FAILED to run (rc {w.returncode}): {w.stderr.strip()[-600:]}", flush=True)
    times, clocks = {}, {}
    for r in range(rounds):
        for name, d in dirs.items():
            if warm[name].returncode != 0:
                continue
            out = _run(_passes(only, part, "--rep-ms", str(rep_ms), "--clocks"), d, 300)
            for text in out.stdout.splitlines():
                m = line.match(text)
                if m:
                    times.setdefault((name, m.group(1)), []).append(float(m.group(2)))
                    if m.group(3):
                        clocks.setdefault((name, m.group(1)), []).append(float(m.group(3)))
                    print(f"round {r + 1}: {name} / {m.group(1)} {m.group(2)} ms"
                          + (f" at {m.group(3)} MHz" if m.group(3) else ""), flush=True)
            if out.returncode != 0:
                print(f"{name}: round {r + 1} rc {out.returncode}: {out.stderr.strip()[-300:]}", flush=True)
    return times, clocks


def table(times: dict, clocks: dict, names, workloads) -> str:
    lines = ["| ablation | removes | " + " | ".join(f"{w} ms (x main)" for w in workloads) + " |",
             "|---|---|" + "---|" * len(workloads)]
    for name in names:
        cells = []
        for w in workloads:
            ms, base = times.get((name, w)), times.get(("main", w))
            if not ms:
                cells.append("failed")
                continue
            med = statistics.median(ms)
            ratio = f" ({med / statistics.median(base):.2f})" if base else ""
            mhz = clocks.get((name, w))
            cells.append(f"{med:.2f}{ratio}" + (f" {statistics.median(mhz):.0f} MHz" if mhz else ""))
        lines.append(f"| {name} | {ABLATIONS[name][0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile(dirs: dict, workloads, part: str, out: Path) -> None:
    """One ncu launch (the part's second dK/dV kernel, or forward kernel) per ablation and workload: its details,
    the tensor-pipe and issue metrics, and the top stall lines, summarized into out/ablate-ncu.txt."""
    summary = []
    for name, d in dirs.items():
        for w in workloads:
            tag = re.sub(r"\W+", "_", f"{name}-{w}")
            rep = out / f"ablate-{tag}"
            r = _run(["ncu", "--set", "full", "--import-source", "no", "--clock-control", "none", "--kernel-name",
                      f"regex:{_KERNEL.get(part, 'hopper_dkdv')}", "--launch-skip", "1", "--launch-count", "1", "-f",
                      "-o", str(rep),
                      *_passes(w, part, "--calls", "2")], d, 400)
            summary.append(f"== {name} / {w} (ncu rc {r.returncode})")
            if r.returncode != 0:
                summary.append(r.stderr.strip()[-600:])
                continue
            report = f"{rep}.ncu-rep"
            details = _run(["ncu", "-i", report, "--page", "details"], d, 120).stdout
            summary += [line.strip() for line in details.splitlines() if _DETAILS.search(line)]
            raw = _run(["ncu", "-i", report, "--page", "raw", "--csv"], d, 120).stdout.splitlines()
            if len(raw) >= 3:  # header, units, one launch
                head, _, row = list(csv.reader(raw[:3]))
                summary += [f"{k} = {v}" for k, v in zip(head, row) if _RAW.search(k)]
            src = out / f"ablate-{tag}.csv"
            src.write_text(_run(["ncu", "-i", report, "--page", "source", "--csv", "--print-source", "sass"], d,
                                300).stdout)
            summary.append(_run([sys.executable, str(ROOT / "scripts" / "ncu_lines.py"), str(src), "12"], d,
                                120).stdout)
            print(summary[-1][:200], flush=True)
    (out / "ablate-ncu.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(summary))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=DEFAULT_WORKLOADS, help="comma-separated D=128 suite workloads")
    p.add_argument("--part", default="one pass", help="passes.py's part to time (default: one pass)")
    p.add_argument("--ablations", help="comma-separated names (default: all; main is always run)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--check", action="store_true", help="compile every ablated one pass for sm_90 (no GPU)")
    p.add_argument("--ncu", action="store_true", help="also profile one launch of each")
    p.add_argument("--out", default=os.environ.get("OUT", "ablate-out"), help="where --ncu's reports go")
    p.add_argument("--list", action="store_true", help="the ablations and what each removes")
    args = p.parse_args(argv)
    if args.list:
        for name, (what, _) in ABLATIONS.items():
            print(f"{name:<20} {what}")
        return 0
    names = ["main"] + [n for n in (args.ablations.split(",") if args.ablations else ABLATIONS) if n != "main"]
    unknown = [n for n in names if n not in ABLATIONS]
    if unknown:
        print(f"unknown ablation(s) {', '.join(unknown)}; --list names them", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="jfa-ablate-") as tmp:
        dirs = build(names, Path(tmp))
        if args.check:
            return check(dirs)
        workloads = args.only.split(",")
        times, clocks = time_rounds(dirs, args.only, args.part, args.rounds, args.rep_ms)
        print(table(times, clocks, names, workloads), flush=True)
        if args.ncu:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            profile(dirs, workloads, args.part, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
