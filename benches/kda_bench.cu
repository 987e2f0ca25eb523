/* kda_bench.cu — time the CUDA KDA forward and forward+backward (kernels/kda_cuda.cu).
 * Shapes (B,T,H,D) with H = HV, K = V = D, bf16, pre-gated g = logsigmoid(randn), beta =
 * sigmoid(randn), q/k l2norm in kernel, chunk 64. For each shape: first-call time, then the
 * median of warm reps (cudaEvents, and host wall-clock for the first call's ratio first_x), and
 * inside a CUDA graph for the small shapes
 * (the fresh buffers written once before the first call, as the backend does; KDA_BENCH_TOUCH=0 not).
 * FLOP counts: KDA.md §8 "executed" formulas; bytes: the fused-ideal I/O (read q,k,v,g,beta,
 * write o; backward also reads dout and writes the five input gradients), so GB/s says how far
 * from the bandwidth floor the kernels are.
 * KDA_BENCH_GATE=1: the trainer's layer instead (lua/kda/nn.lua's Node:kda): raw g = randn
 * through the softplus gate with its init (A_log [H] = log(1 .. 16), dt_bias [H*D] = softplus^-1
 * of dt in [1e-3, 1e-1], log-spaced), raw beta = randn through sigmoid in the kernel, and the
 * backward also forms dA_log and ddt_bias (k_gate_reduce). KDA_BENCH_GATE=2: the same with
 * dt_bias in [-0.1, 0.1] (what 2026-12-07s68a timed as "=1"): decays of ~0.7 e^A_log a token,
 * every chunk steep (the per-block path). The fla-style pre-gated default leaves the gate's
 * chains idle.                                                                               */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>
#include <thread>
#include "kda.h"
#include "kda_cuda.h"
extern "C" void kda_phase_report(const char *title);   /* kernels/kda_tc.cu */

#define CK(call)                                                                             \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)
#define KOK(call)                                                          \
  do {                                                                     \
    if (call) { fprintf(stderr, "%s: %s\n", #call, kda_last_error()); exit(2); } \
  } while (0)

/* The inputs: a 64-bit LCG's draws, two a value (Box-Muller), in element order across every
 * dev_rand call. Filled by one thread a core, each jumping the LCG to its first element's state,
 * so that the values are those of the serial loop this replaced, bit for bit (checked on the CPU
 * against it, built by nvcc), and a call's setup no longer takes ~10 s at the large shapes.
 * std::thread, joined, not OpenMP: no idle pool spinning beside the first call's host timing */
static const uint64_t LCG_A = 6364136223846793005ull, LCG_C = 1442695040888963407ull;
static uint64_t rs = 7;
static uint64_t lcg_skip(uint64_t s, uint64_t n) {   /* the state n steps on: (A, C) squared per bit of n */
  uint64_t a = LCG_A, c = LCG_C, am = 1, cm = 0;
  for (; n; n >>= 1, c = (a + 1) * c, a *= a)
    if (n & 1) am *= a, cm = cm * a + c;
  return am * s + cm;
}
static void *dev_rand(size_t n, int kind) {   /* 0 randn, 1 logsigmoid(randn), 2 sigmoid(randn) */
  std::vector<__nv_bfloat16> h(n);
  const uint64_t s0 = rs;
  auto fill = [&](size_t i0, size_t i1) {
    uint64_t s = lcg_skip(s0, 2 * i0);
    for (size_t i = i0; i < i1; i++) {
      s = s * LCG_A + LCG_C;
      const double u1 = ((s >> 11) + 0.5) / 9007199254740992.0;
      s = s * LCG_A + LCG_C;
      const double u2 = ((s >> 11) + 0.5) / 9007199254740992.0;
      const float x = (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
      h[i] = __float2bfloat16(kind == 0 ? x : kind == 1 ? -log1pf(expf(-x)) : 1 / (1 + expf(-x)));
    }
  };
  const size_t nt = n < (1u << 20) ? 1 : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> th;
  for (size_t t = 1; t < nt; t++) th.emplace_back(fill, n * t / nt, n * (t + 1) / nt);
  fill(0, n / nt);
  for (auto &x : th) x.join();
  rs = lcg_skip(s0, 2 * n);
  void *d;
  CK(cudaMalloc(&d, n * 2));
  CK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
  return d;
}

struct bufs {
  void *q, *k, *v, *g, *b, *o, *dO, *dq, *dk, *dv, *dg, *db, *ws;
  float *A_log, *dt_bias, *dA_log, *ddt_bias;       /* KDA_BENCH_GATE=1 only, else NULL */
  int64_t wsb;
};

/* fwd+bwd as a trainer runs it: the forward keeps its internals for the backward (a->keep,
 * kda_cuda.h); KDA_BENCH_KEEP=0 makes the backward recompute them (the forward alone never keeps) */
static int run(const kda_kda_args *a0, bufs &x, int bwd, cudaStream_t st) {
  kda_kda_args ak = *a0;
  const char *e = getenv("KDA_BENCH_KEEP");
  ak.keep = bwd && !(e && strcmp(e, "0") == 0);
  const kda_kda_args *a = &ak;
  if (kda_kda_cuda_forward(a, x.q, x.k, x.v, x.g, x.b, x.A_log, x.dt_bias, nullptr, x.o, nullptr, x.ws, x.wsb, st))
    return -1;
  if (bwd && kda_kda_cuda_backward(a, x.q, x.k, x.v, x.g, x.b, x.A_log, x.dt_bias, nullptr, x.dO, nullptr, x.dq, x.dk,
                                   x.dv, x.dg, x.db, x.dA_log, x.ddt_bias, nullptr, x.ws, x.wsb, st)) return -1;
  return 0;
}

static double median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

/* Warm timings of reps calls (after 3 unmeasured): med the median by cudaEvents (GPU time of one
 * call), wall the median host wall-clock of one call to its stream's end (kda_now, the clock the
 * first call is timed with, so first_x = first / wall compares like with like), host the median
 * time the host spends launching it. graph = 1 replays a captured graph of one call. */
struct timing { double med, wall, host; };
static timing time_it(const kda_kda_args *a, bufs &x, int bwd, int graph, int reps, cudaStream_t st) {
  cudaGraphExec_t ge = nullptr;
  if (graph) {
    cudaGraph_t gr;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    KOK(run(a, x, bwd, st));
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    CK(cudaGraphDestroy(gr));
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  std::vector<float> ms, wall, host;
  for (int r = 0; r < reps + 3; r++) {
    double t0 = kda_now();
    CK(cudaEventRecord(e0, st));
    if (graph) CK(cudaGraphLaunch(ge, st));
    else KOK(run(a, x, bwd, st));
    CK(cudaEventRecord(e1, st));
    double t1 = kda_now();
    CK(cudaEventSynchronize(e1));
    double t2 = kda_now();
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (r >= 3) ms.push_back(t), wall.push_back((float)((t2 - t0) * 1e3)), host.push_back((float)((t1 - t0) * 1e3));
  }
  if (ge) CK(cudaGraphExecDestroy(ge));
  CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
  return {median(ms), median(wall), median(host)};
}

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || !ndev) { printf("# no CUDA device: bench skipped\n"); return 0; }
  cudaDeviceProp pr;
  CK(cudaGetDeviceProperties(&pr, 0));
  const char *simple = getenv("KDA_KDA_SIMPLE"), *gate = getenv("KDA_BENCH_GATE");
  const int model_gate = gate && *gate ? atoi(gate) : 0;   /* 1 the trainer's init, 2 steep */
  if (model_gate < 0 || model_gate > 2) {
    fprintf(stderr, "KDA_BENCH_GATE=%s: use 0 (pre-gated), 1 (the trainer's gate init) or 2 (steep)\n", gate);
    return 2;
  }
  printf("# kda_bench on %s; bf16, %s, l2norm in kernel, chunk 64; path: %s\n", pr.name,
         model_gate == 1   ? "the trainer's gate (KDA_BENCH_GATE=1: softplus with A_log, dt_bias at init; sigmoid beta)"
         : model_gate == 2 ? "a steep softplus gate (KDA_BENCH_GATE=2: dt_bias ~ 0; sigmoid beta)"
                           : "pre-gated g = logsigmoid(randn)",
         simple && *simple && simple[0] != '0' ? "version 1 (KDA_KDA_SIMPLE=1)" : "version 2 (tensor cores)");
  printf("# FLOPs: KDA.md §8 executed counts; bytes: fused-ideal I/O\n");
  printf("# first_ms: the shape's first call, host wall-clock to its end; wall_ms: a warm call's, the\n"
         "# same clock (median); first_x = first_ms / wall_ms; med_ms, graph_ms: warm GPU time (cudaEvents)\n");
  printf("%-22s %-7s %9s %9s %9s %9s %9s %9s %9s %7s\n", "shape (B,T,H,D)", "mode", "first_ms", "med_ms",
         "graph_ms", "TFLOP/s", "GB/s", "Mtok/s", "wall_ms", "first_x");
  int64_t shapes[8][4] = {{8, 2048, 16, 128}, {1, 8192, 16, 128}, {32, 512, 4, 64}, {8, 512, 4, 64}};
  int ns = 4;
  /* KDA_BENCH_DIMS="BxTxHxD/BxTxHxD...": these shapes (up to 8) instead of the four above (for
   * measuring a kernel-selection rule at other grids; no commas: device_run.sh's entries split
   * their variables at them) */
  if (const char *dims = getenv("KDA_BENCH_DIMS")) {
    ns = 0;
    for (const char *c = dims; *c;) {
      long long b, t, h, d;
      int used = 0;
      if (ns == 8) {
        fprintf(stderr, "KDA_BENCH_DIMS: more than 8 shapes (from '%s' on): time them in two runs\n", c);
        return 2;
      }
      if (sscanf(c, "%lldx%lldx%lldx%lld%n", &b, &t, &h, &d, &used) != 4 || b < 1 || t < 1 || h < 1 || d < 1) {
        fprintf(stderr, "KDA_BENCH_DIMS: '%s' is not BxTxHxD[/BxTxHxD...]: fix the list\n", c);
        return 2;
      }
      shapes[ns][0] = b, shapes[ns][1] = t, shapes[ns][2] = h, shapes[ns][3] = d, ns++;
      c += used;
      if (*c == '/') c++;
    }
  }
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  const char *only = getenv("KDA_BENCH_SHAPE");   /* "0".."3": fwd+bwd at one shape (for ncu) */
  for (int si = 0; si < ns; si++) {
    if (only && *only && atoi(only) != si) continue;
    const int64_t *s = shapes[si];
    int64_t B = s[0], T = s[1], H = s[2], D = s[3], C = 64;
    kda_kda_args a = {};
    a.B = B, a.T = T, a.H = H, a.HV = H, a.K = D, a.V = D, a.chunk = (int)C, a.qk_l2norm = 1;
    int64_t n = B * T * H * D, nb = B * T * H;
    bufs x = {};
    x.q = dev_rand(n, 0), x.k = dev_rand(n, 0), x.v = dev_rand(n, 0), x.g = dev_rand(n, model_gate ? 0 : 1);
    x.b = dev_rand(nb, model_gate ? 0 : 2), x.dO = dev_rand(n, 0);
    if (model_gate) {                              /* A_log = log(1 + 15 h / H); dt_bias as above */
      a.gate_mode = KDA_GATE_SOFTPLUS, a.beta_mode = KDA_BETA_SIGMOID;
      std::vector<float> al(H), dtb(H * D);
      for (int64_t i = 0; i < H; i++) al[i] = logf(1.f + 15.f * (float)i / (float)H);
      for (int64_t i = 0; i < H * D; i++) {
        const float u = 0.5f + 0.5f * sinf(0.37f * (float)i);   /* in [0, 1], spread over the columns */
        if (model_gate == 2) { dtb[i] = 0.1f * sinf(0.37f * (float)i); continue; }   /* steep: dt_bias ~ 0 */
        const float dt = expf(logf(1e-3f) + u * (logf(1e-1f) - logf(1e-3f)));   /* log-spaced */
        dtb[i] = dt + logf(-expm1f(-dt));          /* softplus^-1(dt) */
      }
      CK(cudaMalloc(&x.A_log, H * 4)); CK(cudaMalloc(&x.dt_bias, H * D * 4));
      CK(cudaMalloc(&x.dA_log, H * 4)); CK(cudaMalloc(&x.ddt_bias, H * D * 4));
      CK(cudaMemcpy(x.A_log, al.data(), H * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(x.dt_bias, dtb.data(), H * D * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&x.o, n * 2)); CK(cudaMalloc(&x.dq, n * 2)); CK(cudaMalloc(&x.dk, n * 2));
    CK(cudaMalloc(&x.dv, n * 2)); CK(cudaMalloc(&x.dg, n * 2)); CK(cudaMalloc(&x.db, nb * 2));
    x.wsb = kda_kda_cuda_workspace_bytes(&a, 1);
    CK(cudaMalloc(&x.ws, x.wsb));
    /* The fresh output and workspace buffers are written once before the first call, as the
     * backend's allocations are (dev_alloc in kernels/backend_cuda.cu zeroes each one), so the
     * first call's time holds what a trainer's first step pays and no first touch of new
     * memory. KDA_BENCH_TOUCH=0 leaves them untouched. H200, first fwd at (8,512,4,64) against
     * 0.061 ms warm: 0.092-0.101 ms written, 0.120-0.129 untouched (benches/results/2026-12-03b) */
    const char *touch = getenv("KDA_BENCH_TOUCH");
    if (!(touch && *touch == '0')) {
      void *fresh[] = {x.o, x.dq, x.dk, x.dv, x.dg};
      for (void *p : fresh) CK(cudaMemset(p, 0, n * 2));
      CK(cudaMemset(x.db, 0, nb * 2));
      CK(cudaMemset(x.ws, 0, x.wsb));
    }
    double K = D, V = D, Cd = C, tokh = (double)B * T * H;
    double ffwd = 40.0 * 256 * K / Cd + 2 * Cd * K + 2 * Cd * V + 4 * K * V + 2 * K * V + 2 * Cd * V +
                  450 + 16 * 2 * 4096 / Cd;
    double fbwd = 2 * Cd * (K + V) + 4 * K * V + 4 * Cd * V + 6 * K * V +
                  (6 * K * V + 4 * Cd * V + 4 * Cd * K + 4 * Cd * Cd + 2 * K * V / Cd) + 80.0 * 256 * K / Cd;
    double byf = (3 * K + V + 1 + V) * 2, byb = byf + (V + 3 * K + V + 1) * 2;
    int small = T * B <= 16384;
    for (int bwd = only && *only ? 1 : 0; bwd < 2; bwd++) {   /* one shape: fwd+bwd only */
      CK(cudaDeviceSynchronize());
      cudaEvent_t f0, f1;
      CK(cudaEventCreate(&f0)); CK(cudaEventCreate(&f1));
      double t0 = kda_now();
      CK(cudaEventRecord(f0, st));
      KOK(run(&a, x, bwd, st));
      CK(cudaEventRecord(f1, st));
      double launched = (kda_now() - t0) * 1e3;
      CK(cudaStreamSynchronize(st));
      double first = (kda_now() - t0) * 1e3;
      float first_ev;
      CK(cudaEventElapsedTime(&first_ev, f0, f1));
      CK(cudaEventDestroy(f0)); CK(cudaEventDestroy(f1));
      int reps = tokh * D > 1e8 ? 10 : 30;
      timing w = time_it(&a, x, bwd, 0, reps, st);
      double med = w.med, gms = small ? time_it(&a, x, bwd, 1, reps, st).med : NAN;
      double best = small && gms < med ? gms : med;
      double fl = tokh * (ffwd + (bwd ? fbwd : 0)), by = tokh * (bwd ? byb : byf);
      char nm[64];
      snprintf(nm, sizeof nm, "(%lld,%lld,%lld,%lld)", (long long)B, (long long)T, (long long)H, (long long)D);
      printf("%-22s %-7s %9.3f %9.3f %9.3f %9.2f %9.1f %9.2f %9.3f %7.2f\n", nm, bwd ? "fwd+bwd" : "fwd", first,
             med, gms, fl / best * 1e-9, by / best * 1e-6, B * T / best * 1e-3, w.wall, first / w.wall);
      printf("# first call %s %s: launched in %.3f ms (host; warm calls %.3f), %.3f ms by cudaEvents\n", nm,
             bwd ? "fwd+bwd" : "fwd", launched, w.host, first_ev);
      fflush(stdout);
    }
    {
      char nm[64];
      snprintf(nm, sizeof nm, "(%lld,%lld,%lld,%lld), every call above", (long long)B, (long long)T, (long long)H,
               (long long)D);
      kda_phase_report(nm);                        /* kda_bench_phases only (-DKDA_PHASES) */
    }
    void *fr[] = {x.q, x.k, x.v, x.g, x.b, x.o, x.dO, x.dq, x.dk, x.dv, x.dg, x.db, x.ws,
                  x.A_log, x.dt_bias, x.dA_log, x.ddt_bias};   /* (cudaFree(NULL) is a no-op) */
    for (void *p : fr) CK(cudaFree(p));
  }
  return 0;
}
