/* layout.c: operators that move or select elements and compute nothing:
 * transpose, reshape, concat, split, pad, slice, gather, depth_to_space,
 * space_to_depth, tile, expand.
 * Kernels copy bytes, so one kernel serves float32, Z_p residues and int64
 * shape tensors; that is also why these operators are exact (and linear)
 * in Z_p. Most kernels reduce to box_copy, a strided copy whose dimensions
 * are first merged wherever both sides are contiguous, so a long run is one
 * memcpy; a stride of 0 repeats (tile, expand). ONNX forms are normalized on
 * import: Reshape, Flatten, Squeeze and Unsqueeze become reshape to concrete
 * dims, Slice becomes a start, end and step for every dimension, clamped as
 * ONNX specifies, and the constant inputs of Tile and Expand become
 * parameters. Axes are stored non-negative. Element-wise arithmetic is in
 * elementwise.c. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/modp.h"
#include "runtime/ops/family.h"

#define DIM_MAX ((int64_t)1 << 40) /* bound on stored extents and offsets */
#define LIST_MAX 16                 /* room for any ONNX list we accept */

/* ---- shared: element size and strided copies ---- */

/* Data inputs 0..n_data-1 and every output must share one dtype: a layout
 * kernel copies elements of that size and converts nothing. */
static int elem_size(const Node *n, Tensor *const *in, int n_data, Tensor *const *out, size_t *es,
                     Diag *d) {
  DType t = out[0]->dtype;
  for (int i = 0; i < n_data; i++)
    if (in[i]->dtype != t)
      return op_error(n, d, "input %d is %s but the output is %s", i, dtype_name(in[i]->dtype),
                      dtype_name(t));
  for (int i = 1; i < n->n_out; i++)
    if (out[i]->dtype != t) return op_error(n, d, "outputs of different dtypes");
  *es = dtype_size(t);
  return TEQ_OK;
}

/* A box of ext[i] elements along each of nd dimensions, read with element
 * strides ss (negative for a slice with negative steps, 0 to repeat) and
 * written densely in row-major order. Tile splits each dimension in two
 * (which copy, where in it), hence twice the rank. */
#define BOX_MAX_DIMS (2 * TEQ_MAX_DIMS)

typedef struct Box {
  int nd;
  int64_t ext[BOX_MAX_DIMS], ss[BOX_MAX_DIMS];
} Box;

/* Drops extent-1 dimensions and merges a dimension into the one outside it
 * when the source steps evenly across the boundary (the destination always
 * does). */
static void box_collapse(Box *b) {
  Box c;
  memset(&c, 0, sizeof c);
  for (int i = 0; i < b->nd; i++) {
    if (b->ext[i] == 1) continue;
    int k = c.nd - 1;
    if (k >= 0 && c.ss[k] == b->ss[i] * b->ext[i]) {
      c.ext[k] *= b->ext[i];
      c.ss[k] = b->ss[i];
      continue;
    }
    c.ext[c.nd] = b->ext[i];
    c.ss[c.nd] = b->ss[i];
    c.nd++;
  }
  if (c.nd == 0) { /* one element */
    c.nd = 1;
    c.ext[0] = 1;
  }
  *b = c;
}

static void copy_run(char *dst, const char *src, int64_t ss, int64_t n, size_t es) {
  if (ss == 1) {
    memcpy(dst, src, (size_t)n * es);
  } else if (es == 4) {
    uint32_t *o = (uint32_t *)dst;
    const uint32_t *s = (const uint32_t *)src;
    for (int64_t i = 0; i < n; i++) o[i] = s[i * ss];
  } else if (es == 8) {
    uint64_t *o = (uint64_t *)dst;
    const uint64_t *s = (const uint64_t *)src;
    for (int64_t i = 0; i < n; i++) o[i] = s[i * ss];
  } else {
    for (int64_t i = 0; i < n; i++) memcpy(dst + i * (int64_t)es, src + i * ss * (int64_t)es, es);
  }
}

/* dst [rows, cols] row-major = src (r, c) at r + c * ss: a transpose of
 * 4-byte elements, in square tiles so that the lines each column walk
 * touches are reused by the next rows rather than evicted (a plain column
 * walk of a weight matrix missed the cache on every element). */
enum { TILE = 32 };
static void transpose_tiles(uint32_t *dst, const uint32_t *src, int64_t rows, int64_t cols,
                            int64_t ss) {
  for (int64_t r0 = 0; r0 < rows; r0 += TILE)
    for (int64_t c0 = 0; c0 < cols; c0 += TILE) {
      int64_t r1 = r0 + TILE < rows ? r0 + TILE : rows, c1 = c0 + TILE < cols ? c0 + TILE : cols;
      for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) dst[r * cols + c] = src[r + c * ss];
    }
}

static void box_copy(char *dst, const char *src, const Box *box, size_t es) {
  for (int i = 0; i < box->nd; i++)
    if (box->ext[i] == 0) return;
  Box b = *box;
  box_collapse(&b);
  int in = b.nd - 1;
  int64_t n = b.ext[in], outer = 1, idx[BOX_MAX_DIMS] = {0}, so = 0, e = (int64_t)es;
  /* The last two dimensions swapped: tiles, once per outer index. */
  bool tiles = es == 4 && in >= 1 && b.ss[in - 1] == 1 && b.ss[in] != 1 && b.ext[in - 1] >= TILE &&
               n >= TILE;
  int last = tiles ? in - 1 : in;
  int64_t run = tiles ? b.ext[in - 1] * n : n;
  for (int i = 0; i < last; i++) outer *= b.ext[i];
  for (int64_t k = 0; k < outer; k++) {
    if (tiles)
      transpose_tiles((uint32_t *)dst + k * run, (const uint32_t *)src + so, b.ext[in - 1], n,
                      b.ss[in]);
    else
      copy_run(dst + k * run * e, src + so * e, b.ss[in], n, es);
    for (int i = last - 1; i >= 0; i--) { /* odometer step */
      so += b.ss[i];
      if (++idx[i] < b.ext[i]) break;
      so -= b.ss[i] * b.ext[i];
      idx[i] = 0;
    }
  }
}

/* No product overflows: every shape in a graph or a tensor fits
 * (shape_fits), so its extents multiply to at most 2^40. */
static int64_t prod_dims(const Shape *s, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= s->d[i];
  return p;
}

/* ---- shared: ONNX helpers ---- */

static int onnx_input_rank(OnnxNodeIn *v, int i, const Shape **shape, Diag *d) {
  const Shape *s = onnx_in_input_shape(v, i);
  if (!s || !shape_is_known(s))
    return onnx_in_unsupported(v, d, "input %d has an unknown shape", i);
  *shape = s;
  return TEQ_OK;
}

/* Integer attribute `name` as an axis of input 0, where ONNX allows
 * [-r, r). The rank is needed only to normalize a negative axis; with an
 * unknown input shape shape inference checks the range later. def is used
 * when the attribute is absent; INT64_MIN makes it required. */
static int onnx_read_axis(OnnxNodeIn *v, const char *name, int64_t def, int64_t *axis, Diag *d) {
  int64_t a = def;
  if (!onnx_in_attr_int(v, name, &a) && def == INT64_MIN)
    return onnx_in_error(v, d, "attribute %s is missing", name);
  const Shape *x = onnx_in_input_shape(v, 0);
  int r = x && shape_is_known(x) ? x->ndim : -1;
  if (r < 0 && a < 0)
    return onnx_in_unsupported(v, d, "attribute %s=%lld with input 0 of unknown rank", name,
                               (long long)a);
  if (r < 0) r = TEQ_MAX_DIMS; /* the widest range any input could allow */
  if (a < -r || a >= r)
    return onnx_in_error(v, d, "attribute %s=%lld: must be in [%d, %d)", name, (long long)a, -r,
                         r);
  *axis = a < 0 ? a + r : a;
  return TEQ_OK;
}

/* The integers of constant input i (int64, or integral float32), which is
 * then consumed: it is a parameter, not a graph edge. */
static int onnx_const_ints(OnnxNodeIn *v, int i, const char *what, int64_t *out, int *n, Diag *d) {
  const Tensor *t = onnx_in_const_input(v, i);
  if (!t) return onnx_in_unsupported(v, d, "%s (input %d) is computed, not a constant", what, i);
  int64_t k = tensor_numel(t);
  if (t->shape.ndim > 1 || k > LIST_MAX)
    return onnx_in_unsupported(v, d, "%s (input %d) has %lld values", what, i, (long long)k);
  for (int64_t j = 0; j < k; j++) {
    if (t->dtype == DT_I64) {
      out[j] = ((const int64_t *)t->data)[j];
    } else {
      float f = t->dtype == DT_F32 ? ((const float *)t->data)[j] : NAN;
      if (!(f > -0x1p62f && f < 0x1p62f) || f != truncf(f))
        return onnx_in_error(v, d, "%s (input %d) is not integers", what, i);
      out[j] = (int64_t)f;
    }
  }
  *n = (int)k;
  onnx_in_consume_input(v, i);
  return TEQ_OK;
}

/* A list that is attribute `name` before opset `since` and constant input
 * `input` from it. *present says whether it was given. */
static int onnx_read_list(OnnxNodeIn *v, const char *name, int since, int input, int64_t *out,
                          int *n, bool *present, Diag *d) {
  *n = 0;
  if (onnx_in_opset(v) < since) {
    int errors = d ? d->n_errors : 0; /* a too-long list is reported in d */
    *present = onnx_in_attr_ints(v, name, out, LIST_MAX, n);
    return d && d->n_errors > errors ? TEQ_ERR_INPUT : TEQ_OK;
  }
  *present = onnx_in_has_input(v, input);
  return *present ? onnx_const_ints(v, input, name, out, n, d) : TEQ_OK;
}

static int add_ints_input(OnnxNodeOut *w, const int64_t *vals, int n, Diag *d) {
  Shape s = shape_of(1, n);
  Tensor *t = tensor_new(DT_I64, &s);
  if (!t) {
    diag_error(d, "out of memory");
    return TEQ_ERR_NOMEM;
  }
  if (n) memcpy(t->data, vals, (size_t)n * sizeof *vals);
  onnx_out_add_const_input(w, t);
  tensor_unref(t);
  return TEQ_OK;
}

static int write_axis(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)d;
  onnx_out_attr_int(w, "axis", param_int(&n->params, 0));
  return TEQ_OK;
}

/* ---- transpose ---- */

static const OpParam transpose_params[] = {
  {.name = "perm", .type = PARAM_INTS, .lo = 0, .hi = TEQ_MAX_DIMS - 1, .onnx_attr = "perm"},
};

/* The permutation for rank r; an empty perm reverses, as in ONNX. */
static void transpose_perm(const Node *n, int r, int64_t *perm) {
  const ParamValue *p = &n->params.v[0];
  for (int i = 0; i < r; i++) perm[i] = p->n ? p->i[i] : r - 1 - i;
}

static int transpose_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  const ParamValue *p = &n->params.v[0];
  int r = in[0].ndim;
  char s[SHAPE_STR_MAX];
  if (p->n && p->n != r)
    return op_error(n, d, "perm has %d entries but input 0 has shape %s (rank %d)", p->n,
                    shape_format(&in[0], s, sizeof s), r);
  int64_t perm[TEQ_MAX_DIMS];
  bool seen[TEQ_MAX_DIMS] = {false};
  transpose_perm(n, r, perm);
  Shape o = in[0];
  for (int i = 0; i < r; i++) {
    if (perm[i] < 0 || perm[i] >= r || seen[perm[i]])
      return op_error(n, d, "perm is not a permutation of 0..%d (entry %d is %lld)", r - 1, i,
                      (long long)perm[i]);
    seen[perm[i]] = true;
    o.d[i] = in[0].d[perm[i]];
  }
  out[0] = o;
  return TEQ_OK;
}

static int transpose_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  int r = in[0]->shape.ndim;
  int64_t perm[TEQ_MAX_DIMS], ist[TEQ_MAX_DIMS];
  transpose_perm(n, r, perm);
  shape_strides(&in[0]->shape, ist);
  Box b = {.nd = r};
  for (int i = 0; i < r; i++) {
    b.ext[i] = out[0]->shape.d[i];
    b.ss[i] = ist[perm[i]];
  }
  box_copy(out[0]->data, in[0]->data, &b, es);
  return TEQ_OK;
}

/* An empty perm is ONNX's default (reverse), so it is left out. */
static int transpose_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)d;
  if (n->params.v[0].n == 0) onnx_out_drop_attr(w, "perm");
  return TEQ_OK;
}

/* A perm that reverses the axes is spelled as the default (empty). */
static void transpose_canonical(Node *n, const Shape *in) {
  ParamValue *p = &n->params.v[0];
  if (p->n != in[0].ndim) return;
  for (int i = 0; i < p->n; i++)
    if (p->i[i] != p->n - 1 - i) return;
  memset(p, 0, sizeof *p); /* the default's bytes: parameters compare as bytes */
}

/* Moving only extent-1 axes keeps every element where it was ([1, 512]
 * to [512, 1]): the axes longer than 1 must keep their order. */
static bool transpose_view(const Node *n, const Shape *in, const Tensor *const *consts, int out,
                           int64_t *first) {
  (void)consts;
  (void)out;
  int r = in[0].ndim;
  int64_t perm[TEQ_MAX_DIMS], last = -1;
  if (n->params.v[0].n && n->params.v[0].n != r) return false;
  transpose_perm(n, r, perm);
  for (int i = 0; i < r; i++) {
    if (in[0].d[perm[i]] == 1) continue;
    if (perm[i] < last) return false;
    last = perm[i];
  }
  *first = 0;
  return true;
}

/* Output element f's indices, each read back through perm into input
 * 0's strides. */
static int64_t transpose_source_of(const Node *n, const Shape *in, int64_t f, int *input) {
  int r = in[0].ndim;
  int64_t perm[TEQ_MAX_DIMS], ist[TEQ_MAX_DIMS], from = 0;
  transpose_perm(n, r, perm);
  shape_strides(&in[0], ist);
  for (int i = r - 1; i >= 0; i--) {
    int64_t extent = in[0].d[perm[i]];
    from += f % extent * ist[perm[i]];
    f /= extent;
  }
  *input = 0;
  return from;
}

/* Output axis i is input axis perm[i]: its stride is that axis's. */
static bool transpose_strided(const Node *n, const Shape *in, const int64_t *from, int64_t *to,
                              int64_t *first) {
  int r = in[0].ndim;
  int64_t perm[TEQ_MAX_DIMS];
  transpose_perm(n, r, perm);
  for (int i = 0; i < r; i++) to[i] = from[perm[i]];
  *first = 0;
  return true;
}

const OpDef op_def_transpose = {
  .kind = OP_TRANSPOSE, .name = "transpose", .axiom_name = "transpose", .onnx_op = "Transpose",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = transpose_params, .n_params = 1,
  .flags = OPF_LAYOUT_ONLY | OPF_NO_COPIES | OPF_MULTILINEAR,
  .infer_shape = transpose_infer, .eval_f32 = transpose_eval, .eval_modp = transpose_eval,
  .onnx_write = transpose_onnx_write, .canonical = transpose_canonical,
  .view = transpose_view, .source_of = transpose_source_of, .strided = transpose_strided,
  .eval_cuda = CUDA_EVAL(transpose),
};

/* ---- reshape (and ONNX Flatten, Squeeze, Unsqueeze) ---- */

static const OpParam reshape_params[] = {
  {.name = "shape", .type = PARAM_INTS, .lo = 0, .hi = DIM_MAX},
};

static int reshape_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  const ParamValue *p = &n->params.v[0];
  char s[SHAPE_STR_MAX];
  if (p->n > TEQ_MAX_DIMS)
    return op_error(n, d, "shape has %d dims, at most %d", p->n, TEQ_MAX_DIMS);
  int64_t count = 1; /* checked: six extents of 2^40 would overflow */
  for (int i = 0; i < p->n; i++) {
    if (p->i[i] && count > DIM_MAX / p->i[i])
      return op_error(n, d, "shape has more than 2^40 elements");
    count *= p->i[i];
  }
  Shape o = shape_make(p->n, p->i);
  if (count != shape_numel(&in[0])) {
    char t[SHAPE_STR_MAX];
    return op_error(n, d, "shape=%s has %lld elements but input 0 has shape %s (%lld)",
                    shape_format(&o, t, sizeof t), (long long)shape_numel(&o),
                    shape_format(&in[0], s, sizeof s), (long long)shape_numel(&in[0]));
  }
  out[0] = o;
  return TEQ_OK;
}

static int reshape_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  memcpy(out[0]->data, in[0]->data, (size_t)tensor_numel(out[0]) * es);
  return TEQ_OK;
}

/* Row-major order is all a reshape changes: its output is its input. */
static bool reshape_view(const Node *n, const Shape *in, const Tensor *const *consts, int out,
                         int64_t *first) {
  (void)consts;
  (void)n, (void)in, (void)out;
  *first = 0;
  return true;
}

/* ONNX Reshape: 0 copies the input's dimension (unless allowzero), one -1
 * is inferred from the element count. */
static int reshape_resolve(OnnxNodeIn *v, const Shape *x, int64_t *dims, int *nd, Diag *d) {
  int64_t want[LIST_MAX], allowzero = 0, known = 1;
  int k, at = -1;
  bool present;
  int rc = onnx_read_list(v, "shape", 5, 1, want, &k, &present, d);
  if (rc) return rc;
  if (!present) return onnx_in_error(v, d, "the target shape is missing");
  if (k > TEQ_MAX_DIMS)
    return onnx_in_unsupported(v, d, "target rank %d above %d", k, TEQ_MAX_DIMS);
  onnx_in_attr_int(v, "allowzero", &allowzero);
  for (int i = 0; i < k; i++) {
    if (want[i] == -1 && at < 0) {
      at = i;
      continue;
    }
    if (want[i] < 0 || want[i] > DIM_MAX)
      return onnx_in_error(v, d, "shape[%d]=%lld is invalid", i, (long long)want[i]);
    if (want[i] == 0 && !allowzero && i >= x->ndim)
      return onnx_in_error(v, d, "shape[%d]=0 copies a dimension the input lacks", i);
    dims[i] = want[i] == 0 && !allowzero ? x->d[i] : want[i];
    if (dims[i] && known > DIM_MAX / dims[i]) /* the product, checked as reshape_infer does */
      return onnx_in_error(v, d, "shape[%d]=%lld: the extents multiply to more than 2^40", i,
                           (long long)dims[i]);
    known *= dims[i];
  }
  if (at >= 0) {
    if (known == 0 || shape_numel(x) % known)
      return onnx_in_error(v, d, "shape[%d]=-1 cannot be inferred from %lld elements", at,
                           (long long)shape_numel(x));
    dims[at] = shape_numel(x) / known;
  }
  *nd = k;
  return TEQ_OK;
}

static int flatten_dims(OnnxNodeIn *v, const Shape *x, int64_t *dims, int *nd, Diag *d) {
  int64_t a = 1;
  onnx_in_attr_int(v, "axis", &a);
  if (a < -x->ndim || a > x->ndim)
    return onnx_in_error(v, d, "attribute axis=%lld: must be in [%d, %d]", (long long)a, -x->ndim,
                         x->ndim);
  if (a < 0) a += x->ndim;
  dims[0] = prod_dims(x, 0, (int)a);
  dims[1] = prod_dims(x, (int)a, x->ndim);
  *nd = 2;
  return TEQ_OK;
}

/* Normalizes axes against rank r into a mask; duplicates are an error. */
static int axes_mask(OnnxNodeIn *v, const int64_t *axes, int k, int r, bool *mask, Diag *d) {
  memset(mask, 0, sizeof(bool) * (size_t)r);
  for (int i = 0; i < k; i++) {
    int64_t a = axes[i] < 0 ? axes[i] + r : axes[i];
    if (a < 0 || a >= r)
      return onnx_in_error(v, d, "axes[%d]=%lld: must be in [%d, %d)", i, (long long)axes[i],
                           -r, r);
    if (mask[a]) return onnx_in_error(v, d, "axes[%d]=%lld repeats an axis", i, (long long)axes[i]);
    mask[a] = true;
  }
  return TEQ_OK;
}

static int squeeze_dims(OnnxNodeIn *v, const Shape *x, int64_t *dims, int *nd, Diag *d) {
  int64_t axes[LIST_MAX];
  int k;
  bool present, mask[TEQ_MAX_DIMS];
  int rc = onnx_read_list(v, "axes", 13, 1, axes, &k, &present, d);
  if (!rc && present) rc = axes_mask(v, axes, k, x->ndim, mask, d);
  if (rc) return rc;
  *nd = 0;
  for (int i = 0; i < x->ndim; i++) {
    bool drop = present ? mask[i] : x->d[i] == 1;
    if (drop && x->d[i] != 1)
      return onnx_in_error(v, d, "cannot squeeze axis %d of extent %lld", i, (long long)x->d[i]);
    if (!drop) dims[(*nd)++] = x->d[i];
  }
  return TEQ_OK;
}

static int unsqueeze_dims(OnnxNodeIn *v, const Shape *x, int64_t *dims, int *nd, Diag *d) {
  int64_t axes[LIST_MAX];
  int k;
  bool present, mask[TEQ_MAX_DIMS];
  int rc = onnx_read_list(v, "axes", 13, 1, axes, &k, &present, d);
  if (rc) return rc;
  if (!present) return onnx_in_error(v, d, "axes are missing");
  int r = x->ndim + k;
  if (r > TEQ_MAX_DIMS)
    return onnx_in_unsupported(v, d, "output rank %d above %d", r, TEQ_MAX_DIMS);
  if ((rc = axes_mask(v, axes, k, r, mask, d))) return rc;
  for (int i = 0, j = 0; i < r; i++) dims[i] = mask[i] ? 1 : x->d[j++];
  *nd = r;
  return TEQ_OK;
}

static int reshape_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const Shape *x = NULL;
  int64_t dims[LIST_MAX];
  int nd = 0;
  int rc = onnx_input_rank(v, 0, &x, d);
  if (rc) return rc;
  const char *op = onnx_in_op_type(v);
  if (strcmp(op, "Flatten") == 0) rc = flatten_dims(v, x, dims, &nd, d);
  else if (strcmp(op, "Squeeze") == 0) rc = squeeze_dims(v, x, dims, &nd, d);
  else if (strcmp(op, "Unsqueeze") == 0) rc = unsqueeze_dims(v, x, dims, &nd, d);
  else rc = reshape_resolve(v, x, dims, &nd, d);
  if (rc) return rc;
  param_set_ints(p, 0, dims, nd);
  return TEQ_OK;
}

/* Opset 13 reads a 0 in the target as "copy the input's dimension"; an
 * empty target dimension needs opset 14's allowzero, so it is refused. */
static int reshape_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  const ParamValue *s = &n->params.v[0];
  for (int i = 0; i < s->n; i++)
    if (s->i[i] == 0) {
      diag_error(d, "reshape: shape[%d]=0 (an empty tensor) cannot be written in opset 13", i);
      return TEQ_ERR_UNSUPPORTED;
    }
  return add_ints_input(w, s->i, s->n, d);
}

static const char *const reshape_aliases[] = {"Flatten", "Squeeze", "Unsqueeze", NULL};

const OpDef op_def_reshape = {
  .kind = OP_RESHAPE, .name = "reshape", .axiom_name = "reshape", .onnx_op = "Reshape",
  .onnx_aliases = reshape_aliases,
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = reshape_params, .n_params = 1,
  .flags = OPF_LAYOUT_ONLY | OPF_NO_COPIES | OPF_MULTILINEAR,
  .infer_shape = reshape_infer, .eval_f32 = reshape_eval, .eval_modp = reshape_eval,
  .onnx_read = reshape_onnx_read, .onnx_write = reshape_onnx_write, .view = reshape_view,
  .eval_cuda = CUDA_EVAL(reshape),
};

/* ---- concat ---- */

static const OpParam concat_params[] = {
  {.name = "axis", .type = PARAM_INT, .lo = 0, .hi = TEQ_MAX_DIMS - 1},
};

static int concat_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  int64_t axis = param_int(&n->params, 0);
  Shape o = in[0];
  char s[SHAPE_STR_MAX], t[SHAPE_STR_MAX];
  for (int k = 0; k < n->n_in; k++) {
    if (axis >= in[k].ndim)
      return op_error(n, d, "axis=%lld: input %d has shape %s (rank %d)", (long long)axis, k,
                      shape_format(&in[k], s, sizeof s), in[k].ndim);
    bool same = in[k].ndim == o.ndim;
    for (int i = 0; same && i < o.ndim; i++) same = i == axis || in[k].d[i] == in[0].d[i];
    if (!same)
      return op_error(n, d, "axis=%lld: input %d has shape %s, input 0 has %s", (long long)axis, k,
                      shape_format(&in[k], s, sizeof s), shape_format(&in[0], t, sizeof t));
    if (k && (__builtin_add_overflow(o.d[axis], in[k].d[axis], &o.d[axis]) ||
              o.d[axis] > DIM_MAX))
      return op_error(n, d, "axis=%lld: the inputs' extents along it add up to more than 2^40",
                      (long long)axis);
  }
  out[0] = o;
  return TEQ_OK;
}

static int concat_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  size_t es = 0;
  int rc = elem_size(n, in, n->n_in, out, &es, d);
  if (rc) return rc;
  int axis = (int)param_int(&n->params, 0);
  const Shape *o = &out[0]->shape;
  int64_t outer = prod_dims(o, 0, axis), inner = prod_dims(o, axis + 1, o->ndim);
  char *dst = out[0]->data;
  for (int64_t i = 0; i < outer; i++) {
    for (int k = 0; k < n->n_in; k++) {
      size_t chunk = (size_t)(in[k]->shape.d[axis] * inner) * es;
      memcpy(dst, (const char *)in[k]->data + (size_t)i * chunk, chunk);
      dst += chunk;
    }
  }
  return TEQ_OK;
}

/* With every extent before the axis 1 (one image), each input is one run
 * of the output, after the runs of those before it. */
static bool concat_assembled(const Node *n, const Shape *in, int64_t *first) {
  int axis = (int)param_int(&n->params, 0);
  const Shape *o = &n->out[0];
  if (axis >= o->ndim || prod_dims(o, 0, axis) != 1) return false;
  int64_t at = 0;
  for (int j = 0; j < n->n_in; j++) {
    first[j] = at;
    at += shape_numel(&in[j]);
  }
  return at == shape_numel(o);
}

static int concat_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  int64_t axis = 0;
  /* Concat-1 defaulted the axis to 1; later opsets require it. */
  int rc = onnx_read_axis(v, "axis", onnx_in_opset(v) < 4 ? 1 : INT64_MIN, &axis, d);
  if (!rc) param_set_int(p, 0, axis);
  return rc;
}

const OpDef op_def_concat = {
  .kind = OP_CONCAT, .name = "concat", .axiom_name = "concat", .onnx_op = "Concat",
  .n_in_min = 1, .n_in_max = -1, .n_out_min = 1, .n_out_max = 1,
  .params = concat_params, .n_params = 1,
  .flags = OPF_LAYOUT_ONLY | OPF_MULTILINEAR,
  .infer_shape = concat_infer, .eval_f32 = concat_eval, .eval_modp = concat_eval,
  .onnx_read = concat_onnx_read, .onnx_write = write_axis, .assembled = concat_assembled,
  .eval_cuda = CUDA_EVAL(concat),
};

/* ---- split ---- */

enum { SPLIT_AXIS, SPLIT_SIZES };

static const OpParam split_params[] = {
  [SPLIT_AXIS] = {.name = "axis", .type = PARAM_INT, .lo = 0, .hi = TEQ_MAX_DIMS - 1},
  [SPLIT_SIZES] = {.name = "sizes", .type = PARAM_INTS, .lo = 0, .hi = DIM_MAX},
};

/* Extent of output k along the axis: sizes[k], or an equal part. */
static int64_t split_size(const Node *n, int64_t len, int k) {
  const ParamValue *s = &n->params.v[SPLIT_SIZES];
  return s->n ? s->i[k] : len / n->n_out;
}

static int split_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  int64_t axis = param_int(&n->params, SPLIT_AXIS);
  const ParamValue *s = &n->params.v[SPLIT_SIZES];
  char b[SHAPE_STR_MAX];
  if (axis >= in[0].ndim)
    return op_error(n, d, "axis=%lld: input 0 has shape %s (rank %d)", (long long)axis,
                    shape_format(&in[0], b, sizeof b), in[0].ndim);
  int64_t len = in[0].d[axis], sum = 0;
  if (s->n && s->n != n->n_out)
    return op_error(n, d, "sizes has %d entries for %d outputs", s->n, n->n_out);
  for (int k = 0; k < s->n; k++) sum += s->i[k];
  if (s->n && sum != len)
    return op_error(n, d, "sizes add up to %lld but axis %lld of input 0 %s has %lld",
                    (long long)sum, (long long)axis, shape_format(&in[0], b, sizeof b),
                    (long long)len);
  if (!s->n && len % n->n_out)
    return op_error(n, d, "axis %lld of input 0 %s has %lld, not divisible into %d outputs",
                    (long long)axis, shape_format(&in[0], b, sizeof b), (long long)len, n->n_out);
  for (int k = 0; k < n->n_out; k++) {
    out[k] = in[0];
    out[k].d[axis] = split_size(n, len, k);
  }
  return TEQ_OK;
}

static int split_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  int axis = (int)param_int(&n->params, SPLIT_AXIS);
  const Shape *x = &in[0]->shape;
  int64_t outer = prod_dims(x, 0, axis), inner = prod_dims(x, axis + 1, x->ndim);
  const char *src = in[0]->data;
  for (int64_t i = 0; i < outer; i++) {
    for (int k = 0; k < n->n_out; k++) {
      size_t chunk = (size_t)(out[k]->shape.d[axis] * inner) * es;
      memcpy((char *)out[k]->data + (size_t)i * chunk, src, chunk);
      src += chunk;
    }
  }
  return TEQ_OK;
}

/* With nothing but extent-1 dimensions before the axis, each part is one
 * block of the input (a batch-1 matmul's merged output cut by column). */
static bool split_view(const Node *n, const Shape *in, const Tensor *const *consts, int out,
                       int64_t *first) {
  (void)consts;
  int axis = (int)param_int(&n->params, SPLIT_AXIS);
  if (axis >= in[0].ndim || prod_dims(&in[0], 0, axis) != 1) return false;
  int64_t len = in[0].d[axis], inner = prod_dims(&in[0], axis + 1, in[0].ndim), at = 0;
  for (int k = 0; k < out; k++) at += split_size(n, len, k);
  *first = at * inner;
  return true;
}

/* Opset 18's num_outputs allows a smaller last part: ceil-sized parts. */
static int split_uneven(OnnxNodeIn *v, int64_t len, int parts, int64_t *sizes, Diag *d) {
  int64_t chunk = (len + parts - 1) / parts;
  for (int k = 0; k < parts; k++) sizes[k] = chunk;
  sizes[parts - 1] = len - chunk * (parts - 1);
  if (sizes[parts - 1] < 0)
    return onnx_in_error(v, d, "%lld elements do not split into %d outputs", (long long)len, parts);
  return TEQ_OK;
}

static int split_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const Shape *x = onnx_in_input_shape(v, 0);
  int64_t axis = 0, sizes[LIST_MAX], num = 0;
  int k, parts = onnx_in_n_outputs(v);
  bool present;
  int rc = onnx_read_axis(v, "axis", 0, &axis, d);
  if (!rc) rc = onnx_read_list(v, "split", 13, 1, sizes, &k, &present, d);
  if (rc) return rc;
  if (parts > TEQ_MAX_PARAM_LEN)
    return onnx_in_unsupported(v, d, "%d outputs, at most %d", parts, TEQ_MAX_PARAM_LEN);
  if (onnx_in_attr_int(v, "num_outputs", &num) && num != parts)
    return onnx_in_error(v, d, "num_outputs=%lld but the node has %d outputs", (long long)num,
                         parts);
  if (!present && x && shape_is_known(x) && x->d[axis] % parts) {
    if (onnx_in_opset(v) < 18)
      return onnx_in_error(v, d, "axis %lld has %lld elements, not divisible into %d outputs",
                           (long long)axis, (long long)x->d[axis], parts);
    if ((rc = split_uneven(v, x->d[axis], parts, sizes, d))) return rc;
    k = parts;
  }
  param_set_int(p, SPLIT_AXIS, axis);
  param_set_ints(p, SPLIT_SIZES, sizes, k);
  return TEQ_OK;
}

/* Equal parts are written without sizes; from opset 18 on, ONNX then
 * needs their number (num_outputs). */
static int split_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  const ParamValue *s = &n->params.v[SPLIT_SIZES];
  onnx_out_attr_int(w, "axis", param_int(&n->params, SPLIT_AXIS));
  if (s->n) return add_ints_input(w, s->i, s->n, d);
  if (onnx_out_opset(w) >= 18) onnx_out_attr_int(w, "num_outputs", n->n_out);
  return TEQ_OK;
}

const OpDef op_def_split = {
  .kind = OP_SPLIT, .name = "split", .axiom_name = "split", .onnx_op = "Split",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = TEQ_MAX_PARAM_LEN,
  .params = split_params, .n_params = 2,
  .flags = OPF_LAYOUT_ONLY | OPF_NO_COPIES | OPF_MULTILINEAR,
  .infer_shape = split_infer, .eval_f32 = split_eval, .eval_modp = split_eval,
  .view = split_view,
  .onnx_read = split_onnx_read, .onnx_write = split_onnx_write,
  .eval_cuda = CUDA_EVAL(split),
};

/* ---- pad ---- */

static const char *const pad_modes[] = {"constant", "reflect", "edge", NULL};

/* pads in ONNX order: every dimension's begin, then every dimension's end;
 * negative values crop. Eight values cap the rank at 4. */
static const OpParam pad_params[] = {
  [PAD_PADS] = {.name = "pads", .type = PARAM_INTS, .lo = -DIM_MAX, .hi = DIM_MAX},
  [PAD_VALUE] = {.name = "value", .type = PARAM_FLOAT},
  [PAD_MODE] = {.name = "mode", .type = PARAM_INT, .lo = 0, .hi = 2, .symbols = pad_modes},
};

static int pad_check_dim(const Node *n, int i, int64_t len, int64_t b, int64_t e, Diag *d) {
  int64_t mode = param_int(&n->params, PAD_MODE);
  if (len + b + e < 0)
    return op_error(n, d, "pads crop dimension %d (extent %lld) by %lld", i, (long long)len,
                    (long long)-(b + e));
  if (mode == PAD_REFLECT && (b > len - 1 || e > len - 1))
    return op_error(n, d, "mode=reflect: pads %lld, %lld exceed extent %lld - 1 of dimension %d",
                    (long long)b, (long long)e, (long long)len, i);
  if (mode == PAD_EDGE && len == 0 && (b > 0 || e > 0))
    return op_error(n, d, "mode=edge: dimension %d is empty, nothing to repeat", i);
  return TEQ_OK;
}

static int pad_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  const ParamValue *p = &n->params.v[PAD_PADS];
  int r = in[0].ndim;
  char s[SHAPE_STR_MAX];
  if (2 * r > TEQ_MAX_PARAM_LEN)
    return op_error(n, d, "input 0 has shape %s: rank %d above 4 (pads holds 8 values)",
                    shape_format(&in[0], s, sizeof s), r);
  if (p->n != 2 * r)
    return op_error(n, d, "pads has %d values but input 0 has shape %s (rank %d, so %d)", p->n,
                    shape_format(&in[0], s, sizeof s), r, 2 * r);
  Shape o = in[0];
  for (int i = 0; i < r; i++) {
    int rc = pad_check_dim(n, i, in[0].d[i], p->i[i], p->i[r + i], d);
    if (rc) return rc;
    o.d[i] = in[0].d[i] + p->i[i] + p->i[r + i];
  }
  out[0] = o;
  return TEQ_OK;
}

/* The source index of output index o - begin along a dimension of extent
 * len, or -1 for the fill value. */
static int64_t pad_source(int64_t s, int64_t len, int64_t mode) {
  if (s >= 0 && s < len) return s;
  if (mode == PAD_CONSTANT) return -1;
  if (mode == PAD_EDGE) return s < 0 ? 0 : len - 1;
  return s < 0 ? -s : 2 * (len - 1) - s; /* reflect, pads < len checked */
}

/* The fill value as an element of dtype t. In Z_p it must be an integer. */
static int pad_fill(const Node *n, DType t, unsigned char *fill, Diag *d) {
  double v = param_float(&n->params, PAD_VALUE);
  if (t == DT_F32) {
    float f = (float)v;
    memcpy(fill, &f, sizeof f);
    return TEQ_OK;
  }
  if (!(v > -0x1p53 && v < 0x1p53) || v != (double)(int64_t)v)
    return op_error(n, d, "value=%g is not an integer, so it has no %s value", v, dtype_name(t));
  int64_t i = (int64_t)v;
  uint32_t m = modp_from_int(i);
  if (t == DT_I64) memcpy(fill, &i, sizeof i);
  else memcpy(fill, &m, sizeof m);
  return TEQ_OK;
}

/* For each dimension, the source index of every output index (-1: fill). */
static int64_t *pad_maps(const Node *n, const Shape *x, const Shape *o, int64_t **map) {
  int r = x->ndim;
  int64_t total = 0;
  for (int i = 0; i < r; i++) total += o->d[i];
  int64_t *all = malloc((size_t)(total + 1) * sizeof *all);
  if (!all) return NULL;
  int64_t *m = all;
  for (int i = 0; i < r; i++) {
    map[i] = m;
    for (int64_t j = 0; j < o->d[i]; j++)
      m[j] = pad_source(j - n->params.v[PAD_PADS].i[i], x->d[i], param_int(&n->params, PAD_MODE));
    m += o->d[i];
  }
  return all;
}

/* One output row (the last dimension): src is the source row, or NULL when
 * an outer index falls in the padding. Typed loops for the two element
 * sizes there are, rather than a memcpy call per element. */
#define PAD_ROW(T)                                                              \
  do {                                                                          \
    T *o = (T *)dst, f;                                                         \
    const T *s = (const T *)src;                                                \
    memcpy(&f, fill, sizeof f);                                                 \
    for (int64_t j = 0; j < n; j++) o[j] = s && map[j] >= 0 ? s[map[j]] : f;   \
  } while (0)

static void pad_row(char *dst, const char *src, const int64_t *map, int64_t n, size_t es,
                    const unsigned char *fill) {
  if (es == 4) PAD_ROW(uint32_t);
  else PAD_ROW(uint64_t); /* int64; elem_size allows no other size */
}
#undef PAD_ROW

static int pad_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  size_t es = 0;
  unsigned char fill[8];
  int rc = elem_size(n, in, 1, out, &es, d);
  if (!rc) rc = pad_fill(n, out[0]->dtype, fill, d);
  if (rc || tensor_numel(out[0]) == 0) return rc;
  const Shape *x = &in[0]->shape, *o = &out[0]->shape;
  int r = x->ndim;
  if (r == 0) {
    memcpy(out[0]->data, in[0]->data, es);
    return TEQ_OK;
  }
  int64_t *map[TEQ_MAX_DIMS], ist[TEQ_MAX_DIMS], idx[TEQ_MAX_DIMS] = {0};
  int64_t *all = pad_maps(n, x, o, map);
  if (!all) {
    op_error(n, d, "out of memory");
    return TEQ_ERR_NOMEM;
  }
  shape_strides(x, ist);
  int64_t len = o->d[r - 1], rows = tensor_numel(out[0]) / len;
  for (int64_t k = 0; k < rows; k++) {
    int64_t off = 0;
    bool inside = true;
    for (int i = 0; i < r - 1; i++) {
      inside = inside && map[i][idx[i]] >= 0;
      off += map[i][idx[i]] * ist[i];
    }
    const char *src = inside ? (const char *)in[0]->data + off * (int64_t)es : NULL;
    pad_row((char *)out[0]->data + k * len * (int64_t)es, src, map[r - 1], len, es, fill);
    for (int i = r - 2; i >= 0 && ++idx[i] == o->d[i]; i--) idx[i] = 0;
  }
  free(all);
  return TEQ_OK;
}

static int pad_read_mode(OnnxNodeIn *v, Params *p, Diag *d) {
  const char *mode = "constant";
  onnx_in_attr_string(v, "mode", &mode);
  for (int m = 0; pad_modes[m]; m++)
    if (strcmp(mode, pad_modes[m]) == 0) {
      param_set_int(p, PAD_MODE, m);
      return TEQ_OK;
    }
  return onnx_in_unsupported(v, d, "mode '%s' is not supported", mode);
}

/* Opset 11 moved the constant value from an attribute to input 2. */
static int pad_read_value(OnnxNodeIn *v, Params *p, Diag *d) {
  double value = 0;
  if (onnx_in_opset(v) < 11) {
    onnx_in_attr_float(v, "value", &value);
  } else if (onnx_in_has_input(v, 2)) {
    const Tensor *t = onnx_in_const_input(v, 2);
    if (!t) return onnx_in_unsupported(v, d, "constant_value (input 2) is not a constant");
    if (tensor_numel(t) != 1)
      return onnx_in_error(v, d, "constant_value has %lld values", (long long)tensor_numel(t));
    value = t->dtype == DT_I64 ? (double)*(const int64_t *)t->data
                               : (double)*(const float *)t->data;
    onnx_in_consume_input(v, 2);
  }
  param_set_float(p, PAD_VALUE, value);
  return TEQ_OK;
}

/* pads for every dimension from pads over `axes` (opset 18), in ONNX order. */
static int pad_expand_axes(OnnxNodeIn *v, int r, const int64_t *axes, int k, int64_t *pads,
                           Diag *d) {
  int64_t given[LIST_MAX];
  bool mask[TEQ_MAX_DIMS];
  memcpy(given, pads, sizeof given);
  int rc = axes_mask(v, axes, k, r, mask, d);
  if (rc) return rc;
  memset(pads, 0, sizeof(int64_t) * 2 * (size_t)r);
  for (int j = 0; j < k; j++) {
    int64_t a = axes[j] < 0 ? axes[j] + r : axes[j];
    pads[a] = given[j];
    pads[r + a] = given[k + j];
  }
  return TEQ_OK;
}

static int pad_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const Shape *x = NULL;
  int64_t pads[LIST_MAX], axes[LIST_MAX];
  int k = 0, ka = 0;
  bool present, has_axes = false;
  int rc = onnx_input_rank(v, 0, &x, d);
  if (!rc) rc = pad_read_mode(v, p, d);
  if (!rc) rc = pad_read_value(v, p, d);
  if (!rc) rc = onnx_read_list(v, "pads", 11, 1, pads, &k, &present, d);
  if (!rc && onnx_in_opset(v) >= 18 && onnx_in_has_input(v, 3)) {
    has_axes = true;
    rc = onnx_const_ints(v, 3, "axes", axes, &ka, d);
  }
  if (rc) return rc;
  if (2 * x->ndim > TEQ_MAX_PARAM_LEN) {
    /* No padding at all, in any mode, is no node: what PyTorch writes
     * before a 3-D average pool, where no pad list of Teq's would fit. */
    bool none = present;
    for (int i = 0; i < k; i++) none = none && pads[i] == 0;
    if (!none) return onnx_in_unsupported(v, d, "input rank %d above 4", x->ndim);
    onnx_in_as_elementwise(v, OP_IDENTITY);
    return TEQ_OK;
  }
  if (!present) return onnx_in_error(v, d, "pads are missing");
  if (k != 2 * (has_axes ? ka : x->ndim))
    return onnx_in_error(v, d, "%d pads for %d axes", k, has_axes ? ka : x->ndim);
  if (has_axes && (rc = pad_expand_axes(v, x->ndim, axes, ka, pads, d))) return rc;
  param_set_ints(p, PAD_PADS, pads, 2 * x->ndim);
  return TEQ_OK;
}

/* Opset-13 form: pads and the fill value as constant inputs, the mode as a
 * string attribute when it is not the default. */
static int pad_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  double value = param_float(&n->params, PAD_VALUE);
  if (param_int(&n->params, PAD_MODE) != PAD_CONSTANT)
    onnx_out_attr_string(w, "mode", pad_modes[param_int(&n->params, PAD_MODE)]);
  int rc = add_ints_input(w, n->params.v[PAD_PADS].i, n->params.v[PAD_PADS].n, d);
  if (rc || value == 0) return rc;
  Shape s = shape_of(0);
  Tensor *t = tensor_new(n->dtype == DT_I64 ? DT_I64 : DT_F32, &s);
  if (!t) {
    op_error(n, d, "out of memory");
    return TEQ_ERR_NOMEM;
  }
  if (t->dtype == DT_I64) *(int64_t *)t->data = (int64_t)value;
  else *(float *)t->data = (float)value;
  onnx_out_add_const_input(w, t);
  tensor_unref(t);
  return TEQ_OK;
}

/* Pads of zero everywhere (PyTorch exports one before each of DenseNet's
 * transition pools) leave the input as it is, in every mode. */
static bool pad_view(const Node *n, const Shape *in, const Tensor *const *consts, int out,
                     int64_t *first) {
  (void)in;
  (void)consts;
  (void)out;
  const ParamValue *pads = &n->params.v[PAD_PADS];
  for (int i = 0; i < pads->n; i++)
    if (pads->i[i] != 0) return false;
  *first = 0;
  return true;
}

/* A constant Pad of +0 that only grows its input: zeros around it. */
static bool pad_zero_pad(const Node *n, int rank, int64_t *pads) {
  const ParamValue *p = &n->params.v[PAD_PADS];
  double value = param_float(&n->params, PAD_VALUE);
  if (param_int(&n->params, PAD_MODE) != PAD_CONSTANT || value != 0 || signbit(value) ||
      p->n != 2 * rank || n->dtype != DT_F32)
    return false;
  for (int i = 0; i < p->n; i++) {
    if (p->i[i] < 0) return false;
    pads[i] = p->i[i];
  }
  return true;
}

/* Linear for a zero fill value (PET's use); a non-zero fill is affine. */
const OpDef op_def_pad = {
  .kind = OP_PAD, .name = "pad", .onnx_op = "Pad",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = pad_params, .n_params = 3,
  .flags = OPF_LAYOUT_ONLY | OPF_MULTILINEAR,
  .infer_shape = pad_infer, .eval_f32 = pad_eval, .eval_modp = pad_eval,
  .onnx_read = pad_onnx_read, .onnx_write = pad_onnx_write, .view = pad_view,
  .zero_pad = pad_zero_pad,
  .eval_cuda = CUDA_EVAL(pad),
};

/* ---- slice ---- */

enum { SLICE_STARTS, SLICE_ENDS, SLICE_STEPS };

/* One entry per dimension, already clamped: with step > 0, 0 <= start,
 * end <= extent; with step < 0, -1 <= end, start <= extent - 1, where an
 * end of -1 means "through index 0". */
static const OpParam slice_params[] = {
  [SLICE_STARTS] = {.name = "starts", .type = PARAM_INTS, .lo = -1, .hi = DIM_MAX},
  [SLICE_ENDS] = {.name = "ends", .type = PARAM_INTS, .lo = -1, .hi = DIM_MAX},
  [SLICE_STEPS] = {.name = "steps", .type = PARAM_INTS, .def = 1, .lo = -DIM_MAX, .hi = DIM_MAX},
};

static int64_t slice_count(int64_t start, int64_t end, int64_t step) {
  if (step > 0) return end > start ? (end - start - 1) / step + 1 : 0;
  return start > end ? (start - end - 1) / -step + 1 : 0;
}

static int slice_check_dim(const Node *n, int i, int64_t len, int64_t b, int64_t e, int64_t st,
                           Diag *d) {
  bool ok = st > 0 ? b >= 0 && b <= len && e >= 0 && e <= len
                   : b >= -1 && b <= len - 1 && e >= -1 && e <= len - 1;
  if (st == 0) return op_error(n, d, "steps[%d]=0", i);
  if (!ok)
    return op_error(n, d, "dimension %d of extent %lld: start %lld, end %lld outside the "
                          "clamped range for step %lld", i, (long long)len, (long long)b,
                    (long long)e, (long long)st);
  return TEQ_OK;
}

static int slice_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  const ParamValue *b = &n->params.v[SLICE_STARTS], *e = &n->params.v[SLICE_ENDS],
                   *st = &n->params.v[SLICE_STEPS];
  int r = in[0].ndim;
  char s[SHAPE_STR_MAX];
  if (b->n != r || e->n != r || st->n != r)
    return op_error(n, d, "starts, ends, steps have %d, %d, %d entries; input 0 has shape %s "
                          "(rank %d)", b->n, e->n, st->n, shape_format(&in[0], s, sizeof s), r);
  Shape o = in[0];
  for (int i = 0; i < r; i++) {
    int rc = slice_check_dim(n, i, in[0].d[i], b->i[i], e->i[i], st->i[i], d);
    if (rc) return rc;
    o.d[i] = slice_count(b->i[i], e->i[i], st->i[i]);
  }
  out[0] = o;
  return TEQ_OK;
}

static int slice_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc || tensor_numel(out[0]) == 0) return rc;
  const Params *p = &n->params;
  int r = in[0]->shape.ndim;
  int64_t ist[TEQ_MAX_DIMS], base = 0;
  shape_strides(&in[0]->shape, ist);
  Box b = {.nd = r};
  for (int i = 0; i < r; i++) {
    b.ext[i] = out[0]->shape.d[i];
    b.ss[i] = ist[i] * p->v[SLICE_STEPS].i[i];
    base += ist[i] * p->v[SLICE_STARTS].i[i];
  }
  box_copy(out[0]->data, (const char *)in[0]->data + base * (int64_t)es, &b, es);
  return TEQ_OK;
}

/* Contiguous when, past the last dimension it cuts, every dimension is
 * whole, and before it every kept extent is 1 (then steps do not matter
 * there); the cut dimension itself must step by 1. */
static bool slice_view(const Node *n, const Shape *in, const Tensor *const *consts, int out,
                       int64_t *first) {
  (void)consts;
  (void)out;
  const Params *p = &n->params;
  const int64_t *b = p->v[SLICE_STARTS].i, *e = p->v[SLICE_ENDS].i, *st = p->v[SLICE_STEPS].i;
  int r = in[0].ndim, cut = -1;
  if (p->v[SLICE_STARTS].n != r) return false;
  int64_t ext[TEQ_MAX_DIMS], strides[TEQ_MAX_DIMS], at = 0;
  for (int i = 0; i < r; i++) {
    ext[i] = slice_count(b[i], e[i], st[i]);
    if (ext[i] == 0) return false;
    if (ext[i] != in[0].d[i]) cut = i;
  }
  shape_strides(&in[0], strides);
  for (int i = 0; i < r; i++) {
    if (i > cut && (b[i] != 0 || st[i] != 1)) return false; /* whole, in order */
    if (i < cut && ext[i] != 1) return false;
    if (i == cut && st[i] != 1 && ext[i] > 1) return false;
    at += b[i] * strides[i];
  }
  *first = at;
  return true;
}

/* ONNX's clamping of one dimension's start and end (Slice-13 spec). */
static void slice_clamp(int64_t len, int64_t step, int64_t *start, int64_t *end) {
  int64_t b = *start < 0 ? *start + len : *start, e = *end < 0 ? *end + len : *end;
  int64_t end_lo = step > 0 ? 0 : -1, hi = step > 0 ? len : len - 1;
  if (b < 0) b = 0;
  if (b > hi) b = hi; /* -1 only for an empty dimension with a negative step */
  if (e < end_lo) e = end_lo;
  if (e > hi) e = hi;
  *start = b;
  *end = e;
}

/* Starts, ends, axes and steps: attributes before opset 10, inputs 1-4 after. */
static int slice_read_lists(OnnxNodeIn *v, int64_t (*l)[LIST_MAX], int *k, bool *has, Diag *d) {
  static const char *const names[] = {"starts", "ends", "axes", "steps"};
  int rc = TEQ_OK;
  for (int j = 0; j < 4 && !rc; j++)
    rc = onnx_read_list(v, names[j], 10, j + 1, l[j], &k[j], &has[j], d);
  if (rc) return rc;
  if (!has[0] || !has[1]) return onnx_in_error(v, d, "starts and ends are required");
  if (k[1] != k[0] || (has[2] && k[2] != k[0]) || (has[3] && k[3] != k[0]))
    return onnx_in_error(v, d, "starts, ends, axes, steps differ in length (%d, %d, %d, %d)", k[0],
                         k[1], has[2] ? k[2] : k[0], has[3] ? k[3] : k[0]);
  return TEQ_OK;
}

static int slice_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const Shape *x = NULL;
  int64_t l[4][LIST_MAX], b[TEQ_MAX_DIMS], e[TEQ_MAX_DIMS], st[TEQ_MAX_DIMS];
  int k[4] = {0};
  bool has[4], mask[TEQ_MAX_DIMS];
  int rc = onnx_input_rank(v, 0, &x, d);
  if (!rc) rc = slice_read_lists(v, l, k, has, d);
  if (rc) return rc;
  for (int j = 0; j < k[0]; j++) l[2][j] = has[2] ? l[2][j] : j;
  if ((rc = axes_mask(v, l[2], k[0], x->ndim, mask, d))) return rc;
  for (int i = 0; i < x->ndim; i++) b[i] = 0, e[i] = x->d[i], st[i] = 1;
  for (int j = 0; j < k[0]; j++) {
    int64_t a = l[2][j] < 0 ? l[2][j] + x->ndim : l[2][j];
    st[a] = has[3] ? l[3][j] : 1;
    if (st[a] == 0) return onnx_in_error(v, d, "steps[%d] is 0", j);
    b[a] = l[0][j];
    e[a] = l[1][j];
    slice_clamp(x->d[a], st[a], &b[a], &e[a]);
  }
  param_set_ints(p, SLICE_STARTS, b, x->ndim);
  param_set_ints(p, SLICE_ENDS, e, x->ndim);
  param_set_ints(p, SLICE_STEPS, st, x->ndim);
  return TEQ_OK;
}

/* Every dimension explicitly. A stored -1 (before index 0, for a negative
 * step) is written as INT64_MIN, which ONNX clamps back to it. */
static int slice_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  const Params *p = &n->params;
  int r = p->v[SLICE_STARTS].n;
  int64_t b[TEQ_MAX_DIMS], e[TEQ_MAX_DIMS], axes[TEQ_MAX_DIMS];
  for (int i = 0; i < r; i++) {
    b[i] = p->v[SLICE_STARTS].i[i] < 0 ? INT64_MIN : p->v[SLICE_STARTS].i[i];
    e[i] = p->v[SLICE_ENDS].i[i] < 0 ? INT64_MIN : p->v[SLICE_ENDS].i[i];
    axes[i] = i;
  }
  int rc = add_ints_input(w, b, r, d);
  if (!rc) rc = add_ints_input(w, e, r, d);
  if (!rc) rc = add_ints_input(w, axes, r, d);
  if (!rc) rc = add_ints_input(w, p->v[SLICE_STEPS].i, r, d);
  return rc;
}

/* Axis i steps steps[i] of input axis i from starts[i]: MaxViT's Q, K
 * and V cut from the last axis of one product, read by the next products
 * through the whole row's stride. Backwards steps are left to the kernel:
 * no reader takes a negative stride. */
static bool slice_strided(const Node *n, const Shape *in, const int64_t *from, int64_t *to,
                          int64_t *first) {
  const Params *p = &n->params;
  int r = in[0].ndim;
  if (p->v[SLICE_STARTS].n != r) return false;
  *first = 0;
  for (int i = 0; i < r; i++) {
    int64_t step = p->v[SLICE_STEPS].i[i];
    if (step < 0 && slice_count(p->v[SLICE_STARTS].i[i], p->v[SLICE_ENDS].i[i], step) > 1)
      return false;
    to[i] = from[i] * step;
    *first += from[i] * p->v[SLICE_STARTS].i[i];
  }
  return true;
}

const OpDef op_def_slice = {
  .kind = OP_SLICE, .name = "slice", .onnx_op = "Slice",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = slice_params, .n_params = 3,
  .flags = OPF_LAYOUT_ONLY | OPF_NO_COPIES | OPF_MULTILINEAR,
  .infer_shape = slice_infer, .eval_f32 = slice_eval, .eval_modp = slice_eval,
  .view = slice_view, .strided = slice_strided,
  .onnx_read = slice_onnx_read, .onnx_write = slice_onnx_write,
  .eval_cuda = CUDA_EVAL(slice),
};

/* ---- gather ---- */

static const OpParam gather_params[] = {
  {.name = "axis", .type = PARAM_INT, .lo = 0, .hi = TEQ_MAX_DIMS - 1},
};

static int gather_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  int64_t axis = param_int(&n->params, 0);
  int r = in[0].ndim, q = in[1].ndim;
  char s[SHAPE_STR_MAX], t[SHAPE_STR_MAX];
  if (axis >= r)
    return op_error(n, d, "axis=%lld: input 0 has shape %s (rank %d)", (long long)axis,
                    shape_format(&in[0], s, sizeof s), r);
  if (r - 1 + q > TEQ_MAX_DIMS)
    return op_error(n, d, "data %s and indices %s give rank %d, above %d",
                    shape_format(&in[0], s, sizeof s), shape_format(&in[1], t, sizeof t),
                    r - 1 + q, TEQ_MAX_DIMS);
  int64_t dims[TEQ_MAX_DIMS];
  int k = 0;
  for (int i = 0; i < axis; i++) dims[k++] = in[0].d[i];
  for (int i = 0; i < q; i++) dims[k++] = in[1].d[i];
  for (int i = (int)axis + 1; i < r; i++) dims[k++] = in[0].d[i];
  out[0] = shape_make(k, dims);
  return TEQ_OK;
}

/* Indices are int64 as ONNX has them; a float32 or Z_p index tensor (a
 * graph input fed in the mode's dtype) is accepted if its values are
 * integers. Negative indices count from the end. */
static int gather_indices(const Node *n, const Tensor *t, int64_t len, int64_t *idx, Diag *d) {
  int64_t count = tensor_numel(t);
  for (int64_t j = 0; j < count; j++) {
    int64_t x;
    if (t->dtype == DT_I64) x = ((const int64_t *)t->data)[j];
    else if (t->dtype == DT_MODP) x = modp_to_int(((const uint32_t *)t->data)[j]);
    else {
      float f = ((const float *)t->data)[j];
      if (!(f > -0x1p62f && f < 0x1p62f) || f != (float)(int64_t)f)
        return op_error(n, d, "indices[%lld]=%g is not an integer", (long long)j, (double)f);
      x = (int64_t)f;
    }
    if (x < -len || x >= len)
      return op_error(n, d, "indices[%lld]=%lld out of range [%lld, %lld)", (long long)j,
                      (long long)x, (long long)-len, (long long)len);
    idx[j] = x < 0 ? x + len : x;
  }
  return TEQ_OK;
}

static int gather_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  int axis = (int)param_int(&n->params, 0);
  const Shape *x = &in[0]->shape;
  int64_t outer = prod_dims(x, 0, axis), len = x->d[axis], inner = prod_dims(x, axis + 1, x->ndim);
  int64_t count = tensor_numel(in[1]);
  int64_t *idx = malloc((size_t)(count + 1) * sizeof *idx);
  if (!idx) {
    op_error(n, d, "out of memory");
    return TEQ_ERR_NOMEM;
  }
  rc = gather_indices(n, in[1], len, idx, d);
  size_t row = (size_t)inner * es;
  char *dst = out[0]->data;
  for (int64_t o = 0; !rc && o < outer; o++)
    for (int64_t j = 0; j < count; j++, dst += row)
      memcpy(dst, (const char *)in[0]->data + (size_t)(o * len + idx[j]) * row, row);
  free(idx);
  return rc;
}

/* One constant index: a scalar, as PyTorch's select exports, or of shape
 * [1] (Q, K and V out of attention's packed projection, ViT's class token).
 * With nothing but extent-1 dimensions before its axis, it takes one block
 * of the data (gather_view). */
bool op_gather_one(const Node *n, const Shape *data, const Tensor *indices, int64_t *axis,
                   int64_t *k) {
  if (n->kind != OP_GATHER || !indices || indices->dtype != DT_I64 || tensor_numel(indices) != 1)
    return false;
  *axis = param_int(&n->params, 0);
  if (*axis >= data->ndim) return false;
  int64_t len = data->d[*axis];
  *k = ((const int64_t *)indices->data)[0];
  if (*k < 0) *k += len;
  return *k >= 0 && *k < len;
}

static bool gather_view(const Node *n, const Shape *in, const Tensor *const *consts, int out,
                        int64_t *first) {
  (void)out;
  int64_t axis, k;
  if (!consts || !op_gather_one(n, &in[0], consts[1], &axis, &k) ||
      prod_dims(&in[0], 0, (int)axis) != 1)
    return false;
  *first = k * prod_dims(&in[0], (int)axis + 1, in[0].ndim);
  return true;
}

static int gather_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  int64_t axis = 0;
  int rc = onnx_read_axis(v, "axis", 0, &axis, d);
  if (!rc) param_set_int(p, 0, axis);
  return rc;
}

/* Linear in the data (input 0); the indices only choose positions. */
const OpDef op_def_gather = {
  .kind = OP_GATHER, .name = "gather", .onnx_op = "Gather",
  .n_in_min = 2, .n_in_max = 2, .n_out_min = 1, .n_out_max = 1,
  .params = gather_params, .n_params = 1,
  .flags = OPF_LAYOUT_ONLY | OPF_MULTILINEAR,
  .infer_shape = gather_infer, .eval_f32 = gather_eval, .eval_modp = gather_eval,
  .onnx_read = gather_onnx_read, .onnx_write = write_axis, .view = gather_view,
  .eval_cuda = CUDA_EVAL(gather),
};

/* ---- depth_to_space and space_to_depth ---- */

enum { D2S_BLOCKSIZE, D2S_MODE };
enum { D2S_DCR, D2S_CRD };
static const char *const d2s_modes[] = {"DCR", "CRD", NULL};

static const OpParam depth_to_space_params[] = {
  [D2S_BLOCKSIZE] = {.name = "blocksize", .type = PARAM_INT, .def = 1, .lo = 1, .hi = 1 << 20,
                     .onnx_attr = "blocksize"},
  [D2S_MODE] = {.name = "mode", .type = PARAM_INT, .lo = 0, .hi = 1, .symbols = d2s_modes},
};

static const OpParam space_to_depth_params[] = {
  {.name = "blocksize", .type = PARAM_INT, .def = 1, .lo = 1, .hi = 1 << 20,
   .onnx_attr = "blocksize"},
};

/* Both move blocks between the channels and the 2-D plane of an NCHW input. */
static int block_check_rank(const Node *n, const Shape *x, Diag *d) {
  char s[SHAPE_STR_MAX];
  if (x->ndim != 4)
    return op_error(n, d, "input 0 has shape %s: rank 4 (N, C, H, W) expected",
                    shape_format(x, s, sizeof s));
  return TEQ_OK;
}

static int depth_to_space_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  int64_t b = param_int(&n->params, D2S_BLOCKSIZE);
  char s[SHAPE_STR_MAX];
  int rc = block_check_rank(n, &in[0], d);
  if (rc) return rc;
  if (in[0].d[1] % (b * b))
    return op_error(n, d, "blocksize=%lld: input 0 has shape %s, channels not divisible by %lld",
                    (long long)b, shape_format(&in[0], s, sizeof s), (long long)(b * b));
  if (in[0].d[2] > DIM_MAX / b || in[0].d[3] > DIM_MAX / b)
    return op_error(n, d, "blocksize=%lld: the output grows past 2^40", (long long)b);
  int64_t dims[4] = {in[0].d[0], in[0].d[1] / (b * b), in[0].d[2] * b, in[0].d[3] * b};
  out[0] = shape_make(4, dims);
  return TEQ_OK;
}

static int space_to_depth_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  int64_t b = param_int(&n->params, 0);
  char s[SHAPE_STR_MAX];
  int rc = block_check_rank(n, &in[0], d);
  if (rc) return rc;
  if (in[0].d[2] % b || in[0].d[3] % b)
    return op_error(n, d, "blocksize=%lld: input 0 has shape %s, height and width not "
                    "divisible by it", (long long)b, shape_format(&in[0], s, sizeof s));
  int64_t dims[4] = {in[0].d[0], in[0].d[1] * b * b, in[0].d[2] / b, in[0].d[3] / b};
  out[0] = shape_make(4, dims);
  return TEQ_OK;
}

/* The output [N, C/b^2, H*b, W*b] is written as [N, C/b^2, H, b, W, b]:
 * output (n, c, h, i, w, j) is input channel (i b + j) C/b^2 + c in DCR
 * mode, c b^2 + i b + j in CRD mode, at row h and column w. */
static int depth_to_space_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  const Shape *x = &in[0]->shape;
  int64_t b = param_int(&n->params, D2S_BLOCKSIZE), c = x->d[1] / (b * b), st[TEQ_MAX_DIMS];
  shape_strides(x, st);
  bool dcr = param_int(&n->params, D2S_MODE) == D2S_DCR;
  Box box = {.nd = 6,
             .ext = {x->d[0], c, x->d[2], b, x->d[3], b},
             .ss = {st[0], dcr ? st[1] : b * b * st[1], st[2], dcr ? b * c * st[1] : b * st[1],
                    st[3], dcr ? c * st[1] : st[1]}};
  box_copy(out[0]->data, in[0]->data, &box, es);
  return TEQ_OK;
}

/* The output [N, C b^2, H/b, W/b] is written as [N, b, b, C, H/b, W/b]:
 * output (n, i, j, c, h, w) is input (n, c, h b + i, w b + j). */
static int space_to_depth_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  const Shape *x = &in[0]->shape;
  int64_t b = param_int(&n->params, 0), st[TEQ_MAX_DIMS];
  shape_strides(x, st);
  Box box = {.nd = 6,
             .ext = {x->d[0], b, b, x->d[1], x->d[2] / b, x->d[3] / b},
             .ss = {st[0], st[2], st[3], st[1], b * st[2], b * st[3]}};
  box_copy(out[0]->data, in[0]->data, &box, es);
  return TEQ_OK;
}

static int block_read_size(OnnxNodeIn *v, Diag *d) {
  int64_t b;
  if (!onnx_in_attr_int(v, "blocksize", &b))
    return onnx_in_error(v, d, "attribute blocksize is missing");
  return TEQ_OK;
}

static int depth_to_space_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const char *mode = "DCR";
  int rc = block_read_size(v, d);
  if (rc) return rc;
  onnx_in_attr_string(v, "mode", &mode);
  for (int m = 0; d2s_modes[m]; m++)
    if (strcmp(mode, d2s_modes[m]) == 0) {
      param_set_int(p, D2S_MODE, m);
      return TEQ_OK;
    }
  return onnx_in_error(v, d, "attribute mode='%s': must be DCR or CRD", mode);
}

static int depth_to_space_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)d;
  if (param_int(&n->params, D2S_MODE) == D2S_CRD) onnx_out_attr_string(w, "mode", "CRD");
  return TEQ_OK;
}

static int space_to_depth_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  (void)p;
  return block_read_size(v, d);
}

const OpDef op_def_depth_to_space = {
  .kind = OP_DEPTH_TO_SPACE, .name = "depth_to_space", .onnx_op = "DepthToSpace",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = depth_to_space_params, .n_params = 2,
  .flags = OPF_LAYOUT_ONLY | OPF_NO_COPIES | OPF_MULTILINEAR,
  .infer_shape = depth_to_space_infer, .eval_f32 = depth_to_space_eval,
  .eval_modp = depth_to_space_eval,
  .onnx_read = depth_to_space_onnx_read, .onnx_write = depth_to_space_onnx_write,
  .eval_cuda = CUDA_EVAL(depth_to_space),
};

const OpDef op_def_space_to_depth = {
  .kind = OP_SPACE_TO_DEPTH, .name = "space_to_depth", .onnx_op = "SpaceToDepth",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = space_to_depth_params, .n_params = 1,
  .flags = OPF_LAYOUT_ONLY | OPF_NO_COPIES | OPF_MULTILINEAR,
  .infer_shape = space_to_depth_infer, .eval_f32 = space_to_depth_eval,
  .eval_modp = space_to_depth_eval,
  .onnx_read = space_to_depth_onnx_read,
  .eval_cuda = CUDA_EVAL(space_to_depth),
};

/* ---- tile ---- */

static const OpParam tile_params[] = {
  {.name = "repeats", .type = PARAM_INTS, .lo = 0, .hi = DIM_MAX},
};

static int tile_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  const ParamValue *r = &n->params.v[0];
  char s[SHAPE_STR_MAX];
  if (r->n != in[0].ndim)
    return op_error(n, d, "repeats has %d entries but input 0 has shape %s (rank %d)", r->n,
                    shape_format(&in[0], s, sizeof s), in[0].ndim);
  Shape o = in[0];
  for (int i = 0; i < o.ndim; i++) {
    if (r->i[i] && o.d[i] > DIM_MAX / r->i[i])
      return op_error(n, d, "repeats[%d]=%lld: dimension %d grows past 2^40", i,
                      (long long)r->i[i], i);
    o.d[i] *= r->i[i];
  }
  out[0] = o;
  return TEQ_OK;
}

/* Each output dimension of extent r d is written as [r, d]: the copy, read
 * with stride 0, then the place in it. */
static int tile_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  const Shape *x = &in[0]->shape;
  int64_t st[TEQ_MAX_DIMS];
  shape_strides(x, st);
  Box b = {.nd = 2 * x->ndim};
  for (int i = 0; i < x->ndim; i++) {
    b.ext[2 * i] = n->params.v[0].i[i];
    b.ext[2 * i + 1] = x->d[i];
    b.ss[2 * i + 1] = st[i];
  }
  box_copy(out[0]->data, in[0]->data, &b, es);
  return TEQ_OK;
}

static int tile_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  int64_t r[LIST_MAX];
  int k = 0;
  if (onnx_in_opset(v) < 6)
    return onnx_in_unsupported(v, d, "opset %d Tile (tiles and axis inputs)", onnx_in_opset(v));
  int rc = onnx_const_ints(v, 1, "repeats", r, &k, d);
  if (rc) return rc;
  if (k > TEQ_MAX_DIMS) return onnx_in_unsupported(v, d, "%d repeats, at most %d", k, TEQ_MAX_DIMS);
  for (int i = 0; i < k; i++)
    if (r[i] < 0) return onnx_in_error(v, d, "repeats[%d]=%lld is negative", i, (long long)r[i]);
  param_set_ints(p, 0, r, k);
  return TEQ_OK;
}

static int tile_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  return add_ints_input(w, n->params.v[0].i, n->params.v[0].n, d);
}

const OpDef op_def_tile = {
  .kind = OP_TILE, .name = "tile", .onnx_op = "Tile",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = tile_params, .n_params = 1,
  .flags = OPF_LAYOUT_ONLY | OPF_MULTILINEAR,
  .infer_shape = tile_infer, .eval_f32 = tile_eval, .eval_modp = tile_eval,
  .onnx_read = tile_onnx_read, .onnx_write = tile_onnx_write,
  .eval_cuda = CUDA_EVAL(tile),
};

/* ---- expand ---- */

/* The target shape, broadcast with the input's (ONNX Expand): import
 * stores the resulting output shape when the input's is known, so equal
 * expansions have equal parameters. */
static const OpParam expand_params[] = {
  {.name = "shape", .type = PARAM_INTS, .lo = 0, .hi = DIM_MAX},
};

static int expand_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  const ParamValue *p = &n->params.v[0];
  char s[SHAPE_STR_MAX], t[SHAPE_STR_MAX];
  if (p->n > TEQ_MAX_DIMS)
    return op_error(n, d, "shape has %d dims, at most %d", p->n, TEQ_MAX_DIMS);
  Shape want = shape_make(p->n, p->i);
  if (shape_broadcast(&in[0], &want, out, NULL) != TEQ_OK)
    return op_error(n, d, "shape=%s: input 0 has shape %s, which does not broadcast to it",
                    shape_format(&want, t, sizeof t), shape_format(&in[0], s, sizeof s));
  int64_t count = 1; /* checked: the target's extents are each up to 2^40 */
  for (int i = 0; i < out->ndim; i++) {
    if (out->d[i] && count > DIM_MAX / out->d[i])
      return op_error(n, d, "shape has more than 2^40 elements");
    count *= out->d[i];
  }
  return TEQ_OK;
}

/* Dimensions the input lacks or has as 1 are read with stride 0. */
static int expand_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  const Shape *x = &in[0]->shape, *o = &out[0]->shape;
  int64_t st[TEQ_MAX_DIMS];
  shape_strides(x, st);
  Box b = {.nd = o->ndim};
  for (int i = 0; i < o->ndim; i++) {
    int k = i - (o->ndim - x->ndim);
    b.ext[i] = o->d[i];
    b.ss[i] = k < 0 || x->d[k] == 1 ? 0 : st[k];
  }
  box_copy(out[0]->data, in[0]->data, &b, es);
  return TEQ_OK;
}

static int expand_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  int64_t want[LIST_MAX];
  int k = 0;
  int rc = onnx_const_ints(v, 1, "shape", want, &k, d);
  if (rc) return rc;
  if (k > TEQ_MAX_DIMS)
    return onnx_in_unsupported(v, d, "target rank %d above %d", k, TEQ_MAX_DIMS);
  for (int i = 0; i < k; i++)
    if (want[i] < 0 || want[i] > DIM_MAX)
      return onnx_in_error(v, d, "shape[%d]=%lld is invalid", i, (long long)want[i]);
  const Shape *x = onnx_in_input_shape(v, 0);
  Shape w = shape_make(k, want), o;
  if (x && shape_is_known(x)) {
    if (shape_broadcast(x, &w, &o, NULL) != TEQ_OK) {
      char s[SHAPE_STR_MAX], t[SHAPE_STR_MAX];
      return onnx_in_error(v, d, "input 0 has shape %s, which does not broadcast to %s",
                           shape_format(x, s, sizeof s), shape_format(&w, t, sizeof t));
    }
    w = o;
  }
  param_set_ints(p, 0, w.d, w.ndim);
  return TEQ_OK;
}

static int expand_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  return add_ints_input(w, n->params.v[0].i, n->params.v[0].n, d);
}

const OpDef op_def_expand = {
  .kind = OP_EXPAND, .name = "expand", .onnx_op = "Expand",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = expand_params, .n_params = 1,
  .flags = OPF_LAYOUT_ONLY | OPF_MULTILINEAR,
  .infer_shape = expand_infer, .eval_f32 = expand_eval, .eval_modp = expand_eval,
  .onnx_read = expand_onnx_read, .onnx_write = expand_onnx_write,
  .eval_cuda = CUDA_EVAL(expand),
};
