#!/usr/bin/env bash
# H200 session, call 2 and 3: install FA4 (half 1 left in /tmp/fa4 by call 1) and run the bench.
# usage: stage2.sh ONLY_WORKLOADS OUTNAME
set -uo pipefail
export PYTHONUNBUFFERED=1
if [ ! -d /tmp/fa4site ]; then
  cp .fa4/part2/* /tmp/fa4/ 2>/dev/null
  bash scripts/install_fa4.sh /tmp/fa4 /tmp/fa4site > $OUT/fa4-install.log 2>&1 || tail -20 $OUT/fa4-install.log
fi
[ -d .venv ] || bash scripts/setup_venv.sh > $OUT/setup.log 2>&1
export PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
.venv/bin/python -c "import flash_attn.cute as f; print('fa4 ok', f.__file__)" 2>&1 | tail -2
timeout 540 .venv/bin/python -m jfa bench --only "$1" --providers jfa,fa2,fa4,flex,sdpa-padded --out $OUT/$2 2>&1 | tee $OUT/$2.log | tail -60
