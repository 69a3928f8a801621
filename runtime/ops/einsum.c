/* einsum.c: ONNX's Einsum of two operands, read as the batched product it
 * is (matmul's row takes it; MaxViT writes its attention with it:
 * "B G H I D, B G H J D -> B G H I J"). Each label of the equation is
 *   batch       in both operands and the output,
 *   contracted  in both operands, not the output,
 *   left/right  in A (B) alone, and the output.
 * A is transposed to [batch, left, contracted] and reshaped to
 * [batch..., M, K], B to [batch, contracted, right] and [batch..., K, N]
 * (onnx_in_as_arranged_input); their product [batch..., M, N] is reshaped
 * to [batch..., left..., right...] and transposed into the output's order.
 * Batch extents of 1 broadcast, as they do in a product. A label in one
 * operand alone and not the output is summed there first (a reduce_sum of
 * the operand's last axes, once they are transposed there). A label twice
 * in one operand (a diagonal), and one or three operands, are refused:
 * the node is kept as it is. Labels are the equation's letters (ONNX
 * allows [a-zA-Z]) and the dimensions an ellipsis stands for, numbered
 * from the right as broadcasting aligns them. */
#include <string.h>

#include "runtime/ops/family.h"

enum {
  N_LETTERS = 52,                       /* 'A'-'Z' then 'a'-'z': ASCII order */
  N_LABELS = N_LETTERS + TEQ_MAX_DIMS,  /* then the ellipsis' dimensions */
  MAX_TERM = TEQ_MAX_DIMS,
};

typedef struct Term {
  int n;               /* labels, after the ellipsis is expanded */
  int label[MAX_TERM];
  bool ellipsis;
  int n_explicit;      /* letters */
  int before;          /* letters before the ellipsis */
} Term;

static int letter_label(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return 26 + c - 'a';
  return -1;
}

static char label_char(int l) {
  return l < 26 ? (char)('A' + l) : l < N_LETTERS ? (char)('a' + l - 26) : '.';
}

/* One term, s[0..len), spaces skipped; its ellipsis expanded later. */
static int parse_term(OnnxNodeIn *v, const char *s, size_t len, Term *t, Diag *d) {
  *t = (Term){0};
  for (size_t i = 0; i < len; i++) {
    if (s[i] == ' ') continue;
    if (s[i] == '.') {
      if (t->ellipsis || i + 2 >= len || s[i + 1] != '.' || s[i + 2] != '.')
        return onnx_in_error(v, d, "equation: a '.' that is not one ellipsis '...'");
      t->ellipsis = true, t->before = t->n_explicit, i += 2;
      continue;
    }
    int l = letter_label(s[i]);
    if (l < 0) return onnx_in_error(v, d, "equation: '%c' is no label (letters a-z, A-Z)", s[i]);
    if (t->n_explicit == MAX_TERM)
      return onnx_in_unsupported(v, d, "a term of more than %d labels", MAX_TERM);
    t->label[t->n_explicit++] = l;
  }
  t->n = t->n_explicit;
  return TEQ_OK;
}

/* Gives an input's ellipsis the dimensions its rank leaves it, labelled
 * N_LETTERS + e counted so that the last dimension of every operand's
 * ellipsis shares one label (e_max: the most dimensions any has). */
static int expand_input(OnnxNodeIn *v, Term *t, int rank, int *e_out, Diag *d) {
  int e = rank - t->n_explicit;
  if (e < 0 || (!t->ellipsis && e != 0))
    return onnx_in_error(v, d, "equation: a term of %d label%s for an input of rank %d",
                         t->n_explicit, t->n_explicit == 1 ? "" : "s", rank);
  *e_out = e;
  return TEQ_OK;
}

static void place_ellipsis(Term *t, int e, int e_max) {
  if (!t->ellipsis) return;
  int letters[MAX_TERM];
  memcpy(letters, t->label, sizeof letters);
  int n = 0;
  for (int k = 0; k < t->before; k++) t->label[n++] = letters[k];
  for (int k = 0; k < e; k++) t->label[n++] = N_LETTERS + e_max - e + k;
  for (int k = t->before; k < t->n_explicit; k++) t->label[n++] = letters[k];
  t->n = n;
}

static int position(const Term *t, int l) {
  for (int k = 0; k < t->n; k++)
    if (t->label[k] == l) return k;
  return -1;
}

int einsum_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  (void)p; /* the product's own parameters: no activation */
  const char *eq = NULL;
  if (!onnx_in_attr_string(v, "equation", &eq))
    return onnx_in_error(v, d, "the equation attribute is missing");
  if (onnx_in_n_inputs(v) != 2 || !onnx_in_has_input(v, 0) || !onnx_in_has_input(v, 1))
    return onnx_in_unsupported(v, d, "an Einsum of %d operand%s: only two, a product, are taken",
                               onnx_in_n_inputs(v), onnx_in_n_inputs(v) == 1 ? "" : "s");
  const char *arrow = strstr(eq, "->"), *comma = strchr(eq, ',');
  size_t lhs = arrow ? (size_t)(arrow - eq) : strlen(eq);
  size_t first = comma ? (size_t)(comma - eq) : 0;
  if (!comma || first >= lhs || memchr(comma + 1, ',', lhs - first - 1))
    return onnx_in_error(v, d, "equation '%s': two operands need two terms before '->'", eq);
  Term t[3]; /* A, B, the output */
  int rc = parse_term(v, eq, first, &t[0], d);
  if (!rc) rc = parse_term(v, comma + 1, lhs - first - 1, &t[1], d);
  if (!rc && arrow) rc = parse_term(v, arrow + 2, strlen(arrow + 2), &t[2], d);
  if (rc) return rc;

  const Shape *s[2] = {onnx_in_input_shape(v, 0), onnx_in_input_shape(v, 1)};
  for (int i = 0; i < 2; i++)
    if (!shape_is_known(s[i]))
      return onnx_in_unsupported(v, d, "input %d has an unknown shape", i);
  int e[2] = {0, 0}, e_max;
  if ((rc = expand_input(v, &t[0], s[0]->ndim, &e[0], d)) ||
      (rc = expand_input(v, &t[1], s[1]->ndim, &e[1], d)))
    return rc;
  e_max = e[0] > e[1] ? e[0] : e[1];
  place_ellipsis(&t[0], e[0], e_max);
  place_ellipsis(&t[1], e[1], e_max);

  /* Extents and counts per label; the output's labels. */
  int64_t ext[2][N_LABELS];
  int count[3][N_LABELS] = {{0}};
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < t[i].n; k++) {
      int l = t[i].label[k];
      if (count[i][l]++)
        return onnx_in_unsupported(v, d, "label '%c' twice in operand %d (a diagonal)",
                                   label_char(l), i);
      ext[i][l] = s[i]->d[k];
    }
  if (arrow) {
    if (t[2].ellipsis && e_max + t[2].n_explicit > MAX_TERM)
      return onnx_in_unsupported(v, d, "an output of rank over %d", MAX_TERM);
    place_ellipsis(&t[2], e_max, e_max);
  } else { /* implicit: the ellipsis, then letters seen once, in ASCII order */
    t[2] = (Term){0};
    for (int l = N_LETTERS; l < N_LETTERS + e_max; l++) t[2].label[t[2].n++] = l;
    for (int l = 0; l < N_LETTERS; l++)
      if (count[0][l] + count[1][l] == 1) {
        if (t[2].n == MAX_TERM)
          return onnx_in_unsupported(v, d, "an output of rank over %d", MAX_TERM);
        t[2].label[t[2].n++] = l;
      }
  }
  for (int k = 0; k < t[2].n; k++) {
    int l = t[2].label[k];
    if (count[2][l]++)
      return onnx_in_error(v, d, "equation '%s': label '%c' twice in the output", eq,
                           label_char(l));
    if (!count[0][l] && !count[1][l])
      return onnx_in_error(v, d, "equation '%s': output label '%c' is in no operand", eq,
                           label_char(l));
  }

  /* The classes, batch, left and right in the output's order. */
  int batch[MAX_TERM], left[MAX_TERM], right[MAX_TERM], contr[MAX_TERM], drop[2][MAX_TERM];
  int nb = 0, nl = 0, nr = 0, nc = 0, nd[2] = {0, 0};
  for (int k = 0; k < t[2].n; k++) {
    int l = t[2].label[k];
    if (count[0][l] && count[1][l]) {
      if (ext[0][l] != ext[1][l] && ext[0][l] != 1 && ext[1][l] != 1)
        return onnx_in_error(v, d, "label '%c': extents %lld and %lld do not broadcast",
                             label_char(l), (long long)ext[0][l], (long long)ext[1][l]);
      batch[nb++] = l;
    } else if (count[0][l]) {
      left[nl++] = l;
    } else {
      right[nr++] = l;
    }
  }
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < t[i].n; k++) {
      int l = t[i].label[k];
      if (count[2][l]) continue;
      if (count[1 - i][l]) {
        if (i == 1) continue; /* counted from A */
        if (ext[0][l] != ext[1][l])
          return onnx_in_unsupported(v, d, "label '%c' summed over extents %lld and %lld",
                                     label_char(l), (long long)ext[0][l], (long long)ext[1][l]);
        contr[nc++] = l;
      } else {
        drop[i][nd[i]++] = l;
      }
    }
  if (nb + 2 > TEQ_MAX_DIMS)
    return onnx_in_unsupported(v, d, "%d batch labels: at most %d", nb, TEQ_MAX_DIMS - 2);

  /* A to [batch, left, contracted, summed], its own labels summed, then
   * [batch..., M, K]; B to [batch, contracted, right, summed] and
   * [batch..., K, N]. */
  int64_t perm[2][MAX_TERM], m = 1, k = 1, n = 1;
  int np[2] = {0, 0};
  Shape flat[2] = {{.ndim = nb + 2}, {.ndim = nb + 2}};
  for (int i = 0; i < 2; i++)
    for (int b = 0; b < nb; b++) {
      perm[i][np[i]++] = position(&t[i], batch[b]);
      flat[i].d[b] = ext[i][batch[b]];
    }
  for (int j = 0; j < nl; j++) perm[0][np[0]++] = position(&t[0], left[j]), m *= ext[0][left[j]];
  for (int j = 0; j < nc; j++) {
    perm[0][np[0]++] = position(&t[0], contr[j]);
    perm[1][np[1]++] = position(&t[1], contr[j]);
    k *= ext[0][contr[j]];
  }
  for (int j = 0; j < nr; j++) perm[1][np[1]++] = position(&t[1], right[j]), n *= ext[1][right[j]];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < nd[i]; j++) perm[i][np[i]++] = position(&t[i], drop[i][j]);
  flat[0].d[nb] = m, flat[0].d[nb + 1] = k;
  flat[1].d[nb] = k, flat[1].d[nb + 1] = n;
  onnx_in_as_arranged_input(v, 0, perm[0], np[0], nd[0], &flat[0]);
  onnx_in_as_arranged_input(v, 1, perm[1], np[1], nd[1], &flat[1]);

  /* The product's [batch..., M, N] to [batch..., left..., right...], then
   * to the output's order. */
  int grouped[MAX_TERM], ng = 0;
  Shape split = {.ndim = t[2].n};
  for (int b = 0; b < nb; b++) {
    int64_t x = ext[0][batch[b]], y = ext[1][batch[b]];
    split.d[ng] = x == 1 ? y : x, grouped[ng++] = batch[b];
  }
  for (int j = 0; j < nl; j++) split.d[ng] = ext[0][left[j]], grouped[ng++] = left[j];
  for (int j = 0; j < nr; j++) split.d[ng] = ext[1][right[j]], grouped[ng++] = right[j];
  int64_t out_perm[MAX_TERM];
  for (int j = 0; j < t[2].n; j++)
    for (int g = 0; g < ng; g++)
      if (grouped[g] == t[2].label[j]) out_perm[j] = g;
  onnx_in_as_arranged_output(v, &split, out_perm, t[2].n);
  return TEQ_OK;
}
