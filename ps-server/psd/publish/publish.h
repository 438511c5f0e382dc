/* Room ps-server/psd/publish/, publishing for serving: the publisher and
 * its thread (publish.h) and the publications' files, written and read
 * back (pubfile.h, which serve/ reads; pubfile_internal.h is the room's
 * own). Rooms it calls: store/, ckpt/ (a directory written whole),
 * shard/ (saver.h: the shard's step).
 *
 * A training shard's publisher (docs/serving.md, "Publishing"): every
 * job.publish.interval_s it cuts the values of the whole shard at one
 * instant (every dense variable's rows whole; the table rows changed since
 * the previous publication and the ids evicted since, psd_table_pub_snapshot)
 * and writes them as the next version of its publication directory
 * (pubfile.h). A thread of its own writes, so no call waits on the disk.
 *
 * The cut. Async: the publisher's thread freezes the apply gate (dedup.h)
 * while it copies, as an async checkpoint does, so each push is in the cut
 * entirely or not at all. Sync: the coordinator marks a commit every
 * interval_s (CommitRequest.publish) and every shard cuts that step right
 * after applying it, while the commit still holds the shard (service_commit.c,
 * psd_publisher_cut): every shard publishes the same step.
 *
 * Versions: 1, 2, 3 ... per shard. A shard that restarts continues after
 * the highest version on disk, with a full publication; publication 1 of a
 * process and every full_every-th after a full one are full, and so is the
 * one after a failed write (the chain must not skip what it lost). After a
 * full one is written, all but the newest `keep` full chains are removed.
 * One line per publication at info: version, step, rows, bytes, ms. */
#ifndef PSD_PUBLISH_H
#define PSD_PUBLISH_H

#include <stddef.h>
#include <stdint.h>

struct psd_store;
struct psd_tables;
struct psd_dedup;
struct psd_saver;

/* What a publisher publishes, and where (all borrowed; they must outlive
 * it; strings copied). */
/* The layout a cut is taken in (pubfile.h's psd_pub fields). */
struct psd_pub_layout {
  uint64_t layout; /* its version */
  int shards;      /* its shard count */
  int move_to;     /* a live move: to this many shards (0: none) */
  int moved;       /* after this many bucket moves */
};

struct psd_publisher_opts {
  const char *root;          /* job.publish.dir */
  const char *job;           /* job name: <root>/<job>/ps-<shard> */
  int shard;                 /* this shard */
  int nshards;               /* shards in the job (without hold_layout) */
  int rows;                  /* how its layout places rows
                                (CM_LAYOUT_RULE_*), recorded */
  int sync;                  /* 1: cuts come from commits (psd_publisher_cut) */
  double interval_s;         /* async: seconds between cuts, > 0 */
  int full_every;            /* >= 1 */
  int keep;                  /* full chains kept, >= 1 */
  struct psd_store *store;   /* the shard's variables */
  struct psd_tables *tables; /* its embedding tables (may be NULL) */
  struct psd_dedup *dedup;   /* async: the apply gate frozen for a cut */
  struct psd_saver *saver;   /* async: the shard's step (pushes applied) */
  /* The layout at a cut's instant (NULL: layout 0 of nshards, no move):
   * fills *out and keeps the shard's buckets as they are until
   * release_layout, so that a cut's rows are those of the buckets its
   * layout names; returns 1 when the shard has nothing to publish now (a
   * standby shard no move gave rows: no cut, release_layout not called). */
  int (*hold_layout)(void *ctx, struct psd_pub_layout *out);
  void (*release_layout)(void *ctx);
  void *layout_ctx; /* passed to both */
};

/* The last publication, for Status (PublishStatus). */
struct psd_publish_state {
  char dir[1024];       /* the shard's publication directory */
  uint64_t version;     /* newest written, 0 none yet */
  uint64_t step;        /* its step */
  int full;             /* it is full */
  uint64_t rows;        /* table rows in it, removed ids included */
  uint64_t bytes;       /* its files' bytes */
  double ms;            /* taking and writing it */
  uint64_t written;     /* publications written since start */
  uint64_t failed;      /* writes that failed since start */
  char error[512];      /* the last failure, "" when the last write worked */
  int64_t time_unix_ms; /* its cut's instant */
};

struct psd_publisher;

/* Makes the shard's directory (removing what a crash left) and finds the
 * highest version in it. Returns 0, CM_EIO (err: path and strerror),
 * CM_ENOMEM. */
int psd_publisher_new(struct psd_publisher **out,
                      const struct psd_publisher_opts *o, char *err,
                      size_t errlen);

/* Starts the writing thread. Returns 0 or CM_ESYS. */
int psd_publisher_start(struct psd_publisher *p);

/* Sync: cuts step `step` now (the caller holds the shard still: called
 * inside the commit that made it) and hands it to the thread. Copies
 * values; never waits on the disk. */
void psd_publisher_cut(struct psd_publisher *p, uint64_t step);

void psd_publisher_state(struct psd_publisher *p, struct psd_publish_state *st);

/* Lets the write in progress finish, drops cuts not yet written, joins the
 * thread. */
void psd_publisher_stop(struct psd_publisher *p);
void psd_publisher_free(struct psd_publisher *p);

#endif
