/* family.h: shared by the operator family files in runtime/ops/, their GPU
 * kernels in runtime/cuda/ and the registry table (runtime/ops.c) only;
 * nothing outside runtime/ includes it.
 * Declares every row, and the few helpers several families use. */
#ifndef TEQ_RUNTIME_OPS_FAMILY_H
#define TEQ_RUNTIME_OPS_FAMILY_H

#include <float.h>
#include <math.h>

#include "runtime/graph.h"
#include "runtime/onnx.h"
#include "runtime/ops.h"

#define OP(KIND, name) extern const OpDef op_def_##name;
#include "runtime/ops.def"
#undef OP

/* A row's GPU kernel: cuda_eval_<name>, defined in runtime/cuda/<family>.cu,
 * or NULL where the build has no CUDA. */
#ifdef TEQ_HAVE_CUDA
#define OP(KIND, name)                                                              \
  int cuda_eval_##name(const Node *n, struct CudaCtx *cx, const struct CudaTensor *in, \
                       const struct CudaTensor *out, Diag *d);
#include "runtime/ops.def"
#undef OP
#define CUDA_EVAL(name) cuda_eval_##name
#else
#define CUDA_EVAL(name) NULL
#endif

/* Shape inference: every output has input 0's shape. */
int infer_like_input0(const Node *n, const Shape *in, Shape *out, Diag *d);

/* Reports a shape-inference error about parameter or input `what` of n:
 * "conv2d: groups=3: input channels 64 not divisible by groups". A macro so
 * that with no Diag (gen-rules and verify-rules probe shapes millions of
 * times) neither the message nor its arguments, often shape_format calls,
 * are computed. */
int op_error_report(const Node *n, Diag *d, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define op_error(n, d, ...) ((d) ? op_error_report((n), (d), __VA_ARGS__) : TEQ_ERR_INPUT)

/* The largest spatial extent, stride, pad or dilation a 2-D window operator
 * accepts: far beyond any real model, small enough that products of two
 * stay far from overflow. */
#define SPATIAL_MAX (INT64_C(1) << 16)

/* OpParam rows of a window over `axes` spatial axes (conv, conv_transpose,
 * pools: 2; conv3d, the 3-D pools: 3), one meaning and one ONNX attribute
 * each; used as `[IDX] = WINDOW_PARAM_STRIDE`, the 2-D form. */
#define WINDOW_PARAM_KERNEL_OF(axes)                                                  \
  {.name = "kernel", .type = PARAM_INTS, .len = (axes), .def = 1, .lo = 1,             \
   .hi = SPATIAL_MAX, .onnx_attr = "kernel_shape"}
#define WINDOW_PARAM_STRIDE_OF(axes)                                                  \
  {.name = "stride", .type = PARAM_INTS, .len = (axes), .def = 1, .lo = 1,             \
   .hi = SPATIAL_MAX, .onnx_attr = "strides"}
#define WINDOW_PARAM_PADS_OF(axes)                                                    \
  {.name = "pads", .type = PARAM_INTS, .len = 2 * (axes), .def = 0, .lo = 0,           \
   .hi = SPATIAL_MAX, .onnx_attr = "pads"}
#define WINDOW_PARAM_DILATION_OF(axes)                                                \
  {.name = "dilation", .type = PARAM_INTS, .len = (axes), .def = 1, .lo = 1,           \
   .hi = SPATIAL_MAX, .onnx_attr = "dilations"}
#define WINDOW_PARAM_KERNEL WINDOW_PARAM_KERNEL_OF(2)
#define WINDOW_PARAM_STRIDE WINDOW_PARAM_STRIDE_OF(2)
#define WINDOW_PARAM_PADS WINDOW_PARAM_PADS_OF(2)
#define WINDOW_PARAM_DILATION WINDOW_PARAM_DILATION_OF(2)
/* groups; slices: each group convolves its own slice of the input channels
 * (conv; not conv_transpose, whose weight is laid out by input channel). */
#define WINDOW_PARAM_GROUPS(slices)                                               \
  {.name = "groups", .type = PARAM_INT, .def = 1, .lo = 1, .hi = INT64_C(1) << 24,       \
   .onnx_attr = "group", .counts_parts = true, .parts_slice_input = (slices)}

/* The activation fused into a conv or matmul (act_symbols). */
#define PARAM_FUSED_ACT                                                                  \
  {.name = "act", .type = PARAM_INT, .def = ACT_NONE, .lo = ACT_NONE, .hi = ACT__COUNT - 1,     \
   .symbols = act_symbols, .adds_work = true}
/* The same, added to a row after its cost tables were measured (gemm's):
 * left out of a configuration's key where it is none. */
#define PARAM_FUSED_ACT_QUIET                                                            \
  {.name = "act", .type = PARAM_INT, .def = ACT_NONE, .lo = ACT_NONE, .hi = ACT__COUNT - 1,     \
   .symbols = act_symbols, .adds_work = true, .quiet_default = true}

/* ONNX auto_pad of a window over `axes` spatial axes (conv, pools: 2 or
 * 3) as explicit pads, ONNX-ordered (every axis's begin, then every
 * axis's end); x is the input shape (NULL if unknown), k the kernel, s the
 * strides, dl the dilations, `axes` values each. Leaves pads as they are
 * for NOTSET or no attribute. SAME_* pads so that the output is ceil(in /
 * stride); an odd total puts the extra one at the end (UPPER) or the
 * beginning (LOWER). In conv.c. */
int onnx_auto_pads(OnnxNodeIn *v, const Shape *x, int axes, const int64_t *k, const int64_t *s,
                   const int64_t *dl, int64_t *pads, Diag *d);

/* ONNX window attributes over `spatial` axes (1 or 2; others refused) as
 * those of a 2-D window: kernel_shape (has_k: given), strides, dilations
 * and explicit pads, each of the length the axes need or refused. A 1-D
 * window over [N, C, L] is the 2-D one over [N, C, 1, L]: a unit first
 * extent, stride and dilation, and no padding on that axis. In conv.c. */
typedef struct OnnxWindow {
  int64_t k[2], s[2], dl[2], pads[4]; /* pads [top, left, bottom, right] */
  bool has_k;
} OnnxWindow;
int onnx_window_read(OnnxNodeIn *v, int spatial, OnnxWindow *w, Diag *d);
/* A rank-3 shape [N, C, L] as [N, C, 1, L]; any other as it is (NULL: an
 * unknown rank). In conv.c. */
Shape onnx_window_raised(const Shape *s);

/* ONNX Einsum of two operands as the product between layout changes it
 * is (onnx_in_as_arranged_input); matmul's row reads it. In einsum.c. */
int einsum_onnx_read(OnnxNodeIn *v, Params *p, Diag *d);

/* A window row's take_zero_pad (conv2d, avgpool): zeros around the two
 * spatial axes of a rank-4 input added to parameter pads_i of *p ([top,
 * left, bottom, right]). False where they touch the batch or channel axes
 * or would pass SPATIAL_MAX. In conv.c. */
bool window_take_zero_pad(int rank, const int64_t *pads, Params *p, int pads_i);

/* C = A B in Z_p, exact: A[i][t] at a[i*ra + t*ca], B[t][j] at b[t*rb + j*cb]
 * (strides make transposed operands free), C[i][j] at c[i*ldc + j], for
 * i < m, j < n, t < k (matmul.c). */
void modp_gemm(int64_t m, int64_t n, int64_t k, const uint32_t *a, int64_t ra, int64_t ca,
               const uint32_t *b, int64_t rb, int64_t cb, uint32_t *c, int64_t ldc);

/* A Z_p loop compiled for each vector width the machine may have (the
 * loader picks one): with AVX-512 eight 64-bit sums go at once, with the
 * baseline SSE2 two. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MODP_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MODP_VECTOR_CLONES /* one build, for the baseline of the target */
#endif

/* A float loop compiled for AVX-512, for AVX2 with FMA and for the
 * baseline (the loader picks one): where each element costs a polynomial,
 * as sigmoid's e^x does, the wide copies run it 4 and 7 times faster than
 * SSE2. FMA may round the last bit differently from the baseline copy. */
#if defined(__GNUC__) && __GNUC__ >= 12 && !defined(__clang__) && defined(__x86_64__)
#define FLOAT_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FLOAT_VECTOR_CLONES
#endif

/* Row-major C = alpha op(A) op(B) + beta C through the BLAS, in the calling
 * thread when it is small (blas.c). Extents must fit int (callers check). */
void blas_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* Parameter indices: each row's params in order, for its CPU kernels and
 * its GPU kernel (runtime/cuda/) alike, so both read the same slots. */
enum { CONV_STRIDE, CONV_PADS, CONV_DILATION, CONV_GROUPS, CONV_ACT, CONV_POOL }; /* conv2d */
enum { C3_STRIDE, C3_PADS, C3_DILATION, C3_GROUPS, C3_ACT };               /* conv3d */
enum { CT_STRIDE, CT_PADS, CT_DILATION, CT_GROUPS, CT_OUTPAD };            /* conv_transpose */
enum { ENLARGE_KH, ENLARGE_KW };                                           /* enlarge */
enum { BATCHNORM_EPSILON, BATCHNORM_ACT };                                 /* batchnorm */
enum { MATMUL_ACT };                                                       /* matmul */
enum { GEMM_TRANS_A, GEMM_TRANS_B, GEMM_ALPHA, GEMM_BETA, GEMM_ACT };      /* gemm */
enum { PAD_PADS, PAD_VALUE, PAD_MODE };                                    /* pad */
enum { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE };                              /* its modes */
enum { LN_AXIS, LN_EPSILON };                                              /* layer_norm */
enum { IN_EPSILON };                                                       /* instance_norm */
enum { LRN_SIZE, LRN_ALPHA, LRN_BETA, LRN_BIAS };                          /* lrn */
/* maxpool uses all five; avgpool has count_include_pad where maxpool has
 * dilation. */
enum { POOL_KERNEL, POOL_STRIDE, POOL_PADS, POOL_DILATION, POOL_CEIL };
enum { AVG_COUNT_PAD = POOL_DILATION };
/* The rows both pools over `axes` spatial axes share, and avgpool's own. */
#define POOL_WINDOW_PARAMS_OF(axes)                                                        \
  [POOL_KERNEL] = WINDOW_PARAM_KERNEL_OF(axes),                                            \
  [POOL_STRIDE] = WINDOW_PARAM_STRIDE_OF(axes),                                            \
  [POOL_PADS] = WINDOW_PARAM_PADS_OF(axes),                                                \
  [POOL_CEIL] = {.name = "ceil_mode", .type = PARAM_INT, .def = 0, .lo = 0, .hi = 1,       \
                 .onnx_attr = "ceil_mode"}
#define AVG_PARAM_COUNT_PAD                                                                \
  {.name = "count_include_pad", .type = PARAM_INT, .def = 0, .lo = 0, .hi = 1,             \
   .onnx_attr = "count_include_pad"}
enum { RED_AXES, RED_KEEPDIMS };                                           /* reduce_* */
enum { SOFTMAX_AXIS };                                                     /* softmax, log_softmax */
enum { ARG_AXIS, ARG_KEEPDIMS, ARG_LAST };                                 /* argmax, argmin */
enum { RS_MODE, RS_COORD, RS_NEAREST, RS_SIZES, RS_SCALE_H, RS_SCALE_W };  /* resize */
enum { MODE_NEAREST, MODE_LINEAR };                                        /* its modes */
enum { COORD_HALF_PIXEL, COORD_ASYMMETRIC, COORD_ALIGN_CORNERS, COORD_PYTORCH_HALF_PIXEL };
enum { NEAREST_ROUND_PREFER_FLOOR, NEAREST_ROUND_PREFER_CEIL, NEAREST_FLOOR, NEAREST_CEIL };
enum { GS_MODE, GS_PADDING, GS_ALIGN };                                    /* grid_sample */
enum { GS_BILINEAR, GS_NEAREST };                                          /* its modes */
enum { GS_PAD_ZEROS, GS_PAD_BORDER, GS_PAD_REFLECTION };                   /* its paddings */

/* Plans that the CPU kernels and the GPU kernels of runtime/cuda/ share:
 * host-side arithmetic on shapes, written once. */

/* Two inputs broadcast numpy-style into output o, as nd collapsed
 * dimensions; sa and sb are each input's element strides, 0 along
 * broadcast dimensions, and the innermost are 0 or 1. In elementwise.c. */
typedef struct BcastPlan {
  int nd;
  int64_t dim[TEQ_MAX_DIMS];
  int64_t sa[TEQ_MAX_DIMS], sb[TEQ_MAX_DIMS];
} BcastPlan;
void bcast_plan(const Shape *a, const Shape *b, const Shape *o, BcastPlan *pl);
/* Element stride of output dimension i (of rank r) in input s, 0 if s
 * broadcasts along it. */
int64_t bcast_stride(const Shape *s, int r, int i);

/* How a (possibly batched, possibly 1-D) MatMul maps onto plain products.
 * In matmul.c. */
typedef struct MatmulPlan {
  int64_t m, k, n;
  int nb;                     /* broadcast batch dimensions */
  int64_t bd[TEQ_MAX_DIMS];   /* their extents */
  int64_t sa[TEQ_MAX_DIMS];   /* element stride of A per batch dim; 0 where broadcast */
  int64_t sb[TEQ_MAX_DIMS];
  int64_t count;              /* product of bd */
  bool flat_a;                /* B is shared by every batch entry and A is not broadcast */
} MatmulPlan;
/* Fills p from the input shapes; TEQ_ERR_INPUT (message in d) if they do
 * not multiply. */
int matmul_plan(const Node *n, const Shape *a, const Shape *b, MatmulPlan *p, Diag *d);
/* Offsets of A and B for the batch entry whose flattened index is t. */
void matmul_batch_offsets(const MatmulPlan *p, int64_t t, int64_t *oa, int64_t *ob);
/* The batch dims [*from, nb) over which A and B step uniformly, sa and sb
 * their element strides per batch dim (0 where broadcast): one strided
 * batched product covers them, A stepping *step_a and B *step_b, once per
 * entry of the dims before. */
void matmul_uniform_suffix(const MatmulPlan *p, const int64_t *sa, const int64_t *sb, int *from,
                           int64_t *step_a, int64_t *step_b);
/* One operand of a product as cuBLAS reads it: its matrix stored
 * transposed (t: the rows along the unit stride) or not, with leading
 * dimension ld, and its element stride per batch dim of the plan (0
 * where broadcast). */
typedef struct MatmulOperand {
  bool t;
  int64_t ld;
  int64_t s[TEQ_MAX_DIMS];
} MatmulOperand;
/* Operand j (0: A, 1: B) of shape sh under plan p, laid out with element
 * strides st (NULL: dense; then p's strides): false where neither of its
 * matrix's axes has a unit stride, or the other's stride is too short. */
bool matmul_operand(const MatmulPlan *p, const Shape *sh, const int64_t *st, int j,
                    MatmulOperand *o);
/* The output [batch..., m, n] as cuBLAS writes it, laid out with element
 * strides st (NULL: dense): ld, and its stride per batch dim, which must
 * step uniformly over the dims [from, nb) one strided batched call covers
 * (from nb: no such dims, a call over arrays of pointers); false where its
 * columns are not next to each other or it does not step so. */
bool matmul_output(const MatmulPlan *p, const int64_t *st, int from, MatmulOperand *o);
/* A tall product's output (p's flat_a: A's entries stacked into count m
 * rows) laid out with element strides st as one matrix: by rows, *ld its
 * row stride (>= n), or by columns (*transposed), *ld its column stride
 * (>= count m); false where it is neither. */
bool matmul_tall_output(const MatmulPlan *p, const int64_t *st, int64_t *ld, bool *transposed);

/* A unary element-wise row's kernels (elementwise.c) for an operator of
 * that kind with parameters p, float32 and Z_p; xs may be ys. Fused
 * activations run them, so that a fused silu or clip computes what the
 * operator does and fingerprints alike. */
void unary_apply_f32(OpKind kind, const Params *p, const float *xs, float *ys, int64_t n);
void unary_apply_modp(OpKind kind, const Params *p, const uint32_t *xs, uint32_t *ys, int64_t n);
/* Apply a fused activation (ACT_*) in place, float32 and Z_p. */
void act_apply_f32(int act, float *x, int64_t n);
void act_apply_modp(int act, uint32_t *x, int64_t n);
/* A float32 scalar (shape []) holding v, for a row writing its ONNX form
 * out in several operators; NULL when memory runs out. */
Tensor *op_scalar_f32(float v);

/* ---- arithmetic a row shares with its GPU kernel ----
 * Written once: the CPU row calls it, and so does its kernel in
 * runtime/cuda/, where nvcc compiles it for the device too. Products go
 * through op_mul_rn, so that nvcc does not fuse one into an fma the CPU
 * does not do (the host's compiler, without -mfma, does not): the two
 * agree to the bit. */
#ifdef __CUDACC__
#define OP_SHARED static inline __host__ __device__
#else
#define OP_SHARED static inline
#endif

OP_SHARED float op_mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/* Kernel taps [lo, hi) of a window starting at `start` (may be negative)
 * with k taps `dl` apart that fall inside [0, in): convolutions and pools
 * loop over these instead of testing every tap. */
OP_SHARED void tap_range(int64_t start, int64_t k, int64_t dl, int64_t in, int64_t *lo,
                         int64_t *hi) {
  *lo = start >= 0 ? 0 : (-start + dl - 1) / dl;
  *hi = in - start <= 0 ? 0 : (in - start + dl - 1) / dl;
  if (*hi > k) *hi = k;
  if (*lo > *hi) *lo = *hi;
}

/* A 3-D pool's geometry (pool3d.c): planes [N x C] of in[3], windows of
 * k[3] taps dl[3] apart at stride s[3] from -p0[3], pads p1[3] at the
 * end, out[3] outputs per axis. */
typedef struct Pool3Geom {
  int64_t planes, in[3], out[3];
  int64_t k[3], s[3], dl[3], p0[3], p1[3];
  bool is_max, include_pad;
} Pool3Geom;

/* n's geometry at input shape x, or an error naming what is wrong. */
int pool3_geom(const Node *n, const Shape *x, Pool3Geom *g, Diag *d);

/* Output position o of one plane: per axis the taps [lo, hi) inside the
 * input and where the window starts (at); returns an average's divisor,
 * the window clipped to the input or with include_pad to the padding. */
OP_SHARED int64_t pool3_window(const Pool3Geom *g, const int64_t *o, int64_t *at, int64_t *lo,
                               int64_t *hi) {
  int64_t inside = 1, padded = 1;
  for (int a = 0; a < 3; a++) {
    at[a] = o[a] * g->s[a] - g->p0[a];
    tap_range(at[a], g->k[a], g->dl[a], g->in[a], &lo[a], &hi[a]);
    int64_t end = at[a] + g->k[a], limit = g->in[a] + g->p1[a];
    inside *= hi[a] - lo[a];
    padded *= (end < limit ? end : limit) - at[a];
  }
  return g->include_pad ? padded : inside;
}

/* The float32 max or average at output position o of plane xp: its taps
 * depth, then row, then column first, summed as they come; an empty
 * window (only with dilation) gives the lowest float for a max, 0 for an
 * average. */
OP_SHARED float pool3_at_f32(const Pool3Geom *g, const float *xp, const int64_t *o) {
  int64_t at[3], lo[3], hi[3], count = pool3_window(g, o, at, lo, hi);
  bool empty = lo[0] == hi[0] || lo[1] == hi[1] || lo[2] == hi[2];
  float acc = g->is_max ? -FLT_MAX : 0.0f;
  for (int64_t i = lo[0]; i < hi[0] && !empty; i++)
    for (int64_t j = lo[1]; j < hi[1]; j++) {
      const float *row =
          xp + ((at[0] + i * g->dl[0]) * g->in[1] + at[1] + j * g->dl[1]) * g->in[2] + at[2];
      for (int64_t t = lo[2]; t < hi[2]; t++) {
        float v = row[t * g->dl[2]];
        acc = g->is_max ? (v > acc ? v : acc) : acc + v;
      }
    }
  if (!g->is_max) acc = empty || !count ? 0.0f : acc / (float)count;
  return acc;
}

/* grid_sample (sample.c): grid value gv on an axis of `size` pixels as a
 * position in pixels, padding applied. Reflection reflects about [lo2 /
 * 2, hi2 / 2] (twice the bounds, so that half pixels stay whole), as
 * PyTorch's reflect_coordinates does. */
OP_SHARED float gs_reflect(float v, float lo2, float hi2) {
  if (lo2 == hi2) return 0.0f;
  float lo = lo2 / 2, span = (hi2 - lo2) / 2;
  v = fabsf(v - lo);
  float extra = fmodf(v, span), flips = floorf(v / span);
  return fmodf(flips, 2.0f) == 0.0f ? extra + lo : span - extra + lo;
}

OP_SHARED float gs_source(float gv, int64_t size, bool align, int padding) {
  float v = align ? op_mul_rn((gv + 1) / 2, (float)(size - 1))
                  : (op_mul_rn(gv + 1, (float)size) - 1) / 2;
  if (padding == GS_PAD_BORDER) {
    v = fminf(fmaxf(v, 0.0f), (float)(size - 1));
  } else if (padding == GS_PAD_REFLECTION) {
    v = align ? gs_reflect(v, 0.0f, 2.0f * (float)(size - 1))
              : gs_reflect(v, -1.0f, 2.0f * (float)size - 1.0f);
    v = fminf(fmaxf(v, 0.0f), (float)(size - 1));
  }
  return v;
}

/* The pixel at whole position (y, x) of an h x w plane, 0 outside it
 * (compared as floats: a far or NaN position is never cast). */
OP_SHARED float gs_tap(const float *plane, int64_t h, int64_t w, float y, float x) {
  if (!(y >= 0 && y < (float)h && x >= 0 && x < (float)w)) return 0.0f;
  return plane[(int64_t)y * w + (int64_t)x];
}

/* The sample of plane (h x w) at grid point (gx, gy): nearest rounds half
 * to even, bilinear mixes the four pixels around the position. */
OP_SHARED float gs_sample(const float *plane, int64_t h, int64_t w, float gx, float gy, int mode,
                          int padding, bool align) {
  float sx = gs_source(gx, w, align, padding), sy = gs_source(gy, h, align, padding);
  if (mode == GS_NEAREST) return gs_tap(plane, h, w, nearbyintf(sy), nearbyintf(sx));
  float x0 = floorf(sx), y0 = floorf(sy), fx = sx - x0, fy = sy - y0;
  float top = op_mul_rn(1 - fx, gs_tap(plane, h, w, y0, x0)) +
              op_mul_rn(fx, gs_tap(plane, h, w, y0, x0 + 1));
  float bottom = op_mul_rn(1 - fx, gs_tap(plane, h, w, y0 + 1, x0)) +
                 op_mul_rn(fx, gs_tap(plane, h, w, y0 + 1, x0 + 1));
  return op_mul_rn(1 - fy, top) + op_mul_rn(fy, bottom);
}

#endif
