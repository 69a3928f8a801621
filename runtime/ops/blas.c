/* blas.c: the one door to the BLAS for the float32 kernels (conv, matmul).
 * OpenBLAS hands every GEMM above a tiny size to its thread pool; for the
 * small GEMMs of small models the hand-off costs more than the arithmetic
 * (a 16-operator CNN: 5.8 ms with two threads, 0.4 ms with one), so GEMMs
 * under SMALL_GEMM_FLOPS run in the calling thread. */
#include <cblas.h>

#include "runtime/ops/family.h"

/* Below about 1 MFLOP a GEMM takes tens of microseconds on one core, the
 * order of waking a pool thread. */
#define SMALL_GEMM_FLOPS 1000000.0

void blas_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  bool small = 2.0 * (double)m * (double)n * (double)k < SMALL_GEMM_FLOPS;
  int threads = small ? openblas_get_num_threads() : 1;
  if (threads > 1) openblas_set_num_threads(1);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)m, (int)n, (int)k, alpha, a, lda > 1 ? (int)lda : 1, b, ldb > 1 ? (int)ldb : 1,
              beta, c, ldc > 1 ? (int)ldc : 1);
  if (threads > 1) openblas_set_num_threads(threads);
}
