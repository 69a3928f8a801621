/* conv.cu: GPU kernels of the conv family (runtime/ops/conv.c, conv3d.c):
 * conv2d, conv3d and conv_transpose through cuDNN's legacy convolution
 * API, enlarge and
 * inference batchnorm as small kernels of our own.
 *
 * A convolution's algorithm is chosen once per configuration by timing:
 * cuDNN's own (less those whose float32 rounding is too coarse) against
 * cuBLAS, which computes an ungrouped convolution as a matrix product (a
 * 1x1 one directly, any other after unfolding its input, im2col), whole or
 * split along its inner dimension where its output is too small to fill
 * the GPU, against our own kernels for grouped and shallow convolutions,
 * where cuDNN is slowest (direct, and tiled in shared memory), and
 * against Winograd's F(2x2, 3x3) for ungrouped 3x3 ones of stride 1 (any
 * dilation). The
 * arithmetic that is ours is
 * written once for device and host, and cuda_kernel_on_host runs it on the
 * host for the tests of a machine without a GPU.
 *
 * A conv2d may end in a max pool (pool = k: k x k windows at stride k,
 * conv.c). Winograd's output transform takes a 2x2 one at dilation 1 (its
 * tile is the window) and stores one value of four; every other way writes
 * the full output into the head of scratch and a small kernel pools it
 * into y. The choice times each way with its pool.
 *
 * Float32 stays float32: every convolution descriptor asks for
 * CUDNN_FMA_MATH, so cuDNN never rounds operands to TF32 and the results
 * match the CPU executor within accumulation-order rounding.
 *
 * cuDNN takes one pad per spatial axis, used at both ends. ONNX pads may
 * differ at the two ends: conv2d then copies the input with the extra
 * (asymmetric) part of the padding into scratch and lets cuDNN add the
 * symmetric rest; conv_transpose computes the whole uncropped scatter and
 * copies out the window the pads select.
 *
 * The convolution algorithm is searched once per configuration (when the
 * plan's first run is not being captured) and remembered in the device's
 * memo; captured runs only look it up. Descriptors are made and destroyed
 * per call: that is host work, allowed while capturing, and cheap. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_int.h"
#include "runtime/cuda/unary.cuh"

/* Largest workspace an algorithm search offers cuDNN. */
static const size_t CONV_WORKSPACE_CAP = (size_t)256 << 20;
/* Scratch sub-buffers start on this boundary (cuDNN likes aligned pointers). */
static const size_t SCRATCH_ALIGN = 256;

static const int THREADS = 256;

static size_t align_up(size_t x) { return (x + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN; }

static const char *fwd_algo_name(int a) {
  static const char *const names[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                      "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  return a >= 0 && a < (int)(sizeof names / sizeof *names) ? names[a] : "?";
}

static const char *bwd_data_algo_name(int a) {
  static const char *const names[] = {"BWD_DATA_ALGO_0", "BWD_DATA_ALGO_1", "BWD_DATA_FFT",
                                      "BWD_DATA_FFT_TILING", "BWD_DATA_WINOGRAD",
                                      "BWD_DATA_WINOGRAD_NONFUSED"};
  return a >= 0 && a < (int)(sizeof names / sizeof *names) ? names[a] : "?";
}

/* cuDNN descriptors of one call, destroyed however the call returns. */
struct CudnnDescs {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t act = nullptr;
  CudnnDescs() = default;
  CudnnDescs(const CudnnDescs &) = delete;
  CudnnDescs &operator=(const CudnnDescs &) = delete;
  ~CudnnDescs() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (act) cudnnDestroyActivationDescriptor(act);
  }
};

/* What cuDNN is asked to compute: a (grouped, strided, dilated) cross-
 * correlation of x [n, c, h, w] with w [m, c/groups, kh, kw], padded by
 * (ph, pw) at both ends, giving y [n, m, oh, ow]. conv_transpose runs its
 * adjoint, so for it x is the output and y the input. */
struct CudnnConv {
  int64_t n, c, h, w, m, cg, kh, kw, oh, ow;
  int64_t ph, pw, sh, sw, dh, dw, groups;
};

static bool fits_int(int64_t v) { return v >= 0 && v <= INT32_MAX; }

/* Fills the descriptors for cv; refuses sizes cuDNN's int API cannot hold. */
static int conv_descs(const Node *n, const CudnnConv &cv, CudnnDescs &ds, Diag *d) {
  const int64_t all[] = {cv.n, cv.c, cv.h, cv.w, cv.m, cv.cg, cv.kh, cv.kw, cv.oh, cv.ow,
                         cv.ph, cv.pw, cv.sh, cv.sw, cv.dh, cv.dw, cv.groups};
  bool ok = true;
  for (int64_t v : all) ok = ok && fits_int(v);
  ok = ok && fits_int(cv.n * cv.c * cv.h * cv.w) && fits_int(cv.n * cv.m * cv.oh * cv.ow) &&
       fits_int(cv.m * cv.cg * cv.kh * cv.kw);
  if (!ok)
    return cuda_op_error(n, d, TEQ_ERR_UNSUPPORTED,
                      "tensors [%lld, %lld, %lld, %lld] -> [%lld, %lld, %lld, %lld] exceed "
                      "cuDNN's 2^31-element limit", (long long)cv.n, (long long)cv.c,
                      (long long)cv.h, (long long)cv.w, (long long)cv.n, (long long)cv.m,
                      (long long)cv.oh, (long long)cv.ow);
  CUDNN_TRY(cudnnCreateTensorDescriptor(&ds.x));
  CUDNN_TRY(cudnnCreateTensorDescriptor(&ds.y));
  CUDNN_TRY(cudnnCreateFilterDescriptor(&ds.w));
  CUDNN_TRY(cudnnCreateConvolutionDescriptor(&ds.conv));
  CUDNN_TRY(cudnnSetTensor4dDescriptor(ds.x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)cv.n,
                                       (int)cv.c, (int)cv.h, (int)cv.w));
  CUDNN_TRY(cudnnSetTensor4dDescriptor(ds.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)cv.n,
                                       (int)cv.m, (int)cv.oh, (int)cv.ow));
  CUDNN_TRY(cudnnSetFilter4dDescriptor(ds.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, (int)cv.m,
                                       (int)cv.cg, (int)cv.kh, (int)cv.kw));
  CUDNN_TRY(cudnnSetConvolution2dDescriptor(ds.conv, (int)cv.ph, (int)cv.pw, (int)cv.sh,
                                            (int)cv.sw, (int)cv.dh, (int)cv.dw,
                                            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  /* Plain FMA: no TF32 tensor-core rounding of float32 operands. */
  CUDNN_TRY(cudnnSetConvolutionMathType(ds.conv, CUDNN_FMA_MATH));
  CUDNN_TRY(cudnnSetConvolutionGroupCount(ds.conv, (int)cv.groups));
  /* Our output extent must be the one cuDNN derives, or it would refuse
   * (or worse, read past) the tensors. */
  int dims[4];
  CUDNN_TRY(cudnnGetConvolution2dForwardOutputDim(ds.conv, ds.x, ds.w, &dims[0], &dims[1],
                                                  &dims[2], &dims[3]));
  if (dims[0] != cv.n || dims[1] != cv.m || dims[2] != cv.oh || dims[3] != cv.ow)
    return cuda_op_error(n, d, TEQ_ERR_INTERNAL,
                      "cuDNN derives output [%d, %d, %d, %d], expected [%lld, %lld, %lld, %lld]",
                      dims[0], dims[1], dims[2], dims[3], (long long)cv.n, (long long)cv.m,
                      (long long)cv.oh, (long long)cv.ow);
  return TEQ_OK;
}

/* Memo key of one cuDNN configuration; `what` separates forward from
 * backward-data searches and the variants that run them. The operands'
 * alignments are part of it: an algorithm found for 256-byte-aligned
 * tensors may refuse a view or a piece of a concat written in place. */
static uint64_t conv_key(uint64_t what, const CudnnConv &cv, int64_t extra, const void *x,
                         const void *y, const void *z) {
  const int64_t all[] = {cv.n, cv.c, cv.h, cv.w, cv.m, cv.cg, cv.kh, cv.kw, cv.oh, cv.ow,
                         cv.ph, cv.pw, cv.sh, cv.sw, cv.dh, cv.dw, cv.groups, extra,
                         cuda_alignment_of(x), cuda_alignment_of(y),
                         z ? cuda_alignment_of(z) : 0};
  uint64_t h = hash_mix(0x636f6e76u /* "conv" */, what);
  for (int64_t v : all) h = hash_mix(h, (uint64_t)v);
  return h;
}

/* The largest workspace any algorithm wants, within the cap: what a search
 * offers, so that it can try them all. */
static size_t fwd_search_workspace(CudaCtx *cx, const CudnnDescs &ds) {
  size_t most = 0;
  for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; a++) {
    size_t bytes = 0;
    if (cudnnGetConvolutionForwardWorkspaceSize(cx->cudnn, ds.x, ds.w, ds.conv, ds.y,
                                                (cudnnConvolutionFwdAlgo_t)a,
                                                &bytes) == CUDNN_STATUS_SUCCESS &&
        bytes <= CONV_WORKSPACE_CAP && bytes > most)
      most = bytes;
  }
  return most;
}

static size_t bwd_data_search_workspace(CudaCtx *cx, const CudnnDescs &ds) {
  size_t most = 0;
  for (int a = 0; a < CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT; a++) {
    size_t bytes = 0;
    if (cudnnGetConvolutionBackwardDataWorkspaceSize(cx->cudnn, ds.w, ds.y, ds.conv, ds.x,
                                                     (cudnnConvolutionBwdDataAlgo_t)a,
                                                     &bytes) == CUDNN_STATUS_SUCCESS &&
        bytes <= CONV_WORKSPACE_CAP && bytes > most)
      most = bytes;
  }
  return most;
}

/* Scratch of `bytes`, or NULL without asking when nothing is needed. */
static int scratch_of(CudaCtx *cx, size_t bytes, char **out, Diag *d) {
  *out = nullptr;
  if (bytes == 0) return TEQ_OK;
  *out = (char *)cuda_scratch(cx, bytes, d);
  return *out ? TEQ_OK : TEQ_ERR_NOMEM;
}

/* ---- conv2d ---- */

/* xp[img, c, r, q] = x[img, c, r - top, q - left], zero outside x: the
 * input with the asymmetric part of its padding made explicit. */
__host__ __device__ __forceinline__ float pad_planes_at(const float *x, int64_t i, int64_t h,
                                                       int64_t w, int64_t hp, int64_t wp,
                                                       int64_t top, int64_t left) {
  int64_t q = i % wp, r = (i / wp) % hp, plane = i / (wp * hp);
  int64_t sr = r - top, sq = q - left;
  return sr >= 0 && sr < h && sq >= 0 && sq < w ? x[(plane * h + sr) * w + sq] : 0.0f;
}

__global__ void pad_planes_kernel(const float *__restrict__ x, float *__restrict__ xp,
                                  int64_t planes, int64_t h, int64_t w, int64_t hp, int64_t wp,
                                  int64_t top, int64_t left) {
  int64_t total = planes * hp * wp;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x)
    xp[i] = pad_planes_at(x, i, h, w, hp, wp, top, left);
}

/* One conv2d node's geometry: the cuDNN problem (its output the full one,
 * before any pool), the explicit extra padding (top, left, and the padded
 * extents) when its pads are uneven, and the fused pool. */
struct Conv2dPlan {
  CudnnConv cv;
  int64_t h, w, extra_top, extra_left; /* the unpadded input extents, extra pads */
  bool padded;
  size_t pad_bytes;
  int64_t pool; /* the max pool's window and stride, 0 for none */
};

static int conv2d_plan(const Node *n, const CudaTensor *in, const CudaTensor *out,
                       Conv2dPlan *pl, Diag *d) {
  const Params *p = &n->params;
  const Shape &xs = in[0].shape, &ws = in[1].shape, &ys = out[0].shape;
  if (xs.ndim != 4 || ws.ndim != 4 || ys.ndim != 4)
    return cuda_op_error(n, d, TEQ_ERR_INTERNAL, "expected 4-D input, weight and output");
  CudnnConv &cv = pl->cv;
  int64_t pt = p->v[CONV_PADS].i[0], pleft = p->v[CONV_PADS].i[1];
  int64_t pb = p->v[CONV_PADS].i[2], pr = p->v[CONV_PADS].i[3];
  cv.ph = pt < pb ? pt : pb;
  cv.pw = pleft < pr ? pleft : pr;
  pl->h = xs.d[2], pl->w = xs.d[3];
  pl->extra_top = pt - cv.ph, pl->extra_left = pleft - cv.pw;
  cv.n = xs.d[0], cv.c = xs.d[1];
  cv.h = pl->h + (pt - cv.ph) + (pb - cv.ph);
  cv.w = pl->w + (pleft - cv.pw) + (pr - cv.pw);
  cv.m = ws.d[0], cv.cg = ws.d[1], cv.kh = ws.d[2], cv.kw = ws.d[3];
  cv.sh = p->v[CONV_STRIDE].i[0], cv.sw = p->v[CONV_STRIDE].i[1];
  cv.dh = p->v[CONV_DILATION].i[0], cv.dw = p->v[CONV_DILATION].i[1];
  cv.groups = param_int(p, CONV_GROUPS);
  /* The full output's extents, as conv.c derives them; the node's output
   * is those pooled. */
  cv.oh = (cv.h + 2 * cv.ph - (cv.kh - 1) * cv.dh - 1) / cv.sh + 1;
  cv.ow = (cv.w + 2 * cv.pw - (cv.kw - 1) * cv.dw - 1) / cv.sw + 1;
  pl->pool = param_int(p, CONV_POOL);
  int64_t k = pl->pool ? pl->pool : 1;
  if (ys.d[0] != cv.n || ys.d[1] != cv.m || ys.d[2] != cv.oh / k || ys.d[3] != cv.ow / k)
    return cuda_op_error(n, d, TEQ_ERR_INTERNAL,
                         "output [%lld, %lld, %lld, %lld] is not the conv's [%lld, %lld, %lld, "
                         "%lld] pooled by %lld", (long long)ys.d[0], (long long)ys.d[1],
                         (long long)ys.d[2], (long long)ys.d[3], (long long)cv.n,
                         (long long)cv.m, (long long)cv.oh, (long long)cv.ow, (long long)k);
  pl->padded = cv.h != pl->h || cv.w != pl->w;
  pl->pad_bytes = pl->padded ? align_up((size_t)(cv.n * cv.c * cv.h * cv.w) * sizeof(float)) : 0;
  return TEQ_OK;
}

/* The input cuDNN reads: x itself, or x padded into the scratch's head. */
static int conv2d_input(const Conv2dPlan &pl, CudaCtx *cx, const float *x, char *scratch,
                        const float **xin, Diag *d) {
  *xin = x;
  if (!pl.padded) return TEQ_OK;
  const CudnnConv &cv = pl.cv;
  float *xp = (float *)scratch;
  int64_t total = cv.n * cv.c * cv.h * cv.w;
  pad_planes_kernel<<<cuda_blocks(total, THREADS), THREADS, 0, cx->stream>>>(
      x, xp, cv.n * cv.c, pl.h, pl.w, cv.h, cv.w, pl.extra_top, pl.extra_left);
  CUDA_LAUNCHED();
  *xin = xp;
  return TEQ_OK;
}

/* ---- algorithms that round too much ----
 * The FFT algorithms and non-fused Winograd (large tiles) transform the
 * data, and their float32 rounding error is far above a direct sum's: on an
 * H100 at batch 16 they won cuDNN's search for some Inception-v3 layers and
 * took its output 5e-3 away from PyTorch's and the CPU executor's. The
 * search leaves them out; every remaining algorithm sums products directly
 * (or through the small fused Winograd tile). */
static bool exact_enough_fwd(cudnnConvolutionFwdAlgo_t a) {
  return a != CUDNN_CONVOLUTION_FWD_ALGO_FFT && a != CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
static bool exact_enough_bwd_data(cudnnConvolutionBwdDataAlgo_t a) {
  return a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT &&
         a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}

/* ---- convolutions as matrix products (cuBLAS) ----
 * An ungrouped convolution is, per image, the product y (M x HW) =
 * w (M x K) x cols (K x HW), row-major: a 1x1 one directly on its input
 * (K = C), any other on its input unfolded into columns (im2col, K =
 * C kh kw). Row-major y = w x cols is column-major y^T = cols^T w^T: one
 * strided batched call over the images (w shared: stride 0).
 *
 * A product may also be split along K. At batch 1 the late layers of a
 * CNN have a long K and a small output: VGG-19's 14x14 convs are 512 x 196
 * outputs over K = 4608, a few output tiles for a GPU of a hundred
 * multiprocessors; on the H200 they ran at 17 of its 67 float32 TFLOPS.
 * Split into s slices of K, one strided batched call computes s partial
 * products side by side in scratch and cuda_sum_partials adds them up with
 * the residual, the bias and a relu: the pass over y the epilogue makes anyway, reading
 * s partials. Which split, if any, is faster is timed like every way. */

/* cuBLAS ways are negative: -(product | splits << 4), splits 0 for none.
 * ALGO_GEMM runs a 1x1 convolution on its input, ALGO_IM2COL any other
 * ungrouped one on its columns in scratch. */
enum { ALGO_GEMM = -1, ALGO_IM2COL = -2 };
static int64_t split_way(int64_t way, int splits) { return -(-way | (int64_t)splits << 4); }
static int64_t product_of(int64_t way) { return -(-way & 15); }
static int splits_of(int64_t way) { return way < 0 && (-way >> 4) > 1 ? (int)(-way >> 4) : 1; }

/* Kernel 1x1, stride 1, no padding, no dilation, one group. */
static bool pointwise(const Conv2dPlan &pl) {
  const CudnnConv &cv = pl.cv;
  return cv.kh == 1 && cv.kw == 1 && cv.sh == 1 && cv.sw == 1 && cv.ph == 0 && cv.pw == 0 &&
         cv.dh == 1 && cv.dw == 1 && cv.groups == 1 && !pl.padded &&
         fits_int(cv.oh * cv.ow) && fits_int(cv.c) && fits_int(cv.m) && fits_int(cv.n);
}

static const size_t IM2COL_CAP = (size_t)256 << 20;

static size_t im2col_bytes(const Conv2dPlan &pl) {
  const CudnnConv &cv = pl.cv;
  return align_up((size_t)(cv.n * cv.c * cv.kh * cv.kw * cv.oh * cv.ow) * sizeof(float));
}

static bool im2col_applies(const Conv2dPlan &pl) {
  const CudnnConv &cv = pl.cv;
  return cv.groups == 1 && !(cv.kh == 1 && cv.kw == 1) && im2col_bytes(pl) <= IM2COL_CAP &&
         fits_int(cv.oh * cv.ow) && fits_int(cv.c * cv.kh * cv.kw) && fits_int(cv.m) &&
         fits_int(cv.n) && fits_int(cv.h) && fits_int(cv.w);
}

/* The product's K: C for a 1x1 convolution, C kh kw for one unfolded. */
static int64_t product_k(const CudnnConv &cv) { return cv.c * cv.kh * cv.kw; }

/* Scratch of a split product's partial outputs. */
static size_t split_bytes(const CudnnConv &cv, int splits) {
  return align_up((size_t)(splits * cv.n * cv.m * cv.oh * cv.ow) * sizeof(float));
}

/* col[img][(ci kh + i) kw + j][oy ow + ox] = x[img][ci][oy sh - ph + i dh][ox sw - pw + j dw],
 * 0 outside the (already unevenly padded) input. One row of col (an image,
 * a channel and a tap) per block row, its pixels along x: the row's
 * indices are worked out once per block, and a pixel costs one 32-bit
 * division. The first version split a flat 64-bit index into all seven
 * coordinates per element; on the H200 it unfolded VGG-19's first conv
 * (27 x 50176 columns) in some 20 us, a tenth of the memory's speed.
 * im2col_applies keeps every extent and the whole of col within int. */
struct Im2col {
  int h, w, kh, kw, ow, sh, sw, ph, pw, dh, dw;
};
/* Row r of col: the input plane it reads and its tap's offset. */
struct Im2colRow {
  const float *xp;
  int y0, x0;
};
__host__ __device__ __forceinline__ Im2colRow im2col_row(const Im2col &g, const float *x, int r) {
  int j = r % g.kw, i = (r / g.kw) % g.kh, plane_in = r / (g.kw * g.kh); /* image x channel */
  return {x + (int64_t)plane_in * g.h * g.w, i * g.dh - g.ph, j * g.dw - g.pw};
}
__host__ __device__ __forceinline__ float im2col_at(const Im2col &g, const Im2colRow &row, int p) {
  int oy = p / g.ow, ox = p - oy * g.ow;
  int iy = oy * g.sh + row.y0, ix = ox * g.sw + row.x0;
  return (unsigned)iy < (unsigned)g.h && (unsigned)ix < (unsigned)g.w
             ? row.xp[(int64_t)iy * g.w + ix]
             : 0.0f;
}

__global__ void im2col_kernel(const float *__restrict__ x, float *__restrict__ col, int rows,
                              int plane, Im2col g) {
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    Im2colRow row = im2col_row(g, x, r);
    float *cp = col + (int64_t)r * plane;
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < plane; p += gridDim.x * blockDim.x)
      cp[p] = im2col_at(g, row, p);
  }
}

/* y = w x cols per image, whole (splits 1), as one product of n images
 * (w shared: stride 0); or, for image img, the `splits` partial products
 * into part, which the caller sums: slice j is rows [j kc, (j + 1) kc) of
 * the image's cols (k x hw) and columns of w (m x k), partial j of image
 * img at part + (j n + img) hw m. */
static CudaProduct conv_product(const CudnnConv &cv, const float *cols, const float *w, float *y,
                                int splits, float *part, int64_t img) {
  int hw = (int)(cv.oh * cv.ow), k = (int)product_k(cv), m = (int)cv.m;
  if (splits == 1)
    return {m, hw, k, (int)cv.n, w, k, 0, cols, hw, (long long)hw * k, y, hw, (long long)hw * m};
  int kc = k / splits;
  long long out = (long long)hw * m;
  return {m, hw, kc, splits, w, k, kc, cols + img * (int64_t)hw * k, hw, (long long)hw * kc,
          part + img * out, hw, cv.n * out};
}

/* How many conv_product calls the whole product is: one, or one per image
 * when split. */
static int64_t conv_product_calls(const CudnnConv &cv, int splits) {
  return splits == 1 ? 1 : cv.n;
}

static Im2col im2col_geometry(const CudnnConv &cv) {
  return {(int)cv.h, (int)cv.w, (int)cv.kh, (int)cv.kw, (int)cv.ow, (int)cv.sh,
          (int)cv.sw, (int)cv.ph, (int)cv.pw, (int)cv.dh, (int)cv.dw};
}

/* Unfolds xin into col (n images of [C kh kw, oh ow]): blocks of as many
 * threads as a row has pixels, up to THREADS (a 7x7 row takes 64, not
 * 256), rows along the grid's y. */
static int im2col(CudaCtx *cx, const CudnnConv &cv, const float *xin, float *col, Diag *d) {
  int rows = (int)(cv.n * cv.c * cv.kh * cv.kw), plane = (int)(cv.oh * cv.ow);
  if (rows == 0 || plane == 0) return TEQ_OK;
  int threads = cuda_row_threads(plane, THREADS);
  dim3 grid((plane + threads - 1) / threads, rows < 65535 ? rows : 65535);
  im2col_kernel<<<grid, threads, 0, cx->stream>>>(xin, col, rows, plane, im2col_geometry(cv));
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* ---- the epilogue: residual, bias and activation ---- */

/* One output's epilogue: the residual, the bias and the activation, in
 * that order, wherever a way adds them itself (bias_act_kernel, the direct
 * kernel, the host checks). */
__host__ __device__ __forceinline__ float epilogue_at(float v, const float *z_at,
                                                     const float *bias_at, UnaryArgs act) {
  if (z_at) v += *z_at;
  if (bias_at) v += *bias_at; /* not 0 where there is none: -0 + 0 is +0 */
  return act_eval(act, v);
}

/* y[img, m, p] = act(y[img, m, p] + z[img, m, p] + bias[m]) over planes of
 * `plane` elements (z or bias may be NULL), on cuda_plane_grid: one pass over y
 * where cuDNN's AddTensor and an activation kernel were two, for every
 * fused activation (act_eval: the relu maps NaN to 0, as the element-wise
 * kernels' fused one does). */
__global__ void bias_act_kernel(float *__restrict__ y, const float *__restrict__ z,
                                const float *__restrict__ bias, int64_t planes, int64_t m,
                                int64_t plane, UnaryArgs act) {
  for (int64_t pl = blockIdx.y; pl < planes; pl += gridDim.y) {
    float *yp = y + pl * plane;
    const float *zp = z ? z + pl * plane : nullptr;
    float b = bias ? bias[pl % m] : 0.0f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < plane;
         i += (int64_t)gridDim.x * blockDim.x) {
      yp[i] = epilogue_at(yp[i], zp ? zp + i : nullptr, bias ? &b : nullptr, act);
    }
  }
}

/* What follows a convolution run without cuDNN's fused call: its residual,
 * bias and fused activation, in one kernel (the cost model prices a bias
 * and an activation as one pass over the output). */
static int conv2d_epilogue(CudaCtx *cx, const CudnnConv &cv, const float *bias, const float *z,
                           int act, float *y, Diag *d) {
  int64_t total = cv.n * cv.m * cv.oh * cv.ow;
  if (!bias && !z) return cuda_act_apply(cx, act, y, total, d);
  int64_t plane = cv.oh * cv.ow;
  if (total == 0) return TEQ_OK;
  dim3 grid = cuda_plane_grid(cv.n * cv.m, plane, THREADS);
  bias_act_kernel<<<grid, THREADS, 0, cx->stream>>>(
      y, z, bias, cv.n * cv.m, cv.m, plane, fused_act_args(act));
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* ---- the fused max pool ----
 * conv2d{pool=k} is maxpool(k x k, stride k, no pads, extents rounded
 * down) of act(conv + z + bias). Winograd's output transform pools its
 * own tiles (winograd_output_tile); every other way writes the full output
 * into the head of scratch, and conv_pool_kernel reads it into y. Where
 * the way's epilogue is a pass of its own (the whole cuBLAS products,
 * cuDNN's plain call), that pass is left out and the pool applies the
 * epilogue to each value it reads: one pass over the full output where
 * there were two, and three quarters of its writes gone. */

/* The largest of the k x k window whose element at offset o (rows `row`
 * apart) is at(o), in the CPU's order (pool.c: pool_eval_f32, which the
 * CPU's pooled conv runs over its full output), so NaNs fall out as they
 * do there: each column's rows first, a later row's value kept where it
 * is greater, then the columns, from -FLT_MAX. */
template <typename At>
__host__ __device__ __forceinline__ float pool_window_of(const At &at, int64_t row, int k) {
  float acc = -FLT_MAX;
  for (int j = 0; j < k; j++) {
    float v = at(j);
    for (int i = 1; i < k; i++) {
      float x = at(i * row + j);
      v = x > v ? x : v;
    }
    acc = v > acc ? v : acc;
  }
  return acc;
}

/* The same of the window at f itself. */
__host__ __device__ __forceinline__ float pool_window(const float *f, int64_t row, int k) {
  return pool_window_of([f](int64_t o) { return f[o]; }, row, k);
}

/* The epilogue a pool applies to the values it reads (on: the way left it
 * out): z of the full output's shape, a bias per channel of m, act. */
struct PoolEpilogue {
  bool on;
  const float *z, *bias;
  int64_t m;
  UnaryArgs act;
};

/* Pooled element i of planes of oh x ow full outputs, each value read
 * through e's epilogue where it is on. */
__host__ __device__ __forceinline__ float pool_at(const float *full, int64_t i, int64_t oh,
                                                 int64_t ow, int k, const PoolEpilogue &e) {
  int64_t ph = oh / k, pw = ow / k;
  int64_t px = i % pw, py = i / pw % ph, plane = i / (pw * ph);
  int64_t base = (plane * oh + py * k) * ow + px * k;
  if (!e.on) return pool_window(full + base, ow, k);
  const float *bias_at = e.bias ? e.bias + plane % e.m : nullptr;
  return pool_window_of(
      [&](int64_t o) {
        return epilogue_at(full[base + o], e.z ? e.z + base + o : nullptr, bias_at, e.act);
      },
      ow, k);
}

__global__ void conv_pool_kernel(const float *__restrict__ full, float *__restrict__ y,
                                 int64_t total, int64_t oh, int64_t ow, int k, PoolEpilogue e) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = pool_at(full, i, oh, ow, k, e);
}


/* The pooled output's elements. */
static int64_t pooled_numel(const Conv2dPlan &pl) {
  const CudnnConv &cv = pl.cv;
  return cv.n * cv.m * (cv.oh / pl.pool) * (cv.ow / pl.pool);
}

/* The full output a way that does not pool itself writes first, at the
 * head of scratch: its bytes, 0 without a pool. */
static size_t pool_head_bytes(const Conv2dPlan &pl) {
  const CudnnConv &cv = pl.cv;
  return pl.pool ? align_up((size_t)(cv.n * cv.m * cv.oh * cv.ow) * sizeof(float)) : 0;
}

/* ---- the direct way: our own kernel for grouped and shallow convolutions ----
 * cuDNN runs grouped convolutions far below what they need: on the H200,
 * ResNeXt-50's [1, 1024, 7, 7] 3x3 conv of 32 groups (29 MFLOP, 1.4 MB of
 * operands) took 48.6 us, and a depthwise [1, 144, 56, 56] 3x3 one 9.4 us
 * for 3.6 MB of traffic. The direct kernel sums each output's taps itself:
 * one (image, output channel) plane per block row, its filter staged in
 * shared memory, one output pixel per thread, and the residual, bias and
 * activation applied before the single store. It reads the unpadded input
 * (every pad is a bounds test), so uneven pads cost no copy. It is offered
 * for grouped convolutions and for dense ones with few taps per output
 * (VGG-19's first conv: 27), and timed like every way. */

/* Largest filter (cg kh kw floats) a block stages: 8 KB. */
enum { DIRECT_MAX_TAPS = 2048, DIRECT_DENSE_TAPS = 64 };

/* One convolution as the direct kernel sees it: ONNX's top and left pads
 * as they are, all extents in int. */
struct DirectConv {
  int n, c, h, w, m, cg, mg, kh, kw, oh, ow, sh, sw, top, left, dh, dw;
};

/* The plan's convolution as our own kernels take it (the direct and the
 * tiled one), or false where a tensor is past int's range. Its pads are
 * ONNX's top and left, the plan's symmetric part and its extra together:
 * the kernels read the unpadded input. */
static bool own_geometry(const Conv2dPlan &pl, DirectConv *g) {
  const CudnnConv &cv = pl.cv;
  int64_t top = cv.ph + pl.extra_top, left = cv.pw + pl.extra_left;
  if (!fits_int(cv.n * cv.c * pl.h * pl.w) || !fits_int(cv.n * cv.m * cv.oh * cv.ow) ||
      !fits_int(top) || !fits_int(left) || !fits_int(cv.sh) || !fits_int(cv.sw) ||
      !fits_int(cv.dh) || !fits_int(cv.dw))
    return false;
  *g = {(int)cv.n, (int)cv.c, (int)pl.h, (int)pl.w, (int)cv.m, (int)cv.cg,
        (int)(cv.m / cv.groups), (int)cv.kh, (int)cv.kw, (int)cv.oh, (int)cv.ow,
        (int)cv.sh, (int)cv.sw, (int)top, (int)left, (int)cv.dh, (int)cv.dw};
  return true;
}

/* The direct kernel's geometry, or false where it does not take the
 * convolution: a filter over DIRECT_MAX_TAPS (what a block stages), or a
 * dense conv over DIRECT_DENSE_TAPS (cuDNN and cuBLAS own those). */
static bool direct_geometry(const Conv2dPlan &pl, DirectConv *g) {
  const CudnnConv &cv = pl.cv;
  int64_t taps = cv.cg * cv.kh * cv.kw;
  return taps <= DIRECT_MAX_TAPS && (cv.groups > 1 || taps <= DIRECT_DENSE_TAPS) &&
         own_geometry(pl, g);
}

/* The input channels output channel oc of image img reads: its group's. */
__host__ __device__ __forceinline__ const float *direct_group_input(const DirectConv &g,
                                                                     const float *x, int img,
                                                                     int oc) {
  return x + ((int64_t)img * g.c + (int64_t)(oc / g.mg) * g.cg) * g.h * g.w;
}

/* Output (oy, ox) of one plane before its epilogue: xg the group's input
 * channels, taps the plane's filter [cg, kh, kw]. Taps outside the input
 * are the padding's zeros: skipped. */
__host__ __device__ __forceinline__ float direct_conv_sum(const DirectConv &g, const float *xg,
                                                          const float *taps, int oy, int ox) {
  int iy0 = oy * g.sh - g.top, ix0 = ox * g.sw - g.left;
  float acc = 0.0f;
  for (int ci = 0; ci < g.cg; ci++) {
    const float *xc = xg + (int64_t)ci * g.h * g.w, *tc = taps + ci * g.kh * g.kw;
    for (int i = 0; i < g.kh; i++) {
      int iy = iy0 + i * g.dh;
      if ((unsigned)iy >= (unsigned)g.h) continue;
      for (int j = 0; j < g.kw; j++) {
        int ix = ix0 + j * g.dw;
        if ((unsigned)ix < (unsigned)g.w) acc = fmaf(xc[iy * g.w + ix], tc[i * g.kw + j], acc);
      }
    }
  }
  return acc;
}

/* y = act(conv(x, w) + z + bias) on a grid of (image, output channel)
 * planes along y, a plane's pixels along x. y may be z (a residual added
 * in place): each element is read and then written by one thread. */
__global__ void conv_direct_kernel(const float *__restrict__ x, const float *__restrict__ w,
                                   const float *__restrict__ bias, const float *z, float *y,
                                   DirectConv g, UnaryArgs act) {
  __shared__ float taps[DIRECT_MAX_TAPS];
  int ntaps = g.cg * g.kh * g.kw, plane = g.oh * g.ow, planes = g.n * g.m;
  for (int pl = blockIdx.y; pl < planes; pl += gridDim.y) { /* uniform across the block */
    int img = pl / g.m, oc = pl - img * g.m;
    __syncthreads(); /* the previous plane's filter is no longer read */
    for (int t = threadIdx.x; t < ntaps; t += blockDim.x) taps[t] = w[(int64_t)oc * ntaps + t];
    __syncthreads();
    const float *xg = direct_group_input(g, x, img, oc);
    float b = bias ? bias[oc] : 0.0f;
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < plane; p += gridDim.x * blockDim.x) {
      int oy = p / g.ow, ox = p - oy * g.ow;
      int64_t at = (int64_t)pl * plane + p;
      float v = direct_conv_sum(g, xg, taps, oy, ox);
      y[at] = epilogue_at(v, z ? z + at : nullptr, bias ? &b : nullptr, act);
    }
  }
}

/* ---- the tiled way: grouped convolutions from shared memory ----
 * The direct kernel reads every tap from global memory, one output pixel
 * per thread, and on the H100 (2026-11-28) it stayed far from the
 * hardware where it won: ResNeXt-50's [1,1024,7,7] 3x3 conv of 32 groups
 * took 36.8 us for 29 MFLOP (each thread's 288 taps are as many dependent
 * loads), a depthwise [1,144,56,56] one 9.5 us for 3.6 MB. The tiled way
 * stages a block's input tile (its halo too) and its filters in shared
 * memory, a chunk of the group's input channels at a time, and sums from
 * there: a block is a tile of output pixels (a whole small plane, or 32
 * columns by up to 8 rows) times a few output channels of one group, a
 * thread one output. Uneven pads are bounds tests while staging, as in
 * the direct kernel. It is offered for grouped convolutions and timed
 * like every way. */

/* Shared memory a block stages per chunk: 32 KB. */
enum { TILED_SMEM_FLOATS = 8192, TILED_THREADS = 256 };

struct TiledConv {
  DirectConv g;
  int th, tw;    /* output tile, rows by columns */
  int ocb;       /* output channels of one group per block */
  int ci;        /* input channels staged per chunk */
  int ih, iw;    /* the input tile a chunk's channel stages, halo included */
  int tiles_x, tiles, oc_chunks;
  int blocks; /* (image, group, chunk of output channels): the grid's y */
};

/* The tiling of a grouped convolution (any number of channels per group:
 * they are staged in chunks), or false where it is not grouped, a tensor
 * is past int's range, or one channel's input tile and filters exceed the
 * shared memory. */
static bool tiled_geometry(const Conv2dPlan &pl, TiledConv *t) {
  DirectConv g;
  if (pl.cv.groups < 2 || !own_geometry(pl, &g)) return false;
  int plane = g.oh * g.ow;
  if (plane <= TILED_THREADS) {
    t->th = g.oh, t->tw = g.ow;
    t->ocb = TILED_THREADS / plane < g.mg ? TILED_THREADS / plane : g.mg;
  } else {
    t->tw = g.ow < 32 ? g.ow : 32;
    t->th = TILED_THREADS / t->tw < g.oh ? TILED_THREADS / t->tw : g.oh;
    t->ocb = 1;
  }
  int64_t ih = (int64_t)(t->th - 1) * g.sh + (int64_t)(g.kh - 1) * g.dh + 1;
  int64_t iw = (int64_t)(t->tw - 1) * g.sw + (int64_t)(g.kw - 1) * g.dw + 1;
  int64_t per_channel = ih * iw + (int64_t)t->ocb * g.kh * g.kw;
  if (per_channel > TILED_SMEM_FLOATS) return false;
  int64_t ci = TILED_SMEM_FLOATS / per_channel;
  t->g = g;
  t->ih = (int)ih, t->iw = (int)iw;
  t->ci = ci < g.cg ? (int)ci : g.cg;
  t->tiles_x = (g.ow + t->tw - 1) / t->tw;
  t->tiles = t->tiles_x * ((g.oh + t->th - 1) / t->th);
  t->oc_chunks = (g.mg + t->ocb - 1) / t->ocb;
  int64_t blocks = (int64_t)g.n * (g.m / g.mg) * t->oc_chunks;
  if (!fits_int(blocks)) return false;
  t->blocks = (int)blocks;
  return true;
}

/* Floats of shared memory one chunk stages. */
static size_t tiled_smem_floats(const TiledConv &t) {
  return (size_t)t.ci * t.ih * t.iw + (size_t)t.ocb * t.ci * t.g.kh * t.g.kw;
}

/* Block b's place: its image, group and first output channel (of all),
 * and tile's first output row and column. */
struct TiledBlock {
  int img, oc0, oc_end, y0, x0;
  const float *xg; /* the group's first input channel of the image */
};
__host__ __device__ __forceinline__ TiledBlock tiled_block(const TiledConv &t, const float *x,
                                                           int b, int tile) {
  const DirectConv &g = t.g;
  int chunk = b % t.oc_chunks, rest = b / t.oc_chunks;
  int grp = rest % (g.m / g.mg), img = rest / (g.m / g.mg);
  TiledBlock k;
  k.img = img;
  k.oc0 = grp * g.mg + chunk * t.ocb;
  k.oc_end = grp * g.mg + g.mg < k.oc0 + t.ocb ? grp * g.mg + g.mg : k.oc0 + t.ocb;
  k.y0 = tile / t.tiles_x * t.th, k.x0 = tile % t.tiles_x * t.tw;
  k.xg = direct_group_input(g, x, img, k.oc0);
  return k;
}

/* Stages input channels [c0, c0 + nci) of the block's tile (zeros outside
 * the input: the padding) into s_in [nci][ih][iw], and their filter taps of
 * the block's output channels into s_w [ocb][nci][kh][kw] (zeros past the
 * group's last channel), element tid of every nthreads. */
__host__ __device__ __forceinline__ void tiled_stage(const TiledConv &t, const TiledBlock &k,
                                                     const float *w, float *s_in, float *s_w,
                                                     int c0, int nci, int tid, int nthreads) {
  const DirectConv &g = t.g;
  int tile_in = t.ih * t.iw, iy0 = k.y0 * g.sh - g.top, ix0 = k.x0 * g.sw - g.left;
  for (int e = tid; e < nci * tile_in; e += nthreads) {
    int ci = e / tile_in, r = e - ci * tile_in, iy = iy0 + r / t.iw, ix = ix0 + r % t.iw;
    s_in[e] = (unsigned)iy < (unsigned)g.h && (unsigned)ix < (unsigned)g.w
                  ? k.xg[((int64_t)(c0 + ci) * g.h + iy) * g.w + ix]
                  : 0.0f;
  }
  int taps = g.kh * g.kw, per_oc = nci * taps;
  for (int e = tid; e < t.ocb * per_oc; e += nthreads) {
    int ocl = e / per_oc, r = e - ocl * per_oc, oc = k.oc0 + ocl;
    s_w[e] = oc < k.oc_end ? w[((int64_t)oc * g.cg + c0) * taps + r] : 0.0f;
  }
}

/* One output's sum over the staged channels: output channel ocl of the
 * block, pixel (py, px) of its tile. */
__host__ __device__ __forceinline__ float tiled_sum(const TiledConv &t, const float *s_in,
                                                    const float *s_w, int nci, int ocl, int py,
                                                    int px) {
  const DirectConv &g = t.g;
  int taps = g.kh * g.kw;
  const float *wk = s_w + ocl * nci * taps;
  float acc = 0.0f;
  for (int ci = 0; ci < nci; ci++) {
    const float *in = s_in + (ci * t.ih + py * g.sh) * t.iw + px * g.sw;
    for (int i = 0; i < g.kh; i++)
      for (int j = 0; j < g.kw; j++)
        acc = fmaf(in[i * g.dh * t.iw + j * g.dw], wk[(ci * g.kh + i) * g.kw + j], acc);
  }
  return acc;
}

/* Thread tid's output of the block: its channel and pixel, or false where
 * it has none (past the tile's edge, the group's channels or the block's
 * outputs). */
__host__ __device__ __forceinline__ bool tiled_output(const TiledConv &t, const TiledBlock &k,
                                                      int tid, int *ocl, int *py, int *px) {
  int pixels = t.th * t.tw;
  *ocl = tid / pixels, *py = tid % pixels / t.tw, *px = tid % t.tw;
  return *ocl < t.ocb && k.oc0 + *ocl < k.oc_end && k.y0 + *py < t.g.oh &&
         k.x0 + *px < t.g.ow;
}

/* Where output (ocl, py, px) of block k lies in y. */
__host__ __device__ __forceinline__ int64_t tiled_at(const TiledConv &t, const TiledBlock &k,
                                                     int ocl, int py, int px) {
  return (((int64_t)k.img * t.g.m + k.oc0 + ocl) * t.g.oh + k.y0 + py) * t.g.ow + k.x0 + px;
}

/* Tiles along the grid's x, (image, group, channel chunk) along its y;
 * dynamic shared memory: tiled_smem_floats. */
__global__ void conv_tiled_kernel(const float *__restrict__ x, const float *__restrict__ w,
                                  const float *__restrict__ bias, const float *z, float *y,
                                  TiledConv t, UnaryArgs act) {
  extern __shared__ float smem[];
  float *s_in = smem, *s_w = smem + t.ci * t.ih * t.iw;
  const DirectConv &g = t.g;
  for (int b = blockIdx.y; b < t.blocks; b += gridDim.y) { /* uniform across the block */
    TiledBlock k = tiled_block(t, x, b, blockIdx.x);
    int ocl, py, px;
    bool mine = tiled_output(t, k, threadIdx.x, &ocl, &py, &px);
    float acc = 0.0f;
    for (int c0 = 0; c0 < g.cg; c0 += t.ci) {
      int nci = g.cg - c0 < t.ci ? g.cg - c0 : t.ci;
      __syncthreads(); /* the last chunk (or block) is no longer read */
      tiled_stage(t, k, w, s_in, s_w, c0, nci, threadIdx.x, blockDim.x);
      __syncthreads();
      if (mine) acc += tiled_sum(t, s_in, s_w, nci, ocl, py, px);
    }
    if (mine) {
      int64_t at = tiled_at(t, k, ocl, py, px);
      float bv = bias ? bias[k.oc0 + ocl] : 0.0f;
      y[at] = epilogue_at(acc, z ? z + at : nullptr, bias ? &bv : nullptr, act);
    }
  }
}

/* ---- the Winograd way: 3x3 convolutions in fewer products ----
 * cuDNN and im2col + cuBLAS run VGG-19's dense 3x3 convolutions at 22 to
 * 30 of the H100's 67 float32 TFLOPS (2026-11-28), and they are nine
 * tenths of its time. Winograd's F(2x2, 3x3) computes each 2x2 tile of
 * output from a 4x4 tile of input in 16 products per channel pair where a
 * direct sum takes 36: the filter and the input tile are each transformed
 * into 16 values (U = G g G^T, V = B^T d B), the 16 products of a tile are
 * summed over the input channels as 16 matrix products (one strided
 * batched cuBLAS call: M(xi) = U(xi) V(xi), [M x C] by [C x tiles]), and
 * each tile of M is transformed back (Y = A^T M A) with the epilogue.
 *
 * Rounding: the transforms of F(2x2, 3x3) only add, subtract and halve,
 * so each output is a direct sum's products regrouped, and its error stays
 * close to a direct sum's. The larger tiles (cuDNN's WINOGRAD_NONFUSED)
 * multiply by 4 and 8 and are left out (exact_enough_fwd).
 *
 * A filter that is one of the plan's constants (a model's weight) is
 * transformed once and kept with the plan (cuda_derived): 16 M C floats,
 * 16.8 MB for a 512x512 filter, 16/9 of the filter's own bytes. Any other
 * filter is transformed into scratch on every call, and its timing weighs
 * that pass. The profiler holds a conv's filter as a constant too
 * (OpDef.weight_inputs), so that a cost table prices what a model's plan
 * runs. */

/* The geometry: the input as cuDNN would take it (the uneven part of the
 * padding already copied in), 2x2 output tiles th x tw per image. With
 * dilation dh, output rows r, r + dh, r + 2 dh ... are a convolution of
 * their own (taps dh apart become neighbours), so a tile's two rows are dh
 * apart: tile row ty is row 2 dh (ty / dh) + ty % dh and the one dh below
 * it, and th = dh ceil(ceil(oh / dh) / 2); the same for columns. At
 * dilation 1 a tile is rows 2 ty and 2 ty + 1: a 2x2 pool's window, which
 * the transform back then reduces to its max (pooled). */
struct Winograd {
  int n, c, m, h, w, oh, ow, ph, pw, dh, dw, th, tw;
  int tiles;   /* n th tw: the products' inner extent */
  bool pooled; /* each whole tile stored as its max, at (ty, tx) of the pooled output */
};

/* Whether Winograd's tiles are the plan's pool windows: 2x2 at dilation 1. */
static bool winograd_pools(const Conv2dPlan &pl) {
  return pl.pool == 2 && pl.cv.dh == 1 && pl.cv.dw == 1;
}

static bool winograd_geometry(const Conv2dPlan &pl, Winograd *g) {
  const CudnnConv &cv = pl.cv;
  if (cv.groups != 1 || cv.kh != 3 || cv.kw != 3 || cv.sh != 1 || cv.sw != 1 || cv.dh < 1 ||
      cv.dw < 1 || cv.c < 1 || cv.m < 1)
    return false;
  int64_t th = cv.dh * (((cv.oh + cv.dh - 1) / cv.dh + 1) / 2);
  int64_t tw = cv.dw * (((cv.ow + cv.dw - 1) / cv.dw + 1) / 2), tiles = cv.n * th * tw;
  int64_t biggest = 16 * (tiles > cv.m ? tiles : cv.m) * (cv.c > cv.m ? cv.c : cv.m);
  if (!fits_int(biggest) || !fits_int(cv.n * cv.c * cv.h * cv.w) ||
      !fits_int(cv.n * cv.m * cv.oh * cv.ow))
    return false;
  *g = {(int)cv.n, (int)cv.c, (int)cv.m, (int)cv.h, (int)cv.w, (int)cv.oh, (int)cv.ow,
        (int)cv.ph, (int)cv.pw, (int)cv.dh, (int)cv.dw, (int)th, (int)tw, (int)tiles,
        winograd_pools(pl)};
  return true;
}

/* The first output row (column) of tile row (column) t at dilation d; its
 * second is d further. */
__host__ __device__ __forceinline__ int winograd_origin(int t, int d) {
  return 2 * d * (t / d) + t % d;
}

/* Scratch: U [16][M][C], V [16][C][tiles] and the products [16][M][tiles]. */
static const size_t WINOGRAD_CAP = (size_t)256 << 20;
static size_t winograd_u_bytes(const Winograd &g) {
  return align_up((size_t)16 * g.m * g.c * sizeof(float));
}
static size_t winograd_v_bytes(const Winograd &g) {
  return align_up((size_t)16 * g.c * g.tiles * sizeof(float));
}
static size_t winograd_bytes(const Winograd &g) {
  return winograd_u_bytes(g) + winograd_v_bytes(g) +
         align_up((size_t)16 * g.m * g.tiles * sizeof(float));
}

/* Winograd in passes over the images, where the transforms of all of them
 * would pass WINOGRAD_CAP (VGG-19's 224x224 layer at batch 16: 1.6 GB):
 * g for a pass of `images` of its images, the same filters. */
static Winograd winograd_pass(const Winograd &g, int images) {
  Winograd p = g;
  p.n = images;
  p.tiles = images * g.th * g.tw;
  return p;
}

/* The images a pass takes: all of them where their transforms fit the
 * cap, else as many as fit; 0 where one image's do not. */
static int winograd_pass_images(const Winograd &g) {
  int p = g.n;
  while (p > 0 && winograd_bytes(winograd_pass(g, p)) > WINOGRAD_CAP) p--;
  return p;
}

/* One pass's scratch: the filters', the tiles' and the products' transforms. */
static size_t winograd_pass_bytes(const Winograd &g) {
  return winograd_bytes(winograd_pass(g, winograd_pass_images(g)));
}

/* Where image img0 of a pass starts in the (padded) input, the residual
 * and the output (pooled or not). */
struct WinogradOffsets {
  int64_t x, z, y;
};
static WinogradOffsets winograd_offsets(const Winograd &g, int img0) {
  int64_t full = (int64_t)g.m * g.oh * g.ow;
  int64_t out = g.pooled ? (int64_t)g.m * (g.oh / 2) * (g.ow / 2) : full;
  return {img0 * (int64_t)g.c * g.h * g.w, img0 * full, img0 * out};
}

/* U = G g G^T for one 3x3 filter g (row-major), G = [1 0 0; .5 .5 .5;
 * .5 -.5 .5; 0 0 1]. */
__host__ __device__ __forceinline__ void winograd_filter(const float *g, float u[16]) {
  float t[4][3];
  for (int j = 0; j < 3; j++) {
    float a = g[j], b = g[3 + j], c = g[6 + j];
    t[0][j] = a, t[1][j] = 0.5f * (a + b + c), t[2][j] = 0.5f * (a - b + c), t[3][j] = c;
  }
  for (int i = 0; i < 4; i++) {
    float a = t[i][0], b = t[i][1], c = t[i][2];
    u[i * 4 + 0] = a, u[i * 4 + 1] = 0.5f * (a + b + c), u[i * 4 + 2] = 0.5f * (a - b + c),
              u[i * 4 + 3] = c;
  }
}

/* V = B^T d B for the 4x4 input tile of output tile (ty, tx) in one
 * channel's plane (rows and columns a dilation apart), B^T = [1 0 -1 0;
 * 0 1 1 0; 0 -1 1 0; 0 1 0 -1]; taps outside the plane are the padding's
 * zeros. */
__host__ __device__ __forceinline__ void winograd_input(const Winograd &g, const float *plane,
                                                        int ty, int tx, float v[16]) {
  float d[4][4];
  int y0 = winograd_origin(ty, g.dh) - g.ph, x0 = winograd_origin(tx, g.dw) - g.pw;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) {
      int y = y0 + i * g.dh, x = x0 + j * g.dw;
      d[i][j] = (unsigned)y < (unsigned)g.h && (unsigned)x < (unsigned)g.w
                    ? plane[(int64_t)y * g.w + x]
                    : 0.0f;
    }
  float t[4][4];
  for (int j = 0; j < 4; j++) {
    t[0][j] = d[0][j] - d[2][j], t[1][j] = d[1][j] + d[2][j];
    t[2][j] = d[2][j] - d[1][j], t[3][j] = d[1][j] - d[3][j];
  }
  for (int i = 0; i < 4; i++) {
    v[i * 4 + 0] = t[i][0] - t[i][2], v[i * 4 + 1] = t[i][1] + t[i][2];
    v[i * 4 + 2] = t[i][2] - t[i][1], v[i * 4 + 3] = t[i][1] - t[i][3];
  }
}

/* Y = A^T M A for one tile's 16 summed products, A^T = [1 1 1 0;
 * 0 1 -1 -1]: the 2x2 outputs, row-major. */
__host__ __device__ __forceinline__ void winograd_output(const float mt[16], float y[4]) {
  float s[2][4];
  for (int j = 0; j < 4; j++) {
    s[0][j] = mt[j] + mt[4 + j] + mt[8 + j];
    s[1][j] = mt[4 + j] - mt[8 + j] - mt[12 + j];
  }
  for (int i = 0; i < 2; i++) {
    y[i * 2 + 0] = s[i][0] + s[i][1] + s[i][2];
    y[i * 2 + 1] = s[i][1] - s[i][2] - s[i][3];
  }
}

/* The 16 products M(xi) = U(xi) V(xi), [M x C] by [C x tiles], one
 * batch. */
static CudaProduct winograd_product(const Winograd &g, const float *u, const float *v,
                                    float *mt) {
  return {g.m, g.tiles, g.c, 16, u, g.c, (long long)g.m * g.c, v, g.tiles,
          (long long)g.c * g.tiles, mt, g.tiles, (long long)g.m * g.tiles};
}

/* Tile p of the products' inner extent is image p / (th tw), tile row
 * (p / tw) % th, column p % tw. */

/* Tile t of input plane pl (image, channel) into V [16][C][tiles]. */
__host__ __device__ __forceinline__ void winograd_input_tile(const Winograd &g, const float *x,
                                                             float *v, int pl, int t) {
  int img = pl / g.c, ci = pl - img * g.c;
  float d[16];
  winograd_input(g, x + (int64_t)pl * g.h * g.w, t / g.tw, t % g.tw, d);
  int64_t at = (int64_t)ci * g.tiles + (int64_t)img * g.th * g.tw + t;
  for (int k = 0; k < 16; k++) v[(int64_t)k * g.c * g.tiles + at] = d[k];
}

/* Tile t of output plane pl (image, output channel) from the products
 * [16][M][tiles], its epilogue applied (bias_at: the channel's bias, or
 * NULL; z: the residual, of the full output's shape), stored where it
 * falls inside the output; or, pooled, the tile's max (pool_window) stored
 * at its place in the pooled output, and nothing for a partial tile (an
 * odd last row or column: the pool rounds its extents down). */
__host__ __device__ __forceinline__ void winograd_output_tile(const Winograd &g,
                                                              const float *mt, const float *z,
                                                              const float *bias_at, float *y,
                                                              UnaryArgs act, int pl, int t) {
  int ty = t / g.tw, tx = t % g.tw;
  int oy = winograd_origin(ty, g.dh), ox = winograd_origin(tx, g.dw);
  if (g.pooled && (oy + 1 >= g.oh || ox + 1 >= g.ow)) return;
  int img = pl / g.m, oc = pl - img * g.m;
  float f[16], o[4];
  int64_t at = (int64_t)oc * g.tiles + (int64_t)img * g.th * g.tw + t;
  for (int k = 0; k < 16; k++) f[k] = mt[(int64_t)k * g.m * g.tiles + at];
  winograd_output(f, o);
  for (int i = 0; i < 2 && oy + i * g.dh < g.oh; i++)
    for (int j = 0; j < 2 && ox + j * g.dw < g.ow; j++) {
      int64_t yi = ((int64_t)pl * g.oh + oy + i * g.dh) * g.ow + ox + j * g.dw;
      o[i * 2 + j] = epilogue_at(o[i * 2 + j], z ? z + yi : nullptr, bias_at, act);
      if (!g.pooled) y[yi] = o[i * 2 + j];
    }
  if (g.pooled) y[((int64_t)pl * (g.oh / 2) + ty) * (g.ow / 2) + tx] = pool_window(o, 2, 2);
}

/* Filter i (output channel i / C, input channel i % C) into U [16][M][C]. */
__host__ __device__ __forceinline__ void winograd_filter_pair(const float *w, float *u,
                                                              int pairs, int i) {
  float t[16];
  winograd_filter(w + (int64_t)i * 9, t);
  for (int k = 0; k < 16; k++) u[(int64_t)k * pairs + i] = t[k];
}

__global__ void winograd_filter_kernel(const float *__restrict__ w, float *__restrict__ u,
                                       int pairs) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += gridDim.x * blockDim.x)
    winograd_filter_pair(w, u, pairs, i);
}

/* One (image, channel) plane per block row, its tiles along x. */
__global__ void winograd_input_kernel(const float *__restrict__ x, float *__restrict__ v,
                                      Winograd g) {
  int per_image = g.th * g.tw;
  for (int pl = blockIdx.y; pl < g.n * g.c; pl += gridDim.y)
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < per_image;
         t += gridDim.x * blockDim.x)
      winograd_input_tile(g, x, v, pl, t);
}

/* One (image, output channel) plane per block row, its tiles along x; y
 * may be z (a residual added in place): each element is read, then
 * written, by one thread. Pooled, y is smaller than z and never it. */
__global__ void winograd_output_kernel(const float *__restrict__ mt, const float *z,
                                       const float *__restrict__ bias, float *y, Winograd g,
                                       UnaryArgs act) {
  int per_image = g.th * g.tw;
  for (int pl = blockIdx.y; pl < g.n * g.m; pl += gridDim.y) {
    float b = bias ? bias[pl % g.m] : 0.0f;
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < per_image;
         t += gridDim.x * blockDim.x)
      winograd_output_tile(g, mt, z, bias ? &b : nullptr, y, act, pl, t);
  }
}

/* ---- the ways' arithmetic on the host ----
 * Where a way's arithmetic is ours (the direct and tiled kernels,
 * Winograd's transforms; the padding copy, the unfolding and the epilogue
 * around cuBLAS's product; the pool after any way), its element functions
 * run on the host too, in the order the threads run them: a machine
 * without a GPU checks their indexing against the CPU row
 * (cuda_kernel_on_host; tests/runtime/test_linear.c). cuBLAS's product
 * runs as loops over the very description the device passes cuBLAS
 * (CudaProduct), so its arguments are checked too. */

/* A way asked of a configuration it does not take. */
static int not_taken(const char *way, Diag *d) {
  diag_error(d, "%s does not take this configuration", way);
  return TEQ_ERR_UNSUPPORTED;
}

/* A conv2d node's host tensors as the kernels take them, and its plan. */
struct HostConv {
  Conv2dPlan pl;
  const float *x, *w, *bias, *z; /* bias, z: NULL where the node has none */
  float *y;
  UnaryArgs act;
  bool epilogue_later; /* a whole product leaves its epilogue to the pool after it */
};

static int host_conv(const Node *n, Tensor *const *in, Tensor *out, HostConv *h, Diag *d) {
  CudaTensor cin[4], cout = {out->data, out->shape, out->dtype};
  for (int i = 0; i < n->n_in && i < 4; i++) cin[i] = {in[i]->data, in[i]->shape, in[i]->dtype};
  h->x = (const float *)in[0]->data, h->w = (const float *)in[1]->data;
  h->bias = n->n_in > 2 ? (const float *)in[2]->data : nullptr;
  h->z = n->n_in > 3 ? (const float *)in[3]->data : nullptr;
  h->y = (float *)out->data;
  h->act = fused_act_args((int)param_int(&n->params, CONV_ACT));
  h->epilogue_later = false;
  return conv2d_plan(n, cin, &cout, &h->pl, d);
}

static int direct_on_host(const HostConv &h, Diag *d) {
  DirectConv g;
  if (!direct_geometry(h.pl, &g)) return not_taken("teq:direct", d);
  int ntaps = g.cg * g.kh * g.kw, plane = g.oh * g.ow;
  for (int pl = 0; pl < g.n * g.m; pl++) {
    int img = pl / g.m, oc = pl - img * g.m;
    const float *taps = h.w + (int64_t)oc * ntaps, *xg = direct_group_input(g, h.x, img, oc);
    for (int p = 0; p < plane; p++) {
      int64_t at = (int64_t)pl * plane + p;
      float v = direct_conv_sum(g, xg, taps, p / g.ow, p % g.ow);
      h.y[at] = epilogue_at(v, h.z ? h.z + at : nullptr, h.bias ? h.bias + oc : nullptr, h.act);
    }
  }
  return TEQ_OK;
}

/* teq:tiled: each block's chunks staged and summed as the threads of the
 * kernel do, one thread after another. */
static int tiled_on_host(const HostConv &h, Diag *d) {
  TiledConv t;
  if (!tiled_geometry(h.pl, &t)) return not_taken("teq:tiled", d);
  int threads = t.ocb * t.th * t.tw;
  float *smem = (float *)malloc(tiled_smem_floats(t) * sizeof(float));
  float *acc = (float *)malloc((size_t)threads * sizeof(float));
  if (!smem || !acc) {
    free(smem), free(acc);
    diag_error(d, "out of memory for the host's tiles");
    return TEQ_ERR_NOMEM;
  }
  float *s_in = smem, *s_w = smem + t.ci * t.ih * t.iw;
  int ocl, py, px;
  for (int b = 0; b < t.blocks; b++)
    for (int tile = 0; tile < t.tiles; tile++) {
      TiledBlock k = tiled_block(t, h.x, b, tile);
      for (int i = 0; i < threads; i++) acc[i] = 0.0f;
      for (int c0 = 0; c0 < t.g.cg; c0 += t.ci) {
        int nci = t.g.cg - c0 < t.ci ? t.g.cg - c0 : t.ci;
        tiled_stage(t, k, h.w, s_in, s_w, c0, nci, 0, 1);
        for (int i = 0; i < threads; i++)
          if (tiled_output(t, k, i, &ocl, &py, &px))
            acc[i] += tiled_sum(t, s_in, s_w, nci, ocl, py, px);
      }
      for (int i = 0; i < threads; i++)
        if (tiled_output(t, k, i, &ocl, &py, &px)) {
          int64_t at = tiled_at(t, k, ocl, py, px);
          h.y[at] = epilogue_at(acc[i], h.z ? h.z + at : nullptr,
                                h.bias ? h.bias + k.oc0 + ocl : nullptr, h.act);
        }
    }
  free(smem), free(acc);
  return TEQ_OK;
}

/* The input as cuDNN and the cuBLAS ways read it: x, or x with the uneven
 * part of its padding copied in (pad_planes_at) into *owned, which the
 * caller frees. */
static const float *host_conv_input(const HostConv &h, float **owned) {
  const Conv2dPlan &pl = h.pl;
  const CudnnConv &cv = pl.cv;
  *owned = nullptr;
  if (!pl.padded) return h.x;
  int64_t xn = cv.n * cv.c * cv.h * cv.w;
  float *xp = (float *)malloc((size_t)xn * sizeof(float));
  if (!xp) return nullptr;
  for (int64_t i = 0; i < xn; i++)
    xp[i] = pad_planes_at(h.x, i, pl.h, pl.w, cv.h, cv.w, pl.extra_top, pl.extra_left);
  return *owned = xp;
}

/* The cuBLAS ways (cublas:gemm, a 1x1 convolution's product on its
 * input, and cublas:im2col+gemm; whole or split S): the uneven part of the
 * padding copied (pad_planes_at), the columns unfolded (im2col_at), the
 * products as the device describes them to cuBLAS (conv_product), then
 * the epilogue (epilogue_at; pooled, the pool applies it) or the
 * partials' sum with it. A split takes
 * here any K that S divides; the device also asks for slices of at least
 * 64 and an output too small to fill it (cuda_split_applies). */
static int product_on_host(const HostConv &h, int64_t product, int splits, const char *way,
                           Diag *d) {
  const Conv2dPlan &pl = h.pl;
  const CudnnConv &cv = pl.cv;
  int64_t k = product_k(cv), plane = cv.oh * cv.ow, total = cv.n * cv.m * plane;
  if (!(product == ALGO_GEMM ? pointwise(pl) : im2col_applies(pl)) || k % splits)
    return not_taken(way, d);
  float *xp, *col = nullptr, *part = nullptr;
  const float *xin = host_conv_input(h, &xp), *cols = xin;
  if (product == ALGO_IM2COL)
    cols = col = (float *)malloc((size_t)(cv.n * k * plane) * sizeof(float));
  if (splits > 1) part = (float *)malloc((size_t)(splits * total) * sizeof(float));
  if (!xin || !cols || (splits > 1 && !part)) {
    free(xp), free(col), free(part);
    diag_error(d, "out of memory for the host's columns and partial products");
    return TEQ_ERR_NOMEM;
  }
  if (col) {
    Im2col g = im2col_geometry(cv);
    for (int r = 0; r < (int)(cv.n * k); r++) {
      Im2colRow row = im2col_row(g, xin, r);
      for (int p = 0; p < (int)plane; p++) col[r * plane + p] = im2col_at(g, row, p);
    }
  }
  for (int64_t img = 0; img < conv_product_calls(cv, splits); img++)
    cuda_product_on_host(conv_product(cv, cols, h.w, h.y, splits, part, img));
  if (splits > 1)
    cuda_sum_partials_on_host(part, splits, total, h.bias, cv.m, plane, h.z, h.act.act, h.y);
  else if (!h.epilogue_later)
    for (int64_t at = 0; at < total; at++)
      h.y[at] = epilogue_at(h.y[at], h.z ? h.z + at : nullptr,
                            h.bias ? h.bias + at / plane % cv.m : nullptr, h.act);
  free(xp), free(col), free(part);
  return TEQ_OK;
}

/* teq:winograd: the padding copy, the filters', the tiles' and the
 * products' transforms as the kernels run them, the 16 products from the
 * description the device passes cuBLAS, the epilogue (and, pooled, each
 * tile's max). */
static int winograd_on_host(const HostConv &h, Diag *d) {
  Winograd g;
  if (!winograd_geometry(h.pl, &g)) return not_taken("teq:winograd", d);
  /* Passes of half the images, rounded up, where the device takes them all
   * in one below its cap: both a pass of several and the offsets between
   * passes are replayed on small tests. */
  Winograd most = winograd_pass(g, (g.n + 1) / 2);
  float *xp;
  const float *xin = host_conv_input(h, &xp);
  float *u = (float *)malloc(winograd_bytes(most));
  if (!xin || !u) {
    free(xp), free(u);
    diag_error(d, "out of memory for the host's transforms");
    return TEQ_ERR_NOMEM;
  }
  float *v = (float *)((char *)u + winograd_u_bytes(most));
  float *mt = (float *)((char *)v + winograd_v_bytes(most));
  int pairs = g.m * g.c, per_image = g.th * g.tw;
  for (int i = 0; i < pairs; i++) winograd_filter_pair(h.w, u, pairs, i);
  for (int img0 = 0; img0 < g.n; img0 += most.n) {
    Winograd gp = winograd_pass(g, g.n - img0 < most.n ? g.n - img0 : most.n);
    WinogradOffsets at = winograd_offsets(g, img0);
    for (int pl = 0; pl < gp.n * gp.c; pl++)
      for (int t = 0; t < per_image; t++) winograd_input_tile(gp, xin + at.x, v, pl, t);
    cuda_product_on_host(winograd_product(gp, u, v, mt));
    for (int pl = 0; pl < gp.n * gp.m; pl++)
      for (int t = 0; t < per_image; t++)
        winograd_output_tile(gp, mt, h.z ? h.z + at.z : nullptr,
                             h.bias ? h.bias + pl % gp.m : nullptr, h.y + at.y, h.act, pl, t);
  }
  free(xp), free(u);
  return TEQ_OK;
}

/* The way named, into h.y: the whole of Winograd's when pooled, the full
 * output of any other. */
static int way_on_host(const char *way, const HostConv &h, Diag *d) {
  if (way && strcmp(way, "teq:direct") == 0) return direct_on_host(h, d);
  if (way && strcmp(way, "teq:winograd") == 0) return winograd_on_host(h, d);
  if (way && strcmp(way, "teq:tiled") == 0) return tiled_on_host(h, d);
  for (int64_t product : {ALGO_GEMM, ALGO_IM2COL})
    for (int s = 1; way && s <= CUDA_SPLIT_MAX; s *= 2) {
      char name[CUDA_WAY_NAME_MAX];
      cuda_product_way_name(product != ALGO_GEMM, s, name, sizeof name);
      if (strcmp(way, name) == 0) return product_on_host(h, product, s, way, d);
    }
  diag_error(d,
             "conv2d: no host check of way \"%s\" (teq:direct, teq:tiled, teq:winograd, "
             "cublas:gemm or cublas:im2col+gemm, whole or split 2 to %d)",
             way ? way : "(none)", (int)CUDA_SPLIT_MAX);
  return TEQ_ERR_UNSUPPORTED;
}

/* A way that does not pool itself, then the pool, as conv2d_run_then_pool
 * runs them: the way into a full output of its own (the device's head of
 * scratch), then pool_at of each pooled element into y, with the epilogue
 * where a whole product left it to the pool. */
static int way_then_pool_on_host(const char *way, HostConv h, Diag *d) {
  const CudnnConv &cv = h.pl.cv;
  float *y = h.y;
  h.y = (float *)malloc((size_t)(cv.n * cv.m * cv.oh * cv.ow) * sizeof(float));
  if (!h.y) {
    diag_error(d, "out of memory for the host's output before its pool");
    return TEQ_ERR_NOMEM;
  }
  char gemm[CUDA_WAY_NAME_MAX], im2col[CUDA_WAY_NAME_MAX];
  cuda_product_way_name(false, 1, gemm, sizeof gemm);
  cuda_product_way_name(true, 1, im2col, sizeof im2col);
  h.epilogue_later = way && (strcmp(way, gemm) == 0 || strcmp(way, im2col) == 0);
  PoolEpilogue e = {h.epilogue_later, h.z, h.bias, cv.m, h.act};
  int rc = way_on_host(way, h, d);
  if (rc == TEQ_OK)
    for (int64_t i = 0; i < pooled_numel(h.pl); i++)
      y[i] = pool_at(h.y, i, cv.oh, cv.ow, (int)h.pl.pool, e);
  free(h.y);
  return rc;
}

int cuda_conv2d_on_host(const char *way, const Node *n, Tensor *const *in, Tensor *out,
                        Diag *d) {
  HostConv h;
  int rc = host_conv(n, in, out, &h, d);
  if (rc) return rc;
  bool pools_itself = way && strcmp(way, "teq:winograd") == 0 && winograd_pools(h.pl);
  if (!h.pl.pool || pools_itself) return way_on_host(way, h, d);
  return way_then_pool_on_host(way, h, d);
}

/* ---- choosing a way to run a convolution ----
 * A way is cuBLAS (ALGO_GEMM, ALGO_IM2COL, whole or split along K) or a
 * cuDNN algorithm, run plainly and followed by the epilogue, or, with
 * ALGO_FUSED added, through cudnnConvolutionBiasActivationForward (a bias
 * and a relu). The fused call is not always the faster: on the H100 some
 * algorithms ran it at a third of their plain speed (a grouped 1x1 conv:
 * 123 us fused, 29 us plain), so the choice times whole ways, epilogue
 * included. */
enum { ALGO_FUSED = 1 << 16, WAY_DIRECT = 1 << 17, WAY_WINOGRAD = 1 << 18, WAY_TILED = 1 << 19 };
static bool is_fused(int64_t way) { return way >= 0 && (way & ALGO_FUSED); }

/* Whether a way runs its epilogue as a pass of its own, after the product:
 * the whole cuBLAS products (a split's sum takes it) and cuDNN's plain
 * call. Ours apply it in their stores, cuDNN's fused call in its own. */
static bool epilogue_apart(int64_t way) {
  if (way < 0) return splits_of(way) == 1;
  return way != WAY_DIRECT && way != WAY_WINOGRAD && way != WAY_TILED && !is_fused(way);
}

/* What a way is called in step notes and by cuda_device_pin_way. */
static void way_name(int64_t way, char *buf, size_t size) {
  if (way == WAY_DIRECT) {
    snprintf(buf, size, "teq:direct");
  } else if (way == WAY_WINOGRAD) {
    snprintf(buf, size, "teq:winograd");
  } else if (way == WAY_TILED) {
    snprintf(buf, size, "teq:tiled");
  } else if (way < 0) {
    cuda_product_way_name(product_of(way) != ALGO_GEMM, splits_of(way), buf, size);
  } else if (is_fused(way)) {
    snprintf(buf, size, "cudnn:%s+bias+relu", fwd_algo_name((int)(way & ~(int64_t)ALGO_FUSED)));
  } else {
    snprintf(buf, size, "cudnn:%s", fwd_algo_name((int)way));
  }
}

/* The arguments of one convolution, as a way runs it. */
struct Conv2dArgs {
  const Conv2dPlan *pl;
  const CudnnDescs *ds;
  const float *x, *w, *bias, *z; /* z: the residual, or NULL */
  int act;
  float *y;
  const DirectConv *direct; /* the direct kernel's geometry, NULL where it does not apply */
  const Winograd *winograd; /* the Winograd way's, NULL where it does not apply */
  const TiledConv *tiled;   /* the tiled way's, NULL where it does not apply */
  bool w_constant;          /* w is one of the plan's constants (cuda_is_constant) */
  size_t head; /* scratch bytes before the way's own: the full output a pool reads, or 0 */
  bool epilogue_later; /* a way whose epilogue is a pass of its own leaves it to the pool */
};

/* A way's scratch of `bytes`, after the head its caller keeps there (the
 * full output that a pool reads next), or NULL without asking when the way
 * needs none. */
static int way_scratch(CudaCtx *cx, const Conv2dArgs &a, size_t bytes, char **out, Diag *d) {
  int rc = scratch_of(cx, bytes ? a.head + bytes : 0, out, d);
  if (*out) *out += a.head;
  return rc;
}

/* Blocks sized to a plane (cuda_row_threads), planes along the grid's y. */
static int conv2d_run_direct(CudaCtx *cx, const Conv2dArgs &a, Diag *d) {
  const DirectConv &g = *a.direct;
  int plane = g.oh * g.ow, planes = g.n * g.m;
  if (plane == 0 || planes == 0) return TEQ_OK;
  int threads = cuda_row_threads(plane, THREADS);
  dim3 grid((plane + threads - 1) / threads, planes < 65535 ? planes : 65535);
  conv_direct_kernel<<<grid, threads, 0, cx->stream>>>(a.x, a.w, a.bias, a.z, a.y, g,
                                                       fused_act_args(a.act));
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* Tiles along the grid's x, (image, group, channel chunk) along y, a
 * thread per output of a block. */
static int conv2d_run_tiled(CudaCtx *cx, const Conv2dArgs &a, Diag *d) {
  const TiledConv &t = *a.tiled;
  int threads = cuda_row_threads(t.ocb * t.th * t.tw, TILED_THREADS);
  dim3 grid(t.tiles, t.blocks < 65535 ? t.blocks : 65535);
  conv_tiled_kernel<<<grid, threads, tiled_smem_floats(t) * sizeof(float), cx->stream>>>(
      a.x, a.w, a.bias, a.z, a.y, t, fused_act_args(a.act));
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* Scratch holds the padded input, then U, V and the products: the
 * filters' and the tiles' transforms, the 16 products (one strided batched
 * call, as conv_product makes y^T = cols^T w^T: M(xi)^T = V(xi)^T U(xi)^T
 * column-major), the transform back with the epilogue. */
static int conv2d_run_winograd(CudaCtx *cx, const Conv2dArgs &a, Diag *d) {
  const Conv2dPlan &pl = *a.pl;
  const Winograd &g = *a.winograd;
  char *scratch;
  const float *xin;
  int rc;
  Winograd most = winograd_pass(g, winograd_pass_images(g));
  if ((rc = way_scratch(cx, a, pl.pad_bytes + winograd_bytes(most), &scratch, d))) return rc;
  if ((rc = conv2d_input(pl, cx, a.x, scratch, &xin, d))) return rc;
  float *u = (float *)(scratch + pl.pad_bytes);
  float *v = (float *)((char *)u + winograd_u_bytes(most));
  float *mt = (float *)((char *)v + winograd_v_bytes(most));
  int pairs = g.m * g.c, per_image = g.th * g.tw;
  /* A constant filter (a model's weight) is transformed once and kept with
   * the plan; any other, into scratch on every call. */
  bool fresh = false;
  float *kept = a.w_constant ? (float *)cuda_derived(cx, a.w, CUDA_DERIVED_WINOGRAD,
                                                     winograd_u_bytes(g), &fresh)
                             : nullptr;
  if (kept) u = kept;
  if (!kept || fresh) {
    winograd_filter_kernel<<<cuda_blocks(pairs, THREADS), THREADS, 0, cx->stream>>>(a.w, u,
                                                                                    pairs);
    CUDA_LAUNCHED();
  }
  int threads = cuda_row_threads(per_image, THREADS), bx = (per_image + threads - 1) / threads;
  for (int img0 = 0; img0 < g.n; img0 += most.n) {
    Winograd gp = winograd_pass(g, g.n - img0 < most.n ? g.n - img0 : most.n);
    WinogradOffsets at = winograd_offsets(g, img0);
    int in_planes = gp.n * gp.c, out_planes = gp.n * gp.m;
    winograd_input_kernel<<<dim3(bx, in_planes < 65535 ? in_planes : 65535), threads, 0,
                            cx->stream>>>(xin + at.x, v, gp);
    CUDA_LAUNCHED();
    if ((rc = cuda_product(cx, winograd_product(gp, u, v, mt), d))) return rc;
    winograd_output_kernel<<<dim3(bx, out_planes < 65535 ? out_planes : 65535), threads, 0,
                             cx->stream>>>(mt, a.z ? a.z + at.z : nullptr, a.bias, a.y + at.y, gp,
                                           fused_act_args(a.act));
    CUDA_LAUNCHED();
  }
  return TEQ_OK;
}

/* A cuBLAS way: scratch holds the padded input, then the columns (im2col),
 * then the partial products (split), each part only where used. */
static int conv2d_run_product(CudaCtx *cx, const Conv2dArgs &a, int64_t way, size_t ws_bytes,
                              Diag *d) {
  const Conv2dPlan &pl = *a.pl;
  const CudnnConv &cv = pl.cv;
  char *scratch;
  const float *xin;
  int rc;
  if ((rc = way_scratch(cx, a, pl.pad_bytes + ws_bytes, &scratch, d))) return rc;
  if ((rc = conv2d_input(pl, cx, a.x, scratch, &xin, d))) return rc;
  const float *cols = xin;
  size_t col_bytes = 0;
  if (product_of(way) == ALGO_IM2COL) {
    float *col = (float *)(scratch + pl.pad_bytes);
    if ((rc = im2col(cx, cv, xin, col, d))) return rc;
    cols = col;
    col_bytes = im2col_bytes(pl);
  }
  int splits = splits_of(way);
  float *part = splits > 1 ? (float *)(scratch + pl.pad_bytes + col_bytes) : nullptr;
  for (int64_t img = 0; img < conv_product_calls(cv, splits); img++)
    if ((rc = cuda_product(cx, conv_product(cv, cols, a.w, a.y, splits, part, img), d))) return rc;
  if (splits == 1)
    return a.epilogue_later ? TEQ_OK : conv2d_epilogue(cx, cv, a.bias, a.z, a.act, a.y, d);
  return cuda_sum_partials(cx, part, splits, cv.n * cv.m * cv.oh * cv.ow, a.bias, cv.m,
                           cv.oh * cv.ow, a.z, a.act, a.y, d);
}

/* The convolution one way (workspace ws_bytes), epilogue included, into
 * a.y: the whole of a way that pools itself (Winograd's, pooled), the
 * full output of any other. TEQ_ERR_UNSUPPORTED, with nothing in d, where
 * cuDNN does not fuse for this algorithm. */
static int conv2d_run_conv(CudaCtx *cx, const Conv2dArgs &a, int64_t way, size_t ws_bytes,
                           Diag *d) {
  if (way == WAY_DIRECT) return conv2d_run_direct(cx, a, d);
  if (way == WAY_WINOGRAD) return conv2d_run_winograd(cx, a, d);
  if (way == WAY_TILED) return conv2d_run_tiled(cx, a, d);
  if (way < 0) return conv2d_run_product(cx, a, way, ws_bytes, d);
  const Conv2dPlan &pl = *a.pl;
  const CudnnDescs &ds = *a.ds;
  int rc;
  char *scratch;
  const float *xin;
  if ((rc = way_scratch(cx, a, pl.pad_bytes + ws_bytes, &scratch, d))) return rc;
  if ((rc = conv2d_input(pl, cx, a.x, scratch, &xin, d))) return rc;
  void *ws = ws_bytes ? scratch + pl.pad_bytes : nullptr;
  const float one = 1.0f, zero = 0.0f;
  if (is_fused(way)) {
    cudnnConvolutionFwdAlgo_t algo = (cudnnConvolutionFwdAlgo_t)(way & ~(int64_t)ALGO_FUSED);
    /* y = relu(conv(x) + z + bias); without a residual, z (= y) is weighted
     * by 0: no prior output is read. */
    cudnnStatus_t s = cudnnConvolutionBiasActivationForward(
        cx->cudnn, &one, ds.x, xin, ds.w, a.w, ds.conv, algo, ws, ws_bytes, a.z ? &one : &zero,
        ds.y, a.z ? a.z : a.y, ds.bias, a.bias, ds.act, ds.y, a.y);
    if (s == CUDNN_STATUS_NOT_SUPPORTED) return TEQ_ERR_UNSUPPORTED;
    if (s != CUDNN_STATUS_SUCCESS)
      return cuda_fail(d, __FILE__, __LINE__, "cudnnConvolutionBiasActivationForward",
                       cudnnGetErrorString(s));
    return TEQ_OK;
  }
  cudnnConvolutionFwdAlgo_t algo = (cudnnConvolutionFwdAlgo_t)way;
  CUDNN_TRY(cudnnConvolutionForward(cx->cudnn, &one, ds.x, xin, ds.w, a.w, ds.conv, algo, ws,
                                    ws_bytes, &zero, ds.y, a.y));
  return a.epilogue_later ? TEQ_OK : conv2d_epilogue(cx, pl.cv, a.bias, a.z, a.act, a.y, d);
}

/* A way that does not pool itself, then the pool: the way writes the full
 * output into the head of scratch, and conv_pool_kernel reduces it into
 * y, applying the epilogue where the way's own would have been a pass of
 * its own (epilogue_apart). Scratch is asked for whole first (the head and
 * what the way asks after it: the padded input and its workspace, none for
 * our direct and tiled kernels), so the way's own ask moves nothing. */
static int conv2d_run_then_pool(CudaCtx *cx, const Conv2dArgs &a, int64_t way, size_t ws_bytes,
                                Diag *d) {
  const Conv2dPlan &pl = *a.pl;
  Conv2dArgs full = a;
  full.head = pool_head_bytes(pl);
  size_t own = way == WAY_DIRECT || way == WAY_TILED ? 0 : pl.pad_bytes + ws_bytes;
  char *scratch;
  int rc = scratch_of(cx, full.head + own, &scratch, d);
  if (rc) return rc;
  full.y = (float *)scratch;
  full.epilogue_later = epilogue_apart(way);
  if ((rc = conv2d_run_conv(cx, full, way, ws_bytes, d))) return rc;
  int64_t total = pooled_numel(pl);
  PoolEpilogue e = {full.epilogue_later, a.z, a.bias, pl.cv.m, fused_act_args(a.act)};
  conv_pool_kernel<<<cuda_blocks(total, THREADS), THREADS, 0, cx->stream>>>(
      full.y, a.y, total, pl.cv.oh, pl.cv.ow, (int)pl.pool, e);
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* Runs the convolution one way (workspace ws_bytes), epilogue and pool
 * included: how the choice times each way and how a run runs the chosen
 * one. TEQ_ERR_UNSUPPORTED, with nothing in d, where cuDNN does not fuse
 * for this algorithm. */
static int conv2d_run_way(CudaCtx *cx, const Conv2dArgs &a, int64_t way, size_t ws_bytes,
                          bool note, Diag *d) {
  if (note) {
    char name[64];
    way_name(way, name, sizeof name);
    cuda_note(cx, "%s", name);
  }
  if (!a.pl->pool || (way == WAY_WINOGRAD && a.winograd->pooled))
    return conv2d_run_conv(cx, a, way, ws_bytes, d);
  return conv2d_run_then_pool(cx, a, way, ws_bytes, d);
}

/* cuDNN's algorithms that a search times again, fastest first by its own
 * report, which times each once. The choice used to set that report
 * against cuBLAS timed warm, and two twins of one conv could part ways:
 * ResNet-18's stem ran im2col + cuBLAS at 47 us with its relu, cuDNN's
 * IMPLICIT_GEMM at 22 us without. */
enum { CUDNN_CANDIDATES = 2 };
/* Every way one search may time: the cuDNN candidates, each fused too, one
 * cuBLAS product whole and in splits of 2, 4, 8 and 16, the direct kernel,
 * the tiled one and Winograd's. */
enum { MAX_WAYS = 2 * CUDNN_CANDIDATES + 5 + 3 }; /* 1 + the splits 2, 4, 8, 16; our three */

/* The remembered {way, workspace bytes} of a forward configuration,
 * searched now if this is the first time and we are not capturing: every
 * candidate way timed whole, its pool included (cuda_time_calls, warm),
 * the fastest kept. */
static int conv2d_algo(const Node *n, CudaCtx *cx, const Conv2dArgs &a, uint64_t key,
                       int64_t memo[2], Diag *d) {
  if (cuda_memo_get(cx, key, memo)) return TEQ_OK;
  if (cx->capturing)
    return cuda_op_error(n, d, TEQ_ERR_INTERNAL,
                      "no convolution algorithm remembered for this configuration while "
                      "capturing (the first run should have searched)");
  const Conv2dPlan &pl = *a.pl;
  size_t ws_cap = fwd_search_workspace(cx, *a.ds);
  /* cuDNN writes the full output: y, or before a pool the head of
   * scratch, as conv2d_run_then_pool lays it out. */
  size_t head = pool_head_bytes(pl);
  char *scratch;
  int rc = scratch_of(cx, head + pl.pad_bytes + ws_cap, &scratch, d);
  if (rc) return rc;
  const float *xin;
  if ((rc = conv2d_input(pl, cx, a.x, scratch + head, &xin, d))) return rc;
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int got = 0;
  /* It may write y: the chosen way writes it again. */
  CUDNN_TRY(cudnnFindConvolutionForwardAlgorithmEx(
      cx->cudnn, a.ds->x, xin, a.ds->w, a.w, a.ds->conv, a.ds->y, head ? (float *)scratch : a.y,
      CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf,
      ws_cap ? scratch + head + pl.pad_bytes : nullptr, ws_cap));
  int64_t ways[MAX_WAYS];
  size_t bytes[MAX_WAYS];
  int n_ways = 0, n_cudnn = 0;
  for (int i = 0; i < got && n_cudnn < CUDNN_CANDIDATES; i++) /* fastest first */
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= ws_cap &&
        exact_enough_fwd(perf[i].algo)) {
      ways[n_ways] = (int64_t)perf[i].algo, bytes[n_ways++] = perf[i].memory;
      n_cudnn++;
    }
  if (n_cudnn == 0 && !a.direct && !a.tiled && !a.winograd)
    return cuda_op_error(n, d, TEQ_ERR_UNSUPPORTED,
                      "cuDNN has no forward algorithm for this configuration within %zu MB "
                      "of workspace", CONV_WORKSPACE_CAP >> 20);
  if (a.bias && a.act == ACT_RELU)
    for (int i = 0; i < n_cudnn; i++)
      ways[n_ways] = ways[i] | ALGO_FUSED, bytes[n_ways++] = bytes[i];
  /* A 1x1 convolution is a matrix product; any other ungrouped one, one on
   * its unfolded input (the columns in scratch). */
  int64_t product = pointwise(pl) ? ALGO_GEMM : im2col_applies(pl) ? ALGO_IM2COL : 0;
  if (product) {
    size_t col = product == ALGO_IM2COL ? im2col_bytes(pl) : 0;
    ways[n_ways] = product, bytes[n_ways++] = col;
    for (int s = 2; s <= CUDA_SPLIT_MAX; s *= 2)
      if (cuda_split_applies(cx, pl.cv.n, pl.cv.m, pl.cv.oh * pl.cv.ow, product_k(pl.cv), s))
        ways[n_ways] = split_way(product, s), bytes[n_ways++] = col + split_bytes(pl.cv, s);
  }
  if (a.direct) ways[n_ways] = WAY_DIRECT, bytes[n_ways++] = 0;
  if (a.tiled) ways[n_ways] = WAY_TILED, bytes[n_ways++] = 0;
  if (a.winograd) ways[n_ways] = WAY_WINOGRAD, bytes[n_ways++] = winograd_pass_bytes(*a.winograd);
  if (const char *pin = cuda_pinned_way(cx)) {
    char names[MAX_WAYS][CUDA_WAY_NAME_MAX];
    for (int i = 0; i < n_ways; i++) way_name(ways[i], names[i], sizeof names[i]);
    int i = 0;
    if ((rc = cuda_pinned_index(n, pin, names, n_ways, &i, d))) return rc;
    memo[0] = ways[i], memo[1] = (int64_t)bytes[i];
    cuda_memo_put(cx, key, memo);
    return TEQ_OK;
  }
  float best_ms = 0;
  memo[0] = ways[0], memo[1] = (int64_t)bytes[0];
  for (int i = 0; i < n_ways; i++) {
    float ms = 0;
    Diag wd; /* a way cuDNN refuses is passed over, not reported */
    diag_init(&wd);
    rc = cuda_time_calls(cx, [&] { return conv2d_run_way(cx, a, ways[i], bytes[i], false, &wd); },
                    &ms, &wd);
    if (rc == TEQ_OK && (i == 0 || ms < best_ms)) {
      best_ms = ms;
      memo[0] = ways[i], memo[1] = (int64_t)bytes[i];
    } else if (rc != TEQ_OK && !is_fused(ways[i])) {
      diag_error(d, "%s", diag_last(&wd));
      diag_fini(&wd);
      return rc;
    }
    diag_fini(&wd);
  }
  /* Winograd's filters, kept while it was timed, go if it lost. */
  if (a.winograd && memo[0] != WAY_WINOGRAD && a.w_constant)
    cuda_derived_drop(cx, a.w, CUDA_DERIVED_WINOGRAD, winograd_u_bytes(*a.winograd));
  cuda_memo_put(cx, key, memo);
  return TEQ_OK;
}

extern "C" int cuda_eval_conv2d(CUDA_KERNEL_SIGNATURE) {
  if (shape_numel(&out[0].shape) == 0) return TEQ_OK;
  Conv2dPlan pl;
  int rc = conv2d_plan(n, in, out, &pl, d);
  if (rc) return rc;
  const CudnnConv &cv = pl.cv;
  const int act = (int)param_int(&n->params, CONV_ACT);
  const float *bias = n->n_in > 2 ? (const float *)in[2].data : nullptr;
  const float *z = n->n_in > 3 ? (const float *)in[3].data : nullptr;
  CudnnDescs ds;
  if ((rc = conv_descs(n, cv, ds, d))) return rc;
  if (bias) {
    CUDNN_TRY(cudnnCreateTensorDescriptor(&ds.bias));
    CUDNN_TRY(cudnnSetTensor4dDescriptor(ds.bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1,
                                         (int)cv.m, 1, 1));
    if (act == ACT_RELU) {
      CUDNN_TRY(cudnnCreateActivationDescriptor(&ds.act));
      CUDNN_TRY(cudnnSetActivationDescriptor(ds.act, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN,
                                             0.0));
    }
  }
  DirectConv direct;
  bool has_direct = direct_geometry(pl, &direct);
  Winograd winograd;
  bool has_winograd = winograd_geometry(pl, &winograd) && winograd_pass_images(winograd) > 0;
  TiledConv tiled;
  bool has_tiled = tiled_geometry(pl, &tiled);
  Conv2dArgs a = {&pl, &ds, (const float *)in[0].data, (const float *)in[1].data, bias, z, act,
                  (float *)out[0].data, has_direct ? &direct : nullptr,
                  has_winograd ? &winograd : nullptr, has_tiled ? &tiled : nullptr,
                  cuda_is_constant(cx, in[1].data), 0, false};
  int64_t memo[2];
  /* A constant filter is a configuration of its own: Winograd transforms it
   * once, not on every call, and may win there alone. So is a pool, which
   * Winograd's tiles take in their transform back and other ways in a pass
   * of their own. */
  uint64_t key = conv_key(1, cv, act * 4 + (bias != nullptr) + 2 * (z != nullptr) +
                                     (a.w_constant ? 1 << 8 : 0) + (pl.pool << 9),
                          a.x, a.y, z);
  if ((rc = conv2d_algo(n, cx, a, key, memo, d))) return rc;
  rc = conv2d_run_way(cx, a, memo[0], (size_t)memo[1], true, d);
  if (rc == TEQ_ERR_UNSUPPORTED && is_fused(memo[0])) /* timed fused, refused now */
    rc = conv2d_run_way(cx, a, memo[0] & ~(int64_t)ALGO_FUSED, (size_t)memo[1], true, d);
  return rc;
}

/* ---- conv_transpose ---- */

/* y[img, m, oy, ox] = full[img, m, oy + top, ox + left] (0 past the full
 * scatter's end: output_padding) + bias[m]. */
__global__ void crop_bias_kernel(const float *__restrict__ full, const float *__restrict__ bias,
                                 float *__restrict__ y, int64_t planes, int64_t m, int64_t fh,
                                 int64_t fw, int64_t oh, int64_t ow, int64_t top, int64_t left) {
  int64_t total = planes * oh * ow;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t ox = i % ow, oy = (i / ow) % oh, plane = i / (ow * oh);
    int64_t fy = oy + top, fx = ox + left;
    float v = fy < fh && fx < fw ? full[(plane * fh + fy) * fw + fx] : 0.0f;
    y[i] = bias ? v + bias[plane % m] : v;
  }
}

extern "C" int cuda_eval_conv_transpose(CUDA_KERNEL_SIGNATURE) {
  if (shape_numel(&out[0].shape) == 0) return TEQ_OK;
  const Params *p = &n->params;
  const Shape &xs = in[0].shape, &ws = in[1].shape, &ys = out[0].shape;
  if (xs.ndim != 4 || ws.ndim != 4 || ys.ndim != 4)
    return cuda_op_error(n, d, TEQ_ERR_INTERNAL, "expected 4-D input, weight and output");
  const float *x = (const float *)in[0].data, *w = (const float *)in[1].data;
  const float *bias = n->n_in > 2 ? (const float *)in[2].data : nullptr;
  float *y = (float *)out[0].data;
  int64_t pt = p->v[CT_PADS].i[0], pleft = p->v[CT_PADS].i[1];
  int64_t pb = p->v[CT_PADS].i[2], pr = p->v[CT_PADS].i[3];
  int64_t oph = p->v[CT_OUTPAD].i[0], opw = p->v[CT_OUTPAD].i[1];

  /* The adjoint of a conv from the output (m channels, cuDNN's "x") to the
   * input (c channels, cuDNN's "y") with filter W [c, m/groups, kh, kw]. */
  CudnnConv cv;
  cv.n = xs.d[0], cv.m = xs.d[1], cv.oh = xs.d[2], cv.ow = xs.d[3];
  cv.kh = ws.d[2], cv.kw = ws.d[3], cv.cg = ws.d[1];
  cv.groups = param_int(p, CT_GROUPS);
  cv.c = cv.cg * cv.groups;
  cv.sh = p->v[CT_STRIDE].i[0], cv.sw = p->v[CT_STRIDE].i[1];
  cv.dh = p->v[CT_DILATION].i[0], cv.dw = p->v[CT_DILATION].i[1];
  /* cuDNN computes the output window directly when the pads are even and
   * output_padding is below the stride (then the forward conv of that
   * window has exactly the input's extent). Otherwise it computes the full
   * scatter, unpadded, and crop_bias_kernel copies the window out. */
  bool direct = pt == pb && pleft == pr && oph < cv.sh && opw < cv.sw;
  if (direct) {
    cv.ph = pt, cv.pw = pleft;
    cv.h = ys.d[2], cv.w = ys.d[3];
  } else {
    cv.ph = cv.pw = 0;
    cv.h = cv.sh * (cv.oh - 1) + (cv.kh - 1) * cv.dh + 1;
    cv.w = cv.sw * (cv.ow - 1) + (cv.kw - 1) * cv.dw + 1;
  }
  size_t full_bytes = direct ? 0 : align_up((size_t)(cv.n * cv.c * cv.h * cv.w) * sizeof(float));

  CudnnDescs ds;
  int rc = conv_descs(n, cv, ds, d);
  if (rc) return rc;
  int64_t memo[2];
  uint64_t key = conv_key(2, cv, direct, x, y, nullptr);
  char *scratch;
  if (!cuda_memo_get(cx, key, memo)) {
    if (cx->capturing)
      return cuda_op_error(n, d, TEQ_ERR_INTERNAL,
                        "no backward-data algorithm remembered for this configuration while "
                        "capturing (the first run should have searched)");
    size_t ws_cap = bwd_data_search_workspace(cx, ds);
    if ((rc = scratch_of(cx, full_bytes + ws_cap, &scratch, d))) return rc;
    float *dx = direct ? y : (float *)scratch;
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int got = 0;
    CUDNN_TRY(cudnnFindConvolutionBackwardDataAlgorithmEx(
        cx->cudnn, ds.w, w, ds.y, x, ds.conv, ds.x, dx, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
        &got, perf, ws_cap ? scratch + full_bytes : nullptr, ws_cap));
    int i = 0;
    while (i < got && !(perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= ws_cap &&
                        exact_enough_bwd_data(perf[i].algo)))
      i++;
    if (i == got)
      return cuda_op_error(n, d, TEQ_ERR_UNSUPPORTED,
                        "cuDNN has no backward-data algorithm for this configuration within "
                        "%zu MB of workspace", CONV_WORKSPACE_CAP >> 20);
    memo[0] = (int64_t)perf[i].algo;
    memo[1] = (int64_t)perf[i].memory;
    cuda_memo_put(cx, key, memo);
  }
  cudnnConvolutionBwdDataAlgo_t algo = (cudnnConvolutionBwdDataAlgo_t)memo[0];
  size_t ws_bytes = (size_t)memo[1];
  if ((rc = scratch_of(cx, full_bytes + ws_bytes, &scratch, d))) return rc;
  void *wsp = ws_bytes ? scratch + full_bytes : nullptr;
  cuda_note(cx, "cudnn:%s", bwd_data_algo_name(algo));

  const float one = 1.0f, zero = 0.0f;
  float *dx = direct ? y : (float *)scratch;
  CUDNN_TRY(cudnnConvolutionBackwardData(cx->cudnn, &one, ds.w, w, ds.y, x, ds.conv, algo, wsp,
                                         ws_bytes, &zero, ds.x, dx));
  if (direct) {
    if (!bias) return TEQ_OK;
    CUDNN_TRY(cudnnCreateTensorDescriptor(&ds.bias));
    CUDNN_TRY(cudnnSetTensor4dDescriptor(ds.bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1,
                                         (int)cv.c, 1, 1));
    CUDNN_TRY(cudnnAddTensor(cx->cudnn, &one, ds.bias, bias, &one, ds.x, y));
    return TEQ_OK;
  }
  int64_t total = shape_numel(&ys);
  crop_bias_kernel<<<cuda_blocks(total, THREADS), THREADS, 0, cx->stream>>>(
      dx, bias, y, ys.d[0] * ys.d[1], ys.d[1], cv.h, cv.w, ys.d[2], ys.d[3], pt, pleft);
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* ---- conv3d ---- */

/* cuDNN's N-d convolution over [N, C, D, H, W]: one algorithm searched per
 * configuration and remembered, as conv2d's cuDNN ways are; the bias and
 * the residual added after it, then the fused activation. cuDNN pads both
 * ends of an axis alike, so uneven ONNX pads are refused here
 * (torchvision's video networks pad evenly). */
extern "C" int cuda_eval_conv3d(CUDA_KERNEL_SIGNATURE) {
  const Params *p = &n->params;
  const Shape &xs = in[0].shape, &ws = in[1].shape, &ys = out[0].shape;
  if (shape_numel(&ys) == 0) return TEQ_OK;
  int xd[5], wd[5], yd[5], pad[3], stride[3], dil[3];
  bool ok = true;
  for (int i = 0; i < 5; i++) {
    ok = ok && fits_int(xs.d[i]) && fits_int(ws.d[i]) && fits_int(ys.d[i]);
    xd[i] = (int)xs.d[i], wd[i] = (int)ws.d[i], yd[i] = (int)ys.d[i];
  }
  ok = ok && fits_int(shape_numel(&xs)) && fits_int(shape_numel(&ys)) &&
       fits_int(shape_numel(&ws));
  if (!ok)
    return cuda_op_error(n, d, TEQ_ERR_UNSUPPORTED, "tensors exceed cuDNN's 2^31-element limit");
  for (int a = 0; a < 3; a++) {
    if (p->v[C3_PADS].i[a] != p->v[C3_PADS].i[3 + a])
      return cuda_op_error(n, d, TEQ_ERR_UNSUPPORTED,
                           "pads differ at the two ends of axis %d: cuDNN pads both alike",
                           2 + a);
    pad[a] = (int)p->v[C3_PADS].i[a];
    stride[a] = (int)p->v[C3_STRIDE].i[a], dil[a] = (int)p->v[C3_DILATION].i[a];
  }
  auto packed = [](const int *dims, int *strides) {
    strides[4] = 1;
    for (int i = 3; i >= 0; i--) strides[i] = strides[i + 1] * dims[i + 1];
  };
  int xst[5], yst[5];
  packed(xd, xst), packed(yd, yst);
  CudnnDescs ds;
  CUDNN_TRY(cudnnCreateTensorDescriptor(&ds.x));
  CUDNN_TRY(cudnnCreateTensorDescriptor(&ds.y));
  CUDNN_TRY(cudnnCreateFilterDescriptor(&ds.w));
  CUDNN_TRY(cudnnCreateConvolutionDescriptor(&ds.conv));
  CUDNN_TRY(cudnnSetTensorNdDescriptor(ds.x, CUDNN_DATA_FLOAT, 5, xd, xst));
  CUDNN_TRY(cudnnSetTensorNdDescriptor(ds.y, CUDNN_DATA_FLOAT, 5, yd, yst));
  CUDNN_TRY(cudnnSetFilterNdDescriptor(ds.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 5, wd));
  CUDNN_TRY(cudnnSetConvolutionNdDescriptor(ds.conv, 3, pad, stride, dil,
                                            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_TRY(cudnnSetConvolutionMathType(ds.conv, CUDNN_FMA_MATH));
  CUDNN_TRY(cudnnSetConvolutionGroupCount(ds.conv, (int)param_int(p, C3_GROUPS)));
  int got_dims[5];
  CUDNN_TRY(cudnnGetConvolutionNdForwardOutputDim(ds.conv, ds.x, ds.w, 5, got_dims));
  for (int i = 0; i < 5; i++)
    if (got_dims[i] != yd[i])
      return cuda_op_error(n, d, TEQ_ERR_INTERNAL, "cuDNN derives output extent %d on axis %d, "
                           "expected %d", got_dims[i], i, yd[i]);
  const float *x = (const float *)in[0].data, *w = (const float *)in[1].data;
  float *y = (float *)out[0].data;
  uint64_t key = hash_mix(0x636f6e3364u /* "conv3d" */, 0);
  for (int i = 0; i < 5; i++)
    key = hash_mix(hash_mix(hash_mix(key, (uint64_t)xd[i]), (uint64_t)wd[i]), (uint64_t)yd[i]);
  for (int a = 0; a < 3; a++)
    key = hash_mix(hash_mix(hash_mix(key, (uint64_t)pad[a]), (uint64_t)stride[a]),
                   (uint64_t)dil[a]);
  key = hash_mix(hash_mix(hash_mix(key, (uint64_t)param_int(p, C3_GROUPS)),
                          (uint64_t)cuda_alignment_of(x)),
                 (uint64_t)cuda_alignment_of(y));
  int64_t memo[2];
  char *scratch;
  int rc;
  if (!cuda_memo_get(cx, key, memo)) {
    if (cx->capturing)
      return cuda_op_error(n, d, TEQ_ERR_INTERNAL,
                           "no convolution algorithm remembered for this configuration while "
                           "capturing (the first run should have searched)");
    size_t ws_cap = fwd_search_workspace(cx, ds);
    if ((rc = scratch_of(cx, ws_cap, &scratch, d))) return rc;
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0;
    CUDNN_TRY(cudnnFindConvolutionForwardAlgorithmEx(cx->cudnn, ds.x, x, ds.w, w, ds.conv, ds.y,
                                                     y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got,
                                                     perf, scratch, ws_cap));
    int i = 0;
    while (i < got && !(perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= ws_cap &&
                        exact_enough_fwd(perf[i].algo)))
      i++;
    if (i == got)
      return cuda_op_error(n, d, TEQ_ERR_UNSUPPORTED,
                           "cuDNN has no forward algorithm for this configuration within %zu MB "
                           "of workspace", CONV_WORKSPACE_CAP >> 20);
    memo[0] = (int64_t)perf[i].algo, memo[1] = (int64_t)perf[i].memory;
    cuda_memo_put(cx, key, memo);
  }
  cudnnConvolutionFwdAlgo_t algo = (cudnnConvolutionFwdAlgo_t)memo[0];
  size_t ws_bytes = (size_t)memo[1];
  if ((rc = scratch_of(cx, ws_bytes, &scratch, d))) return rc;
  cuda_note(cx, "cudnn:%s", fwd_algo_name(algo));
  const float one = 1.0f, zero = 0.0f;
  CUDNN_TRY(cudnnConvolutionForward(cx->cudnn, &one, ds.x, x, ds.w, w, ds.conv, algo,
                                    ws_bytes ? scratch : nullptr, ws_bytes, &zero, ds.y, y));
  if (n->n_in > 2) {
    int bd[5] = {1, yd[1], 1, 1, 1}, bst[5];
    packed(bd, bst);
    CUDNN_TRY(cudnnCreateTensorDescriptor(&ds.bias));
    CUDNN_TRY(cudnnSetTensorNdDescriptor(ds.bias, CUDNN_DATA_FLOAT, 5, bd, bst));
    CUDNN_TRY(cudnnAddTensor(cx->cudnn, &one, ds.bias, in[2].data, &one, ds.y, y));
  }
  if (n->n_in > 3) /* the residual, of the output's shape */
    CUDNN_TRY(cudnnAddTensor(cx->cudnn, &one, ds.y, in[3].data, &one, ds.y, y));
  return cuda_act_apply(cx, (int)param_int(p, C3_ACT), y, shape_numel(&ys), d);
}

/* ---- enlarge ---- */

/* y [planes, kh, kw] = x [planes, h, w] placed at (top, left), zero around.
 * T is an element of the right size (the CPU row copies bytes). */
template <typename T>
__global__ void enlarge_kernel(const T *__restrict__ x, T *__restrict__ y, int64_t planes,
                               int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t top,
                               int64_t left) {
  int64_t total = planes * kh * kw;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t j = i % kw, r = (i / kw) % kh, plane = i / (kw * kh);
    int64_t sr = r - top, sj = j - left;
    y[i] = sr >= 0 && sr < h && sj >= 0 && sj < w ? x[(plane * h + sr) * w + sj] : T(0);
  }
}

extern "C" int cuda_eval_enlarge(CUDA_KERNEL_SIGNATURE) {
  const Shape &s = in[0].shape;
  int64_t total = shape_numel(&out[0].shape);
  if (total == 0) return TEQ_OK;
  if (s.ndim != 4) return cuda_op_error(n, d, TEQ_ERR_INTERNAL, "expected a 4-D kernel");
  int64_t h = s.d[2], w = s.d[3];
  int64_t kh = param_int(&n->params, ENLARGE_KH), kw = param_int(&n->params, ENLARGE_KW);
  int64_t top = (kh - h) / 2, left = (kw - w) / 2, planes = s.d[0] * s.d[1];
  unsigned blocks = cuda_blocks(total, THREADS);
  if (dtype_size(in[0].dtype) == 8)
    enlarge_kernel<int64_t><<<blocks, THREADS, 0, cx->stream>>>(
        (const int64_t *)in[0].data, (int64_t *)out[0].data, planes, h, w, kh, kw, top, left);
  else
    enlarge_kernel<float><<<blocks, THREADS, 0, cx->stream>>>(
        (const float *)in[0].data, (float *)out[0].data, planes, h, w, kh, kw, top, left);
  CUDA_LAUNCHED();
  return TEQ_OK;
}

/* ---- batchnorm (inference) ---- */

/* Per channel y = x * a + b with a = scale / sqrt(var + eps) computed in
 * double and rounded once, b = bias - mean * a: the CPU row's arithmetic. */
__global__ void batchnorm_coeffs_kernel(const float *__restrict__ scale,
                                        const float *__restrict__ bias,
                                        const float *__restrict__ mean,
                                        const float *__restrict__ var, double eps, int64_t c,
                                        float *__restrict__ ab) {
  for (int64_t ch = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; ch < c;
       ch += (int64_t)gridDim.x * blockDim.x) {
    float a = (float)((double)scale[ch] / sqrt((double)var[ch] + eps));
    ab[ch] = a;
    ab[c + ch] = bias[ch] - mean[ch] * a;
  }
}

/* On cuda_plane_grid: the channel is known per block. */
__global__ void batchnorm_apply_kernel(const float *__restrict__ x, const float *__restrict__ ab,
                                       float *__restrict__ y, int64_t planes, int64_t c,
                                       int64_t inner, UnaryArgs act) {
  for (int64_t plane = blockIdx.y; plane < planes; plane += gridDim.y) {
    float a = ab[plane % c], b = ab[c + plane % c];
    const float *xp = x + plane * inner;
    float *yp = y + plane * inner;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < inner;
         i += (int64_t)gridDim.x * blockDim.x) {
      float v = xp[i] * a + b;
      yp[i] = act_eval(act, v);
    }
  }
}

extern "C" int cuda_eval_batchnorm(CUDA_KERNEL_SIGNATURE) {
  const Shape &s = in[0].shape;
  if (shape_numel(&s) == 0) return TEQ_OK;
  if (s.ndim < 2) return cuda_op_error(n, d, TEQ_ERR_INTERNAL, "expected input X [N, C, ...]");
  int64_t c = s.d[1], inner = 1;
  for (int i = 2; i < s.ndim; i++) inner *= s.d[i];
  int64_t planes = s.d[0] * c;
  float *ab = (float *)cuda_scratch(cx, (size_t)(2 * c) * sizeof(float), d);
  if (!ab) return TEQ_ERR_NOMEM;
  batchnorm_coeffs_kernel<<<cuda_blocks(c, THREADS), THREADS, 0, cx->stream>>>(
      (const float *)in[1].data, (const float *)in[2].data, (const float *)in[3].data,
      (const float *)in[4].data, param_float(&n->params, BATCHNORM_EPSILON), c, ab);
  CUDA_LAUNCHED();
  /* The fused activation in the same pass. */
  const int act = (int)param_int(&n->params, BATCHNORM_ACT);
  dim3 grid = cuda_plane_grid(planes, inner, THREADS);
  batchnorm_apply_kernel<<<grid, THREADS, 0, cx->stream>>>(
      (const float *)in[0].data, ab, (float *)out[0].data, planes, c, inner, fused_act_args(act));
  CUDA_LAUNCHED();
  return TEQ_OK;
}
