/* cpu_kda.c — KDA_OP_KDA / KDA_OP_KDA_BWD / KDA_OP_CONV1D / KDA_OP_CONV1D_BWD on the CPU, and
 * their one-token decode forms (KDA_OP_KDA_DECODE, KDA_OP_CONV1D_DECODE), which update a state
 * leaf (a kda_graph_input: persistent, outside the arena) in place.
 *
 * Glue only: the exec node's views become a kda_kda_args / kda_conv_args and the fp32
 * reference in core/kda_ref.c does the math (chunked forward §3, chunked backward §4 of
 * /work/shared/docs/KDA.md). Shapes were checked by kda_op_infer when the node was recorded.
 * Multi-result backwards write one packed buffer in the order the autodiff rule cuts it.    */
#include "backend.h"
#include "internal.h"
#include "kda_ref.h"

static float *F(const kda_tview *t) { return (float *)t->data; }

kda_kda_args kda_kda_args_of(const kda_exec_node *n) {
  const kda_tview *q = &n->in[0], *v = &n->in[2];
  kda_kda_args a = {0};
  a.B = q->shape[0], a.T = q->shape[1], a.H = q->shape[2], a.K = q->shape[3];
  a.HV = v->shape[2], a.V = v->shape[3];
  a.gate_mode = (int32_t)n->iattr[0];
  a.qk_l2norm = (int32_t)n->iattr[1];
  a.beta_mode = (int32_t)n->iattr[2];
  a.chunk = n->iattr[3] ? (int32_t)n->iattr[3] : 64;
  a.precise_gate = (int32_t)n->iattr[4];
  a.scale = n->fattr[0];
  a.lower_bound = n->fattr[1];
  return a;
}

static kda_conv_args conv_args_of(const kda_exec_node *n) {
  const kda_tview *x = &n->in[0], *w = &n->in[1];
  kda_conv_args a = {0};
  a.B = x->shape[0], a.T = x->shape[1], a.C = x->shape[2], a.W = w->shape[1];
  a.silu = n->iattr[0] != 0;
  return a;
}

int kda_cpu_kda_node(const kda_exec_node *n) {
  switch (n->op) {
  case KDA_OP_KDA: {
    kda_kda_args a = kda_kda_args_of(n);
    return kda_kdaref_forward(&a, F(&n->in[0]), F(&n->in[1]), F(&n->in[2]), F(&n->in[3]),
                              F(&n->in[4]), F(&n->in[5]), F(&n->in[6]), NULL, F(&n->out), NULL);
  }
  case KDA_OP_KDA_BWD: {
    kda_kda_args a = kda_kda_args_of(n);
    int64_t nq = kda_tview_numel(&n->in[0]), nv = kda_tview_numel(&n->in[2]);
    int64_t ng = kda_tview_numel(&n->in[3]), nb = kda_tview_numel(&n->in[4]);
    float *dq = F(&n->out), *dk = dq + nq, *dv = dk + nq, *dg = dv + nv, *db = dg + ng;
    float *dA = db + nb, *ddt = dA + a.HV;
    return kda_kdaref_backward(&a, F(&n->in[0]), F(&n->in[1]), F(&n->in[2]), F(&n->in[3]),
                               F(&n->in[4]), F(&n->in[5]), F(&n->in[6]), NULL, F(&n->in[7]),
                               NULL, dq, dk, dv, dg, db, dA, ddt, NULL);
  }
  case KDA_OP_CONV1D: {
    kda_conv_args a = conv_args_of(n);
    return kda_convref_forward(&a, F(&n->in[0]), F(&n->in[1]), F(&n->out), NULL);
  }
  case KDA_OP_CONV1D_BWD: {
    kda_conv_args a = conv_args_of(n);
    float *dx = F(&n->out), *dw = dx + kda_tview_numel(&n->in[0]);
    return kda_convref_backward(&a, F(&n->in[0]), F(&n->in[1]), F(&n->in[2]), dx, dw);
  }
  case KDA_OP_KDA_DECODE: { /* one token; the state leaf in[7] is updated in place */
    kda_kda_args a = kda_kda_args_of(n);
    return kda_kdaref_step(&a, F(&n->in[0]), F(&n->in[1]), F(&n->in[2]), F(&n->in[3]), F(&n->in[4]),
                           F(&n->in[5]), F(&n->in[6]), F(&n->in[7]), F(&n->out));
  }
  case KDA_OP_CONV1D_DECODE: { /* one token; the cache leaf in[2] is updated in place */
    kda_conv_args a = conv_args_of(n);
    return kda_convref_step(&a, F(&n->in[0]), F(&n->in[1]), F(&n->in[2]), F(&n->out));
  }
  default:
    return kda_set_error("%s: not a KDA op", kda_op_name(n->op));
  }
}
