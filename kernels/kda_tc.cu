/* kda_tc.cu — version 2 of the CUDA KDA chunked kernels, forward half: tensor-core MMAs
 * (mma.sync) for every GEMM-shaped step of k_intra_tc (the intra-chunk matrices) and of the
 * state passes (k_state_fwd_tc, k_state_bwd_tc: sequential over chunks, forward and backward),
 * with their precise twins from the same templates (so a fix lands in both), the cumsum
 * helper (the triangular inverse is kda_tril.cuh's), the forward's flow kernel (k_intra_tc
 * and k_state_fwd_tc_db as one grid), and the phase timers' report (profiling builds). The chunk-parallel backward
 * kernels (and the kept reverse sweep with two tile sets) are in kda_tc_bwd.cu; what both
 * share, with this version's design notes, in kda_tc.cuh; the state passes' tiles, staging and
 * steps in kda_state.cuh. Launched by kernels/kda_cuda.cu (the host side, the shared
 * pipeline and version 1); the scratch layout is in kda_common.cuh, the block-wide MMA
 * products and staging helpers in kda_tile.cuh. */
#include "kda_tc.cuh"
#include "kda_state.cuh"
#include "kda_tril.cuh"
/* DIAG_SPAN, CHUNK_SPAN (the flat chunk), flat_exps, chunk_flat: kda_tc.cuh */

/* ---- v2 intra-chunk: G, Aqk, L (factored tf32 MMAs + exact diagonal blocks), M, W, U ------ */
/* smem (floats): q/X/V region, k, G [C][KS]; A, L, M [C][CS]; b [C] */
size_t smem_intra_tc(int64_t C, int64_t K, int64_t V) {
  int64_t KS = r16(K) + 4, VS = r16(V) + 4, CS = C + 4;
  int64_t reg = (2 * C + 32) * KS > C * VS ? (2 * C + 32) * KS : C * VS;
  return (size_t)(reg + 2 * C * KS + 3 * C * CS + C) * 4;
}
/* the raw v tile (bf16 [C][r16(V)+8]) after the rest, when it fits (vt = 1, V % 8 == 0) */
size_t smem_intra_vtile(int64_t C, int64_t V) { return (size_t)C * (r16(V) + 8) * 2; }
/* The compact layout (vt = 2) for small heads, so that two blocks share an SM: M lives in the
 * X region (free once the factored products are done; C <= r16(K)), the inverse's scratch in
 * Y, and the raw v tile in L's region, copied once L is inverted (r16(V) <= 2C): no M region,
 * no v tile after the rest. K = V = 64, chunk 64: 110.8 KB instead of 130.8 + 9.2 KB.
 * 0 when it does not apply. */
size_t smem_intra_tc_compact(int64_t C, int64_t K, int64_t V) {
  if (C > r16(K) || r16(V) > 2 * C || V % 8) return 0;
  int64_t KS = r16(K) + 4, CS = C + 4;
  return (size_t)((2 * C + 32) * KS + 2 * C * KS + 2 * C * CS + C) * 4;
}

/* G[r][d] <- sum_{r' <= r, r' < n} G[r'][d] for r < C (pad rows repeat the last value, so that
 * every factor exponent stays <= 0), handing out(r, d, G) the rows r < n, columns d < K.
 * Segmented when the block has a thread per (segment, column) to spare: each thread scans
 * its segment of rows, then adds the total of the segments above it, formed in segment order
 * as T_s = T_(s-1) + last_(s-1): every step adds a value <= 0, so G stays non-increasing down
 * the rows exactly (rounding is monotone), which the factored exponents rely on. It was one
 * thread per column over all C rows (a quarter of the threads busy, C dependent steps). */
template <class FO>
static __device__ void chunk_cumsum(float *G, int GS, int C, int K16, int n, int K, FO out) {
  int nseg = BT / K16;
  while (nseg > 1 && C % nseg) nseg--;
  if (nseg < 2) {
    for (int d = threadIdx.x; d < K16; d += BT) {
      float acc = 0;
      for (int r = 0; r < C; r++) {
        if (r < n) acc += G[r * GS + d];
        G[r * GS + d] = acc;
        if (r < n && d < K) out(r, d, acc);
      }
    }
    __syncthreads();
    return;
  }
  int L = C / nseg, sg = threadIdx.x / K16, d = threadIdx.x % K16, r0 = sg * L;
  bool mine = sg < nseg;
  if (mine) {
    float acc = 0;
    for (int r = r0; r < r0 + L; r++) {
      if (r < n) acc += G[r * GS + d];
      G[r * GS + d] = acc;
    }
  }
  __syncthreads();
  float T = 0;
  if (mine)
    for (int s2 = 0; s2 < sg; s2++) T += G[((s2 + 1) * L - 1) * GS + d];
  __syncthreads();
  if (mine)
    for (int r = r0; r < r0 + L; r++) {
      float x = T + G[r * GS + d];
      G[r * GS + d] = x;
      if (r < n && d < K) out(r, d, x);
    }
  __syncthreads();
}

/* The fused front: the row preprocessing (§2.1–2.3: q, k l2-normalised, the gate, beta) of
 * the chunk's rows, from the raw inputs straight into the q, k, G tiles and b. k_rows4 did it
 * for the whole tensor, writing qn, kn, G, b (fp32) that this kernel then read back; now only
 * a backward's workspace gets b and each row's norm factors rn (ri.wr: k_bwd_final_tc scales
 * the raw q, k by them; it read qn, kn, 2 x 4 K bytes a row written here), and k_rows4's
 * launch is gone (the chunk table runs alone before this kernel). LW lanes a row, four
 * columns a lane, the norms' sums in k_rows4's order (LW and the arithmetic as its
 * instantiation for this K): the same values bit for bit (test_kda_cuda compares the two
 * fronts). K % 4 == 0, K <= 4 LW, 8-byte
 * aligned q, k, g (kda_cuda.cu front); pad rows and columns zero, as the staged tiles'. */
/* a persistent intra task's raw rows (k_fwd_flow_ps), staged in shared memory by the task
 * before it: q, k, g bf16 [C][K] (rows past n hold another task's bytes: never read), and this
 * thread's row's raw beta */
struct raw_rows {
  const sbf *q, *k, *g;
  float beta;
};
template <int LW, int RW, bool RAW = false, class FM>
static __device__ __forceinline__ void intra_rows(const kp &p, const rowin &ri, const ws &w, float *qs, float *ks,
                                                  float *Gs, float *bs, int KS, int C, int n, int64_t t0,
                                                  int64_t h, FM mid, raw_rows raw = raw_rows{}) {
  /* RW: a lane group's rows in flight (its 12 RW registers of loads); mid(): the caller's work
   * that needs none of this, run while the first pass's loads fly (and beta's: thread r loads
   * row r's, C <= 64 <= the block's threads). RAW: the rows from shared memory (raw) instead, in one
   * pass (asserted), a barrier after its reads, since mid() and the writes below overwrite the
   * raw tiles (k_fwd_flow_ps puts them in A, L and k's room) */
  const int64_t HV = p.HV, K = p.K, hq = h / (HV / p.H);
  const int ng = BT / LW, lane = threadIdx.x % LW, grp = threadIdx.x / LW, d = 4 * lane, K16 = r16(K);
  const int rb = threadIdx.x;
  static_assert(!RAW || RW * (NTC / LW) >= 64, "RAW: one pass (k_fwd_flow_ps: 512 threads, C = 64)");
  const float braw = RAW ? raw.beta : rb < n ? ldb(ri.beta, ROWI(rb)) : 0.f;
  const float ea = ri.A_log ? expf(ri.A_log[h]) : 1.f;
  const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int r0 = 0; r0 < C; r0 += RW * ng) {        /* the same trip count for every lane: shuffles */
    float4 xq[RW], xk[RW], xg[RW];
#pragma unroll
    for (int u = 0; u < RW; u++) {                 /* every load of the pass in flight together */
      int r = r0 + u * ng + grp;
      xq[u] = xk[u] = xg[u] = z4;
      if (RAW) {
        if (r < n && d < K) {
          const int i = r * (int)K + d;
          xq[u] = ld4b(raw.q, i), xk[u] = ld4b(raw.k, i), xg[u] = ld4b(raw.g, i);
        }
      } else if (r < n && d < K) {
        int64_t iq = ((t0 + r) * p.H + hq) * K + d;
        xq[u] = ld4b(ri.q, iq), xk[u] = ld4b(ri.k, iq), xg[u] = ld4b(ri.g, ROWI(r) * K + d);
      }
    }
    if (r0 == 0) {
      if (RAW) __syncthreads();                    /* every raw read done: mid() and the tiles may overwrite them */
      mid();
    }
#pragma unroll
    for (int u = 0; u < RW; u++) {
      int r = r0 + u * ng + grp;
      float sq = 0, sk = 0;
      sq += sumsq4(xq[u]), sk += sumsq4(xk[u]);
      float rq = l2_scale(p, lane_group_sum<LW>(sq)), rk = l2_scale(p, lane_group_sum<LW>(sk));
      if (r >= C || d >= K16) continue;
      bool live = r < n && d < K;
      float4 qn = make_float4(xq[u].x * rq, xq[u].y * rq, xq[u].z * rq, xq[u].w * rq);
      float4 kn = make_float4(xk[u].x * rk, xk[u].y * rk, xk[u].z * rk, xk[u].w * rk);
      *(float4 *)(qs + r * KS + d) = qn, *(float4 *)(ks + r * KS + d) = kn;
      *(float4 *)(Gs + r * KS + d) = live ? gate4(p, xg[u], ri.dt_bias, h, d, ea) : z4;
      if (ri.wr && r < n && lane == 0) w.rn[ROWI(r)] = make_float2(rq, rk);
    }
  }
  if (rb < C) {
    float b = rb < n ? beta_act(p, braw) : 0.f;
    bs[rb] = b;
    if (ri.wr && rb < n) w.b[ROWI(rb)] = b;
  }
}

/* PR (the precise backward's recompute): the factored blocks, W and U in P_3TF32, and W, s qg,
 * kg, Aqk written in fp32 (rows of K16 with zero pad columns; Aqk rows of C) into the same
 * buffers, for the precise state pass; otherwise tf32 and bf16 tiles as described above. */
/* PS (k_fwd_flow_ps, the compiled fast wide form with the fused front and the v tile): io hands
 * a block's tasks over to each other. Every task's front reads its raw q, k, g, v from shared
 * memory, staged by the copy engine (one bulk copy a row, counted on the block's mbarrier): a
 * task with a next one (io->nn) stages that task's q, k into A's and L's room (dead once Aqk and
 * M are stored: PH 6) and its g, v into k's room and the v tile (dead once Kb and bV are formed:
 * PH 7) while its own last products run, and loads its raw beta into a register; a block's
 * first task (io->staged = 0) stages its own at its start. One front in the loop: with the
 * global-memory front beside it for the first task, ptxas spilled 88-96 bytes at K = 128. */
struct ps_io {
  uint64_t *bar;                                   /* the block's mbarrier: one phase a staged task */
  unsigned parity;                                 /* the phase the next staged task waits for */
  int staged, issued;                              /* this task's rows were staged; the next one's were issued */
  float beta, nbeta;                               /* this thread's row's raw beta: this task's, the next one's */
  int nn;                                          /* the next task's rows (0: none) */
  int64_t t0n, hn;                                 /* and its first token, its head */
};
/* the bytes of a task's four raw tensors, nr rows: q, k, g of K, v of V bf16 a row */
static __device__ __forceinline__ unsigned ps_bytes(const kp &p, int nr) { return (unsigned)(nr * (3 * p.K + p.V) * 2); }
/* PS: bulk copies of rows r < nr of two of a task's (first token tq, head hh) raw tensors, q, k
 * into qg0, kv1 (gv = false) or g, v into qg0 and kv1 at pitch P1 (gv = true), a row a thread:
 * eight lanes of each of the 16 warps (128 rows; a bulk copy takes its operands from uniform
 * registers, so a warp's lanes issue theirs one after another: eight in every warp, not 128 in
 * one). The caller has made the expected bytes known (mbar_expect, before a barrier that orders
 * it before these) and passed a barrier after each room's last reads and writes. */
static __device__ __forceinline__ void ps_stage(const kp &p, const rowin &ri, const void *v, uint64_t *bar, bool gv,
                                                sbf *qg0, sbf *kv1, int P1, int64_t tq, int64_t hh, int nr) {
  const int lane = threadIdx.x & 31, s = (threadIdx.x >> 5) * 8 + lane, x = s >> 6, r = s & 63;
  if (lane >= 8 || x > 1 || r >= nr) return;
  const int64_t K = p.K, V = p.V, HV = p.HV;
  fence_proxy_async_smem();
  if (!gv) {
    const int64_t iq = ((tq + r) * p.H + hh / (HV / p.H)) * K;
    bulk_g2s((x ? kv1 : qg0) + r * K, (const sbf *)(x ? ri.k : ri.q) + iq, (unsigned)K * 2, bar);
  } else {
    const int64_t rw = (tq + r) * HV + hh;         /* ROWI(r) of that task */
    if (x) bulk_g2s(kv1 + r * P1, (const sbf *)v + rw * V, (unsigned)V * 2, bar);
    else bulk_g2s(qg0 + r * K, (const sbf *)ri.g + rw * K, (unsigned)K * 2, bar);
  }
}
/* PS: thread tid's row's raw beta in a task's (first token tq, head hh, nr rows; HV heads) */
static __device__ __forceinline__ float ps_beta(const rowin &ri, int64_t tq, int64_t hh, int nr, int64_t HV, int tid) {
  return tid < nr ? ldb(ri.beta, (tq + tid) * HV + hh) : 0.f;
}
template <bool PR, bool CM, int KV, int NF, bool PS = false>   /* NF: as bwd_final_tc's (kda_tc_bwd.cu) */
static __device__ __forceinline__ void intra_tc(kp p, const void *v, ws w, int vt, const rowin &ri, int64_t t0,
                                                int nrows, int64_t h, ps_io *io = nullptr) {
  constexpr int PT = PR ? P_3TF32 : P_TF32;
  static_assert(!PS || (!PR && !CM && KV), "PS: the compiled fast wide form");
  kv_fix<KV, NTC>(p);
  extern __shared__ __align__(16) float sm[];
  const int n = NF ? NF : nrows;                   /* chunk_of's rows */
  if (!n) return;
  int64_t K = p.K, V = p.V, HV = p.HV;
  int C = p.C, K16 = r16(K), V16 = r16(V), KS = K16 + 4, VS = V16 + 4, CS = C + 4;
  /* CM: the compact layout (smem_intra_tc_compact; vt = 2), its own instantiation (the wide
   * kernel's PTX stays what it was: with the layout chosen at run time it was 1.3-1.7% slower
   * at (8,2048,16,128), fwd 1.756 -> 1.785 ms on the H200) */
  int64_t regn = ((int64_t)(2 * C + 32) * KS > (int64_t)C * VS || CM) ? (int64_t)(2 * C + 32) * KS : (int64_t)C * VS;
  float *qs = sm, *X = qs + C * KS, *Y = X + C * KS, *Vb = sm;   /* Vb aliases q, X, Y later */
  float *ks = sm + regn, *Gs = ks + C * KS, *As = Gs + C * KS, *Ls = As + C * CS;
  float *Ms = CM ? X : Ls + C * CS, *bs = CM ? Ls + C * CS : Ms + C * CS;
  /* vt: the raw v tile, copied with q, k, G (its loads used to wait, 8 per thread at a time, in
   * a phase of their own after the substitution: ~30% of the kernel's time at K = V = 128) */
  int VB = V16 + 8;
  sbf *vr = CM ? (sbf *)Ls : (sbf *)(bs + C);
  int tid = threadIdx.x;
  if constexpr (PS)
    if (!io->staged) {                             /* a block's first task stages its own */
      if (tid == 0) mbar_expect(io->bar, ps_bytes(p, n));
      __syncthreads();
      ps_stage(p, ri, v, io->bar, false, (sbf *)As, (sbf *)Ls, 0, t0, h, n);
      ps_stage(p, ri, v, io->bar, true, (sbf *)ks, vr, VB, t0, h, n);
      io->beta = ps_beta(ri, t0, h, n, HV, tid);
    }
  /* the chunk's rows of the [T, HV, X] outputs: row r at r HV X from its first element, in
   * 32-bit offsets (ROWI(r) X + d per element was 64-bit index arithmetic: the lines storing G,
   * W, U, Kb, kg, qg were ~15% of this kernel's instructions, 80-90% of them integer, ncu SASS
   * lines at (8,2048,16,128), 2026-12-04s39f). H200, two rounds against the 64-bit form
   * (s39g): k_intra_tc 829 -> 799 us there (ncu), fwd 0.849-0.852 -> 0.829-0.830 ms, fwd+bwd
   * 2.986-2.990 -> 2.956-2.957; (1,8192,16,128) fwd+bwd 1.809-1.813 -> 1.794-1.795 (fwd
   * 0.584-0.585 -> 0.590-0.594); the small shapes equal (the compact form now spills 4 / 36
   * bytes at its bound: 31.3 us either way at (8,512,4,64)) */
  const int64_t r0 = ROWI(0);
  const int RK = (int)(HV * K), R16 = (int)HV * K16, RV = (int)(HV * V), RC = (int)HV * C;
  PH_INIT(0);
  {                                                /* q, k, G (and v): asynchronous copies, zero-padded */
    bool al = K % 4 == 0;
    if (!ri.q) {                                   /* else formed below (intra_rows) */
      cp_tile_f32(qs, KS, C, K16, n, (int)K, al, [&](int r) { return w.qn + ROWI(r) * K; });
      cp_tile_f32(ks, KS, C, K16, n, (int)K, al, [&](int r) { return w.kn + ROWI(r) * K; });
      cp_tile_f32(Gs, KS, C, K16, n, (int)K, al, [&](int r) { return w.G + ROWI(r) * K; });
    }
    if (!CM && vt && !PS)                          /* CM: v is copied after the inverse; PS: staged */
      for (int e = tid; e < C * (V16 / 8); e += BT) {
        int r = e / (V16 / 8), c = (e % (V16 / 8)) * 8;
        bool ok = r < n && c < V;
        cp_async16(vr + r * VB + c, (const sbf *)v + (ok ? ROWI(r) * V + c : 0), ok);
      }
  }
  auto zero = [&] {
    for (int e = tid; e < C * CS; e += BT) {
      As[e] = 0.f, Ls[e] = 0.f;                    /* (M: every entry written by tril_inverse) */
    }
  };
  /* the fused front's RW: every row in one pass at C = 64, 512 threads; CM two passes (its
   * blocks are held to 64 registers) */
  if (!ri.q) {
    zero();
    for (int r = tid; r < C; r += BT) bs[r] = r < n ? w.b[ROWI(r)] : 0.f;
  } else if constexpr (PS) {                      /* staged by the task before (PH 6, 7) or above */
    mbar_wait(io->bar, io->parity);
    io->parity ^= 1u;
    const raw_rows rr{(const sbf *)As, (const sbf *)Ls, (const sbf *)ks, io->beta};
    if (K <= 64) intra_rows<16, 2, true>(p, ri, w, qs, ks, Gs, bs, KS, C, n, t0, h, zero, rr);
    else intra_rows<32, 4, true>(p, ri, w, qs, ks, Gs, bs, KS, C, n, t0, h, zero, rr);
  } else if (K <= 64) intra_rows<16, CM ? 1 : 2>(p, ri, w, qs, ks, Gs, bs, KS, C, n, t0, h, zero);
  else intra_rows<32, CM ? 1 : 4>(p, ri, w, qs, ks, Gs, bs, KS, C, n, t0, h, zero);
  cp_async_wait_all();
  __syncthreads();
  PH(0);
  /* the cumsum to the workspace: every row for a backward (w.Kb set: the backward, or a forward
   * that keeps), else the last row only, all that the state pass reads (e^{G_last}) */
  chunk_cumsum(Gs, KS, C, K16, n, (int)K, [&](int r, int d, float x) {
    if (w.Kb || r == n - 1) w.G[r0 * K + (r * RK + d)] = x;
  });
  PH(1);
  /* The flat chunk: when the chunk's whole decay span (max over key dims of G_first - G_last)
   * is at most CHUNK_SPAN, every pair (i, j) factors around one reference a key dim, the
   * span's middle Gm = (G_first + G_last) / 2: e^{G_i - G_j} = e^{G_i - Gm} e^{Gm - G_j},
   * each factor within [e^-64, e^64] as the per-block form's (CHUNK_SPAN, kda_tc.cuh). Aqk and L
   * are then products of the whole chunk, Y = [q; k] e^{G - Gm} against X = k e^{Gm - G},
   * diagonal blocks included, their operands built in one pass (with kg, s qg), instead of
   * four rounds of a block's rows against an X rebuilt around the block (each behind two
   * barriers). Y's q half replaces q (dead after the pass), its k half takes Y's tile and,
   * past row 32, M's (free until the inverse; CM: Y again, in a second round). Steeper chunks
   * take the per-block form below. H200, one run, two rounds each (2026-12-02s25a, b): fwd
   * (8,2048,16,128) 1.046-1.053 -> 0.975-0.978 ms as three products, 0.949-0.964 as one with
   * paired tiles; fwd+bwd 3.56-3.58 -> 3.46-3.48 ms; this kernel 50.2k -> 45.7k cycles a
   * block as three products, 44.5k as one (s25c). */
  const int K4 = K16 / 4, m16 = r16(n);
  const bool flat = chunk_flat(Gs, KS, n, (int)K) && (CM || C <= 32 || (C - 32) * KS <= C * CS);
  auto rnd = [&](float4 v) { return PR ? v : make_float4(tf32r(v.x), tf32r(v.y), tf32r(v.z), tf32r(v.w)); };
  auto mul4 = [](float4 a, float4 b) { return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w); };
  auto st4b = [](sbf *dst, float4 x) {             /* four bf16 (RN), one 8-byte store */
    __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
    uint2 u = make_uint2(*(uint32_t *)&lo, *(uint32_t *)&hi);
    *(uint2 *)dst = u;
  };
  /* kg, s qg (bf16 or PR fp32, pad columns zero) for the state passes; flat: X, Y (rows past n
   * zero: q, k's pad rows are) */
  for (int e = tid; e < (flat ? m16 : n) * K4; e += BT) {
    int r = e / K4, d = (e % K4) * 4;
    float4 kr = *(const float4 *)(ks + r * KS + d), qr = *(const float4 *)(qs + r * KS + d);
    if (r < n) {
      float4 G = *(const float4 *)(Gs + r * KS + d), Gn = *(const float4 *)(Gs + (n - 1) * KS + d);
      float g4[4] = {G.x, G.y, G.z, G.w}, n4[4] = {Gn.x, Gn.y, Gn.z, Gn.w};
      float k4[4] = {kr.x, kr.y, kr.z, kr.w}, q4[4] = {qr.x, qr.y, qr.z, qr.w}, kg[4], qg[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        float a = k4[u] * kexp(n4[u] - g4[u]), b = q4[u] * kexp(g4[u]);
        kg[u] = d + u < K ? a : 0.f, qg[u] = d + u < K ? p.scale * b : 0.f;
      }
      float4 kg4 = make_float4(kg[0], kg[1], kg[2], kg[3]), qg4 = make_float4(qg[0], qg[1], qg[2], qg[3]);
      const int o = r * R16 + d;
      if (PR) *(float4 *)(w.kg + r0 * K16 + o) = kg4, *(float4 *)(w.qg + r0 * K16 + o) = qg4;
      else st4b(w.kgb + r0 * K16 + o, kg4), st4b(w.qgb + r0 * K16 + o, qg4);
    }
    if (flat) {
      float4 up, dn;
      flat_exps(Gs, KS, n, r, d, up, dn);
      *(float4 *)(X + r * KS + d) = rnd(mul4(kr, dn));
      *(float4 *)(qs + r * KS + d) = rnd(mul4(qr, up));   /* Yq: q is dead from here */
      if (r < 32 || !CM) *(float4 *)((r < 32 ? Y + r * KS : Ms + (r - 32) * KS) + d) = rnd(mul4(kr, up));
    }
  }
  unsigned exact = 0;                              /* blocks whose diagonal needs the exact form */
  if (flat) {
    __syncthreads();
    PH(2);
    /* Y's rows: Yq [0, m16), then Yk's (Y's tile, then M's): one product, so that every warp
     * takes two of its tiles (a Yq tile and the Yk tile of the same rows, their chains
     * interleaved on one B fragment). CM: Yk's rows past 32 in a second round, in Y again */
    const int yr = m16 + (CM ? min(m16, 32) : m16);
    /* a row's two adjacent entries in one store; zero above the diagonal (L: on it too) */
    auto out = [&](int ii, int j, float c0, float c1) {
      int i = ii < m16 ? ii : ii - m16;
      if (i >= n) return;
      if (ii < m16)
        *(float2 *)(As + i * CS + j) = make_float2(j <= i ? p.scale * c0 : 0.f, j < i ? p.scale * c1 : 0.f);
      else *(float2 *)(Ls + i * CS + j) = make_float2(j < i ? bs[i] * c0 : 0.f, j + 1 < i ? bs[i] * c1 : 0.f);
    };
    auto prod = [&](int M, int r0, tft3 A) {       /* Y's rows r0 .. r0 + M, A's rows */
      auto o = [&](int ii, int j, float c0, float c1) { out(r0 + ii, j, c0, c1); };
      if constexpr (PR)
        mma_blk4<PT>(M, m16, K16, [&](int i, int d) { return tft3_row(A, i)[d]; },
                     [&](int d, int j) { return X[j * KS + d]; }, pairs2(o));
      else mma_tf<2>(M, m16, K16, A, tft{X, KS}, pairs2(o));
    };
    prod(yr, 0, tft3{qs, Y, Ms, KS, m16, m16 + 32});
    if (CM && m16 > 32) {                          /* Yk's rows 32 .. into Y, once its first rows are read */
      __syncthreads();
      for (int e = tid; e < (m16 - 32) * K4; e += BT) {
        int r = 32 + e / K4, d = (e % K4) * 4;
        float4 up, dn;
        flat_exps(Gs, KS, n, r, d, up, dn);
        *(float4 *)(Y + (r - 32) * KS + d) = rnd(mul4(*(const float4 *)(ks + r * KS + d), up));
      }
      __syncthreads();
      prod(m16 - 32, yr, tft3{Y, Y, Y, KS, C, C});
    }
    PH(3);
  }
  /* Rows of block I (rows r = 16 I .. r + 15) against columns j <= their own, factored around
   * row r: e^{G_i - G_j} = e^{G_i - G_r} e^{G_r - G_j}, so each entry is one tf32 MMA dot
   * product of Y_i = [q_i; k_i] e^{G_i - G_r} with X_j = k_j e^{G_r - G_j}. Off the diagonal
   * (j < r) both factors are <= 1. On the diagonal block (r <= j <= i) X_j grows to e^{span},
   * span = max_d (G_r - G_last) over the block's rows, and Y_i shrinks to e^{-span}: while
   * span <= DIAG_SPAN both stay normal floats and the diagonal joins the MMA; a block with a
   * steeper decay takes the exact per-pair exponents below instead. H200, (8,2048,16,128): the
   * per-pair phase was 18.2k of k_intra_tc's 79.9k cycles a block. */
  for (int I = 0; !flat && I < C / 16 && 16 * I < n; I++) {
    int r = 16 * I, last = min(r + 15, n - 1);
    bool steep = false;
    for (int d = tid; d < K; d += BT) steep |= Gs[r * KS + d] - Gs[last * KS + d] > DIAG_SPAN;
    if (__syncthreads_or(steep)) exact |= 1u << I;   /* also the barrier before X, Y are rebuilt */
    int nx = exact >> I & 1 ? r : r + 16;          /* X rows: j < r, and the block's own rows */
    if (!nx) continue;
    /* X, Y: MMA operands only (tf32, mma_tf); built four columns at a time (float4) */
    for (int e = tid; e < nx * K4; e += BT) {      /* X[j] = k_j e^{G_r - G_j} */
      int j = e / K4, d = (e % K4) * 4;
      float4 kj = *(const float4 *)(ks + j * KS + d), gr = *(const float4 *)(Gs + r * KS + d),
             gj = *(const float4 *)(Gs + j * KS + d);
      *(float4 *)(X + j * KS + d) = rnd(make_float4(kj.x * kexp(gr.x - gj.x), kj.y * kexp(gr.y - gj.y),
                                                    kj.z * kexp(gr.z - gj.z), kj.w * kexp(gr.w - gj.w)));
    }
    for (int e = tid; e < 16 * K4; e += BT) {      /* Y = [q_i; k_i] e^{G_i - G_r}, i in block I */
      int ii = e / K4, d = (e % K4) * 4, i = r + ii;
      float4 gi = *(const float4 *)(Gs + i * KS + d), gr = *(const float4 *)(Gs + r * KS + d),
             qi = *(const float4 *)(qs + i * KS + d), ki = *(const float4 *)(ks + i * KS + d);
      float4 sc = make_float4(kexp(gi.x - gr.x), kexp(gi.y - gr.y), kexp(gi.z - gr.z), kexp(gi.w - gr.w));
      *(float4 *)(Y + ii * KS + d) = rnd(make_float4(qi.x * sc.x, qi.y * sc.y, qi.z * sc.z, qi.w * sc.w));
      *(float4 *)(Y + (16 + ii) * KS + d) = rnd(make_float4(ki.x * sc.x, ki.y * sc.y, ki.z * sc.z, ki.w * sc.w));
    }
    __syncthreads();
    PH(2);
    auto entry = [&](int ii, int j, float c) {     /* Aqk for j <= i, L for j < i */
      int i = r + (ii & 15);
      if (i >= n || j > i) return;
      if (ii < 16) As[i * CS + j] = p.scale * c;
      else if (j < i) Ls[i * CS + j] = bs[i] * c;
    };
    /* the fast form: a row's two adjacent entries in one store (pairs2); an entry above the
     * diagonal (or L's diagonal) is written as the zero its tile already holds */
    auto entry2 = [&](int ii, int j, float c0, float c1) {
      int i = r + (ii & 15);
      if (i >= n || j > i) return;
      if (ii < 16) *(float2 *)(As + i * CS + j) = make_float2(p.scale * c0, j + 1 <= i ? p.scale * c1 : 0.f);
      else *(float2 *)(Ls + i * CS + j) = make_float2(j < i ? bs[i] * c0 : 0.f, j + 1 < i ? bs[i] * c1 : 0.f);
    };
    if constexpr (PR)
      mma_blk<PT>(32, nx, K16, [&](int ii, int d) { return Y[ii * KS + d]; },
                  [&](int d, int j) { return X[j * KS + d]; }, entry);
    else
      mma_tf(32, nx, K16, tft{Y, KS}, tft{X, KS}, pairs2(entry2));
    PH(3);
  }
  /* the steep blocks' diagonals: exact per-pair exponent (any decay) */
  for (int e = tid; exact && e < (C / 16) * 256; e += BT) {
    int I = e >> 8, i = 16 * I + ((e >> 4) & 15), j = 16 * I + (e & 15);
    if (!(exact >> I & 1) || j > i || i >= n) continue;
    /* four columns per shared load (float4: rows are 16-byte aligned), summed in column order
     * as one at a time; the scalar loop takes the K % 4 tail */
    float aq = 0, ak = 0;
    int d = 0;
    for (; d + 4 <= K; d += 4) {
      float4 gi = *(const float4 *)(Gs + i * KS + d), gj = *(const float4 *)(Gs + j * KS + d);
      float4 kj = *(const float4 *)(ks + j * KS + d), qi = *(const float4 *)(qs + i * KS + d);
      float4 ki = *(const float4 *)(ks + i * KS + d);
      float x0 = kexp(gi.x - gj.x) * kj.x, x1 = kexp(gi.y - gj.y) * kj.y;
      float x2 = kexp(gi.z - gj.z) * kj.z, x3 = kexp(gi.w - gj.w) * kj.w;
      aq += qi.x * x0, ak += ki.x * x0;
      aq += qi.y * x1, ak += ki.y * x1;
      aq += qi.z * x2, ak += ki.z * x2;
      aq += qi.w * x3, ak += ki.w * x3;
    }
    for (; d < K; d++) {
      float x = kexp(Gs[i * KS + d] - Gs[j * KS + d]) * ks[j * KS + d];
      aq += qs[i * KS + d] * x, ak += ks[i * KS + d] * x;
    }
    As[i * CS + j] = p.scale * aq;
    if (j < i) Ls[i * CS + j] = bs[i] * ak;
  }
  PH(4);
  __syncthreads();
  tril_inverse(Ls, Ms, CS, C, CM ? Y : X, [&](int ph) { PH(ph); });   /* M = (I + L)^-1 (fp32); X (Y) is free now */
  if (CM)                                          /* L is dead: the raw v tile in its place */
    for (int e = tid; e < C * (V16 / 8); e += BT) {
      int r = e / (V16 / 8), c = (e % (V16 / 8)) * 8;
      bool ok = r < n && c < V;
      cp_async16(vr + r * VB + c, (const sbf *)v + (ok ? ROWI(r) * V + c : 0), ok);
    }
  PH(5);
  /* Aqk (bf16, for the state passes) and M (fp32, for k_bwd_mat_tc). The state passes used to
   * stage fp32 W, qg, kg, Aqk and round them to bf16 on every chunk step; they are written
   * here in bf16 instead (same rounding of the same fp32 values: bit-identical operands), half
   * the bytes and ready for 16-byte cp.async (rows of K16 with zero pad columns for W, qg, kg).
   * PR: the same tiles in fp32 (rows of K16, and of C for Aqk) */
  /* four columns at a time (C and K16 are multiples of 16: rows stay 16-byte aligned) */
  for (int e = tid; e < n * (C / 4); e += BT) {
    int i = e / (C / 4), j = (e % (C / 4)) * 4;
    float4 a = *(const float4 *)(As + i * CS + j), m = *(const float4 *)(Ms + i * CS + j);
    const int o = i * RC + j;
    if (PR) *(float4 *)(w.Aqk + r0 * C + o) = a;
    else st4b(w.Ab + r0 * C + o, a);               /* zero above the diagonal and past n */
    if (w.Kb) *(float4 *)(w.M + r0 * C + o) = m;   /* k_bwd_mat_tc's, only a backward's */
    if (!PR) *(float4 *)(Ms + i * CS + j) = make_float4(tf32r(m.x), tf32r(m.y), tf32r(m.z), tf32r(m.w));
  }                                                /* Ms: from here an MMA operand only */
  if constexpr (PS)                                /* the next task's bytes, before the copies' barrier */
    if (io->nn && tid == 0) mbar_expect(io->bar, ps_bytes(p, io->nn));
  __syncthreads();                                 /* q, X, Y dead: Vb may overwrite them */
  PH(6);
  if constexpr (PS)                                /* A, L dead: the next task's raw q, k there */
    if (io->nn) ps_stage(p, ri, v, io->bar, false, (sbf *)As, (sbf *)Ls, 0, io->t0n, io->hn, io->nn);
  /* PB (the compiled fast wide forms): W's and U's B operands, Kb and bV, in tiles of their own
   * in the dead q / X / Y region (2 C (K16 + 8) <= (2 C + 32) KS floats at K = V), pitch r16 + 8:
   * a B fragment's scalar loads (rows k0 + lane % 4, columns j0 + lane / 4) then fall in 32
   * distinct banks (two-way conflicts at r16 + 4), and bV is formed and rounded once, not at
   * every fragment load (a bf16 load, a convert, a multiply and a cvt each). Same values. */
  constexpr bool PB = !PR && !CM && KV;
  static_assert(!PB || 2 * 64 * (KV + 8) <= (2 * 64 + 32) * (KV + 4), "PB: Kb, bV fit q/X/Y (C = 64, K = V = KV)");
  const int PKS = PB ? K16 + 8 : KS, PVS = PB ? V16 + 8 : VS;
  float *Kbt = PB ? sm : ks, *Vbt = PB ? sm + C * PKS : Vb;
  /* Kb = b k e^G (the backward keeps it); at K % 4 == 0 four columns a thread (float4 loads and
   * stores: an element at a time, its index arithmetic and 4-byte global store were ~8% of this
   * kernel's instructions, ncu at (8,2048,16,128)). H200, with bV below and the strided staging:
   * this phase 5.9k -> 2.9k cycles a block (2026-12-02s27d), k_intra_tc 962 -> 895 us (ncu,
   * alone, s27e) */
  if (K % 4 == 0)
    for (int e = tid; e < C * (K16 / 4); e += BT) {
      int r = e / (K16 / 4), d = (e % (K16 / 4)) * 4;
      float4 k4 = *(const float4 *)(ks + r * KS + d), g4 = *(const float4 *)(Gs + r * KS + d);
      float b = bs[r];
      float4 kb = make_float4(k4.x * (b * kexp(g4.x)), k4.y * (b * kexp(g4.y)), k4.z * (b * kexp(g4.z)),
                              k4.w * (b * kexp(g4.w)));
      *(float4 *)(Kbt + r * PKS + d) = PR ? kb : make_float4(tf32r(kb.x), tf32r(kb.y), tf32r(kb.z), tf32r(kb.w));
      if (w.Kb && r < n && d < K) *(float4 *)(w.Kb + r0 * K + (r * RK + d)) = kb;
    }
  else
    for (int e = tid; e < C * K16; e += BT) {
      int r = e / K16, d = e % K16;
      float kb = ks[r * KS + d] * (bs[r] * kexp(Gs[r * KS + d]));
      Kbt[r * PKS + d] = PR ? kb : tf32r(kb);
      if (w.Kb && r < n && d < K) w.Kb[r0 * K + (r * RK + d)] = kb;
    }
  if (!vt)
    batched<8>(C * V16, [&](int e) {               /* Vb = b V (8 loads per thread in flight) */
      int r = e / V16, c = e % V16;
      return r < n && c < V ? bs[r] * ldb(v, ROWI(r) * V + c) : 0.f;
    }, [&](int e, float x) { Vbt[(e / V16) * PVS + e % V16] = PB ? tf32r(x) : x; });
  else if (PB)                                     /* from the staged v tile (zero past n, V); 4 columns a thread */
    for (int e = tid; e < C * (V16 / 4); e += BT) {
      int r = e / (V16 / 4), c = (e % (V16 / 4)) * 4;
      /* PS: a staged v tile's rows past n hold another task's bytes (b = 0 there, but not x 0 = 0 for a NaN) */
      uint2 u = !PS || r < n ? *(const uint2 *)(vr + r * VB + c) : make_uint2(0u, 0u);
      float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), z = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
      float b = bs[r];
      *(float4 *)(Vbt + r * PVS + c) = make_float4(tf32r(b * a.x), tf32r(b * a.y), tf32r(b * z.x), tf32r(b * z.y));
    }
  if (CM) cp_async_wait_all();                     /* the v tile, copied after the inverse */
  __syncthreads();
  PH(7);
  if constexpr (PS)                                /* k, G and the v tile dead: the next task's g, v there */
    if (io->nn) {
      ps_stage(p, ri, v, io->bar, true, (sbf *)ks, vr, VB, io->t0n, io->hn, io->nn);
      io->nbeta = ps_beta(ri, io->t0n, io->hn, io->nn, HV, tid);
      io->issued = 1;
    }
  /* W = M Kb, U = M bV in tf32: all three operands are fp32 in smem already, and bf16 here
   * (8-bit M, e^G-scaled Kb) put ~1.6e-3 relative error into every U, W row that the state
   * pass, o and every gradient inherit (version 2's o/dq/dk/dv at 2x version 1's error) */
  auto bv = [&](int j, int c) { return vt && !PB ? bs[j] * f(vr[j * VB + c]) : Vbt[j * PVS + c]; };
  /* a thread's two adjacent outputs in one store (pairs2): W's row pitch K16 is even, U's V
   * may not be (st2f then stores them one by one) */
  auto wout = [&](int i, int d, float c0, float c1) {
    if (i >= n) return;
    if (PR) st2f(w.W + r0 * K16 + (i * R16 + d), d < K ? c0 : 0.f, d + 1 < K ? c1 : 0.f, true);
    else st2b(w.Wb + r0 * K16 + (i * R16 + d), d < K ? c0 : 0.f, d + 1 < K ? c1 : 0.f, true);
  };
  auto uout = [&](int i, int c, float x0, float x1) {
    if (i < n && c < V) st2f(w.U + r0 * V + (i * RV + c), x0, x1, c + 1 < V);
  };
  if constexpr (PR)
    mma_blk4<PT>(C, K16, C, [&](int i, int j) { return Ms[i * CS + j]; },
                 [&](int j, int d) { return ks[j * KS + d]; }, pairs2(wout));
  else   /* Ms, Kbt hold tf32-rounded values (rounded where written) */
    mma_tf(C, K16, C, tft{Ms, CS}, [&](int j, int d) { return Kbt[j * PKS + d]; }, pairs2(wout));
  PH(8);
  if constexpr (PR) mma_blk4<PT>(C, V16, C, [&](int i, int j) { return Ms[i * CS + j]; }, bv, pairs2(uout));
  else if constexpr (PB) mma_tf(C, V16, C, tft{Ms, CS}, bv, pairs2(uout));   /* Vbt rounded where written */
  else mma_tf(C, V16, C, tft{Ms, CS}, [&](int j, int c) { return tf32r(bv(j, c)); }, pairs2(uout));
  PH(9);
}
/* tab (equal-length sequences, kda_cuda.cu front): the grid's last column of blocks is the
 * chunk table's (its row 0 writes it, for the kernels after this one) and each chunk's block
 * forms its own first token and rows (chunk_of) instead of reading them, so that no kernel of
 * its own runs ahead of this one for the table. H200 (2026-12-03s33c, s34a): see front.
 * CM ? 2 : 1: the compact form exists to run two blocks of 512 an SM, so 64 registers a thread;
 * the inverse's strips (tril_level) took ptxas to 67 without the bound (one block an SM). Held
 * to 64 it spilled nothing at fb537d7; with the 32-bit store offsets (394078f) 4 / 36 bytes, the
 * kernel 31.3 us at (8,512,4,64) either way (the phase-timed build spills more: its counts there
 * run slower) */
template <bool PR, bool CM, int KV>
__global__ void __launch_bounds__(NTC, CM ? 2 : 1) k_intra_tc(kp p, const void *v, ws w, int vt, rowin ri, int tab) {
  if (tab && blockIdx.x == gridDim.x - 1) {
    if (!blockIdx.y) chunk_table(p, gridDim.x - 1, w.ctab, w.sfirst, w.flow);
    return;
  }
  /* a compiled shape's full chunk with n = 64 fixed (here and in k_bwd_mat_tc, as in the final
   * kernel). H200, one run, two rounds (2026-12-02s29b): fwd (8,2048,16,128) 0.906-0.915 ->
   * 0.884-0.892 ms, fwd+bwd 3.098-3.116 -> 3.073-3.088, graph (32,512,4,64) 0.455 -> 0.450-0.451,
   * (8,512,4,64) 0.146 -> 0.144 */
  int64_t t0;
  int n;
  chunk_of(p, w, blockIdx.x, tab, &t0, &n);
  if (full_rows<PR, KV>(p, n))
    intra_tc<PR, CM, KV, FULL_NF<PR, KV>>(p, v, w, vt, ri, t0, n, blockIdx.y);
  else intra_tc<PR, CM, KV, 0>(p, v, w, vt, ri, t0, n, blockIdx.y);
}
intra_tc_fn k_intra_tc_pick(bool pr, bool cm, int kv) {
  static const intra_tc_fn t[2][2][3] = {{KV_SLOTS(k_intra_tc, false, false), KV_SLOTS(k_intra_tc, false, true)},
                                         {KV_SLOTS(k_intra_tc, true, false), KV_SLOTS(k_intra_tc, true, true)}};
  return t[pr][cm][kv_slot(kv)];
}

/* ---- v2 state passes: per (sequence, head, 32 V columns), staged tiles + MMAs ------------- */
/* smem: W, s qg, kg [C][KB], Aqk [C][CB] of type T (bf16; fp32 in the precise backward, whose
 * k_intra_tc_p wrote them in fp32); fp32 S [K16][SB], Vn/U [C][SB]; bf16 dO [C][DB]; fp32
 * dVn [C][SB], en [K16]. Rows of T tiles are padded by 16 bytes; every region starts on a
 * 16-byte boundary (cp.async targets). */
size_t smem_state_tc(int64_t C, int64_t K, int prec, int bv) {
  int64_t es = prec ? 4 : 2, KB = r16(K) + 16 / es, CB = C + 16 / es, SB = bv + 4, DB = bv + 8;
  if (!prec)   /* bf16 tiles + bf16 shadows Sb [K16][DB], Vb [C][DB]; no fp32 dVn (see st_carve) */
    return (size_t)((3 * C * KB + C * CB) * 2 + (r16(K) + 2 * C) * DB * 2) + (size_t)(r16(K) * SB + C * SB + r16(K)) * 4;
  return (size_t)((3 * C * KB + C * CB) * es + C * DB * 2) + (size_t)(r16(K) * SB + 2 * C * SB + r16(K)) * 4;
}

/* w.h, w.vn non-NULL (a forward that keeps its internals, kda_kda_args.keep): also stores the
 * state entering each chunk and Vn, the same values (same kernels' arithmetic) that the
 * backward state pass's forward sweep would recompute, which it then skips.
 *
 * Each chunk's loads are in flight while earlier work runs, in three cp.async groups a step:
 * kg (read by the update, last) is issued at the step's top; U (into the fp32 Vn tile, dead
 * once Vn's bf16 shadow is formed) right after Vn; W, s qg, Aqk after o; e^{G_last} rides in a
 * register from the top to the end of o. It staged kg, U and e^{G_last} at the top and waited
 * for them there: H200, (8,2048,16,128), that wait was 164k of the pass's 472k cycles a block. */
template <int KV>
__global__ void __launch_bounds__(NT, 2) k_state_fwd_tc(kp p, ws w, const float *h0, void *o, float *ht) {
  extern __shared__ __align__(16) float sm[];
  kv_fix<KV, NT>(p);
  const st_blk b = st_block(p, w);
  const int64_t h = b.h, c0 = b.c0, V = p.V, HV = p.HV;
  const int HVV = (int)(HV * V);                  /* elements between a chunk's rows */
  const int cf = b.cf, cl = b.cl;
  st_tiles<sbf> t = st_carve<sbf>(p, sm);
  PH_INIT(1);
  st_ld(p, h0, b.sbase, c0, t);
  if (cf < cl) st_stage(p, w, t, w.ctab[4 * cf + 1], w.ctab[4 * cf + 2], h, c0, nullptr, SG_W | SG_QG | SG_A | SG_U);
  cp_async_commit();
  for (int ci = cf; ci < cl; ci++) {
    int64_t t0 = w.ctab[4 * ci + 1];
    bf16 *o0 = (bf16 *)o + (t0 * HV + h) * V + c0;      /* chunk row 0 */
    int m = w.ctab[4 * ci + 2];
    st_glast gl = st_fwd_top(p, w, t, ci, t0, m, h, c0);   /* kept state: see above */
    PH(0);
    st_vn_tc<P_BF16>(p, t, t0, m, h, c0, w.vn);
    __syncthreads();                               /* the fp32 Vn tile (U) is dead */
    PH(1);
    if (ci + 1 < cl) st_stage(p, w, t, w.ctab[4 * ci + 5], w.ctab[4 * ci + 6], h, c0, nullptr, SG_U);
    cp_async_commit();
    /* o = [s qg | Aqk] [S ; Vn] in one K-concatenated MMA */
    mma_ldm(p.C, BVT, bt{t.qg, t.KB, 1}, bt{t.Sb, t.DB, 0}, t.K16, bt{t.A, t.CB, 1}, bt{t.Vb, t.DB, 0}, p.C,
            pairs2([&](int r, int c, float x0, float x1) {
              if (r < m && c0 + c < V) st2b(o0 + r * HVV + c, x0, x1, c0 + c + 1 < V);
            }));
    st_en_store(p, t, gl);
    cp_async_wait_group<1>();                      /* kg (the next U may fly) */
    __syncthreads();                               /* W, qg, Aqk dead: prefetch the next chunk's */
    PH(2);
    if (ci + 1 < cl)
      st_stage(p, w, t, w.ctab[4 * ci + 5], w.ctab[4 * ci + 6], h, c0, nullptr, SG_W | SG_QG | SG_A);
    cp_async_commit();
    st_upd_tc<P_BF16>(p, t);
    PH(3);
  }
  __syncthreads();
  if (ht) st_st(p, ht, b.sbase, c0, t);
}

/* The same pass with a second set of chunk tiles (W, s qg, kg, Aqk and U: smem_state_tc_db),
 * for grids of at most one block an SM (the long sequences' few heads, small batches): every
 * tile of chunk ci + 1 is staged during step ci, a step ahead of its use (NS = 3, db_sets:
 * chunk ci + 2's, two steps ahead, in a third set), where
 * k_state_fwd_tc's single set can issue each part only a product ahead (its waits were 21% of
 * its cycles at (8,2048,16,128)). S, its shadow, Vn's shadow and e^{G_last} stay single. Same
 * products in the same order: the same bytes as k_state_fwd_tc. Measured on the H200 (fwd,
 * against KDA_KDA_STATE_DB=0 in one run): (1,8192,16,128) 1.295 -> 1.228 ms, (8,512,4,64)
 * 0.088 -> 0.084. */
size_t smem_state_tc_db(int64_t C, int64_t K, int bv, int ns) {   /* without the first set's dO tile (st_carve) */
  int64_t KB = r16(K) + 8, CB = C + 8, SB = bv + 4, DB = bv + 8;
  return smem_state_tc(C, K, 0, bv) - (size_t)C * DB * 2 + (size_t)(ns - 1) * ((3 * C * KB + C * CB) * 2 + C * SB * 4);
}
template <int KV, int NV = BVT, int NS = 2>
static __device__ __forceinline__ void state_fwd_db(kp p, ws w, const float *h0, void *o, float *ht, int64_t blk,
                                                    bool flow) {
  extern __shared__ __align__(16) float sm[];
  kv_fix<KV, NTC>(p);
  const st_blk b = st_block(p, w, blk, NV);
  const int64_t h = b.h, c0 = b.c0, V = p.V, HV = p.HV, K = p.K;
  const int HVV = (int)(HV * V);                  /* elements between a chunk's rows */
  const int cf = b.cf, cl = b.cl;
  const st_tiles<sbf> t0s = st_carve<sbf, NV>(p, sm, false), t1s = st_carve_db(p, t0s, true),
                      t2s = NS == 3 ? st_carve_next(p, t1s, true) : t1s;
  PH_INIT(1);
  st_ld<NV>(p, h0, b.sbase, c0, t0s);
  constexpr int ALL = SG_W | SG_QG | SG_A | SG_KG | SG_U;
  const st_idle ig = st_idle_of<NV>(p);
  if (cf < cl) flow_wait(w, cf, h, HV, flow);
  __syncthreads();
  if (cf < cl) st_stage(p, w, t0s, w.ctab[4 * cf + 1], w.ctab[4 * cf + 2], h, c0, nullptr, ALL);
  cp_async_commit();
  if constexpr (NS == 3) {                         /* chunk cf + 1 too: each step stages two ahead */
    if (cf + 1 < cl) st_stage(p, w, t1s, w.ctab[4 * cf + 5], w.ctab[4 * cf + 6], h, c0, nullptr, ALL);
    cp_async_commit();
  }
  /* one chunk step with set t, staging chunk ci + NS - 1 into set tn (the loops below
   * rotate the sets with fixed roles, so the sets' pointers stay in registers) */
  auto step = [&](const st_tiles<sbf> &t, const st_tiles<sbf> &tn, int ci) {
    int64_t t0 = w.ctab[4 * ci + 1];
    bf16 *o0 = (bf16 *)o + (t0 * HV + h) * V + c0;      /* chunk row 0 */
    int m = w.ctab[4 * ci + 2];
    if (ci + NS - 1 < cl) flow_wait(w, ci + NS - 1, h, HV, flow);
    __syncthreads();                               /* step ci - 1 done with tn's tiles, S, Vb, en */
    st_glast gl = st_glast_load(p, w, t0, m, h);
    if constexpr (NS == 3) cp_async_wait_group<1>();   /* chunk ci's set (ci + 1's may fly) */
    else cp_async_wait_all();                      /* chunk ci's set */
    __syncthreads();
    PH(0);
    /* ig (st_idle_of): the warps Vn and o leave idle store the kept S and issue the next
     * set's copies beside o */
    st_vn_tc<P_BF16, NV>(p, t, t0, m, h, c0, w.vn);
    __syncthreads();
    PH(1);
    if (ig.me) {
      if (w.h) st_keep(p, w.h, (int64_t)ci * HV * K * V + h * K * V, c0, t, ig.tid, ig.nth);
      if (ci + NS - 1 < cl) st_stage(p, w, tn, w.ctab[4 * (ci + NS - 1) + 1], w.ctab[4 * (ci + NS - 1) + 2], h, c0, nullptr, ALL, ig.tid, ig.nth);
    }
    mma_ldm(p.C, NV, bt{t.qg, t.KB, 1}, bt{t.Sb, t.DB, 0}, t.K16, bt{t.A, t.CB, 1}, bt{t.Vb, t.DB, 0}, p.C,
            pairs2([&](int r, int c, float x0, float x1) {
              if (r < m && c0 + c < V) st2b(o0 + r * HVV + c, x0, x1, c0 + c + 1 < V);
            }));
    /* the kept S and the next set's copies after Vn and o, the products the step's chain
     * starts with, not before them (S's shadow is written by the update, after the barrier
     * below; tn's tiles are free since the step's first barrier). H200, one run, three rounds
     * against the copies at the step's top (2026-12-04s35b): (8,512,4,64) k_state_fwd_tc_db
     * 27.6 -> 25.4 us (ncu), fwd in a graph 0.045 -> 0.043-0.044 ms; the flow forward at
     * (1,8192,16,128) unchanged */
    if (!ig.on) {
      if (w.h) st_keep(p, w.h, (int64_t)ci * HV * K * V + h * K * V, c0, t);   /* kept */
      if (ci + NS - 1 < cl) st_stage(p, w, tn, w.ctab[4 * (ci + NS - 1) + 1], w.ctab[4 * (ci + NS - 1) + 2], h, c0, nullptr, ALL);
    }
    cp_async_commit();
    st_en_store(p, t, gl);
    __syncthreads();                               /* o done with Sb before the update writes it */
    PH(2);
    st_upd_tc<P_BF16, NV>(p, t);
    PH(3);
  };
  if constexpr (NS == 3)
    for (int ci = cf; ci < cl; ci += 3) {
      step(t0s, t2s, ci);
      if (ci + 1 < cl) step(t1s, t0s, ci + 1);
      if (ci + 2 < cl) step(t2s, t1s, ci + 2);
    }
  else
    for (int ci = cf; ci < cl; ci += 2) {
      step(t0s, t1s, ci);
      if (ci + 1 < cl) step(t1s, t0s, ci + 1);
    }
  __syncthreads();
  if (ht) st_st<NV>(p, ht, b.sbase, c0, t0s);
}
template <int KV, int NV = BVT>
__global__ void __launch_bounds__(NTC, 1) k_state_fwd_tc_db(kp p, ws w, const float *h0, void *o, float *ht) {
  state_fwd_db<KV, NV, db_sets(KV, NV)>(p, w, h0, o, ht, blockIdx.x, false);
}

/* The forward's two kernels as one grid, for the grids k_state_fwd_tc_db serves (a block an
 * SM at most), where the state pass occupies at most half the SMs and used to start only
 * once every chunk's intra block had finished: here it follows the intra blocks chunk by
 * chunk on the SMs it holds while they run on the rest. A block's role is its start order
 * (an atomic ticket), not its index: after the first `lead` blocks to start (intra chunks:
 * the state blocks, which hold their SMs while they wait, start that far behind; kda_cuda.cu
 * says how far) the next ns run the state pass (one st_block each), so every block that waits
 * is resident, and the intra blocks, which never wait, have the other SMs: no order of block
 * scheduling can deadlock. The intra blocks take the chunks position by position (every
 * sequence's first chunk, then every second, ...: the state passes' order) when the sequences
 * have one length; packed sequences in chunk order.
 * Each intra block, once its tiles are written, sets its chunk's flag (flow_signal); the state
 * block's thread 0 waits for it (flow_wait) before the copies of that chunk. The same
 * arithmetic as the two kernels: bit-identical results (test_kda_cuda checks it). */
/* the flow's intra role r (r < lead, or past the lead + ns state roles): its chunk cb (chunks
 * in position order across the sequences), head h, first token and rows */
static __device__ __forceinline__ void flow_task(const kp &p, const ws &w, int r, int lead, int ns, int64_t *cb,
                                                 int64_t *h, int64_t *t0, int *n) {
  int64_t x = r < lead ? r : r - ns, HV = p.HV, q = x / HV;
  *h = x % HV, *cb = q;
  if (!p.cu) {
    int64_t nc = (p.T + p.C - 1) / p.C;
    *cb = (q % p.B) * nc + q / p.B;                /* position q / B of sequence q % B */
  }
  chunk_of(p, w, (int)*cb, false, t0, n);
}
template <bool CM, int KV>
__global__ void __launch_bounds__(NTC, CM ? 2 : 1) k_fwd_flow(kp p, const void *v, ws w, int vt, rowin ri,
                                                             const float *h0, void *o, float *ht, int ns, int lead) {
  __shared__ int role;
  if (!threadIdx.x) role = atomicAdd(w.flow, 1);
  __syncthreads();
  const int r = role;
  if (r >= lead && r < lead + ns) return state_fwd_db<KV>(p, w, h0, o, ht, r - lead, true);
  int64_t t0, h, cb;
  int n;
  flow_task(p, w, r, lead, ns, &cb, &h, &t0, &n);
  intra_tc<false, CM, KV, 0>(p, v, w, vt, ri, t0, n, h);
  __syncthreads();                                 /* every thread's stores issued */
  flow_signal(w.flow + 1, (int)cb, h, p.HV);
}
/* k_fwd_flow with its intra blocks persistent (KDA_KDA_PERSIST, kda_cuda.cu use_persist; the
 * compiled wide form, v staged, the fused front): an intra block draws its next role as it starts
 * a task, and when that is an intra role too, the task has the copy engine stage that role's raw
 * rows while its own last products run (intra_tc's PS); when it is a state role, the block runs
 * it after the task. At (1,8192,16,128) the forward flow is held by its intra blocks on the SMs
 * the state blocks leave (the thirty-fifth pass's fo), each of which waited for its front's loads
 * (PH 0: 11.7k of intra's 38.1k cycles a task) with its tensor cores idle. Roles are drawn in
 * order as before; a block holds at most two, and every role a state block waits on is an
 * earlier intra role, held by a running block: no deadlock. The grid is the same (nroles
 * blocks); blocks that draw a role past the last exit. ptxas: 128 registers, 12 / 12 bytes of
 * spill at K = 128. H100, one run, two rounds against KDA_KDA_PERSIST=0 (s51a): fwd
 * (1,8192,16,128) 0.592-0.602 -> 0.579-0.586 ms, fwd+bwd 1.682-1.687 -> 1.675-1.682. The same
 * staging in a persistent k_intra_tc (a block an SM over its tasks, wip/psb51) lost: its front
 * 11.7k -> 5.0k cycles a task but its W and U products beside the copies 2.9k + 3.8k -> 4.5k +
 * 6.3k, fwd (8,2048,16,128) 0.788-0.790 -> 0.823-0.826 ms (as session 29's cp.async form: the
 * copies slow the products whoever issues them); there the grid's 31 waves of one block an SM
 * already overlap one block's front with the others' work, here the intra blocks are fewer. */
template <int KV>
__global__ void __launch_bounds__(NTC, 1) k_fwd_flow_ps(kp p, const void *v, ws w, rowin ri, const float *h0, void *o,
                                                        float *ht, int ns, int lead, int nroles) {
  __shared__ int role;
  __shared__ uint64_t bar;
  if (!threadIdx.x) role = atomicAdd(w.flow, 1), mbar_init(&bar, 1), mbar_init_fence();
  __syncthreads();
  int r = role;
  ps_io io{};
  io.bar = &bar;
  for (;;) {
    if (r >= nroles) return;
    if (r >= lead && r < lead + ns) return state_fwd_db<KV>(p, w, h0, o, ht, r - lead, true);
    __syncthreads();                               /* every thread has read role (r) */
    if (!threadIdx.x) role = atomicAdd(w.flow, 1);
    __syncthreads();                               /* also: the task before done with every tile */
    const int rn = role;
    int64_t t0, h, cb, cbn;
    int n;
    flow_task(p, w, r, lead, ns, &cb, &h, &t0, &n);
    io.nn = 0;
    if (rn < nroles && !(rn >= lead && rn < lead + ns)) flow_task(p, w, rn, lead, ns, &cbn, &io.hn, &io.t0n, &io.nn);
    io.staged = io.issued, io.beta = io.nbeta, io.issued = 0;
    intra_tc<false, false, KV, 0, true>(p, v, w, 1, ri, t0, n, h, &io);
    __syncthreads();                               /* every thread's stores issued */
    flow_signal(w.flow + 1, (int)cb, h, p.HV);
    r = rn;
  }
}
fwd_flow_ps_fn k_fwd_flow_ps_pick(int kv) { return kv == 128 ? k_fwd_flow_ps<128> : kv == 64 ? k_fwd_flow_ps<64> : nullptr; }
fwd_flow_fn k_fwd_flow_pick(bool cm, int kv) {
  static const fwd_flow_fn t[2][3] = {KV_SLOTS(k_fwd_flow, false), KV_SLOTS(k_fwd_flow, true)};
  return t[cm][kv_slot(kv)];
}

/* The forward sweep of the backward state pass: from h0, per chunk, store the state entering
 * it (w.h) and Vn (w.vn), then S <- e^{G_last} S + kg^T Vn. o != NULL (the precise forward
 * of a kept call, PR only) also forms o = [s qg | Aqk] [S ; Vn] from the fp32 tiles, in tf32.
 * Ends with S = the final state (the caller's __syncthreads first). */
template <bool PR, class T>
static __device__ __forceinline__ void st_fwd_sweep(const kp &p, const ws &w, const st_tiles<T> &t,
                                                    const float *h0, const st_blk &b, void *o, int phk) {
  constexpr int P = PR ? P_3TF32 : P_BF16;
  const int64_t K = p.K, V = p.V, HV = p.HV, h = b.h, c0 = b.c0;
  const int cf = b.cf, cl = b.cl;
  /* cp.async groups as k_state_fwd_tc's: W (and U in the bf16 layout, where the fp32 Vn tile
   * is dead once Vn's shadow is formed) for the next chunk right after Vn; kg (and s qg, Aqk
   * for o) at the step's top, waited for after Vn; the fp32 layout's U (Vn is formed in place
   * and lives to the update) at the top in a group of its own, waited for before Vn */
  constexpr int UN = std::is_same<T, sbf>::value ? SG_U : 0;
  PH_IN(phk);
  st_ld(p, h0, b.sbase, c0, t);
  if (cf < cl) st_stage(p, w, t, w.ctab[4 * cf + 1], w.ctab[4 * cf + 2], h, c0, nullptr, SG_W | UN);
  cp_async_commit();
  for (int ci = cf; ci < cl; ci++) {
    int64_t t0 = w.ctab[4 * ci + 1];
    int m = w.ctab[4 * ci + 2];
    __syncthreads();                               /* previous update done with kg, Vn, S, en */
    st_keep(p, w.h, (int64_t)ci * HV * K * V + h * K * V, c0, t);
    if (!UN) st_stage(p, w, t, t0, m, h, c0, nullptr, SG_U);
    cp_async_commit();
    st_stage(p, w, t, t0, m, h, c0, nullptr, SG_KG | (o ? SG_QG | SG_A : 0));
    cp_async_commit();
    st_glast gl = st_glast_load(p, w, t0, m, h);
    cp_async_wait_group<1>();                      /* W, U (kg, qg, Aqk may fly) */
    __syncthreads();
    PH(0);
    st_vn_tc<P>(p, t, t0, m, h, c0, w.vn);
    __syncthreads();                               /* W (and the bf16 layout's U) dead: prefetch */
    PH(1);
    if (ci + 1 < cl) st_stage(p, w, t, w.ctab[4 * ci + 5], w.ctab[4 * ci + 6], h, c0, nullptr, SG_W | UN);
    cp_async_commit();
    st_en_store(p, t, gl);
    cp_async_wait_group<1>();                      /* kg, qg, Aqk (the next W, U may fly) */
    __syncthreads();
    if constexpr (PR) {
      /* o = [s qg | Aqk] [S ; Vn] before S moves on, in tf32 (one MMA a k step, 3xTF32's three):
       * o feeds no gradient (the backward reads S and Vn, kept at fp32 level), and the fast
       * forward forms it from bf16 operands */
      if (o) {
        mma_blk<P_TF32>(p.C, BVT, t.K16 + p.C,
                   [&](int i, int k) { return k < t.K16 ? f(t.qg[i * t.KB + k]) : f(t.A[i * t.CB + k - t.K16]); },
                   [&](int k, int c) { return k < t.K16 ? t.S[k * t.SB + c] : t.Vn[(k - t.K16) * t.SB + c]; },
                   [&](int i, int c, float x) { if (i < m && c0 + c < V) stb(o, ((t0 + i) * HV + h) * V + c0 + c, x); });
        __syncthreads();
      }
    }
    st_upd_tc<P>(p, t);
    PH(2);
  }
}

/* PR: the precise backward (fp32 tiles from k_intra_tc_p, every product in P_3TF32): S, Vn,
 * dS, dVn, which every gradient and dg are built from, to fp32-level accuracy */
template <bool PR, int KV>
static __device__ __forceinline__ void state_bwd_tc(kp p, ws w, const float *h0, const void *dout,
                                                    const float *dht, float *dh0, int kept) {
  typedef typename std::conditional<PR, float, sbf>::type T;
  constexpr int P = PR ? P_3TF32 : P_BF16;
  extern __shared__ __align__(16) float sm[];
  kv_fix<KV, 0>(p);
  const st_blk b = st_block(p, w);
  const int64_t h = b.h, c0 = b.c0, V = p.V, HV = p.HV;
  const int HVV = (int)(HV * V);                  /* elements between a chunk's rows */
  const int cf = b.cf, cl = b.cl;
  st_tiles<T> t = st_carve<T>(p, sm);
  PH_INIT(2);
  if (!kept) st_fwd_sweep<PR>(p, w, t, h0, b, nullptr, 2);   /* kept: the forward's */
  __syncthreads();
  PH_RESET();
  /* cp.async groups: dO, then s qg and W at the step's top (st_rev_top); Aqk, kg of the
   * previous chunk once dVn is formed; e^{G_last} through registers (as the forward sweeps) */
  st_ld(p, dht, b.sbase, c0, t);                   /* t.S now holds dS (§4.2) */
  if (cf < cl)
    st_stage(p, w, t, w.ctab[4 * (cl - 1) + 1], w.ctab[4 * (cl - 1) + 2], h, c0, nullptr, SG_A | SG_KG);
  cp_async_commit();
  for (int ci = cl - 1; ci >= cf; ci--) {
    int64_t t0 = w.ctab[4 * ci + 1];
    float *dvn0 = w.dvn + (t0 * HV + h) * V + c0;       /* chunk row 0 */
    bf16 *dvb0 = w.dvnb + (t0 * HV + h) * V + c0;
    int m = w.ctab[4 * ci + 2];
    st_glast gl = st_rev_top(p, w, t, ci, t0, m, h, c0, dout);
    PH(3);
    /* dVn = [Aqk^T | kg] [dO ; dS]; the bf16 layout keeps -dVn in the shadow Vb (its one use:
     * the dS update's -W^T dVn, as W^T (-dVn), the same products), and stores dVn in fp32 (the
     * mat kernel's tf32 operand) and bf16 (the rows kernel's: st_dvn) */
    if constexpr (!PR)
      mma_ldm(p.C, BVT, bt{t.A, t.CB, 0}, bt{t.dO, t.DB, 0}, p.C, bt{t.kg, t.KB, 1}, bt{t.Sb, t.DB, 0}, t.K16,
              pairs2([&](int r, int c, float x0, float x1) { st_dvn(t, r, c, x0, x1, m, c0 + c < V, c0 + c + 1 < V, dvn0 + r * HVV + c, dvb0 + r * HVV + c); }));
    else   /* B = dO (bf16 data, exact) for k < C */
      mma_blk4_3x<P>(p.C, BVT, p.C + t.K16,
                     [&](int j, int k) { return k < p.C ? f(t.A[k * t.CB + j]) : f(t.kg[j * t.KB + k - p.C]); },
                     [&](int k, int c) { return k < p.C ? f(t.dO[k * t.DB + c]) : t.S[(k - p.C) * t.SB + c]; },
                     each4([&](int j, int c, float x) {
                       t.dV[j * t.SB + c] = x;
                       if (j < m && c0 + c < V) w.dvn[((t0 + j) * HV + h) * V + c0 + c] = x;
                     }), p.C);
    st_en_store(p, t, gl);
    cp_async_wait_group<0>();                      /* s qg, W */
    __syncthreads();                               /* Aqk, kg dead: prefetch the previous chunk's */
    PH(4);
    if (ci > cf)
      st_stage(p, w, t, w.ctab[4 * ci - 3], w.ctab[4 * ci - 2], h, c0, nullptr, SG_A | SG_KG);
    cp_async_commit();
    /* dS <- e^{G_last} dS + [s qg^T | -W^T] [dO ; dVn] */
    if constexpr (!PR)
      mma_ldm(t.K16, BVT, bt{t.qg, t.KB, 0}, bt{t.dO, t.DB, 0}, p.C, bt{t.W, t.KB, 0}, bt{t.Vb, t.DB, 0}, p.C,
              pairs2([&](int d, int c, float x0, float x1) { st_s_upd2(t, d, c, x0, x1); }));
    else   /* B = dO (exact) for k < C */
      mma_blk4_3x<P>(t.K16, BVT, 2 * p.C,
                     [&](int d, int k) { return k < p.C ? f(t.qg[k * t.KB + d]) : -f(t.W[(k - p.C) * t.KB + d]); },
                     [&](int k, int c) { return k < p.C ? f(t.dO[k * t.DB + c]) : t.dV[(k - p.C) * t.SB + c]; },
                     each4([&](int d, int c, float x) { t.S[d * t.SB + c] = t.en[d] * t.S[d * t.SB + c] + x; }), p.C);
    PH(5);
  }
  __syncthreads();
  if (dh0) st_st(p, dh0, b.sbase, c0, t);
}
template <bool PR, int KV>
__global__ void __launch_bounds__(NTC) k_state_bwd_tc(kp p, ws w, const float *h0, const void *dout,
                                                     const float *dht, float *dh0, int kept) {
  state_bwd_tc<PR, KV>(p, w, h0, dout, dht, dh0, kept);
}
state_bwd_fn k_state_bwd_tc_pick(bool pr, int kv) {
  static const state_bwd_fn t[2][3] = {KV_SLOTS(k_state_bwd_tc, false), KV_SLOTS(k_state_bwd_tc, true)};
  return t[pr][kv_slot(kv)];
}
/* The precise forward of a kept call (kda_kda_args.keep with a parameterised gate and
 * precise_gate, or KDA_KDA_PRECISE=1: the backward is the precise one): k_intra_tc_p's fp32 tiles, the backward's forward sweep with
 * o, then ht. The backward reuses w.h, w.vn and the tiles instead of recomputing them. */
template <int KV>
__global__ void __launch_bounds__(NTC) k_state_fwd_tc_p(kp p, ws w, const float *h0, void *o, float *ht) {
  extern __shared__ __align__(16) float sm[];
  kv_fix<KV, 0>(p);
  const st_blk b = st_block(p, w);
  st_tiles<float> t = st_carve<float>(p, sm);
  PH_INIT(1);
  st_fwd_sweep<true>(p, w, t, h0, b, o, 1);
  __syncthreads();
  if (ht) st_st(p, ht, b.sbase, b.c0, t);
}

/* the forward state pass's kernel by form (ST_FAST, ST_DB, ST_PRECISE), kv (kv_spec) and, for
 * ST_DB, bv (BVT or BVN V columns a block) */
state_fwd_fn k_state_fwd_tc_pick(int form, int kv, int bv) {
  static const state_fwd_fn t[3][3] = {KV_SLOTS1(k_state_fwd_tc), KV_SLOTS1(k_state_fwd_tc_db), KV_SLOTS1(k_state_fwd_tc_p)};
  static const state_fwd_fn dbn[3] = {k_state_fwd_tc_db<0, BVN>, k_state_fwd_tc_db<64, BVN>, k_state_fwd_tc_db<128, BVN>};
  return form == ST_DB && bv == BVN ? dbn[kv_slot(kv)] : t[form][kv_slot(kv)];
}

/* ---- phase timers (KDA_PHASES builds; see kda_common.cuh) ---------------------------------- */
#ifdef KDA_PHASES
extern "C" void kda_phase_report(const char *title) {
  static const char *kn[KDA_PH_KERNELS] = {"intra", "state_fwd", "state_bwd", "bwd_rows", "bwd_mat", "bwd_final",
                                               "bwd_final_wg"};
  unsigned long long c[KDA_PH_KERNELS][KDA_PH_PHASES + 1] = {};
  cudaDeviceSynchronize();
  kda_phase_take(c);                               /* this file's kernels */
  kda_phase_take_bwd(c);                           /* kda_tc_bwd.cu's */
  kda_phase_take_final(c);                         /* kda_final_tc.cu's */
  kda_phase_take_final_wg(c);                      /* kda_final_wg.cu's (kda_bench_phases links its -DKDA_PHASES object) */
  kda_phase_take_mat(c);                           /* kda_mat_halves.cu's */
  kda_phase_take_wide(c);                          /* kda_state_wide.cu's */
  printf("# phases: %s (mean cycles per block; share of the kernel's marked time)\n", title);
  for (int k = 0; k < KDA_PH_KERNELS; k++) {
    unsigned long long nb = c[k][KDA_PH_PHASES], tot = 0;
    if (!nb) continue;
    for (int ph = 0; ph < KDA_PH_PHASES; ph++) tot += c[k][ph];
    printf("%-12s %6llu blocks %9.0f cyc/block:", kn[k], nb, (double)tot / nb);
    for (int ph = 0; ph < KDA_PH_PHASES; ph++)
      if (c[k][ph]) printf("  p%d %.0f (%.0f%%)", ph, (double)c[k][ph] / nb, 100.0 * c[k][ph] / tot);
    printf("\n");
  }
}
#else
extern "C" void kda_phase_report(const char *title) { (void)title; }
#endif
