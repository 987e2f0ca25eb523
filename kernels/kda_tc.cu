/* kda_tc.cu — version 2 of the CUDA KDA chunked kernels, forward half: tensor-core MMAs
 * (mma.sync) for every GEMM-shaped step of k_intra_tc (the intra-chunk matrices) and of the
 * state passes (k_state_fwd_tc, k_state_bwd_tc: sequential over chunks, forward and backward),
 * with their precise twins from the same templates (so a fix lands in both; k_intra_tc's body,
 * with the cumsum and the fused front, is kda_intra.cuh's, the triangular inverse
 * kda_tril.cuh's), the forward's flow kernel (k_intra_tc and k_state_fwd_tc_db as one grid),
 * and the phase timers' report (profiling builds). The chunk-parallel backward
 * kernels (and the kept reverse sweep with two tile sets) are in kda_tc_bwd.cu; what both
 * share, with this version's design notes, in kda_tc.cuh; the state passes' tiles, staging and
 * steps in kda_state.cuh. Launched by kernels/kda_cuda.cu (the host side, the shared
 * pipeline and version 1); the scratch layout is in kda_common.cuh, the block-wide MMA
 * products and staging helpers in kda_tile.cuh. */
#include "kda_tc.cuh"
#include "kda_state.cuh"
#include "kda_tril.cuh"
#include "kda_intra.cuh"
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

/* the chunk cumsum, the fused front and intra_tc (the body of k_intra_tc and of the flow
 * kernels' intra tasks): kda_intra.cuh */
/* tab (equal-length sequences, kda_cuda.cu front): the grid's last column of blocks is the
 * chunk table's (its row 0 writes it, for the kernels after this one) and each chunk's block
 * forms its own first token and rows (chunk_of) instead of reading them, so that no kernel of
 * its own runs ahead of this one for the table. H200 (2026-12-03s33c, s34a): see front.
 * CM ? 2 : 1: the compact form exists to run two blocks of 512 an SM, so 64 registers a thread;
 * the inverse's strips (tril_level) took ptxas to 67 without the bound (one block an SM). Held
 * to 64 it spilled nothing at fb537d7; with the 32-bit store offsets (394078f) 4 / 36 bytes, the
 * kernel 31.3 us at (8,512,4,64) either way (the phase-timed build spills more: its counts there
 * run slower) */
template <bool PR, bool CM, bool GF, int KV>
__global__ void __launch_bounds__(NTC, CM ? 2 : 1) k_intra_tc(kp p, const void *v, ws w, int vt, rowin ri, int tab) {
  if (tab && blk_chunk(p) == grid_chunks(p) - 1) {
    if (!blk_head(p)) chunk_table(p, grid_chunks(p) - 1, w.ctab, w.sfirst, w.flow);
    return;
  }
  /* a compiled shape's full chunk with n = 64 fixed (here and in k_bwd_mat_tc, as in the final
   * kernel). H200, one run, two rounds (2026-12-02s29b): fwd (8,2048,16,128) 0.906-0.915 ->
   * 0.884-0.892 ms, fwd+bwd 3.098-3.116 -> 3.073-3.088, graph (32,512,4,64) 0.455 -> 0.450-0.451,
   * (8,512,4,64) 0.146 -> 0.144 */
  int64_t t0;
  int n;
  chunk_of(p, w, blk_chunk(p), tab, &t0, &n);
  if (full_rows<PR, KV>(p, n))
    intra_tc<PR, CM, GF, KV, FULL_NF<PR, KV>>(p, v, w, vt, ri, t0, n, blk_head(p));
  else intra_tc<PR, CM, GF, KV, 0>(p, v, w, vt, ri, t0, n, blk_head(p));
}
/* gf: the gated twin (fast path only) */
intra_tc_fn k_intra_tc_pick(bool pr, bool cm, int kv, bool gf) {
  static const intra_tc_fn t[2][2][3] = {{KV_SLOTS(k_intra_tc, false, false, false), KV_SLOTS(k_intra_tc, false, true, false)},
                                         {KV_SLOTS(k_intra_tc, true, false, false), KV_SLOTS(k_intra_tc, true, true, false)}};
  static const intra_tc_fn g[2][3] = {KV_SLOTS(k_intra_tc, false, false, true), KV_SLOTS(k_intra_tc, false, true, true)};
  return gf && !pr ? g[cm][kv_slot(kv)] : t[pr][cm][kv_slot(kv)];
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
template <bool CM, bool GF, int KV>
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
  intra_tc<false, CM, GF, KV, 0>(p, v, w, vt, ri, t0, n, h);
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
template <bool GF, int KV>
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
    intra_tc<false, false, GF, KV, 0, true>(p, v, w, 1, ri, t0, n, h, &io);
    __syncthreads();                               /* every thread's stores issued */
    flow_signal(w.flow + 1, (int)cb, h, p.HV);
    r = rn;
  }
}
fwd_flow_ps_fn k_fwd_flow_ps_pick(int kv, bool gf) {
  if (gf) return kv == 128 ? k_fwd_flow_ps<true, 128> : kv == 64 ? k_fwd_flow_ps<true, 64> : nullptr;
  return kv == 128 ? k_fwd_flow_ps<false, 128> : kv == 64 ? k_fwd_flow_ps<false, 64> : nullptr;
}
fwd_flow_fn k_fwd_flow_pick(bool cm, int kv, bool gf) {
  static const fwd_flow_fn t[2][2][3] = {{KV_SLOTS(k_fwd_flow, false, false), KV_SLOTS(k_fwd_flow, true, false)},
                                         {KV_SLOTS(k_fwd_flow, false, true), KV_SLOTS(k_fwd_flow, true, true)}};
  return t[gf][cm][kv_slot(kv)];
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
