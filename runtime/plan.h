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
 * The GPU runtime (runtime/cuda/device.cu) lays its memory out by this plan;
 * it is host code so that any machine tests it (tests/runtime/test_plan.c). */
#ifndef TEQ_RUNTIME_PLAN_H
#define TEQ_RUNTIME_PLAN_H

#include <stdint.h>

#include "runtime/err.h"
#include "runtime/graph.h"

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
} MemPlan;

/* Plans g. Fails with TEQ_ERR_INPUT for a cycle or a needed value of
 * unknown shape, TEQ_ERR_NOMEM when memory runs out. */
TEQ_API int mem_plan_build(const Graph *g, MemPlan *p, Diag *d);
TEQ_API void mem_plan_fini(MemPlan *p);

#endif
