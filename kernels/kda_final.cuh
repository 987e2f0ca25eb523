/* kda_final.cuh — the body of the backward's last chunk kernel (bwd_final_tc: the intra-chunk
 * terms, dG, the gate and beta chains, the l2-norm backward), one template for
 * kda_final_tc.cu's k_bwd_final_tc (every form; WG = false) and kda_final_wg.cu's
 * k_bwd_final_wg (the fast wide K = V = 128 form, WG = true: a flat chunk's intra-chunk terms on
 * Hopper's tf32 warpgroup MMAs, final_flat_wg there). */
#pragma once
#include "kda_tc.cuh"

/* Intra-chunk backward (§4.3 B4), dG, reverse cumsum, gate and beta chains.
 * smem fp32: G [C][KS]; X [C+32][K16+8] (factored operands; [KS] compact); dA, dL [C][CS]; b, dbi [C];
 * dGn [K16]; dG [C][KS] (the gate gradient, summed here over four phases, read by the gate
 * chain: it was w.dW in global memory, three read-modify-write passes and the chain's loads);
 * rq, rk [C] and the raw bf16 q, k [C][K16+8]; the wide layout also dKb [C][KS] (R' below);
 * the column terms' A tiles [16][final_at_cols(C)] (the fast kernels).
 * q, k raw: the l2-normalised rows are q rq, k rk (ws.rn), formed where read, the products
 * k_intra_tc formed, so the same values as the fp32 qn, kn tiles staged until 2026-12-02 in
 * half the room; that room holds dKb, which the diagonal phase, the row products and the R
 * terms read and wrote in global memory (4.5 passes of 4 C K bytes a block, now one staged
 * read). Alone a wash (H200, 2026-12-02s26a: the staging grew by what the diagonal phase and
 * the row products lost); the raw rows are what lets the R terms do the l2-norm backward. */
/* the column terms' groups: from block J0, the blocks whose X_J ([q ; b k] rows i > 16 J + 15,
 * 2 m16 rows each) fit X's C + 32 rows together (at C = 64: {0}, {1, 2}); returns the end J1
 * and in *at the group's A-tile columns (2 m16 + 4 a block) */
static __host__ __device__ __forceinline__ int col_group(int J0, int n, int C, int *at) {
  int xrows = 0, J1 = J0, nI = (n + 15) / 16;
  for (*at = 0; J1 < nI - 1; J1++) {
    int m16 = r16(n - 16 * J1 - 16);
    if (xrows + 2 * m16 > C + 32) break;
    xrows += 2 * m16, *at += 2 * m16 + 4;
  }
  return J1;
}
/* the widest group's A-tile columns over chunk lengths (the groups depend on n only through
 * r16(n)): 104 at C = 64, 36 at C = 32 */
static __host__ __device__ __forceinline__ int final_at_cols(int C) {
  int w = 0;
  for (int n = 16; n < C + 16; n += 16)
    for (int J0 = 0, at; J0 < (n + 15) / 16 - 1;) {
      J0 = col_group(J0, n, C, &at);
      w = at > w ? at : w;
    }
  return w;
}
/* k_bwd_final_wg's flat chunk (kda_final_wg.cu): the body's tiles it reads and writes, its
 * chunk's rows of the inter-chunk dKi (at RS floats a row) and its row count */
struct final_flat {
  const float *Gs, *dAs, *dLs, *bs, *rq, *rk;
  const sbf *qb, *kb;
  float *X, *dGs, *dKbs, *dKig;
  const sbf *dKib;                                 /* Q16: the inter-chunk dKi in bf16, else dKig's */
  float scale;
  int n, RS;
};
/* k_bwd_final_wg's G, dG and dKb tiles (SW): rows of 128 floats, the 16-byte chunk c of row r at
 * chunk c ^ s(r), s = (0, 2, 4, 6, 1, 3, 5, 7)[r mod 8]; the other forms' at pitch KS (r16(K) + 4).
 * At pitch KS the wgmma epilogues' float2 accesses (a half-warp: rows g .. g + 3, columns d0 ..
 * d0 + 7) were 2-way bank conflicts (rows 16 bytes apart mod 128): 8.4M of the kernel's 89.4M
 * shared wavefronts a launch (ncu s52a); a pitch of r16(K) + 8 clears them but puts the
 * stagings' float4 column walks (a quarter-warp: rows r .. r + 7, one chunk) at 2-way, and does
 * not fit. Under this swizzle (searched over XOR swizzles, benches/results/wip/2026-12-06s54.txt)
 * both patterns hit 32 distinct banks; a row's chunks stay in their 128-byte groups, so
 * row-contiguous accesses stay whole and a staged row's 128-byte lines land whole (at KS they
 * straddled two: the cp.async's excessive wavefronts), and the three tiles lose their pad.
 * H100, 2 runs of 3 rounds against the padded tiles (s55a, s55b): k_bwd_final_wg 45.6k -> 44.5k
 * cycles a block (staging 9.2k -> 8.2k, epilogues 8.4k -> 7.1k and 3.7k -> 3.0k; the gate chain
 * 3.9k -> 5.3k, not its swizzle arithmetic: that formed at compile time was no faster), fwd+bwd
 * (8,2048,16,128) 2.659-2.677 -> 2.649-2.669 ms, paired -0.1% to -0.7%; (1,8192,16,128)
 * 1.634-1.655 -> 1.621-1.655, 0 to -1.0%; the other shapes do not run it.
 * The swizzle in floats: d ^ fsw_mask(r) = ((d >> 2) ^ s(r)) << 2 | (d & 3); it depends on r mod 8
 * only, so where a thread's rows share their residue (the staging, the R terms, the wgmma
 * epilogues) the mask is formed once. */
static __device__ __forceinline__ int fsw_mask(int r) { return ((r << 3) & 24) | (r & 4); }
template <bool SW> static __device__ __forceinline__ int fsw_at(int r, int d, int KS) {
  if constexpr (SW) return (r << 7) + (d ^ fsw_mask(r));
  else return r * KS + d;
}
/* ph(s): the body's phase mark s (PH) */
template <int NF, bool Q16, class FP> static __device__ __forceinline__ void final_flat_wg(const final_flat &f, FP ph);
/* FR: the rows kernel's products of the compact K = V = 64 form, formed where they are read.
 * The rows kernel wrote dQ0 = dO S0^T, dKi0 = Vn dS^T (C x K, over V), dgn = rowsum_V(S0 . dS)
 * and dA = s tril(dO Vn^T) (C x C) to global memory, and this kernel staged them back in fp32
 * (49.2 KB a block); here their bf16 operands dO, Vn [C][VB], S0, dS [K][VB] (36.9 KB at C = K = V =
 * 64, VB = 72) are staged instead into X and dA's tiles (43.5 KB, contiguous in the compact
 * layout: no dL tile), which are free until the dGn phase. The products are the rows kernel's,
 * tile for tile (the same bf16 operands, the same k order), so the same fp32 values, bit for bit.
 * The rows kernel then forms dW alone (ROWS_FR), or the mat kernel forms it (kda_tc_bwd.cu's MW)
 * and no rows kernel runs. H100, one run, three rounds against main (2026-12-06s60b): graph
 * fwd+bwd (32,512,4,64) 0.433-0.436 -> 0.415-0.417 ms, (8,512,4,64) 0.130-0.131 -> 0.129-0.130;
 * ncu at (32,512,4,64): this kernel 180.5 us (the staging form's 153.7), the mat kernel 101.2
 * (92.5), the rows kernel's 49.0 gone. FR alone (the rows kernel forming dW; s60a, one round):
 * 0.436 -> 0.426 ms. */
static __device__ __forceinline__ void final_rows_stage(const kp &p, const ws &w, const void *dout, float *X, int cb,
                                                        int64_t h, int64_t t0, int n) {
  const int C = p.C, K16 = r16(p.K), V16 = r16(p.V), VB = V16 + 8;
  sbf *dO = (sbf *)X, *Vn = dO + C * VB, *S0 = Vn + C * VB, *dS = S0 + K16 * VB;
  const int64_t sr = ((int64_t)cb * p.HV + h) * p.K;   /* the chunk's states, in rows of V */
  cp_tile_bf16(S0, VB, K16, V16, (int)p.K, p.V, w.h, sr, 1, 0);
  cp_tile_bf16(dS, VB, K16, V16, (int)p.K, p.V, w.dh, sr, 1, 0);
  cp_tile_bf16(dO, VB, C, V16, n, p.V, dout, t0, p.HV, h);
  cp_tile_bf16(Vn, VB, C, V16, n, p.V, w.vn, t0, p.HV, h);
}
/* after the staging's barrier: dQ0 into the dG tile (as the staged copy was), dgn into dGn; dKi0
 * (into X's rows 32 ..) and dA (the compact tile's dA parts: row r's columns < ceil4(r + 1), zero
 * past r and on rows >= n, as staged) overwrite the operands, so a warp holds its two tiles of
 * each across a barrier. 256 threads (8 warps): warp w owns the 16 x 16 tiles at rows 16 (w / 4)
 * and 16 (w / 4 + 2), columns 16 (w % 4), of each C x 64 product */
static __device__ __forceinline__ void final_rows_products(const kp &p, const float *X, float *dAs, float *dGs,
                                                           float *dGn, float *Xd, int XS, int CS, int KS, int n) {
  const int C = p.C, K16 = r16(p.K), V16 = r16(p.V), VB = V16 + 8;
  const sbf *dO = (const sbf *)X, *Vn = dO + C * VB, *S0 = Vn + C * VB, *dS = S0 + K16 * VB;
  mma_ldm<NPB>(C, K16, bt{dO, VB, 1}, bt{S0, VB, 1}, V16, bt{}, bt{}, 0,
               pairs2([&](int i, int d, float x0, float x1) { st2f(dGs + i * KS + d, x0, x1, true); }));
  dgn_rows_b(dGn, p.K, p.V, S0, dS, VB);
  const int lane = threadIdx.x & 31, wq = threadIdx.x >> 5, g = lane >> 2, t2 = 2 * (lane & 3);
  const int i0[2] = {(wq >> 2) << 4, ((wq >> 2) + 2) << 4}, j0 = (wq & 3) << 4;
  float ck[2][2][4] = {}, ca[2][2][4] = {};
  ldm_acc<2, 2>(i0, j0, bt{Vn, VB, 1}, bt{dS, VB, 1}, V16, bt{}, bt{}, 0, ck);   /* dKi0 = Vn dS^T */
  ldm_acc<2, 2>(i0, j0, bt{dO, VB, 1}, bt{Vn, VB, 1}, V16, bt{}, bt{}, 0, ca);   /* dO Vn^T */
  __syncthreads();                                  /* every warp done with the operands */
#pragma unroll
  for (int u = 0; u < 2; u++)
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
#pragma unroll
      for (int rr = 0; rr < 2; rr++) {
        const int i = i0[u] + g + 8 * rr, j = j0 + 8 * hf + t2;
        *(float2 *)(Xd + i * XS + j) = make_float2(ck[u][hf][2 * rr], ck[u][hf][2 * rr + 1]);
        auto v = [&](int jj, float x) { return jj <= i && i < n ? p.scale * x : 0.f; };
        if (j < ((i + 4) & ~3))                     /* ceil4(i + 1): the dA part's 16-byte chunks */
          *(float2 *)(dAs + i * CS + j) = make_float2(v(j, ca[u][hf][2 * rr]), v(j + 1, ca[u][hf][2 * rr + 1]));
      }
}
/* PR (the precise backward): the factored off-diagonal blocks in P_3TF32. NF: the row count
 * fixed at compile time (loops and row checks fold), or 0: the chunk table's. WG (the fast wide
 * K = 128 form only, kda_final_wg.cu): a flat chunk's intra-chunk terms by final_flat_wg. FR
 * (the fast compact K = V = 64 form only, k_bwd_final_fr): the rows kernel's dQ0, dKi0, dgn
 * and dA formed here from dout and the state passes' bf16 copies (final_rows_products). Q16
 * (WG only): dQ0, dKi0 and dA come from the fused sweep in bf16 (w.dQb, w.dKib, w.dAb: half the bytes
 * of its stores and of this kernel's staging of them), staged as such into the first halves of
 * their fp32 tiles' rooms and widened there */
template <bool PR, bool CM, int KV, int NF, bool WG = false, bool FR = false, bool Q16 = false>
static __device__ __forceinline__ void bwd_final_tc(kp p, const void *q, const void *k, const void *g,
                                                    const void *beta, const float *A_log, const float *dt_bias,
                                                    void *dg, void *dbeta, void *dq_out, void *dk_out, ws w,
                                                    const void *dout = nullptr) {
  static_assert(!FR || (!PR && CM && KV == 64 && !WG), "FR: the fast compact K = V = 64 form");
  static_assert(!Q16 || WG, "Q16: the wgmma form's hand-off from the fused sweep");
  constexpr int PT = PR ? P_3TF32 : P_TF32;
  kv_fix<KV, CM ? 256 : NTC>(p);
  extern __shared__ __align__(16) float sm[];
  __shared__ float red[32];
  /* FR launches chunk-major (kda_cuda.cu): its grid is one wave or a few at the shapes it runs, and
   * the select of blk_chunk, blk_head took its spill loads 28 -> 56 bytes (ptxas) */
  const int cb = FR ? (int)blockIdx.x : blk_chunk(p), *ct = w.ctab + 4 * cb;
  const int n = NF ? NF : ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = FR ? (int)blockIdx.y : blk_head(p), K = p.K, HV = p.HV;
  int C = p.C, K16 = r16(K), KS = K16 + 4, CS = C + 4, tid = threadIdx.x;
  /* X's pitch: X is only ever a B operand read by scalar fragment loads (rows k0 + lane % 4,
   * columns j0 + lane / 4), which fall in 32 distinct banks at r16 + 8 (two-way conflicts at
   * KS = r16 + 4); the compact layout keeps KS (its 1.5 KB more would not let two blocks share
   * an SM). H200, (8,2048,16,128), with the element pass's loads below: the row and column
   * products 9.6k -> 9.0k and 7.5k -> 6.9k cycles a block, fwd+bwd 4.26-4.28 -> 4.23-4.24 ms */
  const int XS = CM ? KS : K16 + 8, QB = K16 + 8;   /* QB: the bf16 q, k rows' pitch (conflict-free pairs) */
  constexpr bool KBS = !CM;                         /* dKb (R') in shared memory */
  static_assert(!WG || KV == 128, "WG: K = 128 (the swizzled G, dG, dKb rows)");
  const int TP = WG ? 128 : KS;                     /* G, dG, dKb: a row's floats */
  auto T = [KS](int r, int d) { return fsw_at<WG>(r, d, KS); };
  /* WG's staging of G, dG or dKb: rows r < rows from rowp(r) (128 floats), the rest zero */
  auto cp_tile_sw = [&](float *dst, int rows, auto rowp) {   /* a warp a row, rows 16 apart: one mask */
    const int c = (tid & 31) << 2, co = c ^ fsw_mask(tid >> 5);
    for (int r = tid >> 5; r < C; r += NTC / 32) {
      const bool ok = r < rows;
      cp_async16(dst + (r << 7) + co, ok ? rowp(r) + c : rowp(0), ok);
    }
  };
  float *Gs = sm, *X = Gs + C * TP, *dAs = X + (C + 32) * XS, *dLs = dAs + C * CS, *bs = dLs + (CM ? 0 : C * CS),
        *dbi = bs + C, *dGn = dbi + C, *dGs = dGn + K16 + 32, *rq = dGs + C * TP, *rk = rq + C;
  sbf *qb = (sbf *)(rk + C), *kb = qb + C * QB;
  float *dKbs = (float *)(kb + C * QB), *At = dKbs + (KBS ? C * TP : 0);
  /* the l2-normalised q, k (the fp32 rows k_intra_tc formed, bit for bit) */
  auto qv = [&](int i, int d) { return __bfloat162float(qb[i * QB + d]) * rq[i]; };
  auto kv = [&](int i, int d) { return __bfloat162float(kb[i * QB + d]) * rk[i]; };
  auto v4 = [&](const sbf *t, const float *r, int i, int d) {   /* four columns d .. d + 3 */
    uint2 u = *(const uint2 *)(t + i * QB + d);
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    float f = r[i];
    return make_float4(a.x * f, a.y * f, b.x * f, b.y * f);
  };
  /* dL's row i (entries j < i): CM, in dA's tile, dl_row(i)[j] = dAs[(C-1-i) CS + ceil4(C-i) + j]
   * (smem_final_tc_compact; 16-byte aligned for the staging's copies) */
  auto dl_row = [&](int i) -> const float * { return CM ? dAs + (C - 1 - i) * CS + ((C - i + 3) & ~3) : dLs + i * CS; };
  /* the chunk's rows of the [T, HV, K] gradient scratch: row i, column d at i RS + d from its
   * first element, in 32-bit offsets (64-bit index products per element loaded the integer
   * pipe, this kernel's busiest: ncu ALU 35.8%) */
  const int RS = (int)(HV * K), RC = (int)HV * C;
  const int64_t g0 = ROWI(0) * K;
  float *dQg = w.dQ + g0, *dKig = w.dKi + g0, *dKbg = w.dKb + g0;
  const float *dA0 = w.dA + ROWI(0) * C, *dL0 = w.dL + ROWI(0) * C;
  /* the compact tile's staging, its dA parts (da) and / or its dL parts (dl): row r holds
   * dA[r][0..r] from column 0, dL[i][0..i-1] (i = C-1-r) from column ceil4(r + 1) (dl_row), both
   * in 16-byte copies: S = C/4 + 1 chunks a row hold both parts (r = 4a + b: a + 1 of dA,
   * C/4 - a - [b = 3] of dL). A part's last chunk may carry entries past its triangle
   * (dA[r][j > r], dL[i][j >= i]), into columns no reader takes. It was a 4-byte copy an
   * element: 16 a thread, each with its index division (5.6% of the kernel's instructions at
   * (32,512,4,64), ncu s58a). z: the zero-fill copies' (unread) source, each caller's own as
   * before the two loops were one, so that neither kernel's SASS moved (cae198e's one dummy
   * added 6 instructions to k_bwd_final_fr: benches/sass_local.sh) */
  auto stage_cm = [&](bool da, bool dl, const float *z) {
    const int S = C / 4 + 1;
    for (int e = tid; e < C * S; e += BT) {
      const int r = e / S, s = e % S, na = r / 4 + 1, i = C - 1 - r;
      if (da && s < na) {
        const bool ok = r < n;
        cp_async16(dAs + r * CS + 4 * s, ok ? dA0 + (r * RC + 4 * s) : z, ok);
      } else if (dl && s >= na && 4 * (s - na) < i) {
        const int j = 4 * (s - na);
        const bool ok = i < n;
        cp_async16(dAs + r * CS + 4 * na + j, ok ? dL0 + (i * RC + j) : z, ok);
      }
    }
  };
  /* q, k (bf16) and G (pad rows repeat the last G: exponents <= 0); the wide forms' dKb (the
   * mat kernel's) with them. FR (no dKb tile) issues it under its products, before it waits for
   * the mat kernel */
  auto stage_qkg = [&](bool al) {
    const int64_t hq = h / (HV / p.H);
    cp_tile_bf16(qb, QB, C, K16, n, K, q, t0, p.H, hq);
    cp_tile_bf16(kb, QB, C, K16, n, K, k, t0, p.H, hq);
    if constexpr (WG) {
      cp_tile_sw(dKbs, n, [&](int r) { return dKbg + r * RS; });
      cp_tile_sw(Gs, C, [&](int r) { return w.G + ROWI(r < n ? r : n - 1) * K; });
    } else {
      if constexpr (KBS) cp_tile_f32(dKbs, KS, C, K16, n, (int)K, al, [&](int r) { return dKbg + r * RS; });
      cp_tile_f32(Gs, KS, C, K16, C, (int)K, al, [&](int r) { return w.G + ROWI(r < n ? r : n - 1) * K; });
    }
  };
  PH_INIT(WG ? 6 : 5);                              /* k_bwd_final_wg: a row of its own (bwd_final_wg) */
  float *Xd = X + 32 * XS;                          /* the staged dKi, until the off-diagonal terms */
  {                                                 /* asynchronous staging, zero-filled */
    bool al = K % 4 == 0;
    if constexpr (FR) final_rows_stage(p, w, dout, X, cb, h, t0, n);
    else stage_qkg(al);
    if constexpr (CM) {
      if constexpr (!FR) stage_cm(true, true, w.dA);   /* FR: dA formed here, dL staged after it */
    } else {
      if constexpr (!Q16) cp_tile_f32(dAs, CS, C, C, n, C, true, [&](int i) { return w.dA + ROWI(i) * C; });
      cp_tile_f32(dLs, CS, C, C, n, C, true, [&](int i) { return w.dL + ROWI(i) * C; });
    }
    /* the inter-chunk dKi into X's rows 32 .. 32 + C (free until the off-diagonal terms) and
     * dgn into dGn: the dGn phase and the diagonal phase read them from here. They were global
     * loads after the staging, a latency of their own (the dGn phase 6.5k of 70.5k cycles a
     * block at (8,2048,16,128)) */
    if constexpr (Q16)                              /* bf16 [C][K] rows at the rooms' starts */
      for (int u = 0; u < 2; u++) {                 /* this thread's chunks: q16_own */
        const int r = (tid >> 4) + 32 * u, c = (tid & 15) << 3;
        const bool ok = r < n;
        cp_async16((sbf *)Xd + r * 128 + c, ok ? w.dKib + ROWI(r) * K + c : w.dKib, ok);
        cp_async16((sbf *)dGs + r * 128 + c, ok ? w.dQb + ROWI(r) * K + c : w.dQb, ok);
        if (!u) {                                   /* dA: [C][C] bf16, a chunk a thread */
          const int ra = tid >> 3, ca = (tid & 7) << 3;
          cp_async16((sbf *)dAs + ra * 64 + ca, ra < n ? w.dAb + ROWI(ra) * C + ca : w.dAb, ra < n);
        }
      }
    if constexpr (!FR) {
      if constexpr (!Q16) cp_tile_f32(Xd, XS, C, K16, n, (int)K, al, [&](int r) { return dKig + r * RS; });
      cp_tile_f32(dGn, K16, 1, K16, 1, (int)K, al, [&](int) { return w.dgn + ((int64_t)cb * HV + h) * K; });
    }
    /* the inter-chunk dQ0 (the rows kernel's dO S0^T) into the dG tile, free until the
     * intra-chunk terms: the diagonal phase (a flat chunk's row-term epilogue) reads it there
     * and leaves dQ in its place */
    if constexpr (WG) {
      if constexpr (!Q16) cp_tile_sw(dGs, n, [&](int r) { return dQg + r * RS; });
    }
    else if constexpr (!FR) cp_tile_f32(dGs, KS, C, K16, n, (int)K, al, [&](int r) { return dQg + r * RS; });
  }
  for (int r = tid; r < C; r += BT) {
    float2 f = r < n ? w.rn[ROWI(r)] : make_float2(0.f, 0.f);
    bs[r] = r < n ? w.b[ROWI(r)] : 0.f, rq[r] = f.x, rk[r] = f.y;
    if constexpr (!FR) dbi[r] = r < n ? w.db[ROWI(r)] : 0.f;   /* the mat kernel's dbeta part (FR: below) */
  }
  cp_async_wait_all();
  /* Q16: the bf16 rows widened in place behind the staging's barrier. A thread reads back the
   * 16-byte chunks its own copies wrote (landed for it at its own wait: dKi0's and dQ0's rows r,
   * r + 32 at columns c .. c + 7, dA's row tid / 8; a warp's reads contiguous), the staging's
   * barrier orders every read before any write, and it writes the same elements in fp32 where
   * the fp32 staging put them (dQ0 in the dG tile's swizzled rows, dKi0 at X's pitch, dA at
   * CS), in two float4 stores a chunk whose order alternates by lane (lanes 4 .. 7 of a quarter
   * warp the high half first: its eight stores then fill the 32 banks once). Rows past n were
   * zero-filled. The dGn phase reads Xd from its start: one barrier after the writes. A
   * widening pass of its own (a thread 16 values of a row, 2- and 4-way bank conflicts, two
   * barriers) took 2.3k cycles a block (H100, s66a: the staging phase 8.4k -> 10.7k,
   * k_bwd_final_wg 825.8 -> 871.7 us); this form none measurable (s66b: 8.31k -> 8.36k) */
  [[maybe_unused]] uint4 q16_own[2][2], a16_own;   /* [tile: dKi0, dQ0][u]; dA's */
  if constexpr (Q16) {
    static_assert(!Q16 || (KV == 128 && NTC == 512), "Q16: K = 128, 512 threads");
    for (int u = 0; u < 2; u++) {
      const int r = (tid >> 4) + 32 * u, c = (tid & 15) << 3;
      q16_own[0][u] = *(const uint4 *)((const sbf *)Xd + r * 128 + c);
      q16_own[1][u] = *(const uint4 *)((const sbf *)dGs + r * 128 + c);
    }
    a16_own = *(const uint4 *)((const sbf *)dAs + (tid >> 3) * 64 + ((tid & 7) << 3));
  }
  __syncthreads();
  if constexpr (Q16) {
    const int hi1 = (tid >> 2) & 1;                 /* store the high half first */
    /* a chunk x (8 bf16 of columns c ..) widened to at(c) .., at(c + 4) .., in bank order */
    auto put8 = [hi1](auto at, int c, uint4 x) {
      const float4 lo = bf4(make_uint2(x.x, x.y)), hi = bf4(make_uint2(x.z, x.w));
      *(float4 *)at(c + 4 * hi1) = hi1 ? hi : lo;
      *(float4 *)at(c + 4 - 4 * hi1) = hi1 ? lo : hi;
    };
    for (int u = 0; u < 2; u++) {
      const int r = (tid >> 4) + 32 * u, c = (tid & 15) << 3;
      put8([&](int d) { return Xd + r * XS + d; }, c, q16_own[0][u]);
      put8([&](int d) { return dGs + T(r, d); }, c, q16_own[1][u]);
    }
    put8([&](int d) { return dAs + (tid >> 3) * CS + d; }, (tid & 7) << 3, a16_own);   /* dA: row tid / 8 */
    __syncthreads();                                /* Xd whole for the dGn phase */
  }
  if constexpr (FR) {
    /* q, k, G after the products' operands have landed, so that those land alone (the staging
     * took all of them at once, and the products waited for the last byte) and these land while
     * the products run; nothing in the products reads them. The dGn phase reads G first */
    stage_qkg(K % 4 == 0);
    cp_async_commit();
    final_rows_products(p, X, dAs, dGs, dGn, Xd, XS, CS, KS, n);
    /* what the mat kernel wrote from here on (dL, dbeta's part, dKb): launched programmatically
     * (kda_cuda.cu use_pdl), this grid ran the above beside that kernel's last blocks */
    pdl_wait();
    for (int r = tid; r < C; r += BT) dbi[r] = r < n ? w.db[ROWI(r)] : 0.f;   /* the R terms add theirs */
    stage_cm(false, true, w.dL);                    /* dL's rows into dA's tile, landing while the dGn phase runs */
    cp_async_commit();
    cp_async_wait_group<1>();                       /* q, k, G (dL may fly) */
    __syncthreads();                                /* dKi0, dA, dgn written; the bf16 tiles dead */
  }
  PH(0);
  {                                                 /* dGn with the inter-chunk dKi (before intra) */
    /* rows split in 16-row groups, one thread per (group, column) (all the block's threads);
     * the group sums go to X's first rows and are added in group order. The staged dKi is
     * the rows kernel's Vn dS^T: its factor e^{Gn - G} is applied here, in place, for the
     * phases after this one too (the rows kernel stages no G; a pass of its own over the
     * tile cost ~1.6k cycles a block at (8,2048,16,128)); dQ's s e^G in the diagonal phase */
    int ng = (n + 15) / 16;
    for (int e = tid; e < ng * (int)K; e += BT) {
      int r0 = (e / (int)K) * 16, d = e % (int)K;
      float x[16], acc = 0, gl = Gs[T(n - 1, d)];
#pragma unroll
      for (int u = 0; u < 16; u++) {               /* zero past n (G's pad rows repeat the last) */
        x[u] = Xd[(r0 + u) * XS + d] * kexp(gl - Gs[T(r0 + u, d)]);
        Xd[(r0 + u) * XS + d] = x[u];
      }
#pragma unroll
      for (int u = 0; u < 16; u++)
        if (r0 + u < n) acc += kv(r0 + u, d) * x[u];
      X[(r0 / 16) * XS + d] = acc;
    }
    __syncthreads();
    for (int d = tid; d < K; d += BT) {
      float acc = kexp(Gs[T(n - 1, d)]) * dGn[d];   /* dGn holds dgn, staged */
      for (int gq = 0; gq < ng; gq++) acc += X[gq * XS + d];
      dGn[d] = acc;
    }
  }
  PH(1);                                            /* (the diagonal phase reads none of dGn, X) */
  if constexpr (FR) {                               /* dL landed */
    cp_async_wait_all();
    __syncthreads();
  }
  /* k_bwd_final_wg: a flat chunk (kda_tc.cuh's chunk_flat, after the dGn phase's reads of X)
   * takes the intra-chunk terms below as whole-chunk products on warpgroup MMAs, PH(2) .. PH(6)
   * its stages; a steep one the per-block form, in the same launch */
  bool flat = false;
  if constexpr (WG) {
    flat = chunk_flat_at(Gs, T, n, (int)K);
    if (flat)
      final_flat_wg<NF, Q16>(final_flat{Gs, dAs, dLs, bs, rq, rk, qb, kb, X, dGs, dKbs, dKig,
                                        Q16 ? (const sbf *)w.dKib + g0 : nullptr, p.scale, n, RS},
                        [&](int s) { PH(s); });
  }
  if (!flat) {
    /* inter parts of dG (into the dG tile) fused with the diagonal blocks (unfactored: any
     * decay). A thread owns one column d of one 16-row block: G and k of its 16 rows in
     * registers, each pair's e^{G_i - G_j} formed once and used twice, as row i's term
     * (dq_intra, R) and as column j's (dk_col); dA, dL are broadcast loads. Sums run in the
     * same order as one element at a time (j up for a row, i up for a column). It was a thread
     * per element recomputing each pair's exponent for the row and for the column terms and
     * reloading G, k per pair: 31% of the kernel. */
    for (int e = tid; e < (C / 16) * (int)K; e += BT) {
      int I0 = (e / (int)K) * 16, d = e % (int)K;
      if (I0 >= n) continue;
      float gr[16], kr[16], dqi[16], R[16], col[16], ex[16];
#pragma unroll
      for (int i = 0; i < 16; i++)
        gr[i] = Gs[T(I0 + i, d)], kr[i] = kv(I0 + i, d), dqi[i] = R[i] = col[i] = 0.f;
#pragma unroll
      for (int i = 0; i < 16; i++) {
        if (I0 + i >= n) break;                       /* rows past the chunk: nothing to add */
        const float *dAr = dAs + (I0 + i) * CS + I0, *dLr = dl_row(I0 + i) + I0;
        float qi = qv(I0 + i, d), bki = bs[I0 + i] * kr[i];
        /* ex[j] = e^{G_i - G_j}: row i - 1's times the step's decay e^{G_i - G_(i-1)}, one
         * exponential a row instead of one a pair (136 MUFU.EX2 a thread); at most 15 roundings,
         * ~1e-6 relative, where e^{G_i - G_j} of the cumsums carries |G| 2^-24 in its exponent */
        float ai = i ? kexp(gr[i] - gr[i - 1]) : 1.f;
#pragma unroll
        for (int j = 0; j < i; j++) ex[j] *= ai;
        ex[i] = 1.f;
#pragma unroll
        for (int j = 0; j <= i; j++) {
          float E = ex[j], kj = kr[j] * E, a = dAr[j];
          dqi[i] += a * kj;
          if (j < i) {
            float l = dLr[j];
            R[i] += l * kj;
            col[j] += (a * qi + l * bki) * E;
          } else
            col[j] += (a * qi + 0.f) * E;
        }
      }
      /* EB elements' global loads in flight (their stores, which might alias, end a group): 8 in
       * the compiled wide forms (2 round trips a thread instead of 4; no spills), 4 in the compact
       * and run-time ones (at 8 their 128 registers a thread spill). With X's pitch below, H200,
       * (8,2048,16,128): this phase 15.3k -> 13.7k cycles a block (benches/results/2026-12-03b,e) */
      constexpr int EB = CM || !KV ? 4 : 8;
#pragma unroll
      for (int i0 = 0; i0 < 16; i0 += EB) {
        float dkb[EB];
        if constexpr (!KBS)
#pragma unroll
          for (int u = 0; u < EB; u++)
            if (I0 + i0 + u < n) dkb[u] = dKbg[(I0 + i0 + u) * RS + d];
#pragma unroll
        for (int u = 0; u < EB; u++) {
          int i = i0 + u;
          if (I0 + i >= n) break;
          int gi = (I0 + i) * RS + d;
          float eg = kexp(Gs[T(I0 + i, d)]),
                dki = Xd[(I0 + i) * XS + d];     /* reloaded: gr, kr die after the pair loop */
          float dq = p.scale * dGs[T(I0 + i, d)] * eg;   /* the inter-chunk dQ: s (dO S0^T) e^G */
          /* dQ, in the dG tile until the R terms (the row terms add into it there; the R terms
           * read it for dq's l2-norm backward and form dG = q dQ - k dKi + k b R'): it went out
           * to global memory here, was read back and rewritten by the row terms and read again by
           * the R terms, the dG tile taking the q and k parts on the way. H100, one run, two
           * rounds against main (s57g): graph fwd+bwd (32,512,4,64) 0.450-0.452 -> 0.439 ms,
           * (8,512,4,64) 0.133 -> 0.131; the large shapes (flat chunks: kda_final_wg.cu, which
           * did the same first, s57e) equal. Every k_bwd_final_tc form spills less (ptxas: the
           * compact K = 64 one 8 / 4 -> 0 / 0 bytes) */
          dGs[T(I0 + i, d)] = dq + dqi[i];
          if constexpr (KBS) {                        /* R' = R + dKb e^G: see the R terms */
            float *r = dKbs + T(I0 + i, d);
            *r = R[i] + *r * eg;
          } else
            dKbg[gi] = R[i] + dkb[u] * eg;
          dKig[gi] = dki + col[i];
        }
      }
    }
    __syncthreads();                                  /* the staged dKi (X's rows) read above */
    PH(2);
    /* Off-diagonal terms, in factored products (kda_tc.cuh). Every block's operands are staged
     * before one barrier and its products follow with none between them (their outputs are
     * disjoint rows), and each epilogue's global loads are issued before its tile's MMAs (L):
     * it was a barrier pair, a product and its read-modify-write per block, the loads after the
     * MMAs. H200, one run against the per-block form: fwd+bwd (8,2048,16,128) 5.02 -> 4.97 ms,
     * precise 9.40 -> 9.31, this kernel 80.9k -> 78.4k cycles a block.
     * Row terms: block I (rows r = 16 I ..) against columns j < r, factored around row r; X_I =
     * k_j e^{G_r - G_j} in X's rows xo(I) = 8 I (I - 1) .. + r (96 rows in all at C = 64: X's
     * C + 32). The previous barrier (after the diagonal blocks) and the one below order X and
     * dG. */
    /* The fast form's operands are rounded to tf32 where written (X, and dA, dL in place once
     * the diagonal blocks have read them at fp32) and the products take them by ldmatrix
     * (mma_tf) instead of a scalar load and a cvt each (mma_blk4): the same values in the same
     * k order, so the same sums. The compact layout's dL rows (reversed, in dA's tile) go to
     * ldmatrix by a row pointer each (tftp: their runs start 16-byte aligned, dl_row). The
     * column terms' A (dA, dL transposed: ldmatrix cannot transpose 32-bit values) is staged per
     * group into At (final_at_cols). The compact form's column terms by mma_blk4 before: H200,
     * one run (2026-12-02s30e), at (8,512,4,64) this kernel 50.4 -> 47.6 us (its column products
     * 13.5k -> 6.4k cycles a block), graph (32,512,4,64) 0.450 -> 0.443 ms, (8,512,4,64) 0.145 ->
     * 0.144. The compact row terms by tftp, with the compact staging in 16-byte copies, dQ0 in the
     * dG tile and the K = 64 R terms two rows a warp (the forty-fifth pass's stack): H100, one
     * run, three rounds against the kernels before (2026-12-06s59a), at (32,512,4,64) the row
     * products 9.9k -> 6.9k cycles a block, the kernel 66.1k -> 63.5k (162.6 -> 153.7 us, ncu),
     * graph fwd+bwd 0.437-0.439 -> 0.433-0.437 ms, (8,512,4,64) 0.131 -> 0.129-0.130 */
    constexpr bool LDM = !PR;
    auto rnd4 = [](float4 v) { return LDM ? make_float4(tf32r(v.x), tf32r(v.y), tf32r(v.z), tf32r(v.w)) : v; };
    const int nI = (n + 15) / 16;                     /* blocks with rows; I < nI have row terms */
    auto xo = [](int I) { return 8 * I * (I - 1); };
    for (int I = 1; I < nI; I++) {
      int r = 16 * I;
      float *XI = X + xo(I) * XS;
      for (int e = tid; e < r * (K16 / 4); e += BT) {   /* four columns at a time (float4) */
        int j = e / (K16 / 4), d = (e % (K16 / 4)) * 4;
        float4 kj = v4(kb, rk, j, d), gr = *(const float4 *)(Gs + T(r, d)),
               gj = *(const float4 *)(Gs + T(j, d));
        *(float4 *)(XI + j * XS + d) = rnd4(make_float4(kj.x * kexp(gr.x - gj.x), kj.y * kexp(gr.y - gj.y),
                                                        kj.z * kexp(gr.z - gj.z), kj.w * kexp(gr.w - gj.w)));
      }
    }
    if constexpr (LDM)                                /* dA, dL from here MMA operands only (tf32) */
      for (int e = tid; e < (CM ? 1 : 2) * C * CS / 4; e += BT) *(float4 *)(dAs + 4 * e) = rnd4(*(const float4 *)(dAs + 4 * e));
    __syncthreads();
    PH(3);
    for (int I = 1; I < nI; I++) {
      int r = 16 * I;
      const float *XI = X + xo(I) * XS;
      /* a tile's 4 outputs: rows ii, ii+8 of one half (dQ rows, then dKb rows), columns d0, d0+1 */
      auto at = [&](int ii, int d0) { return epi4_at(r + (ii & 15), d0, n, K, [&](int i) { return (int64_t)i; }); };
      struct pre4 { float a[4]; };
      auto xb = [&](int j, int d) { return XI[j * XS + d]; };
      auto epi = [&](int ii, int d0, float c0, float c1, float c2, float c3, const pre4 &pf) {
        float x[4] = {c0, c1, c2, c3};
        const epi4 e = at(ii, d0);
        /* a row's two columns (u, u + 1) in one store (pairs2): dQ's in the dG tile, dKb's */
#pragma unroll
        for (int u = 0; u < 4; u += 2)
          if (e.ok[u]) {
            bool n1 = e.ok[u + 1];
            int si = T(e.r[u], d0);                  /* (d0 even: si + 1 is its pair) */
            float2 gi = ld2f(Gs + si, n1), gr = ld2f(Gs + T(r, d0), n1);
            float y0 = x[u] * kexp(gi.x - gr.x), y1 = x[u + 1] * kexp(gi.y - gr.y);
            float *dst = ii < 16 ? dGs + si : KBS ? dKbs + si : dKbg + e.r[u] * RS + d0;
            st2f(dst, pf.a[u] + y0, pf.a[u + 1] + y1, n1);
          }
      };
      auto pre = [&](int ii, int d0) {
        const epi4 e = at(ii, d0);
        pre4 pf;
#pragma unroll
        for (int u = 0; u < 4; u += 2)
          if (e.ok[u]) {
            const float *src =
                ii < 16 ? dGs + T(e.r[u], d0) : KBS ? dKbs + T(e.r[u], d0) : dKbg + e.r[u] * RS + d0;
            float2 v = ld2f(src, e.ok[u + 1]);
            pf.a[u] = v.x, pf.a[u + 1] = v.y;
          }
        return pf;
      };
      if constexpr (LDM && !CM)   /* rows 0-15 dA's, 16-31 dL's (M = 32: the third range is never read) */
        mma_tf(32, K16, r, tft3{dAs + r * CS, dLs + r * CS, dLs + r * CS, CS, 16, 32}, xb, epi, pre);
      else if constexpr (LDM) {   /* the compact tile: dA's rows, then dL's (reversed, each from its own column) */
        auto rowp = [&](int ii) { return ii < 16 ? dAs + (r + ii) * CS : dl_row(r + ii - 16); };
        mma_tf(32, K16, r, tftp<decltype(rowp)>{rowp}, xb, epi, pre);
      }
      else
        mma_blk4<PT>(
            32, K16, r, [&](int ii, int j) { return ii < 16 ? dAs[(r + ii) * CS + j] : dl_row(r + ii - 16)[j]; }, xb,
            epi, pre);
    }
    PH(4);
    /* Column terms: block J against rows i > r' = 16 J + 15, factored around r'; X_J = [q_i ;
     * b_i k_i] e^{G_i - G_r'} (2 m16 rows). Blocks go in groups whose X_J fit X's C + 32 rows
     * together (at C = 64: {0}, {1, 2}). */
    auto m16of = [&](int J) { return r16(n - 16 * J - 16); };
    for (int J0 = 0, J1; J0 < nI - 1; J0 = J1) {
      int atcols;                                     /* <= final_at_cols(C): At holds the group's A tiles */
      J1 = col_group(J0, n, C, &atcols);
      __syncthreads();                                /* the previous products' reads of X (and A) done */
      for (int J = J0, xoff = 0, aoff = 0; J < J1; xoff += 2 * m16of(J), aoff += 16 * (2 * m16of(J) + 4), J++) {
        int rp = 16 * J + 15, mrow = n - rp - 1, m16 = m16of(J);
        float *XJ = X + xoff * XS;
        for (int e = tid; e < m16 * (K16 / 4); e += BT) {
          int ii = e / (K16 / 4), d = (e % (K16 / 4)) * 4, i = rp + 1 + ii;
          float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
          if (ii < mrow) {
            float4 gi = *(const float4 *)(Gs + T(i, d)), gr = *(const float4 *)(Gs + T(rp, d)),
                   qi = v4(qb, rq, i, d), ki = v4(kb, rk, i, d);
            float b = bs[i];
            float4 sc = make_float4(kexp(gi.x - gr.x), kexp(gi.y - gr.y), kexp(gi.z - gr.z), kexp(gi.w - gr.w));
            x0 = rnd4(make_float4(qi.x * sc.x, qi.y * sc.y, qi.z * sc.z, qi.w * sc.w));
            x1 = rnd4(make_float4(b * ki.x * sc.x, b * ki.y * sc.y, b * ki.z * sc.z, b * ki.w * sc.w));
          }
          *(float4 *)(XJ + ii * XS + d) = x0, *(float4 *)(XJ + (m16 + ii) * XS + d) = x1;
        }
        if (LDM)                                      /* A_J = [dA^T | dL^T] of rows i > r', tf32 */
          for (int e = tid; e < 32 * m16; e += BT) {
            int k = e >> 4, jj = e & 15, j = 16 * J + jj;
            float a = k < m16 ? (k < mrow ? dAs[(rp + 1 + k) * CS + j] : 0.f)
                              : (k - m16 < mrow ? dl_row(rp + 1 + k - m16)[j] : 0.f);
            At[aoff + jj * (2 * m16 + 4) + k] = a;   /* tf32 already (LDM) */
          }
      }
      __syncthreads();
      PH(5);
      for (int J = J0, xoff = 0, aoff = 0; J < J1; xoff += 2 * m16of(J), aoff += 16 * (2 * m16of(J) + 4), J++) {
        int rp = 16 * J + 15, mrow = n - rp - 1, m16 = m16of(J);
        const float *XJ = X + xoff * XS;
        auto at = [&](int jj, int d0) { return epi4_at(16 * J + jj, d0, n, K, [&](int j) { return (int64_t)j; }); };
        struct pre4 { float a[4]; };
        auto xb = [&](int k, int d) { return XJ[k * XS + d]; };
        auto epi = [&](int jj, int d0, float c0, float c1, float c2, float c3, const pre4 &pf) {
          float x[4] = {c0, c1, c2, c3};
          const epi4 e = at(jj, d0);
#pragma unroll
          for (int u = 0; u < 4; u += 2)              /* a row's two columns in one global store */
            if (e.ok[u]) {
              bool n1 = e.ok[u + 1];
              int sj = T(e.r[u], d0);
              float2 gr = ld2f(Gs + T(rp, d0), n1), gj = ld2f(Gs + sj, n1);
              float y0 = x[u] * kexp(gr.x - gj.x), y1 = x[u + 1] * kexp(gr.y - gj.y);
              st2f(dKig + e.r[u] * RS + d0, pf.a[u] + y0, pf.a[u + 1] + y1, n1);
            }
        };
        auto pre = [&](int jj, int d0) {
          const epi4 e = at(jj, d0);
          pre4 pf;
#pragma unroll
          for (int u = 0; u < 4; u += 2)
            if (e.ok[u]) {
              float2 v = ld2f(dKig + e.r[u] * RS + d0, e.ok[u + 1]);
              pf.a[u] = v.x, pf.a[u + 1] = v.y;
            }
          return pf;
        };
        if (LDM) mma_tf(16, K16, 2 * m16, tft{At + aoff, 2 * m16 + 4}, xb, epi, pre);
        else
          mma_blk4<PT>(16, K16, 2 * m16,
                       [&](int jj, int k) {
                         int j = 16 * J + jj;
                         if (k < m16) return k < mrow ? dAs[(rp + 1 + k) * CS + j] : 0.f;
                         k -= m16;
                         return k < mrow ? dl_row(rp + 1 + k)[j] : 0.f;
                       },
                       xb, epi, pre);
      }
      PH(6);
    }
  }
  __syncthreads();
  int lane = tid & 31, wp = tid >> 5;
  /* The gate chain's inputs land while the R terms run, where the chain read them from global
   * memory (its A_log and dt_bias loads, then a load latency each batch of eight g rows): the
   * raw g rows (bf16 [C][KV], 16-byte copies) and the head's dt_bias row (gx) in X's rows C ..
   * C + 31 (free from here: the R terms read X's rows < n only; 32 XS >= 32 (KV + 4) floats
   * hold the C KV / 2 + KV at C = 64), A_log in red[31] (block_sum, after the chain, uses red[0 ..
   * BT / 32)). Zero-filled copies where a pointer is NULL (their source then w.gpart's). H100,
   * one run, two rounds (2026-12-07s68a), with a steep softplus gate (kda_bench KDA_BENCH_GATE=2)
   * at (8,2048,16,128): k_bwd_final_wg 1187.5 -> 1135.3 us (ncu), fwd+bwd 2.792 / 2.806 -> 2.718
   * / 2.771 ms; graph (32,512,4,64) 0.476 / 0.477 -> 0.473 / 0.473, (8,512,4,64) 0.146 -> 0.144 */
  auto gtile = [&] { return (sbf *)(X + C * XS); };   /* the g rows [C][KV] */
  float *gx = X + C * XS + C * KV / 2;             /* dt_bias [KV]: after the g tile */
  static_assert(NTC / 32 < 32, "red[31] holds A_log (the compiled K: NTC or 256 threads, kv_fix)");
  if constexpr (KV > 0)
    if (p.gate_mode) {
      if (al16(g))
        for (int e = tid; e < KV * 8; e += BT) {   /* C = 64 rows of KV / 8 16-byte chunks */
          const int r = e / (KV / 8), c = (e % (KV / 8)) * 8;
          const bool ok = r < n;
          cp_async16(gtile() + r * KV + c, (const sbf *)g + (ok ? ((t0 + r) * HV + h) * K + c : 0), ok);
        }
      if (tid < KV) cp_async4(gx + tid, dt_bias ? dt_bias + h * K + tid : w.gpart, dt_bias);
      if (tid == KV) cp_async4(red + 31, A_log ? A_log + h : w.gpart, A_log);
    }
  /* R terms with Kb's own gradient: R' = R + dKb e^G (the diagonal phase folded it in), and Kb =
   * b k e^G gives dk += b e^G dKb, dG += b k e^G dKb, dbeta += k e^G . dKb, so dk += b R',
   * dG += k b R', dbeta += k . R' (k_bwd_mat_tc's dbeta has the rest).
   * dq_out, dk_out (H == HV, K <= 128: a lane's 4 columns are the row's all): the row's dKi is
   * final here and its dQ since the row products, so their l2-norm backward (k_qk_bwd's: y = x r
   * gives dx = r dy - r^3 (dy . x) x, x the raw row, r its factor) runs here and dq, dk go out
   * in bf16; dQ, dKi in fp32 went to k_qk_bwd, which read them back with the raw q, k. The sums
   * run in another order than k_qk_bwd's (the compiled-K form: a lane's chunks, then eight lanes;
   * the any-K form: lanes strided by 32). */
  if constexpr (KV > 0) {
    /* The compiled K (64, 128): eight lanes a row, a lane U = K / 32 16-byte chunks of it
     * (columns 4 (ln + 8 u) ..), four rows a warp at once, so a 512-thread block takes its 64
     * rows in one pass (two at 256 threads). A quarter warp reads one row's 128 bytes of each
     * fp32 tile (32 banks once), a row's sums take three shuffles, and dq, dk go out 8 bytes a
     * lane. A warp's rows q = lane / 8 are i0 + (0, 4, 1, 5)[q]: a half warp's two rows of the
     * bf16 q, k tiles (8-byte loads) then sit 16 banks apart. The form below (a lane a column
     * of 32, a warp's rows one after another, 4 of them at K = 128) left this phase waiting on
     * each row's loads and five-shuffle sums in turn. H100, one run, three rounds against main
     * (2026-12-07s67a): at (8,2048,16,128) this phase 6.7k -> 3.8k cycles a block,
     * k_bwd_final_wg 808.8 -> 751.4 us (ncu), fwd+bwd 2.184-2.199 -> 2.137-2.144 ms; the FR
     * kernel's at (8,512,4,64) 8.3k -> 5.6k (85.7k -> 83.4k), the small shapes' graphs equal. */
    constexpr int U = KV / 32;
    const int ln = lane & 7, q = lane >> 3;
    for (int i0 = 8 * (wp >> 1) + 2 * (wp & 1); i0 < n; i0 += 4 * BT / 32) {
      const int i = i0 + 4 * (q & 1) + (q >> 1);
      const bool live = i < n;
      const float b = live ? bs[i] : 0.f, fq = live ? rq[i] : 0.f, fk = live ? rk[i] : 0.f;
      const int tb = WG ? (i << 7) + ((4 * ln) ^ fsw_mask(i)) : i * KS + 4 * ln;   /* T(i, 4 ln) */
      float4 R[U], dk[U], dw[U], y[U];
      float4 kx[U], qx[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int c = 4 * ln + 32 * u, gi = i * RS + c;
        const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
        R[u] = !live ? z : KBS ? *(const float4 *)(dKbs + tb + 32 * u) : *(const float4 *)(dKbg + gi);
        dk[u] = !live ? z : flat ? *(const float4 *)(X + i * XS + c) : *(const float4 *)(dKig + gi);
        dw[u] = !live ? z : *(const float4 *)(dGs + tb + 32 * u);   /* the dG tile holds dQ until here */
        kx[u] = live ? bf4(*(const uint2 *)(kb + i * QB + c)) : z;   /* raw rows */
        qx[u] = live ? bf4(*(const uint2 *)(qb + i * QB + c)) : z;
      }
      float acc = 0, dot = 0, dotq = 0;
#pragma unroll
      for (int u = 0; u < U; u++) {
        const float *Ru = &R[u].x, *dku = &dk[u].x, *dwu = &dw[u].x, *ku = &kx[u].x, *qu = &qx[u].x;
        float yu[4], gu[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float kn = ku[e] * fk, qn = qu[e] * fq;
          yu[e] = dku[e] + b * Ru[e];
          dot += yu[e] * ku[e], dotq += dwu[e] * qu[e];
          /* dG = q dQ - k dKi + k b R', dKi the row's total before R' (the diagonal, column terms') */
          gu[e] = qn * dwu[e] - kn * dku[e] + kn * b * Ru[e];
          acc += kn * Ru[e];
        }
        y[u] = make_float4(yu[0], yu[1], yu[2], yu[3]);
        if (live) {
          const int gi = i * RS + 4 * ln + 32 * u;
          *(float4 *)(dGs + tb + 32 * u) = make_float4(gu[0], gu[1], gu[2], gu[3]);
          if (!dk_out) *(float4 *)(dKig + gi) = y[u], *(float4 *)(dQg + gi) = dw[u];   /* for k_qk_bwd */
        }
      }
      acc = lane_group_sum<8>(acc), dot = lane_group_sum<8>(dot), dotq = lane_group_sum<8>(dotq);
      if (!ln && live) dbi[i] += acc;
      if (dk_out && live) {
        const float ck = fk * fk * fk * dot, cq = fq * fq * fq * dotq;
#pragma unroll
        for (int u = 0; u < U; u++) {
          const float *yu = &y[u].x, *dwu = &dw[u].x, *ku = &kx[u].x, *qu = &qx[u].x;
          float ok[4], oq[4];
#pragma unroll
          for (int e = 0; e < 4; e++) {
            ok[e] = p.l2 ? fk * yu[e] - ck * ku[e] : yu[e];
            oq[e] = p.l2 ? fq * dwu[e] - cq * qu[e] : dwu[e];
          }
          const int64_t gi = g0 + i * RS + 4 * ln + 32 * u;
          *(uint2 *)((sbf *)dk_out + gi) = make_uint2(pk_bf2(ok[0], ok[1]), pk_bf2(ok[2], ok[3]));
          *(uint2 *)((sbf *)dq_out + gi) = make_uint2(pk_bf2(oq[0], oq[1]), pk_bf2(oq[2], oq[3]));
        }
      }
    }
  } else {
    /* WG: the rows wp + 16 k share their swizzle mask (fsw_mask): a lane's columns lane + 32 u sit
     * at row offset sx + 32 u */
    const int sx = WG ? lane ^ fsw_mask(wp) : 0;
    auto TR = [&](int i, int d) { return WG ? (i << 7) + sx + (d - lane) : T(i, d); };
    /* LW lanes a row: 16 at the compiled K = 64 (a lane's 4 columns ln + 16 u), two rows a warp
     * with their loads in flight together; at 32 lanes a row half of them idled and a warp's
     * rows waited one after another on their global loads (dKb, dKi) */
    constexpr int LW = KV == 64 ? 16 : 32, RW = 32 / LW;
    const int ln = lane % LW;
    auto rsum = [](float v) { return LW == 32 ? kc_warp_sum(v) : lane_group_sum<LW>(v); };
    for (int i0 = wp * RW; i0 < n; i0 += (BT / 32) * RW) {
      const int i = i0 + lane / LW;
      const bool live = i < n;
      float acc = 0, b = live ? bs[i] : 0.f, dot = 0, dotq = 0, y[4], yq[4];
      for (int d0 = ln; d0 < K; d0 += 4 * LW) {      /* 4 columns' loads in flight, same order */
        float R[4], dk[4], dw[4];
  #pragma unroll
        for (int u = 0; u < 4; u++) {
          int d = d0 + LW * u;
          int gi = i * RS + d;
          if (live && d < K) R[u] = KBS ? dKbs[TR(i, d)] : dKbg[gi], dk[u] = flat ? X[i * XS + d] : dKig[gi], dw[u] = dGs[TR(i, d)];
          if (dk_out && live && d < K) yq[u] = dw[u];   /* the dG tile holds dQ until here */
        }
  #pragma unroll
        for (int u = 0; u < 4; u++) {
          int d = d0 + LW * u;
          if (!live || d >= K) break;
          int gi = i * RS + d;
          float kn = kv(i, d);
          y[u] = dk[u] + b * R[u];
          if (dk_out) dot += y[u] * __bfloat162float(kb[i * QB + d]), dotq += yq[u] * __bfloat162float(qb[i * QB + d]);
          else dKig[gi] = y[u];
          if (!dk_out) dQg[gi] = dw[u];              /* for k_qk_bwd */
          /* dG = q dQ - k dKi + k b R', dKi the row's total before R' (the diagonal, column terms') */
          dGs[TR(i, d)] = qv(i, d) * dw[u] - kn * dk[u] + kn * b * R[u];
          acc += kn * R[u];
        }
      }
      acc = rsum(acc);
      if (!ln && live) dbi[i] += acc;
      if (dk_out) {
        const int gi0 = i * RS;
        float fk = live ? rk[i] : 0.f, ck = fk * fk * fk * rsum(dot), fq = live ? rq[i] : 0.f, cq = fq * fq * fq * rsum(dotq);
  #pragma unroll
        for (int u = 0; u < 4; u++) {
          int d = ln + LW * u;
          if (!live || d >= K) break;
          stb(dk_out, g0 + (gi0 + d), p.l2 ? fk * y[u] - ck * __bfloat162float(kb[i * QB + d]) : y[u]);
          stb(dq_out, g0 + (gi0 + d), p.l2 ? fq * yq[u] - cq * __bfloat162float(qb[i * QB + d]) : yq[u]);
        }
      }
    }
  }
  if (KV > 0 && p.gate_mode) cp_async_wait_all();  /* the chain's staged inputs */
  __syncthreads();
  PH(7);
  /* reverse cumsum + gate chain (§2.1), a column's rows in ns segments of L, a thread each
   * (one thread a column ran a 64-row chain on K of the block's threads: 7.5% of the kernel's
   * cycles at (8,2048,16,128)): each segment's dG total, then each segment's chain continued
   * from dGn plus the later segments' totals; ddt_bias partials summed in segment order.
   * X is free here. H200, one run: fwd+bwd (8,2048,16,128) 5.04 -> 5.00 ms, (1,8192,16,128)
   * 3.111 -> 3.089, precise 9.41 -> 9.36 */
  float ea = A_log ? expf(KV > 0 && p.gate_mode ? red[31] : A_log[h]) : 1.f, dAl = 0;
  const int64_t gp = ((int64_t)cb * HV + h) * (K + 1);
  const int ns = BT / (int)K < 8 ? BT / (int)K : 8, L = (n + ns - 1) / ns, d = tid % (int)K, s = tid / (int)K;
  auto dg_at = [&](int r) { return dGs[T(r, d)]; };
  const bool gst = KV > 0 && al16(g);              /* (read only where p.gate_mode) */
  auto dtb_col = [&](int c) {                      /* column c's dt_bias (only where p.gate_mode) */
    return KV > 0 ? gx[c] : p.gate_mode && dt_bias ? dt_bias[h * K + c] : 0.f;
  };
  auto g_col = [&](int c) {                        /* column c's raw gate rows, staged or global */
    return [&, c](int r) {
      return gst ? __bfloat162float(gtile()[r * KV + c]) : ldb(g, ((t0 + r) * HV + h) * K + c);
    };
  };
  if (ns >= 2) {
    float *segT = X, *segD = X + ns * K16;            /* [ns][K16] totals, ddt_bias partials */
    const int lo = s * L, hi = (s + 1) * L < n ? (s + 1) * L - 1 : n - 1;
    if (s < ns) {
      float t = 0;
      for (int r = hi; r >= lo; r--) t += dg_at(r);
      segT[s * K16 + d] = t;
    }
    __syncthreads();
    if (s < ns) {
      float acc = dGn[d];
      for (int s2 = ns - 1; s2 > s; s2--) acc += segT[s2 * K16 + d];
      const float ddt =
          gate_chain_col<!PR>(p, dg_at, g_col(d), dtb_col(d), A_log != NULL, dg, t0, h, lo, hi, d, acc, ea, &dAl);
      if (p.gate_mode) segD[s * K16 + d] = ddt;
    }
    if (p.gate_mode) {
      __syncthreads();
      for (int c = tid; c < K; c += BT) {
        float t = 0;
        for (int s2 = 0; s2 < ns; s2++) t += segD[s2 * K16 + c];
        w.gpart[gp + c] = t;
      }
    }
  } else
    for (int c = tid; c < K; c += BT) {
      const float ddt = gate_chain_col<!PR>(p, [&](int r) { return dGs[T(r, c)]; }, g_col(c), dtb_col(c), A_log != NULL,
                                            dg, t0, h, 0, n - 1, c, dGn[c], ea, &dAl);
      if (p.gate_mode) w.gpart[gp + c] = ddt;
    }
  /* the ddt_bias and dA_log partials (k_gate_reduce's): a pre-gated launch (gate_mode 0) has
   * none (both gradients are zero there, kda_kda_cuda_backward sets them so), and skips their
   * sums and three barriers: k_bwd_final_wg 738.6 -> 722.9 us at (8,2048,16,128) (ncu, H100,
   * s68a, with the staging above) */
  if (p.gate_mode) {
    dAl = block_sum(dAl, red);
    if (tid == 0) w.gpart[gp + K] = dAl;
  }
  PH(8);
  /* beta chain (§2.2). No global load left: dbi holds both dbeta parts (the mat kernel's,
   * staged with b, plus the R terms'), and sigm(x) of the raw beta is b itself (beta_act: b =
   * sigm(x), or 2 sigm(x) in mode 2, the same fp32 values), so the same bits as reloading x.
   * With both loads here this phase took 1.9k of k_bwd_final_wg's 49.7k cycles a block; without,
   * 0.4k (H100, s51a) */
  for (int r = tid; r < n; r += BT) {
    float db = dbi[r];
    if (p.beta_mode) {
      float s = p.beta_mode == 2 ? 0.5f * bs[r] : bs[r];
      db *= (p.beta_mode == 2 ? 2.f : 1.f) * s * (1 - s);
    }
    stb(dbeta, ROWI(r), db);
  }
  PH(9);
}
