/* external.c: weights kept in files beside the model (ONNX external data).
 *
 * A protobuf message cannot exceed 2 GiB, so larger models keep their
 * initializers' bytes in other files, and many exporters do so for any
 * model: such a TensorProto has data_location EXTERNAL and external_data
 * entries "location" (a file name relative to the model's directory),
 * "offset" and "length" (decimal byte counts). Reading maps each named
 * file once per import; a location that is absolute or climbs out of the
 * model's directory ("..") is refused, as the ONNX checker refuses it, so
 * a model cannot make Teq read an arbitrary file. "checksum" is not
 * checked (it is optional, and nothing else writes one).
 *
 * Writing is the reverse: initializers of at least a given size go, in
 * order and 64-byte aligned, into one file beside the exported model, and
 * their TensorProtos point there. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/onnx/onnx_int.h"

enum { EXTERNAL_ALIGN = 64 }; /* where each tensor starts in a file written here */

typedef struct MappedFile {
  char *location; /* as the model names it */
  const uint8_t *data;
  size_t len;
} MappedFile;

struct OnnxExternal {
  char *dir; /* the model's directory, ending in '/' (or empty: the current one) */
  MappedFile *files;
  int n_files;
};

OnnxExternal *onnx_external_new(const char *model_path) {
  OnnxExternal *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  const char *slash = strrchr(model_path, '/');
  size_t n = slash ? (size_t)(slash - model_path) + 1 : 0;
  x->dir = malloc(n + 1);
  if (!x->dir) {
    free(x);
    return NULL;
  }
  memcpy(x->dir, model_path, n);
  x->dir[n] = '\0';
  return x;
}

void onnx_external_free(OnnxExternal *x) {
  if (!x) return;
  for (int i = 0; i < x->n_files; i++) {
    if (x->files[i].len) munmap((void *)x->files[i].data, x->files[i].len);
    free(x->files[i].location);
  }
  free(x->files);
  free(x->dir);
  free(x);
}

bool onnx_tensor_is_external(const Onnx__TensorProto *tp) {
  return tp->n_external_data ||
         (tp->has_data_location &&
          tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL);
}

/* The value of key in tp's external_data, or NULL. */
static const char *entry(const Onnx__TensorProto *tp, const char *key) {
  for (size_t i = 0; i < tp->n_external_data; i++)
    if (tp->external_data[i]->key && !strcmp(tp->external_data[i]->key, key))
      return tp->external_data[i]->value;
  return NULL;
}

/* A decimal byte count; false for anything else (signs, spaces, overflow). */
static bool parse_count(const char *s, uint64_t *out) {
  if (!s || !*s) return false;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  *out = v;
  return true;
}

/* Whether location names a file at or below the model's directory. */
static bool location_is_inside(const char *loc) {
  if (!*loc || loc[0] == '/') return false;
  for (const char *p = loc; *p;) {
    size_t n = strcspn(p, "/");
    if (n == 2 && p[0] == '.' && p[1] == '.') return false;
    p += n;
    if (*p == '/') p++;
  }
  return true;
}

static int map_file(OnnxExternal *x, const char *loc, const char *where, MappedFile **out,
                    Diag *d) {
  for (int i = 0; i < x->n_files; i++)
    if (!strcmp(x->files[i].location, loc)) {
      *out = &x->files[i];
      return TEQ_OK;
    }
  size_t plen = strlen(x->dir) + strlen(loc) + 1;
  char *path = malloc(plen);
  MappedFile *grown = realloc(x->files, (size_t)(x->n_files + 1) * sizeof *grown);
  if (grown) x->files = grown;
  char *copy = strdup(loc);
  if (!path || !grown || !copy) {
    free(path), free(copy);
    diag_error(d, "%s: out of memory", where);
    return TEQ_ERR_NOMEM;
  }
  snprintf(path, plen, "%s%s", x->dir, loc);
  int rc = TEQ_OK;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  const uint8_t *data = NULL;
  size_t len = 0;
  if (fd < 0) {
    diag_error(d, "%s: its data file '%s' cannot be opened: %s", where, path, strerror(errno));
    rc = TEQ_ERR_IO;
  } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    diag_error(d, "%s: its data file '%s' is not a regular file", where, path);
    rc = TEQ_ERR_IO;
  } else if (st.st_size > 0) {
    len = (size_t)st.st_size;
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      diag_error(d, "%s: its data file '%s' cannot be mapped: %s", where, path, strerror(errno));
      rc = TEQ_ERR_IO;
    } else {
      data = m;
      madvise(m, len, MADV_WILLNEED);
    }
  }
  if (fd >= 0) close(fd);
  free(path);
  if (rc != TEQ_OK) {
    free(copy);
    return rc;
  }
  x->files[x->n_files] = (MappedFile){.location = copy, .data = data, .len = data ? len : 0};
  *out = &x->files[x->n_files++];
  return TEQ_OK;
}

int onnx_external_bytes(OnnxExternal *x, const Onnx__TensorProto *tp, size_t bytes,
                        const char *where, const uint8_t **out, Diag *d) {
  if (!x) {
    diag_error(d, "%s: its data is in an external file, which Teq reads only for the "
                  "initializers of a model read from a file", where);
    return TEQ_ERR_UNSUPPORTED;
  }
  const char *loc = entry(tp, "location");
  const char *off_s = entry(tp, "offset"), *len_s = entry(tp, "length");
  uint64_t off = 0, len = bytes;
  if (!loc) return diag_error(d, "%s: external data without a 'location'", where);
  if (!location_is_inside(loc))
    return diag_error(d, "%s: external data location '%s' is not a file name relative to the "
                         "model's directory (absolute paths and '..' are refused)", where, loc);
  if (off_s && !parse_count(off_s, &off))
    return diag_error(d, "%s: external data offset '%s' is not a byte count", where, off_s);
  if (len_s && !parse_count(len_s, &len))
    return diag_error(d, "%s: external data length '%s' is not a byte count", where, len_s);
  if (len != bytes)
    return diag_error(d, "%s: external data of %llu bytes for a shape of %zu bytes", where,
                      (unsigned long long)len, bytes);
  MappedFile *f;
  int rc = map_file(x, loc, where, &f, d);
  if (rc != TEQ_OK) return rc;
  if (off > f->len || bytes > f->len - off)
    return diag_error(d, "%s: external data at bytes %llu..%llu of '%s', which has %zu", where,
                      (unsigned long long)off, (unsigned long long)(off + bytes), loc, f->len);
  *out = f->data ? f->data + off : (const uint8_t *)"";
  return TEQ_OK;
}

/* ---- writing ---- */

static Onnx__StringStringEntryProto *new_entry(const char *key, const char *value) {
  Onnx__StringStringEntryProto *e = malloc(sizeof *e);
  if (!e) return NULL;
  onnx__string_string_entry_proto__init(e);
  e->key = strdup(key);
  e->value = strdup(value);
  if (!e->key || !e->value) {
    onnx_message_free(e);
    return NULL;
  }
  return e;
}

/* Points tp at [off, off + len) of location instead of its raw_data, which
 * was written there. raw_data keeps its pointer (a lent one is taken back,
 * an owned one freed, as before) but is no longer packed. */
static int point_outside(Onnx__TensorProto *tp, const char *location, uint64_t off,
                         uint64_t len) {
  char offs[24], lens[24];
  snprintf(offs, sizeof offs, "%llu", (unsigned long long)off);
  snprintf(lens, sizeof lens, "%llu", (unsigned long long)len);
  Onnx__StringStringEntryProto **v = malloc(3 * sizeof *v);
  if (!v) return TEQ_ERR_NOMEM;
  v[0] = new_entry("location", location);
  v[1] = new_entry("offset", offs);
  v[2] = new_entry("length", lens);
  if (!v[0] || !v[1] || !v[2]) {
    for (int i = 0; i < 3; i++) onnx_message_free(v[i]);
    free(v);
    return TEQ_ERR_NOMEM;
  }
  tp->external_data = v;
  tp->n_external_data = 3;
  tp->has_data_location = 1;
  tp->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
  tp->has_raw_data = 0;
  return TEQ_OK;
}

int onnx_external_write(Onnx__TensorProto **tps, size_t n, const char *model_path,
                        const char *location, size_t min_bytes, int *n_moved, Diag *d) {
  *n_moved = 0;
  if (!location_is_inside(location) || strchr(location, '/'))
    return diag_error(d, "%s: external data file '%s' must be a plain file name (it is "
                         "written beside the model)", model_path, location);
  const char *slash = strrchr(model_path, '/');
  size_t dn = slash ? (size_t)(slash - model_path) + 1 : 0;
  size_t plen = dn + strlen(location) + 1;
  char *path = malloc(plen);
  if (!path) return diag_error(d, "%s: out of memory", model_path), TEQ_ERR_NOMEM;
  snprintf(path, plen, "%.*s%s", (int)dn, model_path, location);
  static const uint8_t zeros[EXTERNAL_ALIGN];
  FILE *f = NULL; /* created with the first tensor moved */
  uint64_t at = 0;
  int rc = TEQ_OK, saved = 0;
  for (size_t i = 0; i < n && rc == TEQ_OK; i++) {
    Onnx__TensorProto *tp = tps[i];
    if (!tp->has_raw_data || !tp->raw_data.len || tp->raw_data.len < min_bytes) continue;
    if (!f && !(f = fopen(path, "wb"))) {
      diag_error(d, "%s: cannot create: %s", path, strerror(errno));
      rc = TEQ_ERR_IO;
      break;
    }
    size_t pad = (size_t)((EXTERNAL_ALIGN - at % EXTERNAL_ALIGN) % EXTERNAL_ALIGN);
    if (fwrite(zeros, 1, pad, f) != pad ||
        fwrite(tp->raw_data.data, 1, tp->raw_data.len, f) != tp->raw_data.len) {
      saved = errno;
      diag_error(d, "%s: cannot write: %s", path, strerror(saved));
      rc = TEQ_ERR_IO;
      break;
    }
    at += pad;
    rc = point_outside(tp, location, at, tp->raw_data.len);
    at += tp->raw_data.len;
    if (rc == TEQ_OK) ++*n_moved;
    else diag_error(d, "%s: out of memory", path);
  }
  if (f && fclose(f) != 0 && rc == TEQ_OK) {
    diag_error(d, "%s: cannot write: %s", path, strerror(errno));
    rc = TEQ_ERR_IO;
  }
  free(path);
  return rc;
}
