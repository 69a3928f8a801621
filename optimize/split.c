/* split.c: after the search, the bias adds and activations a merge left on
 * the pieces of a split put back where one kernel does them.
 *
 * Merging convolutions that read one input (TASO's rule) leaves
 * split(conv(x, concat(W1, W2))) with each piece's own epilogue after it:
 * a bias add, an activation. opt_fuse_bias folds those into a convolution
 * only where they follow the convolution itself. In Inception-v3, once a
 * 1x1 convolution moved before its pool merges with three siblings that
 * end in a relu, the siblings' part ran as a bias add over 176 channels
 * and three relus, one per sibling, where the convolution's bias and one
 * relu do:
 *
 *   - a piece of a channel split of a convolution, read only by an add of
 *     one value per channel, takes that add into the convolution's bias
 *     (the other pieces' channels add zeros, or the bias they had);
 *   - a split each of whose outputs is read only by the same unary
 *     element-wise operator becomes that operator before the split, one
 *     kernel over the whole tensor instead of one per piece.
 *
 * Both regroup the same arithmetic exactly. Repeated, the activation climbs
 * nested splits, and where it reaches the convolution opt_fuse_bias makes
 * it the convolution's fused activation. The search priced none of this,
 * and a change is not always cheaper: a relu that wrote a piece of a concat
 * in place (graph_node_in_place) moved before a split leaves a view there,
 * which cannot be, and a convolution's bias may cost more as a separate
 * epilogue than the add did. So each change is kept only where the graph
 * as run (opt_graph_cost_run) comes out no dearer. */
#include <stdlib.h>
#include <string.h>

#include "optimize/opt_int.h"

/* Per output of every node, its one reader (by one edge, not a graph
 * output), or -1: reader[offset[node] + out]. */
static int32_t *output_readers(const Graph *g, int32_t **offset) {
  int32_t *uses = graph_use_counts(g, offset);
  if (!uses) return NULL;
  int32_t total = (*offset)[g->n_nodes];
  int32_t *reader = malloc(((size_t)total + 1) * sizeof *reader);
  if (!reader) {
    free(uses);
    return NULL;
  }
  for (int32_t k = 0; k < total; k++) reader[k] = -1;
  for (int32_t i = 0; i < g->n_nodes; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++) {
      TensorRef r = g->nodes[i].in[j];
      int32_t k = (*offset)[r.node] + r.out;
      if (uses[k] == 1) reader[k] = i;
    }
  free(uses);
  return reader;
}

/* The one unary element-wise operator (its kind and parameters alike) that
 * alone reads each output of split s, or -1. */
static int32_t same_reader_of_each(const Graph *g, int32_t s, const int32_t *reader,
                                   const int32_t *offset) {
  const Node *sn = &g->nodes[s];
  int32_t first = reader[offset[s]];
  if (first < 0 || sn->n_out < 2) return -1; /* one piece: nothing to save */
  const Node *a = &g->nodes[first];
  if (!(op_def(a->kind)->flags & OPF_ELEMENTWISE) || a->n_in != 1 || a->n_out != 1 || a->opaque)
    return -1;
  for (int j = 1; j < sn->n_out; j++) {
    int32_t r = reader[offset[s] + j];
    if (r < 0 || g->nodes[r].kind != a->kind || g->nodes[r].n_in != 1 ||
        memcmp(&g->nodes[r].params, &a->params, sizeof a->params) != 0)
      return -1;
  }
  return first;
}

/* Split s's outputs each read by one act like node a: act(x), then split. */
static int act_before_split(Graph *g, int32_t s, int32_t a, const int32_t *reader,
                            const int32_t *offset, Diag *d) {
  const Node *sn = &g->nodes[s], *an = &g->nodes[a];
  Params ap = an->params, sp = sn->params;
  OpKind act = an->kind;
  int n_out = sn->n_out;
  TensorRef x = sn->in[0];
  int nact = graph_add_node(g, act, &x, 1, 1, &ap, NULL, d);
  if (nact < 0) return nact;
  int ns = graph_add_node(g, OP_SPLIT, &(TensorRef){nact, 0}, 1, n_out, &sp, g->nodes[s].name, d);
  if (ns < 0) return ns;
  for (int j = 0; j < n_out; j++)
    graph_replace_uses(g, (TensorRef){reader[offset[s] + j], 0}, (TensorRef){ns, j});
  return TEQ_OK;
}

/* Convolution c (its one output read by split s alone, along the
 * channels): the per-channel adds that alone read pieces of s, into c's
 * bias where apply says so. Returns how many pieces, 0 for none, or an
 * error. */
static int bias_through_split(Graph *g, OptChannels *m, int32_t c, int32_t s,
                              const int32_t *reader, const int32_t *offset, bool apply, Diag *d) {
  const Node *cn = &g->nodes[c], *sn = &g->nodes[s];
  int64_t M = cn->out[0].d[1];
  const Tensor *old = NULL;
  if (cn->n_in == 3) {
    const Node *b = &g->nodes[cn->in[2].node];
    if (b->kind != OP_CONST || !b->value || b->value->dtype != DT_F32 ||
        tensor_numel(b->value) != M)
      return 0;
    old = b->value;
  }
  Shape bs = shape_of(1, (int)M);
  Tensor *bias = tensor_new(DT_F32, &bs);
  float *vals = malloc((size_t)M * sizeof *vals); /* one piece's, at most M */
  int32_t *add = malloc((size_t)sn->n_out * sizeof *add);
  if (!bias || !vals || !add) {
    tensor_unref(bias);
    free(vals);
    free(add);
    return diag_error(d, "out of memory folding biases through a split");
  }
  float *bv = bias->data;
  if (old) memcpy(bv, old->data, (size_t)M * sizeof *bv);
  else memset(bv, 0, (size_t)M * sizeof *bv);
  int taken = 0;
  int64_t at = 0;
  for (int j = 0; j < sn->n_out; j++) {
    add[j] = -1;
    int32_t e = reader[offset[s] + j];
    const Shape *piece = &sn->out[j];
    const Node *en = e >= 0 ? &g->nodes[e] : NULL;
    if (en && en->kind == OP_EWADD && en->n_in == 2) {
      TensorRef other = en->in[0].node == s && en->in[0].out == j ? en->in[1] : en->in[0];
      if (other.node != s && shape_equal(&en->out[0], piece) &&
          opt_bias_value_per_channel(m, g, other, piece, vals)) {
        for (int64_t k = 0; k < piece->d[1]; k++) bv[at + k] += vals[k];
        add[j] = e;
        taken++;
      }
    }
    at += piece->d[1];
  }
  free(vals);
  int rc = TEQ_OK;
  if (taken && apply) {
    int bid = graph_add_const(g, NULL, bias, d); /* takes the reference */
    bias = NULL;
    TensorRef in[3] = {g->nodes[c].in[0], g->nodes[c].in[1], {bid, 0}};
    Params cp = g->nodes[c].params, sp = g->nodes[s].params;
    int nc = bid < 0 ? bid : graph_add_node(g, OP_CONV2D, in, 3, 1, &cp, g->nodes[c].name, d);
    int n_out = g->nodes[s].n_out;
    int ns = nc < 0 ? nc
                    : graph_add_node(g, OP_SPLIT, &(TensorRef){nc, 0}, 1, n_out, &sp,
                                     g->nodes[s].name, d);
    rc = ns < 0 ? ns : TEQ_OK;
    for (int j = 0; j < n_out && rc == TEQ_OK; j++)
      graph_replace_uses(g, (TensorRef){add[j] >= 0 ? add[j] : s, add[j] >= 0 ? 0 : j},
                         (TensorRef){ns, j});
  }
  tensor_unref(bias);
  free(add);
  return rc == TEQ_OK ? taken : rc;
}

/* Whether split s cuts the channels of convolution c's result, which it
 * alone reads: c without a residual or an activation (an add after the
 * activation is not a bias). */
static bool splits_conv(const Graph *g, int32_t s, const int32_t *reader, const int32_t *offset,
                        int32_t *c) {
  const Node *sn = &g->nodes[s];
  *c = sn->in[0].node;
  const Node *cn = &g->nodes[*c];
  int act_i = param_index(OP_CONV2D, "act"), axis_i = param_index(OP_SPLIT, "axis");
  return cn->kind == OP_CONV2D && cn->n_in <= 3 && cn->out[0].ndim == 4 &&
         cn->params.v[act_i].i[0] == ACT_NONE && !op_output_pooled(cn) && reader[offset[*c]] == s &&
         sn->params.v[axis_i].i[0] == 1;
}

/* The change at split s of g, if one applies there: how many pieces it
 * moves (0: none applies), made only where apply says so. reader and
 * offset are output_readers of g, or of the graph g copies (the same node
 * ids): a scan over every split shares one, where one per split made
 * NasRNN at 16 times its steps spend a third of its search here. */
static int change_at(Graph *g, OptChannels *m, int32_t s, const int32_t *reader,
                     const int32_t *offset, bool apply, Diag *d) {
  int32_t c, a = same_reader_of_each(g, s, reader, offset);
  int r = 0;
  if (a >= 0) {
    r = g->nodes[s].n_out;
    if (apply) {
      int rc = act_before_split(g, s, a, reader, offset, d);
      if (rc < 0) r = rc;
    }
  } else if (splits_conv(g, s, reader, offset, &c)) {
    r = bias_through_split(g, m, c, s, reader, offset, apply, d);
  }
  return r;
}

int opt_fold_through_splits(CostModel *cm, Graph **g, int *n_moved, int *n_fused, Diag *d) {
  return opt_fold_through_splits_with(cm, g, NULL, n_moved, n_fused, d);
}

int opt_fold_through_splits_with(CostModel *cm, Graph **g, OptChannels *m, int *n_moved,
                                 int *n_fused, Diag *d) {
  double cost = 0;
  int moved = 0, fused = 0;
  int rc = opt_graph_cost_run(cm, *g, &cost, NULL, NULL, d);
  /* Splits below `from` have been tried on the graph as it is. */
  for (int32_t from = 0; rc == TEQ_OK && from < (*g)->n_nodes;) {
    int32_t *offset = NULL, *reader = output_readers(*g, &offset);
    if (!reader) {
      free(offset);
      return diag_error(d, "out of memory folding through splits");
    }
    int32_t s = from;
    int r = 0;
    for (; s < (*g)->n_nodes; s++) {
      if ((*g)->nodes[s].kind != OP_SPLIT || (*g)->nodes[s].opaque) continue;
      if ((r = change_at(*g, m, s, reader, offset, false, d)) != 0) break;
    }
    if (r < 0) rc = r;
    Graph *t = r > 0 ? graph_copy(*g) : NULL;
    int f = 0,
        made = r <= 0 ? r : t ? change_at(t, m, s, reader, offset, true, d) : TEQ_ERR_NOMEM;
    free(reader);
    free(offset);
    if (r <= 0) break;
    double c = 0;
    rc = made < 0 ? made : graph_remove_dead(t);
    if (rc >= 0) rc = opt_fuse_bias_with(t, m, &f, d);
    if (rc == TEQ_OK) rc = opt_graph_cost_run(cm, t, &c, NULL, NULL, d);
    if (rc == TEQ_OK && made > 0 && c <= cost) { /* kept: every split may be tried anew */
      graph_free(*g);
      *g = t, t = NULL;
      cost = c, moved += r, fused += f, from = 0;
    } else {
      from = s + 1;
    }
    graph_free(t);
  }
  if (n_moved) *n_moved = moved;
  if (n_fused) *n_fused += fused;
  return rc;
}
