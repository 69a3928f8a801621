/* test_cuda_profile.c: the profiler's figures are physically possible. A
 * large matrix product and a large convolution are timed by
 * cuda_profile_node; the flop rate each implies must stay below the GPU's
 * float32 peak (a timer that misses work, or an event recorded on the wrong
 * stream, gives rates above it) and above 1% of it (one that times
 * something else gives rates far below; a Winograd conv's direct-sum flops
 * may imply up to 36/16 of the peak). The convolution names the
 * algorithm it ran, and the cost model measures through the same profiler.
 * A product by a constant without data (tensor_new_unbacked) is timed too.
 * Skips (exit 77) without a GPU. */
#include <string.h>

#include "runtime/cost.h"
#include "tests/cuda_check.h"

static Graph *one_node(OpKind kind, int n_in, const Shape *in, const Params *p, int *id) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  TensorRef refs[4];
  for (int i = 0; i < n_in; i++) {
    char name[8];
    snprintf(name, sizeof name, "x%d", i);
    refs[i] = (TensorRef){graph_add_input(g, name, &in[i], DT_F32, &d), 0};
  }
  *id = graph_add_node(g, kind, refs, n_in, 1, p, "op", &d);
  CHECK(*id >= 0);
  graph_add_output(g, (TensorRef){*id, 0}, "y", &d);
  diag_fini(&d);
  return g;
}

static void check_rate(CudaDevice *dev, const CudaInfo *info, const char *what, Graph *g, int id) {
  Diag d;
  diag_init(&d);
  CudaProfile p;
  int rc = cuda_profile_node(dev, g, id, 30, &p, &d);
  CHECK_MSG(rc == TEQ_OK, "%s: %s", what, d.text ? d.text : "?");
  if (rc == TEQ_OK) {
    double gflops = cost_node_flops(g, id) / (p.median_us * 1e3);
    /* The rate of a direct sum's flops: Winograd's F(2x2, 3x3) does 16/36
     * of its multiplications, so it may imply up to 36/16 of the peak. */
    double peak = info->peak_gflops * (strcmp(p.algo, "teq:winograd") == 0 ? 36.0 / 16.0 : 1.0);
    printf("%s: median %.1f us (min %.1f, %d repeats), %.0f GFLOP/s of a %.0f peak, %s\n", what,
           p.median_us, p.min_us, p.repeats, gflops, peak, p.algo);
    CHECK(p.repeats == 30 && p.min_us > 0 && p.median_us >= p.min_us);
    CHECK_MSG(gflops < peak, "%s: %.0f GFLOP/s above the peak", what, gflops);
    CHECK_MSG(gflops > 0.01 * info->peak_gflops, "%s: %.0f GFLOP/s: implausibly slow", what, gflops);
  }
  diag_fini(&d);
}

int main(void) {
  CudaDevice *dev = cuda_check_open();
  CudaInfo info;
  cuda_probe(&info);
  CHECK(info.peak_gflops > 1000 && info.mem_gbps > 100);

  Shape mm[2] = {shape_of(2, 4096, 4096), shape_of(2, 4096, 4096)};
  int id;
  Graph *g = one_node(OP_MATMUL, 2, mm, NULL, &id);
  check_rate(dev, &info, "matmul 4096^3", g, id);
  /* A weight optimize prices without computing it (a constant with no
   * data) is timed as any weight is, with values of its own. */
  Tensor *unbacked = tensor_new_unbacked(DT_F32, &mm[1]);
  int w = unbacked ? graph_add_const(g, "w", unbacked, NULL) : -1;
  CHECK(w >= 0);
  if (w >= 0) {
    g->nodes[id].in[1] = (TensorRef){w, 0};
    check_rate(dev, &info, "matmul 4096^3 by a weight with no data", g, id);
  }
  graph_free(g);

  Shape cv[2] = {shape_of(4, 8, 256, 56, 56), shape_of(4, 256, 256, 3, 3)};
  Params p;
  params_default(OP_CONV2D, &p);
  int64_t pads[4] = {1, 1, 1, 1};
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), pads, 4);
  g = one_node(OP_CONV2D, 2, cv, &p, &id);
  check_rate(dev, &info, "conv2d 8x256x56x56 * 256x256x3x3", g, id);

  /* The cost model with a GPU measures what no table holds. */
  CostModel *m = cost_model_new();
  cost_model_use_gpu(m, dev);
  Diag d;
  diag_init(&d);
  CostEstimate e;
  CHECK(cost_node(m, g, id, &e, &d) == TEQ_OK);
  CHECK(e.source == COST_MEASURED && e.us > 0);
  CHECK(strcmp(cost_model_device(m), info.device) == 0);
  diag_fini(&d);
  cost_model_free(m);
  graph_free(g);
  cuda_device_close(dev);
  return check_exit();
}
