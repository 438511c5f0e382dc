/* psctl: the admin CLI. Asks every shard of a cluster spec for its status
 * and prints an aligned table, or JSON with --json. A shard that does not
 * answer is named, the others are still printed, and psctl exits 1.
 * checkpoint and export live in psctl_ckpt.c. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "err.h"
#include "psclient.h"
#include "psctl_ckpt.h"
#include "rpc.h"
#include "spec.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: psctl --cluster FILE [--json] [--timeout MS] status\n"
      "       psctl --cluster FILE [--json] checkpoint [--wait]\n"
      "       psctl --cluster FILE export --out FILE.safetensors [--slots]\n"
      "\n"
      "Commands:\n"
      "  status      every shard: address, up or down, variables, bytes\n"
      "              held, pulls, pushes, examples and errors; with the\n"
      "              variables' shapes, row ranges and versions, and the\n"
      "              last checkpoint\n"
      "  checkpoint  every shard writes a checkpoint now (sync: of its\n"
      "              last committed step); with --wait, prints each one's\n"
      "              step, size, time and directory once written\n"
      "  export      every variable's live values, merged from all shards\n"
      "              into one safetensors file with the whole shapes (numpy\n"
      "              and PyTorch load it); --slots adds the momentum slots\n"
      "              as \"<name>/momentum\"\n"
      "\n"
      "Options:\n"
      "  --cluster FILE  the job's cluster spec\n"
      "  --json          one JSON document instead of tables\n"
      "  --timeout MS    deadline per shard (default 5000; checkpoint\n"
      "                  --wait and export: 600000)\n"
      "\n"
      "Exit status: 0 every shard answered, 1 a shard did not (or its\n"
      "checkpoint or export failed), 2 usage or spec error.\n");
}

static void human_bytes(double b, char *buf, size_t len) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    i++;
  }
  snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

/* The coordinator's view: workers, and in sync mode the last steps. */
static void print_job(const struct cm_spec *spec, json_t *coord) {
  json_t *workers = json_object_get(coord, "workers"), *w, *steps, *r;
  size_t i, n;
  printf("\nJOB %s  mode %s  step %lld\n", spec->job.name, spec->job.mode,
         json_integer_value(json_object_get(coord, "step")));
  printf("%-9s %-5s %6s %9s %9s %12s\n", "WORKER", "STATE", "JOINS", "APPLIED",
         "DROPPED", "LAST SEEN");
  json_array_foreach(workers, i, w) {
    const char *state = json_is_true(json_object_get(w, "live"))     ? "live"
                        : json_is_true(json_object_get(w, "joined")) ? "gone"
                                                                     : "-";
    double seen = json_real_value(json_object_get(w, "last_seen_ms"));
    char ago[32];
    if (seen < 0)
      snprintf(ago, sizeof ago, "never");
    else
      snprintf(ago, sizeof ago, "%.0f ms ago", seen);
    printf("worker:%-2lld %-5s %6lld %9lld %9lld %12s\n",
           json_integer_value(json_object_get(w, "worker")), state,
           json_integer_value(json_object_get(w, "joins")),
           json_integer_value(json_object_get(w, "applied")),
           json_integer_value(json_object_get(w, "dropped")), ago);
  }
  steps = json_object_get(coord, "steps");
  n = json_array_size(steps);
  if (n == 0)
    return;
  printf("\n%-8s %-20s %s\n", "STEP", "APPLIED", "DROPPED");
  for (i = n > 5 ? n - 5 : 0; i < n; i++) {
    char a[128] = "", d[128] = "";
    size_t k, la = 0, ld = 0;
    json_t *x;
    r = json_array_get(steps, i);
    json_array_foreach(json_object_get(r, "applied"), k, x) la +=
        snprintf(a + la, la < sizeof a ? sizeof a - la : 0, "%s%lld",
                 k ? "," : "", json_integer_value(x));
    json_array_foreach(json_object_get(r, "dropped"), k, x) ld +=
        snprintf(d + ld, ld < sizeof d ? sizeof d - ld : 0, "%s%lld",
                 k ? "," : "", json_integer_value(x));
    printf("%-8lld %-20s %s\n", json_integer_value(json_object_get(r, "step")),
           a[0] ? a : "-", d[0] ? d : "-");
  }
}

static void print_table(const struct cm_spec *spec, json_t **st) {
  char held[32], shape[64];
  printf("%-6s %-22s %-5s %5s %10s %9s %9s %10s %7s\n", "SHARD", "ADDRESS",
         "STATE", "VARS", "HELD", "PULLS", "PUSHES", "EXAMPLES", "ERRORS");
  for (int s = 0; s < spec->nps; s++) {
    if (!st[s]) {
      printf("%-6s %-22s %-5s\n", "", spec->ps[s].text, "down");
      continue;
    }
    json_t *vars = json_object_get(st[s], "vars"), *v;
    size_t i;
    double bytes = 0;
    json_array_foreach(vars, i, v) bytes +=
        json_integer_value(json_object_get(v, "bytes"));
    human_bytes(bytes, held, sizeof held);
    printf("ps:%-3d %-22s %-5s %5zu %10s %9lld %9lld %10lld %7lld\n", s,
           spec->ps[s].text, "up", json_array_size(vars), held,
           json_integer_value(json_object_get(st[s], "pulls")),
           json_integer_value(json_object_get(st[s], "pushes")),
           json_integer_value(json_object_get(st[s], "examples")),
           json_integer_value(json_object_get(st[s], "errors")));
  }
  printf("\n%-24s %-14s %-6s %-16s %10s %9s\n", "VARIABLE", "SHAPE", "SHARD",
         "ROWS", "HELD", "VERSION");
  for (int s = 0; s < spec->nps; s++) {
    json_t *vars = st[s] ? json_object_get(st[s], "vars") : NULL, *v;
    size_t i;
    json_array_foreach(vars, i, v) {
      json_t *sh = json_object_get(v, "shape"), *d, *rows;
      size_t k, n = 0;
      n += snprintf(shape + n, sizeof shape - n, "[");
      json_array_foreach(sh, k, d) n +=
          snprintf(shape + n, sizeof shape - n > 0 ? sizeof shape - n : 0,
                   "%s%lld", k ? "," : "", json_integer_value(d));
      if (n < sizeof shape)
        snprintf(shape + n, sizeof shape - n, "]");
      rows = json_object_get(v, "rows");
      char rr[40];
      snprintf(rr, sizeof rr, "[%lld, %lld)",
               json_integer_value(json_array_get(rows, 0)),
               json_integer_value(json_array_get(rows, 1)));
      human_bytes(json_integer_value(json_object_get(v, "bytes")), held,
                  sizeof held);
      printf("%-24s %-14s ps:%-3d %-16s %10s %9lld\n",
             json_string_value(json_object_get(v, "name")), shape, s, rr, held,
             json_integer_value(json_object_get(v, "version")));
    }
  }
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"cluster", required_argument, 0, 'c'},
                                       {"json", no_argument, 0, 'j'},
                                       {"timeout", required_argument, 0, 't'},
                                       {"wait", no_argument, 0, 'w'},
                                       {"slots", no_argument, 0, 's'},
                                       {"out", required_argument, 0, 'o'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *cluster = NULL;
  struct cm_spec *spec = NULL;
  struct dw_client *c = NULL;
  json_t **st = NULL;
  char err[8192];
  struct psd_ctl_opts ctl = {0};
  int json = 0, timeout = 0, ch, rc = 0, down = 0;

  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (ch) {
    case 'c':
      cluster = optarg;
      break;
    case 'j':
      json = 1;
      break;
    case 't':
      timeout = atoi(optarg);
      break;
    case 'w':
      ctl.wait = 1;
      break;
    case 's':
      ctl.slots = 1;
      break;
    case 'o':
      ctl.out = optarg;
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  const char *cmd = optind == argc - 1 ? argv[optind] : "";
  if (!cluster || (strcmp(cmd, "status") && strcmp(cmd, "checkpoint") &&
                   strcmp(cmd, "export"))) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(cmd, "export") && (!ctl.out || !ctl.out[0])) {
    fprintf(stderr, "psctl: export needs --out FILE.safetensors\n");
    return 2;
  }
  if ((ctl.wait && strcmp(cmd, "checkpoint")) ||
      ((ctl.slots || ctl.out) && strcmp(cmd, "export"))) {
    fprintf(stderr, "psctl: --wait goes with checkpoint, --out and --slots "
                    "with export (see psctl --help)\n");
    return 2;
  }
  if (cm_spec_load(cluster, &spec, err, sizeof err)) {
    fprintf(stderr, "psctl: %s\n", err);
    return 2;
  }
  cm_rpc_global_init();
  if (strcmp(cmd, "status")) {
    /* Writing a checkpoint or reading a whole model takes longer. */
    ctl.json = json;
    ctl.timeout_ms = timeout > 0
                         ? timeout
                         : (ctl.wait || !strcmp(cmd, "export") ? 600000 : 5000);
    rc = !strcmp(cmd, "checkpoint") ? psd_ctl_checkpoint(spec, &ctl)
                                    : psd_ctl_export(spec, &ctl);
    goto out;
  }
  if (timeout <= 0)
    timeout = 5000;
  struct dw_client_opts o = {.worker = "psctl",
                             .timeout_ms = timeout > 0 ? timeout : 5000};
  if ((rc = dw_client_new(&c, spec, &o)) ||
      !(st = calloc(spec->nps, sizeof *st))) {
    fprintf(stderr, "psctl: %s\n", cm_strerror(rc ? rc : CM_ENOMEM));
    rc = 1;
    goto out;
  }
  for (int s = 0; s < spec->nps; s++) {
    char *text = NULL;
    if (dw_client_status(c, s, &text) == 0)
      st[s] = json_loads(text, 0, NULL);
    else {
      fprintf(stderr, "psctl: ps:%d (%s) is down: %s\n", s, spec->ps[s].text,
              dw_client_error(c));
      down++;
    }
    free(text);
  }
  if (json) {
    json_t *root = json_object(), *shards = json_array();
    for (int s = 0; s < spec->nps; s++) {
      json_t *e = st[s] ? json_incref(st[s]) : json_object();
      json_object_set_new(e, "address", json_string(spec->ps[s].text));
      json_object_set_new(e, "up", json_boolean(st[s] != NULL));
      json_array_append_new(shards, e);
    }
    json_object_set_new(root, "shards", shards);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    printf("%s\n", text);
    free(text);
    json_decref(root);
  } else {
    print_table(spec, st);
    psd_ctl_print_checkpoints(spec, st);
    if (st[0] && json_is_true(json_object_get(st[0], "coordinator")))
      print_job(spec, st[0]);
  }
  rc = down ? 1 : 0;
out:
  for (int s = 0; st && s < spec->nps; s++)
    json_decref(st[s]);
  free(st);
  dw_client_free(c);
  cm_spec_free(spec);
  cm_rpc_global_shutdown();
  return rc;
}
