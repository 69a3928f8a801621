/* axioms.c: the parser of specs/ops.axioms and the small evaluator of its
 * integer expressions.
 *
 * The syntax (one item per statement, `#` comments to the end of a line):
 *   const RELU = 1
 *   op conv2d = conv2d[stride.0, stride.1, pads.0, pads.1, pads.2, pads.3, groups, act](x, w)
 *   op split0 = split.0/2[axis, sizes.0, sizes.1](x)
 *   # why it holds
 *   axiom name: forall x y, a in {0, 1}. lhs = rhs when cond and cond
 * A declaration binds a symbol to the registry row with that axiom_name,
 * output .k of /n outputs, and names the registry parameter (list element)
 * behind each integer argument. Every axiom must follow a comment saying
 * why it holds. Variables take their sort from where they are used; an
 * integer variable needs `in {..}` or `in lo..hi`: the values validation
 * tries. Errors are reported as path:line:col with what was expected and
 * what was found, the line, and a caret; the parser goes on to the next
 * statement so one run shows several. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify/verify_int.h"

/* ---- arena: every Term and IExpr of one Axioms ---- */

typedef struct Chunk {
  struct Chunk *next;
  size_t used, cap;
  max_align_t data[];
} Chunk;

static void *arena_alloc(void **arena, size_t n) {
  n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
  Chunk *c = *arena;
  if (!c || c->used + n > c->cap) {
    size_t cap = n > 65536 ? n : 65536;
    Chunk *fresh = malloc(sizeof *fresh + cap);
    if (!fresh) return NULL;
    fresh->next = c, fresh->used = 0, fresh->cap = cap;
    *arena = c = fresh;
  }
  void *p = (char *)c->data + c->used;
  c->used += n;
  memset(p, 0, n);
  return p;
}

static void arena_free(void *arena) {
  for (Chunk *c = arena; c;) {
    Chunk *next = c->next;
    free(c);
    c = next;
  }
}

/* ---- lexer ---- */

typedef enum Tok {
  TK_EOF, TK_IDENT, TK_INT, TK_PUNCT, TK_BAD,
} Tok;

typedef struct Token {
  Tok kind;
  size_t pos, len;
  int64_t num;
} Token;

typedef struct Parser {
  const char *name, *text;
  size_t len, pos;
  Token tok;
  bool comment_before;  /* a comment line came since the last statement */
  Diag *d;
  int n_errors;
  Axioms *ax;
  Axiom *cur;           /* the axiom being parsed (variables) */
  int n_consts;
  char const_names[64][24];
  int64_t const_values[64];
} Parser;

static void where(const Parser *p, size_t pos, int *line, int *col, size_t *line_start) {
  *line = 1, *col = 1, *line_start = 0;
  for (size_t i = 0; i < pos && i < p->len; i++) {
    if (p->text[i] == '\n') (*line)++, *col = 1, *line_start = i + 1;
    else (*col)++;
  }
}

/* "path:line:col: error: <msg>", the line and a caret under pos. */
static void error_at(Parser *p, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void error_at(Parser *p, size_t pos, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int line, col;
  size_t start;
  where(p, pos, &line, &col, &start);
  size_t end = start;
  while (end < p->len && p->text[end] != '\n') end++;
  diag_error(p->d, "%s:%d:%d: %s\n  %.*s\n  %*s^", p->name, line, col, msg,
             (int)(end - start), p->text + start, col - 1, "");
  p->n_errors++;
}

static bool is_ident_start(int c) { return isalpha(c) || c == '_'; }
static bool is_ident(int c) { return isalnum(c) || c == '_'; }

static void next(Parser *p) {
  for (;;) {
    while (p->pos < p->len && isspace((unsigned char)p->text[p->pos])) p->pos++;
    if (p->pos < p->len && p->text[p->pos] == '#') {
      p->comment_before = true;
      while (p->pos < p->len && p->text[p->pos] != '\n') p->pos++;
      continue;
    }
    break;
  }
  Token t = {.pos = p->pos};
  if (p->pos >= p->len) {
    t.kind = TK_EOF;
  } else {
    unsigned char c = (unsigned char)p->text[p->pos];
    if (is_ident_start(c)) {
      size_t e = p->pos;
      while (e < p->len && is_ident((unsigned char)p->text[e])) e++;
      t.kind = TK_IDENT, t.len = e - p->pos;
    } else if (isdigit(c)) {
      size_t e = p->pos;
      int64_t v = 0;
      while (e < p->len && isdigit((unsigned char)p->text[e])) {
        if (v > (INT64_MAX - 9) / 10) v = INT64_MAX / 2; /* absurd, caught by bounds */
        else v = v * 10 + (p->text[e] - '0');
        e++;
      }
      t.kind = TK_INT, t.len = e - p->pos, t.num = v;
    } else {
      static const char *const two[] = {"..", "!=", "<=", ">=", NULL};
      t.kind = TK_PUNCT, t.len = 1;
      for (int i = 0; two[i]; i++)
        if (p->pos + 1 < p->len && !strncmp(p->text + p->pos, two[i], 2)) t.len = 2;
      if (!strchr("[](){},.:=+-*/%<>", c) && t.len == 1) t.kind = TK_BAD;
    }
  }
  p->pos = t.pos + t.len;
  p->tok = t;
}

static bool is(const Parser *p, const char *s) {
  size_t n = strlen(s);
  return p->tok.kind != TK_EOF && p->tok.len == n && !strncmp(p->text + p->tok.pos, s, n);
}

/* The current token as text for messages. */
static const char *found(const Parser *p, char *buf, size_t size) {
  if (p->tok.kind == TK_EOF) return "end of file";
  snprintf(buf, size, "'%.*s'", (int)(p->tok.len > 40 ? 40 : p->tok.len), p->text + p->tok.pos);
  return buf;
}

static bool expect(Parser *p, const char *s, const char *what) {
  if (is(p, s)) {
    next(p);
    return true;
  }
  char b[64];
  error_at(p, p->tok.pos, "expected %s, found %s", what, found(p, b, sizeof b));
  return false;
}

static bool ident(Parser *p, char *out, size_t size, const char *what) {
  char b[64];
  if (p->tok.kind != TK_IDENT) {
    error_at(p, p->tok.pos, "expected %s, found %s", what, found(p, b, sizeof b));
    return false;
  }
  if (p->tok.len >= size) {
    error_at(p, p->tok.pos, "expected %s of at most %zu characters", what, size - 1);
    return false;
  }
  memcpy(out, p->text + p->tok.pos, p->tok.len);
  out[p->tok.len] = 0;
  next(p);
  return true;
}

static bool integer(Parser *p, int64_t *v, const char *what) {
  bool neg = false;
  if (is(p, "-")) neg = true, next(p);
  if (p->tok.kind != TK_INT) {
    char b[64];
    error_at(p, p->tok.pos, "expected %s, found %s", what, found(p, b, sizeof b));
    return false;
  }
  *v = neg ? -p->tok.num : p->tok.num;
  next(p);
  return true;
}

/* Skips to the start of the next statement after an error. */
static void recover(Parser *p) {
  while (p->tok.kind != TK_EOF && !is(p, "op") && !is(p, "axiom") && !is(p, "const")) next(p);
}

static const char *const keywords[] = {"op", "axiom", "const", "forall", "in", "when", "and",
                                       "dim", "rank", "shape", NULL};

static bool is_keyword(const char *s) {
  for (int i = 0; keywords[i]; i++)
    if (!strcmp(s, keywords[i])) return true;
  return false;
}

static int find_decl(const Axioms *ax, const char *name) {
  for (int i = 0; i < ax->n_decls; i++)
    if (!strcmp(ax->decls[i].name, name)) return i;
  return -1;
}

static int find_const(const Parser *p, const char *name) {
  for (int i = 0; i < p->n_consts; i++)
    if (!strcmp(p->const_names[i], name)) return i;
  return -1;
}

/* ---- const ---- */

static void parse_const(Parser *p) {
  next(p);
  char name[24];
  int64_t v;
  size_t at = p->tok.pos;
  if (!ident(p, name, sizeof name, "a constant name") || !expect(p, "=", "'='") ||
      !integer(p, &v, "an integer"))
    return recover(p);
  if (find_const(p, name) >= 0 || find_decl(p->ax, name) >= 0 || is_keyword(name))
    return error_at(p, at, "expected a new name, found '%s' (already defined)", name), recover(p);
  if (p->n_consts == 64) return error_at(p, at, "expected at most 64 constants"), recover(p);
  snprintf(p->const_names[p->n_consts], sizeof p->const_names[0], "%s", name);
  p->const_values[p->n_consts++] = v;
}

/* ---- op declarations ---- */

static int kind_by_axiom_name(const char *name) {
  for (int k = 0; k < OP__COUNT; k++) {
    const char *an = op_def((OpKind)k)->axiom_name;
    if (an && !strcmp(an, name)) return k;
  }
  return -1;
}

static bool parse_param_ref(Parser *p, AxDecl *dc, int i) {
  char pname[32];
  size_t at = p->tok.pos;
  if (!ident(p, pname, sizeof pname, "a registry parameter name")) return false;
  const OpDef *def = op_def(dc->kind);
  int pi = param_index(dc->kind, pname);
  if (pi < 0) {
    char list[256] = "";
    for (int k = 0; k < def->n_params; k++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "",
               def->params[k].name);
    error_at(p, at, "expected a parameter of %s (%s), found '%s'", def->name,
             *list ? list : "it has none", pname);
    return false;
  }
  const OpParam *op = &def->params[pi];
  int elem = -1;
  if (is(p, ".")) {
    next(p);
    int64_t e;
    size_t eat = p->tok.pos;
    if (!integer(p, &e, "an element index")) return false;
    int max = op->type == PARAM_INTS ? (op->len ? op->len : TEQ_MAX_PARAM_LEN) : 0;
    if (e < 0 || e >= max) {
      error_at(p, eat, "expected an element index below %d for '%s', found %lld", max, pname,
               (long long)e);
      return false;
    }
    elem = (int)e;
    if (elem + 1 > dc->list_len[pi]) dc->list_len[pi] = (int8_t)(elem + 1);
  } else if (op->type != PARAM_INT) {
    error_at(p, at, "expected '%s.<index>': '%s' is a %s", pname, pname,
             op->type == PARAM_INTS ? "list" : "real number, which axioms cannot name");
    return false;
  }
  dc->param[i] = (int8_t)pi;
  dc->elem[i] = (int8_t)elem;
  return true;
}

static void parse_op(Parser *p) {
  next(p);
  AxDecl dc;
  memset(&dc, 0, sizeof dc);
  dc.line = 0;
  size_t at = p->tok.pos, reg_at;
  if (!ident(p, dc.name, sizeof dc.name, "an operator symbol") || !expect(p, "=", "'='"))
    return recover(p);
  if (find_decl(p->ax, dc.name) >= 0 || find_const(p, dc.name) >= 0 || is_keyword(dc.name))
    return error_at(p, at, "expected a new name, found '%s' (already defined)", dc.name),
           recover(p);
  reg_at = p->tok.pos;
  if (!ident(p, dc.axiom_name, sizeof dc.axiom_name, "a registry axiom name")) return recover(p);
  int k = kind_by_axiom_name(dc.axiom_name);
  if (k < 0)
    return error_at(p, reg_at, "expected the axiom_name of a registry operator, found '%s'",
                    dc.axiom_name), recover(p);
  dc.kind = (OpKind)k;
  const OpDef *def = op_def(dc.kind);
  dc.n_out = 1;
  if (is(p, ".")) {
    next(p);
    int64_t o, n;
    if (!integer(p, &o, "an output index") || !expect(p, "/", "'/' and the number of outputs") ||
        !integer(p, &n, "the number of outputs"))
      return recover(p);
    if (n < def->n_out_min || n > def->n_out_max || o < 0 || o >= n)
      return error_at(p, reg_at, "expected an output below %lld of %d..%d outputs for %s",
                      (long long)n, def->n_out_min, def->n_out_max, def->name), recover(p);
    dc.out = (int)o, dc.n_out = (int)n;
  }
  if (is(p, "[")) {
    next(p);
    for (;;) {
      if (dc.n_iargs == AX_MAX_IARGS)
        return error_at(p, p->tok.pos, "expected at most %d integer arguments", AX_MAX_IARGS),
               recover(p);
      if (!parse_param_ref(p, &dc, dc.n_iargs++)) return recover(p);
      if (is(p, "]")) break;
      if (!expect(p, ",", "',' or ']'")) return recover(p);
    }
    next(p);
  }
  if (!expect(p, "(", "'(' and the tensor arguments")) return recover(p);
  while (!is(p, ")")) {
    char tname[24];
    if (!ident(p, tname, sizeof tname, "a tensor argument name")) return recover(p);
    if (dc.n_targs == AX_MAX_TARGS)
      return error_at(p, p->tok.pos, "expected at most %d tensor arguments", AX_MAX_TARGS),
             recover(p);
    dc.n_targs++;
    if (is(p, ")")) break;
    if (!expect(p, ",", "',' or ')'")) return recover(p);
  }
  next(p);
  if (dc.n_targs < def->n_in_min || (def->n_in_max >= 0 && dc.n_targs > def->n_in_max))
    return error_at(p, reg_at, "expected %d to %d tensor arguments for %s, found %d",
                    def->n_in_min, def->n_in_max, def->name, dc.n_targs), recover(p);
  params_default(dc.kind, &dc.defaults);
  void *grown = realloc(p->ax->decls, (size_t)(p->ax->n_decls + 1) * sizeof *p->ax->decls);
  if (!grown) return;
  p->ax->decls = grown;
  p->ax->decls[p->ax->n_decls++] = dc;
}

/* ---- terms and integer expressions ---- */

static int find_var(const Axiom *a, const char *name) {
  for (int i = 0; i < a->n_vars; i++)
    if (!strcmp(a->vars[i].name, name)) return i;
  return -1;
}

/* Gives variable v the sort s, or reports the clash. */
static bool use_var(Parser *p, int v, Sort s, size_t at) {
  AxVar *var = &p->cur->vars[v];
  if (var->sort == SORT_NONE) var->sort = s;
  if (var->sort == s) return true;
  error_at(p, at, "expected %s, found '%s', which is used as %s elsewhere",
           s == SORT_INT ? "an integer" : "a tensor", var->name,
           var->sort == SORT_INT ? "an integer" : "a tensor");
  return false;
}

static IExpr *new_iexpr(Parser *p, IKind k) {
  IExpr *e = arena_alloc(&p->ax->arena, sizeof *e);
  if (e) e->kind = k;
  return e;
}

static IExpr *parse_isum(Parser *p);

static IExpr *parse_ifactor(Parser *p) {
  char b[64];
  if (p->tok.kind == TK_INT) {
    IExpr *e = new_iexpr(p, I_NUM);
    if (e) e->num = p->tok.num;
    next(p);
    return e;
  }
  if (is(p, "-")) {
    next(p);
    IExpr *e = new_iexpr(p, I_NEG);
    if (e && !(e->a = parse_ifactor(p))) return NULL;
    return e;
  }
  if (is(p, "(")) {
    next(p);
    IExpr *e = parse_isum(p);
    if (!e || !expect(p, ")", "')'")) return NULL;
    return e;
  }
  if (is(p, "dim") || is(p, "rank") || is(p, "shape")) {
    bool dim = is(p, "dim");
    IExpr *e = new_iexpr(p, dim ? I_DIM : is(p, "rank") ? I_RANK : I_SHAPE);
    next(p);
    char name[24];
    if (!e || !expect(p, "(", "'('")) return NULL;
    size_t at = p->tok.pos;
    if (!ident(p, name, sizeof name, "a tensor variable")) return NULL;
    if ((e->var = find_var(p->cur, name)) < 0)
      return error_at(p, at, "expected a variable bound by forall, found '%s'", name), NULL;
    if (!use_var(p, e->var, SORT_TENSOR, at)) return NULL;
    if (dim && (!expect(p, ",", "',' and an axis") || !(e->a = parse_isum(p)))) return NULL;
    if (!expect(p, ")", "')'")) return NULL;
    return e;
  }
  if (p->tok.kind == TK_IDENT) {
    char name[24];
    size_t at = p->tok.pos;
    if (!ident(p, name, sizeof name, "a name")) return NULL;
    int c = find_const(p, name);
    if (c >= 0) {
      IExpr *e = new_iexpr(p, I_NUM);
      if (e) e->num = p->const_values[c];
      return e;
    }
    int v = find_var(p->cur, name);
    if (v < 0)
      return error_at(p, at, "expected a variable bound by forall or a constant, found '%s' "
                      "(unbound)", name), NULL;
    if (!use_var(p, v, SORT_INT, at)) return NULL;
    IExpr *e = new_iexpr(p, I_VAR);
    if (e) e->var = v;
    return e;
  }
  error_at(p, p->tok.pos, "expected an integer expression, found %s", found(p, b, sizeof b));
  return NULL;
}

static IExpr *parse_iterm(Parser *p) {
  IExpr *e = parse_ifactor(p);
  while (e && (is(p, "*") || is(p, "/") || is(p, "%"))) {
    IKind k = is(p, "*") ? I_MUL : is(p, "/") ? I_DIV : I_MOD;
    next(p);
    IExpr *o = new_iexpr(p, k);
    if (!o || !(o->b = parse_ifactor(p))) return NULL;
    o->a = e, e = o;
  }
  return e;
}

static IExpr *parse_isum(Parser *p) {
  IExpr *e = parse_iterm(p);
  while (e && (is(p, "+") || is(p, "-"))) {
    IKind k = is(p, "+") ? I_ADD : I_SUB;
    next(p);
    IExpr *o = new_iexpr(p, k);
    if (!o || !(o->b = parse_iterm(p))) return NULL;
    o->a = e, e = o;
  }
  return e;
}

static Term *parse_term(Parser *p) {
  char name[32], b[64];
  size_t at = p->tok.pos;
  if (!ident(p, name, sizeof name, "a tensor variable or an operator")) return NULL;
  Term *t = arena_alloc(&p->ax->arena, sizeof *t);
  if (!t) return NULL;
  if (!is(p, "[") && !is(p, "(")) {
    t->decl = -1;
    t->var = find_var(p->cur, name);
    if (t->var < 0) {
      if (find_decl(p->ax, name) >= 0)
        error_at(p, p->tok.pos, "expected '(' after operator '%s', found %s", name,
                 found(p, b, sizeof b));
      else
        error_at(p, at, "expected a variable bound by forall, found '%s' (unbound)", name);
      return NULL;
    }
    return use_var(p, t->var, SORT_TENSOR, at) ? t : NULL;
  }
  t->decl = find_decl(p->ax, name);
  if (t->decl < 0) {
    error_at(p, at, "expected an operator declared with 'op', found '%s' (unknown operator)",
             name);
    return NULL;
  }
  const AxDecl *dc = &p->ax->decls[t->decl];
  int ni = 0, nt = 0;
  if (is(p, "[")) {
    next(p);
    while (!is(p, "]")) {
      if (ni == AX_MAX_IARGS) return error_at(p, p->tok.pos, "expected ']'"), NULL;
      if (!(t->iargs[ni++] = parse_isum(p))) return NULL;
      if (is(p, "]")) break;
      if (!expect(p, ",", "',' or ']'")) return NULL;
    }
    next(p);
  }
  if (ni != dc->n_iargs)
    return error_at(p, at, "expected %d integer arguments for '%s', found %d", dc->n_iargs, name,
                    ni), NULL;
  if (!expect(p, "(", "'(' and the tensor arguments")) return NULL;
  while (!is(p, ")")) {
    if (nt == AX_MAX_TARGS || p->tok.kind == TK_EOF) {
      error_at(p, p->tok.pos, "expected ')' (unbalanced parentheses), found %s",
               found(p, b, sizeof b));
      return NULL;
    }
    if (!(t->targs[nt++] = parse_term(p))) return NULL;
    if (is(p, ")")) break;
    if (!is(p, ",")) {
      error_at(p, p->tok.pos, "expected ',' or ')' (unbalanced parentheses?), found %s",
               found(p, b, sizeof b));
      return NULL;
    }
    next(p);
  }
  next(p);
  if (nt != dc->n_targs)
    return error_at(p, at, "expected %d tensor arguments for '%s', found %d (wrong arity)",
                    dc->n_targs, name, nt), NULL;
  return t;
}

/* ---- axioms ---- */

static bool parse_domain(Parser *p, AxVar *vars[], int n) {
  int64_t dom[AX_MAX_DOMAIN];
  int nd = 0;
  if (is(p, "{")) {
    next(p);
    for (;;) {
      int64_t v;
      IExpr *e;
      size_t at = p->tok.pos;
      if (!(e = parse_ifactor(p))) return false;
      if (!iexpr_eval(e, &(Binding){0}, &v))
        return error_at(p, at, "expected a constant value"), false;
      if (nd == AX_MAX_DOMAIN)
        return error_at(p, at, "expected at most %d values", AX_MAX_DOMAIN), false;
      dom[nd++] = v;
      if (is(p, "}")) break;
      if (!expect(p, ",", "',' or '}'")) return false;
    }
    next(p);
  } else {
    int64_t lo, hi;
    size_t at = p->tok.pos;
    if (!integer(p, &lo, "'{' or a range lo..hi") || !expect(p, "..", "'..'") ||
        !integer(p, &hi, "the end of the range"))
      return false;
    if (hi < lo || hi - lo >= AX_MAX_DOMAIN)
      return error_at(p, at, "expected a range of 1 to %d values", AX_MAX_DOMAIN), false;
    for (int64_t v = lo; v <= hi; v++) dom[nd++] = v;
  }
  for (int i = 0; i < n; i++) {
    vars[i]->sort = SORT_INT;
    vars[i]->n_domain = nd;
    memcpy(vars[i]->domain, dom, sizeof dom);
  }
  return true;
}

static bool parse_binders(Parser *p, Axiom *a) {
  for (;;) {
    AxVar *group[AX_MAX_VARS];
    int n = 0;
    while (p->tok.kind == TK_IDENT && !is(p, "in")) {
      char name[24];
      size_t at = p->tok.pos;
      if (!ident(p, name, sizeof name, "a variable")) return false;
      if (is_keyword(name) || find_decl(p->ax, name) >= 0 || find_const(p, name) >= 0 ||
          find_var(a, name) >= 0)
        return error_at(p, at, "expected a new variable name, found '%s'", name), false;
      if (a->n_vars == AX_MAX_VARS)
        return error_at(p, at, "expected at most %d variables", AX_MAX_VARS), false;
      AxVar *v = &a->vars[a->n_vars++];
      snprintf(v->name, sizeof v->name, "%s", name);
      group[n++] = v;
    }
    char b[64];
    if (!n) return error_at(p, p->tok.pos, "expected a variable, found %s", found(p, b, sizeof b)), false;
    if (is(p, "in")) {
      next(p);
      if (!parse_domain(p, group, n)) return false;
    }
    if (is(p, ".")) return next(p), true;
    if (!expect(p, ",", "',', 'in' or '.' after the variables")) return false;
  }
}

static bool parse_cond(Parser *p, Cond *c) {
  static const char *const ops[] = {"=", "!=", "<", "<=", ">", ">="};
  if (!(c->a = parse_isum(p))) return false;
  for (int i = 0; i < 6; i++)
    if (is(p, ops[i])) {
      c->op = (CmpOp)i;
      next(p);
      return (c->b = parse_isum(p)) != NULL;
    }
  char b[64];
  error_at(p, p->tok.pos, "expected a comparison (=, !=, <, <=, >, >=), found %s",
           found(p, b, sizeof b));
  return false;
}

static void term_vars(const Term *t, bool *used);

static void iexpr_vars(const IExpr *e, bool *used) {
  if (!e) return;
  if (e->kind == I_VAR || e->kind == I_DIM || e->kind == I_RANK || e->kind == I_SHAPE)
    used[e->var] = true;
  iexpr_vars(e->a, used);
  iexpr_vars(e->b, used);
}

/* Variables a match of t binds: tensor variables and integer variables in
 * bare argument positions (an expression there can only be checked). */
static void term_binds(const Term *t, bool *bound) {
  if (t->decl < 0) {
    bound[t->var] = true;
    return;
  }
  for (int i = 0; i < AX_MAX_IARGS && t->iargs[i]; i++)
    if (t->iargs[i]->kind == I_VAR) bound[t->iargs[i]->var] = true;
  for (int i = 0; i < AX_MAX_TARGS && t->targs[i]; i++) term_binds(t->targs[i], bound);
}

static void term_vars(const Term *t, bool *used) {
  if (t->decl < 0) {
    used[t->var] = true;
    return;
  }
  for (int i = 0; i < AX_MAX_IARGS && t->iargs[i]; i++) iexpr_vars(t->iargs[i], used);
  for (int i = 0; i < AX_MAX_TARGS && t->targs[i]; i++) term_vars(t->targs[i], used);
}

/* A side can trigger when it is an operator and binds every variable. */
static bool triggers(const Axiom *a, const Term *side) {
  if (side->decl < 0) return false;
  bool bound[AX_MAX_VARS] = {0};
  term_binds(side, bound);
  for (int i = 0; i < a->n_vars; i++)
    if (!bound[i]) return false;
  return true;
}

static void parse_axiom(Parser *p, bool commented) {
  size_t at = p->tok.pos;
  next(p);
  void *grown = realloc(p->ax->axioms, (size_t)(p->ax->n_axioms + 1) * sizeof *p->ax->axioms);
  if (!grown) return;
  p->ax->axioms = grown;
  Axiom *a = &p->ax->axioms[p->ax->n_axioms];
  memset(a, 0, sizeof *a);
  p->cur = a;
  int line, col;
  size_t ls;
  where(p, at, &line, &col, &ls);
  a->line = line;
  size_t name_at = p->tok.pos;
  if (!ident(p, a->name, sizeof a->name, "an axiom name") || !expect(p, ":", "':'"))
    return recover(p);
  for (int i = 0; i < p->ax->n_axioms; i++)
    if (!strcmp(p->ax->axioms[i].name, a->name))
      return error_at(p, name_at, "expected a new axiom name, found '%s' (already used)",
                      a->name), recover(p);
  if (!commented)
    error_at(p, at, "expected a comment before axiom '%s' saying why it holds", a->name);
  if (is(p, "forall")) {
    next(p);
    if (!parse_binders(p, a)) return recover(p);
  }
  if (!(a->lhs = parse_term(p)) || !expect(p, "=", "'=' between the two sides") ||
      !(a->rhs = parse_term(p)))
    return recover(p);
  if (is(p, "when")) {
    do {
      next(p);
      if (a->n_conds == AX_MAX_CONDS)
        return error_at(p, p->tok.pos, "expected at most %d conditions", AX_MAX_CONDS),
               recover(p);
      if (!parse_cond(p, &a->conds[a->n_conds++])) return recover(p);
    } while (is(p, "and"));
  }
  if (p->tok.kind != TK_EOF && !is(p, "op") && !is(p, "axiom") && !is(p, "const")) {
    char b[64];
    return error_at(p, p->tok.pos, "expected 'when', 'and' or the next statement, found %s%s",
                    found(p, b, sizeof b), is(p, ")") ? " (unbalanced parentheses)" : ""),
           recover(p);
  }
  bool used[AX_MAX_VARS] = {0};
  term_vars(a->lhs, used);
  term_vars(a->rhs, used);
  for (int i = 0; i < a->n_vars; i++) {
    if (!used[i]) return error_at(p, name_at, "expected variable '%s' to be used", a->vars[i].name);
    if (a->vars[i].sort == SORT_INT && !a->vars[i].n_domain)
      return error_at(p, name_at, "expected 'in {...}' giving the values validation tries for "
                      "integer variable '%s'", a->vars[i].name);
  }
  a->forward = triggers(a, a->lhs);
  a->backward = triggers(a, a->rhs);
  p->ax->n_axioms++;
}

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325u;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3u;
  return h;
}

int axioms_parse(const char *name, const char *text, size_t len, Axioms **out, Diag *d) {
  Axioms *ax = calloc(1, sizeof *ax);
  if (!ax || !(ax->path = strdup(name))) {
    free(ax);
    return TEQ_ERR_NOMEM;
  }
  snprintf(ax->hash, sizeof ax->hash, "%016" PRIx64, fnv1a(text, len));
  Parser p = {.name = name, .text = text, .len = len, .d = d, .ax = ax};
  next(&p);
  while (p.tok.kind != TK_EOF) {
    bool commented = p.comment_before;
    p.comment_before = false;
    if (is(&p, "op")) parse_op(&p);
    else if (is(&p, "const")) parse_const(&p);
    else if (is(&p, "axiom")) parse_axiom(&p, commented);
    else {
      char b[64];
      error_at(&p, p.tok.pos, "expected 'op', 'const' or 'axiom', found %s%s",
               found(&p, b, sizeof b), is(&p, ")") ? " (unbalanced parentheses)" : "");
      next(&p);
      recover(&p);
    }
  }
  if (!p.n_errors && !ax->n_axioms) error_at(&p, len, "expected at least one axiom");
  if (p.n_errors) {
    axioms_free(ax);
    return TEQ_ERR_INPUT;
  }
  *out = ax;
  return TEQ_OK;
}

int axioms_load(const char *path, Axioms **out, Diag *d) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    diag_error(d, "%s: cannot read: %s", path, strerror(errno));
    return TEQ_ERR_IO;
  }
  char *text = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len + 4096 > cap) {
      char *g = realloc(text, cap = cap * 2 + 8192);
      if (!g) {
        free(text);
        fclose(f);
        return TEQ_ERR_NOMEM;
      }
      text = g;
    }
    size_t n = fread(text + len, 1, cap - len, f);
    len += n;
    if (n == 0) break;
  }
  bool failed = ferror(f);
  fclose(f);
  if (failed) {
    free(text);
    diag_error(d, "%s: cannot read", path);
    return TEQ_ERR_IO;
  }
  int rc = axioms_parse(path, text, len, out, d);
  free(text);
  return rc;
}

void axioms_free(Axioms *ax) {
  if (!ax) return;
  arena_free(ax->arena);
  free(ax->decls);
  free(ax->axioms);
  free(ax->path);
  free(ax);
}

int axioms_count(const Axioms *ax) { return ax->n_axioms; }
const char *axioms_hash(const Axioms *ax) { return ax->hash; }

bool axioms_binds(const Axioms *ax, const char *axiom_name) {
  for (int i = 0; i < ax->n_decls; i++)
    if (!strcmp(ax->decls[i].axiom_name, axiom_name)) return true;
  return false;
}

/* ---- integer expressions ---- */

bool iexpr_eval(const IExpr *e, const Binding *b, int64_t *v) {
  int64_t x = 0, y = 0;
  switch (e->kind) {
  case I_NUM: *v = e->num; return true;
  case I_VAR:
    if (!b->bound[e->var]) return false;
    *v = b->ival[e->var];
    return true;
  case I_SHAPE: return false;
  case I_RANK:
    if (!b->bound[e->var] || !b->shape[e->var]) return false;
    *v = b->shape[e->var]->ndim;
    return true;
  case I_DIM:
    if (!b->bound[e->var] || !b->shape[e->var] || !iexpr_eval(e->a, b, &x)) return false;
    if (x < 0 || x >= b->shape[e->var]->ndim) return false;
    *v = b->shape[e->var]->d[x];
    return true;
  case I_NEG:
    if (!iexpr_eval(e->a, b, &x)) return false;
    *v = -x;
    return true;
  default: break;
  }
  if (!iexpr_eval(e->a, b, &x) || !iexpr_eval(e->b, b, &y)) return false;
  switch (e->kind) {
  case I_ADD: *v = x + y; return true;
  case I_SUB: *v = x - y; return true;
  case I_MUL: *v = x * y; return true;
  case I_DIV:
    if (y == 0) return false;
    *v = x / y;
    return true;
  case I_MOD:
    if (y == 0) return false;
    *v = x % y;
    return true;
  default: return false;
  }
}

bool cond_holds(const Cond *c, const Binding *b) {
  int64_t x, y;
  const IExpr *l = c->a, *r = c->b;
  if (l->kind == I_SHAPE || r->kind == I_SHAPE) {
    if (l->kind != r->kind || !b->shape[l->var] || !b->shape[r->var]) return false;
    bool same = shape_equal(b->shape[l->var], b->shape[r->var]);
    return c->op == CMP_EQ ? same : c->op == CMP_NE ? !same : false;
  }
  if (!iexpr_eval(l, b, &x) || !iexpr_eval(r, b, &y)) return false;
  switch (c->op) {
  case CMP_EQ: return x == y;
  case CMP_NE: return x != y;
  case CMP_LT: return x < y;
  case CMP_LE: return x <= y;
  case CMP_GT: return x > y;
  case CMP_GE: return x >= y;
  }
  return false;
}

bool conds_hold(const Axiom *a, const Binding *b) {
  for (int i = 0; i < a->n_conds; i++)
    if (!cond_holds(&a->conds[i], b)) return false;
  return true;
}

/* ---- declarations against registry parameters ---- */

void decl_params(const AxDecl *dc, const int64_t *iargs, Params *p) {
  *p = dc->defaults;
  for (int i = 0; i < TEQ_MAX_PARAMS; i++)
    if (dc->list_len[i]) p->v[i].n = dc->list_len[i];
  for (int i = 0; i < dc->n_iargs; i++) p->v[dc->param[i]].i[dc->elem[i] < 0 ? 0 : dc->elem[i]] = iargs[i];
}

bool decl_matches(const AxDecl *dc, const Params *p, int64_t *iargs) {
  const OpDef *def = op_def(dc->kind);
  for (int k = 0; k < def->n_params; k++) {
    bool named = false;
    for (int i = 0; i < dc->n_iargs && !named; i++) named = dc->param[i] == k;
    if (!named) {
      if (memcmp(&p->v[k], &dc->defaults.v[k], sizeof p->v[k])) return false;
    } else if (def->params[k].type == PARAM_INTS) {
      if (p->v[k].n != dc->list_len[k]) return false;
      /* An element the declaration skips keeps its default. */
      for (int e = 0; e < dc->list_len[k]; e++) {
        bool has = false;
        for (int i = 0; i < dc->n_iargs && !has; i++) has = dc->param[i] == k && dc->elem[i] == e;
        if (!has && p->v[k].i[e] != def->params[k].def) return false;
      }
    }
  }
  for (int i = 0; i < dc->n_iargs; i++) iargs[i] = p->v[dc->param[i]].i[dc->elem[i] < 0 ? 0 : dc->elem[i]];
  return true;
}

int axioms_decl_for(const Axioms *ax, OpKind kind, int out, int n_out, const Params *p) {
  int64_t iargs[AX_MAX_IARGS];
  for (int i = 0; i < ax->n_decls; i++) {
    const AxDecl *dc = &ax->decls[i];
    if (dc->kind == kind && dc->out == out && dc->n_out == n_out && decl_matches(dc, p, iargs))
      return i;
  }
  return -1;
}

bool infer_output(OpKind kind, const Params *p, int n_in, const Shape *in, int n_out, int out,
                  Shape *result) {
  const OpDef *def = op_def(kind);
  if (!def->infer_shape || n_out > 2 * TEQ_MAX_PARAM_LEN) return false;
  for (int i = 0; i < n_in; i++)
    if (!shape_is_known(&in[i])) return false;
  Node n;
  memset(&n, 0, sizeof n);
  n.kind = kind;
  n.n_in = n_in, n.n_out = n_out;
  n.params = *p;
  Shape outs[2 * TEQ_MAX_PARAM_LEN];
  if (params_check(kind, p, NULL) != TEQ_OK) return false;
  if (def->infer_shape(&n, in, outs, NULL) != TEQ_OK) return false;
  *result = outs[out];
  return true;
}
