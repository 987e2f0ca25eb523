/* kda_state_wide.cu — the fast state passes at 64 V columns a block (BVW), the state in
 * registers: the forward pass (k_state_fwd_tc_wide) and the kept reverse sweep of the backward
 * (k_state_bwd_tc_wide), for the compiled shapes (K = V = 64 or 128, chunk 64) whose 32-column
 * grid needs more than one wave of two blocks an SM (kda_cuda.cu's use_wide).
 *
 * Why: a 32-column step's products are small (Vn and o 64 x 32: eight 16 x 16 tiles, half of
 * the 16 warps idle) and its time is barriers, staging and shared-memory latency rather than
 * MMAs (docs/kda_passes.md, thirteenth pass: shorter MMA chains made the steps no faster). At 64
 * columns a step does twice the work with the same barriers and the same staged chunk tiles
 * (W, s qg, kg, Aqk: every block of a head reads them all), so a grid of half the blocks does
 * the pass. The fp32 state is what did not fit: at 64 columns the narrow layout is 139 KB at
 * K = 128 (one block an SM); with S in the MMA accumulators' registers (warp w owns the 16 x 16
 * tiles w + u NW of the K x 64 state, 8 values a tile a thread) it is 104.5 KB forward, 96.5 KB
 * reverse: two blocks an SM, as the narrow passes. NTW = 256 threads (8 warps, four state tiles
 * a warp at K = 128, 127 registers): at 512 (two tiles a warp) the 64-register bound of two
 * blocks an SM spilled ~100 bytes and the passes were slower (H200, fwd+bwd (8,2048,16,128)
 * 3.76 ms against 3.71; kda_cuda.cu's use_wide has the gain). Same products of the same
 * operands in the same k order as k_state_fwd_tc / k_state_bwd_tc (a 16 x 16 tile's sums do not
 * depend on how many columns a block holds, nor on which of a warp's tiles goes first: wide_acc
 * runs a warp's tiles side by side), the same update e^{G_last} S + x: bit-identical outputs
 * (test_kda_cuda compares the two on every compiled case). */
#include "kda_tc.cuh"
#include "kda_state.cuh"

/* The wide layout (bf16 tiles, no fp32 S): W, s qg, kg [C][KB], Aqk [C][CB], Sb [K16][DB],
 * Vb [C][DB], then the forward's fp32 U / Vn tile [C][SB] or the reverse sweep's dO [C][DB],
 * then en [K16]. */
static __device__ st_tiles<sbf> st_carve_wide(const kp &p, float *sm, bool fwd) {
  st_tiles<sbf> t;
  t.bv = BVW, t.K16 = r16(p.K), t.KB = t.K16 + 8, t.CB = p.C + 8, t.SB = BVW + 4, t.DB = BVW + 8;
  t.W = (sbf *)sm, t.qg = t.W + p.C * t.KB, t.kg = t.qg + p.C * t.KB, t.A = t.kg + p.C * t.KB;
  t.Sb = t.A + p.C * t.CB, t.Vb = t.Sb + t.K16 * t.DB;
  t.S = t.dV = nullptr, t.Vn = nullptr, t.dO = nullptr;
  if (fwd) t.Vn = (float *)(t.Vb + p.C * t.DB), t.en = t.Vn + p.C * t.SB;
  else t.dO = t.Vb + p.C * t.DB, t.en = (float *)(t.dO + p.C * t.DB);
  return t;
}
size_t smem_state_wide(int64_t C, int64_t K, int fwd) {
  int64_t K16 = r16(K), KB = K16 + 8, CB = C + 8, SB = BVW + 4, DB = BVW + 8;
  size_t b = (size_t)(3 * C * KB + C * CB + K16 * DB + C * DB) * 2 + (size_t)K16 * 4;
  return b + (fwd ? (size_t)C * SB * 4 : (size_t)C * DB * 2);
}

/* The state's registers: warp wp owns the 16 x 16 tiles wp + u NW (u < NU) of the K16 x BVW
 * state in warp_tiles16's order (tile / tn a row block, tile % tn a column block, tn = BVW / 16;
 * NW a multiple of tn, so a warp's tiles share their columns); s[u][half][4] are the tile's two
 * 16 x 8 halves as MMA C fragments: rows g, g + 8, columns 2 (lane % 4) + {0, 1} of the half. */
template <int NU> struct st_reg {
  float s[NU][2][4];
};
/* f(u, hf, q, row, col): each of a thread's state entries (q: 0..3, the C fragment's index) */
template <int NU, int NW, class F> static __device__ __forceinline__ void st_reg_each(F f) {
  constexpr int tn = BVW / 16;
  static_assert(NW % tn == 0, "a warp's tiles share their columns");
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, g = lane >> 2, q2 = 2 * (lane & 3);
#pragma unroll
  for (int u = 0; u < NU; u++) {
    int i0 = ((wp + u * NW) / tn) << 4, j0 = ((wp + u * NW) % tn) << 4;
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
#pragma unroll
      for (int q = 0; q < 4; q++) f(u, hf, q, i0 + g + 8 * (q >> 1), j0 + 8 * hf + q2 + (q & 1));
  }
}
/* R, Sb <- the state at src + base (columns c0 ..; zero where src is NULL or past K, V) */
template <int NU, int NW>
static __device__ __forceinline__ void st_reg_ld(const kp &p, const float *src, int64_t base, int64_t c0,
                                                 const st_tiles<sbf> &t, st_reg<NU> &R) {
  st_reg_each<NU, NW>([&](int u, int hf, int q, int d, int c) {
    float x = src && d < p.K && c0 + c < p.V ? src[base + d * p.V + c0 + c] : 0.f;
    R.s[u][hf][q] = x;
    t.Sb[d * t.DB + c] = __float2bfloat16(x);
  });
}
/* dst + base <- R (rows d < K, columns c0 + c < V) */
template <int NU, int NW>
static __device__ __forceinline__ void st_reg_st(const kp &p, float *dst, int64_t base, int64_t c0,
                                                 const st_tiles<sbf> &t, const st_reg<NU> &R) {
  st_reg_each<NU, NW>([&](int u, int hf, int q, int d, int c) {
    if (d < p.K && c0 + c < p.V) dst[base + d * p.V + c0 + c] = R.s[u][hf][q];
  });
}
/* mma_ldm's accumulation (ldm_acc: the same fragments, k order and accumulators) for the
 * 16 x 16 tiles wp + u NW (u < NU) of the K x BVW state, which share their columns: the warp's
 * NU tiles interleaved k step by k step, one B fragment for all of them, into registers the
 * update keeps. Vn, o and dVn take their warp's two tiles the same way (mma_ldm's pairing,
 * NPM = 2, at this loop's unroll): against one tile at a time, each with its own B fragment,
 * H200, one run, three rounds, (8,2048,16,128) fwd 1.166-1.170 -> 1.141-1.150 ms, fwd+bwd
 * 3.725-3.727 -> 3.699-3.704 */
template <int NU, int NW>
static __device__ __forceinline__ void wide_acc(float (&c)[NU][2][4], bt A0, bt B0, int K0, bt A1, bt B1, int K1) {
  constexpr int tn = BVW / 16;
  static_assert(NW % tn == 0, "a warp's tiles share their columns");
  int wp = threadIdx.x >> 5, i0[NU];
#pragma unroll
  for (int u = 0; u < NU; u++) i0[u] = ((wp + u * NW) / tn) << 4;
  ldm_acc<NU, 1>(i0, (wp % tn) << 4, A0, B0, K0, A1, B1, K1, c);   /* unroll 1: registers (NU = 4 at K = 128) */
}
/* R <- e^{G_last} R + (A0 B0 (K0) + A1 B1 (K1)), Sb <- its bf16 shadow: wide_acc's product with
 * the update st_s_upd2 applies */
template <int NU, int NW>
static __device__ __forceinline__ void st_reg_upd(const st_tiles<sbf> &t, st_reg<NU> &R, bt A0, bt B0, int K0,
                                                  bt A1, bt B1, int K1) {
  float c[NU][2][4] = {};
  wide_acc<NU, NW>(c, A0, B0, K0, A1, B1, K1);
  st_reg_each<NU, NW>([&](int u, int hf, int q, int d, int col) {
    R.s[u][hf][q] = t.en[d] * R.s[u][hf][q] + c[u][hf][q];
    if (q & 1)   /* the pair (q - 1, q): one bf16x2 store */
      *(__nv_bfloat162 *)(t.Sb + d * t.DB + col - 1) = __floats2bfloat162_rn(R.s[u][hf][q - 1], R.s[u][hf][q]);
  });
}

/* The forward pass (k_state_fwd_tc's steps and cp.async groups at 64 columns) */
template <int KV>
__global__ void __launch_bounds__(NTW, 2) k_state_fwd_tc_wide(kp p, ws w, const float *h0, void *o, float *ht) {
  extern __shared__ __align__(16) float sm[];
  kv_fix<KV, NTW>(p);
  /* a warp's tiles: NU of the K x BVW state, NC of the C x BVW products (C = 64: kv_fix), which
   * mma_ldm's pairing takes together (NPM = 2) */
  constexpr int NW = NTW / 32, NU = (KV / 16) * (BVW / 16) / NW, NC = (64 / 16) * (BVW / 16) / NW;
  static_assert(NC == 2, "mma_ldm pairs a warp's two tiles");
  const st_blk b = st_block(p, w, blockIdx.x, BVW);
  const int64_t h = b.h, c0 = b.c0, V = p.V, HV = p.HV;
  const int HVV = (int)(HV * V);                  /* elements between a chunk's rows */
  const int cf = b.cf, cl = b.cl;
  const st_tiles<sbf> t = st_carve_wide(p, sm, true);
  PH_INIT(1);
  st_reg<NU> R;
  st_reg_ld<NU, NW>(p, h0, b.sbase, c0, t, R);
  if (cf < cl) st_stage(p, w, t, w.ctab[4 * cf + 1], w.ctab[4 * cf + 2], h, c0, nullptr, SG_W | SG_QG | SG_A | SG_U);
  cp_async_commit();
  for (int ci = cf; ci < cl; ci++) {
    int64_t t0 = w.ctab[4 * ci + 1];
    bf16 *o0 = (bf16 *)o + (t0 * HV + h) * V + c0;      /* chunk row 0 */
    int m = w.ctab[4 * ci + 2];
    st_glast gl = st_fwd_top(p, w, t, ci, t0, m, h, c0);
    PH(0);
    mma_ldm<NC, 1>(p.C, BVW, bt{t.W, t.KB, 1}, bt{t.Sb, t.DB, 0}, t.K16, bt{}, bt{}, 0,   /* Vn = U - W S */
                   pairs2(st_vn_epi(p, t, t0, m, h, c0, w.vn)));
    __syncthreads();                               /* the fp32 Vn tile (U) is dead */
    PH(1);
    if (ci + 1 < cl) st_stage(p, w, t, w.ctab[4 * ci + 5], w.ctab[4 * ci + 6], h, c0, nullptr, SG_U);
    cp_async_commit();
    mma_ldm<NC, 1>(p.C, BVW, bt{t.qg, t.KB, 1}, bt{t.Sb, t.DB, 0}, t.K16, bt{t.A, t.CB, 1}, bt{t.Vb, t.DB, 0}, p.C,
                   pairs2([&](int r, int c, float x0, float x1) {
                     if (r < m && c0 + c < V) st2b(o0 + r * HVV + c, x0, x1, c0 + c + 1 < V);
                   }));
    st_en_store(p, t, gl);
    cp_async_wait_group<1>();                      /* kg (the next U may fly) */
    __syncthreads();                               /* W, qg, Aqk and Sb's readers done */
    PH(2);
    if (ci + 1 < cl)
      st_stage(p, w, t, w.ctab[4 * ci + 5], w.ctab[4 * ci + 6], h, c0, nullptr, SG_W | SG_QG | SG_A);
    cp_async_commit();
    st_reg_upd<NU, NW>(t, R, bt{t.kg, t.KB, 0}, bt{t.Vb, t.DB, 0}, p.C, bt{}, bt{}, 0);
    PH(3);
  }
  if (ht) st_reg_st<NU, NW>(p, ht, b.sbase, c0, t, R);
}

/* The kept reverse sweep (state_bwd_tc's fast steps and cp.async groups at 64 columns): dS in
 * registers, dVn in fp32 and bf16 (st_dvn) as there */
template <int KV>
__global__ void __launch_bounds__(NTW, 2) k_state_bwd_tc_wide(kp p, ws w, const void *dout, const float *dht,
                                                              float *dh0) {
  extern __shared__ __align__(16) float sm[];
  kv_fix<KV, NTW>(p);
  /* a warp's tiles, as in the forward pass */
  constexpr int NW = NTW / 32, NU = (KV / 16) * (BVW / 16) / NW, NC = (64 / 16) * (BVW / 16) / NW;
  static_assert(NC == 2, "mma_ldm pairs a warp's two tiles");
  const st_blk b = st_block(p, w, blockIdx.x, BVW);
  const int64_t h = b.h, c0 = b.c0, V = p.V, HV = p.HV;
  const int HVV = (int)(HV * V);
  const int cf = b.cf, cl = b.cl;
  const st_tiles<sbf> t = st_carve_wide(p, sm, false);
  PH_INIT(2);
  st_reg<NU> R;
  st_reg_ld<NU, NW>(p, dht, b.sbase, c0, t, R);   /* R, Sb hold dS (§4.2) */
  if (cf < cl)
    st_stage(p, w, t, w.ctab[4 * (cl - 1) + 1], w.ctab[4 * (cl - 1) + 2], h, c0, nullptr, SG_A | SG_KG);
  cp_async_commit();
  for (int ci = cl - 1; ci >= cf; ci--) {
    int64_t t0 = w.ctab[4 * ci + 1];
    float *dvn0 = w.dvn + (t0 * HV + h) * V + c0;
    bf16 *dvb0 = w.dvnb + (t0 * HV + h) * V + c0;
    int m = w.ctab[4 * ci + 2];
    st_glast gl = st_rev_top(p, w, t, ci, t0, m, h, c0, dout);
    PH(3);
    /* dVn = [Aqk^T | kg] [dO ; dS]; -dVn into Vb, dVn to the global fp32 and bf16 copies */
    mma_ldm<NC, 1>(p.C, BVW, bt{t.A, t.CB, 0}, bt{t.dO, t.DB, 0}, p.C, bt{t.kg, t.KB, 1}, bt{t.Sb, t.DB, 0}, t.K16,
                   pairs2([&](int r, int c, float x0, float x1) {
                     st_dvn(t, r, c, x0, x1, m, c0 + c < V, c0 + c + 1 < V, dvn0 + r * HVV + c, dvb0 + r * HVV + c);
                   }));
    st_en_store(p, t, gl);
    cp_async_wait_group<0>();                      /* s qg, W */
    __syncthreads();                               /* Aqk, kg dead; Sb's readers done */
    PH(4);
    if (ci > cf) st_stage(p, w, t, w.ctab[4 * ci - 3], w.ctab[4 * ci - 2], h, c0, nullptr, SG_A | SG_KG);
    cp_async_commit();
    /* dS <- e^{G_last} dS + [s qg^T | -W^T] [dO ; dVn] */
    st_reg_upd<NU, NW>(t, R, bt{t.qg, t.KB, 0}, bt{t.dO, t.DB, 0}, p.C, bt{t.W, t.KB, 0}, bt{t.Vb, t.DB, 0}, p.C);
    PH(5);
  }
  if (dh0) st_reg_st<NU, NW>(p, dh0, b.sbase, c0, t, R);
}

#ifdef KDA_PHASES
void kda_phase_take_wide(unsigned long long (*c)[KDA_PH_PHASES + 1]) { kda_phase_take(c); }
#endif
/* kv = 64 or 128 (the compiled shapes); NULL otherwise */
state_fwd_fn k_state_fwd_tc_wide_pick(int kv) {
  return kv == 128 ? k_state_fwd_tc_wide<128> : kv == 64 ? k_state_fwd_tc_wide<64> : nullptr;
}
state_bwd_db_fn k_state_bwd_tc_wide_pick(int kv) {
  return kv == 128 ? k_state_bwd_tc_wide<128> : kv == 64 ? k_state_bwd_tc_wide<64> : nullptr;
}
