/* kda.h — the public C API of kda, and the LuaJIT FFI cdef (lua/kda/ffi.lua strips the
 * preprocessor lines and feeds the rest to ffi.cdef).
 *
 * kda trains byte-level language models. Lua composes; C computes. The path of a step:
 *
 *   g = kda_graph_new()                            -- record, do not compute
 *   x = kda_graph_input(g, "tokens", KDA_I32, 2, {B,T})
 *   w = kda_graph_param(g, "wte", 2, {256,D}, KDA_INIT_NORMAL, 0.02f, KDA_PARAM_NO_DECAY)
 *   h = kda_graph_op(g, KDA_OP_EMBED, 2, {w,x}, NULL, NULL)  ... loss = KDA_OP_MEAN(...)
 *   kda_graph_backward(g, loss)                    -- one backward rule per op, emits nodes
 *   kda_graph_adamw(g, &cfg)                       -- in-place optimizer nodes + lr schedule
 *   p = kda_plan_build(g, KDA_BACKEND_CPU)         -- order, liveness, one arena, persistent state
 *   kda_plan_init_params(p, seed)
 *   loop: kda_plan_write(p, x, batch); kda_plan_run(p, KDA_RUN_STEP); kda_plan_read(p, loss, &l)
 *
 * Conventions
 *   - Row-major, contiguous. A shape has 1..4 dims. Node ids are int32 >= 0; -1 means error.
 *   - Functions returning int return 0 on success, -1 on error; kda_last_error() says why
 *     (one line naming the thing and what to do). Internal invariants abort with file:line.
 *   - Sizes are int64_t. No struct is passed by value.
 *   - Every op has a CPU forward (the reference) and a backward rule that emits nodes.
 *     Ops with several results write one packed buffer; the backward rule cuts it with VIEWs.
 */
#ifndef KDA_H
#define KDA_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors and version -------------------------------------------------------------- */
const char *kda_last_error(void);            /* message of the last failed call, "" if none */
void kda_clear_error(void);
const char *kda_version(void);               /* "kda 0.1.0 (git abc1234)" */
int kda_cuda_available(void);                /* 1 when built with CUDA and a device answers */

/* ---- dtypes ---------------------------------------------------------------------------- */
enum kda_dtype { KDA_F32 = 0, KDA_BF16 = 1, KDA_I32 = 2, KDA_U8 = 3, KDA_F64 = 4 };
int64_t kda_dtype_size(int dtype);
const char *kda_dtype_name(int dtype);

/* ---- ops ---------------------------------------------------------------------------------
 * Shapes: ... = any leading dims, N = rows (product of leading dims), D = last dim.
 * iattr: up to 8 int64 attributes; fattr: up to 8 float attributes.                         */
enum kda_op {
  KDA_OP_INPUT = 0,       /* leaf fed by kda_plan_write each step                           */
  KDA_OP_PARAM,           /* leaf, persistent f32, trained                                  */
  KDA_OP_MATMUL,          /* (a, b) -> op(a)@op(b). a [M,K] or [Bt,M,K]; b [K,N] or [Bt,K,N];
                             iattr0 = transpose a (last two dims), iattr1 = transpose b      */
  KDA_OP_ADD,             /* (a, b) -> a+b; b has a's shape or is [D] (broadcast over rows)  */
  KDA_OP_MUL,             /* (a, b) -> a*b; same rule as ADD                                 */
  KDA_OP_SCALE,           /* (a) -> a*fattr0                                                 */
  KDA_OP_SUM_ROWS,        /* (a [...,D]) -> [D], sum over all rows (bias gradient)           */
  KDA_OP_EMBED,           /* (table [V,D] f32, idx [...] i32) -> [...,D]                     */
  KDA_OP_EMBED_BWD,       /* (dy [...,D], idx [...]) -> [V,D] scatter-add; iattr0 = V        */
  KDA_OP_RMSNORM,         /* (x [...,D], w [D]) -> x/rms(x)*w; fattr0 = eps                  */
  KDA_OP_RMSNORM_BWD,     /* (x, w, dy) -> packed [N*D + D] = dx then dw; fattr0 = eps       */
  KDA_OP_SILU,            /* (x) -> x*sigmoid(x)                                             */
  KDA_OP_SILU_BWD,        /* (x, dy) -> dx                                                   */
  KDA_OP_GELU,            /* (x) -> tanh-approximated GELU                                   */
  KDA_OP_GELU_BWD,        /* (x, dy) -> dx                                                   */
  KDA_OP_SWIGLU,          /* (a, b) -> silu(a)*b                                             */
  KDA_OP_SWIGLU_BWD,      /* (a, b, dy) -> packed [2,...] = da then db                       */
  KDA_OP_SOFTMAX,         /* (x [...,D]) -> softmax over the last dim                        */
  KDA_OP_SOFTMAX_BWD,     /* (y, dy) -> dx                                                   */
  KDA_OP_ROPE,            /* (x [B,T,H,Dh] [, pos [1] i32]) -> rotary position embedding, pairs
                             (i, i+Dh/2); row t sits at position pos+t (pos = 0 without the
                             second input; decoding); fattr0 = theta base; iattr0 = 1 rotates
                             backwards (the gradient)                                        */
  KDA_OP_ATTENTION,       /* (q,k,v [B,T,H,Dh]) -> causal softmax(q k^T * s) v, [B,T,H,Dh];
                             fattr0 = s (0 means 1/sqrt(Dh))                                 */
  KDA_OP_ATTENTION_BWD,   /* (q,k,v,dout) -> packed [3,B,T,H,Dh] = dq, dk, dv; fattr0 = s    */
  KDA_OP_CROSS_ENTROPY,   /* (logits [N,V], target [N] i32) -> [N] loss in bits per target   */
  KDA_OP_CROSS_ENTROPY_BWD,/* (logits, target, dloss [N]) -> dlogits [N,V]                   */
  KDA_OP_SUM,             /* (x) -> [1] sum of all elements                                  */
  KDA_OP_MEAN,            /* (x) -> [1] mean of all elements                                 */
  KDA_OP_FILL,            /* (s [1]) -> s*fattr0 broadcast to shape iattr[1..ndim], ndim=iattr0 */
  KDA_OP_VIEW,            /* (x) -> alias of x's buffer: iattr0 = element offset, iattr1 = ndim,
                             iattr2.. = shape. Reshape and row slices are views.              */
  KDA_OP_TRANSPOSE,       /* (x) -> copy with dims iattr0 and iattr1 swapped                 */
  KDA_OP_SIGMOID,         /* (x) -> 1/(1+exp(-x))                                            */
  KDA_OP_SIGMOID_BWD,     /* (y, dy) -> dy*y*(1-y)                                           */
  KDA_OP_GRAD_NORM,       /* (g0, g1, ...) -> [1] sqrt(sum of squares of every input)        */
  KDA_OP_SCHEDULE,        /* (state [8]) -> in place: step += 1, lr from the schedule in
                             fattr/iattr (kda_adamw_config); slots in enum kda_state_slot     */
  KDA_OP_ADAMW,           /* (param, grad, m, v, gnorm [1], state [8]) -> in place update;
                             nothing changes when state[SKIP] != 0 or gnorm is not finite      */
  KDA_OP_KDA,             /* Kimi Delta Attention (core/kda_ref.h): (q [B,T,H,K], k [B,T,H,K],
                             v [B,T,HV,V], g_raw [B,T,HV,K], beta_raw [B,T,HV], A_log [HV],
                             dt_bias [HV*K]) -> o [B,T,HV,V]. iattr0 = gate_mode (enum
                             kda_gate_mode), iattr1 = qk_l2norm, iattr2 = beta_mode (enum
                             kda_beta_mode), iattr3 = chunk (0 means 64); fattr0 = scale (0
                             means 1/sqrt(K)), fattr1 = lower_bound. The usual layer passes
                             {1, 1, 1, 64} (softplus gate, l2norm, sigmoid beta): lua Node:kda */
  KDA_OP_KDA_BWD,         /* (the 7 KDA inputs, dout) -> packed [numel] = dq, dk, dv, dg, dbeta,
                             dA_log, ddt_bias; attributes as KDA                             */
  KDA_OP_CONV1D,          /* (x [B,T,C], w [C,W]) -> y [B,T,C], depthwise causal conv:
                             y[t,c] = sum_j w[c,j] x[t-W+1+j,c]; iattr0 = 1 fuses SiLU       */
  KDA_OP_CONV1D_BWD,      /* (x, w, dy) -> packed [B*T*C + C*W] = dx then dw; iattr0 as CONV1D */
  KDA_OP_GUARD,           /* (state [8], loss [1], gnorm [1]) -> in place: state[SKIP] = 1 when
                             loss or gnorm is not finite, or loss > fattr0 * state[LOSS_EMA]
                             (a spike; fattr0 = 0 disables) after iattr0 warm steps; counts
                             skips; updates the loss EMA (decay fattr1) on kept steps          */
  KDA_OP_MUON,            /* (param [R,C], grad, mom, gnorm [1], state [8]) -> in place:
                             mom = mu mom + g; p -= lr*lr_mult*(sqrt(max(1,R/C)) NS5(g + mu mom)
                             + wd p), NS5 = 5 Newton-Schulz steps towards the orthogonal
                             factor; fattr: mu, lr_mult, wd, clip. Skips like ADAMW         */
  KDA_OP_EMA,             /* (ema, param, state [8]) -> in place: ema = d ema + (1-d) param,
                             d = fattr0; the first step copies param                        */
  KDA_OP_RETRACT,         /* (param [R,C]) -> in place: every row rescaled to L2 norm fattr0 */
  /* One-token decode ops (forward only, no backward rule; CPU and CUDA). Each reads and
   * updates a state leaf in place (a kda_graph_input: persistent, never in the arena, zero
   * at plan build) and writes its own output to an ordinary buffer.                       */
  KDA_OP_KDA_DECODE,      /* (q [1,1,H,K], k, v [1,1,HV,V], g_raw [1,1,HV,K], beta_raw [1,1,HV],
                             A_log [HV], dt_bias [HV*K], state [HV,K,V] f32) -> o [1,1,HV,V];
                             one recurrent step (kda_kdaref_step), state updated in place;
                             attributes as KDA                                              */
  KDA_OP_CONV1D_DECODE,   /* (x [1,1,C], w [C,W], cache [C,W] f32) -> y [1,1,C]: the cache (the
                             last W inputs, oldest first) shifts in x; iattr0 = 1 fuses SiLU  */
  KDA_OP_ATTN_DECODE,     /* (q, k, v [1,1,H,Dh], kcache [Tmax,H,Dh], vcache [Tmax,H,Dh], pos [1]
                             i32) -> o [1,1,H,Dh]: writes k, v at row pos of the caches, then
                             attends over rows 0..pos; fattr0 = scale (0 means 1/sqrt(Dh))  */
  KDA_OP_COUNT
};
const char *kda_op_name(int op);

/* ---- eager tensors (the REPL and tests) ---------------------------------------------------
 * A host tensor that owns its memory (or views another's). kda_tensor_op runs one op on the
 * CPU through the same code the graph executor uses, and returns a new tensor.               */
typedef struct kda_tensor kda_tensor;
kda_tensor *kda_tensor_new(int dtype, int ndim, const int64_t *shape);  /* zero-filled */
kda_tensor *kda_tensor_view(kda_tensor *base, int64_t offset, int ndim, const int64_t *shape);
void kda_tensor_free(kda_tensor *t);
void *kda_tensor_data(kda_tensor *t);
int kda_tensor_dtype(const kda_tensor *t);
int kda_tensor_ndim(const kda_tensor *t);
int64_t kda_tensor_dim(const kda_tensor *t, int i);
int64_t kda_tensor_numel(const kda_tensor *t);
void kda_tensor_randn(kda_tensor *t, uint64_t seed, float std); /* f32 only, deterministic */
kda_tensor *kda_tensor_op(int op, int nin, kda_tensor *const *in, const int64_t *iattr,
                          const float *fattr);                     /* NULL on error */
kda_tensor *kda_tensor_cast(kda_tensor *t, int dtype);             /* new tensor, converted */

/* ---- graphs --------------------------------------------------------------------------------*/
typedef struct kda_graph kda_graph;
enum kda_init { KDA_INIT_ZERO = 0, KDA_INIT_ONE = 1, KDA_INIT_NORMAL = 2, KDA_INIT_UNIFORM = 3 };
enum kda_param_flags { KDA_PARAM_NO_DECAY = 1,   /* no weight decay, no Muon (norms, embeddings) */
                       KDA_PARAM_RETRACT = 2 };  /* rows re-normalised after each update */
kda_graph *kda_graph_new(void);
void kda_graph_free(kda_graph *g);
int32_t kda_graph_input(kda_graph *g, const char *name, int dtype, int ndim, const int64_t *shape);
int32_t kda_graph_param(kda_graph *g, const char *name, int ndim, const int64_t *shape, int init,
                        float scale, int flags);  /* NORMAL: std=scale; UNIFORM: +-scale */
int32_t kda_graph_op(kda_graph *g, int op, int nin, const int32_t *in, const int64_t *iattr,
                     const float *fattr);         /* records a node, checks shapes */
int kda_graph_keep(kda_graph *g, int32_t id);     /* host reads it after runs: never overwritten */
int kda_graph_backward(kda_graph *g, int32_t loss); /* emits gradient nodes for every param */
int32_t kda_graph_grad(const kda_graph *g, int32_t node); /* gradient node of node, or -1 */
int32_t kda_graph_nnodes(const kda_graph *g);
int kda_graph_node_op(const kda_graph *g, int32_t id);
int kda_graph_node_dtype(const kda_graph *g, int32_t id);
int kda_graph_node_ndim(const kda_graph *g, int32_t id);
int64_t kda_graph_node_dim(const kda_graph *g, int32_t id, int i);
int64_t kda_graph_node_iattr(const kda_graph *g, int32_t id, int i); /* integer attribute i (0..7), -1 if none */
const char *kda_graph_node_name(const kda_graph *g, int32_t id); /* "" for unnamed nodes */
int32_t kda_graph_find(const kda_graph *g, const char *name);     /* -1 if absent */
int64_t kda_graph_param_count(const kda_graph *g);                /* trained scalars */

enum kda_schedule { KDA_SCHED_CONSTANT = 0, KDA_SCHED_COSINE = 1, KDA_SCHED_WSD = 2 };
/* The optimizer state vector (the node kda_graph_state_node, [8] f32) by slot. */
enum kda_state_slot { KDA_STATE_STEP = 0, KDA_STATE_LR = 1, KDA_STATE_SKIP = 2, KDA_STATE_SKIP_RUN = 3,
                      KDA_STATE_SKIPPED = 4, KDA_STATE_LOSS_EMA = 5 };
typedef struct kda_adamw_config {
  float lr, beta1, beta2, eps, weight_decay;
  float clip;             /* global grad-norm clip; 0 disables */
  float min_lr_frac;      /* final lr = lr * min_lr_frac */
  float decay_frac;       /* WSD: share of steps spent decaying at the end */
  int32_t schedule;       /* enum kda_schedule */
  int32_t warmup_steps, total_steps;
  float spike_factor;     /* skip a step whose loss exceeds factor x its running mean; 0 = off */
  float ema_decay;        /* keep an EMA of every parameter ("X.ema"); 0 = off */
  int32_t muon;           /* 1: Muon for 2-D weights without KDA_PARAM_NO_DECAY, AdamW for the rest */
  float muon_lr_mult;     /* Muon lr = scheduled lr * this (e.g. 0.02 / 3e-3) */
  float muon_momentum;    /* Muon momentum (0.95) */
  float retract_norm;     /* row norm for KDA_PARAM_RETRACT parameters (1) */
} kda_adamw_config;
int kda_graph_adamw(kda_graph *g, const kda_adamw_config *cfg);
int32_t kda_graph_state_node(const kda_graph *g); /* the [4] {step, lr, ...} state, or -1 */
int32_t kda_graph_gnorm_node(const kda_graph *g); /* the [1] global grad norm, or -1 */

/* ---- plans: order, liveness, arena, persistent buffers, execution ------------------------ */
typedef struct kda_plan kda_plan;
enum kda_backend_kind { KDA_BACKEND_CPU = 0, KDA_BACKEND_CUDA = 1 };
enum kda_run_what { KDA_RUN_STEP = 0, KDA_RUN_FORWARD = 1 };
kda_plan *kda_plan_build(kda_graph *g, int backend); /* NULL on error (e.g. out of memory) */
void kda_plan_free(kda_plan *p);
int64_t kda_plan_arena_bytes(const kda_plan *p);     /* planned arena */
int64_t kda_plan_naive_bytes(const kda_plan *p);     /* sum of every transient buffer */
int64_t kda_plan_persistent_bytes(const kda_plan *p);/* params, optimizer state, inputs */
int64_t kda_plan_node_offset(const kda_plan *p, int32_t id); /* arena offset, -1 if not arena */
int kda_plan_node_live(const kda_plan *p, int32_t id, int32_t *first, int32_t *last);
int kda_plan_init_params(kda_plan *p, uint64_t seed);
int kda_plan_run(kda_plan *p, int what);
int kda_plan_write(kda_plan *p, int32_t id, const void *src, int64_t bytes);
int kda_plan_read(kda_plan *p, int32_t id, void *dst, int64_t bytes);
int kda_plan_node_dtype(const kda_plan *p, int32_t id); /* storage dtype on this backend */
int kda_plan_nstate(const kda_plan *p);              /* persistent buffers: params, m, v, state */
const char *kda_plan_state_name(const kda_plan *p, int i); /* "wte", "wte.adam_m", ... */
int32_t kda_plan_state_node(const kda_plan *p, int i);
double kda_plan_op_seconds(const kda_plan *p, int op); /* CPU time spent per op since build */
int64_t kda_plan_op_calls(const kda_plan *p, int op);  /* nodes of that op run since build */
int kda_plan_set_profile(kda_plan *p, int on);

/* ---- utilities and the host (core/main.c) ------------------------------------------------ */
double kda_now(void);                                 /* monotonic seconds */
double kda_since_start(void);                         /* seconds since the process started */
int kda_interrupted(void);                            /* 1 after Ctrl-C: stop after this step */
void kda_clear_interrupt(void);
const char *kda_readline(const char *prompt);         /* NULL at end of input; valid until next call */
void kda_history_add(const char *line);
int kda_history_load(const char *path);
int kda_history_save(const char *path);

#ifdef __cplusplus
}
#endif
#endif
