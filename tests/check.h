/* check.h: the few macros every C test uses. A failed CHECK prints the
 * file, line and expression and marks the test failed but goes on, so one
 * run shows every failure; main returns check_exit(). A test that cannot run
 * here (no GPU, no test data) calls check_skip, which exits 77, meson's
 * code for a skipped test. Tensor helpers are in tensor_check.h. */
#ifndef TEQ_TESTS_CHECK_H
#define TEQ_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int check_failures;
static int check_count;

#define CHECK(cond)                                                         \
  do {                                                                      \
    check_count++;                                                          \
    if (!(cond)) {                                                          \
      check_failures++;                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                       \
  } while (0)

#define CHECK_MSG(cond, ...)                                                \
  do {                                                                      \
    check_count++;                                                          \
    if (!(cond)) {                                                          \
      check_failures++;                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                         \
      fputc('\n', stderr);                                                  \
    }                                                                       \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                  \
  do {                                                                      \
    long long a_ = (long long)(a), b_ = (long long)(b);                     \
    CHECK_MSG(a_ == b_, "%s = %lld, %s = %lld", #a, a_, #b, b_);            \
  } while (0)

#define CHECK_NEAR(a, b, tol)                                               \
  do {                                                                      \
    double a_ = (double)(a), b_ = (double)(b);                              \
    CHECK_MSG(fabs(a_ - b_) <= (tol) * (1.0 + fabs(b_)), "%s = %.9g, %s = %.9g", #a, a_, #b, b_); \
  } while (0)

static inline void check_skip(const char *why) {
  printf("SKIP: %s\n", why);
  exit(77);
}

static inline int check_exit(void) {
  printf("%d checks, %d failed\n", check_count, check_failures);
  return check_failures ? 1 : 0;
}

#endif
