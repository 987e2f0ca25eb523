/* optim_ext.cu — the optimizer nodes beyond AdamW: GUARD (NaN/Inf and loss-spike skipping),
 * MUON (Newton-Schulz orthogonalised momentum), EMA of the weights, row retraction.
 * CPU twins: cpu_guard, cpu_muon, cpu_ema, cpu_retract in core/cpu_ops.c (same formulas).
 * All read the device-resident optimizer state (enum kda_state_slot), so a captured step
 * decides to skip without the host.                                                        */
#include "kernels.h"

/* ---- GUARD: one thread; the state is 8 floats ----------------------------------------- */
__global__ void k_guard(float *st, const float *loss, const float *gnorm, float factor, float decay,
                        float warm_steps) {
  float l = *loss, gn = *gnorm, ema = st[KDA_STATE_LOSS_EMA];
  int warm = st[KDA_STATE_STEP] > warm_steps;
  int skip = !isfinite(l) || !isfinite(gn) || (factor > 0 && warm && ema > 0 && l > factor * ema);
  st[KDA_STATE_SKIP] = (float)skip;
  st[KDA_STATE_SKIP_RUN] = skip ? st[KDA_STATE_SKIP_RUN] + 1 : 0;
  st[KDA_STATE_SKIPPED] += (float)skip;
  if (!skip) st[KDA_STATE_LOSS_EMA] = ema > 0 ? decay * ema + (1 - decay) * l : l;
}

int kc_guard(const kda_exec_node *n, kc_ctx *c) {
  for (int i = 0; i < 3; i++)
    if (n->in[i].dtype != KDA_F32) return kda_set_error("cuda: guard node %d: input %d must be f32", n->id, i);
  k_guard<<<1, 1, 0, c->stream>>>((float *)n->in[0].data, (const float *)n->in[1].data,
                                   (const float *)n->in[2].data, n->fattr[0], n->fattr[1], (float)n->iattr[0]);
  KC_LAUNCH_CHECK(n, "k_guard");
  return 0;
}

__device__ __forceinline__ int kc_skipped(const float *st, const float *gnorm) {
  return st[KDA_STATE_SKIP] != 0 || !isfinite(*gnorm);
}

/* ---- EMA and retraction ---------------------------------------------------------------- */
__global__ void k_ema(float *e, const float *p, const float *st, float decay, int64_t n) {
  float d = st[KDA_STATE_STEP] <= 1.0f ? 0.0f : decay; /* the first step copies the weights */
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    e[i] = d * e[i] + (1.0f - d) * p[i];
}

int kc_ema(const kda_exec_node *n, kc_ctx *c) {
  int64_t cnt = kc_numel(&n->in[0]);
  k_ema<<<kc_blocks(cnt, 256, 4 * (int64_t)c->num_sms), 256, 0, c->stream>>>(
      (float *)n->in[0].data, (const float *)n->in[1].data, (const float *)n->in[2].data, n->fattr[0], cnt);
  KC_LAUNCH_CHECK(n, "k_ema");
  return 0;
}

/* One block per row: the row's L2 norm, then a rescale to `norm`. */
__global__ void k_retract(float *p, int64_t cols, float norm) {
  __shared__ float sh[32];
  float *row = p + (int64_t)blockIdx.x * cols, ss = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) ss += row[j] * row[j];
  ss = kc_block_sum(ss, sh);
  float s = ss > 0 ? norm * rsqrtf(ss) : 1.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) row[j] *= s;
}

int kc_retract(const kda_exec_node *n, kc_ctx *c) {
  k_retract<<<(unsigned)n->in[0].shape[0], 256, 0, c->stream>>>((float *)n->in[0].data, n->in[0].shape[1],
                                                                 n->fattr[0]);
  KC_LAUNCH_CHECK(n, "k_retract");
  return 0;
}

/* ---- Muon ------------------------------------------------------------------------------
 * mom = mu mom + g';  u = g' + mu mom;  X = u (transposed when R > C) / |u|_F;
 * five times: A = X X^T, B = b A + c A A, X = a X + B X;   p -= lr (s X + wd p).
 * The GEMMs are fp32 through kc_matmul on exec nodes that point into scratch; the norm is
 * a two-pass block reduction (no atomics: bit-reproducible).                             */
enum { MUON_BLOCKS = 256 };

static void muon_dims(const kda_exec_node *n, int64_t *r, int64_t *cc, int *tr) {
  int64_t R = n->in[0].shape[0], C = n->in[0].shape[1];
  *tr = R > C, *r = *tr ? C : R, *cc = *tr ? R : C;
}

/* Scratch: X, T [r,c]; A, AA [r,r]; MUON_BLOCKS partial sums + the norm. */
int64_t kc_muon_scratch(const kda_exec_node *n) {
  int64_t r, cc;
  int tr;
  muon_dims(n, &r, &cc, &tr);
  return (2 * r * cc + 2 * r * r + MUON_BLOCKS + 64) * (int64_t)sizeof(float) + 4 * 256;
}

__global__ void k_muon_momentum(const void *g, int gdt, float *mom, float *x, const float *gnorm,
                                const float *st, float mu, float clip, int64_t R, int64_t C, int tr,
                                float *partial) {
  __shared__ float sh[32];
  float gn = *gnorm, ss = 0.f;
  int skip = kc_skipped(st, gnorm);
  float gs = (clip > 0 && gn > clip) ? clip / gn : 1.0f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < R * C; i += (int64_t)gridDim.x * blockDim.x) {
    float gi = kc_ld(g, gdt, i) * gs;
    float m = skip ? mom[i] : mu * mom[i] + gi;
    if (!skip) mom[i] = m;
    float u = gi + mu * m;
    int64_t row = i / C, col = i % C;
    x[tr ? col * R + row : i] = u;
    ss += u * u;
  }
  ss = kc_block_sum(ss, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = ss;
}

/* Sums the block partials in a fixed order and scales X to unit Frobenius norm. */
__global__ void k_muon_normalise(float *x, int64_t n, const float *partial, int nparts) {
  __shared__ float inv;
  if (threadIdx.x == 0) {
    double s = 0;
    for (int i = 0; i < nparts; i++) s += partial[i];
    inv = 1.0f / ((float)sqrt(s) + 1e-7f);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) x[i] *= inv;
}

/* out = alpha * a + beta * b, elementwise. */
__global__ void k_axpby(float *out, const float *a, const float *b, float alpha, float beta, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = alpha * a[i] + beta * b[i];
}

__global__ void k_muon_apply(float *p, const float *x, const float *gnorm, const float *st, float lr_mult,
                             float wd, float scale, int64_t R, int64_t C, int tr) {
  if (kc_skipped(st, gnorm)) return;
  float lr = st[KDA_STATE_LR] * lr_mult;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < R * C; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t row = i / C, col = i % C;
    p[i] -= lr * (scale * x[tr ? col * R + row : i] + wd * p[i]);
  }
}

/* An fp32 GEMM node out = op(a) @ op(b) over scratch buffers, run through kc_matmul. */
static int muon_gemm(const kda_exec_node *owner, kc_ctx *c, float *out, const float *a, const float *b,
                     int64_t m, int64_t k, int64_t nn, int tb) {
  kda_tview in[2] = {{(void *)a, KDA_F32, 2, {m, k, 1, 1}}, {(void *)b, KDA_F32, 2, {tb ? nn : k, tb ? k : nn, 1, 1}}};
  kda_exec_node e = {KDA_OP_MATMUL, owner->id, 2, in, {out, KDA_F32, 2, {m, nn, 1, 1}}, {0, tb}, {0}};
  return kc_matmul(&e, c);
}

int kc_muon(const kda_exec_node *n, kc_ctx *c) {
  int64_t R = n->in[0].shape[0], C = n->in[0].shape[1], r, cc;
  int tr;
  muon_dims(n, &r, &cc, &tr);
  if (c->scratch_bytes < kc_muon_scratch(n)) return kda_set_error("cuda: muon node %d: scratch too small", n->id);
  float *x = (float *)c->scratch, *t = x + r * cc, *A = t + r * cc, *AA = A + r * r, *partial = AA + r * r;
  const float *gnorm = (const float *)n->in[3].data, *st = (const float *)n->in[4].data;
  const float ka = 3.4445f, kb = -4.7750f, kcoef = 2.0315f;
  k_muon_momentum<<<MUON_BLOCKS, 256, 0, c->stream>>>(n->in[1].data, n->in[1].dtype, (float *)n->in[2].data, x,
                                                       gnorm, st, n->fattr[0], n->fattr[3], R, C, tr, partial);
  KC_LAUNCH_CHECK(n, "k_muon_momentum");
  k_muon_normalise<<<1, 1024, 0, c->stream>>>(x, r * cc, partial, MUON_BLOCKS);
  KC_LAUNCH_CHECK(n, "k_muon_normalise");
  unsigned blocks = kc_blocks(r * cc, 256, 4 * (int64_t)c->num_sms);
  for (int it = 0; it < 5; it++) {
    if (muon_gemm(n, c, A, x, x, r, cc, r, 1)) return -1;          /* A = X X^T */
    if (muon_gemm(n, c, AA, A, A, r, r, r, 0)) return -1;          /* AA = A A */
    k_axpby<<<kc_blocks(r * r, 256, 4 * (int64_t)c->num_sms), 256, 0, c->stream>>>(A, A, AA, kb, kcoef, r * r);
    KC_LAUNCH_CHECK(n, "k_axpby");                                 /* B = b A + c AA (in A) */
    if (muon_gemm(n, c, t, A, x, r, r, cc, 0)) return -1;          /* T = B X */
    k_axpby<<<blocks, 256, 0, c->stream>>>(x, x, t, ka, 1.0f, r * cc);
    KC_LAUNCH_CHECK(n, "k_axpby");                                 /* X = a X + T */
  }
  float scale = sqrtf(fmaxf(1.0f, (float)R / (float)C));
  k_muon_apply<<<blocks, 256, 0, c->stream>>>((float *)n->in[0].data, x, gnorm, st, n->fattr[1], n->fattr[2],
                                              scale, R, C, tr);
  KC_LAUNCH_CHECK(n, "k_muon_apply");
  return 0;
}
