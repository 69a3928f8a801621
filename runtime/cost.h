/* cost.h: what an operator costs to run, from three sources in order.
 *
 *   measured  timed now on this machine's GPU by the profiler (cuda.h),
 *   table     measured earlier on a GPU and loaded from a cost table, so a
 *             machine without a GPU makes the decisions that GPU would,
 *   analytic  a roofline (flops over a calibrated rate, bytes over a
 *             calibrated bandwidth, plus a launch overhead) for anything
 *             never measured, corrected by the table's nearest
 *             measurements of the same operator where it has some.
 * Every estimate says which source it came from.
 *
 * An operator configuration is named by a key that holds everything its
 * cost depends on: the operator, every input's shape and element type, and
 * every parameter, e.g.
 *   conv2d [1,64,56,56] [64,64,3,3] {kernel=(3 3) stride=(1 1) ... act=relu}
 *   split [1,96,28,28] ->3 {axis=1 sizes=()}     (outputs, where not one)
 * The key is also enough to rebuild the operator (cost_graph_from_key),
 * which is how configurations recorded on a CPU machine are measured later
 * in one GPU run.
 *
 * A cost table is text, one measurement per line, tab-separated:
 *   device  key  median_us  min_us  algo
 * with lines starting '#' for comments and the analytic model's
 * calibration ("#calib" lines, written by teq-profile --calibrate). */
#ifndef TEQ_RUNTIME_COST_H
#define TEQ_RUNTIME_COST_H

#include <stdio.h>

#include "runtime/cuda.h"
#include "runtime/err.h"
#include "runtime/graph.h"

/* Where a cost came from: measured on this machine's GPU, a row of a table
 * measured earlier, an estimate scaled from a measurement of the same kernel
 * at the same shapes with or without a bias or fused activation (a twin:
 * one epilogue away from a measurement), or the analytic model. */
typedef enum CostSource { COST_MEASURED, COST_TABLE, COST_TWIN, COST_ANALYTIC, COST__SOURCES } CostSource;

typedef struct CostEstimate {
  double us;
  CostSource source;
} CostEstimate;

/* The analytic model's parameters. Rates are the device's peaks; each
 * operator kind runs at a fraction of them (efficiencies in (0, 1]), fitted
 * per kind where the table has measurements of it, else the default for
 * its class (compute-bound rows, those with a flops hook, or the rest). */
typedef struct CostCalib {
  double peak_gflops, mem_gbps, launch_us;
  double flop_eff[OP__COUNT], byte_eff[OP__COUNT];
  bool fitted[OP__COUNT];
} CostCalib;

typedef struct CostModel CostModel;

/* A model with no table, no GPU and H100-like analytic defaults. */
TEQ_API CostModel *cost_model_new(void);
TEQ_API void cost_model_free(CostModel *m);

/* Loads a cost table's measurements for `device` (NULL: the first device
 * the file names) and its calibration; errors name file and line. */
TEQ_API int cost_model_load_table(CostModel *m, const char *path, const char *device, Diag *d);
/* Configurations not in the table are timed on dev from now on. */
TEQ_API void cost_model_use_gpu(CostModel *m, CudaDevice *dev);
/* Every configuration asked about is written to f once (its key, one per
 * line), for measuring later on a GPU. */
TEQ_API void cost_model_record(CostModel *m, FILE *f);
TEQ_API const CostCalib *cost_model_calib(const CostModel *m);
TEQ_API void cost_model_set_calib(CostModel *m, const CostCalib *c);
/* The device the table was measured on, or "" if none was loaded. */
TEQ_API const char *cost_model_device(const CostModel *m);
/* Number of measurements held (from the table and measured now). */
TEQ_API int cost_model_size(const CostModel *m);

/* Whether node id of g runs no kernel, so costs nothing and has nothing to
 * measure: a source or input, a no-op, an opaque node, or a view (op_view:
 * aliased by the GPU runtime). */
TEQ_API bool cost_node_is_free(const Graph *g, int id);
/* The cost of node id of g; 0 us (source COST_ANALYTIC) where
 * cost_node_is_free. Alone: a node its producers may write in place in g
 * is priced as its kernel here, and left out by the sums over graphs. */
TEQ_API int cost_node(CostModel *m, const Graph *g, int id, CostEstimate *out, Diag *d);
/* The sum over the nodes g's outputs need, less those its producers
 * write in place (graph_node_in_place) and those whose values their
 * readers read by strides (graph_strided), which run no kernel in g, and
 * with each chain of layout operators a runtime gathers (plan_gathers)
 * priced as its one copy (cost_gather); counts[s] says how many costs
 * came from source s. */
TEQ_API int cost_graph(CostModel *m, const Graph *g, double *us, int counts[COST__SOURCES],
                       Diag *d);
TEQ_API const char *cost_source_name(CostSource s);
/* What a chain of layout operators gathered into one copy of rows costs
 * (plan.h: plan_gathers), analytic: the roofline of a copy of its output
 * plus the rows' pointers, corrected by the table's measured transposes
 * nearest in bytes (kernels that read and write every element once). */
struct GatherRows;
TEQ_API CostEstimate cost_gather(const CostModel *m, const Graph *g, const struct GatherRows *r);

/* The analytic estimate alone, and the quantities behind it. */
TEQ_API double cost_analytic(const CostCalib *c, const Graph *g, int id);
/* The analytic estimate of an operator of this kind, arity (inputs plus
 * outputs), flops and bytes, corrected by the measured/roofline ratio of
 * the nearest table rows of the same kind; anchor `skip` (or none, -1)
 * left out. */
TEQ_API double cost_anchored(const CostModel *m, OpKind kind, int arity, double flops,
                             double bytes, int skip);
/* The table rows behind those corrections. */
TEQ_API int cost_model_anchors(const CostModel *m);
TEQ_API void cost_model_anchor(const CostModel *m, int i, OpKind *kind, int *arity,
                               double *flops, double *bytes, double *us);
TEQ_API double cost_node_flops(const Graph *g, int id);
TEQ_API double cost_node_bytes(const Graph *g, int id);

/* Node id's configuration key (see above); returns the length needed, as
 * snprintf does. */
TEQ_API int cost_config_key(const Graph *g, int id, char *buf, size_t size);
enum { COST_KEY_MAX = 1024 };
/* A configuration as bytes: the fields its key is made from (the
 * operator, its outputs, parameters, and each input's shape and whether it
 * holds int64), every byte set, so that configurations with equal bytes
 * have equal keys and are compared with memcmp over cost_config_len bytes.
 * cost_node looks a node up by these before it formats the key. */
enum { COST_CONFIG_MAX_IN = 64 };
typedef struct CostConfigIn {
  int32_t i64, ndim;
  int64_t d[TEQ_MAX_DIMS];
} CostConfigIn;
typedef struct CostConfig {
  int32_t kind, n_in, n_out, unused;
  Params params;
  CostConfigIn in[COST_CONFIG_MAX_IN];
} CostConfig;
/* Sets input j of k. */
TEQ_API void cost_config_input(CostConfig *k, int j, const Shape *s, DType dt);
/* Node id's configuration; false when it has more inputs than a
 * CostConfig holds. */
TEQ_API bool cost_config_of(const Graph *g, int id, CostConfig *k);
TEQ_API size_t cost_config_len(const CostConfig *k);
/* What cost_node gave configuration k, if it priced one already (and,
 * while recording, recorded it): a configuration in no graph (optimize's
 * refolded convolutions) is found without building one. */
TEQ_API bool cost_config_known(CostModel *m, const CostConfig *k, CostEstimate *out);

/* A graph that runs the configuration a key names: every input a graph
 * input (int64 inputs constants of zeros, valid as indices), one node, its
 * outputs the graph's. */
TEQ_API int cost_graph_from_key(const char *key, Graph **out, int *node, Diag *d);

#endif
