/* backend_cuda.cu — the CUDA backend: memory, the exec-list runner and whole-step graphs.
 *
 * run(nodes, n, key) executes the list in order on one stream. Per key:
 *   call 1   eager (warm-up: cuBLASLt heuristics are chosen and cached, scratch is sized)
 *   call 2   the same launches recorded by stream capture, instantiated, then launched
 *   call 3+  cudaGraphLaunch of that executable graph: one CPU call per step
 * The plan promises the same pointers for the same key; a cheap signature of the list guards
 * that promise (a changed list is run eagerly again and re-captured). KDA_NO_GRAPH=1 forces
 * eager runs; KDA_CUDA_SYNC=1 synchronises after every eager node so that an asynchronous
 * fault names its node.
 *
 * Every eager run and capture of a list starts with the refresh of the bf16 shadows of its
 * f32 GEMM weights (shadow_plan; KDA_NO_SHADOW=1 turns them off), runs each stretch of
 * consecutive ADAMW nodes as one multi-tensor launch (kc_adamw_multi) and the node pairs that
 * fuse_plan finds safe as one kernel each (KDA_NO_FUSE=1 turns them off).
 *
 * A KDA node and its KDA_BWD in the same list (the same seven inputs) share a workspace of
 * their own (keep_plan), so the forward leaves its internals for the backward instead of the
 * backward recomputing them (kda_kda_args.keep; KDA_KDA_KEEP=0 turns it off). One such
 * workspace per KDA layer, freed with the plan buffer that holds its inputs.
 *
 * Scratch: one device buffer shared by every node (they run in order on one stream), sized to
 * the largest need of any list seen. Growing it moves it, so every captured graph is dropped
 * then and captured again; it only happens during the warm-up of a new list.              */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "kda_cuda_api.h"
#include "kda_cuda.h"

/* ---- global state ------------------------------------------------------------------------ */
typedef struct graph_entry {
  int key, calls;
  uint64_t sig;
  cudaGraphExec_t exec;
} graph_entry;

typedef struct input_slot {   /* one graph input's pinned host buffer and device staging */
  void *dst, *host, *stage;
  int64_t cap;
  cudaEvent_t copied, consumed;
} input_slot;

enum { MAX_GRAPHS = 64, MAX_ALLOCS = 65536, MAX_SHADOWS = 2048, MAX_KEPT = 512 };

typedef struct kept_ws {      /* a KDA / KDA_BWD pair's own workspace, by the pair's inputs */
  const void *in[7];
  int64_t bytes;
  void *ws;
  void *block;                 /* the allocation it lies in (shared by the layers of a chain) */
  kda_kda_args a;              /* the shapes it was sized for */
} kept_ws;

static struct {
  int state;                   /* 0 untried, 1 ready, -1 no device */
  int no_graph, sync_each, profile;
  kc_ctx ctx;
  graph_entry graphs[MAX_GRAPHS];
  int ngraphs;
  /* allocation book-keeping for the peak-memory figure */
  void *ptr[MAX_ALLOCS];
  int64_t bytes[MAX_ALLOCS];
  int nalloc;
  int64_t cur, peak;
  char name[256];
  /* bf16 shadows of f32 GEMM operands: a pool of persistent copies (by source pointer and
   * size, freed with their source) and the active set of the list being run */
  int no_shadow, no_fuse;
  kc_shadow pool[MAX_SHADOWS];
  int npool;
  kc_shadow act[MAX_SHADOWS];
  int nact;
  /* per-stage timers: events at the start, the backward, the optimizer and the end of every
   * training list (recorded inside captured graphs too), read at the logging cadence */
  int mark_bwd, mark_opt, stages_recorded;
  cudaEvent_t stage_ev[4];
  /* batches: pinned host copy -> device staging on the side stream -> the input buffer on
   * kda's stream, so the host never waits for the step in flight (cu_write_input) */
  cudaStream_t side;
  input_slot in[16];
  int nin;
  /* kept KDA workspaces (keep_plan) */
  int no_keep;
  kept_ws kept[MAX_KEPT];
  int nkept;
} G;

static const char *op_name(int op) { return kda_op_name(op); }

static void shape_str(const kda_tview *t, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "%s[", t->dtype == KDA_BF16 ? "bf16" : t->dtype == KDA_F32 ? "f32" : t->dtype == KDA_I32 ? "i32" : "?");
  for (int i = 0; i < t->ndim && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)t->shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

int kc_fail(const kda_exec_node *n, const char *call, const char *why, const char *file,
            int line) {
  if (!n) return kda_set_error("cuda: %s failed (%s) at %s:%d", call, why, file, line);
  char o[96], a[96] = "", b[96] = "";
  shape_str(&n->out, o, sizeof o);
  if (n->nin > 0) shape_str(&n->in[0], a, sizeof a);
  if (n->nin > 1) shape_str(&n->in[1], b, sizeof b);
  return kda_set_error("cuda: %s failed (%s) in op %s node %d: out %s in %s %s (%s:%d)", call,
                       why, op_name(n->op), n->id, o, a, b, file, line);
}

#define CK(call)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) return kc_fail(NULL, #call, cudaGetErrorString(e_), __FILE__,   \
                                          __LINE__);                                       \
  } while (0)

static void *dev_alloc(int64_t bytes, const char *what);
static void *kda_kept_ws(const kda_exec_node *n, int64_t *bytes);

/* ---- initialisation ---------------------------------------------------------------------- */
static int init_once(void) {
  if (G.state) return G.state > 0 ? 0 : -1;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    cudaGetLastError();        /* clear the sticky "no device" so nothing else reports it */
    G.state = -1;
    return -1;
  }
  const char *e = getenv("KDA_NO_GRAPH");
  G.no_graph = e && *e && strcmp(e, "0") != 0;
  e = getenv("KDA_CUDA_SYNC");
  G.sync_each = e && *e && strcmp(e, "0") != 0;
  e = getenv("KDA_NO_SHADOW");
  G.no_shadow = e && *e && strcmp(e, "0") != 0;
  e = getenv("KDA_NO_FUSE");
  G.no_fuse = e && *e && strcmp(e, "0") != 0;
  e = getenv("KDA_CUDA_PROFILE");
  G.profile = e && *e && strcmp(e, "0") != 0;
  e = getenv("KDA_KDA_KEEP");
  G.no_keep = e && strcmp(e, "0") == 0;
  cudaDeviceProp prop;
  if (cudaSetDevice(0) != cudaSuccess || cudaGetDeviceProperties(&prop, 0) != cudaSuccess ||
      cudaStreamCreateWithFlags(&G.ctx.stream, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    G.state = -1;
    return -1;
  }
  if (cudaStreamCreateWithFlags(&G.side, cudaStreamNonBlocking) != cudaSuccess) { cudaGetLastError(); G.state = -1; return -1; }
  for (int i = 0; i < 4; i++)
    if (cudaEventCreate(&G.stage_ev[i]) != cudaSuccess) { cudaGetLastError(); G.state = -1; return -1; }
  snprintf(G.name, sizeof G.name, "%s", prop.name);
  G.ctx.num_sms = prop.multiProcessorCount;
  G.ctx.kda_kept = kda_kept_ws;
  G.state = 1;   /* dev_alloc below tracks bytes; a failure turns the backend off again */
  G.ctx.workspace = dev_alloc((int64_t)32 << 20, "the cuBLASLt workspace");
  if (!G.ctx.workspace || kc_gemm_init(&G.ctx)) { G.state = -1; return -1; }
  return 0;
}

/* ---- memory ------------------------------------------------------------------------------ */
static void track(void *p, int64_t bytes) {
  if (G.nalloc < MAX_ALLOCS) { G.ptr[G.nalloc] = p; G.bytes[G.nalloc] = bytes; G.nalloc++; }
  G.cur += bytes;
  if (G.cur > G.peak) G.peak = G.cur;
}
static void untrack(void *p) {
  for (int i = G.nalloc - 1; i >= 0; i--)
    if (G.ptr[i] == p) {
      G.cur -= G.bytes[i];
      G.ptr[i] = G.ptr[G.nalloc - 1];
      G.bytes[i] = G.bytes[G.nalloc - 1];
      G.nalloc--;
      return;
    }
}

static void *dev_alloc(int64_t bytes, const char *what) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, (size_t)(bytes > 0 ? bytes : 1));
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    kda_set_error("cuda: cudaMalloc of %lld bytes for %s failed (%s; %.2f of %.2f GiB free): "
                  "use a smaller batch or model, or activation recompute",
                  (long long)bytes, what, cudaGetErrorString(e), fr / 1073741824.0,
                  tot / 1073741824.0);
    return NULL;
  }
  if (cudaMemset(p, 0, (size_t)(bytes > 0 ? bytes : 1)) != cudaSuccess) {
    kda_set_error("cuda: cudaMemset of %lld bytes for %s failed", (long long)bytes, what);
    cudaFree(p);
    return NULL;
  }
  track(p, bytes);
  return p;
}

static void *cu_alloc(int64_t bytes) {
  if (init_once()) { kda_set_error("cuda: no CUDA device: use the CPU backend"); return NULL; }
  return dev_alloc(bytes, "a plan buffer");
}

static void drop_graphs(void);
static void kept_release(void *block);

static void cu_free(void *p) {
  if (!p || G.state <= 0) return;
  cudaStreamSynchronize(G.ctx.stream);   /* a queued step may still read it */
  int64_t bytes = 0;
  for (int i = G.nalloc - 1; i >= 0; i--)
    if (G.ptr[i] == p) { bytes = G.bytes[i]; break; }
  /* shadows of anything inside the freed block go with it; a captured graph may still name
   * them, so every graph is dropped (re-captured after a fresh warm-up: plan teardown only) */
  for (int i = G.npool - 1; i >= 0; i--) {
    const char *src = (const char *)G.pool[i].src;
    if (src >= (const char *)p && src < (const char *)p + bytes) {
      drop_graphs();
      untrack(G.pool[i].dst);
      cudaFree(G.pool[i].dst);
      G.pool[i] = G.pool[--G.npool];
    }
  }
  for (int i = G.nkept - 1; i >= 0; i--) {   /* kept KDA workspaces of layers inside it */
    const char *q = (const char *)G.kept[i].in[0];
    if (q >= (const char *)p && q < (const char *)p + bytes) {
      drop_graphs();
      kept_release(G.kept[i].block);
      i = G.nkept;                             /* the list changed under the loop: again */
    }
  }
  for (int i = G.nin - 1; i >= 0; i--) {   /* batch slots of inputs inside the freed block */
    input_slot *sl = &G.in[i];
    if ((char *)sl->dst >= (char *)p && (char *)sl->dst < (char *)p + bytes) {
      cudaFreeHost(sl->host);
      untrack(sl->stage);
      cudaFree(sl->stage);
      cudaEventDestroy(sl->copied);
      cudaEventDestroy(sl->consumed);
      G.in[i] = G.in[--G.nin];
    }
  }
  untrack(p);
  cudaFree(p);
}

static int cu_write(void *dst, const void *src, int64_t bytes) {
  if (init_once()) return kda_set_error("cuda: no CUDA device");
  CK(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyHostToDevice, G.ctx.stream));
  CK(cudaStreamSynchronize(G.ctx.stream));   /* pageable source: keep it simple and safe */
  return 0;
}

/* upload (backend.h): a tensor the host generates piece by piece (parameter initialisation),
 * through two pinned buffers of 32 MiB: fill writes a piece into one while the DMA engine
 * copies the previous piece out of the other on kda's stream, and an event per buffer says
 * when it may be refilled. No host buffer of the whole (no page faults of a fresh 4 GB), no
 * pageable copies (~5-10 GB/s, the host waiting) but pinned ones (~25-50 GB/s) hidden behind
 * the generation. The last copies stay in flight (kda's stream orders them before the first
 * step; cu_read and cu_free synchronise), so the pipeline runs on from tensor to tensor. The
 * buffers are made on the first call and kept; when pinned memory cannot be had, returns 1
 * (now and on every later call) and the plan writes from its own buffer as before.          */
static int cu_upload(void *dst, int64_t bytes,
                     void (*fill)(void *ctx, void *chunk, int64_t offset, int64_t len), void *ctx) {
  enum { NBUF = 2 };
  const int64_t piece = (int64_t)32 << 20;
  static struct {
    int state;                 /* 0 untried, 1 ready, -1 no pinned memory */
    void *host[NBUF];
    cudaEvent_t free_ev[NBUF]; /* the copy out of host[k] is done */
    cudaEvent_t legacy;        /* the legacy stream's work so far */
    int next;
  } U;
  if (init_once()) return kda_set_error("cuda: no CUDA device");
  if (U.state < 0) return 1;
  if (!U.state) {
    for (int k = 0; k < NBUF; k++) {
      if (cudaHostAlloc(&U.host[k], (size_t)piece, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();    /* not sticky: clear it so that nothing else reports it */
        for (int j = 0; j < k; j++) cudaFreeHost(U.host[j]);
        U.state = -1;
        return 1;
      }
    }
    for (int k = 0; k < NBUF; k++) CK(cudaEventCreateWithFlags(&U.free_ev[k], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&U.legacy, cudaEventDisableTiming));
    U.state = 1;
  }
  /* dev_alloc zeroed dst with cudaMemset on the legacy stream, which kda's non-blocking
   * stream does not wait for by itself: order the copies after it (no host wait) */
  CK(cudaEventRecord(U.legacy, cudaStreamLegacy));
  CK(cudaStreamWaitEvent(G.ctx.stream, U.legacy, 0));
  for (int64_t off = 0; off < bytes; off += piece) {
    int64_t len = bytes - off < piece ? bytes - off : piece;
    int k = U.next;
    U.next = (k + 1) % NBUF;
    CK(cudaEventSynchronize(U.free_ev[k]));   /* its previous piece has left it */
    fill(ctx, U.host[k], off, len);
    CK(cudaMemcpyAsync((char *)dst + off, U.host[k], (size_t)len, cudaMemcpyHostToDevice, G.ctx.stream));
    CK(cudaEventRecord(U.free_ev[k], G.ctx.stream));
  }
  return 0;
}

static int cu_read(void *dst, const void *src, int64_t bytes) {
  if (init_once()) return kda_set_error("cuda: no CUDA device");
  CK(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost, G.ctx.stream));
  CK(cudaStreamSynchronize(G.ctx.stream));
  return 0;
}

/* A batch for the next run. Three hops, none of which makes the host wait for the GPU:
 * memcpy into this input's pinned buffer (once the previous batch has left it: `copied`, long
 * done by then), an asynchronous upload into a device staging buffer on the side stream (once
 * the previous batch has left that: `consumed`), and a device copy into the input buffer on
 * kda's stream, queued behind the step in flight, which still reads the old batch. The upload
 * thus overlaps the previous step; the device copy costs ~2 us between steps.                  */
static int cu_write_input(void *dst, const void *src, int64_t bytes) {
  if (init_once()) return kda_set_error("cuda: no CUDA device");
  input_slot *sl = NULL;
  for (int i = 0; i < G.nin; i++)
    if (G.in[i].dst == dst) sl = &G.in[i];
  if (sl && sl->cap < bytes) return cu_write(dst, src, bytes);   /* a larger view of the buffer */
  if (!sl) {
    if (G.nin == (int)(sizeof G.in / sizeof G.in[0])) return cu_write(dst, src, bytes);
    sl = &G.in[G.nin];
    memset(sl, 0, sizeof *sl);
    CK(cudaHostAlloc(&sl->host, (size_t)bytes, cudaHostAllocDefault));
    sl->stage = dev_alloc(bytes, "a batch staging buffer");
    if (!sl->stage) { cudaFreeHost(sl->host); return -1; }
    CK(cudaEventCreateWithFlags(&sl->copied, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&sl->consumed, cudaEventDisableTiming));
    sl->dst = dst, sl->cap = bytes;
    G.nin++;
  }
  CK(cudaEventSynchronize(sl->copied));
  memcpy(sl->host, src, (size_t)bytes);
  CK(cudaStreamWaitEvent(G.side, sl->consumed, 0));
  CK(cudaMemcpyAsync(sl->stage, sl->host, (size_t)bytes, cudaMemcpyHostToDevice, G.side));
  CK(cudaEventRecord(sl->copied, G.side));
  CK(cudaStreamWaitEvent(G.ctx.stream, sl->copied, 0));
  CK(cudaMemcpyAsync(dst, sl->stage, (size_t)bytes, cudaMemcpyDeviceToDevice, G.ctx.stream));
  CK(cudaEventRecord(sl->consumed, G.ctx.stream));
  return 0;
}

static int cu_zero(void *dst, int64_t bytes) {
  if (init_once()) return kda_set_error("cuda: no CUDA device");
  CK(cudaMemsetAsync(dst, 0, (size_t)bytes, G.ctx.stream));
  return 0;
}

static void cu_marks(int bwd_begin, int opt_begin) { G.mark_bwd = bwd_begin, G.mark_opt = opt_begin; }

/* ---- one node ---------------------------------------------------------------------------- */
static int64_t scratch_need(const kda_exec_node *n) {
  switch (n->op) {
  case KDA_OP_MATMUL: return kc_gemm_scratch(n);
  case KDA_OP_EMBED_BWD: return kc_embed_scratch(n);
  case KDA_OP_MUON: return kc_muon_scratch(n);
  case KDA_OP_RMSNORM_BWD: return kc_norm_scratch(n);
  case KDA_OP_SUM: case KDA_OP_MEAN: case KDA_OP_SUM_ROWS: case KDA_OP_GRAD_NORM:
    return kc_reduce_scratch(n);
  case KDA_OP_ATTENTION: case KDA_OP_ATTENTION_BWD: return kc_attention_scratch(n);
  case KDA_OP_KDA: case KDA_OP_KDA_BWD: case KDA_OP_CONV1D: case KDA_OP_CONV1D_BWD:
  case KDA_OP_KDA_DECODE: return kc_kda_scratch(n);
  case KDA_OP_ATTN_DECODE: return kc_decode_scratch(n);
  default: return 0;
  }
}

static int run_node(const kda_exec_node *n, kc_ctx *c) {
  switch (n->op) {
  case KDA_OP_MATMUL: return kc_matmul(n, c);
  case KDA_OP_ADD: case KDA_OP_MUL: return kc_binary(n, c);
  case KDA_OP_SCALE: case KDA_OP_SILU: case KDA_OP_SILU_BWD: case KDA_OP_GELU:
  case KDA_OP_GELU_BWD: case KDA_OP_SIGMOID: case KDA_OP_SIGMOID_BWD: return kc_unary(n, c);
  case KDA_OP_SUM_ROWS: return kc_sum_rows(n, c);
  case KDA_OP_EMBED: return kc_embed(n, c);
  case KDA_OP_EMBED_BWD: return kc_embed_bwd(n, c);
  case KDA_OP_RMSNORM: return kc_rmsnorm(n, c);
  case KDA_OP_RMSNORM_BWD: return kc_rmsnorm_bwd(n, c);
  case KDA_OP_SWIGLU: return kc_swiglu(n, c);
  case KDA_OP_SWIGLU_BWD: return kc_swiglu_bwd(n, c);
  case KDA_OP_SOFTMAX: return kc_softmax(n, c);
  case KDA_OP_SOFTMAX_BWD: return kc_softmax_bwd(n, c);
  case KDA_OP_ROPE: return kc_rope(n, c);
  case KDA_OP_ATTENTION: return kc_attention(n, c);
  case KDA_OP_ATTENTION_BWD: return kc_attention_bwd(n, c);
  case KDA_OP_CROSS_ENTROPY: return kc_cross_entropy(n, c);
  case KDA_OP_CROSS_ENTROPY_BWD: return kc_cross_entropy_bwd(n, c);
  case KDA_OP_SUM: case KDA_OP_MEAN: return kc_sum(n, c);
  case KDA_OP_FILL: return kc_fill(n, c);
  case KDA_OP_TRANSPOSE: return kc_transpose(n, c);
  case KDA_OP_GRAD_NORM: return kc_grad_norm(n, c);
  case KDA_OP_SCHEDULE: return kc_schedule(n, c);
  case KDA_OP_ADAMW: return kc_adamw(n, c);
  case KDA_OP_GUARD: return kc_guard(n, c);
  case KDA_OP_MUON: return kc_muon(n, c);
  case KDA_OP_EMA: return kc_ema(n, c);
  case KDA_OP_RETRACT: return kc_retract(n, c);
  case KDA_OP_KDA: case KDA_OP_KDA_BWD: case KDA_OP_CONV1D: case KDA_OP_CONV1D_BWD:
  case KDA_OP_KDA_DECODE: return kc_kda_node(n, c);
  case KDA_OP_ATTN_DECODE: return kc_attn_decode(n, c);
  case KDA_OP_CONV1D_DECODE: return kc_conv1d_decode(n, c);
  default:
    return kda_set_error("cuda: op %s (node %d) cannot run on the CUDA backend: the plan "
                         "should have resolved it", op_name(n->op), n->id);
  }
}

/* ---- bf16 shadows of f32 GEMM operands (kernels.h) ------------------------------------- */
/* Does view t touch any byte of [lo, hi)? (Shadows and fusions reason by pointer ranges.) */
static int view_hits(const kda_tview *t, const char *lo, const char *hi) {
  const char *p = (const char *)t->data;
  return p && p < hi && p + kc_numel(t) * kc_dsize(t->dtype) > lo;
}

static int writes_range(const kda_exec_node *x, const char *lo, const char *hi) {
  if (view_hits(&x->out, lo, hi)) return 1;
  /* in-place optimizers also update their state inputs: ADAMW m, v; MUON the momentum */
  if (x->op == KDA_OP_ADAMW || x->op == KDA_OP_MUON)
    for (int j = 2; j < (x->op == KDA_OP_ADAMW ? 4 : 3); j++)
      if (view_hits(&x->in[j], lo, hi)) return 1;
  return 0;
}

/* The active set for nodes[0..n): every f32 operand of a mixed GEMM that no earlier node
 * writes (valid_until = the first node that does, or n). Allocates missing copies, so it runs
 * before a capture begins, never inside one. */
static int shadow_plan(const kda_exec_node *nodes, int n) {
  G.nact = 0;
  if (G.no_shadow) return 0;
  for (int i = 0; i < n; i++) {
    if (!kc_gemm_mixed(&nodes[i])) continue;
    for (int j = 0; j < 2; j++) {
      const kda_tview *t = &nodes[i].in[j];
      if (t->dtype != KDA_F32) continue;
      const float *src = (const float *)t->data;
      int64_t cnt = kc_numel(t);
      int k;
      for (k = 0; k < G.nact; k++)
        if (G.act[k].src == src && G.act[k].n == cnt) break;
      if (k < G.nact || G.nact == MAX_SHADOWS) continue;   /* known, or table full: convert */
      int w = 0;
      const char *lo = (const char *)src, *hi = lo + cnt * 4;
      while (w < n && !writes_range(&nodes[w], lo, hi)) w++;
      if (w <= i) continue;   /* written before this first use: per-GEMM rounding */
      int pi;
      for (pi = 0; pi < G.npool; pi++)
        if (G.pool[pi].src == src && G.pool[pi].n == cnt) break;
      if (pi == G.npool) {
        if (G.npool == MAX_SHADOWS) continue;
        void *d = dev_alloc(cnt * 2, "a bf16 weight shadow");
        if (!d) return -1;
        kc_shadow *ps = &G.pool[G.npool++];
        ps->src = src, ps->n = cnt, ps->dst = (__nv_bfloat16 *)d, ps->valid_until = 0;
      }
      G.act[G.nact] = G.pool[pi];
      G.act[G.nact++].valid_until = w;
    }
  }
  return 0;
}

/* A cheap signature of a list: the same nodes, pointers and attributes give the same value. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
static uint64_t list_sig(const kda_exec_node *nodes, int n) {
  uint64_t h = 1469598103934665603ull;
  h = fnv(h, &n, sizeof n);
  for (int i = 0; i < n; i++) {
    const kda_exec_node *x = &nodes[i];
    h = fnv(h, &x->op, sizeof x->op);
    h = fnv(h, &x->nin, sizeof x->nin);
    h = fnv(h, &x->out, sizeof x->out);
    h = fnv(h, x->iattr, sizeof x->iattr);
    h = fnv(h, x->fattr, sizeof x->fattr);
    h = fnv(h, &x->fuse_offset, sizeof x->fuse_offset);
    h = fnv(h, &x->kept, sizeof x->kept);
    for (int j = 0; j < x->nin; j++) h = fnv(h, &x->in[j], sizeof x->in[j]);
  }
  return h;
}


/* ---- fusions: a pair of adjacent nodes as one kernel ---------------------------------------
 *   ADD -> RMSNORM of the sum          residual stream + the next pre-norm (kc_add_rmsnorm)
 *   RMSNORM_BWD -> ADD of its dx       the residual stream's gradient (kc_rmsnorm_bwd_add)
 *   MATMUL -> ADD of the product       gradient sums, the product in the GEMM's epilogue
 *   CROSS_ENTROPY ... its backward     paired by the plan (kda_exec_node.fuse_offset)
 * Decided once per list from pointer ranges. The planner may hand a buffer whose last reader
 * is node i to node i+1's output, so a pair fuses only when the second node's output overlaps
 * no input of the first (one kernel doing both would overwrite what it still reads); and
 * MATMUL -> ADD, which never writes the product itself, only when nothing after the pair
 * reads the product and the host does not keep it. */
enum fuse_kind { FUSE_NONE, FUSE_ADD_NORM, FUSE_NORMBWD_ADD, FUSE_MATMUL_ADD, FUSE_XENT, FUSE_DONE,
                 FUSE_KINDS };
static const char *const fuse_names[FUSE_KINDS] = {"", "add+rmsnorm", "rmsnorm_bwd+add", "matmul+add",
                                                   "cross_entropy+bwd", ""};
static struct {
  const kda_exec_node *nodes;
  int n, cap;
  uint64_t sig;
  signed char *kind, *arg;   /* per node: enum fuse_kind; the ADD's input that is the first node's output */
} F;

static int views_overlap(const kda_tview *a, const kda_tview *b) {
  const char *y = (const char *)b->data;
  return y && view_hits(a, y, y + kc_numel(b) * kc_dsize(b->dtype));
}
static int out_hits_inputs(const kda_exec_node *second, const kda_exec_node *first) {
  for (int j = 0; j < first->nin; j++)
    if (views_overlap(&second->out, &first->in[j])) return 1;
  return 0;
}
/* Does a node from `from` on read t's bytes before some node writes over them (the planner
 * reuses a dead buffer's bytes for later outputs, so a read after such a write is another
 * buffer's)? */
static int read_from(const kda_exec_node *nodes, int from, int n, const kda_tview *t) {
  for (int k = from; k < n; k++) {
    for (int j = 0; j < nodes[k].nin; j++)
      if (views_overlap(&nodes[k].in[j], t)) return 1;
    if (views_overlap(&nodes[k].out, t)) return 0;
  }
  return 0;
}
/* Which input of `add` (an elementwise ADD, no broadcast) is exactly the first `numel`
 * elements at `data` (the first node's output), the other input apart from that output;
 * -1 if none. */
static int addend_from(const kda_exec_node *add, const void *data, int64_t numel,
                       const kda_tview *first_out) {
  if (add->op != KDA_OP_ADD || kc_numel(&add->in[0]) != kc_numel(&add->in[1])) return -1;
  for (int j = 0; j < 2; j++)
    if (add->in[j].data == data && kc_numel(&add->in[j]) == numel &&
        !views_overlap(&add->in[1 - j], first_out))
      return j;
  return -1;
}

static int fuse_kind_at(const kda_exec_node *nodes, int i, int n, int *arg) {
  const kda_exec_node *a = &nodes[i], *b = i + 1 < n ? &nodes[i + 1] : NULL;
  if (a->op == KDA_OP_CROSS_ENTROPY && a->fuse_offset > 0 && i + a->fuse_offset < n) return FUSE_XENT;
  if (a->op == KDA_OP_CROSS_ENTROPY_BWD && a->fuse_offset < 0) return FUSE_DONE;
  if (!b || out_hits_inputs(b, a)) return FUSE_NONE;
  int64_t numel = kc_numel(&a->out);
  if (a->op == KDA_OP_ADD && b->op == KDA_OP_RMSNORM && b->in[0].data == a->out.data &&
      kc_numel(&b->in[0]) == numel && kc_numel(&a->in[1]) == numel &&
      !views_overlap(&b->in[1], &a->out))
    return FUSE_ADD_NORM;
  if (a->op == KDA_OP_RMSNORM_BWD &&
      (*arg = addend_from(b, a->out.data, kc_numel(&a->in[0]), &a->out)) >= 0)
    return FUSE_NORMBWD_ADD;
  if (a->op == KDA_OP_MATMUL && !a->kept && (*arg = addend_from(b, a->out.data, numel, &a->out)) >= 0 &&
      b->in[1 - *arg].dtype == b->out.dtype && !read_from(nodes, i + 2, n, &a->out))
    return FUSE_MATMUL_ADD;
  return FUSE_NONE;
}

/* The fusion at node i of the list being run (FUSE_NONE without a plan for it). */
static int fuse_at(const kda_exec_node *nodes, int i) {
  return F.nodes == nodes && i < F.n ? F.kind[i] : FUSE_NONE;
}

static int fuse_plan(const kda_exec_node *nodes, int n, uint64_t sig) {
  if (G.no_fuse) { F.nodes = NULL; return 0; }   /* every node alone */
  if (F.nodes == nodes && F.n == n && F.sig == sig) return 0;
  if (n > F.cap) {
    free(F.kind), free(F.arg);
    F.kind = (signed char *)calloc((size_t)n, 1), F.arg = (signed char *)calloc((size_t)n, 1);
    F.cap = F.kind && F.arg ? n : 0;
    if (!F.cap)
      return kda_set_error("cuda: out of host memory planning fusions for %d nodes: free host "
                           "memory, or run with KDA_NO_FUSE=1", n);
  }
  for (int i = 0; i < n; i++) {
    int arg = 0, k = fuse_kind_at(nodes, i, n, &arg);
    F.kind[i] = (signed char)k, F.arg[i] = (signed char)arg;
    if (k == FUSE_ADD_NORM || k == FUSE_NORMBWD_ADD || k == FUSE_MATMUL_ADD) F.kind[++i] = FUSE_NONE;
  }
  F.nodes = nodes, F.n = n, F.sig = sig;
  return 0;
}

/* Stage event k of a training list (0 start, 1 backward, 2 optimizer, 3 end); inside a
 * capture it becomes an event-record node of the graph, so replays re-record it. */
static int stage_mark(int k, int capturing) {
  CK(capturing ? cudaEventRecordWithFlags(G.stage_ev[k], G.ctx.stream, cudaEventRecordExternal)
               : cudaEventRecord(G.stage_ev[k], G.ctx.stream));
  return 0;
}

/* Node i, or with an ADAMW the ADAMW nodes right after it as one multi-tensor launch, or
 * the fused pair starting at i (fuse_plan, for this list): the number of nodes run, or -1. */
static int run_at(const kda_exec_node *nodes, int i, int n) {
  const kda_exec_node *x = &nodes[i];
  switch (fuse_at(nodes, i)) {
  case FUSE_ADD_NORM: return kc_add_rmsnorm(x, x + 1, &G.ctx) ? -1 : 2;
  case FUSE_NORMBWD_ADD: return kc_rmsnorm_bwd_add(x, x + 1, F.arg[i], &G.ctx) ? -1 : 2;
  case FUSE_MATMUL_ADD: return kc_matmul_add(x, x + 1, 1 - F.arg[i], &G.ctx) ? -1 : 2;
  case FUSE_XENT: return kc_cross_entropy_fused(x, x + x->fuse_offset, &G.ctx) ? -1 : 1;
  case FUSE_DONE: return 1;   /* its gradient was written with the loss */
  }
  if (x->op == KDA_OP_ADAMW) return kc_adamw_multi(x, n - i, &G.ctx);
  return run_node(x, &G.ctx) ? -1 : 1;
}

static int run_nodes(const kda_exec_node *nodes, int n, int capturing) {
  int timed = G.mark_bwd < n, next_mark = 1;   /* forward-only lists (evaluation) are not timed */
  if (timed && stage_mark(0, capturing)) return -1;
  if (G.nact && kc_shadow_refresh(G.act, G.nact, &G.ctx)) return -1;
  for (int i = 0; i < n;) {
    for (; timed && next_mark < 3 && i >= (next_mark == 1 ? G.mark_bwd : G.mark_opt); next_mark++)
      if (stage_mark(next_mark, capturing)) return -1;
    int used = run_at(nodes, i, n);
    if (used < 0) return -1;
    i += used;
    if (G.sync_each && !capturing) {
      cudaError_t e = cudaStreamSynchronize(G.ctx.stream);
      if (e != cudaSuccess)
        return kc_fail(&nodes[i - 1], "kernel (KDA_CUDA_SYNC)", cudaGetErrorString(e), __FILE__, __LINE__);
    }
  }
  if (timed) {
    for (; next_mark < 4; next_mark++)
      if (stage_mark(next_mark, capturing)) return -1;
    G.stages_recorded = 1;
  }
  return 0;
}

/* The shadows of the list's f32 weights are what its GEMMs read, for this list only. */
static int run_list(const kda_exec_node *nodes, int n, int capturing) {
  if (fuse_plan(nodes, n, list_sig(nodes, n))) return -1;
  kc_gemm_set_shadows(G.act, G.nact, nodes, n);
  int rc = run_nodes(nodes, n, capturing);
  kc_gemm_set_shadows(NULL, 0, NULL, 0);
  return rc;
}

/* ---- profile (KDA_CUDA_PROFILE=1) ---------------------------------------------------------
 * Where a step's GPU time goes, per op, without hardware counters. Eager timing is distorted by
 * the CPU: a kernel shorter than its launch leaves the GPU idle and that idle time would be
 * charged to the next event. So a segment of nodes is queued behind a kernel that spins on a
 * host-mapped flag, and the flag is released only once the whole segment (with an event after
 * every node) is queued: the GPU then runs the segment back to back, as a replayed graph does,
 * and each event difference is one node's kernels plus the ~1 us between them. Segments are
 * kept short (PROF_SEG nodes) so the launch queue never fills while the GPU is held. The table
 * is printed on exit, per run of the list with the most nodes; the first run (warm-up) is
 * not counted. Profiled runs are eager (no graphs).                                        */
enum { PROF_SEG = 128 };
static struct {
  volatile int *flag;          /* host-mapped */
  int *dflag;
  cudaEvent_t ev[PROF_SEG + 1];
  double ms[KDA_OP_COUNT + 1 + FUSE_KINDS]; /* + 1: the shadow refresh; then the fused pairs */
  int64_t nodes[KDA_OP_COUNT + 1 + FUSE_KINDS];
  int list_n, runs;
} P;

/* Spins until the host releases the segment, or 50 ms at most: a node that waits for the
 * device inside its launch would otherwise never return (a hang becomes a distorted segment). */
__global__ void k_hold(const volatile int *flag) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (*flag == 0 && t - t0 < 50000000ull);
}

static void profile_report(void) {
  if (!P.runs) return;
  double total = 0;
  for (int i = 0; i < KDA_OP_COUNT + 1 + FUSE_KINDS; i++) total += P.ms[i];
  fprintf(stderr, "# KDA_CUDA_PROFILE: %d runs of a %d-node list, GPU time per run %.3f ms (back to back, no graph)\n",
          P.runs, P.list_n, total / P.runs);
  fprintf(stderr, "# %-18s %8s %10s %7s\n", "op", "nodes", "us/run", "share");
  for (;;) {   /* largest first */
    int best = -1;
    for (int i = 0; i < KDA_OP_COUNT + 1 + FUSE_KINDS; i++)
      if (P.nodes[i] && (best < 0 || P.ms[i] > P.ms[best])) best = i;
    if (best < 0) break;
    const char *name = best < KDA_OP_COUNT ? op_name(best) : best == KDA_OP_COUNT ? "shadow_refresh"
                                                                 : fuse_names[best - KDA_OP_COUNT - 1];
    fprintf(stderr, "  %-18s %8.1f %10.1f %6.1f%%\n", name,
            (double)P.nodes[best] / P.runs, 1e3 * P.ms[best] / P.runs, 100 * P.ms[best] / total);
    P.nodes[best] = 0;
  }
}

static int profile_init(void) {
  if (P.flag) return 0;
  int *h = NULL;
  CK(cudaHostAlloc((void **)&h, sizeof(int), cudaHostAllocMapped));
  CK(cudaHostGetDevicePointer((void **)&P.dflag, h, 0));
  P.flag = h;
  for (int i = 0; i <= PROF_SEG; i++) CK(cudaEventCreate(&P.ev[i]));
  atexit(profile_report);
  return 0;
}

/* The list in segments behind the hold kernel (a hold left unreleased by an error ends by
 * its own time limit); 0 or -1 like run_nodes. */
static int profile_segments(const kda_exec_node *nodes, int n) {
  int i = -1, rc = 0;          /* i = -1: the shadow refresh */
  while (i < n && !rc) {
    *P.flag = 0;
    k_hold<<<1, 1, 0, G.ctx.stream>>>(P.dflag);
    CK(cudaEventRecord(P.ev[0], G.ctx.stream));
    int op[PROF_SEG], k = 0;
    for (; k < PROF_SEG && i < n; k++) {
      int used = 1;
      if (i < 0) {
        op[k] = KDA_OP_COUNT;
        if (G.nact && kc_shadow_refresh(G.act, G.nact, &G.ctx)) rc = -1;
      } else {
        int f = fuse_at(nodes, i);
        op[k] = f == FUSE_NONE || f == FUSE_DONE ? nodes[i].op : KDA_OP_COUNT + 1 + f;
        used = run_at(nodes, i, n);
        if (used < 0) rc = -1;
      }
      if (rc) break;
      CK(cudaEventRecord(P.ev[k + 1], G.ctx.stream));
      i += used;
    }
    *P.flag = 1;
    CK(cudaStreamSynchronize(G.ctx.stream));
    for (int j = 0; j < k && !rc; j++) {
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, P.ev[j], P.ev[j + 1]));
      P.ms[op[j]] += ms;
      P.nodes[op[j]]++;
    }
  }
  return rc;
}

/* Profiled runs of the longest list; the others run as usual. */
static int run_list_profiled(const kda_exec_node *nodes, int n) {
  if (profile_init()) return -1;
  /* a longer list restarts the table; its first run is the warm-up (cuBLASLt heuristics,
   * allocations that may wait for the device) and runs unheld and untimed, as do shorter lists */
  if (n > P.list_n) {
    P.list_n = n, P.runs = 0;
    memset(P.ms, 0, sizeof P.ms);
    memset(P.nodes, 0, sizeof P.nodes);
    return run_list(nodes, n, 0);
  }
  if (n < P.list_n) return run_list(nodes, n, 0);
  if (fuse_plan(nodes, n, list_sig(nodes, n))) return -1;
  kc_gemm_set_shadows(G.act, G.nact, nodes, n);
  int rc = profile_segments(nodes, n);
  kc_gemm_set_shadows(NULL, 0, NULL, 0);
  if (!rc) P.runs++;
  return rc;
}

/* ---- graphs ------------------------------------------------------------------------------ */
static void drop_graphs(void) {
  for (int i = 0; i < G.ngraphs; i++) {
    if (G.graphs[i].exec) cudaGraphExecDestroy(G.graphs[i].exec);
    G.graphs[i].exec = NULL;
    G.graphs[i].calls = 0;
  }
}

static graph_entry *entry_for(int key) {
  for (int i = 0; i < G.ngraphs; i++)
    if (G.graphs[i].key == key) return &G.graphs[i];
  if (G.ngraphs == MAX_GRAPHS) {   /* many keys: forget the oldest */
    if (G.graphs[0].exec) cudaGraphExecDestroy(G.graphs[0].exec);
    memmove(&G.graphs[0], &G.graphs[1], sizeof(graph_entry) * (MAX_GRAPHS - 1));
    G.ngraphs--;
  }
  graph_entry *e = &G.graphs[G.ngraphs++];
  memset(e, 0, sizeof *e);
  e->key = key;
  return e;
}

/* ---- kept KDA workspaces ------------------------------------------------------------------ */
/* forget every kept workspace in `block` and free it (the caller drops graphs first) */
static void kept_release(void *block) {
  for (int i = G.nkept - 1; i >= 0; i--)
    if (G.kept[i].block == block) G.kept[i] = G.kept[--G.nkept];
  untrack(block);
  cudaFree(block);
}
/* the kept workspace of a KDA / KDA_BWD node: same seven inputs, same shapes (another list may
 * run the same buffers at other shapes: it goes without) */
static kept_ws *kept_of(const kda_exec_node *n) {
  kda_kda_args a = kda_kda_args_of(n);
  for (int i = 0; i < G.nkept; i++) {
    const kda_kda_args *b = &G.kept[i].a;
    int same = a.B == b->B && a.T == b->T && a.H == b->H && a.HV == b->HV && a.K == b->K &&
               a.V == b->V && a.chunk == b->chunk;
    for (int j = 0; j < 7 && same; j++) same = G.kept[i].in[j] == n->in[j].data;
    if (same) return &G.kept[i];
  }
  return NULL;
}
/* kc_ctx.kda_kept: the workspace a KDA / KDA_BWD node of a kept pair runs with, else NULL */
static void *kda_kept_ws(const kda_exec_node *n, int64_t *bytes) {
  kept_ws *k = G.no_keep ? NULL : kept_of(n);
  if (!k) return NULL;
  *bytes = k->bytes;
  return k->ws;
}
/* Every KDA node of the list whose KDA_BWD follows in it gets a workspace of its own (sized
 * for the backward), made here, before any capture. When the pairs nest (forwards in layer
 * order, backwards in the reverse order: a training step), the layers share one allocation:
 * layer i+1's kept bytes start where layer i's kept bytes end, so they lie over layer i's
 * backward scratch, which is only written once layer i+1's backward is done with them
 * (kda_kda_cuda_keep_bytes: what the forward writes past them it reads itself, before layer
 * i+1's forward; the backward writes its scratch before reading it). At K = V = 128 that is
 * ~40% less memory than a workspace a layer. Out of memory: keep is turned off for the run
 * with a one-line notice (the backward recomputes; nothing else changes) and the workspaces
 * made so far are given back. */
enum { MAX_PAIRS = 256 };
static int keep_plan(const kda_exec_node *nodes, int n) {
  if (G.no_keep) return 0;
  int fi[MAX_PAIRS], bi[MAX_PAIRS], np = 0;       /* the new pairs, in forward order */
  kda_kda_args pa[MAX_PAIRS];
  for (int i = 0; i < n && np < MAX_PAIRS; i++) {
    if (nodes[i].op != KDA_OP_KDA || kept_of(&nodes[i])) continue;
    int j = i + 1, paired = 0;
    for (; j < n && !paired; j++) {
      paired = nodes[j].op == KDA_OP_KDA_BWD;
      for (int k = 0; k < 7 && paired; k++) paired = nodes[j].in[k].data == nodes[i].in[k].data;
    }
    if (paired) fi[np] = i, bi[np] = j - 1, np++;
  }
  if (!np) return 0;
  int nested = 1;
  for (int p = 1; p < np && nested; p++) nested = bi[p] < bi[p - 1] && fi[p] > fi[p - 1];
  int64_t off[MAX_PAIRS], full[MAX_PAIRS], total = 0, at = 0;
  for (int p = 0; p < np; p++) {
    pa[p] = kda_kda_args_of(&nodes[fi[p]]);
    full[p] = (kda_kda_cuda_workspace_bytes(&pa[p], 1) + 255) / 256 * 256;
    off[p] = nested ? at : 0;
    at += nested ? (kda_kda_cuda_keep_bytes(&pa[p]) + 255) / 256 * 256 : 0;
    if (off[p] + full[p] > total) total = off[p] + full[p];
  }
  int room = G.nkept + np <= MAX_KEPT;
  for (int p = 0; p < np; p++) {
    void *block = nested && p ? G.kept[G.nkept - 1].block : NULL;
    if (!block && room) block = dev_alloc(nested ? total : full[p], "KDA layers' kept workspaces");
    if (!block) {
      fprintf(stderr, "kda: KDA keep off for this run (%s): the backward recomputes; "
              "KDA_KDA_KEEP=0 skips the attempt\n", room ? kda_last_error() : "too many KDA layers");
      G.no_keep = 1;
      if (G.nkept) {
        CK(cudaStreamSynchronize(G.ctx.stream));   /* a queued step may still use them */
        drop_graphs();
        while (G.nkept) kept_release(G.kept[G.nkept - 1].block);
      }
      return 0;
    }
    kept_ws *k = &G.kept[G.nkept++];
    for (int j = 0; j < 7; j++) k->in[j] = nodes[fi[p]].in[j].data;
    k->bytes = full[p], k->ws = (char *)block + off[p], k->block = block, k->a = pa[p];
  }
  return 0;
}

static int grow_scratch(int64_t need) {
  if (need <= G.ctx.scratch_bytes) return 0;
  CK(cudaStreamSynchronize(G.ctx.stream));
  drop_graphs();               /* captured graphs point into the old buffer */
  if (G.ctx.scratch) { untrack(G.ctx.scratch); cudaFree(G.ctx.scratch); }
  G.ctx.scratch = NULL;
  G.ctx.scratch_bytes = 0;
  int64_t bytes = KC_ALIGN(need + need / 8);
  void *p = dev_alloc(bytes, "kernel scratch");
  if (!p) return -1;
  G.ctx.scratch = p;
  G.ctx.scratch_bytes = bytes;
  return 0;
}

static int capture(graph_entry *e, const kda_exec_node *nodes, int n) {
  cudaGraph_t graph = NULL;
  CK(cudaStreamBeginCapture(G.ctx.stream, cudaStreamCaptureModeThreadLocal));
  int rc = run_list(nodes, n, 1);
  cudaError_t ee = cudaStreamEndCapture(G.ctx.stream, &graph);
  if (rc) { if (graph) cudaGraphDestroy(graph); return -1; }
  if (ee != cudaSuccess) return kc_fail(NULL, "cudaStreamEndCapture", cudaGetErrorString(ee), __FILE__, __LINE__);
  cudaError_t ie = cudaGraphInstantiate(&e->exec, graph, 0);
  cudaGraphDestroy(graph);
  if (ie != cudaSuccess) {
    e->exec = NULL;
    return kc_fail(NULL, "cudaGraphInstantiate", cudaGetErrorString(ie), __FILE__, __LINE__);
  }
  return 0;
}

static int cu_run(const kda_exec_node *nodes, int n, int key) {
  if (init_once()) return kda_set_error("cuda: no CUDA device: use the CPU backend");
  int64_t need = 0;
  for (int i = 0; i < n; i++) {
    int64_t s = scratch_need(&nodes[i]);
    if (s > need) need = s;
  }
  if (grow_scratch(need) || keep_plan(nodes, n)) return -1;
  if (G.profile) return shadow_plan(nodes, n) ? -1 : run_list_profiled(nodes, n);
  if (G.no_graph) return shadow_plan(nodes, n) ? -1 : run_list(nodes, n, 0);
  graph_entry *e = entry_for(key);
  uint64_t sig = list_sig(nodes, n);
  if (e->sig != sig) {         /* a different list under this key: warm up again */
    if (e->exec) { CK(cudaStreamSynchronize(G.ctx.stream)); cudaGraphExecDestroy(e->exec); }
    e->exec = NULL;
    e->calls = 0;
    e->sig = sig;
  }
  e->calls++;
  if (!e->exec && e->calls == 1) return shadow_plan(nodes, n) ? -1 : run_list(nodes, n, 0);   /* warm-up */
  if (!e->exec && (shadow_plan(nodes, n) || capture(e, nodes, n))) return -1;
  CK(cudaGraphLaunch(e->exec, G.ctx.stream));
  return 0;
}

static const kda_backend cuda_backend = {"cuda", cu_alloc, cu_free, cu_write, cu_read, cu_run,
                                         cu_write_input, cu_marks, cu_zero, cu_upload};

extern "C" const kda_backend *kda_cuda_backend(void) {
  return init_once() ? NULL : &cuda_backend;
}

/* ---- small public helpers (kda_cuda_api.h) ---------------------------------------------- */
extern "C" double kda_cuda_peak_mem_bytes(void) { return (double)G.peak; }
extern "C" double kda_cuda_cur_mem_bytes(void) { return (double)G.cur; }
extern "C" void kda_cuda_reset_peak_mem(void) { G.peak = G.cur; }

extern "C" void *kda_cuda_stream(void) { return init_once() ? NULL : (void *)G.ctx.stream; }

extern "C" int kda_cuda_synchronize(void) {
  if (init_once()) return kda_set_error("cuda: no CUDA device");
  CK(cudaStreamSynchronize(G.ctx.stream));
  return 0;
}

extern "C" int kda_cuda_stage_ms(double *ms) {
  if (init_once()) return kda_set_error("cuda: no CUDA device");
  if (!G.stages_recorded) return kda_set_error("cuda: no training step has run yet");
  CK(cudaEventSynchronize(G.stage_ev[3]));
  for (int k = 0; k < 3; k++) {
    float t = 0;
    CK(cudaEventElapsedTime(&t, G.stage_ev[k], G.stage_ev[k + 1]));
    ms[k] = t;
  }
  return 0;
}

extern "C" int kda_cuda_set_graphs(int on) {
  if (init_once()) return kda_set_error("cuda: no CUDA device");
  CK(cudaStreamSynchronize(G.ctx.stream));
  G.no_graph = !on;
  return 0;
}

extern "C" int kda_cuda_set_fusion(int on) {
  if (init_once()) return kda_set_error("cuda: no CUDA device");
  CK(cudaStreamSynchronize(G.ctx.stream));
  G.no_fuse = !on;
  F.nodes = NULL;   /* plan the fusions again, and capture again what was captured with them */
  drop_graphs();
  return 0;
}

extern "C" int kda_cuda_fusion_counts(int *counts) {
  if (init_once()) return kda_set_error("cuda: no CUDA device");
  for (int k = 0; k < 4; k++) counts[k] = 0;
  for (int i = 0; F.nodes && i < F.n; i++)
    if (F.kind[i] >= FUSE_ADD_NORM && F.kind[i] <= FUSE_XENT) counts[F.kind[i] - FUSE_ADD_NORM]++;
  return 0;
}

extern "C" const char *kda_cuda_device_name(void) {
  return init_once() ? "" : G.name;
}

/* Dense (no sparsity) bf16 tensor-core peaks from the vendors' datasheets (SXM parts). */
extern "C" double kda_cuda_bf16_peak_flops(void) {
  if (init_once()) return 0;
  static const struct { const char *sub; double flops; } tab[] = {
      {"H200", 989e12}, {"H100 PCIe", 756e12}, {"H100", 989e12}, {"H800", 989e12},
      {"A100", 312e12}, {"L40S", 362e12},      {"4090", 165e12}, {"B200", 2250e12},
  };
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
    if (strstr(G.name, tab[i].sub)) return tab[i].flops;
  return 0;
}
