/* elementwise.cu — pointwise ops, softmax, RoPE, fill, transpose, embedding gather/scatter.
 * CPU twin: core/cpu_ops.c. Every kernel loads through kc_ld (f32 or bf16, per view) and
 * computes in fp32; grid-stride loops with a capped grid.                                  */
#include "kernels.h"

#define TPB 256
#define GRID_CAP (1 << 16)

/* ---- ADD / MUL, b either a's shape or a [D] vector broadcast over rows ------------------ */
__global__ void k_binary(const void *a, int adt, const void *b, int bdt, void *o, int odt,
                         int64_t n, int64_t nb, int mul) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x = kc_ld(a, adt, i), y = kc_ld(b, bdt, nb == n ? i : i % nb);
    kc_st(o, odt, i, mul ? x * y : x + y);
  }
}

int kc_binary(const kda_exec_node *n, kc_ctx *c) {
  int64_t total = kc_numel(&n->out), nb = kc_numel(&n->in[1]);
  k_binary<<<kc_blocks(total, TPB, GRID_CAP), TPB, 0, c->stream>>>(
      n->in[0].data, n->in[0].dtype, n->in[1].data, n->in[1].dtype, n->out.data, n->out.dtype,
      total, nb, n->op == KDA_OP_MUL);
  KC_LAUNCH_CHECK(n, "k_binary");
  return 0;
}

/* ---- one-input (plus dy) pointwise ops: the formulas of cpu_unary ----------------------- */
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu_f(float x) {
  const float c = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gelu_g(float x) {
  const float c = 0.7978845608028654f;
  float u = c * (x + 0.044715f * x * x * x), t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
}

__global__ void k_unary(int op, const void *x, int xdt, const void *y, int ydt, void *o, int odt,
                        int64_t n, float s) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = kc_ld(x, xdt, i), r = 0.f, sg;
    float d = y ? kc_ld(y, ydt, i) : 0.f;
    switch (op) {
    case KDA_OP_SCALE: r = v * s; break;
    case KDA_OP_SILU: r = v * sigm(v); break;
    case KDA_OP_SILU_BWD: sg = sigm(v); r = d * sg * (1.0f + v * (1.0f - sg)); break;
    case KDA_OP_GELU: r = gelu_f(v); break;
    case KDA_OP_GELU_BWD: r = d * gelu_g(v); break;
    case KDA_OP_SIGMOID: r = sigm(v); break;
    case KDA_OP_SIGMOID_BWD: r = d * v * (1.0f - v); break;   /* x holds y = sigmoid */
    case KDA_OP_SWIGLU: r = v * sigm(v) * d; break;          /* y holds b */
    }
    kc_st(o, odt, i, r);
  }
}

static int launch_unary(const kda_exec_node *n, kc_ctx *c) {
  int64_t total = kc_numel(&n->out);
  const void *y = n->nin > 1 ? n->in[1].data : NULL;
  int ydt = n->nin > 1 ? n->in[1].dtype : KDA_F32;
  k_unary<<<kc_blocks(total, TPB, GRID_CAP), TPB, 0, c->stream>>>(
      n->op, n->in[0].data, n->in[0].dtype, y, ydt, n->out.data, n->out.dtype, total,
      n->fattr[0]);
  KC_LAUNCH_CHECK(n, "k_unary");
  return 0;
}
int kc_unary(const kda_exec_node *n, kc_ctx *c) { return launch_unary(n, c); }

/* ---- SwiGLU, all bf16 (the MLP's activations): 8 elements per thread in 16-byte loads ----
 * The generic kernels move 2 bytes per load through kc_ld's dtype switch: GPT M's SWIGLU
 * ([65536,2048] x 2 -> 1) took 438 us and its backward 476 us, ~2x and ~1.3x their bandwidth
 * bounds (230 and 380 us). With 16-byte loads, measured on the H200 (GPT M profile, 427f666):
 * 206 and 313 us (12 nodes each: 5.26 -> 2.47 ms and 5.71 -> 3.76 ms a step). Same formulas,
 * so the same bits. */
typedef struct { __nv_bfloat162 h[4]; } bf16x8;
__device__ __forceinline__ bf16x8 ld8(const __nv_bfloat16 *p, int64_t i) { return *(const bf16x8 *)(p + i); }

__global__ void k_swiglu_v8(const __nv_bfloat16 *a, const __nv_bfloat16 *b, __nv_bfloat16 *o, int64_t n8) {
  for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < n8; v += (int64_t)gridDim.x * blockDim.x) {
    bf16x8 x = ld8(a, 8 * v), y = ld8(b, 8 * v), r;
    for (int k = 0; k < 4; k++) {
      float2 xv = __bfloat1622float2(x.h[k]), yv = __bfloat1622float2(y.h[k]);
      r.h[k] = __floats2bfloat162_rn(xv.x * sigm(xv.x) * yv.x, xv.y * sigm(xv.y) * yv.y);
    }
    *(bf16x8 *)(o + 8 * v) = r;
  }
}

__global__ void k_swiglu_bwd_v8(const __nv_bfloat16 *a, const __nv_bfloat16 *b, const __nv_bfloat16 *dy,
                                __nv_bfloat16 *o, int64_t n8, int64_t n) {
  for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < n8; v += (int64_t)gridDim.x * blockDim.x) {
    bf16x8 x = ld8(a, 8 * v), y = ld8(b, 8 * v), g = ld8(dy, 8 * v), da, db;
    for (int k = 0; k < 4; k++) {
      float2 av = __bfloat1622float2(x.h[k]), bv = __bfloat1622float2(y.h[k]), gv = __bfloat1622float2(g.h[k]);
      float s0 = sigm(av.x), s1 = sigm(av.y);
      da.h[k] = __floats2bfloat162_rn(gv.x * bv.x * s0 * (1.0f + av.x * (1.0f - s0)),
                                      gv.y * bv.y * s1 * (1.0f + av.y * (1.0f - s1)));
      db.h[k] = __floats2bfloat162_rn(gv.x * av.x * s0, gv.y * av.y * s1);
    }
    *(bf16x8 *)(o + 8 * v) = da;
    *(bf16x8 *)(o + n + 8 * v) = db;
  }
}

/* All views bf16, 16-byte aligned, a multiple of 8 elements: the v8 kernels apply. */
static int bf16_v8(const kda_exec_node *n, int64_t total) {
  if (total % 8 || n->out.dtype != KDA_BF16 || ((uintptr_t)n->out.data & 15)) return 0;
  for (int i = 0; i < n->nin; i++)
    if (n->in[i].dtype != KDA_BF16 || ((uintptr_t)n->in[i].data & 15)) return 0;
  return 1;
}

int kc_swiglu(const kda_exec_node *n, kc_ctx *c) {
  int64_t total = kc_numel(&n->out);
  if (!bf16_v8(n, total)) return launch_unary(n, c);
  k_swiglu_v8<<<kc_blocks(total / 8, TPB, GRID_CAP), TPB, 0, c->stream>>>(
      (const __nv_bfloat16 *)n->in[0].data, (const __nv_bfloat16 *)n->in[1].data,
      (__nv_bfloat16 *)n->out.data, total / 8);
  KC_LAUNCH_CHECK(n, "k_swiglu_v8");
  return 0;
}

/* da = dy b silu'(a), db = dy silu(a); packed [2,...] in out's dtype. */
__global__ void k_swiglu_bwd(const void *a, int adt, const void *b, int bdt, const void *dy,
                             int ddt, void *o, int odt, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float av = kc_ld(a, adt, i), bv = kc_ld(b, bdt, i), g = kc_ld(dy, ddt, i);
    float sg = sigm(av);
    kc_st(o, odt, i, g * bv * sg * (1.0f + av * (1.0f - sg)));
    kc_st(o, odt, n + i, g * av * sg);
  }
}

int kc_swiglu_bwd(const kda_exec_node *n, kc_ctx *c) {
  int64_t total = kc_numel(&n->in[0]);
  if (bf16_v8(n, total)) {
    k_swiglu_bwd_v8<<<kc_blocks(total / 8, TPB, GRID_CAP), TPB, 0, c->stream>>>(
        (const __nv_bfloat16 *)n->in[0].data, (const __nv_bfloat16 *)n->in[1].data,
        (const __nv_bfloat16 *)n->in[2].data, (__nv_bfloat16 *)n->out.data, total / 8, total);
    KC_LAUNCH_CHECK(n, "k_swiglu_bwd_v8");
    return 0;
  }
  k_swiglu_bwd<<<kc_blocks(total, TPB, GRID_CAP), TPB, 0, c->stream>>>(
      n->in[0].data, n->in[0].dtype, n->in[1].data, n->in[1].dtype, n->in[2].data,
      n->in[2].dtype, n->out.data, n->out.dtype, total);
  KC_LAUNCH_CHECK(n, "k_swiglu_bwd");
  return 0;
}

/* ---- softmax over the last dim: one block per row --------------------------------------- */
__global__ void k_softmax(const void *x, int xdt, void *y, int ydt, int64_t d) {
  __shared__ float sh[32];
  int64_t base = (int64_t)blockIdx.x * d;
  float mx, s;
  kc_row_softmax_stats(x, xdt, base, d, sh, &mx, &s);
  float inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    kc_st(y, ydt, base + j, expf(kc_ld(x, xdt, base + j) - mx) * inv);
}

/* dx = y (dy - sum(dy y)) */
__global__ void k_softmax_bwd(const void *y, int ydt, const void *dy, int ddt, void *dx, int odt,
                              int64_t d) {
  __shared__ float sh[32];
  int64_t base = (int64_t)blockIdx.x * d;
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    dot += kc_ld(y, ydt, base + j) * kc_ld(dy, ddt, base + j);
  dot = kc_block_sum(dot, sh);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    kc_st(dx, odt, base + j, kc_ld(y, ydt, base + j) * (kc_ld(dy, ddt, base + j) - dot));
}

static int row_threads(int64_t d) { return d >= 1024 ? 512 : d >= 256 ? 256 : d > 64 ? 128 : 64; }

int kc_softmax(const kda_exec_node *n, kc_ctx *c) {
  int64_t d = kc_lastdim(&n->in[0]), rows = kc_numel(&n->in[0]) / d;
  if (rows > 0x7fffffff) return kda_set_error("cuda: softmax: %lld rows is too many", (long long)rows);
  k_softmax<<<(unsigned)rows, row_threads(d), 0, c->stream>>>(n->in[0].data, n->in[0].dtype,
                                                              n->out.data, n->out.dtype, d);
  KC_LAUNCH_CHECK(n, "k_softmax");
  return 0;
}

int kc_softmax_bwd(const kda_exec_node *n, kc_ctx *c) {
  int64_t d = kc_lastdim(&n->in[0]), rows = kc_numel(&n->in[0]) / d;
  k_softmax_bwd<<<(unsigned)rows, row_threads(d), 0, c->stream>>>(
      n->in[0].data, n->in[0].dtype, n->in[1].data, n->in[1].dtype, n->out.data, n->out.dtype, d);
  KC_LAUNCH_CHECK(n, "k_softmax_bwd");
  return 0;
}

/* ---- RoPE: pairs (i, i+Dh/2), angle (pos + t) * theta^(-2i/Dh) --------------------------
 * One block per (b,t) row; thread i owns pair i of every head, so the angle (computed in
 * double, as the CPU does: t reaches thousands of radians, where a float angle is off by 1e-4)
 * is computed once per (t,i) and the loads stay coalesced across i. pos (decoding: an int32
 * the host wrote before the launch, read here so a captured decode step replays at each new
 * position) is 0 when absent; a negative one, which the CPU refuses, gives NaN (reporting it
 * would need a host sync). Tried in 427f666: one block per t over every
 * (b, h) row, the angle once per (t, i): 124 -> 152 us per node at GPT M (fewer loads in
 * flight), so this layout stays; a cos/sin table with wide loads is the next try. */
__global__ void k_rope(const void *x, int xdt, void *y, int ydt, const int32_t *pos, int64_t T,
                       int64_t H, int64_t D, double theta, float sign) {
  int64_t row = blockIdx.x, p0 = pos ? *pos : 0, half = D / 2;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    double ang = (double)(p0 + row % T) * pow(theta, -2.0 * (double)i / (double)D);
    double sd, cd;
    sincos(ang, &sd, &cd);
    float cs = p0 < 0 ? NAN : (float)cd, sn = sign * (float)sd;
    for (int64_t h = 0; h < H; h++) {
      int64_t base = (row * H + h) * D;
      float x0 = kc_ld(x, xdt, base + i), x1 = kc_ld(x, xdt, base + i + half);
      kc_st(y, ydt, base + i, x0 * cs - x1 * sn);
      kc_st(y, ydt, base + i + half, x0 * sn + x1 * cs);
    }
  }
}

int kc_rope(const kda_exec_node *n, kc_ctx *c) {
  const kda_tview *x = &n->in[0];
  if (n->nin > 1 && n->in[1].dtype != KDA_I32) return kda_set_error("cuda: rope node %d: pos must be int32", n->id);
  const int32_t *pos = n->nin > 1 ? (const int32_t *)n->in[1].data : NULL;
  int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], D = x->shape[3];
  double theta = n->fattr[0] > 0 ? n->fattr[0] : 10000.0;
  int thr = D / 2 >= 64 ? 64 : 32;
  k_rope<<<(unsigned)(B * T), thr, 0, c->stream>>>(x->data, x->dtype, n->out.data, n->out.dtype,
                                                   pos, T, H, D, theta, n->iattr[0] ? -1.f : 1.f);
  KC_LAUNCH_CHECK(n, "k_rope");
  return 0;
}

/* ---- FILL: fattr0 * (in0[0] or 1) everywhere --------------------------------------------- */
__global__ void k_fill(const void *s, int sdt, void *o, int odt, int64_t n, float f) {
  float v = f * (s ? kc_ld(s, sdt, 0) : 1.0f);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    kc_st(o, odt, i, v);
}

int kc_fill(const kda_exec_node *n, kc_ctx *c) {
  int64_t total = kc_numel(&n->out);
  k_fill<<<kc_blocks(total, TPB, GRID_CAP), TPB, 0, c->stream>>>(
      n->nin ? n->in[0].data : NULL, n->nin ? n->in[0].dtype : KDA_F32, n->out.data,
      n->out.dtype, total, n->fattr[0]);
  KC_LAUNCH_CHECK(n, "k_fill");
  return 0;
}

/* ---- TRANSPOSE of dims d0, d1 (shape padded to 4 dims): indexed by the output ----------- */
struct tr_args {
  int64_t os[4];   /* output shape */
  int64_t ist[4];  /* input stride for each OUTPUT dim (the swap is folded in) */
};

__global__ void k_transpose(const void *x, int xdt, void *o, int odt, int64_t n, tr_args a) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i, src = 0;
    for (int d = 3; d >= 0; d--) {
      int64_t c = r % a.os[d];
      r /= a.os[d];
      src += c * a.ist[d];
    }
    kc_st(o, odt, i, kc_ld(x, xdt, src));
  }
}

int kc_transpose(const kda_exec_node *n, kc_ctx *c) {
  const kda_tview *x = &n->in[0];
  int64_t s[4] = {1, 1, 1, 1}, st[4];
  int pad = 4 - x->ndim;
  for (int i = 0; i < x->ndim; i++) s[pad + i] = x->shape[i];
  int d0 = pad + (int)n->iattr[0], d1 = pad + (int)n->iattr[1];
  st[3] = 1;
  for (int i = 2; i >= 0; i--) st[i] = st[i + 1] * s[i + 1];
  tr_args a;
  for (int i = 0; i < 4; i++) { a.os[i] = s[i]; a.ist[i] = st[i]; }
  a.os[d0] = s[d1]; a.os[d1] = s[d0];
  a.ist[d0] = st[d1]; a.ist[d1] = st[d0];
  int64_t total = kc_numel(x);
  k_transpose<<<kc_blocks(total, TPB, GRID_CAP), TPB, 0, c->stream>>>(
      x->data, x->dtype, n->out.data, n->out.dtype, total, a);
  KC_LAUNCH_CHECK(n, "k_transpose");
  return 0;
}

/* ---- EMBED: out[i,:] = table[idx[i],:] (out-of-range ids read row 0, as the CPU does) ---- */
__global__ void k_embed(const void *w, int wdt, const int32_t *idx, void *o, int odt, int64_t cnt,
                        int64_t d, int64_t v) {
  int64_t total = cnt * d;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = e / d, j = e - i * d;
    int32_t t = idx[i];
    if (t < 0 || t >= v) t = 0;
    kc_st(o, odt, e, kc_ld(w, wdt, (int64_t)t * d + j));
  }
}

int kc_embed(const kda_exec_node *n, kc_ctx *c) {
  int64_t cnt = kc_numel(&n->in[1]), d = n->in[0].shape[1], v = n->in[0].shape[0];
  k_embed<<<kc_blocks(cnt * d, TPB, GRID_CAP), TPB, 0, c->stream>>>(
      n->in[0].data, n->in[0].dtype, (const int32_t *)n->in[1].data, n->out.data, n->out.dtype,
      cnt, d, v);
  KC_LAUNCH_CHECK(n, "k_embed");
  return 0;
}

/* ---- EMBED_BWD: out[v,:] = sum over i with idx[i]==v of dy[i,:] ----------------------------
 * Deterministic without atomics, in two passes. k_embed_bwd_part: a warp takes a range of
 * tokens and 32 columns and adds each token's dy row into its own shared accumulator row
 * acc[idx][lane] in token order (a block's EBR_W warps then summed in order into one partial
 * [V, d] a block row); k_embed_bwd_sum adds the partials in order. Every token is read once.
 * It was a block a vocabulary row scanning all indices and adding its matches' rows in one
 * chain: a byte-level batch puts thousands of tokens on ' ' and 'e', and that block's chain of
 * dependent loads was the whole kernel (656 us a hybrid S 64x512 step, 2026-12-04b).
 * Vocabularies too large for the accumulators (EBR_VMAX) take k_embed_bwd: a block (v, column
 * group) scans all indices, an ordered ballot compaction lists a chunk's matches, and every
 * thread adds those dy rows for its column in index order. */
#define EB_T 256
#define EBR_W 2                  /* warps a block, each with its own token range and accumulator */
#define EBR_VMAX 384             /* acc: EBR_W x V x 32 floats = 96 KB at V = 384 */
#define EBR_WARPS 800            /* ~6 warps an SM on 132 SMs: enough loads in flight */
__global__ void __launch_bounds__(EB_T) k_embed_bwd(const void *dy, int ddt, const int32_t *idx,
                                                    void *o, int odt, int64_t cnt, int64_t d) {
  __shared__ int list[EB_T];
  __shared__ int wcount[EB_T / 32 + 1];
  int v = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int64_t j = (int64_t)blockIdx.y * EB_T + threadIdx.x;
  float acc = 0.f;
  for (int64_t base = 0; base < cnt; base += EB_T) {
    int64_t i = base + threadIdx.x;
    int hit = i < cnt && idx[i] == v;
    unsigned m = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) wcount[w] = __popc(m);
    __syncthreads();
    if (threadIdx.x == 0) {    /* exclusive prefix over the 8 warps */
      int s = 0;
      for (int k = 0; k < EB_T / 32; k++) { int t = wcount[k]; wcount[k] = s; s += t; }
      wcount[EB_T / 32] = s;
    }
    __syncthreads();
    if (hit) list[wcount[w] + __popc(m & ((1u << lane) - 1u))] = (int)threadIdx.x;
    __syncthreads();
    int nh = wcount[EB_T / 32];
    if (j < d)
      for (int k = 0; k < nh; k++) acc += kc_ld(dy, ddt, (base + list[k]) * d + j);
    __syncthreads();           /* list and wcount are rewritten by the next chunk */
  }
  if (j < d) kc_st(o, odt, (int64_t)v * d + j, acc);
}

/* grid (column groups of 32, segments); warp w of block s takes tokens [(s*EBR_W + w) * seg, +seg) */
__global__ void __launch_bounds__(EBR_W * 32) k_embed_bwd_part(const void *dy, int ddt, const int32_t *idx,
                                                               float *part, int64_t cnt, int64_t d, int V,
                                                               int64_t seg) {
  extern __shared__ float acc[];                   /* [EBR_W][V][32] */
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int64_t j = (int64_t)blockIdx.x * 32 + lane;
  float *a = acc + (size_t)w * V * 32;
  for (int e = threadIdx.x; e < EBR_W * V * 32; e += blockDim.x) acc[e] = 0.f;
  __syncthreads();
  int64_t lo = ((int64_t)blockIdx.y * EBR_W + w) * seg, hi = min(cnt, lo + seg);
  bool live = j < d;
  for (int64_t t = lo; t < hi; t += 8) {           /* eight tokens' loads in flight, then their adds in order */
    int id[8];
    float x[8];
#pragma unroll
    for (int u = 0; u < 8; u++) {
      id[u] = t + u < hi ? idx[t + u] : -1;
      x[u] = t + u < hi && live ? kc_ld(dy, ddt, (t + u) * d + j) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < 8; u++)
      if (id[u] >= 0 && id[u] < V) a[id[u] * 32 + lane] += x[u];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < V * 32; e += blockDim.x) {
    int64_t jj = (int64_t)blockIdx.x * 32 + (e & 31);
    if (jj >= d) continue;
    float s = 0.f;
    for (int k = 0; k < EBR_W; k++) s += acc[(size_t)k * V * 32 + e];
    part[((int64_t)blockIdx.y * V + (e >> 5)) * d + jj] = s;
  }
}

__global__ void k_embed_bwd_sum(const float *part, int S, int64_t Vd, void *o, int odt) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < Vd; e += (int64_t)gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int k = 0; k < S; k++) s += part[k * Vd + e];
    kc_st(o, odt, e, s);
  }
}

/* segments (blocks a column group): ~EBR_WARPS warps in all, at least 64 tokens a warp; 0 when
 * the vocabulary is too large for the accumulators */
static int embed_segs(const kda_exec_node *n) {
  int64_t cnt = kc_numel(&n->in[1]), d = kc_lastdim(&n->in[0]), V = n->out.shape[0];
  if (V > EBR_VMAX || cnt < 1) return 0;
  int64_t ncg = (d + 31) / 32, s = (EBR_WARPS / EBR_W + ncg - 1) / ncg, smax = (cnt + 64 * EBR_W - 1) / (64 * EBR_W);
  return (int)(s < 1 ? 1 : s > smax ? smax : s);
}

int64_t kc_embed_scratch(const kda_exec_node *n) {
  int S = embed_segs(n);
  return S ? KC_ALIGN((int64_t)S * n->out.shape[0] * kc_lastdim(&n->in[0]) * 4) : 0;
}

int kc_embed_bwd(const kda_exec_node *n, kc_ctx *c) {
  int64_t cnt = kc_numel(&n->in[1]), d = kc_lastdim(&n->in[0]), v = n->out.shape[0];
  int S = embed_segs(n);
  if (S && c->scratch && kc_embed_scratch(n) <= c->scratch_bytes) {
    int64_t seg = (cnt + (int64_t)S * EBR_W - 1) / ((int64_t)S * EBR_W);
    size_t smem = (size_t)EBR_W * v * 32 * 4;
    if (smem > 48 * 1024) KC_CUDA(n, cudaFuncSetAttribute(k_embed_bwd_part, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)((d + 31) / 32), (unsigned)S);
    k_embed_bwd_part<<<grid, EBR_W * 32, smem, c->stream>>>(n->in[0].data, n->in[0].dtype,
                                                             (const int32_t *)n->in[1].data,
                                                             (float *)c->scratch, cnt, d, (int)v, seg);
    KC_LAUNCH_CHECK(n, "k_embed_bwd_part");
    k_embed_bwd_sum<<<kc_blocks(v * d, TPB, GRID_CAP), TPB, 0, c->stream>>>((const float *)c->scratch, S, v * d,
                                                                           n->out.data, n->out.dtype);
    KC_LAUNCH_CHECK(n, "k_embed_bwd_sum");
    return 0;
  }
  dim3 grid((unsigned)v, (unsigned)((d + EB_T - 1) / EB_T));
  k_embed_bwd<<<grid, EB_T, 0, c->stream>>>(n->in[0].data, n->in[0].dtype,
                                             (const int32_t *)n->in[1].data, n->out.data,
                                             n->out.dtype, cnt, d);
  KC_LAUNCH_CHECK(n, "k_embed_bwd");
  return 0;
}
