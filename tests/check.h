/* check.h — the C tests' harness: one line per check ("ok - name", "FAIL - name: detail",
 * "ok - name # skip: why") and the summary line tests/run.sh adds up. */
#ifndef KDA_TEST_CHECK_H
#define KDA_TEST_CHECK_H
#include <stdio.h>
#include "kda.h"

static int check_passed, check_failed, check_skipped;

/* A failure with no detail reports kda_last_error(), the message of the call under test. */
static inline void check(int cond, const char *name, const char *detail) {
  if (cond) check_passed++, printf("ok - %s\n", name);
  else check_failed++, printf("FAIL - %s: %s\n", name, detail && *detail ? detail : kda_last_error());
}

/* A check that cannot run here (a missing tool): counted apart, never as a pass. */
static inline void check_skip(const char *name, const char *why) {
  check_skipped++;
  printf("ok - %s # skip: %s\n", name, why);
}

/* Prints the summary; the exit status of the test program. */
static inline int check_summary(void) {
  if (check_skipped) printf("%d passed, %d failed, %d skipped\n", check_passed, check_failed, check_skipped);
  else printf("%d passed, %d failed\n", check_passed, check_failed);
  return check_failed != 0;
}
#endif
