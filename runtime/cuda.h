/* cuda.h: whether this build has CUDA, and what GPU the machine has.
 *
 * CUDA sources (runtime/cuda/) are compiled only where meson finds nvcc,
 * cuBLAS and cuDNN; elsewhere these calls report that the build has none.
 * Tests that need a GPU ask cuda_probe first and skip with its message. */
#ifndef TEQ_RUNTIME_CUDA_H
#define TEQ_RUNTIME_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/err.h"

typedef struct CudaInfo {
  bool built;          /* compiled with CUDA */
  int n_devices;       /* usable GPUs; 0 if none or no driver */
  char device[128];    /* name of device 0, or "" */
  int cc_major, cc_minor;
  size_t memory;       /* bytes on device 0 */
  int cudnn_version;   /* as cudnnGetVersion reports, 0 if not built */
  int runtime_version; /* as cudaRuntimeGetVersion reports, 0 if not built */
  char why[160];       /* when n_devices is 0: why not, in words */
} CudaInfo;

/* Fills info; never fails, never aborts, on any machine. */
TEQ_API void cuda_probe(CudaInfo *info);

#endif
