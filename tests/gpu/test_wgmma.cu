/* test_wgmma.cu — kernels/kda_wgmma.cuh's swizzled layout, descriptors and fragment map against
 * the CPU, on one warpgroup (H100 / H200 only: sm_90a). D = A B with A 64 x 128 (K-major, two
 * 64-column atoms: the k steps cross from one to the next) and B 128 x N stored K-major
 * ([n][k]) or MN-major ([k][n], the transpose bit), N = 64 or 32 from a column offset n0 (the
 * descriptors of a row offset, and of the second atom of an MN-major tile, as
 * kda_state_wg.cu's kg). Operands are multiples of 1/4 in [-2, 2], so every product and sum is
 * exact in fp32: D must match bit for bit. The tf32 form (fp32 tiles, both operands K-major,
 * kda_mat_wg.cu's, kda_final_wg.cu's; N = 64, 32, 16) likewise; and the MN-major A operand and the negated one (the reverse
 * sweep's). Ends with "N passed, N failed". */
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include "kda_wgmma.cuh"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  printf("FAIL - %s: %s\n", #x, cudaGetErrorString(e_)); printf("0 passed, 1 failed\n"); exit(1); } } while (0)

enum { M = 64, KD = 128, NB = 128 };
/* thread t's accumulators (kda_wgmma.cuh's fragment map) into d [M][N] */
template <int N> static __device__ void store_frag(float *d, const float (&acc)[N / 2], int t) {
  int wq = t >> 5, l = t & 31;
  for (int j = 0; j < N / 8; j++)
    for (int q = 0; q < 4; q++)
      d[(16 * wq + (l >> 2) + 8 * (q >> 1)) * N + 8 * j + 2 * (l & 3) + (q & 1)] = acc[4 * j + q];
}
/* d: [M][N] fp32; TB: B stored MN-major; n0: the B tile's first column; TA: A stored MN-major
 * ([k][m], its 64 columns one atom); SA = -1: D = -A B */
template <int N, int TB, int TA = 0, int SA = 1>
__global__ void k_wg_test(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *d, int lbo_b, int sbo_b, int n0) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t raw[];   /* rounded up to the swizzle's 1024-byte alignment */
  __nv_bfloat16 *As = (__nv_bfloat16 *)(raw + ((1024 - (__cvta_generic_to_shared(raw) & 1023)) & 1023)), *Bs = As + M * KD;
  int t = threadIdx.x;
  for (int e = t; e < M * KD; e += 128) As[TA ? wg_off<KD>(e % KD, e / KD) : wg_off<M>(e / KD, e % KD)] = a[e];   /* a: [m][k] */
  for (int e = t; e < NB * KD; e += 128) {
    int n = e / KD, k = e % KD;                                                           /* b: [n][k] */
    Bs[TB ? wg_off<KD>(k, n) : wg_off<NB>(n, k)] = b[e];
  }
  wg_proxy_fence();
  __syncthreads();
  float acc[N / 2];
  for (int i = 0; i < N / 2; i++) acc[i] = 0.f;
  wg_fence();
  for (int ks = 0; ks < KD / 16; ks++) {
    uint64_t da = TA ? wg_desc(As + wg_off<KD>(16 * ks, 0), 128 * KD, 1024) : wg_desc(As + wg_off<M>(0, 16 * ks), 16, 1024);
    const __nv_bfloat16 *bp = TB ? Bs + wg_off<KD>(16 * ks, n0) : Bs + wg_off<NB>(n0, 16 * ks);
    uint64_t db = wg_desc(bp, lbo_b, sbo_b);
    if constexpr (N == 64) wg_m64n64k16<TB, TA, SA>(acc, da, db, ks > 0);
    else wg_m64n32k16<TB, TA, SA>(acc, da, db, ks > 0);
  }
  wg_commit();
  wg_wait<0>();
  store_frag<N>(d, acc, t);
#else
  __trap();
#endif
}

/* tf32: A 64 x 64 and B (64 rows n, 64 columns k) fp32, both K-major (two 32-column atoms: the
 * k steps cross from one to the next), D = A B^T's columns n0 .. n0 + N */
enum { KF = 64, NF = 64 };
template <int N>
__global__ void k_wgf_test(const float *a, const float *b, float *d, int n0) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t raw[];
  float *As = (float *)(raw + ((1024 - (__cvta_generic_to_shared(raw) & 1023)) & 1023)), *Bs = As + M * KF;
  int t = threadIdx.x;
  for (int e = t; e < M * KF; e += 128) As[wf_off<M>(e / KF, e % KF)] = a[e];
  for (int e = t; e < NF * KF; e += 128) Bs[wf_off<NF>(e / KF, e % KF)] = b[e];
  wg_proxy_fence();
  __syncthreads();
  float acc[N / 2];
  for (int i = 0; i < N / 2; i++) acc[i] = 0.f;
  const uint64_t da = wg_desc(As, 16, 1024), db = wg_desc(Bs, 16, 1024) + (uint64_t)(n0 * 128 / 16);
  wg_fence();
  for (int k0 = 0; k0 < KF; k0 += 8) {
    if constexpr (N == 64) wg_tf_m64n64k8(acc, da + WF_KADV(k0), db + WF_KADV(k0), k0 > 0);
    else if constexpr (N == 32) wg_tf_m64n32k8(acc, da + WF_KADV(k0), db + WF_KADV(k0), k0 > 0);
    else wg_tf_m64n16k8(acc, da + WF_KADV(k0), db + WF_KADV(k0), k0 > 0);
  }
  wg_commit();
  wg_wait<0>();
  store_frag<N>(d, acc, t);
#else
  __trap();
#endif
}

static int npass, nfail;
/* d (M x N) against sa A B^T's columns n0 .. n0 + N, exactly (a [M][kd], b [.][kd] on the host) */
static void judge(const char *what, const std::vector<float> &d, const std::vector<float> &a, const std::vector<float> &b,
                  int N, int kd, int n0, float sa) {
  int bad = 0;
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      float r = 0.f;
      for (int k = 0; k < kd; k++) r += a[m * kd + k] * b[(n0 + n) * kd + k];
      if (d[m * N + n] != sa * r) bad++;
    }
  if (!bad) printf("ok - %s\n", what), npass++;
  else printf("FAIL - %s: %d of %d outputs differ\n", what, bad, M * N), nfail++;
}
template <int N, int TB, int TA = 0, int SA = 1>
static void run(const char *what, const std::vector<float> &a, const std::vector<float> &b, int lbo, int sbo, int n0) {
  std::vector<__nv_bfloat16> ah(a.size()), bh(b.size());
  for (size_t i = 0; i < a.size(); i++) ah[i] = __float2bfloat16(a[i]);
  for (size_t i = 0; i < b.size(); i++) bh[i] = __float2bfloat16(b[i]);
  __nv_bfloat16 *ad, *bd;
  float *dd;
  CK(cudaMalloc(&ad, ah.size() * 2)); CK(cudaMalloc(&bd, bh.size() * 2)); CK(cudaMalloc(&dd, M * N * 4));
  CK(cudaMemcpy(ad, ah.data(), ah.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(bd, bh.data(), bh.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(dd, 0xff, M * N * 4));
  size_t smb = (M + NB) * KD * 2 + 1024;
  CK(cudaFuncSetAttribute(k_wg_test<N, TB, TA, SA>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smb));
  k_wg_test<N, TB, TA, SA><<<1, 128, smb>>>(ad, bd, dd, lbo, sbo, n0);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> d(M * N);
  CK(cudaMemcpy(d.data(), dd, M * N * 4, cudaMemcpyDeviceToHost));
  cudaFree(ad), cudaFree(bd), cudaFree(dd);
  judge(what, d, a, b, N, KD, n0, SA);
}

template <int N>
static void run_tf(const char *what, const std::vector<float> &a, const std::vector<float> &b, int n0) {
  float *ad, *bd, *dd;
  CK(cudaMalloc(&ad, M * KF * 4)); CK(cudaMalloc(&bd, NF * KF * 4)); CK(cudaMalloc(&dd, M * N * 4));
  CK(cudaMemcpy(ad, a.data(), M * KF * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(bd, b.data(), NF * KF * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dd, 0xff, M * N * 4));
  size_t smb = (M + NF) * KF * 4 + 1024;
  CK(cudaFuncSetAttribute(k_wgf_test<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smb));
  k_wgf_test<N><<<1, 128, smb>>>(ad, bd, dd, n0);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> d(M * N);
  CK(cudaMemcpy(d.data(), dd, M * N * 4, cudaMemcpyDeviceToHost));
  cudaFree(ad), cudaFree(bd), cudaFree(dd);
  judge(what, d, a, b, N, KF, n0, 1.f);
}

int main() {
  int dev = 0;
  cudaDeviceProp pr;
  CK(cudaGetDeviceProperties(&pr, dev));
  if (pr.major != 9) {
    printf("# skipped: wgmma needs compute capability 9.0 (this device is %d.%d)\n0 passed, 0 failed\n", pr.major, pr.minor);
    return 0;
  }
  srand(7);
  std::vector<float> a(M * KD), b(NB * KD);
  for (auto &x : a) x = (rand() % 17 - 8) / 4.f;
  for (auto &x : b) x = (rand() % 17 - 8) / 4.f;
  run<64, 0>("wgmma m64n64k16 x 8, K-major A and B (two atoms along k)", a, b, 16, 1024, 0);
  run<32, 0>("wgmma m64n32k16 x 8, K-major B from its row 32", a, b, 16, 1024, 32);
  /* MN-major B: its 64-column atoms 128 KD bytes apart (the leading offset), eight k rows 1024
   * bytes (the stride offset) */
  run<64, 1>("wgmma m64n64k16 x 8, MN-major B (transpose bit), its second atom", a, b, 128 * KD, 1024, 64);
  run<64, 1>("wgmma m64n64k16 x 8, MN-major B, its first atom", a, b, 128 * KD, 1024, 0);
  run<32, 1>("wgmma m64n32k16 x 8, MN-major B, half an atom", a, b, 128 * KD, 1024, 0);
  /* kda_state_wg.cu's reverse sweep: Aqk as an MN-major B from column 32 of an atom (its
   * second warpgroup), dO as an MN-major A, -dVn by the negated A */
  run<32, 1>("wgmma m64n32k16 x 8, MN-major B from column 32 of an atom", a, b, 128 * KD, 1024, 32);
  run<32, 1, 1>("wgmma m64n32k16 x 8, MN-major A and B", a, b, 128 * KD, 1024, 32);
  run<64, 1, 1>("wgmma m64n64k16 x 8, MN-major A and B, the second atom", a, b, 128 * KD, 1024, 64);
  run<64, 1, 0, -1>("wgmma m64n64k16 x 8, D = -A B (scale-a -1)", a, b, 128 * KD, 1024, 64);
  /* tf32 (fp32 tiles, kda_mat_wg.cu): multiples of 1/4 in [-2, 2] are exact in tf32 */
  std::vector<float> af(M * KF), bf(NF * KF);
  for (auto &x : af) x = (rand() % 17 - 8) / 4.f;
  for (auto &x : bf) x = (rand() % 17 - 8) / 4.f;
  run_tf<32>("wgmma tf32 m64n32k8 x 8, K-major A and B (two atoms along k)", af, bf, 0);
  run_tf<32>("wgmma tf32 m64n32k8 x 8, K-major B from its row 32", af, bf, 32);
  run_tf<16>("wgmma tf32 m64n16k8 x 8, K-major B from its row 48", af, bf, 48);
  /* kda_final_wg.cu's row terms: the whole 64-row B tile */
  run_tf<64>("wgmma tf32 m64n64k8 x 8, K-major A and B, the whole B tile", af, bf, 0);
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
