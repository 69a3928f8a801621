/* pet.h: PET's mutation corrector (OSDI'21, section 5): which output boxes
 * of a mutant differ from its original multi-linear program, and a corrected
 * mutant that recomputes exactly those boxes with the original operators.
 *
 * Three steps, one file each. Box propagation (box.c) carries per-dimension
 * split points from a graph's inputs to its outputs; the boxes of a tensor
 * are the cells of the grid those points cut, and inside one box every
 * position has the same summation interval. The tester (corrector.c)
 * evaluates both programs exactly in Z_p, p = 2^31 - 1, on t random inputs
 * and compares, in every box of the common refinement of both programs'
 * boxes, the m+1 positions of PET's Theorem 1 (v0 and v0 + e_i); by
 * Theorem 2 (Schwartz-Zippel) a box that differs anywhere passes all t
 * trials with probability at most (n/p)^t, n the polynomial degree of the
 * programs. The correction (correct.c) rebuilds every differing region from
 * the original operators on sliced inputs and splices it into the mutant's
 * output with slice and concat.
 *
 * Constants (weights) keep their values: the tests check the programs that
 * will run, polynomials in the graph inputs only. A constant therefore gets
 * split points where its values change (between any two unequal adjacent
 * hyperplanes), so that inside a box it is constant along every axis that
 * reaches the output.
 *
 * Around the corrector: the mutation generator (mutate.c), the splitting
 * of a program into subprograms (split.c) and the post-optimization of a
 * program with mutants spliced in (post.c).
 *
 * Ownership: the caller provides PetBoxes, PetReport and PetRegions and
 * releases them with their _fini; everything else is borrowed. */
#ifndef TEQ_OPTIMIZE_PET_PET_H
#define TEQ_OPTIMIZE_PET_PET_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/err.h"
#include "runtime/graph.h"

/* ---- boxes ---- */

/* The boxes of one tensor: the grid cut by points[k][0..n_points[k]) along
 * each dimension k, sorted and strictly inside (0, extent[k]). */
typedef struct PetBoxes {
  int32_t ndim;
  int64_t extent[TEQ_MAX_DIMS];
  int32_t n_points[TEQ_MAX_DIMS];
  int64_t *points[TEQ_MAX_DIMS];
  int32_t cap[TEQ_MAX_DIMS];     /* room in points[k] */
  bool is_whole;  /* no structure known (an operator outside the analysis feeds it): one box,
                     compared at every position */
  char why[160];  /* for is_whole: the first operator that made it so */
} PetBoxes;

/* The boxes of output `output` of g. An operator outside the analysis does
 * not fail: the tensors it reaches become is_whole, and why names it.
 * Errors: TEQ_ERR_INPUT (bad output index, unknown shape), TEQ_ERR_NOMEM. */
TEQ_API int pet_boxes(const Graph *g, int output, PetBoxes *out, Diag *d);
TEQ_API void pet_boxes_fini(PetBoxes *b);
/* The common refinement of a and b (same shape): every split point of
 * either; is_whole if either is. out must not alias a or b. */
TEQ_API int pet_boxes_refine(const PetBoxes *a, const PetBoxes *b, PetBoxes *out, Diag *d);
/* Number of boxes (the product of n_points[k] + 1; 1 for is_whole). */
TEQ_API int64_t pet_boxes_count(const PetBoxes *b);
/* Bounds [lo[k], hi[k]) of box `index` (row-major over the interval grid). */
TEQ_API void pet_box_bounds(const PetBoxes *b, int64_t index, int64_t *lo, int64_t *hi);
/* "H {1, 7}" style text of the split points, for reports and tests. */
TEQ_API void pet_boxes_print(const PetBoxes *b, FILE *f);

/* The total degree of g's outputs as polynomials in its inputs (weights
 * are constants of degree 0): Theorem 2's n. -1 when an operator outside
 * the analysis (a non-linear stand-in, a division) leaves it unbounded. */
TEQ_API int pet_degree(const Graph *g);

/* ---- random tests ---- */

typedef struct PetTestOptions {
  int trials;          /* t random inputs; 0: the smallest t with (n/p)^t <= 2^-60 */
  uint64_t seed;       /* inputs and the positions v0 derive from it alone */
  bool all_positions;  /* also compare every position of every box (a cross-check; the
                          verdict is then per position, not by Theorem 1 alone) */
  bool stop_if_whole;  /* stop after a trial that finds some output different in every
                          box: a mutant its caller drops (the report holds fewer trials) */
} PetTestOptions;

typedef struct PetOutputReport {
  PetBoxes boxes;        /* the common refinement of both programs' boxes */
  int64_t n_boxes;
  uint8_t *differs;      /* per box: 1 if some tested position differed in some trial */
  int64_t n_differ;
  int64_t n_positions;   /* positions tested in this output (per trial) */
} PetOutputReport;

typedef struct PetReport {
  int32_t n_outputs;
  PetOutputReport *out;
  int trials;            /* t used */
  int degree;            /* n of Theorem 2: max of both programs' degrees; -1 unknown */
  double log2_bound;     /* log2 (n/p)^t: the chance a differing box passes; 0 if unknown */
  int64_t n_boxes, n_differ, n_positions;
  uint64_t seed;
} PetReport;

/* Tests mutant against orig. Both must have the same inputs (count,
 * shapes, element types) and outputs (count, shapes): TEQ_ERR_INPUT naming
 * the shapes otherwise. rep is written only on success. */
TEQ_API int pet_compare(const Graph *orig, const Graph *mutant, const PetTestOptions *o,
                        PetReport *rep, Diag *d);
TEQ_API void pet_report_fini(PetReport *rep);
/* pet_compare for many mutants of one original: *cache (NULL at first)
 * keeps the original's random inputs and outputs per trial, and its
 * values at the positions last tested, so that it runs once per trial,
 * not once per mutant. The original must outlive the cache and stay
 * unchanged; release it with pet_orig_runs_free. Threads testing mutants
 * of one original share one cache, made before them with
 * pet_orig_runs_new for that original and the tests' seed. */
typedef struct PetOrigRuns PetOrigRuns;
TEQ_API PetOrigRuns *pet_orig_runs_new(const Graph *orig, uint64_t seed);
TEQ_API int pet_compare_cached(const Graph *orig, const Graph *mutant, const PetTestOptions *o,
                               PetOrigRuns **cache, PetReport *rep, Diag *d);
TEQ_API void pet_orig_runs_free(PetOrigRuns *c);
/* Boxes, which differ, positions, t and the probability bound, as text. */
TEQ_API void pet_report_print(const PetReport *rep, FILE *f);
/* The smallest t with (n/p)^t <= 2^-60 (n < 1 is taken as 1). */
TEQ_API int pet_default_trials(int degree);

/* ---- correction ---- */

/* One region of an output recomputed with the original operators. */
typedef struct PetRegion {
  int32_t output;
  int32_t ndim;
  int64_t lo[TEQ_MAX_DIMS], hi[TEQ_MAX_DIMS];
} PetRegion;

typedef struct PetRegions {
  int32_t n;
  PetRegion *v;
} PetRegions;

/* A new graph: mutant, with every differing box of rep (adjacent ones
 * merged into larger regions) recomputed from orig's operators on the
 * needed input slices and written into the mutant's output. regions (may
 * be NULL) receives what was recomputed. Errors: TEQ_ERR_INPUT (rep does
 * not fit the graphs), TEQ_ERR_UNSUPPORTED (a region would need an operator
 * the correction does not know, named in the message, or the mutant holds
 * an opaque node), TEQ_ERR_NOMEM. *corrected is written only on success and
 * passes graph_check. */
TEQ_API int pet_correct(const Graph *orig, const Graph *mutant, const PetReport *rep,
                        Graph **corrected, PetRegions *regions, Diag *d);
TEQ_API void pet_regions_fini(PetRegions *r);
/* Elements the regions recompute, summed over the regions. */
TEQ_API int64_t pet_regions_elements(const PetRegions *r);

/* ---- mutation generation (mutate.c) ---- */

/* PET's Algorithm 1: programs over the same inputs and weights whose
 * outputs have the original's shapes, built one operator at a time with
 * parameters derived from the shapes and the original's operators: layouts
 * (reshape + transpose fused) moving batch to H/W and back, dilation phases
 * into the batch, space-to-depth of inputs and kernels, H or W cut into the
 * batch in pieces with halos (a seam's correction fused into the conv,
 * PET's Fig. 6); conv with the
 * original's parameters or with dilation or stride folded away; matmul;
 * splits into the original's outputs; and weight-only operators (kernel
 * zero-padding, concatenation), which optimize folds into constants. */
#define PET_MUTATE_DEPTH 3
#define PET_MUTATE_MAX_MUTANTS 64
#define PET_MUTANT_DESC_MAX 256

typedef struct PetMutateOptions {
  int depth;        /* operators per mutant, weight-only ones not counted; 0: PET_MUTATE_DEPTH */
  int max_mutants;  /* 0: PET_MUTATE_MAX_MUTANTS */
  uint64_t seed;    /* of the random tests (PetTestOptions.seed) */
  int trials;       /* PetTestOptions.trials; 0: the default */
  int jobs;         /* threads testing the candidates side by side; 0 or 1: this one */
} PetMutateOptions;

typedef struct PetMutant {
  Graph *graph;                   /* owned; the raw mutant, uncorrected */
  char desc[PET_MUTANT_DESC_MAX]; /* how it was built: "layout H,W phases 2 -> batch, conv2d..." */
  PetReport report;               /* pet_compare(original, graph) */
} PetMutant;

/* Generates the mutants of the multi-linear subprogram orig, tests each
 * with pet_compare and returns, in search order, those that do not differ
 * in every box of any output (at most max_mutants, neither the original nor duplicates
 * by graph_hash). o may be NULL (defaults). Errors: TEQ_ERR_INPUT (an
 * operator outside PET's Table 1 or with a fused activation or bias, named
 * in the message), TEQ_ERR_NOMEM. *out and *n_out are written only on
 * success; release with pet_mutants_free. */
TEQ_API int pet_mutate(const Graph *orig, const PetMutateOptions *o, PetMutant **out, int *n_out,
                       Diag *d);
TEQ_API void pet_mutants_free(PetMutant *m, int n);
/* Whether node id of g is one of PET's Table 1 operators in its plain form
 * (no fused activation, no bias, zero padding): what pet_mutate accepts. */
TEQ_API bool pet_is_multilinear(const Graph *g, int id);

/* ---- program splitting (split.c) ---- */

/* The regions of a graph (maximal connected sets of multi-linear operators
 * that compute on data) and, inside them, the subprograms the search asks
 * pet_mutate about: each plain conv or matmul whose second operand is a
 * weight, each pair of them reading the same tensor (Fig. 10a), and each
 * pair of independent convs of one shape reading different tensors (merged
 * into a grouped conv). A conv is paired with at most PET_SPLIT_PAIR_REACH
 * later groupable convs. */
#define PET_SPLIT_MAX_SUBPROGRAMS 64
#define PET_SPLIT_PAIR_REACH 8

typedef struct PetSplitOptions {
  int max_subprograms;  /* 0: PET_SPLIT_MAX_SUBPROGRAMS */
} PetSplitOptions;

typedef struct PetSubprogram {
  Graph *graph;     /* owned: inputs are the tensors it reads (weights too: the tests in Z_p
                       need integers, and a mutant then holds for any weights), outputs
                       the tensors read outside it */
  int32_t region;   /* a node id of the region it lies in (its union-find root) */
  int32_t n_nodes;
  int32_t *nodes;   /* the big graph's nodes, in topological order */
  TensorRef *in;    /* per graph input: the big graph's tensor it reads */
  TensorRef *out;   /* per graph output: the big graph's tensor it replaces */
  double flops;     /* of its nodes (cost_node_flops): what a test in Z_p costs, roughly */
  uint64_t hash;    /* graph_hash(graph): equal for the same operators at the same shapes */
} PetSubprogram;

typedef struct PetSplit {
  int n_regions;
  int n;
  PetSubprogram *v;
} PetSplit;

/* Whether convs a and b of g can run side by side as one grouped conv
 * (their inputs concatenated along channels, twice the groups): the same
 * input shape, kernel channels, output shape, stride, dilation and groups
 * (the kernels' extents and pads may differ: the smaller is zero-padded). */
TEQ_API bool pet_groupable(const Graph *g, int a, int b);

/* Splits g (no cycle). o may be NULL. Errors: TEQ_ERR_NOMEM. */
TEQ_API int pet_split(const Graph *g, const PetSplitOptions *o, PetSplit *out, Diag *d);
TEQ_API void pet_split_fini(PetSplit *s);

/* ---- post-optimization (post.c) ---- */

/* Section 6.3 on a whole program with mutants spliced in: reshapes and
 * transposes moved after the element-wise operators they feed, chains of
 * them that compose to the identity (inverse groups, checked by running
 * the chain on its index map in Z_p) removed, and consecutive ones fused.
 * Operators computed from weights alone are optimize's (opt_fold_weights). */
typedef struct PetPostStats {
  int64_t moved;    /* reshapes and transposes moved after an element-wise operator */
  int64_t removed;  /* chains of them found to be the identity, removed */
  int64_t fused;    /* reshape pairs, or transpose pairs, made one operator */
  int64_t hoisted;  /* splits into heads made one transpose and a split along axis 0 */
} PetPostStats;

/* Rewrites of every kind counted in s. */
static inline int64_t pet_post_rewrites(const PetPostStats *s) {
  return s->moved + s->removed + s->fused + s->hoisted;
}

/* Rewrites *g in place until none of the four applies. Graph outputs
 * keep their names and values (one may come to be computed by another
 * node, never to pass a graph input or weight straight through), opaque
 * nodes are not rewritten, and nodes no output needs are removed. On
 * success the result passes graph_check, and *stats (may be NULL)
 * receives the counts; on failure *g may be rewritten in part (each
 * rewrite computes what it replaced). Errors: TEQ_ERR_NOMEM,
 * TEQ_ERR_INTERNAL. */
TEQ_API int pet_post_optimize(Graph **g, PetPostStats *stats, Diag *d);
/* The same, remembering across calls the constants it moved back through
 * an R/T (a search post-optimizes the same mutant beside the same bias in
 * graph after graph). The cache holds references to those constants;
 * release it with pet_post_cache_free. */
typedef struct PetPostCache PetPostCache;
TEQ_API PetPostCache *pet_post_cache_new(void);
TEQ_API void pet_post_cache_free(PetPostCache *c);
TEQ_API int pet_post_optimize_cached(Graph **g, PetPostCache *cache, PetPostStats *stats,
                                     Diag *d);
/* Whether the post-optimization of g with sub spliced in (sub's input k
 * reading in[k] of g, its output k replacing out[k]) is sure to find
 * nothing to rewrite, given that it finds nothing in g: no reshape or
 * transpose of sub meets another, or an element-wise operator, inside it
 * or across its boundary, none is an identity by its shapes, and none of
 * g's loses a reader. False when unsure. A search then derives such a
 * candidate as it derives a rule's rewrite, without building it. */
TEQ_API bool pet_post_splice_quiet(const Graph *g, const Graph *sub, const TensorRef *in,
                                   const TensorRef *out);

#endif
