/* matmul.c: matrix products: matmul (ONNX MatMul: 1-D operands promoted,
 * batch dimensions broadcast numpy-style, plus TASO's fused activation)
 * and gemm (ONNX Gemm: optional transposes, alpha, beta and a bias C
 * broadcast to [M, N]).
 *
 * Float32 goes through the BLAS (blas_sgemm): one call for the whole batch when B is
 * a plain matrix (the common x @ W), else one call per batch entry. Z_p is
 * exact (modp_gemm below, which conv2d's Z_p path shares).
 *
 * OPF_MULTILINEAR describes the plain product: a node with act != none, or
 * a gemm with a C input, is not linear in A and B, and callers that split
 * at non-linear operators (PET) must check `act` and n_in as well. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/modp.h"
#include "runtime/ops/family.h"

/* Row-major sgemm with the leading dimensions the BLAS insists on (>= 1
 * even for empty matrices, where it would otherwise report an error). */
static void sgemm_rm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, const float *b, float beta, float *c) {
  blas_sgemm(ta, tb, m, n, k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
}

/* The BLAS takes int extents; larger products are refused, not truncated. */
static int blas_fits(const Node *n, Diag *d, int64_t m, int64_t nn, int64_t k) {
  if (m > INT_MAX || nn > INT_MAX || k > INT_MAX || m * k > INT_MAX || k * nn > INT_MAX ||
      m * nn > INT_MAX)
    return op_error(n, d, "product of [%lld, %lld] by [%lld, %lld] is too large for the BLAS",
                    (long long)m, (long long)k, (long long)k, (long long)nn);
  return TEQ_OK;
}

/* The Z_p product (declared in family.h; conv2d's Z_p path uses it too).
 *
 * The loops follow B's layout so that the inner one reads memory in order
 * and vectorises (a column walk of B was most of what gen-rules, PET's
 * corrector and optimize's instance checks spent): B in rows (cb = 1) is
 * summed into a band of C's row at a time, four rows of B per pass; B in
 * columns (rb = 1, gemm's transB) is a dot product per element. Residues
 * are below 2^31, so a product is below 2^62 and four of them sum below
 * 2^64; each such sum is folded once (2^31 = 1 mod p) to below 2^34
 * before it is added, so a uint64_t holds 2^30 of them; the sum is
 * reduced at the end. */
enum { MODP_BAND = 256 };

static inline uint64_t modp_fold(uint64_t s) { return (s & MODP_P) + (s >> 31); }

/* acc[j] += x0 b0[j] + x1 b1[j] + x2 b2[j] + x3 b3[j], folded (bt: the
 * distance from one row of B to the next): the inner loop of a band, for
 * four steps of the sum at once, so that each fold and each access to
 * acc serves four products. Both factors are below 2^31, so one 32 x 32
 * -> 64-bit multiply per lane (vpmuludq) is the whole product; compilers
 * vectorise the portable loop with a full 64-bit multiply assembled from
 * three, so x86 gets it spelled out, for the widest vectors it has. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BAND_X86 1

__attribute__((target("avx512f"))) static int64_t band_axpy4_avx512(uint64_t *acc,
                                                                    const uint32_t *b, int64_t bt,
                                                                    int64_t w, const uint32_t *x) {
  const __m512i x0 = _mm512_set1_epi64(x[0]), x1 = _mm512_set1_epi64(x[1]);
  const __m512i x2 = _mm512_set1_epi64(x[2]), x3 = _mm512_set1_epi64(x[3]);
  const __m512i p = _mm512_set1_epi64(MODP_P);
#define ROW512(r) _mm512_cvtepu32_epi64(_mm256_loadu_si256((const void *)(b + (r) * bt + j)))
  int64_t j = 0;
  for (; j + 8 <= w; j += 8) {
    __m512i s = _mm512_add_epi64(_mm512_mul_epu32(ROW512(0), x0), _mm512_mul_epu32(ROW512(1), x1));
    s = _mm512_add_epi64(s, _mm512_add_epi64(_mm512_mul_epu32(ROW512(2), x2),
                                             _mm512_mul_epu32(ROW512(3), x3)));
    __m512i fold = _mm512_add_epi64(_mm512_and_si512(s, p), _mm512_srli_epi64(s, 31));
    _mm512_storeu_si512(acc + j, _mm512_add_epi64(_mm512_loadu_si512(acc + j), fold));
  }
#undef ROW512
  return j;
}

__attribute__((target("avx2"))) static int64_t band_axpy4_avx2(uint64_t *acc, const uint32_t *b,
                                                               int64_t bt, int64_t w,
                                                               const uint32_t *x) {
  const __m256i x0 = _mm256_set1_epi64x(x[0]), x1 = _mm256_set1_epi64x(x[1]);
  const __m256i x2 = _mm256_set1_epi64x(x[2]), x3 = _mm256_set1_epi64x(x[3]);
  const __m256i p = _mm256_set1_epi64x(MODP_P);
#define ROW256(r) _mm256_cvtepu32_epi64(_mm_loadu_si128((const void *)(b + (r) * bt + j)))
  int64_t j = 0;
  for (; j + 4 <= w; j += 4) {
    __m256i s = _mm256_add_epi64(_mm256_mul_epu32(ROW256(0), x0), _mm256_mul_epu32(ROW256(1), x1));
    s = _mm256_add_epi64(s, _mm256_add_epi64(_mm256_mul_epu32(ROW256(2), x2),
                                             _mm256_mul_epu32(ROW256(3), x3)));
    __m256i fold = _mm256_add_epi64(_mm256_and_si256(s, p), _mm256_srli_epi64(s, 31));
    _mm256_storeu_si256((void *)(acc + j),
                        _mm256_add_epi64(_mm256_loadu_si256((const void *)(acc + j)), fold));
  }
#undef ROW256
  return j;
}
#endif

/* The widest path the machine has: 2 AVX-512, 1 AVX2, 0 the portable
 * loop. TEQ_MODP_VECTORS=avx2 or =portable caps it, so that tests run the
 * narrower paths on a machine that has the wider (tests/meson.build). */
static int band_level(void) {
  static int level = -1; /* computed once; every thread computes the same */
  int l = __atomic_load_n(&level, __ATOMIC_RELAXED);
  if (l >= 0) return l;
  l = 0;
#ifdef BAND_X86
  l = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
  const char *cap = getenv("TEQ_MODP_VECTORS");
  if (cap && !strcmp(cap, "portable")) l = 0;
  else if (cap && !strcmp(cap, "avx2") && l > 1) l = 1;
  __atomic_store_n(&level, l, __ATOMIC_RELAXED);
  return l;
}

static void band_axpy4(uint64_t *restrict acc, const uint32_t *restrict b, int64_t bt, int64_t w,
                       const uint32_t *x) {
  int64_t j = 0;
#ifdef BAND_X86
  int level = band_level();
  if (level == 2) j = band_axpy4_avx512(acc, b, bt, w, x);
  else if (level == 1) j = band_axpy4_avx2(acc, b, bt, w, x);
#endif
  for (; j < w; j++)
    acc[j] += modp_fold((uint64_t)x[0] * b[j] + (uint64_t)x[1] * b[bt + j] +
                        (uint64_t)x[2] * b[2 * bt + j] + (uint64_t)x[3] * b[3 * bt + j]);
}

/* C = A B for A stored by columns (ra == 1: a transposed operand) and C
 * of at most COLUMNS_FEW columns. Summing each row of C down a column of
 * A misses the cache once per element (a [512, 4096] weight read
 * transposed, times one column: NasRNN's checks of its layout rules), so
 * a block of C's rows is summed at once instead, along A's rows. */
enum { COLUMNS_FEW = 4, ROWS_BLOCK = 512 };
static void modp_gemm_by_columns(int64_t m, int64_t n, int64_t k, const uint32_t *a, int64_t ca,
                                 const uint32_t *b, int64_t rb, int64_t cb, uint32_t *c,
                                 int64_t ldc) {
  uint64_t acc[COLUMNS_FEW][ROWS_BLOCK];
  for (int64_t i0 = 0; i0 < m; i0 += ROWS_BLOCK) {
    const int64_t h = m - i0 < ROWS_BLOCK ? m - i0 : ROWS_BLOCK;
    for (int64_t j = 0; j < n; j++) memset(acc[j], 0, (size_t)h * sizeof acc[j][0]);
    for (int64_t t = 0; t < k; t++) {
      const uint32_t *at = a + t * ca + i0;
      for (int64_t j = 0; j < n; j++) {
        const uint64_t x = b[t * rb + j * cb];
        if (!x) continue;
        for (int64_t i = 0; i < h; i++) acc[j][i] += modp_fold(x * at[i]);
      }
    }
    for (int64_t j = 0; j < n; j++)
      for (int64_t i = 0; i < h; i++) c[(i0 + i) * ldc + j] = modp_reduce(acc[j][i]);
  }
}

void modp_gemm(int64_t m, int64_t n, int64_t k, const uint32_t *a, int64_t ra, int64_t ca,
               const uint32_t *b, int64_t rb, int64_t cb, uint32_t *c, int64_t ldc) {
  if (ra == 1 && ca != 1 && n <= COLUMNS_FEW && m > 1) {
    modp_gemm_by_columns(m, n, k, a, ca, b, rb, cb, c, ldc);
    return;
  }
  /* Dot products: B in columns, or one column of B against rows of A
   * (which the bands below would take four elements at a time). */
  if ((cb != 1 && n > 1) || (n == 1 && ca == 1 && rb == 1)) {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        const uint32_t *ai = a + i * ra, *bj = b + j * cb;
        uint64_t acc = 0;
        if (ca == 1 && rb == 1)
          for (int64_t t = 0; t < k; t++) acc += modp_fold((uint64_t)ai[t] * bj[t]);
        else
          for (int64_t t = 0; t < k; t++) acc += modp_fold((uint64_t)ai[t * ca] * bj[t * rb]);
        c[i * ldc + j] = modp_reduce(acc);
      }
    return;
  }
  /* B in rows (or one column of spread elements: n = 1, j0 = 0), four at
   * a time, the last one to three alone. Four zeros of A skip their pass
   * (the zero-padded kernels of PET's merged convolutions). */
  uint64_t acc[MODP_BAND];
  for (int64_t j0 = 0; j0 < n; j0 += MODP_BAND) {
    const int64_t w = n - j0 < MODP_BAND ? n - j0 : MODP_BAND;
    for (int64_t i = 0; i < m; i++) {
      memset(acc, 0, (size_t)w * sizeof *acc);
      for (int64_t t = 0; t < k; t += 4) {
        uint32_t x[4] = {0, 0, 0, 0};
        int q = k - t < 4 ? (int)(k - t) : 4;
        for (int r = 0; r < q; r++) x[r] = a[i * ra + (t + r) * ca];
        if (!(x[0] | x[1] | x[2] | x[3])) continue;
        if (q == 4) {
          band_axpy4(acc, b + t * rb + j0, rb, w, x);
          continue;
        }
        for (int r = 0; r < q; r++) /* the last rows of B, one by one */
          for (int64_t jj = 0; jj < w; jj++)
            acc[jj] += modp_fold((uint64_t)x[r] * b[(t + r) * rb + j0 + jj]);
      }
      for (int64_t jj = 0; jj < w; jj++) c[i * ldc + j0 + jj] = modp_reduce(acc[jj]);
    }
  }
}

/* ---- matmul ---- */

/* Fills p from the input shapes; returns TEQ_ERR_INPUT (message in d) if
 * they do not multiply. */
int matmul_plan(const Node *n, const Shape *a, const Shape *b, MatmulPlan *p, Diag *d) {
  char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
  if (a->ndim < 1 || b->ndim < 1)
    return op_error(n, d, "A %s and B %s: both operands need rank >= 1",
                    shape_format(a, sa, sizeof sa), shape_format(b, sb, sizeof sb));
  memset(p, 0, sizeof *p);
  p->m = a->ndim >= 2 ? a->d[a->ndim - 2] : 1;
  p->k = a->d[a->ndim - 1];
  int64_t kb = b->ndim >= 2 ? b->d[b->ndim - 2] : b->d[0];
  p->n = b->ndim >= 2 ? b->d[b->ndim - 1] : 1;
  if (p->k != kb)
    return op_error(n, d, "A %s and B %s: inner dimensions %lld and %lld differ",
                    shape_format(a, sa, sizeof sa), shape_format(b, sb, sizeof sb),
                    (long long)p->k, (long long)kb);
  int na = a->ndim > 2 ? a->ndim - 2 : 0, nb = b->ndim > 2 ? b->ndim - 2 : 0;
  p->nb = na > nb ? na : nb;
  int64_t stride_a, stride_b, numel_a = 1, mn;
  /* Checked: the batch count multiplies extents of both operands, and a
   * graph's shapes bound only each operand (shape_fits). */
  bool over = __builtin_mul_overflow(p->m, p->k, &stride_a) |
              __builtin_mul_overflow(p->k, p->n, &stride_b) |
              __builtin_mul_overflow(p->m, p->n, &mn);
  p->count = 1;
  for (int i = p->nb - 1; i >= 0 && !over; i--) {
    int ia = i - (p->nb - na), ib = i - (p->nb - nb);
    int64_t da = ia >= 0 ? a->d[ia] : 1, db = ib >= 0 ? b->d[ib] : 1;
    if (da != db && da != 1 && db != 1)
      return op_error(n, d, "A %s and B %s: batch dimensions do not broadcast (%lld vs %lld)",
                      shape_format(a, sa, sizeof sa), shape_format(b, sb, sizeof sb),
                      (long long)da, (long long)db);
    p->bd[i] = da > db ? da : db;
    if (da == 0 || db == 0) p->bd[i] = 0;
    p->sa[i] = da == 1 ? 0 : stride_a;
    p->sb[i] = db == 1 ? 0 : stride_b;
    over = __builtin_mul_overflow(stride_a, da, &stride_a) |
           __builtin_mul_overflow(stride_b, db, &stride_b) |
           __builtin_mul_overflow(numel_a, da, &numel_a) |
           __builtin_mul_overflow(p->count, p->bd[i], &p->count);
  }
  if (over || __builtin_mul_overflow(p->count, mn, &mn))
    return op_error(n, d, "A %s and B %s: the result's extents multiply past 2^63",
                    shape_format(a, sa, sizeof sa), shape_format(b, sb, sizeof sb));
  bool b_shared = true;
  for (int i = 0; i < p->nb; i++) b_shared = b_shared && p->sb[i] == 0;
  p->flat_a = b_shared && numel_a == p->count;
  return TEQ_OK;
}

void matmul_batch_offsets(const MatmulPlan *p, int64_t t, int64_t *oa, int64_t *ob) {
  *oa = *ob = 0;
  for (int i = p->nb - 1; i >= 0; i--) {
    int64_t j = t % p->bd[i];
    t /= p->bd[i];
    *oa += j * p->sa[i];
    *ob += j * p->sb[i];
  }
}

void matmul_uniform_suffix(const MatmulPlan *p, const int64_t *sa, const int64_t *sb, int *from,
                           int64_t *step_a, int64_t *step_b) {
  const int64_t *s[2] = {sa, sb};
  int64_t step[2] = {0, 0};
  bool set[2] = {false, false};
  int f = p->nb;
  int64_t inner = 1;
  for (int i = p->nb - 1; i >= 0; i--) {
    bool ok = true;
    int64_t cand[2];
    for (int o = 0; o < 2 && ok; o++) {
      cand[o] = set[o] || p->bd[i] == 1 ? step[o] : s[o][i] / inner;
      ok = p->bd[i] == 1 || s[o][i] == cand[o] * inner;
    }
    if (!ok) break;
    for (int o = 0; o < 2 && p->bd[i] != 1; o++) step[o] = cand[o], set[o] = true;
    f = i;
    inner *= p->bd[i];
  }
  *from = f, *step_a = step[0], *step_b = step[1];
}

bool matmul_operand(const MatmulPlan *p, const Shape *sh, const int64_t *st, int j,
                    MatmulOperand *o) {
  int r = sh->ndim;
  int64_t rows = j == 0 ? p->m : p->k, cols = j == 0 ? p->k : p->n;
  const int64_t *dense = j == 0 ? p->sa : p->sb;
  memset(o, 0, sizeof *o);
  if (!st) {
    o->ld = cols > 1 ? cols : 1;
    memcpy(o->s, dense, sizeof o->s);
    return true;
  }
  if (r < 2) return false;
  /* An axis of extent 1 is never stepped along: its stride is free. */
  int64_t sr = rows == 1 ? 0 : st[r - 2], sc = cols == 1 ? 0 : st[r - 1];
  if (cols == 1 || sc == 1) {
    o->t = false, o->ld = rows == 1 ? (cols > 1 ? cols : 1) : sr;
    if (o->ld < cols || o->ld < 1) return false;
  } else if (rows == 1 || sr == 1) {
    o->t = true, o->ld = sc;
    if (o->ld < rows) return false;
  } else {
    return false;
  }
  int nb = r - 2;
  for (int i = 0; i < p->nb; i++) {
    int axis = i - (p->nb - nb);
    o->s[i] = axis < 0 || sh->d[axis] == 1 ? 0 : st[axis];
  }
  return true;
}

bool matmul_output(const MatmulPlan *p, const int64_t *st, int from, MatmulOperand *o) {
  memset(o, 0, sizeof *o);
  int r = p->nb + 2;
  if (!st) {
    o->ld = p->n > 1 ? p->n : 1;
    int64_t entries = 1;
    for (int i = p->nb - 1; i >= 0; i--) o->s[i] = entries * p->m * p->n, entries *= p->bd[i];
    return true;
  }
  if (p->n > 1 && st[r - 1] != 1) return false;
  o->ld = p->m == 1 ? (p->n > 1 ? p->n : 1) : st[r - 2];
  if (o->ld < p->n) return false;
  int64_t step = -1, inner = 1;
  for (int i = 0; i < p->nb; i++) o->s[i] = p->bd[i] == 1 ? 0 : st[i];
  for (int i = p->nb - 1; i >= from; inner *= p->bd[i], i--) {
    if (p->bd[i] == 1) continue;
    if (step < 0) step = o->s[i] / inner;
    if (o->s[i] != step * inner) return false;
  }
  return true;
}

/* A strided operand (graph_strided) where cuBLAS takes it as it is: a
 * matrix with one unit stride. The GPU runs it in the strided batched
 * calls the dense operand needs where its batch axes step as the dense
 * ones do, else in one call over arrays of pointers (Swin's K, [windows,
 * heads, ...] cut from [windows, tokens, 3, heads, ...]); not in a product
 * whose A it stacks into one tall matrix, whose rows must follow one
 * another. */
static bool matmul_reads_strided(const Node *n, const Shape *in, int j, const int64_t *strides) {
  MatmulPlan p;
  MatmulOperand o;
  return n->dtype == DT_F32 && j >= 0 && j <= 1 && in[0].ndim >= 2 && in[1].ndim >= 2 &&
         matmul_plan(n, &in[0], &in[1], &p, NULL) == TEQ_OK && !p.flat_a && p.m <= INT_MAX &&
         p.n <= INT_MAX && p.k <= INT_MAX && p.count && p.count <= INT_MAX && p.m && p.n &&
         p.k && matmul_operand(&p, &in[j], strides, j, &o) && o.ld <= INT_MAX;
}

bool matmul_tall_output(const MatmulPlan *p, const int64_t *st, int64_t *ld, bool *transposed) {
  int r = p->nb + 2;
  int64_t rows = p->count * p->m, row = -1, inner = p->m;
  /* The rows: the m axis, then each batch axis longer than 1 outside it,
   * each stepping as one more run of the rows inside it. */
  if (p->m > 1) row = st[r - 2];
  for (int i = p->nb - 1; i >= 0; inner *= p->bd[i], i--) {
    if (p->bd[i] == 1) continue;
    if (row < 0 && st[i] % inner == 0) row = st[i] / inner;
    if (row < 0 || st[i] != row * inner) return false;
  }
  int64_t col = p->n > 1 ? st[r - 1] : 1;
  if (row < 0) row = p->n; /* one row: its stride is free */
  if (col == 1 && row >= p->n) return *ld = row, *transposed = false, true;
  if (row == 1 && col >= rows) return *ld = col, *transposed = true, true;
  return false;
}

/* A product written strided: no activation (the GPU applies one over the
 * dense output after the products); batched, by strided batched calls or
 * one over arrays of pointers, as reading strided; a tall product (x W,
 * A's entries stacked) as one matrix, by rows or by columns (its
 * transpose: the product of the transposed operands, ConvNeXt's block
 * back to channels first). */
static bool matmul_writes_strided(const Node *n, const Shape *in, const int64_t *strides) {
  MatmulPlan p;
  MatmulOperand c;
  int64_t ld;
  bool transposed;
  if (n->dtype != DT_F32 || param_int(&n->params, MATMUL_ACT) != ACT_NONE || in[0].ndim < 2 ||
      in[1].ndim < 2 || matmul_plan(n, &in[0], &in[1], &p, NULL) != TEQ_OK ||
      p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX || !p.count || !p.m || !p.n || !p.k)
    return false;
  if (p.flat_a)
    return p.count * p.m <= INT_MAX && matmul_tall_output(&p, strides, &ld, &transposed) &&
           ld <= INT_MAX;
  return p.count <= INT_MAX && matmul_output(&p, strides, p.nb, &c) && c.ld <= INT_MAX;
}

static int matmul_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  MatmulPlan p;
  int rc = matmul_plan(n, &in[0], &in[1], &p, d);
  if (rc) return rc;
  int64_t dims[TEQ_MAX_DIMS + 2];
  int nd = 0;
  for (int i = 0; i < p.nb; i++) dims[nd++] = p.bd[i];
  if (in[0].ndim >= 2) dims[nd++] = p.m;
  if (in[1].ndim >= 2) dims[nd++] = p.n;
  if (nd > TEQ_MAX_DIMS)
    return op_error(n, d, "result has rank %d: at most %d", nd, TEQ_MAX_DIMS);
  out[0] = shape_make(nd, dims);
  return TEQ_OK;
}

static int matmul_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  MatmulPlan p;
  int rc = matmul_plan(n, &in[0]->shape, &in[1]->shape, &p, d);
  if (rc) return rc;
  const float *a = in[0]->data, *b = in[1]->data;
  float *c = out[0]->data;
  if (p.flat_a) {
    /* Stacking A's batch entries gives one tall matrix times B. */
    if ((rc = blas_fits(n, d, p.count * p.m, p.n, p.k))) return rc;
    sgemm_rm(false, false, p.count * p.m, p.n, p.k, 1.0f, a, b, 0.0f, c);
  } else {
    if ((rc = blas_fits(n, d, p.m, p.n, p.k))) return rc;
    for (int64_t t = 0; t < p.count; t++) {
      int64_t oa, ob;
      matmul_batch_offsets(&p, t, &oa, &ob);
      sgemm_rm(false, false, p.m, p.n, p.k, 1.0f, a + oa, b + ob, 0.0f, c + t * p.m * p.n);
    }
  }
  act_apply_f32((int)param_int(&n->params, 0), c, tensor_numel(out[0]));
  return TEQ_OK;
}

static int matmul_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  MatmulPlan p;
  int rc = matmul_plan(n, &in[0]->shape, &in[1]->shape, &p, d);
  if (rc) return rc;
  const uint32_t *a = in[0]->data, *b = in[1]->data;
  uint32_t *c = out[0]->data;
  for (int64_t t = 0; t < p.count; t++) {
    int64_t oa, ob;
    matmul_batch_offsets(&p, t, &oa, &ob);
    modp_gemm(p.m, p.n, p.k, a + oa, p.k, 1, b + ob, p.n, 1, c + t * p.m * p.n, p.n);
  }
  act_apply_modp((int)param_int(&n->params, 0), c, tensor_numel(out[0]));
  return TEQ_OK;
}

/* The same sums at chosen output positions (batch entry t, row i, column
 * j), each product folded once as in conv2d's. */
static int matmul_eval_modp_at(const Node *n, Tensor *const *in, const int64_t *pos,
                               int64_t n_pos, uint32_t *vals, Diag *d) {
  MatmulPlan p;
  int rc = matmul_plan(n, &in[0]->shape, &in[1]->shape, &p, d);
  if (rc) return rc;
  const uint32_t *a = in[0]->data, *b = in[1]->data;
  for (int64_t q = 0; q < n_pos; q++) {
    int64_t t = pos[q] / (p.m * p.n), i = pos[q] / p.n % p.m, j = pos[q] % p.n, oa, ob;
    matmul_batch_offsets(&p, t, &oa, &ob);
    const uint32_t *ar = a + oa + i * p.k, *bc = b + ob + j;
    uint64_t acc = 0;
    for (int64_t k = 0; k < p.k; k++) acc += modp_fold((uint64_t)ar[k] * bc[k * p.n]);
    vals[q] = modp_reduce(acc);
  }
  act_apply_modp((int)param_int(&n->params, 0), vals, n_pos);
  return TEQ_OK;
}

static int matmul_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)d;
  int act = (int)param_int(&n->params, 0);
  if (act != ACT_NONE) onnx_out_then_unary(w, op_def(act_op_kind(act))->onnx_op);
  return TEQ_OK;
}

static const OpParam matmul_params[] = {
  [MATMUL_ACT] = PARAM_FUSED_ACT,
};

/* Every output element sums K products, K being A's last extent. */
static double matmul_flops(const Node *n, const Shape *in) {
  return 2.0 * (double)shape_numel(&n->out[0]) * (double)(in[0].ndim ? in[0].d[in[0].ndim - 1] : 1);
}

/* Half the work: half of B's columns (B's last axis). */
static bool matmul_half_twin(const Node *n, const Shape *in, int way, Shape *half_in) {
  (void)n;
  const Shape *b = &in[1];
  if (way != 0 || b->ndim < 2 || b->d[b->ndim - 1] < 2 || b->d[b->ndim - 1] % 2) return false;
  half_in[0] = in[0];
  half_in[1] = *b;
  half_in[1].d[b->ndim - 1] /= 2;
  return true;
}

/* MatMul has nothing to read; an Einsum of two operands is a product
 * between layout changes (einsum.c). */
static int matmul_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  return strcmp(onnx_in_op_type(v), "Einsum") == 0 ? einsum_onnx_read(v, p, d) : TEQ_OK;
}

static const char *const matmul_aliases[] = {"Einsum", NULL};

const OpDef op_def_matmul = {
  .kind = OP_MATMUL, .name = "matmul", .axiom_name = "matmul", .onnx_op = "MatMul",
  .onnx_aliases = matmul_aliases, .onnx_read = matmul_onnx_read,
  .n_in_min = 2, .n_in_max = 2, .n_out_min = 1, .n_out_max = 1,
  .params = matmul_params, .n_params = 1,
  .flags = OPF_MULTILINEAR,
  .infer_shape = matmul_infer,
  .eval_f32 = matmul_eval_f32, .eval_modp = matmul_eval_modp,
  .eval_modp_at = matmul_eval_modp_at, .eval_cuda = CUDA_EVAL(matmul), .flops = matmul_flops,
  .onnx_write = matmul_onnx_write, .half_twin = matmul_half_twin,
  .reads_strided = matmul_reads_strided, .writes_strided = matmul_writes_strided,
};

/* ---- gemm(transA, transB, alpha, beta, act): act(alpha * A' B' + beta * C + Z) ----
 * The activation is one the importer fused (VGG's classifier: Gemm, Relu),
 * applied last; a GPU with cuBLASLt adds C and applies a relu in the
 * product's own epilogue. Z, of the result's shape [M, N], is a residual
 * added before it (a transformer's x + (h W + b), folded in by
 * graph_fuse_residuals, which gives a product without a bias a C of
 * zeros; ONNX's Gemm has no such input, so it is written back as an Add
 * after the Gemm, and the importer refuses a fourth input in a file).
 * Where C is one value per column, cuBLASLt reads Z as its C and keeps the
 * bias in its epilogue. */

/* M, K, N of A' B' from the operand shapes. */
static int gemm_dims(const Node *n, const Shape *a, const Shape *b, int64_t *m, int64_t *k,
                     int64_t *nn, Diag *d) {
  char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
  if (a->ndim != 2 || b->ndim != 2)
    return op_error(n, d, "A %s and B %s: both operands must be matrices",
                    shape_format(a, sa, sizeof sa), shape_format(b, sb, sizeof sb));
  bool ta = param_int(&n->params, GEMM_TRANS_A), tb = param_int(&n->params, GEMM_TRANS_B);
  *m = a->d[ta ? 1 : 0];
  *k = a->d[ta ? 0 : 1];
  int64_t kb = b->d[tb ? 1 : 0];
  *nn = b->d[tb ? 0 : 1];
  if (*k != kb)
    return op_error(n, d, "transA=%d transB=%d: A %s and B %s: inner dimensions %lld and %lld differ",
                    ta, tb, shape_format(a, sa, sizeof sa), shape_format(b, sb, sizeof sb),
                    (long long)*k, (long long)kb);
  return TEQ_OK;
}

static int gemm_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  int64_t m = 0, k = 0, nn = 0;
  int rc = gemm_dims(n, &in[0], &in[1], &m, &k, &nn, d);
  if (rc) return rc;
  if (n->n_in > 2) {
    /* C broadcasts one way only: to [M, N], never the result to C. */
    const Shape *c = &in[2];
    int64_t want[2] = {m, nn};
    bool ok = c->ndim <= 2;
    for (int i = 0; ok && i < c->ndim; i++) {
      int64_t e = c->d[i], w = want[2 - c->ndim + i];
      ok = e == w || e == 1;
    }
    char sc[SHAPE_STR_MAX];
    if (!ok)
      return op_error(n, d, "C %s does not broadcast to the result [%lld, %lld]",
                      shape_format(c, sc, sizeof sc), (long long)m, (long long)nn);
  }
  if (n->n_in > 3) {
    const Shape *z = &in[3];
    char sz[SHAPE_STR_MAX];
    if (z->ndim != 2 || z->d[0] != m || z->d[1] != nn)
      return op_error(n, d, "residual Z %s: expected the result's shape [%lld, %lld]",
                      shape_format(z, sz, sizeof sz), (long long)m, (long long)nn);
  }
  out[0] = shape_make(2, (int64_t[]){m, nn});
  return TEQ_OK;
}

/* Element (i, j) of C broadcast to [M, N] sits at i*ci + j*cj. */
static void gemm_c_strides(const Shape *c, int64_t *ci, int64_t *cj) {
  int64_t rows = c->ndim == 2 ? c->d[0] : 1, cols = c->ndim >= 1 ? c->d[c->ndim - 1] : 1;
  *cj = cols == 1 ? 0 : 1;
  *ci = rows == 1 ? 0 : cols;
}

static int gemm_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  int64_t m, k, nn;
  int rc = gemm_dims(n, &in[0]->shape, &in[1]->shape, &m, &k, &nn, d);
  if (rc || (rc = blas_fits(n, d, m, nn, k))) return rc;
  float alpha = (float)param_float(&n->params, GEMM_ALPHA);
  float beta = (float)param_float(&n->params, GEMM_BETA);
  float *y = out[0]->data;
  if (n->n_in > 2 && beta != 0.0f) {
    int64_t ci, cj;
    gemm_c_strides(&in[2]->shape, &ci, &cj);
    const float *c = in[2]->data;
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < nn; j++) y[i * nn + j] = c[i * ci + j * cj];
  } else {
    beta = 0.0f;
  }
  sgemm_rm(param_int(&n->params, GEMM_TRANS_A), param_int(&n->params, GEMM_TRANS_B), m, nn, k,
           alpha, in[0]->data, in[1]->data, beta, y);
  if (n->n_in > 3) {
    const float *z = in[3]->data;
    for (int64_t t = 0; t < m * nn; t++) y[t] += z[t];
  }
  act_apply_f32((int)param_int(&n->params, GEMM_ACT), y, m * nn);
  return TEQ_OK;
}

/* alpha or beta as a residue; Z_p has no 0.5, and rounding would make a
 * fingerprint lie. */
static int gemm_scalar_modp(const Node *n, int which, const char *name, uint32_t *r, Diag *d) {
  double v = param_float(&n->params, which);
  if (v != floor(v) || fabs(v) >= 0x1p53)
    return op_error(n, d, "%s=%g is not an integer: cannot evaluate in Z_p", name, v);
  *r = modp_from_int((int64_t)v);
  return TEQ_OK;
}

static int gemm_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  int64_t m, k, nn;
  uint32_t alpha = 0, beta = 0;
  int rc = gemm_dims(n, &in[0]->shape, &in[1]->shape, &m, &k, &nn, d);
  if (rc || (rc = gemm_scalar_modp(n, GEMM_ALPHA, "alpha", &alpha, d)) ||
      (rc = gemm_scalar_modp(n, GEMM_BETA, "beta", &beta, d)))
    return rc;
  bool ta = param_int(&n->params, GEMM_TRANS_A), tb = param_int(&n->params, GEMM_TRANS_B);
  uint32_t *y = out[0]->data;
  /* A' is [M, K]: stored [K, M] when transposed. */
  modp_gemm(m, nn, k, in[0]->data, ta ? 1 : k, ta ? m : 1, in[1]->data, tb ? 1 : nn, tb ? k : 1, y,
            nn);
  int64_t ci = 0, cj = 0;
  const uint32_t *c = NULL;
  if (n->n_in > 2) {
    gemm_c_strides(&in[2]->shape, &ci, &cj);
    c = in[2]->data;
  }
  const uint32_t *z = n->n_in > 3 ? in[3]->data : NULL;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < nn; j++) {
      uint32_t v = modp_mul(alpha, y[i * nn + j]);
      v = c ? modp_add(v, modp_mul(beta, c[i * ci + j * cj])) : v;
      y[i * nn + j] = z ? modp_add(v, z[i * nn + j]) : v;
    }
  act_apply_modp((int)param_int(&n->params, GEMM_ACT), y, m * nn);
  return TEQ_OK;
}

/* The generic mapping writes the four attributes; a residual becomes an
 * Add after it, a fused act a node after that. */
static int gemm_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)d;
  int act = (int)param_int(&n->params, GEMM_ACT);
  if (n->n_in > 3) onnx_out_then_binary_input(w, "Add", 3);
  if (act != ACT_NONE) onnx_out_then_unary(w, op_def(act_op_kind(act))->onnx_op);
  return TEQ_OK;
}

static const OpParam gemm_params[] = {
  [GEMM_TRANS_A] = {.name = "transA", .type = PARAM_INT, .def = 0, .lo = 0, .hi = 1,
                    .onnx_attr = "transA"},
  [GEMM_TRANS_B] = {.name = "transB", .type = PARAM_INT, .def = 0, .lo = 0, .hi = 1,
                    .onnx_attr = "transB"},
  [GEMM_ALPHA] = {.name = "alpha", .type = PARAM_FLOAT, .fdef = 1.0, .onnx_attr = "alpha"},
  [GEMM_BETA] = {.name = "beta", .type = PARAM_FLOAT, .fdef = 1.0, .onnx_attr = "beta"},
  [GEMM_ACT] = PARAM_FUSED_ACT_QUIET,
};

/* M x N outputs of K products each; K is A's extent that transA does not
 * make the row count. */
static double gemm_flops(const Node *n, const Shape *in) {
  int64_t k = param_int(&n->params, GEMM_TRANS_A) ? in[0].d[0] : in[0].d[1];
  return 2.0 * (double)shape_numel(&n->out[0]) * (double)k;
}

/* Without a bias, a gemm's work is the matmul of A' and B': the BLAS call
 * is the same, the flags only say how it reads them. alpha and beta scale
 * in the same pass. */
static bool gemm_cost_twin(const Node *n, const Shape *in, Params *p, Shape *twin_in,
                           int *n_twin_in) {
  int64_t m = 0, k = 0, nn = 0;
  if (n->n_in != 2 || gemm_dims(n, &in[0], &in[1], &m, &k, &nn, NULL) != TEQ_OK) return false;
  param_set_int(p, MATMUL_ACT, param_int(&n->params, GEMM_ACT)); /* the same epilogue */
  twin_in[0] = shape_make(2, (int64_t[]){m, k});
  twin_in[1] = shape_make(2, (int64_t[]){k, nn});
  *n_twin_in = 2;
  return true;
}

/* Half the work: half of the N output columns, in B (where transB puts
 * them), in a bias C that has them and in a residual Z. */
static bool gemm_half_twin(const Node *n, const Shape *in, int way, Shape *half_in) {
  int64_t m = 0, k = 0, nn = 0;
  if (way != 0 || gemm_dims(n, &in[0], &in[1], &m, &k, &nn, NULL) != TEQ_OK || nn < 2 || nn % 2)
    return false;
  for (int j = 0; j < n->n_in; j++) half_in[j] = in[j];
  half_in[1].d[param_int(&n->params, GEMM_TRANS_B) ? 0 : 1] /= 2;
  if (n->n_in > 2) {
    Shape *c = &half_in[2];
    if (c->ndim >= 1 && c->d[c->ndim - 1] == nn) c->d[c->ndim - 1] /= 2;
  }
  if (n->n_in > 3) half_in[3].d[1] /= 2;
  return true;
}

const OpDef op_def_gemm = {
  .kind = OP_GEMM, .name = "gemm", .axiom_name = "gemm", .onnx_op = "Gemm",
  .n_in_min = 2, .n_in_max = 4, .n_out_min = 1, .n_out_max = 1,
  .params = gemm_params, .n_params = 5,
  .flags = OPF_MULTILINEAR,
  .infer_shape = gemm_infer,
  .eval_f32 = gemm_eval_f32, .eval_modp = gemm_eval_modp,
  .eval_cuda = CUDA_EVAL(gemm), .flops = gemm_flops, .cost_family = OP_MATMUL,
  .onnx_write = gemm_onnx_write,
  .cost_twin = gemm_cost_twin, .half_twin = gemm_half_twin,
  .residual_input = 3,
};
