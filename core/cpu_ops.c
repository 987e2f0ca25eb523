/* cpu_ops.c — the CPU backend: the reference implementation of every op.
 *
 * Plain loops over f32 (OpenMP across rows), GEMM through CBLAS. Every CUDA kernel is checked
 * against these functions, so they favour the obvious formula over speed — except the GEMM,
 * which is most of a CPU step and goes to OpenBLAS.                                        */
#include <cblas.h>
#include <math.h>
#include <string.h>
#include "backend.h"
#include "internal.h"
#include "ops.h"

#define LN2 0.69314718055994530942

static float *F(const kda_tview *t) { return (float *)t->data; }
static const int32_t *IDX(const kda_tview *t) { return (const int32_t *)t->data; }
static int64_t rows_of(const kda_tview *t) { return kda_tview_numel(t) / t->shape[t->ndim - 1]; }
static int64_t cols_of(const kda_tview *t) { return t->shape[t->ndim - 1]; }

/* ---- GEMM: out = op(a) @ op(b), batched over a's leading dim ---------------------------- */
static void cpu_matmul(const kda_exec_node *n) {
  const kda_tview *a = &n->in[0], *b = &n->in[1];
  int ta = (int)n->iattr[0], tb = (int)n->iattr[1];
  int64_t batch = a->ndim == 3 ? a->shape[0] : 1;
  int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
  int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
  int64_t m = ta ? ac : ar, k = ta ? ar : ac, nn = tb ? br : bc;
  for (int64_t i = 0; i < batch; i++) {
    const float *pa = F(a) + i * ar * ac;
    const float *pb = F(b) + (b->ndim == 3 ? i * br * bc : 0);
    float *po = F(&n->out) + i * m * nn;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)nn, (int)k, 1.0f, pa, (int)ac, pb, (int)bc, 0.0f, po, (int)nn);
  }
}

/* ---- elementwise ----------------------------------------------------------------------- */
static void cpu_binary(const kda_exec_node *n, int mul) {
  const float *a = F(&n->in[0]), *b = F(&n->in[1]);
  float *o = F(&n->out);
  int64_t total = kda_tview_numel(&n->out), nb = kda_tview_numel(&n->in[1]);
#pragma omp parallel for
  for (int64_t i = 0; i < total; i++) {
    float bv = b[nb == total ? i : i % nb];
    o[i] = mul ? a[i] * bv : a[i] + bv;
  }
}

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* GELU, tanh form: 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi). */
static float gelu(float x) {
  const float c = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}
static float gelu_grad(float x) {
  const float c = 0.7978845608028654f;
  float u = c * (x + 0.044715f * x * x * x), t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
}

static void cpu_unary(const kda_exec_node *n) {
  const float *x = F(&n->in[0]);
  const float *dy = n->nin > 1 ? F(&n->in[1]) : NULL;
  float *o = F(&n->out);
  int64_t total = kda_tview_numel(&n->out);
  float s = n->fattr[0];
  int op = n->op;
#pragma omp parallel for
  for (int64_t i = 0; i < total; i++) {
    float v = x[i], sg;
    switch (op) {
    case KDA_OP_SCALE: o[i] = v * s; break;
    case KDA_OP_SILU: o[i] = v * sigmoidf(v); break;
    case KDA_OP_SILU_BWD: sg = sigmoidf(v); o[i] = dy[i] * sg * (1.0f + v * (1.0f - sg)); break;
    case KDA_OP_GELU: o[i] = gelu(v); break;
    case KDA_OP_GELU_BWD: o[i] = dy[i] * gelu_grad(v); break;
    case KDA_OP_SIGMOID: o[i] = sigmoidf(v); break;
    case KDA_OP_SIGMOID_BWD: o[i] = dy[i] * v * (1.0f - v); break; /* x holds y = sigmoid */
    case KDA_OP_SWIGLU: o[i] = v * sigmoidf(v) * dy[i]; break;     /* dy holds b */
    }
  }
}

/* swiglu(a,b) = silu(a) b:  da = dy b silu'(a),  db = dy silu(a). */
static void cpu_swiglu_bwd(const kda_exec_node *n) {
  const float *a = F(&n->in[0]), *b = F(&n->in[1]), *dy = F(&n->in[2]);
  int64_t total = kda_tview_numel(&n->in[0]);
  float *da = F(&n->out), *db = da + total;
#pragma omp parallel for
  for (int64_t i = 0; i < total; i++) {
    float sg = sigmoidf(a[i]);
    da[i] = dy[i] * b[i] * sg * (1.0f + a[i] * (1.0f - sg));
    db[i] = dy[i] * a[i] * sg;
  }
}

static void cpu_sum_rows(const kda_exec_node *n) {
  const float *x = F(&n->in[0]);
  int64_t r = rows_of(&n->in[0]), d = cols_of(&n->in[0]);
  float *o = F(&n->out);
#pragma omp parallel for
  for (int64_t j = 0; j < d; j++) {
    double acc = 0;
    for (int64_t i = 0; i < r; i++) acc += x[i * d + j];
    o[j] = (float)acc;
  }
}

/* ---- embedding ------------------------------------------------------------------------- */
static void cpu_embed(const kda_exec_node *n) {
  const float *w = F(&n->in[0]);
  const int32_t *idx = IDX(&n->in[1]);
  int64_t cnt = kda_tview_numel(&n->in[1]), d = n->in[0].shape[1], v = n->in[0].shape[0];
  float *o = F(&n->out);
#pragma omp parallel for
  for (int64_t i = 0; i < cnt; i++) {
    int32_t t = idx[i];
    if (t < 0 || t >= v) t = 0; /* kda.data writes bytes 0..255; a bad id reads row 0, never past the table */
    memcpy(o + i * d, w + (int64_t)t * d, (size_t)d * sizeof(float));
  }
}

/* Scatter-add; parallel over embedding columns so the sum order is fixed (deterministic). */
static void cpu_embed_bwd(const kda_exec_node *n) {
  const float *dy = F(&n->in[0]);
  const int32_t *idx = IDX(&n->in[1]);
  int64_t cnt = kda_tview_numel(&n->in[1]), d = cols_of(&n->in[0]), v = n->out.shape[0];
  float *o = F(&n->out);
  memset(o, 0, (size_t)(v * d) * sizeof(float));
#pragma omp parallel for
  for (int64_t j = 0; j < d; j++)
    for (int64_t i = 0; i < cnt; i++) {
      int32_t t = idx[i];
      if (t >= 0 && t < v) o[(int64_t)t * d + j] += dy[i * d + j];
    }
}

/* ---- RMSNorm: y = x * r * w, r = 1/sqrt(mean(x^2) + eps) --------------------------------- */
static void cpu_rmsnorm(const kda_exec_node *n) {
  const float *x = F(&n->in[0]), *w = F(&n->in[1]);
  int64_t r = rows_of(&n->in[0]), d = cols_of(&n->in[0]);
  float eps = n->fattr[0], *y = F(&n->out);
#pragma omp parallel for
  for (int64_t i = 0; i < r; i++) {
    const float *xi = x + i * d;
    double ss = 0;
    for (int64_t j = 0; j < d; j++) ss += (double)xi[j] * xi[j];
    float rs = (float)(1.0 / sqrt(ss / (double)d + eps));
    for (int64_t j = 0; j < d; j++) y[i * d + j] = xi[j] * rs * w[j];
  }
}

/* dx = r w dy - x r^3 mean(x w dy);  dw = sum_rows(dy x r). Packed: dx then dw. */
static void cpu_rmsnorm_bwd(const kda_exec_node *n) {
  const float *x = F(&n->in[0]), *w = F(&n->in[1]), *dy = F(&n->in[2]);
  int64_t r = rows_of(&n->in[0]), d = cols_of(&n->in[0]);
  float eps = n->fattr[0], *dx = F(&n->out), *dw = dx + r * d;
  float *rs = kda_malloc((size_t)r * sizeof(float), "rmsnorm_bwd scratch");
  KDA_CHECK(rs);
#pragma omp parallel for
  for (int64_t i = 0; i < r; i++) {
    const float *xi = x + i * d, *gi = dy + i * d;
    double ss = 0, dot = 0;
    for (int64_t j = 0; j < d; j++) ss += (double)xi[j] * xi[j], dot += (double)xi[j] * w[j] * gi[j];
    double inv = 1.0 / sqrt(ss / (double)d + eps);
    rs[i] = (float)inv;
    float c = (float)(dot / (double)d * inv * inv * inv);
    for (int64_t j = 0; j < d; j++) dx[i * d + j] = (float)inv * w[j] * gi[j] - xi[j] * c;
  }
#pragma omp parallel for
  for (int64_t j = 0; j < d; j++) {
    double acc = 0;
    for (int64_t i = 0; i < r; i++) acc += (double)dy[i * d + j] * x[i * d + j] * rs[i];
    dw[j] = (float)acc;
  }
  free(rs);
}

/* ---- softmax over the last dim ----------------------------------------------------------- */
static void cpu_softmax(const kda_exec_node *n) {
  const float *x = F(&n->in[0]);
  int64_t r = rows_of(&n->in[0]), d = cols_of(&n->in[0]);
  float *y = F(&n->out);
#pragma omp parallel for
  for (int64_t i = 0; i < r; i++) {
    const float *xi = x + i * d;
    float mx = -INFINITY;
    for (int64_t j = 0; j < d; j++) mx = fmaxf(mx, xi[j]);
    double s = 0;
    for (int64_t j = 0; j < d; j++) s += (y[i * d + j] = expf(xi[j] - mx));
    for (int64_t j = 0; j < d; j++) y[i * d + j] = (float)(y[i * d + j] / s);
  }
}

/* dx = y (dy - sum(dy y)). */
static void cpu_softmax_bwd(const kda_exec_node *n) {
  const float *y = F(&n->in[0]), *dy = F(&n->in[1]);
  int64_t r = rows_of(&n->in[0]), d = cols_of(&n->in[0]);
  float *dx = F(&n->out);
#pragma omp parallel for
  for (int64_t i = 0; i < r; i++) {
    double dot = 0;
    for (int64_t j = 0; j < d; j++) dot += (double)dy[i * d + j] * y[i * d + j];
    for (int64_t j = 0; j < d; j++) dx[i * d + j] = y[i * d + j] * (dy[i * d + j] - (float)dot);
  }
}

/* ---- RoPE: rotate pairs (i, i + Dh/2) of each head by angle (p0 + t) * theta^(-2i/Dh) ------
 * p0 = 0, or the position in the optional second input (decoding one token at a time).     */
static int cpu_rope(const kda_exec_node *n) {
  const float *x = F(&n->in[0]);
  int64_t B = n->in[0].shape[0], T = n->in[0].shape[1], H = n->in[0].shape[2], D = n->in[0].shape[3];
  int64_t half = D / 2, p0 = n->nin > 1 ? *(const int32_t *)n->in[1].data : 0;
  if (p0 < 0) return kda_set_error("rope: position %lld is negative", (long long)p0);
  float theta = n->fattr[0] > 0 ? n->fattr[0] : 10000.0f;
  float sign = n->iattr[0] ? -1.0f : 1.0f;
  float *y = F(&n->out);
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      float cs[KDA_ROPE_MAX_DH]; /* cos, sin pairs: once per position, shared by the heads */
      for (int64_t i = 0; i < half; i++) {
        double ang = (double)(p0 + t) * pow((double)theta, -2.0 * (double)i / (double)D);
        cs[2 * i] = (float)cos(ang), cs[2 * i + 1] = sign * (float)sin(ang);
      }
      for (int64_t h = 0; h < H; h++) {
        const float *xi = x + ((b * T + t) * H + h) * D;
        float *yi = y + ((b * T + t) * H + h) * D;
        for (int64_t i = 0; i < half; i++) {
          float x0 = xi[i], x1 = xi[i + half];
          yi[i] = x0 * cs[2 * i] - x1 * cs[2 * i + 1];
          yi[i + half] = x0 * cs[2 * i + 1] + x1 * cs[2 * i];
        }
      }
    }
  return 0;
}

/* ---- causal attention, [B,T,H,Dh]; P = softmax(q k^T s) with j <= i -------------------- */
static float attn_scale(const kda_exec_node *n) {
  return n->fattr[0] != 0 ? n->fattr[0] : 1.0f / sqrtf((float)n->in[0].shape[3]);
}

/* Softmax of the query row qi against the first n key rows of head h, into p[0..n): key j is
 * at k0 + (j*H + h)*D (one sequence of a [T,H,D] tensor, or a decode cache). */
static void attn_probs(const float *qi, const float *k0, int64_t H, int64_t D, int64_t h, int64_t n,
                       float s, float *p) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; j++) {
    const float *kj = k0 + (j * H + h) * D;
    float dot = 0;
    for (int64_t c = 0; c < D; c++) dot += qi[c] * kj[c];
    p[j] = dot * s;
    mx = fmaxf(mx, p[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < n; j++) sum += (p[j] = expf(p[j] - mx));
  for (int64_t j = 0; j < n; j++) p[j] = (float)(p[j] / sum);
}

static void cpu_attention(const kda_exec_node *n) {
  const float *q = F(&n->in[0]), *k = F(&n->in[1]), *v = F(&n->in[2]);
  int64_t B = n->in[0].shape[0], T = n->in[0].shape[1], H = n->in[0].shape[2], D = n->in[0].shape[3];
  float s = attn_scale(n), *o = F(&n->out);
#pragma omp parallel
  {
    float *p = malloc((size_t)T * sizeof(float));
    KDA_CHECK(p);
#pragma omp for collapse(2)
    for (int64_t b = 0; b < B; b++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < T; i++) {
          attn_probs(q + ((b * T + i) * H + h) * D, k + b * T * H * D, H, D, h, i + 1, s, p);
          float *oi = o + ((b * T + i) * H + h) * D;
          for (int64_t c = 0; c < D; c++) oi[c] = 0;
          for (int64_t j = 0; j <= i; j++) {
            const float *vj = v + ((b * T + j) * H + h) * D;
            for (int64_t c = 0; c < D; c++) oi[c] += p[j] * vj[c];
          }
        }
    free(p);
  }
}

/* dv_j = sum_i P_ij do_i;  dP_ij = do_i.v_j;  dS = P (dP - rowsum(P dP));
 * dq_i = s sum_j dS_ij k_j;  dk_j = s sum_i dS_ij q_i.  Each (b,h) is independent.     */
static void cpu_attention_bwd(const kda_exec_node *n) {
  const float *q = F(&n->in[0]), *k = F(&n->in[1]), *v = F(&n->in[2]), *dout = F(&n->in[3]);
  int64_t B = n->in[0].shape[0], T = n->in[0].shape[1], H = n->in[0].shape[2], D = n->in[0].shape[3];
  int64_t numel = B * T * H * D;
  float s = attn_scale(n);
  float *dq = F(&n->out), *dk = dq + numel, *dv = dk + numel;
  memset(dq, 0, (size_t)(3 * numel) * sizeof(float));
#pragma omp parallel
  {
    float *p = malloc((size_t)T * sizeof(float)), *dp = malloc((size_t)T * sizeof(float));
    KDA_CHECK(p && dp);
#pragma omp for collapse(2)
    for (int64_t b = 0; b < B; b++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < T; i++) {
          attn_probs(q + ((b * T + i) * H + h) * D, k + b * T * H * D, H, D, h, i + 1, s, p);
          const float *doi = dout + ((b * T + i) * H + h) * D;
          const float *qi = q + ((b * T + i) * H + h) * D;
          double rs = 0;
          for (int64_t j = 0; j <= i; j++) {
            const float *vj = v + ((b * T + j) * H + h) * D;
            float d = 0;
            for (int64_t c = 0; c < D; c++) d += doi[c] * vj[c];
            dp[j] = d;
            rs += (double)p[j] * d;
          }
          float *dqi = dq + ((b * T + i) * H + h) * D;
          for (int64_t j = 0; j <= i; j++) {
            float ds = p[j] * (dp[j] - (float)rs) * s;
            const float *kj = k + ((b * T + j) * H + h) * D;
            float *dkj = dk + ((b * T + j) * H + h) * D, *dvj = dv + ((b * T + j) * H + h) * D;
            for (int64_t c = 0; c < D; c++) {
              dqi[c] += ds * kj[c];
              dkj[c] += ds * qi[c];
              dvj[c] += p[j] * doi[c];
            }
          }
        }
    free(p);
    free(dp);
  }
}

/* Attention for one query row at position pos over cache rows 0..pos (the same math as
 * attn_probs + cpu_attention above). */
static int cpu_attn_decode(const kda_exec_node *n) {
  const float *q = F(&n->in[0]), *k = F(&n->in[1]), *v = F(&n->in[2]);
  float *kc = F(&n->in[3]), *vc = F(&n->in[4]), *o = F(&n->out);
  int64_t H = n->in[0].shape[2], D = n->in[0].shape[3], Tmax = n->in[3].shape[0];
  int64_t pos = *(const int32_t *)n->in[5].data;
  if (pos < 0 || pos >= Tmax)
    return kda_set_error("attn_decode: pos %lld is outside the cache of %lld rows: decode at most %lld tokens",
                         (long long)pos, (long long)Tmax, (long long)Tmax);
  float s = n->fattr[0] != 0 ? n->fattr[0] : 1.0f / sqrtf((float)D);
  memcpy(kc + pos * H * D, k, (size_t)(H * D) * sizeof(float));
  memcpy(vc + pos * H * D, v, (size_t)(H * D) * sizeof(float));
  float *p = kda_malloc((size_t)(pos + 1) * sizeof(float), "attn_decode scores");
  if (!p) return -1;
  for (int64_t h = 0; h < H; h++) {
    attn_probs(q + h * D, kc, H, D, h, pos + 1, s, p);
    float *oi = o + h * D;
    for (int64_t c = 0; c < D; c++) oi[c] = 0;
    for (int64_t j = 0; j <= pos; j++) {
      const float *vj = vc + (j * H + h) * D;
      for (int64_t c = 0; c < D; c++) oi[c] += p[j] * vj[c];
    }
  }
  free(p);
  return 0;
}

/* ---- cross-entropy in bits: (logsumexp(z) - z_target) / ln 2 ----------------------------- */
static void cpu_cross_entropy(const kda_exec_node *n, int bwd) {
  const float *z = F(&n->in[0]);
  const int32_t *tg = IDX(&n->in[1]);
  int64_t r = n->in[0].shape[0], v = n->in[0].shape[1];
  float *o = F(&n->out);
  const float *dl = bwd ? F(&n->in[2]) : NULL;
#pragma omp parallel for
  for (int64_t i = 0; i < r; i++) {
    const float *zi = z + i * v;
    float mx = -INFINITY;
    for (int64_t j = 0; j < v; j++) mx = fmaxf(mx, zi[j]);
    double s = 0;
    for (int64_t j = 0; j < v; j++) s += exp((double)(zi[j] - mx));
    int32_t t = tg[i];
    if (t < 0 || t >= v) t = 0;
    if (!bwd) {
      o[i] = (float)((log(s) + mx - zi[t]) / LN2);
      continue;
    }
    float g = dl[i] / (float)LN2;
    for (int64_t j = 0; j < v; j++) o[i * v + j] = (float)(exp((double)(zi[j] - mx)) / s) * g;
    o[i * v + t] -= g;
  }
}

static void cpu_reduce(const kda_exec_node *n) {
  const float *x = F(&n->in[0]);
  int64_t cnt = kda_tview_numel(&n->in[0]);
  double acc = 0;
  for (int64_t i = 0; i < cnt; i++) acc += x[i];
  F(&n->out)[0] = (float)(n->op == KDA_OP_MEAN ? acc / (double)cnt : acc);
}

static void cpu_fill(const kda_exec_node *n) {
  float v = n->fattr[0] * (n->nin ? F(&n->in[0])[0] : 1.0f);
  int64_t cnt = kda_tview_numel(&n->out);
  float *o = F(&n->out);
  for (int64_t i = 0; i < cnt; i++) o[i] = v;
}

/* Copy with dims d0 and d1 swapped (shape padded to 4 dims). */
static void cpu_transpose(const kda_exec_node *n) {
  const kda_tview *x = &n->in[0];
  int64_t s[4] = {1, 1, 1, 1}, st[4], ost[4], os[4];
  int pad = 4 - x->ndim;
  for (int i = 0; i < x->ndim; i++) s[pad + i] = x->shape[i];
  int d0 = pad + (int)n->iattr[0], d1 = pad + (int)n->iattr[1];
  memcpy(os, s, sizeof s);
  os[d0] = s[d1], os[d1] = s[d0];
  st[3] = 1, ost[3] = 1;
  for (int i = 2; i >= 0; i--) st[i] = st[i + 1] * s[i + 1], ost[i] = ost[i + 1] * os[i + 1];
  const float *src = F(x);
  float *dst = F(&n->out);
#pragma omp parallel for collapse(2)
  for (int64_t a = 0; a < s[0]; a++)
    for (int64_t b = 0; b < s[1]; b++)
      for (int64_t c = 0; c < s[2]; c++)
        for (int64_t d = 0; d < s[3]; d++) {
          int64_t idx[4] = {a, b, c, d}, t;
          t = idx[d0], idx[d0] = idx[d1], idx[d1] = t;
          dst[idx[0] * ost[0] + idx[1] * ost[1] + idx[2] * ost[2] + idx[3] * ost[3]] =
              src[a * st[0] + b * st[1] + c * st[2] + d * st[3]];
        }
}

/* ---- optimizer ----------------------------------------------------------------------------
 * state: enum kda_state_slot. SCHEDULE: lr for the step about to be taken, then step++.
 * fattr: lr, min_lr_frac, decay_frac; iattr: schedule, warmup, total.                       */
float kda_schedule_lr(int64_t step, const int64_t *ia, const float *fa) {
  float lr = fa[0], lo = fa[0] * fa[1];
  int64_t warm = ia[1], total = ia[2] > 0 ? ia[2] : 1;
  if (warm > 0 && step < warm) return lr * (float)(step + 1) / (float)warm;
  if (ia[0] == KDA_SCHED_COSINE) {
    double prog = total > warm ? (double)(step - warm) / (double)(total - warm) : 1.0;
    if (prog > 1) prog = 1;
    return lo + (lr - lo) * (float)(0.5 * (1.0 + cos(M_PI * prog)));
  }
  if (ia[0] == KDA_SCHED_WSD) {
    int64_t decay = (int64_t)((double)total * fa[2]), start = total - decay;
    if (step < start || decay <= 0) return lr;
    double prog = (double)(step - start) / (double)decay;
    if (prog > 1) prog = 1;
    return lr + (lo - lr) * (float)prog;
  }
  return lr;
}

static void cpu_schedule(const kda_exec_node *n) {
  float *st = F(&n->in[0]);
  st[1] = kda_schedule_lr((int64_t)st[0], n->iattr, n->fattr);
  st[0] += 1.0f;
}

static void cpu_grad_norm(const kda_exec_node *n) {
  double acc = 0;
  for (int i = 0; i < n->nin; i++) {
    const float *g = F(&n->in[i]);
    int64_t cnt = kda_tview_numel(&n->in[i]);
    for (int64_t j = 0; j < cnt; j++) acc += (double)g[j] * g[j];
  }
  F(&n->out)[0] = (float)sqrt(acc);
}

/* AdamW with decoupled decay: p -= lr (mhat / (sqrt(vhat) + eps) + wd p). The gradient is
 * scaled by min(1, clip / gnorm). A non-finite gnorm skips the update (the NaN guard).
 * fattr: beta1, beta2, eps, weight_decay, clip.                                             */
static void cpu_adamw(const kda_exec_node *n) {
  float *p = F(&n->in[0]), *m = F(&n->in[2]), *v = F(&n->in[3]);
  const float *g = F(&n->in[1]);
  float gn = F(&n->in[4])[0];
  const float *st = F(&n->in[5]);
  if (!isfinite(gn) || st[KDA_STATE_SKIP] != 0) return;
  float b1 = n->fattr[0], b2 = n->fattr[1], eps = n->fattr[2], wd = n->fattr[3], clip = n->fattr[4];
  float lr = st[1], t = st[0];
  float gs = (clip > 0 && gn > clip) ? clip / gn : 1.0f;
  float c1 = 1.0f - powf(b1, t), c2 = 1.0f - powf(b2, t);
  int64_t cnt = kda_tview_numel(&n->in[0]);
#pragma omp parallel for
  for (int64_t i = 0; i < cnt; i++) {
    float gi = g[i] * gs;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    p[i] -= lr * ((m[i] / c1) / (sqrtf(v[i] / c2) + eps) + wd * p[i]);
  }
}

/* GUARD: decide whether this step's update is skipped (non-finite loss or grad norm, or a loss
 * spike over fattr0 x the running mean once iattr0 steps have passed), count skips, and keep
 * the loss EMA (decay fattr1) over the steps that were kept.                                 */
static void cpu_guard(const kda_exec_node *n) {
  float *st = F(&n->in[0]);
  float loss = F(&n->in[1])[0], gn = F(&n->in[2])[0], factor = n->fattr[0], decay = n->fattr[1];
  int warm = st[KDA_STATE_STEP] > (float)n->iattr[0];
  int skip = !isfinite(loss) || !isfinite(gn) ||
             (factor > 0 && warm && st[KDA_STATE_LOSS_EMA] > 0 && loss > factor * st[KDA_STATE_LOSS_EMA]);
  st[KDA_STATE_SKIP] = (float)skip;
  st[KDA_STATE_SKIP_RUN] = skip ? st[KDA_STATE_SKIP_RUN] + 1 : 0;
  st[KDA_STATE_SKIPPED] += (float)skip;
  if (!skip) st[KDA_STATE_LOSS_EMA] = st[KDA_STATE_LOSS_EMA] > 0 ? decay * st[KDA_STATE_LOSS_EMA] + (1 - decay) * loss : loss;
}

/* X <- a X + (b A + c A A) X with A = X X^T, five times: drives the singular values of X
 * towards 1 (the quintic Newton-Schulz iteration with Muon's coefficients). X is [r,c], r <= c. */
static void newton_schulz5(float *x, int r, int c, float *a, float *b, float *t) {
  const float ka = 3.4445f, kb = -4.7750f, kc = 2.0315f;
  for (int it = 0; it < 5; it++) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, r, c, 1.0f, x, c, x, c, 0.0f, a, r);
    memcpy(b, a, (size_t)r * r * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, r, r, kc, a, r, a, r, kb, b, r);
    memcpy(t, x, (size_t)r * c * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, c, r, 1.0f, b, r, t, c, ka, x, c);
  }
}

/* Muon: mom = mu mom + g;  u = g + mu mom (Nesterov);  X = NS5(u / |u|_F) (transposed when
 * R > C so the iteration works on the smaller Gram matrix);
 * p -= lr (sqrt(max(1, R/C)) X + wd p). fattr: mu, lr_mult, wd, clip.                      */
static void cpu_muon(const kda_exec_node *n) {
  float *p = F(&n->in[0]), *mom = F(&n->in[2]);
  const float *g = F(&n->in[1]), *st = F(&n->in[4]);
  float gn = F(&n->in[3])[0];
  if (!isfinite(gn) || st[KDA_STATE_SKIP] != 0) return;
  float mu = n->fattr[0], lr = st[KDA_STATE_LR] * n->fattr[1], wd = n->fattr[2], clip = n->fattr[3];
  float gs = (clip > 0 && gn > clip) ? clip / gn : 1.0f;
  int R = (int)n->in[0].shape[0], Cc = (int)n->in[0].shape[1], tr = R > Cc;
  int r = tr ? Cc : R, c = tr ? R : Cc;
  int64_t cnt = (int64_t)R * Cc;
  float *x = malloc((size_t)cnt * sizeof(float) * 2), *t = x + cnt;
  float *a = malloc((size_t)r * r * sizeof(float) * 2), *b = a + (int64_t)r * r;
  KDA_CHECK(x && a); /* r x c scratch: a weight's size, small next to the step */
  double norm = 0;
  for (int64_t i = 0; i < cnt; i++) {
    float gi = g[i] * gs;
    mom[i] = mu * mom[i] + gi;
    float u = gi + mu * mom[i];
    int64_t row = i / Cc, col = i % Cc;
    x[tr ? col * R + row : i] = u;
    norm += (double)u * u;
  }
  float inv = 1.0f / ((float)sqrt(norm) + 1e-7f);
  for (int64_t i = 0; i < cnt; i++) x[i] *= inv;
  newton_schulz5(x, r, c, a, b, t);
  float scale = sqrtf(fmaxf(1.0f, (float)R / (float)Cc));
  for (int64_t i = 0; i < cnt; i++) {
    int64_t row = i / Cc, col = i % Cc;
    p[i] -= lr * (scale * x[tr ? col * R + row : i] + wd * p[i]);
  }
  free(x), free(a);
}

static void cpu_ema(const kda_exec_node *n) {
  float *e = F(&n->in[0]);
  const float *p = F(&n->in[1]), *st = F(&n->in[2]);
  float d = st[KDA_STATE_STEP] <= 1.0f ? 0.0f : n->fattr[0];
  int64_t cnt = kda_tview_numel(&n->in[0]);
  for (int64_t i = 0; i < cnt; i++) e[i] = d * e[i] + (1.0f - d) * p[i];
}

static void cpu_retract(const kda_exec_node *n) {
  float *p = F(&n->in[0]);
  int64_t r = n->in[0].shape[0], c = n->in[0].shape[1];
  for (int64_t i = 0; i < r; i++) {
    double ss = 0;
    for (int64_t j = 0; j < c; j++) ss += (double)p[i * c + j] * p[i * c + j];
    float s = ss > 0 ? (float)(n->fattr[0] / sqrt(ss)) : 1.0f;
    for (int64_t j = 0; j < c; j++) p[i * c + j] *= s;
  }
}

/* ---- dispatch ---------------------------------------------------------------------------- */
int kda_cpu_run_node(const kda_exec_node *n) {
  for (int i = 0; i < n->nin; i++)
    if (n->in[i].dtype == KDA_BF16 || n->in[i].dtype == KDA_F64)
      return kda_set_error("%s: the CPU backend computes in f32; cast input %d (%s) first",
                           kda_op_name(n->op), i, kda_dtype_name(n->in[i].dtype));
  switch (n->op) {
  case KDA_OP_MATMUL: cpu_matmul(n); break;
  case KDA_OP_ADD: cpu_binary(n, 0); break;
  case KDA_OP_MUL: cpu_binary(n, 1); break;
  case KDA_OP_SCALE: case KDA_OP_SILU: case KDA_OP_SILU_BWD: case KDA_OP_GELU:
  case KDA_OP_GELU_BWD: case KDA_OP_SIGMOID: case KDA_OP_SIGMOID_BWD: case KDA_OP_SWIGLU:
    cpu_unary(n); break;
  case KDA_OP_SWIGLU_BWD: cpu_swiglu_bwd(n); break;
  case KDA_OP_SUM_ROWS: cpu_sum_rows(n); break;
  case KDA_OP_EMBED: cpu_embed(n); break;
  case KDA_OP_EMBED_BWD: cpu_embed_bwd(n); break;
  case KDA_OP_RMSNORM: cpu_rmsnorm(n); break;
  case KDA_OP_RMSNORM_BWD: cpu_rmsnorm_bwd(n); break;
  case KDA_OP_SOFTMAX: cpu_softmax(n); break;
  case KDA_OP_SOFTMAX_BWD: cpu_softmax_bwd(n); break;
  case KDA_OP_ROPE: return cpu_rope(n);
  case KDA_OP_ATTENTION: cpu_attention(n); break;
  case KDA_OP_ATTENTION_BWD: cpu_attention_bwd(n); break;
  case KDA_OP_CROSS_ENTROPY: cpu_cross_entropy(n, 0); break;
  case KDA_OP_CROSS_ENTROPY_BWD: cpu_cross_entropy(n, 1); break;
  case KDA_OP_SUM: case KDA_OP_MEAN: cpu_reduce(n); break;
  case KDA_OP_FILL: cpu_fill(n); break;
  case KDA_OP_TRANSPOSE: cpu_transpose(n); break;
  case KDA_OP_GRAD_NORM: cpu_grad_norm(n); break;
  case KDA_OP_SCHEDULE: cpu_schedule(n); break;
  case KDA_OP_ADAMW: cpu_adamw(n); break;
  case KDA_OP_GUARD: cpu_guard(n); break;
  case KDA_OP_MUON: cpu_muon(n); break;
  case KDA_OP_EMA: cpu_ema(n); break;
  case KDA_OP_RETRACT: cpu_retract(n); break;
  case KDA_OP_KDA: case KDA_OP_KDA_BWD: case KDA_OP_CONV1D: case KDA_OP_CONV1D_BWD:
  case KDA_OP_KDA_DECODE: case KDA_OP_CONV1D_DECODE:
    return kda_cpu_kda_node(n);
  case KDA_OP_ATTN_DECODE: return cpu_attn_decode(n);
  case KDA_OP_VIEW: break; /* resolved by the plan: an alias, nothing to compute */
  default: return kda_set_error("%s: no CPU implementation", kda_op_name(n->op));
  }
  return 0;
}

static void *cpu_alloc(int64_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, (size_t)(bytes > 0 ? bytes : 64))) {
    kda_set_error("out of host memory allocating %lld bytes: use a smaller model or batch", (long long)bytes);
    return NULL;
  }
  memset(p, 0, (size_t)(bytes > 0 ? bytes : 64));
  return p;
}
static int cpu_copy(void *dst, const void *src, int64_t bytes) { memcpy(dst, src, (size_t)bytes); return 0; }
static int cpu_run(const kda_exec_node *nodes, int n, int key) {
  (void)key;
  for (int i = 0; i < n; i++)
    if (kda_cpu_run_node(&nodes[i])) return -1;
  return 0;
}

static int cpu_zero(void *dst, int64_t bytes) { memset(dst, 0, (size_t)bytes); return 0; }

const kda_backend *kda_cpu_backend(void) {
  static const kda_backend be = {"cpu", cpu_alloc, free, cpu_copy, cpu_copy, cpu_run, NULL, NULL, cpu_zero, NULL};
  return &be;
}

/* Replaced by kernels/backend_cuda.cu when the binary is built with nvcc. */
__attribute__((weak)) const kda_backend *kda_cuda_backend(void) { return NULL; }
int kda_cuda_available(void) { return kda_cuda_backend() != NULL; }
