/* probe.cu: what GPU this machine has, asked of the CUDA runtime and cuDNN.
 * A machine without a driver answers with an error code, which becomes the
 * reason in CudaInfo.why; nothing here aborts. */
#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "runtime/cuda.h"
}

extern "C" void cuda_probe(CudaInfo *info) {
  memset(info, 0, sizeof *info);
  info->built = true;
  info->cudnn_version = (int)cudnnGetVersion();
  cudaRuntimeGetVersion(&info->runtime_version);
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    snprintf(info->why, sizeof info->why, "no usable GPU: %s", cudaGetErrorString(rc));
    return;
  }
  if (n == 0) {
    snprintf(info->why, sizeof info->why, "no GPU found");
    return;
  }
  cudaDeviceProp prop;
  if ((rc = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
    snprintf(info->why, sizeof info->why, "GPU 0 unreadable: %s", cudaGetErrorString(rc));
    return;
  }
  info->n_devices = n;
  snprintf(info->device, sizeof info->device, "%s", prop.name);
  info->cc_major = prop.major;
  info->cc_minor = prop.minor;
  info->memory = prop.totalGlobalMem;
}
