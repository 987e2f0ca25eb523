/* data.c — domains (mmap'd files or concatenated folders), held-out windows, the training
 * sampler and its prefetch thread. The rules are stated in data.h; this file implements them.
 * defines: kda_data_open, kda_data_open_manifest, kda_data_window_*, kda_data_next_batch, ... */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "data.h"
#include "internal.h"

#define WINDOW_MAX (1 << 20)   /* the default held-out window: min(1 MiB, S/10) */
#define MIN_DOMAIN 16          /* below this a window and a training range cannot both exist */

typedef struct domain {
  char *name;
  uint8_t *ptr;
  int64_t size;
  int mapped;                  /* 1: munmap(ptr, size); 0: free(ptr) */
  double weight;
  int64_t window;              /* W */
} domain;

struct kda_data {
  int n;
  domain *dom;
  /* sampler, fixed by kda_data_start */
  int started;
  int64_t B, T;
  uint64_t seed;
  double *cum;                 /* cumulative normalised weights, cum[n-1] == 1 */
  kda_host_alloc_fn alloc;
  kda_host_free_fn free_fn;
  int32_t *tok[2], *tgt[2], *dom_of[2];
  int cur;                     /* slot of the batch the caller holds, -1 before the first */
  /* prefetch: batch number s lives in slot s%2; the producer stays at most one batch ahead */
  int prefetch, thread_up, stop;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t produced, consumed; /* next batch to fill; batches handed to the caller */
  uint64_t ready[2];           /* batch number held by each slot, UINT64_MAX = none */
};

/* ---- loading ------------------------------------------------------------------------------ */
static int load_file(domain *dm, const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return kda_set_error("cannot open data file %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size == 0) {
    close(fd);
    return kda_set_error("data file %s is empty: rebuild it (bash vendor/data.sh small) or drop it", path);
  }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return kda_set_error("cannot mmap %s: %s", path, strerror(errno));
  madvise(p, (size_t)st.st_size, MADV_RANDOM);   /* the sampler jumps around */
  dm->ptr = p;
  dm->size = st.st_size;
  dm->mapped = 1;
  return 0;
}

typedef struct { char **v; int n, cap; } strlist;

static int strlist_push(strlist *l, const char *s) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    char **v = realloc(l->v, sizeof(char *) * (size_t)cap);
    if (!v) return kda_set_error("out of memory listing a data folder");
    l->v = v, l->cap = cap;
  }
  if (!(l->v[l->n] = strdup(s))) return kda_set_error("out of memory listing a data folder");
  l->n++;
  return 0;
}

static void strlist_free(strlist *l) {
  for (int i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
}

/* Every regular file under dir, recursively; symlinks are not followed. */
static int list_files(const char *dir, strlist *out) {
  DIR *dp = opendir(dir);
  if (!dp) return kda_set_error("cannot read data folder %s: %s", dir, strerror(errno));
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(dp))) {
    if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) {
      rc = kda_set_error("path too long under %s", dir);
      break;
    }
    struct stat st;
    if (lstat(path, &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) rc = list_files(path, out);
    else if (S_ISREG(st.st_mode)) rc = strlist_push(out, path);
  }
  closedir(dp);
  return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A folder domain: its files sorted by path, concatenated into one malloc'd buffer. */
static int load_dir(domain *dm, const char *dir) {
  strlist files = {0};
  if (list_files(dir, &files) != 0) return strlist_free(&files), -1;
  if (files.n > 1) qsort(files.v, (size_t)files.n, sizeof(char *), cmp_str);
  int64_t total = 0;
  for (int i = 0; i < files.n; i++) {
    struct stat st;
    if (stat(files.v[i], &st) == 0) total += st.st_size;
  }
  if (total == 0) {
    strlist_free(&files);
    return kda_set_error("data folder %s holds no bytes: put text files in it", dir);
  }
  uint8_t *buf = kda_malloc((size_t)total, "a data folder");
  int64_t at = 0;
  for (int i = 0; buf && i < files.n && at < total; i++) {
    FILE *f = fopen(files.v[i], "rb");
    if (!f) continue;   /* unreadable member: skipped, the size check below notices */
    at += (int64_t)fread(buf + at, 1, (size_t)(total - at), f);
    fclose(f);
  }
  strlist_free(&files);
  if (!buf) return -1;
  if (at != total) {
    free(buf);
    return kda_set_error("data folder %s changed or has unreadable files while loading: fix permissions", dir);
  }
  dm->ptr = buf, dm->size = total, dm->mapped = 0;
  return 0;
}

static char *default_name(const char *path) {
  size_t len = strlen(path);
  while (len > 1 && path[len - 1] == '/') len--;
  const char *base = path;
  for (size_t i = 0; i < len; i++)
    if (path[i] == '/' && i + 1 < len) base = path + i + 1;
  size_t n = (size_t)(path + len - base);
  const char *dot = memchr(base, '.', n);
  if (dot && dot != base) n = (size_t)(dot - base);
  return strndup(base, n);
}

static int64_t default_window(int64_t size) {
  int64_t w = size / 10;
  return w < WINDOW_MAX ? w : WINDOW_MAX;
}

kda_data *kda_data_open(int n, const char *const *paths, const char *const *names,
                        const double *weights) {
  if (n <= 0 || !paths) return kda_set_error("kda_data_open: no domains given: pass at least one path"), NULL;
  kda_data *d = calloc(1, sizeof *d);
  if (d) d->dom = calloc((size_t)n, sizeof(domain));
  if (!d || !d->dom) return free(d), kda_set_error("out of memory opening data"), NULL;
  d->cur = -1;
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  for (int i = 0; i < n; i++) {
    domain *dm = &d->dom[i];
    d->n = i + 1;   /* so kda_data_free releases what is loaded so far */
    struct stat st;
    if (!paths[i] || stat(paths[i], &st) != 0) {
      kda_set_error("data domain %s not found: build it with 'bash vendor/data.sh small' or fix the path",
                    paths[i] ? paths[i] : "(null)");
      return kda_data_free(d), NULL;
    }
    int rc = S_ISDIR(st.st_mode) ? load_dir(dm, paths[i]) : load_file(dm, paths[i]);
    if (rc != 0) return kda_data_free(d), NULL;
    dm->name = names && names[i] ? strdup(names[i]) : default_name(paths[i]);
    dm->weight = weights ? weights[i] : 1.0;
    if (dm->size < MIN_DOMAIN) {
      kda_set_error("data domain %s has %lld bytes; a domain needs at least %d", paths[i],
                    (long long)dm->size, MIN_DOMAIN);
      return kda_data_free(d), NULL;
    }
    if (!(dm->weight >= 0)) {
      kda_set_error("data domain %s has weight %g; weights must be >= 0", paths[i], dm->weight);
      return kda_data_free(d), NULL;
    }
    dm->window = default_window(dm->size);
  }
  return d;
}

/* ---- MANIFEST ------------------------------------------------------------------------------ */
/* Lines: '#' comments, "profile P", "package NAME VERSION", "domain NAME BYTES SHA256 FILE". */
kda_data *kda_data_open_manifest(const char *dir, int n, const char *const *names,
                                 const double *weights) {
  char path[4096];
  snprintf(path, sizeof path, "%s/MANIFEST", dir);
  FILE *f = fopen(path, "r");
  if (!f) return kda_set_error("cannot open %s: build the corpus with 'bash vendor/data.sh small'", path), NULL;
  enum { MAXDOM = 64 };
  char dname[MAXDOM][128], dfile[MAXDOM][4096];
  int nd = 0, lineno = 0, bad = 0;
  char line[8192];
  while (!bad && fgets(line, sizeof line, f)) {
    lineno++;
    if (line[0] == '#' || line[0] == '\n') continue;
    char kw[32], a[128], sha[128], file[1024];
    long long bytes;
    if (sscanf(line, "%31s", kw) != 1) { bad = 1; break; }
    if (!strcmp(kw, "profile") || !strcmp(kw, "package")) continue;
    if (strcmp(kw, "domain") || nd == MAXDOM ||
        sscanf(line, "domain %127s %lld %127s %1023s", a, &bytes, sha, file) != 4 || strlen(sha) != 64 ||
        strspn(sha, "0123456789abcdef") != 64 || bytes <= 0 || strchr(file, '/')) {
      bad = 1;
      break;
    }
    if (snprintf(dfile[nd], sizeof dfile[nd], "%s/%s", dir, file) >= (int)sizeof dfile[nd]) { bad = 1; break; }
    snprintf(dname[nd], sizeof dname[nd], "%s", a);
    struct stat st;
    if (stat(dfile[nd], &st) != 0 || st.st_size != bytes) {
      fclose(f);
      kda_set_error("%s line %d: %s should have %lld bytes but %s: rebuild with 'bash vendor/data.sh'",
                    path, lineno, dfile[nd], bytes, stat(dfile[nd], &st) != 0 ? "is missing" : "differs");
      return NULL;
    }
    nd++;
  }
  fclose(f);
  if (bad || nd == 0) {
    kda_set_error("%s is corrupt (line %d: expected 'domain NAME BYTES SHA256 FILE'): rebuild with 'bash vendor/data.sh'",
                  path, bad ? lineno : 0);
    return NULL;
  }
  const char *p[MAXDOM], *nm[MAXDOM];
  int m = n > 0 ? n : nd;
  if (m > MAXDOM) return kda_set_error("too many domains (%d > %d)", m, MAXDOM), NULL;
  for (int i = 0; i < m; i++) {
    int j = i;
    if (n > 0) {
      for (j = 0; j < nd && strcmp(dname[j], names[i]); j++) {}
      if (j == nd) return kda_set_error("domain '%s' is not in %s: see the domain lines there", names[i], path), NULL;
    }
    p[i] = dfile[j], nm[i] = dname[j];
  }
  return kda_data_open(m, p, nm, n > 0 ? weights : NULL);
}

static void stop_thread(kda_data *d);

void kda_data_free(kda_data *d) {
  if (!d) return;
  stop_thread(d);
  for (int i = 0; i < d->n; i++) {
    domain *dm = &d->dom[i];
    if (dm->ptr && dm->mapped) munmap(dm->ptr, (size_t)dm->size);
    else free(dm->ptr);
    free(dm->name);
  }
  for (int s = 0; s < 2; s++) {
    void *bufs[3] = {d->tok[s], d->tgt[s], d->dom_of[s]};
    for (int k = 0; k < 3; k++)
      if (bufs[k]) d->free_fn ? d->free_fn(bufs[k]) : free(bufs[k]);
  }
  free(d->cum);
  free(d->dom);
  pthread_mutex_destroy(&d->mu);
  pthread_cond_destroy(&d->cv);
  free(d);
}

/* ---- domains and windows ------------------------------------------------------------------- */
static int bad_domain(const kda_data *d, int i) {
  if (!d || i < 0 || i >= d->n) return kda_set_error("data domain index %d out of range (have %d)", i, d ? d->n : 0), 1;
  return 0;
}

int kda_data_ndomains(const kda_data *d) { return d ? d->n : 0; }
const char *kda_data_domain_name(const kda_data *d, int i) { return bad_domain(d, i) ? NULL : d->dom[i].name; }
int64_t kda_data_domain_bytes(const kda_data *d, int i) { return bad_domain(d, i) ? -1 : d->dom[i].size; }
const uint8_t *kda_data_domain_ptr(const kda_data *d, int i) { return bad_domain(d, i) ? NULL : d->dom[i].ptr; }
double kda_data_domain_weight(const kda_data *d, int i) { return bad_domain(d, i) ? -1 : d->dom[i].weight; }
int64_t kda_data_window_start(const kda_data *d, int i) { return bad_domain(d, i) ? -1 : d->dom[i].size - d->dom[i].window; }
int64_t kda_data_window_bytes(const kda_data *d, int i) { return bad_domain(d, i) ? -1 : d->dom[i].window; }

int kda_data_set_weight(kda_data *d, int i, double w) {
  if (bad_domain(d, i)) return -1;
  if (d->started) return kda_set_error("kda_data_set_weight: the sampler has started; set weights before kda_data_start");
  if (!(w >= 0)) return kda_set_error("domain %s: weight %g must be >= 0", d->dom[i].name, w);
  d->dom[i].weight = w;
  return 0;
}

int kda_data_set_window(kda_data *d, int i, int64_t bytes) {
  if (bad_domain(d, i)) return -1;
  if (d->started) return kda_set_error("kda_data_set_window: the sampler has started; set windows before kda_data_start");
  if (bytes < 1 || bytes > d->dom[i].size - 2)
    return kda_set_error("domain %s: window of %lld bytes must be in 1..%lld", d->dom[i].name,
                         (long long)bytes, (long long)d->dom[i].size - 2);
  d->dom[i].window = bytes;
  return 0;
}

int64_t kda_data_window_count(const kda_data *d, int i, int64_t T) {
  if (bad_domain(d, i)) return -1;
  if (T < 1 || T > d->dom[i].size - 1)
    return kda_set_error("domain %s: seq_len %lld must be in 1..%lld", d->dom[i].name, (long long)T,
                         (long long)d->dom[i].size - 1);
  return (d->dom[i].window + T - 1) / T;
}

int64_t kda_data_window_seq(const kda_data *d, int i, int64_t T, int64_t k, int32_t *input, int32_t *target) {
  int64_t count = kda_data_window_count(d, i, T);
  if (count < 0) return -1;
  if (k < 0 || k >= count)
    return kda_set_error("domain %s: window sequence %lld out of range 0..%lld", d->dom[i].name,
                         (long long)k, (long long)count - 1);
  const domain *dm = &d->dom[i];
  int64_t want = dm->size - dm->window + k * T;    /* first target this sequence counts */
  int64_t s = want < dm->size - T ? want : dm->size - T;
  const uint8_t *p = dm->ptr;
  for (int64_t j = 0; j < T; j++) {
    input[j] = p[s + j - 1];
    target[j] = p[s + j];
  }
  return want - s;
}

int64_t kda_data_window_batch(const kda_data *d, int i, int64_t T, int64_t B, int64_t first,
                              int32_t *input, int32_t *target, float *mask) {
  int64_t count = kda_data_window_count(d, i, T);
  if (count < 0) return -1;
  if (B < 1 || first < 0) return kda_set_error("kda_data_window_batch: batch %lld, first %lld must be >= 1, >= 0", (long long)B, (long long)first);
  int64_t real = 0;
  for (int64_t r = 0; r < B; r++) {
    int64_t k = first + r < count ? first + r : count - 1;
    int64_t c = kda_data_window_seq(d, i, T, k, input + r * T, target + r * T);
    if (first + r >= count) c = T;                 /* padding row: nothing counted */
    else real++;
    if (mask)
      for (int64_t j = 0; j < T; j++) mask[r * T + j] = j >= c ? 1.0f : 0.0f;
  }
  return real;
}

/* ---- sampler ------------------------------------------------------------------------------- */
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* uniform integer in [0, n) from a 64-bit random word (multiply-shift, no division) */
static int64_t below(uint64_t r, int64_t n) { return (int64_t)(((unsigned __int128)r * (uint64_t)n) >> 64); }

/* Batch number `step` into slot s: a pure function of (seed, step), whatever thread runs it. */
static void fill(kda_data *d, uint64_t step, int s) {
  for (int64_t r = 0; r < d->B; r++) {
    uint64_t x = d->seed ^ (step * 0xD1B54A32D192ED03ull) ^ ((uint64_t)r * 0x8CB92BA72F3D8DD7ull);
    splitmix64(&x);
    double u = (double)(splitmix64(&x) >> 11) * 0x1.0p-53;
    int i = 0;
    while (i < d->n - 1 && u >= d->cum[i]) i++;
    const domain *dm = &d->dom[i];
    int64_t o = below(splitmix64(&x), dm->size - dm->window - d->T);   /* targets end before the window */
    int32_t *tk = d->tok[s] + r * d->T, *tg = d->tgt[s] + r * d->T;
    const uint8_t *p = dm->ptr + o;
    for (int64_t j = 0; j < d->T; j++) tk[j] = p[j], tg[j] = p[j + 1];
    d->dom_of[s][r] = i;
  }
}

static void *producer(void *arg) {
  kda_data *d = arg;
  pthread_mutex_lock(&d->mu);
  while (!d->stop) {
    if (d->produced > d->consumed) {   /* slot produced%2 still held by the caller */
      pthread_cond_wait(&d->cv, &d->mu);
      continue;
    }
    uint64_t p = d->produced;
    pthread_mutex_unlock(&d->mu);
    fill(d, p, (int)(p & 1));
    pthread_mutex_lock(&d->mu);
    d->ready[p & 1] = p;
    d->produced = p + 1;
    pthread_cond_broadcast(&d->cv);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

static void stop_thread(kda_data *d) {
  if (!d->thread_up) return;
  pthread_mutex_lock(&d->mu);
  d->stop = 1;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  pthread_join(d->thread, NULL);
  d->thread_up = 0;
}

static int start_thread(kda_data *d) {
  d->stop = 0;
  d->ready[0] = d->ready[1] = UINT64_MAX;
  d->produced = d->consumed;
  d->cur = -1;
  if (!d->prefetch) return 0;
  if (pthread_create(&d->thread, NULL, producer, d) != 0)
    return kda_set_error("cannot start the data prefetch thread: %s", strerror(errno));
  d->thread_up = 1;
  return 0;
}

int kda_data_set_allocator(kda_data *d, kda_host_alloc_fn alloc, kda_host_free_fn free_fn) {
  if (!d) return kda_set_error("kda_data_set_allocator: no data handle");
  if (d->started) return kda_set_error("kda_data_set_allocator: call it before kda_data_start");
  if (!alloc != !free_fn) return kda_set_error("kda_data_set_allocator: give both alloc and free, or neither");
  d->alloc = alloc, d->free_fn = free_fn;
  return 0;
}

int kda_data_start(kda_data *d, int64_t B, int64_t T, uint64_t seed, int prefetch) {
  if (!d) return kda_set_error("kda_data_start: no data handle");
  if (d->started) return kda_set_error("kda_data_start: already started; open a new handle for another shape");
  if (B < 1 || T < 1) return kda_set_error("kda_data_start: batch %lld and seq_len %lld must be >= 1", (long long)B, (long long)T);
  double total = 0;
  for (int i = 0; i < d->n; i++) {
    const domain *dm = &d->dom[i];
    if (dm->weight > 0 && dm->size - dm->window - T < 1)
      return kda_set_error("domain %s: %lld training bytes cannot hold a sequence of %lld: use a shorter seq_len or more data",
                           dm->name, (long long)(dm->size - dm->window), (long long)T);
    total += dm->weight;
  }
  if (!(total > 0)) return kda_set_error("kda_data_start: all domain weights are 0: give some domain a weight > 0");
  d->cum = kda_malloc(sizeof(double) * (size_t)d->n, "mixture weights");
  if (!d->cum) return -1;
  double acc = 0;
  for (int i = 0; i < d->n; i++) d->cum[i] = (acc += d->dom[i].weight) / total;
  d->cum[d->n - 1] = 1.0;
  size_t bt = sizeof(int32_t) * (size_t)(B * T);
  for (int s = 0; s < 2; s++) {
    d->tok[s] = d->alloc ? d->alloc((int64_t)bt) : kda_malloc(bt, "a token batch");
    d->tgt[s] = d->alloc ? d->alloc((int64_t)bt) : kda_malloc(bt, "a target batch");
    d->dom_of[s] = d->alloc ? d->alloc((int64_t)(sizeof(int32_t) * (size_t)B)) : kda_malloc(sizeof(int32_t) * (size_t)B, "batch domains");
    if (!d->tok[s] || !d->tgt[s] || !d->dom_of[s])
      return kda_set_error("out of host memory for two [%lld,%lld] batch buffers", (long long)B, (long long)T);
  }
  d->B = B, d->T = T, d->seed = seed, d->prefetch = prefetch != 0;
  d->consumed = 0;
  d->started = 1;
  return start_thread(d);
}

int kda_data_next_batch(kda_data *d, int32_t *tokens, int32_t *targets) {
  if (!d || !d->started) return kda_set_error("kda_data_next_batch: call kda_data_start first");
  uint64_t want = d->consumed;
  int s = (int)(want & 1);
  if (d->prefetch) {
    pthread_mutex_lock(&d->mu);
    while (d->ready[s] != want) pthread_cond_wait(&d->cv, &d->mu);
    d->consumed = want + 1;            /* releases the other slot to the producer */
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
  } else {
    fill(d, want, s);
    d->consumed = want + 1;
  }
  d->cur = s;
  size_t bt = sizeof(int32_t) * (size_t)(d->B * d->T);
  if (tokens) memcpy(tokens, d->tok[s], bt);
  if (targets) memcpy(targets, d->tgt[s], bt);
  return 0;
}

const int32_t *kda_data_batch_tokens(const kda_data *d) { return d && d->cur >= 0 ? d->tok[d->cur] : NULL; }
const int32_t *kda_data_batch_targets(const kda_data *d) { return d && d->cur >= 0 ? d->tgt[d->cur] : NULL; }
const int32_t *kda_data_batch_domains(const kda_data *d) { return d && d->cur >= 0 ? d->dom_of[d->cur] : NULL; }

int kda_data_get_state(const kda_data *d, uint64_t *state) {
  if (!d || !d->started) return kda_set_error("kda_data_get_state: call kda_data_start first");
  state[0] = d->seed;
  state[1] = d->consumed;
  return 0;
}

int kda_data_set_state(kda_data *d, const uint64_t *state) {
  if (!d || !d->started) return kda_set_error("kda_data_set_state: call kda_data_start first (same batch shape)");
  stop_thread(d);
  d->seed = state[0];
  d->consumed = state[1];
  return start_thread(d);
}
