/* PLACEHOLDER: rows without kernels until this family lands. */
#include "runtime/ops/family.h"

const OpDef op_def_const_pool = {.kind = OP_CONST_POOL, .name = "const_pool", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_const_iconv = {.kind = OP_CONST_ICONV, .name = "const_iconv", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_const_imm = {.kind = OP_CONST_IMM, .name = "const_imm", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
const OpDef op_def_const_one = {.kind = OP_CONST_ONE, .name = "const_one", .n_in_max = -1, .n_out_min = 1, .n_out_max = 1, .flags = OPF_OPAQUE};
