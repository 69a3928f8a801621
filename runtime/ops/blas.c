/* blas.c: the one door to the BLAS for the float32 kernels (conv, matmul).
 * OpenBLAS hands every GEMM above a tiny size to its thread pool; for the
 * small GEMMs of small models the hand-off costs more than the arithmetic
 * (a 16-operator CNN: 5.8 ms with two threads, 0.4 ms with one), so GEMMs
 * under SMALL_GEMM_FLOPS run in the calling thread. And a product with a
 * single row or column goes to GEMV: GEMM would first copy (pack) the whole
 * matrix, which for an RNN's [1, 512] x [512, 512] costs more than the
 * product itself. */
#include <cblas.h>

#include "runtime/ops/family.h"

/* Below about 1 MFLOP a GEMM takes tens of microseconds on one core, the
 * order of waking a pool thread. */
#define SMALL_GEMM_FLOPS 1000000.0

/* A GEMV reads its matrix once and is bound by memory, which a second
 * thread barely widens; and after OpenBLAS hands one to its pool, the pool
 * threads spin on sched_yield for a while, a core taken from the caller's
 * next work (optimize's import folds NasRNN's products, and a fifth of the
 * search's samples were that spin). Matrices under 16 MB stay in the
 * calling thread. */
#define SMALL_GEMV_ELEMENTS (4.0 * 1024 * 1024)

/* C = alpha op(A) op(B) + beta C with m == 1 or n == 1, as one GEMV. */
static void gemv(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                 int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m == 1) {
    /* c[0, :] = op(B)^T a: a is row 0 of op(A), stride lda if A is stored
     * transposed ([k, 1]), else contiguous. */
    int inc_a = ta ? (int)(lda > 1 ? lda : 1) : 1;
    if (tb) /* B stored [n, k] */
      cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)k, alpha, b, (int)(ldb > 1 ? ldb : 1),
                  a, inc_a, beta, c, 1);
    else /* B stored [k, n] */
      cblas_sgemv(CblasRowMajor, CblasTrans, (int)k, (int)n, alpha, b, (int)(ldb > 1 ? ldb : 1),
                  a, inc_a, beta, c, 1);
  } else {
    /* c[:, 0] = op(A) b, b column 0 of op(B): stride ldb unless stored
     * transposed ([1, k]); c has stride ldc. */
    int inc_b = tb ? 1 : (int)(ldb > 1 ? ldb : 1);
    int inc_c = (int)(ldc > 1 ? ldc : 1);
    if (ta) /* A stored [k, m] */
      cblas_sgemv(CblasRowMajor, CblasTrans, (int)k, (int)m, alpha, a, (int)(lda > 1 ? lda : 1),
                  b, inc_b, beta, c, inc_c);
    else /* A stored [m, k] */
      cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)m, (int)k, alpha, a, (int)(lda > 1 ? lda : 1),
                  b, inc_b, beta, c, inc_c);
  }
}

void blas_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  bool small = m == 1 || n == 1 ? (double)m * (double)n * (double)k < SMALL_GEMV_ELEMENTS
                                 : 2.0 * (double)m * (double)n * (double)k < SMALL_GEMM_FLOPS;
  int threads = small ? openblas_get_num_threads() : 1;
  if (threads > 1) openblas_set_num_threads(1);
  if (m == 1 || n == 1)
    gemv(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, a, lda > 1 ? (int)lda : 1, b,
                ldb > 1 ? (int)ldb : 1, beta, c, ldc > 1 ? (int)ldc : 1);
  if (threads > 1) openblas_set_num_threads(threads);
}
