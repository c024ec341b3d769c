#!/usr/bin/env bash
# 2 x H200, after x2.sh: the fa2 runs (and the model's GPU test) again.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -d .venv ] || bash scripts/setup_venv.sh > $OUT/setup.log 2>&1
PY=.venv/bin/python
timeout 100 $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_integrations.py 2>&1 | tail -2
COMMON="--steps 30 --warmup 5 --batch 128 --max-len 4096 --d-model 512 --heads 4 --layers 2 --quiet"
run() { timeout 120 $PY -m torch.distributed.run --nproc_per_node 2 examples/gem_model.py $COMMON "$@" 2>&1 \
        | grep -E '^\{|Error' | tail -3 | tee -a $OUT/e2e.jsonl; }
run --attention fa2
run --attention fa2 --balance
