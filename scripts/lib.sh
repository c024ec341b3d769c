# Shared by the GPU-machine scripts: `source scripts/lib.sh` from the repository root (the device tool's
# working directory); output goes under $OUT (the device tool's folder that comes back), or out/ here.
#   setup              the venv (scripts/setup_venv.sh); its log in $OUT/setup.log; stops the script if it fails
#   step LIMIT CMD...  CMD under a time limit: a warp-specialized kernel with a protocol bug hangs instead of
#                      failing, and timeout ends CMD's whole process group (pytest workers included)
mkdir -p "${OUT:-out}"
OUT=$(cd "${OUT:-out}" && pwd)
export PYTHONUNBUFFERED=1
PY=.venv/bin/python
setup() { bash scripts/setup_venv.sh > "$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }; }
step() { local limit=$1; shift; timeout -k 10 "$limit" "$@"; local rc=$?
         echo "== rc $rc (limit ${limit}s): $*" | cut -c1-160; return $rc; }
