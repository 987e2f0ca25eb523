/* ops.c — op names and shape inference.
 *
 * Every op checks its inputs here, once, when it is recorded; the executors trust the shapes.
 * A failed check is a user error (a recipe built a bad model), so it names the op, the shapes
 * and what was expected.                                                                   */
#include <string.h>
#include "internal.h"
#include "ops.h"

static const char *op_names[KDA_OP_COUNT] = {
    [KDA_OP_INPUT] = "input",          [KDA_OP_PARAM] = "param",
    [KDA_OP_MATMUL] = "matmul",        [KDA_OP_ADD] = "add",
    [KDA_OP_MUL] = "mul",              [KDA_OP_SCALE] = "scale",
    [KDA_OP_SUM_ROWS] = "sum_rows",    [KDA_OP_EMBED] = "embed",
    [KDA_OP_EMBED_BWD] = "embed_bwd",  [KDA_OP_RMSNORM] = "rmsnorm",
    [KDA_OP_RMSNORM_BWD] = "rmsnorm_bwd", [KDA_OP_SILU] = "silu",
    [KDA_OP_SILU_BWD] = "silu_bwd",    [KDA_OP_GELU] = "gelu",
    [KDA_OP_GELU_BWD] = "gelu_bwd",    [KDA_OP_SWIGLU] = "swiglu",
    [KDA_OP_SWIGLU_BWD] = "swiglu_bwd", [KDA_OP_SOFTMAX] = "softmax",
    [KDA_OP_SOFTMAX_BWD] = "softmax_bwd", [KDA_OP_ROPE] = "rope",
    [KDA_OP_ATTENTION] = "attention",  [KDA_OP_ATTENTION_BWD] = "attention_bwd",
    [KDA_OP_CROSS_ENTROPY] = "cross_entropy", [KDA_OP_CROSS_ENTROPY_BWD] = "cross_entropy_bwd",
    [KDA_OP_SUM] = "sum",              [KDA_OP_MEAN] = "mean",
    [KDA_OP_FILL] = "fill",            [KDA_OP_VIEW] = "view",
    [KDA_OP_TRANSPOSE] = "transpose",  [KDA_OP_SIGMOID] = "sigmoid",
    [KDA_OP_SIGMOID_BWD] = "sigmoid_bwd", [KDA_OP_GRAD_NORM] = "grad_norm",
    [KDA_OP_SCHEDULE] = "schedule",    [KDA_OP_ADAMW] = "adamw",
    [KDA_OP_GUARD] = "guard",          [KDA_OP_MUON] = "muon",
    [KDA_OP_EMA] = "ema",              [KDA_OP_RETRACT] = "retract",
    [KDA_OP_KDA] = "kda",              [KDA_OP_KDA_BWD] = "kda_bwd",
    [KDA_OP_CONV1D] = "conv1d",        [KDA_OP_CONV1D_BWD] = "conv1d_bwd",
    [KDA_OP_KDA_DECODE] = "kda_decode", [KDA_OP_CONV1D_DECODE] = "conv1d_decode",
    [KDA_OP_ATTN_DECODE] = "attn_decode",
};

const char *kda_op_name(int op) {
  if (op < 0 || op >= KDA_OP_COUNT || !op_names[op]) return "?";
  return op_names[op];
}

int64_t kda_desc_numel(const kda_desc *d) {
  int64_t n = 1;
  for (int i = 0; i < d->ndim; i++) n *= d->shape[i];
  return n;
}

const char *kda_desc_str(const kda_desc *d, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < d->ndim && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)d->shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

static int same_shape(const kda_desc *a, const kda_desc *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

static int64_t last_dim(const kda_desc *d) { return d->shape[d->ndim - 1]; }

/* Error helper: "kda: matmul: a [2,3] and b [4,5]: inner dims differ (3 vs 4)". */
static int bad(int op, const kda_desc *in, int nin, const char *why) {
  char s[4][64];
  const char *names[4] = {"", "", "", ""};
  for (int i = 0; i < nin && i < 4; i++) names[i] = kda_desc_str(&in[i], s[i], sizeof s[i]);
  return kda_set_error("%s: inputs %s %s %s %s: %s", kda_op_name(op), names[0], names[1],
                       names[2], names[3], why);
}

static int want_inputs(int op, int nin, int n) {
  if (nin == n) return 0;
  return kda_set_error("%s: takes %d inputs, got %d", kda_op_name(op), n, nin);
}

static int want_float(int op, const kda_desc *d, const char *which) {
  if (d->dtype == KDA_F32 || d->dtype == KDA_BF16) return 0;
  return kda_set_error("%s: %s must be a float tensor, got %s", kda_op_name(op), which,
                       kda_dtype_name(d->dtype));
}

static int infer_matmul(const kda_desc *in, const int64_t *ia, kda_desc *out) {
  const kda_desc *a = &in[0], *b = &in[1];
  if (a->ndim < 2 || a->ndim > 3 || b->ndim < 2 || b->ndim > 3)
    return bad(KDA_OP_MATMUL, in, 2, "a and b must be 2-D or 3-D");
  if (b->ndim == 3 && (a->ndim != 3 || a->shape[0] != b->shape[0]))
    return bad(KDA_OP_MATMUL, in, 2, "a 3-D b needs a 3-D a with the same batch");
  int64_t m = a->shape[a->ndim - 2], ka = a->shape[a->ndim - 1];
  if (ia[0]) { int64_t t = m; m = ka; ka = t; }
  int64_t kb = b->shape[b->ndim - 2], nn = b->shape[b->ndim - 1];
  if (ia[1]) { int64_t t = kb; kb = nn; nn = t; }
  if (ka != kb) return bad(KDA_OP_MATMUL, in, 2, "inner dimensions differ");
  *out = *a;
  out->shape[a->ndim - 2] = m;
  out->shape[a->ndim - 1] = nn;
  return 0;
}

/* b may equal a's shape, or be a vector of a's last dim (broadcast over rows). */
static int infer_binary(int op, const kda_desc *in, kda_desc *out) {
  if (!same_shape(&in[0], &in[1]) && !(in[1].ndim == 1 && in[1].shape[0] == last_dim(&in[0])))
    return bad(op, in, 2, "b must have a's shape or be a vector of a's last dim");
  *out = in[0];
  return 0;
}

static int infer_view(const kda_desc *x, const int64_t *ia, kda_desc *out) {
  int64_t off = ia[0], nd = ia[1];
  if (nd < 1 || nd > 4) return kda_set_error("view: ndim must be 1..4, got %lld", (long long)nd);
  kda_desc d = {x->dtype, (int32_t)nd, {1, 1, 1, 1}};
  for (int i = 0; i < nd; i++) {
    d.shape[i] = ia[2 + i];
    if (d.shape[i] < 1) return kda_set_error("view: dim %d is %lld; dims must be >= 1", i, (long long)d.shape[i]);
  }
  if (off < 0 || off + kda_desc_numel(&d) > kda_desc_numel(x)) {
    char s1[64], s2[64];
    return kda_set_error("view: %s at offset %lld does not fit in %s", kda_desc_str(&d, s1, 64),
                         (long long)off, kda_desc_str(x, s2, 64));
  }
  *out = d;
  return 0;
}

static int infer_fill(int nin, const int64_t *ia, kda_desc *out) {
  int64_t nd = ia[0];
  if (nin > 1) return kda_set_error("fill: takes 0 or 1 input, got %d", nin);
  if (nd < 1 || nd > 4) return kda_set_error("fill: ndim must be 1..4, got %lld", (long long)nd);
  kda_desc d = {KDA_F32, (int32_t)nd, {1, 1, 1, 1}};
  for (int i = 0; i < nd; i++) d.shape[i] = ia[1 + i];
  *out = d;
  return 0;
}

static int infer_attention(int op, int nin, const kda_desc *in, kda_desc *out) {
  if (in[0].ndim != 4) return bad(op, in, nin, "q must be [B,T,H,Dh]");
  for (int i = 1; i < nin; i++)
    if (!same_shape(&in[0], &in[i])) return bad(op, in, nin, "q, k, v (and dout) must have one shape");
  *out = in[0];
  if (op == KDA_OP_ATTENTION_BWD) {
    out->ndim = 1;
    out->shape[0] = 3 * kda_desc_numel(&in[0]);
  }
  return 0;
}

/* KDA: q, k [B,T,H,K], v [B,T,HV,V], g [B,T,HV,K], beta [B,T,HV], A_log [HV], dt_bias [HV*K]
 * (+ dout [B,T,HV,V] for the backward). Names every shape in the error (7-8 inputs). */
static int bad_kda(int op, const kda_desc *in, int nin, const char *why) {
  char s[8][64];
  const char *n[8] = {"", "", "", "", "", "", "", ""};
  for (int i = 0; i < nin && i < 8; i++) n[i] = kda_desc_str(&in[i], s[i], sizeof s[i]);
  return kda_set_error("%s: q %s k %s v %s g %s beta %s A_log %s dt_bias %s%s%s: %s", kda_op_name(op),
                       n[0], n[1], n[2], n[3], n[4], n[5], n[6], nin > 7 ? " dout " : "", n[7], why);
}

static int infer_kda(int op, int nin, const kda_desc *in, const int64_t *ia, const float *fa, kda_desc *out) {
  const kda_desc *q = &in[0], *k = &in[1], *v = &in[2], *g = &in[3], *b = &in[4];
  for (int i = 0; i < nin; i++)
    if (want_float(op, &in[i], "every input")) return -1;
  if (q->ndim != 4 || v->ndim != 4) return bad_kda(op, in, nin, "q must be [B,T,H,K] and v [B,T,HV,V]");
  int64_t B = q->shape[0], T = q->shape[1], H = q->shape[2], K = q->shape[3], HV = v->shape[2];
  if (!same_shape(q, k)) return bad_kda(op, in, nin, "k must have q's shape [B,T,H,K]");
  if (v->shape[0] != B || v->shape[1] != T) return bad_kda(op, in, nin, "v must share q's B and T");
  if (HV % H) return bad_kda(op, in, nin, "value heads HV must be a multiple of q/k heads H");
  if (g->ndim != 4 || g->shape[0] != B || g->shape[1] != T || g->shape[2] != HV || g->shape[3] != K)
    return bad_kda(op, in, nin, "g must be [B,T,HV,K]");
  if (b->ndim != 3 || b->shape[0] != B || b->shape[1] != T || b->shape[2] != HV)
    return bad_kda(op, in, nin, "beta must be [B,T,HV]");
  if (in[5].ndim != 1 || in[5].shape[0] != HV) return bad_kda(op, in, nin, "A_log must be [HV]");
  if (in[6].ndim != 1 || in[6].shape[0] != HV * K) return bad_kda(op, in, nin, "dt_bias must be [HV*K]");
  if (ia[0] < 0 || ia[0] > 2) return bad_kda(op, in, nin, "iattr0 gate_mode must be 0 (log), 1 (softplus) or 2 (lower bound)");
  if (ia[2] < 0 || ia[2] > 2) return bad_kda(op, in, nin, "iattr2 beta_mode must be 0 (raw), 1 (sigmoid) or 2 (2*sigmoid)");
  if (ia[3] < 0 || ia[3] > 128) return bad_kda(op, in, nin, "iattr3 chunk must be 0 (64) or 1..128");
  if (ia[0] == 2 && !(fa && fa[1] < 0)) return bad_kda(op, in, nin, "the lower-bound gate (gate_mode 2) needs fattr1 lower_bound < 0");
  *out = *v;
  if (op == KDA_OP_KDA_BWD) {
    if (!same_shape(&in[7], v)) return bad_kda(op, in, nin, "dout must have v's shape [B,T,HV,V]");
    out->ndim = 1;
    out->shape[0] = 2 * kda_desc_numel(q) + kda_desc_numel(v) + kda_desc_numel(g) + kda_desc_numel(b) + HV + HV * K;
    out->shape[1] = out->shape[2] = out->shape[3] = 1;
  }
  return 0;
}

static int infer_conv1d(int op, int nin, const kda_desc *in, kda_desc *out) {
  const kda_desc *x = &in[0], *w = &in[1];
  if (want_float(op, x, "x") || want_float(op, w, "w")) return -1;
  if (x->ndim != 3 || w->ndim != 2 || w->shape[0] != x->shape[2])
    return bad(op, in, nin, "want x [B,T,C] and w [C,W]");
  *out = *x;
  if (op == KDA_OP_CONV1D_BWD) {
    if (!same_shape(&in[2], x)) return bad(op, in, nin, "dy must have x's shape [B,T,C]");
    *out = (kda_desc){x->dtype, 1, {kda_desc_numel(x) + kda_desc_numel(w), 1, 1, 1}};
  }
  return 0;
}

/* A one-token activation: [1,1,...]. */
static int one_token(const kda_desc *d) { return d->ndim >= 3 && d->shape[0] == 1 && d->shape[1] == 1; }
static int is_pos(const kda_desc *d) { return d->dtype == KDA_I32 && kda_desc_numel(d) == 1; }

/* KDA_DECODE: the 7 KDA inputs at T = 1 (same checks as KDA), then state [HV,K,V] f32. */
static int infer_kda_decode(int nin, const kda_desc *in, const int64_t *ia, const float *fa, kda_desc *out) {
  int op = KDA_OP_KDA_DECODE;
  if (infer_kda(op, 7, in, ia, fa, out)) return -1;
  if (!one_token(&in[0])) return bad_kda(op, in, 7, "decode takes one token: q [1,1,H,K]");
  const kda_desc *s = &in[7];
  int64_t HV = in[2].shape[2], K = in[0].shape[3], V = in[2].shape[3];
  if (s->dtype != KDA_F32 || s->ndim != 3 || s->shape[0] != HV || s->shape[1] != K || s->shape[2] != V) {
    char b[64];
    return kda_set_error("kda_decode: state %s must be f32 [HV,K,V] = [%lld,%lld,%lld]", kda_desc_str(s, b, 64),
                         (long long)HV, (long long)K, (long long)V);
  }
  (void)nin;
  return 0;
}

static int infer_conv1d_decode(const kda_desc *in, kda_desc *out) {
  int op = KDA_OP_CONV1D_DECODE;
  const kda_desc *x = &in[0], *w = &in[1], *c = &in[2];
  if (want_float(op, x, "x") || want_float(op, w, "w")) return -1;
  if (x->ndim != 3 || !one_token(x) || w->ndim != 2 || w->shape[0] != x->shape[2])
    return bad(op, in, 3, "want x [1,1,C] and w [C,W]");
  if (c->dtype != KDA_F32 || !same_shape(c, w)) return bad(op, in, 3, "cache must be f32 [C,W], w's shape");
  *out = *x;
  return 0;
}

static int infer_attn_decode(const kda_desc *in, kda_desc *out) {
  int op = KDA_OP_ATTN_DECODE;
  const kda_desc *q = &in[0], *kc = &in[3], *vc = &in[4];
  if (q->ndim != 4 || !one_token(q) || !same_shape(q, &in[1]) || !same_shape(q, &in[2]))
    return bad(op, in, 4, "q, k, v must be [1,1,H,Dh]");
  if (kc->dtype != KDA_F32 || kc->ndim != 3 || kc->shape[1] != q->shape[2] || kc->shape[2] != q->shape[3] ||
      !same_shape(kc, vc) || vc->dtype != KDA_F32)
    return bad(op, in, 5, "kcache and vcache must be f32 [Tmax,H,Dh]");
  if (!is_pos(&in[5])) return kda_set_error("attn_decode: pos must be one int32");
  *out = *q;
  return 0;
}

int kda_op_infer(int op, int nin, const kda_desc *in, const int64_t *ia, const float *fa,
                 kda_desc *out) {
  (void)fa;
  static const int64_t zero[8] = {0};
  if (!ia) ia = zero;
  if (op < 0 || op >= KDA_OP_COUNT) return kda_set_error("unknown op id %d", op);
  switch (op) {
  case KDA_OP_INPUT: case KDA_OP_PARAM:
    return kda_set_error("%s: leaves are made with kda_graph_input / kda_graph_param", kda_op_name(op));
  case KDA_OP_MATMUL:
    if (want_inputs(op, nin, 2) || want_float(op, &in[0], "a") || want_float(op, &in[1], "b")) return -1;
    return infer_matmul(in, ia, out);
  case KDA_OP_ADD: case KDA_OP_MUL:
    if (want_inputs(op, nin, 2) || want_float(op, &in[0], "a") || want_float(op, &in[1], "b")) return -1;
    return infer_binary(op, in, out);
  case KDA_OP_SCALE: case KDA_OP_SILU: case KDA_OP_GELU: case KDA_OP_SOFTMAX: case KDA_OP_SIGMOID:
    if (want_inputs(op, nin, 1) || want_float(op, &in[0], "x")) return -1;
    *out = in[0];
    return 0;
  case KDA_OP_SILU_BWD: case KDA_OP_GELU_BWD: case KDA_OP_SOFTMAX_BWD: case KDA_OP_SIGMOID_BWD:
  case KDA_OP_SWIGLU:
    if (want_inputs(op, nin, 2)) return -1;
    if (!same_shape(&in[0], &in[1])) return bad(op, in, 2, "both inputs must have one shape");
    *out = in[0];
    return 0;
  case KDA_OP_SWIGLU_BWD:
    if (want_inputs(op, nin, 3)) return -1;
    if (!same_shape(&in[0], &in[1]) || !same_shape(&in[0], &in[2])) return bad(op, in, 3, "a, b, dy must have one shape");
    *out = (kda_desc){in[0].dtype, 1, {2 * kda_desc_numel(&in[0]), 1, 1, 1}};
    return 0;
  case KDA_OP_SUM_ROWS:
    if (want_inputs(op, nin, 1)) return -1;
    *out = (kda_desc){in[0].dtype, 1, {last_dim(&in[0]), 1, 1, 1}};
    return 0;
  case KDA_OP_EMBED:
    if (want_inputs(op, nin, 2)) return -1;
    if (in[0].ndim != 2 || in[1].dtype != KDA_I32 || in[1].ndim > 3)
      return bad(op, in, 2, "want table [V,D] and int32 indices of up to 3 dims");
    *out = in[1];
    out->dtype = in[0].dtype;
    out->shape[out->ndim++] = in[0].shape[1];
    return 0;
  case KDA_OP_EMBED_BWD:
    if (want_inputs(op, nin, 2)) return -1;
    if (in[1].dtype != KDA_I32 || in[0].ndim != in[1].ndim + 1 || ia[0] < 1)
      return bad(op, in, 2, "want dy [...,D], int32 indices [...] and iattr0 = vocab size");
    *out = (kda_desc){in[0].dtype, 2, {ia[0], last_dim(&in[0]), 1, 1}};
    return 0;
  case KDA_OP_RMSNORM:
    if (want_inputs(op, nin, 2)) return -1;
    if (in[1].ndim != 1 || in[1].shape[0] != last_dim(&in[0])) return bad(op, in, 2, "w must be a vector of x's last dim");
    *out = in[0];
    return 0;
  case KDA_OP_RMSNORM_BWD:
    if (want_inputs(op, nin, 3)) return -1;
    if (!same_shape(&in[0], &in[2]) || in[1].ndim != 1 || in[1].shape[0] != last_dim(&in[0]))
      return bad(op, in, 3, "want x, w [D], dy of x's shape");
    *out = (kda_desc){in[0].dtype, 1, {kda_desc_numel(&in[0]) + last_dim(&in[0]), 1, 1, 1}};
    return 0;
  case KDA_OP_ROPE:
    if (nin != 1 && nin != 2) return kda_set_error("rope: takes x and an optional pos [1] i32, got %d inputs", nin);
    if (in[0].ndim != 4 || in[0].shape[3] % 2 || in[0].shape[3] > KDA_ROPE_MAX_DH)
      return bad(op, in, nin, "x must be [B,T,H,Dh] with even Dh <= 1024");
    if (nin == 2 && !is_pos(&in[1])) return bad(op, in, 2, "pos (the position of row 0) must be one int32");
    *out = in[0];
    return 0;
  case KDA_OP_ATTENTION:
    if (want_inputs(op, nin, 3)) return -1;
    return infer_attention(op, nin, in, out);
  case KDA_OP_ATTENTION_BWD:
    if (want_inputs(op, nin, 4)) return -1;
    return infer_attention(op, nin, in, out);
  case KDA_OP_CROSS_ENTROPY:
    if (want_inputs(op, nin, 2)) return -1;
    if (in[0].ndim != 2 || in[1].dtype != KDA_I32 || kda_desc_numel(&in[1]) != in[0].shape[0])
      return bad(op, in, 2, "want logits [N,V] and N int32 targets");
    *out = (kda_desc){KDA_F32, 1, {in[0].shape[0], 1, 1, 1}};
    return 0;
  case KDA_OP_CROSS_ENTROPY_BWD:
    if (want_inputs(op, nin, 3)) return -1;
    if (in[0].ndim != 2 || kda_desc_numel(&in[1]) != in[0].shape[0] || kda_desc_numel(&in[2]) != in[0].shape[0])
      return bad(op, in, 3, "want logits [N,V], N targets, N loss gradients");
    *out = in[0];
    return 0;
  case KDA_OP_SUM: case KDA_OP_MEAN:
    if (want_inputs(op, nin, 1)) return -1;
    *out = (kda_desc){KDA_F32, 1, {1, 1, 1, 1}};
    return 0;
  case KDA_OP_FILL:
    return infer_fill(nin, ia, out);
  case KDA_OP_VIEW:
    if (want_inputs(op, nin, 1)) return -1;
    return infer_view(&in[0], ia, out);
  case KDA_OP_TRANSPOSE:
    if (want_inputs(op, nin, 1)) return -1;
    if (ia[0] < 0 || ia[1] < 0 || ia[0] >= in[0].ndim || ia[1] >= in[0].ndim)
      return bad(op, in, 1, "transpose dims out of range");
    *out = in[0];
    out->shape[ia[0]] = in[0].shape[ia[1]];
    out->shape[ia[1]] = in[0].shape[ia[0]];
    return 0;
  case KDA_OP_GRAD_NORM:
    if (nin < 1) return kda_set_error("grad_norm: needs at least one gradient");
    *out = (kda_desc){KDA_F32, 1, {1, 1, 1, 1}};
    return 0;
  case KDA_OP_SCHEDULE:
    if (want_inputs(op, nin, 1)) return -1;
    *out = in[0];
    return 0;
  case KDA_OP_KDA:
    if (want_inputs(op, nin, 7)) return -1;
    return infer_kda(op, nin, in, ia, fa, out);
  case KDA_OP_KDA_BWD:
    if (want_inputs(op, nin, 8)) return -1;
    return infer_kda(op, nin, in, ia, fa, out);
  case KDA_OP_CONV1D:
    if (want_inputs(op, nin, 2)) return -1;
    return infer_conv1d(op, nin, in, out);
  case KDA_OP_CONV1D_BWD:
    if (want_inputs(op, nin, 3)) return -1;
    return infer_conv1d(op, nin, in, out);
  case KDA_OP_KDA_DECODE:
    if (want_inputs(op, nin, 8)) return -1;
    return infer_kda_decode(nin, in, ia, fa, out);
  case KDA_OP_CONV1D_DECODE:
    if (want_inputs(op, nin, 3)) return -1;
    return infer_conv1d_decode(in, out);
  case KDA_OP_ATTN_DECODE:
    if (want_inputs(op, nin, 6)) return -1;
    return infer_attn_decode(in, out);
  case KDA_OP_GUARD:
    if (want_inputs(op, nin, 3)) return -1;
    *out = in[0];
    return 0;
  case KDA_OP_MUON:
    if (want_inputs(op, nin, 5)) return -1;
    if (in[0].ndim != 2 || !same_shape(&in[0], &in[1]) || !same_shape(&in[0], &in[2]))
      return bad(op, in, 3, "Muon updates 2-D weights: param, grad, momentum of one shape");
    *out = in[0];
    return 0;
  case KDA_OP_EMA:
    if (want_inputs(op, nin, 3)) return -1;
    if (!same_shape(&in[0], &in[1])) return bad(op, in, 2, "ema and param must have one shape");
    *out = in[0];
    return 0;
  case KDA_OP_RETRACT:
    if (want_inputs(op, nin, 1)) return -1;
    if (in[0].ndim != 2) return bad(op, in, 1, "retraction re-normalises the rows of a 2-D weight");
    *out = in[0];
    return 0;
  case KDA_OP_ADAMW:
    if (want_inputs(op, nin, 6)) return -1;
    if (!same_shape(&in[0], &in[1]) || !same_shape(&in[0], &in[2]) || !same_shape(&in[0], &in[3]))
      return bad(op, in, 4, "param, grad, m, v must have one shape");
    *out = in[0];
    return 0;
  }
  return kda_set_error("%s: no shape rule", kda_op_name(op));
}
