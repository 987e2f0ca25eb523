#!/bin/sh
# kda_gpu.sh — build (if needed) and run the CUDA KDA test, then the bench.
# Logs go to $OUT (if set, else build/kda_gpu) as kda_test.log, kda_bench.log, kda_ptxas.log,
# kda_attn_peer.log (when python3 has torch). Exit status: the test's.
# Usage: sh benches/kda_gpu.sh        (from the repository root; NVCC, ARCH may be overridden)
set -eu
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCH=${ARCH:-90}
B=build/kda_gpu
LOG=${OUT:-$B}
mkdir -p "$B" "$LOG"
CFLAGS="-std=c11 -O2 -fopenmp -D_GNU_SOURCE -Icore"
NVFLAGS="-std=c++17 -O3 -arch=sm_$ARCH -gencode arch=compute_$ARCH,code=[sm_$ARCH,compute_$ARCH] -Icore -Ikernels"
newer() { [ ! -e "$1" ] || [ -n "$(find core kernels tests/gpu benches -newer "$1" -name '*.[ch]*' 2>/dev/null | head -1)" ]; }
if newer "$B/test_kda_cuda" || newer "$B/kda_bench"; then
  gcc $CFLAGS -c core/kda_ref.c -o "$B/kda_ref.o"
  gcc $CFLAGS -c core/util.c -o "$B/util.o"
  "$NVCC" $NVFLAGS -Xptxas -v -c kernels/kda_cuda.cu -o "$B/kda_cuda.o" 2> "$LOG/kda_ptxas.log"
  grep -E "Compiling entry|Used|spill" "$LOG/kda_ptxas.log" | grep -v "0 bytes spill stores, 0 bytes spill loads" || true
  "$NVCC" $NVFLAGS tests/gpu/test_kda_cuda.cu "$B/kda_cuda.o" "$B/kda_ref.o" "$B/util.o" \
    -Xcompiler -fopenmp -o "$B/test_kda_cuda"
  "$NVCC" $NVFLAGS benches/kda_bench.cu "$B/kda_cuda.o" "$B/kda_ref.o" "$B/util.o" -Xcompiler -fopenmp -o "$B/kda_bench"
fi
rc=0
"$B/test_kda_cuda" 2>&1 | tee "$LOG/kda_test.log" || true
grep -q " 0 failed" "$LOG/kda_test.log" || rc=1
"$B/kda_bench" 2>&1 | tee "$LOG/kda_bench.log" || rc=1
if python3 -c "import torch" 2>/dev/null; then   # the softmax-attention peer, same shapes
  python3 benches/peers/kda_attn_peer.py 2>&1 | tee "$LOG/kda_attn_peer.log" || true
fi
exit $rc
