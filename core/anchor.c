/* anchor.c — compressor anchors: what an adaptive compressor pays for the held-out window after
 * it has read the training bytes just before it. cost(x | ctx) = bits(ctx + x) - bits(ctx), with
 * each compressor run as a child process (fork/exec) on temporary files; container headers are
 * the same size in both runs and cancel. Declared in ngram.h.
 * defines: kda_anchor_available, kda_anchor_bits, kda_anchor_bpb */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "ngram.h"
#include "internal.h"

typedef struct tool_spec {
  const char *name, *program, *package;
} tool_spec;

static const tool_spec tools[] = {
    {"xz", "xz", "xz-utils"},
    {"zstd", "zstd", "zstd"},
    {"ppmd", "7z", "p7zip-full"},
};

static const tool_spec *find_tool(const char *name) {
  for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++)
    if (name && !strcmp(name, tools[i].name)) return &tools[i];
  return NULL;
}

static int in_path(const char *program) {
  const char *path = getenv("PATH");
  if (!path) path = "/usr/bin:/bin";
  char buf[4096];
  for (const char *p = path; *p;) {
    size_t n = strcspn(p, ":");
    if (snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, program) < (int)sizeof buf && access(buf, X_OK) == 0)
      return 1;
    p += n + (p[n] == ':');
  }
  return 0;
}

int kda_anchor_available(const char *tool) {
  const tool_spec *t = find_tool(tool);
  return t && in_path(t->program);
}

/* Run argv with stdin from in_path (or /dev/null) and stdout to out_path; 0 if it exits 0. */
static int run(char *const *argv, const char *in_file, const char *out_file) {
  pid_t pid = fork();
  if (pid < 0) return kda_set_error("cannot fork to run %s: %s", argv[0], strerror(errno));
  if (pid == 0) {
    int in = open(in_file ? in_file : "/dev/null", O_RDONLY);
    int out = open(out_file ? out_file : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int null = open("/dev/null", O_WRONLY);
    if (in < 0 || out < 0 || null < 0) _exit(126);
    dup2(in, 0), dup2(out, 1), dup2(null, 2);
    execvp(argv[0], argv);
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return kda_set_error("waitpid for %s: %s", argv[0], strerror(errno));
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    return kda_set_error("%s failed (exit status %d): check it runs by hand", argv[0], WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  return 0;
}

/* Compressed size in bytes of the file `in` under tool t; -1 on error. */
static int64_t compressed_bytes(const tool_spec *t, const char *in, const char *scratch) {
  char out[4200];
  snprintf(out, sizeof out, "%s.out%s", scratch, strcmp(t->name, "ppmd") ? "" : ".7z");
  unlink(out);   /* 7z would add to an existing archive */
  int rc;
  if (!strcmp(t->name, "xz")) {
    char *argv[] = {"xz", "-9e", "-T1", "-c", "-q", NULL};
    rc = run(argv, in, out);
  } else if (!strcmp(t->name, "zstd")) {
    char *argv[] = {"zstd", "-19", "--long=27", "--single-thread", "-c", "-q", NULL};
    rc = run(argv, in, out);
  } else {
    char *argv[] = {"7z", "a", "-t7z", "-m0=PPMd", "-mx=9", "-mmt=1", "-bd", out, (char *)in, NULL};
    rc = run(argv, NULL, NULL);
  }
  struct stat st;
  int64_t size = rc == 0 && stat(out, &st) == 0 ? (int64_t)st.st_size : -1;
  unlink(out);
  if (rc == 0 && size < 0) kda_set_error("%s wrote no output", t->program);
  return size;
}

static int write_all(int fd, const uint8_t *p, int64_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, (size_t)(n < (1 << 30) ? n : (1 << 30)));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return kda_set_error("cannot write a temporary file for a compressor anchor: %s", strerror(errno));
    p += w, n -= w;
  }
  return 0;
}

static int temp_file(char *path, size_t size, const uint8_t *a, int64_t na, const uint8_t *b, int64_t nb) {
  const char *dir = getenv("TMPDIR");
  snprintf(path, size, "%s/kda-anchor-XXXXXX", dir && *dir ? dir : "/tmp");
  int fd = mkstemp(path);
  if (fd < 0) return kda_set_error("cannot create a temporary file in %s: %s (set TMPDIR)", dir && *dir ? dir : "/tmp", strerror(errno));
  int rc = write_all(fd, a, na);
  if (rc == 0 && nb) rc = write_all(fd, b, nb);
  close(fd);
  if (rc != 0) unlink(path);
  return rc;
}

double kda_anchor_bits(const char *tool, const uint8_t *ctx, int64_t nctx, const uint8_t *x, int64_t nx) {
  const tool_spec *t = find_tool(tool);
  if (!t) return kda_set_error("unknown compressor anchor '%s': use xz, zstd or ppmd", tool ? tool : "(null)");
  if (!in_path(t->program)) return kda_set_error("%s not found: apt-get install %s (anchor skipped)", t->program, t->package);
  char a[4096], ax[4096];
  if (temp_file(a, sizeof a, ctx, nctx, NULL, 0) != 0) return -1;
  if (temp_file(ax, sizeof ax, ctx, nctx, x, nx) != 0) return unlink(a), -1;
  int64_t sa = compressed_bytes(t, a, a);
  int64_t sax = sa >= 0 ? compressed_bytes(t, ax, ax) : -1;
  unlink(a), unlink(ax);
  if (sa < 0 || sax < 0) return -1;
  return 8.0 * (double)(sax - sa);
}

double kda_anchor_bpb(const char *tool, const kda_data *d, int i, int64_t tail_bytes) {
  int64_t start = kda_data_window_start(d, i), W = kda_data_window_bytes(d, i);
  if (start < 0) return -1;
  int64_t n = tail_bytes >= 0 && tail_bytes < start ? tail_bytes : start;
  const uint8_t *p = kda_data_domain_ptr(d, i);
  double bits = kda_anchor_bits(tool, p + start - n, n, p + start, W);
  return bits < 0 ? -1 : bits / (double)W;
}
