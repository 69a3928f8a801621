/* run.c: gen-rules from end to end, resumable.
 *
 * Phases, each leaving the database consistent:
 *   1. enumerate into bucket files in a work directory beside the database
 *      (<db>.gen-<run>); a marker file written last says it finished;
 *   2. each bucket's pairs go into the database as one work unit, in one
 *      transaction, so a bucket is done or not;
 *   3. prune all pairs and store the rules, and mark the run done, in one
 *      transaction; then the work directory is removed.
 * A run killed anywhere is found again by its arguments and seed, and the
 * same command goes on from the last finished phase or bucket. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gen/gen_int.h"
#include "ruledb/ruledb.h"

#ifndef TEQ_VERSION
#define TEQ_VERSION "unknown"
#endif

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t peak_rss_kb(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) ? 0 : (int64_t)ru.ru_maxrss;
}

/* ---- progress on stderr: a rewritten line on a terminal, else a line
 * every ten seconds ---- */

typedef struct Progress {
  FILE *f;
  bool tty;
  double start, last;
  const char *phase;
} Progress;

static void progress_begin(Progress *p, FILE *f, const char *phase) {
  p->f = f;
  p->tty = f && isatty(fileno(f));
  p->start = p->last = now_s();
  p->phase = phase;
}

static void fmt_eta(double s, char *buf, size_t size) {
  if (s < 0 || s > 1e7) snprintf(buf, size, "?");
  else if (s < 60) snprintf(buf, size, "%.0fs", s);
  else if (s < 3600) snprintf(buf, size, "%dm%02ds", (int)s / 60, (int)s % 60);
  else snprintf(buf, size, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
}

static void progress_line(Progress *p, bool force, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void progress_line(Progress *p, bool force, const char *fmt, ...) {
  if (!p->f) return;
  double t = now_s();
  if (!force && t - p->last < (p->tty ? 0.2 : 10.0)) return;
  p->last = t;
  va_list ap;
  va_start(ap, fmt);
  fprintf(p->f, p->tty ? "\r%s: " : "%s: ", p->phase);
  vfprintf(p->f, fmt, ap);
  fputs(p->tty ? "\033[K" : "\n", p->f);
  va_end(ap);
  fflush(p->f);
}

static void progress_end(Progress *p) {
  if (p->f && p->tty) fputc('\n', p->f);
}

static void on_enum_progress(void *ctx, int64_t graphs, int done, int total) {
  Progress *p = ctx;
  double el = now_s() - p->start;
  char eta[32];
  fmt_eta(done ? el * (total - done) / done : -1, eta, sizeof eta);
  progress_line(p, done == total, "%" PRId64 " graphs, %.0f/s, first operators %d/%d, ETA %s",
                graphs, el > 0 ? (double)graphs / el : 0, done, total, eta);
}

/* ---- the work directory ---- */

static int remove_dir(const char *dir) {
  DIR *dh = opendir(dir);
  if (!dh) return errno == ENOENT ? TEQ_OK : TEQ_ERR_IO;
  struct dirent *e;
  char path[4096];
  while ((e = readdir(dh)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(path, sizeof path, "%.3800s/%.255s", dir, e->d_name);
      unlink(path);
    }
  closedir(dh);
  return rmdir(dir) ? TEQ_ERR_IO : TEQ_OK;
}

static int write_marker(const char *dir, const GenEnumStats *st, Diag *d) {
  char tmp[4096], path[4096];
  snprintf(tmp, sizeof tmp, "%.4000s/enumerated.tmp", dir);
  snprintf(path, sizeof path, "%.4000s/enumerated", dir);
  FILE *f = fopen(tmp, "w");
  if (!f) return diag_error(d, "%s: %s", tmp, strerror(errno)), TEQ_ERR_IO;
  fprintf(f, "%" PRId64 " %" PRId64 " %d\n", st->graphs, st->emitted, st->roots);
  if (fflush(f) || fsync(fileno(f)) || fclose(f) || rename(tmp, path))
    return diag_error(d, "%s: %s", path, strerror(errno)), TEQ_ERR_IO;
  return TEQ_OK;
}

static bool read_marker(const char *dir, GenEnumStats *st) {
  char path[4096];
  snprintf(path, sizeof path, "%.4000s/enumerated", dir);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  bool ok = fscanf(f, "%" SCNd64 " %" SCNd64 " %d", &st->graphs, &st->emitted, &st->roots) == 3;
  fclose(f);
  return ok;
}

/* ---- bucket results as database work units ---- */

typedef struct UnitHeader {
  GenBucketStats st;
  uint64_t n_pairs;
} UnitHeader;

static int store_bucket(RuleDb *db, int64_t run, int b, const GenBucketStats *st,
                        const GenPair *pairs, size_t n, Diag *d) {
  size_t len = sizeof(UnitHeader) + n * sizeof *pairs;
  uint8_t *blob = malloc(len);
  if (!blob) return TEQ_ERR_NOMEM;
  UnitHeader h = {*st, n};
  memcpy(blob, &h, sizeof h);
  if (n) memcpy(blob + sizeof h, pairs, n * sizeof *pairs);
  int rc = ruledb_unit_store(db, run, b, blob, len, d);
  free(blob);
  return rc;
}

typedef struct Gather {
  GenPair *pairs;
  size_t n, cap;
  GenBucketStats st;
} Gather;

static int gather_unit(int unit, const void *blob, size_t len, void *ctx) {
  (void)unit;
  Gather *g = ctx;
  UnitHeader h;
  if (len < sizeof h) return TEQ_ERR_INPUT;
  memcpy(&h, blob, sizeof h);
  if (len != sizeof h + h.n_pairs * sizeof(GenPair)) return TEQ_ERR_INPUT;
  g->st.fp_groups += h.st.fp_groups;
  g->st.collisions += h.st.collisions;
  g->st.one_input_only += h.st.one_input_only;
  g->st.shape_specific += h.st.shape_specific;
  if (g->n + h.n_pairs > g->cap) {
    size_t cap = 2 * (g->n + h.n_pairs) + 64;
    GenPair *p = realloc(g->pairs, cap * sizeof *p);
    if (!p) return TEQ_ERR_NOMEM;
    g->pairs = p, g->cap = cap;
  }
  if (h.n_pairs) memcpy(g->pairs + g->n, (const uint8_t *)blob + sizeof h, h.n_pairs * sizeof(GenPair));
  g->n += h.n_pairs;
  return TEQ_OK;
}

/* ---- the run ---- */

static int buckets_for_depth(int depth) {
  return depth <= 2 ? 4 : depth == 3 ? 16 : depth == 4 ? 256 : 1024;
}

static void stats_json(const GenSummary *s, const GenVocab *v, char *buf, size_t size) {
  snprintf(buf, size,
           "{\"templates\": %d, \"variables\": %d, \"graphs\": %" PRId64 ", \"emitted\": %" PRId64
           ", \"fp_groups\": %" PRId64 ", \"collisions\": %" PRId64
           ", \"one_input_only\": %" PRId64 ", \"shape_specific\": %" PRId64
           ", \"pairs\": %" PRId64 ", \"after_renaming\": %" PRId64
           ", \"after_common\": %" PRId64 ", \"after_disjoint\": %" PRId64
           ", \"stored\": %" PRId64 ", \"enumerate_s\": %.3f, \"buckets_s\": %.3f"
           ", \"prune_s\": %.3f}",
           v->n_templates - 1, v->n_vars, s->graphs, s->emitted, s->fp_groups, s->collisions,
           s->one_input_only, s->shape_specific, s->pairs, s->after_renaming, s->after_common,
           s->after_disjoint, s->stored, s->enumerate_s, s->buckets_s, s->prune_s);
}

int gen_rules_run(const GenOptions *opt, GenSummary *sum, Diag *d) {
  memset(sum, 0, sizeof *sum);
  double t0 = now_s();
  if (opt->depth < 1 || opt->depth > GEN_MAX_DEPTH)
    return diag_error(d, "--depth %d: must be 1 to %d", opt->depth, GEN_MAX_DEPTH);
  if (opt->threads < 1 || opt->threads > 64)
    return diag_error(d, "--threads %d: must be 1 to 64", opt->threads);
  GenVocab *v = malloc(sizeof *v);
  if (!v) return TEQ_ERR_NOMEM;
  int rc = gen_vocab_build(v, opt->ops, d);
  if (rc) {
    free(v);
    return rc;
  }
  RuleDb *db = NULL;
  rc = ruledb_open(opt->db_path, RULEDB_WRITE, &db, d);
  if (rc) {
    free(v);
    return rc;
  }

  char args[600];
  snprintf(args, sizeof args, "--depth %d --ops %s", opt->depth, opt->ops ? opt->ops : "default");
  RunInfo info = {"gen-rules", args, opt->seed, TEQ_VERSION};
  int64_t run = 0;
  rc = ruledb_run_find_unfinished(db, &info, &run, d);
  if (!rc && run) sum->resumed = true;
  if (!rc && !run) rc = ruledb_run_start(db, &info, &run, d);
  sum->run_id = run;

  char dir[3968]; /* room for file names below it in 4096 */
  if (!rc && strlen(opt->db_path) > sizeof dir - 32)
    rc = diag_error(d, "--db: path too long");
  snprintf(dir, sizeof dir, "%.3900s.gen-%" PRId64, opt->db_path, run);
  GenEnumOptions eo = {
    .depth = opt->depth, .threads = opt->threads, .n_buckets = buckets_for_depth(opt->depth),
    .seed = opt->seed, .dir = dir,
  };
  Progress pr;
  FILE *pf = opt->quiet ? NULL : opt->progress;

  /* 1. Enumerate, unless a killed run finished this already. */
  GenEnumStats es = {0};
  double t1 = now_s();
  if (!rc && !read_marker(dir, &es)) {
    remove_dir(dir);
    if (mkdir(dir, 0777) && errno != EEXIST)
      rc = diag_error(d, "%s: cannot create the work directory: %s", dir, strerror(errno)),
      rc = TEQ_ERR_IO;
    if (!rc) {
      progress_begin(&pr, pf, "enumerate");
      eo.on_progress = on_enum_progress;
      eo.progress_ctx = &pr;
      rc = gen_enumerate(v, &eo, &es, d);
      progress_end(&pr);
    }
    if (!rc) rc = write_marker(dir, &es, d);
  }
  sum->graphs = es.graphs;
  sum->emitted = es.emitted;
  sum->enumerate_s = now_s() - t1;

  /* 2. Buckets, one transaction each. */
  double t2 = now_s();
  progress_begin(&pr, pf, "buckets");
  int64_t n_pairs = 0;
  for (int b = 0; !rc && b < eo.n_buckets; b++) {
    bool done = false;
    rc = ruledb_unit_done(db, run, b, &done, d);
    if (rc || done) continue;
    GenRecord *recs = NULL;
    size_t n = 0;
    rc = gen_bucket_load(&eo, b, &recs, &n, d);
    GenPair *pairs = NULL;
    size_t np = 0;
    GenBucketStats bs = {0};
    if (!rc) rc = gen_bucket_pairs(v, opt->seed, recs, n, &pairs, &np, &bs, d);
    free(recs);
    if (!rc) rc = store_bucket(db, run, b, &bs, pairs, np, d);
    free(pairs);
    n_pairs += (int64_t)np;
    double el = now_s() - t2;
    char eta[32];
    fmt_eta(el * (eo.n_buckets - b - 1) / (b + 1), eta, sizeof eta);
    progress_line(&pr, b + 1 == eo.n_buckets, "%d/%d buckets, %" PRId64 " pairs, ETA %s", b + 1,
                  eo.n_buckets, n_pairs, eta);
  }
  progress_end(&pr);
  sum->buckets_s = now_s() - t2;

  /* 3. Prune and store. */
  double t3 = now_s();
  Gather g = {0};
  if (!rc) rc = ruledb_unit_foreach(db, run, gather_unit, &g, d);
  if (rc == TEQ_ERR_INPUT && !d->n_errors)
    diag_error(d, "%s: a stored bucket of run %" PRId64 " is damaged", opt->db_path, run);
  GenRule *rules = NULL;
  size_t n_rules = 0;
  GenPruneStats ps = {0};
  if (!rc) rc = gen_prune(v, opt->seed, g.pairs, g.n, &rules, &n_rules, &ps, d);
  sum->fp_groups = g.st.fp_groups;
  sum->collisions = g.st.collisions;
  sum->one_input_only = g.st.one_input_only;
  sum->shape_specific = g.st.shape_specific;
  sum->pairs = ps.initial;
  sum->after_renaming = ps.after_renaming;
  sum->after_common = ps.after_common;
  sum->after_disjoint = ps.after_disjoint;
  free(g.pairs);
  sum->prune_s = now_s() - t3;

  if (!rc) rc = ruledb_begin(db, d);
  for (size_t i = 0; !rc && i < n_rules; i++) {
    Rule r;
    rc = gen_rule_to_ruledb(v, &rules[i], &r, d);
    if (rc) break;
    r.run_id = run;
    bool inserted = false;
    rc = ruledb_insert_rule(db, &r, &inserted, d);
    sum->stored += inserted;
    rule_fini(&r);
  }
  sum->wall_s = now_s() - t0;
  sum->peak_rss_kb = peak_rss_kb();
  if (!rc) {
    char json[1024];
    stats_json(sum, v, json, sizeof json);
    rc = ruledb_run_finish(db, run, sum->wall_s, sum->peak_rss_kb, json, d);
  }
  if (!rc) rc = ruledb_commit(db, d);
  else ruledb_rollback(db);
  if (!rc) remove_dir(dir);
  gen_rules_free(rules, n_rules);
  ruledb_close(db);
  free(v);
  return rc;
}

void gen_summary_print(const GenOptions *opt, const GenSummary *s, FILE *f) {
  fprintf(f, "gen-rules depth %d, seed %" PRIu64 "%s, run %" PRId64 " in %s\n", opt->depth,
          opt->seed, s->resumed ? " (resumed)" : "", s->run_id, opt->db_path);
  fprintf(f, "  %-32s %12" PRId64 "\n", "graphs enumerated", s->graphs);
  fprintf(f, "  %-32s %12" PRId64 "\n", "graphs fingerprinted", s->emitted);
  fprintf(f, "  %-32s %12" PRId64 "\n", "shared fingerprints", s->fp_groups);
  fprintf(f, "  %-32s %12" PRId64 "\n", "fingerprint collisions", s->collisions);
  fprintf(f, "  %-32s %12" PRId64 "\n", "equal on one input only", s->one_input_only);
  fprintf(f, "  %-32s %12" PRId64 "\n", "equal at one shape only", s->shape_specific);
  fprintf(f, "  %-32s %12" PRId64 "\n", "candidate pairs (initial)", s->pairs);
  fprintf(f, "  %-32s %12" PRId64 "\n", "after input renaming", s->after_renaming);
  fprintf(f, "  %-32s %12" PRId64 "\n", "after common subgraphs", s->after_common);
  fprintf(f, "  %-32s %12" PRId64 "\n", "after disjoint unions", s->after_disjoint);
  fprintf(f, "  %-32s %12" PRId64 "\n", "new rules stored", s->stored);
  fprintf(f, "  time: enumerate %.2f s, buckets %.2f s, prune+store %.2f s, total %.2f s; "
             "peak RSS %.1f MB\n",
          s->enumerate_s, s->buckets_s, s->prune_s, s->wall_s, (double)s->peak_rss_kb / 1024.0);
}
