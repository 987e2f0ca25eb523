/* kda_intra_wg.cu — k_intra_tc's fast wide form at the compiled K = V = 128, chunk 64, with W =
 * M Kb and U = M bV on Hopper's warpgroup MMAs (kda_intra.cuh's WG; tf32 operands,
 * kda_wgmma.cuh). Compiled for sm_90a alone (the Makefile's WGFLAGS); the host runs it wherever
 * that form of k_intra_tc would run with the raw v tile staged, on compute capability 9.0,
 * unless KDA_KDA_INTRAWG=0 (kda_cuda.cu use_intra_wg). The forward's flow kernel keeps the
 * mma.sync form.
 *
 * Why: W and U were 3.8k and 3.7k of the kernel's ~40k cycles a block at (8,2048,16,128) on
 * mma.sync (thirty-first pass's `wt` counters), every B fragment a scalar load. Here each is
 * eight m64n32k8 instructions a warpgroup reading both operands from shared memory; the cost is
 * forming Kb and bV transposed (tf32 has no transpose bit: B must be K-major, [d][j]), written
 * two to a bank at most by the lanes' 8 x 4 arrangement, and M's swizzled copy. Everything
 * else is k_intra_tc's code, the same instructions. W's and U's sums run in the tensor cores'
 * order: test_kda_cuda holds this kernel to the CPU reference's tolerances. */
#include "kda_intra.cuh"

__global__ void __launch_bounds__(NTC, 1) k_intra_wg(kp p, const void *v, ws w, int vt, rowin ri, int tab) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if (tab && blockIdx.x == gridDim.x - 1) {       /* the chunk table's column, as k_intra_tc's */
    if (!blockIdx.y) chunk_table(p, gridDim.x - 1, w.ctab, w.sfirst, w.flow);
    return;
  }
  int64_t t0;
  int n;
  chunk_of(p, w, blockIdx.x, tab, &t0, &n);
  if (full_rows<false, 128>(p, n)) intra_tc<false, false, 128, FULL_NF<false, 128>, true>(p, v, w, vt, ri, t0, n, blockIdx.y);
  else intra_tc<false, false, 128, 0, true>(p, v, w, vt, ri, t0, n, blockIdx.y);
#else
  __trap();   /* built for sm_90a only; the host never launches it elsewhere */
#endif
}
intra_tc_fn k_intra_wg_ptr(void) { return k_intra_wg; }
