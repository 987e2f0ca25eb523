/* loss.cu — cross-entropy (bits) forward/backward and the deterministic full reductions:
 * SUM, MEAN, GRAD_NORM (and the scratch sizes of SUM_ROWS, which lives in norm.cu).
 * CPU twin: cpu_cross_entropy, cpu_reduce, cpu_grad_norm in core/cpu_ops.c.
 *
 * Reductions never use float atomics: pass 1 writes one partial per (tensor, block) into
 * scratch, pass 2 (one block) adds them in a fixed order in double. Block counts depend only
 * on shapes, so the result is the same bits on every run.                                  */
#include <string.h>
#include "kernels.h"

#define LN2F 0.69314718055994530942f

/* ---- cross-entropy: one block per row ----------------------------------------------------
 * loss (when not NULL): the row's loss in bits; grad (when not NULL): dlogits = dl (softmax -
 * onehot) / ln 2 with dl the row's dloss (dl != NULL) or the constant cdl. The plan's fused
 * pair (kda_exec_node.fuse_offset) asks for both in one pass over the logits. */
__global__ void k_xent(const void *z, int zdt, const int32_t *tg, int64_t v, void *loss, int ldt,
                       const void *dl, int dldt, float cdl, void *grad, int gdt) {
  __shared__ float sh[32];
  int64_t row = blockIdx.x, base = row * v;
  float mx, s;
  kc_row_softmax_stats(z, zdt, base, v, sh, &mx, &s);
  int32_t t = tg[row];
  if (t < 0 || t >= v) t = 0;   /* as the CPU: a bad target reads column 0, never out of bounds */
  if (loss && threadIdx.x == 0) kc_st(loss, ldt, row, (logf(s) + mx - kc_ld(z, zdt, base + t)) / LN2F);
  if (!grad) return;
  float g = (dl ? kc_ld(dl, dldt, row) : cdl) / LN2F, inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    float p = expf(kc_ld(z, zdt, base + j) - mx) * inv * g;
    kc_st(grad, gdt, base + j, j == t ? p - g : p);
  }
}

static int xent(const kda_exec_node *n, kc_ctx *c, void *loss, const kda_tview *dl, float cdl,
                const kda_tview *grad) {
  int64_t rows = n->in[0].shape[0], v = n->in[0].shape[1];
  int thr = v >= 1024 ? 512 : v >= 256 ? 256 : 128;
  k_xent<<<(unsigned)rows, thr, 0, c->stream>>>(
      n->in[0].data, n->in[0].dtype, (const int32_t *)n->in[1].data, v, loss, n->out.dtype,
      dl ? dl->data : NULL, dl ? dl->dtype : KDA_F32, cdl, grad ? grad->data : NULL,
      grad ? grad->dtype : KDA_F32);
  KC_LAUNCH_CHECK(n, "k_xent");
  return 0;
}
int kc_cross_entropy(const kda_exec_node *n, kc_ctx *c) { return xent(n, c, n->out.data, NULL, 0, NULL); }
int kc_cross_entropy_bwd(const kda_exec_node *n, kc_ctx *c) { return xent(n, c, NULL, &n->in[2], 0, &n->out); }
/* The loss and, with the constant dloss the plan found, the gradient of `bwd` (its node). */
int kc_cross_entropy_fused(const kda_exec_node *n, const kda_exec_node *bwd, kc_ctx *c) {
  return xent(n, c, n->out.data, NULL, n->fused_dloss, &bwd->out);
}

/* ---- full reductions over a list of tensors ---------------------------------------------- */
#define RD_T 256
#define RD_BLOCKS 256         /* partials per tensor (most are 0 for small tensors) */
#define RD_CHUNK 64           /* tensors per pass-1 launch (kernel parameter space) */

struct rd_list {
  const void *p[RD_CHUNK];
  int64_t n[RD_CHUNK];
  int dt[RD_CHUNK];
};

/* partial[(first + y) * RD_BLOCKS + x] = sum of (x or x^2) over block x's share of tensor y */
__global__ void __launch_bounds__(RD_T) k_reduce_partial(rd_list L, int first, int square,
                                                         float *partial) {
  __shared__ float sh[32];
  int y = blockIdx.y;
  int64_t n = L.n[y];
  const void *p = L.p[y];
  int dt = L.dt[y];
  float acc = 0.f;
  for (int64_t i = blockIdx.x * (int64_t)RD_T + threadIdx.x; i < n; i += (int64_t)RD_BLOCKS * RD_T) {
    float v = kc_ld(p, dt, i);
    acc += square ? v * v : v;
  }
  acc = kc_block_sum(acc, sh);
  if (threadIdx.x == 0) partial[(int64_t)(first + y) * RD_BLOCKS + blockIdx.x] = acc;
}

/* mode 0: sum, 1: sum / denom, 2: sqrt(sum) */
__global__ void k_reduce_final(const float *partial, int64_t np, int mode, double denom, void *o,
                               int odt) {
  __shared__ double sh[1024];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < np; i += blockDim.x) acc += partial[i];
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    double r = sh[0];
    if (mode == 1) r /= denom;
    if (mode == 2) r = sqrt(r);
    kc_st(o, odt, 0, (float)r);
  }
}

static int reduce_list(const kda_exec_node *n, kc_ctx *c, int square, int mode, double denom) {
  float *partial = (float *)c->scratch;
  for (int first = 0; first < n->nin; first += RD_CHUNK) {
    rd_list L;
    memset(&L, 0, sizeof L);
    int cnt = n->nin - first < RD_CHUNK ? n->nin - first : RD_CHUNK;
    for (int i = 0; i < cnt; i++) {
      L.p[i] = n->in[first + i].data;
      L.n[i] = kc_numel(&n->in[first + i]);
      L.dt[i] = n->in[first + i].dtype;
    }
    k_reduce_partial<<<dim3(RD_BLOCKS, (unsigned)cnt), RD_T, 0, c->stream>>>(L, first, square,
                                                                             partial);
    KC_LAUNCH_CHECK(n, "k_reduce_partial");
  }
  k_reduce_final<<<1, 1024, 0, c->stream>>>(partial, (int64_t)n->nin * RD_BLOCKS, mode, denom,
                                            n->out.data, n->out.dtype);
  KC_LAUNCH_CHECK(n, "k_reduce_final");
  return 0;
}

int64_t kc_reduce_scratch(const kda_exec_node *n) {
  if (n->op == KDA_OP_SUM_ROWS) {
    int64_t d = kc_lastdim(&n->in[0]);
    return kc_colsum_scratch(kc_numel(&n->in[0]) / d, d);
  }
  return KC_ALIGN((int64_t)n->nin * RD_BLOCKS * (int64_t)sizeof(float));
}

int kc_sum(const kda_exec_node *n, kc_ctx *c) {
  int mean = n->op == KDA_OP_MEAN;
  return reduce_list(n, c, 0, mean, (double)kc_numel(&n->in[0]));
}

int kc_grad_norm(const kda_exec_node *n, kc_ctx *c) { return reduce_list(n, c, 1, 2, 1.0); }
