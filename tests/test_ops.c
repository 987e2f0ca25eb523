/* test_ops.c — every op: forward against a naive reference written here, backward against
 * central finite differences through a real graph + plan (autodiff rules and backward ops).
 * Prints one line per check and "N passed, N failed".                                      */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "../core/internal.h"
#include "../core/kda.h"
#include "check.h"
#include "../core/kda_ref.h"


static kda_tensor *randt(int ndim, const int64_t *shape, uint64_t seed) {
  kda_tensor *t = kda_tensor_new(KDA_F32, ndim, shape);
  kda_tensor_randn(t, seed, 1.0f);
  return t;
}
static float *D(kda_tensor *t) { return kda_tensor_data(t); }

/* max |a-b| / (max |b| + 1e-6) */
static double rel_err(const float *a, const float *b, int64_t n) {
  double num = 0, den = 1e-6;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(a[i])) return INFINITY;
    num = fmax(num, fabs((double)a[i] - b[i]));
    den = fmax(den, fabs((double)b[i]));
  }
  return num / den;
}

static void expect_close(const char *name, kda_tensor *got, const float *want, double tol) {
  char detail[128];
  if (!got) { check(0, name, kda_last_error()); return; }
  double e = rel_err(D(got), want, kda_tensor_numel(got));
  snprintf(detail, sizeof detail, "relative error %.3g > %.1g", e, tol);
  check(e <= tol, name, detail);
  kda_tensor_free(got);
}

/* ---- forward checks against naive formulas ------------------------------------------------ */
static void fwd_matmul(void) {
  int64_t sa[2] = {5, 7}, sb[2] = {7, 3}, sbt[2] = {3, 7};
  kda_tensor *a = randt(2, sa, 1), *b = randt(2, sb, 2), *bt = randt(2, sbt, 3);
  float want[15], want_t[15];
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 3; j++) {
      double s = 0, st = 0;
      for (int k = 0; k < 7; k++) s += D(a)[i * 7 + k] * D(b)[k * 3 + j], st += D(a)[i * 7 + k] * D(bt)[j * 7 + k];
      want[i * 3 + j] = (float)s, want_t[i * 3 + j] = (float)st;
    }
  kda_tensor *in[2] = {a, b}, *in_t[2] = {a, bt};
  int64_t ia_t[8] = {0, 1};
  expect_close("matmul forward", kda_tensor_op(KDA_OP_MATMUL, 2, in, NULL, NULL), want, 1e-5);
  expect_close("matmul forward, b transposed", kda_tensor_op(KDA_OP_MATMUL, 2, in_t, ia_t, NULL), want_t, 1e-5);
  kda_tensor_free(a), kda_tensor_free(b), kda_tensor_free(bt);
}

static void fwd_rows(void) {
  int64_t s[2] = {4, 6}, sw[1] = {6};
  kda_tensor *x = randt(2, s, 4), *w = randt(1, sw, 5), *y = randt(2, s, 6);
  float rms[24], soft[24], silu[24], gelu[24], sig[24], swi[24], add[24], mul[24];
  for (int i = 0; i < 4; i++) {
    double ss = 0, mx = -1e30, z = 0;
    for (int j = 0; j < 6; j++) ss += D(x)[i * 6 + j] * D(x)[i * 6 + j], mx = fmax(mx, D(x)[i * 6 + j]);
    for (int j = 0; j < 6; j++) z += exp(D(x)[i * 6 + j] - mx);
    for (int j = 0; j < 6; j++) {
      double v = D(x)[i * 6 + j];
      rms[i * 6 + j] = (float)(v / sqrt(ss / 6 + 1e-5) * D(w)[j]);
      soft[i * 6 + j] = (float)(exp(v - mx) / z);
      silu[i * 6 + j] = (float)(v / (1 + exp(-v)));
      gelu[i * 6 + j] = (float)(0.5 * v * (1 + erf(v / sqrt(2.0)))); /* exact GELU: tanh form within 1e-3 */
      sig[i * 6 + j] = (float)(1 / (1 + exp(-v)));
      swi[i * 6 + j] = silu[i * 6 + j] * D(y)[i * 6 + j];
      add[i * 6 + j] = (float)(v + D(w)[j]);
      mul[i * 6 + j] = (float)(v * D(y)[i * 6 + j]);
    }
  }
  float eps[8] = {1e-5f};
  kda_tensor *xw[2] = {x, w}, *xy[2] = {x, y};
  expect_close("rmsnorm forward", kda_tensor_op(KDA_OP_RMSNORM, 2, xw, NULL, eps), rms, 1e-5);
  expect_close("softmax forward", kda_tensor_op(KDA_OP_SOFTMAX, 1, &x, NULL, NULL), soft, 1e-6);
  expect_close("silu forward", kda_tensor_op(KDA_OP_SILU, 1, &x, NULL, NULL), silu, 1e-6);
  expect_close("gelu forward (tanh form vs exact erf)", kda_tensor_op(KDA_OP_GELU, 1, &x, NULL, NULL), gelu, 2e-3);
  expect_close("sigmoid forward", kda_tensor_op(KDA_OP_SIGMOID, 1, &x, NULL, NULL), sig, 1e-6);
  expect_close("swiglu forward", kda_tensor_op(KDA_OP_SWIGLU, 2, xy, NULL, NULL), swi, 1e-6);
  expect_close("add forward, row broadcast", kda_tensor_op(KDA_OP_ADD, 2, xw, NULL, NULL), add, 1e-6);
  expect_close("mul forward", kda_tensor_op(KDA_OP_MUL, 2, xy, NULL, NULL), mul, 1e-6);
  kda_tensor_free(x), kda_tensor_free(w), kda_tensor_free(y);
}

static void fwd_attention_rope(void) {
  enum { B = 2, T = 5, H = 2, Dh = 4 };
  int64_t s[4] = {B, T, H, Dh};
  kda_tensor *q = randt(4, s, 7), *k = randt(4, s, 8), *v = randt(4, s, 9);
  float att[B * T * H * Dh], rope[B * T * H * Dh];
  double sc = 1 / sqrt((double)Dh);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < T; i++) {
        double p[T], mx = -1e30, z = 0;
        for (int j = 0; j <= i; j++) {
          double dot = 0;
          for (int c = 0; c < Dh; c++) dot += D(q)[((b * T + i) * H + h) * Dh + c] * D(k)[((b * T + j) * H + h) * Dh + c];
          p[j] = dot * sc, mx = fmax(mx, p[j]);
        }
        for (int j = 0; j <= i; j++) z += (p[j] = exp(p[j] - mx));
        for (int c = 0; c < Dh; c++) {
          double o = 0;
          for (int j = 0; j <= i; j++) o += p[j] / z * D(v)[((b * T + j) * H + h) * Dh + c];
          att[((b * T + i) * H + h) * Dh + c] = (float)o;
        }
        for (int c = 0; c < Dh / 2; c++) { /* complex rotation of (x_c, x_{c+Dh/2}) by t*theta^(-2c/Dh) */
          double ang = i * pow(10000.0, -2.0 * c / Dh);
          double re = D(q)[((b * T + i) * H + h) * Dh + c], im = D(q)[((b * T + i) * H + h) * Dh + c + Dh / 2];
          rope[((b * T + i) * H + h) * Dh + c] = (float)(re * cos(ang) - im * sin(ang));
          rope[((b * T + i) * H + h) * Dh + c + Dh / 2] = (float)(re * sin(ang) + im * cos(ang));
        }
      }
  kda_tensor *qkv[3] = {q, k, v};
  float theta[8] = {10000};
  expect_close("attention forward (causal)", kda_tensor_op(KDA_OP_ATTENTION, 3, qkv, NULL, NULL), att, 1e-5);
  expect_close("rope forward", kda_tensor_op(KDA_OP_ROPE, 1, &q, NULL, theta), rope, 1e-5);
  kda_tensor_free(q), kda_tensor_free(k), kda_tensor_free(v);
}

static void fwd_loss_embed(void) {
  int64_t s[2] = {3, 5}, st[1] = {3};
  kda_tensor *z = randt(2, s, 10), *t = kda_tensor_new(KDA_I32, 1, st), *e = kda_tensor_new(KDA_I32, 1, st);
  int32_t *ti = kda_tensor_data(t), *ei = kda_tensor_data(e);
  ti[0] = 4, ti[1] = 0, ti[2] = 2; /* targets in 0..4 */
  ei[0] = 2, ei[1] = 0, ei[2] = 2; /* embedding rows in 0..2 */
  float ce[3], emb[15];
  for (int i = 0; i < 3; i++) {
    double zs = 0;
    for (int j = 0; j < 5; j++) zs += exp(D(z)[i * 5 + j]);
    ce[i] = (float)((log(zs) - D(z)[i * 5 + ti[i]]) / log(2.0));
    for (int j = 0; j < 5; j++) emb[i * 5 + j] = D(z)[ei[i] * 5 + j];
  }
  kda_tensor *zt[2] = {z, t}, *ze[2] = {z, e};
  expect_close("cross_entropy forward (bits)", kda_tensor_op(KDA_OP_CROSS_ENTROPY, 2, zt, NULL, NULL), ce, 1e-5);
  expect_close("embed forward", kda_tensor_op(KDA_OP_EMBED, 2, ze, NULL, NULL), emb, 0);
  int64_t tr[8] = {0, 1};
  float zt_want[15];
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 5; j++) zt_want[j * 3 + i] = D(z)[i * 5 + j];
  expect_close("transpose forward", kda_tensor_op(KDA_OP_TRANSPOSE, 1, &z, tr, NULL), zt_want, 0);
  double sum = 0;
  for (int i = 0; i < 15; i++) sum += D(z)[i];
  float want_sum = (float)sum, want_mean = (float)(sum / 15);
  expect_close("sum forward", kda_tensor_op(KDA_OP_SUM, 1, &z, NULL, NULL), &want_sum, 1e-6);
  expect_close("mean forward", kda_tensor_op(KDA_OP_MEAN, 1, &z, NULL, NULL), &want_mean, 1e-6);
  kda_tensor_free(z), kda_tensor_free(t), kda_tensor_free(e);
}

/* ---- backward: graph gradients vs central differences -------------------------------------
 * loss = sum(op(params...) * R) for a fixed random R; each parameter's analytic gradient from
 * kda_graph_backward is compared with (L(p+h) - L(p-h)) / 2h at every element.             */
typedef int32_t (*build_fn)(kda_graph *g, int32_t *p, int np);

static int32_t weighted_sum(kda_graph *g, int32_t y) {
  int64_t shape[4];
  int nd = kda_graph_node_ndim(g, y);
  for (int i = 0; i < nd; i++) shape[i] = kda_graph_node_dim(g, y, i);
  int32_t r = kda_graph_input(g, "R", KDA_F32, nd, shape);
  int32_t in[2] = {y, r};
  int32_t m = kda_graph_op(g, KDA_OP_MUL, 2, in, NULL, NULL);
  return kda_graph_op(g, KDA_OP_SUM, 1, &m, NULL, NULL);
}

static void gradcheck(const char *name, int np, const int64_t (*shapes)[5], build_fn build, double tol) {
  kda_graph *g = kda_graph_new();
  int32_t p[8];
  char pname[16];
  for (int i = 0; i < np; i++) {
    snprintf(pname, sizeof pname, "p%d", i);
    p[i] = kda_graph_param(g, pname, (int)shapes[i][0], &shapes[i][1], KDA_INIT_NORMAL, 1.0f, 0);
  }
  int32_t y = build(g, p, np);
  int32_t loss = y >= 0 ? weighted_sum(g, y) : -1;
  if (loss < 0 || kda_graph_backward(g, loss)) { check(0, name, kda_last_error()); kda_graph_free(g); return; }
  kda_plan *pl = kda_plan_build(g, KDA_BACKEND_CPU);
  if (!pl) { check(0, name, kda_last_error()); kda_graph_free(g); return; }
  kda_plan_init_params(pl, 42);
  int32_t r = kda_graph_find(g, "R");
  int64_t rn = 1;
  for (int i = 0; i < kda_graph_node_ndim(g, r); i++) rn *= kda_graph_node_dim(g, r, i);
  float *rv = malloc((size_t)rn * 4);
  kda_fill_normal(rv, rn, 99, 1.0f);
  kda_plan_write(pl, r, rv, rn * 4);
  kda_plan_run(pl, KDA_RUN_STEP);
  double worst = 0;
  float *grads[8];
  for (int i = 0; i < np; i++) { /* read every gradient before forward runs reuse the arena */
    int64_t n = 1;
    for (int d = 0; d < shapes[i][0]; d++) n *= shapes[i][1 + d];
    grads[i] = malloc((size_t)n * 4);
    kda_plan_read(pl, kda_graph_grad(g, p[i]), grads[i], n * 4);
  }
  for (int i = 0; i < np; i++) {
    int64_t n = 1;
    for (int d = 0; d < shapes[i][0]; d++) n *= shapes[i][1 + d];
    float *x = malloc((size_t)n * 4), *gr = grads[i];
    kda_plan_read(pl, p[i], x, n * 4);
    for (int64_t j = 0; j < n; j++) {
      float orig = x[j], h = 1e-2f * fmaxf(1.0f, fabsf(orig)), lp, lm;
      x[j] = orig + h; kda_plan_write(pl, p[i], x, n * 4); kda_plan_run(pl, KDA_RUN_FORWARD); kda_plan_read(pl, loss, &lp, 4);
      x[j] = orig - h; kda_plan_write(pl, p[i], x, n * 4); kda_plan_run(pl, KDA_RUN_FORWARD); kda_plan_read(pl, loss, &lm, 4);
      x[j] = orig;
      double fd = ((double)lp - lm) / (2.0 * h), err = fabs(fd - gr[j]) / fmax(1.0, fabs(fd));
      if (err > worst || !isfinite(gr[j])) worst = isfinite(gr[j]) ? err : INFINITY;
    }
    kda_plan_write(pl, p[i], x, n * 4);
    free(x), free(gr);
  }
  char detail[96];
  snprintf(detail, sizeof detail, "worst gradient error %.3g > %.1g", worst, tol);
  check(worst <= tol, name, detail);
  free(rv);
  kda_plan_free(pl);
  kda_graph_free(g);
}

static int32_t op1(kda_graph *g, int op, int32_t a, const int64_t *ia, const float *fa) { return kda_graph_op(g, op, 1, &a, ia, fa); }
static int32_t op2(kda_graph *g, int op, int32_t a, int32_t b, const int64_t *ia, const float *fa) {
  int32_t in[2] = {a, b};
  return kda_graph_op(g, op, 2, in, ia, fa);
}

static int32_t b_matmul(kda_graph *g, int32_t *p, int np) { (void)np; return op2(g, KDA_OP_MATMUL, p[0], p[1], NULL, NULL); }
static int32_t b_matmul_tb(kda_graph *g, int32_t *p, int np) { (void)np; int64_t ia[8] = {0, 1}; return op2(g, KDA_OP_MATMUL, p[0], p[1], ia, NULL); }
static int32_t b_matmul_ta(kda_graph *g, int32_t *p, int np) { (void)np; int64_t ia[8] = {1, 0}; return op2(g, KDA_OP_MATMUL, p[0], p[1], ia, NULL); }
static int32_t b_matmul_batched(kda_graph *g, int32_t *p, int np) { (void)np; return op2(g, KDA_OP_MATMUL, p[0], p[1], NULL, NULL); }
static int32_t b_add_bcast(kda_graph *g, int32_t *p, int np) { (void)np; return op2(g, KDA_OP_ADD, p[0], p[1], NULL, NULL); }
static int32_t b_mul(kda_graph *g, int32_t *p, int np) { (void)np; return op2(g, KDA_OP_MUL, p[0], p[1], NULL, NULL); }
static int32_t b_mul_bcast(kda_graph *g, int32_t *p, int np) { (void)np; return op2(g, KDA_OP_MUL, p[0], p[1], NULL, NULL); }
static int32_t b_scale(kda_graph *g, int32_t *p, int np) { (void)np; float f[8] = {-1.5f}; return op1(g, KDA_OP_SCALE, p[0], NULL, f); }
static int32_t b_rmsnorm(kda_graph *g, int32_t *p, int np) { (void)np; float f[8] = {1e-5f}; return op2(g, KDA_OP_RMSNORM, p[0], p[1], NULL, f); }
static int32_t b_silu(kda_graph *g, int32_t *p, int np) { (void)np; return op1(g, KDA_OP_SILU, p[0], NULL, NULL); }
static int32_t b_gelu(kda_graph *g, int32_t *p, int np) { (void)np; return op1(g, KDA_OP_GELU, p[0], NULL, NULL); }
static int32_t b_sigmoid(kda_graph *g, int32_t *p, int np) { (void)np; return op1(g, KDA_OP_SIGMOID, p[0], NULL, NULL); }
static int32_t b_softmax(kda_graph *g, int32_t *p, int np) { (void)np; return op1(g, KDA_OP_SOFTMAX, p[0], NULL, NULL); }
static int32_t b_swiglu(kda_graph *g, int32_t *p, int np) { (void)np; return op2(g, KDA_OP_SWIGLU, p[0], p[1], NULL, NULL); }
static int32_t b_rope(kda_graph *g, int32_t *p, int np) { (void)np; float f[8] = {10000}; return op1(g, KDA_OP_ROPE, p[0], NULL, f); }
static int32_t b_transpose(kda_graph *g, int32_t *p, int np) { (void)np; int64_t ia[8] = {0, 2}; return op1(g, KDA_OP_TRANSPOSE, p[0], ia, NULL); }
static int32_t b_view(kda_graph *g, int32_t *p, int np) { (void)np; int64_t ia[8] = {0, 2, 6, 3}; return op1(g, KDA_OP_SILU, op1(g, KDA_OP_VIEW, p[0], ia, NULL), NULL, NULL); }
static int32_t b_mean(kda_graph *g, int32_t *p, int np) { (void)np; return op1(g, KDA_OP_SILU, op1(g, KDA_OP_MEAN, p[0], NULL, NULL), NULL, NULL); }
static int32_t b_sum_rows(kda_graph *g, int32_t *p, int np) { (void)np; return op1(g, KDA_OP_SUM_ROWS, op1(g, KDA_OP_SILU, p[0], NULL, NULL), NULL, NULL); }
static int32_t b_attention(kda_graph *g, int32_t *p, int np) {
  (void)np;
  int32_t in[3] = {p[0], p[1], p[2]};
  return kda_graph_op(g, KDA_OP_ATTENTION, 3, in, NULL, NULL);
}
static int32_t b_embed(kda_graph *g, int32_t *p, int np) {
  (void)np;
  int64_t s[1] = {7};
  int32_t idx = kda_graph_input(g, "idx", KDA_I32, 1, s); /* zeros: every row hits table row 0 */
  return op2(g, KDA_OP_EMBED, p[0], idx, NULL, NULL);
}
static int32_t b_cross_entropy(kda_graph *g, int32_t *p, int np) {
  (void)np;
  int64_t s[1] = {4};
  int32_t t = kda_graph_input(g, "targets", KDA_I32, 1, s);
  return op2(g, KDA_OP_CROSS_ENTROPY, p[0], t, NULL, NULL);
}
/* KDA: 7 params q, k, v, g_raw, beta_raw, A_log, dt_bias; chunk 4 so T = 7 crosses a chunk. */
static int64_t kda_ia[8];
static float kda_fa[8];
static int32_t b_kda(kda_graph *g, int32_t *p, int np) { (void)np; return kda_graph_op(g, KDA_OP_KDA, 7, p, kda_ia, kda_fa); }
static int32_t b_conv(kda_graph *g, int32_t *p, int np) { (void)np; int64_t ia[8] = {0}; return op2(g, KDA_OP_CONV1D, p[0], p[1], ia, NULL); }
static int32_t b_conv_silu(kda_graph *g, int32_t *p, int np) { (void)np; int64_t ia[8] = {1}; return op2(g, KDA_OP_CONV1D, p[0], p[1], ia, NULL); }

/* KDA op forward (through kda_tensor_op, fp32 chunked) vs the fp64 token recurrence. */
static void fwd_kda(int64_t chunk_attr, const char *name) {
  enum { B = 2, T = 70, H = 2, HV = 4, K = 8, V = 4 };
  int64_t sq[4] = {B, T, H, K}, sv[4] = {B, T, HV, V}, sg[4] = {B, T, HV, K}, sb[3] = {B, T, HV};
  int64_t sa[1] = {HV}, sd[1] = {HV * K};
  kda_tensor *in[7] = {randt(4, sq, 21), randt(4, sq, 22), randt(4, sv, 23), randt(4, sg, 24),
                       randt(3, sb, 25), randt(1, sa, 26), randt(1, sd, 27)};
  kda_tensor *dd[7];
  double *dp[7];
  for (int i = 0; i < 7; i++) {
    dd[i] = kda_tensor_cast(in[i], KDA_F64);
    dp[i] = kda_tensor_data(dd[i]);
  }
  kda_kda_args a = {B, T, H, HV, K, V, 0.0f, KDA_GATE_SOFTPLUS, 0.0f, 1, KDA_BETA_SIGMOID, 64, NULL, 0, 0, 0};
  static double o64[B * T * HV * V];
  static float want[B * T * HV * V];
  if (kda_kdaref_recurrent64(&a, dp[0], dp[1], dp[2], dp[3], dp[4], dp[5], dp[6], NULL, o64, NULL)) {
    check(0, name, kda_last_error());
  } else {
    for (int i = 0; i < B * T * HV * V; i++) want[i] = (float)o64[i];
    int64_t ia[8] = {1, 1, 1, chunk_attr};
    expect_close(name, kda_tensor_op(KDA_OP_KDA, 7, in, ia, NULL), want, 1e-4);
  }
  for (int i = 0; i < 7; i++) kda_tensor_free(in[i]), kda_tensor_free(dd[i]);
}

static void fwd_conv(void) {
  enum { B = 2, T = 6, C = 3, W = 4 };
  int64_t sx[3] = {B, T, C}, sw[2] = {C, W};
  kda_tensor *x = randt(3, sx, 31), *w = randt(2, sw, 32);
  float want[B * T * C], want_silu[B * T * C];
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++) {
        double y = 0;
        for (int j = 0; j < W; j++) {
          int tt = t - W + 1 + j;
          if (tt >= 0) y += D(w)[c * W + j] * D(x)[(b * T + tt) * C + c];
        }
        want[(b * T + t) * C + c] = (float)y;
        want_silu[(b * T + t) * C + c] = (float)(y / (1 + exp(-y)));
      }
  kda_tensor *xw[2] = {x, w};
  int64_t ia0[8] = {0}, ia1[8] = {1};
  expect_close("conv1d forward (depthwise causal)", kda_tensor_op(KDA_OP_CONV1D, 2, xw, ia0, NULL), want, 1e-6);
  expect_close("conv1d forward, fused silu", kda_tensor_op(KDA_OP_CONV1D, 2, xw, ia1, NULL), want_silu, 1e-6);
  kda_tensor_free(x), kda_tensor_free(w);
}

/* ---- decode ops: token by token against the full-sequence ops ---------------------------- */
static kda_tensor *row_view(kda_tensor *x, int64_t t, int ndim) { /* [1,1,...] row t of [1,T,...] */
  int64_t sh[4] = {1, 1, 1, 1}, per = 1;
  for (int i = 2; i < ndim; i++) sh[i] = kda_tensor_dim(x, i), per *= sh[i];
  return kda_tensor_view(x, t * per, ndim, sh);
}
static kda_tensor *pos_tensor(int32_t p) {
  int64_t s1[1] = {1};
  kda_tensor *t = kda_tensor_new(KDA_I32, 1, s1);
  *(int32_t *)kda_tensor_data(t) = p;
  return t;
}
/* Runs a decode op once per row and packs the outputs; NULL (error set) on failure. */
static kda_tensor *collect(kda_tensor *full_like, int64_t t, kda_tensor *step_out) {
  if (!step_out) return NULL;
  int64_t per = kda_tensor_numel(step_out);
  memcpy(D(full_like) + t * per, D(step_out), (size_t)per * sizeof(float));
  kda_tensor_free(step_out);
  return full_like;
}

static void fwd_decode(void) {
  enum { T = 9, H = 2, Dh = 6, Tmax = 12 };
  /* ROPE at an offset: [2,T,H,Dh] one row (and two rows) at a time vs the whole sequence */
  {
    int64_t s[4] = {2, T, H, Dh};
    kda_tensor *x = randt(4, s, 41);
    float theta[8] = {500};
    kda_tensor *full = kda_tensor_op(KDA_OP_ROPE, 1, &x, NULL, theta), *got = kda_tensor_new(KDA_F32, 4, s);
    int ok = full != NULL;
    for (int b = 0; b < 2 && ok; b++)
      for (int t = 0; t < T && ok; t += 2) {
        int64_t n = t + 2 <= T ? 2 : 1, sh[4] = {1, n, H, Dh};
        kda_tensor *xv = kda_tensor_view(x, (b * T + t) * H * Dh, 4, sh), *pos = pos_tensor(t);
        kda_tensor *in[2] = {xv, pos}, *y = kda_tensor_op(KDA_OP_ROPE, 2, in, NULL, theta);
        if (!y) ok = 0;
        else memcpy(D(got) + (b * T + t) * H * Dh, D(y), (size_t)(n * H * Dh) * sizeof(float)), kda_tensor_free(y);
        kda_tensor_free(xv), kda_tensor_free(pos);
      }
    if (!ok) check(0, "rope at an offset == rope over the sequence", kda_last_error()), kda_tensor_free(got);
    else expect_close("rope at an offset == rope over the sequence", got, D(full), 1e-6);
    /* and the offset matters: pos 3 on row 0 equals row 3 of the full rope only when x matches */
    kda_tensor_free(full), kda_tensor_free(x);
  }
  /* ATTN_DECODE: T calls with the caches vs ATTENTION over [1,T,H,Dh] */
  {
    int64_t s[4] = {1, T, H, Dh}, sc[3] = {Tmax, H, Dh};
    kda_tensor *q = randt(4, s, 42), *k = randt(4, s, 43), *v = randt(4, s, 44);
    kda_tensor *kc = kda_tensor_new(KDA_F32, 3, sc), *vc = kda_tensor_new(KDA_F32, 3, sc);
    kda_tensor *qkv[3] = {q, k, v}, *full = kda_tensor_op(KDA_OP_ATTENTION, 3, qkv, NULL, NULL);
    kda_tensor *got = kda_tensor_new(KDA_F32, 4, s);
    for (int t = 0; t < T && got; t++) {
      kda_tensor *qv = row_view(q, t, 4), *kv = row_view(k, t, 4), *vv = row_view(v, t, 4), *pos = pos_tensor(t);
      kda_tensor *in[6] = {qv, kv, vv, kc, vc, pos};
      kda_tensor *y = kda_tensor_op(KDA_OP_ATTN_DECODE, 6, in, NULL, NULL);
      if (!collect(got, t, y)) kda_tensor_free(got), got = NULL;
      kda_tensor_free(qv), kda_tensor_free(kv), kda_tensor_free(vv), kda_tensor_free(pos);
    }
    if (!got || !full) check(0, "attn_decode x T == attention", kda_last_error()), kda_tensor_free(got);
    else expect_close("attn_decode x T == attention", got, D(full), 1e-6);
    check(D(kc)[(T - 1) * H * Dh + 1] == D(k)[(T - 1) * H * Dh + 1] && D(kc)[T * H * Dh] == 0,
          "attn_decode writes k at row pos of the cache, nothing past it", "cache row differs");
    kda_tensor *qv = row_view(q, 0, 4), *pos = pos_tensor(Tmax);
    kda_tensor *in[6] = {qv, qv, qv, kc, vc, pos};
    kda_tensor *y = kda_tensor_op(KDA_OP_ATTN_DECODE, 6, in, NULL, NULL);
    check(!y && strstr(kda_last_error(), "outside the cache"), "attn_decode past the cache is an error", kda_last_error());
    kda_tensor_free(y), kda_tensor_free(qv), kda_tensor_free(pos);
    kda_tensor_free(full), kda_tensor_free(q), kda_tensor_free(k), kda_tensor_free(v), kda_tensor_free(kc), kda_tensor_free(vc);
  }
  /* CONV1D_DECODE: T calls with the cache vs CONV1D over [1,T,C], with and without SiLU */
  for (int silu = 0; silu < 2; silu++) {
    enum { C = 5, W = 4 };
    int64_t sx[3] = {1, T, C}, sw[2] = {C, W};
    kda_tensor *x = randt(3, sx, 45), *w = randt(2, sw, 46), *cache = kda_tensor_new(KDA_F32, 2, sw);
    int64_t ia[8] = {silu};
    kda_tensor *xw[2] = {x, w}, *full = kda_tensor_op(KDA_OP_CONV1D, 2, xw, ia, NULL), *got = kda_tensor_new(KDA_F32, 3, sx);
    for (int t = 0; t < T && got; t++) {
      kda_tensor *xv = row_view(x, t, 3), *in[3] = {xv, w, cache};
      if (!collect(got, t, kda_tensor_op(KDA_OP_CONV1D_DECODE, 3, in, ia, NULL))) kda_tensor_free(got), got = NULL;
      kda_tensor_free(xv);
    }
    const char *name = silu ? "conv1d_decode x T == conv1d (fused silu)" : "conv1d_decode x T == conv1d";
    if (!got || !full) check(0, name, kda_last_error()), kda_tensor_free(got);
    else expect_close(name, got, D(full), 1e-6);
    kda_tensor_free(full), kda_tensor_free(x), kda_tensor_free(w), kda_tensor_free(cache);
  }
  /* KDA_DECODE: T recurrent steps vs the chunked KDA (chunk 4, so several chunks), GVA */
  {
    enum { KH = 2, HV = 4, K = 8, V = 4, KT = 11 };
    int64_t sq[4] = {1, KT, KH, K}, sv[4] = {1, KT, HV, V}, sg[4] = {1, KT, HV, K}, sb[3] = {1, KT, HV};
    int64_t sa[1] = {HV}, sd[1] = {HV * K}, ss[3] = {HV, K, V};
    kda_tensor *in[7] = {randt(4, sq, 51), randt(4, sq, 52), randt(4, sv, 53), randt(4, sg, 54),
                         randt(3, sb, 55), randt(1, sa, 56), randt(1, sd, 57)};
    kda_tensor *state = kda_tensor_new(KDA_F32, 3, ss);
    int64_t ia[8] = {KDA_GATE_SOFTPLUS, 1, KDA_BETA_SIGMOID, 4};
    kda_tensor *full = kda_tensor_op(KDA_OP_KDA, 7, in, ia, NULL), *got = kda_tensor_new(KDA_F32, 4, sv);
    for (int t = 0; t < KT && got; t++) {
      kda_tensor *st[8] = {row_view(in[0], t, 4), row_view(in[1], t, 4), row_view(in[2], t, 4),
                           row_view(in[3], t, 4), row_view(in[4], t, 3), in[5], in[6], state};
      if (!collect(got, t, kda_tensor_op(KDA_OP_KDA_DECODE, 8, st, ia, NULL))) kda_tensor_free(got), got = NULL;
      for (int i = 0; i < 5; i++) kda_tensor_free(st[i]);
    }
    if (!got || !full) check(0, "kda_decode x T == kda (chunked)", kda_last_error()), kda_tensor_free(got);
    else expect_close("kda_decode x T == kda (chunked)", got, D(full), 1e-4);
    double ss2 = 0;
    for (int64_t i = 0; i < kda_tensor_numel(state); i++) ss2 += D(state)[i] * D(state)[i];
    check(ss2 > 0, "kda_decode updates its state in place", "state still zero");
    kda_tensor_free(full), kda_tensor_free(state);
    for (int i = 0; i < 7; i++) kda_tensor_free(in[i]);
  }
}

/* The planner: a decode op's state leaf stays persistent (outside the arena), its output is an
 * arena buffer, and a plan run T times with pos written each step reproduces ATTENTION. */
static void plan_decode(void) {
  enum { T = 7, H = 2, Dh = 4 };
  int64_t s1[4] = {1, 1, H, Dh}, sc[3] = {T, H, Dh}, sp[1] = {1}, sf[4] = {1, T, H, Dh};
  kda_graph *g = kda_graph_new();
  int32_t q = kda_graph_input(g, "q", KDA_F32, 4, s1), k = kda_graph_input(g, "k", KDA_F32, 4, s1);
  int32_t v = kda_graph_input(g, "v", KDA_F32, 4, s1), pos = kda_graph_input(g, "pos", KDA_I32, 1, sp);
  int32_t kc = kda_graph_input(g, "k_cache", KDA_F32, 3, sc), vc = kda_graph_input(g, "v_cache", KDA_F32, 3, sc);
  int32_t in[6] = {q, k, v, kc, vc, pos};
  int32_t o = kda_graph_op(g, KDA_OP_ATTN_DECODE, 6, in, NULL, NULL);
  int32_t y = kda_graph_op(g, KDA_OP_SCALE, 1, &o, NULL, (float[8]){2.0f});
  kda_graph_keep(g, y);
  kda_plan *p = o >= 0 && y >= 0 ? kda_plan_build(g, KDA_BACKEND_CPU) : NULL;
  if (!p) { check(0, "decode plan builds", kda_last_error()); kda_graph_free(g); return; }
  check(kda_plan_node_offset(p, kc) == -1 && kda_plan_node_offset(p, vc) == -1 && kda_plan_node_offset(p, o) >= 0,
        "decode plan: caches persistent, the op's output in the arena", "a cache is in the arena");
  kda_tensor *Q = randt(4, sf, 61), *K = randt(4, sf, 62), *V = randt(4, sf, 63), *got = kda_tensor_new(KDA_F32, 4, sf);
  int ok = 1;
  for (int32_t t = 0; t < T && ok; t++) {
    int64_t b = H * Dh * 4;
    ok = !kda_plan_write(p, q, D(Q) + t * H * Dh, b) && !kda_plan_write(p, k, D(K) + t * H * Dh, b) &&
         !kda_plan_write(p, v, D(V) + t * H * Dh, b) && !kda_plan_write(p, pos, &t, 4) &&
         !kda_plan_run(p, KDA_RUN_FORWARD) && !kda_plan_read(p, y, D(got) + t * H * Dh, b);
  }
  kda_tensor *qkv[3] = {Q, K, V}, *full = kda_tensor_op(KDA_OP_ATTENTION, 3, qkv, NULL, NULL);
  if (ok && full) for (int64_t i = 0; i < kda_tensor_numel(full); i++) D(full)[i] *= 2;
  if (!ok || !full) check(0, "decode plan x T == attention", kda_last_error()), kda_tensor_free(got);
  else expect_close("decode plan x T == attention", got, D(full), 1e-6);
  kda_tensor_free(full), kda_tensor_free(Q), kda_tensor_free(K), kda_tensor_free(V);
  kda_plan_free(p);
  kda_graph_free(g);
}

/* a parameter used twice: gradients must add up */
static int32_t b_reuse(kda_graph *g, int32_t *p, int np) { (void)np; return op2(g, KDA_OP_MUL, op1(g, KDA_OP_SILU, p[0], NULL, NULL), p[0], NULL, NULL); }

/* Parameter init runs on every core: its values must be the sequential generator's. The
 * reference below is the one-thread loop (splitmix64 draws, Box-Muller pairs) written out. */
static uint64_t ref_splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static void init_threads_equal_sequential(void) {
  const int64_t n = 300001;   /* above the threading threshold, odd: the last pair is half used */
  float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
  kda_fill_normal(got, n, 12345, 0.02f);
  uint64_t s = 12345;
  for (int64_t i = 0; i < n; i += 2) {
    double u1 = ((double)(ref_splitmix(&s) >> 11) + 0.5) * 0x1.0p-53, u2 = ((double)(ref_splitmix(&s) >> 11) + 0.5) * 0x1.0p-53;
    double r = sqrt(-2.0 * log(u1));
    want[i] = (float)(r * cos(2 * M_PI * u2)) * 0.02f;
    if (i + 1 < n) want[i + 1] = (float)(r * sin(2 * M_PI * u2)) * 0.02f;
  }
  check(memcmp(got, want, n * sizeof(float)) == 0, "normal init on all cores == the sequential generator, bit for bit",
        "values differ");
  free(got), free(want);
}

/* The normal init in pieces of odd sizes at odd offsets (as the CUDA upload fills its pinned
 * buffers) == one fill of the whole, bit for bit, ranges starting or ending inside a pair too. */
static void init_range_equals_whole(void) {
  const int64_t n = 300001;
  float *whole = malloc(n * sizeof(float)), *pieces = malloc(n * sizeof(float));
  kda_fill_normal(whole, n, 12345, 0.02f);
  static const int64_t sizes[] = {1, 3, 2, 70001, 5, 65537, 131071, 4, 7};
  int64_t at = 0;
  for (int k = 0; at < n; k++) {
    int64_t c = sizes[k % 9] < n - at ? sizes[k % 9] : n - at;
    kda_fill_normal_range(pieces + at, at, c, 12345, 0.02f);
    at += c;
  }
  int ok = memcmp(whole, pieces, n * sizeof(float)) == 0;
  for (int64_t first = 0; first < 9 && ok; first++)
    for (int64_t count = 0; first + count <= 20 && ok; count++) {
      float y[20];
      kda_fill_normal_range(y, first, count, 12345, 0.02f);
      ok = memcmp(y, whole + first, (size_t)count * sizeof(float)) == 0;
    }
  check(ok, "normal init in pieces at odd offsets == one fill, bit for bit", "values differ");
  free(whole), free(pieces);
}

/* The CPU profile counts the nodes it ran per op (kda_plan_op_calls). */
static void plan_op_calls(void) {
  kda_graph *g = kda_graph_new();
  int64_t sh[2] = {3, 4};
  int32_t x = kda_graph_input(g, "x", KDA_F32, 2, sh);
  int32_t a = kda_graph_op(g, KDA_OP_SILU, 1, &x, NULL, NULL), b = kda_graph_op(g, KDA_OP_SILU, 1, &a, NULL, NULL);
  int32_t ab[2] = {a, b}, c = kda_graph_op(g, KDA_OP_ADD, 2, ab, NULL, NULL);
  kda_graph_keep(g, c);
  kda_plan *p = kda_plan_build(g, KDA_BACKEND_CPU);
  int ok = p && !kda_plan_set_profile(p, 1) && !kda_plan_run(p, KDA_RUN_STEP) && !kda_plan_run(p, KDA_RUN_STEP);
  check(ok && kda_plan_op_calls(p, KDA_OP_SILU) == 4 && kda_plan_op_calls(p, KDA_OP_ADD) == 2 &&
        kda_plan_op_calls(p, KDA_OP_MATMUL) == 0, "profiled plan counts nodes per op (2 runs: silu 4, add 2)",
        ok ? "wrong counts" : kda_last_error());
  kda_plan_free(p);
  kda_graph_free(g);
}

/* The plan pairs a mean loss's CROSS_ENTROPY with its backward (kda_exec_node.fuse_offset):
 * the backward's buffer lives from the forward node on. A dloss known only at run time (a
 * loss weighted by an input) is not paired. */
static void plan_pairs_cross_entropy(void) {
  for (int weighted = 0; weighted < 2; weighted++) {
    kda_graph *g = kda_graph_new();
    int64_t sx[2] = {4, 6}, sw[2] = {6, 5}, st[1] = {4};
    int32_t x = kda_graph_input(g, "x", KDA_F32, 2, sx), t = kda_graph_input(g, "t", KDA_I32, 1, st);
    int32_t wt = kda_graph_input(g, "wt", KDA_F32, 1, st);
    int32_t w = kda_graph_param(g, "w", 2, sw, KDA_INIT_NORMAL, 0.1f, 0);
    int32_t xw[2] = {x, w}, z = kda_graph_op(g, KDA_OP_MATMUL, 2, xw, NULL, NULL);
    int32_t zt[2] = {z, t}, ce = kda_graph_op(g, KDA_OP_CROSS_ENTROPY, 2, zt, NULL, NULL), l = ce;
    if (weighted) { int32_t cw[2] = {ce, wt}; l = kda_graph_op(g, KDA_OP_MUL, 2, cw, NULL, NULL); }
    int32_t loss = kda_graph_op(g, KDA_OP_MEAN, 1, &l, NULL, NULL);
    int ok = loss >= 0 && !kda_graph_backward(g, loss);
    int32_t bwd = -1, first = -1, last = -1;
    for (int32_t i = 0; i < kda_graph_nnodes(g); i++)
      if (kda_graph_node_op(g, i) == KDA_OP_CROSS_ENTROPY_BWD) bwd = i;
    kda_plan *p = ok ? kda_plan_build(g, KDA_BACKEND_CPU) : NULL;
    ok = p && bwd >= 0 && kda_plan_node_live(p, bwd, &first, &last) == 0;
    int want = weighted ? bwd : ce;
    char nm[160];
    snprintf(nm, sizeof nm, "plan: %s loss's cross-entropy backward buffer lives from node %d (got %d)",
             weighted ? "a weighted" : "a mean", want, first);
    check(ok && first == want, nm, ok ? "wrong lifetime" : kda_last_error());
    kda_plan_free(p);
    kda_graph_free(g);
  }
}

int main(void) {
  init_threads_equal_sequential();
  init_range_equals_whole();
  plan_op_calls();
  plan_pairs_cross_entropy();
  fwd_matmul();
  fwd_rows();
  fwd_attention_rope();
  fwd_loss_embed();
  fwd_conv();
  fwd_kda(16, "kda forward (chunk 16) vs fp64 recurrence");
  fwd_decode();
  plan_decode();
  fwd_kda(0, "kda forward (default chunk 64, T=70) vs fp64 recurrence");

  static const int64_t mm[2][5] = {{2, 3, 4}, {2, 4, 5}}, mmt[2][5] = {{2, 3, 4}, {2, 5, 4}};
  static const int64_t mma[2][5] = {{2, 4, 3}, {2, 4, 5}}, mmb[2][5] = {{3, 2, 3, 4}, {2, 4, 5}};
  static const int64_t rowv[2][5] = {{2, 3, 6}, {1, 6}}, two[2][5] = {{2, 3, 6}, {2, 3, 6}};
  static const int64_t one[1][5] = {{2, 3, 6}}, r4[1][5] = {{4, 2, 3, 2, 4}};
  static const int64_t qkv[3][5] = {{4, 2, 5, 2, 4}, {4, 2, 5, 2, 4}, {4, 2, 5, 2, 4}};
  static const int64_t emb[1][5] = {{2, 3, 4}}, ce[1][5] = {{2, 4, 6}}, t3[1][5] = {{3, 2, 3, 2}};
  gradcheck("matmul backward", 2, mm, b_matmul, 2e-2);
  gradcheck("matmul backward, b transposed", 2, mmt, b_matmul_tb, 2e-2);
  gradcheck("matmul backward, a transposed", 2, mma, b_matmul_ta, 2e-2);
  gradcheck("matmul backward, 3-D a with shared b", 2, mmb, b_matmul_batched, 2e-2);
  gradcheck("add backward, row broadcast", 2, rowv, b_add_bcast, 2e-2);
  gradcheck("mul backward", 2, two, b_mul, 2e-2);
  gradcheck("mul backward, row broadcast", 2, rowv, b_mul_bcast, 2e-2);
  gradcheck("scale backward", 1, one, b_scale, 2e-2);
  gradcheck("rmsnorm backward", 2, rowv, b_rmsnorm, 2e-2);
  gradcheck("silu backward", 1, one, b_silu, 2e-2);
  gradcheck("gelu backward", 1, one, b_gelu, 2e-2);
  gradcheck("sigmoid backward", 1, one, b_sigmoid, 2e-2);
  gradcheck("softmax backward", 1, one, b_softmax, 2e-2);
  gradcheck("swiglu backward", 2, two, b_swiglu, 2e-2);
  gradcheck("rope backward", 1, r4, b_rope, 2e-2);
  gradcheck("attention backward", 3, qkv, b_attention, 3e-2);
  gradcheck("embed backward (scatter-add)", 1, emb, b_embed, 2e-2);
  gradcheck("cross_entropy backward", 1, ce, b_cross_entropy, 2e-2);
  gradcheck("transpose backward", 1, t3, b_transpose, 2e-2);
  gradcheck("view (reshape) backward", 1, one, b_view, 2e-2);
  gradcheck("mean backward", 1, one, b_mean, 2e-2);
  gradcheck("sum_rows backward", 1, one, b_sum_rows, 2e-2);
  gradcheck("gradient accumulation (a param used twice)", 1, one, b_reuse, 2e-2);
  static const int64_t conv[2][5] = {{3, 2, 6, 3}, {2, 3, 4}};
  gradcheck("conv1d backward", 2, conv, b_conv, 2e-2);
  gradcheck("conv1d backward, fused silu", 2, conv, b_conv_silu, 2e-2);
  /* B=1, T=7, H=1, HV=2 (GVA), K=4, V=3, chunk 4 */
  static const int64_t kp[7][5] = {{4, 1, 7, 1, 4}, {4, 1, 7, 1, 4}, {4, 1, 7, 2, 3}, {4, 1, 7, 2, 4},
                                   {3, 1, 7, 2}, {1, 2}, {1, 8}};
  kda_ia[0] = KDA_GATE_SOFTPLUS, kda_ia[1] = 1, kda_ia[2] = KDA_BETA_SIGMOID, kda_ia[3] = 4;
  gradcheck("kda backward (softplus gate, l2norm, sigmoid beta, chunk 4)", 7, kp, b_kda, 3e-2);
  kda_ia[0] = KDA_GATE_LOWER_BOUND, kda_ia[2] = KDA_BETA_SIGMOID2, kda_fa[1] = -5.0f;
  gradcheck("kda backward (lower-bound gate, 2*sigmoid beta, chunk 4)", 7, kp, b_kda, 3e-2);

  /* bad shapes are user errors with a message, not crashes */
  kda_graph *g = kda_graph_new();
  int64_t sa[2] = {3, 4}, sb[2] = {5, 6};
  int32_t a = kda_graph_param(g, "a", 2, sa, KDA_INIT_NORMAL, 1, 0), b = kda_graph_param(g, "b", 2, sb, KDA_INIT_NORMAL, 1, 0);
  int32_t bad = op2(g, KDA_OP_MATMUL, a, b, NULL, NULL);
  check(bad == -1 && strstr(kda_last_error(), "inner dimensions differ") != NULL, "shape mismatch is a clear error", kda_last_error());
  check(kda_graph_param(g, "a", 2, sa, 0, 0, 0) == -1 && strstr(kda_last_error(), "already used"), "duplicate parameter name refused", kda_last_error());
  int64_t sq[4] = {1, 5, 2, 4}, sbad[4] = {1, 5, 3, 4}, sbeta[3] = {1, 5, 2}, s2[1] = {2}, s8[1] = {8};
  int32_t kin[7] = {kda_graph_param(g, "q", 4, sq, 0, 0, 0), kda_graph_param(g, "k", 4, sq, 0, 0, 0),
                    kda_graph_param(g, "v", 4, sq, 0, 0, 0), kda_graph_param(g, "g", 4, sbad, 0, 0, 0),
                    kda_graph_param(g, "beta", 3, sbeta, 0, 0, 0), kda_graph_param(g, "A_log", 1, s2, 0, 0, 0),
                    kda_graph_param(g, "dt_bias", 1, s8, 0, 0, 0)};
  int64_t kia[8] = {1, 1, 1, 64};
  check(kda_graph_op(g, KDA_OP_KDA, 7, kin, kia, NULL) == -1 && strstr(kda_last_error(), "g must be [B,T,HV,K]"),
         "kda shape mismatch is a clear error", kda_last_error());
  kda_graph_free(g);

  return check_summary();
}
