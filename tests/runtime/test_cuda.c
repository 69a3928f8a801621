/* test_cuda.c: the CUDA probe answers on every machine, and cuBLAS loads
 * only when asked for, its functions all found; where there is a GPU the
 * probe names it and reports a cuDNN version. Skips (exit 77) elsewhere. */
#include <string.h>

#include "runtime/cuda.h"
#include "tests/check.h"

/* Whether a library whose file name starts with prefix is mapped into
 * this process. */
static bool mapped(const char *prefix) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[4096];
  bool found = false;
  while (f && !found && fgets(line, sizeof line, f)) {
    const char *slash = strrchr(line, '/');
    found = slash && strncmp(slash + 1, prefix, strlen(prefix)) == 0;
  }
  if (f) fclose(f);
  return found;
}

/* cuBLAS is loaded when asked for, not at startup; with or without a GPU,
 * every function Teq calls resolves in the library it was built with. */
static void test_libraries_loaded_late(const CudaInfo *info) {
  CHECK(!mapped("libcublasLt.so"));
  CHECK(!mapped("libcublas.so"));
  Diag d;
  diag_init(&d);
  int rc = cuda_libraries_load(&d);
  if (info->built) {
    CHECK_MSG(rc == TEQ_OK, "cuda_libraries_load: %s", d.text ? d.text : "");
    CHECK(mapped("libcublasLt.so") && mapped("libcublas.so"));
    CHECK_EQ_INT(cuda_libraries_load(&d), TEQ_OK); /* once */
  } else {
    CHECK(rc == TEQ_ERR_UNSUPPORTED && d.n_errors == 1);
  }
  diag_fini(&d);
}

int main(void) {
  CudaInfo info;
  cuda_probe(&info);
  test_libraries_loaded_late(&info);
  printf("cuda: built=%d devices=%d runtime=%d cudnn=%d %s\n", info.built, info.n_devices,
         info.runtime_version, info.cudnn_version, info.n_devices ? info.device : info.why);
  if (info.n_devices == 0) {
    CHECK(info.why[0] != '\0');
    if (check_failures) return check_exit();
    check_skip(info.why);
  }
  CHECK(info.built);
  CHECK(strlen(info.device) > 0);
  CHECK(info.cudnn_version >= 9000);
  CHECK(info.memory > ((size_t)1 << 30));
  return check_exit();
}
