/* test_exec.c: the float32 and Z_p executors agree on multilinear graphs
 * over small integers (where float32 is exact), refuse bad inputs with a
 * message, and free every intermediate (checked by ASan's leak checker). */
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

int main(void) {
  test_modp_agrees_with_f32();
  test_errors();
  test_opaque_refused();
  return check_exit();
}
