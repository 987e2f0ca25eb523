/* ngram.c — byte n-gram models: counting, smoothing (back-off, modified Kneser-Ney, PPM/Witten-Bell)
 * and bits per byte on the held-out window. Methods and their formulas are stated in ngram.h.
 *
 * Keys. An n-gram of order k is packed into a uint64 with its LAST byte in the low 8 bits:
 * key = sum_j b[i-j] << 8j, j = 0..k-1. Its context (the k-1 bytes before the predicted byte) is
 * key >> 8, so a rolling key (key << 8 | b) masked to k bytes yields every order at once.
 * Tables. Per order k: a gram table (key -> raw count, continuation count) and a context table
 * (context -> totals, count-of-count tallies, back-off mass). Open addressing, linear probing,
 * multiplicative hashing, load <= 1/2; count == 0 marks an empty slot. */
#include <math.h>
#include <string.h>
#include "ngram.h"
#include "internal.h"

#define MAXORD 8

typedef struct gram {
  uint64_t key;
  uint32_t count;   /* c(h w): occurrences in the training bytes */
  uint32_t cc;      /* N1+(. h w): distinct bytes seen before h w (Kneser-Ney continuation) */
} gram;

typedef struct ctxent {
  uint64_t key;
  uint64_t tot[2];     /* sum over followers w of [0] c(h w), [1] N1+(. h w) */
  uint16_t n[2][4];    /* followers whose [raw|cont] count is 1, 2, >=3, and >=1 (N1+(h .)) */
  double s;            /* back-off: sum over seen followers of P_lower(w | h') */
} ctxent;

typedef struct gtab { gram *e; uint64_t mask; int64_t used; int shift; } gtab;
typedef struct ctab { ctxent *e; uint64_t mask; int64_t used; int shift; } ctab;

struct kda_ngram {
  int N;                      /* max order */
  gtab g[MAXORD + 1];         /* g[k]: n-grams of order k, k = 1..N */
  ctab c[MAXORD + 1];         /* c[k]: contexts of length k-1 */
  double dbo[MAXORD + 1];     /* back-off discount per order */
  double dkn[2][MAXORD + 1][3]; /* KN discounts D1, D2, D3+ from [raw | continuation] counts */
  int64_t trained;
  double count_s, stats_s;
};

static uint64_t mask_of(int k) { return k >= 8 ? ~0ull : (1ull << (8 * k)) - 1; }
static uint64_t hash(uint64_t key, int shift) { return (key * 0x9E3779B97F4A7C15ull) >> shift; }

/* ---- hash tables ------------------------------------------------------------------------- */
static int gtab_init(gtab *t, int bits) {
  t->e = calloc((size_t)1 << bits, sizeof(gram));
  if (!t->e) return kda_set_error("out of host memory for an n-gram table of 2^%d entries: use a lower order or fewer bytes", bits);
  t->mask = ((uint64_t)1 << bits) - 1, t->used = 0, t->shift = 64 - bits;
  return 0;
}

static gram *gfind(const gtab *t, uint64_t key) {
  for (uint64_t i = hash(key, t->shift);; i = (i + 1) & t->mask) {
    gram *e = &t->e[i];
    if (!e->count) return NULL;
    if (e->key == key) return e;
  }
}

static void gput(gtab *t, const gram *g) {   /* rehash: key known to be absent */
  uint64_t i = hash(g->key, t->shift);
  while (t->e[i].count) i = (i + 1) & t->mask;
  t->e[i] = *g;
  t->used++;
}

static int ggrow(gtab *t) {
  gtab n;
  if (gtab_init(&n, 64 - t->shift + 1) != 0) return -1;
  for (uint64_t i = 0; i <= t->mask; i++)
    if (t->e[i].count) gput(&n, &t->e[i]);
  free(t->e);
  *t = n;
  return 0;
}

static int gadd(gtab *t, uint64_t key) {
  uint64_t i = hash(key, t->shift);
  for (;; i = (i + 1) & t->mask) {
    gram *e = &t->e[i];
    if (!e->count) break;
    if (e->key == key) return e->count++, 0;
  }
  t->e[i].key = key, t->e[i].count = 1;
  return ++t->used * 2 > (int64_t)t->mask + 1 ? ggrow(t) : 0;
}

static int ctab_init(ctab *t, int64_t want) {
  int bits = 4;
  while (((int64_t)1 << bits) < 2 * want) bits++;
  t->e = calloc((size_t)1 << bits, sizeof(ctxent));
  if (!t->e) return kda_set_error("out of host memory for an n-gram context table of 2^%d entries", bits);
  t->mask = ((uint64_t)1 << bits) - 1, t->used = 0, t->shift = 64 - bits;
  return 0;
}

/* contexts always have tot[0] >= 1 once inserted, so tot[0] == 0 marks an empty slot */
static const ctxent *cfind(const ctab *t, uint64_t key) {
  for (uint64_t i = hash(key, t->shift);; i = (i + 1) & t->mask) {
    const ctxent *e = &t->e[i];
    if (!e->tot[0]) return NULL;
    if (e->key == key) return e;
  }
}

static ctxent *cget(ctab *t, uint64_t key) {   /* sized up front: never grows */
  uint64_t i = hash(key, t->shift);
  for (;; i = (i + 1) & t->mask) {
    ctxent *e = &t->e[i];
    if (!e->tot[0]) break;
    if (e->key == key) return e;
  }
  t->used++;
  t->e[i].key = key;
  return &t->e[i];
}

/* ---- probabilities --------------------------------------------------------------------------- */
/* Interpolated modified KN at one level: t = 0 raw counts (the top order), 1 continuation counts. */
static double kn_level(const kda_ngram *m, int t, int k, const ctxent *c, const gram *g, double lower) {
  double tot = (double)c->tot[t];
  if (tot == 0) return lower;
  double cnt = g ? (t ? g->cc : g->count) : 0;
  const double *D = m->dkn[t][k];
  double d = cnt == 0 ? 0 : cnt == 1 ? D[0] : cnt == 2 ? D[1] : D[2];
  double gamma = (D[0] * c->n[t][0] + D[1] * c->n[t][1] + D[2] * c->n[t][2]) / tot;
  return (cnt - d) / tot + gamma * lower;
}

/* out[k-1] = P_k(w | ctx) for k = 1..N, where ctx holds the preceding bytes (nearest in the low
 * byte) and len says how many are real. Orders beyond len+1 repeat order len+1. One bottom-up pass:
 * p is the running lower-order probability, starting from the uniform order 0. */
static void probs(const kda_ngram *m, int method, uint64_t ctx, int64_t len, int w, double *out) {
  double p = 1.0 / 256;
  int kmax = len + 1 < m->N ? (int)len + 1 : m->N;
  for (int k = 1; k <= kmax; k++) {
    uint64_t ck = ctx & mask_of(k - 1);
    const ctxent *c = cfind(&m->c[k], ck);
    double top = p;
    if (c) {
      const gram *g = gfind(&m->g[k], (ck << 8) | (uint64_t)w);
      double seen = c->n[0][3], tot = (double)c->tot[0];
      if (method == KDA_NGRAM_BACKOFF) {
        double D = seen == 256 ? 0 : m->dbo[k];
        if (g) p = (g->count - D) / tot;
        else p *= D * seen / tot / (k == 1 ? 1 - seen / 256 : 1 - c->s);
        top = p;
      } else if (method == KDA_NGRAM_PPM) {
        p = ((g ? g->count : 0) + seen * p) / (tot + seen);
        top = p;
      } else {
        top = kn_level(m, 0, k, c, g, p);
        p = kn_level(m, 1, k, c, g, p);
      }
    }
    out[k - 1] = top;
  }
  for (int k = kmax + 1; k <= m->N; k++) out[k - 1] = out[kmax - 1];
}

/* ---- training -------------------------------------------------------------------------------- */
/* KN discounts from counts-of-counts r[1..4] (Chen & Goodman eq. 26), clamped so that a count c
 * never loses more than c; a fallback when the tallies are too thin to estimate. */
static void kn_discounts(const int64_t *r, double *D) {
  if (r[1] == 0 || r[2] == 0 || r[3] == 0 || r[4] == 0) {
    D[0] = 0.5, D[1] = 1.0, D[2] = 1.5;
    return;
  }
  double Y = (double)r[1] / (double)(r[1] + 2 * r[2]);
  D[0] = 1 - 2 * Y * r[2] / r[1];
  D[1] = 2 - 3 * Y * r[3] / r[2];
  D[2] = 3 - 4 * Y * r[4] / r[3];
  for (int i = 0; i < 3; i++) D[i] = fmin(fmax(D[i], 0.01), i + 1.0);
}

static void tally(uint16_t *n, uint64_t c) {
  if (c == 0) return;
  n[c >= 3 ? 2 : c - 1]++;
  n[3]++;
}

/* Everything after counting: continuation counts, discounts, context tables, back-off masses. */
static int build_stats(kda_ngram *m) {
  for (int k = 2; k <= m->N; k++) {   /* N1+(. h w) of order k-1 = distinct left extensions */
    const gtab *t = &m->g[k];
    for (uint64_t i = 0; i <= t->mask; i++)
      if (t->e[i].count) {
        gram *s = gfind(&m->g[k - 1], t->e[i].key & mask_of(k - 1));
        KDA_CHECK(s);
        s->cc++;
      }
  }
  for (int k = 1; k <= m->N; k++) {
    const gtab *t = &m->g[k];
    int64_t r[2][5] = {{0}};
    for (uint64_t i = 0; i <= t->mask; i++) {
      const gram *e = &t->e[i];
      if (!e->count) continue;
      if (e->count <= 4) r[0][e->count]++;
      if (e->cc >= 1 && e->cc <= 4) r[1][e->cc]++;
    }
    double Dbo = r[0][1] > 0 ? (double)r[0][1] / (double)(r[0][1] + 2 * r[0][2]) : 0.5;
    m->dbo[k] = fmin(fmax(Dbo, 0.05), 0.95);
    kn_discounts(r[0], m->dkn[0][k]);
    kn_discounts(r[1], m->dkn[1][k]);
    int64_t nctx = k == 1 ? 1 : m->g[k - 1].used;   /* contexts of order k are (k-1)-grams */
    if (ctab_init(&m->c[k], nctx) != 0) return -1;
    for (uint64_t i = 0; i <= t->mask; i++) {
      const gram *e = &t->e[i];
      if (!e->count) continue;
      ctxent *c = cget(&m->c[k], e->key >> 8);
      c->tot[0] += e->count, c->tot[1] += e->cc;
      tally(c->n[0], e->count);
      tally(c->n[1], e->cc);
    }
    if (k == 1) continue;
    /* back-off mass of the seen followers under the order below, with the same function the
     * evaluation uses (orders < k are complete by now) */
    double out[MAXORD];
    for (uint64_t i = 0; i <= t->mask; i++) {
      const gram *e = &t->e[i];
      if (!e->count) continue;
      probs(m, KDA_NGRAM_BACKOFF, e->key >> 8, k - 2, (int)(e->key & 255), out);
      ((ctxent *)cfind(&m->c[k], e->key >> 8))->s += out[k - 2];
    }
  }
  return 0;
}

/* One pass per order. The tables of orders >= 3 outgrow the caches, so the slot of the n-gram
 * AHEAD positions on is prefetched while the current one is counted: the misses overlap. */
static int count_order(gtab *t, int k, const uint8_t *b, int64_t n) {
  enum { AHEAD = 16 };
  uint64_t mk = mask_of(k), key = 0, ahead = 0;
  for (int64_t i = 0; i < AHEAD && i < n; i++) ahead = (ahead << 8) | b[i];
  for (int64_t i = 0; i < n; i++) {
    if (k >= 3 && i + AHEAD < n) {
      ahead = (ahead << 8) | b[i + AHEAD];
      __builtin_prefetch(&t->e[hash(ahead & mk, t->shift)], 1);
    }
    key = (key << 8) | b[i];
    if (i + 1 >= k && gadd(t, key & mk) != 0) return -1;   /* the first k-1 bytes start no k-gram */
  }
  return 0;
}

static int count(kda_ngram *m, const uint8_t *b, int64_t n) {
  /* tables start small and double at load 1/2: pre-sizing them for the final count measured
   * slower (sparser tables, more page faults) */
  for (int k = 1; k <= m->N; k++)
    if (gtab_init(&m->g[k], k == 1 ? 9 : 16) != 0 || count_order(&m->g[k], k, b, n) != 0) return -1;
  return 0;
}

kda_ngram *kda_ngram_train(const uint8_t *bytes, int64_t n, int max_order) {
  if (max_order < 1 || max_order > MAXORD)
    return kda_set_error("n-gram order %d out of range: use 1..%d", max_order, MAXORD), NULL;
  if (!bytes || n < 1) return kda_set_error("n-gram training needs at least one byte"), NULL;
  if (n > 0xFFFFFFFFll) return kda_set_error("n-gram training on %lld bytes: counts are 32-bit, pass at most 4 GiB", (long long)n), NULL;
  kda_ngram *m = calloc(1, sizeof *m);
  if (!m) return kda_set_error("out of host memory for an n-gram model"), NULL;
  m->N = max_order;
  m->trained = n;
  double t0 = kda_now();
  if (count(m, bytes, n) != 0) return kda_ngram_free(m), NULL;
  double t1 = kda_now();
  if (build_stats(m) != 0) return kda_ngram_free(m), NULL;
  m->count_s = t1 - t0, m->stats_s = kda_now() - t1;
  return m;
}

kda_ngram *kda_ngram_train_domain(const kda_data *d, int i, int max_order, int64_t max_bytes) {
  int64_t start = kda_data_window_start(d, i);
  if (start < 0) return NULL;
  int64_t n = max_bytes > 0 && max_bytes < start ? max_bytes : start;
  return kda_ngram_train(kda_data_domain_ptr(d, i) + start - n, n, max_order);
}

void kda_ngram_free(kda_ngram *m) {
  if (!m) return;
  for (int k = 0; k <= MAXORD; k++) free(m->g[k].e), free(m->c[k].e);
  free(m);
}

/* ---- queries ----------------------------------------------------------------------------------- */
const char *kda_ngram_method_name(int method) {
  static const char *names[] = {"backoff", "kn", "ppm"};
  return method >= 0 && method < KDA_NGRAM_NMETHODS ? names[method] : NULL;
}

int kda_ngram_max_order(const kda_ngram *m) { return m ? m->N : -1; }
int64_t kda_ngram_trained_bytes(const kda_ngram *m) { return m ? m->trained : -1; }
double kda_ngram_count_seconds(const kda_ngram *m) { return m ? m->count_s : -1; }
double kda_ngram_stats_seconds(const kda_ngram *m) { return m ? m->stats_s : -1; }

int64_t kda_ngram_entries(const kda_ngram *m, int order) {
  if (!m || order < 1 || order > m->N) return kda_set_error("n-gram order %d out of range 1..%d", order, m ? m->N : 0);
  return m->g[order].used;
}

int64_t kda_ngram_count(const kda_ngram *m, const uint8_t *gram_bytes, int n) {
  if (!m || n < 1 || n > m->N) return kda_set_error("n-gram of length %d: the model has orders 1..%d", n, m ? m->N : 0);
  uint64_t key = 0;
  for (int j = 0; j < n; j++) key = (key << 8) | gram_bytes[j];
  const gram *g = gfind(&m->g[n], key);
  return g ? g->count : 0;
}

int64_t kda_ngram_memory_bytes(const kda_ngram *m) {
  if (!m) return -1;
  int64_t b = (int64_t)sizeof *m;
  for (int k = 1; k <= m->N; k++)
    b += (int64_t)(m->g[k].mask + 1) * (int64_t)sizeof(gram) + (int64_t)(m->c[k].mask + 1) * (int64_t)sizeof(ctxent);
  return b;
}

static int check(const kda_ngram *m, int method, int order) {
  if (!m) return kda_set_error("no n-gram model (NULL)");
  if (method < 0 || method >= KDA_NGRAM_NMETHODS) return kda_set_error("unknown n-gram method %d: use KDA_NGRAM_BACKOFF, _KN or _PPM", method);
  if (order < 1 || order > m->N) return kda_set_error("n-gram order %d: this model was trained up to order %d", order, m->N);
  return 0;
}

static uint64_t pack_ctx(const uint8_t *ctx, int64_t len) {
  uint64_t c = 0;
  for (int64_t j = len > 7 ? len - 7 : 0; j < len; j++) c = (c << 8) | ctx[j];
  return c;
}

double kda_ngram_prob(const kda_ngram *m, int method, int order, const uint8_t *ctx, int64_t ctx_len, int byte) {
  if (check(m, method, order) != 0) return -1;
  if (byte < 0 || byte > 255) return kda_set_error("byte %d out of range 0..255", byte);
  double out[MAXORD];
  probs(m, method, pack_ctx(ctx, ctx_len), ctx_len, byte, out);
  return out[order - 1];
}

int kda_ngram_dist(const kda_ngram *m, int method, int order, const uint8_t *ctx, int64_t ctx_len, double *out) {
  if (check(m, method, order) != 0) return -1;
  double o[MAXORD];
  uint64_t c = pack_ctx(ctx, ctx_len);
  for (int b = 0; b < 256; b++) {
    probs(m, method, c, ctx_len, b, o);
    out[b] = o[order - 1];
  }
  return 0;
}

double kda_ngram_bits(const kda_ngram *m, int method, int order, const uint8_t *bytes, int64_t n) {
  if (check(m, method, order) != 0) return -1;
  double bits = 0, o[MAXORD];
  uint64_t c = 0;
  for (int64_t i = 0; i < n; i++) {
    probs(m, method, c, i, bytes[i], o);
    bits -= log2(o[order - 1]);
    c = (c << 8) | bytes[i];
  }
  return bits;
}

int kda_ngram_bpb_orders(const kda_ngram *m, int method, const kda_data *d, int i, int64_t T, double *bpb) {
  if (check(m, method, 1) != 0) return -1;
  int64_t W = kda_data_window_bytes(d, i);
  if (W < 0) return -1;
  if (T <= 0) T = W;
  int64_t nseq = kda_data_window_count(d, i, T);
  if (nseq < 0) return -1;
  int32_t *x = kda_malloc(sizeof(int32_t) * 2 * (size_t)T, "a window sequence");
  if (!x) return -1;
  int32_t *y = x + T;
  double bits[MAXORD] = {0}, o[MAXORD];
  int64_t counted = 0;
  for (int64_t k = 0; k < nseq; k++) {
    int64_t first = kda_data_window_seq(d, i, T, k, x, y);
    KDA_CHECK(first >= 0);
    uint64_t c = 0;
    for (int64_t j = 0; j < T; j++) {
      c = (c << 8) | (uint64_t)x[j];     /* the target y[j] sees x[0..j], as the model does */
      if (j < first) continue;
      probs(m, method, c, j + 1, y[j], o);
      for (int r = 0; r < m->N; r++) bits[r] -= log2(o[r]);
      counted++;
    }
  }
  free(x);
  KDA_CHECK(counted == W);
  for (int r = 0; r < m->N; r++) bpb[r] = bits[r] / (double)W;
  return 0;
}

double kda_ngram_bpb(const kda_ngram *m, int method, int order, const kda_data *d, int i, int64_t T) {
  double bpb[MAXORD];
  if (check(m, method, order) != 0 || kda_ngram_bpb_orders(m, method, d, i, T, bpb) != 0) return -1;
  return bpb[order - 1];
}
