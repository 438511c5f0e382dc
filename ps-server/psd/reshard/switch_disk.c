/* A live layout switch on disk (switch.h, docs/reshard.md "What a kill
 * does to a live move"): what makes a switch survive a kill of any shard
 * between its PREPARE and its first checkpoint of the new layout.
 *
 *   PREPARE  each shard that serves the new layout writes the variables it
 *            staged, as a checkpoint of their own, under
 *            <shard dir>/switch-L<X>/ (a psd_ckpt of job "staged":
 *            switch-L<X>/staged/ps-<shard>/ckpt-<X>/), before it answers;
 *   decision ps:0 writes <ps:0's dir>/switch-L<X>.commit (fsynced) before
 *            it sends the first COMMIT: from then on the switch is
 *            committed, whoever dies;
 *   start    a shard that finds its switch-L<X>/ with X past its own
 *            checkpoint's layout resumes into X when the switch was
 *            committed (ps:0's decision file, or a checkpoint of X on
 *            disk: psd_reshard_layout's), from its own checkpoint of the
 *            old layout (its tables, its table of applied pushes) with
 *            the staged variables in place of its old ones; else it drops
 *            the staging (the switch never happened, and ps:0 sent or
 *            sends ABORT);
 *   pruning  a checkpoint of layout X or newer removes switch-L* of X and
 *            older, ps:0's decision file with them (ckpt_move.c). */
#include "switch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "clock.h"
#include "err.h"
#include "fileset.h"
#include "layout.h"
#include "log.h"
#include "peer.h"
#include "rpc.h"
#include "rpc_client.h"

/* <root>/<job>/ps-<shard>: a shard's checkpoint directory. */
static void shard_dir(const struct psd_server *srv, int shard, char *buf,
                      size_t len) {
  snprintf(buf, len, "%s/%s/ps-%d", srv->root, srv->spec->job.name, shard);
}

/* A handle on shard `shard`'s staging for layout X (read_only: to load). */
static int staged_ckpt(const struct psd_server *srv, uint64_t layout, int to,
                       int read_only, struct psd_ckpt **out, char *err,
                       size_t errlen) {
  char dir[1100], root[1200];
  shard_dir(srv, srv->shard, dir, sizeof dir);
  snprintf(root, sizeof root, "%s/switch-L%" PRIu64, dir, layout);
  struct psd_ckpt_opts o = {.root = root,
                            .job = "staged",
                            .shard = srv->shard,
                            .nshards = to,
                            .layout = layout,
                            .mode = srv->spec->job.mode,
                            .optims = &srv->spec->job.optim,
                            .keep = 1,
                            .read_only = read_only};
  return psd_ckpt_new(out, &o, err, errlen);
}

int psd_switch_stage_write(struct psd_server *srv, struct psd_store *staged,
                           int to, uint64_t layout, char *err, size_t errlen) {
  struct psd_ckpt *c = NULL;
  struct psd_ckpt_result res;
  int rc;
  if (!srv->root[0])
    return 0; /* no checkpoints: a kill loses the job's state anyway */
  if ((rc = staged_ckpt(srv, layout, to, 0, &c, err, errlen)) ||
      (rc = psd_ckpt_write(c, staged, NULL, layout, 0, &res, err, errlen)))
    goto out;
  cm_info("layout switch to layout %" PRIu64 ": the staged variables are on "
          "disk (%s), so that the switch survives a kill of this shard",
          layout, res.path);
out:
  psd_ckpt_free(c);
  return rc;
}

void psd_switch_stage_drop(struct psd_server *srv, uint64_t layout) {
  char dir[1100], sw[1200];
  if (!srv->root[0])
    return;
  shard_dir(srv, srv->shard, dir, sizeof dir);
  snprintf(sw, sizeof sw, "%s/switch-L%" PRIu64, dir, layout);
  if (access(sw, F_OK))
    return;
  psd_fileset_remove_tree(sw);
  psd_fileset_sync_dir(dir);
}

/* ps:0's decision file for layout X. */
static void decision_path(const struct psd_server *srv, uint64_t layout,
                          char *buf, size_t len) {
  char dir[1100];
  shard_dir(srv, 0, dir, sizeof dir);
  snprintf(buf, len, "%s/switch-L%" PRIu64 ".commit", dir, layout);
}

int psd_switch_decide(struct psd_server *srv, int from, int to, uint64_t layout,
                      char *err, size_t errlen) {
  char path[1200], dir[1100], text[200];
  if (!srv->root[0])
    return 0;
  decision_path(srv, layout, path, sizeof path);
  shard_dir(srv, 0, dir, sizeof dir);
  int n = snprintf(text, sizeof text,
                   "{\"from\": %d, \"to\": %d, \"layout\": %" PRIu64 "}\n",
                   from, to, layout);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, text, (size_t)n) != n || fsync(fd) ||
      psd_fileset_sync_dir(dir)) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return CM_EIO;
  }
  close(fd);
  return 0;
}

/* Whether ps:0 decided to commit layout X. */
static int decided(const struct psd_server *srv, uint64_t layout) {
  char path[1200];
  decision_path(srv, layout, path, sizeof path);
  return access(path, F_OK) == 0;
}

int psd_switch_startup(struct psd_server *srv, uint64_t own_layout,
                       struct psd_switch_found *f) {
  char dir[1100], sw[1300], err[1400] = "";
  struct psd_ckpt *c = NULL;
  uint64_t step, layout = 0, want = 0;
  int to = 0, rows;
  char mode[16];
  *f = (struct psd_switch_found){0};
  if (!srv->root[0])
    return 0;
  /* The newest staging past this shard's checkpoint (older ones are
   * dropped with it: a switch after them was made). */
  shard_dir(srv, srv->shard, dir, sizeof dir);
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    unsigned long long l;
    char tail;
    if (sscanf(e->d_name, "switch-L%llu%c", &l, &tail) == 1 && l > want)
      want = l;
  }
  if (d)
    closedir(d);
  if (!want)
    return 0;
  snprintf(sw, sizeof sw, "%s/switch-L%" PRIu64, dir, want);
  if (want <= own_layout) {
    cm_info("layout switch: %s is of layout %" PRIu64 ", which this shard's "
            "checkpoint holds: removed",
            sw, want);
    goto drop;
  }
  if (staged_ckpt(srv, want, 1, 1, &c, err, sizeof err) ||
      psd_ckpt_peek(c, &step, &to, mode, sizeof mode, &layout, &rows, err,
                    sizeof err) ||
      layout != want) {
    cm_warn("layout switch: %s holds no staged variables of layout %" PRIu64
            " (%s): removed; the switch was not prepared here",
            sw, want, err[0] ? err : "another layout");
    goto drop;
  }
  psd_ckpt_free(c);
  c = NULL;
  if (srv->layout < want && !decided(srv, want)) {
    cm_info("layout switch: %s stages layout %" PRIu64 " of %d shards, which "
            "ps:0 never committed (no decision file in its directory, no "
            "checkpoint of it): removed; this shard goes on in layout "
            "%" PRIu64,
            sw, want, to, own_layout);
    goto drop;
  }
  f->found = 1;
  f->layout = want;
  f->to = to;
  return 0;
drop:
  psd_ckpt_free(c);
  psd_fileset_remove_tree(sw);
  psd_fileset_sync_dir(dir);
  return 0;
}

int psd_switch_load(struct psd_server *srv, const struct psd_switch_found *f,
                    struct psd_store **out) {
  struct psd_ckpt *c = NULL;
  struct psd_ckpt_result res;
  char err[1400];
  int rc;
  *out = NULL;
  if ((rc = staged_ckpt(srv, f->layout, f->to, 1, &c, err, sizeof err)) ||
      (rc = psd_ckpt_load(c, out, NULL, &res, err, sizeof err)))
    cm_error("layout switch: cannot load the variables staged for layout "
             "%" PRIu64 ": %s",
             f->layout, err);
  else if (!*out)
    cm_info("layout switch: layout %" PRIu64 " stages no variable here",
            f->layout);
  psd_ckpt_free(c);
  return rc;
}

/* ---- ps:0 resumed into a switch: the COMMIT its last process did not
 * send ---- */

#define FINISH_CALL_MS 10000   /* one COMMIT's deadline */
#define FINISH_RETRY_MS 120000 /* a shard that does not answer, asked again */
#define FINISH_EVERY_MS 200

static void *finish_thread(void *arg) {
  struct psd_server *srv = arg;
  struct psd_peers *peers = NULL;
  int most = srv->switched_from > srv->switched_to ? srv->switched_from
                                                   : srv->switched_to;
  int done[CM_LAYOUT_MAX_SHARDS] = {0}, left = most - 1;
  struct cm_unary calls[CM_LAYOUT_MAX_SHARDS];
  char err[600];
  double until = cm_mono_ms() + FINISH_RETRY_MS;
  if (psd_peers_new(&peers, srv->spec,
                    &(struct psd_peer_opts){.who = "psd (switch)"}, err,
                    sizeof err)) {
    cm_error("layout switch: cannot call the other shards to finish the "
             "switch to layout %" PRIu64 ": %s",
             srv->switched_layout, err);
    return NULL;
  }
  Psd__V1__Caller caller = psd_peer_caller(peers);
  Psd__V1__SwitchLayoutRequest req = PSD__V1__SWITCH_LAYOUT_REQUEST__INIT;
  req.caller = &caller;
  req.phase = PSD__V1__SWITCH_PHASE__SWITCH_COMMIT;
  req.from = srv->switched_from;
  req.to = srv->switched_to;
  req.layout = srv->switched_layout;
  done[0] = 1;
  while (left > 0) {
    int k = psd_peer_call_all(peers, most, calls, done,
                              "/psd.v1.Admin/SwitchLayout", &req.base,
                              FINISH_CALL_MS, 0);
    int retry = 0;
    for (int i = 0; i < k; i++) {
      int s = (int)(intptr_t)calls[i].user;
      grpc_status_code st = calls[i].status;
      if (st == GRPC_STATUS_OK) {
        done[s] = 1;
        left--;
      } else if ((st == GRPC_STATUS_UNAVAILABLE ||
                  st == GRPC_STATUS_DEADLINE_EXCEEDED) &&
                 cm_mono_ms() < until) {
        retry = 1;
      } else {
        done[s] = 1;
        left--;
        cm_error("layout switch: ps:%d did not take the COMMIT of layout "
                 "%" PRIu64 ": %s: %s",
                 s, srv->switched_layout, cm_rpc_status_name(st),
                 calls[i].details);
      }
      cm_unary_release(&calls[i]);
    }
    if (!retry)
      break;
    usleep(FINISH_EVERY_MS * 1000);
  }
  if (!left)
    cm_info("layout switch: every shard holds layout %" PRIu64 " of %d "
            "shards (the COMMIT sent again by ps:0, resumed into it)",
            srv->switched_layout, srv->switched_to);
  psd_peers_free(peers);
  return NULL;
}

void psd_switch_finish(struct psd_server *srv) {
  pthread_t t;
  if (srv->shard != 0 || !srv->switched_layout)
    return;
  if (pthread_create(&t, NULL, finish_thread, srv)) {
    cm_error("layout switch: cannot start a thread to send the COMMIT of "
             "layout %" PRIu64 " to the other shards",
             srv->switched_layout);
    return;
  }
  pthread_detach(t);
}
