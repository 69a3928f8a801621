/* none.c: the GPU interface in builds without CUDA (no nvcc or cuDNN found
 * at configure time): the probe says so, everything else refuses. */
#include <stdio.h>
#include <string.h>

#include "runtime/cuda.h"

static const char why_none[] = "built without CUDA (nvcc, cuBLAS or cuDNN not found)";

void cuda_probe(CudaInfo *info) {
  memset(info, 0, sizeof *info);
  snprintf(info->why, sizeof info->why, "%s", why_none);
}

static int refuse(Diag *d) {
  diag_error(d, "%s", why_none);
  return TEQ_ERR_UNSUPPORTED;
}

int cuda_libraries_load(Diag *d) { return refuse(d); }

int cuda_device_open(CudaDevice **out, Diag *d) {
  *out = NULL;
  return refuse(d);
}
void cuda_device_close(CudaDevice *dev) { (void)dev; }
const char *cuda_device_name(const CudaDevice *dev) {
  (void)dev;
  return "";
}
void cuda_device_pin_way(CudaDevice *dev, const char *way) { (void)dev, (void)way; }
int cuda_plan_new(CudaDevice *dev, const Graph *g, CudaPlan **out, Diag *d) {
  (void)dev, (void)g;
  *out = NULL;
  return refuse(d);
}
void cuda_plan_free(CudaPlan *p) { (void)p; }
int cuda_plan_run(CudaPlan *p, Tensor *const *inputs, Tensor **outputs, Diag *d) {
  (void)p, (void)inputs, (void)outputs;
  return refuse(d);
}
int cuda_plan_time(CudaPlan *p, int warmup, int repeats, CudaTiming *t, Diag *d) {
  (void)p, (void)warmup, (void)repeats, (void)t;
  return refuse(d);
}
size_t cuda_plan_device_bytes(const CudaPlan *p) {
  (void)p;
  return 0;
}
int cuda_plan_n_steps(const CudaPlan *p) {
  (void)p;
  return 0;
}
const char *cuda_plan_step_note(const CudaPlan *p, int step, int *node_id) {
  (void)p, (void)step;
  if (node_id) *node_id = -1;
  return "";
}
int cuda_plan_time_steps(CudaPlan *p, int repeats, double *us, Diag *d) {
  (void)p, (void)repeats, (void)us;
  return refuse(d);
}
int cuda_profile_node(CudaDevice *dev, const Graph *g, int id, int repeats, CudaProfile *out,
                      Diag *d) {
  (void)dev, (void)g, (void)id, (void)repeats;
  memset(out, 0, sizeof *out);
  return refuse(d);
}
int cuda_kernel_on_host(const char *way, const Node *n, Tensor *const *in, Tensor *out,
                        Diag *d) {
  (void)way, (void)n, (void)in, (void)out;
  return refuse(d);
}
int cuda_matmul_on_host(const Node *n, const Shape *shapes, const float *const *data,
                        const int64_t *const *strides, float *y, const int64_t *y_strides,
                        Diag *d) {
  (void)n, (void)shapes, (void)data, (void)strides, (void)y, (void)y_strides;
  return refuse(d);
}
