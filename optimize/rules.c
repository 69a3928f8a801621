/* rules.c: the rules optimize applies, read from the rule database.
 *
 * The database stores each rule once, as an equation; optimize uses both
 * directions where a direction can be applied: its source must bind every
 * variable its target reads, and each of its outputs must be computed by
 * an operator (a variable alone is nothing to replace). Directed rules are
 * indexed by the operator kind that computes the source's first output,
 * the node where matching starts, with that node in brief (its arity and
 * its operands' kinds), which turns most rules away before matching. */
#include <stdlib.h>
#include <string.h>

#include "optimize/opt_int.h"
#include "ruledb/ruledb.h"

OptRules *opt_rules_new(void) { return calloc(1, sizeof(OptRules)); }

void opt_rules_free(OptRules *rs) {
  if (!rs) return;
  for (int i = 0; i < rs->n; i++) {
    if (!rs->r[i].shares_sides) graph_free(rs->r[i].src), graph_free(rs->r[i].dst);
    free(rs->r[i].text);
  }
  for (int k = 0; k < OP__COUNT; k++) free(rs->by_root[k]);
  free(rs->removals);
  free(rs->r);
  free(rs);
}

int opt_rules_count(const OptRules *rs) { return rs->n; }
char *opt_rules_text(const OptRules *rs, int i) {
  const OptRule *r = &rs->r[i];
  if (r->text) return strdup(r->text);
  return rule_text(&(Rule){.src = r->src, .dst = r->dst});
}
int64_t opt_rules_id(const OptRules *rs, int i) { return rs->r[i].id; }
const Graph *opt_rules_source(const OptRules *rs, int i) { return rs->r[i].src; }

/* Which variables (OP_INPUT nodes) the outputs of side reach. */
static void vars_used(const Graph *side, bool *used) {
  bool live[OPT_MAX_SIDE] = {false};
  for (int o = 0; o < side->n_outputs; o++) live[side->outputs[o].node] = true;
  for (int id = side->n_nodes - 1; id >= 0; id--) {
    if (!live[id]) continue;
    const Node *n = &side->nodes[id];
    if (n->kind == OP_INPUT) used[id] = true;
    for (int j = 0; j < n->n_in; j++) live[n->in[j].node] = true;
  }
}

/* Whether src => dst can be applied as a rewrite (see the file comment). */
static bool applicable(const Graph *src, const Graph *dst) {
  if (src->n_nodes > OPT_MAX_SIDE || dst->n_nodes > OPT_MAX_SIDE) return false;
  if (src->n_outputs != dst->n_outputs || src->n_outputs == 0) return false;
  if (src->n_inputs != dst->n_inputs) return false;
  for (int o = 0; o < src->n_outputs; o++) {
    const Node *n = &src->nodes[src->outputs[o].node];
    if (n->kind == OP_INPUT || n->kind == OP_CONST) return false;
  }
  bool in_src[OPT_MAX_SIDE] = {false}, in_dst[OPT_MAX_SIDE] = {false};
  vars_used(src, in_src);
  vars_used(dst, in_dst);
  for (int v = 0; v < dst->n_inputs; v++) {
    int id = dst->inputs[v], sid = src->inputs[v];
    if (in_dst[id] && !in_src[sid]) return false;
  }
  return true;
}

/* Adds src => dst, applicable, with its text (owned; may be NULL). Takes
 * nothing on failure. */
static int add_directed(OptRules *rs, Graph *src, Graph *dst, bool shares_sides, int64_t id,
                        char *text) {
  if (rs->n == rs->cap) {
    int cap = rs->cap ? rs->cap * 2 : 256;
    OptRule *r = realloc(rs->r, (size_t)cap * sizeof *r);
    if (!r) return TEQ_ERR_NOMEM;
    rs->r = r, rs->cap = cap;
  }
  OpKind root = src->nodes[src->outputs[0].node].kind;
  if (rs->n_by_root[root] == rs->cap_by_root[root]) {
    int cap = rs->cap_by_root[root] ? 2 * rs->cap_by_root[root] : 16;
    OptRootEntry *e = realloc(rs->by_root[root], (size_t)cap * sizeof *e);
    if (!e) return TEQ_ERR_NOMEM;
    rs->by_root[root] = e;
    rs->cap_by_root[root] = cap;
  }
  bool removal = true;
  for (int p = 0; p < dst->n_nodes && removal; p++) removal = dst->nodes[p].kind == OP_INPUT;
  if (removal && rs->n_removals == rs->cap_removals) {
    int cap = rs->cap_removals ? 2 * rs->cap_removals : 16;
    int32_t *k = realloc(rs->removals, (size_t)cap * sizeof *k);
    if (!k) return TEQ_ERR_NOMEM;
    rs->removals = k, rs->cap_removals = cap;
  }
  if (removal) rs->removals[rs->n_removals++] = rs->n;
  OptRule *r = &rs->r[rs->n];
  *r = (OptRule){.src = src, .dst = dst, .shares_sides = shares_sides, .id = id, .text = text,
                 .root = root};
  for (int p = 0; p < src->n_nodes; p++) {
    const OpDef *def = op_def(src->nodes[p].kind);
    for (int i = 0; i < def->n_params; i++)
      if (opt_param_is_free(src, p, i)) r->free_params[p] |= 1u << i;
    r->depthwise[p] = opt_is_depthwise(src, p);
  }
  /* the root in brief: its operands, and its fixed parameters under its
   * set of free ones */
  int top = src->outputs[0].node, m = 0;
  uint32_t free_mask = r->free_params[top];
  while (m < rs->n_root_masks[root] && rs->root_masks[root][m] != free_mask) m++;
  if (m == rs->n_root_masks[root] && m < OPT_ROOT_MASKS)
    rs->root_masks[root][rs->n_root_masks[root]++] = free_mask;
  rs->by_root[root][rs->n_by_root[root]++] =
      (OptRootEntry){.rule = rs->n++, .sig = opt_root_sig(src),
                     .mask = (int8_t)(m < OPT_ROOT_MASKS ? m : -1),
                     .pkey = opt_params_key(&src->nodes[top], free_mask)};
  return TEQ_OK;
}

int opt_rules_add(OptRules *rs, Graph *src, Graph *dst, int64_t id, const char *text, Diag *d) {
  int rc = TEQ_OK;
  char *own = text ? strdup(text) : NULL;
  if (!applicable(src, dst))
    rc = diag_error(d, "rule %lld cannot be applied in this direction", (long long)id);
  else if (text && !own)
    rc = TEQ_ERR_NOMEM;
  else
    rc = add_directed(rs, src, dst, false, id, own);
  if (rc) {
    free(own);
    graph_free(src);
    graph_free(dst);
  }
  return rc;
}

typedef struct Loader {
  OptRules *rs;
  int64_t seen, usable;
  Diag *d;
} Loader;

/* Keeps rule r's sides (no copies), in each direction that applies; the
 * two directions share them. */
static int load_one(Rule *r, void *ctx) {
  Loader *L = ctx;
  L->seen++;
  if (r->status == RULE_REFUTED) return 0;
  Graph *a = r->src, *b = r->dst;
  bool fwd = applicable(a, b), back = applicable(b, a);
  int rc = TEQ_OK, added = 0;
  if (fwd && (rc = add_directed(L->rs, a, b, false, r->id, NULL)) == TEQ_OK) added++;
  if (rc == TEQ_OK && back && (rc = add_directed(L->rs, b, a, fwd, r->id, NULL)) == TEQ_OK)
    added++;
  if (added) r->src = r->dst = NULL; /* the rule set's now */
  L->usable += added;
  return rc;
}

int opt_rules_load(const char *db_path, bool include_unproved, OptRules **out, Diag *d) {
  RuleDb *db = NULL;
  int rc = ruledb_open(db_path, RULEDB_READ, &db, d);
  if (rc) return rc;
  OptRules *rs = opt_rules_new();
  if (!rs) {
    ruledb_close(db);
    return TEQ_ERR_NOMEM;
  }
  Loader L = {.rs = rs, .d = d};
  rc = ruledb_foreach_rule(db, include_unproved ? -1 : RULE_PROVED, load_one, &L, d);
  int64_t total = 0;
  if (rc == TEQ_OK) rc = ruledb_count_rules(db, -1, &total, d);
  ruledb_close(db);
  if (rc == TEQ_OK && rs->n == 0) {
    if (total == 0)
      rc = diag_error(d, "%s: the database holds no rules (run gen-rules)", db_path);
    else if (L.seen == 0)
      rc = diag_error(d, "%s: none of its %lld rules is proved (run verify-rules, or pass "
                         "--unproved to use unverified ones)", db_path, (long long)total);
    else
      rc = diag_error(d, "%s: none of its rules can be applied as a rewrite", db_path);
  }
  if (rc) {
    opt_rules_free(rs);
    return rc;
  }
  *out = rs;
  return TEQ_OK;
}
