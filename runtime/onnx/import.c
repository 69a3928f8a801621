/* import.c: an ONNX ModelProto into a Graph.
 * Every ONNX value name maps to an OnnxValue: a TensorRef once it is in the
 * graph, a Tensor while it is known at import (initializers, Constant nodes,
 * folded subgraphs), and its exact ONNX element type, which Teq's float32 or
 * int64 may widen. Constants enter the graph only when a computing node uses
 * them, so shape bookkeeping that folds away leaves nothing behind. Nodes go
 * in topological order. A node whose inputs are all known is evaluated now
 * (fold.c, or the registry's kernel on a scratch graph); a node with a
 * registry row becomes that kind, its parameters read from OpParam.onnx_attr
 * and then by the row's hook (accessors in node_in.c), or the few nodes of
 * the form the hook asks for (an element-wise one, a chain of binary nodes, a 2-D
 * window between reshapes: OnnxForm); anything else is kept opaque with
 * what export needs in its OpaqueInfo. Clean-up passes: passes.c. */
#include <assert.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec.h"
#include "runtime/onnx/onnx_int.h"

/* A named symbolic dimension and its extent: given in the options, or set
 * to `batch` where a graph input has it (first seen at input, dimension). */
typedef struct SymbolicDim {
  const char *name;
  int64_t value;
  bool used;
  const char *input;
  size_t axis;
} SymbolicDim;

typedef struct Importer {
  const char *path;
  OnnxExternal *external;     /* files of external data; NULL: none can be read */
  int64_t batch;              /* extent of symbolic dimensions not named in dims */
  SymbolicDim *dims;          /* the options' named extents, then names the inputs default */
  int n_dims, n_named;        /* all of them; the first n_named come from the options */
  Diag *d;
  const Onnx__ModelProto *model;
  const Onnx__GraphProto *gp;
  int opset;                  /* of the default domain */
  Graph *g;
  OnnxValue **vals;           /* each malloc'd, so pointers stay valid */
  int32_t n_vals, cap_vals;
  OnnxNames by_name;          /* value name -> index in vals */
  OnnxNames infos;            /* declared name -> index in info */
  OnnxNames read;             /* names some node (or subgraph) or a graph output reads */
  const Onnx__ValueInfoProto **info;
  const Onnx__NodeProto **unsupported; /* one node of each operator kept opaque */
  int *n_unsupported_of;
  int n_unsupported;
  bool warned_symbolic;
  bool opaque_forms;          /* the options' opaque_unsupported_forms */
  OnnxImportStats stats;
} Importer;

static int out_of_memory(Importer *im) {
  diag_error(im->d, "%s: out of memory", im->path);
  return TEQ_ERR_NOMEM;
}

/* The named symbolic dimension `name`, or NULL. */
static SymbolicDim *find_dim(const Importer *im, const char *name) {
  for (int k = 0; name && k < im->n_dims; k++)
    if (!strcmp(im->dims[k].name, name)) return &im->dims[k];
  return NULL;
}

/* ---- values ---- */

static int define_value(Importer *im, const char *name, TensorRef ref, Tensor *konst,
                        int32_t elem) {
  if (!name || !*name) {
    tensor_unref(konst);
    return TEQ_OK;
  }
  if (onnx_names_get(&im->by_name, name) >= 0) {
    tensor_unref(konst);
    return diag_error(im->d, "%s: the name '%s' is defined twice", im->path, name);
  }
  OnnxValue *v = malloc(sizeof *v);
  if (im->n_vals == im->cap_vals) {
    int32_t cap = im->cap_vals ? 2 * im->cap_vals : 64;
    OnnxValue **a = v ? realloc(im->vals, (size_t)cap * sizeof *a) : NULL;
    if (a) im->vals = a, im->cap_vals = cap;
  }
  if (!v || im->n_vals == im->cap_vals ||
      onnx_names_put(&im->by_name, name, im->n_vals) != TEQ_OK) {
    free(v);
    tensor_unref(konst);
    return out_of_memory(im);
  }
  *v = (OnnxValue){.name = name, .ref = ref, .konst = konst, .elem = elem};
  im->vals[im->n_vals++] = v;
  return TEQ_OK;
}

static OnnxValue *find_value(const Importer *im, const char *name) {
  int32_t i = onnx_names_get(&im->by_name, name);
  return i < 0 ? NULL : im->vals[i];
}

/* The value's TensorRef, adding its constant to the graph on first use. */
static int materialize(Importer *im, OnnxValue *v, TensorRef *ref) {
  if (v->ref.node < 0) {
    int id = graph_add_const(im->g, v->name, tensor_ref(v->konst), im->d);
    if (id < 0) return id; /* graph_add_const dropped the reference it was given */
    v->ref = (TensorRef){id, 0};
  }
  *ref = v->ref;
  return TEQ_OK;
}

/* ---- messages ---- */

/* Moves the messages graph functions wrote into `from` to d, each after
 * `where`; `from` is emptied. Lines are "error: ..." or "warning: ...". */
static void forward_messages(Diag *from, Diag *d, const char *where) {
  const char *sep = where ? ": " : ""; /* where NULL: the messages as they are */
  where = where ? where : "";
  for (char *line = from->text; line && *line;) {
    char *nl = strchr(line, '\n');
    int n = nl ? (int)(nl - line) : (int)strlen(line);
    if (strncmp(line, "warning: ", 9) == 0)
      diag_warn(d, "%s%s%.*s", where, sep, n - 9, line + 9);
    else if (strncmp(line, "error: ", 7) == 0)
      diag_error(d, "%s%s%.*s", where, sep, n - 7, line + 7);
    else
      diag_error(d, "%s%s%.*s", where, sep, n, line);
    line += n + (nl != NULL);
  }
  diag_fini(from);
}

/* ---- one node ---- */

static int node_in_init(Importer *im, const Onnx__NodeProto *np, int index, OnnxNodeIn *v) {
  *v = (OnnxNodeIn){.path = im->path, .np = np, .index = index, .opset = im->opset,
                    .g = im->g, .n_in = (int)np->n_input, .read = &im->read, .d = im->d};
  for (int k = 0; k < (int)np->n_output; k++)
    if (*np->output[k]) v->n_out = k + 1;
  v->in = calloc(np->n_input + 1, sizeof *v->in);
  v->consumed = calloc(np->n_input + 1, sizeof *v->consumed);
  v->attr_read = calloc(np->n_attribute + 1, sizeof *v->attr_read);
  if (!v->in || !v->consumed || !v->attr_read) return out_of_memory(im);
  for (int i = 0; i < v->n_in; i++) {
    if (!*np->input[i]) continue;
    v->in[i] = find_value(im, np->input[i]);
    if (!v->in[i])
      return onnx_in_error(v, im->d, "input '%s' is not a graph input, an initializer or the "
                                     "output of any node", np->input[i]);
  }
  return TEQ_OK;
}

static void node_in_fini(OnnxNodeIn *v) {
  for (int i = 0; i < v->n_strings; i++) free(v->strings[i]);
  free(v->strings);
  free(v->in);
  free(v->consumed);
  free(v->attr_read);
}

static bool inputs_all_const(const OnnxNodeIn *v) {
  for (int i = 0; i < v->n_in; i++)
    if (v->in[i] && !v->in[i]->konst) return false;
  return true;
}

static int32_t input_elem(const OnnxNodeIn *v, int i) {
  return onnx_in_has_input(v, i) ? v->in[i]->elem : 0;
}

/* The ONNX element type of a value Teq holds as dt, computed by node v:
 * float is float; an int64 result of a registry operator moved input 0's
 * elements (only layout operators keep int64), so it has their type. */
static int32_t computed_elem(const OnnxNodeIn *v, DType dt) {
  if (dt == DT_F32) return ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
  int32_t e = input_elem(v, 0);
  return e ? e : ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
}

static int define_outputs_const(Importer *im, const OnnxNodeIn *v, Tensor **out, int32_t elem) {
  int rc = TEQ_OK;
  for (int o = 0; o < v->n_out; o++) {
    int32_t e = elem ? elem : computed_elem(v, out[o]->dtype);
    if (rc == TEQ_OK) rc = define_value(im, v->np->output[o], (TensorRef){-1, 0}, out[o], e);
    else tensor_unref(out[o]);
  }
  return rc;
}

/* Output o of v is output o of node id, of ONNX element type elems[o]. */
static int define_outputs_ref(Importer *im, const OnnxNodeIn *v, int id, const int32_t *elems) {
  for (int o = 0; o < v->n_out; o++) {
    int rc = define_value(im, v->np->output[o], (TensorRef){id, o}, NULL, elems[o]);
    if (rc != TEQ_OK) return rc;
  }
  return TEQ_OK;
}

/* Reads every parameter with an onnx_attr, then lets the row's hook read
 * the rest; warns about attributes nobody read. */
static int read_params(Importer *im, OnnxNodeIn *v, OpKind kind, Params *p) {
  const OpDef *o = op_def(kind);
  memset(v->attr_read, 0, v->np->n_attribute * sizeof *v->attr_read);
  params_default(kind, p);
  for (int i = 0; i < o->n_params; i++) {
    const OpParam *r = &o->params[i];
    int64_t x[TEQ_MAX_PARAM_LEN];
    double f;
    int n;
    if (!r->onnx_attr) continue;
    if (r->type == PARAM_INT && onnx_in_attr_int(v, r->onnx_attr, x)) param_set_int(p, i, x[0]);
    if (r->type == PARAM_INTS && onnx_in_attr_ints(v, r->onnx_attr, x, TEQ_MAX_PARAM_LEN, &n))
      param_set_ints(p, i, x, n);
    if (r->type == PARAM_FLOAT && onnx_in_attr_float(v, r->onnx_attr, &f)) param_set_float(p, i, f);
  }
  int rc = v->failed ? TEQ_ERR_INPUT : TEQ_OK;
  if (rc == TEQ_OK && o->onnx_read) rc = o->onnx_read(v, p, im->d);
  if (rc == TEQ_OK && v->failed) rc = TEQ_ERR_INPUT;
  if (rc != TEQ_OK || v->form == ONNX_FORM_KIND) return rc; /* the other row reads the rest */
  char list[512] = "", where[512];
  size_t len = 0;
  for (size_t k = 0; k < v->np->n_attribute && len < sizeof list; k++)
    if (!v->attr_read[k])
      len += (size_t)snprintf(list + len, sizeof list - len, "%s'%s'", len ? ", " : "",
                              v->np->attribute[k]->name);
  if (len)
    diag_warn(im->d, "%s: ignored attribute(s) %s", onnx_in_where(v, where, sizeof where), list);
  return TEQ_OK;
}

/* The inputs that become edges: not consumed, trailing empty ones dropped. */
static int collect_edges(const OnnxNodeIn *v, OnnxValue **edges, int *n_edges, Diag *d) {
  int last = -1, n = 0;
  for (int i = 0; i < v->n_in; i++)
    if (!v->consumed[i] && v->in[i]) last = i;
  for (int i = 0; i <= last; i++) {
    if (v->consumed[i]) continue;
    if (!v->in[i])
      return onnx_in_unsupported(v, d, "optional input %d is empty, which is supported only "
                                       "when later inputs are empty too", i);
    edges[n++] = v->in[i];
  }
  *n_edges = n;
  return TEQ_OK;
}

/* Input `in` of g with a unit axis 2 inserted ([N, C, L] -> [N, C, 1, L]):
 * a constant reshaped now (its copy named as it is), anything else through
 * a reshape node. Its id, or an error (in d). */
static int raised_input(Graph *g, TensorRef in, Diag *d) {
  const Shape *s = graph_shape(g, in);
  if (s->ndim != 3) {
    diag_error(d, "a window over one spatial axis needs inputs of known rank 3");
    return TEQ_ERR_UNSUPPORTED;
  }
  Shape raised = shape_of(4, 0, 0, 1, 0);
  raised.d[0] = s->d[0], raised.d[1] = s->d[1], raised.d[3] = s->d[2];
  const Node *src = &g->nodes[in.node];
  if (src->kind == OP_CONST) {
    Tensor *t = tensor_clone(src->value);
    char *name = src->name ? strdup(src->name) : NULL; /* adding a node may move src */
    if (!t || (src->name && !name)) {
      tensor_unref(t);
      free(name);
      diag_error(d, "out of memory");
      return TEQ_ERR_NOMEM;
    }
    t->shape = raised;
    t->content_hash = 0;
    int id = graph_add_const(g, name, t, d);
    free(name);
    return id;
  }
  Params p;
  params_default(OP_RESHAPE, &p);
  param_set_ints(&p, param_index(OP_RESHAPE, "shape"), raised.d, 4);
  return graph_add_node(g, OP_RESHAPE, &in, 1, 1, &p, NULL, d);
}

/* One layout step of kind (p its parameters) after x in g, or where x is
 * a constant, its result computed now: a reshape of a constant is its
 * shape changed, anything else is run by the registry's kernel in a
 * scratch graph. Where the result is, in *out; an error (in d) otherwise. */
static int arrange_step(Graph *g, OpKind kind, const Params *p, TensorRef *x, Diag *d) {
  const Node *src = &g->nodes[x->node];
  Tensor *t = NULL;
  int rc = TEQ_OK;
  if (src->kind == OP_CONST && kind == OP_RESHAPE) {
    if (!(t = tensor_clone(src->value))) return diag_error(d, "out of memory"), TEQ_ERR_NOMEM;
    const ParamValue *shape = &p->v[param_index(OP_RESHAPE, "shape")];
    t->shape = shape_make(shape->n, shape->i);
    t->content_hash = 0;
  } else if (src->kind == OP_CONST) {
    Graph *scratch = graph_new();
    rc = scratch ? TEQ_OK : TEQ_ERR_NOMEM;
    int c = rc ? -1 : graph_add_const(scratch, NULL, tensor_ref(src->value), d);
    int id = c < 0 ? c : graph_add_node(scratch, kind, &(TensorRef){c, 0}, 1, 1, p, NULL, d);
    if (!rc && id < 0) rc = id;
    if (!rc && graph_add_output(scratch, (TensorRef){id, 0}, "out", d) < 0) rc = TEQ_ERR_INPUT;
    if (!rc) rc = exec_run(scratch, EXEC_F32, NULL, &t, d);
    graph_free(scratch);
    if (rc == TEQ_ERR_NOMEM) diag_error(d, "out of memory");
  } else {
    int id = graph_add_node(g, kind, x, 1, 1, p, NULL, d);
    if (id < 0) return id;
    *x = (TensorRef){id, 0};
    return TEQ_OK;
  }
  int id = rc ? rc : graph_add_const(g, NULL, t, d);
  if (id < 0) return id;
  *x = (TensorRef){id, 0};
  return TEQ_OK;
}

/* x laid out as a says (OnnxArrange: transposed, summed, reshaped; for
 * the output, reshape_first, reshaped then transposed), each step left out
 * where it changes nothing. Where the result is, in *out. */
static int arranged(Graph *g, TensorRef x, const OnnxArrange *a, bool reshape_first,
                    TensorRef *out, Diag *d) {
  *out = x;
  enum { TRANSPOSE, SUM, RESHAPE };
  const int input_order[] = {TRANSPOSE, SUM, RESHAPE}, output_order[] = {RESHAPE, TRANSPOSE};
  const int *order = reshape_first ? output_order : input_order;
  for (int k = 0; k < (reshape_first ? 2 : 3); k++) {
    const Shape *s = graph_shape(g, *out);
    bool identity = true;
    for (int j = 0; j < a->n_perm; j++) identity = identity && a->perm[j] == j;
    OpKind kind = order[k] == TRANSPOSE ? OP_TRANSPOSE : order[k] == SUM ? OP_REDUCE_SUM
                                                                          : OP_RESHAPE;
    Params p;
    params_default(kind, &p);
    if (order[k] == TRANSPOSE) {
      if (identity) continue;
      param_set_ints(&p, param_index(kind, "perm"), a->perm, a->n_perm);
    } else if (order[k] == SUM) {
      if (!a->n_sum) continue;
      int64_t axes[TEQ_MAX_DIMS];
      for (int j = 0; j < a->n_sum; j++) axes[j] = s->ndim - a->n_sum + j;
      param_set_ints(&p, param_index(kind, "axes"), axes, a->n_sum);
      param_set_int(&p, param_index(kind, "keepdims"), 0);
    } else {
      if (!a->reshape || shape_equal(s, &a->shape)) continue;
      param_set_ints(&p, param_index(kind, "shape"), a->shape.d, a->shape.ndim);
    }
    int rc = arrange_step(g, kind, &p, out, d);
    if (rc) return rc;
  }
  return TEQ_OK;
}

/* Node v, of kind with parameters p on inputs in[0..n_in), added to g in
 * the form its row asked for (OnnxForm); out[0..v->n_out) receive where
 * its outputs are. The node of the row's kind that produces them carries
 * name. Returns TEQ_OK or an error (in d). */
static int add_in_form(Graph *g, const OnnxNodeIn *v, OpKind kind, const Params *p,
                       const TensorRef *in, int n_in, const char *name, TensorRef *out,
                       Diag *d) {
  if (v->form == ONNX_FORM_CHAIN) {
    assert(n_in >= 2);
    int id = -1;
    for (int i = 1; i < n_in; i++) {
      bool last = i + 1 == n_in; /* the registry checks the outputs asked of it */
      TensorRef pair[2] = {id < 0 ? in[0] : (TensorRef){id, 0}, in[i]};
      id = graph_add_node(g, kind, pair, 2, last ? v->n_out : 1, p, last ? name : NULL, d);
      if (id < 0) return id;
    }
    for (int o = 0; o < v->n_out; o++) out[o] = (TensorRef){id, o};
    return TEQ_OK;
  }
  if (v->form == ONNX_FORM_ARRANGED) {
    assert(n_in <= ONNX_ARRANGED_MAX_IN && v->n_out == 1);
    TensorRef at[ONNX_ARRANGED_MAX_IN];
    for (int i = 0; i < n_in; i++) {
      int rc = arranged(g, in[i], &v->arrange_in[i], false, &at[i], d);
      if (rc) return rc;
    }
    int id = graph_add_node(g, kind, at, n_in, 1, p, name, d);
    if (id < 0) return id;
    return arranged(g, (TensorRef){id, 0}, &v->arrange_out, true, &out[0], d);
  }
  if (v->form != ONNX_FORM_RAISED) {
    int id = graph_add_node(g, kind, in, n_in, v->n_out, p, name, d);
    for (int o = 0; o < v->n_out && id >= 0; o++) out[o] = (TensorRef){id, o};
    return id < 0 ? id : TEQ_OK;
  }
  TensorRef raised[8];
  assert(n_in <= 8 && v->n_out == 1); /* conv and pool rows: three inputs, one output */
  for (int i = 0; i < n_in; i++) {
    int id = v->raised_inputs & (1u << i) ? raised_input(g, in[i], d) : in[i].node;
    if (id < 0) return id;
    raised[i] = (TensorRef){id, v->raised_inputs & (1u << i) ? 0 : in[i].out};
  }
  int id = graph_add_node(g, kind, raised, n_in, 1, p, name, d);
  if (id < 0) return id;
  const Shape *y = &g->nodes[id].out[0]; /* [N, M, 1, L'] */
  int64_t lowered[3] = {y->d[0], y->d[1], y->d[3]};
  Params rp;
  params_default(OP_RESHAPE, &rp);
  param_set_ints(&rp, param_index(OP_RESHAPE, "shape"), lowered, 3);
  int back = graph_add_node(g, OP_RESHAPE, &(TensorRef){id, 0}, 1, 1, &rp, NULL, d);
  out[0] = (TensorRef){back, 0};
  return back < 0 ? back : TEQ_OK;
}

/* Evaluates a registry node on constant edges in a scratch graph and sets
 * *folded. A failure to evaluate just means "not folded": the node then
 * goes into the graph, where a real problem is reported with its location;
 * the error returned is only that of defining the results. */
static int fold_with_registry(Importer *im, const OnnxNodeIn *v, OpKind kind, const Params *p,
                              OnnxValue **edges, int n_edges, bool *folded) {
  Diag quiet;
  diag_init(&quiet);
  Graph *s = graph_new();
  TensorRef *in = calloc((size_t)n_edges + 1, sizeof *in);
  TensorRef *res = calloc((size_t)v->n_out + 1, sizeof *res);
  Tensor **out = calloc((size_t)v->n_out + 1, sizeof *out);
  int rc = s && in && res && out ? TEQ_OK : TEQ_ERR_NOMEM;
  for (int i = 0; i < n_edges && rc == TEQ_OK; i++) {
    int id = graph_add_const(s, NULL, tensor_ref(edges[i]->konst), &quiet); /* takes the ref */
    rc = id < 0 ? id : TEQ_OK;
    in[i] = (TensorRef){id, 0};
  }
  if (rc == TEQ_OK) rc = add_in_form(s, v, kind, p, in, n_edges, NULL, res, &quiet);
  for (int o = 0; o < v->n_out && rc == TEQ_OK; o++) {
    int r = graph_add_output(s, res[o], "out", &quiet);
    rc = r < 0 ? r : TEQ_OK;
  }
  if (rc == TEQ_OK) rc = exec_run(s, EXEC_F32, NULL, out, &quiet);
  *folded = rc == TEQ_OK;
  if (*folded) {
    rc = define_outputs_const(im, v, out, 0);
    im->stats.n_folded++;
  }
  /* quiet's messages are dropped: the graph reports the node's own error */
  if (!*folded) rc = TEQ_OK;
  free(in);
  free(res);
  free(out);
  graph_free(s);
  diag_fini(&quiet);
  return rc;
}

static int add_registry_node(Importer *im, const OnnxNodeIn *v, OpKind kind, const Params *p,
                             OnnxValue **edges, int n_edges) {
  TensorRef *in = calloc((size_t)n_edges + 1, sizeof *in);
  TensorRef *res = calloc((size_t)v->n_out + 1, sizeof *res);
  if (!in || !res) {
    free(in);
    free(res);
    return out_of_memory(im);
  }
  int rc = TEQ_OK;
  for (int i = 0; i < n_edges && rc == TEQ_OK; i++) rc = materialize(im, edges[i], &in[i]);
  if (rc == TEQ_OK) {
    Diag local;
    diag_init(&local);
    const char *name = v->np->name && *v->np->name ? v->np->name : NULL;
    rc = add_in_form(im->g, v, kind, p, in, n_edges, name, res, &local);
    char where[512];
    forward_messages(&local, im->d, onnx_in_where(v, where, sizeof where));
    for (int o = 0; o < v->n_out && rc == TEQ_OK; o++) {
      TensorRef r = res[o];
      rc = define_value(im, v->np->output[o], r, NULL,
                        computed_elem(v, im->g->nodes[r.node].dtype));
    }
  }
  free(in);
  free(res);
  return rc;
}

/* Whether input i of v comes without a shape from an opaque node. */
static bool unknown_opaque_input(const Importer *im, const OnnxNodeIn *v, int i) {
  const OnnxValue *x = v->in[i];
  return x && !x->konst && x->ref.node >= 0 && im->g->nodes[x->ref.node].kind == OP_OPAQUE &&
         !shape_is_known(graph_shape(im->g, x->ref));
}

/* After v failed: says which of its inputs come without a shape from an
 * operator Teq does not know, and how to give the model those shapes. */
static void explain_unknown_inputs(const Importer *im, const OnnxNodeIn *v) {
  for (int i = 0; i < v->n_in; i++) {
    if (!unknown_opaque_input(im, v, i)) continue;
    const OnnxValue *x = v->in[i];
    const Node *p = &im->g->nodes[x->ref.node];
    char where[512];
    diag_error(im->d, "%s: input %d ('%s') comes from node '%s' (%s), an operator Teq does not "
                     "know, and the model does not declare its shape; "
                     "onnx.shape_inference.infer_shapes writes the shapes into the model",
              onnx_in_where(v, where, sizeof where), i, x->name,
              p->name ? p->name : "?", p->opaque->op_type);
  }
}

static int import_registry_node(Importer *im, OnnxNodeIn *v, OpKind kind) {
  Params p;
  v->form = ONNX_FORM_ONE;
  int n_edges = 0, rc = read_params(im, v, kind, &p);
  if (rc == TEQ_OK && v->form == ONNX_FORM_KIND) { /* once: the other row decides */
    kind = v->form_kind;
    v->form = ONNX_FORM_ONE;
    rc = read_params(im, v, kind, &p);
    if (rc == TEQ_OK && v->form == ONNX_FORM_KIND)
      rc = onnx_in_error(v, im->d, "handed on twice (registry)");
  }
  OnnxValue **edges = rc == TEQ_OK ? calloc((size_t)v->n_in + 1, sizeof *edges) : NULL;
  if (rc == TEQ_OK && !edges) return out_of_memory(im);
  if (rc == TEQ_OK) rc = collect_edges(v, edges, &n_edges, im->d);
  if (rc == TEQ_OK && v->form == ONNX_FORM_ELEMENTWISE) {
    /* what else the node reads (a reduction's axes) was taken as parameters */
    kind = v->form_kind;
    params_default(kind, &p);
    if (n_edges > 1) n_edges = 1;
  }
  const OpDef *o = op_def(kind);
  /* A residual input is Teq's own (graph_fuse_residuals folds one in):
   * ONNX's Conv and Gemm end before it, and a fourth input there is no
   * shortcut the file meant. */
  if (rc == TEQ_OK && o->residual_input > 0 && n_edges > o->residual_input)
    rc = onnx_in_error(v, im->d, "takes at most %d inputs, got %d", o->residual_input, n_edges);
  bool known = rc == TEQ_OK, folded = false;
  for (int i = 0; i < n_edges && known; i++) known = edges[i]->konst != NULL;
  if (known && o->eval_f32 && !(o->flags & OPF_SOURCE))
    rc = fold_with_registry(im, v, kind, &p, edges, n_edges, &folded);
  if (rc == TEQ_OK && !folded) rc = add_registry_node(im, v, kind, &p, edges, n_edges);
  free(edges);
  if (rc != TEQ_OK && rc != TEQ_ERR_NOMEM) explain_unknown_inputs(im, v);
  return rc;
}

/* ---- opaque nodes ---- */

static bool is_default_domain(const char *domain) {
  return !domain || !*domain || strcmp(domain, "ai.onnx") == 0;
}

static int domain_opset(const Onnx__ModelProto *m, const char *domain) {
  for (size_t k = 0; k < m->n_opset_import; k++) {
    const Onnx__OperatorSetIdProto *o = m->opset_import[k];
    bool same = is_default_domain(domain) ? is_default_domain(o->domain)
                                          : o->domain && strcmp(o->domain, domain) == 0;
    if (same && o->has_version) return (int)o->version;
  }
  return -1;
}

static bool same_operator(const Onnx__NodeProto *a, const Onnx__NodeProto *b) {
  bool a_default = is_default_domain(a->domain), b_default = is_default_domain(b->domain);
  return strcmp(a->op_type, b->op_type) == 0 && a_default == b_default &&
         (a_default || strcmp(a->domain, b->domain) == 0);
}

static int note_unsupported(Importer *im, const Onnx__NodeProto *np) {
  for (int k = 0; k < im->n_unsupported; k++)
    if (same_operator(im->unsupported[k], np)) {
      im->n_unsupported_of[k]++;
      return TEQ_OK;
    }
  int n = im->n_unsupported + 1;
  const Onnx__NodeProto **ops = realloc(im->unsupported, (size_t)n * sizeof *ops);
  if (ops) im->unsupported = ops;
  int *counts = ops ? realloc(im->n_unsupported_of, (size_t)n * sizeof *counts) : NULL;
  if (!counts) return out_of_memory(im);
  im->n_unsupported_of = counts;
  ops[n - 1] = np;
  counts[n - 1] = 1;
  im->n_unsupported = n;
  return TEQ_OK;
}

static void warn_unsupported(const Importer *im) {
  for (int k = 0; k < im->n_unsupported; k++) {
    int n = im->n_unsupported_of[k];
    const Onnx__NodeProto *np = im->unsupported[k];
    bool custom = !is_default_domain(np->domain);
    diag_warn(im->d, "%s: %d node%s of unsupported operator '%s'%s%s%s kept as opaque", im->path,
              n, n == 1 ? "" : "s", np->op_type, custom ? " (domain " : "",
              custom ? np->domain : "", custom ? ")" : "");
  }
}

static bool has_subgraph(const Onnx__NodeProto *np) {
  for (size_t k = 0; k < np->n_attribute; k++) {
    int t = onnx_attr_type(np->attribute[k]);
    if (t == ONNX_ATTR(GRAPH) || t == ONNX_ATTR(GRAPHS)) return true;
  }
  return false;
}

/* What value_info (or a graph output) declares for name: its element type
 * (0 if none) and its extents, -1 where symbolic (a name the graph inputs
 * have is their extent); rank SHAPE_UNKNOWN if none. */
static int32_t declared_type(const Importer *im, const char *name, Shape *s) {
  memset(s, 0, sizeof *s);
  s->ndim = SHAPE_UNKNOWN;
  int32_t k = onnx_names_get(&im->infos, name);
  const Onnx__TypeProto *tp = k >= 0 ? im->info[k]->type : NULL;
  if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type) return 0;
  const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
  if (tt->shape && tt->shape->n_dim <= TEQ_MAX_DIMS) {
    s->ndim = (int32_t)tt->shape->n_dim;
    for (size_t i = 0; i < tt->shape->n_dim; i++) {
      const Onnx__TensorShapeProto__Dimension *dm = tt->shape->dim[i];
      bool known = dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
      const SymbolicDim *sd =
          dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM
              ? find_dim(im, dm->dim_param) : NULL;
      s->d[i] = known && dm->dim_value >= 0 ? dm->dim_value : sd ? sd->value : -1;
    }
  }
  return tt->has_elem_type ? tt->elem_type : 0;
}

/* The shape Teq works with: known only where every extent is a number,
 * since an opaque output's symbolic extents may depend on its data. */
static Shape known_part(const Shape *declared) {
  Shape s = *declared;
  for (int i = 0; i < s.ndim; i++)
    if (s.d[i] < 0) s.ndim = SHAPE_UNKNOWN;
  if (!shape_is_known(&s)) memset(s.d, 0, sizeof s.d);
  return s;
}

static bool in_list(const char *op, const char *const *list) {
  for (; *list; list++)
    if (strcmp(op, *list) == 0) return true;
  return false;
}

/* ONNX operators Teq has no registry row for (an operator with a row is
 * never opaque, so it must not be listed) whose one output has the numpy
 * broadcast of their input shapes (the input's shape, for one input):
 * enough to keep shapes known past the masks and comparisons models are
 * full of when nothing declares them. Comparisons make bool; Cast makes
 * its `to`, and the random ones (Bernoulli, Random*Like) their `dtype`;
 * Where picks from inputs 1 and 2; the rest keep input 0's type. */
static const char *const elementwise_ops[] = {
    "Acos", "Acosh", "And", "Asin", "Asinh", "Atan", "Atanh", "Bernoulli", "BitShift", "BitwiseAnd",
    "BitwiseNot", "BitwiseOr", "BitwiseXor", "Cast", "Ceil", "Cos", "Cosh", "Equal", "Floor",
    "Greater", "GreaterOrEqual", "Hardmax", "IsInf", "IsNaN", "Less", "LessOrEqual", "Mod",
    "Not", "Or", "RandomNormalLike", "RandomUniformLike", "Round", "Shrink", "Sign",
    "Sin", "Sinh", "Softsign", "Tan", "Where", "Xor", NULL};
static const char *const comparison_ops[] = {"Equal", "Greater", "GreaterOrEqual", "IsInf", "IsNaN",
                                            "Less", "LessOrEqual", NULL};

/* Expand broadcasts its input to a shape given as a constant. */
static void expand_output(const OnnxNodeIn *v, OpaqueInfo *info) {
  const Tensor *t = onnx_in_const_input(v, 1);
  const Shape *x = onnx_in_input_shape(v, 0);
  if (info->n_out != 1 || !x || !t || t->dtype != DT_I64 || t->shape.ndim != 1 ||
      t->shape.d[0] > TEQ_MAX_DIMS)
    return;
  Shape target = shape_make((int)t->shape.d[0], t->data), s;
  if (!info->out_elem[0]) info->out_elem[0] = input_elem(v, 0);
  if (!shape_is_known(&info->out_declared[0]) && shape_broadcast(x, &target, &s, NULL) == TEQ_OK)
    info->out_declared[0] = s;
}

static void elementwise_output(const OnnxNodeIn *v, OpaqueInfo *info) {
  const char *op = v->np->op_type;
  if (strcmp(op, "Expand") == 0) expand_output(v, info);
  if (info->n_out != 1 || !in_list(op, elementwise_ops)) return;
  const Onnx__NodeProto *np = v->np;
  int32_t *elem = &info->out_elem[0];
  if (!*elem && in_list(op, comparison_ops)) *elem = ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
  /* Cast's `to`; the random operators' `dtype` (absent: input 0's type) */
  const char *type_attr = strcmp(op, "Cast") == 0 ? "to" : "dtype";
  for (size_t k = 0; !*elem && k < np->n_attribute; k++)
    if (strcmp(np->attribute[k]->name, type_attr) == 0) *elem = (int32_t)np->attribute[k]->i;
  if (!*elem) *elem = input_elem(v, strcmp(op, "Where") == 0 ? 1 : 0);
  if (shape_is_known(&info->out_declared[0])) return;
  Shape s = {0};
  for (int i = 0; i < v->n_in; i++) {
    const Shape *si = onnx_in_input_shape(v, i);
    if (v->in[i] && (!si || shape_broadcast(&s, si, &s, NULL) != TEQ_OK)) return;
  }
  info->out_declared[0] = s;
}

/* The node as export will need it: the NodeProto as read (its doc_string
 * included), the opset of its domain, and the element types and declared
 * shapes of its values. */
static int opaque_info_make(Importer *im, const OnnxNodeIn *v, OpaqueInfo **out) {
  const Onnx__NodeProto *np = v->np;
  OpaqueInfo *info = calloc(1, sizeof *info);
  if (!info) return out_of_memory(im);
  int opset = domain_opset(im->model, is_default_domain(np->domain) ? "" : np->domain);
  info->opset = opset > 0 ? opset : 1;
  info->op_type = strdup(np->op_type);
  info->domain = strdup(is_default_domain(np->domain) ? "" : np->domain);
  info->in_elem = calloc(np->n_input + 1, sizeof *info->in_elem);
  info->out_elem = calloc(np->n_output + 1, sizeof *info->out_elem);
  info->out_declared = calloc(np->n_output + 1, sizeof *info->out_declared);
  if (!info->op_type || !info->domain || !info->in_elem || !info->out_elem ||
      !info->out_declared || onnx_pack(&np->base, &info->proto, &info->proto_len) != TEQ_OK) {
    opaque_info_free(info);
    return out_of_memory(im);
  }
  for (int i = 0; i < v->n_in; i++)
    if (v->in[i]) info->in_elem[info->n_in++] = v->in[i]->elem;
  for (size_t o = 0; o < np->n_output; o++)
    info->out_elem[info->n_out++] = declared_type(im, np->output[o], &info->out_declared[o]);
  if (is_default_domain(np->domain)) elementwise_output(v, info);
  *out = info;
  return TEQ_OK;
}

/* Adds the opaque node (taking over info) with the shapes info declares. */
static int add_opaque(Importer *im, const OnnxNodeIn *v, OpaqueInfo *info, TensorRef *in,
                      Shape *shapes, DType *dts) {
  int n_in = 0, n_out = info->n_out, rc = TEQ_OK;
  for (int i = 0; i < v->n_in && rc == TEQ_OK; i++)
    if (v->in[i]) rc = materialize(im, v->in[i], &in[n_in++]);
  if (rc != TEQ_OK) {
    opaque_info_free(info);
    return rc;
  }
  for (int o = 0; o < n_out; o++) {
    shapes[o] = known_part(&info->out_declared[o]);
    if (!onnx_elem_dtype(info->out_elem[o], &dts[o])) dts[o] = DT_F32;
  }
  Diag local;
  diag_init(&local);
  const char *name = v->np->name && *v->np->name ? v->np->name : NULL;
  int id = graph_add_opaque(im->g, info, in, n_in, n_out, shapes, dts, name, &local);
  char where[512];
  forward_messages(&local, im->d, onnx_in_where(v, where, sizeof where));
  return id < 0 ? id : define_outputs_ref(im, v, id, im->g->nodes[id].opaque->out_elem);
}

/* note: count the node's operator among the unknown ones (warn_unsupported). */
static int import_opaque(Importer *im, OnnxNodeIn *v, bool note) {
  const Onnx__NodeProto *np = v->np;
  if (has_subgraph(np))
    return onnx_in_unsupported(v, im->d,
                               "operators with subgraphs (If, Loop, Scan) are not supported");
  if (np->n_output == 0) {
    char where[512];
    diag_warn(im->d, "%s: has no outputs and is left out", onnx_in_where(v, where, sizeof where));
    return TEQ_OK;
  }
  OpaqueInfo *info = NULL;
  int rc = note ? note_unsupported(im, np) : TEQ_OK;
  if (rc == TEQ_OK) rc = opaque_info_make(im, v, &info);
  TensorRef *in = calloc(np->n_input + 1, sizeof *in);
  Shape *shapes = calloc(np->n_output, sizeof *shapes);
  DType *dts = calloc(np->n_output, sizeof *dts);
  if (rc == TEQ_OK && !(in && shapes && dts)) {
    opaque_info_free(info);
    rc = out_of_memory(im);
  } else if (rc == TEQ_OK) {
    rc = add_opaque(im, v, info, in, shapes, dts);
  }
  if (rc == TEQ_OK) im->stats.n_opaque++;
  free(in);
  free(shapes);
  free(dts);
  return rc;
}

/* ---- nodes in order ---- */

/* The ONNX element type of what fold.c computed for v: what the operator
 * says it makes, else the type of the input whose elements it moved. */
static int32_t folded_elem(const OnnxNodeIn *v, const Tensor *out) {
  const char *op = v->np->op_type;
  if (strcmp(op, "Cast") == 0 || strcmp(op, "Constant") == 0 || strcmp(op, "ConstantOfShape") == 0)
    for (size_t k = 0; k < v->np->n_attribute; k++) {
      const Onnx__AttributeProto *a = v->np->attribute[k];
      if (strcmp(a->name, "to") == 0) return (int32_t)a->i;
      if (a->t && a->t->has_data_type) return a->t->data_type;
    }
  if (in_list(op, comparison_ops)) return ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
  if (strcmp(op, "Where") == 0) return input_elem(v, 1);
  if (strcmp(op, "Shape") == 0 || strcmp(op, "Size") == 0) return onnx_dtype_elem(out->dtype);
  return input_elem(v, 0) ? input_elem(v, 0) : onnx_dtype_elem(out->dtype);
}

/* A Cast of a computed value to the type it already has names that same
 * value (exporters write them around every type-generic subgraph). */
static bool is_same_type_cast(const OnnxNodeIn *v) {
  if (strcmp(v->np->op_type, "Cast") != 0 || v->n_in != 1 || !v->in[0] || v->in[0]->konst ||
      v->n_out != 1 || v->np->n_attribute != 1 || strcmp(v->np->attribute[0]->name, "to") != 0 ||
      onnx_attr_type(v->np->attribute[0]) != ONNX_ATTR(INT))
    return false;
  return v->in[0]->elem != 0 && v->np->attribute[0]->i == v->in[0]->elem;
}

static int import_default_domain(Importer *im, OnnxNodeIn *v) {
  const char *op = v->np->op_type;
  if (is_same_type_cast(v)) {
    im->stats.n_noops_removed++;
    return define_value(im, v->np->output[0], v->in[0]->ref, NULL, v->in[0]->elem);
  }
  bool shape_only = strcmp(op, "Shape") == 0 || strcmp(op, "Size") == 0;
  if (inputs_all_const(v) || shape_only) {
    Tensor *out = NULL;
    int rc = onnx_fold_node(v, &out, im->d);
    if (rc == TEQ_OK) {
      im->stats.n_folded++;
      return define_outputs_const(im, v, &out, folded_elem(v, out));
    }
    if (rc != ONNX_FOLD_DECLINED) return rc;
  }
  v->failed = false;
  int kind = op_by_onnx(op);
  if (kind < 0 || (op_def((OpKind)kind)->flags & OPF_OPAQUE)) return import_opaque(im, v, true);
  if (!im->opaque_forms) return import_registry_node(im, v, (OpKind)kind);
  /* The row's refusal is held back: a form it does not take makes the node
   * opaque, with the refusal as the warning; any other outcome stands. */
  Diag local, *outer = im->d;
  diag_init(&local);
  int32_t n0 = im->g->n_nodes;
  im->d = v->d = &local;
  int rc = import_registry_node(im, v, (OpKind)kind);
  im->d = v->d = outer;
  /* A node refused for an input whose shape an opaque node left unknown
   * keeps its refusal: the remedy is to declare that shape. */
  bool shapeless = false;
  for (int i = 0; i < v->n_in; i++) shapeless = shapeless || unknown_opaque_input(im, v, i);
  if (rc == TEQ_ERR_UNSUPPORTED && im->g->n_nodes == n0 && !shapeless) {
    /* the first error is the row's refusal; later ones only explain it */
    const char *why = local.text ? strstr(local.text, "error: ") : NULL;
    why = why ? why + 7 : "";
    diag_warn(outer, "%.*s; the node is kept as an opaque node", (int)strcspn(why, "\n"), why);
    diag_fini(&local);
    v->failed = false;
    return import_opaque(im, v, false);
  }
  forward_messages(&local, outer, NULL);
  return rc;
}

static int import_node(Importer *im, int index) {
  const Onnx__NodeProto *np = im->gp->node[index];
  OnnxNodeIn v;
  int rc = node_in_init(im, np, index, &v);
  if (rc == TEQ_OK)
    rc = is_default_domain(np->domain) ? import_default_domain(im, &v)
                                       : import_opaque(im, &v, true);
  node_in_fini(&v);
  return rc;
}

static int missing_input(const Importer *im, int k, const char *name) {
  char where[512];
  onnx_node_where(im->path, im->gp->node[k], k, where, sizeof where);
  return diag_error(im->d, "%s: input '%s' is not a graph input, an initializer or the output of "
                           "any node", where, name);
}

static int32_t producer_of(const Importer *im, const OnnxNames *producer, const char *name) {
  return *name && !find_value(im, name) ? onnx_names_get(producer, name) : -1;
}

/* Kahn's algorithm over producer -> consumer edges (adjacency in CSR form:
 * the consumers of node p are adj[start[p] .. start[p + 1])); order doubles
 * as the queue. Nodes never reached lie on a cycle. */
static int sort_nodes(const Importer *im, const OnnxNames *producer, int *order) {
  const Onnx__GraphProto *gp = im->gp;
  int n = (int)gp->n_node, head = 0, tail = 0, rc = TEQ_OK;
  int *indeg = calloc((size_t)n + 1, sizeof *indeg), *start = calloc((size_t)n + 1, sizeof *start);
  int *fill = malloc(((size_t)n + 1) * sizeof *fill), *adj = NULL;
  for (int k = 0; indeg && start && k < n; k++)
    for (size_t i = 0; i < gp->node[k]->n_input; i++) {
      int32_t p = producer_of(im, producer, gp->node[k]->input[i]);
      if (p >= 0) start[p + 1]++, indeg[k]++;
    }
  if (indeg && start && fill) {
    for (int k = 0; k < n; k++) start[k + 1] += start[k];
    memcpy(fill, start, (size_t)n * sizeof *fill);
    adj = malloc((size_t)start[n] * sizeof *adj + 1);
  }
  if (!adj) rc = out_of_memory((Importer *)im);
  for (int k = 0; rc == TEQ_OK && k < n; k++)
    for (size_t i = 0; i < gp->node[k]->n_input; i++) {
      int32_t p = producer_of(im, producer, gp->node[k]->input[i]);
      if (p >= 0) adj[fill[p]++] = k;
    }
  for (int k = 0; rc == TEQ_OK && k < n; k++)
    if (!indeg[k]) order[tail++] = k;
  while (rc == TEQ_OK && head < tail) {
    int k = order[head++];
    for (int e = start[k]; e < start[k + 1]; e++)
      if (--indeg[adj[e]] == 0) order[tail++] = adj[e];
  }
  for (int k = 0; rc == TEQ_OK && tail < n && k < n; k++)
    if (indeg[k]) {
      char where[512];
      onnx_node_where(im->path, gp->node[k], k, where, sizeof where);
      rc = diag_error(im->d, "%s: is on a cycle: its inputs depend on its own outputs", where);
    }
  free(indeg);
  free(start);
  free(fill);
  free(adj);
  return rc;
}

/* Node indices with every input defined first: the file's own order when
 * it is one already (ONNX requires it), else a topological sort. */
static int node_order(Importer *im, int *order) {
  const Onnx__GraphProto *gp = im->gp;
  OnnxNames producer = {0};
  bool sorted = true;
  int rc = TEQ_OK;
  for (int k = 0; k < (int)gp->n_node && rc == TEQ_OK; k++)
    for (size_t o = 0; o < gp->node[k]->n_output && rc == TEQ_OK; o++)
      if (*gp->node[k]->output[o] && onnx_names_get(&producer, gp->node[k]->output[o]) < 0)
        rc = onnx_names_put(&producer, gp->node[k]->output[o], k);
  if (rc != TEQ_OK) rc = out_of_memory(im);
  for (int k = 0; k < (int)gp->n_node && rc == TEQ_OK; k++)
    for (size_t i = 0; i < gp->node[k]->n_input && rc == TEQ_OK; i++) {
      const char *name = gp->node[k]->input[i];
      if (!*name || find_value(im, name)) continue;
      int32_t p = onnx_names_get(&producer, name);
      if (p < 0) rc = missing_input(im, k, name);
      else if (p >= k) sorted = false;
    }
  for (int k = 0; rc == TEQ_OK && sorted && k < (int)gp->n_node; k++) order[k] = k;
  if (rc == TEQ_OK && !sorted) rc = sort_nodes(im, &producer, order);
  onnx_names_fini(&producer);
  return rc;
}

/* Every name a node of gp or of its subgraphs reads (a subgraph may read
 * any value of the graphs around it). */
static int index_reads_of(OnnxNames *read, const Onnx__GraphProto *gp) {
  int rc = TEQ_OK;
  for (size_t k = 0; k < gp->n_node && rc == TEQ_OK; k++) {
    const Onnx__NodeProto *np = gp->node[k];
    for (size_t i = 0; i < np->n_input && rc == TEQ_OK; i++)
      if (*np->input[i]) rc = onnx_names_put(read, np->input[i], 1);
    for (size_t a = 0; a < np->n_attribute && rc == TEQ_OK; a++) {
      const Onnx__AttributeProto *at = np->attribute[a];
      if (at->g) rc = index_reads_of(read, at->g);
      for (size_t j = 0; j < at->n_graphs && rc == TEQ_OK; j++)
        rc = index_reads_of(read, at->graphs[j]);
    }
  }
  return rc;
}

static int index_reads(Importer *im) {
  int rc = index_reads_of(&im->read, im->gp);
  for (size_t k = 0; k < im->gp->n_output && rc == TEQ_OK; k++)
    if (im->gp->output[k]->name) rc = onnx_names_put(&im->read, im->gp->output[k]->name, 1);
  return rc == TEQ_OK ? TEQ_OK : out_of_memory(im);
}

static int import_nodes(Importer *im) {
  int n = (int)im->gp->n_node;
  int *order = malloc(((size_t)n + 1) * sizeof *order);
  if (!order) return out_of_memory(im);
  int rc = index_reads(im);
  if (rc == TEQ_OK) rc = node_order(im, order);
  for (int k = 0; k < n && rc == TEQ_OK; k++) rc = import_node(im, order[k]);
  free(order);
  return rc;
}

/* ---- graph inputs, initializers, outputs ---- */

/* The options' "NAME=N" entries, parsed; malformed ones are errors. */
static int parse_dims(Importer *im, const OnnxImportOptions *o) {
  if (o->n_dims < 0 || (o->n_dims && !o->dims)) return TEQ_ERR_INPUT;
  /* room for every named dimension of every input too (found later) */
  size_t room = (size_t)o->n_dims;
  for (size_t k = 0; k < im->gp->n_input; k++) {
    const Onnx__TypeProto *tp = im->gp->input[k]->type;
    if (tp && tp->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && tp->tensor_type &&
        tp->tensor_type->shape)
      room += tp->tensor_type->shape->n_dim;
  }
  im->dims = calloc(room + 1, sizeof *im->dims);
  if (!im->dims) return out_of_memory(im);
  for (int k = 0; k < o->n_dims; k++) {
    const char *e = o->dims[k], *eq = e ? strchr(e, '=') : NULL;
    long long v = 0;
    char *name = eq && eq > e ? strndup(e, (size_t)(eq - e)) : NULL;
    if (name && !teq_parse_int(eq + 1, 1, 1 << 20, &v)) free(name), name = NULL;
    if (!name)
      return diag_error(im->d, "%s: dimension '%s': expected NAME=N, N from 1 to 1048576",
                        im->path, e ? e : "");
    if (find_dim(im, name)) {
      diag_error(im->d, "%s: dimension '%s' is given twice", im->path, name);
      free(name);
      return TEQ_ERR_INPUT;
    }
    im->dims[im->n_dims++] = (SymbolicDim){.name = name, .value = v};
  }
  im->n_named = im->n_dims;
  return TEQ_OK;
}

static int symbolic_dim(Importer *im, const Onnx__ValueInfoProto *vi, size_t i, int64_t *out) {
  const Onnx__TensorShapeProto__Dimension *dm = vi->type->tensor_type->shape->dim[i];
  if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
    *out = dm->dim_value;
    if (dm->dim_value >= 0) return TEQ_OK;
    return diag_error(im->d, "%s: input '%s': dimension %zu is %lld", im->path, vi->name, i,
                      (long long)dm->dim_value);
  }
  bool named = dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
               dm->dim_param && *dm->dim_param;
  SymbolicDim *sd = named ? find_dim(im, dm->dim_param) : NULL;
  if (!sd && named) { /* the same name means the same extent everywhere */
    sd = &im->dims[im->n_dims++];
    char *copy = strdup(dm->dim_param);
    if (!copy) return out_of_memory(im);
    *sd = (SymbolicDim){.name = copy, .value = im->batch, .input = vi->name, .axis = i};
  }
  if (sd) {
    sd->used = true;
    *out = sd->value;
    return TEQ_OK;
  }
  if (!im->warned_symbolic) {
    diag_warn(im->d, "%s: an unnamed symbolic dimension (input '%s', dimension %zu) is set "
              "to %lld", im->path, vi->name, i, (long long)im->batch);
    im->warned_symbolic = true;
  }
  *out = im->batch;
  return TEQ_OK;
}

/* After the inputs: every name the options gave must have been met, and
 * the names set to `batch` are listed once, so a user sees what to name. */
static int check_dims(Importer *im) {
  for (int k = 0; k < im->n_named; k++) {
    if (im->dims[k].used) continue;
    char have[512] = "";
    size_t at = 0;
    for (int j = 0; j < im->n_dims && at < sizeof have - 64; j++)
      if (j >= im->n_named || im->dims[j].used)
        at += (size_t)snprintf(have + at, sizeof have - at, "%s'%s'", at ? ", " : "",
                               im->dims[j].name);
    return diag_error(im->d, "%s: no graph input has a symbolic dimension named '%s' (%s%s)",
                      im->path, im->dims[k].name, at ? "it has " : "it has none",
                      at ? have : "");
  }
  if (im->n_dims > im->n_named) {
    char list[512] = "";
    size_t at = 0;
    for (int j = im->n_named; j < im->n_dims && at < sizeof list - 128; j++)
      at += (size_t)snprintf(list + at, sizeof list - at, "%s'%s' (input '%s', dimension %zu)",
                             at ? ", " : "", im->dims[j].name, im->dims[j].input,
                             im->dims[j].axis);
    diag_warn(im->d, "%s: symbolic dimensions set to %lld: %s", im->path, (long long)im->batch,
              list);
  }
  return TEQ_OK;
}

/* Why a graph input of this type cannot feed a Teq graph, or NULL. */
static const char *input_problem(const Onnx__TypeProto__Tensor *tt, int32_t elem) {
  if (!tt) return "is not a tensor";
  if (elem != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && elem != ONNX__TENSOR_PROTO__DATA_TYPE__INT64)
    return "has an element type other than float or int64";
  if (!tt->shape) return "has no shape";
  if (tt->shape->n_dim > TEQ_MAX_DIMS) return "has more than 6 dimensions";
  return NULL;
}

static int input_type(Importer *im, const Onnx__ValueInfoProto *vi, Shape *s, DType *dt) {
  const Onnx__TypeProto *tp = vi->type;
  const Onnx__TypeProto__Tensor *tt =
      tp && tp->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ? tp->tensor_type : NULL;
  int32_t elem = tt && tt->has_elem_type ? tt->elem_type : 0;
  const char *why = input_problem(tt, elem);
  if (why) {
    diag_error(im->d, "%s: input '%s' %s (element type %s), which is not supported", im->path,
               vi->name, why, onnx_elem_name(elem));
    return TEQ_ERR_UNSUPPORTED;
  }
  int64_t dims[TEQ_MAX_DIMS];
  for (size_t i = 0; i < tt->shape->n_dim; i++) {
    int rc = symbolic_dim(im, vi, i, &dims[i]);
    if (rc != TEQ_OK) return rc;
  }
  *s = shape_make((int)tt->shape->n_dim, dims);
  *dt = elem == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? DT_F32 : DT_I64;
  if (!shape_fits(s, *dt)) { /* before any extent of it is multiplied */
    char why[SHAPE_MSG_MAX];
    return diag_error(im->d, "%s: input '%s': %s", im->path, vi->name,
                      shape_too_large(s, *dt, why, sizeof why));
  }
  return TEQ_OK;
}

static int import_inputs(Importer *im) {
  for (size_t k = 0; k < im->gp->n_input; k++) {
    const Onnx__ValueInfoProto *vi = im->gp->input[k];
    if (!vi->name || !*vi->name)
      return diag_error(im->d, "%s: graph input %zu has no name", im->path, k);
    if (find_value(im, vi->name)) continue; /* an initializer listed as input (IR < 4) */
    Shape s;
    DType dt;
    int rc = input_type(im, vi, &s, &dt);
    if (rc != TEQ_OK) return rc;
    Diag local;
    diag_init(&local);
    int id = graph_add_input(im->g, vi->name, &s, dt, &local);
    char where[512];
    snprintf(where, sizeof where, "%s: input '%s'", im->path, vi->name);
    forward_messages(&local, im->d, where);
    if (id < 0) return id;
    rc = define_value(im, vi->name, (TensorRef){id, 0}, NULL, onnx_dtype_elem(dt));
    if (rc != TEQ_OK) return rc;
  }
  return TEQ_OK;
}

static int import_initializers(Importer *im) {
  if (im->gp->n_sparse_initializer) {
    diag_error(im->d, "%s: sparse initializers are not supported", im->path);
    return TEQ_ERR_UNSUPPORTED;
  }
  for (size_t k = 0; k < im->gp->n_initializer; k++) {
    Onnx__TensorProto *tp = im->gp->initializer[k];
    char where[512];
    snprintf(where, sizeof where, "%s: initializer '%s'", im->path, tp->name ? tp->name : "");
    if (!tp->name || !*tp->name) return diag_error(im->d, "%s: has no name", where);
    Tensor *t;
    if (onnx_tensor_is_external(tp)) im->stats.n_external++;
    /* the model is freed after: its raw_data may be taken over */
    int rc = onnx_tensor_take_from_initializer(tp, im->external, where, &t, im->d);
    if (rc == TEQ_OK) rc = define_value(im, tp->name, (TensorRef){-1, 0}, t, tp->data_type);
    if (rc != TEQ_OK) return rc;
  }
  return TEQ_OK;
}

static int import_outputs(Importer *im) {
  for (size_t k = 0; k < im->gp->n_output; k++) {
    const char *name = im->gp->output[k]->name;
    OnnxValue *v = name ? find_value(im, name) : NULL;
    if (!v)
      return diag_error(im->d, "%s: graph output '%s' is not produced by any node, input or "
                               "initializer", im->path, name ? name : "");
    TensorRef ref;
    int rc = materialize(im, v, &ref);
    if (rc == TEQ_OK) rc = graph_add_output(im->g, ref, name, im->d);
    if (rc < 0) return rc;
  }
  return TEQ_OK;
}

/* value_info, graph outputs and inputs by name, for opaque nodes' shapes. */
static int index_infos(Importer *im) {
  const Onnx__GraphProto *gp = im->gp;
  size_t n = gp->n_value_info + gp->n_output + gp->n_input, k = 0;
  im->info = malloc((n + 1) * sizeof *im->info);
  if (!im->info) return out_of_memory(im);
  for (size_t i = 0; i < gp->n_value_info; i++) im->info[k++] = gp->value_info[i];
  for (size_t i = 0; i < gp->n_output; i++) im->info[k++] = gp->output[i];
  for (size_t i = 0; i < gp->n_input; i++) im->info[k++] = gp->input[i];
  for (size_t i = 0; i < k; i++)
    if (im->info[i]->name && onnx_names_put(&im->infos, im->info[i]->name, (int32_t)i) != TEQ_OK)
      return out_of_memory(im);
  /* An Identity's input is declared like its output: once import removes
   * the Identity, an opaque node may produce a graph output directly.
   * Reverse file order carries declarations back along chains. */
  for (size_t j = gp->n_node; j-- > 0;) {
    const Onnx__NodeProto *np = gp->node[j];
    if (strcmp(np->op_type, "Identity") != 0 || np->n_input != 1 || np->n_output != 1) continue;
    int32_t i = onnx_names_get(&im->infos, np->output[0]);
    if (i >= 0 && onnx_names_get(&im->infos, np->input[0]) < 0 &&
        onnx_names_put(&im->infos, np->input[0], i) != TEQ_OK)
      return out_of_memory(im);
  }
  return TEQ_OK;
}

/* ---- the model ---- */

char *onnx_import_stats_format(const OnnxImportStats *s, char *buf, size_t size) {
  snprintf(buf, size, "%d nodes: %d folded into constants, %d opaque, %d no-ops removed, %d "
           "zero pads, %d BatchNorms and %d scales folded; %d layer norms, %d GELUs, %d hard "
           "gates, %d swishes, %d product biases, %d residual adds, %d activations and %d pools "
           "fused",
           s->n_nodes, s->n_folded, s->n_opaque, s->n_noops_removed, s->n_pads_folded,
           s->n_batchnorm_folded, s->n_scales_folded, s->n_layer_norms_fused, s->n_gelus_fused,
           s->n_hard_gates_fused, s->n_swishes_fused, s->n_biases_fused, s->n_residuals_fused,
           s->n_activations_fused, s->n_pools_fused);
  return buf;
}

/* Where node k is, for a node that may lack its op_type. */
static const char *bare_node_where(const Importer *im, const Onnx__NodeProto *np, int k,
                                   char *buf, size_t size) {
  if (np->name && *np->name) snprintf(buf, size, "%s: node '%s'", im->path, np->name);
  else if (np->n_output && *np->output[0])
    snprintf(buf, size, "%s: node #%d (output '%s')", im->path, k, np->output[0]);
  else snprintf(buf, size, "%s: node #%d", im->path, k);
  return buf;
}

/* The strings proto2 may leave NULL that import reads unguarded: every
 * node's op_type and every attribute's name. Checked once, before anything
 * looks at a node; a node or attribute without its name is a bad model. */
static int check_nodes(Importer *im) {
  const Onnx__GraphProto *gp = im->gp;
  for (size_t k = 0; k < gp->n_node; k++) {
    const Onnx__NodeProto *np = gp->node[k];
    char where[512];
    if (!np->op_type || !*np->op_type)
      return diag_error(im->d, "%s: has no op_type",
                        bare_node_where(im, np, (int)k, where, sizeof where));
    for (size_t a = 0; a < np->n_attribute; a++)
      if (!np->attribute[a]->name || !*np->attribute[a]->name) {
        onnx_node_where(im->path, np, (int)k, where, sizeof where);
        return diag_error(im->d, "%s: attribute %zu has no name", where, a);
      }
  }
  return TEQ_OK;
}

/* What a pass returned (a count, or an error), after the nodes it left
 * dead are removed: a pass counts a node's readers, and a reader that a
 * pass before it replaced would still count (a conv that a swish read
 * twice, as x and through its sigmoid, would take no activation). */
static int settled(Importer *im, int n) {
  if (n <= 0) return n;
  int rc = graph_remove_dead(im->g);
  return rc < 0 ? rc : n;
}

static int run_passes(Importer *im, const OnnxImportOptions *o) {
  int n;
  if (!o->keep_noops) {
    if ((n = settled(im, onnx_pass_remove_noops(im->g, im->d))) < 0) return n;
    im->stats.n_noops_removed += n; /* after the Casts import already dropped */
  }
  if (!o->keep_zero_pads) {
    if ((n = settled(im, onnx_pass_fold_zero_pads(im->g, im->d))) < 0) return n;
    im->stats.n_pads_folded = n;
  }
  if (!o->keep_batchnorm || !o->keep_product_scales) {
    int bn;
    n = onnx_pass_fold_affines_after_convs(im->g, !o->keep_batchnorm, !o->keep_product_scales,
                                           &bn, im->d);
    if ((n = settled(im, n)) < 0) return n;
    im->stats.n_batchnorm_folded = bn;
    im->stats.n_scales_folded = n - bn;
  }
  if (!o->keep_product_scales) {
    if ((n = settled(im, onnx_pass_fold_product_scales(im->g, im->d))) < 0) return n;
    im->stats.n_scales_folded += n;
  }
  if (!o->keep_written_layer_norms) {
    if ((n = settled(im, onnx_pass_fuse_layer_norm(im->g, im->d))) < 0) return n;
    im->stats.n_layer_norms_fused = n;
  }
  if (!o->keep_written_gelus) {
    if ((n = settled(im, onnx_pass_fuse_gelu(im->g, im->d))) < 0) return n;
    im->stats.n_gelus_fused = n;
  }
  if (!o->keep_noops) {
    /* After the layer norms, whose written gamma may be ones and beta
     * zeros; before the swishes, which Paddle writes x * sigmoid(x * 1). */
    if ((n = settled(im, onnx_pass_drop_neutral_operands(im->g, im->d))) < 0) return n;
    im->stats.n_noops_removed += n;
  }
  if (!o->keep_unfused_activations) {
    /* Before activations fuse into convs: the conv a swish reads twice
     * would take none, and the sigmoid is the swish's. */
    if ((n = settled(im, onnx_pass_fuse_hard_gates(im->g, im->d))) < 0) return n;
    im->stats.n_hard_gates_fused = n;
    if ((n = settled(im, onnx_pass_fuse_swishes(im->g, im->d))) < 0) return n;
    im->stats.n_swishes_fused = n;
  }
  if (!o->keep_product_biases) {
    /* Before the residual adds, whose fold takes a gemm the bias makes
     * (a transformer's x + (h W + b)), and the activations: a relu after
     * the bias then fuses too. */
    if ((n = settled(im, onnx_pass_fuse_product_biases(im->g, im->d))) < 0) return n;
    im->stats.n_biases_fused = n;
  }
  if (!o->keep_product_scales) {
    /* After the biases: a query's bias is scaled with its weights. */
    if ((n = settled(im, onnx_pass_fold_head_scales(im->g, im->d))) < 0) return n;
    im->stats.n_scales_folded += n;
  }
  if (!o->keep_unfused_residuals) {
    if ((n = settled(im, graph_fuse_residuals(im->g, im->d))) < 0) return n;
    im->stats.n_residuals_fused = n;
  }
  if (!o->keep_batchnorm || !o->keep_product_scales) {
    /* After the residual adds: a border residual would take their place. */
    int bn;
    n = onnx_pass_fold_affines_into_convs(im->g, !o->keep_batchnorm, !o->keep_product_scales,
                                          &bn, im->d);
    if ((n = settled(im, n)) < 0) return n;
    im->stats.n_batchnorm_folded += bn;
    im->stats.n_scales_folded += n - bn;
  }
  if (!o->keep_unfused_activations) {
    if ((n = settled(im, onnx_pass_fuse_activations(im->g, im->d))) < 0) return n;
    im->stats.n_activations_fused = n;
  }
  if (!o->keep_unfused_pools) {
    /* Last: a pool ends its conv's epilogue, which nothing after joins. */
    if ((n = settled(im, onnx_pass_fuse_pools(im->g, im->d))) < 0) return n;
    im->stats.n_pools_fused = n;
  }
  n = graph_remove_dead(im->g);
  if (n < 0) return n;
#ifndef NDEBUG
  /* The O(n) invariant check after the rewrites, in builds with asserts:
   * a broken graph is Teq's bug, reported here rather than downstream. */
  if (graph_check(im->g, im->d) != TEQ_OK) return TEQ_ERR_INTERNAL;
#endif
  return TEQ_OK;
}

/* After a node was refused as malformed: where the graph's inputs had
 * symbolic extents that were given none, the extent they got (1, say) may
 * be what the node cannot take (PaddleOCR's classifier pools a 1x1 image
 * by 2x2), which the warning before the error does not say. */
static void hint_symbolic(const Importer *im) {
  if (im->n_dims > im->n_named || im->warned_symbolic)
    diag_error(im->d, "%s: the graph's inputs have symbolic dimensions, set to %lld above: the "
               "model may need other extents (give them by name, as optimize's --dim NAME=N does)",
               im->path, (long long)im->batch);
}

static int import_graph(Importer *im, const OnnxImportOptions *o) {
  int rc = check_nodes(im);
  if (rc == TEQ_OK) rc = index_infos(im);
  if (rc == TEQ_OK) rc = import_initializers(im);
  if (rc == TEQ_OK) rc = parse_dims(im, o);
  if (rc == TEQ_OK) rc = import_inputs(im);
  if (rc == TEQ_OK) rc = check_dims(im);
  if (rc == TEQ_OK && (rc = import_nodes(im)) == TEQ_ERR_INPUT) hint_symbolic(im);
  if (rc == TEQ_OK) rc = import_outputs(im);
  if (rc == TEQ_OK) warn_unsupported(im);
  if (rc == TEQ_OK) rc = run_passes(im, o);
  return rc;
}

static bool uses_default_domain(const Onnx__GraphProto *gp) {
  for (size_t k = 0; k < gp->n_node; k++)
    if (is_default_domain(gp->node[k]->domain)) return true;
  return false;
}

/* The checks that tell "not an ONNX model at all" from a bad model. */
static int unpack_model(const uint8_t *data, size_t len, const char *name,
                        Onnx__ModelProto **out, Diag *d) {
  ProtobufCMessage *m = NULL;
  const char *why = NULL;
  if (len == 0) why = "the file is empty";
  else if (onnx_unpack(&onnx__model_proto__descriptor, data, len, &m) != TEQ_OK)
    why = "the protobuf does not parse (truncated or another format)";
  else if (!((Onnx__ModelProto *)m)->graph)
    why = "it has no graph";
  else if (domain_opset((Onnx__ModelProto *)m, "") < 1 &&
           uses_default_domain(((Onnx__ModelProto *)m)->graph))
    why = "it imports no opset of the default domain";
  if (why) {
    onnx_message_free(m);
    return diag_error(d, "%s: not an ONNX model: %s", name, why);
  }
  *out = (Onnx__ModelProto *)m;
  return TEQ_OK;
}

static void importer_fini(Importer *im) {
  for (int32_t i = 0; i < im->n_vals; i++) {
    tensor_unref(im->vals[i]->konst);
    free(im->vals[i]);
  }
  free(im->vals);
  free(im->info);
  free(im->unsupported);
  free(im->n_unsupported_of);
  onnx_names_fini(&im->by_name);
  onnx_names_fini(&im->infos);
  onnx_names_fini(&im->read);
  for (int k = 0; k < im->n_dims; k++) free((char *)im->dims[k].name);
  free(im->dims);
}

/* ext: where external data is read from (NULL: it is refused). */
static int import_model(const uint8_t *data, size_t len, const char *name, OnnxExternal *ext,
                        const OnnxImportOptions *opts, Graph **out, OnnxImportStats *stats,
                        Diag *d) {
  OnnxImportOptions o = opts ? *opts : ONNX_IMPORT_DEFAULTS;
  Onnx__ModelProto *m = NULL;
  int rc = unpack_model(data, len, name, &m, d);
  if (rc != TEQ_OK) return rc;
  int opset = domain_opset(m, "");
  Importer im = {.path = name, .external = ext, .batch = o.batch > 0 ? o.batch : 1, .d = d,
                 .opaque_forms = o.opaque_unsupported_forms, .model = m, .gp = m->graph, .opset = opset > 0 ? opset : 0, .g = graph_new()};
  im.stats.n_nodes = (int)m->graph->n_node;
  im.stats.opset = im.opset;
  rc = im.g ? import_graph(&im, &o) : out_of_memory(&im);
  if (rc == TEQ_OK) {
    *out = im.g;
    if (stats) *stats = im.stats;
  } else {
    graph_free(im.g);
  }
  importer_fini(&im);
  onnx_message_free(m);
  return rc;
}

int onnx_import_buffer(const uint8_t *data, size_t len, const char *name,
                       const OnnxImportOptions *opts, Graph **out, OnnxImportStats *stats,
                       Diag *d) {
  return import_model(data, len, name, NULL, opts, out, stats, d);
}

int onnx_import_file(const char *path, const OnnxImportOptions *opts, Graph **out,
                     OnnxImportStats *stats, Diag *d) {
  OnnxFileData f;
  int rc = onnx_file_read(path, &f, d);
  if (rc != TEQ_OK) return rc;
  OnnxExternal *ext = onnx_external_new(path);
  if (!ext) {
    diag_error(d, "%s: out of memory", path);
    rc = TEQ_ERR_NOMEM;
  }
  if (rc == TEQ_OK) rc = import_model(f.data, f.len, path, ext, opts, out, stats, d);
  onnx_external_free(ext);
  onnx_file_release(&f);
  return rc;
}
