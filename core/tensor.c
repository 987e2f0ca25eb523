/* tensor.c — eager host tensors for the REPL and tests.
 *
 * kda_tensor_op runs one op through the same shape rules (ops.c) and the same CPU code
 * (cpu_ops.c) as a planned graph, so what you try in the REPL is what training computes.  */
#include <math.h>
#include <string.h>
#include "backend.h"
#include "internal.h"
#include "ops.h"

struct kda_tensor {
  kda_desc d;
  char *data;
  kda_tensor *base; /* views keep their base alive */
  int refs;
};

static kda_tensor *tensor_alloc(const kda_desc *d) {
  kda_tensor *t = calloc(1, sizeof *t);
  int64_t bytes = kda_desc_numel(d) * kda_dtype_size(d->dtype);
  if (t) t->data = calloc(1, (size_t)(bytes ? bytes : 1));
  if (!t || !t->data) {
    free(t);
    kda_set_error("out of host memory for a tensor of %lld bytes", (long long)bytes);
    return NULL;
  }
  t->d = *d, t->refs = 1;
  return t;
}

kda_tensor *kda_tensor_new(int dtype, int ndim, const int64_t *shape) {
  if (dtype < 0 || dtype > KDA_F64) { kda_set_error("tensor: unknown dtype %d", dtype); return NULL; }
  if (ndim < 1 || ndim > 4) { kda_set_error("tensor: ndim must be 1..4, got %d", ndim); return NULL; }
  kda_desc d = {dtype, ndim, {1, 1, 1, 1}};
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 1) { kda_set_error("tensor: dim %d is %lld; dims must be >= 1", i, (long long)shape[i]); return NULL; }
    d.shape[i] = shape[i];
  }
  return tensor_alloc(&d);
}

kda_tensor *kda_tensor_view(kda_tensor *base, int64_t offset, int ndim, const int64_t *shape) {
  int64_t ia[8] = {offset, ndim};
  kda_desc d;
  for (int i = 0; i < ndim && i < 4; i++) ia[2 + i] = shape[i];
  if (kda_op_infer(KDA_OP_VIEW, 1, &base->d, ia, NULL, &d)) return NULL;
  kda_tensor *t = calloc(1, sizeof *t);
  if (!t) { kda_set_error("out of host memory for a view"); return NULL; }
  t->d = d, t->refs = 1;
  t->data = base->data + offset * kda_dtype_size(d.dtype); /* relative to the caller's tensor */
  while (base->base) base = base->base;                       /* but owned by the root */
  t->base = base;
  base->refs++;
  return t;
}

void kda_tensor_free(kda_tensor *t) {
  if (!t || --t->refs > 0) return;
  if (t->base) kda_tensor_free(t->base);
  else free(t->data);
  free(t);
}

void *kda_tensor_data(kda_tensor *t) { return t->data; }
int kda_tensor_dtype(const kda_tensor *t) { return t->d.dtype; }
int kda_tensor_ndim(const kda_tensor *t) { return t->d.ndim; }
int64_t kda_tensor_dim(const kda_tensor *t, int i) { return i >= 0 && i < t->d.ndim ? t->d.shape[i] : -1; }
int64_t kda_tensor_numel(const kda_tensor *t) { return kda_desc_numel(&t->d); }

void kda_tensor_randn(kda_tensor *t, uint64_t seed, float std) {
  KDA_CHECK(t->d.dtype == KDA_F32);
  kda_fill_normal((float *)t->data, kda_desc_numel(&t->d), seed, std);
}

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
  uint32_t u;
  memcpy(&u, &f, 4);
  if (isnan(f)) return 0x7FC0;
  return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static double get(const kda_tensor *t, int64_t i) {
  switch (t->d.dtype) {
  case KDA_F32: return ((const float *)t->data)[i];
  case KDA_BF16: return bf16_to_f32(((const uint16_t *)t->data)[i]);
  case KDA_I32: return ((const int32_t *)t->data)[i];
  case KDA_U8: return ((const uint8_t *)t->data)[i];
  default: return ((const double *)t->data)[i];
  }
}
static void set(kda_tensor *t, int64_t i, double v) {
  switch (t->d.dtype) {
  case KDA_F32: ((float *)t->data)[i] = (float)v; break;
  case KDA_BF16: ((uint16_t *)t->data)[i] = f32_to_bf16((float)v); break;
  case KDA_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
  case KDA_U8: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
  default: ((double *)t->data)[i] = v; break;
  }
}

kda_tensor *kda_tensor_cast(kda_tensor *t, int dtype) {
  kda_desc d = t->d;
  d.dtype = dtype;
  if (dtype < 0 || dtype > KDA_F64) { kda_set_error("cast: unknown dtype %d", dtype); return NULL; }
  kda_tensor *o = tensor_alloc(&d);
  if (!o) return NULL;
  for (int64_t i = 0, n = kda_desc_numel(&d); i < n; i++) set(o, i, get(t, i));
  return o;
}

kda_tensor *kda_tensor_op(int op, int nin, kda_tensor *const *in, const int64_t *iattr, const float *fattr) {
  kda_desc din[8], out;
  static const int64_t zi[8];
  static const float zf[8];
  if (nin < 0 || nin > 8) { kda_set_error("%s: eager ops take at most 8 inputs", kda_op_name(op)); return NULL; }
  if (op == KDA_OP_VIEW) return kda_tensor_view(in[0], iattr[0], (int)iattr[1], iattr + 2);
  for (int i = 0; i < nin; i++) din[i] = in[i]->d;
  if (op == KDA_OP_SCHEDULE || op == KDA_OP_ADAMW || op == KDA_OP_GUARD || op == KDA_OP_MUON ||
      op == KDA_OP_EMA || op == KDA_OP_RETRACT) { kda_set_error("%s: optimizer ops run inside a plan", kda_op_name(op)); return NULL; }
  if (kda_op_infer(op, nin, din, iattr, fattr, &out)) return NULL;
  kda_tensor *o = tensor_alloc(&out);
  if (!o) return NULL;
  kda_tview views[8];
  kda_exec_node e = {op, -1, nin, views, {o->data, out.dtype, out.ndim, {0}}, {0}, {0}, 0, 0, 0};
  memcpy(e.out.shape, out.shape, sizeof out.shape);
  memcpy(e.iattr, iattr ? iattr : zi, sizeof e.iattr);
  memcpy(e.fattr, fattr ? fattr : zf, sizeof e.fattr);
  for (int i = 0; i < nin; i++) {
    views[i] = (kda_tview){in[i]->data, in[i]->d.dtype, in[i]->d.ndim, {0}};
    memcpy(views[i].shape, in[i]->d.shape, sizeof views[i].shape);
  }
  if (kda_cpu_run_node(&e)) { kda_tensor_free(o); return NULL; }
  return o;
}
