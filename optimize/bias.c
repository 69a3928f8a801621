/* bias.c: convolution biases and fused activations taken apart for the
 * search and put back for export.
 *
 * The rules gen-rules finds are about plain convolutions, while nearly
 * every convolution of a real model has a bias (BatchNormalization folds
 * into one) and often a fused activation. Before the search each
 * conv2d(x, w, b, act) becomes act(ewadd(conv2d(x, w), B)) with B the bias
 * spread to the convolution's whole output shape, which is the same
 * computation. The rules' ewadd adds tensors of equal shapes (a rule about
 * those says nothing about a broadcast [1, C, 1, 1] bias, and the matcher
 * refuses such a match), so spread out, the rules about
 * convolutions and element-wise operators apply to it; merging two
 * convolutions then merges their biases through the rules for ewadd and
 * concat. After the search the inverse folding runs: an ewadd of a
 * convolution's only use and a constant that is one value per channel
 * (whatever its shape), or weights' operators that compute one (the
 * concat of two merged convolutions' biases), becomes the
 * convolution's bias, and a relu, sigmoid or tanh of a convolution's only
 * use becomes its fused activation; a bias or an activation after a concat
 * along the channels of convolutions read by it alone is pushed into them
 * (push_through_concat). Both directions only regroup the same arithmetic
 * (the bias is added to each finished sum either way).
 *
 * A convolution with a residual (conv2d's fourth input, ResNet's shortcut
 * folded in at import) is split into act(ewadd(conv2d(x, w, b), Z)): its
 * bias stays in the convolution, unless it adds nothing (the zero bias a
 * residual needs where the model had none, which no split bias adds
 * either). With its bias spread out as well, the rules that regroup sums
 * added the bias to the shortcut first, at no cost to the search, and left
 * sums that no longer fold: ResNet-18's result came out dearer than its
 * import. Kept in, a biased conv is out of the rules' reach (they are about
 * plain convolutions) and the sum stays foldable; a bias-free one (NasNet's
 * branches) is still merged with its siblings. After the search,
 * graph_fuse_residuals puts the residuals back, as the importer first did
 * (delta.c does not derive this folding: it only lowers the cost the
 * search found).
 *
 * The search prices every candidate as this folding would leave it
 * without running it (delta.c derives the folding of a rewrite from the
 * graph it rewrites); a change here must be made there too, and
 * tests/optimize/test_optimize.c compares the two. */
#include <stdlib.h>
#include <string.h>

#include "optimize/opt_int.h"

/* Whether every element of a float32 tensor is zero: a bias that adds
 * nothing (the placeholder a residual needs, VGG-19's) is no ewadd for the
 * search. */
static bool all_zero(const Tensor *t) {
  if (t->dtype != DT_F32) return false;
  const float *v = t->data;
  for (int64_t i = 0; i < tensor_numel(t); i++)
    if (v[i] != 0.0f) return false;
  return true;
}

int opt_split_bias(Graph *g, int *n_split, Diag *d) {
  int act_i = param_index(OP_CONV2D, "act"), n = g->n_nodes, split = 0, rc = TEQ_OK;
  for (int id = 0; id < n && rc == TEQ_OK; id++) {
    Node *c = &g->nodes[id];
    if (c->kind != OP_CONV2D || op_output_pooled(c)) continue;
    int64_t act = c->params.v[act_i].i[0];
    if (c->n_in < 3 && act == ACT_NONE) continue;
    if (act < 0 || act >= ACT__COUNT) continue;
    TensorRef x = c->in[0], w = c->in[1], b = c->n_in > 2 ? c->in[2] : (TensorRef){-1, 0};
    TensorRef z = c->n_in > 3 ? c->in[3] : (TensorRef){-1, 0};
    if (b.node >= 0 && g->nodes[b.node].kind != OP_CONST) continue;
    bool zero_bias = b.node >= 0 && all_zero(g->nodes[b.node].value);
    /* A residual conv keeps a bias that adds something (see above). */
    bool keep_bias = z.node >= 0 && b.node >= 0 && !zero_bias;
    Params p = c->params;
    p.v[act_i].i[0] = ACT_NONE;
    int plain = graph_add_node(g, OP_CONV2D, (TensorRef[]){x, w, b}, keep_bias ? 3 : 2, 1, &p,
                               g->nodes[id].name, d);
    if (plain < 0) return plain;
    TensorRef cur = {plain, 0};
    if (b.node >= 0 && !zero_bias && !keep_bias) {
      const Tensor *bv = g->nodes[b.node].value;
      const Shape s = g->nodes[plain].out[0];
      if (s.ndim != 4 || tensor_numel(bv) != s.d[1] || bv->dtype != DT_F32) return TEQ_ERR_INTERNAL;
      Tensor *t = tensor_new_uninit(DT_F32, &s); /* every element written below */
      if (!t) return TEQ_ERR_NOMEM;
      const float *src = bv->data;
      float *dst = t->data;
      int64_t plane = s.d[2] * s.d[3];
      for (int64_t nc = 0; nc < s.d[0] * s.d[1]; nc++)
        for (int64_t k = 0; k < plane; k++) dst[nc * plane + k] = src[nc % s.d[1]];
      int bid = graph_add_const(g, g->nodes[b.node].name, t, d);
      if (bid < 0) return bid;
      int add = graph_add_node(g, OP_EWADD, (TensorRef[]){cur, {bid, 0}}, 2, 1, NULL, NULL, d);
      if (add < 0) return add;
      cur = (TensorRef){add, 0};
    }
    if (z.node >= 0) {
      int add = graph_add_node(g, OP_EWADD, (TensorRef[]){cur, z}, 2, 1, NULL, NULL, d);
      if (add < 0) return add;
      cur = (TensorRef){add, 0};
    }
    if (act != ACT_NONE) {
      Params ap;
      act_op_params((int)act, &ap);
      int a = graph_add_node(g, act_op_kind((int)act), &cur, 1, 1, &ap, NULL, d);
      if (a < 0) return a;
      cur = (TensorRef){a, 0};
    }
    graph_replace_uses(g, (TensorRef){id, 0}, cur);
    split++;
  }
  if (rc == TEQ_OK) {
    int r = graph_remove_dead(g);
    if (r < 0) rc = r;
  }
  if (n_split) *n_split = split;
  return rc;
}

static bool per_channel(const Tensor *t, const Shape *out, float *vals) {
  if (t->dtype != DT_F32 || out->ndim != 4) return false;
  const Shape *s = &t->shape;
  int64_t C = out->d[1], plane = out->d[2] * out->d[3];
  const float *x = t->data;
  if (shape_equal(s, out)) {
    for (int64_t nc = 0; nc < out->d[0] * C; nc++)
      for (int64_t k = 0; k < plane; k++)
        if (x[nc * plane + k] != x[(nc % C) * plane]) return false;
    if (vals)
      for (int64_t c = 0; c < C; c++) vals[c] = x[c * plane];
    return true;
  }
  if (tensor_numel(t) != C || s->ndim < 3 || s->ndim > 4) return false;
  for (int k = 0; k < s->ndim; k++)
    if (s->d[k] != (s->ndim - k == 3 ? C : 1)) return false;
  if (vals) memcpy(vals, x, (size_t)C * sizeof *vals);
  return true;
}

/* ---- verdicts remembered ---- */

/* Whether a constant is a per-channel bias for an output shape, and its
 * values: a bias spread over a whole activation (opt_split_bias) is
 * megabytes to compare, and the search prices, and its windows finish,
 * graph after graph holding the same spread biases. Inception-v3's
 * finishes spent 5% of optimize's run comparing them again. A slot holds a
 * reference, so that no other tensor takes the address meanwhile. */
typedef struct ChannelSlot {
  Tensor *t; /* NULL: empty */
  Shape out;
  bool ok;
  float *vals; /* out's C values when ok; NULL until asked for */
} ChannelSlot;

struct OptChannels {
  ChannelSlot *slot;
  size_t cap, n; /* cap a power of two, at least twice n */
};

OptChannels *opt_channels_new(void) { return calloc(1, sizeof(OptChannels)); }

void opt_channels_free(OptChannels *m) {
  if (!m) return;
  for (size_t i = 0; i < m->cap; i++) {
    tensor_unref(m->slot[i].t);
    free(m->slot[i].vals);
  }
  free(m->slot);
  free(m);
}

static size_t slot_of(const OptChannels *m, const Tensor *t) {
  return hash_mix(0xb1a5, (uint64_t)(uintptr_t)t) & (m->cap - 1);
}

/* Room for one more slot; false when memory runs out. */
static bool channels_room(OptChannels *m) {
  if (2 * (m->n + 1) <= m->cap) return true;
  OptChannels bigger = {.cap = m->cap ? 2 * m->cap : 64, .n = m->n};
  if (!(bigger.slot = calloc(bigger.cap, sizeof *bigger.slot))) return false;
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->slot[i].t) continue;
    size_t j = slot_of(&bigger, m->slot[i].t);
    while (bigger.slot[j].t) j = (j + 1) & (bigger.cap - 1);
    bigger.slot[j] = m->slot[i];
  }
  free(m->slot);
  *m = bigger;
  return true;
}

bool opt_bias_per_channel(OptChannels *m, Tensor *t, const Shape *out, float *vals) {
  if (!m || !channels_room(m)) return per_channel(t, out, vals);
  size_t i = slot_of(m, t);
  for (; m->slot[i].t; i = (i + 1) & (m->cap - 1))
    if (m->slot[i].t == t && shape_equal(&m->slot[i].out, out)) break;
  ChannelSlot *s = &m->slot[i];
  if (!s->t) {
    *s = (ChannelSlot){.t = tensor_ref(t), .out = *out, .ok = per_channel(t, out, NULL)};
    m->n++;
  }
  if (!s->ok || !vals) return s->ok;
  size_t bytes = (size_t)out->d[1] * sizeof *vals;
  if (!s->vals && (s->vals = malloc(bytes))) per_channel(t, out, s->vals);
  if (!s->vals) return per_channel(t, out, vals);
  memcpy(vals, s->vals, bytes);
  return true;
}

bool opt_is_channel_concat(const Node *n) {
  if (n->kind != OP_CONCAT || n->n_out != 1 || n->out[0].ndim != 4 || n->n_in < 1) return false;
  int64_t axis = n->params.v[param_index(OP_CONCAT, "axis")].i[0];
  return axis == 1 || axis == 1 - n->out[0].ndim;
}

bool opt_bias_keeps_channels(const Node *n, const Shape *in) {
  const Shape *out = &n->out[0];
  if (n->n_out != 1 || out->ndim != 4 || n->opaque) return false;
  if (n->kind == OP_CONCAT) return opt_is_channel_concat(n);
  unsigned f = op_def(n->kind)->flags;
  if (!(f & OPF_ELEMENTWISE) || (f & (OPF_SOURCE | OPF_INT64_OUT))) return false;
  for (int j = 0; j < n->n_in; j++)
    if (!shape_equal(&in[j], out)) return false; /* a broadcast mixes channels' values */
  return true;
}

/* opt_bias_value_per_channel below depth levels of weights. */
static bool value_per_channel(OptChannels *m, const Graph *g, TensorRef r, const Shape *out,
                              float *vals, int depth) {
  const Node *n = &g->nodes[r.node];
  if (n->kind == OP_CONST) return opt_bias_per_channel(m, n->value, out, vals);
  if (depth == 0 || n->n_in > OPT_BIAS_MAX_IN || !shape_equal(&n->out[r.out], out))
    return false;
  Shape in[OPT_BIAS_MAX_IN];
  for (int j = 0; j < n->n_in; j++) in[j] = g->nodes[n->in[j].node].out[n->in[j].out];
  if (!opt_bias_keeps_channels(n, in)) return false;
  if (n->kind == OP_CONCAT) {
    for (int j = 0, c = 0; j < n->n_in; c += (int)in[j].d[1], j++)
      if (!value_per_channel(m, g, n->in[j], &in[j], vals ? vals + c : NULL, depth - 1))
        return false;
    return true;
  }
  /* An element-wise operator of equal shapes: its kernel run on one value
   * per channel computes what it would at every position. */
  Tensor *x[OPT_BIAS_MAX_IN] = {0}, *y = NULL;
  Shape per = shape_make(4, (int64_t[]){1, out->d[1], 1, 1});
  bool ok = !vals || (y = tensor_new(DT_F32, &per)) != NULL;
  for (int j = 0; j < n->n_in && ok; j++)
    ok = (!vals || (x[j] = tensor_new(DT_F32, &per)) != NULL) &&
         value_per_channel(m, g, n->in[j], &in[j], vals ? x[j]->data : NULL, depth - 1);
  if (ok && vals) {
    Diag quiet;
    diag_init(&quiet);
    ok = op_def(n->kind)->eval_f32(n, x, &y, &quiet) == TEQ_OK;
    diag_fini(&quiet);
    if (ok) memcpy(vals, y->data, (size_t)out->d[1] * sizeof *vals);
  }
  for (int j = 0; j < n->n_in; j++) tensor_unref(x[j]);
  tensor_unref(y);
  return ok;
}

bool opt_bias_value_per_channel(OptChannels *m, const Graph *g, TensorRef r, const Shape *out,
                                float *vals) {
  return value_per_channel(m, g, r, out, vals, OPT_BIAS_DEPTH);
}

/* Whether concat id of g (axis 1) reads convolutions alone, each without
 * an activation (and, if bare, without a bias) and read by it alone (user:
 * each node's only consumer, -1 for none or several). */
static bool concat_of_convs(const Graph *g, int id, const int32_t *user, bool bare) {
  const Node *cat = &g->nodes[id];
  int act_i = param_index(OP_CONV2D, "act");
  if (!opt_is_channel_concat(cat)) return false;
  for (int j = 0; j < cat->n_in; j++) {
    const Node *c = &g->nodes[cat->in[j].node];
    if (c->kind != OP_CONV2D || cat->in[j].out != 0 || user[cat->in[j].node] != id ||
        c->params.v[act_i].i[0] != ACT_NONE || op_output_pooled(c) || (bare && c->n_in != 2))
      return false;
  }
  return true;
}

/* Concat id (axis 1) of convolutions, each read by it alone, whose only
 * consumer u adds a per-channel bias or applies an activation: the bias
 * is split among the convolutions, or the activation fused into each, and
 * u's uses read the concat's result instead. The same arithmetic: the
 * bias of each channel is added to each finished sum, the activation
 * applied to each value, either way. A rule that moves relus, then
 * biases, out of the concat of two convolutions on one input (SqueezeNet's
 * fires) is the first step towards merging them; priced without this, each
 * step cost a kernel, and the search rarely crossed the valley. A bias
 * makes new convolutions and a new concat, appended as every refolded
 * convolution is; an activation is set in place (the order delta.c sums
 * costs in follows from this). n: nodes as the pass started (user's
 * extent); an input added since waits for the next pass. 1 when done, 0
 * when it does not apply, or an error. */
static int push_through_concat(Graph *g, OptChannels *m, int id, int n, const int32_t *user,
                               int *fused, Diag *d) {
  int act_i = param_index(OP_CONV2D, "act");
  int u = user[id];
  if (u < 0) return 0;
  const Node *un = &g->nodes[u];
  int act = act_of_node(un);
  bool bias = un->kind == OP_EWADD;
  if (!bias && act == ACT_NONE) return 0;
  for (int j = 0; j < g->nodes[id].n_in; j++)
    if (g->nodes[id].in[j].node >= n) return 0;
  if (!concat_of_convs(g, id, user, bias)) return 0;
  int n_in = g->nodes[id].n_in;
  if (!bias) {
    for (int j = 0; j < n_in; j++) g->nodes[g->nodes[id].in[j].node].params.v[act_i].i[0] = act;
    graph_replace_uses(g, (TensorRef){u, 0}, (TensorRef){id, 0});
    *fused += n_in;
    return 1;
  }
  const Shape out = g->nodes[id].out[0];
  TensorRef other = un->in[0].node == id ? un->in[1] : un->in[0];
  if (other.node == id) return 0;
  float *vals = malloc((size_t)out.d[1] * sizeof *vals);
  if (!vals) return TEQ_ERR_NOMEM;
  if (!opt_bias_value_per_channel(m, g, other, &out, vals)) {
    free(vals);
    return 0;
  }
  int rc = TEQ_OK;
  TensorRef *parts = malloc((size_t)n_in * sizeof *parts);
  if (!parts) rc = TEQ_ERR_NOMEM;
  int64_t at = 0;
  for (int j = 0; j < n_in && rc == TEQ_OK; j++) {
    int cid = g->nodes[id].in[j].node;
    const Node *c = &g->nodes[cid];
    TensorRef in[3] = {c->in[0], c->in[1], {-1, 0}};
    Params p = c->params;
    int64_t channels = c->out[0].d[1];
    Shape flat = shape_of(1, (int)channels);
    Tensor *t = tensor_new(DT_F32, &flat);
    if (!t) {
      rc = TEQ_ERR_NOMEM;
      break;
    }
    memcpy(t->data, vals + at, (size_t)channels * sizeof *vals);
    at += channels;
    int bid = graph_add_const(g, g->nodes[u].name, t, d);
    if (bid < 0) {
      rc = bid;
      break;
    }
    in[2] = (TensorRef){bid, 0};
    int nid = graph_add_node(g, OP_CONV2D, in, 3, 1, &p, g->nodes[cid].name, d);
    if (nid < 0) rc = nid;
    else parts[j] = (TensorRef){nid, 0};
  }
  if (rc == TEQ_OK) {
    Params cp = g->nodes[id].params;
    int nc = graph_add_node(g, OP_CONCAT, parts, n_in, 1, &cp, g->nodes[id].name, d);
    if (nc < 0) rc = nc;
    else graph_replace_uses(g, (TensorRef){u, 0}, (TensorRef){nc, 0});
  }
  free(parts);
  free(vals);
  if (rc) return rc;
  *fused += n_in;
  return 1;
}

int opt_fuse_bias(Graph *g, int *n_fused, Diag *d) {
  return opt_fuse_bias_with(g, NULL, n_fused, d);
}

int opt_fuse_bias_with(Graph *g, OptChannels *m, int *n_fused, Diag *d) {
  int act_i = param_index(OP_CONV2D, "act"), fused = 0;
  for (bool again = true; again;) {
    again = false;
    /* Consumers as the pass starts: a fused conv is added at the end and
     * taken up by the next pass, which recomputes them. */
    int n = g->n_nodes;
    int32_t *user = graph_only_readers(g);
    if (!user) return TEQ_ERR_NOMEM;
    for (int id = 0; id < n; id++) {
      const Node *c = &g->nodes[id];
      if (c->kind == OP_CONCAT) {
        int r = push_through_concat(g, m, id, n, user, &fused, d);
        if (r < 0) {
          free(user);
          return r;
        }
        again |= r > 0;
        continue;
      }
      if (c->kind != OP_CONV2D || c->params.v[act_i].i[0] != ACT_NONE || c->n_in > 3 ||
          op_output_pooled(c))
        continue;
      int u = user[id];
      if (u < 0) continue;
      const Node *un = &g->nodes[u];
      TensorRef in[3] = {c->in[0], c->in[1], {-1, 0}};
      Params p = c->params;
      int n_in = c->n_in;
      if (un->kind == OP_EWADD && n_in == 2) {
        TensorRef other = un->in[0].node == id ? un->in[1] : un->in[0];
        const Node *bn = &g->nodes[other.node];
        if (other.node == id || c->out[0].ndim != 4) continue;
        Shape flat = shape_of(1, (int)c->out[0].d[1]);
        Tensor *t = tensor_new(DT_F32, &flat);
        if (!t) {
          free(user);
          return TEQ_ERR_NOMEM;
        }
        if (!opt_bias_value_per_channel(m, g, other, &c->out[0], t->data)) {
          tensor_unref(t);
          continue;
        }
        int bid = graph_add_const(g, bn->name, t, d);
        if (bid < 0) {
          free(user);
          return bid;
        }
        in[2] = (TensorRef){bid, 0};
        n_in = 3;
      } else if (act_of_node(un) != ACT_NONE) {
        p.v[act_i].i[0] = act_of_node(un);
        if (n_in == 3) in[2] = g->nodes[id].in[2];
      } else {
        continue;
      }
      int nid = graph_add_node(g, OP_CONV2D, in, n_in, 1, &p, g->nodes[id].name, d);
      if (nid < 0) {
        free(user);
        return nid;
      }
      graph_replace_uses(g, (TensorRef){u, 0}, (TensorRef){nid, 0});
      fused++;
      again = true;
    }
    free(user);
    if (again) {
      int r = graph_remove_dead(g);
      if (r < 0) return r;
    }
  }
  if (n_fused) *n_fused = fused;
  return TEQ_OK;
}
