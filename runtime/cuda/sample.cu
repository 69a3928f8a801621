/* sample.cu: the GPU kernel of grid_sample (runtime/ops/sample.c): one
 * thread per output element, each running the CPU row's own gs_sample
 * (family.h), so the two agree to the bit. */
#include "runtime/cuda/cuda_int.h"

namespace {

__global__ void grid_sample_kernel(const float *__restrict__ x, const float *__restrict__ grid,
                                   float *__restrict__ y, int64_t c, int64_t h, int64_t w,
                                   int64_t outs, int64_t total, int mode, int padding,
                                   bool align) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t p = i % outs, plane = i / outs, b = plane / c;
    const float *g = grid + (b * outs + p) * 2;
    y[i] = gs_sample(x + plane * h * w, h, w, g[0], g[1], mode, padding, align);
  }
}

}  // namespace

extern "C" int cuda_eval_grid_sample(CUDA_KERNEL_SIGNATURE) {
  const Shape &xs = in[0].shape, &gsh = in[1].shape;
  if (in[0].dtype != DT_F32 || in[1].dtype != DT_F32 || xs.ndim != 4 || gsh.ndim != 4)
    return diag_error(d, "grid_sample: the GPU kernel takes float32 [N, C, H, W] and grid\n");
  int64_t total = shape_numel(&out[0].shape);
  if (total == 0) return TEQ_OK;
  const Params *p = &n->params;
  grid_sample_kernel<<<cuda_blocks(total, 256), 256, 0, cx->stream>>>(
      (const float *)in[0].data, (const float *)in[1].data, (float *)out[0].data, xs.d[1],
      xs.d[2], xs.d[3], gsh.d[1] * gsh.d[2], total, (int)param_int(p, GS_MODE),
      (int)param_int(p, GS_PADDING), param_int(p, GS_ALIGN) != 0);
  CUDA_LAUNCHED();
  return TEQ_OK;
}
