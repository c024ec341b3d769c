# Sourced by the peers' build scripts for their link step (scripts/build_hstu_cuda.sh, build_hstu3_cuda.sh): what a
# torch C++/CUDA extension compiles and links with, from the Python in $PY (default: python):
#   inc, libs    torch's include and library paths as -I / -L flags     abi    its _GLIBCXX_USE_CXX11_ABI
#   pyinc        Python's headers                                        cuda   the CUDA toolkit's root
#   extra        the pip nvidia-* packages' include folders, where torch has them (the ATen CUDA headers want
#                cusparse.h etc.)
# With TORCH_SITE set, from a folder holding the GPU machine's torch wheel and its nvidia-* wheels unpacked
# (torch/include, torch/lib, nvidia/*/include: scripts/torch_site.sh makes one), and PYINC the headers of that
# machine's Python: the link then runs on any machine (no device time), and only the linked .so needs carrying.
if [ -n "${TORCH_SITE:-}" ]; then
  inc="-I$TORCH_SITE/torch/include -I$TORCH_SITE/torch/include/torch/csrc/api/include"
  libs="-L$TORCH_SITE/torch/lib"
  abi=1  # every torch wheel since 2.7 is built with the C++11 ABI
  pyinc=${PYINC:?TORCH_SITE needs PYINC, the include folder of the Python on the GPU machine}
  extra=$(for d in "$TORCH_SITE"/nvidia/*/include; do echo -n "-I$d "; done)
else
  py=${PY:-python}
  inc=$($py -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I' + p for p in include_paths()))")
  libs=$($py -c "from torch.utils.cpp_extension import library_paths; print(' '.join('-L' + p for p in library_paths()))")
  abi=$($py -c "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")
  pyinc=$($py -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  extra=$($py -c "import glob, os, site; print(' '.join('-I' + d for p in site.getsitepackages() for d in glob.glob(os.path.join(p, 'nvidia', '*', 'include'))))")
fi
# the toolkit's root as nvcc itself reports it (nvcc may be a wrapper script elsewhere on PATH), else nvcc's own
cuda=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p')
cuda=$(cd "${cuda:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}" && pwd)
