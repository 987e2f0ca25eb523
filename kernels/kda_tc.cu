/* kda_tc.cu — version 2 of the CUDA KDA chunked kernels: tensor-core MMAs (mma.sync) for every
 * GEMM-shaped step. Launched by kernels/kda_cuda.cu (the host side, the shared pipeline and
 * version 1); the scratch layout and helpers are in kernels/kda_common.cuh, the block-wide MMA
 * products and staging helpers in kernels/kda_tile.cuh. ~1,270 lines for one idea: the six
 * version-2 kernels, their precise backward twins instantiated from the same templates (so a
 * fix lands in both), the cumsum and triangular-inverse helpers they share, and the phase
 * timers' report (profiling builds). */
#include "kda_tile.cuh"
#ifdef KDA_PHASES
__device__ unsigned long long kda_phase_cyc[KDA_PH_KERNELS][KDA_PH_PHASES + 1];
#endif

/* The largest decay a 16-row block may span (max over key dims of G_first - G_last) for its
 * diagonal pairs to be factored around the block's first row like the off-diagonal ones: the
 * factors then lie in [e^-64, e^64] (e^-64 ~ 1.6e-28), normal floats whose tf32 halves (the
 * precise kernels' 3xTF32 low parts too) stay normal. Steeper blocks use exact per-pair
 * exponents. k_intra_tc only: in k_bwd_final_tc the same move cost more than it saved (its
 * diagonal phase 21.0k -> 11.3k cycles a block, but the factored row and column passes, whose
 * epilogues read-modify-write the gradients in global memory, 36.0k -> 61.5k with the extra
 * pass each: 96.4k -> 119.7k in all; H200, (8,2048,16,128)). */
constexpr float DIAG_SPAN = 64.f;

/* Row i of the kernel's chunk as a row of the [T, HV] token-head layout (every kernel below
 * names its chunk's first token t0, the head count HV and its head h). */
#define ROWI(i) (((t0 + (i)) * HV + h))
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
 *     (k_bwd_mat_tc): see the comments there (dbeta cancellation, docs/kda.md);
 *   - the 16-row sub-chunk trick (KDA.md §3.3 item 2): an off-diagonal 16x16 block (I > J) is
 *     (x_i e^{G_i - G_r}) (y_j e^{G_r - G_j})^T with r the first row of block I (row terms) or
 *     the last row of block J (column terms), so every exponent is <= 0 for any decay; the
 *     diagonal blocks keep the exact per-pair e^{G_i - G_j} (scalar, 16x16/2 pairs each);
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

/* ---- v2 intra-chunk: G, Aqk, L (factored tf32 MMAs + exact diagonal blocks), M, W, U ------ */
/* smem (floats): q/X/V region, k, G [C][KS]; A, L, M [C][CS]; b [C] */
size_t smem_intra_tc(int64_t C, int64_t K, int64_t V) {
  int64_t KS = r16(K) + 4, VS = r16(V) + 4, CS = C + 4;
  int64_t reg = (2 * C + 32) * KS > C * VS ? (2 * C + 32) * KS : C * VS;
  return (size_t)(reg + 2 * C * KS + 3 * C * CS + C) * 4;
}
/* the raw v tile (bf16 [C][r16(V)+8]) after the rest, when it fits (vt = 1, V % 8 == 0) */
size_t smem_intra_vtile(int64_t C, int64_t V) { return (size_t)C * (r16(V) + 8) * 2; }

/* G[r][d] <- sum_{r' <= r, r' < n} G[r'][d] for r < C (pad rows repeat the last value, so that
 * every factor exponent stays <= 0), handing out(r, d, G) the rows r < n, columns d < K.
 * Segmented when the block has a thread per (segment, column) to spare: each thread scans
 * its segment of rows, then adds the total of the segments above it, formed in segment order
 * as T_s = T_(s-1) + last_(s-1): every step adds a value <= 0, so G stays non-increasing down
 * the rows exactly (rounding is monotone), which the factored exponents rely on. It was one
 * thread per column over all C rows (a quarter of the threads busy, C dependent steps). */
template <class FO>
static __device__ void chunk_cumsum(float *G, int GS, int C, int K16, int n, int K, FO out) {
  int nseg = BT / K16;
  while (nseg > 1 && C % nseg) nseg--;
  if (nseg < 2) {
    for (int d = threadIdx.x; d < K16; d += BT) {
      float acc = 0;
      for (int r = 0; r < C; r++) {
        if (r < n) acc += G[r * GS + d];
        G[r * GS + d] = acc;
        if (r < n && d < K) out(r, d, acc);
      }
    }
    __syncthreads();
    return;
  }
  int L = C / nseg, sg = threadIdx.x / K16, d = threadIdx.x % K16, r0 = sg * L;
  bool mine = sg < nseg;
  if (mine) {
    float acc = 0;
    for (int r = r0; r < r0 + L; r++) {
      if (r < n) acc += G[r * GS + d];
      G[r * GS + d] = acc;
    }
  }
  __syncthreads();
  float T = 0;
  if (mine)
    for (int s2 = 0; s2 < sg; s2++) T += G[((s2 + 1) * L - 1) * GS + d];
  __syncthreads();
  if (mine)
    for (int r = r0; r < r0 + L; r++) {
      float x = T + G[r * GS + d];
      G[r * GS + d] = x;
      if (r < n && d < K) out(r, d, x);
    }
  __syncthreads();
}

/* M = (I + L)^-1 for a strictly lower triangular L [C][CS] (fp32; C a multiple of 16, rows
 * past the chunk zero), blocked by 16 (KDA.md §3.2's block recursion, in fp32):
 *   1. warp b inverts diagonal block b by forward substitution, lane j holding column j in
 *      registers: no barriers, ~120 dependent FMAs per lane;
 *   2. block rows I = 1, 2, ...: T_IJ = sum_{m=J}^{I-1} L_Im M_mJ, then M_IJ = -M_II T_IJ for
 *      every J < I at once (two barriers per block row; T [16][C] scratch).
 * It replaced a row-by-row substitution with a barrier per row (64 at C = 64) in which one
 * thread's dot product ran the whole row's length. Same math, different summation order. */
static __device__ void tril_inverse(const float *L, float *M, int CS, int C, float *T) {
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
  for (int I = 1; I < nb; I++) {
    __syncthreads();
    for (int e = threadIdx.x; e < I * 256; e += BT) {   /* T_IJ */
      int J = e >> 8, r = (e >> 4) & 15, c = e & 15;
      float acc = 0.f;
      for (int m = 16 * J; m < 16 * I; m++) acc += L[(16 * I + r) * CS + m] * M[m * CS + 16 * J + c];
      T[r * C + 16 * J + c] = acc;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < I * 256; e += BT) {   /* M_IJ = -M_II T_IJ */
      int J = e >> 8, r = (e >> 4) & 15, c = e & 15;
      float acc = 0.f;
      for (int m = 0; m <= r; m++) acc += M[(16 * I + r) * CS + 16 * I + m] * T[m * C + 16 * J + c];
      M[(16 * I + r) * CS + 16 * J + c] = -acc;
    }
  }
  __syncthreads();
}

/* PR (the precise backward's recompute): the factored blocks, W and U in P_3TF32, and W, s qg,
 * kg, Aqk written in fp32 (rows of K16 with zero pad columns; Aqk rows of C) into the same
 * buffers, for the precise state pass; otherwise tf32 and bf16 tiles as described above. */
template <bool PR>
static __device__ __forceinline__ void intra_tc(kp p, const void *v, ws w, int vt) {
  constexpr int PT = PR ? P_3TF32 : P_TF32;
  extern __shared__ __align__(16) float sm[];
  const int *ct = w.ctab + 4 * blockIdx.x;
  int n = ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = blockIdx.y, K = p.K, V = p.V, HV = p.HV;
  int C = p.C, K16 = r16(K), V16 = r16(V), KS = K16 + 4, VS = V16 + 4, CS = C + 4;
  int64_t regn = (int64_t)(2 * C + 32) * KS > (int64_t)C * VS ? (int64_t)(2 * C + 32) * KS : (int64_t)C * VS;
  float *qs = sm, *X = qs + C * KS, *Y = X + C * KS, *Vb = sm;   /* Vb aliases q, X, Y later */
  float *ks = sm + regn, *Gs = ks + C * KS, *As = Gs + C * KS, *Ls = As + C * CS, *Ms = Ls + C * CS,
        *bs = Ms + C * CS;
  /* vt: the raw v tile, copied with q, k, G (its loads used to wait, 8 per thread at a time, in
   * a phase of their own after the substitution: ~30% of the kernel's time at K = V = 128) */
  int VB = V16 + 8;
  sbf *vr = (sbf *)(bs + C);
  int tid = threadIdx.x;
  PH_INIT(0);
  {                                                /* q, k, G (and v): asynchronous copies, zero-padded */
    bool al = K % 4 == 0;
    cp_tile_f32(qs, KS, C, K16, n, (int)K, al, [&](int r) { return w.qn + ROWI(r) * K; });
    cp_tile_f32(ks, KS, C, K16, n, (int)K, al, [&](int r) { return w.kn + ROWI(r) * K; });
    cp_tile_f32(Gs, KS, C, K16, n, (int)K, al, [&](int r) { return w.G + ROWI(r) * K; });
    if (vt)
      for (int e = tid; e < C * (V16 / 8); e += BT) {
        int r = e / (V16 / 8), c = (e % (V16 / 8)) * 8;
        bool ok = r < n && c < V;
        cp_async16(vr + r * VB + c, (const sbf *)v + (ok ? ROWI(r) * V + c : 0), ok);
      }
  }
  for (int e = tid; e < C * CS; e += BT) As[e] = 0.f, Ls[e] = 0.f, Ms[e] = 0.f;
  for (int r = tid; r < C; r += BT) bs[r] = r < n ? w.b[ROWI(r)] : 0.f;
  cp_async_wait_all();
  __syncthreads();
  PH(0);
  chunk_cumsum(Gs, KS, C, K16, n, (int)K, [&](int r, int d, float x) { w.G[ROWI(r) * K + d] = x; });
  PH(1);
  /* Rows of block I (rows r = 16 I .. r + 15) against columns j <= their own, factored around
   * row r: e^{G_i - G_j} = e^{G_i - G_r} e^{G_r - G_j}, so each entry is one tf32 MMA dot
   * product of Y_i = [q_i; k_i] e^{G_i - G_r} with X_j = k_j e^{G_r - G_j}. Off the diagonal
   * (j < r) both factors are <= 1. On the diagonal block (r <= j <= i) X_j grows to e^{span},
   * span = max_d (G_r - G_last) over the block's rows, and Y_i shrinks to e^{-span}: while
   * span <= DIAG_SPAN both stay normal floats and the diagonal joins the MMA; a block with a
   * steeper decay takes the exact per-pair exponents below instead. H200, (8,2048,16,128): the
   * per-pair phase was 18.2k of k_intra_tc's 79.9k cycles a block. */
  unsigned exact = 0;                              /* blocks whose diagonal needs the exact form */
  for (int I = 0; I < C / 16 && 16 * I < n; I++) {
    int r = 16 * I, last = min(r + 15, n - 1);
    bool steep = false;
    for (int d = tid; d < K; d += BT) steep |= Gs[r * KS + d] - Gs[last * KS + d] > DIAG_SPAN;
    if (__syncthreads_or(steep)) exact |= 1u << I;   /* also the barrier before X, Y are rebuilt */
    int nx = exact >> I & 1 ? r : r + 16;          /* X rows: j < r, and the block's own rows */
    if (!nx) continue;
    /* X, Y: MMA operands only (tf32, mma_tf); built four columns at a time (float4) */
    auto rnd = [&](float4 v) { return PR ? v : make_float4(tf32r(v.x), tf32r(v.y), tf32r(v.z), tf32r(v.w)); };
    const int K4 = K16 / 4;
    for (int e = tid; e < nx * K4; e += BT) {      /* X[j] = k_j e^{G_r - G_j} */
      int j = e / K4, d = (e % K4) * 4;
      float4 kj = *(const float4 *)(ks + j * KS + d), gr = *(const float4 *)(Gs + r * KS + d),
             gj = *(const float4 *)(Gs + j * KS + d);
      *(float4 *)(X + j * KS + d) = rnd(make_float4(kj.x * __expf(gr.x - gj.x), kj.y * __expf(gr.y - gj.y),
                                                    kj.z * __expf(gr.z - gj.z), kj.w * __expf(gr.w - gj.w)));
    }
    for (int e = tid; e < 16 * K4; e += BT) {      /* Y = [q_i; k_i] e^{G_i - G_r}, i in block I */
      int ii = e / K4, d = (e % K4) * 4, i = r + ii;
      float4 gi = *(const float4 *)(Gs + i * KS + d), gr = *(const float4 *)(Gs + r * KS + d),
             qi = *(const float4 *)(qs + i * KS + d), ki = *(const float4 *)(ks + i * KS + d);
      float4 sc = make_float4(__expf(gi.x - gr.x), __expf(gi.y - gr.y), __expf(gi.z - gr.z), __expf(gi.w - gr.w));
      *(float4 *)(Y + ii * KS + d) = rnd(make_float4(qi.x * sc.x, qi.y * sc.y, qi.z * sc.z, qi.w * sc.w));
      *(float4 *)(Y + (16 + ii) * KS + d) = rnd(make_float4(ki.x * sc.x, ki.y * sc.y, ki.z * sc.z, ki.w * sc.w));
    }
    __syncthreads();
    PH(2);
    auto entry = [&](int ii, int j, float c) {     /* Aqk for j <= i, L for j < i */
      int i = r + (ii & 15);
      if (i >= n || j > i) return;
      if (ii < 16) As[i * CS + j] = p.scale * c;
      else if (j < i) Ls[i * CS + j] = bs[i] * c;
    };
    if constexpr (PR)
      mma_blk<PT>(32, nx, K16, [&](int ii, int d) { return Y[ii * KS + d]; },
                  [&](int d, int j) { return X[j * KS + d]; }, entry);
    else
      mma_tf1(32, nx, K16, tft{Y, KS}, tft{X, KS}, entry);
    PH(3);
  }
  /* the steep blocks' diagonals: exact per-pair exponent (any decay) */
  for (int e = tid; exact && e < (C / 16) * 256; e += BT) {
    int I = e >> 8, i = 16 * I + ((e >> 4) & 15), j = 16 * I + (e & 15);
    if (!(exact >> I & 1) || j > i || i >= n) continue;
    /* four columns per shared load (float4: rows are 16-byte aligned), summed in column order
     * as one at a time; the scalar loop takes the K % 4 tail */
    float aq = 0, ak = 0;
    int d = 0;
    for (; d + 4 <= K; d += 4) {
      float4 gi = *(const float4 *)(Gs + i * KS + d), gj = *(const float4 *)(Gs + j * KS + d);
      float4 kj = *(const float4 *)(ks + j * KS + d), qi = *(const float4 *)(qs + i * KS + d);
      float4 ki = *(const float4 *)(ks + i * KS + d);
      float x0 = __expf(gi.x - gj.x) * kj.x, x1 = __expf(gi.y - gj.y) * kj.y;
      float x2 = __expf(gi.z - gj.z) * kj.z, x3 = __expf(gi.w - gj.w) * kj.w;
      aq += qi.x * x0, ak += ki.x * x0;
      aq += qi.y * x1, ak += ki.y * x1;
      aq += qi.z * x2, ak += ki.z * x2;
      aq += qi.w * x3, ak += ki.w * x3;
    }
    for (; d < K; d++) {
      float x = __expf(Gs[i * KS + d] - Gs[j * KS + d]) * ks[j * KS + d];
      aq += qs[i * KS + d] * x, ak += ks[i * KS + d] * x;
    }
    As[i * CS + j] = p.scale * aq;
    if (j < i) Ls[i * CS + j] = bs[i] * ak;
  }
  PH(4);
  __syncthreads();
  tril_inverse(Ls, Ms, CS, C, X);                  /* M = (I + L)^-1 (fp32); X is free now */
  PH(5);
  /* Aqk (bf16, for the state passes) and M (fp32, for k_bwd_mat_tc). The state passes used to
   * stage fp32 W, qg, kg, Aqk and round them to bf16 on every chunk step; they are written
   * here in bf16 instead (same rounding of the same fp32 values: bit-identical operands), half
   * the bytes and ready for 16-byte cp.async (rows of K16 with zero pad columns for W, qg, kg).
   * PR: the same tiles in fp32 (rows of K16, and of C for Aqk) */
  /* four columns at a time (C and K16 are multiples of 16: rows stay 16-byte aligned) */
  auto st4b = [](sbf *dst, float4 x) {             /* four bf16 (RN), one 8-byte store */
    __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
    uint2 u = make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
    *(uint2 *)dst = u;
  };
  for (int e = tid; e < n * (C / 4); e += BT) {
    int i = e / (C / 4), j = (e % (C / 4)) * 4;
    float4 a = *(const float4 *)(As + i * CS + j), m = *(const float4 *)(Ms + i * CS + j);
    if (PR) *(float4 *)(w.Aqk + ROWI(i) * C + j) = a;
    else st4b(w.Ab + ROWI(i) * C + j, a);          /* zero above the diagonal and past n */
    *(float4 *)(w.M + ROWI(i) * C + j) = m;
    if (!PR) *(float4 *)(Ms + i * CS + j) = make_float4(tf32r(m.x), tf32r(m.y), tf32r(m.z), tf32r(m.w));
  }                                                /* Ms: from here an MMA operand only */
  for (int e = tid; e < n * (K16 / 4); e += BT) {  /* kg, s qg (bf16 or PR fp32, pad columns zero) */
    int r = e / (K16 / 4), d = (e % (K16 / 4)) * 4;
    float4 G = *(const float4 *)(Gs + r * KS + d), Gn = *(const float4 *)(Gs + (n - 1) * KS + d);
    float4 kr = *(const float4 *)(ks + r * KS + d), qr = *(const float4 *)(qs + r * KS + d);
    float g4[4] = {G.x, G.y, G.z, G.w}, n4[4] = {Gn.x, Gn.y, Gn.z, Gn.w};
    float k4[4] = {kr.x, kr.y, kr.z, kr.w}, q4[4] = {qr.x, qr.y, qr.z, qr.w}, kg[4], qg[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      float a = k4[u] * __expf(n4[u] - g4[u]), b = q4[u] * __expf(g4[u]);
      kg[u] = d + u < K ? a : 0.f, qg[u] = d + u < K ? p.scale * b : 0.f;
    }
    float4 kg4 = make_float4(kg[0], kg[1], kg[2], kg[3]), qg4 = make_float4(qg[0], qg[1], qg[2], qg[3]);
    if (PR) *(float4 *)(w.kg + ROWI(r) * K16 + d) = kg4, *(float4 *)(w.qg + ROWI(r) * K16 + d) = qg4;
    else st4b(w.kgb + ROWI(r) * K16 + d, kg4), st4b(w.qgb + ROWI(r) * K16 + d, qg4);
  }
  __syncthreads();                                 /* q, X, Y dead: Vb may overwrite them */
  PH(6);
  for (int e = tid; e < C * K16; e += BT) {        /* ks <- Kb = b k e^G (the backward keeps it) */
    int r = e / K16, d = e % K16;
    float kb = ks[r * KS + d] * (bs[r] * __expf(Gs[r * KS + d]));
    ks[r * KS + d] = PR ? kb : tf32r(kb);
    if (w.Kb && r < n && d < K) w.Kb[ROWI(r) * K + d] = kb;
  }
  if (!vt)
    batched<8>(C * V16, [&](int e) {               /* Vb = b V (8 loads per thread in flight) */
      int r = e / V16, c = e % V16;
      return r < n && c < V ? bs[r] * ldb(v, ROWI(r) * V + c) : 0.f;
    }, [&](int e, float x) { Vb[(e / V16) * VS + e % V16] = x; });
  __syncthreads();
  PH(7);
  /* W = M Kb, U = M bV in tf32: all three operands are fp32 in smem already, and bf16 here
   * (8-bit M, e^G-scaled Kb) put ~1.6e-3 relative error into every U, W row that the state
   * pass, o and every gradient inherit (version 2's o/dq/dk/dv at 2x version 1's error) */
  auto wout = [&](int i, int d, float c) {
    if (i >= n) return;
    if (PR) w.W[ROWI(i) * K16 + d] = d < K ? c : 0.f;
    else w.Wb[ROWI(i) * K16 + d] = __float2bfloat16(d < K ? c : 0.f);
  };
  auto bv = [&](int j, int c) { return vt ? bs[j] * f(vr[j * VB + c]) : Vb[j * VS + c]; };
  auto uout = [&](int i, int c, float x) { if (i < n && c < V) w.U[ROWI(i) * V + c] = x; };
  if constexpr (PR)
    mma_blk<PT>(C, K16, C, [&](int i, int j) { return Ms[i * CS + j]; },
                [&](int j, int d) { return ks[j * KS + d]; }, wout);
  else   /* Ms, ks hold tf32-rounded values (rounded where written) */
    mma_tf1(C, K16, C, tft{Ms, CS}, [&](int j, int d) { return ks[j * KS + d]; }, wout);
  PH(8);
  if constexpr (PR) mma_blk<PT>(C, V16, C, [&](int i, int j) { return Ms[i * CS + j]; }, bv, uout);
  else mma_tf1(C, V16, C, tft{Ms, CS}, [&](int j, int c) { return tf32r(bv(j, c)); }, uout);
  PH(9);
}
__global__ void __launch_bounds__(NTC) k_intra_tc(kp p, const void *v, ws w, int vt) { intra_tc<false>(p, v, w, vt); }
__global__ void __launch_bounds__(NTC) k_intra_tc_p(kp p, const void *v, ws w, int vt) { intra_tc<true>(p, v, w, vt); }

/* ---- v2 state passes: per (sequence, head, 32 V columns), staged tiles + MMAs ------------- */
/* smem: W, s qg, kg [C][KB], Aqk [C][CB] of type T (bf16; fp32 in the precise backward, whose
 * k_intra_tc_p wrote them in fp32); fp32 S [K16][SB], Vn/U [C][SB]; bf16 dO [C][DB]; fp32
 * dVn [C][SB], en [K16]. Rows of T tiles are padded by 16 bytes; every region starts on a
 * 16-byte boundary (cp.async targets). */
size_t smem_state_tc(int64_t C, int64_t K, int prec) {
  int64_t es = prec ? 4 : 2, KB = r16(K) + 16 / es, CB = C + 16 / es, SB = BVT + 4, DB = BVT + 8;
  if (!prec)   /* bf16 tiles + bf16 shadows Sb [K16][DB], Vb [C][DB]; no fp32 dVn (see st_carve) */
    return (size_t)((3 * C * KB + C * CB) * 2 + (r16(K) + 2 * C) * DB * 2) + (size_t)(r16(K) * SB + C * SB + r16(K)) * 4;
  return (size_t)((3 * C * KB + C * CB) * es + C * DB * 2) + (size_t)(r16(K) * SB + 2 * C * SB + r16(K)) * 4;
}

static __device__ __forceinline__ float f(float x) { return x; }
template <class T> struct st_tiles {
  T *W, *qg, *kg, *A;
  sbf *dO;
  float *S, *Vn, *dV, *en;
  sbf *Sb, *Vb;   /* bf16 layout only: shadows of S and of Vn (forward sweeps) / -dVn (reverse) */
  int KB, CB, SB, DB, K16;
};
/* The bf16 layout (the fast passes, ldmatrix operands) keeps bf16 shadows of the fp32 S and
 * Vn written by the epilogues that form them (the same RN rounding the MMA operands had), and
 * no fp32 dVn: [W qg kg][C][KB], A [C][CB], Sb [K16][DB], Vb [C][DB], dO [C][DB] (bf16),
 * S [K16][SB], Vn [C][SB], en [K16] (fp32). The fp32 layout (the precise backward) as before. */
template <class T> static __device__ st_tiles<T> st_carve(const kp &p, float *sm) {
  st_tiles<T> t;
  t.K16 = r16(p.K), t.KB = t.K16 + 16 / (int)sizeof(T), t.CB = p.C + 16 / (int)sizeof(T), t.SB = BVT + 4,
  t.DB = BVT + 8;
  T *b = (T *)sm;
  t.W = b, t.qg = b + p.C * t.KB, t.kg = t.qg + p.C * t.KB, t.A = t.kg + p.C * t.KB;
  if constexpr (std::is_same<T, sbf>::value) {
    t.Sb = t.A + p.C * t.CB, t.Vb = t.Sb + t.K16 * t.DB, t.dO = t.Vb + p.C * t.DB;
    t.S = (float *)(t.dO + p.C * t.DB);
    t.Vn = t.S + t.K16 * t.SB;
    t.dV = nullptr;
    t.en = t.Vn + p.C * t.SB;
  } else {
    t.Sb = t.Vb = nullptr;
    t.S = (float *)(t.A + p.C * t.CB);
    t.Vn = t.S + t.K16 * t.SB;
    t.dO = (sbf *)(t.Vn + p.C * t.SB);
    t.dV = (float *)(t.dO + p.C * t.DB);
    t.en = t.dV + p.C * t.SB;
  }
  return t;
}
/* the global copies the state passes stage: bf16 (k_intra_tc) or fp32 (k_intra_tc_p) */
template <class T> struct st_src;
template <> struct st_src<sbf> {
  static __device__ __forceinline__ const sbf *W(const ws &w) { return w.Wb; }
  static __device__ __forceinline__ const sbf *qg(const ws &w) { return w.qgb; }
  static __device__ __forceinline__ const sbf *kg(const ws &w) { return w.kgb; }
  static __device__ __forceinline__ const sbf *A(const ws &w) { return w.Ab; }
};
template <> struct st_src<float> {
  static __device__ __forceinline__ const float *W(const ws &w) { return w.W; }
  static __device__ __forceinline__ const float *qg(const ws &w) { return w.qg; }
  static __device__ __forceinline__ const float *kg(const ws &w) { return w.kg; }
  static __device__ __forceinline__ const float *A(const ws &w) { return w.Aqk; }
};
enum { SG_W = 1, SG_QG = 2, SG_A = 4, SG_KG = 8, SG_U = 16, SG_DO = 64 };
/* Stage the parts asked for of chunk rows [t0, t0+m): asynchronous copies (zero past m, past
 * K, past V) of the tiles k_intra_tc wrote (W, s qg, kg, Aqk: bf16, the same rounding as the
 * fp32 -> bf16 conversion this function used to do; fp32 for the precise backward), U (fp32)
 * into t.Vn (st_vn_tc subtracts W S in place), dO (bf16) into t.dO. The caller commits the
 * copies as a cp.async group and waits for it (then __syncthreads) before reading. Each sweep
 * stages only what it reads, each part a product or more ahead of its use (the sweeps' own
 * comments say which); e^{G_last} goes through registers (st_glast_load / st_en_store). */
template <class T>
static __device__ void st_stage(const kp &p, const ws &w, const st_tiles<T> &t, int64_t t0, int m,
                                int64_t h, int64_t c0, const void *dout, int parts) {
  int64_t HV = p.HV, V = p.V;
  constexpr int LE = sizeof(T) == 2 ? 3 : 2;       /* log2 of the elements per 16-byte copy */
  int C = p.C, K16 = t.K16, kc = K16 >> LE, cc = C >> LE;
  if (parts & (SG_W | SG_QG | SG_KG))
    for (int e = threadIdx.x; e < C * kc; e += BT) {
      int i = e / kc, d = (e % kc) << LE;
      bool ok = i < m;
      int64_t gi = ((t0 + (ok ? i : 0)) * HV + h) * K16 + d;
      if (parts & SG_W) cp_async16(t.W + i * t.KB + d, st_src<T>::W(w) + gi, ok);
      if (parts & SG_QG) cp_async16(t.qg + i * t.KB + d, st_src<T>::qg(w) + gi, ok);
      if (parts & SG_KG) cp_async16(t.kg + i * t.KB + d, st_src<T>::kg(w) + gi, ok);
    }
  if (parts & SG_A)
    for (int e = threadIdx.x; e < C * cc; e += BT) {
      int i = e / cc, j = (e % cc) << LE;
      bool ok = i < m;
      cp_async16(t.A + i * t.CB + j, st_src<T>::A(w) + ((t0 + (ok ? i : 0)) * HV + h) * C + j, ok);
    }
  if (parts & SG_U)
    cp_tile_f32(t.Vn, t.SB, C, BVT, m, (int)(V - c0 < BVT ? V - c0 : BVT), V % 4 == 0,
                [&](int i) { return w.U + ((t0 + i) * HV + h) * V + c0; });
  if (parts & SG_DO) {
    const bf16 *g = (const bf16 *)dout;
    if (V % 8 == 0 && al16(dout)) {
      for (int e = threadIdx.x; e < C * (BVT / 8); e += BT) {
        int i = e / (BVT / 8), c = (e % (BVT / 8)) << 3;
        bool ok = i < m && c0 + c < V;
        cp_async16(t.dO + i * t.DB + c, g + ((t0 + (ok ? i : 0)) * HV + h) * V + c0 + (ok ? c : 0), ok);
      }
    } else
      for (int e = threadIdx.x; e < C * BVT; e += BT) {
        int i = e / BVT, c = e % BVT;
        t.dO[i * t.DB + c] = i < m && c0 + c < V ? g[((t0 + i) * HV + h) * V + c0 + c] : __float2bfloat16(0.f);
      }
  }
}
template <class T>
static __device__ void st_ld(const kp &p, const float *src, int64_t base, int64_t c0, const st_tiles<T> &t) {
  for (int e = threadIdx.x; e < t.K16 * BVT; e += BT) {
    int d = e / BVT, c = e % BVT;
    float x = src && d < p.K && c0 + c < p.V ? src[base + d * p.V + c0 + c] : 0.f;
    t.S[d * t.SB + c] = x;
    if (t.Sb) t.Sb[d * t.DB + c] = __float2bfloat16(x);
  }
}
/* dst <- S (rows d < K, columns c0 + c < V); 16-byte stores when V % 4 == 0 (every row start
 * is then 16-byte aligned, and a group of 4 columns is all in or all out) */
template <class T>
static __device__ void st_st(const kp &p, float *dst, int64_t base, int64_t c0, const st_tiles<T> &t) {
  if (p.V % 4 == 0) {
    for (int e = threadIdx.x; e < p.K * (BVT / 4); e += BT) {
      int d = e / (BVT / 4), c = (e % (BVT / 4)) * 4;
      if (c0 + c < p.V) *(float4 *)(dst + base + d * p.V + c0 + c) = *(const float4 *)(t.S + d * t.SB + c);
    }
    return;
  }
  for (int e = threadIdx.x; e < p.K * BVT; e += BT) {
    int d = e / BVT, c = e % BVT;
    if (c0 + c < p.V) dst[base + d * p.V + c0 + c] = t.S[d * t.SB + c];
  }
}
/* S <- e^{G_last} S + x for one epilogue output, and the bf16 shadow */
template <class T>
static __device__ __forceinline__ void st_s_upd(const st_tiles<T> &t, int r, int c, float x) {
  float v = t.en[r] * t.S[r * t.SB + c] + x;
  t.S[r * t.SB + c] = v;
  t.Sb[r * t.DB + c] = __float2bfloat16(v);
}
/* Vn = U - W S  (U staged into t.Vn, zero past m and V); vn != NULL also stores it. The bf16
 * layout keeps only the shadow of Vn (its one use after this is as a bf16 operand). */
template <int P, class T>
static __device__ void st_vn_tc(const kp &p, const st_tiles<T> &t, int64_t t0, int m, int64_t h,
                                int64_t c0, float *vn) {
  if constexpr (std::is_same<T, sbf>::value) {
    mma_ldm(p.C, BVT, bt{t.W, t.KB, 1}, bt{t.Sb, t.DB, 0}, t.K16, bt{}, bt{}, 0,
            each4([&](int r, int c, float x) {
              float v = t.Vn[r * t.SB + c] - x;
              t.Vb[r * t.DB + c] = __float2bfloat16(v);
              if (vn && r < m && c0 + c < p.V) vn[((t0 + r) * p.HV + h) * p.V + c0 + c] = v;
            }));
    return;
  }
  mma_blk<P>(p.C, BVT, t.K16, [&](int i, int d) { return f(t.W[i * t.KB + d]); },
             [&](int d, int c) { return t.S[d * t.SB + c]; },
             [&](int i, int c, float x) {
               float u = t.Vn[i * t.SB + c] - x;
               t.Vn[i * t.SB + c] = u;
               if (vn && i < m && c0 + c < p.V) vn[((t0 + i) * p.HV + h) * p.V + c0 + c] = u;
             });
}
/* S <- e^{G_last} S + kg^T Vn */
template <int P, class T>
static __device__ void st_upd_tc(const kp &p, const st_tiles<T> &t) {
  if constexpr (std::is_same<T, sbf>::value) {
    mma_ldm(t.K16, BVT, bt{t.kg, t.KB, 0}, bt{t.Vb, t.DB, 0}, p.C, bt{}, bt{}, 0,
            each4([&](int d, int c, float x) { st_s_upd(t, d, c, x); }));
    return;
  }
  mma_blk<P>(t.K16, BVT, p.C, [&](int d, int i) { return f(t.kg[i * t.KB + d]); },
             [&](int i, int c) { return t.Vn[i * t.SB + c]; },
             [&](int d, int c, float x) { t.S[d * t.SB + c] = t.en[d] * t.S[d * t.SB + c] + x; });
}

/* A state pass's block: (sequence n, value head h, V columns c0 .. c0 + BVT) from a 1-D grid of
 * n_seq * HV * ceil(V / BVT) blocks (state_grid), the V tiles of one (n, h) adjacent, so the
 * blocks that read the same chunk tiles (W, qg, kg, Aqk: every V tile of a head reads them all)
 * are resident together and can share them through L2. It was a (n, h, V tile) grid, the V
 * tile slowest (at (8,2048,16,128) the first of two waves held V tiles 0-1 of every head, the
 * second 2-3). H200, one run: fwd+bwd 5.95 -> 5.92 ms from the grid alone, small as it is. */
static __device__ __forceinline__ void st_block(const kp &p, int64_t *n, int64_t *h, int64_t *c0) {
  int64_t nz = (p.V + BVT - 1) / BVT, b = blockIdx.x, nh = b / nz;
  *c0 = (b % nz) * BVT, *h = nh % p.HV, *n = nh / p.HV;
}

/* e^{G_last} of a chunk for the update, loaded into registers early and stored into t.en late
 * (after the products that do not read it), so its global latency hides behind them: columns
 * tid and tid + BT (K16 <= 2 BT: K <= 512 in the forward pass's 256 threads, 1024 in the
 * others'); a plain loop covers the rest */
struct st_glast {
  float v[2];
  const float *row;
};
static __device__ __forceinline__ st_glast st_glast_load(const kp &p, const ws &w, int64_t t0, int m, int64_t h) {
  st_glast g;
  g.row = w.G + ((t0 + m - 1) * p.HV + h) * p.K;
#pragma unroll
  for (int u = 0; u < 2; u++) g.v[u] = threadIdx.x + u * BT < p.K ? g.row[threadIdx.x + u * BT] : 0.f;
  return g;
}
template <class T>
static __device__ __forceinline__ void st_en_store(const kp &p, const st_tiles<T> &t, const st_glast &g) {
#pragma unroll
  for (int u = 0; u < 2; u++) {
    int d = threadIdx.x + u * BT;
    if (d < t.K16) t.en[d] = d < p.K ? __expf(g.v[u]) : 0.f;
  }
  for (int d = threadIdx.x + 2 * BT; d < t.K16; d += BT) t.en[d] = d < p.K ? __expf(g.row[d]) : 0.f;
}

/* w.h, w.vn non-NULL (a forward that keeps its internals, kda_kda_args.keep): also stores the
 * state entering each chunk and Vn, the same values (same kernels' arithmetic) that the
 * backward state pass's forward sweep would recompute, which it then skips.
 *
 * Each chunk's loads are in flight while earlier work runs, in three cp.async groups a step:
 * kg (read by the update, last) is issued at the step's top; U (into the fp32 Vn tile, dead
 * once Vn's bf16 shadow is formed) right after Vn; W, s qg, Aqk after o; e^{G_last} rides in a
 * register from the top to the end of o. It staged kg, U and e^{G_last} at the top and waited
 * for them there: H200, (8,2048,16,128), that wait was 164k of the pass's 472k cycles a block. */
__global__ void __launch_bounds__(NT, 2) k_state_fwd_tc(kp p, ws w, const float *h0, void *o, float *ht) {
  extern __shared__ __align__(16) float sm[];
  int64_t n, h, c0, V = p.V, HV = p.HV, K = p.K;
  st_block(p, &n, &h, &c0);
  st_tiles<sbf> t = st_carve<sbf>(p, sm);
  int64_t sbase = (n * HV + h) * K * V;
  int cf = w.sfirst[n], cl = w.sfirst[n + 1];
  PH_INIT(1);
  st_ld(p, h0, sbase, c0, t);
  if (cf < cl) st_stage(p, w, t, w.ctab[4 * cf + 1], w.ctab[4 * cf + 2], h, c0, nullptr, SG_W | SG_QG | SG_A | SG_U);
  cp_async_commit();
  for (int ci = cf; ci < cl; ci++) {
    int64_t t0 = w.ctab[4 * ci + 1];
    int m = w.ctab[4 * ci + 2];
    __syncthreads();                               /* previous update done with kg, Vb, S, en */
    if (w.h) st_st(p, w.h, (int64_t)ci * HV * K * V + h * K * V, c0, t);   /* kept: see above */
    st_stage(p, w, t, t0, m, h, c0, nullptr, SG_KG);
    cp_async_commit();
    st_glast gl = st_glast_load(p, w, t0, m, h);  /* stored into t.en after o */
    cp_async_wait_group<1>();                      /* U, W, s qg, Aqk of this chunk (kg may fly) */
    __syncthreads();
    PH(0);
    st_vn_tc<P_BF16>(p, t, t0, m, h, c0, w.vn);
    __syncthreads();                               /* the fp32 Vn tile (U) is dead */
    PH(1);
    if (ci + 1 < cl) st_stage(p, w, t, w.ctab[4 * ci + 5], w.ctab[4 * ci + 6], h, c0, nullptr, SG_U);
    cp_async_commit();
    /* o = [s qg | Aqk] [S ; Vn] in one K-concatenated MMA */
    mma_ldm(p.C, BVT, bt{t.qg, t.KB, 1}, bt{t.Sb, t.DB, 0}, t.K16, bt{t.A, t.CB, 1}, bt{t.Vb, t.DB, 0}, p.C,
            each4([&](int r, int c, float x) { if (r < m && c0 + c < V) stb(o, ((t0 + r) * HV + h) * V + c0 + c, x); }));
    st_en_store(p, t, gl);
    cp_async_wait_group<1>();                      /* kg (the next U may fly) */
    __syncthreads();                               /* W, qg, Aqk dead: prefetch the next chunk's */
    PH(2);
    if (ci + 1 < cl)
      st_stage(p, w, t, w.ctab[4 * ci + 5], w.ctab[4 * ci + 6], h, c0, nullptr, SG_W | SG_QG | SG_A);
    cp_async_commit();
    st_upd_tc<P_BF16>(p, t);
    PH(3);
  }
  __syncthreads();
  if (ht) st_st(p, ht, sbase, c0, t);
}

/* The forward sweep of the backward state pass: from h0, per chunk, store the state entering
 * it (w.h) and Vn (w.vn), then S <- e^{G_last} S + kg^T Vn. o != NULL (the precise forward
 * of a kept call, PR only) also forms o = [s qg | Aqk] [S ; Vn] from the fp32 tiles, in the
 * backward's 3xTF32 (fp32-level o). Ends with S = the final state (the caller's __syncthreads
 * first). */
template <bool PR, class T>
static __device__ __forceinline__ void st_fwd_sweep(const kp &p, const ws &w, const st_tiles<T> &t,
                                                    const float *h0, int64_t sbase, int64_t c0, int64_t h,
                                                    int cf, int cl, void *o, int phk) {
  constexpr int P = PR ? P_3TF32 : P_BF16;
  int64_t K = p.K, V = p.V, HV = p.HV;
  /* cp.async groups as k_state_fwd_tc's: W (and U in the bf16 layout, where the fp32 Vn tile
   * is dead once Vn's shadow is formed) for the next chunk right after Vn; kg (and s qg, Aqk
   * for o) at the step's top, waited for after Vn; the fp32 layout's U (Vn is formed in place
   * and lives to the update) at the top in a group of its own, waited for before Vn */
  constexpr int UN = std::is_same<T, sbf>::value ? SG_U : 0;
  PH_IN(phk);
  st_ld(p, h0, sbase, c0, t);
  if (cf < cl) st_stage(p, w, t, w.ctab[4 * cf + 1], w.ctab[4 * cf + 2], h, c0, nullptr, SG_W | UN);
  cp_async_commit();
  for (int ci = cf; ci < cl; ci++) {
    int64_t t0 = w.ctab[4 * ci + 1];
    int m = w.ctab[4 * ci + 2];
    __syncthreads();                               /* previous update done with kg, Vn, S, en */
    st_st(p, w.h, (int64_t)ci * HV * K * V + h * K * V, c0, t);
    if (!UN) st_stage(p, w, t, t0, m, h, c0, nullptr, SG_U);
    cp_async_commit();
    st_stage(p, w, t, t0, m, h, c0, nullptr, SG_KG | (o ? SG_QG | SG_A : 0));
    cp_async_commit();
    st_glast gl = st_glast_load(p, w, t0, m, h);
    cp_async_wait_group<1>();                      /* W, U (kg, qg, Aqk may fly) */
    __syncthreads();
    PH(0);
    st_vn_tc<P>(p, t, t0, m, h, c0, w.vn);
    __syncthreads();                               /* W (and the bf16 layout's U) dead: prefetch */
    PH(1);
    if (ci + 1 < cl) st_stage(p, w, t, w.ctab[4 * ci + 5], w.ctab[4 * ci + 6], h, c0, nullptr, SG_W | UN);
    cp_async_commit();
    st_en_store(p, t, gl);
    cp_async_wait_group<1>();                      /* kg, qg, Aqk (the next W, U may fly) */
    __syncthreads();
    if constexpr (PR) {
      if (o) {                                     /* o = [s qg | Aqk] [S ; Vn] before S moves on */
        mma_blk<P>(p.C, BVT, t.K16 + p.C,
                   [&](int i, int k) { return k < t.K16 ? f(t.qg[i * t.KB + k]) : f(t.A[i * t.CB + k - t.K16]); },
                   [&](int k, int c) { return k < t.K16 ? t.S[k * t.SB + c] : t.Vn[(k - t.K16) * t.SB + c]; },
                   [&](int i, int c, float x) { if (i < m && c0 + c < V) stb(o, ((t0 + i) * HV + h) * V + c0 + c, x); });
        __syncthreads();
      }
    }
    st_upd_tc<P>(p, t);
    PH(2);
  }
}

/* PR: the precise backward (fp32 tiles from k_intra_tc_p, every product in P_3TF32): S, Vn,
 * dS, dVn, which every gradient and dg are built from, to fp32-level accuracy */
template <bool PR>
static __device__ __forceinline__ void state_bwd_tc(kp p, ws w, const float *h0, const void *dout,
                                                    const float *dht, float *dh0, int kept) {
  typedef typename std::conditional<PR, float, sbf>::type T;
  constexpr int P = PR ? P_3TF32 : P_BF16;
  extern __shared__ __align__(16) float sm[];
  int64_t n, h, c0, K = p.K, V = p.V, HV = p.HV;
  st_block(p, &n, &h, &c0);
  st_tiles<T> t = st_carve<T>(p, sm);
  int64_t sbase = (n * HV + h) * K * V;
  int cf = w.sfirst[n], cl = w.sfirst[n + 1];
  PH_INIT(2);
  if (!kept) st_fwd_sweep<PR>(p, w, t, h0, sbase, c0, h, cf, cl, nullptr, 2);   /* kept: the forward's */
  __syncthreads();
  PH_RESET();
  /* cp.async groups: dO at the step's top, waited for before dVn; s qg, W (read by the dS
   * update only) at the top too, waited for after dVn; Aqk, kg of the previous chunk once dVn
   * is formed; e^{G_last} through registers (as the forward sweeps) */
  st_ld(p, dht, sbase, c0, t);                     /* t.S now holds dS (§4.2) */
  if (cf < cl)
    st_stage(p, w, t, w.ctab[4 * (cl - 1) + 1], w.ctab[4 * (cl - 1) + 2], h, c0, nullptr, SG_A | SG_KG);
  cp_async_commit();
  for (int ci = cl - 1; ci >= cf; ci--) {
    int64_t t0 = w.ctab[4 * ci + 1];
    int m = w.ctab[4 * ci + 2];
    __syncthreads();                               /* previous dS update done with qg, W, dO, dVn, en */
    st_st(p, w.dh, (int64_t)ci * HV * K * V + h * K * V, c0, t);
    st_stage(p, w, t, t0, m, h, c0, dout, SG_DO);
    cp_async_commit();
    st_stage(p, w, t, t0, m, h, c0, nullptr, SG_QG | SG_W);
    cp_async_commit();
    st_glast gl = st_glast_load(p, w, t0, m, h);
    cp_async_wait_group<1>();                      /* Aqk, kg, dO (s qg, W may fly) */
    __syncthreads();
    PH(3);
    /* dVn = [Aqk^T | kg] [dO ; dS]; the bf16 layout keeps -dVn in the shadow Vb (its one use:
     * the dS update's -W^T dVn, as W^T (-dVn), the same products) */
    if constexpr (!PR)
      mma_ldm(p.C, BVT, bt{t.A, t.CB, 0}, bt{t.dO, t.DB, 0}, p.C, bt{t.kg, t.KB, 1}, bt{t.Sb, t.DB, 0}, t.K16,
              each4([&](int r, int c, float x) {
                t.Vb[r * t.DB + c] = __float2bfloat16(-x);
                if (r < m && c0 + c < V) w.dvn[((t0 + r) * HV + h) * V + c0 + c] = x;
              }));
    else   /* B = dO (bf16 data, exact) for k < C */
      mma_blk4_3x<P>(p.C, BVT, p.C + t.K16,
                     [&](int j, int k) { return k < p.C ? f(t.A[k * t.CB + j]) : f(t.kg[j * t.KB + k - p.C]); },
                     [&](int k, int c) { return k < p.C ? f(t.dO[k * t.DB + c]) : t.S[(k - p.C) * t.SB + c]; },
                     each4([&](int j, int c, float x) {
                       t.dV[j * t.SB + c] = x;
                       if (j < m && c0 + c < V) w.dvn[((t0 + j) * HV + h) * V + c0 + c] = x;
                     }), p.C);
    st_en_store(p, t, gl);
    cp_async_wait_group<0>();                      /* s qg, W */
    __syncthreads();                               /* Aqk, kg dead: prefetch the previous chunk's */
    PH(4);
    if (ci > cf)
      st_stage(p, w, t, w.ctab[4 * ci - 3], w.ctab[4 * ci - 2], h, c0, nullptr, SG_A | SG_KG);
    cp_async_commit();
    /* dS <- e^{G_last} dS + [s qg^T | -W^T] [dO ; dVn] */
    if constexpr (!PR)
      mma_ldm(t.K16, BVT, bt{t.qg, t.KB, 0}, bt{t.dO, t.DB, 0}, p.C, bt{t.W, t.KB, 0}, bt{t.Vb, t.DB, 0}, p.C,
              each4([&](int d, int c, float x) { st_s_upd(t, d, c, x); }));
    else   /* B = dO (exact) for k < C */
      mma_blk4_3x<P>(t.K16, BVT, 2 * p.C,
                     [&](int d, int k) { return k < p.C ? f(t.qg[k * t.KB + d]) : -f(t.W[(k - p.C) * t.KB + d]); },
                     [&](int k, int c) { return k < p.C ? f(t.dO[k * t.DB + c]) : t.dV[(k - p.C) * t.SB + c]; },
                     each4([&](int d, int c, float x) { t.S[d * t.SB + c] = t.en[d] * t.S[d * t.SB + c] + x; }), p.C);
    PH(5);
  }
  __syncthreads();
  if (dh0) st_st(p, dh0, sbase, c0, t);
}
__global__ void __launch_bounds__(NTC) k_state_bwd_tc(kp p, ws w, const float *h0, const void *dout,
                                                     const float *dht, float *dh0, int kept) {
  state_bwd_tc<false>(p, w, h0, dout, dht, dh0, kept);
}
__global__ void __launch_bounds__(NTC) k_state_bwd_tc_p(kp p, ws w, const float *h0, const void *dout,
                                                       const float *dht, float *dh0, int kept) {
  state_bwd_tc<true>(p, w, h0, dout, dht, dh0, kept);
}
/* The precise forward of a kept call (kda_kda_args.keep with a parameterised gate, whose
 * backward is the precise one): k_intra_tc_p's fp32 tiles, the backward's forward sweep with
 * o, then ht. The backward reuses w.h, w.vn and the tiles instead of recomputing them. */
__global__ void __launch_bounds__(NTC) k_state_fwd_tc_p(kp p, ws w, const float *h0, void *o, float *ht) {
  extern __shared__ __align__(16) float sm[];
  int64_t n, h, c0;
  st_block(p, &n, &h, &c0);
  st_tiles<float> t = st_carve<float>(p, sm);
  int64_t sbase = (n * p.HV + h) * p.K * p.V;
  PH_INIT(1);
  st_fwd_sweep<true>(p, w, t, h0, sbase, c0, h, w.sfirst[n], w.sfirst[n + 1], o, 1);
  __syncthreads();
  if (ht) st_st(p, ht, sbase, c0, t);
}

/* ---- v2 backward, chunk-parallel ----------------------------------------------------------- */
/* dQ = s (dO S0^T) e^G, dKi = (Vn dSe^T) e^{Gn-G}, dW = -dVn S0^T; dgn = rowsum_V(S0 . dSe).
 * Staging is all cp.async, in the inputs' own types: fp32 R1 [K16][VS] holds S0, R2 [C][VS]
 * dVn then Vn, fp32 G [C][K16+4], bf16 dO [C][VB]; dS goes to its own tile R3 [K16][VS] with
 * the first copies when it fits (sep, smem_rows_tc_sep: 215 KB at K = V = 128), so that dgn
 * is summed from shared memory while Vn streams in; otherwise into R1 after the S0 products
 * and dgn reads S0, dS from global (rows_dgn). The fast variant rounds S0, dS, Vn, dVn to bf16
 * as MMA operands (the same RN rounding its staging used to do with batched converting loads);
 * the precise one (k_bwd_rows_tc_p) runs the products in P_3TF32 (dO, a bf16 input, is exact
 * in tf32: P_3TF32A). */
size_t smem_rows_tc(int64_t C, int64_t K, int64_t V) {   /* both variants, dS sharing R1 */
  return (size_t)((r16(K) + C) * (r16(V) + 4) + C * (r16(K) + 4)) * 4 + (size_t)C * (r16(V) + 8) * 2;
}
size_t smem_rows_tc_sep(int64_t C, int64_t K, int64_t V) {   /* with the separate dS tile R3 */
  return smem_rows_tc(C, K, V) + (size_t)r16(K) * (r16(V) + 4) * 4;
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
template <bool PR>
static __device__ __forceinline__ void bwd_rows_tc(kp p, const void *dout, ws w, int sep) {
  constexpr int PA = PR ? P_3TF32A : P_BF16, PX = PR ? P_3TF32 : P_BF16;
  extern __shared__ __align__(16) float sm[];
  const int cb = blockIdx.x, *ct = w.ctab + 4 * cb;
  int n = ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = blockIdx.y, K = p.K, V = p.V, HV = p.HV;
  int C = p.C, K16 = r16(K), V16 = r16(V), VS = V16 + 4, VB = V16 + 8, GS = K16 + 4;
  float *R1 = sm, *R2 = R1 + K16 * VS, *Gs = R2 + C * VS;
  sbf *dO = (sbf *)(Gs + C * GS);
  float *R3 = sep ? (float *)(dO + C * VB) : R1;
  const float *gS0 = w.h + ((int64_t)cb * HV + h) * K * V;
  const float *gdS = w.dh + ((int64_t)cb * HV + h) * K * V;
  bool al = V % 4 == 0;
  PH_INIT(3);
  cp_tile_f32(Gs, GS, C, K16, n, (int)K, K % 4 == 0, [&](int i) { return w.G + ROWI(i) * K; });
  cp_tile_f32(R1, VS, K16, V16, (int)K, (int)V, al, [&](int d) { return gS0 + (int64_t)d * V; });
  cp_tile_f32(R2, VS, C, V16, n, (int)V, al, [&](int i) { return w.dvn + ROWI(i) * V; });
  cp_tile_bf16(dO, VB, C, V16, n, V, dout, t0, HV, h);
  if (sep) cp_tile_f32(R3, VS, K16, V16, (int)K, (int)V, al, [&](int d) { return gdS + (int64_t)d * V; });
  PH(0);
  if (!sep) rows_dgn(p, w, cb, h, gS0, gdS);
  cp_async_wait_all();
  __syncthreads();
  PH(1);
  auto dq_out = [&](int i, int d, float x) {
    if (i < n && d < K) w.dQ[ROWI(i) * K + d] = p.scale * x * __expf(Gs[i * GS + d]);
  };
  auto dw_out = [&](int i, int d, float x) { if (i < n && d < K) w.dW[ROWI(i) * K + d] = -x; };
  auto dki_out = [&](int i, int d, float x) {
    if (i < n && d < K) w.dKi[ROWI(i) * K + d] = x * __expf(Gs[(n - 1) * GS + d] - Gs[i * GS + d]);
  };
  /* the fast variant's products are all bf16: the fp32 tiles become bf16 in place (the same RN
   * rounding the operand loads did) and feed ldmatrix (mma_ldm); bf16 views of pitch 2 VS */
  auto b16 = [&](float *t) { return bt{(const sbf *)t, 2 * VS, 1}; };
  if constexpr (!PR) {
    if (sep) rows_dgn_smem(p, w, cb, h, R1, R3, VS);   /* from the fp32 tiles, before they turn */
    rows_to_bf16(R1, K16, VS, V16), rows_to_bf16(R2, C, VS, V16);
    if (sep) rows_to_bf16(R3, K16, VS, V16);
    __syncthreads();
    /* dQ = s dO S0^T e^G, dW = -dVn S0^T */
    mma_ldm(C, K16, bt{dO, VB, 1}, b16(R1), V16, bt{}, bt{}, 0, each4(dq_out));
    PH(2);
    mma_ldm(C, K16, b16(R2), b16(R1), V16, bt{}, bt{}, 0, each4(dw_out));
    __syncthreads();                               /* dVn (and without sep S0) read by every warp */
    if (!sep) cp_tile_f32(R3, VS, K16, V16, (int)K, (int)V, al, [&](int d) { return gdS + (int64_t)d * V; });
    cp_tile_f32(R2, VS, C, V16, n, (int)V, al, [&](int i) { return w.vn + ROWI(i) * V; });
    cp_async_wait_all();
    __syncthreads();
    rows_to_bf16(R2, C, VS, V16);
    if (!sep) rows_to_bf16(R3, K16, VS, V16);
    __syncthreads();
    PH(3);
    mma_ldm(C, K16, b16(R2), b16(R3), V16, bt{}, bt{}, 0, each4(dki_out));   /* dKi = Vn dS^T e^{Gn-G} */
  } else {
    mma_blk<PA>(C, K16, V16, [&](int i, int c) { return f(dO[i * VB + c]); }, [&](int c, int d) { return R1[d * VS + c]; },
                dq_out);
    PH(2);
    mma_blk<PX>(C, K16, V16, [&](int i, int c) { return R2[i * VS + c]; }, [&](int c, int d) { return R1[d * VS + c]; },
                dw_out);
    __syncthreads();                               /* dVn (and without sep S0) read by every warp */
    if (!sep) cp_tile_f32(R3, VS, K16, V16, (int)K, (int)V, al, [&](int d) { return gdS + (int64_t)d * V; });
    cp_tile_f32(R2, VS, C, V16, n, (int)V, al, [&](int i) { return w.vn + ROWI(i) * V; });
    if (sep) rows_dgn_smem(p, w, cb, h, R1, R3, VS);   /* while Vn streams in */
    cp_async_wait_all();
    __syncthreads();
    PH(3);
    mma_blk<PX>(C, K16, V16, [&](int i, int c) { return R2[i * VS + c]; }, [&](int c, int d) { return R3[d * VS + c]; },
                dki_out);
  }
  PH(4);
}
__global__ void __launch_bounds__(NTC) k_bwd_rows_tc(kp p, const void *dout, ws w, int sep) {
  bwd_rows_tc<false>(p, dout, w, sep);
}
__global__ void __launch_bounds__(NTC) k_bwd_rows_tc_p(kp p, const void *dout, ws w, int sep) {
  bwd_rows_tc<true>(p, dout, w, sep);
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
 *      [C][CS] (the fast variant's; 201 KB in all at C = 64, K = V = 128).
 * The precise backward (k_bwd_mat_tc_p): every product in P_3TF32, dA in P_3TF32A (dO exact). */
size_t smem_mat_tc(int64_t C, int64_t K, int64_t V) {   /* one layout for both variants */
  int64_t u = 2 * C * (C + 4) > C * (r16(V) + 4) ? 2 * C * (C + 4) : C * (r16(V) + 4);
  return (size_t)(2 * C * (r16(V) + 8)) * 2 +
         (size_t)(2 * C * (C + 4) + u + C * (r16(V) + 4) + 2 * C * (r16(K) + 4) + C) * 4;
}
template <bool PR>
static __device__ __forceinline__ void bwd_mat_tc(kp p, const void *v, const void *dout, void *dv, ws w) {
  constexpr int PT = PR ? P_3TF32 : P_TF32;
  extern __shared__ __align__(16) float sm[];
  const int *ct = w.ctab + 4 * blockIdx.x;
  int n = ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = blockIdx.y, K = p.K, V = p.V, HV = p.HV;
  int C = p.C, K16 = r16(K), V16 = r16(V), VB = V16 + 8, CS = C + 4, VS = V16 + 4, KS = K16 + 4;
  int U = C * VS > 2 * C * CS ? C * VS : 2 * C * CS;   /* the Vn / dM, X region */
  float *Ms = sm, *dM = Ms + C * CS, *X = dM + C * CS, *dVs = dM + U, *dWs = dVs + C * VS,
        *Kb = dWs + C * KS, *bs = Kb + C * KS, *VnF = dM;   /* VnF: dead before dM */
  sbf *dO = (sbf *)(bs + C), *Vr = dO + C * VB;
  float *MsT = (float *)(Vr + C * VB);             /* the fast variant's M^T (tf32-rounded) */
  PH_INIT(4);
  /* staging, all asynchronous: fp32 Vn (both variants: the fast one rounds it to bf16 as an
   * MMA operand, the same RN rounding the staging did), Kb = b k e^G as the backward's
   * k_intra_tc wrote it, raw bf16 dO and v. It used to convert vn and form Kb (three loads per
   * element) with batched loads, ~50% of the kernel's time at K = V = 128. */
  cp_tile_f32(Ms, CS, C, C, n, C, true, [&](int i) { return w.M + ROWI(i) * C; });
  cp_tile_f32(dVs, VS, C, V16, n, (int)V, V % 4 == 0, [&](int i) { return w.dvn + ROWI(i) * V; });
  cp_tile_f32(dWs, KS, C, K16, n, (int)K, K % 4 == 0, [&](int i) { return w.dW + ROWI(i) * K; });
  cp_tile_f32(VnF, VS, C, V16, n, (int)V, V % 4 == 0, [&](int i) { return w.vn + ROWI(i) * V; });
  cp_tile_f32(Kb, KS, C, K16, n, (int)K, K % 4 == 0, [&](int i) { return w.Kb + ROWI(i) * K; });
  for (int r = threadIdx.x; r < C; r += BT) bs[r] = r < n ? w.b[ROWI(r)] : 0.f;
  cp_tile_bf16(dO, VB, C, V16, n, V, dout, t0, HV, h);
  cp_tile_bf16(Vr, VB, C, V16, n, V, v, t0, HV, h);
  cp_async_wait_all();
  __syncthreads();
  PH(0);
  /* The fast variant's tf32 products (mma_tf) take operands rounded once here: M, dVn, dW,
   * Kb are MMA operands only, so rounding them in place changes no result (the cvt per
   * fragment load rounded the same way), and M^T as a tile of its own gives the three M^T
   * products ldmatrix A fragments. dM and X are rounded where their epilogues write them. */
  if constexpr (!PR) {
    for (int e = threadIdx.x; e < C * C; e += BT) {
      int i = e / C, j = e % C;
      float x = tf32r(Ms[i * CS + j]);
      Ms[i * CS + j] = x, MsT[j * CS + i] = x;
    }
    /* dVn, dW, Kb are contiguous [C][VS], [C][KS], [C][KS] tiles: round them whole (pads
     * are zero), four floats at a time */
    float4 *q4 = (float4 *)dVs;
    for (int e = threadIdx.x; e < (C * VS + 2 * C * KS) / 4; e += BT) {
      float4 x = q4[e];
      q4[e] = make_float4(tf32r(x.x), tf32r(x.y), tf32r(x.z), tf32r(x.w));
    }
    rows_to_bf16(VnF, C, VS, V16);                 /* Vn: the bf16 dA product's only use */
    __syncthreads();
  }
  /* dA = s tril(dO Vn^T) (bf16; the precise backward: dO exact in tf32, Vn split) */
  auto da_out = [&](int i, int j, float x) { if (i < n) w.dA[ROWI(i) * C + j] = j <= i && j < n ? p.scale * x : 0.f; };
  if constexpr (PR)
    mma_blk<P_3TF32A>(C, C, V16, [&](int i, int c) { return f(dO[i * VB + c]); },
                      [&](int c, int j) { return VnF[j * VS + c]; }, da_out);
  else
    mma_ldm(C, C, bt{dO, VB, 1}, bt{(const sbf *)VnF, 2 * VS, 1}, V16, bt{}, bt{}, 0, each4(da_out));
  __syncthreads();                                 /* every warp done with VnF before dM overwrites it */
  PH(1);
  /* dM = strict-tril([dVn | dW] [bV | Kb]^T)  (tf32) */
  auto dm_a = [&](int i, int k) { return k < V16 ? dVs[i * VS + k] : dWs[i * KS + k - V16]; };
  auto dm_out = [&](int i, int j, float x) { dM[i * CS + j] = j < i && i < n ? (PR ? x : tf32r(x)) : 0.f; };
  if constexpr (PR)
    mma_blk<PT>(C, C, V16 + K16, dm_a,
                [&](int k, int j) { return k < V16 ? bs[j] * f(Vr[j * VB + k]) : Kb[j * KS + k - V16]; }, dm_out);
  else   /* [dVn | dW] and Kb by ldmatrix, bV formed per load */
    mma_tf2(C, C, tft{dVs, VS}, [&](int k, int j) { return tf32r(bs[j] * f(Vr[j * VB + k])); }, V16, tft{dWs, KS},
            tft{Kb, KS}, K16, each4(dm_out));
  __syncthreads();
  PH(2);
  /* X = dM M^T (tf32: the dL chain stays close to fp32) */
  if constexpr (PR)
    mma_blk<PT>(C, C, C, [&](int i, int m) { return dM[i * CS + m]; }, [&](int m, int j) { return Ms[j * CS + m]; },
                [&](int i, int j, float x) { X[i * CS + j] = x; });
  else
    mma_tf1(C, C, C, tft{dM, CS}, tft{Ms, CS}, [&](int i, int j, float x) { X[i * CS + j] = tf32r(x); });
  __syncthreads();
  PH(3);
  /* dL = -strict-tril(M^T X) */
  auto xb = [&](int m, int j) { return X[m * CS + j]; };
  auto dl_out = [&](int i, int j, float x) { if (i < n) w.dL[ROWI(i) * C + j] = j < i ? -x : 0.f; };
  if constexpr (PR) mma_blk<PT>(C, C, C, [&](int i, int m) { return Ms[m * CS + i]; }, xb, dl_out);
  else mma_tf1(C, C, C, tft{MsT, CS}, xb, dl_out);
  PH(4);
  /* dv = b (M^T dVn) (tf32); keep (M^T dVn) . v in w.dvn (staged above, dead now; not in w.vn,
   * which a kept forward's backward must leave intact, see kda_cuda.h) for the dbeta row sums */
  auto dvb = [&](int i, int c) { return dVs[i * VS + c]; };
  auto dv_out = [&](int j, int c, float x) {
    if (j < n && c < V) {
      stb(dv, ROWI(j) * V + c, bs[j] * x);
      w.dvn[ROWI(j) * V + c] = x * f(Vr[j * VB + c]);
    }
  };
  if constexpr (PR) mma_blk<PT>(C, V16, C, [&](int j, int i) { return Ms[i * CS + j]; }, dvb, dv_out);
  else mma_tf1(C, V16, C, tft{MsT, CS}, dvb, dv_out);
  PH(5);
  /* dKb = M^T dW (tf32) */
  auto dwb = [&](int i, int d) { return dWs[i * KS + d]; };
  auto dkb_out = [&](int j, int d, float x) { if (j < n && d < K) w.dKb[ROWI(j) * K + d] = x; };
  if constexpr (PR) mma_blk<PT>(C, K16, C, [&](int j, int i) { return Ms[i * CS + j]; }, dwb, dkb_out);
  else mma_tf1(C, K16, C, tft{MsT, CS}, dwb, dkb_out);
  __syncthreads();                                 /* global writes above visible to the block */
  PH(6);
  int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  for (int j = wp; j < n; j += BT / 32) {          /* dbeta_WY: fixed-order warp sums */
    float acc = 0;
    for (int64_t c = lane; c < V; c += 32) acc += w.dvn[ROWI(j) * V + c];
    for (int64_t d = lane; d < K; d += 32) {
      int64_t gi = ROWI(j) * K + d;
      acc += w.dKb[gi] * w.kn[gi] * __expf(w.G[gi]);
    }
    acc = kc_warp_sum(acc);
    if (!lane) w.db[ROWI(j)] = acc;
  }
  PH(7);
}
__global__ void __launch_bounds__(NTC) k_bwd_mat_tc(kp p, const void *v, const void *dout, void *dv, ws w) {
  bwd_mat_tc<false>(p, v, dout, dv, w);
}
__global__ void __launch_bounds__(NTC) k_bwd_mat_tc_p(kp p, const void *v, const void *dout, void *dv, ws w) {
  bwd_mat_tc<true>(p, v, dout, dv, w);
}

/* Intra-chunk backward (§4.3 B4), dG, reverse cumsum, gate and beta chains.
 * smem fp32: q, k, G [C][KS]; X [C+32][KS] (factored operands); dA, dL [C][CS]; b, dbi [C];
 * dGn [K16]; dG [C][KS] (the gate gradient, summed here over four phases, read by the gate
 * chain: it was w.dW in global memory, three read-modify-write passes and the chain's loads) */
size_t smem_final_tc(int64_t C, int64_t K) {
  int64_t KS = r16(K) + 4;
  return (size_t)((3 * C + C + 32) * KS + 2 * C * (C + 4) + 2 * C + r16(K) + 32 + C * KS) * 4;
}
/* PR (the precise backward): the factored off-diagonal blocks in P_3TF32 */
template <bool PR>
static __device__ __forceinline__ void bwd_final_tc(kp p, const void *g, const void *beta, const float *A_log,
                                                    const float *dt_bias, void *dg, void *dbeta, ws w) {
  constexpr int PT = PR ? P_3TF32 : P_TF32;
  extern __shared__ __align__(16) float sm[];
  __shared__ float red[32];
  const int cb = blockIdx.x, *ct = w.ctab + 4 * cb;
  int n = ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = blockIdx.y, K = p.K, HV = p.HV;
  int C = p.C, K16 = r16(K), KS = K16 + 4, CS = C + 4, tid = threadIdx.x;
  float *qs = sm, *ks = qs + C * KS, *Gs = ks + C * KS, *X = Gs + C * KS, *dAs = X + (C + 32) * KS,
        *dLs = dAs + C * CS, *bs = dLs + C * CS, *dbi = bs + C, *dGn = dbi + C, *dGs = dGn + K16 + 32;
  /* the chunk's rows of the [T, HV, K] gradient scratch: row i, column d at i RS + d from its
   * first element, in 32-bit offsets (64-bit index products per element loaded the integer
   * pipe, this kernel's busiest: ncu ALU 35.8%) */
  const int RS = (int)(HV * K);
  const int64_t g0 = ROWI(0) * K;
  float *dQg = w.dQ + g0, *dKig = w.dKi + g0, *dKbg = w.dKb + g0;
  PH_INIT(5);
  {                                                 /* asynchronous staging, zero-filled */
    bool al = K % 4 == 0;
    cp_tile_f32(qs, KS, C, K16, n, (int)K, al, [&](int r) { return w.qn + ROWI(r) * K; });
    cp_tile_f32(ks, KS, C, K16, n, (int)K, al, [&](int r) { return w.kn + ROWI(r) * K; });
    /* pad rows repeat the last G: exponents <= 0 */
    cp_tile_f32(Gs, KS, C, K16, C, (int)K, al, [&](int r) { return w.G + ROWI(r < n ? r : n - 1) * K; });
    cp_tile_f32(dAs, CS, C, C, n, C, true, [&](int i) { return w.dA + ROWI(i) * C; });
    cp_tile_f32(dLs, CS, C, C, n, C, true, [&](int i) { return w.dL + ROWI(i) * C; });
  }
  for (int r = tid; r < C; r += BT) bs[r] = r < n ? w.b[ROWI(r)] : 0.f;
  cp_async_wait_all();
  __syncthreads();
  PH(0);
  {                                                 /* dGn with the inter-chunk dKi (before intra) */
    /* rows split in 16-row groups, one thread per (group, column) (all the block's threads,
     * 16 loads in flight each); the group sums go to X (free until the off-diagonal terms)
     * and are added in group order */
    int ng = (n + 15) / 16;
    for (int e = tid; e < ng * (int)K; e += BT) {
      int r0 = (e / (int)K) * 16, d = e % (int)K;
      float x[16], acc = 0;
#pragma unroll
      for (int u = 0; u < 16; u++) x[u] = r0 + u < n ? dKig[(r0 + u) * RS + d] : 0.f;
#pragma unroll
      for (int u = 0; u < 16; u++)
        if (r0 + u < n) acc += ks[(r0 + u) * KS + d] * x[u];
      X[(r0 / 16) * KS + d] = acc;
    }
    __syncthreads();
    for (int d = tid; d < K; d += BT) {
      float acc = __expf(Gs[(n - 1) * KS + d]) * w.dgn[((int64_t)cb * HV + h) * K + d];
      for (int gq = 0; gq < ng; gq++) acc += X[gq * KS + d];
      dGn[d] = acc;
    }
  }
  __syncthreads();                                  /* dKi read above before it is overwritten */
  PH(1);
  /* inter parts of dG (into the dG tile) fused with the diagonal blocks (exact exponent). A
   * thread owns one column d of one 16-row block: G and k of its 16 rows in registers, each
   * pair's e^{G_i - G_j} formed once and used twice, as row i's term (dq_intra, R) and as
   * column j's (dk_col);
   * dA, dL are broadcast loads. Sums run in the same order as one element at a time (j up for
   * a row, i up for a column). It was a thread per element recomputing each pair's exponent
   * for the row and for the column terms and reloading G, k per pair: 31% of the kernel. */
  for (int e = tid; e < (C / 16) * (int)K; e += BT) {
    int I0 = (e / (int)K) * 16, d = e % (int)K;
    if (I0 >= n) continue;
    float gr[16], kr[16], dqi[16], R[16], col[16];
#pragma unroll
    for (int i = 0; i < 16; i++)
      gr[i] = Gs[(I0 + i) * KS + d], kr[i] = ks[(I0 + i) * KS + d], dqi[i] = R[i] = col[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) {
      if (I0 + i >= n) break;                       /* rows past the chunk: nothing to add */
      const float *dAr = dAs + (I0 + i) * CS + I0, *dLr = dLs + (I0 + i) * CS + I0;
      float qi = qs[(I0 + i) * KS + d], bki = bs[I0 + i] * kr[i];
#pragma unroll
      for (int j = 0; j <= i; j++) {
        float E = __expf(gr[i] - gr[j]), kj = kr[j] * E, a = dAr[j];
        dqi[i] += a * kj;
        if (j < i) {
          float l = dLr[j];
          R[i] += l * kj;
          col[j] += (a * qi + l * bki) * E;
        } else
          col[j] += (a * qi + 0.f) * E;
      }
    }
#pragma unroll
    for (int i0 = 0; i0 < 16; i0 += 4) {            /* 4 elements' global loads in flight */
      float dkb[4], dki[4], dq0[4];
#pragma unroll
      for (int u = 0; u < 4; u++)
        if (I0 + i0 + u < n) {
          int gi = (I0 + i0 + u) * RS + d;
          dkb[u] = dKbg[gi], dki[u] = dKig[gi], dq0[u] = dQg[gi];
        }
#pragma unroll
      for (int u = 0; u < 4; u++) {
        int i = i0 + u;
        if (I0 + i >= n) break;
        int gi = (I0 + i) * RS + d;
        float q = qs[(I0 + i) * KS + d], k = ks[(I0 + i) * KS + d], eg = __expf(Gs[(I0 + i) * KS + d]),
              b = bs[I0 + i];                      /* reloaded: gr, kr die after the pair loop */
        float dG0 = q * dq0[u] - k * dki[u] + b * k * eg * dkb[u], dKi0 = dki[u] + dkb[u] * b * eg;
        dQg[gi] = dq0[u] + dqi[i];
        dKbg[gi] = R[i];
        dKig[gi] = dKi0 + col[i];
        dGs[(I0 + i) * KS + d] = dG0 + (q * dqi[i] - k * col[i]);
      }
    }
  }
  PH(2);
  /* off-diagonal row terms: block I against columns j < r = 16 I, factored around row r */
  for (int I = 1; I < C / 16 && 16 * I < n; I++) {
    int r = 16 * I;
    __syncthreads();
    for (int e = tid; e < r * (K16 / 4); e += BT) {   /* four columns at a time (float4) */
      int j = e / (K16 / 4), d = (e % (K16 / 4)) * 4;
      float4 kj = *(const float4 *)(ks + j * KS + d), gr = *(const float4 *)(Gs + r * KS + d),
             gj = *(const float4 *)(Gs + j * KS + d);
      *(float4 *)(X + j * KS + d) = make_float4(kj.x * __expf(gr.x - gj.x), kj.y * __expf(gr.y - gj.y),
                                                kj.z * __expf(gr.z - gj.z), kj.w * __expf(gr.w - gj.w));
    }
    __syncthreads();
    PH(3);
    /* epilogue: a thread's 4 outputs (rows ii, ii+8 of one half, columns d, d+1): all global
     * loads first, then the updates (same arithmetic as one element at a time) */
    mma_blk4<PT>(32, K16, r,
                 [&](int ii, int j) { return ii < 16 ? dAs[(r + ii) * CS + j] : dLs[(r + ii - 16) * CS + j]; },
                 [&](int j, int d) { return X[j * KS + d]; },
                 [&](int ii, int d0, float c0, float c1, float c2, float c3) {
                   float x[4] = {c0, c1, c2, c3}, a[4], b[4];
                   const epi4 e = epi4_at(r + (ii & 15), d0, n, K, [&](int i) { return (int64_t)i; });
                   const int *iv = e.r, *dv = e.d;
                   const bool *ok = e.ok;
                   int gi[4];
#pragma unroll
                   for (int u = 0; u < 4; u++) gi[u] = iv[u] * RS + dv[u];
                   if (ii < 16) {
#pragma unroll
                     for (int u = 0; u < 4; u++)
                       if (ok[u]) a[u] = dQg[gi[u]], b[u] = dGs[iv[u] * KS + dv[u]];
#pragma unroll
                     for (int u = 0; u < 4; u++)
                       if (ok[u]) {
                         float y = x[u] * __expf(Gs[iv[u] * KS + dv[u]] - Gs[r * KS + dv[u]]);
                         dQg[gi[u]] = a[u] + y, dGs[iv[u] * KS + dv[u]] = b[u] + qs[iv[u] * KS + dv[u]] * y;
                       }
                   } else {
#pragma unroll
                     for (int u = 0; u < 4; u++)
                       if (ok[u]) a[u] = dKbg[gi[u]];
#pragma unroll
                     for (int u = 0; u < 4; u++)
                       if (ok[u]) dKbg[gi[u]] = a[u] + x[u] * __expf(Gs[iv[u] * KS + dv[u]] - Gs[r * KS + dv[u]]);
                   }
                 });
    PH(4);
  }
  /* off-diagonal column terms: block J against rows i > r' = 16 J + 15, factored around r' */
  for (int J = 0; J < C / 16 - 1 && 16 * J + 16 < n; J++) {
    int rp = 16 * J + 15, mrow = n - rp - 1, m16 = r16(mrow);
    __syncthreads();
    for (int e = tid; e < m16 * (K16 / 4); e += BT) {   /* X = [q_i ; b_i k_i] e^{G_i - G_r'}, i > r' */
      int ii = e / (K16 / 4), d = (e % (K16 / 4)) * 4, i = rp + 1 + ii;
      float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
      if (ii < mrow) {
        float4 gi = *(const float4 *)(Gs + i * KS + d), gr = *(const float4 *)(Gs + rp * KS + d),
               qi = *(const float4 *)(qs + i * KS + d), ki = *(const float4 *)(ks + i * KS + d);
        float b = bs[i];
        float4 sc = make_float4(__expf(gi.x - gr.x), __expf(gi.y - gr.y), __expf(gi.z - gr.z), __expf(gi.w - gr.w));
        x0 = make_float4(qi.x * sc.x, qi.y * sc.y, qi.z * sc.z, qi.w * sc.w);
        x1 = make_float4(b * ki.x * sc.x, b * ki.y * sc.y, b * ki.z * sc.z, b * ki.w * sc.w);
      }
      *(float4 *)(X + ii * KS + d) = x0, *(float4 *)(X + (m16 + ii) * KS + d) = x1;
    }
    __syncthreads();
    PH(5);
    mma_blk4<PT>(16, K16, 2 * m16,
                 [&](int jj, int k) {
                   int j = 16 * J + jj;
                   if (k < m16) return k < mrow ? dAs[(rp + 1 + k) * CS + j] : 0.f;
                   k -= m16;
                   return k < mrow ? dLs[(rp + 1 + k) * CS + j] : 0.f;
                 },
                 [&](int k, int d) { return X[k * KS + d]; },
                 [&](int jj, int d0, float c0, float c1, float c2, float c3) {
                   float x[4] = {c0, c1, c2, c3}, a[4], b[4];
                   const epi4 e = epi4_at(16 * J + jj, d0, n, K, [&](int j) { return (int64_t)j; });
                   const int *jv = e.r, *dv = e.d;
                   const bool *ok = e.ok;
                   int gj[4];
#pragma unroll
                   for (int u = 0; u < 4; u++) gj[u] = jv[u] * RS + dv[u];
#pragma unroll
                   for (int u = 0; u < 4; u++)
                     if (ok[u]) a[u] = dKig[gj[u]], b[u] = dGs[jv[u] * KS + dv[u]];
#pragma unroll
                   for (int u = 0; u < 4; u++)
                     if (ok[u]) {
                       float y = x[u] * __expf(Gs[rp * KS + dv[u]] - Gs[jv[u] * KS + dv[u]]);
                       dKig[gj[u]] = a[u] + y, dGs[jv[u] * KS + dv[u]] = b[u] - ks[jv[u] * KS + dv[u]] * y;
                     }
                 });
    PH(6);
  }
  __syncthreads();
  int lane = tid & 31, wp = tid >> 5;
  for (int i = wp; i < n; i += BT / 32) {          /* R terms: dk += b R, dG += k b R, dbeta += k.R */
    float acc = 0, b = bs[i];
    for (int d0 = lane; d0 < K; d0 += 128) {        /* 4 columns' loads in flight, same order */
      float R[4], dk[4], dw[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        int d = d0 + 32 * u;
        int gi = i * RS + d;
        if (d < K) R[u] = dKbg[gi], dk[u] = dKig[gi], dw[u] = dGs[i * KS + d];
      }
#pragma unroll
      for (int u = 0; u < 4; u++) {
        int d = d0 + 32 * u;
        if (d >= K) break;
        int gi = i * RS + d;
        float k = ks[i * KS + d];
        dKig[gi] = dk[u] + b * R[u];
        dGs[i * KS + d] = dw[u] + k * b * R[u];
        acc += k * R[u];
      }
    }
    acc = kc_warp_sum(acc);
    if (!lane) dbi[i] = acc;
  }
  __syncthreads();
  PH(7);
  float ea = A_log ? expf(A_log[h]) : 1.f, dAl = 0;
  for (int d = tid; d < K; d += BT)               /* reverse cumsum + gate chain (§2.1) */
    w.gpart[((int64_t)cb * HV + h) * (K + 1) + d] =
        gate_chain_col(p, [&](int r) { return dGs[r * KS + d]; }, g, dt_bias, A_log != NULL, dg, t0, h, n, d,
                       dGn[d], ea, &dAl);
  dAl = block_sum(dAl, red);
  if (tid == 0) w.gpart[((int64_t)cb * HV + h) * (K + 1) + K] = dAl;
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
__global__ void __launch_bounds__(NTC, 1) k_bwd_final_tc(kp p, const void *g, const void *beta,
                                                        const float *A_log, const float *dt_bias,
                                                        void *dg, void *dbeta, ws w) {
  bwd_final_tc<false>(p, g, beta, A_log, dt_bias, dg, dbeta, w);
}
__global__ void __launch_bounds__(NTC, 1) k_bwd_final_tc_p(kp p, const void *g, const void *beta,
                                                          const float *A_log, const float *dt_bias,
                                                          void *dg, void *dbeta, ws w) {
  bwd_final_tc<true>(p, g, beta, A_log, dt_bias, dg, dbeta, w);
}

/* ---- phase timers (KDA_PHASES builds; see kda_common.cuh) ---------------------------------- */
#ifdef KDA_PHASES
extern "C" void kda_phase_report(const char *title) {
  static const char *kn[KDA_PH_KERNELS] = {"intra", "state_fwd", "state_bwd", "bwd_rows", "bwd_mat", "bwd_final"};
  unsigned long long c[KDA_PH_KERNELS][KDA_PH_PHASES + 1];
  cudaDeviceSynchronize();
  cudaMemcpyFromSymbol(c, kda_phase_cyc, sizeof c);
  printf("# phases: %s (mean cycles per block; share of the kernel's marked time)\n", title);
  for (int k = 0; k < KDA_PH_KERNELS; k++) {
    unsigned long long nb = c[k][KDA_PH_PHASES], tot = 0;
    if (!nb) continue;
    for (int ph = 0; ph < KDA_PH_PHASES; ph++) tot += c[k][ph];
    printf("%-10s %6llu blocks %9.0f cyc/block:", kn[k], nb, (double)tot / nb);
    for (int ph = 0; ph < KDA_PH_PHASES; ph++)
      if (c[k][ph]) printf("  p%d %.0f (%.0f%%)", ph, (double)c[k][ph] / nb, 100.0 * c[k][ph] / tot);
    printf("\n");
  }
  memset(c, 0, sizeof c);
  cudaMemcpyToSymbol(kda_phase_cyc, c, sizeof c);
}
#else
extern "C" void kda_phase_report(const char *title) { (void)title; }
#endif
