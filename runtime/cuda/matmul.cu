/* matmul.cu: GPU kernels of the matmul family (runtime/ops/matmul.c):
 * matmul (numpy semantics: 1-D operands, broadcast batch dimensions, fused
 * act) and gemm (ONNX Gemm: transposes, alpha, beta, C broadcast to
 * [M, N]) through cuBLAS's float32 GEMMs. The handle's math mode (set by
 * the device) keeps TF32 off, so results match the CPU executor.
 *
 * cuBLAS is column-major; a row-major [m, n] matrix is its transpose in
 * column-major, so row-major C = A B is computed as column-major
 * C^T = B^T A^T: operands swapped, no data moved.
 *
 * A matmul with a fused relu over one tall product (x W, the common case)
 * runs through cuBLASLt with the relu as the GEMM's epilogue: one kernel,
 * as the cost model assumes of a fused activation. Elsewhere, and where
 * cuBLASLt offers no algorithm, the activation is a second kernel. A gemm
 * whose C is a bias (one value per column) or that has a fused relu may
 * do both in cuBLASLt's epilogue too, where cublasSgemm needs C copied
 * into the output first and the relu after; which of the two runs is
 * timed once (gemm_way). A gemm's residual Z (a transformer's x + (h W +
 * b)) is cuBLASLt's C, added at beta 1 with the bias in the epilogue and
 * written to another output (D); the plain way writes Z + C into the
 * output before cublasSgemm adds the product over it.
 *
 * A tall product too small to fill the GPU may instead be split along K
 * (tall_way): the products of a transformer or an RNN at batch 1 are short
 * and wide, and BERT's x W, [64, 1024] x [1024, 1024], ran at 14 of the
 * H200's 67 float32 TFLOPS (9.6 us), a few output tiles for 132
 * multiprocessors. Split into s slices of K, one strided batched call
 * computes s partial products side by side in scratch and
 * cuda_sum_partials adds them up with the activation. Which way runs is
 * timed once per configuration, as a convolution's is (conv.cu), and
 * remembered in the device's memo. */
#include <stdio.h>
#include <string.h>

#include <vector>

#include "runtime/cuda/cuda_int.h"
#include "runtime/cuda/unary.cuh"

static const int THREADS = 256;

static bool fits_int(int64_t v) { return v >= 0 && v <= INT32_MAX; }

/* ---- matmul ---- */

/* The cuBLASLt descriptors of one product, released however it ends. */
struct LtProduct {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtProduct() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

/* One product in cuBLASLt's terms, row-major: c[rows, cols] = act(a' b' +
 * z + bias), a' = a [rows, k] or, transposed (ta), a stored [k, rows]; b' =
 * b [k, cols] or (tb) b stored [cols, k]; z [rows, cols] (or NULL) read as
 * cuBLASLt's C at beta 1; bias (cols values, one per column, or NULL) and
 * act (none or relu) in the GEMM's epilogue. */
struct LtArgs {
  int rows, cols, k;
  bool ta, tb;
  const float *a, *b, *bias;
  int act;
  float *c;
  const float *z;
};

/* What the step notes of an LtArgs' GEMM say, and what pins it. */
static const char *lt_way_name(const LtArgs &g) {
  if (g.z)
    return g.bias ? (g.act == ACT_RELU ? "cublasLt:residual, bias+relu epilogue"
                                       : "cublasLt:residual, bias epilogue")
                  : (g.act == ACT_RELU ? "cublasLt:residual, relu epilogue" : "cublasLt:residual");
  return g.bias ? (g.act == ACT_RELU ? "cublasLt:bias+relu epilogue" : "cublasLt:bias epilogue")
                : "cublasLt:relu epilogue";
}

/* An LtArgs in one cuBLASLt GEMM with its epilogue, in full float32 (no
 * TF32). *done is false when cuBLASLt has no algorithm for it; the caller
 * then runs the product and its epilogue apart. */
static int lt_product(CudaCtx *cx, const LtArgs &g, bool *done, Diag *d) {
  *done = false;
  LtProduct p;
  CUBLAS_TRY(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasLtEpilogue_t epilogue =
      g.bias ? (g.act == ACT_RELU ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
             : (g.act == ACT_RELU ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                            sizeof epilogue));
  if (g.bias)
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                              sizeof g.bias));
  /* Column-major, as above: C^T [cols, rows] = B'^T [cols, k] A'^T [k, rows],
   * the bias one value per row of C^T. A row-major b [k, cols] is
   * column-major [cols, k]; a transposed one, stored [cols, k], is
   * column-major [k, cols] read transposed. a alike. */
  const cublasOperation_t op_b = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b));
  CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a));
  if (g.tb) CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_32F, g.k, g.cols, g.k));
  else CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_32F, g.cols, g.k, g.cols));
  if (g.ta) CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_32F, g.rows, g.k, g.rows));
  else CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_32F, g.k, g.rows, g.k));
  CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, g.cols, g.rows, g.cols));
  CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&p.pref));
  const size_t ws = cx->lt_workspace_bytes;
  CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
    p.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  /* The heuristic assumes 256-byte aligned operands unless told; a view
   * (a slice of a wider tensor, a merged product's output split) may be
   * aligned to 4 bytes only, and an algorithm that needs more fails on it. */
  const uint32_t align[4] = {cuda_alignment_of(g.b), cuda_alignment_of(g.a),
                            cuda_alignment_of(g.z ? g.z : g.c), cuda_alignment_of(g.c)};
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; i++)
    CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(p.pref, which[i], &align[i], sizeof align[i]));
  cublasLtMatmulHeuristicResult_t best;
  int found = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(cx->cublaslt, p.op, p.a, p.b, p.c, p.c,
                                                    p.pref, 1, &best, &found);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && found == 0))
    return TEQ_OK;
  CUBLAS_TRY(s);
  /* C is z, of D's layout, where there is one; else D itself at beta 0. */
  const float one = 1.0f, beta = g.z ? 1.0f : 0.0f;
  const float *c_in = g.z ? g.z : g.c;
  CUBLAS_TRY(cublasLtMatmul(cx->cublaslt, p.op, &one, g.b, p.a, g.a, p.b, &beta, c_in, p.c, g.c,
                            p.c, &best.algo, cx->lt_workspace, ws, cx->stream));
  cuda_note(cx, "%s", lt_way_name(g));
  *done = true;
  return TEQ_OK;
}

/* ---- the tall product, whole or split along K ---- */

/* Row-major c[rows, cols] = act(a[rows, k] b[k, cols]), whole (the relu as
 * cuBLASLt's epilogue where it has an algorithm) or in `splits` slices of
 * K: slice j is rows [j kc, (j + 1) kc) of b and columns of a, its partial
 * product at part + j rows cols. */
static int tall_product(CudaCtx *cx, int splits, int rows, int cols, int k, const float *a,
                        const float *b, float *c, int act, Diag *d) {
  int64_t total = (int64_t)rows * cols;
  if (splits > 1) {
    float *part = (float *)cuda_scratch(cx, (size_t)(splits * total) * sizeof(float), d);
    if (!part) return TEQ_ERR_NOMEM;
    int kc = k / splits;
    int rc = cuda_product(cx, {rows, cols, kc, splits, a, k, kc, b, cols, (long long)kc * cols,
                               part, cols, total}, d);
    if (rc) return rc;
    char way[CUDA_WAY_NAME_MAX];
    cuda_product_way_name(false, splits, way, sizeof way);
    cuda_note(cx, "%s", way);
    return cuda_sum_partials(cx, part, splits, total, nullptr, 1, 1, nullptr, act, c, d);
  }
  if (act == ACT_RELU) {
    bool done;
    LtArgs g = {rows, cols, k, false, false, a, b, nullptr, act, c, nullptr};
    int rc = lt_product(cx, g, &done, d);
    if (rc || done) return rc;
  }
  int rc = cuda_product(cx, {rows, cols, k, 1, a, k, 0, b, cols, 0, c, cols, 0}, d);
  if (rc) return rc;
  cuda_note(cx, "cublas:gemm");
  return cuda_act_apply(cx, act, c, total, d);
}

/* How the tall product runs: *splits, 1 for whole. Where splits are
 * offered the first run (not captured) times every way and the device
 * remembers the fastest; a pinned way (cuda_device_pin_way) is taken if
 * offered, else this fails and lists those that are. */
static int tall_way(const Node *n, CudaCtx *cx, int rows, int cols, int k, const float *a,
                    const float *b, float *c, int act, int *splits, Diag *d) {
  int ways[1 + CUDA_SPLIT_MAX], n_ways = 0;
  ways[n_ways++] = 1;
  for (int s = 2; s <= CUDA_SPLIT_MAX; s *= 2)
    if (cuda_split_applies(cx, 1, rows, cols, k, s)) ways[n_ways++] = s;
  if (const char *pin = cuda_pinned_way(cx)) {
    char names[1 + CUDA_SPLIT_MAX][CUDA_WAY_NAME_MAX];
    for (int i = 0; i < n_ways; i++)
      cuda_product_way_name(false, ways[i], names[i], sizeof names[i]);
    int i = 0;
    int rc = cuda_pinned_index(n, pin, names, n_ways, &i, d);
    *splits = ways[i];
    return rc;
  }
  *splits = 1;
  if (n_ways == 1) return TEQ_OK; /* nothing to choose: nothing remembered */
  uint64_t key = hash_mix(0x6d6d756c /* "mmul" */, (uint64_t)rows);
  key = hash_mix(hash_mix(hash_mix(key, (uint64_t)cols), (uint64_t)k), (uint64_t)act);
  int64_t memo[2];
  if (cuda_memo_get(cx, key, memo)) return *splits = (int)memo[0], TEQ_OK;
  if (cx->capturing)
    return cuda_op_error(n, d, TEQ_ERR_INTERNAL,
                         "no way remembered for this product while capturing (the first run "
                         "should have timed them)");
  float best_ms = 0;
  for (int i = 0; i < n_ways; i++) {
    float ms = 0;
    int rc = cuda_time_calls(
        cx, [&] { return tall_product(cx, ways[i], rows, cols, k, a, b, c, act, d); }, &ms, d);
    if (rc) return rc;
    if (i == 0 || ms < best_ms) best_ms = ms, *splits = ways[i];
  }
  memo[0] = *splits, memo[1] = 0;
  cuda_memo_put(cx, key, memo);
  return TEQ_OK;
}

/* The batched products of a matmul: each operand as cuBLAS reads it and
 * the output as it writes it (matmul_operand, matmul_output: dense, or
 * through the strides of a value read or written so, graph_strided), one
 * strided batched call over the longest suffix of batch dims both operands
 * step through uniformly, once per entry of the dims before it; or, where
 * strides make that more calls than dense, one call over arrays of
 * pointers. run(product) is the device's call, or the host's loops that
 * check these arguments (cuda_matmul_on_host). */
template <class Run>
static int batched_products(const Node *n, const MatmulPlan &p, const CudaTensor *in,
                            const CudaTensor &out, Run run, Diag *d) {
  MatmulOperand a, b, c;
  int from;
  int64_t step_a, step_b, inner = 1;
  if (!matmul_operand(&p, &in[0].shape, in[0].strides, 0, &a) ||
      !matmul_operand(&p, &in[1].shape, in[1].strides, 1, &b) || !fits_int(a.ld) ||
      !fits_int(b.ld))
    return cuda_op_error(n, d, TEQ_ERR_INTERNAL, "operands laid out as cuBLAS cannot read");
  matmul_uniform_suffix(&p, a.s, b.s, &from, &step_a, &step_b);
  /* A layout by strides that needs more strided batched calls than the
   * dense one takes one call over arrays of pointers instead. */
  bool arrays = false;
  if (in[0].strides || in[1].strides) {
    MatmulOperand da, db;
    int from_dense;
    int64_t sa, sb;
    matmul_operand(&p, &in[0].shape, nullptr, 0, &da);
    matmul_operand(&p, &in[1].shape, nullptr, 1, &db);
    matmul_uniform_suffix(&p, da.s, db.s, &from_dense, &sa, &sb);
    arrays = from != from_dense;
  }
  if (!arrays && !matmul_output(&p, out.strides, from, &c)) arrays = out.strides != nullptr;
  if (arrays && !fits_int(p.count))
    return cuda_op_error(n, d, TEQ_ERR_INTERNAL, "too many batch entries for arrays of pointers");
  if (!matmul_output(&p, out.strides, arrays ? p.nb : from, &c) || !fits_int(c.ld))
    return cuda_op_error(n, d, TEQ_ERR_INTERNAL, "an output laid out as cuBLAS cannot write");
  const float *pa = (const float *)in[0].data, *pb = (const float *)in[1].data;
  float *pc = (float *)out.data;
  if (arrays) {
    std::vector<const float *> at_a(p.count), at_b(p.count);
    std::vector<float *> at_c(p.count);
    MatmulPlan q = p;
    memcpy(q.sa, a.s, sizeof q.sa);
    memcpy(q.sb, b.s, sizeof q.sb);
    for (int64_t t = 0; t < p.count; t++) {
      int64_t oa, ob, oc = 0, rest = t;
      matmul_batch_offsets(&q, t, &oa, &ob);
      for (int i = p.nb - 1; i >= 0; i--) oc += rest % p.bd[i] * c.s[i], rest /= p.bd[i];
      at_a[t] = pa + oa, at_b[t] = pb + ob, at_c[t] = pc + oc;
    }
    CudaProduct pr = {(int)p.m, (int)p.n, (int)p.k, (int)p.count, nullptr, (int)a.ld, 0, nullptr,
                      (int)b.ld, 0, nullptr, (int)c.ld, 0, a.t, b.t};
    pr.a_at = at_a.data(), pr.b_at = at_b.data(), pr.c_at = at_c.data();
    return run(pr);
  }
  /* C's step over the suffix: its stride at the innermost dim longer than
   * 1, per entry of the dims inside it. */
  int64_t step_c = p.m * p.n, within = 1;
  for (int i = p.nb - 1; i >= from; within *= p.bd[i], i--)
    if (p.bd[i] != 1) {
      step_c = c.s[i] / within;
      break;
    }
  for (int i = from; i < p.nb; i++) inner *= p.bd[i];
  if (!fits_int(inner))
    return cuda_op_error(n, d, TEQ_ERR_UNSUPPORTED, "%lld batch entries: too many for cuBLAS",
                        (long long)inner);
  MatmulPlan q = p; /* the batch offsets through each operand's own strides */
  memcpy(q.sa, a.s, sizeof q.sa);
  memcpy(q.sb, b.s, sizeof q.sb);
  const long long one_entry = inner == 1 ? 0 : 1; /* a single entry: the plain call */
  for (int64_t outer = 0; outer < p.count / inner; outer++) {
    int64_t oa, ob, oc = 0, t = outer * inner;
    matmul_batch_offsets(&q, t, &oa, &ob);
    for (int i = p.nb - 1; i >= 0; i--) oc += t % p.bd[i] * c.s[i], t /= p.bd[i];
    CudaProduct pr = {(int)p.m, (int)p.n, (int)p.k, (int)inner, pa + oa, (int)a.ld,
                      one_entry * step_a, pb + ob, (int)b.ld, one_entry * step_b,
                      pc + oc, (int)c.ld, one_entry * step_c, a.t, b.t};
    int rc = run(pr);
    if (rc) return rc;
  }
  return TEQ_OK;
}

/* A tall product (x W, A's entries stacked) written by strides into its
 * reader's memory (writes_strided): one matrix [count m, n], by rows with
 * its row stride as ldc, or by columns as the product of the transposed
 * operands, B^T A^T, dense A and B read transposed. */
static CudaProduct tall_strided_product(const MatmulPlan &p, const float *a, const float *b,
                                        float *c, const int64_t *strides) {
  int64_t ld = 0;
  bool by_columns = false;
  matmul_tall_output(&p, strides, &ld, &by_columns);
  const int rows = (int)(p.count * p.m), k = (int)p.k, n = (int)p.n;
  if (!by_columns) return {rows, n, k, 1, a, k, 0, b, n, 0, c, (int)ld, 0};
  return {n, rows, k, 1, b, n, 0, a, k, 0, c, (int)ld, 0, true, true};
}

extern "C" int cuda_eval_matmul(CUDA_KERNEL_SIGNATURE) {
  const Shape *as = &in[0].shape, *bs = &in[1].shape;
  int64_t total = shape_numel(&out[0].shape);
  if (total == 0) return TEQ_OK;
  if (as->ndim < 1 || bs->ndim < 1)
    return cuda_op_error(n, d, TEQ_ERR_INTERNAL, "operands of rank 0");
  MatmulPlan p;
  int rc = matmul_plan(n, as, bs, &p, d);
  if (rc) return rc;
  const float *a = (const float *)in[0].data, *b = (const float *)in[1].data;
  float *c = (float *)out[0].data;
  const int act = (int)param_int(&n->params, MATMUL_ACT);
  if (p.k == 0) { /* empty sums */
    CUDA_TRY(cudaMemsetAsync(c, 0, (size_t)total * sizeof(float), cx->stream));
    return cuda_act_apply(cx, act, c, total, d);
  }
  if (!fits_int(p.m) || !fits_int(p.n) || !fits_int(p.k))
    return cuda_op_error(n, d, TEQ_ERR_UNSUPPORTED,
                        "product of [%lld, %lld] by [%lld, %lld] is too large for cuBLAS",
                        (long long)p.m, (long long)p.k, (long long)p.k, (long long)p.n);
  const int k = (int)p.k, nn = (int)p.n;

  /* B shared by every batch entry and A not broadcast (the plan's flat_a):
   * A's entries stack into one tall matrix, one GEMM (the common x @ W).
   * Not matmul_uniform_suffix: where every batch extent is 1, or there is none (a
   * 2-D x W, BERT's [1, 64, 1024] x [1024, 1024]), it reports A's step as
   * 0, and such products never reached the tall product or its splits. */
  if (p.flat_a && !in[0].strides && !in[1].strides && fits_int(p.count * p.m)) {
    if (out[0].strides) { /* no activation: writes_strided */
      rc = cuda_product(cx, tall_strided_product(p, a, b, c, out[0].strides), d);
      if (rc == TEQ_OK) cuda_note(cx, "cublas:gemm, written by strides");
      return rc;
    }
    int rows = (int)(p.count * p.m), splits = 1;
    if ((rc = tall_way(n, cx, rows, nn, k, a, b, c, act, &splits, d))) return rc;
    return tall_product(cx, splits, rows, nn, k, a, b, c, act, d);
  }
  /* Otherwise the longest suffix of batch dims over which both operands
   * step uniformly runs as one strided-batched GEMM, once per entry of the
   * remaining outer dims ([2,1,5,7] x [3,7,4]: 2 calls of 3). */
  rc = batched_products(n, p, in, out[0], [&](const CudaProduct &pr) {
    if (!pr.a_at) return cuda_product(cx, pr, d);
    /* The arrays go to the device once, kept with the plan: its layout,
     * and so every entry's pointers, hold while it lives. */
    size_t count = (size_t)pr.batch, bytes = 3 * count * sizeof(void *);
    bool fresh = false;
    void **kept = (void **)cuda_plan_kept(cx, n, CUDA_KEPT_POINTERS, bytes, &fresh);
    if (!kept)
      return cuda_op_error(n, d, TEQ_ERR_INTERNAL, "no memory kept for the product's pointers%s",
                           cx->capturing ? " while capturing (the first run should have made it)"
                                         : "");
    if (fresh) {
      std::vector<const void *> host(3 * count);
      for (size_t t = 0; t < count; t++)
        host[t] = pr.a_at[t], host[count + t] = pr.b_at[t], host[2 * count + t] = pr.c_at[t];
      CUDA_TRY(cudaMemcpy(kept, host.data(), bytes, cudaMemcpyHostToDevice));
    }
    CudaProduct on_device = pr;
    on_device.a_at = (const float *const *)kept;
    on_device.b_at = (const float *const *)(kept + count);
    on_device.c_at = (float *const *)(kept + 2 * count);
    return cuda_product(cx, on_device, d);
  }, d);
  /* A product written by strides has no activation (writes_strided). */
  return rc ? rc : cuda_act_apply(cx, act, c, total, d);
}

extern "C" int cuda_matmul_on_host(const Node *n, const Shape *shapes, const float *const *data,
                                   const int64_t *const *strides, float *y,
                                   const int64_t *y_strides, Diag *d) {
  if (n->kind != OP_MATMUL || n->n_in != 2) {
    diag_error(d, "%s: only a matmul's products run by strides", op_def(n->kind)->name);
    return TEQ_ERR_UNSUPPORTED;
  }
  CudaTensor in[2], out = {y, n->out[0], DT_F32, y_strides};
  for (int j = 0; j < 2; j++) in[j] = {(void *)data[j], shapes[j], DT_F32, strides[j]};
  for (int j = 0; j < 2; j++)
    if (strides[j] && !op_def(n->kind)->reads_strided(n, shapes, j, strides[j])) {
      diag_error(d, "matmul: operand %d's strides are not ones cuBLAS reads", j);
      return TEQ_ERR_UNSUPPORTED;
    }
  if (y_strides && !op_def(n->kind)->writes_strided(n, shapes, y_strides)) {
    diag_error(d, "matmul: the output's strides are not ones cuBLAS writes");
    return TEQ_ERR_UNSUPPORTED;
  }
  MatmulPlan p;
  int rc = matmul_plan(n, &shapes[0], &shapes[1], &p, d);
  if (rc) return rc;
  if ((p.flat_a && (!y_strides || strides[0] || strides[1])) || !p.m || !p.n || !p.k ||
      !fits_int(p.m) || !fits_int(p.n) || !fits_int(p.k)) {
    diag_error(d, "matmul: the host check takes batched products of nonzero extents, and tall "
                  "ones written by strides");
    return TEQ_ERR_UNSUPPORTED;
  }
  if (p.flat_a) {
    cuda_product_on_host(tall_strided_product(p, (const float *)data[0], (const float *)data[1], y,
                                              y_strides));
    return TEQ_OK;
  }
  rc = batched_products(n, p, in, out, [](const CudaProduct &pr) {
    cuda_product_on_host(pr);
    return TEQ_OK;
  }, d);
  if (rc) return rc;
  UnaryArgs act = fused_act_args((int)param_int(&n->params, MATMUL_ACT));
  int64_t total = p.count * p.m * p.n;
  for (int64_t t = 0; t < total && !y_strides; t++) y[t] = act_eval(act, y[t]);
  return TEQ_OK;
}

/* ---- gemm ---- */

/* One gemm's operands and parameters, as both of its ways take them: y
 * [m, nn] = act(alpha a' b' + beta c + z), c broadcast (element (i, j) at
 * i ci + j cj) or NULL (no C, or beta 0), z [m, nn] or NULL. */
struct GemmArgs {
  int m, nn, k;
  bool ta, tb;
  float alpha, beta;
  const float *a, *b, *c;
  int64_t ci, cj;
  int act;
  float *y;
  const float *z;
};

/* Element t of C broadcast to [M, N] (and scaled, for an empty product):
 * s * c[i * ci + j * cj] for t = i n + j, as matmul.c's gemm_c_strides
 * places it (an extent-1 or missing dim repeats). */
__host__ __device__ __forceinline__ float broadcast_c_at(const float *c, int64_t t, int64_t n,
                                                        int64_t ci, int64_t cj, float s) {
  int64_t i = t / n, j = t % n;
  return s * c[i * ci + j * cj];
}

__global__ void broadcast_c_kernel(const float *__restrict__ c, float *__restrict__ y, int64_t m,
                                   int64_t n, int64_t ci, int64_t cj, float s) {
  int64_t total = m * n;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x)
    y[t] = broadcast_c_at(c, t, n, ci, cj, s);
}

/* What the plain way writes into y before the product where there is a
 * residual: z + beta C (C broadcast; none: z). */
__host__ __device__ __forceinline__ float residual_c_at(const float *z, const float *c, int64_t t,
                                                       int64_t n, int64_t ci, int64_t cj,
                                                       float beta) {
  return c ? z[t] + broadcast_c_at(c, t, n, ci, cj, beta) : z[t];
}

__global__ void residual_c_kernel(const float *__restrict__ z, const float *__restrict__ c,
                                  float *__restrict__ y, int64_t m, int64_t n, int64_t ci,
                                  int64_t cj, float beta) {
  int64_t total = m * n;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
       t += (int64_t)gridDim.x * blockDim.x)
    y[t] = residual_c_at(z, c, t, n, ci, cj, beta);
}

/* The plain way's product: Y = alpha A' B' + beta Y over C broadcast into
 * Y (beta 0 without C). Row-major B [K, N] is column-major B^T with ld N;
 * a transposed B is stored [N, K], column-major [K, N] with ld K. */
static CudaProduct gemm_product(const GemmArgs &g) {
  return {g.m, g.nn, g.k, 1, g.a, g.ta ? g.m : g.k, 0, g.b, g.tb ? g.k : g.nn, 0, g.y, g.nn, 0,
          g.ta, g.tb, g.alpha, g.z ? 1.0f : g.c ? g.beta : 0.0f};
}

/* The plain way: C broadcast into y (an empty product leaves y = beta C),
 * cublasSgemm with beta over it, then the activation's own pass; with a
 * residual, z + beta C into y and the product added at beta 1. */
static int gemm_plain(CudaCtx *cx, const GemmArgs &g, Diag *d) {
  int64_t m = g.m, nn = g.nn;
  if (g.z) {
    residual_c_kernel<<<cuda_blocks(m * nn, THREADS), THREADS, 0, cx->stream>>>(
        g.z, g.c, g.y, m, nn, g.ci, g.cj, g.beta);
    CUDA_LAUNCHED();
  } else if (g.c) {
    float s = g.k == 0 ? g.beta : 1.0f;
    if (g.ci == nn && g.cj == 1 && s == 1.0f)
      CUDA_TRY(cudaMemcpyAsync(g.y, g.c, (size_t)(m * nn) * sizeof(float),
                               cudaMemcpyDeviceToDevice, cx->stream));
    else {
      broadcast_c_kernel<<<cuda_blocks(m * nn, THREADS), THREADS, 0, cx->stream>>>(
          g.c, g.y, m, nn, g.ci, g.cj, s);
      CUDA_LAUNCHED();
    }
  } else if (g.k == 0) {
    CUDA_TRY(cudaMemsetAsync(g.y, 0, (size_t)(m * nn) * sizeof(float), cx->stream));
  }
  if (g.k > 0) {
    int rc = cuda_product(cx, gemm_product(g), d);
    if (rc) return rc;
    cuda_note(cx, "cublas:gemm");
  }
  return cuda_act_apply(cx, g.act, g.y, m * nn, d);
}

/* Whether the cuBLASLt way takes g: alpha 1, C (if any) one value per
 * column at beta 1, the activation none or relu, and something to fuse. */
static bool gemm_lt_applies(const GemmArgs &g) {
  bool bias = g.c && g.beta == 1.0f && g.ci == 0 && g.cj == 1;
  return g.k > 0 && g.alpha == 1.0f && (!g.c || bias) && (g.act == ACT_NONE || g.act == ACT_RELU) &&
         (g.c || g.z || g.act == ACT_RELU);
}

/* g as cuBLASLt takes it: C the bias, the residual its C. */
static LtArgs gemm_lt_args(const GemmArgs &g) {
  return {g.m, g.nn, g.k, g.ta, g.tb, g.a, g.b, g.c, g.act, g.y, g.z};
}

/* The cuBLASLt way: C as the bias and the relu in the product's epilogue,
 * one kernel where the plain way runs two or three. TEQ_ERR_UNSUPPORTED,
 * with nothing in d, where cuBLASLt has no algorithm. */
static int gemm_lt(CudaCtx *cx, const GemmArgs &g, Diag *d) {
  bool done;
  int rc = lt_product(cx, gemm_lt_args(g), &done, d);
  return rc ? rc : done ? TEQ_OK : TEQ_ERR_UNSUPPORTED;
}

/* Which way runs g: the cuBLASLt one, where it applies, is timed against
 * the plain one on the first run and the faster remembered (cuBLASLt's
 * heuristic picks among kernels it does not time, and a product of one
 * row, VGG's classifier at batch 1, is a matrix-vector product that
 * cublasSgemm runs at the memory's speed). A pinned way is taken if
 * offered. */
static int gemm_way(const Node *n, CudaCtx *cx, const GemmArgs &g, bool *lt, Diag *d) {
  *lt = false;
  if (!gemm_lt_applies(g)) return TEQ_OK;
  if (const char *pin = cuda_pinned_way(cx)) {
    char names[2][CUDA_WAY_NAME_MAX] = {"cublas:gemm", ""};
    snprintf(names[1], sizeof names[1], "%s", lt_way_name(gemm_lt_args(g)));
    int i = 0;
    int rc = cuda_pinned_index(n, pin, names, 2, &i, d);
    *lt = i == 1;
    return rc;
  }
  uint64_t key = hash_mix(0x67656d6d /* "gemm" */, (uint64_t)g.m);
  key = hash_mix(hash_mix(hash_mix(key, (uint64_t)g.nn), (uint64_t)g.k), (uint64_t)g.act);
  key = hash_mix(key, (uint64_t)(g.ta + 2 * g.tb + 4 * (g.c != nullptr) + 8 * (g.z != nullptr)));
  key = hash_mix(key, (uint64_t)(cuda_alignment_of(g.a) + 512 * cuda_alignment_of(g.b) +
                                 512 * 512 * (g.z ? cuda_alignment_of(g.z) : 0)));
  int64_t memo[2];
  if (cuda_memo_get(cx, key, memo)) return *lt = memo[0] != 0, TEQ_OK;
  if (cx->capturing)
    return cuda_op_error(n, d, TEQ_ERR_INTERNAL,
                         "no way remembered for this gemm while capturing (the first run "
                         "should have timed them)");
  float plain_ms = 0, lt_ms = 0;
  int rc = cuda_time_calls(cx, [&] { return gemm_plain(cx, g, d); }, &plain_ms, d);
  if (rc) return rc;
  Diag quiet; /* cuBLASLt without an algorithm is passed over, not reported */
  diag_init(&quiet);
  rc = cuda_time_calls(cx, [&] { return gemm_lt(cx, g, &quiet); }, &lt_ms, &quiet);
  if (rc != TEQ_OK && rc != TEQ_ERR_UNSUPPORTED) diag_error(d, "%s", diag_last(&quiet));
  diag_fini(&quiet);
  if (rc != TEQ_OK && rc != TEQ_ERR_UNSUPPORTED) return rc;
  *lt = rc == TEQ_OK && lt_ms < plain_ms;
  memo[0] = *lt, memo[1] = 0;
  cuda_memo_put(cx, key, memo);
  return TEQ_OK;
}

/* Node n's GemmArgs over operands a, b, c and z (c, z: NULL where n has
 * none) of shapes as, bs, cs and output y. TEQ_ERR_UNSUPPORTED where an
 * extent passes cuBLAS's int. */
static int gemm_args(const Node *n, const Shape *as, const Shape *bs, const Shape *cs,
                     const float *a, const float *b, const float *c, const float *z, float *y,
                     GemmArgs *g, Diag *d) {
  if (as->ndim != 2 || bs->ndim != 2)
    return cuda_op_error(n, d, TEQ_ERR_INTERNAL, "operands must be matrices");
  const Params *pr = &n->params;
  bool ta = param_int(pr, GEMM_TRANS_A), tb = param_int(pr, GEMM_TRANS_B);
  int64_t m = as->d[ta ? 1 : 0], k = as->d[ta ? 0 : 1], nn = bs->d[tb ? 0 : 1];
  if (!fits_int(m) || !fits_int(nn) || !fits_int(k))
    return cuda_op_error(n, d, TEQ_ERR_UNSUPPORTED,
                        "product of [%lld, %lld] by [%lld, %lld] is too large for cuBLAS",
                        (long long)m, (long long)k, (long long)k, (long long)nn);
  float beta = (float)param_float(pr, GEMM_BETA);
  *g = {(int)m, (int)nn, (int)k, ta, tb, (float)param_float(pr, GEMM_ALPHA), beta, a, b,
        c && beta != 0.0f ? c : nullptr, 0, 0, (int)param_int(pr, GEMM_ACT), y, z};
  if (g->c) {
    int64_t rows = cs->ndim == 2 ? cs->d[0] : 1, cols = cs->ndim >= 1 ? cs->d[cs->ndim - 1] : 1;
    g->cj = cols == 1 ? 0 : 1, g->ci = rows == 1 ? 0 : cols;
  }
  return TEQ_OK;
}

/* The plain way on the host (cuda_kernel_on_host): C broadcast into the
 * output element by element as broadcast_c_kernel's threads do (with the
 * residual, as residual_c_kernel's), the product from the description the
 * device passes cuBLAS, the activation. */
int cuda_gemm_on_host(const char *way, const Node *n, Tensor *const *in, Tensor *out, Diag *d) {
  if (!way || strcmp(way, "cublas:gemm") != 0) {
    diag_error(d, "gemm: no host check of way \"%s\" (cublas:gemm)", way ? way : "(none)");
    return TEQ_ERR_UNSUPPORTED;
  }
  GemmArgs g;
  bool has_c = n->n_in > 2, has_z = n->n_in > 3;
  int rc = gemm_args(n, &in[0]->shape, &in[1]->shape, has_c ? &in[2]->shape : nullptr,
                     (const float *)in[0]->data, (const float *)in[1]->data,
                     has_c ? (const float *)in[2]->data : nullptr,
                     has_z ? (const float *)in[3]->data : nullptr, (float *)out->data, &g, d);
  if (rc) return rc;
  int64_t total = (int64_t)g.m * g.nn;
  for (int64_t t = 0; t < total; t++)
    g.y[t] = g.z   ? residual_c_at(g.z, g.c, t, g.nn, g.ci, g.cj, g.beta)
             : g.c ? broadcast_c_at(g.c, t, g.nn, g.ci, g.cj, g.k == 0 ? g.beta : 1.0f)
                   : 0.0f;
  if (g.k > 0) cuda_product_on_host(gemm_product(g));
  UnaryArgs act = fused_act_args(g.act);
  for (int64_t t = 0; t < total; t++) g.y[t] = act_eval(act, g.y[t]);
  return TEQ_OK;
}

extern "C" int cuda_eval_gemm(CUDA_KERNEL_SIGNATURE) {
  if (shape_numel(&out[0].shape) == 0) return TEQ_OK;
  GemmArgs g;
  bool has_c = n->n_in > 2, has_z = n->n_in > 3;
  int rc = gemm_args(n, &in[0].shape, &in[1].shape, has_c ? &in[2].shape : nullptr,
                     (const float *)in[0].data, (const float *)in[1].data,
                     has_c ? (const float *)in[2].data : nullptr,
                     has_z ? (const float *)in[3].data : nullptr, (float *)out[0].data, &g, d);
  if (rc) return rc;
  bool lt = false;
  if ((rc = gemm_way(n, cx, g, &lt, d))) return rc;
  if (lt && (rc = gemm_lt(cx, g, d)) != TEQ_ERR_UNSUPPORTED) return rc;
  return gemm_plain(cx, g, d); /* timed with cuBLASLt, refused now: the plain way */
}
