/* ops.c: the registry table, its self-check, and parameter handling.
 * The table is built from ops.def, so the enum, the count and the rows
 * cannot drift apart; each row is defined in its family file under
 * runtime/ops/. Parameter defaults, bounds and formatting are all driven
 * by the rows' OpParam descriptions. */
#include "runtime/ops.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/graph.h"
#include "runtime/ops/family.h"

const char *const act_symbols[] = {"none",         "relu",
                                   "sigmoid",      "tanh",
                                   "silu",         "hard_swish",
                                   "relu6",        "hard_sigmoid",
                                   "hard_sigmoid_fifth", NULL};

static const OpDef *const op_table[OP__COUNT] = {
#define OP(KIND, name) [OP_##KIND] = &op_def_##name,
#include "runtime/ops.def"
#undef OP
};

const OpDef *op_def(OpKind kind) { return op_table[kind]; }

bool op_view(const Node *n, const Shape *in, const Tensor *const *consts, int64_t *first) {
  const OpDef *o = op_def(n->kind);
  if (!o->view || n->n_in < 1 || !shape_is_known(&in[0])) return false;
  int64_t elem = (int64_t)dtype_size(n->dtype);
  for (int j = 0; j < n->n_out; j++) {
    int64_t at = 0;
    if (!o->view(n, in, consts, j, &at) || (at * elem) % OP_PLACE_ALIGN) return false;
    if (first) first[j] = at;
  }
  return true;
}

bool op_assembled(const Node *n, const Shape *in, int64_t *first) {
  const OpDef *o = op_def(n->kind);
  if (!o->assembled || n->n_out != 1 || n->n_in < 1) return false;
  int64_t elem = (int64_t)dtype_size(n->dtype);
  for (int j = 0; j < n->n_in; j++)
    if (!shape_is_known(&in[j])) return false;
  int64_t *at = first ? first : malloc((size_t)n->n_in * sizeof *at);
  bool ok = at && o->assembled(n, in, at);
  for (int j = 0; j < n->n_in && ok; j++) ok = (at[j] * elem) % OP_PLACE_ALIGN == 0;
  if (at != first) free(at);
  return ok;
}

bool op_takes_pad(const Node *reader, const Node *pad, Params *p) {
  const OpDef *r = op_def(reader->kind), *z = op_def(pad->kind);
  int rank = pad->n_out == 1 ? pad->out[0].ndim : -1;
  int64_t pads[TEQ_MAX_PARAM_LEN];
  if (!r->take_zero_pad || !z->zero_pad || rank < 1 || 2 * rank > TEQ_MAX_PARAM_LEN ||
      !z->zero_pad(pad, rank, pads))
    return false;
  *p = reader->params;
  return r->take_zero_pad(reader, rank, pads, p);
}

int op_by_name(const char *name) {
  for (int k = 0; k < OP__COUNT; k++)
    if (strcmp(op_table[k]->name, name) == 0) return k;
  return -1;
}

int op_by_onnx(const char *op_type) {
  for (int k = 0; k < OP__COUNT; k++) {
    const OpDef *o = op_table[k];
    if (o->onnx_op && strcmp(o->onnx_op, op_type) == 0) return k;
  }
  for (int k = 0; k < OP__COUNT; k++) {
    const OpDef *o = op_table[k];
    for (const char *const *a = o->onnx_aliases; a && *a; a++)
      if (strcmp(*a, op_type) == 0) return k;
  }
  return -1;
}

static int check_param_row(const OpDef *o, const OpParam *p, Diag *d) {
  int bad = 0;
  if (!p->name) return diag_error(d, "registry: %s: a parameter has no name", o->name);
  if (p->type != PARAM_FLOAT && p->lo > p->hi)
    bad = diag_error(d, "registry: %s.%s: bounds %lld > %lld", o->name, p->name,
                     (long long)p->lo, (long long)p->hi);
  if (p->type != PARAM_FLOAT && (p->def < p->lo || p->def > p->hi))
    bad = diag_error(d, "registry: %s.%s: default %lld outside [%lld, %lld]", o->name, p->name,
                     (long long)p->def, (long long)p->lo, (long long)p->hi);
  if (p->type == PARAM_INTS && (p->len < 0 || p->len > TEQ_MAX_PARAM_LEN))
    bad = diag_error(d, "registry: %s.%s: length %d outside [0, %d]", o->name, p->name, p->len,
                     TEQ_MAX_PARAM_LEN);
  return bad;
}

int op_registry_check(Diag *d) {
  int rc = TEQ_OK;
  for (int k = 0; k < OP__COUNT; k++) {
    const OpDef *o = op_table[k];
    if (!o || (int)o->kind != k) {
      diag_error(d, "registry: row %d is missing or has the wrong kind", k);
      rc = TEQ_ERR_INTERNAL;
      continue;
    }
    for (int j = 0; j < k; j++)
      if (strcmp(op_table[j]->name, o->name) == 0) {
        diag_error(d, "registry: name '%s' used twice", o->name);
        rc = TEQ_ERR_INTERNAL;
      }
    if (o->n_params < 0 || o->n_params > TEQ_MAX_PARAMS || (o->n_params && !o->params)) {
      diag_error(d, "registry: %s: bad parameter count %d", o->name, o->n_params);
      rc = TEQ_ERR_INTERNAL;
      continue;
    }
    for (int i = 0; i < o->n_params; i++) {
      if (check_param_row(o, &o->params[i], d)) rc = TEQ_ERR_INTERNAL;
      for (int j = 0; j < i; j++)
        if (strcmp(o->params[i].name, o->params[j].name) == 0) {
          diag_error(d, "registry: %s: parameter '%s' twice", o->name, o->params[i].name);
          rc = TEQ_ERR_INTERNAL;
        }
    }
    if (o->n_in_min < 0 || (o->n_in_max >= 0 && o->n_in_max < o->n_in_min) ||
        o->n_out_min < 1 || o->n_out_max < o->n_out_min) {
      diag_error(d, "registry: %s: arity bounds out of order", o->name);
      rc = TEQ_ERR_INTERNAL;
    }
    /* A weight is an input the row has, and never the data (input 0). */
    unsigned inputs = o->n_in_max < 0 || o->n_in_max >= 32 ? ~0u : (1u << o->n_in_max) - 1;
    if (o->weight_inputs & (~inputs | 1u)) {
      diag_error(d, "registry: %s: weight_inputs names input 0 or an input past %d", o->name,
                 o->n_in_max);
      rc = TEQ_ERR_INTERNAL;
    }
    /* A neutral constant stands for one of two element-wise operands. */
    if (o->neutral_inputs &&
        (o->neutral_inputs & ~3u || o->n_in_min != 2 || o->n_in_max != 2 ||
         !(o->flags & OPF_ELEMENTWISE))) {
      diag_error(d, "registry: %s: neutral_inputs on an operator not binary and element-wise",
                 o->name);
      rc = TEQ_ERR_INTERNAL;
    }
    bool opaque = o->flags & OPF_OPAQUE;
    bool source = o->flags & OPF_SOURCE;
    if (!opaque && !o->infer_shape) {
      diag_error(d, "registry: %s: no shape inference", o->name);
      rc = TEQ_ERR_INTERNAL;
    }
    /* Graph inputs and constants are fed by the executor, not computed. */
    bool fed = k == OP_INPUT || k == OP_CONST;
    if (!opaque && !fed && (!o->eval_f32 || !o->eval_modp)) {
      diag_error(d, "registry: %s: missing a float32 or Z_p kernel", o->name);
      rc = TEQ_ERR_INTERNAL;
    }
#ifdef TEQ_HAVE_CUDA
    /* A build with CUDA runs every computed operator on the GPU too. */
    if (!opaque && !source && !o->eval_cuda) {
      diag_error(d, "registry: %s: no GPU kernel", o->name);
      rc = TEQ_ERR_INTERNAL;
    }
#endif
    if ((o->flags & OPF_NONLINEAR) && !o->modp_standin) {
      diag_error(d, "registry: %s: non-linear without a Z_p stand-in", o->name);
      rc = TEQ_ERR_INTERNAL;
    }
    if (source && o->n_in_max != 0) {
      diag_error(d, "registry: %s: a source with inputs", o->name);
      rc = TEQ_ERR_INTERNAL;
    }
  }
  /* Stand-ins must differ, or two different non-linear operators would
   * fingerprint alike. Compare them on a few points. */
  for (int a = 0; a < OP__COUNT; a++)
    for (int b = 0; b < a; b++) {
      uint32_t (*fa)(uint32_t) = op_table[a]->modp_standin, (*fb)(uint32_t) = op_table[b]->modp_standin;
      if (!fa || !fb) continue;
      bool same = true;
      for (uint32_t x = 2; x < 40 && same; x += 7) same = fa(x) == fb(x);
      if (same) {
        diag_error(d, "registry: %s and %s share a Z_p stand-in", op_table[a]->name,
                   op_table[b]->name);
        rc = TEQ_ERR_INTERNAL;
      }
    }
  return rc;
}

int param_index(OpKind kind, const char *name) {
  const OpDef *o = op_table[kind];
  for (int i = 0; i < o->n_params; i++)
    if (strcmp(o->params[i].name, name) == 0) return i;
  return -1;
}

uint64_t params_hash(uint64_t h, const Params *p) {
  uint64_t w[TEQ_MAX_PARAMS * (TEQ_MAX_PARAM_LEN + 2)];
  size_t k = 0;
  for (int i = 0; i < TEQ_MAX_PARAMS; i++) {
    const ParamValue *v = &p->v[i];
    int n = v->n < 0 ? 0 : v->n > TEQ_MAX_PARAM_LEN ? TEQ_MAX_PARAM_LEN : v->n;
    w[k++] = (uint64_t)n;
    for (int j = 0; j < n; j++) w[k++] = (uint64_t)v->i[j];
    memcpy(&w[k++], &v->f, sizeof v->f);
  }
  return hash_bytes(h, w, k * sizeof *w);
}

void params_default(OpKind kind, Params *p) {
  memset(p, 0, sizeof *p);
  const OpDef *o = op_table[kind];
  for (int i = 0; i < o->n_params; i++) {
    const OpParam *r = &o->params[i];
    ParamValue *v = &p->v[i];
    switch (r->type) {
    case PARAM_INT: v->n = 1; v->i[0] = r->def; break;
    case PARAM_INTS:
      v->n = r->len;
      for (int j = 0; j < r->len; j++) v->i[j] = r->def;
      break;
    case PARAM_FLOAT: v->f = r->fdef; break;
    }
  }
}

int params_check(OpKind kind, const Params *p, Diag *d) {
  const OpDef *o = op_table[kind];
  int rc = TEQ_OK;
  for (int i = 0; i < o->n_params; i++) {
    const OpParam *r = &o->params[i];
    const ParamValue *v = &p->v[i];
    if (r->type == PARAM_FLOAT) {
      if (!isfinite(v->f)) rc = diag_error(d, "%s: %s=%g: must be finite", o->name, r->name, v->f);
      continue;
    }
    int want = r->type == PARAM_INT ? 1 : r->len;
    if ((want && v->n != want) || v->n < 0 || v->n > TEQ_MAX_PARAM_LEN) {
      rc = diag_error(d, "%s: %s has %d values, expected %d", o->name, r->name, v->n,
                      want ? want : TEQ_MAX_PARAM_LEN);
      continue;
    }
    for (int j = 0; j < v->n; j++)
      if (v->i[j] < r->lo || v->i[j] > r->hi) {
        rc = diag_error(d, "%s: %s=%lld: must be in [%lld, %lld]", o->name, r->name,
                        (long long)v->i[j], (long long)r->lo, (long long)r->hi);
        break;
      }
  }
  return rc;
}

void param_set_int(Params *p, int i, int64_t v) {
  memset(&p->v[i], 0, sizeof p->v[i]);
  p->v[i].n = 1;
  p->v[i].i[0] = v;
}

void param_set_ints(Params *p, int i, const int64_t *v, int n) {
  memset(&p->v[i], 0, sizeof p->v[i]);
  if (n > TEQ_MAX_PARAM_LEN) n = TEQ_MAX_PARAM_LEN;
  p->v[i].n = n;
  for (int j = 0; j < n; j++) p->v[i].i[j] = v[j];
}

void param_set_float(Params *p, int i, double v) {
  memset(&p->v[i], 0, sizeof p->v[i]);
  p->v[i].f = v;
}

int params_format(OpKind kind, const Params *p, bool only_changed, char *buf, size_t size) {
  const OpDef *o = op_table[kind];
  Params def;
  params_default(kind, &def);
  size_t n = 0;
  if (size) buf[0] = '\0';
#define EMIT(...)                                                                   \
  do {                                                                              \
    int k_ = snprintf(n < size ? buf + n : NULL, n < size ? size - n : 0, __VA_ARGS__); \
    if (k_ > 0) n += (size_t)k_;                                                    \
  } while (0)
  for (int i = 0; i < o->n_params; i++) {
    const OpParam *r = &o->params[i];
    const ParamValue *v = &p->v[i];
    if ((only_changed || r->quiet_default) && memcmp(v, &def.v[i], sizeof *v) == 0) continue;
    EMIT("%s%s=", n ? " " : "", r->name);
    if (r->type == PARAM_FLOAT) {
      EMIT("%.9g", v->f);
    } else if (r->type == PARAM_INT) {
      int64_t x = v->i[0];
      int n_sym = 0;
      while (r->symbols && r->symbols[n_sym]) n_sym++;
      if (x >= 0 && x < n_sym) EMIT("%s", r->symbols[x]);
      else EMIT("%lld", (long long)x);
    } else {
      EMIT("(");
      for (int j = 0; j < v->n; j++) EMIT("%s%lld", j ? " " : "", (long long)v->i[j]);
      EMIT(")");
    }
  }
#undef EMIT
  return (int)n;
}

int params_parse(OpKind kind, const char *text, Params *p, Diag *d) {
  const OpDef *o = op_table[kind];
  params_default(kind, p);
  const char *c = text;
  while (*c) {
    while (*c == ' ') c++;
    if (!*c) break;
    const char *eq = strchr(c, '=');
    if (!eq) return diag_error(d, "%s: expected name=value at '%s'", o->name, c);
    int i = -1;
    for (int k = 0; k < o->n_params; k++)
      if (strlen(o->params[k].name) == (size_t)(eq - c) &&
          strncmp(o->params[k].name, c, (size_t)(eq - c)) == 0)
        i = k;
    if (i < 0) return diag_error(d, "%s: no parameter '%.*s'", o->name, (int)(eq - c), c);
    const OpParam *r = &o->params[i];
    c = eq + 1;
    char *end = NULL;
    if (r->type == PARAM_FLOAT) {
      param_set_float(p, i, strtod(c, &end));
    } else if (r->type == PARAM_INT) {
      size_t len = strcspn(c, " ");
      int64_t x = 0;
      bool found = false;
      for (int k = 0; r->symbols && r->symbols[k] && !found; k++)
        if (strlen(r->symbols[k]) == len && strncmp(r->symbols[k], c, len) == 0) x = k, found = true;
      if (found) end = (char *)c + len;
      else x = strtoll(c, &end, 10);
      param_set_int(p, i, x);
    } else {
      int64_t v[TEQ_MAX_PARAM_LEN];
      int n = 0;
      if (*c != '(') return diag_error(d, "%s: %s: expected '(' at '%s'", o->name, r->name, c);
      c++;
      while (*c != ')' && n < TEQ_MAX_PARAM_LEN) {
        v[n++] = strtoll(c, &end, 10);
        if (end == c) return diag_error(d, "%s: %s: expected an integer at '%s'", o->name, r->name, c);
        c = end;
        while (*c == ' ') c++;
      }
      if (*c != ')') return diag_error(d, "%s: %s: expected ')' at '%s'", o->name, r->name, c);
      end = (char *)c + 1;
      param_set_ints(p, i, v, n);
    }
    if (end == c || (*end && *end != ' '))
      return diag_error(d, "%s: %s: bad value at '%s'", o->name, r->name, c);
    c = end;
  }
  return params_check(kind, p, d);
}

/* ---- helpers shared by the family files ---- */

int infer_like_input0(const Node *n, const Shape *in, Shape *out, Diag *d) {
  (void)d;
  for (int i = 0; i < n->n_out; i++) out[i] = in[0];
  return TEQ_OK;
}

int op_error_report(const Node *n, Diag *d, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return diag_error(d, "%s: %s", op_table[n->kind]->name, msg);
}

/* Each activation runs its operator's row, but the relu, which maps NaN
 * to 0 here, as cuDNN's fused one does (the relu row keeps a positive
 * NaN). */
void act_apply_f32(int act, float *x, int64_t n) {
  if (act == ACT_NONE) return;
  if (act == ACT_RELU) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0 ? x[i] : 0;
    return;
  }
  Params p;
  act_op_params(act, &p);
  unary_apply_f32(act_op_kind(act), &p, x, x, n);
}

static const OpKind kind_of_act[ACT__COUNT] = {
  [ACT_NONE] = OP__COUNT, [ACT_RELU] = OP_RELU, [ACT_SIGMOID] = OP_SIGMOID,
  [ACT_TANH] = OP_TANH,   [ACT_SILU] = OP_SILU, [ACT_HARD_SWISH] = OP_HARD_SWISH,
  [ACT_RELU6] = OP_CLIP,  [ACT_HARD_SIGMOID] = OP_HARD_SIGMOID,
  [ACT_HARD_SIGMOID_FIFTH] = OP_HARD_SIGMOID,
};

OpKind act_op_kind(int act) {
  return act > ACT_NONE && act < ACT__COUNT ? kind_of_act[act] : OP__COUNT;
}

void act_op_params(int act, Params *p) {
  OpKind k = act_op_kind(act);
  if (k == OP__COUNT) {
    memset(p, 0, sizeof *p);
    return;
  }
  params_default(k, p);
  if (act == ACT_RELU6) {
    param_set_float(p, param_index(OP_CLIP, "min"), 0.0);
    param_set_float(p, param_index(OP_CLIP, "max"), 6.0);
  } else if (act == ACT_HARD_SIGMOID) { /* PyTorch's, exported with float32 attributes */
    param_set_float(p, param_index(OP_HARD_SIGMOID, "alpha"), (double)(1.0f / 6.0f));
    param_set_float(p, param_index(OP_HARD_SIGMOID, "beta"), 0.5);
  } else if (act == ACT_HARD_SIGMOID_FIFTH) { /* ONNX's defaults, read as float32 */
    param_set_float(p, param_index(OP_HARD_SIGMOID, "alpha"), (double)0.2f);
    param_set_float(p, param_index(OP_HARD_SIGMOID, "beta"), 0.5);
  }
}

int act_of_node(const Node *n) {
  for (int act = ACT_RELU; act < ACT__COUNT; act++) {
    if (kind_of_act[act] != n->kind) continue;
    Params p;
    act_op_params(act, &p);
    if (memcmp(&p, &n->params, sizeof p) == 0) return act;
  }
  return ACT_NONE;
}

bool op_output_pooled(const Node *n) {
  int i = param_index(n->kind, "pool");
  return i >= 0 && n->params.v[i].i[0] != 0;
}

bool op_unpooled_twin(const Node *n, Params *unpooled, OpKind *pool, Params *pool_params) {
  int i = param_index(n->kind, "pool");
  if (i < 0 || n->params.v[i].i[0] == 0) return false;
  int64_t k = n->params.v[i].i[0];
  *unpooled = n->params;
  unpooled->v[i].i[0] = 0;
  *pool = OP_MAXPOOL;
  params_default(OP_MAXPOOL, pool_params);
  param_set_ints(pool_params, param_index(OP_MAXPOOL, "kernel"), (const int64_t[]){k, k}, 2);
  param_set_ints(pool_params, param_index(OP_MAXPOOL, "stride"), (const int64_t[]){k, k}, 2);
  return true;
}

bool op_bare_twin(const Node *n, Params *bare, int *n_bare_in, OpKind *pass,
                  Params *pass_params) {
  const OpDef *o = op_def(n->kind);
  int act = -1;
  for (int p = 0; p < o->n_params; p++)
    if (o->params[p].adds_work) act = p;
  if (act < 0) return false;
  int64_t fused = n->params.v[act].i[0];
  if (fused == 0 && n->n_in <= o->n_in_min) return false;
  *bare = n->params;
  bare->v[act].i[0] = 0;
  *n_bare_in = o->n_in_min;
  /* A bias alone is added in one pass over the output, as a relu is applied. */
  *pass = fused ? act_op_kind((int)fused) : OP_RELU;
  if (*pass == OP__COUNT) return false;
  if (fused) act_op_params((int)fused, pass_params);
  else params_default(OP_RELU, pass_params);
  return true;
}

void act_apply_modp(int act, uint32_t *x, int64_t n) {
  /* The fused activation uses the same map as the stand-alone operator, so
   * conv+relu and relu(conv) fingerprint alike. */
  if (act == ACT_NONE) return;
  Params p;
  act_op_params(act, &p);
  unary_apply_modp(act_op_kind(act), &p, x, x, n);
}
