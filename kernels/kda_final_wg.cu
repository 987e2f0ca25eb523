/* kda_final_wg.cu — k_bwd_final_wg: the backward's last chunk kernel (kda_final.cuh's
 * bwd_final_tc, the fast wide form at the compiled K = V = 128, chunk 64) with a flat chunk's
 * intra-chunk terms on Hopper's warpgroup MMAs, tf32 operands (kda_wgmma.cuh). Compiled for
 * sm_90a alone (the Makefile's WGFLAGS); the host runs it wherever that form of k_bwd_final_tc
 * would run on compute capability 9.0, unless KDA_KDA_FINALWG=0 (kda_cuda.cu use_final_wg).
 * Same shared memory as k_bwd_final_tc: the flat stages live in the room of its X, dA and dL
 * tiles.
 *
 * A chunk is flat when its decay span (max over key dims d of G_0 - G_{n-1}) is at most
 * CHUNK_SPAN (kda_tc.cuh's chunk_flat, decided once the dGn phase is done); a steep chunk takes
 * bwd_final_tc's per-block path (exact per-pair exponents on the diagonal blocks) in the same
 * launch. In a flat chunk every pair factors around the span's middle Gm_d = (G_0 + G_{n-1}) / 2,
 * e^{G_i - G_j} = e^{G_i - Gm} e^{Gm - G_j}, each factor within [e^-64, e^64], so the terms the
 * per-block path forms in its diagonal phase, its row products and its column products are two
 * whole-chunk products (dA lower triangle with the diagonal, dL strictly lower, q, k the
 * l2-normalised rows, b = beta):
 *   row terms    [dqi ; R]_i = e^{G_i - Gm} ([dA ; dL] X)_i,  X_j = k_j e^{Gm - G_j}
 *   column terms col_j = e^{Gm - G_j} ([dA^T | dL^T] [q ; b k] e^{G - Gm})_j
 * and then the diagonal phase's epilogue formulas: dQ = s dQ0 e^G + dqi, R' = R + dKb e^G (dKb
 * in shared memory), dKi = dKi0 e^{G_{n-1} - G} + col (dKi0 re-read from global memory: its
 * staged copy's room holds the tiles); dQ stays in the dG tile and dKi in the room's first
 * rows, where the body's R terms read them and form dG = q dQ - k dKi + k b R' (the per-block
 * path's sum, in another order). Why: k_bwd_final_tc is the backward's largest kernel (1249 us
 * of ~3.0 ms fwd+bwd at (8,2048,16,128) on an H100), its diagonal phase's pair loop and its
 * sixteen-row products behind a barrier each; here a warpgroup's 64 x 64 x 64 row product is
 * eight instructions reading both operands from shared memory, with no per-pair exponent. The
 * same flat form on mma.sync lost (kda_tc.cuh, CHUNK_SPAN: its whole-chunk products cost more
 * than the per-block ones and the pair loop they removed); the wgmma form wins: H100, one run against
 * KDA_KDA_FINALWG=0 (benches/results/2026-12-05s50b), the kernel 1252 -> 1029 us (ncu), fwd+bwd
 * (8,2048,16,128) 2.930-2.938 -> 2.753-2.758 ms, (1,8192,16,128) 1.780-1.786 -> 1.698-1.716. tf32,
 * not bf16: a CPU study of the flat form put bf16 operands' dg error at 2.1e-2 (the test's
 * tolerance 0.02), tf32's at 2.6e-3. A numpy emulation (benches/final_flat_emu.py) of this
 * file's index maps, swizzled tiles, the operand reads of a 128-byte swizzled K-major
 * descriptor, the fragment map and the epilogues matched the per-pair formula within 3e-4 (RMS
 * ratio; n = 64, 50, 37, 1, spans up to 126, the room at several offsets from 1024), with no
 * row past n written and no tile written in a barrier interval where another thread or a
 * wgmma reads it.
 *
 * tf32 has no transpose bit: every operand is a K-major tile (rows its M or N index, columns
 * the contracted one), 64 x 64 fp32, 128-byte swizzled, tf32-rounded where written. Five tiles
 * T0 .. T4 (16 KB each, from the room's first 1024-byte aligned float) go through these stages:
 *   S1  T0 = dA, T1 = dL (rows i, columns j, masked), T2 = dA^T, from the staged dA, dL tiles
 *       (which T3, T4 overlap: a barrier before S2)
 *   S2  T3, T4 = X^T (rows d in two halves, columns j)
 *   R1  warpgroup g: dA X^T and dL X^T at columns d of 32 g .., m64n32k8 x 8 each; epilogue dQ (from
 *       dQ0 staged in the dG tile, in its place), R'
 *   S3  T0 = dL^T (from T1), T3, T4 = (q e^{G - Gm})^T
 *   R2a warpgroup g: columns d of 32 g .., dA^T Yq, m64n32k8 x 8; meanwhile T1 = (b k e^{G - Gm})^T
 *       of d < 64
 *   R2b T3 = the same of d >= 64, then dL^T Ybk into the same accumulators; epilogue dKi.
 * PH(2) .. PH(6) mark the stages. Phase counters: this file's own (kda_tc.cuh's per-file
 * kda_phase_cyc), kernel id 6, printed as the row "bwd_final_wg" by kda_bench_phases, which links
 * this file's -DKDA_PHASES object (benches/kda_gpu.sh); its p2 .. p6 sum a flat chunk's stages
 * above and a steep chunk's per-block phases (the same marks as k_bwd_final_tc's) over the
 * launch's blocks. Rows past n are zero in every operand and never written. */
#include "kda_final.cuh"
#include "kda_wgmma.cuh"

enum { FW_T = 64 * 64 };   /* a 64 x 64 fp32 tile (floats) */

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
/* after wg_wait: the accumulators read from here on (an empty asm that "writes" them, ordered
 * after the wait's, as CUTLASS's warpgroup_fence_operand: the wait names no register, so
 * without it the compiler may move their first uses above it) */
template <int R> static __device__ __forceinline__ void fw_fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}
/* T[d % 64][i] = tf32(v(i, d)) for the chunk rows i < 64 and the columns d in [64 h0, 64 h1)
 * (T = lo for d < 64, hi past), zeros past n. v(i, d, x) forms x[0 .. 3] of columns d .. d + 3.
 * A thread a row's four columns: a warp's 32 consecutive rows read 16-byte chunks of 32 rows of
 * G (pitch 132 floats: a quarter warp's eight chunks in distinct banks) and write 32
 * consecutive columns of four tile rows (the 32 banks once each) */
template <class FV>
static __device__ __forceinline__ void fw_stage_t(float *lo, float *hi, int h0, int h1, int n, FV v) {
  for (int e = threadIdx.x; e < 64 * 16 * (h1 - h0); e += NTC) {
    const int i = e & 63, d = 64 * h0 + ((e >> 6) << 2);
    float x[4] = {0.f, 0.f, 0.f, 0.f};
    if (i < n) v(i, d, x);
    const float y[4] = {tf32r(x[0]), tf32r(x[1]), tf32r(x[2]), tf32r(x[3])};
    wf_put_col4<64>(d < 64 ? lo : hi, d & 63, i, y);
  }
}

template <int NF, bool Q16, class FP> static __device__ __forceinline__ void final_flat_wg(const final_flat &f, FP ph) {
  constexpr int CS = 64 + 4, QB = 128 + 8;         /* bwd_final_tc's pitches at K = 128, C = 64 */
  auto T = [](int r, int d) { return fsw_at<true>(r, d, 0); };   /* G, dG, dKb: the body's swizzled rows */
  const int n = NF ? NF : f.n, tid = threadIdx.x, g = tid >> 7, RS = f.RS;
  const float *Gs = f.Gs;
  float *T0 = f.X + ((1024 - (smem_u32(f.X) & 1023)) & 1023) / 4, *T1 = T0 + FW_T, *T2 = T1 + FW_T, *T3 = T2 + FW_T,
        *T4 = T3 + FW_T;
  auto v4 = [&](const sbf *t, const float *r, int i, int d) {   /* the body's: four l2-normalised columns */
    uint2 u = *(const uint2 *)(t + i * QB + d);
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    float s = r[i];
    return make_float4(a.x * s, a.y * s, b.x * s, b.y * s);
  };
  /* Ybk^T's entries b_i k_i e^{G_i - Gm} (the per-block path's b k times the factor) */
  auto ybk = [&](int i, int d, float (&x)[4]) {
    float4 up, dn;
    flat_exps_at(Gs, T, n, i, d, up, dn);
    const float4 k = v4(f.kb, f.rk, i, d);
    const float b = f.bs[i];
    x[0] = b * k.x * up.x, x[1] = b * k.y * up.y, x[2] = b * k.z * up.z, x[3] = b * k.w * up.w;
  };
  /* the accumulator fragment's rows r0, r0 + 8 and column pairs from c0 (kda_wgmma.cuh) */
  const int wq = (tid >> 5) & 3, l = tid & 31, r0 = 16 * wq + (l >> 2), c0 = 2 * (l & 3);
  /* the fragment's rows r0, r0 + 8 share their swizzle mask (fsw_mask): TE(i, d) is T's for them */
  const int m0 = fsw_mask(r0);
  auto TE = [m0](int i, int d) { return (i << 7) + (d ^ m0); };

  /* S1: dA (j <= i), dL (j < i) and dA^T from the staged fp32 tiles, rows past n zero. A thread
   * a 16-byte chunk of row i (as kda_mat_wg.cu's mw_round_t) */
  for (int e = tid; e < 64 * 16; e += NTC) {
    const int i = e & 63, c = (e >> 6) << 2;
    const float4 a = *(const float4 *)(f.dAs + i * CS + c), b = *(const float4 *)(f.dLs + i * CS + c);
    const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
    float ya[4], yl[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      ya[u] = i < n && c + u <= i ? tf32r(av[u]) : 0.f;
      yl[u] = i < n && c + u < i ? tf32r(bv[u]) : 0.f;
    }
    wf_put_col4<64>(T2, c, i, ya);
    *(float4 *)(T0 + wf_off<64>(i, c)) = make_float4(ya[0], ya[1], ya[2], ya[3]);
    *(float4 *)(T1 + wf_off<64>(i, c)) = make_float4(yl[0], yl[1], yl[2], yl[3]);
  }
  __syncthreads();                                 /* dA, dL read: T3, T4 overlap their tiles */
  /* S2: X^T, X_j = k_j e^{Gm - G_j} */
  fw_stage_t(T3, T4, 0, 2, n, [&](int j, int d, float (&x)[4]) {
    float4 up, dn;
    flat_exps_at(Gs, T, n, j, d, up, dn);
    const float4 k = v4(f.kb, f.rk, j, d);
    x[0] = k.x * dn.x, x[1] = k.y * dn.y, x[2] = k.z * dn.z, x[3] = k.w * dn.w;
  });
  wg_proxy_fence();
  __syncthreads();
  ph(2);
  {                                                /* R1: the row terms */
    /* warpgroup g: columns d of 32 g .. 32 g + 31 of both products (B from row 32 (g % 2) of
     * the half's tile), so that every warpgroup's epilogue does the same work: a dQ and an R'
     * block each. The dQ rows' inter-chunk part dQ0 was staged into the dG tile with the
     * chunk's other operands (bwd_final_tc, WG), where the epilogue's dQ lands: read and
     * written by the same thread. The layout before this balance gave warpgroups 0, 2 dA's
     * rows and 1, 3 dL's, 64 columns each, the dA ones loading dQ0 from global memory during
     * the MMAs: this stage 10.0k of 49.5k cycles a block (H100, s50c), balanced 8.4k (s51a,
     * with fk, fp and fb: 49.7k -> 45.9k in all).
     * dQ stays in the tile, not in global memory: the R terms read it there (dq's l2-norm
     * backward and dG's q part). It went out and back through L2, its float2 stores 3.9% of
     * this kernel's stall samples (mio and lg throttles, ncu s57c). H100, one run, three rounds
     * against main (s57e): this stage 7.1k -> 3.7k cycles a block, R2b's 3.0k -> 2.3k, the
     * kernel 43.5k -> 39.5k; fwd+bwd (8,2048,16,128) 2.591-2.605 -> 2.514-2.517 ms,
     * (1,8192,16,128) 1.594-1.608 -> 1.546-1.556; the small shapes (K = 64, no wgmma final
     * kernel) equal. */
    const int d0 = 32 * g;
    const uint64_t db = wf_desc(g >> 1 ? T4 : T3, 32 * (g & 1));
    float qa[16], la[16];
    wf_issue<32>(qa, wf_desc(T0, 0), db, false);
    wf_issue<32>(la, wf_desc(T1, 0), db, false);
    wg_wait<0>();
    fw_fence_acc(qa);
    fw_fence_acc(la);
#pragma unroll
    for (int jj = 0; jj < 4; jj++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int i = r0 + 8 * h, d = d0 + 8 * jj + c0, o = 4 * jj + 2 * h;
        if (i >= n) continue;
        const float2 gi = *(const float2 *)(Gs + TE(i, d)), g0 = *(const float2 *)(Gs + T(0, d)),
                     gl = *(const float2 *)(Gs + T(n - 1, d));
        const float gv[2] = {gi.x, gi.y}, mv[2] = {0.5f * (g0.x + gl.x), 0.5f * (g0.y + gl.y)};
        float up[2], eg[2];
#pragma unroll
        for (int u = 0; u < 2; u++) up[u] = kexp(gv[u] - mv[u]), eg[u] = kexp(gv[u]);
        /* dQ: the inter-chunk dQ, s (dO S0^T) e^G, plus the row term, in place of dQ0 in the dG
         * tile (the R terms read it there: dq's l2-norm backward, dG's q part) */
        float2 *dgp = (float2 *)(f.dGs + TE(i, d));
        const float2 q0v = *dgp;
        const float dq0 = f.scale * q0v.x * eg[0], dq1 = f.scale * q0v.y * eg[1];
        *dgp = make_float2(dq0 + qa[o] * up[0], dq1 + qa[o + 1] * up[1]);
        /* R' = R + dKb e^G (the body's R terms) */
        float2 *rp = (float2 *)(f.dKbs + TE(i, d));
        const float2 kb2 = *rp;
        *rp = make_float2(la[o] * up[0] + kb2.x * eg[0], la[o + 1] * up[1] + kb2.y * eg[1]);
      }
  }
  __syncthreads();                                 /* R1's reads of T0, T1, T3, T4 done */
  ph(3);
  /* S3: dL^T (T0, from T1), Yq^T = (q e^{G - Gm})^T (T3, T4) */
  for (int e = tid; e < 64 * 16; e += NTC) {
    const int i = e & 63, c = (e >> 6) << 2;
    const float4 x = *(const float4 *)(T1 + wf_off<64>(i, c));
    wf_put_col4<64>(T0, c, i, {x.x, x.y, x.z, x.w});
  }
  fw_stage_t(T3, T4, 0, 2, n, [&](int i, int d, float (&x)[4]) {
    float4 up, dn;
    flat_exps_at(Gs, T, n, i, d, up, dn);
    const float4 q = v4(f.qb, f.rq, i, d);
    x[0] = q.x * up.x, x[1] = q.y * up.y, x[2] = q.z * up.z, x[3] = q.w * up.w;
  });
  wg_proxy_fence();
  __syncthreads();
  ph(4);
  /* R2: the column terms, warpgroup g columns d of 32 g .. 32 g + 31 (B from row 32 (g % 2) of
   * the half's tile), rows j; dA^T Yq, then dL^T Ybk into the same accumulators */
  float acc[16], pf[16];
  wf_issue<32>(acc, wf_desc(T2, 0), wf_desc(g >> 1 ? T4 : T3, 32 * (g & 1)), false);
  const int d0 = 32 * g;
  /* the inter-chunk dKi (global, HBM: the rows kernel wrote it long before) for R2b's epilogue,
   * loaded here so that R2a and both Ybk stagings cover its latency (loaded after R2b's issue,
   * R2b with its epilogue took 5.8k of 49.5k cycles a block, H100, s50c; with fk, 3.7k, and R2a
   * 3.4k -> 4.2k, s51a) */
#pragma unroll
  for (int jj = 0; jj < 4; jj++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int j = r0 + 8 * h, d = d0 + 8 * jj + c0;
      float2 v = make_float2(0.f, 0.f);
      if (j < n) v = Q16 ? __bfloat1622float2(*(const __nv_bfloat162 *)(f.dKib + j * RS + d)) : *(const float2 *)(f.dKig + j * RS + d);
      pf[4 * jj + 2 * h] = v.x, pf[4 * jj + 2 * h + 1] = v.y;
    }
  fw_stage_t(T1, T1, 0, 1, n, ybk);               /* Ybk^T of d < 64 into T1 (dL's, read by S3) */
  wg_proxy_fence();
  wg_wait<0>();
  fw_fence_acc(acc);
  __syncthreads();                                 /* R2a's reads of T2, T3, T4 done */
  fw_stage_t(T3, T3, 1, 2, n, ybk);               /* Ybk^T of d >= 64 into T3 */
  wg_proxy_fence();
  __syncthreads();
  ph(5);
  wf_issue<32>(acc, wf_desc(T0, 0), wf_desc(g >> 1 ? T3 : T1, 32 * (g & 1)), true);
  wg_wait<0>();
  fw_fence_acc(acc);
  /* dKi goes to the room's first rows (pitch 136, the body's X), not to global memory: the R
   * terms read it there (bwd_final_tc, WG and flat) and write the final dKi themselves where
   * no l2-norm backward follows. Every warpgroup's reads of the tiles are done first (R2b 5.8k
   * -> 3.7k cycles a block with fp, the R terms 6.8k -> 7.1k, H100, s51a) */
  __syncthreads();
  float *Dk = f.X;
#pragma unroll
  for (int jj = 0; jj < 4; jj++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int j = r0 + 8 * h, d = d0 + 8 * jj + c0, o = 4 * jj + 2 * h;
      if (j >= n) continue;
      const float2 gj = *(const float2 *)(Gs + TE(j, d)), g0 = *(const float2 *)(Gs + T(0, d)),
                   gl = *(const float2 *)(Gs + T(n - 1, d));
      const float gv[2] = {gj.x, gj.y}, lv[2] = {gl.x, gl.y}, mv[2] = {0.5f * (g0.x + gl.x), 0.5f * (g0.y + gl.y)};
      float ki[2];
#pragma unroll
      for (int u = 0; u < 2; u++)   /* dki: the staged dKi's factor as the dGn phase applied it, e^{G_{n-1} - G_j} */
        ki[u] = pf[o + u] * kexp(lv[u] - gv[u]) + acc[o + u] * kexp(mv[u] - gv[u]);
      *(float2 *)(Dk + j * (128 + 8) + d) = make_float2(ki[0], ki[1]);
    }
  ph(6);
}
#endif

/* a full chunk with n = 64 fixed, as k_bwd_final_tc's. Q16: dQ0, dKi0 and dA from the fused
 * sweep in bf16 (kda_final.cuh) */
template <bool Q16>
__global__ void __launch_bounds__(NTC, 1) k_bwd_final_wg(kp p, const void *q, const void *k, const void *g,
                                                        const void *beta, const float *A_log, const float *dt_bias,
                                                        void *dg, void *dbeta, void *dq_out, void *dk_out, ws w) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if (full_chunk<false, 128>(p, w.ctab, blk_chunk(p)))
    bwd_final_tc<false, false, 128, FULL_NF<false, 128>, true, false, Q16>(p, q, k, g, beta, A_log, dt_bias, dg,
                                                                          dbeta, dq_out, dk_out, w);
  else bwd_final_tc<false, false, 128, 0, true, false, Q16>(p, q, k, g, beta, A_log, dt_bias, dg, dbeta, dq_out, dk_out, w);
#else
  __trap();   /* built for sm_90a only; the host never launches it elsewhere */
#endif
}

final_tc_fn k_bwd_final_wg_ptr(int q16) { return q16 ? k_bwd_final_wg<true> : k_bwd_final_wg<false>; }

#ifdef KDA_PHASES
void kda_phase_take_final_wg(unsigned long long (*c)[KDA_PH_PHASES + 1]) { kda_phase_take(c); }
#endif
