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

/* "'conv_3' (conv2d)" for a named node, "#12 (conv2d)" for an unnamed one. */
static const char *node_label(const Graph *g, const Node *n, char *buf, size_t size) {
  const char *kind = n->opaque ? n->opaque->op_type : op_def(n->kind)->name;
  if (n->name && n->name[0]) snprintf(buf, size, "'%s' (%s)", n->name, kind);
  else snprintf(buf, size, "#%d (%s)", (int)(n - g->nodes), kind);
  return buf;
}
#define LABEL_MAX 300

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
    char label[LABEL_MAX];
    if (!m) return diag_error(d, "constant %s", node_label(r->g, n, label, sizeof label));
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
  char label[LABEL_MAX];
  node_label(r->g, n, label, sizeof label);
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
