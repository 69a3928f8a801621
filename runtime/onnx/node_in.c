/* node_in.c: the OnnxNodeIn calls through which registry rows read an ONNX
 * node at import (runtime/onnx.h), and the located messages about nodes.
 * Every attribute a row asks for is marked read, so import.c can warn about
 * the ones nobody read; a wrong attribute type is an error in the node's
 * Diag and sets `failed`, since the accessors return only found/not found.
 * Strings handed out are NUL-terminated copies the node frees. */
#include <assert.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/onnx/onnx_int.h"

static const Shape *value_shape(const Graph *g, const OnnxValue *v) {
  const Shape *s = v->konst ? &v->konst->shape : graph_shape(g, v->ref);
  return shape_is_known(s) ? s : NULL;
}

/* ---- messages ---- */

void onnx_node_where(const char *path, const Onnx__NodeProto *np, int index, char *buf,
                     size_t size) {
  if (np->name && *np->name)
    snprintf(buf, size, "%s: node '%s' (%s)", path, np->name, np->op_type);
  else if (np->n_output && *np->output[0])
    snprintf(buf, size, "%s: node #%d (%s, output '%s')", path, index, np->op_type, np->output[0]);
  else
    snprintf(buf, size, "%s: node #%d (%s)", path, index, np->op_type);
}

const char *onnx_in_where(const OnnxNodeIn *v, char *buf, size_t size) {
  onnx_node_where(v->path, v->np, v->index, buf, size);
  return buf;
}

static int node_report(const OnnxNodeIn *v, Diag *d, int rc, const char *fmt, va_list ap) {
  char where[512], msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  diag_error(d, "%s: %s", onnx_in_where(v, where, sizeof where), msg);
  return rc;
}

int onnx_in_error(const OnnxNodeIn *v, Diag *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = node_report(v, d, TEQ_ERR_INPUT, fmt, ap);
  va_end(ap);
  return rc;
}

int onnx_in_unsupported(const OnnxNodeIn *v, Diag *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = node_report(v, d, TEQ_ERR_UNSUPPORTED, fmt, ap);
  va_end(ap);
  return rc;
}

/* ---- the OnnxNodeIn accessors for registry rows ---- */

const char *onnx_in_op_type(const OnnxNodeIn *v) { return v->np->op_type; }
int onnx_in_opset(const OnnxNodeIn *v) { return v->opset; }
int onnx_in_n_inputs(const OnnxNodeIn *v) { return v->n_in; }
int onnx_in_n_outputs(const OnnxNodeIn *v) { return v->n_out; }

bool onnx_in_drop_unread_outputs(OnnxNodeIn *v, int keep) {
  for (int o = keep; o < v->n_out; o++)
    if (*v->np->output[o] && onnx_names_get(v->read, v->np->output[o]) >= 0) return false;
  if (keep < v->n_out) v->n_out = keep;
  return true;
}

void onnx_in_as_elementwise(OnnxNodeIn *v, OpKind kind) {
  v->form = ONNX_FORM_ELEMENTWISE;
  v->form_kind = kind;
}

void onnx_in_as_chain(OnnxNodeIn *v) { v->form = ONNX_FORM_CHAIN; }

void onnx_in_as_raised(OnnxNodeIn *v, unsigned inputs) {
  v->form = ONNX_FORM_RAISED;
  v->raised_inputs = inputs;
}

void onnx_in_as_kind(OnnxNodeIn *v, OpKind kind) {
  v->form = ONNX_FORM_KIND;
  v->form_kind = kind;
}

static void set_arrange(OnnxArrange *a, const int64_t *perm, int n_perm, int n_sum,
                        const Shape *shape) {
  *a = (OnnxArrange){.n_perm = perm ? n_perm : 0, .n_sum = n_sum, .reshape = shape != NULL};
  for (int k = 0; k < a->n_perm && k < TEQ_MAX_DIMS; k++) a->perm[k] = perm[k];
  if (shape) a->shape = *shape;
}

void onnx_in_as_arranged_input(OnnxNodeIn *v, int i, const int64_t *perm, int n_perm,
                               int n_sum, const Shape *shape) {
  assert(i >= 0 && i < ONNX_ARRANGED_MAX_IN && n_perm <= TEQ_MAX_DIMS && n_sum >= 0);
  v->form = ONNX_FORM_ARRANGED;
  set_arrange(&v->arrange_in[i], perm, n_perm, n_sum, shape);
}

void onnx_in_as_arranged_output(OnnxNodeIn *v, const Shape *shape, const int64_t *perm,
                                int n_perm) {
  assert(n_perm <= TEQ_MAX_DIMS);
  v->form = ONNX_FORM_ARRANGED;
  set_arrange(&v->arrange_out, perm, n_perm, 0, shape);
}

bool onnx_in_has_input(const OnnxNodeIn *v, int i) {
  return i >= 0 && i < v->n_in && v->in[i] != NULL;
}

const Shape *onnx_in_input_shape(const OnnxNodeIn *v, int i) {
  return onnx_in_has_input(v, i) ? value_shape(v->g, v->in[i]) : NULL;
}

const Tensor *onnx_in_const_input(const OnnxNodeIn *v, int i) {
  return onnx_in_has_input(v, i) ? v->in[i]->konst : NULL;
}

void onnx_in_consume_input(OnnxNodeIn *v, int i) {
  if (i >= 0 && i < v->n_in) v->consumed[i] = true;
}

int onnx_attr_type(const Onnx__AttributeProto *a) {
  if (a->has_type) return a->type;
  /* Files from before the type field: infer it from what is set. */
  if (a->n_ints) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
  if (a->n_floats) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS;
  if (a->has_i) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
  if (a->has_f) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
  if (a->has_s) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
  if (a->t) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
  if (a->g) return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
  return ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED;
}

static const char *attr_type_name(int t) {
  static const char *const names[] = {"undefined", "float", "int", "string", "tensor",
                                      "graph", "floats", "ints", "strings", "tensors",
                                      "graphs", "sparse tensor", "sparse tensors", "type",
                                      "types"};
  return t >= 0 && t < (int)(sizeof names / sizeof names[0]) ? names[t] : "unknown";
}

/* The attribute `name` if it exists, marked read; NULL if absent or of
 * another type than want (then an error in d). */
static const Onnx__AttributeProto *find_attr(OnnxNodeIn *v, const char *name, int want) {
  for (size_t k = 0; k < v->np->n_attribute; k++) {
    const Onnx__AttributeProto *a = v->np->attribute[k];
    if (!a->name || strcmp(a->name, name) != 0) continue;
    v->attr_read[k] = true;
    if (onnx_attr_type(a) != want) {
      onnx_in_error(v, v->d, "attribute '%s' is of type %s, expected %s", name,
                    attr_type_name(onnx_attr_type(a)), attr_type_name(want));
      v->failed = true;
      return NULL;
    }
    return a;
  }
  return NULL;
}

bool onnx_in_attr_int(OnnxNodeIn *v, const char *name, int64_t *out) {
  const Onnx__AttributeProto *a = find_attr(v, name, ONNX_ATTR(INT));
  if (a) *out = a->i;
  return a != NULL;
}

bool onnx_in_attr_float(OnnxNodeIn *v, const char *name, double *out) {
  const Onnx__AttributeProto *a = find_attr(v, name, ONNX_ATTR(FLOAT));
  if (a) *out = a->f;
  return a != NULL;
}

bool onnx_in_attr_ints(OnnxNodeIn *v, const char *name, int64_t *out, int max, int *n) {
  const Onnx__AttributeProto *a = find_attr(v, name, ONNX_ATTR(INTS));
  if (!a) return false;
  if (a->n_ints > (size_t)max) {
    onnx_in_unsupported(v, v->d, "attribute '%s' has %zu values, at most %d are supported",
                        name, a->n_ints, max);
    v->failed = true;
    return false;
  }
  if (a->n_ints) memcpy(out, a->ints, a->n_ints * sizeof *out); /* ints is NULL when empty */
  *n = (int)a->n_ints;
  return true;
}

bool onnx_in_attr_int_list(OnnxNodeIn *v, const char *name, const int64_t **out, int *n) {
  const Onnx__AttributeProto *a = find_attr(v, name, ONNX_ATTR(INTS));
  if (a) {
    *out = a->ints;
    *n = (int)a->n_ints;
  }
  return a != NULL;
}

bool onnx_in_attr_floats(OnnxNodeIn *v, const char *name, const float **out, int *n) {
  const Onnx__AttributeProto *a = find_attr(v, name, ONNX_ATTR(FLOATS));
  if (a) {
    *out = a->floats;
    *n = (int)a->n_floats;
  }
  return a != NULL;
}

bool onnx_in_attr_string(OnnxNodeIn *v, const char *name, const char **out) {
  const Onnx__AttributeProto *a = find_attr(v, name, ONNX_ATTR(STRING));
  if (!a) return false;
  /* protobuf bytes are not NUL-terminated: hand out a copy the node owns. */
  char **s = realloc(v->strings, (size_t)(v->n_strings + 1) * sizeof *s);
  char *copy = s ? strndup((const char *)a->s.data, a->s.len) : NULL;
  if (s) v->strings = s;
  if (!copy) {
    onnx_in_error(v, v->d, "out of memory");
    v->failed = true;
    return false;
  }
  v->strings[v->n_strings++] = copy;
  *out = copy;
  return true;
}

bool onnx_in_attr_tensor(OnnxNodeIn *v, const char *name, Tensor **out) {
  const Onnx__AttributeProto *a = find_attr(v, name, ONNX_ATTR(TENSOR));
  if (!a || !a->t) return false;
  char where[600], at[512];
  snprintf(where, sizeof where, "%s: attribute '%s'", onnx_in_where(v, at, sizeof at), name);
  if (onnx_tensor_from_proto(a->t, where, out, v->d) != TEQ_OK) {
    v->failed = true;
    return false;
  }
  return true;
}
