#!/usr/bin/env bash
# usage: scripts/torch_site.sh DIR
# The GPU machine's torch (2.11.0+cu130 for CPython 3.12: PyPI's torch 2.11.0 wheel is that build) unpacked into DIR
# with the CUDA library headers its ATen CUDA headers include (cuda-toolkit 13.0.2's cublas, cusparse, cusolver,
# cudart, curand wheels): torch/include, torch/lib, nvidia/cu13/include. With it, HSTU's CUDA peers link here, at no
# device time, and only their .so files travel (about 2.5 GB in DIR; a minute or two to download):
#   TORCH_SITE=DIR PYINC=<Python 3.12's include/python3.12> bash scripts/build_hstu_cuda.sh link
# (and build_hstu3_cuda.sh link; scripts/torch_ext_flags.sh reads TORCH_SITE and PYINC).
set -euo pipefail
dir=${1:?usage: scripts/torch_site.sh DIR}
mkdir -p "$dir/wheels"
platform=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
pip download -q --no-deps "${platform[@]}" -d "$dir/wheels" torch==2.11.0
pip download -q "${platform[@]}" -d "$dir/wheels" "cuda-toolkit[cublas,cusparse,cusolver,cudart,curand]==13.0.2"
cd "$dir"
unzip -q -o wheels/torch-2.11.0-*.whl 'torch/include/*' 'torch/lib/*' torch/version.py
for w in wheels/nvidia_*.whl; do unzip -q -o "$w" 'nvidia/*/include/*'; done
grep __version__ torch/version.py
