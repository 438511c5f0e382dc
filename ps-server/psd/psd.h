/* Room ps-server/psd/, the daemon process: main (psd.c), its command line
 * (cmdline.h), startup in order (startup.h), the stop signals (stopsig.h),
 * the job's Unix socket (local.h), GET /metrics (metrics.h),
 * job.exit_when_done (done.h) and a serving task's run (serve_start.h).
 * This header is what the other rooms may use of it: the daemon's state.
 * Rooms it calls: shard/, store/, coord/, ckpt/, publish/, serve/,
 * reshard/, peer/ (done.c's look at ps:0).
 *
 * The psd daemon's state (STYLE habit 5): one struct psd_server, made by
 * main (psd.c) and passed explicitly to the files of the psd program:
 * cmdline.c fills it from the command line and the spec, startup.c opens
 * the store and the server into it, and psd.c runs the loop over it and
 * tears it down. Nothing here is global. Also the program's exit statuses
 * and its periods, which psd --help states. */
#ifndef PSD_PSD_H
#define PSD_PSD_H

#include <stdint.h>

#include <uv.h>

#include "auth.h"
#include "ckpt.h"
#include "metrics.h"
#include "request.h"
#include "rpc_server.h"
#include "service.h"

/* psd's exit statuses, as psd --help lists them. */
enum psd_exit {
  PSD_EXIT_OK = 0,     /* stopped by a signal, or --help */
  PSD_EXIT_FAILED = 1, /* could not start, or the final checkpoint failed */
  PSD_EXIT_USAGE = 2,  /* bad command line or cluster spec */
};

/* Milliseconds between stats lines while there is traffic. */
#define PSD_STATS_PERIOD_MS 10000
/* How often the coordinator checks step deadlines and heartbeats. */
#define PSD_TICK_MS 10
/* How long calls in flight may take to finish on SIGTERM. */
#define PSD_STOP_GRACE_MS 5000
/* How often systemd's STATUS= line is refreshed (under systemd only). */
#define PSD_STATUS_PERIOD_MS 2000

/* The daemon's state, passed explicitly. Every owned pointer is freed by
 * main whether or not startup got that far (NULL is ignored). */
struct psd_live;
struct psd_server {
  struct cm_spec *spec;        /* owned cluster spec */
  int shard;                   /* this shard's index; a serving task's:
                                  the training shard it follows (J % nps) */
  int serving;                 /* 1: a serving task, serve:J (serve.h) */
  int replica;                 /* serving: J, its index in cluster.serve */
  char listen[300];            /* address served */
  char unix_path[200];         /* Unix socket also served, "" when none */
  struct psd_local *local;     /* owned Unix socket listener, or NULL */
  struct cm_addr metrics_addr; /* where GET /metrics is served (the spec's
                                  job.metrics_listen or --metrics-listen);
                                  port 0: not served */
  struct psd_metrics *metrics; /* owned HTTP endpoint, or NULL */
  struct cm_creds creds;       /* owned: token and TLS from the spec auth */
  struct psd_store *store;     /* owned variables */
  struct psd_service *service; /* owned gRPC handlers */
  struct psd_coord *coord;     /* owned coordinator, shard 0 only */
  struct psd_tables *tables;   /* owned embedding tables */
  struct cm_rpc_method methods[32]; /* served: data, admin, coordinator */
  struct cm_server *rpc;            /* owned gRPC server */
  uv_loop_t loop;                   /* signals and timers */
  uv_poll_t signals;                /* stop signals' pipe (stopsig.h) */
  uv_timer_t stats;                 /* periodic stats line */
  uv_timer_t watchdog;              /* systemd watchdog pings */
  uv_timer_t tick;                  /* coordinator deadlines, heartbeats */
  uv_timer_t status;                /* systemd STATUS= refreshes */
  struct psd_counters last;         /* counters at the previous stats line */
  struct psd_counters status_last;  /* counters at the previous STATUS= */
  uint64_t status_at;               /* uv_now() of the previous STATUS= */
  int stop_signal;                  /* the signal that asked us to stop, or 0 */
  struct cm_request_self self;      /* who this process is (its spec's
                                       fingerprint, its random boot id, whether it
                                       resumed), checked against every caller */

  /* Checkpoints. */
  char ckpt_root[1024];          /* --checkpoint-dir, "" when not given */
  struct psd_ckpt *ckpt;         /* owned; NULL when checkpoints are off */
  struct psd_saver *saver;       /* owned checkpoint policy and thread */
  struct psd_ckpt_result resume; /* the checkpoint restored (step 0: none) */
  struct psd_dedup *dedup;       /* owned: the restored checkpoint's table of
                                    applied pushes, until the service takes it
                                    (then NULL) */
  struct psd_done *done;         /* owned job.exit_when_done watch, or NULL */
  int has_resume_step;           /* --resume-step given */
  uint64_t resume_step;          /* its value */
  int reshard;                   /* --reshard: restore the job's checkpoint
                                    onto the spec's shard count, then exit */
  uint64_t reshard_memory;       /* --reshard-memory in bytes, 0: default */
  int reshard_shards;            /* --shards with --reshard: M (0: the
                                    spec's address count) */

  /* The job's layout (docs/reshard.md "Live"). */
  int nshards;     /* shards in it: its checkpoint's count, else job.shards
                      (else the spec's address count) */
  uint64_t layout; /* its version: 0 until a live reshard */
  int rows;        /* how it places table rows: CM_LAYOUT_RULE_BUCKETS, or
                      _MODULO for checkpoints written before buckets */
  int standby;     /* 1: shard >= nshards; this shard holds nothing and
                      answers Data calls "layout moved" */
  int holding;     /* 1: standing by with buckets a live move gave it (a
                      move cancelled part way, or one under way): it
                      checkpoints their rows as a shard of the layout
                      does (saver.h); read with __atomic builtins */
  char root[1024]; /* the checkpoint root in use, "" when checkpoints are
                      off */
  struct psd_live *live;       /* owned Admin/Reshard handler (live.h) */
  struct psd_move *move;       /* owned Admin/MoveBuckets handler (move.h) */
  struct psd_switch *switcher; /* owned Admin/SwitchLayout and DenseRows
                                  handlers (switch.h) */
  char live_last[600];      /* the last live reshard's result found at start */
  uint64_t switched_layout; /* a layout switch resumed into at start from
                               its staging on disk (switch.h; 0: none) */
  int switched_from, switched_to; /* its counts: from, to */

  /* Publications for serving (job.publish). */
  struct psd_publisher *publisher; /* owned, NULL when off */
};

#endif
