/* kda_cuda.h — CUDA KDA (Kimi Delta Attention) forward, backward and decode (kernels/kda_cuda.cu).
 *
 * Same kda_kda_args and layouts as the CPU reference (core/kda_ref.h), with device pointers:
 *   q, k [B,T,H,K] bf16; v [B,T,HV,V] bf16; g (raw gate or log-decay) [B,T,HV,K] bf16;
 *   beta (raw) [B,T,HV] bf16; o [B,T,HV,V] bf16; A_log [HV], dt_bias [HV*K] fp32;
 *   h0 / ht / state / dh0 [N,HV,K,V] fp32; a->cu_seqlens is DEVICE memory (int32, nseq+1).
 * Gradients of bf16 tensors are bf16; dA_log, ddt_bias, dh0 are fp32. Every call is async on
 * `stream` (a cudaStream_t; NULL = legacy default), makes no allocation and no host sync, so
 * it can be captured in a CUDA graph. Scratch comes from the caller: `workspace` of at least
 * kda_kda_cuda_workspace_bytes(a, backward) bytes (256-byte aligned).
 * Returns 0, or -1 with kda_last_error() naming the call, the op and the shapes.
 * KDA_KDA_SIMPLE=1 (read per call) selects the version-1 scalar kernels instead of the
 * tensor-core ones. The backward is bit-reproducible (no float atomics).                    */
#ifndef KDA_CUDA_H
#define KDA_CUDA_H
#include <stdint.h>
#include "kda_ref.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of scratch the forward (backward = 0) or backward (backward = 1) needs. The first
 * query for a shape form also loads the kernels such calls launch (once a process), so the
 * first call does not pay CUDA's lazy kernel load. */
int64_t kda_kda_cuda_workspace_bytes(const kda_kda_args *a, int backward);
/* With keep (below): the first kda_kda_cuda_keep_bytes(a) bytes of the backward-sized
 * workspace are what the kept forward leaves for its backward; past them the forward may use
 * scratch of its own (read only within the call) and the backward writes the rest before
 * reading it, so from the end of the forward to the start of the backward that rest may hold
 * anything (e.g. another layer's kept bytes, as the CUDA backend overlaps them: a later layer's
 * forward and backward run between this layer's). */
int64_t kda_kda_cuda_keep_bytes(const kda_kda_args *a);

/* Chunked forward. h0, ht may be NULL; dt_bias may be NULL; A_log needed by gate_mode 1. */
int kda_kda_cuda_forward(const kda_kda_args *a, const void *q, const void *k, const void *v,
                         const void *g, const void *beta, const float *A_log,
                         const float *dt_bias, const float *h0, void *o, float *ht,
                         void *workspace, int64_t workspace_bytes, void *stream);

/* Chunked backward of loss = sum(o*dout) + sum(ht*dht) (dht may be NULL). Recomputes the
 * forward internals, unless a->keep (below). dq, dk, dv, dg, dbeta (bf16) are overwritten;
 * dA_log [HV], ddt_bias [HV*K], dh0 (fp32) are overwritten when non-NULL.
 *
 * a->keep = 1 (training: one forward, then its backward): the forward takes a workspace sized
 * for the backward (kda_kda_cuda_workspace_bytes(a, 1)) and leaves in it what the backward's
 * fast path recomputes (the rows' norms and gates, the chunk matrices, b k e^G, the state
 * entering each chunk, Vn); a backward with keep = 1 on that workspace skips the recompute
 * (k_rows, k_intra_tc and the state pass's forward sweep) and gives the same bytes. The
 * caller's side: the same a, inputs and h0 as the forward, and nothing else writing the
 * workspace in between (a backward leaves it intact: it may run again), and the same
 * KDA_KDA_SIMPLE for both calls. A kept forward prepares for the precise backward (dA_log /
 * ddt_bias of a parameterised gate) when gate_mode != 0 and a->precise_gate, or when
 * KDA_KDA_PRECISE=1 (its own o then comes from the fp32 tiles), else for the fast one; a
 * backward of the other precision, and version 1, recompute. */
int kda_kda_cuda_backward(const kda_kda_args *a, const void *q, const void *k, const void *v,
                          const void *g, const void *beta, const float *A_log,
                          const float *dt_bias, const float *h0, const void *dout,
                          const float *dht, void *dq, void *dk, void *dv, void *dg, void *dbeta,
                          float *dA_log, float *ddt_bias, float *dh0, void *workspace,
                          int64_t workspace_bytes, void *stream);

/* Where the last kda_kda_cuda_backward in this process formed the rows kernel's products at the
 * compiled K = V = 64 (KDA_KDA_FR): 0 the rows kernel, 1 the final kernel (the rows kernel dW
 * alone), 2 the final and mat kernels (no rows kernel). For the test: whether a form it
 * compares ran at all. */
int kda_kda_cuda_last_fr(void);
/* Whether the last kda_kda_cuda_backward in this process ran the reverse sweep with the rows
 * kernel's products at the compiled K = V = 128 (KDA_KDA_SR; sm_90): 0 the two kernels ran (or
 * neither); else 1 + its bf16 hand-offs (KDA_KDA_B16): + 1 dQ0, dKi0, dA to the wgmma final kernel,
 * + 2 dW to the wgmma mat kernel (1: all in fp32). For the test, as kda_kda_cuda_last_fr. */
int kda_kda_cuda_last_sr(void);

/* Recurrent decode (§5): T tokens per sequence (T = 1 for a decode step) from state
 * [N,HV,K,V] fp32, updated in place. Writes o. No workspace. */
int kda_kda_cuda_decode(const kda_kda_args *a, const void *q, const void *k, const void *v,
                        const void *g, const void *beta, const float *A_log,
                        const float *dt_bias, float *state, void *o, void *stream);

#ifdef __cplusplus
}
/* The CUDA backend's KDA ops (kernels/kda_ops.cu): KDA_OP_KDA, KDA_OP_KDA_BWD, KDA_OP_CONV1D,
 * KDA_OP_CONV1D_BWD. Same contract as every kc_<op> launcher in kernels/kernels.h. */
struct kda_exec_node;
struct kc_ctx;
int kc_kda_node(const struct kda_exec_node *n, struct kc_ctx *c);
int64_t kc_kda_scratch(const struct kda_exec_node *n);   /* bytes of c->scratch it needs */
#endif
#endif
