/* plan.c — from a recorded graph to something a backend runs every step.
 *
 *  1. storage dtype per node (CPU: f32; CUDA: bf16 activations, f32 for PRECISE nodes)
 *  2. aliases: a VIEW shares its input's buffer; an in-place op shares in[0]'s
 *  3. liveness: a buffer lives from its producer to its last reader (KEEP: to the end)
 *  3b. fusion: a CROSS_ENTROPY and its backward under a constant dloss are paired, the
 *     backward's buffer living from the forward node on (kda_exec_node.fuse_offset)
 *  4. offsets: buffers sorted by size, each placed at the lowest offset that overlaps no
 *     buffer whose lifetime intersects its own — one arena, sized once, never grown
 *  5. persistent region: parameters, optimizer state, inputs
 *  6. the exec list: every computing node with its inputs resolved to backend pointers
 * Activations, parameters and optimizer state are allocated here, once. (The CPU reference
 * ops still take small per-call scratch: attention probability rows, RMSNorm row scales.)   */
#include <math.h>
#include <string.h>
#include "backend.h"
#include "graph.h"
#include "internal.h"

#define ALIGN 256

struct kda_plan {
  kda_graph *g;
  const kda_backend *be;
  int backend;
  int32_t n, nforward;
  int32_t *root, *first, *last, *dtype;
  int32_t *peer;             /* the fused partner's node id (3b), -1 if none */
  int64_t *offset, *bytes;   /* offset in arena (-1: not arena) or in persist (persistent) */
  char **ptr;
  char *arena, *persist;
  int64_t arena_bytes, naive_bytes, persist_bytes;
  kda_exec_node *exec;
  kda_tview *views;
  int nexec, nexec_fwd, opt_begin;   /* opt_begin: the first optimizer node (GRAD_NORM ...) */
  int32_t *state;
  int nstate;
  int profile;
  double op_seconds[KDA_OP_COUNT];
  int64_t op_calls[KDA_OP_COUNT];
};

static int32_t find_root(const kda_graph *g, int32_t i) {
  while (g->nodes[i].op == KDA_OP_VIEW || g->nodes[i].flags & NODE_INPLACE) i = g->nodes[i].in[0];
  return i;
}

static int storage_dtype(const node *nd, int backend) {
  if (backend == KDA_BACKEND_CUDA && nd->d.dtype == KDA_F32 && !(nd->flags & (NODE_PRECISE | NODE_PERSIST)))
    return KDA_BF16;
  return nd->d.dtype;
}

static int64_t align_up(int64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

/* Greedy best-offset placement. Buffers visited largest first; placed[] kept by offset. */
typedef struct { int32_t id; int64_t off, size; } slot;

static int by_size_desc(const void *a, const void *b) {
  int64_t x = ((const slot *)a)->size, y = ((const slot *)b)->size;
  return x < y ? 1 : x > y ? -1 : ((const slot *)a)->id - ((const slot *)b)->id;
}
static int by_offset(const void *a, const void *b) {
  int64_t x = ((const slot *)a)->off, y = ((const slot *)b)->off;
  return x < y ? -1 : x > y;
}

static int place_buffers(kda_plan *p, slot *bufs, int nb) {
  qsort(bufs, (size_t)nb, sizeof *bufs, by_size_desc);
  slot *live = malloc((size_t)(nb ? nb : 1) * sizeof *live);
  if (!live) return kda_set_error("out of host memory planning %d buffers", nb);
  for (int i = 0; i < nb; i++) {
    int32_t a = bufs[i].id, nl = 0;
    for (int j = 0; j < i; j++) { /* already placed and alive at the same time */
      int32_t b = bufs[j].id;
      if (p->first[a] <= p->last[b] && p->first[b] <= p->last[a]) live[nl++] = bufs[j];
    }
    qsort(live, (size_t)nl, sizeof *live, by_offset);
    int64_t off = 0;
    for (int j = 0; j < nl; j++) {
      if (live[j].off >= off + bufs[i].size) break;
      if (live[j].off + live[j].size > off) off = live[j].off + live[j].size;
    }
    bufs[i].off = off;
    p->offset[a] = off;
    if (off + bufs[i].size > p->arena_bytes) p->arena_bytes = off + bufs[i].size;
  }
  free(live);
  return 0;
}

/* The value of a chain of FILLs from the loss seed (FILL() = fattr0, FILL(s) = s * fattr0),
 * known when the plan is built; NAN when anything else feeds it (known only at run time). */
static float constant_fill(const kda_graph *g, int32_t id) {
  float v = 1.0f;
  for (;;) {
    const node *nd = &g->nodes[id];
    if (nd->op != KDA_OP_FILL) return NAN;
    v *= nd->fattr[0];
    if (nd->nin == 0) return v;
    id = nd->in[0];
  }
}

/* 3b. A mean loss's CROSS_ENTROPY_BWD reads the logits again with a dloss fixed when the plan
 * is built. Starting its buffer's life at the forward node lets a backend write the gradient
 * in the forward's pass over the logits; every node between them sees it as live. */
static void pair_cross_entropy(kda_plan *p) {
  const kda_graph *g = p->g;
  for (int32_t j = 0; j < p->n; j++) {
    const node *b = &g->nodes[j];
    if (b->op != KDA_OP_CROSS_ENTROPY_BWD || p->root[j] != j || isnan(constant_fill(g, b->in[2])))
      continue;
    for (int32_t i = 0; i < j; i++) {
      const node *f = &g->nodes[i];
      if (f->op == KDA_OP_CROSS_ENTROPY && p->peer[i] < 0 && f->in[0] == b->in[0] && f->in[1] == b->in[1]) {
        p->peer[i] = j, p->peer[j] = i;
        p->first[j] = i;
        break;
      }
    }
  }
}

static int plan_memory(kda_plan *p) {
  kda_graph *g = p->g;
  slot *bufs = malloc((size_t)p->n * sizeof *bufs);
  if (!bufs) return kda_set_error("out of host memory planning");
  int nb = 0;
  for (int32_t i = 0; i < p->n; i++) {
    node *nd = &g->nodes[i];
    p->root[i] = find_root(g, i);
    p->dtype[i] = storage_dtype(nd, p->backend);
    p->bytes[i] = align_up(kda_desc_numel(&nd->d) * kda_dtype_size(p->dtype[i]));
    p->first[i] = p->last[i] = i;
    p->offset[i] = -1;
    p->peer[i] = -1;
  }
  for (int32_t i = 0; i < p->n; i++) { /* a buffer lives until its last reader, via any alias */
    node *nd = &g->nodes[i];
    for (int j = 0; j < nd->nin; j++) {
      int32_t r = p->root[nd->in[j]];
      if (p->last[r] < i) p->last[r] = i;
    }
    if (nd->flags & NODE_KEEP) p->last[p->root[i]] = p->n;
  }
  for (int32_t i = 0; i < p->n; i++) {
    node *nd = &g->nodes[i];
    if (p->root[i] != i) continue;
    if (nd->flags & NODE_PERSIST) {
      p->offset[i] = p->persist_bytes;
      p->persist_bytes += p->bytes[i];
      continue;
    }
    bufs[nb++] = (slot){i, 0, p->bytes[i]};
    p->naive_bytes += p->bytes[i];
  }
  pair_cross_entropy(p);
  int rc = place_buffers(p, bufs, nb);
  free(bufs);
  return rc;
}

static int alloc_memory(kda_plan *p) {
  p->arena = p->be->alloc(p->arena_bytes);
  p->persist = p->be->alloc(p->persist_bytes);
  if (!p->arena || !p->persist) {
    return kda_set_error("out of %s memory: the plan needs %.1f MiB of activations and %.1f MiB of "
                         "parameters and state; use a smaller batch, seq_len or model",
                         p->be->name, (double)p->arena_bytes / 1048576.0, (double)p->persist_bytes / 1048576.0);
  }
  for (int32_t i = 0; i < p->n; i++) { /* node order: an alias's input is already placed */
    const node *nd = &p->g->nodes[i];
    if (nd->op == KDA_OP_VIEW)
      p->ptr[i] = p->ptr[nd->in[0]] + nd->iattr[0] * kda_dtype_size(p->dtype[p->root[i]]);
    else if (nd->flags & NODE_INPLACE)
      p->ptr[i] = p->ptr[nd->in[0]];
    else
      p->ptr[i] = (nd->flags & NODE_PERSIST ? p->persist : p->arena) + p->offset[i];
  }
  return 0;
}

static kda_tview tview_of(const kda_plan *p, int32_t i) {
  const node *nd = &p->g->nodes[i];
  kda_tview t = {p->ptr[i], p->dtype[p->root[i]], nd->d.ndim, {1, 1, 1, 1}};
  memcpy(t.shape, nd->d.shape, sizeof t.shape);
  return t;
}

/* The ops core/optim.c appends after the backward: the "optimizer" stage of the step timers. */
static int is_optimizer_op(int op) {
  switch (op) {
  case KDA_OP_GRAD_NORM: case KDA_OP_SCHEDULE: case KDA_OP_GUARD: case KDA_OP_ADAMW:
  case KDA_OP_MUON: case KDA_OP_EMA: case KDA_OP_RETRACT: return 1;
  default: return 0;
  }
}

static int build_exec(kda_plan *p) {
  kda_graph *g = p->g;
  int64_t nviews = 0;
  for (int32_t i = 0; i < p->n; i++) nviews += g->nodes[i].nin;
  p->exec = calloc((size_t)(p->n > 0 ? p->n : 1), sizeof *p->exec);
  p->views = calloc((size_t)(nviews ? nviews : 1), sizeof *p->views);
  if (!p->exec || !p->views) return kda_set_error("out of host memory building the exec list");
  kda_tview *v = p->views;
  for (int32_t i = 0; i < p->n; i++) {
    node *nd = &g->nodes[i];
    if (nd->flags & NODE_LEAF || nd->op == KDA_OP_VIEW) continue;
    kda_exec_node *e = &p->exec[p->nexec++];
    e->op = nd->op, e->id = i, e->nin = nd->nin, e->in = v;
    for (int j = 0; j < nd->nin; j++) *v++ = tview_of(p, nd->in[j]);
    e->out = tview_of(p, i);
    memcpy(e->iattr, nd->iattr, sizeof e->iattr);
    memcpy(e->fattr, nd->fattr, sizeof e->fattr);
    e->kept = p->last[p->root[i]] >= p->n || (g->nodes[p->root[i]].flags & NODE_PERSIST);
    if (p->peer[i] >= 0 && p->peer[i] < i) {   /* the backward half of a fused pair (3b) */
      kda_exec_node *f = e;
      while (f->id != p->peer[i]) f--;
      f->fuse_offset = (int32_t)(e - f), e->fuse_offset = -f->fuse_offset;
      f->fused_dloss = constant_fill(g, nd->in[2]);
    }
    if (i < p->nforward) p->nexec_fwd = p->nexec;
  }
  p->opt_begin = p->nexec;
  for (int i = p->nexec - 1; i >= p->nexec_fwd; i--)
    if (is_optimizer_op(p->exec[i].op)) p->opt_begin = i;
  return 0;
}

static int collect_state(kda_plan *p) {
  p->state = malloc((size_t)p->n * sizeof(int32_t));
  if (!p->state) return kda_set_error("out of host memory");
  for (int32_t i = 0; i < p->n; i++) {
    const node *nd = &p->g->nodes[i];
    if (nd->op == KDA_OP_PARAM || (nd->flags & NODE_PERSIST && nd->op == KDA_OP_INPUT && i >= p->nforward))
      p->state[p->nstate++] = i;
  }
  return 0;
}

kda_plan *kda_plan_build(kda_graph *g, int backend) {
  const kda_backend *be = backend == KDA_BACKEND_CUDA ? kda_cuda_backend() : kda_cpu_backend();
  if (!be) {
    kda_set_error("plan: the CUDA backend is not available (built without nvcc, or no GPU); use the CPU backend");
    return NULL;
  }
  kda_plan *p = calloc(1, sizeof *p);
  if (!p) { kda_set_error("out of host memory creating a plan"); return NULL; }
  p->g = g, p->be = be, p->backend = backend, p->n = g->n;
  p->nforward = g->nforward ? g->nforward : g->n;
  size_t n = (size_t)(g->n ? g->n : 1);
  p->root = malloc(n * 4), p->first = malloc(n * 4), p->last = malloc(n * 4), p->dtype = malloc(n * 4);
  p->peer = malloc(n * 4);
  p->offset = malloc(n * 8), p->bytes = malloc(n * 8), p->ptr = malloc(n * sizeof(char *));
  if (!p->root || !p->first || !p->last || !p->dtype || !p->peer || !p->offset || !p->bytes || !p->ptr) {
    kda_set_error("out of host memory creating a plan");
    kda_plan_free(p);
    return NULL;
  }
  if (plan_memory(p) || alloc_memory(p) || build_exec(p) || collect_state(p)) {
    kda_plan_free(p);
    return NULL;
  }
  return p;
}

void kda_plan_free(kda_plan *p) {
  if (!p) return;
  if (p->arena) p->be->free(p->arena);
  if (p->persist) p->be->free(p->persist);
  free(p->root), free(p->first), free(p->last), free(p->dtype), free(p->peer), free(p->offset), free(p->bytes);
  free(p->ptr), free(p->exec), free(p->views), free(p->state);
  free(p);
}

int64_t kda_plan_arena_bytes(const kda_plan *p) { return p->arena_bytes; }
int64_t kda_plan_naive_bytes(const kda_plan *p) { return p->naive_bytes; }
int64_t kda_plan_persistent_bytes(const kda_plan *p) { return p->persist_bytes; }

int64_t kda_plan_node_offset(const kda_plan *p, int32_t id) {
  if (id < 0 || id >= p->n) return -1;
  int32_t r = p->root[id];
  return p->g->nodes[r].flags & NODE_PERSIST ? -1 : p->offset[r] + (int64_t)(p->ptr[id] - p->ptr[r]);
}

int kda_plan_node_live(const kda_plan *p, int32_t id, int32_t *first, int32_t *last) {
  if (id < 0 || id >= p->n) return kda_set_error("plan: node %d does not exist", id);
  *first = p->first[p->root[id]], *last = p->last[p->root[id]];
  return 0;
}

/* ---- parameter initialisation: a counter-based generator, one stream per name ------------ */
static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double uniform01(uint64_t *s) { return ((double)(splitmix(s) >> 11) + 0.5) * 0x1.0p-53; }
/* The generator's k-th draw (k = 0, 1, ...) without the k before it: splitmix's state only
 * advances by a constant, so element j of a tensor can be computed on any thread. */
static double uniform_at(uint64_t seed, int64_t k) {
  uint64_t s = seed + (uint64_t)k * 0x9E3779B97F4A7C15ull;
  return uniform01(&s);
}

static uint64_t hash_name(const char *name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ull;
  return h;
}

/* Box-Muller: pair i/2 (i even) turns draws i and i+1 into two normals, the cos one element
 * i, the sin one element i+1. The range form writes elements [first, first+count) to
 * x[0..count): a range that starts or ends inside a pair computes the pair and keeps its half,
 * so pieces of any sizes at any offsets give, bit for bit, what one fill of the whole gives.
 * Threads split the pairs; every value is what the sequential loop gave (a 1B-parameter
 * model: ~30 s on one core). */
void kda_fill_normal_range(float *x, int64_t first, int64_t count, uint64_t seed, float std) {
  const int64_t p0 = first & ~(int64_t)1, end = first + count, npairs = count > 0 ? (end - p0 + 1) / 2 : 0;
  #pragma omp parallel for schedule(static) if (count > (1 << 16))
  for (int64_t k = 0; k < npairs; k++) {
    int64_t i = p0 + 2 * k;
    double u1 = uniform_at(seed, i), u2 = uniform_at(seed, i + 1), r = sqrt(-2.0 * log(u1));
    double c = cos(2 * M_PI * u2), s = sin(2 * M_PI * u2);   /* both: one sincos call */
    if (i >= first) x[i - first] = (float)(r * c) * std;
    if (i + 1 < end) x[i + 1 - first] = (float)(r * s) * std;
  }
}

void kda_fill_normal(float *x, int64_t n, uint64_t seed, float std) {
  kda_fill_normal_range(x, 0, n, seed, std);
}

/* One state tensor's initial value: element j is a function of (init, seed, scale, j) only. */
typedef struct init_spec {
  int init;
  uint64_t seed;
  float scale;
} init_spec;

/* Elements [first, first+count) of a tensor's initial value into x[0..count). */
static void init_range(float *x, int64_t first, int64_t count, const init_spec *sp) {
  if (sp->init == KDA_INIT_NORMAL) {
    kda_fill_normal_range(x, first, count, sp->seed, sp->scale);
    return;
  }
  #pragma omp parallel for schedule(static) if (count > (1 << 16))
  for (int64_t k = 0; k < count; k++)
    x[k] = sp->init == KDA_INIT_ONE ? 1.0f
         : sp->init == KDA_INIT_UNIFORM ? (float)(2.0 * uniform_at(sp->seed, first + k) - 1.0) * sp->scale : 0.0f;
}

/* The backend's upload fill: a byte range of the tensor's f32 storage. */
static void init_piece(void *ctx, void *chunk, int64_t offset, int64_t len) {
  init_range((float *)chunk, offset / (int64_t)sizeof(float), len / (int64_t)sizeof(float), ctx);
}

/* Parameters are generated on the host. With the backend's upload (CUDA) a tensor goes in
 * pieces through pinned staging, each piece's DMA overlapping the next piece's generation;
 * else into one host buffer of the tensor, then write (CUDA: a pageable copy after it).
 * 1.0B parameters (4 GB f32), 16 cores (predicted): generation ~1.0-1.3 s
 * either way (Box-Muller, libm log + sincos in double: ~16 ns a value on one Xeon core); the
 * plain path adds the first touch of 4 GB of fresh malloc (~1M page faults and a zeroing
 * pass, ~0.3 s), pageable copies at 5-10 GB/s with the host waiting (0.4-0.8 s) and the
 * munmaps (~0.2 s), ~2.0-2.5 s in all; upload hides its pinned copies (25-50 GB/s, 0.1-0.15 s)
 * behind the generation, ~1.0-1.3 s: about 0.9-1.2 s off the time to the first step.
 * Measured on the H200 (24f200f): L's parameter init 1.93 s, first step 3.75 -> 2.99 s. */
int kda_plan_init_params(kda_plan *p, uint64_t seed) {
  for (int i = 0; i < p->nstate; i++) {
    const node *nd = &p->g->nodes[p->state[i]];
    int64_t n = kda_desc_numel(&nd->d), bytes = n * (int64_t)sizeof(float);
    int init = nd->op == KDA_OP_PARAM ? nd->init : KDA_INIT_ZERO;   /* optimizer state: zeros */
    void *dst = p->ptr[p->state[i]];
    if (init == KDA_INIT_ZERO && p->be->zero) {
      if (p->be->zero(dst, bytes)) return -1;
      continue;
    }
    init_spec sp = {init, hash_name(nd->name, seed), nd->init_scale};
    int rc = p->be->upload ? p->be->upload(dst, bytes, init_piece, &sp) : 1;
    if (rc <= 0) {
      if (rc) return -1;
      continue;
    }
    float *buf = kda_malloc((size_t)n * sizeof(float), nd->name);   /* no upload: one buffer */
    if (!buf) return -1;
    init_range(buf, 0, n, &sp);
    rc = p->be->write(dst, buf, bytes);
    free(buf);
    if (rc) return -1;
  }
  return 0;
}

/* ---- running ----------------------------------------------------------------------------- */
static int run_cpu_profiled(kda_plan *p, int count) {
  for (int i = 0; i < count; i++) {
    double t0 = kda_now();
    if (kda_cpu_run_node(&p->exec[i])) return -1;
    p->op_seconds[p->exec[i].op] += kda_now() - t0;
    p->op_calls[p->exec[i].op]++;
  }
  return 0;
}

int kda_plan_run(kda_plan *p, int what) {
  int count = what == KDA_RUN_FORWARD ? p->nexec_fwd : p->nexec;
  if (p->profile && p->backend == KDA_BACKEND_CPU) return run_cpu_profiled(p, count);
  if (p->be->marks) p->be->marks(what == KDA_RUN_FORWARD ? count : p->nexec_fwd, what == KDA_RUN_FORWARD ? count : p->opt_begin);
  return p->be->run(p->exec, count, what);
}

static int check_io(const kda_plan *p, int32_t id, int64_t bytes, const char *verb) {
  if (id < 0 || id >= p->n) return kda_set_error("plan %s: node %d does not exist", verb, id);
  const node *nd = &p->g->nodes[id];
  int64_t want = kda_desc_numel(&nd->d) * kda_dtype_size(p->dtype[p->root[id]]);
  if (bytes != want)
    return kda_set_error("plan %s: node %d ('%s', %s) holds %lld bytes, got %lld", verb, id, nd->name,
                         kda_op_name(nd->op), (long long)want, (long long)bytes);
  return 0;
}

int kda_plan_write(kda_plan *p, int32_t id, const void *src, int64_t bytes) {
  if (check_io(p, id, bytes, "write")) return -1;
  if (!(p->g->nodes[id].flags & NODE_PERSIST))
    return kda_set_error("plan write: node %d is computed, not an input or parameter", id);
  /* a batch (an input of the forward, not optimizer state or a parameter): no host wait */
  if (p->be->write_input && p->g->nodes[id].op == KDA_OP_INPUT && id < p->nforward && bytes <= ((int64_t)64 << 20))
    return p->be->write_input(p->ptr[id], src, bytes);
  return p->be->write(p->ptr[id], src, bytes);
}

int kda_plan_read(kda_plan *p, int32_t id, void *dst, int64_t bytes) {
  if (check_io(p, id, bytes, "read")) return -1;
  return p->be->read(dst, p->ptr[id], bytes);
}

int kda_plan_node_dtype(const kda_plan *p, int32_t id) {
  return id >= 0 && id < p->n ? p->dtype[p->root[id]] : -1;
}
int kda_plan_nstate(const kda_plan *p) { return p->nstate; }
const char *kda_plan_state_name(const kda_plan *p, int i) {
  return i >= 0 && i < p->nstate ? p->g->nodes[p->state[i]].name : "";
}
int32_t kda_plan_state_node(const kda_plan *p, int i) { return i >= 0 && i < p->nstate ? p->state[i] : -1; }
double kda_plan_op_seconds(const kda_plan *p, int op) { return op >= 0 && op < KDA_OP_COUNT ? p->op_seconds[op] : 0; }
int64_t kda_plan_op_calls(const kda_plan *p, int op) { return op >= 0 && op < KDA_OP_COUNT ? p->op_calls[op] : 0; }
int kda_plan_set_profile(kda_plan *p, int on) { p->profile = on; return 0; }
