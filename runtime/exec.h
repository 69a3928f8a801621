/* exec.h: run a graph on the CPU, in float32 or exactly in Z_p.
 *
 * Both executors walk the graph in topological order, allocate each output
 * at its inferred shape, call the registry row's kernel, and drop every
 * intermediate tensor after its last use, so peak memory follows the live
 * set rather than the whole graph. Float32 convolution and matmul go through
 * the BLAS (GEMM-based); Z_p kernels are exact integer loops.
 *
 * In Z_p mode, float32 constants are taken as integers: each value must be
 * integral (|x| < 2^53) and maps to x mod p; anything else is an error,
 * because a rounded weight would make a fingerprint lie. Integer (DT_I64)
 * constants, such as gather indices, stay as they are. */
#ifndef TEQ_RUNTIME_EXEC_H
#define TEQ_RUNTIME_EXEC_H

#include "runtime/err.h"
#include "runtime/graph.h"
#include "runtime/tensor.h"

typedef enum ExecMode { EXEC_F32, EXEC_MODP } ExecMode;

/* Runs g. inputs[i] feeds the graph input g->inputs[i] and must have its
 * shape, and the mode's dtype (DT_F32 or DT_MODP) unless the input was
 * declared DT_I64. On success outputs[j] holds a new reference to the value
 * of g->outputs[j] (release with tensor_unref). On failure nothing is
 * written to outputs and d says which node failed and why. */
TEQ_API int exec_run(const Graph *g, ExecMode mode, Tensor *const *inputs, Tensor **outputs,
                     Diag *d);

/* A float32 tensor as Z_p residues (see above); NULL with a message if a
 * value is not an integer. */
TEQ_API Tensor *exec_f32_to_modp(const Tensor *t, Diag *d);

#endif
