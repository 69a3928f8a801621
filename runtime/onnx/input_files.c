/* input_files.c: a graph's input values read from files named on a command
 * line as NAME=FILE (run-model's inputs, optimize's check): a serialized
 * onnx.TensorProto when FILE ends in .pb, else raw little-endian elements
 * of the input's type and shape, exactly that many bytes, as numpy's
 * tofile writes them. The input's type and shape are the graph's, after
 * import fixed its symbolic extents; a file that disagrees is refused. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "runtime/onnx/onnx_int.h"

/* Whether "NAME=FILE" names input `name`. */
static bool spec_names(const char *spec, const char *name) {
  const char *eq = strchr(spec, '=');
  size_t n = eq ? (size_t)(eq - spec) : strlen(spec);
  return eq && name && strlen(name) == n && strncmp(spec, name, n) == 0;
}

const char *onnx_input_spec_file(const char *const *specs, int64_t n, const char *name) {
  for (int64_t k = 0; k < n; k++)
    if (spec_names(specs[k], name)) return strchr(specs[k], '=') + 1;
  return NULL;
}

int onnx_check_input_specs(const char *const *specs, int64_t n, const Graph *g, Diag *d) {
  for (int64_t k = 0; k < n; k++) {
    const char *eq = strchr(specs[k], '=');
    if (!eq || eq == specs[k]) return diag_error(d, "--input '%s': expected NAME=FILE", specs[k]);
    const char *name = NULL;
    for (int32_t i = 0; i < g->n_inputs && !name; i++)
      if (spec_names(specs[k], g->nodes[g->inputs[i]].name)) name = g->nodes[g->inputs[i]].name;
    if (!name) return diag_error(d, "--input %s: the model has no input of that name", specs[k]);
    /* the first spec of a name is the one read: a second would be ignored */
    if (onnx_input_spec_file(specs, k, name))
      return diag_error(d, "--input: input '%s' is given twice", name);
  }
  return TEQ_OK;
}

/* path as raw little-endian elements of type dt and shape s. */
static int read_raw(const char *path, DType dt, const Shape *s, Tensor **out, Diag *d) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    diag_error(d, "%s: cannot open: %s", path, strerror(errno));
    return TEQ_ERR_IO;
  }
  Tensor *t = tensor_new(dt, s);
  size_t want = t ? tensor_bytes(t) : 0, got = t ? fread(t->data, 1, want, f) : 0;
  int extra = fgetc(f) != EOF;
  fclose(f);
  char ss[SHAPE_STR_MAX];
  if (t && (got != want || extra)) {
    tensor_unref(t);
    return diag_error(d, "%s: expected exactly %zu bytes (%s %s), the file has %s", path, want,
                      dtype_name(dt), shape_format(s, ss, sizeof ss), extra ? "more" : "fewer");
  }
  if (!t) {
    diag_error(d, "%s: out of memory", path);
    return TEQ_ERR_NOMEM;
  }
  *out = t;
  return TEQ_OK;
}

int onnx_read_input_file(const char *path, const Node *in, Tensor **out, Diag *d) {
  size_t n = strlen(path);
  if (n < 3 || strcmp(path + n - 3, ".pb") != 0)
    return read_raw(path, in->dtype, &in->out[0], out, d);
  Tensor *t;
  int rc = onnx_read_tensor_file(path, &t, NULL, d);
  if (rc != TEQ_OK) return rc;
  if (t->dtype != in->dtype || !shape_equal(&t->shape, &in->out[0])) {
    char a[SHAPE_STR_MAX], b[SHAPE_STR_MAX];
    diag_error(d, "%s: a %s %s tensor, but input '%s' is %s %s", path, dtype_name(t->dtype),
               shape_format(&t->shape, a, sizeof a), in->name, dtype_name(in->dtype),
               shape_format(&in->out[0], b, sizeof b));
    tensor_unref(t);
    return TEQ_ERR_INPUT;
  }
  *out = t;
  return TEQ_OK;
}
