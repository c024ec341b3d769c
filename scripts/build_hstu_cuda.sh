#!/usr/bin/env bash
# usage: scripts/build_hstu_cuda.sh sources GR_GIT_DIR CUTLASS_GIT_DIR   (any machine: copies the sources)
#        scripts/build_hstu_cuda.sh objects [JOBS]    (any machine, nvcc >= 12.3: 5-6 min a file on 2 cores)
#        scripts/build_hstu_cuda.sh link              (the GPU machine: torch headers, ~2 min;
#                                                      or here: TORCH_SITE, scripts/torch_ext_flags.sh)
# HSTU's CUDA attention kernel (meta-recsys/generative-recommenders ops/cpp/hstu_attention, FA3-based, sm_90a) as a
# benchmark peer: never a dependency, never committed; everything goes to .peers/hstu_cuda (git-ignored).
# Its setup.py is stale (it lists files that no longer exist), so this builds what head dim 128 in bf16 needs: the
# six instantiations (forward softmax false/true, backward softmax false/true x dQ float32/bf16) with CUTLASS at
# the submodule's commit (dc4817921edd, v4.0). The .cu files include no torch header: `objects` compiles them
# anywhere (2 at a time: 7-8 GB of memory each), so the slow part runs on a CPU machine and the objects (a few MB)
# are carried; `link` compiles the four .cpp files (g++) against torch there and links .peers/hstu_cuda/hstu_C.so, which
# registers HSTU's ops (torch.ops.hstu.*) when loaded with torch.ops.load_library.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/.peers/hstu_cuda
src=generative_recommenders/ops/cpp/hstu_attention
features="-DOSS_ENV -DFLASHATTENTION_DISABLE_FP16 -DFLASHATTENTION_DISABLE_FP8 -DFLASHATTENTION_DISABLE_HDIM64"
features="$features -DFLASHATTENTION_DISABLE_HDIM96 -DFLASHATTENTION_DISABLE_HDIM192 -DFLASHATTENTION_DISABLE_HDIM256"
features="$features -DFLASHATTENTION_DISABLE_SM8x"
# what torch.utils.cpp_extension passes nvcc by default (the sources rely on the relaxed constexpr rule)
torch_flags="--expt-relaxed-constexpr --expt-extended-lambda -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__"
torch_flags="$torch_flags -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__"
case "${1:-}" in
  sources)
    mkdir -p "$dir/cutlass"
    git --git-dir="$2" archive HEAD "$src" | tar -x -C "$dir"
    git --git-dir="$3" archive dc4817921edd include | tar -x -C "$dir/cutlass"
    git --git-dir="$2" log -1 --format='generative-recommenders %H %cs' > "$dir/VERSION" ;;
  objects)
    mkdir -p "$dir/obj"
    cd "$dir"
    ls $src/instantiations/flash_{fwd,bwd}_hdim128_bf16_*_sm90.cu | xargs -P "${2:-2}" -I{} sh -c '
      o=obj/$(basename {} .cu).o; [ -s "$o" ] && exit 0
      /usr/bin/time -f "%e s %M KB: {}" nvcc -c {} -o "$o" -O3 -std=c++17 --use_fast_math -lineinfo \
        -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -DCUTLASS_ENABLE_GDC_FOR_SM90 -DCUTLASS_DEBUG_TRACE_LEVEL=0 \
        -DNDEBUG -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC '"$features $torch_flags"' \
        -I'"$(dirname $src)"' -Icutlass/include' ;;
  link)
    cd "$dir"
    source "$root/scripts/torch_ext_flags.sh"  # inc, libs, abi, pyinc, cuda, extra
    for f in flash_api flash_common flash_api_cpu flash_common_cpu; do
      # C++20: flash_api calls get<0>(tuple) unqualified (ADL for explicit template arguments is C++20's) and
      # flash_api_cpu has default arguments nvcc rejects (hence g++)
      [ -s obj/$f.o ] || g++ -c $src/$f.cpp -o obj/$f.o -O3 -std=c++20 -fPIC -D_GLIBCXX_USE_CXX11_ABI=$abi \
        -DTORCH_EXTENSION_NAME=hstu_C -DTORCH_API_INCLUDE_EXTENSION_H $features -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED \
        $inc -I"$pyinc" -I"$cuda/include" $extra -I"$(dirname $src)" -Icutlass/include
    done
    g++ -shared obj/*.o -o hstu_C.so $libs -L"$cuda/lib64" -lc10 -ltorch -ltorch_cpu -ltorch_cuda -lc10_cuda -lcudart
    echo "built $dir/hstu_C.so" ;;
  *) sed -n 2,4p "$0"; exit 2 ;;
esac
