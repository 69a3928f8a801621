/* text.c: rule sides as one-line S-expressions, for people (the rules.text
 * column, reports, test expectations).
 *
 * Variables print as their names, operators as (name[params] args...) with
 * only the non-default parameters (params_format). A node is written inline
 * where it is used, unless inlining would duplicate it or lose outputs: a
 * node used more than once, or with several outputs, is bound once with let
 * as t1, t2... in topological order (t1.0 names output 0 of a multi-output
 * node). The text is for reading; the protobuf columns are what is decoded. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ruledb/ruledb.h"

typedef struct Text {
  const Graph *g;
  char *s;
  size_t len, cap;
  bool failed;     /* an allocation failed; the text is dropped */
  int32_t *label;  /* per node: its let number, or 0 when written inline */
} Text;

static bool reserve(Text *t, size_t extra) {
  if (t->failed) return false;
  if (t->len + extra + 1 <= t->cap) return true;
  size_t cap = t->cap ? t->cap : 128;
  while (cap < t->len + extra + 1) cap *= 2;
  char *s = realloc(t->s, cap);
  if (!s) {
    t->failed = true;
    return false;
  }
  t->s = s;
  t->cap = cap;
  return true;
}

static void put(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Text *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || !reserve(t, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(t->s + t->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  t->len += (size_t)n;
}

static void write_node(Text *t, int32_t id);

static void write_var(Text *t, int32_t id) {
  const Node *n = &t->g->nodes[id];
  if (n->name) {
    put(t, "%s", n->name);
    return;
  }
  /* An unnamed variable (not one a rule stores) still gets a stable name. */
  for (int i = 0; i < t->g->n_inputs; i++)
    if (t->g->inputs[i] == id) put(t, "v%d", i + 1);
}

static void write_ref(Text *t, TensorRef r) {
  const Node *n = &t->g->nodes[r.node];
  if (n->kind == OP_INPUT) write_var(t, r.node);
  else if (!t->label[r.node]) write_node(t, r.node);
  else if (n->n_out > 1) put(t, "t%d.%d", t->label[r.node], r.out);
  else put(t, "t%d", t->label[r.node]);
}

static void write_node(Text *t, int32_t id) {
  const Node *n = &t->g->nodes[id];
  put(t, "(%s", op_def(n->kind)->name);
  int np = params_format(n->kind, &n->params, true, NULL, 0);
  if (np > 0 && reserve(t, (size_t)np + 2)) {
    t->s[t->len++] = '[';
    params_format(n->kind, &n->params, true, t->s + t->len, (size_t)np + 1);
    t->len += (size_t)np;
    t->s[t->len++] = ']';
    t->s[t->len] = '\0';
  }
  for (int i = 0; i < n->n_in; i++) {
    put(t, " ");
    write_ref(t, n->in[i]);
  }
  put(t, ")");
}

/* Numbers the nodes that must be let-bound: reachable from an output, and
 * used more than once or with several outputs. Returns how many. */
static int label_nodes(Text *t, const int32_t *order) {
  const Graph *g = t->g;
  int32_t *offset, *uses = graph_use_counts(g, &offset);
  bool *reached = calloc((size_t)g->n_nodes + 1, sizeof *reached);
  if (!uses || !reached) {
    free(uses), free(offset), free(reached);
    t->failed = true;
    return 0;
  }
  for (int i = 0; i < g->n_outputs; i++) reached[g->outputs[i].node] = true;
  for (int k = g->n_nodes - 1; k >= 0; k--) {
    const Node *n = &g->nodes[order[k]];
    if (reached[order[k]])
      for (int i = 0; i < n->n_in; i++) reached[n->in[i].node] = true;
  }
  int count = 0;
  for (int k = 0; k < g->n_nodes; k++) {
    int32_t id = order[k];
    const Node *n = &g->nodes[id];
    int32_t total = 0;
    for (int j = offset[id]; j < offset[id + 1]; j++) total += uses[j];
    if (n->kind != OP_INPUT && reached[id] && (n->n_out > 1 || total > 1))
      t->label[id] = ++count;
  }
  free(uses), free(offset), free(reached);
  return count;
}

char *rule_side_text(const Graph *g) {
  Text t = {.g = g};
  int32_t *order = malloc(((size_t)g->n_nodes + 1) * sizeof *order);
  t.label = calloc((size_t)g->n_nodes + 1, sizeof *t.label);
  if (!order || !t.label || graph_topo_order(g, order) != TEQ_OK) {
    t.failed = true;
    goto out;
  }
  int n_let = label_nodes(&t, order);
  reserve(&t, 0); /* an empty graph still gives "" */
  if (n_let) {
    put(&t, "(let (");
    for (int k = 0, first = 1; k < g->n_nodes; k++) {
      int32_t id = order[k];
      if (!t.label[id]) continue;
      put(&t, "%s(t%d ", first ? "" : " ", t.label[id]);
      write_node(&t, id);
      put(&t, ")");
      first = 0;
    }
    put(&t, ") ");
  }
  if (g->n_outputs == 1) {
    write_ref(&t, g->outputs[0]);
  } else {
    put(&t, "(tuple");
    for (int i = 0; i < g->n_outputs; i++) {
      put(&t, " ");
      write_ref(&t, g->outputs[i]);
    }
    put(&t, ")");
  }
  if (n_let) put(&t, ")");
out:
  free(order);
  free(t.label);
  if (t.failed) {
    free(t.s);
    return NULL;
  }
  return t.s;
}

char *rule_text(const Rule *r) {
  char *a = rule_side_text(r->src), *b = rule_side_text(r->dst), *s = NULL;
  if (a && b) {
    size_t n = strlen(a) + strlen(b) + 5;
    s = malloc(n);
    if (s) snprintf(s, n, "%s => %s", a, b);
  }
  free(a);
  free(b);
  return s;
}
