/* test_graph.c: building, ordering, hashing, copying, checking,
 * rewriting graphs and merging duplicate nodes, on small graphs whose
 * answers are known by hand. */
#include <string.h>

#include "runtime/exec.h"
#include "runtime/graph.h"
#include "tests/check.h"

static TensorRef ref(int node) { return (TensorRef){node, 0}; }

/* y = relu(matmul(x, w) + b), with x, w inputs and b a constant. */
static Graph *small_mlp(Diag *d, bool swap_add) {
  Graph *g = graph_new();
  Shape sx = shape_of(2, 4, 8), sw = shape_of(2, 8, 3), sb = shape_of(1, 3);
  int x = graph_add_input(g, "x", &sx, DT_F32, d);
  int w = graph_add_input(g, "w", &sw, DT_F32, d);
  Tensor *bv = tensor_new(DT_F32, &sb);
  ((float *)bv->data)[1] = 2.0f;
  int b = graph_add_const(g, "b", bv, d);
  TensorRef mm_in[2] = {ref(x), ref(w)};
  int mm = graph_add_node(g, OP_MATMUL, mm_in, 2, 1, NULL, "mm", d);
  TensorRef add_in[2] = {ref(mm), ref(b)};
  if (swap_add) add_in[0] = ref(b), add_in[1] = ref(mm);
  int add = graph_add_node(g, OP_EWADD, add_in, 2, 1, NULL, "add", d);
  TensorRef r_in = ref(add);
  int r = graph_add_node(g, OP_RELU, &r_in, 1, 1, NULL, "relu", d);
  graph_add_output(g, ref(r), "y", d);
  return g;
}

static void test_build_and_order(void) {
  Diag d;
  diag_init(&d);
  Graph *g = small_mlp(&d, false);
  CHECK_MSG(d.n_errors == 0, "%s", d.text);
  CHECK_EQ_INT(g->n_nodes, 6);
  CHECK_EQ_INT(g->n_inputs, 2);
  Shape want = shape_of(2, 4, 3);
  CHECK(shape_equal(&g->nodes[5].out[0], &want));
  int32_t order[6];
  CHECK_EQ_INT(graph_topo_order(g, order), TEQ_OK);
  int pos[6];
  for (int i = 0; i < 6; i++) pos[order[i]] = i;
  for (int i = 0; i < g->n_nodes; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++) CHECK(pos[g->nodes[i].in[j].node] < pos[i]);
  CHECK_EQ_INT(graph_check(g, &d), TEQ_OK);
  CHECK_EQ_INT(graph_count_ops(g), 3);
  int32_t *off, *uses = graph_use_counts(g, &off);
  CHECK(uses && uses[off[3]] == 1 && uses[off[5]] == 1 && uses[off[0]] == 1);
  free(uses);
  free(off);
  graph_free(g);
  diag_fini(&d);
}

static void test_hash_and_copy(void) {
  Diag d;
  diag_init(&d);
  Graph *a = small_mlp(&d, false), *b = small_mlp(&d, true);
  uint64_t ha = graph_hash(a, NULL), hb = graph_hash(b, NULL);
  CHECK(ha != 0);
  CHECK_MSG(ha == hb, "commutative operands must hash alike");
  Graph *c = graph_copy(a);
  CHECK(c && graph_hash(c, NULL) == ha);
  CHECK(c->nodes[2].value == a->nodes[2].value); /* constants shared */
  CHECK_EQ_INT(a->nodes[2].value->refs, 2);
  /* Changing a parameter, or a constant's contents, changes the hash. */
  Params p = c->nodes[3].params;
  int act = param_index(OP_MATMUL, "act");
  if (act >= 0) {
    param_set_int(&p, act, ACT_RELU);
    c->nodes[3].params = p;
    CHECK(graph_hash(c, NULL) != ha);
  }
  Shape sb = shape_of(1, 3);
  Tensor *other = tensor_new(DT_F32, &sb);
  Graph *e = graph_copy(b);
  tensor_unref(e->nodes[2].value);
  e->nodes[2].value = other;
  CHECK(graph_hash(e, NULL) != hb);
  /* The hash does not depend on node ids: the same graph built in another
   * order hashes alike. */
  Graph *f = graph_new();
  Shape sx = shape_of(2, 4, 8), sw = shape_of(2, 8, 3);
  Tensor *bv = tensor_clone(a->nodes[2].value);
  int fb = graph_add_const(f, "b", bv, &d);
  int fx = graph_add_input(f, "x", &sx, DT_F32, &d);
  int fw = graph_add_input(f, "w", &sw, DT_F32, &d);
  TensorRef mm_in[2] = {ref(fx), ref(fw)};
  int mm = graph_add_node(f, OP_MATMUL, mm_in, 2, 1, NULL, NULL, &d);
  TensorRef add_in[2] = {ref(mm), ref(fb)};
  int add = graph_add_node(f, OP_EWADD, add_in, 2, 1, NULL, NULL, &d);
  TensorRef r_in = ref(add);
  int r = graph_add_node(f, OP_RELU, &r_in, 1, 1, NULL, NULL, &d);
  graph_add_output(f, ref(r), "y", &d);
  CHECK(graph_hash(f, NULL) == ha);
  graph_free(a), graph_free(b), graph_free(c), graph_free(e), graph_free(f);
  diag_fini(&d);
}

static void test_errors(void) {
  Diag d;
  diag_init(&d);
  Graph *g = small_mlp(&d, false);
  int before = g->n_nodes;
  /* Shape mismatch: [4, 8] x [4, 3] does not multiply. */
  TensorRef bad[2] = {ref(0), ref(0)};
  CHECK(graph_add_node(g, OP_MATMUL, bad, 2, 1, NULL, "bad", &d) < 0);
  CHECK_MSG(strstr(diag_last(&d), "matmul") != NULL, "%s", diag_last(&d));
  /* Wrong arity and dangling references. */
  CHECK(graph_add_node(g, OP_RELU, bad, 2, 1, NULL, NULL, &d) < 0);
  TensorRef dangling = {99, 0};
  CHECK(graph_add_node(g, OP_RELU, &dangling, 1, 1, NULL, NULL, &d) < 0);
  CHECK_EQ_INT(g->n_nodes, before);
  /* Shapes past TEQ_BYTES_MAX enter no graph: as an input or as a result. */
  Shape huge = shape_make(3, (int64_t[]){INT64_C(1) << 31, INT64_C(1) << 31, INT64_C(1) << 31});
  CHECK_EQ_INT(graph_add_input(g, "huge", &huge, DT_F32, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "input 'huge': shape [2147483648, 2147483648, 2147483648] "
                                  "is too large"), "%s", diag_last(&d));
  Params rep;
  params_default(OP_TILE, &rep);
  param_set_ints(&rep, 0, (int64_t[]){INT64_C(1) << 38, 1}, 2); /* [2^40, 8] */
  CHECK(graph_add_node(g, OP_TILE, (TensorRef[]){ref(0)}, 1, 1, &rep, NULL, &d) < 0);
  CHECK_MSG(strstr(diag_last(&d), "tile: output 0: shape [1099511627776, 8] is too large"), "%s",
            diag_last(&d));
  CHECK_EQ_INT(g->n_nodes, before);
  /* A cycle made by hand is found by ordering and by the checker. */
  g->nodes[3].in[0] = ref(5);
  int32_t order[16];
  CHECK_EQ_INT(graph_topo_order(g, order), TEQ_ERR_INPUT);
  Diag quiet;
  diag_init(&quiet);
  CHECK(graph_check(g, &quiet) != TEQ_OK);
  CHECK(strstr(quiet.text, "cycle") != NULL);
  /* A reference made dangling by hand names the node and the input. */
  g->nodes[3].in[0] = (TensorRef){99, 0};
  diag_fini(&quiet);
  diag_init(&quiet);
  CHECK(graph_check(g, &quiet) != TEQ_OK);
  char want[96];
  snprintf(want, sizeof want, "graph: node 3 (%s): input 0 refers to a missing tensor (%%99:0)",
           op_def(g->nodes[3].kind)->name);
  CHECK_MSG(strstr(quiet.text, want) != NULL, "%s", quiet.text);
  diag_fini(&quiet);
  graph_free(g);
  diag_fini(&d);
}

static void test_rewrite(void) {
  Diag d;
  diag_init(&d);
  Graph *g = small_mlp(&d, false);
  /* Insert an identity after the add, route the relu through it, then
   * bypass it again: the identity becomes dead and is removed. */
  TensorRef a = ref(4);
  int id = graph_add_node(g, OP_IDENTITY, &a, 1, 1, NULL, "noop", &d);
  g->nodes[5].in[0] = ref(id);
  CHECK_EQ_INT(graph_check(g, &d), TEQ_OK);
  graph_replace_uses(g, ref(id), ref(4));
  CHECK_EQ_INT(graph_remove_dead(g), 1);
  CHECK_EQ_INT(g->n_nodes, 6);
  CHECK_EQ_INT(graph_check(g, &d), TEQ_OK);
  /* Replacing the output's producer makes the relu dead. */
  graph_replace_uses(g, ref(5), ref(4));
  CHECK_EQ_INT(graph_remove_dead(g), 1);
  CHECK_EQ_INT(g->outputs[0].node, 4);
  CHECK_EQ_INT(graph_infer_shapes(g, &d), TEQ_OK);
  /* Inputs stay even when nothing uses them. */
  graph_replace_uses(g, ref(4), ref(2));
  graph_remove_dead(g);
  CHECK_EQ_INT(g->n_inputs, 2);
  CHECK_EQ_INT(g->nodes[g->inputs[1]].kind, OP_INPUT);
  CHECK_EQ_INT(graph_check(g, &d), TEQ_OK);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  graph_dump(g, f);
  fclose(f);
  CHECK_MSG(strstr(text, "output y") != NULL, "%s", text);
  free(text);
  graph_free(g);
  diag_fini(&d);
}

/* Twins left by rewrites: two concat(x, h), two copies of one weight, and
 * ewadd(a, b) beside ewadd(b, a) become one each; concat(h, x) is another
 * value and stays; the merged graph computes what the original did. */
static void test_merge_duplicates(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = shape_of(2, 1, 4), sw = shape_of(2, 8, 3);
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  int h = graph_add_input(g, "h", &sx, DT_F32, &d);
  Tensor *wv = tensor_new(DT_F32, &sw);
  tensor_fill_random(wv, 7);
  int w1 = graph_add_const(g, "w1", wv, &d);
  int w2 = graph_add_const(g, "w2", tensor_clone(wv), &d);
  Params cat;
  params_default(OP_CONCAT, &cat);
  param_set_int(&cat, 0, 1);
  int c1 = graph_add_node(g, OP_CONCAT, (TensorRef[]){ref(x), ref(h)}, 2, 1, &cat, "c1", &d);
  int c2 = graph_add_node(g, OP_CONCAT, (TensorRef[]){ref(x), ref(h)}, 2, 1, &cat, "c2", &d);
  int c3 = graph_add_node(g, OP_CONCAT, (TensorRef[]){ref(h), ref(x)}, 2, 1, &cat, "c3", &d);
  int m1 = graph_add_node(g, OP_MATMUL, (TensorRef[]){ref(c1), ref(w1)}, 2, 1, NULL, "m1", &d);
  int m2 = graph_add_node(g, OP_MATMUL, (TensorRef[]){ref(c2), ref(w2)}, 2, 1, NULL, "m2", &d);
  int m3 = graph_add_node(g, OP_MATMUL, (TensorRef[]){ref(c3), ref(w1)}, 2, 1, NULL, "m3", &d);
  int e1 = graph_add_node(g, OP_EWADD, (TensorRef[]){ref(m1), ref(m3)}, 2, 1, NULL, "e1", &d);
  int e2 = graph_add_node(g, OP_EWADD, (TensorRef[]){ref(m3), ref(m2)}, 2, 1, NULL, "e2", &d);
  graph_add_output(g, ref(e1), "y1", &d);
  graph_add_output(g, ref(e2), "y2", &d);
  CHECK_EQ_INT(graph_check(g, &d), TEQ_OK);
  Graph *before = graph_copy(g);
  /* c2, w2, then m2 (same inputs once c2 and w2 are merged), then e2. */
  CHECK_EQ_INT(graph_merge_duplicates(g), 4);
  CHECK_EQ_INT(graph_check(g, &d), TEQ_OK);
  CHECK_EQ_INT(graph_count_ops(g), 5); /* c1, c3, m1, m3, e1 */
  CHECK(g->outputs[0].node == g->outputs[1].node);
  ExecDiff diff;
  CHECK_EQ_INT(exec_compare(before, g, EXEC_F32, 3, 0, 0, &diff, &d), TEQ_OK);
  CHECK(!diff.differ);
  exec_diff_fini(&diff);
  /* Nothing left to merge. */
  CHECK_EQ_INT(graph_merge_duplicates(g), 0);
  graph_free(before);
  graph_free(g);
  diag_fini(&d);
}

/* Nodes added and taken back leave the graph as it was: its hash, and
 * (under ASan) nothing of theirs behind. */
static void test_truncate(void) {
  Diag d;
  diag_init(&d);
  Graph *g = small_mlp(&d, false);
  uint64_t before = graph_hash(g, NULL);
  int32_t mark = g->n_nodes;
  TensorRef y = g->outputs[0];
  int t = graph_add_node(g, OP_TRANSPOSE, &y, 1, 1, NULL, "t", &d);
  TensorRef t_in = ref(t);
  CHECK(graph_add_node(g, OP_RELU, &t_in, 1, 1, NULL, "again", &d) >= 0);
  CHECK_EQ_INT(g->n_nodes, mark + 2);
  graph_truncate(g, mark);
  CHECK_EQ_INT(g->n_nodes, mark);
  CHECK(graph_check(g, &d) == TEQ_OK);
  CHECK(graph_hash(g, NULL) == before);
  CHECK(graph_add_node(g, OP_RELU, &y, 1, 1, NULL, "after", &d) == mark); /* the slot is reused */
  graph_free(g);
  diag_fini(&d);
}

int main(void) {
  test_build_and_order();
  test_merge_duplicates();
  test_truncate();
  test_hash_and_copy();
  test_errors();
  test_rewrite();
  return check_exit();
}
