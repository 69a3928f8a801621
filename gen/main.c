/* main.c: the gen-rules command.
 *
 *   gen-rules [--depth N] [--ops LIST] [--db ruledb.sqlite] [--threads N]
 *             [--seed S] [--quiet]
 *
 * Progress goes to stderr, the summary to stdout. Bad arguments, unknown
 * operators and databases that are not Teq's exit with status 2. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen/gen.h"
#include "runtime/err.h"

static const char usage[] =
  "usage: gen-rules [--depth N] [--ops LIST] [--db FILE] [--threads N] [--seed S] [--quiet]\n"
  "  --depth N     operators per graph, 1 to 5 (default 3)\n"
  "  --ops LIST    operators to enumerate: a comma list (matmul,ewadd) or edits of\n"
  "                TASO's set (+sigmoid,-maxpool); extras: unary element-wise\n"
  "                operators, gemm (transposed layouts), batch_matmul,\n"
  "                dilated_conv, matmul_relu (matmul with a fused relu)\n"
  "  --db FILE     rule database (default ruledb.sqlite)\n"
  "  --threads N   worker threads for enumeration and buckets (default: online CPUs)\n"
  "  --seed S      random inputs (default 1)\n"
  "  --quiet       no progress on stderr\n";

static int bad(const char *fmt, const char *arg) {
  fprintf(stderr, "gen-rules: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n%s", usage);
  return 2;
}

int main(int argc, char **argv) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  GenOptions opt = {
    .depth = 3, .db_path = "ruledb.sqlite", .threads = cpus > 0 ? (int)cpus : 1, .seed = 1,
    .progress = stderr,
  };
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    long long n;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    } else if (!strcmp(a, "--quiet")) {
      opt.quiet = true;
      continue;
    }
    static const char *const with_value[] = {"--depth", "--threads", "--seed", "--ops", "--db"};
    bool known = false;
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
      known |= !strcmp(a, with_value[k]);
    if (!known) return bad(strncmp(a, "-", 1) ? "unexpected argument '%s'" : "unknown option '%s'", a);
    if (!val) return bad("%s needs a value", a);
    i++;
    if (!strcmp(a, "--depth")) {
      if (!teq_parse_int(val, 1, 5, &n)) return bad("--depth '%s': expected 1 to 5", val);
      opt.depth = (int)n;
    } else if (!strcmp(a, "--threads")) {
      if (!teq_parse_int(val, 1, 64, &n)) return bad("--threads '%s': expected 1 to 64", val);
      opt.threads = (int)n;
    } else if (!strcmp(a, "--seed")) {
      if (!teq_parse_int(val, 0, INT64_MAX, &n)) return bad("--seed '%s': expected an integer >= 0", val);
      opt.seed = (uint64_t)n;
    } else if (!strcmp(a, "--ops")) {
      opt.ops = val;
    } else {
      if (!*val) return bad("--db: empty path%s", "");
      opt.db_path = val;
    }
  }
  Diag d;
  diag_init(&d);
  GenSummary sum;
  int rc = gen_rules_run(&opt, &sum, &d);
  if (rc) {
    if (!d.n_errors) diag_error(&d, "gen-rules: %s", teq_strerror(rc));
    diag_flush(&d, stderr);
    diag_fini(&d);
    return teq_exit_status(rc);
  }
  diag_flush(&d, stderr);
  diag_fini(&d);
  gen_summary_print(&opt, &sum, stdout);
  return 0;
}
