/* test_gather.c: chains of layout operators run as one gather of rows
 * (plan.h: plan_gathers). Which nodes form chains, where each exit's rows
 * come from and what the cost model charges are checked on Swin's shifted
 * window partition (a cyclic shift of four slices and two concats, a
 * reshape, a transpose and a reshape), its patch merging (four strided
 * slices concatenated on channels), padding, and the cases that must stay
 * as they are. What a plan computes is checked by running the GPU's plan
 * on the host (exec_run_planned: each exit's rows copied through the
 * pointers the device uploads) against the CPU executor: a copy is exact,
 * so the outputs must be equal to the bit. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cost.h"
#include "runtime/exec.h"
#include "runtime/plan.h"
#include "tests/check.h"
#include "tests/tensor_check.h"
#include "tests/layout_chain.h"

/* ---- checks ---- */

static PlanGathers gathers_of(const Graph *g) {
  GraphStrided st;
  PlanGathers pg = {0};
  CHECK(graph_strided(g, &st) == TEQ_OK);
  CHECK_MSG(plan_gathers(g, &st, &pg, &D) == TEQ_OK, "%s", diag_last(&D));
  graph_strided_fini(&st);
  return pg;
}

/* g's plan run on the host against the executor: equal to the bit. */
static void plan_agrees(const Graph *g, const char *what) {
  Shape xs = *graph_shape(g, (TensorRef){g->inputs[0], 0});
  Tensor *x = random_f32(xs, 5);
  Tensor *want[4] = {0}, *got[4] = {0};
  int rc = exec_run(g, EXEC_F32, &x, want, &D);
  CHECK_MSG(rc == TEQ_OK, "%s: %s", what, diag_last(&D));
  if (rc == TEQ_OK) rc = exec_run_planned(g, &x, got, NULL, &D);
  CHECK_MSG(rc == TEQ_OK, "%s planned: %s", what, diag_last(&D));
  for (int i = 0; rc == TEQ_OK && i < g->n_outputs; i++)
    CHECK_MSG(tensors_identical(got[i], want[i]), "%s: output %d differs by %g", what, i,
              max_abs_err(got[i], want[i]));
  unref_all(want, g->n_outputs);
  unref_all(got, g->n_outputs);
  tensor_unref(x);
}

static void set_no_gathers(bool on) {
  if (on) setenv("TEQ_NO_GATHERS", "1", 1);
  else unsetenv("TEQ_NO_GATHERS");
}

/* ---- tests ---- */

/* Swin's shifted windows on an 8 x 8 map of 32 channels, windows of 4:
 * roll by 3 along both axes, partition, then a relu reads the windows. */
static void test_shifted_windows(void) {
  Chain ch = shifted_windows(8, 4, 32, 3);
  Graph *g = ch.g;
  int src = ch.src, win = ch.exit, out = ch.out;
  PlanGathers pg = gathers_of(g);
  CHECK(pg.n_exits == 1 && pg.role[win] == GATHER_EXIT);
  for (int id = src + 1; id < win; id++)
    CHECK_MSG(pg.role[id] == GATHER_INNER, "node %d is not inside the chain", id);
  CHECK(pg.role[src] == GATHER_NONE && pg.role[out] == GATHER_NONE);
  if (pg.n_exits == 1) {
    const GatherRows *r = &pg.exits[0];
    CHECK(r->row_len == 32 && r->n_rows == 64 && r->n_sources == 1);
    /* Window 0's first token is the map's (3, 3): element (3 * 8 + 3) * 32. */
    CHECK(r->slot[0] == slot_of(g, src) && r->elem[0] == (3 * 8 + 3) * 32);
    /* The concat along the rows (its slices are runs of whole rows,
     * views), the two slices along the columns and their concat, the
     * transpose. */
    CHECK_MSG(r->kernels == 5, "%d kernels", r->kernels);
  }
  /* The relu, the gather, the relu. */
  CHECK_MSG(plan_steps(g) == 3, "%d steps", plan_steps(g));
  plan_agrees(g, "shifted windows");

  /* The cost model charges the chain as its one gather. */
  CostModel *m = cost_model_new();
  double with = 0, without = 0, kernels = 0;
  int counts[COST__SOURCES];
  CHECK(cost_graph(m, g, &with, counts, &D) == TEQ_OK);
  set_no_gathers(true);
  CHECK(cost_graph(m, g, &without, counts, &D) == TEQ_OK);
  PlanGathers none = gathers_of(g);
  CHECK(none.n_exits == 0);
  plan_gathers_fini(&none);
  CHECK_MSG(plan_steps(g) == 7, "%d steps without gathers", plan_steps(g));
  plan_agrees(g, "shifted windows, no gathers");
  set_no_gathers(false);
  int32_t *home = graph_piece_homes(g);
  for (int id = src + 1; id <= win; id++) {
    CostEstimate e;
    CHECK(cost_node(m, g, id, &e, &D) == TEQ_OK);
    if (!cost_node_is_free(g, id) && !graph_node_in_place(g, id, home, NULL, NULL)) kernels += e.us;
  }
  free(home);
  CostEstimate gather = cost_gather(m, g, &pg.exits[0]);
  CHECK(gather.source == COST_ANALYTIC && gather.us > 0 && gather.us < kernels);
  CHECK_MSG(close_to(without - with, kernels - gather.us, 1e-9),
            "without %.3f, with %.3f, chain %.3f, gather %.3f", without, with, kernels, gather.us);
  cost_model_free(m);
  plan_gathers_fini(&pg);
  graph_free(g);
}

/* Swin's patch merging: x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2] and
 * x[1::2, 1::2] concatenated along the channels: rows of 32 channels from
 * one source, the concat the exit. */
static void test_patch_merging(void) {
  Chain ch = patch_merging(8, 32);
  Graph *g = ch.g;
  int src = ch.src, cat = ch.exit;
  PlanGathers pg = gathers_of(g);
  CHECK(pg.n_exits == 1 && pg.role[cat] == GATHER_EXIT);
  if (pg.n_exits == 1) {
    const GatherRows *r = &pg.exits[0];
    CHECK(r->row_len == 32 && r->n_rows == 64 && r->kernels == 9);
    /* Row 1 is x[1, 0]'s channels: the second part's first pixel. */
    CHECK(r->slot[1] == slot_of(g, src) && r->elem[1] == 8 * 32);
  }
  CHECK(plan_steps(g) == 3);
  plan_agrees(g, "patch merging");
  plan_gathers_fini(&pg);
  graph_free(g);
}

/* Zeros around a slice, then a transpose that keeps the channels last:
 * rows of zeros (slot -1) among the copied ones. */
static void test_padding(void) {
  Graph *g = graph_new();
  Shape xs = shape_of(4, 1, 6, 6, 16);
  int src = relu_of_input(g, xs);
  int s = cut(g, (TensorRef){src, 0}, 1, 1, 5);
  int p = pad(g, (TensorRef){s, 0}, (int64_t[]){0, 1, 0, 0, 0, 1, 2, 0}, 0.0);
  int t = transpose(g, (TensorRef){p, 0}, (int64_t[]){0, 2, 1, 3}, 4);
  int out = relu(g, (TensorRef){t, 0});
  graph_add_output(g, (TensorRef){out, 0}, "y", &D);
  PlanGathers pg = gathers_of(g);
  CHECK(pg.n_exits == 1 && pg.role[t] == GATHER_EXIT);
  int zeros = 0;
  for (int64_t i = 0; pg.n_exits == 1 && i < pg.exits[0].n_rows; i++) zeros += pg.exits[0].slot[i] < 0;
  /* [1, 4, 6, 16] padded to [1, 6, 8, 16], transposed: 8 x 6 rows, 4 x 6 of them copied */
  CHECK_MSG(zeros == 6 * 8 - 4 * 6, "%d rows of zeros", zeros);
  plan_agrees(g, "padding");
  plan_gathers_fini(&pg);
  graph_free(g);
}

/* Sources that are no computed values: the graph's input, cut and rolled,
 * concatenated with a constant (the plan's constants' block): one gather
 * reads both. */
static void test_input_and_constant(void) {
  Graph *g = graph_new();
  Shape xs = shape_of(3, 6, 5, 16), cs = shape_of(3, 2, 5, 16);
  int x = graph_add_input(g, "x", &xs, DT_F32, &D);
  int k = graph_add_const(g, "k", random_f32(cs, 3), &D);
  int r = roll(g, (TensorRef){x, 0}, 1, 2);
  int cat = concat(g, (TensorRef[]){{r, 0}, {k, 0}}, 2, 0);
  int t = transpose(g, (TensorRef){cat, 0}, (int64_t[]){1, 0, 2}, 3);
  graph_add_output(g, (TensorRef){relu(g, (TensorRef){t, 0}), 0}, "y", &D);
  PlanGathers pg = gathers_of(g);
  CHECK(pg.n_exits == 1 && pg.role[t] == GATHER_EXIT);
  if (pg.n_exits == 1) CHECK(pg.exits[0].n_sources == 2 && pg.exits[0].row_len == 16);
  plan_gathers_fini(&pg);
  CHECK_EQ_INT(plan_steps(g), 2);
  plan_agrees(g, "an input and a constant");
  graph_free(g);
}

/* What stays as it is. */
static void test_what_stays(void) {
  Shape xs = shape_of(4, 1, 6, 6, 16);
  /* One transpose alone: it is one kernel already. */
  Graph *g = graph_new();
  int src = relu_of_input(g, xs);
  int t = transpose(g, (TensorRef){src, 0}, (int64_t[]){0, 2, 1, 3}, 4);
  graph_add_output(g, (TensorRef){relu(g, (TensorRef){t, 0}), 0}, "y", &D);
  PlanGathers pg = gathers_of(g);
  CHECK(pg.n_exits == 0 && pg.role[t] == GATHER_NONE);
  plan_gathers_fini(&pg);
  graph_free(g);

  /* Rows of one element (the channels moved first): a gather would read
   * a float here and one there. The slice before it is no chain either. */
  g = graph_new();
  src = relu_of_input(g, xs);
  int s = cut(g, (TensorRef){src, 0}, 1, 1, 5);
  t = transpose(g, (TensorRef){s, 0}, (int64_t[]){0, 3, 1, 2}, 4);
  graph_add_output(g, (TensorRef){relu(g, (TensorRef){t, 0}), 0}, "y", &D);
  pg = gathers_of(g);
  CHECK(pg.n_exits == 0 && pg.role[s] == GATHER_NONE && pg.role[t] == GATHER_NONE);
  plan_gathers_fini(&pg);
  plan_agrees(g, "rows of one");
  graph_free(g);

  /* A value of the chain another operator reads: it is written, and the
   * transpose after it is a chain of one kernel. */
  g = graph_new();
  src = relu_of_input(g, xs);
  s = cut(g, (TensorRef){src, 0}, 1, 1, 5);
  t = transpose(g, (TensorRef){s, 0}, (int64_t[]){0, 2, 1, 3}, 4);
  graph_add_output(g, (TensorRef){relu(g, (TensorRef){t, 0}), 0}, "y", &D);
  graph_add_output(g, (TensorRef){relu(g, (TensorRef){s, 0}), 0}, "z", &D);
  pg = gathers_of(g);
  CHECK(pg.n_exits == 0);
  plan_gathers_fini(&pg);
  graph_free(g);

  /* Padding with ones: no element map says it, so the pad is no chain. */
  g = graph_new();
  src = relu_of_input(g, xs);
  s = cut(g, (TensorRef){src, 0}, 1, 1, 5);
  int p = pad(g, (TensorRef){s, 0}, (int64_t[]){0, 1, 0, 0, 0, 1, 0, 0}, 1.0);
  t = transpose(g, (TensorRef){p, 0}, (int64_t[]){0, 2, 1, 3}, 4);
  graph_add_output(g, (TensorRef){relu(g, (TensorRef){t, 0}), 0}, "y", &D);
  pg = gathers_of(g);
  CHECK(pg.role[p] == GATHER_NONE && pg.n_exits == 0);
  plan_gathers_fini(&pg);
  plan_agrees(g, "padding with ones");
  graph_free(g);

  /* A concat of two computed values, in place, with a slice: one kernel,
   * and a gather would copy the computed halves again. */
  g = graph_new();
  src = relu_of_input(g, xs);
  int other = relu(g, (TensorRef){src, 0});
  s = cut(g, (TensorRef){src, 0}, 1, 0, 2);
  int cat = concat(g, (TensorRef[]){{other, 0}, {s, 0}}, 2, 1);
  graph_add_output(g, (TensorRef){relu(g, (TensorRef){cat, 0}), 0}, "y", &D);
  pg = gathers_of(g);
  CHECK(pg.n_exits == 0);
  plan_gathers_fini(&pg);
  plan_agrees(g, "a concat in place");
  graph_free(g);
}

/* Chains drawn at random over rank 3 and 4: cuts and rolls along any axis,
 * zeros around, transposes (the last axis kept or not), reshapes merging
 * the first two axes, a value of the chain also read outside it; the plan
 * on the host against the executor, to the bit. */
static void test_random_chains(void) {
  uint64_t state = 7;
  int exits = 0, inner = 0, zero_rows = 0;
  for (int seed = 0; seed < 300; seed++) {
    Graph *g = graph_new();
    int rank = 3 + seed % 2;
    int64_t d[4];
    for (int i = 0; i < rank; i++) d[i] = 2 + (int64_t)(rng_next(&state) % 4);
    d[rank - 1] = 4 * (1 + (int64_t)(rng_next(&state) % 8)); /* rows of 4 to 32 */
    Shape xs = shape_make(rank, d);
    int x = graph_add_input(g, "x", &xs, DT_F32, &D);
    TensorRef v = {relu(g, (TensorRef){x, 0}), 0};
    int steps = 2 + (int)(rng_next(&state) % 5);
    for (int k = 0; k < steps; k++) {
      const Shape *s = graph_shape(g, v);
      int r = s->ndim, axis = (int)(rng_next(&state) % (uint64_t)r);
      int64_t n = s->d[axis];
      switch (rng_next(&state) % 5) {
      case 0: /* a cut */
        if (n > 1) v = (TensorRef){cut(g, v, axis, 1, n), 0};
        break;
      case 1: /* a roll */
        if (n > 1) v = (TensorRef){roll(g, v, axis, 1 + (int64_t)(rng_next(&state) % (uint64_t)(n - 1))), 0};
        break;
      case 2: { /* zeros around */
        int64_t pads[2 * TEQ_MAX_DIMS] = {0};
        pads[axis] = 1, pads[r + axis] = (int64_t)(rng_next(&state) % 2);
        v = (TensorRef){pad(g, v, pads, 0.0), 0};
        break;
      }
      case 3: { /* a transpose, mostly keeping the last axis */
        int64_t perm[TEQ_MAX_DIMS];
        for (int i = 0; i < r; i++) perm[i] = i;
        int a = (int)(rng_next(&state) % (uint64_t)r), b = (int)(rng_next(&state) % (uint64_t)r);
        if (rng_next(&state) % 4 && (a == r - 1 || b == r - 1)) a = b = 0;
        int64_t tmp = perm[a];
        perm[a] = perm[b], perm[b] = tmp;
        v = (TensorRef){transpose(g, v, perm, r), 0};
        break;
      }
      default: /* the first two axes merged, or split again */
        if (r >= 3) {
          int64_t dims[TEQ_MAX_DIMS];
          dims[0] = s->d[0] * s->d[1];
          for (int i = 2; i < r; i++) dims[i - 1] = s->d[i];
          v = (TensorRef){reshape(g, v, dims, r - 1), 0};
        } else {
          int64_t dims[TEQ_MAX_DIMS] = {1, s->d[0], s->d[1]};
          v = (TensorRef){reshape(g, v, dims, 3), 0};
        }
        break;
      }
      if (k == 1 && rng_next(&state) % 4 == 0) /* read outside the chain too */
        graph_add_output(g, (TensorRef){relu(g, v), 0}, "mid", &D);
    }
    graph_add_output(g, (TensorRef){relu(g, v), 0}, "y", &D);
    CHECK_MSG(graph_check(g, &D) == TEQ_OK, "seed %d: %s", seed, diag_last(&D));
    PlanGathers pg = gathers_of(g);
    exits += pg.n_exits;
    for (int id = 0; id < g->n_nodes; id++) inner += pg.role[id] == GATHER_INNER;
    for (int i = 0; i < pg.n_exits; i++) {
      CHECK(pg.exits[i].row_len >= 16 || pg.exits[i].n_rows == 1);
      for (int64_t j = 0; j < pg.exits[i].n_rows; j++) zero_rows += pg.exits[i].slot[j] < 0;
    }
    plan_gathers_fini(&pg);
    char what[32];
    snprintf(what, sizeof what, "seed %d", seed);
    plan_agrees(g, what);
    graph_free(g);
  }
  printf("%d chains gathered, %d nodes inside them, %d rows of zeros\n", exits, inner, zero_rows);
  CHECK_MSG(exits > 60 && inner > 150 && zero_rows > 100, "%d exits, %d inner, %d zero rows", exits,
            inner, zero_rows);
}

int main(void) {
  diag_init(&D);
  test_shifted_windows();
  test_patch_merging();
  test_padding();
  test_input_and_constant();
  test_what_stays();
  test_random_chains();
  diag_fini(&D);
  return check_exit();
}
