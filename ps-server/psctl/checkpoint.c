/* psctl checkpoint: asks every shard at once to write a checkpoint
 * (Admin.Checkpoint, through psc__client_checkpoint) and prints what each
 * answered, a shard that is down or failed included; exit status 1 names
 * them. Also the CHECKPOINTS table of psctl status. */
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "err.h"
#include "psclient.h"
#include "psctl.h"
#include "rpc.h"
#include "units.h"

/* A shard that could not be reached, as opposed to one that answered with
 * an error. */
static int is_down(int status) {
  return status == GRPC_STATUS_UNAVAILABLE ||
         status == GRPC_STATUS_DEADLINE_EXCEEDED;
}

static const char *status_name(int status) {
  return cm_rpc_status_name((grpc_status_code)status);
}

/* Says on stderr why shard s failed: the cause in words where the client
 * found one (not reached, a wrong token), then the status and message. */
static void say_failure(const struct psctl *p, int s,
                        const struct psc__checkpoint *k) {
  const char *down = is_down(k->status) ? " is down" : "";
  if (k->cause[0])
    fprintf(stderr, "psctl: ps:%d (%s)%s: %s [%s: %s]\n", s,
            p->spec->ps[s].text, down, k->cause, status_name(k->status),
            k->details);
  else
    fprintf(stderr, "psctl: ps:%d (%s)%s: %s: %s\n", s, p->spec->ps[s].text,
            down, status_name(k->status), k->details);
}

/* The answers as one JSON document. */
static int print_answers_json(const struct psctl *p,
                              const struct psc__checkpoint *k) {
  json_t *root = json_object(), *shards = json_array();
  int rc;
  for (int s = 0; s < p->spec->nps; s++) {
    json_t *e = json_pack("{s:i, s:s, s:b}", "shard", s, "address",
                          p->spec->ps[s].text, "ok", k[s].status == 0);
    if (k[s].standby) {
      json_object_set_new(e, "standby", json_true());
      json_object_set_new(e, "note", json_string(k[s].details));
    } else if (k[s].status == 0) {
      json_object_set_new(e, "written", json_boolean(k[s].written));
      json_object_set_new(e, "step", json_integer(k[s].step));
      json_object_set_new(e, "path", json_string(k[s].path));
      json_object_set_new(e, "bytes", json_integer(k[s].bytes));
      json_object_set_new(e, "ms", json_real(k[s].ms));
    } else {
      json_object_set_new(e, "status", json_string(status_name(k[s].status)));
      json_object_set_new(e, "error", json_string(k[s].details));
    }
    json_array_append_new(shards, e);
  }
  json_object_set_new(root, "shards", shards);
  rc = psctl_print_json(root);
  json_decref(root);
  return rc;
}

/* The answers as a table, a line per shard. */
static void print_answers(const struct psctl *p,
                          const struct psc__checkpoint *k) {
  printf("%-6s %-22s %-8s %10s %10s %9s  %s\n", "SHARD", "ADDRESS", "RESULT",
         "STEP", "SIZE", "TIME", "PATH");
  for (int s = 0; s < p->spec->nps; s++) {
    char size[32], ms[32];
    const char *state = is_down(k[s].status) ? "down"
                        : k[s].status        ? "failed"
                        : k[s].written       ? "written"
                                             : "queued";
    if (k[s].status || k[s].standby) {
      printf("ps:%-3d %-22s %-8s %10s %10s %9s  %s\n", s, p->spec->ps[s].text,
             k[s].standby ? "standby" : state, "-", "-", "-", k[s].details);
      continue;
    }
    cm_fmt_bytes((double)k[s].bytes, size, sizeof size);
    snprintf(ms, sizeof ms, "%.0f ms", k[s].ms);
    printf("ps:%-3d %-22s %-8s %10llu %10s %9s  %s\n", s, p->spec->ps[s].text,
           state, (unsigned long long)k[s].step, k[s].written ? size : "-",
           k[s].written ? ms : "-",
           k[s].written ? k[s].path : "(not waited for: --wait)");
  }
}

int psctl_cmd_checkpoint(struct psctl *p) {
  const struct cm_spec *spec = p->spec;
  struct psc__checkpoint *k = NULL;
  int rc = psctl_no_operands(p, "checkpoint"), bad = 0;

  if (rc)
    return rc;
  rc = 1;
  if (!(k = calloc(spec->nps, sizeof *k)) ||
      psc__client_checkpoint(p->client, p->wait, k) == CM_ENOMEM) {
    fprintf(stderr, "psctl: out of memory\n");
    goto out;
  }
  for (int s = 0; s < spec->nps; s++) {
    if (k[s].status) {
      say_failure(p, s, &k[s]);
      bad++;
    }
  }
  if (p->json) {
    if (print_answers_json(p, k)) {
      fprintf(stderr, "psctl: out of memory\n");
      goto out;
    }
  } else {
    print_answers(p, k);
  }
  rc = bad ? 1 : 0;
out:
  free(k);
  return rc;
}

/* ---- status's checkpoint table ---- */

void psctl_print_checkpoints(const struct cm_spec *spec, json_t **st) {
  int on = 0;
  for (int s = 0; s < spec->nps; s++) {
    const char *dir = st[s] ? json_string_value(json_object_get(
                                  json_object_get(st[s], "checkpoint"), "dir"))
                            : NULL;
    on |= dir && dir[0];
  }
  if (!on) {
    printf("\nCHECKPOINTS off: no checkpoint dir (set job.checkpoint.dir, "
           "--checkpoint-dir or STATE_DIRECTORY)\n");
    return;
  }
  printf("\n%-6s %10s %10s %9s %7s %6s  %s\n", "SHARD", "CKPT STEP", "SIZE",
         "TIME", "WRITTEN", "FAILED", "LAST");
  for (int s = 0; s < spec->nps; s++) {
    json_t *k = st[s] ? json_object_get(st[s], "checkpoint") : NULL;
    const char *dir = json_string_value(json_object_get(k, "dir"));
    const char *path = json_string_value(json_object_get(k, "path"));
    const char *error = json_string_value(json_object_get(k, "error"));
    char size[32], ms[32];
    if (!k || !dir || !dir[0]) {
      printf("ps:%-3d %10s\n", s, st[s] ? "off" : "down");
      continue;
    }
    cm_fmt_bytes((double)json_integer_value(json_object_get(k, "bytes")), size,
                 sizeof size);
    snprintf(ms, sizeof ms, "%.0f ms",
             json_real_value(json_object_get(k, "ms")));
    int any = path && path[0];
    printf("ps:%-3d %10lld %10s %9s %7lld %6lld  %s%s%s\n", s,
           json_integer_value(json_object_get(k, "step")), any ? size : "-",
           any ? ms : "-", json_integer_value(json_object_get(k, "written")),
           json_integer_value(json_object_get(k, "failed")),
           error && error[0] ? "LAST WRITE FAILED: " : "",
           error && error[0] ? error
           : any             ? path
                             : "none yet in ",
           error && error[0] ? ""
           : any             ? ""
                             : dir);
  }
}
