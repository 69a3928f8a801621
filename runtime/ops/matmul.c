/* PLACEHOLDER: rows without kernels until this family lands. */
#include "runtime/ops/family.h"

const OpDef op_def_matmul = {.kind = OP_MATMUL, .name = "matmul", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_gemm = {.kind = OP_GEMM, .name = "gemm", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
