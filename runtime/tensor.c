/* tensor.c: shapes, reference-counted tensors, and the hash and random
 * generator every module shares. A tensor is one allocation: the header,
 * then the data aligned to 64 bytes for the BLAS; an adopted tensor is a
 * header and the data it took over, told apart by where data points. */
#include "runtime/tensor.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "runtime/modp.h"

Shape shape_make(int ndim, const int64_t *dims) {
  Shape s;
  memset(&s, 0, sizeof s);
  s.ndim = ndim;
  for (int i = 0; i < ndim && i < TEQ_MAX_DIMS; i++) s.d[i] = dims[i];
  return s;
}

Shape shape_of(int ndim, ...) {
  Shape s;
  memset(&s, 0, sizeof s);
  s.ndim = ndim;
  va_list ap;
  va_start(ap, ndim);
  for (int i = 0; i < ndim && i < TEQ_MAX_DIMS; i++) s.d[i] = va_arg(ap, int);
  va_end(ap);
  return s;
}

int64_t shape_numel(const Shape *s) {
  if (s->ndim < 0) return -1;
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) n *= s->d[i];
  return n;
}

bool shape_equal(const Shape *a, const Shape *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->d[i] != b->d[i]) return false;
  return true;
}

bool shape_is_known(const Shape *s) { return s->ndim >= 0; }

int shape_broadcast(const Shape *a, const Shape *b, Shape *out, Diag *d) {
  Shape r;
  memset(&r, 0, sizeof r);
  r.ndim = a->ndim > b->ndim ? a->ndim : b->ndim;
  for (int i = 0; i < r.ndim; i++) {
    int ia = a->ndim - r.ndim + i, ib = b->ndim - r.ndim + i;
    int64_t da = ia >= 0 ? a->d[ia] : 1, db = ib >= 0 ? b->d[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
      return diag_error(d, "shapes %s and %s do not broadcast (dimension %d: %lld vs %lld)",
                        shape_format(a, sa, sizeof sa), shape_format(b, sb, sizeof sb), i,
                        (long long)da, (long long)db);
    }
    r.d[i] = da == 1 ? db : da;
  }
  *out = r;
  return TEQ_OK;
}

char *shape_format(const Shape *s, char *buf, size_t size) {
  if (s->ndim < 0) {
    snprintf(buf, size, "[?]");
    return buf;
  }
  size_t n = 0;
  n += (size_t)snprintf(buf, size, "[");
  for (int i = 0; i < s->ndim && n < size; i++)
    n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)s->d[i]);
  if (n < size) snprintf(buf + n, size - n, "]");
  return buf;
}

void shape_strides(const Shape *s, int64_t *strides) {
  int64_t st = 1;
  for (int i = s->ndim - 1; i >= 0; i--) {
    strides[i] = st;
    st *= s->d[i];
  }
}

/* The product of s's extents other than 0, times es, or -1 past max. */
static int64_t nonzero_bytes(const Shape *s, size_t es, int64_t max) {
  int64_t n = (int64_t)es;
  for (int i = 0; i < s->ndim; i++) {
    if (s->d[i] < 0) return -1;
    if (s->d[i] && n > max / s->d[i]) return -1;
    if (s->d[i]) n *= s->d[i];
  }
  return n;
}

bool shape_fits(const Shape *s, DType dt) {
  return s->ndim >= 0 && s->ndim <= TEQ_MAX_DIMS &&
         nonzero_bytes(s, dtype_size(dt), TEQ_BYTES_MAX) >= 0;
}

char *shape_too_large(const Shape *s, DType dt, char *buf, size_t size) {
  char f[SHAPE_STR_MAX];
  bool empty = false;
  for (int i = 0; i < s->ndim && i < TEQ_MAX_DIMS; i++) empty = empty || s->d[i] == 0;
  snprintf(buf, size, "shape %s is too large: its extents%s make more than 2^40 bytes of %s, "
           "the most Teq takes", shape_format(s, f, sizeof f), empty ? " other than 0" : "",
           dtype_name(dt));
  return buf;
}

size_t dtype_size(DType t) {
  switch (t) {
  case DT_F32: return 4;
  case DT_I64: return 8;
  case DT_MODP: return 4;
  }
  return 0;
}

const char *dtype_name(DType t) {
  switch (t) {
  case DT_F32: return "float32";
  case DT_I64: return "int64";
  case DT_MODP: return "modp";
  }
  return "?";
}

#define TENSOR_HEADER ((sizeof(Tensor) + 63) & ~(size_t)63)

/* Freed blocks of a quarter megabyte or more, kept for the next tensor of
 * the same size. optimize's exact checks run the same shapes over and over
 * between small allocations of the search; the allocator split a freed
 * block for those and took fresh pages for the next tensor, and on a
 * virtual machine the faults of those pages were a fifth of NasRNN's
 * search. At most BLOCKS_KEPT blocks and BLOCKS_BYTES bytes are kept. In
 * sanitizer builds a kept block is poisoned, so a use after the last
 * reference is still caught. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define KEPT_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define KEPT_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define KEPT_POISON(p, n) ((void)(p), (void)(n))
#define KEPT_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Blocks of HUGE_MIN bytes or more are aligned to transparent huge pages
 * and asked to be backed by them: one fault per 2 MB instead of one per
 * 4 KB page. Importing, folding and writing BERT's 400 MB of weights
 * faulted every page of them in, most of optimize's time outside the search. */
#define HUGE_PAGE ((size_t)2 << 20)
#define HUGE_MIN ((size_t)4 << 20)

enum { BLOCKS_KEPT = 16 };
#define BLOCKS_MIN ((size_t)256 << 10)
#define BLOCKS_BYTES ((size_t)512 << 20)

typedef struct KeptBlock {
  void *p;
  size_t size;
} KeptBlock;

static struct {
  pthread_mutex_t lock;
  KeptBlock b[BLOCKS_KEPT]; /* b[0] is the oldest */
  size_t bytes;
  int n;
} kept = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Takes kept block i out of the list (under the lock). */
static void *kept_remove(int i) {
  void *p = kept.b[i].p;
  kept.bytes -= kept.b[i].size;
  kept.n--;
  memmove(&kept.b[i], &kept.b[i + 1], (size_t)(kept.n - i) * sizeof kept.b[0]);
  return p;
}

static void *block_take(size_t size) {
  if (size < BLOCKS_MIN) return NULL;
  void *p = NULL;
  pthread_mutex_lock(&kept.lock);
  for (int i = kept.n - 1; i >= 0 && !p; i--)
    if (kept.b[i].size == size) p = kept_remove(i);
  pthread_mutex_unlock(&kept.lock);
  if (p) KEPT_UNPOISON(p, size);
  return p;
}

static void block_give(void *p, size_t size) {
  if (size < BLOCKS_MIN || size > BLOCKS_BYTES) {
    free(p);
    return;
  }
  KEPT_POISON(p, size);
  void *drop[BLOCKS_KEPT];
  int n_drop = 0;
  pthread_mutex_lock(&kept.lock);
  while (kept.n && (kept.n == BLOCKS_KEPT || kept.bytes + size > BLOCKS_BYTES))
    drop[n_drop++] = kept_remove(0);
  kept.b[kept.n++] = (KeptBlock){p, size};
  kept.bytes += size;
  pthread_mutex_unlock(&kept.lock);
  for (int i = 0; i < n_drop; i++) free(drop[i]); /* poisoned: ASan lets free unpoison it */
}

void *tensor_block_alloc(size_t size) {
  /* A block near TEQ_BYTES_MAX (a tensor at the bound, with its header and
   * alignment) is refused rather than asked for: the sanitizers' allocator
   * aborts on a request of a terabyte instead of failing it. */
  if (size > (size_t)TEQ_BYTES_MAX - 2 * HUGE_PAGE) return NULL;
  size = (size + 63) & ~(size_t)63;
  if (size < HUGE_MIN) return aligned_alloc(64, size);
  /* aligned_alloc wants a multiple of the alignment (sanitizers insist), but
   * only whole huge pages of what was asked are advised: the tail stays in
   * small pages, and the padding past it is never touched, so never backed. */
  void *p = aligned_alloc(HUGE_PAGE, (size + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
  if (p) madvise(p, size & ~(HUGE_PAGE - 1), MADV_HUGEPAGE); /* advice: failing changes nothing */
  return p;
}

/* Bytes of the block holding a tensor of `bytes` data bytes. */
static size_t block_size(size_t bytes) { return TENSOR_HEADER + ((bytes + 63) & ~(size_t)63); }

/* A tensor's header over data, one reference, extents past ndim zero. */
static Tensor *header_init(Tensor *t, DType dtype, const Shape *shape, void *data) {
  memset(t, 0, sizeof *t);
  t->refs = 1;
  t->dtype = dtype;
  t->shape = *shape;
  for (int i = shape->ndim; i < TEQ_MAX_DIMS; i++) t->shape.d[i] = 0;
  t->data = data;
  return t;
}

Tensor *tensor_new_uninit(DType dtype, const Shape *shape) {
  if (!shape_fits(shape, dtype)) return NULL;
  size_t bytes = (size_t)shape_numel(shape) * dtype_size(dtype);
  Tensor *t = block_take(block_size(bytes));
  if (!t) t = tensor_block_alloc(block_size(bytes));
  if (!t) return NULL;
  header_init(t, dtype, shape, (char *)t + TENSOR_HEADER);
#ifdef TEQ_POISON_UNINIT
  memset(t->data, 0xff, bytes); /* NaN as float32 */
#endif
  return t;
}

Tensor *tensor_new(DType dtype, const Shape *shape) {
  Tensor *t = tensor_new_uninit(dtype, shape);
  if (t) memset(t->data, 0, tensor_bytes(t));
  return t;
}

/* Counted atomically: threads running graphs that share constants (PET's
 * tests of mutants) take and drop references to the same tensors. */
Tensor *tensor_ref(Tensor *t) {
  if (t) __atomic_add_fetch(&t->refs, 1, __ATOMIC_RELAXED);
  return t;
}

Tensor *tensor_adopt(DType dtype, const Shape *shape, void *data) {
  Tensor *t = NULL;
  if (shape_fits(shape, dtype) && ((uintptr_t)data & 63) == 0) t = malloc(sizeof *t);
  if (!t) {
    free(data);
    return NULL;
  }
  return header_init(t, dtype, shape, data);
}

/* An adopted tensor over no data: tensor_unref's free(NULL) is nothing. */
Tensor *tensor_new_unbacked(DType dtype, const Shape *shape) {
  return tensor_adopt(dtype, shape, NULL);
}

Tensor *tensor_view(Tensor *base, const Shape *shape) {
  if (!base->data || !shape_fits(shape, base->dtype) ||
      shape_numel(shape) > tensor_numel(base))
    return NULL;
  Tensor *t = malloc(sizeof *t);
  if (!t) return NULL;
  header_init(t, base->dtype, shape, base->data)->base = tensor_ref(base);
  return t;
}

void tensor_unref(Tensor *t) {
  if (!t || __atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL)) return;
  if (t->base) {
    tensor_unref(t->base);
    free(t);
    return;
  }
  if (t->data != (char *)t + TENSOR_HEADER) { /* adopted */
    free(t->data);
    free(t);
    return;
  }
  block_give(t, block_size(tensor_bytes(t)));
}

Tensor *tensor_clone(const Tensor *t) {
  if (!t->data) return tensor_new_unbacked(t->dtype, &t->shape);
  Tensor *c = tensor_new(t->dtype, &t->shape);
  if (c) memcpy(c->data, t->data, tensor_bytes(t));
  return c;
}

int64_t tensor_numel(const Tensor *t) { return shape_numel(&t->shape); }

size_t tensor_bytes(const Tensor *t) {
  return (size_t)tensor_numel(t) * dtype_size(t->dtype);
}

uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
  /* FNV-1a-style lanes over 8-byte words: four independent chains, so the
   * multiplications overlap (gen-rules hashes every value it computes),
   * then the tail bytes, then one mix. */
  const unsigned char *b = p;
  uint64_t x[4] = {0xcbf29ce484222325ull ^ n, 0x84222325cbf29ce4ull, 0x9e3779b97f4a7c15ull,
                   0xbf58476d1ce4e5b9ull};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; l++) {
      uint64_t w;
      memcpy(&w, b + i + 8 * l, 8);
      x[l] = (x[l] ^ w) * 0x100000001b3ull;
      x[l] ^= x[l] >> 32;
    }
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    x[0] = (x[0] ^ w) * 0x100000001b3ull;
    x[0] ^= x[0] >> 32;
  }
  for (; i < n; i++) x[0] = (x[0] ^ b[i]) * 0x100000001b3ull;
  return hash_mix(hash_mix(hash_mix(hash_mix(h, x[0]), x[1]), x[2]), x[3]);
}

uint64_t tensor_content_hash(Tensor *t) {
  if (t->content_hash) return t->content_hash;
  uint64_t h = hash_mix(0x7465717465, (uint64_t)t->dtype);
  h = hash_bytes(h, &t->shape, sizeof t->shape);
  if (t->data) h = hash_bytes(h, t->data, tensor_bytes(t));
  else h = hash_mix(h, (uint64_t)(uintptr_t)t); /* unbacked: equal to itself alone */
  t->content_hash = h ? h : 1;
  return t->content_hash;
}

/* SplitMix64: the state steps by a constant, so draw i of a stream is
 * the mix of seed + (i + 1) * step, and a fill computes each element from
 * its index with no chain between them. */
static const uint64_t RNG_STEP = 0x9e3779b97f4a7c15ull;

static inline uint64_t rng_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rng_next(uint64_t *state) { return rng_mix(*state += RNG_STEP); }

/* Each element is drawn on its own, so the loops vectorise; with AVX-512
 * (x86-64-v4) the 64-bit multiplies of the mix are one instruction each,
 * and optimize's instance checks fill weights of a million elements. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
__attribute__((target_clones("arch=x86-64-v4", "default")))
#endif
void tensor_fill_random(Tensor *t, uint64_t seed) {
  int64_t n = tensor_numel(t);
  /* Element i takes draw i of rng_next from the seed. */
#define DRAW(i) rng_mix(seed + ((uint64_t)(i) + 1) * RNG_STEP)
  switch (t->dtype) {
  case DT_F32: {
    float *p = t->data;
    for (int64_t i = 0; i < n; i++) p[i] = (float)((double)(DRAW(i) >> 11) * 0x1.0p-52 - 1.0);
    break;
  }
  case DT_MODP: {
    uint32_t *p = t->data;
    for (int64_t i = 0; i < n; i++) p[i] = modp_reduce(DRAW(i) >> 2);
    break;
  }
  case DT_I64: {
    int64_t *p = t->data;
    for (int64_t i = 0; i < n; i++) p[i] = (int64_t)(DRAW(i) % 100);
    break;
  }
  }
#undef DRAW
  t->content_hash = 0;
}

double tensor_checksum(const Tensor *t) {
  double s = 0;
  int64_t n = tensor_numel(t);
  if (t->dtype == DT_F32) {
    const float *p = t->data;
    for (int64_t i = 0; i < n; i++) s += p[i];
  } else if (t->dtype == DT_I64) {
    const int64_t *p = t->data;
    for (int64_t i = 0; i < n; i++) s += (double)p[i];
  } else {
    const uint32_t *p = t->data;
    for (int64_t i = 0; i < n; i++) s += p[i];
  }
  return s;
}
