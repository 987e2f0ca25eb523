#!/usr/bin/env bash
# benches/sass_local.sh [REV] — the CUDA kernels' SASS and ptxas reports built here, without a GPU,
# for benches/sass_check.py: registers and spills, local memory, vector accesses the compiler split;
# with REV, the same for git revision REV (a scratch worktree) and the kernels that differ.
#   benches/sass_local.sh            .devbuild/sass/cur: the working tree's kernels, then the report
#   benches/sass_local.sh main       and .devbuild/sass/base (main's), then the differences only
#   NAMES="final_tc mat_tc_h"        limit the report to kernels whose mangled name holds one of these
# The disassembler (cuobjdump, which runs nvdisasm) is not part of the CUDA toolkit installed here:
# the first run fetches NVIDIA's cuobjdump and nvdisasm wheels from PyPI into .devbuild/cutools
# (git-ignored; a development tool, not a dependency of the build). Where PyPI is not reachable
# the script says so and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
TOOLS=.devbuild/cutools
if ! [ -x $TOOLS/bin/cuobjdump ] || ! [ -x $TOOLS/bin/nvdisasm ]; then
  mkdir -p $TOOLS/whl $TOOLS/bin
  python3 -m pip download -q --no-deps -d $TOOLS/whl nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >/dev/null 2>&1 || {
    echo "sass_local.sh: could not fetch the disassembler wheels from PyPI (pip download nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm): no SASS without them" >&2; exit 2; }
  python3 -c "import glob, zipfile; [zipfile.ZipFile(w).extractall('$TOOLS/x') for w in glob.glob('$TOOLS/whl/*.whl')]"
  for t in cuobjdump nvdisasm; do cp "$(find $TOOLS/x -name $t -type f | head -1)" $TOOLS/bin/ && chmod +x $TOOLS/bin/$t; done
fi
export PATH=$PWD/$TOOLS/bin:$PATH   # cuobjdump -sass runs nvdisasm
build() {   # SRC_ROOT OUT_DIR: every kernels/*.cu of SRC_ROOT, each for its target as the Makefile builds it
  mkdir -p "$2"; rm -f "$2"/*.sass "$2"/*.ptxas
  local pids="" f src arch bad=0
  for src in "$1"/kernels/*.cu; do
    f=$(basename "$src" .cu)
    arch=sm_90; case $f in *_wg) arch=sm_90a ;; esac   # the Makefile's WGFLAGS: wgmma is sm_90a's
    ( "$NVCC" -O3 -std=c++17 -gencode arch=compute_${arch#sm_},code=$arch -I"$1/core" -I"$1/kernels" -Xptxas -v \
        -cubin -o "$2/$f.cubin" "$1/kernels/$f.cu" > "$2/$f.ptxas" 2>&1 &&
      $TOOLS/bin/cuobjdump -sass "$2/$f.cubin" > "$2/$f.sass" ) || { echo "sass_local.sh: $1/kernels/$f.cu did not compile or disassemble (see $2/$f.ptxas)" >&2; exit 1; } &
    pids="$pids $!"
  done
  for f in $pids; do wait $f || bad=1; done
  [ $bad = 0 ] || exit 1
}
build . .devbuild/sass/cur
if [ $# -ge 1 ]; then
  WT=$(mktemp -d /tmp/kda_sass.XXXXXX)
  trap 'git worktree remove --force "$WT" >/dev/null 2>&1 || rm -rf "$WT"' EXIT
  git worktree add -f --detach "$WT" "$1" >/dev/null 2>&1
  build "$WT" .devbuild/sass/base
  python3 benches/sass_check.py .devbuild/sass/cur .devbuild/sass/base ${NAMES:-}
else
  python3 benches/sass_check.py .devbuild/sass/cur ${NAMES:-}
fi
