/* graph.c: building, copying, ordering, hashing and checking graphs.
 * Nodes live in one array and refer to each other by id, so a copy is a
 * handful of allocations per node and constants are shared by reference.
 * Topological order is an iterative depth-first post-order from each node in
 * id order: deterministic, and it finds cycles on the way. The structural
 * hash is computed along that order, bottom-up, and is symmetric in the
 * operands of commutative operators, so a+b and b+a hash alike. */
#include "runtime/graph.h"

#include <stdlib.h>
#include <string.h>

static char *dup_name(const char *s) { return s ? strdup(s) : NULL; }

static void node_fini(Node *n) {
  free(n->in);
  free(n->out);
  free(n->name);
  tensor_unref(n->value);
  opaque_info_free(n->opaque);
  memset(n, 0, sizeof *n);
}

void opaque_info_free(OpaqueInfo *info) {
  if (!info) return;
  free(info->op_type);
  free(info->domain);
  free(info->proto);
  free(info->in_elem);
  free(info->out_elem);
  free(info->out_declared);
  free(info);
}

Graph *graph_new(void) { return calloc(1, sizeof(Graph)); }

void graph_free(Graph *g) {
  if (!g) return;
  for (int i = 0; i < g->n_nodes; i++) node_fini(&g->nodes[i]);
  for (int i = 0; i < g->n_outputs; i++) free(g->output_names[i]);
  free(g->nodes);
  free(g->inputs);
  free(g->outputs);
  free(g->output_names);
  free(g);
}

void graph_truncate(Graph *g, int32_t n) {
  while (g->n_nodes > n) node_fini(&g->nodes[--g->n_nodes]);
}

/* Room for one more node; the new slot is zeroed. */
int graph_reserve(Graph *g, int n) {
  if (n <= g->cap_nodes) return TEQ_OK;
  Node *nodes = realloc(g->nodes, (size_t)n * sizeof *nodes);
  if (!nodes) return TEQ_ERR_NOMEM;
  g->nodes = nodes;
  g->cap_nodes = n;
  return TEQ_OK;
}

static Node *append_slot(Graph *g) {
  if (g->n_nodes == g->cap_nodes) {
    int32_t cap = g->cap_nodes ? g->cap_nodes * 2 : 16;
    Node *nodes = realloc(g->nodes, (size_t)cap * sizeof *nodes);
    if (!nodes) return NULL;
    g->nodes = nodes;
    g->cap_nodes = cap;
  }
  Node *n = &g->nodes[g->n_nodes];
  memset(n, 0, sizeof *n);
  return n;
}

/* A malloc'd copy of n bytes at p (never NULL for n == 0 unless memory
 * runs out), or NULL for NULL. */
static void *dup_bytes(const void *p, size_t n) {
  if (!p) return NULL;
  void *c = malloc(n ? n : 1);
  if (c && n) memcpy(c, p, n);
  return c;
}

static OpaqueInfo *opaque_copy(const OpaqueInfo *src) {
  OpaqueInfo *o = calloc(1, sizeof *o);
  if (!o) return NULL;
  *o = *src;
  o->op_type = dup_name(src->op_type);
  o->domain = dup_name(src->domain);
  o->proto = malloc(src->proto_len ? src->proto_len : 1);
  o->in_elem = dup_bytes(src->in_elem, (size_t)src->n_in * sizeof *o->in_elem);
  o->out_elem = dup_bytes(src->out_elem, (size_t)src->n_out * sizeof *o->out_elem);
  o->out_declared = dup_bytes(src->out_declared, (size_t)src->n_out * sizeof *o->out_declared);
  if (!o->op_type || !o->domain || !o->proto || (src->in_elem && !o->in_elem) ||
      (src->out_elem && !o->out_elem) || (src->out_declared && !o->out_declared)) {
    opaque_info_free(o);
    return NULL;
  }
  if (src->proto_len) memcpy(o->proto, src->proto, src->proto_len);
  return o;
}

static int node_copy(Node *dst, const Node *src) {
  *dst = *src;
  dst->in = malloc(((size_t)src->n_in + 1) * sizeof *dst->in);
  dst->out = malloc(((size_t)src->n_out + 1) * sizeof *dst->out);
  dst->name = dup_name(src->name);
  dst->value = tensor_ref(src->value);
  dst->opaque = src->opaque ? opaque_copy(src->opaque) : NULL;
  if (!dst->in || !dst->out || (src->name && !dst->name) || (src->opaque && !dst->opaque)) {
    node_fini(dst);
    return TEQ_ERR_NOMEM;
  }
  memcpy(dst->in, src->in, (size_t)src->n_in * sizeof *dst->in);
  memcpy(dst->out, src->out, (size_t)src->n_out * sizeof *dst->out);
  return TEQ_OK;
}

Graph *graph_copy(const Graph *g) {
  Graph *c = graph_new();
  if (!c) return NULL;
  c->nodes = malloc(((size_t)g->n_nodes + 1) * sizeof *c->nodes);
  c->inputs = malloc(((size_t)g->n_inputs + 1) * sizeof *c->inputs);
  c->outputs = malloc(((size_t)g->n_outputs + 1) * sizeof *c->outputs);
  c->output_names = calloc((size_t)g->n_outputs + 1, sizeof *c->output_names);
  if (!c->nodes || !c->inputs || !c->outputs || !c->output_names) goto fail;
  c->cap_nodes = g->n_nodes + 1;
  for (int i = 0; i < g->n_nodes; i++) {
    if (node_copy(&c->nodes[i], &g->nodes[i])) goto fail;
    c->n_nodes++;
  }
  /* A graph without inputs (constants only) may have NULL arrays. */
  if (g->n_inputs) memcpy(c->inputs, g->inputs, (size_t)g->n_inputs * sizeof *c->inputs);
  c->n_inputs = g->n_inputs;
  if (g->n_outputs) memcpy(c->outputs, g->outputs, (size_t)g->n_outputs * sizeof *c->outputs);
  for (int i = 0; i < g->n_outputs; i++) {
    c->output_names[i] = dup_name(g->output_names[i]);
    c->n_outputs++;
    if (g->output_names[i] && !c->output_names[i]) goto fail;
  }
  return c;
fail:
  graph_free(c);
  return NULL;
}

/* Adds a source node with one output of the given shape. */
static int add_source(Graph *g, OpKind kind, const char *name, const Shape *shape, DType dtype) {
  Node *n = append_slot(g);
  if (!n) return TEQ_ERR_NOMEM;
  n->kind = kind;
  n->n_out = 1;
  n->out = malloc(sizeof *n->out);
  n->in = malloc(sizeof *n->in);
  n->name = dup_name(name);
  if (!n->out || !n->in || (name && !n->name)) {
    node_fini(n);
    return TEQ_ERR_NOMEM;
  }
  n->out[0] = *shape;
  n->dtype = dtype;
  params_default(kind, &n->params);
  return g->n_nodes++;
}

int graph_add_input(Graph *g, const char *name, const Shape *shape, DType dtype, Diag *d) {
  if (!shape_is_known(shape) || shape->ndim > TEQ_MAX_DIMS)
    return diag_error(d, "input '%s': shape must be known and of rank <= %d", name ? name : "?",
                      TEQ_MAX_DIMS);
  if (!shape_fits(shape, dtype)) {
    char why[SHAPE_MSG_MAX];
    return diag_error(d, "input '%s': %s", name ? name : "?",
                      shape_too_large(shape, dtype, why, sizeof why));
  }
  int32_t *inputs = realloc(g->inputs, ((size_t)g->n_inputs + 1) * sizeof *inputs);
  if (!inputs) return TEQ_ERR_NOMEM;
  g->inputs = inputs;
  int id = add_source(g, OP_INPUT, name, shape, dtype);
  if (id >= 0) g->inputs[g->n_inputs++] = id;
  return id;
}

int graph_add_const(Graph *g, const char *name, Tensor *value, Diag *d) {
  (void)d;
  int id = add_source(g, OP_CONST, name, &value->shape, value->dtype);
  if (id >= 0) g->nodes[id].value = value;
  else tensor_unref(value); /* taken over either way, as the header says */
  return id;
}

static bool ref_valid(const Graph *g, TensorRef r) {
  return r.node >= 0 && r.node < g->n_nodes && r.out >= 0 && r.out < g->nodes[r.node].n_out;
}

static int check_refs(const Graph *g, const TensorRef *in, int n_in, const char *what, Diag *d) {
  for (int i = 0; i < n_in; i++)
    if (!ref_valid(g, in[i]))
      return diag_error(d, "%s: input %d refers to a missing tensor (%%%d:%d)", what, i,
                        in[i].node, in[i].out);
  return TEQ_OK;
}

static int check_arity(const OpDef *o, int n_in, int n_out, Diag *d) {
  if (n_in < o->n_in_min || (o->n_in_max >= 0 && n_in > o->n_in_max)) {
    if (o->n_in_max < 0)
      return diag_error(d, "%s: takes at least %d inputs, got %d", o->name, o->n_in_min, n_in);
    return diag_error(d, "%s: takes %d to %d inputs, got %d", o->name, o->n_in_min, o->n_in_max,
                      n_in);
  }
  if (n_out < o->n_out_min || n_out > o->n_out_max)
    return diag_error(d, "%s: has %d to %d outputs, got %d", o->name, o->n_out_min, o->n_out_max,
                      n_out);
  return TEQ_OK;
}

/* Infers node id's output shapes from its inputs' current shapes. */
static int infer_node(Graph *g, int id, Diag *d) {
  Node *n = &g->nodes[id];
  const OpDef *o = op_def(n->kind);
  if (o->flags & (OPF_OPAQUE)) return TEQ_OK;
  if ((o->flags & OPF_SOURCE) && (n->kind == OP_INPUT || n->kind == OP_CONST)) return TEQ_OK;
  Shape in_stack[8];
  Shape *in = n->n_in <= 8 ? in_stack : malloc((size_t)n->n_in * sizeof *in);
  if (!in) return TEQ_ERR_NOMEM;
  bool known = true;
  for (int i = 0; i < n->n_in; i++) {
    in[i] = *graph_shape(g, n->in[i]);
    known = known && shape_is_known(&in[i]);
  }
  int rc = TEQ_OK;
  if (known) {
    rc = o->infer_shape(n, in, n->out, d);
    /* Every shape in a graph fits (shape_fits), so no computation on one
     * overflows; the rows check their own parameters, this their result.
     * TEQ_ERR_INPUT: a result that large is a bad model, not a form of the
     * operator that import may keep opaque. */
    for (int i = 0; i < n->n_out && rc == TEQ_OK; i++)
      if (!shape_fits(&n->out[i], n->dtype)) {
        char why[SHAPE_MSG_MAX];
        rc = diag_error(d, "%s: output %d: %s", o->name, i,
                        shape_too_large(&n->out[i], n->dtype, why, sizeof why));
      }
  } else {
    for (int i = 0; i < n->n_out; i++) n->out[i] = (Shape){.ndim = SHAPE_UNKNOWN};
  }
  if (in != in_stack) free(in);
  return rc;
}

/* Element type of a computed node: layout operators move their first
 * input's elements (an int64 shape tensor stays int64); the rest compute
 * in float. */
static DType computed_dtype(const Graph *g, const Node *n) {
  if (op_def(n->kind)->flags & OPF_INT64_OUT) return DT_I64;
  if ((op_def(n->kind)->flags & OPF_LAYOUT_ONLY) && n->n_in > 0)
    return g->nodes[n->in[0].node].dtype;
  return DT_F32;
}

int graph_add_node(Graph *g, OpKind kind, const TensorRef *in, int n_in, int n_out,
                   const Params *p, const char *name, Diag *d) {
  const OpDef *o = op_def(kind);
  int rc;
  if ((o->flags & OPF_OPAQUE) || kind == OP_INPUT || kind == OP_CONST)
    return diag_error(d, "%s: cannot be added with graph_add_node", o->name);
  if ((rc = check_arity(o, n_in, n_out, d)) || (rc = check_refs(g, in, n_in, o->name, d)))
    return rc;
  /* Integer tensors only move through layout operators (shape tensors,
   * indices); integer arithmetic is folded at import or not supported. */
  if (!(o->flags & OPF_LAYOUT_ONLY) && n_in > 0 && g->nodes[in[0].node].dtype == DT_I64) {
    diag_error(d, "%s: int64 arithmetic is not supported", o->name);
    return TEQ_ERR_UNSUPPORTED;
  }
  Params params;
  if (p) params = *p;
  else params_default(kind, &params);
  if ((rc = params_check(kind, &params, d))) return rc;
  Node *n = append_slot(g);
  if (!n) return TEQ_ERR_NOMEM;
  n->kind = kind;
  n->n_in = n_in;
  n->n_out = n_out;
  n->params = params;
  n->in = malloc(((size_t)n_in + 1) * sizeof *n->in);
  n->out = calloc((size_t)n_out, sizeof *n->out);
  n->name = dup_name(name);
  if (!n->in || !n->out || (name && !n->name)) {
    node_fini(n);
    return TEQ_ERR_NOMEM;
  }
  if (n_in) memcpy(n->in, in, (size_t)n_in * sizeof *in);
  n->dtype = computed_dtype(g, n);
  int id = g->n_nodes;
  g->n_nodes++; /* visible to infer_node; undone on failure */
  if ((rc = infer_node(g, id, d))) {
    g->n_nodes--;
    node_fini(n);
    return rc;
  }
  return id;
}

int graph_add_opaque(Graph *g, OpaqueInfo *info, const TensorRef *in, int n_in, int n_out,
                     const Shape *out_shapes, const DType *out_dtype, const char *name,
                     Diag *d) {
  int rc;
  if ((rc = check_arity(op_def(OP_OPAQUE), n_in, n_out, d)) ||
      (rc = check_refs(g, in, n_in, info->op_type, d))) {
    opaque_info_free(info);
    return rc;
  }
  DType dt = out_dtype ? *out_dtype : DT_F32;
  for (int i = 0; out_shapes && i < n_out; i++)
    if (shape_is_known(&out_shapes[i]) && !shape_fits(&out_shapes[i], dt)) {
      char why[SHAPE_MSG_MAX];
      diag_error(d, "%s: output %d: %s", info->op_type, i,
                 shape_too_large(&out_shapes[i], dt, why, sizeof why));
      opaque_info_free(info);
      return TEQ_ERR_INPUT;
    }
  Node *n = append_slot(g);
  if (!n) {
    opaque_info_free(info);
    return TEQ_ERR_NOMEM;
  }
  n->kind = OP_OPAQUE;
  n->n_in = n_in;
  n->n_out = n_out;
  n->opaque = info;
  n->in = malloc(((size_t)n_in + 1) * sizeof *n->in);
  n->out = malloc((size_t)n_out * sizeof *n->out);
  n->name = dup_name(name);
  if (!n->in || !n->out || (name && !n->name)) {
    node_fini(n);
    return TEQ_ERR_NOMEM;
  }
  if (n_in) memcpy(n->in, in, (size_t)n_in * sizeof *in);
  for (int i = 0; i < n_out; i++)
    n->out[i] = out_shapes ? out_shapes[i] : (Shape){.ndim = SHAPE_UNKNOWN};
  n->dtype = dt;
  return g->n_nodes++;
}

int graph_add_output(Graph *g, TensorRef ref, const char *name, Diag *d) {
  int rc = check_refs(g, &ref, 1, "graph output", d);
  if (rc) return rc;
  TensorRef *outs = realloc(g->outputs, ((size_t)g->n_outputs + 1) * sizeof *outs);
  if (!outs) return TEQ_ERR_NOMEM;
  g->outputs = outs;
  char **names = realloc(g->output_names, ((size_t)g->n_outputs + 1) * sizeof *names);
  if (!names) return TEQ_ERR_NOMEM;
  g->output_names = names;
  g->outputs[g->n_outputs] = ref;
  g->output_names[g->n_outputs] = dup_name(name);
  if (name && !g->output_names[g->n_outputs]) return TEQ_ERR_NOMEM;
  return g->n_outputs++;
}

/* ---- order ---- */

int graph_topo_order(const Graph *g, int32_t *order) {
  enum { WHITE, GREY, BLACK };
  int n = g->n_nodes, k = 0, rc = TEQ_OK;
  unsigned char *color = calloc((size_t)n + 1, 1);
  int32_t *stack = malloc(((size_t)n + 1) * sizeof *stack);
  int32_t *next_in = calloc((size_t)n + 1, sizeof *next_in); /* next input to visit */
  if (!color || !stack || !next_in) {
    rc = TEQ_ERR_NOMEM;
    goto out;
  }
  for (int root = 0; root < n; root++) {
    if (color[root] != WHITE) continue;
    int sp = 0;
    stack[sp++] = root;
    color[root] = GREY;
    while (sp) {
      int v = stack[sp - 1];
      const Node *nv = &g->nodes[v];
      if (next_in[v] < nv->n_in) {
        int u = nv->in[next_in[v]++].node;
        if (color[u] == GREY) {
          rc = TEQ_ERR_INPUT; /* a back edge: cycle */
          goto out;
        }
        if (color[u] == WHITE) {
          color[u] = GREY;
          stack[sp++] = u;
        }
      } else {
        color[v] = BLACK;
        order[k++] = v;
        sp--;
      }
    }
  }
out:
  free(color);
  free(stack);
  free(next_in);
  return rc;
}

/* ---- hashing ---- */

static uint64_t hash_string(uint64_t h, const char *s) {
  return s ? hash_bytes(h, s, strlen(s)) : hash_mix(h, 0);
}

/* The NodeProto and what the model said of its opset, types and shapes:
 * the same operator node read from two models hashes alike only if both
 * said the same. */
static uint64_t opaque_hash(uint64_t h, const OpaqueInfo *o) {
  h = hash_string(h, o->op_type);
  h = hash_bytes(h, o->proto, o->proto_len);
  h = hash_mix(h, (uint64_t)o->opset);
  for (int32_t i = 0; o->in_elem && i < o->n_in; i++) h = hash_mix(h, (uint64_t)o->in_elem[i]);
  for (int32_t k = 0; o->out_elem && k < o->n_out; k++) h = hash_mix(h, (uint64_t)o->out_elem[k]);
  for (int32_t k = 0; o->out_declared && k < o->n_out; k++) {
    const Shape *s = &o->out_declared[k];
    h = hash_mix(h, (uint64_t)s->ndim);
    for (int32_t j = 0; j < s->ndim; j++) h = hash_mix(h, (uint64_t)s->d[j]);
  }
  return h;
}

static uint64_t node_hash_one(const Graph *g, const Node *n, const uint64_t *hashes) {
  uint64_t h = hash_mix(0x6e6f6465, (uint64_t)n->kind);
  h = params_hash(h, &n->params);
  h = hash_mix(h, (uint64_t)n->n_out);
  if (n->kind == OP_INPUT) {
    for (int i = 0; i < g->n_inputs; i++)
      if (&g->nodes[g->inputs[i]] == n) h = hash_mix(h, (uint64_t)i + 1);
    h = hash_bytes(h, &n->out[0], sizeof n->out[0]);
  } else if (n->kind == OP_CONST) {
    h = hash_mix(h, tensor_content_hash(n->value));
  } else if (n->opaque) {
    h = opaque_hash(h, n->opaque);
  }
  uint64_t in_h[2];
  bool symmetric = (op_def(n->kind)->flags & OPF_COMMUTATIVE) && n->n_in == 2;
  for (int i = 0; i < n->n_in; i++) {
    uint64_t x = hash_mix(hashes[n->in[i].node], (uint64_t)n->in[i].out);
    if (symmetric) in_h[i] = x;
    else h = hash_mix(h, x);
  }
  if (symmetric) {
    uint64_t lo = in_h[0] < in_h[1] ? in_h[0] : in_h[1];
    uint64_t hi = in_h[0] < in_h[1] ? in_h[1] : in_h[0];
    h = hash_mix(hash_mix(h, lo), hi);
  }
  return h;
}

uint64_t graph_hash(const Graph *g, uint64_t *node_hash) {
  int32_t *order = malloc(((size_t)g->n_nodes + 1) * sizeof *order);
  uint64_t *hashes = node_hash ? node_hash : malloc(((size_t)g->n_nodes + 1) * sizeof *hashes);
  uint64_t h = hash_mix(0x67726170, (uint64_t)g->n_outputs);
  if (!order || !hashes || graph_topo_order(g, order) != TEQ_OK) {
    h = 0;
    goto out;
  }
  for (int k = 0; k < g->n_nodes; k++)
    hashes[order[k]] = node_hash_one(g, &g->nodes[order[k]], hashes);
  for (int i = 0; i < g->n_outputs; i++)
    h = hash_mix(h, hash_mix(hashes[g->outputs[i].node], (uint64_t)g->outputs[i].out));
out:
  free(order);
  if (hashes != node_hash) free(hashes);
  return h;
}

/* ---- queries ---- */

int32_t *graph_use_counts(const Graph *g, int32_t **offset) {
  int32_t *off = malloc(((size_t)g->n_nodes + 1) * sizeof *off);
  if (!off) return NULL;
  off[0] = 0;
  for (int i = 0; i < g->n_nodes; i++) off[i + 1] = off[i] + g->nodes[i].n_out;
  int32_t *uses = calloc((size_t)off[g->n_nodes] + 1, sizeof *uses);
  if (!uses) {
    free(off);
    return NULL;
  }
  for (int i = 0; i < g->n_nodes; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++) {
      TensorRef r = g->nodes[i].in[j];
      uses[off[r.node] + r.out]++;
    }
  for (int i = 0; i < g->n_outputs; i++) uses[off[g->outputs[i].node] + g->outputs[i].out]++;
  *offset = off;
  return uses;
}

int graph_count_ops(const Graph *g) {
  int k = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    unsigned f = op_def(g->nodes[i].kind)->flags;
    if (!(g->nodes[i].kind == OP_INPUT || g->nodes[i].kind == OP_CONST || (f & OPF_NOOP))) k++;
  }
  return k;
}

int graph_canonicalize(Graph *g) {
  int changed = 0;
  for (int id = 0; id < g->n_nodes; id++) {
    Node *n = &g->nodes[id];
    const OpDef *def = op_def(n->kind);
    if (!def->canonical || n->n_in > 64) continue;
    Shape in[64];
    for (int j = 0; j < n->n_in; j++) in[j] = *graph_shape(g, n->in[j]);
    Params before = n->params;
    def->canonical(n, in);
    changed += memcmp(&before, &n->params, sizeof before) != 0;
  }
  return changed;
}

int graph_check(const Graph *g, Diag *d) {
  int rc = TEQ_OK;
  for (int i = 0; i < g->n_nodes; i++) {
    const Node *n = &g->nodes[i];
    if ((int)n->kind < 0 || n->kind >= OP__COUNT) {
      diag_error(d, "graph: node %d has kind %d", i, (int)n->kind);
      return TEQ_ERR_INTERNAL;
    }
    bool refs_ok = true;
    for (int j = 0; j < n->n_in; j++) refs_ok = refs_ok && ref_valid(g, n->in[j]);
    bool value_ok = n->kind != OP_CONST || (n->value && shape_equal(&n->value->shape, &n->out[0]));
    bool opaque_ok = (n->kind == OP_OPAQUE) == (n->opaque != NULL);
    bool opaque_arity_ok = !n->opaque || ((!n->opaque->n_in || n->opaque->n_in == n->n_in) &&
                                          (!n->opaque->n_out || n->opaque->n_out == n->n_out));
    /* PET's search checks every candidate it rewrites: the message is
     * formatted only for a node that fails */
    if (refs_ok && value_ok && opaque_ok && opaque_arity_ok) continue;
    rc = TEQ_ERR_INTERNAL;
    char what[64];
    snprintf(what, sizeof what, "graph: node %d (%s)", i, op_def(n->kind)->name);
    if (!refs_ok) check_refs(g, n->in, n->n_in, what, d);
    if (!value_ok) diag_error(d, "%s: value missing or of the wrong shape", what);
    if (!opaque_ok)
      diag_error(d, "%s: opaque data present exactly when opaque", what);
    else if (!opaque_arity_ok)
      diag_error(d, "%s: opaque element types for %d inputs and %d outputs, node has %d and %d",
                 what, n->opaque->n_in, n->opaque->n_out, n->n_in, n->n_out);
  }
  for (int i = 0; i < g->n_outputs; i++)
    if (check_refs(g, &g->outputs[i], 1, "graph output", d)) rc = TEQ_ERR_INTERNAL;
  for (int i = 0; i < g->n_inputs; i++)
    if (g->inputs[i] < 0 || g->inputs[i] >= g->n_nodes || g->nodes[g->inputs[i]].kind != OP_INPUT) {
      diag_error(d, "graph: input %d is not an input node", i);
      rc = TEQ_ERR_INTERNAL;
    }
  if (rc) return rc;
  int32_t *order = malloc(((size_t)g->n_nodes + 1) * sizeof *order);
  if (!order) return TEQ_ERR_NOMEM;
  if (graph_topo_order(g, order) != TEQ_OK) {
    free(order);
    diag_error(d, "graph: has a cycle");
    return TEQ_ERR_INTERNAL;
  }
  /* Re-infer every shape on a copy of the outputs and compare. */
  for (int k = 0; k < g->n_nodes && !rc; k++) {
    const Node *n = &g->nodes[order[k]];
    const OpDef *o = op_def(n->kind);
    if ((o->flags & OPF_SOURCE) || (o->flags & OPF_OPAQUE)) continue;
    Shape in[64], out[64];
    if (n->n_in > 64 || n->n_out > 64) continue;
    bool known = true;
    for (int i = 0; i < n->n_in; i++) {
      in[i] = *graph_shape(g, n->in[i]);
      known = known && shape_is_known(&in[i]);
    }
    if (!known) continue;
    if (o->infer_shape(n, in, out, d) != TEQ_OK) {
      diag_error(d, "graph: node %d (%s): shapes no longer infer", order[k], o->name);
      rc = TEQ_ERR_INTERNAL;
      break;
    }
    for (int i = 0; i < n->n_out; i++)
      if (!shape_equal(&out[i], &n->out[i])) {
        char a[SHAPE_STR_MAX], b[SHAPE_STR_MAX];
        diag_error(d, "graph: node %d (%s) output %d: stored shape %s, inferred %s", order[k],
                   o->name, i, shape_format(&n->out[i], a, sizeof a),
                   shape_format(&out[i], b, sizeof b));
        rc = TEQ_ERR_INTERNAL;
      }
  }
  free(order);
  return rc;
}

/* ---- rewrite ---- */

void graph_replace_uses(Graph *g, TensorRef from, TensorRef to) {
  for (int i = 0; i < g->n_nodes; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++) {
      TensorRef *r = &g->nodes[i].in[j];
      if (r->node == from.node && r->out == from.out) *r = to;
    }
  for (int i = 0; i < g->n_outputs; i++) {
    TensorRef *r = &g->outputs[i];
    if (r->node == from.node && r->out == from.out) *r = to;
  }
}

int graph_infer_shapes(Graph *g, Diag *d) {
  int32_t *order = malloc(((size_t)g->n_nodes + 1) * sizeof *order);
  if (!order) return TEQ_ERR_NOMEM;
  int rc = graph_topo_order(g, order);
  if (rc) diag_error(d, "graph: has a cycle");
  for (int k = 0; k < g->n_nodes && !rc; k++) {
    const Node *n = &g->nodes[order[k]];
    if ((rc = infer_node(g, order[k], d)))
      diag_error(d, "node %d '%s' (%s): shape inference failed", order[k], n->name ? n->name : "",
                 op_def(n->kind)->name);
  }
  free(order);
  return rc;
}

int graph_remove_dead(Graph *g) {
  int n = g->n_nodes;
  unsigned char *live = calloc((size_t)n + 1, 1);
  int32_t *stack = malloc(((size_t)n + 1) * sizeof *stack);
  int32_t *remap = malloc(((size_t)n + 1) * sizeof *remap);
  if (!live || !stack || !remap) {
    free(live), free(stack), free(remap);
    return TEQ_ERR_NOMEM;
  }
  int sp = 0;
  for (int i = 0; i < g->n_outputs; i++)
    if (!live[g->outputs[i].node]) live[g->outputs[i].node] = 1, stack[sp++] = g->outputs[i].node;
  for (int i = 0; i < g->n_inputs; i++)
    if (!live[g->inputs[i]]) live[g->inputs[i]] = 1, stack[sp++] = g->inputs[i];
  while (sp) {
    const Node *v = &g->nodes[stack[--sp]];
    for (int j = 0; j < v->n_in; j++)
      if (!live[v->in[j].node]) live[v->in[j].node] = 1, stack[sp++] = v->in[j].node;
  }
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (!live[i]) {
      node_fini(&g->nodes[i]);
      remap[i] = -1;
      continue;
    }
    remap[i] = k;
    if (k != i) g->nodes[k] = g->nodes[i];
    k++;
  }
  g->n_nodes = k;
  for (int i = 0; i < k; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++) g->nodes[i].in[j].node = remap[g->nodes[i].in[j].node];
  for (int i = 0; i < g->n_outputs; i++) g->outputs[i].node = remap[g->outputs[i].node];
  for (int i = 0; i < g->n_inputs; i++) g->inputs[i] = remap[g->inputs[i]];
  free(live), free(stack), free(remap);
  return n - k;
}

/* Whether nodes a and b compute the same value, their inputs already
 * pointing at merged nodes. */
static bool same_node(const Graph *g, int a, int b) {
  const Node *x = &g->nodes[a], *y = &g->nodes[b];
  if (x->kind != y->kind || x->n_in != y->n_in || x->n_out != y->n_out || x->dtype != y->dtype ||
      memcmp(&x->params, &y->params, sizeof x->params) != 0)
    return false;
  for (int j = 0; j < x->n_out; j++)
    if (!shape_equal(&x->out[j], &y->out[j])) return false;
  if (x->kind == OP_CONST) {
    const Tensor *u = x->value, *v = y->value;
    return u == v || (u->dtype == v->dtype && shape_equal(&u->shape, &v->shape) &&
                      memcmp(u->data, v->data, tensor_bytes(u)) == 0);
  }
  bool same = true;
  for (int j = 0; j < x->n_in && same; j++)
    same = x->in[j].node == y->in[j].node && x->in[j].out == y->in[j].out;
  if (!same && x->n_in == 2 && (op_def(x->kind)->flags & OPF_COMMUTATIVE))
    same = x->in[0].node == y->in[1].node && x->in[0].out == y->in[1].out &&
           x->in[1].node == y->in[0].node && x->in[1].out == y->in[0].out;
  return same;
}

bool graph_node_is_view(const Graph *g, int id, int64_t *first) {
  const Node *n = &g->nodes[id];
  Shape in[8];
  const Tensor *consts[8];
  if (!op_def(n->kind)->view || n->n_in > 8) return false;
  for (int j = 0; j < n->n_in; j++) {
    const Node *src = &g->nodes[n->in[j].node];
    in[j] = *graph_shape(g, n->in[j]);
    consts[j] = src->kind == OP_CONST ? src->value : NULL;
  }
  return op_view(n, in, consts, first);
}

/* Per node, the one node with an edge from it (-1: none or several):
 * among all nodes, or only those with an assembled hook; a graph output
 * counts as a second reader where outputs_read. */
static int32_t *sole_reader(const Graph *g, bool assembling_only, bool outputs_read) {
  int32_t *reader = malloc(((size_t)g->n_nodes + 1) * sizeof *reader);
  if (!reader) return NULL;
  for (int i = 0; i < g->n_nodes; i++) reader[i] = -2; /* -2: none yet */
  for (int i = 0; i < g->n_nodes; i++) {
    if (assembling_only && !op_def(g->nodes[i].kind)->assembled) continue;
    for (int j = 0; j < g->nodes[i].n_in; j++) {
      int src = g->nodes[i].in[j].node;
      reader[src] = reader[src] == -2 ? i : -1;
    }
  }
  if (outputs_read)
    for (int o = 0; o < g->n_outputs; o++) reader[g->outputs[o].node] = -1;
  for (int i = 0; i < g->n_nodes; i++)
    if (reader[i] == -2) reader[i] = -1;
  return reader;
}

int32_t *graph_only_readers(const Graph *g) { return sole_reader(g, false, true); }

int graph_readers(const Graph *g, int32_t **start, int32_t **readers) {
  int nn = g->n_nodes, edges = 0;
  int32_t *st = calloc((size_t)nn + 2, sizeof *st), *rd = NULL, *fill = NULL;
  for (int id = 0; st && id < nn; id++)
    for (int j = 0; j < g->nodes[id].n_in; j++) st[g->nodes[id].in[j].node + 1]++, edges++;
  if (st) {
    rd = malloc(((size_t)edges + 1) * sizeof *rd);
    fill = malloc(((size_t)nn + 1) * sizeof *fill);
  }
  if (!st || !rd || !fill) {
    free(st), free(rd), free(fill);
    *start = *readers = NULL;
    return TEQ_ERR_NOMEM;
  }
  for (int id = 0; id < nn; id++) st[id + 1] += st[id];
  memcpy(fill, st, (size_t)nn * sizeof *fill);
  for (int id = 0; id < nn; id++)
    for (int j = 0; j < g->nodes[id].n_in; j++) rd[fill[g->nodes[id].in[j].node]++] = id;
  free(fill);
  *start = st, *readers = rd;
  return TEQ_OK;
}

int32_t *graph_piece_homes(const Graph *g) { return sole_reader(g, true, false); }

bool graph_node_owns_output(const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  if (n->n_out != 1 || n->opaque || op_def(n->kind)->flags & (OPF_SOURCE | OPF_NOOP | OPF_OPAQUE))
    return false;
  return !graph_node_is_view(g, id, NULL);
}

bool graph_node_in_place(const Graph *g, int id, const int32_t *home, const bool *weight,
                         int64_t *first) {
  const Node *n = &g->nodes[id];
  if (!op_def(n->kind)->assembled) return false;
  for (int j = 0; j < n->n_in; j++) {
    int p = n->in[j].node;
    if (home[p] != id || (weight && weight[p]) || !graph_node_owns_output(g, p)) return false;
  }
  Shape *in = malloc(((size_t)n->n_in + 1) * sizeof *in);
  if (!in) return false; /* out of memory: a kernel copies it, as it always may */
  for (int j = 0; j < n->n_in; j++) in[j] = *graph_shape(g, n->in[j]);
  bool ok = op_assembled(n, in, first);
  free(in);
  return ok;
}

int graph_merge_duplicates(Graph *g) {
  int n = g->n_nodes;
  size_t cap = 16;
  while (cap < 2 * (size_t)n) cap *= 2;
  int32_t *order = malloc(((size_t)n + 1) * sizeof *order);
  int32_t *rep = malloc(((size_t)n + 1) * sizeof *rep);
  int32_t *table = malloc(cap * sizeof *table);
  uint64_t *hashes = malloc(((size_t)n + 1) * sizeof *hashes);
  int merged = 0;
  if (!order || !rep || !table || !hashes) {
    merged = TEQ_ERR_NOMEM;
    goto out;
  }
  if (graph_topo_order(g, order) != TEQ_OK) {
    merged = TEQ_ERR_INPUT;
    goto out;
  }
  /* Equal values hash alike (graph_hash is structural), so only nodes of
   * one hash are compared. */
  graph_hash(g, hashes);
  for (size_t i = 0; i < cap; i++) table[i] = -1;
  for (int k = 0; k < n; k++) {
    int id = order[k];
    Node *v = &g->nodes[id];
    rep[id] = id;
    for (int j = 0; j < v->n_in; j++) v->in[j].node = rep[v->in[j].node];
    if (v->kind == OP_INPUT || v->opaque) continue;
    size_t at = (size_t)hashes[id] & (cap - 1);
    for (; table[at] >= 0; at = (at + 1) & (cap - 1))
      if (hashes[table[at]] == hashes[id] && same_node(g, table[at], id)) break;
    if (table[at] >= 0) {
      rep[id] = table[at];
      merged++;
    } else {
      table[at] = id;
    }
  }
  for (int i = 0; i < g->n_outputs; i++) g->outputs[i].node = rep[g->outputs[i].node];
  if (merged > 0) {
    int rc = graph_remove_dead(g);
    if (rc < 0) merged = rc;
  }
out:
  free(order), free(rep), free(table), free(hashes);
  return merged;
}

/* ---- show ---- */

void graph_dump(const Graph *g, FILE *f) {
  int32_t *order = malloc(((size_t)g->n_nodes + 1) * sizeof *order);
  if (!order) return;
  if (graph_topo_order(g, order) != TEQ_OK) {
    fprintf(f, "(graph has a cycle)\n");
    free(order);
    return;
  }
  char buf[512], sh[SHAPE_STR_MAX];
  for (int k = 0; k < g->n_nodes; k++) {
    const Node *n = &g->nodes[order[k]];
    const char *name = n->opaque ? n->opaque->op_type : op_def(n->kind)->name;
    fprintf(f, "%%%d = %s(", order[k], name);
    for (int j = 0; j < n->n_in; j++) {
      fprintf(f, j ? ", %%%d" : "%%%d", n->in[j].node);
      if (n->in[j].out) fprintf(f, ":%d", n->in[j].out);
    }
    params_format(n->kind, &n->params, true, buf, sizeof buf);
    fprintf(f, ")%s%s :", buf[0] ? " " : "", buf);
    for (int j = 0; j < n->n_out; j++) fprintf(f, " %s", shape_format(&n->out[j], sh, sizeof sh));
    if (n->name) fprintf(f, "  # %s", n->name);
    fputc('\n', f);
  }
  for (int i = 0; i < g->n_outputs; i++)
    fprintf(f, "output %s = %%%d:%d\n", g->output_names[i] ? g->output_names[i] : "?",
            g->outputs[i].node, g->outputs[i].out);
  free(order);
}

const char *graph_node_label(const Graph *g, int id, char *buf, size_t size) {
  const Node *n = &g->nodes[id];
  const char *kind = n->opaque ? n->opaque->op_type : op_def(n->kind)->name;
  if (n->name && n->name[0]) snprintf(buf, size, "'%.200s' (%s)", n->name, kind);
  else snprintf(buf, size, "#%d (%s)", id, kind);
  return buf;
}

/* ---- residuals ---- */

/* Node id (a row with a residual_input) given the residual z: its missing
 * optional inputs zero per-channel vectors, its act the one act_node (-1:
 * none) applies. The new node's id, or an error. */
static int with_residual(Graph *g, int id, TensorRef z, int act_node, Diag *d) {
  const Node *c = &g->nodes[id];
  int r = op_def(c->kind)->residual_input;
  TensorRef in[8];
  if (r >= 8) return diag_error(d, "graph_fuse_residuals: residual input %d", r), TEQ_ERR_INTERNAL;
  for (int j = 0; j < r; j++) {
    if (j < c->n_in) {
      in[j] = c->in[j];
      continue;
    }
    Shape s = shape_of(1, (int)c->out[0].d[1]);
    Tensor *t = tensor_new(DT_F32, &s); /* zeros */
    int k = t ? graph_add_const(g, NULL, t, d) : TEQ_ERR_NOMEM;
    if (k < 0) return k;
    in[j] = (TensorRef){k, 0};
    c = &g->nodes[id]; /* adding may move the array */
  }
  in[r] = z;
  Params p = c->params;
  if (act_node >= 0)
    p.v[param_index(c->kind, "act")].i[0] = act_of_node(&g->nodes[act_node]);
  char *name = c->name ? strdup(c->name) : NULL;
  int nid = graph_add_node(g, c->kind, in, r + 1, 1, &p, name, d);
  free(name);
  return nid;
}

/* Whether node id is a view of all of its input, element for element in
 * order (a reshape, a flatten): the same values in another shape. */
static bool same_elements_view(const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  int64_t first = -1;
  return n->n_out == 1 && n->n_in >= 1 && graph_node_is_view(g, id, &first) && first == 0 &&
         shape_numel(&n->out[0]) == shape_numel(graph_shape(g, n->in[0]));
}

int graph_fuse_residuals(Graph *g, Diag *d) {
  int n0 = g->n_nodes, fused = 0, rc = TEQ_OK;
  int32_t *reader = graph_only_readers(g);
  bool *taken = calloc((size_t)n0 + 1, sizeof *taken);
  if (!reader || !taken) {
    diag_error(d, "out of memory fusing residuals");
    rc = TEQ_ERR_NOMEM;
  }
  for (int u = 0; u < n0 && rc == TEQ_OK; u++) {
    if (g->nodes[u].kind != OP_EWADD || g->nodes[u].n_in != 2 || g->nodes[u].dtype != DT_F32)
      continue;
    for (int side = 0; side < 2; side++) {
      const Node *add = &g->nodes[u];
      TensorRef x = add->in[side], z = add->in[1 - side];
      const Shape *sum = &add->out[0];
      /* A reshape the add alone reads, between it and the node. */
      int view = -1;
      if (x.node < n0 && x.out == 0 && reader[x.node] == u && !taken[x.node] &&
          same_elements_view(g, x.node)) {
        view = x.node;
        x = g->nodes[view].in[0];
      }
      const Node *c = &g->nodes[x.node];
      int r = op_def(c->kind)->residual_input, act_i = param_index(c->kind, "act");
      bool ok = r > 0 && act_i >= 0 && x.out == 0 && x.node < n0 && !taken[x.node] &&
                reader[x.node] == (view >= 0 ? view : u) && c->n_out == 1 && c->n_in <= r &&
                c->params.v[act_i].i[0] == ACT_NONE && !op_output_pooled(c) &&
                c->out[0].ndim >= 2 && z.node != x.node && z.node != view &&
                g->nodes[z.node].dtype == DT_F32 &&
                shape_equal(graph_shape(g, z), view >= 0 ? sum : &c->out[0]);
      /* Constant optional inputs: optimize takes a bias apart for its search. */
      for (int j = op_def(c->kind)->n_in_min; ok && j < c->n_in; j++)
        ok = g->nodes[c->in[j].node].kind == OP_CONST;
      if (!ok) continue;
      int act_node = reader[u] >= 0 && act_of_node(&g->nodes[reader[u]]) != ACT_NONE
                         ? reader[u] : -1;
      Params as_node, as_sum; /* reshapes to the node's output shape and back */
      int shape_i = param_index(OP_RESHAPE, "shape");
      if (view >= 0) {
        params_default(OP_RESHAPE, &as_node);
        params_default(OP_RESHAPE, &as_sum);
        param_set_ints(&as_node, shape_i, c->out[0].d, c->out[0].ndim);
        param_set_ints(&as_sum, shape_i, sum->d, sum->ndim);
        int zi = graph_add_node(g, OP_RESHAPE, &z, 1, 1, &as_node, NULL, d);
        if (zi < 0) {
          rc = zi;
          break;
        }
        z = (TensorRef){zi, 0};
      }
      int nid = with_residual(g, x.node, z, act_node, d);
      if (nid >= 0 && view >= 0)
        nid = graph_add_node(g, OP_RESHAPE, (TensorRef[]){{nid, 0}}, 1, 1, &as_sum, NULL, d);
      if (nid < 0) {
        rc = nid;
        break;
      }
      graph_replace_uses(g, (TensorRef){act_node >= 0 ? act_node : u, 0}, (TensorRef){nid, 0});
      if (view >= 0) taken[view] = true;
      taken[x.node] = true;
      if (z.node < n0) taken[z.node] = true; /* add(conv, conv): the other is z, kept */
      fused++;
      break;
    }
  }
  free(reader);
  free(taken);
  if (rc == TEQ_OK && fused) {
    int removed = graph_remove_dead(g);
    if (removed < 0) rc = removed;
  }
  return rc == TEQ_OK ? fused : rc;
}


/* ---- values read by strides ---- */

/* The strides a dense view of shape `to` has over a value of shape `from`
 * laid out with strides fs, element for element in order: false where no
 * strides can say it (merging axes that do not follow one another in
 * memory). Axes are taken in chunks whose elements step uniformly; each
 * chunk of `from` must be covered by whole axes of `to`. */
static bool view_strides(const Shape *from, const int64_t *fs, const Shape *to, int64_t *ts) {
  int64_t nf = shape_numel(from);
  if (nf != shape_numel(to) || nf == 0) return false;
  int vd = to->ndim - 1;
  int64_t chunk_step = from->ndim ? fs[from->ndim - 1] : 1, chunk = 1, covered = 1;
  for (int fd = from->ndim - 1; fd >= 0; fd--) {
    chunk *= from->d[fd];
    bool chunk_ends = fd == 0 || (from->d[fd - 1] != 1 && fs[fd - 1] != chunk * chunk_step);
    if (!chunk_ends) continue;
    while (vd >= 0 && (covered < chunk || to->d[vd] == 1)) {
      ts[vd] = covered * chunk_step;
      covered *= to->d[vd];
      vd--;
    }
    if (covered != chunk) return false;
    if (fd > 0) chunk_step = fs[fd - 1], chunk = 1, covered = 1;
  }
  for (; vd >= 0; vd--) ts[vd] = 1; /* leading extents of 1 */
  return true;
}

/* The run [first, first + numel(to)) of a value of shape `from` laid out
 * with strides fs, as a value of shape `to`: its strides ts and where its
 * element 0 is (*at, an element offset), or false. The run is a box of
 * `from`: whole rows of the axes after some axis a, a range along a, one
 * index along each axis before it. */
static bool run_strides(const Shape *from, const int64_t *fs, int64_t first, const Shape *to,
                        int64_t *ts, int64_t *at) {
  int64_t count = shape_numel(to), inner = 1;
  for (int a = from->ndim - 1; a >= 0; inner *= from->d[a], a--) {
    if (first % inner || count % inner) continue;
    int64_t along = count / inner, idx = first / inner;
    if (idx % from->d[a] + along > from->d[a]) continue;
    Shape box = *from;
    int64_t off = 0, rest = idx;
    for (int i = a; i >= 0; i--) {
      off += rest % from->d[i] * fs[i];
      rest /= from->d[i];
      box.d[i] = i == a ? along : 1;
    }
    *at = off;
    return view_strides(&box, fs, to, ts);
  }
  return false;
}

void graph_strided_fini(GraphStrided *s) {
  free(s->offset), free(s->base), free(s->first), free(s->strides), free(s->strided);
  memset(s, 0, sizeof *s);
}

/* Whether slot v (node id's output) may be read by strides: no graph
 * output, and each reader a node read strided itself (its input 0) or
 * one whose kernel reads it so (the reader row's reads_strided). */
static bool strided_readers_take(const Graph *g, const GraphStrided *s, const int32_t *rstart,
                                 const int32_t *readers, int id) {
  for (int o = 0; o < g->n_outputs; o++)
    if (g->outputs[o].node == id) return false;
  for (int k = rstart[id]; k < rstart[id + 1]; k++) {
    const Node *r = &g->nodes[readers[k]];
    const OpDef *def = op_def(r->kind);
    for (int j = 0; j < r->n_in; j++) {
      if (r->in[j].node != id) continue;
      if (j == 0 && s->strided[readers[k]]) continue;
      int v = s->offset[id] + r->in[j].out;
      Shape in[8];
      if (!def->reads_strided || r->n_in > 8) return false;
      for (int i = 0; i < r->n_in; i++) in[i] = *graph_shape(g, r->in[i]);
      if (!def->reads_strided(r, in, j, s->strides + (size_t)v * TEQ_MAX_DIMS)) return false;
    }
  }
  return true;
}

/* One pass in topological order: each node not refused whose outputs
 * strides can say from its input's layout is marked strided, with its
 * slots' layouts. A view of a strided value that strides cannot say
 * refuses that value's node (it must be dense); returns whether any was. */
static bool strided_forward(const Graph *g, GraphStrided *s, const int32_t *order,
                            uint8_t *refused, int64_t *firsts) {
  bool more = false;
  for (int k = 0; k < g->n_nodes; k++) {
    int id = order[k];
    const Node *n = &g->nodes[id];
    const OpDef *def = op_def(n->kind);
    s->strided[id] = 0;
    for (int j = 0; j < n->n_out; j++) s->base[s->offset[id] + j] = -1;
    if (n->n_in < 1) continue;
    int src = s->offset[n->in[0].node] + n->in[0].out;
    const Shape *in = graph_shape(g, n->in[0]);
    bool in_strided = s->base[src] >= 0;
    if (refused[id] || n->dtype != DT_F32 || n->opaque) {
      /* A view is where its input is: a dense one needs a dense input. */
      if (in_strided && graph_node_is_view(g, id, NULL)) refused[n->in[0].node] = 1, more = true;
      continue;
    }
    int64_t dense[TEQ_MAX_DIMS];
    const int64_t *from = s->strides + (size_t)src * TEQ_MAX_DIMS;
    if (!in_strided) shape_strides(in, dense), from = dense;
    int base = in_strided ? s->base[src] : src;
    int64_t at = in_strided ? s->first[src] : 0;
    bool is_view = graph_node_is_view(g, id, firsts);
    int64_t off = 0;
    if (def->strided && n->n_out == 1 && (in_strided || !is_view) && shape_numel(in) > 0 &&
        def->strided(n, in, from, s->strides + (size_t)s->offset[id] * TEQ_MAX_DIMS, &off) &&
        ((at + off) * (int64_t)sizeof(float)) % OP_PLACE_ALIGN == 0) {
      int v = s->offset[id];
      s->base[v] = base, s->first[v] = at + off;
      s->strided[id] = 1;
    } else if (def->strided && n->n_out == 1 && in_strided && !is_view) {
      refused[n->in[0].node] = 1, more = true; /* strides cannot say it: a dense input */
    } else if (in_strided && is_view) {
      bool ok = true;
      for (int j = 0; j < n->n_out && ok; j++) {
        int v = s->offset[id] + j;
        int64_t off = 0;
        ok = run_strides(in, from, firsts[j], &n->out[j], s->strides + (size_t)v * TEQ_MAX_DIMS,
                         &off) &&
             ((at + off) * (int64_t)sizeof(float)) % OP_PLACE_ALIGN == 0;
        s->base[v] = base, s->first[v] = at + off;
      }
      if (ok) {
        s->strided[id] = 1;
      } else {
        for (int j = 0; j < n->n_out; j++) s->base[s->offset[id] + j] = -1;
        refused[n->in[0].node] = 1, more = true;
      }
    }
  }
  return more;
}

int graph_strided(const Graph *g, GraphStrided *s) {
  memset(s, 0, sizeof *s);
  /* Every value dense, as before strides: what a GPU session times them
   * against (tools/gpu/session.sh, strides). */
  const char *off = getenv("TEQ_NO_STRIDES");
  bool none = off && *off && strcmp(off, "0") != 0;
  int nn = g->n_nodes, max_out = 1;
  int32_t *uses = graph_use_counts(g, &s->offset);
  free(uses);
  int32_t *order = malloc(((size_t)nn + 1) * sizeof *order);
  int32_t *rstart = NULL, *readers = NULL;
  uint8_t *refused = calloc((size_t)nn + 1, 1);
  for (int id = 0; id < nn; id++)
    if (g->nodes[id].n_out > max_out) max_out = g->nodes[id].n_out;
  int64_t *firsts = malloc((size_t)max_out * sizeof *firsts);
  int rc = uses && order && refused && firsts ? TEQ_OK : TEQ_ERR_NOMEM;
  int ns = rc ? 0 : s->offset[nn];
  if (rc == TEQ_OK) {
    s->base = malloc(((size_t)ns + 1) * sizeof *s->base);
    s->first = calloc((size_t)ns + 1, sizeof *s->first);
    s->strides = calloc(((size_t)ns + 1) * TEQ_MAX_DIMS, sizeof *s->strides);
    s->strided = calloc((size_t)nn + 1, 1);
    if (!s->base || !s->first || !s->strides || !s->strided) rc = TEQ_ERR_NOMEM;
    for (int v = 0; rc == TEQ_OK && v < ns; v++) s->base[v] = -1; /* dense until shown not */
  }
  if (rc == TEQ_OK && graph_topo_order(g, order) != TEQ_OK) rc = TEQ_ERR_INPUT;
  if (rc == TEQ_OK) rc = graph_readers(g, &rstart, &readers);
  /* Refusals only grow, so this ends: after a pass in each direction that
   * refuses nothing, every strided value's readers take it. Readers are
   * decided before what they read (reverse order), so a refusal counts
   * at once for the nodes before it. */
  for (bool more = rc == TEQ_OK && !none; more;) {
    if ((more = strided_forward(g, s, order, refused, firsts))) continue;
    for (int k = nn - 1; k >= 0; k--) {
      int id = order[k];
      if (!s->strided[id] || strided_readers_take(g, s, rstart, readers, id)) continue;
      refused[id] = 1, s->strided[id] = 0, more = true;
    }
  }
  /* Then the other way: a transpose still a kernel whose input's producer
   * it alone reads, and whose row writes strided, is written by that
   * producer through the inverse strides, straight into its memory. */
  for (int id = 0; rc == TEQ_OK && !none && id < nn; id++) {
    const Node *t = &g->nodes[id];
    if (s->strided[id] || !op_def(t->kind)->strided || t->n_out != 1 || t->dtype != DT_F32 ||
        graph_node_is_view(g, id, NULL) ||
        shape_numel(&t->out[0]) != shape_numel(graph_shape(g, t->in[0])))
      continue;
    int pid = t->in[0].node, u = s->offset[pid] + t->in[0].out;
    const Node *pn = &g->nodes[pid];
    const OpDef *pdef = op_def(pn->kind);
    if (!pdef->writes_strided || pn->n_out != 1 || s->base[u] >= 0 || pn->n_in > 8 ||
        rstart[pid + 1] - rstart[pid] != 1 || !graph_node_owns_output(g, pid))
      continue;
    bool output = false;
    for (int o = 0; o < g->n_outputs; o++) output = output || g->outputs[o].node == pid;
    if (output) continue;
    /* Output axis i of t is input axis from[i]: the hook, given each input
     * axis's number as its stride, says which. Input axis from[i] then
     * steps as output axis i does in t's dense output. */
    const Shape *in = graph_shape(g, t->in[0]);
    int r = in->ndim;
    int64_t axis[TEQ_MAX_DIMS], from[TEQ_MAX_DIMS], ts[TEQ_MAX_DIMS], ws[TEQ_MAX_DIMS];
    int64_t zero = 0;
    for (int i = 0; i < r; i++) axis[i] = i;
    if (!op_def(t->kind)->strided(t, in, axis, from, &zero) || zero != 0) continue;
    shape_strides(&t->out[0], ts);
    for (int i = 0; i < r; i++) ws[from[i]] = ts[i];
    Shape pin[8];
    for (int j = 0; j < pn->n_in; j++) pin[j] = *graph_shape(g, pn->in[j]);
    if (!pdef->writes_strided(pn, pin, ws)) continue;
    s->base[u] = s->offset[id], s->first[u] = 0;
    memcpy(s->strides + (size_t)u * TEQ_MAX_DIMS, ws, sizeof ws);
    s->strided[id] = 1;
  }
  free(order), free(rstart), free(readers), free(refused), free(firsts);
  if (rc) graph_strided_fini(s);
  return rc;
}
