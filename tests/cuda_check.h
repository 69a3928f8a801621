/* cuda_check.h: what the GPU tests share. One operator configuration is
 * built as a one-node graph, run on the CPU executor and on a CudaPlan with
 * the same seeded random inputs, and every output compared: float32 outputs
 * by max |gpu - cpu| / max |cpu| (the error relative to the output's
 * largest magnitude), integer outputs exactly; a NaN on one side only is a
 * failure. Without a GPU, cuda_check_open skips the whole test (exit 77).
 *
 * (exec_relative_error).
 *
 * A case names its inputs' shapes; an input may instead be a given constant
 * (gather's int64 indices, a mask of zeros). Inputs are uniform in [-1, 1)
 * unless `positive` asks for (0.5, 1.5] (log, sqrt, pow's base). */
#ifndef TEQ_TESTS_CUDA_CHECK_H
#define TEQ_TESTS_CUDA_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/cuda.h"
#include "runtime/exec.h"
#include "runtime/graph.h"
#include "runtime/ops.h"
#include "tests/check.h"

enum { CUDA_CASE_MAX_IN = 8, CUDA_CASE_MAX_OUT = 8 };

typedef struct CudaCase {
  const char *label;                /* printed on failure */
  OpKind kind;
  Params params;                    /* params_default first, then set */
  int n_in, n_out;
  Shape in[CUDA_CASE_MAX_IN];
  Tensor *consts[CUDA_CASE_MAX_IN]; /* non-NULL: input i is this (reference kept by the caller) */
  bool positive;                    /* random inputs in (0.5, 1.5] */
  double tol;                       /* 0: 1e-4 */
} CudaCase;

/* Whether this build has CUDA, so that the kernels' arithmetic can be run
 * on the host (cuda_kernel_on_host), which needs no GPU; says so where it
 * has not and `what` is skipped. */
static inline bool cuda_kernels_built(const char *what) {
  CudaInfo info;
  cuda_probe(&info);
  if (!info.built) printf("  (no CUDA in this build: %s skipped)\n", what);
  return info.built;
}

/* Opens the GPU or skips the test. */
static inline CudaDevice *cuda_check_open(void) {
  CudaInfo info;
  cuda_probe(&info);
  if (info.n_devices == 0) check_skip(info.why);
  Diag d;
  diag_init(&d);
  CudaDevice *dev = NULL;
  if (cuda_device_open(&dev, &d) != TEQ_OK) {
    fprintf(stderr, "cuda_device_open: %s", d.text ? d.text : "failed\n");
    exit(1);
  }
  diag_fini(&d);
  printf("GPU: %s (cuDNN %d)\n", info.device, info.cudnn_version);
  return dev;
}

/* Both executors on inputs from seed; every output compared. Returns the
 * worst error, or INFINITY if either side failed (with the message). */
static inline double cuda_check_graph(CudaDevice *dev, const Graph *g, uint64_t seed,
                                      bool positive, const char *label) {
  Diag d;
  diag_init(&d);
  Tensor *in[64] = {0}, *cpu[64] = {0}, *gpu[64] = {0};
  double worst = INFINITY;
  CudaPlan *plan = NULL;
  for (int i = 0; i < g->n_inputs && i < 64; i++) {
    const Node *x = &g->nodes[g->inputs[i]];
    in[i] = tensor_new(x->dtype, &x->out[0]);
    tensor_fill_random(in[i], seed + (uint64_t)i);
    if (positive && x->dtype == DT_F32) {
      float *v = (float *)in[i]->data;
      for (int64_t k = 0; k < tensor_numel(in[i]); k++) v[k] = 1.0f + 0.5f * fabsf(v[k]);
    }
  }
  if (exec_run(g, EXEC_F32, in, cpu, &d) != TEQ_OK) {
    printf("FAIL %s: CPU executor: %s", label, d.text);
    goto out;
  }
  if (cuda_plan_new(dev, g, &plan, &d) != TEQ_OK || cuda_plan_run(plan, in, gpu, &d) != TEQ_OK) {
    printf("FAIL %s: GPU: %s", label, d.text ? d.text : "no message\n");
    goto out;
  }
  worst = 0;
  for (int j = 0; j < g->n_outputs; j++) {
    double e = exec_relative_error(gpu[j], cpu[j]);
    if (e > worst) worst = e;
  }
out:
  for (int i = 0; i < 64; i++) tensor_unref(in[i]), tensor_unref(cpu[i]), tensor_unref(gpu[i]);
  cuda_plan_free(plan);
  diag_fini(&d);
  return worst;
}

/* Runs graph g at two seeds; CHECKs the worst error against tol (0:
 * 1e-4) and prints a line for it. */
static inline void cuda_check_seeds(CudaDevice *dev, const Graph *g, bool positive, double tol,
                                    const char *label) {
  double worst = 0;
  if (tol <= 0) tol = 1e-4;
  for (uint64_t seed = 1; seed <= 2; seed++) {
    double e = cuda_check_graph(dev, g, seed * 1000, positive, label);
    if (e > worst) worst = e;
  }
  check_count++;
  if (!(worst <= tol)) {
    check_failures++;
    printf("FAIL %s: error %.3g > %.1g\n", label, worst, tol);
  } else {
    printf("ok   %-40s error %.2g\n", label, worst);
  }
}

/* Runs one case at two seeds (cuda_check_seeds); a case that does not
 * build fails. */
static inline void cuda_check_case(CudaDevice *dev, const CudaCase *c) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  TensorRef refs[CUDA_CASE_MAX_IN];
  bool ok = true;
  for (int i = 0; i < c->n_in && ok; i++) {
    char name[16];
    snprintf(name, sizeof name, "x%d", i);
    int id = c->consts[i] ? graph_add_const(g, name, tensor_ref(c->consts[i]), &d)
                          : graph_add_input(g, name, &c->in[i], DT_F32, &d);
    ok = id >= 0;
    refs[i] = (TensorRef){id, 0};
  }
  int id = ok ? graph_add_node(g, c->kind, refs, c->n_in, c->n_out, &c->params, "op", &d) : -1;
  for (int j = 0; id >= 0 && j < c->n_out; j++) graph_add_output(g, (TensorRef){id, j}, NULL, &d);
  if (id < 0) {
    check_count++, check_failures++;
    printf("FAIL %s: cannot build: %s", c->label, d.text ? d.text : "?\n");
  } else {
    cuda_check_seeds(dev, g, c->positive, c->tol, c->label);
  }
  graph_free(g);
  diag_fini(&d);
}

/* A case with the row's default parameters and n_in inputs of the given
 * shapes (varargs: Shape values), one output. */
static inline CudaCase cuda_case(const char *label, OpKind kind, int n_in, const Shape *in) {
  CudaCase c;
  memset(&c, 0, sizeof c);
  c.label = label;
  c.kind = kind;
  params_default(kind, &c.params);
  c.n_in = n_in;
  c.n_out = 1;
  for (int i = 0; i < n_in; i++) c.in[i] = in[i];
  return c;
}

#endif
