/* run.c: gen-rules from end to end, resumable.
 *
 * Phases, each leaving the database consistent:
 *   1. enumerate into bucket files in a work directory beside the database
 *      (<db>.gen-<run>); a marker file written last says it finished;
 *   2. worker threads turn each bucket into confirmed pairs and those into
 *      canonical candidates (gen_prune_bucket); each bucket's candidates
 *      go into the database as one work unit, in one transaction, so a
 *      bucket is done or not;
 *   3. merge all candidates (gen_prune_merge), store the rules and mark
 *      the run done, in one transaction; then the work directory is
 *      removed.
 * A run killed anywhere is found again by its arguments and seed, and the
 * same command goes on from the last finished phase or bucket. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
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

/* A bucket's unit: this header, then n_cands GenCand records. */
typedef struct UnitHeader {
  GenBucketStats st;
  uint64_t n_pairs;   /* confirmed pairs, before pruning */
  uint64_t n_cands;
} UnitHeader;

static int store_bucket(RuleDb *db, int64_t run, int b, const UnitHeader *h, const GenCand *c,
                        Diag *d) {
  size_t len = sizeof *h + h->n_cands * sizeof *c;
  uint8_t *blob = malloc(len);
  if (!blob) return TEQ_ERR_NOMEM;
  memcpy(blob, h, sizeof *h);
  if (h->n_cands) memcpy(blob + sizeof *h, c, h->n_cands * sizeof *c);
  int rc = ruledb_unit_store(db, run, b, blob, len, d);
  free(blob);
  return rc;
}

typedef struct Gather {
  bool counting;
  GenCand *c;
  size_t n, cap;
  int64_t pairs;
  GenBucketStats st;
} Gather;

static int gather_unit(int unit, const void *blob, size_t len, void *ctx) {
  (void)unit;
  Gather *g = ctx;
  UnitHeader h;
  if (len < sizeof h) return TEQ_ERR_INPUT;
  memcpy(&h, blob, sizeof h);
  if (h.n_cands > len / sizeof(GenCand) || len != sizeof h + h.n_cands * sizeof(GenCand))
    return TEQ_ERR_INPUT;
  g->st.fp_groups += h.st.fp_groups;
  g->st.collisions += h.st.collisions;
  g->st.one_input_only += h.st.one_input_only;
  g->st.shape_specific += h.st.shape_specific;
  g->pairs += (int64_t)h.n_pairs;
  if (g->counting) { /* first pass: only the total, so that one allocation holds all */
    g->cap += h.n_cands;
    return TEQ_OK;
  }
  if (g->n + h.n_cands > g->cap) {
    size_t cap = 2 * (g->n + h.n_cands) + 64;
    GenCand *c = realloc(g->c, cap * sizeof *c);
    if (!c) return TEQ_ERR_NOMEM;
    g->c = c, g->cap = cap;
  }
  if (h.n_cands) memcpy(g->c + g->n, (const uint8_t *)blob + sizeof h, h.n_cands * sizeof(GenCand));
  g->n += h.n_cands;
  return TEQ_OK;
}

/* ---- phase 2: buckets in worker threads ----
 * Workers take buckets from a shared counter: load, pair, canonicalise and
 * check. The main thread alone talks to the database: it stores each
 * bucket as soon as a worker hands it over, one transaction per bucket. */

typedef struct BucketJob {
  int bucket;
  UnitHeader h;
  GenCand *cands;
  int rc;
  char *error;        /* the worker's message, if rc */
  bool ready, stored;
} BucketJob;

typedef struct BucketWork {
  const GenVocab *v;
  const GenEnumOptions *eo;
  uint64_t seed;
  BucketJob *jobs;
  int n_jobs;
  atomic_int next;
  atomic_bool stop;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} BucketWork;

static int do_bucket(BucketWork *w, BucketJob *j, Diag *d) {
  GenRecord *recs = NULL;
  size_t n = 0, np = 0, nc = 0;
  GenPair *pairs = NULL;
  int rc = gen_bucket_load(w->eo, j->bucket, &recs, &n, d);
  if (!rc) rc = gen_bucket_pairs(w->v, w->seed, recs, n, &pairs, &np, &j->h.st, d);
  free(recs);
  if (!rc) rc = gen_prune_bucket(w->v, pairs, np, &j->cands, &nc);
  free(pairs);
  j->h.n_pairs = np;
  j->h.n_cands = nc;
  return rc;
}

static void *bucket_worker(void *arg) {
  BucketWork *w = arg;
  for (;;) {
    int i = atomic_fetch_add(&w->next, 1);
    if (i >= w->n_jobs) break;
    BucketJob *j = &w->jobs[i];
    Diag d;
    diag_init(&d);
    int rc = atomic_load(&w->stop) ? TEQ_ERR_IO : do_bucket(w, j, &d);
    pthread_mutex_lock(&w->mu);
    j->rc = rc;
    if (rc && d.text && *d.text) j->error = strdup(d.text);
    j->ready = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    diag_fini(&d);
  }
  return NULL;
}

/* Runs every bucket a killed run left undone, in `threads` workers. */
static int run_buckets(RuleDb *db, int64_t run, const GenVocab *v, const GenEnumOptions *eo,
                       uint64_t seed, int threads, Progress *pr, Diag *d) {
  BucketWork w = {.v = v, .eo = eo, .seed = seed};
  w.jobs = calloc((size_t)eo->n_buckets, sizeof *w.jobs);
  if (!w.jobs) return TEQ_ERR_NOMEM;
  int rc = TEQ_OK;
  for (int b = 0; !rc && b < eo->n_buckets; b++) {
    bool done = false;
    rc = ruledb_unit_done(db, run, b, &done, d);
    if (!rc && !done) w.jobs[w.n_jobs++].bucket = b;
  }
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  pthread_t tid[64];
  int started = 0;
  if (threads > w.n_jobs) threads = w.n_jobs;
  for (int i = 0; !rc && i < threads; i++) {
    if (pthread_create(&tid[i], NULL, bucket_worker, &w)) {
      rc = diag_error(d, "gen-rules: cannot start a thread");
      break;
    }
    started++;
  }
  int64_t n_pairs = 0;
  double t0 = now_s();
  int skipped = eo->n_buckets - w.n_jobs;
  for (int stored = 0; stored < w.n_jobs && started;) {
    pthread_mutex_lock(&w.mu);
    BucketJob *j = NULL;
    for (;;) {
      for (int i = 0; i < w.n_jobs && !j; i++)
        if (w.jobs[i].ready && !w.jobs[i].stored) j = &w.jobs[i];
      if (j) break;
      pthread_cond_wait(&w.cv, &w.mu);
    }
    j->stored = true;
    pthread_mutex_unlock(&w.mu);
    stored++;
    if (!rc && j->rc) {
      if (j->error) diag_error(d, "%s", j->error);
      rc = j->rc;
    }
    if (!rc) rc = store_bucket(db, run, j->bucket, &j->h, j->cands, d);
    if (rc) atomic_store(&w.stop, true);
    free(j->cands);
    free(j->error);
    j->cands = NULL, j->error = NULL;
    n_pairs += (int64_t)j->h.n_pairs;
    double el = now_s() - t0;
    char eta[32];
    fmt_eta(el * (w.n_jobs - stored) / stored, eta, sizeof eta);
    progress_line(pr, stored == w.n_jobs, "%d/%d buckets, %" PRId64 " pairs, ETA %s",
                  skipped + stored, eo->n_buckets, n_pairs, eta);
  }
  for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
  pthread_cond_destroy(&w.cv);
  pthread_mutex_destroy(&w.mu);
  free(w.jobs);
  return rc;
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
           ", \"after_float32\": %" PRId64
           ", \"stored\": %" PRId64 ", \"enumerate_s\": %.3f, \"buckets_s\": %.3f"
           ", \"prune_s\": %.3f}",
           v->n_templates - 1, v->n_vars, s->graphs, s->emitted, s->fp_groups, s->collisions,
           s->one_input_only, s->shape_specific, s->pairs, s->after_renaming, s->after_common,
           s->after_disjoint, s->after_float32, s->stored, s->enumerate_s, s->buckets_s, s->prune_s);
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
  if (!rc) rc = run_buckets(db, run, v, &eo, opt->seed, opt->threads, &pr, d);
  progress_end(&pr);
  sum->buckets_s = now_s() - t2;

  /* 3. Merge the buckets' candidates and store the rules. */
  double t3 = now_s();
  Gather g = {.counting = true};
  if (!rc) rc = ruledb_unit_foreach(db, run, gather_unit, &g, d);
  if (!rc && !(g.c = malloc((g.cap ? g.cap : 1) * sizeof *g.c))) rc = TEQ_ERR_NOMEM;
  g.counting = false;
  g.st = (GenBucketStats){0};
  g.pairs = 0;
  if (!rc) rc = ruledb_unit_foreach(db, run, gather_unit, &g, d);
  if (rc == TEQ_ERR_INPUT && !d->n_errors)
    diag_error(d, "%s: a stored bucket of run %" PRId64 " is damaged", opt->db_path, run);
  GenRule *rules = NULL;
  size_t n_rules = 0;
  GenPruneStats ps = {0};
  if (!rc) rc = gen_prune_merge(v, opt->seed, opt->threads, g.c, g.n, g.pairs, &rules, &n_rules, &ps, d);
  sum->fp_groups = g.st.fp_groups;
  sum->collisions = g.st.collisions;
  sum->one_input_only = g.st.one_input_only;
  sum->shape_specific = g.st.shape_specific;
  sum->pairs = ps.initial;
  sum->after_renaming = ps.after_renaming;
  sum->after_common = ps.after_common;
  sum->after_disjoint = ps.after_disjoint;
  sum->after_float32 = ps.after_float32;
  free(g.c);
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
  if (!rc) rc = ruledb_unit_clear(db, run, d);
  if (!rc) rc = ruledb_commit(db, d);
  else ruledb_rollback(db);
  if (!rc) remove_dir(dir);
  if (!rc) rc = ruledb_compact(db, d);
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
  fprintf(f, "  %-32s %12" PRId64 "\n", "after float32 check", s->after_float32);
  fprintf(f, "  %-32s %12" PRId64 "\n", "new rules stored", s->stored);
  fprintf(f, "  time: enumerate %.2f s, buckets %.2f s, merge+store %.2f s, total %.2f s; "
             "peak RSS %.1f MB\n",
          s->enumerate_s, s->buckets_s, s->prune_s, s->wall_s, (double)s->peak_rss_kb / 1024.0);
}
