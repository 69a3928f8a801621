/* profile.c: the teq-profile command, which makes and checks cost tables.
 *
 *   teq-profile record [--batch N] [--dim NAME=N]... [-o CONFIGS] MODEL.onnx...
 *       the configuration key of every operator the models run, one per
 *       line, sorted and unique (no GPU needed; keys from CONFIGS already
 *       there are kept)
 *   teq-profile measure [--repeats N] [--db FILE] [-o TABLE] CONFIGS...
 *       times each configuration on this machine's GPU (profiler of
 *       runtime/cuda.h) and writes a cost table (runtime/cost.h); --db also
 *       stores each time in that database's cost cache
 *   teq-profile calibrate [-o TABLE] TABLE
 *       fits the analytic model to the table's measurements, prints its
 *       error per operator before and after, and writes the table back
 *       with its #calib lines
 *   teq-profile merge [-o TABLE] BASE NEW
 *       BASE's rows of the configurations NEW does not hold, then NEW's
 *       rows, without #calib lines (calibrate adds them): a table measured
 *       again in part; both must be of one device
 *   teq-profile cost [--table TABLE] [--gpu] [--batch N] [--dim NAME=N]... [--all] MODEL.onnx
 *       what the cost model says a model costs, node by node, and where
 *       each figure came from (the table, this GPU, or the roofline)
 *   teq-profile ways [--repeats N] [--batch N] MODEL.onnx
 *       each distinct convolution and matrix product of a model on this
 *       machine's GPU: the way its search chose and its time, beside the
 *       cuBLAS product's time whole and split along K in 2 to 16 slices
 *       and our own kernels' (teq:direct, grouped and shallow convs;
 *       teq:tiled, grouped ones; teq:winograd, ungrouped 3x3 convs of
 *       stride 1, any dilation), each pinned
 * Progress goes to stderr, results to stdout; bad arguments exit 2. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ruledb/ruledb.h"
#include "runtime/cost.h"
#include "runtime/cuda.h"
#include "runtime/onnx.h"
#include "runtime/plan.h"

static int usage(FILE *f, int status) {
  fprintf(f,
          "usage: teq-profile record [--batch N] [--dim NAME=N]... [-o CONFIGS] MODEL.onnx...\n"
          "       teq-profile measure [--repeats N] [--db FILE] [-o TABLE] CONFIGS...\n"
          "       teq-profile calibrate [-o TABLE] TABLE\n"
          "       teq-profile merge [-o TABLE] BASE NEW\n"
          "       teq-profile cost [--table TABLE] [--gpu] [--batch N] [--dim NAME=N]... [--all]\n"
          "                        MODEL.onnx\n"
          "       teq-profile ways [--repeats N] [--batch N] MODEL.onnx\n");
  return status;
}

/* ---- lines of text, kept sorted and unique ---- */

typedef struct Lines {
  char **v;
  size_t n, cap;
} Lines;

static int lines_add(Lines *l, const char *s) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 256;
    char **v = realloc(l->v, cap * sizeof *v);
    if (!v) return TEQ_ERR_NOMEM;
    l->v = v, l->cap = cap;
  }
  if (!(l->v[l->n] = strdup(s))) return TEQ_ERR_NOMEM;
  l->n++;
  return TEQ_OK;
}

static int by_string(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void lines_sort_unique(Lines *l) {
  if (l->n == 0) return; /* no array to sort (v is NULL) */
  qsort(l->v, l->n, sizeof *l->v, by_string);
  size_t k = 0;
  for (size_t i = 0; i < l->n; i++) {
    if (k && strcmp(l->v[k - 1], l->v[i]) == 0) free(l->v[i]);
    else l->v[k++] = l->v[i];
  }
  l->n = k;
}

static void lines_free(Lines *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
}

/* Appends the lines of path (a missing file is no error when optional). */
static int lines_read(Lines *l, const char *path, bool optional, Diag *d) {
  FILE *f = fopen(path, "r");
  if (!f) {
    if (optional && errno == ENOENT) return TEQ_OK;
    diag_error(d, "%s: cannot open: %s", path, strerror(errno));
    return TEQ_ERR_IO;
  }
  char line[COST_KEY_MAX + 16];
  int rc = TEQ_OK;
  while (rc == TEQ_OK && fgets(line, sizeof line, f)) {
    size_t n = strlen(line);
    if (n && line[n - 1] == '\n') line[--n] = '\0';
    if (n && line[0] != '#') rc = lines_add(l, line);
  }
  fclose(f);
  return rc;
}

/* ---- record ---- */

/* --dim NAME=N into dims[*n] (at most 64); false with a message if malformed. */
static bool take_dim(const char *v, const char **dims, int *n, Diag *d) {
  if (!strchr(v, '=') || *n == 64) {
    diag_error(d, *n == 64 ? "too many --dim options" : "--dim takes NAME=N, not '%s'", v);
    return false;
  }
  dims[(*n)++] = v;
  return true;
}

static int do_record(int argc, char **argv, Diag *d) {
  const char *out = NULL, *dims[64];
  int n_dims = 0;
  long long batch = 1;
  Lines keys = {0};
  int rc = TEQ_OK, n_models = 0;
  for (int i = 0; i < argc && rc == TEQ_OK; i++) {
    if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) {
      out = argv[++i];
      continue;
    }
    if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
      if (!teq_parse_int(argv[++i], 1, 1 << 20, &batch))
        return diag_error(d, "--batch takes a positive integer, not '%s'", argv[i]);
      continue;
    }
    if (strcmp(argv[i], "--dim") == 0 && i + 1 < argc) {
      if (!take_dim(argv[++i], dims, &n_dims, d)) return TEQ_ERR_INPUT;
      continue;
    }
    if (argv[i][0] == '-') return diag_error(d, "unknown option '%s'", argv[i]);
    OnnxImportOptions io = ONNX_IMPORT_DEFAULTS;
    io.batch = batch;
    io.dims = dims;
    io.n_dims = n_dims;
    io.opaque_unsupported_forms = true; /* opaque nodes are not costed */
    Graph *g = NULL;
    if ((rc = onnx_import_file(argv[i], &io, &g, NULL, d)) != TEQ_OK) break;
    int before = (int)keys.n;
    for (int id = 0; id < g->n_nodes && rc == TEQ_OK; id++) {
      if (cost_node_is_free(g, id)) continue; /* no kernel to time */
      char key[COST_KEY_MAX];
      if (cost_config_key(g, id, key, sizeof key) < (int)sizeof key) rc = lines_add(&keys, key);
    }
    fprintf(stderr, "%s: %d operators\n", argv[i], (int)keys.n - before);
    graph_free(g);
    n_models++;
  }
  if (rc == TEQ_OK && n_models == 0) rc = diag_error(d, "record: no model given");
  if (rc == TEQ_OK && out) rc = lines_read(&keys, out, true, d);
  if (rc == TEQ_OK) {
    lines_sort_unique(&keys);
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) rc = diag_error(d, "%s: cannot write: %s", out, strerror(errno));
    for (size_t i = 0; f && i < keys.n; i++) fprintf(f, "%s\n", keys.v[i]);
    if (f && f != stdout) fclose(f);
    fprintf(stderr, "%zu configurations%s%s\n", keys.n, out ? " in " : "", out ? out : "");
  }
  lines_free(&keys);
  return rc;
}

/* ---- measure ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int do_measure(int argc, char **argv, Diag *d) {
  const char *out = NULL, *db_path = NULL;
  long long repeats = 50;
  Lines keys = {0};
  int rc = TEQ_OK;
  for (int i = 0; i < argc && rc == TEQ_OK; i++) {
    if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) out = argv[++i];
    else if (strcmp(argv[i], "--db") == 0 && i + 1 < argc) db_path = argv[++i];
    else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
      if (!teq_parse_int(argv[++i], 1, 100000, &repeats))
        return diag_error(d, "--repeats takes a positive integer, not '%s'", argv[i]);
    } else if (argv[i][0] == '-') return diag_error(d, "unknown option '%s'", argv[i]);
    else rc = lines_read(&keys, argv[i], false, d);
  }
  if (rc) return rc;
  lines_sort_unique(&keys);
  if (keys.n == 0) return diag_error(d, "measure: no configurations given");
  CudaDevice *dev = NULL;
  RuleDb *db = NULL;
  if ((rc = cuda_device_open(&dev, d)) != TEQ_OK) goto done;
  if (db_path && (rc = ruledb_open(db_path, RULEDB_WRITE, &db, d)) != TEQ_OK) goto done;
  FILE *f = out ? fopen(out, "w") : stdout;
  if (!f) {
    rc = diag_error(d, "%s: cannot write: %s", out, strerror(errno));
    goto done;
  }
  fprintf(f, "# device\tconfiguration\tmedian_us\tmin_us\talgo\n");
  double t0 = now_s(), last = t0;
  int failed = 0, skipped = 0;
  for (size_t i = 0; i < keys.n; i++) {
    Graph *g = NULL;
    int node = -1;
    CudaProfile p;
    Diag kd;
    diag_init(&kd);
    int r = cost_graph_from_key(keys.v[i], &g, &node, &kd);
    /* Lists written before views were left out of them still name some. */
    bool no_kernel = r == TEQ_OK && cost_node_is_free(g, node);
    skipped += no_kernel;
    if (r == TEQ_OK && !no_kernel) r = cuda_profile_node(dev, g, node, (int)repeats, &p, &kd);
    if (r == TEQ_OK && !no_kernel) {
      fprintf(f, "%s\t%s\t%.3f\t%.3f\t%s\n", cuda_device_name(dev), keys.v[i], p.median_us,
              p.min_us, p.algo[0] ? p.algo : "-");
      if (db) r = ruledb_cost_store(db, cuda_device_name(dev), keys.v[i], p.median_us,
                                    "cuda-events-median", p.algo, &kd);
    }
    if (r != TEQ_OK) {
      failed++;
      fprintf(stderr, "teq-profile: %s: %s", keys.v[i], kd.text ? kd.text : "failed\n");
    }
    diag_fini(&kd);
    graph_free(g);
    if (now_s() - last > 5 || i + 1 == keys.n) {
      /* A run cut short keeps every row measured before its last report. */
      fflush(f);
      last = now_s();
      fprintf(stderr, "measured %zu/%zu configurations, %.0f s\n", i + 1, keys.n, last - t0);
    }
  }
  if (f != stdout) fclose(f);
  fprintf(stderr, "%zu configurations, %d skipped (no kernel: views), %d failed, %.1f s\n",
          keys.n, skipped, failed, now_s() - t0);
  if (failed) rc = diag_error(d, "%d configurations could not be measured", failed);
done:
  ruledb_close(db);
  cuda_device_close(dev);
  lines_free(&keys);
  return rc;
}

/* ---- merge ---- */

/* A row's device (the text before its first tab) and configuration (up to
 * the second): false where it has no second tab, no measurement. */
static bool row_fields(const char *row, size_t *device_len, const char **config,
                       size_t *config_len) {
  const char *t1 = strchr(row, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
  if (!t2) return false;
  *device_len = (size_t)(t1 - row), *config = t1 + 1, *config_len = (size_t)(t2 - t1 - 1);
  return true;
}

/* Every row of l a measurement of `device` (taken from the first row where
 * *device is empty); its configurations into configs where that is not
 * NULL. */
static int check_rows(const Lines *l, const char *path, char *device, size_t device_size,
                      Lines *configs, Diag *d) {
  for (size_t i = 0; i < l->n; i++) {
    size_t dl, cl;
    const char *config;
    if (!row_fields(l->v[i], &dl, &config, &cl))
      return diag_error(d, "%s: row %zu: not a measurement (device, configuration, times)", path,
                        i + 1);
    if (!device[0]) snprintf(device, device_size, "%.*s", (int)dl, l->v[i]);
    if (strlen(device) != dl || strncmp(device, l->v[i], dl) != 0)
      return diag_error(d, "%s: row %zu is of %.*s, not %s: a table holds one device", path,
                        i + 1, (int)dl, l->v[i], device);
    if (configs) {
      char *c = strndup(config, cl);
      int rc = c ? lines_add(configs, c) : TEQ_ERR_NOMEM;
      free(c);
      if (rc) return rc;
    }
  }
  return TEQ_OK;
}

static int do_merge(int argc, char **argv, Diag *d) {
  const char *out = NULL, *in[2] = {NULL, NULL};
  int n_in = 0;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) out = argv[++i];
    else if (argv[i][0] == '-') return diag_error(d, "unknown option '%s'", argv[i]);
    else if (n_in < 2) in[n_in++] = argv[i];
    else return diag_error(d, "merge: one BASE and one NEW table, not '%s' too", argv[i]);
  }
  if (n_in < 2) return diag_error(d, "merge: expected a BASE table and a NEW one");
  Lines base = {0}, fresh = {0}, again = {0};
  char device[256] = "";
  int rc = lines_read(&base, in[0], false, d);
  if (rc == TEQ_OK) rc = lines_read(&fresh, in[1], false, d);
  if (rc == TEQ_OK) rc = check_rows(&base, in[0], device, sizeof device, NULL, d);
  if (rc == TEQ_OK) rc = check_rows(&fresh, in[1], device, sizeof device, &again, d);
  lines_sort_unique(&again);
  FILE *f = NULL;
  if (rc == TEQ_OK && !(f = out ? fopen(out, "w") : stdout))
    rc = diag_error(d, "%s: cannot write: %s", out, strerror(errno));
  size_t kept = 0;
  if (f) {
    fprintf(f, "# device\tconfiguration\tmedian_us\tmin_us\talgo\n");
    for (size_t i = 0; i < base.n; i++) {
      size_t dl = 0, cl = 0;
      const char *config = base.v[i];
      row_fields(base.v[i], &dl, &config, &cl); /* check_rows found both tabs */
      char *c = strndup(config, cl);
      if (!c) {
        rc = TEQ_ERR_NOMEM;
        break;
      }
      if (!again.n || !bsearch(&c, again.v, again.n, sizeof *again.v, by_string))
        fprintf(f, "%s\n", base.v[i]), kept++;
      free(c);
    }
    for (size_t i = 0; i < fresh.n; i++) fprintf(f, "%s\n", fresh.v[i]);
    if (out && fclose(f) != 0 && rc == TEQ_OK)
      rc = diag_error(d, "%s: cannot write: %s", out, strerror(errno));
  }
  if (rc == TEQ_OK)
    fprintf(out ? stdout : stderr, "%zu rows of %s kept, %zu replaced, %zu rows of %s\n", kept,
            in[0], base.n - kept, fresh.n, in[1]);
  lines_free(&base), lines_free(&fresh), lines_free(&again);
  return rc;
}

/* ---- calibrate ---- */

typedef struct Sample {
  OpKind kind;
  double flops, bytes, us;
} Sample;

/* Mean |ln(predicted / measured)| of samples [from, to) of one kind. */
static double log_error(const Sample *s, size_t n, const CostCalib *c) {
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    double f = s[i].flops / (c->flop_eff[s[i].kind] * c->peak_gflops * 1e3);
    double b = s[i].bytes / (c->byte_eff[s[i].kind] * c->mem_gbps * 1e3);
    sum += fabs(log((c->launch_us + fmax(f, b)) / s[i].us));
  }
  return n ? sum / (double)n : 0;
}

/* Whether some sample of a kind spends at least half the launch overhead
 * on a term of the roofline (flops or bytes, at full efficiency). A term
 * below that on every sample hides in the launch and its noise, and a fit
 * explains that noise with an absurd efficiency: one sigmoid of 512
 * elements, 0.1 us over the launch, fitted a bandwidth of 38 GB/s and
 * priced EfficientNet's large sigmoids at two thirds of the model. */
static bool tells(const Sample *s, size_t n, const CostCalib *c, bool bytes) {
  for (size_t i = 0; i < n; i++) {
    double us = bytes ? s[i].bytes / (c->mem_gbps * 1e3) : s[i].flops / (c->peak_gflops * 1e3);
    if (us >= 0.5 * c->launch_us) return true;
  }
  return false;
}

/* Efficiencies of one kind by a grid over log-spaced values, for the terms
 * its samples tell; the others keep the defaults. False: neither is told,
 * and the kind is left unfitted. */
static bool fit_kind(const Sample *s, size_t n, CostCalib *c, OpKind k) {
  bool fit_f = tells(s, n, c, false), fit_b = tells(s, n, c, true);
  if (!fit_f && !fit_b) return false;
  double best = INFINITY, bf = c->flop_eff[k], bb = c->byte_eff[k];
  double f0 = bf, b0 = bb;
  for (int i = 0; i <= (fit_f ? 40 : 0); i++)
    for (int j = 0; j <= (fit_b ? 40 : 0); j++) {
      c->flop_eff[k] = fit_f ? pow(10, -3 + 3.0 * i / 40) : f0;
      c->byte_eff[k] = fit_b ? pow(10, -2 + 2.0 * j / 40) : b0;
      double e = log_error(s, n, c);
      if (e < best) best = e, bf = c->flop_eff[k], bb = c->byte_eff[k];
    }
  c->flop_eff[k] = bf, c->byte_eff[k] = bb;
  return true;
}

static int by_kind(const void *a, const void *b) {
  const Sample *x = a, *y = b;
  return (int)x->kind - (int)y->kind;
}

/* How well each configuration of the table would be estimated if it had
 * never been measured: leave-one-out, the roofline alone against the
 * roofline corrected by the nearest other measurements (cost_anchored),
 * as the geometric-mean error factor per operator. This is the error the
 * search meets on configurations the table lacks. */
static int cross_validate(const char *table, const char *device, Diag *d) {
  CostModel *m = cost_model_new();
  if (!m) return TEQ_ERR_NOMEM;
  int rc = cost_model_load_table(m, table, device, d);
  int n = rc ? 0 : cost_model_anchors(m);
  double plain[OP__COUNT] = {0}, anchored[OP__COUNT] = {0};
  int count[OP__COUNT] = {0};
  double all_plain = 0, all_anchored = 0;
  for (int i = 0; i < n; i++) {
    OpKind k;
    int arity;
    double flops, bytes, us;
    cost_model_anchor(m, i, &k, &arity, &flops, &bytes, &us);
    double e0 = fabs(log(cost_anchored(m, k, arity, flops, bytes, i) / us));
    /* The roofline alone is cost_anchored with no anchor of this kind. */
    CostCalib c = *cost_model_calib(m);
    double f = flops / (c.flop_eff[k] * c.peak_gflops * 1e3);
    double b = bytes / (c.byte_eff[k] * c.mem_gbps * 1e3);
    double e1 = fabs(log((c.launch_us + fmax(f, b)) / us));
    anchored[k] += e0, plain[k] += e1, count[k]++;
    all_anchored += e0, all_plain += e1;
  }
  if (n) {
    printf("\nleave-one-out: each configuration estimated as if never measured\n");
    printf("%-18s %6s %12s %12s\n", "operator", "count", "roofline", "anchored");
    for (int k = 0; k < OP__COUNT; k++)
      if (count[k])
        printf("%-18s %6d %11.0f%% %11.0f%%\n", op_def((OpKind)k)->name, count[k],
               100 * (exp(plain[k] / count[k]) - 1), 100 * (exp(anchored[k] / count[k]) - 1));
    printf("%-18s %6d %11.0f%% %11.0f%%   (geometric-mean error factor - 1)\n", "all", n,
           100 * (exp(all_plain / n) - 1), 100 * (exp(all_anchored / n) - 1));
  }
  cost_model_free(m);
  return rc;
}

static int do_calibrate(int argc, char **argv, Diag *d) {
  const char *in = NULL, *out = NULL;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) out = argv[++i];
    else if (argv[i][0] == '-') return diag_error(d, "unknown option '%s'", argv[i]);
    else in = argv[i];
  }
  if (!in) return diag_error(d, "calibrate: no table given");
  if (!out) out = in;
  Lines rows = {0};
  int rc = lines_read(&rows, in, false, d);
  Sample *s = rc ? NULL : calloc(rows.n + 1, sizeof *s);
  size_t n = 0;
  char device[256] = "";
  CudaInfo info;
  cuda_probe(&info);
  CostModel *m = cost_model_new();
  CostCalib c = *cost_model_calib(m);
  if (info.n_devices) c.peak_gflops = info.peak_gflops, c.mem_gbps = info.mem_gbps;
  for (size_t i = 0; s && i < rows.n && rc == TEQ_OK; i++) {
    char *line = strdup(rows.v[i]), *f[5] = {0};
    int nf = 0;
    for (char *p = line; nf < 5 && p;) {
      f[nf++] = p;
      p = strchr(p, '\t');
      if (p) *p++ = '\0';
    }
    Graph *g = NULL;
    int node;
    if (nf >= 4 && cost_graph_from_key(f[1], &g, &node, d) == TEQ_OK) {
      if (!device[0]) snprintf(device, sizeof device, "%s", f[0]);
      s[n++] = (Sample){g->nodes[node].kind, cost_node_flops(g, node), cost_node_bytes(g, node),
                        strtod(f[2], NULL)};
      graph_free(g);
    } else {
      rc = diag_error(d, "%s: row %zu: not a measurement", in, i + 1);
    }
    free(line);
  }
  if (rc == TEQ_OK && n == 0) rc = diag_error(d, "%s: no measurements", in);
  if (rc == TEQ_OK) {
    qsort(s, n, sizeof *s, by_kind);
    /* The launch overhead is shared by every kind: each candidate is tried
     * with every kind's efficiencies fitted under it, the best kept. */
    CostCalib before = c, best = c;
    double best_err = INFINITY;
    for (double launch = 0.25; launch <= 5.0; launch += 0.25) {
      CostCalib t = before;
      t.launch_us = launch;
      for (size_t a = 0, b; a < n; a = b) {
        for (b = a; b < n && s[b].kind == s[a].kind; b++) {}
        t.fitted[s[a].kind] = fit_kind(s + a, b - a, &t, s[a].kind);
      }
      double e = log_error(s, n, &t);
      if (e < best_err) best_err = e, best = t;
    }
    c = best;
    printf("launch overhead %.2f us\n", c.launch_us);
    printf("%-18s %6s %12s %12s\n", "operator", "count", "err before", "err after");
    double sum_before = 0, sum_after = 0;
    for (size_t a = 0, b; a < n; a = b) {
      for (b = a; b < n && s[b].kind == s[a].kind; b++) {}
      double e0 = log_error(s + a, b - a, &before);
      double e1 = log_error(s + a, b - a, &c);
      sum_before += e0 * (double)(b - a), sum_after += e1 * (double)(b - a);
      printf("%-18s %6zu %11.0f%% %11.0f%%\n", op_def(s[a].kind)->name, b - a,
             100 * (exp(e0) - 1), 100 * (exp(e1) - 1));
    }
    printf("%-18s %6zu %11.0f%% %11.0f%%   (geometric-mean error factor - 1)\n", "all", n,
           100 * (exp(sum_before / (double)n) - 1), 100 * (exp(sum_after / (double)n) - 1));
    FILE *f = fopen(out, "w");
    if (!f) rc = diag_error(d, "%s: cannot write: %s", out, strerror(errno));
    if (f) {
      fprintf(f, "# device\tconfiguration\tmedian_us\tmin_us\talgo\n");
      fprintf(f, "#calib\tdevice %.1f %.1f %.3f\n", c.peak_gflops, c.mem_gbps, c.launch_us);
      for (int k = 0; k < OP__COUNT; k++)
        if (c.fitted[k])
          fprintf(f, "#calib\t%s %.5g %.5g\n", op_def((OpKind)k)->name, c.flop_eff[k], c.byte_eff[k]);
      for (size_t i = 0; i < rows.n; i++) fprintf(f, "%s\n", rows.v[i]);
      fclose(f);
      rc = cross_validate(out, device, d);
    }
  }
  cost_model_free(m);
  free(s);
  lines_free(&rows);
  return rc;
}

/* ---- cost ---- */

typedef struct NodeCost {
  int id;
  CostEstimate e;
  const char *no_kernel; /* "in place" (graph_node_in_place), "strided" (graph_strided) or
                          * "chained" (inside a chain gathered, plan_gathers): no kernel,
                          * 0 us; else NULL */
  bool gather;           /* the exit of a chain: e is its gather's (cost_gather) */
} NodeCost;

static int by_cost_desc(const void *a, const void *b) {
  double x = ((const NodeCost *)a)->e.us, y = ((const NodeCost *)b)->e.us;
  return (x < y) - (x > y);
}

/* Where the time goes, one line per operator kind, dearest first: the
   question a reader asks of a rewritten model before any single node. */
static void print_cost_by_kind(const Graph *g, const NodeCost *costs, int n, double total) {
  double us[OP__COUNT + 1] = {0}; /* the last: chains' gathers */
  int count[OP__COUNT + 1] = {0};
  for (int k = 0; k < n; k++) {
    int kind = costs[k].gather ? OP__COUNT : (int)g->nodes[costs[k].id].kind;
    us[kind] += costs[k].e.us;
    count[kind]++;
  }
  printf("by operator kind:\n");
  for (;;) {
    int dearest = -1;
    for (int kind = 0; kind <= OP__COUNT; kind++)
      if (count[kind] && (dearest < 0 || us[kind] > us[dearest])) dearest = kind;
    if (dearest < 0) break;
    printf("%9.1f us  %5.1f%%  %4d x %s\n", us[dearest], total > 0 ? 100 * us[dearest] / total : 0,
           count[dearest],
           dearest == OP__COUNT ? "gather (a chain of layout operators)"
                                : op_def((OpKind)dearest)->name);
    count[dearest] = 0;
  }
}

static int do_cost(int argc, char **argv, Diag *d) {
  const char *table = NULL, *model = NULL, *dims[64];
  int n_dims = 0;
  long long batch = 1;
  bool gpu = false;
  int shown = 15;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--table") == 0 && i + 1 < argc) table = argv[++i];
    else if (strcmp(argv[i], "--gpu") == 0) gpu = true;
    else if (strcmp(argv[i], "--all") == 0) shown = INT_MAX;
    else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
      if (!teq_parse_int(argv[++i], 1, 1 << 20, &batch))
        return diag_error(d, "--batch takes a positive integer, not '%s'", argv[i]);
    } else if (strcmp(argv[i], "--dim") == 0 && i + 1 < argc) {
      if (!take_dim(argv[++i], dims, &n_dims, d)) return TEQ_ERR_INPUT;
    } else if (argv[i][0] == '-') return diag_error(d, "unknown option '%s'", argv[i]);
    else model = argv[i];
  }
  if (!model) return diag_error(d, "cost: no model given");
  OnnxImportOptions io = ONNX_IMPORT_DEFAULTS;
  io.batch = batch;
  io.dims = dims;
  io.n_dims = n_dims;
  io.opaque_unsupported_forms = true; /* opaque nodes are not costed */
  Graph *g = NULL;
  CostModel *m = cost_model_new();
  CudaDevice *dev = NULL;
  NodeCost *costs = NULL;
  int rc = m ? onnx_import_file(model, &io, &g, NULL, d) : TEQ_ERR_NOMEM;
  if (rc == TEQ_OK && table) rc = cost_model_load_table(m, table, NULL, d);
  if (rc == TEQ_OK && gpu && (rc = cuda_device_open(&dev, d)) == TEQ_OK) cost_model_use_gpu(m, dev);
  PlanAsRun ar = {0};
  const PlanGathers *pg = &ar.gathers;
  if (rc == TEQ_OK && !(costs = calloc((size_t)g->n_nodes + 1, sizeof *costs))) rc = TEQ_ERR_NOMEM;
  if (rc == TEQ_OK) rc = plan_as_run(g, &ar, d);
  int n = 0, n_in_place = 0, n_strided = 0, n_chained = 0, counts[COST__SOURCES] = {0};
  double total = 0, in_place_us = 0, strided_us = 0, chained_us = 0, gathers_us = 0;
  for (int id = 0; rc == TEQ_OK && id < g->n_nodes; id++) {
    if (op_def(g->nodes[id].kind)->flags & (OPF_SOURCE | OPF_NOOP | OPF_OPAQUE)) continue;
    costs[n].id = id;
    if ((rc = cost_node(m, g, id, &costs[n].e, d)) != TEQ_OK) break;
    PlanRun run = plan_node_runs(g, &ar, id, NULL);
    if (run == PLAN_RUN_CHAINED || run == PLAN_RUN_GATHER) {
      /* as kernels, but for those that ran none (views, concats in place) */
      bool none = cost_node_is_free(g, id) || graph_node_in_place(g, id, ar.home, NULL, NULL);
      chained_us += none ? 0 : costs[n].e.us;
      n_chained++;
    }
    if (run == PLAN_RUN_GATHER) {
      costs[n].e = cost_gather(m, g, &pg->exits[pg->exit[id]]);
      costs[n].gather = true;
      gathers_us += costs[n].e.us;
    } else if (run != PLAN_RUN_KERNEL) {
      if (run == PLAN_RUN_IN_PLACE) in_place_us += costs[n].e.us, n_in_place++;
      if (run == PLAN_RUN_STRIDED) strided_us += costs[n].e.us, n_strided++;
      costs[n].no_kernel = run == PLAN_RUN_IN_PLACE ? "in place"
                           : run == PLAN_RUN_STRIDED ? "strided"
                                                     : "chained";
      costs[n].e.us = 0;
    }
    if (run == PLAN_RUN_KERNEL || run == PLAN_RUN_GATHER) {
      total += costs[n].e.us;
      counts[costs[n].e.source]++;
    }
    n++;
  }
  if (rc == TEQ_OK) {
    qsort(costs, (size_t)n, sizeof *costs, by_cost_desc);
    printf("%s: %d operators, %.1f us in all (%d from the table%s%s, %d measured now, %d from a "
           "measured twin, %d analytic)\n",
           model, n, total, counts[COST_TABLE], table ? " of " : "",
           table ? cost_model_device(m) : "", counts[COST_MEASURED], counts[COST_TWIN],
           counts[COST_ANALYTIC]);
    if (n_in_place)
      printf("  %d written in place by their producers, no kernel (%.1f us as kernels)\n",
             n_in_place, in_place_us);
    if (n_strided)
      printf("  %d read or written through strides (graph_strided), no kernel (%.1f us as "
             "kernels)\n",
             n_strided, strided_us);
    if (pg->n_exits)
      printf("  %d layout operators in %d chains, each one gather of rows (plan_gathers): "
             "%.1f us, %.1f us as kernels\n",
             n_chained, pg->n_exits, gathers_us, chained_us);
    for (int k = 0; k < n && k < shown; k++) {
      char key[COST_KEY_MAX];
      cost_config_key(g, costs[k].id, key, sizeof key);
      printf("%9.1f us  %-8s  %s%.110s\n", costs[k].e.us,
             costs[k].no_kernel ? costs[k].no_kernel : cost_source_name(costs[k].e.source),
             costs[k].gather ? "gather to " : "", key);
    }
    if (n > shown) printf("      ... %d more (--all lists them)\n", n - shown);
    print_cost_by_kind(g, costs, n, total);
  }
  plan_as_run_fini(&ar);
  free(costs);
  cost_model_free(m);
  cuda_device_close(dev);
  graph_free(g);
  return rc;
}

/* ---- ways ---- */

/* The product ways of cuda_device_pin_way, whole and split. */
static const int way_splits[] = {1, 2, 4, 8, 16};
enum { N_WAY_SPLITS = sizeof way_splits / sizeof *way_splits };

/* Node id of g alone, timed with the way pinned (NULL: as searched); a
 * negative time where the convolution does not offer that way. */
static int time_pinned(CudaDevice *dev, const Graph *g, int id, const char *way, int repeats,
                       CudaProfile *p, Diag *d) {
  cuda_device_pin_way(dev, way);
  Diag wd;
  diag_init(&wd);
  int rc = cuda_profile_node(dev, g, id, repeats, p, &wd);
  cuda_device_pin_way(dev, NULL);
  if (rc == TEQ_ERR_UNSUPPORTED && way && wd.text && strstr(wd.text, "not offered")) {
    p->median_us = -1;
    rc = TEQ_OK;
  } else if (rc != TEQ_OK) {
    diag_error(d, "%s", diag_last(&wd));
  }
  diag_fini(&wd);
  return rc;
}

static int do_ways(int argc, char **argv, Diag *d) {
  const char *model = NULL;
  long long repeats = 20, batch = 1;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
      if (!teq_parse_int(argv[++i], 1, 100000, &repeats))
        return diag_error(d, "--repeats takes a positive integer, not '%s'", argv[i]);
    } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
      if (!teq_parse_int(argv[++i], 1, 1 << 20, &batch))
        return diag_error(d, "--batch takes a positive integer, not '%s'", argv[i]);
    } else if (argv[i][0] == '-') return diag_error(d, "unknown option '%s'", argv[i]);
    else model = argv[i];
  }
  if (!model) return diag_error(d, "ways: no model given");
  OnnxImportOptions io = ONNX_IMPORT_DEFAULTS;
  io.batch = batch;
  io.opaque_unsupported_forms = true;
  Graph *g = NULL;
  CudaDevice *dev = NULL;
  Lines seen = {0};
  int rc = onnx_import_file(model, &io, &g, NULL, d);
  if (rc == TEQ_OK) rc = cuda_device_open(&dev, d);
  if (rc == TEQ_OK)
    printf("%s on %s: each convolution and product once, us (median of %lld); '-': not "
           "offered\n"
           "%9s  %-34s %9s %9s %9s %9s %9s %9s %9s %9s  %s\n",
           model, cuda_device_name(dev), repeats, "chosen", "way", "whole", "split 2",
           "split 4", "split 8", "split 16", "direct", "tiled", "winograd", "node");
  double chosen_sum = 0;
  int n_kernels = 0;
  for (int id = 0; rc == TEQ_OK && id < g->n_nodes; id++) {
    if (g->nodes[id].kind != OP_CONV2D && g->nodes[id].kind != OP_MATMUL) continue;
    char key[COST_KEY_MAX], label[GRAPH_LABEL_MAX];
    cost_config_key(g, id, key, sizeof key);
    bool again = false;
    for (size_t k = 0; k < seen.n && !again; k++) again = strcmp(seen.v[k], key) == 0;
    if (again || (rc = lines_add(&seen, key)) != TEQ_OK) continue;
    CudaProfile chosen, p;
    if ((rc = time_pinned(dev, g, id, NULL, (int)repeats, &chosen, d)) != TEQ_OK) break;
    double us[N_WAY_SPLITS];
    bool offered = false;
    for (int product = 0; product < 2 && !offered && rc == TEQ_OK; product++)
      for (int s = 0; s < N_WAY_SPLITS && rc == TEQ_OK; s++) {
        char way[64];
        cuda_product_way_name(product, way_splits[s], way, sizeof way);
        rc = time_pinned(dev, g, id, way, (int)repeats, &p, d);
        us[s] = p.median_us;
        offered = offered || us[s] >= 0;
      }
    static const char *const own[] = {"teq:direct", "teq:tiled", "teq:winograd"};
    double own_us[3] = {-1, -1, -1};
    for (int k = 0; k < 3 && rc == TEQ_OK && g->nodes[id].kind == OP_CONV2D; k++)
      if ((rc = time_pinned(dev, g, id, own[k], (int)repeats, &p, d)) == TEQ_OK)
        own_us[k] = p.median_us;
    if (rc != TEQ_OK) break;
    printf("%9.2f  %-34.34s", chosen.median_us, chosen.algo);
    for (int s = 0; s < N_WAY_SPLITS; s++)
      if (offered && us[s] >= 0) printf(" %9.2f", us[s]);
      else printf(" %9s", "-");
    for (int k = 0; k < 3; k++)
      if (own_us[k] >= 0) printf(" %9.2f", own_us[k]);
      else printf(" %9s", "-");
    printf("  %s\n", graph_node_label(g, id, label, sizeof label));
    fflush(stdout);
    chosen_sum += chosen.median_us;
    n_kernels++;
  }
  if (rc == TEQ_OK)
    printf("%d distinct convolutions and products, %.1f us as chosen\n", n_kernels, chosen_sum);
  lines_free(&seen);
  cuda_device_close(dev);
  graph_free(g);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr, 2);
  if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) return usage(stdout, 0);
  Diag d;
  diag_init(&d);
  int rc;
  if (strcmp(argv[1], "record") == 0) rc = do_record(argc - 2, argv + 2, &d);
  else if (strcmp(argv[1], "measure") == 0) rc = do_measure(argc - 2, argv + 2, &d);
  else if (strcmp(argv[1], "calibrate") == 0) rc = do_calibrate(argc - 2, argv + 2, &d);
  else if (strcmp(argv[1], "merge") == 0) rc = do_merge(argc - 2, argv + 2, &d);
  else if (strcmp(argv[1], "cost") == 0) rc = do_cost(argc - 2, argv + 2, &d);
  else if (strcmp(argv[1], "ways") == 0) rc = do_ways(argc - 2, argv + 2, &d);
  else {
    fprintf(stderr, "teq-profile: unknown command '%s'\n", argv[1]);
    return usage(stderr, 2);
  }
  if (rc != TEQ_OK) {
    fprintf(stderr, "teq-profile: ");
    diag_flush(&d, stderr);
  }
  diag_fini(&d);
  return teq_exit_status(rc);
}
