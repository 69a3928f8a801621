/* norm.cu: GPU kernels of the normalization family (runtime/ops/norm.c):
 * layer_norm, instance_norm and lrn.
 *
 * layer_norm and instance_norm standardize rows -- the trailing axes from
 * `axis` on, or each (n, c) plane -- with one warp per row when rows are
 * short and one block per row otherwise. Like the CPU they take the mean
 * and then the variance around it (two passes) in double, so the results
 * agree to float32 rounding whatever the order of the sums. lrn gives each
 * output element a thread that sums its window of channels in double, in
 * the CPU's order. */
#include <math.h>
#include <string.h>

#include "runtime/cuda/cuda_int.h"

enum { NORM_THREADS = 256, NORM_WARPS = NORM_THREADS / 32 };

static int check_f32(const Node *n, const CudaTensor *in, const CudaTensor *out, Diag *d) {
  for (int i = 0; i < n->n_in; i++)
    if (in[i].dtype != DT_F32)
      return diag_error(d, "%s: input %d is %s, expected float32", op_def(n->kind)->name, i,
                        dtype_name(in[i].dtype));
  if (out[0].dtype != DT_F32)
    return diag_error(d, "%s: output is %s, expected float32", op_def(n->kind)->name,
                      dtype_name(out[0].dtype));
  return TEQ_OK;
}

static int64_t prod_dims(const Shape *s, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= s->d[i];
  return p;
}

/* ---- standardizing rows ---- */

/* Where the scale and bias are read: per position in the row (period 0,
 * layer_norm) or one value per row repeating every `period` rows
 * (instance_norm's channels). bias may be NULL. */
struct Affine {
  const float *scale, *bias;
  int64_t period;
};

/* The sum of v over the GROUP threads of a row (a warp, or the whole
 * block), given to every one of them. A block-wide sum uses `partial` and
 * must be reached by the whole block. */
template <int GROUP>
__device__ __forceinline__ double group_sum(double v, double *partial) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (GROUP == 32) return v;
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  double s = 0;
#pragma unroll
  for (int w = 0; w < GROUP / 32; w++) s += partial[w];
  __syncthreads(); /* partial is free again for the next sum */
  return s;
}

/* The CPU's norm_rows_f32: rows of len values, GROUP threads per row (32
 * or the block's NORM_THREADS), rows grid-strided. */
template <int GROUP>
__global__ void norm_rows(const float *x, float *y, int64_t rows, int64_t len, double eps,
                          Affine a) {
  __shared__ double partial[NORM_WARPS];
  const int lane = threadIdx.x % GROUP, per_block = NORM_THREADS / GROUP;
  for (int64_t r = (int64_t)blockIdx.x * per_block + threadIdx.x / GROUP; r < rows;
       r += (int64_t)gridDim.x * per_block) {
    const float *xr = x + r * len;
    float *yr = y + r * len;
    double s = 0;
    for (int64_t j = lane; j < len; j += GROUP) s += xr[j];
    double mean = group_sum<GROUP>(s, partial) / (double)len;
    double v = 0;
    for (int64_t j = lane; j < len; j += GROUP) {
      double t = xr[j] - mean;
      v += t * t;
    }
    double inv = 1.0 / sqrt(group_sum<GROUP>(v, partial) / (double)len + eps);
    int64_t at = a.period ? r % a.period : 0, step = a.period ? 0 : 1;
    for (int64_t j = lane; j < len; j += GROUP) {
      /* __fmul_rn: no fma with the bias, which the CPU does not do. */
      float z = __fmul_rn((float)((xr[j] - mean) * inv), a.scale[at + j * step]);
      yr[j] = a.bias ? z + a.bias[at + j * step] : z;
    }
  }
}

static int norm_rows_run(CudaCtx *cx, const float *x, float *y, int64_t rows, int64_t len,
                         double eps, Affine a, Diag *d) {
  if (len <= 1024) {
    norm_rows<32><<<cuda_blocks(rows, NORM_WARPS), NORM_THREADS, 0, cx->stream>>>(x, y, rows, len,
                                                                                  eps, a);
    cuda_note(cx, "warp per row");
  } else {
    norm_rows<NORM_THREADS><<<cuda_blocks(rows, 1), NORM_THREADS, 0, cx->stream>>>(x, y, rows, len,
                                                                                   eps, a);
    cuda_note(cx, "block per row");
  }
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* ---- layer_norm ---- */

/* How a scale or bias tensor maps onto one row of x normalized from axis
 * on: x's extents there, and the tensor's stride along each (0 where it
 * broadcasts). */
struct RowSpread {
  int axis, rank;
  int64_t dim[TEQ_MAX_DIMS], stride[TEQ_MAX_DIMS];
};

static RowSpread row_spread(const Shape *t, const Shape *x, int axis) {
  RowSpread s;
  memset(&s, 0, sizeof s);
  s.axis = axis;
  s.rank = x->ndim;
  int off = x->ndim - t->ndim;
  int64_t st = 1;
  for (int k = x->ndim - 1; k >= axis; k--) {
    s.dim[k] = x->d[k];
    bool varies = k >= off && t->d[k - off] != 1;
    s.stride[k] = varies ? st : 0;
    if (k >= off) st *= t->d[k - off];
  }
  return s;
}

/* dst[0..len) = t spread over a row: the CPU's spread_over_row. */
__global__ void spread_over_row(const float *t, float *dst, int64_t len, RowSpread s) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < len;
       j += (int64_t)gridDim.x * blockDim.x) {
    int64_t rest = j, at = 0;
    for (int k = s.rank - 1; k >= s.axis; k--) {
      at += (rest % s.dim[k]) * s.stride[k];
      rest /= s.dim[k];
    }
    dst[j] = t[at];
  }
}

/* Scale and bias are used as they are when they hold one value per row
 * position (the usual [len] or x's trailing shape: a tensor that broadcasts
 * to the row without growing it and has len elements is laid out like the
 * row); otherwise they are spread over a row in scratch memory first. */
extern "C" int cuda_eval_layer_norm(CUDA_KERNEL_SIGNATURE) {
  int rc = check_f32(n, in, out, d);
  if (rc || shape_numel(&out[0].shape) == 0) return rc;
  const Shape *x = &in[0].shape;
  int axis = (int)param_int(&n->params, LN_AXIS);
  if (axis < 0 || axis >= x->ndim)
    return diag_error(d, "layer_norm: axis=%d out of range for rank %d", axis, x->ndim);
  int64_t rows = prod_dims(x, 0, axis), len = prod_dims(x, axis, x->ndim);
  const float *ab[2] = {(const float *)in[1].data,
                        n->n_in > 2 ? (const float *)in[2].data : NULL};
  bool spread[2] = {shape_numel(&in[1].shape) != len,
                    n->n_in > 2 && shape_numel(&in[2].shape) != len};
  if (spread[0] || spread[1]) {
    float *buf = (float *)cuda_scratch(cx, (size_t)(2 * len) * sizeof(float), d);
    if (!buf) return TEQ_ERR_NOMEM;
    for (int i = 0; i < 2; i++) {
      if (!spread[i]) continue;
      spread_over_row<<<cuda_blocks(len, NORM_THREADS), NORM_THREADS, 0, cx->stream>>>(
          ab[i], buf + i * len, len, row_spread(&in[1 + i].shape, x, axis));
      CUDA_LAUNCHED();
      ab[i] = buf + i * len;
    }
  }
  Affine a = {ab[0], ab[1], 0};
  return norm_rows_run(cx, (const float *)in[0].data, (float *)out[0].data, rows, len,
                       param_float(&n->params, LN_EPSILON), a, d);
}

/* ---- instance_norm ---- */

/* input [N, C, D1, ...], scale and bias [C]: each (n, c) plane a row. */
extern "C" int cuda_eval_instance_norm(CUDA_KERNEL_SIGNATURE) {
  int rc = check_f32(n, in, out, d);
  if (rc || shape_numel(&out[0].shape) == 0) return rc;
  const Shape *x = &in[0].shape;
  if (x->ndim < 3)
    return diag_error(d, "instance_norm: input 0 has rank %d, expected 3 or more", x->ndim);
  int64_t rows = x->d[0] * x->d[1], len = prod_dims(x, 2, x->ndim);
  Affine a = {(const float *)in[1].data, (const float *)in[2].data, x->d[1]};
  return norm_rows_run(cx, (const float *)in[0].data, (float *)out[0].data, rows, len,
                       param_float(&n->params, IN_EPSILON), a, d);
}

/* ---- lrn ---- */

/* y = x / (bias + alpha/size sq)^beta, sq the sum of squares over the
 * channel window c - floor((size-1)/2) .. c + ceil((size-1)/2) clipped to
 * [0, chans), at the same position; in double, channels in order, as the
 * CPU's lrn_image_f32. alpha is already divided by size. */
__global__ void lrn_kernel(const float *x, float *y, int64_t total, int64_t chans, int64_t plane,
                           int64_t size, double alpha, double beta, double bias) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t c = (i / plane) % chans, base = i - c * plane; /* channel 0, same position */
    int64_t lo = c - (size - 1) / 2 < 0 ? 0 : c - (size - 1) / 2;
    int64_t hi = c + size / 2 >= chans ? chans - 1 : c + size / 2;
    double sq = 0;
    for (int64_t k = lo; k <= hi; k++) {
      double v = x[base + k * plane];
      sq += v * v;
    }
    y[i] = (float)(x[i] / pow(bias + alpha * sq, beta));
  }
}

extern "C" int cuda_eval_lrn(CUDA_KERNEL_SIGNATURE) {
  int rc = check_f32(n, in, out, d);
  int64_t total = shape_numel(&out[0].shape);
  if (rc || total == 0) return rc;
  const Shape *x = &in[0].shape;
  if (x->ndim < 3)
    return diag_error(d, "lrn: input 0 has rank %d, expected 3 or more", x->ndim);
  const Params *p = &n->params;
  int64_t size = param_int(p, LRN_SIZE);
  lrn_kernel<<<cuda_blocks(total, NORM_THREADS), NORM_THREADS, 0, cx->stream>>>(
      (const float *)in[0].data, (float *)out[0].data, total, x->d[1], prod_dims(x, 2, x->ndim),
      size, param_float(p, LRN_ALPHA) / (double)size, param_float(p, LRN_BETA),
      param_float(p, LRN_BIAS));
  CUDA_LAUNCHED();
  return TEQ_OK;
}
