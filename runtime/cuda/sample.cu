/* sample.cu: the GPU kernel of grid_sample (runtime/ops/sample.c): one
 * thread per output element, the CPU row's float32 arithmetic step for
 * step (position to pixels, padding, then bilinear's four taps or
 * nearest's rounding half to even), so the two agree but for the
 * compilers' rounding of the same expressions. */
#include <math.h>

#include "runtime/cuda/cuda_int.h"

namespace {

__device__ float gs_reflect(float v, float lo2, float hi2) {
  if (lo2 == hi2) return 0.0f;
  float lo = lo2 / 2, span = (hi2 - lo2) / 2;
  v = fabsf(v - lo);
  float extra = fmodf(v, span);
  int flips = (int)floorf(v / span);
  return flips % 2 == 0 ? extra + lo : span - extra + lo;
}

__device__ float gs_source(float g, int64_t size, bool align, int padding) {
  float v = align ? __fmul_rn((g + 1) / 2, (float)(size - 1))
                  : (__fmul_rn(g + 1, (float)size) - 1) / 2;
  if (padding == GS_PAD_BORDER) {
    v = fminf(fmaxf(v, 0.0f), (float)(size - 1));
  } else if (padding == GS_PAD_REFLECTION) {
    v = align ? gs_reflect(v, 0.0f, 2.0f * (float)(size - 1))
              : gs_reflect(v, -1.0f, 2.0f * (float)size - 1.0f);
    v = fminf(fmaxf(v, 0.0f), (float)(size - 1));
  }
  return v;
}

__device__ float gs_tap(const float *plane, int64_t h, int64_t w, int64_t y, int64_t x) {
  return y >= 0 && y < h && x >= 0 && x < w ? plane[y * w + x] : 0.0f;
}

__global__ void grid_sample_kernel(const float *__restrict__ x, const float *__restrict__ grid,
                                   float *__restrict__ y, int64_t c, int64_t h, int64_t w,
                                   int64_t outs, int64_t total, int mode, int padding,
                                   bool align) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t p = i % outs, plane_i = i / outs, b = plane_i / c;
    const float *plane = x + plane_i * h * w, *g = grid + (b * outs + p) * 2;
    float sx = gs_source(g[0], w, align, padding), sy = gs_source(g[1], h, align, padding);
    float v;
    if (mode == GS_NEAREST) {
      v = gs_tap(plane, h, w, (int64_t)nearbyintf(sy), (int64_t)nearbyintf(sx));
    } else {
      float x0 = floorf(sx), y0 = floorf(sy), fx = sx - x0, fy = sy - y0;
      int64_t ix = (int64_t)x0, iy = (int64_t)y0;
      float top = __fadd_rn(__fmul_rn(1 - fx, gs_tap(plane, h, w, iy, ix)),
                            __fmul_rn(fx, gs_tap(plane, h, w, iy, ix + 1)));
      float bottom = __fadd_rn(__fmul_rn(1 - fx, gs_tap(plane, h, w, iy + 1, ix)),
                               __fmul_rn(fx, gs_tap(plane, h, w, iy + 1, ix + 1)));
      v = __fadd_rn(__fmul_rn(1 - fy, top), __fmul_rn(fy, bottom));
    }
    y[i] = v;
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
