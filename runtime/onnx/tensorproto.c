/* tensorproto.c: onnx.TensorProto <-> Tensor, for initializers, Constant
 * nodes and the test data sets' input_N.pb / output_N.pb files.
 * A TensorProto holds its values either in raw_data (little-endian bytes)
 * or in one typed repeated field; both are read. Element types are narrowed
 * to the two Teq keeps: float types become float32, integer types and bool
 * become int64 (shape tensors, indices, masks). An initializer's data may
 * be in a file beside the model (external.c); elsewhere that is refused.
 * Writing always uses raw_data (export.c may then move it out).
 *
 * Reading an initializer takes its raw_data over rather than copying it,
 * and writing one points raw_data at the tensor's own data: weights are
 * most of a model's bytes, see proto.c. */
#include <stdlib.h>
#include <string.h>

#include "runtime/onnx/onnx_int.h"

#define ELEM(x) ONNX__TENSOR_PROTO__DATA_TYPE__##x

/* Bytes per element in raw_data; 0 for types we do not read. */
static size_t elem_size(int32_t elem) {
  switch (elem) {
  case ELEM(FLOAT): case ELEM(INT32): return 4;
  case ELEM(DOUBLE): case ELEM(INT64): return 8;
  case ELEM(INT16): case ELEM(UINT16): return 2;
  case ELEM(INT8): case ELEM(UINT8): case ELEM(BOOL): return 1;
  default: return 0;
  }
}

bool onnx_elem_dtype(int32_t elem, DType *out) {
  if (!elem_size(elem)) return false;
  *out = elem == ELEM(FLOAT) || elem == ELEM(DOUBLE) ? DT_F32 : DT_I64;
  return true;
}

int32_t onnx_dtype_elem(DType t) { return t == DT_F32 ? ELEM(FLOAT) : ELEM(INT64); }

const char *onnx_elem_name(int32_t elem) {
  static const char *const names[] = {
      "undefined", "float", "uint8", "int8", "uint16", "int16", "int32", "int64", "string",
      "bool", "float16", "double", "uint32", "uint64", "complex64", "complex128", "bfloat16"};
  if (elem >= 0 && elem < (int32_t)(sizeof names / sizeof names[0])) return names[elem];
  return "unknown";
}

/* Element i of raw little-endian data as a double and as an int64. */
static void raw_element(const uint8_t *p, int32_t elem, double *f, int64_t *i) {
  union { float f32; double f64; int64_t i64; int32_t i32; int16_t i16; uint16_t u16; } u;
  memcpy(&u, p, elem_size(elem));
  switch (elem) {
  case ELEM(FLOAT): *f = u.f32; *i = (int64_t)u.f32; break;
  case ELEM(DOUBLE): *f = u.f64; *i = (int64_t)u.f64; break;
  case ELEM(INT64): *i = u.i64; *f = (double)u.i64; break;
  case ELEM(INT32): *i = u.i32; *f = u.i32; break;
  case ELEM(INT16): *i = u.i16; *f = u.i16; break;
  case ELEM(UINT16): *i = u.u16; *f = u.u16; break;
  case ELEM(INT8): *i = (int8_t)p[0]; *f = (double)*i; break;
  default: *i = p[0]; *f = p[0]; break; /* uint8, bool */
  }
}

/* The typed repeated field that holds elem's values, and its length. */
static size_t typed_count(const Onnx__TensorProto *tp, int32_t elem) {
  switch (elem) {
  case ELEM(FLOAT): return tp->n_float_data;
  case ELEM(DOUBLE): return tp->n_double_data;
  case ELEM(INT64): return tp->n_int64_data;
  default: return tp->n_int32_data;
  }
}

static void typed_element(const Onnx__TensorProto *tp, int32_t elem, size_t k, double *f,
                          int64_t *i) {
  switch (elem) {
  case ELEM(FLOAT): *f = tp->float_data[k]; *i = (int64_t)*f; break;
  case ELEM(DOUBLE): *f = tp->double_data[k]; *i = (int64_t)*f; break;
  case ELEM(INT64): *i = tp->int64_data[k]; *f = (double)*i; break;
  default: *i = tp->int32_data[k]; *f = (double)*i; break;
  }
}

/* The shape of tp as Teq will hold it (dt), which must fit (shape_fits):
 * an empty tensor's other extents too, or its strides would overflow. */
static int proto_shape(const Onnx__TensorProto *tp, DType dt, const char *where, Shape *s,
                       Diag *d) {
  if (tp->n_dims > TEQ_MAX_DIMS) {
    diag_error(d, "%s: %zu dimensions, at most %d are supported", where, tp->n_dims,
               TEQ_MAX_DIMS);
    return TEQ_ERR_UNSUPPORTED;
  }
  for (size_t i = 0; i < tp->n_dims; i++)
    if (tp->dims[i] < 0)
      return diag_error(d, "%s: dimension %zu is %lld", where, i, (long long)tp->dims[i]);
  Shape r = shape_make((int)tp->n_dims, tp->dims);
  if (!shape_fits(&r, dt)) {
    char why[SHAPE_MSG_MAX];
    return diag_error(d, "%s: %s", where, shape_too_large(&r, dt, why, sizeof why));
  }
  *s = r;
  return TEQ_OK;
}

static int check_storage(const Onnx__TensorProto *tp, const char *where, Diag *d) {
  if (tp->segment) {
    diag_error(d, "%s: segmented tensors are not supported", where);
    return TEQ_ERR_UNSUPPORTED;
  }
  return TEQ_OK;
}

/* Whether tp holds its values in raw_data (rather than a typed field), and
 * whether that is n elements. */
static int raw_values(const Onnx__TensorProto *tp, int32_t elem, size_t n, const char *where,
                      bool *raw, Diag *d) {
  size_t es = elem_size(elem);
  *raw = tp->has_raw_data && (tp->raw_data.len || !typed_count(tp, elem));
  size_t have = *raw ? tp->raw_data.len / es : typed_count(tp, elem);
  if ((*raw && tp->raw_data.len % es) || have != n)
    return diag_error(d, "%s: %zu values for shape of %zu elements", where, have, n);
  return TEQ_OK;
}

/* Whether raw_data already is t's data as this host lays it out: the
 * stored type is the kept one and the host is little-endian, as raw_data
 * is. Most of a model's bytes are such weights. */
static bool raw_is_native(int32_t elem, DType dt) {
  return ((elem == ELEM(FLOAT) && dt == DT_F32) || (elem == ELEM(INT64) && dt == DT_I64)) &&
         __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
}

/* Copies the values of tp into t (numel elements), from raw bytes (its
 * raw_data or its external data) or, raw NULL, from its typed field. */
static void fill(Tensor *t, const Onnx__TensorProto *tp, int32_t elem, const uint8_t *raw) {
  size_t n = (size_t)tensor_numel(t), es = elem_size(elem);
  if (raw && raw_is_native(elem, t->dtype)) {
    if (n) memcpy(t->data, raw, n * es);
    return;
  }
  for (size_t k = 0; k < n; k++) {
    double f;
    int64_t i;
    if (raw) raw_element(raw + k * es, elem, &f, &i);
    else typed_element(tp, elem, k, &f, &i);
    if (t->dtype == DT_F32) ((float *)t->data)[k] = (float)f;
    else ((int64_t *)t->data)[k] = i;
  }
}

/* Takes tp's raw_data over as t's data when it can be (native layout,
 * aligned as proto.c's unpack allocator aligns large blocks); false leaves
 * tp as it was. */
static bool adopt_raw(Onnx__TensorProto *tp, DType dt, const Shape *s, Tensor **t) {
  if (!((uintptr_t)tp->raw_data.data & 63) && tp->raw_data.len >= 4096) {
    *t = tensor_adopt(dt, s, tp->raw_data.data); /* frees the data if it fails */
    tp->raw_data.data = NULL;
    tp->raw_data.len = 0;
    tp->has_raw_data = 0;
    return true;
  }
  return false;
}

/* owned: tp itself when its raw_data may be taken over, else NULL; ext:
 * where external data is read from (NULL: it is refused). */
static int from_proto(const Onnx__TensorProto *tp, Onnx__TensorProto *owned, OnnxExternal *ext,
                      const char *where, Tensor **out, Diag *d) {
  int32_t elem = tp->has_data_type ? tp->data_type : ELEM(UNDEFINED);
  DType dt;
  if (!onnx_elem_dtype(elem, &dt)) {
    diag_error(d, "%s: element type %s is not supported", where, onnx_elem_name(elem));
    return TEQ_ERR_UNSUPPORTED;
  }
  Shape s;
  bool raw = false;
  const uint8_t *bytes = NULL;
  int rc = check_storage(tp, where, d);
  if (rc == TEQ_OK) rc = proto_shape(tp, dt, where, &s, d);
  if (rc == TEQ_OK && onnx_tensor_is_external(tp))
    rc = onnx_external_bytes(ext, tp, (size_t)shape_numel(&s) * elem_size(elem), where, &bytes,
                             d);
  else if (rc == TEQ_OK)
    rc = raw_values(tp, elem, (size_t)shape_numel(&s), where, &raw, d);
  if (rc != TEQ_OK) return rc;
  if (raw) bytes = tp->raw_data.data;
  Tensor *t = NULL;
  if (!(owned && raw && raw_is_native(elem, dt) && adopt_raw(owned, dt, &s, &t))) {
    t = tensor_new_uninit(dt, &s); /* fill writes every element */
    if (t) fill(t, tp, elem, bytes);
  }
  if (!t) {
    diag_error(d, "%s: out of memory", where);
    return TEQ_ERR_NOMEM;
  }
  *out = t;
  return TEQ_OK;
}

int onnx_tensor_from_proto(const Onnx__TensorProto *tp, const char *where, Tensor **out,
                           Diag *d) {
  return from_proto(tp, NULL, NULL, where, out, d);
}

int onnx_tensor_take_from_proto(Onnx__TensorProto *tp, const char *where, Tensor **out,
                                Diag *d) {
  return from_proto(tp, tp, NULL, where, out, d);
}

int onnx_tensor_take_from_initializer(Onnx__TensorProto *tp, OnnxExternal *x,
                                      const char *where, Tensor **out, Diag *d) {
  return from_proto(tp, tp, x, where, out, d);
}

Onnx__TensorProto *onnx_tensor_to_proto(const Tensor *t, const char *name, bool lend) {
  Onnx__TensorProto *tp = malloc(sizeof *tp);
  if (!tp) return NULL;
  onnx__tensor_proto__init(tp);
  size_t n = (size_t)tensor_numel(t);
  size_t bytes = n * (t->dtype == DT_F32 ? 4 : 8);
  lend = lend && t->dtype != DT_MODP && bytes;
  tp->name = strdup(name ? name : "");
  tp->dims = malloc((size_t)(t->shape.ndim ? t->shape.ndim : 1) * sizeof *tp->dims);
  /* raw_data is not const only because unpack writes it; pack reads it. */
  tp->raw_data.data = lend ? (uint8_t *)t->data : malloc(bytes ? bytes : 1);
  if (!tp->name || !tp->dims || !tp->raw_data.data) {
    if (lend) tp->raw_data.data = NULL;
    onnx_message_free(tp);
    return NULL;
  }
  tp->n_dims = (size_t)t->shape.ndim;
  memcpy(tp->dims, t->shape.d, tp->n_dims * sizeof *tp->dims);
  tp->has_data_type = 1;
  tp->data_type = onnx_dtype_elem(t->dtype);
  tp->has_raw_data = 1;
  tp->raw_data.len = bytes;
  if (t->dtype == DT_MODP) { /* Z_p residues are written as their int64 values */
    for (size_t k = 0; k < n; k++) {
      int64_t v = ((const uint32_t *)t->data)[k];
      memcpy(tp->raw_data.data + 8 * k, &v, 8);
    }
  } else if (!lend) {
    memcpy(tp->raw_data.data, t->data, bytes);
  }
  return tp;
}

bool onnx_tensor_proto_is_lent(const Onnx__TensorProto *tp, const Tensor *t) {
  return tp->raw_data.data && tp->raw_data.data == (const uint8_t *)t->data;
}

void onnx_tensor_proto_unlend(Onnx__TensorProto *tp) {
  tp->raw_data.data = NULL;
  tp->raw_data.len = 0;
}

int onnx_read_tensor_file(const char *path, Tensor **out, char **name_out, Diag *d) {
  OnnxFileData f;
  int rc = onnx_file_read(path, &f, d);
  if (rc != TEQ_OK) return rc;
  ProtobufCMessage *m = NULL;
  if (f.len == 0) rc = diag_error(d, "%s: not an ONNX tensor: the file is empty", path);
  else if (onnx_unpack(&onnx__tensor_proto__descriptor, f.data, f.len, &m) != TEQ_OK)
    rc = diag_error(d, "%s: not an ONNX tensor: the protobuf does not parse", path);
  onnx_file_release(&f);
  if (rc != TEQ_OK) return rc;
  Onnx__TensorProto *tp = (Onnx__TensorProto *)m;
  char *name = name_out ? strdup(tp->name ? tp->name : "") : NULL;
  Tensor *t = NULL;
  if (name_out && !name) rc = TEQ_ERR_NOMEM;
  else rc = onnx_tensor_take_from_proto(tp, path, &t, d);
  onnx_message_free(tp);
  if (rc != TEQ_OK) {
    free(name);
    return rc;
  }
  *out = t;
  if (name_out) *name_out = name;
  return TEQ_OK;
}

int onnx_write_tensor_file(const char *path, const Tensor *t, const char *name, Diag *d) {
  Onnx__TensorProto *tp = onnx_tensor_to_proto(t, name, true);
  if (!tp) {
    diag_error(d, "%s: out of memory", path);
    return TEQ_ERR_NOMEM;
  }
  int rc = onnx_pack_to_file(&tp->base, path, d);
  if (onnx_tensor_proto_is_lent(tp, t)) onnx_tensor_proto_unlend(tp);
  onnx_message_free(tp);
  return rc;
}
