#!/usr/bin/env bash
# usage: scripts/e2e.sh [GPUS] [EXAMPLE_ARGS...]
# The GEM-style model (examples/gem_model.py) end to end, once per attention implementation (jfa, fa2, and fa4
# when installed), on GPUS GPUs (default 1; torchrun with NCCL when more); each run's final JSON line is appended
# to $OUT/e2e.jsonl.
set -uo pipefail
source scripts/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=${1:-1}; shift || true
[ -d .venv ] || setup
[ -d /tmp/fa4site ] && export PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages
for attention in jfa fa2 fa4; do
  if [ "$gpus" -gt 1 ]; then run=($PY -m torch.distributed.run --nproc_per_node "$gpus"); else run=($PY); fi
  step 150 "${run[@]}" examples/gem_model.py --attention "$attention" --quiet "$@" 2>&1 \
    | grep -E '^\{|Error' | tail -2 | tee -a "$OUT/e2e.jsonl"
done
