/* optim.c — optimizer nodes that update parameters in place.
 *
 * After kda_graph_backward, kda_graph_adamw appends:
 *   gnorm = GRAD_NORM(every parameter gradient)        -- global norm, read by clipping
 *   SCHEDULE(state)                                     -- state[STEP] += 1, state[LR] on the backend
 *   GUARD(state, loss, gnorm)                           -- state[SKIP]: NaN/Inf or loss spike
 *   ADAMW(p, dp, m, v, gnorm, state) for each parameter -- in place (MUON for 2-D weights
 *                                                          when cfg->muon)
 *   EMA(p.ema, p, state), RETRACT(p)                    -- when asked for
 * The learning rate and the skip decision live in `state`, so neither changes the graph: a
 * captured CUDA graph replays every step unchanged, and the host reads state only at the
 * logging cadence.                                                                          */
#include <stdio.h>
#include <string.h>
#include "graph.h"
#include "internal.h"

static int32_t state_leaf(kda_graph *g, const char *name, const kda_desc *d) {
  return kda_graph_leaf(g, KDA_OP_INPUT, name, d, NODE_PERSIST | NODE_PRECISE);
}

static int uses_muon(const kda_adamw_config *c, const node *p) {
  return c->muon && p->d.ndim == 2 && !(p->param_flags & KDA_PARAM_NO_DECAY);
}

/* The update of parameter i: Muon (momentum "X.muon_m") or AdamW ("X.adam_m", "X.adam_v"). */
static int add_update(kda_graph *g, const kda_adamw_config *c, int32_t i) {
  node p = g->nodes[i];
  char name[512];
  float wd = p.param_flags & KDA_PARAM_NO_DECAY ? 0.0f : c->weight_decay;
  if (uses_muon(c, &p)) {
    snprintf(name, sizeof name, "%s.muon_m", p.name);
    int32_t m = state_leaf(g, name, &p.d);
    float fa[8] = {c->muon_momentum > 0 ? c->muon_momentum : 0.95f, c->muon_lr_mult > 0 ? c->muon_lr_mult : 1.0f,
                   wd, c->clip};
    int32_t in[5] = {i, p.grad, m, g->gnorm, g->state};
    return m < 0 || kda_graph_add(g, KDA_OP_MUON, 5, in, NULL, fa, NODE_INPLACE) < 0 ? -1 : 0;
  }
  snprintf(name, sizeof name, "%s.adam_m", p.name);
  int32_t m = state_leaf(g, name, &p.d);
  snprintf(name, sizeof name, "%s.adam_v", p.name);
  int32_t v = state_leaf(g, name, &p.d);
  if (m < 0 || v < 0) return -1;
  float fa[8] = {c->beta1, c->beta2, c->eps, wd, c->clip};
  int32_t in[6] = {i, p.grad, m, v, g->gnorm, g->state};
  return kda_graph_add(g, KDA_OP_ADAMW, 6, in, NULL, fa, NODE_INPLACE) < 0 ? -1 : 0;
}

/* After every update: retraction of flagged weights, then the EMA of the updated values. */
static int add_after_update(kda_graph *g, const kda_adamw_config *c, int32_t i) {
  node p = g->nodes[i];
  if (p.param_flags & KDA_PARAM_RETRACT) {
    if (p.d.ndim != 2) return kda_set_error("retract: '%s' is not a 2-D weight", p.name);
    float fa[8] = {c->retract_norm > 0 ? c->retract_norm : 1.0f};
    if (kda_graph_add(g, KDA_OP_RETRACT, 1, &i, NULL, fa, NODE_INPLACE) < 0) return -1;
  }
  if (c->ema_decay > 0) {
    char name[512];
    snprintf(name, sizeof name, "%s.ema", p.name);
    int32_t e = state_leaf(g, name, &p.d);
    float fa[8] = {c->ema_decay};
    int32_t in[3] = {e, i, g->state};
    if (e < 0 || kda_graph_add(g, KDA_OP_EMA, 3, in, NULL, fa, NODE_INPLACE) < 0) return -1;
  }
  return 0;
}

int kda_graph_adamw(kda_graph *g, const kda_adamw_config *c) {
  if (!g->nforward) return kda_set_error("adamw: call kda_graph_backward(loss) first");
  if (g->has_optim) return kda_set_error("adamw: this graph already has an optimizer");
  if (!(c->lr > 0) || c->beta1 < 0 || c->beta1 >= 1 || c->beta2 < 0 || c->beta2 >= 1 || !(c->eps > 0))
    return kda_set_error("adamw: need lr > 0, 0 <= beta1, beta2 < 1, eps > 0 (got lr=%g beta1=%g beta2=%g eps=%g)",
                         c->lr, c->beta1, c->beta2, c->eps);
  if (c->warmup_steps < 0 || c->total_steps < 0) return kda_set_error("adamw: warmup and total steps must be >= 0");
  if (c->ema_decay < 0 || c->ema_decay >= 1 || c->spike_factor < 0)
    return kda_set_error("adamw: need 0 <= ema_decay < 1 and spike_factor >= 0 (got %g, %g)", c->ema_decay, c->spike_factor);
  int32_t np = 0, nparams = g->n;
  int32_t *grads = malloc((size_t)g->n * sizeof(int32_t));
  if (!grads) return kda_set_error("out of host memory in adamw");
  for (int32_t i = 0; i < nparams; i++)
    if (g->nodes[i].op == KDA_OP_PARAM && g->nodes[i].grad >= 0) grads[np++] = g->nodes[i].grad;
  if (!np) { free(grads); return kda_set_error("adamw: no parameter has a gradient"); }
  g->gnorm = kda_graph_add(g, KDA_OP_GRAD_NORM, np, grads, NULL, NULL, NODE_KEEP);
  free(grads);
  if (g->gnorm < 0) return -1;
  kda_desc sd = {KDA_F32, 1, {8, 1, 1, 1}};
  g->state = state_leaf(g, "optim.state", &sd);
  if (g->state < 0) return -1;
  int64_t si[8] = {c->schedule, c->warmup_steps, c->total_steps};
  float sf[8] = {c->lr, c->min_lr_frac, c->decay_frac};
  if (kda_graph_add(g, KDA_OP_SCHEDULE, 1, &g->state, si, sf, NODE_INPLACE) < 0) return -1;
  int32_t gin[3] = {g->state, g->loss, g->gnorm};
  int64_t gi[8] = {c->warmup_steps > 10 ? c->warmup_steps : 10};
  float gf[8] = {c->spike_factor, 0.99f};
  if (kda_graph_add(g, KDA_OP_GUARD, 3, gin, gi, gf, NODE_INPLACE) < 0) return -1;
  for (int32_t i = 0; i < nparams; i++)
    if (g->nodes[i].op == KDA_OP_PARAM && g->nodes[i].grad >= 0 && add_update(g, c, i)) return -1;
  for (int32_t i = 0; i < nparams; i++)
    if (g->nodes[i].op == KDA_OP_PARAM && g->nodes[i].grad >= 0 && add_after_update(g, c, i)) return -1;
  g->has_optim = 1;
  return 0;
}
