/* kda_ref.c — CPU reference of KDA: fp64 recurrence (ground truth), fp32 chunked forward and
 * backward, fp32 decode step, and the depthwise causal conv1d. Math: KDA.md §2–§5.
 *
 * Organisation: every function loops over (sequence, value head). The chunked code builds, per
 * chunk, the quantities of §3.1 in a per-thread workspace (cw_*), then applies the state.
 * The backward does one forward sweep that stores the state entering each chunk, then one
 * reverse sweep that, at each chunk, finishes every gradient of that chunk (§4.2 + §4.3 fused:
 * pass 2 of a chunk only needs dS at its end, which the sweep holds at that moment).
 * Parallelism (OpenMP when enabled): over q/k heads, so a thread owns every value head of its
 * GVA group and all reductions (dq, dk group sums, dA_log, ddt_bias) are race-free.            */
#include <math.h>
#include <string.h>
#include "internal.h"
#include "kda_ref.h"

#define L2_EPS 1e-6

/* ---- argument checks and sequence spans ----------------------------------------------------- */

int64_t kda_kda_nseq(const kda_kda_args *a) { return a->cu_seqlens ? a->nseq : a->B; }

int kda_kda_check_args(const kda_kda_args *a, int host_seqlens, const char *who) {
  if (!a) return kda_set_error("%s: args is NULL: pass a kda_kda_args", who);
  if (a->B < 1 || a->T < 1 || a->H < 1 || a->HV < 1 || a->K < 1 || a->V < 1)
    return kda_set_error("%s: bad shape B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld: all must be >= 1",
                         who, (long long)a->B, (long long)a->T, (long long)a->H, (long long)a->HV,
                         (long long)a->K, (long long)a->V);
  if (a->HV % a->H)
    return kda_set_error("%s: HV=%lld is not a multiple of H=%lld: GVA needs HV %% H == 0", who,
                         (long long)a->HV, (long long)a->H);
  if (a->gate_mode < 0 || a->gate_mode > 2)
    return kda_set_error("%s: gate_mode=%d: use 0 (log decay), 1 (softplus) or 2 (lower bound)",
                         who, a->gate_mode);
  if (a->gate_mode == KDA_GATE_LOWER_BOUND && !(a->lower_bound < 0))
    return kda_set_error("%s: lower_bound=%g: the lower-bound gate needs lower_bound < 0", who,
                         (double)a->lower_bound);
  if (a->beta_mode < 0 || a->beta_mode > 2)
    return kda_set_error("%s: beta_mode=%d: use 0 (raw), 1 (sigmoid) or 2 (2*sigmoid)", who,
                         a->beta_mode);
  if (a->chunk < 1 || a->chunk > 128)
    return kda_set_error("%s: chunk=%d: use 16, 32 or 64", who, a->chunk);
  if (a->cu_seqlens) {
    if (a->B != 1)
      return kda_set_error("%s: cu_seqlens with B=%lld: packed sequences need B == 1", who,
                           (long long)a->B);
    if (a->nseq < 1) return kda_set_error("%s: nseq=%d with cu_seqlens: must be >= 1", who, a->nseq);
    if (host_seqlens) {
      const int32_t *cu = a->cu_seqlens;
      if (cu[0] != 0 || cu[a->nseq] != a->T)
        return kda_set_error("%s: cu_seqlens must start at 0 and end at T=%lld (got %d..%d)", who,
                             (long long)a->T, cu[0], cu[a->nseq]);
      for (int32_t i = 0; i < a->nseq; i++)
        if (cu[i + 1] < cu[i])
          return kda_set_error("%s: cu_seqlens[%d]=%d < cu_seqlens[%d]=%d: offsets must not decrease",
                               who, i + 1, cu[i + 1], i, cu[i]);
    }
  }
  return 0;
}

static void seq_span(const kda_kda_args *a, int64_t i, int64_t *bos, int64_t *len) {
  if (a->cu_seqlens) {
    *bos = a->cu_seqlens[i];
    *len = a->cu_seqlens[i + 1] - a->cu_seqlens[i];
  } else {
    *bos = i * a->T;
    *len = a->T;
  }
}

static double scale_of(const kda_kda_args *a) {
  return a->scale != 0 ? (double)a->scale : 1.0 / sqrt((double)a->K);
}

/* ---- elementwise pieces (gate §2.1, beta §2.2, l2norm §2.3), in double -------------------- */

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }
static double softplus(double x) { return x > 20 ? x : log1p(exp(x)); }

/* log-decay of one (token, value head) row: gout[d] from the raw gate row graw[d]. */
static void gate_fwd_row(const kda_kda_args *a, int64_t h, const float *graw, const float *A_log,
                         const float *dt_bias, float *gout) {
  int64_t K = a->K;
  if (a->gate_mode == KDA_GATE_LOG) {
    for (int64_t d = 0; d < K; d++) gout[d] = graw[d];
    return;
  }
  double ea = A_log ? exp((double)A_log[h]) : 1.0;
  for (int64_t d = 0; d < K; d++) {
    double x = (double)graw[d] + (dt_bias ? (double)dt_bias[h * K + d] : 0.0);
    gout[d] = a->gate_mode == KDA_GATE_SOFTPLUS ? (float)(-ea * softplus(x))
                                                : (float)(a->lower_bound * sigm(ea * x));
  }
}

/* gate backward of one row: dy = dL/dg -> dgraw; accumulates dA_log[h] and ddt_bias[h,:]. */
static void gate_bwd_row(const kda_kda_args *a, int64_t h, const float *graw, const float *A_log,
                         const float *dt_bias, const float *dy, float *dgraw, double *dA,
                         double *ddt) {
  int64_t K = a->K;
  if (a->gate_mode == KDA_GATE_LOG) {
    for (int64_t d = 0; d < K; d++) dgraw[d] = dy[d];
    return;
  }
  double ea = A_log ? exp((double)A_log[h]) : 1.0;
  for (int64_t d = 0; d < K; d++) {
    double x = (double)graw[d] + (dt_bias ? (double)dt_bias[h * K + d] : 0.0), dx;
    if (a->gate_mode == KDA_GATE_SOFTPLUS) {
      dx = dy[d] * -ea * sigm(x);
      *dA += dy[d] * -ea * softplus(x);       /* d/dA_log of -e^A sp(x) is itself */
    } else {
      double s = sigm(ea * x);
      dx = dy[d] * a->lower_bound * s * (1 - s) * ea;
      if (A_log) *dA += dx * x;               /* z = e^A x: dz/dA_log = z = e^A x */
    }
    dgraw[d] = (float)dx;
    ddt[d] += dx;
  }
}

static float beta_fwd(const kda_kda_args *a, float b) {
  return a->beta_mode == KDA_BETA_RAW ? b : (float)((a->beta_mode == 2 ? 2 : 1) * sigm(b));
}
static float beta_bwd(const kda_kda_args *a, float b, float dbeta) {
  if (a->beta_mode == KDA_BETA_RAW) return dbeta;
  double s = sigm(b);
  return (float)(dbeta * (a->beta_mode == 2 ? 2 : 1) * s * (1 - s));
}

/* y = x r, r = 1/sqrt(sum x^2 + eps) (eps inside the sqrt, as fla). */
static void l2n_fwd(const float *x, float *y, int64_t K, int on) {
  double ss = 0;
  for (int64_t d = 0; d < K; d++) ss += (double)x[d] * x[d];
  double r = on ? 1.0 / sqrt(ss + L2_EPS) : 1.0;
  for (int64_t d = 0; d < K; d++) y[d] = (float)(x[d] * r);
}
/* in place: dy (wrt y) -> dx = r dy - r (dy.y) y */
static void l2n_bwd(const float *x, float *dy, int64_t K) {
  double ss = 0, dot = 0;
  for (int64_t d = 0; d < K; d++) ss += (double)x[d] * x[d];
  double r = 1.0 / sqrt(ss + L2_EPS);
  for (int64_t d = 0; d < K; d++) dot += (double)dy[d] * x[d] * r;
  for (int64_t d = 0; d < K; d++) dy[d] = (float)(r * dy[d] - r * dot * x[d] * r);
}

/* ---- fp64 recurrence: the ground truth (its own gate/l2/beta code, independent of the above) */

int kda_kdaref_recurrent64(const kda_kda_args *a, const double *q, const double *k,
                           const double *v, const double *g, const double *beta,
                           const double *A_log, const double *dt_bias, const double *h0,
                           double *o, double *ht) {
  if (kda_kda_check_args(a, 1, "kda_kdaref_recurrent64")) return -1;
  int64_t H = a->H, HV = a->HV, K = a->K, V = a->V, grp = HV / H, N = kda_kda_nseq(a);
  double s = scale_of(a);
  double *S = kda_malloc((size_t)(K * V + 3 * K) * sizeof(double), "kda recurrent64 state");
  if (!S) return -1;
  double *qn = S + K * V, *kn = qn + K, *gl = kn + K;
  for (int64_t n = 0; n < N; n++) {
    int64_t bos, len;
    seq_span(a, n, &bos, &len);
    for (int64_t h = 0; h < HV; h++) {
      if (h0) memcpy(S, h0 + (n * HV + h) * K * V, (size_t)(K * V) * sizeof(double));
      else memset(S, 0, (size_t)(K * V) * sizeof(double));
      for (int64_t t = bos; t < bos + len; t++) {
        const double *qt = q + (t * H + h / grp) * K, *kt = k + (t * H + h / grp) * K;
        const double *vt = v + (t * HV + h) * V, *gt = g + (t * HV + h) * K;
        double sq = 0, sk = 0;
        for (int64_t d = 0; d < K; d++) sq += qt[d] * qt[d], sk += kt[d] * kt[d];
        double rq = a->qk_l2norm ? 1 / sqrt(sq + L2_EPS) : 1, rk = a->qk_l2norm ? 1 / sqrt(sk + L2_EPS) : 1;
        for (int64_t d = 0; d < K; d++) {
          qn[d] = qt[d] * rq, kn[d] = kt[d] * rk;
          double x = gt[d] + (dt_bias && a->gate_mode ? dt_bias[h * K + d] : 0);
          double ea = A_log ? exp(A_log[h]) : 1;
          if (a->gate_mode == 0) gl[d] = x;
          else if (a->gate_mode == 1) gl[d] = -ea * (x > 20 ? x : log1p(exp(x)));
          else gl[d] = a->lower_bound / (1 + exp(-ea * x));
        }
        double b = beta[t * HV + h];
        if (a->beta_mode) b = (a->beta_mode == 2 ? 2.0 : 1.0) / (1 + exp(-b));
        for (int64_t d = 0; d < K; d++) {      /* S' = Diag(exp g) S */
          double al = exp(gl[d]);
          for (int64_t j = 0; j < V; j++) S[d * V + j] *= al;
        }
        double *ot = o + (t * HV + h) * V;
        for (int64_t j = 0; j < V; j++) {      /* e = v - S'^T k; S += b k e^T; o = s S^T q */
          double e = vt[j];
          for (int64_t d = 0; d < K; d++) e -= S[d * V + j] * kn[d];
          double acc = 0;
          for (int64_t d = 0; d < K; d++) {
            S[d * V + j] += b * kn[d] * e;
            acc += S[d * V + j] * qn[d];
          }
          ot[j] = s * acc;
        }
      }
      if (ht) memcpy(ht + (n * HV + h) * K * V, S, (size_t)(K * V) * sizeof(double));
    }
  }
  free(S);
  return 0;
}

int kda_kdaref_recurrent64_backward(const kda_kda_args *a, const double *q, const double *k,
                                    const double *v, const double *g, const double *beta,
                                    const double *h0, const double *dout, const double *dht,
                                    double *dq, double *dk, double *dv, double *dg,
                                    double *dbeta, double *dh0) {
  if (kda_kda_check_args(a, 1, "kda_kdaref_recurrent64_backward")) return -1;
  if (a->gate_mode || a->beta_mode || a->qk_l2norm)
    return kda_set_error("kda_kdaref_recurrent64_backward: only gate_mode 0, beta_mode 0, "
                         "qk_l2norm 0 are supported: use kda_kdaref_backward for the chains");
  int64_t H = a->H, HV = a->HV, K = a->K, V = a->V, grp = HV / H, N = kda_kda_nseq(a);
  double s = scale_of(a);
  int64_t Tmax = 0;
  for (int64_t n = 0; n < N; n++) {
    int64_t bos, len;
    seq_span(a, n, &bos, &len);
    if (len > Tmax) Tmax = len;
  }
  /* Sall[t] = S_t (state after token t), t = 0..len; Sall[0] = S_0 */
  double *Sall = kda_malloc((size_t)((Tmax + 1) * K * V + K * V + V) * sizeof(double), "kda rec64 bwd");
  if (!Sall) return -1;
  double *dS = Sall + (Tmax + 1) * K * V, *de = dS + K * V;
  memset(dq, 0, (size_t)(a->B * a->T * H * K) * sizeof(double));
  memset(dk, 0, (size_t)(a->B * a->T * H * K) * sizeof(double));
  for (int64_t n = 0; n < N; n++) {
    int64_t bos, len;
    seq_span(a, n, &bos, &len);
    for (int64_t h = 0; h < HV; h++) {
      if (h0) memcpy(Sall, h0 + (n * HV + h) * K * V, (size_t)(K * V) * sizeof(double));
      else memset(Sall, 0, (size_t)(K * V) * sizeof(double));
      for (int64_t t = 0; t < len; t++) {     /* forward, keeping every state */
        int64_t tt = bos + t;
        const double *kt = k + (tt * H + h / grp) * K, *gt = g + (tt * HV + h) * K;
        double *P = Sall + t * K * V, *S = P + K * V, b = beta[tt * HV + h];
        for (int64_t d = 0; d < K; d++)
          for (int64_t j = 0; j < V; j++) S[d * V + j] = exp(gt[d]) * P[d * V + j];
        for (int64_t j = 0; j < V; j++) {
          double e = v[(tt * HV + h) * V + j];
          for (int64_t d = 0; d < K; d++) e -= S[d * V + j] * kt[d];
          for (int64_t d = 0; d < K; d++) S[d * V + j] += b * kt[d] * e;
        }
      }
      if (dht) memcpy(dS, dht + (n * HV + h) * K * V, (size_t)(K * V) * sizeof(double));
      else memset(dS, 0, (size_t)(K * V) * sizeof(double));
      for (int64_t t = len - 1; t >= 0; t--) {
        int64_t tt = bos + t;
        const double *qt = q + (tt * H + h / grp) * K, *kt = k + (tt * H + h / grp) * K;
        const double *gt = g + (tt * HV + h) * K, *dot = dout + (tt * HV + h) * V;
        const double *P = Sall + t * K * V, *St = P + K * V;
        double *dqt = dq + (tt * H + h / grp) * K, *dkt = dk + (tt * H + h / grp) * K;
        double b = beta[tt * HV + h], db = 0;
        for (int64_t d = 0; d < K; d++)      /* o = s S^T q */
          for (int64_t j = 0; j < V; j++) {
            dqt[d] += s * St[d * V + j] * dot[j];
            dS[d * V + j] += s * qt[d] * dot[j];
          }
        /* S' = al*P; e = v - S'^T k; S = S' + b k e^T. Recompute S' and e. */
        for (int64_t j = 0; j < V; j++) {
          double e = v[(tt * HV + h) * V + j], kdS = 0;
          for (int64_t d = 0; d < K; d++) e -= exp(gt[d]) * P[d * V + j] * kt[d];
          for (int64_t d = 0; d < K; d++) kdS += kt[d] * dS[d * V + j];
          de[j] = b * kdS;                       /* dL/de_j */
          db += kdS * e;
          for (int64_t d = 0; d < K; d++) dkt[d] += b * dS[d * V + j] * e;
          dv[(tt * HV + h) * V + j] = de[j];
        }
        dbeta[tt * HV + h] = db;
        for (int64_t d = 0; d < K; d++) {
          double al = exp(gt[d]), dal = 0;
          for (int64_t j = 0; j < V; j++) {
            double dSp = dS[d * V + j] - kt[d] * de[j];   /* dL/dS' */
            dkt[d] -= al * P[d * V + j] * de[j];
            dal += dSp * P[d * V + j];
            dS[d * V + j] = al * dSp;
          }
          dg[(tt * HV + h) * K + d] = dal * al;
        }
      }
      if (dh0) memcpy(dh0 + (n * HV + h) * K * V, dS, (size_t)(K * V) * sizeof(double));
    }
  }
  free(Sall);
  return 0;
}

/* ---- chunk workspace (§3.1), fp32 ---------------------------------------------------------- */

typedef struct cw {
  int64_t C, K, V;
  /* [C,K] */ float *q, *k, *g, *Kb, *W, *dQ, *dK, *dKb, *dW, *dG;
  double *G;     /* [C,K] chunk cumsum of g, in double: with g = -1000 entries, fp32 differences
                    G_i - G_j of large cumsums would lose ~1e-4 relative accuracy (§7.4.5) */
  /* [C,V] */ float *v, *U, *Vn, *dVn, *MtdU;
  /* [C,C] */ float *Aqk, *L, *M, *dA, *dM, *X, *dL;
  /* [C]   */ float *b, *db;
  /* [K]   */ float *dGn;
  float *blk;
} cw;

static int cw_alloc(cw *w, int64_t C, int64_t K, int64_t V) {
  w->C = C, w->K = K, w->V = V;
  size_t n = (size_t)(C * K * 12 + C * V * 5 + C * C * 7 + C * 2 + K);
  float *p = w->blk = kda_malloc(n * sizeof(float), "kda chunk workspace");
  if (!p) return -1;
  memset(p, 0, n * sizeof(float));
  float **ck[] = {&w->q, &w->k, &w->g, &w->Kb, &w->W, &w->dQ, &w->dK, &w->dKb, &w->dW, &w->dG};
  float **cv[] = {&w->v, &w->U, &w->Vn, &w->dVn, &w->MtdU};
  float **cc[] = {&w->Aqk, &w->L, &w->M, &w->dA, &w->dM, &w->X, &w->dL};
  for (int i = 0; i < 10; i++) *ck[i] = p, p += C * K;
  w->G = (double *)p, p += 2 * C * K;   /* floats are 4-aligned, 2*C*K of them hold C*K doubles */
  for (int i = 0; i < 5; i++) *cv[i] = p, p += C * V;
  for (int i = 0; i < 7; i++) *cc[i] = p, p += C * C;
  w->b = p, p += C;
  w->db = p, p += C;
  w->dGn = p;
  return 0;
}

typedef struct kin {               /* the forward inputs, bundled for the internals */
  const float *q, *k, *v, *g, *beta, *A_log, *dt_bias;
} kin;

/* Load rows [t0, t0+n) (absolute token index) of value head h: normalised q, k, v, log-decay,
 * beta (after its mode). */
static void cw_load(const kda_kda_args *a, const kin *in, cw *w, int64_t t0, int64_t n, int64_t h) {
  int64_t H = a->H, HV = a->HV, K = a->K, V = a->V, hq = h / (HV / H);
  for (int64_t r = 0; r < n; r++) {
    int64_t t = t0 + r;
    l2n_fwd(in->q + (t * H + hq) * K, w->q + r * K, K, a->qk_l2norm);
    l2n_fwd(in->k + (t * H + hq) * K, w->k + r * K, K, a->qk_l2norm);
    memcpy(w->v + r * V, in->v + (t * HV + h) * V, (size_t)V * sizeof(float));
    gate_fwd_row(a, h, in->g + (t * HV + h) * K, in->A_log, in->dt_bias, w->g + r * K);
    w->b[r] = beta_fwd(a, in->beta[t * HV + h]);
  }
}

/* sum_d x[d] y[d] exp(G_i[d] - G_j[d]). The exponent is <= 0 for i >= j when g <= 0, so this
 * never overflows however strong the decay (no 1/Gamma factorisation on the CPU). */
static float edot(const float *x, const float *y, const double *Gi, const double *Gj, int64_t K) {
  float acc = 0;
  for (int64_t d = 0; d < K; d++) acc += x[d] * y[d] * expf((float)(Gi[d] - Gj[d]));
  return acc;
}

/* Build G, Aqk (times s), L, M = (I+L)^-1, Kb = b k e^G, W = M Kb, U = M (b V) for n rows. */
static void cw_build(cw *w, int64_t n, float s) {
  int64_t C = w->C, K = w->K, V = w->V;
  for (int64_t r = 0; r < n; r++)
    for (int64_t d = 0; d < K; d++)
      w->G[r * K + d] = (r ? w->G[(r - 1) * K + d] : 0.0) + w->g[r * K + d];
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j <= i; j++) {
      const double *Gi = w->G + i * K, *Gj = w->G + j * K;
      w->Aqk[i * C + j] = s * edot(w->q + i * K, w->k + j * K, Gi, Gj, K);
      w->L[i * C + j] = j < i ? w->b[i] * edot(w->k + i * K, w->k + j * K, Gi, Gj, K) : 0.f;
    }
  /* forward substitution: M_ii = 1, M_ij = -sum_{m=j}^{i-1} L_im M_mj (unit lower triangular) */
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0;
      if (j < i)
        for (int64_t m = j; m < i; m++) acc += w->L[i * C + m] * w->M[m * C + j];
      w->M[i * C + j] = j < i ? -acc : (float)(j == i);
    }
  for (int64_t r = 0; r < n; r++)
    for (int64_t d = 0; d < K; d++)
      w->Kb[r * K + d] = w->b[r] * w->k[r * K + d] * expf((float)(w->G[r * K + d]));
  for (int64_t i = 0; i < n; i++) {
    for (int64_t d = 0; d < K; d++) {
      float acc = 0;
      for (int64_t j = 0; j <= i; j++) acc += w->M[i * C + j] * w->Kb[j * K + d];
      w->W[i * K + d] = acc;
    }
    for (int64_t c = 0; c < V; c++) {
      float acc = 0;
      for (int64_t j = 0; j <= i; j++) acc += w->M[i * C + j] * w->b[j] * w->v[j * V + c];
      w->U[i * V + c] = acc;
    }
  }
}

/* Vn = U - W S0 (the pseudo-values of the chunk). */
static void cw_vn(cw *w, int64_t n, const float *S0) {
  int64_t K = w->K, V = w->V;
  for (int64_t i = 0; i < n; i++)
    for (int64_t c = 0; c < V; c++) {
      float acc = w->U[i * V + c];
      for (int64_t d = 0; d < K; d++) acc -= w->W[i * K + d] * S0[d * V + c];
      w->Vn[i * V + c] = acc;
    }
}

/* After cw_vn: o rows (stride ostride) = s (q e^G) S0 + Aqk Vn, if o; then
 * S <- Diag(e^{G_n}) S + (k e^{G_n - G})^T Vn. */
static void cw_apply(cw *w, int64_t n, float s, float *S, float *o, int64_t ostride) {
  int64_t C = w->C, K = w->K, V = w->V;
  const double *Gn = w->G + (n - 1) * K;
  if (o)
    for (int64_t i = 0; i < n; i++)
      for (int64_t c = 0; c < V; c++) {
        float acc = 0, acc2 = 0;
        for (int64_t d = 0; d < K; d++) acc += w->q[i * K + d] * expf((float)(w->G[i * K + d])) * S[d * V + c];
        for (int64_t j = 0; j <= i; j++) acc2 += w->Aqk[i * C + j] * w->Vn[j * V + c];
        o[i * ostride + c] = s * acc + acc2;
      }
  for (int64_t d = 0; d < K; d++) {
    float eg = expf((float)(Gn[d]));
    for (int64_t c = 0; c < V; c++) {
      float acc = eg * S[d * V + c];
      for (int64_t j = 0; j < n; j++)
        acc += w->k[j * K + d] * expf((float)(Gn[d] - w->G[j * K + d])) * w->Vn[j * V + c];
      S[d * V + c] = acc;
    }
  }
}

/* ---- chunked forward ------------------------------------------------------------------------ */

static int64_t max_chunks(const kda_kda_args *a) {
  int64_t m = 0, N = kda_kda_nseq(a);
  for (int64_t n = 0; n < N; n++) {
    int64_t bos, len;
    seq_span(a, n, &bos, &len);
    int64_t c = (len + a->chunk - 1) / a->chunk;
    if (c > m) m = c;
  }
  return m;
}

static int check_gate_inputs(const kda_kda_args *a, const float *A_log, const char *who) {
  if (a->gate_mode == KDA_GATE_SOFTPLUS && !A_log)
    return kda_set_error("%s: the softplus gate (gate_mode 1) needs A_log [HV]: pass it", who);
  return 0;
}

int kda_kdaref_forward(const kda_kda_args *a, const float *q, const float *k, const float *v,
                       const float *g, const float *beta, const float *A_log,
                       const float *dt_bias, const float *h0, float *o, float *ht) {
  const char *who = "kda_kdaref_forward";
  if (kda_kda_check_args(a, 1, who) || check_gate_inputs(a, A_log, who)) return -1;
  kin in = {q, k, v, g, beta, A_log, dt_bias};
  int64_t H = a->H, HV = a->HV, K = a->K, V = a->V, C = a->chunk, N = kda_kda_nseq(a);
  float s = (float)scale_of(a);
  int err = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic) reduction(| : err)
#endif
  for (int64_t hq = 0; hq < H; hq++) {
    cw w = {0};
    float *S = kda_malloc((size_t)(K * V) * sizeof(float), "kda state");
    if (!S || cw_alloc(&w, C, K, V)) { free(S); err |= 1; continue; }
    for (int64_t n = 0; n < N; n++) {
      int64_t bos, len;
      seq_span(a, n, &bos, &len);
      for (int64_t h = hq * (HV / H); h < (hq + 1) * (HV / H); h++) {
        if (h0) memcpy(S, h0 + (n * HV + h) * K * V, (size_t)(K * V) * sizeof(float));
        else memset(S, 0, (size_t)(K * V) * sizeof(float));
        for (int64_t t0 = bos; t0 < bos + len; t0 += C) {
          int64_t m = bos + len - t0 < C ? bos + len - t0 : C;
          cw_load(a, &in, &w, t0, m, h);
          cw_build(&w, m, s);
          cw_vn(&w, m, S);
          cw_apply(&w, m, s, S, o + (t0 * HV + h) * V, HV * V);
        }
        if (ht) memcpy(ht + (n * HV + h) * K * V, S, (size_t)(K * V) * sizeof(float));
      }
    }
    free(S);
    free(w.blk);
  }
  return err ? -1 : 0;
}

/* ---- chunked backward ----------------------------------------------------------------------- */

/* Pass 2 (§4.3) of one built chunk (n rows at token t0, value head h), with S0 the state entering
 * it and dS the gradient wrt the state leaving it; dout rows at dO (stride HV*V). Accumulates
 * dq, dk rows (wrt normalised q, k) at stride H*K; writes dv rows, dgl rows (wrt the log-decay,
 * reverse-cumsummed) at stride HV*K, db (wrt beta after its mode). Then dS <- grad wrt S0. */
static void cw_backward(cw *w, int64_t n, float s, const float *S0, float *dS, const float *dO,
                        int64_t HV, int64_t H, float *dq, float *dk, float *dv, float *dgl,
                        float *db) {
  int64_t C = w->C, K = w->K, V = w->V, so = HV * V;
  const double *Gn = w->G + (n - 1) * K;
  cw_vn(w, n, S0);
  for (int64_t j = 0; j < n; j++) {              /* dVn = Aqk^T dO + Kg dS */
    for (int64_t c = 0; c < V; c++) w->dVn[j * V + c] = 0;
    for (int64_t i = j; i < n; i++)
      for (int64_t c = 0; c < V; c++) w->dVn[j * V + c] += w->Aqk[i * C + j] * dO[i * so + c];
    for (int64_t d = 0; d < K; d++) {
      float kg = w->k[j * K + d] * expf((float)(Gn[d] - w->G[j * K + d]));
      for (int64_t c = 0; c < V; c++) w->dVn[j * V + c] += kg * dS[d * V + c];
    }
  }
  for (int64_t i = 0; i < n; i++)                /* dA = s tril(dO Vn^T), i >= j */
    for (int64_t j = 0; j < n; j++) {
      float acc = 0;
      if (j <= i)
        for (int64_t c = 0; c < V; c++) acc += dO[i * so + c] * w->Vn[j * V + c];
      w->dA[i * C + j] = s * acc;
    }
  for (int64_t i = 0; i < n; i++)                /* inter parts: dQ, dKi, dW (S0, dS contractions) */
    for (int64_t d = 0; d < K; d++) {
      float aq = 0, ak = 0, aw = 0;
      for (int64_t c = 0; c < V; c++) {
        aq += dO[i * so + c] * S0[d * V + c];
        ak += w->Vn[i * V + c] * dS[d * V + c];
        aw += w->dVn[i * V + c] * S0[d * V + c];
      }
      w->dQ[i * K + d] = s * aq * expf((float)(w->G[i * K + d]));
      w->dK[i * K + d] = ak * expf((float)(Gn[d] - w->G[i * K + d]));   /* dKi */
      w->dW[i * K + d] = -aw;
    }
  for (int64_t d = 0; d < K; d++) {              /* dG_n: decay of S0 in S_next, and Kg's G_n */
    float acc = 0;
    for (int64_t c = 0; c < V; c++) acc += S0[d * V + c] * dS[d * V + c];
    acc *= expf((float)(Gn[d]));
    for (int64_t r = 0; r < n; r++) acc += w->k[r * K + d] * w->dK[r * K + d];
    w->dGn[d] = acc;
  }
  for (int64_t i = 0; i < n; i++)                /* dM = dU (bV)^T + dW Kb^T, strictly lower */
    for (int64_t j = 0; j < n; j++) {
      float acc = 0;
      if (j < i) {
        for (int64_t c = 0; c < V; c++) acc += w->dVn[i * V + c] * w->b[j] * w->v[j * V + c];
        for (int64_t d = 0; d < K; d++) acc += w->dW[i * K + d] * w->Kb[j * K + d];
      }
      w->dM[i * C + j] = acc;
    }
  for (int64_t j = 0; j < n; j++) {              /* M^T dU, M^T dW */
    for (int64_t c = 0; c < V; c++) {
      float acc = 0;
      for (int64_t i = j; i < n; i++) acc += w->M[i * C + j] * w->dVn[i * V + c];
      w->MtdU[j * V + c] = acc;
    }
    for (int64_t d = 0; d < K; d++) {
      float acc = 0;
      for (int64_t i = j; i < n; i++) acc += w->M[i * C + j] * w->dW[i * K + d];
      w->dKb[j * K + d] = acc;
    }
  }
  for (int64_t j = 0; j < n; j++) {              /* dv, db, dG (WY part), dK (+= via Kb) */
    float acc = 0;
    for (int64_t c = 0; c < V; c++) {
      dv[j * so + c] = w->b[j] * w->MtdU[j * V + c];
      acc += w->MtdU[j * V + c] * w->v[j * V + c];
    }
    for (int64_t d = 0; d < K; d++) {
      float e = expf((float)(w->G[j * K + d]));
      acc += w->dKb[j * K + d] * w->k[j * K + d] * e;
      w->dG[j * K + d] = w->q[j * K + d] * w->dQ[j * K + d] - w->k[j * K + d] * w->dK[j * K + d] +
                         w->Kb[j * K + d] * w->dKb[j * K + d];
      w->dK[j * K + d] += w->dKb[j * K + d] * w->b[j] * e;
    }
    w->db[j] = acc;
  }
  for (int64_t d = 0; d < K; d++) w->dG[(n - 1) * K + d] += w->dGn[d];
  /* dL = -StrictTril(M^T StrictTril(dM) M^T): X = dM M^T, dL_ij = -sum_{m>=i} M_mi X_mj */
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0;
      for (int64_t m = 0; m < i && m <= j; m++) acc += w->dM[i * C + m] * w->M[j * C + m];
      w->X[i * C + j] = acc;
    }
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < n; j++) {
      float acc = 0;
      if (j < i)
        for (int64_t m = i; m < n; m++) acc += w->M[m * C + i] * w->X[m * C + j];
      w->dL[i * C + j] = -acc;
    }
  /* intra-chunk terms through Aqk (i >= j) and L (i > j), one exp per (i, j, d) */
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j <= i; j++) {
      float da = w->dA[i * C + j], dl = j < i ? w->dL[i * C + j] : 0.f, bi = w->b[i];
      const float *qi = w->q + i * K, *ki = w->k + i * K, *kj = w->k + j * K;
      for (int64_t d = 0; d < K; d++) {
        float e = expf((float)(w->G[i * K + d] - w->G[j * K + d]));
        float dqi = da * kj[d] * e, r = dl * kj[d] * e;
        float col = (da * qi[d] + dl * bi * ki[d]) * e;
        w->dQ[i * K + d] += dqi;
        w->dK[i * K + d] += bi * r;
        w->db[i] += ki[d] * r;
        w->dK[j * K + d] += col;
        w->dG[i * K + d] += qi[d] * dqi + ki[d] * bi * r;
        w->dG[j * K + d] -= kj[d] * col;
      }
    }
  for (int64_t r = 0; r < n; r++) {              /* outputs; dg = reverse cumsum of dG */
    db[r * HV] = w->db[r];
    for (int64_t d = 0; d < K; d++) {
      dq[r * H * K + d] += w->dQ[r * K + d];
      dk[r * H * K + d] += w->dK[r * K + d];
    }
  }
  for (int64_t d = 0; d < K; d++) {
    float acc = 0;
    for (int64_t r = n - 1; r >= 0; r--) acc += w->dG[r * K + d], dgl[r * HV * K + d] = acc;
  }
  /* dS <- Diag(e^{G_n}) dS + s (q e^G)^T dO - W^T dVn */
  for (int64_t d = 0; d < K; d++) {
    float eg = expf((float)(Gn[d]));
    for (int64_t c = 0; c < V; c++) {
      float acc = eg * dS[d * V + c];
      for (int64_t i = 0; i < n; i++)
        acc += s * w->q[i * K + d] * expf((float)(w->G[i * K + d])) * dO[i * so + c] -
               w->W[i * K + d] * w->dVn[i * V + c];
      dS[d * V + c] = acc;
    }
  }
}

/* The backward of one (sequence, value head): forward sweep storing the state entering each
 * chunk, reverse sweep doing pass 2 per chunk. Grads land in the raw-chain-free form. */
static void bwd_head(const kda_kda_args *a, const kin *in, cw *w, float *Sst, float *dS,
                     int64_t n, int64_t h, const float *h0, const float *dout, const float *dht,
                     float *dq, float *dk, float *dv, float *dg, float *dbeta, float *dh0) {
  int64_t H = a->H, HV = a->HV, K = a->K, V = a->V, C = a->chunk, hq = h / (HV / H), bos, len;
  float s = (float)scale_of(a);
  seq_span(a, n, &bos, &len);
  int64_t nc = (len + C - 1) / C;
  if (h0) memcpy(Sst, h0 + (n * HV + h) * K * V, (size_t)(K * V) * sizeof(float));
  else memset(Sst, 0, (size_t)(K * V) * sizeof(float));
  for (int64_t c = 0; c + 1 < nc; c++) {        /* Sst[c] = state entering chunk c */
    int64_t t0 = bos + c * C;
    memcpy(Sst + (c + 1) * K * V, Sst + c * K * V, (size_t)(K * V) * sizeof(float));
    cw_load(a, in, w, t0, C, h);
    cw_build(w, C, s);
    cw_vn(w, C, Sst + c * K * V);
    cw_apply(w, C, s, Sst + (c + 1) * K * V, NULL, 0);
  }
  if (dht) memcpy(dS, dht + (n * HV + h) * K * V, (size_t)(K * V) * sizeof(float));
  else memset(dS, 0, (size_t)(K * V) * sizeof(float));
  for (int64_t c = nc - 1; c >= 0; c--) {
    int64_t t0 = bos + c * C, m = bos + len - t0 < C ? bos + len - t0 : C;
    cw_load(a, in, w, t0, m, h);
    cw_build(w, m, s);
    cw_backward(w, m, s, Sst + c * K * V, dS, dout + (t0 * HV + h) * V, HV, H,
                dq + (t0 * H + hq) * K, dk + (t0 * H + hq) * K, dv + (t0 * HV + h) * V,
                dg + (t0 * HV + h) * K, dbeta + t0 * HV + h);
  }
  if (dh0) memcpy(dh0 + (n * HV + h) * K * V, dS, (size_t)(K * V) * sizeof(float));
}

int kda_kdaref_backward(const kda_kda_args *a, const float *q, const float *k, const float *v,
                        const float *g, const float *beta, const float *A_log,
                        const float *dt_bias, const float *h0, const float *dout,
                        const float *dht, float *dq, float *dk, float *dv, float *dg,
                        float *dbeta, float *dA_log, float *ddt_bias, float *dh0) {
  const char *who = "kda_kdaref_backward";
  if (kda_kda_check_args(a, 1, who) || check_gate_inputs(a, A_log, who)) return -1;
  kin in = {q, k, v, g, beta, A_log, dt_bias};
  int64_t H = a->H, HV = a->HV, K = a->K, V = a->V, N = kda_kda_nseq(a), BT = a->B * a->T;
  int64_t ncmax = max_chunks(a), grp = HV / H;
  int err = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic) reduction(| : err)
#endif
  for (int64_t hq = 0; hq < H; hq++) {
    cw w = {0};
    float *Sst = kda_malloc((size_t)((ncmax + 1) * K * V) * sizeof(float), "kda chunk states");
    double *acc = kda_malloc((size_t)(grp * (K + 1)) * sizeof(double), "kda gate grads");
    if (!Sst || !acc || cw_alloc(&w, a->chunk, K, V)) { free(Sst), free(acc); err |= 1; continue; }
    memset(acc, 0, (size_t)(grp * (K + 1)) * sizeof(double));
    for (int64_t t = 0; t < BT; t++) {
      memset(dq + (t * H + hq) * K, 0, (size_t)K * sizeof(float));
      memset(dk + (t * H + hq) * K, 0, (size_t)K * sizeof(float));
    }
    for (int64_t n = 0; n < N; n++)
      for (int64_t h = hq * grp; h < (hq + 1) * grp; h++)
        bwd_head(a, &in, &w, Sst, Sst + ncmax * K * V, n, h, h0, dout, dht, dq, dk, dv, dg,
                 dbeta, dh0);
    /* chains: gate (in place on dg), beta sigmoid, l2 norm (after the GVA group sum) */
    for (int64_t t = 0; t < BT; t++) {
      for (int64_t h = hq * grp; h < (hq + 1) * grp; h++) {
        double *ah = acc + (h - hq * grp) * (K + 1);
        float *row = dg + (t * HV + h) * K;
        gate_bwd_row(a, h, g + (t * HV + h) * K, A_log, dt_bias, row, row, ah, ah + 1);
        dbeta[t * HV + h] = beta_bwd(a, beta[t * HV + h], dbeta[t * HV + h]);
      }
      if (a->qk_l2norm) {
        l2n_bwd(q + (t * H + hq) * K, dq + (t * H + hq) * K, K);
        l2n_bwd(k + (t * H + hq) * K, dk + (t * H + hq) * K, K);
      }
    }
    for (int64_t h = hq * grp; h < (hq + 1) * grp; h++) {
      double *ah = acc + (h - hq * grp) * (K + 1);
      if (dA_log) dA_log[h] = (float)ah[0];
      if (ddt_bias)
        for (int64_t d = 0; d < K; d++) ddt_bias[h * K + d] = (float)ah[1 + d];
    }
    free(Sst), free(acc), free(w.blk);
  }
  return err ? -1 : 0;
}

/* ---- recurrent decode step (§5), fp32 -------------------------------------------------------- */

int kda_kdaref_step(const kda_kda_args *a, const float *q, const float *k, const float *v,
                    const float *g, const float *beta, const float *A_log,
                    const float *dt_bias, float *state, float *o) {
  const char *who = "kda_kdaref_step";
  if (kda_kda_check_args(a, 1, who) || check_gate_inputs(a, A_log, who)) return -1;
  kin in = {q, k, v, g, beta, A_log, dt_bias};
  int64_t HV = a->HV, K = a->K, V = a->V, N = kda_kda_nseq(a);
  float s = (float)scale_of(a);
  cw w = {0};
  if (cw_alloc(&w, 1, K, V)) return -1;
  for (int64_t n = 0; n < N; n++) {
    int64_t bos, len;
    seq_span(a, n, &bos, &len);
    for (int64_t h = 0; h < HV; h++) {
      float *S = state + (n * HV + h) * K * V;
      for (int64_t t = bos; t < bos + len; t++) {
        cw_load(a, &in, &w, t, 1, h);
        for (int64_t d = 0; d < K; d++) {      /* S' = Diag(e^g) S */
          float al = expf(w.g[d]);
          for (int64_t c = 0; c < V; c++) S[d * V + c] *= al;
        }
        for (int64_t c = 0; c < V; c++) {      /* e = v - S'^T k; S += b k e^T; o = s S^T q */
          float e = w.v[c], acc = 0;
          for (int64_t d = 0; d < K; d++) e -= S[d * V + c] * w.k[d];
          e *= w.b[0];
          for (int64_t d = 0; d < K; d++) {
            S[d * V + c] += w.k[d] * e;
            acc += S[d * V + c] * w.q[d];
          }
          o[(t * HV + h) * V + c] = s * acc;
        }
      }
    }
  }
  free(w.blk);
  return 0;
}

/* ---- depthwise causal conv1d ---------------------------------------------------------------- */

static int conv_check(const kda_conv_args *a, const char *who) {
  if (!a || a->B < 1 || a->T < 1 || a->C < 1 || a->W < 1)
    return kda_set_error("%s: bad conv shape: B, T, C, W must all be >= 1", who);
  if (a->cu_seqlens && (a->B != 1 || a->nseq < 1 || a->cu_seqlens[0] != 0 ||
                        a->cu_seqlens[a->nseq] != a->T))
    return kda_set_error("%s: cu_seqlens needs B == 1, nseq >= 1, offsets 0..T=%lld", who,
                         (long long)a->T);
  return 0;
}

static void conv_span(const kda_conv_args *a, int64_t i, int64_t *bos, int64_t *len) {
  kda_kda_args k = {.B = a->B, .T = a->T, .cu_seqlens = a->cu_seqlens, .nseq = a->nseq};
  seq_span(&k, i, bos, len);
}

/* pre-activation of token t (sequence start bos), channel c */
static float conv_pre(const kda_conv_args *a, const float *x, const float *w, int64_t bos,
                      int64_t t, int64_t c) {
  float acc = 0;
  for (int64_t j = 0; j < a->W; j++) {
    int64_t ts = t - (a->W - 1) + j;
    if (ts >= bos) acc += w[c * a->W + j] * x[ts * a->C + c];
  }
  return acc;
}

int kda_convref_forward(const kda_conv_args *a, const float *x, const float *w, float *y,
                        float *cache) {
  if (conv_check(a, "kda_convref_forward")) return -1;
  int64_t N = a->cu_seqlens ? a->nseq : a->B, C = a->C, W = a->W;
  for (int64_t n = 0; n < N; n++) {
    int64_t bos, len;
    conv_span(a, n, &bos, &len);
    for (int64_t t = bos; t < bos + len; t++)
      for (int64_t c = 0; c < C; c++) {
        float p = conv_pre(a, x, w, bos, t, c);
        y[t * C + c] = a->silu ? (float)(p * sigm(p)) : p;
      }
    if (cache)                                /* cache[n,c,j] = x[end-W+j, c], 0 before bos */
      for (int64_t c = 0; c < C; c++)
        for (int64_t j = 0; j < W; j++) {
          int64_t ts = bos + len - W + j;
          cache[(n * C + c) * W + j] = ts >= bos ? x[ts * C + c] : 0.f;
        }
  }
  return 0;
}

int kda_convref_backward(const kda_conv_args *a, const float *x, const float *w,
                         const float *dy, float *dx, float *dw) {
  if (conv_check(a, "kda_convref_backward")) return -1;
  int64_t N = a->cu_seqlens ? a->nseq : a->B, C = a->C, W = a->W;
  memset(dx, 0, (size_t)(a->B * a->T * C) * sizeof(float));
  double *dwa = kda_malloc((size_t)(C * W) * sizeof(double), "kda conv dw");
  if (!dwa) return -1;
  memset(dwa, 0, (size_t)(C * W) * sizeof(double));
  for (int64_t n = 0; n < N; n++) {
    int64_t bos, len;
    conv_span(a, n, &bos, &len);
    for (int64_t t = bos; t < bos + len; t++)
      for (int64_t c = 0; c < C; c++) {
        float dp = dy[t * C + c];
        if (a->silu) {                          /* d silu(p)/dp = s (1 + p (1 - s)) */
          float p = conv_pre(a, x, w, bos, t, c);
          double sg = sigm(p);
          dp = (float)(dp * sg * (1 + p * (1 - sg)));
        }
        for (int64_t j = 0; j < W; j++) {
          int64_t ts = t - (W - 1) + j;
          if (ts < bos) continue;
          dx[ts * C + c] += w[c * W + j] * dp;
          dwa[c * W + j] += (double)x[ts * C + c] * dp;
        }
      }
  }
  for (int64_t i = 0; i < C * W; i++) dw[i] = (float)dwa[i];
  free(dwa);
  return 0;
}

int kda_convref_step(const kda_conv_args *a, const float *x, const float *w, float *cache,
                     float *y) {
  if (conv_check(a, "kda_convref_step")) return -1;
  int64_t N = a->B, C = a->C, W = a->W;
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++) {
      float *cc = cache + (n * C + c) * W, p = 0;
      memmove(cc, cc + 1, (size_t)(W - 1) * sizeof(float));
      cc[W - 1] = x[n * C + c];
      for (int64_t j = 0; j < W; j++) p += w[c * W + j] * cc[j];
      y[n * C + c] = a->silu ? (float)(p * sigm(p)) : p;
    }
  return 0;
}
