/* The spec's mistake collector (errs.h): lines into the caller's buffer,
 * cut to fit with a count of what was left out; the pieces every message is
 * made of (a JSON path, a quoted value, what was found instead); and the
 * "unknown key ... (did you mean ...?)" check of an object's members. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memrchr under -std=c11 */
#endif

#include "errs.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SPEC_LINE_MAX 1024 /* longest single mistake line */

void cm__errs_init(struct cm__errs *e, const char *source, char *buf,
                   size_t cap) {
  e->source = source;
  e->buf = cap > 0 ? buf : NULL;
  e->cap = e->buf ? cap : 0;
  e->len = 0;
  e->count = 0;
  e->dropped = 0;
  e->full = 0;
  if (e->buf)
    e->buf[0] = '\0';
}

static void errs_append(struct cm__errs *e, const char *line) {
  size_t n = strlen(line);
  size_t sep = e->len > 0 ? 1 : 0;
  size_t k;

  e->count++;
  if (!e->buf)
    return;
  if (!e->full && e->len + sep + n < e->cap) {
    if (sep)
      e->buf[e->len++] = '\n';
    memcpy(e->buf + e->len, line, n + 1);
    e->len += n;
    return;
  }
  e->full = 1;
  if (e->len > 0) {
    e->dropped++;
    return;
  }
  /* Not even the first mistake fits: keep what does, cut at a UTF-8
   * character boundary. */
  k = e->cap - 1;
  while (k > 0 && ((unsigned char)line[k] & 0xC0) == 0x80)
    k--;
  memcpy(e->buf, line, k);
  e->buf[k] = '\0';
  e->len = k;
}

void cm__errs_finish(struct cm__errs *e) {
  char note[64];
  char *nl;
  int n;

  if (!e->buf || e->dropped == 0)
    return;
  for (;;) {
    n = snprintf(note, sizeof note, "\n(%d more not shown)", e->dropped);
    if (n > 0 && e->len + (size_t)n < e->cap) {
      memcpy(e->buf + e->len, note, (size_t)n + 1);
      e->len += (size_t)n;
      return;
    }
    nl = memrchr(e->buf, '\n', e->len);
    if (!nl)
      return; /* only one line left: keep it rather than the note */
    e->len = (size_t)(nl - e->buf);
    e->buf[e->len] = '\0';
    e->dropped++;
  }
}

void cm__report(struct cm__errs *e, const char *path, const char *fmt, ...) {
  char line[SPEC_LINE_MAX];
  size_t n = 0;
  int w;
  va_list ap;

  line[0] = '\0';
  if (e->source) {
    w = snprintf(line, sizeof line, "%s: ", e->source);
    n = w > 0 ? (size_t)w : 0;
  }
  if (path && *path && n < sizeof line) {
    w = snprintf(line + n, sizeof line - n, "%s: ", path);
    n += w > 0 ? (size_t)w : 0;
  }
  if (n < sizeof line) {
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
  }
  errs_append(e, line);
}

const char *cm__quote(char *dst, size_t n, const char *s) {
  static const char hex[] = "0123456789abcdef";
  size_t o = 0;
  unsigned char c;

  if (n < 8) {
    if (n > 0)
      dst[0] = '\0';
    return dst;
  }
  dst[o++] = '"';
  for (; *s; s++) {
    if (o + 4 + 5 >= n) { /* room for one escape, `..."` and the NUL */
      memcpy(dst + o, "...", 3);
      o += 3;
      break;
    }
    c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      dst[o++] = '\\';
      dst[o++] = (char)c;
    } else if (c >= 0x20 && c < 0x7f) {
      dst[o++] = (char)c;
    } else {
      dst[o++] = '\\';
      dst[o++] = 'x';
      dst[o++] = hex[c >> 4];
      dst[o++] = hex[c & 15];
    }
  }
  dst[o++] = '"';
  dst[o] = '\0';
  return dst;
}

const char *cm__describe(char *dst, size_t n, const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    snprintf(dst, n, "an object");
    break;
  case JSON_ARRAY:
    snprintf(dst, n, "an array");
    break;
  case JSON_STRING:
    cm__quote(dst, n, json_string_value(v));
    break;
  case JSON_INTEGER:
    snprintf(dst, n, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    break;
  case JSON_REAL:
    snprintf(dst, n, "%.15g", json_real_value(v));
    if (!strpbrk(dst, ".eEn") && strlen(dst) + 2 < n)
      strcat(dst, ".0"); /* show 3.0 as a real, not as the integer 3 */
    break;
  case JSON_TRUE:
    snprintf(dst, n, "true");
    break;
  case JSON_FALSE:
    snprintf(dst, n, "false");
    break;
  default:
    snprintf(dst, n, "null");
    break;
  }
  return dst;
}

/* Whether key can be shown bare in a path (job.epochs) rather than quoted
 * (job["my key"]). */
static int plain_key(const char *key) {
  if (!*key)
    return 0;
  for (; *key; key++)
    if (!isalnum((unsigned char)*key) && *key != '_' && *key != '-')
      return 0;
  return 1;
}

void cm__path_key(char *dst, size_t n, const char *parent, const char *key) {
  char q[CM__SPEC_QUOTE_MAX];

  if (plain_key(key) && strlen(key) < 64)
    snprintf(dst, n, "%s%s%s", parent, *parent ? "." : "", key);
  else
    snprintf(dst, n, "%s[%s]", parent, cm__quote(q, sizeof q, key));
}

void cm__path_index(char *dst, size_t n, const char *parent, size_t i) {
  snprintf(dst, n, "%s[%zu]", parent, i);
}

/* Levenshtein distance ignoring case; SIZE_MAX for keys too long to bother. */
static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  size_t prev[65], cur[65];
  size_t i, j, best;

  if (la > 64 || lb > 64)
    return SIZE_MAX;
  for (j = 0; j <= lb; j++)
    prev[j] = j;
  for (i = 1; i <= la; i++) {
    cur[0] = i;
    for (j = 1; j <= lb; j++) {
      best = prev[j - 1] + (tolower((unsigned char)a[i - 1]) !=
                            tolower((unsigned char)b[j - 1]));
      if (prev[j] + 1 < best)
        best = prev[j] + 1;
      if (cur[j - 1] + 1 < best)
        best = cur[j - 1] + 1;
      cur[j] = best;
    }
    memcpy(prev, cur, (lb + 1) * sizeof prev[0]);
  }
  return prev[lb];
}

void cm__check_keys(struct cm__errs *e, json_t *obj, const char *parent,
                    const char *const *known, size_t nknown) {
  char path[CM__SPEC_PATH_MAX], list[512], hint[96];
  const char *key, *near;
  json_t *v;
  size_t i, d, best, used;

  list[0] = '\0';
  used = 0;
  for (i = 0; i < nknown; i++) {
    int w = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                     known[i]);
    if (w < 0 || (size_t)w >= sizeof list - used)
      break;
    used += (size_t)w;
  }

  json_object_foreach(obj, key, v) {
    near = NULL;
    best = SIZE_MAX;
    for (i = 0; i < nknown; i++) {
      if (strcmp(key, known[i]) == 0)
        break;
      d = edit_distance(key, known[i]);
      /* A short key tolerates one slip, a longer one two. */
      if (d <= (strlen(known[i]) >= 6 ? 2u : 1u) && d < best) {
        best = d;
        near = known[i];
      }
    }
    if (i < nknown)
      continue;
    hint[0] = '\0';
    if (near)
      snprintf(hint, sizeof hint, " (did you mean %s?)", near);
    cm__path_key(path, sizeof path, parent, key);
    cm__report(e, path, "unknown key%s; expected one of %s", hint, list);
  }
}
