/* names.c: the string map import and export use for tensor names, and a
 * printf that allocates. Keys are borrowed: the map never copies or frees
 * them, so they must outlive it (they live in the model being read or
 * written). Open addressing with linear probing, kept at most half full. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/onnx/onnx_int.h"

static size_t name_hash(const char *s) {
  return (size_t)hash_bytes(0x6e616d65, s, strlen(s));
}

static size_t find_slot(const OnnxNames *t, const char *key) {
  size_t i = name_hash(key) & (t->cap - 1);
  while (t->keys[i] && strcmp(t->keys[i], key) != 0) i = (i + 1) & (t->cap - 1);
  return i;
}

static int grow(OnnxNames *t) {
  size_t cap = t->cap ? t->cap * 2 : 64;
  OnnxNames n = {calloc(cap, sizeof *n.keys), malloc(cap * sizeof *n.vals), cap, 0};
  if (!n.keys || !n.vals) {
    free(n.keys);
    free(n.vals);
    return TEQ_ERR_NOMEM;
  }
  for (size_t i = 0; i < t->cap; i++)
    if (t->keys[i]) {
      size_t j = find_slot(&n, t->keys[i]);
      n.keys[j] = t->keys[i];
      n.vals[j] = t->vals[i];
      n.n++;
    }
  onnx_names_fini(t);
  *t = n;
  return TEQ_OK;
}

int onnx_names_put(OnnxNames *t, const char *key, int32_t val) {
  if (2 * (t->n + 1) > t->cap && grow(t) != TEQ_OK) return TEQ_ERR_NOMEM;
  size_t i = find_slot(t, key);
  if (!t->keys[i]) t->n++;
  t->keys[i] = key;
  t->vals[i] = val;
  return TEQ_OK;
}

int32_t onnx_names_get(const OnnxNames *t, const char *key) {
  if (!t->cap) return -1;
  size_t i = find_slot(t, key);
  return t->keys[i] ? t->vals[i] : -1;
}

void onnx_names_fini(OnnxNames *t) {
  free(t->keys);
  free(t->vals);
  memset(t, 0, sizeof *t);
}

char *onnx_strdup_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  return s;
}
