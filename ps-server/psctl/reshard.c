/* psctl reshard --shards M: changes a running job's shard count (a live
 * reshard, docs/reshard.md "Live"). Asks ps:0 (Admin.Reshard), which checks
 * the request and stops the shards for it, then follows the shards' Status
 * until every shard of the new layout serves it (and the others stand by),
 * saying each step once; exit 0 done, 1 refused or aborted (ps:0's words). */
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
  int m = p->shards, most, rc;
  double t0 = cm_mono_ms(), said = t0;
  char note[700] = "";

  if (m <= 0) {
    fprintf(stderr,
            "psctl: reshard needs --shards M (1..%d, the spec's "
            "cluster.ps)\n",
            p->spec->nps);
    return PSCTL_EXIT_USAGE;
  }
  if ((rc = psc__client_reshard(p->client, m, &r))) {
    fprintf(stderr, "psctl: reshard refused by ps:0 (%s): %s: %s\n",
            p->spec->ps[0].text, cm_rpc_status_name((grpc_status_code)r.status),
            r.details);
    return 1;
  }
  printf("%s\n", r.message);
  fflush(stdout);
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
