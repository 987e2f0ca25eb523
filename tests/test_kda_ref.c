/* test_kda_ref.c — checks of the CPU KDA reference (core/kda_ref.c), KDA.md §7.
 *
 *   ground truth   kda_kdaref_recurrent64 (fp64 recurrence) and its reverse-time backward
 *   gradients      fp32 chunked backward vs central finite differences of the fp64 recurrence,
 *                  through every chain (l2norm, softplus / lower-bound gate, beta sigmoid), and
 *                  vs the fp64 reverse-time backward at larger shapes
 *   consistency    chunk 16/32/64, prefill + decode, varlen vs separate calls, GVA, states,
 *                  decay extremes (g = -1000), the conv1d (finite differences, decode cache)
 * Metric (§7.1): pass if max|ref-x| <= 1e-6, else RMS(ref-x)/RMS(ref) < tol.
 * Prints "ok - name" / "FAIL - name: detail" and "N passed, N failed".                     */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kda.h"
#include "kda_ref.h"

static int npass, nfail;

/* ---- small helpers ----------------------------------------------------------------------- */

static uint64_t rng_s = 0x9e3779b97f4a7c15ull;
static double urand(void) {                     /* splitmix64 -> [0,1) */
  uint64_t z = (rng_s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
}
static double randn(void) {
  double u = urand() + 1e-300, v = urand();
  return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}
static float *fnew(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }
static double *dnew(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }
static double *to64(const float *x, int64_t n) {
  if (!x) return NULL;
  double *y = dnew(n);
  for (int64_t i = 0; i < n; i++) y[i] = x[i];
  return y;
}

/* RMS(ref - x) / RMS(ref); NaN if x has a non-finite value. *absok: max abs diff <= 1e-6. */
static double relerr(const double *ref, const float *x, const double *xd, int64_t n, int *absok) {
  *absok = 0;
  double se = 0, sr = 0, mx = 0;
  for (int64_t i = 0; i < n; i++) {
    double xi = x ? (double)x[i] : xd[i];
    if (!isfinite(xi)) return NAN;
    double d = fabs(ref[i] - xi);
    se += d * d, sr += ref[i] * ref[i];
    if (d > mx) mx = d;
  }
  *absok = mx <= 1e-6;
  return sqrt(se) / (sqrt(sr) + 1e-300);
}

static void report(const char *name, int ok, const char *detail) {
  if (ok) printf("ok - %s%s%s\n", name, detail[0] ? " " : "", detail), npass++;
  else printf("FAIL - %s: %s\n", name, detail), nfail++;
}

/* compare a list of (label, ref, x) with one tolerance each; one report line */
typedef struct cmp { const char *what; const double *ref; const float *x; const double *xd; int64_t n; double tol; } cmp;
static void check_all(const char *name, const cmp *c, int nc) {
  char buf[1024] = "(";
  int ok = 1;
  for (int i = 0; i < nc; i++) {
    int absok;
    double r = relerr(c[i].ref, c[i].x, c[i].xd, c[i].n, &absok);
    int good = isfinite(r) && (absok || r < c[i].tol);
    ok &= good;
    size_t l = strlen(buf);
    snprintf(buf + l, sizeof buf - l, "%s%s %.1e%s", i ? ", " : "", c[i].what, r, good ? "" : " > tol");
  }
  strcat(buf, ")");
  report(name, ok, buf);
}

/* ---- a KDA problem: args + inputs (float, and exact double copies) ------------------------ */

typedef struct prob {
  kda_kda_args a;
  int32_t cu[16];
  int64_t N, nq, nv, ng, nb, ns;
  float *q, *k, *v, *g, *beta, *A_log, *dt_bias, *h0, *dout, *dht;
} prob;

typedef struct spec {
  int64_t B, T, H, HV, K, V;
  int chunk, gate_mode, beta_mode, l2, h0, dht;
  float scale, lb, gscale;     /* gscale: multiplies logsigmoid(randn) (gate mode 0) */
  double mask_p;               /* gate mode 0: probability of an entry set to -1000     */
  const int32_t *cu; int nseq;
} spec;

static void prob_init(prob *p, const spec *s) {
  memset(p, 0, sizeof *p);
  kda_kda_args *a = &p->a;
  a->B = s->B, a->T = s->T, a->H = s->H, a->HV = s->HV, a->K = s->K, a->V = s->V;
  a->scale = s->scale, a->gate_mode = s->gate_mode, a->lower_bound = s->lb;
  a->qk_l2norm = s->l2, a->beta_mode = s->beta_mode, a->chunk = s->chunk;
  if (s->cu) {
    memcpy(p->cu, s->cu, (size_t)(s->nseq + 1) * sizeof(int32_t));
    a->cu_seqlens = p->cu, a->nseq = s->nseq;
  }
  p->N = kda_kda_nseq(a);
  int64_t BT = a->B * a->T;
  p->nq = BT * a->H * a->K, p->nv = BT * a->HV * a->V, p->ng = BT * a->HV * a->K, p->nb = BT * a->HV;
  p->ns = p->N * a->HV * a->K * a->V;
  p->q = fnew(p->nq), p->k = fnew(p->nq), p->v = fnew(p->nv), p->g = fnew(p->ng);
  p->beta = fnew(p->nb), p->dout = fnew(p->nv);
  for (int64_t i = 0; i < p->nv; i++) p->v[i] = (float)randn(), p->dout[i] = (float)randn();
  for (int64_t t = 0; t < BT * a->H; t++) {        /* unit-norm q, k rows unless l2 in kernel */
    double sq = 0, sk = 0;
    float *qr = p->q + t * a->K, *kr = p->k + t * a->K;
    for (int64_t d = 0; d < a->K; d++) qr[d] = (float)randn(), kr[d] = (float)randn();
    for (int64_t d = 0; d < a->K; d++) sq += qr[d] * qr[d], sk += kr[d] * kr[d];
    if (!s->l2)
      for (int64_t d = 0; d < a->K; d++) qr[d] /= (float)sqrt(sq), kr[d] /= (float)sqrt(sk);
  }
  for (int64_t i = 0; i < p->ng; i++) {
    double x = randn();
    if (s->gate_mode == 0) {
      double ls = -log1p(exp(-x));                    /* logsigmoid */
      p->g[i] = urand() < s->mask_p ? -1000.f : (float)(ls * s->gscale);
    } else p->g[i] = (float)x;
  }
  if (s->gate_mode) {
    p->A_log = fnew(a->HV), p->dt_bias = fnew(a->HV * a->K);
    for (int64_t h = 0; h < a->HV; h++) p->A_log[h] = (float)log(1 + 15 * urand());
    for (int64_t i = 0; i < a->HV * a->K; i++) p->dt_bias[i] = (float)(0.5 * randn());
  }
  for (int64_t i = 0; i < p->nb; i++) {
    double x = randn();
    p->beta[i] = s->beta_mode ? (float)x : (float)(1 / (1 + exp(-x)));
  }
  if (s->h0) { p->h0 = fnew(p->ns); for (int64_t i = 0; i < p->ns; i++) p->h0[i] = (float)(0.5 * randn()); }
  if (s->dht) { p->dht = fnew(p->ns); for (int64_t i = 0; i < p->ns; i++) p->dht[i] = (float)randn(); }
}

static void prob_free(prob *p) {
  free(p->q), free(p->k), free(p->v), free(p->g), free(p->beta), free(p->A_log);
  free(p->dt_bias), free(p->h0), free(p->dout), free(p->dht);
}

/* fp64 recurrence on the exact double copies of p's inputs */
static void rec64(const prob *p, const float *g, double *o, double *ht) {
  const kda_kda_args *a = &p->a;
  double *q = to64(p->q, p->nq), *k = to64(p->k, p->nq), *v = to64(p->v, p->nv);
  double *gg = to64(g, p->ng), *b = to64(p->beta, p->nb), *A = to64(p->A_log, a->HV);
  double *dt = to64(p->dt_bias, a->HV * a->K), *h0 = to64(p->h0, p->ns);
  if (kda_kdaref_recurrent64(a, q, k, v, gg, b, A, dt, h0, o, ht)) printf("# %s\n", kda_last_error());
  free(q), free(k), free(v), free(gg), free(b), free(A), free(dt), free(h0);
}

typedef struct grads { float *dq, *dk, *dv, *dg, *db, *dA, *ddt, *dh0; } grads;
static void grads_new(grads *G, const prob *p) {
  G->dq = fnew(p->nq), G->dk = fnew(p->nq), G->dv = fnew(p->nv), G->dg = fnew(p->ng);
  G->db = fnew(p->nb), G->dA = fnew(p->a.HV), G->ddt = fnew(p->a.HV * p->a.K), G->dh0 = fnew(p->ns);
}
static void grads_free(grads *G) {
  free(G->dq), free(G->dk), free(G->dv), free(G->dg), free(G->db), free(G->dA), free(G->ddt), free(G->dh0);
}
static int run_bwd(const prob *p, grads *G) {
  int rc = kda_kdaref_backward(&p->a, p->q, p->k, p->v, p->g, p->beta, p->A_log, p->dt_bias,
                               p->h0, p->dout, p->dht, G->dq, G->dk, G->dv, G->dg, G->db, G->dA,
                               G->ddt, G->dh0);
  if (rc) printf("# %s\n", kda_last_error());
  return rc;
}

/* ---- tests ------------------------------------------------------------------------------- */

/* chunked fp32 forward vs fp64 recurrence: o and final state. */
static void t_fwd(const char *name, const spec *s, double tol) {
  prob p;
  prob_init(&p, s);
  float *o = fnew(p.nv), *ht = fnew(p.ns);
  double *o64 = dnew(p.nv), *ht64 = dnew(p.ns);
  int rc = kda_kdaref_forward(&p.a, p.q, p.k, p.v, p.g, p.beta, p.A_log, p.dt_bias, p.h0, o, ht);
  if (rc) report(name, 0, kda_last_error());
  else {
    rec64(&p, p.g, o64, ht64);
    cmp c[] = {{"o", o64, o, NULL, p.nv, tol}, {"ht", ht64, ht, NULL, p.ns, tol}};
    check_all(name, c, 2);
  }
  free(o), free(ht), free(o64), free(ht64);
  prob_free(&p);
}

/* central finite differences of L = sum(o*dout) + sum(ht*dht) of the fp64 recurrence */
static double loss64(const prob *p, double **in) {
  const kda_kda_args *a = &p->a;
  double *o = dnew(p->nv), *ht = dnew(p->ns), L = 0;
  kda_kdaref_recurrent64(a, in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], o, ht);
  for (int64_t i = 0; i < p->nv; i++) L += o[i] * p->dout[i];
  if (p->dht) for (int64_t i = 0; i < p->ns; i++) L += ht[i] * p->dht[i];
  free(o), free(ht);
  return L;
}

static void t_fd(const char *name, const spec *s, double tol) {
  prob p;
  prob_init(&p, s);
  grads G;
  grads_new(&G, &p);
  if (run_bwd(&p, &G)) { report(name, 0, kda_last_error()); grads_free(&G); prob_free(&p); return; }
  const kda_kda_args *a = &p.a;
  int64_t n[8] = {p.nq, p.nq, p.nv, p.ng, p.nb, a->HV, a->HV * a->K, p.ns};
  double *in[8] = {to64(p.q, p.nq), to64(p.k, p.nq), to64(p.v, p.nv), to64(p.g, p.ng),
                   to64(p.beta, p.nb), to64(p.A_log, a->HV), to64(p.dt_bias, a->HV * a->K),
                   to64(p.h0, p.ns)};
  const float *mine[8] = {G.dq, G.dk, G.dv, G.dg, G.db, G.dA, G.ddt, G.dh0};
  const char *lab[8] = {"dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0"};
  cmp c[8];
  double *fd[8] = {0};
  int nc = 0;
  for (int x = 0; x < 8; x++) {
    if (!in[x]) continue;
    fd[x] = dnew(n[x]);
    for (int64_t i = 0; i < n[x]; i++) {
      double old = in[x][i], e = 1e-6 * (1 + fabs(old));
      in[x][i] = old + e;
      double lp = loss64(&p, in);
      in[x][i] = old - e;
      double lm = loss64(&p, in);
      in[x][i] = old;
      fd[x][i] = (lp - lm) / (2 * e);
    }
    c[nc++] = (cmp){lab[x], fd[x], mine[x], NULL, n[x], tol};
  }
  check_all(name, c, nc);
  for (int x = 0; x < 8; x++) free(in[x]), free(fd[x]);
  grads_free(&G);
  prob_free(&p);
}

/* fp32 chunked backward vs the fp64 reverse-time backward (core mode only). */
static void t_bwd(const char *name, const spec *s, double tol, double tolg) {
  prob p;
  prob_init(&p, s);
  grads G;
  grads_new(&G, &p);
  if (run_bwd(&p, &G)) { report(name, 0, kda_last_error()); grads_free(&G); prob_free(&p); return; }
  double *q = to64(p.q, p.nq), *k = to64(p.k, p.nq), *v = to64(p.v, p.nv), *g = to64(p.g, p.ng);
  double *b = to64(p.beta, p.nb), *h0 = to64(p.h0, p.ns), *dO = to64(p.dout, p.nv), *dht = to64(p.dht, p.ns);
  double *dq = dnew(p.nq), *dk = dnew(p.nq), *dv = dnew(p.nv), *dg = dnew(p.ng), *db = dnew(p.nb), *dh0 = dnew(p.ns);
  if (kda_kdaref_recurrent64_backward(&p.a, q, k, v, g, b, h0, dO, dht, dq, dk, dv, dg, db, dh0))
    report(name, 0, kda_last_error());
  else {
    cmp c[] = {{"dq", dq, G.dq, NULL, p.nq, tol}, {"dk", dk, G.dk, NULL, p.nq, tol},
               {"dv", dv, G.dv, NULL, p.nv, tol}, {"dg", dg, G.dg, NULL, p.ng, tolg},
               {"dbeta", db, G.db, NULL, p.nb, tolg}, {"dh0", dh0, G.dh0, NULL, p.ns, tol}};
    check_all(name, c, 6);
  }
  free(q), free(k), free(v), free(g), free(b), free(h0), free(dO), free(dht);
  free(dq), free(dk), free(dv), free(dg), free(db), free(dh0);
  grads_free(&G);
  prob_free(&p);
}

/* the same problem at two chunk sizes must agree (fwd and bwd) */
static void t_chunks(const char *name, spec s, int c1, int c2, double tol) {
  prob p;
  float *o[2], *ht[2];
  grads G[2];
  for (int r = 0; r < 2; r++) {
    rng_s = 1234;
    s.chunk = r ? c2 : c1;
    prob_init(&p, &s);
    o[r] = fnew(p.nv), ht[r] = fnew(p.ns);
    grads_new(&G[r], &p);
    kda_kdaref_forward(&p.a, p.q, p.k, p.v, p.g, p.beta, p.A_log, p.dt_bias, p.h0, o[r], ht[r]);
    run_bwd(&p, &G[r]);
    if (r == 0) prob_free(&p);
  }
  double *ref[10];
  const float *x[10] = {o[1], ht[1], G[1].dq, G[1].dk, G[1].dv, G[1].dg, G[1].db, G[1].dA, G[1].ddt, G[1].dh0};
  const float *r0[10] = {o[0], ht[0], G[0].dq, G[0].dk, G[0].dv, G[0].dg, G[0].db, G[0].dA, G[0].ddt, G[0].dh0};
  int64_t n[10] = {p.nv, p.ns, p.nq, p.nq, p.nv, p.ng, p.nb, p.a.HV, p.a.HV * p.a.K, p.ns};
  const char *lab[10] = {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0"};
  cmp c[10];
  for (int i = 0; i < 10; i++) ref[i] = to64(r0[i], n[i]), c[i] = (cmp){lab[i], ref[i], x[i], NULL, n[i], tol};
  c[7].tol = c[8].tol = 10 * tol;   /* dA_log, ddt_bias: fp32 sums over every token */
  check_all(name, c, 10);
  for (int i = 0; i < 10; i++) free(ref[i]);
  for (int r = 0; r < 2; r++) free(o[r]), free(ht[r]), grads_free(&G[r]);
  prob_free(&p);
}

/* prefill T1 tokens with the chunked forward, then decode the rest one token at a time with
 * kda_kdaref_step from its final state; compare with the chunked forward over all T. */
static void t_decode(const char *name, const spec *s, int64_t T1, double tol) {
  prob p;
  prob_init(&p, s);
  kda_kda_args *a = &p.a;
  int64_t B = a->B, T = a->T, H = a->H, HV = a->HV, K = a->K, V = a->V;
  float *o = fnew(p.nv), *ht = fnew(p.ns), *o2 = fnew(p.nv), *st = fnew(p.ns);
  kda_kdaref_forward(a, p.q, p.k, p.v, p.g, p.beta, p.A_log, p.dt_bias, p.h0, o, ht);
  /* prefill: the first T1 tokens of every row, copied out */
  kda_kda_args a1 = *a;
  a1.T = T1;
  float *q1 = fnew(B * T1 * H * K), *k1 = fnew(B * T1 * H * K), *v1 = fnew(B * T1 * HV * V);
  float *g1 = fnew(B * T1 * HV * K), *b1 = fnew(B * T1 * HV), *o1 = fnew(B * T1 * HV * V);
  for (int64_t b = 0; b < B; b++) {
    memcpy(q1 + b * T1 * H * K, p.q + b * T * H * K, (size_t)(T1 * H * K) * 4);
    memcpy(k1 + b * T1 * H * K, p.k + b * T * H * K, (size_t)(T1 * H * K) * 4);
    memcpy(v1 + b * T1 * HV * V, p.v + b * T * HV * V, (size_t)(T1 * HV * V) * 4);
    memcpy(g1 + b * T1 * HV * K, p.g + b * T * HV * K, (size_t)(T1 * HV * K) * 4);
    memcpy(b1 + b * T1 * HV, p.beta + b * T * HV, (size_t)(T1 * HV) * 4);
  }
  kda_kdaref_forward(&a1, q1, k1, v1, g1, b1, p.A_log, p.dt_bias, p.h0, o1, st);
  for (int64_t b = 0; b < B; b++) memcpy(o2 + b * T * HV * V, o1 + b * T1 * HV * V, (size_t)(T1 * HV * V) * 4);
  /* decode: one token for all B rows per call (the batch is gathered into [B,1,...]) */
  kda_kda_args a2 = *a;
  a2.T = 1;
  float *qs = fnew(B * H * K), *ks = fnew(B * H * K), *vs = fnew(B * HV * V), *gs = fnew(B * HV * K);
  float *bs = fnew(B * HV), *os = fnew(B * HV * V);
  for (int64_t t = T1; t < T; t++) {
    for (int64_t b = 0; b < B; b++) {
      memcpy(qs + b * H * K, p.q + (b * T + t) * H * K, (size_t)(H * K) * 4);
      memcpy(ks + b * H * K, p.k + (b * T + t) * H * K, (size_t)(H * K) * 4);
      memcpy(vs + b * HV * V, p.v + (b * T + t) * HV * V, (size_t)(HV * V) * 4);
      memcpy(gs + b * HV * K, p.g + (b * T + t) * HV * K, (size_t)(HV * K) * 4);
      memcpy(bs + b * HV, p.beta + (b * T + t) * HV, (size_t)HV * 4);
    }
    kda_kdaref_step(&a2, qs, ks, vs, gs, bs, p.A_log, p.dt_bias, st, os);
    for (int64_t b = 0; b < B; b++) memcpy(o2 + (b * T + t) * HV * V, os + b * HV * V, (size_t)(HV * V) * 4);
  }
  double *ro = to64(o, p.nv), *rh = to64(ht, p.ns);
  cmp c[] = {{"o", ro, o2, NULL, p.nv, tol}, {"ht", rh, st, NULL, p.ns, tol}};
  check_all(name, c, 2);
  free(ro), free(rh), free(o), free(ht), free(o2), free(st), free(q1), free(k1), free(v1), free(g1);
  free(b1), free(o1), free(qs), free(ks), free(vs), free(gs), free(bs), free(os);
  prob_free(&p);
}

/* varlen (B=1, cu_seqlens) vs one call per sequence: fwd, final states and all gradients */
static void t_varlen(const char *name, spec s, double tol) {
  prob p;
  prob_init(&p, &s);
  kda_kda_args *a = &p.a;
  int64_t H = a->H, HV = a->HV, K = a->K, V = a->V, KV = K * V;
  float *o = fnew(p.nv), *ht = fnew(p.ns), *o2 = fnew(p.nv), *ht2 = fnew(p.ns);
  grads G, G2;
  grads_new(&G, &p), grads_new(&G2, &p);
  kda_kdaref_forward(a, p.q, p.k, p.v, p.g, p.beta, p.A_log, p.dt_bias, p.h0, o, ht);
  run_bwd(&p, &G);
  float *dA = fnew(HV), *ddt = fnew(HV * K);
  for (int i = 0; i < s.nseq; i++) {
    int64_t t0 = s.cu[i], L = s.cu[i + 1] - s.cu[i];
    if (!L) continue;
    kda_kda_args b = *a;
    b.T = L, b.cu_seqlens = NULL, b.nseq = 0;
    const float *h0 = p.h0 ? p.h0 + i * HV * KV : NULL, *dht = p.dht ? p.dht + i * HV * KV : NULL;
    kda_kdaref_forward(&b, p.q + t0 * H * K, p.k + t0 * H * K, p.v + t0 * HV * V, p.g + t0 * HV * K,
                       p.beta + t0 * HV, p.A_log, p.dt_bias, h0, o2 + t0 * HV * V, ht2 + i * HV * KV);
    kda_kdaref_backward(&b, p.q + t0 * H * K, p.k + t0 * H * K, p.v + t0 * HV * V, p.g + t0 * HV * K,
                        p.beta + t0 * HV, p.A_log, p.dt_bias, h0, p.dout + t0 * HV * V, dht,
                        G2.dq + t0 * H * K, G2.dk + t0 * H * K, G2.dv + t0 * HV * V,
                        G2.dg + t0 * HV * K, G2.db + t0 * HV, dA, ddt, G2.dh0 + i * HV * KV);
    for (int64_t h = 0; h < HV; h++) G2.dA[h] += dA[h];
    for (int64_t j = 0; j < HV * K; j++) G2.ddt[j] += ddt[j];
  }
  const float *x[10] = {o2, ht2, G2.dq, G2.dk, G2.dv, G2.dg, G2.db, G2.dA, G2.ddt, G2.dh0};
  const float *r0[10] = {o, ht, G.dq, G.dk, G.dv, G.dg, G.db, G.dA, G.ddt, G.dh0};
  int64_t n[10] = {p.nv, p.ns, p.nq, p.nq, p.nv, p.ng, p.nb, HV, HV * K, p.ns};
  const char *lab[10] = {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0"};
  double *ref[10];
  cmp c[10];
  for (int i = 0; i < 10; i++) ref[i] = to64(r0[i], n[i]), c[i] = (cmp){lab[i], ref[i], x[i], NULL, n[i], tol};
  check_all(name, c, 10);
  for (int i = 0; i < 10; i++) free(ref[i]);
  free(o), free(ht), free(o2), free(ht2), free(dA), free(ddt);
  grads_free(&G), grads_free(&G2);
  prob_free(&p);
}

/* g with -1000 entries and whole chunks fully decayed: finite, and right */
static void t_strong(const char *name, const spec *s) {
  t_fwd(name, s, 1e-5);
  char nm[128];
  snprintf(nm, sizeof nm, "%s bwd", name);
  t_bwd(nm, s, 1e-4, 1e-4);
}

/* conv1d: finite differences of sum(y*dy) and prefill + decode with the cache */
static void t_conv(const char *name, int silu, const int32_t *cu, int nseq) {
  kda_conv_args a = {.B = cu ? 1 : 2, .T = cu ? cu[nseq] : 9, .C = 3, .W = 4, .silu = silu,
                     .cu_seqlens = cu, .nseq = nseq};
  int64_t n = a.B * a.T * a.C, N = cu ? nseq : a.B;
  float *x = fnew(n), *w = fnew(a.C * a.W), *y = fnew(n), *dy = fnew(n), *dx = fnew(n), *dw = fnew(a.C * a.W);
  for (int64_t i = 0; i < n; i++) x[i] = (float)randn(), dy[i] = (float)randn();
  for (int64_t i = 0; i < a.C * a.W; i++) w[i] = (float)(0.5 * randn());
  kda_convref_backward(&a, x, w, dy, dx, dw);
  double *fdx = dnew(n), *fdw = dnew(a.C * a.W);
  float *arr[2] = {x, w};
  double *fd[2] = {fdx, fdw};
  int64_t cnt[2] = {n, a.C * a.W};
  for (int z = 0; z < 2; z++)
    for (int64_t i = 0; i < cnt[z]; i++) {
      float old = arr[z][i];
      double lp = 0, lm = 0, e = 1e-2;
      arr[z][i] = (float)(old + e), kda_convref_forward(&a, x, w, y, NULL);
      for (int64_t j = 0; j < n; j++) lp += (double)y[j] * dy[j];
      arr[z][i] = (float)(old - e), kda_convref_forward(&a, x, w, y, NULL);
      for (int64_t j = 0; j < n; j++) lm += (double)y[j] * dy[j];
      arr[z][i] = old;
      fd[z][i] = (lp - lm) / ((double)(float)(old + e) - (double)(float)(old - e));
    }
  char nm[128];
  snprintf(nm, sizeof nm, "%s grad", name);
  cmp c[] = {{"dx", fdx, dx, NULL, n, 1e-3}, {"dw", fdw, dw, NULL, a.C * a.W, 1e-3}};
  check_all(nm, c, 2);
  if (!cu) {                                  /* prefill T-3 tokens, decode 3 */
    int64_t T1 = a.T - 3;
    kda_conv_args a1 = a;
    a1.T = T1;
    float *x1 = fnew(a.B * T1 * a.C), *y1 = fnew(a.B * T1 * a.C), *cache = fnew(N * a.C * a.W);
    float *ys = fnew(a.B * a.C), *xs = fnew(a.B * a.C), *y2 = fnew(n);
    kda_convref_forward(&a, x, w, y, NULL);
    for (int64_t b = 0; b < a.B; b++) memcpy(x1 + b * T1 * a.C, x + b * a.T * a.C, (size_t)(T1 * a.C) * 4);
    kda_convref_forward(&a1, x1, w, y1, cache);
    for (int64_t b = 0; b < a.B; b++) memcpy(y2 + b * a.T * a.C, y1 + b * T1 * a.C, (size_t)(T1 * a.C) * 4);
    kda_conv_args a2 = a;
    a2.T = 1;
    for (int64_t t = T1; t < a.T; t++) {
      for (int64_t b = 0; b < a.B; b++) memcpy(xs + b * a.C, x + (b * a.T + t) * a.C, (size_t)a.C * 4);
      kda_convref_step(&a2, xs, w, cache, ys);
      for (int64_t b = 0; b < a.B; b++) memcpy(y2 + (b * a.T + t) * a.C, ys + b * a.C, (size_t)a.C * 4);
    }
    double *ry = to64(y, n);
    snprintf(nm, sizeof nm, "%s prefill+decode", name);
    cmp c2[] = {{"y", ry, y2, NULL, n, 1e-6}};
    check_all(nm, c2, 1);
    free(ry), free(x1), free(y1), free(cache), free(ys), free(xs), free(y2);
  }
  free(x), free(w), free(y), free(dy), free(dx), free(dw), free(fdx), free(fdw);
}

static void t_errors(void) {
  kda_kda_args a = {.B = 1, .T = 8, .H = 2, .HV = 3, .K = 4, .V = 4, .chunk = 16};
  int rc = kda_kdaref_forward(&a, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
  report("args: GVA HV % H rejected", rc == -1 && strstr(kda_last_error(), "HV=3"), kda_last_error());
  int32_t cu[3] = {0, 5, 7};
  kda_kda_args b = {.B = 1, .T = 8, .H = 1, .HV = 1, .K = 4, .V = 4, .chunk = 16, .cu_seqlens = cu, .nseq = 2};
  rc = kda_kdaref_forward(&b, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
  report("args: cu_seqlens end != T rejected", rc == -1, kda_last_error());
  kda_kda_args c = {.B = 1, .T = 8, .H = 1, .HV = 1, .K = 4, .V = 4, .chunk = 16, .gate_mode = 1};
  float z[64] = {0};
  rc = kda_kdaref_forward(&c, z, z, z, z, z, NULL, NULL, NULL, z, NULL);
  report("args: softplus gate without A_log rejected", rc == -1, kda_last_error());
}

int main(void) {
  static const int32_t cu1[] = {0, 15, 79, 80, 145, 200};
  static const int32_t cu2[] = {0, 5, 21, 40};
  static const int32_t cu3[] = {0, 1, 16, 33};
  /*           B  T    H HV K   V  chunk gm bm l2 h0 dht scale lb  gscale mask cu nseq */
  spec s;
  /* finite differences through every chain (fp32 backward vs fp64 FD) */
  s = (spec){2, 37, 1, 1, 6, 5, 8, 0, 0, 0, 1, 1, 0.4f, 0, 1, 0, NULL, 0};
  t_fd("fd: pre-gated T=37 K=6 V=5 C=8 h0 dht", &s, 1e-4);
  s = (spec){1, 40, 1, 2, 5, 4, 16, 1, 1, 1, 1, 1, 0, 0, 1, 0, cu2, 3};
  t_fd("fd: softplus gate + l2norm + sigmoid beta, GVA 1:2, varlen C=16", &s, 1e-4);
  s = (spec){2, 21, 2, 4, 4, 3, 16, 2, 2, 1, 0, 1, 0.7f, -5, 1, 0, NULL, 0};
  t_fd("fd: lower-bound gate lb=-5 + 2sigmoid beta, GVA 2:4, no h0", &s, 1e-4);
  s = (spec){1, 33, 1, 1, 4, 4, 16, 2, 1, 0, 1, 0, 0, -0.1f, 1, 0, NULL, 0};
  t_fd("fd: lower-bound gate lb=-0.1, no dht", &s, 1e-4);
  s = (spec){1, 20, 1, 1, 4, 3, 8, 0, 0, 0, 1, 1, 0.5f, 0, 10, 0, NULL, 0};
  t_fd("fd: strong decay (logsigmoid x10)", &s, 1e-4);

  /* fp32 chunked forward vs fp64 recurrence, §7.4 lengths / dims / heads */
  int64_t Ts[] = {1, 15, 16, 17, 63, 64, 65, 130};
  for (int i = 0; i < 8; i++) {
    char nm[96];
    snprintf(nm, sizeof nm, "fwd vs rec64: T=%lld K=V=32 C=64", (long long)Ts[i]);
    s = (spec){2, Ts[i], 2, 2, 32, 32, 64, 0, 0, 0, 1, 0, 0, 0, 1, 0, NULL, 0};
    t_fwd(nm, &s, 1e-5);
  }
  s = (spec){1, 1000, 1, 1, 64, 64, 64, 0, 0, 0, 1, 0, 0, 0, 1, 0, NULL, 0};
  t_fwd("fwd vs rec64: T=1000 K=V=64", &s, 1e-5);
  s = (spec){1, 300, 2, 4, 64, 64, 64, 1, 1, 1, 1, 0, 0, 0, 1, 0, NULL, 0};
  t_fwd("fwd vs rec64: T=300 K=V=64 GVA 2:4, softplus gate, l2, sigmoid", &s, 1e-5);
  s = (spec){1, 200, 1, 1, 16, 48, 32, 2, 2, 1, 0, 0, 1.0f, -5, 1, 0, NULL, 0};
  t_fwd("fwd vs rec64: K=16 V=48 lb=-5 2sigmoid scale=1 C=32", &s, 1e-5);
  s = (spec){1, 200, 1, 1, 24, 24, 64, 0, 0, 0, 1, 0, 0, 0, 0, 0, cu1, 5};
  t_fwd("fwd vs rec64: g = 0 (no decay), varlen", &s, 1e-5);
  s = (spec){1, 150, 1, 1, 24, 24, 64, 0, 0, 0, 1, 0, 0, 0, 0.1f, 0, NULL, 0};
  t_fwd("fwd vs rec64: weak decay (logsigmoid/10)", &s, 1e-5);

  /* fp32 chunked backward vs fp64 reverse-time backward */
  s = (spec){2, 130, 2, 2, 32, 16, 64, 0, 0, 0, 1, 1, 0, 0, 1, 0, NULL, 0};
  t_bwd("bwd vs rec64 bwd: T=130 K=32 V=16 C=64", &s, 1e-5, 1e-4);
  s = (spec){1, 200, 1, 2, 32, 32, 32, 0, 0, 0, 1, 1, 0, 0, 1, 0, cu1, 5};
  t_bwd("bwd vs rec64 bwd: varlen GVA 1:2 C=32", &s, 1e-5, 1e-4);
  s = (spec){1, 500, 1, 1, 64, 64, 64, 0, 0, 0, 1, 1, 0, 0, 1, 0, NULL, 0};
  t_bwd("bwd vs rec64 bwd: T=500 K=V=64 C=64", &s, 1e-5, 1e-4);
  s = (spec){1, 100, 1, 1, 64, 64, 16, 0, 0, 0, 0, 0, 1.0f, 0, 1, 0, NULL, 0};
  t_bwd("bwd vs rec64 bwd: K=V=64 C=16, no h0/dht, scale 1", &s, 1e-5, 1e-4);

  /* decay extremes */
  s = (spec){1, 160, 1, 2, 16, 16, 64, 0, 0, 0, 1, 1, 0, 0, 1, 0.3, NULL, 0};
  t_strong("strong: 30% of g = -1000", &s);
  s = (spec){1, 160, 1, 1, 16, 16, 64, 0, 0, 0, 1, 1, 0, 0, 1, 1.0, NULL, 0};
  t_strong("strong: every g = -1000 (chunks decay to 0)", &s);
  s = (spec){1, 100, 1, 1, 16, 16, 32, 1, 1, 1, 1, 1, 0, 0, 1, 0, NULL, 0};
  {
    prob p;
    rng_s = 99;
    prob_init(&p, &s);
    for (int64_t i = 0; i < p.ng; i++) p.g[i] = 50 + 10 * (float)urand();   /* huge g_raw */
    for (int64_t h = 0; h < p.a.HV; h++) p.A_log[h] = logf(16);
    float *o = fnew(p.nv), *ht = fnew(p.ns);
    grads G;
    grads_new(&G, &p);
    kda_kdaref_forward(&p.a, p.q, p.k, p.v, p.g, p.beta, p.A_log, p.dt_bias, p.h0, o, ht);
    run_bwd(&p, &G);
    double *o64 = dnew(p.nv);
    rec64(&p, p.g, o64, NULL);
    int fin = 1;
    for (int64_t i = 0; i < p.nv; i++) fin &= isfinite(o[i]) && isfinite(G.dv[i]);
    for (int64_t i = 0; i < p.ng; i++) fin &= isfinite(G.dg[i]);
    for (int64_t i = 0; i < p.nq; i++) fin &= isfinite(G.dq[i]) && isfinite(G.dk[i]);
    report("strong: softplus gate A=16, g_raw ~ 55: finite fwd/bwd", fin, "");
    cmp c[] = {{"o", o64, o, NULL, p.nv, 1e-5}};
    check_all("strong: softplus gate A=16 vs rec64", c, 1);
    free(o), free(ht), free(o64);
    grads_free(&G);
    prob_free(&p);
  }

  /* beta regimes */
  s = (spec){1, 100, 1, 1, 16, 16, 64, 0, 2, 1, 1, 0, 0, 0, 1, 0, NULL, 0};
  t_fwd("beta: 2 sigmoid (allow_neg_eigval)", &s, 1e-5);

  /* chunk-size agreement (fwd + all grads, with every chain on) */
  s = (spec){1, 150, 2, 4, 32, 32, 0, 1, 1, 1, 1, 1, 0, 0, 1, 0, NULL, 0};
  t_chunks("chunk 32 == 64 (softplus, l2, sigmoid, GVA)", s, 64, 32, 1e-5);
  s = (spec){1, 100, 1, 1, 16, 24, 0, 2, 2, 1, 1, 1, 0, -5, 1, 0, NULL, 0};
  t_chunks("chunk 16 == 64 (lower bound, 2sigmoid)", s, 64, 16, 1e-5);

  /* prefill + decode */
  s = (spec){3, 77, 2, 2, 16, 16, 64, 0, 0, 0, 1, 0, 0, 0, 1, 0, NULL, 0};
  t_decode("prefill 70 + decode 7 == chunked (pre-gated)", &s, 70, 1e-5);
  s = (spec){2, 80, 1, 2, 32, 16, 32, 1, 1, 1, 0, 0, 0, 0, 1, 0, NULL, 0};
  t_decode("prefill 65 + decode 15 == chunked (softplus, l2, sigmoid, GVA)", &s, 65, 1e-5);
  s = (spec){1, 20, 1, 1, 16, 16, 64, 2, 1, 1, 1, 0, 0, -5, 1, 0, NULL, 0};
  t_decode("prefill 1 + decode 19 == chunked (lower bound)", &s, 1, 1e-5);

  /* varlen == separate calls */
  s = (spec){1, 200, 2, 4, 16, 16, 64, 1, 1, 1, 1, 1, 0, 0, 1, 0, cu1, 5};
  t_varlen("varlen == separate calls (lengths 15,64,1,65,55)", s, 1e-6);
  s = (spec){1, 33, 1, 1, 8, 8, 16, 0, 0, 0, 1, 1, 0, 0, 1, 0, cu3, 3};
  t_varlen("varlen == separate calls (lengths 1,15,17; C=16)", s, 1e-6);

  /* conv1d */
  t_conv("conv1d W=4 silu", 1, NULL, 0);
  t_conv("conv1d W=4 linear", 0, NULL, 0);
  static const int32_t ccu[] = {0, 2, 9, 10};
  t_conv("conv1d W=4 silu varlen", 1, ccu, 3);

  t_errors();
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail ? 1 : 0;
}
