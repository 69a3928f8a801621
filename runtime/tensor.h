/* tensor.h: shapes and reference-counted dense tensors.
 *
 * A Shape is up to TEQ_MAX_DIMS extents, row-major; ndim == SHAPE_UNKNOWN
 * marks the output of an opaque operator whose shape the model did not say.
 * A Tensor owns its data (a view shares its base's), contiguous and
 * row-major, in one of three element types: float32 (the CPU executor),
 * int64 (shape tensors read from ONNX) and Z_p residues stored as uint32_t
 * (the Z_p evaluator, see modp.h).
 *
 * Ownership: tensor_new returns a tensor with one reference; tensor_ref adds
 * one and tensor_unref drops one, freeing at zero. Graphs share constant
 * weights this way, so copying a graph never copies a weight. */
#ifndef TEQ_RUNTIME_TENSOR_H
#define TEQ_RUNTIME_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/err.h"

#define TEQ_MAX_DIMS 6
#define SHAPE_UNKNOWN (-1)

typedef struct Shape {
  int32_t ndim;              /* 0..TEQ_MAX_DIMS, or SHAPE_UNKNOWN */
  int64_t d[TEQ_MAX_DIMS];   /* entries past ndim are always 0 */
} Shape;

typedef enum DType { DT_F32, DT_I64, DT_MODP } DType;

typedef struct Tensor {
  int32_t refs;
  DType dtype;
  Shape shape;
  uint64_t content_hash; /* 0 until tensor_content_hash computes it */
  void *data;            /* numel elements of dtype; points into this block, or
                          * elsewhere (tensor_adopt), or NULL (tensor_new_unbacked) */
  struct Tensor *base;   /* tensor_view: data is base's, held by a reference; else NULL */
} Tensor;

/* Shapes. shape_make takes ndim extents; all return by value. */
TEQ_API Shape shape_make(int ndim, const int64_t *dims);
TEQ_API Shape shape_of(int ndim, ...); /* shape_of(2, 3, 4) is [3, 4]; extents are int */
TEQ_API int64_t shape_numel(const Shape *s);
TEQ_API bool shape_equal(const Shape *a, const Shape *b);
TEQ_API bool shape_is_known(const Shape *s);
/* Numpy broadcasting of a and b into out. Returns TEQ_OK, or TEQ_ERR_INPUT
 * with a message naming both shapes when they do not broadcast. */
TEQ_API int shape_broadcast(const Shape *a, const Shape *b, Shape *out, Diag *d);
/* Writes "[1, 3, 224, 224]" (or "[?]") into buf; returns buf. */
TEQ_API char *shape_format(const Shape *s, char *buf, size_t size);
#define SHAPE_STR_MAX 128
/* Row-major strides in elements. */
TEQ_API void shape_strides(const Shape *s, int64_t *strides);
/* The largest tensor Teq takes: 2^40 bytes, a terabyte, far past any
 * model. Every shape that enters a graph or a tensor is held to it
 * (shape_fits), so the products of its extents, its strides and its byte
 * offsets are all far inside int64 wherever they are computed. */
#define TEQ_BYTES_MAX (INT64_C(1) << 40)
/* Whether a tensor of shape s and element type dt is within TEQ_BYTES_MAX:
 * s known, every extent >= 0, and the extents other than 0 (so an empty
 * tensor's strides fit too) times the element size at most TEQ_BYTES_MAX;
 * computed without overflow. */
TEQ_API bool shape_fits(const Shape *s, DType dt);
/* Writes "shape [2, 0, 1099511627776] is too large: ..." (why shape_fits
 * refused it) into buf; returns buf. */
TEQ_API char *shape_too_large(const Shape *s, DType dt, char *buf, size_t size);
#define SHAPE_MSG_MAX 320

TEQ_API size_t dtype_size(DType t);
TEQ_API const char *dtype_name(DType t);

/* Tensors. tensor_new zero-fills; tensor_new_uninit leaves the data as
 * malloc gave it (in sanitizer builds it fills it with NaN bytes instead, so
 * a reader of unwritten elements shows up in tests). Both return NULL if the
 * shape does not fit (shape_fits) or memory runs out. */
TEQ_API Tensor *tensor_new(DType dtype, const Shape *shape);
TEQ_API Tensor *tensor_new_uninit(DType dtype, const Shape *shape);
/* A tensor over data the caller malloc'd (aligned to 64 bytes, holding the
 * shape's elements), which it takes over: freed with the tensor, also when
 * this returns NULL (as it does for a shape that does not fit). Lets an
 * importer keep a weight where the decoder put it instead of copying it. */
TEQ_API Tensor *tensor_adopt(DType dtype, const Shape *shape, void *data);
/* A tensor with a shape and no elements (data NULL): what optimize puts
 * in place of a weight it prices and never computes. It equals only
 * itself (tensor_content_hash), clones to another such tensor, and
 * nothing may read its data. NULL if the shape does not fit or memory
 * runs out. */
TEQ_API Tensor *tensor_new_unbacked(DType dtype, const Shape *shape);
/* The first elements of base, as many as shape holds, seen in that shape:
 * the same data, not a copy, kept alive by a reference to base. NULL if
 * base holds fewer elements (or none) or memory runs out. */
TEQ_API Tensor *tensor_view(Tensor *base, const Shape *shape);
/* size bytes aligned to 64 for tensor data (free() frees them); a block of
 * megabytes is backed by huge pages where the kernel allows, so filling it
 * faults once per 2 MB, not once per page. What tensors and an importer's
 * decoded weights are allocated with. NULL when memory runs out. */
TEQ_API void *tensor_block_alloc(size_t size);
TEQ_API Tensor *tensor_ref(Tensor *t);
TEQ_API void tensor_unref(Tensor *t);
TEQ_API Tensor *tensor_clone(const Tensor *t);
TEQ_API int64_t tensor_numel(const Tensor *t);
TEQ_API size_t tensor_bytes(const Tensor *t);
/* Hash of dtype, shape and every element; cached in the tensor, which must
 * not be written after the first call. */
TEQ_API uint64_t tensor_content_hash(Tensor *t);
/* Deterministic pseudo-random fill from a seed (splitmix64): F32 uniform in
 * [-1, 1), MODP uniform in [0, p), I64 in [0, 100). */
TEQ_API void tensor_fill_random(Tensor *t, uint64_t seed);
/* Sum of all F32 elements in double, for checksums. */
TEQ_API double tensor_checksum(const Tensor *t);

/* 64-bit hash mixing shared by every module that hashes structure. Inline:
 * gen-rules calls it several times for every graph it considers. */
static inline uint64_t hash_mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}
TEQ_API uint64_t hash_bytes(uint64_t h, const void *p, size_t n);
/* splitmix64: the one seeded generator behind every random input. */
TEQ_API uint64_t rng_next(uint64_t *state);

#endif
