#!/usr/bin/env bash
# usage: scripts/gpu_tests.sh [LIMIT_SECONDS] [PYTEST_ARGS...]
# The GPU tests (pytest -m gpu) under a time limit (default 300 s), GPU_WORKERS workers (default 14: the 16
# cores compile the kernels); the log in $OUT/gpu-tests.log, each test's seconds in $OUT/gpu-test-times.tsv as it
# ends (tests/conftest.py's --times), summed by test function after the run (scripts/test_times.py), a run cut by
# its limit included. The whole suite (637 tests) no longer fits one call: in two parts it ran 387 + 310 s cold
# on an H100 (14 workers), and whole it stopped at 523 tests after 545 s. Run it in parts,
#   scripts/gpu_tests.sh 570 --shard 1/2     then     scripts/gpu_tests.sh 570 --shard 2/2
# (tests/conftest.py: every test function's cases in one part, the parts the same on every run).
# Triton's cache comes from a carried .triton-cache/ and goes back packed into $OUT (scripts/lib.sh's
# triton_cache): with the kernels compiled in an earlier call, only the changed ones compile.
# PYTHONPATH=.ab/NAME tests that tree's jfa (scripts/ab_tree.sh): pytest runs under python -P, since the checkout's
# own jfa/ would otherwise come first on sys.path (the current directory precedes PYTHONPATH; the editable install
# finds this checkout's jfa where PYTHONPATH is unset).
set -uo pipefail
source scripts/lib.sh
limit=${1:-300}; shift || true
[ -d .venv ] || setup
triton_cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -P -c "import jfa; print('jfa from', jfa.__file__)" | tee -a "$OUT/gpu.txt"
# (--times=PATH in one word: as two words, each xdist worker's first pass, before conftest.py adds the option, took
# PATH, which the controller had created, for a test path; with none named, its rootdir became $OUT, no conftest)
step "$limit" $PY -P -m pytest -q -p no:cacheprovider -m gpu -n "${GPU_WORKERS:-14}" \
  --times="$OUT/gpu-test-times.tsv" "$@" > "$OUT/gpu-tests.log" 2>&1
grep -v "^  \|^$\|Warn" "$OUT/gpu-tests.log" | tail -20
[ -s "$OUT/gpu-test-times.tsv" ] && $PY scripts/test_times.py "$OUT/gpu-test-times.tsv" --top 8
pack_triton_cache
