/* Everything pslaunch writes: its own "pslaunch: ..." lines on stderr, and
 * its children's stdout and stderr, cut into lines and passed on to its
 * own stdout and stderr with the task's name as a prefix. Each line goes
 * out in one write, so lines from two children never interleave. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "pslaunch_internal.h"

/* Writes all of buf[0..len) to fd in as few write() calls as the kernel
 * allows, so a line from one child is never split by another's. */
void pl_write_all(int fd, const char *buf, size_t len) {
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
void pl_say(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  int n = snprintf(buf, sizeof buf, "pslaunch: ");

  va_start(ap, fmt);
  n += vsnprintf(buf + n, sizeof buf - n, fmt, ap);
  va_end(ap);
  if ((size_t)n >= sizeof buf - 1)
    n = sizeof buf - 2;
  buf[n++] = '\n';
  pl_write_all(STDERR_FILENO, buf, (size_t)n);
}

/* Prints every line of a multi-line message, each as a "pslaunch:" line. */
void pl_say_lines(const char *text) {
  const char *p = text;

  while (*p) {
    const char *nl = strchr(p, '\n');
    int n = nl ? (int)(nl - p) : (int)strlen(p);
    if (n > 0)
      pl_say("%.*s", n, p);
    p += n + (nl ? 1 : 0);
  }
}

/* Prints one line of a child's output with its task's prefix. */
static void emit_line(struct pl_stream *s, const char *line, size_t n) {
  struct pl_launch *l = s->task->l;
  int w = snprintf(l->scratch, 64, "%-*s | ", l->width, s->task->name);

  memcpy(l->scratch + w, line, n);
  l->scratch[w + n] = '\n';
  pl_write_all(s->fd, l->scratch, (size_t)w + n + 1);
}

/* The pipe is closed: one less handle for pl_check_done to wait for. */
static void on_pipe_closed(uv_handle_t *h) {
  struct pl_stream *s = h->data;
  s->state = 0;
  pl_check_done(s->task->l);
}

/* Prints what is left of an unfinished line and closes the pipe. */
void pl_close_stream(struct pl_stream *s) {
  if (s->state != 1)
    return;
  if (s->len > 0)
    emit_line(s, s->buf, s->len);
  s->len = 0;
  s->state = 2;
  uv_close((uv_handle_t *)&s->pipe, on_pipe_closed);
}

/* Reads land right after the partial line, so a line is never copied twice.
 * There is always room: on_read leaves len < PL_LINE_CAP. */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  struct pl_stream *s = h->data;
  buf->base = s->buf + s->len;
  buf->len = PL_LINE_CAP - s->len;
}

/* Passes on every line the read completed and keeps the rest for the next
 * one; a line that fills the buffer is passed on in pieces. At the end of
 * the output (or an error) the stream closes. */
static void on_read(uv_stream_t *h, ssize_t n, const uv_buf_t *buf) {
  struct pl_stream *s = h->data;
  char *start = s->buf, *end, *nl;

  if (n < 0) {
    if (n != UV_EOF)
      pl_say("%s: reading its output: %s", s->task->name, uv_strerror((int)n));
    pl_close_stream(s);
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
  if (s->len == PL_LINE_CAP) {
    emit_line(s, s->buf, s->len);
    s->len = 0;
  }
}

int pl_stream_open(struct pl_launch *l, struct pl_task *t, struct pl_stream *s,
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

int pl_stream_read_start(struct pl_stream *s) {
  return uv_read_start((uv_stream_t *)&s->pipe, on_alloc, on_read);
}
