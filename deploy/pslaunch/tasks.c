/* Which tasks pslaunch starts: those of the spec whose address is on this
 * host and that --only allows, ps tasks first, then serving tasks
 * (cluster.serve, which --only ps counts with the shards), then workers;
 * and, before anything starts, whether every local ps and serving task's
 * port can be listened on. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "err.h"
#include "pslaunch_internal.h"

/* 1 when task (type, i) is one this launcher starts: on this host, or
 * under an engine the one task this process is (the spec's, SLURM_PROCID's
 * or the pod's; every Slurm task or pod runs a pslaunch of its own). */
static int is_mine(const struct pl_launch *l, const struct cm_spec *spec,
                   enum cm_task_type type, int i, const struct cm_addr *addr) {
  if (l->opt->engine)
    return spec->task.type == type && spec->task.index == i;
  return cm_addr_is_local(addr);
}

/* Fills l->tasks with the spec's tasks on this host that the options ask
 * for, ps tasks first, then serving tasks, and counts the spec's workers it
 * leaves to others. Returns 0 or CM_ENOMEM. */
int pl_select_tasks(struct pl_launch *l, const struct cm_spec *spec) {
  int i, n = 0, rc = 0;

  l->tasks = calloc((size_t)(spec->nps + spec->nserve + spec->nworker),
                    sizeof *l->tasks);
  if (!l->tasks) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (i = 0; l->opt->want_ps && i < spec->nps; i++) {
    if (!is_mine(l, spec, CM_TASK_PS, i, &spec->ps[i]))
      continue;
    l->tasks[n].type = CM_TASK_PS;
    l->tasks[n].index = i;
    l->tasks[n].addr = &spec->ps[i];
    snprintf(l->tasks[n].name, sizeof l->tasks[n].name, "ps:%d", i);
    n++;
    l->nps++;
  }
  for (i = 0; l->opt->want_ps && i < spec->nserve; i++) {
    if (!is_mine(l, spec, CM_TASK_SERVE, i, &spec->serve[i]))
      continue;
    l->tasks[n].type = CM_TASK_SERVE;
    l->tasks[n].index = i;
    l->tasks[n].addr = &spec->serve[i];
    snprintf(l->tasks[n].name, sizeof l->tasks[n].name, "serve:%d", i);
    n++;
    l->nserve++;
  }
  for (i = 0; l->opt->want_worker && i < spec->nworker; i++) {
    if (!is_mine(l, spec, CM_TASK_WORKER, i, &spec->worker[i]))
      continue;
    l->tasks[n].type = CM_TASK_WORKER;
    l->tasks[n].index = i;
    l->tasks[n].addr = &spec->worker[i];
    snprintf(l->tasks[n].name, sizeof l->tasks[n].name, "worker:%d", i);
    n++;
    l->nworkers++;
  }
  l->ntasks = n;
  l->nforeign = spec->nworker - l->nworkers;
  for (i = 0; i < n; i++) {
    int w = (int)strlen(l->tasks[i].name);
    l->tasks[i].l = l;
    l->width = w > l->width ? w : l->width;
  }
out:
  return rc;
}

/* Binds and listens on every local ps and serving task's address, all at once
 * (so two tasks given the same port clash too), then lets them all go.
 * SO_REUSEADDR is on, as in gRPC's own listener: a socket that is listening
 * still clashes, but connections in TIME_WAIT from an earlier run do not.
 * Returns 0, or CM_EADDRINUSE / CM_ESYS with "ps:0: cannot listen on HOST:PORT:
 * why" in err. */
int pl_check_ports(const struct pl_launch *l, char *err, size_t errlen) {
  int *fds = NULL, nfds = 0, i, rc = 0, one = 1;
  struct addrinfo hints, *res = NULL, *ai;

  fds = calloc((size_t)l->ntasks * 8 + 1, sizeof *fds);
  if (!fds) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (i = 0; i < l->ntasks; i++) {
    const struct pl_task *t = &l->tasks[i];
    char port[16];
    int grc;

    if (t->type != CM_TASK_PS && t->type != CM_TASK_SERVE)
      continue;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(port, sizeof port, "%d", t->addr->port);
    grc = getaddrinfo(t->addr->host, port, &hints, &res);
    if (grc != 0) {
      snprintf(err, errlen, "%s: cannot resolve %s: %s", t->name, t->addr->host,
               gai_strerror(grc));
      rc = CM_ESYS;
      goto out;
    }
    for (ai = res; ai && nfds < l->ntasks * 8; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                      ai->ai_protocol);
      if (fd < 0) {
        snprintf(err, errlen, "%s: socket: %s", t->name, strerror(errno));
        rc = CM_ESYS;
        goto out;
      }
      fds[nfds++] = fd;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 1) < 0) {
        rc = errno == EADDRINUSE ? CM_EADDRINUSE : CM_ESYS;
        snprintf(err, errlen, "%s: cannot listen on %s: %s", t->name,
                 t->addr->text, strerror(errno));
        goto out;
      }
    }
    freeaddrinfo(res);
    res = NULL;
  }
out:
  if (res)
    freeaddrinfo(res);
  for (i = 0; i < nfds; i++)
    close(fds[i]);
  free(fds);
  return rc;
}
