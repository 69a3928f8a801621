/* validate.c: --check-axioms, validation: every axiom evaluated exactly at
 * every small shape and parameter combination.
 *
 * For each axiom the integer variables run over the values the axiom lists
 * and the tensor variables over every shape of rank 0 to 4 with extents 1
 * to 4, in levels: level L tries the combinations whose largest extent is
 * L, so the first counterexample found is a smallest one. A combination
 * counts where both sides are well typed (the registry's shape inference
 * accepts every operator), have the same shape and the conditions hold;
 * then both sides are evaluated on random integer inputs and compared
 * element by element, exactly. Each axiom gets a time budget; the report
 * says up to which level the search was complete.
 *
 * Exact arithmetic. The inputs are integers in [-9, 9] and every operator
 * keeps values rational, small ones in practice, so both sides are
 * evaluated over rationals held as int64 pairs in lowest terms, every
 * addition and multiplication checked for overflow. GMP rationals remain
 * the reference semantics: a combination that overflows is evaluated again
 * with them, every counterexample is confirmed with them, and the first
 * REF_FIRST combinations of each axiom and one in REF_EVERY after are
 * evaluated both ways, which must agree element by element. GMP on every
 * combination kept thirteen axioms short of extent 4 within the budget.
 *
 * Enumeration. The tensor variables are set one after the other. Each
 * subterm is typed as soon as its last variable is set, which prunes the
 * shapes of the variables after it, and its value is cached until one of
 * its variables changes; each condition is checked as soon as its
 * variables are set. A variable tries only the shapes that pass what reads
 * it alone (its own conditions and subterms: rank(x) = 2, enlarge(w)),
 * listed once per binding of the integers; a condition shape(v) = shape(u)
 * or dim(v, i) = e (rank(v) = e) over variables set before v fixes v's
 * shape or that extent (rank). None of this takes a combination away that
 * the spec asks for: what is skipped fails a condition or does not type,
 * whatever the other variables are. At level L the last variable gets only
 * shapes that reach extent L when no earlier one does; the others belong
 * to a lower level.
 *
 * The operators are re-implemented here twice, over int64 rationals and
 * over GMP's, as a reference semantics independent of the float32 and Z_p
 * kernels. relu is max(0, x), computed exactly; sigmoid and tanh are fixed
 * but arbitrary functions (a hash of the exact argument's decimal text,
 * the same in both arithmetics), since no axiom may rely on anything about
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
#define MAX_NODES 64   /* subterms of one axiom, both sides */
#define MAX_SHAPES 341 /* shapes of rank 0..4 with extents 1..4: 1 + 4 + 16 + 64 + 256 */
#define REF_FIRST 512  /* combinations of each axiom also evaluated with GMP ... */
#define REF_EVERY 1024 /* ... and one in this many after them */

/* ---- int64 rationals ---- */

/* n/d in lowest terms, d > 0. An operation that would leave int64 sets
 * *ovf and returns 0; the caller then starts over with GMP. */
typedef struct Q {
  int64_t n, d;
} Q;

static uint64_t ugcd(uint64_t a, uint64_t b) {
  while (b) {
    uint64_t t = a % b;
    a = b, b = t;
  }
  return a;
}

static uint64_t uabs(int64_t x) { return x < 0 ? -(uint64_t)x : (uint64_t)x; }

/* n/d reduced; d > 0, so the gcd is at least 1 and at most d. */
static Q q_norm(int64_t n, int64_t d) {
  int64_t g = (int64_t)ugcd(uabs(n), (uint64_t)d);
  return (Q){n / g, d / g};
}

static Q q_add_slow(Q a, Q b, bool *ovf) {
  int64_t g = (int64_t)ugcd((uint64_t)a.d, (uint64_t)b.d), x, y, n, d;
  if (__builtin_mul_overflow(a.n, b.d / g, &x) || __builtin_mul_overflow(b.n, a.d / g, &y) ||
      __builtin_add_overflow(x, y, &n) || __builtin_mul_overflow(a.d / g, b.d, &d)) {
    *ovf = true;
    return (Q){0, 1};
  }
  return q_norm(n, d);
}

static inline Q q_add(Q a, Q b, bool *ovf) {
  Q r = {0, 1};
  if (a.d != 1 || b.d != 1) return q_add_slow(a, b, ovf);
  if (__builtin_add_overflow(a.n, b.n, &r.n)) *ovf = true, r.n = 0;
  return r;
}

/* Both factors are in lowest terms, so cancelling across them leaves the
 * product in lowest terms. */
static Q q_mul_slow(Q a, Q b, bool *ovf) {
  if (!a.n || !b.n) return (Q){0, 1};
  int64_t g1 = (int64_t)ugcd(uabs(a.n), (uint64_t)b.d);
  int64_t g2 = (int64_t)ugcd(uabs(b.n), (uint64_t)a.d);
  Q r;
  if (__builtin_mul_overflow(a.n / g1, b.n / g2, &r.n) ||
      __builtin_mul_overflow(a.d / g2, b.d / g1, &r.d)) {
    *ovf = true;
    return (Q){0, 1};
  }
  return r;
}

static inline Q q_mul(Q a, Q b, bool *ovf) {
  Q r = {0, 1};
  if (a.d != 1 || b.d != 1) return q_mul_slow(a, b, ovf);
  if (__builtin_mul_overflow(a.n, b.n, &r.n)) *ovf = true, r.n = 0;
  return r;
}

/* a / c for an integer c > 0. */
static Q q_div_int(Q a, int64_t c, bool *ovf) {
  int64_t g = (int64_t)ugcd(uabs(a.n), (uint64_t)c);
  Q r = {a.n / g, 0};
  if (__builtin_mul_overflow(a.d, c / g, &r.d)) {
    *ovf = true;
    return (Q){0, 1};
  }
  return r;
}

static int q_cmp(Q a, Q b, bool *ovf) {
  int64_t x = a.n, y = b.n;
  if ((a.d != 1 || b.d != 1) &&
      (__builtin_mul_overflow(a.n, b.d, &x) || __builtin_mul_overflow(b.n, a.d, &y))) {
    *ovf = true;
    return 0;
  }
  return (x > y) - (x < y);
}

/* As mpq_get_str writes it in base 10: "-3", "5/7". */
static void q_format(Q v, char *buf, size_t size) {
  if (v.d == 1) snprintf(buf, size, "%lld", (long long)v.n);
  else snprintf(buf, size, "%lld/%lld", (long long)v.n, (long long)v.d);
}

/* The salt of a fused activation other than relu, which both twins below
 * treat as an arbitrary function of the exact value (sigmoid's and tanh's
 * as they always were). */
static uint64_t act_salt(int act) {
  return act == ACT_SIGMOID ? 0x5167 : act == ACT_TANH ? 0x7a4 : 0xac70 + (uint64_t)act;
}

/* An arbitrary but fixed function of the exact value, one per salt; the
 * GMP twin below hashes the same text and so gives the same value. */
static Q q_arbitrary(Q x, uint64_t salt) {
  char s[48];
  q_format(x, s, sizeof s);
  uint64_t h = hash_bytes(salt, s, strlen(s));
  return q_norm((int64_t)(h % 2001) - 1000, 1 + (int64_t)((h >> 20) % 7));
}

/* The activation act of conv and matmul (and the unary operators). */
static Q q_activate(Q v, int act) {
  if (act == ACT_RELU) return v.n < 0 ? (Q){0, 1} : v;
  if (act != ACT_NONE) return q_arbitrary(v, act_salt(act));
  return v;
}

/* ---- the operators over int64 rationals ---- */

typedef struct QTensor {
  Shape s;
  int64_t n, cap;     /* elements in use, allocated */
  Q *v;
} QTensor;

/* Gives t shape s, its elements unset. */
static void qt_resize(QTensor *t, const Shape *s) {
  int64_t n = shape_numel(s);
  if (n > t->cap) {
    free(t->v);
    t->cap = n < 256 ? 256 : n;
    t->v = malloc((size_t)t->cap * sizeof *t->v);
    if (!t->v) abort(); /* GMP aborts on exhaustion anyway */
  }
  t->s = *s;
  t->n = n;
}

typedef struct QArgs {
  const Params *p;
  int n_in, out, n_out;
  const QTensor *const *in;
  QTensor *y;         /* resized to the inferred shape */
  bool ovf;           /* set where a value left int64 */
} QArgs;

typedef void (*QEval)(QArgs *a);

/* Row-major strides of s. */
static void row_strides(const Shape *s, int64_t *st) {
  int64_t stride = 1;
  for (int i = s->ndim - 1; i >= 0; i--) st[i] = stride, stride *= s->d[i];
}

/* Strides that read x's elements along the axes of the output shape ys
 * under broadcasting: 0 where x has extent 1 or no axis. */
static void broadcast_strides(const Shape *xs, const Shape *ys, int64_t *st) {
  int off = ys->ndim - xs->ndim;
  int64_t stride = 1;
  for (int i = ys->ndim - 1; i >= 0; i--) {
    int k = i - off;
    st[i] = k < 0 || xs->d[k] == 1 ? 0 : stride;
    if (k >= 0) stride *= xs->d[k];
  }
}

/* Steps the index idx of shape s, all but its last axis (the caller's
 * inner loop), moving the offsets o0 and o1 along strides s0 and s1. */
static void step_outer(const Shape *s, int64_t *idx, int64_t *o0, const int64_t *s0, int64_t *o1,
                       const int64_t *s1) {
  for (int k = s->ndim - 2; k >= 0; k--) {
    *o0 += s0[k], *o1 += s1[k];
    if (++idx[k] < s->d[k]) return;
    *o0 -= s0[k] * s->d[k], *o1 -= s1[k] * s->d[k];
    idx[k] = 0;
  }
}

static void q_binary(QArgs *a, bool mul) {
  const Shape *ys = &a->y->s;
  int r = ys->ndim;
  int64_t sa[TEQ_MAX_DIMS], sb[TEQ_MAX_DIMS], idx[TEQ_MAX_DIMS] = {0}, oa = 0, ob = 0;
  broadcast_strides(&a->in[0]->s, ys, sa);
  broadcast_strides(&a->in[1]->s, ys, sb);
  int64_t inner = r ? ys->d[r - 1] : 1, ja = r ? sa[r - 1] : 0, jb = r ? sb[r - 1] : 0;
  const Q *x = a->in[0]->v, *z = a->in[1]->v;
  Q *y = a->y->v;
  for (int64_t e = 0; e < a->y->n; e += inner) {
    if (mul)
      for (int64_t j = 0; j < inner; j++) y[e + j] = q_mul(x[oa + j * ja], z[ob + j * jb], &a->ovf);
    else
      for (int64_t j = 0; j < inner; j++) y[e + j] = q_add(x[oa + j * ja], z[ob + j * jb], &a->ovf);
    step_outer(ys, idx, &oa, sa, &ob, sb);
  }
}

static void qv_ewadd(QArgs *a) { q_binary(a, false); }
static void qv_ewmul(QArgs *a) { q_binary(a, true); }

static void qv_smul(QArgs *a) {
  for (int64_t e = 0; e < a->y->n; e++) a->y->v[e] = q_mul(a->in[0]->v[e], a->in[1]->v[0], &a->ovf);
}

static void qv_copy(QArgs *a) { memcpy(a->y->v, a->in[0]->v, (size_t)a->y->n * sizeof *a->y->v); }

/* y[idx] = x[base + sum of idx[k] st[k]] over y's shape. */
static void q_gather(QTensor *y, const Q *x, int64_t base, const int64_t *st) {
  int r = y->s.ndim;
  int64_t idx[TEQ_MAX_DIMS] = {0}, o = base, unused = 0, zero[TEQ_MAX_DIMS] = {0};
  int64_t inner = r ? y->s.d[r - 1] : 1, j1 = r ? st[r - 1] : 0;
  for (int64_t e = 0; e < y->n; e += inner) {
    for (int64_t j = 0; j < inner; j++) y->v[e + j] = x[o + j * j1];
    step_outer(&y->s, idx, &o, st, &unused, zero);
  }
}

static void q_unary_act(QArgs *a, int act) {
  for (int64_t e = 0; e < a->y->n; e++) a->y->v[e] = q_activate(a->in[0]->v[e], act);
}
static void qv_relu(QArgs *a) { q_unary_act(a, ACT_RELU); }
static void qv_sigmoid(QArgs *a) { q_unary_act(a, ACT_SIGMOID); }
static void qv_tanh(QArgs *a) { q_unary_act(a, ACT_TANH); }

/* Output axis i reads input axis perm[i]. */
static void qv_transpose(QArgs *a) {
  const ParamValue *pv = &a->p->v[0];
  int r = a->in[0]->s.ndim;
  int64_t xst[TEQ_MAX_DIMS], st[TEQ_MAX_DIMS];
  row_strides(&a->in[0]->s, xst);
  for (int i = 0; i < r; i++) st[i] = xst[pv->n ? pv->i[i] : r - 1 - i];
  q_gather(a->y, a->in[0]->v, 0, st);
}

/* Strides of operand xs (row-major strides xst) along the batch axes of
 * the product ys: 0 where it is broadcast. */
static void batch_strides(const Shape *xs, const int64_t *xst, const Shape *ys, int64_t *st) {
  int off = ys->ndim - xs->ndim;
  for (int i = 0; i < ys->ndim - 2; i++)
    st[i] = i < off || xs->d[i - off] == 1 ? 0 : xst[i - off];
}

static void qv_matmul(QArgs *a) {
  const Shape *ys = &a->y->s, *as = &a->in[0]->s, *bs = &a->in[1]->s;
  int r = ys->ndim, act = (int)param_int(a->p, 0);
  int64_t m = ys->d[r - 2], n = ys->d[r - 1], k = as->d[as->ndim - 1];
  int64_t ast[TEQ_MAX_DIMS], bst[TEQ_MAX_DIMS], sa[TEQ_MAX_DIMS], sb[TEQ_MAX_DIMS];
  int64_t idx[TEQ_MAX_DIMS] = {0}, oa = 0, ob = 0;
  row_strides(as, ast);
  row_strides(bs, bst);
  batch_strides(as, ast, ys, sa);
  batch_strides(bs, bst, ys, sb);
  const Q *x = a->in[0]->v, *z = a->in[1]->v;
  for (int64_t e = 0; e < a->y->n; e += m * n) {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        Q acc = {0, 1};
        for (int64_t t = 0; t < k; t++)
          acc = q_add(acc, q_mul(x[oa + i * k + t], z[ob + t * n + j], &a->ovf), &a->ovf);
        a->y->v[e + i * n + j] = q_activate(acc, act);
      }
    for (int d = r - 3; d >= 0; d--) { /* the next batch entry */
      oa += sa[d], ob += sb[d];
      if (++idx[d] < ys->d[d]) break;
      oa -= sa[d] * ys->d[d], ob -= sb[d] * ys->d[d];
      idx[d] = 0;
    }
  }
}

/* gemm params: transA, transB, alpha, beta (registry order). Without the
 * bias C (an axiom with one is untested): alpha A' B', with A' and B' the
 * operands or their transposes. alpha keeps its default 1, since no
 * declaration can name a float; another integer would scale exactly
 * here, any other value is left to GMP. */
static void qv_gemm(QArgs *a) {
  const Params *p = a->p;
  const Shape *as = &a->in[0]->s, *bs = &a->in[1]->s;
  bool ta = p->v[0].i[0], tb = p->v[1].i[0];
  double alpha = p->v[2].f;
  int64_t m = a->y->s.d[0], n = a->y->s.d[1], k = as->d[ta ? 0 : 1];
  if (!(alpha >= -1e15 && alpha <= 1e15 && alpha == (double)(int64_t)alpha)) {
    a->ovf = true;
    return;
  }
  Q scale = {(int64_t)alpha, 1};
  const Q *x = a->in[0]->v, *z = a->in[1]->v;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      Q acc = {0, 1};
      for (int64_t t = 0; t < k; t++)
        acc = q_add(acc, q_mul(x[ta ? t * as->d[1] + i : i * as->d[1] + t],
                               z[tb ? j * bs->d[1] + t : t * bs->d[1] + j], &a->ovf), &a->ovf);
      a->y->v[i * n + j] = q_mul(acc, scale, &a->ovf);
    }
}

/* Whether t holds integers only, and the largest magnitude among them. */
static bool integral(const QTensor *t, int64_t *max) {
  uint64_t m = 0;
  for (int64_t e = 0; e < t->n; e++) {
    if (t->v[e].d != 1) return false;
    uint64_t u = uabs(t->v[e].n);
    if (u > m) m = u;
  }
  *max = m > INT64_MAX ? INT64_MAX : (int64_t)m;
  return true;
}

/* Whether terms products of factors of magnitudes at most ma and mb add
 * up without leaving int64: then plain arithmetic is exact. */
static bool sums_fit(int64_t ma, int64_t mb, int64_t terms) {
  int64_t p;
  return !__builtin_mul_overflow(ma, mb, &p) && !__builtin_mul_overflow(p, terms, &p);
}

/* conv2d params: stride, pads, dilation, groups, act (registry order).
 * Integer operands (all but after avgpool and const_pool) take plain
 * int64 arithmetic, once a bound on the sums shows it cannot overflow:
 * these axioms evaluate millions of convolutions. */
static void qv_conv(QArgs *a) {
  const Params *p = a->p;
  const Shape *xs = &a->in[0]->s, *ws = &a->in[1]->s, *ys = &a->y->s;
  int64_t sh = p->v[0].i[0], sw = p->v[0].i[1], pt = p->v[1].i[0], pl = p->v[1].i[1];
  int64_t dh = p->v[2].i[0], dw = p->v[2].i[1], g = p->v[3].i[0];
  int act = (int)p->v[4].i[0];
  int64_t cg = ws->d[1], mg = ys->d[1] / g, kh = ws->d[2], kw = ws->d[3], mx, mw;
  int64_t H = xs->d[2], W = xs->d[3];
  const Q *x = a->in[0]->v, *w = a->in[1]->v;
  bool plain = integral(a->in[0], &mx) && integral(a->in[1], &mw) && sums_fit(mx, mw, cg * kh * kw);
  Q *y = a->y->v;
  for (int64_t n = 0; n < ys->d[0]; n++)
    for (int64_t m = 0; m < ys->d[1]; m++) {
      const Q *xg = x + (n * xs->d[1] + m / mg * cg) * H * W, *wm = w + m * cg * kh * kw;
      for (int64_t oy = 0; oy < ys->d[2]; oy++)
        for (int64_t ox = 0; ox < ys->d[3]; ox++) {
          Q acc = {0, 1};
          int64_t sum = 0;
          for (int64_t c = 0; c < cg; c++)
            for (int64_t i = 0; i < kh; i++) {
              int64_t iy = oy * sh - pt + i * dh;
              if (iy < 0 || iy >= H) continue;
              const Q *xr = xg + (c * H + iy) * W, *wr = wm + (c * kh + i) * kw;
              for (int64_t j = 0; j < kw; j++) {
                int64_t ix = ox * sw - pl + j * dw;
                if (ix < 0 || ix >= W) continue;
                if (plain) sum += xr[ix].n * wr[j].n;
                else acc = q_add(acc, q_mul(xr[ix], wr[j], &a->ovf), &a->ovf);
              }
            }
          *y++ = q_activate(plain ? (Q){sum, 1} : acc, act);
        }
    }
}

static void qv_enlarge(QArgs *a) {
  const Shape *xs = &a->in[0]->s, *ys = &a->y->s;
  int64_t top = (ys->d[2] - xs->d[2]) / 2, left = (ys->d[3] - xs->d[3]) / 2;
  Q *y = a->y->v;
  for (int64_t n = 0; n < ys->d[0]; n++)
    for (int64_t c = 0; c < ys->d[1]; c++)
      for (int64_t i = 0; i < ys->d[2]; i++)
        for (int64_t j = 0; j < ys->d[3]; j++) {
          int64_t u = i - top, v = j - left;
          *y++ = u < 0 || v < 0 || u >= xs->d[2] || v >= xs->d[3]
                     ? (Q){0, 1}
                     : a->in[0]->v[((n * xs->d[1] + c) * xs->d[2] + u) * xs->d[3] + v];
        }
}

/* Pools: kernel, stride, pads, then dilation (max) or count_include_pad
 * (avg), ceil_mode; the axioms use ceil_mode 0 and dilation 1. */
static void q_pool(QArgs *a, bool is_max) {
  const Params *p = a->p;
  const Shape *xs = &a->in[0]->s, *ys = &a->y->s;
  int64_t kh = p->v[0].i[0], kw = p->v[0].i[1], sh = p->v[1].i[0], sw = p->v[1].i[1];
  int64_t pt = p->v[2].i[0], pl = p->v[2].i[1], pb = p->v[2].i[2], pr = p->v[2].i[3];
  bool include_pad = !is_max && p->v[3].i[0];
  Q *y = a->y->v;
  for (int64_t n = 0; n < ys->d[0]; n++)
    for (int64_t c = 0; c < ys->d[1]; c++)
      for (int64_t oy = 0; oy < ys->d[2]; oy++)
        for (int64_t ox = 0; ox < ys->d[3]; ox++) {
          Q acc = {0, 1};
          int64_t count = 0;
          bool any = false;
          for (int64_t i = 0; i < kh; i++)
            for (int64_t j = 0; j < kw; j++) {
              int64_t iy = oy * sh - pt + i, ix = ox * sw - pl + j;
              bool in_pad = iy >= -pt && ix >= -pl && iy < xs->d[2] + pb && ix < xs->d[3] + pr;
              bool inside = iy >= 0 && ix >= 0 && iy < xs->d[2] && ix < xs->d[3];
              if (include_pad ? in_pad : inside) count++;
              if (!inside) continue;
              Q v = a->in[0]->v[((n * xs->d[1] + c) * xs->d[2] + iy) * xs->d[3] + ix];
              if (!is_max) acc = q_add(acc, v, &a->ovf);
              else if (!any || q_cmp(v, acc, &a->ovf) > 0) acc = v;
              any = true;
            }
          if (!is_max && count) acc = q_div_int(acc, count, &a->ovf);
          *y++ = acc;
        }
}
static void qv_maxpool(QArgs *a) { q_pool(a, true); }
static void qv_avgpool(QArgs *a) { q_pool(a, false); }

/* Each input is a run of blocks along the axes before axis; the output
 * takes one block of each in turn. */
static void qv_concat(QArgs *a) {
  int axis = (int)param_int(a->p, 0);
  int64_t outer = 1, blk[AX_MAX_TARGS];
  for (int i = 0; i < axis; i++) outer *= a->y->s.d[i];
  for (int k = 0; k < a->n_in; k++) blk[k] = outer ? a->in[k]->n / outer : 0;
  Q *y = a->y->v;
  for (int64_t o = 0; o < outer; o++)
    for (int k = 0; k < a->n_in; k++) {
      memcpy(y, a->in[k]->v + o * blk[k], (size_t)blk[k] * sizeof *y);
      y += blk[k];
    }
}

static void qv_split(QArgs *a) {
  int axis = (int)param_int(a->p, 0);
  int64_t start = 0, st[TEQ_MAX_DIMS];
  for (int k = 0; k < a->out; k++)
    start += a->p->v[1].n ? a->p->v[1].i[k] : a->in[0]->s.d[axis] / a->n_out;
  row_strides(&a->in[0]->s, st);
  q_gather(a->y, a->in[0]->v, start * st[axis], st);
}

static void qv_const_pool(QArgs *a) {
  Q v = q_norm(1, a->y->s.d[2] * a->y->s.d[3]);
  for (int64_t e = 0; e < a->y->n; e++) a->y->v[e] = v;
}

static void qv_const_iconv(QArgs *a) {
  const Shape *s = &a->y->s;
  int64_t idx[4];
  for (int64_t e = 0; e < a->y->n; e++) {
    int64_t f = e;
    for (int i = 3; i >= 0; i--) idx[i] = f % s->d[i], f /= s->d[i];
    bool one = idx[0] == idx[1] && idx[2] == s->d[2] / 2 && idx[3] == s->d[3] / 2;
    a->y->v[e] = (Q){one, 1};
  }
}

static void qv_const_imm(QArgs *a) {
  for (int64_t e = 0; e < a->y->n; e++) a->y->v[e] = (Q){e / a->y->s.d[1] == e % a->y->s.d[1], 1};
}

static void qv_const_one(QArgs *a) {
  for (int64_t e = 0; e < a->y->n; e++) a->y->v[e] = (Q){1, 1};
}

static const QEval qreference[OP__COUNT] = {
  [OP_IDENTITY] = qv_copy, [OP_EWADD] = qv_ewadd, [OP_EWMUL] = qv_ewmul, [OP_SMUL] = qv_smul,
  [OP_RELU] = qv_relu, [OP_SIGMOID] = qv_sigmoid, [OP_TANH] = qv_tanh,
  [OP_TRANSPOSE] = qv_transpose, [OP_RESHAPE] = qv_copy, [OP_MATMUL] = qv_matmul,
  [OP_CONV2D] = qv_conv, [OP_ENLARGE] = qv_enlarge, [OP_AVGPOOL] = qv_avgpool,
  [OP_MAXPOOL] = qv_maxpool, [OP_CONCAT] = qv_concat, [OP_SPLIT] = qv_split,
  [OP_CONST_POOL] = qv_const_pool, [OP_CONST_ICONV] = qv_const_iconv,
  [OP_CONST_IMM] = qv_const_imm, [OP_CONST_ONE] = qv_const_one, [OP_GEMM] = qv_gemm,
};

/* ---- the operators over GMP rationals: the reference ---- */

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
  } else if (act != ACT_NONE) {
    mpq_t t;
    mpq_init(t);
    arbitrary(t, v, act_salt(act));
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

/* gemm without C, as qv_gemm; alpha is a double, so exactly rational. */
static void ev_gemm(EvalArgs *a) {
  const Params *p = a->p;
  const Shape *as = &a->in[0]->s, *bs = &a->in[1]->s;
  bool ta = p->v[0].i[0], tb = p->v[1].i[0];
  int64_t m = a->y->s.d[0], n = a->y->s.d[1], k = as->d[ta ? 0 : 1];
  mpq_t t, alpha;
  mpq_init(t);
  mpq_init(alpha);
  mpq_set_d(alpha, p->v[2].f);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      mpq_ptr y = a->y->v[i * n + j];
      mpq_set_ui(y, 0, 1);
      for (int64_t e = 0; e < k; e++) {
        mpq_mul(t, a->in[0]->v[ta ? e * as->d[1] + i : i * as->d[1] + e],
                a->in[1]->v[tb ? j * bs->d[1] + e : e * bs->d[1] + j]);
        mpq_add(y, y, t);
      }
      mpq_mul(y, y, alpha);
    }
  mpq_clear(t);
  mpq_clear(alpha);
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
  [OP_CONST_IMM] = ev_const_imm, [OP_CONST_ONE] = ev_const_one, [OP_GEMM] = ev_gemm,
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

/* A subterm of either side; the nodes of an axiom are in post-order, so
 * operands come before the operators that read them. */
typedef struct VNode {
  const Term *t;
  int kid[AX_MAX_TARGS], n_kids;
  int last;            /* enumeration position that completes it; -1: integers alone */
  int iargs_last;      /* the same for its integer arguments alone */
  uint32_t deps;       /* the positions it reads, a bit each */
  Shape shape;         /* at the current combination, once typed */
  Node nd;             /* what the registry's shape inference reads: kind, arity, params */
  bool params_ok;      /* nd.params pass the registry's check */
  uint64_t stamp;      /* val is current while stamp == the generation of last */
  QTensor val;
} VNode;

typedef struct Search {
  const Axioms *ax;
  const Axiom *a;
  Binding b;
  Shape shapes[AX_MAX_VARS];        /* by variable */
  int tvars[AX_MAX_VARS], n_tvars;  /* tensor variables in the order they are set */
  int ivars[AX_MAX_VARS], n_ivars;
  VNode node[MAX_NODES];
  int n_nodes, lhs, rhs;
  bool too_large;                   /* more than MAX_NODES subterms */
  int cond_last[AX_MAX_CONDS];      /* the position that completes each condition */
  uint32_t cond_deps[AX_MAX_CONDS]; /* the positions it reads */
  /* Every shape of the level, the extents equal to the level in each, and
   * by position those that pass what reads that position alone (with the
   * integers): its unary conditions and subterms, kept while the integers
   * are (stamp gen[0]). */
  Shape all[MAX_SHAPES];
  int8_t all_top[MAX_SHAPES];
  int n_all;
  uint16_t listed[AX_MAX_VARS][MAX_SHAPES];
  int n_listed[AX_MAX_VARS];
  uint64_t listed_stamp[AX_MAX_VARS];
  /* By position: conditions dim(v, axis) = e (rank(v) = e where axis is
   * -1) with e read before it, which fix one extent (or the rank). */
  struct { int axis; const IExpr *e; } pin[AX_MAX_VARS][AX_MAX_CONDS];
  int n_pins[AX_MAX_VARS];
  int same_as[AX_MAX_VARS];         /* by position: an earlier one it must equal in shape, or -1 */
  /* gen[pos + 1] changes whenever position pos gets a shape, gen[0] when
   * the integers change: what was computed under the same generation of a
   * node's last position is still current. */
  uint64_t gen[AX_MAX_VARS + 1], clock;
  QTensor input[AX_MAX_VARS];       /* random inputs, by position */
  uint64_t input_stamp[AX_MAX_VARS];
  MTensor *mvalue[AX_MAX_VARS];     /* the same, for GMP, by variable */
  int level;
  int n_top;                        /* extents equal to level among the shapes set */
  double deadline;
  uint64_t steps;
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

/* The positions of the tensor variables e reads, a bit each. */
static uint32_t iexpr_deps(const Search *s, const IExpr *e) {
  if (!e || e->kind == I_NUM || e->kind == I_VAR) return 0;
  uint32_t deps = iexpr_deps(s, e->a) | iexpr_deps(s, e->b);
  int pos = e->kind == I_DIM || e->kind == I_RANK || e->kind == I_SHAPE ? tvar_pos(s, e->var) : -1;
  return pos >= 0 ? deps | 1u << pos : deps;
}

/* The last of the positions in deps; -1 for none (the integers alone). */
static int last_of(uint32_t deps) {
  int last = -1;
  for (int p = 0; p < AX_MAX_VARS; p++)
    if (deps >> p & 1) last = p;
  return last;
}

/* Appends t's nodes in post-order; returns t's, or -1 when they do not fit. */
static int collect_nodes(Search *s, const Term *t) {
  int kid[AX_MAX_TARGS], n_kids = 0;
  uint32_t deps = 0, iargs_deps = 0;
  if (t->decl < 0) {
    deps = 1u << tvar_pos(s, t->var);
  } else {
    const AxDecl *dc = &s->ax->decls[t->decl];
    for (; n_kids < dc->n_targs; n_kids++) {
      kid[n_kids] = collect_nodes(s, t->targs[n_kids]);
      if (kid[n_kids] < 0) return -1;
      deps |= s->node[kid[n_kids]].deps;
    }
    for (int i = 0; i < dc->n_iargs; i++) iargs_deps |= iexpr_deps(s, t->iargs[i]);
    deps |= iargs_deps;
  }
  if (s->n_nodes == MAX_NODES) {
    s->too_large = true;
    return -1;
  }
  VNode *v = &s->node[s->n_nodes];
  v->t = t, v->n_kids = n_kids, v->deps = deps;
  v->last = last_of(deps), v->iargs_last = last_of(iargs_deps);
  memcpy(v->kid, kid, sizeof kid);
  if (t->decl >= 0) {
    const AxDecl *dc = &s->ax->decls[t->decl];
    v->nd.kind = dc->kind;
    v->nd.n_in = dc->n_targs, v->nd.n_out = dc->n_out;
  }
  return s->n_nodes++;
}

/* Node v's parameters from its integer arguments, and the registry's
 * verdict on them; false where an argument cannot be evaluated. */
static bool node_params(Search *s, VNode *v) {
  const AxDecl *dc = &s->ax->decls[v->t->decl];
  int64_t iargs[AX_MAX_IARGS];
  for (int k = 0; k < dc->n_iargs; k++)
    if (!iexpr_eval(v->t->iargs[k], &s->b, &iargs[k])) return v->params_ok = false;
  decl_params(dc, iargs, &v->nd.params);
  v->params_ok = op_def(dc->kind)->infer_shape && dc->n_out <= 2 * TEQ_MAX_PARAM_LEN &&
                 params_check(dc->kind, &v->nd.params, NULL) == TEQ_OK;
  return v->params_ok;
}

/* The parameters that the integers alone decide, once per binding of
 * them; false where one fails (then every combination would). */
static bool fixed_params(Search *s) {
  for (int i = 0; i < s->n_nodes; i++) {
    VNode *v = &s->node[i];
    if (v->t->decl >= 0 && v->iargs_last < 0 && !node_params(s, v)) return false;
  }
  return true;
}

/* numpy's rule, as shape_broadcast has it: aligned from the last axis,
 * extents equal or one of them 1. */
static bool broadcasts(const Shape *a, const Shape *b) {
  for (int i = 1; i <= a->ndim && i <= b->ndim; i++) {
    int64_t x = a->d[a->ndim - i], y = b->d[b->ndim - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

/* Types the nodes that position pos completes; false where one is ill
 * typed (or one the reference semantics leaves out). This is
 * infer_output with the parameters evaluated and checked beforehand,
 * most of them once per binding of the integers: the innermost position
 * types its nodes for every shape it tries, and that was most of the
 * time of the convolution axioms. */
static bool type_nodes(Search *s, int pos, bool unary_only) {
  for (int i = 0; i < s->n_nodes; i++) {
    VNode *v = &s->node[i];
    if (v->last != pos || (unary_only && v->deps != 1u << pos)) continue;
    if (v->t->decl < 0) {
      v->shape = s->shapes[v->t->var];
      continue;
    }
    if (v->iargs_last >= 0 && !node_params(s, v)) return false;
    const AxDecl *dc = &s->ax->decls[v->t->decl];
    Shape in[AX_MAX_TARGS], outs[2 * TEQ_MAX_PARAM_LEN];
    for (int k = 0; k < v->n_kids; k++) in[k] = s->node[v->kid[k]].shape;
    if (reference_accepts[dc->kind] && !reference_accepts[dc->kind](dc->n_targs, in)) return false;
    /* The registry formats a message for each shape it refuses, and
     * refusals are most of what the enumeration meets: that was half the
     * time of the element-wise axioms. Shapes that do not broadcast are
     * refused here first; whatever passes still goes to the registry. */
    if ((dc->kind == OP_EWADD || dc->kind == OP_EWMUL) && !broadcasts(&in[0], &in[1])) return false;
    if (op_def(dc->kind)->infer_shape(&v->nd, in, outs, NULL) != TEQ_OK) return false;
    v->shape = outs[dc->out];
  }
  return true;
}

/* The conditions that position pos completes hold; those that read it
 * alone (with the integers) are left out unless with_unary: the shapes
 * listed for pos meet them already. */
static bool conds_at(const Search *s, int pos, bool with_unary) {
  for (int i = 0; i < s->a->n_conds; i++)
    if (s->cond_last[i] == pos && (with_unary || pos < 0 || s->cond_deps[i] != 1u << pos) &&
        !cond_holds(&s->a->conds[i], &s->b))
      return false;
  return true;
}

/* ---- evaluation ---- */

/* The random inputs of position pos, drawn when its shape changes. */
static const QTensor *input_at(Search *s, int pos) {
  QTensor *t = &s->input[pos];
  if (s->input_stamp[pos] != s->gen[pos + 1]) {
    qt_resize(t, &s->shapes[s->tvars[pos]]);
    for (int64_t e = 0; e < t->n; e++) t->v[e] = (Q){(int64_t)(rng_next(&s->rng) % 19) - 9, 1};
    s->input_stamp[pos] = s->gen[pos + 1];
  }
  return t;
}

/* Node i's value, from the cache where its variables have not changed. */
static const QTensor *node_eval(Search *s, int i, bool *ovf) {
  VNode *v = &s->node[i];
  if (v->t->decl < 0) return input_at(s, v->last);
  uint64_t g = s->gen[v->last + 1];
  if (v->stamp == g) return &v->val;
  const AxDecl *dc = &s->ax->decls[v->t->decl];
  const QTensor *in[AX_MAX_TARGS];
  for (int k = 0; k < v->n_kids; k++) in[k] = node_eval(s, v->kid[k], ovf);
  qt_resize(&v->val, &v->shape);
  QArgs args = {.p = &v->nd.params, .n_in = dc->n_targs, .out = dc->out, .n_out = dc->n_out,
                .in = in, .y = &v->val};
  qreference[dc->kind](&args);
  if (args.ovf) *ovf = true;
  else v->stamp = g; /* an overflowed value is never reused */
  return &v->val;
}

/* The GMP twin of node_eval, without a cache: the reference. */
static MTensor *term_eval(Search *s, const Term *t) {
  if (t->decl < 0) {
    MTensor *v = mt_new(&s->shapes[t->var]);
    for (int64_t e = 0; e < v->n; e++) mpq_set(v->v[e], s->mvalue[t->var]->v[e]);
    return v;
  }
  const AxDecl *dc = &s->ax->decls[t->decl];
  MTensor *in[AX_MAX_TARGS] = {NULL};
  Shape ins[AX_MAX_TARGS], ys;
  for (int i = 0; i < dc->n_targs; i++) {
    in[i] = term_eval(s, t->targs[i]);
    ins[i] = in[i]->s;
  }
  int64_t iargs[AX_MAX_IARGS];
  for (int i = 0; i < dc->n_iargs; i++) iexpr_eval(t->iargs[i], &s->b, &iargs[i]);
  Params p;
  decl_params(dc, iargs, &p);
  infer_output(dc->kind, &p, dc->n_targs, ins, dc->n_out, dc->out, &ys);
  EvalArgs args = {.p = &p, .n_in = dc->n_targs, .out = dc->out, .n_out = dc->n_out, .in = in,
                   .y = mt_new(&ys)};
  reference[dc->kind](&args);
  for (int i = 0; i < dc->n_targs; i++) mt_free(in[i]);
  return args.y;
}

static bool q_is(Q q, mpq_srcptr m) {
  return !mpz_cmp_si(mpq_numref(m), (long)q.n) && !mpz_cmp_si(mpq_denref(m), (long)q.d);
}

static void describe(Search *s, const Shape *sh, int64_t e, const char *what, const char *lv,
                     const char *rv) {
  char shapes[512], pos[128];
  size_t len = 0;
  const Axiom *a = s->a;
  shapes[0] = 0;
  for (int i = 0; i < a->n_vars && len < sizeof shapes; i++) {
    if (a->vars[i].sort == SORT_INT) {
      len += (size_t)snprintf(shapes + len, sizeof shapes - len, "%s=%lld ", a->vars[i].name,
                              (long long)s->b.ival[i]);
    } else {
      char buf[SHAPE_STR_MAX];
      len += (size_t)snprintf(shapes + len, sizeof shapes - len, "%s=%s ", a->vars[i].name,
                              shape_format(&s->shapes[i], buf, sizeof buf));
    }
  }
  int64_t idx[TEQ_MAX_DIMS];
  unflatten(sh, e, idx);
  size_t n = (size_t)snprintf(pos, sizeof pos, "[");
  for (int k = 0; k < sh->ndim; k++)
    n += (size_t)snprintf(pos + n, sizeof pos - n, "%s%lld", k ? ", " : "", (long long)idx[k]);
  snprintf(pos + n, sizeof pos - n, "]");
  snprintf(s->counterexample, sizeof s->counterexample,
           "%s%sat %s: lhs %s, rhs %s (inputs: integers in [-9, 9])", what, shapes, pos, lv, rv);
}

/* Evaluates the combination with GMP on the inputs the int64 path drew.
 * lq and rq are the int64 values, or NULL where they overflowed; they must
 * agree with GMP's element by element. A difference between the sides
 * is the counterexample. */
static void reference_check(Search *s, const QTensor *lq, const QTensor *rq) {
  for (int pos = 0; pos < s->n_tvars; pos++) {
    const QTensor *q = input_at(s, pos);
    MTensor *m = s->mvalue[s->tvars[pos]] = mt_new(&q->s);
    for (int64_t e = 0; e < q->n; e++)
      mpq_set_si(m->v[e], (long)q->v[e].n, (unsigned long)q->v[e].d);
  }
  MTensor *l = term_eval(s, s->a->lhs), *r = term_eval(s, s->a->rhs);
  for (int64_t e = 0; e < l->n && lq && !s->found; e++)
    if (!q_is(lq->v[e], l->v[e]) || !q_is(rq->v[e], r->v[e])) {
      char lv[48], rv[48];
      q_format(lq->v[e], lv, sizeof lv);
      q_format(rq->v[e], rv, sizeof rv);
      describe(s, &l->s, e, "int64 and GMP evaluations disagree (a bug in validate.c): ", lv, rv);
      s->found = true;
    }
  for (int64_t e = 0; e < l->n && !s->found; e++)
    if (!mpq_equal(l->v[e], r->v[e])) {
      char *lv = mpq_get_str(NULL, 10, l->v[e]), *rv = mpq_get_str(NULL, 10, r->v[e]);
      describe(s, &l->s, e, "", lv, rv);
      free(lv);
      free(rv);
      s->found = true;
    }
  mt_free(l);
  mt_free(r);
  for (int pos = 0; pos < s->n_tvars; pos++) {
    mt_free(s->mvalue[s->tvars[pos]]);
    s->mvalue[s->tvars[pos]] = NULL;
  }
}

/* Every variable is set, every node typed and every condition holds. */
static void check_combination(Search *s) {
  if (s->level > 1 && !s->n_top) return; /* an earlier level had it */
  const VNode *ln = &s->node[s->lhs], *rn = &s->node[s->rhs];
  if (!shape_equal(&ln->shape, &rn->shape)) return;
  s->tried++;
  if (s->sample_only) {
    s->found = true;
    s->sample = s->b;
    memcpy(s->sample_shapes, s->shapes, sizeof s->shapes);
    return;
  }
  bool ovf = false, differ = false;
  const QTensor *l = node_eval(s, s->lhs, &ovf), *r = node_eval(s, s->rhs, &ovf);
  for (int64_t e = 0; e < l->n && !ovf && !differ; e++)
    differ = l->v[e].n != r->v[e].n || l->v[e].d != r->v[e].d;
  if (ovf || differ || s->tried <= REF_FIRST || s->tried % REF_EVERY == 0)
    reference_check(s, ovf ? NULL : l, ovf ? NULL : r);
}

/* ---- enumeration ---- */

static void enum_tensor(Search *s, int pos);

/* Whether position pos must reach extent level: it is the last, and no
 * earlier shape does. */
static bool must_reach(const Search *s, int pos) {
  return pos == s->n_tvars - 1 && s->level > 1 && !s->n_top;
}

/* Position pos takes shape sh (with top extents equal to the level):
 * check the conditions and type the nodes it completes, then go on.
 * listed: sh passed the unary checks of pos. */
static void set_shape(Search *s, int pos, const Shape *sh, int top, bool listed) {
  if (!top && must_reach(s, pos)) return;
  int v = s->tvars[pos];
  s->shapes[v] = *sh;
  s->b.bound[v] = true;
  s->b.shape[v] = &s->shapes[v];
  s->gen[pos + 1] = ++s->clock;
  if (conds_at(s, pos, !listed) && type_nodes(s, pos, false)) {
    s->n_top += top;
    enum_tensor(s, pos + 1);
    s->n_top -= top;
  }
  s->b.bound[v] = false;
}

/* Every shape of rank 0..4 with extents 1..level, ranks in order, extents
 * in lexicographic order. */
static void level_shapes(Search *s) {
  s->n_all = 0;
  for (int r = 0; r <= MAX_RANK; r++) {
    int64_t count = 1;
    for (int k = 0; k < r; k++) count *= s->level;
    for (int64_t c = 0; c < count; c++) {
      Shape *sh = &s->all[s->n_all];
      int top = 0;
      memset(sh, 0, sizeof *sh);
      sh->ndim = r;
      for (int k = r - 1, f = (int)c; k >= 0; k--, f /= s->level) {
        sh->d[k] = 1 + f % s->level;
        top += sh->d[k] == s->level;
      }
      s->all_top[s->n_all++] = (int8_t)top;
    }
  }
}

/* The shapes of the level that pass the conditions and subterms reading
 * position pos alone, at the current integers. What they refuse, they
 * refuse whatever the other variables are, so leaving those shapes out
 * of the loop loses nothing; it saves typing them for every shape of the
 * positions before. */
static void list_shapes(Search *s, int pos) {
  int v = s->tvars[pos];
  s->n_listed[pos] = 0;
  for (int k = 0; k < s->n_all; k++) {
    s->shapes[v] = s->all[k];
    s->b.bound[v] = true;
    s->b.shape[v] = &s->shapes[v];
    bool ok = true;
    for (int i = 0; i < s->a->n_conds && ok; i++)
      if (s->cond_deps[i] == 1u << pos) ok = cond_holds(&s->a->conds[i], &s->b);
    if (ok && type_nodes(s, pos, true)) s->listed[pos][s->n_listed[pos]++] = (uint16_t)k;
  }
  s->b.bound[v] = false;
  s->listed_stamp[pos] = s->gen[0];
}

static void enum_tensor(Search *s, int pos) {
  if (s->found || s->timed_out) return;
  if ((++s->steps & 255) == 0 && now_s() > s->deadline) {
    s->timed_out = true;
    return;
  }
  if (pos == s->n_tvars) return check_combination(s);
  if (s->same_as[pos] >= 0) {
    Shape sh = s->shapes[s->tvars[s->same_as[pos]]];
    int top = 0;
    for (int k = 0; k < sh.ndim; k++) top += sh.d[k] == s->level;
    return set_shape(s, pos, &sh, top, false);
  }
  if (s->listed_stamp[pos] != s->gen[0]) list_shapes(s, pos);
  /* The pinned extents, where they can be read; the conditions are still
   * checked in full, the pins only skip shapes they would refuse. */
  int64_t want[AX_MAX_CONDS];
  for (int i = 0; i < s->n_pins[pos]; i++)
    if (!iexpr_eval(s->pin[pos][i].e, &s->b, &want[i])) want[i] = -1;
  bool reach = must_reach(s, pos);
  for (int i = 0; i < s->n_listed[pos] && !s->found && !s->timed_out; i++) {
    int k = s->listed[pos][i];
    const Shape *sh = &s->all[k];
    if (reach && !s->all_top[k]) continue;
    bool skip = false;
    for (int j = 0; j < s->n_pins[pos] && !skip; j++) {
      int axis = s->pin[pos][j].axis;
      if (want[j] < 0) continue;
      if (axis < 0) skip = sh->ndim != want[j];
      else skip = axis < sh->ndim && sh->d[axis] != want[j];
    }
    if (!skip) set_shape(s, pos, sh, s->all_top[k], true);
  }
}

static void enum_int(Search *s, int k) {
  if (s->found || s->timed_out) return;
  if (k == s->n_ivars) {
    s->gen[0] = ++s->clock;
    if (conds_at(s, -1, true) && fixed_params(s) && type_nodes(s, -1, false)) enum_tensor(s, 0);
    return;
  }
  const AxVar *v = &s->a->vars[s->ivars[k]];
  for (int i = 0; i < v->n_domain; i++) {
    s->b.bound[s->ivars[k]] = true;
    s->b.ival[s->ivars[k]] = v->domain[i];
    enum_int(s, k + 1);
  }
}

/* Every combination of the level s->level. */
static void search_level(Search *s) {
  level_shapes(s);
  enum_int(s, 0);
}

static bool has_reference(const Axioms *ax, const Term *t) {
  if (t->decl < 0) return true;
  const AxDecl *dc = &ax->decls[t->decl];
  if (!reference[dc->kind] || !qreference[dc->kind]) return false;
  if (dc->kind == OP_GEMM && dc->n_targs > 2) return false; /* gemm's bias C */
  for (int i = 0; i < AX_MAX_TARGS && t->targs[i]; i++)
    if (!has_reference(ax, t->targs[i])) return false;
  return true;
}

static Search *search_new(const Axioms *ax, int i) {
  const Axiom *a = &ax->axioms[i];
  Search *s = calloc(1, sizeof *s);
  if (!s) abort();
  s->ax = ax, s->a = a;
  s->rng = 0x243f6a8885a308d3u ^ (uint64_t)i;
  collect_tvars(s, a->lhs);
  collect_tvars(s, a->rhs);
  s->lhs = collect_nodes(s, a->lhs);
  s->rhs = collect_nodes(s, a->rhs);
  for (int v = 0; v < a->n_vars; v++)
    if (a->vars[v].sort == SORT_INT) s->ivars[s->n_ivars++] = v;
  for (int p = 0; p < AX_MAX_VARS; p++) s->same_as[p] = -1;
  for (int c = 0; c < a->n_conds; c++) {
    const Cond *cd = &a->conds[c];
    s->cond_deps[c] = iexpr_deps(s, cd->a) | iexpr_deps(s, cd->b);
    s->cond_last[c] = last_of(s->cond_deps[c]);
    /* dim(v, axis) = e or rank(v) = e, either way round, e read before v. */
    for (int side = 0; side < 2 && cd->op == CMP_EQ; side++) {
      const IExpr *x = side ? cd->b : cd->a, *e = side ? cd->a : cd->b;
      bool fixed_axis = x->kind == I_DIM && x->a->kind == I_NUM && x->a->num >= 0;
      if (x->kind != I_RANK && !fixed_axis) continue;
      int pv = tvar_pos(s, x->var);
      if (pv < 0 || last_of(iexpr_deps(s, e)) >= pv) continue;
      s->pin[pv][s->n_pins[pv]].axis = x->kind == I_RANK ? -1 : (int)x->a->num;
      s->pin[pv][s->n_pins[pv]++].e = e;
      break;
    }
    /* shape(u) = shape(v), u set first: v has one shape to try. */
    if (cd->op == CMP_EQ && cd->a->kind == I_SHAPE && cd->b->kind == I_SHAPE) {
      int pu = tvar_pos(s, cd->a->var), pv = tvar_pos(s, cd->b->var);
      if (pu > pv) {
        int t = pu;
        pu = pv, pv = t;
      }
      if (pu >= 0 && pu < pv && s->same_as[pv] < 0) s->same_as[pv] = pu;
    }
  }
  /* A stamp of 0 is never a generation: nothing is cached yet. */
  return s;
}

static void search_free(Search *s) {
  for (int i = 0; i < s->n_nodes; i++) free(s->node[i].val.v);
  for (int p = 0; p < AX_MAX_VARS; p++) free(s->input[p].v);
  free(s);
}

bool axiom_sample(const Axioms *ax, int i, Binding *b, Shape *shapes) {
  /* Extents of 3 first: small, yet no axis is degenerate. */
  static const int order[] = {3, 2, 4, 1};
  Search *s = search_new(ax, i);
  s->sample_only = true;
  s->deadline = now_s() + 1.0;
  for (int k = 0; k < 4 && !s->found && !s->timed_out && !s->too_large; k++) {
    s->level = order[k];
    search_level(s);
  }
  bool found = s->found;
  if (found) {
    *b = s->sample;
    memcpy(shapes, s->sample_shapes, sizeof s->sample_shapes);
    for (int v = 0; v < AX_MAX_VARS; v++) b->shape[v] = NULL;
  }
  search_free(s);
  return found;
}

typedef struct AxiomReport {
  bool is_false, untested, too_large;
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
  if (s->too_large) {
    rep->too_large = true;
    search_free(s);
    return;
  }
  s->deadline = t0 + budget_s;
  for (s->level = 1; s->level <= MAX_LEVEL && !s->found && !s->timed_out; s->level++) {
    search_level(s);
    if (!s->found && !s->timed_out) rep->level = s->level;
  }
  rep->is_false = s->found;
  rep->tried = s->tried;
  memcpy(rep->counterexample, s->counterexample, sizeof rep->counterexample);
  rep->seconds = now_s() - t0;
  search_free(s);
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
  fprintf(out, "validation: exact (int64 rationals with overflow checks, GMP where they "
          "overflow, GMP checks), shapes of rank 0-4 with extents 1-%d, %.1f s per axiom at most\n",
          MAX_LEVEL, budget_s);
  int64_t total = 0;
  for (int i = 0; i < ax->n_axioms; i++) {
    const AxiomReport *r = &rep[i];
    total += r->tried;
    if (r->is_false) {
      (*n_false)++;
      fprintf(out, "  FALSE      %-28s line %d: smallest counterexample: %s\n",
              ax->axioms[i].name, ax->axioms[i].line, r->counterexample);
    } else if (r->too_large) {
      fprintf(out, "  untested   %-28s line %d: more than %d subterms\n", ax->axioms[i].name,
              ax->axioms[i].line, MAX_NODES);
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
