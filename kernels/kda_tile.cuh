/* kda_tile.cuh — the block-level building blocks of the version-2 KDA kernels (kda_tc.cu):
 * block-wide MMA products over shared tiles and the asynchronous staging of tiles.
 *   mma_blk / mma_blk4 / mma_blk4_3x   operands through accessors (any layout, computed values),
 *                                      bf16, tf32 or split-tf32 precision;
 *   mma_ldm                            bf16 tiles through ldmatrix (bt);
 *   mma_tf / mma_tf2                   tf32 from tiles holding tf32-rounded values (tft, ldmatrix)
 *                                      or accessors returning them;
 *   cp_tile_f32 / cp_tile_bf16, batched  global -> shared staging (cp.async, batched loads);
 *   each4 / pairs2, st2f / st2b        epilogues of one output, or of a row's two adjacent
 *                                      outputs in one store.
 * Every product hands its results to an epilogue; the tile-to-warp ownership of each driver
 * is said where it is defined (read-modify-write epilogues rely on it). Included by kda_tc.cu
 * only, after kda_common.cuh; BT is the launch's block size. */
#pragma once
#include <type_traits>
#include <utility>
#include "kda_common.cuh"
#include "mma.cuh"
#include "kda_st16.cuh"
#define BT ((int)blockDim.x)

/* e^x as ex2.approx.ftz of x log2(e): what __expf computes, less its non-ftz wrapper (a range
 * test and two predicated multiplies around each MUFU.EX2, kept so that results below 2^-126
 * come out denormal). Here such results only scale values of order one into fp32 sums, so
 * flushing them to zero changes nothing; ncu of k_bwd_final_tc at (8,2048,16,128) counted the
 * wrapper's FSETP alone at 6.4% of its instructions. H200, one run against __expf: fwd+bwd
 * (8,2048,16,128) 5.10 -> 5.05 ms, (1,8192,16,128) 3.19 -> 3.14, precise 9.52 -> 9.43; the
 * small shapes within noise (0.636 -> 0.635, 0.205 -> 0.207). */
static __device__ __forceinline__ float kexp(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269504f));
  return y;
}
static __device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
/* Precisions of mma_blk: P_BF16 (bf16 operands, 8-bit significands), P_TF32 (11 bits),
 * P_3TF32 (split tf32, "3xTF32": x = hi + lo with hi = tf32(x), lo = tf32(x - hi); the product
 * is hi*hi + hi*lo + lo*hi, operand error ~2^-21 relative: fp32-level, three MMAs per k8 step),
 * P_3TF32A (the same when A is exact in tf32, e.g. bf16 values: the lo(A) term is zero and
 * skipped, two MMAs per k8 step). The precise backward (see "precise backward" below) runs
 * every product that feeds the gate gradient in P_3TF32(A). */
enum { P_BF16 = 0, P_TF32 = 1, P_3TF32 = 2, P_3TF32A = 3 };
/* hi, lo tf32 halves of x. The mask: lo = x - hi needs hi's exact tf32 value, and the PTX ISA
 * does not promise zero low bits in the cvt's .b32 result; lo needs none (whatever its low
 * bits do in the MMA is below 2^-11 |lo| <= 2^-22 |x|) */
static __device__ __forceinline__ void split_tf32(float x, uint32_t &hi, uint32_t &lo) {
  hi = to_tf32(x) & 0xffffe000u;
  lo = to_tf32(x - __uint_as_float(hi));
}
static __device__ __forceinline__ void mma_tf32(float &c0, float &c1, float &c2, float &c3, const uint32_t *a,
                                                const uint32_t *b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* C[i][j] = sum_{k < Kd} A(i,k) B(k,j) for i < M, j < N, handed to E(i, j, c) once each.
 * M % 16 == 0, N % 8 == 0, Kd % 16 == 0; the accessors return fp32 and must return 0 past the
 * real extents (callers zero-pad their shared tiles). Warp w owns the 16x8 tiles t with
 * t % nwarps == w, so two calls with the same (M, N) give every element the same thread: an
 * epilogue may read-modify-write what an earlier such call wrote without a barrier.
 * Fragment layouts: PTX ISA, mma.m16n8k16 (.bf16) and mma.m16n8k8 (.tf32), g = lane/4,
 * t = lane%4. Operands come from shared memory by scalar loads (no ldmatrix: the tiles have
 * arbitrary transposes); each MMA needs 12 (bf16) or 2x6 (tf32) loads per thread.
 * P_3TF32, P_3TF32A run in mma_blk4_3x (same tiles and ownership).
 * L (optional): the epilogue's global loads. L(i, j) (the E4 arguments' i, j) runs before the
 * tile's MMAs and its result is E4's seventh argument, so a read-modify-write epilogue's L2
 * latency hides behind the products instead of following them (ncu: long-scoreboard stalls
 * were 41% of k_bwd_final_tc's samples, its epilogues' global reads).                     */
struct no_pre {
  __device__ int operator()(int, int) const { return 0; }
};
template <class FL, class FE>
static __device__ __forceinline__ void epi_call(FE &E4, int i, int j, float c0, float c1, float c2, float c3,
                                                const decltype(std::declval<FL>()(0, 0)) &pre) {
  if constexpr (std::is_same<FL, no_pre>::value) E4(i, j, c0, c1, c2, c3);
  else E4(i, j, c0, c1, c2, c3, pre);
}
template <int P, class FA, class FB, class FE, class FL = no_pre>
static __device__ __forceinline__ void mma_blk4_3x(int M, int N, int Kd, FA A, FB B, FE E4, int kbx = 0,
                                                   FL L = FL());
template <int P, class FA, class FB, class FE, class FL = no_pre>
static __device__ __forceinline__ void mma_blk4(int M, int N, int Kd, FA A, FB B, FE E4, FL L = FL()) {
  if constexpr (P == P_3TF32 || P == P_3TF32A) {
    mma_blk4_3x<P>(M, N, Kd, A, B, E4, 0, L);
    return;
  }
  int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, nw = blockDim.x >> 5;
  int tn = N >> 3, nt = (M >> 4) * tn;
  for (int tile = threadIdx.x >> 5; tile < nt; tile += nw) {
    int i0 = (tile / tn) << 4, j0 = (tile % tn) << 3;
    const auto pre = L(i0 + g, j0 + 2 * t);
    float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
    for (int k0 = 0; k0 < Kd; k0 += 16) {
      if (P == P_BF16) {
        int ka = k0 + 2 * t;
        uint32_t a[4] = {pack_bf16(A(i0 + g, ka), A(i0 + g, ka + 1)), pack_bf16(A(i0 + g + 8, ka), A(i0 + g + 8, ka + 1)),
                         pack_bf16(A(i0 + g, ka + 8), A(i0 + g, ka + 9)),
                         pack_bf16(A(i0 + g + 8, ka + 8), A(i0 + g + 8, ka + 9))};
        mma16816(c, a, pack_bf16(B(ka, j0 + g), B(ka + 1, j0 + g)), pack_bf16(B(ka + 8, j0 + g), B(ka + 9, j0 + g)));
      } else {
#pragma unroll
        for (int kk = 0; kk < 16; kk += 8) {
          int ka = k0 + kk + t;
          uint32_t a[4] = {to_tf32(A(i0 + g, ka)), to_tf32(A(i0 + g + 8, ka)), to_tf32(A(i0 + g, ka + 4)),
                           to_tf32(A(i0 + g + 8, ka + 4))};
          uint32_t b[2] = {to_tf32(B(ka, j0 + g)), to_tf32(B(ka + 4, j0 + g))};
          mma_tf32(c[0], c[1], c[2], c[3], a, b);
        }
      }
    }
    epi_call<FL>(E4, i0 + g, j0 + 2 * t, c[0], c[1], c[2], c[3], pre);
  }
}
/* mma_blk4 for P_3TF32 / P_3TF32A: the same tiles, thread ownership and epilogue calls; per k8
 * step three MMAs (lo(A) hi(B), hi(A) lo(B), hi(A) hi(B): small terms first), two for P_3TF32A.
 * kbx: B is exact in tf32 (bf16 data) for k < kbx (a multiple of 8): there lo(B) = 0 and the
 * hi(A) lo(B) MMA, which would add exact zeros, is skipped (the same sums) */
template <int P, class FA, class FB, class FE, class FL>
static __device__ __forceinline__ void mma_blk4_3x(int M, int N, int Kd, FA A, FB B, FE E4, int kbx, FL L) {
  int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, nw = blockDim.x >> 5;
  int tn = N >> 3, nt = (M >> 4) * tn;
  for (int tile = threadIdx.x >> 5; tile < nt; tile += nw) {
    int i0 = (tile / tn) << 4, j0 = (tile % tn) << 3;
    const auto pre = L(i0 + g, j0 + 2 * t);
    constexpr bool LOA = P != P_3TF32A;            /* LOA: lo(A) may be nonzero */
    float c[4] = {};
#pragma unroll 2
    for (int k0 = 0; k0 < Kd; k0 += 8) {
      int ka = k0 + t;
      bool bx = k0 < kbx;
      float xa[4] = {A(i0 + g, ka), A(i0 + g + 8, ka), A(i0 + g, ka + 4), A(i0 + g + 8, ka + 4)};
      float xb[2] = {B(ka, j0 + g), B(ka + 4, j0 + g)};
      uint32_t ah[4], al[4], bh[2], bl[2];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        if (LOA) split_tf32(xa[u], ah[u], al[u]);
        else ah[u] = to_tf32(xa[u]) & 0xffffe000u;   /* exact: lo(A) = 0 */
      }
      if (bx) bh[0] = to_tf32(xb[0]) & 0xffffe000u, bh[1] = to_tf32(xb[1]) & 0xffffe000u;
      else split_tf32(xb[0], bh[0], bl[0]), split_tf32(xb[1], bh[1], bl[1]);
      if (LOA) mma_tf32(c[0], c[1], c[2], c[3], al, bh);
      if (!bx) mma_tf32(c[0], c[1], c[2], c[3], ah, bl);
      mma_tf32(c[0], c[1], c[2], c[3], ah, bh);
    }
    epi_call<FL>(E4, i0 + g, j0 + 2 * t, c[0], c[1], c[2], c[3], pre);
  }
}
/* mma_blk4 hands the epilogue a thread's four outputs at once: E4(i, j, C[i][j], C[i][j+1],
 * C[i+8][j], C[i+8][j+1]), so a read-modify-write epilogue can issue its global loads together
 * (one latency per tile instead of four: the compiler cannot move a load above the previous
 * element's store, it cannot prove they do not alias). mma_blk: one element per call. */
template <int P, class FA, class FB, class FE>
static __device__ __forceinline__ void mma_blk(int M, int N, int Kd, FA A, FB B, FE E) {
  mma_blk4<P>(M, N, Kd, A, B, [&](int i, int j, float c0, float c1, float c2, float c3) {
    E(i, j, c0);
    E(i, j + 1, c1);
    E(i + 8, j, c2);
    E(i + 8, j + 1, c3);
  });
}

/* ---- staging helpers: memory-level parallelism ------------------------------------------------
 * Every v2 kernel spent most of its time waiting on global loads one at a time: a staging loop
 * "smem[e] = f(global[e])" with a runtime trip count issues one load, waits ~0.5-1 us, stores,
 * and goes on, so 8 warps keep ~3 KB in flight per SM where ~30 KB are needed to use the SM's
 * share of HBM bandwidth (Little's law). Two cures, both value-preserving (same bytes land in
 * the same places, so the results are bit-identical to the plain loops):
 *   cp.async (sm_80+): 16-byte (or 4-byte) asynchronous global->shared copies, all in flight at
 *     once, zero-filled past the valid rows / columns (src-size 0 reads nothing);
 *   batched<U>: U loads per thread issued before their stores (for tiles that need a conversion). */
/* dst[r*ds + c] = r < rows && c < cols ? rowp(r)[c] : 0 for r < R, c < Cp (fp32, asynchronous).
 * Cp % 4 == 0, ds % 4 == 0, dst 16-byte aligned; rowp(r) is only called for r < rows, and
 * rowp(0) serves as the (unread) address of zero-filled copies. 16-byte copies when cols % 4 == 0
 * and the row pointers are 16-byte aligned (al: caller's check), else 4-byte copies. By every
 * thread of the block, or (tid >= 0) by a group of nth threads, this one the group's tid-th. */
template <class RP>
static __device__ __forceinline__ void cp_tile_f32(float *dst, int ds, int R, int Cp, int rows, int cols,
                                                   bool al, RP rowp, int tid = -1, int nth = 0) {
  if (tid < 0) tid = threadIdx.x, nth = BT;        /* else thread tid of the nth doing it */
  if (al && cols % 4 == 0) {
    int c4 = Cp >> 2;
    /* the same copies a thread as the loop below, a row step apart: no division a copy (that
     * loop's index arithmetic was ~70% of the staging's instructions, ncu 2026-12-02s27a). With
     * cp_tile_bf16's the same way, H200, one run: fwd+bwd (8,2048,16,128) 3.179-3.195 ->
     * 3.111-3.114 ms with k_intra_tc's float4 Kb (2026-12-02s27d). Per kernel (ncu, each alone,
     * s27e): k_bwd_final_tc 1295 -> 1271 us, mat and rows unchanged (their staging is waiting,
     * not issuing); final's phase counters said 16.6k -> 7.4k cycles a block for its staging */
    if (nth % c4 == 0) {
      const int c = (tid % c4) << 2, step = nth / c4;
      for (int r = tid / c4; r < R; r += step) {
        bool ok = r < rows && c < cols;
        cp_async16(dst + r * ds + c, ok ? rowp(r) + c : rowp(0), ok);
      }
    } else
      for (int e = tid; e < R * c4; e += nth) {
        int r = e / c4, c = (e % c4) << 2;
        bool ok = r < rows && c < cols;
        cp_async16(dst + r * ds + c, ok ? rowp(r) + c : rowp(0), ok);
      }
  } else {
    for (int e = tid; e < R * Cp; e += nth) {
      int r = e / Cp, c = e % Cp;
      bool ok = r < rows && c < cols;
      cp_async4(dst + r * ds + c, ok ? rowp(r) + c : rowp(0), ok);
    }
  }
}
static __device__ __forceinline__ bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* for e < total: st(e, ld(e)), U loads per thread in flight before the stores */
template <int U, class LD, class ST>
static __device__ __forceinline__ void batched(int total, LD ld, ST st) {
  for (int e0 = threadIdx.x; e0 < total; e0 += U * BT) {
    decltype(ld(0)) x[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (e0 + u * BT < total) x[u] = ld(e0 + u * BT);
#pragma unroll
    for (int u = 0; u < U; u++)
      if (e0 + u * BT < total) st(e0 + u * BT, x[u]);
  }
}

static __host__ __device__ __forceinline__ int r16(int64_t x) { return (int)((x + 15) / 16 * 16); }
typedef __nv_bfloat16 sbf;   /* bf16 shared tiles (pure MMA operands) */
static __device__ __forceinline__ float f(sbf x) { return __bfloat162float(x); }
static __device__ __forceinline__ float f(float x) { return x; }   /* the same accessor on fp32 tiles */
/* ---- ldmatrix MMAs: bf16 tiles (the fast state passes) ---------------------------------------
 * bt: a bf16 shared tile seen as a logical matrix X(r, k) (A: rows i; B: X(k, n)); kc = 1 when
 * k is the contiguous index (A stored [i][ld], B stored [n][ld]), 0 when the other one is
 * (A stored [k][ld] = A transposed, B stored [k][ld]). Rows 16-byte aligned (ld % 8 == 0),
 * zero-padded like the mma_blk tiles. Fragments by ldmatrix (.trans for kc = 0), registers as
 * mma_blk packs them (lower k in the low half): the products are bit-identical to mma_blk's
 * P_BF16 on the same data (same k order). */
struct bt {
  const sbf *p;
  int ld, kc;
};
/* The 16x16 output tiles of an M x N product, warp w taking the tiles t with t % nwarps == w
 * (so every call with the same (M, N) gives an element the same thread): acc(i0, j0, c)
 * accumulates the two 16x8 halves of NP tiles at rows i0[u], columns j0 into c[u][0], c[u][1]
 * (mma C fragments), then E4 gets each half as mma_blk4 hands its tiles. NPM = 2: where a
 * warp's tiles share their columns (nwarps a multiple of N / 16) it takes them two at a time,
 * the two MMA chains interleaved k step by k step with one B fragment (the same sums, the same
 * owners). mma_ldm and mma_tf2 are this loop with their fragments. */
template <int NPM = 1, class FK, class FE, class FL = no_pre>
static __device__ __forceinline__ void warp_tiles16(int M, int N, FK acc, FE E4, FL L = FL()) {
  int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, nw = blockDim.x >> 5;
  int tn = N >> 4, nt = (M >> 4) * tn, tile = threadIdx.x >> 5;
  auto run = [&](auto np) {
    constexpr int NP = decltype(np)::value;
    int i0[NP], j0 = (tile % tn) << 4;
    decltype(L(0, 0)) pre[NP][2];
#pragma unroll
    for (int u = 0; u < NP; u++) {
      i0[u] = ((tile + u * nw) / tn) << 4;
      pre[u][0] = L(i0[u] + g, j0 + 2 * t), pre[u][1] = L(i0[u] + g, j0 + 8 + 2 * t);   /* before the MMAs */
    }
    float c[NP][2][4] = {};
    acc(i0, j0, c);
#pragma unroll
    for (int u = 0; u < NP; u++) {
      epi_call<FL>(E4, i0[u] + g, j0 + 2 * t, c[u][0][0], c[u][0][1], c[u][0][2], c[u][0][3], pre[u][0]);
      epi_call<FL>(E4, i0[u] + g, j0 + 8 + 2 * t, c[u][1][0], c[u][1][1], c[u][1][2], c[u][1][3], pre[u][1]);
    }
  };
  if (NPM == 2 && nw % tn == 0)
    for (; tile + nw < nt; tile += 2 * nw) run(std::integral_constant<int, 2>());
  for (; tile < nt; tile += nw) run(std::integral_constant<int, 1>());
}
/* NP, the tiles of an acc call (the extent of its i0 array) */
#define ACC_NP(i0) ((int)std::extent<std::remove_reference_t<decltype(i0)>>::value)
/* C = A0 B0 (K0) + A1 B1 (K1), K-concatenated in that order (K1 = 0: one product); E4 as
 * mma_blk4's. Tiles as warp_tiles16's: one A fragment feeds two MMAs, three ldmatrix per two
 * MMAs instead of two per one; read-modify-write epilogues need no barrier between calls with
 * the same (M, N), but mma_blk4's ownership differs, so the two must not share such targets.
 * N % 16 == 0. */
/* mma_ldm's k loop for NP 16x16 tiles at rows i0[u], all at columns j0: c[u][0], c[u][1] (C
 * fragments) accumulate the K-concatenated product, one B fragment a k step for the NP tiles
 * (their MMA chains interleaved; the wide state passes take a warp's tiles so); UK: the k
 * loop's unroll (2; 1 in the wide state passes, at 127 of their 128 registers) */
template <int NP, int UK>
static __device__ __forceinline__ void ldm_acc(const int *i0, int j0, bt A0, bt B0, int K0, bt A1, bt B1, int K1,
                                               float (*c)[2][4]) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int sgm = 0; sgm < 2; sgm++) {
    const bt &A = sgm ? A1 : A0, &B = sgm ? B1 : B0;
    int Kd = sgm ? K1 : K0;
#pragma unroll UK
    for (int k0 = 0; k0 < Kd; k0 += 16) {
      uint32_t b[4];
      if (B.kc) ldsm_b_nk(b, B.p, B.ld, j0, k0, lane);
      else ldsm_b_kn(b, B.p, B.ld, j0, k0, lane);
#pragma unroll
      for (int u = 0; u < NP; u++) {
        uint32_t a[4];
        if (A.kc) ldsm_a(a, A.p, A.ld, i0[u], k0, lane);
        else ldsm_a_km(a, A.p, A.ld, i0[u], k0, lane);
        mma16816(c[u][0], a, b[0], b[1]);
        mma16816(c[u][1], a, b[2], b[3]);
      }
    }
  }
}
template <int NPM = 1, int UK = 2, class FE>
static __device__ __forceinline__ void mma_ldm(int M, int N, bt A0, bt B0, int K0, bt A1, bt B1, int K1, FE E4) {
  warp_tiles16<NPM>(M, N, [&](const auto &i0, int j0, auto &c) {
    ldm_acc<ACC_NP(i0), UK>(i0, j0, A0, B0, K0, A1, B1, K1, c);
  }, E4);
}

/* ---- tf32 MMAs with pre-rounded operands (the fast kernels' fp32 products) ------------------
 * mma_tf: C = A B in tf32 (k order as mma_blk's P_TF32: bit-identical to it on the same data)
 * with the rounding done once, where each operand tile is written (tf32r), instead of per
 * fragment load. An operand is either a tile tft{p, ld}, k-contiguous (A stored [m][k], B
 * stored [n][k]), read by ldmatrix, or an accessor returning the (already rounded) fp32 value,
 * read by scalar loads. A warp owns 16x16 tiles (two n-tiles share each A fragment); E4 as
 * mma_blk4's; M % 16 == 0, N % 16 == 0, Kd % 8 == 0. */
struct tft {
  const float *p;
  int ld;
};
/* an A operand whose rows come from up to three tiles of one pitch: rows [0, s1) at p0,
 * [s1, s2) at p1, [s2, M) at p2 (s1, s2 multiples of 16) */
struct tft3 {
  const float *p0, *p1, *p2;
  int ld, s1, s2;
};
static __device__ __forceinline__ const float *tft3_row(const tft3 &A, int r) {
  return r < A.s1 ? A.p0 + r * A.ld : r < A.s2 ? A.p1 + (r - A.s1) * A.ld : A.p2 + (r - A.s2) * A.ld;
}
/* an A operand whose rows lie anywhere in shared memory: row(r) points at row r's first
 * element, each row's four-float runs 16-byte aligned (the compact final kernel's reversed dL
 * rows, kda_final.cuh) */
template <class F> struct tftp {
  F row;
};
template <class T> struct is_tftp : std::false_type {};
template <class F> struct is_tftp<tftp<F>> : std::true_type {};
static __device__ __forceinline__ float tf32r(float x) { return __uint_as_float(to_tf32(x)); }
/* t[0 .. count) <- tf32r(t[..]), four floats a thread at a time by threads 0 .. nth - 1 (t 16-byte
 * aligned, count % 4 == 0) */
static __device__ __forceinline__ void tf32r_tile(float *t, int count, int nth = BT) {
  float4 *q4 = (float4 *)t;
  for (int e = threadIdx.x; e < count / 4; e += nth) {
    float4 x = q4[e];
    q4[e] = make_float4(tf32r(x.x), tf32r(x.y), tf32r(x.z), tf32r(x.w));
  }
}
/* C = A0 B0 (K0) + A1 B1 (K1), K-concatenated in that order (K1 = 0: one product), each operand
 * a tile or an accessor as above */
template <int NPM = 1, class FA0, class FB0, class FA1, class FB1, class FE, class FL = no_pre>
static __device__ __forceinline__ void mma_tf2(int M, int N, FA0 A0, FB0 B0, int K0, FA1 A1, FB1 B1, int K1, FE E4,
                                               FL L = FL()) {
  int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  warp_tiles16<NPM>(M, N, [&](const auto &i0, int j0, auto &c) {
    constexpr int NP = ACC_NP(i0);
    auto seg = [&](auto A, auto B, int Kd) {
      typedef std::decay_t<decltype(A)> TA;
      typedef std::decay_t<decltype(B)> TB;
#pragma unroll 2
      for (int k0 = 0; k0 < Kd; k0 += 8) {
        uint32_t b[4];
        if constexpr (std::is_same<TB, tft>::value) ldsm_tf32_b(b, B.p, B.ld, j0, k0, lane);
        else {
          b[0] = __float_as_uint(B(k0 + t, j0 + g)), b[1] = __float_as_uint(B(k0 + t + 4, j0 + g));
          b[2] = __float_as_uint(B(k0 + t, j0 + 8 + g)), b[3] = __float_as_uint(B(k0 + t + 4, j0 + 8 + g));
        }
#pragma unroll
        for (int u = 0; u < NP; u++) {
          uint32_t a[4];
          const int r0 = i0[u];
          if constexpr (std::is_same<TA, tft>::value) ldsm_tf32_a(a, A.p, A.ld, r0, k0, lane);
          else if constexpr (std::is_same<TA, tft3>::value)
            ldsm_tf32_a(a, tft3_row(A, r0) - r0 * A.ld, A.ld, r0, k0, lane);
          else if constexpr (is_tftp<TA>::value) {   /* ldsm_tf32_a's lanes, a row pointer each */
            const int i = lane >> 3;
            ldmatrix_x4(a, (const __nv_bfloat16 *)(A.row(r0 + (lane & 7) + (i & 1) * 8) + k0 + (i >> 1) * 4));
          } else {
            a[0] = __float_as_uint(A(r0 + g, k0 + t)), a[1] = __float_as_uint(A(r0 + g + 8, k0 + t));
            a[2] = __float_as_uint(A(r0 + g, k0 + t + 4)), a[3] = __float_as_uint(A(r0 + g + 8, k0 + t + 4));
          }
          mma_tf32(c[u][0][0], c[u][0][1], c[u][0][2], c[u][0][3], a, b);
          mma_tf32(c[u][1][0], c[u][1][1], c[u][1][2], c[u][1][3], a, b + 2);
        }
      }
    };
    seg(A0, B0, K0);
    if (K1) seg(A1, B1, K1);
  }, E4, L);
}
/* L (optional): the epilogue's global loads, as mma_blk4's */
template <int NPM = 1, class FA, class FB, class FE, class FL = no_pre>
static __device__ __forceinline__ void mma_tf(int M, int N, int Kd, FA A, FB B, FE E4, FL L = FL()) {
  mma_tf2<NPM>(M, N, A, B, Kd, A, B, 0, E4, L);
}
/* a two-column epilogue E2(i, j, c_j, c_j+1) as an E4: a thread's outputs of one row are two
 * adjacent columns (j even), so a store epilogue can write them with one 8-byte (fp32) or
 * 4-byte (bf16) store instead of two (st2f / st2b below). H200, one run, in the fast chunk
 * kernels' store epilogues: fwd+bwd (8,2048,16,128) 4.93 -> 4.74 ms, (8,512,4,64) 0.187 ->
 * 0.180; cycles a block: intra 55.3k -> 51.9k, rows 33.2k -> 30.1k, mat 49.9k -> 44.6k. Then
 * in the state passes' and the mat kernel's remaining fast epilogues: 4.76 -> 4.66 ms, 0.180
 * -> 0.176 (state_fwd 406.7k -> 355.7k cycles a block). The precise chunk kernels' pairs
 * neither gained nor lost; the precise state passes keep one store an output (mma_blk): with
 * pairs they measured 2% slower (9.31 -> 9.48 ms) */
template <class FE> static __device__ __forceinline__ auto pairs2(FE E2) {
  return [=](int i, int j, float c0, float c1, float c2, float c3) {
    E2(i, j, c0, c1);
    E2(i + 8, j, c2, c3);
  };
}
/* dst[0], dst[1] = x0, x1 (n1: dst[1] exists); one store when both exist and dst is 8-byte
 * aligned (fp32) / 4-byte aligned (bf16), else one or two scalar ones. U64: the aligned fp32 pair
 * as one 64-bit integer store. At the reverse sweeps' dVn store (st_dvn) the front end split the
 * float2 into two 4-byte stores (SASS, 2026-12-04); the integer form is one STG.E.64 there. H200,
 * ncu at (8,2048,16,128): k_state_bwd_tc_wide 338.5 -> 314.2 us (2026-12-04s44b). Only there:
 * everywhere it also moved k_bwd_final_tc's registers and schedule (the same stores) and that
 * kernel ran 1268 -> 1328 us */
template <bool U64 = false>
static __device__ __forceinline__ void st2f(float *dst, float x0, float x1, bool n1) {
  if (n1 && ((uintptr_t)dst & 7) == 0) {
    if constexpr (U64) *(unsigned long long *)dst = (unsigned long long)__float_as_uint(x1) << 32 | __float_as_uint(x0);
    else *(float2 *)dst = make_float2(x0, x1);
  } else {
    dst[0] = x0;
    if (n1) dst[1] = x1;
  }
}
/* the two floats at src (n1: src[1] exists): one 8-byte load when it does and src is aligned */
static __device__ __forceinline__ float2 ld2f(const float *src, bool n1) {
  if (n1 && ((uintptr_t)src & 7) == 0) return *(const float2 *)src;
  return make_float2(src[0], n1 ? src[1] : 0.f);
}
static __device__ __forceinline__ void st2b(__nv_bfloat16 *dst, float x0, float x1, bool n1) {
  if (n1 && ((uintptr_t)dst & 3) == 0) *(__nv_bfloat162 *)dst = __floats2bfloat162_rn(x0, x1);
  else {
    dst[0] = __float2bfloat16(x0);
    if (n1) dst[1] = __float2bfloat16(x1);
  }
}
/* a one-element epilogue E(i, j, c) as an E4 (mma_blk4's order) */
template <class FE> static __device__ __forceinline__ auto each4(FE E) {
  return [=](int i, int j, float c0, float c1, float c2, float c3) {
    E(i, j, c0);
    E(i, j + 1, c1);
    E(i + 8, j, c2);
    E(i + 8, j + 1, c3);
  };
}

/* bf16 tile [C][ds] <- rows of a bf16 [T, HV, V] tensor: 16-byte cp.async when V % 8 == 0 and
 * the base is 16-byte aligned (zero past n rows and V columns), else batched scalar loads */
static __device__ __forceinline__ void cp_tile_bf16(sbf *dst, int ds, int C, int V16, int n, int64_t V,
                                                    const void *src, int64_t t0, int64_t HV, int64_t h) {
  const sbf *g = (const sbf *)src;
  if (V % 8 == 0 && al16(src)) {
    const int c8 = V16 / 8;
    if (BT % c8 == 0) {   /* as cp_tile_f32's: a thread's column fixed, its rows a step apart */
      const int c = (threadIdx.x % c8) * 8, step = BT / c8;
      const sbf *gc = g + h * V + c;
      for (int i = threadIdx.x / c8; i < C; i += step) {
        bool ok = i < n && c < V;
        cp_async16(dst + i * ds + c, ok ? gc + (t0 + i) * HV * V : g, ok);
      }
    } else
      for (int e = threadIdx.x; e < C * c8; e += BT) {
        int i = e / c8, c = (e % c8) * 8;
        bool ok = i < n && c < V;
        cp_async16(dst + i * ds + c, g + (ok ? ((t0 + i) * HV + h) * V + c : 0), ok);
      }
  } else
    batched<8>(C * V16, [&](int e) {
      int i = e / V16, c = e % V16;
      return i < n && c < V ? g[((t0 + i) * HV + h) * V + c] : __float2bfloat16(0.f);
    }, [&](int e, sbf x) { dst[(e / V16) * ds + e % V16] = x; });
}
