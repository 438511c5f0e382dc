/* The training loop, one for every model (the model's side is its
 * struct dw_trainer, w->trainer): for each step, take the batch (the image
 * models' feeder gathered it on the thread pool meanwhile), pull the
 * parameters and the batch's rows of the model's tables, compute the
 * gradient (clipped with job.optimizer.clip_norm where the model has one
 * buffer of them), and push it to the parameter servers (or, with
 * --standalone, apply it here). The model prints its progress line.
 *
 * In sync mode the job may roll back (a shard restarted from its
 * checkpoint) or its coordinator restart; any pull or push may say so, and
 * the worker then goes on from the step the job went back to, which
 * lengthens its run by the steps undone. A sync worker that joins a job
 * past step 0 says so and goes on from there (plan_resume), or, when the
 * job is already complete, trains nothing. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "dworker_internal.h"
#include "err.h"
#include "log.h"
#include "optim.h"
#include "optstep.h"

/* Goes on from `step`, below the step this worker was at: the steps
 * between were undone, so the run takes that many more (with its next
 * batches), and the job still commits every step it was asked for. */
static void go_back(struct dw_worker *w, uint64_t step) {
  if (step < w->step) {
    w->redone += (long)(w->step - step);
    w->total_steps += (long)(w->step - step);
  }
  w->step = step;
}

/* Sync: when the last call's answer said the job rolled back to a common
 * checkpoint, goes on from its step (this worker keeps its place in its
 * data and redoes those step numbers), said once per rollback; likewise
 * from the step a restarted coordinator was joined at. Returns 1 then,
 * else 0. */
static int rolled_back(struct dw_worker *w) {
  uint64_t step;
  if (psc__client_rejoined(w->client, &step)) {
    /* Said once: a restarted coordinator asks each worker once, and one
     * that declared this worker dead asks once too. */
    cm_warn("joined the job again at step %llu (generation %llu; the "
            "coordinator restarted, or declared this worker dead); going on "
            "from there (this worker was at step %llu)",
            (unsigned long long)step,
            (unsigned long long)psc__client_gen(w->client),
            (unsigned long long)w->step);
    if (psc__client_gen(w->client) > w->rollbacks)
      w->rollbacks = psc__client_gen(w->client);
    go_back(w, step);
    return 1;
  }
  if (!psc__client_rolled_back(w->client, &step))
    return 0;
  if (psc__client_gen(w->client) > w->rollbacks) {
    w->rollbacks = psc__client_gen(w->client);
    cm_warn("the job rolled back to step %llu (a shard restarted from its "
            "checkpoint); going on from there (this worker was at step %llu)",
            (unsigned long long)step, (unsigned long long)w->step);
  }
  go_back(w, step);
  return 1;
}

/* Sync: pulls the parameters of step w->step, parked by each shard until
 * it has committed step w->step - 1; again from the step rolled back to
 * when the job rolls back meanwhile. */
int dw_pull_step(struct dw_worker *w) {
  uint64_t version = 0;
  int rc;
  do
    rc = psc__client_pull_at(w->client, w->step, &version);
  while (rc == 0 && rolled_back(w));
  if (rc == 0 && version > w->step)
    w->step = version; /* we fell behind: start at the newest step */
  return rc;
}

/* Sync: stages this step's gradient (the tables' rows q[0..nq), then the
 * dense variables) on every shard, then asks to be counted in the step:
 * a worker that dies in between can never leave the shards with different
 * sets. Goes on from the step rolled back to when an answer says so. */
static int push_step(struct dw_worker *w, const struct psc__rows *q, int nq) {
  int closed = 0, admitted = 0, rc = 0;
  uint64_t next = w->step + 1;

  if (nq > 0) {
    rc = psc__client_push_rows_step(w->client, q, nq, w->step, &closed);
    if (rc == 0 && rolled_back(w))
      goto out; /* the gradient is dropped: redo from the step rolled to */
  }
  if (rc == 0 && !closed) {
    rc = psc__client_push_step(w->client, w->step, &closed);
    if (rc == 0 && rolled_back(w))
      goto out;
  }
  if (rc == 0 && !closed)
    rc = psc__client_admit(w->client, w->step, &admitted, &next);
  if (rc == 0 && rolled_back(w))
    goto out;
  if (rc == 0 && !admitted)
    w->dropped++;
  w->step = next > w->step ? next : w->step + 1;
out:
  return rc;
}

/* Applies this step's gradient: locally with --standalone, else by pushing
 * it (the rows of q[0..nq) first) to the parameter servers. more: another
 * step follows, whose dense pull may travel with this push (async without
 * a staleness bound, for a model without tables: one with tables pulls its
 * next batch's rows anyway). */
static int apply_grads(struct dw_worker *w, int examples, int more,
                       const struct psc__rows *q, int nq) {
  int rc = 0;

  if (w->args.standalone) {
    /* Update k = steps_done, as psd's sync step of the same number. */
    for (int i = 0; i < w->nvars; i++)
      cm_optim_apply(w->var_opt[i], (uint64_t)w->steps_done, w->vars[i].value,
                     w->var_slots[i], w->vars[i].grad, psc__numel(&w->vars[i]));
    goto out;
  }
  psc__client_set_examples(w->client, (uint32_t)examples);
  if (w->sync) {
    rc = push_step(w, q, nq);
  } else {
    if (nq > 0)
      rc = psc__client_push_rows(w->client, q, nq);
    if (rc == 0 && more && !nq && !w->ssp && !w->args.no_overlap) {
      rc = psc__client_push_pull(w->client);
      w->prefetched = rc == 0;
    } else if (rc == 0) {
      rc = psc__client_push(w->client);
    }
    w->clock++;
  }
  if (rc < 0)
    cm_error("push at step %ld: %s", w->steps_done,
             *psc__client_error(w->client) ? psc__client_error(w->client)
                                           : cm_strerror(rc));
out:
  return rc;
}

/* Gets this step's parameters: nothing to do with --standalone or when the
 * last push brought them back; else, with a staleness bound, first waits
 * until the slowest worker is close enough, then pulls (in sync mode the
 * parameters of this step), then the rows of q[0..nq). */
static int pull_params(struct dw_worker *w, struct psc__rows *q, int nq) {
  int rc = 0;

  if (w->args.standalone)
    return 0;
  if (w->prefetched) {
    w->prefetched = 0;
    return 0;
  }
  if (w->ssp) {
    /* Wait here until the slowest live worker is close enough. */
    rc = psc__client_clock(w->client, w->clock);
    if (rc < 0) {
      cm_error("clock %llu: %s", (unsigned long long)w->clock,
               psc__client_error(w->client));
      return rc;
    }
  }
  if (w->sync) {
    /* The rows too are the step's; a rollback meanwhile makes both
     * unusable: pulled again at the step rolled back to. */
    do {
      rc = dw_pull_step(w);
      if (rc == 0 && nq > 0)
        rc = psc__client_pull_rows_at(w->client, q, nq, w->step);
    } while (rc == 0 && nq > 0 && rolled_back(w));
  } else {
    rc = psc__client_pull(w->client);
    if (rc == 0 && nq > 0)
      rc = psc__client_pull_rows(w->client, q, nq);
  }
  if (rc < 0)
    cm_error("pull at step %ld: %s", w->steps_done,
             *psc__client_error(w->client) ? psc__client_error(w->client)
                                           : cm_strerror(rc));
  return rc;
}

/* Clips this step's whole gradient (every variable: grads is one buffer) to
 * global L2 norm max_norm, before it is pushed or applied. Done here
 * because a shard sees only its slice of the gradient, and the global norm
 * is over all of it; the shards then apply an already clipped gradient. In
 * sync mode each worker clips its own gradient before the average. */
static void clip_grads(struct dw_worker *w, double max_norm) {
  double norm = kn_clip_global_norm(w->grads, w->ngrads, max_norm);

  if (norm > max_norm)
    w->clipped++;
  if (norm > w->max_norm)
    w->max_norm = norm;
}

/* Sync: where this run starts and ends when the job it joined is past step
 * 0 (its shards kept or restored an earlier run's steps, or other workers
 * are training): said, never silent. With --max-steps N the run takes N
 * steps from there; otherwise the spec's length (job.max_steps, else
 * job.epochs) is the job's, and the run takes the steps left of it. Either
 * way it goes on from the batch of the step it joined at, as an unbroken
 * run would. When no step is left the job is complete: said, and the run
 * takes none (worker 0 still evaluates the job's parameters). */
static void plan_resume(struct dw_worker *w) {
  const struct cm_job *job = &w->spec->job;
  long at = (long)w->step, len = w->total_steps;
  /* What set the length (dw_train): job.max_steps when it cut the epochs
   * short (a --max-steps N > 0 is handled apart). */
  const char *by = len < (long)job->epochs * w->steps_per_epoch
                       ? "job.max_steps"
                       : "job.epochs";

  if (!w->sync || at <= 0)
    return;
  w->first_step = at;
  if (w->args.max_steps > 0) {
    w->total_steps = at + len;
    cm_info("resuming from step %ld: this run takes %ld steps (--max-steps), "
            "to step %ld",
            at, len, at + len);
    return;
  }
  if (at >= len) {
    w->total_steps = at;
    cm_warn("the job is already complete: it is at step %ld, and %s makes it "
            "%ld steps long; nothing to train (raise %s, or pass --max-steps "
            "N to train N more)",
            at, by, len, by);
    return;
  }
  cm_info("resuming from step %ld of %ld: %ld to go, from batch %ld of this "
          "worker's share",
          at, len, len - at, at);
}

/* The training loop: pull, compute, push (or update locally), with the
 * next batch gathered on the thread pool meanwhile where the model does
 * that (w->trainer->queue). */
int dw_train(struct dw_worker *w) {
  const struct cm_job *job = &w->spec->job;
  const struct dw_trainer *tr = w->trainer;
  struct psc__rows q[DW_MAX_STEP_TABLES];
  long spe, limit, t;
  int rc;

  w->train_start = cm_mono_s();
  rc = tr->start(w);
  if (rc < 0)
    goto out;
  spe = w->steps_per_epoch;
  /* A stream has no step count: it ends when its batches do. */
  w->total_steps = w->stream ? LONG_MAX : (long)job->epochs * spe;
  limit = w->args.max_steps >= 0 ? w->args.max_steps : job->max_steps;
  if (limit > 0 && limit < w->total_steps)
    w->total_steps = limit;
  tr->say_plan(w);
  plan_resume(w);

  w->train_start = cm_mono_s();
  if (tr->queue && w->first_step < w->total_steps &&
      (rc = tr->queue(w, w->first_step)) < 0)
    goto out;
  for (t = w->first_step; t < w->total_steps; t++) {
    int queued = 0; /* step t + 1's batch is being gathered */
    int n = tr->batch(w, t), nq;
    float loss;

    if (n < 0) {
      rc = n;
      goto out;
    }
    if (n == 0 && w->stream)
      break; /* the stream ended */
    nq = tr->tables ? tr->tables(w, q, DW_MAX_STEP_TABLES) : 0;
    if (nq < 0) {
      rc = nq;
      goto out;
    }
    if (tr->queue && t + 1 < w->total_steps) {
      rc = tr->queue(w, t + 1);
      if (rc < 0)
        goto out;
      queued = 1;
    }
    rc = pull_params(w, q, nq);
    if (rc < 0)
      goto out;
    rc = tr->compute(w, &loss);
    if (rc < 0)
      goto out;
    if (job->clip_norm > 0 && w->grads)
      clip_grads(w, job->clip_norm);
    if (w->args.inject_delay_ms > 0)
      cm_sleep_ms(w->args.inject_delay_ms);
    rc = apply_grads(w, n, t + 1 < w->total_steps, q, nq);
    if (rc < 0)
      goto out;
    /* A rollback during the last step lengthened the run. */
    if (tr->queue && !queued && t + 1 < w->total_steps &&
        (rc = tr->queue(w, t + 1)) < 0)
      goto out;
    w->steps_done++;
    w->examples_done += (uint64_t)n;
    tr->progress(w, t, loss, n);
    dw_notify_step(w, t);
  }
out:
  w->train_end = cm_mono_s();
  w->train_s = w->train_end - w->train_start;
  if (job->clip_norm > 0 && w->grads)
    cm_info("gradient clipping at global norm %g: %ld of %ld steps clipped, "
            "largest norm %.4g",
            job->clip_norm, w->clipped, w->steps_done, w->max_norm);
  return rc;
}
