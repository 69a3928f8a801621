/* run_model.c: the run-model command: import an ONNX model, run it on the
 * CPU executor or the GPU, print a checksum per output and the time per run.
 *   run-model [--input NAME=FILE]... [--seed S] [--batch N] [--repeat N]
 *             [--output-dir DIR] [--save OUT.onnx] [--modp] [--quiet]
 *             [--gpu [--warmup N] [--check] [--steps]] [--planned] MODEL.onnx
 * On the GPU the time is the median of --repeat replays of the whole graph
 * between CUDA events, after --warmup; --check also runs the CPU executor
 * and fails when an output differs by more than 1e-4 of its largest
 * magnitude; --steps prints each kernel's time inside a run of the whole
 * graph beside its time run alone (how the cost model measures it).
 * --planned runs the graph again as the GPU's memory plan lays it out, on
 * the host, and fails as --check does: a machine without a GPU checks the
 * plan's aliases, offsets and strides on a real model.
 * Inputs not given as files are seeded random tensors (input i gets seed
 * S+i), so two runs of the same command print the same numbers. Results go
 * to stdout, import statistics and messages to stderr; bad arguments or a
 * bad model exit with status 2. Options are rows of one table. */
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "runtime/cuda.h"
#include "runtime/exec.h"
#include "runtime/onnx.h"
#include "runtime/plan.h"

#define MAX_INPUT_FILES 64

typedef struct RunOptions {
  const char *input_files[MAX_INPUT_FILES]; /* "NAME=FILE" */
  int64_t n_input_files;
  const char *dims[MAX_INPUT_FILES]; /* "NAME=N" */
  int64_t n_dims;
  int64_t seed;
  int64_t batch;
  int64_t repeat;
  const char *output_dir;
  const char *save;
  int64_t modp, quiet;
  int64_t gpu, warmup, check, steps, as_given, planned;
  const char *model;
} RunOptions;

typedef enum { OPT_FLAG, OPT_INT, OPT_STRING, OPT_LIST } OptKind;

typedef struct OptRow {
  const char *name;
  OptKind kind;
  size_t offset;    /* of the field in RunOptions */
  size_t count;     /* OPT_LIST: of its count */
  int64_t def, lo, hi;
  const char *help;
} OptRow;

static const OptRow option_rows[] = {
    {"input", OPT_LIST, offsetof(RunOptions, input_files), offsetof(RunOptions, n_input_files),
     0, 0, 0,
     "NAME=FILE: feed input NAME from FILE (.pb: a TensorProto; else raw little-endian data)"},
    {"dim", OPT_LIST, offsetof(RunOptions, dims), offsetof(RunOptions, n_dims), 0, 0, 0,
     "NAME=N: the inputs' symbolic dimension NAME is N"},
    {"seed", OPT_INT, offsetof(RunOptions, seed), 0, 0, 0, INT64_MAX,
     "seed of the random inputs; input i gets seed S+i"},
    {"batch", OPT_INT, offsetof(RunOptions, batch), 0, 1, 1, 1 << 20,
     "extent given to symbolic dimensions"},
    {"repeat", OPT_INT, offsetof(RunOptions, repeat), 0, 1, 0, 1000000,
     "runs to time; the median is printed (0: import only)"},
    {"output-dir", OPT_STRING, offsetof(RunOptions, output_dir), 0, 0, 0, 0,
     "write output_J.pb (TensorProto) and output_J.bin (raw float32) there"},
    {"save", OPT_STRING, offsetof(RunOptions, save), 0, 0, 0, 0,
     "write the imported graph back as ONNX"},
    {"modp", OPT_FLAG, offsetof(RunOptions, modp), 0, 0, 0, 1, "evaluate exactly in Z_p"},
    {"quiet", OPT_FLAG, offsetof(RunOptions, quiet), 0, 0, 0, 1, "no statistics on stderr"},
    {"gpu", OPT_FLAG, offsetof(RunOptions, gpu), 0, 0, 0, 1,
     "run on the GPU (cuDNN, cuBLAS, Teq's kernels), timed by CUDA events"},
    {"warmup", OPT_INT, offsetof(RunOptions, warmup), 0, 10, 0, 1000000,
     "with --gpu: untimed runs before the timed ones"},
    {"check", OPT_FLAG, offsetof(RunOptions, check), 0, 0, 0, 1,
     "with --gpu: compare with the CPU executor; fail above 1e-4 relative error"},
    {"steps", OPT_FLAG, offsetof(RunOptions, steps), 0, 0, 0, 1,
     "with --gpu: each kernel's time in a run of the graph and run alone, slowest first"},
    {"planned", OPT_FLAG, offsetof(RunOptions, planned), 0, 0, 0, 1,
     "also run as the GPU's memory plan lays it out, on the host (no GPU needed); compare "
     "with the CPU executor; fail above 1e-4 relative error"},
    {"as-given", OPT_FLAG, offsetof(RunOptions, as_given), 0, 0, 0, 1,
     "no import-time fusion: BatchNorm, activations, layer norms and GELUs as in the file"},
};
#define N_OPTIONS (sizeof option_rows / sizeof option_rows[0])

static void usage(FILE *f) {
  fprintf(f, "usage: run-model [options] MODEL.onnx\n");
  for (size_t k = 0; k < N_OPTIONS; k++) {
    const OptRow *r = &option_rows[k];
    fprintf(f, "  --%-11s %s%s", r->name, r->kind == OPT_FLAG ? "" : "V  ", r->help);
    if (r->kind == OPT_INT) fprintf(f, " (default %lld)", (long long)r->def);
    fputc('\n', f);
  }
}

static int bad_usage(const char *fmt, const char *arg) {
  fprintf(stderr, "run-model: ");
  fprintf(stderr, fmt, arg);
  fputc('\n', stderr);
  usage(stderr);
  return 2;
}

/* Stores one option's value; 0 or the exit status 2. */
static int set_option(RunOptions *o, const OptRow *r, const char *val) {
  char *field = (char *)o + r->offset;
  if (r->kind == OPT_FLAG) {
    *(int64_t *)field = 1;
  } else if (r->kind == OPT_STRING) {
    *(const char **)field = val;
  } else if (r->kind == OPT_LIST) {
    int64_t *n = (int64_t *)((char *)o + r->count);
    if (*n == MAX_INPUT_FILES) return bad_usage("too many --%s options", r->name);
    if (!strchr(val, '=')) {
      /* a list's help opens with its form, "NAME=FILE: ..." */
      fprintf(stderr, "run-model: --%s takes %.*s, not '%s'\n", r->name,
              (int)strcspn(r->help, ":"), r->help, val);
      usage(stderr);
      return 2;
    }
    ((const char **)field)[(*n)++] = val;
  } else {
    char *end;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (errno || *end || end == val || v < r->lo || v > r->hi) {
      fprintf(stderr, "run-model: --%s takes an integer in [%lld, %lld], not '%s'\n", r->name,
              (long long)r->lo, (long long)r->hi, val);
      return 2;
    }
    *(int64_t *)field = v;
  }
  return 0;
}

/* Fills o from argv; 0, or the status to exit with (2, or -1 for --help). */
static int parse_args(int argc, char **argv, RunOptions *o) {
  memset(o, 0, sizeof *o);
  for (size_t k = 0; k < N_OPTIONS; k++)
    if (option_rows[k].kind == OPT_INT)
      *(int64_t *)((char *)o + option_rows[k].offset) = option_rows[k].def;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return -1;
    if (strncmp(a, "--", 2) != 0) {
      if (o->model) return bad_usage("more than one model: '%s'", a);
      o->model = a;
      continue;
    }
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
    const OptRow *r = NULL;
    for (size_t k = 0; k < N_OPTIONS; k++)
      if (strlen(option_rows[k].name) == len && strncmp(option_rows[k].name, a + 2, len) == 0)
        r = &option_rows[k];
    if (!r) return bad_usage("unknown option '%s'", a);
    const char *val = eq ? eq + 1 : NULL;
    if (r->kind == OPT_FLAG && val) return bad_usage("option '%s' takes no value", a);
    if (r->kind != OPT_FLAG && !val && (val = i + 1 < argc ? argv[++i] : NULL) == NULL)
      return bad_usage("option '%s' needs a value", a);
    int rc = set_option(o, r, val);
    if (rc) return rc;
  }
  return o->model ? 0 : bad_usage("%s", "no model given");
}

/* ---- inputs ---- */

/* diag_error with a code other than TEQ_ERR_INPUT. */
static int fail(Diag *d, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(Diag *d, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_verror(d, fmt, ap);
  va_end(ap);
  return rc;
}

static int make_inputs(const RunOptions *o, const Graph *g, Tensor **inputs, Diag *d) {
  int rc = onnx_check_input_specs(o->input_files, o->n_input_files, g, d);
  for (int32_t i = 0; i < g->n_inputs && rc == TEQ_OK; i++) {
    const Node *in = &g->nodes[g->inputs[i]];
    const char *file = onnx_input_spec_file(o->input_files, o->n_input_files, in->name);
    DType dt = o->modp && in->dtype == DT_F32 ? DT_MODP : in->dtype;
    if (file) {
      rc = onnx_read_input_file(file, in, &inputs[i], d);
    } else if (!(inputs[i] = tensor_new(dt, &in->out[0]))) {
      rc = fail(d, TEQ_ERR_NOMEM, "input '%s': out of memory", in->name);
    } else {
      tensor_fill_random(inputs[i], (uint64_t)o->seed + (uint64_t)i);
    }
    if (rc == TEQ_OK && file && dt == DT_MODP) {
      Tensor *m = exec_f32_to_modp(inputs[i], d);
      tensor_unref(inputs[i]);
      inputs[i] = m;
      if (!m) rc = TEQ_ERR_INPUT;
    }
  }
  return rc;
}

/* ---- running and reporting ---- */

/* --planned: g run again as the GPU's plan lays it out, on the host
 * (exec_run_planned), against the CPU executor's outputs. */
static int run_planned(const Graph *g, Tensor **inputs, Tensor **cpu, Diag *d) {
  Tensor **planned = calloc((size_t)g->n_outputs + 1, sizeof *planned);
  int strided = 0;
  int rc = planned ? exec_run_planned(g, inputs, planned, &strided, d) : TEQ_ERR_NOMEM;
  double worst = 0;
  for (int32_t j = 0; rc == TEQ_OK && j < g->n_outputs; j++) {
    double e = exec_relative_error(planned[j], cpu[j]);
    if (!(e <= worst)) worst = e;
  }
  for (int32_t j = 0; planned && j < g->n_outputs; j++) tensor_unref(planned[j]);
  free(planned);
  MemPlan plan;
  if (rc == TEQ_OK) rc = mem_plan_build(g, &plan, d);
  if (rc != TEQ_OK) return rc;
  int replaced = 0;
  for (int i = 0; i < plan.gathers.n_exits; i++) replaced += plan.gathers.exits[i].kernels;
  printf("planned on the host vs cpu: largest relative error %.3g (%d kernels, %d products by "
         "strides, %d gathers for %d layout kernels; arena %.1f MB, constants %.1f MB)\n",
         worst, plan.n_steps, strided, plan.gathers.n_exits, replaced,
         (double)plan.arena_bytes / 1e6, (double)plan.const_bytes / 1e6);
  mem_plan_fini(&plan);
  if (!(worst <= 1e-4))
    rc = fail(d, TEQ_ERR_INTERNAL, "the plan's outputs differ by %.3g (tolerance 1e-4)", worst);
  return rc;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Runs g repeat times; outputs holds the last run's results. */
static int run_timed(const RunOptions *o, const Graph *g, Tensor **inputs, Tensor **outputs,
                     double *median_ms, Diag *d) {
  double *times = malloc((size_t)o->repeat * sizeof *times);
  if (!times) return fail(d, TEQ_ERR_NOMEM, "out of memory");
  int rc = TEQ_OK;
  for (int64_t r = 0; r < o->repeat && rc == TEQ_OK; r++) {
    for (int32_t j = 0; r > 0 && j < g->n_outputs; j++) {
      tensor_unref(outputs[j]);
      outputs[j] = NULL;
    }
    double t0 = now_ms();
    rc = exec_run(g, o->modp ? EXEC_MODP : EXEC_F32, inputs, outputs, d);
    times[r] = now_ms() - t0;
  }
  qsort(times, (size_t)o->repeat, sizeof *times, compare_doubles);
  *median_ms = times[o->repeat / 2];
  free(times);
  return rc;
}

/* Writes output_J.pb and output_J.bin into dir, which is made if missing. */
static int write_outputs(const char *dir, const Graph *g, Tensor **outputs, Diag *d) {
  int rc = TEQ_OK;
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return fail(d, TEQ_ERR_IO, "%s: cannot create the directory: %s", dir, strerror(errno));
  for (int32_t j = 0; j < g->n_outputs && rc == TEQ_OK; j++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/output_%d.pb", dir, j);
    rc = onnx_write_tensor_file(path, outputs[j], g->output_names[j], d);
    snprintf(path, sizeof path, "%s/output_%d.bin", dir, j);
    FILE *f = rc == TEQ_OK ? fopen(path, "wb") : NULL;
    if (rc == TEQ_OK && !f)
      rc = fail(d, TEQ_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    const Tensor *t = outputs[j];
    for (int64_t k = 0; f && k < tensor_numel(t); k++) {
      float v = t->dtype == DT_F32 ? ((const float *)t->data)[k]
                : t->dtype == DT_I64 ? (float)((const int64_t *)t->data)[k]
                                     : (float)((const uint32_t *)t->data)[k];
      fwrite(&v, sizeof v, 1, f);
    }
    if (f && (ferror(f) | fclose(f)))
      rc = fail(d, TEQ_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
  }
  return rc;
}

static void print_results(const Graph *g, Tensor **outputs, const RunOptions *o, double ms) {
  for (int32_t j = 0; j < g->n_outputs; j++) {
    char s[SHAPE_STR_MAX];
    printf("%s %s %.9g\n", g->output_names[j] ? g->output_names[j] : "?",
           shape_format(&outputs[j]->shape, s, sizeof s), tensor_checksum(outputs[j]));
  }
  printf("time %.3f ms%s%s\n", ms, o->repeat > 1 ? " (median)" : "",
         o->gpu ? " on the GPU, CUDA events" : "");
}

static void print_stats(const char *path, const OnnxImportStats *s) {
  char line[ONNX_STATS_STR_MAX];
  fprintf(stderr, "%s: opset %d, %s%s\n", path, s->opset,
          onnx_import_stats_format(s, line, sizeof line),
          s->n_external ? "; weights read from external data" : "");
}

/* One kernel of a plan, timed in the sequence and alone. */
typedef struct StepTime {
  int node;
  double in_run_us, alone_us;
  const char *note;
} StepTime;

static int by_time_in_run(const void *a, const void *b) {
  double x = ((const StepTime *)a)->in_run_us, y = ((const StepTime *)b)->in_run_us;
  return (x < y) - (x > y);
}

/* --steps: every kernel's median time inside runs of the whole plan beside
 * the same node timed alone (cuda_profile_node, as teq-profile measures
 * the cost table), slowest first, with the sums. Where the two disagree,
 * the table misprices what the graph runs. */
static int print_steps(const RunOptions *o, CudaDevice *dev, CudaPlan *plan, const Graph *g,
                       Diag *d) {
  int n = cuda_plan_n_steps(plan);
  double *us = calloc((size_t)n + 1, sizeof *us);
  StepTime *st = calloc((size_t)n + 1, sizeof *st);
  int rc = us && st ? cuda_plan_time_steps(plan, (int)(o->repeat < 5 ? 5 : o->repeat), us, d)
                    : TEQ_ERR_NOMEM;
  double in_run = 0, alone = 0;
  for (int i = 0; rc == TEQ_OK && i < n; i++) {
    st[i].in_run_us = us[i];
    st[i].note = cuda_plan_step_note(plan, i, &st[i].node);
    CudaProfile prof;
    Diag pd;
    diag_init(&pd);
    st[i].alone_us = cuda_profile_node(dev, g, st[i].node, 20, &prof, &pd) == TEQ_OK
                         ? prof.median_us : -1;
    diag_fini(&pd);
    in_run += us[i];
    if (st[i].alone_us > 0) alone += st[i].alone_us;
  }
  if (rc == TEQ_OK) {
    qsort(st, (size_t)n, sizeof *st, by_time_in_run);
    printf("steps: %d kernels, %.1f us in a run, %.1f us timed alone\n", n, in_run, alone);
    printf("%10s %10s %7s  %-28s %s\n", "in run us", "alone us", "ratio", "chose", "node");
    for (int i = 0; i < n; i++) {
      char label[GRAPH_LABEL_MAX];
      graph_node_label(g, st[i].node, label, sizeof label);
      if (st[i].alone_us > 0)
        printf("%10.2f %10.2f %7.2f  %-28s %s\n", st[i].in_run_us, st[i].alone_us,
               st[i].in_run_us / st[i].alone_us, st[i].note, label);
      else
        printf("%10.2f %10s %7s  %-28s %s\n", st[i].in_run_us, "-", "-", st[i].note, label);
    }
  }
  free(us);
  free(st);
  return rc;
}

/* The GPU run: plan, run once for the outputs, time, and compare with the
 * CPU executor when asked. */
static int run_gpu(const RunOptions *o, const Graph *g, Tensor **inputs, Tensor **outputs,
                   double *ms, Diag *d) {
  CudaDevice *dev = NULL;
  CudaPlan *plan = NULL;
  double t0 = now_ms();
  int rc = cuda_device_open(&dev, d);
  if (rc == TEQ_OK) rc = cuda_plan_new(dev, g, &plan, d);
  if (rc == TEQ_OK && !o->quiet)
    fprintf(stderr, "gpu: %s, %d kernels, %.1f MB on the device, planned in %.0f ms\n",
            cuda_device_name(dev), cuda_plan_n_steps(plan),
            (double)cuda_plan_device_bytes(plan) / 1e6, now_ms() - t0);
  if (rc == TEQ_OK) rc = cuda_plan_run(plan, inputs, outputs, d);
  CudaTiming t = {0};
  if (rc == TEQ_OK) rc = cuda_plan_time(plan, (int)o->warmup, (int)o->repeat, &t, d);
  *ms = t.median_ms;
  if (rc == TEQ_OK && o->steps) rc = print_steps(o, dev, plan, g, d);
  if (rc == TEQ_OK && o->check) {
    Tensor **cpu = calloc((size_t)g->n_outputs + 1, sizeof *cpu);
    rc = cpu ? exec_run(g, EXEC_F32, inputs, cpu, d) : TEQ_ERR_NOMEM;
    double worst = 0;
    for (int32_t j = 0; rc == TEQ_OK && j < g->n_outputs; j++) {
      double e = exec_relative_error(outputs[j], cpu[j]);
      if (e > worst) worst = e;
    }
    for (int32_t j = 0; cpu && j < g->n_outputs; j++) tensor_unref(cpu[j]);
    free(cpu);
    if (rc == TEQ_OK) {
      printf("gpu vs cpu: largest relative error %.3g\n", worst);
      if (!(worst <= 1e-4))
        rc = fail(d, TEQ_ERR_INTERNAL, "GPU and CPU outputs differ by %.3g (tolerance 1e-4)", worst);
    }
  }
  cuda_plan_free(plan);
  cuda_device_close(dev);
  return rc;
}

/* Import, run, report; returns an error code. */
static int run_model(const RunOptions *o, Diag *d) {
  OnnxImportOptions io = ONNX_IMPORT_DEFAULTS;
  io.batch = o->batch;
  io.dims = o->dims;
  io.n_dims = (int)o->n_dims;
  if (o->as_given) onnx_import_as_given(&io);
  OnnxImportStats stats;
  Graph *g = NULL;
  double t0 = now_ms();
  int rc = onnx_import_file(o->model, &io, &g, &stats, d);
  if (rc != TEQ_OK) return rc;
  double import_ms = now_ms() - t0;
  if (!o->quiet) print_stats(o->model, &stats);
  printf("import %.3f ms\n", import_ms);
  Tensor **inputs = calloc((size_t)g->n_inputs + 1, sizeof *inputs);
  Tensor **outputs = calloc((size_t)g->n_outputs + 1, sizeof *outputs);
  double ms = 0;
  rc = inputs && outputs ? TEQ_OK : TEQ_ERR_NOMEM;
  /* as the model was read: its weights beside it or not, its opset */
  OnnxExportOptions eo = {.external = stats.n_external > 0, .opset = stats.opset};
  if (rc == TEQ_OK && o->save) rc = onnx_export_file(g, o->save, &eo, d);
  bool run = o->repeat > 0;
  if (rc == TEQ_OK && run) rc = make_inputs(o, g, inputs, d);
  if (rc == TEQ_OK && run && o->gpu && o->modp) rc = fail(d, TEQ_ERR_INPUT, "--gpu runs float32 only, not --modp");
  if (rc == TEQ_OK && !o->gpu && (o->check || o->steps))
    rc = fail(d, TEQ_ERR_INPUT, "--%s compares with the GPU run: add --gpu", o->check ? "check" : "steps");
  if (rc == TEQ_OK && run) rc = o->gpu ? run_gpu(o, g, inputs, outputs, &ms, d)
                                       : run_timed(o, g, inputs, outputs, &ms, d);
  if (rc == TEQ_OK && run && o->planned && (o->gpu || o->modp))
    rc = fail(d, TEQ_ERR_INPUT, "--planned compares with the CPU executor's float32 run: drop --%s",
              o->gpu ? "gpu" : "modp");
  if (rc == TEQ_OK && run) print_results(g, outputs, o, ms);
  if (rc == TEQ_OK && run && o->planned) rc = run_planned(g, inputs, outputs, d);
  if (rc == TEQ_OK && run && o->output_dir) rc = write_outputs(o->output_dir, g, outputs, d);
  for (int32_t i = 0; inputs && i < g->n_inputs; i++) tensor_unref(inputs[i]);
  for (int32_t j = 0; outputs && j < g->n_outputs; j++) tensor_unref(outputs[j]);
  free(inputs);
  free(outputs);
  graph_free(g);
  return rc;
}

int main(int argc, char **argv) {
  /* Keep freed activations in the heap between repeated runs: returned to
   * the kernel, every run would page-fault all of them in again. 32 MiB is
   * glibc's largest mmap threshold on 64-bit. */
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#ifndef NDEBUG
  /* In builds with asserts the operator registry checks itself first. */
  Diag rd;
  diag_init(&rd);
  if (op_registry_check(&rd) != TEQ_OK) {
    diag_flush(&rd, stderr);
    return 1;
  }
  diag_fini(&rd);
#endif
  RunOptions o;
  int status = parse_args(argc, argv, &o);
  if (status) {
    if (status < 0) usage(stdout);
    return status < 0 ? 0 : status;
  }
  Diag d;
  diag_init(&d);
  d.echo = stderr;
  int rc = run_model(&o, &d);
  diag_flush(&d, stderr);
  diag_fini(&d);
  return teq_exit_status(rc);
}
