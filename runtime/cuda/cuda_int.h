/* cuda_int.h: what the CUDA kernels of runtime/cuda/ share; included by .cu
 * files only (nothing outside runtime/cuda/ sees it).
 *
 * A kernel is the registry row's eval_cuda: the eval_f32 contract with its
 * tensors in device memory. It launches its work on cx->stream and returns
 * without waiting. It must write every output element (plans poison the
 * arena with NaN in their first run, so a kernel that skips some fails the
 * tests), must not allocate device memory itself (cuda_scratch gives it
 * memory) and must not synchronize: runs after the first are captured into
 * a CUDA graph, where allocation and synchronization are errors. Work that
 * must happen once per configuration (a cuDNN algorithm search) happens
 * when cx->capturing is false and is remembered with cuda_memo_*.
 *
 * Every CUDA, cuBLAS and cuDNN call is checked through the TRY macros,
 * which report the call, the file and line, and the library's message into
 * the Diag and return from the kernel. */
#ifndef TEQ_RUNTIME_CUDA_INT_H
#define TEQ_RUNTIME_CUDA_INT_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdint.h>

/* cuBLAS and cuBLASLt are loaded when the first device opens
 * (cuda_libraries_load), not when a program starts: linked directly, their
 * initialisers cost every Teq process, GPU or none, 0.4 s and 200 MB
 * before main. Each function Teq calls is listed here once; call sites
 * keep the libraries' own names, which the macros below send through the
 * table the loader fills. decltype takes the type from the library's own
 * declaration, so a wrong entry does not compile. */
#define TEQ_CUBLAS_FUNCTIONS(X)                                                    \
  X(cublasCreate_v2) X(cublasDestroy_v2) X(cublasSetStream_v2) X(cublasSetMathMode) \
  X(cublasSetWorkspace_v2) X(cublasSgemm_v2) X(cublasSgemmStridedBatched)           \
  X(cublasSgemmBatched) X(cublasGetStatusString)
#define TEQ_CUBLASLT_FUNCTIONS(X)                                                  \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmul) X(cublasLtMatmulDescCreate) \
  X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)                     \
  X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)               \
  X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic)          \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)
enum CudaLibraryFunction {
#define TEQ_FUNCTION_INDEX(f) CUDA_FN_##f,
  TEQ_CUBLAS_FUNCTIONS(TEQ_FUNCTION_INDEX) TEQ_CUBLASLT_FUNCTIONS(TEQ_FUNCTION_INDEX)
#undef TEQ_FUNCTION_INDEX
  CUDA_FN__COUNT
};
extern void *cuda_library_fn[CUDA_FN__COUNT];
/* Inside its own expansion a macro's name is not expanded again, so f
 * below is the library's declaration. */
#define TEQ_LOADED(f) (*reinterpret_cast<decltype(f) *>(cuda_library_fn[CUDA_FN_##f]))
#define cublasCreate_v2 TEQ_LOADED(cublasCreate_v2)
#define cublasDestroy_v2 TEQ_LOADED(cublasDestroy_v2)
#define cublasSetStream_v2 TEQ_LOADED(cublasSetStream_v2)
#define cublasSetMathMode TEQ_LOADED(cublasSetMathMode)
#define cublasSetWorkspace_v2 TEQ_LOADED(cublasSetWorkspace_v2)
#define cublasSgemm_v2 TEQ_LOADED(cublasSgemm_v2)
#define cublasSgemmStridedBatched TEQ_LOADED(cublasSgemmStridedBatched)
#define cublasSgemmBatched TEQ_LOADED(cublasSgemmBatched)
#define cublasGetStatusString TEQ_LOADED(cublasGetStatusString)
#define cublasLtCreate TEQ_LOADED(cublasLtCreate)
#define cublasLtDestroy TEQ_LOADED(cublasLtDestroy)
#define cublasLtMatmul TEQ_LOADED(cublasLtMatmul)
#define cublasLtMatmulDescCreate TEQ_LOADED(cublasLtMatmulDescCreate)
#define cublasLtMatmulDescDestroy TEQ_LOADED(cublasLtMatmulDescDestroy)
#define cublasLtMatmulDescSetAttribute TEQ_LOADED(cublasLtMatmulDescSetAttribute)
#define cublasLtMatmulPreferenceCreate TEQ_LOADED(cublasLtMatmulPreferenceCreate)
#define cublasLtMatmulPreferenceDestroy TEQ_LOADED(cublasLtMatmulPreferenceDestroy)
#define cublasLtMatmulPreferenceSetAttribute TEQ_LOADED(cublasLtMatmulPreferenceSetAttribute)
#define cublasLtMatmulAlgoGetHeuristic TEQ_LOADED(cublasLtMatmulAlgoGetHeuristic)
#define cublasLtMatrixLayoutCreate TEQ_LOADED(cublasLtMatrixLayoutCreate)
#define cublasLtMatrixLayoutDestroy TEQ_LOADED(cublasLtMatrixLayoutDestroy)

extern "C" {
#include "runtime/cuda.h"
#include "runtime/graph.h"
#include "runtime/ops.h"
#include "runtime/ops/family.h" /* the rows' plans the CPU kernels use too */
}

/* A value in device memory: float for DT_F32, int64_t for DT_I64,
 * contiguous and row-major like Tensor. */
struct CudaTensor {
  void *data;
  Shape shape;
  DType dtype;
  /* NULL: dense. Else the element strides (one per axis) of a value its
   * reader reads by strides (graph_strided), data its element 0: only a
   * row whose reads_strided hook takes it is given one. */
  const int64_t *strides = nullptr;
};

struct CudaCtx {
  cudaStream_t stream;
  cublasHandle_t cublas;
  cublasLtHandle_t cublaslt; /* products with an epilogue (matmul's fused relu) */
  void *lt_workspace;        /* the device's cuBLAS workspace, lent to cuBLASLt */
  size_t lt_workspace_bytes;
  cudnnHandle_t cudnn;
  CudaDevice *dev;
  struct CudaPlan *plan;
  bool capturing; /* inside stream capture: no allocation, no sync, no search */
  char note[96];  /* what the running kernel chose, for the profiler */
};

/* Scratch device memory of at least `bytes`, valid until the kernel's work
 * on the stream is done (the next kernel may reuse it). NULL with a message
 * if it cannot grow (while capturing it never grows: the first run sized
 * it). */
void *cuda_scratch(CudaCtx *cx, size_t bytes, Diag *d);

/* ---- what a kernel derives once from a plan's constants ----
 * A plan's constants (the model's weights) are uploaded once and never
 * written while it lives, so a way may derive something from one once
 * (Winograd's transformed filters) and keep it with the plan.
 * cuda_derived answers a buffer of `bytes` for (of, tag, bytes), `of` a
 * pointer cuda_is_constant holds; *fresh says it was just allocated and
 * the caller fills it now. NULL, nothing kept, while capturing where none
 * is kept yet or where the device has no memory left for it: the caller
 * derives into scratch, as for an input that is no constant.
 * cuda_derived_drop frees one (a way timed and not chosen); only while no
 * captured graph of the plan exists, as during its first run. */
bool cuda_is_constant(CudaCtx *cx, const void *ptr);
enum { CUDA_DERIVED_WINOGRAD = 1, CUDA_KEPT_POINTERS = 2, CUDA_KEPT_ROWS = 3 };
void *cuda_derived(CudaCtx *cx, const void *of, int tag, size_t bytes, bool *fresh);
/* The same for what a kernel derives from the plan's own layout, which
 * holds while the plan lives (a product's arrays of pointers into the
 * arena, a chain's rows): `of` a pointer that names it alone (its node in
 * the plan's graph: an arena address names every value placed there),
 * with tag. */
void *cuda_plan_kept(CudaCtx *cx, const void *of, int tag, size_t bytes, bool *fresh);
void cuda_derived_drop(CudaCtx *cx, const void *of, int tag, size_t bytes);

/* Remembered values per device, keyed by a hash of a configuration (a
 * cuDNN algorithm and its workspace size, say). */
bool cuda_memo_get(CudaCtx *cx, uint64_t key, int64_t value[2]);
void cuda_memo_put(CudaCtx *cx, uint64_t key, const int64_t value[2]);

/* The device's multiprocessors: how many blocks of work fill it. */
int cuda_sm_count(CudaCtx *cx);

/* The way cuda_device_pin_way named, or NULL: choose by timing. */
const char *cuda_pinned_way(CudaCtx *cx);

/* y[i] = act(bias[(i / plane) % m] + z[i] + the sum over j < splits of
 * part[j * total + i]): the partial products of a product split along K
 * summed, with a per-channel bias and a residual (each NULL: none) and an
 * activation (a relu in the same pass). In elementwise.cu. */
int cuda_sum_partials(CudaCtx *cx, const float *part, int splits, int64_t total, const float *bias,
                      int64_t m, int64_t plane, const float *z, int act, float *y, Diag *d);
/* The same sum on the host, element by element as the kernel's threads
 * do it: the host replays of the split ways (cuda_kernel_on_host). */
void cuda_sum_partials_on_host(const float *part, int splits, int64_t total, const float *bias,
                               int64_t m, int64_t plane, const float *z, int act, float *y);

/* The kernels' arithmetic on the host, for cuda_kernel_on_host (device.cu):
 * a conv2d way's own (conv.cu), a 2-D pool's (pool.cu). */
int cuda_conv2d_on_host(const char *way, const Node *n, Tensor *const *in, Tensor *out,
                        Diag *d);
int cuda_pool_on_host(const Node *n, Tensor *const *in, Tensor *out, Diag *d);
/* gemm's plain way (matmul.cu): C broadcast into the output, the product
 * over it, the activation. */
int cuda_gemm_on_host(const char *way, const Node *n, Tensor *const *in, Tensor *out, Diag *d);

/* ---- products split along K (conv.cu, matmul.cu) ----
 * A product whose output is too small to fill the GPU may be split into s
 * slices of K, computed side by side and summed (cuda_sum_partials). */
enum { CUDA_SPLIT_MAX = 16 };

/* Whether a product of batch x rows x cols outputs over K splits s ways:
 * K divides into slices of at least 64, the whole product has fewer output
 * tiles (128 x 128, a typical float32 GEMM tile) than the device has
 * multiprocessors, the split one no more than four per multiprocessor,
 * and its partials fit 64 MB of scratch. */
bool cuda_split_applies(CudaCtx *cx, int64_t batch, int64_t rows, int64_t cols, int64_t k,
                        int s);

/* The index among names[0..n_names) (the ways a search offers) of the way
 * cuda_device_pin_way named, in *index; an error on node n listing the
 * names where none is it. */
enum { CUDA_WAY_NAME_MAX = 64 };
int cuda_pinned_index(const Node *n, const char *pin, const char (*names)[CUDA_WAY_NAME_MAX],
                      int n_names, int *index, Diag *d);

/* x[0..n) = act(x) in place for a fused activation (ACT_*); ACT_NONE does
 * nothing. In elementwise.cu. */
int cuda_act_apply(CudaCtx *cx, int act, float *x, int64_t n, Diag *d);
/* A chain of layout operators gathered (plan.h: plan_gathers): out's
 * n_rows rows of row_len floats, row i copied from where rows[i] (device
 * memory, the plan's) points, zeros where it is NULL. aligned16: every
 * row pointer is a multiple of 16 bytes. (runtime/cuda/layout.cu) */
int cuda_gather_rows(CudaCtx *cx, const float *const *rows, int64_t n_rows, int64_t row_len,
                     bool aligned16, float *out, Diag *d);

/* An error naming the node's operator, like the CPU rows' op_error:
 * "conv2d (GPU): ...". Returns rc. */
int cuda_op_error(const Node *n, Diag *d, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Records what the kernel chose ("cudnn:IMPLICIT_PRECOMP_GEMM"). */
void cuda_note(CudaCtx *cx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reports a failed call into d (with file and line) and returns an error. */
int cuda_fail(Diag *d, const char *file, int line, const char *call, const char *why);

#define CUDA_TRY(call)                                                          \
  do {                                                                          \
    cudaError_t teq_e_ = (call);                                                \
    if (teq_e_ != cudaSuccess)                                                  \
      return cuda_fail(d, __FILE__, __LINE__, #call, cudaGetErrorString(teq_e_)); \
  } while (0)
#define CUBLAS_TRY(call)                                                        \
  do {                                                                          \
    cublasStatus_t teq_s_ = (call);                                             \
    if (teq_s_ != CUBLAS_STATUS_SUCCESS)                                        \
      return cuda_fail(d, __FILE__, __LINE__, #call, cublasGetStatusString(teq_s_)); \
  } while (0)
#define CUDNN_TRY(call)                                                         \
  do {                                                                          \
    cudnnStatus_t teq_s_ = (call);                                              \
    if (teq_s_ != CUDNN_STATUS_SUCCESS)                                         \
      return cuda_fail(d, __FILE__, __LINE__, #call, cudnnGetErrorString(teq_s_)); \
  } while (0)

/* ---- row-major products, as cuBLAS runs them ----
 * C_i = alpha A_i B_i + beta C_i for i < batch, row-major: A_i (rows x k)
 * at a + i stride_a with lda floats from one row to the next, B_i (k x
 * cols) at b + i stride_b with ldb, C_i (rows x cols) at c + i stride_c
 * with ldc; ta: A_i is stored transposed (k x rows, lda from one stored
 * row to the next), tb alike. cuBLAS is column-major, so it runs C^T =
 * B^T A^T: m = cols, n = rows, its A is b and its B is a. One description
 * serves the device (cuda_product) and the host's replay of a way
 * (cuda_product_on_host, which reads the arguments as cuBLAS does), so the
 * host checks of the conv ways and of gemm cover the call's arguments
 * too. */
struct CudaProduct {
  int rows, cols, k, batch;
  const float *a;
  int lda;
  long long stride_a;
  const float *b;
  int ldb;
  long long stride_b;
  float *c;
  int ldc;
  long long stride_c;
  bool ta = false, tb = false;
  float alpha = 1.0f, beta = 0.0f;
  /* Set: batch entries that no one stride steps through (a product read
   * or written by strides over two batch axes, graph_strided), each
   * entry's a, b and c (a, b and c and the strides unused), as arrays in
   * the memory of whoever runs the product: the device's for
   * cublasSgemmBatched, the host's for cuda_product_on_host. */
  const float *const *a_at = nullptr, *const *b_at = nullptr;
  float *const *c_at = nullptr;
};

/* One cublasSgemm where batch is 1 and no stride is set, one
 * cublasSgemmBatched over arrays of pointers, else one
 * cublasSgemmStridedBatched: the calls the ways were measured with. */
static inline int cuda_product(CudaCtx *cx, const CudaProduct &p, Diag *d) {
  const cublasOperation_t op_b = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (p.a_at)
    CUBLAS_TRY(cublasSgemmBatched(cx->cublas, op_b, op_a, p.cols, p.rows, p.k, &p.alpha, p.b_at,
                                  p.ldb, p.a_at, p.lda, &p.beta, p.c_at, p.ldc, p.batch));
  else if (p.batch == 1 && !p.stride_a && !p.stride_b && !p.stride_c)
    CUBLAS_TRY(cublasSgemm(cx->cublas, op_b, op_a, p.cols, p.rows, p.k, &p.alpha, p.b, p.ldb, p.a,
                           p.lda, &p.beta, p.c, p.ldc));
  else
    CUBLAS_TRY(cublasSgemmStridedBatched(cx->cublas, op_b, op_a, p.cols, p.rows, p.k, &p.alpha,
                                         p.b, p.ldb, p.stride_b, p.a, p.lda, p.stride_a, &p.beta,
                                         p.c, p.ldc, p.stride_c, p.batch));
  return TEQ_OK;
}

/* The same product on the host, the arguments read as cuBLAS reads them
 * (column-major, m = cols, n = rows; op(A) transposed where tb says, op(B)
 * where ta does), summed in float in order of K. C is not read where beta
 * is 0, as cuBLAS does not. */
static inline void cuda_product_on_host(const CudaProduct &p) {
  for (long long i = 0; i < p.batch; i++) {
    const float *ca = p.b_at ? p.b_at[i] : p.b + i * p.stride_b; /* cuBLAS's A, B */
    const float *cb = p.a_at ? p.a_at[i] : p.a + i * p.stride_a;
    float *cc = p.c_at ? p.c_at[i] : p.c + i * p.stride_c;
    for (long long col = 0; col < p.rows; col++)   /* cuBLAS's n */
      for (long long row = 0; row < p.cols; row++) { /* cuBLAS's m */
        float acc = 0.0f;
        for (long long t = 0; t < p.k; t++)
          acc += (p.tb ? ca[t + row * p.ldb] : ca[row + t * p.ldb]) *
                 (p.ta ? cb[col + t * p.lda] : cb[t + col * p.lda]);
        float *out = &cc[row + col * p.ldc];
        *out = p.beta != 0.0f ? p.alpha * acc + p.beta * *out : p.alpha * acc;
      }
  }
}

/* After every <<<launch>>>: a bad configuration shows up here. */
#define CUDA_LAUNCHED() CUDA_TRY(cudaGetLastError())

/* The largest power of two up to OP_ARENA_ALIGN that divides p's address:
 * what a library may assume of an operand. Views and the pieces of a
 * concat written in place (ops.h: OP_PLACE_ALIGN) may be less aligned than
 * the arena's 256 bytes, so algorithms chosen for one alignment are
 * remembered by it. */
static inline uint32_t cuda_alignment_of(const void *p) {
  uint32_t a = OP_ARENA_ALIGN;
  while (a > 1 && (uintptr_t)p % a) a /= 2;
  return a;
}

/* Blocks of `threads` covering n elements, capped so grid-stride loops
 * take the rest. */
static inline unsigned cuda_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535 * 8) b = 65535 * 8;
  return (unsigned)b;
}

/* Threads of a block that walks one row of n elements: n rounded up to
 * whole warps, at most `most` (a 7x7 plane takes 64, not 256). */
static inline int cuda_row_threads(int64_t n, int most) {
  return n >= most ? most : (int)((n + 31) / 32 * 32);
}

/* A grid over `planes` planes of `inner` elements, blocks of `threads`:
 * planes (image, channel) along y (striding past 65535), a plane's elements
 * along x, about 2048 blocks in all, enough to fill the GPU whether the
 * planes are few and large or many and small; grid-stride loops take the
 * rest. A kernel on it knows each block's channel: no division per
 * element (the conv epilogue, batchnorm, cuda_sum_partials). */
static inline dim3 cuda_plane_grid(int64_t planes, int64_t inner, int threads) {
  unsigned by = planes < 65535 ? (unsigned)planes : 65535u;
  unsigned bx = cuda_blocks(inner, threads), want = (2048 + by - 1) / by;
  return dim3(bx > want ? want : bx, by);
}

/* A shape's row-major strides, and up to TEQ_MAX_DIMS dims, by value so a
 * kernel can take it as an argument. */
struct CudaDims {
  int nd;
  int64_t d[TEQ_MAX_DIMS];
  int64_t s[TEQ_MAX_DIMS];
};
static inline CudaDims cuda_dims(const Shape *sh) {
  CudaDims r;
  r.nd = sh->ndim;
  int64_t st = 1;
  for (int i = TEQ_MAX_DIMS - 1; i >= 0; i--) {
    r.d[i] = i < sh->ndim ? sh->d[i] : 1;
    r.s[i] = i < sh->ndim ? st : 0;
    if (i < sh->ndim) st *= sh->d[i];
  }
  return r;
}

#define CUDA_KERNEL_SIGNATURE                                                     \
  const Node *n, CudaCtx *cx, const CudaTensor *in, const CudaTensor *out, Diag *d

/* Milliseconds per call of run() (which launches on cx->stream and returns
 * an error code) as a replay runs it: after a warm-up call, five calls
 * captured into a CUDA graph, launched once to warm it and once timed by
 * CUDA events; outside any capture. How a convolution's ways (cuBLAS
 * against cuDNN's search) and a product's splits (matmul.cu) compete.
 * Five calls timed on the stream, as conv.cu once did,
 * timed the host's launches of a small convolution rather than its
 * kernels: a 1x1 conv [1,880,7,7] x [176,880] with a relu kept cuDNN's
 * IMPLICIT_GEMM, 41 us in a replay, over cuBLAS's product, 9.5 us (the
 * H200's and the H100's tables, 2026-11-27). Where the capture is refused,
 * the calls are timed on the stream as before. */
template <class Run>
static inline int cuda_time_calls(CudaCtx *cx, Run run, float *ms, Diag *d) {
  enum { CALLS = 5 };
  int rc = run(); /* scratch sized and kernels loaded before any capture */
  if (rc) return rc;
  cudaGraphExec_t exec = nullptr;
  bool outer = cx->capturing;
  if (cudaStreamBeginCapture(cx->stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    cx->capturing = true; /* scratch may not grow now */
    int crc = TEQ_OK;
    for (int i = 0; i < CALLS && crc == TEQ_OK; i++) crc = run();
    cx->capturing = outer;
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(cx->stream, &graph) == cudaSuccess && crc == TEQ_OK &&
        cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
      exec = nullptr;
    if (graph) cudaGraphDestroy(graph);
  }
  (void)cudaGetLastError(); /* a capture refused is not an error: timed on the stream below */
  cudaEvent_t a, b;
  CUDA_TRY(cudaEventCreate(&a));
  CUDA_TRY(cudaEventCreate(&b));
  cudaError_t e = exec ? cudaGraphLaunch(exec, cx->stream) : cudaSuccess; /* uploads it */
  if (e == cudaSuccess) e = cudaEventRecord(a, cx->stream);
  if (exec && e == cudaSuccess) e = cudaGraphLaunch(exec, cx->stream);
  for (int i = 0; !exec && i < CALLS && !rc && e == cudaSuccess; i++) rc = run();
  if (!rc && e == cudaSuccess) e = cudaEventRecord(b, cx->stream);
  if (!rc && e == cudaSuccess) e = cudaEventSynchronize(b);
  if (!rc && e == cudaSuccess) e = cudaEventElapsedTime(ms, a, b);
  *ms /= CALLS;
  if (exec) cudaGraphExecDestroy(exec);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (!rc && e != cudaSuccess)
    return cuda_fail(d, __FILE__, __LINE__, "timing a way of a kernel", cudaGetErrorString(e));
  return rc;
}

#endif
