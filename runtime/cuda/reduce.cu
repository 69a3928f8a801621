/* reduce.cu: GPU kernels of the reduce family (rows in runtime/ops/reduce.c):
 * the reductions reduce_{sum, mean, max, min, prod, sum_square, l1, l2,
 * log_sum, log_sum_exp}, softmax and log_softmax along one axis, and argmax
 * and argmin (int64 indices along one axis).
 *
 * A reduction sees its input as K outputs times R reduced elements: the
 * input's dimensions, extent-1 ones dropped and neighbours of the same kind
 * merged (as the CPU's reduce_plan does), split into kept and reduced ones.
 * When the innermost merged dimension is reduced, a group of 8, 32 or 256
 * threads (by R) folds each output's contiguous run (global pooling,
 * layer-like reductions); otherwise one thread per output walks the
 * reduced elements while its neighbours read the neighbouring addresses.
 * When there are too few outputs to fill the GPU, the reduced range is cut
 * into pieces whose partial folds a second kernel joins. Sums, products
 * and their kin are accumulated in double, as the CPU does along a run, so
 * results agree to rounding for millions of elements. log_sum_exp first
 * finds each output's maximum (a max reduction into scratch) and sums
 * e^(x - max) after it.
 *
 * Softmax over the last axis gives a warp per row, the row held in
 * registers (rows up to 1024), or a block per row that finds the maximum
 * and the sum in one pass (the sum rescaled as the maximum grows); over
 * another axis one thread per (outer, inner) line, whose neighbours read
 * contiguously. Rows that are a multiple of 4 long move as float4. The
 * maximum is subtracted first and NaN or infinite maxima give NaN rows,
 * exactly as the CPU row. argmax/argmin keep the CPU's order of ties and
 * NaNs: each thread scans its elements in order, and winners from
 * different threads are compared by value, then by index. */
#include <float.h>
#include <math.h>

#include <algorithm>

#include "runtime/cuda/cuda_int.h"

/* Everything but the rows' entry points is private to this file. */
namespace {

static const unsigned FULL_MASK = 0xffffffffu;

/* Work items that keep every multiprocessor busy: below this many outputs
 * (times their threads) a reduction splits its reduced range. */
static const int64_t PARALLEL_TARGET = 1 << 18;

/* The larger (smaller) of m and x, NaN if either is: the CPU's max_nan. */
__device__ __forceinline__ float max_nan(float m, float x) { return x > m || x != x ? x : m; }
__device__ __forceinline__ float min_nan(float m, float x) { return x < m || x != x ? x : m; }

/* ---- what each reduction row folds ----
 * y = post(join over the reduced elements of map(x, m)), starting from
 * init; m is the output's maximum for log_sum_exp, unused otherwise; count
 * is the number of elements reduced into each output. */

struct SumOp {
  typedef double Acc;
  static __device__ Acc init() { return 0.0; }
  static __device__ Acc map(float v, float) { return (double)v; }
  static __device__ Acc join(Acc a, Acc b) { return a + b; }
  static __device__ float post(Acc a, float, int64_t) { return (float)a; }
};

/* The CPU multiplies the float sum by the float 1/count (NaN for none). */
struct MeanOp : SumOp {
  static __device__ float post(Acc a, float, int64_t count) {
    float scale = count ? 1.0f / (float)count : NAN;
    return (float)a * scale;
  }
};

struct MaxOp {
  typedef float Acc;
  static __device__ Acc init() { return -INFINITY; }
  static __device__ Acc map(float v, float) { return v; }
  static __device__ Acc join(Acc a, Acc b) { return max_nan(a, b); }
  static __device__ float post(Acc a, float, int64_t) { return a; }
};

struct MinOp : MaxOp {
  static __device__ Acc init() { return INFINITY; }
  static __device__ Acc join(Acc a, Acc b) { return min_nan(a, b); }
};

struct ProdOp {
  typedef double Acc;
  static __device__ Acc init() { return 1.0; }
  static __device__ Acc map(float v, float) { return (double)v; }
  static __device__ Acc join(Acc a, Acc b) { return a * b; }
  static __device__ float post(Acc a, float, int64_t) { return (float)a; }
};

struct SumSquareOp : SumOp {
  static __device__ Acc map(float v, float) { return (double)v * (double)v; }
};

struct L1Op : SumOp {
  static __device__ Acc map(float v, float) { return fabs((double)v); }
};

struct L2Op : SumSquareOp {
  static __device__ float post(Acc a, float, int64_t) { return sqrtf((float)a); }
};

struct LogSumOp : SumOp {
  static __device__ float post(Acc a, float, int64_t) { return logf((float)a); }
};

/* log sum e^x = m + log sum e^(x - m), m the output's maximum; an infinite
 * or NaN maximum is the result itself (and -inf for an empty reduction). */
struct ExpSumOp : SumOp {
  static __device__ Acc map(float v, float m) { return isfinite(m) ? (double)expf(v - m) : 0.0; }
  static __device__ float post(Acc a, float m, int64_t) {
    return isfinite(m) ? m + logf((float)a) : m;
  }
};

/* The join over each aligned group of W lanes of a warp (W a power of 2
 * up to 32), returned to all of them. */
template <class Op, int W = 32>
__device__ __forceinline__ typename Op::Acc warp_join(typename Op::Acc a) {
  for (int off = W / 2; off > 0; off >>= 1) a = Op::join(a, __shfl_xor_sync(FULL_MASK, a, off));
  return a;
}

/* The join of every thread's a, returned to every thread of the block
 * (blockDim.x a multiple of 32, at most 1024). */
template <class Op>
__device__ typename Op::Acc block_join(typename Op::Acc a) {
  __shared__ typename Op::Acc part[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  a = warp_join<Op>(a);
  __syncthreads(); /* part may still be read by a previous call */
  if (lane == 0) part[warp] = a;
  __syncthreads();
  a = lane < warps ? part[lane] : Op::init();
  return warp_join<Op>(a);
}

/* ---- reduction geometry ---- */

/* K outputs times R reduced elements; the kept dimensions in output order
 * (row-major, so output o decomposes over them) and the reduced ones, each
 * merged dimension with its extent and input stride. */
struct RedGeom {
  int nk, nr;
  int64_t kext[TEQ_MAX_DIMS], kst[TEQ_MAX_DIMS];
  int64_t rext[TEQ_MAX_DIMS], rst[TEQ_MAX_DIMS];
  int64_t K, R;
  bool inner_reduced; /* the innermost merged dimension is reduced (stride 1) */
};

__device__ __forceinline__ int64_t kept_offset(const RedGeom &g, int64_t o) {
  if (g.nk <= 1) return g.nk ? o * g.kst[0] : 0; /* the common case: no division */
  int64_t off = 0;
  for (int i = g.nk - 1; i >= 0; i--) {
    int64_t q = o / g.kext[i];
    off += (o - q * g.kext[i]) * g.kst[i];
    o = q;
  }
  return off;
}

__device__ __forceinline__ int64_t reduced_offset(const RedGeom &g, int64_t r) {
  if (g.nr == 1) return r * g.rst[0];
  int64_t off = 0;
  for (int i = g.nr - 1; i >= 0; i--) {
    int64_t q = r / g.rext[i];
    off += (r - q * g.rext[i]) * g.rst[i];
    r = q;
  }
  return off;
}

/* Fold of map(x) over reduced elements [r0, r1) of the output at x, in
 * order: one merged dimension strides, several step like an odometer. */
template <class Op>
__device__ typename Op::Acc fold_serial(const float *x, const RedGeom &g, int64_t r0, int64_t r1,
                                        float m) {
  typename Op::Acc a = Op::init();
  if (r0 >= r1) return a;
  if (g.nr == 1) {
    for (int64_t r = r0; r < r1; r++) a = Op::join(a, Op::map(x[r * g.rst[0]], m));
    return a;
  }
  int64_t idx[TEQ_MAX_DIMS], off = 0, rem = r0;
  for (int i = g.nr - 1; i >= 0; i--) {
    idx[i] = rem % g.rext[i];
    rem /= g.rext[i];
    off += idx[i] * g.rst[i];
  }
  for (int64_t r = r0; r < r1; r++) {
    a = Op::join(a, Op::map(x[off], m));
    for (int i = g.nr - 1; i >= 0; i--) {
      off += g.rst[i];
      if (++idx[i] < g.rext[i]) break;
      off -= g.rst[i] * g.rext[i];
      idx[i] = 0;
    }
  }
  return a;
}

/* The piece s of S of [0, R): [*r0, *r1). */
__device__ __forceinline__ void piece(int64_t R, int64_t S, int64_t s, int64_t *r0, int64_t *r1) {
  int64_t len = (R + S - 1) / S;
  *r0 = s * len < R ? s * len : R;
  *r1 = *r0 + len < R ? *r0 + len : R;
}

/* Writes output o: post(a) when the range was not split (partial NULL),
 * else the partial fold of piece s for reduce_join. */
template <class Op>
__device__ __forceinline__ void reduce_store(typename Op::Acc a, const RedGeom &g, int64_t o,
                                             int64_t s, const float *aux, float *y,
                                             typename Op::Acc *partial) {
  if (partial) partial[s * g.K + o] = a;
  else y[o] = Op::post(a, aux ? aux[o] : 0.0f, g.R);
}

/* One thread per (output, piece): the innermost merged dimension is kept,
 * so neighbouring threads read neighbouring addresses. */
template <class Op>
__global__ void reduce_by_thread(const float *x, const float *aux, float *y,
                                 typename Op::Acc *partial, RedGeom g, int64_t S) {
  int64_t total = g.K * S;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t o = t % g.K, s = t / g.K, r0, r1;
    piece(g.R, S, s, &r0, &r1);
    float m = aux ? aux[o] : 0.0f;
    typename Op::Acc a = fold_serial<Op>(x + kept_offset(g, o), g, r0, r1, m);
    reduce_store<Op>(a, g, o, s, aux, y, partial);
  }
}

/* A group of G threads (part of a warp, a warp, or the whole block when G
 * is blockDim.x) per (output, piece): the innermost merged dimension is reduced with
 * stride 1, so the group reads its run contiguously. Four accumulators per
 * thread keep four loads in flight. */
template <class Op, int G>
__global__ void reduce_by_group(const float *x, const float *aux, float *y,
                                typename Op::Acc *partial, RedGeom g, int64_t S) {
  typedef typename Op::Acc Acc;
  const int per_block = blockDim.x / G;
  int lane = threadIdx.x % G;
  int64_t groups = g.K * S;
  /* Every thread of a block runs the same number of iterations, so the
   * block-wide join below is reached by all of them. */
  for (int64_t base = (int64_t)blockIdx.x * per_block; base < groups;
       base += (int64_t)gridDim.x * per_block) {
    int64_t gi = base + threadIdx.x / G;
    bool live = gi < groups;
    int64_t o = gi, s = 0, r0 = 0, r1 = g.R;
    if (!live) o = 0, r1 = 0;
    else if (S > 1) o = gi % g.K, s = gi / g.K, piece(g.R, S, s, &r0, &r1);
    float m = aux && live ? aux[o] : 0.0f;
    const float *xo = x + kept_offset(g, o);
    Acc a0 = Op::init(), a1 = Op::init(), a2 = Op::init(), a3 = Op::init();
    if (g.nr == 1) { /* one contiguous run */
      int64_t r = r0 + lane;
      for (; r + 3 * G < r1; r += 4 * G) {
        a0 = Op::join(a0, Op::map(xo[r], m));
        a1 = Op::join(a1, Op::map(xo[r + G], m));
        a2 = Op::join(a2, Op::map(xo[r + 2 * G], m));
        a3 = Op::join(a3, Op::map(xo[r + 3 * G], m));
      }
      for (; r < r1; r += G) a0 = Op::join(a0, Op::map(xo[r], m));
    } else {
      for (int64_t r = r0 + lane; r < r1; r += G)
        a0 = Op::join(a0, Op::map(xo[reduced_offset(g, r)], m));
    }
    Acc a = Op::join(Op::join(a0, a1), Op::join(a2, a3));
    a = G <= 32 ? warp_join<Op, (G <= 32 ? G : 32)>(a) : block_join<Op>(a);
    if (live && lane == 0) reduce_store<Op>(a, g, o, s, aux, y, partial);
  }
}

/* y[o] = post(join of the S partial folds of output o): W lanes per output,
 * a warp when there are many pieces (so that joining them keeps many loads
 * in flight), else one. */
template <class Op, int W>
__global__ void reduce_join(const typename Op::Acc *partial, const float *aux, float *y,
                            int64_t K, int64_t S, int64_t R) {
  int lane = threadIdx.x % W;
  int64_t first = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / W;
  int64_t step = ((int64_t)gridDim.x * blockDim.x) / W;
  for (int64_t o = first; o < K; o += step) { /* o is the same across a warp when W is 32 */
    typename Op::Acc a = Op::init();
    for (int64_t s = lane; s < S; s += W) a = Op::join(a, partial[s * K + o]);
    a = warp_join<Op, W>(a);
    if (lane == 0) y[o] = Op::post(a, aux ? aux[o] : 0.0f, R);
  }
}

/* Outputs of an empty reduction (a reduced extent is 0): post(init). */
template <class Op>
__global__ void reduce_empty(const float *aux, float *y, int64_t K) {
  for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < K;
       o += (int64_t)gridDim.x * blockDim.x)
    y[o] = Op::post(Op::init(), aux ? aux[o] : -INFINITY, 0);
}

/* How a reduction is laid out on the GPU, fixed by the shapes alone so the
 * first run and the captured ones agree (and scratch is sized once). */
struct RedLaunch {
  bool by_group; /* else by thread */
  int group;     /* 8, 32 or 256 threads per output when by_group */
  int64_t S;     /* pieces of the reduced range; 1: no join */
};

static RedLaunch reduce_launch(const RedGeom &g) {
  RedLaunch l;
  l.by_group = g.inner_reduced;
  /* Short runs (a 7x7 plane) would leave most of a warp idle. */
  l.group = g.R >= 2048 ? 256 : g.R > 64 ? 32 : 8;
  l.S = 1;
  if (g.R == 0) return l;
  if (l.by_group) {
    int64_t want = PARALLEL_TARGET / l.group;       /* groups */
    int64_t most = g.R / ((int64_t)l.group * 8);    /* >= 8 elements per thread */
    if (g.K < want && most > 1) l.S = std::min((want + g.K - 1) / g.K, most);
  } else {
    int64_t want = PARALLEL_TARGET / 2, most = g.R / 32; /* >= 32 elements per thread */
    if (g.K < want && most > 1) l.S = std::min((want + g.K - 1) / g.K, most);
  }
  return l;
}

/* y[0..K) = the reduction Op of x as g lays it out; aux as for Op::map
 * (NULL when unused); partial: scratch for l.S * K accumulators. */
template <class Op>
static int reduce_launch_op(CudaCtx *cx, const RedGeom &g, const RedLaunch &l, const float *x,
                            const float *aux, float *y, void *partial_mem, Diag *d) {
  const int threads = 256;
  typedef typename Op::Acc Acc;
  if (g.R == 0) {
    reduce_empty<Op><<<cuda_blocks(g.K, threads), threads, 0, cx->stream>>>(aux, y, g.K);
    CUDA_LAUNCHED();
    return TEQ_OK;
  }
  Acc *partial = l.S > 1 ? (Acc *)partial_mem : NULL;
  if (!l.by_group) {
    reduce_by_thread<Op><<<cuda_blocks(g.K * l.S, threads), threads, 0, cx->stream>>>(
        x, aux, y, partial, g, l.S);
  } else if (l.group == 8) {
    reduce_by_group<Op, 8><<<cuda_blocks(g.K * l.S, threads / 8), threads, 0, cx->stream>>>(
        x, aux, y, partial, g, l.S);
  } else if (l.group == 32) {
    reduce_by_group<Op, 32><<<cuda_blocks(g.K * l.S, threads / 32), threads, 0, cx->stream>>>(
        x, aux, y, partial, g, l.S);
  } else {
    reduce_by_group<Op, 256><<<cuda_blocks(g.K * l.S, 1), 256, 0, cx->stream>>>(
        x, aux, y, partial, g, l.S);
  }
  CUDA_LAUNCHED();
  if (partial) {
    if (l.S >= 32)
      reduce_join<Op, 32><<<cuda_blocks(g.K, threads / 32), threads, 0, cx->stream>>>(
          partial, aux, y, g.K, l.S, g.R);
    else
      reduce_join<Op, 1><<<cuda_blocks(g.K, threads), threads, 0, cx->stream>>>(
          partial, aux, y, g.K, l.S, g.R);
    CUDA_LAUNCHED();
  }
  return TEQ_OK;
}

/* The geometry of reducing x over n's axes (empty: all), as the CPU's
 * reduce_mask and reduce_plan see it. */
static int reduce_geom(const Node *n, const Shape *x, RedGeom *g, Diag *d) {
  const ParamValue *a = &n->params.v[RED_AXES];
  bool mask[TEQ_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++) mask[i] = a->n == 0;
  for (int j = 0; j < a->n; j++) {
    if (a->i[j] < 0 || a->i[j] >= x->ndim)
      return diag_error(d, "%s: axes[%d]=%lld out of range for rank %d\n",
                        op_def(n->kind)->name, j, (long long)a->i[j], x->ndim);
    mask[a->i[j]] = true;
  }
  int64_t st[TEQ_MAX_DIMS], s = 1;
  for (int i = x->ndim - 1; i >= 0; i--) st[i] = s, s *= x->d[i];
  g->nk = g->nr = 0;
  g->K = g->R = 1;
  int last = -1; /* kind of the previous merged dimension: 1 reduced, 0 kept */
  for (int i = 0; i < x->ndim; i++) {
    if (mask[i]) g->R *= x->d[i];
    else g->K *= x->d[i];
    if (x->d[i] == 1) continue;
    int kind = mask[i] ? 1 : 0;
    /* Dimensions between two kept on the same side are extent 1, so
     * neighbours of one kind are contiguous and merge. */
    if (kind == last) {
      if (kind) g->rext[g->nr - 1] *= x->d[i], g->rst[g->nr - 1] = st[i];
      else g->kext[g->nk - 1] *= x->d[i], g->kst[g->nk - 1] = st[i];
    } else if (kind) {
      g->rext[g->nr] = x->d[i], g->rst[g->nr++] = st[i];
    } else {
      g->kext[g->nk] = x->d[i], g->kst[g->nk++] = st[i];
    }
    last = kind;
  }
  /* The innermost dimension of extent > 1 has stride 1. */
  g->inner_reduced = last == 1;
  /* Every reduced extent 1: one element per output, read at offset 0. */
  if (g->nr == 0) g->rext[0] = 1, g->rst[0] = 0, g->nr = 1;
  return TEQ_OK;
}

static int check_f32(const Node *n, const CudaTensor *in, const CudaTensor *out, DType out_dt,
                     Diag *d) {
  if (in[0].dtype != DT_F32 || out[0].dtype != out_dt)
    return diag_error(d, "%s: GPU kernel takes float32 input and %s output\n",
                      op_def(n->kind)->name, out_dt == DT_I64 ? "int64" : "float32");
  return TEQ_OK;
}

/* The reduction rows: Op folds, MaxOp first finds each output's maximum
 * when the row needs it (log_sum_exp). */
template <class Op, bool MAX_FIRST>
static int reduce_eval(CUDA_KERNEL_SIGNATURE) {
  int rc = check_f32(n, in, out, DT_F32, d);
  if (rc) return rc;
  RedGeom g;
  if ((rc = reduce_geom(n, &in[0].shape, &g, d))) return rc;
  if (g.K == 0) return TEQ_OK;
  if (shape_numel(&out[0].shape) != g.K)
    return diag_error(d, "%s: output has %lld elements, expected %lld\n", op_def(n->kind)->name,
                      (long long)shape_numel(&out[0].shape), (long long)g.K);
  RedLaunch l = reduce_launch(g);
  /* Scratch: the maxima (aligned), then the partial folds. */
  size_t aux_bytes = MAX_FIRST ? ((size_t)g.K * sizeof(float) + 255) / 256 * 256 : 0;
  size_t part_bytes = l.S > 1 ? (size_t)(l.S * g.K) * sizeof(double) : 0;
  char *scratch = NULL;
  if (aux_bytes + part_bytes) {
    scratch = (char *)cuda_scratch(cx, aux_bytes + part_bytes, d);
    if (!scratch) return TEQ_ERR_NOMEM;
  }
  const float *x = (const float *)in[0].data;
  float *y = (float *)out[0].data, *aux = MAX_FIRST ? (float *)scratch : NULL;
  if (MAX_FIRST && (rc = reduce_launch_op<MaxOp>(cx, g, l, x, NULL, aux, scratch + aux_bytes, d)))
    return rc;
  if (l.by_group)
    cuda_note(cx, "%d threads per output, K=%lld R=%lld pieces=%lld", l.group, (long long)g.K,
              (long long)g.R, (long long)l.S);
  else
    cuda_note(cx, "thread per output, K=%lld R=%lld pieces=%lld", (long long)g.K, (long long)g.R,
              (long long)l.S);
  return reduce_launch_op<Op>(cx, g, l, x, aux, y, scratch + aux_bytes, d);
}

}  // namespace

extern "C" int cuda_eval_reduce_mean(CUDA_KERNEL_SIGNATURE) {
  return reduce_eval<MeanOp, false>(n, cx, in, out, d);
}
extern "C" int cuda_eval_reduce_sum(CUDA_KERNEL_SIGNATURE) {
  return reduce_eval<SumOp, false>(n, cx, in, out, d);
}
extern "C" int cuda_eval_reduce_max(CUDA_KERNEL_SIGNATURE) {
  return reduce_eval<MaxOp, false>(n, cx, in, out, d);
}
extern "C" int cuda_eval_reduce_min(CUDA_KERNEL_SIGNATURE) {
  return reduce_eval<MinOp, false>(n, cx, in, out, d);
}
extern "C" int cuda_eval_reduce_prod(CUDA_KERNEL_SIGNATURE) {
  return reduce_eval<ProdOp, false>(n, cx, in, out, d);
}
extern "C" int cuda_eval_reduce_sum_square(CUDA_KERNEL_SIGNATURE) {
  return reduce_eval<SumSquareOp, false>(n, cx, in, out, d);
}
extern "C" int cuda_eval_reduce_l1(CUDA_KERNEL_SIGNATURE) {
  return reduce_eval<L1Op, false>(n, cx, in, out, d);
}
extern "C" int cuda_eval_reduce_l2(CUDA_KERNEL_SIGNATURE) {
  return reduce_eval<L2Op, false>(n, cx, in, out, d);
}
extern "C" int cuda_eval_reduce_log_sum(CUDA_KERNEL_SIGNATURE) {
  return reduce_eval<LogSumOp, false>(n, cx, in, out, d);
}
extern "C" int cuda_eval_reduce_log_sum_exp(CUDA_KERNEL_SIGNATURE) {
  return reduce_eval<ExpSumOp, true>(n, cx, in, out, d);
}

namespace {

/* ---- softmax and log_softmax ---- */

/* y from x, the line's maximum m and sum of e^(x - m): softmax multiplies
 * e^(x - m) by 1/sum, log_softmax subtracts log sum from x - m. */
template <bool LOG>
__device__ __forceinline__ float softmax_out(float v, float m, float inv_or_lse) {
  return LOG ? (v - m) - inv_or_lse : expf(v - m) * inv_or_lse;
}

template <bool LOG>
__device__ __forceinline__ float softmax_scale(float sum) {
  return LOG ? logf(sum) : 1.0f / sum;
}

/* Element k of a lane's PER_LANE in a warp's row: lane + 32k, or with VEC
 * the float4 lane + 32(k/4), element k%4, so each load moves 16 bytes. */
template <bool VEC>
__device__ __forceinline__ int lane_elem(int lane, int k) {
  return VEC ? (lane + 32 * (k >> 2)) * 4 + (k & 3) : lane + 32 * k;
}

/* A warp per row of len <= 32 * PER_LANE elements, held in registers (VEC:
 * len a multiple of 4, rows 16-byte aligned). */
template <bool LOG, int PER_LANE, bool VEC>
__global__ void softmax_rows_warp(const float *x, float *y, int64_t rows, int len) {
  int lane = threadIdx.x & 31;
  int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t row = warp; row < rows; row += warps) {
    const float *xr = x + row * len;
    float *yr = y + row * len;
    float v[PER_LANE];
    if (VEC) {
#pragma unroll
      for (int q = 0; q < PER_LANE / 4; q++) {
        int i = (lane + 32 * q) * 4;
        float4 f = i < len ? *(const float4 *)(xr + i)
                           : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int k = 0; k < PER_LANE; k++) {
        int i = lane + 32 * k;
        v[k] = i < len ? xr[i] : -INFINITY;
      }
    }
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < PER_LANE; k++) m = max_nan(m, v[k]);
    m = warp_join<MaxOp>(m);
    float sum = 0;
#pragma unroll
    for (int k = 0; k < PER_LANE; k++)
      if (lane_elem<VEC>(lane, k) < len) {
        float e = expf(v[k] - m);
        sum += e;
        if (!LOG) v[k] = e;
      }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, off);
    float scale = softmax_scale<LOG>(sum);
#pragma unroll
    for (int k = 0; k < PER_LANE; k++) v[k] = LOG ? (v[k] - m) - scale : v[k] * scale;
    if (VEC) {
#pragma unroll
      for (int q = 0; q < PER_LANE / 4; q++) {
        int i = (lane + 32 * q) * 4;
        if (i < len)
          *(float4 *)(yr + i) = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < PER_LANE; k++)
        if (lane + 32 * k < len) yr[lane + 32 * k] = v[k];
    }
  }
}

/* A running maximum m and sum s of e^(x - m) over some elements, rescaled
 * when the maximum grows, so a long row is read once for both. Where the
 * row's maximum is not finite (a NaN, +inf, or every element -inf) the CPU
 * gets NaN for every output (through inf - inf or NaN), and so do we: s
 * then does not matter. */
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ void max_sum_add(MaxSum &a, float x) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.0f; /* expf(-inf) = 0 at the start */
    a.m = x;
  } else if (x != x) {
    a.m = x;
  } else if (x != -INFINITY) {
    a.s += expf(x - a.m);
  }
}

__device__ __forceinline__ MaxSum max_sum_join(MaxSum a, MaxSum b) {
  MaxSum r;
  r.m = max_nan(a.m, b.m);
  if (!isfinite(r.m)) {
    r.s = 0;
    return r;
  }
  /* A part with s = 0 saw no finite element (its m may be -inf). */
  r.s = (a.s > 0 ? a.s * expf(a.m - r.m) : 0.0f) + (b.s > 0 ? b.s * expf(b.m - r.m) : 0.0f);
  return r;
}

/* The join over the block, returned to every thread. */
__device__ MaxSum max_sum_block(MaxSum a) {
  __shared__ MaxSum part[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int off = 16; off > 0; off >>= 1) {
    MaxSum o = {__shfl_xor_sync(FULL_MASK, a.m, off), __shfl_xor_sync(FULL_MASK, a.s, off)};
    a = max_sum_join(a, o);
  }
  __syncthreads(); /* part may still be read by the previous row */
  if (lane == 0) part[warp] = a;
  __syncthreads();
  a = lane < warps ? part[lane] : MaxSum{-INFINITY, 0.0f};
  for (int off = 16; off > 0; off >>= 1) {
    MaxSum o = {__shfl_xor_sync(FULL_MASK, a.m, off), __shfl_xor_sync(FULL_MASK, a.s, off)};
    a = max_sum_join(a, o);
  }
  return a;
}

/* A block per long row: one pass for the maximum and the sum, one for the
 * outputs (VEC: float4 accesses, len a multiple of 4, rows aligned). */
template <bool LOG, bool VEC>
__global__ void softmax_rows_block(const float *x, float *y, int64_t rows, int64_t len) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float *xr = x + row * len;
    float *yr = y + row * len;
    MaxSum a = {-INFINITY, 0.0f};
    if (VEC) {
      for (int64_t i = threadIdx.x; i < len / 4; i += blockDim.x) {
        float4 f = ((const float4 *)xr)[i];
        max_sum_add(a, f.x), max_sum_add(a, f.y), max_sum_add(a, f.z), max_sum_add(a, f.w);
      }
    } else {
      for (int64_t i = threadIdx.x; i < len; i += blockDim.x) max_sum_add(a, xr[i]);
    }
    a = max_sum_block(a);
    float m = isfinite(a.m) ? a.m : NAN, scale = softmax_scale<LOG>(a.s);
    if (VEC) {
      for (int64_t i = threadIdx.x; i < len / 4; i += blockDim.x) {
        float4 f = ((const float4 *)xr)[i];
        ((float4 *)yr)[i] = make_float4(softmax_out<LOG>(f.x, m, scale),
                                        softmax_out<LOG>(f.y, m, scale),
                                        softmax_out<LOG>(f.z, m, scale),
                                        softmax_out<LOG>(f.w, m, scale));
      }
    } else {
      for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
        yr[i] = softmax_out<LOG>(xr[i], m, scale);
    }
  }
}

/* A thread per (outer, inner) line along a middle axis: neighbouring
 * threads read neighbouring inner positions. */
template <bool LOG>
__global__ void softmax_lines(const float *x, float *y, int64_t outer, int64_t len,
                              int64_t inner) {
  int64_t total = outer * inner;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t o = t / inner, i = t - o * inner;
    const float *xl = x + o * len * inner + i;
    float *yl = y + o * len * inner + i;
    float m = -INFINITY;
    for (int64_t k = 0; k < len; k++) m = max_nan(m, xl[k * inner]);
    double sum = 0;
    for (int64_t k = 0; k < len; k++) sum += expf(xl[k * inner] - m);
    float scale = softmax_scale<LOG>((float)sum);
    for (int64_t k = 0; k < len; k++) yl[k * inner] = softmax_out<LOG>(xl[k * inner], m, scale);
  }
}

template <bool LOG, int PER_LANE>
static void softmax_warp_launch(CudaCtx *cx, const float *x, float *y, int64_t rows, int len,
                                bool vec) {
  const int threads = 256;
  unsigned blocks = cuda_blocks(rows, threads / 32);
  if (vec && PER_LANE >= 4)
    softmax_rows_warp<LOG, PER_LANE, true><<<blocks, threads, 0, cx->stream>>>(x, y, rows, len);
  else
    softmax_rows_warp<LOG, PER_LANE, false><<<blocks, threads, 0, cx->stream>>>(x, y, rows, len);
}

template <bool LOG>
static int softmax_eval(CUDA_KERNEL_SIGNATURE) {
  int rc = check_f32(n, in, out, DT_F32, d);
  if (rc) return rc;
  const Shape *s = &in[0].shape;
  int64_t axis = n->params.v[SOFTMAX_AXIS].i[0];
  if (axis < 0 || axis >= s->ndim)
    return diag_error(d, "%s: axis=%lld out of range for rank %d\n", op_def(n->kind)->name,
                      (long long)axis, s->ndim);
  int64_t outer = 1, len = s->d[axis], inner = 1;
  for (int i = 0; i < axis; i++) outer *= s->d[i];
  for (int i = (int)axis + 1; i < s->ndim; i++) inner *= s->d[i];
  if (outer * len * inner == 0) return TEQ_OK;
  const float *x = (const float *)in[0].data;
  float *y = (float *)out[0].data;
  /* float4 rows: every row starts 16-byte aligned. */
  bool vec = len % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)y % 16 == 0;
  const int threads = 256;
  if (inner > 1) {
    softmax_lines<LOG><<<cuda_blocks(outer * inner, threads), threads, 0, cx->stream>>>(
        x, y, outer, len, inner);
    cuda_note(cx, "lines");
  } else if (len <= 1024) {
    int l = (int)len;
    if (l <= 32) softmax_warp_launch<LOG, 1>(cx, x, y, outer, l, vec);
    else if (l <= 64) softmax_warp_launch<LOG, 2>(cx, x, y, outer, l, vec);
    else if (l <= 128) softmax_warp_launch<LOG, 4>(cx, x, y, outer, l, vec);
    else if (l <= 256) softmax_warp_launch<LOG, 8>(cx, x, y, outer, l, vec);
    else if (l <= 512) softmax_warp_launch<LOG, 16>(cx, x, y, outer, l, vec);
    else softmax_warp_launch<LOG, 32>(cx, x, y, outer, l, vec);
    cuda_note(cx, "warp per row%s", vec && len > 64 ? ", float4" : "");
  } else {
    int bt = len >= 8192 ? 1024 : 512;
    if (vec)
      softmax_rows_block<LOG, true><<<cuda_blocks(outer, 1), bt, 0, cx->stream>>>(x, y, outer,
                                                                                  len);
    else
      softmax_rows_block<LOG, false><<<cuda_blocks(outer, 1), bt, 0, cx->stream>>>(x, y, outer,
                                                                                   len);
    cuda_note(cx, "block per row%s", vec ? ", float4" : "");
  }
  CUDA_LAUNCHED();
  return TEQ_OK;
}

}  // namespace

extern "C" int cuda_eval_softmax(CUDA_KERNEL_SIGNATURE) {
  return softmax_eval<false>(n, cx, in, out, d);
}
extern "C" int cuda_eval_log_softmax(CUDA_KERNEL_SIGNATURE) {
  return softmax_eval<true>(n, cx, in, out, d);
}

namespace {

/* ---- argmax and argmin ---- */

/* Whether v replaces the best b met before it: the CPU's arg_take (NaN
 * beats every number; with last, an equal value replaces). SIGN -1 is min. */
template <int SIGN>
__device__ __forceinline__ bool arg_take(float v, float b, bool last) {
  if (b != b) return last && v != v;
  if (v != v) return true;
  return SIGN > 0 ? (v > b || (last && v == b)) : (v < b || (last && v == b));
}

/* Whether candidate (v, i) wins over (b, j) whatever their order: the
 * better value, and among equal ones (NaN equals NaN) the first index, or
 * the last with last. Joins the per-lane winners of a row. */
template <int SIGN>
__device__ __forceinline__ bool arg_wins(float v, int64_t i, float b, int64_t j, bool last) {
  bool vn = v != v, bn = b != b;
  if (vn || bn) return vn && bn ? (last ? i > j : i < j) : vn;
  if (v == b) return last ? i > j : i < j;
  return SIGN > 0 ? v > b : v < b;
}

/* A thread per (outer, inner) output, along the axis in order. */
template <int SIGN>
__global__ void arg_lines(const float *x, int64_t *y, int64_t outer, int64_t len, int64_t inner,
                          bool last) {
  int64_t total = outer * inner;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t o = t / inner, i = t - o * inner;
    const float *xl = x + o * len * inner + i;
    int64_t best = 0;
    float b = xl[0];
    for (int64_t k = 1; k < len; k++) {
      float v = xl[k * inner];
      if (arg_take<SIGN>(v, b, last)) b = v, best = k;
    }
    y[t] = best;
  }
}

/* G threads per row along the last axis (a warp, or the whole block when
 * G is blockDim.x; len >= G): each scans its elements in order, then the
 * threads' winners are joined. VEC: float4 loads (len a multiple of 4,
 * rows aligned, len / 4 >= G); each thread still starts from element lane,
 * which precedes its float4s and which another thread scans too: a
 * duplicate changes no winner. */
template <int SIGN, int G, bool VEC>
__global__ void arg_rows(const float *x, int64_t *y, int64_t rows, int64_t len, bool last) {
  __shared__ float part_v[32];
  __shared__ int64_t part_i[32];
  const int per_block = blockDim.x / G;
  int lane = threadIdx.x % G, wl = threadIdx.x & 31;
  /* Every thread of a block runs the same iterations (see reduce_by_group). */
  for (int64_t base = (int64_t)blockIdx.x * per_block; base < rows;
       base += (int64_t)gridDim.x * per_block) {
    int64_t row = base + threadIdx.x / G;
    bool live = row < rows;
    const float *xr = x + (live ? row : 0) * len;
    int64_t best = lane;
    float b = xr[lane];
    if (VEC) { /* float4 q holds elements 4q..4q+3, scanned in order */
      const float4 *x4 = (const float4 *)xr;
      for (int64_t q = lane; live && q < len / 4; q += G) {
        float4 f = x4[q];
        if (arg_take<SIGN>(f.x, b, last)) b = f.x, best = 4 * q;
        if (arg_take<SIGN>(f.y, b, last)) b = f.y, best = 4 * q + 1;
        if (arg_take<SIGN>(f.z, b, last)) b = f.z, best = 4 * q + 2;
        if (arg_take<SIGN>(f.w, b, last)) b = f.w, best = 4 * q + 3;
      }
    } else {
      for (int64_t k = lane + G; live && k < len; k += G) {
        float v = xr[k];
        if (arg_take<SIGN>(v, b, last)) b = v, best = k;
      }
    }
    for (int off = 16; off > 0; off >>= 1) {
      float ov = __shfl_xor_sync(FULL_MASK, b, off);
      int64_t oi = __shfl_xor_sync(FULL_MASK, best, off);
      if (arg_wins<SIGN>(ov, oi, b, best, last)) b = ov, best = oi;
    }
    if (G > 32) {
      int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
      __syncthreads(); /* the parts may still be read for the previous row */
      if (wl == 0) part_v[warp] = b, part_i[warp] = best;
      __syncthreads();
      b = part_v[wl < warps ? wl : 0], best = part_i[wl < warps ? wl : 0];
      for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, b, off);
        int64_t oi = __shfl_xor_sync(FULL_MASK, best, off);
        if (arg_wins<SIGN>(ov, oi, b, best, last)) b = ov, best = oi;
      }
    }
    if (live && lane == 0) y[row] = best;
  }
}

template <int SIGN>
static int arg_eval(CUDA_KERNEL_SIGNATURE) {
  int rc = check_f32(n, in, out, DT_I64, d);
  if (rc) return rc;
  const Shape *s = &in[0].shape;
  int64_t axis = n->params.v[ARG_AXIS].i[0];
  bool last = n->params.v[ARG_LAST].i[0] != 0;
  if (axis < 0 || axis >= s->ndim)
    return diag_error(d, "%s: axis=%lld out of range for rank %d\n", op_def(n->kind)->name,
                      (long long)axis, s->ndim);
  int64_t outer = 1, len = s->d[axis], inner = 1;
  for (int i = 0; i < axis; i++) outer *= s->d[i];
  for (int i = (int)axis + 1; i < s->ndim; i++) inner *= s->d[i];
  if (outer * inner == 0) return TEQ_OK;
  if (len == 0)
    return diag_error(d, "%s: axis %lld is empty, no element to select\n", op_def(n->kind)->name,
                      (long long)axis);
  const float *x = (const float *)in[0].data;
  int64_t *y = (int64_t *)out[0].data;
  const int threads = 256;
  bool vec = len % 4 == 0 && (uintptr_t)x % 16 == 0;
  if (inner == 1 && len >= 4096) {
    if (vec)
      arg_rows<SIGN, 256, true><<<cuda_blocks(outer, 1), 256, 0, cx->stream>>>(x, y, outer, len,
                                                                              last);
    else
      arg_rows<SIGN, 256, false><<<cuda_blocks(outer, 1), 256, 0, cx->stream>>>(x, y, outer, len,
                                                                               last);
    cuda_note(cx, "block per row%s", vec ? ", float4" : "");
  } else if (inner == 1 && len >= 32) {
    arg_rows<SIGN, 32, false><<<cuda_blocks(outer, threads / 32), threads, 0, cx->stream>>>(
        x, y, outer, len, last);
    cuda_note(cx, "warp per row");
  } else {
    arg_lines<SIGN><<<cuda_blocks(outer * inner, threads), threads, 0, cx->stream>>>(
        x, y, outer, len, inner, last);
    cuda_note(cx, "lines");
  }
  CUDA_LAUNCHED();
  return TEQ_OK;
}

}  // namespace

extern "C" int cuda_eval_argmax(CUDA_KERNEL_SIGNATURE) {
  return arg_eval<1>(n, cx, in, out, d);
}
extern "C" int cuda_eval_argmin(CUDA_KERNEL_SIGNATURE) {
  return arg_eval<-1>(n, cx, in, out, d);
}
