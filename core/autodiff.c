/* autodiff.c — reverse-mode differentiation by emitting nodes.
 *
 * kda_graph_backward walks the forward nodes from the loss back to the leaves. Each op has one
 * rule that, given the gradient dy of its output, records nodes computing the gradients of its
 * inputs. A node used twice gets the sum of its gradients (ADD). Only nodes that depend on a
 * parameter are differentiated. Gradients of parameters are stored in f32 on every backend.  */
#include <math.h>
#include <string.h>
#include "graph.h"
#include "internal.h"

static int32_t emit(kda_graph *g, int op, int nin, const int32_t *in, const int64_t *ia, const float *fa) {
  return kda_graph_add(g, op, nin, in, ia, fa, NODE_GRAD);
}

static int32_t emit1(kda_graph *g, int op, int32_t a, float f) {
  float fa[8] = {f};
  return emit(g, op, 1, &a, NULL, fa);
}

static int32_t emit2(kda_graph *g, int op, int32_t a, int32_t b, int64_t i0, int64_t i1) {
  int32_t in[2] = {a, b};
  int64_t ia[8] = {i0, i1};
  return emit(g, op, 2, in, ia, NULL);
}

/* A view of `src` (offset elements in) with the shape of node `like`. */
static int32_t view_like(kda_graph *g, int32_t src, int64_t offset, int32_t like) {
  const kda_desc *d = &g->nodes[like].d;
  int64_t ia[8] = {offset, d->ndim};
  for (int i = 0; i < d->ndim; i++) ia[2 + i] = d->shape[i];
  return emit(g, KDA_OP_VIEW, 1, &src, ia, NULL);
}

/* FILL: s [1] (or nothing) times f, broadcast to the shape of `like`. */
static int32_t fill_like(kda_graph *g, int32_t s, float f, int32_t like) {
  const kda_desc *d = &g->nodes[like].d;
  int64_t ia[8] = {d->ndim};
  float fa[8] = {f};
  for (int i = 0; i < d->ndim; i++) ia[1 + i] = d->shape[i];
  return emit(g, KDA_OP_FILL, s >= 0 ? 1 : 0, &s, ia, fa);
}

/* f32 storage for a parameter-gradient contribution; a view's whole base buffer with it. */
static void mark_precise(kda_graph *g, int32_t id) {
  for (;;) {
    node *c = &g->nodes[id];
    c->flags |= NODE_PRECISE;
    if (c->op != KDA_OP_VIEW) return;
    id = c->in[0];
  }
}

/* grad[x] += dx. A parameter's gradient and every contribution summed into it are precise;
 * the final sum is KEEP (readable after the step; the optimizer runs last anyway). */
static int accumulate(kda_graph *g, int32_t x, int32_t dx) {
  if (dx < 0) return -1;
  int32_t old = g->nodes[x].grad;
  int32_t sum = old >= 0 ? emit2(g, KDA_OP_ADD, old, dx, 0, 0) : dx;
  if (sum < 0) return -1;
  g->nodes[x].grad = sum;
  if (g->nodes[x].op == KDA_OP_PARAM) {
    mark_precise(g, dx);
    mark_precise(g, sum);
    if (old >= 0) g->nodes[old].flags &= ~NODE_KEEP; /* a partial sum: the ADD reads it */
    g->nodes[sum].flags |= NODE_KEEP;
  }
  return 0;
}

static int is_broadcast(const kda_graph *g, int32_t a, int32_t b) {
  return kda_desc_numel(&g->nodes[a].d) != kda_desc_numel(&g->nodes[b].d);
}

/* op(a) @ op(b) = C:  dA' = dC B'^T,  dB' = A'^T dC; transposed operands flip the products. */
static int grad_matmul(kda_graph *g, const node *y, int32_t dy, const char *need) {
  int32_t a = y->in[0], b = y->in[1];
  int ta = (int)y->iattr[0], tb = (int)y->iattr[1];
  int shared_b = g->nodes[a].d.ndim == 3 && g->nodes[b].d.ndim == 2;
  if (need[0]) {
    int32_t da = ta ? emit2(g, KDA_OP_MATMUL, b, dy, tb, 1) : emit2(g, KDA_OP_MATMUL, dy, b, 0, !tb);
    if (ta && shared_b) return kda_set_error("matmul backward: a transposed 3-D a with a shared 2-D b is not supported; reshape a to 2-D");
    if (accumulate(g, a, da)) return -1;
  }
  if (need[1]) {
    int32_t aa = a, dd = dy;
    if (shared_b) { /* sum over the batch: fold it into the rows */
      if (ta) return kda_set_error("matmul backward: a transposed 3-D a with a shared 2-D b is not supported; reshape a to 2-D");
      const kda_desc *da = &g->nodes[a].d, *dc = &g->nodes[dy].d;
      int64_t ia[8] = {0, 2, da->shape[0] * da->shape[1], da->shape[2]};
      aa = emit(g, KDA_OP_VIEW, 1, &a, ia, NULL);
      int64_t ic[8] = {0, 2, dc->shape[0] * dc->shape[1], dc->shape[2]};
      dd = emit(g, KDA_OP_VIEW, 1, &dy, ic, NULL);
      if (aa < 0 || dd < 0) return -1;
    }
    int32_t db = tb ? emit2(g, KDA_OP_MATMUL, dd, aa, 1, ta) : emit2(g, KDA_OP_MATMUL, aa, dd, !ta, 0);
    if (accumulate(g, b, db)) return -1;
  }
  return 0;
}

static int grad_binary(kda_graph *g, const node *y, int32_t dy, const char *need) {
  int32_t a = y->in[0], b = y->in[1];
  int bc = is_broadcast(g, a, b);
  if (y->op == KDA_OP_ADD) {
    if (need[0] && accumulate(g, a, dy)) return -1;
    if (need[1] && accumulate(g, b, bc ? emit1(g, KDA_OP_SUM_ROWS, dy, 0) : dy)) return -1;
    return 0;
  }
  if (need[0] && accumulate(g, a, emit2(g, KDA_OP_MUL, dy, b, 0, 0))) return -1;
  if (need[1]) {
    int32_t t = emit2(g, KDA_OP_MUL, dy, a, 0, 0);
    if (accumulate(g, b, bc ? emit1(g, KDA_OP_SUM_ROWS, t, 0) : t)) return -1;
  }
  return 0;
}

/* Gradients for node y = op(inputs) given dy. need[i]: input i depends on a parameter. */
static int grad_rule(kda_graph *g, int32_t yid, int32_t dy, const char *need) {
  node y = g->nodes[yid]; /* copy: emitting nodes may move the array */
  int32_t x = y.nin ? y.in[0] : -1;
  switch (y.op) {
  case KDA_OP_MATMUL: return grad_matmul(g, &y, dy, need);
  case KDA_OP_ADD: case KDA_OP_MUL: return grad_binary(g, &y, dy, need);
  case KDA_OP_SCALE: return accumulate(g, x, emit1(g, KDA_OP_SCALE, dy, y.fattr[0]));
  case KDA_OP_SUM_ROWS: return accumulate(g, x, emit2(g, KDA_OP_MUL, fill_like(g, -1, 1.0f, x), dy, 0, 0));
  case KDA_OP_EMBED:
    if (need[1]) return kda_set_error("embed: indices are not differentiable");
    return accumulate(g, x, emit2(g, KDA_OP_EMBED_BWD, dy, y.in[1], g->nodes[x].d.shape[0], 0));
  case KDA_OP_RMSNORM: {
    int32_t in[3] = {x, y.in[1], dy};
    int32_t p = emit(g, KDA_OP_RMSNORM_BWD, 3, in, NULL, y.fattr);
    if (p < 0) return -1;
    if (need[0] && accumulate(g, x, view_like(g, p, 0, x))) return -1;
    if (need[1] && accumulate(g, y.in[1], view_like(g, p, kda_desc_numel(&g->nodes[x].d), y.in[1]))) return -1;
    return 0;
  }
  case KDA_OP_SILU: return accumulate(g, x, emit2(g, KDA_OP_SILU_BWD, x, dy, 0, 0));
  case KDA_OP_GELU: return accumulate(g, x, emit2(g, KDA_OP_GELU_BWD, x, dy, 0, 0));
  case KDA_OP_SIGMOID: return accumulate(g, x, emit2(g, KDA_OP_SIGMOID_BWD, yid, dy, 0, 0));
  case KDA_OP_SOFTMAX: return accumulate(g, x, emit2(g, KDA_OP_SOFTMAX_BWD, yid, dy, 0, 0));
  case KDA_OP_SWIGLU: {
    int32_t in[3] = {x, y.in[1], dy};
    int32_t p = emit(g, KDA_OP_SWIGLU_BWD, 3, in, NULL, NULL);
    if (p < 0) return -1;
    if (need[0] && accumulate(g, x, view_like(g, p, 0, x))) return -1;
    if (need[1] && accumulate(g, y.in[1], view_like(g, p, kda_desc_numel(&g->nodes[x].d), y.in[1]))) return -1;
    return 0;
  }
  case KDA_OP_ROPE: { /* the inverse rotation at the same positions (pos, when given) */
    int64_t ia[8] = {!y.iattr[0]};
    int32_t in[2] = {dy, y.nin > 1 ? y.in[1] : -1};
    return accumulate(g, x, emit(g, KDA_OP_ROPE, y.nin, in, ia, y.fattr));
  }
  case KDA_OP_ATTENTION: {
    int32_t in[4] = {y.in[0], y.in[1], y.in[2], dy};
    int32_t p = emit(g, KDA_OP_ATTENTION_BWD, 4, in, NULL, y.fattr);
    if (p < 0) return -1;
    int64_t numel = kda_desc_numel(&g->nodes[x].d);
    for (int i = 0; i < 3; i++)
      if (need[i] && accumulate(g, y.in[i], view_like(g, p, i * numel, y.in[i]))) return -1;
    return 0;
  }
  case KDA_OP_KDA: { /* one KDA_BWD writes dq, dk, dv, dg, dbeta, dA_log, ddt_bias back to back */
    int32_t in[8];
    for (int i = 0; i < 7; i++) in[i] = y.in[i];
    in[7] = dy;
    int32_t p = emit(g, KDA_OP_KDA_BWD, 8, in, y.iattr, y.fattr);
    if (p < 0) return -1;
    int64_t off = 0;
    for (int i = 0; i < 7; i++) {
      if (need[i] && accumulate(g, y.in[i], view_like(g, p, off, y.in[i]))) return -1;
      off += kda_desc_numel(&g->nodes[y.in[i]].d);
    }
    return 0;
  }
  case KDA_OP_CONV1D: {
    int32_t in[3] = {x, y.in[1], dy};
    int32_t p = emit(g, KDA_OP_CONV1D_BWD, 3, in, y.iattr, NULL);
    if (p < 0) return -1;
    if (need[0] && accumulate(g, x, view_like(g, p, 0, x))) return -1;
    if (need[1] && accumulate(g, y.in[1], view_like(g, p, kda_desc_numel(&g->nodes[x].d), y.in[1]))) return -1;
    return 0;
  }
  case KDA_OP_CROSS_ENTROPY: {
    int32_t in[3] = {x, y.in[1], dy};
    return accumulate(g, x, emit(g, KDA_OP_CROSS_ENTROPY_BWD, 3, in, NULL, NULL));
  }
  case KDA_OP_SUM: return accumulate(g, x, fill_like(g, dy, 1.0f, x));
  case KDA_OP_MEAN: return accumulate(g, x, fill_like(g, dy, 1.0f / (float)kda_desc_numel(&g->nodes[x].d), x));
  case KDA_OP_FILL:
    if (!y.nin) return 0;
    return accumulate(g, x, emit1(g, KDA_OP_SCALE, emit1(g, KDA_OP_SUM, dy, 0), y.fattr[0]));
  case KDA_OP_VIEW:
    if (y.iattr[0] != 0 || kda_desc_numel(&y.d) != kda_desc_numel(&g->nodes[x].d))
      return kda_set_error("view: gradients flow only through whole-tensor views (reshapes); "
                           "use separate parameters instead of slicing one");
    return accumulate(g, x, view_like(g, dy, 0, x));
  case KDA_OP_TRANSPOSE: return accumulate(g, x, emit(g, KDA_OP_TRANSPOSE, 1, &dy, y.iattr, NULL));
  default:
    return kda_set_error("%s: no backward rule (node %d)", kda_op_name(y.op), yid);
  }
}

int kda_graph_backward(kda_graph *g, int32_t loss) {
  if (loss < 0 || loss >= g->n) return kda_set_error("backward: loss node %d does not exist", loss);
  if (kda_desc_numel(&g->nodes[loss].d) != 1)
    return kda_set_error("backward: the loss must be a scalar [1]; reduce it with mean or sum first");
  if (g->nforward) return kda_set_error("backward: this graph already has a backward pass");
  int32_t nf = g->n;
  char *dep = calloc((size_t)nf, 1); /* dep[i]: node i depends on a parameter */
  if (!dep) return kda_set_error("out of host memory in backward");
  for (int32_t i = 0; i < nf; i++) {
    dep[i] = g->nodes[i].op == KDA_OP_PARAM;
    for (int j = 0; j < g->nodes[i].nin; j++) dep[i] |= dep[g->nodes[i].in[j]];
  }
  g->nforward = nf;
  g->loss = loss;
  g->nodes[loss].flags |= NODE_KEEP;
  int rc = 0;
  if (!dep[loss]) {
    rc = kda_set_error("backward: the loss does not depend on any parameter");
    goto done;
  }
  rc = accumulate(g, loss, fill_like(g, -1, 1.0f, loss));
  for (int32_t i = loss; i >= 0 && rc == 0; i--) {
    if (!dep[i] || g->nodes[i].grad < 0 || g->nodes[i].flags & NODE_LEAF) continue;
    char need[64] = {0};
    for (int j = 0; j < g->nodes[i].nin && j < 64; j++) need[j] = dep[g->nodes[i].in[j]];
    rc = grad_rule(g, i, g->nodes[i].grad, need);
  }
done:
  free(dep);
  return rc;
}
