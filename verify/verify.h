/* verify.h: verify-rules, the door of verify/: operator axioms
 * (specs/ops.axioms), proofs of candidate rules through Z3, counterexamples
 * by exact evaluation, and checks of the axioms themselves.
 *
 * A rule is proved when the axioms together with src != dst are
 * unsatisfiable. The axioms are not handed to Z3 as quantified formulas for
 * that: the prover instantiates them itself on the rule's own terms (an
 * e-graph saturated for a bounded number of rounds, every instance checked
 * to be well typed at the rule's concrete shapes), and Z3 decides the
 * resulting ground problem over an uninterpreted sort of tensors and integer
 * parameters. So Z3 never loops in E-matching, and a proof is a list of
 * axiom instances Z3 has checked. A rule that is not proved is evaluated on
 * random inputs, exactly in Z_p and then in float32 (where relu is relu,
 * not Z_p's polynomial stand-in); a difference is a counterexample
 * (refuted), no difference and no proof within the time limit is unknown.
 *
 * Ownership: an Axioms from axioms_load is freed with axioms_free; every
 * other pointer argument is borrowed. */
#ifndef TEQ_VERIFY_VERIFY_H
#define TEQ_VERIFY_VERIFY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/err.h"
#include "runtime/graph.h"

typedef struct Axioms Axioms;

/* Parses an axioms file. Errors (TEQ_ERR_INPUT): "path:line:col: expected
 * ..." for every syntax, sort or binding error found; TEQ_ERR_IO when the
 * file cannot be read. */
int axioms_load(const char *path, Axioms **out, Diag *d);
/* The same from text in memory; name is used in messages. */
int axioms_parse(const char *name, const char *text, size_t len, Axioms **out, Diag *d);
void axioms_free(Axioms *ax);
int axioms_count(const Axioms *ax);
/* 16 hex digits identifying the file's contents: results stored under one
 * hash are reused only while the axioms are unchanged. */
const char *axioms_hash(const Axioms *ax);
/* Whether an operator declaration binds the registry's axiom_name. */
bool axioms_binds(const Axioms *ax, const char *axiom_name);

/* ---- one rule ---- */

typedef enum VerifyResult { VERIFY_PROVED, VERIFY_REFUTED, VERIFY_UNKNOWN } VerifyResult;

const char *verify_result_name(VerifyResult r);

typedef struct VerifyLimits {
  int timeout_ms;      /* per rule; the prover and the search for a counterexample stop there */
  uint64_t seed;       /* random inputs of the counterexample search */
} VerifyLimits;

typedef struct VerifyOutcome {
  VerifyResult result;
  double millis;
  int instances;       /* axiom instances handed to Z3 */
  char *counterexample; /* refuted: shapes, position and values, malloc'd; else NULL */
} VerifyOutcome;

/* A prover for one thread: a Z3 context and the e-graph's memory. Z3
 * contexts are not shared between threads; each worker makes its own. */
typedef struct Prover Prover;

int prover_new(const Axioms *ax, const VerifyLimits *lim, Prover **out, Diag *d);
void prover_free(Prover *p);
/* Decides src = dst (aligned outputs, the same inputs). Errors only for
 * memory; outcome->counterexample is the caller's to free. */
int prover_decide(Prover *p, const Graph *src, const Graph *dst, VerifyOutcome *outcome,
                  Diag *d);

/* ---- the command ---- */

typedef struct VerifyOptions {
  const char *db_path;     /* rule database made by gen-rules */
  const char *axioms_path;
  int timeout_ms;
  int jobs;                /* worker threads, each with its own Z3 context */
  uint64_t seed;
  bool quiet;              /* no progress on stderr */
  FILE *progress;          /* stderr */
} VerifyOptions;

typedef struct VerifySummary {
  int64_t rules;           /* rules in the database */
  int64_t skipped;         /* decided earlier under the same axioms */
  int64_t decided[3];      /* by VerifyResult, this run */
  double wall_s;
  double max_ms;           /* the slowest rule */
  int64_t instances;       /* axiom instances over all rules */
  int64_t run_id;
} VerifySummary;

/* Decides every rule not yet decided under the axioms' hash and stores
 * each result (and the rule's status) in transactions. */
int verify_rules_run(const VerifyOptions *opt, VerifySummary *sum, Diag *d);
void verify_summary_print(const VerifyOptions *opt, const VerifySummary *sum, FILE *f);

/* ---- checking the axioms ---- */

typedef struct CheckOptions {
  const char *axioms_path;
  int timeout_ms;          /* per redundancy or consistency query */
  int budget_ms;           /* validation time per axiom; 0 for the default (30 s) */
  int jobs;
  bool validate, redundancy, consistency;
  bool quiet;
  FILE *progress;
} CheckOptions;

/* Validation alone (see verify_check_axioms), budget_s per axiom. */
int axioms_validate(const Axioms *ax, int jobs, double budget_s, FILE *out, int *n_false);

/* Validation (exact evaluation on small shapes), redundancy and
 * consistency; writes the report to out. *n_false receives the number of
 * axioms found false, plus one if the axioms proved two distinct inputs
 * equal (a failed check is not an error: the caller maps it to the exit
 * status). */
int verify_check_axioms(const CheckOptions *opt, FILE *out, int *n_false, Diag *d);

#endif
