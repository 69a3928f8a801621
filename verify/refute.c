/* refute.c: counterexamples by exact evaluation in Z_p.
 *
 * Both sides run on the same random inputs with the Z_p executor at the
 * rule's own shapes (the shapes gen-rules found it at). Any difference in
 * an output's shape or in one element is a counterexample, and it is
 * written down in full: the input shapes, the seed that regenerates the
 * inputs, the output and position, and both values. Two independent
 * inputs are tried, so a random coincidence (probability about d/p for a
 * degree-d difference, Schwartz-Zippel) does not hide a false rule.
 * Z_p replaces relu, sigmoid and tanh by polynomial stand-ins, and a rule
 * can be true of the stand-ins only (relu(1) = 3 for TASO's x(x+1)+1):
 * when Z_p finds no difference, the sides also run in float32 with the
 * real functions, and a difference far beyond rounding (relative 1e-2) is
 * a counterexample too. The runs and comparisons are exec_compare's. */
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec.h"
#include "runtime/modp.h"
#include "verify/verify_int.h"

#define TRIES 2

static void append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (*buf && *len + (size_t)n < *cap) {
      *len += (size_t)n;
      return;
    }
    size_t c = (*cap + (size_t)n) * 2 + 64;
    char *g = realloc(*buf, c);
    if (!g) return;
    *buf = g, *cap = c;
  }
}

/* "[1, 2]" for a flat index into shape s. */
static void position(const Shape *s, int64_t flat, char *out, size_t size) {
  int64_t idx[TEQ_MAX_DIMS];
  for (int i = s->ndim - 1; i >= 0; i--) {
    idx[i] = s->d[i] ? flat % s->d[i] : 0;
    flat = s->d[i] ? flat / s->d[i] : 0;
  }
  size_t len = 0;
  out[0] = 0;
  len += (size_t)snprintf(out, size, "[");
  for (int i = 0; i < s->ndim && len < size; i++)
    len += (size_t)snprintf(out + len, size - len, "%s%lld", i ? ", " : "", (long long)idx[i]);
  if (len < size) snprintf(out + len, size - len, "]");
}

#define F32_TOLERANCE 1e-2 /* far beyond float32 rounding of depth-few graphs */
#define F32_DRAWS 4          /* exec_compare's draws: every sign pattern */

static char *describe(const Graph *src, uint64_t seed, int draw, const ExecDiff *df) {
  char *buf = NULL;
  size_t len = 0, cap = 0;
  char s1[SHAPE_STR_MAX], s2[SHAPE_STR_MAX], pos[128];
  const Tensor *a = df->a, *b = df->b;
  bool f32 = a->dtype == DT_F32;
  append(&buf, &len, &cap, "inputs");
  for (int i = 0; i < src->n_inputs; i++) {
    const Node *n = &src->nodes[src->inputs[i]];
    append(&buf, &len, &cap, " %s=%s", n->name ? n->name : "?", shape_format(&n->out[0], s1, sizeof s1));
  }
  append(&buf, &len, &cap, ", %s from seed %llu draw %d (exec_compare); ",
         f32 ? "float32 in [-1, 1)" : "uniform in Z_p (p = 2^31-1)", (unsigned long long)seed, draw);
  if (df->element < 0) {
    append(&buf, &len, &cap, "output %d: shape %s on src, %s on dst", df->output,
           shape_format(&a->shape, s1, sizeof s1), shape_format(&b->shape, s2, sizeof s2));
    return buf;
  }
  int64_t e = df->element, n = tensor_numel(a);
  position(&a->shape, e, pos, sizeof pos);
  if (f32)
    append(&buf, &len, &cap, "output %d %s at %s: src %.9g, dst %.9g (%lld of %lld elements differ)",
           df->output, shape_format(&a->shape, s1, sizeof s1), pos, ((const float *)a->data)[e],
           ((const float *)b->data)[e], (long long)df->count, (long long)n);
  else
    append(&buf, &len, &cap, "output %d %s at %s: src %lld, dst %lld (%lld of %lld elements differ)",
           df->output, shape_format(&a->shape, s1, sizeof s1), pos,
           (long long)modp_to_int(((const uint32_t *)a->data)[e]),
           (long long)modp_to_int(((const uint32_t *)b->data)[e]), (long long)df->count, (long long)n);
  return buf;
}

bool refute_modp(const Graph *src, const Graph *dst, uint64_t seed, char **counterexample) {
  bool found = false;
  /* Z_p first (exact), then float32 with the real non-linear functions. */
  for (int t = 0; t < TRIES + F32_DRAWS && !found; t++) {
    bool f32 = t >= TRIES;
    int draw = f32 ? t - TRIES : t;
    Diag d;
    diag_init(&d);
    ExecDiff df;
    /* Sides the executor cannot run (mismatched inputs, a kernel refusing
     * a configuration) give no counterexample: the rule stays unproved. */
    if (exec_compare(src, dst, f32 ? EXEC_F32 : EXEC_MODP, seed, draw, f32 ? F32_TOLERANCE : 0,
                     &df, &d) == TEQ_OK &&
        df.differ) {
      found = true;
      *counterexample = describe(src, seed, draw, &df);
    }
    exec_diff_fini(&df);
    diag_fini(&d);
  }
  return found;
}
