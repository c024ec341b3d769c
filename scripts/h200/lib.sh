# Shared by the H200 run scripts; `source scripts/h200/lib.sh` from the repository root.
# setup: the venv (scripts/setup_venv.sh), its log in $OUT/setup.log, the script stops if it fails.
# step LIMIT CMD...: CMD under a time limit (a deadlocked warp-specialized kernel shows as a timeout instead of
# eating the call), then the processes it left behind (pytest workers, the A/B scripts, the smoke run) are
# killed before the next step. The pattern must not match the output files' names.
setup() { bash scripts/setup_venv.sh > $OUT/setup.log 2>&1 || { tail -30 $OUT/setup.log; exit 1; }; }
step() { local limit=$1; shift; timeout $limit "$@"; local rc=$?
         pkill -9 -f "pytest|benchmarks/ab_|/tmp/smoke.py" 2>/dev/null; sleep 1
         echo "== rc $rc (limit ${limit}s): $*" | cut -c1-160; }
