/* gen_int.h: what the files of gen/ share. Not a door: other rooms use
 * gen/gen.h.
 *
 * The pieces, in the order gen-rules uses them:
 *   vocab.c     the variables, their symbolic shapes and the two shape
 *               assignments; the operator templates (TASO's Table 1)
 *   eval.c      a graph under construction: push an operator, evaluate it
 *               in Z_p, pop it; fingerprints and structural hashes
 *   enumerate.c the canonical DFS, spilling (fingerprint, graph) records
 *               into on-disk buckets
 *   bucket.c    one bucket: group by fingerprint, compare exactly, confirm
 *               on a second input and at a second shape, pair up
 *   prune.c     renaming, common subgraphs, disjoint unions
 *   rules.c     a pair as a ruledb Rule: runtime Graphs and canonical key
 *
 * A graph is at most GEN_MAX_DEPTH operators, each a template index and up
 * to two input slots. Slots 0..n_vars-1 are the variables; each operator's
 * outputs take the next slots in order. This 16-byte encoding is what the
 * buckets hold: a graph is re-evaluated from it whenever needed. */
#ifndef TEQ_GEN_GEN_INT_H
#define TEQ_GEN_GEN_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "gen/gen.h"
#include "ruledb/ruledb.h"
#include "runtime/err.h"
#include "runtime/graph.h"
#include "runtime/ops.h"
#include "runtime/tensor.h"

#define GEN_MAX_DEPTH 5
#define GEN_MAX_VARS 32
#define GEN_MAX_SLOTS (GEN_MAX_VARS + 2 * GEN_MAX_DEPTH)
#define GEN_MAX_TEMPLATES 96
#define GEN_MAX_CLASSES 12

/* The shape assignments a graph is evaluated at: A for fingerprints (and a
 * second random input at A), B to catch rules that hold at one shape only. */
enum { SHAPE_A, SHAPE_B, GEN_N_SHAPES };

/* Symbols a variable's extents are written in. */
enum { SYM_M, SYM_K, SYM_K2, SYM_N, SYM_C, SYM_H, SYM_W, SYM_B, SYM__COUNT };

/* An extent: >= 0 a literal, < 0 the symbol -(e + 1). */
typedef struct SymShape {
  int8_t ndim;
  int8_t d[4];
} SymShape;

typedef struct GenVar {
  char name[8];   /* x1, w2, i1, k1 ... */
  int8_t cls;     /* index into GenVocab.classes */
  bool weight;    /* a weight (not an activation): never a conv input */
  SymShape shape;
} GenVar;

/* Variables of one class are interchangeable: a graph may use the k-th
 * only together with the first k-1 (renaming makes the rest redundant). */
typedef struct GenClass {
  char prefix;    /* the letter of its variables' names */
  int8_t first;   /* index of its first variable */
  int8_t count;
} GenClass;

enum {
  T_COMMUTATIVE = 1u << 0,  /* inputs ordered by structural hash */
  T_SAME_SHAPE = 1u << 1,   /* both inputs of one shape */
  T_VAR_INPUT = 1u << 2,    /* input 0 must be a variable (enlarge) */
  T_BOUNDARY = 1u << 3,     /* split: at a concat boundary, or halving an activation variable */
  T_DISTINCT = 1u << 4,     /* the two inputs differ (matmul) */
  T_ACT_INPUT = 1u << 5,    /* input 0 must be an activation (conv, pools) */
  T_SCALAR_IN1 = 1u << 6,   /* input 1 has one element (smul) */
  T_IDENT = 1u << 7,        /* not an operator: a variable as an output */
};

/* Parameters a template derives from the assignment, not its inputs. */
enum { TP_NONE, TP_POOL_C, TP_ICONV_C, TP_IMM_K, TP_ONE_IMAGE, TP_ONE_MATRIX };

/* How an operator carries its inputs' concat boundaries to its outputs, so
 * that split applies exactly where a concat boundary exists (TASO's
 * SplitInfo): split(matmul(x, concat1(w1, w2))) must be reachable. */
enum {
  BR_NONE,       /* no boundary survives */
  BR_SAME,       /* element-wise: the inputs' common boundaries */
  BR_TRANSPOSE,  /* 2-D: axes swap */
  BR_MATMUL,     /* rows from input 0, columns from input 1 */
  BR_GEMM,       /* likewise, from the axes the transposes leave there */
  BR_CONV,       /* batch from the input, channels from the weight's outputs */
  BR_POOL,       /* batch and channels kept */
  BR_CONCAT,     /* a new boundary on the axis, common ones elsewhere */
  BR_SPLIT,      /* the axis loses its boundary */
};

typedef struct GenTemplate {
  char name[32];    /* "conv2d[k3 relu]": progress, reports, tests */
  OpKind kind;
  uint8_t n_in, n_out;
  uint8_t rank;     /* rank input 0 must have; 0 any */
  uint16_t flags;
  int8_t axis;      /* concat, split */
  int8_t kh, kw;    /* conv: the weight's kernel; enlarge: the target; pools: the window */
  int8_t act;       /* conv's or matmul's fused activation */
  int8_t dilation;  /* conv */
  int8_t source;    /* TP_* for constants */
  int8_t trans;     /* gemm: 1 reads input 0 transposed, 2 input 1, 3 both */
  int8_t bound;     /* BR_* */
} GenTemplate;

typedef struct GenVocab {
  GenVar vars[GEN_MAX_VARS];
  int n_vars;
  GenClass classes[GEN_MAX_CLASSES];
  int n_classes;
  GenTemplate t[GEN_MAX_TEMPLATES];
  int n_templates;
  uint64_t op_seed[GEN_MAX_TEMPLATES]; /* each template's structural-hash seed */
  int64_t dims[GEN_N_SHAPES][SYM__COUNT];
} GenVocab;

/* Builds the vocabulary for an --ops list (NULL: TASO's set). Unknown names
 * and operators gen-rules cannot enumerate are TEQ_ERR_INPUT. */
int gen_vocab_build(GenVocab *v, const char *ops, Diag *d);
/* The concrete shape of a variable at an assignment. */
Shape gen_var_shape(const GenVocab *v, int var, int shape);

/* ---- a graph and its evaluation ---- */

typedef struct GenOp {
  uint8_t t;        /* template */
  uint8_t in[2];    /* input slots */
} GenOp;

typedef struct GenGraph {
  uint8_t n_ops;
  uint8_t pad;
  GenOp op[GEN_MAX_DEPTH];
} GenGraph; /* 17 bytes */

/* One bucket record. */
typedef struct GenRecord {
  uint64_t fp;
  GenGraph g;
} __attribute__((packed)) GenRecord; /* 25 bytes */

typedef struct GenSlot {
  Tensor *t;          /* value in Z_p; owned reference */
  uint64_t vh;        /* hash of shape and values */
  uint64_t sh;        /* structural hash (what computes it, not its value) */
  int8_t bound[4];    /* concat boundary per axis (0: none), for split */
  bool weight;        /* computed from weights only */
  int8_t op;          /* producing operator, -1 for a variable */
  int16_t uses;       /* consumers among the graph's operators */
} GenSlot;

typedef struct GenState {
  const GenVocab *v;
  int shape;                      /* SHAPE_A or SHAPE_B */
  GenSlot slot[GEN_MAX_SLOTS];
  int n_slots;
  GenOp op[GEN_MAX_DEPTH];
  uint8_t op_first[GEN_MAX_DEPTH]; /* first output slot of each operator */
  uint64_t op_sh[GEN_MAX_DEPTH];
  Params op_params[GEN_MAX_DEPTH];  /* as evaluated at this assignment */
  int n_ops;                       /* operators, identity markers included */
  int n_real;                      /* operators that compute */
  uint64_t out_sum;                /* sum of output slots' mixed value hashes */
  int n_outputs;
  int var_uses[GEN_MAX_VARS];
  int var_gaps;                    /* gen_var_gaps, kept current by push and pop */
  int8_t var_highest[GEN_MAX_CLASSES]; /* per class, highest used variable (-1 none) */
  uint64_t fresh_sh, fresh_seed;   /* see gen_state_set_fresh */
} GenState;

/* Variables at shape `shape`, filled from seed (each variable its own
 * stream). TEQ_ERR_NOMEM if allocation fails. */
int gen_state_init(GenState *s, const GenVocab *v, int shape, uint64_t seed);
void gen_state_fini(GenState *s);

/* Structural hashes: of a variable, and of template ti applied to inputs
 * with hashes a and b (ordered if the template is commutative). The
 * canonical order and the pruning's canonical forms both use these. */
uint64_t gen_hash_var(int var);
uint64_t gen_hash_op(const GenVocab *v, int ti, uint64_t a, uint64_t b);

/* The structural hash op would have, and the first position from which the
 * canonical order requires it to be larger than every operator (just after
 * its last producing operator). */
uint64_t gen_op_sh(const GenState *s, GenOp op, int *after);

/* The cheap tests gen_push makes before evaluating (kinds, ranks, shapes
 * that must agree, boundaries): false means gen_push would return 0. */
bool gen_op_applies(const GenState *s, GenOp op);
/* Pushes op and evaluates it. 1: pushed; 0: the template does not apply
 * to these inputs (shapes, kinds, boundary); < 0: an error. */
int gen_push(GenState *s, GenOp op, Diag *d);
void gen_pop(GenState *s);
/* Pushes every operator of g; 1 if all applied. */
int gen_push_graph(GenState *s, const GenGraph *g, Diag *d);
void gen_pop_all(GenState *s);

/* Output slots (op outputs nobody in the graph consumes, and identity
 * markers), in slot order. Returns how many. */
int gen_outputs(const GenState *s, int *slots);
/* The fingerprint: symmetric in the outputs. */
uint64_t gen_fingerprint(const GenState *s);
/* Whether the variables used are, in each class, the first ones. */
bool gen_vars_canonical(const GenState *s);
/* How many variables are missing for gen_vars_canonical to hold: now, and
 * if op were pushed (checked before anything is evaluated). */
int gen_var_gaps(const GenState *s);
int gen_var_gaps_after(const GenState *s, GenOp op);
/* The current graph's encoding. */
void gen_graph_of(const GenState *s, GenGraph *g);

/* When a pushed operator's structural hash equals fresh_sh, its outputs
 * are replaced by random values from fresh_seed: the common-subgraph test
 * evaluates a rule with a shared subexpression turned into a new variable. */
void gen_state_set_fresh(GenState *s, uint64_t fresh_sh, uint64_t fresh_seed);

/* ---- enumeration (enumerate.c) ---- */

typedef struct GenEnumOptions {
  int depth, threads, n_buckets;
  uint64_t seed;
  const char *dir;       /* where bucket files go */
  void (*on_progress)(void *ctx, int64_t graphs, int roots_done, int roots);
  void *progress_ctx;
} GenEnumOptions;

typedef struct GenEnumStats {
  int64_t graphs, emitted;
  int roots;
} GenEnumStats;

int gen_enumerate(const GenVocab *v, const GenEnumOptions *opt, GenEnumStats *st, Diag *d);
int gen_bucket_of(uint64_t fp, int n_buckets);
/* All records of one bucket (every thread's file), malloc'd. */
int gen_bucket_load(const GenEnumOptions *opt, int bucket, GenRecord **recs, size_t *n, Diag *d);

/* ---- candidate pairs (bucket.c) ---- */

/* Two graphs found equal; outputs aligned: src output slot src_out[i]
 * equals dst output slot dst_out[i]. */
typedef struct GenPair {
  GenGraph src, dst;
  uint8_t n_out;
  uint8_t src_out[2 * GEN_MAX_DEPTH], dst_out[2 * GEN_MAX_DEPTH];
} GenPair;

typedef struct GenBucketStats {
  int64_t fp_groups, collisions, one_input_only, shape_specific;
} GenBucketStats;

/* Seeds of the three evaluations: fingerprints, the second input at A, B. */
uint64_t gen_seed(uint64_t seed, int which);

/* Groups the records of one bucket by fingerprint and returns the
 * confirmed pairs (malloc'd). */
int gen_bucket_pairs(const GenVocab *v, uint64_t seed, GenRecord *recs, size_t n,
                     GenPair **pairs, size_t *n_pairs, GenBucketStats *st, Diag *d);

/* ---- pruning (prune.c) ---- */

typedef struct GenPruneStats {
  int64_t initial, after_renaming, after_common, after_disjoint, after_float32;
} GenPruneStats;

/* A rule ready to store: canonical pair and its key. */
typedef struct GenRule {
  GenPair p;
  char *key;
} GenRule;

/* A pair in canonical form (variables renamed, operators in canonical
 * order), with what the checks that need only the pair found. */
enum { CAND_COMMON = 1, CAND_DISJOINT = 2, CAND_FLOAT32 = 4 };
typedef struct GenCand {
  GenPair p;
  uint8_t flags;  /* CAND_* */
} GenCand;

/* Pruning is two stages:
 *   gen_prune_bucket  in each bucket worker: each pair's canonical form,
 *                     each distinct one once;
 *   gen_prune_merge   all buckets' candidates, in `threads` threads: one
 *                     copy of each, instances of others dropped, then the
 *                     common-subgraph and disjoint-union checks on what is
 *                     left (the checks evaluate graphs: they run once per
 *                     distinct rule, after the cheap steps), and a float32
 *                     run of the survivors, giving the counts of TASO's
 *                     Table 3. */
int gen_prune_bucket(const GenVocab *v, const GenPair *pairs, size_t n, GenCand **cands,
                     size_t *n_cands);
/* Reorders cands. initial: the pairs the candidates came from. */
int gen_prune_merge(const GenVocab *v, uint64_t seed, int threads, GenCand *cands, size_t n,
                    int64_t initial, GenRule **rules, size_t *n_rules, GenPruneStats *st,
                    Diag *d);
/* Both stages over one list of pairs. */
int gen_prune(const GenVocab *v, uint64_t seed, const GenPair *pairs, size_t n, GenRule **rules,
              size_t *n_rules, GenPruneStats *st, Diag *d);
void gen_rules_free(GenRule *rules, size_t n);
/* The canonical key of a pair (the one gen_prune gives its rule). */
void gen_pair_key(const GenVocab *v, const GenPair *p, char *key, size_t size);

/* ---- storing (rules.c) ---- */

/* A GenRule as a ruledb Rule: runtime graphs at assignment A. */
int gen_rule_to_ruledb(const GenVocab *v, const GenRule *g, Rule *r, Diag *d);
/* The same rule's two sides as runtime graphs at a shape assignment and
 * their aligned outputs (for tests: evaluate both and compare). */
int gen_pair_graphs(const GenVocab *v, const GenPair *p, int shape, Graph **src,
                    Graph **dst, Diag *d);

/* Operators of g that compute (identity markers aside). */
int gen_graph_real_ops(const GenVocab *v, const GenGraph *g);
/* used[var] for every variable either side of p reads. */
void gen_pair_used_vars(const GenVocab *v, const GenPair *p, bool *used);

/* Text of a graph for messages and tests: "matmul(matmul(x1, w1), w2)". */
int gen_graph_format(const GenVocab *v, const GenGraph *g, char *buf, size_t size);

#endif
