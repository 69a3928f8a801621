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
 * constants, such as gather indices, stay as they are.
 *
 * A third way runs float32 as the GPU runtime lays memory out
 * (exec_run_planned): the same kernels on the plan's arena, so that a
 * machine without a GPU checks the plan. */
#ifndef TEQ_RUNTIME_EXEC_H
#define TEQ_RUNTIME_EXEC_H

#include <stdbool.h>

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

/* Runs g in float32 as the GPU runtime's memory plan lays it out
 * (runtime/plan.h), on the host: the arena and the constants' block as
 * mem_plan_build places them (the arena's bytes NaN until written), views,
 * pieces written in place and values read or written by strides as
 * aliases into them; each step's CPU kernel reads its inputs from, and
 * writes its outputs to, its slots there, and each matmul with an operand
 * or output laid out by strides runs as the device calls cuBLAS
 * (cuda_matmul_on_host). What a plan gets wrong (an alias at the wrong
 * place, a value placed over one still to be read, wrong strides) shows as
 * outputs that differ from exec_run's. Outputs as exec_run gives them;
 * *strided_steps (NULL: not wanted) gets how many steps ran by strides.
 * TEQ_ERR_UNSUPPORTED for an operator the CPU cannot run, or a strided
 * step in a build without CUDA. */
TEQ_API int exec_run_planned(const Graph *g, Tensor *const *inputs, Tensor **outputs,
                             int *strided_steps, Diag *d);

/* The element maps of layout node id of g (OPF_LAYOUT_ONLY), made by
 * running its Z_p kernel on element numbers and kept per configuration
 * for the process: maps[k] (a new reference per output, uint32) holds 0
 * where output k has a zero the node wrote itself (padding), else
 * base[j] + e + 1 for element e of input j; base receives n_in + 1
 * entries, base[0] = 0. Returns 1 when the maps hold, 0 (maps left NULL)
 * for a node they cannot describe (not layout only, int64 data, a pad of
 * a constant other than zero, too many elements for Z_p), or an error. */
TEQ_API int exec_layout_maps(const Graph *g, int id, int64_t *base, Tensor **maps, Diag *d);

/* ---- a few positions of the outputs, in Z_p ----
 * PET's random tests compare a handful of positions per box of each
 * output, while running a convolution whole costs all its sums. A plan
 * made for chosen flat positions of each output runs only what those
 * positions need: an operator with a point kernel (OpDef.eval_modp_at:
 * conv2d, matmul) whose result reaches the outputs only through layout
 * operators is evaluated at the positions that reach the chosen ones, and
 * those layout operators are not run at all: each is followed, when the
 * plan is made, by its view hook's offset (a reshape), its source_of hook
 * (a transpose), or else a map made by running its own Z_p kernel on
 * element numbers (a layout operator moves elements and computes nothing,
 * OPF_LAYOUT_ONLY). The rest runs whole, as exec_run runs it; so does a
 * point operator asked for a quarter of its output or more. The values are
 * exec_run's, exactly. positions[j] holds n_positions[j] flat positions of
 * output j, each in range; the plan keeps g, not the positions. */
typedef struct ExecPoints ExecPoints;
TEQ_API int exec_points_new(const Graph *g, const int64_t *const *positions,
                            const int64_t *n_positions, ExecPoints **out, Diag *d);
/* Runs the plan on inputs (as exec_run's, in Z_p): values[j][k] receives
 * output j at positions[j][k]. */
TEQ_API int exec_points_run(const ExecPoints *p, Tensor *const *inputs, uint32_t *const *values,
                            Diag *d);
/* How many operators of the plan run at positions only, and how many are
 * followed without running: what a test of the plan checks it saved. */
TEQ_API void exec_points_counts(const ExecPoints *p, int *at_positions, int *followed);
TEQ_API void exec_points_free(ExecPoints *p);

/* A float32 tensor as Z_p residues (see above); NULL with a message if a
 * value is not an integer. */
TEQ_API Tensor *exec_f32_to_modp(const Tensor *t, Diag *d);

/* ---- two graphs compared by evaluation ----
 * Wherever an equality is tested by running both sides (gen-rules' float32
 * check, verify-rules' counterexamples): a and b have the same inputs and
 * as many outputs; both run on the same seeded random inputs, and diff
 * says where they first differ. Draw k of a seed fills input i from its own
 * stream; in float32 it also makes input i's elements negative when bit
 * (i % 2) of k is set and positive otherwise, so draws 0 to 3 give every
 * sign pattern to pairs of inputs (a scalar has one element: random signs
 * alone would test relu(s) at one sign only). Float32 elements differ when
 * |x - y| > tol * max(1, |x|, |y|) or one is NaN; Z_p elements when not
 * equal. A side the executor refuses is an error, not a difference. */
typedef struct ExecDiff {
  bool differ;
  int output;          /* the first output that differs */
  int64_t element;     /* its first differing element, -1 if the shapes differ */
  int64_t count;       /* how many of its elements differ */
  Tensor *a, *b;       /* both values of that output (owned), or NULL */
} ExecDiff;

TEQ_API int exec_compare(const Graph *a, const Graph *b, ExecMode mode, uint64_t seed, int draw,
                         double tol, ExecDiff *diff, Diag *d);

/* A caller comparing many pairs (optimize's checks of rule instances) can
 * keep the random inputs between calls: input i of a call holds the same
 * values whenever mode, seed, draw, i and its shape are, as without kept,
 * and they are drawn once and read again (an input of fewer elements is a
 * view of a longer one's first). Up to max_bytes are kept, the oldest let
 * go first.
 * The executors never write to their inputs. One thread at a time. */
typedef struct ExecInputs ExecInputs;
TEQ_API ExecInputs *exec_inputs_new(size_t max_bytes);
TEQ_API void exec_inputs_free(ExecInputs *kept);
/* exec_compare, taking its inputs from kept (NULL: made for this call). */
TEQ_API int exec_compare_kept(const Graph *a, const Graph *b, ExecMode mode, uint64_t seed,
                              int draw, double tol, ExecInputs *kept, ExecDiff *diff, Diag *d);
TEQ_API void exec_diff_fini(ExecDiff *diff);

/* How far float32 tensor got is from want, as one figure: the largest
 * |got - want| over the largest |want| (relative to the output's scale, so
 * cancellation near zero does not dominate). NaN and infinities must match
 * exactly; other element types must be equal. INFINITY where they are not,
 * or where shape or type differ. What every GPU-against-CPU check reports. */
TEQ_API double exec_relative_error(const Tensor *got, const Tensor *want);

#endif
