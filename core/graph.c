/* graph.c — recording nodes. Nothing is computed here; shapes are checked once, on entry.
 * Node ids are indices in append order, which is also a valid execution order. */
#include <string.h>
#include "graph.h"
#include "internal.h"
#define STB_DS_IMPLEMENTATION /* stb_ds (libstb-dev): the name -> leaf map; defined once, here */
#include <stb/stb_ds.h>

static const char *dtype_names[] = {"f32", "bf16", "i32", "u8", "f64"};
static const int64_t dtype_sizes[] = {4, 2, 4, 1, 8};

int64_t kda_dtype_size(int dtype) { return dtype >= 0 && dtype <= KDA_F64 ? dtype_sizes[dtype] : 0; }
const char *kda_dtype_name(int dtype) { return dtype >= 0 && dtype <= KDA_F64 ? dtype_names[dtype] : "?"; }

kda_graph *kda_graph_new(void) {
  kda_graph *g = calloc(1, sizeof *g);
  if (!g) { kda_set_error("out of host memory creating a graph"); return NULL; }
  g->state = g->gnorm = g->loss = -1;
  sh_new_strdup(g->leaves); /* the map keeps its own copies of the names */
  return g;
}

void kda_graph_free(kda_graph *g) {
  if (!g) return;
  for (int32_t i = 0; i < g->n; i++) free(g->nodes[i].in), free(g->nodes[i].name);
  free(g->nodes);
  shfree(g->leaves);
  free(g);
}

static node *push(kda_graph *g) {
  if (g->n == g->cap) {
    int32_t cap = g->cap ? 2 * g->cap : 256;
    node *nn = realloc(g->nodes, (size_t)cap * sizeof *nn);
    if (!nn) { kda_set_error("out of host memory growing a graph to %d nodes", cap); return NULL; }
    g->nodes = nn, g->cap = cap;
  }
  node *nd = &g->nodes[g->n];
  memset(nd, 0, sizeof *nd);
  nd->grad = -1;
  return nd;
}

static int check_shape(int ndim, const int64_t *shape, const char *what) {
  if (ndim < 1 || ndim > 4) return kda_set_error("%s: ndim must be 1..4, got %d", what, ndim);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 1) return kda_set_error("%s: dim %d is %lld; every dim must be >= 1", what, i, (long long)shape[i]);
  return 0;
}

int32_t kda_graph_leaf(kda_graph *g, int op, const char *name, const kda_desc *d, int flags) {
  if (name && *name && kda_graph_find(g, name) >= 0)
    return kda_set_error("graph: the name '%s' is already used; give each parameter and input its own name", name);
  node *nd = push(g);
  if (!nd) return -1;
  nd->op = op, nd->d = *d, nd->flags = NODE_LEAF | flags;
  nd->name = strdup(name ? name : "");
  if (!nd->name) return kda_set_error("out of host memory naming a leaf");
  if (*nd->name) shput(g->leaves, nd->name, g->n);
  return g->n++;
}

int32_t kda_graph_input(kda_graph *g, const char *name, int dtype, int ndim, const int64_t *shape) {
  if (check_shape(ndim, shape, name)) return -1;
  if (dtype < 0 || dtype > KDA_F64) return kda_set_error("input '%s': unknown dtype %d", name, dtype);
  kda_desc d = {dtype, ndim, {1, 1, 1, 1}};
  memcpy(d.shape, shape, (size_t)ndim * sizeof *shape);
  return kda_graph_leaf(g, KDA_OP_INPUT, name, &d, NODE_PERSIST | NODE_PRECISE);
}

int32_t kda_graph_param(kda_graph *g, const char *name, int ndim, const int64_t *shape, int init,
                        float scale, int flags) {
  if (!name || !*name) return kda_set_error("param: every parameter needs a name (it becomes its checkpoint key)");
  if (check_shape(ndim, shape, name)) return -1;
  kda_desc d = {KDA_F32, ndim, {1, 1, 1, 1}};
  memcpy(d.shape, shape, (size_t)ndim * sizeof *shape);
  int32_t id = kda_graph_leaf(g, KDA_OP_PARAM, name, &d, NODE_PERSIST | NODE_PRECISE);
  if (id < 0) return -1;
  g->nodes[id].init = init, g->nodes[id].init_scale = scale, g->nodes[id].param_flags = flags;
  return id;
}

int32_t kda_graph_add(kda_graph *g, int op, int nin, const int32_t *in, const int64_t *iattr,
                      const float *fattr, int flags) {
  kda_desc out, *din = kda_malloc((size_t)(nin > 0 ? nin : 1) * sizeof *din, "op inputs");
  if (!din) return -1;
  int rc = nin < 0 ? kda_set_error("%s: negative input count %d", kda_op_name(op), nin) : 0;
  for (int i = 0; i < nin && rc == 0; i++) {
    if (in[i] < 0 || in[i] >= g->n)
      rc = kda_set_error("%s: input %d is node %d, which does not exist (a failed op earlier?)", kda_op_name(op), i, in[i]);
    else din[i] = g->nodes[in[i]].d;
  }
  if (rc == 0) rc = kda_op_infer(op, nin, din, iattr, fattr, &out);
  free(din);
  if (rc) return -1;
  node *nd = push(g);
  if (!nd) return -1;
  nd->op = op, nd->nin = nin, nd->d = out, nd->flags = flags;
  nd->in = malloc((size_t)(nin ? nin : 1) * sizeof(int32_t));
  nd->name = strdup("");
  if (!nd->in || !nd->name) return kda_set_error("out of host memory recording %s", kda_op_name(op));
  memcpy(nd->in, in, (size_t)nin * sizeof(int32_t));
  if (iattr) memcpy(nd->iattr, iattr, sizeof nd->iattr);
  if (fattr) memcpy(nd->fattr, fattr, sizeof nd->fattr);
  if (out.ndim == 1 && out.shape[0] == 1) nd->flags |= NODE_PRECISE; /* scalars stay f32 */
  if (op == KDA_OP_CROSS_ENTROPY) nd->flags |= NODE_PRECISE;
  return g->n++;
}

int32_t kda_graph_op(kda_graph *g, int op, int nin, const int32_t *in, const int64_t *iattr,
                     const float *fattr) {
  if (op == KDA_OP_SCHEDULE || op == KDA_OP_ADAMW || op == KDA_OP_GUARD || op == KDA_OP_MUON ||
      op == KDA_OP_EMA || op == KDA_OP_RETRACT || op == KDA_OP_INPUT || op == KDA_OP_PARAM)
    return kda_set_error("%s: made by kda_graph_input/param/adamw, not kda_graph_op", kda_op_name(op));
  return kda_graph_add(g, op, nin, in, iattr, fattr, 0);
}

int kda_graph_keep(kda_graph *g, int32_t id) {
  if (id < 0 || id >= g->n) return kda_set_error("keep: node %d does not exist", id);
  g->nodes[id].flags |= NODE_KEEP;
  return 0;
}

int32_t kda_graph_nnodes(const kda_graph *g) { return g->n; }
int kda_graph_node_op(const kda_graph *g, int32_t id) { return id >= 0 && id < g->n ? g->nodes[id].op : -1; }
int kda_graph_node_dtype(const kda_graph *g, int32_t id) { return id >= 0 && id < g->n ? g->nodes[id].d.dtype : -1; }
int kda_graph_node_ndim(const kda_graph *g, int32_t id) { return id >= 0 && id < g->n ? g->nodes[id].d.ndim : -1; }
int64_t kda_graph_node_dim(const kda_graph *g, int32_t id, int i) {
  if (id < 0 || id >= g->n || i < 0 || i >= g->nodes[id].d.ndim) return -1;
  return g->nodes[id].d.shape[i];
}
int64_t kda_graph_node_iattr(const kda_graph *g, int32_t id, int i) {
  return id >= 0 && id < g->n && i >= 0 && i < 8 ? g->nodes[id].iattr[i] : -1;
}
const char *kda_graph_node_name(const kda_graph *g, int32_t id) { return id >= 0 && id < g->n ? g->nodes[id].name : ""; }
int32_t kda_graph_grad(const kda_graph *g, int32_t id) { return id >= 0 && id < g->n ? g->nodes[id].grad : -1; }
int32_t kda_graph_state_node(const kda_graph *g) { return g->state; }
int32_t kda_graph_gnorm_node(const kda_graph *g) { return g->gnorm; }

/* A hash lookup: models with thousands of named leaves are recorded in linear time. */
int32_t kda_graph_find(const kda_graph *g, const char *name) {
  if (!name || !*name) return -1;
  struct leaf_name *m = g->leaves; /* shgeti does not take a const map */
  ptrdiff_t i = shgeti(m, name);
  return i < 0 ? -1 : m[i].value;
}

int64_t kda_graph_param_count(const kda_graph *g) {
  int64_t total = 0;
  for (int32_t i = 0; i < g->n; i++)
    if (g->nodes[i].op == KDA_OP_PARAM) total += kda_desc_numel(&g->nodes[i].d);
  return total;
}
