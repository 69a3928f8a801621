/* exec.c: the CPU executors (float32 and Z_p) over the registry's kernels.
 * One pass in topological order over the nodes the graph outputs need; each
 * value is reference-counted by its remaining uses and freed after the last,
 * so memory follows the live set. Kernels themselves live with their rows
 * in runtime/ops/; this file only feeds them and keeps the books. At the
 * end, the GPU's memory plan run on the host with the same kernels. */
#include "runtime/exec.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda.h"
#include "runtime/modp.h"
#include "runtime/plan.h"

Tensor *exec_f32_to_modp(const Tensor *t, Diag *d) {
  Tensor *r = tensor_new(DT_MODP, &t->shape);
  if (!r) {
    diag_error(d, "out of memory converting a constant to Z_p");
    return NULL;
  }
  const float *src = t->data;
  uint32_t *dst = r->data;
  int64_t n = tensor_numel(t);
  for (int64_t i = 0; i < n; i++) {
    double x = src[i];
    if (x != floor(x) || fabs(x) >= 9007199254740992.0) {
      diag_error(d, "constant value %g (element %lld) is not an integer: cannot evaluate in Z_p",
                 x, (long long)i);
      tensor_unref(r);
      return NULL;
    }
    dst[i] = modp_from_int((int64_t)x);
  }
  return r;
}

typedef struct Run {
  const Graph *g;
  ExecMode mode;
  int32_t *order;    /* topological order */
  int32_t *offset;   /* value slot of node i's output j: offset[i] + j */
  int32_t *uses;     /* remaining uses of each value slot */
  unsigned char *needed;
  Tensor **values;
  int32_t *input_index; /* node id -> position in g->inputs, or -1 */
} Run;

static void run_fini(Run *r) {
  if (r->values)
    for (int i = 0; i < r->offset[r->g->n_nodes]; i++) tensor_unref(r->values[i]);
  free(r->order);
  free(r->offset);
  free(r->uses);
  free(r->needed);
  free(r->values);
  free(r->input_index);
}

/* Marks the nodes the graph outputs depend on. */
static void mark_needed(Run *r) {
  const Graph *g = r->g;
  for (int i = 0; i < g->n_outputs; i++) r->needed[g->outputs[i].node] = 1;
  for (int k = g->n_nodes - 1; k >= 0; k--) {
    const Node *n = &g->nodes[r->order[k]];
    if (!r->needed[r->order[k]]) continue;
    for (int j = 0; j < n->n_in; j++) r->needed[n->in[j].node] = 1;
  }
}

static int run_init(Run *r, const Graph *g, ExecMode mode, Diag *d) {
  memset(r, 0, sizeof *r);
  r->g = g;
  r->mode = mode;
  size_t n = (size_t)g->n_nodes + 1;
  r->order = malloc(n * sizeof *r->order);
  r->needed = calloc(n, 1);
  r->input_index = malloc(n * sizeof *r->input_index);
  r->uses = graph_use_counts(g, &r->offset);
  if (!r->order || !r->needed || !r->input_index || !r->uses) return TEQ_ERR_NOMEM;
  r->values = calloc((size_t)r->offset[g->n_nodes] + 1, sizeof *r->values);
  if (!r->values) return TEQ_ERR_NOMEM;
  if (graph_topo_order(g, r->order) != TEQ_OK) return diag_error(d, "graph has a cycle");
  for (int i = 0; i < g->n_nodes; i++) r->input_index[i] = -1;
  for (int i = 0; i < g->n_inputs; i++) r->input_index[g->inputs[i]] = i;
  mark_needed(r);
  return TEQ_OK;
}


static int feed_input(Run *r, int id, Tensor *const *inputs, Diag *d) {
  const Node *n = &r->g->nodes[id];
  Tensor *t = inputs[r->input_index[id]];
  DType want = n->dtype == DT_I64 ? DT_I64 : r->mode == EXEC_F32 ? DT_F32 : DT_MODP;
  char a[SHAPE_STR_MAX], b[SHAPE_STR_MAX];
  const char *name = n->name ? n->name : "?";
  if (!t) return diag_error(d, "input '%s': no value given", name);
  if (!shape_equal(&t->shape, &n->out[0]) || t->dtype != want)
    return diag_error(d, "input '%s': expected %s %s, got %s %s", name, dtype_name(want),
                      shape_format(&n->out[0], a, sizeof a), dtype_name(t->dtype),
                      shape_format(&t->shape, b, sizeof b));
  r->values[r->offset[id]] = tensor_ref(t);
  return TEQ_OK;
}

static int feed_const(Run *r, int id, Diag *d) {
  const Node *n = &r->g->nodes[id];
  Tensor *v = n->value;
  if (r->mode == EXEC_MODP && v->dtype == DT_F32) {
    Tensor *m = exec_f32_to_modp(v, d);
    char label[GRAPH_LABEL_MAX];
    if (!m)
      return diag_error(d, "constant %s",
                        graph_node_label(r->g, (int)(n - r->g->nodes), label, sizeof label));
    r->values[r->offset[id]] = m;
  } else {
    r->values[r->offset[id]] = tensor_ref(v);
  }
  return TEQ_OK;
}

/* Drops this node's claim on each of its inputs. */
static void release_inputs(Run *r, const Node *n) {
  for (int j = 0; j < n->n_in; j++) {
    int slot = r->offset[n->in[j].node] + n->in[j].out;
    if (--r->uses[slot] == 0) {
      tensor_unref(r->values[slot]);
      r->values[slot] = NULL;
    }
  }
}

static int compute_node(Run *r, int id, Diag *d) {
  const Node *n = &r->g->nodes[id];
  const OpDef *o = op_def(n->kind);
  int (*kernel)(const Node *, Tensor *const *, Tensor *const *, Diag *) =
      r->mode == EXEC_F32 ? o->eval_f32 : o->eval_modp;
  char label[GRAPH_LABEL_MAX];
  graph_node_label(r->g, (int)(n - r->g->nodes), label, sizeof label);
  if (!kernel)
    return diag_error(d, "node %s: %s cannot be run by the CPU executor", label,
                      n->opaque ? "an opaque operator" : "the operator");
  Tensor *in_stack[8], **in = n->n_in <= 8 ? in_stack : malloc((size_t)n->n_in * sizeof *in);
  Tensor **out = r->values + r->offset[id];
  if (!in) return TEQ_ERR_NOMEM;
  DType dt = n->dtype == DT_I64 ? DT_I64 : r->mode == EXEC_F32 ? DT_F32 : DT_MODP;
  int rc = TEQ_OK;
  for (int j = 0; j < n->n_in; j++) in[j] = r->values[r->offset[n->in[j].node] + n->in[j].out];
  for (int j = 0; j < n->n_out && !rc; j++) {
    /* Float32 kernels write every element, so their outputs skip the
     * zero fill (a memset of every activation on every run); Z_p outputs
     * stay zeroed, exactness over speed. */
    out[j] = dt == DT_F32 ? tensor_new_uninit(dt, &n->out[j]) : tensor_new(dt, &n->out[j]);
    if (!out[j]) rc = diag_error(d, "node %s: cannot allocate output %d", label, j);
  }
  if (!rc && (rc = kernel(n, in, out, d)))
    diag_error(d, "node %s failed", label);
  if (in != in_stack) free(in);
  return rc;
}

int exec_run(const Graph *g, ExecMode mode, Tensor *const *inputs, Tensor **outputs, Diag *d) {
  Run r;
  int rc = run_init(&r, g, mode, d);
  for (int k = 0; k < g->n_nodes && !rc; k++) {
    int id = r.order[k];
    const Node *n = &g->nodes[id];
    if (!r.needed[id]) continue;
    if (n->kind == OP_INPUT) rc = feed_input(&r, id, inputs, d);
    else if (n->kind == OP_CONST) rc = feed_const(&r, id, d);
    else rc = compute_node(&r, id, d);
    if (!rc) release_inputs(&r, n);
  }
  if (!rc)
    for (int i = 0; i < g->n_outputs; i++)
      outputs[i] = tensor_ref(r.values[r.offset[g->outputs[i].node] + g->outputs[i].out]);
  run_fini(&r);
  return rc;
}

/* ---- two graphs compared by evaluation ---- */

static bool elements_differ(const Tensor *x, const Tensor *y, int64_t e, double tol) {
  if (x->dtype == DT_MODP) return ((const uint32_t *)x->data)[e] != ((const uint32_t *)y->data)[e];
  double a = ((const float *)x->data)[e], b = ((const float *)y->data)[e];
  double scale = fmax(1.0, fmax(fabs(a), fabs(b)));
  return !(fabs(a - b) <= tol * scale); /* NaN on either side differs */
}

/* One kept input: what it was drawn for, and the longest draw made for it.
 * Element e of a draw depends on e alone (tensor_fill_random), so an input
 * of any shape is the first elements of the longest draw of its mode,
 * seed, draw and position, seen in its shape: one tensor per position, not
 * one per position and shape (NasRNN's checks meet [512, 512], [512, 1024],
 * ..., [4096, 512] at each position: a copy per shape was 59 of the 100
 * MB of fresh pages its search took, and 17 of those go). */
typedef struct KeptInput {
  ExecMode mode;
  uint64_t seed;
  int draw, index;
  Tensor *t;
} KeptInput;

struct ExecInputs {
  KeptInput *v; /* oldest first */
  int n, cap;
  size_t bytes, max_bytes;
};

ExecInputs *exec_inputs_new(size_t max_bytes) {
  ExecInputs *k = calloc(1, sizeof *k);
  if (k) k->max_bytes = max_bytes;
  return k;
}

void exec_inputs_free(ExecInputs *k) {
  if (!k) return;
  for (int i = 0; i < k->n; i++) tensor_unref(k->v[i].t);
  free(k->v);
  free(k);
}

static void kept_drop(ExecInputs *k, int j) {
  k->bytes -= tensor_bytes(k->v[j].t);
  tensor_unref(k->v[j].t);
  memmove(k->v + j, k->v + j + 1, (size_t)(--k->n - j) * sizeof *k->v);
}

/* Input i of exec_compare's draw, of shape sh: a new reference, or NULL
 * (out of memory). */
static Tensor *random_input(ExecInputs *k, ExecMode mode, uint64_t seed, int draw, int i,
                            const Shape *sh) {
  for (int j = 0; k && j < k->n; j++) {
    const KeptInput *e = &k->v[j];
    if (e->mode != mode || e->seed != seed || e->draw != draw || e->index != i) continue;
    if (shape_equal(&e->t->shape, sh)) return tensor_ref(e->t);
    if (shape_numel(sh) <= tensor_numel(e->t)) return tensor_view(e->t, sh);
    kept_drop(k, j); /* too short: the longer draw below takes its place */
    break;
  }
  Tensor *t = tensor_new_uninit(mode == EXEC_F32 ? DT_F32 : DT_MODP, sh); /* filled below */
  if (!t) return NULL;
  tensor_fill_random(t, hash_mix(hash_mix(seed, (uint64_t)draw), (uint64_t)i));
  if (mode == EXEC_F32) {
    bool negative = (draw >> (i % 2)) & 1;
    float *x = t->data;
    int64_t numel = tensor_numel(t);
    for (int64_t e = 0; e < numel; e++) x[e] = negative ? -fabsf(x[e]) : fabsf(x[e]);
  }
  size_t bytes = tensor_bytes(t);
  if (!k || bytes > k->max_bytes) return t;
  while (k->n > 0 && k->bytes + bytes > k->max_bytes) kept_drop(k, 0); /* the oldest go */
  if (k->n == k->cap) {
    int cap = k->cap ? 2 * k->cap : 16;
    KeptInput *v = realloc(k->v, (size_t)cap * sizeof *v);
    if (!v) return t; /* not kept, still made */
    k->v = v, k->cap = cap;
  }
  k->v[k->n++] = (KeptInput){mode, seed, draw, i, tensor_ref(t)};
  k->bytes += bytes;
  return t;
}

int exec_compare(const Graph *a, const Graph *b, ExecMode mode, uint64_t seed, int draw,
                 double tol, ExecDiff *diff, Diag *d) {
  return exec_compare_kept(a, b, mode, seed, draw, tol, NULL, diff, d);
}

int exec_compare_kept(const Graph *a, const Graph *b, ExecMode mode, uint64_t seed, int draw,
                      double tol, ExecInputs *kept, ExecDiff *diff, Diag *d) {
  memset(diff, 0, sizeof *diff);
  diff->output = diff->element = -1;
  int n_in = a->n_inputs, n_out = a->n_outputs;
  if (b->n_inputs != n_in || b->n_outputs != n_out)
    return diag_error(d, "exec_compare: the graphs have different inputs or outputs");
  Tensor **in = calloc((size_t)n_in + 1, sizeof *in);
  Tensor **ya = calloc((size_t)n_out + 1, sizeof *ya), **yb = calloc((size_t)n_out + 1, sizeof *yb);
  int rc = in && ya && yb ? TEQ_OK : TEQ_ERR_NOMEM;
  for (int i = 0; !rc && i < n_in; i++) {
    const Shape *sh = graph_shape(a, (TensorRef){a->inputs[i], 0});
    if (!shape_equal(sh, graph_shape(b, (TensorRef){b->inputs[i], 0}))) {
      rc = diag_error(d, "exec_compare: input %d has different shapes", i);
      break;
    }
    if (!(in[i] = random_input(kept, mode, seed, draw, i, sh))) {
      rc = TEQ_ERR_NOMEM;
      break;
    }
  }
  if (!rc) rc = exec_run(a, mode, in, ya, d);
  if (!rc) rc = exec_run(b, mode, in, yb, d);
  for (int o = 0; !rc && o < n_out && !diff->differ; o++) {
    if (!shape_equal(&ya[o]->shape, &yb[o]->shape)) {
      diff->differ = true;
    } else {
      int64_t numel = tensor_numel(ya[o]);
      for (int64_t e = 0; e < numel; e++)
        if (elements_differ(ya[o], yb[o], e, tol)) {
          if (!diff->differ) diff->element = e;
          diff->differ = true;
          diff->count++;
        }
    }
    if (diff->differ) {
      diff->output = o;
      diff->a = tensor_ref(ya[o]);
      diff->b = tensor_ref(yb[o]);
    }
  }
  for (int o = 0; ya && yb && o < n_out; o++) tensor_unref(ya[o]), tensor_unref(yb[o]);
  for (int i = 0; in && i < n_in; i++) tensor_unref(in[i]);
  free(in), free(ya), free(yb);
  return rc;
}

void exec_diff_fini(ExecDiff *diff) {
  tensor_unref(diff->a);
  tensor_unref(diff->b);
  diff->a = diff->b = NULL;
}

double exec_relative_error(const Tensor *got, const Tensor *want) {
  if (!shape_equal(&got->shape, &want->shape) || got->dtype != want->dtype) return INFINITY;
  int64_t n = tensor_numel(want);
  if (want->dtype != DT_F32) /* indices and residues have no rounding */
    return memcmp(got->data, want->data, tensor_bytes(want)) ? INFINITY : 0.0;
  const float *g = got->data, *w = want->data;
  double scale = 0, err = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(w[i]) || isnan(g[i]) || isinf(w[i]) || isinf(g[i])) {
      bool same = (isnan(w[i]) && isnan(g[i])) || w[i] == g[i];
      if (!same) return INFINITY;
      continue;
    }
    scale = fmax(scale, fabs(w[i]));
    err = fmax(err, fabs((double)g[i] - w[i]));
  }
  return scale > 0 ? err / scale : err;
}

/* ---- a few positions of the outputs, in Z_p ---- */

/* What a plan does with each node the outputs need. */
enum { P_SKIP, P_WHOLE, P_FOLLOW, P_POINT };

typedef struct PointNode {
  int32_t id;
  int64_t *pos, n, cap; /* the distinct positions asked of it, sorted */
} PointNode;

/* Where one chosen position's value comes from: value slot `slot` at
 * `flat`; SRC_ZERO (a padding element); or point node -2 - slot. */
enum { SRC_ZERO = -1 };
typedef struct PointSrc {
  int32_t slot;
  int64_t flat;
} PointSrc;

struct ExecPoints {
  const Graph *g;
  int32_t *order, *offset, *input_index;
  unsigned char *state;   /* P_* per node */
  int32_t *claims;        /* per value slot: the nodes run whole or at positions that read it */
  unsigned char *pinned;  /* per value slot: read by a chosen position, kept to the end */
  PointNode *pt;
  int n_pt;
  int64_t *n_pos;         /* per output */
  PointSrc **src;         /* per output, per chosen position */
};

void exec_points_free(ExecPoints *p) {
  if (!p) return;
  for (int k = 0; k < p->n_pt; k++) free(p->pt[k].pos);
  for (int j = 0; p->src && j < p->g->n_outputs; j++) free(p->src[j]);
  free(p->order), free(p->offset), free(p->input_index), free(p->state), free(p->claims);
  free(p->pinned), free(p->pt), free(p->n_pos), free(p->src);
  free(p);
}

void exec_points_counts(const ExecPoints *p, int *at_positions, int *followed) {
  *at_positions = *followed = 0;
  for (int i = 0; i < p->g->n_nodes; i++) {
    *at_positions += p->state[i] == P_POINT;
    *followed += p->state[i] == P_FOLLOW;
  }
}

/* A layout operator the plan may try to follow instead of running: its
 * inputs are residues (not int64 indices), and their element numbers,
 * counted across all inputs from 2, stay below p. */
static bool followable(const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  const OpDef *o = op_def(n->kind);
  if (!(o->flags & OPF_LAYOUT_ONLY) || (o->flags & OPF_SOURCE) || !o->eval_modp ||
      n->dtype == DT_I64)
    return false;
  int64_t total = 0;
  for (int j = 0; j < n->n_in; j++) {
    if (g->nodes[n->in[j].node].dtype == DT_I64) return false;
    total += shape_numel(graph_shape(g, n->in[j]));
  }
  return total < (int64_t)MODP_P - 2;
}

/* Runs node id's kernel on its inputs' element numbers: element e of input
 * j is base[j] + e + first. */
static int run_on_numbers(const Graph *g, int id, const int64_t *base, uint32_t first,
                          Tensor **out, Diag *d) {
  const Node *n = &g->nodes[id];
  Tensor *in_stack[8], **in = n->n_in <= 8 ? in_stack : calloc((size_t)n->n_in, sizeof *in);
  if (!in) return TEQ_ERR_NOMEM;
  int rc = TEQ_OK, made = 0;
  for (; made < n->n_in && !rc; made++) {
    if (!(in[made] = tensor_new_uninit(DT_MODP, graph_shape(g, n->in[made])))) {
      rc = TEQ_ERR_NOMEM;
      break;
    }
    uint32_t *x = in[made]->data;
    for (int64_t e = 0; e < base[made + 1] - base[made]; e++)
      x[e] = (uint32_t)(base[made] + e) + first;
  }
  for (int k = 0; k < n->n_out && !rc; k++)
    if (!(out[k] = tensor_new(DT_MODP, &n->out[k]))) rc = TEQ_ERR_NOMEM;
  if (!rc && (rc = op_def(n->kind)->eval_modp(n, in, out, d))) {
    char label[GRAPH_LABEL_MAX];
    diag_error(d, "node %s failed on element numbers", graph_node_label(g, id, label, sizeof label));
  }
  for (int j = 0; j < made; j++) tensor_unref(in[j]);
  if (in != in_stack) free(in);
  return rc;
}

/* The element-number maps of layout node id: maps[k][f] is 0 where output
 * k holds a zero it made (padding), else base[j] + e + 1 for element e of
 * input j. The kernel runs on numbers from 1 and again from 2: an element
 * moved reads one more the second time, a zero stays zero, and anything
 * else (a pad of a constant other than zero) makes the node one that is
 * not followed: 0 then, 1 when the maps hold. */
static int compute_maps(const Graph *g, int id, int64_t *base, Tensor **maps, Diag *d) {
  const Node *n = &g->nodes[id];
  Tensor *again_stack[8] = {0},
         **again = n->n_out <= 8 ? again_stack : calloc((size_t)n->n_out, sizeof *again);
  if (!again) return TEQ_ERR_NOMEM;
  base[0] = 0;
  for (int j = 0; j < n->n_in; j++) base[j + 1] = base[j] + shape_numel(graph_shape(g, n->in[j]));
  int rc = run_on_numbers(g, id, base, 1, maps, d);
  if (!rc) rc = run_on_numbers(g, id, base, 2, again, d);
  bool moved_only = true;
  for (int k = 0; k < n->n_out && !rc && moved_only; k++) {
    const uint32_t *a = maps[k]->data, *b = again[k]->data;
    int64_t numel = shape_numel(&n->out[k]); /* once: a call the loop cannot hoist */
    for (int64_t f = 0; f < numel && moved_only; f++)
      moved_only = a[f] == 0 ? b[f] == 0 : b[f] == a[f] + 1 && (int64_t)a[f] <= base[n->n_in];
  }
  for (int k = 0; k < n->n_out; k++) tensor_unref(again[k]);
  if (again != again_stack) free(again);
  return rc ? rc : moved_only;
}

/* Maps by node configuration (kind, parameters, input shapes), for the
 * whole process: PET's tests plan one mutant after another over the same
 * layouts (the same transpose of the same tensor), and each map costs two
 * runs of its kernel over the whole tensor; on VGG-19's first layers that
 * was most of PET's time. The maps are read only, shared by reference
 * (tensor references are atomic), and kept up to a bound on their size. */
enum { MAP_CACHE_SLOTS = 256 };
#define MAP_CACHE_MAX_ELEMENTS ((int64_t)64 << 20) /* 256 MB of uint32 */

typedef struct MapEntry {
  uint64_t key;
  OpKind kind;
  Params params;
  int n_in, n_out;
  Shape in[8];
  int verdict;   /* follow_maps' verdict: 1 the maps hold, 0 not followed */
  Tensor **maps; /* n_out of them */
} MapEntry;

static struct {
  pthread_mutex_t lock;
  MapEntry slot[MAP_CACHE_SLOTS];
  int64_t elements;
} map_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static uint64_t map_key(const Graph *g, const Node *n) {
  uint64_t h = hash_mix(0x6d617073, (uint64_t)n->kind);
  h = params_hash(h, &n->params);
  for (int j = 0; j < n->n_in; j++) {
    const Shape *s = graph_shape(g, n->in[j]);
    h = hash_bytes(hash_mix(h, (uint64_t)s->ndim), s->d, (size_t)s->ndim * sizeof s->d[0]);
  }
  return hash_mix(h, (uint64_t)n->n_out);
}

static bool map_entry_is(const MapEntry *e, uint64_t key, const Graph *g, const Node *n) {
  if (!e->maps || e->key != key || e->kind != n->kind || e->n_in != n->n_in ||
      e->n_out != n->n_out || memcmp(&e->params, &n->params, sizeof e->params))
    return false;
  for (int j = 0; j < n->n_in; j++)
    if (!shape_equal(&e->in[j], graph_shape(g, n->in[j]))) return false;
  return true;
}

/* compute_maps, or its answer for a node of the same configuration. The
 * lock is held while a map is computed: PET's test threads plan mutants of
 * one subprogram side by side, and would otherwise all compute the same
 * maps at once. */
static int follow_maps(const Graph *g, int id, int64_t *base, Tensor **maps, Diag *d) {
  const Node *n = &g->nodes[id];
  if (n->n_in > 8) return compute_maps(g, id, base, maps, d);
  uint64_t key = map_key(g, n);
  MapEntry *e = &map_cache.slot[key % MAP_CACHE_SLOTS];
  pthread_mutex_lock(&map_cache.lock);
  if (map_entry_is(e, key, g, n)) {
    for (int k = 0; k < n->n_out; k++) maps[k] = tensor_ref(e->maps[k]);
    int verdict = e->verdict;
    pthread_mutex_unlock(&map_cache.lock);
    base[0] = 0;
    for (int j = 0; j < n->n_in; j++) base[j + 1] = base[j] + shape_numel(graph_shape(g, n->in[j]));
    return verdict;
  }
  int rc = compute_maps(g, id, base, maps, d);
  int64_t elements = 0;
  for (int k = 0; k < n->n_out; k++) elements += shape_numel(&n->out[k]);
  Tensor **kept = rc < 0 ? NULL : calloc((size_t)n->n_out + 1, sizeof *kept);
  Tensor **dropped = NULL;
  int n_dropped = 0;
  if (kept) {
    for (int k = 0; k < n->n_out; k++) kept[k] = tensor_ref(maps[k]);
    if (e->maps) { /* the slot's last tenant leaves */
      dropped = e->maps, n_dropped = e->n_out;
      for (int k = 0; k < e->n_out; k++) map_cache.elements -= shape_numel(&e->maps[k]->shape);
      e->maps = NULL;
    }
    if (map_cache.elements + elements <= MAP_CACHE_MAX_ELEMENTS) {
      e->key = key, e->kind = n->kind, e->params = n->params;
      e->n_in = n->n_in, e->n_out = n->n_out, e->verdict = rc;
      for (int j = 0; j < n->n_in; j++) e->in[j] = *graph_shape(g, n->in[j]);
      e->maps = kept, kept = NULL;
      map_cache.elements += elements;
    }
  }
  pthread_mutex_unlock(&map_cache.lock);
  for (int k = 0; k < n_dropped; k++) tensor_unref(dropped[k]);
  free(dropped);
  for (int k = 0; kept && k < n->n_out; k++) tensor_unref(kept[k]);
  free(kept);
  return rc;
}

int exec_layout_maps(const Graph *g, int id, int64_t *base, Tensor **maps, Diag *d) {
  const Node *n = &g->nodes[id];
  for (int k = 0; k < n->n_out; k++) maps[k] = NULL;
  if (!followable(g, id)) return 0;
  int rc = follow_maps(g, id, base, maps, d);
  if (rc != 1)
    for (int k = 0; k < n->n_out; k++) tensor_unref(maps[k]), maps[k] = NULL;
  return rc;
}

/* Whether node id is a view (graph_node_is_view: every output a run of
 * input 0's elements in their order, a reshape or a split along the outer
 * axis): then it is followed without maps, and *first is its n_out
 * starts. Maps of a reshape would be two kernel runs over the whole
 * tensor and as many megabytes of fresh memory, all to say that element f
 * is element f. Out of memory, it is no view here: the maps say the same. */
static bool view_starts(const Graph *g, int id, int64_t **first) {
  int64_t *at = malloc(((size_t)g->nodes[id].n_out + 1) * sizeof *at);
  if (at && graph_node_is_view(g, id, at)) {
    *first = at;
    return true;
  }
  free(at);
  return false;
}

/* Which nodes run whole, which at positions, which are followed (as
 * views, by source_of, or with their maps). A node is left unrun only if
 * nothing that runs whole reads it; a point node reads its inputs whole.
 * A followed node with no point node above it runs whole: following it
 * would save nothing. */
static int plan_states(ExecPoints *p, const unsigned char *needed, Tensor ***maps, int64_t **base,
                       Diag *d) {
  const Graph *g = p->g;
  unsigned char *read_whole = calloc((size_t)g->n_nodes + 1, 1);
  unsigned char *may_reach = calloc((size_t)g->n_nodes + 1, 1);
  if (!read_whole || !may_reach) {
    free(read_whole), free(may_reach);
    return TEQ_ERR_NOMEM;
  }
  /* may_reach: a node that could be run at positions, or a layout over
   * one; a layout over none is never worth its maps */
  for (int k = 0; k < g->n_nodes; k++) {
    int id = p->order[k];
    const Node *n = &g->nodes[id];
    if (op_def(n->kind)->eval_modp_at) may_reach[id] = 1;
    else if (followable(g, id))
      for (int j = 0; j < n->n_in; j++) may_reach[id] |= may_reach[n->in[j].node];
  }
  int rc = TEQ_OK;
  for (int k = g->n_nodes - 1; k >= 0 && !rc; k--) {
    int id = p->order[k];
    const Node *n = &g->nodes[id];
    const OpDef *o = op_def(n->kind);
    if (!needed[id]) continue;
    bool lazy = !read_whole[id] && !(o->flags & OPF_SOURCE);
    p->state[id] = P_WHOLE;
    if (lazy && o->eval_modp_at && n->n_out == 1 && n->dtype != DT_I64) {
      p->state[id] = P_POINT;
    } else if (lazy && may_reach[id] && view_starts(g, id, &base[id])) {
      p->state[id] = P_FOLLOW;
    } else if (lazy && may_reach[id] && o->source_of && n->n_out == 1 && n->n_in <= 8) {
      p->state[id] = P_FOLLOW; /* neither maps nor base: asked position by position */
    } else if (lazy && may_reach[id]) {
      maps[id] = calloc((size_t)n->n_out + 1, sizeof *maps[id]);
      base[id] = malloc(((size_t)n->n_in + 1) * sizeof *base[id]);
      rc = maps[id] && base[id] ? follow_maps(g, id, base[id], maps[id], d) : TEQ_ERR_NOMEM;
      if (rc == 1) p->state[id] = P_FOLLOW;
      if (rc >= 0) rc = TEQ_OK;
    }
    if (p->state[id] != P_FOLLOW)
      for (int j = 0; j < n->n_in; j++) read_whole[n->in[j].node] = 1;
  }
  free(read_whole), free(may_reach);
  /* forward: only followed nodes with a point node above them stay followed */
  for (int k = 0; k < g->n_nodes && !rc; k++) {
    int id = p->order[k];
    const Node *n = &g->nodes[id];
    if (p->state[id] != P_FOLLOW) continue;
    bool above = false;
    for (int j = 0; j < n->n_in; j++) {
      int s = p->state[n->in[j].node];
      above = above || s == P_POINT || s == P_FOLLOW;
    }
    if (!above) p->state[id] = P_WHOLE;
  }
  return rc;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static int64_t find_pos(const PointNode *pn, int64_t f) {
  int64_t lo = 0, hi = pn->n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (pn->pos[mid] < f) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Traces each chosen position down through followed nodes to a value
 * slot, a padding zero or a point node, which collects it. */
static int plan_sources(ExecPoints *p, Tensor ***maps, int64_t **base, int32_t *point_of,
                        const int64_t *const *positions, Diag *d) {
  const Graph *g = p->g;
  for (int j = 0; j < g->n_outputs; j++) {
    const Shape *os = graph_shape(g, g->outputs[j]);
    if (!(p->src[j] = malloc(((size_t)p->n_pos[j] + 1) * sizeof *p->src[j]))) return TEQ_ERR_NOMEM;
    for (int64_t q = 0; q < p->n_pos[j]; q++) {
      int64_t f = positions[j][q];
      if (f < 0 || f >= shape_numel(os))
        return diag_error(d, "exec_points: position %lld of output %d is out of range",
                          (long long)f, j);
      TensorRef r = g->outputs[j];
      PointSrc *s = &p->src[j][q];
      for (;;) {
        int st = p->state[r.node];
        if (st == P_WHOLE) {
          *s = (PointSrc){p->offset[r.node] + r.out, f};
          break;
        }
        if (st == P_POINT) {
          PointNode *pn = &p->pt[point_of[r.node]];
          if (pn->n == pn->cap) {
            int64_t cap = pn->cap ? 2 * pn->cap : 64, *a = realloc(pn->pos, (size_t)cap * sizeof *a);
            if (!a) return TEQ_ERR_NOMEM;
            pn->pos = a, pn->cap = cap;
          }
          pn->pos[pn->n++] = f;
          *s = (PointSrc){-2 - point_of[r.node], f};
          break;
        }
        const Node *fn = &g->nodes[r.node];
        if (!maps[r.node] && base[r.node]) { /* P_FOLLOW, a view */
          f += base[r.node][r.out];
          r = fn->in[0];
          continue;
        }
        if (!maps[r.node]) { /* P_FOLLOW, by the operator's source_of */
          Shape in[8];
          int j = 0;
          for (int k = 0; k < fn->n_in && k < 8; k++) in[k] = *graph_shape(g, fn->in[k]);
          f = op_def(fn->kind)->source_of(fn, in, f, &j);
          if (f < 0) {
            *s = (PointSrc){SRC_ZERO, 0};
            break;
          }
          r = fn->in[j];
          continue;
        }
        uint32_t v = ((const uint32_t *)maps[r.node][r.out]->data)[f]; /* P_FOLLOW */
        if (v == 0) {
          *s = (PointSrc){SRC_ZERO, 0};
          break;
        }
        const Node *n = &g->nodes[r.node];
        int in = 0;
        while (in + 1 < n->n_in && (int64_t)v > base[r.node][in + 1]) in++;
        f = (int64_t)v - 1 - base[r.node][in];
        r = n->in[in];
      }
    }
  }
  return TEQ_OK;
}

int exec_points_new(const Graph *g, const int64_t *const *positions, const int64_t *n_positions,
                    ExecPoints **out, Diag *d) {
  *out = NULL;
  ExecPoints *p = calloc(1, sizeof *p);
  if (!p) return TEQ_ERR_NOMEM;
  p->g = g;
  size_t n = (size_t)g->n_nodes + 1;
  int32_t *uses = graph_use_counts(g, &p->offset); /* only the slots' offsets are wanted */
  bool have_offsets = uses != NULL;
  free(uses);
  p->order = malloc(n * sizeof *p->order);
  p->input_index = malloc(n * sizeof *p->input_index);
  p->state = calloc(n, 1);
  p->n_pos = calloc((size_t)g->n_outputs + 1, sizeof *p->n_pos);
  p->src = calloc((size_t)g->n_outputs + 1, sizeof *p->src);
  unsigned char *needed = calloc(n, 1);
  int32_t *point_of = malloc(n * sizeof *point_of);
  Tensor ***maps = calloc(n, sizeof *maps);
  int64_t **base = calloc(n, sizeof *base);
  int rc = have_offsets && p->order && p->input_index && p->state && p->n_pos && p->src && needed &&
                   point_of && maps && base
               ? TEQ_OK
               : TEQ_ERR_NOMEM;
  if (!rc && graph_topo_order(g, p->order) != TEQ_OK) rc = diag_error(d, "graph has a cycle");
  if (!rc) {
    p->claims = calloc((size_t)p->offset[g->n_nodes] + 1, sizeof *p->claims);
    p->pinned = calloc((size_t)p->offset[g->n_nodes] + 1, 1);
    p->pt = calloc(n, sizeof *p->pt);
    if (!p->claims || !p->pinned || !p->pt) rc = TEQ_ERR_NOMEM;
  }
  if (!rc) {
    Run r = {.g = g, .order = p->order, .needed = needed};
    mark_needed(&r);
    for (int i = 0; i < g->n_nodes; i++) p->input_index[i] = -1;
    for (int i = 0; i < g->n_inputs; i++) p->input_index[g->inputs[i]] = i;
    for (int j = 0; j < g->n_outputs; j++) p->n_pos[j] = n_positions[j];
    rc = plan_states(p, needed, maps, base, d);
  }
  if (!rc) {
    for (int i = 0; i < g->n_nodes; i++)
      point_of[i] = p->state[i] == P_POINT ? p->n_pt : -1, p->n_pt += p->state[i] == P_POINT;
    for (int i = 0; i < g->n_nodes; i++)
      if (point_of[i] >= 0) p->pt[point_of[i]].id = i;
  }
  if (!rc) rc = plan_sources(p, maps, base, point_of, positions, d);
  /* A point node asked for a quarter of its output or more runs whole
   * (counting repeats, so that a box tested whole is not sorted first). */
  for (int k = 0; k < p->n_pt && !rc; k++) {
    PointNode *pn = &p->pt[k];
    if (4 * pn->n >= shape_numel(&g->nodes[pn->id].out[0])) {
      p->state[pn->id] = P_WHOLE;
      continue;
    }
    if (pn->n > 1) qsort(pn->pos, (size_t)pn->n, sizeof *pn->pos, cmp_i64);
    int64_t u = 0;
    for (int64_t q = 0; q < pn->n; q++)
      if (q == 0 || pn->pos[q] != pn->pos[u - 1]) pn->pos[u++] = pn->pos[q];
    pn->n = u;
    if (4 * u >= shape_numel(&g->nodes[pn->id].out[0])) p->state[pn->id] = P_WHOLE;
  }
  for (int j = 0; j < g->n_outputs && !rc; j++)
    for (int64_t q = 0; q < p->n_pos[j]; q++) {
      PointSrc *s = &p->src[j][q];
      if (s->slot <= -2 && p->state[p->pt[-2 - s->slot].id] == P_WHOLE)
        s->slot = p->offset[p->pt[-2 - s->slot].id];
      if (s->slot >= 0) p->pinned[s->slot] = 1;
    }
  for (int i = 0; i < g->n_nodes && !rc; i++)
    if (p->state[i] == P_WHOLE || p->state[i] == P_POINT)
      for (int j = 0; j < g->nodes[i].n_in; j++)
        p->claims[p->offset[g->nodes[i].in[j].node] + g->nodes[i].in[j].out]++;
  for (int i = 0; i < g->n_nodes; i++) {
    for (int k = 0; maps && maps[i] && k < g->nodes[i].n_out; k++) tensor_unref(maps[i][k]);
    if (maps) free(maps[i]);
    if (base) free(base[i]);
  }
  free(maps), free(base), free(needed), free(point_of);
  if (rc == TEQ_ERR_NOMEM) diag_error(d, "exec_points: out of memory");
  if (rc) {
    exec_points_free(p);
    return rc;
  }
  *out = p;
  return TEQ_OK;
}

/* Drops one claim on each input of node id. */
static void release_claims(Run *r, const ExecPoints *p, int32_t *claims, int id) {
  const Node *n = &p->g->nodes[id];
  for (int j = 0; j < n->n_in; j++) {
    int slot = p->offset[n->in[j].node] + n->in[j].out;
    if (--claims[slot] == 0 && !p->pinned[slot]) {
      tensor_unref(r->values[slot]);
      r->values[slot] = NULL;
    }
  }
}

int exec_points_run(const ExecPoints *p, Tensor *const *inputs, uint32_t *const *values, Diag *d) {
  const Graph *g = p->g;
  int n_slots = p->offset[g->n_nodes];
  Run r = {.g = g, .mode = EXEC_MODP, .order = p->order, .offset = p->offset,
           .input_index = p->input_index};
  r.values = calloc((size_t)n_slots + 1, sizeof *r.values);
  int32_t *claims = malloc(((size_t)n_slots + 1) * sizeof *claims);
  uint32_t **at = calloc((size_t)p->n_pt + 1, sizeof *at);
  int rc = r.values && claims && at ? TEQ_OK : diag_error(d, "exec_points: out of memory");
  if (!rc) memcpy(claims, p->claims, (size_t)n_slots * sizeof *claims);
  for (int k = 0; k < g->n_nodes && !rc; k++) {
    int id = p->order[k];
    const Node *n = &g->nodes[id];
    if (p->state[id] != P_WHOLE) continue;
    if (n->kind == OP_INPUT) rc = feed_input(&r, id, inputs, d);
    else if (n->kind == OP_CONST) rc = feed_const(&r, id, d);
    else rc = compute_node(&r, id, d);
    if (!rc) release_claims(&r, p, claims, id);
  }
  for (int k = 0; k < p->n_pt && !rc; k++) {
    const PointNode *pn = &p->pt[k];
    const Node *n = &g->nodes[pn->id];
    if (p->state[pn->id] != P_POINT) continue;
    Tensor *in[8];
    if (n->n_in > 8) {
      rc = diag_error(d, "exec_points: a point operator with %d inputs", n->n_in);
      break;
    }
    for (int j = 0; j < n->n_in; j++) in[j] = r.values[p->offset[n->in[j].node] + n->in[j].out];
    if (!(at[k] = malloc(((size_t)pn->n + 1) * sizeof *at[k]))) {
      rc = diag_error(d, "exec_points: out of memory");
      break;
    }
    if ((rc = op_def(n->kind)->eval_modp_at(n, in, pn->pos, pn->n, at[k], d))) {
      char label[GRAPH_LABEL_MAX];
      diag_error(d, "node %s failed", graph_node_label(g, pn->id, label, sizeof label));
      break;
    }
    release_claims(&r, p, claims, pn->id);
  }
  for (int j = 0; j < g->n_outputs && !rc; j++)
    for (int64_t q = 0; q < p->n_pos[j]; q++) {
      const PointSrc *s = &p->src[j][q];
      if (s->slot == SRC_ZERO) {
        values[j][q] = 0;
      } else if (s->slot >= 0) {
        const Tensor *t = r.values[s->slot];
        if (t->dtype != DT_MODP) {
          rc = diag_error(d, "exec_points: output %d holds %s, not Z_p residues", j,
                          dtype_name(t->dtype));
          break;
        }
        values[j][q] = ((const uint32_t *)t->data)[s->flat];
      } else {
        const PointNode *pn = &p->pt[-2 - s->slot];
        values[j][q] = at[-2 - s->slot][find_pos(pn, s->flat)];
      }
    }
  for (int i = 0; r.values && i < n_slots; i++) tensor_unref(r.values[i]);
  for (int k = 0; at && k < p->n_pt; k++) free(at[k]);
  free(r.values), free(claims), free(at);
  return rc;
}

/* ---- the GPU's memory plan, run on the host ---- */

/* Step k of plan p: its inputs copied out of their slots (views of the
 * plan's memory would alias what the step writes), its kernel, its
 * outputs copied into their slots. */
static int planned_step(const Graph *g, const MemPlan *p, char *const *at, int id, Diag *d) {
  const Node *n = &g->nodes[id];
  const OpDef *o = op_def(n->kind);
  char label[GRAPH_LABEL_MAX];
  graph_node_label(g, id, label, sizeof label);
  if (!o->eval_f32)
    return diag_error(d, "node %s: %s cannot be run by the CPU executor", label,
                      n->opaque ? "an opaque operator" : "the operator");
  int rc = TEQ_OK;
  Tensor **t = calloc((size_t)(n->n_in + n->n_out) + 1, sizeof *t), **out = t + n->n_in;
  if (!t) return TEQ_ERR_NOMEM;
  for (int j = 0; j < n->n_in && !rc; j++) {
    int s = p->offset[n->in[j].node] + n->in[j].out;
    DType dt = g->nodes[n->in[j].node].dtype == DT_I64 ? DT_I64 : DT_F32;
    if (!(t[j] = tensor_new_uninit(dt, graph_shape(g, n->in[j])))) rc = TEQ_ERR_NOMEM;
    else memcpy(t[j]->data, at[s], tensor_bytes(t[j]));
  }
  for (int j = 0; j < n->n_out && !rc; j++)
    if (!(out[j] = tensor_new_uninit(n->dtype == DT_I64 ? DT_I64 : DT_F32, &n->out[j])))
      rc = TEQ_ERR_NOMEM;
  if (rc == TEQ_ERR_NOMEM) diag_error(d, "node %s: out of memory", label);
  if (!rc && (rc = o->eval_f32(n, t, out, d))) diag_error(d, "node %s failed", label);
  for (int j = 0; j < n->n_out && !rc; j++)
    memcpy(at[p->offset[id] + j], out[j]->data, tensor_bytes(out[j]));
  for (int j = 0; j < n->n_in + n->n_out; j++) tensor_unref(t[j]);
  free(t);
  return rc;
}

/* A chain's exit (plan_gathers) as the device runs it: its rows copied
 * through the pointers the device would upload. */
static int planned_gather(const MemPlan *p, char *const *at, const GatherRows *r, Diag *d) {
  const float **rows = malloc(((size_t)r->n_rows + 1) * sizeof *rows);
  if (!rows) return diag_error(d, "out of memory");
  plan_gather_pointers(r, (const void *const *)at, rows);
  float *out = (float *)at[p->offset[r->node]];
  for (int64_t i = 0; i < r->n_rows; i++) {
    float *dst = out + i * r->row_len;
    if (rows[i]) memcpy(dst, rows[i], (size_t)r->row_len * sizeof *dst);
    else memset(dst, 0, (size_t)r->row_len * sizeof *dst);
  }
  free(rows);
  return TEQ_OK;
}

/* A matmul step with an operand or its output laid out by strides, as the
 * device runs it. */
static int planned_strided_product(const Graph *g, const MemPlan *p, char *const *at, int id,
                                   Diag *d) {
  const Node *n = &g->nodes[id];
  Shape shapes[2];
  const float *data[2];
  const int64_t *strides[2];
  for (int j = 0; j < 2; j++) {
    int s = p->offset[n->in[j].node] + n->in[j].out;
    shapes[j] = *graph_shape(g, n->in[j]);
    data[j] = (const float *)at[s];
    strides[j] = p->strided[s] ? p->strides + (size_t)s * TEQ_MAX_DIMS : NULL;
  }
  int y = p->offset[id];
  return cuda_matmul_on_host(n, shapes, data, strides, (float *)at[y],
                             p->strided[y] ? p->strides + (size_t)y * TEQ_MAX_DIMS : NULL, d);
}

int exec_run_planned(const Graph *g, Tensor *const *inputs, Tensor **outputs, int *strided_steps,
                     Diag *d) {
  MemPlan p;
  int rc = mem_plan_build(g, &p, d);
  if (rc) return rc;
  char *arena = malloc((size_t)p.arena_bytes + 1), *consts = malloc((size_t)p.const_bytes + 1);
  char **at = calloc((size_t)p.n_slots + 1, sizeof *at);
  int n_strided = 0;
  if (!arena || !consts || !at) rc = diag_error(d, "out of memory for the plan's memory");
  if (!rc) {
    memset(arena, 0xff, (size_t)p.arena_bytes); /* NaN: an element nobody wrote shows */
    for (int s = 0; s < p.n_slots; s++)
      if (p.where[s] == MEM_ARENA) at[s] = arena + p.at[s];
      else if (p.where[s] == MEM_CONST) at[s] = consts + p.at[s];
    for (int s = 0; s < p.n_slots; s++)
      if (p.where[s] == MEM_ALIAS) at[s] = at[p.root[s]] + p.at[s];
  }
  /* Constants, and sources' tensors computed once, as the device uploads them. */
  for (int id = 0; !rc && id < g->n_nodes; id++) {
    const Node *n = &g->nodes[id];
    int s = p.offset[id];
    if (n->n_out < 1 || p.where[s] != MEM_CONST) continue;
    if (n->kind == OP_CONST) {
      memcpy(at[s], n->value->data, tensor_bytes(n->value));
      continue;
    }
    Tensor *t = tensor_new(DT_F32, &n->out[0]);
    rc = t ? op_def(n->kind)->eval_f32(n, NULL, &t, d) : diag_error(d, "out of memory");
    if (!rc) memcpy(at[s], t->data, tensor_bytes(t));
    tensor_unref(t);
  }
  for (int i = 0; !rc && i < g->n_inputs; i++) {
    const Node *x = &g->nodes[g->inputs[i]];
    char want[SHAPE_STR_MAX], got[SHAPE_STR_MAX];
    if (!shape_equal(&inputs[i]->shape, &x->out[0]) || inputs[i]->dtype != (x->dtype == DT_I64 ? DT_I64 : DT_F32))
      rc = diag_error(d, "input %d is %s %s, the graph's %s", i, dtype_name(inputs[i]->dtype),
                      shape_format(&inputs[i]->shape, got, sizeof got),
                      shape_format(&x->out[0], want, sizeof want));
    else memcpy(at[p.offset[g->inputs[i]]], inputs[i]->data, tensor_bytes(inputs[i]));
  }
  for (int k = 0; !rc && k < p.n_steps; k++) {
    int id = p.steps[k];
    const Node *n = &g->nodes[id];
    if (p.gathers.role[id] == GATHER_EXIT) {
      rc = planned_gather(&p, at, &p.gathers.exits[p.gathers.exit[id]], d);
      continue;
    }
    bool strided = p.strided[p.offset[id]];
    for (int j = 0; j < n->n_in; j++) strided = strided || p.strided[p.offset[n->in[j].node] + n->in[j].out];
    if (strided) n_strided++;
    rc = strided ? planned_strided_product(g, &p, at, id, d) : planned_step(g, &p, at, id, d);
  }
  for (int i = 0; !rc && i < g->n_outputs; i++) {
    const TensorRef *o = &g->outputs[i];
    DType dt = g->nodes[o->node].dtype == DT_I64 ? DT_I64 : DT_F32;
    if (!(outputs[i] = tensor_new_uninit(dt, graph_shape(g, *o)))) {
      for (int j = 0; j < i; j++) tensor_unref(outputs[j]), outputs[j] = NULL;
      rc = diag_error(d, "out of memory");
    } else {
      memcpy(outputs[i]->data, at[p.outputs[i]], tensor_bytes(outputs[i]));
    }
  }
  if (!rc && strided_steps) *strided_steps = n_strided;
  free(arena), free(consts), free(at);
  mem_plan_fini(&p);
  return rc;
}
