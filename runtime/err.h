/* err.h: the error codes every Teq function returns, and Diag, the sticky
 * collector of located messages.
 *
 * A function that can fail returns int: TEQ_OK (0) or one of the negative codes
 * below, and writes its out-parameters only on success. The message that says
 * *what* went wrong goes into a Diag, so a parser can report several errors
 * before its caller checks once (SQLite's pParse->nErr). Commands map
 * TEQ_ERR_INPUT and TEQ_ERR_UNSUPPORTED (bad user input) to exit status 2. */
#ifndef TEQ_RUNTIME_ERR_H
#define TEQ_RUNTIME_ERR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>

#define TEQ_API __attribute__((visibility("default")))

enum {
  TEQ_OK = 0,
  TEQ_ERR_INPUT = -1,       /* malformed user input: file, model, argument */
  TEQ_ERR_UNSUPPORTED = -2, /* well-formed, but beyond what Teq implements */
  TEQ_ERR_NOMEM = -3,       /* an allocation failed */
  TEQ_ERR_IO = -4,          /* reading or writing a file failed */
  TEQ_ERR_INTERNAL = -5,    /* a bug in Teq, reported rather than asserted */
};

/* The exit status a command returns for an error code: 0, 2 for anything
 * the user can fix (bad input, unsupported input, unreadable file), 1 else. */
TEQ_API int teq_exit_status(int rc);
TEQ_API const char *teq_strerror(int rc);

typedef struct Diag {
  int n_errors;
  int n_warnings;
  char *text;     /* every message so far, one per line; owned */
  size_t len, cap;
  FILE *echo;     /* if set, warnings are also printed here as they come */
} Diag;

TEQ_API void diag_init(Diag *d);
TEQ_API void diag_fini(Diag *d);
/* Both accept d == NULL (the message is then dropped). diag_error returns
 * TEQ_ERR_INPUT so that `return diag_error(d, ...)` reads naturally. */
TEQ_API int diag_error(Diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
TEQ_API void diag_warn(Diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
TEQ_API int diag_verror(Diag *d, const char *fmt, va_list ap);
/* Writes all messages to f and empties the text (counts stay). */
TEQ_API void diag_flush(Diag *d, FILE *f);
/* The last message written, with its newline, or "" (for tests and
 * wrappers); valid until the next call on d. */
TEQ_API const char *diag_last(const Diag *d);

/* A whole decimal integer in [lo, hi], as every command's numeric options
 * take it: "12x", "", an overflow or a value out of range is false. */
TEQ_API bool teq_parse_int(const char *s, long long lo, long long hi, long long *out);

#endif
