/* test_registry.c: the operator registry checks itself, and its parameter
 * machinery (defaults, bounds, formatting, lookup) behaves as documented. */
#include <string.h>

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
    if (o->onnx_op) CHECK_MSG(op_by_onnx(o->onnx_op) == k, "%s", o->onnx_op);
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

int main(void) {
  test_table();
  test_params();
  return check_exit();
}
