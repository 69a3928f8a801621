/* layout.cu: GPU kernels of the layout family (runtime/ops/layout.c):
 * transpose, reshape, concat, split, pad, slice, gather, depth_to_space,
 * space_to_depth, tile, expand.
 *
 * As on the CPU, these copy elements and compute nothing, so one kernel
 * serves float32 and int64 alike: it moves 4- or 8-byte words. Most rows
 * reduce to a Box, a strided copy from a source view to a destination view
 * (both with per-dimension strides; a stride of 0 repeats, a negative one
 * walks backwards), whose dimensions are first merged wherever both sides
 * step evenly, as box_collapse does on the CPU. What remains is copied by
 *   - cudaMemcpyAsync when it is one contiguous run;
 *   - a tiled shared-memory transpose when the source's contiguous
 *     dimension is not the destination's (NCHW <-> NHWC and the like), so
 *     both reads and writes are coalesced;
 *   - otherwise a grid-stride kernel over destination elements, with
 *     32-bit index arithmetic when the tensors are small enough and 8- or
 *     16-byte words when the innermost run allows (a contiguous row copied
 *     as uint4s).
 * Pad and gather have kernels of their own (a fill value and clamped or
 * reflected coordinates; an index tensor). */
#include <stdio.h>

#include "runtime/cuda/cuda_int.h"

namespace {

constexpr int kThreads = 256;
/* Below this many elements a kernel indexes with int: offsets and the
 * grid-stride index (i plus the grid's threads) stay far from 2^31. */
constexpr int64_t kIntIndexLimit = INT64_C(1) << 30;

/* ---- element size ---- */

/* Data inputs 0..n_data-1 and every output share one dtype, as layout.c's
 * elem_size requires: the kernels copy words of that size. */
int elem_size(const Node *n, const CudaTensor *in, int n_data, const CudaTensor *out,
              size_t *es, Diag *d) {
  DType t = out[0].dtype;
  for (int i = 0; i < n_data; i++)
    if (in[i].dtype != t)
      return op_error_report(n, d, "input %d is %s but the output is %s", i,
                             dtype_name(in[i].dtype), dtype_name(t));
  for (int i = 1; i < n->n_out; i++)
    if (out[i].dtype != t) return op_error_report(n, d, "outputs of different dtypes");
  *es = dtype_size(t);
  if (*es != 4 && *es != 8)
    return op_error_report(n, d, "%s elements: only 4- and 8-byte elements are copied on the GPU",
                           dtype_name(t));
  return TEQ_OK;
}

int64_t numel(const Shape &s) {
  int64_t k = 1;
  for (int i = 0; i < s.ndim; i++) k *= s.d[i];
  return k;
}

int64_t prod_dims(const Shape &s, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= s.d[i];
  return p;
}

void row_major_strides(const Shape &s, int64_t *st) {
  int64_t k = 1;
  for (int i = s.ndim - 1; i >= 0; i--) {
    st[i] = k;
    k *= s.d[i];
  }
}

/* ---- the box: a strided copy ---- */

/* Tile splits each dimension in two (which copy, where in it), hence twice
 * the rank, as BOX_MAX_DIMS in layout.c. */
constexpr int kBoxDims = 2 * TEQ_MAX_DIMS;

/* ext[i] elements along each of nd dimensions; source element strides ss,
 * destination element strides ds; the destination is walked in row-major
 * order of the box. Passed to kernels by value. */
struct Box {
  int nd;
  int64_t ext[kBoxDims], ss[kBoxDims], ds[kBoxDims];
};

/* Drops extent-1 dimensions and merges a dimension into the one outside it
 * when both sides step evenly across the boundary. */
void box_collapse(Box *b) {
  Box c;
  memset(&c, 0, sizeof c);
  for (int i = 0; i < b->nd; i++) {
    if (b->ext[i] == 1) continue;
    int k = c.nd - 1;
    if (k >= 0 && c.ss[k] == b->ss[i] * b->ext[i] && c.ds[k] == b->ds[i] * b->ext[i]) {
      c.ext[k] *= b->ext[i];
      c.ss[k] = b->ss[i];
      c.ds[k] = b->ds[i];
      continue;
    }
    c.ext[c.nd] = b->ext[i];
    c.ss[c.nd] = b->ss[i];
    c.ds[c.nd] = b->ds[i];
    c.nd++;
  }
  if (c.nd == 0) { /* one element */
    c.nd = 1;
    c.ext[0] = 1;
    c.ss[0] = c.ds[0] = 1;
  }
  *b = c;
}

/* The destination strides of a dense row-major box. */
void box_dense_dst(Box *b) {
  int64_t k = 1;
  for (int i = b->nd - 1; i >= 0; i--) {
    b->ds[i] = k;
    k *= b->ext[i];
  }
}

/* Words of W bytes, by size: the copy kernels move these. */
template <int W> struct Word;
template <> struct Word<4> { using T = uint32_t; };
template <> struct Word<8> { using T = uint2; };
template <> struct Word<16> { using T = uint4; };

/* Destination element i of the box (I: the index type, int or int64_t)
 * reads source element sum idx_k ss_k. */
template <typename T, typename I>
__global__ void box_copy_kernel(T *__restrict__ dst, const T *__restrict__ src, Box b,
                                int64_t total) {
  for (I i = (I)(blockIdx.x * (int64_t)blockDim.x + threadIdx.x); i < (I)total;
       i += (I)(gridDim.x * (int64_t)blockDim.x)) {
    I rest = i, so = 0, dof = 0;
    for (int k = b.nd - 1; k > 0; k--) {
      I e = (I)b.ext[k];
      I c = rest % e;
      rest /= e;
      so += c * (I)b.ss[k];
      dof += c * (I)b.ds[k];
    }
    so += rest * (I)b.ss[0];
    dof += rest * (I)b.ds[0];
    dst[dof] = src[so];
  }
}

/* A box whose dimension `a` has source stride 1 and whose innermost
 * dimension has destination stride 1 (and source stride not 1): a batch of
 * 2-D transposes, each through a 32x32 tile of shared memory so that both
 * the reads (along a) and the writes (along the innermost) are coalesced.
 * The other dimensions are the batch, walked by blockIdx.z. */
constexpr int kTile = 32, kTileRows = 8;

struct TileJob {
  Box batch;            /* the other dimensions (nd may be 0) */
  int64_t n_batch;
  int64_t rows, cols;   /* extents of dimension a and of the innermost */
  int64_t s_col;        /* source stride of the innermost (rows step 1) */
  int64_t d_row;        /* destination stride of dimension a (cols step 1) */
};

template <typename T>
__global__ void tile_transpose_kernel(T *__restrict__ dst, const T *__restrict__ src, TileJob j) {
  __shared__ T tile[kTile][kTile + 1];
  int64_t r0 = (int64_t)blockIdx.y * kTile, c0 = (int64_t)blockIdx.x * kTile;
  for (int64_t bz = blockIdx.z; bz < j.n_batch; bz += gridDim.z) {
    int64_t rest = bz, so = 0, dof = 0;
    for (int k = j.batch.nd - 1; k >= 0; k--) {
      int64_t c = rest % j.batch.ext[k];
      rest /= j.batch.ext[k];
      so += c * j.batch.ss[k];
      dof += c * j.batch.ds[k];
    }
    /* read: threadIdx.x runs along the rows (source-contiguous) */
    for (int y = threadIdx.y; y < kTile; y += kTileRows) {
      int64_t r = r0 + threadIdx.x, c = c0 + y;
      if (r < j.rows && c < j.cols) tile[threadIdx.x][y] = src[so + r + c * j.s_col];
    }
    __syncthreads();
    /* write: threadIdx.x runs along the columns (destination-contiguous) */
    for (int y = threadIdx.y; y < kTile; y += kTileRows) {
      int64_t r = r0 + y, c = c0 + threadIdx.x;
      if (r < j.rows && c < j.cols) dst[dof + r * j.d_row + c] = tile[y][threadIdx.x];
    }
    __syncthreads();
  }
}

bool aligned(const void *p, int64_t bytes) { return ((uintptr_t)p % (uintptr_t)bytes) == 0; }

/* Sets *taken unless the grid would be too large (the generic kernel then
 * does the copy). */
template <typename T>
int launch_tile_transpose(CudaCtx *cx, char *dst, const char *src, const Box &b, int a,
                          bool *taken, Diag *d) {
  TileJob j;
  memset(&j, 0, sizeof j);
  int last = b.nd - 1;
  for (int k = 0; k < last; k++) {
    if (k == a) continue;
    j.batch.ext[j.batch.nd] = b.ext[k];
    j.batch.ss[j.batch.nd] = b.ss[k];
    j.batch.ds[j.batch.nd] = b.ds[k];
    j.batch.nd++;
  }
  j.n_batch = 1;
  for (int k = 0; k < j.batch.nd; k++) j.n_batch *= j.batch.ext[k];
  j.rows = b.ext[a];
  j.cols = b.ext[last];
  j.s_col = b.ss[last];
  j.d_row = b.ds[a];
  int64_t gx = (j.cols + kTile - 1) / kTile, gy = (j.rows + kTile - 1) / kTile;
  *taken = gx <= INT32_MAX && gy <= 65535;
  if (!*taken) return TEQ_OK;
  dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)(j.n_batch < 65535 ? j.n_batch : 65535));
  tile_transpose_kernel<T><<<grid, dim3(kTile, kTileRows), 0, cx->stream>>>(
      (T *)dst, (const T *)src, j);
  CUDA_LAUNCHED();
  cuda_note(cx, "tiled transpose %lldx%lld x%lld", (long long)j.rows, (long long)j.cols,
            (long long)j.n_batch);
  return TEQ_OK;
}

template <typename T>
int launch_box_kernel(CudaCtx *cx, char *dst, const char *src, const Box &b, int64_t total,
                      bool small, Diag *d) {
  unsigned blocks = cuda_blocks(total, kThreads);
  if (small)
    box_copy_kernel<T, int><<<blocks, kThreads, 0, cx->stream>>>((T *)dst, (const T *)src, b,
                                                                 total);
  else
    box_copy_kernel<T, int64_t><<<blocks, kThreads, 0, cx->stream>>>((T *)dst, (const T *)src,
                                                                     b, total);
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* Copies the box from src to dst (byte pointers at the views' origins) in
 * elements of es bytes. src_span and dst_span bound, in elements, how far
 * any offset reaches from either origin (the tensors' sizes): below 2^30
 * the kernel indexes with int. */
int box_copy(CudaCtx *cx, void *dst_p, const void *src_p, Box b, size_t es, int64_t src_span,
             int64_t dst_span, Diag *d) {
  char *dst = (char *)dst_p;
  const char *src = (const char *)src_p;
  for (int i = 0; i < b.nd; i++)
    if (b.ext[i] == 0) return TEQ_OK;
  box_collapse(&b);
  int last = b.nd - 1;
  int64_t total = 1;
  for (int i = 0; i < b.nd; i++) total *= b.ext[i];
  int64_t e = (int64_t)es;
  if (b.nd == 1 && b.ss[0] == 1 && b.ds[0] == 1) { /* one contiguous run */
    CUDA_TRY(cudaMemcpyAsync(dst, src, (size_t)(total * e), cudaMemcpyDeviceToDevice,
                             cx->stream));
    cuda_note(cx, "memcpy");
    return TEQ_OK;
  }
  /* The source's contiguous dimension is not the innermost: tile. (A
   * repeated innermost, stride 0, tiles too: measured faster than the
   * generic kernel for [C,1,1] -> [N,C,H,W].) */
  if (b.ds[last] == 1 && b.ss[last] != 1 && b.ext[last] >= 8) {
    for (int a = last - 1; a >= 0; a--) {
      if (b.ss[a] != 1 || b.ext[a] < 8) continue;
      bool taken = false;
      int rc = es == 4 ? launch_tile_transpose<uint32_t>(cx, dst, src, b, a, &taken, d)
                       : launch_tile_transpose<uint2>(cx, dst, src, b, a, &taken, d);
      if (rc || taken) return rc;
      break;
    }
  }
  /* Wider words when the innermost dimension is a contiguous run on both
   * sides and every stride and origin keeps their alignment. */
  int w = (int)es;
  if (b.ss[last] == 1 && b.ds[last] == 1) {
    for (int cand = 16; cand > w; cand /= 2) {
      bool ok = (b.ext[last] * e) % cand == 0 && aligned(dst, cand) && aligned(src, cand);
      for (int i = 0; ok && i < last; i++) ok = (b.ss[i] * e) % cand == 0 && (b.ds[i] * e) % cand == 0;
      if (ok) {
        w = cand;
        break;
      }
    }
    if (w != (int)es) {
      int64_t f = w / e;
      b.ext[last] /= f;
      for (int i = 0; i < last; i++) b.ss[i] /= f, b.ds[i] /= f;
      total /= f;
      src_span /= f;
      dst_span /= f;
    }
  }
  bool small = total < kIntIndexLimit && src_span < kIntIndexLimit && dst_span < kIntIndexLimit;
  cuda_note(cx, "box %dd, %d-byte words", b.nd, w);
  switch (w) {
  case 16: return launch_box_kernel<uint4>(cx, dst, src, b, total, small, d);
  case 8: return launch_box_kernel<uint2>(cx, dst, src, b, total, small, d);
  default: return launch_box_kernel<uint32_t>(cx, dst, src, b, total, small, d);
  }
}

/* A dense destination. */
int box_copy_dense(CudaCtx *cx, void *dst, const void *src, Box b, size_t es, int64_t src_span,
                   int64_t dst_span, Diag *d) {
  box_dense_dst(&b);
  return box_copy(cx, dst, src, b, es, src_span, dst_span, d);
}

/* ---- pad ---- */

struct PadJob {
  int nd;
  int64_t ext[TEQ_MAX_DIMS];   /* output extents */
  int64_t len[TEQ_MAX_DIMS];   /* input extents */
  int64_t begin[TEQ_MAX_DIMS]; /* pads before (negative: crop) */
  int64_t ist[TEQ_MAX_DIMS];   /* input strides */
  int mode;
};

/* pad_source of layout.c: the input index of output index o - begin, or -1
 * for the fill value. */
template <typename I>
__device__ __forceinline__ I pad_source(I s, I len, int mode) {
  if (s >= 0 && s < len) return s;
  if (mode == PAD_CONSTANT) return -1;
  if (mode == PAD_EDGE) return s < 0 ? 0 : len - 1;
  return s < 0 ? -s : 2 * (len - 1) - s; /* reflect: pads < len checked by infer */
}

template <typename T, typename I>
__global__ void pad_kernel(T *__restrict__ dst, const T *__restrict__ src, PadJob j, T fill,
                           int64_t total) {
  for (I i = (I)(blockIdx.x * (int64_t)blockDim.x + threadIdx.x); i < (I)total;
       i += (I)(gridDim.x * (int64_t)blockDim.x)) {
    I rest = i, off = 0;
    bool inside = true;
    for (int k = j.nd - 1; k >= 0; k--) {
      I c = rest % (I)j.ext[k];
      rest /= (I)j.ext[k];
      I s = (I)pad_source(c - (I)j.begin[k], (I)j.len[k], j.mode);
      inside = inside && s >= 0;
      off += s * (I)j.ist[k];
    }
    dst[i] = inside ? src[off] : fill;
  }
}

template <typename T>
int launch_pad(CudaCtx *cx, void *dst, const void *src, const PadJob &j, T fill, int64_t total,
               int64_t in_total, Diag *d) {
  unsigned blocks = cuda_blocks(total, kThreads);
  if (total < kIntIndexLimit && in_total < kIntIndexLimit)
    pad_kernel<T, int><<<blocks, kThreads, 0, cx->stream>>>((T *)dst, (const T *)src, j, fill,
                                                            total);
  else
    pad_kernel<T, int64_t><<<blocks, kThreads, 0, cx->stream>>>((T *)dst, (const T *)src, j,
                                                                fill, total);
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* ---- gather ---- */

/* Output [outer, count, inner] from data [outer, len, inner]: element
 * (o, j, k) is data (o, idx[j], k). Indices are int64 (or integral
 * float32 from a float32 graph input), negative ones count from the end.
 * The CPU refuses an index out of [-len, len); the device cannot report
 * one without waiting, so such an index yields `bad` (NaN for float32
 * data, which makes the fault visible, 0 for int64) instead of reading out
 * of bounds. */
template <typename T, typename X>
__global__ void gather_kernel(T *__restrict__ dst, const T *__restrict__ src,
                              const X *__restrict__ idx, int64_t count, int64_t len,
                              int64_t inner, T bad, int64_t total) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += gridDim.x * (int64_t)blockDim.x) {
    int64_t k = i % inner, oj = i / inner;
    int64_t j = oj % count, o = oj / count;
    X raw = idx[j];
    int64_t x = (int64_t)raw;
    bool ok = (X)x == raw && x >= -len && x < len;
    x = x < 0 ? x + len : x;
    dst[i] = ok ? src[(o * len + x) * inner + k] : bad;
  }
}

template <typename T, typename X>
int launch_gather(CudaCtx *cx, void *dst, const void *src, const void *idx, int64_t count,
                  int64_t len, int64_t inner, T bad, int64_t total, Diag *d) {
  gather_kernel<T, X><<<cuda_blocks(total, kThreads), kThreads, 0, cx->stream>>>(
      (T *)dst, (const T *)src, (const X *)idx, count, len, inner, bad, total);
  CUDA_LAUNCHED();
  return TEQ_OK;
}

} // namespace

/* ---- a chain of layout operators, gathered (plan.h: plan_gathers) ---- */

/* Row r of dst (len words) is a copy of the run rows[r] points at, or
 * zeros where it is NULL. W is float or float4, I the index type. */
template <typename W, typename I>
static __global__ void gather_rows_kernel(W *__restrict__ dst, const W *const *__restrict__ rows,
                                          I len, I total) {
  for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < total; i += gridDim.x * (I)blockDim.x) {
    I r = i / len;
    const W *src = rows[r];
    dst[i] = src ? src[i - r * len] : W{};
  }
}

template <typename W>
static void launch_gather_rows(CudaCtx *cx, void *dst, const void *rows, int64_t len,
                               int64_t total) {
  unsigned blocks = cuda_blocks(total, kThreads);
  if (total < kIntIndexLimit)
    gather_rows_kernel<W, int><<<blocks, kThreads, 0, cx->stream>>>(
        (W *)dst, (const W *const *)rows, (int)len, (int)total);
  else
    gather_rows_kernel<W, int64_t><<<blocks, kThreads, 0, cx->stream>>>(
        (W *)dst, (const W *const *)rows, len, total);
}

int cuda_gather_rows(CudaCtx *cx, const float *const *rows, int64_t n_rows, int64_t row_len,
                     bool aligned16, float *out, Diag *d) {
  /* Rows of whole float4s, each starting on 16 bytes, copy as float4s. */
  bool vec = aligned16 && row_len % 4 == 0 && ((uintptr_t)out & 15) == 0;
  if (vec) launch_gather_rows<float4>(cx, out, rows, row_len / 4, n_rows * (row_len / 4));
  else launch_gather_rows<float>(cx, out, rows, row_len, n_rows * row_len);
  /* run-model --steps shows the exit's node: say it runs its chain */
  cuda_note(cx, "gather of a layout chain: %lld rows of %lld%s", (long long)n_rows,
            (long long)row_len, vec ? ", float4" : "");
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* ---- the rows ---- */

extern "C" int cuda_eval_transpose(CUDA_KERNEL_SIGNATURE) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  const ParamValue *p = &n->params.v[0];
  int r = in[0].shape.ndim;
  int64_t ist[TEQ_MAX_DIMS];
  row_major_strides(in[0].shape, ist);
  Box b;
  memset(&b, 0, sizeof b);
  b.nd = r;
  for (int i = 0; i < r; i++) {
    int64_t perm = p->n ? p->i[i] : r - 1 - i; /* empty perm reverses, as in ONNX */
    b.ext[i] = out[0].shape.d[i];
    b.ss[i] = ist[perm];
  }
  int64_t k = numel(out[0].shape);
  return box_copy_dense(cx, out[0].data, in[0].data, b, es, k, k, d);
}

extern "C" int cuda_eval_reshape(CUDA_KERNEL_SIGNATURE) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  int64_t k = numel(out[0].shape);
  if (k == 0 || out[0].data == in[0].data) return TEQ_OK;
  CUDA_TRY(cudaMemcpyAsync(out[0].data, in[0].data, (size_t)k * es, cudaMemcpyDeviceToDevice,
                           cx->stream));
  cuda_note(cx, "memcpy");
  return TEQ_OK;
}

/* Each input is a box [outer, len_k * inner] written into the output's
 * rows at column offset_k * inner. */
extern "C" int cuda_eval_concat(CUDA_KERNEL_SIGNATURE) {
  size_t es = 0;
  int rc = elem_size(n, in, n->n_in, out, &es, d);
  if (rc) return rc;
  int axis = (int)param_int(&n->params, 0);
  const Shape &o = out[0].shape;
  int64_t outer = prod_dims(o, 0, axis), inner = prod_dims(o, axis + 1, o.ndim);
  int64_t row = o.d[axis] * inner, at = 0, total = numel(o);
  for (int k = 0; k < n->n_in && !rc; k++) {
    int64_t chunk = in[k].shape.d[axis] * inner;
    Box b;
    memset(&b, 0, sizeof b);
    b.nd = 2;
    b.ext[0] = outer;
    b.ext[1] = chunk;
    b.ss[0] = chunk;
    b.ss[1] = 1;
    b.ds[0] = row;
    b.ds[1] = 1;
    rc = box_copy(cx, (char *)out[0].data + at * (int64_t)es, in[k].data, b, es,
                  numel(in[k].shape), total, d);
    at += chunk;
  }
  return rc;
}

/* Output k is the box [outer, len_k * inner] read from the input's rows
 * at column offset_k * inner. */
extern "C" int cuda_eval_split(CUDA_KERNEL_SIGNATURE) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  int axis = (int)param_int(&n->params, 0); /* SPLIT_AXIS */
  const Shape &x = in[0].shape;
  int64_t outer = prod_dims(x, 0, axis), inner = prod_dims(x, axis + 1, x.ndim);
  int64_t row = x.d[axis] * inner, at = 0, total = numel(x);
  for (int k = 0; k < n->n_out && !rc; k++) {
    int64_t chunk = out[k].shape.d[axis] * inner;
    Box b;
    memset(&b, 0, sizeof b);
    b.nd = 2;
    b.ext[0] = outer;
    b.ext[1] = chunk;
    b.ss[0] = row;
    b.ss[1] = 1;
    rc = box_copy_dense(cx, out[k].data, (const char *)in[0].data + at * (int64_t)es, b, es,
                        total, numel(out[k].shape), d);
    at += chunk;
  }
  return rc;
}

extern "C" int cuda_eval_pad(CUDA_KERNEL_SIGNATURE) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  double v = param_float(&n->params, PAD_VALUE);
  DType t = out[0].dtype;
  if (t != DT_F32 && (!(v > -0x1p53 && v < 0x1p53) || v != (double)(int64_t)v))
    return op_error_report(n, d, "value=%g is not an integer, so it has no %s value", v,
                           dtype_name(t));
  int64_t total = numel(out[0].shape);
  if (total == 0) return TEQ_OK;
  const Shape &x = in[0].shape;
  int r = x.ndim;
  if (r == 0) {
    CUDA_TRY(cudaMemcpyAsync(out[0].data, in[0].data, es, cudaMemcpyDeviceToDevice, cx->stream));
    return TEQ_OK;
  }
  PadJob j;
  memset(&j, 0, sizeof j);
  j.nd = r;
  j.mode = (int)param_int(&n->params, PAD_MODE);
  row_major_strides(x, j.ist);
  for (int i = 0; i < r; i++) {
    j.ext[i] = out[0].shape.d[i];
    j.len[i] = x.d[i];
    j.begin[i] = n->params.v[PAD_PADS].i[i];
  }
  if (es == 4) {
    float f = (float)v;
    uint32_t fill;
    memcpy(&fill, &f, sizeof fill);
    return launch_pad<uint32_t>(cx, out[0].data, in[0].data, j, fill, total, numel(x), d);
  }
  int64_t iv = (int64_t)v; /* 8-byte elements are int64: v is an integer (checked) */
  unsigned long long fill;
  memcpy(&fill, &iv, sizeof fill);
  return launch_pad<unsigned long long>(cx, out[0].data, in[0].data, j, fill, total, numel(x), d);
}

/* Starts, ends and steps are stored clamped for every dimension (see
 * slice_params): the output is a box from the start with stride
 * step * input stride, negative for a negative step. */
extern "C" int cuda_eval_slice(CUDA_KERNEL_SIGNATURE) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  int64_t total = numel(out[0].shape);
  if (total == 0) return TEQ_OK;
  const Params *p = &n->params;
  int r = in[0].shape.ndim;
  int64_t ist[TEQ_MAX_DIMS], base = 0;
  row_major_strides(in[0].shape, ist);
  Box b;
  memset(&b, 0, sizeof b);
  b.nd = r;
  for (int i = 0; i < r; i++) {
    b.ext[i] = out[0].shape.d[i];
    b.ss[i] = ist[i] * p->v[2].i[i]; /* SLICE_STEPS */
    base += ist[i] * p->v[0].i[i];   /* SLICE_STARTS */
  }
  return box_copy_dense(cx, out[0].data, (const char *)in[0].data + base * (int64_t)es, b, es,
                        numel(in[0].shape), total, d);
}

extern "C" int cuda_eval_gather(CUDA_KERNEL_SIGNATURE) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  int64_t total = numel(out[0].shape);
  if (total == 0) return TEQ_OK;
  int axis = (int)param_int(&n->params, 0);
  const Shape &x = in[0].shape;
  int64_t len = x.d[axis], inner = prod_dims(x, axis + 1, x.ndim);
  int64_t count = numel(in[1].shape);
  DType it = in[1].dtype;
  if (it != DT_I64 && it != DT_F32)
    return op_error_report(n, d, "indices are %s: int64 or float32 expected", dtype_name(it));
  bool i64 = it == DT_I64;
  /* Rows of 16 bytes of int64 data move as uint4 words (no NaN needed). */
  if (out[0].dtype == DT_I64 && (inner * 8) % 16 == 0 && aligned(out[0].data, 16) &&
      aligned(in[0].data, 16)) {
    int64_t w = inner / 2;
    uint4 z = make_uint4(0, 0, 0, 0);
    return i64 ? launch_gather<uint4, int64_t>(cx, out[0].data, in[0].data, in[1].data, count,
                                               len, w, z, total / 2, d)
               : launch_gather<uint4, float>(cx, out[0].data, in[0].data, in[1].data, count,
                                             len, w, z, total / 2, d);
  }
  if (out[0].dtype == DT_I64) {
    unsigned long long z = 0;
    return i64 ? launch_gather<unsigned long long, int64_t>(cx, out[0].data, in[0].data,
                                                            in[1].data, count, len, inner, z,
                                                            total, d)
               : launch_gather<unsigned long long, float>(cx, out[0].data, in[0].data,
                                                          in[1].data, count, len, inner, z,
                                                          total, d);
  }
  /* Float rows of 16 bytes move as float4, a bad index giving NaNs. */
  if (inner % 4 == 0 && aligned(out[0].data, 16) && aligned(in[0].data, 16)) {
    float4 nan4 = make_float4(NAN, NAN, NAN, NAN);
    int64_t w = inner / 4;
    return i64 ? launch_gather<float4, int64_t>(cx, out[0].data, in[0].data, in[1].data, count,
                                                len, w, nan4, total / 4, d)
               : launch_gather<float4, float>(cx, out[0].data, in[0].data, in[1].data, count,
                                              len, w, nan4, total / 4, d);
  }
  return i64 ? launch_gather<float, int64_t>(cx, out[0].data, in[0].data, in[1].data, count, len,
                                             inner, NAN, total, d)
             : launch_gather<float, float>(cx, out[0].data, in[0].data, in[1].data, count, len,
                                           inner, NAN, total, d);
}

/* As layout.c: the output [N, C/b^2, H*b, W*b] is the box
 * [N, C/b^2, H, b, W, b]; output (n, c, h, i, w, j) is input channel
 * (i b + j) C/b^2 + c in DCR mode, c b^2 + i b + j in CRD mode. */
extern "C" int cuda_eval_depth_to_space(CUDA_KERNEL_SIGNATURE) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  const Shape &x = in[0].shape;
  int64_t b = param_int(&n->params, 0), c = x.d[1] / (b * b), st[TEQ_MAX_DIMS];
  row_major_strides(x, st);
  bool dcr = param_int(&n->params, 1) == 0; /* D2S_MODE: 0 DCR, 1 CRD */
  Box box;
  memset(&box, 0, sizeof box);
  box.nd = 6;
  int64_t ext[6] = {x.d[0], c, x.d[2], b, x.d[3], b};
  int64_t ss[6] = {st[0], dcr ? st[1] : b * b * st[1], st[2], dcr ? b * c * st[1] : b * st[1],
                   st[3], dcr ? c * st[1] : st[1]};
  for (int i = 0; i < 6; i++) box.ext[i] = ext[i], box.ss[i] = ss[i];
  int64_t k = numel(x);
  return box_copy_dense(cx, out[0].data, in[0].data, box, es, k, k, d);
}

/* The output [N, C b^2, H/b, W/b] is the box [N, b, b, C, H/b, W/b]:
 * output (n, i, j, c, h, w) is input (n, c, h b + i, w b + j). */
extern "C" int cuda_eval_space_to_depth(CUDA_KERNEL_SIGNATURE) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  const Shape &x = in[0].shape;
  int64_t b = param_int(&n->params, 0), st[TEQ_MAX_DIMS];
  row_major_strides(x, st);
  Box box;
  memset(&box, 0, sizeof box);
  box.nd = 6;
  int64_t ext[6] = {x.d[0], b, b, x.d[1], x.d[2] / b, x.d[3] / b};
  int64_t ss[6] = {st[0], st[2], st[3], st[1], b * st[2], b * st[3]};
  for (int i = 0; i < 6; i++) box.ext[i] = ext[i], box.ss[i] = ss[i];
  int64_t k = numel(x);
  return box_copy_dense(cx, out[0].data, in[0].data, box, es, k, k, d);
}

/* Each output dimension of extent r d is the box pair [r, d]: the copy,
 * read with stride 0, then the place in it. */
extern "C" int cuda_eval_tile(CUDA_KERNEL_SIGNATURE) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  const Shape &x = in[0].shape;
  int64_t st[TEQ_MAX_DIMS];
  row_major_strides(x, st);
  Box b;
  memset(&b, 0, sizeof b);
  b.nd = 2 * x.ndim;
  for (int i = 0; i < x.ndim; i++) {
    b.ext[2 * i] = n->params.v[0].i[i];
    b.ext[2 * i + 1] = x.d[i];
    b.ss[2 * i + 1] = st[i];
  }
  return box_copy_dense(cx, out[0].data, in[0].data, b, es, numel(x), numel(out[0].shape), d);
}

/* Dimensions the input lacks or has as 1 are read with stride 0. */
extern "C" int cuda_eval_expand(CUDA_KERNEL_SIGNATURE) {
  size_t es = 0;
  int rc = elem_size(n, in, 1, out, &es, d);
  if (rc) return rc;
  const Shape &x = in[0].shape, &o = out[0].shape;
  int64_t st[TEQ_MAX_DIMS];
  row_major_strides(x, st);
  Box b;
  memset(&b, 0, sizeof b);
  b.nd = o.ndim;
  for (int i = 0; i < o.ndim; i++) {
    int k = i - (o.ndim - x.ndim);
    b.ext[i] = o.d[i];
    b.ss[i] = k < 0 || x.d[k] == 1 ? 0 : st[k];
  }
  return box_copy_dense(cx, out[0].data, in[0].data, b, es, numel(x), numel(o), d);
}
