/* test_conformance.c: ONNX's own node tests (Debian libonnx-testdata) through
 * import and the float32 CPU executor.
 *
 * Every test directory holds model.onnx and test_data_set_0/{input,output}_N.pb.
 * A test whose model imports with no opaque node and whose tensors we can
 * read runs; its outputs must match the reference within ONNX's own backend
 * test tolerance (rtol 1e-3, atol 1e-7). Models using an operator or an
 * attribute value Teq does not support are counted as skipped. The test
 * fails on any mismatch or crash-free error in a supported model, and if
 * fewer tests pass than the floor below: the supported share only grows.
 *
 * With --gpu every test that passes on the CPU also runs on the GPU
 * (runtime/cuda.h), whose outputs must match the reference within the same
 * tolerance and the CPU executor's within 1e-4 of the output's largest
 * magnitude; without a GPU, --gpu skips the whole test.
 *
 *   test_conformance [DATA_DIR] [-v] [--gpu] [NAME_SUBSTRING] */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/cuda.h"
#include "runtime/exec.h"
#include "runtime/onnx.h"
#include "tests/check.h"

/* Raise this when more node tests pass; never lower it. */
#define PASS_FLOOR 343

enum { RAN_PASS, RAN_FAIL, SKIPPED };

typedef struct Totals {
  int passed, failed, skipped;
} Totals;

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static double value_at(const Tensor *t, int64_t i) {
  return t->dtype == DT_I64 ? (double)((const int64_t *)t->data)[i] : ((const float *)t->data)[i];
}

/* Compares one output against its reference; returns the worst excess
 * |a - b| - (atol + rtol |b|), <= 0 when within tolerance. */
static double compare(const Tensor *got, const Tensor *want, char *why, size_t n) {
  if (!shape_equal(&got->shape, &want->shape)) {
    char a[SHAPE_STR_MAX], b[SHAPE_STR_MAX];
    snprintf(why, n, "shape %s, expected %s", shape_format(&got->shape, a, sizeof a),
             shape_format(&want->shape, b, sizeof b));
    return INFINITY;
  }
  double worst = -INFINITY;
  for (int64_t i = 0; i < tensor_numel(want); i++) {
    double a = value_at(got, i), b = value_at(want, i);
    if (isnan(a) && isnan(b)) continue;
    if (isinf(b) && a == b) continue;
    double excess = fabs(a - b) - (1e-7 + 1e-3 * fabs(b));
    if (isnan(excess)) excess = INFINITY;
    if (excess > worst) {
      worst = excess;
      if (excess > 0) snprintf(why, n, "element %lld: %.9g, expected %.9g", (long long)i, a, b);
    }
  }
  return worst;
}

/* Reads input_N.pb / output_N.pb of a data set until one is missing. */
static int read_set(const char *dir, const char *kind, Tensor **out, int max, Diag *d) {
  int n = 0;
  for (; n < max; n++) {
    char path[4400];
    snprintf(path, sizeof path, "%s/test_data_set_0/%s_%d.pb", dir, kind, n);
    if (!exists(path)) break;
    if (onnx_read_tensor_file(path, &out[n], NULL, d) != TEQ_OK) {
      while (n--) tensor_unref(out[n]);
      return -1;
    }
  }
  return n;
}

static bool has_opaque(const Graph *g) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].kind == OP_OPAQUE) return true;
  return false;
}

/* The GPU side of one passing test; false with a reason on a mismatch. */
static bool run_gpu(CudaDevice *dev, const Graph *g, Tensor **in, Tensor **want, Tensor **cpu,
                    int n_want, char *why, size_t n) {
  Diag d;
  diag_init(&d);
  CudaPlan *plan = NULL;
  Tensor *got[16] = {0};
  bool ok = cuda_plan_new(dev, g, &plan, &d) == TEQ_OK && cuda_plan_run(plan, in, got, &d) == TEQ_OK;
  if (!ok) snprintf(why, n, "GPU: %s", d.len ? diag_last(&d) : "failed");
  for (int i = 0; ok && i < n_want; i++) {
    char w[200];
    if (compare(got[i], want[i], w, sizeof w) > 0) {
      snprintf(why, n, "GPU output %d: %s", i, w);
      ok = false;
    } else if (exec_relative_error(got[i], cpu[i]) > 1e-4) {
      snprintf(why, n, "GPU output %d differs from the CPU's by %.3g", i,
               exec_relative_error(got[i], cpu[i]));
      ok = false;
    }
  }
  for (int i = 0; i < 16; i++) tensor_unref(got[i]);
  cuda_plan_free(plan);
  diag_fini(&d);
  return ok;
}

static CudaDevice *gpu_dev; /* set by --gpu */

static int run_one(const char *dir, bool verbose) {
  char path[4200], why[256] = "";
  snprintf(path, sizeof path, "%s/model.onnx", dir);
  Diag d;
  diag_init(&d);
  Graph *g = NULL;
  Tensor *in[16] = {0}, *want[16] = {0}, *got[16] = {0};
  int n_in = -1, n_want = -1, verdict = SKIPPED;
  OnnxImportOptions opts = ONNX_IMPORT_DEFAULTS;
  int rc = onnx_import_file(path, &opts, &g, NULL, &d);
  if (rc == TEQ_OK && graph_check(g, &d) != TEQ_OK) {
    /* Every imported graph, supported or not, must keep the invariants. */
    snprintf(why, sizeof why, "imported graph fails graph_check: %s", diag_last(&d));
    verdict = RAN_FAIL;
    goto out;
  }
  if (rc != TEQ_OK || has_opaque(g)) goto out; /* unsupported operator or attribute */
  n_in = read_set(dir, "input", in, 16, &d);
  n_want = read_set(dir, "output", want, 16, &d);
  if (n_in != g->n_inputs || n_want != g->n_outputs) goto out; /* tensor types we do not read */
  verdict = RAN_FAIL;
  if (exec_run(g, EXEC_F32, in, got, &d) != TEQ_OK) {
    snprintf(why, sizeof why, "%s", diag_last(&d));
    goto out;
  }
  verdict = RAN_PASS;
  for (int i = 0; i < n_want; i++)
    if (compare(got[i], want[i], why, sizeof why) > 0) verdict = RAN_FAIL;
  if (verdict == RAN_PASS && gpu_dev && !run_gpu(gpu_dev, g, in, want, got, n_want, why, sizeof why))
    verdict = RAN_FAIL;
out:
  if (verdict == RAN_FAIL) printf("FAIL %s: %s\n", dir, why);
  else if (verbose && verdict == RAN_PASS) printf("pass %s\n", dir);
  else if (verbose) printf("skip %s: %s", dir, d.len ? diag_last(&d) : "no reason given\n");
  for (int i = 0; i < 16; i++) tensor_unref(in[i]), tensor_unref(want[i]), tensor_unref(got[i]);
  graph_free(g);
  diag_fini(&d);
  return verdict;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
  const char *root = "/usr/share/libonnx-testdata/data/node", *filter = NULL;
  bool verbose = false, gpu = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-v") == 0) verbose = true;
    else if (strcmp(argv[i], "--gpu") == 0) gpu = true;
    else if (argv[i][0] == '/') root = argv[i];
    else filter = argv[i];
  }
  if (gpu) {
    CudaInfo info;
    cuda_probe(&info);
    if (info.n_devices == 0) check_skip(info.why);
    Diag d;
    diag_init(&d);
    if (cuda_device_open(&gpu_dev, &d) != TEQ_OK) {
      fprintf(stderr, "%s", d.text);
      return 1;
    }
    diag_fini(&d);
  }
  DIR *dir = opendir(root);
  if (!dir) check_skip("no ONNX node test data (Debian package libonnx-testdata)");
  char **names = NULL;
  size_t n = 0;
  for (struct dirent *e; (e = readdir(dir));) {
    if (e->d_name[0] == '.' || (filter && !strstr(e->d_name, filter))) continue;
    names = realloc(names, (n + 1) * sizeof *names);
    names[n++] = strdup(e->d_name);
  }
  closedir(dir);
  qsort(names, n, sizeof *names, by_name);
  Totals t = {0};
  for (size_t i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, names[i]);
    int v = run_one(path, verbose);
    if (v == RAN_PASS) t.passed++;
    else if (v == RAN_FAIL) t.failed++;
    else t.skipped++;
    free(names[i]);
  }
  free(names);
  cuda_device_close(gpu_dev);
  printf("conformance%s: %zu node tests: %d ran, %d passed, %d failed, %d skipped as unsupported "
         "(%.1f%% supported)\n",
         gpu ? " (CPU and GPU)" : "", n, t.passed + t.failed, t.passed, t.failed, t.skipped,
         n ? 100.0 * (t.passed + t.failed) / (double)n : 0.0);
  CHECK_EQ_INT(t.failed, 0);
  if (!filter) CHECK_MSG(t.passed >= PASS_FLOOR, "%d passed, floor %d", t.passed, PASS_FLOOR);
  return check_exit();
}
