/* bucket.c: from one bucket of (fingerprint, graph) records to confirmed
 * pairs of equal graphs.
 *
 * Records are sorted by fingerprint; each run of two or more is a group.
 * A group is split into classes by exact, element-by-element comparison
 * of the outputs (as multisets), so a fingerprint collision never becomes
 * a pair. Each class is confirmed on a second, independent random input at
 * the same shapes and then at the second shape assignment; members that
 * stop matching there are counted (one input only, shape-specific) and
 * dropped. Every surviving member is paired with its class's smallest
 * graph, which is enough: equality is transitive, and the optimizer can go
 * through the representative. */
#include <stdlib.h>
#include <string.h>

#include "gen/gen_int.h"

uint64_t gen_seed(uint64_t seed, int which) {
  return hash_mix(hash_mix(seed, 0x67656e), (uint64_t)which);
}

/* The outputs of one graph at one evaluation, sorted by value hash. */
typedef struct Sig {
  bool ok;                    /* the graph type-checks at this assignment */
  int n;
  uint8_t slot[2 * GEN_MAX_DEPTH];
  uint64_t vh[2 * GEN_MAX_DEPTH];
  Tensor *t[2 * GEN_MAX_DEPTH];
} Sig;

static void sig_fini(Sig *g) {
  for (int i = 0; i < g->n; i++) tensor_unref(g->t[i]);
  g->n = 0;
}

/* Pushes gr onto s, keeping whatever prefix of it s holds already: the
 * records of a group are sorted by encoding, so neighbours often share
 * their first operators, and those are not evaluated again. Returns 1 if
 * every operator applied (s then holds exactly gr), 0 if not. */
static int push_shared(GenState *s, const GenGraph *gr, Diag *d) {
  int keep = 0;
  while (keep < s->n_ops && keep < gr->n_ops && !memcmp(&s->op[keep], &gr->op[keep], sizeof gr->op[0]))
    keep++;
  while (s->n_ops > keep) gen_pop(s);
  for (int i = keep; i < gr->n_ops; i++) {
    int rc = gen_push(s, gr->op[i], d);
    if (rc != 1) return rc;
  }
  return 1;
}

static int sig_eval(GenState *s, const GenGraph *gr, Sig *g, Diag *d) {
  memset(g, 0, sizeof *g);
  int rc = push_shared(s, gr, d);
  if (rc < 0) {
    gen_pop_all(s);
    return rc;
  }
  if (rc == 1) {
    int slots[GEN_MAX_SLOTS];
    g->ok = true;
    g->n = gen_outputs(s, slots);
    for (int i = 0; i < g->n; i++) {
      g->slot[i] = (uint8_t)slots[i];
      g->vh[i] = s->slot[slots[i]].vh;
      g->t[i] = tensor_ref(s->slot[slots[i]].t);
    }
    /* Insertion sort by value hash: at most 10 outputs. */
    for (int i = 1; i < g->n; i++)
      for (int j = i; j > 0 && g->vh[j] < g->vh[j - 1]; j--) {
        uint64_t h = g->vh[j];
        g->vh[j] = g->vh[j - 1], g->vh[j - 1] = h;
        uint8_t sl = g->slot[j];
        g->slot[j] = g->slot[j - 1], g->slot[j - 1] = sl;
        Tensor *t = g->t[j];
        g->t[j] = g->t[j - 1], g->t[j - 1] = t;
      }
  }
  return TEQ_OK;
}

static bool sig_equal(const Sig *a, const Sig *b) {
  if (!a->ok || !b->ok || a->n != b->n) return false;
  for (int i = 0; i < a->n; i++)
    if (a->vh[i] != b->vh[i] || !shape_equal(&a->t[i]->shape, &b->t[i]->shape) ||
        memcmp(a->t[i]->data, b->t[i]->data, tensor_bytes(a->t[i])))
      return false;
  return true;
}

static int cmp_record(const void *pa, const void *pb) {
  const GenRecord *a = pa, *b = pb;
  if (a->fp != b->fp) return a->fp < b->fp ? -1 : 1;
  return memcmp(&a->g, &b->g, sizeof a->g);
}

/* Smaller graph first: fewer operators, then encoding order. */
static int cmp_graph(const GenGraph *a, const GenGraph *b, const GenVocab *v) {
  int ra = gen_graph_real_ops(v, a), rb = gen_graph_real_ops(v, b);
  if (ra != rb) return ra < rb ? -1 : 1;
  return memcmp(a, b, sizeof *a);
}

typedef struct PairList {
  GenPair *p;
  size_t n, cap;
} PairList;

static int pair_add(PairList *l, const GenGraph *src, const Sig *ss, const GenGraph *dst,
                    const Sig *ds) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    GenPair *p = realloc(l->p, cap * sizeof *p);
    if (!p) return TEQ_ERR_NOMEM;
    l->p = p, l->cap = cap;
  }
  GenPair *p = &l->p[l->n++];
  memset(p, 0, sizeof *p);
  p->src = *src;
  p->dst = *dst;
  p->n_out = (uint8_t)ss->n;
  /* Both signatures are sorted by value hash and equal: aligned. */
  for (int i = 0; i < ss->n; i++) p->src_out[i] = ss->slot[i], p->dst_out[i] = ds->slot[i];
  return TEQ_OK;
}

/* One fingerprint group of k graphs. */
static int group(const GenVocab *v, GenState st[3], const GenRecord *r, size_t k, PairList *out,
                 GenBucketStats *bs, Diag *d) {
  Sig *sig = calloc(3 * k, sizeof *sig); /* sig[3 * i + e]: graph i, evaluation e */
  int *cls = malloc(k * sizeof *cls);
  int rc = sig && cls ? TEQ_OK : TEQ_ERR_NOMEM;
  for (size_t i = 0; !rc && i < k; i++) rc = sig_eval(&st[0], &r[i].g, &sig[3 * i], d);
  /* Classes at the fingerprint evaluation. */
  int n_cls = 0;
  for (size_t i = 0; !rc && i < k; i++) {
    cls[i] = -1;
    for (size_t j = 0; j < i && cls[i] < 0; j++)
      if (sig_equal(&sig[3 * i], &sig[3 * j])) cls[i] = cls[j];
    if (cls[i] < 0) cls[i] = n_cls++;
  }
  if (!rc) bs->collisions += n_cls - 1;
  for (int c = 0; !rc && c < n_cls; c++) {
    /* Members, the representative being the smallest. */
    size_t rep = k;
    int size = 0;
    for (size_t i = 0; i < k; i++)
      if (cls[i] == c) {
        size++;
        if (rep == k || cmp_graph(&r[i].g, &r[rep].g, v) < 0) rep = i;
      }
    if (size < 2) continue;
    for (size_t i = 0; !rc && i < k; i++)
      if (cls[i] == c) {
        rc = sig_eval(&st[1], &r[i].g, &sig[3 * i + 1], d);
        if (!rc) rc = sig_eval(&st[2], &r[i].g, &sig[3 * i + 2], d);
      }
    for (size_t i = 0; !rc && i < k; i++) {
      if (cls[i] != c || i == rep) continue;
      if (!sig_equal(&sig[3 * i + 1], &sig[3 * rep + 1])) {
        bs->one_input_only++;
        continue;
      }
      if (!sig_equal(&sig[3 * i + 2], &sig[3 * rep + 2])) {
        bs->shape_specific++;
        continue;
      }
      /* Larger graph as the source. */
      rc = pair_add(out, &r[i].g, &sig[3 * i], &r[rep].g, &sig[3 * rep]);
    }
  }
  for (size_t i = 0; sig && i < 3 * k; i++) sig_fini(&sig[i]);
  free(sig);
  free(cls);
  return rc;
}

int gen_bucket_pairs(const GenVocab *v, uint64_t seed, GenRecord *recs, size_t n,
                     GenPair **pairs, size_t *n_pairs, GenBucketStats *st, Diag *d) {
  GenState s[3];
  memset(s, 0, sizeof s);
  int rc = TEQ_OK;
  for (int e = 0; !rc && e < 3; e++)
    rc = gen_state_init(&s[e], v, e == 2 ? SHAPE_B : SHAPE_A, gen_seed(seed, e));
  qsort(recs, n, sizeof *recs, cmp_record);
  PairList out = {0};
  for (size_t i = 0; !rc && i < n;) {
    size_t j = i + 1;
    while (j < n && recs[j].fp == recs[i].fp) j++;
    if (j - i >= 2) {
      st->fp_groups++;
      rc = group(v, s, recs + i, j - i, &out, st, d);
    }
    i = j;
  }
  for (int e = 0; e < 3; e++) gen_state_fini(&s[e]);
  if (rc) {
    free(out.p);
    return rc;
  }
  *pairs = out.p;
  *n_pairs = out.n;
  return TEQ_OK;
}
