/* internal.h — helpers shared by the C core (not part of the FFI cdef). */
#ifndef KDA_INTERNAL_H
#define KDA_INTERNAL_H
#include <stdio.h>
#include <stdlib.h>
#include "kda.h"

/* Record a recoverable error: one line naming the thing and what to do. Returns -1. */
int kda_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* An internal invariant: a bug in kda, never bad user input. */
#define KDA_CHECK(cond)                                                                    \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "kda: internal error at %s:%d: %s\n"                                 \
              "HINT: this is a bug in kda; please report it with the command you ran\n",   \
              __FILE__, __LINE__, #cond);                                                  \
      abort();                                                                             \
    }                                                                                      \
  } while (0)

/* malloc that reports failure as a kda error instead of crashing. */
void *kda_malloc(size_t bytes, const char *what);
/* n normal samples * std from a splitmix64 stream started at seed (deterministic). */
void kda_fill_normal(float *x, int64_t n, uint64_t seed, float std);
/* Elements [first, first+count) of that sequence into x[0..count): any split, the same values. */
void kda_fill_normal_range(float *x, int64_t first, int64_t count, uint64_t seed, float std);
/* The learning rate for 0-based step under the SCHEDULE node's attributes. */
float kda_schedule_lr(int64_t step, const int64_t *iattr, const float *fattr);
#endif
