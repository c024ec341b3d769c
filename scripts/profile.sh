#!/usr/bin/env bash
# usage: scripts/profile.sh WORKLOAD PART [KERNEL_REGEX] [SECTIONS...]
# ncu on one launch of the kernels matching KERNEL_REGEX (default: hopper_) while benchmarks/passes.py calls PART
# (one of its part names, e.g. "dkdv+direct dq", "one pass", forward) of the suite's WORKLOAD twice; the first
# matching launch (the input setup's forward, or the first call) is skipped. Default sections: speed of light,
# warp states, scheduler, occupancy, launch, memory. The report in $OUT/ncu-WORKLOAD.txt, a summary printed.
# --clock-control none: the clocks as the benchmarks see them.
set -uo pipefail
source scripts/lib.sh
workload=${1:?usage: scripts/profile.sh WORKLOAD PART [KERNEL_REGEX] [SECTIONS...]}
part=${2:?usage: scripts/profile.sh WORKLOAD PART [KERNEL_REGEX] [SECTIONS...]}
regex=${3:-hopper_}
shift $(( $# < 3 ? $# : 3 ))
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(SpeedOfLight WarpStateStats SchedulerStats Occupancy LaunchStats MemoryWorkloadAnalysis)
args=()
for s in "${sections[@]}"; do args+=(--section "$s"); done
[ -d .venv ] || setup
triton_cache
step 300 ncu --clock-control none --kernel-name "regex:$regex" --launch-skip 1 --launch-count 1 "${args[@]}" \
  $PY benchmarks/passes.py --only "$workload" --parts "$part" --calls 2 > "$OUT/ncu-$workload.txt" 2>&1
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Compute \(SM\) Thr|Memory Throughput|Warp Cycles Per Issued|Issued Warp|No Eligible|Achieved Occupancy|Registers Per|Dynamic Shared|L2 Hit" \
  "$OUT/ncu-$workload.txt" | head -30
