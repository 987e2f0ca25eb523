/* test_kda_cuda.cu — the CUDA KDA kernels (kernels/kda_cuda.cu) against the CPU reference
 * (core/kda_ref.c) over the KDA.md §7.4 cases, with fla's RMS-ratio metric and §7.2 thresholds:
 * o, ht 0.005; dq, dk, dv, dh0 0.008; dg, dbeta 0.02; ddt_bias 0.008; dA_log 0.003 (as in fla,
 * a warning only above it; it fails above 0.05 — except in the seeded "lower-bound gate ... H=1
 * draw" cases, which run the precise backward and fail above 0.003, see all_cases). On the fast
 * backward the gate-parameter gradients are fla's precision: see gate_items. Inputs are rounded
 * to bf16 first, so the CPU
 * reference (fp32, itself checked against fp64 in tests/test_kda_ref.c) sees the same values.
 * Part 2 runs the CUDA backend's op glue (kernels/kda_ops.cu: kc_kda_node) on exec nodes for
 * KDA, KDA_BWD, CONV1D, CONV1D_BWD against the CPU backend's kda_cpu_kda_node, with f32 and
 * bf16 storage (and an f32 packed gradient output, as the plan makes it), plus run-to-run
 * bit-identity of the backward (no float atomics); on the tensor-core path every case's kept
 * forward and backward also run with the flow kernels forced (KDA_KDA_FLOW=1) and off, and (the
 * compiled K = V = 64 / 128 shapes) with the wide state passes forced (KDA_KDA_WIDE=1) and off,
 * with the flow off and the second-tile-set state passes at 16 and 32 V columns a block
 * (KDA_KDA_STATE_BV), and (K % 4 == 0, K <= 128) with the fused front off (KDA_KDA_ROWS_IN=0) and on,
 * and the chunk kernels on their chunk-major grid (KDA_KDA_HM=0) and head-major (the default;
 * at K = V = 128 on sm_90 also with the wgmma kernels and the fused sweep),
 * and (the compiled shapes, compute capability 9.0) the flow kernel's persistent intra blocks
 * (KDA_KDA_FLOW=1 KDA_KDA_PERSIST=1, ns + 3 blocks) against the block-a-task intra kernel,
 * and (the compiled K = V = 64 shapes) the final and mat kernels forming the rows kernel's
 * products themselves (KDA_KDA_FR=1, 2; with one and two tile sets) against the rows kernel (=0),
 * bit for bit the same (on an sm_90 card, those forms having run: kda_kda_cuda_last_fr), and the
 * FR final kernel's programmatic launch after the mat kernel against the ordinary one
 * (KDA_KDA_PDL=0; sm_90), and in a captured CUDA graph; the
 * compiled K = V = 64 forms' wide layouts (KDA_KDA_COMPACT=0) and the wgmma forward pass,
 * reverse sweep, rows, mat and final kernels (K = V = 128, KDA_KDA_WG=1, KDA_KDA_WGB=1,
 * KDA_KDA_ROWSWG=1, KDA_KDA_MATWG=1, KDA_KDA_FINALWG=1; each alone, then all five) against the
 * CPU reference (the final kernel's flat chunks: the decay cases, "decay flat and steep chunks"
 * both kinds in one launch); the reverse sweep with the rows kernel's products (KDA_KDA_SR=1)
 * against the two kernels it replaces, bit for bit but the gate's gradients, and against the
 * CPU reference (having run: kda_kda_cuda_last_sr). Every KDA case runs four times: the tensor-core path (default:
 * its precise backward where the case sets precise_gate, the strict draws and the cases named
 * so), the version-1
 * kernels (KDA_KDA_SIMPLE=1), the tensor-core path with its precise backward on every case
 * (KDA_KDA_PRECISE=1; its state pass at 256 threads where the run-time forms run, as large
 * batches of small heads do; the K = V = 64 / 128 instantiations keep the size they are built for),
 * and the tensor-core path in its other layouts: the backward's rows
 * kernel with Vn staged after dW (KDA_KDA_ROWS_VN=0; its precise variant with one S0/dS tile,
 * KDA_KDA_ROWS_SEP=0) at 512 threads (KDA_KDA_THREADS), the chunk
 * kernels without their compact layouts for small heads (KDA_KDA_COMPACT=0), the state passes
 * with one set of chunk tiles (KDA_KDA_STATE_DB=0), every version-2 kernel's run-time shapes
 * instead of its K = V = 64 / 128 instantiations (KDA_KDA_KV=0); the quick run does the first
 * only, the variables pass through to it.
 * Prints ok / FAIL lines and "N passed, N failed"; with no GPU: a note and "0 passed, 0 failed".
 * Build: see benches/kda_gpu.sh.                                                              */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>
#include "kernels.h"
#include "kda.h"
#include "kda_cuda.h"
#include "kda_ref.h"

/* cpu_kda.c names ops in its error path; the real kda_op_name lives in core/ops.c, which this
 * test does not link (it pulls in the whole graph core). */
extern "C" __attribute__((weak)) const char *kda_op_name(int op) { return op == KDA_OP_KDA ? "kda" : "kda op"; }

static int quick;            /* main: argv[1] == "quick" */
static const char *only;     /* main: argv[2], run only the cases whose name holds it */
static int npass, nfail;
static uint64_t rng_s = 42;
static double urand() {
  uint64_t z = (rng_s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
}
static double randn() { return sqrt(-2 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand()); }
static float bf(float x) { return __bfloat162float(__float2bfloat16(x)); }
/* an environment variable set for a scope (value null: left as it is) and then put back as it
 * was, or unset if it was not set: the KDA_KDA_* switches a check forces around kept_run */
struct env_scope {
  const char *name;
  bool set, had;
  std::string old;
  env_scope(const char *n, const char *v) : name(n), set(v != nullptr), had(false) {
    if (!set) return;
    const char *e = getenv(n);
    if ((had = e != nullptr)) old = e;
    setenv(n, v, 1);
  }
  ~env_scope() {
    if (!set) return;
    if (had) setenv(name, old.c_str(), 1);
    else unsetenv(name);
  }
};

typedef std::vector<float> vf;

#define CK(call)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));  \
      exit(2);                                                                                \
    }                                                                                         \
  } while (0)

static void *dev_bf16(const vf &x) {
  std::vector<__nv_bfloat16> h(x.size());
  for (size_t i = 0; i < x.size(); i++) h[i] = __float2bfloat16(x[i]);
  void *d;
  CK(cudaMalloc(&d, h.size() * 2 + 2));
  CK(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return d;
}
static float *dev_f32(const vf &x) {
  float *d;
  CK(cudaMalloc(&d, x.size() * 4 + 4));
  CK(cudaMemcpy(d, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  return d;
}
static vf host_bf16(const void *d, size_t n) {
  std::vector<__nv_bfloat16> h(n);
  CK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
  vf x(n);
  for (size_t i = 0; i < n; i++) x[i] = __bfloat162float(h[i]);
  return x;
}
static vf host_f32(const float *d, size_t n) {
  vf x(n);
  CK(cudaMemcpy(x.data(), d, n * 4, cudaMemcpyDeviceToHost));
  return x;
}

/* fla's assert_close: ok if max|ref-x| <= 1e-6, else RMS(ref-x)/RMS(ref) < tol */
static double ratio(const vf &ref, const vf &x, int *absok, int *finite) {
  double se = 0, sr = 0, mx = 0;
  *finite = 1;
  for (size_t i = 0; i < ref.size(); i++) {
    if (!std::isfinite(x[i])) *finite = 0;
    double d = fabs((double)ref[i] - x[i]);
    se += d * d, sr += (double)ref[i] * ref[i];
    if (d > mx) mx = d;
  }
  *absok = mx <= 1e-6;
  return sqrt(se) / (sqrt(sr) + 1e-30);
}

/* warn: 0 = fail above tol; else above tol a warning, failing only above warn */
struct item { const char *what; const vf *ref, *x; double tol, warn; };
static void verdict(const char *name, const std::vector<item> &it) {
  char buf[1024] = "(";
  int ok = 1;
  for (size_t i = 0; i < it.size(); i++) {
    int absok, fin;
    double r = ratio(*it[i].ref, *it[i].x, &absok, &fin);
    int good = fin && (absok || r < it[i].tol);
    if (!good && it[i].warn > 0 && fin && r < it[i].warn) good = 2;
    ok &= good != 0;
    size_t l = strlen(buf);
    snprintf(buf + l, sizeof buf - l, "%s%s %.1e%s", i ? ", " : "", it[i].what, r,
             !fin ? " NON-FINITE" : good == 2 ? " (warn)" : good ? "" : " > tol");
  }
  strcat(buf, ")");
  if (ok) printf("ok - %s %s\n", name, buf), npass++;
  else printf("FAIL - %s: %s\n", name, buf), nfail++;
  fflush(stdout);
}

/* the current device's compute capability (major): the forms some comparisons need run on 9.0 */
static int cc_major(void) {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major;
}
/* Does this backward run the precise twins (kernels/kda_cuda.cu use_precise)? Version 1 is fp32
 * throughout. */
static bool precise_bwd(int gate_mode, int precise_gate) {
  const char *pe = getenv("KDA_KDA_PRECISE"), *se = getenv("KDA_KDA_SIMPLE");
  if (se && *se && strcmp(se, "0")) return true;
  return pe && *pe ? strcmp(pe, "0") != 0 : gate_mode != 0 && precise_gate;
}

/* The gate-parameter gradients (sums of dg whose terms cancel: their error is dg's times the
 * cancellation). The precise backward: ddt_bias held to 0.008, dA_log a warning past 0.003 as in
 * fla (failing past 0.05, or past 0.003 when strict). The fast backward (fla's precision,
 * docs/kda.md "Gate gradients"): both warn past their tolerances and fail where rounding no
 * longer explains them (a missing or wrong term gives ~1): ddt_bias past 0.05, dA_log past 0.25.
 * Measured on the fast backward (H200, 2026-12-04): ddt_bias 2e-3 .. 6.1e-3 on the compiled
 * K = 64 / 128 forms, 1.0e-2 on the K = 128 node case in the fourth path's run-time forms; dA_log
 * up to 1.1e-1 (the strict draws, seed 12) and 5.5e-2 (that node case). */
static void gate_items(std::vector<item> &it, const vf *dA, const vf *dA2, const vf *ddt, const vf *ddt2,
                       bool precise, bool strict) {
  it.push_back({"dA_log", dA, dA2, 0.003, strict ? 0.0 : precise ? 0.05 : 0.25});
  it.push_back({"ddt_bias", ddt, ddt2, 0.008, precise ? 0.0 : 0.05});
}

struct spec {
  int64_t B, T, H, HV, K, V;
  int chunk, gate_mode, beta_mode, l2, h0, dht;
  float scale, lb, gscale, mask_p, beta_const;
  std::vector<int32_t> cu;
  int bare;         /* a parameterised gate without A_log and dt_bias (both NULL) */
};

struct prob {
  kda_kda_args a;
  std::vector<int32_t> cu;
  int64_t N, nq, nv, ng, nb, ns;
  vf q, k, v, g, beta, A_log, dt_bias, h0, dout, dht;
};

static void make(prob &p, const spec &s) {
  memset(&p.a, 0, sizeof p.a);
  kda_kda_args &a = p.a;
  a.B = s.B, a.T = s.T, a.H = s.H, a.HV = s.HV, a.K = s.K, a.V = s.V;
  a.scale = s.scale, a.gate_mode = s.gate_mode, a.lower_bound = s.lb, a.qk_l2norm = s.l2;
  a.beta_mode = s.beta_mode, a.chunk = s.chunk;
  p.cu = s.cu;
  if (!s.cu.empty()) a.cu_seqlens = p.cu.data(), a.nseq = (int32_t)s.cu.size() - 1;
  p.N = kda_kda_nseq(&a);
  int64_t BT = a.B * a.T;
  p.nq = BT * a.H * a.K, p.nv = BT * a.HV * a.V, p.ng = BT * a.HV * a.K, p.nb = BT * a.HV;
  p.ns = p.N * a.HV * a.K * a.V;
  p.q.resize(p.nq), p.k.resize(p.nq), p.v.resize(p.nv), p.g.resize(p.ng), p.beta.resize(p.nb);
  p.dout.resize(p.nv);
  for (int64_t i = 0; i < p.nv; i++) p.v[i] = bf((float)randn()), p.dout[i] = bf((float)randn());
  for (int64_t t = 0; t < BT * a.H; t++) {
    double sq = 0, sk = 0;
    float *qr = &p.q[t * a.K], *kr = &p.k[t * a.K];
    for (int64_t d = 0; d < a.K; d++) qr[d] = (float)randn(), kr[d] = (float)randn();
    for (int64_t d = 0; d < a.K; d++) sq += qr[d] * qr[d], sk += kr[d] * kr[d];
    for (int64_t d = 0; d < a.K; d++) {
      if (!s.l2) qr[d] /= (float)sqrt(sq), kr[d] /= (float)sqrt(sk);
      qr[d] = bf(qr[d]), kr[d] = bf(kr[d]);
    }
  }
  for (int64_t i = 0; i < p.ng; i++) {
    double x = randn();
    if (s.gate_mode == 0)
      p.g[i] = urand() < s.mask_p ? -1000.f : bf((float)(-log1p(exp(-x)) * s.gscale));
    else p.g[i] = bf((float)x);
  }
  if (s.gate_mode && !s.bare) {
    p.A_log.resize(a.HV), p.dt_bias.resize(a.HV * a.K);
    for (auto &x : p.A_log) x = (float)log(1 + 15 * urand());
    for (auto &x : p.dt_bias) x = (float)(0.5 * randn());
  }
  for (auto &b : p.beta) {
    double x = randn();
    b = s.beta_const != 0 ? bf(s.beta_const) : s.beta_mode ? bf((float)x) : bf((float)(1 / (1 + exp(-x))));
  }
  if (s.h0) { p.h0.resize(p.ns); for (auto &x : p.h0) x = (float)(0.5 * randn()); }
  if (s.dht) { p.dht.resize(p.ns); for (auto &x : p.dht) x = (float)randn(); }
}

static const float *ptr(const vf &x) { return x.empty() ? nullptr : x.data(); }

/* forward + backward of one case on both backends. seed != 0: the inputs are drawn from that
 * seed (the same draw whichever cases ran before; the stream the later cases see is left as it
 * was); strict: dA_log fails above its tolerance instead of warning, on the precise backward
 * (precise_gate, which strict implies; the fast one's dA_log is fla's, a warning). */
static void run_case(const char *name, const spec &s, uint64_t seed = 0, int strict = 0, int precise = 0) {
  if (only && !strstr(name, only)) return;
  prob p;
  uint64_t saved = rng_s;
  if (seed) rng_s = seed;
  make(p, s);
  if (seed) rng_s = saved;
  kda_kda_args a = p.a;
  a.precise_gate = precise || strict;
  /* CPU reference */
  vf o(p.nv), ht(p.ns), dq(p.nq), dk(p.nq), dv(p.nv), dg(p.ng), db(p.nb), dA(a.HV), ddt(a.HV * a.K), dh0(p.ns);
  if (kda_kdaref_forward(&a, p.q.data(), p.k.data(), p.v.data(), p.g.data(), p.beta.data(),
                         ptr(p.A_log), ptr(p.dt_bias), ptr(p.h0), o.data(), ht.data()) ||
      kda_kdaref_backward(&a, p.q.data(), p.k.data(), p.v.data(), p.g.data(), p.beta.data(),
                          ptr(p.A_log), ptr(p.dt_bias), ptr(p.h0), p.dout.data(), ptr(p.dht),
                          dq.data(), dk.data(), dv.data(), dg.data(), db.data(), dA.data(),
                          ddt.data(), dh0.data())) {
    printf("FAIL - %s: cpu reference: %s\n", name, kda_last_error()), nfail++;
    return;
  }
  /* device */
  void *q = dev_bf16(p.q), *k = dev_bf16(p.k), *v = dev_bf16(p.v), *g = dev_bf16(p.g);
  void *beta = dev_bf16(p.beta), *dO = dev_bf16(p.dout);
  float *A = p.A_log.empty() ? nullptr : dev_f32(p.A_log), *dt = p.dt_bias.empty() ? nullptr : dev_f32(p.dt_bias);
  float *h0 = p.h0.empty() ? nullptr : dev_f32(p.h0), *dht = p.dht.empty() ? nullptr : dev_f32(p.dht);
  int32_t *cu = nullptr;
  if (!p.cu.empty()) {
    CK(cudaMalloc(&cu, p.cu.size() * 4));
    CK(cudaMemcpy(cu, p.cu.data(), p.cu.size() * 4, cudaMemcpyHostToDevice));
    a.cu_seqlens = cu;
  }
  void *od, *dqd, *dkd, *dvd, *dgd, *dbd, *wsd;
  float *htd, *dAd, *ddtd, *dh0d;
  int64_t wsb = kda_kda_cuda_workspace_bytes(&a, 1);
  CK(cudaMalloc(&od, p.nv * 2)); CK(cudaMalloc(&htd, p.ns * 4)); CK(cudaMalloc(&wsd, wsb));
  CK(cudaMalloc(&dqd, p.nq * 2)); CK(cudaMalloc(&dkd, p.nq * 2)); CK(cudaMalloc(&dvd, p.nv * 2));
  CK(cudaMalloc(&dgd, p.ng * 2)); CK(cudaMalloc(&dbd, p.nb * 2)); CK(cudaMalloc(&dAd, a.HV * 4));
  CK(cudaMalloc(&ddtd, a.HV * a.K * 4)); CK(cudaMalloc(&dh0d, p.ns * 4));
  int rc = kda_kda_cuda_forward(&a, q, k, v, g, beta, A, dt, h0, od, htd, wsd, wsb, nullptr);
  if (!rc) rc = kda_kda_cuda_backward(&a, q, k, v, g, beta, A, dt, h0, dO, dht, dqd, dkd, dvd, dgd,
                                      dbd, dAd, ddtd, dh0d, wsd, wsb, nullptr);
  cudaError_t e = cudaDeviceSynchronize();
  if (rc || e != cudaSuccess) {
    printf("FAIL - %s: %s%s\n", name, rc ? kda_last_error() : "", e ? cudaGetErrorString(e) : "");
    nfail++;
    if (e) exit(2);      /* a sticky device error: nothing after this is trustworthy */
  } else {
    vf o2 = host_bf16(od, p.nv), ht2 = host_f32(htd, p.ns), dq2 = host_bf16(dqd, p.nq);
    vf dk2 = host_bf16(dkd, p.nq), dv2 = host_bf16(dvd, p.nv), dg2 = host_bf16(dgd, p.ng);
    vf db2 = host_bf16(dbd, p.nb), dA2 = host_f32(dAd, a.HV), ddt2 = host_f32(ddtd, a.HV * a.K);
    vf dh02 = host_f32(dh0d, p.ns);
    std::vector<item> it = {{"o", &o, &o2, 0.005, 0}, {"ht", &ht, &ht2, 0.005, 0},
                            {"dq", &dq, &dq2, 0.008, 0}, {"dk", &dk, &dk2, 0.008, 0},
                            {"dv", &dv, &dv2, 0.008, 0}, {"dg", &dg, &dg2, 0.02, 0},
                            {"dbeta", &db, &db2, 0.02, 0}, {"dh0", &dh0, &dh02, 0.008, 0}};
    if (s.gate_mode) {
      gate_items(it, &dA, &dA2, &ddt, &ddt2, precise_bwd(a.gate_mode, a.precise_gate), strict);
    }
    verdict(name, it);
    /* keep: a forward that keeps its internals (on a poisoned workspace, so nothing of the run
     * above survives) and two backwards that reuse them give the same bytes as recomputing;
     * the workspace past kda_kda_cuda_keep_bytes is poisoned again before each backward (the
     * backend lets another layer's kept bytes live there in between) */
    std::vector<std::pair<void *, size_t>> outs = {{od, p.nv * 2}, {htd, p.ns * 4}, {dqd, p.nq * 2},
        {dkd, p.nq * 2}, {dvd, p.nv * 2}, {dgd, p.ng * 2}, {dbd, p.nb * 2}, {dAd, a.HV * 4},
        {ddtd, a.HV * a.K * 4}, {dh0d, p.ns * 4}};
    std::vector<std::vector<char>> ref;
    for (auto &x : outs) {
      ref.emplace_back(x.second);
      CK(cudaMemcpy(ref.back().data(), x.first, x.second, cudaMemcpyDeviceToHost));
      CK(cudaMemset(x.first, 0x7f, x.second));
    }
    CK(cudaMemset(wsd, 0x7f, wsb));
    kda_kda_args ak = a;
    ak.keep = 1;
    rc = kda_kda_cuda_forward(&ak, q, k, v, g, beta, A, dt, h0, od, htd, wsd, wsb, nullptr);
    int64_t kb = kda_kda_cuda_keep_bytes(&ak);
    for (int rep = 0; rep < 2 && !rc; rep++) {
      CK(cudaMemset((char *)wsd + kb, 0x7f, (size_t)(wsb - kb)));
      rc = kda_kda_cuda_backward(&ak, q, k, v, g, beta, A, dt, h0, dO, dht, dqd, dkd, dvd, dgd,
                                 dbd, dAd, ddtd, dh0d, wsd, wsb, nullptr);
    }
    CK(cudaDeviceSynchronize());
    /* a kept forward that prepares the precise backward (a parameterised gate asking for it,
     * or KDA_KDA_PRECISE=1; version 2) computes o, ht from the precise tiles: those two are
     * held to the CPU reference instead of the recompute's bytes */
    const char *se = getenv("KDA_KDA_SIMPLE");
    bool pk = precise_bwd(a.gate_mode, a.precise_gate) && !(se && *se && strcmp(se, "0"));
    int same = !rc;
    for (size_t i = pk ? 2 : 0; i < outs.size() && same; i++) {
      std::vector<char> b(outs[i].second);
      CK(cudaMemcpy(b.data(), outs[i].first, outs[i].second, cudaMemcpyDeviceToHost));
      same = !memcmp(b.data(), ref[i].data(), b.size());
    }
    if (same) printf("ok - %s: keep (kept forward, two reusing backwards) = recompute, bit for bit%s\n", name,
                     pk ? " (gradients)" : ""), npass++;
    else printf("FAIL - %s: keep differs from recompute%s%s\n", name, rc ? ": " : "", rc ? kda_last_error() : ""), nfail++;
    if (pk && !rc) {
      vf o3 = host_bf16(od, p.nv), ht3 = host_f32(htd, p.ns);
      std::string nm = std::string(name) + ": kept precise forward";
      verdict(nm.c_str(), {{"o", &o, &o3, 0.005, 0}, {"ht", &ht, &ht3, 0.005, 0}});
    }
    /* a kept forward and `reps` backwards with env name=val, its outputs into got (name put
     * back as it was after, env_scope; the flow and wide comparisons below) */
    auto kept_run = [&](const char *env, const char *val, int reps, std::vector<std::vector<char>> &got) {
      env_scope sw(env, val);
      CK(cudaMemset(wsd, 0x7f, wsb));
      int r = kda_kda_cuda_forward(&ak, q, k, v, g, beta, A, dt, h0, od, htd, wsd, wsb, nullptr);
      for (int rep = 0; rep < reps && !r; rep++) {
        CK(cudaMemset((char *)wsd + kb, 0x7f, (size_t)(wsb - kb)));
        r = kda_kda_cuda_backward(&ak, q, k, v, g, beta, A, dt, h0, dO, dht, dqd, dkd, dvd, dgd, dbd, dAd, ddtd,
                                  dh0d, wsd, wsb, nullptr);
      }
      CK(cudaDeviceSynchronize());
      for (auto &x : outs) {
        got.emplace_back(x.second);
        CK(cudaMemcpy(got.back().data(), x.first, x.second, cudaMemcpyDeviceToHost));
      }
      return r;
    };
    /* the outputs kept_run just left (rc its result) against the CPU reference, at the
     * tensor-core path's tolerances: for the variants whose sums run in another order */
    auto kept_vs_ref = [&](const char *what) {
      std::string nm = std::string(name) + what;
      if (rc) {
        printf("FAIL - %s: %s\n", nm.c_str(), kda_last_error()), nfail++;
        return;
      }
      vf o2 = host_bf16(od, p.nv), ht2 = host_f32(htd, p.ns), dq2 = host_bf16(dqd, p.nq), dk2 = host_bf16(dkd, p.nq);
      vf dv2 = host_bf16(dvd, p.nv), dg2 = host_bf16(dgd, p.ng), db2 = host_bf16(dbd, p.nb), dh02 = host_f32(dh0d, p.ns);
      verdict(nm.c_str(), {{"o", &o, &o2, 0.005, 0}, {"ht", &ht, &ht2, 0.005, 0}, {"dq", &dq, &dq2, 0.008, 0},
                           {"dk", &dk, &dk2, 0.008, 0}, {"dv", &dv, &dv2, 0.008, 0}, {"dg", &dg, &dg2, 0.02, 0},
                           {"dbeta", &db, &db2, 0.02, 0}, {"dh0", &dh0, &dh02, 0.008, 0}});
    };
    /* the flow kernels (kda_cuda.cu use_flow: intra + the forward state pass, the kept reverse
     * sweep + the rows kernel, each as one grid), forced wherever they may run
     * (KDA_KDA_FLOW=1; by default only where the chunk grid is many waves), against the
     * separate kernels (KDA_KDA_FLOW=0): a kept forward and its backward (twice with the flow:
     * its words reset), the same bytes */
    const char *sd = getenv("KDA_KDA_STATE_DB");
    if (!(se && *se && strcmp(se, "0")) && !(sd && !strcmp(sd, "0")) && !rc) {
      std::vector<std::vector<char>> got[2];
      for (int fl = 1; fl >= 0 && !rc; fl--) rc = kept_run("KDA_KDA_FLOW", fl ? "1" : "0", 1 + fl, got[fl]);
      same = !rc && got[0] == got[1];
      if (same) printf("ok - %s: flow kernels (KDA_KDA_FLOW=1, backward twice) = separate kernels, bit for bit\n", name), npass++;
      else printf("FAIL - %s: flow kernels differ from separate kernels%s%s\n", name, rc ? ": " : "", rc ? kda_last_error() : ""), nfail++;
    }
    /* the wide state passes (kda_cuda.cu use_wide: 64 V columns a block, the state in registers;
     * the compiled K = V = 64 / 128 shapes, by default only where the narrow grid is more than a
     * wave), forced (KDA_KDA_WIDE=1) against the narrow passes (KDA_KDA_WIDE=0): a kept forward
     * and its backward, the same bytes */
    const char *kve = getenv("KDA_KDA_KV");
    bool kvc = a.chunk == 64 && a.K == a.V && (a.K == 64 || a.K == 128) && !(kve && !strcmp(kve, "0"));
    if (!(se && *se && strcmp(se, "0")) && kvc && !pk && !rc) {
      std::vector<std::vector<char>> got[2];
      for (int wd = 0; wd < 2 && !rc; wd++) rc = kept_run("KDA_KDA_WIDE", wd ? "1" : "0", 1, got[wd]);
      same = !rc && got[0] == got[1];
      if (same) printf("ok - %s: wide state passes (KDA_KDA_WIDE=1) = narrow, bit for bit\n", name), npass++;
      else printf("FAIL - %s: wide state passes differ from narrow%s%s\n", name, rc ? ": " : "", rc ? kda_last_error() : ""), nfail++;
    }
    /* The wgmma kernels (sm_90a; kda_cuda.cu's use_wg, use_wg_bwd, use_rows_wg, use_mat_wg,
     * use_final_wg: each on by default on an H100 / H200 at K = V = 128, each with its switch;
     * this test's main() turns them all off, so that the comparisons above stay bit for bit on
     * the mma.sync kernels). Each switch on alone, then all five, as a default run takes them; their sums
     * run in the tensor cores' order, so a kept forward and its backward are held to the CPU
     * reference's tolerances. KDA_KDA_WIDE=1 where a kernel runs only beside the wide passes
     * (the two state passes; the rows kernel, which elsewhere runs inside the flow kernel or
     * reads the fp32 dVn). */
    const int maj_ = cc_major();
    static const char *const wgsw[5] = {"KDA_KDA_WG", "KDA_KDA_WGB", "KDA_KDA_ROWSWG", "KDA_KDA_MATWG",
                                        "KDA_KDA_FINALWG"};
    static const char *const wgwhat[6] = {"wgmma forward state pass", "wgmma reverse sweep", "wgmma rows kernel",
                                          "wgmma mat kernel", "wgmma final kernel (flat chunks)", "every wgmma kernel"};
    for (int c = 0; c < 6 && !(se && *se && strcmp(se, "0")) && kvc && a.K == 128 && !pk && !rc && maj_ == 9; c++) {
      std::vector<std::vector<char>> got;
      if (c != 3 && c != 4) setenv("KDA_KDA_WIDE", "1", 1);   /* the mat and final kernels run beside either */
      for (int k2 = 0; c == 5 && k2 < 4; k2++) setenv(wgsw[k2], "1", 1);   /* all five: the last by kept_run */
      rc = kept_run(wgsw[c < 5 ? c : 4], "1", 1, got);
      unsetenv("KDA_KDA_WIDE");
      for (int k2 = 0; k2 < 5; k2++) setenv(wgsw[k2], "0", 1);            /* back to the mma.sync kernels */
      std::string what = std::string(": ") + wgwhat[c] + (c < 5 ? std::string(" (") + wgsw[c] + "=1)" : " (all five =1)");
      kept_vs_ref(what.c_str());
    }
    /* the reverse sweep with the rows kernel's products (kda_cuda.cu use_sweep_rows: one block
     * a (sequence, head), by default where that grid fills the card, which no case here does),
     * forced (KDA_KDA_SR=1) against the wgmma sweep and rows kernel it replaces (=0; both beside
     * the wide forward, KDA_KDA_WGB=1, KDA_KDA_ROWSWG=1): the same products of the same bf16
     * operands in the same k order, so every output the same bytes but the gate's (dg, dA_log,
     * ddt_bias: dgn's sums run in another order), and all of them against the CPU reference */
    if (!(se && *se && strcmp(se, "0")) && kvc && a.K == 128 && !pk && !rc && maj_ == 9) {
      env_scope wd("KDA_KDA_WIDE", "1"), wb("KDA_KDA_WGB", "1"), rw("KDA_KDA_ROWSWG", "1");
      std::vector<std::vector<char>> got[2];
      int ran[2] = {-1, -1};                        /* kda_kda_cuda_last_sr after each */
      for (int f = 0; f < 2 && !rc; f++) rc = kept_run("KDA_KDA_SR", f ? "1" : "0", 1, got[f]), ran[f] = kda_kda_cuda_last_sr();
      bool same = !rc;
      for (size_t i = 0; same && i < got[0].size(); i++)
        if (i != 5 && i != 7 && i != 8) same = got[0][i] == got[1][i];   /* outs: dg 5, dA_log 7, ddt_bias 8 */
      if (!rc && (ran[0] != 0 || ran[1] != 1))
        printf("FAIL - %s: the reverse sweep with the rows products: KDA_KDA_SR=0, =1 ran %d, %d, not 0, 1\n", name, ran[0], ran[1]), nfail++;
      else if (same) printf("ok - %s: the reverse sweep with the rows products (KDA_KDA_SR=1) = the two kernels, bit for bit but dg\n", name), npass++;
      else printf("FAIL - %s: the reverse sweep with the rows products differs from the two kernels%s%s\n", name, rc ? ": " : "", rc ? kda_last_error() : ""), nfail++;
      kept_vs_ref(": the reverse sweep with the rows products (KDA_KDA_SR=1)");
    }
    /* the same sweep beside the wgmma final and / or mat kernels (KDA_KDA_FINALWG=1, KDA_KDA_MATWG=1),
     * as a default run takes them: dQ0, dKi0, dA to the one, dW to the other go in bf16
     * (kda_cuda.cu use_b16), so held to the CPU reference, and that each hand-off ran
     * (kda_kda_cuda_last_sr: 1 + 1 for dQ0, dKi0, dA, + 2 for dW) */
    for (int b = 1; b < 4 && !(se && *se && strcmp(se, "0")) && kvc && a.K == 128 && !pk && !rc && maj_ == 9; b++) {
      env_scope wd("KDA_KDA_WIDE", "1"), wb("KDA_KDA_WGB", "1"), rw("KDA_KDA_ROWSWG", "1");
      env_scope fw("KDA_KDA_FINALWG", b & 1 ? "1" : "0"), mw("KDA_KDA_MATWG", b & 2 ? "1" : "0");
      std::vector<std::vector<char>> got;
      rc = kept_run("KDA_KDA_SR", "1", 1, got);
      const int ran = kda_kda_cuda_last_sr();
      if (!rc && ran != 1 + b)
        printf("FAIL - %s: the fused sweep's bf16 hand-offs (KDA_KDA_FINALWG=%d, KDA_KDA_MATWG=%d) ran %d, not %d\n", name,
               b & 1, b >> 1, ran, 1 + b), nfail++;
      const std::string what = std::string(": the fused sweep's bf16 ") + (b & 1 ? "dQ0, dKi0, dA" : "") + (b == 3 ? " and " : "") +
                               (b & 2 ? "dW" : "") + " (KDA_KDA_SR=1, KDA_KDA_FINALWG=" + (b & 1 ? "1" : "0") +
                               ", KDA_KDA_MATWG=" + (b & 2 ? "1" : "0") + ")";
      kept_vs_ref(what.c_str());
    }
    /* the compiled K = V = 64 forms in their wide layouts (KDA_KDA_COMPACT=0): the H200 runs the
     * compact ones there (two blocks an SM), a card with less shared memory an SM runs these, and
     * no other path here does (the fourth runs the wide layouts in their run-time forms). Held to
     * the CPU reference's tolerances, as the tensor-core path is */
    if (!(se && *se && strcmp(se, "0")) && kvc && a.K == 64 && !pk && !rc) {
      std::vector<std::vector<char>> got;
      rc = kept_run("KDA_KDA_COMPACT", "0", 1, got);
      kept_vs_ref(": the compiled K = 64 forms' wide layouts (KDA_KDA_COMPACT=0)");
    }
    /* the rows kernel's products formed where they are read (kda_cuda.cu use_final_fr: the
     * fast compact K = V = 64 forms, on by default where they run): the final kernel's dQ0, dKi0,
     * dgn, dA with the rows kernel's dW (KDA_KDA_FR=1), and with the mat kernel's dW and no rows
     * kernel (=2, the default), against the rows kernel forming them all (=0), beside the default
     * and the one-tile-set state passes (KDA_KDA_STATE_DB=0: the reverse sweep's bf16 dVn, where
     * the two-tile-set one leaves the rounding to its readers): the same products on the same
     * bf16 operands in the same k order, so a kept forward and its backward, the same bytes */
    if (!(se && *se && strcmp(se, "0")) && kvc && a.K == 64 && !pk && !rc) {
      env_scope nfl("KDA_KDA_FLOW", "0");           /* FR declines beside the flow kernel, which forms them itself */
      const int mj = cc_major();
      for (int db = 0; db < 2 && !rc; db++) {
        env_scope sdb("KDA_KDA_STATE_DB", db ? nullptr : "0");
        std::vector<std::vector<char>> got[3];
        int ran[3] = {-1, -1, -1};                  /* the form each call ran (kda_kda_cuda_last_fr) */
        for (int f = 0; f < 3 && !rc; f++) {
          rc = kept_run("KDA_KDA_FR", f == 0 ? "0" : f == 1 ? "1" : "2", 1, got[f]);
          ran[f] = kda_kda_cuda_last_fr();
        }
        same = !rc && got[0] == got[1] && got[0] == got[2];
        const char *st = db ? "default state passes" : "one-tile-set state passes";
        const bool engaged = ran[0] == 0 && ran[1] == 1 && ran[2] == 2;
        if (!rc && !engaged && mj == 9)              /* an H100 / H200 fits both compact forms */
          printf("FAIL - %s: rows products in the final and mat kernels: the forms that ran were %d, %d, %d, not 0, 1, 2 (%s)\n", name, ran[0], ran[1], ran[2], st), nfail++;
        else if (!rc && !engaged)                    /* a card with less shared memory an SM */
          printf("# %s: rows products in the final and mat kernels not compared: forms %d, %d, %d ran (%s)\n", name, ran[0], ran[1], ran[2], st);
        else if (same) printf("ok - %s: rows products in the final and mat kernels (KDA_KDA_FR=1, 2) = the rows kernel's, bit for bit (%s)\n", name, st), npass++;
        else printf("FAIL - %s: rows products in the final and mat kernels differ from the rows kernel's (%s)%s%s\n", name, st, rc ? ": " : "", rc ? kda_last_error() : ""), nfail++;
      }
    }
    /* the FR final kernel launched programmatically after the mat kernel (kda_cuda.cu use_pdl:
     * its staging and products beside the mat kernel's last blocks, the rest after its
     * griddepcontrol.wait; the default on sm_90 where FR = 2 runs) against the ordinary launch
     * (KDA_KDA_PDL=0): a kept forward and its backward, the same bytes */
    if (!(se && *se && strcmp(se, "0")) && kvc && a.K == 64 && !pk && !rc && cc_major() >= 9) {
      env_scope nfl("KDA_KDA_FLOW", "0");           /* FR declines beside the flow kernel */
      std::vector<std::vector<char>> got[2];
      int ran = -1;
      for (int f = 0; f < 2 && !rc; f++) rc = kept_run("KDA_KDA_PDL", f ? "1" : "0", 1, got[f]), ran = kda_kda_cuda_last_fr();
      same = !rc && got[0] == got[1];
      if (!rc && ran != 2) printf("# %s: the programmatic FR launch not compared: FR form %d ran\n", name, ran);
      else if (same) printf("ok - %s: FR final kernel launched programmatically (KDA_KDA_PDL=1) = ordinary launch, bit for bit\n", name), npass++;
      else printf("FAIL - %s: FR final kernel launched programmatically differs from the ordinary launch%s%s\n", name, rc ? ": " : "", rc ? kda_last_error() : ""), nfail++;
      /* the same forward and backward captured in a CUDA graph and replayed (as the trainer's
       * whole-step graph and kda_bench's graph_ms run them: the programmatic launch becomes a
       * programmatic edge of the graph) against the ordinary launches, the same bytes */
      if (!rc && ran == 2 && same) {
        env_scope pdl("KDA_KDA_PDL", "1");
        cudaStream_t gs;
        cudaGraph_t gr;
        cudaGraphExec_t ge;
        CK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
        CK(cudaMemset(wsd, 0x7f, wsb));
        CK(cudaStreamBeginCapture(gs, cudaStreamCaptureModeThreadLocal));
        int r = kda_kda_cuda_forward(&ak, q, k, v, g, beta, A, dt, h0, od, htd, wsd, wsb, gs);
        if (!r) CK(cudaMemsetAsync((char *)wsd + kb, 0x7f, (size_t)(wsb - kb), gs));
        if (!r) r = kda_kda_cuda_backward(&ak, q, k, v, g, beta, A, dt, h0, dO, dht, dqd, dkd, dvd, dgd, dbd, dAd,
                                          ddtd, dh0d, wsd, wsb, gs);
        CK(cudaStreamEndCapture(gs, &gr));
        std::vector<std::vector<char>> gg;
        if (!r) {
          CK(cudaGraphInstantiate(&ge, gr, 0));
          for (auto &x : outs) CK(cudaMemset(x.first, 0x7f, x.second));   /* the replay must write every output */
          CK(cudaDeviceSynchronize());                /* the poison (legacy stream) before gs's replay: gs does not wait for it */
          CK(cudaGraphLaunch(ge, gs));
          CK(cudaStreamSynchronize(gs));
          CK(cudaGraphExecDestroy(ge));
          for (auto &x : outs) {
            gg.emplace_back(x.second);
            CK(cudaMemcpy(gg.back().data(), x.first, x.second, cudaMemcpyDeviceToHost));
          }
        }
        CK(cudaGraphDestroy(gr));
        CK(cudaStreamDestroy(gs));
        if (!r && gg == got[0]) printf("ok - %s: the programmatic launches in a CUDA graph = ordinary launches, bit for bit\n", name), npass++;
        else printf("FAIL - %s: the programmatic launches in a CUDA graph differ from the ordinary launches%s%s\n", name, r ? ": " : "", r ? kda_last_error() : ""), nfail++;
      }
    }
    /* the second-tile-set state passes run alone (flow kernels off) at 16 V columns a block
     * (KDA_KDA_STATE_BV=16; by default where twice the blocks still fit a wave; at the compiled
     * K = 64 with a third tile set, db_sets) against 32 (=32): a kept forward and its backward,
     * the same bytes */
    if (!(se && *se && strcmp(se, "0")) && !(sd && !strcmp(sd, "0")) && !pk && !rc) {
      std::vector<std::vector<char>> got[2];
      {
        env_scope flow("KDA_KDA_FLOW", "0");
        for (int b = 0; b < 2 && !rc; b++) rc = kept_run("KDA_KDA_STATE_BV", b ? "16" : "32", 1, got[b]);
      }
      same = !rc && got[0] == got[1];
      if (same) printf("ok - %s: state passes at 16 V columns a block (KDA_KDA_STATE_BV=16) = 32, bit for bit\n", name), npass++;
      else printf("FAIL - %s: state passes at 16 V columns differ from 32%s%s\n", name, rc ? ": " : "", rc ? kda_last_error() : ""), nfail++;
    }
    /* the fused front (kda_cuda.cu front: k_intra_tc forms q, k, G, b from the raw inputs; version
     * 2 at K % 4 == 0, K <= 128) against k_rows4 + k_intra_tc staging its outputs
     * (KDA_KDA_ROWS_IN=0): a kept forward and its backward, the same bytes */
    if (!(se && *se && strcmp(se, "0")) && a.K % 4 == 0 && a.K <= 128 && !rc) {
      std::vector<std::vector<char>> got[2];
      for (int fu = 0; fu < 2 && !rc; fu++) rc = kept_run("KDA_KDA_ROWS_IN", fu ? "1" : "0", 1, got[fu]);
      same = !rc && got[0] == got[1];
      if (same) printf("ok - %s: fused front (k_intra_tc's own rows) = k_rows4 + k_intra_tc, bit for bit\n", name), npass++;
      else printf("FAIL - %s: fused front differs from k_rows4 + k_intra_tc%s%s\n", name, rc ? ": " : "", rc ? kda_last_error() : ""), nfail++;
    }
    /* the chunk kernels' launch order (kda_common.cuh blk_chunk): head-major, the default, against
     * chunk-major (KDA_KDA_HM=0, and more than 65534 chunks a call): a kept forward and its
     * backward, the same bytes; with the mma.sync kernels this test compares, then (K = V = 128
     * on sm_90) with the wgmma ones and the fused sweep's bf16 hand-offs, as a default run takes
     * them */
    for (int wg = 0; wg < 2 && !(se && *se && strcmp(se, "0")) && !rc; wg++) {
      if (wg && !(kvc && a.K == 128 && !pk && maj_ == 9)) break;
      const char *on = wg ? "1" : nullptr;          /* nullptr: the variable as it is */
      env_scope e0("KDA_KDA_WIDE", on), e1("KDA_KDA_WG", on), e2("KDA_KDA_WGB", on), e3("KDA_KDA_ROWSWG", on),
          e4("KDA_KDA_MATWG", on), e5("KDA_KDA_FINALWG", on), e6("KDA_KDA_SR", on);
      const char *kind = wg ? " (the wgmma kernels, KDA_KDA_SR=1)" : "";
      std::vector<std::vector<char>> got[2];
      for (int hm = 0; hm < 2 && !rc; hm++) rc = kept_run("KDA_KDA_HM", hm ? "1" : "0", 1, got[hm]);
      same = !rc && got[0] == got[1];
      if (same) printf("ok - %s: head-major chunk grid = chunk-major (KDA_KDA_HM=0)%s, bit for bit\n", name, kind), npass++;
      else printf("FAIL - %s: head-major chunk grid differs from chunk-major%s%s%s\n", name, kind, rc ? ": " : "", rc ? kda_last_error() : ""), nfail++;
    }
    /* the flow kernel's persistent intra blocks (kda_cuda.cu use_persist, k_fwd_flow_ps: each
     * task staging the next one's raw rows by bulk copies; the compiled wide fast form with the
     * fused front, by default where the chunk grid is more than a wave), forced with the flow
     * (KDA_KDA_FLOW=1 KDA_KDA_PERSIST=1) on ns + 3 blocks (KDA_KDA_PERSIST_GRID=3: every intra
     * block takes several tasks) against the block-a-task intra kernel (KDA_KDA_PERSIST=0): a kept
     * forward and its backward, the same bytes. At K = 64 in the wide layout (KDA_KDA_COMPACT=0 on
     * both sides), where the compact one would run instead */
    if (!(se && *se && strcmp(se, "0")) && !(sd && !strcmp(sd, "0")) && kvc && !pk && maj_ >= 9 && !rc) {
      std::vector<std::vector<char>> got, gf;
      env_scope grid("KDA_KDA_PERSIST_GRID", "3"), compact("KDA_KDA_COMPACT", a.K == 64 ? "0" : nullptr);
      rc = kept_run("KDA_KDA_PERSIST", "0", 1, got);
      if (!rc) {
        env_scope flow("KDA_KDA_FLOW", "1");
        rc = kept_run("KDA_KDA_PERSIST", "1", 1, gf);
      }
      same = !rc && got == gf;
      if (same) printf("ok - %s: flow kernel with persistent intra blocks (KDA_KDA_FLOW=1 KDA_KDA_PERSIST=1) = a block a task, bit for bit\n", name), npass++;
      else printf("FAIL - %s: flow kernel with persistent intra blocks differs%s%s\n", name, rc ? ": " : "", rc ? kda_last_error() : ""), nfail++;
    }
  }
  void *fr[] = {q, k, v, g, beta, dO, A, dt, h0, dht, cu, od, htd, wsd, dqd, dkd, dvd, dgd, dbd, dAd, ddtd, dh0d};
  for (void *x : fr) if (x) cudaFree(x);
}

/* decode: CUDA kda_kda_cuda_decode vs CPU kda_kdaref_step over T tokens from h0 */
static void run_decode(const char *name, const spec &s) {
  prob p;
  make(p, s);
  kda_kda_args a = p.a;
  vf st = p.h0.empty() ? vf(p.ns, 0.f) : p.h0, o(p.nv);
  kda_kdaref_step(&a, p.q.data(), p.k.data(), p.v.data(), p.g.data(), p.beta.data(), ptr(p.A_log),
                  ptr(p.dt_bias), st.data(), o.data());
  void *q = dev_bf16(p.q), *k = dev_bf16(p.k), *v = dev_bf16(p.v), *g = dev_bf16(p.g), *beta = dev_bf16(p.beta);
  float *A = p.A_log.empty() ? nullptr : dev_f32(p.A_log), *dt = p.dt_bias.empty() ? nullptr : dev_f32(p.dt_bias);
  float *std_ = dev_f32(p.h0.empty() ? vf(p.ns, 0.f) : p.h0);
  void *od;
  int32_t *cu = nullptr;
  if (!p.cu.empty()) {
    CK(cudaMalloc(&cu, p.cu.size() * 4));
    CK(cudaMemcpy(cu, p.cu.data(), p.cu.size() * 4, cudaMemcpyHostToDevice));
    a.cu_seqlens = cu;
  }
  CK(cudaMalloc(&od, p.nv * 2));
  int rc = kda_kda_cuda_decode(&a, q, k, v, g, beta, A, dt, std_, od, nullptr);
  cudaError_t e = cudaDeviceSynchronize();
  if (rc || e) {
    printf("FAIL - %s: %s%s\n", name, rc ? kda_last_error() : "", e ? cudaGetErrorString(e) : "");
    nfail++;
    if (e) exit(2);
  } else {
    vf o2 = host_bf16(od, p.nv), st2 = host_f32(std_, p.ns);
    verdict(name, {{"o", &o, &o2, 0.005, 0}, {"state", &st, &st2, 0.005, 0}});
  }
  void *fr[] = {q, k, v, g, beta, A, dt, std_, od, cu};
  for (void *x : fr) if (x) cudaFree(x);
}


/* ---- part 2: exec nodes through kc_kda_node vs kda_cpu_kda_node ------------------------------ */
static kc_ctx g_ctx;
static void ctx_scratch(int64_t need) {
  if (need <= g_ctx.scratch_bytes) return;
  if (g_ctx.scratch) CK(cudaFree(g_ctx.scratch));
  CK(cudaMalloc(&g_ctx.scratch, (size_t)need));
  g_ctx.scratch_bytes = need;
}
static void *dev_store(const vf &x, int dt) { return dt == KDA_BF16 ? dev_bf16(x) : (void *)dev_f32(x); }
static vf host_store(const void *d, int dt, size_t n) { return dt == KDA_BF16 ? host_bf16(d, n) : host_f32((const float *)d, n); }
static kda_tview tv(void *data, int dt, int nd, int64_t a, int64_t b, int64_t c, int64_t d) {
  kda_tview t;
  t.data = data, t.dtype = dt, t.ndim = nd;
  t.shape[0] = a, t.shape[1] = b, t.shape[2] = c, t.shape[3] = d;
  return t;
}
static vf slice(const vf &x, int64_t off, int64_t n) { return vf(x.begin() + off, x.begin() + off + n); }

/* The forward and backward nodes on the GPU; false, with a FAIL line, if either errs (an
 * asynchronous fault ends the test: the context is gone). */
static bool gpu_pair(const char *name, kda_exec_node *gn, kda_exec_node *gb) {
  int rc = kc_kda_node(gn, &g_ctx);
  if (!rc) rc = kc_kda_node(gb, &g_ctx);
  cudaError_t e = cudaDeviceSynchronize();
  if (!rc && !e) return true;
  printf("FAIL - %s: %s%s\n", name, rc ? kda_last_error() : "", e ? cudaGetErrorString(e) : "");
  nfail++;
  if (e) exit(2);
  return false;
}

/* Determinism: the backward node run twice more, its output poisoned before each run, must
 * give the bytes of the first run. */
static void rerun_identical(const char *name, const char *what, kda_exec_node *gb, void *out, size_t bytes) {
  std::vector<char> b1(bytes), b2(bytes);
  CK(cudaMemcpy(b1.data(), out, bytes, cudaMemcpyDeviceToHost));
  for (int rep = 0; rep < 2; rep++) {
    CK(cudaMemset(out, 0x7f, bytes));
    if (kc_kda_node(gb, &g_ctx)) break;
  }
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(b2.data(), out, bytes, cudaMemcpyDeviceToHost));
  if (!memcmp(b1.data(), b2.data(), bytes)) printf("ok - %s: %s\n", name, what), npass++;
  else printf("FAIL - %s: differs between runs (a non-deterministic reduction)\n", name), nfail++;
}

/* KDA + KDA_BWD nodes: activations stored as adt, the packed gradient as gdt */
static void run_node_kda(const char *name, const spec &s, int adt, int gdt, int precise = 0) {
  prob p;
  make(p, s);
  kda_kda_args a = p.a;
  vf Al = p.A_log.empty() ? vf(a.HV, 0.f) : p.A_log, dtb = p.dt_bias.empty() ? vf(a.HV * a.K, 0.f) : p.dt_bias;
  int64_t B = a.B, T = a.T, H = a.H, HV = a.HV, K = a.K, V = a.V;
  const vf *src[8] = {&p.q, &p.k, &p.v, &p.g, &p.beta, &Al, &dtb, &p.dout};
  kda_tview cin[8], gin[8];
  void *dd[8];
  for (int i = 0; i < 8; i++) {
    int dt = i == 5 || i == 6 ? KDA_F32 : adt;
    dd[i] = dev_store(*src[i], dt);
  }
  int64_t sh[8][4] = {{B, T, H, K}, {B, T, H, K}, {B, T, HV, V}, {B, T, HV, K}, {B, T, HV, 1}, {HV, 1, 1, 1}, {HV * K, 1, 1, 1}, {B, T, HV, V}};
  int nd[8] = {4, 4, 4, 4, 3, 1, 1, 4};
  for (int i = 0; i < 8; i++) {
    cin[i] = tv((void *)src[i]->data(), KDA_F32, nd[i], sh[i][0], sh[i][1], sh[i][2], sh[i][3]);
    gin[i] = cin[i], gin[i].data = dd[i], gin[i].dtype = i == 5 || i == 6 ? KDA_F32 : adt;
  }
  int64_t ngrad = 2 * p.nq + p.nv + p.ng + p.nb, ntot = ngrad + HV + HV * K;
  vf o(p.nv), pk(ntot);
  kda_exec_node cn;
  memset(&cn, 0, sizeof cn);
  cn.op = KDA_OP_KDA, cn.nin = 7, cn.in = cin, cn.out = tv(o.data(), KDA_F32, 4, B, T, HV, V);
  cn.iattr[0] = s.gate_mode, cn.iattr[1] = s.l2, cn.iattr[2] = s.beta_mode, cn.iattr[3] = s.chunk;
  cn.iattr[4] = precise;
  cn.fattr[0] = s.scale, cn.fattr[1] = s.lb;
  kda_exec_node cb = cn;
  cb.op = KDA_OP_KDA_BWD, cb.nin = 8, cb.out = tv(pk.data(), KDA_F32, 1, ntot, 1, 1, 1);
  if (kda_cpu_kda_node(&cn) || kda_cpu_kda_node(&cb)) {
    printf("FAIL - %s: cpu: %s\n", name, kda_last_error()), nfail++;
    return;
  }
  void *go = nullptr, *gp = nullptr;
  CK(cudaMalloc(&go, p.nv * 4)); CK(cudaMalloc(&gp, ntot * 4));
  kda_exec_node gn = cn, gb = cb;
  gn.in = gin, gb.in = gin;
  gn.out.data = go, gn.out.dtype = adt, gb.out.data = gp, gb.out.dtype = gdt;
  ctx_scratch(kc_kda_scratch(&gn)), ctx_scratch(kc_kda_scratch(&gb));
  if (gpu_pair(name, &gn, &gb)) {
    vf o2 = host_store(go, adt, p.nv), pk2 = host_store(gp, gdt, ntot);
    int64_t off[8] = {0, p.nq, 2 * p.nq, 2 * p.nq + p.nv, 2 * p.nq + p.nv + p.ng, ngrad, ngrad + HV, ntot};
    vf r[7], x[7];
    for (int i = 0; i < 7; i++) r[i] = slice(pk, off[i], off[i + 1] - off[i]), x[i] = slice(pk2, off[i], off[i + 1] - off[i]);
    std::vector<item> it = {{"o", &o, &o2, 0.005, 0}, {"dq", &r[0], &x[0], 0.008, 0}, {"dk", &r[1], &x[1], 0.008, 0},
                            {"dv", &r[2], &x[2], 0.008, 0}, {"dg", &r[3], &x[3], 0.02, 0}, {"dbeta", &r[4], &x[4], 0.02, 0}};
    if (s.gate_mode) gate_items(it, &r[5], &x[5], &r[6], &x[6], precise_bwd(s.gate_mode, precise), false);
    verdict(name, it);
    rerun_identical(name, "backward bit-identical on re-run", &gb, gp, (size_t)ntot * (gdt == KDA_BF16 ? 2 : 4));
  }
  for (int i = 0; i < 8; i++) cudaFree(dd[i]);
  cudaFree(go), cudaFree(gp);
}

/* adt: x's and y's storage; ddt: dy's (the layer's dy is KDA_BWD's f32 gradient slice) */
static void run_node_conv(const char *name, int64_t B, int64_t T, int64_t C, int W, int silu, int adt, int gdt, int ddt = -1) {
  if (ddt < 0) ddt = adt;
  vf x(B * T * C), w(C * W), dy(B * T * C);
  for (auto &v : x) v = bf((float)randn());
  for (auto &v : w) v = (float)(0.5 * randn());
  for (auto &v : dy) v = bf((float)randn());
  void *dx_ = dev_store(x, adt), *dw_ = dev_f32(w), *ddy = dev_store(dy, ddt);
  kda_tview cin[3] = {tv(x.data(), KDA_F32, 3, B, T, C, 1), tv(w.data(), KDA_F32, 2, C, W, 1, 1), tv(dy.data(), KDA_F32, 3, B, T, C, 1)};
  kda_tview gin[3] = {cin[0], cin[1], cin[2]};
  gin[0].data = dx_, gin[0].dtype = adt, gin[1].data = dw_, gin[2].data = ddy, gin[2].dtype = ddt;
  int64_t ny = B * T * C, np = ny + C * W;
  vf y(ny), pk(np);
  kda_exec_node cn;
  memset(&cn, 0, sizeof cn);
  cn.op = KDA_OP_CONV1D, cn.nin = 2, cn.in = cin, cn.out = tv(y.data(), KDA_F32, 3, B, T, C, 1), cn.iattr[0] = silu;
  kda_exec_node cb = cn;
  cb.op = KDA_OP_CONV1D_BWD, cb.nin = 3, cb.out = tv(pk.data(), KDA_F32, 1, np, 1, 1, 1);
  if (kda_cpu_kda_node(&cn) || kda_cpu_kda_node(&cb)) {
    printf("FAIL - %s: cpu: %s\n", name, kda_last_error()), nfail++;
    return;
  }
  void *go, *gp;
  CK(cudaMalloc(&go, ny * 4)); CK(cudaMalloc(&gp, np * 4));
  kda_exec_node gn = cn, gb = cb;
  gn.in = gin, gb.in = gin, gn.out.data = go, gn.out.dtype = adt, gb.out.data = gp, gb.out.dtype = gdt;
  ctx_scratch(kc_kda_scratch(&gb) + 256);
  if (gpu_pair(name, &gn, &gb)) {
    double tol = adt == KDA_BF16 || gdt == KDA_BF16 ? 0.01 : 1e-5;
    vf y2 = host_store(go, adt, ny), pk2 = host_store(gp, gdt, np);
    vf rdx = slice(pk, 0, ny), xdx = slice(pk2, 0, ny), rdw = slice(pk, ny, C * W), xdw = slice(pk2, ny, C * W);
    verdict(name, {{"y", &y, &y2, adt == KDA_BF16 ? 0.01 : 1e-5, 0}, {"dx", &rdx, &xdx, tol, 0}, {"dw", &rdw, &xdw, tol, 0}});
    rerun_identical(name, "bit-identical on re-run", &gb, gp, (size_t)np * (gdt == KDA_BF16 ? 2 : 4));
  }
  cudaFree(dx_), cudaFree(dw_), cudaFree(ddy), cudaFree(go), cudaFree(gp);
}

static void node_tests() {
  cudaDeviceProp pr;
  CK(cudaGetDeviceProperties(&pr, 0));
  g_ctx.stream = nullptr, g_ctx.num_sms = pr.multiProcessorCount;
  spec lay = {2, 150, 2, 4, 64, 64, 64, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, {}};   /* layer flags, GVA */
  spec pre = {2, 130, 2, 2, 64, 64, 64, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, {}};   /* pre-gated */
  run_node_kda("node KDA bf16 storage, f32 packed grad (the plan's case), layer flags GVA", lay, KDA_BF16, KDA_F32);
  run_node_kda("node KDA bf16 storage, bf16 packed grad", lay, KDA_BF16, KDA_BF16);
  run_node_kda("node KDA f32 storage (graph inputs), f32 grad", lay, KDA_F32, KDA_F32);
  run_node_kda("node KDA pre-gated bf16, K=V=64", pre, KDA_BF16, KDA_F32);
  spec odd = {1, 151, 1, 1, 64, 64, 64, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, {}};   /* 151 dbeta: a tail */
  run_node_kda("node KDA f32 packed grad, 151 tokens (the widening's 8-element groups and tail)", odd, KDA_BF16, KDA_F32);
  run_node_kda("node KDA f32 storage, 151 tokens (the narrowing's groups and tail)", odd, KDA_F32, KDA_F32);
  spec big = {1, 200, 2, 2, 128, 128, 64, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, {}};
  run_node_kda("node KDA K=V=128 layer flags", big, KDA_BF16, KDA_F32);
  run_node_kda("node KDA bf16 storage, f32 packed grad, layer flags GVA, precise_gate", lay, KDA_BF16, KDA_F32, 1);
  run_node_conv("node CONV1D f32 W=4 silu", 2, 100, 96, 4, 1, KDA_F32, KDA_F32);
  run_node_conv("node CONV1D bf16 W=4 silu, f32 packed grad", 2, 130, 200, 4, 1, KDA_BF16, KDA_F32);
  run_node_conv("node CONV1D bf16 W=4 silu, bf16 grad, 3 tiles of 128 tokens (run kernels)", 3, 300, 256, 4, 1, KDA_BF16, KDA_BF16);
  run_node_conv("node CONV1D f32 storage, bf16 grad W=4 no silu, C=66 (a part channel tile)", 2, 129, 66, 4, 0, KDA_F32, KDA_BF16);
  run_node_conv("node CONV1D bf16 W=4 silu C=33 (odd: the general kernels)", 2, 90, 33, 4, 1, KDA_BF16, KDA_F32);
  run_node_conv("node CONV1D bf16 x, f32 dy (the layer's case) W=4 silu, f32 grad", 2, 260, 128, 4, 1, KDA_BF16, KDA_F32, KDA_F32);
  run_node_conv("node CONV1D bf16 W=3 no silu", 3, 70, 33, 3, 0, KDA_BF16, KDA_BF16);
  run_node_conv("node CONV1D f32 W=8 silu T=5", 2, 5, 40, 8, 1, KDA_F32, KDA_F32);
  run_node_conv("node CONV1D f32 W=1", 1, 64, 32, 1, 0, KDA_F32, KDA_F32);
}

/* error path: a workspace that is too small must be refused with a message */
static void run_errors() {
  kda_kda_args a = {};
  a.B = 1, a.T = 64, a.H = 1, a.HV = 1, a.K = 64, a.V = 64, a.chunk = 64;
  int rc = kda_kda_cuda_forward(&a, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                nullptr, nullptr, nullptr, nullptr, 0, nullptr);
  if (rc == -1 && strstr(kda_last_error(), "workspace")) printf("ok - small workspace refused\n"), npass++;
  else printf("FAIL - small workspace refused: rc=%d %s\n", rc, kda_last_error()), nfail++;
  a.keep = 1;   /* a forward that keeps needs the backward's workspace */
  int64_t fb = kda_kda_cuda_workspace_bytes(&a, 0);
  rc = kda_kda_cuda_forward(&a, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                            nullptr, nullptr, nullptr, (void *)256, fb, nullptr);
  if (rc == -1 && strstr(kda_last_error(), "keep")) printf("ok - keep with a forward-sized workspace refused\n"), npass++;
  else printf("FAIL - keep with a forward-sized workspace refused: rc=%d %s\n", rc, kda_last_error()), nfail++;
  a.keep = 0;
  a.chunk = 48;
  rc = kda_kda_cuda_forward(&a, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                            nullptr, nullptr, nullptr, nullptr, 0, nullptr);
  if (rc == -1 && strstr(kda_last_error(), "chunk")) printf("ok - chunk 48 refused\n"), npass++;
  else printf("FAIL - chunk 48 refused: rc=%d %s\n", rc, kda_last_error()), nfail++;
}

static void all_cases() {
  /*  B  T  H HV  K   V  C  gm bm l2 h0 dht scale lb gscale mask betac cu */
  int64_t Ts[] = {1, 15, 16, 17, 63, 64, 65, 127, 128, 500};
  for (int64_t T : Ts) {
    char nm[96];
    snprintf(nm, sizeof nm, "T=%lld B=2 H=2 K=V=64 pre-gated h0 dht", (long long)T);
    run_case(nm, {2, T, 2, 2, 64, 64, 64, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, {}});
  }
  run_case("K=V=128 T=300 H=4, layer flags (softplus gate, l2, sigmoid)",
           {1, 300, 4, 4, 128, 128, 64, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, {}});
  /* the final kernel stages the chain's A_log and dt_bias at the compiled K, zero-filled when NULL
   * (the softplus gate needs A_log; the lower-bound one takes neither). Seeded: the cases after it
   * draw what they drew before it was added */
  run_case("K=V=64 lower-bound gate, no A_log, dt_bias", {2, 150, 2, 2, 64, 64, 64, 2, 1, 1, 0, 0, 0, -3, 1, 0, 0, {}, 1},
           0x5eed68);
  /* k_gate_reduce's warps take 8 chunks each, 256 a pass: past 256 chunks each warp loops, as
   * at the bench shapes (256 to 4096 chunks), where the other cases have far fewer. Seeded as
   * the case above; the precise backward, whose dA_log (a sum over 16896 tokens) is held to 0.05
   * where the fast one's cancellation could reach its 0.25 bar */
  run_case("softplus gate, 264 chunks (k_gate_reduce past one pass), precise_gate",
           {33, 512, 1, 1, 32, 32, 64, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, {}}, 0x5eed69, 0, 1);
  run_case("K=V=128 chunk 32", {1, 200, 2, 2, 128, 128, 32, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, {}});
  run_case("K=V=64 chunk 16", {1, 100, 1, 1, 64, 64, 16, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, {}});
  run_case("K=100 V=60 (non-power-of-2)", {2, 130, 1, 1, 100, 60, 64, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, {}});
  /* K % 4 != 0: with H == HV the final kernel's l2-norm backward at a partial lane row, with GVA
   * the general one (k_qk_bwd: version 2 runs it only where H != HV or K > 128); K = 256: the
   * vector one's second column group */
  run_case("K=30 V=20 (K % 4 != 0)", {1, 100, 2, 2, 30, 20, 64, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, {}});
  run_case("K=30 V=20 GVA H=1 HV=2 (k_qk_bwd)", {1, 100, 1, 2, 30, 20, 64, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, {}});
  run_case("K=256 V=64 chunk 32", {1, 100, 1, 1, 256, 64, 32, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, {}});
  run_case("K=100 V=60 chunk 32 softplus gate (precise backward, padded tiles)",
           {2, 130, 1, 1, 100, 60, 32, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, {}}, 0, 0, 1);
  run_case("K=V=128 T=300 H=4, layer flags, precise_gate", {1, 300, 4, 4, 128, 128, 64, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, {}}, 7, 0, 1);
  run_case("K=128 V=256 (expand_v 2)", {1, 150, 1, 1, 128, 256, 64, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, {}});
  run_case("H=HV=1 B=8", {8, 70, 1, 1, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, {}});
  run_case("GVA H=2 HV=4 K=64", {2, 200, 2, 4, 64, 64, 64, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, {}});
  run_case("GVA H=2 HV=8 K=128", {1, 130, 2, 8, 128, 128, 64, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, {}});
  run_case("varlen 1,15,64,65,256 h0 dht", {1, 401, 2, 2, 64, 64, 64, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, {0, 1, 16, 80, 145, 401}});
  run_case("varlen 15,85,200 + layer flags", {1, 300, 1, 2, 128, 128, 64, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, {0, 15, 100, 300}});
  run_case("decay g=0 (DeltaNet limit)", {1, 200, 1, 1, 64, 64, 64, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, {}});
  run_case("decay weak (logsigmoid/10)", {1, 200, 1, 1, 64, 64, 64, 0, 0, 0, 1, 1, 0, 0, 0.1f, 0, 0, {}});
  run_case("decay strong (logsigmoid*10)", {1, 200, 1, 1, 64, 64, 64, 0, 0, 0, 1, 1, 0, 0, 10, 0, 0, {}});
  /* logsigmoid*3.6: every chunk steep (span ~180 > CHUNK_SPAN), and ~30% of the 16-row blocks
   * decay by more than k_intra_tc's DIAG_SPAN (64) within the block, so both of its per-block
   * diagonal forms (in the MMA, exact per pair) run here */
  run_case("decay steep and gentle blocks (logsigmoid*3.6)", {1, 400, 2, 2, 64, 64, 64, 0, 0, 0, 1, 1, 0, 0, 3.6f, 0, 0, {}});
  /* logsigmoid*2.1: a chunk's decay span (max over key dims) is ~110-140, around CHUNK_SPAN
   * (128): flat chunks (k_intra_tc's whole-chunk product) and steep ones (its per-block
   * form) in one call, at both compiled head sizes */
  run_case("decay flat and steep chunks (logsigmoid*2.1) K=V=64", {1, 640, 2, 2, 64, 64, 64, 0, 0, 0, 1, 1, 0, 0, 2.1f, 0, 0, {}});
  run_case("decay flat and steep chunks (logsigmoid*2.1) K=V=128", {1, 640, 2, 2, 128, 128, 64, 0, 0, 1, 1, 1, 0, 0, 2.1f, 0, 0, {}});
  run_case("decay -1000 entries (p=0.5)", {1, 200, 1, 1, 64, 64, 64, 0, 0, 0, 1, 1, 0, 0, 1, 0.5f, 0, {}});
  run_case("decay all -1000 (chunks decay to 0)", {1, 130, 1, 1, 64, 64, 64, 0, 0, 0, 1, 1, 0, 0, 1, 1.f, 0, {}});
  /* dbeta's worst cancellation (the precision fixes' case) at K = V = 128, where the wgmma
   * kernels and the fused sweep's bf16 hand-offs run (dW feeds both of dbeta's cancelling terms) */
  run_case("decay -1000 entries (p=0.5) K=V=128", {1, 200, 1, 1, 128, 128, 64, 0, 0, 0, 1, 1, 0, 0, 1, 0.5f, 0, {}});
  run_case("lower-bound gate lb=-5", {1, 200, 2, 2, 128, 128, 64, 2, 1, 1, 1, 1, 0, -5, 1, 0, 0, {}});
  run_case("lower-bound gate lb=-0.1, 2 sigmoid beta", {1, 200, 1, 1, 64, 64, 64, 2, 2, 1, 1, 1, 0, -0.1f, 1, 0, 0, {}});
  /* dA_log / ddt_bias precision, strict. With H = 1, dA_log is one scalar: a mixed-sign sum of
   * dg x over all tokens and key dims, whose relative error is dg's times a cancellation ratio
   * that depends on the draw (~1 to ~60); ddt_bias likewise per key dim. Four fixed draws (seeds,
   * not the shared stream, so `quick "lower-bound gate"` sees the same inputs as the full run),
   * dA_log failing above 0.003 on every path: these run the precise backward (precise_gate).
   * Seed 12 has |dA_log| = 0.03 (strongest cancellation of seeds 1-24). The fast backward (the
   * layer's default, fla's precision) measured on the H200 (2026-12-04a): dA_log 3.8e-3, 4.2e-4,
   * 5.4e-3, 1.1e-1 (three over 0.003), ddt_bias <= 3.3e-3; the precise backward <= 4e-6; fp32
   * (version 1) <= 3e-7. */
  const uint64_t lbseeds[4] = {1, 2, 3, 12};
  for (uint64_t sd : lbseeds) {
    char nm[96];
    snprintf(nm, sizeof nm, "lower-bound gate lb=-0.1 H=1 draw seed=%llu (strict dA_log)", (unsigned long long)sd);
    run_case(nm, {1, 200, 1, 1, 64, 64, 64, 2, 2, 1, 1, 1, 0, -0.1f, 1, 0, 0, {}}, sd, 1);
  }
  run_case("beta = 1e-4", {1, 130, 1, 1, 64, 64, 64, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1e-4f, {}});
  run_case("beta = 1", {1, 130, 1, 1, 64, 64, 64, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1.f, {}});
  run_case("scale 1", {1, 130, 1, 1, 64, 64, 64, 0, 0, 0, 1, 1, 1.f, 0, 1, 0, 0, {}});
  run_case("scale 0.1, no h0, no dht", {1, 130, 1, 1, 64, 64, 64, 0, 0, 0, 0, 0, 0.1f, 0, 1, 0, 0, {}});
  if (!quick) run_case("long T=2048 K=V=128", {1, 2048, 1, 1, 128, 128, 64, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, {}});
  run_decode("decode T=1 B=4 H=2 HV=4 K=V=128 (layer flags)", {4, 1, 2, 4, 128, 128, 64, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, {}});
  run_decode("decode T=20 B=2 K=64 V=96 pre-gated", {2, 20, 1, 1, 64, 96, 64, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, {}});
  run_decode("decode varlen 3,1,12 lower-bound", {1, 16, 1, 1, 64, 64, 64, 2, 2, 1, 1, 0, 0, -5, 1, 0, 0, {0, 3, 4, 16}});
}

/* `test_kda_cuda quick [NAME]`: the tensor-core path only and no T = 2048 case — the run
 * compute-sanitizer (memcheck, racecheck) can afford; with NAME, only the kernel cases whose
 * name holds it (racecheck needs minutes per case). The full test is the default. */
int main(int argc, char **argv) {
  quick = argc > 1 && strcmp(argv[1], "quick") == 0;
  only = quick && argc > 2 ? argv[2] : NULL;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("# no CUDA device: GPU KDA tests skipped\n0 passed, 0 failed\n");
    return 0;
  }
  cudaDeviceProp pr;
  CK(cudaGetDeviceProperties(&pr, 0));
  printf("# device: %s (sm_%d%d)\n", pr.name, pr.major, pr.minor);
  /* the wgmma forward pass, reverse sweep, rows, mat and final kernels (on by default on
   * sm_90) sum in the tensor cores' order: the keep = recompute, flow, wide and 16-column comparisons are bit for bit on the
   * mma.sync kernels, and each K = 128 case checks the wgmma kernels against the CPU reference */
  setenv("KDA_KDA_WG", "0", 1);
  setenv("KDA_KDA_MATWG", "0", 1);
  setenv("KDA_KDA_FINALWG", "0", 1);
  setenv("KDA_KDA_WGB", "0", 1);
  setenv("KDA_KDA_ROWSWG", "0", 1);
  double t0 = kda_now();
  const char *paths[4] = {"tensor-core path", "KDA_KDA_SIMPLE=1 (version-1 kernels)",
                          "KDA_KDA_PRECISE=1 KDA_KDA_THREADS=state_bwd=256 (tensor-core path, precise "
                          "backward on every case, its state pass at 256 threads)",
                          "KDA_KDA_ROWS_VN=0 KDA_KDA_ROWS_SEP=0 KDA_KDA_COMPACT=0 KDA_KDA_THREADS=rows=512 "
                          "KDA_KDA_STATE_DB=0 KDA_KDA_KV=0 (tensor-core path, the rows kernel with Vn "
                          "staged after dW (precise: one S0/dS tile) at 512 threads, wide layouts, the "
                          "state passes' single tile set, the run-time shapes)"};
  for (int path = 0; path < (quick ? 1 : 4); path++) {
    if (path == 1) setenv("KDA_KDA_SIMPLE", "1", 1);
    else unsetenv("KDA_KDA_SIMPLE");
    if (path == 2) setenv("KDA_KDA_PRECISE", "1", 1), setenv("KDA_KDA_THREADS", "state_bwd=256", 1);
    if (path == 3)
      unsetenv("KDA_KDA_PRECISE"), setenv("KDA_KDA_ROWS_VN", "0", 1), setenv("KDA_KDA_ROWS_SEP", "0", 1),
      setenv("KDA_KDA_COMPACT", "0", 1),
      setenv("KDA_KDA_THREADS", "rows=512", 1), setenv("KDA_KDA_STATE_DB", "0", 1),
      setenv("KDA_KDA_KV", "0", 1);
    printf("# --- %s ---\n", paths[path]);
    all_cases();
    if (!only) node_tests();
  }
  unsetenv("KDA_KDA_SIMPLE");
  unsetenv("KDA_KDA_ROWS_SEP");
  unsetenv("KDA_KDA_ROWS_VN");
  unsetenv("KDA_KDA_COMPACT");
  unsetenv("KDA_KDA_THREADS");
  unsetenv("KDA_KDA_STATE_DB");
  unsetenv("KDA_KDA_KV");
  if (!only) run_errors();
  printf("# %.1f s\n%d passed, %d failed\n", kda_now() - t0, npass, nfail);
  return nfail ? 1 : 0;
}
