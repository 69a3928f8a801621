/* pet_ops.c: bench-pet-ops, PET's operator benchmark (OSDI'21, Table 3)
 * through Teq's PET: each case's every corrected mutant against its
 * original, side by side.
 *
 * The cases are PET's: a conv of Inception-v3, a dilated conv of CSRNet,
 * the two 1x1 convs on one input of Inception-v3 that PET merges into a
 * grouped conv (Fig. 10a), and BERT's three projections of one input. Each
 * is built as PET's generator sees a subprogram (its weights are inputs, so
 * that a mutant holds for any weights), mutated (pet_mutate), and every
 * mutant corrected (pet_correct). Then the real, seeded weights are bound as
 * constants, the layouts post-optimized (pet_post_optimize) and the weight-
 * only operators folded (opt_fold_weights), as optimize exports them. Each
 * resulting program is
 *   - estimated by the cost model optimize uses here (measured on the GPU
 *     when there is one, else the cost table, analytic beyond it),
 *   - timed on the CPU executor (median of --repeat runs),
 *   - timed on the GPU when there is one (whole program as one CUDA graph
 *     replay, median of --gpu-repeat runs between CUDA events),
 *   - and compared with the original in float32 on the same input.
 * Only ratios measured in one run mean anything; absolute times only on a
 * GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "optimize/optimize.h"
#include "optimize/pet/pet.h"
#include "runtime/cuda.h"
#include "runtime/exec.h"

#ifndef TEQ_COST_TABLE
#define TEQ_COST_TABLE "tools/profiles/h100.tsv"
#endif

enum { MAX_WEIGHTS = 4 };

typedef struct Case {
  const char *name, *source;
  Graph *sub;                   /* weights as inputs 1.. */
  int n_weights;
  Tensor *weights[MAX_WEIGHTS];
} Case;

typedef struct Options {
  const char *cases, *cost_table;
  int repeat, gpu_repeat, mutants, depth;
} Options;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static uint64_t draw_next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 11;
}

/* Uniform in [-scale, scale), from seed alone. */
static Tensor *random_tensor(Shape s, double scale, uint64_t seed) {
  Tensor *t = tensor_new(DT_F32, &s);
  if (!t) return NULL;
  float *p = t->data;
  for (int64_t i = 0; i < tensor_numel(t); i++)
    p[i] = (float)(scale * ((double)draw_next(&seed) / 4503599627370496.0 - 1.0));
  return t;
}

static int conv_node(Graph *g, TensorRef x, TensorRef w, int pad, int dil, Diag *d) {
  Params p;
  params_default(OP_CONV2D, &p);
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), (int64_t[]){pad, pad, pad, pad}, 4);
  param_set_ints(&p, param_index(OP_CONV2D, "dilation"), (int64_t[]){dil, dil}, 2);
  return graph_add_node(g, OP_CONV2D, (TensorRef[]){x, w}, 2, 1, &p, NULL, d);
}

/* The case's subprogram: input x, then weight inputs of shapes ws, each
 * read by a conv (pad, dilation) or, for 2-d shapes, a matmul. */
static int build_case(Case *c, Shape xs, const Shape *ws, int n, int pad, int dil, Diag *d) {
  Graph *g = graph_new();
  if (!g) return TEQ_ERR_NOMEM;
  int rc = graph_add_input(g, "x", &xs, DT_F32, d);
  TensorRef x = {rc, 0};
  for (int i = 0; i < n && rc >= 0; i++) {
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    rc = graph_add_input(g, name, &ws[i], DT_F32, d);
    if (rc < 0) break;
    TensorRef w = {rc, 0};
    rc = ws[i].ndim == 4 ? conv_node(g, x, w, pad, dil, d)
                         : graph_add_node(g, OP_MATMUL, (TensorRef[]){x, w}, 2, 1, NULL, NULL, d);
    if (rc >= 0) rc = graph_add_output(g, (TensorRef){rc, 0}, NULL, d);
    int64_t fan_in = shape_numel(&ws[i]) / ws[i].d[ws[i].ndim == 4 ? 0 : 1];
    c->weights[i] = random_tensor(ws[i], 1.0 / sqrt((double)fan_in), 100 + (uint64_t)i);
    if (!c->weights[i]) rc = TEQ_ERR_NOMEM;
  }
  c->n_weights = n, c->sub = g;
  return rc < 0 ? rc : TEQ_OK;
}

/* A program of the subprogram's inputs with the weights bound as constants:
 * what optimize would splice into the model. */
static int bind_weights(const Case *c, const Graph *m, Graph **out, Diag *d) {
  Graph *g = graph_new();
  int32_t *order = malloc(((size_t)m->n_nodes + 1) * sizeof *order);
  int32_t *map = malloc(((size_t)m->n_nodes + 1) * sizeof *map);
  int rc = g && order && map ? graph_topo_order(m, order) : TEQ_ERR_NOMEM;
  for (int i = 0; i < m->n_inputs && rc == TEQ_OK; i++) {
    const Node *x = &m->nodes[m->inputs[i]];
    int id = i == 0 ? graph_add_input(g, x->name, &x->out[0], x->dtype, d)
                    : graph_add_const(g, x->name, tensor_ref(c->weights[i - 1]), d);
    rc = id < 0 ? id : TEQ_OK;
    map[m->inputs[i]] = id;
  }
  for (int k = 0; k < m->n_nodes && rc == TEQ_OK; k++) {
    const Node *x = &m->nodes[order[k]];
    if (x->kind == OP_INPUT) continue;
    TensorRef *in = malloc(((size_t)x->n_in + 1) * sizeof *in);
    if (!in) {
      rc = TEQ_ERR_NOMEM;
      break;
    }
    for (int i = 0; i < x->n_in; i++) in[i] = (TensorRef){map[x->in[i].node], x->in[i].out};
    int id = x->kind == OP_CONST ? graph_add_const(g, x->name, tensor_ref(x->value), d)
                                 : graph_add_node(g, x->kind, in, x->n_in, x->n_out, &x->params,
                                                  x->name, d);
    free(in);
    rc = id < 0 ? id : TEQ_OK;
    map[order[k]] = id;
  }
  for (int j = 0; j < m->n_outputs && rc == TEQ_OK; j++) {
    TensorRef r = m->outputs[j];
    int id = graph_add_output(g, (TensorRef){map[r.node], r.out}, NULL, d);
    rc = id < 0 ? id : TEQ_OK;
  }
  free(order), free(map);
  if (rc == TEQ_OK) rc = pet_post_optimize(&g, NULL, d);
  if (rc == TEQ_OK) rc = opt_fold_weights(g, NULL, d);
  if (rc) graph_free(g);
  else *out = g;
  return rc;
}

/* One program's figures. */
typedef struct Row {
  char what[PET_MUTANT_DESC_MAX], correction[96];
  int ops;
  double est_us, cpu_ms, gpu_us, err;
} Row;

static int count_ops(const Graph *g) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += !(op_def(g->nodes[i].kind)->flags & OPF_SOURCE);
  return n;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int measure(const Graph *g, const Graph *orig, Tensor *x, CostModel *cm, CudaDevice *dev,
                   const Options *o, Row *r, Diag *d) {
  r->ops = count_ops(g);
  int rc = opt_graph_cost(cm, g, &r->est_us, NULL, d);
  int no = g->n_outputs;
  Tensor **got = calloc((size_t)no, sizeof *got), **want = calloc((size_t)no, sizeof *want);
  double *t = calloc((size_t)o->repeat, sizeof *t);
  if (!got || !want || !t) rc = TEQ_ERR_NOMEM;
  for (int k = -1; k < o->repeat && rc == TEQ_OK; k++) { /* k = -1: warm-up, untimed */
    for (int j = 0; j < no; j++) tensor_unref(got[j]), got[j] = NULL;
    double t0 = now_ms();
    rc = exec_run(g, EXEC_F32, &x, got, d);
    if (k >= 0) t[k] = now_ms() - t0;
  }
  if (rc == TEQ_OK) {
    qsort(t, (size_t)o->repeat, sizeof *t, compare_doubles);
    r->cpu_ms = t[o->repeat / 2];
    rc = exec_run(orig, EXEC_F32, &x, want, d);
  }
  r->err = 0;
  for (int j = 0; j < no && rc == TEQ_OK; j++) r->err = fmax(r->err, exec_relative_error(got[j], want[j]));
  r->gpu_us = NAN;
  if (rc == TEQ_OK && dev) {
    CudaPlan *plan = NULL;
    CudaTiming ct;
    rc = cuda_plan_new(dev, g, &plan, d); /* times on random inputs: a conv's speed does not
                                              depend on the values */
    if (rc == TEQ_OK) rc = cuda_plan_time(plan, 20, o->gpu_repeat, &ct, d);
    if (rc == TEQ_OK) r->gpu_us = 1e3 * ct.median_ms;
    cuda_plan_free(plan);
  }
  for (int j = 0; j < no; j++) tensor_unref(got ? got[j] : NULL), tensor_unref(want ? want[j] : NULL);
  free(got), free(want), free(t);
  return rc;
}

static void regions_summary(const PetRegions *rg, char *buf, size_t size) {
  int64_t elems = pet_regions_elements(rg);
  if (rg->n == 0) snprintf(buf, size, "none (exact)");
  else snprintf(buf, size, "%d region%s, %lld elements", rg->n, rg->n == 1 ? "" : "s",
                (long long)elems);
}

static void print_row(const Row *r, const Row *base) {
  char gpu[32] = "-", ratio[32] = "-";
  if (!isnan(r->gpu_us)) {
    snprintf(gpu, sizeof gpu, "%.1f", r->gpu_us);
    snprintf(ratio, sizeof ratio, "%.2f", base->gpu_us / r->gpu_us);
  }
  printf("| %s | %s | %d | %.1f | %.2f | %.2f | %.2f | %s | %s | %.1e |\n", r->what, r->correction,
         r->ops, r->est_us, base->est_us / r->est_us, r->cpu_ms, base->cpu_ms / r->cpu_ms, gpu,
         ratio, r->err);
}

static int run_case(Case *c, CostModel *cm, CudaDevice *dev, const Options *o, Diag *d) {
  const Shape *xs = graph_shape(c->sub, (TensorRef){c->sub->inputs[0], 0});
  Tensor *x = random_tensor(*xs, 1.0, 7);
  Graph *orig = NULL;
  PetMutant *mut = NULL;
  int n_mut = 0;
  Row base = {.what = "original", .correction = "-"};
  int rc = x ? bind_weights(c, c->sub, &orig, d) : TEQ_ERR_NOMEM;
  double t0 = now_ms();
  PetMutateOptions mo = {.depth = o->depth, .max_mutants = o->mutants, .seed = 1};
  if (rc == TEQ_OK) rc = pet_mutate(c->sub, &mo, &mut, &n_mut, d);
  double gen_s = (now_ms() - t0) / 1e3;
  if (rc == TEQ_OK) rc = measure(orig, orig, x, cm, dev, o, &base, d);
  if (rc == TEQ_OK) {
    printf("\n### %s (%s): %d mutants in %.1f s\n\n", c->name, c->source, n_mut, gen_s);
    printf("| program | correction | ops | est. us | est. speedup | CPU ms | CPU speedup | GPU us "
           "| GPU speedup | max rel diff |\n|---|---|---|---|---|---|---|---|---|---|\n");
    print_row(&base, &base);
  }
  for (int k = 0; k < n_mut && rc == TEQ_OK; k++) {
    Graph *fixed = NULL, *prog = NULL;
    PetRegions rg = {0};
    Row r = {0};
    snprintf(r.what, sizeof r.what, "%s", mut[k].desc);
    rc = pet_correct(c->sub, mut[k].graph, &mut[k].report, &fixed, &rg, d);
    if (rc == TEQ_ERR_UNSUPPORTED) { /* a correction Teq cannot build: say so, go on */
      printf("| %s | cannot correct: %s | | | | | | | | |\n", r.what, diag_last(d));
      rc = TEQ_OK;
      continue;
    }
    regions_summary(&rg, r.correction, sizeof r.correction);
    if (rc == TEQ_OK) rc = bind_weights(c, fixed, &prog, d);
    if (rc == TEQ_OK) rc = measure(prog, orig, x, cm, dev, o, &r, d);
    if (rc == TEQ_OK) print_row(&r, &base);
    if (rc == TEQ_OK && r.err > 1e-4)
      rc = diag_error(d, "%s: the corrected mutant differs from the original by %.3g", c->name,
                      r.err);
    graph_free(fixed), graph_free(prog);
    pet_regions_fini(&rg);
  }
  pet_mutants_free(mut, n_mut);
  graph_free(orig);
  tensor_unref(x);
  return rc;
}

static bool wanted(const char *list, const char *name) {
  if (!list) return true;
  size_t n = strlen(name);
  for (const char *p = list; (p = strstr(p, name)); p += n)
    if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return true;
  return false;
}

static int usage(void) {
  fprintf(stderr,
          "usage: bench-pet-ops [--cases conv,dilatedconv,groupconv,batchmatmul] [--repeat N]\n"
          "                     [--gpu-repeat N] [--mutants K] [--depth D] [--cost-table FILE]\n");
  return 2;
}

int main(int argc, char **argv) {
  Options o = {.cost_table = TEQ_COST_TABLE, .repeat = 5, .gpu_repeat = 200,
               .mutants = 16, .depth = 3};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return usage();
    if (!strcmp(a, "--cases")) o.cases = v;
    else if (!strcmp(a, "--cost-table")) o.cost_table = v;
    else if (!strcmp(a, "--repeat")) o.repeat = atoi(v);
    else if (!strcmp(a, "--gpu-repeat")) o.gpu_repeat = atoi(v);
    else if (!strcmp(a, "--mutants")) o.mutants = atoi(v);
    else if (!strcmp(a, "--depth")) o.depth = atoi(v);
    else return usage();
    i++;
  }
  if (o.repeat < 1 || o.gpu_repeat < 1 || o.mutants < 1 || o.depth < 1) return usage();
  Diag d;
  diag_init(&d);
  CudaInfo info;
  cuda_probe(&info);
  CudaDevice *dev = NULL;
  CostModel *cm = cost_model_new();
  int rc = cm ? TEQ_OK : TEQ_ERR_NOMEM;
  if (rc == TEQ_OK && info.n_devices > 0 && (rc = cuda_device_open(&dev, &d)) == TEQ_OK) {
    cost_model_use_gpu(cm, dev);
    printf("costs measured on %s; GPU times on it\n", cuda_device_name(dev));
  } else if (rc == TEQ_OK) {
    rc = cost_model_load_table(cm, o.cost_table, NULL, &d);
    if (rc == TEQ_OK)
      printf("costs from the table %s (%s), analytic beyond it; no GPU (%s): no GPU times\n",
             o.cost_table, cost_model_device(cm), info.why);
  }
  struct {
    const char *name, *source;
    Shape x, w[3];
    int n, pad, dil;
  } specs[] = {
    {"conv", "Inception-v3", {4, {1, 48, 38, 38}}, {{4, {64, 48, 5, 5}}}, 1, 2, 1},
    {"dilatedconv", "CSRNet", {4, {1, 512, 14, 14}}, {{4, {256, 512, 3, 3}}}, 1, 2, 2},
    {"groupconv", "Inception-v3, two convs on one input", {4, {1, 768, 18, 18}},
     {{4, {192, 768, 1, 1}}, {4, {160, 768, 1, 1}}}, 2, 0, 1},
    {"batchmatmul", "BERT, three projections of one input", {2, {512, 768}},
     {{2, {768, 768}}, {2, {768, 768}}, {2, {768, 768}}}, 3, 0, 1},
  };
  for (size_t i = 0; i < sizeof specs / sizeof *specs && rc == TEQ_OK; i++) {
    if (!wanted(o.cases, specs[i].name)) continue;
    Case c = {.name = specs[i].name, .source = specs[i].source};
    rc = build_case(&c, specs[i].x, specs[i].w, specs[i].n, specs[i].pad, specs[i].dil, &d);
    if (rc == TEQ_OK) rc = run_case(&c, cm, dev, &o, &d);
    graph_free(c.sub);
    for (int k = 0; k < c.n_weights; k++) tensor_unref(c.weights[k]);
  }
  fflush(stdout);
  if (rc) diag_flush(&d, stderr);
  cost_model_free(cm);
  cuda_device_close(dev);
  diag_fini(&d);
  return rc ? 1 : 0;
}
