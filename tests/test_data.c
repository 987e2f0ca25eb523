/* test_data.c — domains, held-out windows, the sampler and its errors, on fixtures in /tmp.
 * Prints "ok - name" or "FAIL - name: detail" per check, then "N passed, N failed". */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "data.h"
#include "kda.h"
#include "check.h"


/* A fixture file of n pseudo-random bytes drawn from `alphabet` letters; path into buf. */
static void fixture(char *path, size_t size, int64_t n, int alphabet, uint32_t seed) {
  snprintf(path, size, "/tmp/kda-test-data-XXXXXX");
  int fd = mkstemp(path);
  if (fd < 0) perror("mkstemp"), exit(2);
  uint8_t *b = malloc((size_t)n);
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    b[i] = (uint8_t)('a' + (seed >> 24) % (uint32_t)alphabet);
  }
  if (write(fd, b, (size_t)n) != (ssize_t)n) perror("write"), exit(2);
  close(fd);
  free(b);
}

static void test_windows(const char *path, int64_t S) {
  const char *p[1] = {path};
  kda_data *d = kda_data_open(1, p, NULL, NULL);
  check(d != NULL, "open a file domain", NULL);
  if (!d) return;
  int64_t W = kda_data_window_bytes(d, 0);
  check(W == (S / 10 < (1 << 20) ? S / 10 : (1 << 20)) && kda_data_window_start(d, 0) == S - W,
        "window rule min(1 MiB, S/10) at the tail", "");
  const uint8_t *bytes = kda_data_domain_ptr(d, 0);
  /* every window byte is counted exactly once, whatever seq_len; the sequences read the domain */
  int64_t Ts[] = {1, 7, 64, 1000, W, W + 5};
  int ok = 1;
  char detail[200] = "";
  for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) {
    int64_t T = Ts[t], n = kda_data_window_count(d, 0, T);
    int32_t *x = malloc(sizeof(int32_t) * (size_t)T), *y = malloc(sizeof(int32_t) * (size_t)T);
    int *hits = calloc((size_t)W, sizeof(int));
    for (int64_t k = 0; k < n; k++) {
      int64_t first = kda_data_window_seq(d, 0, T, k, x, y);
      int64_t s = S - W + k * T - first;   /* byte index of y[0] */
      for (int64_t j = 0; j < T; j++) {
        if (y[j] != bytes[s + j] || x[j] != bytes[s + j - 1]) ok = 0;
        if (j >= first) {
          if (s + j < S - W) ok = 0;
          else hits[s + j - (S - W)]++;
        }
      }
    }
    for (int64_t i = 0; i < W; i++)
      if (hits[i] != 1) ok = 0, snprintf(detail, sizeof detail, "T=%lld byte %lld counted %d times", (long long)T, (long long)i, hits[i]);
    free(x), free(y), free(hits);
  }
  check(ok, "window covers every byte once for any seq_len", detail);
  /* batched form: rows and mask agree with the per-sequence form */
  int64_t T = 100, B = 4, n = kda_data_window_count(d, 0, T), counted = 0;
  int32_t *x = malloc(sizeof(int32_t) * (size_t)(B * T)), *y = malloc(sizeof(int32_t) * (size_t)(B * T));
  float *mask = malloc(sizeof(float) * (size_t)(B * T));
  for (int64_t k = 0; k < n; k += B) {
    kda_data_window_batch(d, 0, T, B, k, x, y, mask);
    for (int64_t j = 0; j < B * T; j++) counted += mask[j] > 0;
  }
  check(counted == W, "window batches with mask count W bytes", "");
  free(x), free(y), free(mask);
  kda_data_free(d);
}

static int64_t count_domain(const int32_t *dom, int64_t B, int which) {
  int64_t c = 0;
  for (int64_t r = 0; r < B; r++) c += dom[r] == which;
  return c;
}

static void test_sampler(const char *pa, const char *pb) {
  const char *p[2] = {pa, pb};
  const char *names[2] = {"a", "b"};
  double w[2] = {3, 1};
  kda_data *d1 = kda_data_open(2, p, names, w), *d2 = kda_data_open(2, p, names, w);
  check(d1 && d2, "open two domains with weights", NULL);
  if (!d1 || !d2) return;
  int64_t B = 64, T = 32;
  check(kda_data_start(d1, B, T, 42, 1) == 0 && kda_data_start(d2, B, T, 42, 0) == 0, "start with and without prefetch", NULL);
  int32_t *a = malloc(sizeof(int32_t) * (size_t)(B * T)), *b = malloc(sizeof(int32_t) * (size_t)(B * T));
  int32_t *ta = malloc(sizeof(int32_t) * (size_t)(B * T)), *tb = malloc(sizeof(int32_t) * (size_t)(B * T));
  int same = 1, shifted = 1, outside = 0;
  int64_t na = 0, total = 0;
  uint64_t st[2];
  int32_t *saved = malloc(sizeof(int32_t) * (size_t)(B * T));
  for (int s = 0; s < 200; s++) {
    if (s == 100) kda_data_get_state(d1, st);
    kda_data_next_batch(d1, a, ta);
    kda_data_next_batch(d2, b, tb);
    if (s == 100) memcpy(saved, a, sizeof(int32_t) * (size_t)(B * T));
    same &= !memcmp(a, b, sizeof(int32_t) * (size_t)(B * T)) && !memcmp(ta, tb, sizeof(int32_t) * (size_t)(B * T));
    same &= !memcmp(a, kda_data_batch_tokens(d1), sizeof(int32_t) * (size_t)(B * T));
    const int32_t *dom = kda_data_batch_domains(d1);
    for (int64_t r = 0; r < B; r++) {
      for (int64_t j = 0; j + 1 < T; j++) shifted &= ta[r * T + j] == a[r * T + j + 1];
      /* locate the row in its domain: its targets must lie before the window */
      const uint8_t *bytes = kda_data_domain_ptr(d1, dom[r]);
      int64_t lim = kda_data_window_start(d1, dom[r]);
      int found = 0;
      for (int64_t o = 0; o + T < lim + 1 && !found; o++) {
        int m = 1;
        for (int64_t j = 0; j < T && m; j++) m = bytes[o + j] == a[r * T + j] && bytes[o + j + 1] == ta[r * T + j];
        found = m;
        if (s > 2 || r > 3) break;   /* full search on a few rows only: it is quadratic */
      }
      if ((s <= 2 && r <= 3) && !found) outside++;
    }
    na += count_domain(dom, B, 0), total += B;
  }
  check(same, "sampler deterministic: prefetch thread == synchronous", "");
  check(shifted, "target is the next byte", "");
  check(outside == 0, "sampled rows come from the training range", "");
  double frac = (double)na / (double)total;
  char detail[100];
  snprintf(detail, sizeof detail, "domain a share %.4f, want 0.75", frac);
  check(frac > 0.73 && frac < 0.77, "mixture proportions within tolerance", detail);
  /* restore: the batch after set_state(saved state) is batch 100 again */
  kda_data_set_state(d1, st);
  kda_data_next_batch(d1, a, NULL);
  check(!memcmp(a, saved, sizeof(int32_t) * (size_t)(B * T)), "sampler state save/restore resumes the stream", "");
  kda_data *d3 = kda_data_open(2, p, names, w);
  kda_data_start(d3, B, T, 43, 1);
  kda_data_next_batch(d3, b, NULL);
  kda_data_set_state(d2, (uint64_t[2]){42, 0});
  kda_data_next_batch(d2, a, NULL);
  check(memcmp(a, b, sizeof(int32_t) * (size_t)(B * T)) != 0, "another seed gives another stream", "");
  kda_data_free(d3);
  /* the window does not move with batch shape or sampler */
  check(kda_data_window_start(d1, 0) == kda_data_window_start(d2, 0), "window independent of the sampler", "");
  free(a), free(b), free(ta), free(tb), free(saved);
  kda_data_free(d1), kda_data_free(d2);
}

static void test_errors(const char *good) {
  char empty[64];
  snprintf(empty, sizeof empty, "/tmp/kda-test-empty-XXXXXX");
  close(mkstemp(empty));
  const char *p[1];
  p[0] = empty;
  check(!kda_data_open(1, p, NULL, NULL) && strstr(kda_last_error(), "empty"), "empty file -> clear error", NULL);
  printf("#   %s\n", kda_last_error());
  p[0] = "/tmp/kda-no-such-file";
  check(!kda_data_open(1, p, NULL, NULL) && strstr(kda_last_error(), "not found"), "missing file -> clear error", NULL);
  printf("#   %s\n", kda_last_error());
  char dir[64];
  snprintf(dir, sizeof dir, "/tmp/kda-test-dir-XXXXXX");
  mkdtemp(dir);
  p[0] = dir;
  check(!kda_data_open(1, p, NULL, NULL), "empty folder -> clear error", NULL);
  printf("#   %s\n", kda_last_error());
  if (geteuid() != 0) {   /* root reads everything, so the permission check only means something as a user */
    chmod(dir, 0);
    check(!kda_data_open(1, p, NULL, NULL) && strstr(kda_last_error(), "cannot read"), "unreadable folder -> clear error", NULL);
    chmod(dir, 0700);
  } else {
    p[0] = good;   /* a file where a folder's member list is expected is the nearest thing root cannot read */
    char notdir[4200];
    snprintf(notdir, sizeof notdir, "%s/x", good);
    p[0] = notdir;
    check(!kda_data_open(1, p, NULL, NULL), "unreadable path (as root: file used as folder) -> clear error", NULL);
  }
  printf("#   %s\n", kda_last_error());
  /* a folder domain = its files sorted and concatenated */
  char f1[4200], f2[4200];
  snprintf(f1, sizeof f1, "%s/b.txt", dir), snprintf(f2, sizeof f2, "%s/a.txt", dir);
  FILE *f = fopen(f1, "w");
  fputs("0123456789bbbbbbbbbb", f), fclose(f);
  f = fopen(f2, "w");
  fputs("AAAAAAAAAA", f), fclose(f);
  p[0] = dir;
  kda_data *d = kda_data_open(1, p, NULL, NULL);
  check(d && kda_data_domain_bytes(d, 0) == 30 && !memcmp(kda_data_domain_ptr(d, 0), "AAAAAAAAAA0123", 14),
        "folder domain concatenates sorted files", NULL);
  kda_data_free(d);
  /* MANIFEST: a good one opens; corrupt lines and size mismatches are named */
  char man[4200];
  snprintf(man, sizeof man, "%s/MANIFEST", dir);
  f = fopen(man, "w");
  fprintf(f, "# test\nprofile test\npackage x 1.0\ndomain alpha 10 %064d a.txt\ndomain beta 20 %064d b.txt\n", 0, 0);
  fclose(f);
  const char *nm[1] = {"beta"};
  d = kda_data_open_manifest(dir, 1, nm, NULL);
  check(d && kda_data_domain_bytes(d, 0) == 20 && !strcmp(kda_data_domain_name(d, 0), "beta"), "manifest opens a named domain", NULL);
  kda_data_free(d);
  f = fopen(man, "w");
  fprintf(f, "profile test\ndomain alpha ten zzz a.txt\n");
  fclose(f);
  check(!kda_data_open_manifest(dir, 0, NULL, NULL) && strstr(kda_last_error(), "corrupt"), "corrupt manifest -> clear error", NULL);
  printf("#   %s\n", kda_last_error());
  f = fopen(man, "w");
  fprintf(f, "domain alpha 11 %064d a.txt\n", 0);
  fclose(f);
  check(!kda_data_open_manifest(dir, 0, NULL, NULL) && strstr(kda_last_error(), "bytes"), "manifest size mismatch -> clear error", NULL);
  printf("#   %s\n", kda_last_error());
  p[0] = good;
  d = kda_data_open(1, p, NULL, NULL);
  check(d && kda_data_start(d, 2, 1 << 30, 1, 0) != 0, "seq_len longer than the training range -> clear error", NULL);
  printf("#   %s\n", kda_last_error());
  check(kda_data_window_seq(d, 0, 10, 1 << 30, NULL, NULL) < 0, "window sequence out of range -> error", NULL);
  kda_data_free(d);
  unlink(man), unlink(f1), unlink(f2), rmdir(dir), unlink(empty);
}

int main(void) {
  char a[64], b[64];
  fixture(a, sizeof a, 200000, 4, 1);
  fixture(b, sizeof b, 50000, 26, 2);
  test_windows(a, 200000);
  test_windows(b, 50000);
  test_sampler(a, b);
  test_errors(a);
  unlink(a), unlink(b);
  return check_summary();
}
