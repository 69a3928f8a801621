/* eval.c: a graph under construction, evaluated one operator at a time.
 *
 * The enumeration pushes an operator, evaluates only that operator in Z_p
 * with the registry's kernel (its inputs are already computed), recurses,
 * and pops it: incremental evaluation along the DFS. Each slot keeps a
 * hash of its value (for fingerprints and for spotting a value computed
 * twice) and a structural hash (for the canonical order and for spotting
 * an operation done twice). The fingerprint is a sum of the outputs' mixed
 * value hashes, so it does not depend on output order and is updated in
 * O(1) per push and pop. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/gen_int.h"

#define GEN_MAX_NUMEL 4096 /* larger intermediates only slow the search */

static uint64_t out_mix(uint64_t vh) { return hash_mix(vh, 0x6f7574707574ull); }

static uint64_t value_hash(const Tensor *t) {
  uint64_t h = hash_mix(0x76616c, (uint64_t)t->shape.ndim);
  for (int i = 0; i < t->shape.ndim; i++) h = hash_mix(h, (uint64_t)t->shape.d[i]);
  return hash_bytes(h, t->data, tensor_bytes(t));
}

static void count_var_gaps(GenState *s);

int gen_state_init(GenState *s, const GenVocab *v, int shape, uint64_t seed) {
  memset(s, 0, sizeof *s);
  s->v = v;
  s->shape = shape;
  for (int i = 0; i < v->n_vars; i++) {
    Shape sh = gen_var_shape(v, i, shape);
    Tensor *t = tensor_new(DT_MODP, &sh);
    if (!t) {
      gen_state_fini(s);
      return TEQ_ERR_NOMEM;
    }
    tensor_fill_random(t, hash_mix(hash_mix(seed, (uint64_t)shape), (uint64_t)i));
    GenSlot *sl = &s->slot[s->n_slots++];
    sl->t = t;
    sl->vh = value_hash(t);
    sl->sh = gen_hash_var(i);
    sl->weight = v->vars[i].weight;
    sl->op = -1;
  }
  count_var_gaps(s);
  return TEQ_OK;
}

void gen_state_set_fresh(GenState *s, uint64_t fresh_sh, uint64_t fresh_seed) {
  s->fresh_sh = fresh_sh;
  s->fresh_seed = fresh_seed;
}

void gen_state_fini(GenState *s) {
  gen_pop_all(s);
  for (int i = 0; i < s->n_slots; i++) tensor_unref(s->slot[i].t);
  s->n_slots = 0;
}

/* ---- structural hashes and the canonical order ---- */

uint64_t gen_hash_var(int var) { return hash_mix(0x766172, (uint64_t)var); }

uint64_t gen_hash_op(const GenVocab *v, int ti, uint64_t a, uint64_t b) {
  if ((v->t[ti].flags & T_COMMUTATIVE) && b < a) {
    uint64_t x = a;
    a = b, b = x;
  }
  return hash_mix(hash_mix(v->op_seed[ti], a), b);
}

uint64_t gen_op_sh(const GenState *s, GenOp op, int *after) {
  const GenTemplate *t = &s->v->t[op.t];
  uint64_t a = t->n_in > 0 ? s->slot[op.in[0]].sh : 0;
  uint64_t b = t->n_in > 1 ? s->slot[op.in[1]].sh : 0;
  int last = 0;
  for (int i = 0; i < t->n_in; i++) {
    int p = s->slot[op.in[i]].op;
    if (p + 1 > last) last = p + 1;
  }
  if (after) *after = last;
  return gen_hash_op(s->v, op.t, a, b);
}

/* ---- template checks and parameters ---- */

/* Whether split may halve x along axis without a concat boundary there: x
 * an activation variable of even extent. Then concat(split(x)) = x is a
 * rule, and a search can remove the split and concat a merge of two convs
 * leaves between the merged conv and its bias and activation (SqueezeNet's
 * fire modules). Computed tensors still split only at a boundary. */
static bool halvable(const GenSlot *x, int axis) {
  int64_t len = x->t->shape.d[axis];
  return x->op < 0 && !x->weight && len >= 2 && len % 2 == 0;
}

bool gen_op_applies(const GenState *s, GenOp op) {
  const GenTemplate *t = &s->v->t[op.t];
  if (t->n_in > 0 && op.in[0] >= s->n_slots) return false;
  if (t->n_in > 1 && op.in[1] >= s->n_slots) return false;
  const GenSlot *x = t->n_in > 0 ? &s->slot[op.in[0]] : NULL;
  const GenSlot *y = t->n_in > 1 ? &s->slot[op.in[1]] : NULL;
  if (t->rank && x->t->shape.ndim != t->rank) return false;
  if ((t->flags & T_ACT_INPUT) && x->weight) return false;
  if ((t->flags & T_VAR_INPUT) && x->op >= 0) return false;
  if ((t->flags & T_SAME_SHAPE) && !shape_equal(&x->t->shape, &y->t->shape)) return false;
  if ((t->flags & T_SCALAR_IN1) && tensor_numel(y->t) != 1) return false;
  if ((t->flags & T_DISTINCT) && op.in[0] == op.in[1]) return false;
  if (t->axis >= 0 && t->axis >= x->t->shape.ndim) return false;
  if ((t->flags & T_BOUNDARY) && x->bound[t->axis] <= 0 && !halvable(x, t->axis)) return false;
  /* Kernels are joined along their channels only; concatenating kernel
   * taps builds nothing a network has. */
  if (t->bound == BR_CONCAT && t->axis >= 2 && (x->weight || y->weight)) return false;
  /* Cheap shape tests before the registry's (which formats a message). */
  if (t->bound == BR_MATMUL) {
    int r = x->t->shape.ndim;
    if (y->t->shape.ndim != r || x->t->shape.d[r - 1] != y->t->shape.d[r - 2]) return false;
  }
  if (t->bound == BR_GEMM) { /* inner extents: A's columns, or rows when transposed */
    if (y->t->shape.ndim != 2) return false;
    if (x->t->shape.d[t->trans & 1 ? 0 : 1] != y->t->shape.d[t->trans & 2 ? 1 : 0]) return false;
  }
  if (t->bound == BR_CONCAT) {
    if (y->t->shape.ndim != x->t->shape.ndim) return false;
    for (int a = 0; a < x->t->shape.ndim; a++)
      if (a != t->axis && x->t->shape.d[a] != y->t->shape.d[a]) return false;
  }
  /* smul of a scalar is ewmul of two scalars: one way only. */
  if ((t->flags & T_SCALAR_IN1) && x->t->shape.ndim == 0) return false;
  return true;
}

/* Sets the parameter called name if kind's row has one. */
static void set_ints(Params *p, OpKind kind, const char *name, const int64_t *v, int n) {
  int i = param_index(kind, name);
  if (i >= 0) param_set_ints(p, i, v, n);
}
static void set_int(Params *p, OpKind kind, const char *name, int64_t v) {
  int i = param_index(kind, name);
  if (i >= 0) param_set_int(p, i, v);
}

/* Parameters by name from the template, the inputs and the assignment:
 * whatever the operator's row has of them. Returns false when a derived
 * value does not exist (channels that do not divide into groups). */
static bool template_params(const GenState *s, const GenTemplate *t, const Shape *in,
                            Params *p) {
  OpKind k = t->kind;
  const int64_t *dims = s->v->dims[s->shape];
  params_default(k, p);
  if (t->dilation) { /* a convolution template */
    /* The weight's kernel must be the template's, and "same" padding. */
    if (in[1].ndim != 4 || in[1].d[2] != t->kh || in[1].d[3] != t->kw) return false;
    if (in[1].d[1] < 1 || in[0].d[1] % in[1].d[1]) return false;
    int64_t dl = t->dilation, ph = (t->kh - 1) * dl / 2, pw = (t->kw - 1) * dl / 2;
    set_ints(p, k, "pads", (int64_t[]){ph, pw, ph, pw}, 4);
    set_ints(p, k, "dilation", (int64_t[]){dl, dl}, 2);
    set_int(p, k, "groups", in[0].d[1] / in[1].d[1]);
  } else if (param_index(k, "kernel") >= 0) { /* pools: 3x3, stride 1, "same" */
    set_ints(p, k, "kernel", (int64_t[]){t->kh, t->kw}, 2);
    set_ints(p, k, "pads", (int64_t[]){t->kh / 2, t->kw / 2, t->kh / 2, t->kw / 2}, 4);
    set_int(p, k, "count_include_pad", 1); /* avgpool equals conv with C_pool */
  } else if (t->flags & T_VAR_INPUT) { /* enlarge: only a smaller kernel */
    if (in[0].d[2] == t->kh && in[0].d[3] == t->kw) return false;
    set_int(p, k, "kh", t->kh);
    set_int(p, k, "kw", t->kw);
  }
  if (t->act) set_int(p, k, "act", t->act); /* conv's or matmul's fused activation */
  if (t->axis >= 0) set_int(p, k, "axis", t->axis);
  if (t->trans) {
    set_int(p, k, "transA", t->trans & 1);
    set_int(p, k, "transB", (t->trans >> 1) & 1);
  }
  switch (t->source) {
  case TP_POOL_C:
  case TP_ICONV_C:
    set_int(p, k, "channels", dims[SYM_C]);
    set_int(p, k, "kh", t->kh);
    set_int(p, k, "kw", t->kw);
    break;
  case TP_IMM_K:
    set_int(p, k, "n", dims[SYM_K]);
    break;
  case TP_ONE_IMAGE:
    set_ints(p, k, "shape", (int64_t[]){dims[SYM_N], dims[SYM_C], dims[SYM_H], dims[SYM_W]}, 4);
    break;
  case TP_ONE_MATRIX:
    set_ints(p, k, "shape", (int64_t[]){dims[SYM_M], dims[SYM_K]}, 2);
    break;
  default:
    break;
  }
  return true;
}

/* Boundaries of the outputs from the inputs' (see BR_* in gen_int.h). */
static void propagate_bounds(const GenTemplate *t, const GenSlot *x, const GenSlot *y,
                             const Shape *out, int8_t bound[2][4]) {
  memset(bound, 0, 2 * 4);
  int r = out[0].ndim;
  switch (t->bound) {
  case BR_SAME:
    for (int a = 0; a < r && a < 4; a++) {
      int8_t bx = x->bound[a], by = y && t->n_in > 1 && !(t->flags & T_SCALAR_IN1) ? y->bound[a] : 0;
      bound[0][a] = bx == by ? bx : !by ? bx : !bx ? by : 0;
    }
    break;
  case BR_TRANSPOSE:
    bound[0][0] = x->bound[1], bound[0][1] = x->bound[0];
    break;
  case BR_MATMUL:
    for (int a = 0; a < r - 2; a++) bound[0][a] = x->bound[a] == y->bound[a] ? x->bound[a] : 0;
    bound[0][r - 2] = x->bound[r - 2];
    bound[0][r - 1] = y->bound[r - 1];
    break;
  case BR_GEMM:
    bound[0][0] = x->bound[t->trans & 1 ? 1 : 0];
    bound[0][1] = y->bound[t->trans & 2 ? 0 : 1];
    break;
  case BR_CONV:
    bound[0][0] = x->bound[0], bound[0][1] = y->bound[0];
    break;
  case BR_POOL:
    bound[0][0] = x->bound[0], bound[0][1] = x->bound[1];
    break;
  case BR_CONCAT:
    for (int a = 0; a < r && a < 4; a++)
      bound[0][a] = a == t->axis ? (int8_t)x->t->shape.d[a]
                                 : x->bound[a] == y->bound[a] ? x->bound[a] : 0;
    break;
  case BR_SPLIT:
    for (int o = 0; o < 2; o++)
      for (int a = 0; a < r && a < 4; a++) bound[o][a] = a == t->axis ? 0 : x->bound[a];
    break;
  default:
    break;
  }
}

/* ---- push and pop ---- */

static void add_output(GenState *s, int slot) {
  s->out_sum += out_mix(s->slot[slot].vh);
  s->n_outputs++;
}
static void remove_output(GenState *s, int slot) {
  s->out_sum -= out_mix(s->slot[slot].vh);
  s->n_outputs--;
}

/* A variable's use count; the gap count changes only when a variable
 * starts or stops being used, so only then is it recounted. */
static void var_use(GenState *s, int var, int delta) {
  bool was = s->var_uses[var] > 0;
  s->var_uses[var] += delta;
  if (was != (s->var_uses[var] > 0)) count_var_gaps(s);
}

static void use_input(GenState *s, int slot) {
  GenSlot *x = &s->slot[slot];
  if (x->op >= 0 && x->uses == 0) remove_output(s, slot);
  x->uses++;
  if (x->op < 0) var_use(s, slot, 1);
}

static void unuse_input(GenState *s, int slot) {
  GenSlot *x = &s->slot[slot];
  x->uses--;
  if (x->op >= 0 && x->uses == 0) add_output(s, slot);
  if (x->op < 0) var_use(s, slot, -1);
}

static int push_ident(GenState *s, GenOp op) {
  if (op.in[0] >= s->v->n_vars || s->n_real) return 0;
  GenSlot *x = &s->slot[op.in[0]];
  GenSlot *o = &s->slot[s->n_slots];
  *o = *x;
  o->t = tensor_ref(x->t);
  o->op = (int8_t)s->n_ops;
  o->uses = 0;
  o->sh = gen_op_sh(s, op, NULL);
  var_use(s, op.in[0], 1);
  s->op[s->n_ops] = op;
  s->op_first[s->n_ops] = (uint8_t)s->n_slots;
  s->op_sh[s->n_ops] = o->sh;
  s->n_ops++;
  add_output(s, s->n_slots++);
  return 1;
}

int gen_push(GenState *s, GenOp op, Diag *d) {
  const GenTemplate *t = &s->v->t[op.t];
  if (s->n_ops == GEN_MAX_DEPTH || s->n_slots + t->n_out > GEN_MAX_SLOTS) return 0;
  if (t->flags & T_IDENT) return push_ident(s, op);
  if (!gen_op_applies(s, op)) return 0;

  const GenSlot *x = t->n_in > 0 ? &s->slot[op.in[0]] : NULL;
  const GenSlot *y = t->n_in > 1 ? &s->slot[op.in[1]] : NULL;
  Shape in[2] = {{0}}, out[2] = {{0}};
  Tensor *in_t[2] = {NULL, NULL};
  for (int i = 0; i < t->n_in; i++) {
    in_t[i] = s->slot[op.in[i]].t;
    in[i] = in_t[i]->shape;
  }
  Node n;
  memset(&n, 0, sizeof n);
  n.kind = t->kind;
  n.n_in = t->n_in;
  n.n_out = t->n_out;
  if (!template_params(s, t, in, &n.params)) return 0;
  if (t->flags & T_BOUNDARY) {
    int64_t len = in[0].d[t->axis], b = x->bound[t->axis] > 0 ? x->bound[t->axis] : len / 2;
    set_ints(&n.params, t->kind, "sizes", (int64_t[]){b, len - b}, 2);
  }
  const OpDef *def = op_def(t->kind);
  if (def->infer_shape(&n, in, out, NULL) != TEQ_OK) return 0;
  for (int o = 0; o < t->n_out; o++)
    if (shape_numel(&out[o]) > GEN_MAX_NUMEL || shape_numel(&out[o]) == 0) return 0;
  n.out = out;

  Tensor *res[2] = {NULL, NULL};
  for (int o = 0; o < t->n_out; o++)
    if (!(res[o] = tensor_new(DT_MODP, &out[o]))) {
      tensor_unref(res[0]);
      return TEQ_ERR_NOMEM;
    }
  int rc = def->eval_modp(&n, in_t, res, d);
  if (rc) {
    for (int o = 0; o < t->n_out; o++) tensor_unref(res[o]);
    return rc;
  }

  uint64_t sh = gen_op_sh(s, op, NULL);
  if (s->fresh_sh && sh == s->fresh_sh)
    for (int o = 0; o < t->n_out; o++) tensor_fill_random(res[o], hash_mix(s->fresh_seed, (uint64_t)o));

  int8_t bound[2][4];
  propagate_bounds(t, x, y, out, bound);
  bool weight = t->n_in > 0;
  for (int i = 0; i < t->n_in; i++) weight &= s->slot[op.in[i]].weight;
  if (t->source == TP_POOL_C || t->source == TP_ICONV_C || t->source == TP_IMM_K) weight = true;

  for (int i = 0; i < t->n_in; i++) use_input(s, op.in[i]);
  s->op[s->n_ops] = op;
  s->op_first[s->n_ops] = (uint8_t)s->n_slots;
  s->op_sh[s->n_ops] = sh;
  s->op_params[s->n_ops] = n.params;
  for (int o = 0; o < t->n_out; o++) {
    GenSlot *sl = &s->slot[s->n_slots];
    sl->t = res[o];
    sl->vh = value_hash(res[o]);
    sl->sh = hash_mix(sh, (uint64_t)o);
    memcpy(sl->bound, bound[o], sizeof sl->bound);
    sl->weight = weight;
    sl->op = (int8_t)s->n_ops;
    sl->uses = 0;
    add_output(s, s->n_slots++);
  }
  s->n_ops++;
  s->n_real++;
  return 1;
}

void gen_pop(GenState *s) {
  int k = --s->n_ops;
  GenOp op = s->op[k];
  const GenTemplate *t = &s->v->t[op.t];
  for (int o = t->n_out - 1; o >= 0; o--) {
    int slot = --s->n_slots;
    remove_output(s, slot);
    tensor_unref(s->slot[slot].t);
    s->slot[slot].t = NULL;
  }
  if (t->flags & T_IDENT) {
    var_use(s, op.in[0], -1);
    return;
  }
  for (int i = t->n_in - 1; i >= 0; i--) unuse_input(s, op.in[i]);
  s->n_real--;
}

int gen_push_graph(GenState *s, const GenGraph *g, Diag *d) {
  for (int i = 0; i < g->n_ops; i++) {
    int rc = gen_push(s, g->op[i], d);
    if (rc != 1) return rc;
  }
  return 1;
}

void gen_pop_all(GenState *s) {
  while (s->n_ops) gen_pop(s);
}

/* ---- queries ---- */

int gen_outputs(const GenState *s, int *slots) {
  int n = 0;
  for (int i = s->v->n_vars; i < s->n_slots; i++)
    if (s->slot[i].uses == 0) slots[n++] = i;
  return n;
}

uint64_t gen_fingerprint(const GenState *s) { return hash_mix(s->out_sum, (uint64_t)s->n_outputs); }

/* Recounts the gaps, and each class's highest used variable. */
static void count_var_gaps(GenState *s) {
  int gaps = 0;
  for (int c = 0; c < s->v->n_classes; c++) {
    const GenClass *cl = &s->v->classes[c];
    int highest = -1;
    for (int i = 0; i < cl->count; i++)
      if (s->var_uses[cl->first + i]) highest = i;
    for (int i = 0; i < highest; i++) gaps += !s->var_uses[cl->first + i];
    s->var_highest[c] = (int8_t)highest;
  }
  s->var_gaps = gaps;
}

int gen_var_gaps(const GenState *s) { return s->var_gaps; }

/* O(1): the DFS asks this for every operator it considers. A new variable
 * above its class's highest adds the unused ones between as gaps; one
 * below fills a gap. */
int gen_var_gaps_after(const GenState *s, GenOp op) {
  const GenVocab *v = s->v;
  const GenTemplate *t = &v->t[op.t];
  int gaps = s->var_gaps, seen = -1, hi_cls = -1, hi = 0;
  for (int i = 0; i < t->n_in; i++) {
    int var = op.in[i];
    if (var >= v->n_vars || s->var_uses[var] || var == seen) continue;
    seen = var;
    int c = v->vars[var].cls, idx = var - v->classes[c].first;
    int highest = c == hi_cls ? hi : s->var_highest[c];
    if (idx > highest) gaps += idx - highest - 1, highest = idx;
    else gaps--;
    hi_cls = c, hi = highest;
  }
  return gaps;
}

bool gen_vars_canonical(const GenState *s) { return gen_var_gaps(s) == 0; }

void gen_graph_of(const GenState *s, GenGraph *g) {
  memset(g, 0, sizeof *g);
  g->n_ops = (uint8_t)s->n_ops;
  memcpy(g->op, s->op, (size_t)s->n_ops * sizeof s->op[0]);
}

int gen_graph_real_ops(const GenVocab *v, const GenGraph *g) {
  int n = 0;
  for (int i = 0; i < g->n_ops; i++) n += !(v->t[g->op[i].t].flags & T_IDENT);
  return n;
}

void gen_pair_used_vars(const GenVocab *v, const GenPair *p, bool *used) {
  memset(used, 0, GEN_MAX_VARS * sizeof *used);
  const GenGraph *g[2] = {&p->src, &p->dst};
  for (int s = 0; s < 2; s++)
    for (int k = 0; k < g[s]->n_ops; k++)
      for (int i = 0; i < v->t[g[s]->op[k].t].n_in; i++)
        if (g[s]->op[k].in[i] < v->n_vars) used[g[s]->op[k].in[i]] = true;
}

int gen_graph_format(const GenVocab *v, const GenGraph *g, char *buf, size_t size) {
  size_t len = 0;
  int slot = v->n_vars;
  char names[GEN_MAX_SLOTS][12];
  for (int i = 0; i < v->n_vars; i++) snprintf(names[i], sizeof names[i], "%s", v->vars[i].name);
  buf[0] = 0;
  for (int k = 0; k < g->n_ops; k++) {
    const GenTemplate *t = &v->t[g->op[k].t];
    char outs[32] = "";
    for (int o = 0; o < t->n_out && slot < GEN_MAX_SLOTS; o++, slot++) {
      snprintf(names[slot], sizeof names[slot], "%%%d", slot - v->n_vars);
      size_t l = strlen(outs);
      snprintf(outs + l, sizeof outs - l, "%s%s", o ? "," : "", names[slot]);
    }
    char args[40] = "";
    for (int i = 0; i < t->n_in; i++) {
      size_t l = strlen(args);
      int in = g->op[k].in[i];
      snprintf(args + l, sizeof args - l, "%s%s", i ? ", " : "", in < slot ? names[in] : "?");
    }
    int w = snprintf(buf + len, len < size ? size - len : 0, "%s%s = %s(%s)", k ? "; " : "", outs,
                     t->name, args);
    if (w > 0) len += (size_t)w;
  }
  return (int)len;
}
