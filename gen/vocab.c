/* vocab.c: what gen-rules enumerates over: typed variables with symbolic
 * shapes, two shape assignments, and the operator templates.
 *
 * The default is TASO's Table 1: ewadd, ewmul, smul, transpose, matmul,
 * conv 3x3/1x1/1x3 with and without a fused relu (grouped when the weight
 * has fewer input channels than the activation), enlarge, relu, avg and max
 * pool 3x3, concat and split along every axis, and the constant tensors
 * C_pool, I_conv, I_matmul and I_ewmul. A template is an operator of the
 * registry with its parameters fixed, or derived at evaluation from the
 * input shapes (conv groups, split sizes) and the assignment (a constant's
 * extents), so the same graph evaluates at both assignments.
 *
 * The assignments are chosen so that no extent equals another by accident
 * at both: a graph that type-checks at A only (a concat of two 3x4
 * matrices used where a 6x4 is needed) fails at B and is reported as
 * shape-specific instead of becoming a rule. */
#include <stdio.h>
#include <string.h>

#include "gen/gen_int.h"

/* M, K: matrices (K2 = 2K: a matrix two of them wide); N, C, H, W: images;
 * B: the batch of batched matrices. */
static const int64_t assignment[GEN_N_SHAPES][SYM__COUNT] = {
  [SHAPE_A] = {[SYM_M] = 3, [SYM_K] = 4, [SYM_K2] = 8, [SYM_N] = 2, [SYM_C] = 4, [SYM_H] = 4,
               [SYM_W] = 5, [SYM_B] = 2},
  [SHAPE_B] = {[SYM_M] = 5, [SYM_K] = 3, [SYM_K2] = 6, [SYM_N] = 3, [SYM_C] = 6, [SYM_H] = 5,
               [SYM_W] = 4, [SYM_B] = 3},
};

#define S(sym) ((int8_t)(-(SYM_##sym) - 1))

/* Which classes a vocabulary needs.
 *
 * Three variables of a class reach most rules of three operators, but a
 * depth-3 graph of binary operators reads up to four tensors. Images get
 * four: concat(ewadd(a, b), ewadd(c, d)) = ewadd(concat(a, c), concat(b, d))
 * is how two convolutions with their own biases merge (SqueezeNet's fire
 * modules), and with three images the rules have it only where two of the
 * four are one tensor. (Enumeration time grows by a fifth.)
 *
 * A wide matrix y is two matrices side by side, so a split halves it into
 * operands of the x's: ewadd(split(y).0, a), ewadd(split(y).1, b) =
 * split(ewadd(y, concat(a, b))) is how the adds of the constants that
 * follow a merged product become one (NasRNN's first step). */
enum { NEED_CONV = 1, NEED_SCALAR = 2, NEED_BATCH = 4, NEED_SPLIT = 8 };

typedef struct ClassDef {
  char prefix;
  int count;
  bool weight;
  SymShape shape;
  unsigned need; /* 0: always */
} ClassDef;

static const ClassDef class_defs[] = {
  {'x', 3, false, {2, {S(M), S(K)}}, 0},                 /* activations as matrices */
  {'y', 1, false, {2, {S(M), S(K2)}}, NEED_SPLIT},       /* one as wide as two (halves) */
  {'w', 3, true, {2, {S(K), S(K)}}, 0},                  /* square weight matrices */
  {'i', 4, false, {4, {S(N), S(C), S(H), S(W)}}, 0},     /* images */
  {'k', 3, true, {4, {S(C), S(C), 3, 3}}, NEED_CONV},    /* 3x3 kernels */
  {'p', 2, true, {4, {S(C), S(C), 1, 1}}, NEED_CONV},    /* 1x1 kernels */
  {'q', 2, true, {4, {S(C), S(C), 1, 3}}, NEED_CONV},    /* 1x3 kernels */
  {'d', 1, true, {4, {S(C), 1, 3, 3}}, NEED_CONV},       /* a depthwise kernel */
  {'s', 2, true, {0, {0}}, NEED_SCALAR},                 /* scalars */
  {'b', 2, false, {3, {S(B), S(M), S(K)}}, NEED_BATCH},  /* batched matrices */
  {'u', 2, true, {3, {S(B), S(K), S(K)}}, NEED_BATCH},   /* batched weights */
};

Shape gen_var_shape(const GenVocab *v, int var, int shape) {
  const SymShape *s = &v->vars[var].shape;
  int64_t dims[4];
  for (int i = 0; i < s->ndim; i++)
    dims[i] = s->d[i] >= 0 ? s->d[i] : v->dims[shape][-s->d[i] - 1];
  return shape_make(s->ndim, dims);
}

/* ---- templates ---- */

typedef struct Builder {
  GenVocab *v;
  Diag *d;
  int rc;
} Builder;

static GenTemplate *add(Builder *b, OpKind kind, const char *name) {
  if (b->v->n_templates == GEN_MAX_TEMPLATES) {
    b->rc = diag_error(b->d, "gen-rules: more than %d operator templates", GEN_MAX_TEMPLATES);
    return NULL;
  }
  GenTemplate *t = &b->v->t[b->v->n_templates++];
  memset(t, 0, sizeof *t);
  t->kind = kind;
  snprintf(t->name, sizeof t->name, "%s", name);
  t->n_in = (uint8_t)op_def(kind)->n_in_min;
  t->n_out = 1;
  t->axis = -1;
  return t;
}

static void add_conv(Builder *b, int kh, int kw, int dilation) {
  const char *ks = kh == 3 && kw == 3 ? "k3" : kh == 1 && kw == 1 ? "k1" : "k13";
  for (int act = ACT_NONE; act <= ACT_RELU; act++) {
    char name[32];
    snprintf(name, sizeof name, "conv2d[%s%s%s]", ks, dilation > 1 ? " dilated" : "",
             act ? " relu" : "");
    GenTemplate *t = add(b, OP_CONV2D, name);
    if (!t) return;
    t->n_in = 2;
    t->rank = 4;
    t->flags = T_ACT_INPUT;
    t->kh = (int8_t)kh, t->kw = (int8_t)kw;
    t->act = (int8_t)act;
    t->dilation = (int8_t)dilation;
    t->bound = BR_CONV;
  }
}

static void add_binary(Builder *b, OpKind k) {
  GenTemplate *t = add(b, k, op_def(k)->name);
  if (t) t->flags = T_COMMUTATIVE | T_SAME_SHAPE, t->bound = BR_SAME;
}

static void add_smul(Builder *b, OpKind k) {
  GenTemplate *t = add(b, k, "smul");
  if (t) t->flags = T_SCALAR_IN1, t->bound = BR_SAME;
}

static void add_transpose(Builder *b, OpKind k) {
  GenTemplate *t = add(b, k, "transpose");
  if (t) t->rank = 2, t->bound = BR_TRANSPOSE;
}

static void add_matmul(Builder *b, OpKind k) {
  GenTemplate *t = add(b, k, "matmul");
  if (t) t->rank = 2, t->flags = T_DISTINCT, t->bound = BR_MATMUL;
}

static void add_convs(Builder *b, OpKind k) {
  (void)k;
  add_conv(b, 3, 3, 1);
  add_conv(b, 1, 1, 1);
  add_conv(b, 1, 3, 1);
}

static void add_enlarge(Builder *b, OpKind k) {
  GenTemplate *t = add(b, k, "enlarge");
  if (t) t->rank = 4, t->flags = T_VAR_INPUT, t->kh = 3, t->kw = 3;
}

static void add_pool(Builder *b, OpKind k) {
  GenTemplate *t = add(b, k, op_def(k)->name);
  if (t) t->rank = 4, t->flags = T_ACT_INPUT, t->kh = 3, t->kw = 3, t->bound = BR_POOL;
}

/* gemm with a transposed operand: the layouts of a matrix product. A
 * transpose feeding a matmul can then be absorbed into the product's
 * flags or left materialised, and the optimizer weighs both (TASO's joint
 * optimisation of substitutions and layouts). gemm without transposes is
 * matmul and is not enumerated twice. */
static void add_gemm(Builder *b, OpKind k) {
  static const char *const names[] = {"", "gemm[tA]", "gemm[tB]", "gemm[tA tB]"};
  for (int trans = 1; trans <= 3; trans++) {
    GenTemplate *t = add(b, k, names[trans]);
    if (!t) return;
    t->n_in = 2, t->rank = 2, t->flags = T_DISTINCT, t->bound = BR_GEMM;
    t->trans = (int8_t)trans;
  }
}

/* concat and split, one template per axis. */
static void add_axes(Builder *b, OpKind k) {
  for (int axis = 0; axis < 4; axis++) {
    char name[32];
    snprintf(name, sizeof name, "%s[axis=%d]", op_def(k)->name, axis);
    GenTemplate *t = add(b, k, name);
    if (!t) return;
    t->axis = (int8_t)axis;
    if (op_def(k)->n_out_max > 1) t->n_out = 2, t->flags = T_BOUNDARY, t->bound = BR_SPLIT;
    else t->n_in = 2, t->bound = BR_CONCAT;
  }
}

/* Constant tensors: extents from the assignment. */
static void add_source(Builder *b, OpKind k, int source, const char *name) {
  GenTemplate *t = add(b, k, name);
  if (t) t->source = (int8_t)source, t->kh = 3, t->kw = 3;
}
static void add_const_pool(Builder *b, OpKind k) { add_source(b, k, TP_POOL_C, "const_pool"); }
static void add_const_iconv(Builder *b, OpKind k) { add_source(b, k, TP_ICONV_C, "const_iconv"); }
static void add_const_imm(Builder *b, OpKind k) { add_source(b, k, TP_IMM_K, "const_imm"); }
static void add_const_one(Builder *b, OpKind k) {
  add_source(b, k, TP_ONE_IMAGE, "const_one[image]");
  add_source(b, k, TP_ONE_MATRIX, "const_one[matrix]");
}

/* A unary element-wise operator: relu, and extras such as sigmoid. */
static void add_unary(Builder *b, OpKind k) {
  GenTemplate *t = add(b, k, op_def(k)->name);
  if (t) t->bound = BR_SAME;
}

/* TASO's Table 1, in the order templates are tried, with how each kind
 * becomes templates. */
static const struct {
  OpKind kind;
  void (*add)(Builder *b, OpKind k);
} default_kinds[] = {
  {OP_EWADD, add_binary}, {OP_EWMUL, add_binary}, {OP_SMUL, add_smul},
  {OP_TRANSPOSE, add_transpose}, {OP_MATMUL, add_matmul}, {OP_CONV2D, add_convs},
  {OP_ENLARGE, add_enlarge}, {OP_RELU, add_unary}, {OP_AVGPOOL, add_pool},
  {OP_MAXPOOL, add_pool}, {OP_CONCAT, add_axes}, {OP_SPLIT, add_axes},
  {OP_CONST_POOL, add_const_pool}, {OP_CONST_ICONV, add_const_iconv},
  {OP_CONST_IMM, add_const_imm}, {OP_CONST_ONE, add_const_one},
};
#define N_DEFAULT ((int)(sizeof default_kinds / sizeof default_kinds[0]))

static int default_index(OpKind k) {
  for (int i = 0; i < N_DEFAULT; i++)
    if (default_kinds[i].kind == k) return i;
  return -1;
}

/* Names that are not one registry operator: extra template sets. */
enum { EXTRA_BATCH_MATMUL = OP__COUNT, EXTRA_DILATED_CONV, EXTRA_MATMUL_RELU, EXTRA__END };
static const char *const extra_names[] = {"batch_matmul", "dilated_conv", "matmul_relu"};

static bool enumerable(OpKind k) {
  if (default_index(k) >= 0 || k == OP_GEMM) return true;
  const OpDef *def = op_def(k);
  /* Any unary element-wise operator with a Z_p kernel: sigmoid, tanh... */
  return (def->flags & OPF_ELEMENTWISE) && def->n_in_max == 1 && def->n_in_min == 1 &&
         def->eval_modp && !(def->flags & (OPF_NOOP | OPF_SOURCE | OPF_OPAQUE));
}

static int name_to_id(const char *name, Diag *d) {
  for (int i = 0; i < EXTRA__END - OP__COUNT; i++)
    if (!strcmp(name, extra_names[i])) return OP__COUNT + i;
  int k = op_by_name(name);
  if (k < 0) return diag_error(d, "--ops: unknown operator '%s'", name), -1;
  if (!enumerable((OpKind)k))
    return diag_error(d,
                      "--ops: gen-rules cannot enumerate '%s' (it takes TASO's operators, unary "
                      "element-wise operators, gemm, batch_matmul, dilated_conv and matmul_relu)",
                      name),
           -1;
  return k;
}

/* Parses --ops into chosen[id]: a plain list is the set; a list of +name
 * and -name items edits the default set. */
static int parse_ops(const char *ops, bool *chosen, Diag *d) {
  for (int i = 0; i < N_DEFAULT; i++) chosen[default_kinds[i].kind] = true;
  if (!ops) return TEQ_OK;
  if (!*ops) return diag_error(d, "--ops: empty list");
  bool edits = ops[0] == '+' || ops[0] == '-';
  if (!edits) memset(chosen, 0, EXTRA__END * sizeof *chosen);
  char buf[512];
  if (strlen(ops) >= sizeof buf) return diag_error(d, "--ops: list too long");
  strcpy(buf, ops);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char sign = tok[0] == '+' || tok[0] == '-' ? tok[0] : 0;
    if ((sign != 0) != edits)
      return diag_error(d, "--ops: '%s': either list operators or edit the default with "
                           "+name,-name, not both", tok);
    const char *name = tok + (sign ? 1 : 0);
    int id = name_to_id(name, d);
    if (id < 0) return TEQ_ERR_INPUT;
    chosen[id] = sign != '-';
  }
  return TEQ_OK;
}

int gen_vocab_build(GenVocab *v, const char *ops, Diag *d) {
  memset(v, 0, sizeof *v);
  memcpy(v->dims, assignment, sizeof v->dims);
  bool chosen[EXTRA__END] = {0};
  int rc = parse_ops(ops, chosen, d);
  if (rc) return rc;

  Builder b = {v, d, TEQ_OK};
  /* Default kinds first, in Table 1's order, then the extras by registry order. */
  for (int i = 0; i < N_DEFAULT; i++)
    if (chosen[default_kinds[i].kind]) default_kinds[i].add(&b, default_kinds[i].kind);
  for (int k = 0; k < OP__COUNT; k++)
    if (chosen[k] && default_index((OpKind)k) < 0)
      (k == OP_GEMM ? add_gemm : add_unary)(&b, (OpKind)k);
  if (chosen[EXTRA_DILATED_CONV]) add_conv(&b, 3, 3, 2);
  if (chosen[EXTRA_BATCH_MATMUL]) {
    GenTemplate *t = add(&b, OP_MATMUL, "matmul[batched]");
    if (t) t->rank = 3, t->flags = T_DISTINCT, t->bound = BR_MATMUL;
  }
  if (chosen[EXTRA_MATMUL_RELU]) {
    /* The matrix product with its fused relu (the registry's matmul act),
     * as TASO fuses an activation into its matmul: with relu chosen too,
     * the rules that fold a relu into the product it follows. */
    GenTemplate *t = add(&b, OP_MATMUL, "matmul[relu]");
    if (t) t->rank = 2, t->flags = T_DISTINCT, t->bound = BR_MATMUL, t->act = ACT_RELU;
  }
  GenTemplate *ident = add(&b, OP_IDENTITY, "ident");
  if (ident) ident->flags = T_IDENT;
  if (b.rc) return b.rc;
  if (v->n_templates == 1) return diag_error(d, "--ops: no operator chosen");

  unsigned need = 0;
  for (int i = 0; i < v->n_templates; i++) {
    OpKind k = v->t[i].kind;
    if (k == OP_CONV2D || k == OP_ENLARGE || k == OP_CONST_POOL || k == OP_CONST_ICONV)
      need |= NEED_CONV;
    if (k == OP_SMUL) need |= NEED_SCALAR;
    if (v->t[i].rank == 3) need |= NEED_BATCH;
    if (k == OP_SPLIT) need |= NEED_SPLIT;
  }
  for (size_t c = 0; c < sizeof class_defs / sizeof class_defs[0]; c++) {
    const ClassDef *cd = &class_defs[c];
    if (cd->need && !(cd->need & need)) continue;
    GenClass *cl = &v->classes[v->n_classes];
    cl->prefix = cd->prefix;
    cl->first = (int8_t)v->n_vars;
    cl->count = (int8_t)cd->count;
    for (int i = 0; i < cd->count; i++) {
      GenVar *var = &v->vars[v->n_vars++];
      snprintf(var->name, sizeof var->name, "%c%d", cd->prefix, (i + 1) % 100);
      var->cls = (int8_t)v->n_classes;
      var->weight = cd->weight;
      var->shape = cd->shape;
    }
    v->n_classes++;
  }
  for (int i = 0; i < v->n_templates; i++) v->op_seed[i] = hash_mix(0x6f70, (uint64_t)i + 1);
  return TEQ_OK;
}
