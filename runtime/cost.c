/* cost.c: the cost model (see cost.h): configuration keys, the table of
 * measurements by key, the profiler as the source of last resort before
 * the roofline, and the roofline itself. */
#include "runtime/cost.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/plan.h"

/* A measurement from the table, kept by its size: the analytic estimate of
 * a configuration never measured is corrected by the measured/analytic
 * ratio of the nearest measured configurations of the same operator. */
typedef struct CostAnchor {
  OpKind kind, family;    /* family: the cost family whose neighbours it is */
  int arity;              /* inputs and outputs: a 6-way concat is no 2-way one */
  double flops, bytes, us;
  double log_flops, log_bytes; /* log(x + 1): the neighbours' distance, taken once */
  Graph *g;               /* the operator rebuilt from its key, for the bounds */
  int node;
  uint64_t part_key;      /* part_key of the node: no does_part_of either way without it */
} CostAnchor;

/* The anchors in two orders, so that an estimate reads only those that can
 * matter to it (the H100's table holds 12,378; an estimate was a pass over
 * all of them, twice): by_family[family_start[f] ..
 * family_start[f + 1]) are family f's, and by_part holds every anchor
 * ordered by kind and part key. Both keep the table's order among equals,
 * which is the order the estimates' ties were always broken in. Rebuilt
 * whenever a table is loaded (empty before); a rebuild out of memory keeps
 * the anchors indexed before, which the appended ones follow. */
typedef struct AnchorIndex {
  int *by_family, *by_part;
  int family_start[OP__COUNT + 1];
  int n; /* the anchors indexed */
} AnchorIndex;

typedef struct CostEntry {
  char *key;
  double us;
  CostSource source;
  bool recorded;           /* written to the record file already */
  struct CostEntry *next;  /* hash chain */
} CostEntry;

/* A configuration's entry found by its bytes (CostConfig), so that a
 * node seen before is priced without formatting its key: the search and
 * the passes after it price the same few hundred configurations over and
 * over (NasNet-A at 4 times its cells: a third of optimize's time was
 * snprintf). */
typedef struct ConfigSlot {
  uint64_t hash;
  size_t len;
  CostConfig *key; /* NULL: empty */
  CostEntry *e;
} ConfigSlot;

struct CostModel {
  CostEntry **buckets;
  size_t n_buckets, n_entries;
  ConfigSlot *configs;
  size_t configs_cap, n_configs;
  CostCalib calib;
  char device[256];
  CudaDevice *gpu;
  FILE *record;
  CostAnchor *anchors;
  int n_anchors, cap_anchors;
  AnchorIndex index;
};

/* H100 SXM figures: 67 TFLOP/s float32 (non-tensor), 3.35 TB/s; the
 * efficiencies are what a tuned library reaches on large operands, until a
 * table's calibration replaces them. */
static void calib_defaults(CostCalib *c) {
  memset(c, 0, sizeof *c);
  c->peak_gflops = 66900;
  c->mem_gbps = 3350;
  c->launch_us = 2.5;
  for (int k = 0; k < OP__COUNT; k++) {
    c->flop_eff[k] = op_def((OpKind)k)->flops ? 0.6 : 0.05;
    c->byte_eff[k] = 0.7;
  }
}

CostModel *cost_model_new(void) {
  CostModel *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->n_buckets = 1024;
  m->buckets = calloc(m->n_buckets, sizeof *m->buckets);
  if (!m->buckets) {
    free(m);
    return NULL;
  }
  calib_defaults(&m->calib);
  return m;
}

void cost_model_free(CostModel *m) {
  if (!m) return;
  for (size_t b = 0; b < m->n_buckets; b++)
    for (CostEntry *e = m->buckets[b], *next; e; e = next) {
      next = e->next;
      free(e->key);
      free(e);
    }
  free(m->buckets);
  for (size_t i = 0; i < m->configs_cap; i++) free(m->configs[i].key);
  free(m->configs);
  for (int i = 0; i < m->n_anchors; i++) graph_free(m->anchors[i].g);
  free(m->anchors);
  free(m->index.by_family);
  free(m->index.by_part);
  free(m);
}

void cost_model_use_gpu(CostModel *m, CudaDevice *dev) {
  m->gpu = dev;
  if (dev && !m->device[0]) snprintf(m->device, sizeof m->device, "%s", cuda_device_name(dev));
}
void cost_model_record(CostModel *m, FILE *f) { m->record = f; }
const CostCalib *cost_model_calib(const CostModel *m) { return &m->calib; }
void cost_model_set_calib(CostModel *m, const CostCalib *c) { m->calib = *c; }
const char *cost_model_device(const CostModel *m) { return m->device; }
int cost_model_size(const CostModel *m) { return (int)m->n_entries; }

const char *cost_source_name(CostSource s) {
  static const char *const names[] = {"measured", "table", "twin", "analytic"};
  return s < COST__SOURCES ? names[s] : "?";
}

/* ---- the table by key ---- */

static size_t bucket_of(const CostModel *m, const char *key) {
  return (size_t)(hash_bytes(0xc057, key, strlen(key)) % m->n_buckets);
}

static CostEntry *find(const CostModel *m, const char *key) {
  for (CostEntry *e = m->buckets[bucket_of(m, key)]; e; e = e->next)
    if (strcmp(e->key, key) == 0) return e;
  return NULL;
}

static int grow(CostModel *m) {
  size_t nb = m->n_buckets * 4;
  CostEntry **b = calloc(nb, sizeof *b);
  if (!b) return TEQ_ERR_NOMEM;
  for (size_t i = 0; i < m->n_buckets; i++)
    for (CostEntry *e = m->buckets[i], *next; e; e = next) {
      next = e->next;
      size_t k = (size_t)(hash_bytes(0xc057, e->key, strlen(e->key)) % nb);
      e->next = b[k];
      b[k] = e;
    }
  free(m->buckets);
  m->buckets = b;
  m->n_buckets = nb;
  return TEQ_OK;
}

static CostEntry *insert(CostModel *m, const char *key, double us, CostSource src) {
  CostEntry *e = find(m, key);
  if (e) {
    e->us = us;
    e->source = src;
    return e;
  }
  if (m->n_entries >= m->n_buckets && grow(m) != TEQ_OK) return NULL;
  e = calloc(1, sizeof *e);
  if (!e || !(e->key = strdup(key))) {
    free(e);
    return NULL;
  }
  e->us = us;
  e->source = src;
  size_t b = bucket_of(m, key);
  e->next = m->buckets[b];
  m->buckets[b] = e;
  m->n_entries++;
  return e;
}

/* ---- keys ---- */

void cost_config_input(CostConfig *k, int j, const Shape *s, DType dt) {
  CostConfigIn *x = &k->in[j];
  memset(x, 0, sizeof *x);
  x->i64 = dt == DT_I64;
  x->ndim = s->ndim;
  for (int i = 0; i < s->ndim && i < TEQ_MAX_DIMS; i++) x->d[i] = s->d[i];
}

size_t cost_config_len(const CostConfig *k) {
  return offsetof(CostConfig, in) + (size_t)k->n_in * sizeof(CostConfigIn);
}

bool cost_config_of(const Graph *g, int id, CostConfig *k) {
  const Node *n = &g->nodes[id];
  if (n->n_in > COST_CONFIG_MAX_IN) return false;
  k->kind = (int32_t)n->kind, k->n_in = n->n_in, k->n_out = n->n_out, k->unused = 0;
  k->params = n->params;
  for (int j = 0; j < n->n_in; j++)
    cost_config_input(k, j, graph_shape(g, n->in[j]), g->nodes[n->in[j].node].dtype);
  return true;
}

/* The slot of configuration k (hash h, len bytes): its entry's, or the
 * empty one it would take, with room made; NULL when memory runs out.
 * Only cost_node fills a slot. */
static ConfigSlot *config_slot(CostModel *m, const CostConfig *k, uint64_t h, size_t len) {
  if (2 * (m->n_configs + 1) > m->configs_cap) {
    size_t cap = m->configs_cap ? 2 * m->configs_cap : 1024;
    ConfigSlot *s = calloc(cap, sizeof *s);
    if (!s) return NULL;
    for (size_t i = 0; i < m->configs_cap; i++) {
      if (!m->configs[i].key) continue;
      size_t j = m->configs[i].hash & (cap - 1);
      while (s[j].key) j = (j + 1) & (cap - 1);
      s[j] = m->configs[i];
    }
    free(m->configs);
    m->configs = s, m->configs_cap = cap;
  }
  size_t i = h & (m->configs_cap - 1);
  while (m->configs[i].key && !(m->configs[i].hash == h && m->configs[i].len == len &&
                                !memcmp(m->configs[i].key, k, len)))
    i = (i + 1) & (m->configs_cap - 1);
  return &m->configs[i];
}

bool cost_config_known(CostModel *m, const CostConfig *k, CostEstimate *out) {
  size_t len = cost_config_len(k);
  const ConfigSlot *slot = config_slot(m, k, hash_bytes(0xc0f1, k, len), len);
  if (!slot || !slot->key || (m->record && !slot->e->recorded)) return false;
  *out = (CostEstimate){slot->e->us, slot->e->source};
  return true;
}

static int format_shape(const Shape *s, DType dt, char *buf, size_t size) {
  size_t n = 0;
#define EMIT(...)                                                                   \
  do {                                                                              \
    int k_ = snprintf(n < size ? buf + n : NULL, n < size ? size - n : 0, __VA_ARGS__); \
    if (k_ > 0) n += (size_t)k_;                                                    \
  } while (0)
  EMIT("%s[", dt == DT_I64 ? "i64" : "");
  for (int i = 0; i < s->ndim; i++) EMIT("%s%lld", i ? "," : "", (long long)s->d[i]);
  EMIT("]");
#undef EMIT
  return (int)n;
}

int cost_config_key(const Graph *g, int id, char *buf, size_t size) {
  const Node *n = &g->nodes[id];
  size_t len = 0;
  int k = snprintf(buf, size, "%s", op_def(n->kind)->name);
  len += (size_t)(k > 0 ? k : 0);
  for (int j = 0; j < n->n_in; j++) {
    const Node *src = &g->nodes[n->in[j].node];
    if (len + 1 < size) buf[len] = ' ', buf[len + 1] = '\0';
    len++;
    len += (size_t)format_shape(graph_shape(g, n->in[j]), src->dtype, len < size ? buf + len : NULL,
                                len < size ? size - len : 0);
  }
  if (n->n_out != 1) { /* outputs, where not one: parameters may leave the count implicit */
    k = snprintf(len < size ? buf + len : NULL, len < size ? size - len : 0, " ->%d", n->n_out);
    len += (size_t)(k > 0 ? k : 0);
  }
  char params[512];
  params_format(n->kind, &n->params, false, params, sizeof params);
  k = snprintf(len < size ? buf + len : NULL, len < size ? size - len : 0, " {%s}", params);
  len += (size_t)(k > 0 ? k : 0);
  return (int)len;
}

int cost_graph_from_key(const char *key, Graph **out, int *node, Diag *d) {
  *out = NULL;
  char name[64];
  size_t nl = strcspn(key, " ");
  if (nl == 0 || nl >= sizeof name) return diag_error(d, "cost key '%s': no operator name", key);
  memcpy(name, key, nl);
  name[nl] = '\0';
  int kind = op_by_name(name);
  if (kind < 0) return diag_error(d, "cost key '%s': unknown operator '%s'", key, name);
  const char *c = key + nl, *brace = strchr(key, '{');
  if (!brace || brace[strlen(brace) - 1] != '}')
    return diag_error(d, "cost key '%s': expected {parameters} at the end", key);
  /* Room for exactly its nodes, a shape each and the operator: every row
   * of a table is kept as an anchor, and a graph's default room (16 nodes)
   * made the H100 table's 12,378 rows 108 MB. */
  int n_shapes = 0;
  for (const char *s = key; s < brace; s++) n_shapes += *s == '[';
  Graph *g = graph_new();
  if (!g || graph_reserve(g, n_shapes + 1) != TEQ_OK) {
    graph_free(g);
    return TEQ_ERR_NOMEM;
  }
  TensorRef refs[64];
  int n_in = 0, n_out = 1, rc = TEQ_OK;
  while (rc == TEQ_OK) {
    while (*c == ' ') c++;
    if (c >= brace) break;
    if (strncmp(c, "->", 2) == 0) {
      char *end;
      long v = strtol(c + 2, &end, 10);
      if (end == c + 2 || v < 1 || v > 1 << 16) rc = diag_error(d, "cost key '%s': bad output count", key);
      n_out = (int)v;
      c = end;
      continue;
    }
    DType dt = DT_F32;
    if (strncmp(c, "i64", 3) == 0) dt = DT_I64, c += 3;
    if (*c != '[' || n_in == 64) {
      rc = diag_error(d, "cost key '%s': expected a shape at '%s'", key, c);
      break;
    }
    c++;
    int64_t dims[TEQ_MAX_DIMS];
    int nd = 0;
    while (*c != ']' && rc == TEQ_OK) {
      char *end;
      errno = 0;
      long long v = strtoll(c, &end, 10);
      if (end == c || errno || v < 0 || nd == TEQ_MAX_DIMS)
        rc = diag_error(d, "cost key '%s': bad shape at '%s'", key, c);
      dims[nd++] = v;
      c = *end == ',' ? end + 1 : end;
    }
    if (rc) break;
    c++;
    Shape s = shape_make(nd, dims);
    char in_name[16];
    snprintf(in_name, sizeof in_name, "x%d", n_in);
    int id;
    if (dt == DT_I64) {
      Tensor *t = tensor_new(DT_I64, &s); /* zeros: a valid index for any axis */
      id = t ? graph_add_const(g, in_name, t, d) : TEQ_ERR_NOMEM;
    } else {
      id = graph_add_input(g, in_name, &s, DT_F32, d);
    }
    if (id < 0) rc = id;
    else refs[n_in++] = (TensorRef){id, 0};
  }
  Params p;
  char ptext[768];
  size_t plen = strlen(brace + 1) - 1;
  if (rc == TEQ_OK && plen >= sizeof ptext) rc = diag_error(d, "cost key '%s': parameters too long", key);
  if (rc == TEQ_OK) {
    memcpy(ptext, brace + 1, plen);
    ptext[plen] = '\0';
    rc = params_parse((OpKind)kind, ptext, &p, d);
  }
  int id = rc == TEQ_OK ? graph_add_node(g, (OpKind)kind, refs, n_in, n_out, &p, "op", d) : rc;
  for (int j = 0; id >= 0 && j < n_out; j++) {
    int r = graph_add_output(g, (TensorRef){id, j}, NULL, d);
    if (r < 0) id = r;
  }
  if (id < 0) {
    graph_free(g);
    return id;
  }
  *out = g;
  *node = id;
  return TEQ_OK;
}

/* ---- the roofline ---- */

static size_t elem_size(const Node *n) { return n->dtype == DT_I64 ? 8 : 4; }

double cost_node_flops(const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  const OpDef *o = op_def(n->kind);
  if (o->flops) {
    Shape in[64];
    for (int j = 0; j < n->n_in && j < 64; j++) in[j] = *graph_shape(g, n->in[j]);
    return o->flops(n, in);
  }
  double f = 0;
  for (int j = 0; j < n->n_out; j++) f += (double)shape_numel(&n->out[j]);
  return f;
}

double cost_node_bytes(const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  double b = 0;
  for (int j = 0; j < n->n_in; j++)
    b += (double)shape_numel(graph_shape(g, n->in[j])) * (double)elem_size(&g->nodes[n->in[j].node]);
  for (int j = 0; j < n->n_out; j++) b += (double)shape_numel(&n->out[j]) * (double)elem_size(n);
  return b;
}

static double roofline(const CostCalib *c, OpKind kind, double flops, double bytes) {
  double flop_us = flops / (c->flop_eff[kind] * c->peak_gflops * 1e3);
  double byte_us = bytes / (c->byte_eff[kind] * c->mem_gbps * 1e3);
  return c->launch_us + fmax(flop_us, byte_us);
}

double cost_analytic(const CostCalib *c, const Graph *g, int id) {
  return roofline(c, g->nodes[id].kind, cost_node_flops(g, id), cost_node_bytes(g, id));
}

/* How many measured neighbours correct an estimate, and how far (in the
 * log of flops and bytes) a neighbour's correction still counts fully. */
enum { ANCHOR_NEIGHBOURS = 3 };
#define ANCHOR_REACH 0.5
#define ANCHOR_ARITY 0.5   /* distance of one more input or output */
#define ANCHOR_KIND 0.5    /* distance of another kind of the same cost family */

/* The kind whose calibration and measurements price `kind`: its cost
 * family's (a gemm is priced among matmuls), or its own. */
static OpKind family_of(OpKind kind) {
  OpKind f = op_def(kind)->cost_family;
  return f ? f : kind;
}

/* The roofline alone misjudges whole regimes of an operator (one fitted
 * efficiency cannot be right for both a GEMV of 1 MB and a GEMM of 64 MB),
 * but its error varies slowly with size. So the estimate is the roofline
 * times the geometric mean of measured/roofline over the nearest measured
 * configurations of the same kind or cost family, each weighted by its
 * closeness; with no such measurement it is the roofline. Within a family
 * every roofline uses the family's calibration, so that the ratios carry
 * over. skip leaves one anchor out (cross-validation). */
/* The kind whose calibration prices `kind`'s rooflines: its family's, unless
 * only its own was ever measured. */
static OpKind calib_kind(const CostCalib *c, OpKind kind) {
  OpKind fam = family_of(kind);
  return fam != kind && !c->fitted[fam] && c->fitted[kind] ? kind : fam;
}

/* An anchor's place in by_part: kind, part key, then the table's order. */
typedef struct PartOrder {
  OpKind kind;
  uint64_t part_key;
  int i;
} PartOrder;

static int part_order_cmp(const void *pa, const void *pb) {
  const PartOrder *a = pa, *b = pb;
  if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1;
  if (a->part_key != b->part_key) return a->part_key < b->part_key ? -1 : 1;
  return (a->i > b->i) - (a->i < b->i);
}

/* Builds m's anchor index anew, once a table is loaded; TEQ_ERR_NOMEM
 * leaves the old one. */
static int index_anchors(CostModel *m) {
  size_t n = (size_t)m->n_anchors;
  PartOrder *order = malloc((n ? n : 1) * sizeof *order);
  int *by_family = malloc((n ? n : 1) * sizeof *by_family);
  int *by_part = malloc((n ? n : 1) * sizeof *by_part);
  if (!order || !by_family || !by_part) {
    free(order);
    free(by_family);
    free(by_part);
    return TEQ_ERR_NOMEM;
  }
  AnchorIndex *x = &m->index;
  free(x->by_family);
  free(x->by_part);
  x->by_family = by_family, x->by_part = by_part, x->n = m->n_anchors;
  int count[OP__COUNT + 1] = {0};
  for (int i = 0; i < m->n_anchors; i++) count[m->anchors[i].family + 1]++;
  for (int f = 0; f < OP__COUNT; f++) count[f + 1] += count[f];
  memcpy(x->family_start, count, sizeof x->family_start);
  for (int i = 0; i < m->n_anchors; i++) x->by_family[count[m->anchors[i].family]++] = i;
  for (int i = 0; i < m->n_anchors; i++)
    order[i] = (PartOrder){m->anchors[i].kind, m->anchors[i].part_key, i};
  qsort(order, n, sizeof *order, part_order_cmp);
  for (int i = 0; i < m->n_anchors; i++) x->by_part[i] = order[i].i;
  free(order);
  return TEQ_OK;
}

/* The first of the anchors of kind and part key in m's by_part, and *end
 * past the last of them. */
static int part_range(const CostModel *m, OpKind kind, uint64_t key, int *end) {
  const AnchorIndex *x = &m->index;
  int lo = 0, hi = x->n;
  while (lo < hi) { /* the first not before (kind, key) */
    int mid = lo + (hi - lo) / 2;
    const CostAnchor *a = &m->anchors[x->by_part[mid]];
    if (a->kind < kind || (a->kind == kind && a->part_key < key)) lo = mid + 1;
    else hi = mid;
  }
  int e = lo;
  while (e < x->n && m->anchors[x->by_part[e]].kind == kind &&
         m->anchors[x->by_part[e]].part_key == key)
    e++;
  *end = e;
  return lo;
}

double cost_anchored(const CostModel *m, OpKind kind, int arity, double flops, double bytes,
                     int skip) {
  const CostCalib *c = &m->calib;
  OpKind fam = calib_kind(c, kind);
  double base = roofline(c, fam, flops, bytes);
  int best[ANCHOR_NEIGHBOURS];
  double dist[ANCHOR_NEIGHBOURS];
  int n_best = 0;
  double lf = log(flops + 1), lb = log(bytes + 1);
  const AnchorIndex *x = &m->index;
  OpKind want = family_of(kind);
  for (int r = x->family_start[want]; r < x->family_start[want + 1]; r++) {
    int i = x->by_family[r];
    const CostAnchor *a = &m->anchors[i];
    if (i == skip) continue;
    double dd = fabs(a->log_flops - lf) + fabs(a->log_bytes - lb) +
                ANCHOR_ARITY * abs(a->arity - arity) + (a->kind != kind ? ANCHOR_KIND : 0);
    int at = n_best < ANCHOR_NEIGHBOURS ? n_best++ : ANCHOR_NEIGHBOURS;
    while (at > 0 && dist[at - 1] > dd) {
      if (at < ANCHOR_NEIGHBOURS) best[at] = best[at - 1], dist[at] = dist[at - 1];
      at--;
    }
    if (at < ANCHOR_NEIGHBOURS) best[at] = i, dist[at] = dd;
  }
  if (n_best == 0) return base;
  double wsum = 0, lsum = 0;
  for (int k = 0; k < n_best; k++) {
    const CostAnchor *a = &m->anchors[best[k]];
    double w = 1.0 / (ANCHOR_REACH + dist[k]);
    lsum += w * log(a->us / roofline(c, fam, a->flops, a->bytes));
    wsum += w;
  }
  return base * exp(lsum / wsum);
}

int cost_model_anchors(const CostModel *m) { return m->n_anchors; }

void cost_model_anchor(const CostModel *m, int i, OpKind *kind, int *arity, double *flops,
                       double *bytes, double *us) {
  const CostAnchor *a = &m->anchors[i];
  *kind = a->kind, *arity = a->arity, *flops = a->flops, *bytes = a->bytes, *us = a->us;
}

/* What does_part_of holds equal between two nodes, either way round: the
 * kind, the outputs, a variadic operator's inputs, and every parameter
 * that neither counts independent parts nor adds work. An estimate
 * compares a node with each measured one of its kind (6,903 convolutions
 * in the H100's table); nodes whose keys differ need no closer look, and
 * that look was 6% of DenseNet-121's optimize. */
static uint64_t part_key(const Node *n) {
  const OpDef *o = op_def(n->kind);
  uint64_t h = hash_mix(hash_mix(0x9a27, (uint64_t)n->kind), (uint64_t)n->n_out);
  if (o->n_in_max < 0) h = hash_mix(h, (uint64_t)n->n_in);
  for (int p = 0; p < o->n_params; p++)
    if (!o->params[p].counts_parts && !o->params[p].adds_work)
      h = hash_bytes(h, &n->params.v[p], sizeof n->params.v[p]);
  return h;
}

/* Keeps a table row as an anchor; a key that does not rebuild is no anchor
 * (its measurement still answers its own configuration). */
static int add_anchor(CostModel *m, const char *key, double us) {
  Graph *g = NULL;
  int node;
  Diag quiet;
  diag_init(&quiet);
  int rc = cost_graph_from_key(key, &g, &node, &quiet);
  diag_fini(&quiet);
  if (rc != TEQ_OK || us <= 0) return rc == TEQ_ERR_NOMEM ? rc : TEQ_OK;
  if (m->n_anchors == m->cap_anchors) {
    int cap = m->cap_anchors ? 2 * m->cap_anchors : 256;
    CostAnchor *a = realloc(m->anchors, (size_t)cap * sizeof *a);
    if (!a) {
      graph_free(g);
      return TEQ_ERR_NOMEM;
    }
    m->anchors = a, m->cap_anchors = cap;
  }
  double flops = cost_node_flops(g, node), bytes = cost_node_bytes(g, node);
  m->anchors[m->n_anchors++] =
      (CostAnchor){g->nodes[node].kind, family_of(g->nodes[node].kind),
                   g->nodes[node].n_in + g->nodes[node].n_out, flops, bytes, us,
                   log(flops + 1), log(bytes + 1), g, node, part_key(&g->nodes[node])};
  return TEQ_OK;
}

/* ---- estimates ---- */

static bool costs_nothing(const Node *n) {
  const OpDef *o = op_def(n->kind);
  return (o->flags & (OPF_SOURCE | OPF_NOOP | OPF_OPAQUE)) != 0;
}

bool cost_node_is_free(const Graph *g, int id) {
  return costs_nothing(&g->nodes[id]) || graph_node_is_view(g, id, NULL);
}

/* Whether node a of ga does a part of the work of node b of gb: the same
 * operator with the same parameters, except that a may have fewer
 * independent parts (conv's groups) or no fused activation, on inputs no
 * larger in any extent (the caller compares flops and bytes, which it
 * holds for both). A GPU is not strictly monotone
 * (an odd channel count can run slower than an aligned larger one), but a
 * kernel doing a part of another's work rarely takes longer. */
static bool does_part_of(const Graph *ga, int a, const Graph *gb, int b) {
  const Node *na = &ga->nodes[a], *nb = &gb->nodes[b];
  const OpDef *o = op_def(na->kind);
  if (na->kind != nb->kind || na->n_out != nb->n_out) return false;
  /* An optional input (a bias) adds little work: only the inputs both
   * have are compared. A variadic operator's arity is its work. */
  if (na->n_in != nb->n_in && o->n_in_max < 0) return false;
  for (int j = 0; j < na->n_in && j < nb->n_in; j++) {
    const Shape *sa = graph_shape(ga, na->in[j]), *sb = graph_shape(gb, nb->in[j]);
    if (sa->ndim < 0 || sa->ndim != sb->ndim) return false;
    for (int k = 0; k < sa->ndim; k++)
      if (sa->d[k] > sb->d[k]) return false;
  }
  for (int p = 0; p < o->n_params; p++) {
    const ParamValue *va = &na->params.v[p], *vb = &nb->params.v[p];
    const OpParam *op = &o->params[p];
    bool part = op->counts_parts  ? va->i[0] <= vb->i[0]
                : op->adds_work   ? va->i[0] == 0 || va->i[0] == vb->i[0]
                                  : memcmp(va, vb, sizeof *va) == 0;
    if (!part) return false;
  }
  return true;
}

/* Whether nodes a and b read inputs of the same shapes (where both have
 * the input). */
static bool same_inputs(const Graph *ga, int a, const Graph *gb, int b) {
  const Node *na = &ga->nodes[a], *nb = &gb->nodes[b];
  for (int j = 0; j < na->n_in && j < nb->n_in; j++)
    if (!shape_equal(graph_shape(ga, na->in[j]), graph_shape(gb, nb->in[j]))) return false;
  return true;
}

static double analytic_us(CostModel *m, const Graph *g, int id, CostSource *source);

enum { TWIN_MAX_IN = 8 };

/* What an operator of this kind and parameters costs on inputs of these
 * shapes and element types (table, GPU or estimate), built as a graph of
 * its own; 0 where it cannot be built. */
static double price_twin(CostModel *m, OpKind kind, const Params *p, const Shape *in,
                         const DType *dt, int n_in, int n_out) {
  Graph *t = graph_new();
  if (!t || n_in > TWIN_MAX_IN) {
    graph_free(t);
    return 0;
  }
  TensorRef refs[TWIN_MAX_IN];
  int tid = 0;
  for (int j = 0; j < n_in && tid >= 0; j++) {
    tid = graph_add_input(t, NULL, &in[j], dt[j], NULL);
    refs[j] = (TensorRef){tid, 0};
  }
  if (tid >= 0) tid = graph_add_node(t, kind, refs, n_in, n_out, p, NULL, NULL);
  double us = 0;
  CostEstimate e;
  Diag quiet;
  diag_init(&quiet);
  if (tid >= 0 && cost_node(m, t, tid, &e, &quiet) == TEQ_OK) us = e.us;
  diag_fini(&quiet);
  graph_free(t);
  return us;
}

/* price_twin, without writing the configuration to the record file: the
 * list a GPU run measures keeps to what the search meets, not every twin
 * the bounds price (each level of halving of every product would swell it). */
static double price_unrecorded(CostModel *m, OpKind kind, const Params *p, const Shape *in,
                               const DType *dt, int n_in, int n_out) {
  FILE *record = m->record;
  m->record = NULL;
  double us = price_twin(m, kind, p, in, dt, n_in, n_out);
  m->record = record;
  return us;
}

/* The shapes and element types of node n's first k inputs in g (k <=
 * TWIN_MAX_IN), as price_twin takes them. */
static void twin_inputs(const Graph *g, const Node *n, int k, Shape *in, DType *dt) {
  for (int j = 0; j < k; j++)
    in[j] = *graph_shape(g, n->in[j]), dt[j] = g->nodes[n->in[j].node].dtype;
}

/* What node id's one-tap twin costs (the registry's one_tap_twin: a conv
 * with a 1x1 kernel doing a part of its work), 0 where it has none. The
 * bound the measured anchors cannot give where neither is measured:
 * EfficientNet-B0's squeeze-and-excitation 1x1 convs on 1x1 inputs looked
 * cheaper enlarged to 3x3 with a ring of zeros (28 of them, by a proved
 * rule), and that was the whole of what the search found there. */
static double one_tap_us(CostModel *m, const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  const OpDef *o = op_def(n->kind);
  if (!o->one_tap_twin || n->n_in > TWIN_MAX_IN || n->n_out != 1) return 0;
  Shape in[TWIN_MAX_IN], part[TWIN_MAX_IN];
  DType dt[TWIN_MAX_IN];
  twin_inputs(g, n, n->n_in, in, dt);
  Params p;
  int n_part = 0;
  if (!o->one_tap_twin(n, in, &p, part, &n_part)) return 0;
  return price_unrecorded(m, n->kind, &p, part, dt, n_part, 1);
}

/* What node id's one-part twin costs (table, GPU or estimate), when the
 * registry says its parts each read a slice of input 0's axis 1 (conv's
 * groups): the same operator with one part on input 0 narrowed to one
 * slice, the other inputs as they are. It does the same work, with more
 * reuse of its input; 0 when id has one part or no such parameter. This
 * is the bound the measured anchors cannot give where neither instance was
 * measured: a conv turned into a grouped conv on its input concatenated
 * with itself (a proved rule) did the same work in a different place of
 * the nearest-neighbour correction, and looked 4% cheaper (CSRNet). */
static double one_part_us(CostModel *m, const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  const OpDef *o = op_def(n->kind);
  int p = 0;
  while (p < o->n_params && !o->params[p].parts_slice_input) p++;
  if (p == o->n_params || n->n_in < 1 || n->n_in > TWIN_MAX_IN) return 0;
  int64_t parts = n->params.v[p].i[0];
  Shape in[TWIN_MAX_IN];
  DType dt[TWIN_MAX_IN];
  twin_inputs(g, n, n->n_in, in, dt);
  if (parts <= 1 || in[0].ndim < 2 || in[0].d[1] % parts) return 0;
  in[0].d[1] /= parts;
  Params one = n->params;
  one.v[p].i[0] = 1;
  return price_twin(m, n->kind, &one, in, dt, n->n_in, n->n_out);
}

/* What node id's cost-family twin costs (table, GPU or estimate): the
 * operator of its family doing exactly its work (the registry's
 * cost_twin: a gemm without a bias is a matmul); 0 when it has none. */
static double family_twin_us(CostModel *m, const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  const OpDef *o = op_def(n->kind);
  if (!o->cost_twin || n->n_in > TWIN_MAX_IN) return 0;
  Shape in[TWIN_MAX_IN], twin_in[4];
  DType dt[4];
  for (int j = 0; j < n->n_in; j++) in[j] = *graph_shape(g, n->in[j]);
  Params p;
  params_default(o->cost_family, &p);
  int n_twin = 0;
  if (!o->cost_twin(n, in, &p, twin_in, &n_twin) || n_twin > 4) return 0;
  for (int j = 0; j < n_twin; j++) dt[j] = n->dtype;
  return price_twin(m, o->cost_family, &p, twin_in, dt, n_twin, n->n_out);
}

/* What node id's two half twins cost as two kernels, less the launch the
 * one kernel saves (the registry's half_twin: the same operator on half
 * the output columns, channels or rows), the cheapest way it can be
 * halved, or INFINITY where it has none. Its halves are held to their own
 * halves in turn, down to odd extents; each configuration is priced once
 * and remembered. */
static double twice_half_us(CostModel *m, const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  const OpDef *o = op_def(n->kind);
  if (!o->half_twin || n->n_in > TWIN_MAX_IN) return INFINITY;
  Shape in[TWIN_MAX_IN], half[TWIN_MAX_IN];
  DType dt[TWIN_MAX_IN];
  twin_inputs(g, n, n->n_in, in, dt);
  double best = INFINITY;
  for (int way = 0; way < OP_HALF_WAYS; way++) {
    if (!o->half_twin(n, in, way, half)) continue;
    double us = price_unrecorded(m, n->kind, &n->params, half, dt, n->n_in, n->n_out);
    if (us > 0) best = fmin(best, fmax(us, 2 * us - m->calib.launch_us));
  }
  return best;
}

/* What one element-wise pass of node id's epilogue over its output costs:
 * its fused activation's operator, with that activation's parameters (a
 * relu6's clip bounds), or a relu's for a bias alone, which is the pass
 * conv.cu's bias_act_kernel makes. 0 where id has no epilogue. */
static double epilogue_pass_us(CostModel *m, const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  Params bare, pp;
  int n_bare = 0;
  OpKind pass_kind;
  if (!op_bare_twin(n, &bare, &n_bare, &pass_kind, &pp) || n->n_out != 1) return 0;
  return price_unrecorded(m, pass_kind, &pp, &n->out[0], &n->dtype, 1, 1);
}

/* Bounds on node id from its bare twin (op_bare_twin: no bias, no fused
 * activation): at least the bare kernel, and at most the bare kernel and one
 * element-wise pass over the output, which is how conv.cu runs an epilogue
 * wherever fusing it does not pay. Priced by the neighbours alone, MNASNet's
 * depthwise [1,1152,7,7] 5x5 conv cost 7.7 us bare and 21.3 us with its
 * bias (a bias drew other neighbours), and its folded BatchNorms and relus
 * looked 26 us dearer than the model as given. pass: epilogue_pass_us's.
 * False without an epilogue. */
static bool bare_bounds(CostModel *m, const Graph *g, int id, double pass, double *lo,
                        double *hi) {
  const Node *n = &g->nodes[id];
  Params bare, pp;
  int n_bare = 0;
  OpKind pass_kind;
  if (!op_bare_twin(n, &bare, &n_bare, &pass_kind, &pp) || n_bare > TWIN_MAX_IN ||
      n->n_out != 1)
    return false;
  Shape in[TWIN_MAX_IN];
  DType dt[TWIN_MAX_IN];
  twin_inputs(g, n, n_bare, in, dt);
  double us = price_unrecorded(m, n->kind, &bare, in, dt, n_bare, 1);
  if (!(us > 0 && pass > 0)) return false;
  *lo = us, *hi = us + pass;
  return true;
}

/* The analytic estimate of node id: its family's roofline, corrected by the
 * nearest measurements, then kept within what measurements of the same
 * operator bound: no cheaper than one doing a part of its work, no dearer
 * than one doing all of it and more. The nearest-neighbour correction
 * alone is not monotone in the work (a conv and the grouped conv that does
 * it twice can fall near anchors of different efficiency), and a search
 * finds every such hole: replacing a measured conv by an unmeasured one
 * that does more would look like a gain. A measured twin on inputs of the
 * same shapes (the conv a fused relu or a bias was added to) replaces the
 * neighbours: a fused epilogue costs the GPU little, and neighbours of
 * other shapes would price the twin's activation at anything. A spelling
 * of its cost family's operator (a gemm without a bias) starts from what
 * that operator costs instead of its own neighbours: the two kinds lean
 * on different ones, and a search would otherwise trade one spelling for
 * the other (and a vector for its transposed view) on that noise alone;
 * only measurements of its own kind, through the bounds, set it apart.
 * And no estimate exceeds its two half twins' run as two kernels
 * (twice_half_us). */
/* What measured anchor a says a kernel of these flops and bytes costs, one
 * epilogue (a bias, a fused activation) away from it: its time scaled by
 * the rooflines' ratio. */
static double twin_us(const CostModel *m, OpKind fam, const CostAnchor *a, double flops,
                      double bytes) {
  return a->us * roofline(&m->calib, fam, flops, bytes) /
         roofline(&m->calib, fam, a->flops, a->bytes);
}

/* What node id costs as its twin without its residual input (the
 * registry's residual_input: conv2d's Z) and one more read of that input at
 * an element-wise operator's bandwidth, or 0 where it has none. The bounds
 * below would price it by whatever measured conv does part of its work,
 * the slowest of them (a [1,64,56,56] conv with a residual came to 34.4 us
 * where the same conv with its bias and relu measured 31.4, so fusing the
 * add looked dearer than running it), and no search creates one (only the
 * import and the folding after the search do), so there is no hole here
 * for a search to take. */
static double residual_us(CostModel *m, const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  int r = op_def(n->kind)->residual_input;
  if (r <= 0 || n->n_in != r + 1 || n->n_in > TWIN_MAX_IN) return 0;
  Shape in[TWIN_MAX_IN];
  DType dt[TWIN_MAX_IN];
  twin_inputs(g, n, r, in, dt);
  double us = price_unrecorded(m, n->kind, &n->params, in, dt, r, n->n_out);
  /* A relu in the epilogue is as free as the residual: where the table has
   * the twin without its fused activation and not with it, that one. */
  Params bare, pass_params; /* its parameters without the fused activation */
  int n_bare;
  OpKind pass;
  if (op_bare_twin(n, &bare, &n_bare, &pass, &pass_params)) {
    double without_act = price_unrecorded(m, n->kind, &bare, in, dt, r, n->n_out);
    if (without_act > 0 && (us <= 0 || without_act < us)) us = without_act;
  }
  double bytes = (double)shape_numel(graph_shape(g, n->in[r])) * sizeof(float);
  double gbps = m->calib.byte_eff[OP_EWADD] * m->calib.mem_gbps;
  return us > 0 && gbps > 0 ? us + bytes / (gbps * 1e3) : 0;
}

/* What node id costs as its twin without its fused pool (op_unpooled_twin:
 * conv2d's pool) followed by that max pool on its own, or 0 where it has
 * none: how the runtime runs it wherever the pool does not fuse into the
 * way (all but Winograd's), so a bound the table prices from what it
 * measured. Priced by the neighbours instead, a pooled conv (a quarter of
 * the output, the same work) fell near convs of other shapes. */
static double pooled_us(CostModel *m, const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  Params bare, pool;
  OpKind pool_kind;
  if (!op_unpooled_twin(n, &bare, &pool_kind, &pool) || n->n_in > TWIN_MAX_IN || n->n_out != 1)
    return 0;
  Shape in[TWIN_MAX_IN], full;
  DType dt[TWIN_MAX_IN];
  twin_inputs(g, n, n->n_in, in, dt);
  Node unpooled = *n; /* its full output's shape, for the pool's input */
  unpooled.params = bare;
  if (op_def(n->kind)->infer_shape(&unpooled, in, &full, NULL) != TEQ_OK) return 0;
  double conv = price_unrecorded(m, n->kind, &bare, in, dt, n->n_in, 1);
  double then = price_unrecorded(m, pool_kind, &pool, &full, &n->dtype, 1, 1);
  return conv > 0 && then > 0 ? conv + then : 0;
}

static double analytic_us(CostModel *m, const Graph *g, int id, CostSource *source) {
  const Node *n = &g->nodes[id];
  double pooled = pooled_us(m, g, id);
  if (pooled > 0) {
    *source = COST_TWIN;
    return pooled;
  }
  double residual = residual_us(m, g, id);
  if (residual > 0) {
    *source = COST_TWIN;
    return residual;
  }
  double flops = cost_node_flops(g, id), bytes = cost_node_bytes(g, id);
  double est = family_twin_us(m, g, id);
  bool family = est > 0;
  if (!family) est = cost_anchored(m, n->kind, n->n_in + n->n_out, flops, bytes, -1);
  double lo = 0, hi = INFINITY;
  /* the cheapest and the dearest measured twin on the same inputs */
  double twin_measured = INFINITY, twin_most = 0;
  bool twin = false;
  OpKind fam = calib_kind(&m->calib, n->kind);
  const CostAnchor *fuller = NULL; /* measured with an epilogue this one lacks */
  uint64_t key = part_key(n);
  int end;
  for (int r = part_range(m, n->kind, key, &end); r < end; r++) { /* else no part either way */
    const CostAnchor *a = &m->anchors[m->index.by_part[r]];
    bool part = a->flops <= flops && a->bytes <= bytes && does_part_of(a->g, a->node, g, id);
    if (part && same_inputs(a->g, a->node, g, id)) {
      /* A twin measured without the fused activation or a bias: its time
       * scaled by the rooflines' ratio says more than any neighbour. */
      est = twin_us(m, fam, a, flops, bytes);
      twin = true;
      twin_measured = fmin(twin_measured, a->us);
      twin_most = fmax(twin_most, a->us);
    }
    if (part && a->us > lo) lo = a->us;
    bool whole = flops <= a->flops && bytes <= a->bytes && does_part_of(g, id, a->g, a->node);
    if (whole && a->us < hi) hi = a->us;
    if (whole && !fuller && same_inputs(g, id, a->g, a->node)) fuller = a;
  }
  /* The same twin the other way round: measured with the bias or fused
   * activation this one lacks. Its kernel is this one's with an epilogue,
   * so its time, scaled alike, says more than the neighbours too. Without
   * it a conv whose bias a rewrite moved elsewhere (into a residual add,
   * ResNet's) fell to the neighbours' estimate, 18% under the measured conv
   * with its bias, and the search took that hole for a gain. A family twin
   * (a gemm without a bias is its matmul) keeps its own start: the
   * spellings of one product must tie. */
  bool from_fuller = !twin && !family && fuller;
  if (from_fuller) {
    est = twin_us(m, fam, fuller, flops, bytes);
    twin = true;
  }
  /* The one-part twin bounds what no measurement of these shapes prices:
   * an estimate of its own (a grouped conv of 4 channels a group becomes a
   * dense conv of 4 input channels) says less than a measured twin. */
  double lo_measured = lo, hi_measured = hi;
  if (!twin) lo = fmax(lo, one_part_us(m, g, id));
  /* The one-tap twin is an estimate too (nothing measures it here): no
   * higher than what a measured conv doing all of this one's work took. */
  if (!twin) lo = fmax(lo, fmin(one_tap_us(m, g, id), hi));
  /* Two halves priced by their neighbours say less than the measurement of
   * this very kernel with its epilogue. */
  if (!from_fuller) hi = fmin(hi, twice_half_us(m, g, id));
  double bare_lo, bare_hi;
  double pass = epilogue_pass_us(m, g, id); /* 0 without an epilogue */
  if (bare_bounds(m, g, id, pass, &bare_lo, &bare_hi))
    lo = fmax(lo, bare_lo), hi = fmin(hi, bare_hi);
  /* Where the bounds disagree (hi < lo), the lower one wins: an estimate
   * never promises less than a part of the work. */
  double us = fmax(fmin(est, hi), lo);
  /* Whatever the bounds say, the GPU runs it as a measured twin's kernel
   * and one pass of the epilogue the twin lacks (conv.cu: the bias and any
   * fused activation in one pass), so it costs no more than that, and no
   * less than the dearest such twin, which does a part of its work on the
   * same inputs. Without this a depthwise conv of MobileNetV2 fused with
   * its relu6, bounded below by slower measured convs doing less work, cost
   * 8.2 us where its twin with the bias alone measured 5.6 and the clip
   * after it 1.4. */
  if (twin_measured < INFINITY) {
    if (pass > 0 && twin_measured + pass < us) {
      *source = COST_TWIN;
      return fmax(twin_measured + pass, twin_most);
    }
  }
  /* A twin's price, or one set by a measured bound, is a measurement's; one
   * the halves set is an estimate's. */
  *source = twin && (us == est || us == lo_measured || us == hi_measured) ? COST_TWIN : COST_ANALYTIC;
  return us;
}

int cost_node(CostModel *m, const Graph *g, int id, CostEstimate *out, Diag *d) {
  out->us = 0;
  out->source = COST_ANALYTIC;
  /* No kernel (a view is a pointer into its input on the GPU): nothing to pay. */
  if (cost_node_is_free(g, id)) return TEQ_OK;
  CostConfig cfg;
  ConfigSlot *slot = NULL;
  uint64_t h = 0;
  size_t len = 0;
  if (cost_config_of(g, id, &cfg)) {
    len = cost_config_len(&cfg);
    h = hash_bytes(0xc0f1, &cfg, len);
    slot = config_slot(m, &cfg, h, len);
    if (slot && slot->key && (!m->record || slot->e->recorded)) {
      *out = (CostEstimate){slot->e->us, slot->e->source};
      return TEQ_OK;
    }
  }
  char key[COST_KEY_MAX];
  if (cost_config_key(g, id, key, sizeof key) >= (int)sizeof key) {
    /* Too wide to name (a concat of dozens of corrected pieces): no table
     * can hold it, so the analytic model prices it, unrecorded. */
    out->us = analytic_us(m, g, id, &out->source);
    return TEQ_OK;
  }
  CostEntry *e = find(m, key);
  if (!e && m->gpu) {
    /* Measured once per configuration; a failure falls back to the
     * roofline with a warning rather than stopping a search. */
    CudaProfile prof;
    Diag pd;
    diag_init(&pd);
    if (cuda_profile_node(m->gpu, g, id, 20, &prof, &pd) == TEQ_OK)
      e = insert(m, key, prof.median_us, COST_MEASURED);
    else
      diag_warn(d, "cost: cannot time '%s' on the GPU: %s", key, diag_last(&pd));
    diag_fini(&pd);
  }
  if (!e) {
    CostSource source;
    double us = analytic_us(m, g, id, &source);
    e = insert(m, key, us, source);
    if (!e) return diag_error(d, "out of memory");
  }
  if (m->record && !e->recorded) {
    fprintf(m->record, "%s\n", key);
    e->recorded = true;
  }
  /* Found again: pricing it may have priced others (a twin), and the
   * table may have grown since. */
  if (slot) slot = config_slot(m, &cfg, h, len);
  if (slot && !slot->key && (slot->key = malloc(len))) {
    memcpy(slot->key, &cfg, len);
    slot->hash = h, slot->len = len, slot->e = e;
    m->n_configs++;
  }
  out->us = e->us;
  out->source = e->source;
  return TEQ_OK;
}

CostEstimate cost_gather(const CostModel *m, const Graph *g, const GatherRows *r) {
  double numel = (double)shape_numel(&g->nodes[r->node].out[0]);
  double bytes = 2 * numel * sizeof(float) + (double)r->n_rows * sizeof(void *);
  return (CostEstimate){cost_anchored(m, OP_TRANSPOSE, 2, numel, bytes, -1), COST_ANALYTIC};
}

int cost_graph(CostModel *m, const Graph *g, double *us, int counts[COST__SOURCES], Diag *d) {
  int32_t *order = malloc(((size_t)g->n_nodes + 1) * sizeof *order);
  char *needed = calloc((size_t)g->n_nodes + 1, 1);
  PlanAsRun ar = {0};
  int rc = TEQ_ERR_NOMEM;
  if (!order || !needed) diag_error(d, "out of memory");
  else rc = plan_as_run(g, &ar, d);
  if (rc == TEQ_OK) rc = graph_topo_order(g, order);
  *us = 0;
  for (int s = 0; s < COST__SOURCES; s++) counts[s] = 0;
  for (int i = 0; !rc && i < g->n_outputs; i++) needed[g->outputs[i].node] = 1;
  for (int k = g->n_nodes - 1; !rc && k >= 0; k--) {
    const Node *n = &g->nodes[order[k]];
    if (!needed[order[k]]) continue;
    for (int j = 0; j < n->n_in; j++) needed[n->in[j].node] = 1;
    PlanRun run = plan_node_runs(g, &ar, order[k], NULL);
    if ((run == PLAN_RUN_KERNEL && costs_nothing(n)) ||
        (run != PLAN_RUN_KERNEL && run != PLAN_RUN_GATHER))
      continue;
    CostEstimate e;
    if (run == PLAN_RUN_GATHER) e = cost_gather(m, g, &ar.gathers.exits[ar.gathers.exit[order[k]]]);
    else if ((rc = cost_node(m, g, order[k], &e, d)) != TEQ_OK) break;
    *us += e.us;
    counts[e.source]++;
  }
  free(order);
  free(needed);
  plan_as_run_fini(&ar);
  return rc;
}

/* ---- the table file ---- */

int cost_model_load_table(CostModel *m, const char *path, const char *device, Diag *d) {
  FILE *f = fopen(path, "r");
  if (!f) {
    diag_error(d, "%s: cannot open: %s", path, strerror(errno));
    return TEQ_ERR_IO;
  }
  char line[4096];
  int lineno = 0, rc = TEQ_OK;
  while (rc == TEQ_OK && fgets(line, sizeof line, f)) {
    lineno++;
    size_t len = strlen(line);
    if (len && line[len - 1] == '\n') line[--len] = '\0';
    if (len == 0) continue;
    if (strncmp(line, "#calib\t", 7) == 0) {
      /* #calib <op|*> flop_eff byte_eff, or #calib device peak_gflops mem_gbps launch_us */
      char what[64];
      double a, b, c = 0;
      int got = sscanf(line + 7, "%63s %lf %lf %lf", what, &a, &b, &c);
      if (strcmp(what, "device") == 0 && got == 4) {
        m->calib.peak_gflops = a, m->calib.mem_gbps = b, m->calib.launch_us = c;
      } else if (got >= 3 && op_by_name(what) >= 0 && a > 0 && b > 0) {
        int k = op_by_name(what);
        m->calib.flop_eff[k] = a, m->calib.byte_eff[k] = b, m->calib.fitted[k] = true;
      } else {
        rc = diag_error(d, "%s:%d: malformed calibration line", path, lineno);
      }
      continue;
    }
    if (line[0] == '#') continue;
    char *fields[5];
    int nf = 0;
    for (char *p = line; nf < 5 && p;) {
      fields[nf++] = p;
      p = strchr(p, '\t');
      if (p) *p++ = '\0';
    }
    if (nf < 4) {
      rc = diag_error(d, "%s:%d: expected device, key, median_us, min_us (tab-separated)", path,
                      lineno);
      break;
    }
    if (!m->device[0] && (!device || strcmp(device, fields[0]) == 0))
      snprintf(m->device, sizeof m->device, "%s", fields[0]);
    if (strcmp(fields[0], m->device) != 0) continue;
    char *end;
    double us = strtod(fields[2], &end);
    if (end == fields[2] || *end || !(us >= 0))
      rc = diag_error(d, "%s:%d: median_us '%s' is not a time", path, lineno, fields[2]);
    else if (!insert(m, fields[1], us, COST_TABLE) || add_anchor(m, fields[1], us) != TEQ_OK)
      rc = diag_error(d, "out of memory");
  }
  fclose(f);
  if (index_anchors(m) != TEQ_OK && rc == TEQ_OK)
    diag_error(d, "out of memory indexing %s", path), rc = TEQ_ERR_NOMEM;
  return rc;
}
