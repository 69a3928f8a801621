/* gather.c: chains of layout operators run as one copy of rows (plan.h:
 * plan_gathers). Which layout nodes form chains is decided to a fixed
 * point: every layout node starts in one, and an exit that cannot be
 * gathered leaves, which makes its layout inputs exits in turn. Where each
 * element of an exit comes from is followed back through the chain, node
 * by node, by views' offsets and by each node's element maps
 * (exec_layout_maps), to a source value or a zero; the rows are the
 * longest equal blocks of the output that each stay a run of one source. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec.h"
#include "runtime/ops.h"
#include "runtime/plan.h"

/* Rows shorter than this many elements are not gathered: a warp would read
 * a few floats from each of many places. */
enum { GATHER_MIN_ROW = 16 };

void plan_gathers_fini(PlanGathers *pg) {
  for (int i = 0; i < pg->n_exits; i++) {
    free(pg->exits[i].slot);
    free(pg->exits[i].elem);
    free(pg->exits[i].sources);
  }
  free(pg->exits);
  free(pg->role);
  free(pg->exit);
  memset(pg, 0, sizeof *pg);
}

void plan_gather_pointers(const GatherRows *r, const void *const *slot_at, const float **rows) {
  for (int64_t i = 0; i < r->n_rows; i++)
    rows[i] = r->slot[i] < 0 ? NULL : (const float *)slot_at[r->slot[i]] + r->elem[i];
}

/* How a node of a chain moves its elements, learned once per analysis. */
typedef struct Moves {
  int state;      /* 0 not asked, 1 a view (first), 2 maps, -1 neither: it leaves chains */
  int64_t *first; /* a view: each output's first element in input 0 */
  int64_t *base;  /* maps: exec_layout_maps' bases */
  Tensor **maps;
} Moves;

typedef struct Ctx {
  const Graph *g;
  const GraphStrided *st;
  int32_t *rstart, *readers; /* readers of node i: readers[rstart[i] .. rstart[i + 1]) */
  uint8_t *output;           /* per node: one of its values is a graph output */
  uint8_t *grouped;          /* per node: in a chain (inside it or its exit) */
  uint8_t *inner;
  Moves *moves;
  int32_t *home;             /* graph_piece_homes */
  int *kernels;              /* per exit: chain_work's kernels */
  int32_t *mark;             /* per node: the walk that last visited it */
  int32_t *pos;              /* per node: its place in chain_key's walk */
  int32_t epoch;
  int32_t *stack;
  Diag *d;
} Ctx;

/* A layout node a chain may hold: it computes nothing, runs no kernel by
 * strides already, and moves float32 values. */
static bool may_chain(const Ctx *c, int id) {
  const Graph *g = c->g;
  const Node *n = &g->nodes[id];
  unsigned f = op_def(n->kind)->flags;
  if (!(f & OPF_LAYOUT_ONLY) || (f & (OPF_SOURCE | OPF_OPAQUE | OPF_NOOP)) ||
      n->dtype == DT_I64 || n->n_out < 1 || n->n_in < 1 || c->st->strided[id])
    return false;
  for (int j = 0; j < n->n_in; j++)
    if (g->nodes[n->in[j].node].dtype == DT_I64) return false;
  return true;
}

/* Learns how node id moves its elements; false when it cannot be said
 * (the node then leaves chains), an error in *rc. */
static bool learn_moves(Ctx *c, int id, int *rc) {
  Moves *m = &c->moves[id];
  if (m->state) return m->state > 0;
  const Node *n = &c->g->nodes[id];
  m->first = malloc(((size_t)n->n_out + 1) * sizeof *m->first);
  if (!m->first) return *rc = TEQ_ERR_NOMEM, false;
  if (graph_node_is_view(c->g, id, m->first)) return m->state = 1, true;
  m->base = malloc(((size_t)n->n_in + 1) * sizeof *m->base);
  m->maps = calloc((size_t)n->n_out + 1, sizeof *m->maps);
  if (!m->base || !m->maps) return *rc = TEQ_ERR_NOMEM, false;
  int v = exec_layout_maps(c->g, id, m->base, m->maps, c->d);
  if (v < 0) return *rc = v, false;
  m->state = v == 1 ? 2 : -1;
  return v == 1;
}

static void moves_fini(Moves *m, int n_out) {
  for (int k = 0; m->maps && k < n_out; k++) tensor_unref(m->maps[k]);
  free(m->maps);
  free(m->base);
  free(m->first);
}

/* Inside a chain: grouped, no graph output, every reader grouped. */
static void find_inner(Ctx *c) {
  for (int id = 0; id < c->g->n_nodes; id++) {
    bool in = c->grouped[id] && !c->output[id];
    for (int k = c->rstart[id]; in && k < c->rstart[id + 1]; k++) in = c->grouped[c->readers[k]];
    c->inner[id] = in;
  }
}

/* What exit e's chain runs as it is: *kernels, the kernels of e and of
 * the nodes inside the chain that e reads through (views and concats
 * written in place run none), and *written, the elements those kernels write. */
static void chain_work(Ctx *c, int e, int *kernels, int64_t *written) {
  int top = 0;
  *kernels = 0, *written = 0;
  c->epoch++;
  c->stack[top++] = e;
  c->mark[e] = c->epoch;
  while (top) {
    int id = c->stack[--top];
    const Node *n = &c->g->nodes[id];
    if (!graph_node_is_view(c->g, id, NULL) && !graph_node_in_place(c->g, id, c->home, NULL, NULL)) {
      ++*kernels;
      for (int k = 0; k < n->n_out; k++) *written += shape_numel(&n->out[k]);
    }
    for (int j = 0; j < n->n_in; j++) {
      int p = n->in[j].node;
      if (c->inner[p] && c->mark[p] != c->epoch) c->mark[p] = c->epoch, c->stack[top++] = p;
    }
  }
}

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b, b = t;
  }
  return a;
}

/* Follows every element of exit e back to its source: slot[f] and
 * elem[f], slot -1 for a zero, and *len, the longest rows: every element
 * that does not carry on its predecessor's run (the same source, the
 * next element; or zeros after zeros) starts a row, so rows are as long
 * as the greatest common divisor of those elements' positions and the
 * total. Returns 1; 0 once the rows are too short, or with *leave set to
 * a node of the chain whose moves cannot be said; or an error. */
static int follow_chain(Ctx *c, int e, int32_t *slot, int64_t *elem, int64_t *len, int *leave) {
  const Graph *g = c->g;
  int64_t numel = shape_numel(&g->nodes[e].out[0]);
  int rc = TEQ_OK;
  *len = numel;
  for (int64_t f = 0; f < numel; f++) {
    TensorRef r = {e, 0};
    int64_t x = f;
    for (;;) {
      int id = r.node;
      if (id != e && !c->inner[id]) {
        slot[f] = c->st->offset[id] + r.out, elem[f] = x;
        break;
      }
      if (!learn_moves(c, id, &rc)) {
        *leave = id;
        return rc ? rc : 0;
      }
      const Moves *m = &c->moves[id];
      const Node *n = &g->nodes[id];
      if (m->state == 1) {
        x += m->first[r.out];
        r = n->in[0];
        continue;
      }
      uint32_t v = ((const uint32_t *)m->maps[r.out]->data)[x];
      if (v == 0) {
        slot[f] = -1, elem[f] = 0;
        break;
      }
      int j = 0;
      while (j + 1 < n->n_in && (int64_t)v > m->base[j + 1]) j++;
      x = (int64_t)v - 1 - m->base[j];
      r = n->in[j];
    }
    if (f > 0 && (slot[f] != slot[f - 1] || (slot[f] >= 0 && elem[f] != elem[f - 1] + 1))) {
      *len = gcd64(*len, f);
      if (*len < GATHER_MIN_ROW) return 0;
    }
  }
  return 1;
}

/* ---- rows by chain, for the process ----
 * A search prices thousands of graphs that hold the same chains (Swin-T's
 * cyclic shifts, window by window), and following every element of one
 * costs a walk through the chain per element. A chain is named by its
 * shape: from the exit, each node of it in the order a walk first meets
 * it (its kind, parameters and output shapes, and for each input the
 * node of the chain or the source it is, sources numbered as met, with
 * their shapes); its rows are kept by source number. */
enum { ROWS_CACHE_SLOTS = 512 };
#define ROWS_CACHE_MAX_ROWS ((int64_t)16 << 20)

typedef struct RowsEntry {
  uint64_t hash;
  int64_t *key; /* NULL: empty */
  size_t key_len;
  int verdict;  /* follow_chain's: 1 rows, 0 none */
  int leave;    /* verdict 0: the node that leaves chains, by walk order; -1 the exit */
  int64_t row_len, n_rows;
  int32_t *source; /* per row: its source's number, -1 zeros */
  int64_t *elem;
} RowsEntry;

static struct {
  pthread_mutex_t lock;
  RowsEntry slot[ROWS_CACHE_SLOTS];
  int64_t rows;
} rows_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* A chain's name as a walk from exit e writes it; walk[i] the node met
 * i-th, sources[k] the slot of source k. */
typedef struct ChainKey {
  int64_t *v;
  size_t n, cap;
  int32_t *walk, *sources;
  int n_walk, n_sources;
  uint64_t hash;
} ChainKey;

static bool key_put(ChainKey *k, int64_t x) {
  if (k->n == k->cap) {
    size_t cap = k->cap ? 2 * k->cap : 256;
    int64_t *v = realloc(k->v, cap * sizeof *v);
    if (!v) return false;
    k->v = v, k->cap = cap;
  }
  k->v[k->n++] = x;
  return true;
}

static bool key_shape(ChainKey *k, const Shape *s) {
  bool ok = key_put(k, s->ndim);
  for (int i = 0; i < s->ndim && ok; i++) ok = key_put(k, s->d[i]);
  return ok;
}

static void chain_key_fini(ChainKey *k) {
  free(k->v), free(k->walk), free(k->sources);
  memset(k, 0, sizeof *k);
}

/* The walk is breadth first from e, inputs in order; c->pos holds each
 * node's place in it (valid where c->mark is this walk's epoch). */
static int chain_key(Ctx *c, int e, ChainKey *k) {
  const Graph *g = c->g;
  memset(k, 0, sizeof *k);
  k->walk = malloc(((size_t)g->n_nodes + 1) * sizeof *k->walk);
  k->sources = malloc(((size_t)g->n_nodes + 1) * sizeof *k->sources);
  if (!k->walk || !k->sources) return TEQ_ERR_NOMEM;
  c->epoch++;
  c->mark[e] = c->epoch, c->pos[e] = 0;
  k->walk[k->n_walk++] = e;
  bool ok = true;
  for (int i = 0; i < k->n_walk && ok; i++) {
    const Node *n = &g->nodes[k->walk[i]];
    ok = key_put(k, n->kind) && key_put(k, n->n_in);
    const int64_t *pw = (const int64_t *)&n->params;
    for (size_t w = 0; ok && w < sizeof n->params / sizeof *pw; w++) ok = key_put(k, pw[w]);
    for (int o = 0; ok && o < n->n_out; o++) ok = key_shape(k, &n->out[o]);
    for (int j = 0; ok && j < n->n_in; j++) {
      TensorRef r = n->in[j];
      if (c->inner[r.node]) {
        if (c->mark[r.node] != c->epoch) {
          c->mark[r.node] = c->epoch, c->pos[r.node] = k->n_walk;
          k->walk[k->n_walk++] = r.node;
        }
        ok = key_put(k, 1) && key_put(k, c->pos[r.node]) && key_put(k, r.out);
        continue;
      }
      int slot = c->st->offset[r.node] + r.out, at = 0;
      while (at < k->n_sources && k->sources[at] != slot) at++;
      if (at == k->n_sources) k->sources[k->n_sources++] = slot;
      ok = key_put(k, 2) && key_put(k, at) && key_shape(k, graph_shape(g, r));
    }
  }
  if (!ok) return TEQ_ERR_NOMEM;
  k->hash = hash_bytes(0x726f7773, k->v, k->n * sizeof *k->v);
  return TEQ_OK;
}

static bool rows_entry_is(const RowsEntry *x, const ChainKey *k) {
  return x->key && x->hash == k->hash && x->key_len == k->n &&
         memcmp(x->key, k->v, k->n * sizeof *k->v) == 0;
}

/* The cached answer for k: true with out (rows by slot) or *verdict 0 and
 * *leave filled. */
static bool rows_cached(const ChainKey *k, int e, GatherRows *out, int *verdict, int *leave) {
  RowsEntry *x = &rows_cache.slot[k->hash % ROWS_CACHE_SLOTS];
  bool hit = false;
  pthread_mutex_lock(&rows_cache.lock);
  if (rows_entry_is(x, k)) {
    hit = true;
    *verdict = x->verdict;
    if (x->verdict == 0) {
      *leave = x->leave < 0 ? -1 : k->walk[x->leave];
    } else {
      memset(out, 0, sizeof *out);
      out->node = e, out->row_len = x->row_len, out->n_rows = x->n_rows;
      out->slot = malloc((size_t)x->n_rows * sizeof *out->slot);
      out->elem = malloc((size_t)x->n_rows * sizeof *out->elem);
      if (out->slot && out->elem) {
        for (int64_t i = 0; i < x->n_rows; i++)
          out->slot[i] = x->source[i] < 0 ? -1 : k->sources[x->source[i]];
        memcpy(out->elem, x->elem, (size_t)x->n_rows * sizeof *out->elem);
      } else {
        free(out->slot), free(out->elem);
        out->slot = NULL, out->elem = NULL;
        *verdict = TEQ_ERR_NOMEM;
      }
    }
  }
  pthread_mutex_unlock(&rows_cache.lock);
  return hit;
}

/* Keeps an answer (verdict, leave, or r's rows) for k, where it fits. */
static void rows_keep(const ChainKey *k, int verdict, int leave, const GatherRows *r) {
  int64_t *key = malloc(k->n * sizeof *key);
  int64_t n_rows = verdict == 1 ? r->n_rows : 0;
  int32_t *source = malloc(((size_t)n_rows + 1) * sizeof *source);
  int64_t *elem = malloc(((size_t)n_rows + 1) * sizeof *elem);
  int at = -1;
  for (int i = 0; leave >= 0 && i < k->n_walk && at < 0; i++)
    if (k->walk[i] == leave) at = i;
  if (!key || !source || !elem) {
    free(key), free(source), free(elem);
    return;
  }
  memcpy(key, k->v, k->n * sizeof *key);
  for (int64_t i = 0; i < n_rows; i++) {
    int s = 0;
    while (r->slot[i] >= 0 && s + 1 < k->n_sources && k->sources[s] != r->slot[i]) s++;
    source[i] = r->slot[i] < 0 ? -1 : s;
    elem[i] = r->elem[i];
  }
  RowsEntry gone = {0};
  pthread_mutex_lock(&rows_cache.lock);
  RowsEntry *x = &rows_cache.slot[k->hash % ROWS_CACHE_SLOTS];
  if (x->key) gone = *x, rows_cache.rows -= x->n_rows;
  memset(x, 0, sizeof *x);
  if (rows_cache.rows + n_rows <= ROWS_CACHE_MAX_ROWS) {
    *x = (RowsEntry){k->hash, key, k->n, verdict, at, verdict == 1 ? r->row_len : 0, n_rows,
                     source, elem};
    rows_cache.rows += n_rows;
    key = NULL, source = NULL, elem = NULL;
  }
  pthread_mutex_unlock(&rows_cache.lock);
  free(gone.key), free(gone.source), free(gone.elem);
  free(key), free(source), free(elem);
}

/* Exit e's rows, where they are long enough: 1 with *out filled, 0 when
 * e stays as it was (or *leave names a node that leaves chains), or an
 * error. */
static int follow_rows(Ctx *c, int e, GatherRows *out, int *leave) {
  const Shape *s = &c->g->nodes[e].out[0];
  int64_t numel = shape_numel(s);
  if (numel < 1) return 0;
  int32_t *slot = malloc((size_t)numel * sizeof *slot);
  int64_t *elem = malloc((size_t)numel * sizeof *elem);
  if (!slot || !elem) {
    free(slot), free(elem);
    return TEQ_ERR_NOMEM;
  }
  int64_t len = 1;
  int rc = follow_chain(c, e, slot, elem, &len, leave);
  if (rc == 1) {
    memset(out, 0, sizeof *out);
    out->node = e, out->row_len = len, out->n_rows = numel / len;
    out->slot = malloc((size_t)out->n_rows * sizeof *out->slot);
    out->elem = malloc((size_t)out->n_rows * sizeof *out->elem);
    if (!out->slot || !out->elem) {
      free(out->slot), free(out->elem);
      rc = TEQ_ERR_NOMEM;
    }
  }
  for (int64_t r = 0; rc == 1 && r < out->n_rows; r++)
    out->slot[r] = slot[r * len], out->elem[r] = elem[r * len];
  free(slot), free(elem);
  return rc;
}

/* follow_rows, or its answer for a chain of the same shape; then the
 * distinct sources the rows read. */
static int gather_rows(Ctx *c, int e, GatherRows *out, int *leave) {
  ChainKey k;
  int rc = chain_key(c, e, &k), verdict = 0;
  if (rc == TEQ_OK && rows_cached(&k, e, out, &verdict, leave)) {
    rc = verdict;
  } else if (rc == TEQ_OK) {
    rc = follow_rows(c, e, out, leave);
    if (rc >= 0) rows_keep(&k, rc, *leave, out);
  }
  chain_key_fini(&k);
  if (rc == 1 && !(out->sources = malloc(((size_t)out->n_rows + 1) * sizeof *out->sources))) {
    free(out->slot), free(out->elem);
    rc = TEQ_ERR_NOMEM;
  }
  for (int64_t r = 0; rc == 1 && r < out->n_rows; r++) {
    bool seen = out->slot[r] < 0;
    for (int s = 0; s < out->n_sources && !seen; s++) seen = out->sources[s] == out->slot[r];
    if (!seen) out->sources[out->n_sources++] = out->slot[r];
  }
  return rc;
}

int plan_gathers(const Graph *g, const GraphStrided *st, PlanGathers *pg, Diag *d) {
  memset(pg, 0, sizeof *pg);
  int nn = g->n_nodes;
  Ctx c = {.g = g, .st = st, .d = d};
  pg->role = calloc((size_t)nn + 1, 1);
  pg->exit = malloc(((size_t)nn + 1) * sizeof *pg->exit);
  c.output = calloc((size_t)nn + 1, 1);
  c.grouped = calloc((size_t)nn + 1, 1);
  c.inner = calloc((size_t)nn + 1, 1);
  c.moves = calloc((size_t)nn + 1, sizeof *c.moves);
  c.mark = malloc(((size_t)nn + 1) * sizeof *c.mark);
  c.stack = malloc(((size_t)nn + 1) * sizeof *c.stack);
  c.pos = malloc(((size_t)nn + 1) * sizeof *c.pos);
  c.kernels = calloc((size_t)nn + 1, sizeof *c.kernels);
  c.home = graph_piece_homes(g);
  int rc = pg->role && pg->exit && c.output && c.grouped && c.inner && c.moves && c.mark &&
                   c.stack && c.pos && c.kernels && c.home
               ? TEQ_OK
               : TEQ_ERR_NOMEM;
  if (rc == TEQ_OK) rc = graph_readers(g, &c.rstart, &c.readers);
  const char *off = getenv("TEQ_NO_GATHERS");
  bool none = off && *off && strcmp(off, "0") != 0;
  for (int id = 0; rc == TEQ_OK && id < nn; id++) {
    pg->exit[id] = -1, c.mark[id] = 0;
    c.grouped[id] = !none && may_chain(&c, id);
  }
  for (int i = 0; rc == TEQ_OK && i < g->n_outputs; i++) c.output[g->outputs[i].node] = 1;
  /* To a fixed point: an exit that cannot be gathered leaves, and so its
   * layout inputs become exits. The cheap test first, for all exits; the
   * rows only once no exit fails it. */
  GatherRows *exits = NULL;
  int n_exits = 0;
  for (bool changed = true; rc == TEQ_OK && changed;) {
    changed = false;
    find_inner(&c);
    for (int id = 0; id < nn; id++) {
      if (!c.grouped[id] || c.inner[id]) continue;
      /* Worth a gather: it runs fewer kernels and writes no more. */
      int64_t written = 0;
      if (g->nodes[id].n_out == 1) chain_work(&c, id, &c.kernels[id], &written);
      if (g->nodes[id].n_out != 1 || c.kernels[id] < 2 ||
          written < shape_numel(&g->nodes[id].out[0]))
        c.grouped[id] = 0, changed = true;
    }
    if (changed) continue;
    for (int i = 0; i < n_exits; i++) free(exits[i].slot), free(exits[i].elem), free(exits[i].sources);
    n_exits = 0;
    free(exits);
    exits = malloc(((size_t)nn + 1) * sizeof *exits);
    if (!exits) {
      rc = TEQ_ERR_NOMEM;
      break;
    }
    for (int id = 0; id < nn && rc == TEQ_OK; id++) {
      if (!c.grouped[id] || c.inner[id]) continue;
      int leave = -1, r = gather_rows(&c, id, &exits[n_exits], &leave);
      if (r < 0) rc = r;
      else if (r == 1) exits[n_exits].kernels = c.kernels[id], n_exits++;
      else c.grouped[leave >= 0 ? leave : id] = 0, changed = true;
    }
  }
  if (rc == TEQ_OK) {
    pg->exits = exits, pg->n_exits = n_exits, exits = NULL;
    for (int i = 0; i < pg->n_exits; i++) {
      pg->role[pg->exits[i].node] = GATHER_EXIT;
      pg->exit[pg->exits[i].node] = i;
    }
    for (int id = 0; id < nn; id++)
      if (c.inner[id]) pg->role[id] = GATHER_INNER;
  }
  for (int i = 0; exits && i < n_exits; i++)
    free(exits[i].slot), free(exits[i].elem), free(exits[i].sources);
  free(exits);
  for (int id = 0; c.moves && id < nn; id++) moves_fini(&c.moves[id], g->nodes[id].n_out);
  free(c.moves);
  free(c.rstart), free(c.readers), free(c.output), free(c.grouped), free(c.inner);
  free(c.mark), free(c.stack), free(c.pos), free(c.kernels), free(c.home);
  if (rc == TEQ_ERR_NOMEM) diag_error(d, "out of memory gathering layout chains");
  if (rc) plan_gathers_fini(pg);
  return rc;
}
