/* graph.h: tensor programs as DAGs of operator nodes.
 *
 * A Graph is an array of Nodes; a node's id is its index. Each input of a
 * node is a TensorRef (producing node, output index). Graph inputs are
 * OP_INPUT nodes, weights are OP_CONST nodes holding a shared Tensor, and
 * operators Teq has no semantics for are OP_OPAQUE nodes that keep what
 * export needs to write them back. Ids are stable until graph_remove_dead,
 * the only call that renumbers.
 *
 * The fields below may be read anywhere; they are changed only through
 * these functions, which keep the invariants graph_check verifies: every
 * edge names an existing node and output, output shapes are those the
 * registry infers from the input shapes, and there is no cycle.
 *
 * Ownership: a Graph owns its nodes, their arrays, names and opaque data,
 * and one reference to each constant Tensor. Names passed in are copied. */
#ifndef TEQ_RUNTIME_GRAPH_H
#define TEQ_RUNTIME_GRAPH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/err.h"
#include "runtime/ops.h"
#include "runtime/tensor.h"

typedef struct TensorRef {
  int32_t node; /* producing node id */
  int32_t out;  /* which of its outputs */
} TensorRef;

/* What export needs to write an opaque node back: its ONNX NodeProto,
 * serialized, whose inputs and outputs are renamed on export, and what the
 * model said about the node that the Node does not hold. Element types are
 * ONNX TensorProto codes, 0 where unknown: Teq holds bool, int32... as
 * int64, but the operator reads and writes the original types. A declared
 * shape keeps -1 for a symbolic extent and has rank SHAPE_UNKNOWN where
 * nothing declared it. Each array has its count's entries and may be NULL
 * when the count is 0 (nothing known); opaque_info_free frees them all. */
typedef struct OpaqueInfo {
  char *op_type;
  char *domain;       /* "" for the default ONNX domain */
  uint8_t *proto;     /* packed onnx.NodeProto */
  size_t proto_len;
  int opset;          /* version of the domain the definition comes from; 0 unknown */
  int32_t n_in;       /* the node's n_in, or 0 */
  int32_t *in_elem;   /* element type each input had in the model */
  int32_t n_out;      /* the node's n_out, or 0 */
  int32_t *out_elem;  /* element type of each output */
  Shape *out_declared; /* each output's shape as the model declared it */
} OpaqueInfo;

typedef struct Node {
  OpKind kind;
  int32_t n_in, n_out;
  TensorRef *in;      /* n_in inputs */
  Shape *out;         /* n_out inferred output shapes */
  DType dtype;        /* element type of every output: DT_F32 unless a constant or opaque says otherwise */
  Params params;
  char *name;         /* ONNX node or graph input name; may be NULL */
  Tensor *value;      /* OP_CONST only */
  OpaqueInfo *opaque; /* OP_OPAQUE only */
} Node;

typedef struct Graph {
  Node *nodes;
  int32_t n_nodes, cap_nodes;
  int32_t *inputs;        /* ids of the OP_INPUT nodes, in model order */
  int32_t n_inputs;
  TensorRef *outputs;     /* the graph's results, in model order */
  char **output_names;
  int32_t n_outputs;
} Graph;

/* ---- create, copy, free ---- */
TEQ_API Graph *graph_new(void);
/* Room for n nodes in all, so that adding them allocates no node array: a
 * reader that knows the count keeps many small graphs without slack. */
TEQ_API int graph_reserve(Graph *g, int n);
TEQ_API void graph_free(Graph *g);
/* Deep copy sharing constant tensors; NULL on allocation failure. */
TEQ_API Graph *graph_copy(const Graph *g);

/* Removes the nodes after the first n (the last ones added), for a search
 * that adds a step's nodes and takes them back; none of them may be an
 * input or an output of g, or read by one of the first n. */
TEQ_API void graph_truncate(Graph *g, int32_t n);

/* ---- build ---- */
/* Each returns the new node id (>= 0) or a negative error code with a
 * message in d. Nothing is added on failure. Every known shape in a graph
 * fits (shape_fits): a larger input, result or declared shape is
 * TEQ_ERR_INPUT. */
TEQ_API int graph_add_input(Graph *g, const char *name, const Shape *shape, DType dtype, Diag *d);
/* Takes over the caller's reference to value. */
TEQ_API int graph_add_const(Graph *g, const char *name, Tensor *value, Diag *d);
/* Checks arity and parameters (p NULL means the defaults) and infers the
 * output shapes; an input of unknown shape makes every output unknown. */
TEQ_API int graph_add_node(Graph *g, OpKind kind, const TensorRef *in, int n_in, int n_out,
                           const Params *p, const char *name, Diag *d);
/* Takes over info. Output shapes may be SHAPE_UNKNOWN. */
TEQ_API int graph_add_opaque(Graph *g, OpaqueInfo *info, const TensorRef *in, int n_in,
                             int n_out, const Shape *out_shapes, const DType *out_dtype,
                             const char *name, Diag *d);
TEQ_API int graph_add_output(Graph *g, TensorRef ref, const char *name, Diag *d);
TEQ_API void opaque_info_free(OpaqueInfo *info);

/* ---- query ---- */
static inline const Shape *graph_shape(const Graph *g, TensorRef r) {
  return &g->nodes[r.node].out[r.out];
}
/* A topological order of all nodes into order[0..n_nodes). Returns TEQ_OK,
 * or TEQ_ERR_INPUT if there is a cycle (order is then unspecified). Ties
 * are broken by id, so the order is deterministic. */
TEQ_API int graph_topo_order(const Graph *g, int32_t *order);
/* Structural hash from operator kinds, parameters, constant contents,
 * input names and edges, never pointers or ids: two graphs that compute the
 * same expression the same way hash alike. node_hash (optional, n_nodes
 * entries) receives each node's hash. Assumes no cycle. */
TEQ_API uint64_t graph_hash(const Graph *g, uint64_t *node_hash);
/* Number of uses of every output of every node (edges plus graph outputs),
 * as uses[node][out] flattened: uses + offset[node]. offset has n_nodes+1
 * entries. Both arrays are malloc'd for the caller; NULL on failure. */
TEQ_API int32_t *graph_use_counts(const Graph *g, int32_t **offset);
/* Verifies every invariant, re-inferring all shapes; O(nodes + edges).
 * Returns TEQ_OK or TEQ_ERR_INTERNAL with a message per violation. */
TEQ_API int graph_check(const Graph *g, Diag *d);
/* Gives every node's parameters their canonical spelling (OpDef.canonical),
 * so that equal operators compare equal; returns how many changed. */
TEQ_API int graph_canonicalize(Graph *g);
/* Merges nodes that compute the same value: the same kind, parameters and
 * inputs (commutative inputs in either order), or constants holding equal
 * values. Uses of the later one move to the earlier, and nodes left unused
 * are removed (graph_remove_dead). Graph inputs and opaque nodes are never
 * merged. Returns how many nodes were merged, or a negative error. Rewrites
 * leave such twins behind (two rules each building concat(x, h)), and a
 * rule that needs one shared input matches only once they are one. */
TEQ_API int graph_merge_duplicates(Graph *g);
/* Folds each ewadd of a node it alone reads (one whose row has a
 * residual_input it does not use yet, no fused activation, its optional
 * inputs constants) and a tensor of that node's output shape into the
 * node as its residual, with an activation that alone reads the sum as its
 * fused act: ResNet's conv + add + relu becomes one conv. The node at the
 * add's input 0 is tried first (ResNet's Add(out, shortcut) keeps its
 * shortcut as the residual where the shortcut is a conv too). The add may
 * read the node through a view of all of it that it alone reads (a
 * transformer's gemm of its tokens as rows, reshaped to the tokens' shape
 * again; graph_node_is_view): the tensor is then
 * reshaped to the node's output, and the fused node's output back. Returns
 * how many, or a negative error; nodes left unused are removed. The
 * importer runs it, and optimize after the search, which takes residuals
 * apart. */
TEQ_API int graph_fuse_residuals(Graph *g, Diag *d);
/* op_view (ops.h) for node id at the shapes its inputs have in g: whether
 * every output is a run of input 0, first (NULL or n_out entries) where
 * each starts. What the cost model and the GPU planner both ask. */
TEQ_API bool graph_node_is_view(const Graph *g, int id, int64_t *first);
/* Per node, its only reader: the one node with an edge from it (from any
 * of its outputs), or -1 where it has none, several edges (two from one
 * node too) or is a graph output. malloc'd, n_nodes entries; NULL when
 * memory runs out. */
TEQ_API int32_t *graph_only_readers(const Graph *g);
/* Every node's readers, one entry per edge (a node reading another twice
 * is listed twice), in node order: node i is read by readers[start[i] ..
 * start[i + 1]). Both arrays malloc'd, the caller's to free; TEQ_OK or
 * TEQ_ERR_NOMEM (both then NULL). */
TEQ_API int graph_readers(const Graph *g, int32_t **start, int32_t **readers);
/* Whether node id of g writes its one output with a kernel of its own
 * into memory the runtime gives it (which may then be a run of another
 * value): not an input, constant, source, no-op, opaque node or view. */
TEQ_API bool graph_node_owns_output(const Graph *g, int id);
/* Per node, the node its output may live in: the one node with an
 * assembled hook (ops.h: a concat) that reads it, by one edge; -1 where
 * none or several do. malloc'd, n_nodes entries; NULL when memory runs
 * out. */
TEQ_API int32_t *graph_piece_homes(const Graph *g);
/* Whether node id of g needs no kernel because its inputs' producers write
 * its output in place: its output is its inputs laid end to end
 * (op_assembled), and each input is the one output of a node that owns it
 * (graph_node_owns_output), whose home (graph_piece_homes) is id and that
 * is not in weight (NULL: none; optimize's nodes of weights alone, which
 * it exports as constants). Other readers of a piece read it where it
 * lives. first (NULL, or n_in entries): where each input starts. The GPU
 * planner lays such inputs out in place and the cost model charges such a
 * node nothing, so both ask here. */
TEQ_API bool graph_node_in_place(const Graph *g, int id, const int32_t *home,
                                 const bool *weight, int64_t *first);
/* Values read or written by strides. A transpose's output is its input
 * read through permuted strides (the row's strided hook), and a run of
 * such a value (a view: a split's piece, a reshape) is too, where strides
 * can say it. Where every reader of such a value reads it strided (the
 * reader row's reads_strided: the GPU's matmul) and it is no graph output,
 * the node that makes it needs no kernel: a runtime that lays values out
 * by plan aliases it to the dense value it reads. The other way round, a
 * transpose that stays a kernel needs none either where the producer of
 * its input, which it alone reads, writes that input through the inverse
 * strides straight into the transpose's output (the producer row's
 * writes_strided: a matmul's heads put back among the tokens).
 * Per value slot (graph_use_counts' offsets): base, the dense slot whose
 * memory it is in (-1: its own); first, the element of base its element 0
 * is; strides, TEQ_MAX_DIMS element strides into base. Per node: strided,
 * no kernel (its outputs read by strides, or written by its producer).
 * The cost model charges such nodes nothing and the GPU planner aliases
 * them, so both ask here. With TEQ_NO_STRIDES set (not "0") in the
 * environment every value is dense, as before: the baseline a GPU session
 * times them against. */
typedef struct GraphStrided {
  int32_t *offset;  /* n_nodes + 1 */
  int32_t *base;
  int64_t *first;
  int64_t *strides; /* TEQ_MAX_DIMS per slot */
  uint8_t *strided; /* per node */
} GraphStrided;
/* TEQ_ERR_NOMEM when memory runs out, TEQ_ERR_INPUT for a cycle. */
TEQ_API int graph_strided(const Graph *g, GraphStrided *s);
TEQ_API void graph_strided_fini(GraphStrided *s);
/* Counts nodes that compute (not inputs, constants or no-ops). */
TEQ_API int graph_count_ops(const Graph *g);

/* ---- rewrite ---- */
/* Every use of `from` (edges and graph outputs) becomes a use of `to`. */
TEQ_API void graph_replace_uses(Graph *g, TensorRef from, TensorRef to);
/* Re-infers every shape in topological order (after a rewrite). */
TEQ_API int graph_infer_shapes(Graph *g, Diag *d);
/* Removes nodes no graph output depends on (graph inputs always stay) and
 * renumbers the rest, keeping their relative order. Returns how many were
 * removed, or a negative error. */
TEQ_API int graph_remove_dead(Graph *g);

/* ---- show ---- */
/* One line per node in topological order:
 *   %5 = conv2d(%3, %4) stride=(2 2) act=relu : [1, 64, 56, 56]   */
TEQ_API void graph_dump(const Graph *g, FILE *f);
/* How messages name node id: "'conv_3' (conv2d)" for a named node,
 * "#12 (conv2d)" for an unnamed one (an opaque node by its op_type).
 * Returns buf; GRAPH_LABEL_MAX is always enough. */
TEQ_API const char *graph_node_label(const Graph *g, int id, char *buf, size_t size);
#define GRAPH_LABEL_MAX 300

#endif
