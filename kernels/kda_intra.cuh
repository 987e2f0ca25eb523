/* kda_intra.cuh — the body of version 2's intra-chunk kernel: the chunk cumsum, the fused front
 * (the rows' l2 norms, gate and beta from the raw inputs), the persistent flow kernel's staging
 * of a task's raw rows, and intra_tc (G, Aqk, L, M, W, U of one chunk). Included by kda_tc.cu
 * (k_intra_tc in every form and the forward flow kernels' intra tasks); a header of its own so
 * that a second kernel file could instantiate the body with other products (session 53's
 * k_intra_wg, an sm_90a file, did: benches/results/wip/2026-12-06s53-fa.patch). The phase
 * counters it marks are the including file's (kda_tc.cuh). */
#pragma once
#include "kda_tc.cuh"
#include "kda_tril.cuh"

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
template <int LW, int RW, bool GF, bool RAW = false, class FM>
static __device__ __forceinline__ void intra_rows(const kp &p, const rowin &ri, const ws &w, float *qs, float *ks,
                                                  float *Gs, float *bs, int KS, int C, int n, int64_t t0,
                                                  int64_t h, FM mid, raw_rows raw = raw_rows{}) {
  /* RW: a lane group's rows in flight (its 6 RW registers of loads); mid(): the caller's work
   * that needs none of this (beta's load flies across it: thread r loads row r's, C <= 64 <=
   * the block's threads). At K > 64 (LW = 32) it runs before the first pass's loads: between
   * them and their use, its loop split them (ptxas issued a row's loads before it, the rest
   * after); at K <= 64 after them, where it was (before them: (32,512,4,64) fwd 0.121 -> 0.123
   * ms, H100 s56c, s56d). RAW: the rows from shared memory (raw) instead, in one
   * pass (asserted), a barrier after its reads, since mid() and the writes below overwrite the
   * raw tiles (k_fwd_flow_ps puts them in A, L and k's room). GF: the gated twin (gate_mode 1
   * or 2, the fast path: kda_cuda.cu fast_gate): the gate by its fast forms where each row's g
   * is converted, the thread's four dt_bias columns loaded once; without GF the gate runs in a
   * loop of its own in the IEEE forms (below: why) */
  const int64_t HV = p.HV, K = p.K, hq = h / (HV / p.H);
  const int ng = BT / LW, lane = threadIdx.x % LW, grp = threadIdx.x / LW, d = 4 * lane, K16 = r16(K);
  const int rb = threadIdx.x;
  static_assert(!RAW || RW * (NTC / LW) >= 64, "RAW: one pass (k_fwd_flow_ps: 512 threads, C = 64)");
  const float braw = RAW ? raw.beta : rb < n ? ldb(ri.beta, ROWI(rb)) : 0.f;
  const float alog = ri.A_log ? ri.A_log[h] : 0.f;   /* its e^x where the gate needs it, after the loads */
  const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 db = z4;                                  /* GF: dt_bias at this thread's columns (its d is fixed) */
  if (GF && ri.dt_bias && d < K) {                 /* 4-byte alignment only (the API's promise) */
    const float *b = ri.dt_bias + h * K + d;
    db = make_float4(b[0], b[1], b[2], b[3]);
  }
  for (int r0 = 0; r0 < C; r0 += RW * ng) {        /* the same trip count for every lane: shuffles */
    /* every load of the pass in flight together: q, k, g as loaded (ld4r), converted below;
     * a pad row or column loads the chunk's first element (no branch around a load: the
     * compiler scheduled such loads after the first rows' arithmetic) and is zeroed where
     * converted. Converted where loaded, each row had waited for its bytes before the next
     * row's loads issued (ncu s56b: 9% of k_intra_tc's stall samples at those conversions).
     * H100, this form against the converting one (s56e, two rounds): fwd (8,2048,16,128)
     * 0.758-0.767 -> 0.726-0.727 ms, (1,8192,16,128) (the flow kernel's RAW rows) 0.540-0.544 ->
     * 0.517-0.525; fwd+bwd 2.622-2.649 -> 2.590-2.595 and 1.611-1.628 -> 1.592-1.619; the small
     * shapes equal (s56c, s56d: the variants with mid() first at every K, or the RAW rows under
     * their branch, alike at the large shapes). Staging the rows by cp.async instead and reading
     * them as RAW (wip/cs56) gained nothing (fwd 0.752-0.762): the front's shared-memory pass
     * costs what the wait did */
    uint2 xr[3][RW];
    constexpr bool MID_FIRST = !RAW && LW == 32;
    if (MID_FIRST && r0 == 0) mid();
#pragma unroll
    for (int u = 0; u < RW; u++) {
      const int r = r0 + u * ng + grp;
      const bool ok = r < n && d < K;
      if (RAW) {
        const int i = ok ? r * (int)K + d : 0;
        xr[0][u] = ld4r(raw.q, i), xr[1][u] = ld4r(raw.k, i), xr[2][u] = ld4r(raw.g, i);
      } else {
        const int64_t iq = ((t0 + (ok ? r : 0)) * p.H + hq) * K + (ok ? d : 0);
        xr[0][u] = ld4r(ri.q, iq), xr[1][u] = ld4r(ri.k, iq), xr[2][u] = ld4r(ri.g, ROWI(ok ? r : 0) * K + (ok ? d : 0));
      }
    }
    if (!MID_FIRST && r0 == 0) {
      if (RAW) __syncthreads();                    /* every raw read done: mid() and the tiles may overwrite them */
      mid();
    }
#pragma unroll
    for (int u = 0; u < RW; u++) {
      int r = r0 + u * ng + grp;
      const bool live = r < n && d < K;
      const float4 xq = live ? bf4(xr[0][u]) : z4, xk = live ? bf4(xr[1][u]) : z4;
      float sq = 0, sk = 0;
      sq += sumsq4(xq), sk += sumsq4(xk);
      float rq = l2_scale(p, lane_group_sum<LW>(sq)), rk = l2_scale(p, lane_group_sum<LW>(sk));
      if (r >= C || d >= K16) continue;
      float4 qn = make_float4(xq.x * rq, xq.y * rq, xq.z * rq, xq.w * rq);
      float4 kn = make_float4(xk.x * rk, xk.y * rk, xk.z * rk, xk.w * rk);
      *(float4 *)(qs + r * KS + d) = qn, *(float4 *)(ks + r * KS + d) = kn;
      if (GF) {                                    /* the gate's value (gate1<true>'s arithmetic) */
        float4 x = bf4(xr[2][u]);
        const float ea = ri.A_log ? expf(alog) : 1.f;
        x = make_float4(gate_of<true>(p, x.x + db.x, ea), gate_of<true>(p, x.y + db.y, ea),
                        gate_of<true>(p, x.z + db.z, ea), gate_of<true>(p, x.w + db.w, ea));
        *(float4 *)(Gs + r * KS + d) = live ? x : z4;
      } else *(float4 *)(Gs + r * KS + d) = live ? bf4(xr[2][u]) : z4;   /* the raw g: the gate below */
      if (ri.wr && r < n && lane == 0) w.rn[ROWI(r)] = make_float2(rq, rk);
    }
    /* the gate's modes 1 and 2 on this thread's own elements of the pass, in a loop of its own
     * (not unrolled): inlined in the pass above, each unrolled row carried the three modes'
     * code (softplus, sigmoid, IEEE division's slow path), and a pre-gated chunk's few
     * instructions a row jumped across it (the gate chain's case, kda_common.cuh) */
    if (!GF && p.gate_mode) {
      const float ea = ri.A_log ? expf(alog) : 1.f;
#pragma unroll 1
      for (int u = 0; u < RW; u++) {
        const int r = r0 + u * ng + grp;
        if (r < n && d < K) {
          float4 *x = (float4 *)(Gs + r * KS + d);
          *x = gate4(p, *x, ri.dt_bias, h, d, ea);
        }
      }
    }
  }
  if (rb < C) {
    float b = rb < n ? beta_act(p, braw) : 0.f;
    bs[rb] = b;
    if (ri.wr && rb < n) w.b[ROWI(rb)] = b;
  }
}

/* PB's last step: [W | U] = M [Kb | bV] (C = 64, K = V = 128) as one 64 x 256 product, a warp a
 * 32 x 32 block of it (W's columns for warps w % 8 < 4, U's for the rest): a k step's two M
 * fragments (ldmatrix) and four Kb or bV fragments (scalar loads, conflict-free at PB's pitch)
 * feed eight MMAs, 2 KB of shared-memory fragments where mma_tf's 16 x 16 tiles read 4 KB (each
 * tile its own A and B fragments a step). The same MMAs on the same operands in the same k
 * order: W and U bit for bit mma_tf's. wout, uout(i, j, x_j, x_j+1): a row's two adjacent outputs.
 * H100, one run, three rounds against the two mma_tf products (2026-12-06s54b): fwd
 * (8,2048,16,128) 0.785-0.787 -> 0.761-0.763 ms, (1,8192,16,128) (the flow kernel's intra tasks)
 * 0.577-0.579 -> 0.547-0.551; fwd+bwd 2.661-2.673 -> 2.656-2.659 and 1.650-1.661 -> 1.628-1.636;
 * ncu k_intra_tc 752.7 -> 717.7 us (the phase-timed build, a barrier at every mark, reads the
 * products at 7.4k cycles a block either way: the gain does not show there). WQ: W (bf16) goes
 * out by st_quad_b16, 16 bytes a lane (wo: the chunk's row 0, rows wrs apart, rows < n), where
 * wout's bf16 pair a lane writes half sectors; U (fp32) by uout(i, j, x_j, x_j+1). */
template <bool WQ, class FW, class FU>
static __device__ __forceinline__ void wu_product(const float *Ms, int CS, const float *Kbt, int PK, const float *Vbt,
                                                  int PV, FW wout, __nv_bfloat16 *wo, int wrs, int n, FU uout) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wp = threadIdx.x >> 5;
  const int r0 = 32 * (wp >> 3), cb = wp & 7, c0 = 32 * (cb & 3);
  const float *B = (cb < 4 ? Kbt : Vbt) + c0 + g;
  const int P = cb < 4 ? PK : PV;
  float c[2][4][4] = {};
#pragma unroll 2
  for (int k0 = 0; k0 < 64; k0 += 8) {
    uint32_t a[2][4], b[4][2];
    ldsm_tf32_a(a[0], Ms, CS, r0, k0, lane);
    ldsm_tf32_a(a[1], Ms, CS, r0 + 16, k0, lane);
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
      b[ni][0] = __float_as_uint(B[(k0 + t) * P + 8 * ni]), b[ni][1] = __float_as_uint(B[(k0 + t + 4) * P + 8 * ni]);
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
      for (int ni = 0; ni < 4; ni++) mma_tf32(c[mi][ni][0], c[mi][ni][1], c[mi][ni][2], c[mi][ni][3], a[mi], b[ni]);
  }
  if (WQ && cb < 4)   /* W's 32 columns in bf16, 16 bytes a lane (kda_st16.cuh: whole sectors) */
#pragma unroll
    for (int mi = 0; mi < 2; mi++) {
      float d[16];
#pragma unroll
      for (int ni = 0; ni < 4; ni++)
#pragma unroll
        for (int q = 0; q < 4; q++) d[4 * ni + q] = c[mi][ni][q];
      st_quad_b16(wo, wrs, d, r0 + 16 * mi + g, c0, n, 1.f);
    }
  else
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
      for (int ni = 0; ni < 4; ni++) {
        const int i = r0 + 16 * mi + g, j = c0 + 8 * ni + 2 * t;
        if (cb < 4) wout(i, j, c[mi][ni][0], c[mi][ni][1]), wout(i + 8, j, c[mi][ni][2], c[mi][ni][3]);
        else uout(i, j, c[mi][ni][0], c[mi][ni][1]), uout(i + 8, j, c[mi][ni][2], c[mi][ni][3]);
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
/* GF: intra_rows' gated twin (the fast path with a gate; the fused front only) */
template <bool PR, bool CM, bool GF, int KV, int NF, bool PS = false>   /* NF: as bwd_final_tc's (kda_tc_bwd.cu) */
static __device__ __forceinline__ void intra_tc(kp p, const void *v, ws w, int vt, const rowin &ri, int64_t t0,
                                                int nrows, int64_t h, ps_io *io = nullptr) {
  constexpr int PT = PR ? P_3TF32 : P_TF32;
  static_assert(!PS || (!PR && !CM && KV), "PS: the compiled fast wide form");
  static_assert(!GF || !PR, "GF: the fast path's gated twin (the precise forms keep the IEEE gate)");
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
    if (K <= 64) intra_rows<16, 2, GF, true>(p, ri, w, qs, ks, Gs, bs, KS, C, n, t0, h, zero, rr);
    else intra_rows<32, 4, GF, true>(p, ri, w, qs, ks, Gs, bs, KS, C, n, t0, h, zero, rr);
  } else if (K <= 64) intra_rows<16, CM ? 1 : 2, GF>(p, ri, w, qs, ks, Gs, bs, KS, C, n, t0, h, zero);
  else intra_rows<32, CM ? 1 : 4, GF>(p, ri, w, qs, ks, Gs, bs, KS, C, n, t0, h, zero);
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
  if constexpr (PB && KV == 128) {                 /* Ms, Kbt, Vbt hold tf32-rounded values */
    static_assert(NTC == 512, "wu_product: 16 warps");
    /* WQ: W by st_quad_b16 in k_intra_tc; the persistent flow kernel's intra tasks (PS) keep
     * wout (with the quads' registers k_fwd_flow_ps<128> spilled 12 bytes) */
    wu_product<!PS>(Ms, CS, Kbt, PKS, Vbt, PVS, wout, w.Wb + r0 * K16, R16, n, uout);
    PH(8);
    PH(9);
    return;
  }
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
