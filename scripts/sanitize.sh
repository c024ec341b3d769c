#!/usr/bin/env bash
# usage: scripts/sanitize.sh [TOOLS]
# compute-sanitizer (default: memcheck and racecheck) on a small case of every Hopper kernel
# (benchmarks/small_case.py); each tool's report in $OUT/sanitizer-TOOL.txt. Known racecheck reports on
# Triton's own warp_specialize state word: docs/hopper.md.
set -uo pipefail
source scripts/lib.sh
[ -d .venv ] || setup
triton_cache
for tool in ${1:-memcheck racecheck}; do
  step 200 compute-sanitizer --tool "$tool" --print-limit 20 $PY benchmarks/small_case.py \
    > "$OUT/sanitizer-$tool.txt" 2>&1
  tail -6 "$OUT/sanitizer-$tool.txt"
done
