/* test_onnx.c: ONNX import and export on small real models.
 * The models in tests/data/onnx/ are written by make_models.py there, with
 * reference outputs computed by numpy. Checked here: values after running,
 * BatchNormalization folding against keep_batchnorm, no-op removal, the
 * shape subgraphs folded away (at two opsets), the export -> import round
 * trip (large weights lent at export and taken over at import, from a file
 * and from a pipe), opaque nodes carried through export and graph_copy with their
 * opset, element types and declared shapes (custom domains included), the
 * TensorProto files, valid forms Teq imports as other operators or as
 * several (a MaxPool's storage_order, reductions over no axes, variadic
 * Max and Min, 1-D convolutions and pools), and, for each kind of bad
 * file, a located message and
 * TEQ_ERR_INPUT or TEQ_ERR_UNSUPPORTED with the out-parameter untouched
 * (run under ASan, a leak fails the test too). */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/cost.h"
#include "runtime/exec.h"
#include "runtime/onnx.h"
#include "tests/tensor_check.h"

#define PATH_BUF 2048
static char data_dir[1024];
static char tmp_dir[64];

/* tests/data/onnx beside this file; meson runs tests from the build
 * directory, where __FILE__ is relative to it. TEQ_ONNX_TEST_DATA overrides. */
static void find_dirs(void) {
  const char *env = getenv("TEQ_ONNX_TEST_DATA");
  if (env) {
    snprintf(data_dir, sizeof data_dir, "%s", env);
  } else {
    snprintf(data_dir, sizeof data_dir, "%s", __FILE__);
    char *slash = strstr(data_dir, "runtime/test_onnx.c");
    if (slash) strcpy(slash, "data/onnx");
  }
  if (access(data_dir, R_OK) != 0) {
    fprintf(stderr, "test data not found at %s (set TEQ_ONNX_TEST_DATA)\n", data_dir);
    exit(1);
  }
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/teq_test_onnx_XXXXXX");
  if (!mkdtemp(tmp_dir)) exit(1);
}

static const char *data(const char *name, char *buf) {
  snprintf(buf, PATH_BUF, "%s/%s", data_dir, name);
  return buf;
}

static const char *tmp(const char *name, char *buf) {
  snprintf(buf, PATH_BUF, "%s/%s", tmp_dir, name);
  return buf;
}

static Tensor *read_tensor(const char *name) {
  char p[PATH_BUF];
  Tensor *t = NULL;
  Diag d;
  diag_init(&d);
  int rc = onnx_read_tensor_file(data(name, p), &t, NULL, &d);
  CHECK_MSG(rc == TEQ_OK, "%s: %s", name, d.text ? d.text : "");
  diag_fini(&d);
  return t;
}

static Graph *import(const char *path, const OnnxImportOptions *o, OnnxImportStats *st, Diag *d) {
  Graph *g = NULL;
  int rc = onnx_import_file(path, o, &g, st, d);
  CHECK_MSG(rc == TEQ_OK, "%s: %s", path, d->text ? d->text : "");
  return rc == TEQ_OK ? g : NULL;
}

/* g written as file in the temporary directory (its path into q), the
 * failure checked: TEQ_OK or the error. */
static int export_to_tmp(const Graph *g, const char *file, char *q) {
  Diag d;
  diag_init(&d);
  int rc = onnx_export_file(g, tmp(file, q), NULL, &d);
  CHECK_MSG(rc == TEQ_OK, "%s: %s", file, diag_last(&d));
  diag_fini(&d);
  return rc;
}

/* g written as file in the temporary directory and imported again with
 * options o (NULL: the defaults; given: as given, every fusion off), or
 * NULL, the failure checked. */
static Graph *written_and_read(const Graph *g, const char *file, const OnnxImportOptions *o,
                               bool given, OnnxImportStats *st, Diag *d) {
  char q[PATH_BUF];
  OnnxImportOptions as_given = ONNX_IMPORT_DEFAULTS;
  onnx_import_as_given(&as_given);
  return export_to_tmp(g, file, q) == TEQ_OK ? import(q, given ? &as_given : o, st, d) : NULL;
}

/* The gemm's configuration key (the cost tables') in g holds want. */
static void check_gemm_key(const Graph *g, const char *want) {
  char key[COST_KEY_MAX];
  for (int32_t i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].kind == OP_GEMM) {
      cost_config_key(g, i, key, sizeof key);
      CHECK_MSG(strstr(key, want) != NULL, "%s", key);
    }
}

/* Output 0 of g on input x (NULL: x must be absent, no inputs); the
 * others are dropped. */
static Tensor *run(const Graph *g, Tensor *x) {
  Tensor *out[4] = {NULL};
  Diag d;
  diag_init(&d);
  CHECK(!g || g->n_outputs <= 4);
  int rc = g && g->n_outputs <= 4 ? exec_run(g, EXEC_F32, &x, out, &d) : TEQ_ERR_INPUT;
  CHECK_MSG(rc == TEQ_OK, "exec: %s", d.text ? d.text : "");
  diag_fini(&d);
  for (int i = 1; i < 4; i++) tensor_unref(out[i]);
  return out[0];
}

static int count_kind(const Graph *g, OpKind k) {
  int n = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) n += g->nodes[i].kind == k;
  return n;
}

/* Imports MODEL.onnx with o, runs it on MODEL.input_0.pb and compares with
 * MODEL.output_0.pb; returns the output for further comparison. */
static Tensor *check_reference(const char *model, const OnnxImportOptions *o, OnnxImportStats *st) {
  char p[PATH_BUF], name[256];
  Diag d;
  diag_init(&d);
  snprintf(name, sizeof name, "%s.onnx", model);
  Graph *g = import(data(name, p), o, st, &d);
  snprintf(name, sizeof name, "%s.input_0.pb", model);
  Tensor *x = read_tensor(name);
  snprintf(name, sizeof name, "%s.output_0.pb", model);
  Tensor *want = read_tensor(name);
  Tensor *y = g && x ? run(g, x) : NULL;
  CHECK_MSG(max_abs_err(y, want) < 1e-5, "%s: max |y - reference| = %g", model,
            max_abs_err(y, want));
  if (g) CHECK_EQ_INT(graph_check(g, &d), TEQ_OK);
  tensor_unref(x);
  tensor_unref(want);
  graph_free(g);
  diag_fini(&d);
  return y;
}

static void test_conv_bn(void) {
  OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
  OnnxImportStats st;
  char p[PATH_BUF];
  Tensor *folded = check_reference("conv_bn", &o, &st);
  CHECK_EQ_INT(st.n_nodes, 13);
  CHECK_EQ_INT(st.opset, 13);
  CHECK_EQ_INT(st.n_batchnorm_folded, 1);
  CHECK_EQ_INT(st.n_noops_removed, 2); /* Identity and Dropout */
  CHECK_EQ_INT(st.n_folded, 4);        /* Shape, Gather, Unsqueeze, Concat */
  CHECK_EQ_INT(st.n_opaque, 0);

  Diag d;
  diag_init(&d);
  Graph *g = import(data("conv_bn.onnx", p), &o, NULL, &d);
  CHECK(d.text && strstr(d.text, "symbolic dimensions set to 1"));
  CHECK(d.text && strstr(d.text, "'N' (input 'x', dimension 0)"));
  if (g) {
    CHECK_EQ_INT(count_kind(g, OP_BATCHNORM), 0);
    CHECK_EQ_INT(count_kind(g, OP_IDENTITY), 0);
    CHECK_EQ_INT(count_kind(g, OP_CONV2D), 1);
    CHECK_EQ_INT(g->n_outputs, 1);
    CHECK(strcmp(g->output_names[0], "y") == 0);
    CHECK(shape_equal(graph_shape(g, g->outputs[0]), &(Shape){2, {1, 10}}));
  }
  graph_free(g);

  /* Kept BatchNormalization and no-ops compute the same values. */
  o.keep_batchnorm = true;
  o.keep_noops = true;
  Tensor *kept = check_reference("conv_bn", &o, &st);
  CHECK_EQ_INT(st.n_batchnorm_folded, 0);
  CHECK_EQ_INT(st.n_noops_removed, 0);
  CHECK_MSG(max_abs_err(folded, kept) < 1e-6, "folded vs kept: %g", max_abs_err(folded, kept));
  g = import(data("conv_bn.onnx", p), &o, NULL, &d);
  if (g) CHECK_EQ_INT(count_kind(g, OP_BATCHNORM), 1);
  if (g) CHECK_EQ_INT(count_kind(g, OP_IDENTITY), 2);
  graph_free(g);

  /* --batch: the symbolic dimension takes the given extent. */
  o = ONNX_IMPORT_DEFAULTS;
  o.batch = 3;
  g = import(data("conv_bn.onnx", p), &o, NULL, &d);
  if (g) CHECK(shape_equal(graph_shape(g, g->outputs[0]), &(Shape){2, {3, 10}}));
  graph_free(g);
  tensor_unref(folded);
  tensor_unref(kept);
  diag_fini(&d);
}

/* A layer normalization written out in nine operators imports as one
 * layer_norm, with the numpy reference's values; kept written out, it
 * computes the same. */
static void test_layer_norm_written(void) {
  OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
  OnnxImportStats st;
  char p[PATH_BUF];
  Tensor *fused = check_reference("layer_norm_written", &o, &st);
  CHECK_EQ_INT(st.n_layer_norms_fused, 1);
  Diag d;
  diag_init(&d);
  Graph *g = import(data("layer_norm_written.onnx", p), &o, NULL, &d);
  if (g) {
    CHECK_EQ_INT(count_kind(g, OP_LAYER_NORM), 1);
    CHECK_EQ_INT(graph_count_ops(g), 2); /* layer_norm, relu */
  }
  graph_free(g);
  o.keep_written_layer_norms = true;
  Tensor *kept = check_reference("layer_norm_written", &o, &st);
  CHECK_EQ_INT(st.n_layer_norms_fused, 0);
  CHECK_MSG(max_abs_err(fused, kept) < 1e-6, "fused vs kept: %g", max_abs_err(fused, kept));
  tensor_unref(fused);
  tensor_unref(kept);
  diag_fini(&d);
}

/* A written-out layer normalization whose epsilon has rank 4 computes a
 * tensor of rank 4 from x of rank 3: no layer_norm of x's shape does that,
 * so it stays written out, and the ReduceSum after it gets the rank it
 * reduces. */
static void test_layer_norm_rank_raised(void) {
  OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
  OnnxImportStats st;
  tensor_unref(check_reference("layer_norm_rank_raised", &o, &st));
  CHECK_EQ_INT(st.n_layer_norms_fused, 0);
}

static void test_shape_fold(void) {
  OnnxImportStats st;
  const char *models[] = {"shape_fold", "shape_fold_opset12"};
  for (int k = 0; k < 2; k++) {
    tensor_unref(check_reference(models[k], NULL, &st));
    CHECK_EQ_INT(st.n_nodes, 31);
    CHECK_EQ_INT(st.n_folded, 27); /* all but Reshape(x), Add(xr), and the two Mul(y..) */
    CHECK_EQ_INT(st.opset, k == 0 ? 13 : 12);
  }
  char p[PATH_BUF];
  Diag d;
  diag_init(&d);
  Graph *g = import(data("shape_fold.onnx", p), NULL, NULL, &d);
  if (g) CHECK_EQ_INT(graph_count_ops(g), 4);
  if (g) CHECK_EQ_INT(d.n_warnings, 0);
  graph_free(g);
  diag_fini(&d);
}

/* Slices with steps INT64_MAX and INT64_MIN and a Range across all of
 * int64 fold to the values ONNX gives, with no overflow on the way. */
static void test_int_extremes(void) {
  OnnxImportStats st;
  tensor_unref(check_reference("int_extremes", NULL, &st));
  CHECK_EQ_INT(st.n_folded, 6);
}

static void test_unsorted(void) {
  OnnxImportStats st;
  tensor_unref(check_reference("unsorted", NULL, &st));
  CHECK_EQ_INT(st.n_folded, 0);
}

/* ScatterND folded on int64 and float constants; Dropouts whose masks
 * nothing reads, one in training mode at ratio 0, removed. */
static void test_scatter_dropout(void) {
  OnnxImportStats st;
  tensor_unref(check_reference("scatter_dropout", NULL, &st));
  CHECK_EQ_INT(st.opset, 16);
  char p[PATH_BUF];
  Diag d;
  diag_init(&d);
  Graph *g = import(data("scatter_dropout.onnx", p), NULL, NULL, &d);
  if (g) CHECK_EQ_INT(graph_count_ops(g), 3); /* reshape, add of the folded mask, relu */
  if (g) CHECK_EQ_INT(count_kind(g, OP_OPAQUE), 0);
  if (g) CHECK_EQ_INT(d.n_warnings, 0);
  graph_free(g);
  diag_fini(&d);
}

/* Export, import the result, and compare outputs on the same input. */
static void check_round_trip(const char *model) {
  char p[PATH_BUF], q[PATH_BUF], name[256];
  Diag d;
  diag_init(&d);
  snprintf(name, sizeof name, "%s.onnx", model);
  Graph *g = import(data(name, p), NULL, NULL, &d);
  snprintf(name, sizeof name, "%s.rt.onnx", model);
  int rc = g ? onnx_export_file(g, tmp(name, q), NULL, &d) : TEQ_ERR_INPUT;
  CHECK_MSG(rc == TEQ_OK, "export %s: %s", model, d.text ? d.text : "");
  OnnxImportStats st;
  Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  snprintf(name, sizeof name, "%s.input_0.pb", model);
  Tensor *x = read_tensor(name);
  Tensor *a = g ? run(g, x) : NULL, *b = h ? run(h, x) : NULL;
  CHECK_MSG(max_abs_err(a, b) == 0, "%s: export changed the output by %g", model,
            max_abs_err(a, b));
  if (h) {
    CHECK_EQ_INT(st.n_folded + st.n_batchnorm_folded + st.n_noops_removed, 0);
    CHECK_EQ_INT(graph_count_ops(h), graph_count_ops(g));
    CHECK(strcmp(h->output_names[0], g->output_names[0]) == 0);
    CHECK(strcmp(h->nodes[h->inputs[0]].name, "x") == 0);
  }
  tensor_unref(x);
  tensor_unref(a);
  tensor_unref(b);
  graph_free(g);
  graph_free(h);
  diag_fini(&d);
}

static bool is_opaque(const Node *n, const char *op_type) {
  return n->kind == OP_OPAQUE && strcmp(n->opaque->op_type, op_type) == 0;
}

static const Node *find_opaque(const Graph *g, const char *op_type) {
  for (int32_t i = 0; i < g->n_nodes; i++)
    if (is_opaque(&g->nodes[i], op_type)) return &g->nodes[i];
  return NULL;
}

/* onnx_opaque_identity pairs each opaque node of g with the one written
 * from it in h (the export renamed its tensors and the node), and only
 * nodes of the same operator: of the two Sins, alike, each matches both;
 * Sin, Cos, CumSum and Hardmax nothing of another kind. */
static void check_opaque_identities(const Graph *g, const Graph *h) {
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const Node *a = &g->nodes[i];
    if (a->kind != OP_OPAQUE) continue;
    uint8_t *ba = NULL;
    size_t la = 0;
    CHECK_EQ_INT(onnx_opaque_identity(a->opaque, &ba, &la), TEQ_OK);
    int same = 0;
    for (int32_t j = 0; ba && j < h->n_nodes; j++) {
      const Node *b = &h->nodes[j];
      if (b->kind != OP_OPAQUE) continue;
      uint8_t *bb = NULL;
      size_t lb = 0;
      CHECK_EQ_INT(onnx_opaque_identity(b->opaque, &bb, &lb), TEQ_OK);
      bool alike = bb && la == lb && memcmp(ba, bb, la) == 0;
      CHECK_MSG(!alike || !strcmp(a->opaque->op_type, b->opaque->op_type),
                "%s alike %s", a->opaque->op_type, b->opaque->op_type);
      same += alike;
      free(bb);
    }
    CHECK_MSG(same == (strcmp(a->opaque->op_type, "Sin") ? 1 : 2), "%s: %d alike in the file",
              a->opaque->op_type, same);
    free(ba);
  }
}

static void test_opaque(void) {
  char p[PATH_BUF], q[PATH_BUF];
  Diag d;
  diag_init(&d);
  OnnxImportStats st;
  Graph *g = import(data("opaque.onnx", p), NULL, &st, &d);
  CHECK_EQ_INT(st.n_opaque, 5);
  CHECK(d.text &&
        strstr(d.text, "opaque.onnx: 2 nodes of unsupported operator 'Sin' kept as opaque"));
  CHECK(d.text && strstr(d.text, "1 node of unsupported operator 'Hardmax'"));
  CHECK_EQ_INT(d.n_errors, 0);
  const Node *sin = g ? find_opaque(g, "Sin") : NULL;
  CHECK(sin && shape_equal(&sin->out[0], &(Shape){2, {2, 4}})); /* from value_info */
  const Node *cos = g ? find_opaque(g, "Cos") : NULL;
  CHECK(cos && shape_equal(&cos->out[0], &(Shape){2, {2, 4}})); /* element-wise */
  const Node *cumsum = g ? find_opaque(g, "CumSum") : NULL;
  CHECK(cumsum && !shape_is_known(&cumsum->out[0])); /* declared nowhere */
  const Node *hardmax = g ? find_opaque(g, "Hardmax") : NULL;
  CHECK(hardmax && shape_equal(&hardmax->out[0], &(Shape){2, {2, 4}})); /* graph output */
  int rc = g ? onnx_export_file(g, tmp("opaque.rt.onnx", q), NULL, &d) : TEQ_ERR_INPUT;
  CHECK_EQ_INT(rc, TEQ_OK);
  Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  CHECK_EQ_INT(st.n_opaque, 5);
  if (h) CHECK(find_opaque(h, "Hardmax") && find_opaque(h, "Cos") && find_opaque(h, "CumSum"));
  if (g && h) check_opaque_identities(g, h);
  /* Running it names the operator the CPU cannot run. */
  Tensor *out[1] = {NULL};
  Shape s = {2, {2, 4}};
  Tensor *x = tensor_new(DT_F32, &s);
  diag_fini(&d);
  if (h) CHECK(exec_run(h, EXEC_F32, &x, out, &d) != TEQ_OK && strstr(d.text, "Sin"));
  tensor_unref(x);
  graph_free(g);
  graph_free(h);
  diag_fini(&d);
}

static int count_opaque(const Graph *g, const char *op_type) {
  int n = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) n += is_opaque(&g->nodes[i], op_type);
  return n;
}

/* Bool values between opaque operators: shapes follow the element-wise
 * operators, the Cast of x to its own type disappears, and export hands
 * Where a bool mask again through an added Cast (checked against ONNX
 * Runtime by hand: the export runs and matches the reference). */
static void test_opaque_types(void) {
  char p[PATH_BUF], q[PATH_BUF];
  Diag d;
  diag_init(&d);
  OnnxImportStats st;
  Graph *g = import(data("opaque_types.onnx", p), NULL, &st, &d);
  CHECK_EQ_INT(st.n_opaque, 4);
  CHECK_EQ_INT(st.n_noops_removed, 1);
  Shape s23 = {2, {2, 3}};
  const Node *where = g ? find_opaque(g, "Where") : NULL;
  CHECK(where && shape_equal(&where->out[0], &s23) && where->dtype == DT_F32);
  const Node *greater = g ? find_opaque(g, "Greater") : NULL;
  CHECK(greater && greater->dtype == DT_I64); /* bool, held as int64 */
  CHECK(greater && greater->opaque->opset == 13 && greater->opaque->out_elem[0] == 9);
  CHECK(where && where->opaque->n_in == 3 && where->opaque->in_elem[0] == 9); /* bool mask */
  if (g) CHECK(shape_equal(graph_shape(g, g->outputs[0]), &s23));
  int rc = g ? onnx_export_file(g, tmp("opaque_types.rt.onnx", q), NULL, &d) : TEQ_ERR_INPUT;
  CHECK_EQ_INT(rc, TEQ_OK);
  Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  /* The added Cast of the constant mask folds again on import. */
  CHECK_EQ_INT(st.n_opaque, 4);
  CHECK_EQ_INT(st.n_folded, 1);
  if (h) CHECK_EQ_INT(count_opaque(h, "Cast"), 1);
  if (h) CHECK(shape_equal(graph_shape(h, h->outputs[0]), &s23));
  graph_free(g);
  graph_free(h);
  diag_fini(&d);
}

/* Appends a string field (tag, length under 128, bytes) to a protobuf
 * message being written by hand into buf. */
static size_t put_string(uint8_t *buf, size_t at, int field, const char *s) {
  size_t n = strlen(s);
  buf[at++] = (uint8_t)(field << 3 | 2);
  buf[at++] = (uint8_t)n;
  memcpy(buf + at, s, n);
  return at + n;
}

#define MYSTERY_DOC "the original doc_string"

/* x -> com.example.teq Mystery (opset 3) -> a, b: a float input, an int64
 * output of declared shape [2, ?] and a bool output of undeclared shape. */
static Graph *opaque_meta_graph(Diag *d) {
  Graph *g = graph_new();
  Shape s = {2, {2, 3}};
  int x = graph_add_input(g, "x", &s, DT_F32, d);
  uint8_t buf[256];
  size_t n = 0; /* onnx.NodeProto: 1 input, 2 output, 3 name, 4 op_type, 6 doc_string, 7 domain */
  n = put_string(buf, n, 1, "x");
  n = put_string(buf, n, 2, "a");
  n = put_string(buf, n, 2, "b");
  n = put_string(buf, n, 3, "mystery");
  n = put_string(buf, n, 4, "Mystery");
  n = put_string(buf, n, 6, MYSTERY_DOC);
  n = put_string(buf, n, 7, "com.example.teq");
  OpaqueInfo *info = calloc(1, sizeof *info);
  *info = (OpaqueInfo){.op_type = strdup("Mystery"), .domain = strdup("com.example.teq"),
                       .proto = malloc(n), .proto_len = n, .opset = 3, .n_in = 1,
                       .in_elem = malloc(sizeof(int32_t)), .n_out = 2,
                       .out_elem = malloc(2 * sizeof(int32_t)),
                       .out_declared = calloc(2, sizeof(Shape))};
  memcpy(info->proto, buf, n);
  info->in_elem[0] = 1;                     /* FLOAT */
  info->out_elem[0] = 7;                    /* INT64 */
  info->out_elem[1] = 9;                    /* BOOL */
  info->out_declared[0] = (Shape){2, {2, -1}};
  info->out_declared[1].ndim = SHAPE_UNKNOWN;
  Shape outs[2] = {{SHAPE_UNKNOWN, {0}}, {SHAPE_UNKNOWN, {0}}};
  DType dts[2] = {DT_I64, DT_I64};
  int o = graph_add_opaque(g, info, (TensorRef[]){{x, 0}}, 1, 2, outs, dts, "mystery", d);
  CHECK(x >= 0 && o >= 0);
  graph_add_output(g, (TensorRef){o, 0}, "a", d);
  graph_add_output(g, (TensorRef){o, 1}, "b", d);
  return g;
}

static void check_mystery(const Graph *g, const char *what) {
  const Node *n = g ? find_opaque(g, "Mystery") : NULL;
  const OpaqueInfo *o = n ? n->opaque : NULL;
  CHECK_MSG(o && strcmp(o->domain, "com.example.teq") == 0, "%s", what);
  if (!o) return;
  CHECK_MSG(o->opset == 3, "%s: opset %d", what, o->opset);
  CHECK_MSG(o->n_in == 1 && o->in_elem && o->in_elem[0] == 1, "%s: inputs", what);
  CHECK_MSG(o->n_out == 2 && o->out_elem && o->out_elem[0] == 7 && o->out_elem[1] == 9,
            "%s: output types", what);
  CHECK_MSG(o->out_declared && shape_equal(&o->out_declared[0], &(Shape){2, {2, -1}}) &&
                !shape_is_known(&o->out_declared[1]),
            "%s: declared shapes", what);
  CHECK_MSG(n->dtype == DT_I64 && !shape_is_known(&n->out[0]), "%s: node", what);
}

/* What an opaque node remembers of its model (opset, element types,
 * declared shapes) survives graph_copy, as a deep copy (the original is
 * freed first: ASan catches sharing), and export -> import; the exported
 * NodeProto keeps its own doc_string. */
static void test_opaque_meta(void) {
  Diag d;
  diag_init(&d);
  Graph *g = opaque_meta_graph(&d);
  CHECK_EQ_INT(graph_check(g, &d), TEQ_OK);
  check_mystery(g, "built");
  Graph *c = graph_copy(g);
  CHECK(c && graph_hash(c, NULL) == graph_hash(g, NULL));
  graph_free(g);
  check_mystery(c, "copy");
  char q[PATH_BUF];
  int rc = c ? onnx_export_file(c, tmp("meta.rt.onnx", q), NULL, &d) : TEQ_ERR_INPUT;
  CHECK_MSG(rc == TEQ_OK, "%s", d.text ? d.text : "");
  FILE *fp = fopen(q, "rb");
  char buf[4096];
  size_t n = fp ? fread(buf, 1, sizeof buf, fp) : 0;
  if (fp) fclose(fp);
  CHECK(n > 0 && n < sizeof buf && memmem(buf, n, MYSTERY_DOC, strlen(MYSTERY_DOC)));
  CHECK(!memmem(buf, n, "teq:", 4));
  OnnxImportStats st;
  Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  check_mystery(h, "export -> import");
  CHECK_EQ_INT(d.n_errors, 0);
  graph_free(c);
  graph_free(h);
  diag_fini(&d);
}

static void test_custom_domain(void) {
  char p[PATH_BUF], q[PATH_BUF];
  Diag d;
  diag_init(&d);
  OnnxImportStats st;
  Graph *g = import(data("custom_domain.onnx", p), NULL, &st, &d);
  CHECK_EQ_INT(st.n_opaque, 1);
  const Node *f = g ? find_opaque(g, "Frobnicate") : NULL;
  CHECK(f && strcmp(f->opaque->domain, "com.example.teq") == 0);
  CHECK(d.text && strstr(d.text, "operator 'Frobnicate' (domain com.example.teq) kept as opaque"));
  int rc = g ? onnx_export_file(g, tmp("custom.rt.onnx", q), NULL, &d) : TEQ_ERR_INPUT;
  CHECK_EQ_INT(rc, TEQ_OK);
  Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  f = h ? find_opaque(h, "Frobnicate") : NULL;
  CHECK(f && strcmp(f->opaque->domain, "com.example.teq") == 0);
  CHECK(f && shape_equal(&f->out[0], &(Shape){2, {2, 3}}));
  /* The domain's opset travels with the model: "com.example.teq" v2. */
  FILE *fp = fopen(q, "rb");
  char buf[4096];
  size_t n = fp ? fread(buf, 1, sizeof buf, fp) : 0;
  if (fp) fclose(fp);
  CHECK(n > 0 && memmem(buf, n, "com.example.teq", 15));
  graph_free(g);
  graph_free(h);
  diag_fini(&d);
}

/* g and its round trip h give the same outputs (every one of g's) on one
 * seeded random input of shape sx: to 1e-6 absolute, or, with rel, to that
 * relative error (outputs of any size, summed in another order). */
static void check_outputs_within(const Graph *g, const Graph *h, const Shape *sx, uint64_t seed,
                                 double rel) {
  Diag d;
  diag_init(&d);
  Tensor *in = tensor_new(DT_F32, sx), *a[8] = {NULL}, *b[8] = {NULL};
  tensor_fill_random(in, seed);
  CHECK(g->n_outputs <= 8 && h->n_outputs == g->n_outputs);
  CHECK_EQ_INT(exec_run(g, EXEC_F32, &in, a, &d), TEQ_OK);
  CHECK_EQ_INT(exec_run(h, EXEC_F32, &in, b, &d), TEQ_OK);
  for (int j = 0; j < g->n_outputs && j < 8; j++) {
    double e = a[j] && b[j] ? (rel > 0 ? max_rel_err(a[j], b[j]) : max_abs_err(a[j], b[j])) : 1;
    CHECK_MSG(e < (rel > 0 ? rel : 1e-6), "output %d differs: %g", j, e);
    tensor_unref(a[j]);
    tensor_unref(b[j]);
  }
  tensor_unref(in);
  diag_fini(&d);
}

static void check_same_outputs(const Graph *g, const Graph *h, const Shape *sx, uint64_t seed) {
  check_outputs_within(g, h, sx, seed, 0);
}

/* A graph built through the API: a TASO constant tensor (written as an
 * initializer), a matmul with a fused relu (written as MatMul then Relu),
 * and graph outputs that are an input and a constant (written through
 * Identity nodes). Export, import, and the outputs must agree. */
static void test_export_built(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = {2, {2, 3}}, sw = {2, {3, 4}};
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  Tensor *w = tensor_new(DT_F32, &sw);
  tensor_fill_random(w, 7);
  int wi = graph_add_const(g, "w", w, &d);
  Params p;
  params_default(OP_CONST_ONE, &p);
  param_set_ints(&p, param_index(OP_CONST_ONE, "shape"), (int64_t[]){2, 3}, 2);
  TensorRef none[1] = {{0, 0}};
  int one = graph_add_node(g, OP_CONST_ONE, none, 0, 1, &p, "ones", &d);
  int sum = graph_add_node(g, OP_EWADD, (TensorRef[]){{x, 0}, {one, 0}}, 2, 1, NULL, "sum", &d);
  params_default(OP_MATMUL, &p);
  param_set_int(&p, param_index(OP_MATMUL, "act"), ACT_RELU);
  int mm = graph_add_node(g, OP_MATMUL, (TensorRef[]){{sum, 0}, {wi, 0}}, 2, 1, &p, "mm", &d);
  CHECK(x >= 0 && wi >= 0 && one >= 0 && sum >= 0 && mm >= 0);
  graph_add_output(g, (TensorRef){mm, 0}, "y", &d);
  graph_add_output(g, (TensorRef){x, 0}, "x_again", &d);
  graph_add_output(g, (TensorRef){wi, 0}, "weights", &d);
  graph_add_output(g, (TensorRef){mm, 0}, "y_again", &d);
  char q[PATH_BUF];
  int rc = export_to_tmp(g, "built.onnx", q);
  OnnxImportStats st;
  Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  CHECK(h && h->n_outputs == 4 && strcmp(h->output_names[2], "weights") == 0);
  CHECK_EQ_INT(st.n_noops_removed, 2); /* the Identity nodes of x_again and y_again */
  CHECK_EQ_INT(st.n_folded, 1);        /* and of weights, a constant */
  if (h) check_same_outputs(g, h, &sx, 3);
  /* MatMul then Relu come back as the one fused product they were
   * written from; with keep_unfused_activations, as two nodes. */
  if (h) CHECK(count_kind(h, OP_RELU) == 0 && st.n_activations_fused == 1);
  graph_free(h);
  OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
  o.keep_unfused_activations = true;
  h = rc == TEQ_OK ? import(q, &o, &st, &d) : NULL;
  if (h) CHECK(count_kind(h, OP_RELU) == 1 && st.n_activations_fused == 0);
  graph_free(g);
  graph_free(h);
  diag_fini(&d);
}

/* A Pad of node x by pads (ONNX order), filled with value. */
static int pad_node(Graph *g, int x, const int64_t pads[8], double value, const char *name,
                    Diag *d) {
  Params p;
  params_default(OP_PAD, &p);
  param_set_ints(&p, param_index(OP_PAD, "pads"), pads, 8);
  param_set_float(&p, param_index(OP_PAD, "value"), value);
  return graph_add_node(g, OP_PAD, (TensorRef[]){{x, 0}}, 1, 1, &p, name, d);
}

/* A node of kind k with params in their S-expression spelling. */
static int window_node(Graph *g, OpKind k, TensorRef *in, int n_in, const char *params,
                       const char *name, Diag *d) {
  Params p;
  CHECK_EQ_INT(params_parse(k, params, &p, d), TEQ_OK);
  return graph_add_node(g, k, in, n_in, 1, &p, name, d);
}

static bool pads_are(const Node *n, int64_t t, int64_t l, int64_t b, int64_t r) {
  const ParamValue *v = &n->params.v[param_index(n->kind, "pads")];
  return v->i[0] == t && v->i[1] == l && v->i[2] == b && v->i[3] == r;
}

/* A Pad of zeros read by an average pool (Inception-v3's, as PyTorch
 * exports avg_pool2d(padding=1)) or by a convolution becomes their own
 * padding at import; one of another value, one on the channel axis, one
 * read by a max pool, by a pool whose own padding does not count or by a
 * pool with ceil_mode stays; one of no extent goes, and changes nothing.
 * Outputs are those of the graph as built. */
static void test_zero_pads_folded(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = {4, {1, 3, 6, 6}}, sw = {4, {4, 3, 3, 3}};
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  Tensor *w = tensor_new(DT_F32, &sw);
  tensor_fill_random(w, 7);
  int wi = graph_add_const(g, "w", w, &d);
  int p1 = pad_node(g, x, (const int64_t[]){0, 0, 1, 1, 0, 0, 1, 1}, 0, "p1", &d);
  int p2 = pad_node(g, x, (const int64_t[]){0, 0, 2, 0, 0, 0, 1, 3}, 0, "p2", &d);
  int p3 = pad_node(g, x, (const int64_t[]){0, 0, 1, 1, 0, 0, 1, 1}, 0.5, "p3", &d);
  int p4 = pad_node(g, x, (const int64_t[]){0, 1, 1, 1, 0, 1, 1, 1}, 0, "p4", &d);
  int p5 = pad_node(g, x, (const int64_t[]){0, 0, 0, 0, 0, 0, 0, 0}, 0, "p5", &d);
  TensorRef r1 = {p1, 0}, r4 = {p4, 0}, r5 = {p5, 0};
  int a1 = window_node(g, OP_AVGPOOL, &r1, 1, "kernel=(3 3)", "a1", &d);
  int m1 = window_node(g, OP_MAXPOOL, &r1, 1, "kernel=(3 3)", "m1", &d);
  int c2 = window_node(g, OP_CONV2D, (TensorRef[]){{p2, 0}, {wi, 0}}, 2, "pads=(1 1 1 1)", "c2",
                       &d);
  int c3 = window_node(g, OP_CONV2D, (TensorRef[]){{p3, 0}, {wi, 0}}, 2, "", "c3", &d);
  int a4 = window_node(g, OP_AVGPOOL, &r4, 1, "kernel=(3 3)", "a4", &d);
  int a5 = window_node(g, OP_AVGPOOL, &r1, 1, "kernel=(3 3) pads=(1 1 1 1)", "a5", &d);
  int a6 = window_node(g, OP_AVGPOOL, &r1, 1, "kernel=(2 2) stride=(2 2) ceil_mode=1", "a6", &d);
  int a7 = window_node(g, OP_AVGPOOL, &r5, 1, "kernel=(2 2) stride=(2 2)", "a7", &d);
  int outs[] = {a1, m1, c2, c3, a4, a5, a6, a7};
  for (int j = 0; j < 8; j++) {
    CHECK(outs[j] >= 0);
    graph_add_output(g, (TensorRef){outs[j], 0}, g->nodes[outs[j]].name, &d);
  }
  char q[PATH_BUF];
  int rc = export_to_tmp(g, "pads.onnx", q);
  OnnxImportStats st;
  Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  if (h) {
    CHECK_EQ_INT(st.n_pads_folded, 3); /* p1 into a1, p2 into c2, p5 into a7 */
    CHECK_EQ_INT(count_kind(h, OP_PAD), 3);
    const Node *ha1 = &h->nodes[h->outputs[0].node], *hc2 = &h->nodes[h->outputs[2].node];
    const Node *ha7 = &h->nodes[h->outputs[7].node];
    /* No padding came with p5: a7 keeps its count_include_pad, one spelling. */
    CHECK(ha7->kind == OP_AVGPOOL && h->nodes[ha7->in[0].node].kind == OP_INPUT &&
          pads_are(ha7, 0, 0, 0, 0) &&
          param_int(&ha7->params, param_index(OP_AVGPOOL, "count_include_pad")) == 0);
    CHECK(ha1->kind == OP_AVGPOOL && h->nodes[ha1->in[0].node].kind == OP_INPUT &&
          pads_are(ha1, 1, 1, 1, 1) &&
          param_int(&ha1->params, param_index(OP_AVGPOOL, "count_include_pad")) == 1);
    CHECK(hc2->kind == OP_CONV2D && h->nodes[hc2->in[0].node].kind == OP_INPUT &&
          pads_are(hc2, 3, 1, 2, 4));
    check_same_outputs(g, h, &sx, 11);
  }
  graph_free(h);
  OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
  onnx_import_as_given(&o);
  h = rc == TEQ_OK ? import(q, &o, &st, &d) : NULL;
  if (h) CHECK(st.n_pads_folded == 0 && count_kind(h, OP_PAD) == 5);
  graph_free(h);
  graph_free(g);
  diag_fini(&d);
}

/* Random Pads of zeros before random convolutions and average pools:
 * whatever the importer takes into the window computes what the Pad and
 * the window did, and what it cannot take (a pool's padding as wide as
 * its window, ceil_mode, padding that does not count) stays a Pad. */
static void test_zero_pads_random(void) {
  uint64_t state = 0x7a3d;
  int folded = 0, kept = 0;
  for (int t = 0; t < 300; t++) {
    int64_t r[16];
    for (int i = 0; i < 16; i++) r[i] = (int64_t)(rng_next(&state) >> 33);
    Diag d;
    diag_init(&d);
    Graph *g = graph_new();
    Shape sx = {4, {1 + r[0] % 2, 1 + r[1] % 3, 1 + r[2] % 6, 1 + r[3] % 6}};
    int x = graph_add_input(g, "x", &sx, DT_F32, &d);
    int64_t pads[8] = {0, 0, r[4] % 3, r[5] % 3, 0, 0, r[6] % 3, r[7] % 3};
    int pad = pad_node(g, x, pads, 0, "pad", &d);
    int64_t kh = 1 + r[8] % 3, kw = 1 + r[9] % 3, own = r[10] % 2;
    char spell[160];
    int y;
    if (r[11] % 2) { /* a convolution, stride and dilation too */
      Shape sw = {4, {2, sx.d[1], kh, kw}};
      Tensor *w = tensor_new(DT_F32, &sw);
      tensor_fill_random(w, (uint64_t)t);
      int wi = graph_add_const(g, "w", w, &d);
      snprintf(spell, sizeof spell, "stride=(%d %d) pads=(%d 0 0 %d) dilation=(%d 1)",
               (int)(1 + r[12] % 2), (int)(1 + r[13] % 2), (int)own, (int)own,
               (int)(1 + r[14] % 2));
      y = window_node(g, OP_CONV2D, (TensorRef[]){{pad, 0}, {wi, 0}}, 2, spell, "y", &d);
    } else {
      snprintf(spell, sizeof spell,
               "kernel=(%d %d) stride=(%d %d) pads=(%d 0 %d 0) count_include_pad=%d ceil_mode=%d",
               (int)kh, (int)kw, (int)(1 + r[12] % 2), (int)(1 + r[13] % 2),
               (int)(own && kh > 1), (int)(own && kh > 1), (int)(r[14] % 2),
               (int)(r[15] % 4 == 0));
      TensorRef in = {pad, 0};
      y = window_node(g, OP_AVGPOOL, &in, 1, spell, "y", &d);
    }
    if (y < 0) { /* a window larger than the padded input: not a model */
      graph_free(g);
      diag_fini(&d);
      continue;
    }
    graph_add_output(g, (TensorRef){y, 0}, "y", &d);
    char q[PATH_BUF];
    int rc = export_to_tmp(g, "pads_random.onnx", q);
    OnnxImportStats st;
    Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
    CHECK_MSG(h, "case %d (%s): %s", t, spell, diag_last(&d));
    if (h) {
      CHECK_EQ_INT(count_kind(h, OP_PAD), 1 - st.n_pads_folded);
      folded += st.n_pads_folded;
      kept += 1 - st.n_pads_folded;
      check_same_outputs(g, h, &sx, (uint64_t)t + 100);
    }
    graph_free(h);
    graph_free(g);
    diag_fini(&d);
  }
  /* Both ways taken often enough to mean something. */
  CHECK_MSG(folded > 50 && kept > 20, "folded %d, kept %d", folded, kept);
}

/* A conv or matmul node with act relu, sigmoid or tanh, after import. */
static int count_fused(const Graph *g, OpKind k, int act) {
  int n = 0;
  for (int32_t i = 0; i < g->n_nodes; i++)
    n += g->nodes[i].kind == k && param_int(&g->nodes[i].params, param_index(k, "act")) == act;
  return n;
}

/* An activation that alone reads a conv or a matmul is fused into it at
 * import; one beside another reader, or after a conv whose output the
 * graph also returns, or after an operator without an act (an add), is
 * not. Outputs are those of the graph as built. */
static void test_activations_fused(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = {4, {1, 3, 6, 6}}, sw = {4, {4, 3, 3, 3}}, sm = {2, {4, 5}};
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  Tensor *w = tensor_new(DT_F32, &sw), *wm = tensor_new(DT_F32, &sm);
  tensor_fill_random(w, 5);
  tensor_fill_random(wm, 6);
  int wi = graph_add_const(g, "w", w, &d), wmi = graph_add_const(g, "wm", wm, &d);
  Params p;
  params_default(OP_CONV2D, &p);
  TensorRef xw[2] = {{x, 0}, {wi, 0}};
  int c1 = graph_add_node(g, OP_CONV2D, xw, 2, 1, &p, "c1", &d); /* relu its only reader */
  int c2 = graph_add_node(g, OP_CONV2D, xw, 2, 1, &p, "c2", &d); /* read twice */
  int c3 = graph_add_node(g, OP_CONV2D, xw, 2, 1, &p, "c3", &d); /* also an output */
  int r1 = graph_add_node(g, OP_RELU, (TensorRef[]){{c1, 0}}, 1, 1, NULL, "r1", &d);
  int r2 = graph_add_node(g, OP_RELU, (TensorRef[]){{c2, 0}}, 1, 1, NULL, "r2", &d);
  int t3 = graph_add_node(g, OP_TANH, (TensorRef[]){{c3, 0}}, 1, 1, NULL, "t3", &d);
  int sum = graph_add_node(g, OP_EWADD, (TensorRef[]){{r1, 0}, {c2, 0}}, 2, 1, NULL, "sum", &d);
  int sr = graph_add_node(g, OP_RELU, (TensorRef[]){{sum, 0}}, 1, 1, NULL, "sr", &d);
  params_default(OP_MATMUL, &p);
  int mm = graph_add_node(g, OP_MATMUL, (TensorRef[]){{sr, 0}, {wmi, 0}}, 2, 1, &p, "mm", &d);
  int sg = graph_add_node(g, OP_SIGMOID, (TensorRef[]){{mm, 0}}, 1, 1, NULL, "sg", &d);
  CHECK(r2 >= 0 && t3 >= 0 && sg >= 0);
  graph_add_output(g, (TensorRef){sg, 0}, "y", &d);
  graph_add_output(g, (TensorRef){r2, 0}, "r2", &d);
  graph_add_output(g, (TensorRef){t3, 0}, "t3", &d);
  graph_add_output(g, (TensorRef){c3, 0}, "c3", &d);
  char q[PATH_BUF];
  int rc = export_to_tmp(g, "activations.onnx", q);
  OnnxImportStats st;
  Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  if (h) {
    CHECK_EQ_INT(st.n_activations_fused, 2); /* r1 into c1, sg into mm */
    CHECK_EQ_INT(count_fused(h, OP_CONV2D, ACT_RELU), 1);
    CHECK_EQ_INT(count_fused(h, OP_MATMUL, ACT_SIGMOID), 1);
    CHECK(count_kind(h, OP_RELU) == 2 && count_kind(h, OP_TANH) == 1);
    check_same_outputs(g, h, &sx, 9);
  }
  graph_free(g);
  graph_free(h);
  diag_fini(&d);
}

/* The mobile networks' activations after a conv: a silu (written as
 * Sigmoid and Mul), a hard swish (an opset-14 operator), a clip to [0, 6]
 * PyTorch's hard sigmoid (x/6 + 1/2) and ONNX's default one (Paddle's,
 * x/5 + 1/2) are fused into the conv that alone feeds them; a clip to
 * other bounds, or a hard sigmoid of another alpha, is not. The fused graph
 * exports each as its own operator's ONNX
 * form again, which imports with every fusion off to the same outputs
 * (weights large enough that the clip's 6 is reached). */
static void test_mobile_activations_fused(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = {4, {1, 3, 6, 6}}, sw = {4, {4, 3, 3, 3}}, sb = {1, {4}};
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  Tensor *w = tensor_new(DT_F32, &sw), *b = tensor_new(DT_F32, &sb);
  tensor_fill_random(w, 21);
  tensor_fill_random(b, 22);
  for (int64_t i = 0; i < tensor_numel(w); i++) ((float *)w->data)[i] *= 4.0f;
  int wi = graph_add_const(g, "w", w, &d), bi = graph_add_const(g, "b", b, &d);
  Params p, clip6, clip5, hsig, hsig4;
  params_default(OP_CONV2D, &p);
  act_op_params(ACT_RELU6, &clip6);
  act_op_params(ACT_HARD_SIGMOID, &hsig);
  params_default(OP_HARD_SIGMOID, &hsig4);
  param_set_float(&hsig4, param_index(OP_HARD_SIGMOID, "alpha"), 0.25);
  clip5 = clip6;
  param_set_float(&clip5, param_index(OP_CLIP, "max"), 5.0);
  TensorRef xwb[3] = {{x, 0}, {wi, 0}, {bi, 0}};
  const struct {
    OpKind kind;
    const Params *p;
  } after[7] = {{OP_SILU, NULL},           {OP_HARD_SWISH, NULL},   {OP_CLIP, &clip6},
                {OP_CLIP, &clip5},         {OP_HARD_SIGMOID, &hsig}, {OP_HARD_SIGMOID, NULL},
                {OP_HARD_SIGMOID, &hsig4}};
  for (int k = 0; k < 7; k++) {
    char name[16];
    snprintf(name, sizeof name, "c%d", k);
    int c = graph_add_node(g, OP_CONV2D, xwb, 3, 1, &p, name, &d);
    int a = graph_add_node(g, after[k].kind, (TensorRef[]){{c, 0}}, 1, 1, after[k].p, NULL, &d);
    snprintf(name, sizeof name, "y%d", k);
    CHECK(a >= 0);
    graph_add_output(g, (TensorRef){a, 0}, name, &d);
  }
  char q[PATH_BUF], q2[PATH_BUF];
  OnnxImportStats st;
  Graph *h = export_to_tmp(g, "mobile.onnx", q) == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  if (h) {
    CHECK_EQ_INT(st.n_activations_fused, 5);
    CHECK_EQ_INT(count_fused(h, OP_CONV2D, ACT_SILU), 1);
    CHECK_EQ_INT(count_fused(h, OP_CONV2D, ACT_HARD_SWISH), 1);
    CHECK_EQ_INT(count_fused(h, OP_CONV2D, ACT_RELU6), 1);
    CHECK_EQ_INT(count_fused(h, OP_CONV2D, ACT_HARD_SIGMOID), 1);
    CHECK_EQ_INT(count_kind(h, OP_CLIP), 1);         /* the clip to 5 */
    CHECK_EQ_INT(count_fused(h, OP_CONV2D, ACT_HARD_SIGMOID_FIFTH), 1); /* ONNX's default */
    CHECK_EQ_INT(count_kind(h, OP_HARD_SIGMOID), 1);                    /* alpha 0.25 */
    check_same_outputs(g, h, &sx, 23);
    OnnxImportOptions given = ONNX_IMPORT_DEFAULTS;
    onnx_import_as_given(&given);
    Graph *h2 =
        export_to_tmp(h, "mobile_fused.onnx", q2) == TEQ_OK ? import(q2, &given, NULL, &d) : NULL;
    if (h2) {
      /* Opset 13, before HardSwish: the hard swish is a HardSigmoid and a
       * Mul, as the silu is a Sigmoid and a Mul. */
      CHECK_EQ_INT(count_kind(h2, OP_CLIP), 2);
      CHECK_EQ_INT(count_kind(h2, OP_HARD_SIGMOID), 4);
      CHECK_EQ_INT(count_kind(h2, OP_HARD_SWISH), 0);
      CHECK_EQ_INT(count_kind(h2, OP_SIGMOID), 1);
      CHECK_EQ_INT(count_kind(h2, OP_EWMUL), 2);
      check_same_outputs(g, h2, &sx, 24);
    }
    graph_free(h2);
  }
  graph_free(g);
  graph_free(h);
  diag_fini(&d);
}

/* Random producers (a conv with or without a bias, with or without a
 * residual Add; a matmul; a batchnorm over a concat, which no conv takes)
 * followed by a random activation: each of the fused ones, in the form it
 * fuses in or in one it does not (a clip to other bounds, ONNX's default
 * hard sigmoid, a leaky relu), sometimes beside another reader of the
 * producer. Exported, imported (fused where it may be), exported again and
 * imported as given: every import computes what the graph as built does,
 * and an activation is left as a node of its own just where the form or
 * the other reader says it must be. */
static void test_activations_random(void) {
  uint64_t state = 0x5eed;
  int fused = 0, kept = 0;
  for (int t = 0; t < 200; t++) {
    int64_t r[8];
    for (int i = 0; i < 8; i++) r[i] = (int64_t)(rng_next(&state) >> 33);
    Diag d;
    diag_init(&d);
    Graph *g = graph_new();
    Shape sx = {4, {1, 2 + r[0] % 3, 3 + r[1] % 4, 3 + r[1] % 3}};
    int x = graph_add_input(g, "x", &sx, DT_F32, &d);
    int64_t c = sx.d[1], kind = r[2] % 4; /* conv, conv + residual, matmul, batchnorm */
    int prod;
    if (kind <= 1) {
      Shape sw = {4, {c, c, 3, 3}}, sb = {1, {c}};
      Tensor *w = tensor_new(DT_F32, &sw), *b = tensor_new(DT_F32, &sb);
      tensor_fill_random(w, (uint64_t)t);
      tensor_fill_random(b, (uint64_t)t + 1);
      for (int64_t e = 0; e < tensor_numel(w); e++) ((float *)w->data)[e] *= 4.0f;
      TensorRef in[3] = {{x, 0}, {graph_add_const(g, "w", w, &d), 0},
                         {graph_add_const(g, "b", b, &d), 0}};
      prod = window_node(g, OP_CONV2D, in, r[3] % 2 ? 3 : 2, "pads=(1 1 1 1)", "conv", &d);
      if (kind == 1) /* the shortcut: a residual the conv takes */
        prod = graph_add_node(g, OP_EWADD, (TensorRef[]){{prod, 0}, {x, 0}}, 2, 1, NULL, "res",
                              &d);
    } else if (kind == 2) {
      Shape sw = {2, {sx.d[3], 5}};
      Tensor *w = tensor_new(DT_F32, &sw);
      tensor_fill_random(w, (uint64_t)t + 2);
      for (int64_t e = 0; e < tensor_numel(w); e++) ((float *)w->data)[e] *= 4.0f;
      prod = graph_add_node(g, OP_MATMUL,
                            (TensorRef[]){{x, 0}, {graph_add_const(g, "w", w, &d), 0}}, 2, 1,
                            NULL, "mm", &d);
    } else {
      int cat = window_node(g, OP_CONCAT, (TensorRef[]){{x, 0}, {x, 0}}, 2, "axis=1", "cat", &d);
      Shape sc = {1, {2 * c}};
      TensorRef bn[5] = {{cat, 0}};
      for (int k = 1; k < 5; k++) {
        Tensor *v = tensor_new(DT_F32, &sc);
        tensor_fill_random(v, (uint64_t)t * 5 + (uint64_t)k);
        for (int64_t e = 0; k == 4 && e < tensor_numel(v); e++) /* a variance */
          ((float *)v->data)[e] = ((float *)v->data)[e] * ((float *)v->data)[e] + 0.1f;
        bn[k] = (TensorRef){graph_add_const(g, NULL, v, &d), 0};
      }
      prod = graph_add_node(g, OP_BATCHNORM, bn, 5, 1, NULL, "bn", &d);
    }
    /* the activation: a fusable form (act > 0) or one that is not (0) */
    static const struct {
      OpKind kind;
      const char *params;
      int act;
    } acts[] = {
      {OP_RELU, "", ACT_RELU},         {OP_SIGMOID, "", ACT_SIGMOID},
      {OP_TANH, "", ACT_TANH},         {OP_SILU, "", ACT_SILU},
      {OP_HARD_SWISH, "", ACT_HARD_SWISH}, {OP_CLIP, "min=0 max=6", ACT_RELU6},
      {OP_CLIP, "min=-1 max=6", 0},    {OP_CLIP, "max=6", 0},
      {OP_HARD_SIGMOID, "alpha=0.166666672 beta=0.5", ACT_HARD_SIGMOID},
      {OP_HARD_SIGMOID, "alpha=0.200000003 beta=0.5", ACT_HARD_SIGMOID_FIFTH},
      {OP_HARD_SIGMOID, "alpha=0.25", 0}, {OP_LEAKY_RELU, "", 0},
    };
    int a = (int)(r[4] % (int64_t)(sizeof acts / sizeof *acts));
    int y = window_node(g, acts[a].kind, (TensorRef[]){{prod, 0}}, 1, acts[a].params, "act", &d);
    bool beside = r[5] % 4 == 0; /* the producer read again: nothing fuses into it */
    graph_add_output(g, (TensorRef){y, 0}, "y", &d);
    if (beside) graph_add_output(g, (TensorRef){prod, 0}, "p", &d);
    char q[PATH_BUF], q2[PATH_BUF];
    OnnxImportStats st;
    Graph *h = export_to_tmp(g, "acts_random.onnx", q) == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
    CHECK_MSG(h, "case %d: %s", t, diag_last(&d));
    if (h) {
      /* Fused after a residual Add by the residual fusion, elsewhere by
       * the activations' pass: either way no node of its own is left. */
      bool fuses = acts[a].act != 0 && !beside;
      CHECK_MSG(count_kind(h, acts[a].kind) == (fuses ? 0 : 1), "case %d (%s %s after %d): %d left",
                t, op_def(acts[a].kind)->name, acts[a].params, (int)kind,
                count_kind(h, acts[a].kind));
      fused += fuses, kept += !fuses;
      check_outputs_within(g, h, &sx, (uint64_t)t + 300, 1e-5);
      OnnxImportOptions given = ONNX_IMPORT_DEFAULTS;
      onnx_import_as_given(&given);
      Graph *h2 =
          export_to_tmp(h, "acts_random2.onnx", q2) == TEQ_OK ? import(q2, &given, NULL, &d) : NULL;
      if (h2) check_outputs_within(g, h2, &sx, (uint64_t)t + 600, 1e-5);
      graph_free(h2);
    }
    graph_free(h);
    graph_free(g);
    diag_fini(&d);
  }
  CHECK_MSG(fused > 80 && kept > 40, "fused %d, kept %d", fused, kept);
}

/* A constant scale after a product with constant weights folds into them
 * (ConvNeXt's layer scale: gamma [C, 1, 1] * permute(x W + b)) where it is
 * one value per output column, or one value; through the bias and one
 * transpose. Not where it varies along another axis, the bias does, or
 * the product has another reader. Each
 * import computes what the graph as built does; as given, nothing folds. */
static void test_product_scales_folded(void) {
  static const struct {
    const char *label;
    Shape gamma;  /* of the scale, on the output as returned */
    bool bias, back, read_twice;
    Shape bias_shape;
    int folds;
  } cases[] = {
    {"ConvNeXt's layer scale", {3, {8, 1, 1}}, true, true, false, {1, {8}}, 1},
    {"one value", {1, {1}}, true, true, false, {1, {8}}, 1},
    {"no bias, no transpose", {1, {8}}, false, false, false, {0, {0}}, 1},
    {"a scalar bias", {1, {8}}, true, false, false, {1, {1}}, 1},
    {"a scale along the rows", {4, {1, 5, 1, 1}}, true, false, false, {1, {8}}, 0},
    {"a scale along the width", {3, {1, 1, 6}}, true, true, false, {1, {8}}, 0},
    {"a bias along the rows", {1, {8}}, true, false, false, {2, {6, 1}}, 0},
    {"the product read twice", {1, {8}}, true, false, true, {1, {8}}, 0},
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    Diag d;
    diag_init(&d);
    Graph *g = graph_new();
    Shape sx = {4, {1, 4, 5, 6}}, sw = {2, {4, 8}};
    int x = graph_add_input(g, "x", &sx, DT_F32, &d);
    int nhwc = window_node(g, OP_TRANSPOSE, (TensorRef[]){{x, 0}}, 1, "perm=(0 2 3 1)", "t", &d);
    Tensor *w = tensor_new(DT_F32, &sw);
    tensor_fill_random(w, 31 + k);
    TensorRef wr = {graph_add_const(g, "w", w, &d), 0};
    int y = graph_add_node(g, OP_MATMUL, (TensorRef[]){{nhwc, 0}, wr}, 2, 1, NULL, "mm", &d);
    int prod = y;
    if (cases[k].bias) {
      Tensor *b = tensor_new(DT_F32, &cases[k].bias_shape);
      tensor_fill_random(b, 41 + k);
      int bi = graph_add_const(g, "b", b, &d);
      y = graph_add_node(g, OP_EWADD, (TensorRef[]){{y, 0}, {bi, 0}}, 2, 1, NULL, "add", &d);
    }
    if (cases[k].back)
      y = window_node(g, OP_TRANSPOSE, (TensorRef[]){{y, 0}}, 1, "perm=(0 3 1 2)", "back", &d);
    Tensor *gm = tensor_new(DT_F32, &cases[k].gamma);
    tensor_fill_random(gm, 51 + k);
    int gi = graph_add_const(g, "gamma", gm, &d);
    y = graph_add_node(g, OP_EWMUL, (TensorRef[]){{gi, 0}, {y, 0}}, 2, 1, NULL, "scale", &d);
    CHECK_MSG(y >= 0, "%s: %s", cases[k].label, diag_last(&d));
    graph_add_output(g, (TensorRef){y, 0}, "y", &d);
    if (cases[k].read_twice) graph_add_output(g, (TensorRef){prod, 0}, "p", &d);
    char q[PATH_BUF];
    OnnxImportStats st, st2;
    OnnxImportOptions given = ONNX_IMPORT_DEFAULTS;
    onnx_import_as_given(&given);
    bool written = export_to_tmp(g, "scales.onnx", q) == TEQ_OK;
    Graph *h = written ? import(q, NULL, &st, &d) : NULL;
    Graph *h2 = written ? import(q, &given, &st2, &d) : NULL;
    if (h && h2) {
      CHECK_MSG(st.n_scales_folded == cases[k].folds && count_kind(h, OP_EWMUL) == 1 - cases[k].folds,
                "%s: %d folded", cases[k].label, st.n_scales_folded);
      CHECK_EQ_INT(st2.n_scales_folded, 0);
      check_outputs_within(g, h, &sx, 61 + k, 1e-5);
      check_outputs_within(g, h2, &sx, 71 + k, 1e-5);
    }
    graph_free(h);
    graph_free(h2);
    graph_free(g);
    diag_fini(&d);
  }
}

/* A fold reading what an earlier fold of the same pass made: a second
 * BatchNorm after a conv the first folded into, a second scale after the
 * product the first folded into. A pass counts readers before it makes
 * those nodes (reading their counts overran the tables: found by fuzzing,
 * caught by ASan): the scale pass leaves the second scale as it is; the
 * conv's folds run in rounds, each counting anew, and the second
 * BatchNorm folds in the next. Either way the import computes what the
 * graph as built does. */
static void test_folds_chained(void) {
  for (int bn = 0; bn < 2; bn++) {
    Diag d;
    diag_init(&d);
    Graph *g = graph_new();
    Shape sx = bn ? (Shape){4, {1, 3, 6, 6}} : (Shape){2, {5, 4}};
    int x = graph_add_input(g, "x", &sx, DT_F32, &d), y;
    Tensor *w = tensor_new(DT_F32, bn ? &(Shape){4, {4, 3, 3, 3}} : &(Shape){2, {4, 8}});
    tensor_fill_random(w, 81);
    TensorRef in[5] = {{x, 0}, {graph_add_const(g, "w", w, &d), 0}};
    if (bn) {
      Params cp;
      params_default(OP_CONV2D, &cp);
      param_set_ints(&cp, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
      y = graph_add_node(g, OP_CONV2D, in, 2, 1, &cp, "conv", &d);
    } else {
      y = graph_add_node(g, OP_MATMUL, in, 2, 1, NULL, "mm", &d);
    }
    for (int k = 0; k < 2; k++) {
      in[0] = (TensorRef){y, 0};
      for (int j = 1; j < (bn ? 5 : 2); j++) { /* scale, bias, mean, variance; or gamma */
        Tensor *c = tensor_new(DT_F32, &(Shape){1, {bn ? 4 : 8}});
        tensor_fill_random(c, 90 + 10 * k + j);
        if (j == 4) /* a variance: positive */
          for (int e = 0; e < 4; e++) ((float *)c->data)[e] = 0.5f + fabsf(((float *)c->data)[e]);
        in[j] = (TensorRef){graph_add_const(g, NULL, c, &d), 0};
      }
      y = graph_add_node(g, bn ? OP_BATCHNORM : OP_EWMUL, in, bn ? 5 : 2, 1, NULL, NULL, &d);
    }
    CHECK_MSG(y >= 0, "%s", diag_last(&d));
    graph_add_output(g, (TensorRef){y, 0}, "y", &d);
    char q[PATH_BUF];
    OnnxImportStats st;
    Graph *h = export_to_tmp(g, "chained.onnx", q) == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
    if (h) {
      CHECK_EQ_INT(bn ? st.n_batchnorm_folded : st.n_scales_folded, bn ? 2 : 1);
      CHECK_EQ_INT(count_kind(h, bn ? OP_BATCHNORM : OP_EWMUL), bn ? 0 : 1);
      check_outputs_within(g, h, &sx, 83 + bn, 1e-5);
    }
    graph_free(h);
    graph_free(g);
    diag_fini(&d);
  }
}

/* Nodes of kind with a residual input (conv2d's and gemm's fourth), after
 * import. */
static int count_residual(const Graph *g, OpKind kind) {
  int n = 0;
  for (int32_t i = 0; i < g->n_nodes; i++)
    n += g->nodes[i].kind == kind && g->nodes[i].n_in == op_def(kind)->residual_input + 1;
  return n;
}

/* An Add of a conv it alone reads and a tensor of the conv's shape becomes
 * the conv's residual, and a relu after the Add its fused act: with a bias
 * (c1), without one (c2, given a zero bias), and where both sides are
 * convs (c5 at input 0 takes c6 as its residual). Not where the other
 * side broadcasts (c3) or the conv has another reader (c4). The model as
 * given keeps every Add; the fused graph exports as Conv, Add and Relu
 * again, and every import computes what the graph as built does. */
static void test_residuals_fused(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  /* c varies along the rows and columns: no bias, which a constant of one
   * value per channel would be (fold_conv_affines takes that one) */
  Shape sx = {4, {1, 4, 6, 6}}, sw = {4, {4, 4, 3, 3}}, sb = {1, {4}}, sc = {4, {1, 1, 6, 6}};
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  Tensor *w = tensor_new(DT_F32, &sw), *b = tensor_new(DT_F32, &sb), *c = tensor_new(DT_F32, &sc);
  tensor_fill_random(w, 11);
  tensor_fill_random(b, 12);
  tensor_fill_random(c, 13);
  int wi = graph_add_const(g, "w", w, &d), bi = graph_add_const(g, "b", b, &d);
  int ci = graph_add_const(g, "c", c, &d);
  Params p;
  params_default(OP_CONV2D, &p);
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
  TensorRef xwb[3] = {{x, 0}, {wi, 0}, {bi, 0}};
  int conv[7];
  for (int k = 1; k <= 6; k++) {
    char name[8];
    snprintf(name, sizeof name, "c%d", k);
    conv[k] = graph_add_node(g, OP_CONV2D, xwb, k == 2 ? 2 : 3, 1, &p, name, &d);
  }
  TensorRef X = {x, 0};
#define ADD(a, b, name) graph_add_node(g, OP_EWADD, (TensorRef[]){a, b}, 2, 1, NULL, name, &d)
  int a1 = ADD(((TensorRef){conv[1], 0}), X, "a1");
  int r1 = graph_add_node(g, OP_RELU, (TensorRef[]){{a1, 0}}, 1, 1, NULL, "r1", &d);
  int a2 = ADD(((TensorRef){conv[2], 0}), X, "a2");
  int a3 = ADD(((TensorRef){conv[3], 0}), ((TensorRef){ci, 0}), "a3");
  int a4 = ADD(((TensorRef){conv[4], 0}), X, "a4");
  int a5 = ADD(((TensorRef){conv[5], 0}), ((TensorRef){conv[6], 0}), "a5");
#undef ADD
  CHECK(r1 >= 0 && a2 >= 0 && a3 >= 0 && a4 >= 0 && a5 >= 0);
  graph_add_output(g, (TensorRef){r1, 0}, "y1", &d);
  graph_add_output(g, (TensorRef){a2, 0}, "y2", &d);
  graph_add_output(g, (TensorRef){a3, 0}, "y3", &d);
  graph_add_output(g, (TensorRef){a4, 0}, "y4", &d);
  graph_add_output(g, (TensorRef){conv[4], 0}, "c4", &d);
  graph_add_output(g, (TensorRef){a5, 0}, "y5", &d);
  char q[PATH_BUF];
  int rc = export_to_tmp(g, "residuals.onnx", q);
  OnnxImportStats st;
  Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  if (h) {
    CHECK_EQ_INT(st.n_residuals_fused, 3); /* a1, a2, a5 */
    CHECK_EQ_INT(count_residual(h, OP_CONV2D), 3);
    CHECK_EQ_INT(count_kind(h, OP_EWADD), 2); /* a3 (broadcast), a4 (c4 read twice) */
    CHECK_EQ_INT(count_kind(h, OP_RELU), 0);  /* r1: the residual conv's act */
    CHECK_EQ_INT(count_fused(h, OP_CONV2D, ACT_RELU), 1);
    check_same_outputs(g, h, &sx, 21);
    /* Written back: each residual an Add after its Conv again. */
    OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
    o.keep_unfused_residuals = true;
    Graph *k = written_and_read(h, "residuals_again.onnx", &o, false, &st, &d);
    if (k) {
      CHECK_EQ_INT(count_residual(k, OP_CONV2D), 0);
      CHECK_EQ_INT(count_kind(k, OP_EWADD), 5);
      check_same_outputs(g, k, &sx, 22);
    }
    graph_free(k);
  }
  graph_free(h);
  h = rc == TEQ_OK ? written_and_read(g, "residuals.onnx", NULL, true, &st, &d) : NULL;
  if (h) CHECK(st.n_residuals_fused == 0 && count_residual(h, OP_CONV2D) == 0 && count_kind(h, OP_EWADD) == 5);
  graph_free(h);
  graph_free(g);
  diag_fini(&d);
}

static int count_pooled(const Graph *g) {
  int n = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) n += op_output_pooled(&g->nodes[i]);
  return n;
}

/* A max pool whose k x k windows at stride k tile the output of a conv it
 * alone reads becomes the conv's pool at import (VGG's conv, relu, 2x2
 * pool: c1); one with ceil_mode over an odd extent (a partial window:
 * c2), one whose windows overlap (c3), one beside another reader of the
 * conv (c4) is not. c5's relu after its pool stays a node: nothing joins a
 * pooled conv's epilogue, and a BatchNorm after c6's pool is not folded into
 * its weights (a negative scale would have swapped the max for a min).
 * Outputs are those of the graph as built; exported, each pool is a
 * MaxPool after its Conv and Relu again, and as given nothing is fused. */
static void test_pools_fused(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = {4, {1, 3, 9, 10}}, sw = {4, {4, 3, 3, 3}}, sc = {1, {4}};
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  Tensor *w = tensor_new(DT_F32, &sw), *b = tensor_new(DT_F32, &sc), *bn[4];
  tensor_fill_random(w, 41);
  tensor_fill_random(b, 42);
  int wi = graph_add_const(g, "w", w, &d), bi = graph_add_const(g, "b", b, &d), bni[4];
  for (int k = 0; k < 4; k++) {
    bn[k] = tensor_new(DT_F32, &sc);
    tensor_fill_random(bn[k], 43 + (uint64_t)k); /* a variance of 0.5 +- 0.5: fine */
    if (k == 3)
      for (int c = 0; c < 4; c++) ((float *)bn[k]->data)[c] = 0.5f + 0.25f * (float)c;
    char name[8];
    snprintf(name, sizeof name, "bn%d", k);
    bni[k] = graph_add_const(g, name, bn[k], &d);
  }
  Params p;
  params_default(OP_CONV2D, &p);
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
  TensorRef xwb[3] = {{x, 0}, {wi, 0}, {bi, 0}};
  int conv[7];
  for (int k = 1; k <= 6; k++) {
    char name[8];
    snprintf(name, sizeof name, "c%d", k);
    conv[k] = graph_add_node(g, OP_CONV2D, xwb, 3, 1, &p, name, &d);
  }
#define POOL(c, params, name) window_node(g, OP_MAXPOOL, (TensorRef[]){{c, 0}}, 1, params, name, &d)
  int r1 = graph_add_node(g, OP_RELU, (TensorRef[]){{conv[1], 0}}, 1, 1, NULL, "r1", &d);
  int p1 = POOL(r1, "kernel=(2 2) stride=(2 2)", "p1");
  int p2 = POOL(conv[2], "kernel=(2 2) stride=(2 2) ceil_mode=1", "p2");
  int p3 = POOL(conv[3], "kernel=(3 3) stride=(2 2)", "p3");
  int p4 = POOL(conv[4], "kernel=(2 2) stride=(2 2)", "p4");
  int p5 = POOL(conv[5], "kernel=(2 2) stride=(2 2)", "p5");
  int p6 = POOL(conv[6], "kernel=(3 3) stride=(3 3)", "p6");
#undef POOL
  int r5 = graph_add_node(g, OP_RELU, (TensorRef[]){{p5, 0}}, 1, 1, NULL, "r5", &d);
  params_default(OP_BATCHNORM, &p);
  int n6 = graph_add_node(g, OP_BATCHNORM,
                          (TensorRef[]){{p6, 0}, {bni[0], 0}, {bni[1], 0}, {bni[2], 0},
                                        {bni[3], 0}},
                          5, 1, &p, "n6", &d);
  CHECK(p1 >= 0 && p2 >= 0 && p3 >= 0 && p4 >= 0 && r5 >= 0 && n6 >= 0);
  graph_add_output(g, (TensorRef){p1, 0}, "y1", &d);
  graph_add_output(g, (TensorRef){p2, 0}, "y2", &d);
  graph_add_output(g, (TensorRef){p3, 0}, "y3", &d);
  graph_add_output(g, (TensorRef){p4, 0}, "y4", &d);
  graph_add_output(g, (TensorRef){conv[4], 0}, "c4", &d);
  graph_add_output(g, (TensorRef){r5, 0}, "y5", &d);
  graph_add_output(g, (TensorRef){n6, 0}, "y6", &d);
  char q[PATH_BUF];
  int rc = export_to_tmp(g, "pools.onnx", q);
  OnnxImportStats st;
  Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  if (h) {
    CHECK_EQ_INT(st.n_pools_fused, 3); /* p1 (after its relu), p5, p6 */
    CHECK_EQ_INT(count_pooled(h), 3);
    CHECK_EQ_INT(count_kind(h, OP_MAXPOOL), 3); /* p2, p3, p4 */
    CHECK_EQ_INT(count_kind(h, OP_RELU), 1);    /* r5 */
    CHECK_EQ_INT(count_kind(h, OP_BATCHNORM), 1);
    CHECK_EQ_INT(st.n_batchnorm_folded, 0);
    check_same_outputs(g, h, &sx, 44);
    OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
    o.keep_unfused_pools = true;
    Graph *k = written_and_read(h, "pools_again.onnx", &o, false, &st, &d);
    if (k) {
      CHECK_EQ_INT(count_pooled(k), 0);
      CHECK_EQ_INT(count_kind(k, OP_MAXPOOL), 6);
      check_same_outputs(g, k, &sx, 45);
    }
    graph_free(k);
  }
  graph_free(h);
  h = rc == TEQ_OK ? written_and_read(g, "pools.onnx", NULL, true, &st, &d) : NULL;
  if (h) CHECK(st.n_pools_fused == 0 && count_pooled(h) == 0 && count_kind(h, OP_MAXPOOL) == 6);
  graph_free(h);
  graph_free(g);
  diag_fini(&d);
}

/* A pooled conv whose activation ONNX writes as nodes of its own (silu,
 * hard swish, relu6, hard sigmoid), with and without a residual, and one
 * whose activation its own row writes (relu): exported, each is Conv,
 * the activation, then MaxPool, in that order (silu and hard swish do not
 * commute with a max; written with the pool first, they came back other
 * numbers), and imported as given each computes what the graph does. */
static void test_pooled_acts_exported(void) {
  static const int acts[] = {ACT_SILU,         ACT_HARD_SWISH,         ACT_RELU6,
                             ACT_HARD_SIGMOID, ACT_HARD_SIGMOID_FIFTH, ACT_RELU};
  Diag d;
  diag_init(&d);
  Shape sx = {4, {1, 3, 8, 8}}, sw = {4, {4, 3, 3, 3}}, sb = {1, {4}}, sz = {4, {1, 4, 8, 8}};
  for (size_t a = 0; a < sizeof acts / sizeof *acts; a++)
    for (int residual = 0; residual < 2; residual++) {
      Graph *g = graph_new();
      int x = graph_add_input(g, "x", &sx, DT_F32, &d);
      Tensor *w = tensor_new(DT_F32, &sw), *b = tensor_new(DT_F32, &sb);
      Tensor *z = tensor_new(DT_F32, &sz);
      tensor_fill_random(w, 51);
      tensor_fill_random(b, 52);
      tensor_fill_random(z, 53);
      TensorRef in[4] = {{x, 0}, {graph_add_const(g, "w", w, &d), 0},
                         {graph_add_const(g, "b", b, &d), 0}, {graph_add_const(g, "z", z, &d), 0}};
      Params p;
      params_default(OP_CONV2D, &p);
      param_set_ints(&p, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
      param_set_int(&p, param_index(OP_CONV2D, "act"), acts[a]);
      param_set_int(&p, param_index(OP_CONV2D, "pool"), 2);
      int c = graph_add_node(g, OP_CONV2D, in, residual ? 4 : 3, 1, &p, "c", &d);
      CHECK(c >= 0);
      graph_add_output(g, (TensorRef){c, 0}, "y", &d);
      OnnxImportStats st;
      Graph *h = written_and_read(g, "pooled_act.onnx", NULL, true, &st, &d);
      if (h) {
        CHECK_MSG(count_kind(h, OP_MAXPOOL) == 1 && count_pooled(h) == 0, "%s",
                  act_symbols[acts[a]]);
        int pool = -1;
        for (int32_t i = 0; i < h->n_nodes; i++)
          if (h->nodes[i].kind == OP_MAXPOOL) pool = i;
        /* the pool reads the activation, not the convolution */
        CHECK_MSG(pool >= 0 && h->nodes[h->nodes[pool].in[0].node].kind != OP_CONV2D &&
                      h->nodes[h->nodes[pool].in[0].node].kind != OP_EWADD,
                  "%s, residual %d: the pool comes before the activation", act_symbols[acts[a]],
                  residual);
        check_same_outputs(g, h, &sx, 54);
      }
      graph_free(h);
      graph_free(g);
    }
  diag_flush(&d, stderr);
  diag_fini(&d);
}

/* VGG's classifier: Gemm (a bias, B transposed), Relu. The relu is fused
 * into the gemm at import; written back, it is a Relu after a Gemm again,
 * whose configuration key (the cost tables') reads as an unfused gemm's
 * does but for its act. */
static void test_gemm_relu_fused(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = {2, {2, 6}}, sw = {2, {5, 6}}, sb = {1, {5}};
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  Tensor *w = tensor_new(DT_F32, &sw), *b = tensor_new(DT_F32, &sb);
  tensor_fill_random(w, 51);
  tensor_fill_random(b, 52);
  int wi = graph_add_const(g, "w", w, &d), bi = graph_add_const(g, "b", b, &d);
  Params p;
  CHECK_EQ_INT(params_parse(OP_GEMM, "transB=1", &p, &d), TEQ_OK);
  int gm = graph_add_node(g, OP_GEMM, (TensorRef[]){{x, 0}, {wi, 0}, {bi, 0}}, 3, 1, &p, "fc",
                          &d);
  int r = graph_add_node(g, OP_RELU, (TensorRef[]){{gm, 0}}, 1, 1, NULL, "r", &d);
  CHECK(gm >= 0 && r >= 0);
  graph_add_output(g, (TensorRef){r, 0}, "y", &d);
  char q[PATH_BUF];
  int rc = export_to_tmp(g, "gemm_relu.onnx", q);
  OnnxImportStats st;
  Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  if (h) {
    CHECK_EQ_INT(st.n_activations_fused, 1);
    CHECK_EQ_INT(count_fused(h, OP_GEMM, ACT_RELU), 1);
    CHECK_EQ_INT(count_kind(h, OP_RELU), 0);
    check_same_outputs(g, h, &sx, 53);
    check_gemm_key(h, "{transA=0 transB=1 alpha=1 beta=1 act=relu}");
    Graph *k = written_and_read(h, "gemm_relu_again.onnx", NULL, true, &st, &d);
    if (k) {
      CHECK_EQ_INT(count_fused(k, OP_GEMM, ACT_NONE), 1);
      CHECK_EQ_INT(count_kind(k, OP_RELU), 1);
      check_gemm_key(k, "{transA=0 transB=1 alpha=1 beta=1}");
      check_same_outputs(g, k, &sx, 54);
    }
    graph_free(k);
  }
  graph_free(h);
  graph_free(g);
  diag_fini(&d);
}

/* Weights of a page or more travel without copies: the exported
 * initializer points at the graph's tensor (the exporter holds a reference
 * until the file is written), and the imported one takes the
 * decoder's buffer over. Under ASan a wrong owner shows up as a double free
 * or a leak. The model is read once from its file (mapped) and once
 * through a pipe (read), each with both sizes of weight. */
static void test_large_weights(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = {2, {1, 300}}, sw = {2, {300, 40}}, sb = {1, {40}};
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  Tensor *w = tensor_new(DT_F32, &sw), *b = tensor_new(DT_F32, &sb);
  tensor_fill_random(w, 11); /* 48000 bytes: lent and taken over */
  tensor_fill_random(b, 12); /* 160 bytes: copied */
  int wi = graph_add_const(g, "w", w, &d), bi = graph_add_const(g, "b", b, &d);
  int mm = graph_add_node(g, OP_MATMUL, (TensorRef[]){{x, 0}, {wi, 0}}, 2, 1, NULL, "mm", &d);
  int y = graph_add_node(g, OP_EWADD, (TensorRef[]){{mm, 0}, {bi, 0}}, 2, 1, NULL, "y", &d);
  CHECK(x >= 0 && wi >= 0 && bi >= 0 && mm >= 0 && y >= 0);
  graph_add_output(g, (TensorRef){y, 0}, "y", &d);
  char q[PATH_BUF];
  int rc = export_to_tmp(g, "large.onnx", q);
  int fds[2] = {-1, -1};
  pid_t child = -1;
  if (rc == TEQ_OK && pipe(fds) == 0 && (child = fork()) == 0) {
    close(fds[0]);
    FILE *f = fopen(q, "rb");
    char buf[4096];
    size_t n;
    while (f && (n = fread(buf, 1, sizeof buf, f)) > 0)
      if (write(fds[1], buf, n) != (ssize_t)n) break;
    _exit(0);
  }
  if (fds[1] >= 0) close(fds[1]);
  char piped[64];
  snprintf(piped, sizeof piped, "/dev/fd/%d", fds[0]);
  const char *paths[2] = {q, piped};
  Tensor *in = tensor_new(DT_F32, &sx), *want = NULL;
  tensor_fill_random(in, 13);
  CHECK_EQ_INT(exec_run(g, EXEC_F32, &in, &want, &d), TEQ_OK);
  OnnxImportOptions as_given = ONNX_IMPORT_DEFAULTS; /* the bias stays an Add: the same sums */
  onnx_import_as_given(&as_given);
  for (int k = 0; k < 2 && rc == TEQ_OK; k++) {
    if (k == 1 && child < 0) break;
    OnnxImportStats st;
    Graph *h = import(paths[k], &as_given, &st, &d);
    Tensor *got = NULL;
    if (h) CHECK_EQ_INT(exec_run(h, EXEC_F32, &in, &got, &d), TEQ_OK);
    CHECK_MSG(want && got && max_abs_err(want, got) == 0, "%s: outputs differ", paths[k]);
    tensor_unref(got);
    graph_free(h);
  }
  if (fds[0] >= 0) close(fds[0]);
  if (child > 0) waitpid(child, NULL, 0);
  tensor_unref(want);
  tensor_unref(in);
  graph_free(g);
  diag_fini(&d);
}

/* Weights in files beside the model: read (two tensors in one file, one in
 * a subdirectory), written back beside an exported model when asked, and
 * inline when not; a model given as a buffer has no directory to read
 * them from. */
static void test_external_data(void) {
  OnnxImportStats st;
  Tensor *want = check_reference("external_data", NULL, &st);
  CHECK_EQ_INT(st.n_external, 3);
  char p[PATH_BUF], q[PATH_BUF], r[PATH_BUF];
  Diag d;
  diag_init(&d);
  Graph *g = import(data("external_data.onnx", p), NULL, NULL, &d);
  Tensor *x = read_tensor("external_data.input_0.pb");
  /* asked: the two weights of 1 KiB and more go to ext.onnx.data, the 32-byte bias stays */
  OnnxExportOptions eo = {.external = true};
  int rc = g ? onnx_export_file(g, tmp("ext.onnx", q), &eo, &d) : TEQ_ERR_INPUT;
  CHECK_MSG(rc == TEQ_OK, "export: %s", d.text ? d.text : "");
  struct stat sm, sd;
  CHECK(stat(q, &sm) == 0 && stat(tmp("ext.onnx.data", r), &sd) == 0);
  CHECK_MSG(sm.st_size < 1024 && sd.st_size == 2048 + 1024, "model %lld, data %lld bytes",
            (long long)sm.st_size, (long long)sd.st_size);
  Graph *h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  CHECK_EQ_INT(st.n_external, 2);
  Tensor *y = h && x ? run(h, x) : NULL;
  CHECK_MSG(y && want && max_abs_err(y, want) == 0, "external round trip differs");
  tensor_unref(y);
  graph_free(h);
  /* not asked: everything in the model */
  rc = g ? onnx_export_file(g, tmp("inline.onnx", q), NULL, &d) : TEQ_ERR_INPUT;
  h = rc == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  CHECK_EQ_INT(st.n_external, 0);
  CHECK(access(tmp("inline.onnx.data", r), F_OK) != 0);
  y = h && x ? run(h, x) : NULL;
  CHECK_MSG(y && want && max_abs_err(y, want) == 0, "inline round trip differs");
  tensor_unref(y);
  graph_free(h);
  /* a buffer */
  FILE *f = fopen(data("external_data.onnx", p), "rb");
  static unsigned char model[4096];
  size_t n = f ? fread(model, 1, sizeof model, f) : 0;
  if (f) fclose(f);
  Graph *b = NULL;
  CHECK_EQ_INT(onnx_import_buffer(model, n, "buffer-name", NULL, &b, NULL, &d),
               TEQ_ERR_UNSUPPORTED);
  CHECK(!b && strstr(diag_last(&d), "initializers of a model read from a file"));
  tensor_unref(x);
  tensor_unref(want);
  graph_free(g);
  diag_fini(&d);
}

/* GELUs written out in erf, in PyTorch's order and BERT's, and in tanh,
 * fused at import (and one with + 2, which is none, left as written); ONNX's own Gelu in
 * both forms; both against references in double, and through export. */
static void test_gelu(void) {
  OnnxImportStats st;
  tensor_unref(check_reference("gelu_written", NULL, &st));
  CHECK_EQ_INT(st.n_gelus_fused, 3);
  tensor_unref(check_reference("gelu_lookalike", NULL, &st));
  CHECK_EQ_INT(st.n_gelus_fused, 0);
  tensor_unref(check_reference("gelu_native", NULL, &st));
  CHECK_EQ_INT(st.opset, 20);
  char p[PATH_BUF];
  Diag d;
  diag_init(&d);
  Graph *g = import(data("gelu_written.onnx", p), NULL, NULL, &d);
  if (g) CHECK(count_kind(g, OP_GELU) == 3 && count_kind(g, OP_ERF) == 1 &&
               count_kind(g, OP_TANH) == 0);
  graph_free(g);
  OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
  o.keep_written_gelus = true;
  g = import(p, &o, &st, &d);
  if (g) CHECK(count_kind(g, OP_GELU) == 0 && count_kind(g, OP_ERF) == 3 && st.n_gelus_fused == 0);
  graph_free(g);
  /* the tanh one is fused with approximate = tanh */
  g = import(p, NULL, NULL, &d);
  int tanh_form = 0;
  for (int32_t i = 0; g && i < g->n_nodes; i++)
    tanh_form += g->nodes[i].kind == OP_GELU && param_int(&g->nodes[i].params, 0) == 1;
  CHECK_EQ_INT(tanh_form, 1);
  graph_free(g);
  diag_fini(&d);
  check_round_trip("gelu_written");
  check_round_trip("gelu_native");
}

/* The graph of MODEL.onnx imported with the defaults, NULL on failure. */
static Graph *import_model(const char *model) {
  char p[PATH_BUF], name[256];
  Diag d;
  diag_init(&d);
  snprintf(name, sizeof name, "%s.onnx", model);
  Graph *g = import(data(name, p), NULL, NULL, &d);
  diag_fini(&d);
  return g;
}

/* An import-time fusion's test model: against its reference imported
 * fused (*fused: the stats) and as given (*given), and through export;
 * returns the fused graph, for the caller to count its kinds. */
static Graph *check_fusion_model(const char *model, OnnxImportStats *fused,
                                 OnnxImportStats *given) {
  tensor_unref(check_reference(model, NULL, fused));
  OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
  onnx_import_as_given(&o);
  tensor_unref(check_reference(model, &o, given));
  check_round_trip(model);
  return import_model(model);
}

/* SiLU (both operand orders) and Hardswish written out, fused at import;
 * a hard_sigmoid of another alpha, a sigmoid read twice and one gating
 * another tensor left as written; as given, none. */
static void test_swishes(void) {
  OnnxImportStats st, given;
  Graph *g = check_fusion_model("swishes", &st, &given);
  CHECK_EQ_INT(st.n_swishes_fused, 3);
  CHECK_EQ_INT(given.n_swishes_fused, 0);
  if (g) CHECK(count_kind(g, OP_SILU) == 2 && count_kind(g, OP_HARD_SWISH) == 1 &&
               count_kind(g, OP_SIGMOID) == 2 && count_kind(g, OP_HARD_SIGMOID) == 1 &&
               count_kind(g, OP_EWMUL) == 3);
  graph_free(g);
}

/* How many nodes of each kind a fused model keeps, each named when wrong. */
typedef struct KindCount {
  OpKind kind;
  int n;
} KindCount;

static void check_kind_counts(const Graph *g, const char *model, const KindCount *want, int n) {
  for (int i = 0; g && i < n; i++)
    CHECK_MSG(count_kind(g, want[i].kind) == want[i].n, "%s: %d %s nodes, %d expected", model,
              count_kind(g, want[i].kind), op_def(want[i].kind)->name, want[i].n);
}

/* Paddle's hard swish written out, x * clip(x + 3, 0, 6) / 6, and the gate
 * clip(x + 3, 0, 6) / 6 (or * 1/6) alone or multiplying x, fused at import;
 * a product of another tensor, a clip read twice and a division by 5 left
 * as written; as given, none. */
static void test_hard_gates(void) {
  OnnxImportStats st, given;
  Graph *g = check_fusion_model("hard_gates", &st, &given);
  CHECK_EQ_INT(st.n_hard_gates_fused, 3);
  CHECK_EQ_INT(st.n_swishes_fused, 1);
  CHECK_EQ_INT(given.n_hard_gates_fused + given.n_swishes_fused, 0);
  check_kind_counts(
      g, "hard_gates",
      (KindCount[]){{OP_HARD_SWISH, 2}, {OP_HARD_SIGMOID, 1}, {OP_CLIP, 3}, {OP_DIV, 3}}, 4);
  graph_free(g);
}

/* PP-LCNetV3's affine blocks: a scale and a shift after a convolution
 * folded into it, after its relu into the 1x1 convolution (two groups,
 * stride 2) that reads them, and a scale before a padded convolution into
 * that one; a scale of a convolution read twice and a shift by a
 * whole-tensor constant left as written; as given, none. */
static void test_conv_affines(void) {
  OnnxImportStats st, given;
  Graph *g = check_fusion_model("conv_affines", &st, &given);
  CHECK_EQ_INT(st.n_scales_folded, 5);
  CHECK_EQ_INT(given.n_scales_folded, 0);
  check_kind_counts(g, "conv_affines",
                    (KindCount[]){{OP_CONV2D, 4}, {OP_EWMUL, 1}, {OP_EWADD, 2}}, 3);
  graph_free(g);
}

/* Affines before convolutions: a BatchNorm before a padded, strided one
 * and a shift and scale before a padded, grouped, dilated one fold in,
 * each with a constant residual for the border; a BatchNorm before a 1x1
 * one folds into its bias alone. A BatchNorm before a convolution that
 * took a residual add, and one the graph returns, stay; as given, none
 * fold. */
static void test_affines_before_convs(void) {
  OnnxImportStats st, given;
  Graph *g = check_fusion_model("affines_before_convs", &st, &given);
  CHECK_EQ_INT(st.n_batchnorm_folded, 2);
  CHECK_EQ_INT(st.n_scales_folded, 2);
  CHECK_EQ_INT(st.n_residuals_fused, 1);
  CHECK_EQ_INT(given.n_batchnorm_folded + given.n_scales_folded, 0);
  check_kind_counts(g, "affines_before_convs",
                    (KindCount[]){{OP_CONV2D, 5}, {OP_BATCHNORM, 2}, {OP_EWMUL, 0}, {OP_EWADD, 0}},
                    4);
  /* The two padded convolutions that folded a shift read a constant
   * residual; the 1x1 one reads none, the one with the add reads it. */
  int constant_z = 0, no_z = 0;
  for (int32_t i = 0; g && i < g->n_nodes; i++) {
    const Node *n = &g->nodes[i];
    if (n->kind != OP_CONV2D) continue;
    no_z += n->n_in < 4;
    constant_z += n->n_in == 4 && g->nodes[n->in[3].node].kind == OP_CONST;
  }
  CHECK_MSG(constant_z == 2 && no_z == 2, "%d convolutions with a constant residual, %d with none",
            constant_z, no_z);
  graph_free(g);
}

/* A transposed convolution's per-channel add, BatchNorm and scale fold into
 * it (two groups, then one with a bias and padding); its relu stays; as
 * given, none fold. */
static void test_conv_transpose_affines(void) {
  OnnxImportStats st, given;
  Graph *g = check_fusion_model("conv_transpose_affines", &st, &given);
  CHECK_EQ_INT(st.n_batchnorm_folded, 1);
  CHECK_EQ_INT(st.n_scales_folded, 2);
  CHECK_EQ_INT(given.n_batchnorm_folded + given.n_scales_folded, 0);
  check_kind_counts(g, "conv_transpose_affines",
                    (KindCount[]){{OP_CONV_TRANSPOSE, 2}, {OP_BATCHNORM, 0}, {OP_EWADD, 0},
                                  {OP_EWMUL, 0}, {OP_RELU, 1}},
                    5);
  graph_free(g);
}

/* A BatchNorm of 16 channels on input x of shape sx, then a 3x3
 * convolution to 16 channels with padding 1 (weights drawn from seed),
 * the graph's output y. */
static Graph *bn_before_padded_conv(const Shape *sx, uint64_t seed, Diag *d) {
  Graph *g = graph_new();
  int x = graph_add_input(g, "x", sx, DT_F32, d);
  TensorRef in[5] = {{x, 0}};
  for (int j = 1; j < 5; j++) { /* scale, bias, mean, variance */
    Tensor *c = tensor_new(DT_F32, &(Shape){1, {16}});
    for (int e = 0; e < 16; e++) ((float *)c->data)[e] = 0.5f + 0.125f * (float)((e + j) % 5);
    in[j] = (TensorRef){graph_add_const(g, NULL, c, d), 0};
  }
  int bn = graph_add_node(g, OP_BATCHNORM, in, 5, 1, NULL, "bn", d);
  Tensor *w = tensor_new(DT_F32, &(Shape){4, {16, 16, 3, 3}});
  tensor_fill_random(w, seed);
  Params cp;
  params_default(OP_CONV2D, &cp);
  param_set_ints(&cp, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
  TensorRef cin[2] = {{bn, 0}, {graph_add_const(g, "w", w, d), 0}};
  int y = graph_add_node(g, OP_CONV2D, cin, 2, 1, &cp, "conv", d);
  graph_add_output(g, (TensorRef){y, 0}, "y", d);
  return g;
}

/* A BatchNorm before a padded convolution folds with a border residual of
 * the output's size, a constant the model carries: up to 16M elements
 * (64 MB), not for [1, 16, 1025, 1024]. Import only: nothing runs. */
static void test_border_residual_cap(void) {
  for (int big = 0; big < 2; big++) {
    Diag d;
    diag_init(&d);
    Shape sx = {4, {1, 16, big ? 1025 : 64, big ? 1024 : 64}};
    Graph *g = bn_before_padded_conv(&sx, 17, &d);
    char q[PATH_BUF];
    OnnxImportStats st;
    Graph *h = export_to_tmp(g, "border_cap.onnx", q) == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
    CHECK_MSG(h != NULL, "%s", diag_last(&d));
    if (h) {
      CHECK_EQ_INT(st.n_batchnorm_folded, big ? 0 : 1);
      CHECK_EQ_INT(count_kind(h, OP_BATCHNORM), big ? 1 : 0);
    }
    graph_free(h);
    graph_free(g);
    diag_fini(&d);
  }
}

/* The file size of path, or -1. */
static long file_bytes(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* The constant node read as input k of the first node of kind k0 in g, or
 * NULL. */
static const Tensor *constant_input(const Graph *g, OpKind k0, int k) {
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const Node *n = &g->nodes[i];
    if (n->kind != k0 || n->n_in <= k) continue;
    const Node *c = &g->nodes[n->in[k].node];
    return c->kind == OP_CONST ? c->value : NULL;
  }
  return NULL;
}

/* A constant that repeats along its axes is written as its distinct slices
 * and Gathers, and read back to the bit: the border residual of a
 * BatchNorm folded before a padded convolution (zero inside; 256 KB dense),
 * and a constant of repeated rows with a -0 where the others hold 0, which
 * must survive as its own slice. One that does not repeat is written as it
 * is. */
static void test_constants_as_slices(void) {
  Diag d;
  diag_init(&d);
  char q[PATH_BUF];
  /* The border residual: BN, then a 3x3 convolution with padding. */
  Shape sx = {4, {1, 16, 64, 64}};
  Graph *g = bn_before_padded_conv(&sx, 19, &d);
  OnnxImportStats st;
  Graph *folded = export_to_tmp(g, "slices_in.onnx", q) == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
  Graph *back = folded && export_to_tmp(folded, "slices_out.onnx", q) == TEQ_OK
                    ? import(q, NULL, &st, &d)
                    : NULL;
  const Tensor *z0 = folded ? constant_input(folded, OP_CONV2D, 3) : NULL;
  const Tensor *z1 = back ? constant_input(back, OP_CONV2D, 3) : NULL;
  CHECK_MSG(z0 && z1, "a convolution reading a constant residual before (%p) and after (%p)",
            (const void *)z0, (const void *)z1);
  if (z0 && z1) {
    CHECK(shape_equal(&z0->shape, &z1->shape) &&
          memcmp(z0->data, z1->data, (size_t)tensor_numel(z0) * sizeof(float)) == 0);
    /* The weights (9.2 KB) and a few hundred bytes of slices and indices. */
    long bytes = file_bytes(q);
    CHECK_MSG(bytes > 0 && bytes < 16 * 1024, "%ld bytes written", bytes);
  }
  if (back) check_same_outputs(folded, back, &sx, 23);
  graph_free(back);
  graph_free(folded);
  graph_free(g);

  /* Rows alike but one, which holds a -0: x + c, exported and read back. */
  for (int repeats = 0; repeats < 2; repeats++) {
    g = graph_new();
    Shape sc = {2, {256, 128}};
    int x = graph_add_input(g, "x", &sc, DT_F32, &d);
    Tensor *c = tensor_new(DT_F32, &sc);
    if (repeats) {
      for (int64_t r = 0; r < 256; r++)
        for (int64_t k = 0; k < 128; k++) ((float *)c->data)[r * 128 + k] = (float)(k % 7);
      ((float *)c->data)[200 * 128 + 7] = -0.0f; /* the others hold +0 there */
    } else {
      tensor_fill_random(c, 29);
    }
    TensorRef ain[2] = {{x, 0}, {graph_add_const(g, "c", c, &d), 0}};
    int a = graph_add_node(g, OP_EWADD, ain, 2, 1, NULL, "add", &d);
    graph_add_output(g, (TensorRef){a, 0}, "y", &d);
    back = export_to_tmp(g, "slices_rows.onnx", q) == TEQ_OK ? import(q, NULL, &st, &d) : NULL;
    const Tensor *c1 = back ? constant_input(back, OP_EWADD, 1) : NULL;
    CHECK_MSG(c1 && shape_equal(&c1->shape, &sc) &&
                  memcmp(c1->data, c->data, (size_t)tensor_numel(c) * sizeof(float)) == 0,
              "the constant read back differs (repeats %d)", repeats);
    long bytes = file_bytes(q);
    CHECK_MSG(repeats ? bytes > 0 && bytes < 8 * 1024 : bytes > 128 * 1024, "%ld bytes written",
              bytes);
    graph_free(back);
    graph_free(g);
  }
  diag_fini(&d);
}

/* A product's bias: x [2, 5, 8] times W [8, 6] plus a bias, then a relu,
 * becomes one gemm (x seen as [10, 8], the bias its C, the relu its act)
 * between reshapes, with the outputs as given. Left as written: a bias
 * that varies along the rows, and a product that is also a graph output.
 * A two-dimensional x takes no reshape; a bias written first is taken
 * too; so is a second linear layer reading the first (the pass's second
 * round: it reads a reshape the first made). */
static void test_product_biases(void) {
  enum { PLAIN, ROWS, SHARED, FLAT, BIAS_FIRST, CHAIN, N_CASES };
  for (int c = 0; c < N_CASES; c++) {
    Diag d;
    diag_init(&d);
    Graph *g = graph_new();
    Shape sx = c == FLAT ? (Shape){2, {5, 8}} : (Shape){3, {2, 5, 8}};
    int x = graph_add_input(g, "x", &sx, DT_F32, &d);
    Tensor *w = tensor_new(DT_F32, &(Shape){2, {8, 6}});
    Tensor *b = tensor_new(DT_F32, c == ROWS ? &(Shape){2, {5, 1}} : &(Shape){1, {6}});
    tensor_fill_random(w, 31);
    tensor_fill_random(b, 37);
    TensorRef min[2] = {{x, 0}, {graph_add_const(g, "w", w, &d), 0}};
    int p = graph_add_node(g, OP_MATMUL, min, 2, 1, NULL, "prod", &d);
    TensorRef bias = {graph_add_const(g, "b", b, &d), 0};
    TensorRef ain[2] = {{p, 0}, bias};
    if (c == BIAS_FIRST) ain[0] = bias, ain[1] = (TensorRef){p, 0};
    int a = graph_add_node(g, OP_EWADD, ain, 2, 1, NULL, "add", &d);
    if (c == CHAIN) {
      Tensor *w2 = tensor_new(DT_F32, &(Shape){2, {6, 6}});
      Tensor *b2 = tensor_new(DT_F32, &(Shape){1, {6}});
      tensor_fill_random(w2, 43);
      tensor_fill_random(b2, 47);
      TensorRef in2[2] = {{a, 0}, {graph_add_const(g, "w2", w2, &d), 0}};
      int p2 = graph_add_node(g, OP_MATMUL, in2, 2, 1, NULL, "prod2", &d);
      TensorRef a2in[2] = {{p2, 0}, {graph_add_const(g, "b2", b2, &d), 0}};
      a = graph_add_node(g, OP_EWADD, a2in, 2, 1, NULL, "add2", &d);
    }
    int r = graph_add_node(g, OP_RELU, (TensorRef[]){{a, 0}}, 1, 1, NULL, "relu", &d);
    graph_add_output(g, (TensorRef){r, 0}, "y", &d);
    if (c == SHARED) graph_add_output(g, (TensorRef){p, 0}, "p", &d);
    OnnxImportStats st, st_given;
    Graph *h = written_and_read(g, "product_bias.onnx", NULL, false, &st, &d);
    Graph *given = written_and_read(g, "product_bias.onnx", NULL, true, &st_given, &d);
    int fused = c == CHAIN ? 2 : c == PLAIN || c == FLAT || c == BIAS_FIRST;
    if (h && given) {
      CHECK_MSG(st.n_biases_fused == fused, "case %d: %d fused", c, st.n_biases_fused);
      CHECK_EQ_INT(st_given.n_biases_fused, 0);
      CHECK_EQ_INT(count_kind(h, OP_GEMM), fused);
      CHECK_EQ_INT(count_kind(h, OP_EWADD), !fused);
      CHECK_EQ_INT(count_kind(h, OP_RESHAPE), fused && c != FLAT ? 2 * fused : 0);
      int relus = 0; /* fused into the last gemm */
      for (int32_t i = 0; fused && i < h->n_nodes; i++)
        if (h->nodes[i].kind == OP_GEMM)
          relus += param_int(&h->nodes[i].params, param_index(OP_GEMM, "act")) == ACT_RELU;
      CHECK_EQ_INT(relus, fused ? 1 : 0);
      check_outputs_within(given, h, &sx, 41, 1e-6);
    }
    graph_free(given);
    graph_free(h);
    graph_free(g);
    diag_fini(&d);
  }
}

/* A transformer's residual: relu(x + (x W + b)) with x [2, 5, 8] (FLAT:
 * [5, 8]). The bias makes a gemm of x seen as [10, 8] between reshapes;
 * the add then reads it through the reshape back, and takes it as the
 * gemm's residual (x reshaped to [10, 8]), the relu as its act: no Add
 * left. Not where the product is also a graph output (no gemm, SHARED)
 * or the reshaped sum is read twice (TWICE: the add's other reader). As
 * given, and with keep_unfused_residuals, the Add stays; written back,
 * the fused gemm is a Gemm and an Add again. */
static void test_product_residuals(void) {
  enum { TOKENS, FLAT, SHARED, TWICE, N_CASES };
  for (int c = 0; c < N_CASES; c++) {
    Diag d;
    diag_init(&d);
    Graph *g = graph_new();
    Shape sx = c == FLAT ? (Shape){2, {5, 8}} : (Shape){3, {2, 5, 8}};
    int x = graph_add_input(g, "x", &sx, DT_F32, &d);
    Tensor *w = tensor_new(DT_F32, &(Shape){2, {8, 8}}), *b = tensor_new(DT_F32, &(Shape){1, {8}});
    tensor_fill_random(w, 51);
    tensor_fill_random(b, 53);
    TensorRef min[2] = {{x, 0}, {graph_add_const(g, "w", w, &d), 0}};
    int p = graph_add_node(g, OP_MATMUL, min, 2, 1, NULL, "prod", &d);
    TensorRef ain[2] = {{p, 0}, {graph_add_const(g, "b", b, &d), 0}};
    int a = graph_add_node(g, OP_EWADD, ain, 2, 1, NULL, "bias", &d);
    int s = graph_add_node(g, OP_EWADD, (TensorRef[]){{x, 0}, {a, 0}}, 2, 1, NULL, "sum", &d);
    int r = graph_add_node(g, OP_RELU, (TensorRef[]){{s, 0}}, 1, 1, NULL, "relu", &d);
    graph_add_output(g, (TensorRef){r, 0}, "y", &d);
    if (c == SHARED) graph_add_output(g, (TensorRef){p, 0}, "p", &d);
    if (c == TWICE) graph_add_output(g, (TensorRef){a, 0}, "a", &d);
    OnnxImportStats st, st_given, st_kept;
    OnnxImportOptions kept = ONNX_IMPORT_DEFAULTS;
    kept.keep_unfused_residuals = true;
    Graph *h = written_and_read(g, "product_residual.onnx", NULL, false, &st, &d);
    Graph *given = written_and_read(g, "product_residual.onnx", NULL, true, &st_given, &d);
    Graph *k = written_and_read(g, "product_residual.onnx", &kept, false, &st_kept, &d);
    bool fused = c == TOKENS || c == FLAT;
    if (h && given && k) {
      CHECK_MSG(st.n_residuals_fused == fused, "case %d: %d residuals fused", c,
                st.n_residuals_fused);
      CHECK_EQ_INT(count_residual(h, OP_GEMM), fused);
      CHECK_EQ_INT(count_kind(h, OP_EWADD), fused ? 0 : c == SHARED ? 2 : 1);
      CHECK_EQ_INT(count_kind(h, OP_RELU), !fused); /* fused: the gemm's act */
      CHECK_EQ_INT(count_residual(k, OP_GEMM), 0);
      CHECK_EQ_INT(st_given.n_residuals_fused, 0);
      check_outputs_within(given, h, &sx, 57, 1e-6);
      if (fused) { /* a Gemm and an Add again, read back as they were fused */
        Graph *back = written_and_read(h, "product_residual_again.onnx", &kept, false, &st, &d);
        if (back) {
          CHECK_EQ_INT(count_residual(back, OP_GEMM), 0);
          CHECK_EQ_INT(count_kind(back, OP_EWADD), 1);
          check_outputs_within(given, back, &sx, 58, 1e-6);
        }
        graph_free(back);
      }
    }
    graph_free(k);
    graph_free(given);
    graph_free(h);
    graph_free(g);
    diag_fini(&d);
  }
}

/* A node of kind on input r of g with integer-list parameters (name,
 * values) set: its output k. */
static TensorRef layout_node(Graph *g, OpKind kind, TensorRef r, int k, int n_out, const char *p1,
                             const int64_t *v1, int n1, const char *p2, const int64_t *v2, int n2,
                             Diag *d) {
  Params p;
  params_default(kind, &p);
  if (p1) param_set_ints(&p, param_index(kind, p1), v1, n1);
  if (p2) param_set_ints(&p, param_index(kind, p2), v2, n2);
  return (TensorRef){graph_add_node(g, kind, &r, 1, n_out, &p, NULL, d), k};
}

/* Columns [from, to) of rows [0, rows) of the [4, 24] tensor r in g. */
static TensorRef columns_of(Graph *g, TensorRef r, int64_t rows, int64_t from, int64_t to,
                            Diag *d) {
  Params p;
  params_default(OP_SLICE, &p);
  param_set_ints(&p, param_index(OP_SLICE, "starts"), (int64_t[]){0, from}, 2);
  param_set_ints(&p, param_index(OP_SLICE, "ends"), (int64_t[]){rows, to}, 2);
  param_set_ints(&p, param_index(OP_SLICE, "steps"), (int64_t[]){1, 1}, 2);
  return (TensorRef){graph_add_node(g, OP_SLICE, &r, 1, 1, &p, NULL, d), 0};
}

/* Attention's query scale folds into its columns of the product that made
 * queries, keys and values together: x [4, 8] times W [8, 24], cut by a
 * reshape, a transpose and a split, by three slices, or by three gathers,
 * and the query divided or multiplied by one value (and the keys too, in
 * a second round). Left as written: a key
 * slice that overlaps the query's columns, a query of half the rows, and a
 * gather that takes one element twice. Each against the graph as given. */
static void test_head_scales(void) {
  enum { SPLIT, SLICES, GATHERS, OVERLAP, HALF_ROWS, GATHER_TWICE, KEYS_TOO, N_CASES };
  for (int c = 0; c < N_CASES; c++) {
    Diag d;
    diag_init(&d);
    Graph *g = graph_new();
    Shape sx = {2, {4, 8}};
    int x = graph_add_input(g, "x", &sx, DT_F32, &d);
    Tensor *w = tensor_new(DT_F32, &(Shape){2, {8, 24}});
    tensor_fill_random(w, 53);
    TensorRef min[2] = {{x, 0}, {graph_add_const(g, "w", w, &d), 0}};
    TensorRef p = {graph_add_node(g, OP_MATMUL, min, 2, 1, NULL, "qkv", &d), 0}, q, k, v;
    if (c == SPLIT || c == GATHERS || c == GATHER_TWICE || c == KEYS_TOO) {
      TensorRef r = layout_node(g, OP_RESHAPE, p, 0, 1, "shape", (int64_t[]){4, 3, 8}, 3, NULL,
                                NULL, 0, &d);
      TensorRef t = layout_node(g, OP_TRANSPOSE, r, 0, 1, "perm", (int64_t[]){1, 0, 2}, 3, NULL,
                                NULL, 0, &d);
      if (c == SPLIT || c == KEYS_TOO) {
        const int64_t sizes[3] = {1, 1, 1};
        q = layout_node(g, OP_SPLIT, t, 0, 3, "axis", (int64_t[]){0}, 1, "sizes", sizes, 3, &d);
        k = (TensorRef){q.node, 1}, v = (TensorRef){q.node, 2};
      } else {
        TensorRef got[3];
        for (int j = 0; j < 3; j++) {
          Tensor *idx = tensor_new(DT_I64, c == GATHER_TWICE && j == 0 ? &(Shape){1, {2}}
                                                                      : &(Shape){0, {0}});
          ((int64_t *)idx->data)[0] = j;
          if (tensor_numel(idx) == 2) ((int64_t *)idx->data)[1] = j;
          TensorRef gin[2] = {t, {graph_add_const(g, NULL, idx, &d), 0}};
          got[j] = (TensorRef){graph_add_node(g, OP_GATHER, gin, 2, 1, NULL, NULL, &d), 0};
        }
        q = got[0], k = got[1], v = got[2];
      }
    } else {
      q = columns_of(g, p, c == HALF_ROWS ? 2 : 4, 0, 8, &d);
      k = columns_of(g, p, 4, c == OVERLAP ? 4 : 8, 16, &d);
      v = columns_of(g, p, 4, 16, 24, &d);
    }
    Tensor *s = tensor_new(DT_F32, &(Shape){0, {0}});
    ((float *)s->data)[0] = c % 2 ? 0.375f : 2.5f;
    TensorRef sin[2] = {q, {graph_add_const(g, "scale", s, &d), 0}};
    int scaled = graph_add_node(g, c % 2 ? OP_EWMUL : OP_DIV, sin, 2, 1, NULL, "scaled", &d);
    if (c == KEYS_TOO) { /* a second fold, on the product the first made */
      TensorRef kin[2] = {k, {graph_add_const(g, "k_scale", tensor_ref(s), &d), 0}};
      k = (TensorRef){graph_add_node(g, OP_EWMUL, kin, 2, 1, NULL, "k_scaled", &d), 0};
    }
    graph_add_output(g, (TensorRef){scaled, 0}, "q", &d);
    graph_add_output(g, k, "k", &d);
    graph_add_output(g, v, "v", &d);
    OnnxImportStats st, st_given;
    Graph *h = written_and_read(g, "head_scale.onnx", NULL, false, &st, &d);
    Graph *given = written_and_read(g, "head_scale.onnx", NULL, true, &st_given, &d);
    int folded = c == KEYS_TOO ? 2 : c == SPLIT || c == SLICES || c == GATHERS;
    if (h && given) {
      CHECK_MSG(st.n_scales_folded == folded, "case %d: %d folded", c, st.n_scales_folded);
      CHECK_EQ_INT(st_given.n_scales_folded, 0);
      CHECK_EQ_INT(count_kind(h, OP_DIV) + count_kind(h, OP_EWMUL), !folded);
      check_outputs_within(given, h, &sx, 59, 1e-6);
    }
    graph_free(given);
    graph_free(h);
    graph_free(g);
    diag_fini(&d);
  }
}

/* A BatchNorm of the given channels on x, its constants drawn from seed:
 * the node's id. */
static int batchnorm_of(Graph *g, TensorRef x, int64_t channels, uint64_t seed, Diag *d) {
  TensorRef in[5] = {x};
  for (int j = 1; j < 5; j++) { /* scale, bias, mean, variance */
    Tensor *c = tensor_new(DT_F32, &(Shape){1, {channels}});
    tensor_fill_random(c, seed + (uint64_t)j);
    for (int64_t e = 0; j == 4 && e < channels; e++) /* a variance: positive */
      ((float *)c->data)[e] = 0.5f + ((float *)c->data)[e] * ((float *)c->data)[e];
    in[j] = (TensorRef){graph_add_const(g, NULL, c, d), 0};
  }
  return graph_add_node(g, OP_BATCHNORM, in, 5, 1, NULL, NULL, d);
}

/* BatchNorms around a gemm, IResNet's embedding: a BatchNorm over
 * [2, 4, 3, 3], flattened per sample, into the gemm's weights, and a
 * BatchNorm1d after it into its weights and bias; both against the graph
 * as given. A flatten across the samples ([2, 4, 3, 3] as [1, 72]) keeps
 * its BatchNorm. */
static void test_batchnorms_around_gemms(void) {
  for (int across = 0; across < 2; across++) {
    Diag d;
    diag_init(&d);
    Graph *g = graph_new();
    Shape sx = {4, {2, 4, 3, 3}};
    int x = graph_add_input(g, "x", &sx, DT_F32, &d);
    int bn = batchnorm_of(g, (TensorRef){x, 0}, 4, 61, &d);
    Params rp;
    params_default(OP_RESHAPE, &rp);
    const int64_t flat[2] = {across ? 1 : 2, across ? 72 : 36};
    param_set_ints(&rp, param_index(OP_RESHAPE, "shape"), flat, 2);
    int r = graph_add_node(g, OP_RESHAPE, (TensorRef[]){{bn, 0}}, 1, 1, &rp, NULL, &d);
    Tensor *w = tensor_new(DT_F32, &(Shape){2, {5, flat[1]}});
    Tensor *c = tensor_new(DT_F32, &(Shape){1, {5}});
    tensor_fill_random(w, 67);
    tensor_fill_random(c, 71);
    Params gp;
    params_default(OP_GEMM, &gp);
    param_set_int(&gp, param_index(OP_GEMM, "transB"), 1);
    TensorRef gin[3] = {
        {r, 0}, {graph_add_const(g, "w", w, &d), 0}, {graph_add_const(g, "c", c, &d), 0}};
    int y = graph_add_node(g, OP_GEMM, gin, 3, 1, &gp, "embedding", &d);
    int bn1 = batchnorm_of(g, (TensorRef){y, 0}, 5, 73, &d);
    graph_add_output(g, (TensorRef){bn1, 0}, "y", &d);
    OnnxImportStats st, st_given;
    Graph *h = written_and_read(g, "bn_gemm.onnx", NULL, false, &st, &d);
    Graph *given = written_and_read(g, "bn_gemm.onnx", NULL, true, &st_given, &d);
    if (h && given) {
      CHECK_EQ_INT(st.n_batchnorm_folded, across ? 1 : 2);
      CHECK_EQ_INT(count_kind(h, OP_BATCHNORM), across ? 1 : 0);
      CHECK_EQ_INT(count_kind(given, OP_BATCHNORM), 2);
      check_outputs_within(given, h, &sx, 79, 1e-5);
    }
    graph_free(given);
    graph_free(h);
    graph_free(g);
    diag_fini(&d);
  }
}

/* Upsample of opset 9 and Resize of opset 10 read as resize (asymmetric,
 * nearest rounding down, as ONNX Runtime computes them), against a
 * reference in double; written back as Resize of opset 13. */
static void test_upsample_forms(void) {
  const char *models[] = {"upsample9", "upsample10"};
  for (int k = 0; k < 2; k++) {
    tensor_unref(check_reference(models[k], NULL, NULL));
    check_round_trip(models[k]);
    Graph *g = import_model(models[k]);
    check_kind_counts(g, models[k], (KindCount[]){{OP_RESIZE, 2}}, 1);
    graph_free(g);
  }
}

/* x * 1, 0 + t, t - 0 and t / ones dropped as given too, so that Paddle's
 * swish x * sigmoid(x * 1) fuses into its product; 0 - t, a division
 * that widens its result and a product by the float after 1 kept. A
 * written layer norm's gamma of ones and beta of zeros are not dropped
 * before it fuses (as given, they are: 6 no-ops). */
static void test_neutral_operands(void) {
  OnnxImportStats st, given;
  Graph *g = check_fusion_model("neutral_operands", &st, &given);
  CHECK_EQ_INT(st.n_noops_removed, 4);
  CHECK_EQ_INT(given.n_noops_removed, 6);
  CHECK_EQ_INT(st.n_layer_norms_fused, 1);
  CHECK_EQ_INT(st.n_swishes_fused, 1);
  check_kind_counts(g, "neutral_operands",
                    (KindCount[]){{OP_LAYER_NORM, 1}, {OP_SIGMOID, 0}, {OP_EWADD, 0},
                                  {OP_SUB, 1}, {OP_DIV, 1}, {OP_EWMUL, 1}},
                    6);
  graph_free(g);
}

/* A BatchNorm no conv takes (after a concat) takes the relu that alone
 * reads it as its fused act; one whose output the graph also returns keeps
 * its relu; as given, neither. */
static void test_bn_relu(void) {
  OnnxImportStats st, given;
  Graph *g = check_fusion_model("bn_relu", &st, &given);
  CHECK_EQ_INT(st.n_activations_fused, 1);
  CHECK_EQ_INT(given.n_activations_fused, 0);
  int fused = 0;
  for (int32_t i = 0; g && i < g->n_nodes; i++)
    fused += g->nodes[i].kind == OP_BATCHNORM &&
             param_int(&g->nodes[i].params, param_index(OP_BATCHNORM, "act")) == ACT_RELU;
  if (g) CHECK(fused == 1 && count_kind(g, OP_BATCHNORM) == 2 && count_kind(g, OP_RELU) == 1);
  graph_free(g);
}

/* Named symbolic dimensions: given extents reach the inputs and every
 * shape declared with those names (an opaque operator's output, which the
 * transpose after it needs); the rest get `batch`, listed in one warning;
 * a name no input has, a malformed entry and a repeated name are errors. */
static void test_symbolic_dims(void) {
  char p[PATH_BUF];
  data("symbolic_dims.onnx", p);
  Diag d;
  diag_init(&d);
  const char *seq5[] = {"seq=5"};
  OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
  o.batch = 2, o.dims = seq5, o.n_dims = 1;
  Graph *g = import(p, &o, NULL, &d);
  if (g) {
    CHECK(shape_equal(&g->nodes[g->inputs[0]].out[0], &(Shape){3, {2, 5, 8}}));
    CHECK(shape_equal(graph_shape(g, g->outputs[0]), &(Shape){3, {2, 4, 5}}));
    CHECK(strstr(d.text, "'batch' (input 'x', dimension 0)") && !strstr(d.text, "'seq'"));
  }
  graph_free(g);
  diag_fini(&d);
  diag_init(&d);
  g = import(p, NULL, NULL, &d);
  CHECK(g && shape_equal(graph_shape(g, g->outputs[0]), &(Shape){3, {1, 4, 1}}));
  CHECK(d.text && strstr(d.text, "symbolic dimensions set to 1: 'batch' (input 'x', dimension 0), "
                                 "'seq' (input 'x', dimension 1)"));
  graph_free(g);
  diag_fini(&d);
  const char *bad[][2] = {{"sequence=5", NULL}, {"seq", NULL}, {"seq=0", NULL},
                          {"seq=3", "seq=4"}};
  const char *want[] = {"no graph input has a symbolic dimension named 'sequence' (it has "
                        "'batch', 'seq')", "dimension 'seq': expected NAME=N",
                        "dimension 'seq=0': expected NAME=N", "dimension 'seq' is given twice"};
  for (int k = 0; k < 4; k++) {
    diag_init(&d);
    o = ONNX_IMPORT_DEFAULTS;
    o.dims = bad[k], o.n_dims = bad[k][1] ? 2 : 1;
    Graph *sentinel = (Graph *)&d, *h = sentinel;
    CHECK_EQ_INT(onnx_import_file(p, &o, &h, NULL, &d), TEQ_ERR_INPUT);
    CHECK_MSG(h == sentinel && strstr(diag_last(&d), want[k]), "%s: %s", bad[k][0],
              diag_last(&d));
    diag_fini(&d);
  }
}

/* ---- valid ONNX forms imported as other operators or as several ---- */

/* storage_order orders only a MaxPool's Indices output: with that output
 * absent, or named and read by nothing, the pool is a maxpool. */
static void test_maxpool_storage_order(void) {
  OnnxImportStats st;
  tensor_unref(check_reference("maxpool_storage_order", NULL, &st));
  CHECK_EQ_INT(st.n_opaque, 0);
  Graph *g = import_model("maxpool_storage_order");
  CHECK(g && count_kind(g, OP_MAXPOOL) == 2 && graph_count_ops(g) == 2);
  graph_free(g);
  check_round_trip("maxpool_storage_order");
}

/* A reduction over no axes (noop_with_empty_axes=1, axes absent or empty)
 * is the reduction of each element alone: a sum, mean or maximum becomes
 * an identity, which the no-op pass removes (or keep_noops keeps, with the
 * same values), an L2 norm an abs; the reductions over axes stay. */
static void test_reduce_noop(void) {
  const char *models[] = {"reduce_noop", "reduce_noop_opset18"};
  OpKind kept[] = {OP_REDUCE_SUM, OP_REDUCE_MEAN};
  int n_kept[] = {2, 1};
  for (int k = 0; k < 2; k++) {
    OnnxImportStats st;
    Tensor *removed = check_reference(models[k], NULL, &st);
    CHECK_EQ_INT(st.n_opaque, 0);
    CHECK_EQ_INT(st.n_noops_removed, 2);
    OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
    o.keep_noops = true;
    Tensor *identities = check_reference(models[k], &o, &st);
    CHECK_MSG(max_abs_err(removed, identities) == 0, "%s: removed vs kept: %g", models[k],
              max_abs_err(removed, identities));
    Graph *g = import_model(models[k]);
    CHECK_MSG(g && count_kind(g, OP_IDENTITY) == 0 && count_kind(g, kept[k]) == n_kept[k],
              "%s", models[k]);
    if (g && k == 1)
      CHECK(count_kind(g, OP_ABS) == 1 && count_kind(g, OP_REDUCE_MAX) == 0 &&
            count_kind(g, OP_REDUCE_L2) == 0);
    graph_free(g);
    check_round_trip(models[k]);
    tensor_unref(removed);
    tensor_unref(identities);
  }
}

/* ONNX's Max and Min of more than two inputs are chains of Teq's binary
 * max and min, broadcasting as the whole; a Max of one input is removed;
 * Sum and Mean stay one variadic node each. */
static void test_variadic(void) {
  OnnxImportStats st;
  tensor_unref(check_reference("variadic", NULL, &st));
  CHECK_EQ_INT(st.n_opaque, 0);
  CHECK_EQ_INT(st.n_noops_removed, 1);
  Graph *g = import_model("variadic");
  CHECK(g && count_kind(g, OP_MAX) == 2 && count_kind(g, OP_MIN) == 3 &&
        count_kind(g, OP_SUM) == 1 && count_kind(g, OP_MEAN) == 1 && graph_count_ops(g) == 7);
  graph_free(g);
  check_round_trip("variadic");
}

/* Convolutions and pools over one spatial axis are the 2-D operators over
 * [N, C, 1, L], between reshapes; each weight is reshaped once, at import,
 * into a constant of rank 4; the global pools take rank 3 as it is. */
static void test_windows_1d(void) {
  OnnxImportStats st;
  tensor_unref(check_reference("windows_1d", NULL, &st));
  CHECK_EQ_INT(st.n_opaque, 0);
  OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
  onnx_import_as_given(&o);
  tensor_unref(check_reference("windows_1d", &o, &st));
  Graph *g = import_model("windows_1d");
  CHECK(g && count_kind(g, OP_CONV2D) == 2 && count_kind(g, OP_MAXPOOL) == 1 &&
        count_kind(g, OP_AVGPOOL) == 1 && count_kind(g, OP_GLOBAL_MAXPOOL) == 1 &&
        count_kind(g, OP_GLOBAL_AVGPOOL) == 1);
  for (int32_t i = 0; g && i < g->n_nodes; i++) {
    const Node *n = &g->nodes[i];
    if (n->kind != OP_CONV2D) continue;
    const Node *w = &g->nodes[n->in[1].node];
    CHECK(w->kind == OP_CONST && w->value->shape.ndim == 4 && w->value->shape.d[2] == 1);
    CHECK(graph_shape(g, n->in[0])->ndim == 4);
  }
  graph_free(g);
  check_round_trip("windows_1d");
}

/* A Conv over three spatial axes is conv3d's, handed on by conv2d's row:
 * its kernel_shape checked, auto_pad SAME_UPPER made explicit pads (one
 * axis uneven), groups, dilation and uneven pads, a Relu after it fused;
 * against numpy in double, and through export, without a warning. */
static void test_conv3d(void) {
  OnnxImportStats st;
  tensor_unref(check_reference("conv3d", NULL, &st));
  CHECK_EQ_INT(st.n_opaque, 0);
  char p[PATH_BUF];
  Diag d;
  diag_init(&d);
  Graph *g = import(data("conv3d.onnx", p), NULL, NULL, &d);
  CHECK(g && count_kind(g, OP_CONV3D) == 2 && count_kind(g, OP_CONV2D) == 0 &&
        graph_count_ops(g) == 2); /* the Relu fused into the first */
  CHECK_MSG(d.n_warnings == 0, "%s", d.text ? d.text : "");
  graph_free(g);
  diag_fini(&d);
  check_round_trip("conv3d");
  /* Relu(Conv(x) + x): one conv3d, the add its residual, the relu its act */
  tensor_unref(check_reference("conv3d_residual", NULL, &st));
  CHECK_EQ_INT(st.n_residuals_fused, 1);
  g = import_model("conv3d_residual");
  CHECK(g && count_kind(g, OP_CONV3D) == 1 && graph_count_ops(g) == 1);
  graph_free(g);
  check_round_trip("conv3d_residual");
}

/* MaxPool and AveragePool over three spatial axes are maxpool3d and
 * avgpool3d, handed on by the 2-D rows; a Pad of no extent at rank 5
 * (none of Teq's pad lists is that long) is no node. */
static void test_pools3d(void) {
  OnnxImportStats st;
  tensor_unref(check_reference("pools3d", NULL, &st));
  CHECK_EQ_INT(st.n_opaque, 0);
  CHECK_EQ_INT(st.n_noops_removed, 1);
  char p[PATH_BUF];
  Diag d;
  diag_init(&d);
  Graph *g = import(data("pools3d.onnx", p), NULL, NULL, &d);
  CHECK(g && count_kind(g, OP_MAXPOOL3D) == 1 && count_kind(g, OP_AVGPOOL3D) == 1 &&
        graph_count_ops(g) == 2);
  CHECK_MSG(d.n_warnings == 0, "%s", d.text ? d.text : "");
  graph_free(g);
  diag_fini(&d);
  check_round_trip("pools3d");
}

/* An Einsum of two operands is one product between transposes, sums and
 * reshapes, against numpy.einsum (make_models.py: MaxViT's attention,
 * ellipses, an implicit output, a scalar, an outer product, batch
 * broadcasting, batch labels moved about, labels summed in one operand
 * alone, of extent 1 and 5); the one of a constant is laid out at import,
 * so no layout step of it is left. Written back, it is a MatMul. An
 * Einsum of one or three operands is kept as it is. */
static void test_einsum(void) {
  for (int k = 0; k < 11; k++) {
    char model[32];
    snprintf(model, sizeof model, "einsum_%d", k);
    OnnxImportStats st;
    tensor_unref(check_reference(model, NULL, &st));
    CHECK_EQ_INT(st.n_opaque, 0);
    Graph *g = import_model(model);
    CHECK_MSG(g && count_kind(g, OP_MATMUL) == 1, "%s: not one product", model);
    for (int32_t i = 0; g && i < g->n_nodes; i++) {
      const Node *n = &g->nodes[i];
      bool layout =
          n->kind == OP_TRANSPOSE || n->kind == OP_RESHAPE || n->kind == OP_REDUCE_SUM;
      CHECK_MSG(!layout || g->nodes[n->in[0].node].kind != OP_CONST,
                "%s: a constant laid out at run time", model);
    }
    graph_free(g);
    check_round_trip(model);
  }
  OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
  o.opaque_unsupported_forms = true;
  const char *why[] = {"an Einsum of 1 operand:", "an Einsum of 3 operands:"};
  for (int k = 0; k < 2; k++) {
    char p[PATH_BUF], name[64];
    snprintf(name, sizeof name, "einsum_kept_%d.onnx", k);
    Diag d;
    diag_init(&d);
    OnnxImportStats st;
    Graph *g = import(data(name, p), &o, &st, &d);
    CHECK(g && st.n_opaque == 1 && count_kind(g, OP_MATMUL) == 0);
    CHECK_MSG(d.text && strstr(d.text, why[k]) && strstr(d.text, "kept as an opaque node"),
              "%s: %s", name, d.text ? d.text : "");
    graph_free(g);
    diag_fini(&d);
  }
}

/* A form of a known operator its row does not take is refused, or, when
 * asked (opaque_unsupported_forms), kept whole as an opaque node with the
 * refusal as a warning; a malformed node is refused either way. */
static void test_opaque_forms(void) {
  char p[PATH_BUF];
  Diag d;
  diag_init(&d);
  OnnxImportOptions o = ONNX_IMPORT_DEFAULTS;
  o.opaque_unsupported_forms = true;
  OnnxImportStats st;
  Graph *g = import(data("bad_maxpool_indices.onnx", p), &o, &st, &d);
  CHECK(g && count_kind(g, OP_OPAQUE) == 1 && count_kind(g, OP_MAXPOOL) == 0 && st.n_opaque == 1);
  CHECK_MSG(d.n_errors == 0 && d.text && strstr(d.text, "node 'pool' (MaxPool): MaxPool whose "
            "Indices output is read is not supported; the node is kept as an opaque node") &&
            !strstr(d.text, "unsupported operator"), "%s", d.text ? d.text : "");
  graph_free(g);
  diag_fini(&d);
  diag_init(&d);
  g = NULL;
  CHECK_EQ_INT(onnx_import_file(data("bad_auto_pad.onnx", p), &o, &g, NULL, &d), TEQ_ERR_INPUT);
  CHECK(!g && strstr(diag_last(&d), "FOO"));
  diag_fini(&d);
  /* A result too large for any tensor is a bad model, not a form to keep. */
  diag_init(&d);
  CHECK_EQ_INT(onnx_import_file(data("bad_tile_large.onnx", p), &o, &g, NULL, &d), TEQ_ERR_INPUT);
  CHECK(!g && strstr(diag_last(&d), "is too large"));
  diag_fini(&d);
}

/* ---- bad input ---- */

static void write_file(const char *path, const void *bytes, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return;
  fwrite(bytes, 1, n, f);
  fclose(f);
}

static void check_bad(const char *path, int want_rc, const char *want1, const char *want2) {
  Diag d;
  diag_init(&d);
  Graph *sentinel = (Graph *)&d, *g = sentinel;
  OnnxImportStats st = {.n_nodes = -7};
  int rc = onnx_import_file(path, NULL, &g, &st, &d);
  CHECK_MSG(rc == want_rc, "%s: rc %d, expected %d", path, rc, want_rc);
  CHECK_MSG(g == sentinel && st.n_nodes == -7, "%s: out-parameters written on failure", path);
  const char *text = d.text ? d.text : "";
  CHECK_MSG(d.n_errors >= 1 && strstr(text, path), "%s: message does not name the file: %s",
            path, text);
  CHECK_MSG(strstr(text, want1), "%s: message lacks '%s': %s", path, want1, text);
  CHECK_MSG(!want2 || strstr(text, want2), "%s: message lacks '%s': %s", path, want2, text);
  diag_fini(&d);
}

/* What a fuzzer found: strings proto2 leaves NULL, folds that failed without
 * a word, sizes that overflowed int64 or asked for terabytes; each is refused
 * with the node or input at fault named (the sanitizer builds also check
 * that none of them reads NULL or overflows on the way). */
static void test_bad_robustness(void) {
  char p[PATH_BUF];
  check_bad(data("bad_no_op_type.onnx", p), TEQ_ERR_INPUT, "node 'anon'", "has no op_type");
  check_bad(data("bad_attr_no_name.onnx", p), TEQ_ERR_INPUT, "node 'cast' (Cast)",
            "attribute 0 has no name");
  check_bad(data("bad_empty_ints.onnx", p), TEQ_ERR_UNSUPPORTED, "node 'conv' (Conv)", "strides");
  check_bad(data("bad_conv_weight_rank.onnx", p), TEQ_ERR_INPUT, "node 'conv' (Conv)",
            "weight W [3] has rank 1");
  check_bad(data("bad_const_add.onnx", p), TEQ_ERR_INPUT, "node 'add' (Add)",
            "[3] and [5] do not broadcast");
  check_bad(data("bad_no_inputs.onnx", p), TEQ_ERR_INPUT, "node 'relu' (Relu)", "got 0");
  check_bad(data("bad_input_too_large.onnx", p), TEQ_ERR_INPUT,
            "input 'x': shape [2097152, 2097152, 2097152, 4] is too large", NULL);
  check_bad(data("bad_reshape_overflow.onnx", p), TEQ_ERR_INPUT, "node 'reshape' (Reshape)",
            "multiply to more than 2^40");
  check_bad(data("bad_reshape_empty.onnx", p), TEQ_ERR_INPUT, "node 'reshape' (Reshape)",
            "shape[1] = -1 cannot be inferred from 0 elements");
  check_bad(data("bad_init_empty_huge.onnx", p), TEQ_ERR_INPUT, "initializer 'w'",
            "shape [0, 4611686018427387904, 4611686018427387904] is too large");
  check_bad(data("bad_constant_of_shape.onnx", p), TEQ_ERR_INPUT,
            "node 'fill' (ConstantOfShape)", "shape [1099511627776] is too large");
  check_bad(data("bad_constant_of_shape_empty.onnx", p), TEQ_ERR_INPUT,
            "node 'fill' (ConstantOfShape)", "extents other than 0");
  check_bad(data("bad_tile_large.onnx", p), TEQ_ERR_INPUT, "node 'tile' (Tile)", "is too large");
  check_bad(data("bad_constant_of_shape_huge.onnx", p), TEQ_ERR_INPUT,
            "node 'fill' (ConstantOfShape)", "more than this machine's");
  check_bad(data("bad_expand_large.onnx", p), TEQ_ERR_INPUT, "node 'expand' (Expand)",
            "more than 2^40 elements");
  check_bad(data("bad_gemm_four_inputs.onnx", p), TEQ_ERR_INPUT, "node 'gemm' (Gemm)",
            "takes at most 3 inputs, got 4");
  check_bad(data("bad_conv_four_inputs.onnx", p), TEQ_ERR_INPUT, "node 'conv' (Conv)",
            "takes at most 3 inputs, got 4");
}

static void test_bad_files(void) {
  char p[PATH_BUF];
  check_bad(data("bad_missing_init.onnx", p), TEQ_ERR_INPUT, "node 'mm' (MatMul)", "input 'W'");
  check_bad(data("bad_shape_mismatch.onnx", p), TEQ_ERR_INPUT, "node 'mm' (MatMul)", "[4, 5]");
  check_bad(data("bad_auto_pad.onnx", p), TEQ_ERR_INPUT, "node 'conv' (Conv)", "FOO");
  check_bad(data("bad_maxpool_indices.onnx", p), TEQ_ERR_UNSUPPORTED, "node 'pool' (MaxPool)",
            "Indices output is read");
  check_bad(data("bad_attr_type.onnx", p), TEQ_ERR_INPUT, "node 'conv' (Conv)",
            "attribute 'group' is of type float, expected int");
  check_bad(data("bad_cycle.onnx", p), TEQ_ERR_INPUT, "cycle", "node 'first' (Add)");
  check_bad(data("bad_conv3d_kernel.onnx", p), TEQ_ERR_INPUT, "node 'conv' (Conv)",
            "kernel_shape does not match weight W [2, 3, 3, 3, 3]");
  check_bad(data("bad_einsum_output.onnx", p), TEQ_ERR_INPUT, "node 'einsum' (Einsum)",
            "label 'k' twice in the output");
  check_bad(data("bad_grid.onnx", p), TEQ_ERR_INPUT, "node 'sample' (GridSample)",
            "expected [N, C, H, W] and [N, Ho, Wo, 2]");
  check_bad(data("bad_pool3d_kernel.onnx", p), TEQ_ERR_INPUT, "node 'pool' (MaxPool)",
            "kernel_shape needs three extents");
  check_bad(data("bad_resize10_shrink.onnx", p), TEQ_ERR_UNSUPPORTED, "node 'resize' (Resize)",
            "only upsampling (scales >= 1)");
  check_bad(data("bad_upsample7.onnx", p), TEQ_ERR_UNSUPPORTED, "node 'up' (Upsample)",
            "Upsample of opset 7: only the opset 9 form");
  check_bad(data("bad_dropout_mask.onnx", p), TEQ_ERR_UNSUPPORTED, "node 'drop' (Dropout)",
            "mask output is read");
  check_bad(data("bad_dropout_training.onnx", p), TEQ_ERR_UNSUPPORTED, "node 'drop' (Dropout)",
            "training mode");
  check_bad(data("bad_scatter_index.onnx", p), TEQ_ERR_INPUT, "node 'scatter' (ScatterND)",
            "index 2 out of range [-2, 2)");
  check_bad(data("bad_external_escape.onnx", p), TEQ_ERR_INPUT, "initializer 'w1'",
            "'..' are refused");
  check_bad(data("bad_external_absolute.onnx", p), TEQ_ERR_INPUT, "initializer 'w1'",
            "absolute paths");
  check_bad(data("bad_external_missing.onnx", p), TEQ_ERR_IO, "no_such_file.weights",
            "cannot be opened");
  check_bad(data("bad_external_range.onnx", p), TEQ_ERR_INPUT, "initializer 'w1'",
            "bytes 1000000..1002048 of 'external_data.weights', which has 3136");
  check_bad(data("bad_external_length.onnx", p), TEQ_ERR_INPUT, "initializer 'w1'",
            "100 bytes for a shape of 2048 bytes");
  check_bad(data("bad_external_offset.onnx", p), TEQ_ERR_INPUT, "initializer 'w1'",
            "offset '-8' is not a byte count");
  check_bad("/nonexistent/model.onnx", TEQ_ERR_IO, "cannot open", NULL);
  test_bad_robustness();

  /* Files that are not ONNX models at all, made from a good one. */
  FILE *f = fopen(data("conv_bn.onnx", p), "rb");
  static unsigned char model[8192];
  size_t n = f ? fread(model, 1, sizeof model, f) : 0;
  if (f) fclose(f);
  CHECK(n > 1000 && n < sizeof model);
  char q[PATH_BUF];
  write_file(tmp("empty.onnx", q), "", 0);
  check_bad(q, TEQ_ERR_INPUT, "not an ONNX model: the file is empty", NULL);
  write_file(tmp("truncated.onnx", q), model, n / 2);
  check_bad(q, TEQ_ERR_INPUT, "not an ONNX model", "does not parse");
  unsigned char junk[512];
  uint64_t st = 42;
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)rng_next(&st);
  write_file(tmp("garbage.onnx", q), junk, sizeof junk);
  check_bad(q, TEQ_ERR_INPUT, "not an ONNX model", NULL);
  write_file(tmp("text.onnx", q), "not a model\n", 12);
  check_bad(q, TEQ_ERR_INPUT, "not an ONNX model", NULL);

  /* A buffer is named by the caller. */
  Diag d;
  diag_init(&d);
  Graph *g = NULL;
  CHECK_EQ_INT(onnx_import_buffer(model, n / 3, "buffer-name", NULL, &g, NULL, &d), TEQ_ERR_INPUT);
  CHECK(g == NULL && d.text && strstr(d.text, "buffer-name: not an ONNX model"));
  diag_fini(&d);
}

/* ---- TensorProto files ---- */

static void test_tensor_files(void) {
  char p[PATH_BUF], q[PATH_BUF];
  Diag d;
  diag_init(&d);
  Tensor *t = NULL, *u = NULL;
  char *name = NULL, *name2 = NULL;
  int rc = onnx_read_tensor_file(data("conv_bn.input_0.pb", p), &t, &name, &d);
  CHECK_EQ_INT(rc, TEQ_OK);
  CHECK(t && t->dtype == DT_F32 && shape_equal(&t->shape, &(Shape){4, {1, 3, 8, 8}}));
  CHECK(name && strcmp(name, "x") == 0);
  if (t) CHECK_EQ_INT(onnx_write_tensor_file(tmp("t.pb", q), t, "renamed", &d), TEQ_OK);
  CHECK_EQ_INT(onnx_read_tensor_file(q, &u, &name2, &d), TEQ_OK);
  CHECK(t && u && max_abs_err(t, u) == 0 && name2 && strcmp(name2, "renamed") == 0);
  tensor_unref(u);
  free(name2);
  /* int64 round trip */
  Shape s = {1, {3}};
  Tensor *i = tensor_new(DT_I64, &s);
  ((int64_t *)i->data)[2] = -5;
  u = NULL;
  CHECK_EQ_INT(onnx_write_tensor_file(q, i, "i", &d), TEQ_OK);
  CHECK_EQ_INT(onnx_read_tensor_file(q, &u, NULL, &d), TEQ_OK);
  CHECK(u && u->dtype == DT_I64 && ((int64_t *)u->data)[2] == -5);
  tensor_unref(u);
  tensor_unref(i);
  /* Not a tensor: an error naming the file, nothing written. */
  Tensor *sentinel = t;
  rc = onnx_read_tensor_file(data("make_models.py", p), &sentinel, NULL, &d);
  CHECK_EQ_INT(rc, TEQ_ERR_INPUT);
  CHECK(sentinel == t && strstr(diag_last(&d), "make_models.py"));
  /* The ONNX node tests' data, where installed (libonnx-testdata). */
  const char *abs_in = "/usr/share/libonnx-testdata/data/node/test_abs/test_data_set_0/input_0.pb";
  if (access(abs_in, R_OK) == 0) {
    u = NULL;
    CHECK_EQ_INT(onnx_read_tensor_file(abs_in, &u, NULL, &d), TEQ_OK);
    CHECK(u && u->dtype == DT_F32 && u->shape.ndim == 3);
    tensor_unref(u);
  }
  tensor_unref(t);
  free(name);
  diag_fini(&d);
}

/* Every file a test wrote goes: the directory holds nothing else. */
static void remove_tmp(void) {
  DIR *dir = opendir(tmp_dir);
  if (!dir) return;
  char p[PATH_BUF];
  for (struct dirent *e; (e = readdir(dir));)
    if (e->d_name[0] != '.') unlink(tmp(e->d_name, p));
  closedir(dir);
  rmdir(tmp_dir);
}

int main(void) {
  find_dirs();
  test_conv_bn();
  test_layer_norm_written();
  test_layer_norm_rank_raised();
  test_shape_fold();
  test_unsorted();
  test_int_extremes();
  test_scatter_dropout();
  check_round_trip("conv_bn");
  check_round_trip("shape_fold");
  check_round_trip("shape_fold_opset12");
  check_round_trip("unsorted");
  test_opaque();
  test_opaque_types();
  test_custom_domain();
  test_opaque_meta();
  test_export_built();
  test_activations_fused();
  test_mobile_activations_fused();
  test_activations_random();
  test_product_scales_folded();
  test_folds_chained();
  test_zero_pads_folded();
  test_zero_pads_random();
  test_residuals_fused();
  test_pools_fused();
  test_pooled_acts_exported();
  test_gemm_relu_fused();
  test_large_weights();
  test_external_data();
  test_symbolic_dims();
  test_gelu();
  test_swishes();
  test_hard_gates();
  test_neutral_operands();
  test_conv_affines();
  test_affines_before_convs();
  test_conv_transpose_affines();
  test_upsample_forms();
  test_border_residual_cap();
  test_constants_as_slices();
  test_product_biases();
  test_product_residuals();
  test_head_scales();
  test_batchnorms_around_gemms();
  test_bn_relu();
  test_maxpool_storage_order();
  test_reduce_noop();
  test_variadic();
  test_windows_1d();
  test_einsum();
  test_conv3d();
  test_pools3d();
  test_opaque_forms();
  test_bad_files();
  test_tensor_files();
  remove_tmp();
  return check_exit();
}
