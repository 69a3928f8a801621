/* test_shape.c: shapes, broadcasting, tensors and the shared hash. */
#include <string.h>

#include "runtime/tensor.h"
#include "tests/check.h"

static void test_broadcast(void) {
  Diag d;
  diag_init(&d);
  Shape out, a = shape_of(4, 8, 1, 6, 1), b = shape_of(3, 7, 1, 5);
  CHECK_EQ_INT(shape_broadcast(&a, &b, &out, &d), TEQ_OK);
  Shape want = shape_of(4, 8, 7, 6, 5);
  CHECK(shape_equal(&out, &want));
  Shape s = shape_of(0), v = shape_of(1, 3);
  CHECK_EQ_INT(shape_broadcast(&s, &v, &out, &d), TEQ_OK);
  CHECK(shape_equal(&out, &v));
  Shape x = shape_of(2, 2, 3), y = shape_of(2, 4, 3);
  CHECK_EQ_INT(shape_broadcast(&x, &y, &out, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "[2, 3] and [4, 3] do not broadcast") != NULL, "%s", diag_last(&d));
  CHECK_EQ_INT(d.n_errors, 1);
  diag_fini(&d);
}

static void test_basics(void) {
  Shape s = shape_of(3, 2, 3, 4);
  CHECK_EQ_INT(shape_numel(&s), 24);
  int64_t st[TEQ_MAX_DIMS];
  shape_strides(&s, st);
  CHECK(st[0] == 12 && st[1] == 4 && st[2] == 1);
  char buf[SHAPE_STR_MAX];
  CHECK(strcmp(shape_format(&s, buf, sizeof buf), "[2, 3, 4]") == 0);
  Shape scalar = shape_of(0);
  CHECK_EQ_INT(shape_numel(&scalar), 1);
  CHECK(strcmp(shape_format(&scalar, buf, sizeof buf), "[]") == 0);
  Shape unknown = {.ndim = SHAPE_UNKNOWN};
  CHECK(!shape_is_known(&unknown));
  CHECK(strcmp(shape_format(&unknown, buf, sizeof buf), "[?]") == 0);
  Shape zero = shape_of(2, 0, 5);
  CHECK_EQ_INT(shape_numel(&zero), 0);
}

static void test_tensors(void) {
  Shape s = shape_of(2, 3, 5);
  Tensor *a = tensor_new(DT_F32, &s);
  CHECK(a && a->refs == 1 && ((uintptr_t)a->data % 64) == 0);
  CHECK_EQ_INT(tensor_bytes(a), 60);
  tensor_fill_random(a, 7);
  Tensor *b = tensor_clone(a);
  CHECK(memcmp(a->data, b->data, 60) == 0);
  CHECK(tensor_content_hash(a) == tensor_content_hash(b));
  Tensor *c = tensor_new(DT_F32, &s);
  tensor_fill_random(c, 8);
  CHECK(tensor_content_hash(a) != tensor_content_hash(c));
  float *p = a->data;
  for (int i = 0; i < 15; i++) CHECK(p[i] >= -1.0f && p[i] < 1.0f);
  CHECK(tensor_ref(a) == a && a->refs == 2);
  tensor_unref(a);
  tensor_unref(a);
  tensor_unref(b);
  tensor_unref(c);
  /* Overflowing sizes are refused, not wrapped. */
  Shape huge = shape_of(4, 1 << 30, 1 << 30, 1 << 30, 1 << 30);
  CHECK(tensor_new(DT_F32, &huge) == NULL);
  Shape neg = shape_of(1, -3);
  CHECK(tensor_new(DT_F32, &neg) == NULL);
  /* At most TEQ_BYTES_MAX, the extents of an empty shape counted too. */
  int64_t big = INT64_C(1) << 62;
  Shape empty_huge = shape_make(3, (int64_t[]){big, big, 0});
  CHECK(!shape_fits(&empty_huge, DT_F32) && tensor_new(DT_F32, &empty_huge) == NULL);
  Shape edge = shape_make(2, (int64_t[]){INT64_C(1) << 20, INT64_C(1) << 18}); /* 2^40 bytes */
  CHECK(shape_fits(&edge, DT_F32) && !shape_fits(&edge, DT_I64));
  Shape empty_ok = shape_make(3, (int64_t[]){0, INT64_C(1) << 20, 5});
  CHECK(shape_fits(&empty_ok, DT_I64));
  Tensor *e = tensor_new(DT_F32, &empty_ok);
  CHECK(e && tensor_numel(e) == 0);
  tensor_unref(e);
  char why[SHAPE_MSG_MAX];
  CHECK_MSG(strstr(shape_too_large(&empty_huge, DT_F32, why, sizeof why),
                   "[4611686018427387904, 4611686018427387904, 0] is too large: its extents "
                   "other than 0 make more than 2^40 bytes of float32"), "%s", why);
  CHECK(!shape_fits(&neg, DT_F32));
}

/* A large tensor's block is kept when freed and given to the next tensor
 * of its size, zero-filled again by tensor_new; its contents do not leak
 * into a new tensor, and tensors of other sizes do not take it. */
static void test_kept_blocks(void) {
  Shape s = shape_of(2, 512, 1024), other = shape_of(2, 512, 1000);
  Tensor *a = tensor_new(DT_F32, &s);
  CHECK(a != NULL);
  tensor_fill_random(a, 3);
  void *where = a;
  tensor_unref(a);
  Tensor *b = tensor_new(DT_F32, &other);
  CHECK(b != NULL && (void *)b != where);
  Tensor *c = tensor_new(DT_F32, &s);
  CHECK_MSG((void *)c == where, "the freed block was not reused");
  bool zero = true;
  for (int64_t e = 0; c && e < tensor_numel(c); e++) zero &= ((float *)c->data)[e] == 0.0f;
  CHECK(zero);
  Tensor *d = tensor_new_uninit(DT_MODP, &s); /* same bytes, another block */
  CHECK(d != NULL && (void *)d != where && tensor_bytes(d) == tensor_bytes(c));
  tensor_unref(b);
  tensor_unref(c);
  tensor_unref(d);
}

/* Blocks of megabytes start on a huge page, so the kernel can back them
 * with huge pages; smaller ones on 64 bytes. Every byte asked for is
 * writable, and free() frees either kind. */
static void test_block_alloc(void) {
  const size_t sizes[] = {100, 64 << 10, (5 << 20) + 3, 8 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    unsigned char *p = tensor_block_alloc(sizes[i]);
    CHECK(p != NULL);
    if (!p) continue;
    uintptr_t align = sizes[i] >= (4 << 20) ? (uintptr_t)2 << 20 : 64;
    CHECK_MSG(((uintptr_t)p & (align - 1)) == 0, "block of %zu bytes misaligned", sizes[i]);
    memset(p, 0xab, sizes[i]);
    CHECK(p[sizes[i] - 1] == 0xab);
    free(p);
  }
  /* A tensor of megabytes, in such a block, reads back what it was given. */
  Shape s = shape_of(2, 1536, 1024);
  Tensor *t = tensor_new(DT_F32, &s);
  CHECK(t != NULL);
  if (!t) return;
  tensor_fill_random(t, 5);
  Tensor *u = tensor_clone(t);
  CHECK(u != NULL && memcmp(u->data, t->data, tensor_bytes(t)) == 0);
  tensor_unref(u);
  tensor_unref(t);
}

/* A view is its base's first elements in its own shape, holds the base
 * alive after the caller lets it go, and refuses more elements than the
 * base has, or a base with none. */
static void test_view(void) {
  Shape s = shape_of(2, 4, 6), fewer = shape_of(3, 2, 2, 3), more = shape_of(2, 5, 6);
  Tensor *t = tensor_new(DT_MODP, &s);
  CHECK(t != NULL);
  if (!t) return;
  tensor_fill_random(t, 9);
  Tensor *v = tensor_view(t, &fewer), *whole = tensor_view(t, &(Shape){.ndim = 1, .d = {24}});
  CHECK(v && whole && v->data == t->data && v->dtype == DT_MODP);
  CHECK(tensor_numel(v) == 12 && shape_equal(&v->shape, &fewer));
  CHECK(tensor_view(t, &more) == NULL);
  Tensor *none = tensor_new_unbacked(DT_F32, &s);
  CHECK(none && tensor_view(none, &fewer) == NULL);
  tensor_unref(none);
  uint32_t first[12];
  memcpy(first, t->data, sizeof first);
  tensor_unref(t); /* the views hold it */
  CHECK(memcmp(v->data, first, sizeof first) == 0);
  tensor_unref(whole);
  CHECK(memcmp(v->data, first, sizeof first) == 0);
  tensor_unref(v);
}

/* A tensor with a shape and no elements: its size is its shape's, it
 * clones to another such tensor, and it hashes equal to itself alone, so
 * two of one shape are never taken for the same weight. */
static void test_unbacked(void) {
  Shape s = shape_of(2, 1024, 3072);
  Tensor *a = tensor_new_unbacked(DT_F32, &s), *b = tensor_new_unbacked(DT_F32, &s);
  CHECK(a && b && !a->data && !b->data);
  if (!a || !b) return;
  CHECK(shape_equal(&a->shape, &s) && tensor_bytes(a) == (size_t)1024 * 3072 * 4);
  CHECK(tensor_content_hash(a) == tensor_content_hash(a));
  CHECK(tensor_content_hash(a) != tensor_content_hash(b));
  Tensor *c = tensor_clone(a);
  CHECK(c && !c->data && shape_equal(&c->shape, &s) && c->dtype == DT_F32);
  Shape huge = shape_of(2, 1 << 30, 1 << 30);
  CHECK(tensor_new_unbacked(DT_F32, &huge) == NULL);
  tensor_unref(c);
  tensor_unref(b);
  tensor_unref(a);
}

static void test_diag(void) {
  Diag d;
  diag_init(&d);
  CHECK(strcmp(diag_last(&d), "") == 0);
  CHECK_EQ_INT(diag_error(&d, "model.onnx: node '%s': bad", "c1"), TEQ_ERR_INPUT);
  diag_warn(&d, "careful");
  CHECK_EQ_INT(d.n_errors, 1);
  CHECK_EQ_INT(d.n_warnings, 1);
  CHECK(strcmp(diag_last(&d), "warning: careful\n") == 0);
  CHECK(strstr(d.text, "error: model.onnx: node 'c1': bad\n") == d.text);
  CHECK_EQ_INT(teq_exit_status(TEQ_ERR_INPUT), 2);
  CHECK_EQ_INT(teq_exit_status(TEQ_ERR_UNSUPPORTED), 2);
  CHECK_EQ_INT(teq_exit_status(TEQ_ERR_INTERNAL), 1);
  CHECK_EQ_INT(teq_exit_status(TEQ_OK), 0);
  diag_error(NULL, "dropped"); /* must not crash */
  diag_fini(&d);
}

int main(void) {
  test_broadcast();
  test_basics();
  test_tensors();
  test_kept_blocks();
  test_block_alloc();
  test_unbacked();
  test_view();
  test_diag();
  return check_exit();
}
