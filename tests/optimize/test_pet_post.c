/* test_pet_post.c: PET's post-optimization (optimize/pet/post.c): reshapes
 * and transposes moved past element-wise operators, inverse groups removed,
 * consecutive ones fused, and the pass inside optimize's search.
 *
 * Every rewritten graph must pass graph_check and equal its original at
 * every output position, exactly in Z_p and within 1e-4 in float32 (weights
 * are small integers, so that the graphs run in Z_p); operator counts and
 * the pass's own counts say what was rewritten. Chains that are not the
 * identity, layout operators read twice, opaque nodes and graph outputs
 * read through a layout operator must survive. Attention's split into Q,
 * K and V heads is hoisted into one transpose and a split along the first
 * axis (a view), K keeping a transpose of its two last axes. The last test is PET's
 * Fig. 1 on two consecutive 1x1 convs with a relu between them: a cost
 * table makes the batch-into-width conv cheap, the search applies the
 * mutation to both, and the transpose-back of the first and the
 * transpose-forth of the second must be gone from between them. */
#include <string.h>
#include <unistd.h>

#include "optimize/optimize.h"
#include "optimize/pet/pet.h"
#include "tests/optimize/pet_graphs.h"

static TensorRef unary(Graph *g, OpKind k, TensorRef x) { return node(g, k, &x, 1, NULL); }

static TensorRef binary(Graph *g, OpKind k, TensorRef a, TensorRef b) {
  return node(g, k, (TensorRef[]){a, b}, 2, NULL);
}

static TensorRef transpose(Graph *g, TensorRef x, int r, const int64_t *perm) {
  Params p;
  params_default(OP_TRANSPOSE, &p);
  param_set_ints(&p, 0, perm, r);
  return node(g, OP_TRANSPOSE, &x, 1, &p);
}

static TensorRef reshape(Graph *g, TensorRef x, int r, const int64_t *dims) {
  Params p;
  params_default(OP_RESHAPE, &p);
  param_set_ints(&p, 0, dims, r);
  return node(g, OP_RESHAPE, &x, 1, &p);
}

static int count_layout(const Graph *g) {
  return count_kind(g, OP_RESHAPE) + count_kind(g, OP_TRANSPOSE);
}

/* Runs the pass on a copy of g; checks it and that it computes what g does. */
static Graph *post(const Graph *g, PetPostStats *st) {
  Graph *h = graph_copy(g);
  CHECK(h != NULL);
  int rc = pet_post_optimize(&h, st, &diag);
  CHECK(rc == TEQ_OK);
  if (rc) diag_flush(&diag, stderr);
  CHECK(graph_check(h, &diag) == TEQ_OK);
  return h;
}

static void print_stats(const char *what, const PetPostStats *st, const Graph *g) {
  printf("%s: %lld moved, %lld removed, %lld fused; %d operators left\n", what,
         (long long)st->moved, (long long)st->removed, (long long)st->fused, graph_count_ops(g));
}

/* transpose -> relu -> inverse transpose is the relu alone; so are longer
 * runs of unary operators, and a binary one whose inputs come through the
 * same transpose. */
static void test_inverse_around_elementwise(void) {
  static const int64_t p[] = {0, 2, 3, 1}, q[] = {0, 3, 1, 2}; /* q = p^-1 */
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 2, 3, 4, 5));
  output(g, transpose(g, unary(g, OP_RELU, transpose(g, x, 4, p)), 4, q));
  PetPostStats st;
  Graph *h = post(g, &st);
  print_stats("transpose, relu, inverse", &st, h);
  CHECK_EQ_INT(graph_count_ops(h), 1);
  CHECK_EQ_INT(count_kind(h, OP_RELU), 1);
  CHECK_EQ_INT(st.moved, 1);
  CHECK_EQ_INT(st.removed, 1);
  CHECK(equal_everywhere(g, h, 2, false));
  graph_free(h);
  graph_free(g);

  /* relu then sigmoid then tanh: each moved, then the pair removed */
  g = graph_new();
  x = input(g, "x", shape_of(4, 2, 3, 4, 5));
  TensorRef t = transpose(g, x, 4, p);
  t = unary(g, OP_TANH, unary(g, OP_SIGMOID, unary(g, OP_RELU, t)));
  output(g, transpose(g, t, 4, q));
  h = post(g, &st);
  print_stats("transpose, three unary, inverse", &st, h);
  CHECK_EQ_INT(graph_count_ops(h), 3);
  CHECK_EQ_INT(count_layout(h), 0);
  CHECK_EQ_INT(st.moved, 3);
  CHECK(equal_everywhere(g, h, 2, false));
  graph_free(h);
  graph_free(g);

  /* T(a) + T(b), then T^-1: one add */
  g = graph_new();
  TensorRef a = input(g, "a", shape_of(4, 2, 3, 4, 5)), b = input(g, "b", shape_of(4, 2, 3, 4, 5));
  output(g, transpose(g, binary(g, OP_EWADD, transpose(g, a, 4, p), transpose(g, b, 4, p)), 4, q));
  h = post(g, &st);
  print_stats("T(a) + T(b), inverse", &st, h);
  CHECK_EQ_INT(graph_count_ops(h), 1);
  CHECK_EQ_INT(count_kind(h, OP_EWADD), 1);
  CHECK(equal_everywhere(g, h, 2, false));
  graph_free(h);
  graph_free(g);

  /* constants beside T(x): one broadcast along the last axis (moved back
   * through T^-1 as a constant of x's shape) and a scalar (kept) */
  g = graph_new();
  x = input(g, "x", shape_of(4, 2, 3, 4, 5));
  t = binary(g, OP_EWADD, transpose(g, x, 4, p), small_int_weight(g, shape_of(1, 3), 4));
  t = binary(g, OP_SMUL, t, small_int_weight(g, shape_of(1, 1), 5));
  output(g, transpose(g, t, 4, q));
  h = post(g, &st);
  print_stats("T(x) + c, * s, inverse", &st, h);
  CHECK_EQ_INT(graph_count_ops(h), 2);
  CHECK_EQ_INT(count_layout(h), 0);
  CHECK_EQ_INT(st.moved, 2);
  for (int i = 0; i < h->n_nodes; i++)
    if (h->nodes[i].kind == OP_EWADD) /* c' spread to x's shape */
      CHECK(shape_equal(graph_shape(h, h->nodes[i].in[1]), &(Shape){4, {2, 3, 4, 5}}));
  CHECK(equal_everywhere(g, h, 2, false));
  graph_free(h);
  graph_free(g);

  /* a constant that spreads T(x) to a larger shape: f's result is not a
   * layout of anything f could compute before T */
  g = graph_new();
  x = input(g, "x", shape_of(2, 1, 4));
  t = binary(g, OP_EWADD, transpose(g, x, 2, (int64_t[]){1, 0}), small_int_weight(g, shape_of(2, 4, 3), 6));
  output(g, t);
  h = post(g, &st);
  CHECK_EQ_INT(st.moved, 0);
  CHECK(graph_hash(h, NULL) == graph_hash(g, NULL));
  graph_free(h);
  graph_free(g);

  /* T(a) + T(b) with different perms: not moved; nothing to remove */
  g = graph_new();
  a = input(g, "a", shape_of(3, 4, 4, 4)), b = input(g, "b", shape_of(3, 4, 4, 4));
  output(g, binary(g, OP_EWMUL, transpose(g, a, 3, (int64_t[]){1, 0, 2}),
                   transpose(g, b, 3, (int64_t[]){0, 2, 1})));
  h = post(g, &st);
  CHECK_EQ_INT(graph_count_ops(h), 3);
  CHECK_EQ_INT(st.moved + st.removed + st.fused, 0);
  CHECK(h && graph_hash(h, NULL) == graph_hash(g, NULL));
  graph_free(h);
  graph_free(g);
}

/* A per-channel bias, spread to the conv's output shape as optimize does
 * for the search (opt_split_bias). */
static TensorRef spread_bias(Graph *g, Shape s, uint64_t seed) {
  Tensor *t = tensor_new(DT_F32, &s);
  float *v = t->data;
  int64_t plane = s.d[2] * s.d[3];
  for (int64_t i = 0; i < shape_numel(&s); i++)
    v[i] = (float)((int)((i / plane % s.d[1]) * seed % 5) - 2);
  return (TensorRef){must(graph_add_const(g, NULL, t, &diag)), 0};
}

/* Fig. 1's layout, batch 2 side by side along W, and back: reshape,
 * transpose, reshape, as mutate.c builds them. */
static TensorRef batch_to_width(Graph *g, TensorRef x) {
  const Shape *s = graph_shape(g, x);
  int64_t N = s->d[0], C = s->d[1], H = s->d[2], W = s->d[3];
  TensorRef a = reshape(g, x, 5, (int64_t[]){N / 2, 2, C, H, W});
  a = transpose(g, a, 5, (int64_t[]){0, 2, 3, 1, 4});
  return reshape(g, a, 4, (int64_t[]){N / 2, C, H, 2 * W});
}

static TensorRef width_to_batch(Graph *g, TensorRef x) {
  const Shape *s = graph_shape(g, x);
  int64_t N = s->d[0], C = s->d[1], H = s->d[2], W = s->d[3];
  TensorRef a = reshape(g, x, 5, (int64_t[]){N, C, H, 2, W / 2});
  a = transpose(g, a, 5, (int64_t[]){0, 3, 1, 2, 4});
  return reshape(g, a, 4, (int64_t[]){2 * N, C, H, W / 2});
}

/* Whether a reshape or transpose lies on the way back from node id to
 * node stop through element-wise operators. */
static bool layout_between(const Graph *g, int id, int stop) {
  while (id != stop) {
    const Node *n = &g->nodes[id];
    if (n->kind == OP_RESHAPE || n->kind == OP_TRANSPOSE) return true;
    if (!(op_def(n->kind)->flags & OPF_ELEMENTWISE) || n->n_in < 1) return true;
    id = n->in[0].node;
  }
  return false;
}

/* conv, batch-to-width inverse, bias, relu, batch-to-width, conv, and back
 * (two Fig. 1 mutants spliced in): nothing is left between the convs, and
 * the bias and relu follow the first conv directly. */
static void test_fig1_between_convs(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 2, 4, 6, 6));
  TensorRef c1 = conv(g, batch_to_width(g, x), small_int_weight(g, shape_of(4, 4, 4, 3, 3), 1), 1, 1, 1, 1);
  TensorRef y = width_to_batch(g, c1);
  y = unary(g, OP_RELU, binary(g, OP_EWADD, y, spread_bias(g, shape_of(4, 2, 4, 6, 6), 3)));
  TensorRef c2 = conv(g, batch_to_width(g, y), small_int_weight(g, shape_of(4, 4, 4, 1, 1), 2), 0, 1, 1, 1);
  output(g, width_to_batch(g, c2));
  CHECK_EQ_INT(count_layout(g), 12);
  PetPostStats st;
  Graph *h = post(g, &st);
  print_stats("Fig. 1 between two convs", &st, h);
  int conv1 = -1, conv2 = -1;
  for (int i = 0; i < h->n_nodes; i++)
    if (h->nodes[i].kind == OP_CONV2D) {
      if (h->nodes[h->nodes[i].in[1].node].value->shape.d[2] == 3) conv1 = i;
      else conv2 = i;
    }
  CHECK(conv1 >= 0 && conv2 >= 0);
  if (conv1 >= 0 && conv2 >= 0) {
    CHECK(!layout_between(h, h->nodes[conv2].in[0].node, conv1));
    /* relu(ewadd(conv1, B')): ready to fold into the conv */
    const Node *r = &h->nodes[h->nodes[conv2].in[0].node];
    CHECK_EQ_INT(r->kind, OP_RELU);
    CHECK_EQ_INT(h->nodes[r->in[0].node].kind, OP_EWADD);
  }
  CHECK_EQ_INT(count_layout(h), 6);
  CHECK_EQ_INT(st.moved, 6); /* bias add and relu, past three each */
  CHECK(st.removed >= 1);     /* one group, or pairs as they meet */
  CHECK(equal_everywhere(g, h, 2, false));
  /* the moved bias is still one value per channel: optimize folds it */
  Graph *f = graph_copy(h);
  int fused = 0;
  CHECK(f && opt_fuse_bias(f, &fused, &diag) == TEQ_OK);
  CHECK_EQ_INT(fused, 2); /* conv1's bias and relu */
  CHECK_EQ_INT(count_kind(f, OP_EWADD) + count_kind(f, OP_RELU), 0);
  CHECK(equal_everywhere(g, f, 1, false));
  /* With a cache, as the search runs it: the second call takes the moved
   * bias from the cache, and both give the graph the uncached call gave. */
  PetPostCache *cache = pet_post_cache_new();
  CHECK(cache != NULL);
  for (int k = 0; k < 2 && cache; k++) {
    Graph *c = graph_copy(g);
    PetPostStats sc;
    CHECK(c && pet_post_optimize_cached(&c, cache, &sc, &diag) == TEQ_OK);
    CHECK(c && graph_hash(c, NULL) == graph_hash(h, NULL));
    CHECK_EQ_INT(sc.moved, st.moved);
    CHECK(c && equal_everywhere(g, c, 1, false));
    graph_free(c);
  }
  pet_post_cache_free(cache);
  graph_free(f);
  graph_free(h);
  graph_free(g);
}

/* Chains decided by their index map: p of order 3 twice is p^-1, not the
 * identity (one transpose remains, fused), three times it is; a transpose
 * of a square matrix keeps the shape but is not the identity; reshapes
 * there and back are. */
static void test_chains(void) {
  static const int64_t p[] = {1, 2, 0};
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(3, 2, 3, 4));
  output(g, unary(g, OP_RELU, transpose(g, transpose(g, x, 3, p), 3, p)));
  PetPostStats st;
  Graph *h = post(g, &st);
  print_stats("transpose by p twice", &st, h);
  CHECK_EQ_INT(count_kind(h, OP_TRANSPOSE), 1);
  CHECK_EQ_INT(st.removed, 0);
  CHECK_EQ_INT(st.fused, 1);
  for (int i = 0; i < h->n_nodes; i++)
    if (h->nodes[i].kind == OP_TRANSPOSE) { /* p o p = (2 0 1) */
      const ParamValue *v = &h->nodes[i].params.v[0];
      CHECK(v->n == 3 && v->i[0] == 2 && v->i[1] == 0 && v->i[2] == 1);
    }
  CHECK(equal_everywhere(g, h, 2, false));
  graph_free(h);
  graph_free(g);

  g = graph_new();
  x = input(g, "x", shape_of(3, 2, 3, 4));
  output(g, unary(g, OP_RELU, transpose(g, transpose(g, transpose(g, x, 3, p), 3, p), 3, p)));
  h = post(g, &st);
  print_stats("transpose by p three times", &st, h);
  CHECK_EQ_INT(graph_count_ops(h), 1);
  CHECK_EQ_INT(st.removed, 1);
  CHECK(equal_everywhere(g, h, 2, false));
  graph_free(h);
  graph_free(g);

  g = graph_new();
  x = input(g, "x", shape_of(2, 5, 5));
  output(g, unary(g, OP_NEG, transpose(g, x, 2, (int64_t[]){1, 0})));
  h = post(g, &st);
  CHECK_EQ_INT(count_kind(h, OP_TRANSPOSE), 1);
  CHECK_EQ_INT(st.removed, 0);
  CHECK_EQ_INT(st.moved, 1); /* neg(T(x)) = T(neg(x)) */
  CHECK(equal_everywhere(g, h, 2, false));
  graph_free(h);
  graph_free(g);

  g = graph_new();
  x = input(g, "x", shape_of(3, 2, 3, 4));
  TensorRef r = reshape(g, reshape(g, reshape(g, x, 2, (int64_t[]){6, 4}), 1, (int64_t[]){24}),
                        3, (int64_t[]){4, 3, 2});
  output(g, unary(g, OP_EXP, reshape(g, r, 3, (int64_t[]){2, 3, 4})));
  h = post(g, &st);
  print_stats("four reshapes there and back", &st, h);
  CHECK_EQ_INT(count_layout(h), 0);
  CHECK_EQ_INT(graph_count_ops(h), 1);
  CHECK(equal_everywhere(g, h, 2, false));
  graph_free(h);
  graph_free(g);

  g = graph_new();
  x = input(g, "x", shape_of(3, 2, 3, 4));
  r = reshape(g, reshape(g, x, 2, (int64_t[]){6, 4}), 2, (int64_t[]){3, 8});
  output(g, unary(g, OP_EXP, r));
  h = post(g, &st);
  CHECK_EQ_INT(count_kind(h, OP_RESHAPE), 1); /* fused, and moved after exp */
  CHECK_EQ_INT(st.fused, 1);
  CHECK_EQ_INT(st.moved, 1);
  CHECK(equal_everywhere(g, h, 2, false));
  graph_free(h);
  graph_free(g);
}

/* An opaque node reading a transpose, and a transpose that is a graph
 * output and also read by a relu whose result goes back through the
 * inverse: nothing may move (the second transpose is read twice), nothing
 * is removed, the graph is the same. */
static void test_opaque_and_outputs(void) {
  static const int64_t p[] = {0, 2, 1}, q[] = {0, 2, 1};
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(3, 2, 3, 4));
  TensorRef a = transpose(g, x, 3, p);
  OpaqueInfo *info = calloc(1, sizeof *info);
  info->op_type = strdup("MysteryOp");
  info->domain = strdup("com.example");
  info->proto_len = 5;
  info->proto = malloc(5);
  memcpy(info->proto, "\x0a\x03" "abc", 5);
  Shape s = shape_of(3, 2, 4, 3);
  DType f32 = DT_F32;
  int q_id = must(graph_add_opaque(g, info, &a, 1, 1, &s, &f32, "mystery", &diag));
  output(g, (TensorRef){q_id, 0});
  TensorRef b = transpose(g, x, 3, p);
  output(g, b);
  output(g, transpose(g, unary(g, OP_RELU, b), 3, q));
  uint64_t before = graph_hash(g, NULL);
  PetPostStats st;
  Graph *h = post(g, &st);
  CHECK_EQ_INT(st.moved + st.removed + st.fused, 0);
  CHECK(graph_hash(h, NULL) == before);
  CHECK_EQ_INT(count_kind(h, OP_OPAQUE), 1);
  CHECK_EQ_INT(h->nodes[h->outputs[0].node].kind, OP_OPAQUE);
  CHECK_EQ_INT(h->nodes[h->outputs[1].node].kind, OP_TRANSPOSE);
  graph_free(h);

  /* the transpose into the opaque node stays; the relu chain, read by
   * nothing else, collapses, and its output becomes the relu's */
  graph_free(g);
  g = graph_new();
  x = input(g, "x", shape_of(3, 2, 3, 4));
  a = transpose(g, x, 3, p);
  info = calloc(1, sizeof *info);
  info->op_type = strdup("MysteryOp");
  info->domain = strdup("com.example");
  info->proto = malloc(1);
  q_id = must(graph_add_opaque(g, info, &a, 1, 1, &s, &f32, "mystery", &diag));
  output(g, (TensorRef){q_id, 0});
  output(g, transpose(g, unary(g, OP_RELU, transpose(g, x, 3, p)), 3, q));
  h = post(g, &st);
  print_stats("opaque, and an output through an inverse pair", &st, h);
  CHECK_EQ_INT(st.removed, 1);
  CHECK_EQ_INT(count_kind(h, OP_TRANSPOSE), 1);
  CHECK_EQ_INT(h->nodes[h->outputs[0].node].kind, OP_OPAQUE);
  CHECK_EQ_INT(h->nodes[h->nodes[h->outputs[0].node].in[0].node].kind, OP_TRANSPOSE);
  CHECK_EQ_INT(h->nodes[h->outputs[1].node].kind, OP_RELU);
  graph_free(h);
  graph_free(g);

  /* an inverse pair straight from an input to an output stays: the output
   * would pass the input through */
  g = graph_new();
  x = input(g, "x", shape_of(3, 2, 3, 4));
  output(g, transpose(g, transpose(g, x, 3, p), 3, q));
  h = post(g, &st);
  CHECK_EQ_INT(st.removed, 0);
  CHECK(h->nodes[h->outputs[0].node].kind != OP_INPUT);
  CHECK(equal_everywhere(g, h, 1, false));
  graph_free(h);
  graph_free(g);
}

/* A transpose read twice (by a relu and a sigmoid) is not moved past
 * either: that would need two transposes. Moved past a relu read twice it
 * is, and the pair after it cancels on one path only. */
static void test_two_readers(void) {
  static const int64_t p[] = {0, 2, 3, 1}, q[] = {0, 3, 1, 2};
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 2, 3, 4, 5));
  TensorRef t = transpose(g, x, 4, p);
  output(g, transpose(g, unary(g, OP_RELU, t), 4, q));
  output(g, unary(g, OP_SIGMOID, t));
  PetPostStats st;
  Graph *h = post(g, &st);
  print_stats("transpose read twice", &st, h);
  CHECK_EQ_INT(st.moved, 0);
  CHECK_EQ_INT(graph_count_ops(h), 4);
  CHECK(equal_everywhere(g, h, 2, false));
  graph_free(h);
  graph_free(g);

  g = graph_new();
  x = input(g, "x", shape_of(4, 2, 3, 4, 5));
  TensorRef r = unary(g, OP_RELU, transpose(g, x, 4, p));
  output(g, transpose(g, r, 4, q));
  output(g, binary(g, OP_EWMUL, r, r));
  h = post(g, &st);
  print_stats("relu read twice", &st, h);
  CHECK_EQ_INT(st.moved, 2); /* past the relu, then past r * r */
  CHECK_EQ_INT(st.removed, 1);
  CHECK_EQ_INT(count_kind(h, OP_TRANSPOSE), 1);
  CHECK_EQ_INT(graph_count_ops(h), 3);
  CHECK(equal_everywhere(g, h, 2, false));
  graph_free(h);
  graph_free(g);
}

/* ---- end to end: the search applies Fig. 1 to two consecutive convs ---- */

static void conv_keys(int n, int c, int h, int w, char keys[2][COST_KEY_MAX]) {
  for (int act = 0; act < 2; act++) {
    Graph *g = graph_new();
    TensorRef x = input(g, "x", shape_of(4, n, c, h, w));
    Params p;
    params_default(OP_CONV2D, &p);
    param_set_int(&p, param_index(OP_CONV2D, "act"), act ? ACT_RELU : ACT_NONE);
    TensorRef k = small_int_weight(g, shape_of(4, c, c, 1, 1), 9);
    int id = must(graph_add_node(g, OP_CONV2D, (TensorRef[]){x, k}, 2, 1, &p, NULL, &diag));
    cost_config_key(g, id, keys[act], COST_KEY_MAX);
    graph_free(g);
  }
}

/* A GPU that likes wide images: the 1x1 conv on two images side by side
 * along W costs a twentieth of the conv on the batch of two. */
static CostModel *wide_model(int c, int hw) {
  char narrow[2][COST_KEY_MAX], wide[2][COST_KEY_MAX];
  conv_keys(2, c, hw, hw, narrow);
  conv_keys(1, c, hw, 2 * hw, wide);
  const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  char path[512];
  snprintf(path, sizeof path, "%s/teq-pet-post-XXXXXX", tmp);
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  FILE *f = fdopen(fd, "w");
  for (int act = 0; act < 2; act++) {
    fprintf(f, "Wide GPU\t%s\t100\t100\t-\n", narrow[act]);
    fprintf(f, "Wide GPU\t%s\t5\t5\t-\n", wide[act]);
  }
  fclose(f);
  CostModel *cm = cost_model_new();
  CHECK(cost_model_load_table(cm, path, NULL, &diag) == TEQ_OK);
  unlink(path);
  return cm;
}

static void test_search_fig1(void) {
  enum { C = 4, HW = 6 };
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 2, C, HW, HW));
  TensorRef c1 = conv(g, x, small_int_weight(g, shape_of(4, C, C, 1, 1), 1), 0, 1, 1, 1);
  TensorRef c2 = conv(g, unary(g, OP_RELU, c1), small_int_weight(g, shape_of(4, C, C, 1, 1), 2), 0, 1, 1, 1);
  output(g, c2);
  CostModel *cm = wide_model(C, HW);
  OptRules *rs = opt_rules_new();
  OptOptions o = OPT_DEFAULTS;
  o.pet = true;
  o.pet_mutants = 64;
  o.budget = 20;
  OptStats st;
  Graph *best = NULL;
  int rc = opt_search(g, rs, cm, &o, &best, &st, &diag);
  CHECK(rc == TEQ_OK);
  if (rc) diag_flush(&diag, stderr);
  if (best) {
    double before = 0, after = 0;
    CHECK(opt_graph_cost(cm, g, &before, NULL, &diag) == TEQ_OK);
    CHECK(opt_graph_cost(cm, best, &after, NULL, &diag) == TEQ_OK);
    printf("search: cost %.2f -> %.2f us; %d PET mutations applied; post-optimization over the "
           "candidates: %lld moved, %lld removed, %lld fused\n", before, after, st.n_pet_applied,
           (long long)st.pet_post_moved, (long long)st.pet_post_removed,
           (long long)st.pet_post_fused);
    graph_dump(best, stdout);
    CHECK(graph_check(best, &diag) == TEQ_OK);
    CHECK(after < before);
    int convs[2], n = 0;
    for (int i = 0; i < best->n_nodes; i++)
      if (best->nodes[i].kind == OP_CONV2D && n < 2) convs[n++] = i;
    CHECK_EQ_INT(n, 2);
    const Shape wide = {4, {1, C, HW, 2 * HW}};
    for (int k = 0; k < n; k++) /* both convs on the wide layout */
      CHECK(shape_equal(&best->nodes[convs[k]].out[0], &wide));
    if (n == 2) {
      /* conv1 -> relu -> conv2 with nothing in between, either way round */
      int first = best->nodes[convs[1]].in[0].node == convs[0] ? convs[1] : convs[0];
      int second = first == convs[0] ? convs[1] : convs[0];
      CHECK(!layout_between(best, best->nodes[second].in[0].node, first));
    }
    CHECK_EQ_INT(count_layout(best), 6); /* into the wide layout once, out once */
    CHECK(st.pet_post_removed >= 1);
    CHECK(st.pet_post_moved >= 1);
    int times = 0;
    for (int i = 0; i < st.n_pet_applied; i++) {
      times += st.pet_applied[i].times;
      printf("  %dx %s\n", st.pet_applied[i].times, st.pet_applied[i].desc);
      CHECK(strstr(st.pet_applied[i].desc, "W side by side") != NULL);
    }
    CHECK_EQ_INT(times, 2);
    CHECK(equal_everywhere(g, best, 2, false));
  }
  opt_stats_fini(&st);
  graph_free(best);
  opt_rules_free(rs);
  cost_model_free(cm);
  graph_free(g);
}

/* pet_post_splice_quiet against the pass itself. g computes x w + k; the
 * mutant computes x w as (w^T x^T)^T, so its output is a transpose. Beside
 * a constant k the pass moves that transpose past the add, and the splice
 * is not quiet; beside an input z nothing moves, and it is. */
static void test_splice_quiet(void) {
  static const int64_t swap[2] = {1, 0};
  for (int beside_const = 0; beside_const < 2; beside_const++) {
    Graph *g = graph_new();
    TensorRef x = input(g, "x", shape_of(2, 2, 3)), w = input(g, "w", shape_of(2, 3, 4));
    TensorRef k = beside_const ? small_int_weight(g, shape_of(2, 2, 4), 1)
                               : input(g, "z", shape_of(2, 2, 4));
    TensorRef a = binary(g, OP_MATMUL, x, w);
    must(graph_add_output(g, binary(g, OP_EWADD, a, k), "y", &diag));
    Graph *sub = graph_new();
    TensorRef sx = input(sub, "x", shape_of(2, 2, 3)), sw = input(sub, "w", shape_of(2, 3, 4));
    TensorRef m = binary(sub, OP_MATMUL, transpose(sub, sw, 2, swap), transpose(sub, sx, 2, swap));
    must(graph_add_output(sub, transpose(sub, m, 2, swap), "a", &diag));
    bool quiet = pet_post_splice_quiet(g, sub, (TensorRef[]){x, w}, &a);
    /* the spliced graph, by hand */
    Graph *h = graph_new();
    TensorRef hx = input(h, "x", shape_of(2, 2, 3)), hw = input(h, "w", shape_of(2, 3, 4));
    TensorRef hk = beside_const ? small_int_weight(h, shape_of(2, 2, 4), 1)
                                : input(h, "z", shape_of(2, 2, 4));
    TensorRef hm = binary(h, OP_MATMUL, transpose(h, hw, 2, swap), transpose(h, hx, 2, swap));
    must(graph_add_output(h, binary(h, OP_EWADD, transpose(h, hm, 2, swap), hk), "y", &diag));
    PetPostStats st;
    Graph *p = post(h, &st);
    print_stats(beside_const ? "splice beside a constant" : "splice beside an input", &st, p);
    CHECK_EQ_INT(quiet, !beside_const);
    CHECK_EQ_INT(st.moved + st.removed + st.fused > 0, beside_const);
    graph_free(p), graph_free(h), graph_free(sub), graph_free(g);
  }
}

/* x [M, 3 h d] split along the columns into Q, K and V, each cut into h
 * heads of d and brought heads first (K with the keys last), as BERT's
 * merged Q K V product is read: one reshape, one transpose and a split
 * along axis 0 after, and K's transpose of its two last axes. A piece
 * transposed any other way leaves the split alone. */
static void test_hoist_heads(void) {
  enum { M = 6, H = 4, D = 5 };
  static const int64_t first[3] = {1, 0, 2}, keys_last[3] = {1, 2, 0}, other[3] = {0, 2, 1};
  for (int variant = 0; variant < 2; variant++) {
    Graph *g = graph_new();
    TensorRef x = input(g, "x", shape_of(2, M, 3 * H * D));
    Params ps;
    params_default(OP_SPLIT, &ps);
    param_set_int(&ps, param_index(OP_SPLIT, "axis"), 1);
    param_set_ints(&ps, param_index(OP_SPLIT, "sizes"), (int64_t[]){H * D, H * D, H * D}, 3);
    int sp = must(graph_add_node(g, OP_SPLIT, &x, 1, 3, &ps, NULL, &diag));
    const int64_t *perm[3] = {first, variant ? other : keys_last, first};
    TensorRef heads[3];
    for (int k = 0; k < 3; k++)
      heads[k] = transpose(g, reshape(g, (TensorRef){sp, k}, 3, (int64_t[]){M, H, D}), 3, perm[k]);
    if (variant) {
      for (int k = 0; k < 3; k++) output(g, unary(g, OP_NEG, heads[k]));
    } else {
      TensorRef scores = binary(g, OP_MATMUL, heads[0], heads[1]); /* [H, M, M] */
      output(g, binary(g, OP_MATMUL, scores, heads[2]));
    }
    PetPostStats st;
    Graph *h = post(g, &st);
    print_stats(variant ? "K transposed otherwise: not hoisted" : "Q, K, V heads hoisted", &st, h);
    int axis0 = 0, axis1 = 0;
    for (int i = 0; i < h->n_nodes; i++)
      if (h->nodes[i].kind == OP_SPLIT) {
        if (param_int(&h->nodes[i].params, param_index(OP_SPLIT, "axis"))) axis1++;
        else axis0++;
      }
    if (!variant) {
      CHECK_EQ_INT((int)st.hoisted, 1);
      CHECK_EQ_INT(axis0, 1);
      CHECK_EQ_INT(axis1, 0);
      CHECK_EQ_INT(count_kind(h, OP_TRANSPOSE), 2); /* all heads first; K's last two axes */
    } else {
      CHECK_EQ_INT((int)st.hoisted, 0);
      CHECK_EQ_INT(axis1, 1);
    }
    CHECK(equal_everywhere(g, h, 2, false));
    graph_free(h), graph_free(g);
  }
}

/* The same heads as PyTorch exports them (the Transformer encoder, ViT):
 * three slices of x [M, 1, 3 h d] along its last axis, and Q divided by a
 * scalar after its transpose. The slices go, the division is carried to
 * the piece hoisting leaves for Q. */
static void test_hoist_sliced_heads(void) {
  enum { M = 6, H = 4, D = 5 };
  static const int64_t first[3] = {1, 0, 2}, keys_last[3] = {1, 2, 0};
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(3, M, 1, 3 * H * D));
  TensorRef heads[3];
  for (int k = 0; k < 3; k++) {
    Params sl;
    params_default(OP_SLICE, &sl);
    param_set_ints(&sl, param_index(OP_SLICE, "starts"), (int64_t[]){0, 0, k * H * D}, 3);
    param_set_ints(&sl, param_index(OP_SLICE, "ends"), (int64_t[]){M, 1, (k + 1) * H * D}, 3);
    param_set_ints(&sl, param_index(OP_SLICE, "steps"), (int64_t[]){1, 1, 1}, 3);
    TensorRef piece = node(g, OP_SLICE, &x, 1, &sl);
    heads[k] = transpose(g, reshape(g, piece, 3, (int64_t[]){M, H, D}), 3, k == 1 ? keys_last : first);
  }
  heads[0] = binary(g, OP_DIV, heads[0], small_int_weight(g, shape_of(0), 5));
  TensorRef scores = binary(g, OP_MATMUL, heads[0], heads[1]);
  output(g, binary(g, OP_MATMUL, scores, heads[2]));
  PetPostStats st;
  Graph *h = post(g, &st);
  print_stats("sliced Q, K, V heads hoisted", &st, h);
  CHECK_EQ_INT((int)st.hoisted, 1);
  CHECK_EQ_INT(count_kind(h, OP_SLICE), 0);
  CHECK_EQ_INT(count_kind(h, OP_SPLIT), 1);
  CHECK_EQ_INT(count_kind(h, OP_TRANSPOSE), 2);
  CHECK_EQ_INT(count_kind(h, OP_DIV), 1);
  CHECK(equal_everywhere(g, h, 2, false));
  graph_free(h), graph_free(g);
}

/* The same heads as PyTorch 2.x exports them (nn.MultiheadAttention's
 * packed projection): x [L, B, 3E] reshaped to [L, B, 3, E], a unit axis
 * put in front, the 3 swapped to it and the unit axis dropped, each of Q,
 * K and V then selected by a gather of index 0, 1 or 2, cut into heads
 * [L B, h, d], brought heads first and reshaped to [B, h, L, d], and K's
 * two last axes swapped after that. The R/T chain, the gathers and the
 * three transposes become one reshape, one transpose and a split. With the
 * gathers' indices 0, 2, 1 (V where K was) each piece still computes what
 * it did, and the hoisted split is checked the same way. */
static void test_hoist_selected_heads(void) {
  enum { L = 6, B = 1, H = 4, D = 5, E = H * D };
  static const int64_t first[3] = {1, 0, 2}, keys_last[4] = {0, 1, 3, 2};
  for (int swapped = 0; swapped < 2; swapped++) {
    Graph *g = graph_new();
    TensorRef x = input(g, "x", shape_of(3, L, B, 3 * E));
    TensorRef t = reshape(g, x, 4, (int64_t[]){L, B, 3, E});
    t = reshape(g, t, 5, (int64_t[]){1, L, B, 3, E});
    t = transpose(g, t, 5, (int64_t[]){3, 1, 2, 0, 4});
    t = reshape(g, t, 4, (int64_t[]){3, L, B, E});
    TensorRef heads[3];
    for (int k = 0; k < 3; k++) {
      Tensor *index = tensor_new(DT_I64, &(Shape){0, {0}});
      ((int64_t *)index->data)[0] = swapped && k ? 3 - k : k;
      TensorRef in[2] = {t, {must(graph_add_const(g, NULL, index, &diag)), 0}};
      Params gp;
      params_default(OP_GATHER, &gp);
      TensorRef piece = node(g, OP_GATHER, in, 2, &gp);
      TensorRef hd = transpose(g, reshape(g, piece, 3, (int64_t[]){L * B, H, D}), 3, first);
      heads[k] = reshape(g, hd, 4, (int64_t[]){B, H, L, D});
    }
    TensorRef kt = transpose(g, heads[1], 4, keys_last);
    TensorRef scores = binary(g, OP_MATMUL, heads[0], kt);
    output(g, binary(g, OP_MATMUL, scores, heads[2]));
    PetPostStats st;
    Graph *h = post(g, &st);
    print_stats(swapped ? "selected heads, K and V swapped, hoisted" : "selected Q, K, V heads hoisted",
                &st, h);
    CHECK_EQ_INT((int)st.hoisted, 1);
    CHECK_EQ_INT(count_kind(h, OP_GATHER), 0);
    CHECK_EQ_INT(count_kind(h, OP_SPLIT), 1);
    CHECK_EQ_INT(count_kind(h, OP_TRANSPOSE), 2); /* heads first; K's last two axes */
    CHECK(equal_everywhere(g, h, 2, false));
    graph_free(h), graph_free(g);
  }
}

int main(void) {
  diag_init(&diag);
  test_inverse_around_elementwise();
  test_fig1_between_convs();
  test_chains();
  test_opaque_and_outputs();
  test_two_readers();
  test_search_fig1();
  test_splice_quiet();
  test_hoist_heads();
  test_hoist_sliced_heads();
  test_hoist_selected_heads();
  diag_flush(&diag, stderr);
  diag_fini(&diag);
  return check_exit();
}
