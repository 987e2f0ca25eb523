/* kda_tc_bwd.cu — version 2 of the CUDA KDA chunked kernels, backward half: the
 * chunk-parallel kernels after the backward state pass, per (chunk, value head), 512 threads:
 * k_bwd_rows_tc (the contractions over V with the chunk's entering state and its gradient) and
 * k_bwd_mat_tc (the WY part: dA, dM -> dL, dv, dKb, dbeta), each with its precise twin from the
 * same template; and the kept fast reverse sweep with two tile sets (k_state_bwd_tc_db), alone
 * and with the rows kernel as one grid (k_bwd_flow). The last kernel, k_bwd_final_tc, is
 * kda_final_tc.cu's. Shared with kda_tc.cu (intra and state passes): kda_tc.cuh, and the state
 * passes' helpers kda_state.cuh. */
#include "kda_tc.cuh"
#include "kda_state.cuh"

/* ---- v2 backward, chunk-parallel ----------------------------------------------------------- */
/* The rows and mat kernels' fast products pair a warp's tiles (NPB, kda_tc.cuh) */
/* The contractions over V: dQ = dO S0^T, dKi = Vn dSe^T, dW = -dVn S0^T (k_bwd_final_tc applies
 * dQ's s e^G and dKi's e^{Gn-G}: it stages G anyway, and without G this kernel's tiles fit two
 * blocks an SM at K = V = 128), and dgn = rowsum_V(S0 . dSe). Staging is all cp.async, in the
 * inputs' own types.
 * The fast variant (k_bwd_rows_tc) reads the state passes' bf16 copies of S0, dS, Vn and dVn
 * (st_keep, st_vn_tc, st_dvn: the RN shadows its products take as operands): S0, dS [K16][VB],
 * dVn, dO [C][VB], and Vn [C][VB] in a tile of its own staged with the first copies (vn) where
 * that costs no second block an SM, else into dVn's tile once the dW product is done with it;
 * dgn is summed from the bf16 S0, dS tiles in fp32. 102 KB at K = V = 128, two blocks an SM;
 * with fp32 S0, dS, Vn, dVn and G (until 2026-12-01) it read ~250 KB a block and fit one.
 * After the two-tile-set reverse sweep, which writes no bf16 dVn (dvf), dVn is staged fp32
 * [C][VS] and turned bf16 in place (H200: (1,8192,16,128) 2.33 -> 2.31 ms against that sweep
 * writing the bf16 copy as well).
 * The precise one (k_bwd_rows_tc_p) stages fp32 R1 [K16][VS] S0, R2 [C][VS] dVn then Vn, bf16
 * dO [C][VB]; dS in its own tile R3 [K16][VS] with the first copies when it fits (sep,
 * smem_rows_tc_sep), so that dgn is summed from shared memory while Vn streams in; otherwise
 * into R1 after the S0 products, dgn read from global (rows_dgn). Its products run in P_3TF32
 * (dO, a bf16 input, is exact in tf32: P_3TF32A). */
size_t smem_rows_tc(int64_t C, int64_t K, int64_t V) {   /* the precise layout, dS sharing R1 */
  return (size_t)((r16(K) + C) * (r16(V) + 4)) * 4 + (size_t)C * (r16(V) + 8) * 2;
}
size_t smem_rows_tc_sep(int64_t C, int64_t K, int64_t V) {   /* with the separate dS tile R3 */
  return smem_rows_tc(C, K, V) + (size_t)r16(K) * (r16(V) + 4) * 4;
}
size_t smem_rows_tc_fast(int64_t C, int64_t K, int64_t V, int vn, int dvf) {   /* vn: Vn's own tile */
  return (size_t)((2 * r16(K) + (dvf ? 0 : C) + C + (vn ? C : 0)) * (r16(V) + 8)) * 2 +
         (size_t)(dvf ? C * (r16(V) + 4) * 4 : 0);
}
/* dgn[d] = sum_c S0[d,c] dS[d,c] in fp32 from global: one warp per row, fixed shuffle tree;
 * a warp takes 4 rows at once (a lane's 32 loads in flight), each row summed in the same order */
static __device__ __forceinline__ void rows_dgn(const kp &p, const ws &w, int chunk, int64_t h, const float *gS0,
                                                const float *gdS) {
  int64_t K = p.K, V = p.V, HV = p.HV;
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  constexpr int RB = 4;
  const int NW = BT / 32;
  for (int64_t d0 = wp; d0 < K; d0 += RB * NW) {
    float acc[RB] = {};
    for (int64_t cb = 0; cb < V; cb += 128) {
      float a[RB][4], b[RB][4];
#pragma unroll
      for (int r = 0; r < RB; r++)
#pragma unroll
        for (int u = 0; u < 4; u++) {
          int64_t d = d0 + r * NW, c = cb + lane + 32 * u;
          bool ok = d < K && c < V;
          a[r][u] = ok ? gS0[d * V + c] : 0.f, b[r][u] = ok ? gdS[d * V + c] : 0.f;
        }
#pragma unroll
      for (int r = 0; r < RB; r++)
#pragma unroll
        for (int u = 0; u < 4; u++)
          if (cb + lane + 32 * u < V) acc[r] += a[r][u] * b[r][u];
    }
#pragma unroll
    for (int r = 0; r < RB; r++) {
      float x = acc[r];
      x = kc_warp_sum(x);
      int64_t d = d0 + r * NW;
      if (!lane && d < K) w.dgn[((int64_t)chunk * HV + h) * K + d] = x;
    }
  }
}
/* the same sums from the staged fp32 tiles (R1 = S0, R3 = dS, rows of VS; zero past V): the
 * same per-lane order (blocks of 128 columns, lane + 32 u) and shuffle tree as rows_dgn, so
 * bit-identical to it */
static __device__ __forceinline__ void rows_dgn_smem(const kp &p, const ws &w, int chunk, int64_t h, const float *R1,
                                                     const float *R3, int VS) {
  int64_t K = p.K, V = p.V;
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  for (int d = wp; d < K; d += BT / 32) {
    float acc = 0.f;
    for (int cb = 0; cb < V; cb += 128)
#pragma unroll
      for (int u = 0; u < 4; u++) {
        int c = cb + lane + 32 * u;
        if (c < V) acc += R1[d * VS + c] * R3[d * VS + c];
      }
    acc = kc_warp_sum(acc);
    if (!lane) w.dgn[((int64_t)chunk * p.HV + h) * K + d] = acc;
  }
}
/* rows r < R of an fp32 tile [.][ld] become bf16 (RN) in place: row r's bf16 copy starts at
 * its fp32 row, so the bf16 tile has a pitch of 2 ld elements (ld = 8 mod 32 floats keeps
 * ldmatrix conflict-free). A warp converts whole rows, reading a row into registers before
 * writing it (the two overlap); cols <= 512, cols % 4 == 0 */
static __device__ __forceinline__ void rows_to_bf16(float *t, int R, int ld, int cols) {
  int lane = threadIdx.x & 31;
  for (int r = threadIdx.x >> 5; r < R; r += BT / 32) {
    float4 x[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
      if (4 * lane + 128 * u < cols) x[u] = *(const float4 *)(t + r * ld + 4 * lane + 128 * u);
    __syncwarp();
    __nv_bfloat162 *o = (__nv_bfloat162 *)(t + r * ld);
#pragma unroll
    for (int u = 0; u < 4; u++)
      if (4 * lane + 128 * u < cols) {
        int c2 = 2 * lane + 64 * u;
        o[c2] = __floats2bfloat162_rn(x[u].x, x[u].y), o[c2 + 1] = __floats2bfloat162_rn(x[u].z, x[u].w);
      }
  }
}
/* lay: the host's layout choice, ROWS_SEP (precise: dS in a tile of its own), ROWS_VN (fast: Vn
 * in a tile of its own), ROWS_DVF (fast: dVn from its fp32 copy), ROWS_FR (fast: the final
 * kernel forms dQ, dKi, dgn and dA itself, k_bwd_final_fr: this kernel stages S0 and dVn and
 * forms dW alone, the mat kernel's; where the mat kernel forms that too, none runs) */
template <bool PR, int KV>
static __device__ __forceinline__ void bwd_rows_tc(kp p, const void *dout, ws w, int lay, int cb, int64_t h) {
  constexpr int PA = PR ? P_3TF32A : P_BF16, PX = PR ? P_3TF32 : P_BF16;
  kv_fix<KV, NTC>(p);
  extern __shared__ __align__(16) float sm[];
  const int *ct = w.ctab + 4 * cb;
  int n = ct[2];
  if (!n) return;
  int64_t t0 = ct[1], K = p.K, V = p.V, HV = p.HV;
  int C = p.C, K16 = r16(K), V16 = r16(V), VS = V16 + 4, VB = V16 + 8;
  /* each epilogue stores a row's two adjacent outputs at once (pairs2; st2f one by one where K
   * is odd), at 32-bit row offsets as k_intra_tc's (a wash here, s39h: one way to address rows) */
  const int64_t r0 = ROWI(0);
  const int RK = (int)(HV * K), RC = (int)HV * C;
  auto dq_out = [&](int i, int d, float x0, float x1) {
    if (i < n && d < K) st2f(w.dQ + r0 * K + (i * RK + d), x0, x1, d + 1 < K);
  };
  auto dw_out = [&](int i, int d, float x0, float x1) {
    if (i < n && d < K) st2f(w.dW + r0 * K + (i * RK + d), -x0, -x1, d + 1 < K);
  };
  auto dki_out = [&](int i, int d, float x0, float x1) {
    if (i < n && d < K) st2f(w.dKi + r0 * K + (i * RK + d), x0, x1, d + 1 < K);
  };
  PH_INIT(3);
  if constexpr (!PR) {
    /* dvf: dVn from its fp32 copy (the two-tile-set reverse sweep writes no bf16 one: its steps
     * are the long sequential chain of the shapes it serves), staged into an fp32 tile [C][VS]
     * and turned bf16 in place (pitch 2 VS) */
    const bool vnx = lay & ROWS_VN, dvf = lay & ROWS_DVF, fr = lay & ROWS_FR;
    const int DV = dvf ? 2 * VS : VB;              /* dVn's bf16 pitch */
    sbf *dVn = (sbf *)sm, *S0 = dvf ? (sbf *)(sm + C * VS) : dVn + C * VB, *dS = S0 + K16 * VB, *dO = dS + K16 * VB;
    sbf *Vn = vnx ? dO + C * VB : dVn;
    int64_t sr = ((int64_t)cb * HV + h) * K;       /* the chunk's states, in rows of V */
    cp_tile_bf16(S0, VB, K16, V16, (int)K, V, w.h, sr, 1, 0);
    if (dvf) cp_tile_f32(sm, VS, C, V16, n, (int)V, V % 4 == 0, [&](int i) { return w.dvn + ROWI(i) * V; });
    else cp_tile_bf16(dVn, VB, C, V16, n, V, w.dvnb, t0, HV, h);
    if (!fr) {
      cp_tile_bf16(dO, VB, C, V16, n, V, dout, t0, HV, h);
      cp_tile_bf16(dS, VB, K16, V16, (int)K, V, w.dh, sr, 1, 0);
    }
    if (vnx && !fr) {
      cp_async_commit();
      cp_tile_bf16(Vn, VB, C, V16, n, V, w.vn, t0, HV, h);
      cp_async_commit();
      cp_async_wait_group<1>();                    /* all but Vn */
    } else cp_async_wait_all();
    __syncthreads();
    PH(0);
    if (!fr) dgn_rows_b(w.dgn + sr, K, V, S0, dS, VB);
    if (dvf) {
      rows_to_bf16(sm, C, VS, V16);
      __syncthreads();
    }
    PH(1);
    if (!fr) mma_ldm<NPB>(C, K16, bt{dO, VB, 1}, bt{S0, VB, 1}, V16, bt{}, bt{}, 0, pairs2(dq_out));   /* dQ = dO S0^T */
    PH(2);
    mma_ldm<NPB>(C, K16, bt{dVn, DV, 1}, bt{S0, VB, 1}, V16, bt{}, bt{}, 0, pairs2(dw_out));   /* dW = -dVn S0^T */
    if (!fr) {                                     /* ROWS_FR: dW alone */
      if (!vnx) {
        __syncthreads();                           /* every warp done with dVn */
        cp_tile_bf16(Vn, VB, C, V16, n, V, w.vn, t0, HV, h);
      }
      cp_async_wait_all();
      __syncthreads();
      PH(3);
      mma_ldm<NPB>(C, K16, bt{Vn, VB, 1}, bt{dS, VB, 1}, V16, bt{}, bt{}, 0, pairs2(dki_out));   /* dKi = Vn dS^T */
      /* dA = s tril(dO Vn^T) (bf16), the fast mat kernel's before: both operands are staged here
       * already (the same bf16 tiles, the same k order: the same dA), and the mat kernel then
       * stages neither. Only the final kernel reads it */
      auto da_out = [&](int i, int j, float x0, float x1) {
        auto v = [&](int jj, float x) { return jj <= i && jj < n ? p.scale * x : 0.f; };
        if (i < n) st2f(w.dA + r0 * C + (i * RC + j), v(j, x0), v(j + 1, x1), true);
      };
      mma_ldm<NPB>(C, C, bt{dO, VB, 1}, bt{Vn, VB, 1}, V16, bt{}, bt{}, 0, pairs2(da_out));
    }
  } else {
    float *R1 = sm, *R2 = R1 + K16 * VS;
    sbf *dO = (sbf *)(R2 + C * VS);
    const bool sep = lay & ROWS_SEP;
    float *R3 = sep ? (float *)(dO + C * VB) : R1;
    const float *gS0 = w.h + ((int64_t)cb * HV + h) * K * V;
    const float *gdS = w.dh + ((int64_t)cb * HV + h) * K * V;
    bool al = V % 4 == 0;
    cp_tile_f32(R1, VS, K16, V16, (int)K, (int)V, al, [&](int d) { return gS0 + (int64_t)d * V; });
    cp_tile_f32(R2, VS, C, V16, n, (int)V, al, [&](int i) { return w.dvn + ROWI(i) * V; });
    cp_tile_bf16(dO, VB, C, V16, n, V, dout, t0, HV, h);
    if (sep) cp_tile_f32(R3, VS, K16, V16, (int)K, (int)V, al, [&](int d) { return gdS + (int64_t)d * V; });
    PH(0);
    if (!sep) rows_dgn(p, w, cb, h, gS0, gdS);
    cp_async_wait_all();
    __syncthreads();
    PH(1);
    auto s0t = [&](int c, int d) { return R1[d * VS + c]; };   /* S0^T */
    mma_blk4<PA>(C, K16, V16, [&](int i, int c) { return f(dO[i * VB + c]); }, s0t, pairs2(dq_out));
    PH(2);
    mma_blk4<PX>(C, K16, V16, [&](int i, int c) { return R2[i * VS + c]; }, s0t, pairs2(dw_out));
    __syncthreads();                               /* dVn (and without sep S0) read by every warp */
    if (!sep) cp_tile_f32(R3, VS, K16, V16, (int)K, (int)V, al, [&](int d) { return gdS + (int64_t)d * V; });
    cp_tile_f32(R2, VS, C, V16, n, (int)V, al, [&](int i) { return w.vn + ROWI(i) * V; });
    if (sep) rows_dgn_smem(p, w, cb, h, R1, R3, VS);   /* while Vn streams in */
    cp_async_wait_all();
    __syncthreads();
    PH(3);
    mma_blk4<PX>(C, K16, V16, [&](int i, int c) { return R2[i * VS + c]; },
                 [&](int c, int d) { return R3[d * VS + c]; }, pairs2(dki_out));
  }
  PH(4);
}
template <bool PR, int KV>
__global__ void __launch_bounds__(NTC) k_bwd_rows_tc(kp p, const void *dout, ws w, int lay) {
  bwd_rows_tc<PR, KV>(p, dout, w, lay, blk_chunk(p), blk_head(p));
}
rows_tc_fn k_bwd_rows_tc_pick(bool pr, int kv) {
  static const rows_tc_fn t[2][3] = {KV_SLOTS(k_bwd_rows_tc, false), KV_SLOTS(k_bwd_rows_tc, true)};
  return t[pr][kv_slot(kv)];
}

/* ---- the kept fast reverse sweep with two tile sets, alone and with the rows kernel -------- */
size_t smem_state_bwd_tc_db(int64_t C, int64_t K, int bv, int ns) {
  int64_t KB = r16(K) + 8, CB = C + 8, DB = bv + 8;
  return smem_state_tc(C, K, 0, bv) + (size_t)(ns - 1) * (3 * C * KB + C * CB + C * DB) * 2;
}
template <int KV, int NV = BVT>
__global__ void __launch_bounds__(NTC, 1) k_state_bwd_tc_db(kp p, ws w, const void *dout, const float *dht,
                                                           float *dh0) {
  state_bwd_db<KV, NV, db_sets(KV, NV)>(p, w, dout, dht, dh0, blockIdx.x, nullptr);
}
state_bwd_db_fn k_state_bwd_tc_db_pick(int kv, int bv) {
  static const state_bwd_db_fn t[2][3] = {KV_SLOTS1(k_state_bwd_tc_db),
                                          {k_state_bwd_tc_db<0, BVN>, k_state_bwd_tc_db<64, BVN>, k_state_bwd_tc_db<128, BVN>}};
  return t[bv == BVN][kv_slot(kv)];
}
/* The backward's flow kernel: k_state_bwd_tc_db and the fast k_bwd_rows_tc as one grid, as
 * k_fwd_flow does for the forward (kda_tc.cu: roles by start order, so every block a waiting
 * block waits for is resident; here the state blocks produce and never wait). Each of a head's
 * nz state blocks adds one to a chunk's flag once its dS and dVn columns are written; the rows
 * block of that (chunk, head) starts once the flag reaches nz, and resets it. The rows blocks
 * take the chunks from the last position down (the reverse sweep's order) when the sequences
 * have one length. The last block to finish resets the ticket and the count, so a kept
 * forward's backward can run again. The same arithmetic as the two kernels: bit-identical
 * (test_kda_cuda). */
template <int KV>
__global__ void __launch_bounds__(NTC, 1) k_bwd_flow(kp p, const void *dout, ws w, const float *dht, float *dh0,
                                                    int lay, int ns, int nz, int *fb) {
  __shared__ int role;
  if (!threadIdx.x) role = atomicAdd(fb, 1);
  __syncthreads();
  const int r = role;
  if (r < ns) {
    state_bwd_db<KV>(p, w, dout, dht, dh0, r, fb + 2);
  } else {
    int64_t x = r - ns, HV = p.HV, h = x % HV, q = x / HV, nc = (p.T + p.C - 1) / p.C;
    /* packed sequences: the chunk slots from the last down; else position nc - 1 - q / B of
     * sequence q % B */
    int64_t cb = p.cu ? (gridDim.x - ns) / HV - 1 - q : (q % p.B) * nc + nc - 1 - q / p.B;
    if (!threadIdx.x) {
      int *f = fb + 2 + cb * HV + h;
      if (w.ctab[4 * cb + 2]) flow_wait_for(f, nz);
      *f = 0;
    }
    __syncthreads();
    bwd_rows_tc<false, KV>(p, dout, w, lay, (int)cb, h);
  }
  if (!threadIdx.x && atomicAdd(fb + 1, 1) == (int)gridDim.x - 1) fb[0] = 0, fb[1] = 0;
}
bwd_flow_fn k_bwd_flow_pick(int kv) {
  static const bwd_flow_fn t[3] = KV_SLOTS1(k_bwd_flow);
  return t[kv_slot(kv)];
}

/* dA, dM, dL = -StrictTril(M^T StrictTril(dM) M^T), dv, dKb, WY part of dbeta.
 * Precision: only dA = s dO Vn^T runs in bf16 (dO is a bf16 input, exact). Everything that
 * feeds dbeta runs in tf32 from fp32 tiles: dbeta_i = (M^T dU)_i . v_i + k_i . R_i (+ W terms)
 * is the sum of two terms that cancel to D_i . U_i / b_i (U = M bV), and at strong decay
 * (g = -1000 entries) |dbeta| << |D||v|, so the bf16 rounding of M, dVn, dW, b v, Kb in
 * M^T dVn and in dM (whose errors do not cancel between the two terms: one went through bf16 M,
 * the other through tf32 M) was amplified ~10x (dbeta 2.7e-2 vs 1.6e-3 on version 1).
 * smem fp32: M [C][CS]; Vn, later dM and X: [C][max(2 CS, VS)] (a barrier between dA and dM);
 *      dVn [C][VS]; dW, Kb [C][KS]; b [C]; bf16: dO, v (raw inputs: exact) [C][VB]; fp32 M^T
 *      [C][CS] (the fast variant's); dbeta's partials [C][V16 / 8 + 1] (209.5 KB in all at
 *      C = 64, K = V = 128).
 * The precise backward (k_bwd_mat_tc_p): every product in P_3TF32, dA in P_3TF32A (dO exact). */
size_t smem_mat_tc(int64_t C, int64_t K, int64_t V) {   /* one layout for both variants */
  int64_t u = 2 * C * (C + 4) > C * (r16(V) + 4) ? 2 * C * (C + 4) : C * (r16(V) + 4);
  return (size_t)(2 * C * (r16(V) + 8)) * 2 +
         (size_t)(2 * C * (C + 4) + u + C * (r16(V) + 4) + 2 * C * (r16(K) + 4) + C + C * mat_ps(V)) * 4;
}
/* The compact layout (CM) for small heads, so that two blocks share an SM:
 * X = dM M^T in Kb's tile (dead after dM; C <= r16(K)), and the fast variant's M^T built in
 * the dM region once X is formed (M^T's products, dL, dv, dKb, come after; the precise one
 * reads M transposed), so no M^T tile nor second dM/X half. K = V = 64, chunk 64: 105.7 KB
 * instead of 140.5 KB. 0 when it does not apply. */
size_t smem_mat_tc_compact(int64_t C, int64_t K, int64_t V) {
  if (C > r16(K)) return 0;
  int64_t CS = C + 4, VS = r16(V) + 4, KS = r16(K) + 4, r1 = C * (VS > CS ? VS : CS);
  return (size_t)(2 * C * (r16(V) + 8)) * 2 +
         (size_t)(C * CS + r1 + C * VS + 2 * C * KS + C + C * mat_ps(V)) * 4;
}
/* MW (the fast compact K = V = 64 form beside k_bwd_final_fr, k_bwd_mat_mw): dW = -dVn S0^T
 * formed here, where the rows kernel formed it (ROWS_FR left it nothing else, so none runs):
 * S0's bf16 copy staged into the dM region (free until dM is formed) instead of the fp32 dW,
 * and dVn's bf16 operand rounded (RN) from the fp32 tile staged anyway into the precise
 * variant's dO tile, the values of the reverse sweep's bf16 copy (or of the rows kernel's own
 * rounding after the two-tile-set sweep, which writes none). The rows kernel's product tile for
 * tile, the same values */
template <bool PR, bool CM, int KV, int NF, bool MW = false>   /* NF: as bwd_final_tc's */
static __device__ __forceinline__ void bwd_mat_tc(kp p, const void *v, const void *dout, void *dv, ws w) {
  static_assert(!MW || (!PR && CM && KV == 64), "MW: the fast compact K = V = 64 form");
  constexpr int PT = PR ? P_3TF32 : P_TF32;
  kv_fix<KV, NTC>(p);
  extern __shared__ __align__(16) float sm[];
  /* MW: the final kernel after this one (k_bwd_final_fr, launched programmatically) may start
   * its blocks on the SMs this grid frees: its staging and products read nothing of this grid */
  if constexpr (MW) pdl_trigger();
  const int *ct = w.ctab + 4 * blk_chunk(p);
  const int n = NF ? NF : ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = blk_head(p), K = p.K, V = p.V, HV = p.HV;
  int C = p.C, K16 = r16(K), V16 = r16(V), VB = V16 + 8, CS = C + 4, VS = V16 + 4, KS = K16 + 4;
  const int64_t r0 = ROWI(0);                      /* the epilogues' rows at 32-bit offsets from it */
  const int RK = (int)(HV * K), RV = (int)(HV * V), RC = (int)HV * C;
  int U = C * VS > 2 * C * CS ? C * VS : 2 * C * CS;   /* the Vn / dM, X region */
  if (CM) U = VS > CS ? C * VS : C * CS;           /* CM: Vn / dM, then M^T */
  float *Ms = sm, *dM = Ms + C * CS, *X = dM + C * CS, *dVs = dM + U, *dWs = dVs + C * VS,
        *Kb = dWs + C * KS, *bs = Kb + C * KS, *VnF = dM;   /* VnF: dead before dM */
  sbf *dO = (sbf *)(bs + C), *Vr = dO + C * VB;
  float *MsT = (float *)(Vr + C * VB);             /* the fast variant's M^T (tf32-rounded) */
  float *part = MsT + (CM ? 0 : C * CS);           /* dbeta's row partials [C][PS] */
  const int PS = mat_ps(V);
  if (CM) X = Kb, MsT = dM;                        /* Kb is dead once dM is formed, dM once X is */
  PH_INIT(4);
  /* staging, all asynchronous: Kb = b k e^G as the backward's k_intra_tc wrote it, raw bf16 v
   * and, for the precise variant's dA, fp32 Vn and bf16 dO. It used to convert vn and form Kb
   * (three loads per element) with batched loads, ~50% of the kernel's time at K = V = 128.
   * Two groups: the precise dA's operands (Vn, dO) first, so that dA runs while the rest (M,
   * dVn, dW, Kb, v) arrives. The fast variant's dA is the rows kernel's, which stages the
   * same bf16 dO and Vn for its own products. */
  if constexpr (PR) {
    cp_tile_f32(VnF, VS, C, V16, n, (int)V, V % 4 == 0, [&](int i) { return w.vn + ROWI(i) * V; });
    cp_tile_bf16(dO, VB, C, V16, n, V, dout, t0, HV, h);
  }
  cp_async_commit();
  cp_tile_f32(Ms, CS, C, C, n, C, true, [&](int i) { return w.M + ROWI(i) * C; });
  cp_tile_f32(dVs, VS, C, V16, n, (int)V, V % 4 == 0, [&](int i) { return w.dvn + ROWI(i) * V; });
  sbf *dVb = dO, *S0b = (sbf *)dM;                 /* MW's operands */
  if constexpr (MW)
    cp_tile_bf16(S0b, VB, K16, V16, (int)K, V, w.h, ((int64_t)blk_chunk(p) * HV + h) * K, 1, 0);
  else
    cp_tile_f32(dWs, KS, C, K16, n, (int)K, K % 4 == 0, [&](int i) { return w.dW + ROWI(i) * K; });
  cp_tile_f32(Kb, KS, C, K16, n, (int)K, K % 4 == 0, [&](int i) { return w.Kb + ROWI(i) * K; });
  for (int r = threadIdx.x; r < C; r += BT) bs[r] = r < n ? w.b[ROWI(r)] : 0.f;
  cp_tile_bf16(Vr, VB, C, V16, n, V, v, t0, HV, h);
  cp_async_commit();
  if constexpr (PR) {
    cp_async_wait_group<1>();                      /* Vn, dO (the rest may fly) */
    __syncthreads();
  }
  PH(0);
  /* every epilogue below stores a thread's two adjacent outputs at once (pairs2; the rows'
   * pitches C, CS, K16 are even; V, K may be odd: st2f then stores one by one) */
  if constexpr (PR) {   /* dA = s tril(dO Vn^T): dO exact in tf32, Vn split */
    auto da_out = [&](int i, int j, float x0, float x1) {
      auto v = [&](int jj, float x) { return jj <= i && jj < n ? p.scale * x : 0.f; };
      if (i < n) st2f(w.dA + r0 * C + (i * RC + j), v(j, x0), v(j + 1, x1), true);
    };
    mma_blk4<P_3TF32A>(C, C, V16, [&](int i, int c) { return f(dO[i * VB + c]); },
                       [&](int c, int j) { return VnF[j * VS + c]; }, pairs2(da_out));
  }
  cp_async_wait_all();
  __syncthreads();                                 /* the rest landed; every warp done with VnF before dM overwrites it */
  if constexpr (MW) {                              /* dW = -dVn S0^T, as the rows kernel stored it */
    for (int e = threadIdx.x; e < C * V16 / 4; e += BT) {   /* dVn's bf16 operand, four columns at a time */
      const int i = e / (V16 / 4), c = 4 * (e % (V16 / 4));
      const float4 x = *(const float4 *)(dVs + i * VS + c);
      __nv_bfloat162 *o = (__nv_bfloat162 *)(dVb + i * VB + c);
      o[0] = __floats2bfloat162_rn(x.x, x.y), o[1] = __floats2bfloat162_rn(x.z, x.w);
    }
    __syncthreads();
    mma_ldm<NPB>(C, K16, bt{dVb, VB, 1}, bt{S0b, VB, 1}, V16, bt{}, bt{}, 0,
                 pairs2([&](int i, int d, float x0, float x1) { *(float2 *)(dWs + i * KS + d) = make_float2(-x0, -x1); }));
    __syncthreads();
  }
  /* The fast variant's tf32 products (mma_tf) take operands rounded once here: M, dVn, dW,
   * Kb are MMA operands only, so rounding them in place changes no result (the cvt per
   * fragment load rounded the same way), and M^T as a tile of its own gives the three M^T
   * products ldmatrix A fragments. dM and X are rounded where their epilogues write them. */
  if constexpr (!PR) {
    for (int e = threadIdx.x; e < C * C; e += BT) {
      int i = e / C, j = e % C;
      float x = tf32r(Ms[i * CS + j]);
      Ms[i * CS + j] = x;
      if (!CM) MsT[j * CS + i] = x;                /* CM: after X, in dM's place */
    }
    /* dVn, dW, Kb are contiguous [C][VS], [C][KS], [C][KS] tiles: round them whole (pads
     * are zero), four floats at a time */
    tf32r_tile(dVs, C * VS + 2 * C * KS);
    __syncthreads();
  }
  PH(1);
  /* dM = strict-tril([dVn | dW] [bV | Kb]^T)  (tf32) */
  auto dm_a = [&](int i, int k) { return k < V16 ? dVs[i * VS + k] : dWs[i * KS + k - V16]; };
  auto dm_out = [&](int i, int j, float x0, float x1) {
    auto v = [&](int jj, float x) { return jj < i && i < n ? (PR ? x : tf32r(x)) : 0.f; };
    *(float2 *)(dM + i * CS + j) = make_float2(v(j, x0), v(j + 1, x1));
  };
  if constexpr (PR)
    mma_blk4<PT>(C, C, V16 + K16, dm_a,
                 [&](int k, int j) { return k < V16 ? bs[j] * f(Vr[j * VB + k]) : Kb[j * KS + k - V16]; },
                 pairs2(dm_out));
  else   /* [dVn | dW] and Kb by ldmatrix, bV formed per load */
    mma_tf2<NPB>(C, C, tft{dVs, VS}, [&](int k, int j) { return tf32r(bs[j] * f(Vr[j * VB + k])); }, V16, tft{dWs, KS},
            tft{Kb, KS}, K16, pairs2(dm_out));
  __syncthreads();
  PH(2);
  /* X = dM M^T (tf32: the dL chain stays close to fp32) */
  auto x_out = [&](int i, int j, float x0, float x1) {
    *(float2 *)(X + i * CS + j) = PR ? make_float2(x0, x1) : make_float2(tf32r(x0), tf32r(x1));
  };
  if constexpr (PR)
    mma_blk4<PT>(C, C, C, [&](int i, int m) { return dM[i * CS + m]; }, [&](int m, int j) { return Ms[j * CS + m]; },
                 pairs2(x_out));
  else
    mma_tf<NPB>(C, C, C, tft{dM, CS}, tft{Ms, CS}, pairs2(x_out));
  __syncthreads();
  if constexpr (CM && !PR) {                       /* dM is dead: M^T in its place */
    for (int e = threadIdx.x; e < C * C; e += BT) MsT[(e % C) * CS + e / C] = Ms[e / C * CS + e % C];
    __syncthreads();
  }
  PH(3);
  /* dL = -strict-tril(M^T X) */
  auto xb = [&](int m, int j) { return X[m * CS + j]; };
  auto dl_v = [&](int i, int j, float x) { return j < i ? -x : 0.f; };
  auto dl_out = [&](int i, int j, float x0, float x1) {
    if (i < n) st2f(w.dL + r0 * C + (i * RC + j), dl_v(i, j, x0), dl_v(i, j + 1, x1), true);
  };
  if constexpr (PR) mma_blk4<PT>(C, C, C, [&](int i, int m) { return Ms[m * CS + i]; }, xb, pairs2(dl_out));
  else mma_tf<NPB>(C, C, C, tft{MsT, CS}, xb, pairs2(dl_out));
  PH(4);
  /* dbeta's WY part: dbeta_j = (M^T dVn)_j . v_j + dKb_j . (k_j e^{G_j}). The first sum is
   * formed in the dv product's epilogue: a thread's two columns of rows j and j + 8, then its
   * tile row's four lanes (a fixed shuffle tree), into part[j][c / 8], the partials added in
   * order below; the second is k_bwd_final_tc's (its R terms, which stage k and G: R' = R +
   * dKb e^G there). It stored (M^T dVn) . v into w.dvn and a warp a row summed that and dKb kn
   * e^G back from global memory, kn and G read only for it. H200, (8,2048,16,128), one run
   * (2026-12-02s25c): this kernel 39.0k -> 31.4k cycles a block, final's unchanged (57.4k);
   * fwd+bwd 3.48-3.50 -> 3.34-3.37 ms, (1,8192,16,128) 2.21-2.25 -> 2.14-2.17. Summing both
   * terms here in the two epilogues instead (the dKb one loading kn, G) gained nothing (s25b). */
  /* dv = b (M^T dVn) (tf32); a thread's two adjacent outputs in one store (V may be odd) */
  auto dvb = [&](int i, int c) { return dVs[i * VS + c]; };
  auto dv_out = [&](int j, int c, float x0, float x1) {
    if (j < n && c < V) st2b((bf16 *)dv + r0 * V + (j * RV + c), bs[j] * x0, bs[j] * x1, c + 1 < V);
  };
  auto dv_e4 = [&](int j, int c, float x0, float x1, float x2, float x3) {   /* v's pads are zero */
    dv_out(j, c, x0, x1), dv_out(j + 8, c, x2, x3);
    mat_part4(part, PS, j, c >> 3, x0 * f(Vr[j * VB + c]) + x1 * f(Vr[j * VB + c + 1]),
              x2 * f(Vr[(j + 8) * VB + c]) + x3 * f(Vr[(j + 8) * VB + c + 1]));
  };
  if constexpr (PR) mma_blk4<PT>(C, V16, C, [&](int j, int i) { return Ms[i * CS + j]; }, dvb, dv_e4);
  else mma_tf<NPB>(C, V16, C, tft{MsT, CS}, dvb, dv_e4);
  PH(5);
  /* dKb = M^T dW (tf32) */
  auto dwb = [&](int i, int d) { return dWs[i * KS + d]; };
  auto dkb_out = [&](int j, int d, float x0, float x1) {
    if (j < n && d < K) st2f(w.dKb + r0 * K + (j * RK + d), x0, x1, d + 1 < K);
  };
  if constexpr (PR) mma_blk4<PT>(C, K16, C, [&](int j, int i) { return Ms[i * CS + j]; }, dwb, pairs2(dkb_out));
  else mma_tf<NPB>(C, K16, C, tft{MsT, CS}, dwb, pairs2(dkb_out));
  __syncthreads();                                 /* every partial written */
  PH(6);
  mat_db_rows(part, PS, n, w.db + ROWI(0), HV);   /* dbeta_WY */
  PH(7);
}
/* compact: two blocks an SM (64 registers a thread at 512) */
template <bool PR, bool CM, int KV>
__global__ void __launch_bounds__(NTC, CM ? 2 : 1) k_bwd_mat_tc(kp p, const void *v, const void *dout, void *dv, ws w) {
  if (full_chunk<PR, KV>(p, w.ctab, blk_chunk(p)))  /* n = 64 fixed (k_intra_tc's measure) */
    bwd_mat_tc<PR, CM, KV, FULL_NF<PR, KV>>(p, v, dout, dv, w);
  else bwd_mat_tc<PR, CM, KV, 0>(p, v, dout, dv, w);
}
__global__ void __launch_bounds__(NTC, 2) k_bwd_mat_mw(kp p, const void *v, const void *dout, void *dv, ws w) {
  if (full_chunk<false, 64>(p, w.ctab, blk_chunk(p))) bwd_mat_tc<false, true, 64, 64, true>(p, v, dout, dv, w);
  else bwd_mat_tc<false, true, 64, 0, true>(p, v, dout, dv, w);
}
mat_tc_fn k_bwd_mat_mw_ptr(void) { return k_bwd_mat_mw; }
mat_tc_fn k_bwd_mat_tc_pick(bool pr, bool cm, int kv) {
  static const mat_tc_fn t[2][2][3] = {{KV_SLOTS(k_bwd_mat_tc, false, false), KV_SLOTS(k_bwd_mat_tc, false, true)},
                                       {KV_SLOTS(k_bwd_mat_tc, true, false), KV_SLOTS(k_bwd_mat_tc, true, true)}};
  return t[pr][cm][kv_slot(kv)];
}

#ifdef KDA_PHASES
void kda_phase_take_bwd(unsigned long long (*c)[KDA_PH_PHASES + 1]) { kda_phase_take(c); }
#endif
