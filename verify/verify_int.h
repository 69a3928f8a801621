/* verify_int.h: shared by the files of verify/ only: the parsed axioms (operator
 * declarations, constants, axioms as terms over typed variables) and the
 * internal entry points of the prover, the evaluator and the checks.
 *
 * An axiom `forall vars. lhs = rhs when conds` is two terms and a list of
 * integer comparisons. Terms call declared operators: `conv2d[sh, sw, ...](x, w)`,
 * integer arguments in brackets, tensor arguments in parentheses. Each
 * declaration binds a symbol to a registry row (by its axiom_name), one of
 * its outputs, and the registry parameters its integer arguments stand for;
 * parameters a declaration does not name must keep their defaults, so an
 * axiom about a plain convolution never matches a dilated one. An instance
 * of an axiom asserts lhs = rhs only where both sides are well typed (the
 * registry's shape inference accepts them), have the same shape and the
 * conditions hold: that is the meaning validation checks and the prover
 * relies on. */
#ifndef TEQ_VERIFY_VERIFY_INT_H
#define TEQ_VERIFY_VERIFY_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/graph.h"
#include "runtime/ops.h"
#include "verify/verify.h"

#define AX_MAX_IARGS 12   /* integer arguments of one declaration */
#define AX_MAX_TARGS 3    /* tensor arguments of one declaration */
#define AX_MAX_VARS 16    /* variables of one axiom */
#define AX_MAX_DOMAIN 8   /* values validation tries for one integer variable */
#define AX_MAX_CONDS 8

typedef enum Sort { SORT_NONE, SORT_TENSOR, SORT_INT } Sort;

/* An operator symbol of the axioms. */
typedef struct AxDecl {
  char name[32];          /* the symbol in axioms: "split0" */
  char axiom_name[32];    /* the registry row's axiom_name: "split" */
  OpKind kind;
  int out, n_out;         /* which output of a node with n_out outputs */
  int n_iargs, n_targs;
  int8_t param[AX_MAX_IARGS]; /* registry parameter of each integer argument */
  int8_t elem[AX_MAX_IARGS];  /* its element in a list parameter, or -1 */
  int8_t list_len[TEQ_MAX_PARAMS]; /* list parameters: how many elements are named, else 0 */
  Params defaults;
  int line;
} AxDecl;

/* I_SHAPE (shape(x)) is not an integer: it may only be compared with = or
 * != against another shape(y) in a condition. */
typedef enum IKind {
  I_NUM, I_VAR, I_DIM, I_RANK, I_SHAPE, I_ADD, I_SUB, I_MUL, I_DIV, I_MOD, I_NEG
} IKind;

typedef struct IExpr {
  IKind kind;
  int64_t num;            /* I_NUM */
  int var;                /* I_VAR; I_DIM, I_RANK, I_SHAPE: the tensor variable */
  struct IExpr *a, *b;    /* operands; I_DIM: a is the axis */
} IExpr;

typedef struct Term {
  int decl;               /* index into Axioms.decls, or -1 for a variable */
  int var;                /* a tensor variable when decl < 0 */
  IExpr *iargs[AX_MAX_IARGS];
  struct Term *targs[AX_MAX_TARGS];
} Term;

typedef enum CmpOp { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE } CmpOp;

typedef struct Cond {
  CmpOp op;
  IExpr *a, *b;
} Cond;

typedef struct AxVar {
  char name[24];
  Sort sort;
  int n_domain;           /* integer variables: the values validation tries */
  int64_t domain[AX_MAX_DOMAIN];
} AxVar;

typedef struct Axiom {
  char name[48];
  int line;
  int n_vars;
  AxVar vars[AX_MAX_VARS];
  Term *lhs, *rhs;
  int n_conds;
  Cond conds[AX_MAX_CONDS];
  /* Which sides may serve as a trigger: every variable of the other side
   * (and of the conditions) is bound by matching it. */
  bool forward, backward;
} Axiom;

struct Axioms {
  char *path;
  char hash[17];
  int n_decls, n_axioms;
  AxDecl *decls;
  Axiom *axioms;
  void *arena;            /* every Term and IExpr, freed together */
};

/* ---- evaluation of integer expressions ---- */

/* Values of one axiom's variables during matching or validation. */
typedef struct Binding {
  bool bound[AX_MAX_VARS];
  int64_t ival[AX_MAX_VARS];
  int32_t cls[AX_MAX_VARS];      /* prover: e-class of a tensor variable */
  const Shape *shape[AX_MAX_VARS]; /* the shape of a tensor variable */
} Binding;

/* The value of e; false when it divides by zero or names an unbound or
 * out-of-range thing. */
bool iexpr_eval(const IExpr *e, const Binding *b, int64_t *v);
bool conds_hold(const Axiom *a, const Binding *b);
/* One condition of conds_hold (validation checks each as soon as its
 * variables are set). */
bool cond_holds(const Cond *c, const Binding *b);
/* Params of a node of decl with the given integer arguments. */
void decl_params(const AxDecl *decl, const int64_t *iargs, Params *p);
/* Whether p has decl's registry defaults everywhere decl names nothing,
 * and list parameters have the named length; then iargs receives the
 * named values. */
bool decl_matches(const AxDecl *decl, const Params *p, int64_t *iargs);
/* The declaration for output `out` of a node (kind, params), or -1. */
int axioms_decl_for(const Axioms *ax, OpKind kind, int out, int n_out, const Params *p);

/* Shape inference of one node through the registry row; false if it
 * refuses. in has n_in shapes; out receives output `out` of n_out. */
bool infer_output(OpKind kind, const Params *p, int n_in, const Shape *in, int n_out, int out,
                  Shape *result);

/* ---- Z_p counterexamples (refute.c) ---- */

/* Evaluates both sides on random inputs at their shapes; returns true and
 * a malloc'd description when some output differs. */
bool refute_modp(const Graph *src, const Graph *dst, uint64_t seed, char **counterexample);

/* ---- the axiom checks (check.c, validate.c) ---- */

/* A well-typed combination of shapes and parameters for axiom i where its
 * conditions hold (extents 3 preferred); false if none is found. */
bool axiom_sample(const Axioms *ax, int i, Binding *b, Shape *shapes);
/* The prover leaves axiom i out (redundancy); -1 uses them all. */
void prover_skip_axiom(Prover *p, int i);
/* Saturates g's terms for up to `rounds` rounds and says whether two
 * distinct inputs of g ended in one class (consistency). */
int prover_merges_inputs(Prover *p, const Graph *g, int rounds, bool *merged, int *n_nodes);

int validate_axioms(const Axioms *ax, int jobs, double budget_s, FILE *out, int *n_false,
                    bool quiet, FILE *progress);


#endif
