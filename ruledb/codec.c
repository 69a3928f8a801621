/* codec.c: one rule side as a teq.RuleGraph protobuf message and back.
 *
 * The message numbers nodes as the variables first, then the operators in
 * topological order, so every reference points backwards and decoding
 * rebuilds the graph with graph_add_node alone, which re-checks arity,
 * parameters and edges and re-infers every shape. Kinds and parameters
 * travel by registry name (see rule.proto); only parameters that differ from
 * their defaults are written. Bytes from the database are user input: a
 * damaged or foreign message is TEQ_ERR_INPUT, never a crash. */
#include <stdlib.h>
#include <string.h>

#include "ruledb/ruledb.h"
#include "rule.pb-c.h"

/* Far beyond any rule; bounds what a damaged message can make us allocate. */
#define MAX_REFS_PER_OP (1 << 16)

/* Copies the messages a runtime call left in inner into d, each prefixed
 * with where in the message it happened, and returns rc. */
static int relay(Diag *d, Diag *inner, int rc, const char *where) {
  for (const char *line = inner->text ? inner->text : ""; *line;) {
    const char *nl = strchr(line, '\n');
    int n = nl ? (int)(nl - line) : (int)strlen(line);
    if (strncmp(line, "warning: ", 9) == 0) diag_warn(d, "%s: %.*s", where, n - 9, line + 9);
    else if (strncmp(line, "error: ", 7) == 0) diag_error(d, "%s: %.*s", where, n - 7, line + 7);
    else diag_error(d, "%s: %.*s", where, n, line);
    line += n + (nl ? 1 : 0);
  }
  if (!inner->n_errors && rc) diag_error(d, "%s: %s", where, teq_strerror(rc));
  diag_fini(inner);
  return rc;
}

/* ---- encode ---- */

/* Everything the message points into; freed together. Names, dims and
 * parameter values point into the Graph (pack only reads them). */
typedef struct Encoding {
  Teq__RuleGraph msg;
  Teq__RuleGraph__Var *vars, **var_ptrs;
  Teq__RuleGraph__Op *ops, **op_ptrs;
  Teq__RuleGraph__Ref *refs, **ref_ptrs;
  Teq__RuleGraph__Param *params, **param_ptrs;
  int32_t *order, *index; /* topological order; message index of each node */
} Encoding;

static void encoding_free(Encoding *e) {
  free(e->vars), free(e->var_ptrs), free(e->ops), free(e->op_ptrs);
  free(e->refs), free(e->ref_ptrs), free(e->params), free(e->param_ptrs);
  free(e->order), free(e->index);
}

/* Appends r, renumbered to message order, as e->refs[*k]. */
static void next_ref(Encoding *e, size_t *k, TensorRef r) {
  Teq__RuleGraph__Ref *m = &e->refs[*k];
  teq__rule_graph__ref__init(m);
  m->has_node = m->has_out = 1;
  m->node = e->index[r.node];
  m->out = r.out;
  e->ref_ptrs[(*k)++] = m;
}

/* The parameters of n that differ from the defaults, into e->params[*k...). */
static void encode_params(Encoding *e, size_t *k, const Node *n, Teq__RuleGraph__Op *op) {
  const OpDef *o = op_def(n->kind);
  Params def;
  params_default(n->kind, &def);
  op->params = &e->param_ptrs[*k];
  for (int i = 0; i < o->n_params; i++) {
    const ParamValue *v = &n->params.v[i];
    if (memcmp(v, &def.v[i], sizeof *v) == 0) continue;
    Teq__RuleGraph__Param *m = &e->params[*k];
    teq__rule_graph__param__init(m);
    m->name = (char *)o->params[i].name;
    if (o->params[i].type == PARAM_FLOAT) {
      m->has_f = 1;
      m->f = v->f;
    } else {
      m->n_ints = (size_t)v->n;
      m->ints = (int64_t *)v->i;
    }
    e->param_ptrs[(*k)++] = m;
    op->n_params++;
  }
}

/* Refuses what a rule cannot hold: constants with data, opaque nodes,
 * unnamed or non-float variables. */
static int check_storable(const Graph *g, Diag *d) {
  for (int i = 0; i < g->n_nodes; i++) {
    const Node *n = &g->nodes[i];
    const OpDef *o = op_def(n->kind);
    if (n->kind == OP_CONST || (o->flags & OPF_OPAQUE)) {
      diag_error(d, "rule side: node %d (%s): constants and opaque operators cannot be stored "
                 "in a rule", i, o->name);
      return TEQ_ERR_UNSUPPORTED;
    }
    if (n->kind == OP_INPUT && (!n->name || !n->name[0]))
      return diag_error(d, "rule side: input node %d has no name", i);
    if (n->kind == OP_INPUT && n->dtype != DT_F32) {
      diag_error(d, "rule side: input '%s' is %s; rule variables are f32", n->name,
                 dtype_name(n->dtype));
      return TEQ_ERR_UNSUPPORTED;
    }
  }
  if (g->n_outputs == 0) return diag_error(d, "rule side: no outputs");
  return TEQ_OK;
}

/* Room for every part of g's message, and its topological order. */
static int encoding_alloc(const Graph *g, Encoding *e) {
  size_t n_nodes = (size_t)g->n_nodes, n_vars = (size_t)g->n_inputs;
  size_t n_ops = n_nodes - n_vars, n_refs = (size_t)g->n_outputs;
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].kind != OP_INPUT) n_refs += (size_t)g->nodes[i].n_in;
  size_t n_params = n_ops * TEQ_MAX_PARAMS;
  e->order = malloc((n_nodes + 1) * sizeof *e->order);
  e->index = malloc((n_nodes + 1) * sizeof *e->index);
  e->vars = calloc(n_vars + 1, sizeof *e->vars);
  e->var_ptrs = calloc(n_vars + 1, sizeof *e->var_ptrs);
  e->ops = calloc(n_ops + 1, sizeof *e->ops);
  e->op_ptrs = calloc(n_ops + 1, sizeof *e->op_ptrs);
  e->refs = calloc(n_refs + 1, sizeof *e->refs);
  e->ref_ptrs = calloc(n_refs + 1, sizeof *e->ref_ptrs);
  e->params = calloc(n_params + 1, sizeof *e->params);
  e->param_ptrs = calloc(n_params + 1, sizeof *e->param_ptrs);
  if (!e->order || !e->index || !e->vars || !e->var_ptrs || !e->ops || !e->op_ptrs ||
      !e->refs || !e->ref_ptrs || !e->params || !e->param_ptrs)
    return TEQ_ERR_NOMEM;
  return TEQ_OK;
}

static int encoding_build(const Graph *g, Encoding *e, Diag *d) {
  size_t n_nodes = (size_t)g->n_nodes, n_vars = (size_t)g->n_inputs;
  int rc = encoding_alloc(g, e);
  if (rc) return rc;
  if (graph_topo_order(g, e->order) != TEQ_OK) return diag_error(d, "rule side: has a cycle");
  teq__rule_graph__init(&e->msg);
  for (size_t i = 0; i < n_vars; i++) {
    const Node *n = &g->nodes[g->inputs[i]];
    Teq__RuleGraph__Var *v = &e->vars[i];
    teq__rule_graph__var__init(v);
    v->name = n->name;
    v->n_dims = (size_t)n->out[0].ndim;
    v->dims = (int64_t *)n->out[0].d;
    e->var_ptrs[i] = v;
    e->index[g->inputs[i]] = (int32_t)i;
  }
  e->msg.inputs = e->var_ptrs;
  e->msg.n_inputs = n_vars;

  size_t k_op = 0, k_ref = 0, k_param = 0;
  for (size_t j = 0; j < n_nodes; j++) {
    const Node *n = &g->nodes[e->order[j]];
    if (n->kind == OP_INPUT) continue;
    e->index[e->order[j]] = (int32_t)(n_vars + k_op);
    Teq__RuleGraph__Op *op = &e->ops[k_op];
    teq__rule_graph__op__init(op);
    op->kind = (char *)op_def(n->kind)->name;
    op->has_n_out = 1;
    op->n_out = n->n_out;
    op->inputs = &e->ref_ptrs[k_ref];
    op->n_inputs = (size_t)n->n_in;
    for (int i = 0; i < n->n_in; i++) next_ref(e, &k_ref, n->in[i]);
    encode_params(e, &k_param, n, op);
    e->op_ptrs[k_op++] = op;
  }
  e->msg.ops = e->op_ptrs;
  e->msg.n_ops = k_op;
  e->msg.outputs = &e->ref_ptrs[k_ref];
  e->msg.n_outputs = (size_t)g->n_outputs;
  for (int i = 0; i < g->n_outputs; i++) next_ref(e, &k_ref, g->outputs[i]);
  return TEQ_OK;
}

int rule_side_encode(const Graph *g, uint8_t **buf, size_t *len, Diag *d) {
  int rc = check_storable(g, d);
  if (rc) return rc;
  Encoding e = {0};
  if ((rc = encoding_build(g, &e, d))) goto out;
  size_t n = teq__rule_graph__get_packed_size(&e.msg);
  uint8_t *b = malloc(n + 1); /* + 1: an empty message is still a buffer */
  if (!b) {
    rc = TEQ_ERR_NOMEM;
    goto out;
  }
  size_t written = teq__rule_graph__pack(&e.msg, b);
  if (written != n) {
    free(b);
    rc = TEQ_ERR_INTERNAL;
    diag_error(d, "rule side: packed %zu bytes, expected %zu", written, n);
    goto out;
  }
  *buf = b;
  *len = n;
out:
  encoding_free(&e);
  return rc;
}

/* ---- decode ---- */

/* A name from the message, fit for an error message: a damaged one may hold
 * any bytes, so those outside printable ASCII become '?', and it is cut. */
typedef struct Printable {
  char s[48];
} Printable;

static Printable printable(const char *name) {
  Printable p;
  size_t n = 0;
  for (; name[n] && n < sizeof p.s - 4; n++)
    p.s[n] = name[n] >= 0x20 && name[n] < 0x7f ? name[n] : '?';
  if (name[n]) memcpy(p.s + n, "...", 3), n += 3;
  p.s[n] = '\0';
  return p;
}

static int decode_var(Graph *g, const Teq__RuleGraph__Var *v, size_t i, Diag *d) {
  if (!v->name || !v->name[0]) return diag_error(d, "rule graph: input %zu has no name", i);
  Printable name = printable(v->name);
  for (int j = 0; j < g->n_inputs; j++)
    if (strcmp(g->nodes[g->inputs[j]].name, v->name) == 0)
      return diag_error(d, "rule graph: input %zu: the name '%s' is used twice", i, name.s);
  if (v->n_dims > TEQ_MAX_DIMS)
    return diag_error(d, "rule graph: input '%s' has %zu dims, at most %d", name.s, v->n_dims,
                      TEQ_MAX_DIMS);
  for (size_t j = 0; j < v->n_dims; j++)
    if (v->dims[j] < 0)
      return diag_error(d, "rule graph: input '%s': extent %lld out of range", name.s,
                        (long long)v->dims[j]);
  Shape s = shape_make((int)v->n_dims, v->dims); /* graph_add_input bounds the product */
  Diag inner;
  diag_init(&inner);
  int id = graph_add_input(g, v->name, &s, DT_F32, &inner);
  if (id < 0) return relay(d, &inner, id, "rule graph");
  diag_fini(&inner);
  return TEQ_OK;
}

static int decode_param(OpKind kind, const Teq__RuleGraph__Param *m, Params *p, unsigned *seen,
                        const char *where, Diag *d) {
  if (!m->name) return diag_error(d, "%s: a parameter has no name", where);
  int i = param_index(kind, m->name);
  if (i < 0) return diag_error(d, "%s: unknown parameter '%s'", where, printable(m->name).s);
  if (*seen & (1u << i)) return diag_error(d, "%s: parameter '%s' given twice", where, m->name);
  *seen |= 1u << i;
  const OpParam *r = &op_def(kind)->params[i];
  if (r->type == PARAM_FLOAT) {
    if (!m->has_f || m->n_ints)
      return diag_error(d, "%s: parameter '%s' must be one real number", where, m->name);
    param_set_float(p, i, m->f);
  } else if (r->type == PARAM_INT) {
    if (m->n_ints != 1 || m->has_f)
      return diag_error(d, "%s: parameter '%s' must be one integer", where, m->name);
    param_set_int(p, i, m->ints[0]);
  } else {
    if (m->n_ints > TEQ_MAX_PARAM_LEN || m->has_f)
      return diag_error(d, "%s: parameter '%s' must be a list of at most %d integers", where,
                        m->name, TEQ_MAX_PARAM_LEN);
    param_set_ints(p, i, m->ints, (int)m->n_ints);
  }
  return TEQ_OK;
}

/* The fields are int64 on the wire (rule.proto) so that a value past
 * int32 is seen here and refused, not cut to its low 32 bits. */
static int decode_ref(const Teq__RuleGraph__Ref *m, TensorRef *r, const char *where, Diag *d) {
  if (!m->has_node || !m->has_out)
    return diag_error(d, "%s: a tensor reference lacks its node or output", where);
  if (m->node < 0 || m->node > INT32_MAX || m->out < 0 || m->out > INT32_MAX)
    return diag_error(d, "%s: a tensor reference to node %lld, output %lld, is out of range",
                      where, (long long)m->node, (long long)m->out);
  *r = (TensorRef){(int32_t)m->node, (int32_t)m->out};
  return TEQ_OK;
}

static int decode_op(Graph *g, const Teq__RuleGraph__Op *m, size_t k, Diag *d) {
  char where[96];
  snprintf(where, sizeof where, "rule graph: op %zu", k);
  if (!m->kind) return diag_error(d, "%s: no operator kind", where);
  int kind = op_by_name(m->kind);
  if (kind < 0) return diag_error(d, "%s: unknown operator '%s'", where, printable(m->kind).s);
  snprintf(where, sizeof where, "rule graph: op %zu (%s)", k, m->kind);
  if (kind == OP_INPUT || kind == OP_CONST || (op_def(kind)->flags & OPF_OPAQUE))
    return diag_error(d, "%s: cannot appear as an operator of a rule", where);
  if (!m->has_n_out) return diag_error(d, "%s: number of outputs missing", where);
  if (m->n_out < INT32_MIN || m->n_out > INT32_MAX) /* the rest: graph_add_node's arity check */
    return diag_error(d, "%s: number of outputs %lld is out of range", where,
                      (long long)m->n_out);
  if (m->n_inputs > MAX_REFS_PER_OP)
    return diag_error(d, "%s: %zu inputs, at most %d", where, m->n_inputs, MAX_REFS_PER_OP);
  Params p;
  params_default(kind, &p);
  unsigned seen = 0;
  int rc = TEQ_OK;
  for (size_t i = 0; i < m->n_params && !rc; i++)
    rc = decode_param(kind, m->params[i], &p, &seen, where, d);
  if (rc) return rc;
  TensorRef *in = malloc((m->n_inputs + 1) * sizeof *in);
  if (!in) return TEQ_ERR_NOMEM;
  for (size_t i = 0; i < m->n_inputs && !rc; i++) rc = decode_ref(m->inputs[i], &in[i], where, d);
  if (!rc) {
    Diag inner;
    diag_init(&inner);
    int id = graph_add_node(g, kind, in, (int)m->n_inputs, (int)m->n_out, &p, NULL, &inner);
    rc = id < 0 ? relay(d, &inner, id, where) : (diag_fini(&inner), TEQ_OK);
  }
  free(in);
  return rc;
}

static int decode_graph(Graph *g, const Teq__RuleGraph *m, Diag *d) {
  int rc = TEQ_OK;
  if (m->n_inputs > INT32_MAX / 2 || m->n_ops > INT32_MAX / 2)
    return diag_error(d, "rule graph: too many nodes");
  if (graph_reserve(g, (int)(m->n_inputs + m->n_ops))) return TEQ_ERR_NOMEM;
  for (size_t i = 0; i < m->n_inputs && !rc; i++) rc = decode_var(g, m->inputs[i], i, d);
  for (size_t k = 0; k < m->n_ops && !rc; k++) rc = decode_op(g, m->ops[k], k, d);
  if (rc) return rc;
  if (m->n_outputs == 0) return diag_error(d, "rule graph: no outputs");
  for (size_t i = 0; i < m->n_outputs; i++) {
    TensorRef r;
    if ((rc = decode_ref(m->outputs[i], &r, "rule graph: output", d))) return rc;
    Diag inner;
    diag_init(&inner);
    int id = graph_add_output(g, r, NULL, &inner);
    if (id < 0) return relay(d, &inner, id, "rule graph");
    diag_fini(&inner);
  }
  return TEQ_OK;
}

int rule_side_decode(const uint8_t *buf, size_t len, Graph **out, Diag *d) {
  Teq__RuleGraph *m = teq__rule_graph__unpack(NULL, len, buf);
  if (!m)
    return diag_error(d, "rule graph: damaged, or not a teq.RuleGraph message (%zu bytes)", len);
  Graph *g = graph_new();
  int rc = g ? decode_graph(g, m, d) : TEQ_ERR_NOMEM;
  teq__rule_graph__free_unpacked(m, NULL);
  if (rc) {
    graph_free(g);
    return rc;
  }
  *out = g;
  return TEQ_OK;
}

int rule_side_ops(const Graph *g) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].kind != OP_INPUT;
  return n;
}
