/* kernels.h — internal to the kernels/ .cu files: check macros, dtype helpers, op launchers.
 *
 * Every op launcher has the same shape:  int kc_<op>(const kda_exec_node *n, kc_ctx *c)
 * It returns 0, or -1 with kda_last_error() naming the failed call, the op and the shapes.
 * Launchers never allocate: any temporary memory comes from c->scratch, sized beforehand by
 * kc_scratch_bytes() so that the backend can grow it before a step is captured.          */
#ifndef KDA_KERNELS_H
#define KDA_KERNELS_H
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
extern "C" {
#include "backend.h"
#include "internal.h"
}

/* What every launcher may use. One stream; scratch is reused by every node of a list (nodes
 * run in order on one stream, so no two nodes use it at once). */
typedef struct kc_ctx {
  cudaStream_t stream;
  void *scratch;            /* c->scratch_bytes, 256-byte aligned */
  int64_t scratch_bytes;
  void *workspace;          /* cuBLASLt workspace, 32 MiB, allocated once at start */
  int num_sms;
  /* the own workspace of a KDA / KDA_BWD node whose pair keeps the forward's internals
   * (backend_cuda.cu's keep_plan), its size in *bytes; NULL (or a NULL hook): none */
  void *(*kda_kept)(const struct kda_exec_node *n, int64_t *bytes);
} kc_ctx;

/* Formats "cuda: <call> failed (<why>) in op <OP> node <id> out[<shape>] in0[..] (file:line)"
 * into kda_last_error and returns -1. */
int kc_fail(const kda_exec_node *n, const char *call, const char *why, const char *file,
            int line);

#define KC_CUDA(n, call)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) return kc_fail((n), #call, cudaGetErrorString(e_), __FILE__,    \
                                          __LINE__);                                       \
  } while (0)
/* After a <<<>>> launch: catches bad launch configurations (faults surface later, at the
 * next synchronising call, or at once under KDA_CUDA_SYNC=1). */
#define KC_LAUNCH_CHECK(n, kname)                                                          \
  do {                                                                                     \
    cudaError_t e_ = cudaGetLastError();                                                   \
    if (e_ != cudaSuccess) return kc_fail((n), "launch " kname, cudaGetErrorString(e_),    \
                                          __FILE__, __LINE__);                             \
  } while (0)

/* ---- dtype helpers (device) ------------------------------------------------------------ */
/* Runtime dtype: the branch is uniform across a warp, so it costs a few instructions on
 * memory-bound kernels; hot kernels (norm, attention) are templated on the type instead. */
__device__ __forceinline__ float kc_ld(const void *p, int dt, int64_t i) {
  if (dt == KDA_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  return ((const float *)p)[i];
}
__device__ __forceinline__ void kc_st(void *p, int dt, int64_t i, float v) {
  if (dt == KDA_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
  else ((float *)p)[i] = v;
}
template <typename T> __device__ __forceinline__ float kc_to_f(T v);
template <> __device__ __forceinline__ float kc_to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float kc_to_f<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T> __device__ __forceinline__ T kc_from_f(float v);
template <> __device__ __forceinline__ float kc_from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 kc_from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

/* Block-wide sum of one float per thread; every thread gets the total. Fixed order, so the
 * result is reproducible. `sh` holds >= 32 floats. blockDim.x must be a multiple of 32. */
__device__ __forceinline__ float kc_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float kc_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float kc_block_sum(float v, float *sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = kc_warp_sum(v);
  __syncthreads();                 /* sh may still be read from a previous call */
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0.f;
  return kc_warp_sum(v);
}
__device__ __forceinline__ float kc_block_max(float v, float *sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = kc_warp_max(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : -INFINITY;
  return kc_warp_max(v);
}
/* Row statistics for a stable softmax of x[base, base+d), one block per row: the max and
 * sum(exp(x - max)), both the same in every thread. Shared by softmax and cross-entropy. */
__device__ __forceinline__ void kc_row_softmax_stats(const void *x, int xdt, int64_t base, int64_t d,
                                                     float *sh, float *mx_out, float *sum_out) {
  float mx = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) mx = fmaxf(mx, kc_ld(x, xdt, base + j));
  mx = kc_block_max(mx, sh);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += expf(kc_ld(x, xdt, base + j) - mx);
  *mx_out = mx, *sum_out = kc_block_sum(s, sh);
}

static inline int64_t kc_numel(const kda_tview *t) { return kda_tview_numel(t); }
static inline int64_t kc_lastdim(const kda_tview *t) { return t->shape[t->ndim - 1]; }
static inline unsigned kc_blocks(int64_t n, int threads, int64_t cap) {
  int64_t b = (n + threads - 1) / threads;
  if (b > cap) b = cap;
  if (b < 1) b = 1;
  return (unsigned)b;
}
static inline int64_t kc_dsize(int dt) {
  return dt == KDA_BF16 ? 2 : dt == KDA_U8 ? 1 : dt == KDA_F64 ? 8 : 4;
}
#define KC_ALIGN(x) (((x) + 255) & ~(int64_t)255)

/* ---- scratch sizes (backend_cuda.cu asks each file) ------------------------------------- */
int64_t kc_gemm_scratch(const kda_exec_node *n);
int64_t kc_norm_scratch(const kda_exec_node *n);
int64_t kc_reduce_scratch(const kda_exec_node *n);
int64_t kc_attention_scratch(const kda_exec_node *n);
int64_t kc_embed_scratch(const kda_exec_node *n);

/* ---- op launchers ------------------------------------------------------------------------ */
int kc_gemm_init(kc_ctx *c);              /* cuBLASLt handle + workspace, once */
void kc_gemm_shutdown(void);
int kc_matmul(const kda_exec_node *n, kc_ctx *c);
int kc_matmul_add(const kda_exec_node *mm, const kda_exec_node *add, int addend, kc_ctx *c);

int kc_binary(const kda_exec_node *n, kc_ctx *c);      /* ADD, MUL */
int kc_unary(const kda_exec_node *n, kc_ctx *c);       /* SCALE, SILU, GELU, SIGMOID and bwds */
int kc_swiglu(const kda_exec_node *n, kc_ctx *c);
int kc_swiglu_bwd(const kda_exec_node *n, kc_ctx *c);
int kc_softmax(const kda_exec_node *n, kc_ctx *c);
int kc_softmax_bwd(const kda_exec_node *n, kc_ctx *c);
int kc_rope(const kda_exec_node *n, kc_ctx *c);
int kc_fill(const kda_exec_node *n, kc_ctx *c);
int kc_transpose(const kda_exec_node *n, kc_ctx *c);
int kc_embed(const kda_exec_node *n, kc_ctx *c);
int kc_embed_bwd(const kda_exec_node *n, kc_ctx *c);

/* out[j] = sum_i x[i,j] * (y ? y[i,j] : 1) * (rs ? rs[i] : 1), deterministic, two passes. */
int64_t kc_colsum_scratch(int64_t rows, int64_t d);
int kc_colsum(const kda_exec_node *n, kc_ctx *c, const void *x, int xdt, const void *y, int ydt,
              const float *rs, int64_t rows, int64_t d, void *o, int odt, float *scratch);
int kc_rmsnorm(const kda_exec_node *n, kc_ctx *c);
int kc_rmsnorm_bwd(const kda_exec_node *n, kc_ctx *c);
/* Fusions of the backend's run list (backend_cuda.cu decides when they are safe). */
int kc_add_rmsnorm(const kda_exec_node *add, const kda_exec_node *norm, kc_ctx *c);
int kc_rmsnorm_bwd_add(const kda_exec_node *n, const kda_exec_node *add, int dx_input, kc_ctx *c);

int kc_cross_entropy(const kda_exec_node *n, kc_ctx *c);
int kc_cross_entropy_bwd(const kda_exec_node *n, kc_ctx *c);
int kc_cross_entropy_fused(const kda_exec_node *n, const kda_exec_node *bwd, kc_ctx *c);
int kc_sum(const kda_exec_node *n, kc_ctx *c);         /* SUM, MEAN */
int kc_sum_rows(const kda_exec_node *n, kc_ctx *c);
int kc_grad_norm(const kda_exec_node *n, kc_ctx *c);

int kc_schedule(const kda_exec_node *n, kc_ctx *c);
int kc_adamw(const kda_exec_node *n, kc_ctx *c);
/* optim_ext.cu: the guard, Muon, EMA and retraction nodes */
int kc_guard(const kda_exec_node *n, kc_ctx *c);
int kc_muon(const kda_exec_node *n, kc_ctx *c);
int64_t kc_muon_scratch(const kda_exec_node *n);
int kc_ema(const kda_exec_node *n, kc_ctx *c);
int kc_retract(const kda_exec_node *n, kc_ctx *c);

int kc_attention(const kda_exec_node *n, kc_ctx *c);
int kc_attention_bwd(const kda_exec_node *n, kc_ctx *c);
/* decode.cu: the one-token decode ops ATTN_DECODE, CONV1D_DECODE (ROPE at a position: kc_rope) */
int kc_attn_decode(const kda_exec_node *n, kc_ctx *c);
int kc_conv1d_decode(const kda_exec_node *n, kc_ctx *c);
int64_t kc_decode_scratch(const kda_exec_node *n);

/* ---- bf16 shadows of f32 GEMM operands (appended) ----------------------------------------
 * backend_cuda.cu finds, per list, the f32 operands of mixed GEMMs that no earlier node of the
 * list writes (the f32 master weights), keeps a persistent bf16 copy of each, refreshes all of
 * them with a few launches at the start of the list (part of the captured graph), and tells
 * gemm.cu which copies are valid; kc_matmul then reads the copy instead of rounding the
 * weight into scratch before every product. Same rounding (RN) as before: same bits. */
typedef struct kc_shadow {
  const float *src;
  int64_t n;                 /* elements */
  __nv_bfloat16 *dst;        /* persistent, n bf16 */
  int valid_until;           /* node index: the copy equals src for nodes [0, valid_until) */
} kc_shadow;
/* The shadows of the list nodes[0..nn) about to run; (NULL, 0, NULL, 0) clears. */
void kc_gemm_set_shadows(const kc_shadow *s, int ns, const kda_exec_node *nodes, int nn);
/* dst = bf16(src) for every shadow (ceil(ns / 96) launches; the table rides in the kernel
 * arguments, so a captured graph needs no device-side table). */
int kc_shadow_refresh(const kc_shadow *s, int ns, kc_ctx *c);
/* 1 when n is a MATMUL that rounds its f32 operand(s) to bf16 (a bf16 operand or output). */
int kc_gemm_mixed(const kda_exec_node *n);

/* ---- multi-tensor AdamW (appended) -------------------------------------------------------
 * Runs nodes[0] (an ADAMW) and the ADAMW nodes right after it that share its gnorm, state
 * and betas/eps/clip, in ceil(k / 48) launches; returns how many nodes it ran (>= 1), or -1. */
int kc_adamw_multi(const kda_exec_node *nodes, int avail, kc_ctx *c);
#endif
