/* psd.v1.Admin/Status (service_internal.h): what psctl status shows of a
 * shard: its variables, counters and latency histograms, the sync steps
 * and their history, the coordinator's view of the workers (shard 0), and
 * the last checkpoint. Status reads; it changes nothing. */
#include "service_internal.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "coord.h"
#include "dedup.h"
#include "publish.h"
#include "saver.h"
#include "steps.h"

/* The fields of a worker's Status that are psd_worker_info's as they are
 * (fill_worker computes the rest). Laid out by hand: clang-format would
 * indent each line further as if continuing a statement. */
// clang-format off
#define WORKER_FIELDS(X)                                                       \
  X(worker) X(live) X(joined) X(applied) X(dropped) X(clock) X(last_seen_ms)   \
  X(joins) X(left) X(examples) X(last_step) X(pushes) X(step_samples)          \
  X(step_p50_ms) X(step_p95_ms) X(lag_p50_ms) X(lag_p95_ms) X(windows)        \
  X(window_auc) X(window_logloss)
// clang-format on

/* Points h at counts (PSD_HIST_BOUNDS + 1 entries, borrowed until the
 * message is packed) and the shared bounds. */
static void fill_hist(Psd__V1__Histogram *h, const char *name, uint64_t *counts,
                      double sum) {
  psd__v1__histogram__init(h);
  h->name = (char *)name;
  h->n_bounds = PSD_HIST_BOUNDS;
  h->bounds = (double *)psd_hist_bounds(); /* protobuf-c only reads it */
  h->n_counts = PSD_HIST_BOUNDS + 1;
  h->counts = counts;
  h->sum = sum;
  h->count = 0;
  for (int i = 0; i <= PSD_HIST_BOUNDS; i++)
    h->count += counts[i];
}

/* A worker's Status from the coordinator's w; its step times go to h
 * (both borrow from w until the message is packed). */
static void fill_worker(Psd__V1__WorkerStatus *ws, struct psd_worker_info *w,
                        Psd__V1__Histogram *h) {
  psd__v1__worker_status__init(ws);
#define COPY(f) ws->f = w->f;
  WORKER_FIELDS(COPY)
#undef COPY
  ws->examples_per_s = w->train_s > 0 ? (double)w->examples / w->train_s : 0.0;
  fill_hist(h, "step_seconds", w->step_counts, w->step_sum);
  ws->step_time = h;
}

void psd__on_status(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__StatusRequest *req = NULL;
  Psd__V1__StatusResponse resp = PSD__V1__STATUS_RESPONSE__INIT;
  Psd__V1__VarStatus *vs = NULL, **ptrs = NULL;
  char *(*slot_names)[CM_OPTIM_MAX_SLOTS] = NULL; /* static strings */
  struct psd_step_record *hist = NULL;
  Psd__V1__StepRecord *recs = NULL, **recp = NULL;
  int32_t *ids = NULL;
  struct psd_worker_info *winfo = NULL;
  Psd__V1__WorkerStatus *ws = NULL, **wsp = NULL;
  Psd__V1__CheckpointStatus ck = PSD__V1__CHECKPOINT_STATUS__INIT;
  Psd__V1__JobRate jr = PSD__V1__JOB_RATE__INIT;
  struct psd_job_rate rate;
  struct psd_saver_state *sst = NULL;
  struct psd_publish_state *pst = NULL;
  Psd__V1__PublishStatus pub = PSD__V1__PUBLISH_STATUS__INIT;
  Psd__V1__Histogram *wh = NULL, sh[2], *shp[2] = {&sh[0], &sh[1]};
  uint64_t counts[2][PSD_HIST_BOUNDS + 1];
  double sums[2];
  struct timespec now;
  void *tmem = NULL; /* the tables' part (service_tables.c) */
  int n;

  req = (Psd__V1__StatusRequest *)cm_request_open(
      &svc->host, call, bb, &psd__v1__status_request__descriptor, "Status", &m);
  if (!req)
    goto out;
  n = psd_store_count(svc->store);
  vs = calloc(n + 1, sizeof *vs);
  ptrs = calloc(n + 1, sizeof *ptrs);
  slot_names = calloc(n + 1, sizeof *slot_names);
  if (!vs || !ptrs || !slot_names) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    struct psd_var *v = psd_store_at(svc->store, i);
    psd__v1__var_status__init(&vs[i]);
    vs[i].name = v->name;
    vs[i].n_shape = v->ndim;
    vs[i].shape = v->shape;
    vs[i].row_begin = v->row_begin;
    vs[i].row_end = v->row_end;
    pthread_mutex_lock(&v->lock);
    vs[i].version = v->version;
    pthread_mutex_unlock(&v->lock);
    vs[i].bytes = psd_var_bytes(svc->store, v);
    vs[i].optimizer = v->optim_desc;
    vs[i].n_slots = v->nslots;
    vs[i].slots = slot_names[i];
    for (int k = 0; k < v->nslots; k++)
      slot_names[i][k] = (char *)cm_optim_slot_name(v->opt.type, k);
    vs[i].placement = v->placement;
    ptrs[i] = &vs[i];
  }
  clock_gettime(CLOCK_MONOTONIC, &now);
  resp.shard = svc->shard;
  resp.num_shards = svc->nshards;
  resp.job = svc->job;
  resp.mode = svc->mode;
  resp.pulls = atomic_load(&svc->pulls);
  resp.pushes = atomic_load(&svc->pushes);
  resp.examples = atomic_load(&svc->examples);
  resp.bytes_in = atomic_load(&svc->bytes_in);
  resp.bytes_out = atomic_load(&svc->bytes_out);
  resp.errors = atomic_load(&svc->errors);
  resp.unauthenticated = svc->rpc ? cm_server_unauthenticated(svc->rpc) : 0;
  resp.nonfinite_pushes = atomic_load(&svc->nonfinite);
  resp.nonfinite = (char *)psd_nonfinite_name(svc->limits.nonfinite);
  resp.max_message_bytes = svc->limits.max_message;
  resp.uptime_s = (now.tv_sec - svc->started.tv_sec) +
                  (now.tv_nsec - svc->started.tv_nsec) / 1e9;
  resp.n_vars = n;
  resp.vars = ptrs;
  psd_hist_read(&svc->push_time, counts[0], &sums[0]);
  psd_hist_read(&svc->pull_time, counts[1], &sums[1]);
  fill_hist(&sh[0], "push_seconds", counts[0], sums[0]);
  fill_hist(&sh[1], "pull_seconds", counts[1], sums[1]);
  resp.n_histograms = 2;
  resp.histograms = shp;
  resp.boot = svc->host.self ? svc->host.self->boot : 0;
  resp.layout = svc->host.self ? svc->host.self->layout : 0;
  if (svc->host.self) {
    resp.move_to =
        (uint32_t)__atomic_load_n(&svc->host.self->move_to, __ATOMIC_ACQUIRE);
    resp.moved =
        (uint32_t)__atomic_load_n(&svc->host.self->moved, __ATOMIC_ACQUIRE);
  }
  resp.buckets_owned = (uint32_t)psd__owned_count(svc);
  resp.standby =
      svc->shard >=
      (svc->nshards > (int)resp.move_to ? svc->nshards : (int)resp.move_to);
  resp.rows = (char *)cm_layout_rule_name(svc->map.rule);
  char note[600] = "";
  if (svc->reshard_note)
    svc->reshard_note(svc->reshard_ctx, note, sizeof note);
  {
    int to;
    uint64_t sw = psd_service_frozen(svc, &to);
    if (sw) /* a live layout switch froze the dense calls */
      snprintf(note, sizeof note,
               "switching to layout %llu of %d shard%s: dense calls wait",
               (unsigned long long)sw, to, to == 1 ? "" : "s");
  }
  resp.reshard = note;
  Psd__V1__MoveStatus mv = PSD__V1__MOVE_STATUS__INIT;
  if (svc->move_status && svc->move_status(svc->move_status_ctx, &mv))
    resp.move = &mv;
  {
    struct psd_dedup_stats ds;
    psd_dedup_stats(svc->dedup, &ds);
    resp.duplicates = ds.duplicates;
    resp.dedup_clients = ds.clients;
    resp.dedup_evicted = ds.evicted;
  }
  if (svc->steps) {
    struct psd_steps_state st;
    psd_steps_state(svc->steps, &st);
    resp.step = st.version;
    resp.rollbacks = st.gen;
    resp.rollback_step = st.rollback_step;
    resp.resumed = st.resumed;
    /* Sized by the records there are (a sync job's first steps hold a few),
       not by the history's bound: 4096 records and 8 MiB of ids on every
       call made Status the cost of a short job under ASan. A record that
       arrives between the count and the copy pushes out the oldest. */
    int nh = psd_steps_recorded(svc->steps);
    if (!(hist = malloc((nh + 1) * sizeof *hist))) {
      psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    nh = psd_steps_history(svc->steps, hist, nh);
    size_t nids = 0;
    for (int i = 0; i < nh; i++)
      nids += (size_t)hist[i].napplied + hist[i].ndropped;
    if (!(recs = calloc(nh + 1, sizeof *recs)) ||
        !(recp = calloc(nh + 1, sizeof *recp)) ||
        !(ids = calloc(nids + 1, sizeof *ids))) {
      psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    int32_t *id = ids;
    for (int i = 0; i < nh; i++) {
      psd__v1__step_record__init(&recs[i]);
      recs[i].step = hist[i].step;
      recs[i].n_applied = hist[i].napplied;
      recs[i].applied = id;
      for (int k = 0; k < hist[i].napplied; k++)
        *id++ = hist[i].applied[k];
      recs[i].n_dropped = hist[i].ndropped;
      recs[i].dropped = id;
      for (int k = 0; k < hist[i].ndropped; k++)
        *id++ = hist[i].dropped[k];
      recp[i] = &recs[i];
    }
    resp.n_steps = nh;
    resp.steps = recp;
  }
  if (svc->coord) {
    int nw = psd_coord_workers(svc->coord, NULL, 0);
    if (!(winfo = calloc(nw + 1, sizeof *winfo)) ||
        !(ws = calloc(nw + 1, sizeof *ws)) ||
        !(wsp = calloc(nw + 1, sizeof *wsp)) ||
        !(wh = calloc(nw + 1, sizeof *wh))) {
      psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    psd_coord_workers(svc->coord, winfo, nw);
    for (int i = 0; i < nw; i++) {
      fill_worker(&ws[i], &winfo[i], &wh[i]);
      wsp[i] = &ws[i];
    }
    resp.n_workers = nw;
    resp.workers = wsp;
    resp.max_clock_spread = psd_coord_max_spread(svc->coord);
    psd_coord_job_rate(svc->coord, &rate);
    jr.workers = rate.workers;
    jr.examples = rate.examples;
    jr.wall_s = rate.wall_s;
    jr.examples_per_s = rate.examples_per_s;
    resp.job_rate = &jr;
    resp.coordinator = 1;
  }
  if (svc->saver && (sst = malloc(sizeof *sst))) {
    psd_saver_state(svc->saver, sst);
    ck.dir = sst->dir;
    ck.written = sst->written;
    ck.failed = sst->failed;
    ck.step = sst->step;
    ck.path = sst->path;
    ck.bytes = sst->bytes;
    ck.ms = sst->ms;
    ck.error = sst->error;
    ck.n_steps = sst->nsteps;
    ck.steps = sst->steps;
    resp.checkpoint = &ck;
  }
  if (svc->publisher && (pst = malloc(sizeof *pst))) {
    psd_publisher_state(svc->publisher, pst);
    pub.dir = pst->dir;
    pub.version = pst->version;
    pub.step = pst->step;
    pub.full = pst->full;
    pub.rows = pst->rows;
    pub.bytes = pst->bytes;
    pub.ms = pst->ms;
    pub.written = pst->written;
    pub.failed = pst->failed;
    pub.error = pst->error;
    pub.time_unix_ms = pst->time_unix_ms;
    resp.publish = &pub;
  }
  if (psd__status_tables(svc, &resp, &tmem)) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
out:
  free(sst);
  free(pst);
  free(hist);
  free(recs);
  free(recp);
  free(ids);
  free(winfo);
  free(ws);
  free(wsp);
  free(wh);
  free(vs);
  free(ptrs);
  free(slot_names);
  psd__status_tables_free(tmem);
  cm_request_free((ProtobufCMessage *)req);
  cm_wire_msg_release(&m);
}
