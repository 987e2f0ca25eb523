/* kda_mat_wg.cu — the mat kernel's products (kda_mat_halves.cu's k_bwd_mat_tc_h) on Hopper's
 * warpgroup MMAs with tf32 operands (kda_wgmma.cuh), at the compiled K = V = 128, chunk 64.
 * Compiled for sm_90a alone (the Makefile's WGFLAGS); the host runs it wherever the halves
 * kernel would run on compute capability 9.0, unless KDA_KDA_MATWG=0 (kda_cuda.cu use_mat_wg).
 *
 * The outputs and their operands are k_bwd_mat_tc_h's (M, dVn, dW, Kb, v, b in; dv, dKb, dL
 * and dbeta's WY part out; every operand tf32-rounded where it is staged):
 *   dM = strict-tril([dVn | dW] [b v | Kb]^T), dv = b (M^T dVn), dKb = M^T dW,
 *   X = dM M^T, dL = -strict-tril(M^T X), dbeta_WY_j = sum_c (M^T dVn)_jc v_jc.
 * Why wgmma: a tensor-core product reads both operands from shared memory itself, so a
 * warpgroup's 64 x 32 x 64 product is eight instructions instead of the mma.sync form's
 * ldmatrix fragments, their addresses and 128 MMAs a warp.
 *
 * tf32 has no transpose bit: both operands are K-major, so a tile contracted over its row
 * index is also kept transposed: M (dv, dKb, dL contract M^T over i) as Ms and MsT, each
 * round's dVn or dW half as A0 and its transpose T0 (dv, dKb contract over the chunk rows),
 * X written transposed by its epilogue (dL contracts it over its rows).
 *
 * Four rounds through one region (as the halves kernel's three): V columns [0, 64), [64, 128)
 * (A0 = dVn half, B0 = b v half), then K columns [0, 64), [64, 128) (A0 = dW half, B0 = Kb
 * half). In each round warpgroups 0 and 1 add A0 B0^T to dM (64 x 32 each, held in their
 * registers across the four rounds) while warpgroups 2 and 3 form that half's dv or dKb
 * (MsT T0^T, 64 x 32 each). Then dM (masked, rounded) takes A0 and X^T takes B0, and all four
 * warpgroups run X and dL (64 x 16 each). dM's sum runs over V then K in the tensor cores'
 * order, so dM, dL and everything after them differ from the halves kernel's in the last bits:
 * test_kda_cuda holds this kernel to the CPU reference's tolerances. */
#include "kda_tc.cuh"
#include "kda_wgmma.cuh"

enum { MW_T = 64 * 64, MW_VB = 128 + 8, MW_WB = 64 + 8 };   /* a 64 x 64 fp32 tile (floats); bf16 pitches */
/* bytes: Ms, MsT, A0, B0, T0 (swizzled fp32), v (bf16 [64][MW_VB]), the dbeta partials
 * [64][mat_ps(128)], b; W16: a dW half in bf16 [64][MW_WB]; from a 1024-byte aligned base (the
 * swizzle's), with its slack */
size_t smem_mat_wg(int w16) {
  return (size_t)5 * MW_T * 4 + 64 * MW_VB * 2 + (64 * mat_ps(128) + 64) * 4 + (w16 ? 64 * MW_WB * 2 : 0) + 1024;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
/* cp.async of rows [0, n) of a 64 x 64 fp32 block (row r at rowp(r), 16-byte aligned) into a
 * swizzled tile, zeros past n: a thread a 16-byte chunk, sixteen threads a row (256 bytes), by
 * threads 0 .. NTH - 1 */
template <int NTH = NTC, class RP> static __device__ __forceinline__ void mw_stage(float *S, int n, RP rowp) {
  for (int e = threadIdx.x; e < 64 * 16; e += NTH) {
    const int r = e >> 4, c = (e & 15) << 2;
    const bool ok = r < n;
    cp_async16(S + wf_off<64>(r, c), rowp(ok ? r : 0) + c, ok);
  }
}
/* S rounded to tf32 in place and T = S^T (both swizzled 64 x 64). A thread reads a 16-byte
 * chunk of row i (eight consecutive rows a quarter warp: eight different banks' chunks, the
 * swizzle's point) and writes its four values down column i of T (a warp's 32 consecutive
 * columns of one row: the 32 banks once) */
template <int NTH = NTC> static __device__ __forceinline__ void mw_round_t(float *S, float *T) {
  for (int e = threadIdx.x; e < 64 * 16; e += NTH) {
    const int i = e & 63, c = (e >> 6) << 2;
    float4 *p = (float4 *)(S + wf_off<64>(i, c));
    const float4 x = *p;
    const float y[4] = {tf32r(x.x), tf32r(x.y), tf32r(x.z), tf32r(x.w)};
    *p = make_float4(y[0], y[1], y[2], y[3]);
    wf_put_col4<64>(T, c, i, y);
  }
}
/* E(row, col, x0, x1, x2, x3) over a 64 x N warpgroup accumulator d (kda_wgmma.cuh's fragment:
 * rows row and row + 8, columns col and col + 1, col from n0) */
template <int N, class FE> static __device__ __forceinline__ void mw_frag(const float (&d)[N / 2], int n0, FE E) {
  const int wq = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31, row = 16 * wq + (l >> 2);
#pragma unroll
  for (int j = 0; j < N / 8; j++) E(row, n0 + 8 * j + 2 * (l & 3), d[4 * j], d[4 * j + 1], d[4 * j + 2], d[4 * j + 3]);
}
/* d (=|+=) A B^T over k in [0, 64) (kda_wgmma.cuh's wf_issue), waited for */
template <int N> static __device__ __forceinline__ void mw_prod(float (&d)[N / 2], uint64_t da, uint64_t db, bool acc) {
  wf_issue<N>(d, da, db, acc);
  wg_wait<0>();
}

/* W16: dW from the fused sweep in bf16 (w.dWb). A K round's dW half is copied as such into a room
 * of its own (Wst, 9 KB) instead of A0, and its preparation writes A0 and T0 from it (bf16 is
 * exact in tf32: no rounding). With a room of its own the copy needs no free A0: round 2's is
 * issued with the first copies, round 3's at round 2's start, a product ahead of where the fp32
 * dW half is copied (after warpgroups 0 and 1 have read A0), and it is half the bytes. H100
 * (2026-12-07s66c): this kernel the same (423.0 -> 424.1 us, ncu): its rounds do not wait on
 * those copies; what pays is the sweep's 16 KB a chunk less (411.8 -> 387.2 us) */
template <int NF, bool W16> static __device__ __forceinline__ void bwd_mat_wg(kp p, const void *v, void *dv, ws w) {
  kv_fix<128, NTC>(p);
  extern __shared__ __align__(16) uint8_t raw[];
  const int *ct = w.ctab + 4 * blk_chunk(p);
  const int n = NF ? NF : ct[2];
  if (!n) return;
  constexpr int C = 64, K = 128, V = 128;
  const int PS = mat_ps(128);
  const int64_t t0 = ct[1], h = blk_head(p), HV = p.HV;
  const int64_t r0 = ROWI(0);                      /* the epilogues' rows at 32-bit offsets from it */
  const int RK = (int)(HV * K), RV = (int)(HV * V), RC = (int)HV * C;
  float *Ms = (float *)(raw + ((1024 - (smem_u32(raw) & 1023)) & 1023)), *MsT = Ms + MW_T, *A0 = MsT + MW_T,
        *B0 = A0 + MW_T, *T0 = B0 + MW_T;
  sbf *Vr = (sbf *)(T0 + MW_T);
  float *part = (float *)(Vr + 64 * MW_VB), *bs = part + 64 * PS;
  sbf *Wst = (sbf *)(bs + 64);                     /* W16's dW half */
  const int g = threadIdx.x >> 7;                  /* warpgroup */
  /* M, v (whole), b, then the first round's dVn half */
  mw_stage(Ms, n, [&](int i) { return w.M + ROWI(i) * C; });
  cp_tile_bf16(Vr, MW_VB, C, V, n, V, v, t0, HV, h);
  for (int r = threadIdx.x; r < C; r += NTC) bs[r] = r < n ? w.b[ROWI(r)] : 0.f;
  /* round rd's A0 (and B0) operands: V rounds dVn's half, K rounds dW's and Kb's. Round 0's
   * here, by every thread; round rd + 1's by warpgroups 0 and 1 as soon as their round-rd
   * product (the only reader of A0 and B0 after the round's barrier) is done, so the copies
   * fly under warpgroups 2 and 3's product and epilogue instead of after them (ncu s56b: the
   * round's cp.async wait 10.5% of this kernel's stall samples, the barriers around it 16%).
   * Measured (H100, s57a, three rounds beside main): fwd+bwd (8,2048,16,128) 2.609-2.620 ->
   * 2.583-2.605 ms, (1,8192,16,128) 1.600-1.616 -> 1.594-1.602; the small shapes equal */
  auto stage = [&](int rd, auto nth) {
    constexpr int NTH = decltype(nth)::value;
    const int d0 = 64 * (rd & 1);
    if (rd < 2) mw_stage<NTH>(A0, n, [&](int i) { return w.dvn + ROWI(i) * V + d0; });
    else {
      if constexpr (!W16) mw_stage<NTH>(A0, n, [&](int i) { return w.dW + ROWI(i) * K + d0; });
      mw_stage<NTH>(B0, n, [&](int i) { return w.Kb + ROWI(i) * K + d0; });
    }
  };
  /* W16: K round 2 + hf's dW half into Wst (rows of 128 bytes, 16-byte copies, zeros past n) */
  auto stage_w = [&](int hf, auto nth) {
    constexpr int NTH = decltype(nth)::value;
    for (int e = threadIdx.x; e < 64 * 8; e += NTH) {
      const int r = e >> 3, c = (e & 7) << 3;
      const bool ok = r < n;
      cp_async16(Wst + r * MW_WB + c, ok ? w.dWb + ROWI(r) * K + 64 * hf + c : w.dWb, ok);
    }
  };
  stage(0, std::integral_constant<int, NTC>());
  if constexpr (W16) stage_w(0, std::integral_constant<int, NTC>());
  /* a warpgroup's accumulators: warpgroups 0, 1 hold dM's columns [32 g, 32 g + 32) in them
   * across the rounds, 2 and 3 a round's dv or dKb columns (one array for both: 16 registers
   * fewer than two, which spilled at the 64-register bound of two blocks an SM) */
  float acc[16];
  /* round rd's operands made ready by threads 0 .. NTH - 1: A0 tf32-rounded in place and its
   * transpose T0 (dv, dKb contract over the chunk rows), B0 = tf32(b v) of the V rounds' half
   * or Kb's half rounded */
  auto prep = [&](int rd, auto nth) {
    constexpr int NTH = decltype(nth)::value;
    const int d0 = 64 * (rd & 1);
    if (W16 && rd >= 2)                            /* A0 and T0 = A0^T from Wst; a thread 8 values of row i */
      for (int e = threadIdx.x; e < 64 * 8; e += NTH) {
        const int i = e & 63, c = (e >> 6) << 3;
        const uint4 u = *(const uint4 *)(Wst + i * MW_WB + c);
        const float4 a = bf4(make_uint2(u.x, u.y)), b = bf4(make_uint2(u.z, u.w));
        *(float4 *)(A0 + wf_off<64>(i, c)) = a;
        *(float4 *)(A0 + wf_off<64>(i, c + 4)) = b;
        const float lo[4] = {a.x, a.y, a.z, a.w}, hi[4] = {b.x, b.y, b.z, b.w};
        wf_put_col4<64>(T0, c, i, lo);
        wf_put_col4<64>(T0, c + 4, i, hi);
      }
    else mw_round_t<NTH>(A0, T0);
    if (rd < 2)
      for (int e = threadIdx.x; e < 64 * 16; e += NTH) {
        const int j = e & 63, c = (e >> 6) << 2;
        const sbf *vp = Vr + j * MW_VB + d0 + c;
        const float bj = bs[j];
        *(float4 *)(B0 + wf_off<64>(j, c)) =
            make_float4(tf32r(bj * f(vp[0])), tf32r(bj * f(vp[1])), tf32r(bj * f(vp[2])), tf32r(bj * f(vp[3])));
      }
    else tf32r_tile(B0, MW_T, NTH);
  };
  cp_async_wait_all();                             /* M, v, b and round 0's operands */
  __syncthreads();
  mw_round_t(Ms, MsT);
  prep(0, std::integral_constant<int, NTC>());
  wg_proxy_fence();
  __syncthreads();
  /* Round rd + 1's operands are made ready by warpgroups 0 and 1 alone, while 2 and 3 store
   * round rd's dv or dKb: 0 and 1 stage them once their dM product has read A0 and B0, wait for
   * their own copies, and (barrier 2) for 2 and 3's product to have read T0, then round,
   * transpose and convert; one barrier ends the round. Before, every thread did it at the
   * round's top, behind a barrier that 0 and 1 reached first (ncu s65a: barrier stalls 22% of
   * this kernel's samples). H100, one machine, two calls against the kernel before
   * (2026-12-07s65b, s65c): this kernel 434.9 -> 422.0 us (ncu, the same call), fwd+bwd
   * (8,2048,16,128) 2.323-2.339 -> 2.305-2.334 ms, (1,8192,16,128) 1.541-1.556 -> 1.538-1.546 */
#pragma unroll 1
  for (int rd = 0; rd < 4; rd++) {
    const bool kr = rd >= 2;                       /* a K round (dW, Kb), else a V round (dVn, b v) */
    const int d0 = 64 * (rd & 1);
    if (g < 2) {
      if (W16 && rd == 2) stage_w(1, std::integral_constant<int, 256>());   /* Wst's reader prep(2): a barrier since */
      mw_prod<32>(acc, wf_desc(A0, 0), wf_desc(B0, 32 * g), rd > 0);
      if (rd < 3) {
        wg01_sync();                               /* both warpgroups' products have read A0, B0 */
        stage(rd + 1, std::integral_constant<int, 256>());
        cp_async_wait_all();
        wg01_sync();                               /* every copy of the two warpgroups landed */
        wg01_wait_23();                            /* 2 and 3's product has read T0 */
        prep(rd + 1, std::integral_constant<int, 256>());
        wg_proxy_fence();
      }
    } else {
      mw_prod<32>(acc, wf_desc(MsT, 0), wf_desc(T0, 32 * (g - 2)), false);
      if (rd < 3) wg23_done();                     /* T0 read: 0 and 1 may write the next */
      if (!kr) {   /* dbeta's V term and dv = b (M^T dVn), as the halves kernel's epilogue */
        mw_frag<32>(acc, 32 * (g - 2), [&](int j, int c, float x0, float x1, float x2, float x3) {
          const sbf *v0 = Vr + j * MW_VB + d0 + c, *v1 = v0 + 8 * MW_VB;
          mat_part4(part, PS, j, (d0 + c) >> 3, x0 * f(v0[0]) + x1 * f(v0[1]), x2 * f(v1[0]) + x3 * f(v1[1]));
        });
        /* dv's rows scaled by b in place, then stored 16 bytes a lane (st_rows_b16: whole
         * sectors; a bf16 pair a lane, as st2b stored them, wrote half sectors). The same values;
         * H100 (s66g): this kernel 423.5 -> 419.6 us at (8,2048,16,128), 218.3 -> 211.4 at
         * (1,8192,16,128) (ncu) */
        const int jr = 16 * ((threadIdx.x >> 5) & 3) + ((threadIdx.x & 31) >> 2);
        const float b0 = bs[jr], b1 = bs[jr + 8];
#pragma unroll
        for (int q = 0; q < 16; q++) acc[q] *= q & 2 ? b1 : b0;
        st_rows_b16((bf16 *)dv + r0 * V + d0, RV, acc, 32 * (g - 2), n, 1.f);
      } else       /* dKb's columns d0 .. */
        mw_frag<32>(acc, 32 * (g - 2), [&](int j, int c, float x0, float x1, float x2, float x3) {
          if (j < n) st2f(w.dKb + r0 * K + (j * RK + d0 + c), x0, x1, true);
          if (j + 8 < n) st2f(w.dKb + r0 * K + ((j + 8) * RK + d0 + c), x2, x3, true);
        });
    }
    if (rd < 3) __syncthreads();                   /* round rd + 1's operands whole */
  }
  __syncthreads();                                 /* every read of A0, B0 done */
  float *dMs = A0, *XT = B0;
  if (g < 2)                                       /* dM strict-tril, tf32 (X's operand) */
    mw_frag<32>(acc, 32 * g, [&](int i, int j, float x0, float x1, float x2, float x3) {
      *(float2 *)(dMs + wf_off<64>(i, j)) =
          make_float2(j < i && i < n ? tf32r(x0) : 0.f, j + 1 < i && i < n ? tf32r(x1) : 0.f);
      *(float2 *)(dMs + wf_off<64>(i + 8, j)) =
          make_float2(j < i + 8 && i + 8 < n ? tf32r(x2) : 0.f, j + 1 < i + 8 && i + 8 < n ? tf32r(x3) : 0.f);
    });
  wg_proxy_fence();
  __syncthreads();
  /* X = dM M^T (tf32, written transposed: dL's B operand), then dL = -strict-tril(M^T X) */
  float x8[8];
  mw_prod<16>(x8, wf_desc(dMs, 0), wf_desc(Ms, 16 * g), false);
  mw_frag<16>(x8, 16 * g, [&](int i, int j, float x0, float x1, float x2, float x3) {
    XT[wf_off<64>(j, i)] = tf32r(x0), XT[wf_off<64>(j + 1, i)] = tf32r(x1);
    XT[wf_off<64>(j, i + 8)] = tf32r(x2), XT[wf_off<64>(j + 1, i + 8)] = tf32r(x3);
  });
  wg_proxy_fence();
  __syncthreads();
  mw_prod<16>(x8, wf_desc(MsT, 0), wf_desc(XT, 16 * g), false);
  mw_frag<16>(x8, 16 * g, [&](int i, int j, float x0, float x1, float x2, float x3) {
    if (i < n) st2f(w.dL + r0 * C + (i * RC + j), j < i ? -x0 : 0.f, j + 1 < i ? -x1 : 0.f, true);
    if (i + 8 < n) st2f(w.dL + r0 * C + ((i + 8) * RC + j), j < i + 8 ? -x2 : 0.f, j + 1 < i + 8 ? -x3 : 0.f, true);
  });
  mat_db_rows(part, PS, n, w.db + ROWI(0), HV);   /* dbeta_WY (the V rounds' partials, barriers since) */
}
#endif

/* a full chunk with n = 64 fixed, as the halves kernel's */
template <bool W16>
__global__ void __launch_bounds__(NTC, 2) k_bwd_mat_wg(kp p, const void *v, const void *dout, void *dv, ws w) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if (full_chunk<false, 128>(p, w.ctab, blk_chunk(p))) bwd_mat_wg<FULL_NF<false, 128>, W16>(p, v, dv, w);
  else bwd_mat_wg<0, W16>(p, v, dv, w);
#else
  __trap();   /* built for sm_90a only; the host never launches it elsewhere */
#endif
}

mat_tc_fn k_bwd_mat_wg_ptr(int w16) { return w16 ? k_bwd_mat_wg<true> : k_bwd_mat_wg<false>; }
