/* test_strided.c: values read by strides (graph.h: graph_strided). A
 * transpose a matmul reads, or a split of one, runs no kernel on the GPU:
 * the plan aliases it to the value it reorders and the matmul's cuBLAS
 * call reads it through leading dimensions and batch strides.
 *
 * Which nodes are strided is checked on attention as BERT's search leaves
 * it (heads hoisted above the split of Q, K and V, K's keys last) and on
 * the cases that must stay kernels. What they compute is checked by running
 * the GPU's plan on the host (exec_run_planned: the arena and its aliases
 * as mem_plan_build lays them out, each step's CPU kernel reading and
 * writing its slots there, each matmul with a strided operand or output as
 * the device calls cuBLAS) against the CPU executor on the same graph. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cost.h"
#include "runtime/cuda.h"
#include "runtime/exec.h"
#include "runtime/plan.h"
#include "tests/check.h"
#include "tests/cuda_check.h"
#include "tests/tensor_check.h"
#include "tests/attention_graph.h"

/* ---- the plan, run on the host ---- */

/* g's outputs from the plan run on the host (exec_run_planned) against
 * the CPU executor's; returns the plan's strided matmul steps. */
static int plan_agrees(const Graph *g, const char *what) {
  Shape xs = *graph_shape(g, (TensorRef){g->inputs[0], 0});
  Tensor *x = random_f32(xs, 11);
  Tensor *want[4] = {0}, *got[4] = {0};
  int steps = -1;
  int rc = exec_run(g, EXEC_F32, &x, want, &D);
  CHECK_MSG(rc == TEQ_OK, "%s: %s", what, diag_last(&D));
  if (rc == TEQ_OK) rc = exec_run_planned(g, &x, got, &steps, &D);
  CHECK_MSG(rc == TEQ_OK, "%s planned: %s", what, diag_last(&D));
  for (int i = 0; rc == TEQ_OK && i < g->n_outputs; i++)
    CHECK_MSG(max_rel_err(got[i], want[i]) < 1e-5, "%s: output %d differs by %g", what, i,
              max_rel_err(got[i], want[i]));
  unref_all(want, g->n_outputs);
  unref_all(got, g->n_outputs);
  tensor_unref(x);
  return rc == TEQ_OK ? steps : -1;
}

/* ---- tests ---- */

/* BERT's attention: the heads-first transpose, the split of it and K's
 * keys-last transpose cost nothing and run as the matmuls' strides; the
 * transpose back to tokens, which a reshape reads, costs nothing too: the
 * product of the values writes its heads straight among the tokens. */
static void test_attention(void) {
  Attention a = attention(12, 3, 8, false);
  GraphStrided st;
  CHECK(graph_strided(a.g, &st) == TEQ_OK);
  CHECK(st.strided[a.heads_first] && st.strided[a.split] && st.strided[a.keys_last]);
  CHECK(st.strided[a.back] && !st.strided[a.scores] && !st.strided[a.values]);
  /* The values' product [3, 12, 8] written into [12, 3, 8]: (h, t, d) at
   * 8 h + 24 t + d. */
  int v = st.offset[a.values], b = st.offset[a.back];
  CHECK(st.base[v] == b && st.first[v] == 0 && st.base[b] < 0);
  CHECK(st.strides[v * TEQ_MAX_DIMS + 0] == 8 && st.strides[v * TEQ_MAX_DIMS + 1] == 24 &&
        st.strides[v * TEQ_MAX_DIMS + 2] == 1);
  /* K is heads [3, 12, 8] of x W [12, 72], read keys last: [3, 8, 12],
   * element (h, d, t) at 24 + 8 h + d + 72 t of the product. */
  int k = st.offset[a.keys_last];
  CHECK_EQ_INT(st.first[k], 24);
  CHECK(st.strides[k * TEQ_MAX_DIMS + 0] == 8 && st.strides[k * TEQ_MAX_DIMS + 1] == 1 &&
        st.strides[k * TEQ_MAX_DIMS + 2] == 72);
  graph_strided_fini(&st);
  /* The cost of a graph leaves them out, as it leaves out views. */
  CostModel *m = cost_model_new();
  double us = 0, alone = 0;
  int counts[COST__SOURCES];
  CostEstimate e;
  CHECK(cost_graph(m, a.g, &us, counts, &D) == TEQ_OK);
  double sum = 0;
  for (int id = 0; id < a.g->n_nodes; id++) {
    if (cost_node(m, a.g, id, &e, &D) != TEQ_OK) continue;
    sum += e.us;
    if (id == a.heads_first || id == a.keys_last || id == a.back) alone += e.us;
  }
  CHECK_MSG(alone > 0 && fabs(sum - alone - us) < 1e-9 * sum, "%g = %g - %g?", us, sum, alone);
  cost_model_free(m);
  CHECK_EQ_INT(plan_steps(a.g), 4); /* the three products and the softmax */
  /* TEQ_NO_STRIDES: every value dense, the three transposes kernels again. */
  setenv("TEQ_NO_STRIDES", "1", 1);
  CHECK(graph_strided(a.g, &st) == TEQ_OK);
  int marked = 0;
  for (int id = 0; id < a.g->n_nodes; id++) marked += st.strided[id];
  for (int v = 0; v < st.offset[a.g->n_nodes]; v++) marked += st.base[v] >= 0;
  CHECK_EQ_INT(marked, 0);
  graph_strided_fini(&st);
  CHECK_EQ_INT(plan_steps(a.g), 7);
  if (cuda_kernels_built("the strided products on the host"))
    CHECK_EQ_INT(plan_agrees(a.g, "attention, no strides"), 0);
  unsetenv("TEQ_NO_STRIDES");
  if (cuda_kernels_built("the strided products on the host"))
    CHECK_EQ_INT(plan_agrees(a.g, "attention"), 2);
  graph_free(a.g);
}

/* K's transpose also read by a relu (and so an output) is a kernel; a
 * kernel reads its input dense, so the split it reads from is one, and
 * the heads-first transpose too: the split's pieces are all views of it.
 * The values' product still writes its heads among the tokens. */
static void test_a_reader_that_cannot(void) {
  Attention a = attention(10, 2, 4, true);
  GraphStrided st;
  CHECK(graph_strided(a.g, &st) == TEQ_OK);
  CHECK(!st.strided[a.keys_last] && !st.strided[a.heads_first] && !st.strided[a.split]);
  CHECK(st.strided[a.back]);
  graph_strided_fini(&st);
  CHECK_EQ_INT(plan_steps(a.g), 7);
  if (cuda_kernels_built("the strided products on the host"))
    CHECK_EQ_INT(plan_agrees(a.g, "a relu of K"), 1);
  graph_free(a.g);
}

/* MaxViT's Q, K and V, slices of the last axis of one product: each read
 * by its product through the whole row's stride (the slice's start its
 * first element), so the plan runs the three products and the softmax.
 * A slice with a reader that cannot, or one walking backwards, stays a
 * kernel. */
static void test_sliced_attention(void) {
  Attention a = sliced_attention(2, 7, 2, 8);
  GraphStrided st;
  CHECK(graph_strided(a.g, &st) == TEQ_OK);
  CHECK(st.strided[a.split] && st.strided[a.heads_first] && st.strided[a.keys_last]);
  /* K: [2, 7, 16] of the product [2, 7, 48] from element 16 on. */
  int k = st.offset[a.split];
  CHECK_EQ_INT(st.first[k], 16);
  CHECK(st.strides[k * TEQ_MAX_DIMS + 0] == 7 * 48 && st.strides[k * TEQ_MAX_DIMS + 1] == 48 &&
        st.strides[k * TEQ_MAX_DIMS + 2] == 1);
  graph_strided_fini(&st);
  CHECK_EQ_INT(plan_steps(a.g), 4);
  if (cuda_kernels_built("the strided products on the host"))
    CHECK_EQ_INT(plan_agrees(a.g, "sliced attention"), 2);
  /* K's slice read by a relu too: a kernel, and so is all that reads it. */
  int r = node(a.g, OP_RELU, (TensorRef[]){{a.split, 0}}, 1, 1, NULL);
  graph_add_output(a.g, (TensorRef){r, 0}, "k", &D);
  CHECK(graph_strided(a.g, &st) == TEQ_OK);
  CHECK(!st.strided[a.split] && st.strided[a.heads_first]);
  graph_strided_fini(&st);
  if (cuda_kernels_built("the strided products on the host")) plan_agrees(a.g, "K's slice read");
  graph_free(a.g);
  /* A slice walking backwards: no stride says it to cuBLAS. */
  Graph *g = graph_new();
  Shape xs = shape_of(3, 2, 4, 8), ws = shape_of(3, 2, 8, 3);
  int x = graph_add_input(g, "x", &xs, DT_F32, &D);
  Params sp;
  params_default(OP_SLICE, &sp);
  param_set_ints(&sp, 0, (int64_t[]){0, 3, 0}, 3);
  param_set_ints(&sp, 1, (int64_t[]){2, -1, 8}, 3);
  param_set_ints(&sp, 2, (int64_t[]){1, -1, 1}, 3);
  int back = node(g, OP_SLICE, (TensorRef[]){{x, 0}}, 1, 1, &sp);
  int w = graph_add_const(g, "w", random_f32(ws, 4), &D);
  graph_add_output(g, (TensorRef){matmul(g, (TensorRef){back, 0}, (TensorRef){w, 0}), 0}, "y", &D);
  CHECK(graph_strided(g, &st) == TEQ_OK);
  CHECK(!st.strided[back]);
  graph_strided_fini(&st);
  plan_agrees(g, "a slice backwards");
  graph_free(g);
}

/* ConvNeXt's block back to channels first: x W over [1, h, w, c] tokens,
 * then (0 3 1 2). The product writes its transpose by columns (B^T A^T),
 * and the transpose runs no kernel; the add after it reads it dense. */
static void test_tall_product_by_columns(void) {
  Graph *g = graph_new();
  Shape xs = shape_of(4, 1, 5, 6, 8), ys = shape_of(4, 1, 4, 5, 6);
  int x = graph_add_input(g, "x", &xs, DT_F32, &D);
  int y = graph_add_input(g, "y", &ys, DT_F32, &D);
  int w = graph_add_const(g, "w", random_f32(shape_of(2, 8, 4), 21), &D);
  int p = matmul(g, (TensorRef){x, 0}, (TensorRef){w, 0});
  int t = transpose(g, (TensorRef){p, 0}, (int64_t[]){0, 3, 1, 2}, 4);
  int sum = node(g, OP_EWADD, (TensorRef[]){{t, 0}, {y, 0}}, 2, 1, NULL);
  graph_add_output(g, (TensorRef){sum, 0}, "z", &D);
  GraphStrided st;
  CHECK(graph_strided(g, &st) == TEQ_OK);
  int v = st.offset[p];
  CHECK(st.strided[t] && st.base[v] == st.offset[t]);
  /* (0, h, w, c) of the product at 30 c + 6 h + w of the transpose. */
  CHECK(st.strides[v * TEQ_MAX_DIMS + 1] == 6 && st.strides[v * TEQ_MAX_DIMS + 2] == 1 &&
        st.strides[v * TEQ_MAX_DIMS + 3] == 30);
  graph_strided_fini(&st);
  CHECK_EQ_INT(plan_steps(g), 2);
  if (cuda_kernels_built("the strided products on the host")) {
    Tensor *in[2] = {random_f32(xs, 22), random_f32(ys, 23)}, *want = NULL, *got = NULL;
    int steps = -1;
    CHECK(exec_run(g, EXEC_F32, in, &want, &D) == TEQ_OK);
    CHECK(exec_run_planned(g, in, &got, &steps, &D) == TEQ_OK);
    CHECK(steps == 1 && want && got && max_rel_err(got, want) < 1e-5);
    unref_all((Tensor *[]){in[0], in[1], want, got}, 4);
  }
  graph_free(g);
}

/* Swin's windowed attention: every transpose and the split cost nothing,
 * each product reading or writing over two batch strides (window, head)
 * in one call over arrays of pointers; two products and the softmax. */
static void test_windowed_attention(void) {
  Attention a = windowed_attention(4, 49, 3, 8);
  GraphStrided st;
  CHECK(graph_strided(a.g, &st) == TEQ_OK);
  CHECK(st.strided[a.heads_first] && st.strided[a.split] && st.strided[a.keys_last] &&
        st.strided[a.back]);
  graph_strided_fini(&st);
  CHECK_EQ_INT(plan_steps(a.g), 3);
  if (cuda_kernels_built("the strided products on the host"))
    CHECK_EQ_INT(plan_agrees(a.g, "windowed attention"), 2);
  graph_free(a.g);
}

/* What strides cannot say, or cuBLAS cannot read, stays a kernel: a
 * reshape merging axes that do not follow one another in memory; a
 * product the GPU stacks into one tall matrix (x^T W); a transpose that is
 * a graph output; a matrix with no unit stride. */
static void test_what_stays_a_kernel(void) {
  Graph *g = graph_new();
  Shape xs = shape_of(3, 4, 6, 8);
  int x = graph_add_input(g, "x", &xs, DT_F32, &D);
  /* [4, 6, 8] -> [6, 4, 8] -> [6, 32]: axes 4 and 8 are 48 apart, not 8. */
  int t1 = transpose(g, (TensorRef){x, 0}, (int64_t[]){1, 0, 2}, 3);
  int r1 = reshape(g, (TensorRef){t1, 0}, (int64_t[]){6, 32}, 2);
  int w = graph_add_const(g, "w", random_f32(shape_of(2, 32, 5), 3), &D);
  int p1 = matmul(g, (TensorRef){r1, 0}, (TensorRef){w, 0});
  graph_add_output(g, (TensorRef){p1, 0}, "p1", &D);
  /* x^T W, [4, 8, 6] x [6, 3]: B shared, A stacked into rows. */
  int t2 = transpose(g, (TensorRef){x, 0}, (int64_t[]){0, 2, 1}, 3);
  int w2 = graph_add_const(g, "w2", random_f32(shape_of(2, 6, 3), 4), &D);
  int p2 = matmul(g, (TensorRef){t2, 0}, (TensorRef){w2, 0});
  graph_add_output(g, (TensorRef){p2, 0}, "p2", &D);
  /* A transpose that is an output. */
  int t3 = transpose(g, (TensorRef){x, 0}, (int64_t[]){0, 2, 1}, 3);
  graph_add_output(g, (TensorRef){t3, 0}, "t3", &D);
  int p3 = matmul(g, (TensorRef){t3, 0}, (TensorRef){x, 0});
  graph_add_output(g, (TensorRef){p3, 0}, "p3", &D);
  /* [4, 6, 8] -> [8, 4, 6]: the matrices [4, 6] step 1 along neither
   * (48 and 8); the batch axis does. */
  int t4 = transpose(g, (TensorRef){x, 0}, (int64_t[]){2, 0, 1}, 3);
  int w4 = graph_add_const(g, "w4", random_f32(shape_of(3, 8, 6, 2), 5), &D);
  int p4 = matmul(g, (TensorRef){t4, 0}, (TensorRef){w4, 0});
  graph_add_output(g, (TensorRef){p4, 0}, "p4", &D);
  /* But [4, 6, 8] -> [4, 8, 6] as B of [4, 3, 8] x: read transposed. */
  Shape zs = shape_of(3, 4, 3, 8);
  int z = graph_add_input(g, "z", &zs, DT_F32, &D);
  int t5 = transpose(g, (TensorRef){x, 0}, (int64_t[]){0, 2, 1}, 3);
  int p5 = matmul(g, (TensorRef){z, 0}, (TensorRef){t5, 0});
  graph_add_output(g, (TensorRef){p5, 0}, "p5", &D);
  CHECK_MSG(graph_check(g, &D) == TEQ_OK, "%s", diag_last(&D));
  GraphStrided st;
  CHECK(graph_strided(g, &st) == TEQ_OK);
  CHECK(!st.strided[t1]);
  CHECK(!st.strided[r1]);
  CHECK(!st.strided[t2]);
  CHECK(!st.strided[t3]);
  CHECK(!st.strided[t4]);
  CHECK(st.strided[t5]);
  graph_strided_fini(&st);
  graph_free(g);
}

/* Chains: a transpose of a transpose, a slice of it (stepping by 1 or 2,
 * from 0, 1 or 2 on: a box at an offset, or at one misaligned, which
 * stays a kernel), a split of a transposed value cut
 * along the batch axis (each piece a box at an offset), a reshape that
 * strides can say, the same value read by two matmuls, a product written
 * into its transpose; over shapes and perms drawn at random, the plan on
 * the host against the executor. */
/* A random permutation of r axes. */
static void random_perm(uint64_t *state, int r, int64_t *perm) {
  for (int i = 0; i < r; i++) perm[i] = i;
  for (int i = r - 1; i > 0; i--) {
    int j = (int)(rng_next(state) % (uint64_t)(i + 1));
    int64_t t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
}

static void test_random_chains(void) {
  if (!cuda_kernels_built("the strided products on the host")) return;
  uint64_t state = 1;
  int strided_nodes = 0, strided_steps = 0, arrays = 0, talls = 0, slices = 0, strided_slices = 0;
  for (int seed = 0; seed < 400; seed++) {
    Graph *g = graph_new();
    int rank = 3 + seed % 2; /* rank 4: two batch axes, often stepped by two strides */
    int64_t d[4], perm[4];
    for (int i = 0; i < rank; i++) d[i] = 1 + (int64_t)(rng_next(&state) % 4) * 2;
    Shape xs = shape_make(rank, d);
    int x = graph_add_input(g, "x", &xs, DT_F32, &D);
    /* One transpose or two in a row. */
    random_perm(&state, rank, perm);
    int t = transpose(g, (TensorRef){x, 0}, perm, rank);
    if (rng_next(&state) % 2) {
      random_perm(&state, rank, perm);
      t = transpose(g, (TensorRef){t, 0}, perm, rank);
    }
    TensorRef v = {t, 0};
    Shape vs = *graph_shape(g, v);
    if (rng_next(&state) % 3 == 0) { /* a box of it: from 0, 1 or 2 on, step 1 or 2 */
      int axis = (int)(rng_next(&state) % (uint64_t)rank);
      int64_t st[4] = {0}, en[4], sp[4];
      for (int i = 0; i < rank; i++) en[i] = vs.d[i], sp[i] = 1;
      if (vs.d[axis] > 2) st[axis] = (int64_t)(rng_next(&state) % 3);
      sp[axis] = 1 + (int64_t)(rng_next(&state) % 2);
      Params pp;
      params_default(OP_SLICE, &pp);
      param_set_ints(&pp, 0, st, rank);
      param_set_ints(&pp, 1, en, rank);
      param_set_ints(&pp, 2, sp, rank);
      v = (TensorRef){node(g, OP_SLICE, &v, 1, 1, &pp), 0};
      vs = *graph_shape(g, v);
      slices++;
      if (rng_next(&state) % 2) { /* then a transpose of the box */
        random_perm(&state, rank, perm);
        v = (TensorRef){transpose(g, v, perm, rank), 0};
        vs = *graph_shape(g, v);
      }
    }
    if (vs.d[0] % 2 == 0 && rng_next(&state) % 2) { /* halves along the first axis */
      Params sp;
      params_default(OP_SPLIT, &sp);
      param_set_int(&sp, 0, 0);
      param_set_ints(&sp, 1, (int64_t[]){vs.d[0] / 2, vs.d[0] / 2}, 2);
      int s = node(g, OP_SPLIT, &v, 1, 2, &sp);
      v = (TensorRef){s, (int)(rng_next(&state) % 2)};
      vs = *graph_shape(g, v);
    }
    if (rank == 3 && rng_next(&state) % 3 == 0) { /* [b, r, c] -> [1, b, r, c] */
      int r = reshape(g, v, (int64_t[]){1, vs.d[0], vs.d[1], vs.d[2]}, 4);
      v = (TensorRef){r, 0};
      vs = *graph_shape(g, v);
    }
    int r = vs.ndim;
    Shape bs = vs, as = vs;
    bs.d[r - 2] = vs.d[r - 1], bs.d[r - 1] = 3;
    as.d[r - 1] = vs.d[r - 2], as.d[r - 2] = 2;
    int b = graph_add_const(g, "b", random_f32(bs, (uint64_t)seed), &D);
    int a = graph_add_const(g, "a", random_f32(as, (uint64_t)seed + 1000), &D);
    int p = matmul(g, v, (TensorRef){b, 0});
    int q = matmul(g, (TensorRef){a, 0}, v);
    if (rng_next(&state) % 2) { /* written into its transpose */
      random_perm(&state, r, perm);
      p = transpose(g, (TensorRef){p, 0}, perm, r);
    }
    graph_add_output(g, (TensorRef){p, 0}, "p", &D);
    graph_add_output(g, (TensorRef){q, 0}, "q", &D);
    /* A tall product x W (W one matrix for every entry) written into its
     * transpose: by rows or by columns, or neither (a kernel then). */
    Shape ws = shape_of(2, (int)d[rank - 1], 5);
    int w = graph_add_const(g, "w", random_f32(ws, (uint64_t)seed + 2000), &D);
    int tall = matmul(g, (TensorRef){x, 0}, (TensorRef){w, 0});
    random_perm(&state, rank, perm);
    int back = transpose(g, (TensorRef){tall, 0}, perm, rank);
    graph_add_output(g, (TensorRef){back, 0}, "tall", &D);
    CHECK_MSG(graph_check(g, &D) == TEQ_OK, "seed %d: %s", seed, diag_last(&D));
    GraphStrided st;
    CHECK(graph_strided(g, &st) == TEQ_OK);
    for (int id = 0; id < g->n_nodes; id++) {
      strided_nodes += st.strided[id];
      strided_slices += st.strided[id] && g->nodes[id].kind == OP_SLICE;
    }
    talls += st.strided[back] && st.base[st.offset[tall]] >= 0;
    /* Two batch axes that no one stride steps through: arrays of pointers. */
    for (int id = 0; id < g->n_nodes; id++) {
      const Node *n = &g->nodes[id];
      if (n->kind != OP_MATMUL || n->out[0].ndim < 4) continue;
      bool strided = st.base[st.offset[id]] >= 0;
      for (int j = 0; j < 2; j++) strided = strided || st.base[st.offset[n->in[j].node] + n->in[j].out] >= 0;
      arrays += strided;
    }
    graph_strided_fini(&st);
    char what[32];
    snprintf(what, sizeof what, "seed %d", seed);
    int steps = plan_agrees(g, what);
    strided_steps += steps > 0 ? steps : 0;
    graph_free(g);
  }
  /* Enough of them read by strides to have been tested. */
  printf("%d strided nodes, %d strided steps, %d of rank 4, %d tall products written by "
         "strides, %d of %d slices strided\n", strided_nodes, strided_steps, arrays, talls,
         strided_slices, slices);
  CHECK_MSG(strided_slices > 20 && strided_slices < slices, "%d of %d slices strided",
            strided_slices, slices);
  CHECK_MSG(strided_nodes > 200 && strided_steps > 200 && arrays > 50 && talls > 50,
            "%d strided nodes, %d strided steps, %d of rank 4, %d tall", strided_nodes,
            strided_steps, arrays, talls);
}

int main(void) {
  diag_init(&D);
  test_attention();
  test_a_reader_that_cannot();
  test_windowed_attention();
  test_tall_product_by_columns();
  test_sliced_attention();
  test_what_stays_a_kernel();
  test_random_chains();
  diag_fini(&D);
  return check_exit();
}
