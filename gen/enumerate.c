/* enumerate.c: the canonical DFS over graphs, in threads, spilling each
 * graph's (fingerprint, encoding) record to an on-disk bucket.
 *
 * Canonical order. A graph is a set of operators; the DFS adds them in one
 * topological order only: the one that, at every step, takes the
 * available operator of smallest structural hash. Appending an operator
 * keeps the sequence canonical exactly when its hash is larger than that
 * of every operator after its last producer, an O(depth) test done before
 * anything is evaluated; prefixes of canonical sequences are canonical, so
 * each graph is built exactly once. Equal hashes mean the same operation
 * on the same inputs, so "no duplicated computation" falls out of the same
 * test, and commutative operands are ordered by hash.
 *
 * Variables. A graph is written out only if, in every class, it uses the
 * first variables (x1 before x2); that keeps every rule reachable (rename
 * its variables onto the prefix) while dropping most renamed copies. The
 * DFS still passes through graphs that use x2 alone, as long as enough
 * operators remain to bring in what is missing.
 *
 * Values. A new operator whose output equals a value already in the graph
 * is written out (x = transpose(transpose(x)) is a rule) but not extended:
 * anything built on it is a larger copy of a smaller graph (TASO's "no
 * duplicated tensors").
 *
 * Work is split by the first operator: threads take root operators from a
 * shared counter. Each thread has its own file per bucket, so writes need
 * no lock; a bucket is the union of its threads' files. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gen/gen_int.h"

#define SPILL_BATCH 1024 /* records per bucket buffered before a write */

typedef struct Enum Enum;

typedef struct Worker {
  Enum *e;
  int id;
  GenState st;
  GenRecord *buf;       /* n_buckets * SPILL_BATCH */
  int *fill;
  FILE **f;
  int64_t graphs, emitted, local_graphs;
  int rc;
  Diag diag;
} Worker;

struct Enum {
  const GenVocab *v;
  const GenEnumOptions *opt;
  GenOp roots[4096];
  int n_roots;
  atomic_int next_root;
  atomic_int roots_done;
  atomic_llong graphs;
  atomic_llong emitted;
  atomic_bool failed;
};

/* ---- spilling ---- */

static int bucket_path(const GenEnumOptions *o, int bucket, int thread, char *buf, size_t size) {
  int n = snprintf(buf, size, "%s/b%04d-t%02d.rec", o->dir, bucket, thread);
  return n > 0 && (size_t)n < size ? TEQ_OK : TEQ_ERR_IO;
}

static int flush_bucket(Worker *w, int b) {
  if (!w->fill[b]) return TEQ_OK;
  if (!w->f[b]) {
    char path[4096];
    if (bucket_path(w->e->opt, b, w->id, path, sizeof path) ||
        !(w->f[b] = fopen(path, "wb")))
      return diag_error(&w->diag, "%s: cannot write a bucket file: %s", w->e->opt->dir,
                        strerror(errno)),
             TEQ_ERR_IO;
  }
  size_t n = (size_t)w->fill[b];
  if (fwrite(w->buf + (size_t)b * SPILL_BATCH, sizeof(GenRecord), n, w->f[b]) != n)
    return diag_error(&w->diag, "%s: writing a bucket file failed: %s", w->e->opt->dir,
                      strerror(errno)),
           TEQ_ERR_IO;
  w->fill[b] = 0;
  return TEQ_OK;
}

static int emit(Worker *w) {
  GenState *s = &w->st;
  if (!s->n_outputs) return TEQ_OK;
  uint64_t fp = gen_fingerprint(s);
  int b = gen_bucket_of(fp, w->e->opt->n_buckets);
  GenRecord *r = &w->buf[(size_t)b * SPILL_BATCH + (size_t)w->fill[b]++];
  r->fp = fp;
  gen_graph_of(s, &r->g);
  w->emitted++;
  return w->fill[b] == SPILL_BATCH ? flush_bucket(w, b) : TEQ_OK;
}

/* ---- the DFS ---- */

static int dfs(Worker *w, int depth_left);

/* Whether the newest operator's outputs repeat a value already present. */
static bool repeats_value(const GenState *s) {
  int first = s->op_first[s->n_ops - 1];
  for (int o = first; o < s->n_slots; o++)
    for (int i = 0; i < o; i++)
      if (s->slot[i].vh == s->slot[o].vh) return true;
  return false;
}

static int try_op(Worker *w, GenOp op, int depth_left) {
  GenState *s = &w->st;
  if (!(s->v->t[op.t].flags & T_IDENT) && !gen_op_applies(s, op)) return TEQ_OK;
  int after;
  uint64_t sh = gen_op_sh(s, op, &after);
  for (int i = after; i < s->n_ops; i++)
    if (s->op_sh[i] >= sh) return TEQ_OK;
  /* Variables still missing after this operator must be within reach of
   * the operators left; checked before anything is evaluated. */
  if (gen_var_gaps_after(s, op) > 2 * (depth_left - 1)) return TEQ_OK;
  int rc = gen_push(s, op, &w->diag);
  if (rc <= 0) return rc;
  rc = TEQ_OK;
  w->graphs++;
  if (++w->local_graphs == 4096) {
    atomic_fetch_add(&w->e->graphs, w->local_graphs);
    w->local_graphs = 0;
  }
  int gaps = gen_var_gaps(s);
  if (gaps == 0) rc = emit(w);
  if (!rc && depth_left > 1 && gaps <= 2 * (depth_left - 1) && !repeats_value(s))
    rc = dfs(w, depth_left - 1);
  gen_pop(s);
  return rc;
}

/* Calls try_op for every input choice of every template (identity markers
 * aside); stops at the first error. */
static int dfs(Worker *w, int depth_left) {
  GenState *s = &w->st;
  const GenVocab *v = s->v;
  for (int ti = 0; ti < v->n_templates; ti++) {
    const GenTemplate *t = &v->t[ti];
    if (t->flags & T_IDENT) continue;
    GenOp op = {.t = (uint8_t)ti};
    if (t->n_in == 0) {
      int rc = try_op(w, op, depth_left);
      if (rc) return rc;
      continue;
    }
    for (int a = 0; a < s->n_slots; a++) {
      const GenSlot *x = &s->slot[a];
      if (t->rank && x->t->shape.ndim != t->rank) continue;
      if ((t->flags & T_ACT_INPUT) && x->weight) continue;
      if ((t->flags & T_VAR_INPUT) && x->op >= 0) continue;
      op.in[0] = (uint8_t)a;
      if (t->n_in == 1) {
        int rc = try_op(w, op, depth_left);
        if (rc) return rc;
        continue;
      }
      for (int b = 0; b < s->n_slots; b++) {
        const GenSlot *y = &s->slot[b];
        if ((t->flags & T_COMMUTATIVE) && y->sh < x->sh) continue;
        if ((t->flags & T_SAME_SHAPE) && !shape_equal(&x->t->shape, &y->t->shape)) continue;
        if ((t->flags & T_SCALAR_IN1) && tensor_numel(y->t) != 1) continue;
        op.in[1] = (uint8_t)b;
        int rc = try_op(w, op, depth_left);
        if (rc) return rc;
      }
    }
  }
  return TEQ_OK;
}

/* Graphs with no operator: one or two variables as outputs, so that
 * matmul(x1, const_imm) = x1 and split(concat(x1, x2)) = (x1, x2) pair up. */
static int identity_graphs(Worker *w) {
  GenState *s = &w->st;
  const GenVocab *v = s->v;
  int ident = v->n_templates - 1;
  for (int a = 0; a < v->n_vars; a++) {
    GenOp op = {.t = (uint8_t)ident, .in = {(uint8_t)a, 0}};
    if (gen_push(s, op, &w->diag) != 1) continue;
    int rc = gen_vars_canonical(s) ? emit(w) : TEQ_OK;
    for (int b = 0; !rc && b < v->n_vars; b++) {
      GenOp op2 = {.t = (uint8_t)ident, .in = {(uint8_t)b, 0}};
      if (gen_op_sh(s, op2, NULL) <= s->op_sh[0]) continue;
      if (gen_push(s, op2, &w->diag) != 1) continue;
      if (gen_vars_canonical(s)) rc = emit(w);
      gen_pop(s);
    }
    gen_pop(s);
    if (rc) return rc;
  }
  return TEQ_OK;
}

static void *worker_main(void *arg) {
  Worker *w = arg;
  Enum *e = w->e;
  if (w->id == 0) w->rc = identity_graphs(w);
  while (!w->rc && !atomic_load(&e->failed)) {
    int r = atomic_fetch_add(&e->next_root, 1);
    if (r >= e->n_roots) break;
    w->rc = try_op(w, e->roots[r], e->opt->depth);
    atomic_fetch_add(&e->roots_done, 1);
  }
  for (int b = 0; !w->rc && b < e->opt->n_buckets; b++) w->rc = flush_bucket(w, b);
  for (int b = 0; b < e->opt->n_buckets; b++)
    if (w->f[b] && fclose(w->f[b]) && !w->rc)
      w->rc = diag_error(&w->diag, "%s: closing a bucket file failed", e->opt->dir),
      w->rc = TEQ_ERR_IO;
  atomic_fetch_add(&e->graphs, w->local_graphs);
  w->local_graphs = 0;
  atomic_fetch_add(&e->emitted, w->emitted);
  if (w->rc) atomic_store(&e->failed, true);
  return NULL;
}

/* Root operators: every first operator a graph can start with. */
static int collect_roots(Enum *e, GenState *s, Diag *d) {
  const GenVocab *v = e->v;
  e->n_roots = 0;
  for (int ti = 0; ti < v->n_templates; ti++) {
    const GenTemplate *t = &v->t[ti];
    if (t->flags & T_IDENT) continue;
    int na = t->n_in > 0 ? s->n_slots : 1, nb = t->n_in > 1 ? s->n_slots : 1;
    for (int a = 0; a < na; a++)
      for (int b = 0; b < nb; b++) {
        GenOp op = {.t = (uint8_t)ti, .in = {(uint8_t)a, (uint8_t)b}};
        if ((t->flags & T_COMMUTATIVE) && s->slot[b].sh < s->slot[a].sh) continue;
        int rc = gen_push(s, op, d);
        if (rc < 0) return rc;
        if (rc == 0) continue;
        bool keep = gen_var_gaps(s) <= 2 * (e->opt->depth - 1);
        gen_pop(s);
        if (!keep) continue;
        if (e->n_roots == (int)(sizeof e->roots / sizeof e->roots[0]))
          return diag_error(d, "gen-rules: too many first operators");
        e->roots[e->n_roots++] = op;
      }
  }
  return TEQ_OK;
}

int gen_enumerate(const GenVocab *v, const GenEnumOptions *opt, GenEnumStats *st, Diag *d) {
  Enum *e = calloc(1, sizeof *e);
  Worker *w = calloc((size_t)opt->threads, sizeof *w);
  pthread_t *tid = calloc((size_t)opt->threads, sizeof *tid);
  int rc = e && w && tid ? TEQ_OK : TEQ_ERR_NOMEM;
  int started = 0;
  if (!rc) {
    e->v = v;
    e->opt = opt;
    GenState s;
    rc = gen_state_init(&s, v, SHAPE_A, opt->seed);
    if (!rc) {
      rc = collect_roots(e, &s, d);
      gen_state_fini(&s);
    }
  }
  for (int i = 0; !rc && i < opt->threads; i++) {
    w[i].e = e;
    w[i].id = i;
    diag_init(&w[i].diag);
    w[i].buf = malloc((size_t)opt->n_buckets * SPILL_BATCH * sizeof(GenRecord));
    w[i].fill = calloc((size_t)opt->n_buckets, sizeof *w[i].fill);
    w[i].f = calloc((size_t)opt->n_buckets, sizeof *w[i].f);
    if (!w[i].buf || !w[i].fill || !w[i].f) rc = TEQ_ERR_NOMEM;
    else rc = gen_state_init(&w[i].st, v, SHAPE_A, opt->seed);
  }
  for (int i = 0; !rc && i < opt->threads; i++) {
    if (pthread_create(&tid[i], NULL, worker_main, &w[i])) {
      rc = diag_error(d, "gen-rules: cannot start a thread");
      atomic_store(&e->failed, true);
      break;
    }
    started++;
  }
  /* Progress while the workers run. */
  while (!rc && started) {
    int done = atomic_load(&e->roots_done);
    if (opt->on_progress)
      opt->on_progress(opt->progress_ctx, atomic_load(&e->graphs), done, e->n_roots);
    if (done >= e->n_roots || atomic_load(&e->failed)) break;
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
  for (int i = 0; w && i < opt->threads; i++) {
    if (w[i].rc && !rc) {
      rc = w[i].rc;
      if (w[i].diag.text && *w[i].diag.text) diag_error(d, "%s", w[i].diag.text);
      else diag_error(d, "gen-rules: enumeration failed: %s", teq_strerror(rc));
    }
    gen_state_fini(&w[i].st);
    diag_fini(&w[i].diag);
    free(w[i].buf);
    free(w[i].fill);
    free(w[i].f);
  }
  if (!rc && st) {
    st->graphs = atomic_load(&e->graphs);
    st->emitted = atomic_load(&e->emitted);
    st->roots = e->n_roots;
  }
  free(tid);
  free(w);
  free(e);
  return rc;
}

int gen_bucket_of(uint64_t fp, int n_buckets) {
  return (int)((fp >> 32) % (uint64_t)n_buckets);
}

int gen_bucket_load(const GenEnumOptions *opt, int bucket, GenRecord **recs, size_t *n,
                    Diag *d) {
  GenRecord *all = NULL;
  size_t len = 0, cap = 0;
  for (int t = 0; t < opt->threads; t++) {
    char path[4096];
    if (bucket_path(opt, bucket, t, path, sizeof path)) return TEQ_ERR_IO;
    FILE *f = fopen(path, "rb");
    if (!f) {
      if (errno == ENOENT) continue;
      free(all);
      return diag_error(d, "%s: %s", path, strerror(errno)), TEQ_ERR_IO;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    size_t k = size > 0 ? (size_t)size / sizeof(GenRecord) : 0;
    if (len + k > cap) {
      cap = len + k;
      GenRecord *p = realloc(all, cap * sizeof *all);
      if (!p) {
        fclose(f);
        free(all);
        return TEQ_ERR_NOMEM;
      }
      all = p;
    }
    if (fread(all + len, sizeof(GenRecord), k, f) != k) {
      fclose(f);
      free(all);
      return diag_error(d, "%s: short read", path), TEQ_ERR_IO;
    }
    len += k;
    fclose(f);
  }
  *recs = all;
  *n = len;
  return TEQ_OK;
}
