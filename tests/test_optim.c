/* test_optim.c — the in-place optimizer nodes on a one-parameter graph whose loss is
 * sum(p * R), so the gradient is exactly R: AdamW against its formula, the learning-rate
 * schedule, the NaN/Inf and loss-spike guard, Muon, EMA and retraction.                    */
#include <math.h>
#include <string.h>
#include "../core/internal.h"
#include "../core/kda.h"
#include "check.h"

enum { R = 4, C = 8, N = R * C };

typedef struct {
  kda_graph *g;
  kda_plan *p;
  int32_t param, rin, loss;
} rig;

/* p [R,C] (flags), loss = sum(p * rin); optimizer from cfg. */
static int rig_build(rig *r, kda_adamw_config *cfg, int flags) {
  int64_t s[2] = {R, C};
  r->g = kda_graph_new();
  r->param = kda_graph_param(r->g, "w", 2, s, KDA_INIT_NORMAL, 1.0f, flags);
  r->rin = kda_graph_input(r->g, "R", KDA_F32, 2, s);
  int32_t in[2] = {r->param, r->rin};
  int32_t m = kda_graph_op(r->g, KDA_OP_MUL, 2, in, NULL, NULL);
  r->loss = kda_graph_op(r->g, KDA_OP_SUM, 1, &m, NULL, NULL);
  if (kda_graph_backward(r->g, r->loss) || kda_graph_adamw(r->g, cfg)) return -1;
  r->p = kda_plan_build(r->g, KDA_BACKEND_CPU);
  return r->p && kda_plan_init_params(r->p, 3) == 0 ? 0 : -1;
}

static void rig_free(rig *r) { kda_plan_free(r->p), kda_graph_free(r->g); }

static kda_adamw_config base_cfg(void) {
  kda_adamw_config c = {0};
  c.lr = 0.1f, c.beta1 = 0.9f, c.beta2 = 0.95f, c.eps = 1e-8f, c.weight_decay = 0.1f;
  c.schedule = KDA_SCHED_CONSTANT, c.total_steps = 10;
  return c;
}

static void set_grad(rig *r, float v) {
  float g[N];
  for (int i = 0; i < N; i++) g[i] = v * (float)(i % 5 - 2) + 0.25f;
  kda_plan_write(r->p, r->rin, g, sizeof g);
}

/* R = scale * sign(p): the loss sum(p * R) = scale * sum|p| is positive, like a cross-entropy. */
static void set_sign_grad(rig *r, float scale) {
  float p[N], g[N];
  kda_plan_read(r->p, r->param, p, sizeof p);
  for (int i = 0; i < N; i++) g[i] = p[i] >= 0 ? scale : -scale;
  kda_plan_write(r->p, r->rin, g, sizeof g);
}

static void test_adamw(void) {
  kda_adamw_config c = base_cfg();
  rig r;
  if (rig_build(&r, &c, 0)) { check(0, "adamw rig", NULL); return; }
  float p0[N], p1[N], g[N];
  kda_plan_read(r.p, r.param, p0, sizeof p0);
  set_grad(&r, 1.0f);
  kda_plan_read(r.p, r.rin, g, sizeof g);
  kda_plan_run(r.p, KDA_RUN_STEP);
  kda_plan_read(r.p, r.param, p1, sizeof p1);
  /* step 1: mhat = g, vhat = g^2, so the update is lr (g/(|g|+eps) + wd p) */
  double worst = 0;
  for (int i = 0; i < N; i++) {
    double want = p0[i] - 0.1 * (g[i] / (fabs(g[i]) + 1e-8) + 0.1 * p0[i]);
    worst = fmax(worst, fabs(want - p1[i]));
  }
  char d[96];
  snprintf(d, sizeof d, "max error %.3g", worst);
  check(worst < 1e-5, "adamw first step matches its formula", d);
  rig_free(&r);
}

static void test_schedule(void) {
  int64_t ia[8] = {KDA_SCHED_COSINE, 10, 110};
  float fa[8] = {1.0f, 0.1f, 0.2f};
  int ok = fabsf(kda_schedule_lr(0, ia, fa) - 0.1f) < 1e-6f && fabsf(kda_schedule_lr(9, ia, fa) - 1.0f) < 1e-6f &&
           fabsf(kda_schedule_lr(60, ia, fa) - 0.55f) < 1e-5f && fabsf(kda_schedule_lr(110, ia, fa) - 0.1f) < 1e-6f;
  check(ok, "warmup then cosine: 0.1, 1.0, midpoint 0.55, floor 0.1", "schedule values differ");
  ia[0] = KDA_SCHED_WSD;
  ok = fabsf(kda_schedule_lr(80, ia, fa) - 1.0f) < 1e-6f && fabsf(kda_schedule_lr(99, ia, fa) - 0.55f) < 1e-5f;
  check(ok, "warmup-stable-decay: flat, then linear over the last 20%", "schedule values differ");
}

static void test_guard(void) {
  kda_adamw_config c = base_cfg();
  c.spike_factor = 2.0f, c.warmup_steps = 0;
  rig r;
  if (rig_build(&r, &c, 0)) { check(0, "guard rig", NULL); return; }
  int32_t st = kda_graph_state_node(r.g);
  float before[N], after[N], s[8];
  for (int k = 0; k < 12; k++) set_sign_grad(&r, 1.0f), kda_plan_run(r.p, KDA_RUN_STEP); /* a loss history */
  kda_plan_read(r.p, r.param, before, sizeof before);
  float nan_r[N];
  for (int i = 0; i < N; i++) nan_r[i] = i == 3 ? NAN : 1.0f;
  kda_plan_write(r.p, r.rin, nan_r, sizeof nan_r);
  kda_plan_run(r.p, KDA_RUN_STEP);
  kda_plan_run(r.p, KDA_RUN_STEP);
  kda_plan_read(r.p, r.param, after, sizeof after);
  kda_plan_read(r.p, st, s, sizeof s);
  check(memcmp(before, after, sizeof before) == 0 && s[KDA_STATE_SKIP] == 1 && s[KDA_STATE_SKIP_RUN] == 2,
        "a NaN loss skips the update and counts the run of skips", "parameters changed or counters wrong");
  set_sign_grad(&r, 1.0f);
  kda_plan_run(r.p, KDA_RUN_STEP);
  kda_plan_read(r.p, st, s, sizeof s);
  check(s[KDA_STATE_SKIP] == 0 && s[KDA_STATE_SKIP_RUN] == 0 && s[KDA_STATE_SKIPPED] == 2,
        "a finite step resets the run; the total stays", "counters wrong");
  kda_plan_read(r.p, r.param, before, sizeof before);
  set_sign_grad(&r, 1000.0f); /* the same weights, a loss 1000x its running mean */
  kda_plan_run(r.p, KDA_RUN_STEP);
  kda_plan_read(r.p, st, s, sizeof s);
  kda_plan_read(r.p, r.param, after, sizeof after);
  check(s[KDA_STATE_SKIP] == 1 && s[KDA_STATE_LOSS_EMA] > 0 && memcmp(before, after, sizeof before) == 0,
        "a loss spike over 2x its running mean is skipped", "spike was applied");
  rig_free(&r);
}

static void test_muon(void) {
  kda_adamw_config c = base_cfg();
  c.muon = 1, c.muon_lr_mult = 1.0f, c.muon_momentum = 0.0f, c.weight_decay = 0;
  c.lr = 1.0f;
  rig r;
  if (rig_build(&r, &c, 0)) { check(0, "muon rig", NULL); return; }
  check(kda_graph_find(r.g, "w.muon_m") >= 0 && kda_graph_find(r.g, "w.adam_m") < 0,
        "muon owns 2-D weights (momentum 'w.muon_m', no Adam moments)", "state names");
  float p0[N], p1[N], g[N];
  kda_plan_read(r.p, r.param, p0, sizeof p0);
  kda_fill_normal(g, N, 11, 1.0f);
  kda_plan_write(r.p, r.rin, g, sizeof g);
  kda_plan_run(r.p, KDA_RUN_STEP);
  kda_plan_read(r.p, r.param, p1, sizeof p1);
  /* the update U = p0 - p1 is an approximately orthogonal R x C matrix: U U^T ~ I */
  double diag_lo = 1e9, diag_hi = 0, off = 0, align = 0;
  for (int a = 0; a < R; a++)
    for (int b = 0; b < R; b++) {
      double dot = 0;
      for (int j = 0; j < C; j++) dot += (double)(p0[a * C + j] - p1[a * C + j]) * (p0[b * C + j] - p1[b * C + j]);
      if (a == b) diag_lo = fmin(diag_lo, dot), diag_hi = fmax(diag_hi, dot);
      else off = fmax(off, fabs(dot));
    }
  for (int i = 0; i < N; i++) align += (double)g[i] * (p0[i] - p1[i]);
  char d[128];
  snprintf(d, sizeof d, "diag of U U^T in [%.3f, %.3f], max off-diagonal %.3f", diag_lo, diag_hi, off);
  check(diag_lo > 0.4 && diag_hi < 1.6 && off < 0.35, "muon update is near-orthogonal", d);
  check(align > 0, "muon steps against the gradient", "update points along +g");
  rig_free(&r);
}

static void test_ema_retract(void) {
  kda_adamw_config c = base_cfg();
  c.ema_decay = 0.5f, c.retract_norm = 2.0f;
  rig r;
  if (rig_build(&r, &c, KDA_PARAM_RETRACT)) { check(0, "ema rig", NULL); return; }
  int32_t e = kda_graph_find(r.g, "w.ema");
  float p[N], ema[N], want[N];
  set_grad(&r, 1.0f);
  kda_plan_run(r.p, KDA_RUN_STEP);
  kda_plan_read(r.p, r.param, want, sizeof want); /* step 1: the EMA starts at the weights */
  set_grad(&r, -1.0f);
  kda_plan_run(r.p, KDA_RUN_STEP);
  kda_plan_read(r.p, r.param, p, sizeof p);
  kda_plan_read(r.p, e, ema, sizeof ema);
  double worst = 0, norm_err = 0;
  for (int i = 0; i < N; i++) worst = fmax(worst, fabs(ema[i] - (0.5 * want[i] + 0.5 * p[i])));
  for (int a = 0; a < R; a++) {
    double ss = 0;
    for (int j = 0; j < C; j++) ss += (double)p[a * C + j] * p[a * C + j];
    norm_err = fmax(norm_err, fabs(sqrt(ss) - 2.0));
  }
  check(e >= 0 && worst < 1e-6, "ema = 0.5 ema + 0.5 w after the first step", "ema differs");
  check(norm_err < 1e-5, "retraction leaves every row at norm 2", "row norms differ");
  rig_free(&r);
}

int main(void) {
  test_adamw();
  test_schedule();
  test_guard();
  test_muon();
  test_ema_retract();
  return check_summary();
}
