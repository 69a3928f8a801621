/* PLACEHOLDER: rows without kernels until this family lands. */
#include "runtime/ops/family.h"

const OpDef op_def_maxpool = {.kind = OP_MAXPOOL, .name = "maxpool", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_avgpool = {.kind = OP_AVGPOOL, .name = "avgpool", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_global_avgpool = {.kind = OP_GLOBAL_AVGPOOL, .name = "global_avgpool", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_global_maxpool = {.kind = OP_GLOBAL_MAXPOOL, .name = "global_maxpool", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
