#!/usr/bin/env bash
# usage: scripts/build_hstu3_cuda.sh sources FBGEMM_GIT_DIR CUTLASS_GIT_DIR   (any machine: copies the sources)
#        scripts/build_hstu3_cuda.sh objects [JOBS]                           (any machine with nvcc >= 12.3: ~1 min a file)
#        scripts/build_hstu3_cuda.sh link                                     (the GPU machine: torch's CUDA headers;
#                                                                              or here: TORCH_SITE, scripts/torch_ext_flags.sh)
# NVIDIA's HSTU attention kernel for Hopper ("HSTU-3": pytorch/FBGEMM fbgemm_gpu/experimental/hstu, src/hstu_hopper,
# sm_90a) as a benchmark peer: never a dependency, never committed; everything goes to .peers/hstu3_cuda (git-ignored).
# Its setup.py generates one .cu a (dtype, head dim, rab, mask) and the dispatch in hstu_ops_gpu.cpp calls every one
# its HSTU_DISABLE_* defines leave on, so the flags below and the generated set must agree. This builds bf16, head dim
# 128, forward and backward, with causal, context and target on (our workloads: causal; causal + 1-20 targets; causal +
# an 8-row contextual prefix); local is off (window_size (-1, 0) is causal, not local), and arbitrary mask, rab/drab,
# fp16, fp8, deterministic backward and the other head dims are off: 10 instantiations (hstu_{fwd,bwd}_hdim128_bf16
# {,_causal,_causal_context,_causal_target,_causal_context_target}_sm90.cu), CUTLASS at the FBGEMM submodule's commit
# (jwfromm/cutlass 571edeb2d0ac, 4.3.0). The .cu files include no torch header: `objects` compiles them anywhere
# (nvcc 13.0 on a 2-core machine, 2 at a time: 38-78 s and 3.4-4.5 GB each; 4.5 MB of objects), so they are carried;
# `link` compiles hstu_ops_gpu.cpp (ATen/cuda/CUDAContext.h wants cusparse.h) against torch there and links
# .peers/hstu3_cuda/hstu/fbgemm_gpu_experimental_hstu.so, where hstu/library.py loads it on import (with CUDA
# present and fbgemm_gpu absent); it registers torch.ops.fbgemm.hstu_varlen_{fwd,bwd}_90. Use it through
# hstu_attn_varlen_func (an autograd.Function) with PYTHONPATH=.peers/hstu3_cuda, `from hstu import
# hstu_attn_varlen_func`; a direct call of the forward op must pass output_dtype=0 for bf16 (its default -1 gives fp16).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/.peers/hstu3_cuda
src=fbgemm_gpu/experimental/hstu
# the HSTU_DISABLE_* switches (generate_kernels.py reads them from the environment, the sources as defines);
# DETERMINISTIC is setup.py's default
off="DETERMINISTIC LOCAL ARBITRARY RAB DRAB FP16 FP8 HDIM32 HDIM64 HDIM256 86OR89"
features="-DHSTU_ARBITRARY_NFUNC=1"
genenv="HSTU_ARBITRARY_NFUNC=1"
for f in $off; do
  features="$features -DHSTU_DISABLE_$f"; genenv="$genenv HSTU_DISABLE_$f=TRUE"
done
# setup.py's nvcc flags (it undefines torch's __CUDA_NO_HALF*/BFLOAT16* defaults, so none are passed here)
nvcc_flags="-O3 -std=c++17 --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math -DNDEBUG -lineinfo"
case "${1:-}" in
  sources)
    mkdir -p "$dir/cutlass"
    git --git-dir="$2" archive HEAD $src/hstu $src/src/hstu_hopper $src/src/generate_kernels.py $src/setup.py \
      $src/LICENSE | tar -x -C "$dir" --strip-components=3
    rm -f "$dir"/src/hstu_hopper/instantiations/*.cu
    (cd "$dir/src" && env $genenv python3 -c \
      'import generate_kernels as g; g.generate_kernels_hopper("hstu_hopper/instantiations")')
    # CUTLASS at the commit FBGEMM's submodule points to; git archive may say "invalid object ... media/images/...":
    # a large blob outside include/ that the mirror lacks; include/ comes out whole (803 files)
    cutlass=$(git --git-dir="$2" rev-parse HEAD:external/cutlass)
    git --git-dir="$3" archive "$cutlass" include | tar -x -C "$dir/cutlass"
    { git --git-dir="$2" log -1 --format='FBGEMM %H %cs'
      echo "cutlass $(git --git-dir="$3" log -1 --format='%H %cs' "$cutlass") (FBGEMM's external/cutlass, jwfromm/cutlass)"
    } > "$dir/VERSION"
    ls "$dir"/src/hstu_hopper/instantiations/*.cu ;;
  objects)
    mkdir -p "$dir/obj"
    cd "$dir"
    ls src/hstu_hopper/instantiations/hstu_*_sm90.cu | xargs -P "${2:-2}" -I{} sh -c '
      o=obj/$(basename {} .cu).o; [ -s "$o" ] && exit 0
      /usr/bin/time -f "%e s %M KB: {}" nvcc -c {} -o "$o" '"$nvcc_flags"' \
        -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC '"$features"' \
        -Isrc/hstu_hopper -Icutlass/include' ;;
  link)
    cd "$dir"
    source "$root/scripts/torch_ext_flags.sh"  # inc, libs, abi, pyinc, cuda, extra
    # CUDA 13 moved <cuda/std/...> (CUTLASS's) to include/cccl, which nvcc adds itself and g++ must be told
    [ -s obj/hstu_ops_gpu.o ] || g++ -c src/hstu_hopper/hstu_ops_gpu.cpp -o obj/hstu_ops_gpu.o -O3 -std=c++17 -fPIC \
      -D_GLIBCXX_USE_CXX11_ABI=$abi -DTORCH_EXTENSION_NAME=fbgemm_gpu_experimental_hstu -DTORCH_API_INCLUDE_EXTENSION_H \
      $features $inc -I"$pyinc" -I"$cuda/include" -I"$cuda/include/cccl" $extra -Isrc/hstu_hopper -Icutlass/include
    # no -lcuda (setup.py links it): CUTLASS reaches cuTensorMapEncodeTiled through cudaGetDriverEntryPointByVersion
    # (no CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL), and the objects name no cu* driver symbol
    g++ -shared obj/*.o -o hstu/fbgemm_gpu_experimental_hstu.so $libs -L"$cuda/lib64" \
      -lc10 -ltorch -ltorch_cpu -ltorch_cuda -lc10_cuda -lcudart
    echo "built $dir/hstu/fbgemm_gpu_experimental_hstu.so" ;;
  *) sed -n 2,4p "$0"; exit 2 ;;
esac
