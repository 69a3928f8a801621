/* opaque.c: what an opaque node must remember of the model it came from.
 * Teq stores every tensor as float32 or int64, but the operator it cannot
 * interpret may read or write bool, int32, double...; and the opset its
 * definition belongs to matters on export. OpaqueInfo has no fields for
 * this, so import writes it into the packed NodeProto's doc_string as one
 * line and export reads it back and clears it:
 *   teq:opset=13;in=1,9;out=9:2,-1,3;out=7:?
 * (element types of the inputs, then per output its element type and its
 * declared extents, -1 where symbolic, ? where the rank is unknown). */
#include <stdlib.h>
#include <string.h>

#include "runtime/onnx/onnx_int.h"

void onnx_opaque_meta_fini(OnnxOpaqueMeta *m) {
  free(m->in_elem);
  free(m->out_elem);
  free(m->out_shape);
  memset(m, 0, sizeof *m);
}

/* Appends printf output to a growing string; *s NULL after a failure. */
static void add(char **s, const char *fmt, long long v) {
  if (!*s) return;
  char *t = onnx_strdup_printf(fmt, *s, v);
  free(*s);
  *s = t;
}

char *onnx_opaque_mark(const OnnxOpaqueMeta *m) {
  char *s = onnx_strdup_printf(ONNX_OPSET_MARK "%d", m->opset);
  for (int i = 0; i < m->n_in; i++) add(&s, i ? "%s,%lld" : "%s;in=%lld", m->in_elem[i]);
  for (int o = 0; o < m->n_out; o++) {
    const Shape *sh = &m->out_shape[o];
    add(&s, "%s;out=%lld:", m->out_elem[o]);
    if (!shape_is_known(sh)) add(&s, "%s?", 0);
    for (int k = 0; k < sh->ndim; k++) add(&s, k ? "%s,%lld" : "%s%lld", sh->d[k]);
  }
  return s;
}

/* One "out=" field: "T:" then extents. */
static bool parse_output(const char *p, int32_t *elem, Shape *s) {
  char *end;
  memset(s, 0, sizeof *s);
  *elem = (int32_t)strtol(p, &end, 10);
  if (*end != ':') return false;
  p = end + 1;
  if (*p == '?') {
    s->ndim = SHAPE_UNKNOWN;
    return true;
  }
  while (*p && *p != ';' && s->ndim < TEQ_MAX_DIMS) {
    s->d[s->ndim++] = strtoll(p, &end, 10);
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p && *p != ';') return false;
  }
  return true;
}

static int count_fields(const char *s, const char *key) {
  int n = 0;
  for (const char *p = strstr(s, key); p; p = strstr(p + 1, key)) n++;
  return n;
}

bool onnx_opaque_unmark(const char *s, OnnxOpaqueMeta *m) {
  memset(m, 0, sizeof *m);
  size_t len = strlen(ONNX_OPSET_MARK);
  if (!s || strncmp(s, ONNX_OPSET_MARK, len) != 0) return false;
  m->opset = atoi(s + len);
  const char *in = strstr(s, ";in=");
  int n_out = count_fields(s, ";out=");
  m->in_elem = calloc(in ? strlen(in) : 1, sizeof *m->in_elem);
  m->out_elem = calloc((size_t)n_out + 1, sizeof *m->out_elem);
  m->out_shape = calloc((size_t)n_out + 1, sizeof *m->out_shape);
  if (!m->in_elem || !m->out_elem || !m->out_shape) {
    onnx_opaque_meta_fini(m);
    return false;
  }
  for (const char *p = in ? in + 4 : NULL; p && *p && *p != ';';) {
    char *end;
    m->in_elem[m->n_in++] = (int32_t)strtol(p, &end, 10);
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p != ';' && *p) break;
  }
  for (const char *p = strstr(s, ";out="); p; p = strstr(p + 1, ";out="))
    if (parse_output(p + 5, &m->out_elem[m->n_out], &m->out_shape[m->n_out])) m->n_out++;
  return true;
}
