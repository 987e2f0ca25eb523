/* decode.cu — the one-token decode ops of the CUDA backend (what `kda sample` runs per byte):
 * ATTN_DECODE (KV cache) and CONV1D_DECODE (conv cache). ROPE at a position is k_rope
 * (elementwise.cu) with its pos input; KDA_DECODE is in kda_ops.cu (glue over kda_cuda.cu's
 * recurrent kernel).
 * CPU twins: cpu_attn_decode (core/cpu_ops.c), kda_convref_step (core/kda_ref.c);
 * same formulas, f32 arithmetic, caches f32, activations f32 or bf16 per view.
 *
 * The position is one int32 in device memory that the kernels read, and every grid depends on
 * shapes only, so a captured decode step replays correctly with whatever position the host
 * wrote before the launch. A position the CPU refuses (negative; at or past the cache end) can
 * not be reported without a host sync: the kernels write NaN to the output and leave the
 * caches alone, so the logits show it. Decode is one token: one block per head, simple loops. */
#include "kernels.h"

/* ---- ATTN_DECODE ------------------------------------------------------------------------------
 * One block per head h. k, v go to row pos of the caches; then, over rows j = 0..pos,
 * p_j = softmax_j(q.k_j s) and o = sum_j p_j v_j. Scores: a warp per key row (lanes over Dh),
 * kept in scratch ph = p + h Tmax. PV: a warp per key row again, each warp accumulating its own
 * row of acc [nwarps][Dh] in shared memory, summed over warps in a fixed order (no atomics: two
 * runs give the same bytes). Shared memory: q (Dh) + acc (nwarps Dh) floats. */
enum { AD_THREADS = 256, AD_WARPS = AD_THREADS / 32 };

__global__ void __launch_bounds__(AD_THREADS)
k_attn_decode(const void *q, int qdt, const void *k, int kdt, const void *v, int vdt, float *kc,
              float *vc, const int32_t *posp, void *o, int odt, float *p, int64_t H, int64_t D,
              int64_t Tmax, float s) {
  extern __shared__ float dsm[];
  __shared__ float sh[32];
  float *qs = dsm, *acc = dsm + D;
  int64_t h = blockIdx.x, pos = *posp;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (pos < 0 || pos >= Tmax) {
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) kc_st(o, odt, h * D + c, NAN);
    return;
  }
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    int64_t i = h * D + c, r = (pos * H + h) * D + c;
    qs[c] = kc_ld(q, qdt, i);
    kc[r] = kc_ld(k, kdt, i);
    vc[r] = kc_ld(v, vdt, i);
  }
  for (int64_t c = threadIdx.x; c < AD_WARPS * D; c += blockDim.x) acc[c] = 0.f;
  __syncthreads();   /* the block's own cache row and q are visible to every thread */
  float *ph = p + h * Tmax, mx = -INFINITY;
  for (int64_t j = warp; j <= pos; j += AD_WARPS) {
    const float *kj = kc + (j * H + h) * D;
    float dot = 0.f;
    for (int64_t c = lane; c < D; c += 32) dot += qs[c] * kj[c];
    dot = kc_warp_sum(dot) * s;
    if (lane == 0) ph[j] = dot;
    mx = fmaxf(mx, dot);
  }
  mx = kc_block_max(mx, sh);   /* its __syncthreads also publish ph */
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j <= pos; j += blockDim.x) {
    float e = expf(ph[j] - mx);
    ph[j] = e;
    sum += e;
  }
  sum = kc_block_sum(sum, sh);
  float *aw = acc + warp * D;
  for (int64_t j = warp; j <= pos; j += AD_WARPS) {
    float pj = ph[j];
    const float *vj = vc + (j * H + h) * D;
    for (int64_t c = lane; c < D; c += 32) aw[c] += pj * vj[c];
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    float t = 0.f;
    for (int w = 0; w < AD_WARPS; w++) t += acc[w * D + c];
    kc_st(o, odt, h * D + c, t / sum);
  }
}

static size_t ad_smem(int64_t D) { return (size_t)(1 + AD_WARPS) * (size_t)D * sizeof(float); }

int kc_attn_decode(const kda_exec_node *n, kc_ctx *c) {
  const kda_tview *q = &n->in[0], *kc = &n->in[3], *vc = &n->in[4];
  int64_t H = q->shape[2], D = q->shape[3], Tmax = kc->shape[0];
  if (kc->dtype != KDA_F32 || vc->dtype != KDA_F32 || n->in[5].dtype != KDA_I32)
    return kda_set_error("cuda: attn_decode node %d: caches must be f32 and pos int32", n->id);
  if (ad_smem(D) > 48 * 1024)
    return kda_set_error("cuda: attn_decode node %d: head dim %lld needs %zu bytes of shared memory "
                         "(48 KiB at most): use head_dim <= 1365", n->id, (long long)D, ad_smem(D));
  if (c->scratch_bytes < kc_decode_scratch(n))
    return kda_set_error("cuda: attn_decode node %d: scratch too small", n->id);
  float s = n->fattr[0] != 0 ? n->fattr[0] : 1.0f / sqrtf((float)D);
  k_attn_decode<<<(unsigned)H, AD_THREADS, ad_smem(D), c->stream>>>(
      q->data, q->dtype, n->in[1].data, n->in[1].dtype, n->in[2].data, n->in[2].dtype,
      (float *)kc->data, (float *)vc->data, (const int32_t *)n->in[5].data, n->out.data,
      n->out.dtype, (float *)c->scratch, H, D, Tmax, s);
  KC_LAUNCH_CHECK(n, "k_attn_decode");
  return 0;
}

/* Scores of every head: [H, Tmax] f32. */
int64_t kc_decode_scratch(const kda_exec_node *n) {
  if (n->op != KDA_OP_ATTN_DECODE) return 0;
  return KC_ALIGN(n->in[0].shape[2] * n->in[3].shape[0] * (int64_t)sizeof(float));
}

/* ---- CONV1D_DECODE: cache [C,W] holds the last W inputs, oldest first ------------------------
 * One thread per channel: shift x in, y = sum_j w[c,j] cache[c,j] (j ascending, as the CPU),
 * SiLU when iattr0 = 1. */
__global__ void k_conv_decode(const void *x, int xdt, const void *w, int wdt, float *cache, void *y,
                              int ydt, int64_t C, int64_t W, int silu) {
  for (int64_t ch = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; ch < C;
       ch += (int64_t)gridDim.x * blockDim.x) {
    float *cc = cache + ch * W, p = 0.f;
    for (int64_t j = 0; j < W; j++) {
      float xv = j + 1 < W ? cc[j + 1] : kc_ld(x, xdt, ch);
      cc[j] = xv;
      p += kc_ld(w, wdt, ch * W + j) * xv;
    }
    kc_st(y, ydt, ch, silu ? p / (1.0f + expf(-p)) : p);
  }
}

int kc_conv1d_decode(const kda_exec_node *n, kc_ctx *c) {
  const kda_tview *x = &n->in[0], *w = &n->in[1];
  if (n->in[2].dtype != KDA_F32) return kda_set_error("cuda: conv1d_decode node %d: the cache must be f32", n->id);
  int64_t C = x->shape[2], W = w->shape[1];
  k_conv_decode<<<kc_blocks(C, 256, 1024), 256, 0, c->stream>>>(x->data, x->dtype, w->data, w->dtype,
                                                              (float *)n->in[2].data, n->out.data,
                                                              n->out.dtype, C, W, n->iattr[0] != 0);
  KC_LAUNCH_CHECK(n, "k_conv_decode");
  return 0;
}
