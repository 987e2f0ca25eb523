/* kda_tc_bwd.cu — version 2 of the CUDA KDA chunked kernels, backward half: the
 * chunk-parallel kernels after the backward state pass, per (chunk, value head), 512 threads:
 * k_bwd_rows_tc (the contractions over V with the chunk's entering state and its gradient),
 * k_bwd_mat_tc (the WY part: dA, dM -> dL, dv, dKb, dbeta) and k_bwd_final_tc (the intra
 * terms, dG, the gate and beta chains, and where H == HV, K <= 128 the l2-norm backward to dq,
 * dk), each with its precise twin from the same template;
 * and the kept fast reverse sweep with two tile sets (k_state_bwd_tc_db), alone and with the
 * rows kernel as one grid (k_bwd_flow). Shared with kda_tc.cu (intra and state passes):
 * kda_tc.cuh, and the state passes' helpers kda_state.cuh. */
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
/* the same sums from bf16 tiles (the fast variant's S0, dS, rows of VB, zero past V), a lane two
 * adjacent columns at a time */
static __device__ __forceinline__ void rows_dgn_b(const kp &p, const ws &w, int chunk, int64_t h, const sbf *S0,
                                                  const sbf *dS, int VB) {
  int lane = threadIdx.x & 31;
  for (int d = threadIdx.x >> 5; d < p.K; d += BT / 32) {
    float acc = 0.f;
    for (int c = 2 * lane; c < p.V; c += 64) {
      float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)(S0 + d * VB + c));
      float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)(dS + d * VB + c));
      acc = fmaf(a.x, b.x, acc), acc = fmaf(a.y, b.y, acc);
    }
    acc = kc_warp_sum(acc);
    if (!lane) w.dgn[((int64_t)chunk * p.HV + h) * p.K + d] = acc;
  }
}
/* lay: the host's layout choice, ROWS_SEP (precise: dS in a tile of its own), ROWS_VN (fast: Vn
 * in a tile of its own), ROWS_DVF (fast: dVn from its fp32 copy) */
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
    const bool vnx = lay & ROWS_VN, dvf = lay & ROWS_DVF;
    const int DV = dvf ? 2 * VS : VB;              /* dVn's bf16 pitch */
    sbf *dVn = (sbf *)sm, *S0 = dvf ? (sbf *)(sm + C * VS) : dVn + C * VB, *dS = S0 + K16 * VB, *dO = dS + K16 * VB;
    sbf *Vn = vnx ? dO + C * VB : dVn;
    int64_t sr = ((int64_t)cb * HV + h) * K;       /* the chunk's states, in rows of V */
    cp_tile_bf16(S0, VB, K16, V16, (int)K, V, w.h, sr, 1, 0);
    if (dvf) cp_tile_f32(sm, VS, C, V16, n, (int)V, V % 4 == 0, [&](int i) { return w.dvn + ROWI(i) * V; });
    else cp_tile_bf16(dVn, VB, C, V16, n, V, w.dvnb, t0, HV, h);
    cp_tile_bf16(dO, VB, C, V16, n, V, dout, t0, HV, h);
    cp_tile_bf16(dS, VB, K16, V16, (int)K, V, w.dh, sr, 1, 0);
    if (vnx) {
      cp_async_commit();
      cp_tile_bf16(Vn, VB, C, V16, n, V, w.vn, t0, HV, h);
      cp_async_commit();
      cp_async_wait_group<1>();                    /* all but Vn */
    } else cp_async_wait_all();
    __syncthreads();
    PH(0);
    rows_dgn_b(p, w, cb, h, S0, dS, VB);
    if (dvf) {
      rows_to_bf16(sm, C, VS, V16);
      __syncthreads();
    }
    PH(1);
    mma_ldm<NPB>(C, K16, bt{dO, VB, 1}, bt{S0, VB, 1}, V16, bt{}, bt{}, 0, pairs2(dq_out));    /* dQ = dO S0^T */
    PH(2);
    mma_ldm<NPB>(C, K16, bt{dVn, DV, 1}, bt{S0, VB, 1}, V16, bt{}, bt{}, 0, pairs2(dw_out));   /* dW = -dVn S0^T */
    if (!vnx) {
      __syncthreads();                             /* every warp done with dVn */
      cp_tile_bf16(Vn, VB, C, V16, n, V, w.vn, t0, HV, h);
    }
    cp_async_wait_all();
    __syncthreads();
    PH(3);
    mma_ldm<NPB>(C, K16, bt{Vn, VB, 1}, bt{dS, VB, 1}, V16, bt{}, bt{}, 0, pairs2(dki_out));   /* dKi = Vn dS^T */
    /* dA = s tril(dO Vn^T) (bf16), the fast mat kernel's before: both operands are staged here
     * already (the same bf16 tiles, the same k order: the same dA), and the mat kernel then
     * stages neither */
    auto da_out = [&](int i, int j, float x0, float x1) {
      auto v = [&](int jj, float x) { return jj <= i && jj < n ? p.scale * x : 0.f; };
      if (i < n) st2f(w.dA + r0 * C + (i * RC + j), v(j, x0), v(j + 1, x1), true);
    };
    mma_ldm<NPB>(C, C, bt{dO, VB, 1}, bt{Vn, VB, 1}, V16, bt{}, bt{}, 0, pairs2(da_out));
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
  bwd_rows_tc<PR, KV>(p, dout, w, lay, blockIdx.x, blockIdx.y);
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
template <bool PR, bool CM, int KV, int NF>       /* NF: as bwd_final_tc's */
static __device__ __forceinline__ void bwd_mat_tc(kp p, const void *v, const void *dout, void *dv, ws w) {
  constexpr int PT = PR ? P_3TF32 : P_TF32;
  kv_fix<KV, NTC>(p);
  extern __shared__ __align__(16) float sm[];
  const int *ct = w.ctab + 4 * blockIdx.x;
  const int n = NF ? NF : ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = blockIdx.y, K = p.K, V = p.V, HV = p.HV;
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
  if (full_chunk<PR, KV>(p, w.ctab, blockIdx.x))  /* n = 64 fixed (k_intra_tc's measure) */
    bwd_mat_tc<PR, CM, KV, FULL_NF<PR, KV>>(p, v, dout, dv, w);
  else bwd_mat_tc<PR, CM, KV, 0>(p, v, dout, dv, w);
}
mat_tc_fn k_bwd_mat_tc_pick(bool pr, bool cm, int kv) {
  static const mat_tc_fn t[2][2][3] = {{KV_SLOTS(k_bwd_mat_tc, false, false), KV_SLOTS(k_bwd_mat_tc, false, true)},
                                       {KV_SLOTS(k_bwd_mat_tc, true, false), KV_SLOTS(k_bwd_mat_tc, true, true)}};
  return t[pr][cm][kv_slot(kv)];
}

/* Intra-chunk backward (§4.3 B4), dG, reverse cumsum, gate and beta chains.
 * smem fp32: G [C][KS]; X [C+32][K16+8] (factored operands; [KS] compact); dA, dL [C][CS]; b, dbi [C];
 * dGn [K16]; dG [C][KS] (the gate gradient, summed here over four phases, read by the gate
 * chain: it was w.dW in global memory, three read-modify-write passes and the chain's loads);
 * rq, rk [C] and the raw bf16 q, k [C][K16+8]; the wide layout also dKb [C][KS] (R' below);
 * the column terms' A tiles [16][final_at_cols(C)] (the fast kernels).
 * q, k raw: the l2-normalised rows are q rq, k rk (ws.rn), formed where read, the products
 * k_intra_tc formed, so the same values as the fp32 qn, kn tiles staged until 2026-12-02 in
 * half the room; that room holds dKb, which the diagonal phase, the row products and the R
 * terms read and wrote in global memory (4.5 passes of 4 C K bytes a block, now one staged
 * read). Alone a wash (H200, 2026-12-02s26a: the staging grew by what the diagonal phase and
 * the row products lost); the raw rows are what lets the R terms do the l2-norm backward. */
/* the column terms' groups: from block J0, the blocks whose X_J ([q ; b k] rows i > 16 J + 15,
 * 2 m16 rows each) fit X's C + 32 rows together (at C = 64: {0}, {1, 2}); returns the end J1
 * and in *at the group's A-tile columns (2 m16 + 4 a block) */
static __host__ __device__ __forceinline__ int col_group(int J0, int n, int C, int *at) {
  int xrows = 0, J1 = J0, nI = (n + 15) / 16;
  for (*at = 0; J1 < nI - 1; J1++) {
    int m16 = r16(n - 16 * J1 - 16);
    if (xrows + 2 * m16 > C + 32) break;
    xrows += 2 * m16, *at += 2 * m16 + 4;
  }
  return J1;
}
/* the widest group's A-tile columns over chunk lengths (the groups depend on n only through
 * r16(n)): 104 at C = 64, 36 at C = 32 */
static __host__ __device__ __forceinline__ int final_at_cols(int C) {
  int w = 0;
  for (int n = 16; n < C + 16; n += 16)
    for (int J0 = 0, at; J0 < (n + 15) / 16 - 1;) {
      J0 = col_group(J0, n, C, &at);
      w = at > w ? at : w;
    }
  return w;
}
size_t smem_final_tc(int64_t C, int64_t K) {   /* the wide layout: X's rows of r16(K) + 8 */
  int64_t KS = r16(K) + 4;
  return (size_t)(C * KS + (C + 32) * (KS + 4) + 2 * C * (C + 4) + 2 * C + r16(K) + 32 + C * KS + 2 * C) * 4 +
         (size_t)2 * C * (r16(K) + 8) * 2 + (size_t)(C * KS + 16 * final_at_cols((int)C)) * 4;
}
/* The compact layout (CM) for small heads: dA (lower triangle and diagonal) and dL (strictly
 * lower) share one [C][CS] tile, dL's row i in the upper part of row C-1-i (its i entries fill
 * columns C-i .. C-1 exactly); dKb stays in global memory. K = 64, chunk 64: 104.7 KB (98.2
 * without the column terms' A tiles, when those read dA's tile by mma_blk4) instead of 141.2,
 * two blocks an SM at 256 threads (128 registers). */
size_t smem_final_tc_compact(int64_t C, int64_t K) {   /* no dL, dKb tiles; X's rows of KS */
  return smem_final_tc(C, K) - (size_t)C * (C + 4) * 4 - (size_t)(C + 32) * 4 * 4 - (size_t)C * (r16(K) + 4) * 4;
}
/* PR (the precise backward): the factored off-diagonal blocks in P_3TF32. NF: the row count
 * fixed at compile time (loops and row checks fold), or 0: the chunk table's */
template <bool PR, bool CM, int KV, int NF>
static __device__ __forceinline__ void bwd_final_tc(kp p, const void *q, const void *k, const void *g,
                                                    const void *beta, const float *A_log, const float *dt_bias,
                                                    void *dg, void *dbeta, void *dq_out, void *dk_out, ws w) {
  constexpr int PT = PR ? P_3TF32 : P_TF32;
  kv_fix<KV, CM ? 256 : NTC>(p);
  extern __shared__ __align__(16) float sm[];
  __shared__ float red[32];
  const int cb = blockIdx.x, *ct = w.ctab + 4 * cb;
  const int n = NF ? NF : ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = blockIdx.y, K = p.K, HV = p.HV;
  int C = p.C, K16 = r16(K), KS = K16 + 4, CS = C + 4, tid = threadIdx.x;
  /* X's pitch: X is only ever a B operand read by scalar fragment loads (rows k0 + lane % 4,
   * columns j0 + lane / 4), which fall in 32 distinct banks at r16 + 8 (two-way conflicts at
   * KS = r16 + 4); the compact layout keeps KS (its 1.5 KB more would not let two blocks share
   * an SM). H200, (8,2048,16,128), with the element pass's loads below: the row and column
   * products 9.6k -> 9.0k and 7.5k -> 6.9k cycles a block, fwd+bwd 4.26-4.28 -> 4.23-4.24 ms */
  const int XS = CM ? KS : K16 + 8, QB = K16 + 8;   /* QB: the bf16 q, k rows' pitch (conflict-free pairs) */
  constexpr bool KBS = !CM;                         /* dKb (R') in shared memory */
  float *Gs = sm, *X = Gs + C * KS, *dAs = X + (C + 32) * XS, *dLs = dAs + C * CS, *bs = dLs + (CM ? 0 : C * CS),
        *dbi = bs + C, *dGn = dbi + C, *dGs = dGn + K16 + 32, *rq = dGs + C * KS, *rk = rq + C;
  sbf *qb = (sbf *)(rk + C), *kb = qb + C * QB;
  float *dKbs = (float *)(kb + C * QB), *At = dKbs + (KBS ? C * KS : 0);
  /* the l2-normalised q, k (the fp32 rows k_intra_tc formed, bit for bit) */
  auto qv = [&](int i, int d) { return __bfloat162float(qb[i * QB + d]) * rq[i]; };
  auto kv = [&](int i, int d) { return __bfloat162float(kb[i * QB + d]) * rk[i]; };
  auto v4 = [&](const sbf *t, const float *r, int i, int d) {   /* four columns d .. d + 3 */
    uint2 u = *(const uint2 *)(t + i * QB + d);
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    float f = r[i];
    return make_float4(a.x * f, a.y * f, b.x * f, b.y * f);
  };
  /* dL's row i (entries j < i): CM, in dA's tile, dl_row(i)[j] = dAs[(C-1-i) CS + C-i+j]
   * (smem_final_tc_compact) */
  auto dl_row = [&](int i) -> const float * { return CM ? dAs + (C - 1 - i) * CS + C - i : dLs + i * CS; };
  /* the chunk's rows of the [T, HV, K] gradient scratch: row i, column d at i RS + d from its
   * first element, in 32-bit offsets (64-bit index products per element loaded the integer
   * pipe, this kernel's busiest: ncu ALU 35.8%) */
  const int RS = (int)(HV * K), RC = (int)HV * C;
  const int64_t g0 = ROWI(0) * K;
  float *dQg = w.dQ + g0, *dKig = w.dKi + g0, *dKbg = w.dKb + g0;
  const float *dA0 = w.dA + ROWI(0) * C, *dL0 = w.dL + ROWI(0) * C;
  PH_INIT(5);
  float *Xd = X + 32 * XS;                          /* the staged dKi, until the off-diagonal terms */
  {                                                 /* asynchronous staging, zero-filled */
    bool al = K % 4 == 0;
    const int64_t hq = h / (HV / p.H);
    cp_tile_bf16(qb, QB, C, K16, n, K, q, t0, p.H, hq);
    cp_tile_bf16(kb, QB, C, K16, n, K, k, t0, p.H, hq);
    if constexpr (KBS) cp_tile_f32(dKbs, KS, C, K16, n, (int)K, al, [&](int r) { return dKbg + r * RS; });
    /* pad rows repeat the last G: exponents <= 0 */
    cp_tile_f32(Gs, KS, C, K16, C, (int)K, al, [&](int r) { return w.G + ROWI(r < n ? r : n - 1) * K; });
    if constexpr (CM)                               /* row r: dA[r][0..r], then dL[C-1-r][0..C-2-r] */
      for (int e = tid; e < C * C; e += BT) {
        int r = e / C, c = e % C, i = c <= r ? r : C - 1 - r;
        bool ok = i < n;
        cp_async4(dAs + r * CS + c, ok ? (c <= r ? dA0 + (r * RC + c) : dL0 + (i * RC + c - r - 1)) : w.dA, ok);
      }
    else {
      cp_tile_f32(dAs, CS, C, C, n, C, true, [&](int i) { return w.dA + ROWI(i) * C; });
      cp_tile_f32(dLs, CS, C, C, n, C, true, [&](int i) { return w.dL + ROWI(i) * C; });
    }
    /* the inter-chunk dKi into X's rows 32 .. 32 + C (free until the off-diagonal terms) and
     * dgn into dGn: the dGn phase and the diagonal phase read them from here. They were global
     * loads after the staging, a latency of their own (the dGn phase 6.5k of 70.5k cycles a
     * block at (8,2048,16,128)) */
    cp_tile_f32(Xd, XS, C, K16, n, (int)K, al, [&](int r) { return dKig + r * RS; });
    cp_tile_f32(dGn, K16, 1, K16, 1, (int)K, al, [&](int) { return w.dgn + ((int64_t)cb * HV + h) * K; });
  }
  for (int r = tid; r < C; r += BT) {
    float2 f = r < n ? w.rn[ROWI(r)] : make_float2(0.f, 0.f);
    bs[r] = r < n ? w.b[ROWI(r)] : 0.f, rq[r] = f.x, rk[r] = f.y;
  }
  cp_async_wait_all();
  __syncthreads();
  PH(0);
  {                                                 /* dGn with the inter-chunk dKi (before intra) */
    /* rows split in 16-row groups, one thread per (group, column) (all the block's threads);
     * the group sums go to X's first rows and are added in group order. The staged dKi is
     * the rows kernel's Vn dS^T: its factor e^{Gn - G} is applied here, in place, for the
     * phases after this one too (the rows kernel stages no G; a pass of its own over the
     * tile cost ~1.6k cycles a block at (8,2048,16,128)); dQ's s e^G in the diagonal phase */
    int ng = (n + 15) / 16;
    for (int e = tid; e < ng * (int)K; e += BT) {
      int r0 = (e / (int)K) * 16, d = e % (int)K;
      float x[16], acc = 0, gl = Gs[(n - 1) * KS + d];
#pragma unroll
      for (int u = 0; u < 16; u++) {               /* zero past n (G's pad rows repeat the last) */
        x[u] = Xd[(r0 + u) * XS + d] * kexp(gl - Gs[(r0 + u) * KS + d]);
        Xd[(r0 + u) * XS + d] = x[u];
      }
#pragma unroll
      for (int u = 0; u < 16; u++)
        if (r0 + u < n) acc += kv(r0 + u, d) * x[u];
      X[(r0 / 16) * XS + d] = acc;
    }
    __syncthreads();
    for (int d = tid; d < K; d += BT) {
      float acc = kexp(Gs[(n - 1) * KS + d]) * dGn[d];   /* dGn holds dgn, staged */
      for (int gq = 0; gq < ng; gq++) acc += X[gq * XS + d];
      dGn[d] = acc;
    }
  }
  PH(1);                                            /* (the diagonal phase reads none of dGn, X) */
  /* inter parts of dG (into the dG tile) fused with the diagonal blocks (unfactored: any
   * decay). A thread owns one column d of one 16-row block: G and k of its 16 rows in
   * registers, each pair's e^{G_i - G_j} formed once and used twice, as row i's term
   * (dq_intra, R) and as column j's (dk_col); dA, dL are broadcast loads. Sums run in the
   * same order as one element at a time (j up for a row, i up for a column). It was a thread
   * per element recomputing each pair's exponent for the row and for the column terms and
   * reloading G, k per pair: 31% of the kernel. */
  for (int e = tid; e < (C / 16) * (int)K; e += BT) {
    int I0 = (e / (int)K) * 16, d = e % (int)K;
    if (I0 >= n) continue;
    float gr[16], kr[16], dqi[16], R[16], col[16], ex[16];
#pragma unroll
    for (int i = 0; i < 16; i++)
      gr[i] = Gs[(I0 + i) * KS + d], kr[i] = kv(I0 + i, d), dqi[i] = R[i] = col[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) {
      if (I0 + i >= n) break;                       /* rows past the chunk: nothing to add */
      const float *dAr = dAs + (I0 + i) * CS + I0, *dLr = dl_row(I0 + i) + I0;
      float qi = qv(I0 + i, d), bki = bs[I0 + i] * kr[i];
      /* ex[j] = e^{G_i - G_j}: row i - 1's times the step's decay e^{G_i - G_(i-1)}, one
       * exponential a row instead of one a pair (136 MUFU.EX2 a thread); at most 15 roundings,
       * ~1e-6 relative, where e^{G_i - G_j} of the cumsums carries |G| 2^-24 in its exponent */
      float ai = i ? kexp(gr[i] - gr[i - 1]) : 1.f;
#pragma unroll
      for (int j = 0; j < i; j++) ex[j] *= ai;
      ex[i] = 1.f;
#pragma unroll
      for (int j = 0; j <= i; j++) {
        float E = ex[j], kj = kr[j] * E, a = dAr[j];
        dqi[i] += a * kj;
        if (j < i) {
          float l = dLr[j];
          R[i] += l * kj;
          col[j] += (a * qi + l * bki) * E;
        } else
          col[j] += (a * qi + 0.f) * E;
      }
    }
    /* EB elements' global loads in flight (their stores, which might alias, end a group): 8 in
     * the compiled wide forms (2 round trips a thread instead of 4; no spills), 4 in the compact
     * and run-time ones (at 8 their 128 registers a thread spill). With X's pitch below, H200,
     * (8,2048,16,128): this phase 15.3k -> 13.7k cycles a block (benches/results/2026-12-03b,e) */
    constexpr int EB = CM || !KV ? 4 : 8;
#pragma unroll
    for (int i0 = 0; i0 < 16; i0 += EB) {
      float dkb[EB], dq0[EB];
#pragma unroll
      for (int u = 0; u < EB; u++)
        if (I0 + i0 + u < n) {
          int gi = (I0 + i0 + u) * RS + d;
          dq0[u] = dQg[gi];
          if (!KBS) dkb[u] = dKbg[gi];
        }
#pragma unroll
      for (int u = 0; u < EB; u++) {
        int i = i0 + u;
        if (I0 + i >= n) break;
        int gi = (I0 + i) * RS + d;
        float qn = qv(I0 + i, d), kn = kv(I0 + i, d), eg = kexp(Gs[(I0 + i) * KS + d]),
              dki = Xd[(I0 + i) * XS + d];     /* reloaded: gr, kr die after the pair loop */
        float dq = p.scale * dq0[u] * eg;          /* the inter-chunk dQ: s (dO S0^T) e^G */
        dQg[gi] = dq + dqi[i];
        if constexpr (KBS) {                        /* R' = R + dKb e^G: see the R terms */
          float *r = dKbs + (I0 + i) * KS + d;
          *r = R[i] + *r * eg;
        } else
          dKbg[gi] = R[i] + dkb[u] * eg;
        dKig[gi] = dki + col[i];
        dGs[(I0 + i) * KS + d] = (qn * dq - kn * dki) + (qn * dqi[i] - kn * col[i]);
      }
    }
  }
  __syncthreads();                                  /* the staged dKi (X's rows) read above */
  PH(2);
  /* Off-diagonal terms, in factored products (kda_tc.cuh). Every block's operands are staged
   * before one barrier and its products follow with none between them (their outputs are
   * disjoint rows), and each epilogue's global loads are issued before its tile's MMAs (L):
   * it was a barrier pair, a product and its read-modify-write per block, the loads after the
   * MMAs. H200, one run against the per-block form: fwd+bwd (8,2048,16,128) 5.02 -> 4.97 ms,
   * precise 9.40 -> 9.31, this kernel 80.9k -> 78.4k cycles a block.
   * Row terms: block I (rows r = 16 I ..) against columns j < r, factored around row r; X_I =
   * k_j e^{G_r - G_j} in X's rows xo(I) = 8 I (I - 1) .. + r (96 rows in all at C = 64: X's
   * C + 32). The previous barrier (after the diagonal blocks) and the one below order X and
   * dG. */
  /* The fast form's operands are rounded to tf32 where written (X, and the wide layout's dA, dL
   * in place once the diagonal blocks have read them at fp32) and the products take them by
   * ldmatrix (mma_tf) instead of a scalar load and a cvt each (mma_blk4): the same values in
   * the same k order, so the same sums. The compact layout's dL rows (reversed, in dA's tile)
   * keep mma_blk4 in the row terms. The column terms' A (dA, dL transposed: ldmatrix cannot
   * transpose 32-bit values) is staged per group into At (final_at_cols), in both layouts (LDC;
   * the compact one rounds it there, its dA, dL tile staying fp32). The compact form's column
   * terms by mma_blk4 before: H200, one run (2026-12-02s30e), at (8,512,4,64) this kernel 50.4
   * -> 47.6 us (its column products 13.5k -> 6.4k cycles a block), graph (32,512,4,64) 0.450 ->
   * 0.443 ms, (8,512,4,64) 0.145 -> 0.144 */
  constexpr bool LDM = !PR && !CM, LDC = !PR;
  auto rnd4 = [](float4 v) { return LDM ? make_float4(tf32r(v.x), tf32r(v.y), tf32r(v.z), tf32r(v.w)) : v; };
  auto rnd4c = [](float4 v) { return LDC ? make_float4(tf32r(v.x), tf32r(v.y), tf32r(v.z), tf32r(v.w)) : v; };
  const int nI = (n + 15) / 16;                     /* blocks with rows; I < nI have row terms */
  auto xo = [](int I) { return 8 * I * (I - 1); };
  for (int I = 1; I < nI; I++) {
    int r = 16 * I;
    float *XI = X + xo(I) * XS;
    for (int e = tid; e < r * (K16 / 4); e += BT) {   /* four columns at a time (float4) */
      int j = e / (K16 / 4), d = (e % (K16 / 4)) * 4;
      float4 kj = v4(kb, rk, j, d), gr = *(const float4 *)(Gs + r * KS + d),
             gj = *(const float4 *)(Gs + j * KS + d);
      *(float4 *)(XI + j * XS + d) = rnd4(make_float4(kj.x * kexp(gr.x - gj.x), kj.y * kexp(gr.y - gj.y),
                                                      kj.z * kexp(gr.z - gj.z), kj.w * kexp(gr.w - gj.w)));
    }
  }
  if constexpr (LDM)                                /* dA, dL from here MMA operands only (tf32) */
    for (int e = tid; e < 2 * C * CS / 4; e += BT) *(float4 *)(dAs + 4 * e) = rnd4(*(const float4 *)(dAs + 4 * e));
  __syncthreads();
  PH(3);
  for (int I = 1; I < nI; I++) {
    int r = 16 * I;
    const float *XI = X + xo(I) * XS;
    /* a tile's 4 outputs: rows ii, ii+8 of one half (dQ rows, then dKb rows), columns d0, d0+1 */
    auto at = [&](int ii, int d0) { return epi4_at(r + (ii & 15), d0, n, K, [&](int i) { return (int64_t)i; }); };
    struct pre4 { float a[4]; };
    auto xb = [&](int j, int d) { return XI[j * XS + d]; };
    auto epi = [&](int ii, int d0, float c0, float c1, float c2, float c3, const pre4 &pf) {
      float x[4] = {c0, c1, c2, c3};
      const epi4 e = at(ii, d0);
      /* a row's two columns (u, u + 1) in one global store (pairs2) */
#pragma unroll
      for (int u = 0; u < 4; u += 2)
        if (e.ok[u]) {
          bool n1 = e.ok[u + 1];
          int si = e.r[u] * KS + d0;
          float2 gi = ld2f(Gs + si, n1), gr = ld2f(Gs + r * KS + d0, n1);
          float y0 = x[u] * kexp(gi.x - gr.x), y1 = x[u + 1] * kexp(gi.y - gr.y);
          float *dst = ii < 16 ? dQg + e.r[u] * RS + d0 : KBS ? dKbs + si : dKbg + e.r[u] * RS + d0;
          st2f(dst, pf.a[u] + y0, pf.a[u + 1] + y1, n1);
          if (ii < 16) {
            dGs[si] += qv(e.r[u], d0) * y0;
            if (n1) dGs[si + 1] += qv(e.r[u], d0 + 1) * y1;
          }
        }
    };
    auto pre = [&](int ii, int d0) {
      const epi4 e = at(ii, d0);
      pre4 pf;
#pragma unroll
      for (int u = 0; u < 4; u += 2)
        if (e.ok[u]) {
          const float *src = ii < 16 ? dQg + e.r[u] * RS + d0 : KBS ? dKbs + e.r[u] * KS + d0 : dKbg + e.r[u] * RS + d0;
          float2 v = ld2f(src, e.ok[u + 1]);
          pf.a[u] = v.x, pf.a[u + 1] = v.y;
        }
      return pf;
    };
    if constexpr (LDM)   /* rows 0-15 dA's, 16-31 dL's (M = 32: the third range is never read) */
      mma_tf(32, K16, r, tft3{dAs + r * CS, dLs + r * CS, dLs + r * CS, CS, 16, 32}, xb, epi, pre);
    else
      mma_blk4<PT>(32, K16, r, [&](int ii, int j) { return ii < 16 ? dAs[(r + ii) * CS + j] : dl_row(r + ii - 16)[j]; },
                   xb, epi, pre);
  }
  PH(4);
  /* Column terms: block J against rows i > r' = 16 J + 15, factored around r'; X_J = [q_i ;
   * b_i k_i] e^{G_i - G_r'} (2 m16 rows). Blocks go in groups whose X_J fit X's C + 32 rows
   * together (at C = 64: {0}, {1, 2}). */
  auto m16of = [&](int J) { return r16(n - 16 * J - 16); };
  for (int J0 = 0, J1; J0 < nI - 1; J0 = J1) {
    int atcols;                                     /* <= final_at_cols(C): At holds the group's A tiles */
    J1 = col_group(J0, n, C, &atcols);
    __syncthreads();                                /* the previous products' reads of X (and A) done */
    for (int J = J0, xoff = 0, aoff = 0; J < J1; xoff += 2 * m16of(J), aoff += 16 * (2 * m16of(J) + 4), J++) {
      int rp = 16 * J + 15, mrow = n - rp - 1, m16 = m16of(J);
      float *XJ = X + xoff * XS;
      for (int e = tid; e < m16 * (K16 / 4); e += BT) {
        int ii = e / (K16 / 4), d = (e % (K16 / 4)) * 4, i = rp + 1 + ii;
        float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
        if (ii < mrow) {
          float4 gi = *(const float4 *)(Gs + i * KS + d), gr = *(const float4 *)(Gs + rp * KS + d),
                 qi = v4(qb, rq, i, d), ki = v4(kb, rk, i, d);
          float b = bs[i];
          float4 sc = make_float4(kexp(gi.x - gr.x), kexp(gi.y - gr.y), kexp(gi.z - gr.z), kexp(gi.w - gr.w));
          x0 = rnd4c(make_float4(qi.x * sc.x, qi.y * sc.y, qi.z * sc.z, qi.w * sc.w));
          x1 = rnd4c(make_float4(b * ki.x * sc.x, b * ki.y * sc.y, b * ki.z * sc.z, b * ki.w * sc.w));
        }
        *(float4 *)(XJ + ii * XS + d) = x0, *(float4 *)(XJ + (m16 + ii) * XS + d) = x1;
      }
      if (LDC)                                      /* A_J = [dA^T | dL^T] of rows i > r', tf32 */
        for (int e = tid; e < 32 * m16; e += BT) {
          int k = e >> 4, jj = e & 15, j = 16 * J + jj;
          float a = k < m16 ? (k < mrow ? dAs[(rp + 1 + k) * CS + j] : 0.f)
                            : (k - m16 < mrow ? dl_row(rp + 1 + k - m16)[j] : 0.f);
          At[aoff + jj * (2 * m16 + 4) + k] = LDM ? a : tf32r(a);   /* LDM: dA, dL already tf32 */
        }
    }
    __syncthreads();
    PH(5);
    for (int J = J0, xoff = 0, aoff = 0; J < J1; xoff += 2 * m16of(J), aoff += 16 * (2 * m16of(J) + 4), J++) {
      int rp = 16 * J + 15, mrow = n - rp - 1, m16 = m16of(J);
      const float *XJ = X + xoff * XS;
      auto at = [&](int jj, int d0) { return epi4_at(16 * J + jj, d0, n, K, [&](int j) { return (int64_t)j; }); };
      struct pre4 { float a[4]; };
      auto xb = [&](int k, int d) { return XJ[k * XS + d]; };
      auto epi = [&](int jj, int d0, float c0, float c1, float c2, float c3, const pre4 &pf) {
        float x[4] = {c0, c1, c2, c3};
        const epi4 e = at(jj, d0);
#pragma unroll
        for (int u = 0; u < 4; u += 2)              /* a row's two columns in one global store */
          if (e.ok[u]) {
            bool n1 = e.ok[u + 1];
            int sj = e.r[u] * KS + d0;
            float2 gr = ld2f(Gs + rp * KS + d0, n1), gj = ld2f(Gs + sj, n1);
            float y0 = x[u] * kexp(gr.x - gj.x), y1 = x[u + 1] * kexp(gr.y - gj.y);
            st2f(dKig + e.r[u] * RS + d0, pf.a[u] + y0, pf.a[u + 1] + y1, n1);
            dGs[sj] -= kv(e.r[u], d0) * y0;
            if (n1) dGs[sj + 1] -= kv(e.r[u], d0 + 1) * y1;
          }
      };
      auto pre = [&](int jj, int d0) {
        const epi4 e = at(jj, d0);
        pre4 pf;
#pragma unroll
        for (int u = 0; u < 4; u += 2)
          if (e.ok[u]) {
            float2 v = ld2f(dKig + e.r[u] * RS + d0, e.ok[u + 1]);
            pf.a[u] = v.x, pf.a[u + 1] = v.y;
          }
        return pf;
      };
      if (LDC) mma_tf(16, K16, 2 * m16, tft{At + aoff, 2 * m16 + 4}, xb, epi, pre);
      else
        mma_blk4<PT>(16, K16, 2 * m16,
                     [&](int jj, int k) {
                       int j = 16 * J + jj;
                       if (k < m16) return k < mrow ? dAs[(rp + 1 + k) * CS + j] : 0.f;
                       k -= m16;
                       return k < mrow ? dl_row(rp + 1 + k)[j] : 0.f;
                     },
                     xb, epi, pre);
    }
    PH(6);
  }
  __syncthreads();
  int lane = tid & 31, wp = tid >> 5;
  /* R terms with Kb's own gradient: R' = R + dKb e^G (the diagonal phase folded it in), and Kb =
   * b k e^G gives dk += b e^G dKb, dG += b k e^G dKb, dbeta += k e^G . dKb, so dk += b R',
   * dG += k b R', dbeta += k . R' (k_bwd_mat_tc's dbeta has the rest).
   * dq_out, dk_out (H == HV, K <= 128: a lane's 4 columns are the row's all): the row's dKi is
   * final here and its dQ since the row products, so their l2-norm backward (k_qk_bwd's: y = x r
   * gives dx = r dy - r^3 (dy . x) x, x the raw row, r its factor) runs here and dq, dk go out
   * in bf16; dQ, dKi in fp32 went to k_qk_bwd, which read them back with the raw q, k. The sums
   * run in another order than k_qk_bwd's (lanes strided by 32, not 4 adjacent columns). */
  for (int i = wp; i < n; i += BT / 32) {
    float acc = 0, b = bs[i], dot = 0, dotq = 0, y[4], yq[4];
    for (int d0 = lane; d0 < K; d0 += 128) {        /* 4 columns' loads in flight, same order */
      float R[4], dk[4], dw[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        int d = d0 + 32 * u;
        int gi = i * RS + d;
        if (d < K) R[u] = KBS ? dKbs[i * KS + d] : dKbg[gi], dk[u] = dKig[gi], dw[u] = dGs[i * KS + d];
        if (dk_out && d < K) yq[u] = dQg[gi];
      }
#pragma unroll
      for (int u = 0; u < 4; u++) {
        int d = d0 + 32 * u;
        if (d >= K) break;
        int gi = i * RS + d;
        float kn = kv(i, d);
        y[u] = dk[u] + b * R[u];
        if (dk_out) dot += y[u] * __bfloat162float(kb[i * QB + d]), dotq += yq[u] * __bfloat162float(qb[i * QB + d]);
        else dKig[gi] = y[u];
        dGs[i * KS + d] = dw[u] + kn * b * R[u];
        acc += kn * R[u];
      }
    }
    acc = kc_warp_sum(acc);
    if (!lane) dbi[i] = acc;
    if (dk_out) {
      const int gi0 = i * RS;
      float fk = rk[i], ck = fk * fk * fk * kc_warp_sum(dot), fq = rq[i], cq = fq * fq * fq * kc_warp_sum(dotq);
#pragma unroll
      for (int u = 0; u < 4; u++) {
        int d = lane + 32 * u;
        if (d >= K) break;
        stb(dk_out, g0 + (gi0 + d), p.l2 ? fk * y[u] - ck * __bfloat162float(kb[i * QB + d]) : y[u]);
        stb(dq_out, g0 + (gi0 + d), p.l2 ? fq * yq[u] - cq * __bfloat162float(qb[i * QB + d]) : yq[u]);
      }
    }
  }
  __syncthreads();
  PH(7);
  /* reverse cumsum + gate chain (§2.1), a column's rows in ns segments of L, a thread each
   * (one thread a column ran a 64-row chain on K of the block's threads: 7.5% of the kernel's
   * cycles at (8,2048,16,128)): each segment's dG total, then each segment's chain continued
   * from dGn plus the later segments' totals; ddt_bias partials summed in segment order.
   * X is free here. H200, one run: fwd+bwd (8,2048,16,128) 5.04 -> 5.00 ms, (1,8192,16,128)
   * 3.111 -> 3.089, precise 9.41 -> 9.36 */
  float ea = A_log ? expf(A_log[h]) : 1.f, dAl = 0;
  const int64_t gp = ((int64_t)cb * HV + h) * (K + 1);
  const int ns = BT / (int)K < 8 ? BT / (int)K : 8, L = (n + ns - 1) / ns, d = tid % (int)K, s = tid / (int)K;
  auto dg_at = [&](int r) { return dGs[r * KS + d]; };
  if (ns >= 2) {
    float *segT = X, *segD = X + ns * K16;            /* [ns][K16] totals, ddt_bias partials */
    const int lo = s * L, hi = (s + 1) * L < n ? (s + 1) * L - 1 : n - 1;
    if (s < ns) {
      float t = 0;
      for (int r = hi; r >= lo; r--) t += dg_at(r);
      segT[s * K16 + d] = t;
    }
    __syncthreads();
    if (s < ns) {
      float acc = dGn[d];
      for (int s2 = ns - 1; s2 > s; s2--) acc += segT[s2 * K16 + d];
      segD[s * K16 + d] = gate_chain_col(p, dg_at, g, dt_bias, A_log != NULL, dg, t0, h, lo, hi, d, acc, ea, &dAl);
    }
    __syncthreads();
    for (int c = tid; c < K; c += BT) {
      float t = 0;
      for (int s2 = 0; s2 < ns; s2++) t += segD[s2 * K16 + c];
      w.gpart[gp + c] = t;
    }
  } else
    for (int c = tid; c < K; c += BT)
      w.gpart[gp + c] = gate_chain_col(p, [&](int r) { return dGs[r * KS + c]; }, g, dt_bias, A_log != NULL, dg, t0,
                                       h, 0, n - 1, c, dGn[c], ea, &dAl);
  dAl = block_sum(dAl, red);
  if (tid == 0) w.gpart[gp + K] = dAl;
  PH(8);
  for (int r = tid; r < n; r += BT) {              /* beta chain (§2.2) */
    float db = w.db[ROWI(r)] + dbi[r], x = ldb(beta, ROWI(r));
    if (p.beta_mode) {
      float s = sigm(x);
      db *= (p.beta_mode == 2 ? 2.f : 1.f) * s * (1 - s);
    }
    stb(dbeta, ROWI(r), db);
  }
  PH(9);
}
template <bool PR, bool CM, int KV>
__global__ void __launch_bounds__(NTC, 1) k_bwd_final_tc(kp p, const void *q, const void *k, const void *g,
                                                        const void *beta, const float *A_log, const float *dt_bias,
                                                        void *dg, void *dbeta, void *dq_out, void *dk_out, ws w) {
  /* a compiled shape's full chunk (kv_fix: C = 64) with n = 64 fixed. H200, 2026-12-02s28g: graph
   * (32,512,4,64) 0.456 -> 0.453 ms, (8,512,4,64) 0.147 -> 0.145 (the compact form's spill gone);
   * the large shapes within the rounds' spread (this kernel 1290 -> 1279 us at (8,2048,16,128)) */
  if (full_chunk<PR, KV>(p, w.ctab, blockIdx.x))
    bwd_final_tc<PR, CM, KV, FULL_NF<PR, KV>>(p, q, k, g, beta, A_log, dt_bias, dg, dbeta, dq_out, dk_out, w);
  else bwd_final_tc<PR, CM, KV, 0>(p, q, k, g, beta, A_log, dt_bias, dg, dbeta, dq_out, dk_out, w);
}
final_tc_fn k_bwd_final_tc_pick(bool pr, bool cm, int kv) {
  static const final_tc_fn t[2][2][3] = {{KV_SLOTS(k_bwd_final_tc, false, false), KV_SLOTS(k_bwd_final_tc, false, true)},
                                         {KV_SLOTS(k_bwd_final_tc, true, false), KV_SLOTS(k_bwd_final_tc, true, true)}};
  return t[pr][cm][kv_slot(kv)];
}

#ifdef KDA_PHASES
void kda_phase_take_bwd(unsigned long long (*c)[KDA_PH_PHASES + 1]) { kda_phase_take(c); }
#endif
