/* norm.cu — RMSNorm forward/backward and the deterministic column sum behind dw and SUM_ROWS.
 * CPU twin: cpu_rmsnorm, cpu_rmsnorm_bwd, cpu_sum_rows in core/cpu_ops.c.
 *
 * Column sums (dw = sum_rows(dy x r), bias gradients) never use float atomics: pass 1 gives
 * each of a fixed number of row chunks a partial [D] in scratch, pass 2 adds the partials in
 * chunk order. The chunk count depends only on the shape, so runs are bit-reproducible.   */
#include "kernels.h"

#define CS_T 256          /* columns per block in the column-sum passes */
#define CS_MAXCHUNK 128   /* row chunks of pass 1 */

static int64_t colsum_chunks(int64_t rows) {
  int64_t ch = (rows + 63) / 64;   /* at least 64 rows per chunk: enough work per thread */
  if (ch > CS_MAXCHUNK) ch = CS_MAXCHUNK;
  return ch < 1 ? 1 : ch;
}

int64_t kc_colsum_scratch(int64_t rows, int64_t d) {
  return KC_ALIGN(colsum_chunks(rows) * d * (int64_t)sizeof(float));
}

/* partial[chunk, j] = sum over the chunk's rows of x[i,j] * (y ? y[i,j] : 1) * (rs ? rs[i] : 1) */
__global__ void k_colsum_partial(const void *x, int xdt, const void *y, int ydt, const float *rs,
                                 int64_t rows, int64_t d, int64_t per, float *partial) {
  int64_t j = (int64_t)blockIdx.x * CS_T + threadIdx.x;
  if (j >= d) return;
  int64_t r0 = blockIdx.y * per, r1 = r0 + per < rows ? r0 + per : rows;
  float acc = 0.f;
  for (int64_t i = r0; i < r1; i++) {
    float v = kc_ld(x, xdt, i * d + j);
    if (y) v *= kc_ld(y, ydt, i * d + j);
    if (rs) v *= rs[i];
    acc += v;
  }
  partial[blockIdx.y * d + j] = acc;
}

__global__ void k_colsum_final(const float *partial, int64_t nch, int64_t d, void *o, int odt) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float acc = 0.f;
  for (int64_t c = 0; c < nch; c++) acc += partial[c * d + j];
  kc_st(o, odt, j, acc);
}

int kc_colsum(const kda_exec_node *n, kc_ctx *c, const void *x, int xdt, const void *y, int ydt,
              const float *rs, int64_t rows, int64_t d, void *o, int odt, float *scratch) {
  int64_t nch = colsum_chunks(rows), per = (rows + nch - 1) / nch;
  dim3 g1((unsigned)((d + CS_T - 1) / CS_T), (unsigned)nch);
  k_colsum_partial<<<g1, CS_T, 0, c->stream>>>(x, xdt, y, ydt, rs, rows, d, per, scratch);
  KC_LAUNCH_CHECK(n, "k_colsum_partial");
  k_colsum_final<<<(unsigned)((d + CS_T - 1) / CS_T), CS_T, 0, c->stream>>>(scratch, nch, d, o, odt);
  KC_LAUNCH_CHECK(n, "k_colsum_final");
  return 0;
}

int kc_sum_rows(const kda_exec_node *n, kc_ctx *c) {
  const kda_tview *x = &n->in[0];
  int64_t d = kc_lastdim(x), rows = kc_numel(x) / d;
  return kc_colsum(n, c, x->data, x->dtype, NULL, KDA_F32, NULL, rows, d, n->out.data,
                   n->out.dtype, (float *)c->scratch);
}

/* ---- RMSNorm forward: one block per row --------------------------------------------------- */
template <typename TX, typename TO>
__global__ void k_rmsnorm(const TX *x, const void *w, int wdt, TO *y, int64_t d, float eps) {
  __shared__ float sh[32];
  const TX *xi = x + (int64_t)blockIdx.x * d;
  TO *yi = y + (int64_t)blockIdx.x * d;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float v = kc_to_f(xi[j]);
    ss += v * v;
  }
  ss = kc_block_sum(ss, sh);
  float r = rsqrtf(ss / (float)d + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    yi[j] = kc_from_f<TO>(kc_to_f(xi[j]) * r * kc_ld(w, wdt, j));
}

static int norm_threads(int64_t d) { return d >= 2048 ? 512 : d >= 512 ? 256 : d > 64 ? 128 : 64; }

template <typename TX, typename TO>
static void launch_rmsnorm(const kda_exec_node *n, kc_ctx *c, int64_t rows, int64_t d) {
  k_rmsnorm<TX, TO><<<(unsigned)rows, norm_threads(d), 0, c->stream>>>(
      (const TX *)n->in[0].data, n->in[1].data, n->in[1].dtype, (TO *)n->out.data, d,
      n->fattr[0]);
}

int kc_rmsnorm(const kda_exec_node *n, kc_ctx *c) {
  const kda_tview *x = &n->in[0];
  int64_t d = kc_lastdim(x), rows = kc_numel(x) / d;
  int xb = x->dtype == KDA_BF16, ob = n->out.dtype == KDA_BF16;
  if (xb && ob) launch_rmsnorm<__nv_bfloat16, __nv_bfloat16>(n, c, rows, d);
  else if (xb) launch_rmsnorm<__nv_bfloat16, float>(n, c, rows, d);
  else if (ob) launch_rmsnorm<float, __nv_bfloat16>(n, c, rows, d);
  else launch_rmsnorm<float, float>(n, c, rows, d);
  KC_LAUNCH_CHECK(n, "k_rmsnorm");
  return 0;
}

/* ---- residual add + RMSNorm: the backend's fusion of ADD(a, b) -> h and RMSNORM(h, w) -> y
 * (a pre-norm block's residual stream and the next norm). h is stored and the norm reads it
 * back as stored, with the forward kernel's thread count and order: the same bits as the two
 * nodes apart. Saves a launch and a pass over h. */
__global__ void k_add_rmsnorm(const void *a, int adt, const void *b, int bdt, void *h, int hdt,
                              const void *w, int wdt, void *y, int ydt, int64_t d, float eps) {
  __shared__ float sh[32];
  const int64_t base = (int64_t)blockIdx.x * d;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    kc_st(h, hdt, base + j, kc_ld(a, adt, base + j) + kc_ld(b, bdt, base + j));
    float v = kc_ld(h, hdt, base + j);
    ss += v * v;
  }
  ss = kc_block_sum(ss, sh);
  float r = rsqrtf(ss / (float)d + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    kc_st(y, ydt, base + j, kc_ld(h, hdt, base + j) * r * kc_ld(w, wdt, j));
}

int kc_add_rmsnorm(const kda_exec_node *add, const kda_exec_node *norm, kc_ctx *c) {
  const kda_tview *x = &norm->in[0];
  int64_t d = kc_lastdim(x), rows = kc_numel(x) / d;
  k_add_rmsnorm<<<(unsigned)rows, norm_threads(d), 0, c->stream>>>(
      add->in[0].data, add->in[0].dtype, add->in[1].data, add->in[1].dtype, add->out.data,
      add->out.dtype, norm->in[1].data, norm->in[1].dtype, norm->out.data, norm->out.dtype, d,
      norm->fattr[0]);
  KC_LAUNCH_CHECK(norm, "k_add_rmsnorm");
  return 0;
}

/* ---- RMSNorm backward -------------------------------------------------------------------
 * Per row: r = 1/sqrt(mean(x^2)+eps), dx = r w dy - x r^3 mean(x w dy); r goes to scratch for
 * the dw column sum. Output packed in out's dtype: dx [N*D] then dw [D].
 * With res != NULL (the backend's fusion of the ADD that sums dx into the residual stream's
 * gradient) also sum = res + dx as stored: the same bits as the ADD node, one launch and two
 * passes fewer. */
template <typename TX, typename TO>
__global__ void k_rmsnorm_bwd(const TX *x, const void *w, int wdt, const TX *dy, TO *dx,
                              float *rs, int64_t d, float eps, const void *res, int rdt,
                              void *sum, int sdt) {
  __shared__ float sh[32];
  int64_t row = blockIdx.x;
  const TX *xi = x + row * d, *gi = dy + row * d;
  float ss = 0.f, dot = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float v = kc_to_f(xi[j]);
    ss += v * v;
    dot += v * kc_ld(w, wdt, j) * kc_to_f(gi[j]);
  }
  ss = kc_block_sum(ss, sh);
  dot = kc_block_sum(dot, sh);
  float r = rsqrtf(ss / (float)d + eps);
  float cc = dot / (float)d * r * r * r;
  if (threadIdx.x == 0) rs[row] = r;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    TO g = kc_from_f<TO>(r * kc_ld(w, wdt, j) * kc_to_f(gi[j]) - kc_to_f(xi[j]) * cc);
    dx[row * d + j] = g;
    if (sum) kc_st(sum, sdt, row * d + j, kc_ld(res, rdt, row * d + j) + kc_to_f(g));
  }
}

template <typename TX, typename TO>
static void launch_rmsnorm_bwd(const kda_exec_node *n, kc_ctx *c, int64_t rows, int64_t d,
                               float *rs, const kda_tview *res, const kda_tview *sum) {
  k_rmsnorm_bwd<TX, TO><<<(unsigned)rows, norm_threads(d), 0, c->stream>>>(
      (const TX *)n->in[0].data, n->in[1].data, n->in[1].dtype, (const TX *)n->in[2].data,
      (TO *)n->out.data, rs, d, n->fattr[0], res ? res->data : NULL, res ? res->dtype : KDA_F32,
      sum ? sum->data : NULL, sum ? sum->dtype : KDA_F32);
}

int64_t kc_norm_scratch(const kda_exec_node *n) {
  int64_t d = kc_lastdim(&n->in[0]), rows = kc_numel(&n->in[0]) / d;
  return KC_ALIGN(rows * (int64_t)sizeof(float)) + kc_colsum_scratch(rows, d);
}

static int rmsnorm_bwd(const kda_exec_node *n, kc_ctx *c, const kda_tview *res,
                       const kda_tview *sum) {
  const kda_tview *x = &n->in[0], *dy = &n->in[2];
  int64_t d = kc_lastdim(x), rows = kc_numel(x) / d;
  if (x->dtype != dy->dtype)
    return kda_set_error("cuda: rmsnorm_bwd node %d: x (%s) and dy (%s) must share a dtype",
                         n->id, kda_dtype_name(x->dtype), kda_dtype_name(dy->dtype));
  float *rs = (float *)c->scratch;
  float *part = (float *)((char *)c->scratch + KC_ALIGN(rows * (int64_t)sizeof(float)));
  int xb = x->dtype == KDA_BF16, ob = n->out.dtype == KDA_BF16;
  if (xb && ob) launch_rmsnorm_bwd<__nv_bfloat16, __nv_bfloat16>(n, c, rows, d, rs, res, sum);
  else if (xb) launch_rmsnorm_bwd<__nv_bfloat16, float>(n, c, rows, d, rs, res, sum);
  else if (ob) launch_rmsnorm_bwd<float, __nv_bfloat16>(n, c, rows, d, rs, res, sum);
  else launch_rmsnorm_bwd<float, float>(n, c, rows, d, rs, res, sum);
  KC_LAUNCH_CHECK(n, "k_rmsnorm_bwd");
  void *dw = (char *)n->out.data + rows * d * kc_dsize(n->out.dtype);
  return kc_colsum(n, c, dy->data, dy->dtype, x->data, x->dtype, rs, rows, d, dw, n->out.dtype,
                   part);
}

int kc_rmsnorm_bwd(const kda_exec_node *n, kc_ctx *c) { return rmsnorm_bwd(n, c, NULL, NULL); }

/* RMSNORM_BWD then the ADD of its dx (add's input 1 - dx_input) to the other addend. */
int kc_rmsnorm_bwd_add(const kda_exec_node *n, const kda_exec_node *add, int dx_input, kc_ctx *c) {
  return rmsnorm_bwd(n, c, &add->in[1 - dx_input], &add->out);
}
