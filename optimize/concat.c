/* concat.c: after the search, concats laid out so that their pieces can be
 * written in place.
 *
 * A runtime writes a concat's pieces straight into its output when each
 * piece is in no other concat (graph_node_in_place). DenseNet's blocks
 * break that rule everywhere: layer k reads concat(x0, f1, ..., fk-1), a
 * new concat of every feature so far, so each feature is a piece of every
 * later layer's concat and every one of them copies. Written as
 * concat(the previous layer's concat, fk-1), each is the one before it
 * plus one piece, and the whole block lives in its last concat's buffer.
 * concat is associative, so the rewrite is exact, and it copies the same
 * bytes where nothing is written in place. */
#include <stdlib.h>
#include <string.h>

#include "optimize/opt_int.h"

/* Whether concat p's inputs are the first p->n_in of concat c's, on the
 * same axis. */
static bool leads(const Node *p, const Node *c) {
  if (p->n_in >= c->n_in || memcmp(&p->params, &c->params, sizeof p->params)) return false;
  for (int j = 0; j < p->n_in; j++)
    if (p->in[j].node != c->in[j].node || p->in[j].out != c->in[j].out) return false;
  return true;
}

int opt_share_concat_prefixes(Graph *g, int *n_shared, Diag *d) {
  int n0 = g->n_nodes, shared = 0, rc = TEQ_OK;
  int32_t *cats = malloc(((size_t)n0 + 1) * sizeof *cats);
  int32_t *prefix = malloc(((size_t)n0 + 1) * sizeof *prefix);
  if (!cats || !prefix) rc = diag_error(d, "out of memory sharing concats' pieces");
  int n_cats = 0;
  for (int i = 0; i < n0 && rc == TEQ_OK; i++)
    if (g->nodes[i].kind == OP_CONCAT && !g->nodes[i].opaque) cats[n_cats++] = i;
  /* Each concat's longest leading concat, found on the graph as it was. */
  for (int a = 0; a < n_cats && rc == TEQ_OK; a++) {
    const Node *c = &g->nodes[cats[a]];
    prefix[a] = -1;
    for (int b = 0; b < n_cats; b++) {
      const Node *p = &g->nodes[cats[b]];
      if (b != a && leads(p, c) && (prefix[a] < 0 || p->n_in > g->nodes[prefix[a]].n_in))
        prefix[a] = cats[b];
    }
  }
  /* New concats first, then every use of an old one moved to its new one,
   * so a new concat that takes an old one as its prefix takes the new. */
  int32_t *made = prefix; /* reused: the new node of cats[a], or -1 */
  for (int a = 0; a < n_cats && rc == TEQ_OK; a++) {
    if (prefix[a] < 0) continue;
    const Node *c = &g->nodes[cats[a]];
    const Node *p = &g->nodes[prefix[a]];
    int rest = c->n_in - p->n_in;
    TensorRef *in = malloc(((size_t)rest + 1) * sizeof *in);
    if (!in) {
      rc = diag_error(d, "out of memory sharing concats' pieces");
      break;
    }
    in[0] = (TensorRef){prefix[a], 0};
    memcpy(in + 1, c->in + p->n_in, (size_t)rest * sizeof *in);
    Params params = c->params;
    char *name = c->name ? strdup(c->name) : NULL;
    int nid = graph_add_node(g, OP_CONCAT, in, rest + 1, 1, &params, name, d);
    free(in);
    free(name);
    if (nid < 0) {
      rc = nid;
      break;
    }
    made[a] = nid;
  }
  for (int a = 0; a < n_cats && rc == TEQ_OK; a++)
    if (made[a] >= 0) {
      graph_replace_uses(g, (TensorRef){cats[a], 0}, (TensorRef){made[a], 0});
      shared++;
    }
  free(cats);
  free(prefix);
  if (rc == TEQ_OK && shared) {
    int removed = graph_remove_dead(g);
    if (removed < 0) rc = removed;
  }
  if (n_shared) *n_shared = rc == TEQ_OK ? shared : 0;
  return rc;
}
