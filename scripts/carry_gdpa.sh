#!/usr/bin/env bash
# Usage: scripts/carry_gdpa.sh GIT_DIR
# Puts GDPA's Triton kernel (facebookresearch/ads_model_kernel_library gdpa/triton, a benchmark peer: never a
# dependency, never committed) into .peers/ (git-ignored) as the package its absolute imports name
# (ads_mkl.ops.oss.gdpa), from a git directory of that repository (a local clone, or a stored snapshot). Upstream
# triton's JIT rejects the `: object` annotations of its backward kernels' parameters: they are removed here (the
# only edit). Carry .peers to the GPU machine; jfa bench's "gdpa" providers import it from there
# (PYTHONPATH=.peers).
set -euo pipefail
[ $# -eq 1 ] || { sed -n 2,7p "$0"; exit 2; }
git_dir=$1
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/.peers/ads_mkl/ops/oss
mkdir -p "$dest"
git --git-dir="$git_dir" archive HEAD gdpa/triton gdpa/utils | tar -x -C "$dest" --exclude='gdpa/triton/tests'
for d in ads_mkl ads_mkl/ops ads_mkl/ops/oss ads_mkl/ops/oss/gdpa ads_mkl/ops/oss/gdpa/triton ads_mkl/ops/oss/gdpa/utils; do
  touch "$root/.peers/$d/__init__.py"  # (packages without an __init__ there)
done
sed -i -E 's/^(\s+\w+): object,/\1,/' "$dest/gdpa/triton/triton_generalized_dot_product_attention.py"
git --git-dir="$git_dir" log -1 --format='ads_model_kernel_library %H %cs' > "$root/.peers/GDPA_VERSION"
cat "$root/.peers/GDPA_VERSION"
