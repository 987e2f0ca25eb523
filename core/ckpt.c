/* ckpt.c — checkpoints: two safetensors files per step (ckpt.h), written atomically and
 * validated completely before anything reaches the plan.
 *
 * safetensors: 8-byte little-endian header length N, N bytes of JSON (padded with spaces so
 * the data starts 8-aligned), then the tensors back to back in header order. The JSON maps each
 * name to {"dtype","shape","data_offsets":[begin,end]} (offsets relative to the data start) and
 * "__metadata__" to a string->string map. The reader below accepts exactly that much JSON. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt.h"
#include "internal.h"

#define MAX_NAME 256
#define MAX_DIMS 4
#define MAX_META 16
#define MAX_HEADER (100 << 20) /* the safetensors limit */

static const char *meta_keys[KDA_CKPT_NMETA] = {"step", "data_seed", "data_step"};

static uint64_t fnv1a64(const unsigned char *x, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < n; i++) h = (h ^ x[i]) * 1099511628211ull;
  return h;
}

/* ---- which buffers go where ------------------------------------------------------------ */
typedef struct { int32_t id; const char *name; int ndim; int64_t shape[MAX_DIMS], bytes; } want;

/* The plan's persistent buffers for one file: parameters (model) or the rest (state). */
static int wanted(kda_plan *p, const kda_graph *g, int params, want *w) {
  int n = 0;
  for (int i = 0; i < kda_plan_nstate(p); i++) {
    int32_t id = kda_plan_state_node(p, i);
    if ((kda_graph_node_op(g, id) == KDA_OP_PARAM) != params) continue;
    want *x = &w[n++];
    x->id = id, x->name = kda_plan_state_name(p, i), x->ndim = kda_graph_node_ndim(g, id), x->bytes = 4;
    for (int d = 0; d < x->ndim; d++) x->shape[d] = kda_graph_node_dim(g, id, d), x->bytes *= x->shape[d];
    KDA_CHECK(kda_plan_node_dtype(p, id) == KDA_F32); /* persistent buffers are f32 everywhere */
  }
  return n;
}

/* ---- writing ------------------------------------------------------------------------------ */
typedef struct { char *s; size_t n, cap; } sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (b->s && b->n + (size_t)k < b->cap) { b->n += (size_t)k; return; }
    b->cap = (b->cap + (size_t)k + 1) * 2;
    b->s = realloc(b->s, b->cap);
    KDA_CHECK(b->s);
  }
}

static int write_fail(const char *path, const char *tmp, int fd) {
  int e = errno;
  if (fd >= 0) close(fd);
  unlink(tmp);
  return kda_set_error("checkpoint: writing %s failed (%s): free space or choose another run dir", path,
                       strerror(e));
}

static int write_all(int fd, const void *x, size_t n) {
  const char *c = x;
  while (n > 0) {
    ssize_t k = write(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) { if (k == 0) errno = ENOSPC; return -1; }
    c += k, n -= (size_t)k;
  }
  return 0;
}

/* <path>.tmp, fsync, rename over path, fsync the folder: readers see old or new, never torn. */
static int write_atomic(const char *path, const sbuf *head, const void *data, int64_t nd) {
  char tmp[4096], dir[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return write_fail(path, tmp, -1);
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)head->n >> (8 * i));
  if (write_all(fd, len, 8) || write_all(fd, head->s, head->n) || write_all(fd, data, (size_t)nd) || fsync(fd))
    return write_fail(path, tmp, fd);
  if (close(fd) || rename(tmp, path)) return write_fail(path, tmp, -1);
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
  int dfd = open(dir, O_RDONLY);
  if (dfd >= 0) fsync(dfd), close(dfd);
  return 0;
}

static int save_file(kda_plan *p, const kda_graph *g, int params, const char *path, const uint64_t *meta) {
  want *w = kda_malloc((size_t)kda_plan_nstate(p) * sizeof *w + 1, "checkpoint names");
  if (!w) return -1;
  int n = wanted(p, g, params, w);
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += w[i].bytes;
  unsigned char *data = kda_malloc((size_t)total, path);
  if (!data) return free(w), -1;
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    if (kda_plan_read(p, w[i].id, data + off, w[i].bytes)) return free(w), free(data), -1;
    off += w[i].bytes;
  }
  sbuf h = {0};
  sb_add(&h, "{\"__metadata__\":{\"format\":\"kda\"");
  for (int k = 0; k < KDA_CKPT_NMETA; k++) sb_add(&h, ",\"%s\":\"%llu\"", meta_keys[k], (unsigned long long)meta[k]);
  sb_add(&h, ",\"checksum\":\"fnv1a64:%016llx\"}", (unsigned long long)fnv1a64(data, total));
  off = 0;
  for (int i = 0; i < n; i++) {
    sb_add(&h, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", w[i].name);
    for (int d = 0; d < w[i].ndim; d++) sb_add(&h, d ? ",%lld" : "%lld", (long long)w[i].shape[d]);
    sb_add(&h, "],\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + w[i].bytes));
    off += w[i].bytes;
  }
  sb_add(&h, "}");
  while ((8 + h.n) % 8) sb_add(&h, " "); /* the data starts 8-aligned */
  int rc = write_atomic(path, &h, data, total);
  free(h.s), free(data), free(w);
  return rc;
}

int kda_ckpt_save(kda_plan *p, const kda_graph *g, const char *prefix, const uint64_t *meta) {
  char path[4096];
  snprintf(path, sizeof path, "%s.state.safetensors", prefix);
  if (save_file(p, g, 0, path, meta)) return -1;
  snprintf(path, sizeof path, "%s.model.safetensors", prefix);
  return save_file(p, g, 1, path, meta);
}

/* ---- a JSON reader for safetensors headers -------------------------------------------------- */
typedef struct { char name[MAX_NAME], dtype[16]; int ndim; int64_t shape[8], off[2]; } entry;
typedef struct { char key[64], val[128]; } kv;
typedef struct {
  const char *s, *start, *file;
  entry *e; int ne, cap;
  kv meta[MAX_META]; int nmeta;
} jp;

static int jerr(jp *j, const char *what) {
  return kda_set_error("checkpoint %s: bad header at byte %d (%s): the file is corrupt; delete it or resume from "
                       "another checkpoint", j->file, (int)(j->s - j->start), what);
}
static void ws(jp *j) { while (*j->s && isspace((unsigned char)*j->s)) j->s++; }
static int lit(jp *j, char c) { ws(j); if (*j->s != c) return -1; j->s++; return 0; }

static int jstr(jp *j, char *out, size_t cap) {
  if (lit(j, '"')) return jerr(j, "expected a string");
  size_t n = 0;
  for (; *j->s != '"'; j->s++) {
    char c = *j->s;
    if (!c || (unsigned char)c < 0x20) return jerr(j, "unterminated string");
    if (c == '\\') {
      c = *++j->s;
      if (c != '"' && c != '\\' && c != '/') return jerr(j, "unsupported escape");
    }
    if (n + 1 >= cap) return jerr(j, "string too long");
    out[n++] = c;
  }
  j->s++;
  out[n] = 0;
  return 0;
}

static int jints(jp *j, int64_t *v, int max, int *n) {
  if (lit(j, '[')) return jerr(j, "expected '['");
  *n = 0;
  if (!lit(j, ']')) return 0;
  do {
    ws(j);
    if (!isdigit((unsigned char)*j->s)) return jerr(j, "expected a non-negative integer");
    if (*n >= max) return jerr(j, "too many numbers");
    char *end;
    errno = 0;
    long long x = strtoll(j->s, &end, 10);
    if (errno) return jerr(j, "number out of range");
    v[(*n)++] = x, j->s = end;
  } while (!lit(j, ','));
  return lit(j, ']') ? jerr(j, "expected ']'") : 0;
}

static int jtensor(jp *j, entry *e) {
  char key[32];
  int seen = 0, n;
  if (lit(j, '{')) return jerr(j, "expected '{'");
  do {
    if (jstr(j, key, sizeof key) || lit(j, ':')) return jerr(j, "expected a key");
    if (!strcmp(key, "dtype")) { if (jstr(j, e->dtype, sizeof e->dtype)) return -1; seen |= 1; }
    else if (!strcmp(key, "shape")) { if (jints(j, e->shape, 8, &e->ndim)) return -1; seen |= 2; }
    else if (!strcmp(key, "data_offsets")) {
      if (jints(j, e->off, 2, &n)) return -1;
      if (n != 2) return jerr(j, "data_offsets needs two numbers");
      seen |= 4;
    } else return jerr(j, "unknown tensor field");
  } while (!lit(j, ','));
  if (lit(j, '}') || seen != 7) return jerr(j, "tensor needs dtype, shape and data_offsets");
  return 0;
}

static int jheader(jp *j) {
  char key[MAX_NAME];
  if (lit(j, '{')) return jerr(j, "expected '{'");
  if (!lit(j, '}')) return 0;
  do {
    if (jstr(j, key, sizeof key) || lit(j, ':')) return jerr(j, "expected a name");
    if (!strcmp(key, "__metadata__")) {
      if (lit(j, '{')) return jerr(j, "expected '{'");
      if (!lit(j, '}')) continue; /* empty */
      do {
        kv tmp, *m = j->nmeta < MAX_META ? &j->meta[j->nmeta++] : &tmp;
        if (jstr(j, m->key, sizeof m->key) || lit(j, ':') || jstr(j, m->val, sizeof m->val)) return jerr(j, "metadata");
      } while (!lit(j, ','));
      if (lit(j, '}')) return jerr(j, "expected '}'");
      continue;
    }
    if (j->ne == j->cap) return jerr(j, "more tensors than the model has");
    entry *e = &j->e[j->ne++];
    snprintf(e->name, sizeof e->name, "%s", key);
    if (jtensor(j, e)) return -1;
  } while (!lit(j, ','));
  if (lit(j, '}')) return jerr(j, "expected '}'");
  ws(j);
  return *j->s ? jerr(j, "trailing bytes") : 0;
}

/* ---- reading and validating ----------------------------------------------------------------- */
typedef struct { unsigned char *buf; int64_t size, data; want *w; int nw; int64_t *src; uint64_t meta[KDA_CKPT_NMETA]; } loaded;

static int bad(const char *file, const char *what, const char *name) {
  return kda_set_error("checkpoint %s: %s%s%s: the file is corrupt or from another model; delete it or resume from "
                       "another checkpoint", file, what, name ? " " : "", name ? name : "");
}

/* Reads file whole and checks it holds exactly the wanted tensors; src[i] = offset of w[i]. */
static int load_file(const char *file, loaded *L) {
  FILE *f = fopen(file, "rb");
  if (!f) return kda_set_error("checkpoint %s: cannot open it (%s): check the run dir", file, strerror(errno));
  fseek(f, 0, SEEK_END);
  L->size = ftell(f);
  fseek(f, 0, SEEK_SET);
  L->buf = kda_malloc((size_t)(L->size > 0 ? L->size : 1) + 1, file);
  if (!L->buf) return fclose(f), -1;
  int64_t got = (int64_t)fread(L->buf, 1, (size_t)L->size, f);
  fclose(f);
  if (got != L->size) return kda_set_error("checkpoint %s: read error: check the disk", file);
  uint64_t n = 0;
  for (int i = 7; i >= 0 && L->size >= 8; i--) n = n << 8 | L->buf[i];
  if (L->size < 8 || n > MAX_HEADER || (int64_t)n > L->size - 8) return bad(file, "truncated (shorter than its header)", NULL);
  char *text = kda_malloc(n + 1, file);
  if (!text) return -1;
  memcpy(text, L->buf + 8, n), text[n] = 0;
  jp j = {.s = text, .start = text, .file = file, .cap = L->nw + 1};
  j.e = kda_malloc((size_t)j.cap * sizeof *j.e, file);
  int rc = j.e ? jheader(&j) : -1;
  free(text);
  if (rc) return free(j.e), -1;
  L->data = 8 + (int64_t)n;
  int64_t dbytes = L->size - L->data, end = 0;
  const char *err = NULL, *name = NULL;
  char buf[160];
  if (j.ne != L->nw) err = j.ne < L->nw ? "has fewer tensors than the model" : "has more tensors than the model";
  for (int i = 0; i < L->nw && !err; i++) {
    entry *e = NULL;
    for (int k = 0; k < j.ne && !e; k++) if (!strcmp(j.e[k].name, L->w[i].name)) e = &j.e[k];
    name = L->w[i].name;
    if (!e) { err = "lacks the tensor"; break; }
    int same = e->ndim == L->w[i].ndim;
    for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == L->w[i].shape[d];
    if (strcmp(e->dtype, "F32")) err = "wants dtype F32 for";
    else if (!same) err = "has another shape for";
    else if (e->off[0] > e->off[1] || e->off[1] - e->off[0] != L->w[i].bytes) err = "has bad data_offsets for";
    else if (e->off[1] > dbytes) err = "is truncated: the file ends inside";
    L->src[i] = L->data + e->off[0];
    if (e->off[1] > end) end = e->off[1];
  }
  free(j.e);
  if (err) return bad(file, err, name);
  if (end != dbytes) return bad(file, end < dbytes ? "has trailing bytes" : "is truncated", NULL);
  const char *sum = NULL;
  for (int k = 0; k < KDA_CKPT_NMETA; k++) L->meta[k] = UINT64_MAX;
  for (int m = 0; m < j.nmeta; m++) {
    if (!strcmp(j.meta[m].key, "checksum")) sum = j.meta[m].val;
    for (int k = 0; k < KDA_CKPT_NMETA; k++)
      if (!strcmp(j.meta[m].key, meta_keys[k])) L->meta[k] = strtoull(j.meta[m].val, NULL, 10);
  }
  snprintf(buf, sizeof buf, "fnv1a64:%016llx", (unsigned long long)fnv1a64(L->buf + L->data, dbytes));
  if (!sum || strcmp(sum, buf)) return bad(file, sum ? "checksum mismatch" : "has no checksum", NULL);
  for (int k = 0; k < KDA_CKPT_NMETA; k++) if (L->meta[k] == UINT64_MAX) return bad(file, "metadata lacks", meta_keys[k]);
  return 0;
}

/* files = 1: the model file only (a forward-only plan, e.g. sampling); 2: both. */
static int load(kda_plan *p, const kda_graph *g, const char *prefix, uint64_t *meta_out, int files) {
  int ns = kda_plan_nstate(p), rc = -1;
  loaded L[2] = {{0}};
  char path[2][4096];
  snprintf(path[0], sizeof path[0], "%s.model.safetensors", prefix);
  snprintf(path[1], sizeof path[1], "%s.state.safetensors", prefix);
  for (int f = 0; f < files; f++) {
    L[f].w = kda_malloc((size_t)ns * sizeof(want) + 1, "checkpoint names");
    L[f].src = kda_malloc((size_t)ns * sizeof(int64_t) + 1, "checkpoint offsets");
    if (!L[f].w || !L[f].src) goto out;
    L[f].nw = wanted(p, g, f == 0, L[f].w);
    if (load_file(path[f], &L[f])) goto out;
  }
  for (int k = 0; k < KDA_CKPT_NMETA && files == 2; k++)
    if (L[0].meta[k] != L[1].meta[k]) {
      kda_set_error("checkpoint %s: the model and state files are from different steps: delete them or resume "
                    "from another checkpoint", prefix);
      goto out;
    }
  /* everything checked: only now touch the plan */
  for (int f = 0; f < files; f++)
    for (int i = 0; i < L[f].nw; i++)
      if (kda_plan_write(p, L[f].w[i].id, L[f].buf + L[f].src[i], L[f].w[i].bytes)) goto out;
  memcpy(meta_out, L[0].meta, sizeof L[0].meta);
  rc = 0;
out:
  for (int f = 0; f < 2; f++) free(L[f].buf), free(L[f].w), free(L[f].src);
  return rc;
}

int kda_ckpt_load(kda_plan *p, const kda_graph *g, const char *prefix, uint64_t *meta_out) {
  return load(p, g, prefix, meta_out, 2);
}
int kda_ckpt_load_params(kda_plan *p, const kda_graph *g, const char *prefix, uint64_t *meta_out) {
  return load(p, g, prefix, meta_out, 1);
}

/* ---- run directories ------------------------------------------------------------------------- */
static int by_step(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

int kda_ckpt_list(const char *dir, int64_t *steps, int max) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0, cap = 64;
  int64_t *all = malloc((size_t)cap * sizeof *all);
  struct dirent *e;
  while (all && (e = readdir(d))) {
    long long s;
    int end = 0;
    if (sscanf(e->d_name, "ckpt-%lld.model.safetensors%n", &s, &end) != 1 || e->d_name[end] || s < 0) continue;
    if (n == cap) all = realloc(all, (size_t)(cap *= 2) * sizeof *all);
    if (all) all[n++] = s;
  }
  closedir(d);
  if (!all) return kda_set_error("out of host memory listing %s", dir);
  qsort(all, (size_t)n, sizeof *all, by_step);
  for (int i = 0; i < n && i < max; i++) steps[i] = all[i];
  free(all);
  return n;
}

int kda_mkdirs(const char *path) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *c = buf + 1;; c++) {
    if (*c != '/' && *c) continue;
    char keep = *c;
    *c = 0;
    if (mkdir(buf, 0755) && errno != EEXIST)
      return kda_set_error("cannot create folder %s (%s): check the path and permissions", buf, strerror(errno));
    if (!(*c = keep)) return 0;
  }
}

int kda_isatty(int fd) { return isatty(fd); }
