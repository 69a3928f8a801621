/* err.c: error codes to exit statuses and text, and the Diag message buffer.
 * Messages are kept as lines "error: ..." / "warning: ..." in one growing
 * string; if an allocation fails the message goes to stderr instead, so no
 * message is ever lost silently. */
#include "runtime/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int teq_exit_status(int rc) {
  switch (rc) {
  case TEQ_OK: return 0;
  case TEQ_ERR_INPUT:
  case TEQ_ERR_UNSUPPORTED:
  case TEQ_ERR_IO: return 2;
  default: return 1;
  }
}

const char *teq_strerror(int rc) {
  switch (rc) {
  case TEQ_OK: return "ok";
  case TEQ_ERR_INPUT: return "invalid input";
  case TEQ_ERR_UNSUPPORTED: return "unsupported input";
  case TEQ_ERR_NOMEM: return "out of memory";
  case TEQ_ERR_IO: return "i/o error";
  case TEQ_ERR_INTERNAL: return "internal error";
  default: return "unknown error";
  }
}

void diag_init(Diag *d) { memset(d, 0, sizeof *d); }

void diag_fini(Diag *d) {
  free(d->text);
  memset(d, 0, sizeof *d);
}

/* Messages longer than this are cut; a located one-line message never is. */
#define DIAG_MESSAGE_MAX 2048

static void diag_append(Diag *d, const char *prefix, const char *fmt, va_list ap) {
  char msg[DIAG_MESSAGE_MAX];
  vsnprintf(msg, sizeof msg, fmt ? fmt : "(no message)", ap);
  size_t np = strlen(prefix), nm = strlen(msg), need = d->len + np + nm + 2;
  if (need > d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 256;
    while (cap < need) cap *= 2;
    char *t = realloc(d->text, cap);
    if (!t) {
      fprintf(stderr, "%s%s\n", prefix, msg);
      return;
    }
    d->text = t;
    d->cap = cap;
  }
  char *line = d->text + d->len;
  memcpy(line, prefix, np);
  memcpy(line + np, msg, nm);
  line[np + nm] = '\n';
  line[np + nm + 1] = '\0';
  d->len += np + nm + 1;
  if (d->echo && prefix[0] == 'w') fputs(line, d->echo);
}

int diag_verror(Diag *d, const char *fmt, va_list ap) {
  if (d) {
    d->n_errors++;
    diag_append(d, "error: ", fmt, ap);
  }
  return TEQ_ERR_INPUT;
}

int diag_error(Diag *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_verror(d, fmt, ap);
  va_end(ap);
  return TEQ_ERR_INPUT;
}

void diag_warn(Diag *d, const char *fmt, ...) {
  if (!d) return;
  d->n_warnings++;
  va_list ap;
  va_start(ap, fmt);
  diag_append(d, "warning: ", fmt, ap);
  va_end(ap);
}

void diag_flush(Diag *d, FILE *f) {
  if (d->len) {
    /* Warnings already echoed to f are not printed twice. */
    if (d->echo == f) {
      for (char *line = d->text; *line;) {
        char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) + 1 : strlen(line);
        if (strncmp(line, "warning: ", 9) != 0) fwrite(line, 1, n, f);
        line += n;
      }
    } else {
      fputs(d->text, f);
    }
  }
  d->len = 0;
  if (d->text) d->text[0] = '\0';
}

const char *diag_last(const Diag *d) {
  if (!d->len) return "";
  const char *p = d->text + d->len - 1; /* the trailing newline */
  while (p > d->text && p[-1] != '\n') p--;
  return p;
}

bool teq_parse_int(const char *s, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}
