/* onnx_int.h: shared by the files of runtime/onnx/ only (the door is
 * runtime/onnx.h). proto.c is the one place where protobuf-c's conventions
 * (NULL from unpack, sizes from pack) turn into our error codes;
 * tensorproto.c converts TensorProto <-> Tensor; fold.c evaluates the
 * integer shape bookkeeping of ONNX at import; passes.c cleans the imported
 * graph (no-ops, BatchNormalization); import.c and export.c walk models.
 *
 * Every protobuf message built here is malloc'd field by field, so one
 * protobuf_c_message_free_unpacked(msg, NULL) frees it, like an unpacked one. */
#ifndef TEQ_RUNTIME_ONNX_INT_H
#define TEQ_RUNTIME_ONNX_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "onnx.pb-c.h"
#include "runtime/err.h"
#include "runtime/graph.h"
#include "runtime/onnx.h"
#include "runtime/tensor.h"

/* ---- proto.c: files and the protobuf-c boundary ---- */

/* A whole file's bytes: mapped (a regular file) or read into memory (a
 * pipe); onnx_file_release gives them back either way. */
typedef struct OnnxFileData {
  const uint8_t *data;
  size_t len;
  bool mapped;
} OnnxFileData;
int onnx_file_read(const char *path, OnnxFileData *out, Diag *d);
void onnx_file_release(OnnxFileData *f);
/* Unpacks data as a message of desc; TEQ_ERR_INPUT (no message: the caller
 * knows what the bytes were meant to be) if they are not one. */
int onnx_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                ProtobufCMessage **out);
/* Serializes m into a malloc'd buffer. */
int onnx_pack(const ProtobufCMessage *m, uint8_t **data, size_t *len);
/* Packs m into the file at path as it goes. */
int onnx_pack_to_file(const ProtobufCMessage *m, const char *path, Diag *d);
void onnx_message_free(void *m); /* any message built or unpacked here; NULL is fine */

/* ---- external.c: weights in files beside the model ---- */

/* The files one import reads external data from, mapped once each. */
typedef struct OnnxExternal OnnxExternal;
OnnxExternal *onnx_external_new(const char *model_path); /* NULL when out of memory */
void onnx_external_free(OnnxExternal *x);
bool onnx_tensor_is_external(const Onnx__TensorProto *tp);
/* tp's bytes (exactly `bytes` of them) in the file its external_data
 * names; *out points into the mapping, valid until onnx_external_free.
 * x NULL: refused (a model not read from a file has no directory). */
int onnx_external_bytes(OnnxExternal *x, const Onnx__TensorProto *tp, size_t bytes,
                        const char *where, const uint8_t **out, Diag *d);
/* Writes the raw_data of each of tps[0..n) with at least min_bytes into
 * the file `location` beside model_path, and points the TensorProto there
 * (raw_data is kept but no longer packed); *n_moved counts them. */
int onnx_external_write(Onnx__TensorProto **tps, size_t n, const char *model_path,
                        const char *location, size_t min_bytes, int *n_moved, Diag *d);

/* ---- tensorproto.c ---- */

/* The ONNX element type kept as dtype: float32 and float64 become DT_F32;
 * int64, int32, int16, int8, uint8, uint16 and bool become DT_I64. */
bool onnx_elem_dtype(int32_t elem, DType *out);
int32_t onnx_dtype_elem(DType t); /* ONNX element type written for t */
const char *onnx_elem_name(int32_t elem);
/* A new tensor from tp; `where` starts every message ("m.onnx: initializer 'w'"). */
int onnx_tensor_from_proto(const Onnx__TensorProto *tp, const char *where, Tensor **out,
                           Diag *d);
/* The same, but the tensor may take tp's raw_data over (leaving tp without
 * it) instead of copying it: for a message freed right after. */
int onnx_tensor_take_from_proto(Onnx__TensorProto *tp, const char *where, Tensor **out,
                                Diag *d);
/* The same for an initializer, whose data may be in a file beside the
 * model (external data, read through x; x NULL refuses it). */
int onnx_tensor_take_from_initializer(Onnx__TensorProto *tp, OnnxExternal *x,
                                      const char *where, Tensor **out, Diag *d);
/* A new TensorProto (raw_data) holding t, or NULL if memory runs out. With
 * lend, raw_data is t's own data where ONNX lays it out so (not DT_MODP,
 * whose residues are widened to int64): the caller keeps t alive while the
 * message is used, and takes the data back (onnx_tensor_proto_unlend)
 * before freeing the message. */
Onnx__TensorProto *onnx_tensor_to_proto(const Tensor *t, const char *name, bool lend);
bool onnx_tensor_proto_is_lent(const Onnx__TensorProto *tp, const Tensor *t);
void onnx_tensor_proto_unlend(Onnx__TensorProto *tp);

/* ---- strings ---- */

/* An open-addressing map from borrowed strings to ints: tensor names at
 * import, names taken at export. */
typedef struct OnnxNames {
  const char **keys;
  int32_t *vals;
  size_t cap, n;
} OnnxNames;

/* TEQ_ERR_NOMEM or TEQ_OK; an existing key gets the new value. */
int onnx_names_put(OnnxNames *t, const char *key, int32_t val);
int32_t onnx_names_get(const OnnxNames *t, const char *key); /* -1 if absent */
void onnx_names_fini(OnnxNames *t);
char *onnx_strdup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- import.c: one node being imported ---- */

/* A named ONNX value: in the graph, known as a constant, or both. */
typedef struct OnnxValue {
  const char *name; /* borrowed from the model */
  TensorRef ref;    /* ref.node < 0 until it is in the graph */
  Tensor *konst;    /* its value when known at import (one reference), else NULL */
  int32_t elem;     /* its exact ONNX element type, which Teq's dtype may widen; 0 unknown */
} OnnxValue;

/* How a node is imported (onnx.h: onnx_in_as_elementwise and the others). */
typedef enum OnnxForm {
  ONNX_FORM_ONE,         /* one node of the row's kind */
  ONNX_FORM_ELEMENTWISE, /* a unary element-wise operator of input 0 */
  ONNX_FORM_CHAIN,       /* binary nodes of the kind folding the inputs left to right */
  ONNX_FORM_RAISED,      /* the 2-D window over inputs with a unit axis 2, lost again after */
  ONNX_FORM_ARRANGED,    /* one node of the kind between transposes, sums and reshapes */
  ONNX_FORM_KIND,        /* a node of another kind, whose row reads it anew */
} OnnxForm;

/* ONNX_FORM_ARRANGED: a transpose (n_perm > 0), a sum over the last
 * n_sum axes and a reshape (reshape), in that order for an input; the
 * output's reshape comes first, and it has no sum. */
typedef struct OnnxArrange {
  int n_perm;
  int64_t perm[TEQ_MAX_DIMS];
  int n_sum;
  bool reshape;
  Shape shape;
} OnnxArrange;

#define ONNX_ARRANGED_MAX_IN 2

struct OnnxNodeIn {
  const char *path;
  const Onnx__NodeProto *np;
  int index;           /* position in the file, for nodes without a name */
  int opset;
  const Graph *g;
  OnnxValue **in;      /* per ONNX input; NULL where the name is empty */
  int n_in;
  int n_out;           /* outputs up to the last non-empty name */
  const OnnxNames *read; /* the names anything in the model reads */
  bool *consumed;      /* per input */
  bool *attr_read;     /* per attribute */
  char **strings;      /* NUL-terminated copies handed out by onnx_in_attr_string */
  int n_strings;
  Diag *d;
  bool failed;         /* an accessor reported an error in d */
  OnnxForm form;       /* what the row's hook asked for; ONNX_FORM_ONE unless it did */
  OpKind form_kind;    /* ONNX_FORM_ELEMENTWISE, ONNX_FORM_KIND: the operator */
  unsigned raised_inputs; /* ONNX_FORM_RAISED: the inputs that get the unit axis (bit i) */
  OnnxArrange arrange_in[ONNX_ARRANGED_MAX_IN], arrange_out; /* ONNX_FORM_ARRANGED */
};

/* ---- node_in.c ---- */

#define ONNX_ATTR(x) ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__##x

/* "PATH: node 'NAME' (OpType)" into buf; nodes without a name are named by
 * their index in the file and their first output. */
void onnx_node_where(const char *path, const Onnx__NodeProto *np, int index, char *buf,
                     size_t size);
const char *onnx_in_where(const OnnxNodeIn *v, char *buf, size_t size);
/* An attribute's type, inferred from its fields in files that omit it. */
int onnx_attr_type(const Onnx__AttributeProto *a);
/* A new reference to a tensor attribute's value. */
bool onnx_in_attr_tensor(OnnxNodeIn *v, const char *name, Tensor **out);
/* A list attribute of any length, borrowed from the model. */
bool onnx_in_attr_floats(OnnxNodeIn *v, const char *name, const float **out, int *n);
bool onnx_in_attr_int_list(OnnxNodeIn *v, const char *name, const int64_t **out, int *n);

/* ---- fold.c ---- */

/* onnx_fold_node's answer for an operator it does not evaluate (at these
 * element types): the caller tries the registry next. */
#define ONNX_FOLD_DECLINED 1

/* Evaluates node v, whose non-empty inputs are all constants (Shape and
 * Size need only a known input shape), into out[0..v->n_out), new
 * references. Returns TEQ_OK, ONNX_FOLD_DECLINED, or an error located at
 * the node. */
int onnx_fold_node(OnnxNodeIn *v, Tensor **out, Diag *d);

/* ---- passes.c ---- */

/* Bypasses every OPF_NOOP node; returns how many, or a negative error. */
int onnx_pass_remove_noops(Graph *g, Diag *d);
/* Bypasses every node that passes an input through because its other is
 * a neutral constant (OpDef.neutral: x * 1, x + 0); returns how many. */
int onnx_pass_drop_neutral_operands(Graph *g, Diag *d);
/* Takes each Pad of zeros into the convolutions and average pools reading
 * it whose window can pad so (op_takes_pad); returns how many readers, or
 * an error. */
int onnx_pass_fold_zero_pads(Graph *g, Diag *d);
/* Replaces each layer normalization written out in nine operators (mean,
 * subtract, square, mean, add epsilon, sqrt, divide, scale, shift) by one
 * layer_norm; returns how many, or an error. */
int onnx_pass_fuse_layer_norm(Graph *g, Diag *d);
/* Replaces each GELU written out in erf (x / sqrt 2 or x * (1 / sqrt 2),
 * Erf, + 1, times x, times 1/2, the halving first or last) or in tanh
 * (sqrt(2/pi) (x + 0.044715 x^3), Tanh, and the same tail) by one gelu;
 * returns how many, or an error. */
int onnx_pass_fuse_gelu(Graph *g, Diag *d);
/* Replaces each x * sigmoid(x) by silu(x) and each x * hard_sigmoid(x)
 * with alpha 1/6 and beta 1/2 by hard_swish(x), where the product alone
 * reads the gate; returns how many, or an error. */
int onnx_pass_fuse_swishes(Graph *g, Diag *d);
/* Replaces each hard swish written out as x * clip(x + 3, 0, 6) / 6 by
 * hard_swish(x) and each gate clip(x + 3, 0, 6) / 6 by hard_sigmoid(x) with
 * alpha 1/6 and beta 1/2 (the division may be a product by 1/6); returns
 * how many, or an error. */
int onnx_pass_fuse_hard_gates(Graph *g, Diag *d);
/* Folds a BatchNorm (where batchnorms) or a constant scale or shift of one
 * value or one per channel (where scales) after a convolution or a
 * transposed one, which feeds nothing else and whose weights are constants,
 * into its weights and bias (PP-LCNetV3's affine blocks; a bias Paddle adds
 * after a ConvTranspose, then its BatchNorm); returns how many,
 * *n_batchnorms of them BatchNorms, or an error. */
int onnx_pass_fold_affines_after_convs(Graph *g, bool batchnorms, bool scales, int *n_batchnorms,
                                       Diag *d);
/* Folds a BatchNorm (where batchnorms) or a constant scale or shift of one
 * value or one per channel (where scales) that a convolution alone reads
 * into its weights and bias, and, where its padding reads zeros the shift
 * never saw, a constant residual (IResNet's BatchNorms before each block's
 * first convolution); returns how many, *n_batchnorms of them BatchNorms,
 * or an error. */
int onnx_pass_fold_affines_into_convs(Graph *g, bool batchnorms, bool scales, int *n_batchnorms,
                                      Diag *d);
/* Folds a constant scale of one value per output column into the constant
 * weights (and the added constant bias) of the product it follows, through
 * one transpose (ConvNeXt's layer scale); returns how many, or an error. */
int onnx_pass_fold_product_scales(Graph *g, Diag *d);
/* An Add of one value per column that alone reads a matmul of a matrix
 * [k, n] becomes a gemm with that bias (its C), through reshapes where the
 * product has more than two dimensions; returns how many, or an error. */
int onnx_pass_fuse_product_biases(Graph *g, Diag *d);
/* A Mul or Div by one value whose input reshapes, transposes and splits
 * cut from some whole columns of a product of constant weights (attention's
 * queries scaled by 1/sqrt(width)) folds into those columns' weights and
 * bias; returns how many, or an error. */
int onnx_pass_fold_head_scales(Graph *g, Diag *d);
/* An activation (act_of_node: a relu, sigmoid, tanh, silu, hard swish, a
 * clip to [0, 6], PyTorch's hard sigmoid) that alone reads a conv2d, matmul,
 * gemm or batchnorm (a row with an act parameter) becomes its fused act;
 * returns how many. */
int onnx_pass_fuse_activations(Graph *g, Diag *d);
/* A MaxPool of k x k windows at stride k (k >= 2), unpadded, undilated,
 * whose output keeps every whole window and no partial one, that alone
 * reads a conv2d without a pool, becomes that conv's pool; returns how
 * many. */
int onnx_pass_fuse_pools(Graph *g, Diag *d);

/* ---- versions.c ---- */

/* The first opset after `from`, up to `to`, at which ONNX defined default
 * domain operator op_type anew (its meaning at `to` may differ from its
 * meaning at `from`), not counting versions that only let more element
 * types in; 0 where it did not; -1 for an operator ONNX's default domain
 * does not have. */
int onnx_op_changed(const char *op_type, int from, int to);

#endif
