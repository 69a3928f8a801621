/* pool.cu: GPU kernels of the pool family (rows in runtime/ops/pool.c): 2-D
 * maxpool and avgpool, global_avgpool and global_maxpool.
 *
 * Windows are small, so a 2-D pool runs one thread per output element. It
 * visits the window's taps that fall inside the input, column by column
 * and each column top to bottom, which is the order the CPU's separable
 * kernel combines them in (its rows folded first, then the columns): the
 * averages agree to the bit and max pooling treats NaN as the CPU does.
 * Window, divisor, empty windows and the output extents (from the output
 * shape, which shape inference computed with ceil_mode) are as pool.c.
 *
 * Indices are int where everything fits (cheaper divisions), else int64.
 *
 * A global pool reduces each (n, c) plane: 8 threads per plane when planes
 * are tiny (7x7 at the end of a CNN), a warp per plane up to 2048
 * elements, a block per plane beyond. Averages sum in double and divide in
 * double, as the CPU; the maximum keeps a leading NaN and skips later ones,
 * as the CPU's loop does. */
#include <float.h>
#include <math.h>

#include "runtime/cuda/cuda_int.h"

/* Everything but the rows' entry points is private to this file. */
namespace {

static const unsigned FULL_MASK = 0xffffffffu;

/* The window geometry of one pool, passed by value. */
struct PoolArgs {
  int64_t h, w, oh, ow;  /* input and output planes */
  int64_t kh, kw, sh, sw, dh, dw;
  int64_t pt, pl, pb, pr;
  bool include_pad;      /* avgpool's count_include_pad */
  int64_t total;         /* output elements */
};

/* Taps [lo, hi) of a window starting at `start` with k taps dl apart that
 * fall inside [0, in): family.h's tap_range. */
template <class I>
__device__ __forceinline__ void tap_range(I start, I k, I dl, I in, I *lo, I *hi) {
  *lo = start >= 0 ? 0 : (-start + dl - 1) / dl;
  *hi = in - start <= 0 ? 0 : (in - start + dl - 1) / dl;
  if (*hi > k) *hi = k;
  if (*lo > *hi) *lo = *hi;
}

/* One thread per output, indices in I: int where the input and output fit
 * (its divisions are several times cheaper than int64_t's). An empty
 * window (only with dilation) gives the lowest float for a max, 0 for an
 * average, as the CPU. */
template <bool IS_MAX, class I>
__global__ void pool2d(const float *x, float *y, PoolArgs pa) {
  const I h = (I)pa.h, w = (I)pa.w, oh = (I)pa.oh, ow = (I)pa.ow, kh = (I)pa.kh, kw = (I)pa.kw;
  const I sh = (I)pa.sh, sw = (I)pa.sw, dh = (I)pa.dh, dw = (I)pa.dw;
  const I pt = (I)pa.pt, pl = (I)pa.pl, pb = (I)pa.pb, pr = (I)pa.pr;
  for (I t = blockIdx.x * (I)blockDim.x + threadIdx.x; t < (I)pa.total;
       t += (I)gridDim.x * blockDim.x) {
    I ox = t % ow, rest = t / ow;
    I oy = rest % oh, plane = rest / oh;
    I y0 = oy * sh - pt, x0 = ox * sw - pl, ilo, ihi, jlo, jhi;
    tap_range<I>(y0, kh, dh, h, &ilo, &ihi);
    tap_range<I>(x0, kw, dw, w, &jlo, &jhi);
    I rows = ihi - ilo;
    float acc = IS_MAX ? -FLT_MAX : 0.0f;
    if (rows > 0) {
      const float *top = x + plane * h * w + (y0 + ilo * dh) * w + x0;
      I row_step = dh * w;
      for (I j = jlo; j < jhi; j++) {
        const float *col = top + j * dw;
        float r = col[0];
        for (I i = 1; i < rows; i++) {
          float v = col[i * row_step];
          r = IS_MAX ? (v > r ? v : r) : r + v;
        }
        acc = IS_MAX ? (r > acc ? r : acc) : acc + r;
      }
      if (!IS_MAX) {
        I y1 = y0 + kh < h + pb ? y0 + kh : h + pb;
        I x1 = x0 + kw < w + pr ? x0 + kw : w + pr;
        I cnt = pa.include_pad ? (y1 - y0) * (x1 - x0) : rows * (jhi - jlo);
        acc = cnt ? acc / (float)cnt : 0.0f;
      }
    }
    y[t] = acc;
  }
}

template <bool IS_MAX>
static int pool_eval(CUDA_KERNEL_SIGNATURE) {
  const char *name = op_def(n->kind)->name;
  if (in[0].dtype != DT_F32 || out[0].dtype != DT_F32)
    return diag_error(d, "%s: GPU kernel takes float32\n", name);
  const Shape *xs = &in[0].shape, *ys = &out[0].shape;
  if (xs->ndim != 4 || ys->ndim != 4)
    return diag_error(d, "%s: expected [N, C, H, W] input and output\n", name);
  const Params *p = &n->params;
  PoolArgs a;
  a.h = xs->d[2], a.w = xs->d[3], a.oh = ys->d[2], a.ow = ys->d[3];
  a.kh = p->v[POOL_KERNEL].i[0], a.kw = p->v[POOL_KERNEL].i[1];
  a.sh = p->v[POOL_STRIDE].i[0], a.sw = p->v[POOL_STRIDE].i[1];
  a.pt = p->v[POOL_PADS].i[0], a.pl = p->v[POOL_PADS].i[1];
  a.pb = p->v[POOL_PADS].i[2], a.pr = p->v[POOL_PADS].i[3];
  a.dh = IS_MAX ? p->v[POOL_DILATION].i[0] : 1;
  a.dw = IS_MAX ? p->v[POOL_DILATION].i[1] : 1;
  a.include_pad = !IS_MAX && p->v[AVG_COUNT_PAD].i[0] != 0;
  a.total = shape_numel(ys);
  if (a.total == 0) return TEQ_OK;
  const int threads = 256;
  const float *x = (const float *)in[0].data;
  float *y = (float *)out[0].data;
  /* int indices when every offset, window reach and grid-stride step fits. */
  int64_t reach = shape_numel(xs) + (a.kh * a.dh + a.sh) * a.w + a.kw * a.dw + a.sw;
  bool small = a.total + (int64_t)threads * cuda_blocks(a.total, threads) < INT32_MAX &&
               reach < INT32_MAX / 2;
  if (small)
    pool2d<IS_MAX, int><<<cuda_blocks(a.total, threads), threads, 0, cx->stream>>>(x, y, a);
  else
    pool2d<IS_MAX, int64_t><<<cuda_blocks(a.total, threads), threads, 0, cx->stream>>>(x, y, a);
  CUDA_LAUNCHED();
  return TEQ_OK;
}

}  // namespace

extern "C" int cuda_eval_maxpool(CUDA_KERNEL_SIGNATURE) {
  return pool_eval<true>(n, cx, in, out, d);
}
extern "C" int cuda_eval_avgpool(CUDA_KERNEL_SIGNATURE) {
  return pool_eval<false>(n, cx, in, out, d);
}

namespace {

/* ---- global pools ---- */

/* The maximum ignoring NaN (a NaN never compares greater), and the sum. */
struct GlobalMax {
  typedef float Acc;
  static __device__ Acc init() { return -INFINITY; }
  static __device__ Acc join(Acc a, float v) { return v > a ? v : a; }
  /* The CPU starts from the plane's first element and keeps it if NaN. */
  static __device__ float post(Acc a, const float *xp, int64_t) {
    return xp[0] != xp[0] ? xp[0] : a;
  }
};

struct GlobalAvg {
  typedef double Acc;
  static __device__ Acc init() { return 0.0; }
  static __device__ Acc join(Acc a, double v) { return a + v; }
  static __device__ float post(Acc a, const float *, int64_t size) {
    return (float)(a / (double)size);
  }
};

/* The join over each aligned group of W lanes of a warp, returned to all. */
template <class Op, int W>
__device__ __forceinline__ typename Op::Acc warp_join(typename Op::Acc a) {
  for (int off = W / 2; off > 0; off >>= 1) a = Op::join(a, __shfl_xor_sync(FULL_MASK, a, off));
  return a;
}

/* G threads per plane: part of a warp (G 8), a warp (G 32) or the whole
 * block (G blockDim.x). */
template <class Op, int G>
__global__ void global_pool(const float *x, float *y, int64_t planes, int64_t size) {
  __shared__ typename Op::Acc part[32];
  const int per_block = blockDim.x / G;
  int lane = threadIdx.x % G;
  /* Every thread of a block runs the same iterations: the block-wide join
   * below is reached by all. */
  for (int64_t base = (int64_t)blockIdx.x * per_block; base < planes;
       base += (int64_t)gridDim.x * per_block) {
    int64_t plane = base + threadIdx.x / G;
    bool live = plane < planes;
    const float *xp = x + (live ? plane : 0) * size;
    typename Op::Acc a = Op::init();
    if (live)
      for (int64_t i = lane; i < size; i += G) a = Op::join(a, xp[i]);
    a = warp_join<Op, (G < 32 ? G : 32)>(a);
    if (G > 32) {
      int wl = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
      __syncthreads(); /* part may still be read by the previous plane */
      if (wl == 0) part[warp] = a;
      __syncthreads();
      a = wl < warps ? part[wl] : Op::init();
      a = warp_join<Op, 32>(a);
    }
    if (live && lane == 0) y[plane] = Op::post(a, xp, size);
  }
}

template <class Op>
static int global_eval(CUDA_KERNEL_SIGNATURE) {
  const char *name = op_def(n->kind)->name;
  if (in[0].dtype != DT_F32 || out[0].dtype != DT_F32)
    return diag_error(d, "%s: GPU kernel takes float32\n", name);
  const Shape *xs = &in[0].shape;
  if (xs->ndim < 3) return diag_error(d, "%s: expected [N, C, spatial...] input\n", name);
  int64_t planes = xs->d[0] * xs->d[1], size = 1;
  for (int i = 2; i < xs->ndim; i++) size *= xs->d[i];
  if (planes == 0) return TEQ_OK;
  if (size == 0) return diag_error(d, "%s: empty spatial dimension\n", name);
  const float *x = (const float *)in[0].data;
  float *y = (float *)out[0].data;
  const int threads = 256;
  if (size <= 64) { /* a 7x7 plane would leave most of a warp idle */
    global_pool<Op, 8><<<cuda_blocks(planes, threads / 8), threads, 0, cx->stream>>>(
        x, y, planes, size);
    cuda_note(cx, "8 threads per plane");
  } else if (size <= 2048) {
    global_pool<Op, 32><<<cuda_blocks(planes, threads / 32), threads, 0, cx->stream>>>(
        x, y, planes, size);
    cuda_note(cx, "warp per plane");
  } else {
    global_pool<Op, 512><<<cuda_blocks(planes, 1), 512, 0, cx->stream>>>(x, y, planes, size);
    cuda_note(cx, "block per plane");
  }
  CUDA_LAUNCHED();
  return TEQ_OK;
}

}  // namespace

extern "C" int cuda_eval_global_avgpool(CUDA_KERNEL_SIGNATURE) {
  return global_eval<GlobalAvg>(n, cx, in, out, d);
}
extern "C" int cuda_eval_global_maxpool(CUDA_KERNEL_SIGNATURE) {
  return global_eval<GlobalMax>(n, cx, in, out, d);
}
