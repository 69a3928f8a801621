/* proto.c: whole files in and out, and the boundary with protobuf-c.
 * protobuf-c signals a malformed message by returning NULL from unpack and
 * reports sizes from pack; these wrappers turn that into our error codes,
 * so the rest of runtime/onnx/ never calls protobuf-c's pack or unpack
 * directly. Messages we build are malloc'd field by field, so protobuf-c's
 * free_unpacked with the default allocator frees them too.
 *
 * A model's weights are most of its bytes (400 MB for BERT), and on a
 * virtual machine every fresh page costs a fault, so each copy counts:
 * a file is mapped, not read; the unpacked weights are handed to tensors
 * (tensor_adopt) rather than copied; a model is packed straight into the
 * file rather than into a buffer first. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "runtime/onnx/onnx_int.h"

/* Reads a pipe or other unsized file into a malloc'd buffer, doubling. */
static int read_stream(FILE *f, const char *path, size_t cap, OnnxFileData *out, Diag *d) {
  size_t n = 0;
  uint8_t *buf = malloc(cap + 1);
  int rc = buf ? TEQ_OK : TEQ_ERR_NOMEM;
  while (rc == TEQ_OK) {
    n += fread(buf + n, 1, cap - n, f);
    if (ferror(f)) {
      diag_error(d, "%s: cannot read: %s", path, strerror(errno));
      rc = TEQ_ERR_IO;
    } else if (n < cap) {
      break;
    } else {
      uint8_t *b = cap <= SIZE_MAX / 4 ? realloc(buf, cap * 2 + 1) : NULL;
      if (!b) rc = TEQ_ERR_NOMEM;
      else buf = b, cap *= 2;
    }
  }
  if (rc != TEQ_OK) {
    if (rc == TEQ_ERR_NOMEM) diag_error(d, "%s: out of memory reading the file", path);
    free(buf);
    return rc;
  }
  *out = (OnnxFileData){.data = buf, .len = n};
  return TEQ_OK;
}

int onnx_file_read(const char *path, OnnxFileData *out, Diag *d) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    diag_error(d, "%s: cannot open: %s", path, strerror(errno));
    return TEQ_ERR_IO;
  }
  /* A regular file is mapped, its pages read ahead in one go (the decoder
   * walks it front to back once); anything else is read. */
  struct stat st;
  int rc;
  if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
      (uint64_t)st.st_size < SIZE_MAX / 2) {
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fileno(f), 0);
    if (map != MAP_FAILED) {
      *out = (OnnxFileData){.data = map, .len = len, .mapped = true};
      rc = TEQ_OK;
    } else {
      rc = read_stream(f, path, len + 1, out, d); /* +1: reaching EOF needs n < cap */
    }
  } else {
    rc = read_stream(f, path, 1 << 16, out, d);
  }
  fclose(f);
  return rc;
}

void onnx_file_release(OnnxFileData *f) {
  if (f->mapped) munmap((void *)f->data, f->len);
  else free((void *)f->data);
  *f = (OnnxFileData){0};
}

/* protobuf-c allocates every field of an unpacked message through this.
 * Blocks of a page or more (the raw_data of weights) are tensor blocks
 * (aligned to 64 bytes, huge pages for megabytes) so tensor_adopt can take
 * them over; free() frees both kinds, so
 * free_unpacked's default allocator frees what this allocated. */
static void *unpack_alloc(void *unused, size_t size) {
  (void)unused;
  if (size < 4096) return malloc(size);
  return tensor_block_alloc(size);
}

static void unpack_free(void *unused, void *p) {
  (void)unused;
  free(p);
}

static ProtobufCAllocator unpack_allocator = {unpack_alloc, unpack_free, NULL};

int onnx_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                ProtobufCMessage **out) {
  ProtobufCMessage *m = protobuf_c_message_unpack(desc, &unpack_allocator, len, data);
  if (!m) return TEQ_ERR_INPUT;
  *out = m;
  return TEQ_OK;
}

int onnx_pack(const ProtobufCMessage *m, uint8_t **data, size_t *len) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return TEQ_ERR_NOMEM;
  size_t w = protobuf_c_message_pack(m, buf);
  if (w != n) {
    free(buf);
    return TEQ_ERR_INTERNAL;
  }
  *data = buf;
  *len = n;
  return TEQ_OK;
}

/* protobuf-c's output sink writing to a file: pack_to_buffer hands it each
 * field as it goes, and a weight's bytes straight from the tensor. */
typedef struct FileSink {
  ProtobufCBuffer base;
  FILE *f;
  bool failed;
} FileSink;

static void sink_append(ProtobufCBuffer *b, size_t len, const uint8_t *data) {
  FileSink *s = (FileSink *)b;
  if (!s->failed && len && fwrite(data, 1, len, s->f) != len) s->failed = true;
}

int onnx_pack_to_file(const ProtobufCMessage *m, const char *path, Diag *d) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    diag_error(d, "%s: cannot create: %s", path, strerror(errno));
    return TEQ_ERR_IO;
  }
  FileSink sink = {.base = {.append = sink_append}, .f = f};
  protobuf_c_message_pack_to_buffer(m, &sink.base);
  int bad = sink.failed || ferror(f);
  int saved = errno;
  if (fclose(f) != 0) bad = 1, saved = errno;
  if (bad) {
    diag_error(d, "%s: cannot write: %s", path, strerror(saved));
    return TEQ_ERR_IO;
  }
  return TEQ_OK;
}

void onnx_message_free(void *m) {
  if (m) protobuf_c_message_free_unpacked(m, NULL);
}
