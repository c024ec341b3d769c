#!/usr/bin/env bash
# Usage: scripts/carry_hstu.sh GIT_DIR
# Puts the HSTU Triton attention kernel of meta-recsys/generative-recommenders (a benchmark peer, never a
# dependency, never committed) into .peers/ (git-ignored), from a git directory of that repository (a local clone,
# or a stored snapshot): only the modules the kernel imports. Carry .peers to the GPU machine; jfa bench's
# "hstu" provider imports it from there (scripts/bench.sh puts .peers on PYTHONPATH).
set -euo pipefail
[ $# -eq 1 ] || { sed -n 2,5p "$0"; exit 2; }
git_dir=$1
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.peers"
files="generative_recommenders/common.py
generative_recommenders/ops/utils.py
generative_recommenders/ops/triton/triton_hstu_attention.py generative_recommenders/ops/triton/triton_attention_utils.py"
git --git-dir="$git_dir" archive HEAD $files | tar -x -C "$root/.peers"
for d in generative_recommenders generative_recommenders/ops generative_recommenders/ops/triton; do
  touch "$root/.peers/$d/__init__.py"  # (packages without an __init__ there)
done
git --git-dir="$git_dir" log -1 --format='generative-recommenders %H %cs' > "$root/.peers/HSTU_VERSION"
cat "$root/.peers/HSTU_VERSION"
