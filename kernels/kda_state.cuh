/* kda_state.cuh — the version-2 state passes' shared-memory tiles, staging and product steps
 * (st_*), and the bodies of the two-tile-set sweeps (state_fwd_db, state_bwd_db) with the flow
 * handshake (flow_wait, flow_signal): kda_tc.cu runs them as the state-pass kernels and as the
 * forward's flow kernel (with k_intra_tc), kda_tc_bwd.cu as the backward's (with
 * k_bwd_rows_tc). Included after kda_tc.cuh; static device code only (each kernel is defined in
 * one file). */
#ifndef KDA_STATE_CUH
#define KDA_STATE_CUH
#include "kda_tc.cuh"

template <class T> struct st_tiles {
  T *W, *qg, *kg, *A;
  sbf *dO;
  float *S, *Vn, *dV, *en;
  sbf *Sb, *Vb;   /* bf16 layout only: shadows of S and of Vn (forward sweeps) / -dVn (reverse) */
  int KB, CB, SB, DB, K16;
  int bv;         /* V columns a block: BVT (BVN in the lone _db passes), or BVW in the wide passes */
};
/* The bf16 layout (the fast passes, ldmatrix operands) keeps bf16 shadows of the fp32 S and
 * Vn written by the epilogues that form them (the same RN rounding the MMA operands had), and
 * no fp32 dVn: [W qg kg][C][KB], A [C][CB], Sb [K16][DB], Vb [C][DB], dO [C][DB] (bf16),
 * S [K16][SB], Vn [C][SB], en [K16] (fp32). The fp32 layout (the precise backward) as before. */
template <class T, int NV = BVT> static __device__ st_tiles<T> st_carve(const kp &p, float *sm, bool dO = true) {
  st_tiles<T> t;
  t.K16 = r16(p.K), t.KB = t.K16 + 16 / (int)sizeof(T), t.CB = p.C + 16 / (int)sizeof(T), t.SB = NV + 4,
  t.DB = NV + 8, t.bv = NV;
  T *b = (T *)sm;
  t.W = b, t.qg = b + p.C * t.KB, t.kg = t.qg + p.C * t.KB, t.A = t.kg + p.C * t.KB;
  if constexpr (std::is_same<T, sbf>::value) {
    t.Sb = t.A + p.C * t.CB, t.Vb = t.Sb + t.K16 * t.DB, t.dO = dO ? t.Vb + p.C * t.DB : nullptr;
    t.S = (float *)(t.Vb + (dO ? 2 : 1) * p.C * t.DB);
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
                                int64_t h, int64_t c0, const void *dout, int parts, int tid = -1, int nth = 0) {
  if (tid < 0) tid = threadIdx.x, nth = BT;        /* else thread tid of the nth doing it */
  int64_t HV = p.HV, V = p.V, r0 = t0 * HV + h;  /* r0: the global row of chunk row 0 */
  constexpr int LE = sizeof(T) == 2 ? 3 : 2;       /* log2 of the elements per 16-byte copy */
  int C = p.C, K16 = t.K16, kc = K16 >> LE, cc = C >> LE;
  /* chunk row i of a [T, HV, n] tensor is i HV n elements past row 0: per-element offsets in
   * 32 bits from row pointers formed once (64-bit index products per element were most of
   * these passes' integer work: ncu, 28% of k_state_fwd_tc_db's instructions IMAD) */
  const int HVK = (int)HV * K16, HVC = (int)HV * C, HVV = (int)(HV * V);
  if (parts & (SG_W | SG_QG | SG_KG)) {
    const T *Wg = st_src<T>::W(w) + r0 * K16, *Qg = st_src<T>::qg(w) + r0 * K16, *Kg = st_src<T>::kg(w) + r0 * K16;
    for (int e = tid; e < C * kc; e += nth) {
      int i = e / kc, d = (e % kc) << LE;
      bool ok = i < m;
      int gi = (ok ? i : 0) * HVK + d;
      if (parts & SG_W) cp_async16(t.W + i * t.KB + d, Wg + gi, ok);
      if (parts & SG_QG) cp_async16(t.qg + i * t.KB + d, Qg + gi, ok);
      if (parts & SG_KG) cp_async16(t.kg + i * t.KB + d, Kg + gi, ok);
    }
  }
  if (parts & SG_A) {
    const T *Ag = st_src<T>::A(w) + r0 * C;
    for (int e = tid; e < C * cc; e += nth) {
      int i = e / cc, j = (e % cc) << LE;
      bool ok = i < m;
      cp_async16(t.A + i * t.CB + j, Ag + (ok ? i : 0) * HVC + j, ok);
    }
  }
  if (parts & SG_U) {
    const float *Ug = w.U + r0 * V + c0;
    cp_tile_f32(t.Vn, t.SB, C, t.bv, m, (int)(V - c0 < t.bv ? V - c0 : t.bv), V % 4 == 0,
                [&](int i) { return Ug + i * HVV; }, tid, nth);
  }
  if (parts & SG_DO) {
    const bf16 *g = (const bf16 *)dout + r0 * V + c0;
    if (V % 8 == 0 && al16(dout)) {
      for (int e = tid; e < C * (t.bv / 8); e += nth) {
        int i = e / (t.bv / 8), c = (e % (t.bv / 8)) << 3;
        bool ok = i < m && c0 + c < V;
        cp_async16(t.dO + i * t.DB + c, g + (ok ? i * HVV + c : 0), ok);
      }
    } else
      for (int e = tid; e < C * t.bv; e += nth) {
        int i = e / t.bv, c = e % t.bv;
        t.dO[i * t.DB + c] = i < m && c0 + c < V ? g[i * HVV + c] : __float2bfloat16(0.f);
      }
  }
}
/* NV: the block's V columns (t.bv) as a compile-time constant (BVT, or BVN in the lone _db
 * passes), in these helpers and the products below: their loops fold as with BVT before */
template <int NV = BVT, class T>
static __device__ void st_ld(const kp &p, const float *src, int64_t base, int64_t c0, const st_tiles<T> &t) {
  for (int e = threadIdx.x; e < t.K16 * NV; e += BT) {
    int d = e / NV, c = e % NV;
    float x = src && d < p.K && c0 + c < p.V ? src[base + d * p.V + c0 + c] : 0.f;
    t.S[d * t.SB + c] = x;
    if (t.Sb) t.Sb[d * t.DB + c] = __float2bfloat16(x);
  }
}
/* dst <- S (rows d < K, columns c0 + c < V); 16-byte stores when V % 4 == 0 (every row start
 * is then 16-byte aligned, and a group of 4 columns is all in or all out) */
template <int NV = BVT, class T>
static __device__ void st_st(const kp &p, float *dst, int64_t base, int64_t c0, const st_tiles<T> &t) {
  if (p.V % 4 == 0) {
    for (int e = threadIdx.x; e < p.K * (NV / 4); e += BT) {
      int d = e / (NV / 4), c = (e % (NV / 4)) * 4;
      if (c0 + c < p.V) *(float4 *)(dst + base + d * p.V + c0 + c) = *(const float4 *)(t.S + d * t.SB + c);
    }
    return;
  }
  for (int e = threadIdx.x; e < p.K * NV; e += BT) {
    int d = e / NV, c = e % NV;
    if (c0 + c < p.V) dst[base + d * p.V + c0 + c] = t.S[d * t.SB + c];
  }
}
/* A kept state of the block's columns (w.h: the state entering each chunk; w.dh: its gradient)
 * at base: the bf16 layout stores the shadow Sb, in bf16 (its readers, k_bwd_rows_tc's products
 * and dgn, take it as it is: the same RN rounding their operands had when these were fp32 and
 * halves the bytes of the two largest kept tensors), the fp32 layout (the precise backward) S */
template <class T>
static __device__ void st_keep(const kp &p, float *dst, int64_t base, int64_t c0, const st_tiles<T> &t,
                               int tid = -1, int nth = 0) {
  if constexpr (std::is_same<T, sbf>::value) {
    if (tid < 0) tid = threadIdx.x, nth = BT;      /* else thread tid of the nth doing it */
    sbf *d = (sbf *)dst + base + c0;
    if (p.V % 8 == 0) {   /* rows 16-byte aligned; a group of 8 columns all in or all out */
      for (int e = tid; e < p.K * (t.bv / 8); e += nth) {
        int r = e / (t.bv / 8), c = (e % (t.bv / 8)) * 8;
        if (c0 + c < p.V) *(uint4 *)(d + r * p.V + c) = *(const uint4 *)(t.Sb + r * t.DB + c);
      }
      return;
    }
    for (int e = tid; e < p.K * t.bv; e += nth) {
      int r = e / t.bv, c = e % t.bv;
      if (c0 + c < p.V) d[r * p.V + c] = t.Sb[r * t.DB + c];
    }
    return;
  }
  st_st(p, dst, base, c0, t);   /* the precise passes: every thread (no range) */
}
/* The reverse sweeps' dVn epilogue, two adjacent outputs (row r, columns c, c + 1; in0, in1:
 * within V): -dVn into the shadow Vb (the dS update's operand), dVn into the global fp32 (the
 * mat kernel's tf32 operand) and, gb non-NULL, bf16 copies (the rows kernel's, the same RN
 * rounding as Vb's; after the two-tile-set sweep the rows kernel rounds the fp32 copy itself) */
static __device__ __forceinline__ void st_dvn(const st_tiles<sbf> &t, int r, int c, float x0, float x1, int m,
                                              bool in0, bool in1, float *g, sbf *gb) {
  __nv_bfloat162 v = __floats2bfloat162_rn(x0, x1);
  *(__nv_bfloat162 *)(t.Vb + r * t.DB + c) = __hneg2(v);
  if (r < m && in0) {
    st2f<true>(g, x0, x1, in1);
    if (!gb) return;
    if (in1 && ((uintptr_t)gb & 3) == 0) *(__nv_bfloat162 *)gb = v;
    else {
      gb[0] = v.x;
      if (in1) gb[1] = v.y;
    }
  }
}
/* S <- e^{G_last} S + x for two adjacent epilogue outputs (columns c, c + 1: pairs2), and the
 * bf16 shadow, each pair in one load and one store (SB, DB and c are even) */
template <class T>
static __device__ __forceinline__ void st_s_upd2(const st_tiles<T> &t, int r, int c, float x0, float x1) {
  float2 s = *(const float2 *)(t.S + r * t.SB + c);
  float e = t.en[r], v0 = e * s.x + x0, v1 = e * s.y + x1;
  *(float2 *)(t.S + r * t.SB + c) = make_float2(v0, v1);
  *(__nv_bfloat162 *)(t.Sb + r * t.DB + c) = __floats2bfloat162_rn(v0, v1);
}
/* the bf16 layout's Vn epilogue (st_vn_tc below; two adjacent outputs x of W S at row r,
 * columns c, c + 1) */
static __device__ __forceinline__ auto st_vn_epi(const kp &p, const st_tiles<sbf> &t, int64_t t0, int m,
                                                 int64_t h, int64_t c0, float *vn) {
  sbf *vn0 = vn ? (sbf *)vn + (t0 * p.HV + h) * p.V + c0 : nullptr;   /* chunk row 0 (st_stage) */
  const int HVV = (int)(p.HV * p.V);
  const int64_t V = p.V;
  return [=](int r, int c, float x0, float x1) {
    float2 u = *(const float2 *)(t.Vn + r * t.SB + c);
    __nv_bfloat162 v = __floats2bfloat162_rn(u.x - x0, u.y - x1);
    *(__nv_bfloat162 *)(t.Vb + r * t.DB + c) = v;
    if (vn0 && r < m && c0 + c < V) {
      sbf *d = vn0 + r * HVV + c;
      if (c0 + c + 1 < V && ((uintptr_t)d & 3) == 0) *(__nv_bfloat162 *)d = v;
      else {
        d[0] = v.x;
        if (c0 + c + 1 < V) d[1] = v.y;
      }
    }
  };
}
/* Vn = U - W S  (U staged into t.Vn, zero past m and V); vn != NULL also stores it. The bf16
 * layout keeps only the shadow of Vn (its one use after this is as a bf16 operand) and stores
 * that, in bf16 (as st_keep: the backward reads Vn only as a bf16 operand). */
template <int P, int NV = BVT, class T>
static __device__ void st_vn_tc(const kp &p, const st_tiles<T> &t, int64_t t0, int m, int64_t h,
                                int64_t c0, float *vn) {
  if constexpr (std::is_same<T, sbf>::value) {
    mma_ldm(p.C, NV, bt{t.W, t.KB, 1}, bt{t.Sb, t.DB, 0}, t.K16, bt{}, bt{}, 0, pairs2(st_vn_epi(p, t, t0, m, h, c0, vn)));
    return;
  }
  mma_blk<P>(p.C, NV, t.K16, [&](int i, int d) { return f(t.W[i * t.KB + d]); },
             [&](int d, int c) { return t.S[d * t.SB + c]; },
             [&](int i, int c, float x) {
               float u = t.Vn[i * t.SB + c] - x;
               t.Vn[i * t.SB + c] = u;
               if (vn && i < m && c0 + c < p.V) vn[((t0 + i) * p.HV + h) * p.V + c0 + c] = u;
             });
}
/* S <- e^{G_last} S + kg^T Vn */
template <int P, int NV = BVT, class T>
static __device__ void st_upd_tc(const kp &p, const st_tiles<T> &t) {
  if constexpr (std::is_same<T, sbf>::value) {
    mma_ldm(t.K16, NV, bt{t.kg, t.KB, 0}, bt{t.Vb, t.DB, 0}, p.C, bt{}, bt{}, 0,
            pairs2([&](int d, int c, float x0, float x1) { st_s_upd2(t, d, c, x0, x1); }));
    return;
  }
  mma_blk<P>(t.K16, NV, p.C, [&](int d, int i) { return f(t.kg[i * t.KB + d]); },
             [&](int i, int c) { return t.Vn[i * t.SB + c]; },
             [&](int d, int c, float x) { t.S[d * t.SB + c] = t.en[d] * t.S[d * t.SB + c] + x; });
}

/* A state pass's block: (sequence n, value head h, V columns c0 .. c0 + bv) from a 1-D grid of
 * n_seq * HV * ceil(V / bv) blocks (state_grid; bv = BVT, or BVW in the wide passes), the V tiles of one (n, h) adjacent, so the
 * blocks that read the same chunk tiles (W, qg, kg, Aqk: every V tile of a head reads them all)
 * are resident together and can share them through L2. It was a (n, h, V tile) grid, the V
 * tile slowest (at (8,2048,16,128) the first of two waves held V tiles 0-1 of every head, the
 * second 2-3). H200, one run: fwd+bwd 5.95 -> 5.92 ms from the grid alone, small as it is. */
struct st_blk {
  int64_t h, c0, sbase;   /* value head, first V column, offset of (n, h)'s K x V state */
  int cf, cl;             /* the sequence's chunks [cf, cl) */
};
static __device__ __forceinline__ st_blk st_block(const kp &p, const ws &w, int64_t b = blockIdx.x, int bv = BVT) {
  int64_t nz = (p.V + bv - 1) / bv, nh = b / nz, n = nh / p.HV;
  st_blk s;
  s.c0 = (b % nz) * bv, s.h = nh % p.HV, s.sbase = nh * p.K * p.V;
  s.cf = w.sfirst[n], s.cl = w.sfirst[n + 1];
  return s;
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
  for (int u = 0; u < 2; u++) g.v[u] = threadIdx.x + u * BT < p.K ? __ldcg(g.row + threadIdx.x + u * BT) : 0.f;
  return g;
}
template <class T>
static __device__ __forceinline__ void st_en_store(const kp &p, const st_tiles<T> &t, const st_glast &g) {
#pragma unroll
  for (int u = 0; u < 2; u++) {
    int d = threadIdx.x + u * BT;
    if (d < t.K16) t.en[d] = d < p.K ? kexp(g.v[u]) : 0.f;
  }
  for (int d = threadIdx.x + 2 * BT; d < t.K16; d += BT) t.en[d] = d < p.K ? kexp(__ldcg(g.row + d)) : 0.f;
}

/* The top of a forward pass's step ci over chunk rows [t0, t0 + m) (k_state_fwd_tc,
 * k_state_fwd_tc_wide): once the previous update is done, the kept state entering the chunk
 * (w.h, when kept), kg's copies in a group of their own, e^{G_last} into registers (stored
 * after o), then the wait for U, W, s qg, Aqk (staged during the previous step) */
template <class T>
static __device__ __forceinline__ st_glast st_fwd_top(const kp &p, const ws &w, const st_tiles<T> &t, int ci,
                                                      int64_t t0, int m, int64_t h, int64_t c0) {
  __syncthreads();                                 /* previous update done with kg, Vb, S / Sb, en */
  if (w.h) st_keep(p, w.h, (int64_t)ci * p.HV * p.K * p.V + h * p.K * p.V, c0, t);
  st_stage(p, w, t, t0, m, h, c0, nullptr, SG_KG);
  cp_async_commit();
  st_glast gl = st_glast_load(p, w, t0, m, h);
  cp_async_wait_group<1>();                        /* U, W, s qg, Aqk of this chunk (kg may fly) */
  __syncthreads();
  return gl;
}
/* The top of a reverse sweep's step ci (state_bwd_tc, k_state_bwd_tc_wide): once the previous
 * dS update is done, the kept dS entering the chunk (w.dh), dO's copies, then s qg's and W's
 * (read by the dS update only, waited for after dVn), e^{G_last} into registers, then the wait
 * for Aqk, kg (staged during the previous step) and dO */
template <class T>
static __device__ __forceinline__ st_glast st_rev_top(const kp &p, const ws &w, const st_tiles<T> &t, int ci,
                                                      int64_t t0, int m, int64_t h, int64_t c0, const void *dout) {
  __syncthreads();                                 /* previous dS update done with qg, W, dO, dVn / Vb, en */
  st_keep(p, w.dh, (int64_t)ci * p.HV * p.K * p.V + h * p.K * p.V, c0, t);
  st_stage(p, w, t, t0, m, h, c0, dout, SG_DO);
  cp_async_commit();
  st_stage(p, w, t, t0, m, h, c0, nullptr, SG_QG | SG_W);
  cp_async_commit();
  st_glast gl = st_glast_load(p, w, t0, m, h);
  cp_async_wait_group<1>();                        /* Aqk, kg, dO (s qg, W may fly) */
  __syncthreads();
  return gl;
}


/* The warps a C x NV product of a _db step leaves idle (warp_tiles16 gives tile t to warp t:
 * (C/16)(NV/16) tiles for 16 warps; 4 at NV = 16, 8 at 32): where at least three quarters of
 * the warps are idle (on), those store the kept state and issue the next set's copies while
 * the others run the step's first products, instead of every warp doing both after those
 * products. me: this thread is one of them; tid, nth: its index among them, their count
 * (st_stage's, st_keep's ranges). H200, one run, three rounds against main's kernels (2026-12-04s38d): at
 * NV = 16 (the lone passes at (8,512,4,64)) k_state_fwd_tc_db 25.6 -> 23.6 us,
 * k_state_bwd_tc_db 23.7 -> 20.0 (ncu), fwd+bwd in a graph 0.136-0.137 -> 0.132-0.133 ms; the
 * other bench shapes unchanged. Not at NV = 32 (the flow kernels at (1,8192,16,128), s38b:
 * k_bwd_flow 523.4 -> 531.9 us with half the warps issuing a 64 KB set's copies, 16 a thread,
 * beside dVn), and compiled for NV <= BVN only: decided at run time, the NV = 32 sweep lost
 * with the branch off too (k_bwd_flow 519.4 -> 559.1, s38c: its code, not its work).
 * test_kda_cuda holds it bit for bit to the 32-column passes, which never take it
 * (KDA_KDA_STATE_BV=16 against =32 on every case). The stores and copies are written twice in
 * each step (here beside the product, and after it for the other passes) rather than through
 * a shared lambda: a lambda carrying the staging once lost copies in the compiled code
 * (sixteenth pass), and these steps' code is measured as it stands. */
struct st_idle {
  bool on, me;
  int tid, nth;
};
template <int NV> static __device__ __forceinline__ st_idle st_idle_of(const kp &p) {
  const int busy = (p.C >> 4) * (NV >> 4) * 32;
  st_idle g;
  g.on = NV <= BVN && 4 * busy <= BT, g.me = g.on && (int)threadIdx.x >= busy;
  g.tid = (int)threadIdx.x - busy, g.nth = BT - busy;
  return g;
}

/* The _db passes' second tile set, after the whole single-set layout t: W, s qg, kg, Aqk,
 * then the fp32 U / Vn tile (fwd, the forward pass) or dO (the reverse sweep) */
static __device__ __forceinline__ st_tiles<sbf> st_carve_db(const kp &p, const st_tiles<sbf> &t, bool fwd) {
  st_tiles<sbf> s = t;
  s.W = (sbf *)(t.en + t.K16), s.qg = s.W + p.C * t.KB, s.kg = s.qg + p.C * t.KB, s.A = s.kg + p.C * t.KB;
  if (fwd) s.Vn = (float *)(s.A + p.C * t.CB);
  else s.dO = s.A + p.C * t.CB;
  return s;
}
/* a third set (db_sets), after the second set s, in its layout */
static __device__ __forceinline__ st_tiles<sbf> st_carve_next(const kp &p, const st_tiles<sbf> &s, bool fwd) {
  st_tiles<sbf> n = s;
  n.W = fwd ? (sbf *)(s.Vn + p.C * s.SB) : s.dO + p.C * s.DB;
  n.qg = n.W + p.C * s.KB, n.kg = n.qg + p.C * s.KB, n.A = n.kg + p.C * s.KB;
  if (fwd) n.Vn = (float *)(n.A + p.C * s.CB);
  else n.dO = n.A + p.C * s.CB;
  return n;
}


/* the flow kernels' handshake (k_fwd_flow, k_bwd_flow): a producer block, after a
 * __syncthreads that follows its stores of a chunk, adds one to the chunk's flag (thread 0:
 * fence, then the add: every thread's stores are visible before the flag moves); a consumer's
 * thread 0 waits (acquire) until the flag reaches `want`, and the caller's __syncthreads then
 * holds the block. f NULL (the plain kernels): nothing. */
static __device__ __forceinline__ void flow_signal(int *f, int ci, int64_t h, int64_t HV) {
  if (!f || threadIdx.x) return;
  __threadfence();
  atomicAdd(f + ci * HV + h, 1);
}
static __device__ __forceinline__ void flow_wait_for(const int *f, int want) {
  for (;;) {
    int x;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(x) : "l"(f) : "memory");
    if (x >= want) return;
    __nanosleep(100);
  }
}
/* the forward flow's wait: chunk ci's flag in k_fwd_flow's set (w.flow + 1) */
static __device__ __forceinline__ void flow_wait(const ws &w, int ci, int64_t h, int64_t HV, bool flow) {
  if (flow && !threadIdx.x) flow_wait_for(w.flow + 1 + ci * HV + h, 1);
}

/* The reverse sweep of a kept fast backward with a second set of chunk tiles (Aqk, kg, s qg,
 * W, dO: smem_state_bwd_tc_db), for grids of at most one block an SM, as k_state_fwd_tc_db:
 * chunk ci - 1's whole set is staged during step ci (NS = 3, db_sets: chunk ci - 2's, in a third
 * set). Same products in the same order as
 * k_state_bwd_tc's reverse sweep. With k_state_fwd_tc_db, fwd+bwd on the H200 (against
 * KDA_KDA_STATE_DB=0 in one run): (1,8192,16,128) 3.813 -> 3.665 ms, (8,512,4,64) 0.260 -> 0.253. */
template <int KV, int NV = BVT, int NS = 2>
static __device__ __forceinline__ void state_bwd_db(kp p, ws w, const void *dout, const float *dht, float *dh0,
                                                    int64_t blk, int *fb) {
  extern __shared__ __align__(16) float sm[];
  kv_fix<KV, KV == 64 ? NTC : 0>(p);   /* K = 128: 128 registers and spills when fixed */
  const st_blk b = st_block(p, w, blk, NV);
  const int64_t h = b.h, c0 = b.c0, K = p.K, V = p.V, HV = p.HV;
  const int HVV = (int)(HV * V);                  /* elements between a chunk's rows */
  const int cf = b.cf, cl = b.cl;
  const st_tiles<sbf> t0s = st_carve<sbf, NV>(p, sm), t1s = st_carve_db(p, t0s, false),
                      t2s = NS == 3 ? st_carve_next(p, t1s, false) : t1s;
  PH_INIT(2);
  st_ld<NV>(p, dht, b.sbase, c0, t0s);             /* t.S now holds dS (§4.2) */
  constexpr int ALL = SG_A | SG_KG | SG_QG | SG_W | SG_DO;
  const st_idle ig = st_idle_of<NV>(p);
  if (cf < cl) st_stage(p, w, t0s, w.ctab[4 * (cl - 1) + 1], w.ctab[4 * (cl - 1) + 2], h, c0, dout, ALL);
  cp_async_commit();
  if constexpr (NS == 3) {                         /* chunk cl - 2 too: each step stages two ahead */
    if (cl - 2 >= cf) st_stage(p, w, t1s, w.ctab[4 * (cl - 2) + 1], w.ctab[4 * (cl - 2) + 2], h, c0, dout, ALL);
    cp_async_commit();
  }
  /* step ci with set t, staging chunk ci - (NS - 1) into set tn */
  auto step = [&](const st_tiles<sbf> &t, const st_tiles<sbf> &tn, int ci) {
    int64_t t0 = w.ctab[4 * ci + 1];
    float *dvn0 = w.dvn + (t0 * HV + h) * V + c0;       /* chunk row 0 */
    int m = w.ctab[4 * ci + 2];
    /* chunk ci's set (staged a step ahead) waited for before the one barrier that also ends
     * step ci + 1's use of tn's tiles, dS, Vb, en */
    if constexpr (NS == 3) cp_async_wait_group<1>();   /* chunk ci - 1's set may fly */
    else cp_async_wait_all();
    __syncthreads();
    if (ci + 1 < cl) flow_signal(fb, ci + 1, h, HV);   /* chunk ci + 1's dS, dVn are written */
    st_glast gl = st_glast_load(p, w, t0, m, h);
    PH(3);
    /* dVn = [Aqk^T | kg] [dO ; dS]; -dVn kept in the shadow Vb for the dS update */
    if (ig.me) {                                   /* beside dVn (ig: st_idle_of) */
      st_keep(p, w.dh, (int64_t)ci * HV * K * V + h * K * V, c0, t, ig.tid, ig.nth);
      if (ci > cf + NS - 2) st_stage(p, w, tn, w.ctab[4 * (ci - NS + 1) + 1], w.ctab[4 * (ci - NS + 1) + 2], h, c0, dout, ALL, ig.tid, ig.nth);
    }
    mma_ldm(p.C, NV, bt{t.A, t.CB, 0}, bt{t.dO, t.DB, 0}, p.C, bt{t.kg, t.KB, 1}, bt{t.Sb, t.DB, 0}, t.K16,
            pairs2([&](int r, int c, float x0, float x1) { st_dvn(t, r, c, x0, x1, m, c0 + c < V, c0 + c + 1 < V, dvn0 + r * HVV + c, nullptr); }));
    /* the kept dS and the next set's copies after dVn, the product the step's chain starts
     * with, not before it (dS's shadow is written by the update, after the barrier below; tn's
     * tiles are free since the barrier above). H200, one run, three rounds (2026-12-04s35b):
     * k_bwd_flow at (1,8192,16,128) 659.9 -> 631.6 us (ncu) from the one barrier above alone,
     * 519.0 with these after dVn; fwd+bwd there in a graph 1.899-1.908 -> 1.787 ms; the lone
     * pass at (8,512,4,64) unchanged (23.8 us) */
    if (!ig.on) {
      st_keep(p, w.dh, (int64_t)ci * HV * K * V + h * K * V, c0, t);
      if (ci > cf + NS - 2) st_stage(p, w, tn, w.ctab[4 * (ci - NS + 1) + 1], w.ctab[4 * (ci - NS + 1) + 2], h, c0, dout, ALL);
    }
    cp_async_commit();
    st_en_store(p, t, gl);
    __syncthreads();                               /* dVn done with Sb before the update writes it */
    PH(4);
    /* dS <- e^{G_last} dS + [s qg^T | -W^T] [dO ; dVn] */
    mma_ldm(t.K16, NV, bt{t.qg, t.KB, 0}, bt{t.dO, t.DB, 0}, p.C, bt{t.W, t.KB, 0}, bt{t.Vb, t.DB, 0}, p.C,
            pairs2([&](int d, int c, float x0, float x1) { st_s_upd2(t, d, c, x0, x1); }));
    PH(5);
  };
  if constexpr (NS == 3)
    for (int ci = cl - 1; ci >= cf; ci -= 3) {
      step(t0s, t2s, ci);
      if (ci - 1 >= cf) step(t1s, t0s, ci - 1);
      if (ci - 2 >= cf) step(t2s, t1s, ci - 2);
    }
  else
    for (int ci = cl - 1; ci >= cf; ci -= 2) {
      step(t0s, t1s, ci);
      if (ci - 1 >= cf) step(t1s, t0s, ci - 1);
    }
  __syncthreads();
  if (cf < cl) flow_signal(fb, cf, h, HV);
  if (dh0) st_st<NV>(p, dh0, b.sbase, c0, t0s);
}
#endif
