/* run.c: the verify-rules command: every undecided rule of a database
 * through the prover, on worker threads, results back in transactions.
 *
 * The rules not yet decided under this axiom file's hash are read into
 * memory, then `jobs` threads take them in turn, each with its own Prover
 * (Z3 contexts must not be shared between threads). The main thread alone
 * talks to SQLite: it waits for finished rules and stores them in order,
 * a batch per transaction, so killing the command loses at most one batch
 * and rerunning picks up the rest. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "ruledb/ruledb.h"
#include "verify/verify_int.h"

#ifndef TEQ_VERSION
#define TEQ_VERSION "0.1.0"
#endif

#define BATCH 256

typedef struct Item {
  int64_t id;
  Graph *src, *dst;
  VerifyOutcome out;
  bool done;
} Item;

typedef struct Work {
  const Axioms *ax;
  VerifyLimits lim;
  Item *items;
  int64_t n, cap;
  int64_t next;          /* the next item a worker takes */
  int64_t n_done;
  pthread_mutex_t lock;
  pthread_cond_t progress;
  int rc;
  Diag *d;
} Work;

static int collect(Rule *r, void *ctx) {
  Work *w = ctx;
  if (w->n == w->cap) {
    int64_t c = w->cap ? 2 * w->cap : 1024;
    Item *g = realloc(w->items, (size_t)c * sizeof *g);
    if (!g) return TEQ_ERR_NOMEM;
    w->items = g, w->cap = c;
  }
  Item *it = &w->items[w->n];
  memset(it, 0, sizeof *it);
  it->id = r->id;
  it->src = r->src, it->dst = r->dst; /* kept: the walk frees what is left */
  r->src = r->dst = NULL;
  w->n++;
  return TEQ_OK;
}

static void *worker(void *arg) {
  Work *w = arg;
  Prover *p = NULL;
  Diag d;
  diag_init(&d);
  int rc = prover_new(w->ax, &w->lim, &p, &d);
  for (;;) {
    pthread_mutex_lock(&w->lock);
    int64_t i = rc || w->rc ? w->n : w->next++;
    pthread_mutex_unlock(&w->lock);
    if (i >= w->n) break;
    Item *it = &w->items[i];
    VerifyOutcome out;
    rc = prover_decide(p, it->src, it->dst, &out, &d);
    pthread_mutex_lock(&w->lock);
    it->out = out;
    it->done = true;
    w->n_done++;
    pthread_cond_signal(&w->progress);
    pthread_mutex_unlock(&w->lock);
  }
  pthread_mutex_lock(&w->lock);
  if (rc && !w->rc) {
    w->rc = rc;
    diag_error(w->d, "%s", d.text ? d.text : teq_strerror(rc));
  }
  pthread_cond_signal(&w->progress);
  pthread_mutex_unlock(&w->lock);
  prover_free(p);
  diag_fini(&d);
  return NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static const RuleStatus status_of[] = {
  [VERIFY_PROVED] = RULE_PROVED, [VERIFY_REFUTED] = RULE_REFUTED, [VERIFY_UNKNOWN] = RULE_UNKNOWN,
};

/* Stores items [from, to) in one transaction. */
static int store(RuleDb *db, Work *w, int64_t from, int64_t to, int64_t run_id, VerifySummary *sum,
                 Diag *d) {
  int rc = ruledb_begin(db, d);
  for (int64_t i = from; i < to && !rc; i++) {
    Item *it = &w->items[i];
    rc = ruledb_store_verification(db, it->id, run_id, axioms_hash(w->ax),
                                   status_of[it->out.result], it->out.millis,
                                   it->out.counterexample, d);
    sum->decided[it->out.result]++;
    sum->instances += it->out.instances;
    if (it->out.millis > sum->max_ms) sum->max_ms = it->out.millis;
  }
  if (!rc) rc = ruledb_commit(db, d);
  if (rc) ruledb_rollback(db);
  return rc;
}

/* Refuses what is not a rule database made by gen-rules, before writing. */
static int open_db(const char *path, RuleDb **db, Diag *d) {
  if (access(path, F_OK) != 0) return diag_error(d, "%s: no such rule database", path);
  int rc = ruledb_open(path, RULEDB_WRITE, db, d);
  if (rc) return rc;
  int64_t n = 0;
  if ((rc = ruledb_count_runs(*db, "gen-rules", &n, d))) return rc;
  if (n == 0) {
    ruledb_close(*db);
    *db = NULL;
    return diag_error(d, "%s: not a rule database made by gen-rules (it records no gen-rules run)",
                      path);
  }
  return TEQ_OK;
}

static void report(const VerifyOptions *opt, Work *w, double t0, int64_t done) {
  if (opt->quiet || !opt->progress) return;
  double el = now_s() - t0;
  fprintf(opt->progress, "verify-rules: %lld/%lld rules, %.1f s, %.0f rules/s\n", (long long)done,
          (long long)w->n, el, el > 0 ? done / el : 0.0);
}

int verify_rules_run(const VerifyOptions *opt, VerifySummary *sum, Diag *d) {
  memset(sum, 0, sizeof *sum);
  double t0 = now_s();
  Axioms *ax = NULL;
  RuleDb *db = NULL;
  Work w;
  memset(&w, 0, sizeof w);
  pthread_mutex_init(&w.lock, NULL);
  pthread_cond_init(&w.progress, NULL);
  w.d = d;
  int rc = axioms_load(opt->axioms_path, &ax, d);
  if (rc || (rc = open_db(opt->db_path, &db, d))) goto out;
  w.ax = ax;
  w.lim = (VerifyLimits){.timeout_ms = opt->timeout_ms, .seed = opt->seed};
  if ((rc = ruledb_count_rules(db, -1, &sum->rules, d)) ||
      (rc = ruledb_foreach_undecided(db, axioms_hash(ax), collect, &w, d)))
    goto out;
  sum->skipped = sum->rules - w.n;
  char args[512];
  snprintf(args, sizeof args, "%s --timeout-ms %d axioms=%s", opt->axioms_path, opt->timeout_ms,
           axioms_hash(ax));
  RunInfo info = {.command = "verify-rules", .args = args, .seed = opt->seed,
                  .version = TEQ_VERSION};
  if ((rc = ruledb_run_start(db, &info, &sum->run_id, d))) goto out;

  int jobs = opt->jobs < 1 ? 1 : opt->jobs;
  pthread_t th[64];
  int started = 0;
  for (; started < jobs && started < 64; started++)
    if (pthread_create(&th[started], NULL, worker, &w)) break;
  if (!started) {
    rc = diag_error(d, "verify-rules: cannot start a worker thread");
    goto out;
  }
  int64_t stored = 0;
  double last = now_s();
  while (stored < w.n && !rc) {
    pthread_mutex_lock(&w.lock);
    int64_t ready = stored;
    while (!w.rc) {
      ready = stored;
      while (ready < w.n && w.items[ready].done) ready++;
      if (ready - stored >= BATCH || ready == w.n || w.n_done == w.n) break;
      pthread_cond_wait(&w.progress, &w.lock);
    }
    rc = w.rc;
    pthread_mutex_unlock(&w.lock);
    if (rc) break;
    if (ready > stored) {
      rc = store(db, &w, stored, ready, sum->run_id, sum, d);
      stored = ready;
    }
    if (now_s() - last > 2 || stored == w.n) {
      report(opt, &w, t0, stored);
      last = now_s();
    }
  }
  if (rc) {
    pthread_mutex_lock(&w.lock);
    if (!w.rc) w.rc = rc;
    pthread_mutex_unlock(&w.lock);
  }
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  if (!rc) rc = w.rc;
  sum->wall_s = now_s() - t0;
  if (!rc) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    char stats[512];
    snprintf(stats, sizeof stats,
             "{\"axioms_hash\": \"%s\", \"rules\": %lld, \"skipped\": %lld, \"proved\": %lld, "
             "\"refuted\": %lld, \"unknown\": %lld, \"instances\": %lld, \"jobs\": %d}",
             axioms_hash(ax), (long long)sum->rules, (long long)sum->skipped,
             (long long)sum->decided[VERIFY_PROVED], (long long)sum->decided[VERIFY_REFUTED],
             (long long)sum->decided[VERIFY_UNKNOWN], (long long)sum->instances, jobs);
    rc = ruledb_run_finish(db, sum->run_id, sum->wall_s, ru.ru_maxrss, stats, d);
  }
out:
  for (int64_t i = 0; i < w.n; i++) {
    graph_free(w.items[i].src);
    graph_free(w.items[i].dst);
    free(w.items[i].out.counterexample);
  }
  free(w.items);
  pthread_mutex_destroy(&w.lock);
  pthread_cond_destroy(&w.progress);
  ruledb_close(db);
  axioms_free(ax);
  return rc;
}

void verify_summary_print(const VerifyOptions *opt, const VerifySummary *sum, FILE *f) {
  int64_t n = sum->decided[0] + sum->decided[1] + sum->decided[2];
  fprintf(f, "verify-rules %s on %s (jobs %d, timeout %d ms)\n", opt->axioms_path, opt->db_path,
          opt->jobs, opt->timeout_ms);
  fprintf(f, "  rules in the database          %8lld\n", (long long)sum->rules);
  fprintf(f, "  decided earlier (skipped)      %8lld\n", (long long)sum->skipped);
  fprintf(f, "  decided now                    %8lld\n", (long long)n);
  for (int r = 0; r < 3; r++)
    fprintf(f, "    %-28s %8lld  %5.1f%%\n", verify_result_name((VerifyResult)r),
            (long long)sum->decided[r], n ? 100.0 * (double)sum->decided[r] / (double)n : 0.0);
  fprintf(f, "  axiom instances given to Z3    %8lld\n", (long long)sum->instances);
  fprintf(f, "  slowest rule                   %8.1f ms\n", sum->max_ms);
  fprintf(f, "  time                           %8.2f s\n", sum->wall_s);
}
