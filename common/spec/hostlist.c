/* Slurm's compressed host lists and task counts (hostlist.h), expanded the
 * way Slurm's own hostlist code reads them: items split at the commas that
 * are outside brackets, each bracketed group a list of numbers and ranges
 * whose lower bound sets the zero padding, hosts in the order written. */
#include "hostlist.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

#define NAME_MAX_LEN 255 /* longest host name, as struct cm_addr holds it */
#define DIGITS_MAX 18    /* longest number in a range: fits a long long */

/* The hosts expanded so far. */
struct list {
  char **v;    /* owned strings */
  int n;       /* entries used */
  int cap;     /* entries allocated */
  char *err;   /* the caller's message buffer */
  size_t elen; /* its size */
};

static int fail(struct list *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Writes the message into the caller's buffer. Returns CM_EINVAL. */
static int fail(struct list *l, const char *fmt, ...) {
  va_list ap;

  if (l->err && l->elen) {
    va_start(ap, fmt);
    vsnprintf(l->err, l->elen, fmt, ap);
    va_end(ap);
  }
  return CM_EINVAL;
}

static int push(struct list *l, const char *name) {
  char **grown;

  if (l->n >= CM_HOSTLIST_MAX)
    return fail(l, "expands to more than %d hosts", CM_HOSTLIST_MAX);
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 16;
    grown = realloc(l->v, (size_t)l->cap * sizeof *grown);
    if (!grown)
      return CM_ENOMEM;
    l->v = grown;
  }
  if (!(l->v[l->n] = strdup(name)))
    return CM_ENOMEM;
  l->n++;
  return 0;
}

/* Reads the digits at s[*i..end) into *val and their count into *ndig. */
static int read_number(struct list *l, const char *s, size_t *i, size_t end,
                       long long *val, int *ndig) {
  *val = 0;
  *ndig = 0;
  while (*i < end && isdigit((unsigned char)s[*i])) {
    if (++*ndig > DIGITS_MAX)
      return fail(l, "number too long at character %zu", *i + 1);
    *val = *val * 10 + (s[*i] - '0');
    ++*i;
  }
  if (*ndig == 0)
    return fail(l, "expected a number at character %zu", *i + 1);
  return 0;
}

static int expand_item(struct list *l, const char *s, size_t at, size_t end,
                       char *acc, size_t used);

/* Appends one number of a group (zero-padded to width) to acc[0..used) and
 * expands the rest of the item, s[rest..end), after it. */
static int emit(struct list *l, const char *s, size_t rest, size_t end,
                char *acc, size_t used, long long v, int width) {
  int k = snprintf(acc + used, NAME_MAX_LEN + 1 - used, "%0*lld", width, v);

  if (k < 0 || used + (size_t)k > NAME_MAX_LEN)
    return fail(l, "a host name is longer than %d characters", NAME_MAX_LEN);
  return expand_item(l, s, rest, end, acc, used + (size_t)k);
}

/* Expands the group s[open+1..close) (numbers and ranges between brackets),
 * each followed by the expansion of s[close+1..end). */
static int expand_group(struct list *l, const char *s, size_t open,
                        size_t close, size_t end, char *acc, size_t used) {
  size_t i = open + 1;
  long long lo, hi, v;
  int lodig, hidig, rc;

  if (i == close)
    return fail(l, "empty brackets at character %zu", open + 1);
  for (;;) {
    if ((rc = read_number(l, s, &i, close, &lo, &lodig)) < 0)
      return rc;
    hi = lo;
    if (i < close && s[i] == '-') {
      i++;
      if ((rc = read_number(l, s, &i, close, &hi, &hidig)) < 0)
        return rc;
      if (hi < lo)
        return fail(l, "range %lld-%lld runs backwards at character %zu", lo,
                    hi, i);
      if (hi - lo >= CM_HOSTLIST_MAX)
        return fail(l, "expands to more than %d hosts", CM_HOSTLIST_MAX);
    }
    for (v = lo; v <= hi; v++)
      if ((rc = emit(l, s, close + 1, end, acc, used, v, lodig)) < 0)
        return rc;
    if (i == close)
      return 0;
    if (s[i] != ',')
      return fail(l, "unexpected '%c' at character %zu; expected ',' or '-'",
                  s[i], i + 1);
    i++;
  }
}

/* Expands the item s[at..end) after the name part acc[0..used) built so
 * far: up to its first group, then each of the group's numbers in turn. */
static int expand_item(struct list *l, const char *s, size_t at, size_t end,
                       char *acc, size_t used) {
  size_t i, close;

  for (i = at; i < end && s[i] != '['; i++) {
    if (s[i] == ']')
      return fail(l, "unbalanced ']' at character %zu", i + 1);
    if (isspace((unsigned char)s[i]) || !isprint((unsigned char)s[i]))
      return fail(l, "unexpected character at %zu", i + 1);
    if (used >= NAME_MAX_LEN)
      return fail(l, "a host name is longer than %d characters", NAME_MAX_LEN);
    acc[used++] = s[i];
  }
  acc[used] = '\0';
  if (i == end)
    return used ? push(l, acc) : fail(l, "empty host name");
  for (close = i + 1; close < end && s[close] != ']'; close++)
    if (s[close] == '[')
      return fail(l, "nested '[' at character %zu", close + 1);
  if (close == end)
    return fail(l, "unbalanced '[' at character %zu", i + 1);
  return expand_group(l, s, i, close, end, acc, used);
}

int cm_hostlist_expand(const char *text, char ***hosts, int *n, char *err,
                       size_t errlen) {
  struct list l = {NULL, 0, 0, err, errlen};
  char acc[NAME_MAX_LEN + 1];
  size_t start = 0, i, len;
  int depth = 0, rc = 0;

  *hosts = NULL;
  *n = 0;
  if (err && errlen)
    err[0] = '\0';
  len = text ? strlen(text) : 0;
  if (len == 0) {
    rc = fail(&l, "empty host list");
    goto out;
  }
  for (i = 0; i <= len; i++) {
    if (i < len && text[i] == '[')
      depth++;
    else if (i < len && text[i] == ']')
      depth--;
    if (i < len && (text[i] != ',' || depth > 0))
      continue;
    if (i == start) {
      rc = fail(&l, "empty item at character %zu", i + 1);
      goto out;
    }
    if ((rc = expand_item(&l, text, start, i, acc, 0)) < 0)
      goto out;
    start = i + 1;
  }
  *hosts = l.v;
  *n = l.n;
  l.v = NULL;
out:
  cm_hostlist_free(l.v, l.n);
  return rc;
}

void cm_hostlist_free(char **hosts, int n) {
  if (!hosts)
    return;
  for (int i = 0; i < n; i++)
    free(hosts[i]);
  free(hosts);
}

int cm_hostlist_counts(const char *text, int **counts, int *n, char *err,
                       size_t errlen) {
  struct list l = {NULL, 0, 0, err, errlen};
  int *v = NULL, *grown, nv = 0, cap = 0, rc = 0, d;
  long long count, times;
  size_t i = 0, len;

  *counts = NULL;
  *n = 0;
  if (err && errlen)
    err[0] = '\0';
  len = text ? strlen(text) : 0;
  if (len == 0) {
    rc = fail(&l, "empty list of task counts");
    goto out;
  }
  for (;;) {
    if ((rc = read_number(&l, text, &i, len, &count, &d)) < 0)
      goto out;
    times = 1;
    if (i < len && text[i] == '(') {
      if (i + 1 >= len || text[i + 1] != 'x') {
        rc = fail(&l, "expected \"(xN)\" at character %zu", i + 1);
        goto out;
      }
      i += 2;
      if ((rc = read_number(&l, text, &i, len, &times, &d)) < 0)
        goto out;
      if (i >= len || text[i] != ')') {
        rc = fail(&l, "expected ')' at character %zu", i + 1);
        goto out;
      }
      i++;
    }
    if (count < 1 || times < 1) {
      rc = fail(&l, "%s 0 before character %zu; expected 1 or more",
                count < 1 ? "a count of" : "a repeat of", i + 1);
      goto out;
    }
    if (count > CM_HOSTLIST_MAX || times > CM_HOSTLIST_MAX - nv) {
      rc = fail(&l, "more than %d nodes or tasks", CM_HOSTLIST_MAX);
      goto out;
    }
    if (nv + times > cap) {
      cap = nv + (int)times + 16;
      if (!(grown = realloc(v, (size_t)cap * sizeof *v))) {
        rc = CM_ENOMEM;
        goto out;
      }
      v = grown;
    }
    while (times-- > 0)
      v[nv++] = (int)count;
    if (i == len)
      break;
    if (text[i] != ',') {
      rc = fail(&l, "unexpected '%c' at character %zu; expected ',' or \"(x\"",
                text[i], i + 1);
      goto out;
    }
    i++;
  }
  *counts = v;
  *n = nv;
  v = NULL;
out:
  free(v);
  return rc;
}
