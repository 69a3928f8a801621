/* ops.h: the operator registry, the one place that knows what an operator is.
 *
 * Every operator kind has one const OpDef row: its name, arity, parameters,
 * flags, shape inference, float32 and Z_p kernels, ONNX mapping and axiom
 * name. Other code asks the row (op_def(kind)->flags & OPF_ELEMENTWISE)
 * instead of switching over kinds. Rows live beside their code in the family
 * files of runtime/ops/; ops.c gathers them into the table and checks it.
 *
 * Parameters are values in a fixed-size Params block (no pointers, zeroed
 * past what is set), so nodes copy with memcpy and hash and compare as bytes.
 * Each parameter is described once by an OpParam row, which drives defaults,
 * bounds checks, ONNX attributes, S-expression text and error messages. */
#ifndef TEQ_RUNTIME_OPS_H
#define TEQ_RUNTIME_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/err.h"
#include "runtime/tensor.h"

typedef enum OpKind {
#define OP(KIND, name) OP_##KIND,
#include "runtime/ops.def"
#undef OP
  OP__COUNT
} OpKind;

enum {
  OPF_SOURCE = 1u << 0,       /* no inputs: graph input, constant, constant tensor */
  OPF_ELEMENTWISE = 1u << 1,  /* output element i depends on input elements i only */
  OPF_MULTILINEAR = 1u << 2,  /* linear in each input separately (PET splits here); for
                                 conv/matmul/gemm this is the plain form: a node with a
                                 fused act or a bias input is affine or non-linear */
  OPF_NONLINEAR = 1u << 3,    /* has a Z_p polynomial stand-in (modp_standin) */
  OPF_LAYOUT_ONLY = 1u << 4,  /* moves or selects elements, computes nothing */
  OPF_COMMUTATIVE = 1u << 5,  /* inputs 0 and 1 may be swapped */
  OPF_BROADCAST = 1u << 6,    /* inputs broadcast numpy-style */
  OPF_NOOP = 1u << 7,         /* output equals input 0; removed at import */
  OPF_OPAQUE = 1u << 8,       /* carried through untouched; no kernels */
  OPF_WEIGHT_ONLY = 1u << 9,  /* meant to be applied to weights (enlarge) */
  OPF_INT64_OUT = 1u << 10,   /* every output holds int64 (indices: argmax, argmin) */
  OPF_NO_COPIES = 1u << 11,   /* layout only, one input, and no element of it in two places
                                 of the outputs: moves or parts, never copies (a gather's
                                 copies depend on its indices, so it has none) */
};

/* ---- parameters ---- */

#define TEQ_MAX_PARAMS 6
#define TEQ_MAX_PARAM_LEN 8

typedef enum ParamType {
  PARAM_INT,   /* one integer, i[0] */
  PARAM_INTS,  /* a list of n integers, i[0..n) */
  PARAM_FLOAT, /* one real, f */
} ParamType;

typedef struct OpParam {
  const char *name;      /* spelling in S-expressions and messages: "stride" */
  ParamType type;
  int len;               /* PARAM_INTS: the exact length, or 0 for 0..TEQ_MAX_PARAM_LEN */
  int64_t def;           /* default of each integer element */
  double fdef;           /* default of a PARAM_FLOAT */
  int64_t lo, hi;        /* inclusive bounds of each integer element */
  const char *const *symbols; /* names of values 0, 1, ... (an enum), NULL-ended; or NULL */
  const char *onnx_attr; /* ONNX attribute mapped one to one, or NULL */
  bool counts_parts;     /* the value counts independent parts of the work (conv's groups):
                            an instance with fewer parts and no larger inputs does a part of
                            this one's work (the cost model's bounds rely on it) */
  bool adds_work;        /* a value other than 0 adds work to the instance with 0 (a
                            fused activation), for the same bounds */
  bool parts_slice_input; /* with counts_parts: each part reads its own slice of input 0's
                            axis 1 (conv's groups), so one part over such a slice, with all
                            the other inputs as they are, does the same work; no estimate of
                            an instance falls below that one's */
  bool quiet_default;    /* params_format leaves it out at its default, even when asked for
                            every value: a parameter added later (conv's pool), so that the
                            configuration keys of measured cost tables still name the same
                            configurations */
} OpParam;

typedef struct ParamValue {
  int32_t n;                    /* number of integers set (1 for PARAM_INT) */
  int32_t unused;               /* kept zero so the block compares as bytes */
  int64_t i[TEQ_MAX_PARAM_LEN];
  double f;
} ParamValue;

typedef struct Params {
  ParamValue v[TEQ_MAX_PARAMS]; /* indexed like the row's params */
} Params;

/* Values of a fused activation parameter ("act") shared by conv, matmul
 * and batchnorm: TASO's three, and the activations that follow the
 * convolutions of mobile networks (EfficientNet's silu, MobileNetV3's
 * hard swish and its squeeze-and-excitation gates' hard sigmoid, x/6 + 1/2
 * clamped to [0, 1], MobileNetV2's relu6, a clip to [0, 6]), which a
 * convolution's epilogue applies in the pass that adds its bias. The hard
 * sigmoid of ONNX's default parameters, x/5 + 1/2 clamped, is the gate
 * Paddle's and Keras's squeeze-and-excitation blocks export. */
enum {
  ACT_NONE, ACT_RELU, ACT_SIGMOID, ACT_TANH, ACT_SILU, ACT_HARD_SWISH, ACT_RELU6,
  ACT_HARD_SIGMOID, ACT_HARD_SIGMOID_FIFTH, ACT__COUNT
};
extern TEQ_API const char *const act_symbols[];
struct Node;
/* The operator a fused activation stands for (OP_RELU for ACT_RELU,
 * OP_CLIP for ACT_RELU6, ...; OP__COUNT for ACT_NONE) and its parameters
 * (clip's bounds, hard sigmoid's 1/6 or 1/5 and 1/2; the row's defaults for
 * the others). */
TEQ_API OpKind act_op_kind(int act);
TEQ_API void act_op_params(int act, Params *p);
/* The activation node n computes when fused into its producer: ACT_NONE
 * where it is none (a clip to other bounds, a node of another kind). */
TEQ_API int act_of_node(const struct Node *n);
/* Whether n max-pools its own output after its epilogue (conv2d's pool):
 * its output is then no longer its product's, so no bias, activation,
 * residual or BatchNorm after it may move into its epilogue, and a rewrite
 * that reads its output as the product's (linear, split by channel) does
 * not apply. */
TEQ_API bool op_output_pooled(const struct Node *n);
/* n without its pool, in *unpooled, and the operator (*pool, *pool_params)
 * that pools its output as n does: how a runtime runs n wherever the pool
 * does not fuse into the way. False when n has no pool. */
TEQ_API bool op_unpooled_twin(const struct Node *n, Params *unpooled, OpKind *pool,
                              Params *pool_params);

/* n without its epilogue, for an operator that can fuse one (a parameter
 * with adds_work): its optional inputs (a bias) dropped, *n_bare_in the
 * inputs left, and its fused activation none, in *bare; *pass and
 * *pass_params the element-wise operator one pass of the epilogue over
 * the output costs like (the fused activation's, a relu6's clip with its
 * bounds; a relu's for a bias alone). False when n has no epilogue. */
TEQ_API bool op_bare_twin(const struct Node *n, Params *bare, int *n_bare_in, OpKind *pass,
                          Params *pass_params);

/* How many ways an operator's half_twin may halve its work. */
#define OP_HALF_WAYS 2

/* ---- the row ---- */

struct CudaCtx;
struct CudaTensor;
struct OnnxNodeIn;
struct OnnxNodeOut;

typedef struct OpDef {
  OpKind kind;             /* equals its index in the table (checked) */
  const char *name;        /* the one spelling: S-expressions, ruledb keys, DOT, errors */
  const char *axiom_name;  /* symbol in specs/ops.axioms; NULL: uninterpreted */
  const char *onnx_op;     /* ONNX op_type written on export and read on import, or NULL */
  const char *const *onnx_aliases; /* further op_types imported as this kind, NULL-ended */
  int onnx_opset;          /* the opset its ONNX form needs (born after 13); 0: any */
  int n_in_min, n_in_max;  /* n_in_max -1: any number (concat) */
  int n_out_min, n_out_max;
  const OpParam *params;
  int n_params;
  unsigned flags;

  /* Output shapes of n from its input shapes. Fills out[0..n->n_out) or
   * returns TEQ_ERR_INPUT with a message naming the bad parameter or shape
   * (the caller adds which node). NULL only for OPF_OPAQUE. */
  int (*infer_shape)(const struct Node *n, const Shape *in, Shape *out, Diag *d);

  /* Kernels. Outputs are allocated by the caller at the inferred shapes and
   * of the mode's dtype (DT_F32 or DT_MODP). A float32 kernel must write
   * every output element: the executor does not clear them (sanitizer builds
   * fill them with NaN so tests catch a kernel that skips some). Z_p outputs
   * are zero-filled. Inputs are of
   * the same dtype except integer index inputs, which stay DT_I64. Return
   * TEQ_OK, or an error with a message (a kernel may refuse a configuration
   * it does not support, e.g. non-integer values in Z_p). */
  int (*eval_f32)(const struct Node *n, Tensor *const *in, Tensor *const *out, Diag *d);
  int (*eval_modp)(const struct Node *n, Tensor *const *in, Tensor *const *out, Diag *d);

  /* The Z_p kernel at chosen positions of output 0 only: vals[k] is what
   * eval_modp writes at flat position pos[k] (each in range, in any order,
   * repeats allowed). For operators whose every output element is a long
   * sum over the inputs (conv, matmul): PET's random tests read a few
   * positions per box of an output, and a few sums cost a sliver of the
   * whole product (exec_points). NULL: none, the operator runs whole. */
  int (*eval_modp_at)(const struct Node *n, Tensor *const *in, const int64_t *pos, int64_t n_pos,
                      uint32_t *vals, Diag *d);

  /* The float32 kernel on the GPU (runtime/cuda/, see cuda_int.h there):
   * eval_f32's contract with its tensors in device memory, launched on the
   * context's stream without waiting. Set as CUDA_EVAL(name), which is
   * NULL in builds without CUDA. Source rows have none: plans upload
   * constants, and compute the constant tensors (C_pool...) on the host. */
  int (*eval_cuda)(const struct Node *n, struct CudaCtx *cx, const struct CudaTensor *in,
                   const struct CudaTensor *out, Diag *d);

  /* Floating-point operations of one run of n at input shapes `in`, for
   * the analytical cost model; NULL: one per output element. Rows whose
   * work grows faster than their data (conv, matmul) set it. */
  double (*flops)(const struct Node *n, const Shape *in);

  /* Rewrites n's parameters into the one spelling of what they mean at
   * input shapes `in`, where two spellings mean the same (a transpose whose
   * perm reverses the axes is the default perm), so that rewrite rules,
   * which use one spelling, match either. NULL: every spelling is unique. */
  void (*canonical)(struct Node *n, const Shape *in);

  /* Whether output `out` of n, at input shapes `in`, is a run of input 0's
   * elements in their order (a reshape; a split or slice that cuts whole
   * rows; a gather of one constant index), so that it needs no kernel, only
   * a pointer into input 0: true, with *first the element it starts at.
   * consts[j] is input j's value where that input is a constant, else NULL
   * (consts itself may be NULL). NULL: never. Callers ask op_view, which
   * adds the alignment rule. */
  bool (*view)(const struct Node *n, const Shape *in, const struct Tensor *const *consts, int out,
               int64_t *first);

  /* For a layout operator (OPF_LAYOUT_ONLY) that moves elements in a way
   * a view cannot say (a transpose): which input element output 0's flat
   * element f is, with *input set to its input, at input shapes `in`;
   * -1 for a zero the operator writes itself (padding).
   * A plan that follows a few positions through the layout (exec_points)
   * asks this instead of running the kernel over the whole tensor twice
   * to learn where every element went. NULL: the kernel is run. */
  int64_t (*source_of)(const struct Node *n, const Shape *in, int64_t f, int *input);

  /* The other way round: whether n's output 0, at input shapes `in`, is
   * its inputs laid end to end, input j a run of it from element first[j]
   * on (a concat whose extents before its axis are all 1), so that each
   * input's producer could write its run in place and n need no kernel.
   * NULL: never. Callers ask graph_node_in_place, which adds the rules
   * about the producers. */
  bool (*assembled)(const struct Node *n, const Shape *in, int64_t *first);

  /* For a layout operator that reads its input through other strides (a
   * transpose reorders its axes, a slice steps through a box of it):
   * output 0, at input shapes `in`, read straight from input 0. from:
   * input 0's element strides, one per axis of in[0]; to receives output
   * 0's and *first the element of input 0's layout its element 0 is.
   * False where strides cannot say it (a slice walking backwards). A
   * runtime that lays values out by plan then gives it no kernel where
   * every reader reads it strided (graph_strided). NULL: never. */
  bool (*strided)(const struct Node *n, const Shape *in, const int64_t *from, int64_t *to,
                  int64_t *first);

  /* Whether n's GPU kernel reads input j, of shape in[j], laid out with
   * element strides `strides` (one per axis) instead of densely: a
   * matmul's operand through cuBLAS's leading dimension and batch stride.
   * NULL: every input dense. */
  bool (*reads_strided)(const struct Node *n, const Shape *in, int j, const int64_t *strides);

  /* Whether n's GPU kernel writes its output 0 (n's output shape) laid
   * out with element strides `strides` into memory another value owns: a
   * matmul's product through cuBLAS's ldc and batch stride, straight into
   * the transpose that alone reads it. NULL: it writes dense. */
  bool (*writes_strided)(const struct Node *n, const Shape *in, const int64_t *strides);

  /* Whether n does nothing but put zeros around input 0: true, with pads
   * (2 x rank values, ONNX order: every axis's begin, then every axis's
   * end, none negative). A constant Pad of 0 is one. NULL: never. */
  bool (*zero_pad)(const struct Node *n, int rank, int64_t *pads);

  /* The other side: whether n, reading input 0 with those zeros around
   * it, computes the same as it would with parameters *p (n's own, the
   * padding taken in) reading input 0 bare: a convolution's padding is of
   * zeros, an average pool's counts as input where count_include_pad says
   * so. NULL: never. Callers ask op_takes_pad. */
  bool (*take_zero_pad)(const struct Node *n, int rank, const int64_t *pads, Params *p);

  /* Another kind whose measured costs predict this one's, because both run
   * the same kernel (gemm is matmul's BLAS call, plus a bias add where it
   * has one): the cost model corrects estimates of either with
   * measurements of both. 0 (OP_INPUT, never computed): only its own. */
  OpKind cost_family;

  /* The operator of kind cost_family that does exactly n's work at input
   * shapes `in`, where there is one: its parameters (*p, which the caller
   * sets to the family's defaults first) and its input shapes (twin_in,
   * *n_twin_in of them, at most 4). A gemm without a bias is a matmul of
   * its operands in their plain layouts. The cost model prices an
   * unmeasured n as its twin, so that the spellings of one product tie
   * until a measurement tells them apart. NULL, or false: none. */
  bool (*cost_twin)(const struct Node *n, const Shape *in, Params *p, Shape *twin_in,
                    int *n_twin_in);

  /* The parameters (*p) and input shapes (part_in, *n_part_in of them) of
   * the same operator with the smallest kernel, doing a part of n's work at
   * input shapes `in`: a conv's 1x1 twin (no padding or dilation) on the
   * same input, where it has no more output pixels than n, each doing one
   * of the taps n does at one of its pixels; with n's bias, activation
   * and residual where it has as many pixels, else bare. The cost model
   * holds an unmeasured estimate to at least that twin's: a kernel
   * enlarged with zeros (TASO's enlarge) does all the work of the kernel it
   * holds, and more. NULL, or false: none. */
  bool (*one_tap_twin)(const struct Node *n, const Shape *in, Params *p, Shape *part_in,
                       int *n_part_in);

  /* The input shapes (half_in, n->n_in of them) at which the same operator,
   * with the same parameters, does half of n's work at input shapes `in`,
   * one way of OP_HALF_WAYS to halve it: half the output columns of a
   * product; half the output channels of a conv (way 0) or half its output
   * rows or columns (way 1), so that two such halves do all of it. The cost model
   * holds an unmeasured estimate to at most twice its cheapest half: a GPU
   * can always run the two, and the neighbours that correct the roofline
   * otherwise can price one product of 16 MB above two of 8 MB, which
   * hides every merge of products from a search. NULL, or false (an odd
   * extent, a way the operator lacks): none. */
  bool (*half_twin)(const struct Node *n, const Shape *in, int way, Shape *half_in);

  /* The index of an optional input added element-wise to the output before
   * the fused activation (conv2d's residual Z), 0 for none. The optional
   * inputs before it are per-channel vectors (a bias: zeros of the output's
   * axis 1 hold the place of one the node lacks). graph_fuse_residuals
   * folds an add into it; the cost model prices an unmeasured node with it
   * as the same node without it, plus one more read of it: the epilogue
   * adds it while the output is in cache. */
  int residual_input;

  /* The constant that leaves a binary element-wise operator's other input
   * as it is, where input j may hold it (bit j of neutral_inputs): x + 0,
   * x - 0, x * 1, x / 1. Exporters write such nodes (Paddle's swish is
   * x * sigmoid(x * 1.0)); import drops one whose constant is that value
   * everywhere and does not widen the other input's shape. Exact but for
   * a zero's sign: -0 + 0 is +0. neutral_inputs 0: none. */
  unsigned neutral_inputs;
  double neutral;

  /* The inputs a model holds as weights wherever it uses the operator (bit
   * j: input j; a conv's filter and bias), 0 for none. A runtime may
   * derive from a constant once per plan (the GPU's Winograd filters), so
   * the profiler holds these inputs as constants, as a model's plan does,
   * and a cost table prices what a model runs. */
  unsigned weight_inputs;

  /* OPF_NONLINEAR: the fixed polynomial that stands in for the operator in
   * Z_p (TASO used x(x+1)+1 for relu); a different one for each operator. */
  uint32_t (*modp_standin)(uint32_t x);

  /* ONNX. Parameters with an onnx_attr are read and written generically;
   * these hooks handle the rest: attributes that need conversion, inputs
   * that are really parameters (a Reshape's shape), extra checks, and on
   * export a different op_type or a following activation node. NULL: the
   * generic mapping is all. */
  int (*onnx_read)(struct OnnxNodeIn *in, Params *p, Diag *d);
  int (*onnx_write)(const struct Node *n, struct OnnxNodeOut *out, Diag *d);

  const void *family;      /* private to the family file (e.g. a scalar function) */
} OpDef;

/* The row of a kind; kind must be valid. */
TEQ_API const OpDef *op_def(OpKind kind);
/* Lookup by name (S-expressions, --ops lists); -1 if none. */
TEQ_API int op_by_name(const char *name);
/* Lookup by ONNX op_type, including aliases; -1 if none. */
TEQ_API int op_by_onnx(const char *op_type);
/* Checks the whole table: kinds match indices, names unique, bounds
 * ordered, every non-opaque row has shape inference and both kernels.
 * Returns TEQ_OK or TEQ_ERR_INTERNAL with a message per problem. */
TEQ_API int op_registry_check(Diag *d);

/* Every buffer a runtime allocates starts at a multiple of OP_ARENA_ALIGN
 * bytes; a view or a piece written in place (below) at a multiple of
 * OP_PLACE_ALIGN only. The producers writing a piece and the readers of a
 * view take the pointers they are given: the element-wise kernels test for
 * float4 alignment at run time, cuBLAS and cuBLASLt are told each
 * operand's alignment, and cuDNN's algorithms are searched with the plan's
 * own pointers and remembered by their alignments (runtime/cuda/conv.cu).
 * At 256 bytes, 30 of NasNet-A's 44 concats stayed copies (88 channels of
 * 14x14 start 68,992 bytes apart) and so did splits of such channel counts
 * (a split [1,512,17,17] into 160 and 352 channels: 184,960 bytes). */
#define OP_ARENA_ALIGN 256
#define OP_PLACE_ALIGN 16

/* Whether every output of n (at input shapes `in`) is a view of input 0
 * that a runtime may alias instead of computing: the row's view hook says
 * so (consts as the hook takes them) and each one starts a multiple of
 * OP_PLACE_ALIGN bytes into input 0. first (NULL, or n->n_out entries)
 * receives each output's first element. The cost model charges such a
 * node nothing and the GPU planner gives it no kernel, so both must ask
 * here. */
TEQ_API bool op_view(const struct Node *n, const Shape *in, const struct Tensor *const *consts,
                     int64_t *first);

/* Whether n's output is its inputs laid end to end (the row's assembled
 * hook), each run starting a multiple of OP_PLACE_ALIGN bytes into it;
 * first (NULL, or n->n_in entries) receives where each starts. */
TEQ_API bool op_assembled(const struct Node *n, const Shape *in, int64_t *first);

/* Whether reader, if it reads pad's output as its input 0 and nowhere
 * else (the caller's to check), computes the same reading pad's input
 * bare with parameters *p: pad only puts zeros around its input (the
 * row's zero_pad hook) and reader's window takes them in (take_zero_pad).
 * The importer folds such Pads (Inception-v3's, before average pools that
 * count the padding) so that no kernel writes the padded copy. */
TEQ_API bool op_takes_pad(const struct Node *reader, const struct Node *pad, Params *p);

/* Whether gather n, reading data of shape `data` at the constant indices
 * `indices` (NULL: not a constant), takes one index: *axis and *k (a
 * negative index counted from the end), as PyTorch's select exports. Its
 * view (op_view) and PET's hoisting of attention's heads
 * (optimize/pet/post.c) both ask here. */
TEQ_API bool op_gather_one(const struct Node *n, const Shape *data,
                           const struct Tensor *indices, int64_t *axis, int64_t *k);

/* ---- parameter access ---- */

/* Index of a parameter by name in kind's row, or -1. */
TEQ_API int param_index(OpKind kind, const char *name);
/* Fills p with the defaults of kind's row (and zeroes the rest). */
TEQ_API void params_default(OpKind kind, Params *p);
/* Checks every parameter against its bounds and length; messages name the
 * parameter and the allowed range. */
TEQ_API int params_check(OpKind kind, const Params *p, Diag *d);
/* h mixed with the values p holds (each parameter's count, its integers
 * and its real), not with the unused tail of each value: a structural hash
 * of every node of every graph a search builds hashes parameters, and the
 * whole block is 480 bytes. */
TEQ_API uint64_t params_hash(uint64_t h, const Params *p);
/* Convenience accessors by row index. */
static inline int64_t param_int(const Params *p, int i) { return p->v[i].i[0]; }
static inline double param_float(const Params *p, int i) { return p->v[i].f; }
TEQ_API void param_set_int(Params *p, int i, int64_t v);
TEQ_API void param_set_ints(Params *p, int i, const int64_t *v, int n);
TEQ_API void param_set_float(Params *p, int i, double v);
/* "stride=(1 1) pads=(0 0 0 0) act=relu", with only non-default values when
 * only_changed; returns the length that was needed, as snprintf does. */
TEQ_API int params_format(OpKind kind, const Params *p, bool only_changed, char *buf, size_t size);
/* The inverse: parameters from params_format's text (any subset, the rest
 * default), checked; an unknown name or malformed value is an error. */
TEQ_API int params_parse(OpKind kind, const char *text, Params *p, Diag *d);

#endif
