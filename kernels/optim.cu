/* optim.cu — the learning-rate schedule and AdamW, both reading their step and lr from the
 * device-resident optimizer state (enum kda_state_slot), so a captured step never needs the
 * host. CPU twin: kda_schedule_lr, cpu_schedule, cpu_adamw in core/cpu_ops.c (same formula,
 * same float/double split, so lr agrees to the last bit or one ulp of cos).             */
#include <string.h>
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

/* ---- AdamW, decoupled decay, clip from the global grad norm, NaN guard -------------------
 * Multi-tensor: a run of consecutive ADAMW nodes sharing gnorm, state, betas, eps and clip
 * (the optimizer tail of a step) is one launch per AW_PER_LAUNCH tensors; the table of
 * (param, grad, m, v, n, wd) rides in the kernel arguments (by value: captured into the graph
 * node, so no device-side table has to outlive the list). One block per AW_CHUNK elements of
 * one tensor. The per-element arithmetic is the single-tensor kernel's, unchanged.
 * Predicted: GPT S step ~75 launches -> 2 (~0.15 ms of 9.26 ms); GPT M 148 -> 4 — predicted;
 * to be measured. */
enum { AW_PER_LAUNCH = 48, AW_CHUNK = 4096 };

struct adamw_args {
  float b1, b2, eps, clip;
};

struct adamw_batch {
  int count;
  int64_t first_block[AW_PER_LAUNCH + 1];   /* prefix sums of ceil(n / AW_CHUNK) */
  float *p[AW_PER_LAUNCH], *m[AW_PER_LAUNCH], *v[AW_PER_LAUNCH];
  const void *g[AW_PER_LAUNCH];
  int64_t n[AW_PER_LAUNCH];
  float wd[AW_PER_LAUNCH];
  int gdt[AW_PER_LAUNCH];
};

__global__ void __launch_bounds__(256) k_adamw_multi(adamw_batch t, const float *gnorm,
                                                     const float *st, adamw_args a) {
  float gn = *gnorm;
  if (!isfinite(gn) || st[KDA_STATE_SKIP] != 0) return; /* NaN/Inf or a guarded spike: no update */
  const int64_t b = blockIdx.x;
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {   /* last e with first_block[e] <= b */
    int mid = (lo + hi + 1) >> 1;
    if (t.first_block[mid] <= b) lo = mid; else hi = mid - 1;
  }
  float *p = t.p[lo], *m = t.m[lo], *v = t.v[lo];
  const void *g = t.g[lo];
  const int gdt = t.gdt[lo];
  const float wd = t.wd[lo];
  const int64_t i0 = (b - t.first_block[lo]) * AW_CHUNK, i1 = min(t.n[lo], i0 + (int64_t)AW_CHUNK);
  float lr = st[1], tt = st[0];
  float gs = (a.clip > 0 && gn > a.clip) ? a.clip / gn : 1.0f;
  float c1 = 1.0f - powf(a.b1, tt), c2 = 1.0f - powf(a.b2, tt);
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    float gi = kc_ld(g, gdt, i) * gs;
    float mi = a.b1 * m[i] + (1.0f - a.b1) * gi;
    float vi = a.b2 * v[i] + (1.0f - a.b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * ((mi / c1) / (sqrtf(vi / c2) + a.eps) + wd * p[i]);
  }
}

/* fattr: beta1, beta2, eps, weight_decay, clip. clip is fattr[4]; exec nodes with only four
 * float attributes carry no clip (0: disabled). */
static float fattr_at(const kda_exec_node *n, int i) {
  const int nf = (int)(sizeof n->fattr / sizeof n->fattr[0]);
  const float *f = n->fattr;
  return i < nf ? f[i] : 0.f;
}

static int adamw_check(const kda_exec_node *n) {
  for (int i = 0; i < 6; i++)
    if (i != 1 && n->in[i].dtype != KDA_F32)
      return kda_set_error("cuda: adamw node %d: input %d must be f32 (got %s)", n->id, i,
                           kda_dtype_name(n->in[i].dtype));
  return 0;
}

/* Same gnorm, state and hyper-parameters other than weight decay: one launch may run both. */
static int adamw_fusable(const kda_exec_node *a, const kda_exec_node *b) {
  if (b->op != KDA_OP_ADAMW || b->nin != 6) return 0;
  if (a->in[4].data != b->in[4].data || a->in[5].data != b->in[5].data) return 0;
  for (int i = 0; i < 5; i++)
    if (i != 3 && fattr_at(a, i) != fattr_at(b, i)) return 0;
  return 1;
}

int kc_adamw_multi(const kda_exec_node *nodes, int avail, kc_ctx *c) {
  const kda_exec_node *n0 = &nodes[0];
  if (adamw_check(n0)) return -1;
  int cnt = 1;
  while (cnt < avail && adamw_fusable(n0, &nodes[cnt])) {
    /* the launch runs its tensors concurrently: a tensor updated twice keeps its order */
    int dup = 0;
    for (int j = 0; j < cnt && !dup; j++)
      for (int x = 0; x < 4; x++)
        if (x != 1 && nodes[j].in[x].data == nodes[cnt].in[x].data) dup = 1;
    if (dup) break;
    if (adamw_check(&nodes[cnt])) return -1;
    cnt++;
  }
  adamw_args a = {fattr_at(n0, 0), fattr_at(n0, 1), fattr_at(n0, 2), fattr_at(n0, 4)};
  for (int at = 0; at < cnt; at += AW_PER_LAUNCH) {
    adamw_batch t;
    memset(&t, 0, sizeof t);
    t.count = cnt - at < AW_PER_LAUNCH ? cnt - at : AW_PER_LAUNCH;
    int64_t blocks = 0;
    for (int e = 0; e < t.count; e++) {
      const kda_exec_node *n = &nodes[at + e];
      t.first_block[e] = blocks;
      t.p[e] = (float *)n->in[0].data, t.g[e] = n->in[1].data, t.gdt[e] = n->in[1].dtype;
      t.m[e] = (float *)n->in[2].data, t.v[e] = (float *)n->in[3].data;
      t.n[e] = kc_numel(&n->in[0]), t.wd[e] = fattr_at(n, 3);
      blocks += (t.n[e] + AW_CHUNK - 1) / AW_CHUNK;
    }
    t.first_block[t.count] = blocks;
    if (blocks == 0) continue;
    k_adamw_multi<<<(unsigned)blocks, 256, 0, c->stream>>>(
        t, (const float *)n0->in[4].data, (const float *)n0->in[5].data, a);
    KC_LAUNCH_CHECK(&nodes[at], "k_adamw_multi");
  }
  return cnt;
}

int kc_adamw(const kda_exec_node *n, kc_ctx *c) { return kc_adamw_multi(n, 1, c) < 0 ? -1 : 0; }
