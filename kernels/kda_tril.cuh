/* kda_tril.cuh — M = (I + L)^-1 for the chunk's strictly lower triangular L, in shared memory:
 * k_intra_tc's inverse (KDA.md §3.2), its diagonal blocks by substitution and its doubling
 * levels on the tensor cores in split tf32 (fp32-level operands). Included by kda_intra.cuh only,
 * after kda_tc.cuh (kda_tile.cuh's split_tf32, mma_tf32, BT). */
#pragma once
#include "kda_tc.cuh"

/* One warp's 3xTF32 product (kda_tile.cuh's P_3TF32 split) of MT m16 tiles against one n8 strip,
 * each of the three terms in an accumulator of its own, summed at the end small terms first: a
 * chain of one MMA a k8 step instead of three dependent ones (as mma_blk4 it measured faster in
 * this inverse: fwd (8,2048,16,128) 1.257 -> 1.235 ms; elsewhere it gained nothing, wip/p3acc).
 * out(i, c, x) gets rows i, i + 8 of each tile's columns 2t, 2t + 1 (x[4]: mma's C fragment).
 * A(i, k), B(k, c) read shared memory at compile-time shapes; the MT tiles' chains interleave on
 * one B fragment (one tile at a time: 64 registers in the compact kernel without a bound, and
 * slower, 2026-12-04s39c: k_intra_tc 31.5 against 31.0 us at (8,512,4,64)). */
template <int MT, int KD, class FA, class FB, class FE>
static __device__ __forceinline__ void warp_strip3(FA A, FB B, FE out) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float c[MT][4] = {}, cla[MT][4] = {}, clb[MT][4] = {};
#pragma unroll
  for (int k0 = 0; k0 < KD; k0 += 8) {
    uint32_t bh[2], bl[2];
    split_tf32(B(k0 + t, g), bh[0], bl[0]), split_tf32(B(k0 + t + 4, g), bh[1], bl[1]);
#pragma unroll
    for (int m = 0; m < MT; m++) {
      const int i = 16 * m + g;
      float xa[4] = {A(i, k0 + t), A(i + 8, k0 + t), A(i, k0 + t + 4), A(i + 8, k0 + t + 4)};
      uint32_t ah[4], al[4];
#pragma unroll
      for (int u = 0; u < 4; u++) split_tf32(xa[u], ah[u], al[u]);
      mma_tf32(cla[m][0], cla[m][1], cla[m][2], cla[m][3], al, bh);
      mma_tf32(clb[m][0], clb[m][1], clb[m][2], clb[m][3], ah, bl);
      mma_tf32(c[m][0], c[m][1], c[m][2], c[m][3], ah, bh);
    }
  }
#pragma unroll
  for (int m = 0; m < MT; m++) {
#pragma unroll
    for (int u = 0; u < 4; u++) c[m][u] += cla[m][u] + clb[m][u];
    out(16 * m + g, 2 * t, c[m]);
  }
}

/* M = (I + L)^-1 for a strictly lower triangular L [C][CS] (fp32; C = 16, 32 or 64, rows past
 * the chunk zero; every entry of M's C x C written here), by block doubling (KDA.md §3.2's
 * recursion, in fp32):
 *   1. warp b inverts diagonal block b by forward substitution, lane j holding column j in
 *      registers: no barriers, ~120 dependent FMAs per lane; the other warps zero M's blocks
 *      above the diagonal meanwhile;
 *   2. for s = 16, 32: each diagonal pair of s x s blocks [[M11, 0], [L21, M22]] gets its
 *      lower-left block M21 = -M22 (L21 M11) on the tensor cores (3xTF32: fp32-level operands),
 *      a warp an 8-column strip of it (C / 16 strips a level): the strip of T = L21 M11 into
 *      its [s][8] of T (C^2 / 4 floats), then M22 times it, one barrier a level.
 * mark(ph): the caller's phase timer (p10 after step 1, p11 after the first level).
 * It was a blocked substitution (block rows I: T_IJ = sum_m L_Im M_mJ, M_IJ = -M_II T_IJ) whose
 * scalar dot products read two shared operands a multiply-add, six barriers at C = 64; then each
 * level's two products over the whole block (mma_blk4) with a barrier between them, the pairs
 * side by side along N against a block-diagonal operand (half of level 16's k steps on zeros)
 * through index-computing accessors, M zeroed by the caller first. H200, phase counters
 * (2026-12-04s39a, b): the inverse 5.5k -> 3.7k cycles a block at (8,2048,16,128) (level 16
 * 1.8k -> 0.8k, level 32 2.5k -> 2.0k), 5.7k -> 4.6k in the flow's intra blocks at
 * (1,8192,16,128); k_intra_tc 33.8 -> 31.5 us at (8,512,4,64) (ncu), k_fwd_flow 810 -> 792 us
 * at (1,8192,16,128); three rounds each in two runs against the old form (s39b, c): fwd
 * (8,2048,16,128) 0.874-0.875 -> 0.841-0.851 ms, fwd+bwd 2.992-3.001 -> 2.962-2.978;
 * (1,8192,16,128) fwd 0.593-0.598 -> 0.579-0.588; in a graph, (32,512,4,64) fwd 0.124-0.125 ->
 * 0.119, fwd+bwd 0.435-0.437 -> 0.430-0.433; (8,512,4,64) fwd 0.042 -> 0.040-0.041, fwd+bwd
 * 0.132 either way. */
template <int S>
static __device__ __forceinline__ void tril_level(const float *L, float *M, int CS, int C, float *T) {
  constexpr int PER = S / 8;                       /* strips a pair */
  for (int task = threadIdx.x >> 5; task < C / 16; task += BT >> 5) {
    const int b = 2 * S * (task / PER), c0 = 8 * (task % PER);
    float *Tw = T + task * 8 * S;                  /* [S][8]: B reads (k t, column g) conflict-free */
    warp_strip3<S / 16, S>([&](int i, int k) { return L[(b + S + i) * CS + b + k]; },
                           [&](int k, int c) { return M[(b + k) * CS + b + c0 + c]; },
                           [&](int i, int c, const float *x) {
                             *(float2 *)(Tw + i * 8 + c) = make_float2(x[0], x[1]);
                             *(float2 *)(Tw + (i + 8) * 8 + c) = make_float2(x[2], x[3]);
                           });
    __syncwarp();
    warp_strip3<S / 16, S>([&](int i, int k) { return M[(b + S + i) * CS + b + S + k]; },
                           [&](int k, int c) { return Tw[k * 8 + c]; },
                           [&](int i, int c, const float *x) {
                             float *m = M + (b + S + i) * CS + b + c0 + c;
                             *(float2 *)m = make_float2(-x[0], -x[1]);
                             *(float2 *)(m + 8 * CS) = make_float2(-x[2], -x[3]);
                           });
  }
}
template <class FM>
static __device__ void tril_inverse(const float *L, float *M, int CS, int C, float *T, FM mark) {
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nb = C >> 4;
  if (wp < nb && lane < 16) {
    int o = 16 * wp, j = lane;
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
      float acc = 0.f;
#pragma unroll
      for (int m = 0; m < i; m++) acc += L[(o + i) * CS + o + m] * x[m];
      x[i] = i == j ? 1.f : (i > j ? -acc : 0.f);
    }
#pragma unroll
    for (int i = 0; i < 16; i++) M[(o + i) * CS + o + j] = x[i];
  }
  /* the blocks above the diagonal, four columns a store: by the warps step 1 leaves idle, or
   * by every thread once done when the block has none */
  const int z0 = BT > 32 * nb ? (int)threadIdx.x - 32 * nb : (int)threadIdx.x, zn = BT > 32 * nb ? BT - 32 * nb : BT;
  for (int e = z0; z0 >= 0 && e < C * C / 4; e += zn) {
    int i = e / (C / 4), j = 4 * (e % (C / 4));
    if (j >= 16 * (i / 16 + 1)) *(float4 *)(M + i * CS + j) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __syncthreads();
  mark(10);
  if (C > 16) tril_level<16>(L, M, CS, C, T);
  __syncthreads();
  mark(11);
  if (C > 32) tril_level<32>(L, M, CS, C, T);
  __syncthreads();
}
