/* Follows a stream of training data (docs/ctr.md, "Training on a stream"):
 * a directory of time-ordered parts, or one file that grows, until an end
 * marker appears. Each window (a part, or a number of a file's lines) is
 * handed out once, in order.
 *
 * A directory's parts: regular files whose names end in one of the
 * suffixes (LIBSVM: ".svm") and do not start with '.', taken in name order
 * (strcmp), each once. A part counts once it is there under such a name:
 * a writer writes it under another name (".part-3.svm.tmp", or any name
 * not ending in the suffix) and renames it into place. A part that appears
 * later under a name sorting before the last one taken is skipped, with a
 * warning (its data would come out of order).
 *
 * A growing file: windows of `window` complete lines (each ending in
 * '\n'); a last line without its newline is held back until the newline
 * arrives. The file may appear after the stream is opened. At the end
 * marker the complete lines left are the last (shorter) window; a last
 * line never finished is dropped with a warning. A file truncated or
 * replaced is not followed.
 *
 * The end marker is a file named `end` in the directory (for a file, in
 * the file's directory). It is looked for before the parts are listed, so
 * every part renamed into place before the marker was created is taken
 * before the stream ends. */
#ifndef DW_STREAM_H
#define DW_STREAM_H

#include <signal.h>
#include <stddef.h>

/* What dw_stream_poll and dw_stream_wait return (else a negative CM_E*). */
enum {
  DW_STREAM_NONE = 0,   /* nothing new yet */
  DW_STREAM_WINDOW = 1, /* a window: *w filled */
  DW_STREAM_END = 2,    /* the end marker, and every window before it taken */
  DW_STREAM_STOPPED = 3 /* dw_stream_wait: *stop was set */
};

/* What to follow. */
struct dw_stream_opts {
  const char *dir;             /* a directory of parts, or NULL */
  const char *file;            /* one growing file, or NULL */
  const char *const *suffixes; /* dir: NULL-terminated; a part's name ends
                                  in one of them */
  const char *end;             /* the end marker's file name */
  long long window;            /* file: lines per window (> 0) */
};

/* One window. */
struct dw_stream_window {
  char name[256];           /* the part's file name; for a file
                               "NAME:A-B", its lines A..B (from 1) */
  char path[1100];          /* the part's path, or the file's */
  const char *text;         /* file: the window's lines (the stream's, valid
                               until the next poll); NULL for a part */
  size_t len;               /* bytes in text */
  unsigned long long line0; /* file: lines before this window */
  unsigned long long lines; /* file: lines in text */
};

struct dw_stream;

/* Starts following o (its strings are copied). 0, CM_EINVAL (neither or
 * both of dir and file), CM_ENOMEM; err says which. */
int dw_stream_open(const struct dw_stream_opts *o, struct dw_stream **out,
                   char *err, size_t errlen);

/* Looks once: DW_STREAM_WINDOW (the next window in *w), DW_STREAM_NONE or
 * DW_STREAM_END; CM_EIO (err: the path and why) when the directory or the
 * file cannot be read, CM_ENOMEM. A late part's warning goes to the log. */
int dw_stream_poll(struct dw_stream *s, struct dw_stream_window *w, char *err,
                   size_t errlen);

/* Polls every poll_s seconds until a window or the end, or until *stop
 * (may be NULL) is set: DW_STREAM_STOPPED (looked at every 50 ms). */
int dw_stream_wait(struct dw_stream *s, struct dw_stream_window *w,
                   double poll_s, const volatile sig_atomic_t *stop, char *err,
                   size_t errlen);

/* Windows handed out so far. */
unsigned long long dw_stream_windows(const struct dw_stream *s);

/* Late parts skipped (and warned about) so far. */
size_t dw_stream_late(const struct dw_stream *s);

/* Frees s (NULL is fine). */
void dw_stream_free(struct dw_stream *s);

#endif
