/* attention.cu — causal attention, layout [B,T,H,Dh], never materialising T x T.
 * CPU twin: cpu_attention, cpu_attention_bwd in core/cpu_ops.c.
 *
 * Forward (ATTENTION): flash-style online softmax over key tiles; fp32 statistics; writes O
 * and, when asked, the log-sum-exp per row (natural log, [B,H,T]).
 *   - tensor-core path: bf16 q/k/v, Dh 64 or 128, 16-byte aligned rows: mma.sync m16n8k16
 *     (bf16 in, fp32 accumulate), 64 queries x 64 keys per step, 4 warps of 16 query rows,
 *     S and P never leave registers (the C fragment of S is reused as the A fragment of P).
 *     Tiles reach shared memory by cp.async, the next K/V tile copying during the current
 *     one's math, and registers by ldmatrix (.trans for V). benches/cuda_ops_bench on an
 *     H200: 192-198 TFLOP/s at (8,2048,16,128), 195-196 at (64,1024,12,64) in two runs
 *     (benches/history.tsv, revision e0a2144), from ~80-90 with plain shared loads.
 *   - generic path (any Dh <= 256, f32 or bf16): one warp per query row, fp32 SIMT.
 * Backward (ATTENTION_BWD), deterministic with no atomics (every output element has exactly
 * one writer, summing in a fixed order):
 *   - tensor-core path (bf16 q/k/v/dout, Dh 64/128): the forward kernel as a pre-pass writing
 *     lse and Dsum_i = dO_i . O_i (O never stored), then a dq pass over key tiles per query
 *     tile and a dk/dv pass over query tiles per key tile, mma.sync, ldmatrix and
 *     double-buffered cp.async like the forward (see "tensor-core backward" below). Same
 *     bench, fwd+bwd at 3.5x the forward's FLOPs: 147 TFLOP/s at (8,2048,16,128), 135-136 at
 *     (64,1024,12,64) in two runs; the backward alone ~130, from ~60. GPT M's step: 146.8 ->
 *     120.1 ms with this and the MATMUL+ADD fusion (same bundle as the history rows).
 *   - generic path (any Dh, f32 or bf16): 1. recompute O (f32, scratch) and lse with the
 *     forward; 2. Dsum; 3. dq, one warp per query row; 4. dk, dv, one warp per key row; fp32 SIMT.
 * KDA_ATTN_SIMPLE=1 forces the generic paths (forward and backward). */
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "mma.cuh"

#define LOG2E 1.4426950408889634f
#define LN2F 0.69314718055994530942f

static float attn_scale(const kda_exec_node *n) {
  return n->fattr[0] != 0 ? n->fattr[0] : 1.0f / sqrtf((float)n->in[0].shape[3]);
}

/* Raise a kernel's dynamic shared-memory limit once to what it needs (not a stream operation,
 * and done on the eager warm-up run, before any capture). */
#define RAISE_SMEM(kernel, bytes)                                                           \
  do {                                                                                     \
    static size_t done_ = 0;                                                               \
    if ((size_t)(bytes) > 48 * 1024 && (size_t)(bytes) > done_) {                          \
      KC_CUDA(n, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                      (int)(bytes)));                                      \
      done_ = (size_t)(bytes);                                                             \
    }                                                                                      \
  } while (0)

/* ======================= generic SIMT kernels (warp per row) =============================== */
#define QW 8    /* query rows (warps) per block */
#define TK 32   /* keys per tile: one per lane */

/* Cooperative load of rows [r0, r0+TK) of x (row stride rs) into s[TK][D+1] as f32; zero past T. */
__device__ __forceinline__ void load_rows(float *s, const void *x, int dt, int64_t base,
                                          int64_t rs, int r0, int T, int D) {
  for (int e = threadIdx.x; e < TK * D; e += blockDim.x) {
    int r = e / D, c = e - r * D;
    s[r * (D + 1) + c] = r0 + r < T ? kc_ld(x, dt, base + (int64_t)(r0 + r) * rs + c) : 0.f;
  }
}

struct attn_io {
  const void *q, *k, *v, *dout;
  int qdt, kdt, vdt, ddt;
  void *o;       /* forward: O; dq pass: dq; dkdv pass: dk */
  void *o2;      /* dkdv pass: dv */
  int odt;
  float *lse, *dsum;
  const float *O32;   /* recomputed O for Dsum */
  int T, H, D;
  float scale;
};

template <int NC>
__global__ void k_attn_fwd_simple(attn_io a) {
  extern __shared__ float sm[];
  const int D = a.D, LDS = D + 1;
  float *Ks = sm, *Vs = Ks + TK * LDS, *qs = Vs + TK * LDS + (threadIdx.x >> 5) * D;
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31, bh = blockIdx.y;
  int b = bh / a.H, h = bh % a.H, i0 = blockIdx.x * QW, i = i0 + w;
  int64_t rs = (int64_t)a.H * D, base = ((int64_t)b * a.T * a.H + h) * D;
  for (int c = lane; c < D; c += 32) qs[c] = i < a.T ? kc_ld(a.q, a.qdt, base + i * rs + c) : 0.f;
  float m = -INFINITY, l = 0.f, acc[NC];
#pragma unroll
  for (int c = 0; c < NC; c++) acc[c] = 0.f;
  int last = min(a.T - 1, i0 + QW - 1);
  for (int kb = 0; kb <= last; kb += TK) {
    __syncthreads();
    load_rows(Ks, a.k, a.kdt, base, rs, kb, a.T, D);
    load_rows(Vs, a.v, a.vdt, base, rs, kb, a.T, D);
    __syncthreads();
    if (i >= a.T || kb > i) continue;          /* uniform per warp */
    int j = kb + lane;
    float s = -INFINITY;
    if (j <= i) {
      float d = 0.f;
      for (int c = 0; c < D; c++) d += qs[c] * Ks[lane * LDS + c];
      s = d * a.scale;
    }
    float mn = fmaxf(m, kc_warp_max(s));       /* finite: key kb <= i is in this tile */
    float p = j <= i ? expf(s - mn) : 0.f, corr = expf(m - mn);
    l = l * corr + kc_warp_sum(p);
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] *= corr;
    int nj = min(TK, i - kb + 1);
    for (int jj = 0; jj < nj; jj++) {
      float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
      for (int c = 0; c < NC; c++)
        if (lane + 32 * c < D) acc[c] += pj * Vs[jj * LDS + lane + 32 * c];
    }
    m = mn;
  }
  if (i >= a.T) return;
  float inv = 1.0f / l;
#pragma unroll
  for (int c = 0; c < NC; c++)
    if (lane + 32 * c < D) kc_st(a.o, a.odt, base + i * rs + lane + 32 * c, acc[c] * inv);
  if (a.lse && lane == 0) a.lse[(int64_t)bh * a.T + i] = m + logf(l);
}

/* Dsum[bh, i] = sum_d dO[i,d] O[i,d], one warp per row. */
__global__ void k_attn_dsum(attn_io a, int64_t rows) {
  int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (r >= rows) return;   /* r indexes [B,T,H] */
  int64_t h = r % a.H, bt = r / a.H, t = bt % a.T, b = bt / a.T;
  float s = 0.f;
  for (int c = lane; c < a.D; c += 32) s += kc_ld(a.dout, a.ddt, r * a.D + c) * a.O32[r * a.D + c];
  s = kc_warp_sum(s);
  if (lane == 0) a.dsum[(b * a.H + h) * a.T + t] = s;
}

/* dq_i = scale * sum_{j<=i} P_ij (dP_ij - Dsum_i) k_j, one warp per query row. */
template <int NC>
__global__ void k_attn_dq_simple(attn_io a) {
  extern __shared__ float sm[];
  const int D = a.D, LDS = D + 1;
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31, bh = blockIdx.y;
  float *Ks = sm, *Vs = Ks + TK * LDS, *qs = Vs + TK * LDS + w * 2 * D, *dos = qs + D;
  int b = bh / a.H, h = bh % a.H, i0 = blockIdx.x * QW, i = i0 + w;
  int64_t rs = (int64_t)a.H * D, base = ((int64_t)b * a.T * a.H + h) * D;
  for (int c = lane; c < D; c += 32) {
    qs[c] = i < a.T ? kc_ld(a.q, a.qdt, base + i * rs + c) : 0.f;
    dos[c] = i < a.T ? kc_ld(a.dout, a.ddt, base + i * rs + c) : 0.f;
  }
  float lse = i < a.T ? a.lse[(int64_t)bh * a.T + i] : 0.f;
  float dsum = i < a.T ? a.dsum[(int64_t)bh * a.T + i] : 0.f;
  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; c++) acc[c] = 0.f;
  int last = min(a.T - 1, i0 + QW - 1);
  for (int kb = 0; kb <= last; kb += TK) {
    __syncthreads();
    load_rows(Ks, a.k, a.kdt, base, rs, kb, a.T, D);
    load_rows(Vs, a.v, a.vdt, base, rs, kb, a.T, D);
    __syncthreads();
    if (i >= a.T || kb > i) continue;
    int j = kb + lane;
    float ds = 0.f;
    if (j <= i) {
      float s = 0.f, dp = 0.f;
      for (int c = 0; c < D; c++) {
        s += qs[c] * Ks[lane * LDS + c];
        dp += dos[c] * Vs[lane * LDS + c];
      }
      float p = expf(s * a.scale - lse);
      ds = p * (dp - dsum);
    }
    int nj = min(TK, i - kb + 1);
    for (int jj = 0; jj < nj; jj++) {
      float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
      for (int c = 0; c < NC; c++)
        if (lane + 32 * c < D) acc[c] += dsj * Ks[jj * LDS + lane + 32 * c];
    }
  }
  if (i >= a.T) return;
#pragma unroll
  for (int c = 0; c < NC; c++)
    if (lane + 32 * c < D) kc_st(a.o, a.odt, base + i * rs + lane + 32 * c, acc[c] * a.scale);
}

/* dv_j = sum_{i>=j} P_ij dO_i;  dk_j = scale * sum_{i>=j} dS_ij q_i, one warp per key row. */
template <int NC>
__global__ void k_attn_dkdv_simple(attn_io a) {
  extern __shared__ float sm[];
  const int D = a.D, LDS = D + 1;
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31, bh = blockIdx.y;
  float *Qs = sm, *Ds = Qs + TK * LDS, *ls = Ds + TK * LDS, *dss = ls + TK;
  float *ks = dss + TK + w * 2 * D, *vs = ks + D;
  int b = bh / a.H, h = bh % a.H, j0 = blockIdx.x * QW, j = j0 + w;
  int64_t rs = (int64_t)a.H * D, base = ((int64_t)b * a.T * a.H + h) * D;
  for (int c = lane; c < D; c += 32) {
    ks[c] = j < a.T ? kc_ld(a.k, a.kdt, base + j * rs + c) : 0.f;
    vs[c] = j < a.T ? kc_ld(a.v, a.vdt, base + j * rs + c) : 0.f;
  }
  float dk[NC], dv[NC];
#pragma unroll
  for (int c = 0; c < NC; c++) dk[c] = dv[c] = 0.f;
  for (int qb = j0; qb < a.T; qb += TK) {
    __syncthreads();
    load_rows(Qs, a.q, a.qdt, base, rs, qb, a.T, D);
    load_rows(Ds, a.dout, a.ddt, base, rs, qb, a.T, D);
    if (threadIdx.x < TK) {
      int ii = qb + threadIdx.x;
      ls[threadIdx.x] = ii < a.T ? a.lse[(int64_t)bh * a.T + ii] : 0.f;
      dss[threadIdx.x] = ii < a.T ? a.dsum[(int64_t)bh * a.T + ii] : 0.f;
    }
    __syncthreads();
    if (j >= a.T) continue;
    int i = qb + lane;
    float p = 0.f, ds = 0.f;
    if (i >= j && i < a.T) {
      float s = 0.f, dp = 0.f;
      for (int c = 0; c < D; c++) {
        s += Qs[lane * LDS + c] * ks[c];
        dp += Ds[lane * LDS + c] * vs[c];
      }
      p = expf(s * a.scale - ls[lane]);
      ds = p * (dp - dss[lane]);
    }
    int i_lo = max(j - qb, 0), i_hi = min(TK, a.T - qb);
    for (int ii = i_lo; ii < i_hi; ii++) {
      float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
      for (int c = 0; c < NC; c++)
        if (lane + 32 * c < D) {
          dv[c] += pi * Ds[ii * LDS + lane + 32 * c];
          dk[c] += dsi * Qs[ii * LDS + lane + 32 * c];
        }
    }
  }
  if (j >= a.T) return;
#pragma unroll
  for (int c = 0; c < NC; c++)
    if (lane + 32 * c < D) {
      kc_st(a.o, a.odt, base + j * rs + lane + 32 * c, dk[c] * a.scale);
      kc_st(a.o2, a.odt, base + j * rs + lane + 32 * c, dv[c]);
    }
}

/* Launch kernel template K<NC> with NC = ceil(D/32) in 1..8. */
#define NC_DISPATCH(K, D, LAUNCH)                                                           \
  switch (((D) + 31) / 32) {                                                               \
  case 1: LAUNCH(K<1>); break;                                                             \
  case 2: LAUNCH(K<2>); break;                                                             \
  case 3: LAUNCH(K<3>); break;                                                             \
  case 4: LAUNCH(K<4>); break;                                                             \
  case 5: LAUNCH(K<5>); break;                                                             \
  case 6: LAUNCH(K<6>); break;                                                             \
  case 7: LAUNCH(K<7>); break;                                                             \
  default: LAUNCH(K<8>); break;                                                            \
  }

static int fwd_simple(const kda_exec_node *n, kc_ctx *c, attn_io a, int64_t B) {
  size_t smem = (size_t)(2 * TK * (a.D + 1) + QW * a.D) * sizeof(float);
  dim3 grid((unsigned)((a.T + QW - 1) / QW), (unsigned)(B * a.H));
#define L_FWD(K)                                                                           \
  do {                                                                                     \
    RAISE_SMEM(K, smem);                                                                   \
    K<<<grid, QW * 32, smem, c->stream>>>(a);                                              \
  } while (0)
  NC_DISPATCH(k_attn_fwd_simple, a.D, L_FWD);
  KC_LAUNCH_CHECK(n, "k_attn_fwd_simple");
  return 0;
}

/* ======================= tensor-core kernels (mma.sync m16n8k16 bf16) ======================
 * Operands move global -> shared with cp.async (16 B per copy, no register round trip, so the
 * next tile streams in while the current one is multiplied) and shared -> registers with
 * ldmatrix (one instruction per four 8x8 fragments). Tiles are [rows][DH+8] bf16: the 16-byte
 * pad shifts each row by 4 banks, so the eight 16-byte rows one ldmatrix phase reads fall in
 * 32 distinct banks, and every row stays 16-byte aligned. Only data movement lives here: every
 * accumulator sees the same mma sequence as with plain shared loads, so results are unchanged
 * (fwd and bwd outputs bitwise equal to the plain-load kernels', checked on an H200). The
 * primitives (cp_async16, ldmatrix, ldsm_*, mma16816) are in mma.cuh, shared with kda_tc.cu. */
#define BK 64   /* keys per forward step */

/* A fragment for k-step kk from the C fragments of n-tiles 2kk and 2kk+1 (rounded to bf16). */
__device__ __forceinline__ void c_to_a(uint32_t *a, const float *c0, const float *c1) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

/* Issue (not wait for) the copy of rows [r0, r0+ROWS) of a [.,DH] bf16 head slice (row stride
 * rs) into s[ROWS][DH+8] by NTH threads; rows past T are zero, so masked keys multiply 0. */
template <int DH, int ROWS, int NTH>
__device__ __forceinline__ void load_rows_async(__nv_bfloat16 *s, const __nv_bfloat16 *g,
                                                int64_t rs, int r0, int T) {
  constexpr int CPR = DH / 8, RSTEP = NTH / CPR;   /* 16-byte chunks per row; rows per pass */
  static_assert(ROWS * CPR % NTH == 0 && NTH % CPR == 0, "whole rows per pass");
  const int r = threadIdx.x / CPR, ch = threadIdx.x % CPR;
  const __nv_bfloat16 *src = g + (int64_t)(r0 + r) * rs + ch * 8;
  __nv_bfloat16 *dst = s + r * (DH + 8) + ch * 8;
  /* a rolled loop: unrolled, the compiler keeps every pass's addresses live across the
   * caller's loop, costing the mma code the registers that keep it spill-free */
#pragma unroll 1
  for (int rr = r0 + r; rr < r0 + ROWS; rr += RSTEP) {
    cp_async16(dst, rr < T ? src : g, rr < T);
    src += RSTEP * rs;
    dst += RSTEP * (DH + 8);
  }
}

template <typename TO> __device__ __forceinline__ void store2(TO *p, float x, float y);
template <> __device__ __forceinline__ void store2<float>(float *p, float x, float y) {
  *(float2 *)p = make_float2(x, y);
}
template <> __device__ __forceinline__ void store2<__nv_bfloat16>(__nv_bfloat16 *p, float x, float y) {
  *(__nv_bfloat162 *)p = __floats2bfloat162_rn(x, y);
}

/* ---- forward ----
 * Block = 4 warps x 16 query rows (BQ = 64), longest (last) query tiles first, over key tiles
 * of 64. smem: Q (resident), K (two buffers), V (NV buffers), each 64 x (DH+8) bf16. K_{j+1}
 * is copied while tile j is multiplied. With NV = 2 V_{j+1} travels with it and each tile
 * needs one barrier; with NV = 1 V_j is copied while S_j and its softmax are computed and a
 * second barrier publishes it for O += P V_j. Q fragments are re-read with ldmatrix per tile
 * rather than held: at Dh 128 the 32 registers they would take are what keeps the kernel at
 * 3 blocks an SM without spills.
 * With dsum != NULL (the backward's pre-pass) O is not stored: each row's Dsum = dO . O is
 * taken from the fp32 accumulators instead (dout read at the thread's own O columns), so the
 * backward needs no O buffer and no separate Dsum kernel. */
#define BQ 64
/* NV 2 at Dh 64 (46 KB, 4 blocks an SM either way); NV 1 at Dh 128, where a second V buffer
 * (85 KB) would cost the third block: measured 201 vs 189 TFLOP/s at (64,1024,12,64), 229 vs
 * 219 at (16,2048,16,128). */
template <int DH> struct fwd_cfg {
  static constexpr int NV = DH == 64 ? 2 : 1;   /* V buffers */
  static constexpr size_t smem = (size_t)(BQ + (2 + NV) * BK) * (DH + 8) * 2;
  static constexpr int min_blocks = DH == 64 ? 4 : 3;
};

/* S = Q K^T for one 64-key tile: s[nt] gets the k-steps in order, as a single mma chain. */
template <int DH>
__device__ __forceinline__ void qk_tile(float (*s)[4], const __nv_bfloat16 *Qs,
                                        const __nv_bfloat16 *Ks, int r0, int lane) {
  constexpr int LD = DH + 8;
#pragma unroll
  for (int nt = 0; nt < 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < DH / 16; ks++) {
    uint32_t qa[4];
    ldsm_a(qa, Qs, LD, r0, ks * 16, lane);
#pragma unroll
    for (int np = 0; np < 4; np++) {
      uint32_t bf[4];
      ldsm_b_nk(bf, Ks, LD, np * 16, ks * 16, lane);
      mma16816(s[2 * np], qa, bf[0], bf[1]);
      mma16816(s[2 * np + 1], qa, bf[2], bf[3]);
    }
  }
}

template <int DH, typename TO>
__global__ void __launch_bounds__(128, fwd_cfg<DH>::min_blocks)
    k_attn_fwd_mma(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, TO *o,
                   float *lse, int T, int H, float scale, const __nv_bfloat16 *dout, float *dsum) {
  constexpr int LD = DH + 8, ND = DH / 8, NV = fwd_cfg<DH>::NV, TILE = BK * LD;
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)smraw, *Kb = Qs + BQ * LD, *Vb = Kb + 2 * TILE;
  const int qb = (gridDim.x - 1 - blockIdx.x) * BQ;
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int64_t rs = (int64_t)H * DH, base = ((int64_t)b * T * H + h) * DH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int kend = min(T, qb + BQ);
  load_rows_async<DH, BQ, 128>(Qs, q + base, rs, qb, T);
  load_rows_async<DH, BK, 128>(Kb, k + base, rs, 0, T);
  if (NV == 2) load_rows_async<DH, BK, 128>(Vb, v + base, rs, 0, T);
  cp_async_commit();
  const int r0 = warp * 16;
  float oacc[ND][4];
#pragma unroll
  for (int d = 0; d < ND; d++) oacc[d][0] = oacc[d][1] = oacc[d][2] = oacc[d][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const float sl2 = scale * LOG2E;
  const int row0 = qb + r0 + g, row1 = row0 + 8;
  for (int kb = 0; kb < kend; kb += BK) {
    const int st = (kb / BK) & 1;   /* this tile's K (and, NV 2, V) buffer */
    const __nv_bfloat16 *Ks = Kb + st * TILE, *Vs = Vb + (NV == 2 ? st : 0) * TILE;
    cp_async_wait_group<0>();
    __syncthreads();   /* tile kb landed (V too with NV 2); every warp is done with the others */
    if (NV == 1) {
      load_rows_async<DH, BK, 128>(Vb, v + base, rs, kb, T);
      cp_async_commit();
    }
    const bool more = kb + BK < kend;
    if (more) {
      load_rows_async<DH, BK, 128>(Kb + (st ^ 1) * TILE, k + base, rs, kb + BK, T);
      if (NV == 2) load_rows_async<DH, BK, 128>(Vb + (st ^ 1) * TILE, v + base, rs, kb + BK, T);
      cp_async_commit();
    }
    float s[8][4];
    qk_tile<DH>(s, Qs, Ks, r0, lane);
    /* scale into log2 units, mask (causal and past T), row max over the quad */
    float mx0 = m0, mx1 = m1;
    const bool mask = kb + BK > qb || kb + BK > T;   /* tiles touching the diagonal or T */
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        int key = kb + nt * 8 + 2 * t4 + e;
        float x0 = s[nt][e] * sl2, x1 = s[nt][2 + e] * sl2;
        if (mask) {
          if (key > row0 || key >= T) x0 = -INFINITY;
          if (key > row1 || key >= T) x1 = -INFINITY;
        }
        s[nt][e] = x0;
        s[nt][2 + e] = x1;
        mx0 = fmaxf(mx0, x0);
        mx1 = fmaxf(mx1, x1);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float base0 = mx0 == -INFINITY ? 0.f : mx0, base1 = mx1 == -INFINITY ? 0.f : mx1;
    const float c0 = exp2f(m0 - base0), c1 = exp2f(m1 - base1);
    m0 = mx0;
    m1 = mx1;
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int d = 0; d < ND; d++) {
      oacc[d][0] *= c0; oacc[d][1] *= c0;
      oacc[d][2] *= c1; oacc[d][3] *= c1;
    }
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      s[nt][0] = exp2f(s[nt][0] - base0);
      s[nt][1] = exp2f(s[nt][1] - base0);
      s[nt][2] = exp2f(s[nt][2] - base1);
      s[nt][3] = exp2f(s[nt][3] - base1);
      l0 += s[nt][0] + s[nt][1];
      l1 += s[nt][2] + s[nt][3];
    }
    if (NV == 1) {   /* V_kb landed (K_{kb+64} may still be in flight), then published */
      if (more) cp_async_wait_group<1>();
      else cp_async_wait_group<0>();
      __syncthreads();
    }
    /* O += P V: the C fragments of S tiles (2j, 2j+1) are the A fragment of P's k-step j */
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      uint32_t pa[4];
      c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < ND / 2; dp++) {
        uint32_t bf[4];
        ldsm_b_kn(bf, Vs, LD, dp * 16, kk * 16, lane);
        mma16816(oacc[2 * dp], pa, bf[0], bf[1]);
        mma16816(oacc[2 * dp + 1], pa, bf[2], bf[3]);
      }
    }
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float i0 = 1.0f / l0, i1 = 1.0f / l1;
  if (dsum) {   /* backward pre-pass: Dsum_i = dO_i . O_i, O in fp32, not stored */
    float d0 = 0.f, d1 = 0.f;
#pragma unroll
    for (int d = 0; d < ND; d++) {
      const int col = d * 8 + 2 * t4;
      if (row0 < T) {
        float2 x = __bfloat1622float2(*(const __nv_bfloat162 *)(dout + base + (int64_t)row0 * rs + col));
        d0 += oacc[d][0] * x.x + oacc[d][1] * x.y;
      }
      if (row1 < T) {
        float2 x = __bfloat1622float2(*(const __nv_bfloat162 *)(dout + base + (int64_t)row1 * rs + col));
        d1 += oacc[d][2] * x.x + oacc[d][3] * x.y;
      }
    }
    d0 += __shfl_xor_sync(0xffffffffu, d0, 1);
    d0 += __shfl_xor_sync(0xffffffffu, d0, 2);
    d1 += __shfl_xor_sync(0xffffffffu, d1, 1);
    d1 += __shfl_xor_sync(0xffffffffu, d1, 2);
    if (t4 == 0 && row0 < T) dsum[(int64_t)bh * T + row0] = d0 * i0;
    if (t4 == 0 && row1 < T) dsum[(int64_t)bh * T + row1] = d1 * i1;
  } else {
#pragma unroll
    for (int d = 0; d < ND; d++) {
      const int col = d * 8 + 2 * t4;
      if (row0 < T) store2<TO>(o + base + (int64_t)row0 * rs + col, oacc[d][0] * i0, oacc[d][1] * i0);
      if (row1 < T) store2<TO>(o + base + (int64_t)row1 * rs + col, oacc[d][2] * i1, oacc[d][3] * i1);
    }
  }
  if (lse && t4 == 0) {
    if (row0 < T) lse[(int64_t)bh * T + row0] = (m0 + log2f(l0)) * LN2F;
    if (row1 < T) lse[(int64_t)bh * T + row1] = (m1 + log2f(l1)) * LN2F;
  }
}

/* Forward launch (dsum != NULL: the backward's pre-pass, o unused). */
template <int DH, typename TO>
static int launch_fwd_mma(const kda_exec_node *n, kc_ctx *c, attn_io a, int64_t B, TO *o,
                          const __nv_bfloat16 *dout = NULL) {
  const size_t smem = fwd_cfg<DH>::smem;
  RAISE_SMEM((k_attn_fwd_mma<DH, TO>), smem);
  dim3 grid((unsigned)((a.T + BQ - 1) / BQ), (unsigned)(B * a.H));
  k_attn_fwd_mma<DH, TO><<<grid, 128, smem, c->stream>>>(
      (const __nv_bfloat16 *)a.q, (const __nv_bfloat16 *)a.k, (const __nv_bfloat16 *)a.v, o,
      a.lse, a.T, a.H, a.scale, dout, dout ? a.dsum : (float *)NULL);
  KC_LAUNCH_CHECK(n, "k_attn_fwd_mma");
  return 0;
}

/* ======================= tensor-core backward (mma.sync m16n8k16 bf16) =====================
 * FlashAttention-2's backward, split into passes so that every output element has exactly one
 * writer (no atomics: bit-reproducible):
 *   pre   k_attn_fwd_mma with dsum != NULL: lse_i and Dsum_i = dO_i . O_i per query row;
 *   dq    one block per 64 query rows, a loop over key tiles 0..diagonal:
 *           S = Q K^T, P = exp(S s - lse), dP = dO V^T, dS = P (dP - Dsum), dQ += dS K;
 *   dkdv  one block per 64 key rows, a loop over query tiles diagonal..T (NQ rows each):
 *           S^T = K Q^T, P^T, dP^T = V dO^T, dS^T, dV += P^T dO, dK += dS^T Q.
 * S and dP are recomputed in both passes (9 matrix products per tile pair over the whole
 * backward against FA2's 5 with atomics); P and dS are rounded to bf16 for their products,
 * as in FA2, everything else accumulates in fp32. 4 warps of 16 rows each; the C fragments
 * of S/dS are reused as A fragments (the forward's trick). Operands: A of S, dP (Q, dO in dq;
 * K, V in dkdv) via ldsm_a; B of S, dP (K, V in dq; Q, dO in dkdv: stored [n][k]) via
 * ldsm_b_nk; B of the accumulating products (K in dq; dO, Q in dkdv: stored [k][n]) via
 * ldsm_b_kn. The streamed tiles (K/V in dq, Q/dO/lse/Dsum in dkdv) are double-buffered with
 * cp.async, the next tile copying while the current one is multiplied. */

/* dq_i = scale sum_{j<=i} dS_ij k_j: block = 64 query rows (longest first), 4 warps x 16 rows.
 * smem: Q, dO (resident), then two stages of K, V, all 64 x (DH+8) bf16 (6 tiles: at Dh 128
 * 2 blocks an SM; 32-key stages for 3 blocks measured no faster). */
template <int DH, typename TO>
__global__ void __launch_bounds__(128, DH == 64 ? 4 : 2)
    k_attn_dq_mma(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                  const __nv_bfloat16 *dout, const float *lse, const float *dsum, TO *dq, int T,
                  int H, float scale) {
  constexpr int LD = DH + 8, NKS = DH / 16, ND = DH / 8, NK = 64, NT = NK / 8, STG = 2 * NK * LD;
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)smraw, *Os = Qs + 64 * LD, *kv = Os + 64 * LD;
  const int qb = (gridDim.x - 1 - blockIdx.x) * 64;
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int64_t rs = (int64_t)H * DH, base = ((int64_t)b * T * H + h) * DH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  load_rows_async<DH, 64, 128>(Qs, q + base, rs, qb, T);
  load_rows_async<DH, 64, 128>(Os, dout + base, rs, qb, T);
  load_rows_async<DH, NK, 128>(kv, k + base, rs, 0, T);
  load_rows_async<DH, NK, 128>(kv + NK * LD, v + base, rs, 0, T);
  cp_async_commit();
  const int r0 = warp * 16, row0 = qb + r0 + g, row1 = row0 + 8;
  const float sl2 = scale * LOG2E;
  const float lse0 = row0 < T ? lse[(int64_t)bh * T + row0] * LOG2E : 0.f;
  const float lse1 = row1 < T ? lse[(int64_t)bh * T + row1] * LOG2E : 0.f;
  const float ds0 = row0 < T ? dsum[(int64_t)bh * T + row0] : 0.f;
  const float ds1 = row1 < T ? dsum[(int64_t)bh * T + row1] : 0.f;
  float acc[ND][4];
#pragma unroll
  for (int d = 0; d < ND; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.f;
  const int kend = min(T, qb + 64);
  for (int kb = 0, st = 0; kb < kend; kb += NK, st ^= 1) {
    cp_async_wait_group<0>();
    __syncthreads();   /* tile kb is in stage st; every warp is done with the other stage */
    if (kb + NK < kend) {
      __nv_bfloat16 *nx = kv + (st ^ 1) * STG;
      load_rows_async<DH, NK, 128>(nx, k + base, rs, kb + NK, T);
      load_rows_async<DH, NK, 128>(nx + NK * LD, v + base, rs, kb + NK, T);
      cp_async_commit();
    }
    if (qb + r0 >= T) continue;   /* this warp's rows are all past T (uniform per warp) */
    const __nv_bfloat16 *Ks = kv + st * STG, *Vs = Ks + NK * LD;
    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < NKS; ks++) {
      uint32_t qa[4], oa[4];
      ldsm_a(qa, Qs, LD, r0, ks * 16, lane);
      ldsm_a(oa, Os, LD, r0, ks * 16, lane);
#pragma unroll
      for (int np = 0; np < NT / 2; np++) {
        uint32_t bf[4];
        ldsm_b_nk(bf, Ks, LD, np * 16, ks * 16, lane);
        mma16816(s[2 * np], qa, bf[0], bf[1]);
        mma16816(s[2 * np + 1], qa, bf[2], bf[3]);
        ldsm_b_nk(bf, Vs, LD, np * 16, ks * 16, lane);
        mma16816(dp[2 * np], oa, bf[0], bf[1]);
        mma16816(dp[2 * np + 1], oa, bf[2], bf[3]);
      }
    }
    /* dS = P (dP - Dsum) into s; masked (causal, keys past T) entries are exactly 0 */
    const bool mask = kb + NK > qb || kb + NK > T;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int key = kb + nt * 8 + 2 * t4 + e;
        float p0 = exp2f(s[nt][e] * sl2 - lse0), p1 = exp2f(s[nt][2 + e] * sl2 - lse1);
        if (mask) {
          if (key > row0 || key >= T) p0 = 0.f;
          if (key > row1 || key >= T) p1 = 0.f;
        }
        s[nt][e] = p0 * (dp[nt][e] - ds0);
        s[nt][2 + e] = p1 * (dp[nt][2 + e] - ds1);
      }
    /* dQ += dS K (k = the NK keys of the tile) */
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
      uint32_t a[4];
      c_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dp2 = 0; dp2 < ND / 2; dp2++) {
        uint32_t bf[4];
        ldsm_b_kn(bf, Ks, LD, dp2 * 16, kk * 16, lane);
        mma16816(acc[2 * dp2], a, bf[0], bf[1]);
        mma16816(acc[2 * dp2 + 1], a, bf[2], bf[3]);
      }
    }
  }
#pragma unroll
  for (int d = 0; d < ND; d++) {
    const int col = d * 8 + 2 * t4;
    if (row0 < T) store2<TO>(dq + base + (int64_t)row0 * rs + col, acc[d][0] * scale, acc[d][1] * scale);
    if (row1 < T) store2<TO>(dq + base + (int64_t)row1 * rs + col, acc[d][2] * scale, acc[d][3] * scale);
  }
}

/* Issue the copies of one dk/dv query stage: Q and dO rows [qb, qb+NQ), raw lse and Dsum of
 * those rows (zero past T). */
template <int DH, int NQ>
__device__ __forceinline__ void load_query_stage(__nv_bfloat16 *Qs, float *lr,
                                                 const __nv_bfloat16 *q, const __nv_bfloat16 *dout,
                                                 const float *lse, const float *dsum, int64_t rs,
                                                 int64_t bhT, int qb, int T) {
  constexpr int LD = DH + 8;
  load_rows_async<DH, NQ, 128>(Qs, q, rs, qb, T);
  load_rows_async<DH, NQ, 128>(Qs + NQ * LD, dout, rs, qb, T);
  if (threadIdx.x < NQ) {
    const int i = qb + threadIdx.x;
    const int64_t at = bhT + (i < T ? i : 0);
    cp_async4(lr + threadIdx.x, lse + at, i < T);
    cp_async4(lr + NQ + threadIdx.x, dsum + at, i < T);
  }
}

/* dv_j = sum_{i>=j} P_ij dO_i, dk_j = scale sum_{i>=j} dS_ij q_i: block = 64 key rows (the
 * first key tiles see the most query tiles and are launched first), 4 warps x 16 keys; the
 * query tiles (NQ rows) stream through smem in two stages. smem: K, V (resident, 64 rows),
 * two stages of Q, dO (NQ rows each), then two stages of lse (natural log, raw) and Dsum. */
template <int DH, int NQ, typename TO>
__global__ void __launch_bounds__(128, DH == 64 ? 3 : 2)
    k_attn_dkdv_mma(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                    const __nv_bfloat16 *dout, const float *lse, const float *dsum, TO *dk, TO *dv,
                    int T, int H, float scale) {
  constexpr int LD = DH + 8, NKS = DH / 16, ND = DH / 8, NT = NQ / 8, STG = 2 * NQ * LD;
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16 *Ks = (__nv_bfloat16 *)smraw, *Vs = Ks + 64 * LD, *qo = Vs + 64 * LD;
  float *lrs = (float *)(qo + 2 * STG);   /* stage s: lse at lrs + 2 NQ s, Dsum NQ further */
  const int kb = blockIdx.x * 64;
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  const int64_t rs = (int64_t)H * DH, base = ((int64_t)b * T * H + h) * DH, bhT = (int64_t)bh * T;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  load_rows_async<DH, 64, 128>(Ks, k + base, rs, kb, T);
  load_rows_async<DH, 64, 128>(Vs, v + base, rs, kb, T);
  load_query_stage<DH, NQ>(qo, lrs, q + base, dout + base, lse, dsum, rs, bhT, kb, T);
  cp_async_commit();
  const int r0 = warp * 16, key0 = kb + r0 + g, key1 = key0 + 8;
  const float sl2 = scale * LOG2E;
  float dka[ND][4], dva[ND][4];
#pragma unroll
  for (int d = 0; d < ND; d++)
#pragma unroll
    for (int e = 0; e < 4; e++) dka[d][e] = dva[d][e] = 0.f;
  for (int qb = kb, st = 0; qb < T; qb += NQ, st ^= 1) {
    cp_async_wait_group<0>();
    __syncthreads();   /* query tile qb is in stage st; every warp is done with the other stage */
    if (qb + NQ < T) {
      load_query_stage<DH, NQ>(qo + (st ^ 1) * STG, lrs + (st ^ 1) * 2 * NQ, q + base, dout + base,
                               lse, dsum, rs, bhT, qb + NQ, T);
      cp_async_commit();
    }
    /* uniform per warp: the warp's keys are past T, or every query of the tile precedes them */
    if (kb + r0 >= T || qb + NQ - 1 < kb + r0) continue;
    const __nv_bfloat16 *Qs = qo + st * STG, *Os = Qs + NQ * LD;
    const float *ls = lrs + st * 2 * NQ, *dss = ls + NQ;
    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < NKS; ks++) {
      uint32_t ka[4], va[4];
      ldsm_a(ka, Ks, LD, r0, ks * 16, lane);
      ldsm_a(va, Vs, LD, r0, ks * 16, lane);
#pragma unroll
      for (int np = 0; np < NT / 2; np++) {
        uint32_t bf[4];
        ldsm_b_nk(bf, Qs, LD, np * 16, ks * 16, lane);
        mma16816(s[2 * np], ka, bf[0], bf[1]);       /* S^T: rows keys, columns queries */
        mma16816(s[2 * np + 1], ka, bf[2], bf[3]);
        ldsm_b_nk(bf, Os, LD, np * 16, ks * 16, lane);
        mma16816(dp[2 * np], va, bf[0], bf[1]);      /* dP^T */
        mma16816(dp[2 * np + 1], va, bf[2], bf[3]);
      }
    }
    /* P^T into s, dS^T into dp; masked (causal, queries past T) entries are exactly 0 */
    const bool mask = qb < kb + 64 || qb + NQ > T;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int c = nt * 8 + 2 * t4 + e, qi = qb + c;
        /* lse in log2 units, rounded once as a stored product (__fmul_rn: never fused) */
        const float l = __fmul_rn(ls[c], LOG2E), dd = dss[c];
        float p0 = exp2f(s[nt][e] * sl2 - l), p1 = exp2f(s[nt][2 + e] * sl2 - l);
        if (mask) {
          if (qi < key0 || qi >= T) p0 = 0.f;
          if (qi < key1 || qi >= T) p1 = 0.f;
        }
        s[nt][e] = p0;
        s[nt][2 + e] = p1;
        dp[nt][e] = p0 * (dp[nt][e] - dd);
        dp[nt][2 + e] = p1 * (dp[nt][2 + e] - dd);
      }
    /* dV += P^T dO, dK += dS^T Q (k = the NQ queries of the tile) */
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
      uint32_t pa[4], da[4];
      c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
      c_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int d2 = 0; d2 < ND / 2; d2++) {
        uint32_t bf[4];
        ldsm_b_kn(bf, Os, LD, d2 * 16, kk * 16, lane);
        mma16816(dva[2 * d2], pa, bf[0], bf[1]);
        mma16816(dva[2 * d2 + 1], pa, bf[2], bf[3]);
        ldsm_b_kn(bf, Qs, LD, d2 * 16, kk * 16, lane);
        mma16816(dka[2 * d2], da, bf[0], bf[1]);
        mma16816(dka[2 * d2 + 1], da, bf[2], bf[3]);
      }
    }
  }
#pragma unroll
  for (int d = 0; d < ND; d++) {
    const int col = d * 8 + 2 * t4;
    if (key0 < T) {
      store2<TO>(dk + base + (int64_t)key0 * rs + col, dka[d][0] * scale, dka[d][1] * scale);
      store2<TO>(dv + base + (int64_t)key0 * rs + col, dva[d][0], dva[d][1]);
    }
    if (key1 < T) {
      store2<TO>(dk + base + (int64_t)key1 * rs + col, dka[d][2] * scale, dka[d][3] * scale);
      store2<TO>(dv + base + (int64_t)key1 * rs + col, dva[d][2], dva[d][3]);
    }
  }
}

/* Query rows per streamed tile in the dk/dv pass: 64 keeps the S/dP fragments at 64 registers;
 * at Dh 128 the dK and dV accumulators already take 128, so 32 keeps it clear of spills. */
template <int DH> struct dkdv_nq { static constexpr int value = DH == 64 ? 64 : 32; };

template <int DH, typename TO>
static int launch_bwd_mma(const kda_exec_node *n, kc_ctx *c, attn_io a, int64_t B, TO *out,
                          int64_t numel) {
  const __nv_bfloat16 *q = (const __nv_bfloat16 *)a.q, *k = (const __nv_bfloat16 *)a.k,
                      *v = (const __nv_bfloat16 *)a.v, *dout = (const __nv_bfloat16 *)a.dout;
  const unsigned tiles = (unsigned)((a.T + 63) / 64), bh = (unsigned)(B * a.H);
  /* 1. lse and Dsum (the forward, O kept in registers) */
  if (launch_fwd_mma<DH>(n, c, a, B, (__nv_bfloat16 *)NULL, dout)) return -1;
  /* 2. dq */
  size_t smem_q = (size_t)6 * 64 * (DH + 8) * 2;
  RAISE_SMEM((k_attn_dq_mma<DH, TO>), smem_q);
  k_attn_dq_mma<DH, TO><<<dim3(tiles, bh), 128, smem_q, c->stream>>>(
      q, k, v, dout, a.lse, a.dsum, out, a.T, a.H, a.scale);
  KC_LAUNCH_CHECK(n, "k_attn_dq_mma");
  /* 3. dk, dv */
  constexpr int NQ = dkdv_nq<DH>::value;
  size_t smem_kv = (size_t)(2 * 64 + 4 * NQ) * (DH + 8) * 2 + 4 * NQ * sizeof(float);
  RAISE_SMEM((k_attn_dkdv_mma<DH, NQ, TO>), smem_kv);
  k_attn_dkdv_mma<DH, NQ, TO><<<dim3(tiles, bh), 128, smem_kv, c->stream>>>(
      q, k, v, dout, a.lse, a.dsum, out + numel, out + 2 * numel, a.T, a.H, a.scale);
  KC_LAUNCH_CHECK(n, "k_attn_dkdv_mma");
  return 0;
}

static int use_mma(const attn_io *a) {
  static int simple = -1;
  if (simple < 0) {
    const char *e = getenv("KDA_ATTN_SIMPLE");
    simple = e && *e && strcmp(e, "0") != 0;
  }
  if (simple || (a->D != 64 && a->D != 128)) return 0;
  if (a->qdt != KDA_BF16 || a->kdt != KDA_BF16 || a->vdt != KDA_BF16) return 0;
  if (((uintptr_t)a->q | (uintptr_t)a->k | (uintptr_t)a->v) & 15) return 0;
  return a->odt == KDA_BF16 || a->odt == KDA_F32;
}

/* Forward into a.o (dtype a.odt), lse optional. */
static int fwd_any(const kda_exec_node *n, kc_ctx *c, attn_io a, int64_t B) {
  if (!use_mma(&a) || ((uintptr_t)a.o & 7)) return fwd_simple(n, c, a, B);
  if (a.odt == KDA_BF16) {
    __nv_bfloat16 *o = (__nv_bfloat16 *)a.o;
    return a.D == 64 ? launch_fwd_mma<64>(n, c, a, B, o) : launch_fwd_mma<128>(n, c, a, B, o);
  }
  float *o = (float *)a.o;
  return a.D == 64 ? launch_fwd_mma<64>(n, c, a, B, o) : launch_fwd_mma<128>(n, c, a, B, o);
}

static attn_io io_of(const kda_exec_node *n) {
  attn_io a;
  memset(&a, 0, sizeof a);
  a.q = n->in[0].data, a.k = n->in[1].data, a.v = n->in[2].data;
  a.qdt = n->in[0].dtype, a.kdt = n->in[1].dtype, a.vdt = n->in[2].dtype;
  a.T = (int)n->in[0].shape[1], a.H = (int)n->in[0].shape[2], a.D = (int)n->in[0].shape[3];
  a.scale = attn_scale(n);
  return a;
}

static int check_dims(const kda_exec_node *n) {
  const kda_tview *q = &n->in[0];
  if (q->shape[3] > 256)
    return kda_set_error("cuda: %s node %d: head dim %lld > 256 is not supported on CUDA: use "
                         "more heads", kda_op_name(n->op), n->id, (long long)q->shape[3]);
  if (q->shape[1] > 0x7fffffff / 2 || q->shape[0] * q->shape[2] > 65535)
    return kda_set_error("cuda: %s node %d: B*H = %lld exceeds 65535 (grid y)", kda_op_name(n->op),
                         n->id, (long long)(q->shape[0] * q->shape[2]));
  return 0;
}

int kc_attention(const kda_exec_node *n, kc_ctx *c) {
  if (check_dims(n)) return -1;
  attn_io a = io_of(n);
  a.o = n->out.data, a.odt = n->out.dtype;
  return fwd_any(n, c, a, n->in[0].shape[0]);
}

/* The tensor-core backward: every input bf16, Dh 64/128, 16-byte aligned rows, out bf16 or
 * f32 (KDA_ATTN_SIMPLE=1 forces the SIMT backward). */
static int bwd_use_mma(const kda_exec_node *n) {
  attn_io a = io_of(n);
  a.odt = n->out.dtype;
  return use_mma(&a) && n->in[3].dtype == KDA_BF16 && !((uintptr_t)n->in[3].data & 15) &&
         !((uintptr_t)n->out.data & 7);
}

/* Backward scratch: lse and Dsum [B,H,T] (f32); the SIMT path also recomputes O in f32. */
int64_t kc_attention_scratch(const kda_exec_node *n) {
  if (n->op != KDA_OP_ATTENTION_BWD) return 0;
  int64_t numel = kc_numel(&n->in[0]), rows = numel / n->in[0].shape[3];
  if (bwd_use_mma(n)) return 2 * KC_ALIGN(rows * 4);
  return KC_ALIGN(numel * 4) + 2 * KC_ALIGN(rows * 4);
}

int kc_attention_bwd(const kda_exec_node *n, kc_ctx *c) {
  if (check_dims(n)) return -1;
  int64_t B = n->in[0].shape[0], numel = kc_numel(&n->in[0]), rows = numel / n->in[0].shape[3];
  attn_io a = io_of(n);
  a.dout = n->in[3].data, a.ddt = n->in[3].dtype;
  char *s = (char *)c->scratch;
  if (bwd_use_mma(n)) {
    a.lse = (float *)s;
    a.dsum = (float *)(s + KC_ALIGN(rows * 4));
    if (n->out.dtype == KDA_BF16) {
      __nv_bfloat16 *o = (__nv_bfloat16 *)n->out.data;
      return a.D == 64 ? launch_bwd_mma<64>(n, c, a, B, o, numel)
                       : launch_bwd_mma<128>(n, c, a, B, o, numel);
    }
    float *o = (float *)n->out.data;
    return a.D == 64 ? launch_bwd_mma<64>(n, c, a, B, o, numel)
                     : launch_bwd_mma<128>(n, c, a, B, o, numel);
  }
  float *O32 = (float *)s;
  a.lse = (float *)(s + KC_ALIGN(numel * 4));
  a.dsum = (float *)(s + KC_ALIGN(numel * 4) + KC_ALIGN(rows * 4));
  a.O32 = O32;
  /* 1. recompute O (f32) and lse */
  attn_io f = a;
  f.o = O32, f.odt = KDA_F32;
  if (fwd_any(n, c, f, B)) return -1;
  /* 2. Dsum */
  k_attn_dsum<<<kc_blocks(rows, 8, INT32_MAX), 256, 0, c->stream>>>(a, rows);
  KC_LAUNCH_CHECK(n, "k_attn_dsum");
  /* 3. dq, 4. dk dv — packed [3,B,T,H,Dh] in out's dtype */
  int64_t es = kc_dsize(n->out.dtype);
  char *out = (char *)n->out.data;
  a.odt = n->out.dtype;
  dim3 grid((unsigned)((a.T + QW - 1) / QW), (unsigned)(B * a.H));
  size_t smem_dq = (size_t)(2 * TK * (a.D + 1) + QW * 2 * a.D) * sizeof(float);
  size_t smem_kv = (size_t)(2 * TK * (a.D + 1) + 2 * TK + QW * 2 * a.D) * sizeof(float);
  a.o = out;
#define L_DQ(K)                                                                            \
  do {                                                                                     \
    RAISE_SMEM(K, smem_dq);                                                                \
    K<<<grid, QW * 32, smem_dq, c->stream>>>(a);                                           \
  } while (0)
  NC_DISPATCH(k_attn_dq_simple, a.D, L_DQ);
  KC_LAUNCH_CHECK(n, "k_attn_dq_simple");
  a.o = out + numel * es, a.o2 = out + 2 * numel * es;
#define L_KV(K)                                                                            \
  do {                                                                                     \
    RAISE_SMEM(K, smem_kv);                                                                \
    K<<<grid, QW * 32, smem_kv, c->stream>>>(a);                                           \
  } while (0)
  NC_DISPATCH(k_attn_dkdv_simple, a.D, L_KV);
  KC_LAUNCH_CHECK(n, "k_attn_dkdv_simple");
  return 0;
}
