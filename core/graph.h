/* graph.h — the graph's private layout, shared by graph.c, autodiff.c, optim.c and plan.c. */
#ifndef KDA_GRAPH_H
#define KDA_GRAPH_H
#include "ops.h"

enum node_flags {
  NODE_LEAF = 1,      /* input, param or optimizer state: no producer */
  NODE_PERSIST = 2,   /* lives outside the arena for the plan's lifetime */
  NODE_KEEP = 4,      /* read by the host after a run: live to the end */
  NODE_INPLACE = 8,   /* writes into in[0] (optimizer ops) */
  NODE_PRECISE = 16,  /* stored in f32 on every backend (param grads, losses, scalars) */
  NODE_GRAD = 32,     /* emitted by kda_graph_backward */
};

typedef struct node {
  int32_t op, nin, flags;
  kda_desc d;
  int32_t *in;
  int64_t iattr[8];
  float fattr[8];
  char *name;
  int32_t grad;       /* gradient node, -1 if none */
  int32_t init, param_flags;
  float init_scale;
} node;

struct kda_graph {
  node *nodes;
  int32_t n, cap;
  int32_t nforward;   /* nodes [0, nforward) are the forward pass (set by backward) */
  int32_t loss;       /* the node backward started from, -1 before */
  int32_t state, gnorm;
  int has_optim;
  struct leaf_name { char *key; int32_t value; } *leaves; /* stb_ds string map: name -> leaf id */
};

int32_t kda_graph_add(kda_graph *g, int op, int nin, const int32_t *in, const int64_t *iattr,
                      const float *fattr, int flags);
int32_t kda_graph_leaf(kda_graph *g, int op, const char *name, const kda_desc *d, int flags);
#endif
