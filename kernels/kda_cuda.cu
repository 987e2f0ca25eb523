/* kda_cuda.cu — CUDA KDA: chunked forward / backward (KDA.md §3, §4) and the recurrent decode
 * (§5). Two versions of the chunked kernels share one fp32 scratch layout:
 *   version 2 (default): tensor-core MMAs for every GEMM-shaped step — see "version 2" below;
 *   version 1 (KDA_KDA_SIMPLE=1, and the fallback when v2's tiles do not fit in shared
 *   memory): every step mirrors core/kda_ref.c in scalar fp32, described here.
 *
 * Pipeline (one value head h, chunk = C rows, tokens tt = absolute rows of the B*T axis):
 *   k_rows       per (token, value head): l2-normalised q, k; gate -> log-decay; beta; its
 *                last block: the chunk table (seq, first token, rows) from cu_seqlens or B, T
 *                (version 2 at K % 4 == 0, K <= 128: k_intra_tc does its chunk's rows, the
 *                fused front, front() below; the table is k_chunk_table's, or for equal-length
 *                sequences k_intra_tc's last blocks')
 *   k_intra      per (chunk, head): G = cumsum g; Aqk (x s), L, M = (I+L)^-1 (forward
 *                substitution); W = M Kb, U = M (bV), kg = k e^{Gn-G}, qg = q e^G
 *   k_state_fwd  per (sequence, head, 32 V columns), sequential over chunks: Vn = U - W S,
 *                o = s qg S + Aqk Vn, S <- e^{Gn} S + kg^T Vn
 * Backward: k_rows, k_intra (recompute), then
 *   k_state_bwd  per (sequence, head, V tile): forward sweep storing S per chunk and Vn, reverse
 *                sweep storing dS per chunk and dVn = Aqk^T dO + kg dS; dh0
 *   k_bwd_rows   per (chunk, head): dQ_inter, dKi, dW (contractions over V with S0, dS)
 *                (version 2 at the compiled K = V = 64, compact: none runs, the mat and final
 *                kernels form these where they read them, use_final_fr)
 *   k_bwd_mat    per (chunk, head): dA, dM, dL = -tril(M^T dM M^T), dv, dKb, dbeta (WY part)
 *   k_bwd_final  per (chunk, head): intra terms, dG, reverse cumsum, gate / beta chains
 *   k_qk_bwd     per (token, q/k head): GVA group sum + l2-norm backward -> dq, dk (version
 *                2 with H == HV, K <= 128: k_bwd_final_tc does it)
 * Every exponent is of a difference G_i - G_j with i >= j (or of G itself), so <= 0 when g <= 0:
 * nothing overflows for any decay strength.
 *
 * Files: this one holds the shared pipeline (k_rows with the chunk table, k_qk_bwd,
 * k_gate_reduce) and the host side of both versions; version 1's kernels and the decode are in
 * kda_v1.cu, version 2's in kda_tc.cu (intra, state passes) and kda_tc_bwd.cu (the
 * chunk-parallel backward); what they share (kp, the scratch layout ws, device helpers, the
 * gate chain, the kernels' declarations) is in kda_common.cuh. */
#include "kda_common.cuh"

/* carve the workspace; returns bytes used (base may be NULL to just count). The backward's
 * layout starts with everything a kept forward writes and its backward reads (*keep_end, when
 * asked: kda_kda_cuda_keep_bytes); past it, scratch the backward writes before it reads. */
static int64_t ws_layout(const kda_kda_args *a, int backward, char *base, ws *w,
                         int64_t *keep_end = nullptr) {
  int64_t TH = a->B * a->T * a->HV, K = a->K, V = a->V, C = a->chunk, NTu = n_chunks_max(a);
  int64_t off = 0;
  auto take = [&](int64_t bytes) -> char * {
    char *p = base ? base + off : nullptr;
    off += (bytes + 255) / 256 * 256;
    return p;
  };
  w->ctab = (int *)take(NTu * 4 * 4);
  w->sfirst = (int *)take((n_seq(a) + 1) * 4);
  w->flow = (int *)take((3 + 2 * NTu * a->HV) * 4);   /* the flow kernels' (kda_common.cuh) */
  w->G = (float *)take(TH * K * 4), w->b = (float *)take(TH * 4), w->rn = (float2 *)take(TH * 8);
  w->Aqk = (float *)take(TH * C * 4), w->M = (float *)take(TH * C * 4);
  /* W, kg, qg: fp32 rows of K (version 1), bf16 rows of r16(K) (version 2) or fp32 rows of
   * r16(K) (version 2's precise backward): the last is the largest */
  int64_t KB = TH * ((K + 15) / 16 * 16) * 4;
  w->W = (float *)take(KB), w->kg = (float *)take(KB);
  w->qg = (float *)take(KB), w->U = (float *)take(TH * V * 4);
  w->Wb = (bf16 *)w->W, w->kgb = (bf16 *)w->kg, w->qgb = (bf16 *)w->qg, w->Ab = (bf16 *)w->Aqk;
  w->Kb = w->vn = w->dvn = w->h = w->dh = nullptr;
  w->dQb = w->dKib = w->dWb = w->dAb = nullptr;
  /* qn, kn (the row kernels' normalised q, k: version 1, and version 2's unfused front, whose
   * k_intra_tc stages them) are read only by the call that writes them, never by a kept
   * forward's backward (version 2's reads the raw q, k and rn): past the kept bytes. A kept
   * forward with the unfused front writes them there, before any later layer's forward lays its
   * kept bytes over them (the backend's keep_plan) */
  auto take_qk = [&] { w->qn = (float *)take(TH * K * 4), w->kn = (float *)take(TH * K * 4); };
  if (!backward) take_qk();
  else {
    /* what a kept forward also writes (keep_bytes ends here), then the backward's scratch */
    w->vn = (float *)take(TH * V * 4), w->Kb = (float *)take(TH * K * 4);
    w->h = (float *)take(NTu * a->HV * K * V * 4);
    if (keep_end) *keep_end = off;
    take_qk();
    w->dvn = (float *)take(TH * V * 4), w->dvnb = (bf16 *)take(TH * V * 2);
    w->dQ = (float *)take(TH * K * 4), w->dKi = (float *)take(TH * K * 4);
    w->dW = (float *)take(TH * K * 4), w->dKb = (float *)take(TH * K * 4);
    w->dA = (float *)take(TH * C * 4), w->dL = (float *)take(TH * C * 4);
    w->db = (float *)take(TH * 4);
    w->dh = (float *)take(NTu * a->HV * K * V * 4);
    /* the fused sweep's bf16 hand-offs (K = V = 128 only: dh's room, TH 1024 bytes there, holds
     * dKi0, dW and dA's 2 TH (2 K + C) bytes) */
    w->dQb = w->dvnb, w->dKib = (bf16 *)w->dh, w->dWb = w->dKib + TH * K, w->dAb = w->dWb + TH * K;
    w->dgn = (float *)take(NTu * a->HV * K * 4);
    w->gpart = (float *)take(NTu * a->HV * (K + 1) * 4);
  }
  return off;
}

/* ---- chunk table ------------------------------------------------------------------------ */

/* the fused front's chunk table (kda_intra.cuh intra_rows: no row kernel runs), one block */
__global__ void k_chunk_table(kp p, ws w, int64_t NTu) { chunk_table(p, NTu, w.ctab, w.sfirst, w.flow); }

/* ---- per-row preprocessing: l2 norm, gate, beta (§2.1–2.3) -------------------------------- */

/* one warp per (token, value head) row (8 rows per block): the l2 norms are fixed-order shuffle
 * sums, no block barriers. It was a block of 128 threads per row with two block sums: 0.35 ms
 * at (8,2048,16,128) for ~0.6 GB of traffic, scheduling-bound. */
__global__ void k_rows(kp p, const void *q, const void *k, const void *g, const void *beta,
                       const float *A_log, const float *dt_bias, ws w, int64_t NTu, int fast) {
  if (blockIdx.x == gridDim.x - 1) return chunk_table(p, NTu, w.ctab, w.sfirst, w.flow);
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
  float rq = l2_scale(p, sq), rk = l2_scale(p, sk);
  float ea = A_log ? expf(A_log[h]) : 1.f;
  if (lane == 0) w.rn[row] = make_float2(rq, rk);
  for (int64_t d = lane; d < K; d += 32) {
    w.qn[io + d] = ldb(q, iq + d) * rq;
    w.kn[io + d] = ldb(k, iq + d) * rk;
    const float x = ldb(g, io + d);
    w.G[io + d] = fast ? gate1<true>(p, x, dt_bias, h, d, ea) : gate1(p, x, dt_bias, h, d, ea);
  }
  if (lane == 0) w.b[row] = beta_act(p, ldb(beta, row));
}

/* The same for K % 4 == 0, K <= 4 LW NJ and 8-byte aligned q, k, g: a lane holds 4 adjacent
 * columns of q, k, g (8-byte loads, each read once; the general form reads q, k twice, 2 bytes
 * a load) and stores float4s of qn, kn, G; LW lanes a row (16 for K <= 64: a warp's two halves
 * take two rows, none idle). Same arithmetic per element (the norms' sums in another order).
 * H200, (8,2048,16,128): 206 -> 149 us. */
template <int NJ, int LW>
__global__ void k_rows4(kp p, const void *q, const void *k, const void *g, const void *beta,
                        const float *A_log, const float *dt_bias, ws w, int64_t NTu, int fast) {
  if (blockIdx.x == gridDim.x - 1) return chunk_table(p, NTu, w.ctab, w.sfirst, w.flow);
  int64_t row = ((int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * (32 / LW) + (threadIdx.x & 31) / LW;
  bool live = row < p.B * p.T * p.HV;              /* LW < 32: a dead half still shuffles */
  if (LW == 32 && !live) return;
  int lane = threadIdx.x % LW;
  int64_t tt = row / p.HV, h = row % p.HV, K = live ? p.K : 0, hq = h / (p.HV / p.H);
  int64_t iq = (tt * p.H + hq) * K, io = row * K;
  float4 xq[NJ], xk[NJ], xg[NJ];
  float sq = 0, sk = 0;
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    int64_t d = 4 * lane + 4 * LW * j;
    if (d >= K) break;
    xq[j] = ld4b(q, iq + d), xk[j] = ld4b(k, iq + d), xg[j] = ld4b(g, io + d);
  }
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    if (4 * lane + 4 * LW * j >= K) break;
    sq += sumsq4(xq[j]), sk += sumsq4(xk[j]);
  }
  float rq = l2_scale(p, lane_group_sum<LW>(sq)), rk = l2_scale(p, lane_group_sum<LW>(sk));
  float ea = A_log ? expf(A_log[h]) : 1.f;
  if (lane == 0 && live) w.rn[row] = make_float2(rq, rk);
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    int64_t d = 4 * lane + 4 * LW * j;
    if (d >= K) break;
    *(float4 *)(w.qn + io + d) = make_float4(xq[j].x * rq, xq[j].y * rq, xq[j].z * rq, xq[j].w * rq);
    *(float4 *)(w.kn + io + d) = make_float4(xk[j].x * rk, xk[j].y * rk, xk[j].z * rk, xk[j].w * rk);
    *(float4 *)(w.G + io + d) = fast ? gate4<true>(p, xg[j], dt_bias, h, d, ea) : gate4(p, xg[j], dt_bias, h, d, ea);
  }
  if (lane == 0 && live) w.b[row] = beta_act(p, ldb(beta, row));
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

/* The same for K % 4 == 0, K <= 4 LW NJ, 8-byte aligned q, k, dq, dk: a lane holds 4 adjacent
 * columns (a float4 of each dQ / dKi row of the group, 4 bf16 of q or k) for q and k at once,
 * so every load of the row is in flight together and the gradient rows are read once (the
 * general form reads them twice, q then k, 4 bytes a load); LW lanes a row as k_rows4.
 * H200, (8,2048,16,128): 462 -> 203 us (~0.54 GB moved: 2.6 TB/s). */
template <int NJ, int LW>
__global__ void k_qk_bwd4(kp p, const void *q, const void *k, void *dq, void *dk, ws w) {
  int64_t row = ((int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * (32 / LW) + (threadIdx.x & 31) / LW;
  bool live = row < p.B * p.T * p.H;
  if (LW == 32 && !live) return;
  int lane = threadIdx.x % LW;
  int64_t tt = row / p.H, hq = row % p.H, K = live ? p.K : 0, grp = p.HV / p.H, ix = row * K;
  float4 dy[2][NJ], x[2][NJ];
  float ss[2] = {0.f, 0.f}, dot[2] = {0.f, 0.f};
#pragma unroll
  for (int wh = 0; wh < 2; wh++) {
    const float *src = wh ? w.dKi : w.dQ;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      int64_t d = 4 * lane + 4 * LW * j;
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
      if (4 * lane + 4 * LW * j >= K) break;
      float4 a = x[wh][j], b = dy[wh][j];
      ss[wh] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
      dot[wh] += b.x * a.x + b.y * a.y + b.z * a.z + b.w * a.w;
    }
    ss[wh] = lane_group_sum<LW>(ss[wh]), dot[wh] = lane_group_sum<LW>(dot[wh]);
  }
#pragma unroll
  for (int wh = 0; wh < 2; wh++) {
    float r = rsqrtf(ss[wh] + L2_EPS), c = r * r * r * dot[wh];
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      int64_t d = 4 * lane + 4 * LW * j;
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

/* dA_log[h] and ddt_bias[h,:]: each column's sum over the chunks of the final kernel's partials
 * (w.gpart [chunk][HV][K + 1], column K dA_log's), in double (the partials have mixed signs). A
 * block a head and 32 of its K + 1 columns, a lane a column; warp wp takes chunks 8 wp .. 8 wp + 7,
 * then 256 on, its eight loads issued before their adds; the warps' sums are added in warp order:
 * a fixed order, so deterministic (not chunk order: the last bits differ from the serial sum's).
 * Why: one block a head summing every chunk in turn was a chain of dependent loads on HV blocks,
 * 27.5 us at (8,2048,16,128) and 19.1 at (32,512,4,64) (ncu, H100, s69a), 1.1% and 4% of a gated
 * fwd+bwd; this form 5.2 and 4.9 us (ncu, H200, s69c: another card, the old form not timed there;
 * the partials are 2.1 MB and 0.27 MB, < 0.5 us of bytes: what is left is latency and launch) */
enum { GR_WARPS = 32, GR_U = 8 };
__global__ void __launch_bounds__(GR_WARPS * 32)
k_gate_reduce(kp p, ws w, int64_t N, float *dA_log, float *ddt_bias) {
  __shared__ double part[GR_WARPS][32];
  const int64_t h = blockIdx.x, K = p.K, HV = p.HV;
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nch = w.sfirst[N];
  const int64_t d = (int64_t)blockIdx.y * 32 + lane;
  double s = 0;
  if (d <= K)
    for (int c0 = wp * GR_U; c0 < nch; c0 += GR_WARPS * GR_U) {
      float x[GR_U];
#pragma unroll
      for (int u = 0; u < GR_U; u++)
        x[u] = c0 + u < nch ? w.gpart[((int64_t)(c0 + u) * HV + h) * (K + 1) + d] : 0.f;
#pragma unroll
      for (int u = 0; u < GR_U; u++) s += (double)x[u];
    }
  part[wp][lane] = s;
  __syncthreads();
  if (wp || d > K) return;
  double t = 0;
  for (int i = 0; i < GR_WARPS; i++) t += part[i][lane];
  if (d < K) { if (ddt_bias) ddt_bias[h * K + d] = (float)t; }   /* (gate modes 1, 2 only: the host zeroes mode 0's) */
  else if (dA_log) dA_log[h] = (float)t;
}

/* ---- host side --------------------------------------------------------------------------------- */

static kp make_kp(const kda_kda_args *a) {
  kp p;
  p.B = a->B, p.T = a->T, p.H = a->H, p.HV = a->HV, p.K = a->K, p.V = a->V;
  p.C = a->chunk, p.gate_mode = a->gate_mode, p.beta_mode = a->beta_mode, p.l2 = a->qk_l2norm;
  p.nseq = a->nseq, p.lb = a->lower_bound, p.cu = a->cu_seqlens;
  p.scale = a->scale != 0 ? a->scale : 1.f / sqrtf((float)a->K);
  const char *fe = getenv("KDA_KDA_FULL");
  p.full = !(fe && strcmp(fe, "0") == 0);
  const char *hm = getenv("KDA_KDA_HM");          /* blk_chunk: the chunk kernels' launch order */
  p.hm = !(hm && strcmp(hm, "0") == 0) && n_chunks_max(a) + 1 <= 65535;   /* gridDim.y's limit */
  return p;
}

/* the version-2 chunk kernels' grid: (chunks, HV), or head-major (HV, chunks) (blk_chunk) */
static dim3 chunk_grid(const kp &p, int64_t chunks, int64_t HV) {
  return p.hm ? dim3((unsigned)HV, (unsigned)chunks) : dim3((unsigned)chunks, (unsigned)HV);
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

/* two blocks an SM (a compact layout) need the largest shared-memory carveout */
static int carveout_max(const void *fn, const kda_kda_args *a, const char *op) {
  CUDA_OK(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared), op);
  return 0;
}

static int check_common(const kda_kda_args *a, const char *op) {
  if (kda_kda_check_args(a, 0, op)) return -1;
  if (a->chunk != 16 && a->chunk != 32 && a->chunk != 64)
    return kda_set_error("%s: chunk=%d: the CUDA kernels take 16, 32 or 64", op, a->chunk);
  if (a->B * a->T > 0x7fffffff)
    return kda_set_error("%s: B*T=%lld tokens: at most 2^31-1 per call", op, (long long)(a->B * a->T));
  int64_t nsb = n_seq(a) * a->HV * ((a->V + BVT - 1) / BVT);
  if (nsb > 0x7fffffff)   /* the state passes' 1-D grid (state_grid) */
    return kda_set_error("%s: %lld (sequence, head, %d value columns) blocks: at most 2^31-1 per "
                         "call; split the batch", op, (long long)nsb, BVT);
  return 0;
}

/* Version 2's precise backward (the _p kernels of kda_tc.cu, kda_tc_bwd.cu). dA_log and ddt_bias
 * are sums of dg over tokens (and key dims) whose terms cancel, so their relative error is dg's
 * times a cancellation ratio that depends on the data (1 to ~60 on H = 1 draws of the
 * lower-bound gate); with dg built from bf16/tf32 products (~3e-3) dA_log misses fla's 3e-3
 * (a warning in fla's own test) by up to 40x on such draws (1.1e-1 on the H200, 2026-12-04a).
 * The precise twins run every product that feeds dg in split tf32 (fp32-level error) at about
 * twice the backward's time. Picked when the caller asks (a->precise_gate, the layer's
 * precise_gate option) and a gate with parameters (gate_mode 1, 2) asks for dA_log or
 * ddt_bias. The layer's default is the fast backward: its hybrid S 64x512 step 23.9 -> 19.5 ms,
 * loss at step 120 2.338 -> 2.328 (2026-12-04b). KDA_KDA_PRECISE=1 / =0 forces it on / off
 * (read per call: to measure its cost, or to test it on any case). gate_grads: dA_log or
 * ddt_bias asked for (a kept forward assumes they will be, as the layer's backward asks: the
 * precision it prepares for). */
static int use_precise(const kda_kda_args *a, int gate_grads) {
  const char *e = getenv("KDA_KDA_PRECISE");
  if (e && *e) return strcmp(e, "0") != 0;
  return a->gate_mode != 0 && a->precise_gate && gate_grads;
}

/* The version-2 kernels' shape specialisation (KV in kda_tc.cuh): K = V = 64 or 128 at chunk
 * 64 run instantiations with those sizes fixed at compile time, other shapes the run-time ones;
 * KDA_KDA_KV=0 forces the run-time ones (read per call: the test's fourth path). Measured on
 * the H200 (chunk kernels only, against KDA_KDA_KV=0 in one run): fwd+bwd (8,2048,16,128)
 * 5.89 -> 5.23 ms, (1,8192,16,128) 3.67 -> 3.33, (32,512,4,64) 0.762 -> 0.655, (8,512,4,64)
 * 0.245 -> 0.218; the precise backward 11.14 -> 10.11 ms at (8,2048,16,128). The state passes
 * too (against the chunk kernels' alone, one run): fwd+bwd 5.27 -> 5.13, 3.35 -> 3.20, 0.66 ->
 * 0.64, 0.220 -> 0.210; precise 10.13 -> 9.65 */
static int kv_spec(const kda_kda_args *a) {
  const char *e = getenv("KDA_KDA_KV");
  if (e && strcmp(e, "0") == 0) return 0;
  return a->chunk == 64 && a->K == a->V && (a->K == 64 || a->K == 128) ? (int)a->K : 0;
}
/* threads a block for the version-2 kernel `name` (intra, rows, mat, final, state_fwd,
 * state_bwd): `dflt` unless KDA_KDA_THREADS names it, e.g. "rows=256/final=256" (for measuring:
 * the run-time forms take their block size from blockDim, any multiple of 32 from 128 up to
 * NTC runs them); the KV instantiations are compiled for `dflt` (kv_fix) and ignore it */
static int chunk_threads(const kda_kda_args *a, const char *name, int dflt) {
  const char *e = getenv("KDA_KDA_THREADS"), *at = e && !kv_spec(a) ? strstr(e, name) : NULL;
  size_t len = strlen(name);
  if (!at || at[len] != '=') return dflt;
  int t = atoi(at + len + 1);
  return t >= 128 && t <= NTC && t % 32 == 0 ? t : dflt;
}

/* an attribute of the current device, 0 when it cannot be read */
static int dev_attr(cudaDeviceAttr at) {
  int dev, x;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&x, at, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return x;
}
static int cc_major(void) { return dev_attr(cudaDevAttrComputeCapabilityMajor); }
/* Load every kernel a call of this shape form (kv) may launch, once a process: CUDA loads a
 * kernel at its first launch (lazy module loading, the default since CUDA 12.2), which made the
 * process's first call up to 4x a warm one on the H200 (fwd (8,2048,16,128) 5.1-5.5 ms against
 * 1.38, benches/results/2026-12-01l-kda_multi_vec3.log) and a shape's first use of another
 * form up to 2.2x. A call's workspace is sized when it is planned (the backend's plan, the
 * bench's setup), so the kernels load there. cudaFuncGetAttributes loads a function; without
 * a device it fails, and the error it leaves is cleared. */
static void preload_kernels(int kv) {
  static bool done[3];
  int s = kv == 128 ? 2 : kv == 64 ? 1 : 0;
  if (done[s]) return;
  done[s] = true;
  cudaFuncAttributes fa;
  auto ld = [&](const void *f) { (void)cudaFuncGetAttributes(&fa, f); };
  for (int pr = 0; pr < 2; pr++) {
    for (int cm = 0; cm < 2; cm++)
      ld((const void *)k_intra_tc_pick(pr, cm, kv, false)), ld((const void *)k_intra_tc_pick(pr, cm, kv, true)),
          ld((const void *)k_bwd_mat_tc_pick(pr, cm, kv)),
          ld((const void *)k_bwd_final_tc_pick(pr, cm, kv));
    ld((const void *)k_bwd_rows_tc_pick(pr, kv)), ld((const void *)k_state_bwd_tc_pick(pr, kv));
  }
  for (int f : {ST_FAST, ST_DB, ST_PRECISE}) ld((const void *)k_state_fwd_tc_pick(f, kv));
  ld((const void *)k_state_fwd_tc_pick(ST_DB, kv, BVN));
  ld((const void *)k_state_bwd_tc_db_pick(kv)), ld((const void *)k_state_bwd_tc_db_pick(kv, BVN));
  for (int gf = 0; gf < 2; gf++) ld((const void *)k_fwd_flow_pick(false, kv, gf)), ld((const void *)k_fwd_flow_pick(true, kv, gf));
  ld((const void *)k_bwd_flow_pick(kv));
  if (kv) ld((const void *)k_state_fwd_tc_wide_pick(kv)), ld((const void *)k_state_bwd_tc_wide_pick(kv));
  if (kv == 128 && cc_major() == 9)   /* sm_90a's images only */
    ld((const void *)k_state_fwd_tc_wg_ptr()), ld((const void *)k_state_bwd_tc_wg_ptr()),
        ld((const void *)k_bwd_mat_wg_ptr(0)), ld((const void *)k_bwd_mat_wg_ptr(1)),
        ld((const void *)k_bwd_rows_wg_ptr()), ld((const void *)k_bwd_final_wg_ptr(0)),
        ld((const void *)k_bwd_final_wg_ptr(1));
    for (int b = 0; b < 4; b++) ld((const void *)k_state_bwd_rows_wg_ptr(b));
  if (kv == 128) ld((const void *)k_bwd_mat_tc_h);
  if (kv == 64) ld((const void *)k_bwd_final_fr_ptr()), ld((const void *)k_bwd_mat_mw_ptr());
  if (kv && cc_major() >= 9)
    ld((const void *)k_fwd_flow_ps_pick(kv, false)), ld((const void *)k_fwd_flow_ps_pick(kv, true));
  ld((const void *)k_rows4<1, 16>), ld((const void *)k_rows4<1, 32>);
  ld((const void *)k_rows4<2, 32>), ld((const void *)k_rows), ld((const void *)k_gate_reduce);
  ld((const void *)k_chunk_table);
  ld((const void *)k_qk_bwd4<1, 16>), ld((const void *)k_qk_bwd4<1, 32>), ld((const void *)k_qk_bwd4<2, 32>);
  ld((const void *)k_qk_bwd);
  (void)cudaGetLastError();
}
int64_t kda_kda_cuda_workspace_bytes(const kda_kda_args *a, int backward) {
  ws w;
  int64_t bytes = ws_layout(a, backward, nullptr, &w);
  if (bytes >= 0) preload_kernels(kv_spec(a));
  return bytes;
}
int64_t kda_kda_cuda_keep_bytes(const kda_kda_args *a) {
  ws w;
  int64_t end = 0;
  ws_layout(a, 1, nullptr, &w, &end);
  return end;
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
/* shared memory an SM gives its blocks' dynamic allocations (less the per-block reserve of
 * one block, counted per block by the caller's 2 * size test: conservative), 0 when unknown */
static size_t smem_per_sm(void) {
  int dev, sm, rsv = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (cudaDeviceGetAttribute(&rsv, cudaDevAttrReservedSharedMemoryPerBlock, dev) != cudaSuccess)
    cudaGetLastError(), rsv = 1024;
  return sm > 2 * rsv ? (size_t)(sm - 2 * rsv) : 0;
}
/* the device's SM count, 0 when it cannot be read */
static int sm_count(void) { return dev_attr(cudaDevAttrMultiProcessorCount); }
/* version 2's state passes: one block per (sequence, value head, bv value columns: BVT, BVW
 * for the wide passes), the value tiles of a head adjacent (st_block in kda_state.cuh) */
static dim3 state_grid(const kda_kda_args *a, int bv = BVT) {
  return dim3((unsigned)(n_seq(a) * a->HV * ((a->V + bv - 1) / bv)));
}
/* The wide state passes (kda_state_wide.cu: 64 V columns a block, the state in registers)
 * for the compiled shapes (kv) of the fast path, where the 32-column grid needs more than one
 * wave of two blocks an SM: half the blocks, each step twice the columns for the same
 * barriers and staged chunk tiles. Measured on the H200 (one run, against KDA_KDA_WIDE=0):
 * fwd+bwd (8,2048,16,128) 3.922-3.928 -> 3.709 ms, fwd 1.246-1.257 -> 1.160-1.163 at 256
 * threads (NTW); at 512 threads (64 registers, ~100 bytes of spill at K = 128) 3.759-3.760.
 * Forced where the narrow grid is one wave they lost ((8,512,4,64) 0.159 -> 0.185 ms: a pass
 * is then one block's chain of steps), hence the rule; they also need two blocks' tiles to fit
 * an SM (not on sm_80's 164 KB at K = 128). KDA_KDA_WIDE=0 off, =1 wherever compiled (read per
 * call: test_kda_cuda compares the two bit for bit). */
static int use_wide(const kda_kda_args *a, int kv) {
  const char *e = getenv("KDA_KDA_WIDE");
  if (!kv || (e && strcmp(e, "0") == 0)) return 0;
  if (e && strcmp(e, "1") == 0) return 1;
  int nsm = sm_count();
  return nsm && (int64_t)state_grid(a).x > 2 * (int64_t)nsm && 2 * smem_state_wide(a->chunk, a->K, 1) <= smem_per_sm();
}
/* The wide forward pass on warpgroup MMAs (kda_state_wg.cu: sm_90a, K = V = 128, chunk 64)
 * instead of k_state_fwd_tc_wide, wherever that one runs on an H100 / H200 and o can be stored
 * in 16-byte rows; KDA_KDA_WG=0 turns it off (read per call: test_kda_cuda holds it to the CPU
 * reference and keeps the bit-for-bit comparisons on the mma.sync passes). H200, one run
 * against the wide pass (2026-12-04s44b): ncu 344-347 -> 278 us at (8,2048,16,128) with the
 * internals kept; fwd 0.826 -> 0.773 ms, fwd+bwd 2.972-2.974 -> 2.922-2.933 */
static int use_wg(int kv, const void *o) {
  const char *e = getenv("KDA_KDA_WG");
  return kv == 128 && (uintptr_t)o % 16 == 0 && !(e && strcmp(e, "0") == 0) && cc_major() == 9;
}
/* The kept reverse sweep on warpgroup MMAs (kda_state_wg.cu's k_state_bwd_tc_wg: sm_90a,
 * K = V = 128, chunk 64) instead of k_state_bwd_tc_wide, wherever that one runs on an H100 /
 * H200 and dO can be staged in 16-byte rows; KDA_KDA_WGB=0 turns it off (read per call:
 * test_kda_cuda keeps its bit-for-bit comparisons on the mma.sync sweep and checks this one
 * against the CPU reference) */
static int use_wg_bwd(int kv, const void *dout) {
  const char *e = getenv("KDA_KDA_WGB");
  return kv == 128 && (uintptr_t)dout % 16 == 0 && !(e && strcmp(e, "0") == 0) && cc_major() == 9 &&
         2 * smem_state_bwd_wg() <= smem_per_sm();
}
/* The fast rows kernel on warpgroup MMAs (kda_rows_wg.cu: sm_90a, K = V = 128, chunk 64)
 * wherever the fast one runs from the reverse sweep's bf16 dVn (lay without ROWS_DVF) on an
 * H100 / H200 and dO can be staged in 16-byte rows; KDA_KDA_ROWSWG=0 turns it off (read per
 * call: test_kda_cuda keeps its bit-for-bit comparisons on the mma.sync kernel and checks this
 * one against the CPU reference) */
static int use_rows_wg(int prec, int kv, int lay, const void *dout) {
  const char *e = getenv("KDA_KDA_ROWSWG");
  return !prec && kv == 128 && !(lay & ROWS_DVF) && (uintptr_t)dout % 16 == 0 && !(e && strcmp(e, "0") == 0) &&
         cc_major() == 9 && 2 * smem_rows_wg() <= smem_per_sm();
}
/* The kept reverse sweep with the rows kernel's products (kda_state_wg.cu's k_state_bwd_rows_wg:
 * sm_90a, K = V = 128, chunk 64; one 512-thread block of 211 KB a (sequence, head), so one an
 * SM) instead of k_state_bwd_tc_wg and k_bwd_rows_wg, wherever both would run (the caller
 * asks only where the sweep would; rows_wg: whether the rows kernel would) and its grid
 * fills at least half of the SMs: it holds a whole head where the two-block sweep split it in
 * two blocks of two an SM, so a smaller grid leaves more of the card idle than the traffic it
 * saves. H100, one run, three rounds against KDA_KDA_SR=0: fwd+bwd (8,2048,16,128), 128 heads,
 * 2.497-2.526 -> 2.324-2.350 ms (2026-12-07s64a); at T = 2048 (s65a) 120 heads (8,2048,15,128)
 * 2.388-2.398 -> 2.212-2.249, 112 heads 2.243-2.269 -> 2.108-2.113, 96 heads 1.982-1.993 ->
 * 1.856-1.880, 64 heads (4,2048,16,128) 1.436-1.448 -> 1.428-1.441 (a tie: below half of the
 * 132 SMs, where the rule stops); at the rule's smallest grid there, 68 heads (4,2048,17,128),
 * 1.514-1.522 -> 1.462-1.474 (s65b). KDA_KDA_SR=0 turns it off, =1 takes it wherever both would run
 * (read per call: test_kda_cuda checks it against the two kernels and the CPU reference, and that
 * it ran: kda_kda_cuda_last_sr) */
static int use_sweep_rows(const kda_kda_args *a, int rows_wg) {
  const char *e = getenv("KDA_KDA_SR");
  if (!rows_wg || (e && strcmp(e, "0") == 0) || smem_state_bwd_rows_wg() > (size_t)smem_optin_limit())
    return 0;
  if (e && strcmp(e, "1") == 0) return 1;
  int nsm = sm_count();
  return nsm && 2 * n_seq(a) * a->HV >= (int64_t)nsm;
}
static int last_sr;                                /* kda_kda_cuda_last_sr: 0, or 1 + the hand-offs */
/* The fused sweep's bf16 hand-offs (kda_state_wg.cu's B16), each where its reader runs: the
 * inter-chunk dQ0, dKi0 and dA to k_bwd_final_wg (w.dQb, w.dKib, w.dAb; kda_final.cuh's Q16)
 * where that kernel runs, dW to k_bwd_mat_wg (w.dWb; kda_mat_wg.cu's W16) where that one does and
 * its bf16 room fits two blocks an SM; else fp32, as every other reader takes them. H100, one
 * run, three rounds, the same binary with KDA_KDA_B16=0 beside it (2026-12-07s66d): fwd+bwd
 * (8,2048,16,128) 2.294-2.311 -> 2.193-2.214 ms (the sweep 450.4 -> 383.1 us, ncu; the final and
 * mat kernels the same). dVn too (the mat kernel's V rounds) ran -0.5% and moved dbeta's error
 * 40-70% (s66f): it stays fp32. KDA_KDA_B16=0 turns them off (read per call: test_kda_cuda
 * checks each against the CPU reference) */
static int use_b16(int fwg, int mwg) {
  const char *e = getenv("KDA_KDA_B16");
  if (e && strcmp(e, "0") == 0) return 0;
  return (fwg ? SR_B16_QK : 0) | (mwg && 2 * smem_mat_wg(1) <= smem_per_sm() ? SR_B16_W : 0);
}
int kda_kda_cuda_last_sr(void) { return last_sr; }
/* A chunk kernel's compact layout (small heads) instead of its wide one (smem bytes `wide`,
 * `compact`, 0 when it has none) when that lets two blocks share an SM and the wide one does
 * not; KDA_KDA_COMPACT=0 turns them all off (read per call: the test's fourth path). Measured
 * on the H200, k_intra_tc's: fwd (32,512,4,64) 0.278 -> 0.220 ms */
static int use_compact(size_t wide, size_t compact) {
  const char *e = getenv("KDA_KDA_COMPACT");
  size_t per_sm = smem_per_sm();
  return compact && 2 * compact <= per_sm && 2 * wide > per_sm && !(e && strcmp(e, "0") == 0);
}
/* The rows kernel's products formed where they are read, at the compiled K = V = 64 where the
 * fast compact final kernel runs and the rows kernel would run alone (not in the flow kernel):
 * 1, the final kernel forms dQ0, dKi0, dgn and dA itself (kda_final.cuh's FR, k_bwd_final_fr;
 * its bf16 operands, 36.9 KB, fit X and dA's room there, 43.5 KB) and the rows kernel forms dW
 * alone (ROWS_FR); 2, where the mat kernel runs compact, that forms dW too (kda_tc_bwd.cu's
 * MW, k_bwd_mat_mw) and no rows kernel runs.
 * 0: neither. KDA_KDA_FR=0 / 1 caps it (read per call: test_kda_cuda holds each bit for bit to
 * the rows kernel's products) */
static int last_fr;                                /* kda_kda_cuda_last_fr */
int kda_kda_cuda_last_fr(void) { return last_fr; }
static int use_final_fr(const kda_kda_args *a, int prec, int kv, int flow) {
  const char *e = getenv("KDA_KDA_FR");
  int cap = e && *e ? atoi(e) : 2;
  if (prec || kv != 64 || flow || cap < 1 ||
      !use_compact(smem_final_tc(a->chunk, a->K), smem_final_tc_compact(a->chunk, a->K)))
    return 0;
  return cap >= 2 && use_compact(smem_mat_tc(a->chunk, a->K, a->V), smem_mat_tc_compact(a->chunk, a->K, a->V)) ? 2 : 1;
}
/* k_bwd_final_fr launched programmatically after k_bwd_mat_mw (fr == 2), where both run: the
 * final kernel's blocks start on the SMs the mat kernel's last blocks free, and stage and form
 * the rows kernel's products (reading nothing the mat kernel writes) before they wait for it
 * (mma.cuh pdl_wait). The chunk grids end in a tail: at (8,512,4,64) each kernel is one wave,
 * and the final kernel's staging and products are ~25% of its cycles a block (H200, s69c).
 * Unlike the twentieth pass's form (every kernel waiting at its start: 0.242 -> 0.285 ms at
 * (8,512,4,64), small state grids packing two blocks an SM), one edge, whose second grid has
 * work to do before its wait. Measured on the H100 (s71a, KDA_KDA_PDL=0 in the same binary):
 * fwd+bwd in a graph (32,512,4,64) 0.404-0.406 -> 0.396-0.397 ms, (8,512,4,64) 0.128 ->
 * 0.124-0.125. KDA_KDA_PDL=0 launches it the ordinary way (read per call: test_kda_cuda
 * compares the two bit for bit, eagerly and in a graph); sm_90 and later only */
static int use_pdl(void) {
  const char *e = getenv("KDA_KDA_PDL");
  return cc_major() >= 9 && !(e && strcmp(e, "0") == 0);
}
/* The fast mat kernel in three staging rounds, two blocks an SM (kda_mat_halves.cu), at the
 * compiled K = V = 128 (chunk 64); KDA_KDA_MATH=0 turns it off (read per call) */
static int use_mat_halves(int prec, int kv) {
  const char *e = getenv("KDA_KDA_MATH");
  return !prec && kv == 128 && !(e && strcmp(e, "0") == 0) && 2 * smem_mat_tc_halves(64, 128, 128) <= smem_per_sm();
}
/* The halves kernel's products on warpgroup MMAs (kda_mat_wg.cu: sm_90a, tf32, four rounds)
 * wherever the halves kernel would run on an H100 / H200; KDA_KDA_MATWG=0 turns it off (read
 * per call: test_kda_cuda keeps its bit-for-bit comparisons on the halves kernel and checks
 * this one against the CPU reference) */
static int use_mat_wg(int mh) {
  const char *e = getenv("KDA_KDA_MATWG");
  return mh && cc_major() == 9 && !(e && strcmp(e, "0") == 0) && 2 * smem_mat_wg(0) <= smem_per_sm();
}
/* The fast wide final kernel at K = V = 128 with a flat chunk's intra-chunk terms on warpgroup
 * MMAs (kda_final_wg.cu: sm_90a, tf32; a steep chunk takes k_bwd_final_tc's path in the same
 * launch) wherever that form runs on an H100 / H200; KDA_KDA_FINALWG=0 turns it off (read per
 * call: test_kda_cuda keeps its bit-for-bit comparisons on k_bwd_final_tc and checks this one
 * against the CPU reference). H100 (s50b): the kernel 1252 -> 1029 us at (8,2048,16,128). */
static int use_final_wg(int prec, int fcm, int kv) {
  const char *e = getenv("KDA_KDA_FINALWG");
  return !prec && !fcm && kv == 128 && cc_major() == 9 && !(e && strcmp(e, "0") == 0);
}
/* the state passes' second set of chunk tiles (k_state_fwd_tc_db, k_state_bwd_tc_db, smem
 * bytes `db`): when the grid needs at most one block an SM and the tiles fit; KDA_KDA_STATE_DB=0
 * turns it off (read per call: the test's fourth path) */
static int use_state_db(const kda_kda_args *a, size_t db) {
  const char *e = getenv("KDA_KDA_STATE_DB");
  if (e && strcmp(e, "0") == 0) return 0;
  int nsm = sm_count();
  return nsm && (int64_t)state_grid(a).x <= nsm && db <= (size_t)smem_optin_limit();
}
/* The second-tile-set passes when they run alone (no flow kernel) at BVN = 16 V columns a
 * block instead of BVT = 32, where twice the blocks still fit one wave of a block an SM: a
 * pass's time is then one block's chain of chunk steps, and half the columns shorten each
 * step's products, epilogues and stores (the chunk tiles it stages are the same). Measured on
 * the H200 against main in one run, two rounds (2026-12-03s32d): (8,512,4,64) fwd+bwd in a
 * graph 0.143 / 0.143 -> 0.139 / 0.138 ms (ncu: k_state_fwd_tc_db 30.4 -> 27.5 us,
 * k_state_bwd_tc_db 27.4 -> 23.8), the other bench shapes unchanged. With every state pass at
 * 16 columns (s32c) (1,8192,16,128) fwd+bwd went 1.946 / 1.933 -> 2.021 / 2.029: beside the
 * flow kernel the doubled state grid holds SMs the chunk blocks need, hence the rule (the flow
 * keeps 32). KDA_KDA_STATE_BV=16 / =32 forces either wherever a _db pass runs alone (read
 * per call: test_kda_cuda compares the two bit for bit). db16: the forward's or the
 * backward's _db bytes at 16 columns. */
static int state_bv(const kda_kda_args *a, size_t db16) {
  const char *e = getenv("KDA_KDA_STATE_BV");
  if (e && strcmp(e, "32") == 0) return BVT;
  if (e && strcmp(e, "16") == 0) return BVN;
  int nsm = sm_count();
  return nsm && (int64_t)state_grid(a, BVN).x <= nsm && db16 <= (size_t)smem_optin_limit() ? BVN : BVT;
}
/* The flow kernels (k_fwd_flow: intra + the forward state pass; k_bwd_flow: the kept reverse
 * sweep + the rows kernel), where a state pass's second-tile-set grid holds at most half the
 * SMs and the chunk kernel's grid is at least four waves of one block an SM: the state pass
 * then runs beside the chunk blocks instead of before or after them all. Where the chunk grid
 * is one wave the SMs the state blocks hold cost a second wave. Measured on the H200 (one run
 * against the separate kernels): fwd+bwd (1,8192,16,128) 2.71 -> 2.44 ms (the forward's flow
 * alone 2.59; fwd 0.906 -> 0.852), while forced at (8,512,4,64) 0.167 -> 0.182 in a graph
 * (the backward's alone, KDA_KDA_FLOW=bwd: 0.166 -> 0.173).
 * The other bench shapes' state grids are too large for it. KDA_KDA_THREADS must leave
 * both kernels at NTC (the flow runs both at NTC); KDA_KDA_FLOW=0 turns it off, =1 on wherever
 * the state grid allows it, =fwd / =bwd that side only (read per call: test_kda_cuda compares
 * the flow with the separate kernels on every case). */
static int use_flow(const kda_kda_args *a, const char *chunk_kernel, const char *state_kernel) {
  const char *e = getenv("KDA_KDA_FLOW");
  if (e && strcmp(e, "0") == 0) return 0;
  if (chunk_threads(a, chunk_kernel, NTC) != NTC || chunk_threads(a, state_kernel, NTC) != NTC) return 0;
  int64_t nsm = sm_count();
  if (2 * (int64_t)state_grid(a).x > nsm) return 0;
  /* "fwd" / "bwd": force one side's flow only (for measuring the two apart) */
  const char *side = strcmp(chunk_kernel, "intra") == 0 ? "fwd" : "bwd";
  int force = e && (strcmp(e, "1") == 0 || strcmp(e, side) == 0);
  int off = e && (strcmp(e, "fwd") == 0 || strcmp(e, "bwd") == 0) && !force;
  return !off && (force || n_chunks_max(a) * a->HV >= 4 * nsm);
}
/* The flow kernel's persistent intra blocks (kda_tc.cu k_fwd_flow_ps: each task staging the next
 * one's raw rows by bulk copies) where the chunk grid is more than a wave of one block an SM;
 * KDA_KDA_PERSIST=0 off, =1 wherever it may run, KDA_KDA_PERSIST_GRID=N runs ns + N blocks (read
 * per call: test_kda_cuda compares it, forced, with the flow's block-a-task intra, bit for bit).
 * Needs 16-byte aligned q, k, g, v (the bulk copies' rows). */
static int use_persist(const kda_kda_args *a, const void *q, const void *k, const void *g, const void *v) {
  const char *e = getenv("KDA_KDA_PERSIST");
  if (e && strcmp(e, "0") == 0) return 0;
  int nsm = sm_count();
  if (!nsm || cc_major() < 9 || chunk_threads(a, "intra", NTC) != NTC) return 0;
  if (((uintptr_t)q | (uintptr_t)k | (uintptr_t)g | (uintptr_t)v) % 16) return 0;
  return (e && strcmp(e, "1") == 0) || n_chunks_max(a) * a->HV > nsm;
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
    size_t x[3] = {prec ? smem_rows_tc(a->chunk, a->K, a->V) : smem_rows_tc_fast(a->chunk, a->K, a->V, 0, 1),
                   smem_mat_tc(a->chunk, a->K, a->V), smem_final_tc(a->chunk, a->K)};
    for (size_t y : x) if (y > need) need = y;
  }
  return need <= (size_t)lim;
}

/* k_intra_tc's layout for this call: vt = 1, v staged raw (bf16, cp.async) with q, k, G when
 * its tile fits next to the others; vt = 2, the compact layout (small heads:
 * smem_intra_tc_compact, use_compact); returns the shared-memory bytes */
static size_t intra_layout(const kda_kda_args *a, const void *v, int *vt) {
  size_t sm = smem_intra_tc(a->chunk, a->K, a->V), smv = sm + smem_intra_vtile(a->chunk, a->V);
  int al = a->V % 8 == 0 && ((uintptr_t)v & 15) == 0;
  *vt = smv <= (size_t)smem_optin_limit() && al;
  if (*vt) sm = smv;
  size_t smc = smem_intra_tc_compact(a->chunk, a->K, a->V);
  if (al && use_compact(sm, smc)) *vt = 2, sm = smc;
  return sm;
}

/* The forward's gate (gate_mode 1, 2) in its fast forms (kda_common.cuh gate_of<true>: one
 * exponential, MUFU.RCP, log1p by its series) on the tensor-core path's fast calls, the IEEE
 * forms on the precise ones and in version 1 (as the backward's chain: gate_chain_col<FAST>).
 * Every kernel that forms G for a call asks this, so that the fronts agree bit for bit. The
 * fast forms live in k_intra_tc's gated twin (GF), so that the pre-gated kernel's code stays
 * as measured (fast forms in its shared gate loop cost it 1.7% by layout alone, s69c).
 * Measured on the H100 with the trainer's gate (s71a, KDA_BENCH_GATE=1, against the IEEE forms
 * in the shared loop): fwd+bwd (8,2048,16,128) 2.321-2.331 -> 2.286-2.308 ms, (1,8192,16,128)
 * 1.654-1.657 -> 1.613-1.627 (K = 128: no programmatic launch there) */
static int fast_gate(const kda_kda_args *a, int tc, int prec) { return tc && !prec && a->gate_mode != 0; }
/* the shared front: chunk table, rows, intra (used by forward and by the backward recompute);
 * intra = 0: all but intra (the forward's flow kernel runs intra with *ri).
 * Version 2 at K % 4 == 0, K <= 128, 8-byte aligned q, k, g: the fused front, k_intra_tc
 * doing the row preprocessing of its chunk itself (intra_rows in kda_intra.cuh; *ri its inputs),
 * after a one-block kernel for the chunk table (for equal-length sequences, where each
 * chunk's rows are arithmetic, one more column of k_intra_tc's grid instead: tab; the flow
 * forward, which runs intra itself, keeps the kernel); KDA_KDA_ROWS_IN=0 turns it off (read per
 * call: test_kda_cuda compares the two). H200, one run, three rounds (2026-12-01s23b; with the
 * forward's skipped G and M writes, kda_tc.cu): fwd (8,2048,16,128) 1.139-1.147 -> 1.045-1.058
 * ms, (1,8192,16,128) 0.760-0.764 -> 0.721-0.735, in a graph (32,512,4,64) 0.156-0.157 ->
 * 0.138, (8,512,4,64) 0.057 -> 0.051; fwd+bwd 3.685-3.697 -> 3.629-3.656, 2.29-2.30 either
 * way, 0.513 -> 0.502, 0.159 -> 0.156-0.157. Its first form (f8ea09c: the tile zeroing before
 * the loads, not beside them as intra_rows' mid; beta's load after the rows') lost 2.6% at
 * (1,8192,16,128) fwd+bwd (s23a). tab, H200, three rounds each against main's kernels in one
 * run (2026-12-03s34a): in a graph fwd (8,512,4,64) 0.046-0.047 -> 0.045 ms, fwd+bwd 0.140 ->
 * 0.138-0.139; (32,512,4,64) 0.443 -> 0.442; the large shapes within the rounds' spread
 * (fwd+bwd (8,2048,16,128) med 3.020-3.021 -> 3.019-3.037); ncu (8,512,4,64), s33c:
 * k_chunk_table's 2.5 us gone, k_intra_tc 33.5 -> 33.9 us */
static int front(const kda_kda_args *a, const kp &p, const void *q, const void *k, const void *v,
                 const void *g, const void *beta, const float *A_log, const float *dt_bias,
                 const ws &w, cudaStream_t st, const char *op, int tc, int prec, rowin *ri, int intra = 1) {
  int64_t NTu = n_chunks_max(a);
  unsigned nbr = (unsigned)((a->B * a->T * a->HV + 7) / 8);
  int al8 = ((uintptr_t)q | (uintptr_t)k | (uintptr_t)g) % 8 == 0;
  const char *re = getenv("KDA_KDA_ROWS_IN");
  *ri = rowin{};
  int tab = 0;                                     /* k_intra_tc's grid writes the chunk table */
  if (tc && a->K % 4 == 0 && al8 && a->K <= 128 && !(re && strcmp(re, "0") == 0)) {
    *ri = rowin{q, k, g, beta, A_log, dt_bias, w.Kb != nullptr};
    tab = intra && !a->cu_seqlens;
    if (!tab) {
      k_chunk_table<<<1, 256, 0, st>>>(p, w, NTu);
      LAUNCH_OK("k_chunk_table", "kda cuda");
    }
  } else {                                         /* each row kernel's grid has one more block: the chunk table */
    const int fg = fast_gate(a, tc, prec);
    if (a->K % 4 == 0 && al8 && a->K <= 64)
      k_rows4<1, 16><<<(nbr + 1) / 2 + 1, 256, 0, st>>>(p, q, k, g, beta, A_log, dt_bias, w, NTu, fg);
    else if (a->K % 4 == 0 && al8 && a->K <= 128)
      k_rows4<1, 32><<<nbr + 1, 256, 0, st>>>(p, q, k, g, beta, A_log, dt_bias, w, NTu, fg);
    else if (a->K % 4 == 0 && al8 && a->K <= 256)
      k_rows4<2, 32><<<nbr + 1, 256, 0, st>>>(p, q, k, g, beta, A_log, dt_bias, w, NTu, fg);
    else k_rows<<<nbr + 1, 256, 0, st>>>(p, q, k, g, beta, A_log, dt_bias, w, NTu, fg);
    LAUNCH_OK("k_rows", "kda cuda");
  }
  if (!intra) return 0;
  if (tc) {
    int vt;
    size_t sm = intra_layout(a, v, &vt);
    auto kern = k_intra_tc_pick(prec, vt == 2, kv_spec(a), fast_gate(a, tc, prec));
    if (smem_opt_in((const void *)kern, sm, a, op, prec ? "k_intra_tc_p" : "k_intra_tc")) return -1;
    if (vt == 2 && carveout_max((const void *)kern, a, op)) return -1;
    kern<<<chunk_grid(p, NTu + tab, a->HV), chunk_threads(a, "intra", NTC), sm, st>>>(p, v, w, vt, *ri, tab);
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
  int tc = use_tc(a, 0, 0), kv = kv_spec(a);
  /* keep: k_intra_tc also writes Kb, k_state_fwd_tc the per-chunk states and Vn (the backward's
   * fast path reads them instead of recomputing); only when that backward will run version 2.
   * A backward that will be precise (use_precise) gets the precise internals: k_intra_tc_p's
   * fp32 tiles and k_state_fwd_tc_p's 3xTF32 states (o from them, to fp32 level) */
  int kp_ = a->keep && tc && use_precise(a, 1), pk = kp_ && use_tc(a, 1, 1);
  if (!(a->keep && tc && (kp_ ? pk : use_tc(a, 1, 0)))) w.Kb = w.h = w.vn = nullptr;
  rowin ri;
  if ((pk || !tc) && front(a, p, q, k, v, g, beta, A_log, dt_bias, w, st, op, tc, pk, &ri)) return -1;
  if (pk) {
    size_t sm = smem_state_tc(a->chunk, a->K, 1);
    auto kern = k_state_fwd_tc_pick(ST_PRECISE, kv);
    if (smem_opt_in((const void *)kern, sm, a, op, "k_state_fwd_tc_p")) return -1;
    kern<<<state_grid(a), NTC, sm, st>>>(p, w, h0, o, ht);
    LAUNCH_OK("k_state_fwd_tc_p", "kda_kda_cuda_forward");
    return 0;
  }
  if (tc) {
    /* db: two sets of chunk tiles (k_state_fwd_tc_db) when the grid needs at most one block an
     * SM and they fit; KDA_KDA_STATE_DB=0 turns it off (read per call: the test's fourth path).
     * Measured on the H200 against KDA_KDA_STATE_DB=0 in one run (both passes): fwd
     * (1,8192,16,128) 1.295 -> 1.228 ms, fwd+bwd 3.813 -> 3.665; (8,512,4,64) fwd 0.088 -> 0.084,
     * fwd+bwd 0.260 -> 0.253 */
    size_t sm = smem_state_tc(a->chunk, a->K, 0), smd = smem_state_tc_db(a->chunk, a->K);
    if (use_wide(a, kv)) {
      if (front(a, p, q, k, v, g, beta, A_log, dt_bias, w, st, op, tc, 0, &ri)) return -1;
      if (use_wg(kv, o)) {
        size_t smg = smem_state_wg();
        auto kern = k_state_fwd_tc_wg_ptr();
        if (smem_opt_in((const void *)kern, smg, a, op, "k_state_fwd_tc_wg")) return -1;
        kern<<<state_grid(a, BVW), NTW, smg, st>>>(p, w, h0, o, ht);
        LAUNCH_OK("k_state_fwd_tc_wg", "kda_kda_cuda_forward");
        return 0;
      }
      size_t smw = smem_state_wide(a->chunk, a->K, 1);
      auto kern = k_state_fwd_tc_wide_pick(kv);
      if (smem_opt_in((const void *)kern, smw, a, op, "k_state_fwd_tc_wide")) return -1;
      kern<<<state_grid(a, BVW), NTW, smw, st>>>(p, w, h0, o, ht);
      LAUNCH_OK("k_state_fwd_tc_wide", "kda_kda_cuda_forward");
      return 0;
    }
    if (use_state_db(a, smd) && use_flow(a, "intra", "state_fwd")) {
      /* intra and the state pass as one grid (k_fwd_flow in kda_tc.cu: the state blocks follow
       * the intra blocks chunk by chunk instead of starting after the last); the flags it
       * waits on are zeroed by front's chunk-table block */
      if (front(a, p, q, k, v, g, beta, A_log, dt_bias, w, st, op, tc, 0, &ri, 0)) return -1;
      int vt, ns = (int)state_grid(a).x;
      size_t smi = intra_layout(a, v, &vt), smf = smi > smd ? smi : smd;
      /* the persistent intra blocks (k_fwd_flow_ps) */
      const bool fps = vt == 1 && kv && ri.q && use_persist(a, q, k, g, v);
      auto kern = k_fwd_flow_pick(vt == 2, kv, fast_gate(a, tc, 0));
      if (smem_opt_in((const void *)kern, smf, a, op, "k_fwd_flow")) return -1;
      if (vt == 2 && carveout_max((const void *)kern, a, op)) return -1;
      /* lead: intra blocks started before the state blocks. From the start, the state blocks
       * wait on intra most of their time while holding their SMs; started after a quarter of
       * the intra grid (which runs on every SM meanwhile) they catch up with it without
       * waiting as long. H200, one run, fwd+bwd (1,8192,16,128): lead 0 2.42 ms, a quarter
       * (512) 2.35, a half 2.44. KDA_KDA_FLOW_LEAD=N sets it (for measuring) */
      int64_t ni = n_chunks_max(a) * a->HV;
      const char *le = getenv("KDA_KDA_FLOW_LEAD");
      int lead = (int)(le ? atoll(le) : ni / 4);
      if (lead < 0 || lead > ni) lead = (int)ni;
      unsigned nb = (unsigned)(ns + ni);
      if (fps) {
        auto kps = k_fwd_flow_ps_pick(kv, fast_gate(a, tc, 0));
        if (smem_opt_in((const void *)kps, smf, a, op, "k_fwd_flow_ps")) return -1;
        /* KDA_KDA_PERSIST_GRID=N: ns + N blocks (every one resident: the N that draw no state
         * role run every intra role; one of them is enough for progress) */
        const char *cap = getenv("KDA_KDA_PERSIST_GRID");
        const int nc = cap ? atoi(cap) : 0;
        unsigned gp = nc > 0 && (unsigned)(ns + nc) < nb ? (unsigned)(ns + nc) : nb;
        kps<<<gp, NTC, smf, st>>>(p, v, w, ri, h0, o, ht, ns, lead, (int)nb);
        LAUNCH_OK("k_fwd_flow_ps", "kda_kda_cuda_forward");
        return 0;
      }
      kern<<<nb, NTC, smf, st>>>(p, v, w, vt, ri, h0, o, ht, ns, lead);
      LAUNCH_OK("k_fwd_flow", "kda_kda_cuda_forward");
      return 0;
    }
    if (front(a, p, q, k, v, g, beta, A_log, dt_bias, w, st, op, tc, 0, &ri)) return -1;
    if (use_state_db(a, smd)) {
      int bv = state_bv(a, smem_state_tc_db(a->chunk, a->K, BVN, db_sets(kv, BVN)));
      size_t smb = smem_state_tc_db(a->chunk, a->K, bv, db_sets(kv, bv));
      auto kern = k_state_fwd_tc_pick(ST_DB, kv, bv);
      if (smem_opt_in((const void *)kern, smb, a, op, "k_state_fwd_tc_db")) return -1;
      kern<<<state_grid(a, bv), chunk_threads(a, "state_fwd", NTC), smb, st>>>(p, w, h0, o, ht);
      LAUNCH_OK("k_state_fwd_tc_db", "kda_kda_cuda_forward");
      return 0;
    }
    auto kern = k_state_fwd_tc_pick(ST_FAST, kv);
    if (smem_opt_in((const void *)kern, sm, a, op, "k_state_fwd_tc")) return -1;
    kern<<<state_grid(a), NT, sm, st>>>(p, w, h0, o, ht);
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
  last_fr = last_sr = 0;
  if (check_common(a, op)) return -1;
  if (a->gate_mode == KDA_GATE_SOFTPLUS && !A_log)
    return kda_set_error("%s: the softplus gate (gate_mode 1) needs A_log [HV]: pass it", op);
  if (check_ws(a, 1, workspace, workspace_bytes, &w, op)) return -1;
  cudaStream_t st = (cudaStream_t)stream;
  kp p = make_kp(a);
  int64_t NTu = n_chunks_max(a);
  int prec = use_precise(a, dA_log || ddt_bias);
  int tc = use_tc(a, 1, prec), kv = kv_spec(a);
  /* kept: the forward left chunk table, rows, intra outputs, Kb, states and Vn in the workspace,
   * of the precision this backward runs at (what use_precise(a, 1) prepared), else recompute */
  int kept = a->keep && tc && use_precise(a, 1) == prec;
  rowin ri;
  if (!kept && front(a, p, q, k, v, g, beta, A_log, dt_bias, w, st, op, tc, tc && prec, &ri)) return -1;
  dim3 gc = chunk_grid(p, NTu, a->HV), gc1((unsigned)NTu, (unsigned)a->HV);   /* head-major (blk_chunk); chunk-major: version 1, FR */
  int qk_final = 0;                                /* dq, dk written by k_bwd_final_tc (below) */
  if (tc) {                                        /* prec: the precise twins (suffix _p) */
    size_t sm = smem_state_tc(a->chunk, a->K, prec), smd = smem_state_bwd_tc_db(a->chunk, a->K);
    /* the rows kernel's layout. The precise variant's sep: dS in a tile of its own when it
     * fits (dgn from shared memory, one staging wait less); KDA_KDA_ROWS_SEP=0 forces the
     * shared tile. The fast variant's vnx: Vn in a tile of its own (staged with the first
     * copies, not after dW) where it fits without costing a second block an SM; KDA_KDA_ROWS_VN=0
     * off (both read per call: the test's fourth path turns both off) */
    size_t lim = (size_t)smem_optin_limit(), per_sm = smem_per_sm();
    int sep = 0, vnx = 0, dvf = 0, wide = !prec && kept ? use_wide(a, kv) : 0;
    size_t smr;
    if (prec) {
      const char *rs = getenv("KDA_KDA_ROWS_SEP");
      smr = smem_rows_tc_sep(a->chunk, a->K, a->V);
      sep = smr <= lim && !(rs && strcmp(rs, "0") == 0);
      if (!sep) smr = smem_rows_tc(a->chunk, a->K, a->V);
    } else {
      /* dvf: after the two-tile-set reverse sweep (alone or in the flow kernel), which writes no
       * bf16 dVn, the rows kernel reads the fp32 one */
      const char *rv = getenv("KDA_KDA_ROWS_VN");
      dvf = kept && !wide && use_state_db(a, smd);
      size_t s0 = smem_rows_tc_fast(a->chunk, a->K, a->V, 0, dvf), s1 = smem_rows_tc_fast(a->chunk, a->K, a->V, 1, dvf);
      vnx = s1 <= lim && (2 * s1 <= per_sm || 2 * s0 > per_sm) && !(rv && strcmp(rv, "0") == 0);
      smr = vnx ? s1 : s0;
    }
    const int lay = (sep ? ROWS_SEP : 0) | (vnx ? ROWS_VN : 0) | (dvf ? ROWS_DVF : 0);
    /* 256 threads when two blocks' tiles fit an SM (small heads): at 512 the fast kernel's 84
     * registers a thread allow one block an SM. Measured on the H200 (KDA_KDA_THREADS=rows=256):
     * fwd+bwd (32,512,4,64) 0.915 -> 0.893 ms, (8,512,4,64) 0.285 -> 0.281; at K = 128, one
     * block an SM by its tiles, 256 threads lost 2.3%. The K = V = 64 instantiation (kv_spec)
     * needs 46 registers, so two blocks of 512 fit: 512 there, (32,512,4,64) 0.655 -> 0.649 ms,
     * (8,512,4,64) 0.218 -> 0.214 */
    int rt = chunk_threads(a, "rows", !prec && !kv && 2 * smr <= smem_per_sm() ? 256 : NTC);
    int flow = !prec && kept && !wide && use_state_db(a, smd) && rt == NTC && use_flow(a, "rows", "state_bwd");
    const int fr = last_fr = use_final_fr(a, prec, kv, flow);
    const int wgb = wide && use_wg_bwd(kv, dout);  /* the wgmma reverse sweep, alone or with the rows products */
    const int srw = wgb && use_sweep_rows(a, use_rows_wg(prec, kv, lay, dout));
    /* the mat and final kernels' forms (below), and what the fused sweep hands them in bf16 */
    const int mh = use_mat_halves(prec, kv), mwg = use_mat_wg(mh);
    size_t smf0 = smem_final_tc(a->chunk, a->K);
    const int fcm = use_compact(smf0, smem_final_tc_compact(a->chunk, a->K));
    const int fwg = use_final_wg(prec, fcm, kv), b16 = srw ? use_b16(fwg, mwg) : 0;
    last_sr = srw ? 1 + b16 : 0;
    if (srw) {                                     /* the sweep and the rows products in one kernel */
      size_t sms = smem_state_bwd_rows_wg();
      auto ks = k_state_bwd_rows_wg_ptr(b16);
      if (smem_opt_in((const void *)ks, sms, a, op, "k_state_bwd_rows_wg")) return -1;
      ks<<<state_grid(a, (int)a->V), NTC, sms, st>>>(p, w, dout, dht, dh0);
      LAUNCH_OK("k_state_bwd_rows_wg", "kda_kda_cuda_backward");
    } else if (wgb) {                              /* the same on warpgroup MMAs */
      size_t smg = smem_state_bwd_wg();
      auto kw = k_state_bwd_tc_wg_ptr();
      if (smem_opt_in((const void *)kw, smg, a, op, "k_state_bwd_tc_wg")) return -1;
      kw<<<state_grid(a, BVW), NTW, smg, st>>>(p, w, dout, dht, dh0);
      LAUNCH_OK("k_state_bwd_tc_wg", "kda_kda_cuda_backward");
    } else if (wide) {                             /* the kept fast reverse sweep, 64 columns a block */
      size_t smw = smem_state_wide(a->chunk, a->K, 0);
      auto kw = k_state_bwd_tc_wide_pick(kv);
      if (smem_opt_in((const void *)kw, smw, a, op, "k_state_bwd_tc_wide")) return -1;
      kw<<<state_grid(a, BVW), NTW, smw, st>>>(p, w, dout, dht, dh0);
      LAUNCH_OK("k_state_bwd_tc_wide", "kda_kda_cuda_backward");
    } else if (flow) {                             /* the reverse sweep and rows as one grid */
      int ns = (int)state_grid(a).x, nz = (int)((a->V + BVT - 1) / BVT);
      size_t smf = smr > smd ? smr : smd;
      auto kf = k_bwd_flow_pick(kv);
      if (smem_opt_in((const void *)kf, smf, a, op, "k_bwd_flow")) return -1;
      unsigned nb = (unsigned)(ns + NTu * a->HV);
      kf<<<nb, NTC, smf, st>>>(p, dout, w, dht, dh0, lay, ns, nz, w.flow + 1 + NTu * a->HV);
      LAUNCH_OK("k_bwd_flow", "kda_kda_cuda_backward");
    } else if (!prec && kept && use_state_db(a, smd)) {   /* the kept fast reverse sweep, two tile sets */
      int bv = state_bv(a, smem_state_bwd_tc_db(a->chunk, a->K, BVN, db_sets(kv, BVN)));
      size_t smb = smem_state_bwd_tc_db(a->chunk, a->K, bv, db_sets(kv, bv));
      auto kdb = k_state_bwd_tc_db_pick(kv, bv);
      if (smem_opt_in((const void *)kdb, smb, a, op, "k_state_bwd_tc_db")) return -1;
      kdb<<<state_grid(a, bv), chunk_threads(a, "state_bwd", NTC), smb, st>>>(p, w, dout, dht, dh0);
    } else {
      auto kst = k_state_bwd_tc_pick(prec, kv);
      if (smem_opt_in((const void *)kst, sm, a, op, prec ? "k_state_bwd_tc_p" : "k_state_bwd_tc")) return -1;
      /* 512 threads (NTC): measured against 256 on the H200, fwd+bwd (1,8192,16,128) 6.19 ->
       * 6.00 ms, the precise backward (8,2048,16,128) 15.16 -> 14.08 (one 161 KB block an SM:
       * 8 warps were too few), the rest equal or within 1%. 1024 threads: fewer cycles a block
       * (440k -> 333k) but one block an SM (64 registers x 1024), 535 -> 737 us: not kept.
       * The precise pass's 118 registers a thread allow one block of 512 an SM: when its blocks
       * outnumber the SMs (more than one wave) and two blocks' tiles fit an SM (K <= 64), 256
       * threads run two an SM, one wave where there were two (the KDA hybrid at 64x512: four
       * waves -> two). KDA_KDA_THREADS=state_bwd=N overrides. Measured on the H200 against
       * state_bwd=512 in one run: the precise fwd+bwd (32,512,4,64) 1.185 -> 1.174 ms. The
       * K = V = 64 / 128 instantiations (kv_spec) need 63 registers, so two blocks of 512 fit:
       * they keep 512, (32,512,4,64) 0.997 -> 0.986 ms against 256 */
      int nsm = sm_count(), sbt = NTC;
      if (prec && !kv && nsm && (int64_t)state_grid(a).x > nsm && 2 * sm <= smem_per_sm()) sbt = 256;
      kst<<<state_grid(a), chunk_threads(a, "state_bwd", sbt), sm, st>>>(p, w, h0, dout, dht, dh0, kept);
    }
    if (!flow) {
      LAUNCH_OK("k_state_bwd_tc", "kda_kda_cuda_backward");
      if (fr == 2 || srw) {                        /* no rows kernel: other kernels form its products */
      } else if (use_rows_wg(prec, kv, lay, dout)) {
        auto krg = k_bwd_rows_wg_ptr();
        if (smem_opt_in((const void *)krg, smem_rows_wg(), a, op, "k_bwd_rows_wg")) return -1;
        if (carveout_max((const void *)krg, a, op)) return -1;
        krg<<<gc, NTC, smem_rows_wg(), st>>>(p, dout, w);
        LAUNCH_OK("k_bwd_rows_wg", "kda_kda_cuda_backward");
      } else {
        auto krw = k_bwd_rows_tc_pick(prec, kv);
        if (smem_opt_in((const void *)krw, smr, a, op, prec ? "k_bwd_rows_tc_p" : "k_bwd_rows_tc")) return -1;
        krw<<<gc, rt, smr, st>>>(p, dout, w, lay | (fr ? ROWS_FR : 0));
        LAUNCH_OK("k_bwd_rows_tc", "kda_kda_cuda_backward");
      }
    }
    sm = smem_mat_tc(a->chunk, a->K, a->V);
    size_t smc = smem_mat_tc_compact(a->chunk, a->K, a->V);
    int mcm = use_compact(sm, smc);
    if (mcm) sm = smc;
    auto kmt = k_bwd_mat_tc_pick(prec, mcm, kv);
    const int w16 = !!(b16 & SR_B16_W);
    if (mh) kmt = k_bwd_mat_tc_h, sm = smem_mat_tc_halves(a->chunk, a->K, a->V);
    if (mwg) kmt = k_bwd_mat_wg_ptr(w16), sm = smem_mat_wg(w16);
    if (fr == 2) kmt = k_bwd_mat_mw_ptr();         /* mcm: smem_mat_tc_compact's bytes */
    if (smem_opt_in((const void *)kmt, sm, a, op,
                    prec ? "k_bwd_mat_tc_p" : mwg ? "k_bwd_mat_wg" : mh ? "k_bwd_mat_tc_h" : "k_bwd_mat_tc"))
      return -1;
    if ((mcm || mh) && carveout_max((const void *)kmt, a, op)) return -1;
    kmt<<<gc, chunk_threads(a, "mat", NTC), sm, st>>>(p, v, dout, dv, w);
    if (mwg) LAUNCH_OK("k_bwd_mat_wg", "kda_kda_cuda_backward");
    else if (mh) LAUNCH_OK("k_bwd_mat_tc_h", "kda_kda_cuda_backward");
    else LAUNCH_OK("k_bwd_mat_tc", "kda_kda_cuda_backward");
    sm = fcm ? smem_final_tc_compact(a->chunk, a->K) : smf0;
    auto kfn = k_bwd_final_tc_pick(prec, fcm, kv);
    if (fwg) kfn = k_bwd_final_wg_ptr(!!(b16 & SR_B16_QK));   /* the same shared memory */
    if (smem_opt_in((const void *)kfn, sm, a, op, prec ? "k_bwd_final_tc_p" : fwg ? "k_bwd_final_wg" : "k_bwd_final_tc"))
      return -1;
    if (fcm && carveout_max((const void *)kfn, a, op)) return -1;
    /* compact: 256 threads, so that two blocks' 128 registers a thread fit an SM. The l2-norm
     * backward (dq, dk) in the final kernel where no GVA group sum comes first (H == HV) and a
     * lane's four columns hold a row (K <= 128), instead of k_qk_bwd after it (bwd_final_tc's R
     * terms). H200, one run (2026-12-02s26c), fwd+bwd against main's kernels: 3.340-3.344 ->
     * 3.177-3.181 ms at (8,2048,16,128), 2.133-2.141 -> 2.047-2.054 at (1,8192,16,128), in a
     * graph 0.485-0.486 -> 0.466 at (32,512,4,64), 0.154 -> 0.148-0.149 at (8,512,4,64) */
    qk_final = a->H == a->HV && a->K <= 128;
    if (fr) {                                      /* fr implies fcm: 256 threads */
      auto kfr = k_bwd_final_fr_ptr();
      if (smem_opt_in((const void *)kfr, sm, a, op, "k_bwd_final_fr") || carveout_max((const void *)kfr, a, op)) return -1;
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[0].val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t lc = {gc1, dim3(256), sm, st, at, (unsigned)(fr == 2 && use_pdl())};
      CUDA_OK(cudaLaunchKernelEx(&lc, kfr, p, q, k, g, beta, A_log, dt_bias, dg, dbeta, qk_final ? dq : nullptr,
                                 qk_final ? dk : nullptr, w, dout),
              "kda_kda_cuda_backward: launch k_bwd_final_fr");
    } else
      kfn<<<gc, chunk_threads(a, "final", fcm ? 256 : NTC), sm, st>>>(p, q, k, g, beta, A_log, dt_bias, dg, dbeta,
                                                                       qk_final ? dq : nullptr, qk_final ? dk : nullptr,
                                                                       w);
    if (fwg) LAUNCH_OK("k_bwd_final_wg", "kda_kda_cuda_backward");
    else if (fr) LAUNCH_OK("k_bwd_final_fr", "kda_kda_cuda_backward");
    else LAUNCH_OK("k_bwd_final_tc", "kda_kda_cuda_backward");
  } else {
    size_t sm = smem_state(a->chunk, a->K) + (size_t)a->chunk * BV * 4;
    if (smem_opt_in((const void *)k_state_bwd, sm, a, op, "k_state_bwd")) return -1;
    dim3 gs((unsigned)n_seq(a), (unsigned)a->HV, (unsigned)((a->V + BV - 1) / BV));
    k_state_bwd<<<gs, NT, sm, st>>>(p, w, h0, dout, dht, dh0);
    LAUNCH_OK("k_state_bwd", "kda_kda_cuda_backward");
    k_bwd_rows<<<gc1, NT, 0, st>>>(p, dout, w);
    LAUNCH_OK("k_bwd_rows", "kda_kda_cuda_backward");
    sm = smem_mat(a->chunk);
    if (smem_opt_in((const void *)k_bwd_mat, sm, a, op, "k_bwd_mat")) return -1;
    k_bwd_mat<<<gc1, NT, sm, st>>>(p, v, dout, dv, w);
    LAUNCH_OK("k_bwd_mat", "kda_kda_cuda_backward");
    sm = (size_t)(2 * a->chunk * (a->chunk + 1) + 2 * a->chunk) * 4;
    k_bwd_final<<<gc1, 128, sm, st>>>(p, g, beta, A_log, dt_bias, dg, dbeta, dA_log, ddt_bias, w);
    LAUNCH_OK("k_bwd_final", "kda_kda_cuda_backward");
  }
  if ((dA_log || ddt_bias) && a->gate_mode) {      /* per-chunk partials, summed in a fixed order */
    const dim3 gr((unsigned)a->HV, (unsigned)((a->K + 32) / 32));   /* K + 1 columns, 32 a block */
    k_gate_reduce<<<gr, GR_WARPS * 32, 0, st>>>(p, w, n_seq(a), dA_log, ddt_bias);
    LAUNCH_OK("k_gate_reduce", "kda_kda_cuda_backward");
  } else {                                         /* pre-gated: the gate has no parameters, zero gradients */
    if (dA_log) CUDA_OK(cudaMemsetAsync(dA_log, 0, (size_t)a->HV * 4, st), "kda_kda_cuda_backward");
    if (ddt_bias) CUDA_OK(cudaMemsetAsync(ddt_bias, 0, (size_t)(a->HV * a->K) * 4, st), "kda_kda_cuda_backward");
  }
  if (!qk_final) {
    unsigned nbq = (unsigned)((a->B * a->T * a->H + 7) / 8);
    int al8 = ((uintptr_t)q | (uintptr_t)k | (uintptr_t)dq | (uintptr_t)dk) % 8 == 0;
    if (a->K % 4 == 0 && al8 && a->K <= 64) k_qk_bwd4<1, 16><<<(nbq + 1) / 2, 256, 0, st>>>(p, q, k, dq, dk, w);
    else if (a->K % 4 == 0 && al8 && a->K <= 128) k_qk_bwd4<1, 32><<<nbq, 256, 0, st>>>(p, q, k, dq, dk, w);
    else if (a->K % 4 == 0 && al8 && a->K <= 256) k_qk_bwd4<2, 32><<<nbq, 256, 0, st>>>(p, q, k, dq, dk, w);
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
