/* kda_cuda.cu — CUDA KDA: chunked forward / backward (KDA.md §3, §4) and the recurrent decode
 * (§5). Two versions of the chunked kernels share one fp32 scratch layout:
 *   version 2 (default): tensor-core MMAs for every GEMM-shaped step — see "version 2" below;
 *   version 1 (KDA_KDA_SIMPLE=1, and the fallback when v2's tiles do not fit in shared
 *   memory): every step mirrors core/kda_ref.c in scalar fp32, described here.
 *
 * Pipeline (one value head h, chunk = C rows, tokens tt = absolute rows of the B*T axis):
 *   k_chunks     1 block: chunk table (seq, first token, rows) from cu_seqlens or B, T
 *   k_rows       per (token, value head): l2-normalised q, k; gate -> log-decay; beta
 *   k_intra      per (chunk, head): G = cumsum g; Aqk (x s), L, M = (I+L)^-1 (forward
 *                substitution); W = M Kb, U = M (bV), kg = k e^{Gn-G}, qg = q e^G
 *   k_state_fwd  per (sequence, head, 32 V columns), sequential over chunks: Vn = U - W S,
 *                o = s qg S + Aqk Vn, S <- e^{Gn} S + kg^T Vn
 * Backward: k_chunks, k_rows, k_intra (recompute), then
 *   k_state_bwd  per (sequence, head, V tile): forward sweep storing S per chunk and Vn, reverse
 *                sweep storing dS per chunk and dVn = Aqk^T dO + kg dS; dh0
 *   k_bwd_rows   per (chunk, head): dQ_inter, dKi, dW (contractions over V with S0, dS)
 *   k_bwd_mat    per (chunk, head): dA, dM, dL = -tril(M^T dM M^T), dv, dKb, dbeta (WY part)
 *   k_bwd_final  per (chunk, head): intra terms, dG, reverse cumsum, gate / beta chains
 *   k_qk_bwd     per (token, q/k head): GVA group sum + l2-norm backward -> dq, dk
 * Every exponent is of a difference G_i - G_j with i >= j (or of G itself), so <= 0 when g <= 0:
 * nothing overflows for any decay strength.
 *
 * Files: this one holds the shared pipeline (k_chunks, k_rows, k_qk_bwd, k_gate_reduce), version
 * 1's kernels and the host side of both versions; version 2's kernels are in kda_tc.cu; what
 * both use (kp, the scratch layout ws, device helpers, the gate chain) is in kda_common.cuh. */
#include "kda_common.cuh"

/* carve the workspace; returns bytes used (base may be NULL to just count) */
static int64_t ws_layout(const kda_kda_args *a, int backward, char *base, ws *w) {
  int64_t TH = a->B * a->T * a->HV, K = a->K, V = a->V, C = a->chunk, NTu = n_chunks_max(a);
  int64_t off = 0;
  auto take = [&](int64_t bytes) -> char * {
    char *p = base ? base + off : nullptr;
    off += (bytes + 255) / 256 * 256;
    return p;
  };
  w->ctab = (int *)take(NTu * 4 * 4);
  w->sfirst = (int *)take((n_seq(a) + 1) * 4);
  w->qn = (float *)take(TH * K * 4), w->kn = (float *)take(TH * K * 4);
  w->G = (float *)take(TH * K * 4), w->b = (float *)take(TH * 4);
  w->Aqk = (float *)take(TH * C * 4), w->M = (float *)take(TH * C * 4);
  /* W, kg, qg: fp32 rows of K (version 1), bf16 rows of r16(K) (version 2) or fp32 rows of
   * r16(K) (version 2's precise backward): the last is the largest */
  int64_t KB = TH * ((K + 15) / 16 * 16) * 4;
  w->W = (float *)take(KB), w->kg = (float *)take(KB);
  w->qg = (float *)take(KB), w->U = (float *)take(TH * V * 4);
  w->Wb = (bf16 *)w->W, w->kgb = (bf16 *)w->kg, w->qgb = (bf16 *)w->qg, w->Ab = (bf16 *)w->Aqk;
  w->Kb = w->vn = w->dvn = w->h = w->dh = nullptr;
  if (backward) {
    w->vn = (float *)take(TH * V * 4), w->dvn = (float *)take(TH * V * 4);
    w->Kb = (float *)take(TH * K * 4);
    w->dQ = (float *)take(TH * K * 4), w->dKi = (float *)take(TH * K * 4);
    w->dW = (float *)take(TH * K * 4), w->dKb = (float *)take(TH * K * 4);
    w->dA = (float *)take(TH * C * 4), w->dL = (float *)take(TH * C * 4);
    w->db = (float *)take(TH * 4);
    w->h = (float *)take(NTu * a->HV * K * V * 4), w->dh = (float *)take(NTu * a->HV * K * V * 4);
    w->dgn = (float *)take(NTu * a->HV * K * 4);
    w->gpart = (float *)take(NTu * a->HV * (K + 1) * 4);
  }
  return off;
}

/* ---- chunk table ------------------------------------------------------------------------ */

/* Equal-length sequences (no cu_seqlens): chunk idx is chunk idx % nc of sequence idx / nc,
 * written by a thread each (H200, (8,2048,16,128): 8.5 -> 2.1 us; the serial loop below took
 * ~10 us at B = 32, 1% of a small fwd+bwd). Packed sequences: one thread walks them (sequence
 * starts need a prefix sum). */
__global__ void k_chunks(kp p, int64_t NTu, int *ctab, int *sfirst) {
  if (!p.cu) {
    int64_t nc = (p.T + p.C - 1) / p.C;
    for (int64_t idx = threadIdx.x; idx < NTu; idx += blockDim.x) {
      int64_t n = idx / nc, t0 = idx % nc * p.C;
      ctab[4 * idx] = (int)n, ctab[4 * idx + 1] = (int)(n * p.T + t0);
      ctab[4 * idx + 2] = (int)(p.T - t0 < p.C ? p.T - t0 : p.C), ctab[4 * idx + 3] = 0;
    }
    for (int64_t n = threadIdx.x; n <= p.B; n += blockDim.x) sfirst[n] = (int)(n * nc);
    return;
  }
  if (threadIdx.x || blockIdx.x) return;
  int64_t N = p.cu ? p.nseq : p.B, idx = 0;
  for (int64_t n = 0; n < N; n++) {
    int64_t bos, len;
    seq_span(p, n, &bos, &len);
    sfirst[n] = (int)idx;
    for (int64_t t0 = 0; t0 < len && idx < NTu; t0 += p.C, idx++) {
      ctab[4 * idx] = (int)n, ctab[4 * idx + 1] = (int)(bos + t0);
      ctab[4 * idx + 2] = (int)(len - t0 < p.C ? len - t0 : p.C), ctab[4 * idx + 3] = 0;
    }
  }
  sfirst[N] = (int)idx;
  for (; idx < NTu; idx++) ctab[4 * idx + 2] = 0;
}

/* ---- per-row preprocessing: l2 norm, gate, beta (§2.1–2.3) -------------------------------- */

/* one warp per (token, value head) row (8 rows per block): the l2 norms are fixed-order shuffle
 * sums, no block barriers. It was a block of 128 threads per row with two block sums: 0.35 ms
 * at (8,2048,16,128) for ~0.6 GB of traffic, scheduling-bound. */
__global__ void k_rows(kp p, const void *q, const void *k, const void *g, const void *beta,
                       const float *A_log, const float *dt_bias, ws w) {
  int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= p.B * p.T * p.HV) return;
  int lane = threadIdx.x & 31;
  int64_t tt = row / p.HV, h = row % p.HV, K = p.K, hq = h / (p.HV / p.H);
  int64_t iq = (tt * p.H + hq) * K, io = row * K;
  float sq = 0, sk = 0;
  for (int64_t d = lane; d < K; d += 32) {
    float x = ldb(q, iq + d), y = ldb(k, iq + d);
    sq += x * x, sk += y * y;
  }
  sq = kc_warp_sum(sq), sk = kc_warp_sum(sk);
  float rq = p.l2 ? rsqrtf(sq + L2_EPS) : 1.f, rk = p.l2 ? rsqrtf(sk + L2_EPS) : 1.f;
  float ea = A_log ? expf(A_log[h]) : 1.f;
  for (int64_t d = lane; d < K; d += 32) {
    w.qn[io + d] = ldb(q, iq + d) * rq;
    w.kn[io + d] = ldb(k, iq + d) * rk;
    float x = ldb(g, io + d), gl;
    if (p.gate_mode == 0) gl = x;
    else {
      if (dt_bias) x += dt_bias[h * K + d];
      gl = p.gate_mode == 1 ? -ea * softplus(x) : p.lb * sigm(ea * x);
    }
    w.G[io + d] = gl;
  }
  if (lane == 0) {
    float b = ldb(beta, row);
    w.b[row] = p.beta_mode == 0 ? b : (p.beta_mode == 2 ? 2.f : 1.f) * sigm(b);
  }
}

/* 4 bf16 at p[i] (8-byte aligned) as floats */
static __device__ __forceinline__ float4 ld4b(const void *p, int64_t i) {
  uint2 u = *(const uint2 *)((const bf16 *)p + i);
  float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
  return make_float4(a.x, a.y, b.x, b.y);
}

/* The same for K % 4 == 0, K <= 128 NJ and 8-byte aligned q, k, g: a lane holds 4 adjacent
 * columns of q, k, g (8-byte loads, each read once; the general form reads q, k twice, 2 bytes
 * a load) and stores float4s of qn, kn, G. Same arithmetic per element (the norms' sums in
 * another order). H200, (8,2048,16,128): 206 -> 149 us. */
template <int NJ>
__global__ void k_rows4(kp p, const void *q, const void *k, const void *g, const void *beta,
                        const float *A_log, const float *dt_bias, ws w) {
  int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= p.B * p.T * p.HV) return;
  int lane = threadIdx.x & 31;
  int64_t tt = row / p.HV, h = row % p.HV, K = p.K, hq = h / (p.HV / p.H);
  int64_t iq = (tt * p.H + hq) * K, io = row * K;
  float4 xq[NJ], xk[NJ], xg[NJ];
  float sq = 0, sk = 0;
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    int64_t d = 4 * lane + 128 * j;
    if (d >= K) break;
    xq[j] = ld4b(q, iq + d), xk[j] = ld4b(k, iq + d), xg[j] = ld4b(g, io + d);
  }
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    if (4 * lane + 128 * j >= K) break;
    sq += xq[j].x * xq[j].x + xq[j].y * xq[j].y + xq[j].z * xq[j].z + xq[j].w * xq[j].w;
    sk += xk[j].x * xk[j].x + xk[j].y * xk[j].y + xk[j].z * xk[j].z + xk[j].w * xk[j].w;
  }
  sq = kc_warp_sum(sq), sk = kc_warp_sum(sk);
  float rq = p.l2 ? rsqrtf(sq + L2_EPS) : 1.f, rk = p.l2 ? rsqrtf(sk + L2_EPS) : 1.f;
  float ea = A_log ? expf(A_log[h]) : 1.f;
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    int64_t d = 4 * lane + 128 * j;
    if (d >= K) break;
    float x[4] = {xg[j].x, xg[j].y, xg[j].z, xg[j].w}, gl[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (p.gate_mode == 0) gl[u] = x[u];
      else {
        if (dt_bias) x[u] += dt_bias[h * K + d + u];
        gl[u] = p.gate_mode == 1 ? -ea * softplus(x[u]) : p.lb * sigm(ea * x[u]);
      }
    }
    *(float4 *)(w.qn + io + d) = make_float4(xq[j].x * rq, xq[j].y * rq, xq[j].z * rq, xq[j].w * rq);
    *(float4 *)(w.kn + io + d) = make_float4(xk[j].x * rk, xk[j].y * rk, xk[j].z * rk, xk[j].w * rk);
    *(float4 *)(w.G + io + d) = make_float4(gl[0], gl[1], gl[2], gl[3]);
  }
  if (lane == 0) {
    float b = ldb(beta, row);
    w.b[row] = p.beta_mode == 0 ? b : (p.beta_mode == 2 ? 2.f : 1.f) * sigm(b);
  }
}

/* ---- intra-chunk: G, Aqk, L, M, W, U, kg, qg ----------------------------------------------- */

static size_t smem_intra(int64_t C, int64_t K) {
  return (size_t)(3 * C * (K + 1) + 3 * C * (C + 1) + C) * sizeof(float);
}

__global__ void k_intra(kp p, const void *v, ws w) {
  extern __shared__ float sm[];
  const int *ct = w.ctab + 4 * blockIdx.x;
  int n = ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = blockIdx.y, K = p.K, V = p.V, HV = p.HV, C = p.C, KP = K + 1, CP = C + 1;
  float *qs = sm, *ks = qs + C * KP, *Gs = ks + C * KP, *As = Gs + C * KP, *Ls = As + C * CP,
        *Ms = Ls + C * CP, *bs = Ms + C * CP;
  int tid = threadIdx.x;
  for (int64_t e = tid; e < n * K; e += NT) {
    int64_t r = e / K, d = e % K, gi = ((t0 + r) * HV + h) * K + d;
    qs[r * KP + d] = w.qn[gi], ks[r * KP + d] = w.kn[gi], Gs[r * KP + d] = w.G[gi];
  }
  for (int r = tid; r < n; r += NT) bs[r] = w.b[(t0 + r) * HV + h];
  __syncthreads();
  for (int64_t d = tid; d < K; d += NT) {            /* chunk-local inclusive cumsum */
    float acc = 0;
    for (int r = 0; r < n; r++) {
      acc += Gs[r * KP + d];
      Gs[r * KP + d] = acc;
      w.G[((t0 + r) * HV + h) * K + d] = acc;
    }
  }
  __syncthreads();
  for (int e = tid; e < n * n; e += NT) {           /* Aqk (i >= j) and L (i > j) */
    int i = e / n, j = e % n;
    float aq = 0, ak = 0;
    if (j <= i)
      for (int64_t d = 0; d < K; d++) {
        float x = __expf(Gs[i * KP + d] - Gs[j * KP + d]) * ks[j * KP + d];
        aq += qs[i * KP + d] * x, ak += ks[i * KP + d] * x;
      }
    As[i * CP + j] = j <= i ? p.scale * aq : 0.f;
    Ls[i * CP + j] = j < i ? bs[i] * ak : 0.f;
  }
  __syncthreads();
  for (int i = 0; i < n; i++) {                    /* forward substitution, row by row */
    for (int j = tid; j < n; j += NT) {
      float acc = 0;
      for (int m = j; m < i; m++) acc += Ls[i * CP + m] * Ms[m * CP + j];
      Ms[i * CP + j] = j < i ? -acc : (j == i ? 1.f : 0.f);
    }
    __syncthreads();
  }
  for (int64_t e = tid; e < n * C; e += NT) {
    int64_t i = e / C, j = e % C, gi = ((t0 + i) * HV + h) * C + j;
    w.Aqk[gi] = j < n ? As[i * CP + j] : 0.f;
    w.M[gi] = j < n ? Ms[i * CP + j] : 0.f;
  }
  for (int64_t e = tid; e < n * K; e += NT) {      /* kg, qg; ks <- Kb = b k e^G */
    int64_t r = e / K, d = e % K, gi = ((t0 + r) * HV + h) * K + d;
    float G = Gs[r * KP + d], Gn = Gs[(n - 1) * KP + d];
    w.kg[gi] = ks[r * KP + d] * __expf(Gn - G);
    w.qg[gi] = qs[r * KP + d] * __expf(G);
  }
  __syncthreads();
  for (int64_t e = tid; e < n * K; e += NT) {
    int64_t r = e / K, d = e % K;
    ks[r * KP + d] *= bs[r] * __expf(Gs[r * KP + d]);
  }
  __syncthreads();
  for (int64_t e = tid; e < n * K; e += NT) {      /* W = M Kb */
    int64_t i = e / K, d = e % K;
    float acc = 0;
    for (int j = 0; j <= i; j++) acc += Ms[i * CP + j] * ks[j * KP + d];
    w.W[((t0 + i) * HV + h) * K + d] = acc;
  }
  for (int64_t e = tid; e < n * V; e += NT) {      /* U = M (b V) */
    int64_t i = e / V, c = e % V;
    float acc = 0;
    for (int j = 0; j <= i; j++) acc += Ms[i * CP + j] * bs[j] * ldb(v, ((t0 + j) * HV + h) * V + c);
    w.U[((t0 + i) * HV + h) * V + c] = acc;
  }
}

/* ---- state pass (sequential over chunks) --------------------------------------------------- */

static size_t smem_state(int64_t C, int64_t K) { return (size_t)(K * BV + 3 * C * BV) * sizeof(float); }

/* Vn[i][c] = U - W S for this block's columns; also to global if vn */
static __device__ void st_vn(const kp &p, const ws &w, int64_t t0, int n, int64_t h, int64_t c0,
                             const float *S, float *Vn, float *vn) {
  int64_t K = p.K, V = p.V, HV = p.HV;
  for (int e = threadIdx.x; e < n * BV; e += NT) {
    int i = e / BV, c = e % BV;
    float acc = 0;
    if (c0 + c < V) {
      int64_t r = (t0 + i) * HV + h;
      acc = w.U[r * V + c0 + c];
      for (int64_t d = 0; d < K; d++) acc -= w.W[r * K + d] * S[d * BV + c];
      if (vn) vn[r * V + c0 + c] = acc;
    }
    Vn[i * BV + c] = acc;
  }
}

/* S <- e^{Gn} S + kg^T Vn (reads S and Vn; caller syncs before and after) */
static __device__ void st_update(const kp &p, const ws &w, int64_t t0, int n, int64_t h,
                                 float *S, const float *Vn) {
  int64_t K = p.K, HV = p.HV;
  for (int64_t e = threadIdx.x; e < K * BV; e += NT) {
    int64_t d = e / BV, c = e % BV;
    float acc = __expf(w.G[((t0 + n - 1) * HV + h) * K + d]) * S[d * BV + c];
    for (int j = 0; j < n; j++) acc += w.kg[((t0 + j) * HV + h) * K + d] * Vn[j * BV + c];
    S[d * BV + c] = acc;
  }
}

static __device__ void st_load(const kp &p, const float *src, int64_t base, int64_t c0, float *S) {
  for (int64_t e = threadIdx.x; e < p.K * BV; e += NT) {
    int64_t d = e / BV, c = e % BV;
    S[e] = src && c0 + c < p.V ? src[base + d * p.V + c0 + c] : 0.f;
  }
}
static __device__ void st_store(const kp &p, float *dst, int64_t base, int64_t c0, const float *S) {
  for (int64_t e = threadIdx.x; e < p.K * BV; e += NT) {
    int64_t d = e / BV, c = e % BV;
    if (c0 + c < p.V) dst[base + d * p.V + c0 + c] = S[e];
  }
}

__global__ void k_state_fwd(kp p, ws w, const float *h0, void *o, float *ht) {
  extern __shared__ float sm[];
  int64_t n = blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * BV, K = p.K, V = p.V, HV = p.HV;
  float *S = sm, *Vn = S + K * BV;
  int64_t sbase = (n * HV + h) * K * V;
  st_load(p, h0, sbase, c0, S);
  __syncthreads();
  for (int ci = w.sfirst[n]; ci < w.sfirst[n + 1]; ci++) {
    int64_t t0 = w.ctab[4 * ci + 1];
    int m = w.ctab[4 * ci + 2];
    st_vn(p, w, t0, m, h, c0, S, Vn, nullptr);
    __syncthreads();
    for (int e = threadIdx.x; e < m * BV; e += NT) {   /* o = s qg S + Aqk Vn */
      int i = e / BV, c = e % BV;
      if (c0 + c >= V) continue;
      int64_t r = (t0 + i) * HV + h;
      float acc = 0, acc2 = 0;
      for (int64_t d = 0; d < K; d++) acc += w.qg[r * K + d] * S[d * BV + c];
      for (int j = 0; j <= i; j++) acc2 += w.Aqk[r * p.C + j] * Vn[j * BV + c];
      stb(o, r * V + c0 + c, p.scale * acc + acc2);
    }
    __syncthreads();
    st_update(p, w, t0, m, h, S, Vn);
    __syncthreads();
  }
  if (ht) st_store(p, ht, sbase, c0, S);
}

__global__ void k_state_bwd(kp p, ws w, const float *h0, const void *dout, const float *dht,
                            float *dh0) {
  extern __shared__ float sm[];
  int64_t n = blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * BV, K = p.K, V = p.V, HV = p.HV, C = p.C;
  float *S = sm, *Vn = S + K * BV, *dO = Vn + C * BV, *dV = dO + C * BV;
  int64_t sbase = (n * HV + h) * K * V;
  st_load(p, h0, sbase, c0, S);
  __syncthreads();
  int cf = w.sfirst[n], cl = w.sfirst[n + 1];
  for (int ci = cf; ci < cl; ci++) {                 /* forward sweep: h[c], Vn */
    int64_t t0 = w.ctab[4 * ci + 1];
    int m = w.ctab[4 * ci + 2];
    st_store(p, w.h, (int64_t)ci * HV * K * V + h * K * V, c0, S);
    st_vn(p, w, t0, m, h, c0, S, Vn, w.vn);
    __syncthreads();
    st_update(p, w, t0, m, h, S, Vn);
    __syncthreads();
  }
  float *dS = S;                                      /* reverse sweep (§4.2) */
  st_load(p, dht, sbase, c0, dS);
  __syncthreads();
  for (int ci = cl - 1; ci >= cf; ci--) {
    int64_t t0 = w.ctab[4 * ci + 1];
    int m = w.ctab[4 * ci + 2];
    st_store(p, w.dh, (int64_t)ci * HV * K * V + h * K * V, c0, dS);
    for (int e = threadIdx.x; e < m * BV; e += NT) {
      int i = e / BV, c = e % BV;
      dO[e] = c0 + c < V ? ldb(dout, ((t0 + i) * HV + h) * V + c0 + c) : 0.f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < m * BV; e += NT) { /* dVn = Aqk^T dO + kg dS */
      int j = e / BV, c = e % BV;
      int64_t r = (t0 + j) * HV + h;
      float acc = 0;
      for (int i = j; i < m; i++) acc += w.Aqk[((t0 + i) * HV + h) * C + j] * dO[i * BV + c];
      for (int64_t d = 0; d < K; d++) acc += w.kg[r * K + d] * dS[d * BV + c];
      dV[e] = acc;
      if (c0 + c < V) w.dvn[r * V + c0 + c] = acc;
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < K * BV; e += NT) { /* dS <- e^{Gn} dS + s qg^T dO - W^T dVn */
      int64_t d = e / BV, c = e % BV;
      float acc = __expf(w.G[((t0 + m - 1) * HV + h) * K + d]) * dS[e];
      for (int i = 0; i < m; i++) {
        int64_t r = (t0 + i) * HV + h;
        acc += p.scale * w.qg[r * K + d] * dO[i * BV + c] - w.W[r * K + d] * dV[i * BV + c];
      }
      dS[e] = acc;
    }
    __syncthreads();
  }
  if (dh0) st_store(p, dh0, sbase, c0, dS);
}

/* ---- backward, chunk-parallel (§4.3) ---------------------------------------------------------- */

/* dQ_inter = s (dO S0^T) e^G, dKi = (Vn dSe^T) e^{Gn-G}, dW = -dVn S0^T, per (row, d) */
__global__ void k_bwd_rows(kp p, const void *dout, ws w) {
  const int *ct = w.ctab + 4 * blockIdx.x;
  int n = ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = blockIdx.y, K = p.K, V = p.V, HV = p.HV;
  const float *S0 = w.h + ((int64_t)blockIdx.x * HV + h) * K * V;
  const float *dS = w.dh + ((int64_t)blockIdx.x * HV + h) * K * V;
  for (int64_t e = threadIdx.x; e < n * K; e += NT) {
    int64_t i = e / K, d = e % K, r = (t0 + i) * HV + h;
    float aq = 0, ak = 0, aw = 0;
    for (int64_t c = 0; c < V; c++) {
      float s0 = S0[d * V + c];
      aq += ldb(dout, r * V + c) * s0;
      ak += w.vn[r * V + c] * dS[d * V + c];
      aw += w.dvn[r * V + c] * s0;
    }
    float G = w.G[r * K + d], Gn = w.G[((t0 + n - 1) * HV + h) * K + d];
    w.dQ[r * K + d] = p.scale * aq * __expf(G);
    w.dKi[r * K + d] = ak * __expf(Gn - G);
    w.dW[r * K + d] = -aw;
  }
}

static size_t smem_mat(int64_t C) { return (size_t)(3 * C * (C + 1) + C) * sizeof(float); }

/* dA, dM, dL, dv, dKb and the WY part of dbeta */
__global__ void k_bwd_mat(kp p, const void *v, const void *dout, void *dv, ws w) {
  extern __shared__ float sm[];
  const int *ct = w.ctab + 4 * blockIdx.x;
  int n = ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = blockIdx.y, K = p.K, V = p.V, HV = p.HV, C = p.C, CP = C + 1;
  float *Ms = sm, *dM = Ms + C * CP, *X = dM + C * CP, *dbs = X + C * CP;
  int tid = threadIdx.x;
#define ROW(i) (((t0 + (i)) * HV + h))
  for (int e = tid; e < n * n; e += NT) Ms[(e / n) * CP + e % n] = w.M[ROW(e / n) * C + e % n];
  for (int r = tid; r < n; r += NT) dbs[r] = 0;
  for (int e = tid; e < n * n; e += NT) {
    int i = e / n, j = e % n;
    float da = 0, dm = 0;
    if (j <= i)
      for (int64_t c = 0; c < V; c++) da += ldb(dout, ROW(i) * V + c) * w.vn[ROW(j) * V + c];
    if (j < i) {
      float bj = w.b[ROW(j)];
      for (int64_t c = 0; c < V; c++) dm += w.dvn[ROW(i) * V + c] * bj * ldb(v, ROW(j) * V + c);
      for (int64_t d = 0; d < K; d++)
        dm += w.dW[ROW(i) * K + d] * bj * w.kn[ROW(j) * K + d] * __expf(w.G[ROW(j) * K + d]);
    }
    w.dA[ROW(i) * C + j] = p.scale * da;
    dM[i * CP + j] = dm;
  }
  __syncthreads();
  for (int e = tid; e < n * n; e += NT) {           /* X = dM M^T (dM strictly lower) */
    int i = e / n, j = e % n;
    float acc = 0;
    for (int m = 0; m < i && m <= j; m++) acc += dM[i * CP + m] * Ms[j * CP + m];
    X[i * CP + j] = acc;
  }
  __syncthreads();
  for (int e = tid; e < n * n; e += NT) {           /* dL = -StrictTril(M^T X) */
    int i = e / n, j = e % n;
    float acc = 0;
    if (j < i)
      for (int m = i; m < n; m++) acc += Ms[m * CP + i] * X[m * CP + j];
    w.dL[ROW(i) * C + j] = -acc;
  }
  for (int64_t e = tid; e < n * V; e += NT) {       /* dv = b M^T dU; dbeta += (M^T dU) . v */
    int64_t j = e / V, c = e % V;
    float acc = 0;
    for (int i = j; i < n; i++) acc += Ms[i * CP + j] * w.dvn[ROW(i) * V + c];
    stb(dv, ROW(j) * V + c, w.b[ROW(j)] * acc);
    w.vn[ROW(j) * V + c] = acc * ldb(v, ROW(j) * V + c);  /* vn is dead: keep the product */
  }
  for (int64_t e = tid; e < n * K; e += NT) {       /* dKb = M^T dW; dbeta += dKb . k e^G */
    int64_t j = e / K, d = e % K;
    float acc = 0;
    for (int i = j; i < n; i++) acc += Ms[i * CP + j] * w.dW[ROW(i) * K + d];
    w.dKb[ROW(j) * K + d] = acc;
  }
  __syncthreads();
  for (int r = tid; r < n; r += NT) {               /* dbeta (WY part), fixed order: no atomics */
    float acc = 0;
    for (int64_t c = 0; c < V; c++) acc += w.vn[ROW(r) * V + c];
    for (int64_t d = 0; d < K; d++) acc += w.dKb[ROW(r) * K + d] * w.kn[ROW(r) * K + d] * __expf(w.G[ROW(r) * K + d]);
    w.db[ROW(r)] = acc;
  }
}

/* intra-chunk terms, dG and its reverse cumsum, gate and beta chains. One thread per column d
 * walks the rows, so the reverse cumsum is a plain loop. */
__global__ void k_bwd_final(kp p, const void *g, const void *beta, const float *A_log,
                            const float *dt_bias, void *dg, void *dbeta, float *dA_log,
                            float *ddt_bias, ws w) {
  extern __shared__ float sm[];
  __shared__ float red[32];
  const int *ct = w.ctab + 4 * blockIdx.x;
  int n = ct[2];
  if (!n) return;
  int64_t t0 = ct[1], h = blockIdx.y, K = p.K, V = p.V, HV = p.HV, C = p.C, CP = C + 1;
  float *dAs = sm, *dLs = dAs + C * CP, *bs = dLs + C * CP, *dbs = bs + C;
  int tid = threadIdx.x;
  for (int e = tid; e < n * n; e += blockDim.x) {
    int i = e / n, j = e % n;
    dAs[i * CP + j] = w.dA[ROW(i) * C + j];
    dLs[i * CP + j] = w.dL[ROW(i) * C + j];
  }
  for (int r = tid; r < n; r += blockDim.x) bs[r] = w.b[ROW(r)], dbs[r] = w.db[ROW(r)];
  __syncthreads();
  const float *S0 = w.h + ((int64_t)blockIdx.x * HV + h) * K * V;
  const float *dS = w.dh + ((int64_t)blockIdx.x * HV + h) * K * V;
  float ea = A_log ? expf(A_log[h]) : 1.f, dAl = 0;
  for (int64_t d = tid; d < K; d += blockDim.x) {
    float Gn = w.G[ROW(n - 1) * K + d], dGn = 0;
    for (int64_t c = 0; c < V; c++) dGn += S0[d * V + c] * dS[d * V + c];
    dGn *= __expf(Gn);
    for (int r = 0; r < n; r++) dGn += w.kn[ROW(r) * K + d] * w.dKi[ROW(r) * K + d];
    for (int r = 0; r < n; r++) {
      int64_t ir = ROW(r) * K + d;
      float qr = w.qn[ir], kr = w.kn[ir], Gr = w.G[ir], er = __expf(Gr), br = bs[r];
      float dq = w.dQ[ir], dki = w.dKi[ir], dkb = w.dKb[ir];
      float dG = qr * dq - kr * dki + br * kr * er * dkb, dk = dki + dkb * br * er, dbp = 0;
      float dqi_sum = 0;
      for (int j = 0; j <= r; j++) {                 /* r as the row index */
        int64_t ij = ROW(j) * K + d;
        float kj = w.kn[ij], E = __expf(Gr - w.G[ij]);
        float dqi = dAs[r * CP + j] * kj * E, rr = j < r ? dLs[r * CP + j] * kj * E : 0.f;
        dqi_sum += dqi;
        dk += br * rr, dbp += kr * rr;
        dG += qr * dqi + kr * br * rr;
      }
      dq += dqi_sum;
      for (int i = r; i < n; i++) {                  /* r as the column index */
        int64_t ii = ROW(i) * K + d;
        float E = __expf(w.G[ii] - Gr);
        float col = (dAs[i * CP + r] * w.qn[ii] + (i > r ? dLs[i * CP + r] * bs[i] * w.kn[ii] : 0.f)) * E;
        dk += col, dG -= kr * col;
      }
      w.dQ[ir] = dq, w.dKi[ir] = dk, w.dW[ir] = dG; /* dQ, dKi now hold the totals; dW holds dG */
      w.dKb[ir] = dbp;                               /* dKb read above: reuse for dbeta terms */
    }
    /* reverse cumsum + gate chain (§2.1); ddt_bias partials reduced by k_gate_reduce */
    w.gpart[((int64_t)blockIdx.x * HV + h) * (K + 1) + d] =
        gate_chain_col(p, w, g, dt_bias, A_log != NULL, dg, t0, h, n, d, dGn, ea, &dAl);
  }
  dAl = block_sum(dAl, red);
  if (tid == 0) w.gpart[((int64_t)blockIdx.x * HV + h) * (K + 1) + K] = dAl;
  __syncthreads();
  for (int r = tid; r < n; r += blockDim.x) {        /* beta chain (§2.2) */
    float db = dbs[r], x = ldb(beta, ROW(r));
    for (int64_t d = 0; d < K; d++) db += w.dKb[ROW(r) * K + d];   /* fixed order */
    if (p.beta_mode) {
      float s = sigm(x);
      db *= (p.beta_mode == 2 ? 2.f : 1.f) * s * (1 - s);
    }
    stb(dbeta, ROW(r), db);
  }
#undef ROW
}

/* GVA group sum of the per-value-head dq, dk (wrt normalised), then the l2-norm backward, one
 * warp per (token, key head) row (as k_rows); the general form (any K, any alignment) */
__global__ void k_qk_bwd(kp p, const void *q, const void *k, void *dq, void *dk, ws w) {
  int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= p.B * p.T * p.H) return;
  int lane = threadIdx.x & 31;
  int64_t tt = row / p.H, hq = row % p.H, K = p.K, grp = p.HV / p.H;
  for (int which = 0; which < 2; which++) {
    const void *x = which ? k : q;
    const float *src = which ? w.dKi : w.dQ;
    void *dst = which ? dk : dq;
    int64_t ix = row * K;
    float ss = 0, dot = 0;
    for (int64_t d = lane; d < K; d += 32) {
      float xv = ldb(x, ix + d), dy = 0;
      for (int64_t j = 0; j < grp; j++) dy += src[(tt * p.HV + hq * grp + j) * K + d];
      ss += xv * xv, dot += dy * xv;
    }
    ss = kc_warp_sum(ss), dot = kc_warp_sum(dot);
    float r = rsqrtf(ss + L2_EPS);
    for (int64_t d = lane; d < K; d += 32) {
      float dy = 0;
      for (int64_t j = 0; j < grp; j++) dy += src[(tt * p.HV + hq * grp + j) * K + d];
      float out = p.l2 ? r * dy - r * r * r * dot * ldb(x, ix + d) : dy;  /* y = x r */
      stb(dst, ix + d, out);
    }
  }
}

/* The same for K % 4 == 0, K <= 128 NJ, 8-byte aligned q, k, dq, dk: a lane holds 4 adjacent
 * columns (a float4 of each dQ / dKi row of the group, 4 bf16 of q or k) for q and k at once,
 * so every load of the row is in flight together and the gradient rows are read once (the
 * general form reads them twice, q then k, 4 bytes a load). H200, (8,2048,16,128): 462 ->
 * 203 us (~0.54 GB moved: 2.6 TB/s). */
template <int NJ>
__global__ void k_qk_bwd4(kp p, const void *q, const void *k, void *dq, void *dk, ws w) {
  int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= p.B * p.T * p.H) return;
  int lane = threadIdx.x & 31;
  int64_t tt = row / p.H, hq = row % p.H, K = p.K, grp = p.HV / p.H, ix = row * K;
  float4 dy[2][NJ], x[2][NJ];
  float ss[2] = {0.f, 0.f}, dot[2] = {0.f, 0.f};
#pragma unroll
  for (int wh = 0; wh < 2; wh++) {
    const float *src = wh ? w.dKi : w.dQ;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      int64_t d = 4 * lane + 128 * j;
      if (d >= K) break;
      x[wh][j] = ld4b(wh ? k : q, ix + d);
      float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int64_t g = 0; g < grp; g++) {
        float4 b = *(const float4 *)(src + (tt * p.HV + hq * grp + g) * K + d);
        a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
      }
      dy[wh][j] = a;
    }
  }
#pragma unroll
  for (int wh = 0; wh < 2; wh++) {
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      if (4 * lane + 128 * j >= K) break;
      float4 a = x[wh][j], b = dy[wh][j];
      ss[wh] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
      dot[wh] += b.x * a.x + b.y * a.y + b.z * a.z + b.w * a.w;
    }
    ss[wh] = kc_warp_sum(ss[wh]), dot[wh] = kc_warp_sum(dot[wh]);
  }
#pragma unroll
  for (int wh = 0; wh < 2; wh++) {
    float r = rsqrtf(ss[wh] + L2_EPS), c = r * r * r * dot[wh];
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      int64_t d = 4 * lane + 128 * j;
      if (d >= K) break;
      float4 a = x[wh][j], b = dy[wh][j];
      float o[4] = {b.x, b.y, b.z, b.w};
      if (p.l2) o[0] = r * b.x - c * a.x, o[1] = r * b.y - c * a.y, o[2] = r * b.z - c * a.z, o[3] = r * b.w - c * a.w;
      __nv_bfloat162 lo = __floats2bfloat162_rn(o[0], o[1]), hi = __floats2bfloat162_rn(o[2], o[3]);
      uint2 u;
      u.x = *(uint32_t *)&lo, u.y = *(uint32_t *)&hi;
      *(uint2 *)((bf16 *)(wh ? dk : dq) + ix + d) = u;   /* y = x r: dx = r dy - r^3 (dy.x) x */
    }
  }
}

/* ---- decode (§5): per (sequence, value head, 32 V columns), 8 groups of K rows ------------- */

__global__ void k_decode(kp p, const void *q, const void *k, const void *v, const void *g,
                         const void *beta, const float *A_log, const float *dt_bias,
                         float *state, void *o) {
  extern __shared__ float sm[];
  __shared__ float red[32];
  int64_t n = blockIdx.x, h = blockIdx.y, c0 = blockIdx.z * BV, K = p.K, V = p.V, HV = p.HV;
  int64_t hq = h / (HV / p.H);
  float *S = sm, *qs = S + K * BV, *ks = qs + K, *gs = ks + K, *part = gs + K;  /* part [8][BV] */
  int c = threadIdx.x % BV, grpi = threadIdx.x / BV;
  bool live = c0 + c < V;
  int64_t sbase = (n * HV + h) * K * V, bos, len;
  seq_span(p, n, &bos, &len);
  st_load(p, state, sbase, c0, S);
  float ea = A_log ? expf(A_log[h]) : 1.f;
  for (int64_t t = bos; t < bos + len; t++) {
    int64_t iq = (t * p.H + hq) * K, io = (t * HV + h) * K;
    float sq = 0, sk = 0;
    for (int64_t d = threadIdx.x; d < K; d += NT) {
      float x = ldb(q, iq + d), y = ldb(k, iq + d);
      sq += x * x, sk += y * y;
    }
    sq = block_sum(sq, red);
    sk = block_sum(sk, red);
    float rq = p.l2 ? rsqrtf(sq + L2_EPS) : 1.f, rk = p.l2 ? rsqrtf(sk + L2_EPS) : 1.f;
    for (int64_t d = threadIdx.x; d < K; d += NT) {
      qs[d] = ldb(q, iq + d) * rq, ks[d] = ldb(k, iq + d) * rk;
      float x = ldb(g, io + d);
      if (p.gate_mode) {
        if (dt_bias) x += dt_bias[h * K + d];
        x = p.gate_mode == 1 ? -ea * softplus(x) : p.lb * sigm(ea * x);
      }
      gs[d] = x;
    }
    float b = ldb(beta, t * HV + h);
    if (p.beta_mode) b = (p.beta_mode == 2 ? 2.f : 1.f) * sigm(b);
    __syncthreads();
    float acc = 0;                                   /* S' = e^g S; part of S'^T k */
    for (int64_t d = grpi; d < K; d += NT / BV) {
      float s = S[d * BV + c] * __expf(gs[d]);
      S[d * BV + c] = s;
      acc += s * ks[d];
    }
    part[grpi * BV + c] = acc;
    __syncthreads();
    float e = live ? ldb(v, (t * HV + h) * V + c0 + c) : 0.f;
    for (int i = 0; i < NT / BV; i++) e -= part[i * BV + c];
    e *= b;
    __syncthreads();
    acc = 0;                                         /* S += k e^T; o = s S^T q */
    for (int64_t d = grpi; d < K; d += NT / BV) {
      float s = S[d * BV + c] + ks[d] * e;
      S[d * BV + c] = s;
      acc += s * qs[d];
    }
    part[grpi * BV + c] = acc;
    __syncthreads();
    if (grpi == 0 && live) {
      float out = 0;
      for (int i = 0; i < NT / BV; i++) out += part[i * BV + c];
      stb(o, (t * HV + h) * V + c0 + c, p.scale * out);
    }
    __syncthreads();
  }
  st_store(p, state, sbase, c0, S);
}

/* dA_log[h] and ddt_bias[h,:] = sums of the per-chunk partials in chunk order (deterministic) */
__global__ void k_gate_reduce(kp p, ws w, int64_t N, float *dA_log, float *ddt_bias) {
  int64_t h = blockIdx.x, K = p.K, HV = p.HV;
  int nch = w.sfirst[N];
  for (int64_t d = threadIdx.x; d <= K; d += blockDim.x) {
    double s = 0;                                  /* double: N/C partials of mixed sign */
    for (int ci = 0; ci < nch; ci++) s += (double)w.gpart[((int64_t)ci * HV + h) * (K + 1) + d];
    if (d < K) { if (ddt_bias) ddt_bias[h * K + d] = p.gate_mode ? (float)s : 0.f; }
    else if (dA_log) dA_log[h] = p.gate_mode ? (float)s : 0.f;
  }
}

/* ---- host side --------------------------------------------------------------------------------- */

static kp make_kp(const kda_kda_args *a) {
  kp p;
  p.B = a->B, p.T = a->T, p.H = a->H, p.HV = a->HV, p.K = a->K, p.V = a->V;
  p.C = a->chunk, p.gate_mode = a->gate_mode, p.beta_mode = a->beta_mode, p.l2 = a->qk_l2norm;
  p.nseq = a->nseq, p.lb = a->lower_bound, p.cu = a->cu_seqlens;
  p.scale = a->scale != 0 ? a->scale : 1.f / sqrtf((float)a->K);
  return p;
}

#define SHAPE_FMT "(B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld chunk=%d)"
#define SHAPE_ARGS(a) (long long)(a)->B, (long long)(a)->T, (long long)(a)->H, (long long)(a)->HV, \
                      (long long)(a)->K, (long long)(a)->V, (a)->chunk
#define CUDA_OK(call, op)                                                                          \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess)                                                                         \
      return kda_set_error("%s: %s failed " SHAPE_FMT ": %s", op, #call, SHAPE_ARGS(a),            \
                           cudaGetErrorString(e_));                                                \
  } while (0)
#define LAUNCH_OK(what, op) CUDA_OK(cudaGetLastError(), op ": launch " what)

/* opt in to > 48 KB of dynamic shared memory, checking the device limit */
static int smem_opt_in(const void *fn, size_t bytes, const kda_kda_args *a, const char *op,
                       const char *kname) {
  int dev, lim;
  CUDA_OK(cudaGetDevice(&dev), op);
  CUDA_OK(cudaDeviceGetAttribute(&lim, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), op);
  if ((int64_t)bytes > lim)
    return kda_set_error("%s: kernel %s needs %zu bytes of shared memory, the device allows %d "
                         SHAPE_FMT ": use chunk 32 or K <= 128", op, kname, bytes, lim, SHAPE_ARGS(a));
  CUDA_OK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes), op);
  return 0;
}

static int check_common(const kda_kda_args *a, const char *op) {
  if (kda_kda_check_args(a, 0, op)) return -1;
  if (a->chunk != 16 && a->chunk != 32 && a->chunk != 64)
    return kda_set_error("%s: chunk=%d: the CUDA kernels take 16, 32 or 64", op, a->chunk);
  if (a->B * a->T > 0x7fffffff)
    return kda_set_error("%s: B*T=%lld tokens: at most 2^31-1 per call", op, (long long)(a->B * a->T));
  return 0;
}

int64_t kda_kda_cuda_workspace_bytes(const kda_kda_args *a, int backward) {
  ws w;
  return ws_layout(a, backward, nullptr, &w);
}

/* Version 2's precise backward (the _p kernels of kda_tc.cu). dA_log and ddt_bias are sums of
 * dg over tokens (and key dims) whose terms cancel, so their relative error is dg's times a
 * cancellation ratio that depends on the data (1 to ~60 on H = 1 draws of the lower-bound gate);
 * with dg built from bf16/tf32 products (~3e-3) dA_log missed its 3e-3 tolerance by up to 20x.
 * The precise twins run every product that feeds dg in split tf32 (fp32-level error). Picked
 * when a gate with parameters (gate_mode 1, 2) asks for dA_log or ddt_bias; the pre-gated
 * backward (dg only, tolerance 0.02) keeps the bf16/tf32 kernels. KDA_KDA_PRECISE=1 / =0
 * forces it on / off (read per call: to measure its cost, or to test it on any case). */
static int use_precise(const kda_kda_args *a, const float *dA_log, const float *ddt_bias) {
  const char *e = getenv("KDA_KDA_PRECISE");
  if (e && *e) return strcmp(e, "0") != 0;
  return a->gate_mode != 0 && (dA_log || ddt_bias);
}

/* Version 2 (tensor cores) unless KDA_KDA_SIMPLE=1 or one of its kernels' tiles does not fit
 * in the device's shared memory (e.g. K = 256 at chunk 64, or V = 256 with K = 128 in the
 * backward): then version 1 runs the whole call. Read per call, so a test can flip it.
 * prec: the backward's precise kernels (their tiles are sized apart). */
/* the device's opt-in shared memory per block, 0 when it cannot be read */
static int smem_optin_limit(void) {
  int dev, lim;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&lim, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return lim;
}
static int use_tc(const kda_kda_args *a, int backward, int prec) {
  const char *e = getenv("KDA_KDA_SIMPLE");
  if (e && *e && strcmp(e, "0") != 0) return 0;
  int lim = smem_optin_limit();
  if (!lim || a->V > 512) return 0;                /* rows_to_bf16 converts rows of <= 512 */
  size_t need = smem_intra_tc(a->chunk, a->K, a->V);
  size_t st = smem_state_tc(a->chunk, a->K, backward && prec);
  if (st > need) need = st;
  if (backward) {
    size_t x[3] = {smem_rows_tc(a->chunk, a->K, a->V), smem_mat_tc(a->chunk, a->K, a->V),
                   smem_final_tc(a->chunk, a->K)};
    for (size_t y : x) if (y > need) need = y;
  }
  return need <= (size_t)lim;
}

/* the shared front: chunk table, rows, intra (used by forward and by the backward recompute) */
static int front(const kda_kda_args *a, const kp &p, const void *q, const void *k, const void *v,
                 const void *g, const void *beta, const float *A_log, const float *dt_bias,
                 const ws &w, cudaStream_t st, const char *op, int tc, int prec) {
  int64_t NTu = n_chunks_max(a);
  k_chunks<<<1, 256, 0, st>>>(p, NTu, w.ctab, w.sfirst);
  LAUNCH_OK("k_chunks", "kda cuda");
  unsigned nbr = (unsigned)((a->B * a->T * a->HV + 7) / 8);
  int al8 = ((uintptr_t)q | (uintptr_t)k | (uintptr_t)g) % 8 == 0;
  if (a->K % 4 == 0 && al8 && a->K <= 128) k_rows4<1><<<nbr, 256, 0, st>>>(p, q, k, g, beta, A_log, dt_bias, w);
  else if (a->K % 4 == 0 && al8 && a->K <= 256) k_rows4<2><<<nbr, 256, 0, st>>>(p, q, k, g, beta, A_log, dt_bias, w);
  else k_rows<<<nbr, 256, 0, st>>>(p, q, k, g, beta, A_log, dt_bias, w);
  LAUNCH_OK("k_rows", "kda cuda");
  if (tc) {
    /* vt: v staged raw (bf16, cp.async) with q, k, G when its tile fits next to the others */
    size_t sm = smem_intra_tc(a->chunk, a->K, a->V), smv = sm + smem_intra_vtile(a->chunk, a->V);
    int vt = smv <= (size_t)smem_optin_limit() && a->V % 8 == 0 && ((uintptr_t)v & 15) == 0;
    if (vt) sm = smv;
    auto kern = prec ? k_intra_tc_p : k_intra_tc;
    if (smem_opt_in((const void *)kern, sm, a, op, prec ? "k_intra_tc_p" : "k_intra_tc")) return -1;
    kern<<<dim3((unsigned)NTu, (unsigned)a->HV), NTC, sm, st>>>(p, v, w, vt);
    LAUNCH_OK("k_intra_tc", "kda cuda");
    return 0;
  }
  size_t sm = smem_intra(a->chunk, a->K);
  if (smem_opt_in((const void *)k_intra, sm, a, op, "k_intra")) return -1;
  k_intra<<<dim3((unsigned)NTu, (unsigned)a->HV), NT, sm, st>>>(p, v, w);
  LAUNCH_OK("k_intra", "kda cuda");
  return 0;
}

static int check_ws(const kda_kda_args *a, int backward, void *wsp, int64_t bytes, ws *w,
                    const char *op) {
  int64_t need = ws_layout(a, backward, nullptr, w);
  if (!wsp || bytes < need)
    return kda_set_error("%s: workspace of %lld bytes, need %lld " SHAPE_FMT
                         ": size it with kda_kda_cuda_workspace_bytes(a, %d)%s", op, (long long)bytes,
                         (long long)need, SHAPE_ARGS(a), backward,
                         backward && a->keep ? " (keep: the forward needs the backward's size)" : "");
  if ((uintptr_t)wsp % 256)
    return kda_set_error("%s: workspace is not 256-byte aligned: pass a cudaMalloc'd pointer", op);
  ws_layout(a, backward, (char *)wsp, w);
  return 0;
}

extern "C" int kda_kda_cuda_forward(const kda_kda_args *a, const void *q, const void *k,
                                    const void *v, const void *g, const void *beta,
                                    const float *A_log, const float *dt_bias, const float *h0,
                                    void *o, float *ht, void *workspace, int64_t workspace_bytes,
                                    void *stream) {
  const char *op = "kda_kda_cuda_forward";
  ws w;
  if (check_common(a, op)) return -1;
  if (a->gate_mode == KDA_GATE_SOFTPLUS && !A_log)
    return kda_set_error("%s: the softplus gate (gate_mode 1) needs A_log [HV]: pass it", op);
  if (check_ws(a, a->keep ? 1 : 0, workspace, workspace_bytes, &w, op)) return -1;
  cudaStream_t st = (cudaStream_t)stream;
  kp p = make_kp(a);
  int tc = use_tc(a, 0, 0);
  /* keep: k_intra_tc also writes Kb, k_state_fwd_tc the per-chunk states and Vn (the backward's
   * fast path reads them instead of recomputing); only when that backward will run version 2 */
  if (!(a->keep && tc && use_tc(a, 1, 0))) w.Kb = w.h = w.vn = nullptr;
  if (front(a, p, q, k, v, g, beta, A_log, dt_bias, w, st, op, tc, 0)) return -1;
  if (tc) {
    size_t sm = smem_state_tc(a->chunk, a->K, 0);
    if (smem_opt_in((const void *)k_state_fwd_tc, sm, a, op, "k_state_fwd_tc")) return -1;
    dim3 grid((unsigned)n_seq(a), (unsigned)a->HV, (unsigned)((a->V + BVT - 1) / BVT));
    k_state_fwd_tc<<<grid, NT, sm, st>>>(p, w, h0, o, ht);
    LAUNCH_OK("k_state_fwd_tc", "kda_kda_cuda_forward");
    return 0;
  }
  size_t sm = smem_state(a->chunk, a->K);
  if (smem_opt_in((const void *)k_state_fwd, sm, a, op, "k_state_fwd")) return -1;
  dim3 grid((unsigned)n_seq(a), (unsigned)a->HV, (unsigned)((a->V + BV - 1) / BV));
  k_state_fwd<<<grid, NT, sm, st>>>(p, w, h0, o, ht);
  LAUNCH_OK("k_state_fwd", "kda_kda_cuda_forward");
  return 0;
}

extern "C" int kda_kda_cuda_backward(const kda_kda_args *a, const void *q, const void *k,
                                     const void *v, const void *g, const void *beta,
                                     const float *A_log, const float *dt_bias, const float *h0,
                                     const void *dout, const float *dht, void *dq, void *dk,
                                     void *dv, void *dg, void *dbeta, float *dA_log,
                                     float *ddt_bias, float *dh0, void *workspace,
                                     int64_t workspace_bytes, void *stream) {
  const char *op = "kda_kda_cuda_backward";
  ws w;
  if (check_common(a, op)) return -1;
  if (a->gate_mode == KDA_GATE_SOFTPLUS && !A_log)
    return kda_set_error("%s: the softplus gate (gate_mode 1) needs A_log [HV]: pass it", op);
  if (check_ws(a, 1, workspace, workspace_bytes, &w, op)) return -1;
  cudaStream_t st = (cudaStream_t)stream;
  kp p = make_kp(a);
  int64_t NTu = n_chunks_max(a);
  int prec = use_precise(a, dA_log, ddt_bias);
  int tc = use_tc(a, 1, prec);
  /* kept: the forward left chunk table, rows, intra outputs, Kb, states and Vn in the workspace
   * (the fast path's exact values); the precise backward recomputes them in fp32 */
  int kept = a->keep && tc && !prec;
  if (!kept && front(a, p, q, k, v, g, beta, A_log, dt_bias, w, st, op, tc, tc && prec)) return -1;
  dim3 gc((unsigned)NTu, (unsigned)a->HV);
  if (tc) {                                        /* prec: the precise twins (suffix _p) */
    size_t sm = smem_state_tc(a->chunk, a->K, prec);
    auto kst = prec ? k_state_bwd_tc_p : k_state_bwd_tc;
    if (smem_opt_in((const void *)kst, sm, a, op, prec ? "k_state_bwd_tc_p" : "k_state_bwd_tc")) return -1;
    dim3 gs((unsigned)n_seq(a), (unsigned)a->HV, (unsigned)((a->V + BVT - 1) / BVT));
    /* 512 threads (NTC): measured against 256 on the H200, fwd+bwd (1,8192,16,128) 6.19 ->
     * 6.00 ms, the precise backward (8,2048,16,128) 15.16 -> 14.08 (one 161 KB block an SM:
     * 8 warps were too few), the rest equal or within 1%. 1024 threads: fewer cycles a block
     * (440k -> 333k) but one block an SM (64 registers x 1024), 535 -> 737 us: not kept */
    kst<<<gs, NTC, sm, st>>>(p, w, h0, dout, dht, dh0, kept);
    LAUNCH_OK("k_state_bwd_tc", "kda_kda_cuda_backward");
    /* sep: dS in a tile of its own when it fits (dgn from shared memory, one staging wait
     * less); KDA_KDA_ROWS_SEP=0 forces the shared tile (read per call: the test runs both) */
    size_t smr = smem_rows_tc_sep(a->chunk, a->K, a->V);
    const char *rs = getenv("KDA_KDA_ROWS_SEP");
    int sep = smr <= (size_t)smem_optin_limit() && !(rs && strcmp(rs, "0") == 0);
    sm = sep ? smr : smem_rows_tc(a->chunk, a->K, a->V);
    auto krw = prec ? k_bwd_rows_tc_p : k_bwd_rows_tc;
    if (smem_opt_in((const void *)krw, sm, a, op, prec ? "k_bwd_rows_tc_p" : "k_bwd_rows_tc")) return -1;
    krw<<<gc, NTC, sm, st>>>(p, dout, w, sep);
    LAUNCH_OK("k_bwd_rows_tc", "kda_kda_cuda_backward");
    sm = smem_mat_tc(a->chunk, a->K, a->V);
    auto kmt = prec ? k_bwd_mat_tc_p : k_bwd_mat_tc;
    if (smem_opt_in((const void *)kmt, sm, a, op, prec ? "k_bwd_mat_tc_p" : "k_bwd_mat_tc")) return -1;
    kmt<<<gc, NTC, sm, st>>>(p, v, dout, dv, w);
    LAUNCH_OK("k_bwd_mat_tc", "kda_kda_cuda_backward");
    sm = smem_final_tc(a->chunk, a->K);
    auto kfn = prec ? k_bwd_final_tc_p : k_bwd_final_tc;
    if (smem_opt_in((const void *)kfn, sm, a, op, prec ? "k_bwd_final_tc_p" : "k_bwd_final_tc")) return -1;
    kfn<<<gc, NTC, sm, st>>>(p, g, beta, A_log, dt_bias, dg, dbeta, w);
    LAUNCH_OK("k_bwd_final_tc", "kda_kda_cuda_backward");
  } else {
    size_t sm = smem_state(a->chunk, a->K) + (size_t)a->chunk * BV * 4;
    if (smem_opt_in((const void *)k_state_bwd, sm, a, op, "k_state_bwd")) return -1;
    dim3 gs((unsigned)n_seq(a), (unsigned)a->HV, (unsigned)((a->V + BV - 1) / BV));
    k_state_bwd<<<gs, NT, sm, st>>>(p, w, h0, dout, dht, dh0);
    LAUNCH_OK("k_state_bwd", "kda_kda_cuda_backward");
    k_bwd_rows<<<gc, NT, 0, st>>>(p, dout, w);
    LAUNCH_OK("k_bwd_rows", "kda_kda_cuda_backward");
    sm = smem_mat(a->chunk);
    if (smem_opt_in((const void *)k_bwd_mat, sm, a, op, "k_bwd_mat")) return -1;
    k_bwd_mat<<<gc, NT, sm, st>>>(p, v, dout, dv, w);
    LAUNCH_OK("k_bwd_mat", "kda_kda_cuda_backward");
    sm = (size_t)(2 * a->chunk * (a->chunk + 1) + 2 * a->chunk) * 4;
    k_bwd_final<<<gc, 128, sm, st>>>(p, g, beta, A_log, dt_bias, dg, dbeta, dA_log, ddt_bias, w);
    LAUNCH_OK("k_bwd_final", "kda_kda_cuda_backward");
  }
  if (dA_log || ddt_bias) {                        /* per-chunk partials, summed in chunk order */
    k_gate_reduce<<<(unsigned)a->HV, 128, 0, st>>>(p, w, n_seq(a), dA_log, ddt_bias);
    LAUNCH_OK("k_gate_reduce", "kda_kda_cuda_backward");
  }
  {
    unsigned nbq = (unsigned)((a->B * a->T * a->H + 7) / 8);
    int al8 = ((uintptr_t)q | (uintptr_t)k | (uintptr_t)dq | (uintptr_t)dk) % 8 == 0;
    if (a->K % 4 == 0 && al8 && a->K <= 128) k_qk_bwd4<1><<<nbq, 256, 0, st>>>(p, q, k, dq, dk, w);
    else if (a->K % 4 == 0 && al8 && a->K <= 256) k_qk_bwd4<2><<<nbq, 256, 0, st>>>(p, q, k, dq, dk, w);
    else k_qk_bwd<<<nbq, 256, 0, st>>>(p, q, k, dq, dk, w);
    LAUNCH_OK("k_qk_bwd", "kda_kda_cuda_backward");
  }
  return 0;
}

extern "C" int kda_kda_cuda_decode(const kda_kda_args *a, const void *q, const void *k,
                                   const void *v, const void *g, const void *beta,
                                   const float *A_log, const float *dt_bias, float *state,
                                   void *o, void *stream) {
  const char *op = "kda_kda_cuda_decode";
  if (kda_kda_check_args(a, 0, op)) return -1;
  if (a->gate_mode == KDA_GATE_SOFTPLUS && !A_log)
    return kda_set_error("%s: the softplus gate (gate_mode 1) needs A_log [HV]: pass it", op);
  if (!state) return kda_set_error("%s: state is NULL: pass the [N,HV,K,V] fp32 state", op);
  kp p = make_kp(a);
  size_t sm = (size_t)(a->K * BV + 3 * a->K + (NT / BV) * BV) * 4;
  if (smem_opt_in((const void *)k_decode, sm, a, op, "k_decode")) return -1;
  dim3 grid((unsigned)n_seq(a), (unsigned)a->HV, (unsigned)((a->V + BV - 1) / BV));
  k_decode<<<grid, NT, sm, (cudaStream_t)stream>>>(p, q, k, v, g, beta, A_log, dt_bias, state, o);
  LAUNCH_OK("k_decode", "kda_kda_cuda_decode");
  return 0;
}
