/* onnx.h: ONNX models in and out, and the small API through which registry
 * rows map their own attributes.
 *
 * Import reads a ModelProto (through C generated at build time by protoc-c
 * from the onnx.proto that Debian's libonnx-dev installs), folds constant
 * subgraphs (shape computations included) into constants, maps each node to
 * its registry kind by op_type, and passes every node it does not support
 * through as an opaque node, named in a warning; nothing is dropped. It
 * then removes no-op nodes (Identity, Dropout) and folds BatchNormalization
 * into a preceding convolution. Export writes opset-13 ONNX that ONNX Runtime
 * and onnx.checker accept, constants as initializers.
 *
 * Every message about a model names the file and, where there is one, the
 * node: "model.onnx: node 'conv_3' (Conv): attribute group=0: must be >= 1". */
#ifndef TEQ_RUNTIME_ONNX_H
#define TEQ_RUNTIME_ONNX_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/err.h"
#include "runtime/graph.h"
#include "runtime/ops.h"

typedef struct OnnxImportOptions {
  int64_t batch;       /* value for symbolic (named or unset) dimensions; default 1 */
  /* "NAME=N" each: the graph inputs' symbolic dimension NAME is N (and so is
   * every dimension declared with that name), where `batch` is not. A
   * name no graph input has is an error, as is a malformed entry. */
  const char *const *dims;
  int n_dims;
  bool keep_batchnorm; /* do not fold BatchNormalization into convolutions or gemms */
  bool keep_product_scales; /* do not fold a constant per-column scale after a product
                               with constant weights into them (ConvNeXt's layer scale),
                               nor one value scaling some of its columns (attention's
                               queries), nor constant affines around convolutions */
  bool keep_zero_pads; /* do not fold a Pad of zeros into the conv or average pool
                          reading it (their padding) */
  bool keep_noops;     /* keep Identity and Dropout nodes, and x * 1, x + 0 */
  bool keep_written_layer_norms; /* do not fuse a layer normalization written out in
                                    nine operators into one layer_norm */
  bool keep_written_gelus; /* do not fuse a GELU written out in erf into one gelu */
  bool keep_unfused_activations; /* do not fuse an activation (a relu, sigmoid, tanh,
                                    silu, hard swish, or a clip to [0, 6]) into the conv,
                                    matmul, gemm or batchnorm it alone reads (their act
                                    parameter), nor x * sigmoid(x) into one silu
                                    (hard_swish alike), nor a hard sigmoid or
                                    swish written out, relu6(x + 3) / 6 (times x),
                                    into one operator */
  bool keep_product_biases; /* do not fuse an Add of one value per column that alone
                               reads a matmul of a matrix into a gemm with that bias */
  bool keep_unfused_residuals; /* do not fuse an Add of a conv it alone reads and a
                                  tensor of its shape into the conv (its residual) */
  bool keep_unfused_pools; /* do not fuse a MaxPool of k x k windows at stride k that
                              alone reads a conv into the conv (its pool parameter) */
  /* A node of an operator Teq knows, in a form its row does not take (an
   * attribute value, a computed parameter, an extra output), is kept whole
   * as an opaque node, with a warning saying why, as an unknown operator is,
   * rather than refused: for callers that work around opaque nodes
   * (optimize), not for those that must run every node. */
  bool opaque_unsupported_forms;
} OnnxImportOptions;

#define ONNX_IMPORT_DEFAULTS ((OnnxImportOptions){.batch = 1})

/* The model as given: every import-time fusion off (zero Pads, BatchNormalization,
 * scales and biases after products, activations, residual adds, pools, written-out layer norms and
 * GELUs each stay
 * their own operators), as TASO's and Tensat's benchmark graphs run. What
 * a speedup measured from the default import leaves out. */
static inline void onnx_import_as_given(OnnxImportOptions *o) {
  o->keep_batchnorm = o->keep_unfused_activations = o->keep_unfused_residuals = true;
  o->keep_unfused_pools = true;
  o->keep_product_scales = o->keep_product_biases = true;
  o->keep_zero_pads = true;
  o->keep_written_layer_norms = o->keep_written_gelus = true;
}

typedef struct OnnxImportStats {
  int n_nodes;         /* nodes in the file */
  int n_folded;        /* nodes folded into constants */
  int n_opaque;        /* nodes passed through as opaque */
  int n_batchnorm_folded;
  int n_scales_folded; /* constant scales folded into the products before them */
  int n_pads_folded;   /* readers that took a Pad of zeros into their padding */
  int n_noops_removed;
  int n_layer_norms_fused;
  int n_gelus_fused;
  int n_hard_gates_fused; /* relu6(x + 3) / 6 as hard_sigmoid, x times it as hard_swish */
  int n_swishes_fused; /* x * sigmoid(x) as silu, x * hard_sigmoid(x) as hard_swish */
  int n_activations_fused;
  int n_biases_fused;  /* Adds of a bias taken into the products before them (gemm's C) */
  int n_residuals_fused; /* each with the activation after its add (not counted above) */
  int n_pools_fused;   /* max pools taken into the convs before them */
  int opset;           /* the model's default-domain opset */
  int n_external;      /* initializers read from files beside the model (external data) */
} OnnxImportStats;

/* What import did, in one line for a report ("257 nodes: 18 folded into
 * constants, ..."), into buf; returns buf. */
TEQ_API char *onnx_import_stats_format(const OnnxImportStats *s, char *buf, size_t size);
#define ONNX_STATS_STR_MAX 320

/* Reads path into a new graph (*out), which the caller frees. Returns
 * TEQ_OK, or TEQ_ERR_IO / TEQ_ERR_INPUT / TEQ_ERR_UNSUPPORTED with located
 * messages in d; *out is then untouched. Warnings (opaque operators, unused
 * attributes) go to d as well. stats may be NULL. */
TEQ_API int onnx_import_file(const char *path, const OnnxImportOptions *opts, Graph **out,
                             OnnxImportStats *stats, Diag *d);
TEQ_API int onnx_import_buffer(const uint8_t *data, size_t len, const char *name,
                               const OnnxImportOptions *opts, Graph **out,
                               OnnxImportStats *stats, Diag *d);

typedef struct OnnxExportOptions {
  /* Initializers of at least external_min_bytes are written to a file
   * beside the model (ONNX external data) rather than into it. Without
   * this they are too, with a warning, when the model would pass
   * protobuf's 2 GiB limit. */
  bool external;
  const char *external_data; /* that file's name; NULL: "<model file name>.data" */
  size_t external_min_bytes; /* 0: 1024 */
  /* The opset to write at least: the model's own (OnnxImportStats.opset),
   * so that what was read in opset 17 is not written in 13 (up to the
   * highest Teq writes, 20). 0: the lowest Teq's operators allow. */
  int opset;
} OnnxExportOptions;

/* The opset onnx_export_file writes g in, at least at_least (as
 * OnnxExportOptions.opset; path names the model in messages), or
 * TEQ_ERR_UNSUPPORTED with a message where g cannot be written faithfully:
 * an operator Teq keeps as it is (opaque) from a lower opset whose
 * definition ONNX changed by then. */
TEQ_API int onnx_export_opset(const Graph *g, const char *path, int at_least, int *opset,
                              Diag *d);

/* Writes g to path as an ONNX model; opts may be NULL. A model read with
 * external data is read the same way: onnx_import_file finds the files
 * beside the model it reads. */
TEQ_API int onnx_export_file(const Graph *g, const char *path, const OnnxExportOptions *opts,
                             Diag *d);

/* An operator Teq keeps as it is (opaque) as its NodeProto with what
 * onnx_export_file rewrites in it made alike: its name and its tensors'
 * names (which inputs and outputs are there stays), packed into *bytes
 * (free it). A model's opaque node and the one written from it have the
 * same bytes, so the two models' can be paired. TEQ_ERR_INPUT where the
 * stored NodeProto does not parse. */
TEQ_API int onnx_opaque_identity(const OpaqueInfo *info, uint8_t **bytes, size_t *len);

/* Reads one serialized onnx.TensorProto (the test data sets' input_N.pb and
 * output_N.pb) into a new float32 or int64 tensor; *name_out (optional)
 * receives a malloc'd copy of its name. */
TEQ_API int onnx_read_tensor_file(const char *path, Tensor **out, char **name_out, Diag *d);
/* Writes t as a serialized onnx.TensorProto named name. */
TEQ_API int onnx_write_tensor_file(const char *path, const Tensor *t, const char *name, Diag *d);

/* Input values from files, named on a command line as "NAME=FILE". The
 * file given for the input named name among specs[0..n), or NULL: */
TEQ_API const char *onnx_input_spec_file(const char *const *specs, int64_t n, const char *name);
/* ... an error for a spec that is no NAME=FILE or names no input of g: */
TEQ_API int onnx_check_input_specs(const char *const *specs, int64_t n, const Graph *g, Diag *d);
/* ... and the value of graph input node `in` read from path: an
 * onnx.TensorProto (.pb) of the input's type and shape, else exactly its
 * elements as raw little-endian bytes. TEQ_ERR_IO when path cannot be
 * opened. */
TEQ_API int onnx_read_input_file(const char *path, const Node *in, Tensor **out, Diag *d);

/* ---- for registry rows: one ONNX node being imported ---- */
typedef struct OnnxNodeIn OnnxNodeIn;

TEQ_API const char *onnx_in_op_type(const OnnxNodeIn *v);
TEQ_API int onnx_in_opset(const OnnxNodeIn *v);
TEQ_API int onnx_in_n_inputs(const OnnxNodeIn *v);  /* including empty optional ones */
TEQ_API int onnx_in_n_outputs(const OnnxNodeIn *v);
/* If nothing in the model reads outputs keep and after, the node is
 * imported with its first keep outputs only, and true is returned; else
 * nothing changes and false is returned. */
TEQ_API bool onnx_in_drop_unread_outputs(OnnxNodeIn *v, int keep);
TEQ_API bool onnx_in_has_input(const OnnxNodeIn *v, int i); /* present and non-empty */
/* Shape of input i, or NULL if absent. */
TEQ_API const Shape *onnx_in_input_shape(const OnnxNodeIn *v, int i);
/* Value of input i if it is a constant (initializer, Constant node or folded
 * subgraph), else NULL. Borrowed. */
TEQ_API const Tensor *onnx_in_const_input(const OnnxNodeIn *v, int i);
/* Input i was taken as a parameter: it does not become a graph edge. */
TEQ_API void onnx_in_consume_input(OnnxNodeIn *v, int i);
/* Attributes. Each returns true and writes *out if the attribute exists
 * (marking it read); a wrong attribute type is an error reported in d. */
TEQ_API bool onnx_in_attr_int(OnnxNodeIn *v, const char *name, int64_t *out);
TEQ_API bool onnx_in_attr_float(OnnxNodeIn *v, const char *name, double *out);
/* Up to max integers into out, count in *n; more than max is an error. */
TEQ_API bool onnx_in_attr_ints(OnnxNodeIn *v, const char *name, int64_t *out, int max, int *n);
TEQ_API bool onnx_in_attr_string(OnnxNodeIn *v, const char *name, const char **out);
/* Reports an error located at this node; returns TEQ_ERR_INPUT (or
 * TEQ_ERR_UNSUPPORTED with onnx_in_unsupported). */
TEQ_API int onnx_in_error(const OnnxNodeIn *v, Diag *d, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
TEQ_API int onnx_in_unsupported(const OnnxNodeIn *v, Diag *d, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Forms other than one node of the row's kind, for ONNX forms that Teq's
 * operators compute in more than one node or in none. The row's hook asks
 * for one after reading the parameters, which stay those of its kind.
 * As element-wise: the node computes the element-wise operator `kind`
 * (its default parameters) of its input 0: a Max of one input is an
 * identity, which the no-op pass removes, and so is a sum over no axes
 * (noop_with_empty_axes=1), and an L1 norm over no axes is an abs.
 * As a chain: the node's inputs are folded left to right by nodes of the
 * row's binary kind, ((x0 op x1) op x2) ..., which is exact for an
 * associative operator whose broadcasting is associative too (ONNX's
 * variadic Max and Min). As raised: a window over one spatial axis is
 * the row's 2-D window over [N, C, 1, L] (parameters read as 2-D ones):
 * each input in `inputs` (bit i: input i, of rank 3) gets a unit axis 2,
 * a constant once at import and anything else through a reshape, and the
 * output loses that axis again through a reshape. */
TEQ_API void onnx_in_as_elementwise(OnnxNodeIn *v, OpKind kind);
TEQ_API void onnx_in_as_chain(OnnxNodeIn *v);
TEQ_API void onnx_in_as_raised(OnnxNodeIn *v, unsigned inputs);
/* As another kind: the node is one of `kind`, whose row reads it anew
 * (its parameters, then its hook), for an ONNX operator two rows share by
 * its ranks (a Conv over three spatial axes is conv3d's). */
TEQ_API void onnx_in_as_kind(OnnxNodeIn *v, OpKind kind);
/* As arranged: one node of the row's kind between layout changes, for an
 * ONNX operator that is the row's operator once its operands are laid out
 * for it (Einsum: a batched product). Input i (0 or 1) reaches the node
 * transposed by perm (NULL: not transposed), summed over its last n_sum
 * axes (a reduce_sum; 0: none), then reshaped to shape (NULL: not
 * reshaped); output 0 leaves it reshaped to shape, then transposed by
 * perm. A step that changes nothing adds no node, and a constant input is
 * arranged at import. */
TEQ_API void onnx_in_as_arranged_input(OnnxNodeIn *v, int i, const int64_t *perm, int n_perm,
                                       int n_sum, const Shape *shape);
TEQ_API void onnx_in_as_arranged_output(OnnxNodeIn *v, const Shape *shape, const int64_t *perm,
                                        int n_perm);

/* ---- for registry rows: one node being exported ---- */
typedef struct OnnxNodeOut OnnxNodeOut;

TEQ_API void onnx_out_set_op_type(OnnxNodeOut *w, const char *op_type);
TEQ_API void onnx_out_attr_int(OnnxNodeOut *w, const char *name, int64_t v);
TEQ_API void onnx_out_attr_float(OnnxNodeOut *w, const char *name, double v);
TEQ_API void onnx_out_attr_ints(OnnxNodeOut *w, const char *name, const int64_t *v, int n);
TEQ_API void onnx_out_attr_string(OnnxNodeOut *w, const char *name, const char *v);
/* Shape of the node's input i (NULL if there is none), and the opset being
 * written, for rows whose ONNX form depends on them. The opset is decided
 * before any node is written: the model's own (OnnxExportOptions.opset)
 * or the highest any node needs (a row's onnx_opset, an opaque node's
 * own), so a row's form can follow it: an operator ONNX gained later is
 * written out below its opset (gelu, hard_swish, layer_norm). */
TEQ_API const Shape *onnx_out_input_shape(const OnnxNodeOut *w, int i);
TEQ_API int onnx_out_opset(const OnnxNodeOut *w);
/* Removes an attribute the generic mapping wrote (e.g. a default that the
 * exported op_type does not accept). */
TEQ_API void onnx_out_drop_attr(OnnxNodeOut *w, const char *name);
/* Appends an input: a new initializer holding a copy of t (a Reshape's
 * shape, a Split's sizes), or the empty name of a skipped optional input. */
TEQ_API void onnx_out_add_const_input(OnnxNodeOut *w, const Tensor *t);
TEQ_API void onnx_out_add_empty_input(OnnxNodeOut *w);
/* Follows the node with a node of op_type (a fused activation; an
 * operator written out where the opset lacks it): the node's output feeds
 * it and the last such node produces the node's output name. A binary one
 * reads, second, the constant c (copied), or the node's input 0 when c is
 * NULL. */
TEQ_API void onnx_out_then_unary(OnnxNodeOut *w, const char *op_type);
TEQ_API void onnx_out_then_binary(OnnxNodeOut *w, const char *op_type, const Tensor *c);
/* The same, reading the node's input `input` second, which the node itself
 * no longer takes (only its last input can move: a conv's residual becomes
 * the Add after it). */
TEQ_API void onnx_out_then_binary_input(OnnxNodeOut *w, const char *op_type, int input);
/* A unary window node after it: kernel_shape = strides = (k k), unpadded
 * (conv's fused pool becomes a MaxPool). */
TEQ_API void onnx_out_then_window(OnnxNodeOut *w, const char *op_type, int64_t k);
/* A node after it reading any two values of the chain, for a form that is
 * not a line (a layer norm written out reads x - mean twice): each operand
 * is ONNX_OUT_STEP(k), the output of the chain's node k (0: the node's
 * own, k: the k-th chained), or ONNX_OUT_INPUT(i), the node's input i. */
#define ONNX_OUT_STEP(k) (k)
#define ONNX_OUT_INPUT(i) (-1 - (i))
TEQ_API void onnx_out_then_operands(OnnxNodeOut *w, const char *op_type, int a, int b);
/* An ints attribute of the node last chained (a ReduceMean's axes). */
TEQ_API void onnx_out_then_attr_ints(OnnxNodeOut *w, const char *name, const int64_t *v, int n);
/* Keeps only the node's first n inputs (the rest read by chained nodes). */
TEQ_API void onnx_out_keep_inputs(OnnxNodeOut *w, int n);

#endif
