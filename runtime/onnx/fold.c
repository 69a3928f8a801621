/* fold.c: evaluating ONNX's shape bookkeeping at import.
 * Exporters compute reshape targets at run time (Shape -> Gather ->
 * Unsqueeze -> Concat -> Reshape); once input shapes are fixed, all of it is
 * constant. The int64 operators such subgraphs use are evaluated here,
 * directly on ONNX semantics, because they are not operators of the tensor
 * program: after import no graph contains them. Data-movement operators
 * (Gather, Concat, Slice, Reshape, ...) work on any element type; arithmetic
 * works on int64 only and declines float32, which import.c folds through
 * the registry's own kernels instead, so float results never depend on a
 * second implementation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/onnx/onnx_int.h"

#define ELEM(x) ONNX__TENSOR_PROTO__DATA_TYPE__##x
#define MAX_RANGE (INT64_C(1) << 28) /* a Range longer than this is not bookkeeping */

typedef int (*FoldFn)(OnnxNodeIn *v, Tensor **out, Diag *d);

/* ---- helpers ---- */

static const Tensor *arg(OnnxNodeIn *v, int i) { return onnx_in_const_input(v, i); }

static int need(OnnxNodeIn *v, int i, const Tensor **t, Diag *d) {
  *t = arg(v, i);
  if (!*t) return onnx_in_error(v, d, "input %d is missing", i);
  return TEQ_OK;
}

/* This machine's memory in bytes; 0 where the system does not say. */
static double machine_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? (double)pages * (double)page : 0;
}

static int new_tensor(OnnxNodeIn *v, DType dt, const Shape *s, Tensor **out, Diag *d) {
  if (s->ndim > TEQ_MAX_DIMS)
    return onnx_in_unsupported(v, d, "result of rank %d, at most %d", s->ndim, TEQ_MAX_DIMS);
  char why[SHAPE_MSG_MAX];
  if (!shape_fits(s, dt))
    return onnx_in_error(v, d, "result: %s", shape_too_large(s, dt, why, sizeof why));
  /* Under shape_fits's 2^40 bytes, a result can still exceed the machine:
   * said so here, rather than as an allocation failing (or, under ASan,
   * aborting) on the way. */
  double bytes = (double)shape_numel(s) * (double)dtype_size(dt), memory = machine_memory();
  if (memory > 0 && bytes > memory)
    return onnx_in_error(v, d, "result %s takes %.0f GB, more than this machine's %.0f GB of "
                         "memory", shape_format(s, why, sizeof why), bytes / 1e9, memory / 1e9);
  *out = tensor_new(dt, s);
  if (!*out) {
    onnx_in_error(v, d, "out of memory for the folded result");
    return TEQ_ERR_NOMEM;
  }
  return TEQ_OK;
}

static int64_t elem_i(const Tensor *t, int64_t k) {
  return t->dtype == DT_I64 ? ((const int64_t *)t->data)[k] : (int64_t)((const float *)t->data)[k];
}

static double elem_f(const Tensor *t, int64_t k) {
  return t->dtype == DT_I64 ? (double)((const int64_t *)t->data)[k] : ((const float *)t->data)[k];
}

/* Input i as a list of at most max integers (a 0-d or 1-d int64 tensor). */
static int read_ints(OnnxNodeIn *v, int i, int64_t *out, int max, int *n, Diag *d) {
  const Tensor *t;
  int rc = need(v, i, &t, d);
  if (rc != TEQ_OK) return rc;
  if (t->dtype != DT_I64 || t->shape.ndim > 1)
    return onnx_in_error(v, d, "input %d must be a 1-d int64 tensor", i);
  int64_t cnt = tensor_numel(t);
  if (cnt > max)
    return onnx_in_unsupported(v, d, "input %d has %lld values, at most %d", i, (long long)cnt,
                               max);
  memcpy(out, t->data, (size_t)cnt * sizeof *out);
  *n = (int)cnt;
  return TEQ_OK;
}

/* Axes of a reduction or (un)squeeze: an attribute before opset `since`,
 * the optional input `in` from then on. */
static int read_axes(OnnxNodeIn *v, int in, int since, int64_t *axes, int *n, Diag *d) {
  *n = 0;
  if (onnx_in_opset(v) < since) {
    onnx_in_attr_ints(v, "axes", axes, TEQ_MAX_DIMS + 2, n);
    return v->failed ? TEQ_ERR_INPUT : TEQ_OK;
  }
  if (!onnx_in_has_input(v, in)) return TEQ_OK;
  return read_ints(v, in, axes, TEQ_MAX_DIMS + 2, n, d);
}

static int norm_axis(OnnxNodeIn *v, int64_t *axis, int rank, Diag *d) {
  if (*axis < -rank || *axis >= rank)
    return onnx_in_error(v, d, "axis %lld out of range for rank %d", (long long)*axis, rank);
  if (*axis < 0) *axis += rank;
  return TEQ_OK;
}

/* Offset in a tensor of shape s, broadcast (right-aligned) to out, of out's
 * element k. */
static int64_t bcast_offset(const Shape *out, const Shape *s, int64_t k) {
  int64_t off = 0, stride = 1;
  for (int i = out->ndim - 1; i >= 0; i--) {
    int64_t idx = k % out->d[i];
    k /= out->d[i];
    int j = i - (out->ndim - s->ndim);
    if (j < 0) break;
    if (s->d[j] != 1) off += idx * stride;
    stride *= s->d[j];
  }
  return off;
}

static int broadcast(OnnxNodeIn *v, const Shape *a, const Shape *b, Shape *out, Diag *d) {
  if (shape_broadcast(a, b, out, NULL) == TEQ_OK) return TEQ_OK;
  char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
  return onnx_in_error(v, d, "shapes %s and %s do not broadcast", shape_format(a, sa, sizeof sa),
                       shape_format(b, sb, sizeof sb));
}

/* A tensor with t's elements and shape s (same count). */
static int reshaped(OnnxNodeIn *v, const Tensor *t, const Shape *s, Tensor **out, Diag *d) {
  int rc = new_tensor(v, t->dtype, s, out, d);
  if (rc == TEQ_OK) memcpy((*out)->data, t->data, tensor_bytes(t));
  return rc;
}

/* Product of dims [from, to). */
static int64_t dims_product(const Shape *s, int from, int to) {
  int64_t n = 1;
  for (int i = from; i < to; i++) n *= s->d[i];
  return n;
}

/* ---- sources ---- */

static int fold_shape(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Shape *s = onnx_in_input_shape(v, 0);
  if (!s) return ONNX_FOLD_DECLINED;
  int64_t start = 0, end = s->ndim;
  onnx_in_attr_int(v, "start", &start);
  onnx_in_attr_int(v, "end", &end);
  if (start < 0) start += s->ndim;
  if (end < 0) end += s->ndim;
  start = start < 0 ? 0 : start > s->ndim ? s->ndim : start;
  end = end < start ? start : end > s->ndim ? s->ndim : end;
  Shape os = shape_of(1, (int)(end - start));
  int rc = new_tensor(v, DT_I64, &os, out, d);
  if (rc == TEQ_OK) memcpy((*out)->data, s->d + start, (size_t)(end - start) * sizeof(int64_t));
  return rc;
}

static int fold_size(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Shape *s = onnx_in_input_shape(v, 0);
  if (!s) return ONNX_FOLD_DECLINED;
  Shape os = shape_of(0);
  int rc = new_tensor(v, DT_I64, &os, out, d);
  if (rc == TEQ_OK) ((int64_t *)(*out)->data)[0] = shape_numel(s);
  return rc;
}

static int scalar_list(OnnxNodeIn *v, DType dt, const void *vals, int n, bool vector,
                       Tensor **out, Diag *d) {
  Shape s = vector ? shape_of(1, n) : shape_of(0);
  int rc = new_tensor(v, dt, &s, out, d);
  for (int k = 0; rc == TEQ_OK && k < n; k++) {
    if (dt == DT_F32) ((float *)(*out)->data)[k] = ((const float *)vals)[k];
    else ((int64_t *)(*out)->data)[k] = ((const int64_t *)vals)[k];
  }
  return rc;
}

static int fold_constant(OnnxNodeIn *v, Tensor **out, Diag *d) {
  double f;
  int64_t i;
  const int64_t *ints;
  const float *fs;
  int n = 0;
  if (onnx_in_attr_tensor(v, "value", out)) return TEQ_OK;
  if (!v->failed && onnx_in_attr_float(v, "value_float", &f)) {
    float x = (float)f;
    return scalar_list(v, DT_F32, &x, 1, false, out, d);
  }
  if (!v->failed && onnx_in_attr_floats(v, "value_floats", &fs, &n))
    return scalar_list(v, DT_F32, fs, n, true, out, d);
  if (!v->failed && onnx_in_attr_int(v, "value_int", &i))
    return scalar_list(v, DT_I64, &i, 1, false, out, d);
  if (!v->failed && onnx_in_attr_int_list(v, "value_ints", &ints, &n))
    return scalar_list(v, DT_I64, ints, n, true, out, d);
  if (v->failed) return TEQ_ERR_INPUT;
  return onnx_in_unsupported(v, d, "a Constant needs value, value_float(s) or value_int(s)");
}

static int fold_constant_of_shape(OnnxNodeIn *v, Tensor **out, Diag *d) {
  int64_t dims[TEQ_MAX_DIMS + 1];
  int n = 0;
  int rc = read_ints(v, 0, dims, TEQ_MAX_DIMS + 1, &n, d);
  if (rc != TEQ_OK) return rc;
  for (int k = 0; k < n; k++)
    if (dims[k] < 0)
      return onnx_in_error(v, d, "shape has a negative extent %lld", (long long)dims[k]);
  Tensor *value = NULL;
  if (!onnx_in_attr_tensor(v, "value", &value) && v->failed) return TEQ_ERR_INPUT;
  if (value && tensor_numel(value) != 1) {
    tensor_unref(value);
    return onnx_in_error(v, d, "value must hold one element");
  }
  Shape s = shape_make(n, dims);
  rc = new_tensor(v, value ? value->dtype : DT_F32, &s, out, d);
  size_t es = value ? dtype_size(value->dtype) : 4;
  for (int64_t k = 0; rc == TEQ_OK && value && k < tensor_numel(*out); k++)
    memcpy((char *)(*out)->data + k * es, value->data, es);
  tensor_unref(value);
  return rc;
}

/* Values of an int64 Range, max(ceil((limit - start) / delta), 0), exact
 * where the double formula rounds: differences of int64 values fit in
 * uint64_t, and so does the magnitude of any delta. */
static uint64_t int_range_count(int64_t start, int64_t limit, int64_t delta) {
  if (delta > 0)
    return limit > start ? ((uint64_t)limit - (uint64_t)start - 1) / (uint64_t)delta + 1 : 0;
  return start > limit ? ((uint64_t)start - (uint64_t)limit - 1) / (0 - (uint64_t)delta) + 1 : 0;
}

static int fold_range(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *a[3];
  for (int i = 0; i < 3; i++) {
    int rc = need(v, i, &a[i], d);
    if (rc != TEQ_OK) return rc;
    if (tensor_numel(a[i]) != 1) return onnx_in_error(v, d, "input %d must be a scalar", i);
  }
  bool ints = a[0]->dtype == DT_I64 && a[1]->dtype == DT_I64 && a[2]->dtype == DT_I64;
  double start = elem_f(a[0], 0), limit = elem_f(a[1], 0), delta = elem_f(a[2], 0);
  if (delta == 0) return onnx_in_error(v, d, "delta is 0");
  double cnt = ceil((limit - start) / delta);
  if (ints) cnt = (double)int_range_count(elem_i(a[0], 0), elem_i(a[1], 0), elem_i(a[2], 0));
  if (cnt > (double)MAX_RANGE) return onnx_in_unsupported(v, d, "a range of %.0f values", cnt);
  Shape s = shape_of(1, cnt > 0 ? (int)cnt : 0);
  int rc = new_tensor(v, ints ? DT_I64 : DT_F32, &s, out, d);
  /* Every value lies between start and limit, so it fits in int64, and the
   * wrapping unsigned sum is exactly it. */
  uint64_t first = (uint64_t)elem_i(a[0], 0), step = (uint64_t)elem_i(a[2], 0);
  for (int64_t k = 0; rc == TEQ_OK && k < s.d[0]; k++) {
    if (ints) ((int64_t *)(*out)->data)[k] = (int64_t)(first + (uint64_t)k * step);
    else ((float *)(*out)->data)[k] = (float)(start + (double)k * delta);
  }
  return rc;
}

/* ---- data movement, any element type ---- */

static int fold_identity(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *t;
  int rc = need(v, 0, &t, d);
  if (rc == TEQ_OK) *out = tensor_ref((Tensor *)t);
  return rc;
}

static int fold_cast(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *t;
  int64_t to;
  int rc = need(v, 0, &t, d);
  if (rc != TEQ_OK) return rc;
  if (!onnx_in_attr_int(v, "to", &to))
    return v->failed ? TEQ_ERR_INPUT : onnx_in_error(v, d, "attribute 'to' is missing");
  DType dt;
  if (!onnx_elem_dtype((int32_t)to, &dt))
    return onnx_in_unsupported(v, d, "cast to %s", onnx_elem_name((int32_t)to));
  rc = new_tensor(v, dt, &t->shape, out, d);
  for (int64_t k = 0; rc == TEQ_OK && k < tensor_numel(t); k++) {
    if (dt == DT_F32) ((float *)(*out)->data)[k] = (float)elem_f(t, k);
    else if (to == ELEM(BOOL)) ((int64_t *)(*out)->data)[k] = elem_f(t, k) != 0;
    else ((int64_t *)(*out)->data)[k] = elem_i(t, k);
  }
  return rc;
}

static int fold_reshape(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *t;
  int64_t dims[TEQ_MAX_DIMS + 1], allowzero = 0;
  int n = 0, rc = need(v, 0, &t, d);
  if (rc != TEQ_OK) return rc;
  if (onnx_in_opset(v) < 5) {
    if (!onnx_in_attr_ints(v, "shape", dims, TEQ_MAX_DIMS + 1, &n))
      return v->failed ? TEQ_ERR_INPUT : onnx_in_error(v, d, "attribute 'shape' is missing");
  } else if ((rc = read_ints(v, 1, dims, TEQ_MAX_DIMS + 1, &n, d)) != TEQ_OK) {
    return rc;
  }
  onnx_in_attr_int(v, "allowzero", &allowzero);
  if (n > TEQ_MAX_DIMS) return onnx_in_unsupported(v, d, "result of rank %d", n);
  int infer = -1;
  /* known: the product of the given extents; nonzero: of those other than
   * 0, held to TEQ_BYTES_MAX so that neither overflows */
  int64_t known = 1, nonzero = 1, total = tensor_numel(t);
  for (int k = 0; k < n; k++) {
    if (dims[k] == 0 && !allowzero) {
      if (k >= t->shape.ndim)
        return onnx_in_error(v, d, "shape[%d] = 0 copies a missing dimension", k);
      dims[k] = t->shape.d[k];
    }
    if (dims[k] == -1 && infer < 0) {
      infer = k;
      continue;
    }
    if (dims[k] < 0) return onnx_in_error(v, d, "shape[%d] = %lld", k, (long long)dims[k]);
    if (dims[k] && nonzero > TEQ_BYTES_MAX / dims[k])
      return onnx_in_error(v, d, "shape[%d] = %lld: the extents multiply to more than 2^40", k,
                           (long long)dims[k]);
    nonzero *= dims[k] ? dims[k] : 1;
    known = dims[k] ? known * dims[k] : 0;
  }
  if (infer >= 0) { /* as the registry's Reshape says it */
    if (known == 0 || total % known)
      return onnx_in_error(v, d, "shape[%d] = -1 cannot be inferred from %lld elements", infer,
                           (long long)total);
    dims[infer] = total / known;
  }
  Shape s = shape_make(n, dims);
  if (shape_numel(&s) != total)
    return onnx_in_error(v, d, "cannot reshape %lld elements to that shape", (long long)total);
  return reshaped(v, t, &s, out, d);
}

static int fold_unsqueeze(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *t;
  int64_t axes[TEQ_MAX_DIMS + 2];
  int n = 0, rc = need(v, 0, &t, d);
  if (rc == TEQ_OK) rc = read_axes(v, 1, 13, axes, &n, d);
  if (rc != TEQ_OK) return rc;
  int rank = t->shape.ndim + n;
  if (rank > TEQ_MAX_DIMS) return onnx_in_unsupported(v, d, "result of rank %d", rank);
  bool is_new[TEQ_MAX_DIMS] = {false};
  for (int k = 0; k < n; k++) {
    if ((rc = norm_axis(v, &axes[k], rank, d)) != TEQ_OK) return rc;
    if (is_new[axes[k]]) return onnx_in_error(v, d, "axis %lld repeated", (long long)axes[k]);
    is_new[axes[k]] = true;
  }
  int64_t dims[TEQ_MAX_DIMS];
  for (int k = 0, j = 0; k < rank; k++) dims[k] = is_new[k] ? 1 : t->shape.d[j++];
  Shape s = shape_make(rank, dims);
  return reshaped(v, t, &s, out, d);
}

static int fold_squeeze(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *t;
  int64_t axes[TEQ_MAX_DIMS + 2];
  int n = 0, rc = need(v, 0, &t, d);
  if (rc == TEQ_OK) rc = read_axes(v, 1, 13, axes, &n, d);
  if (rc != TEQ_OK) return rc;
  bool drop[TEQ_MAX_DIMS] = {false};
  for (int k = 0; k < n; k++) {
    if ((rc = norm_axis(v, &axes[k], t->shape.ndim, d)) != TEQ_OK) return rc;
    if (t->shape.d[axes[k]] != 1)
      return onnx_in_error(v, d, "axis %lld has extent %lld, not 1", (long long)axes[k],
                           (long long)t->shape.d[axes[k]]);
    drop[axes[k]] = true;
  }
  int64_t dims[TEQ_MAX_DIMS];
  int rank = 0;
  for (int k = 0; k < t->shape.ndim; k++)
    if (!(n ? drop[k] : t->shape.d[k] == 1)) dims[rank++] = t->shape.d[k];
  Shape s = shape_make(rank, dims);
  return reshaped(v, t, &s, out, d);
}

static int fold_gather(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *t, *ix;
  int64_t axis = 0;
  int rc = need(v, 0, &t, d);
  if (rc == TEQ_OK) rc = need(v, 1, &ix, d);
  if (rc != TEQ_OK) return rc;
  onnx_in_attr_int(v, "axis", &axis);
  if ((rc = norm_axis(v, &axis, t->shape.ndim, d)) != TEQ_OK) return rc;
  if (ix->dtype != DT_I64) return onnx_in_error(v, d, "indices must be integers");
  int rank = t->shape.ndim - 1 + ix->shape.ndim;
  if (rank > TEQ_MAX_DIMS) return onnx_in_unsupported(v, d, "result of rank %d", rank);
  int64_t dims[TEQ_MAX_DIMS], len = t->shape.d[axis], n_ix = tensor_numel(ix);
  int r = 0;
  for (int k = 0; k < axis; k++) dims[r++] = t->shape.d[k];
  for (int k = 0; k < ix->shape.ndim; k++) dims[r++] = ix->shape.d[k];
  for (int k = (int)axis + 1; k < t->shape.ndim; k++) dims[r++] = t->shape.d[k];
  Shape s = shape_make(rank, dims);
  if ((rc = new_tensor(v, t->dtype, &s, out, d)) != TEQ_OK) return rc;
  size_t block =
      (size_t)dims_product(&t->shape, (int)axis + 1, t->shape.ndim) * dtype_size(t->dtype);
  int64_t outer = dims_product(&t->shape, 0, (int)axis);
  char *dst = (*out)->data;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < n_ix; j++) {
      int64_t i = ((const int64_t *)ix->data)[j];
      if (i < -len || i >= len) {
        tensor_unref(*out);
        return onnx_in_error(v, d, "index %lld out of range [%lld, %lld)", (long long)i,
                             (long long)-len, (long long)len);
      }
      if (i < 0) i += len;
      memcpy(dst, (const char *)t->data + ((size_t)(o * len + i)) * block, block);
      dst += block;
    }
  return TEQ_OK;
}

static int concat_shape(OnnxNodeIn *v, int64_t *axis, Shape *s, DType *dt, Diag *d) {
  const Tensor *first = NULL;
  for (int i = 0; i < onnx_in_n_inputs(v); i++) {
    const Tensor *t;
    int rc = need(v, i, &t, d);
    if (rc != TEQ_OK) return rc;
    if (!first) {
      first = t;
      *s = t->shape;
      *dt = t->dtype;
      if ((rc = norm_axis(v, axis, s->ndim, d)) != TEQ_OK) return rc;
      continue;
    }
    bool same = t->shape.ndim == s->ndim && t->dtype == *dt;
    for (int k = 0; same && k < s->ndim; k++) same = k == *axis || t->shape.d[k] == s->d[k];
    if (!same) return onnx_in_error(v, d, "input %d does not match input 0 in type or shape", i);
    s->d[*axis] += t->shape.d[*axis];
  }
  if (!first) return onnx_in_error(v, d, "no inputs");
  return TEQ_OK;
}

static int fold_concat(OnnxNodeIn *v, Tensor **out, Diag *d) {
  int64_t axis = 0;
  Shape s;
  DType dt = DT_F32;
  if (!onnx_in_attr_int(v, "axis", &axis))
    return v->failed ? TEQ_ERR_INPUT : onnx_in_error(v, d, "attribute 'axis' is missing");
  int rc = concat_shape(v, &axis, &s, &dt, d);
  if (rc == TEQ_OK) rc = new_tensor(v, dt, &s, out, d);
  if (rc != TEQ_OK) return rc;
  int64_t outer = dims_product(&s, 0, (int)axis);
  size_t inner = (size_t)dims_product(&s, (int)axis + 1, s.ndim) * dtype_size(dt);
  char *dst = (*out)->data;
  for (int64_t o = 0; o < outer; o++)
    for (int i = 0; i < onnx_in_n_inputs(v); i++) {
      const Tensor *t = arg(v, i);
      size_t chunk = inner * (size_t)t->shape.d[axis];
      memcpy(dst, (const char *)t->data + (size_t)o * chunk, chunk);
      dst += chunk;
    }
  return TEQ_OK;
}

/* Start and count of one sliced axis of extent dim, ONNX's clamping rules. */
static void slice_axis(int64_t dim, int64_t start, int64_t end, int64_t step, int64_t *first,
                       int64_t *count) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  /* ceil(span / |step|) as 1 + (span - 1) / |step|: no sum with the step,
   * which may be INT64_MAX, and no negation of INT64_MIN (a magnitude that
   * large steps past any extent, as INT64_MAX does). */
  if (step > 0) {
    start = start < 0 ? 0 : start > dim ? dim : start;
    end = end < 0 ? 0 : end > dim ? dim : end;
    *count = end > start ? 1 + (end - start - 1) / step : 0;
  } else {
    start = start < 0 ? 0 : start > dim - 1 ? dim - 1 : start;
    end = end < -1 ? -1 : end > dim - 1 ? dim - 1 : end;
    *count = start > end ? 1 + (start - end - 1) / (step == INT64_MIN ? INT64_MAX : -step) : 0;
  }
  *first = start;
}

static int slice_args(OnnxNodeIn *v, int64_t (*a)[TEQ_MAX_DIMS], int *n, Diag *d) {
  /* a[0] starts, a[1] ends, a[2] axes, a[3] steps */
  const char *names[3] = {"starts", "ends", "axes"};
  int cnt[4] = {0, 0, -1, -1}, rc = TEQ_OK;
  if (onnx_in_opset(v) >= 10 && (!onnx_in_has_input(v, 1) || !onnx_in_has_input(v, 2)))
    return onnx_in_error(v, d, "starts and ends are required");
  for (int k = 0; k < 4 && rc == TEQ_OK; k++) {
    if (onnx_in_opset(v) < 10) {
      if (k < 3 && onnx_in_attr_ints(v, names[k], a[k], TEQ_MAX_DIMS, &cnt[k])) continue;
      if (v->failed) rc = TEQ_ERR_INPUT;
    } else if (onnx_in_has_input(v, k + 1)) {
      rc = read_ints(v, k + 1, a[k], TEQ_MAX_DIMS, &cnt[k], d);
    }
  }
  if (rc != TEQ_OK) return rc;
  if (cnt[0] != cnt[1] || (cnt[2] >= 0 && cnt[2] != cnt[0]) || (cnt[3] >= 0 && cnt[3] != cnt[0]))
    return onnx_in_error(v, d, "starts, ends, axes and steps differ in length");
  for (int k = 0; k < cnt[0]; k++) {
    if (cnt[2] < 0) a[2][k] = k;
    if (cnt[3] < 0) a[3][k] = 1;
    if (a[3][k] == 0) return onnx_in_error(v, d, "step 0");
  }
  *n = cnt[0];
  return TEQ_OK;
}

static int fold_slice(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *t;
  int64_t a[4][TEQ_MAX_DIMS], first[TEQ_MAX_DIMS] = {0}, step[TEQ_MAX_DIMS], dims[TEQ_MAX_DIMS];
  int n = 0, rc = need(v, 0, &t, d);
  if (rc == TEQ_OK) rc = slice_args(v, a, &n, d);
  if (rc != TEQ_OK) return rc;
  const Shape *in = &t->shape;
  for (int k = 0; k < in->ndim; k++) dims[k] = in->d[k], step[k] = 1;
  for (int k = 0; k < n; k++) {
    int64_t ax = a[2][k];
    if ((rc = norm_axis(v, &ax, in->ndim, d)) != TEQ_OK) return rc;
    slice_axis(in->d[ax], a[0][k], a[1][k], a[3][k], &first[ax], &dims[ax]);
    step[ax] = a[3][k];
  }
  Shape s = shape_make(in->ndim, dims);
  if ((rc = new_tensor(v, t->dtype, &s, out, d)) != TEQ_OK) return rc;
  int64_t strides[TEQ_MAX_DIMS];
  shape_strides(in, strides);
  size_t es = dtype_size(t->dtype);
  for (int64_t k = 0, total = shape_numel(&s); k < total; k++) {
    int64_t rest = k, off = 0;
    for (int i = s.ndim - 1; i >= 0; i--) {
      off += (first[i] + (rest % s.d[i]) * step[i]) * strides[i];
      rest /= s.d[i];
    }
    memcpy((char *)(*out)->data + k * (int64_t)es, (const char *)t->data + off * (int64_t)es, es);
  }
  return TEQ_OK;
}

static int fold_expand(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *t;
  int64_t dims[TEQ_MAX_DIMS + 1];
  int n = 0, rc = need(v, 0, &t, d);
  if (rc == TEQ_OK) rc = read_ints(v, 1, dims, TEQ_MAX_DIMS + 1, &n, d);
  if (rc != TEQ_OK) return rc;
  if (n > TEQ_MAX_DIMS) return onnx_in_unsupported(v, d, "result of rank %d", n);
  Shape target = shape_make(n, dims), s;
  if ((rc = broadcast(v, &t->shape, &target, &s, d)) != TEQ_OK) return rc;
  if ((rc = new_tensor(v, t->dtype, &s, out, d)) != TEQ_OK) return rc;
  size_t es = dtype_size(t->dtype);
  for (int64_t k = 0; k < tensor_numel(*out); k++)
    memcpy((char *)(*out)->data + k * (int64_t)es,
           (const char *)t->data + bcast_offset(&s, &t->shape, k) * (int64_t)es, es);
  return TEQ_OK;
}

/* ---- int64 arithmetic ---- */

typedef enum {
  BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV, BIN_MOD, BIN_FMOD, BIN_MIN, BIN_MAX, BIN_AND, BIN_OR,
  BIN_EQUAL, BIN_LESS, BIN_GREATER, BIN_LESS_EQ, BIN_GREATER_EQ, /* comparisons last */
} BinOp;

static bool is_comparison(BinOp op) { return op >= BIN_EQUAL; }

static int64_t compare(BinOp op, double a, double b) {
  switch (op) {
  case BIN_LESS: return a < b;
  case BIN_GREATER: return a > b;
  case BIN_LESS_EQ: return a <= b;
  case BIN_GREATER_EQ: return a >= b;
  default: return a == b;
  }
}

static int apply_int(OnnxNodeIn *v, BinOp op, int64_t a, int64_t b, int64_t *r, Diag *d) {
  switch (op) {
  case BIN_ADD: *r = (int64_t)((uint64_t)a + (uint64_t)b); break;
  case BIN_SUB: *r = (int64_t)((uint64_t)a - (uint64_t)b); break;
  case BIN_MUL: *r = (int64_t)((uint64_t)a * (uint64_t)b); break;
  case BIN_DIV:
    if (b == 0 || (a == INT64_MIN && b == -1))
      return onnx_in_error(v, d, "integer division by %lld", (long long)b);
    *r = a / b; /* truncation, as ONNX Runtime divides integers */
    break;
  case BIN_MOD: /* fmod=0: the sign of the divisor, as Python's % */
    if (b == 0 || (a == INT64_MIN && b == -1))
      return onnx_in_error(v, d, "integer modulo by %lld", (long long)b);
    *r = a % b;
    if (*r && (*r < 0) != (b < 0)) *r += b;
    break;
  case BIN_MIN: *r = a < b ? a : b; break;
  case BIN_MAX: *r = a > b ? a : b; break;
  case BIN_AND: *r = a && b; break;
  case BIN_OR: *r = a || b; break;
  case BIN_FMOD: /* fmod=1: the sign of the dividend, as C's % */
    if (b == 0 || (a == INT64_MIN && b == -1))
      return onnx_in_error(v, d, "integer modulo by %lld", (long long)b);
    *r = a % b;
    break;
  case BIN_EQUAL: *r = a == b; break;
  case BIN_LESS: *r = a < b; break;
  case BIN_GREATER: *r = a > b; break;
  case BIN_LESS_EQ: *r = a <= b; break;
  case BIN_GREATER_EQ: *r = a >= b; break;
  }
  return TEQ_OK;
}

/* out = a op b with broadcasting; comparisons take any element type. */
static int binary(OnnxNodeIn *v, BinOp op, const Tensor *a, const Tensor *b, Tensor **out,
                  Diag *d) {
  *out = NULL;
  if (a->dtype != b->dtype) return onnx_in_error(v, d, "inputs differ in element type");
  if (a->dtype != DT_I64 && !is_comparison(op)) return ONNX_FOLD_DECLINED;
  Shape s;
  int rc = broadcast(v, &a->shape, &b->shape, &s, d);
  if (rc == TEQ_OK) rc = new_tensor(v, DT_I64, &s, out, d);
  for (int64_t k = 0; rc == TEQ_OK && k < shape_numel(&s); k++) {
    int64_t ia = bcast_offset(&s, &a->shape, k), ib = bcast_offset(&s, &b->shape, k);
    int64_t *r = &((int64_t *)(*out)->data)[k];
    if (a->dtype == DT_F32) *r = compare(op, elem_f(a, ia), elem_f(b, ib));
    else rc = apply_int(v, op, elem_i(a, ia), elem_i(b, ib), r, d);
  }
  if (rc != TEQ_OK) {
    tensor_unref(*out);
    *out = NULL;
  }
  return rc;
}

static int fold_binary(OnnxNodeIn *v, BinOp op, Tensor **out, Diag *d) {
  const Tensor *a;
  int rc = need(v, 0, &a, d);
  if (rc != TEQ_OK) return rc;
  int n = onnx_in_n_inputs(v);
  bool variadic = op == BIN_MIN || op == BIN_MAX;
  if (!variadic && n != 2) return onnx_in_error(v, d, "expected 2 inputs, found %d", n);
  Tensor *acc = tensor_ref((Tensor *)a);
  for (int i = 1; i < n && rc == TEQ_OK; i++) {
    const Tensor *b;
    Tensor *r = NULL;
    if ((rc = need(v, i, &b, d)) == TEQ_OK) rc = binary(v, op, acc, b, &r, d);
    tensor_unref(acc);
    acc = r;
  }
  if (rc == TEQ_OK && acc->dtype != DT_I64) rc = ONNX_FOLD_DECLINED; /* Min/Max of one float */
  if (rc != TEQ_OK) {
    tensor_unref(acc);
    return rc;
  }
  *out = acc;
  return TEQ_OK;
}

#define BINARY_FOLD(fn, op) \
  static int fn(OnnxNodeIn *v, Tensor **out, Diag *d) { return fold_binary(v, op, out, d); }
BINARY_FOLD(fold_add, BIN_ADD)
BINARY_FOLD(fold_sub, BIN_SUB)
BINARY_FOLD(fold_mul, BIN_MUL)
BINARY_FOLD(fold_div, BIN_DIV)
BINARY_FOLD(fold_min, BIN_MIN)
BINARY_FOLD(fold_max, BIN_MAX)

static int fold_mod(OnnxNodeIn *v, Tensor **out, Diag *d) {
  int64_t fmod = 0;
  onnx_in_attr_int(v, "fmod", &fmod);
  return fold_binary(v, fmod ? BIN_FMOD : BIN_MOD, out, d);
}

BINARY_FOLD(fold_and, BIN_AND)
BINARY_FOLD(fold_or, BIN_OR)
BINARY_FOLD(fold_equal, BIN_EQUAL)
BINARY_FOLD(fold_less, BIN_LESS)
BINARY_FOLD(fold_greater, BIN_GREATER)
BINARY_FOLD(fold_less_eq, BIN_LESS_EQ)
BINARY_FOLD(fold_greater_eq, BIN_GREATER_EQ)

/* Neg, Abs and Not of int64 (bool) tensors; float declines. */
static int fold_unary(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *t;
  int rc = need(v, 0, &t, d);
  if (rc != TEQ_OK) return rc;
  if (t->dtype != DT_I64) return ONNX_FOLD_DECLINED;
  const char *op = onnx_in_op_type(v);
  if ((rc = new_tensor(v, DT_I64, &t->shape, out, d)) != TEQ_OK) return rc;
  const int64_t *x = t->data;
  int64_t *r = (*out)->data;
  for (int64_t k = 0; k < tensor_numel(t); k++) {
    uint64_t neg = 0 - (uint64_t)x[k]; /* wraps like the two's complement hardware */
    if (op[0] == 'N' && op[1] == 'e') r[k] = (int64_t)neg;
    else if (op[0] == 'A') r[k] = x[k] < 0 ? (int64_t)neg : x[k];
    else r[k] = !x[k];
  }
  return TEQ_OK;
}

static int fold_where(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *c, *x, *y;
  int rc = need(v, 0, &c, d);
  if (rc == TEQ_OK) rc = need(v, 1, &x, d);
  if (rc == TEQ_OK) rc = need(v, 2, &y, d);
  if (rc != TEQ_OK) return rc;
  if (c->dtype != DT_I64 || x->dtype != y->dtype)
    return onnx_in_error(v, d, "needs a boolean condition and two inputs of one type");
  Shape s1, s;
  if ((rc = broadcast(v, &c->shape, &x->shape, &s1, d)) == TEQ_OK)
    rc = broadcast(v, &s1, &y->shape, &s, d);
  if (rc == TEQ_OK) rc = new_tensor(v, x->dtype, &s, out, d);
  if (rc != TEQ_OK) return rc;
  size_t es = dtype_size(x->dtype);
  for (int64_t k = 0; k < shape_numel(&s); k++) {
    bool take_x = elem_i(c, bcast_offset(&s, &c->shape, k)) != 0;
    const Tensor *src = take_x ? x : y;
    memcpy((char *)(*out)->data + k * (int64_t)es,
           (const char *)src->data + bcast_offset(&s, &src->shape, k) * (int64_t)es, es);
  }
  return TEQ_OK;
}

static int fold_reduce_prod(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *t;
  int64_t axes[TEQ_MAX_DIMS + 2], keepdims = 1, noop_empty = 0;
  int n = 0, rc = need(v, 0, &t, d);
  if (rc == TEQ_OK && t->dtype != DT_I64) return ONNX_FOLD_DECLINED;
  if (rc == TEQ_OK) rc = read_axes(v, 1, 18, axes, &n, d);
  if (rc != TEQ_OK) return rc;
  onnx_in_attr_int(v, "keepdims", &keepdims);
  onnx_in_attr_int(v, "noop_with_empty_axes", &noop_empty);
  if (n == 0 && noop_empty) return fold_identity(v, out, d);
  bool red[TEQ_MAX_DIMS] = {false};
  for (int k = 0; k < n; k++) {
    if ((rc = norm_axis(v, &axes[k], t->shape.ndim, d)) != TEQ_OK) return rc;
    red[axes[k]] = true;
  }
  Shape kept = t->shape, s = shape_of(0);
  for (int k = 0; k < t->shape.ndim; k++) {
    if (n == 0 || red[k]) kept.d[k] = 1;
    if (keepdims || !(n == 0 || red[k])) s.d[s.ndim++] = kept.d[k];
  }
  if ((rc = new_tensor(v, DT_I64, &s, out, d)) != TEQ_OK) return rc;
  int64_t *r = (*out)->data;
  for (int64_t k = 0; k < tensor_numel(*out); k++) r[k] = 1;
  for (int64_t k = 0; k < tensor_numel(t); k++)
    r[bcast_offset(&t->shape, &kept, k)] =
        (int64_t)((uint64_t)r[bcast_offset(&t->shape, &kept, k)] * (uint64_t)elem_i(t, k));
  return TEQ_OK;
}

/* ScatterND: data with the slices that indices name replaced by updates
 * (or, with reduction add or mul, combined with them; int64 only).
 * Exporters write it for slice assignment into masks built from shapes,
 * as in Swin's shifted windows. Duplicate indices with reduction none are
 * undefined in ONNX; here the last one wins. */
static int fold_scatter_nd(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const Tensor *t, *ix, *up;
  const char *reduction = "none";
  int rc = need(v, 0, &t, d);
  if (rc == TEQ_OK) rc = need(v, 1, &ix, d);
  if (rc == TEQ_OK) rc = need(v, 2, &up, d);
  if (rc != TEQ_OK) return rc;
  onnx_in_attr_string(v, "reduction", &reduction);
  bool add = strcmp(reduction, "add") == 0, mul = strcmp(reduction, "mul") == 0;
  if (!add && !mul && strcmp(reduction, "none") != 0)
    return onnx_in_unsupported(v, d, "reduction '%s'", reduction);
  if ((add || mul) && t->dtype != DT_I64) return ONNX_FOLD_DECLINED;
  if (ix->dtype != DT_I64 || ix->shape.ndim < 1 || up->dtype != t->dtype)
    return onnx_in_error(v, d, "needs int64 indices and updates of the data's type");
  int q = ix->shape.ndim, k = (int)ix->shape.d[q - 1], r = t->shape.ndim;
  bool fits = k >= 1 && k <= r && up->shape.ndim == q - 1 + r - k;
  for (int i = 0; fits && i < q - 1; i++) fits = up->shape.d[i] == ix->shape.d[i];
  for (int i = 0; fits && i < r - k; i++) fits = up->shape.d[q - 1 + i] == t->shape.d[k + i];
  if (!fits) {
    char st[SHAPE_STR_MAX], si[SHAPE_STR_MAX], su[SHAPE_STR_MAX];
    return onnx_in_error(v, d, "data %s, indices %s and updates %s do not fit together",
                         shape_format(&t->shape, st, sizeof st),
                         shape_format(&ix->shape, si, sizeof si),
                         shape_format(&up->shape, su, sizeof su));
  }
  if ((rc = new_tensor(v, t->dtype, &t->shape, out, d)) != TEQ_OK) return rc;
  memcpy((*out)->data, t->data, tensor_bytes(t));
  int64_t slice = dims_product(&t->shape, k, r), n_ix = dims_product(&ix->shape, 0, q - 1);
  size_t es = dtype_size(t->dtype);
  for (int64_t j = 0; j < n_ix; j++) {
    int64_t off = 0;
    for (int a = 0; a < k; a++) {
      int64_t i = ((const int64_t *)ix->data)[j * k + a], len = t->shape.d[a];
      if (i < -len || i >= len) {
        tensor_unref(*out);
        return onnx_in_error(v, d, "index %lld out of range [%lld, %lld) on axis %d",
                             (long long)i, (long long)-len, (long long)len, a);
      }
      off = off * len + (i < 0 ? i + len : i);
    }
    if (!add && !mul) {
      memcpy((char *)(*out)->data + (size_t)(off * slice) * es,
             (const char *)up->data + (size_t)(j * slice) * es, (size_t)slice * es);
      continue;
    }
    int64_t *dst = (int64_t *)(*out)->data + off * slice;
    const int64_t *src = (const int64_t *)up->data + j * slice;
    for (int64_t e = 0; e < slice; e++)
      dst[e] = add ? (int64_t)((uint64_t)dst[e] + (uint64_t)src[e])
                   : (int64_t)((uint64_t)dst[e] * (uint64_t)src[e]);
  }
  return TEQ_OK;
}

/* ---- dispatch ---- */

static const struct {
  const char *op_type;
  FoldFn fn;
} fold_table[] = {
    {"Shape", fold_shape},       {"Size", fold_size},
    {"Constant", fold_constant}, {"ConstantOfShape", fold_constant_of_shape},
    {"Range", fold_range},       {"Identity", fold_identity},
    {"Cast", fold_cast},         {"Reshape", fold_reshape},
    {"Unsqueeze", fold_unsqueeze}, {"Squeeze", fold_squeeze},
    {"Gather", fold_gather},     {"Concat", fold_concat},
    {"Slice", fold_slice},       {"Expand", fold_expand},
    {"Add", fold_add},           {"Sub", fold_sub},
    {"Mul", fold_mul},           {"Div", fold_div},
    {"Min", fold_min},           {"Max", fold_max},
    {"Mod", fold_mod},           {"And", fold_and},
    {"Or", fold_or},             {"Equal", fold_equal},
    {"Less", fold_less},         {"Greater", fold_greater},
    {"LessOrEqual", fold_less_eq}, {"GreaterOrEqual", fold_greater_eq},
    {"Neg", fold_unary},         {"Abs", fold_unary},
    {"Not", fold_unary},         {"Where", fold_where},
    {"ReduceProd", fold_reduce_prod}, {"ScatterND", fold_scatter_nd},
};

int onnx_fold_node(OnnxNodeIn *v, Tensor **out, Diag *d) {
  const char *op = onnx_in_op_type(v);
  for (size_t k = 0; k < sizeof fold_table / sizeof fold_table[0]; k++) {
    if (strcmp(fold_table[k].op_type, op) != 0) continue;
    if (v->n_out != 1) return ONNX_FOLD_DECLINED;
    out[0] = NULL;
    int rc = fold_table[k].fn(v, out, d);
    if (rc == TEQ_OK && v->failed) {
      tensor_unref(out[0]);
      rc = TEQ_ERR_INPUT;
    }
    return rc;
  }
  return ONNX_FOLD_DECLINED;
}
