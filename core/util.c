/* util.c — errors, allocation, clocks. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include "internal.h"

static _Thread_local char last_error[1024];

int kda_set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return -1;
}

const char *kda_last_error(void) { return last_error; }
void kda_clear_error(void) { last_error[0] = 0; }

void *kda_malloc(size_t bytes, const char *what) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) kda_set_error("out of host memory allocating %zu bytes for %s: use a smaller model or batch", bytes, what);
  return p;
}

double kda_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds since the process started (the library's load, before main): "time to first step". */
static double process_start;
__attribute__((constructor)) static void note_process_start(void) { process_start = kda_now(); }
double kda_since_start(void) { return kda_now() - process_start; }
