/* elementwise.cu: GPU kernels of the element-wise family (runtime/ops/
 * elementwise.c): binary operators with numpy broadcasting, smul, the unary
 * activations, the variadic sum and mean, and cuda_act_apply, the fused
 * activation of conv and matmul.
 *
 * Each operator is a functor whose expression is the CPU row's, character
 * for character where rounding or NaN handling depends on it (the unary
 * ones in unary.cuh, which the convolution epilogues share). Broadcasting
 * collapses the output like the CPU's bcast_plan; a plan of one dimension
 * (same shapes, or a scalar on one side) runs a flat kernel, vectorized by
 * float4 when it can be, and any other plan a kernel that splits the flat
 * index over the collapsed dimensions with precomputed 32-bit divisors
 * (64-bit division when the output has 2^31 elements or more). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "runtime/cuda/cuda_int.h"
#include "runtime/cuda/unary.cuh"

enum { EW_THREADS = 256 };

/* ---- operators: the CPU expressions ---- */

struct OpAdd {
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct OpMul {
  __device__ float operator()(float x, float y) const { return x * y; }
};
struct OpSub {
  __device__ float operator()(float x, float y) const { return x - y; }
};
struct OpDiv {
  __device__ float operator()(float x, float y) const { return x / y; }
};
struct OpPow {
  __device__ float operator()(float x, float y) const { return powf(x, y); }
};
/* A NaN on either side comes out as NaN, as the CPU's selects do. */
struct OpMax {
  __device__ float operator()(float x, float y) const { return x > y || x != x ? x : y; }
};
struct OpMin {
  __device__ float operator()(float x, float y) const { return x < y || x != x ? x : y; }
};
/* PRelu: the slope y times x where x < 0. */
struct OpPrelu {
  __device__ float operator()(float x, float y) const { return x >= 0.0f ? x : y * x; }
};
/* The second operand broadcast: sum and mean copy their input 0 with it. */
struct OpTakeSecond {
  __device__ float operator()(float, float y) const { return y; }
};

/* ---- shared checks ---- */

static const char *row_name(const Node *n) { return op_def(n->kind)->name; }

static int64_t numel_of(const CudaTensor *t) { return shape_numel(&t->shape); }

/* Every input and the output float32, as the CPU's check_dtypes wants. */
static int check_f32(const Node *n, const CudaTensor *in, int n_in, const CudaTensor *out,
                     Diag *d) {
  for (int i = 0; i < n_in; i++)
    if (in[i].dtype != DT_F32)
      return diag_error(d, "%s: input %d is %s, expected float32", row_name(n), i,
                        dtype_name(in[i].dtype));
  if (out[0].dtype != DT_F32)
    return diag_error(d, "%s: output is %s, expected float32", row_name(n),
                      dtype_name(out[0].dtype));
  return TEQ_OK;
}

/* ---- broadcasting plans ---- */

/* n / d and n % d for n < 2^31 by a multiply and a shift (Granlund and
 * Montgomery's round-up method): integer division by a runtime value is a
 * long instruction sequence on the GPU, and the general kernel divides once
 * per collapsed dimension per element. */
struct FastDiv {
  uint32_t d, mul, shift;
};

static FastDiv fast_div(uint32_t d) {
  FastDiv f;
  f.d = d;
  f.shift = 0;
  while (((uint64_t)1 << f.shift) < d) f.shift++;
  f.mul = (uint32_t)(((uint64_t)1 << 32) * (((uint64_t)1 << f.shift) - d) / d + 1);
  return f;
}

__device__ __forceinline__ uint32_t fast_quot(const FastDiv &f, uint32_t n) {
  return (__umulhi(n, f.mul) + n) >> f.shift;
}

/* The CPU's broadcast plan (family.h), with the divisors that split a flat
 * output index over its dimensions. */
struct BcastKernelPlan : BcastPlan {
  FastDiv div[TEQ_MAX_DIMS]; /* of dim, filled when the output fits 32-bit indices */
};

/* ---- binary kernels ---- */

/* A plan of one dimension: a and b read at compile-time strides 0 or 1. */
template <class Op, int SA, int SB>
__global__ void binary_flat(const float *a, const float *b, float *o, int64_t n) {
  Op op;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    o[i] = op(a[SA ? i : 0], b[SB ? i : 0]);
}

/* The same four floats at a time over the first 4 * n4 elements, the
 * stride-1 sides 16-byte aligned; the first threads take the 0 to 3 left. */
template <class Op, int SA, int SB>
__global__ void binary_flat4(const float *a, const float *b, float *o, int64_t n4, int64_t n) {
  Op op;
  int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  for (int64_t i = first; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
    float4 x = SA ? reinterpret_cast<const float4 *>(a)[i] : make_float4(a[0], a[0], a[0], a[0]);
    float4 y = SB ? reinterpret_cast<const float4 *>(b)[i] : make_float4(b[0], b[0], b[0], b[0]);
    reinterpret_cast<float4 *>(o)[i] =
        make_float4(op(x.x, y.x), op(x.y, y.y), op(x.z, y.z), op(x.w, y.w));
  }
  int64_t t = 4 * n4 + first;
  if (t < n) o[t] = op(a[SA ? t : 0], b[SB ? t : 0]);
}

/* A plan whose innermost dimension is long: one row of `inner` elements
 * per blockIdx.y, its two offsets found once per row, then a flat loop
 * (float4 when VEC: inner a multiple of 4 and the bases aligned, so every
 * row of a stride-1 side is too). The per-channel [C,1,1] bias and the row
 * vector of transformers run here. Row indices fit 32 bits. */
template <class Op, int SA, int SB, bool VEC>
__global__ void binary_rows(const float *a, const float *b, float *o, uint32_t rows,
                            int64_t inner, BcastKernelPlan pl) {
  Op op;
  const int64_t step = VEC ? inner / 4 : inner;
  for (uint32_t row = blockIdx.y; row < rows; row += gridDim.y) {
    uint32_t rest = row;
    int64_t pa = 0, pb = 0;
    for (int k = pl.nd - 2; k > 0; k--) {
      uint32_t q = fast_quot(pl.div[k], rest), r = rest - q * pl.div[k].d;
      pa += r * pl.sa[k];
      pb += r * pl.sb[k];
      rest = q;
    }
    pa += rest * pl.sa[0];
    pb += rest * pl.sb[0];
    const float *ar = a + pa, *br = b + pb;
    float *orow = o + (int64_t)row * inner;
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < step;
         j += (int64_t)gridDim.x * blockDim.x) {
      if (VEC) {
        float4 x = SA ? reinterpret_cast<const float4 *>(ar)[j]
                      : make_float4(ar[0], ar[0], ar[0], ar[0]);
        float4 y = SB ? reinterpret_cast<const float4 *>(br)[j]
                      : make_float4(br[0], br[0], br[0], br[0]);
        reinterpret_cast<float4 *>(orow)[j] =
            make_float4(op(x.x, y.x), op(x.y, y.y), op(x.z, y.z), op(x.w, y.w));
      } else {
        orow[j] = op(ar[SA ? j : 0], br[SB ? j : 0]);
      }
    }
  }
}

/* Any plan of ND dimensions, the flat index split innermost first. */
template <class Op, int ND>
__global__ void binary_bcast32(const float *a, const float *b, float *o, uint32_t n,
                               BcastKernelPlan pl) {
  Op op;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t rest = i, pa = 0, pb = 0;
#pragma unroll
    for (int k = ND - 1; k > 0; k--) {
      uint32_t q = fast_quot(pl.div[k], rest), r = rest - q * pl.div[k].d;
      pa += r * (uint32_t)pl.sa[k];
      pb += r * (uint32_t)pl.sb[k];
      rest = q;
    }
    pa += rest * (uint32_t)pl.sa[0];
    pb += rest * (uint32_t)pl.sb[0];
    o[i] = op(a[pa], b[pb]);
  }
}

template <class Op, int ND>
__global__ void binary_bcast64(const float *a, const float *b, float *o, int64_t n,
                               BcastKernelPlan pl) {
  Op op;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t rest = i, pa = 0, pb = 0;
#pragma unroll
    for (int k = ND - 1; k > 0; k--) {
      int64_t q = rest / pl.dim[k], r = rest - q * pl.dim[k];
      pa += r * pl.sa[k];
      pb += r * pl.sb[k];
      rest = q;
    }
    pa += rest * pl.sa[0];
    pb += rest * pl.sb[0];
    o[i] = op(a[pa], b[pb]);
  }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <class Op, int SA, int SB>
static int launch_flat(CudaCtx *cx, const float *a, const float *b, float *o, int64_t n,
                       Diag *d) {
  if ((!SA || aligned16(a)) && (!SB || aligned16(b)) && aligned16(o)) {
    binary_flat4<Op, SA, SB><<<cuda_blocks(n / 4 > 0 ? n / 4 : 1, EW_THREADS), EW_THREADS, 0,
                               cx->stream>>>(a, b, o, n / 4, n);
  } else {
    binary_flat<Op, SA, SB><<<cuda_blocks(n, EW_THREADS), EW_THREADS, 0, cx->stream>>>(a, b, o,
                                                                                        n);
  }
  CUDA_LAUNCHED();
  return TEQ_OK;
}

enum { ROW_THREADS = 128 };

template <class Op, int SA, int SB>
static int launch_rows(CudaCtx *cx, const float *a, const float *b, float *o, int64_t n,
                       const BcastKernelPlan &pl, Diag *d) {
  int64_t inner = pl.dim[pl.nd - 1], rows = n / inner;
  bool vec = inner % 4 == 0 && (!SA || aligned16(a)) && (!SB || aligned16(b)) && aligned16(o);
  int64_t step = vec ? inner / 4 : inner, gx = (step + ROW_THREADS - 1) / ROW_THREADS;
  dim3 grid((unsigned)(gx < 1024 ? gx : 1024), (unsigned)(rows < 65535 ? rows : 65535));
  if (vec)
    binary_rows<Op, SA, SB, true><<<grid, ROW_THREADS, 0, cx->stream>>>(a, b, o, (uint32_t)rows,
                                                                        inner, pl);
  else
    binary_rows<Op, SA, SB, false><<<grid, ROW_THREADS, 0, cx->stream>>>(a, b, o, (uint32_t)rows,
                                                                         inner, pl);
  CUDA_LAUNCHED();
  cuda_note(cx, "rows of %lld%s", (long long)inner, vec ? ", float4" : "");
  return TEQ_OK;
}

template <class Op, int ND>
static int launch_bcast_nd(CudaCtx *cx, const float *a, const float *b, float *o, int64_t n,
                           const BcastKernelPlan &pl, Diag *d) {
  unsigned blocks = cuda_blocks(n, EW_THREADS);
  if (n < ((int64_t)1 << 31))
    binary_bcast32<Op, ND><<<blocks, EW_THREADS, 0, cx->stream>>>(a, b, o, (uint32_t)n, pl);
  else
    binary_bcast64<Op, ND><<<blocks, EW_THREADS, 0, cx->stream>>>(a, b, o, n, pl);
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* o (of shape os) = op(a, b), a and b broadcast to os. o may be a itself
 * when a has o's shape (sum accumulates in place): each element is read
 * before it is written, by the same thread. */
template <class Op>
static int binary_run(CudaCtx *cx, const float *a, const Shape *as, const float *b,
                      const Shape *bs, float *o, const Shape *os, Diag *d) {
  int64_t n = shape_numel(os);
  if (n == 0) return TEQ_OK;
  BcastKernelPlan pl;
  bcast_plan(as, bs, os, &pl);
  if (pl.nd == 1) {
    if (pl.sa[0] && pl.sb[0]) return launch_flat<Op, 1, 1>(cx, a, b, o, n, d);
    if (pl.sa[0]) return launch_flat<Op, 1, 0>(cx, a, b, o, n, d);
    if (pl.sb[0]) return launch_flat<Op, 0, 1>(cx, a, b, o, n, d);
    return launch_flat<Op, 0, 0>(cx, a, b, o, n, d);
  }
  if (n < ((int64_t)1 << 31))
    for (int k = 0; k < pl.nd; k++) pl.div[k] = fast_div((uint32_t)pl.dim[k]);
  /* Long rows: offsets once per row. Short ones would leave most of a
   * block idle, so they split the flat index instead. */
  int64_t inner = pl.dim[pl.nd - 1], in_sa = pl.sa[pl.nd - 1], in_sb = pl.sb[pl.nd - 1];
  if (inner >= 4 * ROW_THREADS - 128 && n / inner < ((int64_t)1 << 31)) {
    if (n >= ((int64_t)1 << 31))
      for (int k = 0; k < pl.nd - 1; k++) pl.div[k] = fast_div((uint32_t)pl.dim[k]);
    if (in_sa && in_sb) return launch_rows<Op, 1, 1>(cx, a, b, o, n, pl, d);
    if (in_sa) return launch_rows<Op, 1, 0>(cx, a, b, o, n, pl, d);
    return launch_rows<Op, 0, 1>(cx, a, b, o, n, pl, d);
  }
  switch (pl.nd) {
  case 2: return launch_bcast_nd<Op, 2>(cx, a, b, o, n, pl, d);
  case 3: return launch_bcast_nd<Op, 3>(cx, a, b, o, n, pl, d);
  case 4: return launch_bcast_nd<Op, 4>(cx, a, b, o, n, pl, d);
  case 5: return launch_bcast_nd<Op, 5>(cx, a, b, o, n, pl, d);
  default: return launch_bcast_nd<Op, 6>(cx, a, b, o, n, pl, d);
  }
}

__global__ void int64_to_f32(const int64_t *x, float *y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = (float)x[i];
}

/* A float32 first operand with an int64 second one (ONNX Pow's exponent)
 * converts the second to float32 first, as the CPU does; any other dtype
 * is refused. */
template <class Op>
static int binary_eval(const Node *n, CudaCtx *cx, const CudaTensor *in, const CudaTensor *out,
                       Diag *d) {
  const float *b = (const float *)in[1].data;
  if (in[1].dtype == DT_I64 && in[0].dtype == DT_F32 && out[0].dtype == DT_F32) {
    int64_t nb = numel_of(&in[1]);
    if (shape_numel(&out[0].shape) == 0) return TEQ_OK;
    float *conv = (float *)cuda_scratch(cx, (size_t)(nb > 0 ? nb : 1) * sizeof(float), d);
    if (!conv) return TEQ_ERR_NOMEM;
    int64_to_f32<<<cuda_blocks(nb, EW_THREADS), EW_THREADS, 0, cx->stream>>>(
        (const int64_t *)in[1].data, conv, nb);
    CUDA_LAUNCHED();
    b = conv;
  } else {
    int rc = check_f32(n, in, 2, out, d);
    if (rc) return rc;
  }
  return binary_run<Op>(cx, (const float *)in[0].data, &in[0].shape, b, &in[1].shape,
                        (float *)out[0].data, &out[0].shape, d);
}

#define BINARY_ROW(name, Op)                                        \
  extern "C" int cuda_eval_##name(CUDA_KERNEL_SIGNATURE) {          \
    return binary_eval<Op>(n, cx, in, out, d);                      \
  }

BINARY_ROW(ewadd, OpAdd)
BINARY_ROW(ewmul, OpMul)
BINARY_ROW(sub, OpSub)
BINARY_ROW(div, OpDiv)
BINARY_ROW(pow, OpPow)
BINARY_ROW(max, OpMax)
BINARY_ROW(min, OpMin)
BINARY_ROW(prelu, OpPrelu)

/* smul: x times the single element of input 1, whatever its rank. */
extern "C" int cuda_eval_smul(CUDA_KERNEL_SIGNATURE) {
  int rc = check_f32(n, in, 2, out, d);
  if (rc) return rc;
  int64_t count = shape_numel(&out[0].shape);
  if (count == 0) return TEQ_OK;
  return launch_flat<OpMul, 1, 0>(cx, (const float *)in[0].data, (const float *)in[1].data,
                                  (float *)out[0].data, count, d);
}

/* ---- sum and mean ---- */

__global__ void divide_by(float *y, int64_t n, float k) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] /= k;
}

/* Up to VARIADIC_FUSED inputs are summed in one pass; more take a pass
 * each. */
enum { VARIADIC_FUSED = 8 };

/* The output as nd dimensions (merged where every input walks on evenly,
 * as bcast_plan does for two), with each input's strides. */
struct VariadicPlan {
  int nd, n_in;
  int64_t dim[TEQ_MAX_DIMS];
  FastDiv div[TEQ_MAX_DIMS];
  const float *x[VARIADIC_FUSED];
  int64_t st[VARIADIC_FUSED][TEQ_MAX_DIMS];
};

static void variadic_plan(const CudaTensor *in, int n_in, const Shape *o, VariadicPlan *pl) {
  memset(pl, 0, sizeof *pl);
  pl->n_in = n_in;
  for (int k = 0; k < n_in; k++) pl->x[k] = (const float *)in[k].data;
  for (int i = 0; i < o->ndim; i++) {
    if (o->d[i] == 1) continue;
    int64_t st[VARIADIC_FUSED];
    bool merge = pl->nd > 0;
    for (int k = 0; k < n_in; k++) {
      st[k] = bcast_stride(&in[k].shape, o->ndim, i);
      if (merge && pl->st[k][pl->nd - 1] != st[k] * o->d[i]) merge = false;
    }
    int at = merge ? pl->nd - 1 : pl->nd++;
    pl->dim[at] = merge ? pl->dim[at] * o->d[i] : o->d[i];
    for (int k = 0; k < n_in; k++) pl->st[k][at] = st[k];
  }
  if (pl->nd == 0) { /* a single element */
    pl->nd = 1;
    pl->dim[0] = 1;
  }
}

/* y = ((x0 + x1) + x2) + ..., each x broadcast, then / count for a mean:
 * the CPU's order of float32 additions, so the sums round alike. */
template <bool WIDE>
__global__ void variadic_fused(float *y, int64_t n, VariadicPlan pl, bool is_mean) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t off[VARIADIC_FUSED] = {0}, rest = i;
    for (int k = pl.nd - 1; k >= 0; k--) {
      int64_t q = k == 0 ? 0 : WIDE ? rest / pl.dim[k] : fast_quot(pl.div[k], (uint32_t)rest);
      int64_t r = rest - q * pl.dim[k];
#pragma unroll
      for (int j = 0; j < VARIADIC_FUSED; j++)
        if (j < pl.n_in) off[j] += r * pl.st[j][k];
      rest = q;
    }
    float acc = pl.x[0][off[0]];
#pragma unroll
    for (int j = 1; j < VARIADIC_FUSED; j++)
      if (j < pl.n_in) acc += pl.x[j][off[j]];
    y[i] = is_mean ? acc / (float)pl.n_in : acc;
  }
}

/* As the CPU: the output takes input 0, then adds the others in turn, each
 * broadcast; a mean then divides by the count. */
static int variadic_eval(const Node *n, CudaCtx *cx, const CudaTensor *in,
                         const CudaTensor *out, Diag *d, bool is_mean) {
  int rc = check_f32(n, in, n->n_in, out, d);
  if (rc) return rc;
  int64_t count = shape_numel(&out[0].shape);
  if (count == 0) return TEQ_OK;
  float *y = (float *)out[0].data;
  const Shape *ys = &out[0].shape;
  if (n->n_in <= VARIADIC_FUSED) {
    VariadicPlan pl;
    variadic_plan(in, n->n_in, ys, &pl);
    bool wide = count >= ((int64_t)1 << 31);
    for (int k = 0; k < pl.nd && !wide; k++) pl.div[k] = fast_div((uint32_t)pl.dim[k]);
    if (wide)
      variadic_fused<true><<<cuda_blocks(count, EW_THREADS), EW_THREADS, 0, cx->stream>>>(
          y, count, pl, is_mean);
    else
      variadic_fused<false><<<cuda_blocks(count, EW_THREADS), EW_THREADS, 0, cx->stream>>>(
          y, count, pl, is_mean);
    CUDA_LAUNCHED();
    return TEQ_OK;
  }
  rc = binary_run<OpTakeSecond>(cx, (const float *)in[0].data, &in[0].shape,
                                (const float *)in[0].data, &in[0].shape, y, ys, d);
  for (int k = 1; k < n->n_in && !rc; k++)
    rc = binary_run<OpAdd>(cx, y, ys, (const float *)in[k].data, &in[k].shape, y, ys, d);
  if (rc || !is_mean) return rc;
  divide_by<<<cuda_blocks(count, EW_THREADS), EW_THREADS, 0, cx->stream>>>(y, count,
                                                                          (float)n->n_in);
  CUDA_LAUNCHED();
  return TEQ_OK;
}

extern "C" int cuda_eval_sum(CUDA_KERNEL_SIGNATURE) {
  return variadic_eval(n, cx, in, out, d, false);
}

extern "C" int cuda_eval_mean(CUDA_KERNEL_SIGNATURE) {
  return variadic_eval(n, cx, in, out, d, true);
}

/* ---- unary operators ---- */

template <class Op>
__global__ void unary_flat(const float *x, float *y, int64_t n, UnaryArgs p) {
  Op op;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = op(x[i], p);
}

/* Four at a time over the first 4 * n4 elements; the first threads take
 * the 0 to 3 left. */
template <class Op>
__global__ void unary_flat4(const float *x, float *y, int64_t n4, int64_t n, UnaryArgs p) {
  Op op;
  int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  for (int64_t i = first; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
    float4 v = reinterpret_cast<const float4 *>(x)[i];
    reinterpret_cast<float4 *>(y)[i] = make_float4(op(v.x, p), op(v.y, p), op(v.z, p), op(v.w, p));
  }
  int64_t t = 4 * n4 + first;
  if (t < n) y[t] = op(x[t], p);
}

/* y = op(x) over n elements; x may be y (fused activations run in place). */
template <class Op>
static int unary_run(CudaCtx *cx, const float *x, float *y, int64_t n, UnaryArgs p, Diag *d) {
  if (n == 0) return TEQ_OK;
  if (aligned16(x) && aligned16(y))
    unary_flat4<Op><<<cuda_blocks(n / 4 > 0 ? n / 4 : 1, EW_THREADS), EW_THREADS, 0,
                      cx->stream>>>(x, y, n / 4, n, p);
  else
    unary_flat<Op><<<cuda_blocks(n, EW_THREADS), EW_THREADS, 0, cx->stream>>>(x, y, n, p);
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* The row's first two float parameters, read as the CPU's UNARY_LOOP does
 * (0 where the row has none). */
template <class Op>
static int unary_eval(const Node *n, CudaCtx *cx, const CudaTensor *in, const CudaTensor *out,
                      Diag *d) {
  int rc = check_f32(n, in, 1, out, d);
  if (rc) return rc;
  UnaryArgs p = {(float)n->params.v[0].f, (float)n->params.v[1].f, ACT_NONE};
  return unary_run<Op>(cx, (const float *)in[0].data, (float *)out[0].data,
                       shape_numel(&out[0].shape), p, d);
}

#define UNARY_ROW(name, Op)                                         \
  extern "C" int cuda_eval_##name(CUDA_KERNEL_SIGNATURE) {          \
    return unary_eval<Op>(n, cx, in, out, d);                       \
  }

UNARY_ROW(relu, OpRelu)
UNARY_ROW(sigmoid, OpSigmoid)
UNARY_ROW(tanh, OpTanh)
UNARY_ROW(exp, OpExp)
UNARY_ROW(log, OpLog)
UNARY_ROW(sqrt, OpSqrt)
UNARY_ROW(neg, OpNeg)
UNARY_ROW(abs, OpAbs)
UNARY_ROW(reciprocal, OpReciprocal)
UNARY_ROW(erf, OpErf)
UNARY_ROW(leaky_relu, OpLeakyRelu)
UNARY_ROW(elu, OpElu)
UNARY_ROW(clip, OpClip)
UNARY_ROW(softplus, OpSoftplus)
UNARY_ROW(hard_sigmoid, OpHardSigmoid)
UNARY_ROW(selu, OpSelu)
UNARY_ROW(thresholded_relu, OpThresholdedRelu)
UNARY_ROW(hard_swish, OpHardSwish)
UNARY_ROW(celu, OpCelu)
UNARY_ROW(mish, OpMish)
UNARY_ROW(silu, OpSilu)

/* gelu's one parameter picks the formula (0: erf, 1: tanh), as on the CPU. */
struct OpGelu {
  __device__ float operator()(float x, UnaryArgs) const {
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
  }
};
struct OpGeluTanh {
  __device__ float operator()(float x, UnaryArgs) const {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  }
};
extern "C" int cuda_eval_gelu(CUDA_KERNEL_SIGNATURE) {
  int rc = check_f32(n, in, 1, out, d);
  if (rc) return rc;
  const float *x = (const float *)in[0].data;
  float *y = (float *)out[0].data;
  int64_t count = shape_numel(&out[0].shape);
  return n->params.v[0].i[0] == 1 ? unary_run<OpGeluTanh>(cx, x, y, count, UnaryArgs{}, d)
                                  : unary_run<OpGelu>(cx, x, y, count, UnaryArgs{}, d);
}

/* ---- fused activations (conv, matmul) ---- */

int cuda_act_apply(CudaCtx *cx, int act, float *x, int64_t n, Diag *d) {
  if (act == ACT_NONE) return TEQ_OK;
  if (act_op_kind(act) == OP__COUNT) return diag_error(d, "fused activation %d is unknown", act);
  return unary_run<OpFusedAct>(cx, x, x, n, fused_act_args(act), d);
}

/* ---- partial products summed (conv.cu and matmul.cu split along K) ---- */

/* Output i of the sum: act(b + z[i] + the partials, in split order), b
 * its channel's bias (0 where there is none). */
__host__ __device__ __forceinline__ float sum_partials_at(const float *part, int splits,
                                                         int64_t total, int64_t i, float b,
                                                         const float *z, UnaryArgs act) {
  float v = b;
  if (z) v += z[i];
  for (int j = 0; j < splits; j++) v += part[j * total + i];
  return act_eval(act, v);
}

/* The sum on cuda_plane_grid: planes of `plane` elements, channel = plane
 * index mod m, known per block row (a 64-bit division per element
 * before). */
__global__ void sum_partials_kernel(const float *__restrict__ part, int splits, int64_t total,
                                    const float *__restrict__ bias, int64_t planes, int64_t m,
                                    int64_t plane, const float *__restrict__ z, UnaryArgs act,
                                    float *__restrict__ y) {
  for (int64_t pl = blockIdx.y; pl < planes; pl += gridDim.y) {
    float b = bias ? bias[pl % m] : 0.0f;
    for (int64_t i = pl * plane + blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
         i < (pl + 1) * plane; i += (int64_t)gridDim.x * blockDim.x)
      y[i] = sum_partials_at(part, splits, total, i, b, z, act);
  }
}

void cuda_sum_partials_on_host(const float *part, int splits, int64_t total, const float *bias,
                               int64_t m, int64_t plane, const float *z, int act, float *y) {
  for (int64_t i = 0; i < total; i++)
    y[i] = sum_partials_at(part, splits, total, i, bias ? bias[i / plane % m] : 0.0f, z,
                           fused_act_args(act));
}

int cuda_sum_partials(CudaCtx *cx, const float *part, int splits, int64_t total, const float *bias,
                      int64_t m, int64_t plane, const float *z, int act, float *y, Diag *d) {
  if (total == 0) return TEQ_OK;
  if (!bias) m = 1, plane = total; /* one plane: no channel to know */
  int64_t planes = total / plane;
  sum_partials_kernel<<<cuda_plane_grid(planes, plane, EW_THREADS), EW_THREADS, 0,
                        cx->stream>>>(part, splits, total, bias, planes, m, plane, z,
                                      fused_act_args(act), y);
  CUDA_LAUNCHED();
  return TEQ_OK;
}
