/* cuda_ops_bench.cu — micro-benchmarks of the CUDA backend's ops, through the backend itself
 * (exec nodes, graph replay: each op is its own one-node list, warmed up and captured, so a
 * timed rep is one cudaGraphLaunch). Times: cudaEvents on kda's stream, median of REPS warm
 * reps. Prints one table: op, shape, median ms, TFLOP/s or GB/s, and the ceilings measured in
 * the same run (device-to-device copy bandwidth; the GEMM rows against 989 TFLOP/s dense bf16).
 *
 * Build: nvcc ... -Icore -Ikernels benches/cuda_ops_bench.cu + kernels objects + core objects. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
extern "C" {
#include "backend.h"
#include "internal.h"
}
#include "kda_cuda_api.h"

#define REPS 30
#define CK(call)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "bench: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_),     \
              __FILE__, __LINE__);                                                         \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

static const kda_backend *be;
static cudaStream_t stream;
static int next_key = 5000;

__global__ void k_rand(void *p, int dt, int64_t n, uint32_t seed, float scale, int vmax) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 16, h *= 0x7feb352d, h ^= h >> 15, h *= 0x846ca68b, h ^= h >> 16;
    float u = (h >> 8) * (1.0f / 16777216.0f) - 0.5f;
    if (dt == KDA_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16(u * scale);
    else if (dt == KDA_I32) ((int32_t *)p)[i] = (int32_t)(h % (uint32_t)vmax);
    else ((float *)p)[i] = u * scale;
  }
}

static kda_tview buf(int dt, int nd, int64_t a, int64_t b, int64_t c, int64_t d, float scale) {
  kda_tview t = {NULL, dt, nd, {a, b, c, d}};
  int64_t n = kda_tview_numel(&t), es = dt == KDA_BF16 ? 2 : 4;
  t.data = be->alloc(n * es);
  if (!t.data) { fprintf(stderr, "bench: %s\n", kda_last_error()); exit(1); }
  k_rand<<<1024, 256, 0, stream>>>(t.data, dt, n, (uint32_t)next_key * 7919u, scale, 256);
  CK(cudaGetLastError());
  next_key++;
  return t;
}

/* Median ms of one replay of the list. */
static double time_list(kda_exec_node *nodes, int n) {
  int key = next_key++;
  for (int w = 0; w < 3; w++)   /* eager, capture, one replay */
    if (be->run(nodes, n, key)) { fprintf(stderr, "bench: %s\n", kda_last_error()); exit(1); }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < REPS; r++) {
    CK(cudaEventRecord(e0, stream));
    be->run(nodes, n, key);
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

static void row(const char *op, const char *shape, double ms, double flops, double bytes) {
  if (flops > 0) printf("| %-28s | %-26s | %9.3f | %8.1f TFLOP/s |\n", op, shape, ms, flops / ms / 1e9);
  else printf("| %-28s | %-26s | %9.3f | %8.1f GB/s     |\n", op, shape, ms, bytes / ms / 1e6);
  fflush(stdout);
}

static void free_views(kda_tview *v, int n) {
  for (int i = 0; i < n; i++) be->free(v[i].data);
}

static void bench_copy(void) {
  int64_t bytes = (int64_t)1 << 30;
  void *a = be->alloc(bytes), *b = be->alloc(bytes);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < REPS + 3; r++) {
    CK(cudaEventRecord(e0, stream));
    CK(cudaMemcpyAsync(b, a, (size_t)bytes, cudaMemcpyDeviceToDevice, stream));
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (r >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  row("d2d copy (ceiling)", "1 GiB, read+write", ms[ms.size() / 2], 0, 2.0 * bytes);
  be->free(a);
  be->free(b);
}

static void bench_gemm(int64_t M, int64_t N, int64_t K, int wdt) {
  /* x [M,K] bf16 @ W^T, W [N,K] (bf16, or f32 master weights rounded per use) */
  kda_tview v[2] = {buf(KDA_BF16, 2, M, K, 1, 1, 1.f), buf(wdt, 2, N, K, 1, 1, 0.05f)};
  kda_tview o = buf(KDA_BF16, 2, M, N, 1, 1, 1.f);
  kda_exec_node n;
  memset(&n, 0, sizeof n);
  n.op = KDA_OP_MATMUL, n.nin = 2, n.in = v, n.out = o, n.iattr[1] = 1;
  double ms = time_list(&n, 1);
  char s[64], nm[64];
  snprintf(s, sizeof s, "M=%lld N=%lld K=%lld", (long long)M, (long long)N, (long long)K);
  snprintf(nm, sizeof nm, "matmul x@W^T, W %s", wdt == KDA_BF16 ? "bf16" : "f32 (+refresh)");
  row(nm, s, ms, 2.0 * M * N * K, 0);
  free_views(v, 2);
  be->free(o.data);
}

/* A weight's two products in a step, one list: y = x W^T and dx = dy W. With an f32 W the
 * bf16 shadow is refreshed once at the start of the list and read by both GEMMs (before the
 * shadow each GEMM rounded W itself); KDA_NO_SHADOW=1 measures the old way. */
static void bench_gemm_pair(int64_t M, int64_t N, int64_t K, int wdt) {
  kda_tview w = buf(wdt, 2, N, K, 1, 1, 0.05f);
  kda_tview in0[2] = {buf(KDA_BF16, 2, M, K, 1, 1, 1.f), w};
  kda_tview in1[2] = {buf(KDA_BF16, 2, M, N, 1, 1, 1.f), w};
  kda_tview y = buf(KDA_BF16, 2, M, N, 1, 1, 1.f), dx = buf(KDA_BF16, 2, M, K, 1, 1, 1.f);
  kda_exec_node n[2];
  memset(n, 0, sizeof n);
  n[0].op = KDA_OP_MATMUL, n[0].nin = 2, n[0].in = in0, n[0].out = y, n[0].iattr[1] = 1;
  n[1].op = KDA_OP_MATMUL, n[1].nin = 2, n[1].in = in1, n[1].out = dx;
  double ms = time_list(n, 2);
  char s[64], nm[64];
  snprintf(s, sizeof s, "M=%lld N=%lld K=%lld", (long long)M, (long long)N, (long long)K);
  snprintf(nm, sizeof nm, "x@W^T + dy@W, W %s", wdt == KDA_BF16 ? "bf16" : getenv("KDA_NO_SHADOW") ? "f32 cvt x2" : "f32 shadow");
  row(nm, s, ms, 4.0 * M * N * K, 0);
  be->free(w.data), be->free(in0[0].data), be->free(in1[0].data), be->free(y.data), be->free(dx.data);
}

static void bench_attention(int64_t B, int64_t T, int64_t H, int64_t D) {
  kda_tview v[4];
  for (int i = 0; i < 4; i++) v[i] = buf(KDA_BF16, 4, B, T, H, D, 1.f);
  kda_tview o = buf(KDA_BF16, 4, B, T, H, D, 1.f);
  kda_tview g = buf(KDA_BF16, 1, 3 * B * T * H * D, 1, 1, 1, 1.f);
  kda_exec_node n[2];
  memset(n, 0, sizeof n);
  n[0].op = KDA_OP_ATTENTION, n[0].nin = 3, n[0].in = v, n[0].out = o;
  n[1].op = KDA_OP_ATTENTION_BWD, n[1].nin = 4, n[1].in = v, n[1].out = g;
  double fwd_flops = 2.0 * B * H * (double)T * T * D;   /* 4 B H T^2 D, halved by causality */
  char s[64];
  snprintf(s, sizeof s, "B=%lld T=%lld H=%lld Dh=%lld", (long long)B, (long long)T, (long long)H, (long long)D);
  row("attention fwd", s, time_list(n, 1), fwd_flops, 0);
  row("attention fwd+bwd (3.5x fwd)", s, time_list(n, 2), 3.5 * fwd_flops, 0);
  free_views(v, 4);
  be->free(o.data);
  be->free(g.data);
}

static void bench_rows(int64_t N, int64_t D) {
  kda_tview x = buf(KDA_BF16, 2, N, D, 1, 1, 1.f), w = buf(KDA_F32, 1, D, 1, 1, 1, 1.f);
  kda_tview y = buf(KDA_BF16, 2, N, D, 1, 1, 1.f), dx = buf(KDA_BF16, 1, N * D + D, 1, 1, 1, 1.f);
  kda_tview in[3] = {x, w, y};
  kda_exec_node n;
  memset(&n, 0, sizeof n);
  n.op = KDA_OP_RMSNORM, n.nin = 2, n.in = in, n.out = y, n.fattr[0] = 1e-5f;
  char s[64];
  snprintf(s, sizeof s, "[%lld,%lld] bf16", (long long)N, (long long)D);
  row("rmsnorm fwd", s, time_list(&n, 1), 0, 2.0 * N * D * 2);
  n.op = KDA_OP_RMSNORM_BWD, n.nin = 3, n.out = dx;
  row("rmsnorm bwd (dx + dw)", s, time_list(&n, 1), 0, 2.0 * N * D * 3);
  be->free(x.data), be->free(w.data), be->free(y.data), be->free(dx.data);
}

static void bench_xent(int64_t N, int64_t V) {
  kda_tview z = buf(KDA_BF16, 2, N, V, 1, 1, 4.f), t = buf(KDA_I32, 1, N, 1, 1, 1, 1.f);
  kda_tview l = buf(KDA_F32, 1, N, 1, 1, 1, 1.f), dz = buf(KDA_BF16, 2, N, V, 1, 1, 1.f);
  kda_tview in[3] = {z, t, l};
  kda_exec_node n;
  memset(&n, 0, sizeof n);
  n.op = KDA_OP_CROSS_ENTROPY, n.nin = 2, n.in = in, n.out = l;
  char s[64];
  snprintf(s, sizeof s, "[%lld,%lld] bf16", (long long)N, (long long)V);
  row("cross_entropy fwd", s, time_list(&n, 1), 0, 2.0 * N * V + 8.0 * N);
  n.op = KDA_OP_CROSS_ENTROPY_BWD, n.nin = 3, n.out = dz;
  row("cross_entropy bwd", s, time_list(&n, 1), 0, 4.0 * N * V + 8.0 * N);
  be->free(z.data), be->free(t.data), be->free(l.data), be->free(dz.data);
}

/* the KDA layer's conv branch at the hybrid's shape: x bf16, dy the f32 slice of KDA_BWD's packed
 * gradient, the packed [dx, dw] gradient f32 */
static void bench_conv(int64_t B, int64_t T, int64_t C) {
  kda_tview x = buf(KDA_BF16, 3, B, T, C, 1, 1.f), w = buf(KDA_F32, 2, C, 4, 1, 1, 1.f);
  kda_tview y = buf(KDA_BF16, 3, B, T, C, 1, 1.f), dy = buf(KDA_F32, 3, B, T, C, 1, 1.f);
  kda_tview g = buf(KDA_F32, 1, B * T * C + C * 4, 1, 1, 1, 1.f);
  kda_tview in[3] = {x, w, dy};
  kda_exec_node n;
  memset(&n, 0, sizeof n);
  n.op = KDA_OP_CONV1D, n.nin = 2, n.in = in, n.out = y, n.iattr[0] = 1;
  char s[64];
  snprintf(s, sizeof s, "[%lld,%lld,%lld] W=4 silu", (long long)B, (long long)T, (long long)C);
  row("conv1d fwd (bf16)", s, time_list(&n, 1), 0, 4.0 * B * T * C);
  n.op = KDA_OP_CONV1D_BWD, n.nin = 3, n.out = g;
  row("conv1d bwd (f32 dy, dx, dw)", s, time_list(&n, 1), 0, 10.0 * B * T * C);
  free_views(in, 3), be->free(y.data), be->free(g.data);
}

/* byte-level token ids: a fifth of them one id (' '), the rest uniform over 256 */
__global__ void k_skew_ids(int32_t *p, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u;
    h ^= h >> 16, h *= 0x7feb352d, h ^= h >> 15;
    p[i] = h % 5 == 0 ? 32 : (int32_t)((h >> 8) % 256u);
  }
}

static void bench_embed_bwd(int64_t N, int64_t D) {
  kda_tview dy = buf(KDA_BF16, 2, N, D, 1, 1, 1.f), ids = buf(KDA_I32, 1, N, 1, 1, 1, 1.f);
  kda_tview o = buf(KDA_F32, 2, 256, D, 1, 1, 1.f);
  k_skew_ids<<<256, 256, 0, stream>>>((int32_t *)ids.data, N);
  CK(cudaGetLastError());
  kda_tview in[2] = {dy, ids};
  kda_exec_node n;
  memset(&n, 0, sizeof n);
  n.op = KDA_OP_EMBED_BWD, n.nin = 2, n.in = in, n.out = o, n.iattr[0] = 256;
  char s[64];
  snprintf(s, sizeof s, "[%lld,%lld] bf16 V=256, 20%% one id", (long long)N, (long long)D);
  row("embed bwd", s, time_list(&n, 1), 0, 2.0 * N * D + 4.0 * N);
  free_views(in, 2), be->free(o.data);
}

static void bench_adamw(int64_t P) {
  kda_tview v[6] = {buf(KDA_F32, 1, P, 1, 1, 1, 0.02f), buf(KDA_F32, 1, P, 1, 1, 1, 1e-3f),
                    buf(KDA_F32, 1, P, 1, 1, 1, 1e-3f), buf(KDA_F32, 1, P, 1, 1, 1, 1e-6f),
                    buf(KDA_F32, 1, 1, 1, 1, 1, 0.f), buf(KDA_F32, 1, 4, 1, 1, 1, 0.f)};
  float gn = 0.5f, st[4] = {10, 1e-3f, 0, 0};
  be->write(v[4].data, &gn, 4);
  be->write(v[5].data, st, 16);
  kda_exec_node n;
  memset(&n, 0, sizeof n);
  n.op = KDA_OP_ADAMW, n.nin = 6, n.in = v, n.out = v[0];
  n.fattr[0] = 0.9f, n.fattr[1] = 0.95f, n.fattr[2] = 1e-8f, n.fattr[3] = 0.1f, n.fattr[4] = 1.f;
  char s[64];
  snprintf(s, sizeof s, "%lld f32 params", (long long)P);
  row("adamw (one tensor)", s, time_list(&n, 1), 0, 28.0 * P);
  free_views(v, 6);
}

/* The optimizer tail of a step: NT parameters of P elements each. fused: one gnorm for all
 * (ceil(NT/48) launches); unfused: a distinct gnorm buffer per node (same value), so no two
 * nodes may share a launch: NT launches, the old behaviour. */
static void bench_adamw_many(int NT, int64_t P, int fused) {
  std::vector<kda_tview> v((size_t)NT * 6);
  std::vector<kda_exec_node> n((size_t)NT);
  kda_tview gn = buf(KDA_F32, 1, 1, 1, 1, 1, 0.f), st = buf(KDA_F32, 1, 4, 1, 1, 1, 0.f);
  float g = 0.5f, stv[4] = {10, 1e-3f, 0, 0};
  be->write(gn.data, &g, 4);
  be->write(st.data, stv, 16);
  for (int t = 0; t < NT; t++) {
    kda_tview *x = &v[(size_t)t * 6];
    x[0] = buf(KDA_F32, 1, P, 1, 1, 1, 0.02f), x[1] = buf(KDA_F32, 1, P, 1, 1, 1, 1e-3f);
    x[2] = buf(KDA_F32, 1, P, 1, 1, 1, 1e-3f), x[3] = buf(KDA_F32, 1, P, 1, 1, 1, 1e-6f);
    x[4] = gn, x[5] = st;
    if (!fused) { x[4] = buf(KDA_F32, 1, 1, 1, 1, 1, 0.f); be->write(x[4].data, &g, 4); }
    memset(&n[t], 0, sizeof n[t]);
    n[t].op = KDA_OP_ADAMW, n[t].nin = 6, n[t].in = x, n[t].out = x[0];
    n[t].fattr[0] = 0.9f, n[t].fattr[1] = 0.95f, n[t].fattr[2] = 1e-8f, n[t].fattr[3] = 0.1f, n[t].fattr[4] = 1.f;
  }
  char s[64];
  snprintf(s, sizeof s, "%d x %lld f32", NT, (long long)P);
  row(fused ? "adamw multi-tensor (fused)" : "adamw per tensor (unfused)", s, time_list(n.data(), NT), 0, 28.0 * NT * P);
  for (int t = 0; t < NT; t++) {
    for (int j = 0; j < 4; j++) be->free(v[(size_t)t * 6 + j].data);
    if (!fused) be->free(v[(size_t)t * 6 + 4].data);
  }
  be->free(gn.data), be->free(st.data);
}

int main(void) {
  be = kda_cuda_backend();
  if (!be) {
    printf("# skip: no CUDA device\n");
    return 0;
  }
  stream = (cudaStream_t)kda_cuda_stream();
  printf("# kda cuda_ops_bench on %s (dense bf16 peak used for MFU elsewhere: %.0f TFLOP/s)\n",
         kda_cuda_device_name(), kda_cuda_bf16_peak_flops() / 1e12);
  printf("# median of %d warm reps, each one graph replay; env KDA_ATTN_SIMPLE=%s KDA_NO_SHADOW=%s\n", REPS,
         getenv("KDA_ATTN_SIMPLE") ? getenv("KDA_ATTN_SIMPLE") : "unset",
         getenv("KDA_NO_SHADOW") ? getenv("KDA_NO_SHADOW") : "unset");
  printf("| %-28s | %-26s | %9s | %-16s |\n", "op", "shape", "ms", "rate");
  printf("|------------------------------|----------------------------|-----------|------------------|\n");
  bench_copy();
  bench_gemm(8192, 8192, 8192, KDA_BF16);
  bench_gemm(4096, 3072, 768, KDA_BF16);
  bench_gemm(4096, 768, 3072, KDA_BF16);
  bench_gemm(4096, 3072, 768, KDA_F32);
  bench_gemm(32768, 8192, 2048, KDA_BF16);
  bench_gemm(32768, 2048, 8192, KDA_BF16);
  bench_gemm(32768, 8192, 2048, KDA_F32);
  bench_gemm_pair(4096, 3072, 768, KDA_BF16);
  bench_gemm_pair(4096, 3072, 768, KDA_F32);
  bench_gemm_pair(4096, 256, 256, KDA_BF16);   /* GPT S 8x512 shapes: launch-bound */
  bench_gemm_pair(4096, 256, 256, KDA_F32);
  bench_attention(8, 2048, 16, 128);   /* the KDA bench's four shapes (issue 4's side by side; */
  bench_attention(1, 8192, 16, 128);   /* benches/peers/kda_attn_peer.py times SDPA at the same) */
  bench_attention(32, 512, 4, 64);
  bench_attention(8, 512, 4, 64);
  bench_attention(64, 1024, 12, 64);
  bench_rows(65536, 768);
  bench_rows(65536, 2048);
  bench_xent(65536, 256);
  bench_conv(64, 512, 256);   /* the hybrid S 64x512's q, k, v conv */
  bench_embed_bwd(32768, 256);
  bench_embed_bwd(32768, 2048);
  bench_adamw(124000000);
  bench_adamw_many(75, 87381, 1);   /* ~GPT S: 6.5M params in ~75 tensors */
  bench_adamw_many(75, 87381, 0);
  printf("# peak device memory held by kda: %.2f GiB\n", kda_cuda_peak_mem_bytes() / 1073741824.0);
  return 0;
}
