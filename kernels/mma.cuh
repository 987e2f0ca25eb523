/* mma.cuh — the warp-level primitives the tensor-core kernels share (attention.cu, kda_tc.cu):
 * asynchronous global -> shared copies (cp.async, sm_80+), shared -> register fragments
 * (ldmatrix) and the bf16 MMA m16n8k16 with fp32 accumulators. Data movement only: what an
 * accumulator sees is the same mma sequence whichever way its operands arrived.
 *
 * Fragment layouts of mma.m16n8k16 (PTX ISA; g = lane/4, t = lane%4): A (16x16, row) a0..a3 =
 * A[g][2t..], A[g+8][2t..], A[g][8+2t..], A[g+8][8+2t..]; B (16x8, col) b0, b1 = B[2t..][g],
 * B[8+2t..][g]; C c0..c3 = C[g][2t..], C[g+8][2t..]. Each pair is two consecutive k (A, B) or
 * n (C) indices, the lower one in the low half.
 *
 * Shared tiles read by ldmatrix need 16-byte aligned rows (ld % 8 == 0 elements). A row pitch
 * of ld = 8 (mod 64) elements, e.g. DH + 8 or 128 + 8, shifts each row by 4 banks, so the
 * eight 16-byte rows one ldmatrix phase reads fall in 32 distinct banks. */
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
/* 16 B global -> shared, async; ok = false reads nothing and writes 16 zero bytes (src-size 0). */
static __device__ __forceinline__ void cp_async16(void *s, const void *g, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(s)),
               "l"(__cvta_generic_to_global(g)), "r"(ok ? 16 : 0)
               : "memory");
}
/* 4 B global -> shared, async (.ca: .cg copies 16 B only); ok = false writes zero. */
static __device__ __forceinline__ void cp_async4(void *s, const void *g, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(s)),
               "l"(__cvta_generic_to_global(g)), "r"(ok ? 4 : 0)
               : "memory");
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* All but this thread's N most recent groups have landed; a __syncthreads must follow before
 * other threads read them. */
template <int N> static __device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* every copy this thread issued has landed (committed or not) */
static __device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

/* Programmatic dependent launch (sm_90). A grid launched with programmatic stream
 * serialization (kda_cuda.cu's FR launch) may start once every block of the grid before it has
 * passed pdl_trigger (or exited); it must pdl_wait before it reads what that grid writes, or
 * writes what that grid reads: the wait returns once that grid has completed and its memory is
 * visible. Both are no-ops in a grid launched the ordinary way, and before sm_90. */
static __device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* Hopper's bulk copies (sm_90: the copy engine, TMA, one-dimensional form): one thread names a
 * contiguous global span (16-byte aligned, a multiple of 16 bytes) and its shared destination,
 * and the engine moves it and counts its bytes on an mbarrier in shared memory. The threads
 * that need the data wait on the barrier's phase; unlike cp.async, no thread issues a copy
 * per 16 bytes, and the copies do not sit in the issuing threads' load queue. Used by the
 * flow kernel's persistent intra blocks (kda_tc.cu k_fwd_flow_ps) to stage a task's raw rows
 * while the task before it runs. */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
static __device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
/* after mbar_init, before a __syncthreads: the initialised barrier visible to the copy engine */
static __device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* shared memory the threads wrote or read (ordered before this by a __syncthreads) may now be
 * overwritten by bulk copies this thread issues */
static __device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* one arrival on b, which also raises the bytes its current phase waits for by tx */
static __device__ __forceinline__ void mbar_expect(uint64_t *b, unsigned tx) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(tx) : "memory");
}
/* bytes (a multiple of 16) from global src to shared dst, both 16-byte aligned, counted on b */
static __device__ __forceinline__ void bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(smem_u32(b))
               : "memory");
}
/* until b's phase of this parity (0, 1, 0, ... for its first, second, third phase) completes:
 * its arrivals made and its bytes landed, and those bytes visible to this thread */
static __device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_u32(b)), "r"(parity)
                 : "memory");
}
#else
/* below sm_90 the same names trap: their only user, k_fwd_flow_ps, runs on 9.0+ (kda_cuda.cu
 * use_persist), but the templates that name them must compile for the sm_80 path */
static __device__ __forceinline__ void mbar_init(uint64_t *, unsigned) { __trap(); }
static __device__ __forceinline__ void mbar_init_fence() { __trap(); }
static __device__ __forceinline__ void fence_proxy_async_smem() { __trap(); }
static __device__ __forceinline__ void mbar_expect(uint64_t *, unsigned) { __trap(); }
static __device__ __forceinline__ void bulk_g2s(void *, const void *, unsigned, uint64_t *) { __trap(); }
static __device__ __forceinline__ void mbar_wait(uint64_t *, unsigned) { __trap(); }
#endif

/* Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i. Register i of lane
 * l = matrix i's row l/4, columns 2(l%4), 2(l%4)+1 (low half first): a pair along a stored row. */
static __device__ __forceinline__ void ldmatrix_x4(uint32_t *r, const __nv_bfloat16 *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
/* Transposed: register i of lane l = matrix i's rows 2(l%4), 2(l%4)+1 at column l/4 (low half
 * first): a pair down a stored column. */
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t *r, const __nv_bfloat16 *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
/* d += A B, one m16n8k16 step (bf16 operands, fp32 accumulators) */
static __device__ __forceinline__ void mma16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* two fp32 -> one register of two bf16 (RN), lo in the low half */
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

/* ---- fragments from shared tiles (row pitch ld elements) ----
 * A fragment at rows m0.., columns k0.. of a tile stored [m][k]: matrices (m0,k0) (m0+8,k0)
 * (m0,k0+8) (m0+8,k0+8) are a0..a3, so lane l addresses row m0 + l%16, column k0 + 8(l/16). */
static __device__ __forceinline__ void ldsm_a(uint32_t *a, const __nv_bfloat16 *S, int ld, int m0, int k0,
                                              int lane) {
  ldmatrix_x4(a, S + (m0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8);
}
/* The same A fragment from a tile stored [k][m] (A transposed in memory): matrix i = lane/8
 * sits at stored rows k0 + 8(i/2).., columns m0 + 8(i%2), read transposed. */
static __device__ __forceinline__ void ldsm_a_km(uint32_t *a, const __nv_bfloat16 *S, int ld, int m0, int k0,
                                                 int lane) {
  int i = lane >> 3;
  ldmatrix_x4_trans(a, S + (k0 + (i >> 1) * 8 + (lane & 7)) * ld + m0 + (i & 1) * 8);
}
/* B fragments of n-tiles n0 and n0+8 at k0.. from a tile stored [n][k] (K in S = Q K^T: B[k][n]
 * = K[n][k], so b0 is a pair along stored row n0+g): matrices (n0,k0) (n0,k0+8) (n0+8,k0)
 * (n0+8,k0+8) are b0, b1 of n0 then b0, b1 of n0+8. */
static __device__ __forceinline__ void ldsm_b_nk(uint32_t *b, const __nv_bfloat16 *S, int ld, int n0, int k0,
                                                 int lane) {
  ldmatrix_x4(b, S + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + ((lane >> 3) & 1) * 8);
}
/* The same from a tile stored [k][n] (V in O = P V: b0 is a pair down stored column n0+g, so
 * .trans): matrices at stored rows k0, k0+8 of columns n0 then n0+8, i.e. lane l addresses row
 * k0 + l%16, column n0 + 8(l/16). */
static __device__ __forceinline__ void ldsm_b_kn(uint32_t *b, const __nv_bfloat16 *S, int ld, int n0, int k0,
                                                 int lane) {
  ldmatrix_x4_trans(b, S + (k0 + (lane & 15)) * ld + n0 + (lane >> 4) * 8);
}

/* ---- tf32 fragments (mma.m16n8k8.tf32) from fp32 tiles, by ldmatrix on 32-bit elements ----
 * An 8x8 b16 matrix is an 8x4 fp32 one, and lane l receives row l/4, fp32 column l%4: exactly
 * the tf32 fragments' element (g, t). A: a0..a3 = A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4];
 * B: b0, b1 = B[t][g], B[t+4][g]. Tiles k-contiguous, rows 16-byte aligned (ld % 4 == 0).
 * The MMA reads the top 19 bits of each element: the tile must hold tf32-rounded values (the
 * hardware would otherwise truncate). */
/* A fragment at rows m0.., k0..k0+7 of a tile stored [m][k] */
static __device__ __forceinline__ void ldsm_tf32_a(uint32_t *a, const float *S, int ld, int m0, int k0, int lane) {
  int i = lane >> 3;
  ldmatrix_x4(a, (const __nv_bfloat16 *)(S + (m0 + (lane & 7) + (i & 1) * 8) * ld + k0 + (i >> 1) * 4));
}
/* B fragments of n-tiles n0 (b0, b1) and n0+8 (b2, b3) at k0..k0+7 of a tile stored [n][k] */
static __device__ __forceinline__ void ldsm_tf32_b(uint32_t *b, const float *S, int ld, int n0, int k0, int lane) {
  int i = lane >> 3;
  ldmatrix_x4(b, (const __nv_bfloat16 *)(S + (n0 + (lane & 7) + (i >> 1) * 8) * ld + k0 + (i & 1) * 4));
}
