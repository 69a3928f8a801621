/* exec.c: the CPU executors (float32 and Z_p) over the registry's kernels.
 * One pass in topological order over the nodes the graph outputs need; each
 * value is reference-counted by its remaining uses and freed after the last,
 * so memory follows the live set. Kernels themselves live with their rows
 * in runtime/ops/; this file only feeds them and keeps the books. */
#include "runtime/exec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/modp.h"

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

int exec_compare(const Graph *a, const Graph *b, ExecMode mode, uint64_t seed, int draw,
                 double tol, ExecDiff *diff, Diag *d) {
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
    if (!(in[i] = tensor_new_uninit(mode == EXEC_F32 ? DT_F32 : DT_MODP, sh))) { /* filled below */
      rc = TEQ_ERR_NOMEM;
      break;
    }
    tensor_fill_random(in[i], hash_mix(hash_mix(seed, (uint64_t)draw), (uint64_t)i));
    if (mode == EXEC_F32) {
      bool negative = (draw >> (i % 2)) & 1;
      float *x = in[i]->data;
      for (int64_t e = 0; e < tensor_numel(in[i]); e++) x[e] = negative ? -fabsf(x[e]) : fabsf(x[e]);
    }
  }
  if (!rc) rc = exec_run(a, mode, in, ya, d);
  if (!rc) rc = exec_run(b, mode, in, yb, d);
  for (int o = 0; !rc && o < n_out && !diff->differ; o++) {
    if (!shape_equal(&ya[o]->shape, &yb[o]->shape)) {
      diff->differ = true;
    } else {
      for (int64_t e = 0; e < tensor_numel(ya[o]); e++)
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
