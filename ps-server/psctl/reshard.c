/* psctl reshard --shards M: changes a running job's shard count (a live
 * reshard, docs/reshard.md "Live"). Asks ps:0 (Admin.Reshard), which checks
 * the request and stops the shards for it, then follows the shards' Status
 * until every shard of the new layout serves it (and the others stand by),
 * saying each step once; exit 0 done, 1 refused or aborted (ps:0's words).
 * With --moves ps:0 moves the table rows live instead, batch by batch:
 * psctl follows ps:0's Status (move, reshard), printing a progress line a
 * second and the result; exit 0 done, 1 stopped. --cancel asks ps:0 to
 * stop the live move under way and follows it to its end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "clock.h"
#include "err.h"
#include "psclient.h"
#include "psctl.h"
#include "rpc.h"

#define RESHARD_WAIT_S 600 /* the longest psctl follows a reshard */
#define RESHARD_POLL_MS 100
#define MOVE_POLL_MS 200 /* ps:0's Status, while a live move runs */
#define MOVE_SAY_MS 1000 /* a progress line this often */
#define MOVE_DOWN_S 60   /* ps:0 silent this long: psctl stops following */

/* One progress line from ps:0's move figures. */
static void say_move(json_t *mv) {
  printf("moving: %lld of %lld bucket moves made, %lld left; %.1f MB/s, lag "
         "%lld rows, last pause %.1f ms (%lld copies)",
         cm_status_int(mv, "moved"), cm_status_int(mv, "moves"),
         cm_status_int(mv, "left"), cm_status_num(mv, "bytes_per_s") / 1e6,
         cm_status_int(mv, "lag_rows"),
         cm_status_int(mv, "last_pause_us") / 1e3,
         cm_status_int(mv, "last_rounds"));
  if (cm_status_int(mv, "waits") > 0)
    printf("; waited %.1f s for --rate", cm_status_num(mv, "waited_s"));
  printf("\n");
  fflush(stdout);
}

/* Follows ps:0's live move to its end: a progress line every MOVE_SAY_MS
 * (and the last figures), then its result. Returns the exit status: 0
 * done (or, cancel, stopped as asked), 1 stopped. */
static int follow_move(struct psctl *p, int cancel) {
  double t0 = cm_mono_ms(), said = 0, heard = t0;
  long long shown = -1; /* batches of the last line printed */
  char boot[32] = "";   /* ps:0's process, which holds the move's figures */
  for (;;) {
    json_t *doc = NULL, *mv;
    if (psctl_status_doc(p, 0, &doc)) {
      if (cm_mono_ms() - heard > MOVE_DOWN_S * 1000.0) {
        fprintf(stderr,
                "psctl: ps:0 (%s) has not answered for %d s: the move may "
                "go on or have stopped (psctl status says)\n",
                p->spec->ps[0].text, MOVE_DOWN_S);
        return 1;
      }
      psc__client_await(p->client, 0, MOVE_POLL_MS);
      continue;
    }
    heard = cm_mono_ms();
    if (!boot[0])
      snprintf(boot, sizeof boot, "%s", cm_status_str(doc, "boot"));
    else if (strcmp(boot, cm_status_str(doc, "boot")) != 0) {
      /* ps:0 started again: its move ended with the process. */
      fprintf(stderr,
              "psctl: ps:0 (%s) started again during the move, which "
              "stopped with it; the shards keep the moves made (psctl "
              "status: MOVE), and reshard --moves resumes\n",
              p->spec->ps[0].text);
      json_decref(doc);
      return 1;
    }
    const char *note = cm_status_str(doc, "reshard");
    int end = !strncmp(note, "last: ", 6);
    mv = json_object_get(doc, "move");
    if (mv && cm_status_int(mv, "batches") > 0 &&
        (end ? cm_status_int(mv, "batches") != shown
             : shown < 0 || cm_mono_ms() - said >= MOVE_SAY_MS)) {
      say_move(mv);
      said = cm_mono_ms();
      shown = cm_status_int(mv, "batches");
    }
    if (end) {
      int done = !strncmp(note + 6, "done", 4), rc = done || cancel ? 0 : 1;
      FILE *o = rc ? stderr : stdout;
      fprintf(o, "%sreshard %s in %.1f s: ps:0 says %s\n", rc ? "psctl: " : "",
              done ? "done" : "stopped", (cm_mono_ms() - t0) / 1000, note + 6);
      json_decref(doc);
      return rc;
    }
    json_decref(doc);
    usleep(MOVE_POLL_MS * 1000);
  }
}

/* Where shard s stands: -1 down (stopped, cutting, starting), 0 not yet in
 * layout v, 1 in it (serving when s < m, standing by otherwise). Its
 * reshard note into note (ps:0's result). */
static int where(struct psctl *p, int s, uint64_t v, int m, char *note,
                 size_t len) {
  json_t *doc = NULL;
  int at;
  if (psctl_status_doc(p, s, &doc))
    return -1;
  at = (uint64_t)cm_status_int(doc, "layout") == v &&
       cm_status_int(doc, "num_shards") == m &&
       json_is_true(json_object_get(doc, "standby")) == (s >= m);
  snprintf(note, len, "%s", cm_status_str(doc, "reshard"));
  json_decref(doc);
  return at;
}

int psctl_cmd_reshard(struct psctl *p) {
  struct psc__reshard r;
  struct psc__reshard_ask ask = {.shards = p->shards,
                                 .how =
                                     p->how >= 0 ? p->how : PSCTL_RESHARD_HOW,
                                 .batch = p->batch,
                                 .rate_mbps = p->rate,
                                 .cancel = p->cancel};
  int m = p->shards, most, rc;
  double t0 = cm_mono_ms(), said = t0;
  char note[700] = "";

  if (p->argc) {
    fprintf(stderr, "psctl: 'reshard' takes no operands (got '%s')\n",
            p->argv[0]);
    return PSCTL_EXIT_USAGE;
  }
  if (p->cancel && (m || p->how >= 0 || p->batch || p->rate > 0)) {
    fprintf(stderr, "psctl: reshard --cancel stops the live move under way "
                    "and takes no --shards, --moves, --stop, --batch or "
                    "--rate\n");
    return PSCTL_EXIT_USAGE;
  }
  if (!p->cancel && m <= 0) {
    fprintf(stderr,
            "psctl: reshard needs --shards M (1..%d, the spec's "
            "cluster.ps), or --cancel\n",
            p->spec->nps);
    return PSCTL_EXIT_USAGE;
  }
  if (!p->cancel && ask.how == 0 && (p->batch || p->rate > 0)) {
    fprintf(stderr, "psctl: --batch and --rate belong to a live move "
                    "(reshard --moves), not to the stop and cut\n");
    return PSCTL_EXIT_USAGE;
  }
  if ((rc = psc__client_reshard(p->client, &ask, &r))) {
    fprintf(stderr, "psctl: reshard%s refused by ps:0 (%s): %s: %s\n",
            p->cancel ? " --cancel" : "", p->spec->ps[0].text,
            cm_rpc_status_name((grpc_status_code)r.status), r.details);
    return 1;
  }
  printf("%s\n", r.message);
  fflush(stdout);
  if (p->cancel || r.moves)
    return follow_move(p, p->cancel);
  most = r.from > r.to ? r.from : r.to;
  for (int s = 0; s < most;) {
    int at = where(p, s, r.layout, r.to, note, sizeof note);
    if (at > 0) {
      printf("ps:%d: %s layout %llu (%.1f s)\n", s,
             s < r.to ? "serves" : "stands by outside",
             (unsigned long long)r.layout, (cm_mono_ms() - t0) / 1000);
      fflush(stdout);
      s++;
      continue;
    }
    /* ps:0 back in the old layout: the reshard was aborted or interrupted
     * (before ps:0 answered, it said "under way"). */
    if (s == 0 && at == 0 &&
        (!strncmp(note, "last: aborted", 13) ||
         !strncmp(note, "last: interrupted", 17))) {
      fprintf(stderr, "psctl: reshard not done: ps:0 says %s\n", note + 6);
      return 1;
    }
    if (cm_mono_ms() - t0 > RESHARD_WAIT_S * 1000.0) {
      fprintf(stderr,
              "psctl: ps:%d is not in layout %llu after %d s; the reshard "
              "may still finish (psctl status)\n",
              s, (unsigned long long)r.layout, RESHARD_WAIT_S);
      return 1;
    }
    if (cm_mono_ms() - said > 10000) {
      said = cm_mono_ms();
      printf("waiting for ps:%d (%s) (%.0f s)\n", s,
             at < 0 ? "stopped, cutting or starting" : "not in it yet",
             (said - t0) / 1000);
      fflush(stdout);
    }
    /* A shard starting again: dial it as soon as it listens, not after
     * gRPC's reconnect backoff, which grows while it is down. */
    if (at < 0)
      psc__client_await(p->client, s, RESHARD_POLL_MS);
    else
      usleep(RESHARD_POLL_MS * 1000);
  }
  where(p, 0, r.layout, r.to, note, sizeof note);
  printf("reshard done in %.1f s: %d shards, layout %llu%s%s\n",
         (cm_mono_ms() - t0) / 1000, r.to, (unsigned long long)r.layout,
         note[0] ? "; ps:0 says " : "",
         !strncmp(note, "last: ", 6) ? note + 6 : note);
  return 0;
}
