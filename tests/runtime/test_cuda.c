/* test_cuda.c: the CUDA probe answers on every machine; where there is a
 * GPU it names it and reports a cuDNN version. Skips (exit 77) elsewhere. */
#include <string.h>

#include "runtime/cuda.h"
#include "tests/check.h"

int main(void) {
  CudaInfo info;
  cuda_probe(&info);
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
