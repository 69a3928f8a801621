/* pet_graphs.h: what the PET tests share: building small graphs (a failed
 * construction ends the test with the message), counting operators, and
 * comparing two graphs at every output position, exactly in Z_p and within
 * 1e-4 in float32. Included by one test file each, so its definitions are
 * static. */
#ifndef TEQ_TESTS_OPTIMIZE_PET_GRAPHS_H
#define TEQ_TESTS_OPTIMIZE_PET_GRAPHS_H

#include <stdio.h>
#include <stdlib.h>

#include "runtime/exec.h"
#include "runtime/graph.h"
#include "tests/check.h"

static Diag diag;

static inline int must(int id) {
  if (id < 0) {
    diag_flush(&diag, stderr);
    fprintf(stderr, "graph construction failed\n");
    exit(1);
  }
  return id;
}

static inline TensorRef input(Graph *g, const char *name, Shape s) {
  return (TensorRef){must(graph_add_input(g, name, &s, DT_F32, &diag)), 0};
}

static inline TensorRef node(Graph *g, OpKind k, const TensorRef *in, int n_in, const Params *p) {
  return (TensorRef){must(graph_add_node(g, k, in, n_in, 1, p, NULL, &diag)), 0};
}

/* conv2d with square pads, stride and dilation, no bias, no activation. */
static inline TensorRef conv(Graph *g, TensorRef x, TensorRef w, int pad, int stride, int dil,
                             int groups) {
  Params p;
  params_default(OP_CONV2D, &p);
  int64_t pads[4] = {pad, pad, pad, pad}, st[2] = {stride, stride}, dl[2] = {dil, dil};
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), pads, 4);
  param_set_ints(&p, param_index(OP_CONV2D, "stride"), st, 2);
  param_set_ints(&p, param_index(OP_CONV2D, "dilation"), dl, 2);
  param_set_int(&p, param_index(OP_CONV2D, "groups"), groups);
  return node(g, OP_CONV2D, (TensorRef[]){x, w}, 2, &p);
}

static inline void output(Graph *g, TensorRef r) { must(graph_add_output(g, r, NULL, &diag)); }

/* A constant of small integers in [-3, 3], so that the graph runs in Z_p. */
static inline TensorRef small_int_weight(Graph *g, Shape s, uint64_t seed) {
  Tensor *t = tensor_new(DT_F32, &s);
  float *p = t->data;
  uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < shape_numel(&s); i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = (float)((int)(r >> 33) % 7 - 3);
  }
  return (TensorRef){must(graph_add_const(g, NULL, t, &diag)), 0};
}

static inline int count_kind(const Graph *g, OpKind k) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].kind == k;
  return n;
}

/* a and b agree at every output position on `draws` seeded random inputs;
 * quiet: say nothing about where they differ (for expected differences). */
static inline bool equal_everywhere(const Graph *a, const Graph *b, int draws, bool quiet) {
  bool ok = true;
  for (int mode = 0; mode < 2; mode++)
    for (int draw = 0; draw < draws; draw++) {
      ExecDiff diff;
      int rc = exec_compare(a, b, mode ? EXEC_F32 : EXEC_MODP, 99 + draw, draw, mode ? 1e-4 : 0,
                            &diff, &diag);
      CHECK(rc == TEQ_OK);
      if (rc) continue;
      if (diff.differ && !quiet)
        fprintf(stderr, "%s: output %d differs at %lld elements\n", mode ? "f32" : "Z_p",
                diff.output, (long long)diff.count);
      ok = ok && !diff.differ;
      exec_diff_fini(&diff);
    }
  diag_flush(&diag, stderr);
  return ok;
}

#endif
