/* optimize.h: the optimize command's engine. It rewrites a model graph with
 * proved rules from the rule database, searching by cost (MetaFlow's
 * backtracking search, TASO Algorithm 2), and precomputes what depends on
 * weights alone.
 *
 * A rule's two sides were found at one assignment of shapes; applying it to
 * a model re-derives what depends on shapes (split sizes, the extents of
 * constant tensors, the groups of a depthwise convolution) from the matched
 * tensors, and every other parameter must match exactly. The rewritten
 * part must produce exactly the shapes it replaces. Where both sides are
 * cheap to evaluate at the model's shapes, the instance is also checked
 * exactly in Z_p before it is used (once per rule and shapes).
 *
 * Large graphs are searched in windows of consecutive operators, so search
 * time grows about linearly with the model. Costs come from the runtime's
 * cost model (runtime/cost.h); operators whose inputs are all weights cost
 * nothing, because they are computed once and exported as initializers.
 *
 * With PET on (OptOptions.pet), the search also tries partially equivalent
 * mutations (optimize/pet/pet.h): the multi-linear subprograms of each
 * candidate are mutated, the mutants corrected where random tests in Z_p
 * find them wrong, and spliced in as candidates like rule rewrites. */
#ifndef TEQ_OPTIMIZE_OPTIMIZE_H
#define TEQ_OPTIMIZE_OPTIMIZE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/cost.h"
#include "runtime/err.h"
#include "runtime/graph.h"
#include "optimize/pet/pet.h"

/* ---- rules ---- */

typedef struct OptRules OptRules;

/* Loads the rules of a database made by gen-rules: the proved ones, or
 * every rule but the refuted ones with include_unproved. Each rule is used
 * in both directions where a direction can be applied (its source binds
 * every variable the target uses, and its outputs are operators). Errors
 * (TEQ_ERR_INPUT): no such database, another schema, no usable rule. */
TEQ_API int opt_rules_load(const char *db_path, bool include_unproved, OptRules **out, Diag *d);
/* An empty set, for rules added one by one (tests). */
TEQ_API OptRules *opt_rules_new(void);
/* Adds src => dst (only this direction); takes both graphs. text may be NULL. */
TEQ_API int opt_rules_add(OptRules *rs, Graph *src, Graph *dst, int64_t id, const char *text,
                          Diag *d);
TEQ_API void opt_rules_free(OptRules *rs);
/* Directed rules held, and the text and database id of rule i. The text
 * is "src => dst", malloc'd (NULL when memory runs out): rules loaded from
 * a database are written out only when a report asks. */
TEQ_API int opt_rules_count(const OptRules *rs);
TEQ_API char *opt_rules_text(const OptRules *rs, int i);
TEQ_API int64_t opt_rules_id(const OptRules *rs, int i);
/* The graph rule i rewrites from (its variables are its inputs). */
TEQ_API const Graph *opt_rules_source(const OptRules *rs, int i);

/* ---- the search ---- */

typedef struct OptOptions {
  double alpha;          /* keep a candidate when cost < alpha * best (1.05) */
  int budget;            /* graphs expanded per window (default 300) */
  int patience;          /* a window also stops after this many graphs expanded without a
                            cheaper one; 0: only the budget stops it */
  double time_limit_s;   /* for the whole search; 0: none */
  int window;            /* operators per window (default 150) */
  bool plain_windows;    /* cut every window at its full size; off (the default): each ends,
                            in its last quarter, where the fewest tensors cross the cut */
  int max_matches;       /* matches tried per rule and graph (default 64) */
  double zp_check_flops; /* check instances in Z_p up to this many operations, flops and
                            elements moved (default 3e7); 0: never */
  uint64_t seed;
  bool one_site;         /* each step rewrites one match, as TASO's search does, and no
                            pass over the whole graph follows the windows; off (the
                            default): a step may also apply a rule at all its disjoint
                            matches at once, kept when cheaper than the graph it rewrites */
  bool quiet;
  FILE *progress;        /* stderr, or NULL */
  /* PET: partially equivalent mutants of multi-linear subprograms */
  bool pet;              /* compete with the rules (off in OPT_DEFAULTS; the optimize
                            command turns it on unless --no-pet) */
  int pet_depth;         /* operators per mutant (pet_mutate's depth; default 3) */
  int pet_trials;        /* random tests per mutant; 0: from the bound (n/p)^t <= 2^-60 */
  int pet_mutants;       /* K: corrected mutants kept per subprogram (default 8) */
  double pet_max_flops;  /* mutate subprograms up to this many flops (default 2e8): the
                            mutants of larger ones add more candidates than they gain
                            (ResNeXt-50: search 3.8 -> 8.0 s at 2e9 for 0.9% less cost) */
  double pet_max_elements; /* ... and whose tensors each hold up to this many elements
                            (default 2e6): testing mutants costs memory per element, and
                            VGG-19's stem conv, [1,64,224,224] out, took 0.3 to 0.9 s of a
                            1.0 s search for none kept */
  int jobs;              /* threads testing PET's mutants side by side (0 or 1: one; the
                            optimize command: the machine's cores) */
  bool check_derived;    /* build and post-optimize every PET candidate the search derives
                            unbuilt too, and fail if that changes it (slow: for tests) */
} OptOptions;

#define OPT_DEFAULTS                                                                  \
  ((OptOptions){.alpha = 1.05, .budget = 300, .window = 150, .max_matches = 64,       \
                .zp_check_flops = 3e7, .seed = 1, .pet_depth = 3, .pet_mutants = 8,   \
                .pet_max_flops = 2e8, .pet_max_elements = 2e6})

/* One PET mutation in the search's result. */
typedef struct OptPetApplied {
  char desc[256];        /* how the mutant was built (pet_mutate's description) */
  char correction[256];  /* the regions recomputed with the original operators, or "none" */
  double cost_delta_us;  /* the candidate's cost change when the mutant was spliced in */
  double log2_bound;     /* log2 of the chance that a wrong box passed its tests */
  int trials;            /* random tests t */
  int times;             /* places applied in the result */
} OptPetApplied;

typedef struct OptStats {
  int64_t explored;        /* graphs taken off the queue and expanded */
  int64_t generated;       /* rewritten graphs (most are hashed and priced without being built) */
  int64_t duplicates;      /* ... already seen (structural hash) */
  int64_t kept;            /* ... within alpha of the best, queued */
  int64_t materialized;    /* ... built as graphs: queued, a new best, or not derived */
  int64_t all_sites;       /* ... of them a rule at all its disjoint matches at once */
  int64_t rejected_cycle;  /* rewrites that would create a cycle (TASO Fig. 6) */
  int64_t rejected_shape;  /* targets that do not fit the matched shapes */
  int64_t rejected_zp;     /* instances that differ in Z_p: the rule does not hold there */
  int64_t zp_checked;      /* distinct instances checked exactly in Z_p */
  int64_t zp_trusted;      /* distinct instances too large to check (the proof stands) */
  double zp_s;             /* seconds of the search spent checking them */
  int windows;
  int first_pass_ops;      /* operators in the first pass's windows: each movable one once */
  bool stopped_by_time;
  double search_s;
  /* When the result's last improvement was found: graphs expanded by then,
   * and seconds into the search. The rest of the budget found nothing. */
  int64_t best_at;
  double best_s;
  int *applied;            /* per directed rule: times applied in the result */
  int n_rules;
  /* PET */
  int64_t pet_subprograms; /* distinct subprograms (by structural hash) mutated */
  int64_t pet_too_large;   /* ... skipped: over pet_max_flops or pet_max_elements */
  int64_t pet_mutants;     /* corrected mutants generated */
  int64_t pet_failed;      /* mutants whose correction failed */
  int64_t pet_built;       /* candidates made by splicing a mutant in */
  int64_t pet_derived;     /* ... of which derived (delta.c), not built: no post-optimization */
  int64_t pet_kept;        /* ... within alpha of the best, queued */
  double pet_s;            /* seconds in pet_split, pet_mutate and pet_correct */
  /* pet_post_optimize over the candidates built: reshapes and transposes
   * moved past element-wise operators, inverse groups removed, pairs fused */
  int64_t pet_post_moved, pet_post_removed, pet_post_fused, pet_post_hoisted;
  OptPetApplied *pet_applied; /* the mutations in the result */
  int n_pet_applied;
} OptStats;

TEQ_API void opt_stats_fini(OptStats *st);

/* Every place rule i matches in g, applied one at a time: calls fn with
 * each new graph, which fn keeps by returning true (else it is freed). At
 * most o->max_matches matches are tried, and instances are checked in Z_p
 * as o says (NULL: OPT_DEFAULTS). Counts go to st, which the caller zeroes.
 * One step of the search, on its own: for tests and tools. */
TEQ_API int opt_apply_rule(const OptRules *rs, int i, const Graph *g, const OptOptions *o,
                           bool (*fn)(Graph *rewritten, void *ctx), void *ctx, OptStats *st,
                           Diag *d);

/* Every place rule i matches in g as the search prices it: fn receives
 * each rewritten graph (kept by returning true), the cost and structural
 * hash the search derived for it from g without building it, and whether
 * they were derived (else they come from the built graph: the cases the
 * search builds). The cost is what opt_fuse_bias then opt_graph_cost give
 * on a copy of the graph, to the last bit; the hash is graph_hash's. Fails
 * with TEQ_ERR_INTERNAL where the search and opt_splice disagree on a
 * cycle. For tests and tools. */
typedef bool (*OptPricedFn)(Graph *rewritten, double cost_us, uint64_t hash, bool derived,
                            void *ctx);
TEQ_API int opt_apply_rule_priced(const OptRules *rs, int i, const Graph *g, CostModel *cm,
                                  const OptOptions *o, OptPricedFn fn, void *ctx, OptStats *st,
                                  Diag *d);

/* Searches for the cheapest equivalent of g. *out receives the best graph
 * found (a copy of g if nothing was better). st is filled (its applied
 * array is allocated; opt_stats_fini frees it). */
TEQ_API int opt_search(const Graph *g, const OptRules *rs, CostModel *cm, const OptOptions *o,
                       Graph **out, OptStats *st, Diag *d);

/* ---- costs and weights ---- */

/* The cost of g as the search sees it: every computing node except those
 * whose inputs are all weights (constants, constant tensors, or such nodes
 * themselves). counts[s] (optional) counts node costs per source. */
TEQ_API int opt_graph_cost(CostModel *cm, const Graph *g, double *us,
                           int counts[COST__SOURCES], Diag *d);
/* The cost of g as the runtime runs it: the search's, less the nodes whose
 * producers write them in place (graph_node_in_place: a concat of one
 * image, each piece in no other concat), and (us_by_source, optional) the
 * microseconds from each source: how much of an estimate rests on
 * measurements and how much on the analytic model. What the report gives
 * and what the choices after the search (the original kept, the
 * post-optimized graph taken) compare.
 *
 * The search itself prices every kernel. Priced at nothing there, such a
 * concat made the search worse: steps that only move an activation
 * through a concat were no longer cheaper, so a best-first search pruned
 * at alpha x its best took merges that strand the activations on views of
 * a split (SqueezeNet: 235.4 us as run, against 216.0 searched on
 * kernels' costs; tools/bench/RESULTS.md). */
TEQ_API int opt_graph_cost_run(CostModel *cm, const Graph *g, double *us,
                               int counts[COST__SOURCES], double us_by_source[COST__SOURCES],
                               Diag *d);

/* Computes every node whose inputs are all weights on the CPU and replaces
 * it by a constant (an initializer on export); *n_folded (optional)
 * receives how many nodes were folded. */
TEQ_API int opt_fold_weights(Graph *g, int *n_folded, Diag *d);
/* The same, each fold taken from memo when it holds one from the same
 * operator, parameters and input tensors, else computed and kept there:
 * a search finishes many graphs that share their folded weights. */
typedef struct OptFoldMemo OptFoldMemo;
TEQ_API OptFoldMemo *opt_fold_memo_new(void);
TEQ_API void opt_fold_memo_free(OptFoldMemo *m);
TEQ_API int opt_fold_weights_memo(Graph *g, OptFoldMemo *memo, int *n_folded, Diag *d);
/* The same for a graph that is only to be priced (opt_finished_cost): a
 * weight whose values no pass reads and no cost depends on (an operand of
 * a product or convolution of activations, or what only those read, such
 * as BERT's concatenated and transposed projections) becomes a
 * constant of its shape that holds no values (tensor_new_unbacked). Such
 * a graph must not run or be exported. */
TEQ_API int opt_fold_weights_for_price(Graph *g, OptFoldMemo *memo, int *n_folded, Diag *d);

/* Convolution biases and fused activations as separate nodes for the
 * search (conv2d(x, w, b, relu) -> relu(ewadd(conv2d(x, w), B))), and back;
 * see bias.c. Counts are optional. */
TEQ_API int opt_split_bias(Graph *g, int *n_split, Diag *d);
TEQ_API int opt_fuse_bias(Graph *g, int *n_fused, Diag *d);

/* Each concat whose leading pieces are another concat's, on the same axis,
 * takes that concat (the longest such) as its first piece instead:
 * DenseNet's concat(x0, f1, ..., fk) becomes concat(concat(x0, ...,
 * fk-1), fk), so that no piece is in two concats and every one is written
 * in place (graph_node_in_place). Exact; n_shared (optional) receives how
 * many. See concat.c. */
TEQ_API int opt_share_concat_prefixes(Graph *g, int *n_shared, Diag *d);

/* The per-channel adds and the activations that a merge left on the pieces
 * of a split, put where one kernel does them: an add that alone reads a
 * piece of a channel split of a convolution into its bias, and the one
 * activation that alone reads each piece of a split before the split,
 * each change followed by opt_fuse_bias and kept where *g as run
 * (opt_graph_cost_run) comes out no dearer. Exact. n_moved (optional)
 * receives how many pieces moved, and n_fused (optional) is increased by
 * what opt_fuse_bias then folded. See split.c. */
TEQ_API int opt_fold_through_splits(CostModel *cm, Graph **g, int *n_moved, int *n_fused,
                                    Diag *d);

/* ---- the result as exported (finish.c) ---- */

/* What opt_finish did, and the cost of what it left. */
typedef struct OptFinish {
  int folded;         /* weight-only operators computed into initializers */
  int fused;          /* biases and activations folded into convolutions */
  int residuals;      /* residual adds folded into convolutions */
  int through_splits; /* split pieces whose add or activation moved */
  int shared;         /* concats that take another as their first piece */
  bool posted;        /* PET's post-optimization taken (post its counts) */
  PetPostStats post;
  double us;          /* opt_graph_cost_run of the result */
  int src[COST__SOURCES];
  double us_by_source[COST__SOURCES];
} OptFinish;

/* What the finishes of one search share, each member optional (NULL:
 * computed anew): a search finishes graph after graph holding the same
 * folded weights and the same reshape and transpose chains (each of BERT
 * x4's whole-graph finishes evaluated every chain over its weights again
 * before the verdicts were kept: 0.07 s, now 0.03). The caller owns both. */
typedef struct OptFinishMemo {
  OptFoldMemo *folds;  /* opt_fold_weights_memo */
  PetPostCache *post;  /* pet_post_optimize_cached */
} OptFinishMemo;

/* Rewrites *g as optimize exports a search's result: weights folded into
 * initializers, biases, activations and residual adds folded into
 * convolutions, adds and activations regrouped through splits, concats
 * laid out in place; with pet, the same after pet_post_optimize too, and
 * whichever runs cheaper is kept. Exact. memo (optional) is what earlier
 * finishes computed. *out (optional) receives the counts and the cost as
 * run. */
TEQ_API int opt_finish(CostModel *cm, Graph **g, bool pet, const OptFinishMemo *memo,
                       OptFinish *out, Diag *d);
/* The cost as run of g finished as opt_finish would (g unchanged). */
TEQ_API int opt_finished_cost(CostModel *cm, const Graph *g, bool pet,
                              const OptFinishMemo *memo, double *us, Diag *d);

#endif
