/* main.c: the optimize command.
 *
 *   optimize --rules ruledb.sqlite [-o model.opt.onnx] [--alpha 1.05] [--budget N] [--patience N]
 *            [--min-gain F]
 *            [--time-limit S] [--cost-model auto|gpu|table|analytic] [--cost-table F]
 *            [--json report.json] [--seed S] [--unproved] [--no-check] [--tolerance T]
 *            [--window N] [--plain-windows] [--one-site] [--zp-check-flops F] [--batch N] [--record FILE]
 *            [--dump] [--quiet] [--as-given]
 *            [--pet | --no-pet] [--pet-depth N] [--pet-trials T] [--pet-mutants K]
 *            [--pet-max-flops F] [--pet-max-elements N] [--jobs N] [--check-derived] model.onnx
 *
 * Imports the model (constants and BatchNormalization folded), searches for
 * a cheaper equivalent with the proved rules, computes weight-only nodes,
 * keeps the original instead where the result is not cheaper by more than
 * --min-gain (or, when the costs are measured on a GPU, where its replay
 * there is not that much faster),
 * exports the result, and checks it end to end on the CPU executor: the
 * file written and the original, each read as given (no import fusion),
 * run on the same seeded random inputs, and the command fails (status 1)
 * when the largest relative difference of an output exceeds the
 * tolerance. With PET (optimize/pet), partially equivalent mutants of the
 * multi-linear subprograms compete with the rules in the same search; the
 * report lists those in the result with their corrections, cost changes and
 * the probability bound of the tests that accepted them. The report goes
 * to stdout (and as JSON with --json), progress
 * to stderr. Bad arguments, a missing or foreign rule database, an empty
 * rule set or a model the importer rejects exit with status 2. */
#include <errno.h>
#include <math.h>
#ifdef __GLIBC__
#include <malloc.h>
#include <sys/mman.h>
#include <stdint.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "optimize/optimize.h"
#include "optimize/pet/pet.h"
#include "runtime/cuda.h"
#include "runtime/exec.h"
#include "runtime/onnx.h"

#ifndef TEQ_COST_TABLE
#define TEQ_COST_TABLE "tools/profiles/h100.tsv"
#endif

static const char usage[] =
  "usage: optimize --rules FILE [options] MODEL.onnx\n"
  "  --rules FILE        rule database made by gen-rules and verify-rules\n"
  "  -o FILE             optimized model (default: MODEL.opt.onnx)\n"
  "  --alpha A           keep candidates costing under A x the best (default 1.05)\n"
  "  --budget N          graphs expanded per window (default 300; a last window\n"
  "                      enlarged by a remainder gets more in proportion)\n"
  "  --patience N        also stop a window after N graphs expanded without a cheaper\n"
  "                      one (default 15; 0: only the budget stops it)\n"
  "  --min-gain F        the result replaces the original only if it saves more than\n"
  "                      this share of the cost, estimated and, on a GPU, measured\n"
  "                      (default 0.005; 0: any saving): less is within the noise\n"
  "  --time-limit S      seconds for the whole search (default: none)\n"
  "  --window N          operators per search window (default 150); after\n"
  "                      more than one, a few steps over the whole graph\n"
  "  --plain-windows     cut each window at its full size (default: in its last\n"
  "                      quarter, where the fewest tensors cross the cut)\n"
  "  --one-site          each search step rewrites one match, as TASO's search does\n"
  "                      (default: a step may also apply a rule at all its matches)\n"
  "  --cost-model M      auto, gpu, table or analytic (default auto: the GPU if there\n"
  "                      is one, else the cost table, else the analytic model); on a GPU\n"
  "                      both graphs are then replayed, and the original is kept unless\n"
  "                      the result runs faster\n"
  "  --cost-table FILE   costs measured earlier on a GPU (default " TEQ_COST_TABLE ");\n"
  "                      with auto on a GPU, its rows measured on that GPU's model are\n"
  "                      reused (--cost-model gpu measures every configuration anew)\n"
  "  --record FILE       write every operator configuration costed, to measure on a GPU\n"
  "  --json FILE         also write the report as JSON\n"
  "  --seed S            random inputs of the checks (default 1)\n"
  "  --input NAME=FILE   the end-to-end check feeds input NAME from FILE (repeatable;\n"
  "                      .pb: an ONNX TensorProto, else raw little-endian data of the\n"
  "                      input's type and shape): a model's own data, where random\n"
  "                      inputs fall where it was not trained (a detector's map on noise)\n"
  "  --unproved          also use rules verify-rules has not proved (never refuted ones)\n"
  "  --zp-check-flops F  check each distinct rule instance exactly in Z_p up to F\n"
  "                      operations: flops and elements moved (default 3e7; 0: never)\n"
  "  --no-check          skip the end-to-end check\n"
  "  --tolerance T       largest relative output difference accepted (default 1e-4)\n"
  "  --batch N           value of symbolic dimensions not named by --dim (default 1)\n"
  "  --dim NAME=N        the inputs' symbolic dimension NAME is N (repeatable): the\n"
  "                      optimized model is specialized to these extents\n"
  "  --dump              print the optimized graph, one node per line\n"
  "  --as-given          also price (and on a GPU time) the model as given: imported\n"
  "                      again with no fusion (BatchNorm, activations, layer norms and\n"
  "                      GELUs as in the file), the graph TASO and Tensat start from\n"
  "  --pet, --no-pet     PET's partially equivalent mutations in the search (default on;\n"
  "                      --no-pet: the proved rules alone)\n"
  "  --pet-depth N       operators per mutant (default 3)\n"
  "  --pet-trials T      random tests in Z_p per mutant (default 0: from (n/p)^t <= 2^-60)\n"
  "  --pet-mutants K     corrected mutants kept per subprogram (default 8)\n"
  "  --pet-max-flops F   mutate subprograms up to F flops (default 2e8; larger ones add\n"
  "                      more candidates to the search than they gain)\n"
  "  --pet-max-elements N  ... and whose tensors each hold up to N elements (default\n"
  "                      2e6; testing larger ones costs more memory than they gain)\n"
  "  --check-derived     build every PET candidate the search derives unbuilt too, and\n"
  "                      fail if it differs (slow; a test of the search itself)\n"
  "  --jobs N            threads testing PET's mutants side by side (default: online CPUs)\n"
  "  --quiet             no progress on stderr\n";

typedef struct Args {
  const char *rules, *model, *out, *cost_mode, *cost_table, *json, *record;
  OptOptions opt;
  double tolerance;
  long long batch;
  const char *dims[64]; /* --dim NAME=N */
  int n_dims;
  const char *inputs[64]; /* --input NAME=FILE: the check's given inputs */
  int n_inputs;
  bool unproved, check, dump, as_given;
  double min_gain; /* the share of the cost a result must save to replace the original */
} Args;

static int bad(const char *fmt, const char *arg) {
  fprintf(stderr, "optimize: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n%s", usage);
  return 2;
}

static bool parse_real(const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
  *out = v;
  return true;
}

static int parse_args(int argc, char **argv, Args *a) {
  *a = (Args){.cost_mode = "auto", .cost_table = TEQ_COST_TABLE, .opt = OPT_DEFAULTS,
              .tolerance = 1e-4, .batch = 1, .check = true};
  a->opt.progress = stderr;
  a->opt.pet = true; /* the command competes with PET's mutants unless told --no-pet */
  /* Most windows find their best within a few dozen graphs and spend the
   * rest of the budget finding nothing: at budget 100 the suite's thirteen
   * models ended equal with a patience of 20 in 1.3 to 4.3 times less
   * search, and of eleven further models two ended 0.3 and 0.6% dearer at
   * 30 (tools/bench/RESULTS.md, 2026-11-27). With merges taking more rounds
   * per step, 15 ended every model of the suite where 30 did, in 1.2 to
   * 2.2 times less search; of the zoo, GoogLeNet and DenseNet-121 ended
   * cheaper and ShuffleNetV2 0.6% dearer. */
  a->opt.patience = 15;
  /* Measured costs carry noise: each process picks its convolution ways
   * anew, and on the H200 CSRNet's result, in effect its original, timed
   * 0.1% faster in optimize's one process and 6% slower across two of
   * run-model's. A saving under half a percent is a guess, and the
   * original, unrewritten, is the better answer to it. */
  a->min_gain = 0.005;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  a->opt.jobs = cpus > 1 ? (int)(cpus < 64 ? cpus : 64) : 1;
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long long n;
    double x;
    if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
      fputs(usage, stdout);
      return 1;
    } else if (!strcmp(k, "--quiet")) {
      a->opt.quiet = true;
      continue;
    } else if (!strcmp(k, "--one-site")) {
      a->opt.one_site = true;
      continue;
    } else if (!strcmp(k, "--check-derived")) {
      a->opt.check_derived = true;
      continue;
    } else if (!strcmp(k, "--plain-windows")) {
      a->opt.plain_windows = true;
      continue;
    } else if (!strcmp(k, "--unproved")) {
      a->unproved = true;
      continue;
    } else if (!strcmp(k, "--as-given")) {
      a->as_given = true;
      continue;
    } else if (!strcmp(k, "--dump")) {
      a->dump = true;
      continue;
    } else if (!strcmp(k, "--no-check")) {
      a->check = false;
      continue;
    } else if (!strcmp(k, "--pet") || !strcmp(k, "--no-pet")) {
      a->opt.pet = k[2] == 'p';
      continue;
    } else if (k[0] != '-') {
      if (a->model) return bad("unexpected argument '%s' (one model)", k);
      a->model = k;
      continue;
    }
    if (!v) return bad("%s needs a value", k);
    i++;
    if (!strcmp(k, "--rules")) a->rules = v;
    else if (!strcmp(k, "-o") || !strcmp(k, "--output")) a->out = v;
    else if (!strcmp(k, "--json")) a->json = v;
    else if (!strcmp(k, "--record")) a->record = v;
    else if (!strcmp(k, "--cost-table")) a->cost_table = v;
    else if (!strcmp(k, "--cost-model")) {
      if (strcmp(v, "auto") && strcmp(v, "gpu") && strcmp(v, "table") && strcmp(v, "analytic"))
        return bad("--cost-model '%s': expected auto, gpu, table or analytic", v);
      a->cost_mode = v;
    } else if (!strcmp(k, "--alpha")) {
      if (!parse_real(v, 1.0, 10.0, &x)) return bad("--alpha '%s': expected 1 to 10", v);
      a->opt.alpha = x;
    } else if (!strcmp(k, "--time-limit")) {
      if (!parse_real(v, 0.001, 1e6, &x)) return bad("--time-limit '%s': expected seconds > 0", v);
      a->opt.time_limit_s = x;
    } else if (!strcmp(k, "--zp-check-flops")) {
      if (!parse_real(v, 0, 1e15, &x)) return bad("--zp-check-flops '%s': expected a number >= 0", v);
      a->opt.zp_check_flops = x;
    } else if (!strcmp(k, "--tolerance")) {
      if (!parse_real(v, 0, 1, &x)) return bad("--tolerance '%s': expected 0 to 1", v);
      a->tolerance = x;
    } else if (!strcmp(k, "--pet-depth")) {
      if (!teq_parse_int(v, 1, 6, &n)) return bad("--pet-depth '%s': expected 1 to 6", v);
      a->opt.pet_depth = (int)n;
    } else if (!strcmp(k, "--pet-trials")) {
      if (!teq_parse_int(v, 0, 1000, &n)) return bad("--pet-trials '%s': expected 0 to 1000", v);
      a->opt.pet_trials = (int)n;
    } else if (!strcmp(k, "--pet-mutants")) {
      if (!teq_parse_int(v, 1, 64, &n)) return bad("--pet-mutants '%s': expected 1 to 64", v);
      a->opt.pet_mutants = (int)n;
    } else if (!strcmp(k, "--pet-max-flops")) {
      if (!parse_real(v, 0, 1e15, &x)) return bad("--pet-max-flops '%s': expected a number >= 0", v);
      a->opt.pet_max_flops = x;
    } else if (!strcmp(k, "--pet-max-elements")) {
      if (!parse_real(v, 0, 1e15, &x))
        return bad("--pet-max-elements '%s': expected a number >= 0", v);
      a->opt.pet_max_elements = x;
    } else if (!strcmp(k, "--budget")) {
      if (!teq_parse_int(v, 0, 100000000, &n)) return bad("--budget '%s': expected an integer >= 0", v);
      a->opt.budget = (int)n;
    } else if (!strcmp(k, "--min-gain")) {
      if (!parse_real(v, 0.0, 0.5, &x)) return bad("--min-gain '%s': expected 0 to 0.5", v);
      a->min_gain = x;
    } else if (!strcmp(k, "--patience")) {
      if (!teq_parse_int(v, 0, 100000000, &n)) return bad("--patience '%s': expected an integer >= 0", v);
      a->opt.patience = (int)n;
    } else if (!strcmp(k, "--jobs")) {
      if (!teq_parse_int(v, 1, 64, &n)) return bad("--jobs '%s': expected 1 to 64", v);
      a->opt.jobs = (int)n;
    } else if (!strcmp(k, "--window")) {
      if (!teq_parse_int(v, 8, 100000, &n)) return bad("--window '%s': expected 8 to 100000", v);
      a->opt.window = (int)n;
    } else if (!strcmp(k, "--seed")) {
      if (!teq_parse_int(v, 0, INT64_MAX, &n)) return bad("--seed '%s': expected an integer >= 0", v);
      a->opt.seed = (uint64_t)n;
    } else if (!strcmp(k, "--batch")) {
      if (!teq_parse_int(v, 1, 1 << 20, &n)) return bad("--batch '%s': expected 1 to 1048576", v);
      a->batch = n;
    } else if (!strcmp(k, "--dim")) {
      if (!v || !strchr(v, '=')) return bad("--dim '%s': expected NAME=N", v ? v : "");
      if (a->n_dims == (int)(sizeof a->dims / sizeof *a->dims)) return bad("too many --dim%s", "");
      a->dims[a->n_dims++] = v;
    } else if (!strcmp(k, "--input")) { /* its NAME=FILE checked with the model's inputs */
      if (a->n_inputs == (int)(sizeof a->inputs / sizeof *a->inputs))
        return bad("too many --input%s", "");
      a->inputs[a->n_inputs++] = v;
    } else {
      return bad("unknown option '%s'", k);
    }
  }
  if (!a->model) return bad("no model given%s", "");
  if (a->n_inputs && !a->check)
    return bad("--input feeds the end-to-end check, which --no-check skips%s", "");
  if (!a->rules) return bad("no rule database given (--rules FILE)%s", "");
  return 0;
}

/* The cost model the options ask for; *what describes it for the report. */
static int open_cost_model(const Args *a, CostModel **out, CudaDevice **dev, char *what,
                           size_t size, Diag *d) {
  CostModel *cm = cost_model_new();
  if (!cm) return TEQ_ERR_NOMEM;
  const char *mode = a->cost_mode;
  int rc = TEQ_OK;
  bool gpu = !strcmp(mode, "gpu");
  if (!strcmp(mode, "auto")) {
    CudaInfo info;
    cuda_probe(&info);
    gpu = info.n_devices > 0;
  }
  bool table_there = access(a->cost_table, R_OK) == 0;
  if (gpu) {
    rc = cuda_device_open(dev, d);
    if (rc == TEQ_OK) {
      /* Rows the table holds for this very device model are measurements
       * already (30 repeats where the search takes 20): reusing them makes
       * a search on the GPU as quick as one on the table, and its prices
       * the same from run to run. The rest are measured as met. */
      cost_model_use_gpu(cm, *dev);
      const char *name = cuda_device_name(*dev);
      Diag quiet;
      diag_init(&quiet);
      int rows = !strcmp(mode, "auto") && table_there &&
                         cost_model_load_table(cm, a->cost_table, name, &quiet) == TEQ_OK
                     ? cost_model_size(cm)
                     : 0;
      diag_fini(&quiet);
      if (rows)
        snprintf(what, size, "measured on %s, %d configurations of it from %s", name, rows,
                 a->cost_table);
      else
        snprintf(what, size, "measured on %s", name);
    } else if (!strcmp(mode, "gpu")) {
      cost_model_free(cm);
      return diag_error(d, "--cost-model gpu: no usable GPU"), TEQ_ERR_INPUT;
    } else {
      rc = TEQ_OK;
      gpu = false;
    }
  }
  if (!gpu && strcmp(mode, "analytic")) {
    if (table_there || !strcmp(mode, "table")) {
      rc = cost_model_load_table(cm, a->cost_table, NULL, d);
      if (rc) {
        cost_model_free(cm);
        return rc;
      }
      snprintf(what, size, "table %s (%s, %d configurations), analytic beyond it", a->cost_table,
               cost_model_device(cm), cost_model_size(cm));
    } else {
      snprintf(what, size, "analytic (no cost table at %s)", a->cost_table);
    }
  } else if (!gpu) {
    snprintf(what, size, "analytic");
  }
  *out = cm;
  return TEQ_OK;
}

/* The search cuts, costs and rewrites nodes by their shapes; an operator
 * Teq does not know has one only where the model declares it. Refuses a
 * graph with an unknown shape, naming the first node whose shape is
 * unknown because such an operator's is (TEQ_ERR_INPUT). */
static int require_shapes(const Graph *g, const char *path, Diag *d) {
  for (int id = 0; id < g->n_nodes; id++) {
    const Node *n = &g->nodes[id];
    if (n->kind == OP_OPAQUE) continue;
    for (int j = 0; j < n->n_in; j++) {
      const Node *p = &g->nodes[n->in[j].node];
      if (p->kind != OP_OPAQUE || shape_is_known(&p->out[n->in[j].out])) continue;
      char a[256], b[256];
      return diag_error(d, "%s: %s reads output %d of %s, which Teq keeps opaque, whose "
                           "shape the model does not declare; onnx.shape_inference.infer_shapes "
                           "writes the shapes into the model", path,
                        graph_node_label(g, id, a, sizeof a), n->in[j].out,
                        graph_node_label(g, n->in[j].node, b, sizeof b));
    }
  }
  return TEQ_OK;
}

/* ---- the end-to-end check ---- */

/* Whether t holds one value everywhere (not when it holds none). */
static bool is_flat(const Tensor *t) {
  const float *x = t->data;
  if (tensor_numel(t) == 0) return false;
  for (int64_t i = 1; i < tensor_numel(t); i++)
    if (x[i] != x[0]) return false;
  return true;
}

static bool same_opaque(const Node *x, const Node *y) {
  return x->kind == OP_OPAQUE && y->kind == OP_OPAQUE &&
         x->opaque->proto_len == y->opaque->proto_len &&
         memcmp(x->opaque->proto, y->opaque->proto, x->opaque->proto_len) == 0;
}

/* The CPU executor cannot run an operator Teq does not know, but the search
 * never touches one: the original and the optimized graph hold the same
 * opaque nodes (the same packed NodeProto, whose output names are unique).
 * Each graph is checked with them cut out: every output of an opaque node
 * becomes an input (after the graph's own, in ids, the original's order),
 * fed the same random values in both, and every input of one becomes an
 * output (after the graph's own), so that both must also feed it the same
 * values. *out is a copy of g; ids[k] is the id in g of the original's
 * k-th opaque node. */
static int cut_opaque(const Graph *g, const int32_t *ids, int n, Graph **out, Diag *d) {
  Graph *c = graph_copy(g);
  int32_t *off = NULL, *uses = c ? graph_use_counts(c, &off) : NULL;
  int rc = uses ? TEQ_OK : TEQ_ERR_NOMEM;
  for (int k = 0; k < n && rc == TEQ_OK; k++) {
    int32_t n_in = c->nodes[ids[k]].n_in, n_out = c->nodes[ids[k]].n_out;
    for (int j = 0; j < n_in && rc == TEQ_OK; j++) {
      int r = graph_add_output(c, c->nodes[ids[k]].in[j], NULL, d);
      rc = r < 0 ? r : TEQ_OK;
    }
    for (int o = 0; o < n_out && rc == TEQ_OK; o++) {
      if (!uses[off[ids[k]] + o]) continue; /* read by nothing: nothing to feed */
      Shape s = c->nodes[ids[k]].out[o];
      if (!shape_is_known(&s)) {
        char label[256];
        rc = diag_error(d, "optimize: cannot check: output %d of %s has an unknown shape "
                        "(onnx.shape_inference.infer_shapes writes it into the model; "
                        "--no-check skips the check)", o,
                        graph_node_label(c, ids[k], label, sizeof label));
        break;
      }
      int id = graph_add_input(c, NULL, &s, c->nodes[ids[k]].dtype, d);
      if (id < 0) rc = id;
      else graph_replace_uses(c, (TensorRef){ids[k], o}, (TensorRef){id, 0});
    }
  }
  free(uses), free(off);
  if (rc == TEQ_OK && graph_remove_dead(c) < 0) rc = TEQ_ERR_NOMEM;
  if (rc != TEQ_OK) {
    graph_free(c);
    return rc;
  }
  *out = c;
  return TEQ_OK;
}

/* The opaque nodes of g and what pairs them across an export: id[k] and
 * onnx_opaque_identity's bytes of the k-th (len[k]; NULL where its
 * NodeProto does not parse). */
typedef struct OpaqueIds {
  int n;
  int32_t *id;
  uint8_t **bytes;
  size_t *len;
} OpaqueIds;

static void opaque_ids_fini(OpaqueIds *o) {
  for (int k = 0; k < o->n && o->bytes; k++) free(o->bytes[k]);
  free(o->id), free(o->bytes), free(o->len);
  *o = (OpaqueIds){0};
}

static int opaque_ids(const Graph *g, OpaqueIds *o) {
  *o = (OpaqueIds){0};
  size_t cap = (size_t)g->n_nodes + 1;
  o->id = malloc(cap * sizeof *o->id), o->bytes = calloc(cap, sizeof *o->bytes);
  o->len = calloc(cap, sizeof *o->len);
  if (!o->id || !o->bytes || !o->len) {
    opaque_ids_fini(o);
    return TEQ_ERR_NOMEM;
  }
  for (int id = 0; id < g->n_nodes; id++) {
    if (g->nodes[id].kind != OP_OPAQUE) continue;
    int k = o->n++;
    o->id[k] = id;
    int rc = onnx_opaque_identity(g->nodes[id].opaque, &o->bytes[k], &o->len[k]);
    if (rc == TEQ_ERR_NOMEM) {
      opaque_ids_fini(o);
      return rc;
    }
    if (rc) o->bytes[k] = NULL;
  }
  return TEQ_OK;
}

static bool identity_equal(const OpaqueIds *a, int i, const OpaqueIds *b, int j) {
  return a->bytes[i] && b->bytes[j] && a->len[i] == b->len[j] &&
         memcmp(a->bytes[i], b->bytes[j], a->len[i]) == 0;
}

/* Whether g's opaque nodes can be paired with those of the model written
 * from it: each by what the export leaves of it (onnx_opaque_identity),
 * which no two of them share. */
static bool opaque_pairable(const Graph *g) {
  OpaqueIds o;
  if (!g || opaque_ids(g, &o)) return false;
  bool ok = true;
  for (int i = 0; i < o.n && ok; i++) {
    ok = o.bytes[i] != NULL;
    for (int j = 0; j < i && ok; j++) ok = !identity_equal(&o, i, &o, j);
  }
  opaque_ids_fini(&o);
  return ok;
}

/* a and b with their opaque nodes cut out (cut_opaque), matched; *n_cut
 * says how many. b must hold exactly a's: the same NodeProto (graphs in
 * memory), or one alike but for the names the export rewrites (b read
 * from the file written, whose opaque nodes opaque_pairable). */
static int cut_both(const Graph *a, const Graph *b, Graph **ca, Graph **cb, int *n_cut, Diag *d) {
  int32_t *ia = malloc(((size_t)a->n_nodes + 1) * sizeof *ia);
  int32_t *ib = malloc(((size_t)a->n_nodes + 1) * sizeof *ib);
  bool *taken = calloc((size_t)b->n_nodes + 1, sizeof *taken);
  OpaqueIds oa = {0}, ob = {0};
  int n = 0, rc = ia && ib && taken ? TEQ_OK : TEQ_ERR_NOMEM;
  if (rc == TEQ_OK) rc = opaque_ids(a, &oa);
  if (rc == TEQ_OK) rc = opaque_ids(b, &ob);
  for (int i = 0; i < oa.n && rc == TEQ_OK; i++) {
    int id = oa.id[i], twin = -1;
    for (int j = 0; j < ob.n && twin < 0; j++)
      if (!taken[ob.id[j]] && same_opaque(&a->nodes[id], &b->nodes[ob.id[j]])) twin = ob.id[j];
    for (int j = 0; j < ob.n && twin < 0; j++)
      if (!taken[ob.id[j]] && identity_equal(&oa, i, &ob, j)) twin = ob.id[j];
    if (twin < 0) {
      char label[256];
      rc = diag_error(d, "optimize: the optimized graph lost %s",
                      graph_node_label(a, id, label, sizeof label));
      break;
    }
    taken[twin] = true;
    ia[n] = id, ib[n++] = twin;
  }
  if (rc == TEQ_OK && n != ob.n)
    rc = diag_error(d, "optimize: the optimized graph has %d operators Teq does not know, the "
                       "original %d", ob.n, n);
  opaque_ids_fini(&oa), opaque_ids_fini(&ob);
  free(taken);
  *ca = *cb = NULL;
  if (rc == TEQ_OK) rc = cut_opaque(a, ia, n, ca, d);
  if (rc == TEQ_OK) rc = cut_opaque(b, ib, n, cb, d);
  if (rc != TEQ_OK) {
    graph_free(*ca);
    *ca = NULL;
  }
  *n_cut = n;
  free(ia);
  free(ib);
  return rc;
}

/* A check input: uniform in [-2, 2), of about the unit spread a model's
 * normalized inputs have, where tensor_fill_random's [-1, 1) has half of
 * it. Where an activation bends matters to a wrong rewrite: silu falls
 * below -1.28 and hard swish on [-3, -1.5], so on [-1, 1) both only rise,
 * and an activation moved past a max pool (an export fault found by
 * fuzzing) went unseen there. Wider still costs the check its margin:
 * on [-4, 4) an untrained EfficientNet-B0's outputs grow 5000-fold and
 * ONNX Runtime and Teq's executor already differ by 1.2e-4 on it. */
static void check_input(Tensor *t, uint64_t seed) {
  tensor_fill_random(t, seed);
  float *x = t->data;
  for (int64_t e = 0, n = tensor_numel(t); e < n; e++) x[e] *= 2;
}

/* The check's inputs given with --input, read once before the search so
 * that a wrong name or size fails at once: given[i] for graph input i, or
 * NULL where the check draws it. */
static int read_given_inputs(const Args *a, const Graph *g, Tensor ***given, Diag *d) {
  *given = NULL;
  if (!a->n_inputs) return TEQ_OK;
  int rc = onnx_check_input_specs(a->inputs, a->n_inputs, g, d);
  if (rc) return rc;
  *given = calloc((size_t)g->n_inputs + 1, sizeof **given);
  if (!*given) return diag_error(d, "out of memory reading --input"), TEQ_ERR_NOMEM;
  for (int32_t i = 0; i < g->n_inputs && rc == TEQ_OK; i++) {
    const Node *in = &g->nodes[g->inputs[i]];
    const char *file = onnx_input_spec_file(a->inputs, a->n_inputs, in->name);
    if (file) rc = onnx_read_input_file(file, in, &(*given)[i], d);
  }
  return rc;
}

static void free_given_inputs(Tensor **given, int n) {
  for (int i = 0; given && i < n; i++) tensor_unref(given[i]);
  free(given);
}

/* Both graphs on the same inputs, given (given[i], NULL for none) or
 * seeded random: the largest relative error over the outputs (see
 * exec_relative_error), opaque nodes cut out as cut_opaque says (*n_cut of
 * them). *n_flat counts the float outputs the original computes as one
 * value everywhere (a zero-initialised head, a dead branch): equal there,
 * the models may still differ. */
static int check_end_to_end(const Graph *a0, const Graph *b0, Tensor *const *given, uint64_t seed,
                            double *err, int *n_flat, int *n_cut, Diag *d) {
  if (b0->n_inputs != a0->n_inputs || b0->n_outputs != a0->n_outputs)
    return diag_error(d, "the optimized graph has %d inputs and %d outputs, the original %d and %d",
                      b0->n_inputs, b0->n_outputs, a0->n_inputs, a0->n_outputs);
  Graph *a, *b;
  int rc = cut_both(a0, b0, &a, &b, n_cut, d);
  if (rc != TEQ_OK) return rc;
  int ni = a->n_inputs, no = a->n_outputs;
  Tensor **in = calloc((size_t)ni + 1, sizeof *in);
  Tensor **oa = calloc((size_t)no + 1, sizeof *oa), **ob = calloc((size_t)no + 1, sizeof *ob);
  rc = in && oa && ob ? TEQ_OK : TEQ_ERR_NOMEM;
  for (int i = 0; i < ni && rc == TEQ_OK; i++) {
    const Node *n = &a->nodes[a->inputs[i]];
    /* The model's inputs come first; cut_opaque's stand-ins follow. */
    if (given && i < a0->n_inputs && given[i]) {
      in[i] = tensor_ref(given[i]);
      continue;
    }
    in[i] = tensor_new(n->dtype == DT_I64 ? DT_I64 : DT_F32, &n->out[0]);
    if (!in[i]) rc = TEQ_ERR_NOMEM;
    else if (n->dtype != DT_I64) check_input(in[i], seed + (uint64_t)i);
  }
  if (rc == TEQ_OK) rc = exec_run(a, EXEC_F32, in, oa, d);
  if (rc == TEQ_OK) {
    rc = exec_run(b, EXEC_F32, in, ob, d);
    if (rc) memset(ob, 0, (size_t)no * sizeof *ob);
  } else {
    memset(oa, 0, (size_t)no * sizeof *oa);
  }
  double worst = 0;
  *n_flat = 0;
  for (int o = 0; o < no && rc == TEQ_OK; o++) {
    double e = exec_relative_error(ob[o], oa[o]);
    if (!(e <= worst)) worst = e;
    if (o < a0->n_outputs && oa[o]->dtype == DT_F32 && is_flat(oa[o])) {
      diag_warn(d, "optimize: the original's output '%s' is %g everywhere on the check's "
                   "inputs, so the check shows little about it", a0->output_names[o],
                (double)((const float *)oa[o]->data)[0]);
      ++*n_flat;
    }
  }
  for (int i = 0; in && i < ni; i++) tensor_unref(in[i]);
  for (int o = 0; oa && ob && o < no; o++) {
    if (rc == TEQ_OK || oa[o]) tensor_unref(oa[o]);
    if (rc == TEQ_OK || ob[o]) tensor_unref(ob[o]);
  }
  free(in), free(oa), free(ob);
  graph_free(a);
  graph_free(b);
  if (rc == TEQ_OK) *err = worst;
  return rc;
}

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

typedef struct Report {
  const char *model, *out, *rules_path, *cost_what;
  int n_rules, ops_before, ops_after, folded, fused, residuals;
  int shared; /* concats that took another as their first piece (concat.c) */
  int through_splits; /* split pieces whose add or activation moved (split.c) */
  double cost_before, cost_after, check_err, tolerance;
  int check_flat; /* outputs the check saw as one value everywhere */
  int check_cut;  /* opaque nodes the check cut out (cut_opaque) */
  int src_before[COST__SOURCES], src_after[COST__SOURCES];
  double us_before[COST__SOURCES], us_after[COST__SOURCES]; /* microseconds by source */
  bool checked;
  bool check_file; /* the check read the file written back (else the graphs in memory) */
  int check_given; /* graph inputs the check read from --input files */
  bool kept_original; /* the search's best came out dearer after folding, or slower measured */
  bool gpu_timed;     /* both graphs replayed on the GPU (a GPU cost model) */
  double gpu_ms_before, gpu_ms_after; /* the search's best, before any keeping of the original */
  /* --as-given: the model imported with no fusion, its operators, cost and
   * (on a GPU) time; ops 0 when not asked for. */
  int as_given_ops;
  double as_given_cost, as_given_gpu_ms;
  int merged;         /* duplicate nodes of the model merged before the search */
  PetPostStats post;  /* PET's post-optimization of the whole result (--pet) */
  OnnxImportStats import;
  const OptStats *st;
  const OptRules *rs;
  const OptOptions *opt;
  double min_gain;
} Report;

/* Operators per source of their costs, and the microseconds each source
 * gives: how much of an estimate rests on measurements, and how much is the
 * analytic model's word until a GPU measures it. */
static void print_sources(FILE *f, const int *src, const double *us) {
  const char *sep = "";
  for (int s = 0; s < COST__SOURCES; s++)
    if (src[s])
      fprintf(f, "%s%s %d (%.1f us)", sep, cost_source_name((CostSource)s), src[s], us[s]),
          sep = ", ";
}

static void report_text(const Report *r, FILE *f) {
  const OptStats *st = r->st;
  fprintf(f, "optimize: %s -> %s%s\n", r->model, r->out,
          r->import.n_external ? " (weights beside it in its .data file)" : "");
  fprintf(f, "  %-26s %d directed, from %s\n", "rules", r->n_rules, r->rules_path);
  fprintf(f, "  %-26s %s\n", "cost model", r->cost_what);
  fprintf(f, "  %-26s %d -> %d\n", "operators", r->ops_before, r->ops_after);
  char stats[ONNX_STATS_STR_MAX];
  fprintf(f, "  %-26s %s\n", "import", onnx_import_stats_format(&r->import, stats, sizeof stats));
  if (r->merged)
    fprintf(f, "  %-26s %d nodes that repeated another merged before the search\n",
            "duplicates", r->merged);
  fprintf(f, "  %-26s %.1f -> %.1f us (%+.1f%%)%s\n", "estimated cost", r->cost_before,
          r->cost_after, r->cost_before > 0 ? 100 * (r->cost_after / r->cost_before - 1) : 0.0,
          r->kept_original ? " (the original: nothing cheaper by the margin was found)" : "");
  if (r->gpu_timed)
    fprintf(f, "  %-26s %.4f -> %.4f ms (%+.1f%%)%s\n", "measured on the GPU", r->gpu_ms_before,
            r->gpu_ms_after, 100 * (r->gpu_ms_after / r->gpu_ms_before - 1),
            r->kept_original ? ": not faster by the margin, the original is kept" : "");
  if (r->as_given_ops) {
    fprintf(f, "  %-26s %d operators, %.1f us: %.3fx", "model as given (no fusion)", r->as_given_ops,
            r->as_given_cost, r->cost_after > 0 ? r->as_given_cost / r->cost_after : 0.0);
    if (r->gpu_timed && r->as_given_gpu_ms > 0)
      fprintf(f, "; measured %.4f ms: %.3fx", r->as_given_gpu_ms,
              r->as_given_gpu_ms / (r->kept_original ? r->gpu_ms_before : r->gpu_ms_after));
    fprintf(f, " the optimized model's\n");
  }
  fprintf(f, "  %-26s before: ", "cost sources (operators)");
  print_sources(f, r->src_before, r->us_before);
  fprintf(f, "; after: ");
  print_sources(f, r->src_after, r->us_after);
  fprintf(f, "\n  %-26s %d window%s, %lld graphs expanded, %lld rewrites (%lld of a rule at "
          "all its sites), %lld duplicates, %lld queued, %lld built, %.2f s%s\n", "search",
          st->windows, st->windows == 1 ? "" : "s", (long long)st->explored, (long long)st->generated,
          (long long)st->all_sites, (long long)st->duplicates, (long long)st->kept,
          (long long)st->materialized, st->search_s,
          st->stopped_by_time ? " (stopped by the time limit)" : "");
  if (st->best_at > 0)
    fprintf(f, "  %-26s after %lld graphs expanded, %.2f s\n", "best found", (long long)st->best_at,
            st->best_s);
  fprintf(f, "  %-26s cycle %lld, shapes %lld, Z_p %lld\n", "rewrites rejected",
          (long long)st->rejected_cycle, (long long)st->rejected_shape,
          (long long)st->rejected_zp);
  fprintf(f, "  %-26s %lld checked exactly (%.2f s of the search), %lld too large to check "
          "(proof trusted)\n", "rule instances in Z_p", (long long)st->zp_checked, st->zp_s,
          (long long)st->zp_trusted);
  fprintf(f, "  %-26s %d nodes computed into initializers\n", "weights precomputed", r->folded);
  fprintf(f, "  %-26s %d biases and activations, %d residual adds folded into convolutions; "
          "%d split pieces' adds and activations regrouped; %d concats take another as their "
          "first piece\n", "after the search", r->fused, r->residuals, r->through_splits,
          r->shared);
  if (!r->checked)
    fprintf(f, "  %-26s skipped (--no-check)\n", "end-to-end check");
  if (r->checked)
    fprintf(f, "  %-26s largest relative error %.3g (tolerance %.3g): %s%s; %s%s\n",
            "end-to-end check", r->check_err, r->tolerance,
            r->check_err <= r->tolerance ? "ok" : "FAILED",
            r->check_flat ? ", but some outputs are one value everywhere" : "",
            r->check_file ? "the file written against the original, both as given"
                          : "the graphs in memory (operators Teq does not know, two alike)",
            r->check_given ? "; on the inputs --input gave" : "");
  if (r->checked && r->check_cut)
    fprintf(f, "  %-26s %d operator%s Teq cannot run cut out: inputs compared, outputs fed the "
            "same random values to both\n", "", r->check_cut, r->check_cut == 1 ? "" : "s");
  if (r->opt->pet) {
    int times = 0;
    for (int i = 0; i < st->n_pet_applied; i++) times += st->pet_applied[i].times;
    fprintf(f, "  %-26s %lld subprograms mutated (%lld over %.3g flops or %.3g elements "
            "skipped), %lld mutants corrected (%lld failed), %lld candidates (%lld derived unbuilt), %lld queued, %d "
            "applied, %.2f s\n",
            "PET", (long long)st->pet_subprograms, (long long)st->pet_too_large,
            r->opt->pet_max_flops, r->opt->pet_max_elements, (long long)st->pet_mutants,
            (long long)st->pet_failed, (long long)st->pet_built, (long long)st->pet_derived, (long long)st->pet_kept, times,
            st->pet_s);
    fprintf(f, "  %-26s reshapes/transposes in the candidates built: %lld moved past "
            "element-wise operators, %lld inverse groups removed, %lld pairs fused, %lld "
            "splits into heads hoisted; on the result: %lld moved, %lld removed, %lld fused, "
            "%lld hoisted\n", "PET post-optimization",
            (long long)st->pet_post_moved,
            (long long)st->pet_post_removed, (long long)st->pet_post_fused,
            (long long)st->pet_post_hoisted, (long long)r->post.moved,
            (long long)r->post.removed, (long long)r->post.fused, (long long)r->post.hoisted);
    for (int i = 0; i < st->n_pet_applied; i++) {
      const OptPetApplied *p = &st->pet_applied[i];
      fprintf(f, "    %3dx  %s\n          correction: %s\n          cost %+.2f us, tests: "
              "t = %d, a wrong box passes with probability <= 2^%.1f\n", p->times, p->desc,
              p->correction, p->cost_delta_us, p->trials, p->log2_bound);
    }
  } else {
    fprintf(f, "  %-26s off (--no-pet)\n", "PET");
  }
  int any = 0;
  for (int i = 0; i < st->n_rules; i++) any += st->applied[i];
  fprintf(f, "  rules applied (%d rewrites):\n", any);
  for (int i = 0; i < st->n_rules; i++)
    if (st->applied[i]) {
      char *text = opt_rules_text(r->rs, i);
      fprintf(f, "    %3dx  #%lld  %s\n", st->applied[i], (long long)opt_rules_id(r->rs, i),
              text ? text : "");
      free(text);
    }
}

static int report_json(const Report *r, const char *path, Diag *d) {
  FILE *f = fopen(path, "w");
  if (!f) return diag_error(d, "%s: cannot write: %s", path, strerror(errno)), TEQ_ERR_IO;
  const OptStats *st = r->st;
  fprintf(f, "{\n  \"model\": ");
  json_string(f, r->model);
  fprintf(f, ",\n  \"output\": ");
  json_string(f, r->out);
  fprintf(f, ",\n  \"external_weights\": %d", r->import.n_external);
  const OnnxImportStats *im = &r->import;
  fprintf(f, ",\n  \"import\": {\"nodes\": %d, \"folded\": %d, \"noops_removed\": %d, "
          "\"pads_folded\": %d, \"batchnorms_folded\": %d, \"scales_folded\": %d, "
          "\"layer_norms_fused\": %d, \"gelus_fused\": %d, \"hard_gates_fused\": %d, "
          "\"swishes_fused\": %d, \"biases_fused\": %d, \"residuals_fused\": %d, "
          "\"activations_fused\": %d, \"pools_fused\": %d}",
          im->n_nodes, im->n_folded, im->n_noops_removed, im->n_pads_folded,
          im->n_batchnorm_folded, im->n_scales_folded, im->n_layer_norms_fused,
          im->n_gelus_fused, im->n_hard_gates_fused, im->n_swishes_fused, im->n_biases_fused,
          im->n_residuals_fused,
          im->n_activations_fused, im->n_pools_fused);
  fprintf(f, ",\n  \"rules\": ");
  json_string(f, r->rules_path);
  fprintf(f, ",\n  \"directed_rules\": %d,\n  \"cost_model\": ", r->n_rules);
  json_string(f, r->cost_what);
  fprintf(f, ",\n  \"operators_before\": %d,\n  \"operators_after\": %d,\n", r->ops_before,
          r->ops_after);
  fprintf(f, "  \"cost_before_us\": %.6g,\n  \"cost_after_us\": %.6g,\n", r->cost_before,
          r->cost_after);
  fprintf(f, "  \"kept_original\": %s,\n  \"min_gain\": %.6g,\n",
          r->kept_original ? "true" : "false", r->min_gain);
  if (r->gpu_timed)
    fprintf(f, "  \"gpu_ms\": {\"before\": %.6g, \"after\": %.6g},\n", r->gpu_ms_before,
            r->gpu_ms_after);
  else
    fprintf(f, "  \"gpu_ms\": null,\n");
  if (r->as_given_ops) {
    fprintf(f, "  \"as_given\": {\"operators\": %d, \"cost_us\": %.6g, \"gpu_ms\": ",
            r->as_given_ops, r->as_given_cost);
    if (r->gpu_timed && r->as_given_gpu_ms > 0) fprintf(f, "%.6g},\n", r->as_given_gpu_ms);
    else fprintf(f, "null},\n");
  } else {
    fprintf(f, "  \"as_given\": null,\n");
  }
  fprintf(f, "  \"duplicates_merged\": %d,\n", r->merged);
  for (int w = 0; w < 2; w++) {
    const int *src = w ? r->src_after : r->src_before;
    fprintf(f, "  \"cost_sources_%s\": {", w ? "after" : "before");
    for (int s = 0; s < COST__SOURCES; s++)
      fprintf(f, "%s\"%s\": %d", s ? ", " : "", cost_source_name((CostSource)s), src[s]);
    fprintf(f, "},\n");
    const double *us = w ? r->us_after : r->us_before;
    fprintf(f, "  \"cost_us_by_source_%s\": {", w ? "after" : "before");
    for (int s = 0; s < COST__SOURCES; s++)
      fprintf(f, "%s\"%s\": %.6g", s ? ", " : "", cost_source_name((CostSource)s), us[s]);
    fprintf(f, "},\n");
  }
  fprintf(f, "  \"search\": {\"windows\": %d, \"expanded\": %lld, \"built\": %lld, "
          "\"all_sites\": %lld, \"duplicates\": %lld, \"queued\": %lld, \"materialized\": %lld, "
          "\"seconds\": %.4f, \"stopped_by_time\": %s, \"best_after_expanded\": %lld, "
          "\"best_after_seconds\": %.4f},\n",
          st->windows, (long long)st->explored, (long long)st->generated, (long long)st->all_sites,
          (long long)st->duplicates, (long long)st->kept, (long long)st->materialized,
          st->search_s, st->stopped_by_time ? "true" : "false", (long long)st->best_at,
          st->best_s);
  fprintf(f, "  \"rejected\": {\"cycle\": %lld, \"shape\": %lld, \"zp\": %lld},\n",
          (long long)st->rejected_cycle, (long long)st->rejected_shape, (long long)st->rejected_zp);
  fprintf(f, "  \"zp_instances\": {\"checked\": %lld, \"trusted\": %lld, \"seconds\": %.4f},\n",
          (long long)st->zp_checked, (long long)st->zp_trusted, st->zp_s);
  fprintf(f, "  \"weights_folded\": %d,\n  \"bias_act_fused\": %d,\n  \"residuals_fused\": %d,\n"
          "  \"split_pieces_regrouped\": %d,\n  \"concats_sharing_pieces\": %d,\n", r->folded,
          r->fused, r->residuals, r->through_splits, r->shared);
  if (r->checked)
    fprintf(f, "  \"check\": {\"max_relative_error\": %.6g, \"tolerance\": %.6g, \"ok\": %s, "
            "\"flat_outputs\": %d, \"opaque_cut\": %d, \"of\": \"%s\", \"given_inputs\": %d},\n",
            r->check_err, r->tolerance, r->check_err <= r->tolerance ? "true" : "false",
            r->check_flat, r->check_cut, r->check_file ? "file" : "memory", r->check_given);
  else
    fprintf(f, "  \"check\": null,\n");
  if (r->opt->pet) {
    fprintf(f, "  \"pet\": {\"subprograms\": %lld, \"too_large\": %lld, \"max_flops\": %.6g, "
            "\"max_elements\": %.6g, "
            "\"mutants\": %lld, \"failed\": %lld, \"built\": %lld, \"derived\": %lld, "
            "\"kept\": %lld, "
            "\"seconds\": %.4f, \"post\": {\"candidates\": {\"moved\": %lld, \"removed\": "
            "%lld, \"fused\": %lld, \"hoisted\": %lld}, \"result\": {\"moved\": %lld, "
            "\"removed\": %lld, \"fused\": %lld, \"hoisted\": %lld}}, \"applied\": [",
            (long long)st->pet_subprograms,
            (long long)st->pet_too_large, r->opt->pet_max_flops, r->opt->pet_max_elements,
            (long long)st->pet_mutants, (long long)st->pet_failed, (long long)st->pet_built, (long long)st->pet_derived,
            (long long)st->pet_kept, st->pet_s, (long long)st->pet_post_moved, (long long)st->pet_post_removed,
            (long long)st->pet_post_fused, (long long)st->pet_post_hoisted, (long long)r->post.moved,
            (long long)r->post.removed, (long long)r->post.fused, (long long)r->post.hoisted);
    for (int i = 0; i < st->n_pet_applied; i++) {
      const OptPetApplied *p = &st->pet_applied[i];
      fprintf(f, "%s\n    {\"times\": %d, \"mutation\": ", i ? "," : "", p->times);
      json_string(f, p->desc);
      fprintf(f, ", \"correction\": ");
      json_string(f, p->correction);
      fprintf(f, ", \"cost_delta_us\": %.6g, \"trials\": %d, \"log2_bound\": %.4g}",
              isnan(p->cost_delta_us) ? 0.0 : p->cost_delta_us, p->trials, p->log2_bound);
    }
    fprintf(f, "%s]},\n", st->n_pet_applied ? "\n  " : "");
  } else {
    fprintf(f, "  \"pet\": null,\n");
  }
  fprintf(f, "  \"applied\": [");
  const char *sep = "";
  for (int i = 0; i < st->n_rules; i++)
    if (st->applied[i]) {
      fprintf(f, "%s\n    {\"rule_id\": %lld, \"times\": %d, \"text\": ", sep,
              (long long)opt_rules_id(r->rs, i), st->applied[i]);
      char *text = opt_rules_text(r->rs, i);
      json_string(f, text ? text : "");
      free(text);
      fputc('}', f);
      sep = ",";
    }
  fprintf(f, "\n  ]\n}\n");
  if (fclose(f)) return diag_error(d, "%s: cannot write", path), TEQ_ERR_IO;
  return TEQ_OK;
}

static char *default_output(const char *model) {
  size_t n = strlen(model);
  char *out = malloc(n + 16);
  if (!out) return NULL;
  memcpy(out, model, n + 1);
  if (n > 5 && !strcmp(out + n - 5, ".onnx")) out[n - 5] = 0;
  strcat(out, ".opt.onnx");
  return out;
}

/* The search and its checks allocate and free tensors of a few megabytes
 * over and over. glibc hands such blocks back to the kernel (mapped ones
 * above an adaptive threshold, the heap's top beyond 128 KB), and the next
 * allocation faults fresh zeroed pages in: a third of NasRNN's search time
 * on a virtual machine. They stay in the heap instead; blocks over 64 MB,
 * a model's largest weights, are still mapped and returned.
 *
 * The heap's first HEAP_HUGE bytes are also asked to be backed by
 * transparent huge pages, one fault per 2 MB instead of one per 4 KB: the
 * rules' small graphs (tens of megabytes of nodes) and the search's
 * candidates are faulted in page by page otherwise, which on a virtual
 * machine cost NasRNN's whole run 2.4 -> 1.6-1.9 s and BERT's 3.6 -> 2.0 s
 * for 2-5% more peak memory. The heap is grown once by that much (address
 * space only; nothing is touched) and advised; the trim threshold keeps it.
 * Sanitizer builds have their own allocator and skip this. */
#define HEAP_HUGE ((size_t)512 << 20)

static void prepare_heap(void) {
#ifdef __GLIBC__
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#if !defined(__SANITIZE_ADDRESS__)
  mallopt(M_MMAP_THRESHOLD, 1 << 30); /* so that the block below grows the heap */
  char *start = sbrk(0);
  void *block = malloc(HEAP_HUGE);
  char *end = sbrk(0);
  uintptr_t huge = (uintptr_t)2 << 20, first = ((uintptr_t)start + huge - 1) & ~(huge - 1);
  if (block && end > (char *)first)
    madvise((void *)first, (size_t)(end - (char *)first), MADV_HUGEPAGE);
  free(block);
#endif
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
#endif
}

/* Whether after saves more than --min-gain of before (costs or times):
 * less is within their noise, and the original stays. */
static bool saves_enough(double before, double after, double min_gain) {
  return after < before * (1 - min_gain);
}

/* With a GPU, the estimate is checked where it counts: the original and
 * the search's best replayed on the device, and the best kept only if it
 * runs faster by --min-gain. Summed per-operator measurements can promise what the
 * whole graph does not deliver (VGG-19 on the H100, 2026-11-27: 13% faster
 * estimated, 1.2% slower measured). Each graph is planned once and timed
 * twice, in turn, so that drift in the device's clocks touches both; the
 * better of its two medians of 50 replays counts. A graph the GPU cannot
 * run (an opaque operator) is not timed, with a warning, and the best is
 * kept. Returns whether to keep the best. */
static bool gpu_verdict(CudaDevice *dev, const Graph *g, const Graph *best, const Graph *given,
                        Report *r, Diag *d) {
  CudaPlan *plan[3] = {NULL, NULL, NULL};
  double ms[3] = {0, 0, 0};
  int n = given ? 3 : 2; /* the model as given (--as-given) is timed in turn too */
  Diag gd;
  diag_init(&gd);
  int rc = cuda_plan_new(dev, g, &plan[0], &gd);
  if (rc == TEQ_OK) rc = cuda_plan_new(dev, best, &plan[1], &gd);
  if (rc == TEQ_OK && given) rc = cuda_plan_new(dev, given, &plan[2], &gd);
  for (int k = 0; k < 2 * n && rc == TEQ_OK; k++) {
    CudaTiming t;
    rc = cuda_plan_time(plan[k % n], 10, 50, &t, &gd);
    if (rc == TEQ_OK && (k < n || t.median_ms < ms[k % n])) ms[k % n] = t.median_ms;
  }
  for (int k = 0; k < 3; k++) cuda_plan_free(plan[k]);
  if (rc == TEQ_OK) {
    r->gpu_timed = true;
    r->gpu_ms_before = ms[0], r->gpu_ms_after = ms[1], r->as_given_gpu_ms = ms[2];
  } else {
    diag_warn(d, "optimize: not timed on the GPU: %s", diag_last(&gd));
  }
  diag_fini(&gd);
  return rc != TEQ_OK || saves_enough(ms[0], ms[1], r->min_gain);
}

/* How the model is imported: the search and the check work around the
 * forms of operators Teq keeps opaque. */
static OnnxImportOptions import_options(const Args *a) {
  OnnxImportOptions io = ONNX_IMPORT_DEFAULTS;
  io.batch = a->batch;
  io.dims = a->dims;
  io.n_dims = a->n_dims;
  io.opaque_unsupported_forms = true;
  return io;
}

/* --as-given: the model imported again with every fusion off and priced
 * by the same cost model. Speedups measured from the default import leave
 * out what the import fused (a relu into its convolution is what most of
 * TASO's and Tensat's gain on VGG-19 is); this is the comparable baseline. */
static int read_as_given(const Args *a, const char *path, Graph **out, Diag *d) {
  OnnxImportOptions io = import_options(a);
  onnx_import_as_given(&io);
  OnnxImportStats stats;
  int rc = onnx_import_file(path, &io, out, &stats, d);
  if (rc == TEQ_OK) rc = require_shapes(*out, path, d);
  return rc;
}

/* path read back for the end-to-end check, as given. Its warnings (the
 * symbolic dimensions set) were said when the original was read first; a
 * file optimize wrote (written) has no symbolic dimension left to set. */
static int read_for_check(const Args *a, const char *path, bool written, Graph **out, Diag *d) {
  Args plain = *a;
  if (written) plain.n_dims = 0;
  Diag quiet;
  diag_init(&quiet);
  int rc = read_as_given(&plain, path, out, &quiet);
  if (rc) diag_error(d, "optimize: reading %s for the check: %s", path, diag_last(&quiet));
  diag_fini(&quiet);
  return rc;
}

static int import_as_given(const Args *a, CostModel *cm, Graph **given, Report *r, Diag *d) {
  int rc = read_as_given(a, a->model, given, d);
  if (rc == TEQ_OK) rc = opt_graph_cost_run(cm, *given, &r->as_given_cost, NULL, NULL, d);
  if (rc == TEQ_OK) r->as_given_ops = graph_count_ops(*given);
  return rc;
}

/* The original in place of the search's best: a dearer or slower model is
 * never the answer, and the report lists no rewrite it does not hold. */
static int keep_original(CostModel *cm, const Graph *g, Graph **best, OptStats *st, Report *r,
                         Diag *d) {
  Graph *orig = graph_copy(g);
  if (!orig) return TEQ_ERR_NOMEM;
  graph_free(*best);
  *best = orig;
  r->kept_original = true;
  r->folded = r->fused = r->residuals = r->shared = r->through_splits = 0;
  r->post = (PetPostStats){0};
  memset(st->applied, 0, (size_t)st->n_rules * sizeof *st->applied);
  st->n_pet_applied = 0;
  return opt_graph_cost_run(cm, *best, &r->cost_after, r->src_after, r->us_after, d);
}

/* The search's best as it will be exported (opt_finish): weights computed
 * into initializers, biases and activations folded into convolutions, and
 * its cost. The search post-optimized each candidate it built with a
 * mutant, one window at a time; layouts that meet across a window's seam,
 * or that rule rewrites left, are taken up here (pet_post_optimize), but
 * only where that is cheaper: moving a transpose past an element-wise
 * operator pays only when it meets its inverse, and a move that meets
 * nothing costs. */
static int finish_best(CostModel *cm, Graph **best, bool pet, Report *r, Diag *d) {
  OptFinish f = {0};
  int rc = opt_finish(cm, best, pet, NULL, &f, d);
  if (rc) return rc;
  r->folded = f.folded, r->fused = f.fused, r->residuals = f.residuals;
  r->shared = f.shared, r->through_splits = f.through_splits;
  r->post = f.posted ? f.post : (PetPostStats){0};
  r->cost_after = f.us;
  memcpy(r->src_after, f.src, sizeof f.src);
  memcpy(r->us_after, f.us_by_source, sizeof f.us_by_source);
  return TEQ_OK;
}

int main(int argc, char **argv) {
  prepare_heap();
  Args a;
  int prc = parse_args(argc, argv, &a);
  if (prc) return prc == 1 ? 0 : prc;
  Diag d;
  diag_init(&d);
  d.echo = a.opt.quiet ? NULL : stderr;
  Graph *g = NULL, *best = NULL;
  OptRules *rs = NULL;
  CostModel *cm = NULL;
  CudaDevice *dev = NULL;
  FILE *record = NULL;
  char *out_default = NULL;
  OptStats st = {0};
  Report r = {.model = a.model, .rules_path = a.rules, .tolerance = a.tolerance, .st = &st,
              .min_gain = a.min_gain,
              .opt = &a.opt};
  char what[512] = "";
  Tensor **check_in = NULL; /* --input's tensors, per graph input of g */
  int n_check_in = 0;
  int rc = opt_rules_load(a.rules, a.unproved, &rs, &d);
  if (rc == TEQ_OK) {
    OnnxImportOptions io = import_options(&a);
    rc = onnx_import_file(a.model, &io, &g, &r.import, &d);
    if (rc == TEQ_OK) rc = require_shapes(g, a.model, &d);
    if (rc == TEQ_OK && a.check) {
      rc = read_given_inputs(&a, g, &check_in, &d);
      n_check_in = check_in ? g->n_inputs : 0;
      r.check_given = a.n_inputs;
    }
    /* what could not be written is said before the search, not after */
    int opset;
    if (rc == TEQ_OK) rc = onnx_export_opset(g, a.model, r.import.opset, &opset, &d);
  }
  if (rc == TEQ_OK) rc = open_cost_model(&a, &cm, &dev, what, sizeof what, &d);
  if (rc == TEQ_OK && a.record) {
    record = fopen(a.record, "w");
    if (!record) rc = diag_error(&d, "%s: cannot write: %s", a.record, strerror(errno));
    else cost_model_record(cm, record);
  }
  if (rc == TEQ_OK) {
    r.cost_what = what;
    r.rs = rs;
    r.n_rules = opt_rules_count(rs);
    r.ops_before = graph_count_ops(g);
    if (!a.opt.quiet)
      fprintf(stderr, "optimize: %s: %d operators, %d directed rules; searching\n", a.model,
              r.ops_before, r.n_rules);
    rc = opt_graph_cost_run(cm, g, &r.cost_before, r.src_before, r.us_before, &d);
  }
  Graph *given = NULL;
  if (rc == TEQ_OK && a.as_given) rc = import_as_given(&a, cm, &given, &r, &d);
  Graph *plain = NULL;
  if (rc == TEQ_OK) rc = (plain = graph_copy(g)) ? TEQ_OK : TEQ_ERR_NOMEM;
  if (rc == TEQ_OK) graph_canonicalize(plain); /* rules use one spelling of each operator */
  if (rc == TEQ_OK && (r.merged = graph_merge_duplicates(plain)) < 0) rc = r.merged;
  if (rc == TEQ_OK) rc = opt_split_bias(plain, NULL, &d);
  /* Equal biases spread at one shape become one constant here, once. Left
   * as two, every graph the search builds compared them byte by byte
   * (VGG-19's zero biases: megabytes each) before merging them. */
  if (rc == TEQ_OK && graph_merge_duplicates(plain) < 0) rc = TEQ_ERR_NOMEM;
  if (rc == TEQ_OK) rc = opt_search(plain, rs, cm, &a.opt, &best, &st, &d);
  graph_free(plain);
  if (rc == TEQ_OK) rc = finish_best(cm, &best, a.opt.pet, &r, &d);
  /* The search prices graphs as they will be exported, but folding
   * weights and biases afterwards can still land above the original; and a
   * saving within the costs' noise (--min-gain) is no reason to rewrite. */
  if (rc == TEQ_OK && !saves_enough(r.cost_before, r.cost_after, a.min_gain))
    rc = keep_original(cm, g, &best, &st, &r, &d);
  if (rc == TEQ_OK && dev && !r.kept_original && !gpu_verdict(dev, g, best, given, &r, &d))
    rc = keep_original(cm, g, &best, &st, &r, &d);
  if (rc == TEQ_OK) rc = graph_check(best, &d);
  if (rc == TEQ_OK) {
    r.ops_after = graph_count_ops(best);
    r.out = a.out ? a.out : (out_default = default_output(a.model));
    if (!r.out) rc = TEQ_ERR_NOMEM;
  }
  /* Weights the model kept beside it stay beside the optimized model. */
  OnnxExportOptions eo = {.external = r.import.n_external > 0, .opset = r.import.opset};
  if (rc == TEQ_OK) rc = onnx_export_file(best, r.out, &eo, &d);
  if (rc == TEQ_OK && a.dump) graph_dump(best, stdout);
  /* The check reads back the file written and the original, both as given
   * (every import fusion off), so that a fault in an import's fusion, the
   * search or the export shows: the graphs in memory once agreed while the
   * file computed a hard swish after a conv's pool instead of before it.
   * The graphs in memory go first: a model's weights are held twice at most.
   * Operators Teq does not know are cut out of both and paired by their
   * NodeProtos less the names the export rewrites; a model holding two
   * alike but for those names cannot be paired so, and is checked in
   * memory, as the search left it. */
  r.check_file = opaque_pairable(g);
  if (rc == TEQ_OK && a.check && !r.check_file) {
    if (!a.opt.quiet) fprintf(stderr, "optimize: checking both graphs on the CPU executor\n");
    rc = check_end_to_end(g, best, check_in, a.opt.seed, &r.check_err, &r.check_flat,
                          &r.check_cut, &d);
    r.checked = rc == TEQ_OK;
  } else if (rc == TEQ_OK && a.check) {
    if (!a.opt.quiet)
      fprintf(stderr, "optimize: checking %s against the original, both as given, on the CPU "
                      "executor\n", r.out);
    graph_free(best), graph_free(g);
    best = g = NULL;
    Graph *orig = given, *written = NULL;
    given = NULL;
    if (!orig) rc = read_for_check(&a, a.model, false, &orig, &d);
    if (rc == TEQ_OK) rc = read_for_check(&a, r.out, true, &written, &d);
    if (rc == TEQ_OK)
      rc = check_end_to_end(orig, written, check_in, a.opt.seed, &r.check_err, &r.check_flat,
                            &r.check_cut, &d);
    graph_free(orig), graph_free(written);
    r.checked = rc == TEQ_OK;
  }
  if (rc == TEQ_OK) {
    report_text(&r, stdout);
    if (a.json) rc = report_json(&r, a.json, &d);
  }
  int status = rc ? teq_exit_status(rc) : 0;
  if (rc == TEQ_OK && r.checked && !(r.check_err <= a.tolerance)) {
    diag_error(&d, "optimize: the optimized model differs from the original: largest relative "
                   "error %.3g > tolerance %.3g", r.check_err, a.tolerance);
    status = 1;
  }
  if (rc && !d.n_errors) diag_error(&d, "optimize: %s", teq_strerror(rc));
  diag_flush(&d, stderr); /* the errors, and warnings not echoed as they came (--quiet) */
  diag_fini(&d);
  if (record) fclose(record);
  opt_stats_fini(&st);
  free(out_default);
  free_given_inputs(check_in, n_check_in);
  graph_free(g);
  graph_free(given);
  graph_free(best);
  opt_rules_free(rs);
  cost_model_free(cm);
  if (dev) cuda_device_close(dev);
  return status;
}
