/* kda_state_wg.cu — the wide forward state pass (kda_state_wide.cu's k_state_fwd_tc_wide: 64 V
 * columns a block, the state in registers) on Hopper's warpgroup MMAs (kda_wgmma.cuh), at the
 * compiled K = V = 128, chunk 64. Compiled for sm_90a alone (the Makefile's WGFLAGS); the host
 * runs it on compute capability 9.0 wherever the wide pass would run, unless KDA_KDA_WG=0
 * (kda_cuda.cu use_wg).
 *
 * Why: the mma.sync pass spends a step (14.3k cycles a block at (8,2048,16,128), phase
 * counters 2026-12-04s42b) on ~1.5k warp instructions of which 112 are MMAs: ldmatrix
 * fragments, their addresses, the k loop (not unrolled: 127 of 128 registers); ncu: IMAD and
 * LEA 32% of its instructions, short-scoreboard and fixed-latency waits 56% of its stalls. A
 * wgmma reads both operands from shared memory itself, so a product is a few instructions a
 * warp and its latency runs beside the epilogue work of the other products.
 *
 * Every product is taken transposed, so that its M side is the block's 64 V columns n (one
 * m64 tile) and the state Sᵀ (n x k) stays in the update's accumulators:
 *   Vnᵀ = Uᵀ − Sᵀ Wᵀ           (N = 64 chunk rows i, k over K)
 *   oᵀ  = Sᵀ (s qg)ᵀ + Vnᵀ Aqkᵀ  (N = i, k over K then over the chunk's columns j)
 *   Sᵀ ← e^{G_last} ⊙ Sᵀ + Vnᵀ kg (N = K, k over j)
 * Warpgroup g takes rows i in [32 g, 32 g + 32) of Vnᵀ and oᵀ (m64n32) and state columns
 * k in [64 g, 64 g + 64) of the update (m64n64: 32 registers a thread hold its part of Sᵀ).
 * The A operands (Sᵀ and Vnᵀ, bf16 shadows) are K-major tiles the epilogues write; the B
 * operands W, s qg, Aqk are K-major as staged ([i][k], [i][j]); kg ([j][k]) is MN-major.
 * Outputs as the wide pass's (o, the kept S entering each chunk and Vn in bf16, ht in fp32);
 * the sums run in the tensor cores' order, and the update adds kgᵀVn to the scaled state
 * instead of scaling after, so the outputs are not bit-identical to the mma.sync passes':
 * test_kda_cuda holds them to the CPU reference's tolerances instead. */
#include "kda_tc.cuh"
#include "kda_state.cuh"
#include "kda_wgmma.cuh"

enum { WG_K = 128, WG_C = 64, WG_SB = BVW + 4 };
/* bytes of the layout (the swizzled bf16 tiles from a 1024-byte aligned base, then U fp32
 * [C][SB], then en [K]), with the alignment's slack */
size_t smem_state_wg(void) {
  return (size_t)(3 * WG_C * WG_K + WG_C * WG_C + BVW * WG_K + BVW * WG_C) * 2 + (size_t)WG_C * WG_SB * 4 + WG_K * 4 +
         1024;
}
/* a K-major descriptor's step to column k0 (a multiple of 16) of a 64-row tile: within an atom
 * 2 k0 bytes, each atom 8 KB; in the descriptor's 16-byte units */
#define WG_KADV(k0) ((uint64_t)((((k0) >> 6) * 8192 + ((k0) & 63) * 2) >> 4))

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
/* cp.async of chunk rows [0, m) of a bf16 [rows][KD] global tile (row r at g + r gs) into the
 * swizzled layout, zeros past m: consecutive threads take a row's consecutive 16-byte chunks
 * (whole sectors in global memory; eight of them fill the 32 banks once, swizzled or not) */
template <int R, int KD>
static __device__ __forceinline__ void wg_stage(sbf *s, const sbf *g, int gs, int m) {
  for (int e = threadIdx.x; e < R * KD / 8; e += NTW) {
    int r = e / (KD / 8), kc = (e % (KD / 8)) << 3;
    bool ok = r < m;
    cp_async16(s + wg_off<R>(r, kc), g + (ok ? r : 0) * gs + kc, ok);
  }
}
struct wg_tiles {
  sbf *W, *qg, *kg, *A;
};
/* the parts asked for (st_stage's SG_*) of chunk ci: U into tu's fp32 tile, the bf16 tiles
 * blocked */
static __device__ __forceinline__ void wg_stage_parts(const kp &p, const ws &w, const st_tiles<sbf> &tu,
                                                      const wg_tiles &t, int ci, int64_t h, int64_t c0, int parts) {
  const int64_t t0 = w.ctab[4 * ci + 1], r0 = t0 * p.HV + h;
  const int m = w.ctab[4 * ci + 2], HVK = (int)p.HV * WG_K, HVC = (int)p.HV * WG_C;
  if (parts & SG_U) st_stage(p, w, tu, t0, m, h, c0, nullptr, SG_U, threadIdx.x, NTW);
  if (parts & SG_W) wg_stage<WG_C, WG_K>(t.W, w.Wb + r0 * WG_K, HVK, m);
  if (parts & SG_QG) wg_stage<WG_C, WG_K>(t.qg, w.qgb + r0 * WG_K, HVK, m);
  if (parts & SG_A) wg_stage<WG_C, WG_C>(t.A, w.Ab + r0 * WG_C, HVC, m);
  if (parts & SG_KG) wg_stage<WG_C, WG_K>(t.kg, w.kgb + r0 * WG_K, HVK, m);
}
/* Store a swizzled bf16 tile T (64 rows n, columns r: Sᵀ, Vnᵀ or oᵀ) transposed to global
 * rows r < m of 64 bf16 columns each (row r at d + r ds, 16-byte aligned). Two lanes take a
 * column pair (r, r + 1) and a group of 16 rows n, 8 each, and store 16 bytes to each of the two
 * rows: a warp's store writes 16 whole 32-byte sectors (a lane alone, half sectors whose other
 * halves come from another warp). A lane reads one word (r, r + 1) of each of its 8 rows; the
 * second lane of a pair takes its rows in the order u ^ 4, so that the pair's words fall in
 * different banks (rows n and n + 8 share a swizzle) and a warp's 32 reads fill the 32 banks
 * once. It was 2-byte stores from the fragments (S 32, Vn 16, o 16 a thread a step); the
 * mma.sync pass stores S from its shadow in 16-byte rows too */
template <int RC>
static __device__ __forceinline__ void wg_store_t(sbf *d, int ds, const sbf *T, int m) {
  for (int e = threadIdx.x; e < RC * 4; e += NTW) {   /* 2 halves x RC / 2 column pairs x 4 groups of 16 rows */
    const int hf = e & 1, f = e >> 1, r = 2 * (f % (RC / 2)), n0 = 16 * (f / (RC / 2)) + 8 * hf, sw = 4 * hf;
    uint32_t y[8], x[8];
#pragma unroll
    for (int u = 0; u < 8; u++) y[u] = *(const uint32_t *)(T + wg_off<64>(n0 + (u ^ sw), r));
#pragma unroll
    for (int u = 0; u < 8; u++) x[u] = hf ? y[u ^ 4] : y[u];   /* x[u]: row n0 + u */
    if (r < m)
      stg16(d + r * ds + n0, __byte_perm(x[0], x[1], 0x5410), __byte_perm(x[2], x[3], 0x5410),
            __byte_perm(x[4], x[5], 0x5410), __byte_perm(x[6], x[7], 0x5410));
    if (r + 1 < m)
      stg16(d + (r + 1) * ds + n0, __byte_perm(x[0], x[1], 0x7632), __byte_perm(x[2], x[3], 0x7632),
            __byte_perm(x[4], x[5], 0x7632), __byte_perm(x[6], x[7], 0x7632));
  }
}
/* A pass's state in its update's accumulators (Sᵀ forward, dSᵀ reverse): warpgroup g's
 * s[4 j + q] = X[k][n], n = rn + 8 (q / 2), k = 64 g + 8 j + cq + q % 2, with X the [K][V]
 * fp32 state at src + sb, the block's columns from c0 (zeros without src) */
static __device__ __forceinline__ void wg_state_ld(float (&s)[32], const float *src, int64_t sb, int64_t c0, int64_t V,
                                                   int g, int rn, int cq) {
#pragma unroll
  for (int j = 0; j < 8; j++)
#pragma unroll
    for (int q = 0; q < 4; q++) {
      int n = rn + 8 * (q >> 1), k = 64 * g + 8 * j + cq + (q & 1);
      s[4 * j + q] = src ? src[sb + k * V + c0 + n] : 0.f;
    }
}
static __device__ __forceinline__ void wg_state_st(const float (&s)[32], float *dst, int64_t sb, int64_t c0, int64_t V,
                                                   int g, int rn, int cq) {
#pragma unroll
  for (int j = 0; j < 8; j++)
#pragma unroll
    for (int q = 0; q < 4; q++) dst[sb + (64 * g + 8 * j + cq + (q & 1)) * V + c0 + rn + 8 * (q >> 1)] = s[4 * j + q];
}
/* St <- bf16(the state), St swizzled [n][k] (pairs of adjacent k: one 4-byte store) */
static __device__ __forceinline__ void wg_shadow(sbf *St, const float (&s)[32], int g, int rn, int cq) {
#pragma unroll
  for (int j = 0; j < 8; j++)
#pragma unroll
    for (int hq = 0; hq < 2; hq++)
      *(__nv_bfloat162 *)(St + wg_off<64>(rn + 8 * hq, 64 * g + 8 * j + cq)) =
          __floats2bfloat162_rn(s[4 * j + 2 * hq], s[4 * j + 2 * hq + 1]);
}
/* s ← e^{G_last} ⊙ s: the update's decay of warpgroup g's state columns (en[k], k = 64 g + 8 j +
 * cq + q % 2) */
static __device__ __forceinline__ void wg_decay(float (&s)[32], const float *en, int g, int cq) {
#pragma unroll
  for (int j = 0; j < 8; j++)
#pragma unroll
    for (int q = 0; q < 4; q++) s[4 * j + q] *= en[64 * g + 8 * j + cq + (q & 1)];
}
/* The reverse sweep's two products (the two kernels below share them), each issued and committed:
 * dVnᵀ = dOᵀ Aqk + dSᵀ kgᵀ (m64n32: dO an MN-major A, Aqk an MN-major B, St a K-major A, kg a
 * K-major B, each descriptor at warpgroup g's offsets) ... */
static __device__ __forceinline__ void wb_dvn(float (&x)[16], uint64_t dD, uint64_t dA, uint64_t dS, uint64_t dK) {
  wg_fence();
#pragma unroll
  for (int j0 = 0; j0 < WG_C; j0 += 16) wg_m64n32k16<1, 1>(x, dD + 8 * j0, dA + 8 * j0, j0 > 0);
#pragma unroll
  for (int k0 = 0; k0 < WG_K; k0 += 16) wg_m64n32k16<0>(x, dS + WG_KADV(k0), dK + WG_KADV(k0), 1);
  wg_commit();
}
/* ... and dSᵀ += dOᵀ s qg − dVnᵀ W (m64n64: s qg and W MN-major B's, Vt a K-major A) */
static __device__ __forceinline__ void wb_update(float (&s)[32], uint64_t dD, uint64_t dQ, uint64_t dV, uint64_t dW) {
  wg_fence();
#pragma unroll
  for (int i0 = 0; i0 < WG_C; i0 += 16) wg_m64n64k16<1, 1>(s, dD + 8 * i0, dQ + 8 * i0, 1);
#pragma unroll
  for (int i0 = 0; i0 < WG_C; i0 += 16) wg_m64n64k16<1, 0, -1>(s, dV + WG_KADV(i0), dW + 8 * i0, 1);
  wg_commit();
}
/* dVnᵀ's fragment (rows n = rn, rn + 8; chunk rows i of warpgroup g's half) to Vt (bf16 [n][i],
 * the update's A) and to the fp32 tile Dv ([i][n], row pitch ds: the stores to global read it) */
static __device__ __forceinline__ void wb_dvn_out(const float (&x)[16], sbf *Vt, float *Dv, int ds, int g, int rn,
                                                  int cq) {
#pragma unroll
  for (int j = 0; j < 4; j++)
#pragma unroll
    for (int hq = 0; hq < 2; hq++) {
      const int n = rn + 8 * hq, i = 32 * g + 8 * j + cq;
      const float x0 = x[4 * j + 2 * hq], x1 = x[4 * j + 2 * hq + 1];
      *(__nv_bfloat162 *)(Vt + wg_off<64>(n, i)) = __floats2bfloat162_rn(x0, x1);
      Dv[i * ds + n] = x0, Dv[(i + 1) * ds + n] = x1;
    }
}
#endif

__global__ void __launch_bounds__(NTW, 2) k_state_fwd_tc_wg(kp p, ws w, const float *h0, void *o, float *ht) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t raw[];
  kv_fix<WG_K, NTW>(p);
  constexpr int K = WG_K, C = WG_C;
  sbf *W = (sbf *)(raw + ((1024 - (smem_u32(raw) & 1023)) & 1023)), *qg = W + C * K, *kg = qg + C * K, *A = kg + C * K, *St = A + C * C, *Vt = St + BVW * K;
  float *U = (float *)(Vt + BVW * C), *en = U + C * WG_SB;
  const st_blk b = st_block(p, w, blockIdx.x, BVW);
  const int64_t h = b.h, c0 = b.c0, V = p.V, HV = p.HV;
  const int HVV = (int)(HV * V);
  const int cf = b.cf, cl = b.cl;
  const int g0 = threadIdx.x >> 7, wq = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31;
  const int rn0 = 16 * wq + (l >> 2), cq0 = 2 * (l & 3);   /* a fragment's first row (n), column pair */
  st_tiles<sbf> tu = {};                          /* U's tile (st_stage's SG_U) and en (st_en_store) */
  tu.Vn = U, tu.en = en, tu.SB = WG_SB, tu.K16 = K, tu.bv = BVW;
  const wg_tiles tl = {W, qg, kg, A};
  /* the operands' descriptors at k = 0 (WG_KADV(k0) steps them along k), before the
   * warpgroup's offsets (rows 32 g of W, s qg, Aqk: 4 KB a warpgroup, 256 units; kg MN-major:
   * atom g, 8 KB, its eight rows 1024 bytes, sixteen 2048: 128 units) */
  const uint64_t dS = wg_desc(St, 16, 1024), dW0 = wg_desc(W, 16, 1024), dQ0 = wg_desc(qg, 16, 1024),
                 dV = wg_desc(Vt, 16, 1024), dA0 = wg_desc(A, 16, 1024), dK0 = wg_desc(kg, 8192, 1024);
  float s[32];                                      /* Sᵀ (wg_state_ld's layout) */
  wg_state_ld(s, h0, b.sbase, c0, V, g0, rn0, cq0);
  wg_shadow(St, s, g0, rn0, cq0);
  if (cf < cl) wg_stage_parts(p, w, tu, tl, cf, h, c0, SG_U | SG_W | SG_QG | SG_A);
  cp_async_commit();
  sbf *o0p = nullptr;                               /* the previous chunk's o (row 0) and rows */
  int mp = 0;
  for (int ci = cf; ci < cl; ci++) {
    /* the thread's indices, opaque to the compiler each step, so that the addresses formed from
     * them are formed where they are used instead of hoisted out of the loop (which held ~60 of
     * them: 128 registers and 180 bytes of spills, ncu's long-scoreboard waits 46% of the
     * stalls) */
    int g = g0, rn = rn0, cq = cq0;
    asm volatile("" : "+r"(g), "+r"(rn), "+r"(cq));
    const uint64_t dW = dW0 + 256 * g, dQ = dQ0 + 256 * g, dA = dA0 + 256 * g, dK = dK0 + 512 * g;
    const int64_t t0 = w.ctab[4 * ci + 1];
    const int m = w.ctab[4 * ci + 2];
    sbf *o0 = (sbf *)o + (t0 * HV + h) * V + c0;      /* chunk row 0, the block's first column */
    wg_proxy_fence();                                 /* St (this thread's stores) to the wgmma reads */
    __syncthreads();                                  /* the previous update's readers of kg, Vt done; St whole */
    if (ci > cf) wg_store_t<C>(o0p, HVV, Vt, mp);      /* the previous chunk's o, parked in Vt */
    if (w.h)                                          /* the state entering the chunk, bf16 [K][V] */
      wg_store_t<K>((sbf *)w.h + (int64_t)ci * HV * K * V + h * K * V + c0, (int)V, St, K);
    wg_stage_parts(p, w, tu, tl, ci, h, c0, SG_KG);
    cp_async_commit();
    st_glast gl = st_glast_load(p, w, t0, m, h);
    cp_async_wait_group<1>();                         /* U, W, s qg, Aqk of this chunk (kg may fly) */
    wg_proxy_fence();
    __syncthreads();
    /* Vnᵀ = Uᵀ − Sᵀ Wᵀ: rows i of warpgroup g's half */
    float x[16];
    wg_fence();
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) wg_m64n32k16<0>(x, dS + WG_KADV(k0), dW + WG_KADV(k0), k0 > 0);
    wg_commit();
    wg_wait<0>();
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int hq = 0; hq < 2; hq++) {
        int n = rn + 8 * hq, i = 32 * g + 8 * j + cq;
        *(__nv_bfloat162 *)(Vt + wg_off<64>(n, i)) =
            __floats2bfloat162_rn(U[i * WG_SB + n] - x[4 * j + 2 * hq], U[(i + 1) * WG_SB + n] - x[4 * j + 2 * hq + 1]);
      }
    st_en_store(p, tu, gl);
    cp_async_wait_group<0>();                         /* kg */
    wg_proxy_fence();                                 /* Vt, kg */
    __syncthreads();                                  /* Vt, kg, en whole; U dead */
    if (ci + 1 < cl) wg_stage_parts(p, w, tu, tl, ci + 1, h, c0, SG_U);
    cp_async_commit();
    /* Sᵀ ← e^{G_last} ⊙ Sᵀ, then oᵀ and the update's product, issued together */
    wg_decay(s, en, g, cq);
    wg_fence();
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) wg_m64n32k16<0>(x, dS + WG_KADV(k0), dQ + WG_KADV(k0), k0 > 0);
#pragma unroll
    for (int j0 = 0; j0 < C; j0 += 16) wg_m64n32k16<0>(x, dV + WG_KADV(j0), dA + WG_KADV(j0), 1);
#pragma unroll
    for (int j0 = 0; j0 < C; j0 += 16) wg_m64n64k16<1>(s, dV + WG_KADV(j0), dK + 8 * j0, 1);
    wg_commit();
    if (w.vn) wg_store_t<C>((sbf *)w.vn + (t0 * HV + h) * V + c0, HVV, Vt, m);   /* beside the products */
    wg_wait<0>();
    __syncthreads();                                  /* both warpgroups' reads of St, Vt, W, s qg, Aqk done */
    /* oᵀ parked in Vt (Vnᵀ's layout), stored at the next step's top or after the loop */
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int hq = 0; hq < 2; hq++)
        *(__nv_bfloat162 *)(Vt + wg_off<64>(rn + 8 * hq, 32 * g + 8 * j + cq)) =
            __floats2bfloat162_rn(x[4 * j + 2 * hq], x[4 * j + 2 * hq + 1]);
    o0p = o0, mp = m;
    wg_shadow(St, s, g, rn, cq);
    if (ci + 1 < cl) wg_stage_parts(p, w, tu, tl, ci + 1, h, c0, SG_W | SG_QG | SG_A);
    cp_async_commit();
  }
  if (cf < cl) {
    __syncthreads();                                  /* the last oᵀ whole in Vt */
    wg_store_t<C>(o0p, HVV, Vt, mp);
  }
  if (ht) wg_state_st(s, ht, b.sbase, c0, V, g0, rn0, cq0);
#else
  __trap();   /* built for sm_90a only; the host never launches it elsewhere */
#endif
}

state_fwd_fn k_state_fwd_tc_wg_ptr(void) { return k_state_fwd_tc_wg; }

/* ---- the kept reverse sweep (k_state_bwd_tc_wide's steps) on warpgroup MMAs ----
 * Each product transposed as the forward's, so that the M side is the block's 64 V columns n
 * and dSᵀ (n x k) stays in the update's accumulators:
 *   dVnᵀ = dOᵀ Aqk + dSᵀ kgᵀ                   (N = 64 chunk rows i; k over j, then over K)
 *   dSᵀ ← e^{G_last} ⊙ dSᵀ + dOᵀ s qg − dVnᵀ W  (N = K; k over the chunk's rows i)
 * Warpgroup g takes rows i in [32 g, 32 g + 32) of dVnᵀ (m64n32) and state columns k in
 * [64 g, 64 g + 64) of the update (m64n64), as the forward. dOᵀ is the staged dO tile ([j][n])
 * read MN-major (the A transpose bit); Aqk ([i][j] as staged) is MN-major as a B of k = j,
 * N = i (warpgroup 1's columns start half an atom in); s qg and W ([i][k]) are MN-major B's
 * as kg is in the forward; kg ([i][k]) is a K-major B. dVnᵀ is written in bf16 to Vt (the
 * update's A operand, negated there by the instruction's scale-a = -1, and the rows kernel's
 * bf16 dVn, stored from it) and in fp32 to a [i][n] tile (the mat kernel's dVn, stored from it
 * in 16-byte rows). Outputs as the wide sweep's (dh, dVn in fp32 and bf16, dh0); its sums in
 * the tensor cores' order, the update adding to the scaled state: test_kda_cuda holds it to
 * the CPU reference's tolerances. */
enum { WB_DS = 64 + 4 };   /* the fp32 dVn tile's row pitch: a fragment's stores in 32 banks */
/* bytes of the layout (W, s qg, kg, Aqk, Sᵀ, dVnᵀ, dO swizzled bf16 from a 1024-byte aligned
 * base, then dVn fp32 [C][WB_DS], then en [K]), with the alignment's slack */
size_t smem_state_bwd_wg(void) {
  return (size_t)(3 * WG_C * WG_K + WG_C * WG_C + BVW * WG_K + 2 * BVW * WG_C) * 2 + (size_t)WG_C * WB_DS * 4 +
         WG_K * 4 + 1024;
}
__global__ void __launch_bounds__(NTW, 2) k_state_bwd_tc_wg(kp p, ws w, const void *dout, const float *dht,
                                                            float *dh0) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t raw[];
  kv_fix<WG_K, NTW>(p);
  constexpr int K = WG_K, C = WG_C;
  sbf *W = (sbf *)(raw + ((1024 - (smem_u32(raw) & 1023)) & 1023)), *qg = W + C * K, *kg = qg + C * K, *A = kg + C * K,
      *St = A + C * C, *Vt = St + BVW * K, *dO = Vt + BVW * C;
  float *Dv = (float *)(dO + C * BVW), *en = Dv + C * WB_DS;
  const st_blk b = st_block(p, w, blockIdx.x, BVW);
  const int64_t h = b.h, c0 = b.c0, V = p.V, HV = p.HV;
  const int HVV = (int)(HV * V), HVK = (int)HV * K, HVC = (int)HV * C;
  const int cf = b.cf, cl = b.cl;
  const int g0 = threadIdx.x >> 7, wq = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31;
  const int rn0 = 16 * wq + (l >> 2), cq0 = 2 * (l & 3);   /* a fragment's first row (n), column pair */
  st_tiles<sbf> tu = {};                          /* en (st_en_store) */
  tu.en = en, tu.K16 = K;
  /* descriptors at k = 0: Sᵀ, Vt K-major A's; dO an MN-major A (its k rows j, 128 bytes
   * each: a k step of 16 rows is 2048 bytes, 128 units); Aqk an MN-major B (column 32 g: 64 g
   * bytes, 4 g units); kg a K-major B (rows 32 g: 256 g units); s qg, W MN-major B's (atom g:
   * 512 g units) */
  const uint64_t dS = wg_desc(St, 16, 1024), dV = wg_desc(Vt, 16, 1024), dD = wg_desc(dO, 8192, 1024),
                 dA0 = wg_desc(A, 8192, 1024), dK0 = wg_desc(kg, 16, 1024), dQ0 = wg_desc(qg, 8192, 1024),
                 dW0 = wg_desc(W, 8192, 1024);
  float s[32];                                      /* dSᵀ (wg_state_ld's layout) */
  wg_state_ld(s, dht, b.sbase, c0, V, g0, rn0, cq0);
  wg_shadow(St, s, g0, rn0, cq0);
  /* the chunk's Aqk and kg, a step ahead (the next chunk down's during the update) */
  auto stage_ak = [&](int ci) {
    const int64_t r0 = w.ctab[4 * ci + 1] * HV + h;
    const int m = w.ctab[4 * ci + 2];
    wg_stage<WG_C, WG_C>(A, w.Ab + r0 * C, HVC, m);
    wg_stage<WG_C, WG_K>(kg, w.kgb + r0 * K, HVK, m);
  };
  if (cf < cl) stage_ak(cl - 1);
  cp_async_commit();
  for (int ci = cl - 1; ci >= cf; ci--) {
    int g = g0, rn = rn0, cq = cq0;                 /* opaque each step, as the forward's */
    asm volatile("" : "+r"(g), "+r"(rn), "+r"(cq));
    const uint64_t dA = dA0 + 4 * g, dK = dK0 + 256 * g, dQ = dQ0 + 512 * g, dW = dW0 + 512 * g;
    const int64_t t0 = w.ctab[4 * ci + 1], r0 = t0 * HV + h;
    const int m = w.ctab[4 * ci + 2];
    wg_proxy_fence();                               /* St (this thread's stores) to the wgmma reads */
    __syncthreads();                                /* the previous update's readers of qg, W, dO, Vt done; St whole */
    if (w.dh)                                       /* the dS entering the chunk, bf16 [K][V] */
      wg_store_t<K>((sbf *)w.dh + (int64_t)ci * HV * K * V + h * K * V + c0, (int)V, St, K);
    wg_stage<WG_C, BVW>(dO, (const sbf *)dout + r0 * V + c0, HVV, m);
    cp_async_commit();
    wg_stage<WG_C, WG_K>(qg, w.qgb + r0 * K, HVK, m);
    wg_stage<WG_C, WG_K>(W, w.Wb + r0 * K, HVK, m);
    cp_async_commit();
    st_glast gl = st_glast_load(p, w, t0, m, h);
    cp_async_wait_group<1>();                       /* Aqk, kg, dO (s qg, W may fly) */
    wg_proxy_fence();
    __syncthreads();
    /* dVnᵀ = dOᵀ Aqk + dSᵀ kgᵀ: rows i of warpgroup g's half */
    float x[16];
    wb_dvn(x, dD, dA, dS, dK);
    wg_wait<0>();
    wb_dvn_out(x, Vt, Dv, WB_DS, g, rn, cq);
    st_en_store(p, tu, gl);
    cp_async_wait_group<0>();                       /* s qg, W */
    wg_proxy_fence();                               /* Vt, s qg, W */
    __syncthreads();                                /* Vt, Dv, s qg, W, en whole; Aqk, kg dead */
    if (ci > cf) stage_ak(ci - 1);
    cp_async_commit();
    /* dSᵀ ← e^{G_last} ⊙ dSᵀ + dOᵀ s qg − dVnᵀ W */
    wg_decay(s, en, g, cq);
    wb_update(s, dD, dQ, dV, dW);
    /* beside the products: dVn to its fp32 and bf16 copies (rows i < m) */
    wg_store_t<C>(w.dvnb + r0 * V + c0, HVV, Vt, m);
    for (int e = threadIdx.x; e < C * (BVW / 4); e += NTW) {
      const int i = e / (BVW / 4), c = (e % (BVW / 4)) * 4;
      if (i < m) {
        const uint4 u = *(const uint4 *)(Dv + i * WB_DS + c);
        stg16(w.dvn + r0 * V + i * HVV + c0 + c, u.x, u.y, u.z, u.w);
      }
    }
    wg_wait<0>();
    wg_shadow(St, s, g, rn, cq);                    /* St's readers (dVnᵀ) done before the last barrier */
  }
  if (dh0) wg_state_st(s, dh0, b.sbase, c0, V, g0, rn0, cq0);
#else
  __trap();   /* built for sm_90a only; the host never launches it elsewhere */
#endif
}
state_bwd_db_fn k_state_bwd_tc_wg_ptr(void) { return k_state_bwd_tc_wg; }

/* ---- the kept reverse sweep with the rows kernel's products (k_state_bwd_rows_wg) ----
 * k_state_bwd_tc_wg's steps and k_bwd_rows_wg's products in one block a (sequence, head): four
 * warpgroups, the state's 128 V columns n in two halves. Warpgroup g runs the sweep's steps as
 * warpgroup g % 2 of the two-warpgroup kernel's block for columns [64 (g / 2), 64 (g / 2) + 64),
 * on the same tiles (St, Vt and dO one per half, side by side), and the rows products as the
 * rows kernel's warpgroup g. Why: the rows kernel reads back what the sweep has just held in
 * shared memory (dS, dVn, dO: 64 KB a chunk) from the bf16 copies the sweep wrote for it (48 KB
 * a chunk); together ~112 KB a chunk of the two kernels' ~377 KB go, and a launch. The
 * products contract over V, which the two-block sweep split across blocks; here one block holds
 * all of it, so the sweep's grid halves (one 211 KB block an SM): kda_cuda.cu's use_sweep_rows
 * takes it only where that grid still fills the card.
 * The rows products at chunk step ci (S0 the kept state entering the chunk, dS the state's
 * gradient there, as St holds it before the step's update):
 *   dKi = Vn dS^T  (Vn a K-major A; St, [n][k], an MN-major B)
 *   dA  = s tril(dO Vn^T),  dQ = dO S0^T  (dO, [i][n] over both halves, a K-major A)
 *   dW  = -dVn S0^T  (Vt, [n][i], an MN-major A)
 *   dgn = rowsum_V(S0 . dS)  (bf16 St and S0, fp32 sums)
 * The same bf16 operands and k order as k_bwd_rows_wg's: dQ, dW, dKi, dA the same products,
 * dgn the same terms summed in another order. The sweep's dh and bf16 dVn are not written.
 * H100, one run, three rounds against KDA_KDA_SR=0 (2026-12-07s64a): fwd+bwd (8,2048,16,128)
 * 2.497-2.526 -> 2.324-2.350 ms; ncu: 452.9 us against the two kernels' 264.2 + 353.2, at 71%
 * of DRAM peak (2.39 TB/s). Forming dKi and dA beside the dVn product instead, Vn staged a step
 * ahead (wip/2026-12-07s64-sr2.patch), ran the same (2.315-2.324 ms, 455.7 us).
 * B16 (kda_cuda.cu use_b16): outputs handed on in bf16 (st_rows_b16, whole sectors), each where
 * its one reader takes bf16: SR_B16_QK, dKi, dQ and dA to w.dKib, w.dQb, w.dAb for
 * k_bwd_final_wg (40 of the ~144 KB a chunk this kernel writes, and as many of that kernel's
 * staging); SR_B16_W, dW to w.dWb for k_bwd_mat_wg (16 KB). H100, one run, three rounds against
 * the same binary with KDA_KDA_B16=0 (2026-12-07s66d): this kernel 450.4 -> 383.1 us (ncu),
 * fwd+bwd (8,2048,16,128) 2.294-2.311 -> 2.193-2.214 ms. */
enum { SR_NT = 512, SR_DS = WG_K + 4 };   /* threads; the fp32 dVn tile's row pitch */
/* bytes: W, s qg, kg, Aqk, St (two halves), Vt (two halves), dO, S0, Vn swizzled bf16 from a
 * 1024-byte aligned base, then dVn fp32 [C][SR_DS], en [K], dgn's partials [8][K]; with the
 * alignment's slack */
size_t smem_state_bwd_rows_wg(void) {
  return (size_t)(3 * WG_C * WG_K + WG_C * WG_C + 2 * WG_K * WG_K + 3 * WG_K * WG_C) * 2 +
         (size_t)(WG_C * SR_DS + 9 * WG_K) * 4 + 1024;
}
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
/* wg_stage at SR_NT threads, unrolled (R x KD / 8 is a multiple of SR_NT), the thread index t
 * passed opaque by the caller each step: the addresses are formed where they are used (as
 * wg_stage's loops they were held across the steps: 180 bytes of spills) */
template <int R, int KD>
static __device__ __forceinline__ void sr_stage(sbf *s, const sbf *g, int gs, int m, int t) {
  static_assert(R * KD / 8 % SR_NT == 0, "sr_stage: whole rounds of the block's threads");
#pragma unroll
  for (int u = 0; u < R * KD / 8 / SR_NT; u++) {
    const int e = t + u * SR_NT, r = e / (KD / 8), kc = (e % (KD / 8)) << 3;
    const bool ok = r < m;
    cp_async16(s + wg_off<R>(r, kc), g + (ok ? r : 0) * gs + kc, ok);
  }
}
/* one halving exchange of a lane's first C values with the lane across bit C of l: the lane
 * with the bit clear keeps (and adds its partner's) values [0, C / 2), the other [C / 2, C),
 * both into v[0, C / 2) */
template <int C> static __device__ __forceinline__ void sr_halve(float (&v)[16], int l) {
  const bool up = l & C;
#pragma unroll
  for (int i = 0; i < C / 2; i++) {
    const float lo = v[i], hi = v[i + C / 2];
    v[i] = (up ? hi : lo) + __shfl_xor_sync(0xffffffffu, up ? lo : hi, C);
  }
}
/* dA = s tril(x) of a 64 x 16 product (columns n0 .. n0 + 15 of rw_frag's fragment) in bf16,
 * rows i < m, zero above the diagonal and past m columns; row i's column 0 at o + i rs. A lane
 * holds two pairs of a row, 8 columns apart: the lanes t, t ^ 1 swap one, so that each holds 4
 * adjacent columns and stores them in 8 bytes: a quad a row's 32 bytes, one whole sector */
static __device__ __forceinline__ void st_da_b16(sbf *o, int rs, const float (&d)[8], int n0, int m, float s) {
  const int wq = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31, row = 16 * wq + (l >> 2), t = l & 3;
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int i = row + 8 * hf;
    auto v = [&](int j, float x) { return j <= i && j < m ? s * x : 0.f; };
    const int c0 = n0 + 2 * t, c1 = c0 + 8;
    const uint32_t p0 = pk_bf2(v(c0, d[2 * hf]), v(c0 + 1, d[2 * hf + 1])),
                   p1 = pk_bf2(v(c1, d[4 + 2 * hf]), v(c1 + 1, d[5 + 2 * hf]));
    const bool odd = t & 1;
    const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? p0 : p1, 1);   /* the partner's pair of my half */
    if (i < m) *(uint2 *)(o + i * rs + (odd ? c1 - 2 : c0)) = odd ? make_uint2(got, p1) : make_uint2(p0, got);
  }
}
#endif
template <int B16>
__global__ void __launch_bounds__(SR_NT, 1) k_state_bwd_rows_wg(kp p, ws w, const void *dout, const float *dht,
                                                               float *dh0) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t raw[];
  kv_fix<WG_K, SR_NT>(p);
  constexpr int K = WG_K, C = WG_C, V = WG_K;
  sbf *W = (sbf *)(raw + ((1024 - (smem_u32(raw) & 1023)) & 1023)), *qg = W + C * K, *kg = qg + C * K, *A = kg + C * K,
      *St = A + C * C, *Vt = St + V * K, *dO = Vt + V * C, *S0 = dO + C * V, *Vn = S0 + K * V;
  float *Dv = (float *)(Vn + C * V), *en = Dv + C * SR_DS, *red = en + K;
  const st_blk b = st_block(p, w, blockIdx.x, V);
  const int64_t h = b.h, HV = p.HV;
  const int HVV = (int)(HV * V), HVK = (int)HV * K, HVC = (int)HV * C;
  const int cf = b.cf, cl = b.cl;
  const int g0 = threadIdx.x >> 7, wq = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31;
  const int rn0 = 16 * wq + (l >> 2), cq0 = 2 * (l & 3);   /* a fragment's first row (n), column pair */
  st_tiles<sbf> tu = {};                          /* en (st_en_store) */
  tu.en = en, tu.K16 = K;
  float s[32];                                      /* dSᵀ of columns [64 (g0 / 2), +64) (wg_state_ld's layout) */
  wg_state_ld(s, dht, b.sbase, 64 * (g0 >> 1), V, g0 & 1, rn0, cq0);
  wg_shadow(St + (g0 >> 1) * 64 * K, s, g0 & 1, rn0, cq0);
  /* the chunk's Aqk and kg, a step ahead (the next chunk down's during the update) */
  auto stage_ak = [&](int ci, int t) {
    const int64_t r0 = w.ctab[4 * ci + 1] * HV + h;
    const int m = w.ctab[4 * ci + 2];
    sr_stage<WG_C, WG_C>(A, w.Ab + r0 * C, HVC, m, t);
    sr_stage<WG_C, WG_K>(kg, w.kgb + r0 * K, HVK, m, t);
  };
  if (cf < cl) stage_ak(cl - 1, threadIdx.x);
  cp_async_commit();
  for (int ci = cl - 1; ci >= cf; ci--) {
    int g = g0, rn = rn0, cq = cq0, t = threadIdx.x;   /* opaque each step, as the two-block sweep's */
    asm volatile("" : "+r"(g), "+r"(rn), "+r"(cq), "+r"(t));
    const int nh = g >> 1, gh = g & 1;              /* the sweep's half and its warpgroup there */
    const int64_t t0 = w.ctab[4 * ci + 1], r0 = t0 * HV + h, sr = ((int64_t)ci * HV + h) * K;
    const int m = w.ctab[4 * ci + 2];
    wg_proxy_fence();                               /* St (this thread's stores) to the wgmma reads */
    __syncthreads();                                /* the previous step's readers of every tile done; St whole */
    sr_stage<WG_C, V>(dO, (const sbf *)dout + r0 * V, HVV, m, t);
    cp_async_commit();
    sr_stage<WG_C, WG_K>(qg, w.qgb + r0 * K, HVK, m, t);
    sr_stage<WG_C, WG_K>(W, w.Wb + r0 * K, HVK, m, t);
    cp_async_commit();
    sr_stage<K, V>(S0, (const sbf *)w.h + sr * V, V, K, t);
    sr_stage<WG_C, V>(Vn, (const sbf *)w.vn + r0 * V, HVV, m, t);
    cp_async_commit();
    st_glast gl = st_glast_load(p, w, t0, m, h);
    cp_async_wait_group<2>();                       /* Aqk, kg, dO (s qg, W, S0, Vn may fly) */
    wg_proxy_fence();
    __syncthreads();
    /* the sweep's operands for half nh: dO's half an MN-major A, St's and Vt's halves K-major A's
     * (Aqk, s qg, W MN-major B's, kg a K-major B: the two-block sweep's) */
    const uint64_t dD = wg_desc(dO + nh * C * 64, 8192, 1024), dS = wg_desc(St + nh * 64 * K, 16, 1024),
                   dV = wg_desc(Vt + nh * 64 * C, 16, 1024);
    /* dVnᵀ = dOᵀ Aqk + dSᵀ kgᵀ: rows i of warpgroup gh's half */
    float x[16];
    wb_dvn(x, dD, wg_desc(A, 8192, 1024) + 4 * gh, dS, wg_desc(kg, 16, 1024) + 256 * gh);
    wg_wait<0>();
    wb_dvn_out(x, Vt + nh * 64 * C, Dv + 64 * nh, SR_DS, gh, rn, cq);
    st_en_store(p, tu, gl);
    cp_async_wait_group<1>();                       /* s qg, W (S0, Vn may fly) */
    wg_proxy_fence();                               /* Vt, s qg, W */
    __syncthreads();                                /* Vt, Dv, s qg, W, en whole; Aqk, kg dead */
    if (ci > cf) stage_ak(ci - 1, t);
    cp_async_commit();
    /* dSᵀ ← e^{G_last} ⊙ dSᵀ + dOᵀ s qg − dVnᵀ W (warpgroup gh's state columns) */
    wg_decay(s, en, gh, cq);
    wb_update(s, dD, wg_desc(qg, 8192, 1024) + 512 * gh, dV, wg_desc(W, 8192, 1024) + 512 * gh);
    /* beside the update: dVn to its fp32 copy (rows i < m) */
#pragma unroll
    for (int u = 0; u < C * (V / 4) / SR_NT; u++) {
      const int e = t + u * SR_NT, i = e / (V / 4), c = (e % (V / 4)) * 4;
      if (i < m) {
        const uint4 y = *(const uint4 *)(Dv + i * SR_DS + c);
        stg16(w.dvn + r0 * V + i * HVV + c, y.x, y.y, y.z, y.w);
      }
    }
    cp_async_wait_group<1>();                       /* S0, Vn (the next Aqk, kg may fly) */
    wg_proxy_fence();
    __syncthreads();                                /* S0, Vn whole */
    /* the rows products, warpgroup g's columns. dKi = Vn dSᵀ and dA = s tril(dO Vnᵀ) first (dKi
     * reads St, which the update's shadow overwrites) */
    const uint64_t dDO = wg_desc(dO, 16, 1024), dS0 = wg_desc(S0, 16, 1024) + 256 * g;
    float a[16], x8[8];
    {
      const uint64_t dVN = wg_desc(Vn, 16, 1024);
      wg_fence();
#pragma unroll
      for (int n0 = 0; n0 < V; n0 += 16)            /* B: St rows n0.. (half n0 / 64), columns 32 g.. */
        wg_m64n32k16<1>(a, dVN + WG_KADVR(64, n0),
                        wg_desc(St + (n0 >> 6) * 64 * K + (g >> 1) * 64 * 64 + (n0 & 63) * 64 + 32 * (g & 1), 8192, 1024),
                        n0 > 0);
      rw_issue<16, C>(x8, dDO, dVN + 128 * g);
      wg_commit();
    }
    {
      /* dgn's partial sums beside them: each thread's St fragment (wg_shadow's positions: rows
       * n = rn, rn + 8 of half nh, columns k = 64 gh + 8 j + cq, + 1) against S0 there, summed
       * over the 8 lanes of a column pair by halving exchanges (16 values -> 2 in 14 shuffles;
       * lane l keeps j = 4 b4 + 2 b3 + b2 of its bits l = b4 b3 b2 . .), into red[half, warp][k] */
      float v[16];
#pragma unroll
      for (int j = 0; j < 8; j++) {
        v[2 * j] = v[2 * j + 1] = 0.f;
#pragma unroll
        for (int hq = 0; hq < 2; hq++) {
          const int n = rn + 8 * hq, k = 64 * gh + 8 * j + cq, nf = 64 * nh + n;
          const float2 d = __bfloat1622float2(*(const __nv_bfloat162 *)(St + nh * 64 * K + wg_off<64>(n, k)));
          v[2 * j] = fmaf(d.x, __bfloat162float(S0[wg_off<K>(k, nf)]), v[2 * j]);
          v[2 * j + 1] = fmaf(d.y, __bfloat162float(S0[wg_off<K>(k + 1, nf)]), v[2 * j + 1]);
        }
      }
      sr_halve<16>(v, l), sr_halve<8>(v, l), sr_halve<4>(v, l);
      const int k = 64 * gh + 8 * (4 * ((l >> 4) & 1) + 2 * ((l >> 3) & 1) + ((l >> 2) & 1)) + cq;
      red[(4 * nh + wq) * K + k] = v[0], red[(4 * nh + wq) * K + k + 1] = v[1];
    }
    wg_wait<0>();                                   /* the update, dKi, dA */
    const int RK = HVK, RC = HVC;
    /* a 64 x 32 product's rows i < m to its [T, HV, K] output (sg = -1: negated) */
    auto st_rows = [&](float *o, const float (&d)[16], float sg) {
      rw_frag<32>(d, 32 * g, [&](int i, int c, float x0, float x1, float x2, float x3) {
        if (i < m) st2f(o + r0 * K + (i * RK + c), sg * x0, sg * x1, true);
        if (i + 8 < m) st2f(o + r0 * K + ((i + 8) * RK + c), sg * x2, sg * x3, true);
      });
    };
    if constexpr (B16 & SR_B16_QK) st_rows_b16(w.dKib + r0 * K, RK, a, 32 * g, m, 1.f);
    else st_rows(w.dKi, a, 1.f);
    auto da = [&](int i, int j, float x0, float x1) {
      auto v = [&](int jj, float xx) { return jj <= i && jj < m ? p.scale * xx : 0.f; };
      if (i < m) st2f(w.dA + r0 * C + (i * RC + j), v(j, x0), v(j + 1, x1), true);
    };
    if constexpr (B16 & SR_B16_QK) st_da_b16(w.dAb + r0 * C, RC, x8, 16 * g, m, p.scale);
    else rw_frag<16>(x8, 16 * g, [&](int i, int j, float x0, float x1, float x2, float x3) { da(i, j, x0, x1), da(i + 8, j, x2, x3); });
    /* dQ = dO S0ᵀ and dW = -dVn S0ᵀ (dVn from Vt, an MN-major A over both halves' rows n) */
    float c2[16];
    wg_fence();
    rw_issue<32, K>(a, dDO, dS0);
#pragma unroll
    for (int n0 = 0; n0 < V; n0 += 16) wg_m64n32k16<0, 1>(c2, wg_desc(Vt, 16384, 1024) + 8 * n0, dS0 + WG_KADVR(K, n0), n0 > 0);
    wg_commit();
    __syncthreads();                                /* every warpgroup's reads of St (dKi, dgn) done; red whole */
    wg_shadow(St + nh * 64 * K, s, gh, rn, cq);
    if (t < K) {
      float y = 0.f;
#pragma unroll
      for (int r = 0; r < 8; r++) y += red[r * K + t];
      w.dgn[((int64_t)ci * HV + h) * K + t] = y;
    }
    wg_wait<0>();
    if constexpr (B16 & SR_B16_QK) st_rows_b16(w.dQb + r0 * K, RK, a, 32 * g, m, 1.f);
    else st_rows(w.dQ, a, 1.f);
    if constexpr (B16 & SR_B16_W) st_rows_b16(w.dWb + r0 * K, RK, c2, 32 * g, m, -1.f);
    else st_rows(w.dW, c2, -1.f);
  }
  if (dh0) wg_state_st(s, dh0, b.sbase, 64 * (g0 >> 1), V, g0 & 1, rn0, cq0);
#else
  __trap();   /* built for sm_90a only; the host never launches it elsewhere */
#endif
}
state_bwd_db_fn k_state_bwd_rows_wg_ptr(int b16) {
  static const state_bwd_db_fn f[4] = {k_state_bwd_rows_wg<0>, k_state_bwd_rows_wg<1>, k_state_bwd_rows_wg<2>,
                                       k_state_bwd_rows_wg<3>};
  return f[b16 & 3];
}
