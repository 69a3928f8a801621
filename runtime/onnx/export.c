/* export.c: a Graph out as an ONNX ModelProto, in the opset it was read in
 * (OnnxExportOptions.opset) or 13 at least, raised where an operator
 * needs it. Graph inputs and outputs keep their names; every other value gets a
 * generated name no other value has. Constants and TASO's constant tensors
 * (evaluated once) become initializers; a large one that repeats along its
 * axes, its distinct slices and the Gathers that spread them out. Each
 * operator is written from its registry row: op_type, one attribute per
 * parameter with an onnx_attr, then the row's onnx_write hook through the
 * OnnxNodeOut calls below. Opaque nodes
 * are their stored NodeProtos, renamed; their opset may raise the model's,
 * and where Teq widened a value they read (bool held as int64) a Cast gives
 * them the original type back. A graph output that is an input, a constant
 * or another output's value goes through an Identity: ONNX names each value
 * once. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec.h"
#include "runtime/onnx/onnx_int.h"

#define EXPORT_OPSET 13
#define MAX_THEN 10

typedef struct Domain {
  char *name;
  int version;
} Domain;

/* An initializer whose raw_data is a tensor's own data rather than a copy
 * (weights are most of a model's bytes); the exporter holds a reference to
 * the tensor until the model is written. */
typedef struct Lent {
  Onnx__TensorProto *tp;
  Tensor *t;
} Lent;

typedef struct Exporter {
  const Graph *g;
  const char *path;
  Diag *d;
  Onnx__ModelProto *m;
  Onnx__GraphProto *gp;   /* m->graph */
  int32_t *uses, *offset; /* graph_use_counts: uses[offset[node] + out] */
  const char **names;     /* tensor name of each output, same indexing; NULL until named */
  bool *is_output;        /* same indexing: a graph output, declared in graph.output */
  int32_t *elem;          /* same indexing: ONNX element type where Teq's dtype is not it; 0 */
  Shape *decl;            /* same indexing: declared shapes of opaque outputs */
  char **owned;           /* every generated string the maps borrow */
  size_t n_owned;
  OnnxNames taken;        /* tensor names in use */
  OnnxNames node_names;
  int opset;              /* of the default domain */
  int at_least;           /* OnnxExportOptions.opset */
  Domain *domains;        /* custom domains of opaque nodes */
  int n_domains;
  Lent *lent;             /* initializers holding a tensor's own data */
  size_t n_lent;
  bool nomem;             /* an allocation failed; reported once at the end */
} Exporter;

/* A node written after the row's own, reading its result (see
 * onnx_out_then_unary and onnx_out_then_binary). */
typedef struct Then {
  const char *op_type;
  Tensor *operand; /* a constant second operand (held), or NULL */
  int input;       /* else the second operand is the row's input this (-1: none) */
  int64_t window;  /* a window node's kernel_shape and strides (k k), 0 for none */
  bool operands;   /* else a and b, ONNX_OUT_STEP or ONNX_OUT_INPUT, are both */
  int a, b;
  const char *ints_name; /* an ints attribute, or NULL */
  int64_t ints[TEQ_MAX_DIMS];
  int n_ints;
} Then;

struct OnnxNodeOut {
  Exporter *x;
  const Node *node;
  Onnx__NodeProto *np;
  Then then[MAX_THEN];
  int n_then;
  const char *misuse; /* the row asked for what these calls cannot do: a bug in the row */
};

/* ---- growing the repeated fields ---- */

/* Appends item to a protobuf-c repeated field (a T ** and its count). The
 * array grows at powers of two, so it needs no capacity field. All object
 * pointers share one representation here, so the field is handled as void **. */
static bool append(void *field, size_t *n, void *item) {
  void **arr;
  memcpy(&arr, field, sizeof arr);
  if ((*n & (*n - 1)) == 0) {
    void **a = realloc(arr, (*n ? 2 * *n : 1) * sizeof *a);
    if (!a) return false;
    arr = a;
    memcpy(field, &arr, sizeof arr);
  }
  arr[(*n)++] = item;
  return true;
}

static void append_string(Exporter *x, char ***field, size_t *n, const char *s) {
  char *copy = strdup(s);
  if (!copy || !append(field, n, copy)) {
    free(copy);
    x->nomem = true;
  }
}

static void append_message(Exporter *x, void *field, size_t *n, void *msg) {
  if (!msg || !append(field, n, msg)) {
    onnx_message_free(msg);
    x->nomem = true;
  }
}

/* Appends t, named name, to the model's initializers. */
static void append_initializer(Exporter *x, const Tensor *t, const char *name) {
  Onnx__TensorProto *tp = onnx_tensor_to_proto(t, name, true);
  bool lent = tp && onnx_tensor_proto_is_lent(tp, t);
  if (lent && (x->n_lent & (x->n_lent - 1)) == 0) { /* grows at powers of two */
    Lent *l = realloc(x->lent, (x->n_lent ? 2 * x->n_lent : 1) * sizeof *l);
    if (!l) {
      onnx_tensor_proto_unlend(tp);
      onnx_message_free(tp);
      x->nomem = true;
      return;
    }
    x->lent = l;
  }
  if (!tp || !append(&x->gp->initializer, &x->gp->n_initializer, tp)) {
    if (lent) onnx_tensor_proto_unlend(tp);
    onnx_message_free(tp);
    x->nomem = true;
    return;
  }
  /* The reference is bookkeeping, not a write of the tensor's contents. */
  if (lent) x->lent[x->n_lent++] = (Lent){tp, tensor_ref((Tensor *)t)};
}

/* ---- names ---- */

/* base, or base_1, base_2, ... : the first not in set; registered there. */
static const char *unique_in(Exporter *x, OnnxNames *set, const char *base) {
  char *s = strdup(base);
  for (int k = 1; s && onnx_names_get(set, s) >= 0; k++) {
    free(s);
    s = onnx_strdup_printf("%s_%d", base, k);
  }
  if (s && append(&x->owned, &x->n_owned, s) && onnx_names_put(set, s, 0) == TEQ_OK) return s;
  if (s && (x->n_owned == 0 || x->owned[x->n_owned - 1] != s)) free(s);
  x->nomem = true;
  return "";
}

static const char *unique_name(Exporter *x, const char *base) {
  return unique_in(x, &x->taken, base);
}

static const char **name_slot(Exporter *x, TensorRef r) {
  return &x->names[x->offset[r.node] + r.out];
}

/* The tensor name of r, generated on first use. */
static const char *tensor_name(Exporter *x, TensorRef r) {
  const char **slot = name_slot(x, r);
  if (*slot) return *slot;
  const Node *n = &x->g->nodes[r.node];
  bool source = op_def(n->kind)->flags & OPF_SOURCE;
  char base[256];
  if (source && n->name) snprintf(base, sizeof base, "%s", n->name);
  else if (source) snprintf(base, sizeof base, "c%d", r.node);
  else if (n->name) snprintf(base, sizeof base, "%s_out%d", n->name, r.out);
  else snprintf(base, sizeof base, "t%d_%d", r.node, r.out);
  *slot = unique_name(x, base);
  return *slot;
}

/* The ONNX element type r has in the exported model. */
static int32_t exported_elem(const Exporter *x, TensorRef r) {
  int32_t e = x->elem[x->offset[r.node] + r.out];
  return e ? e : onnx_dtype_elem(x->g->nodes[r.node].dtype);
}

static const char *node_name(Exporter *x, int32_t id) {
  const Node *n = &x->g->nodes[id];
  char base[256];
  if (n->name) snprintf(base, sizeof base, "%s", n->name);
  else snprintf(base, sizeof base, "%s_%d", op_def(n->kind)->name, id);
  return unique_in(x, &x->node_names, base);
}

/* ---- messages ---- */

static int internal_error(Exporter *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int internal_error(Exporter *x, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  diag_error(x->d, "%s: %s", x->path, msg);
  return TEQ_ERR_INTERNAL;
}

static Onnx__NodeProto *node_new(Exporter *x, const char *op_type, const char *name) {
  Onnx__NodeProto *np = malloc(sizeof *np);
  if (np) {
    onnx__node_proto__init(np);
    np->op_type = strdup(op_type);
    np->name = strdup(name);
    np->domain = strdup("");
  }
  if (!np || !np->op_type || !np->name || !np->domain) {
    onnx_message_free(np);
    x->nomem = true;
    return NULL;
  }
  return np;
}

/* Each piece is linked into its parent as soon as it exists, so freeing
 * the top message on failure frees whatever was built. */
static Onnx__TensorShapeProto *shape_proto_new(const Shape *s) {
  Onnx__TensorShapeProto *sp = malloc(sizeof *sp);
  if (!sp) return NULL;
  onnx__tensor_shape_proto__init(sp);
  sp->dim = calloc((size_t)s->ndim + 1, sizeof *sp->dim);
  for (int i = 0; sp->dim && i < s->ndim; i++) {
    Onnx__TensorShapeProto__Dimension *dm = malloc(sizeof *dm);
    if (!dm) break;
    onnx__tensor_shape_proto__dimension__init(dm);
    if (s->d[i] >= 0) {
      dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
      dm->dim_value = s->d[i];
    }
    sp->dim[sp->n_dim++] = dm;
  }
  if (sp->n_dim != (size_t)s->ndim) {
    onnx_message_free(sp);
    return NULL;
  }
  return sp;
}

/* A graph input, output or value_info entry; extents below 0 are written
 * as unknown dimensions. */
static Onnx__ValueInfoProto *value_info_new(const char *name, const Shape *s, int32_t elem) {
  Onnx__ValueInfoProto *vi = malloc(sizeof *vi);
  if (!vi) return NULL;
  onnx__value_info_proto__init(vi);
  vi->name = strdup(name);
  Onnx__TypeProto *tp = vi->type = malloc(sizeof *tp);
  Onnx__TypeProto__Tensor *tt = NULL;
  if (tp) {
    onnx__type_proto__init(tp);
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tt = tp->tensor_type = malloc(sizeof *tt);
  }
  if (tt) {
    onnx__type_proto__tensor__init(tt);
    tt->has_elem_type = 1;
    tt->elem_type = elem;
    if (shape_is_known(s)) tt->shape = shape_proto_new(s); /* unknown: no shape field */
  }
  if (!vi->name || !tt || (shape_is_known(s) && !tt->shape)) {
    onnx_message_free(vi);
    return NULL;
  }
  return vi;
}

static Onnx__AttributeProto *attr_new(const char *name, int type) {
  Onnx__AttributeProto *a = malloc(sizeof *a);
  if (!a) return NULL;
  onnx__attribute_proto__init(a);
  a->name = strdup(name);
  a->has_type = 1;
  a->type = type;
  if (!a->name) {
    onnx_message_free(a);
    return NULL;
  }
  return a;
}

/* ---- the OnnxNodeOut calls for registry rows ---- */

void onnx_out_drop_attr(OnnxNodeOut *w, const char *name) {
  Onnx__NodeProto *np = w->np;
  for (size_t k = 0; k < np->n_attribute; k++)
    if (strcmp(np->attribute[k]->name, name) == 0) {
      onnx_message_free(np->attribute[k]);
      memmove(&np->attribute[k], &np->attribute[k + 1],
              (np->n_attribute - k - 1) * sizeof *np->attribute);
      np->n_attribute--;
      return;
    }
}

/* Replaces any attribute of the same name. */
static void put_attr(OnnxNodeOut *w, Onnx__AttributeProto *a) {
  if (!a) {
    w->x->nomem = true;
    return;
  }
  onnx_out_drop_attr(w, a->name);
  append_message(w->x, &w->np->attribute, &w->np->n_attribute, a);
}

void onnx_out_attr_int(OnnxNodeOut *w, const char *name, int64_t v) {
  Onnx__AttributeProto *a = attr_new(name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
  if (a) {
    a->has_i = 1;
    a->i = v;
  }
  put_attr(w, a);
}

void onnx_out_attr_float(OnnxNodeOut *w, const char *name, double v) {
  Onnx__AttributeProto *a = attr_new(name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
  if (a) {
    a->has_f = 1;
    a->f = (float)v;
  }
  put_attr(w, a);
}

void onnx_out_attr_ints(OnnxNodeOut *w, const char *name, const int64_t *v, int n) {
  Onnx__AttributeProto *a = attr_new(name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
  if (a && n > 0 && !(a->ints = malloc((size_t)n * sizeof *a->ints))) {
    onnx_message_free(a);
    a = NULL;
  }
  if (a && n > 0) {
    memcpy(a->ints, v, (size_t)n * sizeof *v);
    a->n_ints = (size_t)n;
  }
  put_attr(w, a);
}

void onnx_out_attr_string(OnnxNodeOut *w, const char *name, const char *v) {
  Onnx__AttributeProto *a = attr_new(name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
  if (a) {
    a->has_s = 1;
    a->s.len = strlen(v);
    a->s.data = (uint8_t *)strdup(v);
    if (!a->s.data) {
      onnx_message_free(a);
      a = NULL;
    }
  }
  put_attr(w, a);
}

const Shape *onnx_out_input_shape(const OnnxNodeOut *w, int i) {
  if (i < 0 || i >= w->node->n_in) return NULL;
  return graph_shape(w->x->g, w->node->in[i]);
}

int onnx_out_opset(const OnnxNodeOut *w) { return w->x->opset; }

/* The last opset whose changes every row's ONNX form follows (18 moved
 * the reduce operators' axes from an attribute to an input; 19 and 20 only
 * added operators and attributes). */
#define EXPORT_OPSET_MAX 20

static bool default_domain_opaque(const Node *n) {
  return n->kind == OP_OPAQUE && n->opaque &&
         (!n->opaque->domain || !*n->opaque->domain || !strcmp(n->opaque->domain, "ai.onnx"));
}

/* The opset g is written in: the model's own (at_least, up to
 * EXPORT_OPSET_MAX), or the highest any node needs, a row's onnx_opset or
 * a default-domain opaque node's own. Decided before any
 * node is written, since rows write the forms of that opset. An opaque
 * node from a lower opset is written as it was, which is right only where
 * ONNX did not define its operator anew in between (onnx_op_changed). */
int onnx_export_opset(const Graph *g, const char *path, int at_least, int *opset, Diag *d) {
  *opset = EXPORT_OPSET;
  if (at_least > *opset) *opset = at_least < EXPORT_OPSET_MAX ? at_least : EXPORT_OPSET_MAX;
  for (int32_t id = 0; id < g->n_nodes; id++) {
    const Node *n = &g->nodes[id];
    const OpDef *o = op_def(n->kind);
    int v = o->onnx_opset;
    if (default_domain_opaque(n))
      v = n->opaque->opset;
    else if (v > EXPORT_OPSET_MAX)
      return diag_error(d, "%s: ONNX %s needs opset %d; Teq writes opsets up to %d", path,
                        o->onnx_op ? o->onnx_op : o->name, v, EXPORT_OPSET_MAX),
             TEQ_ERR_UNSUPPORTED;
    if (v > *opset) *opset = v;
  }
  for (int32_t id = 0; id < g->n_nodes; id++) {
    const Node *n = &g->nodes[id];
    int from = default_domain_opaque(n) ? n->opaque->opset : 0;
    int anew = from > 0 && from < *opset ? onnx_op_changed(n->opaque->op_type, from, *opset) : 0;
    if (anew < 0)
      return diag_error(d, "%s: '%s' (from opset %d) is no operator of ONNX's default domain, and "
                        "Teq does not know it", path, n->opaque->op_type, from),
             TEQ_ERR_UNSUPPORTED;
    if (anew > 0)
      return diag_error(d, "%s: the %s operator, which Teq keeps as it is, comes from opset %d, "
                        "and ONNX defined it anew at opset %d; the model is written in opset %d "
                        "(the lowest that Teq's operators allow), where it may mean something "
                        "else. Convert the model to opset %d first "
                        "(onnx.version_converter.convert_version)", path, n->opaque->op_type,
                        from, anew, *opset, *opset),
             TEQ_ERR_UNSUPPORTED;
  }
  return TEQ_OK;
}

void onnx_out_set_op_type(OnnxNodeOut *w, const char *op_type) {
  char *s = strdup(op_type);
  if (!s) {
    w->x->nomem = true;
    return;
  }
  free(w->np->op_type);
  w->np->op_type = s;
}

void onnx_out_add_const_input(OnnxNodeOut *w, const Tensor *t) {
  char base[300];
  snprintf(base, sizeof base, "%s_c%zu", w->np->name, w->np->n_input);
  const char *name = unique_name(w->x, base);
  append_initializer(w->x, t, name);
  append_string(w->x, &w->np->input, &w->np->n_input, name);
}

void onnx_out_add_empty_input(OnnxNodeOut *w) {
  append_string(w->x, &w->np->input, &w->np->n_input, "");
}

static void then_add(OnnxNodeOut *w, Then t) {
  if (w->n_then < MAX_THEN) w->then[w->n_then++] = t;
  else w->misuse = "more nodes chained after it than the exporter holds";
}

void onnx_out_then_unary(OnnxNodeOut *w, const char *op_type) {
  then_add(w, (Then){.op_type = op_type, .input = -1});
}

void onnx_out_then_window(OnnxNodeOut *w, const char *op_type, int64_t k) {
  then_add(w, (Then){.op_type = op_type, .input = -1, .window = k});
}

void onnx_out_then_binary(OnnxNodeOut *w, const char *op_type, const Tensor *c) {
  then_add(w, (Then){.op_type = op_type, .operand = c ? tensor_ref((Tensor *)c) : NULL,
                     .input = c ? -1 : 0});
}

void onnx_out_then_operands(OnnxNodeOut *w, const char *op_type, int a, int b) {
  for (int k = 0; k < 2; k++) {
    int r = k ? b : a;
    if (r > w->n_then || (r < 0 && -1 - r >= w->node->n_in)) {
      w->misuse = "an operand that is neither an earlier node of the chain nor an input";
      return;
    }
  }
  then_add(w, (Then){.op_type = op_type, .input = -1, .operands = true, .a = a, .b = b});
}

void onnx_out_then_attr_ints(OnnxNodeOut *w, const char *name, const int64_t *v, int n) {
  if (!w->n_then || n < 0 || n > TEQ_MAX_DIMS) {
    w->misuse = "an attribute of no chained node, or too long";
    return;
  }
  Then *t = &w->then[w->n_then - 1];
  t->ints_name = name;
  t->n_ints = n;
  memcpy(t->ints, v, (size_t)n * sizeof *v);
}

void onnx_out_keep_inputs(OnnxNodeOut *w, int n) {
  Onnx__NodeProto *np = w->np;
  while (np->n_input > (size_t)(n > 0 ? n : 0)) free(np->input[--np->n_input]);
}

void onnx_out_then_binary_input(OnnxNodeOut *w, const char *op_type, int input) {
  Onnx__NodeProto *np = w->np;
  if (input < 0 || input >= w->node->n_in || (size_t)input + 1 != np->n_input) {
    w->misuse = "an input other than its last moved into a node after it";
    return;
  }
  free(np->input[--np->n_input]);
  then_add(w, (Then){.op_type = op_type, .input = input});
}

/* ---- nodes ---- */

static void add_node(Exporter *x, Onnx__NodeProto *np) {
  append_message(x, &x->gp->node, &x->gp->n_node, np);
}

/* Writes the nodes a hook asked for after the row's own: the node's
 * output is renamed and the last of the chain produces it. */
static int write_then_chain(Exporter *x, const OnnxNodeOut *w) {
  Onnx__NodeProto *np = w->np;
  if (np->n_output != 1)
    return internal_error(x, "%s: nodes chained after a node with %zu outputs", np->name,
                          np->n_output);
  const char *final = tensor_name(x, (TensorRef){(int32_t)(w->node - x->g->nodes), 0});
  char base[300];
  snprintf(base, sizeof base, "%s_pre", final);
  const char *prev = unique_name(x, base);
  const char *step[MAX_THEN + 1] = {prev}; /* each chain node's output */
  free(np->output[0]);
  np->output[0] = strdup(prev);
  if (!np->output[0]) x->nomem = true;
  for (int k = 0; k < w->n_then; k++) {
    const Then *t = &w->then[k];
    snprintf(base, sizeof base, "%s_%s", np->name, t->op_type);
    Onnx__NodeProto *u = node_new(x, t->op_type, unique_in(x, &x->node_names, base));
    if (!u) break;
    const char *out = k + 1 == w->n_then ? final : unique_name(x, base);
    if (t->operands) {
      for (int j = 0; j < 2; j++) {
        int r = j ? t->b : t->a;
        append_string(x, &u->input, &u->n_input,
                      r >= 0 ? step[r] : tensor_name(x, w->node->in[-1 - r]));
      }
    } else {
      append_string(x, &u->input, &u->n_input, prev);
      if (t->input >= 0) {
        append_string(x, &u->input, &u->n_input, tensor_name(x, w->node->in[t->input]));
      } else if (t->operand) {
        snprintf(base, sizeof base, "%s_c", u->name);
        const char *name = unique_name(x, base);
        append_initializer(x, t->operand, name);
        append_string(x, &u->input, &u->n_input, name);
      }
    }
    append_string(x, &u->output, &u->n_output, out);
    OnnxNodeOut uw = {.x = x, .node = w->node, .np = u};
    if (t->window) {
      const int64_t kk[2] = {t->window, t->window};
      onnx_out_attr_ints(&uw, "kernel_shape", kk, 2);
      onnx_out_attr_ints(&uw, "strides", kk, 2);
    }
    if (t->ints_name) onnx_out_attr_ints(&uw, t->ints_name, t->ints, t->n_ints);
    add_node(x, u);
    prev = step[k + 1] = out;
  }
  return TEQ_OK;
}

static void generic_attrs(OnnxNodeOut *w) {
  const OpDef *o = op_def(w->node->kind);
  for (int i = 0; i < o->n_params; i++) {
    const OpParam *r = &o->params[i];
    const ParamValue *v = &w->node->params.v[i];
    if (!r->onnx_attr) continue;
    if (r->type == PARAM_INT) onnx_out_attr_int(w, r->onnx_attr, v->i[0]);
    else if (r->type == PARAM_INTS) onnx_out_attr_ints(w, r->onnx_attr, v->i, v->n);
    else onnx_out_attr_float(w, r->onnx_attr, v->f);
  }
}

static int export_op(Exporter *x, int32_t id) {
  const Node *n = &x->g->nodes[id];
  const OpDef *o = op_def(n->kind);
  if (!o->onnx_op && !o->onnx_write) {
    diag_error(x->d, "%s: node '%s': operator '%s' has no ONNX form", x->path,
               n->name ? n->name : "", o->name);
    return TEQ_ERR_UNSUPPORTED;
  }
  Onnx__NodeProto *np = node_new(x, o->onnx_op ? o->onnx_op : "", node_name(x, id));
  if (!np) return TEQ_OK; /* x->nomem reports it */
  OnnxNodeOut w = {.x = x, .node = n, .np = np};
  for (int32_t i = 0; i < n->n_in; i++)
    append_string(x, &np->input, &np->n_input, tensor_name(x, n->in[i]));
  for (int32_t k = 0; k < n->n_out; k++)
    append_string(x, &np->output, &np->n_output, tensor_name(x, (TensorRef){id, k}));
  generic_attrs(&w);
  int rc = o->onnx_write ? o->onnx_write(n, &w, x->d) : TEQ_OK;
  if (rc == TEQ_OK && w.misuse)
    rc = internal_error(x, "node '%s': the row of '%s' asked for %s", np->name, o->name,
                        w.misuse);
  if (rc == TEQ_OK && !*np->op_type)
    rc = diag_error(x->d, "%s: node '%s': the row of '%s' set no op_type", x->path, np->name,
                    o->name);
  if (rc != TEQ_OK) {
    for (int k = 0; k < w.n_then; k++) tensor_unref(w.then[k].operand);
    onnx_message_free(np);
    return rc;
  }
  add_node(x, np);
  /* An int64 result of a layout operator moved input 0's elements (graph.c
   * keeps int64 only for those), so it has their ONNX type, bool included;
   * an OPF_INT64_OUT row's outputs are indices, ONNX INT64 (elem left 0). */
  bool moved = !(o->flags & OPF_INT64_OUT);
  for (int32_t k = 0; moved && n->dtype == DT_I64 && n->n_in > 0 && k < n->n_out; k++)
    x->elem[x->offset[id] + k] = exported_elem(x, n->in[0]);
  rc = w.n_then ? write_then_chain(x, &w) : TEQ_OK;
  for (int k = 0; k < w.n_then; k++) tensor_unref(w.then[k].operand);
  return rc;
}

/* ---- opaque nodes ---- */

static void note_domain(Exporter *x, const char *domain, int version) {
  if (!*domain) {
    if (version > x->opset) x->opset = version;
    return;
  }
  for (int k = 0; k < x->n_domains; k++)
    if (strcmp(x->domains[k].name, domain) == 0) {
      if (version > x->domains[k].version) x->domains[k].version = version;
      return;
    }
  Domain *a = realloc(x->domains, (size_t)(x->n_domains + 1) * sizeof *a);
  char *name = a ? strdup(domain) : NULL;
  if (a) x->domains = a;
  if (!name) {
    x->nomem = true;
    return;
  }
  x->domains[x->n_domains++] = (Domain){name, version};
}

static void replace_string(Exporter *x, char **slot, const char *s) {
  char *copy = strdup(s);
  if (!copy) {
    x->nomem = true;
    return;
  }
  free(*slot);
  *slot = copy;
}

/* The name of r converted to elem by a Cast node written now: an opaque
 * operator reading bool or int32 gets what it read in the original model,
 * although Teq kept the value as int64 or float. */
static const char *cast_to(Exporter *x, TensorRef r, int32_t elem) {
  char base[300];
  snprintf(base, sizeof base, "%s_as_%s", tensor_name(x, r), onnx_elem_name(elem));
  const char *out = unique_name(x, base);
  Onnx__NodeProto *np = node_new(x, "Cast", unique_in(x, &x->node_names, base));
  if (!np) return out;
  OnnxNodeOut w = {.x = x, .np = np};
  append_string(x, &np->input, &np->n_input, tensor_name(x, r));
  append_string(x, &np->output, &np->n_output, out);
  onnx_out_attr_int(&w, "to", elem);
  add_node(x, np);
  return out;
}

/* Inputs in order of the node's edges; empty names (skipped optional
 * inputs) stay. Returns how many names the NodeProto had for edges. */
static int32_t rename_opaque_inputs(Exporter *x, const Node *n, Onnx__NodeProto *np) {
  const OpaqueInfo *info = n->opaque;
  int32_t e = 0;
  for (size_t i = 0; i < np->n_input && e <= n->n_in; i++) {
    if (!*np->input[i]) continue;
    if (e < n->n_in) {
      int32_t want = info->in_elem && e < info->n_in ? info->in_elem[e] : 0;
      bool cast = want && want != exported_elem(x, n->in[e]);
      const char *name = cast ? cast_to(x, n->in[e], want) : tensor_name(x, n->in[e]);
      replace_string(x, &np->input[i], name);
    }
    e++;
  }
  return e;
}

/* The shape to declare for output k: Teq's if known, else as imported. */
static const Shape *declared_shape(const Node *n, int32_t k) {
  const OpaqueInfo *info = n->opaque;
  if (shape_is_known(&n->out[k]) || !info->out_declared || k >= info->n_out) return &n->out[k];
  return &info->out_declared[k];
}

/* Outputs are positional: an empty name stays empty, at its place. Types
 * and shapes import knew are declared, so the next import knows them too. */
static void rename_opaque_outputs(Exporter *x, int32_t id, Onnx__NodeProto *np) {
  const Node *n = &x->g->nodes[id];
  const OpaqueInfo *info = n->opaque;
  for (size_t k = 0; k < np->n_output && (int32_t)k < n->n_out; k++) {
    TensorRef r = {id, (int32_t)k};
    int32_t slot = x->offset[id] + (int32_t)k;
    if (info->out_elem && (int32_t)k < info->n_out) x->elem[slot] = info->out_elem[k];
    x->decl[slot] = *declared_shape(n, (int32_t)k);
    if (!*np->output[k]) continue;
    replace_string(x, &np->output[k], tensor_name(x, r));
    if (shape_is_known(&x->decl[slot]) && !x->is_output[slot])
      append_message(x, &x->gp->value_info, &x->gp->n_value_info,
                     value_info_new(tensor_name(x, r), &x->decl[slot], exported_elem(x, r)));
  }
}

static int export_opaque(Exporter *x, int32_t id) {
  const Node *n = &x->g->nodes[id];
  ProtobufCMessage *pm;
  const OpaqueInfo *info = n->opaque;
  if (onnx_unpack(&onnx__node_proto__descriptor, info->proto, info->proto_len, &pm) != TEQ_OK)
    return internal_error(x, "opaque node '%s': its stored NodeProto does not parse",
                          n->opaque->op_type);
  Onnx__NodeProto *np = (Onnx__NodeProto *)pm;
  int opset = info->opset > 0 ? info->opset : EXPORT_OPSET;
  if (np->domain && strcmp(np->domain, "ai.onnx") == 0) np->domain[0] = '\0';
  bool custom = np->domain && *np->domain;
  note_domain(x, custom ? np->domain : "", opset);
  int32_t e = rename_opaque_inputs(x, n, np);
  rename_opaque_outputs(x, id, np);
  replace_string(x, &np->name, node_name(x, id));
  if (e != n->n_in) {
    onnx_message_free(np);
    return internal_error(x, "opaque node '%s' has %d inputs, its NodeProto names %d",
                          n->opaque->op_type, n->n_in, e);
  }
  add_node(x, np);
  return TEQ_OK;
}

int onnx_opaque_identity(const OpaqueInfo *info, uint8_t **bytes, size_t *len) {
  ProtobufCMessage *pm;
  if (!info || onnx_unpack(&onnx__node_proto__descriptor, info->proto, info->proto_len, &pm) !=
                   TEQ_OK)
    return TEQ_ERR_INPUT;
  Onnx__NodeProto *np = (Onnx__NodeProto *)pm;
  /* what export_opaque rewrites, made alike: a tensor's name that is
   * there becomes "x" (an empty one, a skipped optional input, stays: its
   * place counts); the node's name and a default domain's spelling go
   * (fields left out, not empty: an empty string is packed) */
  for (size_t i = 0; i < np->n_input; i++)
    if (*np->input[i]) np->input[i][0] = 'x', np->input[i][1] = '\0';
  for (size_t k = 0; k < np->n_output; k++)
    if (*np->output[k]) np->output[k][0] = 'x', np->output[k][1] = '\0';
  free(np->name);
  np->name = NULL;
  if (np->domain && (!*np->domain || strcmp(np->domain, "ai.onnx") == 0)) {
    free(np->domain);
    np->domain = NULL;
  }
  int rc = onnx_pack(pm, bytes, len);
  onnx_message_free(np);
  return rc;
}

/* ---- constants written as their distinct slices ----
 * A constant that repeats along some of its axes (the border residual a
 * shift folded into a padded convolution leaves, passes.c: zero inside,
 * and each edge row alike along the edge) is written as its distinct
 * slices and, per such axis, a Gather that puts each index's slice back.
 * ONNX Runtime and Teq's import fold the Gathers into the constant when
 * they load the model: the same values to the bit, where the file carried
 * megabytes of repeats (PP-OCRv4's detector at 640x640: 17 MB of them). */

#define SLICES_MIN_BYTES (64 * 1024) /* a smaller constant is written as it is */

/* Which distinct slice each index of t along axis holds, in *index (int64
 * [extent]), and those slices in *packed; 1 when they are at most half the
 * extent, 0 (nothing made) when not, or TEQ_ERR_NOMEM. Slices compare as
 * bytes, so -0 and 0 differ and a NaN matches itself. */
static int distinct_slices(const Tensor *t, int axis, Tensor **packed, Tensor **index) {
  const Shape *s = &t->shape;
  int64_t n = s->d[axis], outer = 1, inner = 1;
  for (int a = 0; a < s->ndim; a++)
    if (a < axis) outer *= s->d[a];
    else if (a > axis) inner *= s->d[a];
  size_t block = (size_t)inner * dtype_size(t->dtype), row = (size_t)n * block;
  size_t cap = 2; /* a power of two at least twice the slices kept */
  while (cap < (size_t)n) cap *= 2;
  const uint8_t *base = t->data;
  int64_t *cls = malloc((size_t)n * sizeof *cls), *rep = malloc((size_t)n * sizeof *rep);
  int64_t *table = malloc(cap * sizeof *table); /* -1, or a slot of rep */
  uint64_t *hash = malloc((size_t)n * sizeof *hash);
  int rc = cls && rep && table && hash ? 0 : TEQ_ERR_NOMEM;
  int64_t n_rep = 0;
  for (size_t k = 0; rc == 0 && k < cap; k++) table[k] = -1;
  for (int64_t i = 0; rc == 0 && i < n; i++) {
    uint64_t h = 0;
    for (int64_t o = 0; o < outer; o++)
      h = hash_bytes(h, base + (size_t)o * row + (size_t)i * block, block);
    size_t k = (size_t)(h ^ (h >> 29)) & (cap - 1);
    int64_t c = -1;
    for (; table[k] >= 0; k = (k + 1) & (cap - 1)) {
      int64_t r = table[k];
      if (hash[r] != h) continue;
      bool same = true;
      for (int64_t o = 0; o < outer && same; o++) {
        const uint8_t *p = base + (size_t)o * row;
        same = memcmp(p + (size_t)rep[r] * block, p + (size_t)i * block, block) == 0;
      }
      if (same) {
        c = r;
        break;
      }
    }
    if (c < 0) {
      if (n_rep + 1 > n / 2) break; /* not worth it: rc stays 0 */
      c = n_rep++;
      rep[c] = i, hash[c] = h, table[k] = c;
    }
    cls[i] = c;
    if (i + 1 == n) rc = 1;
  }
  if (rc == 1) {
    Shape ps = *s, is = shape_of(1, (int)n);
    ps.d[axis] = n_rep;
    *packed = tensor_new_uninit(t->dtype, &ps);
    *index = tensor_new_uninit(DT_I64, &is);
    if (!*packed || !*index) {
      tensor_unref(*packed);
      tensor_unref(*index);
      rc = TEQ_ERR_NOMEM;
    } else {
      uint8_t *dst = (*packed)->data;
      for (int64_t o = 0; o < outer; o++)
        for (int64_t r = 0; r < n_rep; r++)
          memcpy(dst + ((size_t)o * (size_t)n_rep + (size_t)r) * block,
                 base + (size_t)o * row + (size_t)rep[r] * block, block);
      memcpy((*index)->data, cls, (size_t)n * sizeof *cls);
    }
  }
  free(cls);
  free(rep);
  free(table);
  free(hash);
  return rc;
}

/* Writes constant t, named name, as its distinct slices and the Gathers
 * that spread them out, where that takes at most a quarter of its bytes;
 * false (nothing written) where it does not. */
static bool write_as_slices(Exporter *x, const Tensor *t, const char *name) {
  size_t bytes = (size_t)tensor_numel(t) * dtype_size(t->dtype);
  if (bytes < SLICES_MIN_BYTES || t->shape.ndim > TEQ_MAX_DIMS) return false;
  Tensor *cur = tensor_ref((Tensor *)t), *index[TEQ_MAX_DIMS];
  int axis[TEQ_MAX_DIMS], n_axes = 0;
  size_t packed_bytes = bytes, index_bytes = 0;
  for (int a = 0; a < t->shape.ndim && cur; a++) {
    if (t->shape.d[a] < 2 || t->shape.d[a] > INT32_MAX) continue;
    Tensor *packed = NULL, *idx = NULL;
    int rc = distinct_slices(cur, a, &packed, &idx);
    if (rc < 0) x->nomem = true;
    if (rc != 1) continue;
    tensor_unref(cur);
    cur = packed;
    packed_bytes = (size_t)tensor_numel(cur) * dtype_size(cur->dtype);
    index_bytes += (size_t)tensor_numel(idx) * sizeof(int64_t);
    index[n_axes] = idx;
    axis[n_axes++] = a;
  }
  bool worth = cur && n_axes > 0 && (packed_bytes + index_bytes) * 4 <= bytes;
  if (worth) {
    char base[300];
    snprintf(base, sizeof base, "%s_slices", name);
    const char *prev = unique_name(x, base);
    append_initializer(x, cur, prev);
    for (int k = 0; k < n_axes; k++) {
      snprintf(base, sizeof base, "%s_index%d", name, axis[k]);
      const char *idx = unique_name(x, base);
      append_initializer(x, index[k], idx);
      snprintf(base, sizeof base, "%s_spread%d", name, axis[k]);
      Onnx__NodeProto *np = node_new(x, "Gather", unique_in(x, &x->node_names, base));
      if (!np) break;
      const char *out = k + 1 == n_axes ? name : unique_name(x, base);
      append_string(x, &np->input, &np->n_input, prev);
      append_string(x, &np->input, &np->n_input, idx);
      append_string(x, &np->output, &np->n_output, out);
      OnnxNodeOut w = {.x = x, .np = np};
      onnx_out_attr_int(&w, "axis", axis[k]);
      add_node(x, np);
      prev = out;
    }
  }
  tensor_unref(cur);
  for (int k = 0; k < n_axes; k++) tensor_unref(index[k]);
  return worth;
}

/* ---- sources ---- */

/* A source such as TASO's constant tensors, evaluated to its values. */
static int evaluate_source(Exporter *x, int32_t id, Tensor **out) {
  const Node *n = &x->g->nodes[id];
  Graph *s = graph_new();
  if (!s) {
    x->nomem = true;
    return TEQ_ERR_NOMEM;
  }
  TensorRef none[1] = {{0, 0}}; /* no inputs, but never a NULL array to copy from */
  int k = graph_add_node(s, n->kind, none, 0, 1, &n->params, n->name, x->d);
  int rc = k < 0 ? k : graph_add_output(s, (TensorRef){k, 0}, "value", x->d);
  if (rc >= 0) rc = exec_run(s, EXEC_F32, NULL, out, x->d);
  graph_free(s);
  return rc < 0 ? rc : TEQ_OK;
}

static int export_source(Exporter *x, int32_t id) {
  const Node *n = &x->g->nodes[id];
  if (x->uses[x->offset[id]] == 0) return TEQ_OK; /* an unused constant */
  if (n->kind == OP_CONST) {
    const char *name = tensor_name(x, (TensorRef){id, 0});
    if (!write_as_slices(x, n->value, name)) append_initializer(x, n->value, name);
    return TEQ_OK;
  }
  Tensor *t;
  int rc = evaluate_source(x, id, &t);
  if (rc != TEQ_OK) {
    diag_error(x->d, "%s: cannot evaluate the constant tensor %s (node %d)", x->path,
               op_def(n->kind)->name, id);
    return rc;
  }
  append_initializer(x, t, tensor_name(x, (TensorRef){id, 0}));
  tensor_unref(t);
  return TEQ_OK;
}

/* ---- graph inputs and outputs ---- */

/* Graph inputs and outputs keep their names, so they are taken before any
 * name is generated. An output whose value already has a name (an input, a
 * constant, an earlier output) is written later through an Identity. */
static int reserve_io_names(Exporter *x, const char **out_names, bool *via_identity) {
  const Graph *g = x->g;
  char base[64];
  for (int32_t k = 0; k < g->n_inputs; k++) {
    const Node *n = &g->nodes[g->inputs[k]];
    snprintf(base, sizeof base, "input_%d", k);
    *name_slot(x, (TensorRef){g->inputs[k], 0}) = unique_name(x, n->name ? n->name : base);
  }
  for (int32_t j = 0; j < g->n_outputs; j++) {
    snprintf(base, sizeof base, "output_%d", j);
    const char *name = g->output_names && g->output_names[j] ? g->output_names[j] : base;
    const char **slot = name_slot(x, g->outputs[j]);
    via_identity[j] = false;
    out_names[j] = *slot;
    if (*slot && strcmp(*slot, name) == 0) continue; /* an input passed straight through */
    if (onnx_names_get(&x->taken, name) >= 0) {
      diag_error(x->d, "%s: the name '%s' is used by two graph inputs or outputs", x->path, name);
      return TEQ_ERR_INPUT;
    }
    out_names[j] = unique_name(x, name);
    x->is_output[x->offset[g->outputs[j].node] + g->outputs[j].out] = true;
    bool source = op_def(g->nodes[g->outputs[j].node].kind)->flags & OPF_SOURCE;
    if (*slot || source) via_identity[j] = true;
    else *slot = out_names[j];
  }
  return TEQ_OK;
}

static void write_inputs(Exporter *x) {
  for (int32_t k = 0; k < x->g->n_inputs; k++) {
    const Node *n = &x->g->nodes[x->g->inputs[k]];
    const char *name = tensor_name(x, (TensorRef){x->g->inputs[k], 0});
    append_message(x, &x->gp->input, &x->gp->n_input,
                   value_info_new(name, &n->out[0], onnx_dtype_elem(n->dtype)));
  }
}

static void write_outputs(Exporter *x, const char **out_names, const bool *via_identity) {
  for (int32_t j = 0; j < x->g->n_outputs; j++) {
    TensorRef r = x->g->outputs[j];
    if (via_identity[j]) {
      char base[64];
      snprintf(base, sizeof base, "output_identity_%d", j);
      Onnx__NodeProto *np = node_new(x, "Identity", unique_in(x, &x->node_names, base));
      if (!np) continue;
      append_string(x, &np->input, &np->n_input, tensor_name(x, r));
      append_string(x, &np->output, &np->n_output, out_names[j]);
      add_node(x, np);
    }
    const Node *n = &x->g->nodes[r.node];
    const Shape *s = n->opaque && !shape_is_known(&n->out[r.out])
                         ? &x->decl[x->offset[r.node] + r.out] : &n->out[r.out];
    append_message(x, &x->gp->output, &x->gp->n_output,
                   value_info_new(out_names[j], s, exported_elem(x, r)));
  }
}

/* ---- the model ---- */

static int write_nodes(Exporter *x, const int32_t *order) {
  for (int32_t k = 0; k < x->g->n_nodes; k++) {
    int32_t id = order[k];
    const Node *n = &x->g->nodes[id];
    unsigned flags = op_def(n->kind)->flags;
    int rc = TEQ_OK;
    if (n->kind == OP_INPUT) continue;
    if (flags & OPF_SOURCE) rc = export_source(x, id);
    else if (n->opaque) rc = export_opaque(x, id);
    else rc = export_op(x, id);
    if (rc != TEQ_OK) return rc;
  }
  return TEQ_OK;
}

static int write_graph(Exporter *x) {
  const Graph *g = x->g;
  int32_t *order = malloc(((size_t)g->n_nodes + 1) * sizeof *order);
  const char **out_names = calloc((size_t)g->n_outputs + 1, sizeof *out_names);
  bool *via_identity = calloc((size_t)g->n_outputs + 1, sizeof *via_identity);
  int rc = order && out_names && via_identity ? TEQ_OK : TEQ_ERR_NOMEM;
  if (rc == TEQ_OK && graph_topo_order(g, order) != TEQ_OK)
    rc = internal_error(x, "the graph has a cycle");
  if (rc == TEQ_OK) rc = onnx_export_opset(x->g, x->path, x->at_least, &x->opset, x->d);
  if (rc == TEQ_OK) rc = reserve_io_names(x, out_names, via_identity);
  if (rc == TEQ_OK) write_inputs(x);
  if (rc == TEQ_OK) rc = write_nodes(x, order);
  if (rc == TEQ_OK) write_outputs(x, out_names, via_identity);
  if (rc == TEQ_ERR_NOMEM) x->nomem = true;
  free(order);
  free(out_names);
  free(via_identity);
  return rc == TEQ_ERR_NOMEM ? TEQ_OK : rc; /* reported once, by the caller */
}

/* The IR version that goes with an opset (onnx/helper.py's table). */
static int64_t ir_version_for(int opset) {
  return opset <= 14 ? 7 : opset <= 18 ? 8 : opset <= 20 ? 9 : opset <= 22 ? 10 : 11;
}

static Onnx__OperatorSetIdProto *opset_new(const char *domain, int version) {
  Onnx__OperatorSetIdProto *o = malloc(sizeof *o);
  if (!o) return NULL;
  onnx__operator_set_id_proto__init(o);
  o->domain = strdup(domain);
  o->has_version = 1;
  o->version = version;
  if (!o->domain) {
    onnx_message_free(o);
    return NULL;
  }
  return o;
}

static void finish_model(Exporter *x) {
  Onnx__ModelProto *m = x->m;
  m->has_ir_version = 1;
  m->ir_version = ir_version_for(x->opset);
  append_message(x, &m->opset_import, &m->n_opset_import, opset_new("", x->opset));
  for (int k = 0; k < x->n_domains; k++)
    append_message(x, &m->opset_import, &m->n_opset_import,
                   opset_new(x->domains[k].name, x->domains[k].version));
}

static int exporter_init(Exporter *x) {
  x->uses = graph_use_counts(x->g, &x->offset);
  x->names = x->uses ? calloc((size_t)x->offset[x->g->n_nodes] + 1, sizeof *x->names) : NULL;
  size_t n_slots = x->uses ? (size_t)x->offset[x->g->n_nodes] + 1 : 0;
  x->is_output = n_slots ? calloc(n_slots, sizeof *x->is_output) : NULL;
  x->elem = n_slots ? calloc(n_slots, sizeof *x->elem) : NULL;
  x->decl = n_slots ? calloc(n_slots, sizeof *x->decl) : NULL;
  x->m = malloc(sizeof *x->m);
  x->gp = malloc(sizeof *x->gp);
  if (!x->names || !x->is_output || !x->elem || !x->decl || !x->m || !x->gp) return TEQ_ERR_NOMEM;
  onnx__model_proto__init(x->m);
  onnx__graph_proto__init(x->gp);
  x->m->graph = x->gp;
  x->m->producer_name = strdup("teq");
  x->m->producer_version = strdup("0.1");
  x->gp->name = strdup("teq");
  return x->m->producer_name && x->m->producer_version && x->gp->name ? TEQ_OK : TEQ_ERR_NOMEM;
}

static void exporter_fini(Exporter *x) {
  for (size_t k = 0; k < x->n_lent; k++) {
    onnx_tensor_proto_unlend(x->lent[k].tp);
    tensor_unref(x->lent[k].t);
  }
  free(x->lent);
  if (x->m) onnx_message_free(x->m); /* frees the graph with it */
  else free(x->gp);
  for (size_t k = 0; k < x->n_owned; k++) free(x->owned[k]);
  free(x->owned);
  for (int k = 0; k < x->n_domains; k++) free(x->domains[k].name);
  free(x->domains);
  free(x->names);
  free(x->is_output);
  free(x->elem);
  free(x->decl);
  free(x->uses);
  free(x->offset);
  onnx_names_fini(&x->taken);
  onnx_names_fini(&x->node_names);
}

/* Protobuf refuses messages of 2 GiB or more; a model's structure is a
 * small part of it, and this much is left for it. */
#define INLINE_LIMIT (((size_t)2 << 30) - ((size_t)64 << 20))

/* "<file name of path>.data": where weights go when they do not fit. */
static char *default_data_name(const char *path) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t n = strlen(base) + sizeof ".data";
  char *s = malloc(n);
  if (s) snprintf(s, n, "%s.data", base);
  return s;
}

/* Moves the initializers' bytes into a file beside the model where asked,
 * or where the model would not fit in one message. */
static int place_weights(Exporter *x, const OnnxExportOptions *o) {
  size_t total = 0;
  for (size_t k = 0; k < x->gp->n_initializer; k++) total += x->gp->initializer[k]->raw_data.len;
  if (!o->external && total < INLINE_LIMIT) return TEQ_OK;
  const char *name = o->external_data;
  char *own = NULL;
  if (!name && !(name = own = default_data_name(x->path))) return TEQ_ERR_NOMEM;
  int moved = 0;
  int rc = onnx_external_write(x->gp->initializer, x->gp->n_initializer, x->path, name,
                               o->external_min_bytes ? o->external_min_bytes : 1024, &moved,
                               x->d);
  if (rc == TEQ_OK && !o->external)
    diag_warn(x->d, "%s: %.2f GiB of weights pass protobuf's 2 GiB limit: %d of them are written "
              "to '%s' beside it (ONNX external data)", x->path, (double)total / (1 << 30),
              moved, name);
  free(own);
  return rc;
}

/* ---- fused activations written out ----
 * A fused relu, sigmoid or tanh is written by its producer's row as one
 * node after it. One whose ONNX form is more than a plain unary node
 * (silu: Sigmoid and Mul; relu6: a Clip with its bounds; hard swish: an
 * opset of its own) is split off, in a copy of the graph, into a node of
 * its own kind, which that kind's row writes; a pooled producer's pool is
 * split off after it. */
static bool act_needs_own_node(const Node *n) {
  int ai = param_index(n->kind, "act");
  if (ai < 0 || n->params.v[ai].i[0] == ACT_NONE) return false;
  const OpDef *o = op_def(act_op_kind((int)n->params.v[ai].i[0]));
  return !o->onnx_op || o->onnx_write || o->n_params > 0 || o->onnx_opset > 0;
}

/* *copy: NULL where no activation of g needs its own node, else a copy of
 * g with them split off, the caller's to free. */
static int acts_split(const Graph *g, Graph **copy, Diag *d) {
  *copy = NULL;
  int n0 = g->n_nodes, id = 0;
  while (id < n0 && !act_needs_own_node(&g->nodes[id])) id++;
  if (id == n0) return TEQ_OK;
  Graph *c = graph_copy(g);
  if (!c) {
    diag_error(d, "out of memory");
    return TEQ_ERR_NOMEM;
  }
  bool pooled_any = false;
  int rc = TEQ_OK;
  for (; id < n0 && rc == TEQ_OK; id++) {
    if (!act_needs_own_node(&c->nodes[id])) continue;
    const Node *n = &c->nodes[id];
    int ai = param_index(n->kind, "act"), act = (int)n->params.v[ai].i[0];
    char name[300], pool_name[300];
    snprintf(name, sizeof name, "%s_%s", n->name ? n->name : "node", act_symbols[act]);
    snprintf(pool_name, sizeof pool_name, "%s_pool", n->name ? n->name : "node");
    /* A pooled producer pools after its activation: the activation goes
     * between the producer, unpooled, and a pool of its own (silu and hard
     * swish do not commute with a max). */
    Params bare, pool_p, act_p;
    OpKind pool_kind;
    bool pooled = op_unpooled_twin(n, &bare, &pool_kind, &pool_p);
    TensorRef pre = {id, 0};
    if (pooled) {
      TensorRef in[8];
      int n_in = n->n_in < 8 ? n->n_in : 8;
      memcpy(in, n->in, (size_t)n_in * sizeof *in);
      bare.v[ai].i[0] = ACT_NONE;
      char *own = n->name ? strdup(n->name) : NULL; /* adding a node may move n */
      int b = n->name && !own ? (diag_error(d, "out of memory"), TEQ_ERR_NOMEM)
                              : graph_add_node(c, n->kind, in, n_in, 1, &bare, own, d);
      free(own);
      if (b < 0) {
        rc = b;
        break;
      }
      pre = (TensorRef){b, 0};
      pooled_any = true;
    } else {
      c->nodes[id].params.v[ai].i[0] = ACT_NONE;
    }
    act_op_params(act, &act_p);
    int a = graph_add_node(c, act_op_kind(act), &pre, 1, 1, &act_p, name, d);
    int last = a < 0 || !pooled ? a
                                : graph_add_node(c, pool_kind, &(TensorRef){a, 0}, 1, 1, &pool_p,
                                                 pool_name, d);
    if (last < 0) {
      rc = last;
      break;
    }
    graph_replace_uses(c, (TensorRef){id, 0}, (TensorRef){last, 0});
    c->nodes[a].in[0] = pre; /* the activation of an unpooled producer read its old self */
  }
  /* a pooled producer's old self, read by nothing now */
  if (rc == TEQ_OK && pooled_any && (rc = graph_remove_dead(c)) > 0) rc = TEQ_OK;
  if (rc) {
    graph_free(c);
    return rc;
  }
  *copy = c;
  return TEQ_OK;
}

int onnx_export_file(const Graph *g, const char *path, const OnnxExportOptions *opts,
                     Diag *d) {
  OnnxExportOptions o = opts ? *opts : (OnnxExportOptions){0};
  Graph *copy;
  int rc = acts_split(g, &copy, d);
  if (rc) return rc;
  Exporter x = {.g = copy ? copy : g, .path = path, .d = d, .opset = EXPORT_OPSET,
                .at_least = o.opset};
  rc = exporter_init(&x);
  if (rc == TEQ_OK) rc = write_graph(&x);
  if (rc == TEQ_OK) finish_model(&x);
  if (rc == TEQ_ERR_NOMEM || (rc == TEQ_OK && x.nomem)) {
    diag_error(d, "%s: out of memory while exporting", path);
    rc = TEQ_ERR_NOMEM;
  }
  if (rc == TEQ_OK) rc = place_weights(&x, &o);
  if (rc == TEQ_OK) rc = onnx_pack_to_file(&x.m->base, path, d);
  exporter_fini(&x);
  graph_free(copy);
  return rc;
}
