/* pslaunch: starts the tasks of a cluster spec that live on this host (ps
 * tasks first, then workers), shows their output line by line prefixed with
 * the task name, and stops them all together: cleanly once every worker has
 * finished, or as soon as any task fails or pslaunch is interrupted.
 *
 * One libuv loop carries everything: the children (uv_spawn, reaped by their
 * exit callbacks), their stdout and stderr pipes, SIGINT/SIGTERM/SIGHUP, and
 * the timer that turns SIGTERM into SIGKILL. The loop ends when every child
 * has been reaped and every pipe closed; main then prints a summary. Only the
 * processes started here are ever signalled, each by its own PID.
 *
 * Exit codes: 0 all local workers finished, 1 a task failed (or a ps port was
 * in use), 2 bad usage or spec, 128 + signal when interrupted. */
#include "err.h"
#include "log.h"
#include "spec.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

/* Longest output line passed on whole; a longer one is cut into pieces of
 * this size, each printed with the prefix. */
#define LINE_CAP 65536

/* Exit codes, as documented in --help. */
enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2 };

static const char usage_text[] =
    "Usage: pslaunch [OPTIONS] FILE [-- DWORKER_ARGS...]\n"
    "\n"
    "Start the tasks of the cluster spec FILE whose address is on this host:\n"
    "every ps task first (psd --cluster FILE --task ps:I), then every worker\n"
    "(dworker --cluster FILE --task worker:I DWORKER_ARGS...). Each line they\n"
    "print is shown prefixed with the task name, their stdout on stdout and\n"
    "their stderr on stderr:\n"
    "\n"
    "  ps:0     | 12:00:01.002 psd ps:0 info: listening on 127.0.0.1:7100\n"
    "  worker:1 | 12:00:03.417 dworker worker:1 info: step 200 loss 0.41\n"
    "\n"
    "When every local worker has exited with status 0, the ps tasks are sent\n"
    "SIGTERM, a summary is printed and pslaunch exits 0. If a task fails (it\n"
    "exits non-zero or by a signal, or a ps task exits at all while workers\n"
    "still run), every other task is sent SIGTERM and pslaunch exits 1.\n"
    "Ctrl-C (SIGINT), SIGTERM and SIGHUP stop every task the same way; a\n"
    "second Ctrl-C sends SIGKILL at once. A task still running SECS seconds\n"
    "after SIGTERM is sent SIGKILL. With no local workers (or --only ps) the\n"
    "ps tasks run until pslaunch is interrupted.\n"
    "\n"
    "Each task runs in a session of its own, so a terminal's Ctrl-C reaches\n"
    "only pslaunch, which then stops the tasks; if pslaunch itself is killed\n"
    "with SIGKILL, its tasks keep running.\n"
    "\n"
    "Before anything starts, each local ps task's port is tried: a port in\n"
    "use is reported (\"ps:0: cannot listen on 127.0.0.1:7100: Address\n"
    "already in use\") and nothing is started.\n"
    "\n"
    "Options:\n"
    "  --psd PATH           the psd to run (default: psd next to pslaunch,\n"
    "                       else ../ps-server/psd from it in a build tree or\n"
    "                       ../sbin/psd in an installed one)\n"
    "  --dworker PATH       the dworker to run (default: dworker next to\n"
    "                       pslaunch)\n"
    "  --only ps|worker     start only this host's ps tasks, or only its\n"
    "                       workers\n"
    "  --stop-timeout SECS  wait this long after SIGTERM before SIGKILL\n"
    "                       (default 10)\n"
    "  -h, --help           show this help and exit\n"
    "  -- DWORKER_ARGS...   pass the rest of the command line to every\n"
    "                       dworker\n"
    "\n"
    "Examples:\n"
    "  pslaunch deploy/examples/local.json\n"
    "  pslaunch local.json -- --max-steps 100    # a short smoke run\n"
    "  pslaunch --only ps cluster.json           # this host serves shards\n"
    "  pslaunch --psd build/ps-server/psd --dworker build/worker/dworker \\\n"
    "           local.json\n"
    "\n"
    "Exit status:\n"
    "  0    every local worker finished with status 0\n"
    "  1    a task failed or could not start, or a ps port was in use\n"
    "  2    bad usage, bad cluster spec, no task on this host, or psd or\n"
    "       dworker not found\n"
    "  129  stopped by SIGHUP\n"
    "  130  stopped by SIGINT (Ctrl-C)\n"
    "  143  stopped by SIGTERM\n";

/* What the command line asked for. Strings point into argv. */
struct options {
  const char *spec_path; /* FILE */
  const char *psd;       /* --psd, NULL for the default */
  const char *dworker;   /* --dworker, NULL for the default */
  int want_ps;           /* start local ps tasks (not --only worker) */
  int want_worker;       /* start local workers (not --only ps) */
  double stop_timeout;   /* --stop-timeout, seconds */
  char **extra;          /* arguments after "--", passed to every dworker */
  int nextra;            /* entries in extra */
};

struct launch;
struct task;

/* One of a child's output streams, cut into lines. */
struct stream {
  struct task *task;  /* the task whose output this is */
  uv_pipe_t pipe;     /* read end of the child's stdout or stderr */
  int fd;             /* where its lines go: STDOUT_FILENO or STDERR_FILENO */
  int state;          /* 0 closed (or never opened), 1 open, 2 closing */
  size_t len;         /* bytes in buf: the start of a line not yet ended */
  char buf[LINE_CAP]; /* the partial line */
};

/* One local task and the child process that runs it. */
struct task {
  struct launch *l;           /* the launcher it belongs to */
  char name[32];              /* "ps:0", "worker:1": its output prefix */
  enum cm_task_type type;     /* CM_TASK_PS or CM_TASK_WORKER */
  const struct cm_addr *addr; /* its address in the spec (spec-owned) */
  uv_process_t proc;          /* the child, once spawn was tried */
  int proc_open;              /* proc needs (or is waiting for) uv_close */
  struct stream out;          /* the child's stdout */
  struct stream err;          /* the child's stderr */
  int started;                /* uv_spawn succeeded */
  int running;                /* started and not reaped: safe to signal */
  int pid;                    /* the child's PID, once started */
  int64_t exit_status;        /* exit status, when it exited normally */
  int term_signal;            /* signal that ended it, or 0 */
  int sent_term;              /* pslaunch sent it SIGTERM */
  int sent_kill;              /* pslaunch sent it SIGKILL */
  uint64_t t_start;           /* uv_hrtime() at spawn */
  uint64_t t_end;             /* uv_hrtime() when reaped */
};

/* The launcher's whole state, passed to every callback through handle data. */
struct launch {
  uv_loop_t loop;              /* the one loop */
  const struct options *opt;   /* the command line */
  char psd[PATH_MAX];          /* resolved psd binary */
  char dworker[PATH_MAX];      /* resolved dworker binary */
  struct task *tasks;          /* owned array: local ps tasks, then workers */
  int ntasks;                  /* entries in tasks */
  int nps;                     /* local ps tasks among them */
  int nworkers;                /* local workers among them */
  int nworkers_done;           /* workers that exited with status 0 */
  int width;                   /* longest task name, for aligned prefixes */
  int stopping;                /* 0 running; 1 once the stop has begun */
  int result;                  /* exit code, settled when the stop begins */
  int interrupted_by;          /* the signal that began the stop, or 0 */
  const struct task *failed;   /* the failure that began the stop, or NULL */
  int finishing;               /* own handles are being closed */
  uv_signal_t sig_int;         /* SIGINT watcher */
  uv_signal_t sig_term;        /* SIGTERM watcher */
  uv_signal_t sig_hup;         /* SIGHUP watcher */
  uv_timer_t kill_timer;       /* SIGKILL to survivors after stop_timeout */
  uv_timer_t drain_timer;      /* closes pipes kept open by grandchildren */
  int drain_started;           /* drain_timer has been started */
  char scratch[LINE_CAP + 64]; /* one prefixed line being written */
};

/* Writes all of buf[0..len) to fd in as few write() calls as the kernel
 * allows, so a line from one child is never split by another's. */
static void write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      poll(&p, 1, 1000);
      continue;
    }
    if (n <= 0)
      return; /* stdout closed (EPIPE): the output has nowhere to go */
    buf += n;
    len -= (size_t)n;
  }
}

/* Prints one "pslaunch: ..." line on stderr with a single write. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  int n = snprintf(buf, sizeof buf, "pslaunch: ");

  va_start(ap, fmt);
  n += vsnprintf(buf + n, sizeof buf - n, fmt, ap);
  va_end(ap);
  if ((size_t)n >= sizeof buf - 1)
    n = sizeof buf - 2;
  buf[n++] = '\n';
  write_all(STDERR_FILENO, buf, (size_t)n);
}

/* Prints every line of a multi-line message, each as a "pslaunch:" line. */
static void say_lines(const char *text) {
  const char *p = text;

  while (*p) {
    const char *nl = strchr(p, '\n');
    int n = nl ? (int)(nl - p) : (int)strlen(p);
    if (n > 0)
      say("%.*s", n, p);
    p += n + (nl ? 1 : 0);
  }
}

static const char *signame(int sig) {
  const char *abbrev = sigabbrev_np(sig);
  return abbrev ? abbrev : "?";
}

/* ---- Command line and binaries ---- */

/* Parses argv into *o. Returns -1 to go on, or the exit code to leave with
 * (0 after --help, 2 after a usage error, both already reported). */
static int parse_args(int argc, char **argv, struct options *o) {
  static const struct option longopts[] = {
      {"psd", required_argument, NULL, 'p'},
      {"dworker", required_argument, NULL, 'd'},
      {"only", required_argument, NULL, 'o'},
      {"stop-timeout", required_argument, NULL, 't'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  int nopt = argc, c, i;
  char *end;

  memset(o, 0, sizeof *o);
  o->want_ps = o->want_worker = 1;
  o->stop_timeout = 10;
  /* Everything after the first "--" belongs to dworker, so getopt only ever
   * sees what comes before it. */
  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      nopt = i;
      o->extra = argv + i + 1;
      o->nextra = argc - i - 1;
      break;
    }
  }
  opterr = 0; /* reported below, in pslaunch's own words */
  while ((c = getopt_long(nopt, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'p':
      o->psd = optarg;
      break;
    case 'd':
      o->dworker = optarg;
      break;
    case 'o':
      if (strcmp(optarg, "ps") == 0) {
        o->want_worker = 0;
      } else if (strcmp(optarg, "worker") == 0) {
        o->want_ps = 0;
      } else {
        say("--only %s: expected \"ps\" or \"worker\"", optarg);
        return EXIT_USAGE;
      }
      break;
    case 't':
      errno = 0;
      o->stop_timeout = strtod(optarg, &end);
      if (errno || end == optarg || *end || !isfinite(o->stop_timeout) ||
          o->stop_timeout < 0 || o->stop_timeout > 86400) {
        say("--stop-timeout %s: expected seconds between 0 and 86400", optarg);
        return EXIT_USAGE;
      }
      break;
    case 'h':
      write_all(STDOUT_FILENO, usage_text, sizeof usage_text - 1);
      return EXIT_OK;
    case ':':
      say("%s needs a value; try 'pslaunch --help'", argv[optind - 1]);
      return EXIT_USAGE;
    default:
      say("unknown option %s; try 'pslaunch --help'", argv[optind - 1]);
      return EXIT_USAGE;
    }
  }
  if (optind != nopt - 1) {
    say(optind >= nopt ? "no cluster spec FILE given; try 'pslaunch --help'"
                       : "expected one cluster spec FILE, got %d arguments; "
                         "put dworker's own options after \"--\"",
        nopt - optind);
    return EXIT_USAGE;
  }
  o->spec_path = argv[optind];
  return -1;
}

/* 1 when path is a regular file this process may execute. */
static int is_executable(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Looks a name without a slash up in PATH, as execvp would. Returns 0 and
 * the full path in out, or CM_ENOENT. */
static int search_path(const char *name, char *out, size_t outlen) {
  const char *path = getenv("PATH");
  const char *p = path ? path : "/usr/local/bin:/usr/bin:/bin";

  while (*p) {
    const char *colon = strchr(p, ':');
    int n = colon ? (int)(colon - p) : (int)strlen(p);
    if (snprintf(out, outlen, "%.*s/%s", n ? n : 1, n ? p : ".", name) <
            (int)outlen &&
        is_executable(out))
      return 0;
    p += n + (colon ? 1 : 0);
  }
  return CM_ENOENT;
}

/* Settles which binary runs a kind of task: the path given on the command
 * line (option names it, e.g. "--psd"), or the first of rel[] (relative to
 * the directory holding pslaunch itself) that exists. out must hold PATH_MAX
 * bytes (realpath writes it). Returns 0, or CM_ENOENT with a message in err.
 */
static int find_binary(const char *given, const char *option,
                       const char *const *rel, char *out, size_t outlen,
                       char *err, size_t errlen) {
  char self[PATH_MAX], cand[PATH_MAX], tried[2 * PATH_MAX] = "";
  ssize_t n;
  char *slash;
  int i, rc = CM_ENOENT;

  if (given) {
    if (!strchr(given, '/')) {
      rc = search_path(given, out, outlen);
      if (rc < 0)
        snprintf(err, errlen, "%s %s: not found in PATH", option, given);
      goto out;
    }
    if (!is_executable(given)) {
      snprintf(err, errlen, "%s %s: %s", option, given,
               access(given, F_OK) == 0 ? "not an executable file"
                                        : strerror(errno));
      goto out;
    }
    snprintf(out, outlen, "%s", given);
    rc = 0;
    goto out;
  }
  n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n < 0) {
    snprintf(err, errlen, "cannot find pslaunch's own directory: %s; give %s",
             strerror(errno), option);
    goto out;
  }
  self[n] = '\0';
  slash = strrchr(self, '/');
  if (slash)
    *slash = '\0';
  for (i = 0; rel[i]; i++) {
    size_t used = strlen(tried);
    if (snprintf(cand, sizeof cand, "%s/%s", self, rel[i]) >= (int)sizeof cand)
      continue;
    if (is_executable(cand) && realpath(cand, out)) {
      rc = 0;
      goto out;
    }
    if (snprintf(tried + used, sizeof tried - used, "%s%s", i ? ", " : "",
                 cand) < 0)
      break;
  }
  snprintf(err, errlen, "%s not found (tried %s); give its path with %s PATH",
           strrchr(rel[0], '/') ? strrchr(rel[0], '/') + 1 : rel[0], tried,
           option);
out:
  return rc;
}

/* ---- Picking the local tasks and checking their ports ---- */

/* Fills l->tasks with the spec's tasks on this host that the options ask
 * for, ps tasks first. Returns 0 or CM_ENOMEM. */
static int select_tasks(struct launch *l, const struct cm_spec *spec) {
  int i, n = 0, rc = 0;

  l->tasks = calloc((size_t)(spec->nps + spec->nworker), sizeof *l->tasks);
  if (!l->tasks) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (i = 0; l->opt->want_ps && i < spec->nps; i++) {
    if (!cm_addr_is_local(&spec->ps[i]))
      continue;
    l->tasks[n].type = CM_TASK_PS;
    l->tasks[n].addr = &spec->ps[i];
    snprintf(l->tasks[n].name, sizeof l->tasks[n].name, "ps:%d", i);
    n++;
    l->nps++;
  }
  for (i = 0; l->opt->want_worker && i < spec->nworker; i++) {
    if (!cm_addr_is_local(&spec->worker[i]))
      continue;
    l->tasks[n].type = CM_TASK_WORKER;
    l->tasks[n].addr = &spec->worker[i];
    snprintf(l->tasks[n].name, sizeof l->tasks[n].name, "worker:%d", i);
    n++;
    l->nworkers++;
  }
  l->ntasks = n;
  for (i = 0; i < n; i++) {
    int w = (int)strlen(l->tasks[i].name);
    l->tasks[i].l = l;
    l->width = w > l->width ? w : l->width;
  }
out:
  return rc;
}

/* Binds and listens on every local ps task's address, all at once (so two
 * tasks given the same port clash too), then lets them all go. SO_REUSEADDR
 * is on, as in gRPC's own listener: a socket that is listening still clashes,
 * but connections in TIME_WAIT from an earlier run do not. Returns 0, or
 * CM_EADDRINUSE / CM_ESYS with "ps:0: cannot listen on HOST:PORT: why" in
 * err. */
static int check_ports(const struct launch *l, char *err, size_t errlen) {
  int *fds = NULL, nfds = 0, i, rc = 0, one = 1;
  struct addrinfo hints, *res = NULL, *ai;

  fds = calloc((size_t)l->ntasks * 8 + 1, sizeof *fds);
  if (!fds) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (i = 0; i < l->ntasks; i++) {
    const struct task *t = &l->tasks[i];
    char port[16];
    int grc;

    if (t->type != CM_TASK_PS)
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

/* ---- Children and their output ---- */

static void check_done(struct launch *l);

/* Prints one line of a child's output with its task's prefix. */
static void emit_line(struct stream *s, const char *line, size_t n) {
  struct launch *l = s->task->l;
  int w = snprintf(l->scratch, 64, "%-*s | ", l->width, s->task->name);

  memcpy(l->scratch + w, line, n);
  l->scratch[w + n] = '\n';
  write_all(s->fd, l->scratch, (size_t)w + n + 1);
}

static void on_pipe_closed(uv_handle_t *h) {
  struct stream *s = h->data;
  s->state = 0;
  check_done(s->task->l);
}

/* Prints what is left of an unfinished line and closes the pipe. */
static void close_stream(struct stream *s) {
  if (s->state != 1)
    return;
  if (s->len > 0)
    emit_line(s, s->buf, s->len);
  s->len = 0;
  s->state = 2;
  uv_close((uv_handle_t *)&s->pipe, on_pipe_closed);
}

/* Reads land right after the partial line, so a line is never copied twice.
 * There is always room: on_read leaves len < LINE_CAP. */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  struct stream *s = h->data;
  buf->base = s->buf + s->len;
  buf->len = LINE_CAP - s->len;
}

static void on_read(uv_stream_t *h, ssize_t n, const uv_buf_t *buf) {
  struct stream *s = h->data;
  char *start = s->buf, *end, *nl;

  if (n < 0) {
    if (n != UV_EOF)
      say("%s: reading its output: %s", s->task->name, uv_strerror((int)n));
    close_stream(s);
    return;
  }
  s->len += (size_t)n;
  end = s->buf + s->len;
  while ((nl = memchr(start, '\n', (size_t)(end - start)))) {
    emit_line(s, start, (size_t)(nl - start));
    start = nl + 1;
  }
  s->len = (size_t)(end - start);
  memmove(s->buf, start, s->len);
  if (s->len == LINE_CAP) {
    emit_line(s, s->buf, s->len);
    s->len = 0;
  }
}

/* Says how a reaped task ended: "exit 3" or "killed by signal 9". */
static void describe_end(const struct task *t, char *buf, size_t len) {
  if (t->term_signal)
    snprintf(buf, len, "killed by signal %d", t->term_signal);
  else
    snprintf(buf, len, "exit %lld", (long long)t->exit_status);
}

/* Sends sig to every task still running; only our own children, by PID. */
static void signal_all(struct launch *l, int sig) {
  int i;

  for (i = 0; i < l->ntasks; i++) {
    struct task *t = &l->tasks[i];
    int rc;

    if (!t->running)
      continue;
    if (sig == SIGKILL)
      say("%s (pid %d) still running; sending SIGKILL", t->name, t->pid);
    cm_debug("sending SIG%s to %s (pid %d)", signame(sig), t->name, t->pid);
    rc = uv_process_kill(&t->proc, sig);
    if (rc < 0 && rc != UV_ESRCH)
      say("%s (pid %d): kill: %s", t->name, t->pid, uv_strerror(rc));
    t->sent_term |= sig == SIGTERM;
    t->sent_kill |= sig == SIGKILL;
  }
}

static void on_kill_timer(uv_timer_t *h) { signal_all(h->data, SIGKILL); }

/* Begins stopping every task: SIGTERM now, SIGKILL after the stop timeout.
 * The first caller settles the exit code. */
static void stop_all(struct launch *l, int result) {
  if (l->stopping)
    return;
  l->stopping = 1;
  l->result = result;
  signal_all(l, SIGTERM);
  uv_timer_start(&l->kill_timer, on_kill_timer,
                 (uint64_t)(l->opt->stop_timeout * 1000), 0);
}

static void on_signal(uv_signal_t *h, int signum) {
  struct launch *l = h->data;

  if (l->stopping) {
    if (signum == SIGINT) {
      say("SIGINT again; killing every task now");
      signal_all(l, SIGKILL);
    }
    return;
  }
  say("got SIG%s; stopping every task", signame(signum));
  l->interrupted_by = signum;
  stop_all(l, 128 + signum);
}

static void on_proc_closed(uv_handle_t *h) {
  struct task *t = h->data;
  t->proc_open = 0;
  check_done(t->l);
}

/* A child was reaped: decide whether the job goes on. */
static void on_child_exit(uv_process_t *p, int64_t exit_status,
                          int term_signal) {
  struct task *t = p->data;
  struct launch *l = t->l;
  char how[64];

  t->running = 0;
  t->exit_status = exit_status;
  t->term_signal = term_signal;
  t->t_end = uv_hrtime();
  uv_close((uv_handle_t *)p, on_proc_closed);
  describe_end(t, how, sizeof how);
  cm_debug("%s (pid %d) ended: %s", t->name, t->pid, how);
  if (!l->stopping) {
    if (t->type == CM_TASK_WORKER && term_signal == 0 && exit_status == 0) {
      if (++l->nworkers_done == l->nworkers) {
        if (l->nps > 0)
          say("all %d workers finished; stopping the ps tasks", l->nworkers);
        stop_all(l, EXIT_OK);
      }
    } else {
      say("%s failed (%s%s)", t->name, how,
          t->type == CM_TASK_PS && exit_status == 0 && !term_signal &&
                  l->nworkers > 0
              ? " while the workers still ran"
              : "");
      if (!l->failed)
        l->failed = t;
      stop_all(l, EXIT_FAILED);
    }
  }
  check_done(l);
}

static void on_drain_timer(uv_timer_t *h) {
  struct launch *l = h->data;
  int i;

  for (i = 0; i < l->ntasks; i++) {
    close_stream(&l->tasks[i].out);
    close_stream(&l->tasks[i].err);
  }
}

/* Once every child is reaped and every pipe closed, closes the launcher's
 * own handles so uv_run returns. Pipes that a child's own children still
 * hold open get one second to drain. */
static void check_done(struct launch *l) {
  int i, pipes = 0;

  if (l->finishing)
    return;
  for (i = 0; i < l->ntasks; i++) {
    if (l->tasks[i].proc_open)
      return;
    pipes += l->tasks[i].out.state != 0 || l->tasks[i].err.state != 0;
  }
  if (pipes) {
    if (!l->drain_started)
      uv_timer_start(&l->drain_timer, on_drain_timer, 1000, 0);
    l->drain_started = 1;
    return;
  }
  l->finishing = 1;
  uv_close((uv_handle_t *)&l->sig_int, NULL);
  uv_close((uv_handle_t *)&l->sig_term, NULL);
  uv_close((uv_handle_t *)&l->sig_hup, NULL);
  uv_close((uv_handle_t *)&l->kill_timer, NULL);
  uv_close((uv_handle_t *)&l->drain_timer, NULL);
}

static int stream_open(struct launch *l, struct task *t, struct stream *s,
                       int fd) {
  int rc = uv_pipe_init(&l->loop, &s->pipe, 0);

  if (rc == 0) {
    s->task = t;
    s->fd = fd;
    s->state = 1;
    s->pipe.data = s;
  }
  return rc;
}

/* Starts one task's child with its output piped back to us. Returns 0, or a
 * negative libuv code (reported) when it could not be started. */
static int spawn_task(struct launch *l, struct task *t) {
  const struct options *o = l->opt;
  uv_process_options_t po;
  uv_stdio_container_t stdio[3];
  char **args = NULL;
  int n = 0, i, rc;

  args = calloc((size_t)o->nextra + 6, sizeof *args);
  if (!args) {
    rc = UV_ENOMEM;
    say("%s: out of memory", t->name);
    goto out;
  }
  args[n++] = t->type == CM_TASK_PS ? l->psd : l->dworker;
  args[n++] = "--cluster";
  args[n++] = (char *)o->spec_path;
  args[n++] = "--task";
  args[n++] = t->name;
  for (i = 0; t->type == CM_TASK_WORKER && i < o->nextra; i++)
    args[n++] = o->extra[i];

  if ((rc = stream_open(l, t, &t->out, STDOUT_FILENO)) < 0 ||
      (rc = stream_open(l, t, &t->err, STDERR_FILENO)) < 0) {
    say("%s: pipe: %s", t->name, uv_strerror(rc));
    goto out;
  }
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[1].data.stream = (uv_stream_t *)&t->out.pipe;
  stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[2].data.stream = (uv_stream_t *)&t->err.pipe;
  memset(&po, 0, sizeof po);
  po.file = args[0];
  po.args = args;
  po.exit_cb = on_child_exit;
  po.stdio = stdio;
  po.stdio_count = 3;
  /* A session of its own: Ctrl-C in a terminal reaches only pslaunch, which
   * stops the tasks in order, rather than racing them to the signal. */
  po.flags = UV_PROCESS_DETACHED;
  t->proc.data = t;
  t->t_start = uv_hrtime();
  rc = uv_spawn(&l->loop, &t->proc, &po);
  t->proc_open = 1; /* closed in on_child_exit, or below when spawn failed */
  if (rc < 0) {
    say("%s: cannot start %s: %s", t->name, args[0], uv_strerror(rc));
    uv_close((uv_handle_t *)&t->proc, on_proc_closed);
    goto out;
  }
  t->started = t->running = 1;
  t->pid = uv_process_get_pid(&t->proc);
  say("started %s (pid %d)", t->name, t->pid);
  cm_debug("%s: %s --cluster %s --task %s%s", t->name, args[0], o->spec_path,
           t->name, o->nextra && t->type == CM_TASK_WORKER ? " ..." : "");
  if ((rc = uv_read_start((uv_stream_t *)&t->out.pipe, on_alloc, on_read)) <
          0 ||
      (rc = uv_read_start((uv_stream_t *)&t->err.pipe, on_alloc, on_read)) < 0)
    say("%s: reading its output: %s", t->name, uv_strerror(rc));
  rc = 0; /* it runs; output we cannot read is not a reason to stop it */
out:
  if (rc < 0) {
    close_stream(&t->out);
    close_stream(&t->err);
  }
  free(args);
  return rc;
}

/* Prints how each task ended and why pslaunch is leaving. */
static void print_summary(const struct launch *l) {
  int i;

  say("summary:");
  for (i = 0; i < l->ntasks; i++) {
    const struct task *t = &l->tasks[i];
    char how[96];

    if (!t->started) {
      say("  %-*s  not started", l->width, t->name);
      continue;
    }
    describe_end(t, how, sizeof how);
    if (t->term_signal)
      snprintf(how + strlen(how), sizeof how - strlen(how), " (SIG%s)",
               signame(t->term_signal));
    say("  %-*s  pid %-7d %7.2f s  %s%s", l->width, t->name, t->pid,
        (double)(t->t_end - t->t_start) / 1e9, how,
        t->sent_kill   ? ", SIGTERM did not stop it"
        : t->sent_term ? ", after SIGTERM"
                       : "");
  }
  if (l->interrupted_by)
    say("stopped by SIG%s", signame(l->interrupted_by));
  else if (l->result == EXIT_OK)
    say("all %d local workers finished", l->nworkers);
  else
    say("stopped because %s failed", l->failed ? l->failed->name : "a task");
}

/* Runs the selected tasks to the end. Returns pslaunch's exit code. */
static int launch_run(struct launch *l) {
  int i, rc;

  if ((rc = uv_loop_init(&l->loop)) < 0) {
    say("uv_loop_init: %s", uv_strerror(rc));
    return EXIT_FAILED;
  }
  uv_signal_init(&l->loop, &l->sig_int);
  uv_signal_init(&l->loop, &l->sig_term);
  uv_signal_init(&l->loop, &l->sig_hup);
  uv_timer_init(&l->loop, &l->kill_timer);
  uv_timer_init(&l->loop, &l->drain_timer);
  l->sig_int.data = l->sig_term.data = l->sig_hup.data = l;
  l->kill_timer.data = l->drain_timer.data = l;
  /* Watch the signals before the first spawn, so an early Ctrl-C cannot kill
   * pslaunch and leave its children behind. */
  uv_signal_start(&l->sig_int, on_signal, SIGINT);
  uv_signal_start(&l->sig_term, on_signal, SIGTERM);
  uv_signal_start(&l->sig_hup, on_signal, SIGHUP);

  for (i = 0; i < l->ntasks && !l->stopping; i++) {
    if (spawn_task(l, &l->tasks[i]) < 0) {
      l->failed = &l->tasks[i];
      stop_all(l, EXIT_FAILED);
    }
  }
  check_done(l);
  uv_run(&l->loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&l->loop);
  if (rc < 0)
    say("uv_loop_close: %s", uv_strerror(rc));
  print_summary(l);
  return l->result;
}

int main(int argc, char **argv) {
  /* psd lives in sbin when installed, beside pslaunch's bin. */
  static const char *const psd_rel[] = {"psd", "../ps-server/psd",
                                        "../sbin/psd", NULL};
  static const char *const dworker_rel[] = {"dworker", "../worker/dworker",
                                            NULL};
  struct options opt;
  struct cm_spec *spec = NULL;
  struct launch *l = NULL;
  char err[8192] = "", host[256] = "?";
  int code, rc;

  cm_log_set_name("pslaunch");
  /* Writing to a closed stdout must not kill pslaunch while its children
   * run; libuv resets the disposition in each child before exec. */
  signal(SIGPIPE, SIG_IGN);

  code = parse_args(argc, argv, &opt);
  if (code >= 0)
    goto out;

  code = EXIT_USAGE;
  rc = cm_spec_load(opt.spec_path, &spec, err, sizeof err);
  if (rc < 0) {
    say_lines(err[0] ? err : cm_strerror(rc));
    goto out;
  }
  l = calloc(1, sizeof *l);
  if (!l) {
    say("out of memory");
    code = EXIT_FAILED;
    goto out;
  }
  l->opt = &opt;
  if (select_tasks(l, spec) < 0) {
    say("out of memory");
    code = EXIT_FAILED;
    goto out;
  }
  if (l->ntasks == 0) {
    gethostname(host, sizeof host - 1);
    say("%s: no %s task has its address on this host (%s); nothing to start",
        opt.spec_path,
        !opt.want_worker ? "ps"
        : !opt.want_ps   ? "worker"
                         : "ps or worker",
        host);
    goto out;
  }
  if ((l->nps > 0 && find_binary(opt.psd, "--psd", psd_rel, l->psd,
                                 sizeof l->psd, err, sizeof err) < 0) ||
      (l->nworkers > 0 &&
       find_binary(opt.dworker, "--dworker", dworker_rel, l->dworker,
                   sizeof l->dworker, err, sizeof err) < 0)) {
    say("%s", err);
    goto out;
  }
  if (check_ports(l, err, sizeof err) < 0) {
    say("%s", err);
    code = EXIT_FAILED;
    goto out;
  }
  code = launch_run(l);
out:
  if (l)
    free(l->tasks);
  free(l);
  if (spec)
    cm_spec_free(spec);
  return code;
}
