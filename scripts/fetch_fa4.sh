#!/usr/bin/env bash
# Downloads the FA4 peer (flash-attn-4 on nvidia-cutlass-dsl) as wheels into the git-ignored folder .fa4/,
# for a GPU machine with no network. FA4 is a benchmark peer, never a dependency of jfa.
#
# The wheels are for CPython 3.12 on manylinux x86_64 (the H200 box). The big nvidia-cutlass-dsl-libs-cu13
# wheel is split in two halves (split -n 2) so that each transfer stays under 60 MiB:
#   .fa4/part1/  every other wheel + the first half  (<wheel>.part-aa)
#   .fa4/part2/  the second half                      (<wheel>.part-ab)
# On the GPU machine, put both folders' files in one folder and run scripts/install_fa4.sh on it.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.fa4
PIP=${PIP:-pip}
mkdir -p "$DEST/part1" "$DEST/part2"
PLATFORM_ARGS=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
PKGS=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi torch-c-dlpack-ext
  quack-kernels)
for pkg in "${PKGS[@]}"; do
  echo "fetch_fa4: $pkg"
  # Platform wheels first; a pure-Python package (py3-none-any) is fetched plainly if that fails.
  if ! "$PIP" download -q --no-deps "${PLATFORM_ARGS[@]}" -d "$DEST" "$pkg"; then
    "$PIP" download -q --no-deps -d "$DEST" "$pkg"
  fi
done
rm -f "$DEST"/part1/* "$DEST"/part2/*
for whl in "$DEST"/*.whl; do
  name=$(basename "$whl")
  case "$name" in
    nvidia_cutlass_dsl_libs_cu13-*)
      split -n 2 -d -a 2 "$whl" "$DEST/$name.part-"   # -> .part-00, .part-01
      mv "$DEST/$name.part-00" "$DEST/part1/"
      mv "$DEST/$name.part-01" "$DEST/part2/"
      ;;
    *) cp "$whl" "$DEST/part1/" ;;
  esac
done
du -sh "$DEST/part1" "$DEST/part2"
du -sb "$DEST/part1" "$DEST/part2" | awk '{ if ($1 >= 60 * 1024 * 1024) { print "fetch_fa4: " $2 " is over 60 MiB"; bad = 1 } } END { exit bad }'
ls -l "$DEST/part1" "$DEST/part2"
