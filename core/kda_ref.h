/* kda_ref.h — CPU reference of the KDA (Kimi Delta Attention) layer core and its short conv.
 *
 * Math: docs/kda.md and /work/shared/docs/KDA.md (§2 recurrence, §3 chunk form, §4 backward,
 * §5 decode). Everything here is plain C (fed to LuaJIT ffi.cdef after '#' lines are stripped).
 *
 * Layouts (row-major, contiguous; "tokens" = the B*T rows of the flattened batch):
 *   q, k [B,T,H,K]   v [B,T,HV,V]   g (raw gate) [B,T,HV,K]   beta (raw) [B,T,HV]
 *   o [B,T,HV,V]     state [N,HV,K,V] fp32 (K-first)   A_log [HV]   dt_bias [HV*K]
 * GVA: value head h reads q/k head h / (HV/H). Varlen: cu_seqlens (int32, nseq+1 offsets into
 * the T axis, first 0, last T) with B == 1; then N = nseq, else N = B. Chunks never straddle
 * two sequences. All functions return 0, or -1 with kda_last_error() set.                     */
#ifndef KDA_REF_H
#define KDA_REF_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* gate_mode: how the per-token log-decay g_t (<= 0, natural log) is formed from the input g.  */
enum kda_gate_mode {
  KDA_GATE_LOG = 0,        /* input g is already the log-decay (must be <= 0)                */
  KDA_GATE_SOFTPLUS = 1,   /* g = -exp(A_log[h]) * softplus(g_raw + dt_bias[h,:])           */
  KDA_GATE_LOWER_BOUND = 2 /* g = lower_bound * sigmoid(exp(A_log[h]) * (g_raw + dt_bias)); A_log
                              may be NULL (then the factor is 1)                              */
};
/* beta_mode: beta_t from the input beta. */
enum kda_beta_mode {
  KDA_BETA_RAW = 0,        /* beta used as given (expected in (0,1])                         */
  KDA_BETA_SIGMOID = 1,    /* beta = sigmoid(beta_raw)                                        */
  KDA_BETA_SIGMOID2 = 2    /* beta = 2*sigmoid(beta_raw) in (0,2) ("allow_neg_eigval")        */
};

typedef struct kda_kda_args {
  int64_t B, T, H, HV, K, V;
  float scale;               /* o = scale * S^T q; 0 means 1/sqrt(K)                          */
  int32_t gate_mode;         /* enum kda_gate_mode                                            */
  float lower_bound;         /* KDA_GATE_LOWER_BOUND only; < 0 (fla: -5 <= lb < 0)             */
  int32_t qk_l2norm;         /* 1: q, k <- x / sqrt(sum x^2 + 1e-6) per token and head         */
  int32_t beta_mode;         /* enum kda_beta_mode                                            */
  int32_t chunk;             /* chunk length of the chunked form: 16, 32 or 64 (CPU: 1..128)   */
  const int32_t *cu_seqlens; /* NULL, or nseq+1 offsets (host memory for the CPU functions,
                                device memory for the CUDA ones)                              */
  int32_t nseq;              /* number of sequences when cu_seqlens is set                    */
  int32_t keep;              /* CUDA only (the CPU ignores it): 1 = the forward keeps in its
                                workspace what the backward would recompute, and the backward
                                reuses it (kernels/kda_cuda.h says the contract)              */
  int32_t precise_gate;      /* CUDA only: 1 = a parameterised gate's backward runs every
                                product that feeds dg in split tf32, so dA_log / ddt_bias carry
                                fp32-level error (~2x the backward's time); 0 = the bf16/tf32
                                backward, as fla's: dA_log's error is dg's (~3e-3) times its sum's
                                cancellation (docs/kda.md, "Gate gradients")                  */
} kda_kda_args;

/* 0 if the args are consistent (shapes, modes, chunk, cu_seqlens when host_seqlens), else -1. */
int kda_kda_check_args(const kda_kda_args *a, int host_seqlens, const char *who);
int64_t kda_kda_nseq(const kda_kda_args *a);  /* N: nseq with cu_seqlens, else B */

/* Chunked forward (§3) in fp32. h0 [N,HV,K,V] may be NULL (zeros); ht [N,HV,K,V] may be NULL.
 * A_log/dt_bias only read by the in-kernel gate modes (dt_bias may be NULL). Writes o.        */
int kda_kdaref_forward(const kda_kda_args *a, const float *q, const float *k, const float *v,
                       const float *g, const float *beta, const float *A_log,
                       const float *dt_bias, const float *h0, float *o, float *ht);

/* Chunked backward (§4) in fp32 for loss = sum(o*dout) + sum(ht*dht); dht may be NULL (zero).
 * Gradients are w.r.t. the raw inputs (through l2norm, gate and beta modes); every output is
 * overwritten: dq, dk [B,T,H,K]; dv [B,T,HV,V]; dg [B,T,HV,K]; dbeta [B,T,HV]; dA_log [HV]
 * and ddt_bias [HV*K] (may be NULL; zero in KDA_GATE_LOG mode); dh0 [N,HV,K,V] (may be NULL). */
int kda_kdaref_backward(const kda_kda_args *a, const float *q, const float *k, const float *v,
                        const float *g, const float *beta, const float *A_log,
                        const float *dt_bias, const float *h0, const float *dout,
                        const float *dht, float *dq, float *dk, float *dv, float *dg,
                        float *dbeta, float *dA_log, float *ddt_bias, float *dh0);

/* Token-by-token recurrence (§2.4) accumulating in fp64: the ground truth. Same layouts as the
 * forward, all in double; h0, ht may be NULL. */
int kda_kdaref_recurrent64(const kda_kda_args *a, const double *q, const double *k,
                           const double *v, const double *g, const double *beta,
                           const double *A_log, const double *dt_bias, const double *h0,
                           double *o, double *ht);

/* Backward of the fp64 recurrence by reverse-time sweep, for KDA_GATE_LOG, KDA_BETA_RAW and
 * qk_l2norm = 0 only (the core; the chains are checked separately). Outputs as the backward. */
int kda_kdaref_recurrent64_backward(const kda_kda_args *a, const double *q, const double *k,
                                    const double *v, const double *g, const double *beta,
                                    const double *h0, const double *dout, const double *dht,
                                    double *dq, double *dk, double *dv, double *dg,
                                    double *dbeta, double *dh0);

/* Recurrent decode (§5) in fp32: runs T tokens per sequence (T = 1 for one decode step) from
 * state [N,HV,K,V], updated in place to the state after the last token. Writes o.             */
int kda_kdaref_step(const kda_kda_args *a, const float *q, const float *k, const float *v,
                    const float *g, const float *beta, const float *A_log,
                    const float *dt_bias, float *state, float *o);

/* ---- depthwise causal conv1d (the short conv before q, k, v) ------------------------------
 * y[t,c] = act(sum_{j<W} w[c,j] * x[t-W+1+j, c]), zeros before each sequence start.          */
typedef struct kda_conv_args {
  int64_t B, T, C, W;
  int32_t silu;              /* 1: fused SiLU on the output                                    */
  const int32_t *cu_seqlens; /* as kda_kda_args (host memory)                                 */
  int32_t nseq;
} kda_conv_args;

/* x [B,T,C], w [C,W] -> y [B,T,C]. cache [N,C,W] (may be NULL) receives the last W inputs of
 * each sequence (zero-padded), ready for kda_convref_step. */
int kda_convref_forward(const kda_conv_args *a, const float *x, const float *w, float *y,
                        float *cache);
/* dy [B,T,C] -> dx [B,T,C] (overwritten), dw [C,W] (overwritten). */
int kda_convref_backward(const kda_conv_args *a, const float *x, const float *w,
                         const float *dy, float *dx, float *dw);
/* One decode token per sequence: x [N,C] (N = B), cache [N,C,W] in/out, y [N,C]. */
int kda_convref_step(const kda_conv_args *a, const float *x, const float *w, float *cache,
                     float *y);

#ifdef __cplusplus
}
#endif
#endif
