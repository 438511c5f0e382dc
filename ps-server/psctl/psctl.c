/* psctl: the admin CLI. Asks every shard of a cluster spec for its status
 * (Admin.Status) and reads variables (Data.Pull), then prints aligned
 * tables, or JSON with --json. A shard that does not answer is named (index
 * and address), what the others answered is still printed, and psctl exits
 * 1. Each command is one function; `commands` below lists them, so adding a
 * command is one line there. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "err.h"
#include "psclient.h"
#include "psctl_ckpt.h"
#include "rpc.h"
#include "shard.h"
#include "spec.h"
#include "units.h"

/* Exit status of a bad command line (README: always 2). */
#define EXIT_USAGE 2
/* Straggler rule (workers): p50 above this multiple of the live workers'
 * median p50, and above it by at least STRAGGLER_MIN_MS, with at least
 * STRAGGLER_SAMPLES step times behind each p50 compared. */
#define STRAGGLER_FACTOR 1.5
#define STRAGGLER_MIN_MS 1.0
#define STRAGGLER_SAMPLES 5
/* `get` fits its value lines into this many columns (at least one value). */
#define LINE_WIDTH 80

/* What every command works with. */
struct psctl {
  const struct cm_spec *spec; /* borrowed: the cluster spec */
  struct dw_client *client;   /* borrowed: channels to every shard */
  int json;                   /* --json: one JSON document on stdout */
  json_t **st;      /* per shard: its status (owned), NULL when it is down */
  char **why;       /* per shard: why it did not answer (owned), or NULL */
  int down;         /* shards that did not answer */
  int argc;         /* operands after the command's name */
  char **argv;      /* them (borrowed from main's argv) */
  const char *rows; /* get --rows A:B, or NULL */
  int stats;        /* get --stats */
  int timeout_ms;   /* --timeout, 0 when not given */
  int wait;         /* checkpoint --wait */
  int slots;        /* export --slots */
  const char *out;  /* export --out FILE */
};

/* One command of psctl. */
struct command {
  const char *name;           /* as typed */
  int (*run)(struct psctl *); /* returns the exit status */
  int needs_status;           /* 1: main first asks every shard's status */
  const char *synopsis;       /* operands and options, for usage */
  const char *help;           /* what it prints, for usage */
};

static int cmd_status(struct psctl *p);
static int cmd_vars(struct psctl *p);
static int cmd_get(struct psctl *p);
static int cmd_workers(struct psctl *p);
static int cmd_metrics(struct psctl *p);
static int cmd_checkpoint(struct psctl *p);
static int cmd_export(struct psctl *p);

static const struct command commands[] = {
    {"status", cmd_status, 1, "",
     "every shard: up or down, address, mode, version or step, variables,\n"
     "bytes held, pulls, pushes, examples, errors; each shard's slices; the\n"
     "job: live workers, step, drops, the last steps' sets"},
    {"vars", cmd_vars, 1, "",
     "every variable: shape, dtype, shard map (rows per shard), bytes held,\n"
     "version, optimizer"},
    {"get", cmd_get, 1, "VAR [--rows A:B] [--stats]",
     "a variable's values assembled across shards (rows A to B-1, every\n"
     "row by default), each row led by its index and wrapped at 80 columns\n"
     "(1-D: as many values per line as fit, led by the first one's index),\n"
     "in %.9g (exact for f32); --stats: element count, min, max, mean, L2\n"
     "norm and NaN count instead (NaNs are left out of the others). JSON\n"
     "writes NaN and infinities as the strings \"NaN\", \"Infinity\",\n"
     "\"-Infinity\", and rows of a shard that is down as null"},
    {"workers", cmd_workers, 1, "",
     "per worker (from the coordinator, shard 0): state, last step (sync)\n"
     "or pushes and clock (async), step time p50/p95 over the last 128\n"
     "steps, gradients applied and dropped, last heartbeat, and a\n"
     "straggler mark. A live worker is a straggler when its p50 is above\n"
     "1.5x the median p50 of the live workers and above it by 1 ms or\n"
     "more (each p50 over at least 5 steps, 2 such workers or more). The\n"
     "p50 compared is the step time in async jobs; in sync jobs, where a\n"
     "barrier gives every worker the slowest one's step time, it is the\n"
     "lag: from the step's opening to the worker's admission request"},
    {"metrics", cmd_metrics, 1, "",
     "Prometheus text exposition (format 0.0.4) of every counter and\n"
     "histogram: psd_up, psd_*_total per shard, psd_variable_version,\n"
     "psd_push_seconds, psd_pull_seconds, psd_worker_*; see README"},
    {"checkpoint", cmd_checkpoint, 0, "[--wait]",
     "every shard writes a checkpoint now (sync: of its last committed\n"
     "step); with --wait, prints each one's step, size, time and directory\n"
     "once written"},
    {"export", cmd_export, 0, "--out FILE.safetensors [--slots]",
     "every variable's live values, merged from all shards into one\n"
     "safetensors file with the whole shapes (numpy and PyTorch load it);\n"
     "--slots adds each variable's optimizer slots as \"<name>/<slot>\"\n"
     "(momentum: /momentum; adagrad: /accum; adam, adamw: /m and /v)"},
};
#define NCOMMANDS ((int)(sizeof commands / sizeof commands[0]))

static void usage(FILE *f) {
  fprintf(f, "usage: psctl --cluster FILE [--json] [--timeout MS] COMMAND\n"
             "\nCommands:\n");
  for (int i = 0; i < NCOMMANDS; i++) {
    const char *h = commands[i].help;
    fprintf(f, "  %s%s%s\n", commands[i].name,
            commands[i].synopsis[0] ? " " : "", commands[i].synopsis);
    while (*h) {
      const char *nl = strchr(h, '\n');
      int len = nl ? (int)(nl - h) : (int)strlen(h);
      fprintf(f, "      %.*s\n", len, h);
      h += len + (nl != NULL);
    }
  }
  fprintf(f,
          "\nOptions:\n"
          "  --cluster FILE  the job's cluster spec\n"
          "  --json          one JSON document instead of tables\n"
          "  --timeout MS    deadline per call (default 5000; checkpoint\n"
          "                  --wait and export: 600000)\n"
          "  --rows A:B      get: rows A (included) to B (excluded); A or B\n"
          "                  may be left out\n"
          "  --stats         get: statistics instead of values\n"
          "  --wait          checkpoint: answer once every shard has written\n"
          "  --out FILE      export: the safetensors file to write\n"
          "  --slots         export: the optimizer's slots too\n"
          "\n"
          "Exit status: 0 every shard answered, 1 a shard did not (it is\n"
          "named; what the others answered is printed) or a variable does\n"
          "not exist, 2 usage or spec error.\n");
}

/* ---- output helpers ---- */

/* "[784, 256]" from a JSON array of dimensions. */
static void shape_text(json_t *shape, char *buf, size_t len) {
  size_t n = 0, k;
  json_t *d;
  n += snprintf(buf, len, "[");
  json_array_foreach(shape, k, d) {
    if (n < len)
      n += snprintf(buf + n, len - n, "%s%lld", k ? ", " : "",
                    json_integer_value(d));
  }
  if (n < len)
    snprintf(buf + n, len - n, "]");
}

static long long jint(json_t *o, const char *key) {
  return json_integer_value(json_object_get(o, key));
}

static double jnum(json_t *o, const char *key) {
  return json_number_value(json_object_get(o, key));
}

static const char *jstr(json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s ? s : "";
}

/* An aligned table: cells are collected, then printed with every column as
 * wide as its widest cell, two spaces apart. */
#define TBL_COLS 16
struct table {
  int ncols;                  /* columns */
  const char *head[TBL_COLS]; /* headings (static strings) */
  char right[TBL_COLS];       /* 1: right-aligned (numbers) */
  char **cells;               /* owned: nrows * ncols strings, row-major */
  int nrows;                  /* complete rows plus the one being filled */
  int ncells;                 /* cells filled */
  int cap;                    /* cells allocated */
  int nomem;                  /* an allocation failed; printing says so */
};

/* Columns are given as "HEAD" (left-aligned) or ">HEAD" (right-aligned). */
static void tbl_init(struct table *t, int ncols, ...) {
  va_list ap;
  memset(t, 0, sizeof *t);
  t->ncols = ncols < TBL_COLS ? ncols : TBL_COLS;
  va_start(ap, ncols);
  for (int i = 0; i < t->ncols; i++) {
    const char *h = va_arg(ap, const char *);
    t->right[i] = h[0] == '>';
    t->head[i] = h + t->right[i];
  }
  va_end(ap);
}

/* Appends one cell; rows fill left to right, top to bottom. */
static void tbl_cell(struct table *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void tbl_cell(struct table *t, const char *fmt, ...) {
  va_list ap;
  char *s = NULL;
  if (t->ncells == t->cap) {
    int cap = t->cap ? t->cap * 2 : 64;
    char **c = realloc(t->cells, cap * sizeof *c);
    if (!c) {
      t->nomem = 1;
      return;
    }
    t->cells = c;
    t->cap = cap;
  }
  va_start(ap, fmt);
  if (vasprintf(&s, fmt, ap) < 0) {
    s = NULL;
    t->nomem = 1;
  }
  va_end(ap);
  t->cells[t->ncells++] = s;
}

/* Prints and frees the table; returns 0 or CM_ENOMEM. */
static int tbl_print(struct table *t) {
  int w[TBL_COLS] = {0}, rc = t->nomem ? CM_ENOMEM : 0;
  for (int c = 0; c < t->ncols; c++)
    w[c] = (int)strlen(t->head[c]);
  for (int i = 0; i < t->ncells; i++) {
    int len = t->cells[i] ? (int)strlen(t->cells[i]) : 0;
    if (len > w[i % t->ncols])
      w[i % t->ncols] = len;
  }
  for (int i = -t->ncols; i < t->ncells; i += t->ncols) {
    char line[1024];
    int n = 0, end = 0;
    for (int c = 0; c < t->ncols; c++) {
      const char *s =
          i < 0 ? t->head[c] : (i + c < t->ncells ? t->cells[i + c] : NULL);
      int len, pad;
      if (!s)
        s = "";
      len = (int)strlen(s);
      pad = w[c] - len;
      if (n < (int)sizeof line)
        n += snprintf(line + n, sizeof line - n, "%s%*s%s", c ? "  " : "",
                      t->right[c] ? pad : 0, "", s);
      if (len) /* padding after the last cell is left out */
        end = n < (int)sizeof line ? n : (int)sizeof line - 1;
      if (!t->right[c] && n < (int)sizeof line)
        n += snprintf(line + n, sizeof line - n, "%*s", pad, "");
    }
    printf("%.*s\n", end, line);
  }
  for (int i = 0; i < t->ncells; i++)
    free(t->cells[i]);
  free(t->cells);
  memset(t, 0, sizeof *t);
  return rc;
}

/* Prints a JSON document; returns 0 or CM_ENOMEM. */
static int print_json(json_t *doc) {
  char *text =
      doc ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  if (!text)
    return CM_ENOMEM;
  printf("%s\n", text);
  free(text);
  return 0;
}

/* [{"shard", "address", "error"}] for the shards that are down. */
static json_t *down_json(const struct psctl *p) {
  json_t *a = json_array();
  for (int s = 0; s < p->spec->nps; s++)
    if (!p->st[s])
      json_array_append_new(a, json_pack("{s:i, s:s, s:s}", "shard", s,
                                         "address", p->spec->ps[s].text,
                                         "error", p->why[s] ? p->why[s] : ""));
  return a;
}

/* After a table: one line per down shard, so it is named on stdout too. */
static void print_down(const struct psctl *p) {
  for (int s = 0; s < p->spec->nps; s++)
    if (!p->st[s])
      printf("ps:%d (%s) is down: nothing from it above\n", s,
             p->spec->ps[s].text);
}

/* A command's exit status from rc: an exit status (> 0), a CM_E* code
 * (< 0, said on stderr, exit 1), or 0: then 1 when a shard is down. */
static int finish(const struct psctl *p, int rc) {
  if (rc < 0) {
    fprintf(stderr, "psctl: %s\n", cm_strerror(rc));
    return 1;
  }
  return rc ? rc : (p->down ? 1 : 0);
}

/* 0, or says that the command takes no operands and returns EXIT_USAGE. */
static int no_operands(const struct psctl *p, const char *cmd) {
  if (p->argc == 0)
    return 0;
  fprintf(stderr, "psctl: '%s' takes no operands (got '%s')\n", cmd,
          p->argv[0]);
  return EXIT_USAGE;
}

/* ---- status ---- */

/* The coordinator's view: workers, and in sync mode the last steps. */
static int print_job(const struct psctl *p, json_t *coord) {
  json_t *workers = json_object_get(coord, "workers"), *w, *steps, *r;
  struct table t;
  size_t i, n;
  long long live = 0, dropped = 0;
  int sync = strcmp(jstr(coord, "mode"), "sync") == 0, rc;

  json_array_foreach(workers, i, w) {
    live += json_is_true(json_object_get(w, "live"));
    dropped += jint(w, "dropped");
  }
  printf("\nJOB %s  mode %s", p->spec->job.name, jstr(coord, "mode"));
  if (sync)
    printf("  step %lld", jint(coord, "step"));
  if (sync && jint(coord, "rollbacks") > 0)
    printf("  rollbacks %lld (last to step %lld)", jint(coord, "rollbacks"),
           jint(coord, "rollback_step"));
  printf("  workers %lld/%zu live  dropped %lld\n", live,
         json_array_size(workers), dropped);
  tbl_init(&t, 6, "WORKER", "STATE", ">JOINS", ">APPLIED", ">DROPPED",
           ">LAST SEEN");
  json_array_foreach(workers, i, w) {
    double seen = jnum(w, "last_seen_ms");
    char ago[48] = "never", ms[32];
    if (seen >= 0) {
      cm_fmt_ms(seen, ms, sizeof ms);
      snprintf(ago, sizeof ago, "%s ago", ms);
    }
    tbl_cell(&t, "worker:%lld", jint(w, "worker"));
    tbl_cell(&t, "%s",
             json_is_true(json_object_get(w, "live"))     ? "live"
             : json_is_true(json_object_get(w, "joined")) ? "gone"
                                                          : "-");
    tbl_cell(&t, "%lld", jint(w, "joins"));
    tbl_cell(&t, "%lld", jint(w, "applied"));
    tbl_cell(&t, "%lld", jint(w, "dropped"));
    tbl_cell(&t, "%s", ago);
  }
  if ((rc = tbl_print(&t)))
    return rc;
  steps = json_object_get(coord, "steps");
  n = json_array_size(steps);
  if (n == 0)
    return 0;
  printf("\n");
  tbl_init(&t, 3, ">STEP", "APPLIED", "DROPPED");
  for (i = n > 5 ? n - 5 : 0; i < n; i++) {
    char a[128] = "", d[128] = "";
    size_t k, la = 0, ld = 0;
    json_t *x;
    r = json_array_get(steps, i);
    json_array_foreach(json_object_get(r, "applied"), k, x) {
      if (la < sizeof a)
        la += snprintf(a + la, sizeof a - la, "%s%lld", k ? "," : "",
                       json_integer_value(x));
    }
    json_array_foreach(json_object_get(r, "dropped"), k, x) {
      if (ld < sizeof d)
        ld += snprintf(d + ld, sizeof d - ld, "%s%lld", k ? "," : "",
                       json_integer_value(x));
    }
    tbl_cell(&t, "%lld", jint(r, "step"));
    tbl_cell(&t, "%s", a[0] ? a : "-");
    tbl_cell(&t, "%s", d[0] ? d : "-");
  }
  return tbl_print(&t);
}

/* A line per shard that has seen pushes with NaN or Inf (none: nothing). */
static void print_nonfinite(const struct psctl *p) {
  int first = 1;
  for (int s = 0; s < p->spec->nps; s++) {
    long long n = p->st[s] ? jint(p->st[s], "nonfinite_pushes") : 0;
    if (n <= 0)
      continue;
    if (first)
      printf("\n");
    first = 0;
    printf("ps:%d: %lld push%s with NaN or Inf in the gradient %s "
           "(job.nonfinite \"%s\")\n",
           s, n, n == 1 ? "" : "es",
           !strcmp(jstr(p->st[s], "nonfinite"), "skip")    ? "skipped"
           : !strcmp(jstr(p->st[s], "nonfinite"), "apply") ? "applied"
                                                           : "rejected",
           jstr(p->st[s], "nonfinite"));
  }
}

static int cmd_status(struct psctl *p) {
  const struct cm_spec *spec = p->spec;
  char held[32], shape[64];
  struct table t;
  int rc;

  if ((rc = no_operands(p, "status")))
    return rc;
  if (p->json) {
    json_t *root = json_object(), *shards = json_array();
    for (int s = 0; s < spec->nps; s++) {
      json_t *e = p->st[s] ? json_incref(p->st[s]) : json_object();
      json_object_set_new(e, "address", json_string(spec->ps[s].text));
      json_object_set_new(e, "up", json_boolean(p->st[s] != NULL));
      if (!p->st[s])
        json_object_set_new(e, "error",
                            json_string(p->why[s] ? p->why[s] : ""));
      json_array_append_new(shards, e);
    }
    json_object_set_new(root, "shards", shards);
    rc = print_json(root);
    json_decref(root);
    return finish(p, rc);
  }
  tbl_init(&t, 11, "SHARD", "ADDRESS", "STATE", "MODE", ">VERSION", ">VARS",
           ">HELD", ">PULLS", ">PUSHES", ">EXAMPLES", ">ERRORS");
  for (int s = 0; s < spec->nps; s++) {
    json_t *st = p->st[s], *vars = json_object_get(st, "vars"), *v;
    size_t i;
    double bytes = 0;
    long long version = 0;
    tbl_cell(&t, "ps:%d", s);
    tbl_cell(&t, "%s", spec->ps[s].text);
    tbl_cell(&t, "%s", st ? "up" : "down");
    if (!st) {
      for (int c = 3; c < t.ncols; c++)
        tbl_cell(&t, "-");
      continue;
    }
    json_array_foreach(vars, i, v) {
      bytes += jint(v, "bytes");
      if (jint(v, "version") > version)
        version = jint(v, "version");
    }
    /* Sync: steps committed; async: the most pushes any variable took. */
    if (strcmp(jstr(st, "mode"), "sync") == 0)
      version = jint(st, "step");
    cm_fmt_bytes(bytes, held, sizeof held);
    tbl_cell(&t, "%s", jstr(st, "mode"));
    tbl_cell(&t, "%lld", version);
    tbl_cell(&t, "%zu", json_array_size(vars));
    tbl_cell(&t, "%s", held);
    tbl_cell(&t, "%lld", jint(st, "pulls"));
    tbl_cell(&t, "%lld", jint(st, "pushes"));
    tbl_cell(&t, "%lld", jint(st, "examples"));
    tbl_cell(&t, "%lld", jint(st, "errors"));
  }
  if ((rc = tbl_print(&t)))
    return finish(p, rc);
  printf("\n");
  tbl_init(&t, 6, "VARIABLE", "SHAPE", "SHARD", "ROWS", ">HELD", ">VERSION");
  for (int s = 0; s < spec->nps; s++) {
    json_t *vars = p->st[s] ? json_object_get(p->st[s], "vars") : NULL, *v;
    size_t i;
    json_array_foreach(vars, i, v) {
      json_t *rows = json_object_get(v, "rows");
      shape_text(json_object_get(v, "shape"), shape, sizeof shape);
      cm_fmt_bytes(jint(v, "bytes"), held, sizeof held);
      tbl_cell(&t, "%s", jstr(v, "name"));
      tbl_cell(&t, "%s", shape);
      tbl_cell(&t, "ps:%d", s);
      tbl_cell(&t, "[%lld, %lld)", json_integer_value(json_array_get(rows, 0)),
               json_integer_value(json_array_get(rows, 1)));
      tbl_cell(&t, "%s", held);
      tbl_cell(&t, "%lld", jint(v, "version"));
    }
  }
  rc = tbl_print(&t);
  if (!rc && p->st[0] && json_is_true(json_object_get(p->st[0], "coordinator")))
    rc = print_job(p, p->st[0]);
  else if (!rc && !p->st[0])
    printf("\nJOB %s: unknown, ps:0 (%s), the coordinator, is down\n",
           spec->job.name, spec->ps[0].text);
  if (!rc)
    psd_ctl_print_checkpoints(spec, p->st);
  if (!rc)
    print_nonfinite(p);
  print_down(p);
  return finish(p, rc);
}

/* ---- checkpoint and export (psctl_ckpt.c) ---- */

static struct psd_ctl_opts ctl_opts(const struct psctl *p, int long_wait) {
  struct psd_ctl_opts o = {
      .json = p->json, .wait = p->wait, .slots = p->slots, .out = p->out};
  o.timeout_ms = p->timeout_ms > 0 ? p->timeout_ms : long_wait ? 600000 : 5000;
  return o;
}

static int cmd_checkpoint(struct psctl *p) {
  struct psd_ctl_opts o = ctl_opts(p, p->wait);
  int rc = no_operands(p, "checkpoint");
  return rc ? rc : psd_ctl_checkpoint(p->spec, &o);
}

static int cmd_export(struct psctl *p) {
  struct psd_ctl_opts o = ctl_opts(p, 1);
  int rc = no_operands(p, "export");
  if (rc)
    return rc;
  if (!p->out || !p->out[0]) {
    fprintf(stderr, "psctl: export needs --out FILE.safetensors\n");
    return EXIT_USAGE;
  }
  return psd_ctl_export(p->spec, &o);
}

/* ---- the shard map ---- */

/* Where one variable lives: its shape and, per shard, its rows. */
struct var_map {
  const char *name; /* borrowed from a status document */
  json_t *shape;    /* borrowed: the JSON shape */
  int64_t rows;     /* shape[0] */
  uint64_t row_len; /* elements per row */
  int placement;    /* -1 split, else the shard holding it whole */
  int64_t *begin;   /* owned, per shard: first row held */
  int64_t *end;     /* owned, per shard: one past the last */
  json_t **slice;   /* owned array, per shard: its VarStatus (borrowed), or
                       NULL when the shard is down */
};

/* The variable's entry in one shard's status, or NULL. */
static json_t *find_var(json_t *st, const char *name) {
  json_t *v;
  size_t i;
  json_array_foreach(json_object_get(st, "vars"), i, v) {
    if (strcmp(jstr(v, "name"), name) == 0)
      return v;
  }
  return NULL;
}

static void map_free(struct var_map *m) {
  free(m->begin);
  free(m->end);
  free(m->slice);
  memset(m, 0, sizeof *m);
}

/* Fills m for variable `name` from the shards that answered; a down
 * shard's rows come from the shard map (common/vars/shard.h). Returns 0,
 * CM_ENOENT when no shard that answered knows it, or CM_ENOMEM. */
static int map_var(const struct psctl *p, const char *name, struct var_map *m) {
  int n = p->spec->nps;
  json_t *first = NULL;
  memset(m, 0, sizeof *m);
  for (int s = 0; s < n && !first; s++)
    first = p->st[s] ? find_var(p->st[s], name) : NULL;
  if (!first)
    return CM_ENOENT;
  m->begin = calloc(n, sizeof *m->begin);
  m->end = calloc(n, sizeof *m->end);
  m->slice = calloc(n, sizeof *m->slice);
  if (!m->begin || !m->end || !m->slice) {
    map_free(m);
    return CM_ENOMEM;
  }
  m->name = jstr(first, "name");
  m->shape = json_object_get(first, "shape");
  m->rows = json_integer_value(json_array_get(m->shape, 0));
  m->row_len = 1;
  for (size_t d = 1; d < json_array_size(m->shape); d++)
    m->row_len *= (uint64_t)json_integer_value(json_array_get(m->shape, d));
  m->placement = (int)jint(first, "placement");
  for (int s = 0; s < n; s++) {
    json_t *v = p->st[s] ? find_var(p->st[s], name) : NULL;
    m->slice[s] = v;
    if (v) {
      json_t *rows = json_object_get(v, "rows");
      m->begin[s] = json_integer_value(json_array_get(rows, 0));
      m->end[s] = json_integer_value(json_array_get(rows, 1));
    } else {
      cm_shard_rows(m->rows, m->placement, n, s, &m->begin[s], &m->end[s]);
    }
  }
  return 0;
}

/* "no variable 'x' in job 'j' (it has: a, b)" on stderr; exit 1. */
static int no_such_var(const struct psctl *p, const char *name) {
  json_t *st = NULL, *v;
  size_t i;
  for (int s = 0; s < p->spec->nps && !st; s++)
    st = p->st[s];
  fprintf(stderr, "psctl: no variable '%s' in job '%s'", name,
          p->spec->job.name);
  if (p->down)
    fprintf(stderr, " on the shards that answered");
  fprintf(stderr, " (it has: ");
  json_array_foreach(json_object_get(st, "vars"), i, v) {
    fprintf(stderr, "%s%s", i ? ", " : "", jstr(v, "name"));
  }
  fprintf(stderr, "%s)\n",
          json_array_size(json_object_get(st, "vars")) ? "" : "no variables");
  return 1;
}

/* ---- vars ---- */

static int cmd_vars(struct psctl *p) {
  const struct cm_spec *spec = p->spec;
  json_t *names = NULL, *root = NULL, *list = NULL, *v;
  const char *optim = NULL;
  int same_optim = 1, rc = 0;
  struct table t;
  size_t i;

  if ((rc = no_operands(p, "vars")))
    return rc;
  /* Every shard lists every variable (declare goes to all of them), in
   * declaration order; take the names from the first that answered. */
  for (int s = 0; s < spec->nps && !names; s++)
    names = p->st[s] ? json_object_get(p->st[s], "vars") : NULL;
  list = json_array();
  json_array_foreach(names, i, v) {
    struct var_map m;
    json_t *shards = json_array(), *o;
    long long bytes = 0, vmin = -1, vmax = -1;
    const char *opt = jstr(v, "optimizer");
    if ((rc = map_var(p, jstr(v, "name"), &m)))
      break;
    for (int s = 0; s < spec->nps; s++) {
      json_t *sl = m.slice[s];
      if (m.end[s] <= m.begin[s])
        continue;
      json_t *e = json_pack("{s:i, s:s, s:b, s:[I, I]}", "shard", s, "address",
                            spec->ps[s].text, "up", sl != NULL, "rows",
                            (json_int_t)m.begin[s], (json_int_t)m.end[s]);
      if (sl) {
        long long ver = jint(sl, "version");
        json_object_set_new(e, "bytes", json_integer(jint(sl, "bytes")));
        json_object_set_new(e, "version", json_integer(ver));
        bytes += jint(sl, "bytes");
        vmin = vmin < 0 || ver < vmin ? ver : vmin;
        vmax = ver > vmax ? ver : vmax;
      }
      json_array_append_new(shards, e);
    }
    if (optim && strcmp(optim, opt) != 0)
      same_optim = 0;
    optim = opt;
    /* Versions are null when every shard holding rows is down. */
    o = json_pack("{s:s, s:O, s:s, s:i, s:o, s:I, s:o, s:o, s:s}", "name",
                  m.name, "shape", m.shape, "dtype", "f32", "placement",
                  m.placement, "shards", shards, "bytes", (json_int_t)bytes,
                  "version", vmax < 0 ? json_null() : json_integer(vmax),
                  "version_min", vmin < 0 ? json_null() : json_integer(vmin),
                  "optimizer", opt);
    json_array_append_new(list, o);
    map_free(&m);
  }
  if (rc)
    goto out;
  if (p->json) {
    root = json_pack("{s:s, s:O, s:o}", "job", spec->job.name, "vars", list,
                     "down", down_json(p));
    rc = print_json(root);
    goto out;
  }
  tbl_init(&t, same_optim ? 6 : 7, "VARIABLE", "SHAPE", "DTYPE",
           "SHARDS (ROWS)", ">HELD", ">VERSION", "OPTIMIZER");
  json_array_foreach(list, i, v) {
    char shape[64], map[256], held[32];
    size_t k, n = 0;
    json_t *e, *shards = json_object_get(v, "shards");
    int missing = 0;
    shape_text(json_object_get(v, "shape"), shape, sizeof shape);
    if (json_array_size(shards) > 4) {
      snprintf(map, sizeof map, "split over %zu shards",
               json_array_size(shards));
    } else {
      map[0] = 0;
      json_array_foreach(shards, k, e) {
        json_t *r = json_object_get(e, "rows");
        int up = json_is_true(json_object_get(e, "up"));
        missing |= !up;
        if (n < sizeof map)
          n += snprintf(map + n, sizeof map - n, "%sps:%lld%s [%lld, %lld)",
                        k ? " " : "", jint(e, "shard"), up ? "" : "(down)",
                        json_integer_value(json_array_get(r, 0)),
                        json_integer_value(json_array_get(r, 1)));
      }
      if (!map[0])
        snprintf(map, sizeof map, "no rows");
    }
    cm_fmt_bytes(jint(v, "bytes"), held, sizeof held);
    tbl_cell(&t, "%s", jstr(v, "name"));
    tbl_cell(&t, "%s", shape);
    tbl_cell(&t, "f32");
    tbl_cell(&t, "%s", map);
    tbl_cell(&t, "%s%s", held, missing ? "+?" : "");
    if (json_is_null(json_object_get(v, "version")))
      tbl_cell(&t, "?");
    else if (jint(v, "version_min") != jint(v, "version"))
      tbl_cell(&t, "%lld-%lld", jint(v, "version_min"), jint(v, "version"));
    else
      tbl_cell(&t, "%lld", jint(v, "version"));
    if (!same_optim)
      tbl_cell(&t, "%s", jstr(v, "optimizer"));
  }
  rc = tbl_print(&t);
  if (!rc && optim && same_optim)
    printf("optimizer (every variable): %s\n", optim);
  print_down(p);
out:
  json_decref(list);
  json_decref(root);
  return finish(p, rc);
}

/* ---- get ---- */

/* "# rows [a, b) missing: ps:S (address) did not answer" per entry of a
 * `missing` list. */
static void print_missing(json_t *missing) {
  json_t *e;
  size_t i;
  json_array_foreach(missing, i, e) {
    json_t *r = json_object_get(e, "rows");
    printf("# rows [%lld, %lld) missing: ps:%lld (%s) did not answer\n",
           json_integer_value(json_array_get(r, 0)),
           json_integer_value(json_array_get(r, 1)), jint(e, "shard"),
           jstr(e, "address"));
  }
}

/* Parses "A:B", "A:" or ":B" into [*a, *b) (*b = -1 when open). */
static int parse_rows(const char *s, int64_t *a, int64_t *b) {
  const char *colon = strchr(s, ':');
  char *end;
  *a = 0;
  *b = -1;
  if (!colon || strchr(colon + 1, ':'))
    return CM_EINVAL;
  if (colon > s) {
    if (s[0] < '0' || s[0] > '9')
      return CM_EINVAL;
    errno = 0;
    *a = strtoll(s, &end, 10);
    if (errno || end != colon)
      return CM_EINVAL;
  }
  if (colon[1]) {
    if (colon[1] < '0' || colon[1] > '9')
      return CM_EINVAL;
    errno = 0;
    *b = strtoll(colon + 1, &end, 10);
    if (errno || *end || *b <= *a)
      return CM_EINVAL;
  }
  return 0;
}

/* A float as JSON: a number, or "NaN" / "Infinity" / "-Infinity". */
static json_t *num_json(double x) {
  if (isnan(x))
    return json_string("NaN");
  if (isinf(x))
    return json_string(x > 0 ? "Infinity" : "-Infinity");
  return json_real(x);
}

/* Nested lists of a row's elements, shaped like shape[dim..]. */
static json_t *row_json(const float *x, json_t *shape, size_t dim) {
  json_t *a = json_array();
  size_t n = json_integer_value(json_array_get(shape, dim)), stride = 1;
  for (size_t d = dim + 1; d < json_array_size(shape); d++)
    stride *= json_integer_value(json_array_get(shape, d));
  for (size_t i = 0; i < n; i++)
    json_array_append_new(a, dim + 1 < json_array_size(shape)
                                 ? row_json(x + i * stride, shape, dim + 1)
                                 : num_json(x[i]));
  return a;
}

/* What --stats prints. */
struct stats {
  uint64_t elements; /* elements read */
  uint64_t nan;      /* of them NaN */
  double min, max;   /* over the others */
  double sum, sumsq; /* over the others, in element order, in double */
};

static void stats_add(struct stats *st, const float *x, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    double v = x[i];
    st->elements++;
    if (isnan(v)) {
      st->nan++;
      continue;
    }
    if (st->elements - st->nan == 1 || v < st->min)
      st->min = v;
    if (st->elements - st->nan == 1 || v > st->max)
      st->max = v;
    st->sum += v;
    st->sumsq += v * v;
  }
}

static int cmd_get(struct psctl *p) {
  const struct cm_spec *spec = p->spec;
  struct var_map m = {0};
  struct dw_read *reads = NULL;
  unsigned char *have = NULL; /* per row in [a, b): it arrived */
  float *x = NULL;
  json_t *root = NULL, *missing;
  int64_t a, b;
  int nreads = 0, rc = 0;
  const char *name;

  if (p->argc != 1) {
    fprintf(stderr, "psctl: get takes one variable name (got %d operands)\n",
            p->argc);
    return EXIT_USAGE;
  }
  name = p->argv[0];
  if (p->rows && parse_rows(p->rows, &a, &b)) {
    fprintf(stderr,
            "psctl: --rows '%s': expected A:B, rows A (included) to B "
            "(excluded) with 0 <= A < B; A or B may be left out\n",
            p->rows);
    return EXIT_USAGE;
  }
  if (!p->rows) {
    a = 0;
    b = -1; /* every row */
  }
  if ((rc = map_var(p, name, &m)) == CM_ENOENT)
    return no_such_var(p, name);
  if (rc)
    goto out;
  if (b < 0)
    b = m.rows;
  if (b > m.rows || a >= b) {
    fprintf(stderr,
            "psctl: --rows '%s': variable '%s' has %lld rows; expected A:B "
            "with 0 <= A < B <= %lld\n",
            p->rows ? p->rows : ":", name, (long long)m.rows,
            (long long)m.rows);
    rc = EXIT_USAGE;
    goto out;
  }
  if (!(x = calloc((size_t)((b - a) * m.row_len) + 1, sizeof *x)) ||
      !(have = calloc((size_t)(b - a), 1)) ||
      !(reads = calloc(spec->nps, sizeof *reads))) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int s = 0; s < spec->nps; s++) {
    int64_t lo = m.begin[s] > a ? m.begin[s] : a;
    int64_t hi = m.end[s] < b ? m.end[s] : b;
    if (lo >= hi || !m.slice[s])
      continue;
    reads[nreads++] =
        (struct dw_read){.shard = s,
                         .name = m.name,
                         .offset = (uint64_t)lo * m.row_len,
                         .count = (uint64_t)(hi - lo) * m.row_len,
                         .dst = x + (uint64_t)(lo - a) * m.row_len};
  }
  dw_client_read(p->client, reads, nreads);
  for (int i = 0; i < nreads; i++) {
    const struct dw_read *r = &reads[i];
    int64_t lo = (int64_t)(r->offset / m.row_len);
    if (r->rc) {
      fprintf(stderr, "psctl: %s\n", r->err);
      continue;
    }
    memset(have + (lo - a), 1, (size_t)(r->count / m.row_len));
  }
  /* Missing runs of rows, each with the shard that holds it. */
  missing = json_array();
  for (int s = 0; s < spec->nps; s++) {
    int64_t lo = m.begin[s] > a ? m.begin[s] : a;
    int64_t hi = m.end[s] < b ? m.end[s] : b;
    if (lo < hi && !have[lo - a])
      json_array_append_new(missing,
                            json_pack("{s:[I, I], s:i, s:s}", "rows",
                                      (json_int_t)lo, (json_int_t)hi, "shard",
                                      s, "address", spec->ps[s].text));
  }
  root = json_pack("{s:s, s:O, s:s, s:[I, I], s:o}", "name", m.name, "shape",
                   m.shape, "dtype", "f32", "rows", (json_int_t)a,
                   (json_int_t)b, "missing", missing);
  if (p->stats) {
    struct stats st = {0};
    uint64_t finite;
    for (int64_t r = a; r < b; r++)
      if (have[r - a])
        stats_add(&st, x + (uint64_t)(r - a) * m.row_len, m.row_len);
    finite = st.elements - st.nan;
    json_object_set_new(
        root, "stats",
        json_pack("{s:I, s:I, s:o, s:o, s:o, s:o}", "elements",
                  (json_int_t)st.elements, "nan", (json_int_t)st.nan, "min",
                  finite ? num_json(st.min) : json_null(), "max",
                  finite ? num_json(st.max) : json_null(), "mean",
                  finite ? num_json(st.sum / finite) : json_null(), "l2",
                  num_json(sqrt(st.sumsq))));
    if (!p->json) {
      struct table t;
      tbl_init(&t, 8, "VARIABLE", "ROWS", ">ELEMENTS", ">MIN", ">MAX", ">MEAN",
               ">L2 NORM", ">NAN");
      tbl_cell(&t, "%s", m.name);
      tbl_cell(&t, "[%lld, %lld)", (long long)a, (long long)b);
      tbl_cell(&t, "%llu", (unsigned long long)st.elements);
      tbl_cell(&t, "%.9g", finite ? st.min : NAN);
      tbl_cell(&t, "%.9g", finite ? st.max : NAN);
      tbl_cell(&t, "%.9g", finite ? st.sum / finite : NAN);
      tbl_cell(&t, "%.9g", sqrt(st.sumsq));
      tbl_cell(&t, "%llu", (unsigned long long)st.nan);
      rc = tbl_print(&t);
      print_missing(missing);
    }
  } else if (p->json) {
    json_t *vals = json_array();
    int one_d = json_array_size(m.shape) == 1;
    for (int64_t r = a; r < b; r++) {
      const float *row = x + (uint64_t)(r - a) * m.row_len;
      json_array_append_new(vals, !have[r - a] ? json_null()
                                  : one_d      ? num_json(row[0])
                                               : row_json(row, m.shape, 1));
    }
    json_object_set_new(root, "values", vals);
  } else {
    char shape[64], buf[32];
    int w = 1, per_line, one_d = json_array_size(m.shape) == 1;
    int iw = snprintf(buf, sizeof buf, "%lld", (long long)(b - 1));
    shape_text(m.shape, shape, sizeof shape);
    printf("# %s %s f32, rows [%lld, %lld), ", m.name, shape, (long long)a,
           (long long)b);
    if (one_d)
      printf("each line led by its first value's index\n");
    else
      printf("each row led by its index\n");
    for (int64_t r = a; r < b; r++)
      for (uint64_t k = 0; have[r - a] && k < m.row_len; k++) {
        int len = snprintf(buf, sizeof buf, "%.9g",
                           x[(uint64_t)(r - a) * m.row_len + k]);
        w = len > w ? len : w;
      }
    /* As many right-aligned values per line as fit LINE_WIDTH; a long row
     * goes on over indented lines. */
    per_line = (LINE_WIDTH - iw - 1) / (w + 1);
    if (per_line < 1)
      per_line = 1;
    for (int64_t r = a; r < b;) {
      if (!have[r - a]) {
        /* A run of missing rows, one line per shard that holds them. */
        int s = 0;
        int64_t e = r;
        while (s < spec->nps && !(m.begin[s] <= r && r < m.end[s]))
          s++;
        while (e < b && !have[e - a] && (s == spec->nps || e < m.end[s]))
          e++;
        printf("# rows [%lld, %lld) missing: ps:%d (%s) did not answer\n",
               (long long)r, (long long)e, s,
               s < spec->nps ? spec->ps[s].text : "?");
        r = e;
        continue;
      }
      if (one_d) {
        int64_t e = r + per_line;
        printf("%*lld:", iw, (long long)r);
        for (; r < e && r < b && have[r - a]; r++)
          printf(" %*.9g", w, x[r - a]);
        printf("\n");
        continue;
      }
      printf("%*lld:", iw, (long long)r);
      for (uint64_t k = 0; k < m.row_len; k++) {
        if (k > 0 && k % per_line == 0)
          printf("\n%*s", iw + 1, "");
        printf(" %*.9g", w, x[(uint64_t)(r - a) * m.row_len + k]);
      }
      printf("\n");
      r++;
    }
  }
  if (p->json && !rc) {
    json_object_set_new(root, "down", down_json(p));
    rc = print_json(root);
  } else if (!rc) {
    print_down(p);
  }
  for (int i = 0; i < nreads && !rc; i++)
    if (reads[i].rc)
      rc = 1;
out:
  json_decref(root);
  free(reads);
  free(have);
  free(x);
  map_free(&m);
  return finish(p, rc);
}

/* ---- workers ---- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The p50 the straggler rule compares (see the help of `workers`). */
static double rule_p50(json_t *w, int sync) {
  return jnum(w, sync ? "lag_p50_ms" : "step_p50_ms");
}

static int rule_eligible(json_t *w) {
  return json_is_true(json_object_get(w, "live")) &&
         jint(w, "step_samples") >= STRAGGLER_SAMPLES;
}

/* Median of the eligible workers' p50; sets *n to how many there are. */
static double rule_median(json_t *workers, int sync, int *n) {
  double v[256], med = 0;
  json_t *w;
  size_t i;
  *n = 0;
  json_array_foreach(workers, i, w) {
    if (rule_eligible(w) && *n < 256)
      v[(*n)++] = rule_p50(w, sync);
  }
  if (*n > 0) {
    qsort(v, *n, sizeof *v, cmp_double);
    med = *n % 2 ? v[*n / 2] : (v[*n / 2 - 1] + v[*n / 2]) / 2;
  }
  return med;
}

static int cmd_workers(struct psctl *p) {
  json_t *coord = p->st[0], *workers, *w, *list = NULL, *root = NULL;
  int sync, ssp = p->spec->job.staleness >= 0, n, rc = 0;
  double med;
  size_t i;

  if ((rc = no_operands(p, "workers")))
    return rc;
  if (!coord) {
    fprintf(stderr,
            "psctl: workers: ps:0 (%s), the coordinator, is down; only it "
            "knows the workers\n",
            p->spec->ps[0].text);
    if (p->json) {
      root = json_pack("{s:[], s:o}", "workers", "down", down_json(p));
      rc = print_json(root);
      json_decref(root);
    }
    return finish(p, rc ? rc : 1);
  }
  sync = strcmp(jstr(coord, "mode"), "sync") == 0;
  workers = json_object_get(coord, "workers");
  med = rule_median(workers, sync, &n);
  list = json_array();
  json_array_foreach(workers, i, w) {
    int live = json_is_true(json_object_get(w, "live"));
    int straggler = rule_eligible(w) && n >= 2 &&
                    rule_p50(w, sync) > STRAGGLER_FACTOR * med &&
                    rule_p50(w, sync) - med >= STRAGGLER_MIN_MS;
    json_t *o = json_pack(
        "{s:I, s:s, s:b, s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:I, s:f, s:b}",
        "worker", (json_int_t)jint(w, "worker"), "state",
        live                                         ? "live"
        : json_is_true(json_object_get(w, "joined")) ? "gone"
                                                     : "never joined",
        "live", live, "joins", (json_int_t)jint(w, "joins"), "last_step",
        (json_int_t)jint(w, "last_step"), "pushes",
        (json_int_t)jint(w, "pushes"), "clock", (json_int_t)jint(w, "clock"),
        "step_p50_ms", jnum(w, "step_p50_ms"), "step_p95_ms",
        jnum(w, "step_p95_ms"), "step_samples",
        (json_int_t)jint(w, "step_samples"), "applied",
        (json_int_t)jint(w, "applied"), "last_seen_ms", jnum(w, "last_seen_ms"),
        "straggler", straggler);
    json_object_set_new(o, "dropped", json_integer(jint(w, "dropped")));
    if (sync) {
      json_object_set_new(o, "lag_p50_ms", json_real(jnum(w, "lag_p50_ms")));
      json_object_set_new(o, "lag_p95_ms", json_real(jnum(w, "lag_p95_ms")));
    }
    json_array_append_new(list, o);
  }
  if (p->json) {
    char rule[256];
    snprintf(rule, sizeof rule,
             "live, %s p50 > %.1f x median of the live workers' (%d of them "
             "with >= %d steps) and >= %.0f ms above it",
             sync ? "lag" : "step", STRAGGLER_FACTOR, n, STRAGGLER_SAMPLES,
             STRAGGLER_MIN_MS);
    root = json_pack("{s:s, s:s, s:O, s:{s:s, s:f, s:i}, s:o}", "job",
                     p->spec->job.name, "mode", jstr(coord, "mode"), "workers",
                     list, "straggler_rule", "text", rule, "median_p50_ms", med,
                     "compared", n, "down", down_json(p));
    rc = print_json(root);
  } else {
    struct table t;
    if (sync)
      tbl_init(&t, 10, "WORKER", "STATE", ">STEP", ">STEP p50", ">STEP p95",
               ">LAG p50", ">APPLIED", ">DROPPED", ">LAST SEEN", "NOTE");
    else if (ssp)
      tbl_init(&t, 9, "WORKER", "STATE", ">PUSHES", ">CLOCK", ">STEP p50",
               ">STEP p95", ">DROPPED", ">LAST SEEN", "NOTE");
    else
      tbl_init(&t, 8, "WORKER", "STATE", ">PUSHES", ">STEP p50", ">STEP p95",
               ">DROPPED", ">LAST SEEN", "NOTE");
    json_array_foreach(list, i, w) {
      char t50[32] = "-", t95[32] = "-", lag[32] = "-", seen[48] = "never";
      if (jint(w, "step_samples") > 0) {
        cm_fmt_ms(jnum(w, "step_p50_ms"), t50, sizeof t50);
        cm_fmt_ms(jnum(w, "step_p95_ms"), t95, sizeof t95);
      }
      if (sync && jnum(w, "lag_p50_ms") > 0)
        cm_fmt_ms(jnum(w, "lag_p50_ms"), lag, sizeof lag);
      if (jnum(w, "last_seen_ms") >= 0) {
        char ms[32];
        cm_fmt_ms(jnum(w, "last_seen_ms"), ms, sizeof ms);
        snprintf(seen, sizeof seen, "%s ago", ms);
      }
      tbl_cell(&t, "worker:%lld", jint(w, "worker"));
      tbl_cell(&t, "%s", jstr(w, "state"));
      if (sync)
        tbl_cell(&t, "%lld", jint(w, "last_step"));
      else
        tbl_cell(&t, "%lld", jint(w, "pushes"));
      if (ssp && !sync)
        tbl_cell(&t, "%lld", jint(w, "clock"));
      tbl_cell(&t, "%s", t50);
      tbl_cell(&t, "%s", t95);
      if (sync) {
        tbl_cell(&t, "%s", lag);
        tbl_cell(&t, "%lld", jint(w, "applied"));
      }
      tbl_cell(&t, "%lld", jint(w, "dropped"));
      tbl_cell(&t, "%s", seen);
      tbl_cell(&t, "%s",
               json_is_true(json_object_get(w, "straggler")) ? "straggler"
                                                             : "");
    }
    rc = tbl_print(&t);
    if (!rc) {
      char m[32];
      cm_fmt_ms(med, m, sizeof m);
      if (n >= 2)
        printf("straggler: live and %s p50 > %.1f x %s (the median of %d "
               "live workers) and >= %.0f ms above it\n",
               sync ? "lag" : "step", STRAGGLER_FACTOR, m, n, STRAGGLER_MIN_MS);
      else
        printf("straggler: needs 2 live workers with %d timed steps or "
               "more; %d so far\n",
               STRAGGLER_SAMPLES, n);
    }
    print_down(p);
  }
  json_decref(list);
  json_decref(root);
  return finish(p, rc);
}

/* ---- metrics ---- */

/* Adds a metric family to `all`; returns its samples array (borrowed). */
static json_t *family(json_t *all, const char *name, const char *type,
                      const char *help) {
  json_t *samples = json_array();
  json_array_append_new(all,
                        json_pack("{s:s, s:s, s:s, s:o}", "name", name, "type",
                                  type, "help", help, "samples", samples));
  return samples;
}

/* Adds a sample; labels and value are stolen. */
static void sample(json_t *samples, const char *name, json_t *labels,
                   json_t *value) {
  json_array_append_new(samples, json_pack("{s:s, s:o, s:o}", "name", name,
                                           "labels", labels, "value", value));
}

static json_t *shard_label(int s) {
  char v[16];
  snprintf(v, sizeof v, "%d", s);
  return json_pack("{s:s}", "shard", v);
}

/* The samples of one histogram (bucket counts from the status document,
 * per bucket) under `labels` (borrowed; each sample gets a copy). */
static void hist_samples(json_t *samples, const char *base, json_t *labels,
                         json_t *h) {
  char name[128], le[32];
  json_t *bounds = json_object_get(h, "bounds"),
         *counts = json_object_get(h, "counts");
  long long cum = 0;
  for (size_t i = 0; i < json_array_size(counts); i++) {
    json_t *l = json_deep_copy(labels);
    cum += json_integer_value(json_array_get(counts, i));
    if (i < json_array_size(bounds))
      snprintf(le, sizeof le, "%g",
               json_number_value(json_array_get(bounds, i)));
    else
      snprintf(le, sizeof le, "+Inf");
    json_object_set_new(l, "le", json_string(le));
    snprintf(name, sizeof name, "%s_bucket", base);
    sample(samples, name, l, json_integer(cum));
  }
  snprintf(name, sizeof name, "%s_sum", base);
  sample(samples, name, json_deep_copy(labels), json_real(jnum(h, "sum")));
  snprintf(name, sizeof name, "%s_count", base);
  sample(samples, name, json_deep_copy(labels), json_integer(cum));
}

/* The histogram called `name` in a status document's list, or NULL. */
static json_t *find_hist(json_t *st, const char *name) {
  json_t *h;
  size_t i;
  json_array_foreach(json_object_get(st, "histograms"), i, h) {
    if (strcmp(jstr(h, "name"), name) == 0)
      return h;
  }
  return NULL;
}

/* Every family, built from the status documents. */
static json_t *build_metrics(const struct psctl *p) {
  static const struct {
    const char *key, *name, *type, *help;
  } per_shard[] = {
      {"uptime_s", "psd_uptime_seconds", "gauge", "Seconds since psd started."},
      {"pulls", "psd_pulls_total", "counter", "Pull calls answered."},
      {"pushes", "psd_pushes_total", "counter",
       "Push calls applied (async) or staged (sync)."},
      {"examples", "psd_examples_total", "counter",
       "Examples behind the pushes."},
      {"bytes_in", "psd_received_bytes_total", "counter",
       "Gradient payload bytes received by pushes."},
      {"bytes_out", "psd_sent_bytes_total", "counter",
       "Value payload bytes sent by pulls."},
      {"errors", "psd_errors_total", "counter",
       "Calls answered with an error."},
      {"unauthenticated", "psd_unauthenticated_total", "counter",
       "Calls refused for a missing or wrong bearer token."},
      {"nonfinite_pushes", "psd_nonfinite_pushes_total", "counter",
       "Pushes whose gradient held NaN or Inf, rejected, skipped or applied "
       "(job.nonfinite)."},
      {"duplicates", "psd_duplicate_pushes_total", "counter",
       "Push messages acknowledged without effect: retries of messages "
       "applied already."},
      {"step", "psd_step", "gauge", "Sync: steps committed on the shard."},
  };
  const struct cm_spec *spec = p->spec;
  json_t *all = json_array(), *f, *coord = p->st[0];
  char v[32];

  f = family(all, "psd_up", "gauge", "1 when the shard answered psctl.");
  for (int s = 0; s < spec->nps; s++) {
    json_t *l = shard_label(s);
    json_object_set_new(l, "address", json_string(spec->ps[s].text));
    sample(f, "psd_up", l, json_integer(p->st[s] != NULL));
  }
  for (size_t k = 0; k < sizeof per_shard / sizeof per_shard[0]; k++) {
    f = family(all, per_shard[k].name, per_shard[k].type, per_shard[k].help);
    for (int s = 0; s < spec->nps; s++) {
      json_t *x = p->st[s] ? json_object_get(p->st[s], per_shard[k].key) : 0;
      /* Steps exist in sync jobs only. */
      if (x && !strcmp(per_shard[k].key, "step") &&
          strcmp(jstr(p->st[s], "mode"), "sync") != 0)
        continue;
      if (x)
        sample(f, per_shard[k].name, shard_label(s), json_deep_copy(x));
    }
  }
  json_t *fv = family(all, "psd_variables", "gauge", "Variables declared.");
  json_t *fb = family(all, "psd_held_bytes", "gauge",
                      "Bytes held: values and optimizer slots.");
  for (int s = 0; s < spec->nps; s++) {
    json_t *vars = p->st[s] ? json_object_get(p->st[s], "vars") : NULL, *x;
    long long bytes = 0;
    size_t i;
    if (!vars)
      continue;
    json_array_foreach(vars, i, x) bytes += jint(x, "bytes");
    sample(fv, "psd_variables", shard_label(s),
           json_integer(json_array_size(vars)));
    sample(fb, "psd_held_bytes", shard_label(s), json_integer(bytes));
  }
  fv = family(all, "psd_variable_version", "gauge",
              "Pushes applied (async) or steps committed (sync) to the "
              "variable's rows on the shard.");
  fb = family(all, "psd_variable_held_bytes", "gauge",
              "Bytes the shard holds for the variable.");
  for (int s = 0; s < spec->nps; s++) {
    json_t *vars = p->st[s] ? json_object_get(p->st[s], "vars") : NULL, *x;
    size_t i;
    json_array_foreach(vars, i, x) {
      json_t *rows = json_object_get(x, "rows");
      if (json_integer_value(json_array_get(rows, 1)) <=
          json_integer_value(json_array_get(rows, 0)))
        continue; /* no rows here */
      snprintf(v, sizeof v, "%d", s);
      sample(fv, "psd_variable_version",
             json_pack("{s:s, s:s}", "variable", jstr(x, "name"), "shard", v),
             json_integer(jint(x, "version")));
      sample(fb, "psd_variable_held_bytes",
             json_pack("{s:s, s:s}", "variable", jstr(x, "name"), "shard", v),
             json_integer(jint(x, "bytes")));
    }
  }
  static const struct {
    const char *key, *name, *help;
  } hists[] = {
      {"push_seconds", "psd_push_seconds",
       "Push handling time on the shard, request decoded to answer sent."},
      {"pull_seconds", "psd_pull_seconds",
       "Pull handling time on the shard (a parked pull's wait excluded)."},
  };
  for (size_t k = 0; k < sizeof hists / sizeof hists[0]; k++) {
    f = family(all, hists[k].name, "histogram", hists[k].help);
    for (int s = 0; s < spec->nps; s++) {
      json_t *h = p->st[s] ? find_hist(p->st[s], hists[k].key) : NULL;
      if (h) {
        json_t *l = shard_label(s);
        hist_samples(f, hists[k].name, l, h);
        json_decref(l);
      }
    }
  }
  if (coord && json_is_true(json_object_get(coord, "coordinator"))) {
    json_t *workers = json_object_get(coord, "workers"), *w;
    json_t *fl = family(all, "psd_worker_live", "gauge",
                        "1 when the coordinator counts the worker as live.");
    json_t *fa = family(all, "psd_worker_applied_total", "counter",
                        "Sync: the worker's gradients applied.");
    json_t *fd = family(all, "psd_worker_dropped_total", "counter",
                        "Sync: the worker's gradients dropped.");
    json_t *fp = family(all, "psd_worker_pushes_total", "counter",
                        "Async: the worker's pushes to shard 0.");
    json_t *fs = family(all, "psd_worker_last_seen_seconds", "gauge",
                        "Seconds since the coordinator last heard from the "
                        "worker.");
    json_t *fh =
        family(all, "psd_worker_step_seconds", "histogram",
               "The worker's step time: between its admissions (sync) or "
               "its pushes to shard 0 (async).");
    size_t i;
    json_array_foreach(workers, i, w) {
      snprintf(v, sizeof v, "%lld", jint(w, "worker"));
      json_t *l = json_pack("{s:s}", "worker", v);
      sample(fl, "psd_worker_live", json_deep_copy(l),
             json_integer(json_is_true(json_object_get(w, "live"))));
      sample(fa, "psd_worker_applied_total", json_deep_copy(l),
             json_integer(jint(w, "applied")));
      sample(fd, "psd_worker_dropped_total", json_deep_copy(l),
             json_integer(jint(w, "dropped")));
      sample(fp, "psd_worker_pushes_total", json_deep_copy(l),
             json_integer(jint(w, "pushes")));
      if (jnum(w, "last_seen_ms") >= 0)
        sample(fs, "psd_worker_last_seen_seconds", json_deep_copy(l),
               json_real(jnum(w, "last_seen_ms") / 1e3));
      if (json_object_get(w, "step_time"))
        hist_samples(fh, "psd_worker_step_seconds", l,
                     json_object_get(w, "step_time"));
      json_decref(l);
    }
  }
  return all;
}

/* A label value with \, " and newlines escaped, as the format asks. */
static void print_label_value(const char *s) {
  for (; *s; s++) {
    if (*s == '\\' || *s == '"')
      printf("\\%c", *s);
    else if (*s == '\n')
      printf("\\n");
    else
      putchar(*s);
  }
}

static void print_value(json_t *v) {
  if (json_is_integer(v)) {
    printf("%lld", json_integer_value(v));
  } else {
    double x = json_number_value(v);
    if (isnan(x))
      printf("NaN");
    else if (isinf(x))
      printf(x > 0 ? "+Inf" : "-Inf");
    else
      printf("%.9g", x);
  }
}

static int cmd_metrics(struct psctl *p) {
  json_t *all, *f, *s, *root = NULL;
  size_t i, k;
  int rc = 0;

  if ((rc = no_operands(p, "metrics")))
    return rc;
  all = build_metrics(p);
  if (p->json) {
    root = json_pack("{s:o, s:o}", "metrics", all, "down", down_json(p));
    rc = print_json(root);
    json_decref(root);
    return finish(p, rc);
  }
  json_array_foreach(all, i, f) {
    if (json_array_size(json_object_get(f, "samples")) == 0)
      continue;
    printf("# HELP %s %s\n# TYPE %s %s\n", jstr(f, "name"), jstr(f, "help"),
           jstr(f, "name"), jstr(f, "type"));
    json_array_foreach(json_object_get(f, "samples"), k, s) {
      json_t *labels = json_object_get(s, "labels"), *lv;
      const char *key;
      int first = 1;
      printf("%s", jstr(s, "name"));
      json_object_foreach(labels, key, lv) {
        printf("%s%s=\"", first ? "{" : ",", key);
        print_label_value(json_string_value(lv));
        printf("\"");
        first = 0;
      }
      printf("%s ", first ? "" : "}");
      print_value(json_object_get(s, "value"));
      printf("\n");
    }
  }
  json_decref(all);
  return finish(p, rc);
}

/* ---- main ---- */

/* Asks every shard for its status; names each one that does not answer. */
static int fetch_status(struct psctl *p) {
  int n = p->spec->nps;
  if (!(p->st = calloc(n, sizeof *p->st)) ||
      !(p->why = calloc(n, sizeof *p->why)))
    return CM_ENOMEM;
  for (int s = 0; s < n; s++) {
    char *text = NULL;
    int rc = dw_client_status(p->client, s, &text);
    if (rc == 0 && !(p->st[s] = json_loads(text, 0, NULL)))
      rc = CM_ENOMEM;
    free(text);
    if (rc == 0)
      continue;
    p->why[s] = strdup(*dw_client_error(p->client) ? dw_client_error(p->client)
                                                   : cm_strerror(rc));
    fprintf(stderr, "psctl: ps:%d (%s) is down: %s\n", s, p->spec->ps[s].text,
            p->why[s] ? p->why[s] : cm_strerror(rc));
    p->down++;
  }
  return 0;
}

int main(int argc, char **argv) {
  enum { OPT_ROWS = 256, OPT_STATS, OPT_WAIT, OPT_SLOTS, OPT_OUT };
  static const struct option opts[] = {{"cluster", required_argument, 0, 'c'},
                                       {"json", no_argument, 0, 'j'},
                                       {"timeout", required_argument, 0, 't'},
                                       {"rows", required_argument, 0, OPT_ROWS},
                                       {"stats", no_argument, 0, OPT_STATS},
                                       {"wait", no_argument, 0, OPT_WAIT},
                                       {"slots", no_argument, 0, OPT_SLOTS},
                                       {"out", required_argument, 0, OPT_OUT},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *cluster = NULL;
  const struct command *cmd = NULL;
  struct cm_spec *spec = NULL;
  struct psctl p = {0};
  char err[8192];
  int timeout = 0, ch, rc = 0;

  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
    case 'c':
      cluster = optarg;
      break;
    case 'j':
      p.json = 1;
      break;
    case 't':
      timeout = atoi(optarg);
      break;
    case OPT_ROWS:
      p.rows = optarg;
      break;
    case OPT_STATS:
      p.stats = 1;
      break;
    case OPT_WAIT:
      p.wait = 1;
      break;
    case OPT_SLOTS:
      p.slots = 1;
      break;
    case OPT_OUT:
      p.out = optarg;
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return EXIT_USAGE;
    }
  }
  for (int i = 0; optind < argc && i < NCOMMANDS; i++)
    if (strcmp(argv[optind], commands[i].name) == 0)
      cmd = &commands[i];
  if (!cluster || !cmd) {
    if (optind < argc && !cmd)
      fprintf(stderr, "psctl: unknown command '%s'\n", argv[optind]);
    usage(stderr);
    return EXIT_USAGE;
  }
  p.argc = argc - optind - 1;
  p.argv = argv + optind + 1;
  if ((p.rows || p.stats) && cmd->run != cmd_get) {
    fprintf(stderr, "psctl: --rows and --stats belong to 'get', not '%s'\n",
            cmd->name);
    return EXIT_USAGE;
  }
  if ((p.wait && cmd->run != cmd_checkpoint) ||
      ((p.slots || p.out) && cmd->run != cmd_export)) {
    fprintf(stderr,
            "psctl: --wait belongs to 'checkpoint', --out and --slots "
            "to 'export', not '%s'\n",
            cmd->name);
    return EXIT_USAGE;
  }
  p.timeout_ms = timeout;
  if (cm_spec_load(cluster, &spec, err, sizeof err)) {
    fprintf(stderr, "psctl: %s\n", err);
    return EXIT_USAGE;
  }
  p.spec = spec;
  cm_rpc_global_init();
  cm_rpc_set_max_message((long long)spec->job.max_message_mb << 20);
  struct dw_client_opts o = {.worker = "psctl",
                             .timeout_ms = timeout > 0 ? timeout : 5000};
  if ((rc = dw_client_new(&p.client, spec, &o)) ||
      (cmd->needs_status && (rc = fetch_status(&p)))) {
    fprintf(stderr, "psctl: %s\n", cm_strerror(rc));
    rc = 1;
    goto out;
  }
  rc = cmd->run(&p);
out:
  for (int s = 0; p.st && s < spec->nps; s++) {
    json_decref(p.st[s]);
    free(p.why[s]);
  }
  free(p.st);
  free(p.why);
  dw_client_free(p.client);
  cm_spec_free(spec);
  cm_rpc_global_shutdown();
  return rc;
}
