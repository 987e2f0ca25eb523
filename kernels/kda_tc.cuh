/* kda_tc.cuh — what the version-2 (tensor-core) KDA kernels of kda_tc.cu (intra-chunk and
 * state passes) and kda_tc_bwd.cu (the chunk-parallel backward) share: the row index macro,
 * the four-output epilogue helper, the flat-chunk test (k_intra_tc's, k_bwd_final_wg's), this
 * version's design notes, and the phase counters of
 * profiling builds (one set per file, read by kda_phase_report). */
#ifndef KDA_TC_CUH
#define KDA_TC_CUH
#include "kda_tile.cuh"
#ifdef KDA_PHASES
/* this file's counters (PH in kda_common.cuh adds to them); kda_phase_take hands them over */
static __device__ unsigned long long kda_phase_cyc[KDA_PH_KERNELS][KDA_PH_PHASES + 1];
/* c += this file's counters, which restart at zero. A file with no image for this device
 * (kda_final_wg.cu is sm_90a only) has no counters to give: its copy fails and adds nothing */
static inline void kda_phase_take(unsigned long long (*c)[KDA_PH_PHASES + 1]) {
  unsigned long long x[KDA_PH_KERNELS][KDA_PH_PHASES + 1];
  if (cudaMemcpyFromSymbol(x, kda_phase_cyc, sizeof x) != cudaSuccess) {
    cudaGetLastError();                             /* not sticky: clear it for the caller */
    return;
  }
  for (int k = 0; k < KDA_PH_KERNELS; k++)
    for (int ph = 0; ph <= KDA_PH_PHASES; ph++) c[k][ph] += x[k][ph];
  memset(x, 0, sizeof x);
  cudaMemcpyToSymbol(kda_phase_cyc, x, sizeof x);
}
#endif

/* Row i of the kernel's chunk as a row of the [T, HV] token-head layout (every kernel below
 * names its chunk's first token t0, the head count HV and its head h). */
#define ROWI(i) (((t0 + (i)) * HV + h))
/* Shape-specialised instantiations: every version-2 kernel (the chunk kernels and the state
 * passes) takes KV. 0 reads K, V and the chunk C from kp at run time; 64 or 128 fixes K = V = KV
 * and C = 64 at compile time (the host's kv_spec picks it), so tile strides fold into the
 * shared-memory addresses' immediates, the e / K, e % K index splits become shifts and masks,
 * and loops of fixed count unroll. Why: ncu of the run-time forms at (8,2048,16,128) counted
 * integer and address instructions over half of k_bwd_final_tc's and k_intra_tc's (HMMA
 * 0.5-1.3%); measured gains at kv_spec in kda_cuda.cu.
 * NB > 0: the block size the host launches that instantiation with (the run-time forms read
 * blockDim): fixed too, so the block-strided loops and the warp-tile loops (BT, blockDim / 32)
 * have known counts; a launch with another size traps rather than run wrong. The chunk kernels
 * fix it (H200, one run against KV alone: fwd+bwd (8,2048,16,128) 5.11 -> 5.10 ms, precise
 * 9.60 -> 9.53, k_bwd_final_tc 83.8k -> 82.5k cycles a block). The state passes: fixed,
 * k_state_bwd_tc's registers rose 64 -> 100 (one block an SM) and fwd+bwd lost 3%, so it keeps
 * NB = 0, as does the K = 128 two-tile-set reverse sweep (128 registers and spills); the forward
 * passes and the K = 64 reverse sweep fix it (loops of known count: ncu counted ~450 warp
 * instructions a step for 16 HMMA in k_state_fwd_tc_db): H200, one run, fwd+bwd (1,8192,16,128)
 * 2.44 -> 2.41 ms, (8,512,4,64) 0.167 -> 0.165 in a graph, the rest within noise */
template <int KV, int NB> static __device__ __forceinline__ void kv_fix(kp &p) {
  if constexpr (KV > 0) {
    p.K = p.V = KV, p.C = 64;
    if constexpr (NB > 0) {
      if (blockDim.x != NB) __trap();
      __builtin_assume(blockDim.x == NB);
    }
  }
}
/* Whether chunk cb (of n rows: full_rows) runs a chunk kernel's body with the row count fixed at FULL_NF<PR, KV> = 64
 * (its loops and row checks fold): a compiled shape's (KV != 0) fast form (!PR), a full chunk,
 * unless KDA_KDA_FULL=0 (p.full). k_intra_tc, k_bwd_mat_tc(_h) and k_bwd_final_tc dispatch on it;
 * the other forms never take it, and FULL_NF = 0 keeps them from instantiating a second body. */
template <bool PR, int KV> constexpr int FULL_NF = KV != 0 && !PR ? 64 : 0;
template <bool PR, int KV> static __device__ __forceinline__ bool full_rows(const kp &p, int n) {
  if constexpr (FULL_NF<PR, KV> == 0) return false;
  else return p.full && n == 64;
}
template <bool PR, int KV> static __device__ __forceinline__ bool full_chunk(const kp &p, const int *ctab, int cb) {
  if constexpr (FULL_NF<PR, KV> == 0) return false;
  else return full_rows<PR, KV>(p, ctab[4 * cb + 2]);
}
/* a kernel template's instantiations for KV = 0, 64, 128 (kv_slot's order), other arguments
 * first (KV_SLOTS1: KV its only one) */
#define KV_SLOTS(kern, ...) {kern<__VA_ARGS__, 0>, kern<__VA_ARGS__, 64>, kern<__VA_ARGS__, 128>}
#define KV_SLOTS1(kern) {kern<0>, kern<64>, kern<128>}
static inline int kv_slot(int kv) { return kv == 128 ? 2 : kv == 64 ? 1 : 0; }

/* The mat kernels' (k_bwd_mat_tc, k_bwd_mat_tc_h) shared pieces. Their fast products take a
 * warp's two column-sharing tiles together (warp_tiles16's NPM = 2: interleaved MMA chains, one
 * B fragment for both; k_bwd_rows_tc at K = 128 46 -> 63 registers, still two blocks of 512 an
 * SM). H200, one run, three rounds (2026-12-01s23b): fwd+bwd (8,2048,16,128) 3.629-3.656 ->
 * 3.575-3.600 ms, (1,8192,16,128) 2.299-2.311 -> 2.288-2.295, the small shapes equal, the
 * precise backward 9.05 -> 9.00. Applied to every product (wip/pair) it lost in k_intra_tc and
 * at (1,8192,16,128) */
constexpr int NPB = 2;
/* dbeta_WY's row partials [C][PS], one a row and 8 columns of the dv product, PS odd */
static __host__ __device__ __forceinline__ int mat_ps(int64_t V) { return (int)(r16(V) / 8 + 1); }
/* a thread's two dv-epilogue terms of rows j and j + 8 (columns slot 8 ..), summed over its tile
 * row's four lanes (a fixed shuffle tree) into part[j][slot], part[j + 8][slot] */
static __device__ __forceinline__ void mat_part4(float *part, int PS, int j, int slot, float s0, float s1) {
  s0 += __shfl_xor_sync(0xffffffffu, s0, 1), s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
  s0 += __shfl_xor_sync(0xffffffffu, s0, 2), s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
  if ((threadIdx.x & 3) == 0) part[j * PS + slot] = s0, part[(j + 8) * PS + slot] = s1;
}
/* dbeta_WY of rows j < n: each row's partials added in order, into db0[j HV] (the chunk's rows
 * of the [T, HV] dbeta scratch); after a barrier that follows every mat_part4 */
static __device__ __forceinline__ void mat_db_rows(const float *part, int PS, int n, float *db0, int64_t HV) {
  for (int j = threadIdx.x; j < n; j += BT) {
    float acc = 0;
    for (int s2 = 0; s2 < PS - 1; s2++) acc += part[j * PS + s2];
    db0[j * HV] = acc;
  }
}

/* dgn[d] = sum_c S0[d,c] dS[d,c] (d < K, c < V) in fp32 from bf16 tiles [.][VB] (zero past V),
 * a warp a row, a lane two adjacent columns at a time, summed by a fixed shuffle tree: the rows
 * kernel's sums into global memory, the final kernel's (FR) into its dGn tile, the same values */
static __device__ __forceinline__ void dgn_rows_b(float *out, int64_t K, int64_t V, const sbf *S0, const sbf *dS,
                                                  int VB) {
  int lane = threadIdx.x & 31;
  for (int d = threadIdx.x >> 5; d < K; d += BT / 32) {
    float acc = 0.f;
    for (int c = 2 * lane; c < V; c += 64) {
      float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)(S0 + d * VB + c));
      float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)(dS + d * VB + c));
      acc = fmaf(a.x, b.x, acc), acc = fmaf(a.y, b.y, acc);
    }
    acc = kc_warp_sum(acc);
    if (!lane) out[d] = acc;
  }
}

/* BT (kda_tile.cuh) is the block's threads: NTC for the chunk kernels and the backward state
 * passes, NT for the forward state pass (the helpers serve both) */

/* The 4 outputs of one mma_blk4 epilogue call: rows row0 + {0, 0, 8, 8}, columns d0 + {0, 1,
 * 0, 1}; ok where inside n rows and K columns; g the row-major index of row rowi(r). */
struct epi4 {
  int r[4], d[4];
  bool ok[4];
  int64_t g[4];
};
template <class FR>
static __device__ __forceinline__ epi4 epi4_at(int row0, int d0, int n, int64_t K, FR rowi) {
  epi4 e;
#pragma unroll
  for (int u = 0; u < 4; u++) {
    e.r[u] = row0 + (u >> 1) * 8, e.d[u] = d0 + (u & 1);
    e.ok[u] = e.r[u] < n && e.d[u] < K;
    e.g[u] = rowi(e.r[u]) * K + e.d[u];
  }
  return e;
}

/* The largest decay a 16-row block may span (max over key dims of G_first - G_last) for its
 * diagonal pairs to be factored around the block's first row like the off-diagonal ones: the
 * factors then lie in [e^-64, e^64] (e^-64 ~ 1.6e-28), normal floats whose tf32 halves (the
 * precise kernels' 3xTF32 low parts too) stay normal. Steeper blocks use exact per-pair
 * exponents. k_intra_tc only: in k_bwd_final_tc the same move cost more than it saved (its
 * diagonal phase 21.0k -> 11.3k cycles a block, but the factored row and column passes, whose
 * epilogues read-modify-write the gradients in global memory, 36.0k -> 61.5k with the extra
 * pass each: 96.4k -> 119.7k in all; H200, (8,2048,16,128)). */
constexpr float DIAG_SPAN = 64.f;
/* A flat chunk: the chunk's whole decay span (max over key dims of G_first - G_last) at most
 * CHUNK_SPAN. Its pairs factor around the span's middle Gm = (G_first + G_last) / 2, each factor
 * e^{G - Gm}, e^{Gm - G} within [e^-64, e^64] as above, and k_intra_tc forms Aqk and L as
 * whole-chunk products, diagonal blocks included (see there). k_bwd_final_tc keeps its per-block
 * products (k_bwd_final_wg, kda_final_wg.cu, forms a flat chunk's on tf32 warpgroup MMAs): its
 * mma.sync flat form (the row terms one product [dA ; dL] X, the column terms one product
 * [dA^T | dL^T] [q ; b k] e^{G - Gm}, no per-pair diagonal blocks; 2e7622a on wip/flat) lost,
 * 57.4k -> 63.9k cycles a block: the pair loop it removed was ~4.6k of its diagonal phase's
 * 13.7k, the whole-chunk products (K = 64 for every row block) 13.1k and 11.2k against the
 * per-block 9.0k and 6.9k; H200, (8,2048,16,128), 2026-12-02s25a. */
constexpr float CHUNK_SPAN = 2 * DIAG_SPAN;
/* e^{G_r - Gm} (up) and e^{Gm - G_r} (dn) for four columns from d of a flat chunk's row r (G
 * [C][GS], rows 0 .. n - 1 the chunk's) */
template <class IX>   /* at(r, d): the tile's index of row r, column d (k_bwd_final_wg's is swizzled) */
static __device__ __forceinline__ void flat_exps_at(const float *G, IX at, int n, int r, int d, float4 &up,
                                                    float4 &dn) {
  float4 g = *(const float4 *)(G + at(r, d)), g0 = *(const float4 *)(G + at(0, d)),
         gl = *(const float4 *)(G + at(n - 1, d));
  float m[4] = {0.5f * (g0.x + gl.x), 0.5f * (g0.y + gl.y), 0.5f * (g0.z + gl.z), 0.5f * (g0.w + gl.w)};
  up = make_float4(kexp(g.x - m[0]), kexp(g.y - m[1]), kexp(g.z - m[2]), kexp(g.w - m[3]));
  dn = make_float4(kexp(m[0] - g.x), kexp(m[1] - g.y), kexp(m[2] - g.z), kexp(m[3] - g.w));
}
static __device__ __forceinline__ void flat_exps(const float *G, int GS, int n, int r, int d, float4 &up,
                                                 float4 &dn) {
  flat_exps_at(G, [GS](int i, int c) { return i * GS + c; }, n, r, d, up, dn);
}
/* whether the chunk is flat (a barrier: every thread of the block calls it); at: as flat_exps_at's */
template <class IX> static __device__ __forceinline__ bool chunk_flat_at(const float *G, IX at, int n, int K) {
  bool steep = false;
  for (int d = threadIdx.x; d < K; d += blockDim.x) steep |= G[at(0, d)] - G[at(n - 1, d)] > CHUNK_SPAN;
  return !__syncthreads_or(steep);
}
static __device__ __forceinline__ bool chunk_flat(const float *G, int GS, int n, int K) {
  return chunk_flat_at(G, [GS](int r, int d) { return r * GS + d; }, n, K);
}

/* ==== version 2: tensor cores (mma.sync) ====================================================
 * Same scratch layout as version 1 (fp32 rows in ws), except that k_intra_tc writes W, s qg,
 * kg, Aqk as bf16 into the W, qg, kg, Aqk buffers (ws.Wb, qgb, kgb, Ab: the state passes are
 * their only version-2 readers and used them as bf16 MMA operands anyway), so each v2 kernel
 * replaces its v1 twin one for one; KDA_KDA_SIMPLE=1 (or a shape whose tiles do not fit in
 * shared memory) selects version 1 for the whole call. Staging is asynchronous (cp.async) or
 * batched, see "staging helpers" below. What changes:
 *   - every GEMM-shaped step is a block of warp MMAs (mma_blk below): bf16 m16n8k16 with fp32
 *     accumulation for the big products (W S, qg S + Aqk Vn, kg^T Vn, the backward's
 *     dO S0^T, Vn dS^T, dVn S0^T, dO Vn^T, Aqk^T dO + kg dS, qg^T dO - W^T dVn) — the operand
 *     rounding fla uses (KDA.md §3.3 item 3);
 *   - tf32 m16n8k8 where fla keeps fp32 operands: the factored off-diagonal blocks of Aqk, L
 *     and of the intra backward, and the dL = -M^T (dM M^T) chain (KDA.md §4.3 "must not be
 *     rounded to bf16"); also W = M Kb, U = M bV (k_intra_tc) and dM, M^T dVn, M^T dW
 *     (k_bwd_mat_tc): see the comments there (dbeta cancellation: docs/kda_passes.md,
 *     "precision fixes");
 *   - the 16-row sub-chunk trick (KDA.md §3.3 item 2): an off-diagonal 16x16 block (I > J) is
 *     (x_i e^{G_i - G_r}) (y_j e^{G_r - G_j})^T with r the first row of block I (row terms) or
 *     the last row of block J (column terms), so every exponent is <= 0 for any decay; the
 *     diagonal blocks join that product in k_intra_tc when their decay span allows (DIAG_SPAN
 *     in kda_intra.cuh) and keep the exact per-pair e^{G_i - G_j} otherwise, and always in
 *     k_bwd_final_tc (scalar, 16x16/2 pairs each); k_intra_tc forms a flat chunk (span <=
 *     CHUNK_SPAN, kda_intra.cuh) as one whole-chunk product factored around the span's middle;
 *   - fp32 stays where the spec keeps it: G (cumsum), the state S and dS (rounded to bf16
 *     only as an MMA operand), M's forward substitution, all accumulators;
 *   - dA_log / ddt_bias: per-chunk partials + k_gate_reduce (fixed order; no float atomics),
 *     dbeta by warp-per-row fixed-order sums: the backward is bit-reproducible.
 * Predicted before the first run: fwd+bwd (8,2048,16,128) from 109 ms (version 1) to
 * ~5-10 ms. Measured on the H200 (benches/history.tsv): 26.35 ms as first written, 19.28 ms
 * after the staging rewrite (024ea8f), 11.54 ms after the blocked inverse, all-cp.async
 * staging, 512-thread chunk kernels and the register-resident diagonal blocks of the intra
 * backward (c79bf6b); the §8 target (1.9 ms) needs ldmatrix operand fetch and less recompute
 * (docs/kda.md "Missing / next").
 *
 * ---- precise backward (the _p twins: k_intra_tc_p, k_state_bwd_tc_p, k_bwd_rows_tc_p,
 * k_bwd_mat_tc_p, k_bwd_final_tc_p; the host picks them when dA_log / ddt_bias are asked for
 * with a gate that has parameters, see use_precise in kda_cuda.cu) ----
 * dA_log (one scalar per head) and ddt_bias are sums over tokens (and key dims) of mixed-sign
 * per-element gate gradients dg, so their relative error is dg's times a cancellation ratio
 * that depends on the data. The products above leave ~3e-3 relative error in dg (bf16 operands
 * ~1.6e-3 each, tf32 ~2e-4); with H = 1 draws of the lower-bound gate the ratio reached ~20-60
 * and dA_log missed its 3e-3 tolerance by up to 20x (version 1, fp32: 5e-7). Every product
 * feeds dg: the recompute (Aqk, L, W, U), the state pass (S, Vn, dS, dVn), dQ/dKi/dW, dA, the
 * dM -> dL chain, the intra off-diagonal blocks; a numpy model of this pipeline (matching the
 * H200's 6.6e-2 and 4.5e-3 on the two failing draws) showed that moving only the bf16 products
 * to tf32, or all but one group to fp32, still fails the tail (up to 1e-2 over 60 draws). So
 * the twins run all of them as P_3TF32 (split tf32, fp32-level: ~2e-7 on dg, dA_log <= 5e-6
 * over 60 draws in the model) from fp32 tiles: W, s qg, kg, Aqk in fp32 (written by
 * k_intra_tc_p), S0, dS, Vn, dVn staged in fp32. The forward and the pre-gated backward keep
 * the kernels above. */

#endif
