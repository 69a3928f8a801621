/* test_graph.c: building, ordering, hashing, copying, checking,
 * rewriting graphs and merging duplicate nodes, on small graphs whose
 * answers are known by hand. */
#include <stdlib.h>
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

static int unary(Graph *g, OpKind kind, int x, Diag *d) {
  return graph_add_node(g, kind, (TensorRef[]){ref(x)}, 1, 1, NULL, NULL, d);
}

static int concat2(Graph *g, int a, int b, Diag *d) {
  Params p;
  params_default(OP_CONCAT, &p);
  param_set_int(&p, 0, 1);
  return graph_add_node(g, OP_CONCAT, (TensorRef[]){ref(a), ref(b)}, 2, 1, &p, NULL, d);
}

/* Which concats the producers of their pieces may write in place
 * (graph_node_in_place): pieces laid end to end that kernels write and no
 * other concat takes, also a piece that is such a concat itself, a piece
 * other nodes read too and one that is a graph output; not a piece of two
 * concats or twice of one, a view, a graph input, a weight, a piece 12
 * bytes long (the next would start unaligned) or two images. */
static void test_in_place(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape s1 = shape_of(4, 1, 8, 6, 6), s2 = shape_of(4, 2, 8, 6, 6), s3 = shape_of(4, 1, 1, 3, 1);
  int x = graph_add_input(g, "x", &s1, DT_F32, &d);
  int x2 = graph_add_input(g, "x2", &s2, DT_F32, &d);
  int y = graph_add_input(g, "y", &s3, DT_F32, &d);
  int a = unary(g, OP_RELU, x, &d), b = unary(g, OP_TANH, x, &d);
  int inner = concat2(g, a, b, &d);
  int outer = concat2(g, inner, unary(g, OP_SIGMOID, x, &d), &d);
  int e = unary(g, OP_RELU, x, &d);
  int shared = concat2(g, e, unary(g, OP_SIGMOID, x, &d), &d);
  int o = unary(g, OP_RELU, x, &d);
  int exposed = concat2(g, o, unary(g, OP_TANH, x, &d), &d);
  int t = unary(g, OP_TANH, x, &d);
  int two_a = concat2(g, t, unary(g, OP_RELU, x, &d), &d);
  int two_b = concat2(g, t, unary(g, OP_SIGMOID, x, &d), &d);
  int s = unary(g, OP_SIGMOID, x, &d);
  int doubled = concat2(g, s, s, &d);
  Params rp;
  params_default(OP_RESHAPE, &rp);
  param_set_ints(&rp, 0, (int64_t[]){1, 8, 6, 6}, 4);
  int view = graph_add_node(g, OP_RESHAPE, (TensorRef[]){ref(unary(g, OP_RELU, x, &d))}, 1, 1,
                            &rp, NULL, &d);
  int of_view = concat2(g, view, unary(g, OP_TANH, x, &d), &d);
  int of_input = concat2(g, x, unary(g, OP_TANH, x, &d), &d);
  int narrow = concat2(g, unary(g, OP_RELU, y, &d), unary(g, OP_TANH, y, &d), &d);
  int images = concat2(g, unary(g, OP_RELU, x2, &d), unary(g, OP_TANH, x2, &d), &d);
  int outs[] = {outer, shared, unary(g, OP_TANH, e, &d), exposed, o, two_a, two_b, doubled,
                of_view, of_input, narrow, images};
  for (size_t i = 0; i < sizeof outs / sizeof *outs; i++) graph_add_output(g, ref(outs[i]), NULL, &d);
  CHECK_MSG(graph_check(g, &d) == TEQ_OK, "%s", d.text ? d.text : "?");
  int32_t *home = graph_piece_homes(g);
  CHECK(home && home[a] == inner && home[inner] == outer && home[e] == shared && home[t] == -1 &&
        home[s] == -1 && home[outer] == -1);
  int64_t first[2] = {-1, -1};
  CHECK(graph_node_in_place(g, inner, home, NULL, first) && first[0] == 0 && first[1] == 288);
  CHECK(graph_node_in_place(g, outer, home, NULL, first) && first[0] == 0 && first[1] == 576);
  CHECK(graph_node_in_place(g, shared, home, NULL, NULL));
  CHECK(graph_node_in_place(g, exposed, home, NULL, NULL));
  CHECK(!graph_node_in_place(g, two_a, home, NULL, NULL));
  CHECK(!graph_node_in_place(g, two_b, home, NULL, NULL));
  CHECK(!graph_node_in_place(g, doubled, home, NULL, NULL));
  CHECK(!graph_node_in_place(g, of_view, home, NULL, NULL));
  CHECK(!graph_node_in_place(g, of_input, home, NULL, NULL));
  CHECK(!graph_node_in_place(g, narrow, home, NULL, NULL));
  CHECK(!graph_node_in_place(g, images, home, NULL, NULL));
  CHECK(!graph_node_in_place(g, a, home, NULL, NULL)); /* not a concat */
  bool *weight = calloc((size_t)g->n_nodes, sizeof *weight);
  if (weight) weight[b] = true;
  CHECK(weight && !graph_node_in_place(g, inner, home, weight, NULL));
  free(weight);
  free(home);
  int32_t *reader = graph_only_readers(g);
  CHECK(reader && reader[a] == inner && reader[e] == -1 && reader[o] == -1 && reader[s] == -1 &&
        reader[outer] == -1 && reader[view] == of_view);
  free(reader);
  graph_free(g);
  diag_fini(&d);
}

int main(void) {
  test_in_place();
  test_build_and_order();
  test_merge_duplicates();
  test_truncate();
  test_hash_and_copy();
  test_errors();
  test_rewrite();
  return check_exit();
}
