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
 * a counterexample too. */
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

/* Far beyond float32 rounding of depth-few graphs on inputs in [-1, 1). */
static bool differs(float a, float b) {
  double scale = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
  return fabs((double)a - b) > 1e-2 * (scale > 1 ? scale : 1) || (isnan(a) != isnan(b));
}

static char *describe(const Graph *src, uint64_t seed, int o, const Tensor *a, const Tensor *b,
                      bool f32) {
  char *buf = NULL;
  size_t len = 0, cap = 0;
  char s1[SHAPE_STR_MAX], s2[SHAPE_STR_MAX], pos[128];
  append(&buf, &len, &cap, "inputs");
  for (int i = 0; i < src->n_inputs; i++) {
    const Node *n = &src->nodes[src->inputs[i]];
    append(&buf, &len, &cap, " %s=%s", n->name ? n->name : "?", shape_format(&n->out[0], s1, sizeof s1));
  }
  if (f32)
    append(&buf, &len, &cap, ", float32 uniform in [-1, 1) from seed %llu; ", (unsigned long long)seed);
  else
    append(&buf, &len, &cap, ", uniform in Z_p (p = 2^31-1) from seed %llu; ", (unsigned long long)seed);
  if (!shape_equal(&a->shape, &b->shape)) {
    append(&buf, &len, &cap, "output %d: shape %s on src, %s on dst", o,
           shape_format(&a->shape, s1, sizeof s1), shape_format(&b->shape, s2, sizeof s2));
    return buf;
  }
  int64_t n = tensor_numel(a), first = -1, count = 0;
  for (int64_t e = 0; e < n; e++)
    if (f32 ? differs(((const float *)a->data)[e], ((const float *)b->data)[e])
            : ((const uint32_t *)a->data)[e] != ((const uint32_t *)b->data)[e]) {
      if (first < 0) first = e;
      count++;
    }
  position(&a->shape, first, pos, sizeof pos);
  if (f32)
    append(&buf, &len, &cap, "output %d %s at %s: src %.9g, dst %.9g (%lld of %lld elements differ)",
           o, shape_format(&a->shape, s1, sizeof s1), pos, ((const float *)a->data)[first],
           ((const float *)b->data)[first], (long long)count, (long long)n);
  else
    append(&buf, &len, &cap, "output %d %s at %s: src %lld, dst %lld (%lld of %lld elements differ)",
           o, shape_format(&a->shape, s1, sizeof s1), pos,
           (long long)modp_to_int(((const uint32_t *)a->data)[first]),
           (long long)modp_to_int(((const uint32_t *)b->data)[first]), (long long)count, (long long)n);
  return buf;
}

bool refute_modp(const Graph *src, const Graph *dst, uint64_t seed, char **counterexample) {
  if (src->n_inputs != dst->n_inputs) return false;
  for (int i = 0; i < src->n_inputs; i++)
    if (!shape_equal(graph_shape(src, (TensorRef){src->inputs[i], 0}),
                     graph_shape(dst, (TensorRef){dst->inputs[i], 0})))
      return false;
  bool found = false;
  int n_out = src->n_outputs;
  for (int t = 0; t < 2 * TRIES && !found; t++) {
    bool f32 = t >= TRIES;
    uint64_t s = seed + (uint64_t)t * 0x9e3779b97f4a7c15u;
    Tensor *in[64] = {NULL};
    Tensor **ys = calloc((size_t)n_out + 1, sizeof *ys), **yd = calloc((size_t)n_out + 1, sizeof *yd);
    bool ok = ys && yd && src->n_inputs <= 64;
    for (int i = 0; ok && i < src->n_inputs; i++) {
      in[i] = tensor_new(f32 ? DT_F32 : DT_MODP, graph_shape(src, (TensorRef){src->inputs[i], 0}));
      if (!in[i]) ok = false;
      else tensor_fill_random(in[i], s + (uint64_t)i * 7919);
    }
    Diag d;
    diag_init(&d);
    /* A side the executor cannot run (a kernel refusing a configuration)
     * gives no counterexample: the rule stays unproved, not refuted. */
    ExecMode mode = f32 ? EXEC_F32 : EXEC_MODP;
    if (ok && exec_run(src, mode, in, ys, &d) == TEQ_OK) {
      if (exec_run(dst, mode, in, yd, &d) == TEQ_OK) {
        for (int o = 0; o < n_out && !found; o++) {
          bool same = shape_equal(&ys[o]->shape, &yd[o]->shape);
          for (int64_t e = 0; same && e < tensor_numel(ys[o]); e++)
            same = f32 ? !differs(((const float *)ys[o]->data)[e], ((const float *)yd[o]->data)[e])
                       : ((const uint32_t *)ys[o]->data)[e] == ((const uint32_t *)yd[o]->data)[e];
          if (!same) {
            found = true;
            *counterexample = describe(src, s, o, ys[o], yd[o], f32);
          }
        }
        for (int o = 0; o < n_out; o++) tensor_unref(yd[o]);
      }
      for (int o = 0; o < n_out; o++) tensor_unref(ys[o]);
    }
    diag_fini(&d);
    for (int i = 0; i < src->n_inputs; i++) tensor_unref(in[i]);
    free(ys);
    free(yd);
  }
  return found;
}
