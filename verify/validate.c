/* validate.c: --check-axioms, validation: every axiom evaluated exactly,
 * with GMP rationals, at every small shape and parameter combination.
 *
 * For each axiom the integer variables run over the values the axiom lists
 * and the tensor variables over every shape of rank 0 to 4 with extents 1
 * to 4, in levels: level L tries the combinations whose largest extent is
 * L, so the first counterexample found is a smallest one. A combination
 * counts where both sides are well typed (the registry's shape inference
 * accepts every operator, which prunes as soon as a subterm's variables are
 * set), have the same shape and the conditions hold; then both sides are
 * evaluated on random integer inputs and compared element by element,
 * exactly. Each axiom gets a time budget; the report says up to which level
 * the search was complete.
 *
 * The operators are re-implemented here over rationals, as a reference
 * semantics independent of the float32 and Z_p kernels. relu is max(0, x),
 * computed exactly; sigmoid and tanh are fixed but arbitrary functions (a
 * hash of the exact argument), since no axiom may rely on anything about
 * them beyond being applied element by element. */
#include <gmp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "verify/verify_int.h"

#define MAX_LEVEL 4    /* extents 1..4 */
#define MAX_RANK 4

typedef struct MTensor {
  Shape s;
  int64_t n, cap;     /* elements in use; initialised mpq_t in v */
  mpq_t *v;
} MTensor;

static MTensor *mt_new(const Shape *s) {
  MTensor *t = malloc(sizeof *t);
  if (!t) abort();
  t->s = *s;
  t->n = t->cap = shape_numel(s);
  t->v = malloc((size_t)(t->n + 1) * sizeof *t->v);
  if (!t->v) abort(); /* GMP aborts on exhaustion anyway */
  for (int64_t i = 0; i < t->n; i++) mpq_init(t->v[i]);
  return t;
}

static void mt_free(MTensor *t) {
  if (!t) return;
  for (int64_t i = 0; i < t->cap; i++) mpq_clear(t->v[i]);
  free(t->v);
  free(t);
}

/* ---- reference semantics ---- */

typedef struct EvalArgs {
  const Params *p;
  int n_in, out, n_out;
  MTensor *const *in;
  MTensor *y;       /* allocated at the inferred shape */
} EvalArgs;

typedef void (*MEval)(EvalArgs *a);

/* Flat index into in of the element broadcast to out index idx. */
static int64_t broadcast_index(const Shape *in, const Shape *out, const int64_t *idx) {
  int64_t flat = 0;
  int off = out->ndim - in->ndim;
  for (int i = 0; i < in->ndim; i++) flat = flat * in->d[i] + (in->d[i] == 1 ? 0 : idx[i + off]);
  return flat;
}

static void unflatten(const Shape *s, int64_t flat, int64_t *idx) {
  for (int i = s->ndim - 1; i >= 0; i--) idx[i] = flat % s->d[i], flat /= s->d[i];
}

static int64_t flatten(const Shape *s, const int64_t *idx) {
  int64_t f = 0;
  for (int i = 0; i < s->ndim; i++) f = f * s->d[i] + idx[i];
  return f;
}

static void binary(EvalArgs *a, void (*op)(mpq_ptr, mpq_srcptr, mpq_srcptr)) {
  int64_t idx[TEQ_MAX_DIMS];
  for (int64_t e = 0; e < a->y->n; e++) {
    unflatten(&a->y->s, e, idx);
    op(a->y->v[e], a->in[0]->v[broadcast_index(&a->in[0]->s, &a->y->s, idx)],
       a->in[1]->v[broadcast_index(&a->in[1]->s, &a->y->s, idx)]);
  }
}

static void ev_ewadd(EvalArgs *a) { binary(a, mpq_add); }
static void ev_ewmul(EvalArgs *a) { binary(a, mpq_mul); }

static void ev_smul(EvalArgs *a) {
  for (int64_t e = 0; e < a->y->n; e++) mpq_mul(a->y->v[e], a->in[0]->v[e], a->in[1]->v[0]);
}

static void ev_copy(EvalArgs *a) {
  for (int64_t e = 0; e < a->y->n; e++) mpq_set(a->y->v[e], a->in[0]->v[e]);
}

/* An arbitrary but fixed function of the exact value, one per salt. */
static void arbitrary(mpq_ptr y, mpq_srcptr x, uint64_t salt) {
  char *s = mpq_get_str(NULL, 10, x);
  uint64_t h = hash_bytes(salt, s, strlen(s));
  free(s);
  mpq_set_si(y, (long)(h % 2001) - 1000, 1 + (unsigned long)((h >> 20) % 7));
  mpq_canonicalize(y);
}

/* The activation act of conv and matmul (and the unary operators). */
static void activate(mpq_ptr v, int act) {
  if (act == ACT_RELU) {
    if (mpq_sgn(v) < 0) mpq_set_ui(v, 0, 1);
  } else if (act == ACT_SIGMOID || act == ACT_TANH) {
    mpq_t t;
    mpq_init(t);
    arbitrary(t, v, act == ACT_SIGMOID ? 0x5167 : 0x7a4);
    mpq_set(v, t);
    mpq_clear(t);
  }
}

static void unary_act(EvalArgs *a, int act) {
  for (int64_t e = 0; e < a->y->n; e++) {
    mpq_set(a->y->v[e], a->in[0]->v[e]);
    activate(a->y->v[e], act);
  }
}
static void ev_relu(EvalArgs *a) { unary_act(a, ACT_RELU); }
static void ev_sigmoid(EvalArgs *a) { unary_act(a, ACT_SIGMOID); }
static void ev_tanh(EvalArgs *a) { unary_act(a, ACT_TANH); }

static void ev_transpose(EvalArgs *a) {
  const ParamValue *pv = &a->p->v[0];
  int r = a->in[0]->s.ndim;
  int64_t perm[TEQ_MAX_DIMS], idx[TEQ_MAX_DIMS], src[TEQ_MAX_DIMS];
  for (int i = 0; i < r; i++) perm[i] = pv->n ? pv->i[i] : r - 1 - i;
  for (int64_t e = 0; e < a->y->n; e++) {
    unflatten(&a->y->s, e, idx);
    for (int i = 0; i < r; i++) src[perm[i]] = idx[i];
    mpq_set(a->y->v[e], a->in[0]->v[flatten(&a->in[0]->s, src)]);
  }
}

static void ev_matmul(EvalArgs *a) {
  const Shape *ys = &a->y->s, *as = &a->in[0]->s, *bs = &a->in[1]->s;
  int r = ys->ndim;
  int64_t m = ys->d[r - 2], n = ys->d[r - 1], k = as->d[as->ndim - 1];
  int64_t idx[TEQ_MAX_DIMS], ia[TEQ_MAX_DIMS], ib[TEQ_MAX_DIMS];
  mpq_t t;
  mpq_init(t);
  for (int64_t e = 0; e < a->y->n; e++) {
    unflatten(ys, e, idx);
    mpq_set_ui(a->y->v[e], 0, 1);
    for (int64_t j = 0; j < k; j++) {
      int oa = r - as->ndim, ob = r - bs->ndim;
      for (int i = 0; i < as->ndim - 2; i++) ia[i] = as->d[i] == 1 ? 0 : idx[i + oa];
      for (int i = 0; i < bs->ndim - 2; i++) ib[i] = bs->d[i] == 1 ? 0 : idx[i + ob];
      ia[as->ndim - 2] = idx[r - 2], ia[as->ndim - 1] = j;
      ib[bs->ndim - 2] = j, ib[bs->ndim - 1] = idx[r - 1];
      mpq_mul(t, a->in[0]->v[flatten(as, ia)], a->in[1]->v[flatten(bs, ib)]);
      mpq_add(a->y->v[e], a->y->v[e], t);
    }
    activate(a->y->v[e], (int)param_int(a->p, 0));
  }
  (void)m, (void)n;
  mpq_clear(t);
}

/* conv2d params: stride, pads, dilation, groups, act (registry order). */
static void ev_conv(EvalArgs *a) {
  const Params *p = a->p;
  const Shape *xs = &a->in[0]->s, *ws = &a->in[1]->s, *ys = &a->y->s;
  int64_t sh = p->v[0].i[0], sw = p->v[0].i[1], pt = p->v[1].i[0], pl = p->v[1].i[1];
  int64_t dh = p->v[2].i[0], dw = p->v[2].i[1], g = p->v[3].i[0];
  int act = (int)p->v[4].i[0];
  int64_t cg = ws->d[1], mg = ys->d[1] / g, kh = ws->d[2], kw = ws->d[3];
  mpq_t t;
  mpq_init(t);
  for (int64_t n = 0; n < ys->d[0]; n++)
    for (int64_t m = 0; m < ys->d[1]; m++)
      for (int64_t oy = 0; oy < ys->d[2]; oy++)
        for (int64_t ox = 0; ox < ys->d[3]; ox++) {
          mpq_ptr y = a->y->v[((n * ys->d[1] + m) * ys->d[2] + oy) * ys->d[3] + ox];
          mpq_set_ui(y, 0, 1);
          int64_t grp = m / mg;
          for (int64_t c = 0; c < cg; c++)
            for (int64_t i = 0; i < kh; i++)
              for (int64_t j = 0; j < kw; j++) {
                int64_t iy = oy * sh - pt + i * dh, ix = ox * sw - pl + j * dw;
                if (iy < 0 || ix < 0 || iy >= xs->d[2] || ix >= xs->d[3]) continue;
                int64_t ci = grp * cg + c;
                mpq_mul(t, a->in[0]->v[((n * xs->d[1] + ci) * xs->d[2] + iy) * xs->d[3] + ix],
                        a->in[1]->v[((m * cg + c) * kh + i) * kw + j]);
                mpq_add(y, y, t);
              }
          activate(y, act);
        }
  mpq_clear(t);
}

static void ev_enlarge(EvalArgs *a) {
  const Shape *xs = &a->in[0]->s, *ys = &a->y->s;
  int64_t top = (ys->d[2] - xs->d[2]) / 2, left = (ys->d[3] - xs->d[3]) / 2;
  int64_t idx[4];
  for (int64_t e = 0; e < a->y->n; e++) {
    unflatten(ys, e, idx);
    int64_t i = idx[2] - top, j = idx[3] - left;
    if (i < 0 || j < 0 || i >= xs->d[2] || j >= xs->d[3]) mpq_set_ui(a->y->v[e], 0, 1);
    else mpq_set(a->y->v[e], a->in[0]->v[((idx[0] * xs->d[1] + idx[1]) * xs->d[2] + i) * xs->d[3] + j]);
  }
}

/* Pools: kernel, stride, pads, then dilation (max) or count_include_pad
 * (avg), ceil_mode; the axioms use ceil_mode 0 and dilation 1. */
static void pool(EvalArgs *a, bool is_max) {
  const Params *p = a->p;
  const Shape *xs = &a->in[0]->s, *ys = &a->y->s;
  int64_t kh = p->v[0].i[0], kw = p->v[0].i[1], sh = p->v[1].i[0], sw = p->v[1].i[1];
  int64_t pt = p->v[2].i[0], pl = p->v[2].i[1], pb = p->v[2].i[2], pr = p->v[2].i[3];
  bool include_pad = !is_max && p->v[3].i[0];
  int64_t idx[4];
  for (int64_t e = 0; e < a->y->n; e++) {
    unflatten(ys, e, idx);
    mpq_ptr y = a->y->v[e];
    int64_t count = 0;
    bool any = false;
    mpq_set_ui(y, 0, 1);
    for (int64_t i = 0; i < kh; i++)
      for (int64_t j = 0; j < kw; j++) {
        int64_t iy = idx[2] * sh - pt + i, ix = idx[3] * sw - pl + j;
        bool in_pad = iy >= -pt && ix >= -pl && iy < xs->d[2] + pb && ix < xs->d[3] + pr;
        bool inside = iy >= 0 && ix >= 0 && iy < xs->d[2] && ix < xs->d[3];
        if (include_pad ? in_pad : inside) count++;
        if (!inside) continue;
        mpq_srcptr v = a->in[0]->v[((idx[0] * xs->d[1] + idx[1]) * xs->d[2] + iy) * xs->d[3] + ix];
        if (is_max) {
          if (!any || mpq_cmp(v, y) > 0) mpq_set(y, v);
          any = true;
        } else {
          mpq_add(y, y, v);
        }
      }
    if (!is_max && count) {
      mpq_t c;
      mpq_init(c);
      mpq_set_si(c, count, 1);
      mpq_div(y, y, c);
      mpq_clear(c);
    }
  }
}
static void ev_maxpool(EvalArgs *a) { pool(a, true); }
static void ev_avgpool(EvalArgs *a) { pool(a, false); }

static void ev_concat(EvalArgs *a) {
  int axis = (int)param_int(a->p, 0);
  int64_t idx[TEQ_MAX_DIMS];
  for (int64_t e = 0; e < a->y->n; e++) {
    unflatten(&a->y->s, e, idx);
    int k = 0;
    while (idx[axis] >= a->in[k]->s.d[axis]) idx[axis] -= a->in[k]->s.d[axis], k++;
    mpq_set(a->y->v[e], a->in[k]->v[flatten(&a->in[k]->s, idx)]);
  }
}

static void ev_split(EvalArgs *a) {
  int axis = (int)param_int(a->p, 0);
  int64_t start = 0, idx[TEQ_MAX_DIMS];
  for (int k = 0; k < a->out; k++)
    start += a->p->v[1].n ? a->p->v[1].i[k] : a->in[0]->s.d[axis] / a->n_out;
  for (int64_t e = 0; e < a->y->n; e++) {
    unflatten(&a->y->s, e, idx);
    idx[axis] += start;
    mpq_set(a->y->v[e], a->in[0]->v[flatten(&a->in[0]->s, idx)]);
  }
}

static void ev_const_pool(EvalArgs *a) {
  for (int64_t e = 0; e < a->y->n; e++)
    mpq_set_si(a->y->v[e], 1, (unsigned long)(a->y->s.d[2] * a->y->s.d[3]));
}

static void ev_const_iconv(EvalArgs *a) {
  const Shape *s = &a->y->s;
  int64_t idx[4];
  for (int64_t e = 0; e < a->y->n; e++) {
    unflatten(s, e, idx);
    bool one = idx[0] == idx[1] && idx[2] == s->d[2] / 2 && idx[3] == s->d[3] / 2;
    mpq_set_ui(a->y->v[e], one, 1);
  }
}

static void ev_const_imm(EvalArgs *a) {
  for (int64_t e = 0; e < a->y->n; e++)
    mpq_set_ui(a->y->v[e], e / a->y->s.d[1] == e % a->y->s.d[1], 1);
}

static void ev_const_one(EvalArgs *a) {
  for (int64_t e = 0; e < a->y->n; e++) mpq_set_ui(a->y->v[e], 1, 1);
}

/* The reference semantics of each operator the axioms can name; an axiom
 * over an operator without one is reported as not validated. */
static const MEval reference[OP__COUNT] = {
  [OP_IDENTITY] = ev_copy, [OP_EWADD] = ev_ewadd, [OP_EWMUL] = ev_ewmul, [OP_SMUL] = ev_smul,
  [OP_RELU] = ev_relu, [OP_SIGMOID] = ev_sigmoid, [OP_TANH] = ev_tanh,
  [OP_TRANSPOSE] = ev_transpose, [OP_RESHAPE] = ev_copy, [OP_MATMUL] = ev_matmul,
  [OP_CONV2D] = ev_conv, [OP_ENLARGE] = ev_enlarge, [OP_AVGPOOL] = ev_avgpool,
  [OP_MAXPOOL] = ev_maxpool, [OP_CONCAT] = ev_concat, [OP_SPLIT] = ev_split,
  [OP_CONST_POOL] = ev_const_pool, [OP_CONST_ICONV] = ev_const_iconv,
  [OP_CONST_IMM] = ev_const_imm, [OP_CONST_ONE] = ev_const_one,
};

/* Shapes the reference semantics leaves out: numpy's 1-D matmul operands
 * (the axioms are about matrices and batches of them). */
static bool matmul_accepts(int n_in, const Shape *in) {
  return n_in == 2 && in[0].ndim >= 2 && in[1].ndim >= 2;
}

static bool (*const reference_accepts[OP__COUNT])(int n_in, const Shape *in) = {
  [OP_MATMUL] = matmul_accepts,
};

/* ---- terms ---- */

#define ENV_SPARE 32

typedef struct Env {
  const Axioms *ax;
  const Axiom *a;
  Binding b;
  Shape shapes[AX_MAX_VARS];
  MTensor *value[AX_MAX_VARS];
  /* Tensors given back, their mpq_t still initialised: allocation was half
   * of the validation time, each combination building a dozen small
   * tensors of rationals. */
  MTensor *spare[ENV_SPARE];
  int n_spare;
} Env;

/* A tensor of shape sh whose elements are all 0, from the spares when one
 * is large enough. */
static MTensor *env_tensor(Env *env, const Shape *sh) {
  int64_t n = shape_numel(sh);
  for (int i = env->n_spare - 1; i >= 0; i--) {
    MTensor *t = env->spare[i];
    if (t->cap < n) continue;
    env->spare[i] = env->spare[--env->n_spare];
    t->s = *sh;
    t->n = n;
    for (int64_t e = 0; e < n; e++) mpq_set_ui(t->v[e], 0, 1);
    return t;
  }
  return mt_new(sh);
}

static void env_release(Env *env, MTensor *t) {
  if (!t) return;
  if (env->n_spare < ENV_SPARE) env->spare[env->n_spare++] = t;
  else mt_free(t);
}

static void env_drain(Env *env) {
  while (env->n_spare) mt_free(env->spare[--env->n_spare]);
}

/* The shape of t, or false where it is ill typed. */
static bool term_shape(Env *env, const Term *t, Shape *out) {
  if (t->decl < 0) {
    if (!env->b.bound[t->var]) return false;
    *out = env->shapes[t->var];
    return true;
  }
  const AxDecl *dc = &env->ax->decls[t->decl];
  Shape in[AX_MAX_TARGS];
  for (int i = 0; i < dc->n_targs; i++)
    if (!term_shape(env, t->targs[i], &in[i])) return false;
  int64_t iargs[AX_MAX_IARGS];
  for (int i = 0; i < dc->n_iargs; i++)
    if (!iexpr_eval(t->iargs[i], &env->b, &iargs[i])) return false;
  Params p;
  decl_params(dc, iargs, &p);
  if (reference_accepts[dc->kind] && !reference_accepts[dc->kind](dc->n_targs, in)) return false;
  return infer_output(dc->kind, &p, dc->n_targs, in, dc->n_out, dc->out, out);
}

static MTensor *term_eval(Env *env, const Term *t) {
  if (t->decl < 0) {
    MTensor *v = env_tensor(env, &env->shapes[t->var]);
    for (int64_t e = 0; e < v->n; e++) mpq_set(v->v[e], env->value[t->var]->v[e]);
    return v;
  }
  const AxDecl *dc = &env->ax->decls[t->decl];
  MTensor *in[AX_MAX_TARGS] = {NULL};
  Shape ins[AX_MAX_TARGS], ys;
  for (int i = 0; i < dc->n_targs; i++) {
    in[i] = term_eval(env, t->targs[i]);
    ins[i] = in[i]->s;
  }
  int64_t iargs[AX_MAX_IARGS];
  for (int i = 0; i < dc->n_iargs; i++) iexpr_eval(t->iargs[i], &env->b, &iargs[i]);
  Params p;
  decl_params(dc, iargs, &p);
  infer_output(dc->kind, &p, dc->n_targs, ins, dc->n_out, dc->out, &ys);
  EvalArgs args = {.p = &p, .n_in = dc->n_targs, .out = dc->out, .n_out = dc->n_out, .in = in,
                   .y = env_tensor(env, &ys)};
  reference[dc->kind](&args);
  for (int i = 0; i < dc->n_targs; i++) env_release(env, in[i]);
  return args.y;
}

/* ---- enumeration ---- */

typedef struct Search {
  Env env;
  int tvars[AX_MAX_VARS], n_tvars;  /* tensor variables in order */
  int ivars[AX_MAX_VARS], n_ivars;
  const Term *sub[64];              /* subterms, checked when their last variable is set */
  int sub_last[64], n_sub;
  int level;
  double deadline;
  bool timed_out, found;
  int64_t tried;                    /* well-typed combinations evaluated */
  uint64_t rng;
  bool sample_only;                 /* stop at the first well-typed combination */
  Binding sample;                   /* ... which is kept here */
  Shape sample_shapes[AX_MAX_VARS];
  char counterexample[1024];
} Search;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int tvar_pos(const Search *s, int var) {
  for (int i = 0; i < s->n_tvars; i++)
    if (s->tvars[i] == var) return i;
  return -1;
}

static void collect_tvars(Search *s, const Term *t) {
  if (t->decl < 0) {
    if (tvar_pos(s, t->var) < 0) s->tvars[s->n_tvars++] = t->var;
    return;
  }
  for (int i = 0; i < AX_MAX_TARGS && t->targs[i]; i++) collect_tvars(s, t->targs[i]);
}

/* Records t and its subterms with the last tensor variable each needs. */
static int collect_subterms(Search *s, const Term *t) {
  if (t->decl < 0) return tvar_pos(s, t->var);
  int last = -1;
  for (int i = 0; i < AX_MAX_TARGS && t->targs[i]; i++) {
    int l = collect_subterms(s, t->targs[i]);
    if (l > last) last = l;
  }
  if (s->n_sub < 64) s->sub[s->n_sub] = t, s->sub_last[s->n_sub++] = last;
  return last;
}

static void describe_shapes(Search *s, char *buf, size_t size) {
  size_t len = 0;
  const Axiom *a = s->env.a;
  for (int i = 0; i < a->n_vars && len < size; i++) {
    if (a->vars[i].sort == SORT_INT) {
      len += (size_t)snprintf(buf + len, size - len, "%s=%lld ", a->vars[i].name,
                              (long long)s->env.b.ival[i]);
    } else {
      char sh[SHAPE_STR_MAX];
      len += (size_t)snprintf(buf + len, size - len, "%s=%s ", a->vars[i].name,
                              shape_format(&s->env.shapes[i], sh, sizeof sh));
    }
  }
}

static void check_combination(Search *s) {
  Env *env = &s->env;
  const Axiom *a = env->a;
  int64_t maxdim = 0;
  for (int i = 0; i < s->n_tvars; i++)
    for (int k = 0; k < env->shapes[s->tvars[i]].ndim; k++)
      if (env->shapes[s->tvars[i]].d[k] > maxdim) maxdim = env->shapes[s->tvars[i]].d[k];
  if (s->level > 1 && maxdim < s->level) return; /* an earlier level had it */
  if (s->level == 1 && maxdim > 1) return;
  Shape ls, rs;
  if (!term_shape(env, a->lhs, &ls) || !term_shape(env, a->rhs, &rs) || !shape_equal(&ls, &rs) ||
      !conds_hold(a, &env->b))
    return;
  s->tried++;
  if (s->sample_only) {
    s->found = true;
    s->sample = env->b;
    memcpy(s->sample_shapes, env->shapes, sizeof env->shapes);
    return;
  }
  for (int i = 0; i < s->n_tvars; i++) {
    int v = s->tvars[i];
    env->value[v] = env_tensor(env, &env->shapes[v]);
    for (int64_t e = 0; e < env->value[v]->n; e++)
      mpq_set_si(env->value[v]->v[e], (long)(rng_next(&s->rng) % 19) - 9, 1);
  }
  MTensor *l = term_eval(env, a->lhs), *r = term_eval(env, a->rhs);
  for (int64_t e = 0; e < l->n && !s->found; e++)
    if (!mpq_equal(l->v[e], r->v[e])) {
      s->found = true;
      char shapes[512], pos[128];
      describe_shapes(s, shapes, sizeof shapes);
      int64_t idx[TEQ_MAX_DIMS];
      unflatten(&l->s, e, idx);
      size_t n = (size_t)snprintf(pos, sizeof pos, "[");
      for (int k = 0; k < l->s.ndim; k++)
        n += (size_t)snprintf(pos + n, sizeof pos - n, "%s%lld", k ? ", " : "", (long long)idx[k]);
      snprintf(pos + n, sizeof pos - n, "]");
      char *lv = mpq_get_str(NULL, 10, l->v[e]), *rv = mpq_get_str(NULL, 10, r->v[e]);
      snprintf(s->counterexample, sizeof s->counterexample,
               "%sat %s: lhs %s, rhs %s (inputs: integers in [-9, 9])", shapes, pos, lv, rv);
      free(lv);
      free(rv);
    }
  env_release(env, l);
  env_release(env, r);
  for (int i = 0; i < s->n_tvars; i++) {
    env_release(env, env->value[s->tvars[i]]);
    env->value[s->tvars[i]] = NULL;
  }
}

static bool subterms_typed(Search *s, int pos) {
  for (int i = 0; i < s->n_sub; i++) {
    Shape sh;
    if (s->sub_last[i] == pos && !term_shape(&s->env, s->sub[i], &sh)) return false;
  }
  return true;
}

/* Tensor variable pos gets every shape of rank 0..4, extents 1..level. */
static void enum_tensor(Search *s, int pos);

static void enum_dims(Search *s, int pos, Shape *sh, int k) {
  if (s->found || s->timed_out) return;
  if (k == sh->ndim) {
    int v = s->tvars[pos];
    s->env.shapes[v] = *sh;
    s->env.b.bound[v] = true;
    s->env.b.shape[v] = &s->env.shapes[v];
    if (subterms_typed(s, pos)) enum_tensor(s, pos + 1);
    s->env.b.bound[v] = false;
    return;
  }
  for (int64_t d = 1; d <= s->level; d++) {
    sh->d[k] = d;
    enum_dims(s, pos, sh, k + 1);
  }
  sh->d[k] = 0;
}

static void enum_tensor(Search *s, int pos) {
  if (s->found || s->timed_out) return;
  if ((s->tried & 63) == 0 && now_s() > s->deadline) {
    s->timed_out = true;
    return;
  }
  if (pos == s->n_tvars) return check_combination(s);
  for (int r = 0; r <= MAX_RANK; r++) {
    Shape sh;
    memset(&sh, 0, sizeof sh);
    sh.ndim = r;
    enum_dims(s, pos, &sh, 0);
  }
}

static void enum_int(Search *s, int k) {
  if (s->found || s->timed_out) return;
  if (k == s->n_ivars) return enum_tensor(s, 0);
  const AxVar *v = &s->env.a->vars[s->ivars[k]];
  for (int i = 0; i < v->n_domain; i++) {
    s->env.b.bound[s->ivars[k]] = true;
    s->env.b.ival[s->ivars[k]] = v->domain[i];
    enum_int(s, k + 1);
  }
}

static bool has_reference(const Axioms *ax, const Term *t) {
  if (t->decl < 0) return true;
  if (!reference[ax->decls[t->decl].kind]) return false;
  for (int i = 0; i < AX_MAX_TARGS && t->targs[i]; i++)
    if (!has_reference(ax, t->targs[i])) return false;
  return true;
}

static Search *search_new(const Axioms *ax, int i) {
  const Axiom *a = &ax->axioms[i];
  Search *s = calloc(1, sizeof *s);
  if (!s) abort();
  s->env.ax = ax, s->env.a = a;
  s->rng = 0x243f6a8885a308d3u ^ (uint64_t)i;
  collect_tvars(s, a->lhs);
  collect_tvars(s, a->rhs);
  collect_subterms(s, a->lhs);
  collect_subterms(s, a->rhs);
  for (int v = 0; v < a->n_vars; v++)
    if (a->vars[v].sort == SORT_INT) s->ivars[s->n_ivars++] = v;
  return s;
}

bool axiom_sample(const Axioms *ax, int i, Binding *b, Shape *shapes) {
  /* Extents of 3 first: small, yet no axis is degenerate. */
  static const int order[] = {3, 2, 4, 1};
  Search *s = search_new(ax, i);
  s->sample_only = true;
  s->deadline = now_s() + 1.0;
  for (int k = 0; k < 4 && !s->found && !s->timed_out; k++) {
    s->level = order[k];
    enum_int(s, 0);
  }
  bool found = s->found;
  if (found) {
    *b = s->sample;
    memcpy(shapes, s->sample_shapes, sizeof s->sample_shapes);
    for (int v = 0; v < AX_MAX_VARS; v++) b->shape[v] = NULL;
  }
  env_drain(&s->env);
  free(s);
  return found;
}

typedef struct AxiomReport {
  bool is_false, untested;
  int level;            /* levels complete */
  int64_t tried;
  double seconds;
  char counterexample[1024];
} AxiomReport;

static void validate_one(const Axioms *ax, int i, double budget_s, AxiomReport *rep) {
  const Axiom *a = &ax->axioms[i];
  memset(rep, 0, sizeof *rep);
  double t0 = now_s();
  if (!has_reference(ax, a->lhs) || !has_reference(ax, a->rhs)) {
    rep->untested = true;
    return;
  }
  Search *s = search_new(ax, i);
  s->deadline = t0 + budget_s;
  for (s->level = 1; s->level <= MAX_LEVEL && !s->found && !s->timed_out; s->level++) {
    enum_int(s, 0);
    if (!s->found && !s->timed_out) rep->level = s->level;
  }
  rep->is_false = s->found;
  rep->tried = s->tried;
  memcpy(rep->counterexample, s->counterexample, sizeof rep->counterexample);
  rep->seconds = now_s() - t0;
  env_drain(&s->env);
  free(s);
}

typedef struct Pool {
  const Axioms *ax;
  AxiomReport *rep;
  double budget_s;
  int next, done;
  pthread_mutex_t lock;
  bool quiet;
  FILE *progress;
} Pool;

static void *validate_worker(void *arg) {
  Pool *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->lock);
    int i = p->next++;
    pthread_mutex_unlock(&p->lock);
    if (i >= p->ax->n_axioms) return NULL;
    validate_one(p->ax, i, p->budget_s, &p->rep[i]);
    pthread_mutex_lock(&p->lock);
    p->done++;
    if (!p->quiet && p->progress)
      fprintf(p->progress, "validate: %d/%d axioms (%s)\n", p->done, p->ax->n_axioms,
              p->ax->axioms[i].name);
    pthread_mutex_unlock(&p->lock);
  }
}

int validate_axioms(const Axioms *ax, int jobs, double budget_s, FILE *out, int *n_false,
                    bool quiet, FILE *progress) {
  AxiomReport *rep = calloc((size_t)ax->n_axioms + 1, sizeof *rep);
  if (!rep) return TEQ_ERR_NOMEM;
  Pool pool = {.ax = ax, .rep = rep, .budget_s = budget_s, .quiet = quiet, .progress = progress};
  pthread_mutex_init(&pool.lock, NULL);
  double t0 = now_s();
  pthread_t th[64];
  int n = jobs < 1 ? 1 : jobs > 64 ? 64 : jobs, started = 0;
  for (; started < n; started++)
    if (pthread_create(&th[started], NULL, validate_worker, &pool)) break;
  if (!started) validate_worker(&pool);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&pool.lock);
  fprintf(out, "validation: exact (GMP rationals), shapes of rank 0-4 with extents 1-%d, "
          "%.1f s per axiom at most\n", MAX_LEVEL, budget_s);
  int64_t total = 0;
  for (int i = 0; i < ax->n_axioms; i++) {
    const AxiomReport *r = &rep[i];
    total += r->tried;
    if (r->is_false) {
      (*n_false)++;
      fprintf(out, "  FALSE      %-28s line %d: smallest counterexample: %s\n",
              ax->axioms[i].name, ax->axioms[i].line, r->counterexample);
    } else if (r->untested) {
      fprintf(out, "  untested   %-28s line %d: an operator has no reference semantics\n",
              ax->axioms[i].name, ax->axioms[i].line);
    } else {
      fprintf(out, "  ok         %-28s %9lld combinations, complete up to extent %d%s\n",
              ax->axioms[i].name, (long long)r->tried, r->level,
              r->level < MAX_LEVEL ? " (time budget)" : "");
    }
  }
  fprintf(out, "validation: %d axioms, %d false, %lld combinations, %.1f s\n", ax->n_axioms,
          *n_false, (long long)total, now_s() - t0);
  free(rep);
  return TEQ_OK;
}
