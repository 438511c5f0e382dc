/* pslaunch --export DIR: the model out of the shards before they stop.
 * Once every worker of the cluster has finished with status 0 (the moment
 * pslaunch would send its ps tasks SIGTERM), every table the shards hold is
 * written to DIR/tables/NAME.safetensors and the dense variables to
 * DIR/dense.safetensors, by psctl export: the same program, and so the same
 * files, as `psctl --cluster FILE export [TABLE] --out F` by hand. One psctl
 * runs at a time, as a child of pslaunch like any task (its lines prefixed
 * "export"); then the ps tasks stop. A psctl that fails stops the job with
 * exit 1, and what was written stays.
 *
 * pslaunch never replaces a file it did not write: DIR must be new (it is
 * made, its parent must exist) or empty when pslaunch starts, checked
 * before any task starts, and a file that appeared there since is refused
 * rather than replaced. A table's name becomes a file name with '%', '/'
 * and a leading '.' percent-encoded ("a/b" is a%2Fb.safetensors). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "err.h"
#include "psclient.h"
#include "pslaunch_internal.h"

int pl_export_prepare(struct pl_launch *l, char *err, size_t errlen) {
  const char *dir = l->opt->export_dir;
  struct dirent *e;
  DIR *d;
  int n = 0;

  if (l->opt->engine) {
    snprintf(err, errlen,
             "--export %s: needs a spec FILE (under --cluster %s each "
             "pslaunch runs one task; export with psctl export instead)",
             dir, l->opt->spec_path);
    return CM_EINVAL;
  }
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "--export %s: cannot make the directory: %s", dir,
             strerror(errno));
    return CM_EIO;
  }
  if (!(d = opendir(dir))) {
    snprintf(err, errlen, "--export %s: %s", dir, strerror(errno));
    return CM_EIO;
  }
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      if (!n++)
        snprintf(err, errlen,
                 "--export %s: the directory holds %s already; pslaunch "
                 "exports into a new or empty directory, and never replaces "
                 "a file it did not write",
                 dir, e->d_name);
  closedir(d);
  return n ? CM_EEXIST : 0;
}

/* out = dir/tables/NAME.safetensors, NAME percent-encoded as the top of
 * this file says. */
static void table_file(const char *dir, const char *name, char *out,
                       size_t len) {
  size_t k = (size_t)snprintf(out, len, "%s/tables/", dir);
  for (const char *c = name; *c && k + 4 < len; c++) {
    if (*c == '%' || *c == '/' || (*c == '.' && c == name))
      k += (size_t)snprintf(out + k, len - k, "%%%02X", (unsigned char)*c);
    else
      out[k++] = *c;
  }
  snprintf(out + k, len - k, ".safetensors");
}

/* Adds the names of one shard's tables (its status document) that are not
 * in names yet. Returns 0, or CM_ENOMEM. */
static int add_tables(struct pl_launch *l, json_t *root) {
  json_t *t;
  size_t i;
  json_array_foreach(json_object_get(root, "tables"), i, t) {
    const char *name = json_string_value(json_object_get(t, "name"));
    int k;
    if (!name)
      continue;
    for (k = 0; k < l->nxtasks && strcmp(l->xtasks[k].xtable, name); k++)
      ;
    if (k < l->nxtasks)
      continue;
    struct pl_task *g = realloc(l->xtasks, (l->nxtasks + 1) * sizeof *g);
    if (!g)
      return CM_ENOMEM;
    l->xtasks = g;
    memset(&g[l->nxtasks], 0, sizeof *g);
    snprintf(g[l->nxtasks].xtable, sizeof g[l->nxtasks].xtable, "%s", name);
    l->nxtasks++;
  }
  return 0;
}

/* The tables of every shard (their Status), into l->xtasks, then one entry
 * for the variables. Blocks (each call a short deadline), as the job's
 * rate does: nothing else waits on the loop now. Returns 0, or a negative
 * code with err. */
static int list_tables(struct pl_launch *l, char *err, size_t len) {
  struct psc__client_opts o = {
      .worker = "pslaunch", .timeout_ms = 5000, .retry_s = -1};
  struct psc__client *c = NULL;
  int rc = psc__client_new(&c, l->spec, &o);

  for (int s = 0; rc == 0 && s < l->spec->nps; s++) {
    char *text = NULL;
    json_t *root = NULL;
    if ((rc = psc__client_status(c, s, &text)) < 0) {
      snprintf(err, len, "%s", psc__client_error(c));
    } else if (!(root = json_loads(text, 0, NULL))) {
      snprintf(err, len, "ps:%d's status is not JSON", s);
      rc = CM_EFORMAT;
    } else {
      rc = add_tables(l, root);
    }
    json_decref(root);
    free(text);
  }
  if (rc < 0 && !err[0])
    snprintf(err, len, "%s", cm_strerror(rc));
  psc__client_free(c);
  /* The variables' file: the entry with no table, last. */
  if (rc == 0) {
    struct pl_task *g = realloc(l->xtasks, (l->nxtasks + 1) * sizeof *g);
    if (!g)
      return CM_ENOMEM;
    l->xtasks = g;
    memset(&g[l->nxtasks++], 0, sizeof *g);
  }
  return rc;
}

/* Starts the next psctl, or, after the last, stops the job. */
static void next(struct pl_launch *l) {
  struct stat st;

  if (l->xnext == l->nxtasks) {
    pl_say("exported %d table%s and the variables to %s", l->nxtasks - 1,
           l->nxtasks == 2 ? "" : "s", l->opt->export_dir);
    pl_stop_all(l, PL_EXIT_OK);
    return;
  }
  struct pl_task *t = &l->xtasks[l->xnext++];
  if (lstat(t->xout, &st) == 0) {
    pl_say("export: %s exists, and pslaunch did not write it: not replaced; "
           "stopping",
           t->xout);
    pl_stop_all(l, PL_EXIT_FAILED);
    return;
  }
  if (pl_spawn_task(l, t) < 0) {
    l->failed = t;
    pl_stop_all(l, PL_EXIT_FAILED);
  }
}

void pl_export_begin(struct pl_launch *l) {
  char err[2048] = "", dir[PATH_MAX + 16];

  if (list_tables(l, err, sizeof err) < 0) {
    pl_say("export: cannot list the shards' tables: %s; stopping", err);
    pl_stop_all(l, PL_EXIT_FAILED);
    return;
  }
  snprintf(dir, sizeof dir, "%s/tables", l->opt->export_dir);
  if (l->nxtasks > 1 && mkdir(dir, 0755) != 0) {
    pl_say("export: cannot make %s: %s; stopping", dir, strerror(errno));
    pl_stop_all(l, PL_EXIT_FAILED);
    return;
  }
  l->width = l->width > 6 ? l->width : 6; /* "export" */
  for (int i = 0; i < l->nxtasks; i++) {
    struct pl_task *t = &l->xtasks[i];
    t->l = l;
    t->xport = 1;
    snprintf(t->name, sizeof t->name, "export");
    if (i < l->nxtasks - 1)
      table_file(l->opt->export_dir, t->xtable, t->xout, sizeof t->xout);
    else
      snprintf(t->xout, sizeof t->xout, "%s/dense.safetensors",
               l->opt->export_dir);
  }
  pl_say("all workers finished; exporting %d table%s and the variables to "
         "%s before the ps tasks stop",
         l->nxtasks - 1, l->nxtasks == 2 ? "" : "s", l->opt->export_dir);
  next(l);
}

void pl_export_exited(struct pl_launch *l, struct pl_task *t) {
  if (t->term_signal == 0 && t->exit_status == 0) {
    next(l);
    return;
  }
  pl_say("export: psctl export%s%s failed (%s %d); %s keeps what was "
         "written; stopping",
         t->xtable[0] ? " " : "", t->xtable, t->term_signal ? "signal" : "exit",
         t->term_signal ? t->term_signal : (int)t->exit_status,
         l->opt->export_dir);
  if (!l->failed)
    l->failed = t;
  pl_stop_all(l, PL_EXIT_FAILED);
}
