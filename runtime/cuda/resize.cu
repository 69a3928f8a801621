/* resize.cu: the GPU kernel of resize (runtime/ops/resize.c): ONNX Resize
 * of an NCHW tensor over H and W, nearest-neighbour (four rounding rules)
 * or bilinear, under half_pixel, asymmetric, align_corners and
 * pytorch_half_pixel coordinates.
 *
 * The taps (two input indices and a weight per output row and per output
 * column) are computed first, in double exactly as resize.c's axis_taps,
 * so nearest picks the same input element as the CPU; then one thread per
 * output element mixes its four neighbours. */
#include "runtime/cuda/cuda_int.h"

namespace {

constexpr int kThreads = 256;

struct Tap {
  int32_t i0, i1; /* input indices (SPATIAL_MAX bounds the extents) */
  float w1;       /* weight of i1 */
};

/* How one axis maps: scale is out/in when sizes were given. */
struct AxisMap {
  double scale;
  int64_t in, out;
};

/* source_coord of resize.c. The product is rounded on its own
 * (__dmul_rn) so that nvcc cannot fuse it into len - 1: the host computes
 * it unfused, and nearest must land on the same side of a tie. */
__device__ double source_coord(int coord, int64_t x, double scale, int64_t in) {
  double len = __dmul_rn((double)in, scale);
  switch (coord) {
  case COORD_ASYMMETRIC: return (double)x / scale;
  case COORD_ALIGN_CORNERS: return len == 1 ? 0.0 : (double)x * (double)(in - 1) / (len - 1);
  case COORD_PYTORCH_HALF_PIXEL: return len > 1 ? ((double)x + 0.5) / scale - 0.5 : 0.0;
  default: return ((double)x + 0.5) / scale - 0.5;
  }
}

/* round_nearest of resize.c. */
__device__ int64_t round_nearest(int rule, double v) {
  double f = floor(v);
  switch (rule) {
  case NEAREST_FLOOR: return (int64_t)f;
  case NEAREST_CEIL: return (int64_t)ceil(v);
  case NEAREST_ROUND_PREFER_CEIL: return (int64_t)(v - f >= 0.5 ? f + 1 : f);
  default: return (int64_t)(v - f > 0.5 ? f + 1 : f);
  }
}

/* Taps of the H axis into t[0..oh), of the W axis into t[oh..oh+ow). */
__global__ void taps_kernel(Tap *t, AxisMap h, AxisMap w, int mode, int coord, int rule) {
  int64_t total = h.out + w.out;
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
       k += gridDim.x * (int64_t)blockDim.x) {
    bool is_h = k < h.out;
    const AxisMap &a = is_h ? h : w;
    int64_t x = is_h ? k : k - h.out;
    double v = source_coord(coord, x, a.scale, a.in);
    if (mode == MODE_NEAREST) {
      int64_t i = round_nearest(rule, v);
      i = i < 0 ? 0 : i >= a.in ? a.in - 1 : i;
      t[k] = Tap{(int32_t)i, (int32_t)i, 0.0f};
      continue;
    }
    v = v < 0 ? 0 : v > (double)(a.in - 1) ? (double)(a.in - 1) : v;
    int64_t i0 = (int64_t)floor(v);
    t[k] = Tap{(int32_t)i0, (int32_t)(i0 + 1 < a.in ? i0 + 1 : i0), (float)(v - (double)i0)};
  }
}

/* One thread per output element (plane, oy, ox); consecutive threads run
 * along ox, so writes coalesce and reads stay within two input rows. */
template <typename I>
__global__ void resize_linear_kernel(float *__restrict__ y, const float *__restrict__ x,
                                     const Tap *__restrict__ t, int64_t h, int64_t w, int64_t oh,
                                     int64_t ow, int64_t total) {
  const Tap *tw = t + oh;
  for (I i = (I)(blockIdx.x * (int64_t)blockDim.x + threadIdx.x); i < (I)total;
       i += (I)(gridDim.x * (int64_t)blockDim.x)) {
    I ox = i % (I)ow, rest = i / (I)ow;
    I oy = rest % (I)oh, pl = rest / (I)oh;
    Tap a = t[oy], b = tw[ox];
    const float *r0 = x + (pl * (I)h + a.i0) * (I)w, *r1 = x + (pl * (I)h + a.i1) * (I)w;
    float top = r0[b.i0] + b.w1 * (r0[b.i1] - r0[b.i0]);
    float bot = r1[b.i0] + b.w1 * (r1[b.i1] - r1[b.i0]);
    y[i] = top + a.w1 * (bot - top);
  }
}

template <typename I>
__global__ void resize_nearest_kernel(float *__restrict__ y, const float *__restrict__ x,
                                      const Tap *__restrict__ t, int64_t h, int64_t w,
                                      int64_t oh, int64_t ow, int64_t total) {
  const Tap *tw = t + oh;
  for (I i = (I)(blockIdx.x * (int64_t)blockDim.x + threadIdx.x); i < (I)total;
       i += (I)(gridDim.x * (int64_t)blockDim.x)) {
    I ox = i % (I)ow, rest = i / (I)ow;
    I oy = rest % (I)oh, pl = rest / (I)oh;
    y[i] = x[(pl * (I)h + t[oy].i0) * (I)w + tw[ox].i0];
  }
}

} // namespace

extern "C" int cuda_eval_resize(CUDA_KERNEL_SIGNATURE) {
  if (in[0].dtype != DT_F32 || out[0].dtype != DT_F32)
    return diag_error(d, "resize: %s input on the GPU: only float32", dtype_name(in[0].dtype));
  const Params *p = &n->params;
  const Shape &s = in[0].shape;
  int64_t planes = s.d[0] * s.d[1], h = s.d[2], w = s.d[3];
  int64_t oh = out[0].shape.d[2], ow = out[0].shape.d[3];
  int64_t total = planes * oh * ow;
  if (total == 0) return TEQ_OK;
  if (h == 0 || w == 0)
    return diag_error(d, "resize: input %lldx%lld has no element to sample", (long long)h,
                      (long long)w);
  AxisMap mh = {p->v[RS_SIZES].i[0] ? (double)oh / (double)h : param_float(p, RS_SCALE_H), h, oh};
  AxisMap mw = {p->v[RS_SIZES].i[1] ? (double)ow / (double)w : param_float(p, RS_SCALE_W), w, ow};
  int mode = (int)param_int(p, RS_MODE);
  Tap *t = (Tap *)cuda_scratch(cx, (size_t)(oh + ow) * sizeof(Tap), d);
  if (!t) return TEQ_ERR_NOMEM;
  taps_kernel<<<cuda_blocks(oh + ow, kThreads), kThreads, 0, cx->stream>>>(
      t, mh, mw, mode, (int)param_int(p, RS_COORD), (int)param_int(p, RS_NEAREST));
  CUDA_LAUNCHED();
  unsigned blocks = cuda_blocks(total, kThreads);
  float *y = (float *)out[0].data;
  const float *x = (const float *)in[0].data;
  /* int indexing while the tensors stay far from 2^31 elements */
  const int64_t lim = INT64_C(1) << 30;
  bool small = total < lim && planes * h * w < lim;
  if (mode == MODE_NEAREST && small)
    resize_nearest_kernel<int><<<blocks, kThreads, 0, cx->stream>>>(y, x, t, h, w, oh, ow, total);
  else if (mode == MODE_NEAREST)
    resize_nearest_kernel<int64_t><<<blocks, kThreads, 0, cx->stream>>>(y, x, t, h, w, oh, ow,
                                                                         total);
  else if (small)
    resize_linear_kernel<int><<<blocks, kThreads, 0, cx->stream>>>(y, x, t, h, w, oh, ow, total);
  else
    resize_linear_kernel<int64_t><<<blocks, kThreads, 0, cx->stream>>>(y, x, t, h, w, oh, ow,
                                                                        total);
  CUDA_LAUNCHED();
  return TEQ_OK;
}
