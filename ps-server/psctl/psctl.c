/* psctl: the admin CLI. Asks every shard of a cluster spec for its status
 * (Admin.Status) and reads variables (Data.Pull), then prints aligned
 * tables, or JSON with --json. A shard that does not answer is named (index
 * and address), what the others answered is still printed, and psctl exits
 * 1. Each command is one function in a file of its own (psctl.h); `commands`
 * below lists them, so adding a command is one line there. This file holds
 * main, the command table and usage, and what the commands share: the
 * status documents and the way results are printed and end. */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "err.h"
#include "layout.h"
#include "psclient.h"
#include "psctl.h"
#include "rowids.h"
#include "rpc.h"
#include "spec.h"
#include "units.h"

/* One command of psctl. */
struct command {
  const char *name;           /* as typed */
  int (*run)(struct psctl *); /* returns the exit status */
  int needs_status;           /* 1: main first asks every shard's status */
  const char *synopsis;       /* operands and options, for usage */
  const char *help;           /* what it prints, for usage */
};

static const struct command commands[] = {
    {"status", psctl_cmd_status, 1, "",
     "every shard: up or down, address, mode, version or step, variables,\n"
     "bytes held, pulls, pushes, examples, errors; each shard's slices; the\n"
     "job: live workers, step, drops, the last steps' sets; per worker its\n"
     "joins and gradients applied and dropped (sync) or pushes to ps:0\n"
     "(async)"},
    {"vars", psctl_cmd_vars, 1, "",
     "every variable: shape, dtype, shard map (rows per shard), bytes held,\n"
     "version, optimizer"},
    {"get", psctl_cmd_get, 1, "VAR [--rows A:B] [--stats] | TABLE --ids A,B",
     "a variable's values assembled across shards (rows A to B-1, every\n"
     "row by default), each row led by its index and wrapped at 80 columns\n"
     "(1-D: as many values per line as fit, led by the first one's index),\n"
     "in %.9g (exact for f32); --stats: element count, min, max, mean, L2\n"
     "norm and NaN count instead (NaNs are left out of the others). JSON\n"
     "writes NaN and infinities as the strings \"NaN\", \"Infinity\",\n"
     "\"-Infinity\", and rows of a shard that is down as null. With\n"
     "--ids: the rows of embedding table TABLE with those ids, each with\n"
     "its optimizer state (named parts), push count, updates and last step"},
    {"workers", psctl_cmd_workers, 1, "",
     "per worker (from the coordinator, shard 0): state, last step (sync)\n"
     "or pushes and clock (async), step time p50/p95 over the last 128\n"
     "steps, gradients applied and dropped, last heartbeat, and a\n"
     "straggler mark. A live worker is a straggler when its p50 is above\n"
     "1.5x the median p50 of the live workers and above it by 1 ms or\n"
     "more (each p50 over at least 5 steps, 2 such workers or more). The\n"
     "p50 compared is the step time in async jobs; in sync jobs, where a\n"
     "barrier gives every worker the slowest one's step time, it is the\n"
     "lag: from the step's opening to the worker's admission request"},
    {"metrics", psctl_cmd_metrics, 1, "",
     "Prometheus text exposition (format 0.0.4) of every counter and\n"
     "histogram: psd_up, psd_*_total per shard, psd_variable_version,\n"
     "psd_push_seconds, psd_pull_seconds, psd_worker_*; see psctl(1)"},
    {"checkpoint", psctl_cmd_checkpoint, 0, "[--wait]",
     "every shard writes a checkpoint now (sync: of its last committed\n"
     "step); with --wait, prints each one's step, size, time and directory\n"
     "once written"},
    {"export", psctl_cmd_export, 0, "[TABLE] --out FILE.safetensors [--slots]",
     "every variable's live values, merged from all shards into one\n"
     "safetensors file with the whole shapes (numpy and PyTorch load it);\n"
     "--slots adds each variable's optimizer slots as \"<name>/<slot>\"\n"
     "(momentum: /momentum; adagrad: /accum; adam, adamw: /m and /v).\n"
     "With TABLE: that embedding table's stored rows from every shard,\n"
     "sorted by id, as \"ids\" (U64, [n]) and \"values\" (F32, [n, dim])"},
    {"tables", psctl_cmd_tables, 1, "",
     "every embedding table per shard: rows, memory held, the rows' raw\n"
     "value and state bytes and their ratio, rows admitted, pulls and\n"
     "pushes not admitted, rows evicted, ids pending admission, optimizer;\n"
     "then each table's admission and eviction rules"},
    {"top", psctl_cmd_top, 1, "TABLE [--top K]",
     "the K (default 10) rows of TABLE with the most pushes, all shards"},
    {"shrink", psctl_cmd_shrink, 1, "TABLE",
     "evicts TABLE's rows by its eviction rules now, on every shard\n"
     "(rows untouched for eviction.after_steps, or pushed fewer than\n"
     "eviction.min_count times); prints the rows evicted and left"},
    {"reshard", psctl_cmd_reshard, 0,
     "--shards M [--moves [--batch B] [--rate MB/s] | --stop] | --cancel",
     "changes the running job's shard count to M (1..the spec's\n"
     "cluster.ps addresses; the shards past the count stand by) while it\n"
     "trains. Where the job can move live (async, tables, rows by\n"
     "buckets; --moves insists): ps:0 moves the table rows, B buckets a\n"
     "batch (default: 16,384 rows at most, within half of\n"
     "job.max_message_mb, 256 buckets at most), at most MB/s, then\n"
     "switches the layout (the dense variables re-placed); prints a\n"
     "progress line a second (bucket moves left, MB/s, lag, last pause),\n"
     "then the result; exit 0 done, 1 stopped (a failed batch, --cancel,\n"
     "the switch: the job trains partly moved, asking again resumes).\n"
     "--cancel stops it after the batch under way. Otherwise, or with\n"
     "--stop: every shard stops (final checkpoint), ps:0 cuts the\n"
     "checkpoint onto M shards, and every shard starts again in the new\n"
     "layout; prints each shard as it comes up; exit 1 when refused or\n"
     "aborted (the job keeps its layout). Workers re-plan either way"},
    {"serving", psctl_cmd_serving, 0, "",
     "every serving task (cluster.serve): its training shard, the\n"
     "publication version its lookups reflect and that version's step,\n"
     "AGE (now minus the version's cut), BEHIND (versions published that\n"
     "it has not applied yet), rows and memory held, publications\n"
     "refused, lookups answered; a task that is down is named"},
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
  fprintf(
      f,
      "\nOptions:\n"
      "  --cluster FILE  the job's cluster spec; or, as psd takes it,\n"
      "                  slurm[:FILE] (inside the job's allocation),\n"
      "                  k8s[:FILE] (in a pod of the job, kubectl exec),\n"
      "                  tf_config[:FILE]\n"
      "  --json          one JSON document instead of tables\n"
      "  --timeout MS    deadline per call (default 5000; checkpoint\n"
      "                  --wait and export: 600000)\n"
      "  --rows A:B      get: rows A (included) to B (excluded); A or B\n"
      "                  may be left out\n"
      "  --stats         get: statistics instead of values\n"
      "  --wait          checkpoint: answer once every shard has written\n"
      "  --out FILE      export: the safetensors file to write\n"
      "  --slots         export: the optimizer's slots too\n"
      "  --ids A,B,C     get TABLE: the rows with these ids (decimal u64)\n"
      "  --top K         top: how many rows (default 10)\n"
      "  --shards M      reshard: the new shard count\n"
      "  --moves         reshard: move table rows live, batch by batch (the\n"
      "                  default where the job can; refused where not)\n"
      "  --stop          reshard: every shard stops, ps:0 cuts\n"
      "  --batch B       reshard, a live move: buckets per batch (1..4096)\n"
      "  --rate MB/s     reshard, a live move: bytes moved per second at most\n"
      "  --cancel        reshard: stop the live move under way\n"
      "\n"
      "Exit status: 0 every shard answered, 1 a shard did not (it is\n"
      "named; what the others answered is printed) or a variable does\n"
      "not exist, 2 usage or spec error.\n");
}

/* Edit distance (insertions, deletions, substitutions and swaps of two
 * neighbours) between a and b, stopping at PSCTL_NAME_MAX characters: enough
 * for a command name, and a typo is never longer. */
#define PSCTL_NAME_MAX 32
static int edit_distance(const char *a, const char *b) {
  int d[PSCTL_NAME_MAX + 1][PSCTL_NAME_MAX + 1];
  int n = (int)strnlen(a, PSCTL_NAME_MAX), m = (int)strnlen(b, PSCTL_NAME_MAX);
  for (int i = 0; i <= n; i++)
    d[i][0] = i;
  for (int j = 0; j <= m; j++)
    d[0][j] = j;
  for (int i = 1; i <= n; i++)
    for (int j = 1; j <= m; j++) {
      int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best)
        best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best)
        best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[n][m];
}

/* Says that `name` is no command, with the nearest one when it is a likely
 * typo (at most 2 edits, and fewer than the name's length, so that "x" does
 * not suggest "get"), then the list of commands. */
static void unknown_command(const char *name) {
  const char *near = NULL;
  int best = 3;
  for (int i = 0; i < NCOMMANDS; i++) {
    int d = edit_distance(name, commands[i].name);
    if (d < best && d < (int)strlen(name)) {
      best = d;
      near = commands[i].name;
    }
  }
  if (near)
    fprintf(stderr, "psctl: unknown command '%s'; did you mean '%s'?\n", name,
            near);
  else
    fprintf(stderr, "psctl: unknown command '%s'\n", name);
  fprintf(stderr, "commands:");
  for (int i = 0; i < NCOMMANDS; i++)
    fprintf(stderr, " %s", commands[i].name);
  fprintf(stderr, " (psctl --help says what each does)\n");
}

/* ---- reading status documents ---- */

int psctl_status_doc(struct psctl *p, int s, json_t **doc) {
  char *text = NULL;
  int rc = psc__client_status(p->client, s, &text);
  *doc = NULL;
  if (rc == 0 && !(*doc = json_loads(text, 0, NULL)))
    rc = CM_ENOMEM;
  free(text);
  return rc;
}

/* The job's layout as the shards that answered hold it, taken by the
 * client before any call is planned: each shard's in turn, the client
 * keeping the newest (psc__client_take_layout: the newest version, and of
 * a live move under way the most moves any of them knows made). Ids go to
 * their home shards from the first call, not by job.shards until a shard
 * answers "moved" (docs/reshard.md). Returns 0. */
static int take_layout(struct psctl *p) {
  int said = 0;
  for (int s = 0; s < p->spec->nps; s++) {
    if (!p->st[s])
      continue;
    /* A shard before rules says none: its rows are modulo's. */
    int rows = cm_layout_rule_parse(cm_status_str(p->st[s], "rows"));
    if (psc__client_take_layout(p->client, s,
                                (uint64_t)cm_status_int(p->st[s], "layout"),
                                (int)cm_status_int(p->st[s], "num_shards"),
                                rows ? rows : CM_LAYOUT_RULE_MODULO,
                                (int)cm_status_int(p->st[s], "move_to"),
                                (int)cm_status_int(p->st[s], "moved")) &&
        !said++)
      /* A spec with fewer addresses than the job's layout: said once, and
       * the shards it lists are still shown. */
      fprintf(stderr, "psctl: %s\n", psc__client_error(p->client));
  }
  return 0;
}

/* Asks every shard for its status; names each one that does not answer. */
static int fetch_status(struct psctl *p) {
  int n = p->spec->nps;
  if (!(p->st = calloc(n, sizeof *p->st)) ||
      !(p->why = calloc(n, sizeof *p->why)))
    return CM_ENOMEM;
  for (int s = 0; s < n; s++) {
    int rc = psctl_status_doc(p, s, &p->st[s]);
    if (rc == 0)
      continue;
    p->why[s] =
        strdup(*psc__client_error(p->client) ? psc__client_error(p->client)
                                             : cm_strerror(rc));
    fprintf(stderr, "psctl: ps:%d (%s) is down: %s\n", s, p->spec->ps[s].text,
            p->why[s] ? p->why[s] : cm_strerror(rc));
    p->down++;
  }
  return take_layout(p);
}

/* ---- output ---- */

/* "[784, 256]" from a JSON array of dimensions. */
void psctl_shape_text(json_t *shape, char *buf, size_t len) {
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

/* Prints a JSON document; returns 0 or CM_ENOMEM. */
int psctl_print_json(json_t *doc) {
  char *text =
      doc ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  if (!text)
    return CM_ENOMEM;
  printf("%s\n", text);
  free(text);
  return 0;
}

/* [{"shard", "address", "error"}] for the shards that are down. */
json_t *psctl_down_json(const struct psctl *p) {
  json_t *a = json_array();
  for (int s = 0; s < p->spec->nps; s++)
    if (!p->st[s])
      json_array_append_new(a, json_pack("{s:i, s:s, s:s}", "shard", s,
                                         "address", p->spec->ps[s].text,
                                         "error", p->why[s] ? p->why[s] : ""));
  return a;
}

/* After a table: one line per down shard, so it is named on stdout too. */
void psctl_print_down(const struct psctl *p) {
  for (int s = 0; s < p->spec->nps; s++)
    if (!p->st[s])
      printf("ps:%d (%s) is down: nothing from it above\n", s,
             p->spec->ps[s].text);
}

/* A command's exit status from rc: an exit status (> 0), a CM_E* code
 * (< 0, said on stderr, exit 1), or 0: then 1 when a shard is down. */
int psctl_finish(const struct psctl *p, int rc) {
  if (rc < 0) {
    fprintf(stderr, "psctl: %s\n", cm_strerror(rc));
    return 1;
  }
  return rc ? rc : (p->down ? 1 : 0);
}

/* 0, or says that the command takes no operands and returns PSCTL_EXIT_USAGE.
 */
int psctl_no_operands(const struct psctl *p, const char *cmd) {
  if (p->argc == 0)
    return 0;
  fprintf(stderr, "psctl: '%s' takes no operands (got '%s')\n", cmd,
          p->argv[0]);
  return PSCTL_EXIT_USAGE;
}

/* ---- main ---- */

/* The client's settings for cmd. Every call's deadline is --timeout, else
 * 5 s, or 10 min for a call that waits for the shards to write (checkpoint
 * --wait) or for every variable's values (export); export's pulls travel in
 * its own chunks, PSCTL_EXPORT_WINDOW of them in flight per shard. */
static struct psc__client_opts client_opts(const struct command *cmd,
                                           const struct psctl *p, int timeout) {
  int export = cmd->run == psctl_cmd_export;
  int long_wait = export || (cmd->run == psctl_cmd_checkpoint && p->wait);
  struct psc__client_opts o = {.worker = "psctl"};
  o.timeout_ms = timeout > 0 ? timeout : long_wait ? 600000 : 5000;
  if (export) {
    o.chunk_bytes = PSCTL_EXPORT_CHUNK_BYTES;
    o.inflight = PSCTL_EXPORT_WINDOW;
  }
  return o;
}

int main(int argc, char **argv) {
  enum {
    OPT_ROWS = 256,
    OPT_STATS,
    OPT_WAIT,
    OPT_SLOTS,
    OPT_OUT,
    OPT_IDS,
    OPT_TOP,
    OPT_SHARDS,
    OPT_MOVES,
    OPT_STOP,
    OPT_BATCH,
    OPT_RATE,
    OPT_CANCEL
  };
  static const struct option opts[] = {
      {"cluster", required_argument, 0, 'c'},
      {"json", no_argument, 0, 'j'},
      {"timeout", required_argument, 0, 't'},
      {"rows", required_argument, 0, OPT_ROWS},
      {"stats", no_argument, 0, OPT_STATS},
      {"wait", no_argument, 0, OPT_WAIT},
      {"slots", no_argument, 0, OPT_SLOTS},
      {"out", required_argument, 0, OPT_OUT},
      {"ids", required_argument, 0, OPT_IDS},
      {"top", required_argument, 0, OPT_TOP},
      {"shards", required_argument, 0, OPT_SHARDS},
      {"moves", no_argument, 0, OPT_MOVES},
      {"stop", no_argument, 0, OPT_STOP},
      {"batch", required_argument, 0, OPT_BATCH},
      {"rate", required_argument, 0, OPT_RATE},
      {"cancel", no_argument, 0, OPT_CANCEL},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  const char *cluster = NULL;
  const struct command *cmd = NULL;
  struct cm_spec *spec = NULL;
  struct psctl p = {.how = -1};
  char err[8192];
  int timeout = 0, ch, rc = 0;
  long long n;

  while ((ch = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
    switch (ch) {
    case 'c':
      cluster = optarg;
      break;
    case 'j':
      p.json = 1;
      break;
    case 't':
      if (cm_parse_int(optarg, 0, INT_MAX, &n)) {
        fprintf(stderr, "psctl: --timeout takes milliseconds >= 0, not '%s'\n",
                optarg);
        return PSCTL_EXIT_USAGE;
      }
      timeout = (int)n;
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
    case 'o':
      p.out = optarg;
      break;
    case OPT_IDS:
      p.ids = optarg;
      break;
    case OPT_TOP:
      if (cm_parse_int(optarg, 1, INT_MAX, &n)) {
        fprintf(stderr, "psctl: --top takes a count >= 1, not '%s'\n", optarg);
        return PSCTL_EXIT_USAGE;
      }
      p.top = (int)n;
      break;
    case OPT_SHARDS:
      if (cm_parse_int(optarg, 1, INT_MAX, &n)) {
        fprintf(stderr, "psctl: --shards takes a shard count >= 1, not '%s'\n",
                optarg);
        return PSCTL_EXIT_USAGE;
      }
      p.shards = (int)n;
      break;
    case OPT_MOVES:
    case OPT_STOP:
      if (p.how >= 0 && p.how != (ch == OPT_MOVES)) {
        fprintf(stderr, "psctl: reshard takes --moves or --stop, not both\n");
        return PSCTL_EXIT_USAGE;
      }
      p.how = ch == OPT_MOVES;
      break;
    case OPT_BATCH:
      if (cm_parse_int(optarg, 1, CM_LAYOUT_BUCKETS, &n)) {
        fprintf(stderr,
                "psctl: --batch takes buckets per batch, 1..%u, not '%s'\n",
                CM_LAYOUT_BUCKETS, optarg);
        return PSCTL_EXIT_USAGE;
      }
      p.batch = (unsigned)n;
      break;
    case OPT_RATE: {
      char *end;
      p.rate = strtod(optarg, &end);
      if (end == optarg || *end || !(p.rate > 0) || p.rate > 1e9) {
        fprintf(stderr,
                "psctl: --rate takes MB/s above 0 (e.g. 50 or 0.5), not "
                "'%s'\n",
                optarg);
        return PSCTL_EXIT_USAGE;
      }
      break;
    }
    case OPT_CANCEL:
      p.cancel = 1;
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return PSCTL_EXIT_USAGE;
    }
  }
  for (int i = 0; optind < argc && i < NCOMMANDS; i++)
    if (strcmp(argv[optind], commands[i].name) == 0)
      cmd = &commands[i];
  if (optind < argc && !cmd) {
    unknown_command(argv[optind]);
    return PSCTL_EXIT_USAGE;
  }
  if (!cluster || !cmd) {
    usage(stderr);
    return PSCTL_EXIT_USAGE;
  }
  p.argc = argc - optind - 1;
  p.argv = argv + optind + 1;
  if ((p.rows || p.stats) && cmd->run != psctl_cmd_get) {
    fprintf(stderr, "psctl: --rows and --stats belong to 'get', not '%s'\n",
            cmd->name);
    return PSCTL_EXIT_USAGE;
  }
  if ((p.wait && cmd->run != psctl_cmd_checkpoint) ||
      ((p.slots || p.out) && cmd->run != psctl_cmd_export)) {
    fprintf(stderr,
            "psctl: --wait belongs to 'checkpoint', --out and --slots "
            "to 'export', not '%s'\n",
            cmd->name);
    return PSCTL_EXIT_USAGE;
  }
  if ((p.shards || p.how >= 0 || p.batch || p.rate > 0 || p.cancel) &&
      cmd->run != psctl_cmd_reshard) {
    fprintf(stderr,
            "psctl: --shards, --moves, --stop, --batch, --rate and --cancel "
            "belong to 'reshard', not '%s'\n",
            cmd->name);
    return PSCTL_EXIT_USAGE;
  }
  if ((p.ids && cmd->run != psctl_cmd_get) ||
      (p.top && cmd->run != psctl_cmd_top)) {
    fprintf(stderr, "psctl: --ids belongs to 'get', --top to 'top', not '%s'\n",
            cmd->name);
    return PSCTL_EXIT_USAGE;
  }
  /* A bad --ids is a usage mistake, said before any shard is asked. */
  if (p.ids && psctl_parse_ids(p.ids, &p.idv, &p.nids, err, sizeof err)) {
    fprintf(stderr, "psctl: %s\n", err);
    return PSCTL_EXIT_USAGE;
  }
  if (cm_spec_open(cluster, &spec, NULL, err, sizeof err)) {
    fprintf(stderr, "psctl: %s\n", err);
    free(p.idv);
    return PSCTL_EXIT_USAGE;
  }
  p.spec = spec;
  cm_rpc_global_init();
  cm_rpc_set_max_message((long long)spec->job.max_message_mb << 20);
  struct psc__client_opts o = client_opts(cmd, &p, timeout);
  p.timeout_ms = o.timeout_ms;
  if ((rc = psc__client_new(&p.client, spec, &o)) ||
      (cmd->needs_status && (rc = fetch_status(&p)))) {
    fprintf(stderr, "psctl: %s\n", cm_strerror(rc));
    rc = 1;
    goto out;
  }
  if (cmd->run == psctl_cmd_get && p.ids)
    rc = psctl_table_get(&p);
  else if (cmd->run == psctl_cmd_export && p.argc == 1)
    rc = psctl_table_export(&p);
  else
    rc = cmd->run(&p);
out:
  for (int s = 0; p.st && s < spec->nps; s++) {
    json_decref(p.st[s]);
    free(p.why[s]);
  }
  free(p.st);
  free(p.why);
  free(p.idv);
  psc__client_free(p.client);
  cm_spec_free(spec);
  cm_rpc_global_shutdown();
  return rc;
}
