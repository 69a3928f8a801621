/* none.c: cuda_probe for builds without CUDA (no nvcc or cuDNN found). */
#include <stdio.h>
#include <string.h>

#include "runtime/cuda.h"

void cuda_probe(CudaInfo *info) {
  memset(info, 0, sizeof *info);
  snprintf(info->why, sizeof info->why, "built without CUDA (nvcc, cuBLAS or cuDNN not found)");
}
