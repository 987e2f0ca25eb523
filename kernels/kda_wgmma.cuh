/* kda_wgmma.cuh — Hopper's warpgroup MMA (wgmma.mma_async, sm_90a only) for bf16 tiles in
 * shared memory with fp32 accumulators in registers: the tile layout, the operand descriptors,
 * the instructions and their fences. Used by kda_state_wg.cu, kda_mat_wg.cu, kda_rows_wg.cu
 * and kda_final_wg.cu (compiled for sm_90a alone).
 *
 * A warpgroup is 4 consecutive warps (128 threads). One instruction computes D (64 x N) +=
 * A (64 x 16) B (16 x N), both operands read from shared memory by the tensor cores through
 * 64-bit descriptors, asynchronously: issued instructions run while the warps go on, until
 * wgmma.commit_group / wgmma.wait_group. D's fragment: thread t of the warpgroup (warp wq =
 * t / 32, lane l) holds d[4 j + q] = D[16 wq + l / 4 + 8 (q / 2)][8 j + 2 (l % 4) + (q % 2)],
 * j < N / 8 (mma.m16n8's C fragment, one per 8 columns, warp wq on rows 16 wq ..).
 *
 * Layout (the 128-byte swizzle): a tile of R rows by up to 128 columns, its columns the
 * contiguous index, is stored as 64-column "atoms" one after the other (all R rows of columns
 * 0-63, then of 64-127); in an atom row r is 128 bytes at 128 r, its 16-byte chunks permuted
 * (chunk c at c ^ (r % 8)), as the hardware's 128-byte swizzle reads them from a 1024-byte
 * aligned base. For a K-major operand (rows its M or N index, columns k) the descriptor's
 * stride offset is 1024 bytes (eight rows) and its leading offset unused; for an MN-major one
 * (rows k, columns its M or N index: kg in the state update, B(k, n) = kg[k][n], read with the
 * transpose bit) the stride offset is again eight rows, 1024 bytes, the leading one the atom
 * stride 128 R bytes. Why the swizzle: without it (8 x 8 core matrices of 128 contiguous
 * bytes) the first version of kda_state_wg.cu ran 486.6 us against the mma.sync pass's 349.3
 * (ncu, (8,2048,16,128), 2026-12-04s42c), with it 387.8 (s42d, spills aside): our reading is
 * bank conflicts in the tensor cores' operand reads, not measured directly.
 * tests/gpu/test_wgmma.cu checks the swizzled layout's products (bf16 and tf32). */
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>
#include "kda_st16.cuh"

/* element offset of (r, c) in a swizzled bf16 tile of R rows */
template <int R> static __device__ __forceinline__ int wg_off(int r, int c) {
  return (c >> 6) * (R * 64) + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
}
/* the descriptor of an operand starting at p (a tile's row r0 % 8 == 0, column c0 % 16 == 0:
 * &tile[wg_off<R>(r0, c0)]), 128-byte swizzle; lbo, sbo in bytes */
static __device__ __forceinline__ uint64_t wg_desc(const void *p, uint32_t lbo, uint32_t sbo) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
/* before the first wgmma of a sequence, and after registers it accumulates into were written */
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* all but the N most recently committed groups of this warpgroup done (their accumulators
 * readable, their shared operands free) */
template <int N> static __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* shared-memory writes of ordinary stores or cp.async (the generic proxy) made visible to the
 * wgmma operand reads (the async proxy): each writing thread, after its writes have landed and
 * before the barrier that hands the tile over */
static __device__ __forceinline__ void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* a barrier of warpgroups 0 and 1 alone (threads 0..255; hardware barrier 1, __syncthreads' is 0) */
static __device__ __forceinline__ void wg01_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
/* a hand-over across a 512-thread block's four warpgroups on hardware barrier 2: warpgroups 2 and
 * 3 arrive without waiting (their reads of a tile are done), 0 and 1 wait for them (and then
 * write it) */
static __device__ __forceinline__ void wg23_done() { asm volatile("bar.arrive 2, 512;\n" ::: "memory"); }
static __device__ __forceinline__ void wg01_wait_23() { asm volatile("bar.sync 2, 512;\n" ::: "memory"); }
/* D (+)= A B for a 64 x N x 16 step: acc = 0 overwrites D; TB = 1: B is MN-major, TA = 1: A is
 * MN-major (its rows k, its 64 M columns one atom); SA = -1: D (+)= -A B */
template <int TB, int TA = 0, int SA = 1>
static __device__ __forceinline__ void wg_m64n32k16(float (&d)[16], uint64_t da, uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, %21, 1, %20, %19;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "l"(da), "l"(db), "r"(acc), "n"(TB), "n"(TA), "n"(SA));
}
template <int TB, int TA = 0, int SA = 1>
static __device__ __forceinline__ void wg_m64n64k16(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, %37, 1, %36, %35;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "l"(da), "l"(db), "r"(acc), "n"(TB), "n"(TA), "n"(SA));
}
template <int TB>
static __device__ __forceinline__ void wg_m64n16k16(float (&d)[8], uint64_t da, uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, %11;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "l"(da), "l"(db), "r"(acc), "n"(TB));
}
/* a K-major descriptor's step to column k0 (a multiple of 16) of an R-row bf16 tile: within an
 * atom 2 k0 bytes, each atom 128 R bytes; in the descriptor's 16-byte units */
#define WG_KADVR(R, k0) ((uint64_t)((((k0) >> 6) * (128 * (R)) + ((k0) & 63) * 2) >> 4))

/* E(row, col, x0, x1, x2, x3) over a 64 x N warpgroup accumulator (rows row and row + 8,
 * columns col and col + 1, col from n0): kda_rows_wg.cu's and the fused sweep's epilogues */
template <int N, class FE> static __device__ __forceinline__ void rw_frag(const float (&d)[N / 2], int n0, FE E) {
  const int wq = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31, row = 16 * wq + (l >> 2);
#pragma unroll
  for (int j = 0; j < N / 8; j++) E(row, n0 + 8 * j + 2 * (l & 3), d[4 * j], d[4 * j + 1], d[4 * j + 2], d[4 * j + 3]);
}
/* d = A B^T over k in [0, 128): A a 64-row K-major tile's descriptor, B an R-row K-major tile's
 * at its row n0 (N = 32 or 16) */
template <int N, int R>
static __device__ __forceinline__ void rw_issue(float (&d)[N / 2], uint64_t da, uint64_t db) {
#pragma unroll
  for (int k0 = 0; k0 < 128; k0 += 16) {
    if constexpr (N == 32) wg_m64n32k16<0>(d, da + WG_KADVR(64, k0), db + WG_KADVR(R, k0), k0 > 0);
    else wg_m64n16k16<0>(d, da + WG_KADVR(64, k0), db + WG_KADVR(R, k0), k0 > 0);
  }
}

/* ---- tf32 operands (fp32 tiles): kda_mat_wg.cu, kda_final_wg.cu ----
 * The same 128-byte swizzle on fp32 tiles: an atom is 32 columns (128 bytes a row), so a
 * 64-column tile is two atoms of R rows each. tf32 has no transpose bit: both operands of a
 * tf32 wgmma are K-major (rows the M or N index, columns k), and a product that contracts a
 * tile over its row index needs that tile transposed in shared memory. One instruction steps
 * k by 8 (32 bytes, as bf16's k16). The tensor cores read an fp32 word's tf32 bits (the low 13
 * mantissa bits ignored), so tiles are rounded (tf32r) where they are written. */
template <int R> static __device__ __forceinline__ int wf_off(int r, int c) {
  return (c >> 5) * (R * 32) + r * 32 + ((((c >> 2) & 7) ^ (r & 7)) << 2) + (c & 3);
}
/* T[wf_off<R>(r0 + u, c)] = x[u] for u < 4, r0 a multiple of 4: the four stores down column c
 * that the transposing stagings make. There (r0 + u) & 7 = (r0 & 4) ^ u, so the four offsets
 * share one base and one XOR term, and each adds u's row and flips u's bits: the same addresses
 * as wf_off's, with its index arithmetic once per four stores (wf_off's was 6.2% of
 * k_bwd_final_wg's executed instructions, all integer, and the stores' line 3.3%: H100, s52a).
 * H100, one run against main, two rounds (s52b): k_bwd_final_wg 46.2k -> 45.7k cycles a block
 * (S1 + S2 4.3k -> 4.2k, S3 2.9k -> 2.7k, R2a 4.2k -> 4.1k), fwd+bwd (8,2048,16,128)
 * 2.692-2.699 -> 2.684-2.689 ms, the other shapes within the rounds' spread */
template <int R> static __device__ __forceinline__ void wf_put_col4(float *T, int r0, int c, const float (&x)[4]) {
  float *b = T + (c >> 5) * (R * 32) + r0 * 32 + (c & 3);
  const int s = (((c >> 2) & 7) ^ (r0 & 4)) << 2;
#pragma unroll
  for (int u = 0; u < 4; u++) b[u * 32 + (s ^ (u << 2))] = x[u];
}
/* a K-major descriptor's step to column k0 (a multiple of 8) of a 64-row fp32 tile: within an
 * atom 4 k0 bytes, each atom 8 KB; in the descriptor's 16-byte units */
#define WF_KADV(k0) ((uint64_t)((((k0) >> 5) * 8192 + ((k0) & 31) * 4) >> 4))
/* D (+)= A B for a 64 x N x 8 step, tf32 operands, both K-major; acc = 0 overwrites D */
static __device__ __forceinline__ void wg_tf_m64n32k8(float (&d)[16], uint64_t da, uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "l"(da), "l"(db), "r"(acc));
}
static __device__ __forceinline__ void wg_tf_m64n64k8(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "l"(da), "l"(db), "r"(acc));
}
static __device__ __forceinline__ void wg_tf_m64n16k8(float (&d)[8], uint64_t da, uint64_t db, int acc) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "l"(da), "l"(db), "r"(acc));
}
/* a 64-row K-major fp32 tile's descriptor at row n0 (a multiple of 8: 128 bytes a row) */
static __device__ __forceinline__ uint64_t wf_desc(const float *t, int n0) {
  return wg_desc(t, 16, 1024) + (uint64_t)(n0 * 8);
}
/* d (=|+=) A B^T over k in [0, 64), 64 x N (N = 16, 32, 64; A, B descriptors of K-major
 * tiles, B's at its row n0 by wf_desc), issued and committed: the caller waits (wg_wait) */
template <int N>
static __device__ __forceinline__ void wf_issue(float (&d)[N / 2], uint64_t da, uint64_t db, bool acc) {
  static_assert(N == 16 || N == 32 || N == 64, "wf_issue: N is 16, 32 or 64");
  wg_fence();
#pragma unroll
  for (int k0 = 0; k0 < 64; k0 += 8) {
    if constexpr (N == 64) wg_tf_m64n64k8(d, da + WF_KADV(k0), db + WF_KADV(k0), acc || k0 > 0);
    else if constexpr (N == 32) wg_tf_m64n32k8(d, da + WF_KADV(k0), db + WF_KADV(k0), acc || k0 > 0);
    else wg_tf_m64n16k8(d, da + WF_KADV(k0), db + WF_KADV(k0), acc || k0 > 0);
  }
  wg_commit();
}
