/* finish.c: a searched graph as optimize exports it, and its cost as run.
 *
 * The search prices graphs as it rewrites them: biases and activations
 * folded into their convolutions (opt_fuse_bias), every other node a
 * kernel of its own. What runs is the graph after a few exact passes the
 * search does not price per candidate: weights computed into initializers,
 * residual adds folded into convolutions, adds and activations regrouped
 * through splits, concats laid out to be written in place, and (with PET)
 * the post-optimization of layouts that meet across windows. Those passes
 * can save more than the search's last steps (NasNet-A: 1,043 us searched,
 * 880 us as run), so the windows choose their result by this cost, not
 * the search's. */
#include "optimize/opt_int.h"

/* The passes in the order the runtime needs them: folded weights first
 * (a weight-only bias is then a constant), epilogues after. */
static int finish_passes(CostModel *cm, Graph **g, const OptFinishMemo *memo, bool for_price,
                         OptFinish *f, Diag *d) {
  OptFoldMemo *folds = memo ? memo->folds : NULL;
  int rc = for_price ? opt_fold_weights_for_price(*g, folds, &f->folded, d)
                     : opt_fold_weights_memo(*g, folds, &f->folded, d);
  OptChannels *channels = opt_fold_memo_channels(folds);
  if (rc == TEQ_OK) rc = opt_fuse_bias_with(*g, channels, &f->fused, d);
  if (rc == TEQ_OK && (f->residuals = graph_fuse_residuals(*g, d)) < 0) rc = f->residuals;
  if (rc == TEQ_OK)
    rc = opt_fold_through_splits_with(cm, g, channels, &f->through_splits, &f->fused, d);
  if (rc == TEQ_OK) rc = opt_share_concat_prefixes(*g, &f->shared, d);
  if (rc == TEQ_OK)
    rc = opt_graph_cost_run(cm, *g, &f->us, f->src, f->us_by_source, d);
  return rc;
}

/* opt_finish, or with for_price the graph opt_finished_cost prices. */
static int finish(CostModel *cm, Graph **g, bool pet, const OptFinishMemo *memo, bool for_price,
                  OptFinish *out, Diag *d) {
  OptFinish plain = {0}, posted = {0};
  Graph *post = NULL;
  int rc = TEQ_OK;
  if (pet) {
    rc = (post = graph_copy(*g)) ? TEQ_OK : TEQ_ERR_NOMEM;
    if (rc == TEQ_OK)
      rc = pet_post_optimize_cached(&post, memo ? memo->post : NULL, &posted.post, d);
    if (rc == TEQ_OK) rc = finish_passes(cm, &post, memo, for_price, &posted, d);
    posted.posted = true;
  }
  if (rc == TEQ_OK) rc = finish_passes(cm, g, memo, for_price, &plain, d);
  if (rc == TEQ_OK && post && posted.us <= plain.us) {
    graph_free(*g);
    *g = post, post = NULL;
    plain = posted;
  }
  graph_free(post);
  if (rc == TEQ_OK && out) *out = plain;
  return rc;
}

int opt_finish(CostModel *cm, Graph **g, bool pet, const OptFinishMemo *memo, OptFinish *out,
               Diag *d) {
  return finish(cm, g, pet, memo, false, out, d);
}

/* The weights no pass reads are not computed (opt_fold_weights_for_price):
 * choosing a window's best finished each of BERT's concatenated
 * projections, 12 MB apiece. */
int opt_finished_cost(CostModel *cm, const Graph *g, bool pet, const OptFinishMemo *memo,
                      double *us, Diag *d) {
  Graph *f = graph_copy(g);
  if (!f) return TEQ_ERR_NOMEM;
  OptFinish fin = {0};
  int rc = finish(cm, &f, pet, memo, true, &fin, d);
  graph_free(f);
  if (rc == TEQ_OK) *us = fin.us;
  return rc;
}
