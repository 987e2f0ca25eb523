/* bf16_study.c — what bf16 storage of the fast backward's fp32 intermediates would cost in
 * precision, on the CPU (no GPU needed). Built and run by benches/bf16_study.sh, which links two
 * copies of the CPU reference: core/kda_ref.c as it is (fp32 chunked backward) and a patched one
 * (benches/results/wip/2026-12-04s45-bf16study.patch, its functions renamed *_b16) that rounds
 * to bf16 where the CUDA kernels would store in bf16, one intermediate a build (B16_MASK):
 *   1: the dQ, dKi scratch (wip/b16s): the rows kernel's raw products dO S0^T and Vn dS^T; dq's
 *      scratch after the diagonal blocks' terms and again after the row terms; dKi's after the
 *      diagonal blocks' column terms and again after the column products (dG, R', dbeta read
 *      the terms in fp32, as the final kernel's epilogues do);
 *   2: dW (rows -> mat), 4: dKb (mat -> final), 8: dA (rows -> final), 16: dL (mat -> final);
 *   32: the forward's kept Kb and 64 its M, where the mat kernel reads them;
 *   128: the final kernel's flat form on bf16 warpgroup MMAs (session 49): a flat chunk's pairs,
 *      diagonal blocks included, factored around the span's middle with bf16 operands dA, dL,
 *      X = k e^{Gm - G}, [q ; b k] e^{G - Gm}; the line then ends with the flat chunks' count;
 *   256: the same with tf32 operands (tf32 wgmma's).
 * It prints, per case, the RMS ratio (fla's metric, KDA.md §7.2: rms(x - ref) / rms(ref)) of the
 * patched gradients against the unpatched ones: the error that storage would add to the fast
 * path's own (test_kda_cuda's figures, e.g. dq 2.4e-3 against a 0.008 threshold). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kda.h"
#include "kda_ref.h"
#ifndef STUDY_LABEL
#define STUDY_LABEL "the dQ, dKi scratch"
#endif

int kda_kdaref_backward_b16(const kda_kda_args *a, const float *q, const float *k, const float *v,
                            const float *g, const float *beta, const float *A_log, const float *dt_bias,
                            const float *h0, const float *dout, const float *dht, float *dq, float *dk,
                            float *dv, float *dg, float *dbeta, float *dA_log, float *ddt_bias, float *dh0);

extern long kda_b16_flat_chunks[2];   /* the patched reference's count under bit 128: flat, all */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {                     /* xorshift64*, (0, 1) */
  rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
  return ((rng * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0) + 1e-300;
}
static double randn(void) { return sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand()); }
static float *fill(int64_t n, double sc) {
  float *x = malloc((size_t)n * sizeof(float));
  if (!x) { fprintf(stderr, "bf16_study: out of memory (%lld floats)\n", (long long)n); exit(1); }
  for (int64_t i = 0; i < n; i++) x[i] = (float)(sc * randn());
  return x;
}
static double worst;                           /* the largest ratio printed (the control's check) */
static double ratio(const float *x, const float *ref, int64_t n) {
  double e = 0, r = 0;
  for (int64_t i = 0; i < n; i++) e += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]), r += (double)ref[i] * ref[i];
  double q = r > 0 ? sqrt(e / r) : sqrt(e);
  worst = q > worst ? q : worst;
  return q;
}

typedef struct { const char *name; int64_t B, T, H, K; int gate; double gscale, mask_p; } study_case;

static void run(const study_case *c) {
  kda_kda_args a = {0};
  a.B = c->B, a.T = c->T, a.H = a.HV = c->H, a.K = a.V = c->K, a.chunk = 64;
  a.qk_l2norm = 1, a.beta_mode = KDA_BETA_SIGMOID, a.gate_mode = c->gate;
  int64_t BT = a.B * a.T, nq = BT * a.H * a.K, nb = BT * a.H;
  float *q = fill(nq, 1), *k = fill(nq, 1), *v = fill(nq, 1), *g = fill(nq, 1), *beta = fill(nb, 1),
        *dout = fill(nq, 1), *A_log = NULL, *dt_bias = NULL;
  if (c->gate == KDA_GATE_LOG)                  /* logsigmoid(randn) * gscale, some entries -1000 */
    for (int64_t i = 0; i < nq; i++)
      g[i] = urand() < c->mask_p ? -1000.f : (float)(c->gscale * -log1p(exp(-(double)g[i])));
  else {
    A_log = fill(a.H, 0), dt_bias = fill(a.H * a.K, 0.5);
    for (int64_t h = 0; h < a.H; h++) A_log[h] = (float)log(1 + 15 * urand());
  }
  long f0 = kda_b16_flat_chunks[0], c0 = kda_b16_flat_chunks[1];
  float *o[2][7];                               /* dq dk dv dg dbeta dA_log ddt_bias, each side */
  int64_t len[7] = {nq, nq, nq, nq, nb, a.H, a.H * a.K};
  for (int s = 0; s < 2; s++) {
    for (int i = 0; i < 7; i++) o[s][i] = fill(len[i], 0);
    int (*bwd)(const kda_kda_args *, const float *, const float *, const float *, const float *, const float *,
               const float *, const float *, const float *, const float *, const float *, float *, float *,
               float *, float *, float *, float *, float *, float *) = s ? kda_kdaref_backward_b16 : kda_kdaref_backward;
    if (bwd(&a, q, k, v, g, beta, A_log, dt_bias, NULL, dout, NULL, o[s][0], o[s][1], o[s][2], o[s][3], o[s][4],
            A_log ? o[s][5] : NULL, A_log ? o[s][6] : NULL, NULL)) {
      fprintf(stderr, "bf16_study: %s: %s\n", c->name, kda_last_error());
      exit(1);
    }
  }
  printf("%-44s dq %.1e  dk %.1e  dv %.1e  dg %.1e  dbeta %.1e", c->name, ratio(o[1][0], o[0][0], nq),
         ratio(o[1][1], o[0][1], nq), ratio(o[1][2], o[0][2], nq), ratio(o[1][3], o[0][3], nq),
         ratio(o[1][4], o[0][4], nb));
  if (A_log) printf("  dA_log %.1e  ddt_bias %.1e", ratio(o[1][5], o[0][5], a.H), ratio(o[1][6], o[0][6], a.H * a.K));
  if (kda_b16_flat_chunks[1] > c0)
    printf("  (flat chunks %ld of %ld)", kda_b16_flat_chunks[0] - f0, kda_b16_flat_chunks[1] - c0);
  printf("\n");
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < 7; i++) free(o[s][i]);
  free(q), free(k), free(v), free(g), free(beta), free(dout), free(A_log), free(dt_bias);
}

int main(void) {
  static const study_case cases[] = {
      {"K=V=64 T=300, g = logsigmoid(randn)", 2, 300, 2, 64, KDA_GATE_LOG, 1, 0},
      {"K=V=128 T=300, g = logsigmoid(randn)", 2, 300, 2, 128, KDA_GATE_LOG, 1, 0},
      {"K=V=128 T=512, weak decay (logsigmoid / 10)", 1, 512, 2, 128, KDA_GATE_LOG, 0.1, 0},
      {"K=V=128 T=512, near none (logsigmoid / 100)", 1, 512, 2, 128, KDA_GATE_LOG, 0.01, 0},
      {"K=V=64 T=300, none (g = 0, DeltaNet)", 2, 300, 2, 64, KDA_GATE_LOG, 0, 0},
      {"K=V=64 T=300, strong (logsigmoid x 10)", 2, 300, 2, 64, KDA_GATE_LOG, 10, 0},
      {"K=V=64 T=300, 30% of g = -1000", 2, 300, 2, 64, KDA_GATE_LOG, 1, 0.3},
      {"K=V=128 T=300, softplus gate (A_log, dt_bias)", 2, 300, 2, 128, KDA_GATE_SOFTPLUS, 1, 0},
  };
  printf("%s in bf16 against fp32, RMS ratios (the error it would add to the fast path)\n", STUDY_LABEL);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run(&cases[i]);
#ifdef B16_CONTROL   /* rounding off: only fp32 summation order may differ */
  if (worst > 1e-5) {
    fprintf(stderr, "bf16_study: the control differs from the reference by %.1e (> 1e-5): the study patch changed more than the rounding\n", worst);
    return 1;
  }
#endif
  return 0;
}
