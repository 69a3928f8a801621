/* db.c: the SQLite side of the rule database: opening (and refusing files
 * that are not ours), schema migrations, runs, resumable work units, rules
 * in and out, and integrity checks.
 *
 * The schema is the list of migrations below; migration i takes
 * PRAGMA user_version from i to i + 1 in one transaction together with the
 * version bump, so a killed migration leaves the previous version intact.
 * Nothing is written to a file before it is known to be ours or new. Every
 * SQLite error becomes a Diag message naming the file: this is the one
 * place SQLite's result codes are turned into Teq's. The protobuf encoding
 * of a rule side is in codec.c, its text in text.c. A RuleDb is one
 * connection and is used from one thread at a time. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ruledb/ruledb.h"

/* migrations[i] takes user_version i to i + 1. Never edit a migration that
 * has shipped: add one. */
static const char *const migrations[] = {
  /* 1: runs, rules and the work units that make gen-rules resumable. */
  "CREATE TABLE runs ("
  "  id INTEGER PRIMARY KEY,"
  "  command TEXT NOT NULL,"
  "  args TEXT NOT NULL,"
  "  seed INTEGER NOT NULL,"       /* the uint64 seed, stored as its int64 bits */
  "  version TEXT NOT NULL,"
  "  started_at TEXT NOT NULL DEFAULT (datetime('now')),"
  "  finished_at TEXT,"
  "  status TEXT NOT NULL CHECK (status IN ('running', 'done')),"
  "  wall_s REAL,"
  "  peak_rss_kb INTEGER,"
  "  stats TEXT"                   /* JSON object */
  ");"
  "CREATE TABLE rules ("
  "  id INTEGER PRIMARY KEY,"
  "  key TEXT NOT NULL UNIQUE,"
  "  src BLOB NOT NULL,"           /* teq.RuleGraph */
  "  dst BLOB NOT NULL,"
  "  text TEXT NOT NULL,"
  "  status TEXT NOT NULL CHECK (status IN ('candidate', 'proved', 'refuted', 'unknown')),"
  "  depth INTEGER NOT NULL,"
  "  src_ops INTEGER NOT NULL,"
  "  dst_ops INTEGER NOT NULL,"
  "  n_outputs INTEGER NOT NULL,"
  "  run_id INTEGER REFERENCES runs(id),"
  "  created_at TEXT NOT NULL DEFAULT (datetime('now'))"
  ");"
  "CREATE INDEX rules_status ON rules(status);"
  "CREATE TABLE run_units ("
  "  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,"
  "  unit INTEGER NOT NULL,"
  "  result BLOB NOT NULL,"
  "  PRIMARY KEY (run_id, unit)"
  ");",

  /* 2: verification results (verify-rules) and measured costs (optimize). */
  "CREATE TABLE verifications ("
  "  id INTEGER PRIMARY KEY,"
  "  rule_id INTEGER NOT NULL REFERENCES rules(id),"
  "  run_id INTEGER REFERENCES runs(id),"
  "  axioms_hash TEXT NOT NULL,"
  "  result TEXT NOT NULL CHECK (result IN ('proved', 'refuted', 'unknown')),"
  "  millis REAL,"
  "  counterexample TEXT,"
  "  created_at TEXT NOT NULL DEFAULT (datetime('now'))"
  ");"
  "CREATE INDEX verifications_rule ON verifications(rule_id);"
  "CREATE TABLE costs ("
  "  device TEXT NOT NULL,"
  "  config TEXT NOT NULL,"
  "  micros REAL NOT NULL,"
  "  method TEXT NOT NULL,"
  "  algo TEXT,"
  "  measured_at TEXT DEFAULT (datetime('now')),"
  "  PRIMARY KEY (device, config)"
  ");",
};
enum { N_MIGRATIONS = (int)(sizeof migrations / sizeof migrations[0]) };

/* Statements used once per rule or unit are prepared once per RuleDb.
 * Walks (foreach) prepare their own, so a callback may use the others. */
enum {
  ST_INSERT_RULE,
  ST_COUNT_ALL,
  ST_COUNT_STATUS,
  ST_RUN_START,
  ST_RUN_FIND,
  ST_RUN_FINISH,
  ST_UNIT_STORE,
  ST_UNIT_DONE,
  ST_UNIT_CLEAR,
  ST_VERIFY_STORE,
  ST_VERIFY_STATUS,
  ST_COUNT_RUNS,
  ST_COST_STORE,
  ST__COUNT
};

static const char *const stmt_sql[ST__COUNT] = {
  [ST_INSERT_RULE] =
    "INSERT INTO rules (key, src, dst, text, status, depth, src_ops, dst_ops, n_outputs, run_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING",
  [ST_COUNT_ALL] = "SELECT count(*) FROM rules",
  [ST_COUNT_STATUS] = "SELECT count(*) FROM rules WHERE status = ?",
  [ST_RUN_START] =
    "INSERT INTO runs (command, args, seed, version, status) VALUES (?, ?, ?, ?, 'running')",
  [ST_RUN_FIND] =
    "SELECT id FROM runs WHERE command = ? AND args = ? AND seed = ? AND status = 'running'"
    " ORDER BY id DESC LIMIT 1",
  [ST_RUN_FINISH] =
    "UPDATE runs SET status = 'done', finished_at = datetime('now'), wall_s = ?,"
    " peak_rss_kb = ?, stats = ? WHERE id = ?",
  [ST_UNIT_STORE] =
    "INSERT INTO run_units (run_id, unit, result) VALUES (?, ?, ?)"
    " ON CONFLICT (run_id, unit) DO UPDATE SET result = excluded.result",
  [ST_UNIT_DONE] = "SELECT 1 FROM run_units WHERE run_id = ? AND unit = ?",
  [ST_UNIT_CLEAR] = "DELETE FROM run_units WHERE run_id = ?",
  [ST_VERIFY_STORE] =
    "INSERT INTO verifications (rule_id, run_id, axioms_hash, result, millis, counterexample)"
    " VALUES (?, ?, ?, ?, ?, ?)",
  [ST_VERIFY_STATUS] = "UPDATE rules SET status = ? WHERE id = ?",
  [ST_COUNT_RUNS] = "SELECT count(*) FROM runs WHERE command = ?",
  [ST_COST_STORE] =
    "INSERT INTO costs (device, config, micros, method, algo) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (device, config) DO UPDATE SET micros = excluded.micros,"
    " method = excluded.method, algo = excluded.algo, measured_at = datetime('now')",
};

struct RuleDb {
  sqlite3 *db;
  char *path;                      /* as given, for messages */
  RuleDbMode mode;
  sqlite3_stmt *stmts[ST__COUNT];  /* prepared on first use */
};

static const char *const status_names[] = {
  [RULE_CANDIDATE] = "candidate",
  [RULE_PROVED] = "proved",
  [RULE_REFUTED] = "refuted",
  [RULE_UNKNOWN] = "unknown",
};
enum { N_STATUS = (int)(sizeof status_names / sizeof status_names[0]) };

const char *rule_status_name(RuleStatus s) {
  return (int)s >= 0 && (int)s < N_STATUS ? status_names[s] : "?";
}

int rule_status_from_name(const char *name) {
  for (int i = 0; name && i < N_STATUS; i++)
    if (strcmp(status_names[i], name) == 0) return i;
  return -1;
}

void rule_fini(Rule *r) {
  graph_free(r->src);
  graph_free(r->dst);
  free(r->key);
  r->src = r->dst = NULL;
  r->key = NULL;
}

int ruledb_schema_version(void) { return N_MIGRATIONS; }

const char *ruledb_migration_sql(int version) {
  return version >= 1 && version <= N_MIGRATIONS ? migrations[version - 1] : NULL;
}

/* ---- errors ---- */

/* Teq's code for a SQLite result code: a damaged or tampered file is the
 * user's input, a failing disk or lock is I/O, a misuse is our bug. */
static int code_of(int sqlite_rc) {
  switch (sqlite_rc & 0xff) {
  case SQLITE_NOMEM: return TEQ_ERR_NOMEM;
  case SQLITE_ERROR:
  case SQLITE_CORRUPT:
  case SQLITE_NOTADB:
  case SQLITE_CONSTRAINT:
  case SQLITE_MISMATCH:
  case SQLITE_SCHEMA:
  case SQLITE_TOOBIG: return TEQ_ERR_INPUT;
  case SQLITE_MISUSE:
  case SQLITE_RANGE:
  case SQLITE_INTERNAL: return TEQ_ERR_INTERNAL;
  default: return TEQ_ERR_IO; /* IOERR, FULL, CANTOPEN, READONLY, BUSY, LOCKED, PERM... */
  }
}

/* Reports the connection's last error while doing `what`. */
static int sql_error(RuleDb *db, Diag *d, const char *what) {
  int src = sqlite3_extended_errcode(db->db);
  diag_error(d, "%s: %s: %s", db->path, what, sqlite3_errmsg(db->db));
  return code_of(src);
}

/* Messages a codec call left in inner, into d prefixed with where. */
static int relay(Diag *d, Diag *inner, int rc, const char *where) {
  for (const char *line = inner->text ? inner->text : ""; *line;) {
    const char *nl = strchr(line, '\n');
    int n = nl ? (int)(nl - line) : (int)strlen(line);
    if (strncmp(line, "error: ", 7) == 0) line += 7, n -= 7;
    diag_error(d, "%s: %.*s", where, n, line);
    line += n + (nl ? 1 : 0);
  }
  if (!inner->n_errors && rc) diag_error(d, "%s: %s", where, teq_strerror(rc));
  diag_fini(inner);
  return rc;
}

/* ---- statements ---- */

static sqlite3_stmt *prepared(RuleDb *db, int id, Diag *d) {
  if (!db->stmts[id] && sqlite3_prepare_v3(db->db, stmt_sql[id], -1, SQLITE_PREPARE_PERSISTENT,
                                           &db->stmts[id], NULL) != SQLITE_OK) {
    sql_error(db, d, "preparing a statement");
    return NULL;
  }
  return db->stmts[id];
}

/* Makes st ready for its next use. */
static void release(sqlite3_stmt *st) {
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
}

/* Runs st to completion (or its first row); *row tells which, if asked. */
static int step(RuleDb *db, sqlite3_stmt *st, bool *row, const char *what, Diag *d) {
  int src = sqlite3_step(st);
  if (src != SQLITE_ROW && src != SQLITE_DONE) return sql_error(db, d, what);
  if (row) *row = src == SQLITE_ROW;
  return TEQ_OK;
}

static int check_binds(RuleDb *db, int src, const char *what, Diag *d) {
  return src == SQLITE_OK ? TEQ_OK : sql_error(db, d, what);
}

/* Statements with no parameters and no rows wanted. */
static int exec(RuleDb *db, const char *sql, const char *what, Diag *d) {
  return sqlite3_exec(db->db, sql, NULL, NULL, NULL) == SQLITE_OK ? TEQ_OK
                                                                  : sql_error(db, d, what);
}

static int query_int(RuleDb *db, const char *sql, int64_t *v, const char *what, Diag *d) {
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db->db, sql, -1, &st, NULL) != SQLITE_OK) return sql_error(db, d, what);
  bool row = false;
  int rc = step(db, st, &row, what, d);
  if (!rc) *v = row ? sqlite3_column_int64(st, 0) : 0;
  sqlite3_finalize(st);
  return rc;
}

/* ---- open ---- */

/* The directory part of path ("." when there is none). */
static char *parent_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

/* Checks what the file system can tell before SQLite touches the file:
 * existence, that a non-empty file starts as a SQLite file does, and, for
 * writing, that the file and its directory (WAL and shared-memory files go
 * there) are writable. */
static int check_file(const char *path, RuleDbMode mode, Diag *d) {
  struct stat st;
  bool exists = stat(path, &st) == 0;
  if (!exists && errno != ENOENT) {
    diag_error(d, "%s: %s", path, strerror(errno));
    return TEQ_ERR_IO;
  }
  if (!exists && mode == RULEDB_READ) return diag_error(d, "%s: no such rule database", path);
  if (exists && S_ISDIR(st.st_mode)) return diag_error(d, "%s: is a directory", path);
  if (exists && st.st_size > 0) {
    static const char magic[16] = "SQLite format 3";
    char head[16] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) {
      diag_error(d, "%s: cannot read: %s", path, strerror(errno));
      return TEQ_ERR_IO;
    }
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    if (n < sizeof head || memcmp(head, magic, sizeof magic) != 0)
      return diag_error(d, "%s: not a SQLite database", path);
  }
  if (mode == RULEDB_READ) return TEQ_OK;
  char *dir = parent_dir(path);
  if (!dir) return TEQ_ERR_NOMEM;
  int rc = TEQ_OK;
  struct stat ds;
  if (stat(dir, &ds) != 0 || !S_ISDIR(ds.st_mode)) {
    diag_error(d, "%s: cannot create: directory '%s' %s", path, dir,
               errno == ENOENT ? "does not exist" : "is not a directory");
    rc = TEQ_ERR_IO;
  } else if (access(dir, W_OK | X_OK) != 0) {
    diag_error(d, "%s: cannot write: directory '%s' is not writable (%s)", path, dir,
               strerror(errno));
    rc = TEQ_ERR_IO;
  } else if (exists && access(path, W_OK) != 0) {
    diag_error(d, "%s: cannot write: %s", path, strerror(errno));
    rc = TEQ_ERR_IO;
  }
  free(dir);
  return rc;
}

/* The first read of the file: SQLite says here whether it is SQLite at all
 * (the magic was checked, but a damaged header is found only now). */
static int read_application_id(RuleDb *db, int64_t *app_id, Diag *d) {
  sqlite3_stmt *st = NULL;
  int src = sqlite3_prepare_v2(db->db, "PRAGMA application_id", -1, &st, NULL);
  if (src == SQLITE_OK) src = sqlite3_step(st);
  int rc = TEQ_OK;
  if (src == SQLITE_ROW) *app_id = sqlite3_column_int64(st, 0);
  else if ((src & 0xff) == SQLITE_NOTADB) rc = diag_error(d, "%s: not a SQLite database", db->path);
  else rc = sql_error(db, d, "reading the header");
  sqlite3_finalize(st);
  return rc;
}

/* Refuses another application's database and schemas this build cannot
 * use; *version receives the file's schema version. Reads only. */
static int check_identity(RuleDb *db, int64_t *version, Diag *d) {
  int64_t app_id = 0, tables;
  int rc = read_application_id(db, &app_id, d);
  if (rc || (rc = query_int(db, "PRAGMA user_version", version, "reading the header", d)) ||
      (rc = query_int(db, "SELECT count(*) FROM sqlite_master", &tables, "reading the schema",
                      d)))
    return rc;
  /* An empty SQLite file is a new database; anything else must say it is ours. */
  if (app_id != RULEDB_APPLICATION_ID && (app_id != 0 || tables > 0))
    return diag_error(d, "%s: not a Teq rule database (application_id 0x%08" PRIx32
                      ", expected 0x%08x)", db->path, (uint32_t)app_id, RULEDB_APPLICATION_ID);
  if (*version > N_MIGRATIONS)
    return diag_error(d, "%s: written by a newer Teq (schema version %lld; this build knows "
                      "versions up to %d)", db->path, (long long)*version, N_MIGRATIONS);
  if (db->mode == RULEDB_READ && *version == 0)
    return diag_error(d, "%s: empty, not a Teq rule database", db->path);
  if (db->mode == RULEDB_READ && *version < N_MIGRATIONS)
    return diag_error(d, "%s: schema version %lld needs migration to %d: open it with gen-rules "
                      "first", db->path, (long long)*version, N_MIGRATIONS);
  return TEQ_OK;
}

/* Applies the missing migrations, each in its own transaction with its
 * version bump. The version is re-read inside the transaction, so two
 * processes opening an old file together migrate it once. */
static int migrate(RuleDb *db, Diag *d) {
  for (;;) {
    int64_t v;
    int rc = exec(db, "BEGIN IMMEDIATE", "starting a migration", d);
    if (rc) return rc;
    if ((rc = query_int(db, "PRAGMA user_version", &v, "reading the schema version", d)))
      goto fail;
    if (v >= N_MIGRATIONS) return exec(db, "COMMIT", "committing", d);
    char what[64], sql[96];
    snprintf(what, sizeof what, "migrating the schema to version %lld", (long long)v + 1);
    if ((rc = exec(db, migrations[v], what, d))) goto fail;
    if (v == 0) {
      snprintf(sql, sizeof sql, "PRAGMA application_id = %d", RULEDB_APPLICATION_ID);
      if ((rc = exec(db, sql, what, d))) goto fail;
    }
    snprintf(sql, sizeof sql, "PRAGMA user_version = %lld", (long long)v + 1);
    if ((rc = exec(db, sql, what, d)) || (rc = exec(db, "COMMIT", what, d))) goto fail;
    continue;
  fail:
    sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
  }
}

static int open_connection(RuleDb *db, Diag *d) {
  int flags = db->mode == RULEDB_READ ? SQLITE_OPEN_READONLY
                                      : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  int src = sqlite3_open_v2(db->path, &db->db, flags, NULL);
  if (!db->db) return TEQ_ERR_NOMEM;
  if (src != SQLITE_OK) {
    int err = sqlite3_system_errno(db->db);
    diag_error(d, "%s: cannot open: %s%s%s", db->path, sqlite3_errmsg(db->db),
               err ? ": " : "", err ? strerror(err) : "");
    return code_of(src);
  }
  sqlite3_extended_result_codes(db->db, 1);
  sqlite3_busy_timeout(db->db, 5000);
  return TEQ_OK;
}

int ruledb_open(const char *path, RuleDbMode mode, RuleDb **out, Diag *d) {
  int rc = check_file(path, mode, d);
  if (rc) return rc;
  RuleDb *db = calloc(1, sizeof *db);
  if (!db || !(db->path = strdup(path))) {
    free(db);
    return TEQ_ERR_NOMEM;
  }
  db->mode = mode;
  int64_t version;
  if ((rc = open_connection(db, d)) || (rc = check_identity(db, &version, d))) goto fail;
  /* WAL: readers never block the writer, and a killed writer leaves the
   * last committed state; NORMAL sync is durable enough in WAL mode. */
  if (mode == RULEDB_WRITE &&
      ((rc = exec(db, "PRAGMA journal_mode = WAL", "setting WAL mode", d)) ||
       (rc = exec(db, "PRAGMA synchronous = NORMAL", "setting synchronous", d)) ||
       (rc = migrate(db, d))))
    goto fail;
  if ((rc = exec(db, "PRAGMA foreign_keys = ON", "enabling foreign keys", d))) goto fail;
  *out = db;
  return TEQ_OK;
fail:
  ruledb_close(db);
  return rc;
}

void ruledb_close(RuleDb *db) {
  if (!db) return;
  for (int i = 0; i < ST__COUNT; i++) sqlite3_finalize(db->stmts[i]);
  sqlite3_close(db->db);
  free(db->path);
  free(db);
}

/* ---- transactions ---- */

int ruledb_begin(RuleDb *db, Diag *d) {
  if (!sqlite3_get_autocommit(db->db)) {
    diag_error(d, "%s: a transaction is already open", db->path);
    return TEQ_ERR_INTERNAL;
  }
  /* IMMEDIATE takes the write lock now, so a second writer waits here
   * (busy timeout) instead of failing at its first write. */
  return exec(db, "BEGIN IMMEDIATE", "starting a transaction", d);
}

int ruledb_commit(RuleDb *db, Diag *d) { return exec(db, "COMMIT", "committing", d); }

void ruledb_rollback(RuleDb *db) {
  if (!sqlite3_get_autocommit(db->db)) sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL);
}

int ruledb_integrity_check(RuleDb *db, Diag *d) {
  sqlite3_stmt *st;
  int rc = TEQ_OK, src;
  if (sqlite3_prepare_v2(db->db, "PRAGMA integrity_check(20)", -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, d, "checking integrity");
  while ((src = sqlite3_step(st)) == SQLITE_ROW) {
    const char *msg = (const char *)sqlite3_column_text(st, 0);
    if (msg && strcmp(msg, "ok") != 0)
      rc = diag_error(d, "%s: integrity check: %s", db->path, msg);
  }
  if (src != SQLITE_DONE) rc = sql_error(db, d, "checking integrity");
  sqlite3_finalize(st);
  if (rc) return rc;
  if (sqlite3_prepare_v2(db->db, "PRAGMA foreign_key_check", -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, d, "checking foreign keys");
  while ((src = sqlite3_step(st)) == SQLITE_ROW)
    rc = diag_error(d, "%s: %s row %lld refers to a missing row of %s", db->path,
                    (const char *)sqlite3_column_text(st, 0),
                    (long long)sqlite3_column_int64(st, 1),
                    (const char *)sqlite3_column_text(st, 2));
  if (src != SQLITE_DONE) rc = sql_error(db, d, "checking foreign keys");
  sqlite3_finalize(st);
  return rc;
}

/* ---- runs ---- */

static int bind_run(RuleDb *db, sqlite3_stmt *st, const RunInfo *info, Diag *d) {
  if (!info->command || !info->args || !info->version)
    return diag_error(d, "%s: a run needs its command, arguments and version", db->path);
  int src = sqlite3_bind_text(st, 1, info->command, -1, SQLITE_STATIC);
  if (!src) src = sqlite3_bind_text(st, 2, info->args, -1, SQLITE_STATIC);
  if (!src) src = sqlite3_bind_int64(st, 3, (sqlite3_int64)info->seed);
  return check_binds(db, src, "binding a run", d);
}

int ruledb_run_start(RuleDb *db, const RunInfo *info, int64_t *run_id, Diag *d) {
  sqlite3_stmt *st = prepared(db, ST_RUN_START, d);
  if (!st) return TEQ_ERR_INTERNAL;
  int rc = bind_run(db, st, info, d);
  if (!rc) rc = check_binds(db, sqlite3_bind_text(st, 4, info->version, -1, SQLITE_STATIC),
                            "binding a run", d);
  if (!rc) rc = step(db, st, NULL, "recording a run", d);
  if (!rc) *run_id = sqlite3_last_insert_rowid(db->db);
  release(st);
  return rc;
}

int ruledb_run_find_unfinished(RuleDb *db, const RunInfo *info, int64_t *run_id, Diag *d) {
  sqlite3_stmt *st = prepared(db, ST_RUN_FIND, d);
  if (!st) return TEQ_ERR_INTERNAL;
  bool row = false;
  int rc = bind_run(db, st, info, d);
  if (!rc) rc = step(db, st, &row, "looking for an unfinished run", d);
  if (!rc) *run_id = row ? sqlite3_column_int64(st, 0) : 0;
  release(st);
  return rc;
}

int ruledb_run_finish(RuleDb *db, int64_t run_id, double wall_s, int64_t peak_rss_kb,
                      const char *stats_json, Diag *d) {
  sqlite3_stmt *st = prepared(db, ST_RUN_FINISH, d);
  if (!st) return TEQ_ERR_INTERNAL;
  int src = sqlite3_bind_double(st, 1, wall_s);
  if (!src) src = sqlite3_bind_int64(st, 2, peak_rss_kb);
  if (!src) src = stats_json ? sqlite3_bind_text(st, 3, stats_json, -1, SQLITE_STATIC)
                             : sqlite3_bind_null(st, 3);
  if (!src) src = sqlite3_bind_int64(st, 4, run_id);
  int rc = check_binds(db, src, "binding a run", d);
  if (!rc) rc = step(db, st, NULL, "finishing a run", d);
  if (!rc && sqlite3_changes(db->db) == 0)
    rc = diag_error(d, "%s: no run %lld to finish", db->path, (long long)run_id);
  release(st);
  return rc;
}

/* ---- work units ---- */

int ruledb_unit_store(RuleDb *db, int64_t run_id, int unit, const void *blob, size_t len,
                      Diag *d) {
  sqlite3_stmt *st = prepared(db, ST_UNIT_STORE, d);
  if (!st) return TEQ_ERR_INTERNAL;
  int src = sqlite3_bind_int64(st, 1, run_id);
  if (!src) src = sqlite3_bind_int(st, 2, unit);
  /* A NULL pointer would bind SQL NULL; an empty result is an empty blob. */
  if (!src) src = len && blob ? sqlite3_bind_blob64(st, 3, blob, len, SQLITE_STATIC)
                              : sqlite3_bind_zeroblob(st, 3, 0);
  int rc = check_binds(db, src, "binding a work unit", d);
  if (!rc) rc = step(db, st, NULL, "storing a work unit", d);
  release(st);
  return rc;
}

int ruledb_unit_clear(RuleDb *db, int64_t run_id, Diag *d) {
  sqlite3_stmt *st = prepared(db, ST_UNIT_CLEAR, d);
  if (!st) return TEQ_ERR_INTERNAL;
  int rc = check_binds(db, sqlite3_bind_int64(st, 1, run_id), "binding a run", d);
  if (!rc) rc = step(db, st, NULL, "clearing work units", d);
  release(st);
  return rc;
}

int ruledb_compact(RuleDb *db, Diag *d) {
  int64_t pages = 0, free_pages = 0;
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db->db, "SELECT page_count, freelist_count FROM pragma_page_count(),"
                         " pragma_freelist_count()", -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, d, "reading the page counts");
  if (sqlite3_step(st) == SQLITE_ROW) {
    pages = sqlite3_column_int64(st, 0);
    free_pages = sqlite3_column_int64(st, 1);
  }
  sqlite3_finalize(st);
  /* Only worth a rewrite when most of the file is free pages. */
  if (free_pages * 2 < pages || free_pages < 4096) return TEQ_OK;
  if (sqlite3_exec(db->db, "VACUUM", NULL, NULL, NULL) != SQLITE_OK)
    return sql_error(db, d, "compacting the database");
  return TEQ_OK;
}

int ruledb_unit_done(RuleDb *db, int64_t run_id, int unit, bool *done, Diag *d) {
  sqlite3_stmt *st = prepared(db, ST_UNIT_DONE, d);
  if (!st) return TEQ_ERR_INTERNAL;
  int src = sqlite3_bind_int64(st, 1, run_id);
  if (!src) src = sqlite3_bind_int(st, 2, unit);
  bool row = false;
  int rc = check_binds(db, src, "binding a work unit", d);
  if (!rc) rc = step(db, st, &row, "looking up a work unit", d);
  if (!rc) *done = row;
  release(st);
  return rc;
}

int ruledb_unit_foreach(RuleDb *db, int64_t run_id,
                        int (*fn)(int unit, const void *blob, size_t len, void *ctx), void *ctx,
                        Diag *d) {
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db->db, "SELECT unit, result FROM run_units WHERE run_id = ?"
                         " ORDER BY unit", -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, d, "reading work units");
  int rc = check_binds(db, sqlite3_bind_int64(st, 1, run_id), "binding a work unit", d);
  bool row = true;
  while (!rc && !(rc = step(db, st, &row, "reading work units", d)) && row) {
    const void *blob = sqlite3_column_blob(st, 1);
    size_t len = (size_t)sqlite3_column_bytes(st, 1);
    rc = fn(sqlite3_column_int(st, 0), blob, len, ctx);
  }
  sqlite3_finalize(st);
  return rc;
}

/* ---- rules ---- */

static int check_rule(RuleDb *db, const Rule *r, Diag *d) {
  if (!r->src || !r->dst || !r->key || !r->key[0])
    return diag_error(d, "%s: a rule needs both sides and a key", db->path);
  if ((int)r->status < 0 || (int)r->status >= N_STATUS)
    return diag_error(d, "%s: rule '%s': status %d unknown", db->path, r->key, (int)r->status);
  if (r->src->n_outputs != r->dst->n_outputs)
    return diag_error(d, "%s: rule '%s': src has %d outputs, dst %d", db->path, r->key,
                      r->src->n_outputs, r->dst->n_outputs);
  return TEQ_OK;
}

static int bind_rule(RuleDb *db, sqlite3_stmt *st, const Rule *r, const uint8_t *src_buf,
                     size_t src_len, const uint8_t *dst_buf, size_t dst_len, const char *text,
                     Diag *d) {
  int s = sqlite3_bind_text(st, 1, r->key, -1, SQLITE_STATIC);
  if (!s) s = sqlite3_bind_blob64(st, 2, src_buf, src_len, SQLITE_STATIC);
  if (!s) s = sqlite3_bind_blob64(st, 3, dst_buf, dst_len, SQLITE_STATIC);
  if (!s) s = sqlite3_bind_text(st, 4, text, -1, SQLITE_STATIC);
  if (!s) s = sqlite3_bind_text(st, 5, rule_status_name(r->status), -1, SQLITE_STATIC);
  if (!s) s = sqlite3_bind_int(st, 6, r->depth);
  if (!s) s = sqlite3_bind_int(st, 7, rule_side_ops(r->src));
  if (!s) s = sqlite3_bind_int(st, 8, rule_side_ops(r->dst));
  if (!s) s = sqlite3_bind_int(st, 9, r->src->n_outputs);
  if (!s) s = r->run_id ? sqlite3_bind_int64(st, 10, r->run_id) : sqlite3_bind_null(st, 10);
  return check_binds(db, s, "binding a rule", d);
}

int ruledb_insert_rule(RuleDb *db, const Rule *r, bool *inserted, Diag *d) {
  uint8_t *src_buf = NULL, *dst_buf = NULL;
  size_t src_len = 0, dst_len = 0;
  char *text = NULL;
  sqlite3_stmt *st = NULL;
  int rc = check_rule(db, r, d);
  if (rc || (rc = rule_side_encode(r->src, &src_buf, &src_len, d)) ||
      (rc = rule_side_encode(r->dst, &dst_buf, &dst_len, d)))
    goto out;
  if (!(text = rule_text(r))) {
    rc = TEQ_ERR_NOMEM;
    goto out;
  }
  if (!(st = prepared(db, ST_INSERT_RULE, d))) {
    rc = TEQ_ERR_INTERNAL;
    goto out;
  }
  if (!(rc = bind_rule(db, st, r, src_buf, src_len, dst_buf, dst_len, text, d)) &&
      !(rc = step(db, st, NULL, "storing a rule", d)))
    *inserted = sqlite3_changes(db->db) > 0;
  release(st);
out:
  free(src_buf);
  free(dst_buf);
  free(text);
  return rc;
}

static int check_status_arg(RuleDb *db, int status, Diag *d) {
  if (status >= N_STATUS) {
    diag_error(d, "%s: no rule status %d", db->path, status);
    return TEQ_ERR_INTERNAL;
  }
  return TEQ_OK;
}

int ruledb_count_rules(RuleDb *db, int status, int64_t *n, Diag *d) {
  int rc = check_status_arg(db, status, d);
  if (rc) return rc;
  sqlite3_stmt *st = prepared(db, status < 0 ? ST_COUNT_ALL : ST_COUNT_STATUS, d);
  if (!st) return TEQ_ERR_INTERNAL;
  if (status >= 0)
    rc = check_binds(db, sqlite3_bind_text(st, 1, status_names[status], -1, SQLITE_STATIC),
                     "binding a status", d);
  bool row = false;
  if (!rc) rc = step(db, st, &row, "counting rules", d);
  if (!rc) *n = row ? sqlite3_column_int64(st, 0) : 0;
  release(st);
  return rc;
}

/* One side of the current row of a rule walk, decoded. */
static int decode_column(RuleDb *db, sqlite3_stmt *st, int col, int64_t id, Graph **g, Diag *d) {
  const void *blob = sqlite3_column_blob(st, col);
  int n = sqlite3_column_bytes(st, col);
  char where[PATH_MAX + 64];
  snprintf(where, sizeof where, "%s: rules row %lld, %s", db->path, (long long)id,
           sqlite3_column_name(st, col));
  Diag inner;
  diag_init(&inner);
  int rc = rule_side_decode(blob, (size_t)n, g, &inner);
  if (rc) return relay(d, &inner, rc, where);
  diag_fini(&inner);
  return TEQ_OK;
}

/* Fills r from the current row (id, key, src, dst, status, depth, run_id). */
static int read_rule(RuleDb *db, sqlite3_stmt *st, Rule *r, Diag *d) {
  memset(r, 0, sizeof *r);
  r->id = sqlite3_column_int64(st, 0);
  const char *key = (const char *)sqlite3_column_text(st, 1);
  const char *status = (const char *)sqlite3_column_text(st, 4);
  int s = rule_status_from_name(status);
  if (s < 0)
    return diag_error(d, "%s: rules row %lld: unknown status '%s'", db->path, (long long)r->id,
                      status ? status : "NULL");
  r->status = (RuleStatus)s;
  r->depth = sqlite3_column_int(st, 5);
  r->run_id = sqlite3_column_int64(st, 6);
  if (!(r->key = strdup(key ? key : ""))) return TEQ_ERR_NOMEM;
  int rc = decode_column(db, st, 2, r->id, &r->src, d);
  if (!rc) rc = decode_column(db, st, 3, r->id, &r->dst, d);
  return rc;
}

/* Walks the rows of st (id, key, src, dst, status, depth, run_id). */
static int walk_rules(RuleDb *db, sqlite3_stmt *st, int (*fn)(Rule *r, void *ctx),
                      void *ctx, Diag *d) {
  bool row = true;
  int rc = TEQ_OK;
  while (!rc && !(rc = step(db, st, &row, "reading rules", d)) && row) {
    Rule r;
    rc = read_rule(db, st, &r, d);
    if (!rc) rc = fn(&r, ctx);
    rule_fini(&r);
  }
  sqlite3_finalize(st);
  return rc;
}

int ruledb_foreach_undecided(RuleDb *db, const char *axioms_hash,
                             int (*fn)(Rule *r, void *ctx), void *ctx, Diag *d) {
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db->db,
                         "SELECT id, key, src, dst, status, depth, run_id FROM rules r"
                         " WHERE NOT EXISTS (SELECT 1 FROM verifications v WHERE v.rule_id = r.id"
                         " AND v.axioms_hash = ? AND v.result IN ('proved', 'refuted'))"
                         " ORDER BY id", -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, d, "reading rules");
  int rc = check_binds(db, sqlite3_bind_text(st, 1, axioms_hash, -1, SQLITE_STATIC),
                       "binding an axioms hash", d);
  if (rc) {
    sqlite3_finalize(st);
    return rc;
  }
  return walk_rules(db, st, fn, ctx, d);
}

int ruledb_store_verification(RuleDb *db, int64_t rule_id, int64_t run_id,
                              const char *axioms_hash, RuleStatus status, double millis,
                              const char *counterexample, Diag *d) {
  if (status != RULE_PROVED && status != RULE_REFUTED && status != RULE_UNKNOWN)
    return diag_error(d, "%s: a verification is proved, refuted or unknown", db->path);
  sqlite3_stmt *st = prepared(db, ST_VERIFY_STORE, d);
  if (!st) return TEQ_ERR_INTERNAL;
  int s = sqlite3_bind_int64(st, 1, rule_id);
  if (!s) s = run_id ? sqlite3_bind_int64(st, 2, run_id) : sqlite3_bind_null(st, 2);
  if (!s) s = sqlite3_bind_text(st, 3, axioms_hash, -1, SQLITE_STATIC);
  if (!s) s = sqlite3_bind_text(st, 4, status_names[status], -1, SQLITE_STATIC);
  if (!s) s = sqlite3_bind_double(st, 5, millis);
  if (!s) s = counterexample ? sqlite3_bind_text(st, 6, counterexample, -1, SQLITE_STATIC)
                             : sqlite3_bind_null(st, 6);
  int rc = check_binds(db, s, "binding a verification", d);
  if (!rc) rc = step(db, st, NULL, "storing a verification", d);
  release(st);
  if (rc || !(st = prepared(db, ST_VERIFY_STATUS, d))) return rc ? rc : TEQ_ERR_INTERNAL;
  s = sqlite3_bind_text(st, 1, status_names[status], -1, SQLITE_STATIC);
  if (!s) s = sqlite3_bind_int64(st, 2, rule_id);
  rc = check_binds(db, s, "binding a rule status", d);
  if (!rc) rc = step(db, st, NULL, "setting a rule status", d);
  if (!rc && sqlite3_changes(db->db) == 0)
    rc = diag_error(d, "%s: no rule %lld", db->path, (long long)rule_id);
  release(st);
  return rc;
}

int ruledb_count_runs(RuleDb *db, const char *command, int64_t *n, Diag *d) {
  sqlite3_stmt *st = prepared(db, ST_COUNT_RUNS, d);
  if (!st) return TEQ_ERR_INTERNAL;
  bool row = false;
  int rc = check_binds(db, sqlite3_bind_text(st, 1, command, -1, SQLITE_STATIC),
                       "binding a command", d);
  if (!rc) rc = step(db, st, &row, "counting runs", d);
  if (!rc) *n = row ? sqlite3_column_int64(st, 0) : 0;
  release(st);
  return rc;
}

int ruledb_foreach_rule(RuleDb *db, int status, int (*fn)(Rule *r, void *ctx), void *ctx,
                        Diag *d) {
  int rc = check_status_arg(db, status, d);
  if (rc) return rc;
  const char *sql = status < 0
    ? "SELECT id, key, src, dst, status, depth, run_id FROM rules ORDER BY id"
    : "SELECT id, key, src, dst, status, depth, run_id FROM rules WHERE status = ? ORDER BY id";
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db->db, sql, -1, &st, NULL) != SQLITE_OK)
    return sql_error(db, d, "reading rules");
  if (status >= 0)
    rc = check_binds(db, sqlite3_bind_text(st, 1, status_names[status], -1, SQLITE_STATIC),
                     "binding a status", d);
  if (rc) {
    sqlite3_finalize(st);
    return rc;
  }
  return walk_rules(db, st, fn, ctx, d);
}

int ruledb_cost_store(RuleDb *db, const char *device, const char *config, double micros,
                      const char *method, const char *algo, Diag *d) {
  sqlite3_stmt *st = prepared(db, ST_COST_STORE, d);
  if (!st) return TEQ_ERR_INTERNAL;
  bool row = false;
  int rc = check_binds(db,
                       sqlite3_bind_text(st, 1, device, -1, SQLITE_STATIC) |
                           sqlite3_bind_text(st, 2, config, -1, SQLITE_STATIC) |
                           sqlite3_bind_double(st, 3, micros) |
                           sqlite3_bind_text(st, 4, method, -1, SQLITE_STATIC) |
                           sqlite3_bind_text(st, 5, algo, -1, SQLITE_STATIC),
                       "binding a cost", d);
  if (!rc) rc = step(db, st, &row, "storing a cost", d);
  release(st);
  return rc;
}
