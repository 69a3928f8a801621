/* pool.cu: GPU kernels of the pool family (rows in runtime/ops/pool.c and
 * pool3d.c): 2-D and 3-D maxpool and avgpool, global_avgpool and
 * global_maxpool.
 *
 * Windows are small, so a 2-D pool runs one thread per output element, a
 * plane per block row (pool_at, which cuda_kernel_on_host also runs on the
 * host, where a test holds it to the CPU row bit for bit). It
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
 * fall inside [0, in): family.h's tap_range, without a division where the
 * taps are adjacent (every avgpool, most maxpools). */
template <class I>
__host__ __device__ __forceinline__ void tap_range(I start, I k, I dl, I in, I *lo, I *hi) {
  if (dl == 1) {
    *lo = start >= 0 ? 0 : -start;
    *hi = in - start <= 0 ? 0 : in - start;
  } else {
    *lo = start >= 0 ? 0 : (-start + dl - 1) / dl;
    *hi = in - start <= 0 ? 0 : (in - start + dl - 1) / dl;
  }
  if (*hi > k) *hi = k;
  if (*lo > *hi) *lo = *hi;
}

/* Output (oy, ox) of one plane xp, indices in I. An empty window (only
 * with dilation) gives the lowest float for a max, 0 for an average, as
 * the CPU. */
template <bool IS_MAX, class I>
__host__ __device__ __forceinline__ float pool_at(const float *xp, const PoolArgs &pa, I oy,
                                                  I ox) {
  const I h = (I)pa.h, w = (I)pa.w, kh = (I)pa.kh, kw = (I)pa.kw;
  const I sh = (I)pa.sh, sw = (I)pa.sw, dh = (I)pa.dh, dw = (I)pa.dw;
  const I pt = (I)pa.pt, pl = (I)pa.pl, pb = (I)pa.pb, pr = (I)pa.pr;
  I y0 = oy * sh - pt, x0 = ox * sw - pl, ilo, ihi, jlo, jhi;
  tap_range<I>(y0, kh, dh, h, &ilo, &ihi);
  tap_range<I>(x0, kw, dw, w, &jlo, &jhi);
  I rows = ihi - ilo;
  float acc = IS_MAX ? -FLT_MAX : 0.0f;
  if (rows > 0) {
    I top = (y0 + ilo * dh) * w + x0, row_step = dh * w; /* top + jlo dw is inside */
    for (I j = jlo; j < jhi; j++) {
      I col = top + j * dw;
      float r = xp[col];
      for (I i = 1; i < rows; i++) {
        float v = xp[col + i * row_step];
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
  return acc;
}

/* On cuda_plane_grid: a plane (image, channel) per block row, its outputs
 * along x, one thread each (one division per output where the flat index
 * took four). */
template <bool IS_MAX, class I>
__global__ void pool2d(const float *x, float *y, PoolArgs pa, I planes) {
  const I plane = (I)(pa.oh * pa.ow), in_plane = (I)(pa.h * pa.w), ow = (I)pa.ow;
  for (I pl = blockIdx.y; pl < planes; pl += gridDim.y) {
    const float *xp = x + pl * in_plane;
    float *yp = y + pl * plane;
    for (I p = blockIdx.x * (I)blockDim.x + threadIdx.x; p < plane;
         p += (I)gridDim.x * blockDim.x) {
      I oy = p / ow;
      yp[p] = pool_at<IS_MAX, I>(xp, pa, oy, p - oy * ow);
    }
  }
}

/* The window geometry of pool node n, as pool.c reads it. */
static int pool_args(const Node *n, const Shape *xs, const Shape *ys, bool is_max, PoolArgs *a,
                     Diag *d) {
  const char *name = op_def(n->kind)->name;
  if (xs->ndim != 4 || ys->ndim != 4)
    return diag_error(d, "%s: expected [N, C, H, W] input and output\n", name);
  const Params *p = &n->params;
  a->h = xs->d[2], a->w = xs->d[3], a->oh = ys->d[2], a->ow = ys->d[3];
  a->kh = p->v[POOL_KERNEL].i[0], a->kw = p->v[POOL_KERNEL].i[1];
  a->sh = p->v[POOL_STRIDE].i[0], a->sw = p->v[POOL_STRIDE].i[1];
  a->pt = p->v[POOL_PADS].i[0], a->pl = p->v[POOL_PADS].i[1];
  a->pb = p->v[POOL_PADS].i[2], a->pr = p->v[POOL_PADS].i[3];
  a->dh = is_max ? p->v[POOL_DILATION].i[0] : 1;
  a->dw = is_max ? p->v[POOL_DILATION].i[1] : 1;
  a->include_pad = !is_max && p->v[AVG_COUNT_PAD].i[0] != 0;
  a->total = shape_numel(ys);
  return TEQ_OK;
}

template <bool IS_MAX>
static int pool_eval(CUDA_KERNEL_SIGNATURE) {
  const char *name = op_def(n->kind)->name;
  if (in[0].dtype != DT_F32 || out[0].dtype != DT_F32)
    return diag_error(d, "%s: GPU kernel takes float32\n", name);
  const Shape *xs = &in[0].shape, *ys = &out[0].shape;
  PoolArgs a;
  int rc = pool_args(n, xs, ys, IS_MAX, &a, d);
  if (rc) return rc;
  if (a.total == 0) return TEQ_OK;
  int64_t plane = a.oh * a.ow, planes = xs->d[0] * xs->d[1];
  int threads = cuda_row_threads(plane, 256);
  dim3 grid = cuda_plane_grid(planes, plane, threads);
  const float *x = (const float *)in[0].data;
  float *y = (float *)out[0].data;
  /* int indices when every offset, window reach and grid-stride step fits. */
  int64_t reach = shape_numel(xs) + (a.kh * a.dh + a.sh) * a.w + a.kw * a.dw + a.sw;
  bool small = a.total + (int64_t)threads * grid.x < INT32_MAX && reach < INT32_MAX / 2;
  if (small)
    pool2d<IS_MAX, int><<<grid, threads, 0, cx->stream>>>(x, y, a, (int)planes);
  else
    pool2d<IS_MAX, int64_t><<<grid, threads, 0, cx->stream>>>(x, y, a, planes);
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

/* ---- 3-D pools (rows in runtime/ops/pool3d.c) ---- */

namespace {

/* One thread per output, running the CPU row's pool3_at_f32 (family.h). */
__global__ void pool3d_kernel(const float *__restrict__ x, float *__restrict__ y, Pool3Geom g,
                              int64_t total) {
  const int64_t vol = g.in[0] * g.in[1] * g.in[2];
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t o[3], r = i;
    for (int ax = 2; ax >= 0; ax--) o[ax] = r % g.out[ax], r /= g.out[ax];
    y[i] = pool3_at_f32(&g, x + r * vol, o); /* r: the plane */
  }
}

int pool3d_eval(CUDA_KERNEL_SIGNATURE) {
  if (in[0].dtype != DT_F32)
    return diag_error(d, "%s: GPU kernel takes float32\n", op_def(n->kind)->name);
  Pool3Geom g;
  int rc = pool3_geom(n, &in[0].shape, &g, d);
  int64_t total = shape_numel(&out[0].shape);
  if (rc || total == 0) return rc;
  pool3d_kernel<<<cuda_blocks(total, 256), 256, 0, cx->stream>>>(
      (const float *)in[0].data, (float *)out[0].data, g, total);
  CUDA_LAUNCHED();
  return TEQ_OK;
}

}  // namespace

extern "C" int cuda_eval_maxpool3d(CUDA_KERNEL_SIGNATURE) {
  return pool3d_eval(n, cx, in, out, d);
}
extern "C" int cuda_eval_avgpool3d(CUDA_KERNEL_SIGNATURE) {
  return pool3d_eval(n, cx, in, out, d);
}

/* pool_at on the host, plane by plane in the kernel's order (see
 * cuda_kernel_on_host). */
int cuda_pool_on_host(const Node *n, Tensor *const *in, Tensor *out, Diag *d) {
  bool is_max = n->kind == OP_MAXPOOL;
  PoolArgs a;
  int rc = pool_args(n, &in[0]->shape, &out->shape, is_max, &a, d);
  if (rc) return rc;
  int64_t plane = a.oh * a.ow, in_plane = a.h * a.w, planes = in[0]->shape.d[0] * in[0]->shape.d[1];
  const float *x = (const float *)in[0]->data;
  float *y = (float *)out->data;
  for (int64_t pl = 0; pl < planes; pl++)
    for (int64_t p = 0; p < plane; p++)
      y[pl * plane + p] = is_max ? pool_at<true, int64_t>(x + pl * in_plane, a, p / a.ow, p % a.ow)
                                 : pool_at<false, int64_t>(x + pl * in_plane, a, p / a.ow,
                                                           p % a.ow);
  return TEQ_OK;
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
