/* How psd starts serving (startup.h): the checkpoint restored before psd
 * listens, the service, saver, coordinator and gRPC server opened over the
 * store, the job's Unix socket, and the lines that say what the shard
 * serves. main (psd.c) calls these in order; each logs its own failure. */
#include "startup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "dedup.h"
#include "endpoint.h"
#include "err.h"
#include "layout.h"
#include "live.h"
#include "local.h"
#include "log.h"
#include "metrics.h"
#include "move.h"
#include "publish.h"
#include "rand.h"
#include "reshard.h"
#include "saver.h"
#include "shm_arena.h"
#include "spec.h"
#include "steps.h"
#include "store.h"
#include "switch.h"
#include "tables.h"
#include "units.h"

/* Where checkpoints go: --checkpoint-dir, job.checkpoint.dir or
 * $STATE_DIRECTORY, into root; *from names which. Returns 0 when none is
 * set (checkpoints are off), 1 when root is set. */
static int ckpt_root(const struct psd_server *srv, char *root, size_t len,
                     const char **from) {
  const struct cm_job *job = &srv->spec->job;
  const char *state = getenv("STATE_DIRECTORY");
  *from = "--checkpoint-dir";
  if (srv->ckpt_root[0]) {
    snprintf(root, len, "%s", srv->ckpt_root);
  } else if (job->ckpt_dir[0]) {
    snprintf(root, len, "%s", job->ckpt_dir);
    *from = "job.checkpoint.dir";
  } else if (state && state[0]) {
    /* systemd's StateDirectory=; several are separated by ':'. */
    snprintf(root, len, "%.*s", (int)strcspn(state, ":"), state);
    *from = "STATE_DIRECTORY";
  } else {
    return 0;
  }
  return 1;
}

enum psd_exit psd_server_reshard(struct psd_server *srv) {
  struct psd_reshard_report r;
  char root[1024], err[4096], size[32];
  const char *from;
  if (!ckpt_root(srv, root, sizeof root, &from)) {
    cm_error("--reshard: no checkpoint dir (set job.checkpoint.dir, "
             "--checkpoint-dir or STATE_DIRECTORY)");
    return PSD_EXIT_USAGE;
  }
  struct psd_reshard_opts o = {
      .root = root,
      .job = &srv->spec->job,
      .nshards = srv->reshard_shards ? srv->reshard_shards : srv->spec->nps,
      .memory = srv->reshard_memory};
  if (psd_reshard_run(&o, &r, err, sizeof err)) {
    cm_error("--reshard: %s; %s/%s is unchanged", err, root,
             srv->spec->job.name);
    return PSD_EXIT_FAILED;
  }
  cm_info("reshard: done in %.1f s: %s/%s now holds the checkpoint of step "
          "%llu for %d shard%s (layout %llu, %s); %llu of %llu table rows and "
          "%llu of %llu dense elements moved to another shard index; the "
          "%d-shard layout is kept in %s",
          r.ms / 1000, root, srv->spec->job.name, (unsigned long long)r.step,
          r.to, r.to == 1 ? "" : "s", (unsigned long long)r.layout,
          cm_fmt_bytes((double)r.bytes, size, sizeof size),
          (unsigned long long)r.rows_moved, (unsigned long long)r.rows,
          (unsigned long long)r.elems_moved, (unsigned long long)r.elems,
          r.from, r.kept);
  return PSD_EXIT_OK;
}

/* The job's layout: its checkpoint's when it has one of a layout version
 * (a job resharded keeps its count across restarts), else job.shards, else
 * every address of the spec; a checkpoint of version 0 must be of that
 * count. A shard outside it stands by. Returns 0 or CM_EEXIST (logged). */
static int find_layout(struct psd_server *srv, const char *root) {
  const struct cm_job *job = &srv->spec->job;
  char err[4096];
  srv->nshards = job->shards ? job->shards : srv->spec->nps;
  srv->layout = 0;
  srv->rows = CM_LAYOUT_RULE_BUCKETS;
  if (root) {
    int n, rows;
    uint64_t layout;
    if (psd_reshard_layout(root, job->name, srv->spec->nps, &n, &layout, &rows,
                           err, sizeof err)) {
      cm_error("cannot resume: %s", err);
      return CM_EEXIST;
    }
    if (n && !layout && n != srv->nshards) {
      /* Never resharded live: a count other than the spec's is a spec
       * changed for another count, whose checkpoint is restored onto it
       * first (the old rows would be placed for the old count). */
      cm_error("cannot resume: %s/%s was written by a job of %d shard%s; the "
               "spec has %d (%s). Restore the checkpoint onto %d shards "
               "first: psd --cluster SPEC --reshard (docs/reshard.md); or set "
               "job.shards to %d, start, and grow the job live: psctl reshard "
               "--shards %d",
               root, job->name, n, n == 1 ? "" : "s", srv->nshards,
               job->shards ? "job.shards" : "cluster.ps", srv->nshards, n,
               srv->nshards);
      return CM_EEXIST;
    }
    if (n) {
      if (n != srv->nshards)
        cm_info("the job's checkpoints are of layout %llu, %d shards (a live "
                "reshard): it goes on with them, not with the spec's %d",
                (unsigned long long)layout, n, srv->nshards);
      srv->nshards = n;
      srv->layout = layout;
      srv->rows = rows;
      if (rows == CM_LAYOUT_RULE_MODULO)
        cm_info("the job's checkpoints place table rows by splitmix64(id) "
                "%% %d (written before bucket maps); it goes on so until a "
                "reshard cuts it into buckets (docs/reshard.md)",
                n);
    }
  }
  srv->standby = srv->shard >= srv->nshards;
  if (srv->standby)
    cm_info("standing by: the job's layout %llu has %d shard%s (ps:0..ps:%d); "
            "this shard holds nothing until a live reshard takes it in "
            "(psctl reshard --shards %d)",
            (unsigned long long)srv->layout, srv->nshards,
            srv->nshards == 1 ? "" : "s", srv->nshards - 1, srv->shard + 1);
  return 0;
}

/* This shard's own newest checkpoint's layout and count (0, 0: none or
 * unreadable), read before the checkpoint is opened. */
static void own_layout(struct psd_server *srv, const char *root,
                       uint64_t *layout, int *n) {
  struct psd_ckpt *c = NULL;
  struct psd_ckpt_opts o = {.root = root,
                            .job = srv->spec->job.name,
                            .shard = srv->shard,
                            .nshards = srv->nshards,
                            .mode = srv->spec->job.mode,
                            .optims = &srv->spec->job.optim,
                            .keep = 1,
                            .read_only = 1};
  uint64_t step;
  char mode[16], err[1400];
  int rows;
  *layout = 0;
  *n = 0;
  if (psd_ckpt_new(&c, &o, err, sizeof err) ||
      psd_ckpt_peek(c, &step, n, mode, sizeof mode, layout, &rows, err,
                    sizeof err)) {
    *layout = 0;
    *n = 0;
  }
  psd_ckpt_free(c);
}

/* Resumes into the layout switch sw found at start (switch.h): this
 * shard's own checkpoint of the layout before it is loaded (tables,
 * applied pushes, move state) and its staged variables take the place of
 * its old ones; the layout steps as a COMMIT makes it step. Returns
 * PSD_EXIT_OK or PSD_EXIT_FAILED (logged). */
static enum psd_exit resume_switch(struct psd_server *srv,
                                   const struct psd_switch_found *sw,
                                   int own_n) {
  struct psd_store *staged = NULL;
  uint64_t from_layout = srv->layout;
  int from = own_n;
  if (psd_switch_load(srv, sw, &staged))
    return PSD_EXIT_FAILED;
  if (!staged &&
      psd_store_new(&staged, srv->shard, sw->to, &srv->spec->job.optim)) {
    cm_error("out of memory");
    return PSD_EXIT_FAILED;
  }
  /* Every move was made before the switch: the table rows of buckets the
   * new layout places elsewhere (a source's checkpoint taken before it gave
   * them away) are not this shard's. */
  struct cm_layout_map *map = malloc(sizeof *map);
  uint64_t dropped = 0;
  int owned, rc = map ? 0 : CM_ENOMEM;
  if (map) {
    cm_layout_map_init(map, CM_LAYOUT_RULE_BUCKETS, sw->to);
    rc = psd_move_keep_owned(srv, map, &owned, &dropped);
    free(map);
  }
  if (rc) {
    psd_store_free(staged);
    cm_error("out of memory dropping rows");
    return PSD_EXIT_FAILED;
  }
  psd_store_free(srv->store);
  srv->store = staged;
  srv->layout = sw->layout;
  srv->nshards = sw->to;
  srv->standby = srv->shard >= sw->to;
  srv->holding = 0; /* every move was made before: one taken out holds none */
  srv->self.move_to = 0; /* the switch ends the move */
  srv->self.moved = 0;
  psd_ckpt_set_layout(srv->ckpt, sw->to, sw->layout, !srv->standby);
  srv->switched_layout = sw->layout;
  srv->switched_from = from;
  srv->switched_to = sw->to;
  char was[80] = "its checkpoint";
  if (own_n)
    snprintf(was, sizeof was, "layout %llu of %d shards",
             (unsigned long long)from_layout, own_n);
  cm_warn("layout switch: this shard was stopped after the switch from %s "
          "to layout %llu of %d shards was decided and before it "
          "checkpointed the new one: it resumes into layout %llu "
          "(its %d staged variable%s from disk, its tables and applied "
          "pushes from its checkpoint, %llu rows of buckets placed "
          "elsewhere dropped), and checkpoints it at once",
          was, (unsigned long long)sw->layout, sw->to,
          (unsigned long long)sw->layout, psd_store_count(staged),
          psd_store_count(staged) == 1 ? "" : "s", (unsigned long long)dropped);
  return PSD_EXIT_OK;
}

enum psd_exit psd_server_restore(struct psd_server *srv) {
  const struct cm_job *job = &srv->spec->job;
  const char *from;
  char root[1024], err[4096];
  int rc, have_root = ckpt_root(srv, root, sizeof root, &from);

  if (have_root)
    snprintf(srv->root, sizeof srv->root, "%s", root);
  /* A live reshard that this shard's last process took part in. */
  if (psd_live_startup(srv, have_root ? root : NULL, srv->live_last,
                       sizeof srv->live_last))
    return PSD_EXIT_FAILED;
  if (find_layout(srv, have_root ? root : NULL))
    return PSD_EXIT_FAILED;
  /* A layout switch this shard staged and never checkpointed (a kill
   * between its PREPARE and its first checkpoint of the new layout): when
   * committed, its own checkpoint (of the layout before) is opened as
   * such, then the switch is resumed into (resume_switch). */
  struct psd_switch_found sw = {0};
  int own_n = 0;
  uint64_t own = 0;
  if (have_root && !strcmp(job->mode, "async")) {
    own_layout(srv, root, &own, &own_n);
    psd_switch_startup(srv, own, &sw);
    if (sw.found) {
      srv->layout = own;
      srv->nshards = own_n ? own_n : srv->nshards;
      srv->standby = !own_n || srv->shard >= own_n;
    }
  }
  if (!have_root) {
    if (srv->has_resume_step && !srv->standby) {
      cm_error("--resume-step needs checkpoints: no checkpoint dir (set "
               "job.checkpoint.dir, --checkpoint-dir or STATE_DIRECTORY)");
      return PSD_EXIT_USAGE;
    }
    if (!srv->standby)
      cm_info("checkpoints are off: no checkpoint dir (set "
              "job.checkpoint.dir, --checkpoint-dir or STATE_DIRECTORY)");
    return PSD_EXIT_OK;
  }
  struct psd_ckpt_opts o = {.root = root,
                            .job = job->name,
                            .shard = srv->shard,
                            .nshards = srv->nshards,
                            .layout = srv->layout,
                            .rows = srv->rows,
                            .mode = job->mode,
                            .optims = &job->optim,
                            .keep = job->ckpt_keep,
                            .has_resume_step = srv->has_resume_step,
                            .resume_step = srv->resume_step,
                            /* a standby shard makes its directory only
                             * for a move file (psd_ckpt_move_begin): the
                             * stop and cut reads every ps-* there */
                            .read_only = srv->standby};
  if ((rc = psd_ckpt_new(&srv->ckpt, &o, err, sizeof err))) {
    cm_error("checkpoint directory (from %s): %s", from, err);
    return PSD_EXIT_FAILED;
  }
  psd_ckpt_set_move(srv->ckpt, &srv->self.move_to, &srv->self.moved);
  if (!srv->standby)
    cm_info("checkpoints in %s (from %s): every %d steps, every %g s, keep "
            "%d",
            psd_ckpt_dir(srv->ckpt), from, job->ckpt_every_steps,
            job->ckpt_every_s, job->ckpt_keep);
  /* The spec's tables, which the checkpoint's rows go into. */
  if ((rc = psd_tables_new(&srv->tables, job->tables, job->ntables,
                           &job->table_defaults, job->seed, err, sizeof err))) {
    cm_error("job.tables: %s", err);
    return PSD_EXIT_FAILED;
  }
  psd_ckpt_set_tables(srv->ckpt, srv->tables);
  /* A standby shard holds nothing and writes no checkpoint (its saver
   * writes once a layout switch takes it in) until a live move gives it
   * rows: its move files, then its own checkpoints of them, are here. */
  /* Its own checkpoint of the layout before one that took it out is not
   * read: a shard taken out held nothing once its rows were moved. */
  int load = !srv->standby || (own_n && own == srv->layout);
  if (load && (rc = psd_ckpt_load(srv->ckpt, &srv->store, &srv->dedup,
                                  &srv->resume, err, sizeof err))) {
    cm_error("cannot resume: %s", err);
    return PSD_EXIT_FAILED;
  }
  /* A live move under way when this shard stopped (move.h). */
  if (psd_move_startup(srv))
    return PSD_EXIT_FAILED;
  if (sw.found && resume_switch(srv, &sw, own_n))
    return PSD_EXIT_FAILED;
  if (srv->standby) {
    if (srv->holding)
      psd_move_hold(srv, srv->store ? "found in its checkpoint"
                                    : "found in its move files");
    return PSD_EXIT_OK;
  }
  if (!srv->store) {
    cm_info("no checkpoint in %s: starting from scratch",
            psd_ckpt_dir(srv->ckpt));
    return PSD_EXIT_OK;
  }
  char size[32], clients[64] = "";
  /* A checkpoint without a table (sync, or an older psd's) says nothing. */
  if (srv->resume.clients >= 0)
    snprintf(clients, sizeof clients, ", applied pushes of %d client%s",
             srv->resume.clients, srv->resume.clients == 1 ? "" : "s");
  cm_info("resumed from step %llu: %s, %d variables%s, %s verified and "
          "loaded in %.0f ms%s",
          (unsigned long long)srv->resume.step, srv->resume.path,
          srv->resume.nvars, clients,
          cm_fmt_bytes((double)srv->resume.bytes, size, sizeof size),
          srv->resume.ms,
          srv->resume.refused ? " (newer checkpoints were REFUSED, see above)"
                              : "");
  return PSD_EXIT_OK;
}

/* Who this process is, for the checks every caller gets (request.h): its
 * spec's fingerprint and counts, a random boot id (new at every start, never
 * 0), and whether it resumed from a checkpoint; a caller that trained on an
 * earlier process of this shard is refused when it did not. */
static void fill_self(struct psd_server *srv) {
  /* The live move state found at start (psd_move_startup) stays. */
  int move_to = srv->self.move_to, moved = srv->self.moved;
  srv->self = (struct cm_request_self){
      .move_to = move_to,
      .moved = moved,
      .shard = srv->shard,
      .spec_fp = cm_spec_fingerprint(srv->spec),
      .nps = srv->spec->nps,
      .nworkers = srv->spec->nworker,
      .layout = srv->layout,
      .nshards = srv->nshards,
      .rows = srv->rows,
      .boot = cm_random_id(srv),
      .resumed = srv->resume.path[0] != 0,
      .ckpt_dir = srv->ckpt ? psd_ckpt_dir(srv->ckpt) : ""};
}

/* Creates the checkpoint saver over the service's store and steps, and
 * continues the restored step. Returns 0 or CM_ENOMEM. */
static int attach_saver(struct psd_server *srv) {
  const struct cm_job *job = &srv->spec->job;
  struct psd_steps *steps = psd_service_steps(srv->service);
  /* A standby shard writes no checkpoint while it holds nothing; one
   * that a layout switch takes in does from then on. */
  struct psd_saver_opts o = {.ckpt = srv->ckpt,
                             .standby = &srv->standby,
                             .holding = &srv->holding,
                             .store = srv->store,
                             .steps = steps,
                             .dedup = psd_service_dedup(srv->service),
                             .job = job->name,
                             .every_steps = job->ckpt_every_steps,
                             .every_s = job->ckpt_every_s,
                             .step = steps ? 0 : srv->resume.step,
                             .resumed = &srv->resume,
                             .self = &srv->self};
  /* Only a store restored from a checkpoint continues a job. */
  if (steps && srv->resume.path[0])
    psd_steps_resume(steps, srv->resume.step);
  if (psd_saver_new(&srv->saver, &o) || psd_saver_start(srv->saver))
    return CM_ENOMEM;
  psd_service_set_saver(srv->service, srv->saver);
  return 0;
}

/* The publisher's hold_layout (publish.h): a standby shard publishes only
 * while a live move has given it rows. */
static int hold_layout(void *ctx, struct psd_pub_layout *out) {
  struct psd_server *srv = ctx;
  if (__atomic_load_n(&srv->standby, __ATOMIC_ACQUIRE) &&
      !__atomic_load_n(&srv->holding, __ATOMIC_ACQUIRE))
    return 1;
  psd_service_layout_hold(srv->service, &out->layout, &out->shards,
                          &out->move_to, &out->moved);
  return 0;
}

static void release_layout(void *ctx) {
  struct psd_server *srv = ctx;
  psd_service_layout_release(srv->service);
}

/* Starts the publisher when job.publish.dir is set (publish.h), a standby
 * shard's too: it publishes once a live move gives it rows. Returns 0, or
 * an error reported. */
static int attach_publisher(struct psd_server *srv) {
  const struct cm_job *job = &srv->spec->job;
  char err[1200];
  int rc;
  if (!job->publish_dir[0])
    return 0;
  struct psd_publisher_opts o = {.root = job->publish_dir,
                                 .job = job->name,
                                 .shard = srv->shard,
                                 .nshards = srv->nshards,
                                 .rows = srv->rows,
                                 .sync =
                                     psd_service_steps(srv->service) != NULL,
                                 .interval_s = job->publish_interval_s,
                                 .full_every = job->publish_full_every,
                                 .keep = job->publish_keep,
                                 .store = srv->store,
                                 .tables = srv->tables,
                                 .dedup = psd_service_dedup(srv->service),
                                 .saver = srv->saver,
                                 .hold_layout = hold_layout,
                                 .release_layout = release_layout,
                                 .layout_ctx = srv};
  if ((rc = psd_publisher_new(&srv->publisher, &o, err, sizeof err))) {
    cm_error("job.publish.dir: %s", err);
    return rc;
  }
  if ((rc = psd_publisher_start(srv->publisher))) {
    cm_error("cannot start the publisher's thread");
    return rc;
  }
  psd_service_set_publisher(srv->service, srv->publisher);
  return 0;
}

/* How the saver asks the coordinator for a cut's step (saver.h). */
static int name_cut(void *coord, uint64_t *step, char *err, size_t len) {
  return psd_coord_cut(coord, step, err, len);
}

enum psd_exit psd_server_open(struct psd_server *srv) {
  const struct cm_job *job = &srv->spec->job;
  const struct cm_rpc_method *methods;
  char err[512];
  int n, nc = 0, ns = 0, nl = 0, nm = 0, nw = 0, rc;

  fill_self(srv);
  /* The spec's tables, unless a checkpoint brought them already. */
  if (!srv->tables &&
      (rc = psd_tables_new(&srv->tables, job->tables, job->ntables,
                           &job->table_defaults, job->seed, err, sizeof err))) {
    cm_error("job.tables: %s", err);
    return PSD_EXIT_FAILED;
  }
  /* The store may come from a checkpoint already (psd_server_restore). */
  if ((!srv->store &&
       psd_store_new(&srv->store, srv->shard, srv->nshards, &job->optim)) ||
      psd_service_new(&srv->service, srv->store, srv->shard, srv->nshards,
                      srv->spec->nworker, job->name, job->mode)) {
    cm_error("out of memory");
    return PSD_EXIT_FAILED;
  }
  psd_service_set_self(srv->service, &srv->self);
  psd_service_set_tables(srv->service, srv->tables);
  /* So is the table of pushes its values hold: their retries stay
   * duplicates. Before the saver, which saves the service's table. */
  if (srv->dedup) {
    psd_service_set_dedup(srv->service, srv->dedup);
    srv->dedup = NULL;
  }
  if (attach_saver(srv)) {
    cm_error("out of memory");
    return PSD_EXIT_FAILED;
  }
  /* A layout switch resumed into at start: its checkpoint now. */
  if (srv->switched_layout && srv->saver)
    psd_saver_request(srv->saver, "layout switch, resumed at start");
  psd_switch_finish(srv); /* ps:0: the COMMIT its last process did not send */
  if (attach_publisher(srv))
    return PSD_EXIT_FAILED;
  psd_service_set_limits(
      srv->service,
      &(struct psd_limits){.max_message = (uint64_t)cm_rpc_max_message(),
                           .nonfinite = psd_nonfinite_parse(job->nonfinite)});
  methods = psd_service_methods(srv->service, &n);
  memcpy(srv->methods, methods, n * sizeof *methods);
  if (srv->shard == 0) {
    /* Shard 0 is also the coordinator: membership, steps, clocks. */
    if (psd_coord_new(&srv->coord, srv->spec, srv->nshards)) {
      cm_error("cannot start the coordinator");
      return PSD_EXIT_FAILED;
    }
    /* A resumed sync job opens its checkpoint's step (steps committed). */
    if (!strcmp(job->mode, "sync"))
      psd_coord_resume(srv->coord, srv->resume.step);
    if (psd_coord_start(srv->coord)) {
      cm_error("cannot start the coordinator");
      return PSD_EXIT_FAILED;
    }
    psd_coord_set_self(srv->coord, &srv->self);
    /* Re-executed by a live reshard that stopped between two steps: the
     * workers joined before it stay joined (live.c). */
    const char *members = getenv(PSD_LIVE_MEMBERS_ENV);
    if (members) {
      psd_coord_adopt(srv->coord, members);
      unsetenv(PSD_LIVE_MEMBERS_ENV);
    }
    psd_service_set_coord(srv->service, srv->coord);
    psd_saver_set_cut(srv->saver, name_cut, srv->coord);
    methods = psd_coord_methods(srv->coord, &nc);
    memcpy(srv->methods + n, methods, nc * sizeof *methods);
  }
  methods = psd_saver_methods(srv->saver, &ns);
  memcpy(srv->methods + n + nc, methods, ns * sizeof *methods);
  /* Admin/Reshard: a live reshard (live.h). */
  if (psd_live_new(&srv->live, srv, srv->live_last)) {
    cm_error("out of memory");
    return PSD_EXIT_FAILED;
  }
  psd_service_set_reshard_note(srv->service, psd_live_note, srv->live);
  psd_service_set_move_status(srv->service, psd_live_move_status, srv->live);
  methods = psd_live_methods(srv->live, &nl);
  memcpy(srv->methods + n + nc + ns, methods, nl * sizeof *methods);
  /* Admin/MoveBuckets: a live move's destination (move.h). */
  if (psd_move_new(&srv->move, srv)) {
    cm_error("out of memory");
    return PSD_EXIT_FAILED;
  }
  methods = psd_move_methods(srv->move, &nm);
  memcpy(srv->methods + n + nc + ns + nl, methods, nm * sizeof *methods);
  /* Admin/SwitchLayout and DenseRows: the step that ends a live move
   * (switch.h). */
  if (psd_switch_new(&srv->switcher, srv)) {
    cm_error("out of memory");
    return PSD_EXIT_FAILED;
  }
  methods = psd_switch_methods(srv->switcher, &nw);
  memcpy(srv->methods + n + nc + ns + nl + nm, methods, nw * sizeof *methods);
  if ((rc = cm_server_new(&srv->rpc, srv->listen, srv->methods,
                          n + nc + ns + nl + nm + nw, &srv->creds, err,
                          sizeof err))) {
    cm_error("%s", err);
    if (rc == CM_EADDRINUSE)
      cm_error("is another psd (or another program) using that port? "
               "change cluster.ps[%d] in the spec or stop it",
               srv->shard);
    return PSD_EXIT_FAILED;
  }
  psd_service_set_server(srv->service, srv->rpc);
  if (cm_server_start(srv->rpc)) {
    cm_error("cannot start the gRPC server");
    return PSD_EXIT_FAILED;
  }
  return PSD_EXIT_OK;
}

void psd_server_start_local(struct psd_server *srv) {
  char path[200], dir[200], why[600];
  const char *from = "";
  int rc;

  if (!srv->spec->job.unix_sockets)
    return;
  if (srv->creds.tls) {
    cm_info("no Unix socket: TLS is on, and gRPC runs no TLS over a socket "
            "handed to it; clients on this host use TCP");
    return;
  }
  if (cm_endpoint_unix_path(srv->spec->job.name, &srv->spec->ps[srv->shard],
                            path, sizeof path)) {
    cm_warn("no Unix socket: the path for job '%s' would be too long; "
            "clients on this host use TCP (set PSD_SOCKET_DIR shorter)",
            srv->spec->job.name);
    return;
  }
  rc =
      psd_local_start(&srv->local, &srv->loop, srv->rpc, path, why, sizeof why);
  if (rc == CM_EEXIST || rc == CM_EADDRINUSE || rc == CM_ESYS) {
    /* A file or directory in the way may be another user's trap: warn,
     * saying where the directory came from. */
    cm_endpoint_unix_dir(dir, sizeof dir, &from);
    cm_warn("no Unix socket: %s; clients on this host use TCP (socket "
            "directory %s, from %s)",
            why, dir, from);
    return;
  }
  if (rc) {
    cm_info("no Unix socket: %s; clients on this host use TCP", why);
    return;
  }
  snprintf(srv->unix_path, sizeof srv->unix_path, "%s", path);
  /* Same-host clients' tensor bytes through shared memory (shm_arena.h). */
  if (srv->spec->job.shared_memory &&
      psd_shm_start(path, srv->spec->job.name, srv->creds.token,
                    srv->spec->job.socket_owner, why, sizeof why))
    cm_warn("no shared memory: %s; clients on this host send tensor bytes "
            "over the Unix socket",
            why);
}

enum psd_exit psd_server_start_metrics(struct psd_server *srv) {
  struct psd_metrics_conf conf = {
      .listen = &srv->metrics_addr,
      .service = srv->service,
      .job = srv->spec->job.name,
      .shard = srv->shard,
      .address = srv->spec->ps[srv->shard].text,
      .creds = &srv->creds,
  };
  char err[600];
  int rc;
  if (!srv->metrics_addr.port)
    return PSD_EXIT_OK;
  if ((rc = psd_metrics_start(&srv->metrics, &conf, err, sizeof err))) {
    cm_error("%s", err);
    if (rc == CM_EADDRINUSE)
      cm_error("is another program using that port? change "
               "job.metrics_listen in the spec (or --metrics-listen)");
    return PSD_EXIT_FAILED;
  }
  cm_info("metrics: serving %s%s", psd_metrics_url(srv->metrics),
          srv->creds.token[0] ? " (bearer token required)" : "");
  return PSD_EXIT_OK;
}

void psd_server_log_security(struct psd_server *srv) {
  const struct cm_creds *c = &srv->creds;
  if (!c->token[0] && !c->tls) {
    const char *l = srv->listen;
    /* On loopback only this host's users can call; say it, don't warn. */
    int loopback = !strncmp(l, "127.", 4) || !strncmp(l, "[::1]:", 6) ||
                   !strncmp(l, "localhost:", 10);
    cm_log(loopback ? CM_LOG_INFO : CM_LOG_WARN,
           "no authentication (the spec has no \"auth\"): anyone who can "
           "reach %s can read and change the model",
           srv->listen);
    return;
  }
  cm_info("security: %s%s%s", c->token[0] ? "bearer token required" : "",
          c->token[0] && c->tls ? ", " : "",
          !c->tls     ? ""
          : c->mutual ? "TLS with client certificates (mutual)"
                      : "TLS");
}

/* Says what the shard refuses beyond the per-field checks. */
static void log_limits(struct psd_server *srv) {
  const struct cm_job *job = &srv->spec->job;
  cm_info("input: messages over %d MiB are refused (job.max_message_mb); "
          "pushes with NaN or Inf are %s (job.nonfinite \"%s\")",
          job->max_message_mb,
          !strcmp(job->nonfinite, "skip") ? "acknowledged, skipped and counted"
          : !strcmp(job->nonfinite, "apply") ? "applied as they are and counted"
                                             : "rejected",
          job->nonfinite);
}

/* The "ready" line: where, which shard of which job, and the optimizer. */
static void log_ready(struct psd_server *srv) {
  const struct cm_job *job = &srv->spec->job;
  char optim[PSD_OPTIM_DESC], more[64] = "";
  cm_optim_describe(&job->optim.def, optim, sizeof optim);
  if (job->optim.nrules)
    snprintf(more, sizeof more, " (%d per-variable override%s)",
             job->optim.nrules, job->optim.nrules == 1 ? "" : "s");
  cm_info("ready: listening on %s%s%s, shard %d of %d%s, job '%s', %s, "
          "optimizer %s%s",
          srv->listen, srv->unix_path[0] ? " and unix:" : "", srv->unix_path,
          srv->shard, srv->nshards, srv->standby ? " (standing by)" : "",
          job->name, job->mode, optim, more);
}

void psd_server_log_ready(struct psd_server *srv) {
  psd_server_log_security(srv);
  log_limits(srv);
  log_ready(srv);
}
