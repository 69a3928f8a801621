/* test_registry.c: the operator registry checks itself, and its parameter
 * machinery (defaults, bounds, formatting, lookup) behaves as documented. */
#include <string.h>

#include "runtime/graph.h"
#include "runtime/ops.h"
#include "tests/check.h"

static void test_table(void) {
  Diag d;
  diag_init(&d);
  int rc = op_registry_check(&d);
  CHECK_MSG(rc == TEQ_OK, "%s", d.text ? d.text : "");
  for (int k = 0; k < OP__COUNT; k++) {
    const OpDef *o = op_def(k);
    CHECK_EQ_INT(op_by_name(o->name), k);
    /* An op_type two rows write (a Conv or pool over two or three axes)
     * is read by the first, whose hook hands a node on to the other
     * (onnx_in_as_kind); no other op_type is shared. */
    static const char *const shared[] = {"Conv", "MaxPool", "AveragePool"};
    bool is_shared = false;
    for (int j = 0; o->onnx_op && j < 3; j++) is_shared |= !strcmp(o->onnx_op, shared[j]);
    int reader = o->onnx_op ? op_by_onnx(o->onnx_op) : k;
    CHECK_MSG(reader == k || (is_shared && reader >= 0 && reader < k), "%s", o->onnx_op);
    for (const char *const *a = o->onnx_aliases; a && *a; a++)
      CHECK_MSG(op_by_onnx(*a) == k, "%s", *a);
    /* Flags that contradict each other. */
    CHECK_MSG(!((o->flags & OPF_MULTILINEAR) && (o->flags & OPF_NONLINEAR)), "%s", o->name);
    if (o->flags & OPF_COMMUTATIVE) CHECK_MSG(o->n_in_min == 2 && o->n_in_max == 2, "%s", o->name);
  }
  CHECK_EQ_INT(op_by_name("no_such_op"), -1);
  CHECK_EQ_INT(op_by_onnx("NonMaxSuppression"), -1);
  CHECK_EQ_INT(op_by_onnx("Conv"), OP_CONV2D);
  CHECK_EQ_INT(op_by_onnx("Dropout"), OP_IDENTITY);
  diag_fini(&d);
}

static void test_params(void) {
  Diag d;
  diag_init(&d);
  Params p;
  params_default(OP_CONV2D, &p);
  CHECK_EQ_INT(params_check(OP_CONV2D, &p, &d), TEQ_OK);
  int groups = param_index(OP_CONV2D, "groups");
  int stride = param_index(OP_CONV2D, "stride");
  CHECK(groups >= 0 && stride >= 0);
  CHECK_EQ_INT(param_index(OP_CONV2D, "nonsense"), -1);
  CHECK_EQ_INT(param_int(&p, groups), 1);
  param_set_int(&p, groups, 0);
  CHECK_EQ_INT(params_check(OP_CONV2D, &p, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "groups=0") != NULL, "%s", diag_last(&d));
  param_set_int(&p, groups, 4);
  int64_t two[2] = {2, 2};
  param_set_ints(&p, stride, two, 2);
  CHECK_EQ_INT(params_check(OP_CONV2D, &p, &d), TEQ_OK);
  char buf[256];
  params_format(OP_CONV2D, &p, true, buf, sizeof buf);
  CHECK_MSG(strstr(buf, "stride=(2 2)") && strstr(buf, "groups=4") && !strstr(buf, "pads"), "%s", buf);
  /* A list of the wrong length is refused. */
  param_set_ints(&p, stride, two, 1);
  CHECK_EQ_INT(params_check(OP_CONV2D, &p, &d), TEQ_ERR_INPUT);
  /* Symbolic values print by name. */
  int act = param_index(OP_CONV2D, "act");
  if (act >= 0) {
    params_default(OP_CONV2D, &p);
    param_set_int(&p, act, ACT_RELU);
    params_format(OP_CONV2D, &p, true, buf, sizeof buf);
    CHECK_MSG(strcmp(buf, "act=relu") == 0, "%s", buf);
  }
  /* snprintf contract: the needed length comes back even when cut. */
  params_default(OP_CONV2D, &p);
  int need = params_format(OP_CONV2D, &p, false, buf, 4);
  CHECK(need > 4 && strlen(buf) == 3);
  diag_fini(&d);
}

/* op_bare_twin: an operator that can fuse an epilogue, without it. A conv's
 * bias and relu go (one relu's pass stands for both), a product's tanh is
 * its own pass, a relu6's pass is a clip with its bounds, and what has no
 * epilogue has no bare twin. */
static void test_bare_twin(void) {
  Graph *g = graph_new();
  CHECK(g != NULL);
  if (!g) return;
  Shape xs = shape_of(4, 1, 8, 6, 6), ws = shape_of(4, 4, 8, 3, 3), bs = shape_of(1, 4);
  Shape as = shape_of(2, 2, 8), bms = shape_of(2, 8, 5);
  TensorRef x = {graph_add_input(g, "x", &xs, DT_F32, NULL), 0};
  TensorRef w = {graph_add_input(g, "w", &ws, DT_F32, NULL), 0};
  TensorRef b = {graph_add_input(g, "b", &bs, DT_F32, NULL), 0};
  TensorRef ma = {graph_add_input(g, "a", &as, DT_F32, NULL), 0};
  TensorRef mb = {graph_add_input(g, "m", &bms, DT_F32, NULL), 0};
  int act = param_index(OP_CONV2D, "act"), mact = param_index(OP_MATMUL, "act");
  Params cp, mp;
  params_default(OP_CONV2D, &cp);
  params_default(OP_MATMUL, &mp);
  param_set_int(&cp, act, ACT_RELU);
  param_set_int(&mp, mact, ACT_TANH);
  int conv_br = graph_add_node(g, OP_CONV2D, (TensorRef[]){x, w, b}, 3, 1, &cp, NULL, NULL);
  params_default(OP_CONV2D, &cp);
  int conv_b = graph_add_node(g, OP_CONV2D, (TensorRef[]){x, w, b}, 3, 1, &cp, NULL, NULL);
  int conv = graph_add_node(g, OP_CONV2D, (TensorRef[]){x, w}, 2, 1, &cp, NULL, NULL);
  int prod = graph_add_node(g, OP_MATMUL, (TensorRef[]){ma, mb}, 2, 1, &mp, NULL, NULL);
  int relu = graph_add_node(g, OP_RELU, (TensorRef[]){x}, 1, 1, NULL, NULL, NULL);
  param_set_int(&cp, act, ACT_RELU6);
  int conv_r6 = graph_add_node(g, OP_CONV2D, (TensorRef[]){x, w, b}, 3, 1, &cp, NULL, NULL);
  CHECK(conv_br >= 0 && conv_b >= 0 && conv >= 0 && prod >= 0 && relu >= 0 && conv_r6 >= 0);
  Params bare;
  int n_bare = -1;
  OpKind pass = OP__COUNT;
  Params pass_params;
  CHECK(op_bare_twin(&g->nodes[conv_br], &bare, &n_bare, &pass, &pass_params));
  CHECK(n_bare == 2 && pass == OP_RELU && param_int(&bare, act) == ACT_NONE);
  CHECK(op_bare_twin(&g->nodes[conv_b], &bare, &n_bare, &pass, &pass_params));
  CHECK(n_bare == 2 && pass == OP_RELU);
  CHECK(!op_bare_twin(&g->nodes[conv], &bare, &n_bare, &pass, &pass_params));
  CHECK(op_bare_twin(&g->nodes[prod], &bare, &n_bare, &pass, &pass_params));
  CHECK(n_bare == 2 && pass == OP_TANH && param_int(&bare, mact) == ACT_NONE);
  CHECK(!op_bare_twin(&g->nodes[relu], &bare, &n_bare, &pass, &pass_params));
  CHECK(op_bare_twin(&g->nodes[conv_r6], &bare, &n_bare, &pass, &pass_params));
  CHECK(pass == OP_CLIP && param_float(&pass_params, param_index(OP_CLIP, "min")) == 0 &&
        param_float(&pass_params, param_index(OP_CLIP, "max")) == 6);
  graph_free(g);
}

int main(void) {
  test_table();
  test_params();
  test_bare_twin();
  return check_exit();
}
