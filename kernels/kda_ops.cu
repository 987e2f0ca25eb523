/* kda_ops.cu — the CUDA backend's KDA_OP_KDA, KDA_OP_KDA_BWD, KDA_OP_KDA_DECODE, KDA_OP_CONV1D,
 * KDA_OP_CONV1D_BWD.
 *
 * KDA / KDA_BWD / KDA_DECODE are glue over kernels/kda_cuda.cu (bf16 activations, fp32 params):
 * the exec node's views become a kda_kda_args, exactly as core/cpu_kda.c does for the CPU
 * reference. KDA_DECODE's state [HV,K,V] is an f32 leaf the recurrent kernel updates in place.
 * Storage dtypes come per view (core/backend.h): activations are bf16 on CUDA, but a graph
 * INPUT is f32, and KDA_BWD's packed output [dq,dk,dv,dg,dbeta,dA_log,ddt_bias] is f32 when
 * the plan marks it precise (its dA_log/ddt_bias slices are parameter gradients). So:
 *   - an f32 activation input is cast to bf16 in scratch (the kernels read bf16);
 *   - a bf16 A_log / dt_bias is widened to f32 in scratch;
 *   - an f32 output is produced in bf16 staging and widened; an f32 kernel output (dA_log,
 *     ddt_bias) going into a bf16 packed buffer is staged in f32 and narrowed.
 * The common case (bf16 activations in, bf16 o out; f32 packed gradient out) costs one
 * widening pass over dq..dbeta (~2 B read + 4 B written per element; k_ko_widen8). Measured on
 * the H200, the hybrid S 64x512 step with the eight-element widening against the element-wise
 * cast: 17.35 -> 17.29 ms. Scratch = the KDA workspace + these staging buffers, sized by
 * kc_kda_scratch so the backend grows its one scratch buffer before capture; a KDA node whose
 * KDA_BWD follows in the same list runs on a workspace of the pair's own instead (c->kda_kept,
 * kda_kda_args.keep: the backward reuses the forward's internals).
 *
 * CONV1D: depthwise causal conv y[b,t,c] = sum_j w[c,j] x[b,t-W+1+j,c] (zero before t = 0),
 * SiLU fused when iattr0 = 1. W <= 8. The layer's shape (W = 4, C even) runs the run kernels:
 * a thread two channels over 16 tokens, each input row loaded once into registers; other
 * shapes the general ones (forward one thread per output, the W taps from L1; backward tiles
 * of 64 tokens x 32 channels in shared memory). The backward recomputes the pre-activation (no
 * saved activation), dx = sum_j w[c,j] dpre[t+W-1-j]; dw is reduced deterministically: each
 * tile writes a partial [C,W] row, a second kernel sums the partials in a fixed order, a warp
 * per weight (no float atomics: bit-reproducible runs).                                      */
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "kda_cuda.h"

#define KO_ERR(n, what) kda_set_error("cuda: %s in op %s node %d", what, kda_op_name((n)->op), (n)->id)
#define KO_CUDA(n, call)                                                                      \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess)                                                                    \
      return kda_set_error("cuda: %s failed (%s) in op %s node %d (%s:%d)", #call,            \
                           cudaGetErrorString(e_), kda_op_name((n)->op), (n)->id, __FILE__,   \
                           __LINE__);                                                         \
  } while (0)
#define KO_LAUNCH(n, kname) KO_CUDA(n, cudaGetLastError())

/* ---- casts -------------------------------------------------------------------------------- */
__global__ void k_ko_cast(const void *src, int sdt, void *dst, int ddt, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    kc_st(dst, ddt, i, kc_ld(src, sdt, i));
}
/* bf16 -> f32, eight elements a thread (one 16-byte load, two 16-byte stores): the widening of
 * KDA_BWD's gradients into its f32 packed output, ~200 MB a hybrid S layer at 64x512, where the
 * element-wise kernel above did one element a thread (hybrid S step 17.35 -> 17.29 ms). */
__global__ void k_ko_widen8(const uint4 *src, float4 *dst, int64_t n8) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8;
       i += (int64_t)gridDim.x * blockDim.x) {
    uint4 x = src[i];
    const __nv_bfloat162 *b = (const __nv_bfloat162 *)&x;
    float2 f0 = __bfloat1622float2(b[0]), f1 = __bfloat1622float2(b[1]);
    float2 f2 = __bfloat1622float2(b[2]), f3 = __bfloat1622float2(b[3]);
    dst[2 * i] = make_float4(f0.x, f0.y, f1.x, f1.y);
    dst[2 * i + 1] = make_float4(f2.x, f2.y, f3.x, f3.y);
  }
}
/* f32 -> bf16 the same way (an f32 graph input or gradient into the kernels' bf16) */
__global__ void k_ko_narrow8(const float4 *src, uint4 *dst, int64_t n8) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8;
       i += (int64_t)gridDim.x * blockDim.x) {
    float4 a = src[2 * i], b = src[2 * i + 1];
    __nv_bfloat162 h[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                           __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
    dst[i] = *(const uint4 *)h;
  }
}
static int ko_cast(const kda_exec_node *n, kc_ctx *c, const void *src, int sdt, void *dst,
                   int ddt, int64_t cnt) {
  if (cnt <= 0) return 0;
  bool wide = sdt == KDA_BF16 && ddt == KDA_F32, narrow = sdt == KDA_F32 && ddt == KDA_BF16;
  if ((wide || narrow) && ((uintptr_t)src | (uintptr_t)dst) % 16 == 0) {
    int64_t n8 = cnt / 8, done = n8 * 8;
    unsigned nb = kc_blocks(n8, 256, (int64_t)c->num_sms * 8);
    if (n8 && wide) k_ko_widen8<<<nb, 256, 0, c->stream>>>((const uint4 *)src, (float4 *)dst, n8);
    if (n8 && narrow) k_ko_narrow8<<<nb, 256, 0, c->stream>>>((const float4 *)src, (uint4 *)dst, n8);
    if (n8) KO_LAUNCH(n, "k_ko_widen8 / k_ko_narrow8");
    if (done == cnt) return 0;   /* the tail (< 8 elements) element-wise */
    src = (const char *)src + done * (wide ? 2 : 4), dst = (char *)dst + done * (wide ? 4 : 2), cnt -= done;
  }
  k_ko_cast<<<kc_blocks(cnt, 256, (int64_t)c->num_sms * 8), 256, 0, c->stream>>>(src, sdt, dst, ddt, cnt);
  KO_LAUNCH(n, "k_ko_cast");
  return 0;
}

/* ---- KDA ---------------------------------------------------------------------------------- */
/* The scratch carve-up of one KDA node. base NULL: only count. */
typedef struct ko_kda_ws {
  void *ws;             /* the kda_cuda workspace */
  int64_t ws_bytes;
  void *in[8];          /* the pointer each kernel argument reads (maybe a scratch copy) */
  void *stage;          /* output staging (bf16 o / bf16 dq..dbeta, or f32 dA_log+ddt_bias) */
  int64_t total;
} ko_kda_ws;

/* bf16 kernel inputs: q, k, v, g, beta, and KDA_BWD's dout; A_log, dt_bias and KDA_DECODE's
 * state (in[7], updated in place) are f32 */
static int ko_is_act(const kda_exec_node *n, int i) { return i <= 4 || (i == 7 && n->op == KDA_OP_KDA_BWD); }

static void ko_kda_layout(const kda_exec_node *n, char *base, ko_kda_ws *w) {
  kda_kda_args a = kda_kda_args_of(n);
  int bwd = n->op == KDA_OP_KDA_BWD;
  int64_t off = 0;
  auto take = [&](int64_t bytes) -> void * {
    void *p = base ? base + off : NULL;
    off += KC_ALIGN(bytes);
    return p;
  };
  w->ws_bytes = n->op == KDA_OP_KDA_DECODE ? 0 : kda_kda_cuda_workspace_bytes(&a, bwd);
  w->ws = take(w->ws_bytes);
  for (int i = 0; i < n->nin && i < 8; i++) {
    const kda_tview *t = &n->in[i];
    int want = ko_is_act(n, i) ? KDA_BF16 : KDA_F32;
    w->in[i] = t->dtype == want ? t->data : take(kda_tview_numel(t) * (want == KDA_BF16 ? 2 : 4));
  }
  w->stage = NULL;
  if (!bwd) {
    if (n->out.dtype != KDA_BF16) w->stage = take(kda_tview_numel(&n->out) * 2);
  } else {
    int64_t nq = kda_tview_numel(&n->in[0]), nv = kda_tview_numel(&n->in[2]);
    int64_t ng = kda_tview_numel(&n->in[3]), nb = kda_tview_numel(&n->in[4]);
    if (n->out.dtype == KDA_F32) w->stage = take((2 * nq + nv + ng + nb) * 2);
    else w->stage = take((a.HV + a.HV * a.K) * 4);
  }
  w->total = off;
}

static int ko_kda(const kda_exec_node *n, kc_ctx *c) {
  int bwd = n->op == KDA_OP_KDA_BWD;
  if (n->nin != (n->op == KDA_OP_KDA ? 7 : 8)) return KO_ERR(n, "KDA needs 7 inputs (KDA_BWD, KDA_DECODE 8)");
  if (n->op == KDA_OP_KDA_DECODE && n->in[7].dtype != KDA_F32)
    return KO_ERR(n, "KDA_DECODE's state must be f32 (it is updated in place)");
  kda_kda_args a = kda_kda_args_of(n);
  ko_kda_ws w;
  ko_kda_layout(n, NULL, &w);
  if (w.total > c->scratch_bytes || !c->scratch)
    return kda_set_error("cuda: op %s node %d needs %lld bytes of scratch, has %lld: the backend "
                         "sizes scratch with kc_kda_scratch", kda_op_name(n->op), n->id,
                         (long long)w.total, (long long)c->scratch_bytes);
  ko_kda_layout(n, (char *)c->scratch, &w);
  /* a kept pair (the backend's keep_plan): its own workspace, kept from forward to backward */
  int64_t kb = 0;
  void *kw = n->op != KDA_OP_KDA_DECODE && c->kda_kept ? c->kda_kept(n, &kb) : NULL;
  if (kw) a.keep = 1, w.ws = kw, w.ws_bytes = kb;
  for (int i = 0; i < n->nin; i++) {
    const kda_tview *t = &n->in[i];
    if (w.in[i] != t->data &&
        ko_cast(n, c, t->data, t->dtype, w.in[i], ko_is_act(n, i) ? KDA_BF16 : KDA_F32, kda_tview_numel(t)))
      return -1;
  }
  const float *A_log = (const float *)w.in[5], *dt_bias = (const float *)w.in[6];
  if (!bwd) {
    void *o = w.stage ? w.stage : n->out.data;
    int rc = n->op == KDA_OP_KDA_DECODE   /* one recurrent step; the f32 state leaf in place */
                 ? kda_kda_cuda_decode(&a, w.in[0], w.in[1], w.in[2], w.in[3], w.in[4], A_log, dt_bias,
                                       (float *)n->in[7].data, o, c->stream)
                 : kda_kda_cuda_forward(&a, w.in[0], w.in[1], w.in[2], w.in[3], w.in[4], A_log, dt_bias,
                                        NULL, o, NULL, w.ws, w.ws_bytes, c->stream);
    if (rc) return -1;
    if (w.stage) return ko_cast(n, c, w.stage, KDA_BF16, n->out.data, n->out.dtype, kda_tview_numel(&n->out));
    return 0;
  }
  int64_t nq = kda_tview_numel(&n->in[0]), nv = kda_tview_numel(&n->in[2]);
  int64_t ng = kda_tview_numel(&n->in[3]), nb = kda_tview_numel(&n->in[4]);
  int64_t ngrad = 2 * nq + nv + ng + nb, nparam = a.HV + a.HV * a.K;
  int odt = n->out.dtype;
  if (odt != KDA_F32 && odt != KDA_BF16) return KO_ERR(n, "KDA_BWD output must be f32 or bf16");
  char *ob = (char *)n->out.data;
  /* bf16 gradients: into out directly when it is bf16, else into the staging buffer */
  char *g16 = odt == KDA_BF16 ? ob : (char *)w.stage;
  /* f32 dA_log, ddt_bias: into out's slices when it is f32, else staged */
  float *p32 = odt == KDA_F32 ? (float *)ob + ngrad : (float *)w.stage;
  void *dq = g16, *dk = g16 + 2 * nq, *dv = g16 + 4 * nq, *dg = g16 + 4 * nq + 2 * nv;
  void *db = g16 + 4 * nq + 2 * nv + 2 * ng;
  if (kda_kda_cuda_backward(&a, w.in[0], w.in[1], w.in[2], w.in[3], w.in[4], A_log, dt_bias, NULL,
                            w.in[7], NULL, dq, dk, dv, dg, db, p32, p32 + a.HV, NULL, w.ws,
                            w.ws_bytes, c->stream))
    return -1;
  if (odt == KDA_F32) return ko_cast(n, c, w.stage, KDA_BF16, ob, KDA_F32, ngrad);
  return ko_cast(n, c, w.stage, KDA_F32, ob + 2 * ngrad, KDA_BF16, nparam);
}

/* ---- CONV1D ------------------------------------------------------------------------------- */
#define CV_TT 64     /* tokens per backward tile */
#define CV_TC 32     /* channels per backward tile (one warp wide) */
#define CV_WMAX 8

/* __fdividef: a reciprocal and a multiply, not IEEE division's slow-path branch (2.3% of the
 * run forward's stalls); its 2-ulp error is __expf's size; 1 / inf gives 0 */
static __device__ __forceinline__ float cv_sigm(float x) { return __fdividef(1.f, 1.f + __expf(-x)); }

/* I: the index type, 32-bit when B*T*C fits (two divisions per element; measured in the
 * hybrid S 64x512 step: 1.28 -> 1.24 ms for its 18 conv1d nodes, still ~7x their bytes' time) */
template <typename I>
__global__ void k_conv_fwd(const void *x, int xdt, const void *w, int wdt, void *y, int ydt,
                           I B, I T, I C, int W, int silu) {
  I total = B * T * C;
  for (I e = blockIdx.x * (I)blockDim.x + threadIdx.x; e < total; e += (I)gridDim.x * blockDim.x) {
    I ch = e % C, t = (e / C) % T;
    float p = 0.f;
    for (int j = 0; j < W; j++) {
      int64_t ts = (int64_t)t - (W - 1) + j;
      if (ts >= 0) p += kc_ld(w, wdt, (int64_t)ch * W + j) * kc_ld(x, xdt, (int64_t)e + (ts - (int64_t)t) * C);
    }
    kc_st(y, ydt, e, silu ? p * cv_sigm(p) : p);
  }
}

/* One block per (batch row, 64-token tile, 32-channel tile); 256 threads = 32 channels x 8
 * row groups. part[(b*ntt + tile) * C * W + c * W + j] = sum over the tile's tokens of
 * dpre[t,c] x[t-W+1+j,c]. */
__global__ void k_conv_bwd(const void *x, int xdt, const void *w, int wdt, const void *dy,
                           int dydt, void *out, int odt, float *part, int64_t B, int64_t T,
                           int64_t C, int W, int silu) {
  __shared__ float xs[CV_TT + 2 * (CV_WMAX - 1)][CV_TC];
  __shared__ float dps[CV_TT + CV_WMAX - 1][CV_TC];
  __shared__ float red[8][CV_TC * CV_WMAX];
  int64_t ntt = (T + CV_TT - 1) / CV_TT, b = blockIdx.x / ntt, t0 = (blockIdx.x % ntt) * CV_TT;
  int64_t c0 = (int64_t)blockIdx.y * CV_TC;
  int lc = threadIdx.x % CV_TC, grp = threadIdx.x / CV_TC;
  int64_t ch = c0 + lc;
  bool live = ch < C;
  float wr[CV_WMAX];
#pragma unroll
  for (int j = 0; j < CV_WMAX; j++) wr[j] = live && j < W ? kc_ld(w, wdt, ch * W + j) : 0.f;
  int nx = CV_TT + 2 * (W - 1), nd = CV_TT + W - 1;
  for (int r = grp; r < nx; r += 8) {              /* x rows t0-W+1 .. t0+TT+W-2 */
    int64_t ts = t0 - (W - 1) + r;
    xs[r][lc] = live && ts >= 0 && ts < T ? kc_ld(x, xdt, (b * T + ts) * C + ch) : 0.f;
  }
  __syncthreads();
  for (int r = grp; r < nd; r += 8) {              /* dpre rows t0 .. t0+TT+W-2 */
    int64_t ts = t0 + r;
    float dp = 0.f;
    if (live && ts < T) {
      dp = kc_ld(dy, dydt, (b * T + ts) * C + ch);
      if (silu) {                                  /* d silu(p)/dp = s (1 + p (1 - s)) */
        float p = 0.f;
#pragma unroll
        for (int j = 0; j < CV_WMAX; j++)
          if (j < W) p += wr[j] * xs[r + j][lc];     /* xs[r + j] is x[ts-W+1+j] */
        float s = cv_sigm(p);
        dp *= s * (1.f + p * (1.f - s));
      }
    }
    dps[r][lc] = dp;
  }
  __syncthreads();
  float acc[CV_WMAX];
#pragma unroll
  for (int j = 0; j < CV_WMAX; j++) acc[j] = 0.f;
  for (int r = grp; r < CV_TT; r += 8) {
    int64_t t = t0 + r;
    if (!live || t >= T) continue;
    float dx = 0.f;
#pragma unroll
    for (int j = 0; j < CV_WMAX; j++)
      if (j < W) dx += wr[j] * dps[r + W - 1 - j][lc];   /* y[t+W-1-j] reads x[t] at tap j */
    kc_st(out, odt, (b * T + t) * C + ch, dx);
#pragma unroll
    for (int j = 0; j < CV_WMAX; j++)
      if (j < W) acc[j] += dps[r][lc] * xs[r + j][lc];                  /* x[t-W+1+j] */
  }
#pragma unroll
  for (int j = 0; j < CV_WMAX; j++) red[grp][lc * CV_WMAX + j] = acc[j];
  __syncthreads();
  for (int e = threadIdx.x; e < CV_TC * W; e += blockDim.x) {   /* fixed order over groups */
    int cc = e / W, j = e % W;
    if (c0 + cc >= C) continue;
    float s = 0.f;
    for (int g = 0; g < 8; g++) s += red[g][cc * CV_WMAX + j];
    part[(int64_t)blockIdx.x * C * W + (c0 + cc) * W + j] = s;
  }
}

/* dw[i] = sum over tiles of part[tile][i]: a warp per i, lane l summing tiles l, l+32, ... in
 * order, then a fixed shuffle tree (deterministic). It was a thread per i summing all tiles in
 * a chain of dependent loads: C*W threads (a few SMs) and ~100 us per node at B*T = 32768. */
__global__ void k_conv_dw(const float *part, int64_t ntiles, int64_t CW, void *out, int odt,
                          int64_t off) {
  int lane = threadIdx.x & 31;
  int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  if (i >= CW) return;                             /* the whole warp: i is per warp */
  float s = 0.f;
  for (int64_t t = lane; t < ntiles; t += 32) s += part[t * CW + i];
  s = kc_warp_sum(s);
  if (!lane) kc_st(out, odt, off + i, s);
}

/* The common shape (the layer's W = 4, an even channel count): a thread
 * owns two adjacent channels (one 4- or 8-byte load a row, a warp's loads one contiguous
 * segment) over a run of CV_RUN tokens of one sequence, so each input row is loaded once, not
 * W times as in k_conv_fwd, and all of a thread's loads are in flight together. */
#define CV_RUN 16    /* tokens per thread */
#define CV_RB 8      /* runs per backward block (one warp each): 128 tokens x 64 channels */

template <typename T> struct cv2;
template <> struct cv2<float> {
  static __device__ __forceinline__ float2 ld(const float *p) { return *(const float2 *)p; }
  static __device__ __forceinline__ void st(float *p, float a, float b) { *(float2 *)p = make_float2(a, b); }
};
template <> struct cv2<__nv_bfloat16> {
  static __device__ __forceinline__ float2 ld(const __nv_bfloat16 *p) {
    return __bfloat1622float2(*(const __nv_bfloat162 *)p);
  }
  static __device__ __forceinline__ void st(__nv_bfloat16 *p, float a, float b) {
    *(__nv_bfloat162 *)p = __floats2bfloat162_rn(a, b);
  }
};

/* d silu(p)/dp = s (1 + p (1 - s)) */
static __device__ __forceinline__ float cv_dsilu(float p) {
  float s = cv_sigm(p);
  return s * (1.f + p * (1.f - s));
}

template <typename TX, typename TY, int W>
__global__ void __launch_bounds__(256, 4) k_conv_fwd_run(const TX *x, const void *w, int wdt, TY *y,
                                                      int B, int T, int C2, int silu) {
  int nr = (T + CV_RUN - 1) / CV_RUN;
  int64_t gid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (gid >= (int64_t)B * nr * C2) return;
  int cp = (int)(gid % C2), run = (int)(gid / C2), b = run / nr, t0 = (run % nr) * CV_RUN;
  int64_t C = 2 * (int64_t)C2, base = (int64_t)b * T * C + 2 * cp;
  float w0[W], w1[W];
#pragma unroll
  for (int j = 0; j < W; j++) w0[j] = kc_ld(w, wdt, 2 * cp * W + j), w1[j] = kc_ld(w, wdt, (2 * cp + 1) * W + j);
  float2 xs[CV_RUN + W - 1];                       /* x rows t0-W+1 .. t0+RUN-1 */
#pragma unroll
  for (int i = 0; i < CV_RUN + W - 1; i++) {
    int t = t0 - (W - 1) + i;
    xs[i] = t >= 0 && t < T ? cv2<TX>::ld(x + base + t * C) : make_float2(0.f, 0.f);
  }
#pragma unroll
  for (int i = 0; i < CV_RUN; i++) {
    if (t0 + i >= T) break;
    float p0 = 0.f, p1 = 0.f;
#pragma unroll
    for (int j = 0; j < W; j++) p0 += w0[j] * xs[i + j].x, p1 += w1[j] * xs[i + j].y;
    if (silu) p0 *= cv_sigm(p0), p1 *= cv_sigm(p1);
    cv2<TY>::st(y + base + (t0 + i) * C, p0, p1);
  }
}

/* One block per (sequence, 128-token tile, 64-channel tile); warp r takes the tile's run r, lane
 * l channels 2l, 2l+1. Each thread: dpre for its run and the W-1 rows after it (the pre-
 * activation recomputed from x), dx = sum_j w[j] dpre[t+W-1-j], and its run's dw terms;
 * part[(b*ntt + tile) * C * W + c * W + j] = the tile's dw, its runs summed in order. */
template <typename TX, typename TD, typename TY, int W>
__global__ void __launch_bounds__(256, 2) k_conv_bwd_run(const TX *x, const void *w, int wdt, const TD *dy,
                                                      TY *out, float *part, int T, int C2, int silu) {
  __shared__ float red[CV_RB][32][2 * W];
  int ntt = (T + CV_RUN * CV_RB - 1) / (CV_RUN * CV_RB), b = blockIdx.x / ntt;
  int lane = threadIdx.x & 31, r = threadIdx.x >> 5, cp = blockIdx.y * 32 + lane;
  int t0 = (blockIdx.x % ntt) * CV_RUN * CV_RB + r * CV_RUN;
  int64_t C = 2 * (int64_t)C2, base = (int64_t)b * T * C + 2 * cp;
  bool live = cp < C2;
  float w0[W], w1[W], a0[W], a1[W];
#pragma unroll
  for (int j = 0; j < W; j++) {
    w0[j] = live ? kc_ld(w, wdt, 2 * cp * W + j) : 0.f, w1[j] = live ? kc_ld(w, wdt, (2 * cp + 1) * W + j) : 0.f;
    a0[j] = a1[j] = 0.f;
  }
  constexpr int NX = CV_RUN + 2 * (W - 1), ND = CV_RUN + W - 1;
  float2 xs[NX], dp[ND];                           /* x rows t0-W+1 .., dpre rows t0 .. */
#pragma unroll
  for (int i = 0; i < NX; i++) {
    int t = t0 - (W - 1) + i;
    xs[i] = live && t >= 0 && t < T ? cv2<TX>::ld(x + base + t * C) : make_float2(0.f, 0.f);
  }
#pragma unroll
  for (int i = 0; i < ND; i++) {
    int t = t0 + i;
    dp[i] = live && t < T ? cv2<TD>::ld(dy + base + t * C) : make_float2(0.f, 0.f);
  }
  if (silu) {
#pragma unroll
    for (int i = 0; i < ND; i++) {
      float p0 = 0.f, p1 = 0.f;
#pragma unroll
      for (int j = 0; j < W; j++) p0 += w0[j] * xs[i + j].x, p1 += w1[j] * xs[i + j].y;
      dp[i].x *= cv_dsilu(p0), dp[i].y *= cv_dsilu(p1);
    }
  }
#pragma unroll
  for (int i = 0; i < CV_RUN; i++) {
    if (!live || t0 + i >= T) break;
    float d0 = 0.f, d1 = 0.f;
#pragma unroll
    for (int j = 0; j < W; j++) d0 += w0[j] * dp[i + W - 1 - j].x, d1 += w1[j] * dp[i + W - 1 - j].y;
    cv2<TY>::st(out + base + (t0 + i) * C, d0, d1);
#pragma unroll
    for (int j = 0; j < W; j++) a0[j] += dp[i].x * xs[i + j].x, a1[j] += dp[i].y * xs[i + j].y;
  }
#pragma unroll
  for (int j = 0; j < W; j++) red[r][lane][j] = a0[j], red[r][lane][W + j] = a1[j];
  __syncthreads();
  for (int e = threadIdx.x; e < 64 * W; e += blockDim.x) {   /* e = local channel * W + tap */
    int lc = e / W, j = e % W, c = blockIdx.y * 64 + lc;
    if (c >= C) continue;
    float s = 0.f;
#pragma unroll
    for (int g = 0; g < CV_RB; g++) s += red[g][lc >> 1][(lc & 1) * W + j];
    part[(int64_t)blockIdx.x * C * W + (int64_t)c * W + j] = s;
  }
}

static int64_t ko_conv_tiles(const kda_exec_node *n) {
  return n->in[0].shape[0] * ((n->in[0].shape[1] + CV_TT - 1) / CV_TT);
}

/* The run kernels where they apply (W = 4, C even, bf16 / f32 views 8-byte aligned); 1 when they
 * ran. Each view's type is a template argument: dy is the f32 slice of KDA_BWD's packed gradient
 * where x is a bf16 activation. */
template <typename F> static void ko_with_type(int dt, F f) {
  if (dt == KDA_BF16) f(__nv_bfloat16());
  else f(float());
}

static int ko_conv_run(const kda_exec_node *n, kc_ctx *c, int64_t B, int64_t T, int64_t C, int W, int silu) {
  const kda_tview *x = &n->in[0], *w = &n->in[1], *dy = &n->in[2];
  int bwd = n->op == KDA_OP_CONV1D_BWD, C2 = (int)(C / 2);
  if (W != 4 || C % 2 || B * T * C >= INT32_MAX / 2) return 0;
  const kda_tview *v[3] = {x, &n->out, dy};
  for (int i = 0; i < 2 + bwd; i++)
    if ((uintptr_t)v[i]->data % 8 || (v[i]->dtype != KDA_F32 && v[i]->dtype != KDA_BF16)) return 0;
  int64_t ntiles = B * ((T + CV_RUN * CV_RB - 1) / (CV_RUN * CV_RB));
  if (bwd && (!c->scratch || KC_ALIGN(ntiles * C * W * 4) > c->scratch_bytes)) return 0;
  float *part = (float *)c->scratch;
  ko_with_type(x->dtype, [&](auto tx) {
    using TX = decltype(tx);
    ko_with_type(n->out.dtype, [&](auto ty) {
      using TY = decltype(ty);
      if (!bwd) {
        int64_t thr = B * ((T + CV_RUN - 1) / CV_RUN) * C2;
        k_conv_fwd_run<TX, TY, 4><<<(unsigned)((thr + 255) / 256), 256, 0, c->stream>>>(
            (const TX *)x->data, w->data, w->dtype, (TY *)n->out.data, (int)B, (int)T, C2, silu);
        return;
      }
      ko_with_type(dy->dtype, [&](auto td) {
        using TD = decltype(td);
        dim3 grid((unsigned)ntiles, (unsigned)((C2 + 31) / 32));
        k_conv_bwd_run<TX, TD, TY, 4><<<grid, 256, 0, c->stream>>>((const TX *)x->data, w->data, w->dtype,
                                                                   (const TD *)dy->data, (TY *)n->out.data,
                                                                   part, (int)T, C2, silu);
      });
    });
  });
  if (bwd)
    k_conv_dw<<<(unsigned)((C * W * 32 + 255) / 256), 256, 0, c->stream>>>(part, ntiles, C * W, n->out.data,
                                                                           n->out.dtype, B * T * C);
  return 1;
}

static int ko_conv(const kda_exec_node *n, kc_ctx *c) {
  const kda_tview *x = &n->in[0], *w = &n->in[1];
  int64_t B = x->shape[0], T = x->shape[1], C = x->shape[2];
  int W = (int)w->shape[1], silu = n->iattr[0] != 0;
  if (W < 1 || W > CV_WMAX) return KO_ERR(n, "conv1d width W must be 1..8 on CUDA");
  if (ko_conv_run(n, c, B, T, C, W, silu)) {
    KO_LAUNCH(n, "k_conv_fwd_run / k_conv_bwd_run");
    return 0;
  }
  if (n->op == KDA_OP_CONV1D) {
    int64_t tot = B * T * C;
    unsigned nb = kc_blocks(tot, 256, (int64_t)c->num_sms * 16);
    if (tot + (int64_t)nb * 256 < INT32_MAX)
      k_conv_fwd<int32_t><<<nb, 256, 0, c->stream>>>(x->data, x->dtype, w->data, w->dtype, n->out.data,
                                                     n->out.dtype, (int32_t)B, (int32_t)T, (int32_t)C, W, silu);
    else
      k_conv_fwd<int64_t><<<nb, 256, 0, c->stream>>>(x->data, x->dtype, w->data, w->dtype, n->out.data,
                                                     n->out.dtype, B, T, C, W, silu);
    KO_LAUNCH(n, "k_conv_fwd");
    return 0;
  }
  int64_t ntiles = ko_conv_tiles(n), need = KC_ALIGN(ntiles * C * W * 4);
  if (need > c->scratch_bytes || !c->scratch)
    return kda_set_error("cuda: op %s node %d needs %lld bytes of scratch, has %lld",
                         kda_op_name(n->op), n->id, (long long)need, (long long)c->scratch_bytes);
  float *part = (float *)c->scratch;
  dim3 grid((unsigned)ntiles, (unsigned)((C + CV_TC - 1) / CV_TC));
  k_conv_bwd<<<grid, 256, 0, c->stream>>>(x->data, x->dtype, w->data, w->dtype, n->in[2].data,
                                          n->in[2].dtype, n->out.data, n->out.dtype, part, B, T,
                                          C, W, silu);
  KO_LAUNCH(n, "k_conv_bwd");
  k_conv_dw<<<(unsigned)((C * W * 32 + 255) / 256), 256, 0, c->stream>>>(part, ntiles, C * W, n->out.data,
                                                                         n->out.dtype, B * T * C);
  KO_LAUNCH(n, "k_conv_dw");
  return 0;
}

/* ---- entry points ------------------------------------------------------------------------- */
int64_t kc_kda_scratch(const kda_exec_node *n) {
  switch (n->op) {
  case KDA_OP_KDA: case KDA_OP_KDA_BWD: case KDA_OP_KDA_DECODE: {
    ko_kda_ws w;
    ko_kda_layout(n, NULL, &w);
    return w.total;
  }
  case KDA_OP_CONV1D_BWD: return KC_ALIGN(ko_conv_tiles(n) * n->in[0].shape[2] * n->in[1].shape[1] * 4);
  default: return 0;
  }
}

int kc_kda_node(const kda_exec_node *n, kc_ctx *c) {
  switch (n->op) {
  case KDA_OP_KDA: case KDA_OP_KDA_BWD: case KDA_OP_KDA_DECODE: return ko_kda(n, c);
  case KDA_OP_CONV1D: case KDA_OP_CONV1D_BWD: return ko_conv(n, c);
  default: return KO_ERR(n, "kc_kda_node: not a KDA op");
  }
}
