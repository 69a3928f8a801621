/* PLACEHOLDER: rows without kernels until this family lands. */
#include "runtime/ops/family.h"

const OpDef op_def_transpose = {.kind = OP_TRANSPOSE, .name = "transpose", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_reshape = {.kind = OP_RESHAPE, .name = "reshape", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_concat = {.kind = OP_CONCAT, .name = "concat", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_split = {.kind = OP_SPLIT, .name = "split", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_pad = {.kind = OP_PAD, .name = "pad", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_slice = {.kind = OP_SLICE, .name = "slice", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_gather = {.kind = OP_GATHER, .name = "gather", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
