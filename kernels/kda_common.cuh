/* kda_common.cuh — what the two versions of the CUDA KDA kernels share (internal to
 * kernels/kda_cuda.cu, which holds the pipeline and the host side, kernels/kda_v1.cu, which
 * holds version 1 and the decode, and kernels/kda_tc.cu with kda_tc_bwd.cu, which hold
 * version 2): the argument block kp, the scratch layout ws, the small device helpers, the gate
 * chain of the backward, and the kernels kda_cuda.cu launches. */
#ifndef KDA_COMMON_CUH
#define KDA_COMMON_CUH
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kda_cuda.h"
#include "kernels.h"   /* kc_warp_sum */

extern "C" int kda_set_error(const char *fmt, ...);

typedef __nv_bfloat16 bf16;
#define NT 256                      /* threads: version 1, and version 2's forward state pass */
#define NTC 512                     /* threads: version 2's chunk kernels, backward state passes */
#define BV 32                       /* V columns per state-pass block */
#define L2_EPS 1e-6f

static __device__ __forceinline__ float ldb(const void *p, int64_t i) {
  return __bfloat162float(((const bf16 *)p)[i]);
}
static __device__ __forceinline__ void stb(void *p, int64_t i, float x) {
  ((bf16 *)p)[i] = __float2bfloat16(x);
}
static __device__ __forceinline__ float sigm(float x) { return 1.f / (1.f + expf(-x)); }
static __device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
/* The fast backward gate chain's sigmoid and softplus (§2.1), from one exponential
 * e = e^{-|x|} in (0, 1]:
 *   sigm(x) = 1 / (1 + e) for x >= 0, e / (1 + e) below (never e^{+|x|}: no overflow),
 *   softplus(x) = max(x, 0) + log1p(e),
 * log1p(e) = 2 atanh(z) = 2 (z + z^3/3 + z^5/5 + ...), z = e / (2 + e) <= 1/3: the terms to z^13
 * leave < 1e-8 (2 z^15 / 15 at z = 1/3), fused multiply-adds only. e by ex2.approx (__expf), the
 * quotients by MUFU.RCP (__fdividef): relative error < 3e-6 with an exact e (a CPU check over x
 * in [-90, 90]; __expf adds ~|x| ulps of e), far inside the bf16 dg they feed. Why: the IEEE
 * forms above (expf, log1pf, a division with its slow-path branch) made a softplus-gated chain
 * row ~5x a pre-gated one. H200, one run, three rounds, the trainer's gate at its init
 * (kda_bench KDA_BENCH_GATE=1, 2026-12-07s69c; the build had the fast forms in the forward's
 * gate too, its fast backward kernels' SASS this one's): the chain 10.0k -> 6.8k cycles a
 * block, fwd+bwd (8,2048,16,128) 2.332-2.351 -> 2.265-2.268 ms (the forward's share ~7 us),
 * graph (32,512,4,64) 0.437-0.438 -> 0.420-0.422. The precise backward and version 1 keep the
 * IEEE forms (the fast ones doubled some of the precise dA_log errors in that run's test, e.g.
 * 2.3e-4 -> 5.3e-4 on "K=V=128 T=300 H=4, layer flags, precise_gate"), and so does the forward:
 * there the fast ones cost k_intra_tc's pre-gated form 1.7% by its code's layout alone (fwd
 * (8,2048,16,128) 0.686-0.697 -> 0.699-0.709 ms, its gate loop not run) */
static __device__ __forceinline__ float log1p_unit(float e) {   /* log(1 + e), e in [0, 1] */
  const float z = __fdividef(e, 2.f + e), z2 = z * z;
  float s = 2.f / 13.f;
  s = fmaf(s, z2, 2.f / 11.f), s = fmaf(s, z2, 2.f / 9.f), s = fmaf(s, z2, 2.f / 7.f);
  s = fmaf(s, z2, 2.f / 5.f), s = fmaf(s, z2, 2.f / 3.f), s = fmaf(s, z2, 2.f);
  return s * z;
}
static __device__ __forceinline__ float sigm_of_e(float x, float e) {   /* e = e^{-|x|} */
  const float r = __fdividef(1.f, 1.f + e);
  return x >= 0.f ? r : e * r;
}
static __device__ __forceinline__ float sigm_fast(float x) { return sigm_of_e(x, __expf(-fabsf(x))); }
/* (the sum rounded on its own, never contracted with log1p_unit's last product: the fronts that
 * use it must agree bit for bit) */
static __device__ __forceinline__ float softplus_fast(float x) {
  return __fadd_rn(fmaxf(x, 0.f), log1p_unit(__expf(-fabsf(x))));
}
/* both at once (the softplus gate's chain reads both) */
static __device__ __forceinline__ void sigm_softplus_fast(float x, float *sg, float *sp) {
  const float e = __expf(-fabsf(x));
  *sg = sigm_of_e(x, e);
  *sp = fmaxf(x, 0.f) + log1p_unit(e);
}

/* sum of v over the block (blockDim a multiple of 32, <= 1024); red has 32 floats */
static __device__ inline float block_sum(float v, float *red) {
  v = kc_warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0;
  for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += red[w];
  return s;
}

/* The shapes and flags every kernel needs, passed by value. */
struct kp {
  int64_t B, T, H, HV, K, V;
  int C, gate_mode, beta_mode, l2, nseq;
  int full;         /* the fast chunk kernels (intra, mat, final): a compiled shape's full chunks
                     * run the body with the row count fixed (KDA_KDA_FULL=0: never) */
  int hm;           /* the chunk kernels' grid is head-major, (HV, chunks): blk_chunk, blk_head */
  float scale, lb;
  const int32_t *cu;
};

/* A chunk kernel's chunk and value head. Launched head-major (p.hm: blockIdx.x the head, y the
 * chunk), the blocks resident together are every head of a few consecutive chunks, so their rows
 * of the [T, HV, .] tensors make whole token rows (HV K elements, 4 KB of bf16 at HV = 16, K = 128);
 * chunk-major, one head's chunks: one 256-byte piece of each 4 KB token row. H100, one run,
 * three rounds, KDA_KDA_HM=0 (chunk-major) against on in the same binary (2026-12-07s67a):
 * fwd+bwd (8,2048,16,128) 2.201-2.210 -> 2.144-2.165 ms, fwd 0.727-0.729 -> 0.713-0.719; ncu
 * k_bwd_final_wg 810.9 -> 793.1 us, k_intra_tc 682.2 -> 667.0, k_bwd_mat_wg 424.4 -> 415.7;
 * (1,8192,16,128) and the small shapes equal. The FR final kernel stays chunk-major
 * (kda_final.cuh). */
static __device__ __forceinline__ int blk_chunk(const kp &p) { return p.hm ? blockIdx.y : blockIdx.x; }
static __device__ __forceinline__ int blk_head(const kp &p) { return p.hm ? blockIdx.x : blockIdx.y; }
static __device__ __forceinline__ int grid_chunks(const kp &p) { return p.hm ? gridDim.y : gridDim.x; }

/* scratch pointers (fp32 unless noted), indexed [(tt*HV + h) * dim] */
struct ws {
  int *ctab;        /* [NTu][4]: seq, first token, rows, - */
  int *sfirst;      /* [N+1]: first chunk index of each sequence */
  float *qn, *kn;   /* [.,K] normalised q, k (per value head; version 1, and the row kernels
                     * ahead of version 2's unfused front) */
  float2 *rn;       /* [.]   each row's l2 factors (rq, rk): q_n = q rq, k_n = k rk, the same
                     * product wherever it is formed, so the same bits; version 2's
                     * k_bwd_final_tc scales the raw bf16 q, k by them */
  float *G;         /* [.,K] log-decay, then its chunk cumsum */
  float *b;         /* [.]   beta after its mode */
  float *Aqk, *M;   /* [.,C] rows of the chunk matrices */
  float *W, *kg, *qg; /* [.,K] */
  float *U;         /* [.,V] */
  /* backward only */
  float *vn, *dvn;  /* [.,V] */
  bf16 *dvnb;       /* [.,V] dVn in bf16 (version 2's fast path: the rows kernel's operand) */
  float *dQ, *dKi, *dW, *dKb; /* [.,K] */
  bf16 *dQb, *dKib, *dWb; /* [.,K] the inter-chunk dQ0, dKi0 and dW in bf16 where the fused sweep
                     * hands them to k_bwd_final_wg (Q16) and k_bwd_mat_wg (W16): in the rooms of
                     * dvnb and dh, which that backward neither writes nor reads (it runs no rows
                     * kernel and no two-block sweep) */
  bf16 *dAb;        /* [.,C] dA likewise (Q16), in dh's room after them */
  float *dA, *dL;   /* [.,C] */
  float *db;        /* [.]   */
  float *Kb;        /* [.,K] b k e^G (version 2: written by k_intra_tc for k_bwd_mat_tc) */
  float *h, *dh;    /* [NTu, HV, K, V] state entering / grad leaving each chunk. h, dh and vn
                     * hold bf16 in version 2's fast path (the state passes' RN shadows: what
                     * the backward's products read; st_keep), fp32 elsewhere */
  float *dgn;       /* [NTu, HV, K] rowsum_V(S0 . dSe) per chunk (tensor-core path) */
  float *gpart;     /* [NTu, HV, K+1] per-chunk partials of ddt_bias (K) and dA_log (1) */
  /* version 2 only: bf16 copies the state passes stage with cp.async, written by k_intra_tc
   * into the W, qg, kg, Aqk buffers (which version 2 does not use in fp32): rows of r16(K)
   * (zero-padded columns) for Wb, qgb (= s qg), kgb; rows of C for Ab. The precise backward
   * (k_intra_tc_p) writes the same tiles in fp32 instead, through W, qg (= s qg), kg, Aqk:
   * rows of r16(K) floats (not K as version 1), so those buffers hold [., r16(K)] floats */
  bf16 *Wb, *qgb, *kgb, *Ab;
  /* the flow kernels' words, zeroed by the chunk table's block (every forward, every
   * recomputing backward): k_fwd_flow's role ticket [0] and a ready flag per (chunk, value
   * head) [1, 1 + NTu HV); then k_bwd_flow's ticket, its count of finished blocks and its flags
   * (each reset by the block that consumed it, the ticket and count by the last block: a kept
   * forward's backward may run twice) */
  int *flow;
};

/* The raw per-row inputs of the fused front (k_intra_tc doing the row preprocessing of its
 * chunk itself: intra_rows in kda_intra.cuh); q == NULL: a row kernel (k_rows4, k_rows) did it
 * for the whole tensor and k_intra_tc stages qn, kn, G, b from the workspace. wr: also store
 * rn, b there (a backward will read them) */
struct rowin {
  const void *q, *k, *g, *beta;
  const float *A_log, *dt_bias;
  int wr;
};

/* ---- the row preprocessing's arithmetic (§2.1–2.3), one form for k_rows, k_rows4 and the
 * fused front, so that they give the same values bit for bit ---- */

/* 4 bf16 at p[i] (8-byte aligned), as loaded (ld4r) and as floats (bf4: 0 bits are 0.f); a loop
 * that loads several rows keeps them raw and converts after the last load (why: intra_rows,
 * kda_intra.cuh) */
static __device__ __forceinline__ uint2 ld4r(const void *p, int64_t i) { return *(const uint2 *)((const bf16 *)p + i); }
static __device__ __forceinline__ float4 bf4(uint2 u) {
  float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
  return make_float4(a.x, a.y, b.x, b.y);
}
static __device__ __forceinline__ float4 ld4b(const void *p, int64_t i) { return bf4(ld4r(p, i)); }
/* x.x^2 + x.y^2 + x.z^2 + x.w^2 in that order, the contractions spelled out (the compiler's
 * own choice could differ between two kernels) */
static __device__ __forceinline__ float sumsq4(float4 x) {
  return __fmaf_rn(x.w, x.w, __fmaf_rn(x.z, x.z, __fmaf_rn(x.y, x.y, __fmul_rn(x.x, x.x))));
}
/* the sum over each aligned group of LW lanes (LW = 32: kc_warp_sum), fixed xor order */
template <int LW>
static __device__ __forceinline__ float lane_group_sum(float v) {
  for (int o = LW / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
/* the l2 norm's factor from the row's sum of squares (1 without l2) */
static __device__ __forceinline__ float l2_scale(const kp &p, float ss) { return p.l2 ? rsqrtf(ss + L2_EPS) : 1.f; }
/* the log-decay of g's element x at value head h, column d: x itself (gate_mode 0),
 * -e^{A_log} softplus(x + dt_bias) (1) or lb sigmoid(e^{A_log} (x + dt_bias)) (2); ea = e^{A_log[h]}.
 * FAST: the sigmoid and softplus from one exponential (sigm_fast, softplus_fast), the forward's
 * fast path with a gate (fast_gate in kda_cuda.cu: k_rows, k_rows4 and k_intra_tc's gated
 * twin, so that the fronts agree bit for bit); the IEEE forms elsewhere */
template <bool FAST>
static __device__ __forceinline__ float gate_of(const kp &p, float x, float ea) {
  if (FAST) return p.gate_mode == 1 ? -ea * softplus_fast(x) : p.lb * sigm_fast(ea * x);
  return p.gate_mode == 1 ? -ea * softplus(x) : p.lb * sigm(ea * x);
}
template <bool FAST = false>
static __device__ __forceinline__ float gate1(const kp &p, float x, const float *dt_bias, int64_t h, int64_t d,
                                              float ea) {
  if (p.gate_mode == 0) return x;
  if (dt_bias) x += dt_bias[h * p.K + d];
  return gate_of<FAST>(p, x, ea);
}
template <bool FAST = false>
static __device__ __forceinline__ float4 gate4(const kp &p, float4 x, const float *dt_bias, int64_t h, int64_t d,
                                               float ea) {
  return make_float4(gate1<FAST>(p, x.x, dt_bias, h, d, ea), gate1<FAST>(p, x.y, dt_bias, h, d + 1, ea),
                     gate1<FAST>(p, x.z, dt_bias, h, d + 2, ea), gate1<FAST>(p, x.w, dt_bias, h, d + 3, ea));
}
/* beta after its mode: itself, sigmoid, or 2 sigmoid (§2.2) */
static __device__ __forceinline__ float beta_act(const kp &p, float b) {
  return p.beta_mode == 0 ? b : (p.beta_mode == 2 ? 2.f : 1.f) * sigm(b);
}

static inline int64_t n_seq(const kda_kda_args *a) { return a->cu_seqlens ? a->nseq : a->B; }
/* upper bound on the number of chunks (each sequence adds at most one partial chunk) */
static inline int64_t n_chunks_max(const kda_kda_args *a) {
  int64_t C = a->chunk;
  return a->cu_seqlens ? (a->T + C - 1) / C + a->nseq : a->B * ((a->T + C - 1) / C);
}

static __device__ inline void seq_span(const kp &p, int64_t n, int64_t *bos, int64_t *len) {
  if (p.cu) *bos = p.cu[n], *len = p.cu[n + 1] - p.cu[n];
  else *bos = n * p.T, *len = p.T;
}

/* Equal-length sequences (no cu_seqlens): chunk idx is chunk idx % nc of sequence idx / nc,
 * written by a thread each (H200, (8,2048,16,128): 8.5 -> 2.1 us; the serial loop below took
 * ~10 us at B = 32, 1% of a small fwd+bwd). Packed sequences: one thread walks them (sequence
 * starts need a prefix sum). One block does it: the last block of the row kernels (kda_cuda.cu), which
 * run beside it and read none of it (it was a kernel of its own, k_chunks, one more launch
 * ahead of k_intra on every forward), or of k_intra_tc's grid (kda_tc.cu; equal-length
 * sequences, whose chunks chunk_of forms without it), or k_chunk_table alone. */
static __device__ inline void chunk_table(const kp &p, int64_t NTu, int *ctab, int *sfirst, int *flow) {
  for (int64_t i = threadIdx.x; i < 3 + 2 * NTu * p.HV; i += blockDim.x) flow[i] = 0;   /* the flow kernels' */
  if (!p.cu) {
    int64_t nc = (p.T + p.C - 1) / p.C;
    for (int64_t idx = threadIdx.x; idx < NTu; idx += blockDim.x) {
      int64_t n = idx / nc, t0 = idx % nc * p.C;
      ctab[4 * idx] = (int)n, ctab[4 * idx + 1] = (int)(n * p.T + t0);
      ctab[4 * idx + 2] = (int)(p.T - t0 < p.C ? p.T - t0 : p.C), ctab[4 * idx + 3] = 0;
    }
    for (int64_t n = threadIdx.x; n <= p.B; n += blockDim.x) sfirst[n] = (int)(n * nc);
    return;
  }
  if (threadIdx.x) return;
  int64_t N = p.cu ? p.nseq : p.B, idx = 0;
  for (int64_t n = 0; n < N; n++) {
    int64_t bos, len;
    seq_span(p, n, &bos, &len);
    sfirst[n] = (int)idx;
    for (int64_t t0 = 0; t0 < len && idx < NTu; t0 += p.C, idx++) {
      ctab[4 * idx] = (int)n, ctab[4 * idx + 1] = (int)(bos + t0);
      ctab[4 * idx + 2] = (int)(len - t0 < p.C ? len - t0 : p.C), ctab[4 * idx + 3] = 0;
    }
  }
  sfirst[N] = (int)idx;
  for (; idx < NTu; idx++) ctab[4 * idx + 2] = 0;
}

/* chunk cb's first token and rows: its chunk-table entry, or (tab: equal-length sequences,
 * whose table the reader's own grid is writing) formed as chunk_table forms them */
static __device__ inline void chunk_of(const kp &p, const ws &w, int cb, bool tab, int64_t *t0, int *n) {
  if (tab) {                                       /* 32-bit, as the table's entries are */
    int T = (int)p.T, nc = (T + p.C - 1) / p.C, j0 = cb % nc * p.C;
    *t0 = cb / nc * T + j0, *n = T - j0 < p.C ? T - j0 : p.C;
    return;
  }
  *t0 = w.ctab[4 * cb + 1], *n = w.ctab[4 * cb + 2];
}

/* Rows hi down to lo of column d of a chunk's gate gradient, shared by both kernel versions:
 * the reverse cumsum of dG continued from acc (dG_at(r): row r of column d; version 1 holds it
 * in w.dW, version 2 in shared memory; acc is the sum of the rows after hi, dGn included, which
 * enters at the chunk's last row: dGn for a whole column), then the gate chain of §2.1 from the
 * log-decay back to the raw gate (g_at(r): row r's raw gate of column d, read from global memory
 * or from a staged tile; dtb: the column's dt_bias, 0 without one). Writes dg, adds the dA_log
 * share to *dAl, returns the rows' ddt_bias share. MODE: the launch's p.gate_mode as a constant
 * (gate_chain_col, below, picks it); FAST: the fast backward's sigmoid and softplus (above), else
 * the IEEE ones (the precise backward, version 1). */
template <int MODE, bool FAST, class FD, class FG>
static __device__ inline float gate_chain_rows(const kp &p, FD dG_at, FG g_at, float dtb,
                                        int has_A_log, void *dg, int64_t t0, int64_t h, int lo, int hi,
                                        int64_t d, float acc, float ea, float *dAl) {
  int64_t K = p.K, HV = p.HV;
  float ddt = 0;
  /* rows in batches of 8: the batch's loads are issued before its dg stores (one latency per
   * batch instead of one per row: the compiler cannot hoist a load above a possibly aliasing
   * store); the arithmetic and its order are those of the row-by-row loop */
  for (int r0 = hi; r0 >= lo; r0 -= 8) {
    float dw[8], gx[8];
#pragma unroll
    for (int u = 0; u < 8; u++) {
      dw[u] = r0 - u >= lo ? dG_at(r0 - u) : 0.f;
      gx[u] = r0 - u >= lo && MODE ? g_at(r0 - u) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < 8; u++) {
      int r = r0 - u;
      if (r < lo) break;
      int64_t ir = ((t0 + r) * HV + h) * K + d;
      acc += dw[u];
      float dy = acc, dx;
      if constexpr (MODE == 0) dx = dy;
      else {
        float x = gx[u] + dtb;
        if constexpr (MODE == 1) {
          float sg, sp;
          if constexpr (FAST) sigm_softplus_fast(x, &sg, &sp);
          else sg = sigm(x), sp = softplus(x);
          dx = dy * -ea * sg, *dAl += dy * -ea * sp;
        }
        else {
          float s = FAST ? sigm_fast(ea * x) : sigm(ea * x);
          dx = dy * p.lb * s * (1 - s) * ea;
          if (has_A_log) *dAl += dx * x;
        }
        ddt += dx;
      }
      stb(dg, ir, dx);
    }
  }
  return ddt;
}
/* The gate mode is the whole launch's: a loop a mode, chosen once. With the modes' branches in
 * the row loop, a pre-gated chain's ~12 instructions a row sat among the other modes' ~110
 * (sigm, softplus, IEEE division's slow path), so its rows jumped across ~15 KB of code a
 * batch: ncu (s52a) put 14% of the phase's stall samples on instruction fetch (no_inst) and
 * more on branch resolution. H100, one run, two rounds (s55d): k_bwd_final_wg's chain phase
 * 5.3k -> 4.0k cycles a block (the kernel 44.6k -> 43.3k), fwd+bwd (8,2048,16,128) 2.646 /
 * 2.658 -> 2.632 / 2.634 ms, (1,8192,16,128) 1.632 / 1.645 -> 1.625 / 1.624, graph
 * (32,512,4,64) 0.451 / 0.455 -> 0.448 / 0.450. */
template <bool FAST, class FD, class FG>
static __device__ inline float gate_chain_col(const kp &p, FD dG_at, FG g_at, float dtb,
                                       int has_A_log, void *dg, int64_t t0, int64_t h, int lo, int hi,
                                       int64_t d, float acc, float ea, float *dAl) {
  const int m = p.gate_mode;
  if (m == 0) return gate_chain_rows<0, FAST>(p, dG_at, g_at, dtb, has_A_log, dg, t0, h, lo, hi, d, acc, ea, dAl);
  if (m == 1) return gate_chain_rows<1, FAST>(p, dG_at, g_at, dtb, has_A_log, dg, t0, h, lo, hi, d, acc, ea, dAl);
  return gate_chain_rows<2, FAST>(p, dG_at, g_at, dtb, has_A_log, dg, t0, h, lo, hi, d, acc, ea, dAl);
}

/* ---- version 1 and the decode (kernels/kda_v1.cu): kernels and their dynamic shared memory */
size_t smem_intra(int64_t C, int64_t K);
size_t smem_state(int64_t C, int64_t K);
size_t smem_mat(int64_t C);
__global__ void k_intra(kp p, const void *v, ws w);
__global__ void k_state_fwd(kp p, ws w, const float *h0, void *o, float *ht);
__global__ void k_state_bwd(kp p, ws w, const float *h0, const void *dout, const float *dht, float *dh0);
__global__ void k_bwd_rows(kp p, const void *dout, ws w);
__global__ void k_bwd_mat(kp p, const void *v, const void *dout, void *dv, ws w);
__global__ void k_bwd_final(kp p, const void *g, const void *beta, const float *A_log, const float *dt_bias,
                            void *dg, void *dbeta, float *dA_log, float *ddt_bias, ws w);
__global__ void k_decode(kp p, const void *q, const void *k, const void *v, const void *g, const void *beta,
                         const float *A_log, const float *dt_bias, float *state, void *o);

/* ---- version 2 (kernels/kda_tc.cu, kda_tc_bwd.cu): kernels and their dynamic shared memory */
/* Each backward kernel has a precise twin (suffix _p, prec = 1 in the smem sizes): every
 * product that feeds dg runs in split tf32 (fp32-level) from fp32 tiles, so that dA_log and
 * ddt_bias, cancelling sums of dg, keep the reference's accuracy (kda_tc.cu, "precise
 * backward"); the host picks it when those gradients are asked for (kda_cuda.cu). */
#define BVT 32                      /* V columns per version-2 state-pass block */
#define BVN 16                      /* the _db passes' when they run alone on a small grid (kda_cuda.cu state_bv) */
/* Tile sets of a _db pass: three, each staged two steps ahead, in the lone 16-column passes at
 * the compiled K = 64 (134 KiB), else two (K = 128's three, 215 KiB, would fit, but no bench
 * shape runs them; the run-time forms take any K). Why: at (8,512,4,64) the idle warps' copies
 * of a set (~38 KB) take ~1.4k cycles, as long as the step's products beside them, and a set
 * staged one step ahead was still landing at the next step's top (that wait ~0.95k cycles a
 * step; phase counters, 2026-12-04s39b, s41b). H200, one run, three rounds against main
 * (2026-12-04s41d): fwd+bwd (8,512,4,64) in a graph 0.131 -> 0.129 ms; every other kernel
 * byte-identical. Smaller GPUs: the _db passes need the 32-column two-set layout (109 KiB at
 * K = 64) to fit first (use_state_db), which 99 KB parts (sm_86, sm_89) lack; 163 KB (sm_80)
 * and 227 KB (sm_90) hold both; a limit in between would run 32 columns (state_bv). */
static inline __host__ __device__ constexpr int db_sets(int kv, int nv) { return kv == 64 && nv == BVN ? 3 : 2; }
#define BVW 64                      /* the wide state passes' (kda_state_wide.cu) */
#define NTW 256                     /* their threads */
/* Phase timers (profiling builds only: -DKDA_PHASES, benches/kda_gpu.sh's kda_bench_phases).
 * PH_INIT(kernel) starts a block's clock; PH(phase) waits for the block (an extra barrier, so
 * a timed build runs a little slower) and adds the cycles since the last mark to
 * kda_phase_cyc[kernel][phase], summed over blocks; kda_phase_report prints each phase's share
 * and mean cycles per block. Ordinary builds compile the marks to nothing. Kernel ids: 0 intra,
 * 1 state_fwd, 2 state_bwd, 3 bwd_rows, 4 bwd_mat, 5 bwd_final (k_bwd_final_tc), 6 bwd_final_wg
 * (k_bwd_final_wg: kda_final.cuh's body with WG, its own file's counters). */
#define KDA_PH_KERNELS 7
#define KDA_PH_PHASES 12
#ifdef KDA_PHASES   /* kda_phase_cyc: one per file that marks phases (kda_tc.cuh) */
void kda_phase_take_bwd(unsigned long long (*c)[KDA_PH_PHASES + 1]);   /* kda_tc_bwd.cu's, into c */
void kda_phase_take_final(unsigned long long (*c)[KDA_PH_PHASES + 1]); /* kda_final_tc.cu's */
void kda_phase_take_final_wg(unsigned long long (*c)[KDA_PH_PHASES + 1]); /* kda_final_wg.cu's */
void kda_phase_take_mat(unsigned long long (*c)[KDA_PH_PHASES + 1]);   /* kda_mat_halves.cu's */
void kda_phase_take_wide(unsigned long long (*c)[KDA_PH_PHASES + 1]);  /* kda_state_wide.cu's */
#define PH_INIT(kid)                                                                        \
  long long ph_t_ = clock64();                                                              \
  const int ph_k_ = (kid);                                                                  \
  if (threadIdx.x == 0) atomicAdd(&kda_phase_cyc[ph_k_][KDA_PH_PHASES], 1ull)
/* PH_IN(kernel): the same clock in a helper the kernel calls (no block count); PH_RESET():
 * the caller's clock restarts after such a helper (its time is the helper's phases) */
#define PH_IN(kid)                                                                          \
  long long ph_t_ = clock64();                                                              \
  const int ph_k_ = (kid)
#define PH_RESET() (ph_t_ = clock64())
#define PH(ph)                                                                              \
  do {                                                                                      \
    __syncthreads();                                                                        \
    if (threadIdx.x == 0) {                                                                 \
      long long t_ = clock64();                                                             \
      atomicAdd(&kda_phase_cyc[ph_k_][(ph)], (unsigned long long)(t_ - ph_t_));             \
      ph_t_ = t_;                                                                           \
    }                                                                                       \
  } while (0)
#else
#define PH_INIT(kid) do { } while (0)
#define PH_IN(kid) do { } while (0)
#define PH_RESET() do { } while (0)
#define PH(ph) do { } while (0)
#endif
extern "C" void kda_phase_report(const char *title);   /* prints and resets; no-op unless KDA_PHASES */
size_t smem_intra_tc(int64_t C, int64_t K, int64_t V);
size_t smem_intra_vtile(int64_t C, int64_t V);
size_t smem_intra_tc_compact(int64_t C, int64_t K, int64_t V);
size_t smem_state_tc(int64_t C, int64_t K, int prec, int bv = BVT);
size_t smem_state_tc_db(int64_t C, int64_t K, int bv = BVT, int ns = 2);
size_t smem_state_bwd_tc_db(int64_t C, int64_t K, int bv = BVT, int ns = 2);
size_t smem_rows_tc(int64_t C, int64_t K, int64_t V);
size_t smem_rows_tc_sep(int64_t C, int64_t K, int64_t V);
size_t smem_rows_tc_fast(int64_t C, int64_t K, int64_t V, int vn, int dvf);
enum { ROWS_SEP = 1, ROWS_VN = 2, ROWS_DVF = 4, ROWS_FR = 8 };   /* k_bwd_rows_tc's layout bits (kda_tc_bwd.cu) */
size_t smem_mat_tc(int64_t C, int64_t K, int64_t V);
size_t smem_mat_tc_compact(int64_t C, int64_t K, int64_t V);
size_t smem_final_tc(int64_t C, int64_t K);
size_t smem_final_tc_compact(int64_t C, int64_t K);
/* the chunk kernels (templates in kda_tc.cu, kda_tc_bwd.cu) by their instantiation: pr the
 * precise twin, cm the compact layout, kv the shape specialisation (kv_spec in kda_cuda.cu) */
typedef void (*intra_tc_fn)(kp, const void *, ws, int, rowin, int);
typedef void (*rows_tc_fn)(kp, const void *, ws, int);
typedef void (*mat_tc_fn)(kp, const void *, const void *, void *, ws);
typedef void (*final_tc_fn)(kp, const void *, const void *, const void *, const void *, const float *, const float *,
                            void *, void *, void *, void *, ws);
intra_tc_fn k_intra_tc_pick(bool pr, bool cm, int kv, bool gf);
rows_tc_fn k_bwd_rows_tc_pick(bool pr, int kv);
mat_tc_fn k_bwd_mat_tc_pick(bool pr, bool cm, int kv);
/* the fast compact K = V = 64 form forming dW itself (kda_tc_bwd.cu's MW: beside
 * k_bwd_final_fr no rows kernel runs); smem_mat_tc_compact's bytes */
mat_tc_fn k_bwd_mat_mw_ptr(void);
/* the fast mat kernel at K = V = 128 in three staging rounds, two blocks an SM (kda_mat_halves.cu) */
size_t smem_mat_tc_halves(int64_t C, int64_t K, int64_t V);
__global__ void k_bwd_mat_tc_h(kp p, const void *v, const void *dout, void *dv, ws w);
/* the same on warpgroup MMAs, tf32 (kda_mat_wg.cu: sm_90a only; four rounds, two blocks an SM) */
mat_tc_fn k_bwd_mat_wg_ptr(int w16);   /* w16: reading the fused sweep's bf16 dW */
size_t smem_mat_wg(int w16);
final_tc_fn k_bwd_final_tc_pick(bool pr, bool cm, int kv);
/* the fast wide K = V = 128 form with a flat chunk's intra-chunk terms on warpgroup MMAs, tf32
 * (kda_final_wg.cu: sm_90a only; smem_final_tc's bytes) */
final_tc_fn k_bwd_final_wg_ptr(int q16);   /* q16: reading the fused sweep's bf16 dQ0, dKi0, dA */
/* the fast compact K = V = 64 form that forms the rows kernel's dQ0, dKi0, dgn and dA itself from
 * dout (its last argument) and the state passes' bf16 copies (kda_final.cuh's FR; the rows kernel
 * then runs with ROWS_FR, or none beside k_bwd_mat_mw); smem_final_tc_compact's bytes, 256 threads */
typedef void (*final_fr_fn)(kp, const void *, const void *, const void *, const void *, const float *, const float *,
                            void *, void *, void *, void *, ws, const void *);
final_fr_fn k_bwd_final_fr_ptr(void);
/* the state passes by form and kv: the forward's fast (ST_FAST), second-tile-set (ST_DB) and
 * precise-kept (ST_PRECISE) kernels; the backward's (pr: precise); the kept fast reverse sweep
 * with two tile sets. bv: the second-tile-set kernels' V columns a block (BVT or BVN) */
typedef void (*state_fwd_fn)(kp, ws, const float *, void *, float *);
typedef void (*state_bwd_fn)(kp, ws, const float *, const void *, const float *, float *, int);
typedef void (*state_bwd_db_fn)(kp, ws, const void *, const float *, float *);
enum { ST_FAST, ST_DB, ST_PRECISE };
state_fwd_fn k_state_fwd_tc_pick(int form, int kv, int bv = BVT);
state_bwd_fn k_state_bwd_tc_pick(bool pr, int kv);
state_bwd_db_fn k_state_bwd_tc_db_pick(int kv, int bv = BVT);
/* k_intra_tc and k_state_fwd_tc_db as one grid (kda_tc.cu, "flow"): after the first `lead`
 * blocks to start the next ns run the state pass, the rest the intra chunks, which flag each
 * chunk when written */
typedef void (*fwd_flow_fn)(kp, const void *, ws, int, rowin, const float *, void *, float *, int, int);
/* k_fwd_flow with persistent intra blocks (kda_tc.cu; kv = 64 or 128, else null): (p, v, w, ri,
 * h0, o, ht, ns, lead, nroles) */
typedef void (*fwd_flow_ps_fn)(kp, const void *, ws, rowin, const float *, void *, float *, int, int, int);
fwd_flow_ps_fn k_fwd_flow_ps_pick(int kv, bool gf);
fwd_flow_fn k_fwd_flow_pick(bool cm, int kv, bool gf);
/* k_state_bwd_tc_db and k_bwd_rows_tc as one grid (kda_tc_bwd.cu): the state blocks flag each
 * chunk's dS, dVn; fb = w.flow + 1 + NTu HV (k_bwd_flow's words); nz: V tiles a head */
typedef void (*bwd_flow_fn)(kp, const void *, ws, const float *, float *, int, int, int, int *);
bwd_flow_fn k_bwd_flow_pick(int kv);
/* the wide state passes (kda_state_wide.cu: 64 V columns a block, the state in registers; the
 * compiled shapes only, NULL for kv = 0; NTW threads): the forward pass, the kept fast
 * reverse sweep */
size_t smem_state_wide(int64_t C, int64_t K, int fwd);
state_fwd_fn k_state_fwd_tc_wide_pick(int kv);
state_fwd_fn k_state_fwd_tc_wg_ptr(void);   /* kda_state_wg.cu (sm_90a only) */
size_t smem_state_wg(void);
state_bwd_db_fn k_state_bwd_tc_wg_ptr(void);   /* kda_state_wg.cu's reverse sweep (sm_90a only) */
enum { SR_B16_QK = 1, SR_B16_W = 2 };   /* the fused sweep's bf16 hand-offs (k_state_bwd_rows_wg's B16) */
state_bwd_db_fn k_state_bwd_rows_wg_ptr(int b16); /* the same with the rows kernel's products */
/* the fast rows kernel on warpgroup MMAs (kda_rows_wg.cu: sm_90a only, K = V = 128) */
typedef void (*rows_wg_fn)(kp, const void *, ws);
rows_wg_fn k_bwd_rows_wg_ptr(void);
size_t smem_rows_wg(void);
size_t smem_state_bwd_wg(void);
size_t smem_state_bwd_rows_wg(void);
state_bwd_db_fn k_state_bwd_tc_wide_pick(int kv);
#endif
