/* main.c: the verify-rules command.
 *
 *   verify-rules [--db ruledb.sqlite] [--timeout-ms T] [--jobs N] [--seed S]
 *                [--quiet] specs/ops.axioms
 *   verify-rules --check-axioms [--timeout-ms T] [--jobs N] [--axiom-budget-ms B]
 *                [--no-validate] [--no-redundancy] [--no-consistency] specs/ops.axioms
 *
 * Progress goes to stderr, the summary or report to stdout. A malformed
 * axiom file, a bad argument or a database that gen-rules did not make
 * exits with status 2; --check-axioms exits 1 when an axiom is false. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/err.h"
#include "verify/verify.h"

static const char usage[] =
  "usage: verify-rules [--db FILE] [--timeout-ms T] [--jobs N] [--seed S] [--quiet] AXIOMS\n"
  "       verify-rules --check-axioms [--timeout-ms T] [--jobs N] [--axiom-budget-ms B]\n"
  "                    [--no-validate] [--no-redundancy] [--no-consistency] AXIOMS\n"
  "  --db FILE         rule database made by gen-rules (default ruledb.sqlite)\n"
  "  --timeout-ms T    per rule, or per redundancy/consistency query (default 2000)\n"
  "  --jobs N          worker threads, one Z3 context each (default: online CPUs)\n"
  "  --seed S          random inputs of counterexamples (default 1)\n"
  "  --check-axioms    check the axioms: exact validation on small shapes,\n"
  "                    redundancy, consistency; exits 1 if one is false\n"
  "  --axiom-budget-ms B  validation time per axiom (default 30000)\n"
  "  --quiet           no progress on stderr\n";

static int bad(const char *fmt, const char *arg) {
  fprintf(stderr, "verify-rules: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n%s", usage);
  return 2;
}

static int finish(Diag *d, int rc) {
  if (rc && !d->n_errors) diag_error(d, "verify-rules: %s", teq_strerror(rc));
  diag_flush(d, stderr);
  diag_fini(d);
  return rc ? teq_exit_status(rc) : 0;
}

int main(int argc, char **argv) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  VerifyOptions opt = {.db_path = "ruledb.sqlite", .timeout_ms = 2000,
                       .jobs = cpus > 0 ? (int)cpus : 1, .seed = 1, .progress = stderr};
  CheckOptions chk = {.validate = true, .redundancy = true, .consistency = true,
                      .progress = stderr};
  bool check = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    long long n;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    } else if (!strcmp(a, "--quiet")) {
      opt.quiet = chk.quiet = true;
      continue;
    } else if (!strcmp(a, "--check-axioms")) {
      check = true;
      continue;
    } else if (!strcmp(a, "--no-validate")) {
      chk.validate = false;
      continue;
    } else if (!strcmp(a, "--no-redundancy")) {
      chk.redundancy = false;
      continue;
    } else if (!strcmp(a, "--no-consistency")) {
      chk.consistency = false;
      continue;
    }
    if (strncmp(a, "--", 2)) {
      if (opt.axioms_path) return bad("unexpected argument '%s' (one axioms file)", a);
      opt.axioms_path = a;
      continue;
    }
    if (!val) return bad("%s needs a value", a);
    i++;
    if (!strcmp(a, "--timeout-ms")) {
      if (!teq_parse_int(val, 1, 3600000, &n)) return bad("--timeout-ms '%s': expected 1 to 3600000", val);
      opt.timeout_ms = (int)n;
    } else if (!strcmp(a, "--axiom-budget-ms")) {
      if (!teq_parse_int(val, 1, 3600000, &n)) return bad("--axiom-budget-ms '%s': expected 1 to 3600000", val);
      chk.budget_ms = (int)n;
    } else if (!strcmp(a, "--jobs")) {
      if (!teq_parse_int(val, 1, 64, &n)) return bad("--jobs '%s': expected 1 to 64", val);
      opt.jobs = (int)n;
    } else if (!strcmp(a, "--seed")) {
      if (!teq_parse_int(val, 0, INT64_MAX, &n)) return bad("--seed '%s': expected an integer >= 0", val);
      opt.seed = (uint64_t)n;
    } else if (!strcmp(a, "--db")) {
      if (!*val) return bad("--db: empty path%s", "");
      opt.db_path = val;
    } else {
      return bad("unknown option '%s'", a);
    }
  }
  if (!opt.axioms_path) return bad("no axioms file given%s", "");
  Diag d;
  diag_init(&d);
  if (check) {
    chk.axioms_path = opt.axioms_path;
    chk.timeout_ms = opt.timeout_ms;
    chk.jobs = opt.jobs;
    int n_false = 0;
    int rc = verify_check_axioms(&chk, stdout, &n_false, &d);
    if (rc) return finish(&d, rc);
    finish(&d, 0);
    return n_false ? 1 : 0;
  }
  VerifySummary sum;
  int rc = verify_rules_run(&opt, &sum, &d);
  if (rc) return finish(&d, rc);
  finish(&d, 0);
  verify_summary_print(&opt, &sum, stdout);
  return 0;
}
