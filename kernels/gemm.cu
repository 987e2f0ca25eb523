/* gemm.cu — MATMUL through cuBLASLt. CPU twin: cpu_matmul in core/cpu_ops.c.
 *
 * Row-major out[M,N] = op(a)[M,K] @ op(b)[K,N] is column-major out^T = op(b)^T @ op(a)^T, so
 * cuBLASLt's "A" is our b and its "B" is our a, with the stored (row-major) matrices read as
 * column-major matrices of the transposed shape; our transpose flags carry over unchanged.
 *
 * Operand dtypes. Activations are bf16; parameters are f32 master copies. cuBLASLt has no
 * bf16 x f32 product, so an f32 operand beside a bf16 one (x @ W^T with W f32) is read from
 * its bf16 shadow (refreshed once at the start of the list by backend_cuda.cu, see kernels.h)
 * when it has a valid one, else rounded to bf16 into scratch by a small kernel right before
 * the product (an f32 operand written earlier in the same list, KDA_NO_SHADOW=1). When both
 * operands and the output are f32 (rare: tests, small f32 heads) the product is a true fp32
 * GEMM (CUBLAS_COMPUTE_32F, no TF32), so the f32 path agrees with the CPU to ~1e-6.
 * Accumulation is fp32 always; out may be bf16 or f32.
 *
 * Descriptors, layouts and the heuristic's algorithm are cached per (shape, strides,
 * transposes, dtypes, pointer alignment): the first (eager) run fills the cache, so capture
 * and replay do no host work beyond the launch itself.                                    */
#include <string.h>
#include <cublasLt.h>
#include "kernels.h"

#define WORKSPACE_BYTES ((size_t)32 << 20)   /* cuBLASLt's advice for Hopper */

static cublasLtHandle_t lt;
static void *workspace;

#define KC_BLAS(n, call)                                                                   \
  do {                                                                                     \
    cublasStatus_t s_ = (call);                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                       \
      return kc_fail((n), #call, cublasLtGetStatusString(s_), __FILE__, __LINE__);         \
  } while (0)

int kc_gemm_init(kc_ctx *c) {
  if (lt) return 0;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
    lt = NULL;
    return kda_set_error("cuda: cublasLtCreate failed: check the CUDA installation (libcublasLt)");
  }
  workspace = c->workspace;
  return 0;
}

/* ---- the plan cache ------------------------------------------------------------------------ */
typedef struct gemm_key {
  int64_t m, n, k, batch, lda, ldb, ldd, sa, sb, sd;
  int ta, tb, abt, ddt, align;   /* abt: operand type (both), ddt: output type */
} gemm_key;

typedef struct gemm_plan {
  gemm_key key;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
} gemm_plan;

enum { MAX_PLANS = 512 };
static gemm_plan plans[MAX_PLANS];
static int nplans;

static cudaDataType_t cuda_type(int dt) { return dt == KDA_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

static int layout(const kda_exec_node *n, cublasLtMatrixLayout_t *l, int dt, int64_t rows,
                  int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  KC_BLAS(n, cublasLtMatrixLayoutCreate(l, cuda_type(dt), (uint64_t)rows, (uint64_t)cols, ld));
  if (batch > 1) {
    int32_t bc = (int32_t)batch;
    KC_BLAS(n, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
    KC_BLAS(n, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return 0;
}

/* Column-major problem: D[n x m] = opA(A) opB(B) where A is our b (stored bc x br, col-major
 * view of row-major [br,bc]) and B is our a (stored ac x ar). */
static gemm_plan *find_plan(const kda_exec_node *n, const gemm_key *key) {
  for (int i = 0; i < nplans; i++)
    if (!memcmp(&plans[i].key, key, sizeof *key)) return &plans[i];
  if (nplans == MAX_PLANS) {
    kda_set_error("cuda: matmul node %d: more than %d distinct GEMM shapes", n->id, MAX_PLANS);
    return NULL;
  }
  gemm_plan *p = &plans[nplans];
  memset(p, 0, sizeof *p);
  p->key = *key;
  cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
  cublasOperation_t opa = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;   /* cuBLAS A = our b */
  cublasOperation_t opb = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N;   /* cuBLAS B = our a */
  if (cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa) ||
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb)) {
    kc_fail(n, "cublasLtMatmulDesc{Create,SetAttribute}", "failed", __FILE__, __LINE__);
    return NULL;
  }
  /* stored dims: our b is [rows_b, cols_b] row-major = col-major cols_b x rows_b */
  int64_t b_rows = key->tb ? key->n : key->k, b_cols = key->tb ? key->k : key->n;
  int64_t a_rows = key->ta ? key->k : key->m, a_cols = key->ta ? key->m : key->k;
  if (layout(n, &p->la, key->abt, b_cols, b_rows, key->ldb, key->batch, key->sb) ||
      layout(n, &p->lb, key->abt, a_cols, a_rows, key->lda, key->batch, key->sa) ||
      layout(n, &p->ld, key->ddt, key->n, key->m, key->ldd, key->batch, key->sd))
    return NULL;
  cublasLtMatmulPreference_t pref;
  size_t wsb = WORKSPACE_BYTES;
  uint32_t al = (uint32_t)key->align;
  cublasLtMatmulHeuristicResult_t res;
  int nres = 0;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) {
    kc_fail(n, "cublasLtMatmulPreferenceCreate", "failed", __FILE__, __LINE__);
    return NULL;
  }
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al);
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->la, p->lb, p->ld, p->ld,
                                                     pref, 1, &res, &nres);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || nres < 1) {
    char why[160];
    snprintf(why, sizeof why, "%s; no algorithm for m=%lld n=%lld k=%lld batch=%lld ta=%d tb=%d %s->%s align=%d",
             st != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(st) : "0 results",
             (long long)key->m, (long long)key->n, (long long)key->k, (long long)key->batch,
             key->ta, key->tb, key->abt == KDA_BF16 ? "bf16" : "f32",
             key->ddt == KDA_BF16 ? "bf16" : "f32", key->align);
    kc_fail(n, "cublasLtMatmulAlgoGetHeuristic", why, __FILE__, __LINE__);
    return NULL;
  }
  p->algo = res.algo;
  nplans++;
  return p;
}

/* ---- f32 -> bf16 operand rounding --------------------------------------------------------- */
__global__ void k_to_bf16(const float *x, __nv_bfloat16 *y, int64_t n) {
  int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 4;
  int64_t stride = (int64_t)gridDim.x * blockDim.x * 4;
  for (; i < n; i += stride) {
    if (i + 3 < n && ((uintptr_t)(x + i) & 15) == 0) {
      float4 v = *(const float4 *)(x + i);
      __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
      *(__nv_bfloat162 *)(y + i) = lo;       /* y is 256-aligned scratch, i % 4 == 0 */
      *(__nv_bfloat162 *)(y + i + 2) = hi;
    } else {
      for (int64_t j = i; j < i + 4 && j < n; j++) y[j] = __float2bfloat16(x[j]);
    }
  }
}

static int mixed(const kda_exec_node *n) {
  return !(n->in[0].dtype == KDA_F32 && n->in[1].dtype == KDA_F32 && n->out.dtype == KDA_F32);
}
int kc_gemm_mixed(const kda_exec_node *n) { return n->op == KDA_OP_MATMUL && mixed(n); }

/* ---- bf16 shadows (see kernels.h) ----------------------------------------------------------
 * Why: every x @ W^T and dY @ W with an f32 master weight used to launch k_to_bf16 first (one
 * launch + 6 B per weight element per product, twice per weight per step). Now one refresh per
 * list rounds every shadowed weight once. Predicted: -1 launch per weight GEMM (~100 fewer
 * launches per GPT S step, ~0.2 ms of 9.26 ms) and M=4096 N=3072 K=768 with an f32 weight
 * from 443 to ~528 TFLOP/s (the bf16-weight rate) whenever the refresh is amortised over the
 * step — predicted; to be measured. */
enum { SH_PER_LAUNCH = 96, SH_CHUNK = 8192 };
struct shadow_batch {
  int count;
  int64_t first_block[SH_PER_LAUNCH + 1];   /* prefix sums of ceil(n / SH_CHUNK) */
  const float *src[SH_PER_LAUNCH];
  __nv_bfloat16 *dst[SH_PER_LAUNCH];
  int64_t n[SH_PER_LAUNCH];
};

/* One block per SH_CHUNK elements of one tensor (chunks never straddle tensors). */
__global__ void __launch_bounds__(256) k_shadow_refresh(shadow_batch t) {
  const int64_t b = blockIdx.x;
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {   /* last e with first_block[e] <= b */
    int mid = (lo + hi + 1) >> 1;
    if (t.first_block[mid] <= b) lo = mid; else hi = mid - 1;
  }
  const float *x = t.src[lo];
  __nv_bfloat16 *y = t.dst[lo];
  const int64_t i0 = (b - t.first_block[lo]) * SH_CHUNK;
  const int64_t i1 = min(t.n[lo], i0 + (int64_t)SH_CHUNK);
  if (((uintptr_t)x & 15) == 0) {   /* dst is cudaMalloc'ed; i0 % 4 == 0 keeps both aligned */
    for (int64_t i = i0 + 4 * threadIdx.x; i < i1; i += 4 * blockDim.x) {
      if (i + 3 < i1) {
        float4 v = *(const float4 *)(x + i);
        *(__nv_bfloat162 *)(y + i) = __floats2bfloat162_rn(v.x, v.y);
        *(__nv_bfloat162 *)(y + i + 2) = __floats2bfloat162_rn(v.z, v.w);
      } else {
        for (int64_t j = i; j < i1; j++) y[j] = __float2bfloat16(x[j]);
      }
    }
  } else {
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) y[i] = __float2bfloat16(x[i]);
  }
}

int kc_shadow_refresh(const kc_shadow *s, int ns, kc_ctx *c) {
  for (int at = 0; at < ns; at += SH_PER_LAUNCH) {
    shadow_batch t;
    memset(&t, 0, sizeof t);
    t.count = ns - at < SH_PER_LAUNCH ? ns - at : SH_PER_LAUNCH;
    int64_t blocks = 0;
    for (int e = 0; e < t.count; e++) {
      t.first_block[e] = blocks;
      t.src[e] = s[at + e].src, t.dst[e] = s[at + e].dst, t.n[e] = s[at + e].n;
      blocks += (s[at + e].n + SH_CHUNK - 1) / SH_CHUNK;
    }
    t.first_block[t.count] = blocks;
    if (blocks == 0) continue;
    k_shadow_refresh<<<(unsigned)blocks, 256, 0, c->stream>>>(t);
    KC_LAUNCH_CHECK(NULL, "k_shadow_refresh");
  }
  return 0;
}

static const kc_shadow *sh_tab;
static int sh_n, sh_nodes;
static const kda_exec_node *sh_base;

void kc_gemm_set_shadows(const kc_shadow *s, int ns, const kda_exec_node *nodes, int nn) {
  sh_tab = s, sh_n = ns, sh_base = nodes, sh_nodes = nn;
}

/* The valid bf16 copy of operand t of node n, or NULL. */
static const __nv_bfloat16 *shadow_of(const kda_exec_node *n, const kda_tview *t) {
  if (!sh_n || n < sh_base || n >= sh_base + sh_nodes) return NULL;
  int idx = (int)(n - sh_base);
  int64_t cnt = kc_numel(t);
  for (int i = 0; i < sh_n; i++)
    if (sh_tab[i].src == (const float *)t->data && sh_tab[i].n == cnt)
      return idx < sh_tab[i].valid_until ? sh_tab[i].dst : NULL;
  return NULL;
}

int64_t kc_gemm_scratch(const kda_exec_node *n) {
  if (!mixed(n)) return 0;
  int64_t s = 0;
  for (int i = 0; i < 2; i++)
    if (n->in[i].dtype == KDA_F32) s += KC_ALIGN(kc_numel(&n->in[i]) * 2);
  return s;
}

static int align_of(const void *p) {
  uintptr_t u = (uintptr_t)p;
  int a = 256;
  while (a > 2 && (u % (uintptr_t)a)) a >>= 1;
  return a;
}

/* out = op(a) @ op(b) (+ addend, when not NULL: cuBLASLt's C with beta = 1, same dtype and
 * layout as out), out in dtype odt. */
static int matmul(const kda_exec_node *n, kc_ctx *c, const void *addend, void *out, int odt) {
  const kda_tview *a = &n->in[0], *b = &n->in[1];
  const void *pa = a->data, *pb = b->data;
  int abt = KDA_F32;
  if (mixed(n)) {   /* round any f32 operand to bf16 into scratch */
    abt = KDA_BF16;
    char *s = (char *)c->scratch;
    const void **pp[2] = {&pa, &pb};
    for (int i = 0; i < 2; i++) {
      if (n->in[i].dtype != KDA_F32) continue;
      const __nv_bfloat16 *sh = shadow_of(n, &n->in[i]);
      if (sh) { *pp[i] = sh; continue; }   /* refreshed at the start of this list */
      int64_t cnt = kc_numel(&n->in[i]);
      k_to_bf16<<<kc_blocks((cnt + 3) / 4, 256, 4096), 256, 0, c->stream>>>(
          (const float *)n->in[i].data, (__nv_bfloat16 *)s, cnt);
      KC_LAUNCH_CHECK(n, "k_to_bf16");
      *pp[i] = s;
      s += KC_ALIGN(cnt * 2);
    }
  }
  int ta = (int)n->iattr[0], tb = (int)n->iattr[1];
  int64_t ar = a->shape[a->ndim - 2], ac = a->shape[a->ndim - 1];
  int64_t br = b->shape[b->ndim - 2], bc = b->shape[b->ndim - 1];
  int64_t batch = a->ndim == 3 ? a->shape[0] : 1;
  gemm_key key;
  memset(&key, 0, sizeof key);
  key.m = ta ? ac : ar;
  key.k = ta ? ar : ac;
  key.n = tb ? br : bc;
  key.batch = batch;
  key.lda = ac, key.ldb = bc, key.ldd = key.n;
  key.sa = ar * ac, key.sb = b->ndim == 3 ? br * bc : 0, key.sd = key.m * key.n;
  if (batch > 1 && b->ndim == 2 && !ta) {   /* shared b: one tall GEMM over every row of a */
    key.m *= batch;
    key.batch = 1;
    key.sa = key.sb = key.sd = 0;
  }
  if (key.batch == 1) key.sa = key.sb = key.sd = 0;
  key.ta = ta, key.tb = tb, key.abt = abt, key.ddt = odt;
  int al = align_of(pa);
  if (align_of(pb) < al) al = align_of(pb);
  if (align_of(out) < al) al = align_of(out);
  if (addend && align_of(addend) < al) al = align_of(addend);
  key.align = al;
  gemm_plan *p = find_plan(n, &key);
  if (!p) return -1;
  const float alpha = 1.0f, beta = addend ? 1.0f : 0.0f;
  KC_BLAS(n, cublasLtMatmul(lt, p->desc, &alpha, pb, p->la, pa, p->lb, &beta, addend ? addend : out,
                            p->ld, out, p->ld, &p->algo, workspace, WORKSPACE_BYTES, c->stream));
  return 0;
}

int kc_matmul(const kda_exec_node *n, kc_ctx *c) {
  return matmul(n, c, NULL, n->out.data, n->out.dtype);
}

/* The backend's fusion of a MATMUL with the ADD of its product to another tensor (a gradient
 * sum: dX = dY1 W1 + dY2 W2 + ...): the product accumulates onto the addend in the GEMM's
 * epilogue and lands in the ADD's output, rounded once. Saves the ADD's launch and three
 * passes over the tensor (write the product, read it and the addend back). */
int kc_matmul_add(const kda_exec_node *mm, const kda_exec_node *add, int addend, kc_ctx *c) {
  return matmul(mm, c, add->in[addend].data, add->out.data, add->out.dtype);
}

void kc_gemm_shutdown(void) {
  for (int i = 0; i < nplans; i++) {
    cublasLtMatrixLayoutDestroy(plans[i].la);
    cublasLtMatrixLayoutDestroy(plans[i].lb);
    cublasLtMatrixLayoutDestroy(plans[i].ld);
    cublasLtMatmulDescDestroy(plans[i].desc);
  }
  nplans = 0;
  if (lt) cublasLtDestroy(lt);
  lt = NULL;
}
