/* opt_int.h: what the files of optimize/ share and nothing else sees.
 *
 * rules.c holds the directed rules and their index by root operator;
 * match.c finds where a rule's source matches a graph; instance.c builds
 * a rule's target at the matched shapes (once per rule and shapes) and
 * splices it in; delta.c derives a rewrite's structural hash and exported
 * cost from the graph it rewrites, without building it; search.c runs the
 * cost-based search; weights.c computes weight-only nodes; bias.c splits
 * and refolds convolution biases. */
#ifndef TEQ_OPTIMIZE_OPT_INT_H
#define TEQ_OPTIMIZE_OPT_INT_H

#include "optimize/optimize.h"

/* A rule side has at most this many nodes (variables included). */
#define OPT_MAX_SIDE 32

typedef struct OptRule {
  Graph *src, *dst;  /* variables: the OP_INPUT nodes, the same on both sides */
  bool shares_sides; /* src and dst are the previous rule's dst and src (one
                        equation read both ways), freed with that one */
  int64_t id;        /* row in the database; 0 for rules added by hand */
  char *text;        /* "src => dst" as given, or NULL: written when asked for */
  OpKind root;       /* kind of the node that makes src's output 0 */
  /* Per src node, derived once (matching asks for every pair it tries):
   * which parameters are free (bit i: opt_param_is_free), and whether it is
   * a depthwise convolution (opt_is_depthwise). */
  uint32_t free_params[OPT_MAX_SIDE];
  bool depthwise[OPT_MAX_SIDE];
} OptRule;

/* A node in brief, as matching first sees it: its arity and, for its
 * first two operands, the producer's kind and output index. A rule's root
 * in brief has "any" for an operand that is a variable; a rule whose root
 * does not fit a node (opt_root_fits) cannot match there. */
typedef uint64_t OptRootSig;

/* Distinct sets of free parameters screened per root kind. */
enum { OPT_ROOT_MASKS = 8 };

/* A rule by its root, in brief: what a node must have before matching is
 * tried there. */
typedef struct OptRootEntry {
  int rule;        /* index in OptRules.r */
  OptRootSig sig;  /* the root's arity and operands */
  int8_t mask;     /* its set of free parameters (root_masks), -1: not screened */
  uint64_t pkey;   /* opt_params_key of its fixed parameters under that set */
} OptRootEntry;

struct OptRules {
  OptRule *r;
  int n, cap;
  OptRootEntry *by_root[OP__COUNT]; /* rules by root kind */
  int n_by_root[OP__COUNT], cap_by_root[OP__COUNT];
  /* The distinct sets of free parameters of each kind's roots (as masks):
   * a node's opt_params_key under each is computed once and compared with
   * every rule's. Most rules whose root fits a node in brief fail on its
   * parameters (NasNet-A: four in five); more sets than fit go unscreened. */
  uint32_t root_masks[OP__COUNT][OPT_ROOT_MASKS];
  int n_root_masks[OP__COUNT];
  /* The rules whose target is their variables alone: they only remove
   * operators (concat(split(y)) = y), applied after each round of a merge
   * (search.c: eliminate). */
  int32_t *removals;
  int n_removals, cap_removals;
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

OptRootSig opt_root_sig(const Graph *src);
OptRootSig opt_node_sig(const Graph *g, int id);
/* Whether a rule whose root is r may match at a node n (a necessary
 * condition only; it rejects nearly every rule the search tries). */
/* The values of n's parameters outside free_mask (bit i: parameter i is
 * free), hashed: equal for any two nodes of a kind whose fixed parameters
 * match as matching compares them. */
uint64_t opt_params_key(const Node *n, uint32_t free_mask);

static inline bool opt_root_fits(OptRootSig r, OptRootSig n) {
  if ((r ^ n) & 0x00ff00ffu) return false; /* arity */
  uint64_t r0 = r >> 32 & 0xffff, r1 = r >> 48, n0 = n >> 32 & 0xffff, n1 = n >> 48;
  if ((r0 == 0xffff || r0 == n0) && (r1 == 0xffff || r1 == n1)) return true;
  return (r >> 8 & 1) && (r0 == 0xffff || r0 == n1) && (r1 == 0xffff || r1 == n0);
}

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
/* n rewrites of g at once: instance i reads bind[i] and computes what
 * replace[i] names, each as opt_splice would splice it alone (its tensors
 * those of g: the matches must not share a replaced node). TEQ_ERR_INPUT
 * if the result would have a cycle. */
int opt_splice_many(const Graph *g, int n, const Graph *const *inst, const TensorRef *const *bind,
                    const TensorRef *const *replace, Graph **out, Diag *d);

/* A rule's target at one match's shapes, as instance.c built it, with what
 * delta.c derives from it once (opt_inst_prepare). Inputs are the rule's
 * variables; the nodes opt_splice adds are the others, in its order. */
typedef struct OptInst {
  Graph *g;
  int n_new;          /* nodes opt_splice adds: every non-input node */
  int32_t *order;     /* inst node of each, in the order opt_splice adds them */
  int32_t *slot;      /* per inst node: its index in order, or -1 - k for input k */
  bool *input_read;   /* per input k: read by a node or an output (an edge after splicing) */
  uint64_t *hs;       /* per new node: its structural hash before its inputs (delta.c) */
  double *plain;      /* per new node: its cost alone, 0 when free; NAN until asked */
  double *fused;      /* per new node and fusion (OPT_FUSE__COUNT): NAN until asked */
  bool built_only;    /* holds something delta.c does not derive (an opaque node) */
  /* The matched part of the graph it was made at, kept until the search
   * checks the instance against it in Z_p: only the instances of rewrites
   * the search makes the best or takes to expand are checked (most
   * rewrites are priced and dropped, most of those queued never taken). */
  Graph *src;
  int verdict; /* the search's Z_p verdict, 0 until it decides */
} OptInst;

/* Instances by everything opt_instantiate reads from a match (the rule,
 * each variable's shape and element type, the shapes replaced) and the
 * matched parameters the Z_p check reads: built once, kept for the whole
 * search. */
typedef struct OptInstMemo OptInstMemo;

/* g (taken) wrapped as an instance: a mutant PET spliced in as a rule's
 * target is. TEQ_ERR_NOMEM (g freed) or TEQ_ERR_INTERNAL. */
int opt_inst_wrap(Graph *g, OptInst **out);
OptInstMemo *opt_inst_memo_new(void);
void opt_inst_memo_free(OptInstMemo *memo);
/* The instance of rule (index i of rs) at match m of g, made on first
 * sight (with its src), valid until the memo is freed; NULL when the
 * target does not fit the match's shapes. TEQ_ERR_NOMEM or TEQ_OK. */
int opt_inst_get(OptInstMemo *memo, const OptRules *rs, int i, const Graph *g,
                 const OptMatch *m, OptInst **out);
void opt_inst_free(OptInst *in);

/* ---- delta.c ---- */

/* How a convolution with no activation is refolded with its only
 * consumer when a graph is exported (opt_fuse_bias): not at all, with a
 * per-channel bias (an ewadd of a constant), with an activation, or with
 * both (the bias first, then the activation of the fused result). */
enum { OPT_FUSE_NONE, OPT_FUSE_ACT = 15, OPT_FUSE_BIAS = 16, OPT_FUSE__COUNT = 32 };
/* OPT_FUSE_NONE + act, or OPT_FUSE_BIAS + act, act one of ACT_* (OPT_FUSE_ACT
 * masks it). */
_Static_assert(ACT__COUNT <= OPT_FUSE_ACT + 1, "an activation must fit below OPT_FUSE_BIAS");

/* Costs of operator configurations by their key's content (cost.h: the
 * key holds everything a cost depends on), asked of the CostModel once
 * each, and which constants are per-channel biases; for one search. */
typedef struct OptPricer OptPricer;
int opt_pricer_new(CostModel *cm, OptPricer **out);
void opt_pricer_free(OptPricer *p);

/* A graph about to be expanded, analysed once: node hashes, weights,
 * uses and costs, the ground every rewrite of it is derived from. */
typedef struct OptBase OptBase;
/* u: g's consumers (opt_uses_build), borrowed for the base's life. */
int opt_base_new(OptPricer *p, const Graph *g, const OptUses *u, OptBase **out, Diag *d);
void opt_base_free(OptBase *b);
/* Per node: computed from weights alone (opt_weight_only). */
const bool *opt_base_weights(const OptBase *b);

typedef enum OptDelta {
  OPT_DELTA_OK,    /* derived */
  OPT_DELTA_CYCLE, /* opt_splice would refuse it: the rewrite reads its own result */
  OPT_DELTA_BUILD, /* not derived (a case delta.c leaves to the built graph): build it */
} OptDelta;

/* Sets up the rewrite opt_splice(g, in->g, bind, replace) would build and
 * derives its structural hash: what graph_hash would return for it. */
OptDelta opt_delta_hash(OptBase *b, OptInst *in, const TensorRef *bind, const TensorRef *replace,
                        uint64_t *hash);
/* The cost of the rewrite opt_delta_hash last set up as it will be
 * exported (refolded by opt_fuse_bias, then opt_graph_cost), summed in the
 * order opt_graph_cost would sum it, so it is the same double. OPT_DELTA_OK
 * with *us, OPT_DELTA_BUILD, or a negative error code. */
int opt_delta_cost(OptBase *b, double *us, Diag *d);
/* Derives in->hs once, and makes room for plain and fused (asked later). */
int opt_inst_prepare(OptInst *in);
/* g as exported (refolded by opt_fuse_bias, then opt_graph_cost), priced
 * through p's caches without copying or refolding it: the same double.
 * OPT_DELTA_OK with *us, OPT_DELTA_BUILD when g holds dead nodes (price a
 * refolded copy instead), or a negative error code. */
int opt_pricer_price(OptPricer *p, const Graph *g, double *us, Diag *d);

/* ---- bias.c ---- */

/* Verdicts of opt_bias_per_channel remembered, by tensor and shape: the
 * pricer and the finishes of a search meet the same spread biases in graph
 * after graph. Each function taking one also takes NULL (nothing kept). */
typedef struct OptChannels OptChannels;
OptChannels *opt_channels_new(void);
void opt_channels_free(OptChannels *m);

/* Whether t, added to a convolution's [N, C, H, W] result of shape out, is
 * one value per channel (so opt_fuse_bias folds it into the convolution);
 * vals (C floats, may be NULL) receives them. */
bool opt_bias_per_channel(OptChannels *m, Tensor *t, const Shape *out, float *vals);

/* Whether node n, at input shapes in, gives one value per channel wherever
 * each of its inputs does, each at its own shape: a concat along the
 * channels, or an element-wise operator of inputs of its own shape. */
bool opt_bias_keeps_channels(const Node *n, const Shape *in);

/* Whether n concatenates [N, C, H, W] tensors along their channels: a bias
 * or an activation after it may be pushed into what it concatenates. */
bool opt_is_channel_concat(const Node *n);

/* Levels of weight operators above the constants that a bias may be, and
 * inputs of each. */
#define OPT_BIAS_DEPTH 8
#define OPT_BIAS_MAX_IN 8

/* Whether tensor r of g, added to a convolution's result of shape out, is
 * one value per channel: a constant that is (opt_bias_per_channel), or
 * operators that keep channels apart (opt_bias_keeps_channels) over such
 * constants. A rewrite that moves two biases through a concat leaves
 * concat(B1, B2), which the export computes into one constant and folds
 * into the merged convolution; the search must price it so. vals as
 * there. */
bool opt_bias_value_per_channel(OptChannels *m, const Graph *g, TensorRef r, const Shape *out,
                                float *vals);

/* opt_fuse_bias and opt_fold_through_splits with verdicts remembered in m. */
int opt_fuse_bias_with(Graph *g, OptChannels *m, int *n_fused, Diag *d);
int opt_fold_through_splits_with(CostModel *cm, Graph **g, OptChannels *m, int *n_moved,
                                 int *n_fused, Diag *d);

/* ---- weights.c ---- */

/* The verdicts on biases a fold memo keeps for the finishes that share it
 * (NULL for none). */
OptChannels *opt_fold_memo_channels(OptFoldMemo *m);

/* Per node of g (order: a topological order): whether every input is a
 * weight, as opt_graph_cost counts it. malloc'd; NULL when memory runs out. */
bool *opt_weight_only(const Graph *g, const int32_t *order);

#endif
