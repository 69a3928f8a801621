/* source.c: the bookkeeping kinds. Graph inputs and constants have no
 * kernel (the executor feeds them), opaque nodes carry an ONNX operator
 * Teq has no semantics for, and identity is the no-op that import removes
 * (ONNX Identity and Dropout, which is the identity at inference). */
#include <string.h>

#include "runtime/ops/family.h"

/* Input and constant shapes are set when the node is made; inference keeps
 * them. */
static int infer_keep(const Node *n, const Shape *in, Shape *out, Diag *d) {
  (void)n; (void)in; (void)out; (void)d;
  return TEQ_OK;
}

const OpDef op_def_input = {
  .kind = OP_INPUT, .name = "input",
  .n_in_min = 0, .n_in_max = 0, .n_out_min = 1, .n_out_max = 1,
  .flags = OPF_SOURCE,
  .infer_shape = infer_keep,
};

const OpDef op_def_const = {
  .kind = OP_CONST, .name = "const",
  .n_in_min = 0, .n_in_max = 0, .n_out_min = 1, .n_out_max = 1,
  .flags = OPF_SOURCE,
  .infer_shape = infer_keep,
};

const OpDef op_def_opaque = {
  .kind = OP_OPAQUE, .name = "opaque",
  .n_in_min = 0, .n_in_max = -1, .n_out_min = 1, .n_out_max = 1 << 16,
  .flags = OPF_OPAQUE,
};

static int identity_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)n; (void)d;
  memcpy(out[0]->data, in[0]->data, tensor_bytes(in[0]));
  return TEQ_OK;
}

static const char *const identity_aliases[] = {"Dropout", NULL};

static int identity_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  (void)p;
  /* Dropout's mask output and training-mode inputs have no inference
   * meaning; only its first output may be used. */
  if (onnx_in_n_outputs(v) > 1)
    return onnx_in_unsupported(v, d, "Dropout with a mask output is not supported");
  for (int i = 1; i < onnx_in_n_inputs(v); i++) onnx_in_consume_input(v, i);
  return TEQ_OK;
}

const OpDef op_def_identity = {
  .kind = OP_IDENTITY, .name = "identity", .axiom_name = "id",
  .onnx_op = "Identity", .onnx_aliases = identity_aliases,
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .flags = OPF_NOOP | OPF_ELEMENTWISE | OPF_LAYOUT_ONLY | OPF_MULTILINEAR,
  .infer_shape = infer_like_input0,
  .eval_f32 = identity_eval, .eval_modp = identity_eval, .eval_cuda = CUDA_EVAL(identity),
  .onnx_read = identity_onnx_read,
};
