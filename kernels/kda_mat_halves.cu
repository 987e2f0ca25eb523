/* kda_mat_halves.cu — the fast k_bwd_mat_tc's products at K = V = 128 in a layout that fits two
 * blocks an SM (k_bwd_mat_tc_h): dM = strict-tril([dVn | dW] [bV | Kb]^T), dv = b M^T dVn with
 * dbeta's V term, dKb = M^T dW, X = dM M^T, dL = -strict-tril(M^T X). (dA is the rows kernel's.)
 *
 * Why: k_bwd_mat_tc stages every operand at once (~200 KB at K = V = 128) and so runs one block
 * an SM, whose staging waits and barrier-bound products nothing else on the SM overlaps (its
 * staging ~20% of its cycles). The rows kernel went from 30.2k to 16.7k cycles a block an SM
 * when its tiles fit two blocks (docs/kda_passes.md, thirteenth pass). Here the operands come
 * in three rounds through one region R: (1) dVn and v (with M), for dM's V part and dv; (2)
 * and (3) the two 64-column halves of dW and Kb, for dM's K part and dKb's halves; X then
 * takes R. The other block on the SM computes while a block waits for a round. 105.5 KB at
 * C = 64. H200, one run, two rounds (2026-12-02s30a), against k_bwd_mat_tc (dA in the rows
 * kernel in both):
 * fwd+bwd (8,2048,16,128) 3.081-3.111 -> 3.013-3.018 ms, (1,8192,16,128) 1.986-2.003 ->
 * 1.930-1.943; this kernel 578 us there (ncu, alone; k_bwd_mat_tc with dA 690-713 in s29). dA
 * costs the rows kernel ~50 us there, less than summing it here over the dW / Kb rounds did
 * (+73 us, s30b).
 *
 * Same operands (tf32-rounded where staged, as k_bwd_mat_tc's), the same products per output
 * element; dM's sum runs as three fp32 partial sums (V, K half 0, K half 1) added in that
 * order instead of one MMA chain, so dM, dL and everything after differ from k_bwd_mat_tc's in
 * the last bits (test_kda_cuda's thresholds; deterministic). */
#include "kda_tc.cuh"

constexpr int MH_KH = 64;                       /* K columns a round (K = 128: two rounds) */
size_t smem_mat_tc_halves(int64_t C, int64_t K, int64_t V) {
  int64_t CS = C + 4, VS = r16(V) + 4, VB = r16(V) + 8, KHS = MH_KH + 4;
  int64_t r1 = C * VS * 4 + C * VB * 2, r2 = 2 * C * KHS * 4, r4 = C * CS * 4;
  int64_t R = r1 > r2 ? r1 : r2;
  R = R > r4 ? R : r4;
  return (size_t)((3 * C * CS + C + C * mat_ps(V)) * 4 + R);
}

template <int NF>
static __device__ __forceinline__ void bwd_mat_h(kp p, const void *v, void *dv, ws w) {
  kv_fix<128, NTC>(p);
  extern __shared__ __align__(16) float sm[];
  const int *ct = w.ctab + 4 * blk_chunk(p);
  const int n = NF ? NF : ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = blk_head(p), K = p.K, V = p.V, HV = p.HV;
  const int C = p.C, V16 = r16(V), VB = V16 + 8, CS = C + 4, VS = V16 + 4, KHS = MH_KH + 4, PS = mat_ps(V);
  const int64_t r0 = ROWI(0);                      /* the epilogues' rows at 32-bit offsets from it */
  const int RK = (int)(HV * K), RV = (int)(HV * V), RC = (int)HV * C;
  float *Ms = sm, *MsT = Ms + C * CS, *dM = MsT + C * CS, *bs = dM + C * CS, *part = bs + C, *R = part + C * PS;
  float *dVs = R, *X = R, *dWh = R, *Kbh = R + C * KHS;   /* R's rounds: dVn + v, dW + Kb halves, X */
  sbf *Vr = (sbf *)(dVs + C * VS);
  PH_INIT(4);
  /* round 1: M, dVn, raw v, b */
  cp_tile_f32(Ms, CS, C, C, n, C, true, [&](int i) { return w.M + ROWI(i) * C; });
  cp_tile_f32(dVs, VS, C, V16, n, (int)V, true, [&](int i) { return w.dvn + ROWI(i) * V; });
  cp_tile_bf16(Vr, VB, C, V16, n, V, v, t0, HV, h);
  for (int r = threadIdx.x; r < C; r += BT) bs[r] = r < n ? w.b[ROWI(r)] : 0.f;
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  PH(0);
  for (int e = threadIdx.x; e < C * C; e += BT) {  /* M and M^T, tf32 (MMA operands only) */
    int i = e / C, j = e % C;
    float x = tf32r(Ms[i * CS + j]);
    Ms[i * CS + j] = x, MsT[j * CS + i] = x;
  }
  tf32r_tile(dVs, C * VS);
  __syncthreads();
  PH(1);
  /* dM's V part, unrounded fp32: the K halves add to it (each warp owns the same tile in the
   * three products: warp_tiles16 at the same M, N) */
  mma_tf<NPB>(C, C, V16, tft{dVs, VS}, [&](int k, int j) { return tf32r(bs[j] * f(Vr[j * VB + k])); },
                pairs2([&](int i, int j, float x0, float x1) { *(float2 *)(dM + i * CS + j) = make_float2(x0, x1); }));
  /* dv = b (M^T dVn) (tf32) and dbeta's V term (M^T dVn)_j . v_j: a thread's two columns of
   * rows j and j + 8, then its tile row's four lanes (fixed shuffle tree), into part[j][c / 8] */
  auto dv_out = [&](int j, int c, float x0, float x1) {
    if (j < n) st2b((bf16 *)dv + r0 * V + (j * RV + c), bs[j] * x0, bs[j] * x1, true);
  };
  mma_tf<NPB>(C, V16, C, tft{MsT, CS}, [&](int i, int c) { return dVs[i * VS + c]; },
                [&](int j, int c, float x0, float x1, float x2, float x3) {
                  dv_out(j, c, x0, x1), dv_out(j + 8, c, x2, x3);
                  mat_part4(part, PS, j, c >> 3, x0 * f(Vr[j * VB + c]) + x1 * f(Vr[j * VB + c + 1]),
                            x2 * f(Vr[(j + 8) * VB + c]) + x3 * f(Vr[(j + 8) * VB + c + 1]));
                });
  PH(2);
  /* rounds 2, 3: dW, Kb columns [64 hf, 64 hf + 64): dM += dW Kb^T (the last one masks and
   * rounds dM), dKb's columns = M^T dW */
#pragma unroll 1
  for (int hf = 0; hf < 2; hf++) {
    const int d0 = MH_KH * hf;
    __syncthreads();                               /* R's previous round read */
    cp_tile_f32(dWh, KHS, C, MH_KH, n, MH_KH, true, [&](int i) { return w.dW + ROWI(i) * K + d0; });
    cp_tile_f32(Kbh, KHS, C, MH_KH, n, MH_KH, true, [&](int i) { return w.Kb + ROWI(i) * K + d0; });
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    tf32r_tile(dWh, 2 * C * KHS);                  /* dWh, Kbh: one contiguous region */
    __syncthreads();
    PH(3 + hf);
    const bool last = hf == 1;
    mma_tf<NPB>(C, C, MH_KH, tft{dWh, KHS}, tft{Kbh, KHS},
                  pairs2([&](int i, int j, float x0, float x1) {
                    float2 s = *(const float2 *)(dM + i * CS + j);
                    float y0 = s.x + x0, y1 = s.y + x1;
                    if (last) {                    /* strict-tril, tf32 (X's operand) */
                      y0 = j < i && i < n ? tf32r(y0) : 0.f, y1 = j + 1 < i && i < n ? tf32r(y1) : 0.f;
                    }
                    *(float2 *)(dM + i * CS + j) = make_float2(y0, y1);
                  }));
    mma_tf<NPB>(C, MH_KH, C, tft{MsT, CS}, [&](int i, int d) { return dWh[i * KHS + d]; },
                  pairs2([&](int j, int d, float x0, float x1) {
                    if (j < n) st2f(w.dKb + r0 * K + (j * RK + d0 + d), x0, x1, true);
                  }));
  }
  __syncthreads();                                 /* dM complete; R free */
  PH(5);
  /* X = dM M^T (tf32: the dL chain stays close to fp32), then dL = -strict-tril(M^T X) */
  mma_tf<NPB>(C, C, C, tft{dM, CS}, tft{Ms, CS},
                pairs2([&](int i, int j, float x0, float x1) {
                  *(float2 *)(X + i * CS + j) = make_float2(tf32r(x0), tf32r(x1));
                }));
  __syncthreads();
  PH(6);
  mma_tf<NPB>(C, C, C, tft{MsT, CS}, [&](int m, int j) { return X[m * CS + j]; },
                pairs2([&](int i, int j, float x0, float x1) {
                  if (i < n) st2f(w.dL + r0 * C + (i * RC + j), j < i ? -x0 : 0.f, j + 1 < i ? -x1 : 0.f, true);
                }));
  mat_db_rows(part, PS, n, w.db + ROWI(0), HV);   /* dbeta_WY */
  PH(7);
}
/* a full chunk with n = 64 fixed, as k_bwd_mat_tc's */
__global__ void __launch_bounds__(NTC, 2) k_bwd_mat_tc_h(kp p, const void *v, const void *dout, void *dv, ws w) {
  if (full_chunk<false, 128>(p, w.ctab, blk_chunk(p))) bwd_mat_h<FULL_NF<false, 128>>(p, v, dv, w);
  else bwd_mat_h<0>(p, v, dv, w);
}

#ifdef KDA_PHASES
void kda_phase_take_mat(unsigned long long (*c)[KDA_PH_PHASES + 1]) { kda_phase_take(c); }
#endif
