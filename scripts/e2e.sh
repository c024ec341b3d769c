#!/usr/bin/env bash
# usage: scripts/e2e.sh IMPLS [EXAMPLE_ARGS...]
# The GEM-style model (examples/gem_model.py) end to end, once per attention implementation of the comma-separated
# IMPLS (jfa, fa2, fa4, padded; fa4 once its halves have come, see scripts/lib.sh), with the same EXAMPLE_ARGS; each
# run's final JSON line is appended to $OUT/e2e.jsonl. GPUS=N runs it on N GPUs (torchrun, NCCL).
set -uo pipefail
source scripts/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
impls=${1:?usage: scripts/e2e.sh IMPLS [EXAMPLE_ARGS...]}; shift
[ -d .venv ] || setup
triton_cache
fa4
gpus=${GPUS:-1}
if [ "$gpus" -gt 1 ]; then run=($PY -m torch.distributed.run --nproc_per_node "$gpus"); else run=($PY); fi
for attention in ${impls//,/ }; do
  step 240 "${run[@]}" examples/gem_model.py --attention "$attention" --quiet "$@" 2>&1 \
    | grep -E '^\{|Error' | tail -2 | tee -a "$OUT/e2e.jsonl"
done
