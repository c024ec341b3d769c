"""Triton's kernel cache carried between device calls and sessions: a fresh GPU machine compiles every kernel
the GPU suite launches (a Hopper kernel ~30 s; most of the suite's ~600 s of device time), though the kernels
rarely change between two sessions.

    python scripts/triton_cache.py pack OUTDIR [--name triton-cache] [--budget-mb 56] [--part-mb 14]
    python scripts/triton_cache.py unpack DIR
    python scripts/triton_cache.py list DIR

pack (on the device, after the tests): the cache's compiled kernels (binary, metadata, PTX and TTGIR; not the
LLVM IR or the source IR, which no launch reads) and C launchers, newest first while the xz stream stays within
the budget, into OUTDIR/NAME.tar.xz.00, .01, ... (parts under the device tool's 16 MiB a returned file).
unpack (on the device, before the tests): the parts found in DIR into the cache, entries already there kept,
each metadata group's paths pointed at this cache (Triton records absolute paths). Here, between the calls: the
returned parts replace the git-ignored `.triton-cache/`, which the next call carries (scripts/lib.sh's
triton_cache). An entry is keyed by a hash of the kernel's source, options, target, Triton and ptxas, so a
stale one is never used, only carried: a changed kernel compiles afresh.
"""
import argparse
import io
import json
import lzma
import os
import sys
import tarfile
from pathlib import Path

KEEP = {".cubin", ".json", ".ptx", ".ttgir", ".so"}  # what a launch (or jfa's AOT reports) reads back


def cache_dir() -> Path:
    from triton import knobs
    return Path(knobs.cache.dir)


def _entries(root: Path):
    """(directory, files to keep) per cache entry holding a kernel binary or a launcher, newest first."""
    found = []
    for d in root.iterdir():
        if not d.is_dir():
            continue
        files = [f for f in d.iterdir() if f.suffix in KEEP and f.is_file()]
        if any(f.suffix in (".cubin", ".so") for f in files):
            found.append((max(f.stat().st_mtime for f in files), d, files))
    return [(d, files) for _, d, files in sorted(found, key=lambda x: -x[0])]


class _Parts(io.RawIOBase):
    """A write-only stream cut into NAME.NN files of at most part_bytes each."""

    def __init__(self, out: Path, name: str, part_bytes: int):
        self.out, self.name, self.part_bytes = out, name, part_bytes
        self.index, self.file, self.used, self.total = -1, None, 0, 0
        self.paths = []

    def writable(self):
        return True

    def write(self, b) -> int:
        b = bytes(b)
        at = 0
        while at < len(b):
            if self.file is None or self.used == self.part_bytes:
                self._next()
            n = min(len(b) - at, self.part_bytes - self.used)
            self.file.write(b[at:at + n])
            self.used += n
            at += n
        self.total += len(b)
        return len(b)

    def _next(self):
        if self.file:
            self.file.close()
        self.index += 1
        path = self.out / f"{self.name}.{self.index:02d}"
        self.paths.append(path)
        self.file, self.used = open(path, "wb"), 0

    def close(self):
        if self.file:
            self.file.close()
            self.file = None
        super().close()


def pack(out: Path, name: str, budget: int, part_bytes: int) -> int:
    root = cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{name}.tar.xz.*"):
        old.unlink()
    parts = _Parts(out, f"{name}.tar.xz", part_bytes)
    xz = lzma.LZMAFile(parts, "wb", preset=3)  # ~20 MB/s, ~11x on cubins and PTX (preset 6: 4 MB/s, 15x)
    packed = skipped = 0
    with tarfile.open(fileobj=xz, mode="w") as tar:
        for d, files in _entries(root):
            if parts.total >= budget * 0.95:  # (the compressor holds some back: stop short of the budget)
                skipped += 1
                continue
            for f in files:
                tar.add(f, arcname=f"{d.name}/{f.name}")
            packed += 1
    xz.close()
    parts.close()
    size = sum(p.stat().st_size for p in parts.paths)
    print(f"packed {packed} cache entries ({skipped} left out by the budget) from {root} into "
          f"{len(parts.paths)} parts, {size / 2**20:.1f} MiB")
    return 0


def _stream(src: Path, name: str):
    parts = sorted(src.glob(f"{name}.tar.xz.*"))
    if not parts:
        return None
    data = b"".join(p.read_bytes() for p in parts)
    return tarfile.open(fileobj=lzma.LZMAFile(io.BytesIO(data)), mode="r")


def unpack(src: Path, name: str) -> int:
    try:
        entries = _read(src, name)
    except (lzma.LZMAError, tarfile.TarError, EOFError) as e:  # a part missing: compile afresh, no harm
        print(f"{src}'s parts do not read ({type(e).__name__}: {e}): nothing unpacked")
        return 0
    if entries is None:
        print(f"no {name}.tar.xz.* in {src}: nothing to unpack")
        return 0
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    added = kept = 0
    for entry, files in entries.items():
        d = root / entry
        if d.exists():
            kept += 1
            continue
        d.mkdir()
        for fname, data in files.items():
            (d / fname).write_bytes(data)
        for grp in d.glob("__grp__*.json"):  # absolute paths of the packing machine's cache: point them here
            group = json.loads(grp.read_text())
            group["child_paths"] = {c: str(d / Path(p).name) for c, p in group.get("child_paths", {}).items()
                                    if (d / Path(p).name).exists()}
            grp.write_text(json.dumps(group))
        added += 1
    print(f"unpacked {added} cache entries into {root} ({kept} were there)")
    return 0


def _read(src: Path, name: str):
    """{entry: {file name: bytes}} of the parts in src, or None without parts."""
    tar = _stream(src, name)
    if tar is None:
        return None
    entries = {}
    with tar:
        for m in tar:
            if not m.isfile():
                continue
            entry, _, fname = m.name.partition("/")
            if not entry or not fname or "/" in fname or entry.startswith("."):
                raise tarfile.TarError(f"unexpected member {m.name!r}")
            entries.setdefault(entry, {})[fname] = tar.extractfile(m).read()
    return entries


def list_parts(src: Path, name: str) -> int:
    entries = _read(src, name)
    if entries is None:
        print(f"no {name}.tar.xz.* in {src}")
        return 1
    kernels = [Path(f).stem for files in entries.values() for f in files if f.endswith(".cubin")]
    print(f"{len(entries)} entries; kernels: " + ", ".join(f"{k} x{kernels.count(k)}" for k in sorted(set(kernels))))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("verb", choices=["pack", "unpack", "list"])
    p.add_argument("dir", type=Path)
    p.add_argument("--name", default="triton-cache")
    p.add_argument("--budget-mb", type=float, default=56)
    p.add_argument("--part-mb", type=float, default=14)
    args = p.parse_args(argv)
    if args.verb == "pack":
        return pack(args.dir, args.name, int(args.budget_mb * 2**20), int(args.part_mb * 2**20))
    if args.verb == "unpack":
        return unpack(args.dir, args.name)
    return list_parts(args.dir, args.name)


if __name__ == "__main__":
    sys.exit(main())
