/* Everything the worker sets up before its first step, in the order main
 * calls it: the device the model runs on (--device), this worker's share
 * of the data, the spec's model and the variables that view it, and the
 * parameters: declared on the parameter servers and the job joined (an
 * async worker says how far the job has come; a sync one learns its step),
 * or, with --standalone, initialised here with the optimizers psd would
 * use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "clock.h"
#include "device.h"
#include "dworker_internal.h"
#include "err.h"
#include "log.h"

/* The classes of Fashion-MNIST, the width of the model's head. */
#define DW_CLASSES 10

/* Settles --device before anything is loaded: cpu as asked; cuda or cuda:N
 * only if the CUDA runtime says that device works (else a clear error
 * naming what failed); auto takes GPU 0 when one works and says which. */
int dw_pick_device(struct dw_worker *w) {
  const char *dev = w->args.device;
  char why[256] = "";
  int count, rc = 0;

  if (!strcmp(dev, "cpu"))
    goto out;
  count = kn_cuda_probe(why, sizeof why);
  if (!strcmp(dev, "auto")) {
    if (count <= 0) {
      cm_info("--device auto: no usable GPU (%s); using the CPU", why);
      w->args.device = "cpu";
      goto out;
    }
    w->args.gpu = 0;
  } else if (count <= 0) {
    fprintf(stderr, "dworker: --device %s: %s\n", dev, why);
    rc = CM_ENODEV;
    goto out;
  }
  if (w->args.gpu + w->args.replicas > count) {
    fprintf(stderr,
            "dworker: --device %s with --replicas %d: needs CUDA devices "
            "%d..%d, but cudaGetDeviceCount found %d\n",
            dev, w->args.replicas, w->args.gpu,
            w->args.gpu + w->args.replicas - 1, count);
    rc = CM_ENODEV;
    goto out;
  }
  w->first_gpu = w->args.gpu;
  cm_info("--device %s: %d CUDA device(s) work; replica%s on device %d..%d",
          dev, count, w->args.replicas > 1 ? "s" : "", w->first_gpu,
          w->first_gpu + w->args.replicas - 1);
out:
  return rc;
}

/* Loads the training share (and, for worker 0, the test set). */
int dw_load_data(struct dw_worker *w) {
  const struct cm_job *job = &w->spec->job;
  char err[1024];
  double t0 = cm_mono_s();
  int rc;

  /* With --emulate-workers N the standalone trainer holds share 0 of N
   * here and shares 1..N-1 in emu_ds. */
  rc = dw_dataset_load(job->data_dir, "train", w->index,
                       w->nfeeds > 1 ? w->nfeeds : w->nworkers, &w->train, err,
                       sizeof err);
  if (rc < 0) {
    cm_error("training data: %s", err);
    goto out;
  }
  for (int i = 1; i < w->nfeeds; i++) {
    rc = dw_dataset_load(job->data_dir, "train", i, w->nfeeds, &w->emu_ds[i],
                         err, sizeof err);
    if (rc < 0) {
      cm_error("training data: %s", err);
      goto out;
    }
  }
  if (w->index == 0) {
    rc =
        dw_dataset_load(job->data_dir, "t10k", 0, 1, &w->test, err, sizeof err);
    if (rc < 0) {
      cm_error("test data: %s", err);
      goto out;
    }
    if (w->test.dim != w->train.dim) {
      rc = CM_ESHAPE;
      cm_error("test images have %d pixels but training images %d", w->test.dim,
               w->train.dim);
      goto out;
    }
  }
  cm_info("loaded %d training examples (part %d of %d) and %d test examples "
          "from %s in %.1fs",
          w->train.n, w->index, w->nworkers, w->test.n, job->data_dir,
          cm_mono_s() - t0);
out:
  return rc;
}

/* Builds the spec's model (job.model) and the variables that view its
 * parameters and grads. */
int dw_build_model(struct dw_worker *w) {
  const struct cm_job *job = &w->spec->job;
  char err[256];
  int rc;

  rc = dw_model_new(&w->model, job, w->train.dim, DW_CLASSES,
                    job->batch_size * w->nfeeds, w->args.replicas, w->first_gpu,
                    err, sizeof err);
  if (rc < 0) {
    cm_error("%s: job.model %s: %s", w->spec->source, job->model, err);
    goto out;
  }
  for (int i = 0; i < w->model->nvars; i++) {
    const struct dw_model_var *mv = &w->model->vars[i];
    struct psc__var *v = &w->vars[i];

    memset(v, 0, sizeof *v);
    v->name = mv->name;
    v->ndim = mv->ndim;
    memcpy(v->shape, mv->shape, sizeof mv->shape);
    v->placement = PSC__PLACE_NAME;
    v->init = mv->scale > 0 ? PSC__INIT_UNIFORM : PSC__INIT_ZEROS;
    v->init_scale = mv->scale;
    v->value = mv->value;
    v->grad = mv->grad;
  }
  w->nvars = w->model->nvars;
  w->trainer = &dw_image_trainer;
  cm_info("model: %s, %zu parameters in %d variables, %d replica%s on %s",
          job->model, w->model->nparams, w->nvars, w->model->replicas,
          w->model->replicas == 1 ? "" : "s",
          w->first_gpu < 0 ? "the CPU" : "GPUs");
out:
  return rc;
}

/* Standalone: gives each variable the optimizer psd would give it (the
 * spec's job.optimizer, or its job.optimizer_overrides entry) and zeroed
 * slots, as psd does. */
static int setup_local_optim(struct dw_worker *w) {
  const struct cm_optim_set *set = &w->spec->job.optim;
  size_t total = 0;
  float *p;
  char desc[256];
  int rule;

  for (int i = 0; i < w->nvars; i++) {
    w->var_opt[i] = cm_optim_pick(set, w->vars[i].name, &rule);
    total +=
        (size_t)cm_optim_nslots(w->var_opt[i]->type) * psc__numel(&w->vars[i]);
    if (rule >= 0) {
      cm_optim_describe(w->var_opt[i], desc, sizeof desc);
      cm_info("'%s': optimizer %s (job.optimizer_overrides[\"%s\"])",
              w->vars[i].name, desc, set->rules[rule].pattern);
    }
  }
  if (!(w->slots = calloc(total ? total : 1, sizeof *w->slots))) {
    cm_error("cannot allocate the optimizer's slots (%zu floats)", total);
    return CM_ENOMEM;
  }
  p = w->slots;
  for (int i = 0; i < w->nvars; i++)
    for (int k = 0; k < cm_optim_nslots(w->var_opt[i]->type); k++) {
      w->var_slots[i][k] = p;
      p += psc__numel(&w->vars[i]);
    }
  cm_optim_describe(&set->def, desc, sizeof desc);
  cm_info("optimizer %s, applied here", desc);
  return 0;
}

/* Async: says where the job is when this worker starts (it has no step to
 * join at): the pushes ps:0's variables have taken, from an earlier run or
 * the checkpoint the shards resumed from, and the other workers training.
 * A push reaches a large variable in several messages, each counted in its
 * version, and a small one in one: the fewest any variable held here has
 * taken is the pushes. Silent for a fresh job; a status call that fails
 * only loses the line. */
static void say_async_start(struct dw_worker *w) {
  char *text = NULL;
  json_t *doc = NULL, *e;
  long long pushes = -1, others = 0;
  size_t i;

  if (psc__client_status(w->client, 0, &text) < 0 ||
      !(doc = json_loads(text, 0, NULL)))
    goto out;
  json_array_foreach(json_object_get(doc, "vars"), i, e) {
    json_t *rows = json_object_get(e, "rows");
    long long v = json_integer_value(json_object_get(e, "version"));
    if (json_integer_value(json_array_get(rows, 0)) ==
        json_integer_value(json_array_get(rows, 1)))
      continue; /* no rows here: never pushed to this shard */
    pushes = pushes < 0 || v < pushes ? v : pushes;
  }
  json_array_foreach(json_object_get(doc, "workers"), i, e) {
    others += json_is_true(json_object_get(e, "live")) &&
              json_integer_value(json_object_get(e, "worker")) != w->index;
  }
  if (pushes <= 0)
    goto out;
  if (others == 0)
    cm_info("resuming: the variables on ps:0 have taken %lld pushes already "
            "(an earlier run, or the checkpoint the shards resumed from); "
            "this run trains on from those values",
            pushes);
  else
    cm_info("joined the asynchronous job: the variables on ps:0 have taken "
            "%lld pushes; %lld other worker%s training",
            pushes, others, others == 1 ? " is" : "s are");
out:
  json_decref(doc);
  free(text);
}

/* Connects to the parameter servers, declares the variables and joins the
 * job; or, with --standalone, initialises the parameters here. */
int dw_setup_params(struct dw_worker *w) {
  struct psc__client_opts opts = {0};
  int rc = 0;

  if (w->args.standalone) {
    /* The same initial model psd would create, so runs compare exactly. */
    dw_model_init(w->model, w->spec->job.seed);
    rc = setup_local_optim(w);
    goto out;
  }
  opts.worker = w->name;
  opts.connect_timeout_ms = w->args.connect_timeout_ms;
  rc = psc__client_new(&w->client, w->spec, &opts);
  if (rc < 0) {
    cm_error("cannot create the parameter-server client: %s",
             w->client && *psc__client_error(w->client)
                 ? psc__client_error(w->client)
                 : cm_strerror(rc));
    goto out;
  }
  rc = psc__client_declare(w->client, w->vars, w->nvars);
  if (rc < 0) {
    cm_error("declare: %s", *psc__client_error(w->client)
                                ? psc__client_error(w->client)
                                : cm_strerror(rc));
    goto out;
  }
  /* The layout's shards (job.shards, or what a move said), not the pool. */
  cm_info("declared %d variables on %d shards", w->nvars,
          psc__client_nshards(w->client));
  for (int s = 0; s < psc__client_nshards(w->client); s++) {
    const char *t = psc__client_target(w->client, s);
    uint64_t shm = psc__client_shm_bytes(w->client, s);
    if (!strncmp(t, "unix:", 5) && shm)
      cm_info("shard %d (%s) runs on this host: using %s with shared memory "
              "(%.1f MiB)",
              s, w->spec->ps[s].text, t, shm / 1048576.0);
    else if (!strncmp(t, "unix:", 5))
      cm_info("shard %d (%s) runs on this host: using %s", s,
              w->spec->ps[s].text, t);
    else
      cm_info("shard %d: using TCP to %s", s, t);
  }
  /* Every worker joins the coordinator: membership and heartbeats for
   * status, steps in sync mode, clocks with a staleness bound. */
  rc = psc__client_join(w->client, w->index, w->spec->job.heartbeat_ms,
                        &w->step);
  if (rc < 0) {
    cm_error("join: %s", *psc__client_error(w->client)
                             ? psc__client_error(w->client)
                             : cm_strerror(rc));
    goto out;
  }
  if (w->sync)
    cm_info("joined the synchronous job at step %llu",
            (unsigned long long)w->step);
  else
    say_async_start(w);
out:
  return rc;
}
