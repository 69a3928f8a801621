/* proto.c: whole files in and out, and the boundary with protobuf-c.
 * protobuf-c signals a malformed message by returning NULL from unpack and
 * reports sizes from pack; these wrappers turn that into our error codes,
 * so the rest of runtime/onnx/ never calls protobuf-c's pack or unpack
 * directly. Messages we build are malloc'd field by field, so protobuf-c's
 * free_unpacked with the default allocator frees them too. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/onnx/onnx_int.h"

int onnx_file_read(const char *path, uint8_t **data, size_t *len, Diag *d) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    diag_error(d, "%s: cannot open: %s", path, strerror(errno));
    return TEQ_ERR_IO;
  }
  /* A regular file is read in one call into a buffer of its size; the
   * doubling below is for pipes (a 100 MB model would otherwise be copied
   * by realloc several times over). */
  struct stat st;
  size_t cap = 1 << 16, n = 0;
  if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
    cap = (size_t)st.st_size + 1; /* +1: reaching EOF below needs n < cap */
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
  fclose(f);
  if (rc != TEQ_OK) {
    if (rc == TEQ_ERR_NOMEM) diag_error(d, "%s: out of memory reading the file", path);
    free(buf);
    return rc;
  }
  buf[n] = 0;
  *data = buf;
  *len = n;
  return TEQ_OK;
}

int onnx_file_write(const char *path, const uint8_t *data, size_t len, Diag *d) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    diag_error(d, "%s: cannot create: %s", path, strerror(errno));
    return TEQ_ERR_IO;
  }
  size_t n = fwrite(data, 1, len, f);
  int bad = n != len || ferror(f);
  if (fclose(f) != 0) bad = 1;
  if (bad) {
    diag_error(d, "%s: cannot write: %s", path, strerror(errno));
    return TEQ_ERR_IO;
  }
  return TEQ_OK;
}

int onnx_unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                ProtobufCMessage **out) {
  ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, data);
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

int onnx_pack_to_file(const ProtobufCMessage *m, const char *path, Diag *d) {
  uint8_t *buf;
  size_t len;
  int rc = onnx_pack(m, &buf, &len);
  if (rc != TEQ_OK) {
    diag_error(d, "%s: cannot serialize: %s", path, teq_strerror(rc));
    return rc;
  }
  rc = onnx_file_write(path, buf, len, d);
  free(buf);
  return rc;
}

void onnx_message_free(void *m) {
  if (m) protobuf_c_message_free_unpacked(m, NULL);
}
