/* opt_int.h: what the files of optimize/ share and nothing else sees.
 *
 * rules.c holds the directed rules and their index by root operator;
 * match.c finds where a rule's source matches a graph; instance.c builds
 * a rule's target at the matched shapes and splices it in; search.c runs
 * the cost-based search; weights.c computes weight-only nodes. */
#ifndef TEQ_OPTIMIZE_OPT_INT_H
#define TEQ_OPTIMIZE_OPT_INT_H

#include "optimize/optimize.h"

/* A rule side has at most this many nodes (variables included). */
#define OPT_MAX_SIDE 32

typedef struct OptRule {
  Graph *src, *dst;  /* variables: the OP_INPUT nodes, the same on both sides */
  int64_t id;        /* row in the database; 0 for rules added by hand */
  char *text;        /* "src => dst" */
  OpKind root;       /* kind of the node that makes src's output 0 */
} OptRule;

struct OptRules {
  OptRule *r;
  int n, cap;
  int *by_root[OP__COUNT]; /* rule indices by root kind */
  int n_by_root[OP__COUNT];
};

/* ---- match.c ---- */

/* One place a rule's source matches g: the graph node of each source node
 * (-1 for variables) and the tensor bound to each variable. */
typedef struct OptMatch {
  int32_t node[OPT_MAX_SIDE];
  TensorRef bind[OPT_MAX_SIDE];
  bool swapped[OPT_MAX_SIDE]; /* a commutative node's inputs matched in reverse */
} OptMatch;

/* The consumers of every node of g, for matching outward from a tensor. */
typedef struct OptUses {
  int32_t *start;  /* n_nodes + 1 offsets into user/slot */
  int32_t *user, *slot;
  bool *is_output; /* per node: some output is a graph output */
} OptUses;

int opt_uses_build(const Graph *g, OptUses *u);
void opt_uses_fini(OptUses *u);

/* Calls fn on each match of rule->src rooted at graph node root, up to max
 * (fn returns false to stop early). Returns the number of matches found. */
int opt_match_at(const OptRule *rule, const Graph *g, const OptUses *u, int root, int max,
                 bool (*fn)(const OptMatch *m, void *ctx), void *ctx);

/* Whether parameter i of rule side node p is derived from shapes rather
 * than matched: split sizes, constant tensors' extents, the groups of a
 * depthwise convolution. */
bool opt_param_is_free(const Graph *side, int p, int i);
/* Whether node p of a rule side is a depthwise convolution (one input
 * channel per group), whose groups follow the input's channels. */
bool opt_is_depthwise(const Graph *side, int p);

/* Whether node id of g broadcasts its inputs as node p of a rule side did
 * at the rule's shapes: an input the same shape as the output there must
 * be so here, and a scalar must stay one element. A rule found for ewadd of
 * equal shapes says nothing about ewadd of a [1, C, 1, 1] bias. */
bool opt_broadcast_like(const Graph *side, int p, const Graph *g, int id);

/* ---- instance.c ---- */

/* rule->dst at the shapes a match binds: free parameters solved so that
 * every shape infers and the outputs have the shapes in want (the matched
 * source's). TEQ_ERR_INPUT when no unique solution exists. */
int opt_instantiate(const OptRule *rule, const Graph *g, const OptMatch *m, Graph **out);
/* The matched part of g as a graph over the rule's variables. */
int opt_extract_match(const OptRule *rule, const Graph *g, const OptMatch *m, Graph **out);
/* g with the tensors replace[0..n) (n = inst's outputs) computed by inst,
 * whose input i reads bind[i]; dead nodes removed. TEQ_ERR_INPUT (no
 * message) if the result would have a cycle. */
int opt_splice(const Graph *g, const Graph *inst, const TensorRef *bind, const TensorRef *replace,
               Graph **out, Diag *d);

/* ---- weights.c ---- */

/* Per node of g (order: a topological order): whether every input is a
 * weight, as opt_graph_cost counts it. malloc'd; NULL when memory runs out. */
bool *opt_weight_only(const Graph *g, const int32_t *order);

#endif
