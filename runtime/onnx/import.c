/* PLACEHOLDER */
#include "runtime/onnx.h"
int onnx_import_file(const char *path, const OnnxImportOptions *opts, Graph **out, OnnxImportStats *stats, Diag *d) {
  (void)opts; (void)out; (void)stats;
  return diag_error(d, "%s: ONNX import not written yet", path);
}
