/* plan.h: how a graph runs on a device with one block of memory: which
 * nodes run as steps, in what order, and where every value lives.
 *
 * A value lives in one of three places:
 *   arena   one block shared by all computed values and the graph's inputs,
 *           each placed where no value live at the same time is (inputs
 *           live throughout, a computed value from its step to its last
 *           read), biggest first;
 *   consts  a block of its own for constants, and for source nodes
 *           (OPF_SOURCE: constant tensors such as C_pool) computed once;
 *   alias   no memory of its own: a view (op_view) is a run of its input,
 *           a piece of a node written in place (graph_node_in_place) is
 *           its run of that node's output, and a value its readers read by
 *           strides (graph_strided: a transpose a matmul reads) is the
 *           value it reorders, read through its strides. An alias names
 *           the value that owns the memory (never an alias) and the byte
 *           offset into it of its element 0.
 * Views, nodes written in place and strided values are no steps.
 *
 * A chain of layout operators between two computing ones (Swin's cyclic
 * shift, four slices and two concats, then its window partition, a pad,
 * two reshapes and a transpose, before the product that reads it) runs as
 * one step: plan_gathers below. The nodes inside it have neither memory
 * nor a step, and the node at its end copies rows straight from the
 * chain's sources.
 *
 * The GPU runtime (runtime/cuda/device.cu) lays its memory out by this plan;
 * it is host code so that any machine tests it (tests/runtime/test_plan.c). */
#ifndef TEQ_RUNTIME_PLAN_H
#define TEQ_RUNTIME_PLAN_H

#include <stdint.h>

#include "runtime/err.h"
#include "runtime/graph.h"

/* Chains of layout operators run as one gather. A layout node (OPF_LAYOUT_ONLY,
 * whose element maps exec_layout_maps can say) is inside a chain where
 * every reader of its outputs is in one and it is no graph output; a
 * layout node in a chain that something else reads is the chain's exit.
 * The exit's output is then copied in one step from the values the chain
 * starts at (its sources: computed values, inputs, constants, exits of
 * other chains), row by row: a row is a run of row_len elements of the
 * output that is a run of one source, or zeros (padding). Where the rows
 * would be shorter than 16 elements (a copy that reads a float here and
 * one there, which no GPU does at a copy's speed), or where the chain
 * runs fewer than two kernels as it is, the exit stays what it was, and
 * so its inputs are exits too (to a fixed point). Transposes read or
 * written by strides (graph_strided) are not layout nodes here: they run
 * no kernel already. With TEQ_NO_GATHERS set (not "0") no chain is
 * gathered: the baseline a GPU session times them against. */
enum { GATHER_NONE, GATHER_INNER, GATHER_EXIT };
typedef struct GatherRows {
  int32_t node;            /* the exit */
  int64_t n_rows, row_len; /* its output, n_rows * row_len elements */
  int32_t *slot;           /* per row: the value slot it is a run of; -1: zeros */
  int64_t *elem;           /* per row: the element of that value it starts at */
  int32_t *sources;        /* the distinct slots read, each once */
  int n_sources;
  int kernels;             /* the kernels the chain ran before (its views not counted) */
} GatherRows;
typedef struct PlanGathers {
  uint8_t *role;           /* per node: GATHER_NONE, GATHER_INNER or GATHER_EXIT */
  int32_t *exit;           /* per node: its index in exits where GATHER_EXIT, else -1 */
  GatherRows *exits;
  int n_exits;
} PlanGathers;
/* The chains of g given its strided values st (graph_strided), with slots
 * numbered by st->offset. TEQ_ERR_NOMEM when memory runs out; errors of
 * the layout kernels run on element numbers pass through. */
TEQ_API int plan_gathers(const Graph *g, const GraphStrided *st, PlanGathers *pg, Diag *d);
TEQ_API void plan_gathers_fini(PlanGathers *pg);
/* Where each of r's rows starts, given where each value slot starts
 * (slot_at, by slot; device or host addresses alike): rows[i] NULL for a
 * row of zeros. The device uploads these once per plan; the plan run on
 * the host (exec_run_planned) copies through the same pointers. */
TEQ_API void plan_gather_pointers(const GatherRows *r, const void *const *slot_at,
                                  const float **rows);

typedef enum MemWhere { MEM_UNUSED, MEM_ARENA, MEM_CONST, MEM_ALIAS } MemWhere;

typedef struct MemPlan {
  int n_nodes, n_slots;
  int32_t *offset;   /* n_nodes + 1: node i's output j is value slot offset[i] + j */
  int32_t *steps;    /* the nodes that run, in the order they run */
  int n_steps;
  int32_t *inputs;   /* the slots of the graph's inputs, in topological order */
  int n_inputs;
  int32_t *outputs;  /* the slot of each graph output */
  int n_outputs;
  /* Per slot. */
  uint8_t *where;    /* MemWhere */
  int32_t *root;     /* MEM_ALIAS: the slot whose memory it is in */
  int64_t *at;       /* bytes into the arena, the constants' block, or root's value */
  int64_t *bytes;    /* its size (at least 4: no value has no address) */
  int32_t *first, *last; /* MEM_ARENA: the steps it is live over (-1 and n_steps: throughout) */
  uint8_t *strided;  /* an alias read by strides (graph_strided) */
  int64_t *strides;  /* where strided: TEQ_MAX_DIMS element strides into root's memory */
  int64_t arena_bytes, const_bytes;
  PlanGathers gathers; /* the steps of chains' exits copy rows (plan_gathers) */
} MemPlan;

/* Plans g. Fails with TEQ_ERR_INPUT for a cycle or a needed value of
 * unknown shape, TEQ_ERR_NOMEM when memory runs out. */
TEQ_API int mem_plan_build(const Graph *g, MemPlan *p, Diag *d);
TEQ_API void mem_plan_fini(MemPlan *p);

/* How each node of g runs as a plan runs it, for those that price or
 * report a graph as run (cost_graph, optimize's as-run costs, teq-profile
 * cost), made once per graph: what graph_strided, plan_gathers and
 * graph_node_in_place decide, asked in the order the plan asks them. */
typedef struct PlanAsRun {
  GraphStrided strided;
  PlanGathers gathers;
  int32_t *home; /* graph_piece_homes */
} PlanAsRun;
typedef enum PlanRun {
  PLAN_RUN_KERNEL,   /* its own kernel (or none, where it is a view or a source) */
  PLAN_RUN_GATHER,   /* the exit of a chain: one gather of rows (cost_gather) */
  PLAN_RUN_CHAINED,  /* inside a chain: nothing */
  PLAN_RUN_STRIDED,  /* read or written by strides: nothing */
  PLAN_RUN_IN_PLACE, /* written in place by its producers: nothing */
} PlanRun;
/* TEQ_ERR_NOMEM, or TEQ_ERR_INPUT for a cycle, with a message. */
TEQ_API int plan_as_run(const Graph *g, PlanAsRun *r, Diag *d);
TEQ_API void plan_as_run_fini(PlanAsRun *r);
/* Node id's way; weight (NULL: none) as graph_node_in_place takes it. */
TEQ_API PlanRun plan_node_runs(const Graph *g, const PlanAsRun *r, int id, const bool *weight);

#endif
