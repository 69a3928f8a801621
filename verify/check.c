/* check.c: --check-axioms: validation (validate.c), redundancy and
 * consistency.
 *
 * Redundancy and consistency use the prover's own typed ground reasoning
 * (prove.c), at concrete shapes where each axiom is well typed (the first
 * combination validation would try, extents 3 preferred). An axiom is
 * entailed by the others when the prover, with that axiom left out, proves
 * its two sides equal at that shape: exactly the question of whether
 * verify-rules needs it. Consistency: every axiom's sample instance goes
 * into one e-graph over distinct input tensors, the e-graph is saturated
 * with all the axioms for a bounded number of rounds, and no two distinct
 * inputs may end up in one class. Quantified Z3 queries were tried for
 * both and left out: with these axioms E-matching grows without bound and
 * ignores its timeout (TASO's hang, notes/taso.md section 2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "verify/verify_int.h"

#define CONSISTENCY_ROUNDS 6

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Adds t under b to g; *out receives its tensor. */
static int add_term(Graph *g, const Axioms *ax, const Term *t, const Binding *b,
                    const int *var_node, TensorRef *out, Diag *d) {
  if (t->decl < 0) {
    *out = (TensorRef){var_node[t->var], 0};
    return TEQ_OK;
  }
  const AxDecl *dc = &ax->decls[t->decl];
  TensorRef in[AX_MAX_TARGS];
  for (int i = 0; i < dc->n_targs; i++) {
    int rc = add_term(g, ax, t->targs[i], b, var_node, &in[i], d);
    if (rc) return rc;
  }
  int64_t iargs[AX_MAX_IARGS];
  for (int i = 0; i < dc->n_iargs; i++)
    if (!iexpr_eval(t->iargs[i], b, &iargs[i])) return TEQ_ERR_INTERNAL;
  Params p;
  decl_params(dc, iargs, &p);
  int id = graph_add_node(g, dc->kind, in, dc->n_targs, dc->n_out, &p, NULL, d);
  if (id < 0) return id;
  *out = (TensorRef){id, dc->out};
  return TEQ_OK;
}

/* The axiom's tensor variables as inputs of g (named prefix + name). */
static int add_inputs(Graph *g, const Axiom *a, const Shape *shapes, const char *prefix,
                      int *var_node, Diag *d) {
  for (int v = 0; v < a->n_vars; v++) {
    if (a->vars[v].sort != SORT_TENSOR) continue;
    char name[96];
    snprintf(name, sizeof name, "%s%s", prefix, a->vars[v].name);
    int id = graph_add_input(g, name, &shapes[v], DT_F32, d);
    if (id < 0) return id;
    var_node[v] = id;
  }
  return TEQ_OK;
}

static void point(Binding *b, Shape *shapes) {
  for (int v = 0; v < AX_MAX_VARS; v++) b->shape[v] = &shapes[v];
}

/* src = the axiom's left side, dst = its right side, at the sample. */
static int axiom_graphs(const Axioms *ax, const Axiom *a, Binding *b, Shape *shapes, Graph **src,
                        Graph **dst, Diag *d) {
  int var_node[AX_MAX_VARS];
  Graph *s = graph_new(), *t = graph_new();
  TensorRef ls, rt;
  point(b, shapes);
  int rc = s && t ? TEQ_OK : TEQ_ERR_NOMEM;
  if (!rc) rc = add_inputs(s, a, shapes, "", var_node, d);
  if (!rc) rc = add_term(s, ax, a->lhs, b, var_node, &ls, d);
  if (!rc) rc = add_inputs(t, a, shapes, "", var_node, d);
  if (!rc) rc = add_term(t, ax, a->rhs, b, var_node, &rt, d);
  if (!rc && (rc = graph_add_output(s, ls, "out", d)) >= 0) rc = graph_add_output(t, rt, "out", d);
  if (rc < 0) {
    graph_free(s);
    graph_free(t);
    return rc;
  }
  *src = s, *dst = t;
  return TEQ_OK;
}

static int check_redundancy(const Axioms *ax, int timeout_ms, FILE *out, bool quiet,
                            FILE *progress) {
  double t0 = now_s();
  Prover *p = NULL;
  VerifyLimits lim = {.timeout_ms = timeout_ms, .seed = 1};
  Diag d;
  diag_init(&d);
  int rc = prover_new(ax, &lim, &p, &d);
  int entailed = 0, no_sample = 0;
  fprintf(out, "redundancy: each axiom proved from the others at one well-typed shape "
          "(%d ms each)\n", timeout_ms);
  for (int i = 0; !rc && i < ax->n_axioms; i++) {
    const Axiom *a = &ax->axioms[i];
    Binding b;
    Shape shapes[AX_MAX_VARS];
    Graph *src = NULL, *dst = NULL;
    if (!axiom_sample(ax, i, &b, shapes) || axiom_graphs(ax, a, &b, shapes, &src, &dst, &d)) {
      no_sample++;
      fprintf(out, "  no sample  %-28s line %d: no well-typed instance found\n", a->name, a->line);
      continue;
    }
    VerifyOutcome o;
    prover_skip_axiom(p, i);
    rc = prover_decide(p, src, dst, &o, &d);
    if (!rc && o.result == VERIFY_PROVED) {
      entailed++;
      fprintf(out, "  entailed   %-28s line %d: follows from the others (%d instances)\n", a->name,
              a->line, o.instances);
    }
    free(o.counterexample);
    graph_free(src);
    graph_free(dst);
    if (!quiet && progress) fprintf(progress, "redundancy: %d/%d axioms\n", i + 1, ax->n_axioms);
  }
  fprintf(out, "redundancy: %d of %d axioms entailed by the others, %d without a sample, %.1f s\n",
          entailed, ax->n_axioms, no_sample, now_s() - t0);
  prover_free(p);
  diag_fini(&d);
  return rc;
}

/* Returns 1 when two distinct inputs were proved equal. */
static int check_consistency(const Axioms *ax, int timeout_ms, FILE *out, Diag *d) {
  double t0 = now_s();
  Graph *g = graph_new();
  int rc = g ? TEQ_OK : TEQ_ERR_NOMEM, seeds = 0;
  for (int i = 0; !rc && i < ax->n_axioms; i++) {
    const Axiom *a = &ax->axioms[i];
    Binding b;
    Shape shapes[AX_MAX_VARS];
    int var_node[AX_MAX_VARS];
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.", a->name);
    TensorRef l, r;
    if (!axiom_sample(ax, i, &b, shapes)) continue;
    point(&b, shapes);
    if ((rc = add_inputs(g, a, shapes, prefix, var_node, d)) ||
        (rc = add_term(g, ax, a->lhs, &b, var_node, &l, d)) ||
        (rc = add_term(g, ax, a->rhs, &b, var_node, &r, d)))
      break;
    if ((rc = graph_add_output(g, l, NULL, d)) < 0 || (rc = graph_add_output(g, r, NULL, d)) < 0)
      break;
    rc = TEQ_OK;
    seeds++;
  }
  Prover *p = NULL;
  VerifyLimits lim = {.timeout_ms = timeout_ms, .seed = 1};
  bool merged = false;
  int nodes = 0;
  if (!rc) rc = prover_new(ax, &lim, &p, d);
  if (!rc) rc = prover_merges_inputs(p, g, CONSISTENCY_ROUNDS, &merged, &nodes);
  if (!rc)
    fprintf(out, "consistency: %s (%d axiom instances over %d distinct inputs, %d rounds, %d "
            "terms, %.1f s)\n",
            merged ? "INCONSISTENT: two distinct input tensors were proved equal"
                   : "no two distinct input tensors proved equal",
            seeds, g->n_inputs, CONSISTENCY_ROUNDS, nodes, now_s() - t0);
  prover_free(p);
  graph_free(g);
  return rc ? rc : merged ? 1 : 0;
}

int axioms_validate(const Axioms *ax, int jobs, double budget_s, FILE *out, int *n_false) {
  *n_false = 0;
  return validate_axioms(ax, jobs, budget_s, out, n_false, true, NULL);
}

int verify_check_axioms(const CheckOptions *opt, FILE *out, int *n_false, Diag *d) {
  Axioms *ax = NULL;
  int rc = axioms_load(opt->axioms_path, &ax, d);
  if (rc) return rc;
  *n_false = 0;
  fprintf(out, "check-axioms %s: %d axioms, %d operator symbols, hash %s\n", opt->axioms_path,
          ax->n_axioms, ax->n_decls, ax->hash);
  if (opt->validate)
    rc = validate_axioms(ax, opt->jobs, opt->budget_ms > 0 ? opt->budget_ms / 1e3 : 30.0, out,
                         n_false, opt->quiet, opt->progress);
  if (!rc && opt->redundancy) rc = check_redundancy(ax, opt->timeout_ms, out, opt->quiet, opt->progress);
  if (!rc && opt->consistency) {
    int inconsistent = check_consistency(ax, opt->timeout_ms * 10, out, d);
    if (inconsistent < 0) rc = inconsistent;
    else *n_false += inconsistent;
  }
  axioms_free(ax);
  return rc;
}
