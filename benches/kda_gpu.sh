#!/bin/sh
# kda_gpu.sh — build (if needed) and run the CUDA KDA test, then the bench, on the H200.
# Builds on the device with its nvcc: kernels/kda_cuda.cu (pipeline, host side), kernels/kda_v1.cu
# (version 1 kernels, decode), kernels/kda_tc.cu, kda_tc_bwd.cu, kda_final_tc.cu and
# kda_state_wide.cu, kda_mat_halves.cu (version 2 tensor-core kernels), kda_state_wg.cu,
# kda_mat_wg.cu, kda_rows_wg.cu and kda_final_wg.cu (their wgmma forms, sm_90a),
# kernels/kda_ops.cu (the backend glue + CUDA conv1d), the CPU reference pieces the test
# compares against (core/kda_ref.c, core/cpu_kda.c, core/util.c).
# Logs go to $OUT (if set, else build/kda_gpu): kda_ptxas.log (registers/spills/smem per
# kernel), kda_sass.log (HMMA count), kda_test.log (both paths + exec nodes), kda_bench.log
# (version 2), kda_bench_simple.log (version 1, KDA_KDA_SIMPLE=1), kda_attn_peer.log (when
# python3 has torch). Also builds kda_bench_phases (the bench with the kernels' phase timers,
# -DKDA_PHASES; benches/device_run.sh profile runs it): the phase objects (*_phases.o) of
# kda_tc, kda_tc_bwd, kda_final_tc, kda_mat_halves, kda_state_wide and kda_final_wg (sm_90a: on
# compute capability 9.0 the host runs k_bwd_final_wg, its row "bwd_final_wg"). Exit status: non-zero if the test fails
# or a bench crashes.
# Usage: sh benches/kda_gpu.sh        (from the repository root; NVCC, ARCH may be overridden)
# ARCH=80 BUILD_ONLY=1 sh benches/kda_gpu.sh builds the sm_80 path (the wgmma files stay sm_90a):
# the check that it still compiles, ~2 min here (session 57).
set -eu
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCH=${ARCH:-90}
B=build/kda_gpu
LOG=${OUT:-$B}
mkdir -p "$B" "$LOG"
CFLAGS="-std=c11 -O2 -fopenmp -D_GNU_SOURCE -Icore"
NVFLAGS="-std=c++17 -O3 -lineinfo -gencode arch=compute_$ARCH,code=[sm_$ARCH,compute_$ARCH] -Icore -Ikernels"   # -lineinfo: ncu's source view (no code change)
WGFLAGS="-std=c++17 -O3 -lineinfo -gencode arch=compute_90a,code=sm_90a -Icore -Ikernels"   # kda_state_wg.cu: wgmma is sm_90a's
newer() { [ ! -e "$1" ] || [ -n "$(find core kernels tests/gpu benches -newer "$1" -name '*.[ch]*' 2>/dev/null | head -1)" ]; }
if newer "$B/test_kda_cuda" || newer "$B/kda_bench" || newer "$B/kda_bench_phases"; then
  # two compile streams side by side (the two largest units lead them; ~half the time on two
  # cores), each nvcc's ptxas report into a log of its own, joined in a fixed order after
  nv() { "$NVCC" $NVFLAGS "$@"; }
  # KFLAGS_<file>: extra options for one kernel file, as the Makefile's (a flag change alone does
  # not make this build stale: kda_baseline.sh builds each side in a fresh worktree)
  kf() { eval "echo \"\${KFLAGS_$1:-}\""; }
  obj() { nv $(kf $1) -Xptxas -v -c "kernels/$1.cu" -o "$B/$1.o" 2> "$B/$1.ptxas"; }
  ph() { nv $(kf $1) -DKDA_PHASES -c "kernels/$1.cu" -o "$B/$1_phases.o"; }
  ( obj kda_final_tc && ph kda_final_tc && obj kda_tc_bwd && ph kda_tc_bwd && obj kda_ops && obj kda_mat_halves && ph kda_mat_halves ) & s1=$!
  ( obj kda_tc && ph kda_tc && obj kda_cuda && obj kda_v1 &&
    obj kda_state_wide && "$NVCC" $WGFLAGS $(kf kda_state_wg) -Xptxas -v -c kernels/kda_state_wg.cu -o "$B/kda_state_wg.o" 2> "$B/kda_state_wg.ptxas" &&
    "$NVCC" $WGFLAGS $(kf kda_mat_wg) -Xptxas -v -c kernels/kda_mat_wg.cu -o "$B/kda_mat_wg.o" 2> "$B/kda_mat_wg.ptxas" &&
    "$NVCC" $WGFLAGS $(kf kda_rows_wg) -Xptxas -v -c kernels/kda_rows_wg.cu -o "$B/kda_rows_wg.o" 2> "$B/kda_rows_wg.ptxas" &&
    "$NVCC" $WGFLAGS $(kf kda_final_wg) -Xptxas -v -c kernels/kda_final_wg.cu -o "$B/kda_final_wg.o" 2> "$B/kda_final_wg.ptxas" &&
    "$NVCC" $WGFLAGS $(kf kda_final_wg) -DKDA_PHASES -c kernels/kda_final_wg.cu -o "$B/kda_final_wg_phases.o" &&
    "$NVCC" $WGFLAGS tests/gpu/test_wgmma.cu -o "$B/test_wgmma" && ph kda_state_wide && gcc $CFLAGS -c core/kda_ref.c -o "$B/kda_ref.o" && gcc $CFLAGS -c core/util.c -o "$B/util.o" &&
    gcc $CFLAGS -c core/cpu_kda.c -o "$B/cpu_kda.o" ) & s2=$!
  ok=0; wait $s1 || ok=1; wait $s2 || ok=1
  for u in kda_cuda kda_v1 kda_tc kda_tc_bwd kda_final_tc kda_state_wide kda_state_wg kda_mat_wg kda_rows_wg kda_final_wg kda_mat_halves kda_ops; do cat "$B/$u.ptxas" 2>/dev/null; done > "$LOG/kda_ptxas.log"
  [ $ok = 0 ] || { grep -E "error" "$LOG/kda_ptxas.log" | head; echo "kda_gpu.sh: a compile failed" >&2; exit 1; }
  grep -E "Compiling entry|Used|spill" "$LOG/kda_ptxas.log" | grep -v "0 bytes spill stores, 0 bytes spill loads" || true
  O="$B/kda_cuda.o $B/kda_v1.o $B/kda_state_wide.o $B/kda_state_wg.o $B/kda_mat_wg.o $B/kda_rows_wg.o $B/kda_final_wg.o $B/kda_ref.o $B/util.o"
  F="$B/kda_tc.o $B/kda_tc_bwd.o $B/kda_final_tc.o $B/kda_mat_halves.o"
  nv tests/gpu/test_kda_cuda.cu $O $F "$B/kda_ops.o" "$B/cpu_kda.o" -Xcompiler -fopenmp -o "$B/test_kda_cuda" & s1=$!
  nv benches/kda_bench.cu $O $F -Xcompiler -fopenmp -o "$B/kda_bench"
  # kda_bench_phases: the same bench with the kernels' phase timers compiled in (-DKDA_PHASES)
  # (kda_final_wg_phases.o: k_bwd_final_wg's counters, which kda_tc.cu's report takes)
  OP="$B/kda_cuda.o $B/kda_v1.o $B/kda_state_wide_phases.o $B/kda_state_wg.o $B/kda_mat_wg.o $B/kda_rows_wg.o $B/kda_final_wg_phases.o $B/kda_ref.o $B/util.o"
  nv benches/kda_bench.cu $OP "$B/kda_tc_phases.o" "$B/kda_tc_bwd_phases.o" "$B/kda_final_tc_phases.o" "$B/kda_mat_halves_phases.o" -Xcompiler -fopenmp -o "$B/kda_bench_phases"
  wait $s1
fi
if command -v cuobjdump >/dev/null 2>&1 || [ -x "$(dirname "$NVCC")/cuobjdump" ]; then
  CUOBJ=$(command -v cuobjdump || echo "$(dirname "$NVCC")/cuobjdump")
  { echo "HMMA per kernel (version 2 kernels must show HMMA.16816.F32.BF16 / HMMA.1684.F32.TF32):"
    for o in "$B/kda_tc.o" "$B/kda_tc_bwd.o" "$B/kda_final_tc.o" "$B/kda_state_wide.o"; do "$CUOBJ" --dump-sass "$o"; done | awk '/Function :/ {f=$3} /HMMA/ {n[f]++} END {for (k in n) print n[k], k}'
  } > "$LOG/kda_sass.log" 2>&1 || true
  cat "$LOG/kda_sass.log"
fi
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0   # BUILD_ONLY=1: the binaries, nothing run
rc=0
# KDA_CUDA_SYNC-style safety: the test synchronises after every case itself.
"$B/test_wgmma" 2>&1 | tee "$LOG/wgmma_test.log" || true   # the wgmma layouts (kda_state_wg.cu; H100 / H200, else skipped)
grep -q " 0 failed" "$LOG/wgmma_test.log" || rc=1
timeout 500 "$B/test_kda_cuda" 2>&1 | tee "$LOG/kda_test.log" || true
grep -q " 0 failed" "$LOG/kda_test.log" || rc=1
timeout 300 "$B/kda_bench" 2>&1 | tee "$LOG/kda_bench.log" || rc=1
KDA_KDA_SIMPLE=1 timeout 300 "$B/kda_bench" 2>&1 | tee "$LOG/kda_bench_simple.log" || rc=1
if python3 -c "import torch" 2>/dev/null; then   # the softmax-attention peer, same shapes
  timeout 200 python3 benches/peers/kda_attn_peer.py 2>&1 | tee "$LOG/kda_attn_peer.log" || true
fi
exit $rc
