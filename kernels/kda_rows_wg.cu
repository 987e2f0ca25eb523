/* kda_rows_wg.cu — the fast rows kernel (kda_tc_bwd.cu's k_bwd_rows_tc at the compiled
 * K = V = 128, chunk 64) on Hopper's warpgroup MMAs (kda_wgmma.cuh). Compiled for sm_90a alone
 * (the Makefile's WGFLAGS); the host runs it wherever the fast rows kernel would run with the
 * reverse sweep's bf16 dVn on compute capability 9.0, unless KDA_KDA_ROWSWG=0 (kda_cuda.cu
 * use_rows_wg).
 *
 * Its products are the contractions over V of bf16 tiles staged [row][V], so both operands of
 * each are K-major as staged (no transposes):
 *   dQ = dO S0^T, dW = -dVn S0^T, dKi = Vn dS^T (64 x K), dA = s tril(dO Vn^T) (64 x 64),
 * and dgn = rowsum_V(S0 . dS) in fp32 from the staged tiles. Warpgroup g takes K columns
 * [32 g, 32 g + 32) of dQ, dW, dKi (m64n32) and columns [16 g, 16 g + 16) of dA (m64n16).
 * Same operands (the state passes' bf16 copies), same outputs and epilogues as the mma.sync
 * kernel; the products' sums run in the tensor cores' order, so dQ, dW, dKi, dA differ from
 * it in the last bits (test_kda_cuda holds this kernel to the CPU reference's tolerances);
 * dgn is the same sum in the same order (dgn_rows_b's), bit for bit. */
#include "kda_tc.cuh"
#include "kda_wgmma.cuh"

enum { RW_K = 128, RW_C = 64 };
/* bytes: S0, dS (K x V), dO, dVn, Vn (C x V), swizzled bf16 from a 1024-byte aligned base,
 * with the alignment's slack: 113 KB, two blocks an SM on sm_90's 228 KB */
size_t smem_rows_wg(void) { return (size_t)(2 * RW_K * RW_K + 3 * RW_C * RW_K) * 2 + 1024; }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
/* cp.async of rows [0, m) of an R x 128 bf16 block (row r at g + r gs, 16-byte aligned) into a
 * swizzled tile, zeros past m: consecutive threads take a row's 16-byte chunks */
template <int R> static __device__ __forceinline__ void rw_stage(sbf *s, const sbf *g, int64_t gs, int m) {
  for (int e = threadIdx.x; e < R * 16; e += NTC) {
    const int r = e >> 4, c = (e & 15) << 3;
    const bool ok = r < m;
    cp_async16(s + wg_off<R>(r, c), g + (ok ? r : 0) * gs + c, ok);
  }
}
#endif

__global__ void __launch_bounds__(NTC, 2) k_bwd_rows_wg(kp p, const void *dout, ws w) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  kv_fix<RW_K, NTC>(p);
  extern __shared__ __align__(16) uint8_t raw[];
  constexpr int K = RW_K, V = RW_K, C = RW_C;
  const int cb = blk_chunk(p);
  const int64_t h = blk_head(p), HV = p.HV;
  const int *ct = w.ctab + 4 * cb;
  const int n = ct[2];
  if (!n) return;
  const int64_t t0 = ct[1], r0 = ROWI(0);
  const int RK = (int)(HV * K), RC = (int)HV * C;
  sbf *S0 = (sbf *)(raw + ((1024 - (smem_u32(raw) & 1023)) & 1023)), *dS = S0 + K * V, *dO = dS + K * V,
      *dVn = dO + C * V, *Vn = dVn + C * V;
  const int64_t sr = ((int64_t)cb * HV + h) * K;   /* the chunk's kept states, in rows of V */
  rw_stage<K>(S0, (const sbf *)w.h + sr * V, V, K);
  rw_stage<C>(dO, (const sbf *)dout + r0 * V, HV * V, n);
  rw_stage<C>(dVn, w.dvnb + r0 * V, HV * V, n);
  cp_async_commit();
  rw_stage<K>(dS, (const sbf *)w.dh + sr * V, V, K);
  rw_stage<C>(Vn, (const sbf *)w.vn + r0 * V, HV * V, n);
  cp_async_commit();
  const int g = threadIdx.x >> 7;
  const uint64_t dDO = wg_desc(dO, 16, 1024), dDV = wg_desc(dVn, 16, 1024), dVN = wg_desc(Vn, 16, 1024),
                 dS0 = wg_desc(S0, 16, 1024) + 256 * g, dDS = wg_desc(dS, 16, 1024) + 256 * g,
                 dVB = wg_desc(Vn, 16, 1024) + 128 * g;   /* B rows 32 g (K tiles), 16 g (Vn as dA's B) */
  const int c0 = 32 * g;
  cp_async_wait_group<1>();                        /* S0, dO, dVn (dS, Vn may fly) */
  wg_proxy_fence();
  __syncthreads();
  /* dQ = dO S0^T and dW = -dVn S0^T, issued together; each stored as it completes */
  float a[16], b[16];
  /* a 64 x 32 product's rows i < n to its [T, HV, K] output (sg = -1: negated) */
  auto st_rows = [&](float *o, const float (&d)[16], float sg) {
    rw_frag<32>(d, c0, [&](int i, int c, float x0, float x1, float x2, float x3) {
      if (i < n) st2f(o + r0 * K + (i * RK + c), sg * x0, sg * x1, true);
      if (i + 8 < n) st2f(o + r0 * K + ((i + 8) * RK + c), sg * x2, sg * x3, true);
    });
  };
  wg_fence();
  rw_issue<32, K>(a, dDO, dS0);
  wg_commit();
  rw_issue<32, K>(b, dDV, dS0);
  wg_commit();
  wg_wait<1>();
  st_rows(w.dQ, a, 1.f);
  wg_wait<0>();
  st_rows(w.dW, b, -1.f);
  cp_async_wait_group<0>();                        /* dS, Vn */
  wg_proxy_fence();
  __syncthreads();
  /* dKi = Vn dS^T and dA = s tril(dO Vn^T), issued together; dgn from the tiles meanwhile */
  float x8[8];
  wg_fence();
  rw_issue<32, K>(a, dVN, dDS);
  wg_commit();
  rw_issue<16, C>(x8, dDO, dVB);
  wg_commit();
  {                                                /* dgn: dgn_rows_b's sums (a lane two columns at a time) */
    const int lane = threadIdx.x & 31;
    for (int d = threadIdx.x >> 5; d < K; d += NTC / 32) {
      float acc = 0.f;
      for (int c = 2 * lane; c < V; c += 64) {
        float2 u = __bfloat1622float2(*(const __nv_bfloat162 *)(S0 + wg_off<K>(d, c)));
        float2 v = __bfloat1622float2(*(const __nv_bfloat162 *)(dS + wg_off<K>(d, c)));
        acc = fmaf(u.x, v.x, acc), acc = fmaf(u.y, v.y, acc);
      }
      acc = kc_warp_sum(acc);
      if (!lane) w.dgn[((int64_t)cb * HV + h) * K + d] = acc;
    }
  }
  wg_wait<1>();
  st_rows(w.dKi, a, 1.f);
  wg_wait<0>();
  auto da = [&](int i, int j, float x0, float x1) {
    auto v = [&](int jj, float x) { return jj <= i && jj < n ? p.scale * x : 0.f; };
    if (i < n) st2f(w.dA + r0 * C + (i * RC + j), v(j, x0), v(j + 1, x1), true);
  };
  rw_frag<16>(x8, 16 * g, [&](int i, int j, float x0, float x1, float x2, float x3) { da(i, j, x0, x1), da(i + 8, j, x2, x3); });
#else
  __trap();   /* built for sm_90a only; the host never launches it elsewhere */
#endif
}
rows_wg_fn k_bwd_rows_wg_ptr(void) { return k_bwd_rows_wg; }
