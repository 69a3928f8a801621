/* test_plan.c: the GPU runtime's memory plan (runtime/plan.h), checked on
 * the host by running it: every value gets a content (each element named
 * by the slot and index that computed it; a concat's is its pieces', a
 * view's a run of its input's), the steps write their outputs' contents
 * into a simulated arena in order, and every step's inputs, and the graph's
 * outputs at the end, must read back exactly. Aliases (views, pieces of
 * concats written in place) therefore must point at the right words, and
 * no value may be placed over one still to be read. On a known graph and
 * on 2,000 random ones of element-wise operators, concats of concats,
 * splits, reshapes and extra outputs, at 16-byte and odd alignments. */
#include <stdlib.h>
#include <string.h>

#include "runtime/plan.h"
#include "tests/check.h"

/* Each slot's content: n elements, each the (slot << 32 | index) that
 * computed it. */
typedef struct Contents {
  int64_t **v;
  int64_t *n;
  int n_slots;
} Contents;

static void contents_fini(Contents *c) {
  for (int s = 0; s < c->n_slots; s++) free(c->v[s]);
  free(c->v);
  free(c->n);
}

static Contents contents_of(const Graph *g, const MemPlan *p) {
  Contents c = {calloc((size_t)p->n_slots + 1, sizeof *c.v), calloc((size_t)p->n_slots + 1, sizeof *c.n),
                p->n_slots};
  int32_t *order = malloc(((size_t)g->n_nodes + 1) * sizeof *order);
  CHECK(c.v && c.n && order && graph_topo_order(g, order) == TEQ_OK);
  for (int k = 0; k < g->n_nodes; k++) {
    int id = order[k];
    const Node *n = &g->nodes[id];
    int64_t first[8];
    for (int j = 0; j < n->n_out; j++) {
      int s = p->offset[id] + j;
      c.n[s] = shape_numel(&n->out[j]);
      c.v[s] = malloc(((size_t)c.n[s] + 1) * sizeof **c.v);
    }
    if (n->kind == OP_CONCAT) { /* the pieces' runs, one image after another */
      int axis = (int)param_int(&n->params, 0);
      int64_t outer = 1, at = 0;
      for (int i = 0; i < axis; i++) outer *= n->out[0].d[i];
      for (int64_t i = 0; i < outer; i++)
        for (int j = 0; j < n->n_in; j++) {
          int src = p->offset[n->in[j].node] + n->in[j].out;
          int64_t chunk = c.n[src] / outer;
          memcpy(c.v[p->offset[id]] + at, c.v[src] + i * chunk, (size_t)chunk * sizeof **c.v);
          at += chunk;
        }
    } else if (n->kind != OP_INPUT && n->n_out <= 8 && graph_node_is_view(g, id, first)) {
      int src = p->offset[n->in[0].node] + n->in[0].out;
      for (int j = 0; j < n->n_out; j++)
        memcpy(c.v[p->offset[id] + j], c.v[src] + first[j], (size_t)c.n[p->offset[id] + j] * sizeof **c.v);
    } else {
      for (int j = 0; j < n->n_out; j++) {
        int s = p->offset[id] + j;
        for (int64_t e = 0; e < c.n[s]; e++) c.v[s][e] = (int64_t)s << 32 | e;
      }
    }
  }
  free(order);
  return c;
}

/* Slot s's word in the arena, or -1 where it is not in the arena. */
static int64_t word_of(const MemPlan *p, int s) {
  int r = p->where[s] == MEM_ALIAS ? p->root[s] : s;
  if (p->where[r] != MEM_ARENA) return -1;
  return (p->at[r] + (p->where[s] == MEM_ALIAS ? p->at[s] : 0)) / 4;
}

static bool reads_back(const MemPlan *p, const Contents *c, const int64_t *mem, int s,
                       const char *what) {
  int64_t w = word_of(p, s);
  if (w < 0) return true;
  for (int64_t e = 0; e < c->n[s]; e++)
    if (mem[w + e] != c->v[s][e]) {
      CHECK_MSG(false, "%s: slot %d, element %lld: read %llx, expected %llx", what, s, (long long)e,
                (unsigned long long)mem[w + e], (unsigned long long)c->v[s][e]);
      return false;
    }
  return true;
}

static void write_out(const MemPlan *p, const Contents *c, int64_t *mem, int s) {
  int64_t w = word_of(p, s);
  if (w >= 0) memcpy(mem + w, c->v[s], (size_t)c->n[s] * sizeof *mem);
}

/* Plans g and runs the plan on contents; returns the plan (the caller
 * finis it) or fails the test. */
static bool simulate(const Graph *g, MemPlan *p, const char *what) {
  Diag d;
  diag_init(&d);
  int rc = mem_plan_build(g, p, &d);
  CHECK_MSG(rc == TEQ_OK, "%s: %s", what, diag_last(&d));
  diag_fini(&d);
  if (rc) return false;
  bool ok = true;
  for (int s = 0; s < p->n_slots && ok; s++) {
    int64_t w = word_of(p, s);
    if (w < 0) continue;
    int64_t at = w * 4, bytes = p->bytes[s];
    ok = at % 16 == 0 && at + bytes <= p->arena_bytes;
    CHECK_MSG(ok, "%s: slot %d at byte %lld, %lld bytes, arena %lld", what, s, (long long)at,
              (long long)bytes, (long long)p->arena_bytes);
  }
  Contents c = contents_of(g, p);
  int64_t *mem = malloc(((size_t)p->arena_bytes / 4 + 1) * sizeof *mem);
  CHECK(mem != NULL);
  for (int64_t i = 0; mem && i < p->arena_bytes / 4; i++) mem[i] = -1;
  for (int i = 0; ok && mem && i < p->n_inputs; i++) write_out(p, &c, mem, p->inputs[i]);
  for (int k = 0; ok && mem && k < p->n_steps; k++) {
    const Node *n = &g->nodes[p->steps[k]];
    for (int j = 0; j < n->n_in && ok; j++)
      ok = reads_back(p, &c, mem, p->offset[n->in[j].node] + n->in[j].out, what);
    for (int j = 0; j < n->n_out && ok; j++) write_out(p, &c, mem, p->offset[p->steps[k]] + j);
  }
  for (int i = 0; ok && mem && i < p->n_outputs; i++) ok = reads_back(p, &c, mem, p->outputs[i], what);
  free(mem);
  contents_fini(&c);
  return ok;
}

static Diag D;

static int unary(Graph *g, OpKind k, int x) {
  return graph_add_node(g, k, (TensorRef[]){{x, 0}}, 1, 1, NULL, NULL, &D);
}

static int concat(Graph *g, const int *x, int n) {
  Params p;
  params_default(OP_CONCAT, &p);
  param_set_int(&p, 0, 1);
  TensorRef in[4];
  for (int j = 0; j < n; j++) in[j] = (TensorRef){x[j], 0};
  return graph_add_node(g, OP_CONCAT, in, n, 1, &p, NULL, &D);
}

/* relu and tanh into a concat that is a piece of another, with sigmoid:
 * three steps, and everything the first concat's run of the second. */
static void test_nested(void) {
  Graph *g = graph_new();
  Shape xs = shape_of(4, 1, 8, 6, 6);
  int x = graph_add_input(g, "x", &xs, DT_F32, &D);
  int a = unary(g, OP_RELU, x), b = unary(g, OP_TANH, x), c = unary(g, OP_SIGMOID, x);
  int inner = concat(g, (int[]){a, b}, 2);
  int outer = concat(g, (int[]){inner, c}, 2);
  graph_add_output(g, (TensorRef){outer, 0}, "y", &D);
  MemPlan p;
  if (simulate(g, &p, "nested")) {
    CHECK_EQ_INT(p.n_steps, 3);
    int o = p.offset[outer];
    CHECK(p.where[o] == MEM_ARENA);
    CHECK(p.where[p.offset[inner]] == MEM_ALIAS && p.root[p.offset[inner]] == o && p.at[p.offset[inner]] == 0);
    CHECK(p.where[p.offset[b]] == MEM_ALIAS && p.root[p.offset[b]] == o && p.at[p.offset[b]] == 1152);
    CHECK(p.where[p.offset[c]] == MEM_ALIAS && p.root[p.offset[c]] == o && p.at[p.offset[c]] == 2304);
    CHECK(p.first[o] == 0 && p.last[o] == 3); /* written from the first step, read back at the end */
    mem_plan_fini(&p);
  }
  graph_free(g);
}

/* A small generator, the same graphs on every machine. */
static uint64_t rng_state;
static uint32_t rnd(uint32_t n) {
  rng_state = rng_state * 6364136223846793005u + 1442695040888963407u;
  return (uint32_t)(rng_state >> 33) % n;
}

typedef struct Val {
  int id, channels;
} Val;

/* Values of [1, c, 3, 3]: c channels of 36 bytes, so a piece starts
 * 16-byte aligned only after multiples of 4 channels. */
static Graph *random_graph(uint64_t seed) {
  rng_state = seed * 0x9e3779b97f4a7c15u + 1;
  Graph *g = graph_new();
  Val vals[128];
  int nv = 0;
  Shape xs = shape_of(4, 1, 4, 3, 3);
  vals[nv++] = (Val){graph_add_input(g, "x", &xs, DT_F32, &D), 4};
  int ops = 5 + (int)rnd(25);
  for (int k = 0; k < ops && nv < 120; k++) {
    Val a = vals[rnd((uint32_t)nv)];
    int kind = (int)rnd(7);
    if (kind <= 1) {
      vals[nv++] = (Val){unary(g, kind ? OP_RELU : OP_TANH, a.id), a.channels};
    } else if (kind == 2) {
      Val b = vals[rnd((uint32_t)nv)];
      if (b.channels != a.channels) continue;
      vals[nv++] = (Val){graph_add_node(g, OP_EWADD, (TensorRef[]){{a.id, 0}, {b.id, 0}}, 2, 1, NULL,
                                        NULL, &D), a.channels};
    } else if (kind <= 4) {
      int m = 1 + (int)rnd(3), x[3], ch = 0;
      for (int j = 0; j < m; j++) {
        Val b = vals[rnd((uint32_t)nv)];
        x[j] = b.id, ch += b.channels;
      }
      if (ch > 64) continue;
      vals[nv++] = (Val){concat(g, x, m), ch};
    } else if (kind == 5 && a.channels >= 2) {
      int cut = 1 + (int)rnd((uint32_t)a.channels - 1);
      Params sp;
      params_default(OP_SPLIT, &sp);
      param_set_int(&sp, 0, 1);
      param_set_ints(&sp, 1, (int64_t[]){cut, a.channels - cut}, 2);
      int s = graph_add_node(g, OP_SPLIT, (TensorRef[]){{a.id, 0}}, 1, 2, &sp, NULL, &D);
      vals[nv++] = (Val){unary(g, OP_RELU, s), cut};
      Params rp;
      params_default(OP_RESHAPE, &rp);
      param_set_ints(&rp, 0, (int64_t[]){1, a.channels - cut, 3, 3}, 4);
      vals[nv++] = (Val){graph_add_node(g, OP_RESHAPE, (TensorRef[]){{s, 1}}, 1, 1, &rp, NULL, &D),
                         a.channels - cut};
    } else {
      Params rp;
      params_default(OP_RESHAPE, &rp);
      param_set_ints(&rp, 0, (int64_t[]){1, a.channels, 3, 3}, 4);
      vals[nv++] = (Val){graph_add_node(g, OP_RESHAPE, (TensorRef[]){{a.id, 0}}, 1, 1, &rp, NULL, &D),
                         a.channels};
    }
  }
  graph_add_output(g, (TensorRef){vals[nv - 1].id, 0}, "y", &D);
  for (int k = (int)rnd(3); k > 0; k--) graph_add_output(g, (TensorRef){vals[rnd((uint32_t)nv)].id, 0}, NULL, &D);
  return g;
}

static void test_random(void) {
  int planned = 0, pieces = 0, views = 0;
  for (uint64_t seed = 0; seed < 2000; seed++) {
    Graph *g = random_graph(seed);
    CHECK_MSG(graph_check(g, &D) == TEQ_OK, "seed %llu: %s", (unsigned long long)seed, diag_last(&D));
    char what[32];
    snprintf(what, sizeof what, "seed %llu", (unsigned long long)seed);
    MemPlan p;
    if (simulate(g, &p, what)) {
      planned++;
      for (int s = 0; s < p.n_slots; s++) {
        if (p.where[s] != MEM_ALIAS) continue;
        bool piece = false;
        for (int id = 0; id < g->n_nodes && !piece; id++)
          piece = p.offset[id] == s && !graph_node_is_view(g, id, NULL);
        pieces += piece, views += !piece;
      }
      mem_plan_fini(&p);
    }
    graph_free(g);
  }
  CHECK_EQ_INT(planned, 2000);
  /* Both kinds of alias occur often enough to have been tested. */
  CHECK_MSG(pieces > 200 && views > 1000, "%d pieces and %d views aliased", pieces, views);
}

int main(void) {
  diag_init(&D);
  test_nested();
  test_random();
  diag_fini(&D);
  return check_exit();
}
