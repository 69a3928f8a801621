/* test_exec.c: the float32 and Z_p executors agree on multilinear graphs
 * over small integers (where float32 is exact), refuse bad inputs with a
 * message, and free every intermediate (checked by ASan's leak checker);
 * a plan of chosen positions (exec_points) gives exec_run's values at
 * them, whether it runs operators at positions, follows layouts or runs
 * them whole; a conv with its pool fused computes what the conv and its
 * MaxPool do; comparisons on kept inputs give what fresh inputs do. */
#include <string.h>

#include "runtime/exec.h"
#include "runtime/modp.h"
#include "tests/tensor_check.h"

static TensorRef ref(int node) { return (TensorRef){node, 0}; }

/* conv -> (+ matmul branch through transpose/reshape) -> concat: every
 * operator multilinear, so Z_p and float32 must agree exactly. */
static Graph *linear_graph(Diag *d) {
  Graph *g = graph_new();
  Shape sx = shape_of(4, 1, 3, 6, 6), sw = shape_of(4, 4, 3, 3, 3);
  int x = graph_add_input(g, "x", &sx, DT_F32, d);
  int w = graph_add_input(g, "w", &sw, DT_F32, d);
  Params cp;
  params_default(OP_CONV2D, &cp);
  int64_t pads[4] = {1, 1, 1, 1};
  param_set_ints(&cp, param_index(OP_CONV2D, "pads"), pads, 4);
  TensorRef cin[2] = {ref(x), ref(w)};
  int conv = graph_add_node(g, OP_CONV2D, cin, 2, 1, &cp, "conv", d); /* [1,4,6,6] */
  Tensor *k = tensor_new(DT_F32, &(Shape){.ndim = 2, .d = {6, 6}});
  for (int i = 0; i < 36; i++) ((float *)k->data)[i] = (float)((i * 5) % 7 - 3);
  int kc = graph_add_const(g, "k", k, d);
  TensorRef min[2] = {ref(conv), ref(kc)};
  int mm = graph_add_node(g, OP_MATMUL, min, 2, 1, NULL, "mm", d); /* [1,4,6,6] */
  Params tp;
  params_default(OP_TRANSPOSE, &tp);
  int64_t perm[4] = {0, 1, 3, 2};
  param_set_ints(&tp, param_index(OP_TRANSPOSE, "perm"), perm, 4);
  TensorRef tin = ref(mm);
  int tr = graph_add_node(g, OP_TRANSPOSE, &tin, 1, 1, &tp, "tr", d);
  TensorRef ain[2] = {ref(tr), ref(conv)};
  int add = graph_add_node(g, OP_EWADD, ain, 2, 1, NULL, "add", d);
  Params cc;
  params_default(OP_CONCAT, &cc);
  param_set_int(&cc, param_index(OP_CONCAT, "axis"), 1);
  TensorRef catin[2] = {ref(add), ref(conv)};
  int cat = graph_add_node(g, OP_CONCAT, catin, 2, 1, &cc, "cat", d); /* [1,8,6,6] */
  graph_add_output(g, ref(cat), "y", d);
  graph_add_output(g, ref(mm), "z", d);
  return g;
}

static void test_modp_agrees_with_f32(void) {
  Diag d;
  diag_init(&d);
  Graph *g = linear_graph(&d);
  CHECK_MSG(d.n_errors == 0, "%s", d.text);
  for (uint64_t seed = 1; seed <= 3; seed++) {
    Tensor *fin[2] = {random_ints(g->nodes[0].out[0], 3, seed),
                      random_ints(g->nodes[1].out[0], 3, seed + 100)};
    Tensor *min[2] = {random_ints_modp(g->nodes[0].out[0], 3, seed),
                      random_ints_modp(g->nodes[1].out[0], 3, seed + 100)};
    Tensor *fout[2] = {0}, *mout[2] = {0};
    CHECK_EQ_INT(exec_run(g, EXEC_F32, fin, fout, &d), TEQ_OK);
    CHECK_EQ_INT(exec_run(g, EXEC_MODP, min, mout, &d), TEQ_OK);
    for (int o = 0; o < 2 && fout[o] && mout[o]; o++) {
      CHECK(shape_equal(&fout[o]->shape, &mout[o]->shape));
      int bad = 0;
      for (int64_t i = 0; i < tensor_numel(fout[o]); i++) {
        float f = ((float *)fout[o]->data)[i];
        if ((int64_t)f != modp_to_int(((uint32_t *)mout[o]->data)[i])) bad++;
      }
      CHECK_EQ_INT(bad, 0);
      /* Not trivially zero. */
      CHECK(tensor_checksum(fout[o]) != 0 || tensor_numel(fout[o]) == 0);
    }
    for (int i = 0; i < 2; i++) {
      tensor_unref(fin[i]), tensor_unref(min[i]);
      tensor_unref(fout[i]), tensor_unref(mout[i]);
    }
  }
  graph_free(g);
  diag_fini(&d);
}

static void test_errors(void) {
  Diag d;
  diag_init(&d);
  Graph *g = linear_graph(&d);
  /* Wrong input shape. */
  Tensor *wrong[2] = {random_ints(shape_of(2, 3, 3), 3, 1), random_ints(g->nodes[1].out[0], 3, 2)};
  Tensor *out[2] = {NULL, NULL};
  CHECK_EQ_INT(exec_run(g, EXEC_F32, wrong, out, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "input 'x': expected float32 [1, 3, 6, 6], got float32 [3, 3]"),
            "%s", diag_last(&d));
  CHECK(out[0] == NULL);
  /* Wrong dtype for the mode. */
  Tensor *f32[2] = {random_ints(g->nodes[0].out[0], 3, 1), wrong[1]};
  CHECK_EQ_INT(exec_run(g, EXEC_MODP, f32, out, &d), TEQ_ERR_INPUT);
  /* A non-integer constant cannot be evaluated in Z_p. */
  Tensor *k = g->nodes[3].value; /* the constant k */
  ((float *)k->data)[0] = 0.5f;
  Tensor *m[2] = {random_ints_modp(g->nodes[0].out[0], 3, 1),
                  random_ints_modp(g->nodes[1].out[0], 3, 2)};
  CHECK(exec_run(g, EXEC_MODP, m, out, &d) != TEQ_OK);
  CHECK(strstr(d.text, "not an integer") != NULL);
  for (int i = 0; i < 2; i++) tensor_unref(wrong[i]), tensor_unref(m[i]);
  tensor_unref(f32[0]);
  graph_free(g);
  diag_fini(&d);
}

static void test_opaque_refused(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape s = shape_of(1, 4);
  int x = graph_add_input(g, "x", &s, DT_F32, &d);
  OpaqueInfo *info = calloc(1, sizeof *info);
  info->op_type = strdup("Mystery");
  info->domain = strdup("");
  info->proto = malloc(1);
  TensorRef in = ref(x);
  int o = graph_add_opaque(g, info, &in, 1, 1, &s, NULL, "m1", &d);
  CHECK(o >= 0);
  graph_add_output(g, ref(o), "y", &d);
  CHECK_EQ_INT(graph_check(g, &d), TEQ_OK);
  Tensor *t = tensor_new(DT_F32, &s), *out = NULL;
  CHECK(exec_run(g, EXEC_F32, &t, &out, &d) != TEQ_OK);
  CHECK_MSG(strstr(d.text, "'m1' (Mystery)") != NULL, "%s", d.text);
  tensor_unref(t);
  graph_free(g);
  diag_fini(&d);
}

/* ---- exec_points ---- */

static int add(Graph *g, OpKind kind, const int *in, int n_in, int n_out, const Params *p,
               Diag *d) {
  TensorRef r[8];
  for (int i = 0; i < n_in; i++) r[i] = (TensorRef){in[i] >> 8, in[i] & 0xff};
  return graph_add_node(g, kind, r, n_in, n_out, p, NULL, d);
}
/* add()'s input spelling: output k of node id. */
static int out_of(int id, int k) { return id << 8 | k; }

static Params pset(OpKind kind, const char *name, const int64_t *v, int n) {
  Params p;
  params_default(kind, &p);
  if (n == 1) param_set_int(&p, param_index(kind, name), v[0]);
  else param_set_ints(&p, param_index(kind, name), v, n);
  return p;
}

static void pset_more(Params *p, OpKind kind, const char *name, const int64_t *v, int n) {
  if (n == 1) param_set_int(p, param_index(kind, name), v[0]);
  else param_set_ints(p, param_index(kind, name), v, n);
}

/* What PET's mutants look like: a padded input, a strided, dilated,
 * grouped conv, then only layouts (transpose, reshape, a zero pad, a
 * strided slice) between it and the outputs. */
static Graph *points_conv_graph(Diag *d) {
  Graph *g = graph_new();
  Shape sx = shape_of(4, 2, 4, 9, 9), sw = shape_of(4, 6, 2, 3, 3);
  int x = graph_add_input(g, "x", &sx, DT_F32, d), w = graph_add_input(g, "w", &sw, DT_F32, d);
  Params pp = pset(OP_PAD, "pads", (int64_t[]){0, 0, 1, 0, 0, 0, 2, 1}, 8);
  int xp = add(g, OP_PAD, (int[]){out_of(x, 0)}, 1, 1, &pp, d); /* [2, 4, 12, 10] */
  Params cp = pset(OP_CONV2D, "stride", (int64_t[]){2, 1}, 2);
  pset_more(&cp, OP_CONV2D, "dilation", (int64_t[]){1, 2}, 2);
  pset_more(&cp, OP_CONV2D, "groups", (int64_t[]){2}, 1);
  pset_more(&cp, OP_CONV2D, "pads", (int64_t[]){1, 0, 0, 1}, 4);
  int c = add(g, OP_CONV2D, (int[]){out_of(xp, 0), out_of(w, 0)}, 2, 1, &cp, d);
  Params tp = pset(OP_TRANSPOSE, "perm", (int64_t[]){0, 2, 3, 1}, 4);
  int t = add(g, OP_TRANSPOSE, (int[]){out_of(c, 0)}, 1, 1, &tp, d);
  const Shape *cs = &g->nodes[c].out[0];
  Params rp = pset(OP_RESHAPE, "shape", (int64_t[]){cs->d[0] * cs->d[2], cs->d[3] * cs->d[1]}, 2);
  int r = add(g, OP_RESHAPE, (int[]){out_of(t, 0)}, 1, 1, &rp, d);
  Params zp = pset(OP_PAD, "pads", (int64_t[]){0, 1, 2, 0, 0, 1, 0, 3}, 8);
  int z = add(g, OP_PAD, (int[]){out_of(c, 0)}, 1, 1, &zp, d);
  Params sp = pset(OP_SLICE, "starts", (int64_t[]){0, 1, 0, 1}, 4);
  pset_more(&sp, OP_SLICE, "ends", (int64_t[]){2, 6, 5, 7}, 4);
  pset_more(&sp, OP_SLICE, "steps", (int64_t[]){1, 2, 2, 3}, 4);
  int sl = add(g, OP_SLICE, (int[]){out_of(c, 0)}, 1, 1, &sp, d);
  graph_add_output(g, ref(r), "r", d);
  graph_add_output(g, ref(z), "z", d);
  graph_add_output(g, ref(sl), "s", d);
  return g;
}

/* A merge: two kernels concatenated, one conv, split back; beside it a
 * conv with a bias and a fused relu (its point kernel adds and applies
 * them too). */
static Graph *points_merge_graph(Diag *d) {
  Graph *g = graph_new();
  Shape sx = shape_of(4, 1, 3, 8, 8), s1 = shape_of(4, 4, 3, 3, 3), s2 = shape_of(4, 2, 3, 3, 3),
        sb = shape_of(1, 4);
  int x = graph_add_input(g, "x", &sx, DT_F32, d), w1 = graph_add_input(g, "w1", &s1, DT_F32, d);
  int w2 = graph_add_input(g, "w2", &s2, DT_F32, d), b = graph_add_input(g, "b", &sb, DT_F32, d);
  Params ap = pset(OP_CONCAT, "axis", (int64_t[]){0}, 1);
  int w = add(g, OP_CONCAT, (int[]){out_of(w1, 0), out_of(w2, 0)}, 2, 1, &ap, d);
  Params cp = pset(OP_CONV2D, "pads", (int64_t[]){1, 1, 1, 1}, 4);
  int c = add(g, OP_CONV2D, (int[]){out_of(x, 0), out_of(w, 0)}, 2, 1, &cp, d);
  Params sp = pset(OP_SPLIT, "axis", (int64_t[]){1}, 1);
  pset_more(&sp, OP_SPLIT, "sizes", (int64_t[]){4, 2}, 2);
  int s = add(g, OP_SPLIT, (int[]){out_of(c, 0)}, 1, 2, &sp, d);
  pset_more(&cp, OP_CONV2D, "act", (int64_t[]){ACT_RELU}, 1);
  int cb = add(g, OP_CONV2D, (int[]){out_of(x, 0), out_of(w1, 0), out_of(b, 0)}, 3, 1, &cp, d);
  graph_add_output(g, (TensorRef){s, 0}, "a", d);
  graph_add_output(g, (TensorRef){s, 1}, "b", d);
  graph_add_output(g, ref(cb), "c", d);
  return g;
}

/* A batched product with broadcast batch dimensions, then a transpose. */
static Graph *points_matmul_graph(Diag *d) {
  Graph *g = graph_new();
  Shape sa = shape_of(4, 3, 1, 5, 7), sb = shape_of(3, 4, 7, 6);
  int a = graph_add_input(g, "a", &sa, DT_F32, d), b = graph_add_input(g, "b", &sb, DT_F32, d);
  int m = add(g, OP_MATMUL, (int[]){out_of(a, 0), out_of(b, 0)}, 2, 1, NULL, d); /* [3,4,5,6] */
  Params tp = pset(OP_TRANSPOSE, "perm", (int64_t[]){1, 3, 0, 2}, 4);
  int t = add(g, OP_TRANSPOSE, (int[]){out_of(m, 0)}, 1, 1, &tp, d);
  graph_add_output(g, ref(t), "y", d);
  return g;
}

/* Nothing to save: the conv is read whole by an add, and a pad of 3 (a
 * constant, not a move) is not followed, so everything runs whole. */
static Graph *points_whole_graph(Diag *d) {
  Graph *g = graph_new();
  Shape sx = shape_of(4, 1, 2, 5, 5), sw = shape_of(4, 3, 2, 3, 3);
  int x = graph_add_input(g, "x", &sx, DT_F32, d), w = graph_add_input(g, "w", &sw, DT_F32, d);
  int c = add(g, OP_CONV2D, (int[]){out_of(x, 0), out_of(w, 0)}, 2, 1, NULL, d);
  int e = add(g, OP_EWADD, (int[]){out_of(c, 0), out_of(c, 0)}, 2, 1, NULL, d);
  int c2 = add(g, OP_CONV2D, (int[]){out_of(x, 0), out_of(w, 0)}, 2, 1, NULL, d);
  Params pp = pset(OP_PAD, "pads", (int64_t[]){0, 0, 1, 1, 0, 0, 1, 1}, 8);
  param_set_float(&pp, param_index(OP_PAD, "value"), 3.0);
  int p = add(g, OP_PAD, (int[]){out_of(c2, 0)}, 1, 1, &pp, d);
  graph_add_output(g, ref(e), "e", d);
  graph_add_output(g, ref(p), "p", d);
  return g;
}

/* exec_points at every `every`-th position of each output (and its last)
 * against exec_run; the plan's counts of point and followed operators. */
static void check_points(Graph *g, int every, int want_points, int want_followed) {
  Diag d;
  diag_init(&d);
  Tensor *in[8] = {0}, *whole[8] = {0};
  int64_t *pos[8] = {0}, n_pos[8] = {0};
  uint32_t *vals[8] = {0};
  for (int i = 0; i < g->n_inputs; i++) {
    in[i] = tensor_new_uninit(DT_MODP, &g->nodes[g->inputs[i]].out[0]);
    tensor_fill_random(in[i], 77 + (uint64_t)i);
  }
  CHECK_EQ_INT(exec_run(g, EXEC_MODP, in, whole, &d), TEQ_OK);
  for (int j = 0; j < g->n_outputs; j++) {
    int64_t n = tensor_numel(whole[j]);
    pos[j] = malloc((size_t)(n + 1) * sizeof **pos);
    vals[j] = calloc((size_t)n + 1, sizeof **vals);
    for (int64_t f = n - 1; f >= 0; f -= every) pos[j][n_pos[j]++] = f; /* backwards: any order */
    if (n_pos[j] > 1) pos[j][n_pos[j]++] = pos[j][0]; /* a repeat */
  }
  /* Twice: the second plan takes its layouts' maps (and verdicts) from the
   * process's cache (exec.c: follow_maps). */
  for (int plan = 0; plan < 2; plan++) {
    ExecPoints *p = NULL;
    CHECK_EQ_INT(exec_points_new(g, (const int64_t *const *)pos, n_pos, &p, &d), TEQ_OK);
    CHECK_MSG(d.n_errors == 0, "%s", d.text);
    if (p) {
      int at, fol;
      exec_points_counts(p, &at, &fol);
      CHECK_EQ_INT(at, want_points);
      CHECK_EQ_INT(fol, want_followed);
      for (int trial = 0; trial < 2; trial++) { /* a plan runs again */
        CHECK_EQ_INT(exec_points_run(p, in, vals, &d), TEQ_OK);
        int bad = 0;
        for (int j = 0; j < g->n_outputs; j++)
          for (int64_t q = 0; q < n_pos[j]; q++)
            bad += vals[j][q] != ((const uint32_t *)whole[j]->data)[pos[j][q]];
        CHECK_EQ_INT(bad, 0);
      }
    }
    exec_points_free(p);
  }
  for (int j = 0; j < g->n_outputs; j++) tensor_unref(whole[j]), free(pos[j]), free(vals[j]);
  for (int i = 0; i < g->n_inputs; i++) tensor_unref(in[i]);
  diag_fini(&d);
}

static void test_points(void) {
  Diag d;
  diag_init(&d);
  Graph *g[4] = {points_conv_graph(&d), points_merge_graph(&d), points_matmul_graph(&d),
                 points_whole_graph(&d)};
  CHECK_MSG(d.n_errors == 0, "%s", d.text);
  /* sparse: the conv, the merged conv, the biased conv and the product run
   * at positions; transpose, reshape, pad, slice (conv graph), split
   * (merge graph; the weights' concat runs whole) and transpose (product)
   * are followed */
  check_points(g[0], 23, 1, 4);
  check_points(g[1], 29, 2, 1);
  check_points(g[2], 11, 1, 1);
  check_points(g[3], 7, 0, 0);
  /* every position: a point operator asked for all of its output runs
   * whole, and the layouts after it are still followed */
  check_points(g[0], 1, 0, 4);
  check_points(g[2], 1, 0, 1);
  /* a position out of range is refused with a message */
  int64_t bad = 1 << 20, *pos[3] = {&bad, &bad, &bad}, n_pos[3] = {1, 1, 1};
  ExecPoints *p = NULL;
  CHECK_EQ_INT(exec_points_new(g[0], (const int64_t *const *)pos, n_pos, &p, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(d.text, "out of range") != NULL, "%s", d.text);
  CHECK(p == NULL);
  for (int i = 0; i < 4; i++) graph_free(g[i]);
  diag_fini(&d);
}

/* conv2d's pool: a conv with a bias, a residual and a relu, pooled 2x2
 * (over odd extents, whose last row of outputs no window takes), and a
 * bare one pooled 3x3; as points graphs (the pooled conv runs at
 * positions), and beside the same convs followed by their MaxPool nodes. */
static Graph *pooled_graph(bool fused, Diag *d) {
  Graph *g = graph_new();
  Shape sx = shape_of(4, 2, 3, 9, 10), sw = shape_of(4, 4, 3, 3, 3), sb = shape_of(1, 4);
  Shape sz = shape_of(4, 2, 4, 9, 10);
  int x = graph_add_input(g, "x", &sx, DT_F32, d), w = graph_add_input(g, "w", &sw, DT_F32, d);
  int b = graph_add_input(g, "b", &sb, DT_F32, d), z = graph_add_input(g, "z", &sz, DT_F32, d);
  int64_t two = 2, three = 3;
  Params cp = pset(OP_CONV2D, "pads", (int64_t[]){1, 1, 1, 1}, 4);
  pset_more(&cp, OP_CONV2D, "act", (int64_t[]){ACT_RELU}, 1);
  if (fused) pset_more(&cp, OP_CONV2D, "pool", &two, 1);
  int c = add(g, OP_CONV2D, (int[]){out_of(x, 0), out_of(w, 0), out_of(b, 0), out_of(z, 0)}, 4, 1,
              &cp, d);
  Params bare = pset(OP_CONV2D, "pool", fused ? &three : (int64_t[]){0}, 1);
  int c2 = add(g, OP_CONV2D, (int[]){out_of(x, 0), out_of(w, 0)}, 2, 1, &bare, d);
  if (!fused) {
    Params pp = pset(OP_MAXPOOL, "kernel", (int64_t[]){2, 2}, 2);
    pset_more(&pp, OP_MAXPOOL, "stride", (int64_t[]){2, 2}, 2);
    c = add(g, OP_MAXPOOL, (int[]){out_of(c, 0)}, 1, 1, &pp, d);
    pp = pset(OP_MAXPOOL, "kernel", (int64_t[]){3, 3}, 2);
    pset_more(&pp, OP_MAXPOOL, "stride", (int64_t[]){3, 3}, 2);
    c2 = add(g, OP_MAXPOOL, (int[]){out_of(c2, 0)}, 1, 1, &pp, d);
  }
  graph_add_output(g, ref(c), "y", d);
  graph_add_output(g, ref(c2), "y2", d);
  return g;
}

/* Both executors run a pooled conv as its conv then its max pool. */
static void test_pooled_conv(void) {
  Diag d;
  diag_init(&d);
  Graph *fused = pooled_graph(true, &d), *apart = pooled_graph(false, &d);
  CHECK_MSG(d.n_errors == 0, "%s", d.text);
  Shape pooled = shape_of(4, 2, 4, 4, 5); /* 9 x 10 pooled 2 x 2: 4 x 5 */
  CHECK(shape_equal(&fused->nodes[fused->outputs[0].node].out[0], &pooled));
  for (int mode = 0; mode < 2; mode++) {
    Tensor *in[4], *a[2] = {0}, *b[2] = {0};
    for (int i = 0; i < 4; i++) {
      in[i] = tensor_new_uninit(mode ? DT_MODP : DT_F32, &fused->nodes[fused->inputs[i]].out[0]);
      tensor_fill_random(in[i], 90 + (uint64_t)i);
    }
    ExecMode m = mode ? EXEC_MODP : EXEC_F32;
    CHECK_EQ_INT(exec_run(fused, m, in, a, &d), TEQ_OK);
    CHECK_EQ_INT(exec_run(apart, m, in, b, &d), TEQ_OK);
    for (int o = 0; o < 2 && a[o] && b[o]; o++) {
      CHECK(shape_equal(&a[o]->shape, &b[o]->shape));
      CHECK_MSG(memcmp(a[o]->data, b[o]->data, (size_t)tensor_numel(a[o]) * 4) == 0,
                "mode %d output %d: the pooled conv differs from conv then MaxPool", mode, o);
      tensor_unref(a[o]);
      tensor_unref(b[o]);
    }
    for (int i = 0; i < 4; i++) tensor_unref(in[i]);
  }
  check_points(fused, 7, 2, 0);
  graph_free(fused);
  graph_free(apart);
  diag_fini(&d);
}

/* Inputs kept between comparisons (exec_compare_kept) give exactly what
 * fresh ones do, in both modes and every draw, and again on the second
 * round, when every input is one kept from the first: the executors must
 * not have written to them. A budget too small to keep anything changes
 * nothing either. */
static void test_kept_inputs(void) {
  Diag d;
  diag_init(&d);
  Graph *a = linear_graph(&d), *b = linear_graph(&d);
  for (int id = 0; id < b->n_nodes; id++)
    if (b->nodes[id].kind == OP_CONST) ((float *)b->nodes[id].value->data)[35] += 1; /* one weight */
  ExecInputs *kept = exec_inputs_new((size_t)1 << 20), *tiny = exec_inputs_new(16);
  CHECK(kept && tiny);
  for (int round = 0; round < 2; round++)
    for (int mode = 0; mode < 2; mode++)
      for (int draw = 0; draw < 4; draw++) {
        ExecMode m = mode ? EXEC_MODP : EXEC_F32;
        ExecDiff fresh, same, small;
        CHECK_EQ_INT(exec_compare(a, b, m, 7, draw, 1e-6, &fresh, &d), TEQ_OK);
        CHECK_EQ_INT(exec_compare_kept(a, b, m, 7, draw, 1e-6, kept, &same, &d), TEQ_OK);
        CHECK_EQ_INT(exec_compare_kept(a, b, m, 7, draw, 1e-6, tiny, &small, &d), TEQ_OK);
        CHECK(fresh.differ && same.differ && small.differ);
        CHECK_EQ_INT(same.output, fresh.output);
        CHECK_EQ_INT(same.element, fresh.element);
        CHECK_EQ_INT(same.count, fresh.count);
        CHECK_EQ_INT(small.count, fresh.count);
        CHECK(tensor_content_hash(same.a) == tensor_content_hash(fresh.a));
        CHECK(tensor_content_hash(same.b) == tensor_content_hash(fresh.b));
        exec_diff_fini(&fresh), exec_diff_fini(&same), exec_diff_fini(&small);
        ExecDiff self;
        CHECK_EQ_INT(exec_compare_kept(a, a, m, 7, draw, 0, kept, &self, &d), TEQ_OK);
        CHECK(!self.differ);
      }
  exec_inputs_free(kept);
  exec_inputs_free(tiny);
  graph_free(a);
  graph_free(b);
  diag_flush(&d, stderr);
  diag_fini(&d);
}

/* x + c against x + c', c' off by one at its last element, at shape s:
 * the shape of the inputs exec_compare draws. */
static Graph *shifted_graph(const Shape *s, float off, Diag *d) {
  Graph *g = graph_new();
  int x = graph_add_input(g, "x", s, DT_F32, d);
  Tensor *c = tensor_new(DT_F32, s);
  int64_t n = tensor_numel(c);
  for (int64_t i = 0; i < n; i++) ((float *)c->data)[i] = (float)(i % 5);
  ((float *)c->data)[n - 1] += off;
  int k = graph_add_const(g, "c", c, d);
  TensorRef in[2] = {ref(x), ref(k)};
  graph_add_output(g, ref(graph_add_node(g, OP_EWADD, in, 2, 1, NULL, "add", d)), "y", d);
  return g;
}

/* An input kept at one shape serves the next call's input at another: of
 * fewer elements, its first ones; of more, a longer draw that takes its
 * place. Either way each call sees the values a fresh draw gives. */
static void test_kept_across_shapes(void) {
  Diag d;
  diag_init(&d);
  const Shape shapes[] = {shape_of(2, 4, 8), shape_of(2, 2, 8), shape_of(3, 2, 4, 8),
                          shape_of(1, 3), shape_of(2, 8, 8), shape_of(2, 4, 8)};
  ExecInputs *kept = exec_inputs_new((size_t)1 << 20);
  CHECK(kept != NULL);
  for (int mode = 0; mode < 2; mode++)
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
      ExecMode m = mode ? EXEC_MODP : EXEC_F32;
      Graph *a = shifted_graph(&shapes[k], 0, &d), *b = shifted_graph(&shapes[k], 1, &d);
      ExecDiff fresh, same;
      CHECK_EQ_INT(exec_compare(a, b, m, 11, 1, 1e-6, &fresh, &d), TEQ_OK);
      CHECK_EQ_INT(exec_compare_kept(a, b, m, 11, 1, 1e-6, kept, &same, &d), TEQ_OK);
      CHECK(fresh.differ && same.differ && same.element == fresh.element);
      CHECK_MSG(tensor_content_hash(same.a) == tensor_content_hash(fresh.a),
                "mode %d, shape %zu: kept input differs from a fresh draw", mode, k);
      exec_diff_fini(&fresh), exec_diff_fini(&same);
      graph_free(a);
      graph_free(b);
    }
  exec_inputs_free(kept);
  diag_flush(&d, stderr);
  diag_fini(&d);
}

int main(void) {
  test_modp_agrees_with_f32();
  test_kept_inputs();
  test_kept_across_shapes();
  test_errors();
  test_opaque_refused();
  test_points();
  test_pooled_conv();
  return check_exit();
}
