/* Internal to common/spec: how the spec's parsers report mistakes. Every
 * mistake is one line "source: path: message" collected in the caller's
 * err buffer, so that a spec with many mistakes is refused with all of them
 * at once; the helpers here build the path and the quoted values those lines
 * show, and report unknown keys with a "did you mean" hint. Not part of
 * spec.h: nothing outside common/spec includes this. */
#ifndef CM_SPEC_ERRS_H
#define CM_SPEC_ERRS_H

#include <stddef.h>

#include <jansson.h>

#define CM__SPEC_PATH_MAX 256  /* longest JSON path shown in a message */
#define CM__SPEC_QUOTE_MAX 128 /* longest quoted value shown in a message */

/* Collects mistakes as lines of the caller's err buffer. Lines are separated
 * by '\n' with none after the last; once a line does not fit, later ones are
 * only counted and a "(N more not shown)" note closes the buffer. */
struct cm__errs {
  const char *source; /* prefix of every line ("local.json"), NULL for none;
                         borrowed */
  char *buf;          /* caller's buffer, NULL when it gave none; borrowed */
  size_t cap;         /* size of buf in bytes, 0 when buf is NULL */
  size_t len;         /* bytes used in buf, not counting the NUL */
  int count;          /* mistakes reported, shown or not */
  int dropped;        /* mistakes that did not fit in buf */
  int full;           /* set once a line did not fit: later ones are dropped */
};

/* Starts collecting into buf[0..cap) (may be NULL with cap 0: then mistakes
 * are only counted), each line prefixed with source (may be NULL). */
void cm__errs_init(struct cm__errs *e, const char *source, char *buf,
                   size_t cap);

/* Closes the buffer with a note on how many mistakes were left out, dropping
 * whole lines from the end until the note fits. */
void cm__errs_finish(struct cm__errs *e);

/* Reports one mistake as "source: path: message". */
void cm__report(struct cm__errs *e, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Writes s into dst as a double-quoted string with '"', '\\' and anything
 * outside printable ASCII escaped, so a message stays on one line; long
 * strings are cut with "...". Returns dst. */
const char *cm__quote(char *dst, size_t n, const char *s);

/* Describes a JSON value for "got ..." in a message. Returns dst. */
const char *cm__describe(char *dst, size_t n, const json_t *v);

/* Writes parent.key (or just key at the top) into dst. */
void cm__path_key(char *dst, size_t n, const char *parent, const char *key);

/* Writes parent[i] into dst. */
void cm__path_index(char *dst, size_t n, const char *parent, size_t i);

/* Reports every member of obj whose key is not in known[0..n), with a
 * "did you mean" hint when one known key is close. */
void cm__check_keys(struct cm__errs *e, json_t *obj, const char *parent,
                    const char *const *known, size_t nknown);

#endif
