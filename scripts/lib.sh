# Shared by the GPU-machine scripts: `source scripts/lib.sh` from the repository root (the device tool's
# working directory); output goes under $OUT (the device tool's folder that comes back), or out/ here.
#   setup              the venv (scripts/setup_venv.sh); its log in $OUT/setup.log; stops the script if it fails
#   step LIMIT CMD...  CMD under a time limit: a warp-specialized kernel with a protocol bug hangs instead of
#                      failing, and timeout ends CMD's whole process group (pytest workers included)
#   fa4                the FA4 peer, when its two halves have come (.fa4/part1 in one call, .fa4/part2 in the
#                      next while the machine is warm: scripts/fetch_fa4.sh): the halves wait in /tmp/fa4, the
#                      install goes to /tmp/fa4site, and PYTHONPATH is set for it
#   triton_cache       Triton's compiled kernels from the carried .triton-cache/ into the machine's cache (a
#                      fresh machine compiles every kernel otherwise: scripts/triton_cache.py; every script here
#                      calls it after setup); pack_triton_cache
#                      writes the cache back into $OUT for the next call (copy the returned triton-cache.tar.xz.*
#                      over .triton-cache/ here)
mkdir -p "${OUT:-out}"
OUT=$(cd "${OUT:-out}" && pwd)
export PYTHONUNBUFFERED=1
PY=.venv/bin/python
setup() { bash scripts/setup_venv.sh > "$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }; }
step() { local limit=$1; shift; timeout -k 10 "$limit" "$@"; local rc=$?
         echo "== rc $rc (limit ${limit}s): $*" | cut -c1-160; return $rc; }
fa4() { mkdir -p /tmp/fa4; cp .fa4/part1/* .fa4/part2/* /tmp/fa4/ 2>/dev/null
        # both halves, in either order of the two calls; a failed install is removed so that the next call retries
        if [ ! -d /tmp/fa4site ] && ls /tmp/fa4/*.part-00 /tmp/fa4/*.part-01 > /dev/null 2>&1; then
          bash scripts/install_fa4.sh /tmp/fa4 /tmp/fa4site > "$OUT/fa4-install.log" 2>&1 ||
            { tail -5 "$OUT/fa4-install.log"; rm -rf /tmp/fa4site; }
        fi
        if [ -d /tmp/fa4site ]; then export PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}; fi; }
triton_cache() { if [ -d .triton-cache ]; then
                   $PY scripts/triton_cache.py unpack .triton-cache || echo "triton_cache: unpack failed"; fi; }
pack_triton_cache() { $PY scripts/triton_cache.py pack "$OUT" || echo "pack_triton_cache: failed"; }
