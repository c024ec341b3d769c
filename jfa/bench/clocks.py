"""The GPU's SM clock and power draw while a piece of work runs, sampled by nvidia-smi: a GPU at its power limit lowers
its clock, and by how much depends on the operands (tensor cores multiplying zeros draw less), so an ablation that
leaves shared memory unwritten, or a change that moves fewer bytes, can run faster at the same instruction stream.
A time compared without the clock beside it cannot tell the two apart (docs/perf-notes.md).

    with Clocks() as c:
        ms = do_bench(fn)
    print(ms, c.text())          # e.g. "1755 MHz 652 W", or "" where nvidia-smi is absent
"""
from __future__ import annotations

import os
import shutil
import subprocess

QUERY = "clocks.sm,power.draw"


def _gpu_index() -> str:
    """nvidia-smi's index of the device this process uses (the first of CUDA_VISIBLE_DEVICES, else 0)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible if visible.isdigit() else "0"


def parse(text: str) -> tuple[float, float] | None:
    """nvidia-smi's "MHz, W" rows (csv, no header, no units) -> their means; rows it could not read ([N/A], a
    partial last line) are skipped; None without a row."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        try:
            rows.append((float(cells[0]), float(cells[1])))
        except (ValueError, IndexError):
            continue
    if not rows:
        return None
    return sum(r[0] for r in rows) / len(rows), sum(r[1] for r in rows) / len(rows)


class Clocks:
    """A context manager: nvidia-smi samples the SM clock (MHz) and the power draw (W) every PERIOD_MS while the
    block runs; .mean is (MHz, W) after it, None where nvidia-smi is missing or printed nothing readable."""
    PERIOD_MS = 20

    def __init__(self):
        self.mean = None
        self._proc = None

    def __enter__(self):
        tool = shutil.which("nvidia-smi")
        if tool:
            self._proc = subprocess.Popen([tool, f"--id={_gpu_index()}", f"--query-gpu={QUERY}",
                                           "--format=csv,noheader,nounits", "-lms", str(self.PERIOD_MS)],
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            # (nvidia-smi takes ~0.1-0.3 s to start, as long as a part's do_bench: its first row, taken before the
            # block, says it is sampling; that row is not the block's and is left out)
            self._proc.stdout.readline()
        return self

    def __exit__(self, *exc):
        if self._proc is not None:
            self._proc.terminate()
            try:
                out, _ = self._proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                out, _ = self._proc.communicate()
            self.mean = parse(out)
        return False

    def text(self) -> str:
        return "" if self.mean is None else f"{self.mean[0]:.0f} MHz {self.mean[1]:.0f} W"
