/* ruledb.h: the rule database, one SQLite file shared by gen-rules,
 * verify-rules and optimize.
 *
 * A rule is an equation between two graphs over the same variables: src and
 * dst are runtime Graphs whose OP_INPUT nodes are the rule's variables (the
 * same names, shapes and order on both sides) and whose outputs are aligned
 * (src output i equals dst output i). Shapes are those the rule was found
 * at; a rule applies wherever the registry's shape inference accepts it.
 * Each rule is stored three ways: as protobuf-c messages (ruledb/rule.proto,
 * operator kinds by registry name, so reordering ops.def never corrupts a
 * database), as S-expression text for people, and under a canonical key
 * (UNIQUE) that its producer computes, so the same rule cannot be stored
 * twice.
 *
 * The schema is versioned (PRAGMA user_version) and migrated forward on
 * open; PRAGMA application_id marks the file as ours, and any other
 * non-empty SQLite file, or a file that is not SQLite, is refused with
 * TEQ_ERR_INPUT. Every write is in a transaction, and the file runs in WAL
 * mode, so killing a command at any moment leaves a consistent database. */
#ifndef TEQ_RULEDB_RULEDB_H
#define TEQ_RULEDB_RULEDB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/err.h"
#include "runtime/graph.h"

#define RULEDB_APPLICATION_ID 0x54657121 /* "Teq!" */

typedef struct RuleDb RuleDb;

typedef enum RuleStatus {
  RULE_CANDIDATE, /* found by gen-rules, not yet decided */
  RULE_PROVED,    /* entailed by the axioms (verify-rules) */
  RULE_REFUTED,   /* a counterexample exists */
  RULE_UNKNOWN,   /* the prover ran out of time */
} RuleStatus;

/* "candidate", "proved", ...; and back (-1 for an unknown word). */
TEQ_API const char *rule_status_name(RuleStatus s);
TEQ_API int rule_status_from_name(const char *name);

typedef struct Rule {
  int64_t id;        /* row id; 0 before it is stored */
  Graph *src, *dst;  /* owned by the Rule */
  char *key;         /* canonical key, owned; the producer computes it */
  RuleStatus status;
  int depth;         /* operators in the larger side */
  int64_t run_id;    /* the run that produced it; 0 if none */
} Rule;

/* Frees src, dst and key (not r itself, which is usually on the stack). */
TEQ_API void rule_fini(Rule *r);

/* Operators that compute in a rule side: every node but OP_INPUT. Constant
 * tensors (const_pool, ...) count, as in TASO. */
TEQ_API int rule_side_ops(const Graph *g);

/* ---- text ---- */

/* The S-expression of one side, malloc'd. Single-use nodes are written
 * inline, a node used more than once or with several outputs is bound
 * with let, parameters that differ from the defaults follow the operator
 * name in brackets, a multi-output graph is a tuple:
 *   (matmul (matmul x1 w1) w2)
 *   (conv2d[pads=(1 1 1 1) act=relu] i1 w4)
 *   (let ((t1 (split[axis=1 sizes=(4 4)] (matmul x1 (concat[axis=1] w1 w2)))))
 *     (tuple t1.0 t1.1))                                  (on one line)
 * NULL when memory runs out. */
TEQ_API char *rule_side_text(const Graph *g);
/* "<src text> => <dst text>", malloc'd. */
TEQ_API char *rule_text(const Rule *r);

/* ---- protobuf ---- */

/* One side as a packed teq.RuleGraph message (malloc'd, *len bytes). */
TEQ_API int rule_side_encode(const Graph *g, uint8_t **buf, size_t *len, Diag *d);
/* And back; checks every kind name, arity, parameter and edge, re-infers
 * shapes, and reports a damaged or foreign message as TEQ_ERR_INPUT. */
TEQ_API int rule_side_decode(const uint8_t *buf, size_t len, Graph **g, Diag *d);

/* ---- the database ---- */

typedef enum RuleDbMode {
  RULEDB_READ,   /* must exist; never written */
  RULEDB_WRITE,  /* created if missing, migrated to the current schema */
} RuleDbMode;

/* Opens path. Errors (TEQ_ERR_INPUT with the path and the reason): not a
 * SQLite file, another application's database, a schema newer than this
 * build knows, a missing file in RULEDB_READ mode; TEQ_ERR_IO when the file
 * or its directory cannot be written. */
TEQ_API int ruledb_open(const char *path, RuleDbMode mode, RuleDb **db, Diag *d);
TEQ_API void ruledb_close(RuleDb *db);
/* The schema version this build writes (the highest migration). */
TEQ_API int ruledb_schema_version(void);
/* The SQL that takes the schema from version - 1 to version (1 ..
 * ruledb_schema_version()), or NULL. For tests that build an old file;
 * ruledb_open applies the migrations itself. */
TEQ_API const char *ruledb_migration_sql(int version);

/* Explicit transactions around several writes; each write call below is
 * otherwise a transaction of its own. */
TEQ_API int ruledb_begin(RuleDb *db, Diag *d);
TEQ_API int ruledb_commit(RuleDb *db, Diag *d);
TEQ_API void ruledb_rollback(RuleDb *db);

/* PRAGMA integrity_check and foreign_key_check; TEQ_OK or TEQ_ERR_INPUT
 * with what SQLite reported. */
TEQ_API int ruledb_integrity_check(RuleDb *db, Diag *d);

/* ---- runs: who produced what, with which arguments ---- */

typedef struct RunInfo {
  const char *command;  /* "gen-rules" */
  const char *args;     /* the normalised arguments, e.g. "--depth 3 --ops ..." */
  uint64_t seed;
  const char *version;  /* Teq's version */
} RunInfo;

/* A new run in state "running"; *run_id receives its id. */
TEQ_API int ruledb_run_start(RuleDb *db, const RunInfo *info, int64_t *run_id, Diag *d);
/* The newest run of command with exactly these args and seed that is still
 * "running" (it was killed), or *run_id = 0 when there is none. */
TEQ_API int ruledb_run_find_unfinished(RuleDb *db, const RunInfo *info, int64_t *run_id,
                                       Diag *d);
/* Marks a run "done" with its wall time, peak RSS and a JSON object of
 * statistics (counts after each step...). */
TEQ_API int ruledb_run_finish(RuleDb *db, int64_t run_id, double wall_s, int64_t peak_rss_kb,
                              const char *stats_json, Diag *d);

/* ---- per-run work units: resumable phases ---- */

/* A work unit (a fingerprint bucket of gen-rules) is done when its result
 * blob is stored; storing is one transaction, so a unit is either wholly
 * done or not at all. */
TEQ_API int ruledb_unit_store(RuleDb *db, int64_t run_id, int unit, const void *blob, size_t len,
                              Diag *d);
/* Drops every work unit of run_id: a finished run needs none (they serve
 * only to resume it), and at depth 4 they are most of the file. */
TEQ_API int ruledb_unit_clear(RuleDb *db, int64_t run_id, Diag *d);
/* Rewrites the file (VACUUM) when more than half of it is free pages, as
 * after ruledb_unit_clear. Outside a transaction. */
TEQ_API int ruledb_compact(RuleDb *db, Diag *d);
/* *done = whether unit has a stored result. */
TEQ_API int ruledb_unit_done(RuleDb *db, int64_t run_id, int unit, bool *done, Diag *d);
/* Calls fn on every stored unit of run_id in unit order; a non-zero return
 * from fn stops and is returned. */
TEQ_API int ruledb_unit_foreach(RuleDb *db, int64_t run_id,
                                int (*fn)(int unit, const void *blob, size_t len, void *ctx),
                                void *ctx, Diag *d);

/* ---- rules ---- */

/* Stores r (encoding both sides, writing its text) with status r->status
 * and r->run_id, unless a rule with the same key exists: then nothing
 * changes and *inserted is false. */
TEQ_API int ruledb_insert_rule(RuleDb *db, const Rule *r, bool *inserted, Diag *d);
/* Number of rules with status s, or of all rules when s < 0. */
TEQ_API int ruledb_count_rules(RuleDb *db, int status, int64_t *n, Diag *d);
/* Calls fn on every rule with status s (all when s < 0) in id order,
 * decoded; the Rule is freed after fn returns. fn may keep r->src, r->dst
 * or r->key by taking it and setting the field to NULL (a reader that keeps
 * every rule need not copy them). A non-zero return from fn stops the walk
 * and is returned. */
TEQ_API int ruledb_foreach_rule(RuleDb *db, int status, int (*fn)(Rule *r, void *ctx),
                                void *ctx, Diag *d);

/* ---- verification results (verify-rules) ---- */

/* Calls fn on every rule that has no 'proved' or 'refuted' verification
 * stored under axioms_hash, in id order (as ruledb_foreach_rule). */
TEQ_API int ruledb_foreach_undecided(RuleDb *db, const char *axioms_hash,
                                     int (*fn)(Rule *r, void *ctx), void *ctx, Diag *d);
/* Stores one verification ('proved', 'refuted' or 'unknown' as status),
 * with its time and counterexample (may be NULL), and sets the rule's
 * status to match. Use inside ruledb_begin/commit to batch. */
TEQ_API int ruledb_store_verification(RuleDb *db, int64_t rule_id, int64_t run_id,
                                      const char *axioms_hash, RuleStatus status, double millis,
                                      const char *counterexample, Diag *d);
/* Number of runs of command (e.g. "gen-rules") in the database. */
TEQ_API int ruledb_count_runs(RuleDb *db, const char *command, int64_t *n, Diag *d);

/* The cost cache: one measured time per (device, operator configuration
 * key, see runtime/cost.h), with how it was measured and the algorithm the
 * kernel chose; a new measurement replaces the old. */
TEQ_API int ruledb_cost_store(RuleDb *db, const char *device, const char *config, double micros,
                              const char *method, const char *algo, Diag *d);

#endif
