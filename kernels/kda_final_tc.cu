/* kda_final_tc.cu — version 2 of the CUDA KDA chunked kernels, the backward's last
 * chunk-parallel kernel, per (chunk, value head), 512 threads: k_bwd_final_tc (the intra-chunk
 * terms, dG, the gate and beta chains, and where H == HV, K <= 128 the l2-norm backward to dq,
 * dk), fast and precise from one template (kda_final.cuh, whose WG form kda_final_wg.cu builds
 * for sm_90a). It runs after kda_tc_bwd.cu's rows and mat kernels (or kda_mat_halves.cu's
 * k_bwd_mat_tc_h, kda_mat_wg.cu's k_bwd_mat_wg) and reads what they leave in the workspace. Its
 * own file because it is the largest kernel (half of the backward's lines, and the one whose
 * compiler settings are tried alone: KFLAGS_kda_final_tc). Shared: kda_tc.cuh. */
#include "kda_final.cuh"

size_t smem_final_tc(int64_t C, int64_t K) {   /* the wide layout: X's rows of r16(K) + 8 */
  int64_t KS = r16(K) + 4;
  return (size_t)(C * KS + (C + 32) * (KS + 4) + 2 * C * (C + 4) + 2 * C + r16(K) + 32 + C * KS + 2 * C) * 4 +
         (size_t)2 * C * (r16(K) + 8) * 2 + (size_t)(C * KS + 16 * final_at_cols((int)C)) * 4;
}
/* The compact layout (CM) for small heads: dA (lower triangle and diagonal) and dL (strictly
 * lower) share one [C][CS] tile, dL's row i in the upper part of row C-1-i (its i entries from
 * column ceil4(C-i), at most C + 3 = CS - 1); dKb stays in global memory. K = 64, chunk 64: 104.7 KB (98.2
 * without the column terms' A tiles, when those read dA's tile by mma_blk4) instead of 141.2,
 * two blocks an SM at 256 threads (128 registers). */
size_t smem_final_tc_compact(int64_t C, int64_t K) {   /* no dL, dKb tiles; X's rows of KS */
  return smem_final_tc(C, K) - (size_t)C * (C + 4) * 4 - (size_t)(C + 32) * 4 * 4 - (size_t)C * (r16(K) + 4) * 4;
}
template <bool PR, bool CM, int KV>
__global__ void __launch_bounds__(NTC, 1) k_bwd_final_tc(kp p, const void *q, const void *k, const void *g,
                                                        const void *beta, const float *A_log, const float *dt_bias,
                                                        void *dg, void *dbeta, void *dq_out, void *dk_out, ws w) {
  /* a compiled shape's full chunk (kv_fix: C = 64) with n = 64 fixed. H200, 2026-12-02s28g: graph
   * (32,512,4,64) 0.456 -> 0.453 ms, (8,512,4,64) 0.147 -> 0.145 (the compact form's spill gone);
   * the large shapes within the rounds' spread (this kernel 1290 -> 1279 us at (8,2048,16,128)) */
  if (full_chunk<PR, KV>(p, w.ctab, blk_chunk(p)))
    bwd_final_tc<PR, CM, KV, FULL_NF<PR, KV>>(p, q, k, g, beta, A_log, dt_bias, dg, dbeta, dq_out, dk_out, w);
  else bwd_final_tc<PR, CM, KV, 0>(p, q, k, g, beta, A_log, dt_bias, dg, dbeta, dq_out, dk_out, w);
}
final_tc_fn k_bwd_final_tc_pick(bool pr, bool cm, int kv) {
  static const final_tc_fn t[2][2][3] = {{KV_SLOTS(k_bwd_final_tc, false, false), KV_SLOTS(k_bwd_final_tc, false, true)},
                                         {KV_SLOTS(k_bwd_final_tc, true, false), KV_SLOTS(k_bwd_final_tc, true, true)}};
  return t[pr][cm][kv_slot(kv)];
}

/* FR (kda_final.cuh): the compact K = V = 64 form forming the rows kernel's products itself */
__global__ void __launch_bounds__(NTC, 1) k_bwd_final_fr(kp p, const void *q, const void *k, const void *g,
                                                        const void *beta, const float *A_log, const float *dt_bias,
                                                        void *dg, void *dbeta, void *dq_out, void *dk_out, ws w,
                                                        const void *dout) {
  if (full_chunk<false, 64>(p, w.ctab, blockIdx.x))   /* chunk-major: kda_final.cuh's cb */
    bwd_final_tc<false, true, 64, 64, false, true>(p, q, k, g, beta, A_log, dt_bias, dg, dbeta, dq_out, dk_out, w, dout);
  else bwd_final_tc<false, true, 64, 0, false, true>(p, q, k, g, beta, A_log, dt_bias, dg, dbeta, dq_out, dk_out, w, dout);
}
final_fr_fn k_bwd_final_fr_ptr(void) { return k_bwd_final_fr; }

#ifdef KDA_PHASES
void kda_phase_take_final(unsigned long long (*c)[KDA_PH_PHASES + 1]) { kda_phase_take(c); }
#endif
