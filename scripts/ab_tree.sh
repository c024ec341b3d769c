#!/usr/bin/env bash
# usage: scripts/ab_tree.sh NAME [PATCH ...]
# A tree for scripts/ab.sh: $AB_ROOT/NAME (default .ab/NAME, git-ignored) holds this commit's jfa/ and benchmarks/
# with each PATCH's jfa/ part applied in turn (a file, or the NAME of docs/experiments/NAME.patch; a patch made on top
# of another, as its subject says, comes after it). Carry .ab with the device call. E.g.
#   scripts/ab_tree.sh sdp-dv sdp sdp-dv && scripts/ab.sh .ab/sdp-dv causal-skewed-4k "one pass"
set -euo pipefail
name=${1:?usage: scripts/ab_tree.sh NAME [PATCH ...]}
shift
dir=${AB_ROOT:-.ab}/$name
rm -rf "$dir" && mkdir -p "$dir"
git archive HEAD jfa benchmarks | tar -x -C "$dir"
for patch in "$@"; do
  [ -f "$patch" ] || patch=docs/experiments/$patch.patch
  patch=$(realpath "$patch")
  # (applied as a plain patch in the tree: GIT_DIR keeps git from reading its paths as this repository's)
  (cd "$dir" && GIT_DIR=/nonexistent git apply --include='jfa/*' "$patch")
done
echo "$dir"
