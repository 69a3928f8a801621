/* PLACEHOLDER: rows without kernels until this family lands. */
#include "runtime/ops/family.h"

const OpDef op_def_conv2d = {.kind = OP_CONV2D, .name = "conv2d", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_enlarge = {.kind = OP_ENLARGE, .name = "enlarge", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_batchnorm = {.kind = OP_BATCHNORM, .name = "batchnorm", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
