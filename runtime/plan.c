/* plan.c: the memory plan of a graph on a device (plan.h). One pass in
 * topological order sorts the needed nodes into steps, constants, views,
 * nodes written in place, strided values and chains gathered (gather.c); aliases are resolved to the value that owns
 * their memory; each owner's live range is its steps' and its aliases';
 * and the arena is packed biggest first. */
#include "runtime/plan.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/ops.h"

/* Buffers start where a runtime's allocations do: views and pieces in
 * them are then aligned as ops.h says. */
static int64_t align_up(int64_t x) {
  return (x + OP_ARENA_ALIGN - 1) & ~(int64_t)(OP_ARENA_ALIGN - 1);
}

void mem_plan_fini(MemPlan *p) {
  free(p->offset);
  free(p->steps);
  free(p->inputs);
  free(p->outputs);
  free(p->where);
  free(p->root);
  free(p->at);
  free(p->bytes);
  free(p->first);
  free(p->last);
  free(p->strided);
  free(p->strides);
  plan_gathers_fini(&p->gathers);
  memset(p, 0, sizeof *p);
}

typedef struct Placed {
  int32_t slot;
  int64_t bytes;
} Placed;

/* Biggest first; equal sizes in slot order, so the plan is the same on
 * every machine. */
static int by_size(const void *a, const void *b) {
  const Placed *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return (x->slot > y->slot) - (x->slot < y->slot);
}

typedef struct Busy {
  int64_t from, to;
} Busy;

static int by_start(const void *a, const void *b) {
  const Busy *x = a, *y = b;
  if (x->from != y->from) return x->from < y->from ? -1 : 1;
  return (x->to > y->to) - (x->to < y->to);
}

/* Places each arena value at the lowest offset where it overlaps no value
 * placed before it that is live at the same time; biggest first keeps the
 * arena close to the peak live set. */
static int place_arena(MemPlan *p) {
  int n = 0;
  for (int s = 0; s < p->n_slots; s++) n += p->where[s] == MEM_ARENA;
  Placed *order = malloc(((size_t)n + 1) * sizeof *order);
  Busy *busy = malloc(((size_t)n + 1) * sizeof *busy);
  if (!order || !busy) {
    free(order);
    free(busy);
    return TEQ_ERR_NOMEM;
  }
  n = 0;
  for (int s = 0; s < p->n_slots; s++)
    if (p->where[s] == MEM_ARENA)
      order[n++] = (Placed){s, p->bytes[s] > 4 ? p->bytes[s] : 4};
  qsort(order, (size_t)n, sizeof *order, by_size);
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    int v = order[i].slot, nb = 0;
    for (int k = 0; k < i; k++) {
      int u = order[k].slot;
      if (p->first[u] <= p->last[v] && p->first[v] <= p->last[u])
        busy[nb++] = (Busy){p->at[u], p->at[u] + order[k].bytes};
    }
    qsort(busy, (size_t)nb, sizeof *busy, by_start);
    int64_t at = 0;
    for (int k = 0; k < nb; k++) {
      if (at + order[i].bytes <= busy[k].from) break;
      if (align_up(busy[k].to) > at) at = align_up(busy[k].to);
    }
    p->at[v] = at;
    if (at + order[i].bytes > total) total = at + order[i].bytes;
  }
  p->arena_bytes = align_up(total);
  free(order);
  free(busy);
  return TEQ_OK;
}

/* The pieces of the nodes written in place: each piece's slot an alias of
 * its run of the node's output (root and at), in_place[id] set. */
static int mark_in_place(const Graph *g, MemPlan *p, const uint8_t *needed, uint8_t *in_place) {
  int32_t *home = graph_piece_homes(g);
  int max_in = 1;
  for (int id = 0; id < g->n_nodes; id++)
    if (g->nodes[id].n_in > max_in) max_in = g->nodes[id].n_in;
  int64_t *first = malloc((size_t)max_in * sizeof *first);
  if (!home || !first) {
    free(home);
    free(first);
    return TEQ_ERR_NOMEM;
  }
  for (int id = 0; id < g->n_nodes; id++) {
    const Node *n = &g->nodes[id];
    if (!needed[id] || !op_def(n->kind)->assembled || p->gathers.role[id] != GATHER_NONE)
      continue;
    if (!graph_node_in_place(g, id, home, NULL, first)) continue;
    in_place[id] = 1;
    int64_t elem = (int64_t)dtype_size(n->dtype);
    for (int j = 0; j < n->n_in; j++) {
      int s = p->offset[n->in[j].node] + n->in[j].out;
      p->where[s] = MEM_ALIAS;
      p->root[s] = p->offset[id];
      p->at[s] = first[j] * elem;
    }
  }
  free(home);
  free(first);
  return TEQ_OK;
}

/* Slots s0 .. s0 + n_out that st lays out by strides: aliases of the slot
 * whose memory they are in, with their strides. */
static void alias_strided(MemPlan *p, const GraphStrided *st, int s0, int n_out, int64_t elem) {
  for (int v = s0; v < s0 + n_out; v++) {
    if (st->base[v] < 0) continue;
    p->where[v] = MEM_ALIAS;
    p->root[v] = st->base[v];
    p->at[v] = st->first[v] * elem;
    p->strided[v] = 1;
    memcpy(p->strides + (size_t)v * TEQ_MAX_DIMS, st->strides + (size_t)v * TEQ_MAX_DIMS,
           TEQ_MAX_DIMS * sizeof *p->strides);
  }
}

int mem_plan_build(const Graph *g, MemPlan *p, Diag *d) {
  memset(p, 0, sizeof *p);
  int nn = p->n_nodes = g->n_nodes;
  int32_t *uses = graph_use_counts(g, &p->offset);
  free(uses);
  int32_t *order = malloc(((size_t)nn + 1) * sizeof *order);
  uint8_t *needed = calloc((size_t)nn + 1, 1), *in_place = calloc((size_t)nn + 1, 1);
  int max_out = 1;
  for (int id = 0; id < nn; id++)
    if (g->nodes[id].n_out > max_out) max_out = g->nodes[id].n_out;
  int64_t *view_first = malloc((size_t)max_out * sizeof *view_first);
  GraphStrided st = {0};
  int rc = uses && order && needed && in_place && view_first ? TEQ_OK : TEQ_ERR_NOMEM;
  int ns = rc == TEQ_OK ? (p->n_slots = p->offset[nn]) : 0;
  if (rc == TEQ_OK) {
    p->steps = malloc(((size_t)nn + 1) * sizeof *p->steps);
    p->inputs = malloc(((size_t)nn + 1) * sizeof *p->inputs);
    p->outputs = malloc(((size_t)g->n_outputs + 1) * sizeof *p->outputs);
    p->where = calloc((size_t)ns + 1, sizeof *p->where);
    p->root = malloc(((size_t)ns + 1) * sizeof *p->root);
    p->at = calloc((size_t)ns + 1, sizeof *p->at);
    p->bytes = calloc((size_t)ns + 1, sizeof *p->bytes);
    p->first = malloc(((size_t)ns + 1) * sizeof *p->first);
    p->last = malloc(((size_t)ns + 1) * sizeof *p->last);
    p->strided = calloc((size_t)ns + 1, sizeof *p->strided);
    p->strides = calloc(((size_t)ns + 1) * TEQ_MAX_DIMS, sizeof *p->strides);
    if (!p->steps || !p->inputs || !p->outputs || !p->where || !p->root || !p->at ||
        !p->bytes || !p->first || !p->last || !p->strided || !p->strides)
      rc = TEQ_ERR_NOMEM;
  }
  if (rc == TEQ_OK && graph_topo_order(g, order) != TEQ_OK)
    rc = diag_error(d, "graph has a cycle");
  if (rc == TEQ_OK) rc = graph_strided(g, &st);
  if (rc == TEQ_OK) rc = plan_gathers(g, &st, &p->gathers, d);
  if (rc == TEQ_OK) {
    /* first and last hold each value's defining step and last reader
     * (-1: none) until the arena's live ranges replace them. */
    for (int s = 0; s < ns; s++) p->root[s] = -1, p->first[s] = -1, p->last[s] = -1;
    for (int i = 0; i < g->n_outputs; i++) needed[g->outputs[i].node] = 1;
    for (int k = nn - 1; k >= 0; k--) {
      const Node *n = &g->nodes[order[k]];
      if (needed[order[k]])
        for (int j = 0; j < n->n_in; j++) needed[n->in[j].node] = 1;
    }
    rc = mark_in_place(g, p, needed, in_place);
  }
  for (int k = 0; k < nn && rc == TEQ_OK; k++) {
    int id = order[k];
    const Node *n = &g->nodes[id];
    if (!needed[id]) continue;
    const OpDef *o = op_def(n->kind);
    int64_t elem = (int64_t)dtype_size(n->dtype);
    int s0 = p->offset[id];
    for (int j = 0; j < n->n_out; j++) {
      if (!shape_is_known(&n->out[j])) {
        char label[GRAPH_LABEL_MAX];
        graph_node_label(g, id, label, sizeof label);
        rc = diag_error(d, "node %s: output %d has an unknown shape", label, j);
        break;
      }
      p->bytes[s0 + j] = shape_numel(&n->out[j]) * elem;
    }
    if (rc) break;
    const PlanGathers *pg = &p->gathers;
    if (pg->role[id] == GATHER_INNER) {
      continue; /* inside a chain: no memory, no step */
    } else if (pg->role[id] == GATHER_EXIT) {
      /* a step that copies rows from the chain's sources */
      const GatherRows *r = &pg->exits[pg->exit[id]];
      p->first[s0] = p->n_steps;
      for (int k = 0; k < r->n_sources; k++) p->last[r->sources[k]] = p->n_steps;
      p->steps[p->n_steps++] = id;
    } else if (n->kind == OP_INPUT) {
      p->inputs[p->n_inputs++] = s0;
      p->where[s0] = MEM_ARENA;
    } else if (n->kind == OP_CONST || ((o->flags & OPF_SOURCE) && o->eval_f32)) {
      p->where[s0] = MEM_CONST; /* a source's tensor is computed once, by the device */
    } else if (st.strided[id]) {
      /* No step. A transpose its producer writes owns its memory (the
       * producer's output is the alias); any other is read by strides. */
      alias_strided(p, &st, s0, n->n_out, elem);
    } else if (graph_node_is_view(g, id, view_first)) {
      int src = p->offset[n->in[0].node] + n->in[0].out;
      int64_t base = 0;
      if (p->root[src] >= 0) base = p->at[src], src = p->root[src];
      for (int j = 0; j < n->n_out; j++) {
        p->where[s0 + j] = MEM_ALIAS;
        p->root[s0 + j] = src;
        p->at[s0 + j] = base + view_first[j] * elem;
      }
    } else if (!in_place[id]) {
      /* a step (the device says whether it has a kernel) */
      for (int j = 0; j < n->n_out; j++) p->first[s0 + j] = p->n_steps;
      for (int j = 0; j < n->n_in; j++)
        p->last[p->offset[n->in[j].node] + n->in[j].out] = p->n_steps;
      p->steps[p->n_steps++] = id;
      alias_strided(p, &st, s0, n->n_out, elem); /* written into its reader's memory */
    }
  }
  if (rc == TEQ_OK) {
    int end = p->n_steps;
    for (int i = 0; i < g->n_outputs; i++) {
      int s = p->offset[g->outputs[i].node] + g->outputs[i].out;
      p->outputs[p->n_outputs++] = s;
      p->last[s] = end; /* read back after the last step */
    }
    /* A piece written in place may be a node written in place itself:
     * every alias then names the value that owns its memory, at the sum of
     * the offsets on the way (each slot rewritten so later walks stop). */
    for (int s = 0; s < ns; s++) {
      if (p->root[s] < 0) continue;
      int r = p->root[s];
      int64_t at = p->at[s];
      while (p->root[r] >= 0) at += p->at[r], r = p->root[r];
      p->root[s] = r, p->at[s] = at;
    }
    /* A value lives as long as any alias of it is read, and from the first
     * step that writes a piece of it in place. */
    for (int s = 0; s < ns; s++) {
      int r = p->root[s];
      if (r < 0) continue;
      if (p->last[s] > p->last[r]) p->last[r] = p->last[s];
      if (p->first[s] >= 0 && (p->first[r] < 0 || p->first[s] < p->first[r]))
        p->first[r] = p->first[s];
    }
    /* Graph inputs live throughout, every computed value from its step to
     * its last use; constants get their own block. */
    for (int s = 0; s < ns; s++) {
      if (p->where[s] == MEM_ALIAS) continue;
      if (p->where[s] == MEM_CONST) {
        p->at[s] = p->const_bytes;
        p->const_bytes += align_up(p->bytes[s]);
      } else if (p->where[s] == MEM_ARENA) { /* an input */
        p->first[s] = -1, p->last[s] = end;
      } else if (p->first[s] >= 0) {
        p->where[s] = MEM_ARENA;
        if (p->last[s] < p->first[s]) p->last[s] = p->first[s];
      }
    }
    rc = place_arena(p);
  }
  if (rc == TEQ_ERR_NOMEM) diag_error(d, "out of memory planning the graph");
  free(order);
  free(needed);
  free(in_place);
  free(view_first);
  graph_strided_fini(&st);
  if (rc) mem_plan_fini(p);
  return rc;
}

int plan_as_run(const Graph *g, PlanAsRun *r, Diag *d) {
  memset(r, 0, sizeof *r);
  int rc = (r->home = graph_piece_homes(g)) ? graph_strided(g, &r->strided) : TEQ_ERR_NOMEM;
  if (rc == TEQ_ERR_INPUT) rc = diag_error(d, "graph has a cycle");
  else if (rc) diag_error(d, "out of memory");
  if (rc == TEQ_OK) rc = plan_gathers(g, &r->strided, &r->gathers, d);
  if (rc) plan_as_run_fini(r);
  return rc;
}

void plan_as_run_fini(PlanAsRun *r) {
  graph_strided_fini(&r->strided);
  plan_gathers_fini(&r->gathers);
  free(r->home);
  memset(r, 0, sizeof *r);
}

PlanRun plan_node_runs(const Graph *g, const PlanAsRun *r, int id, const bool *weight) {
  if (r->gathers.role[id] == GATHER_INNER) return PLAN_RUN_CHAINED;
  if (r->gathers.role[id] == GATHER_EXIT) return PLAN_RUN_GATHER;
  if (r->strided.strided[id]) return PLAN_RUN_STRIDED;
  if (graph_node_in_place(g, id, r->home, weight, NULL)) return PLAN_RUN_IN_PLACE;
  return PLAN_RUN_KERNEL;
}
