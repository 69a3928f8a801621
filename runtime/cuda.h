/* cuda.h: running graphs on the GPU, and timing what runs there.
 *
 * CUDA sources (runtime/cuda/) are compiled only where meson finds nvcc,
 * cuBLAS and cuDNN; elsewhere every call here reports that the build has
 * none (TEQ_ERR_UNSUPPORTED), and cuda_probe says why in words. Tests that
 * need a GPU ask cuda_probe first and skip with its message.
 *
 * A CudaDevice holds what is costly to make and worth sharing: the cuBLAS
 * and cuDNN handles, the stream, and the convolution algorithms found by
 * search, remembered per configuration for every plan made on it.
 *
 * A CudaPlan is one graph made ready to run many times: shapes inferred,
 * constants uploaded once, every intermediate value given a place in one
 * device arena whose size follows the live set (values that are never live
 * together share memory), views (op_view: reshapes, splits and slices that
 * cut whole rows, gathers of one index) made pointers into their input
 * instead of copies, and
 * the whole graph captured as a CUDA graph so
 * that a run is one launch. Runs of a plan give the outputs of exec_run in
 * float32 within rounding. */
#ifndef TEQ_RUNTIME_CUDA_H
#define TEQ_RUNTIME_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "runtime/err.h"
#include "runtime/graph.h"
#include "runtime/tensor.h"

typedef struct CudaInfo {
  bool built;          /* compiled with CUDA */
  int n_devices;       /* usable GPUs; 0 if none or no driver */
  char device[256];    /* name of device 0, or "" */
  int cc_major, cc_minor;
  size_t memory;       /* bytes on device 0 */
  int cudnn_version;   /* as cudnnGetVersion reports, 0 if not built */
  int runtime_version; /* as cudaRuntimeGetVersion reports, 0 if not built */
  int sm_count;        /* multiprocessors */
  double peak_gflops;  /* float32 FMA peak at the boost clock, non-tensor-core */
  double mem_gbps;     /* memory bandwidth from bus width and clock */
  char why[160];       /* when n_devices is 0: why not, in words */
} CudaInfo;

/* Fills info; never fails, never aborts, on any machine. */
TEQ_API void cuda_probe(CudaInfo *info);

/* Loads cuBLAS and cuBLASLt, once per process; cuda_device_open does this
 * first, so only programs that use a GPU pay for them. Works without a GPU
 * (tests call it to check that every function Teq uses resolves). An
 * error names the library and says why it did not load. */
TEQ_API int cuda_libraries_load(Diag *d);

typedef struct CudaDevice CudaDevice;
typedef struct CudaPlan CudaPlan;

/* Opens GPU 0. Float32 stays float32: TF32 tensor-core math is off in
 * cuBLAS and cuDNN, so results match the CPU executor. */
TEQ_API int cuda_device_open(CudaDevice **out, Diag *d);
TEQ_API void cuda_device_close(CudaDevice *dev);
/* The device's name ("NVIDIA H100 80GB HBM3"), as cost tables key it. */
TEQ_API const char *cuda_device_name(const CudaDevice *dev);
/* For tests and benchmarks: every convolution searched on dev from now on
 * takes the way named, as cuda_plan_step_note reports it ("cublas:gemm
 * split 4"), instead of the fastest; one whose search does not offer that
 * way fails and lists the ways it offers. NULL returns to timing. Either
 * forgets the ways chosen so far. */
TEQ_API void cuda_device_pin_way(CudaDevice *dev, const char *way);
/* The name of a cuBLAS way of a convolution or matrix product, as notes and
 * pins spell it: its product on the input (a 1x1 conv, a matmul) or on its
 * unfolded columns, whole (splits 1) or as `splits` slices of K. Here, not
 * in the CUDA files, so that a tool listing ways builds without CUDA. */
static inline void cuda_product_way_name(bool unfolded, int splits, char *buf, size_t size) {
  snprintf(buf, size, splits > 1 ? "cublas:%s split %d" : "cublas:%s",
           unfolded ? "im2col+gemm" : "gemm", splits);
}

/* Prepares g (which must pass graph_check, have no opaque node on the path
 * to its outputs, and known shapes) for running on dev. The first run, made
 * here on random inputs, chooses convolution algorithms and sizes scratch
 * memory; the second is captured as a CUDA graph. */
TEQ_API int cuda_plan_new(CudaDevice *dev, const Graph *g, CudaPlan **out, Diag *d);
TEQ_API void cuda_plan_free(CudaPlan *p);

/* Copies inputs in (as exec_run takes them), runs, and copies the outputs
 * back as new tensors (release with tensor_unref). */
TEQ_API int cuda_plan_run(CudaPlan *p, Tensor *const *inputs, Tensor **outputs, Diag *d);

/* Times the whole graph on the inputs last given (random ones if none):
 * warmup replays, then repeats replays each between two CUDA events. */
typedef struct CudaTiming {
  double median_ms, min_ms, mean_ms;
  int repeats;
} CudaTiming;
TEQ_API int cuda_plan_time(CudaPlan *p, int warmup, int repeats, CudaTiming *t, Diag *d);

/* Device bytes the plan holds: the value arena, constants, scratch and
 * what kernels derived from constants and keep (Winograd's filters). */
TEQ_API size_t cuda_plan_device_bytes(const CudaPlan *p);
/* Number of kernel nodes the plan runs, and what node i (in run order)
 * chose, e.g. its cuDNN algorithm ("" when it chose nothing). */
TEQ_API int cuda_plan_n_steps(const CudaPlan *p);
TEQ_API const char *cuda_plan_step_note(const CudaPlan *p, int step, int *node_id);
/* Microseconds each step takes inside a run of the whole plan (us[i] for
 * step i, the median over `repeats` runs): the steps launched one after
 * another on the plan's stream, as a replay runs them, with an event
 * after each, queued whole behind a kernel that holds the GPU while the
 * host launches them (so no step waits for its launch, as none does in a
 * replay). Beside cuda_profile_node's time of the same node run alone,
 * it shows what the sequence costs that isolated timings do not (caches a
 * neighbour evicts, a choice that differs). */
TEQ_API int cuda_plan_time_steps(CudaPlan *p, int repeats, double *us, Diag *d);

/* ---- profiler ----
 * Times one operator configuration: node `id` of g run alone, its inputs
 * random (never zeros) and its constants as g holds them; an input the
 * registry calls a weight (OpDef.weight_inputs) is a random constant. Warm-up, then
 * the median of `repeats` CUDA-event timings of the captured node. */
typedef struct CudaProfile {
  double median_us, min_us;
  int repeats;
  char algo[96];       /* what the kernel chose, e.g. "cudnn:IMPLICIT_PRECOMP_GEMM" */
} CudaProfile;
TEQ_API int cuda_profile_node(CudaDevice *dev, const Graph *g, int id, int repeats,
                              CudaProfile *out, Diag *d);

/* ---- checks without a GPU ----
 * The arithmetic that is Teq's own in the GPU kernel that runs node n,
 * run on the host in the order the kernel's threads run it, into out (the
 * node's output shape): lets a machine with no GPU check the kernels'
 * indexing against the CPU row. For conv2d, way names which (as
 * cuda_device_pin_way takes it): "teq:direct" or "teq:tiled", our own
 * kernels for grouped convs, "teq:winograd", whose transforms are ours,
 * or "cublas:gemm" and "cublas:im2col+gemm", whole or "... split S",
 * whose padding copy, unfolding, partial sums and epilogue are ours (the
 * products are cuBLAS's calls, their arguments as the device passes
 * them, run as loops; a split takes any K that S divides), each with
 * its pool where the node has one; for gemm, "cublas:gemm" (C broadcast
 * into the output, the product over it, the activation; not the
 * cuBLASLt way, whose epilogue is cuBLASLt's); for maxpool and avgpool,
 * way is NULL (their results agree with the CPU row to the bit).
 * TEQ_ERR_UNSUPPORTED for any other node or way, a way that does not take
 * the configuration, or a build without CUDA. */
TEQ_API int cuda_kernel_on_host(const char *way, const Node *n, Tensor *const *in, Tensor *out,
                                Diag *d);
/* A batched matmul node n as the GPU runs it with operands read or its
 * output written by strides (graph_strided), on the host: shapes[j] and
 * data[j] operand j's shape and element 0, strides[j] its element strides
 * (NULL: dense), the product's arguments as the device passes cuBLAS run
 * as loops, into y (n's output shape) laid out with y_strides (NULL:
 * dense). TEQ_ERR_UNSUPPORTED where n's row does not read or write those
 * strides (reads_strided, writes_strided), for a product the GPU stacks
 * into one tall matrix but written by strides, or in a build without
 * CUDA. */
TEQ_API int cuda_matmul_on_host(const Node *n, const Shape *shapes, const float *const *data,
                                const int64_t *const *strides, float *y,
                                const int64_t *y_strides, Diag *d);

#endif
