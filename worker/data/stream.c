/* The stream follower (stream.h): a directory listed with scandir on each
 * poll, or a file read from where the last poll stopped into a buffer of
 * the lines not yet handed out. */
#include "stream.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"
#include "log.h"

/* Most suffixes a part's name may end in. */
#define MAX_SUFFIXES 8

/* The follower's state. */
struct dw_stream {
  char dir[1024];                /* the parts' directory, or "" */
  char file[1024];               /* the growing file, or "" */
  char marker[1300];             /* the end marker's path */
  char suffix[MAX_SUFFIXES][32]; /* a part's name ends in one */
  int nsuffix;                   /* entries in suffix */
  long long window;              /* file: lines per window */
  char last[256];                /* dir: the last part taken */
  char (*taken)[256];            /* dir: the parts taken, ascending */
  size_t ntaken, takencap;       /* entries in taken; its size */
  char (*late)[256];             /* dir: late parts warned about */
  size_t nlate, latecap;         /* entries in late; its size */
  int fd;                        /* file: open, or -1 */
  char *buf;                     /* file: bytes read, not handed out */
  size_t len, cap;               /* bytes in buf; its size */
  size_t given;                  /* bytes of buf handed out last */
  unsigned long long line0;      /* file: lines handed out */
  unsigned long long windows;    /* windows handed out */
};

int dw_stream_open(const struct dw_stream_opts *o, struct dw_stream **out,
                   char *err, size_t errlen) {
  struct dw_stream *s;
  char d[1024];

  *out = NULL;
  if (!o->dir == !o->file || !o->end || !*o->end) {
    snprintf(err, errlen,
             "a stream needs a directory or a file (one of "
             "them) and an end marker's name");
    return CM_EINVAL;
  }
  if (!(s = calloc(1, sizeof *s))) {
    snprintf(err, errlen, "out of memory");
    return CM_ENOMEM;
  }
  s->fd = -1;
  s->window = o->window > 0 ? o->window : 10000;
  for (int i = 0; o->suffixes && o->suffixes[i] && i < MAX_SUFFIXES; i++)
    snprintf(s->suffix[s->nsuffix++], sizeof s->suffix[0], "%s",
             o->suffixes[i]);
  if (o->dir) {
    snprintf(s->dir, sizeof s->dir, "%s", o->dir);
    snprintf(s->marker, sizeof s->marker, "%s/%s", s->dir, o->end);
  } else {
    snprintf(s->file, sizeof s->file, "%s", o->file);
    snprintf(d, sizeof d, "%s", o->file);
    char *slash = strrchr(d, '/');
    if (slash)
      *slash = 0;
    snprintf(s->marker, sizeof s->marker, "%s/%s", slash ? d : ".", o->end);
  }
  *out = s;
  return 0;
}

/* Whether name is a part's: a suffix's, not hidden, not the suffix alone. */
static int is_part(const struct dw_stream *s, const char *name) {
  size_t n = strlen(name);
  if (name[0] == '.')
    return 0;
  for (int i = 0; i < s->nsuffix; i++) {
    size_t k = strlen(s->suffix[i]);
    if (n > k && !strcmp(name + n - k, s->suffix[i]))
      return 1;
  }
  return 0;
}

/* Whether part name was taken (taken is ascending: bsearch). */
static int was_taken(const struct dw_stream *s, const char *name) {
  size_t lo = 0, hi = s->ntaken;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(s->taken[mid], name);
    if (!c)
      return 1;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return 0;
}

/* Warns once about a part that came after a later-named one was taken. */
static void warn_late(struct dw_stream *s, const char *name) {
  for (size_t i = 0; i < s->nlate; i++)
    if (!strcmp(s->late[i], name))
      return;
  if (s->nlate == s->latecap) {
    size_t c = s->latecap ? 2 * s->latecap : 16;
    void *p = realloc(s->late, c * sizeof *s->late);
    if (!p)
      return;
    s->late = p;
    s->latecap = c;
  }
  snprintf(s->late[s->nlate++], sizeof s->late[0], "%s", name);
  cm_warn("stream %s: part %s appeared after %s was taken: skipped (parts "
          "are taken in name order, each once)",
          s->dir, name, s->last);
}

static int poll_dir(struct dw_stream *s, struct dw_stream_window *w, char *err,
                    size_t errlen) {
  struct stat st;
  int ended = stat(s->marker, &st) == 0; /* before the listing */
  DIR *d = opendir(s->dir);
  struct dirent *e;
  char best[256] = "", path[1400];

  if (!d) {
    snprintf(err, errlen, "cannot read the stream's directory %s: %s", s->dir,
             strerror(errno));
    return CM_EIO;
  }
  while ((e = readdir(d))) {
    if (!is_part(s, e->d_name) || strlen(e->d_name) >= sizeof best)
      continue;
    snprintf(path, sizeof path, "%s/%s", s->dir, e->d_name);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
      continue;
    if (s->last[0] && strcmp(e->d_name, s->last) <= 0) {
      if (!was_taken(s, e->d_name))
        warn_late(s, e->d_name);
      continue;
    }
    if (!best[0] || strcmp(e->d_name, best) < 0)
      snprintf(best, sizeof best, "%s", e->d_name);
  }
  closedir(d);
  if (!best[0])
    return ended ? DW_STREAM_END : DW_STREAM_NONE;
  if (s->ntaken == s->takencap) {
    size_t c = s->takencap ? 2 * s->takencap : 64;
    void *p = realloc(s->taken, c * sizeof *s->taken);
    if (!p) {
      snprintf(err, errlen, "out of memory");
      return CM_ENOMEM;
    }
    s->taken = p;
    s->takencap = c;
  }
  snprintf(s->taken[s->ntaken++], sizeof s->taken[0], "%s", best);
  memset(w, 0, sizeof *w);
  snprintf(s->last, sizeof s->last, "%s", best);
  snprintf(w->name, sizeof w->name, "%s", best);
  snprintf(w->path, sizeof w->path, "%s/%s", s->dir, best);
  s->windows++;
  return DW_STREAM_WINDOW;
}

/* Reads what the file has past what was read. */
static int read_more(struct dw_stream *s, char *err, size_t errlen) {
  for (;;) {
    if (s->cap - s->len < 65536) {
      size_t c = s->cap ? 2 * s->cap : 1 << 20;
      char *p = realloc(s->buf, c);
      if (!p) {
        snprintf(err, errlen, "%s: out of memory", s->file);
        return CM_ENOMEM;
      }
      s->buf = p;
      s->cap = c;
    }
    ssize_t k = read(s->fd, s->buf + s->len, s->cap - s->len);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      snprintf(err, errlen, "read %s: %s", s->file, strerror(errno));
      return CM_EIO;
    }
    if (k == 0)
      return 0;
    s->len += (size_t)k;
  }
}

static int poll_file(struct dw_stream *s, struct dw_stream_window *w, char *err,
                     size_t errlen) {
  struct stat st;
  int ended = stat(s->marker, &st) == 0, rc;
  unsigned long long lines = 0;
  size_t end = 0; /* bytes of the window */
  const char *base;

  if (s->given) { /* the last window's bytes are done with */
    memmove(s->buf, s->buf + s->given, s->len - s->given);
    s->len -= s->given;
    s->given = 0;
  }
  if (s->fd < 0 && (s->fd = open(s->file, O_RDONLY | O_CLOEXEC)) < 0) {
    if (errno != ENOENT) {
      snprintf(err, errlen, "cannot open %s: %s", s->file, strerror(errno));
      return CM_EIO;
    }
    if (ended)
      cm_warn("stream %s: the end marker %s appeared, and the file never did",
              s->file, s->marker);
    return ended ? DW_STREAM_END : DW_STREAM_NONE;
  }
  if ((rc = read_more(s, err, errlen)))
    return rc;
  for (size_t i = 0; i < s->len && lines < (unsigned long long)s->window; i++)
    if (s->buf[i] == '\n') {
      lines++;
      end = i + 1;
    }
  if (lines < (unsigned long long)s->window && !(ended && lines > 0)) {
    if (ended && s->len)
      cm_warn("stream %s: the end marker came with a last line without its "
              "newline (%zu bytes): dropped",
              s->file, s->len);
    return ended ? DW_STREAM_END : DW_STREAM_NONE;
  }
  memset(w, 0, sizeof *w);
  base = strrchr(s->file, '/');
  base = base ? base + 1 : s->file;
  snprintf(w->name, sizeof w->name, "%.200s:%llu-%llu", base, s->line0 + 1,
           s->line0 + lines);
  snprintf(w->path, sizeof w->path, "%s", s->file);
  w->text = s->buf;
  w->len = end;
  w->line0 = s->line0;
  w->lines = lines;
  s->given = end;
  s->line0 += lines;
  s->windows++;
  return DW_STREAM_WINDOW;
}

int dw_stream_poll(struct dw_stream *s, struct dw_stream_window *w, char *err,
                   size_t errlen) {
  return s->dir[0] ? poll_dir(s, w, err, errlen) : poll_file(s, w, err, errlen);
}

int dw_stream_wait(struct dw_stream *s, struct dw_stream_window *w,
                   double poll_s, const volatile sig_atomic_t *stop, char *err,
                   size_t errlen) {
  for (;;) {
    if (stop && *stop)
      return DW_STREAM_STOPPED;
    int rc = dw_stream_poll(s, w, err, errlen);
    if (rc != DW_STREAM_NONE)
      return rc;
    double until = cm_mono_s() + poll_s;
    while (cm_mono_s() < until) {
      if (stop && *stop)
        return DW_STREAM_STOPPED;
      cm_sleep_ms(poll_s < 0.05 ? (long)(poll_s * 1000) + 1 : 50);
    }
  }
}

unsigned long long dw_stream_windows(const struct dw_stream *s) {
  return s->windows;
}

size_t dw_stream_late(const struct dw_stream *s) { return s->nlate; }

void dw_stream_free(struct dw_stream *s) {
  if (!s)
    return;
  if (s->fd >= 0)
    close(s->fd);
  free(s->buf);
  free(s->late);
  free(s->taken);
  free(s);
}
