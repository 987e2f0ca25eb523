/* backend.h — what a backend implements (internal; not part of the FFI cdef).
 *
 * The plan (core/plan.c) turns a graph into a flat list of kda_exec_node: every input and the
 * output already resolved to a pointer in the backend's memory, with dtype and shape. A backend
 * runs that list. The CPU backend (core/cpu_*.c) is the reference; the CUDA backend
 * (kernels/backend_cuda.cu) must produce the same numbers within the tolerances of its tests.
 *
 * Storage dtypes: on the CPU every float tensor is f32. On CUDA the plan stores activations as
 * bf16 and keeps f32 for parameters, their gradients, optimizer state, losses and scalars; each
 * kda_tview says which. Integer tensors (token ids, targets) are i32 on both.              */
#ifndef KDA_BACKEND_H
#define KDA_BACKEND_H
#include "kda.h"
#include "kda_ref.h"

typedef struct kda_tview {
  void *data;          /* backend memory (host for CPU, device for CUDA) */
  int32_t dtype;       /* enum kda_dtype */
  int32_t ndim;
  int64_t shape[4];
} kda_tview;

typedef struct kda_exec_node {
  int32_t op;          /* enum kda_op */
  int32_t id;          /* graph node id, for error messages */
  int32_t nin;
  kda_tview *in;       /* nin views */
  kda_tview out;       /* for in-place ops (SCHEDULE, ADAMW) out aliases in[0] */
  int64_t iattr[8];
  float fattr[8];
  /* A fusion the plan proved safe; a backend may take it or run the nodes as listed (the CPU
   * does). On a CROSS_ENTROPY, fuse_offset > 0: the node that many places later is the
   * CROSS_ENTROPY_BWD of the same logits and targets, its dloss the constant fused_dloss (a
   * chain of FILLs from the loss seed), and the plan keeps that node's output free from here
   * on, so the gradient may be written here, the logits read once. On that CROSS_ENTROPY_BWD
   * the same distance, negated. 0 elsewhere (so zero-initialised nodes fuse nothing). */
  int32_t fuse_offset;
  float fused_dloss;
  int32_t kept;        /* 1: out is read by the host after the run (KEEP) or persists, so a
                          fusion must still write it */
} kda_exec_node;

typedef struct kda_backend {
  const char *name;
  void *(*alloc)(int64_t bytes);                  /* zero-filled; NULL + error on failure */
  void (*free)(void *p);
  int (*write)(void *dst, const void *src, int64_t bytes); /* host -> backend */
  int (*read)(void *dst, const void *src, int64_t bytes);  /* backend -> host */
  /* Run nodes[0..n) in order. `key` identifies the list (the same key always means the same
   * list with the same pointers), so a backend may capture it once and replay it. */
  int (*run)(const kda_exec_node *nodes, int n, int key);
  /* Optional (NULL: not offered). write_input: as write, for a small graph input (a batch)
   * that the next run reads; it may return before the copy is done, since the backend orders
   * the copy before that run (CUDA: pinned staging, a side stream, no host wait).
   * marks: where the backward and the optimizer begin in the list about to run (n, n for a
   * forward-only list), for the backend's per-stage timers. zero: optimizer state at
   * initialisation, without a host buffer of zeros to copy (8 GB for a 1B model's m and v). */
  int (*write_input)(void *dst, const void *src, int64_t bytes);
  void (*marks)(int bwd_begin, int opt_begin);
  int (*zero)(void *dst, int64_t bytes);   /* optional: fill with zero bytes on the backend */
  /* Optional: upload: write dst[0..bytes) from a source the host generates piece by piece
   * (parameter initialisation), with no host buffer of the whole. The backend calls
   * fill(ctx, chunk, offset, len) for consecutive pieces [offset, offset+len) in order (offset
   * a multiple of 4096; every len but the last one too) to write them into its own staging
   * memory (CUDA: two pinned buffers; one piece's copy overlaps the next piece's fill). The
   * copies are ordered before anything later on the backend; upload may return before they
   * are done. Returns 0, -1 + error, or 1, having called nothing, when it cannot stage (CUDA:
   * no pinned memory): the caller then uses write. */
  int (*upload)(void *dst, int64_t bytes,
                void (*fill)(void *ctx, void *chunk, int64_t offset, int64_t len), void *ctx);
} kda_backend;

const kda_backend *kda_cpu_backend(void);
const kda_backend *kda_cuda_backend(void);   /* NULL when built without CUDA or no device */

/* One CPU op: the reference implementation for every backend and for eager tensors. */
int kda_cpu_run_node(const kda_exec_node *n);
/* KDA_OP_KDA, KDA_OP_KDA_BWD, KDA_OP_CONV1D, KDA_OP_CONV1D_BWD and their DECODE forms on the CPU (core/cpu_kda.c,
 * glue over the reference in core/kda_ref.c). */
int kda_cpu_kda_node(const kda_exec_node *n);
/* A KDA / KDA_BWD / KDA_DECODE node's shapes and attributes as the kernels' argument block
 * (one mapping for both backends: core/cpu_kda.c). */
kda_kda_args kda_kda_args_of(const kda_exec_node *n);

static inline int64_t kda_tview_numel(const kda_tview *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}
#endif
