#!/usr/bin/env bash
# Installs the FA4 peer (flash-attn-4 on nvidia-cutlass-dsl) on a machine with no network, from the wheels
# that scripts/fetch_fa4.sh downloaded. FA4 is a benchmark peer only, never a dependency of jfa.
#
#   bash scripts/install_fa4.sh DIR [SITE]
#
# DIR holds the files of .fa4/part1/ and .fa4/part2/ together (the wheels and the two halves
# <cu13 wheel>.part-00 / .part-01); SITE (default: .fa4/site) is where the packages go (pip --target).
# Prints the PYTHONPATH under which `import flash_attn.cute` works; `jfa bench` then finds the fa4 peer.
set -euo pipefail
DIR=${1:?usage: install_fa4.sh DIR [SITE]}
SITE=${2:-.fa4/site}
PY=${PYTHON:-python3}
for first in "$DIR"/*.whl.part-00; do
  [ -e "$first" ] || break
  whl=${first%.part-00}
  if [ ! -e "$whl" ]; then
    cat "$whl".part-* > "$whl"
    echo "install_fa4: assembled $(basename "$whl") from $(ls "$whl".part-* | wc -l) parts"
  fi
done
mkdir -p "$SITE"
SITE=$(cd "$SITE" && pwd)
"$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$DIR"/*.whl
PYPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages"
echo "install_fa4: installed into $SITE"
if PYTHONPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "import flash_attn.cute" 2>/dev/null; then
  echo "install_fa4: flash_attn.cute imports"
else
  echo "install_fa4: warning: flash_attn.cute does not import yet (needs a CUDA torch); try it under the path below"
fi
echo "export PYTHONPATH=$PYPATH\${PYTHONPATH:+:\$PYTHONPATH}"
