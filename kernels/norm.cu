/* norm.cu — RMSNorm forward/backward and the deterministic column sum behind dw and SUM_ROWS.
 * CPU twin: cpu_rmsnorm, cpu_rmsnorm_bwd, cpu_sum_rows in core/cpu_ops.c.
 *
 * Column sums (dw = sum_rows(dy x r), bias gradients) never use float atomics: pass 1 gives
 * each of a fixed number of row chunks a partial [D] in scratch, pass 2 adds the partials in
 * a fixed order. The chunk count depends only on the shape, so runs are bit-reproducible.
 * For d <= 2048 (bf16 x; 1024 for f32 x) the backward's pass 1 is inside its row kernel
 * (k_rmsnorm_bwd_w); kc_colsum serves SUM_ROWS and the wider rows.                         */
#include "kernels.h"

#define CS_T 256          /* columns per block in the column-sum passes */
#define CS_MAXCHUNK 128   /* row chunks of pass 1 */

static int64_t colsum_chunks(int64_t rows) {
  int64_t ch = (rows + 63) / 64;   /* at least 64 rows per chunk: enough work per thread */
  if (ch > CS_MAXCHUNK) ch = CS_MAXCHUNK;
  return ch < 1 ? 1 : ch;
}

int64_t kc_colsum_scratch(int64_t rows, int64_t d) {
  return KC_ALIGN(colsum_chunks(rows) * d * (int64_t)sizeof(float));
}

/* partial[chunk, j] = sum over the chunk's rows of x[i,j] * (y ? y[i,j] : 1) * (rs ? rs[i] : 1) */
__global__ void k_colsum_partial(const void *x, int xdt, const void *y, int ydt, const float *rs,
                                 int64_t rows, int64_t d, int64_t per, float *partial) {
  int64_t j = (int64_t)blockIdx.x * CS_T + threadIdx.x;
  if (j >= d) return;
  int64_t r0 = blockIdx.y * per, r1 = r0 + per < rows ? r0 + per : rows;
  float acc = 0.f;
  for (int64_t i = r0; i < r1; i++) {
    float v = kc_ld(x, xdt, i * d + j);
    if (y) v *= kc_ld(y, ydt, i * d + j);
    if (rs) v *= rs[i];
    acc += v;
  }
  partial[blockIdx.y * d + j] = acc;
}

__global__ void k_colsum_final(const float *partial, int64_t nch, int64_t d, void *o, int odt) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float acc = 0.f;
  for (int64_t c = 0; c < nch; c++) acc += partial[c * d + j];
  kc_st(o, odt, j, acc);
}

int kc_colsum(const kda_exec_node *n, kc_ctx *c, const void *x, int xdt, const void *y, int ydt,
              const float *rs, int64_t rows, int64_t d, void *o, int odt, float *scratch) {
  int64_t nch = colsum_chunks(rows), per = (rows + nch - 1) / nch;
  dim3 g1((unsigned)((d + CS_T - 1) / CS_T), (unsigned)nch);
  k_colsum_partial<<<g1, CS_T, 0, c->stream>>>(x, xdt, y, ydt, rs, rows, d, per, scratch);
  KC_LAUNCH_CHECK(n, "k_colsum_partial");
  k_colsum_final<<<(unsigned)((d + CS_T - 1) / CS_T), CS_T, 0, c->stream>>>(scratch, nch, d, o, odt);
  KC_LAUNCH_CHECK(n, "k_colsum_final");
  return 0;
}

int kc_sum_rows(const kda_exec_node *n, kc_ctx *c) {
  const kda_tview *x = &n->in[0];
  int64_t d = kc_lastdim(x), rows = kc_numel(x) / d;
  return kc_colsum(n, c, x->data, x->dtype, NULL, KDA_F32, NULL, rows, d, n->out.data,
                   n->out.dtype, (float *)c->scratch);
}

/* ---- warp-per-row kernels (d <= WR_MAXD) ---------------------------------------------------
 * One warp per row, 8 warps a block; lane l holds columns l, l+32, l+64, ... (NPL slots, the
 * smallest instantiated count that covers d; slots at j >= d hold 0 and are never stored). The
 * row's sums are warp shuffles: no __syncthreads and no shared memory per row, and the row sits
 * in registers between its two passes, so x (and dy, res) are read from memory once. The
 * block-per-row kernels (one block of 64..512 threads a row, two barriers per reduction) keep
 * few rows in flight per SM at these widths; they stay for d > WR_MAXD. */
#define NW 8          /* warps per block */
#define WR_MAXD 2048  /* widest row of the warp-per-row kernels: NPL 64 */

static int wr_npl(int64_t d) {
  int64_t s = (d + 31) / 32;
  return s <= 2 ? 2 : s <= 4 ? 4 : s <= 8 ? 8 : s <= 16 ? 16 : s <= 24 ? 24 : s <= 32 ? 32 : 64;
}

/* v[k] = p[base + lane + 32k] as float, 0 past d. FULL: d == 32 * NPL, no test per slot (the
 * tests' predicates cost ~30 registers at NPL 24; every model width so far is a multiple of 32
 * whose NPL is exact: 64, 128, 256, 512, 768, 1024, 2048). */
template <int NPL, bool FULL, typename T>
__device__ __forceinline__ void wr_ld(const T *p, int64_t base, int lane, int d, float (&v)[NPL]) {
#pragma unroll
  for (int k = 0; k < NPL; k++) {
    int j = lane + 32 * k;
    v[k] = FULL || j < d ? kc_to_f(p[base + j]) : 0.f;
  }
}
template <int NPL, bool FULL>
__device__ __forceinline__ void wr_ld_dt(const void *p, int dt, int64_t base, int lane, int d,
                                         float (&v)[NPL]) {
  if (dt == KDA_BF16) wr_ld<NPL, FULL>((const __nv_bfloat16 *)p, base, lane, d, v);
  else wr_ld<NPL, FULL>((const float *)p, base, lane, d, v);
}
template <int NPL, bool FULL, typename T>
__device__ __forceinline__ void wr_st(T *p, int64_t base, int lane, int d, const float (&v)[NPL]) {
#pragma unroll
  for (int k = 0; k < NPL; k++) {
    int j = lane + 32 * k;
    if (FULL || j < d) p[base + j] = kc_from_f<T>(v[k]);
  }
}
template <int NPL, bool FULL>
__device__ __forceinline__ void wr_st_dt(void *p, int dt, int64_t base, int lane, int d,
                                         const float (&v)[NPL]) {
  if (dt == KDA_BF16) wr_st<NPL, FULL>((__nv_bfloat16 *)p, base, lane, d, v);
  else wr_st<NPL, FULL>((float *)p, base, lane, d, v);
}

/* r = 1/sqrt(mean(v^2) + eps) of the warp's row: each lane sums its slots in order, then the
 * shuffle tree. k_rmsnorm_w and k_add_rmsnorm_w both use it: the same bits. */
template <int NPL>
__device__ __forceinline__ float wr_rms(const float (&v)[NPL], int d, float eps) {
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NPL; k++) ss += v[k] * v[k];
  ss = kc_warp_sum(ss);
  return rsqrtf(ss / (float)d + eps);
}

/* ---- RMSNorm forward ------------------------------------------------------------------------ */
template <typename TX, typename TO>
__global__ void k_rmsnorm(const TX *x, const void *w, int wdt, TO *y, int64_t d, float eps) {
  __shared__ float sh[32];
  const TX *xi = x + (int64_t)blockIdx.x * d;
  TO *yi = y + (int64_t)blockIdx.x * d;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float v = kc_to_f(xi[j]);
    ss += v * v;
  }
  ss = kc_block_sum(ss, sh);
  float r = rsqrtf(ss / (float)d + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    yi[j] = kc_from_f<TO>(kc_to_f(xi[j]) * r * kc_ld(w, wdt, j));
}

/* d <= WR_MAXD: warp per row, y = x r w (the same expression). x is read once (the block-per-
 * row kernel reads it twice, the second time mostly from L1) and a block keeps NW rows in
 * flight instead of one, with no barrier: near the copy rate, ~3.5-4 TB/s, at M [65536,768]
 * bf16 (~55 us for the 200 MB; the block-per-row kernel ran ~1.3 TB/s at [65536,2048])
 * (predicted). Measured on the H200 (GPT M profile, 427f666): 25 RMSNORM nodes 4.27 -> 1.43 ms
 * a step, ~57 us each. 64 registers at NPL 24 (exact row): 4 blocks, 32 warps a SM. */
template <typename TX, typename TO, int NPL, bool FULL>
__global__ void __launch_bounds__(NW * 32)
    k_rmsnorm_w(const TX *x, const void *w, int wdt, TO *y, int64_t rows, int d, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t i = (int64_t)blockIdx.x * NW + (threadIdx.x >> 5);
  if (i >= rows) return;   /* the whole warp: no barrier below */
  float v[NPL], wv[NPL];
  wr_ld<NPL, FULL>(x, i * d, lane, d, v);
  float r = wr_rms<NPL>(v, d, eps);
  wr_ld_dt<NPL, FULL>(w, wdt, 0, lane, d, wv);
#pragma unroll
  for (int k = 0; k < NPL; k++) v[k] = v[k] * r * wv[k];
  wr_st<NPL, FULL>(y, i * d, lane, d, v);
}

static int norm_threads(int64_t d) { return d >= 2048 ? 512 : d >= 512 ? 256 : d > 64 ? 128 : 64; }
static unsigned wr_blocks(int64_t rows) {   /* a warp per row */
  return rows > NW ? (unsigned)((rows + NW - 1) / NW) : 1u;
}

template <typename TX, typename TO, int NPL>
static void launch_rmsnorm_w(const kda_exec_node *n, kc_ctx *c, int64_t rows, int64_t d) {
  if (d == 32 * NPL)
    k_rmsnorm_w<TX, TO, NPL, true><<<wr_blocks(rows), NW * 32, 0, c->stream>>>(
        (const TX *)n->in[0].data, n->in[1].data, n->in[1].dtype, (TO *)n->out.data, rows, (int)d,
        n->fattr[0]);
  else
    k_rmsnorm_w<TX, TO, NPL, false><<<wr_blocks(rows), NW * 32, 0, c->stream>>>(
        (const TX *)n->in[0].data, n->in[1].data, n->in[1].dtype, (TO *)n->out.data, rows, (int)d,
        n->fattr[0]);
}

template <typename TX, typename TO>
static void launch_rmsnorm(const kda_exec_node *n, kc_ctx *c, int64_t rows, int64_t d) {
  if (d > WR_MAXD) {
    k_rmsnorm<TX, TO><<<(unsigned)rows, norm_threads(d), 0, c->stream>>>(
        (const TX *)n->in[0].data, n->in[1].data, n->in[1].dtype, (TO *)n->out.data, d,
        n->fattr[0]);
    return;
  }
  switch (wr_npl(d)) {
  case 2: launch_rmsnorm_w<TX, TO, 2>(n, c, rows, d); break;
  case 4: launch_rmsnorm_w<TX, TO, 4>(n, c, rows, d); break;
  case 8: launch_rmsnorm_w<TX, TO, 8>(n, c, rows, d); break;
  case 16: launch_rmsnorm_w<TX, TO, 16>(n, c, rows, d); break;
  case 24: launch_rmsnorm_w<TX, TO, 24>(n, c, rows, d); break;
  case 32: launch_rmsnorm_w<TX, TO, 32>(n, c, rows, d); break;
  default: launch_rmsnorm_w<TX, TO, 64>(n, c, rows, d); break;
  }
}

int kc_rmsnorm(const kda_exec_node *n, kc_ctx *c) {
  const kda_tview *x = &n->in[0];
  int64_t d = kc_lastdim(x), rows = kc_numel(x) / d;
  int xb = x->dtype == KDA_BF16, ob = n->out.dtype == KDA_BF16;
  if (xb && ob) launch_rmsnorm<__nv_bfloat16, __nv_bfloat16>(n, c, rows, d);
  else if (xb) launch_rmsnorm<__nv_bfloat16, float>(n, c, rows, d);
  else if (ob) launch_rmsnorm<float, __nv_bfloat16>(n, c, rows, d);
  else launch_rmsnorm<float, float>(n, c, rows, d);
  KC_LAUNCH_CHECK(n, "k_rmsnorm");
  return 0;
}

/* ---- residual add + RMSNorm: the backend's fusion of ADD(a, b) -> h and RMSNORM(h, w) -> y
 * (a pre-norm block's residual stream and the next norm). h is stored and the norm uses it as
 * stored, with the forward kernel's layout and order (k_rmsnorm for d > WR_MAXD, k_rmsnorm_w
 * with the same NPL and wr_rms below): the same bits as the two nodes apart. Saves a launch
 * and a pass over h. */
__global__ void k_add_rmsnorm(const void *a, int adt, const void *b, int bdt, void *h, int hdt,
                              const void *w, int wdt, void *y, int ydt, int64_t d, float eps) {
  __shared__ float sh[32];
  const int64_t base = (int64_t)blockIdx.x * d;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    kc_st(h, hdt, base + j, kc_ld(a, adt, base + j) + kc_ld(b, bdt, base + j));
    float v = kc_ld(h, hdt, base + j);
    ss += v * v;
  }
  ss = kc_block_sum(ss, sh);
  float r = rsqrtf(ss / (float)d + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    kc_st(y, ydt, base + j, kc_ld(h, hdt, base + j) * r * kc_ld(w, wdt, j));
}

/* h = a + b rounded to h's dtype in registers (the value a read of the stored h gives), so the
 * norm needs no read back of h. */
template <int NPL, bool FULL>
__global__ void __launch_bounds__(NW * 32)
    k_add_rmsnorm_w(const void *a, int adt, const void *b, int bdt, void *h, int hdt,
                    const void *w, int wdt, void *y, int ydt, int64_t rows, int d, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t i = (int64_t)blockIdx.x * NW + (threadIdx.x >> 5), base = i * d;
  if (i >= rows) return;
  float v[NPL], u[NPL];
  wr_ld_dt<NPL, FULL>(a, adt, base, lane, d, v);
  wr_ld_dt<NPL, FULL>(b, bdt, base, lane, d, u);
#pragma unroll
  for (int k = 0; k < NPL; k++) v[k] = v[k] + u[k];
  if (hdt == KDA_BF16) {
#pragma unroll
    for (int k = 0; k < NPL; k++) v[k] = __bfloat162float(__float2bfloat16(v[k]));
  }
  wr_st_dt<NPL, FULL>(h, hdt, base, lane, d, v);   /* exact: v is already in h's dtype */
  float r = wr_rms<NPL>(v, d, eps);
  wr_ld_dt<NPL, FULL>(w, wdt, 0, lane, d, u);
#pragma unroll
  for (int k = 0; k < NPL; k++) v[k] = v[k] * r * u[k];
  wr_st_dt<NPL, FULL>(y, ydt, base, lane, d, v);
}

template <int NPL>
static void launch_add_rmsnorm_w(const kda_exec_node *add, const kda_exec_node *norm, kc_ctx *c,
                                 int64_t rows, int64_t d) {
  if (d == 32 * NPL)
    k_add_rmsnorm_w<NPL, true><<<wr_blocks(rows), NW * 32, 0, c->stream>>>(
        add->in[0].data, add->in[0].dtype, add->in[1].data, add->in[1].dtype, add->out.data,
        add->out.dtype, norm->in[1].data, norm->in[1].dtype, norm->out.data, norm->out.dtype,
        rows, (int)d, norm->fattr[0]);
  else
    k_add_rmsnorm_w<NPL, false><<<wr_blocks(rows), NW * 32, 0, c->stream>>>(
        add->in[0].data, add->in[0].dtype, add->in[1].data, add->in[1].dtype, add->out.data,
        add->out.dtype, norm->in[1].data, norm->in[1].dtype, norm->out.data, norm->out.dtype,
        rows, (int)d, norm->fattr[0]);
}

int kc_add_rmsnorm(const kda_exec_node *add, const kda_exec_node *norm, kc_ctx *c) {
  const kda_tview *x = &norm->in[0];
  int64_t d = kc_lastdim(x), rows = kc_numel(x) / d;
  if (d > WR_MAXD) {
    k_add_rmsnorm<<<(unsigned)rows, norm_threads(d), 0, c->stream>>>(
        add->in[0].data, add->in[0].dtype, add->in[1].data, add->in[1].dtype, add->out.data,
        add->out.dtype, norm->in[1].data, norm->in[1].dtype, norm->out.data, norm->out.dtype, d,
        norm->fattr[0]);
  } else {
    switch (wr_npl(d)) {
    case 2: launch_add_rmsnorm_w<2>(add, norm, c, rows, d); break;
    case 4: launch_add_rmsnorm_w<4>(add, norm, c, rows, d); break;
    case 8: launch_add_rmsnorm_w<8>(add, norm, c, rows, d); break;
    case 16: launch_add_rmsnorm_w<16>(add, norm, c, rows, d); break;
    case 24: launch_add_rmsnorm_w<24>(add, norm, c, rows, d); break;
    case 32: launch_add_rmsnorm_w<32>(add, norm, c, rows, d); break;
    default: launch_add_rmsnorm_w<64>(add, norm, c, rows, d); break;
    }
  }
  KC_LAUNCH_CHECK(norm, "k_add_rmsnorm");
  return 0;
}

/* ---- RMSNorm backward -------------------------------------------------------------------
 * Per row: r = 1/sqrt(mean(x^2)+eps), dx = r w dy - x r^3 mean(x w dy); dw = sum_rows(dy x r).
 * Output packed in out's dtype: dx [N*D] then dw [D].
 * With res != NULL (the backend's fusion of the ADD that sums dx into the residual stream's
 * gradient) also sum = res + dx as stored: the same bits as the ADD node, one launch and two
 * passes fewer.
 *
 * d <= WR_MAXD: k_rmsnorm_bwd_w, a warp per row that also sums dw. Block b owns a chunk of
 * `per` rows (a multiple of NW, from the shape only); warp w takes the chunk's rows w, w+NW, ..
 * and adds dy x r into per-lane registers for its columns; at the end the NW warps' sums meet
 * in shared memory, added in warp order, and go to partial[b]; k_dw_final adds the chunks in a
 * fixed order. Fixed order throughout: bit-reproducible, no atomics. Why: bandwidth. This
 * reads x, dy (and res) once; the old path (block-per-row kernel, then k_colsum_partial over
 * dy, x and r) read x and dy twice, and its block per row (two barriers per reduction) kept few
 * rows in flight. GPT M's fused node [65536,768] bf16 moves ~500 MB instead of ~700 MB:
 * ~400 us -> ~150 us (~3.4 TB/s; 16 warps a SM at 118 registers); GPT S [4096,256]: ~24 us ->
 * ~7 us, mostly launch and latency (predicted). Measured on the H200 (427f666): GPT M's 24
 * fused rmsnorm_bwd+add nodes 9.60 -> 4.39 ms a step (~183 us each). Other shapes (d > WR_MAXD,
 * f32 x with d > 1024) keep the old path (k_rmsnorm_bwd then kc_colsum). */
template <typename TX, typename TO>
__global__ void k_rmsnorm_bwd(const TX *x, const void *w, int wdt, const TX *dy, TO *dx,
                              float *rs, int64_t d, float eps, const void *res, int rdt,
                              void *sum, int sdt) {
  __shared__ float sh[32];
  int64_t row = blockIdx.x;
  const TX *xi = x + row * d, *gi = dy + row * d;
  float ss = 0.f, dot = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float v = kc_to_f(xi[j]);
    ss += v * v;
    dot += v * kc_ld(w, wdt, j) * kc_to_f(gi[j]);
  }
  ss = kc_block_sum(ss, sh);
  dot = kc_block_sum(dot, sh);
  float r = rsqrtf(ss / (float)d + eps);
  float cc = dot / (float)d * r * r * r;
  if (threadIdx.x == 0) rs[row] = r;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    TO g = kc_from_f<TO>(r * kc_ld(w, wdt, j) * kc_to_f(gi[j]) - kc_to_f(xi[j]) * cc);
    dx[row * d + j] = g;
    if (sum) kc_st(sum, sdt, row * d + j, kc_ld(res, rdt, row * d + j) + kc_to_f(g));
  }
}

/* Which rows take k_rmsnorm_bwd_w: d <= WR_MAXD, and for f32 x at most 1024 columns (an f32
 * row of 2048 holds 3 x 64 floats per lane and spills at 255 registers). */
static int wr_bwd_path(int64_t d, int xdt) {
  return d <= WR_MAXD && (xdt == KDA_BF16 || d <= 1024);
}

/* Rows per chunk of k_rmsnorm_bwd_w: enough chunks to fill the GPU (up to 1024, fewer when
 * d is wide, so that the partials stay <= 4 MiB), at least one row per warp. */
static int64_t wr_bwd_per(int64_t rows, int64_t d) {
  int64_t maxch = ((int64_t)1 << 20) / d;
  maxch = maxch < 128 ? 128 : maxch > 1024 ? 1024 : maxch;
  int64_t per = (rows + maxch - 1) / maxch;
  per = (per + NW - 1) / NW * NW;
  return per < NW ? NW : per;
}
static int64_t wr_bwd_chunks(int64_t rows, int64_t d) {
  int64_t per = wr_bwd_per(rows, d), nch = (rows + per - 1) / per;
  return nch < 1 ? 1 : nch;
}

/* Two blocks (16 warps) per SM where the row fits in 128 registers without spilling (ptxas -v:
 * NPL <= 24 always, NPL 32 for an exact bf16 row); one block otherwise (up to 255 registers). */
template <typename TX, int NPL, bool FULL>
struct wr_bwd_minb {
  static constexpr int v = NPL <= 24 || (NPL == 32 && FULL && sizeof(TX) == 2) ? 2 : 1;
  /* registers (sm_90, ptxas -v; F exact row, t tail), x/out bf16/bf16: NPL 2 36/40, 4 40/48,
   * 8 56/64, 16 96/94, 24 118/112, 32 128/140, 64 249/242; no spills in any instance */
};

template <typename TX, typename TO, int NPL, bool FULL>
__global__ void __launch_bounds__(NW * 32, (wr_bwd_minb<TX, NPL, FULL>::v))
    k_rmsnorm_bwd_w(const TX *x, const void *w, int wdt, const TX *dy, TO *dx, int64_t rows,
                    int d, int64_t per, float eps, const void *res, int rdt, void *sum, int sdt,
                    float *partial) {
  constexpr int SK = NPL < 8 ? NPL : 8;   /* slots per slab of the final warp sum */
  __shared__ float ws[32 * NPL];          /* w as f32, 0 past d */
  __shared__ float red[NW][32 * SK];
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  for (int j = threadIdx.x; j < 32 * NPL; j += NW * 32) ws[j] = j < d ? kc_ld(w, wdt, j) : 0.f;
  __syncthreads();
  float acc[NPL];
#pragma unroll
  for (int k = 0; k < NPL; k++) acc[k] = 0.f;
  const int64_t r0 = (int64_t)blockIdx.x * per, r1 = r0 + per < rows ? r0 + per : rows;
  for (int64_t i = r0 + wp; i < r1; i += NW) {
    const int64_t base = i * d;
    float xv[NPL], gv[NPL];
    wr_ld<NPL, FULL>(x, base, lane, d, xv);
    wr_ld<NPL, FULL>(dy, base, lane, d, gv);
    float ss = 0.f, dot = 0.f;
#pragma unroll
    for (int k = 0; k < NPL; k++) {
      ss += xv[k] * xv[k];
      dot += xv[k] * ws[lane + 32 * k] * gv[k];
    }
    ss = kc_warp_sum(ss);
    dot = kc_warp_sum(dot);
    float r = rsqrtf(ss / (float)d + eps);
    float cc = dot / (float)d * r * r * r;
#pragma unroll
    for (int k = 0; k < NPL; k++) {
      int j = lane + 32 * k;
      if (FULL || j < d) {
        TO g = kc_from_f<TO>(r * ws[j] * gv[k] - xv[k] * cc);
        dx[base + j] = g;
        acc[k] += gv[k] * xv[k] * r;  /* k_colsum_partial's product: dy * x * r */
        xv[k] = kc_to_f(g);           /* dx as stored: x's registers are free now */
      }
    }
    /* sum = res + dx as stored. res is loaded after the dx stores (it may share memory with
     * them as far as the compiler knows), all NPL loads at once into dy's free registers:
     * the row holds 3 NPL floats at most (acc, x, dy), not 4. */
    if (sum) {
      wr_ld_dt<NPL, FULL>(res, rdt, base, lane, d, gv);
#pragma unroll
      for (int k = 0; k < NPL; k++) gv[k] = gv[k] + xv[k];
      wr_st_dt<NPL, FULL>(sum, sdt, base, lane, d, gv);
    }
  }
  /* the NW warps' column sums, in warp order, one slab of 32*SK columns at a time */
  constexpr int SL = 32 * SK;
#pragma unroll
  for (int s = 0; s < NPL; s += SK) {
    if (32 * s < d) {   /* the same for every thread */
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < SK; kk++) red[wp][kk * 32 + lane] = acc[s + kk];
      __syncthreads();
      const int t = threadIdx.x, j = 32 * s + t;
      if (t < SL && j < d) {
        float q = red[0][t];
#pragma unroll
        for (int u = 1; u < NW; u++) q += red[u][t];
        partial[(int64_t)blockIdx.x * d + j] = q;
      }
    }
  }
}

/* dw[j] = the nch chunk partials added in chunk order: thread row ty adds its run of chunks,
 * then the 32 runs are added in order (a fixed tree: the same bits every run). 32 loads in
 * flight per column instead of one serial walk over up to 1024 chunks. */
__global__ void k_dw_final(const float *partial, int64_t nch, int64_t d, void *o, int odt) {
  __shared__ float s[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = (int64_t)blockIdx.x * 32 + tx, g = (nch + 31) / 32;
  const int64_t c0 = ty * g, c1 = c0 + g < nch ? c0 + g : nch;
  float acc = 0.f;
  if (j < d) {
#pragma unroll 8
    for (int64_t ch = c0; ch < c1; ch++) acc += partial[ch * d + j];
  }
  s[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && j < d) {
    float t = s[0][tx];
#pragma unroll
    for (int u = 1; u < 32; u++) t += s[u][tx];
    kc_st(o, odt, j, t);
  }
}

template <typename TX, typename TO, int NPL>
static void launch_rmsnorm_bwd_w(const kda_exec_node *n, kc_ctx *c, int64_t rows, int64_t d,
                                 float *part, const kda_tview *res, const kda_tview *sum) {
  int64_t per = wr_bwd_per(rows, d), nch = wr_bwd_chunks(rows, d);
  if (d == 32 * NPL)
    k_rmsnorm_bwd_w<TX, TO, NPL, true><<<(unsigned)nch, NW * 32, 0, c->stream>>>(
        (const TX *)n->in[0].data, n->in[1].data, n->in[1].dtype, (const TX *)n->in[2].data,
        (TO *)n->out.data, rows, (int)d, per, n->fattr[0], res ? res->data : NULL,
        res ? res->dtype : KDA_F32, sum ? sum->data : NULL, sum ? sum->dtype : KDA_F32, part);
  else
    k_rmsnorm_bwd_w<TX, TO, NPL, false><<<(unsigned)nch, NW * 32, 0, c->stream>>>(
        (const TX *)n->in[0].data, n->in[1].data, n->in[1].dtype, (const TX *)n->in[2].data,
        (TO *)n->out.data, rows, (int)d, per, n->fattr[0], res ? res->data : NULL,
        res ? res->dtype : KDA_F32, sum ? sum->data : NULL, sum ? sum->dtype : KDA_F32, part);
}

template <typename TX, typename TO>
static void launch_rmsnorm_bwd(const kda_exec_node *n, kc_ctx *c, int64_t rows, int64_t d,
                               float *rs, float *part, const kda_tview *res,
                               const kda_tview *sum) {
  if (!wr_bwd_path(d, sizeof(TX) == 2 ? KDA_BF16 : KDA_F32)) {
    k_rmsnorm_bwd<TX, TO><<<(unsigned)rows, norm_threads(d), 0, c->stream>>>(
        (const TX *)n->in[0].data, n->in[1].data, n->in[1].dtype, (const TX *)n->in[2].data,
        (TO *)n->out.data, rs, d, n->fattr[0], res ? res->data : NULL,
        res ? res->dtype : KDA_F32, sum ? sum->data : NULL, sum ? sum->dtype : KDA_F32);
    return;
  }
  switch (wr_npl(d)) {
  case 2: launch_rmsnorm_bwd_w<TX, TO, 2>(n, c, rows, d, part, res, sum); break;
  case 4: launch_rmsnorm_bwd_w<TX, TO, 4>(n, c, rows, d, part, res, sum); break;
  case 8: launch_rmsnorm_bwd_w<TX, TO, 8>(n, c, rows, d, part, res, sum); break;
  case 16: launch_rmsnorm_bwd_w<TX, TO, 16>(n, c, rows, d, part, res, sum); break;
  case 24: launch_rmsnorm_bwd_w<TX, TO, 24>(n, c, rows, d, part, res, sum); break;
  case 32: launch_rmsnorm_bwd_w<TX, TO, 32>(n, c, rows, d, part, res, sum); break;
  default:   /* f32 x never gets here (wr_bwd_path): no f32 NPL 64 instance */
    if constexpr (sizeof(TX) == 2) launch_rmsnorm_bwd_w<TX, TO, 64>(n, c, rows, d, part, res, sum);
    break;
  }
}

/* r per row (the old path's) then the larger of the two paths' chunk partials */
int64_t kc_norm_scratch(const kda_exec_node *n) {
  int64_t d = kc_lastdim(&n->in[0]), rows = kc_numel(&n->in[0]) / d;
  int64_t part = kc_colsum_scratch(rows, d);
  if (wr_bwd_path(d, n->in[0].dtype)) {
    int64_t wr = KC_ALIGN(wr_bwd_chunks(rows, d) * d * (int64_t)sizeof(float));
    if (wr > part) part = wr;
  }
  return KC_ALIGN(rows * (int64_t)sizeof(float)) + part;
}

static int rmsnorm_bwd(const kda_exec_node *n, kc_ctx *c, const kda_tview *res,
                       const kda_tview *sum) {
  const kda_tview *x = &n->in[0], *dy = &n->in[2];
  int64_t d = kc_lastdim(x), rows = kc_numel(x) / d;
  if (x->dtype != dy->dtype)
    return kda_set_error("cuda: rmsnorm_bwd node %d: x (%s) and dy (%s) must share a dtype",
                         n->id, kda_dtype_name(x->dtype), kda_dtype_name(dy->dtype));
  float *rs = (float *)c->scratch;
  float *part = (float *)((char *)c->scratch + KC_ALIGN(rows * (int64_t)sizeof(float)));
  int xb = x->dtype == KDA_BF16, ob = n->out.dtype == KDA_BF16;
  if (xb && ob) launch_rmsnorm_bwd<__nv_bfloat16, __nv_bfloat16>(n, c, rows, d, rs, part, res, sum);
  else if (xb) launch_rmsnorm_bwd<__nv_bfloat16, float>(n, c, rows, d, rs, part, res, sum);
  else if (ob) launch_rmsnorm_bwd<float, __nv_bfloat16>(n, c, rows, d, rs, part, res, sum);
  else launch_rmsnorm_bwd<float, float>(n, c, rows, d, rs, part, res, sum);
  KC_LAUNCH_CHECK(n, "k_rmsnorm_bwd");
  void *dw = (char *)n->out.data + rows * d * kc_dsize(n->out.dtype);
  if (!wr_bwd_path(d, x->dtype))
    return kc_colsum(n, c, dy->data, dy->dtype, x->data, x->dtype, rs, rows, d, dw,
                     n->out.dtype, part);
  k_dw_final<<<(unsigned)((d + 31) / 32), dim3(32, 32), 0, c->stream>>>(
      part, wr_bwd_chunks(rows, d), d, dw, n->out.dtype);
  KC_LAUNCH_CHECK(n, "k_dw_final");
  return 0;
}

int kc_rmsnorm_bwd(const kda_exec_node *n, kc_ctx *c) { return rmsnorm_bwd(n, c, NULL, NULL); }

/* RMSNORM_BWD then the ADD of its dx (add's input 1 - dx_input) to the other addend. */
int kc_rmsnorm_bwd_add(const kda_exec_node *n, const kda_exec_node *add, int dx_input, kc_ctx *c) {
  return rmsnorm_bwd(n, c, &add->in[1 - dx_input], &add->out);
}
