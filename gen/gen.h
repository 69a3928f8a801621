/* gen.h: gen-rules, TASO's rule generator rebuilt to scale.
 *
 * Every graph of up to `depth` operators over a pool of typed variables is
 * enumerated once, in a canonical order, and evaluated in Z_p on random
 * inputs; graphs are spilled to on-disk buckets by fingerprint and each
 * bucket is then read alone, by worker threads: equal fingerprints are
 * compared element by element, confirmed on a second random input and at
 * a second assignment of shapes, paired, and put in canonical form. All
 * buckets' candidates are then merged and pruned (input renaming, TASO's
 * two common-subgraph forms, disjoint unions) in threads, and stored in
 * the rule database as candidates.
 *
 * Work is resumable: the database records the run and each finished bucket
 * in transactions, so a killed run is completed by running the same
 * command again. Depth 5 and beyond would partition the first level of the
 * enumeration across the ranks of an MPI job and give each rank the
 * buckets b with b % ranks == rank; the phases are already separated that
 * way (gen_enumerate writes buckets, a bucket worker reads one), and the
 * merge needs only the candidates, about 56 bytes each. */
#ifndef TEQ_GEN_GEN_H
#define TEQ_GEN_GEN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/err.h"

typedef struct GenOptions {
  int depth;            /* operators per graph, 1..5 */
  const char *ops;      /* --ops list, NULL for TASO's set */
  const char *db_path;  /* the rule database */
  int threads;          /* worker threads, >= 1 */
  uint64_t seed;        /* random inputs */
  bool quiet;           /* no progress on stderr */
  FILE *progress;       /* where progress goes (stderr) */
} GenOptions;

/* What a run found, step by step (TASO's Table 3 and more). */
typedef struct GenSummary {
  int64_t graphs;          /* graphs enumerated (evaluated) */
  int64_t emitted;         /* graphs written to buckets */
  int64_t fp_groups;       /* fingerprints shared by two or more graphs */
  int64_t collisions;      /* equal fingerprints, different values */
  int64_t one_input_only;  /* equal on one random input, not another */
  int64_t shape_specific;  /* pairs equal at one shape assignment only */
  int64_t pairs;           /* candidate pairs before pruning */
  int64_t after_renaming;
  int64_t after_common;    /* after both common-subgraph forms */
  int64_t after_disjoint;  /* after removing disjoint unions */
  int64_t after_float32;   /* after dropping rules that differ in float32 */
  int64_t stored;          /* new rules written to the database */
  double enumerate_s, buckets_s, prune_s, wall_s;
  int64_t peak_rss_kb;
  int64_t run_id;
  bool resumed;            /* an interrupted run was completed */
} GenSummary;

/* Runs the whole pipeline. Errors: TEQ_ERR_INPUT for a bad option or
 * database, TEQ_ERR_IO for an unwritable file, with messages in d. */
int gen_rules_run(const GenOptions *opt, GenSummary *sum, Diag *d);

/* Writes the summary table (stdout in gen-rules). */
void gen_summary_print(const GenOptions *opt, const GenSummary *sum, FILE *f);

#endif
