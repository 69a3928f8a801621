/* PLACEHOLDER: rows without kernels until this family lands. */
#include "runtime/ops/family.h"

const OpDef op_def_softmax = {.kind = OP_SOFTMAX, .name = "softmax", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_reduce_mean = {.kind = OP_REDUCE_MEAN, .name = "reduce_mean", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_reduce_sum = {.kind = OP_REDUCE_SUM, .name = "reduce_sum", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_reduce_max = {.kind = OP_REDUCE_MAX, .name = "reduce_max", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
