/* optim.cu — the learning-rate schedule and AdamW, both reading their step and lr from the
 * device-resident optimizer state (enum kda_state_slot), so a captured step never needs the
 * host. CPU twin: kda_schedule_lr, cpu_schedule, cpu_adamw in core/cpu_ops.c (same formula,
 * same float/double split, so lr agrees to the last bit or one ulp of cos).             */
#include "kernels.h"

struct sched_args {
  int64_t kind, warm, total;    /* iattr 0..2 */
  float lr, min_frac, decay;    /* fattr 0..2 */
};

__device__ float sched_lr(int64_t step, sched_args a) {
  float lr = a.lr, lo = a.lr * a.min_frac;
  int64_t warm = a.warm, total = a.total > 0 ? a.total : 1;
  if (warm > 0 && step < warm) return lr * (float)(step + 1) / (float)warm;
  if (a.kind == KDA_SCHED_COSINE) {
    double prog = total > warm ? (double)(step - warm) / (double)(total - warm) : 1.0;
    if (prog > 1) prog = 1;
    return lo + (lr - lo) * (float)(0.5 * (1.0 + cos(3.14159265358979323846 * prog)));
  }
  if (a.kind == KDA_SCHED_WSD) {
    int64_t decay = (int64_t)((double)total * a.decay), start = total - decay;
    if (step < start || decay <= 0) return lr;
    double prog = (double)(step - start) / (double)decay;
    if (prog > 1) prog = 1;
    return lr + (lo - lr) * (float)prog;
  }
  return lr;
}

__global__ void k_schedule(float *st, sched_args a) {
  st[1] = sched_lr((int64_t)st[0], a);
  st[0] += 1.0f;
}

int kc_schedule(const kda_exec_node *n, kc_ctx *c) {
  if (n->in[0].dtype != KDA_F32)
    return kda_set_error("cuda: schedule node %d: state must be f32", n->id);
  sched_args a = {n->iattr[0], n->iattr[1], n->iattr[2], n->fattr[0], n->fattr[1], n->fattr[2]};
  k_schedule<<<1, 1, 0, c->stream>>>((float *)n->in[0].data, a);
  KC_LAUNCH_CHECK(n, "k_schedule");
  return 0;
}

/* ---- AdamW, decoupled decay, clip from the global grad norm, NaN guard ------------------- */
struct adamw_args {
  float b1, b2, eps, wd, clip;
};

__global__ void k_adamw(float *p, const void *g, int gdt, float *m, float *v, const float *gnorm,
                        const float *st, int64_t n, adamw_args a) {
  float gn = *gnorm;
  if (!isfinite(gn) || st[KDA_STATE_SKIP] != 0) return; /* NaN/Inf or a guarded spike: no update */
  float lr = st[1], t = st[0];
  float gs = (a.clip > 0 && gn > a.clip) ? a.clip / gn : 1.0f;
  float c1 = 1.0f - powf(a.b1, t), c2 = 1.0f - powf(a.b2, t);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float gi = kc_ld(g, gdt, i) * gs;
    float mi = a.b1 * m[i] + (1.0f - a.b1) * gi;
    float vi = a.b2 * v[i] + (1.0f - a.b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * ((mi / c1) / (sqrtf(vi / c2) + a.eps) + a.wd * p[i]);
  }
}

/* fattr: beta1, beta2, eps, weight_decay, clip. clip is fattr[4]; exec nodes with only four
 * float attributes carry no clip (0: disabled). */
static float fattr_at(const kda_exec_node *n, int i) {
  const int nf = (int)(sizeof n->fattr / sizeof n->fattr[0]);
  const float *f = n->fattr;
  return i < nf ? f[i] : 0.f;
}

int kc_adamw(const kda_exec_node *n, kc_ctx *c) {
  for (int i = 0; i < 6; i++)
    if (i != 1 && n->in[i].dtype != KDA_F32)
      return kda_set_error("cuda: adamw node %d: input %d must be f32 (got %s)", n->id, i,
                           kda_dtype_name(n->in[i].dtype));
  adamw_args a = {fattr_at(n, 0), fattr_at(n, 1), fattr_at(n, 2), fattr_at(n, 3), fattr_at(n, 4)};
  int64_t total = kc_numel(&n->in[0]);
  k_adamw<<<kc_blocks(total, 256, 4 * 132 * 8), 256, 0, c->stream>>>(
      (float *)n->in[0].data, n->in[1].data, n->in[1].dtype, (float *)n->in[2].data,
      (float *)n->in[3].data, (const float *)n->in[4].data, (const float *)n->in[5].data, total, a);
  KC_LAUNCH_CHECK(n, "k_adamw");
  return 0;
}
