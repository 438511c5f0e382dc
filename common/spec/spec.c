/* The cluster spec: parses a TF_CONFIG-shaped JSON file into a struct cm_spec,
 * checking every field and reporting every mistake (file, JSON path, what was
 * expected) instead of stopping at the first one; settles which task this
 * process is (--task, then the spec, then TF_CONFIG); and tells whether an
 * address names this machine, so a launcher knows which tasks to start. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* getifaddrs, memrchr, strcasecmp under -std=c11 */
#endif

#include "spec.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "err.h"

#define SPEC_LINE_MAX 1024        /* longest single mistake line */
#define SPEC_PATH_MAX 256         /* longest JSON path shown in a message */
#define SPEC_QUOTE_MAX 128        /* longest quoted value shown in a message */
#define SPEC_FILE_MAX (16u << 20) /* largest spec file read */
#define SPEC_LAYER_MAX (1 << 20)  /* widest hidden layer accepted */
#define SPEC_CHANNELS_MAX 1024    /* most channels of a CNN convolution */

/* Collects mistakes as lines of the caller's err buffer. Lines are separated
 * by '\n' with none after the last; once a line does not fit, later ones are
 * only counted and a "(N more not shown)" note closes the buffer. */
struct spec_errs {
  const char *source; /* prefix of every line ("local.json"), NULL for none */
  char *buf;          /* caller's buffer, NULL when it gave none */
  size_t cap;         /* size of buf in bytes, 0 when buf is NULL */
  size_t len;         /* bytes used in buf, not counting the NUL */
  int count;          /* mistakes reported, shown or not */
  int dropped;        /* mistakes that did not fit in buf */
  int full;           /* set once a line did not fit: later ones are dropped */
};

static void errs_init(struct spec_errs *e, const char *source, char *buf,
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

static void errs_append(struct spec_errs *e, const char *line) {
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

/* Closes the buffer with a note on how many mistakes were left out, dropping
 * whole lines from the end until the note fits. */
static void errs_finish(struct spec_errs *e) {
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

/* Reports one mistake as "source: path: message". */
static void report(struct spec_errs *e, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void report(struct spec_errs *e, const char *path, const char *fmt,
                   ...) {
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

/* Writes s into dst as a double-quoted string with '"', '\\' and anything
 * outside printable ASCII escaped, so a message stays on one line; long
 * strings are cut with "...". Returns dst. */
static const char *quote(char *dst, size_t n, const char *s) {
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

/* Describes a JSON value for "got ..." in a message. Returns dst. */
static const char *describe(char *dst, size_t n, const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    snprintf(dst, n, "an object");
    break;
  case JSON_ARRAY:
    snprintf(dst, n, "an array");
    break;
  case JSON_STRING:
    quote(dst, n, json_string_value(v));
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

/* Writes parent.key (or just key at the top) into dst. */
static void path_key(char *dst, size_t n, const char *parent, const char *key) {
  char q[SPEC_QUOTE_MAX];

  if (plain_key(key) && strlen(key) < 64)
    snprintf(dst, n, "%s%s%s", parent, *parent ? "." : "", key);
  else
    snprintf(dst, n, "%s[%s]", parent, quote(q, sizeof q, key));
}

/* Writes parent[i] into dst. */
static void path_index(char *dst, size_t n, const char *parent, size_t i) {
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

/* Reports every member of obj whose key is not in known[0..n), with a
 * "did you mean" hint when one known key is close. */
static void check_keys(struct spec_errs *e, json_t *obj, const char *parent,
                       const char *const *known, size_t nknown) {
  char path[SPEC_PATH_MAX], list[512], hint[96];
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
    path_key(path, sizeof path, parent, key);
    report(e, path, "unknown key%s; expected one of %s", hint, list);
  }
}

/* How an integer range reads in a message: "a positive integer" etc. */
static const char *int_kind(long long min) {
  if (min == 1)
    return "a positive integer";
  if (min == 0)
    return "a non-negative integer";
  return "an integer";
}

/* Checks that v is an integer in [min, max] and stores it in *val; reports
 * and returns 0 otherwise. */
static int want_int(struct spec_errs *e, const json_t *v, const char *path,
                    long long min, long long max, long long *val) {
  char got[SPEC_QUOTE_MAX];
  long long x;

  if (!json_is_integer(v)) {
    report(e, path, "expected %s, got %s", int_kind(min),
           describe(got, sizeof got, v));
    return 0;
  }
  x = json_integer_value(v);
  if (x < min) {
    report(e, path, "expected %s, got %lld", int_kind(min), x);
    return 0;
  }
  if (x > max) {
    report(e, path, "%lld out of range; expected %s up to %lld", x,
           int_kind(min), max);
    return 0;
  }
  *val = x;
  return 1;
}

/* Stores the optional integer member obj.key in *dst when it is present and
 * in [min, max]; leaves the default in *dst when absent. */
static void opt_int(struct spec_errs *e, json_t *obj, const char *parent,
                    const char *key, long long min, long long max, int *dst) {
  char path[SPEC_PATH_MAX];
  json_t *v = json_object_get(obj, key);
  long long x;

  if (!v)
    return;
  path_key(path, sizeof path, parent, key);
  if (want_int(e, v, path, min, max, &x))
    *dst = (int)x;
}

/* Stores the optional non-empty string member obj.key in dst[0..cap);
 * returns 1 when it was present and valid, 0 otherwise. */
static int opt_string(struct spec_errs *e, json_t *obj, const char *parent,
                      const char *key, char *dst, size_t cap) {
  char path[SPEC_PATH_MAX], got[SPEC_QUOTE_MAX];
  json_t *v = json_object_get(obj, key);
  size_t n;

  if (!v)
    return 0;
  path_key(path, sizeof path, parent, key);
  if (!json_is_string(v)) {
    report(e, path, "expected a string, got %s", describe(got, sizeof got, v));
    return 0;
  }
  n = json_string_length(v);
  if (n == 0) {
    report(e, path, "empty; expected a non-empty string");
    return 0;
  }
  if (n >= cap) {
    report(e, path, "%zu characters long; expected at most %zu", n, cap - 1);
    return 0;
  }
  memcpy(dst, json_string_value(v), n + 1);
  return 1;
}

/* Stores the optional boolean member obj.key in *dst as 0 or 1. */
static void opt_bool(struct spec_errs *e, json_t *obj, const char *parent,
                     const char *key, int *dst) {
  char path[SPEC_PATH_MAX], got[SPEC_QUOTE_MAX];
  json_t *v = json_object_get(obj, key);

  if (!v)
    return;
  if (json_is_boolean(v)) {
    *dst = json_is_true(v);
    return;
  }
  path_key(path, sizeof path, parent, key);
  report(e, path, "expected true or false, got %s",
         describe(got, sizeof got, v));
}

/* Checks the optional string member obj.key against the choices in `one_of`
 * (a NULL-terminated list) and stores it in dst[0..cap). */
static void opt_choice(struct spec_errs *e, json_t *obj, const char *parent,
                       const char *key, const char *const *one_of, char *dst,
                       size_t cap) {
  char path[SPEC_PATH_MAX], got[SPEC_QUOTE_MAX], expect[128];
  json_t *v = json_object_get(obj, key);
  size_t i, used = 0;
  int w;

  if (!v)
    return;
  path_key(path, sizeof path, parent, key);
  if (json_is_string(v)) {
    for (i = 0; one_of[i]; i++) {
      if (strcmp(json_string_value(v), one_of[i]) == 0 &&
          strlen(one_of[i]) < cap) {
        memcpy(dst, one_of[i], strlen(one_of[i]) + 1);
        return;
      }
    }
  }
  expect[0] = '\0';
  for (i = 0; one_of[i]; i++) {
    w = snprintf(expect + used, sizeof expect - used, "%s\"%s\"",
                 i == 0          ? ""
                 : one_of[i + 1] ? ", "
                                 : " or ",
                 one_of[i]);
    if (w < 0 || (size_t)w >= sizeof expect - used)
      break;
    used += (size_t)w;
  }
  report(e, path, "expected %s, got %s", expect, describe(got, sizeof got, v));
}

/* Stores the optional number member obj.key in *dst when it lies in
 * (lo, hi) with lo included when lo_in; `expect` says so in words. */
static void opt_number(struct spec_errs *e, json_t *obj, const char *parent,
                       const char *key, double lo, int lo_in, double hi,
                       const char *expect, double *dst) {
  char path[SPEC_PATH_MAX], got[SPEC_QUOTE_MAX];
  json_t *v = json_object_get(obj, key);
  double x;

  if (!v)
    return;
  path_key(path, sizeof path, parent, key);
  if (!json_is_number(v)) {
    report(e, path, "expected %s, got %s", expect,
           describe(got, sizeof got, v));
    return;
  }
  x = json_number_value(v);
  if (!isfinite(x) || x < lo || (x == lo && !lo_in) || x >= hi) {
    report(e, path, "expected %s, got %s", expect,
           describe(got, sizeof got, v));
    return;
  }
  *dst = x;
}

/* Returns the member obj.key when it is an object; reports and returns NULL
 * when it is present but something else. */
static json_t *opt_object(struct spec_errs *e, json_t *obj, const char *parent,
                          const char *key, const char *expect) {
  char path[SPEC_PATH_MAX], got[SPEC_QUOTE_MAX];
  json_t *v = json_object_get(obj, key);

  if (!v || json_is_object(v))
    return v;
  path_key(path, sizeof path, parent, key);
  report(e, path, "expected %s, got %s", expect, describe(got, sizeof got, v));
  return NULL;
}

/* Whether s (without a zone) is an IPv6 literal; fills bin when it is. */
static int parse_ipv6(const char *s, unsigned char bin[16]) {
  char tmp[INET6_ADDRSTRLEN + 1];
  size_t n = strcspn(s, "%"); /* drop a zone such as %eth0 */

  if (n >= sizeof tmp)
    return 0;
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  return inet_pton(AF_INET6, tmp, bin) == 1;
}

/* Whether host is a plausible DNS name: dot-separated labels of letters,
 * digits, '-' and '_' (1..63 each), with an optional trailing dot. */
static int valid_hostname(const char *host) {
  size_t label = 0;
  const char *p;

  for (p = host; *p; p++) {
    if (*p == '.') {
      if (label == 0)
        return 0;
      label = 0;
    } else if (isalnum((unsigned char)*p) || *p == '-' || *p == '_') {
      if (++label > 63)
        return 0;
    } else {
      return 0;
    }
  }
  return p != host;
}

/* Parses one "host:port" entry of cluster.ps or cluster.worker into *out.
 * Returns 1 when valid; reports and returns 0 otherwise (out->port stays 0). */
static int parse_addr(struct spec_errs *e, const json_t *v, const char *path,
                      struct cm_addr *out) {
  char q[SPEC_QUOTE_MAX], qh[SPEC_QUOTE_MAX], got[SPEC_QUOTE_MAX];
  unsigned char bin[16];
  const char *s, *host, *close, *colon, *port, *p;
  size_t len, hostlen;
  long val;

  if (!json_is_string(v)) {
    report(e, path, "expected a \"host:port\" string, got %s",
           describe(got, sizeof got, v));
    return 0;
  }
  s = json_string_value(v);
  len = json_string_length(v);
  quote(q, sizeof q, s);
  if (len == 0) {
    report(e, path, "empty; expected \"host:port\"");
    return 0;
  }
  if (len >= sizeof out->text) {
    report(e, path, "%s is %zu characters long; expected at most %zu", q, len,
           sizeof out->text - 1);
    return 0;
  }

  if (s[0] == '[') {
    close = strchr(s, ']');
    if (!close) {
      report(e, path, "%s has no closing ']'; expected \"[IPv6]:port\"", q);
      return 0;
    }
    host = s + 1;
    hostlen = (size_t)(close - host);
    if (close[1] == '\0') {
      report(e, path, "%s has no port; expected \"[IPv6]:port\"", q);
      return 0;
    }
    if (close[1] != ':') {
      report(e, path, "%s: expected ':' after ']'; expected \"[IPv6]:port\"",
             q);
      return 0;
    }
    port = close + 2;
  } else {
    colon = strrchr(s, ':');
    if (!colon) {
      report(e, path, "%s has no port; expected \"host:port\"", q);
      return 0;
    }
    if (strchr(s, ':') != colon) {
      report(e, path,
             "%s: an IPv6 address needs brackets; expected \"[host]:port\", "
             "e.g. \"[::1]:7000\"",
             q);
      return 0;
    }
    host = s;
    hostlen = (size_t)(colon - s);
    port = colon + 1;
  }

  if (hostlen == 0) {
    report(e, path, "%s has no host; expected \"host:port\"", q);
    return 0;
  }
  if (hostlen >= sizeof out->host) {
    report(e, path, "%s: host is %zu characters long; expected at most %zu", q,
           hostlen, sizeof out->host - 1);
    return 0;
  }
  memcpy(out->host, host, hostlen);
  out->host[hostlen] = '\0';
  quote(qh, sizeof qh, out->host);

  if (s[0] == '[') {
    if (!parse_ipv6(out->host, bin)) {
      report(e, path,
             "%s: %s is not an IPv6 address; expected \"[IPv6]:port\" or "
             "\"host:port\"",
             q, qh);
      return 0;
    }
  } else if (strspn(out->host, "0123456789.") == hostlen) {
    if (inet_pton(AF_INET, out->host, bin) != 1) {
      report(e, path, "%s: %s is not an IPv4 address; expected a.b.c.d", q, qh);
      return 0;
    }
  } else if (!valid_hostname(out->host)) {
    report(e, path,
           "%s: %s is not a valid host name; expected letters, digits, '-', "
           "'_' and '.'",
           q, qh);
    return 0;
  }

  if (*port == '\0') {
    report(e, path, "%s has no port; expected \"host:port\"", q);
    return 0;
  }
  for (p = port; *p; p++) {
    if (!isdigit((unsigned char)*p)) {
      quote(got, sizeof got, port);
      report(e, path, "%s: port %s is not a number; expected 1..65535", q, got);
      return 0;
    }
  }
  val = strlen(port) > 5 ? 0 : strtol(port, NULL, 10);
  if (val < 1 || val > 65535) {
    report(e, path, "port %.20s%s out of range; expected 1..65535", port,
           strlen(port) > 20 ? "..." : "");
    return 0;
  }
  out->port = (int)val;
  memcpy(out->text, s, len + 1);
  return 1;
}

/* Parses cluster.<key> (an array of addresses) into a new array *out of *n
 * entries. *n is the array's length even when entries are wrong, so that
 * task.index can still be checked; wrong entries keep port 0. Returns 0 or
 * CM_ENOMEM; mistakes go to e. */
static int parse_addrs(struct spec_errs *e, json_t *cluster, const char *key,
                       struct cm_addr **out, int *n) {
  char path[SPEC_PATH_MAX], epath[SPEC_PATH_MAX + 32], got[SPEC_QUOTE_MAX];
  json_t *arr = json_object_get(cluster, key);
  json_t *v;
  size_t i, len;

  *out = NULL;
  *n = 0;
  path_key(path, sizeof path, "cluster", key);
  if (!arr) {
    report(e, path, "missing; expected an array of \"host:port\" strings");
    return 0;
  }
  if (!json_is_array(arr)) {
    report(e, path, "expected an array of \"host:port\" strings, got %s",
           describe(got, sizeof got, arr));
    return 0;
  }
  len = json_array_size(arr);
  if (len == 0) {
    report(e, path, "empty; expected at least one \"host:port\" string");
    return 0;
  }
  if (len > INT_MAX) {
    report(e, path, "%zu entries; expected at most %d", len, INT_MAX);
    return 0;
  }
  *out = calloc(len, sizeof **out);
  if (!*out)
    return CM_ENOMEM;
  *n = (int)len;
  json_array_foreach(arr, i, v) {
    path_index(epath, sizeof epath, path, i);
    parse_addr(e, v, epath, &(*out)[i]);
  }
  return 0;
}

/* Whether a and b name the same endpoint as written: same port and the same
 * host, compared case-insensitively or, for IP literals, as addresses. */
static int addr_same(const struct cm_addr *a, const struct cm_addr *b) {
  unsigned char ba[16], bb[16];

  if (a->port != b->port)
    return 0;
  if (strcasecmp(a->host, b->host) == 0)
    return 1;
  if (inet_pton(AF_INET, a->host, ba) == 1 &&
      inet_pton(AF_INET, b->host, bb) == 1)
    return memcmp(ba, bb, 4) == 0;
  if (parse_ipv6(a->host, ba) && parse_ipv6(b->host, bb))
    return memcmp(ba, bb, 16) == 0;
  return 0;
}

/* Reports every address that repeats an earlier one in cluster.ps followed
 * by cluster.worker. */
static void check_duplicates(struct spec_errs *e, const struct cm_spec *spec) {
  char path[SPEC_PATH_MAX], q[SPEC_QUOTE_MAX];
  int total = spec->nps + spec->nworker;
  int i, j;
  const struct cm_addr *a, *b;

  for (j = 0; j < total; j++) {
    b = j < spec->nps ? &spec->ps[j] : &spec->worker[j - spec->nps];
    if (b->port == 0)
      continue;
    for (i = 0; i < j; i++) {
      a = i < spec->nps ? &spec->ps[i] : &spec->worker[i - spec->nps];
      if (a->port != 0 && addr_same(a, b))
        break;
    }
    if (i == j)
      continue;
    snprintf(path, sizeof path, "cluster.%s[%d]",
             j < spec->nps ? "ps" : "worker",
             j < spec->nps ? j : j - spec->nps);
    report(e, path,
           "%s is also cluster.%s[%d]; expected every task to have its own "
           "address",
           quote(q, sizeof q, b->text), i < spec->nps ? "ps" : "worker",
           i < spec->nps ? i : i - spec->nps);
  }
}

static int parse_cluster(struct spec_errs *e, json_t *root,
                         struct cm_spec *spec) {
  static const char *const keys[] = {"ps", "worker"};
  char got[SPEC_QUOTE_MAX];
  json_t *cluster = json_object_get(root, "cluster");
  int rc;

  if (!cluster) {
    report(e, "cluster",
           "missing; expected an object with \"ps\" and \"worker\" arrays of "
           "\"host:port\" strings");
    return 0;
  }
  if (!json_is_object(cluster)) {
    report(e, "cluster",
           "expected an object with \"ps\" and \"worker\" arrays, got %s",
           describe(got, sizeof got, cluster));
    return 0;
  }
  check_keys(e, cluster, "cluster", keys, sizeof keys / sizeof keys[0]);
  rc = parse_addrs(e, cluster, "ps", &spec->ps, &spec->nps);
  if (rc < 0)
    return rc;
  rc = parse_addrs(e, cluster, "worker", &spec->worker, &spec->nworker);
  if (rc < 0)
    return rc;
  check_duplicates(e, spec);
  return 0;
}

/* Checks a "task" object {"type": "ps"|"worker", "index": N} and stores it in
 * *out. With strict, keys other than type and index are mistakes (the spec
 * file); TF_CONFIG is shared with other tools that add their own keys, so
 * there they are ignored. Returns 1 when valid. */
static int parse_task_obj(struct spec_errs *e, json_t *task, int strict,
                          struct cm_task *out) {
  static const char *const keys[] = {"type", "index"};
  char got[SPEC_QUOTE_MAX];
  json_t *type, *index;
  struct cm_task t = {CM_TASK_NONE, 0};
  long long x;
  int ok = 1;

  if (!json_is_object(task)) {
    report(e, "task",
           "expected an object like {\"type\": \"worker\", \"index\": 0}, got "
           "%s",
           describe(got, sizeof got, task));
    return 0;
  }
  if (strict) {
    int before = e->count;
    check_keys(e, task, "task", keys, sizeof keys / sizeof keys[0]);
    ok = e->count == before;
  }
  type = json_object_get(task, "type");
  if (!type) {
    report(e, "task.type", "missing; expected \"ps\" or \"worker\"");
    ok = 0;
  } else if (json_is_string(type) &&
             strcmp(json_string_value(type), "ps") == 0) {
    t.type = CM_TASK_PS;
  } else if (json_is_string(type) &&
             strcmp(json_string_value(type), "worker") == 0) {
    t.type = CM_TASK_WORKER;
  } else {
    report(e, "task.type", "expected \"ps\" or \"worker\", got %s",
           describe(got, sizeof got, type));
    ok = 0;
  }
  index = json_object_get(task, "index");
  if (!index) {
    report(e, "task.index", "missing; expected a non-negative integer");
    ok = 0;
  } else if (want_int(e, index, "task.index", 0, INT_MAX, &x)) {
    t.index = (int)x;
  } else {
    ok = 0;
  }
  if (ok)
    *out = t;
  return ok;
}

/* Entries in the cluster list that task t indexes. */
static int task_count(const struct cm_spec *spec, const struct cm_task *t) {
  return t->type == CM_TASK_PS ? spec->nps : spec->nworker;
}

/* Reports "<index> out of range; cluster.<type> has N entries" under path
 * when t's index is past the end of its list. Returns 1 when in range. */
static int check_task_index(struct spec_errs *e, const struct cm_spec *spec,
                            const struct cm_task *t, const char *path,
                            const char *what) {
  int n = task_count(spec, t);

  if (t->index < n)
    return 1;
  report(e, path, "%s%d out of range; cluster.%s has %d entr%s", what, t->index,
         cm_task_type_name(t->type), n, n == 1 ? "y" : "ies");
  return 0;
}

/* Parses job.optimizer.schedule, or an override's, into *s (which holds
 * the defaults); lr is the optimizer's, which min_lr may not exceed. Keys of
 * another schedule type are mistakes: they show that the author believes the
 * schedule is of that type. */
static void parse_schedule(struct spec_errs *e, json_t *opt, const char *parent,
                           double lr, struct cm_schedule *s) {
  static const char *const keys[] = {"type",  "warmup_steps", "decay_every",
                                     "gamma", "total_steps",  "min_lr"};
  static const char *const types[] = {"constant", "step", "cosine", NULL};
  static const struct {
    const char *key;         /* a type's own key */
    enum cm_sched_type type; /* that type */
  } owned[] = {{"decay_every", CM_SCHED_STEP},
               {"gamma", CM_SCHED_STEP},
               {"total_steps", CM_SCHED_COSINE},
               {"min_lr", CM_SCHED_COSINE}};
  char path[SPEC_PATH_MAX], kpath[SPEC_PATH_MAX + 32], type[16] = "constant";
  json_t *sch, *v;
  long long x;
  int before, type_known;

  sch = opt_object(e, opt, parent, "schedule",
                   "an object like {\"type\": \"cosine\", \"warmup_steps\": "
                   "100, \"total_steps\": 2000}");
  if (!sch)
    return;
  path_key(path, sizeof path, parent, "schedule");
  check_keys(e, sch, path, keys, sizeof keys / sizeof keys[0]);
  before = e->count;
  opt_choice(e, sch, path, "type", types, type, sizeof type);
  type_known = e->count == before;
  for (int i = 0; i < CM_SCHED_NTYPES; i++)
    if (strcmp(type, cm_sched_name((enum cm_sched_type)i)) == 0)
      s->type = (enum cm_sched_type)i;
  for (size_t i = 0; type_known && i < sizeof owned / sizeof owned[0]; i++)
    if (json_object_get(sch, owned[i].key) && s->type != owned[i].type) {
      path_key(kpath, sizeof kpath, path, owned[i].key);
      report(e, kpath, "only meaningful with \"type\": \"%s\"",
             cm_sched_name(owned[i].type));
    }
  if ((v = json_object_get(sch, "warmup_steps"))) {
    path_key(kpath, sizeof kpath, path, "warmup_steps");
    if (want_int(e, v, kpath, 0, LLONG_MAX, &x))
      s->warmup_steps = (uint64_t)x;
  }
  if ((v = json_object_get(sch, "decay_every"))) {
    path_key(kpath, sizeof kpath, path, "decay_every");
    if (want_int(e, v, kpath, 1, LLONG_MAX, &x))
      s->decay_every = (uint64_t)x;
  } else if (type_known && s->type == CM_SCHED_STEP) {
    report(e, path,
           "\"type\": \"step\" needs \"decay_every\" (steps between decays, "
           "e.g. 1000) and takes \"gamma\" (default 0.1)");
  }
  if ((v = json_object_get(sch, "gamma"))) {
    double g = 0;
    path_key(kpath, sizeof kpath, path, "gamma");
    before = e->count;
    opt_number(e, sch, path, "gamma", 0, 0, HUGE_VAL, "a number in (0, 1]", &g);
    if (e->count == before && g > 1)
      report(e, kpath, "expected a number in (0, 1], got %g", g);
    else if (e->count == before)
      s->gamma = g;
  }
  if ((v = json_object_get(sch, "total_steps"))) {
    path_key(kpath, sizeof kpath, path, "total_steps");
    if (want_int(e, v, kpath, 1, LLONG_MAX, &x)) {
      if ((uint64_t)x <= s->warmup_steps)
        report(e, kpath,
               "%lld is not more than warmup_steps (%llu); expected the step "
               "at which the decay ends, counted from the first",
               x, (unsigned long long)s->warmup_steps);
      else
        s->total_steps = (uint64_t)x;
    }
  } else if (type_known && s->type == CM_SCHED_COSINE) {
    report(e, path,
           "\"type\": \"cosine\" needs \"total_steps\" (the step at which lr "
           "reaches min_lr, warm-up included)");
  }
  if ((v = json_object_get(sch, "min_lr"))) {
    path_key(kpath, sizeof kpath, path, "min_lr");
    before = e->count;
    opt_number(e, sch, path, "min_lr", 0, 1, HUGE_VAL, "a number >= 0",
               &s->min_lr);
    if (e->count == before && s->min_lr > lr)
      report(e, kpath, "%g is more than the optimizer's lr (%g)", s->min_lr,
             lr);
  }
}

/* Parses one optimizer object at path `parent` (job.optimizer, or an entry
 * of job.optimizer_overrides) onto *o, which holds what it starts from: the
 * defaults, or the job's optimizer. An override's "schedule" replaces the
 * job's whole. clip_norm is NULL for an override (it is per job). */
static void parse_optim_obj(struct spec_errs *e, json_t *opt,
                            const char *parent, struct cm_optim *o,
                            double *clip_norm) {
  static const char *const keys[] = {"type",         "lr",       "momentum",
                                     "weight_decay", "beta1",    "beta2",
                                     "eps",          "schedule", "clip_norm"};
  static const char *const types[] = {"sgd",  "momentum", "nesterov", "adagrad",
                                      "adam", "adamw",    NULL};
  char type[16] = "", path[SPEC_PATH_MAX + 32];

  check_keys(e, opt, parent, keys, sizeof keys / sizeof keys[0]);
  if (!clip_norm && json_object_get(opt, "clip_norm")) {
    path_key(path, sizeof path, parent, "clip_norm");
    report(e, path,
           "clipping is per job, not per variable (the global norm is over "
           "every variable's gradient); set job.optimizer.clip_norm");
  }
  opt_choice(e, opt, parent, "type", types, type, sizeof type);
  if (type[0])
    cm_optim_parse(type, &o->type);
  /* The upper bound only keeps the value finite; any positive rate is taken. */
  opt_number(e, opt, parent, "lr", 0, 0, HUGE_VAL, "a positive number", &o->lr);
  /* Hyper-parameters of other types are accepted and unused, so that
   * switching type does not mean deleting lines. */
  opt_number(e, opt, parent, "momentum", 0, 1, 1, "a number in [0, 1)",
             &o->momentum);
  opt_number(e, opt, parent, "weight_decay", 0, 1, HUGE_VAL, "a number >= 0",
             &o->weight_decay);
  opt_number(e, opt, parent, "beta1", 0, 1, 1, "a number in [0, 1)", &o->beta1);
  opt_number(e, opt, parent, "beta2", 0, 1, 1, "a number in [0, 1)", &o->beta2);
  opt_number(e, opt, parent, "eps", 0, 0, HUGE_VAL, "a positive number",
             &o->eps);
  if (o->type == CM_OPT_NESTEROV && o->momentum == 0.0) {
    path_key(path, sizeof path, parent,
             json_object_get(opt, "momentum") ? "momentum" : "type");
    report(e, path,
           "nesterov needs a momentum above 0 (with 0 it is plain sgd)");
  }
  if (json_object_get(opt, "schedule")) {
    struct cm_optim d;
    cm_optim_defaults(&d);
    o->schedule = d.schedule;
    parse_schedule(e, opt, parent, o->lr, &o->schedule);
  } else if (o->schedule.type == CM_SCHED_COSINE &&
             o->schedule.min_lr > o->lr) {
    /* An override's lr under the cosine it keeps from the job. */
    path_key(path, sizeof path, parent, "lr");
    report(e, path,
           "%g is below the min_lr (%g) of the schedule it keeps from "
           "job.optimizer; give this entry a \"schedule\" of its own",
           o->lr, o->schedule.min_lr);
  }
  if (clip_norm)
    opt_number(e, opt, parent, "clip_norm", 0, 0, HUGE_VAL,
               "a positive number (the largest global L2 norm of a worker's "
               "gradient)",
               clip_norm);
}

/* Parses job.optimizer_overrides: {"<variable or glob>": {optimizer keys},
 * ...}, each entry starting from the job's optimizer. */
static void parse_overrides(struct spec_errs *e, json_t *job,
                            struct cm_job *out) {
  char path[SPEC_PATH_MAX];
  const char *key;
  json_t *ov, *v;

  ov = opt_object(e, job, "job", "optimizer_overrides",
                  "an object like {\"*/bias\": {\"weight_decay\": 0}} "
                  "(variable name or glob: optimizer keys)");
  if (!ov)
    return;
  json_object_foreach(ov, key, v) {
    struct cm_optim_rule *r = &out->optim.rules[out->optim.nrules];
    path_key(path, sizeof path, "job.optimizer_overrides", key);
    if (!key[0] || strlen(key) > CM_OPTIM_PATTERN_MAX) {
      report(e, path, "expected a variable name or glob of 1..%d characters",
             CM_OPTIM_PATTERN_MAX);
      continue;
    }
    if (!json_is_object(v)) {
      char got[SPEC_QUOTE_MAX];
      report(e, path,
             "expected an object of optimizer keys like {\"type\": \"sgd\", "
             "\"lr\": 0.1}, got %s",
             describe(got, sizeof got, v));
      continue;
    }
    if (out->optim.nrules == CM_OPTIM_MAX_RULES) {
      report(e, path, "more than %d overrides", CM_OPTIM_MAX_RULES);
      return;
    }
    snprintf(r->pattern, sizeof r->pattern, "%s", key);
    r->opt = out->optim.def;
    parse_optim_obj(e, v, path, &r->opt, NULL);
    out->optim.nrules++;
  }
}

static void parse_optimizer(struct spec_errs *e, json_t *job,
                            struct cm_job *out) {
  json_t *opt = opt_object(e, job, "job", "optimizer",
                           "an object like {\"type\": \"momentum\", \"lr\": "
                           "0.05, \"momentum\": 0.9}");

  if (opt)
    parse_optim_obj(e, opt, "job.optimizer", &out->optim.def, &out->clip_norm);
  parse_overrides(e, job, out);
}

static void parse_hidden(struct spec_errs *e, json_t *job, struct cm_job *out) {
  char path[SPEC_PATH_MAX], got[SPEC_QUOTE_MAX];
  int widths[CM_SPEC_MAX_LAYERS];
  json_t *arr = json_object_get(job, "hidden");
  json_t *v;
  size_t i, n;
  long long x;
  int ok = 1;

  if (!arr)
    return;
  if (!json_is_array(arr)) {
    report(e, "job.hidden",
           "expected an array of 1..%d positive integers (layer widths), got "
           "%s",
           CM_SPEC_MAX_LAYERS, describe(got, sizeof got, arr));
    return;
  }
  n = json_array_size(arr);
  if (n == 0) {
    report(e, "job.hidden", "empty; expected 1..%d positive integers",
           CM_SPEC_MAX_LAYERS);
    return;
  }
  if (n > CM_SPEC_MAX_LAYERS) {
    report(e, "job.hidden", "%zu entries; expected at most %d", n,
           CM_SPEC_MAX_LAYERS);
    return;
  }
  json_array_foreach(arr, i, v) {
    path_index(path, sizeof path, "job.hidden", i);
    if (want_int(e, v, path, 1, SPEC_LAYER_MAX, &x))
      widths[i] = (int)x;
    else
      ok = 0;
  }
  if (!ok)
    return;
  memcpy(out->hidden, widths, n * sizeof widths[0]);
  out->nhidden = (int)n;
}

/* job.channels: exactly two channel counts, the CNN's convolutions. */
static void parse_channels(struct spec_errs *e, json_t *job,
                           struct cm_job *out) {
  char path[SPEC_PATH_MAX], got[SPEC_QUOTE_MAX];
  json_t *arr = json_object_get(job, "channels");
  int ch[2];
  json_t *v;
  size_t i;
  long long x;
  int ok = 1;

  if (!arr)
    return;
  if (!json_is_array(arr) || json_array_size(arr) != 2) {
    report(e, "job.channels",
           "expected an array of 2 integers in 1..%d (the channels of the two "
           "convolutions), got %s",
           SPEC_CHANNELS_MAX, describe(got, sizeof got, arr));
    return;
  }
  json_array_foreach(arr, i, v) {
    path_index(path, sizeof path, "job.channels", i);
    if (want_int(e, v, path, 1, SPEC_CHANNELS_MAX, &x))
      ch[i] = (int)x;
    else
      ok = 0;
  }
  if (ok)
    memcpy(out->channels, ch, sizeof ch);
}

/* job.name is also the job id sent on every call and used in file names, so
 * it is kept to characters that are safe everywhere. */
static void parse_name(struct spec_errs *e, json_t *job, struct cm_job *out) {
  char name[sizeof out->name], q[SPEC_QUOTE_MAX];
  size_t bad;

  if (!opt_string(e, job, "job", "name", name, sizeof name))
    return;
  bad = strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "0123456789._-");
  if (name[bad] != '\0') {
    report(e, "job.name",
           "%s has a character other than letters, digits, '.', '_' and '-'",
           quote(q, sizeof q, name));
    return;
  }
  memcpy(out->name, name, sizeof name);
}

static void job_defaults(struct cm_job *job) {
  memset(job, 0, sizeof *job);
  snprintf(job->name, sizeof job->name, "psd-job");
  snprintf(job->model, sizeof job->model, "mlp");
  job->hidden[0] = 256;
  job->hidden[1] = 128;
  job->nhidden = 2;
  job->channels[0] = 16;
  job->channels[1] = 32;
  snprintf(job->data_dir, sizeof job->data_dir,
           "/usr/share/datasets/fashion-mnist");
  job->epochs = 3;
  job->batch_size = 64;
  cm_optim_defaults(&job->optim.def);
  snprintf(job->mode, sizeof job->mode, "async");
  job->staleness = -1;
  /* replicas_to_aggregate and min_replicas default from the cluster size;
   * parse_sync fills them. */
  job->deadline_multiple = 3.0;
  job->deadline_floor_ms = 1000;
  job->deterministic = 0;
  job->heartbeat_ms = 500;
  job->dead_after_ms = 5000;
  job->seed = 1;
  job->log_every = 100;
  job->timeout_ms = 30000;
  job->max_steps = 0;
  job->unix_sockets = 1;
  job->ckpt_keep = 3;
  job->max_message_mb = 64;
  snprintf(job->nonfinite, sizeof job->nonfinite, "reject");
  job->retry_s = 120;
}

/* Returns the member job.sync.key when present and meant for the job's mode;
 * one meant for the other mode is reported and NULL returned, since it shows
 * that the author believes the job runs in that mode. With the mode itself
 * mistaken (mode_known 0) every member is returned and checked on its own. */
static json_t *mode_member(struct spec_errs *e, json_t *sync, const char *key,
                           int mode_known, int is_sync, int for_sync) {
  char path[SPEC_PATH_MAX];
  json_t *v = json_object_get(sync, key);

  if (!v || !mode_known || is_sync == for_sync)
    return v;
  path_key(path, sizeof path, "job.sync", key);
  report(e, path, "only meaningful with \"mode\": \"%s\"",
         for_sync ? "sync" : "async");
  return NULL;
}

/* Parses job.sync: the mode and the settings of that mode. nworker is the
 * size of cluster.worker, 0 when that is missing (the spec is refused anyway
 * and k is then not checked against it); k and m already hold their defaults
 * (nworker). */
static void parse_sync(struct spec_errs *e, json_t *job, int nworker,
                       struct cm_job *out) {
  static const char *const keys[] = {
      "mode",         "staleness", "replicas_to_aggregate",
      "min_replicas", "deadline",  "deterministic"};
  static const char *const deadline_keys[] = {"multiple", "floor_ms"};
  static const char *const modes[] = {"async", "sync", NULL};
  char got[SPEC_QUOTE_MAX];
  json_t *sync, *v;
  long long x;
  int before, mode_known, is_sync, k_given = 0, k_known = nworker > 0;

  sync = opt_object(e, job, "job", "sync",
                    "an object like {\"mode\": \"sync\", "
                    "\"replicas_to_aggregate\": 2}");
  if (!sync)
    return;
  check_keys(e, sync, "job.sync", keys, sizeof keys / sizeof keys[0]);
  before = e->count;
  opt_choice(e, sync, "job.sync", "mode", modes, out->mode, sizeof out->mode);
  mode_known = e->count == before;
  is_sync = strcmp(out->mode, "sync") == 0;

  v = mode_member(e, sync, "staleness", mode_known, is_sync, 0);
  if (v && want_int(e, v, "job.sync.staleness", 0, INT_MAX, &x))
    out->staleness = (int)x;

  v = mode_member(e, sync, "replicas_to_aggregate", mode_known, is_sync, 1);
  if (v) {
    if (!want_int(e, v, "job.sync.replicas_to_aggregate", 1, INT_MAX, &x)) {
      k_known = 0;
    } else if (k_known && x > nworker) {
      report(e, "job.sync.replicas_to_aggregate",
             "%lld is more than the %d worker%s in cluster.worker", x, nworker,
             nworker == 1 ? "" : "s");
      k_known = 0;
    } else {
      out->replicas_to_aggregate = (int)x;
      k_given = k_known = 1;
    }
  }
  out->min_replicas = out->replicas_to_aggregate;

  v = mode_member(e, sync, "min_replicas", mode_known, is_sync, 1);
  /* Against a k that is wrong or unknown there is nothing to compare. */
  if (v && want_int(e, v, "job.sync.min_replicas", 1, INT_MAX, &x) && k_known) {
    if (x > out->replicas_to_aggregate)
      report(e, "job.sync.min_replicas",
             "%lld is more than replicas_to_aggregate (%d%s)", x,
             out->replicas_to_aggregate,
             k_given ? "" : ", by default the number of workers");
    else
      out->min_replicas = (int)x;
  }

  if (mode_member(e, sync, "deadline", mode_known, is_sync, 1)) {
    v = opt_object(e, sync, "job.sync", "deadline",
                   "an object like {\"multiple\": 3.0, \"floor_ms\": 1000}");
    if (v) {
      check_keys(e, v, "job.sync.deadline", deadline_keys,
                 sizeof deadline_keys / sizeof deadline_keys[0]);
      opt_number(e, v, "job.sync.deadline", "multiple", 0, 0, HUGE_VAL,
                 "a positive number", &out->deadline_multiple);
      opt_int(e, v, "job.sync.deadline", "floor_ms", 1, INT_MAX,
              &out->deadline_floor_ms);
    }
  }

  v = mode_member(e, sync, "deterministic", mode_known, is_sync, 1);
  if (v) {
    if (json_is_boolean(v))
      out->deterministic = json_is_true(v);
    else
      report(e, "job.sync.deterministic", "expected true or false, got %s",
             describe(got, sizeof got, v));
  }
}

/* Parses job.heartbeat_ms and job.dead_after_ms. A worker must be able to
 * miss a heartbeat before it is declared dead, so the second must exceed the
 * first; the mistake is reported at whichever of the two the spec sets. */
static void parse_liveness(struct spec_errs *e, json_t *job,
                           struct cm_job *out) {
  int before = e->count;
  long long hint;

  opt_int(e, job, "job", "heartbeat_ms", 1, INT_MAX, &out->heartbeat_ms);
  opt_int(e, job, "job", "dead_after_ms", 1, INT_MAX, &out->dead_after_ms);
  if (e->count != before || out->dead_after_ms > out->heartbeat_ms)
    return;
  hint = 10LL * out->heartbeat_ms;
  if (hint > INT_MAX)
    hint = INT_MAX;
  if (json_object_get(job, "dead_after_ms"))
    report(e, "job.dead_after_ms",
           "%d is not more than job.heartbeat_ms (%d%s); expected a longer "
           "silence, e.g. %lld (10 heartbeats)",
           out->dead_after_ms, out->heartbeat_ms,
           json_object_get(job, "heartbeat_ms") ? "" : ", the default", hint);
  else
    report(e, "job.heartbeat_ms",
           "%d is not less than job.dead_after_ms (%d, the default); expected "
           "less, or set job.dead_after_ms, e.g. to %lld (10 heartbeats)",
           out->heartbeat_ms, out->dead_after_ms, hint);
}

/* Parses job.checkpoint: where and how often the shards checkpoint. */
static void parse_checkpoint(struct spec_errs *e, json_t *job,
                             struct cm_job *out) {
  static const char *const keys[] = {"dir", "every_steps", "every_s", "keep"};
  json_t *ck = opt_object(e, job, "job", "checkpoint",
                          "an object like {\"dir\": \"ckpt\", "
                          "\"every_steps\": 1000, \"keep\": 3}");

  if (!ck)
    return;
  check_keys(e, ck, "job.checkpoint", keys, sizeof keys / sizeof keys[0]);
  opt_string(e, ck, "job.checkpoint", "dir", out->ckpt_dir,
             sizeof out->ckpt_dir);
  opt_int(e, ck, "job.checkpoint", "every_steps", 0, INT_MAX,
          &out->ckpt_every_steps);
  opt_number(e, ck, "job.checkpoint", "every_s", 0, 1, 1e9,
             "a number of seconds >= 0 (0: never)", &out->ckpt_every_s);
  opt_int(e, ck, "job.checkpoint", "keep", 1, INT_MAX, &out->ckpt_keep);
}

/* Parses job.max_message_mb. Below the floor a 2 MiB chunk no longer fits,
 * which would fail every large pull and push, so it is said in those words.
 * gRPC's limit is an int of bytes, hence the ceiling. */
static void parse_max_message(struct spec_errs *e, json_t *job,
                              struct cm_job *out) {
  json_t *v = json_object_get(job, "max_message_mb");
  long long x;

  if (!v || !want_int(e, v, "job.max_message_mb", 1, 2047, &x))
    return;
  if (x < CM_SPEC_MIN_MESSAGE_MB) {
    report(e, "job.max_message_mb",
           "%lld MiB is too small; expected at least %d (a 2 MiB chunk of "
           "tensor data plus its message head and headroom)",
           x, CM_SPEC_MIN_MESSAGE_MB);
    return;
  }
  out->max_message_mb = (int)x;
}

/* Parses "job" into *out, which holds the defaults; nworker is the size of
 * cluster.worker, which bounds job.sync.replicas_to_aggregate. */
static void parse_job(struct spec_errs *e, json_t *root, int nworker,
                      struct cm_job *out) {
  static const char *const keys[] = {"name",
                                     "model",
                                     "hidden",
                                     "data_dir",
                                     "epochs",
                                     "batch_size",
                                     "optimizer",
                                     "sync",
                                     "seed",
                                     "log_every",
                                     "rpc_timeout_ms",
                                     "max_steps",
                                     "heartbeat_ms",
                                     "dead_after_ms",
                                     "unix_sockets",
                                     "checkpoint",
                                     "optimizer_overrides",
                                     "channels",
                                     "max_message_mb",
                                     "nonfinite",
                                     "retry_s"};
  static const char *const models[] = {"softmax", "mlp", "cnn", NULL};
  static const char *const nonfinite[] = {"reject", "skip", "apply", NULL};
  json_t *job, *seed;
  long long x;

  out->replicas_to_aggregate = nworker;
  out->min_replicas = nworker;
  job = opt_object(e, root, "", "job", "an object of training settings");
  if (!job)
    return;
  check_keys(e, job, "job", keys, sizeof keys / sizeof keys[0]);
  parse_name(e, job, out);
  opt_choice(e, job, "job", "model", models, out->model, sizeof out->model);
  parse_hidden(e, job, out);
  opt_string(e, job, "job", "data_dir", out->data_dir, sizeof out->data_dir);
  opt_int(e, job, "job", "epochs", 1, INT_MAX, &out->epochs);
  opt_int(e, job, "job", "batch_size", 1, INT_MAX, &out->batch_size);
  parse_optimizer(e, job, out);
  parse_sync(e, job, nworker, out);
  seed = json_object_get(job, "seed");
  if (seed && want_int(e, seed, "job.seed", 0, LLONG_MAX, &x))
    out->seed = (uint64_t)x;
  opt_int(e, job, "job", "log_every", 1, INT_MAX, &out->log_every);
  opt_int(e, job, "job", "rpc_timeout_ms", 1, INT_MAX, &out->timeout_ms);
  opt_int(e, job, "job", "max_steps", 0, INT_MAX, &out->max_steps);
  parse_liveness(e, job, out);
  parse_checkpoint(e, job, out);
  opt_bool(e, job, "job", "unix_sockets", &out->unix_sockets);
  parse_channels(e, job, out);
  /* Settings of one model given with another are a mistake, not noise. */
  if (json_object_get(job, "hidden") && strcmp(out->model, "mlp") != 0)
    report(e, "job.hidden", "only for job.model \"mlp\" (this job's is \"%s\")",
           out->model);
  if (json_object_get(job, "channels") && strcmp(out->model, "cnn") != 0)
    report(e, "job.channels",
           "only for job.model \"cnn\" (this job's is \"%s\")", out->model);
  parse_max_message(e, job, out);
  opt_choice(e, job, "job", "nonfinite", nonfinite, out->nonfinite,
             sizeof out->nonfinite);
  opt_number(e, job, "job", "retry_s", 0, 1, 1e9,
             "a number of seconds >= 0 (0: never retry)", &out->retry_s);
}

/* Parses "auth": a token file and/or TLS material. Inline secrets are
 * refused: a spec is copied around and printed, a token file is not. */
static void parse_auth(struct spec_errs *e, json_t *root, struct cm_auth *out) {
  static const char *const keys[] = {"token_file", "tls"};
  static const char *const tls_keys[] = {
      "ca",          "cert",       "key",        "mutual",
      "client_cert", "client_key", "server_name"};
  json_t *auth, *tls;

  auth = opt_object(e, root, "", "auth",
                    "an object like {\"token_file\": \"token\"}");
  if (!auth)
    return;
  if (json_object_get(auth, "token"))
    report(e, "auth.token",
           "a token is never written in the spec; put it in a file (mode "
           "600) and name that file in auth.token_file");
  else
    check_keys(e, auth, "auth", keys, sizeof keys / sizeof keys[0]);
  opt_string(e, auth, "auth", "token_file", out->token_file,
             sizeof out->token_file);
  tls = opt_object(e, auth, "auth", "tls",
                   "an object like {\"ca\": \"ca.pem\", \"cert\": "
                   "\"server.pem\", \"key\": \"server.key\"}");
  if (!tls)
    return;
  out->tls = 1;
  check_keys(e, tls, "auth.tls", tls_keys,
             sizeof tls_keys / sizeof tls_keys[0]);
  opt_string(e, tls, "auth.tls", "ca", out->ca, sizeof out->ca);
  opt_string(e, tls, "auth.tls", "cert", out->cert, sizeof out->cert);
  opt_string(e, tls, "auth.tls", "key", out->key, sizeof out->key);
  opt_bool(e, tls, "auth.tls", "mutual", &out->mutual);
  opt_string(e, tls, "auth.tls", "client_cert", out->client_cert,
             sizeof out->client_cert);
  opt_string(e, tls, "auth.tls", "client_key", out->client_key,
             sizeof out->client_key);
  opt_string(e, tls, "auth.tls", "server_name", out->server_name,
             sizeof out->server_name);
  if (!json_object_get(tls, "ca"))
    report(e, "auth.tls.ca",
           "missing; expected the CA certificate(s) that signed the shards' "
           "certificate, which clients check it against");
  if (!json_object_get(tls, "cert") || !json_object_get(tls, "key"))
    report(e, json_object_get(tls, "cert") ? "auth.tls.key" : "auth.tls.cert",
           "missing; the shards need a certificate and its key");
  if (out->mutual && (!json_object_get(tls, "client_cert") ||
                      !json_object_get(tls, "client_key")))
    report(e,
           json_object_get(tls, "client_cert") ? "auth.tls.client_key"
                                               : "auth.tls.client_cert",
           "missing; with \"mutual\": true every client presents a "
           "certificate and its key");
}

/* Parses JSON text with duplicate keys refused; on a syntax error reports
 * "source:line:column: JSON syntax error: ..." and returns NULL with *rc set
 * (CM_ENOMEM when jansson ran out of memory, else CM_ESPEC). */
static json_t *load_json(struct spec_errs *e, const char *text, size_t len,
                         int *rc) {
  json_error_t jerr;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  const char *source = e->source;

  if (root)
    return root;
  *rc = CM_ESPEC;
#if JANSSON_VERSION_HEX >= 0x020b00
  if (json_error_code(&jerr) == json_error_out_of_memory)
    *rc = CM_ENOMEM;
#endif
  e->source = NULL; /* the line:column goes right after the name */
  if (jerr.line > 0)
    report(e, NULL, "%s:%d:%d: JSON syntax error: %s", source, jerr.line,
           jerr.column, jerr.text);
  else
    report(e, NULL, "%s: JSON syntax error: %s", source, jerr.text);
  e->source = source;
  return NULL;
}

int cm_spec_parse(const char *json, size_t len, const char *source,
                  struct cm_spec **out, char *err, size_t errlen) {
  static const char *const keys[] = {"cluster", "task", "job", "auth"};
  char got[SPEC_QUOTE_MAX];
  struct spec_errs e;
  struct cm_spec *spec = NULL;
  json_t *root = NULL, *task;
  int rc = 0;

  if (!source)
    source = "<spec>";
  errs_init(&e, source, err, errlen);
  if (out)
    *out = NULL;
  if (!json || !out) {
    report(&e, NULL, "no spec text given");
    rc = CM_EINVAL;
    goto out;
  }
  spec = calloc(1, sizeof *spec);
  if (!spec) {
    rc = CM_ENOMEM;
    goto out;
  }
  snprintf(spec->source, sizeof spec->source, "%s", source);
  job_defaults(&spec->job);

  root = load_json(&e, json, len, &rc);
  if (!root)
    goto out;
  if (!json_is_object(root)) {
    report(&e, NULL,
           "expected a JSON object with \"cluster\" at the top level, got %s",
           describe(got, sizeof got, root));
    rc = CM_ESPEC;
    goto out;
  }
  check_keys(&e, root, "", keys, sizeof keys / sizeof keys[0]);
  rc = parse_cluster(&e, root, spec);
  if (rc < 0)
    goto out;
  task = json_object_get(root, "task");
  if (task && parse_task_obj(&e, task, 1, &spec->task) &&
      task_count(spec, &spec->task) > 0)
    check_task_index(&e, spec, &spec->task, "task.index", "");
  parse_job(&e, root, spec->nworker, &spec->job);
  parse_auth(&e, root, &spec->auth);
  if (e.count > 0) {
    rc = CM_ESPEC;
    goto out;
  }
  *out = spec;
  spec = NULL;
out:
  errs_finish(&e);
  json_decref(root);
  cm_spec_free(spec);
  return rc;
}

/* Makes the path in dst[0..cap) (the spec key `key`) relative to the
 * directory `base` when it is relative, so that every program finds the
 * same file whatever its working directory. */
static void resolve_path(struct spec_errs *e, const char *base, const char *key,
                         char *dst, size_t cap) {
  char joined[PATH_MAX + 1100], q[SPEC_QUOTE_MAX];
  int n;

  if (!dst[0] || dst[0] == '/')
    return;
  n = snprintf(joined, sizeof joined, "%s/%s", base, dst);
  if (n < 0 || (size_t)n >= cap) {
    report(e, key,
           "%s relative to the spec's directory is %d characters long; "
           "expected at most %zu",
           quote(q, sizeof q, dst), n, cap - 1);
    return;
  }
  memcpy(dst, joined, (size_t)n + 1);
}

/* Resolves every path the spec names against the spec file's directory
 * (absolute when that directory exists). Returns 0 or CM_ESPEC. */
static int resolve_paths(struct cm_spec *spec, const char *path, char *err,
                         size_t errlen) {
  struct cm_auth *a = &spec->auth;
  struct {
    const char *key; /* spec key, for messages */
    char *dst;       /* the path, rewritten in place */
    size_t cap;      /* its buffer */
  } paths[] = {
      {"job.checkpoint.dir", spec->job.ckpt_dir, sizeof spec->job.ckpt_dir},
      {"auth.token_file", a->token_file, sizeof a->token_file},
      {"auth.tls.ca", a->ca, sizeof a->ca},
      {"auth.tls.cert", a->cert, sizeof a->cert},
      {"auth.tls.key", a->key, sizeof a->key},
      {"auth.tls.client_cert", a->client_cert, sizeof a->client_cert},
      {"auth.tls.client_key", a->client_key, sizeof a->client_key},
  };
  char base[PATH_MAX], *abs;
  const char *slash = strrchr(path, '/');
  struct spec_errs e;

  if (!slash)
    snprintf(base, sizeof base, ".");
  else
    snprintf(base, sizeof base, "%.*s", slash == path ? 1 : (int)(slash - path),
             path);
  if ((abs = realpath(base, NULL))) {
    snprintf(base, sizeof base, "%s", abs);
    free(abs);
  }
  errs_init(&e, path, err, errlen);
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
    resolve_path(&e, base, paths[i].key, paths[i].dst, paths[i].cap);
  errs_finish(&e);
  return e.count ? CM_ESPEC : 0;
}

int cm_spec_load(const char *path, struct cm_spec **out, char *err,
                 size_t errlen) {
  struct spec_errs e;
  FILE *f = NULL;
  char *text = NULL, *grown;
  size_t len = 0, cap = 0, got;
  int rc = 0;

  errs_init(&e, path, err, errlen);
  if (out)
    *out = NULL;
  if (!path || !out) {
    e.source = NULL;
    report(&e, NULL, "no spec path given");
    rc = CM_EINVAL;
    goto out;
  }
  f = fopen(path, "rb");
  if (!f) {
    rc = errno == ENOENT ? CM_ENOENT : CM_EIO;
    report(&e, NULL, "%s", strerror(errno));
    goto out;
  }
  for (;;) {
    if (len == cap) {
      if (cap >= SPEC_FILE_MAX) {
        report(&e, NULL, "larger than %u MiB; a cluster spec is much smaller",
               SPEC_FILE_MAX >> 20);
        rc = CM_ESPEC;
        goto out;
      }
      cap = cap ? cap * 2 : 4096;
      grown = realloc(text, cap);
      if (!grown) {
        rc = CM_ENOMEM;
        goto out;
      }
      text = grown;
    }
    got = fread(text + len, 1, cap - len, f);
    len += got;
    if (got == 0) {
      if (ferror(f)) {
        report(&e, NULL, "%s", strerror(errno)); /* e.g. Is a directory */
        rc = CM_EIO;
        goto out;
      }
      break;
    }
  }
  rc = cm_spec_parse(text, len, path, out, err, errlen);
  /* cm_spec_parse wrote err itself; keep errs_finish from touching it. */
  e.buf = NULL;
  if (rc == 0 && (rc = resolve_paths(*out, path, err, errlen)) < 0) {
    cm_spec_free(*out);
    *out = NULL;
  }
out:
  errs_finish(&e);
  if (f)
    fclose(f);
  free(text);
  return rc;
}

void cm_spec_free(struct cm_spec *spec) {
  if (!spec)
    return;
  free(spec->ps);
  free(spec->worker);
  free(spec);
}

int cm_task_parse(const char *text, struct cm_task *out, char *err,
                  size_t errlen) {
  char q[SPEC_QUOTE_MAX], qi[SPEC_QUOTE_MAX], prefix[SPEC_QUOTE_MAX + 16];
  struct spec_errs e;
  struct cm_task t = {CM_TASK_NONE, 0};
  const char *colon, *p;
  long long x = 0;
  size_t tlen;
  int rc = 0;

  errs_init(&e, NULL, err, errlen);
  if (!text || !out) {
    report(&e, NULL, "--task: missing; expected TYPE:INDEX, e.g. worker:0");
    rc = CM_EINVAL;
    goto out;
  }
  snprintf(prefix, sizeof prefix, "--task %s", quote(q, sizeof q, text));
  e.source = prefix;
  colon = strchr(text, ':');
  if (!colon) {
    report(&e, NULL, "expected TYPE:INDEX, e.g. worker:0");
    rc = CM_EINVAL;
    goto out;
  }
  tlen = (size_t)(colon - text);
  if (tlen == 2 && strncmp(text, "ps", 2) == 0) {
    t.type = CM_TASK_PS;
  } else if (tlen == 6 && strncmp(text, "worker", 6) == 0) {
    t.type = CM_TASK_WORKER;
  } else {
    char type[SPEC_QUOTE_MAX];
    snprintf(type, sizeof type, "%.*s", tlen < 64 ? (int)tlen : 64, text);
    report(&e, NULL, "unknown type %s; expected ps or worker",
           quote(qi, sizeof qi, type));
    rc = CM_EINVAL;
    goto out;
  }
  p = colon + 1;
  if (*p == '\0' || strspn(p, "0123456789") != strlen(p)) {
    report(&e, NULL, "index %s is not a non-negative integer",
           quote(qi, sizeof qi, p));
    rc = CM_EINVAL;
    goto out;
  }
  for (; *p; p++) {
    x = x * 10 + (*p - '0');
    if (x > INT_MAX) {
      report(&e, NULL, "index out of range; expected at most %d", INT_MAX);
      rc = CM_EINVAL;
      goto out;
    }
  }
  t.index = (int)x;
  *out = t;
out:
  errs_finish(&e);
  return rc;
}

/* Takes the task from the TF_CONFIG environment variable, text tf, into *t.
 * Returns 1 when found, 0 when TF_CONFIG has no "task" (nothing reported),
 * or -1 after reporting a mistake. */
static int task_from_tf_config(struct spec_errs *e, const char *tf,
                               struct cm_task *t, int *rc) {
  char got[SPEC_QUOTE_MAX];
  json_t *root, *task;
  int found = 0;

  e->source = "TF_CONFIG";
  root = load_json(e, tf, strlen(tf), rc);
  if (!root)
    return -1;
  if (!json_is_object(root)) {
    report(e, NULL, "expected a JSON object with \"task\", got %s",
           describe(got, sizeof got, root));
    found = -1;
    goto out;
  }
  task = json_object_get(root, "task");
  if (!task)
    goto out;
  found = parse_task_obj(e, task, 0, t) ? 1 : -1;
out:
  json_decref(root);
  return found;
}

int cm_spec_resolve_task(struct cm_spec *spec, const char *cli, char *err,
                         size_t errlen) {
  char q[SPEC_QUOTE_MAX], prefix[SPEC_QUOTE_MAX + 16];
  struct spec_errs e;
  struct cm_task t = {CM_TASK_NONE, 0};
  const char *tf;
  int rc = 0, found;

  errs_init(&e, NULL, err, errlen);
  if (!spec) {
    report(&e, NULL, "no spec given");
    rc = CM_EINVAL;
    goto out;
  }
  if (cli) {
    if (cm_task_parse(cli, &t, err, errlen) < 0) {
      e.buf = NULL; /* cm_task_parse wrote err */
      rc = CM_ESPEC;
      goto out;
    }
    snprintf(prefix, sizeof prefix, "--task %s", quote(q, sizeof q, cli));
    e.source = prefix;
    if (!check_task_index(&e, spec, &t, NULL, "index ")) {
      rc = CM_ESPEC;
      goto out;
    }
  } else if (spec->task.type != CM_TASK_NONE) {
    t = spec->task;
    e.source = spec->source;
    if (!check_task_index(&e, spec, &t, "task.index", "")) {
      rc = CM_ESPEC;
      goto out;
    }
  } else {
    tf = getenv("TF_CONFIG");
    found = tf && *tf ? task_from_tf_config(&e, tf, &t, &rc) : 0;
    if (found < 0) {
      if (rc == 0)
        rc = CM_ESPEC;
      goto out;
    }
    if (found == 0) {
      e.source = NULL;
      report(&e, NULL,
             "no task given: pass --task TYPE:INDEX, set \"task\" in %s, or "
             "TF_CONFIG%s",
             spec->source, tf && *tf ? " (TF_CONFIG has no \"task\")" : "");
      rc = CM_ESPEC;
      goto out;
    }
    /* The index is checked against this spec's cluster, not TF_CONFIG's. */
    if (!check_task_index(&e, spec, &t, "task.index", "")) {
      rc = CM_ESPEC;
      goto out;
    }
  }
  spec->task = t;
out:
  errs_finish(&e);
  return rc;
}

const char *cm_task_type_name(enum cm_task_type type) {
  switch (type) {
  case CM_TASK_PS:
    return "ps";
  case CM_TASK_WORKER:
    return "worker";
  case CM_TASK_NONE:
    return "none";
  }
  return "unknown";
}

/* Whether an IPv4 address (network order) is loopback or unspecified;
 * 0.0.0.0 counts because connecting to it reaches this host on Linux. */
static int ipv4_loopback(const unsigned char *a) {
  return a[0] == 127 || (a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] == 0);
}

/* Whether an IPv6 address is ::1, :: or an IPv4-mapped loopback. */
static int ipv6_loopback(const unsigned char *a) {
  static const unsigned char mapped[12] = {0, 0, 0, 0, 0,    0,
                                           0, 0, 0, 0, 0xff, 0xff};
  int i;

  for (i = 0; i < 15 && a[i] == 0; i++)
    ;
  if (i == 15 && (a[15] == 1 || a[15] == 0))
    return 1;
  return memcmp(a, mapped, 12) == 0 && ipv4_loopback(a + 12);
}

/* Whether the address (AF_INET: 4 bytes, AF_INET6: 16) is loopback or is
 * held by one of this host's interfaces. *ifs caches getifaddrs() across
 * calls; the caller frees it. */
static int ip_is_local(int family, const unsigned char *a,
                       struct ifaddrs **ifs) {
  const struct ifaddrs *i;
  const unsigned char *b;

  if (family == AF_INET ? ipv4_loopback(a) : ipv6_loopback(a))
    return 1;
  if (!*ifs && getifaddrs(ifs) != 0) {
    *ifs = NULL;
    return 0;
  }
  for (i = *ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != family)
      continue;
    if (family == AF_INET) {
      b = (const unsigned char *)&(
              (const struct sockaddr_in *)(const void *)i->ifa_addr)
              ->sin_addr;
      if (memcmp(a, b, 4) == 0)
        return 1;
    } else {
      b = (const unsigned char *)&(
              (const struct sockaddr_in6 *)(const void *)i->ifa_addr)
              ->sin6_addr;
      if (memcmp(a, b, 16) == 0)
        return 1;
    }
  }
  return 0;
}

/* Compares host names ignoring case and one trailing dot. */
static int same_name(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);

  if (la > 0 && a[la - 1] == '.')
    la--;
  if (lb > 0 && b[lb - 1] == '.')
    lb--;
  return la == lb && strncasecmp(a, b, la) == 0;
}

int cm_addr_is_local(const struct cm_addr *addr) {
  char me[256];
  unsigned char bin[16];
  struct ifaddrs *ifs = NULL;
  struct addrinfo hints, *res = NULL, *ai;
  const unsigned char *a;
  int local = 0;

  if (!addr || !addr->host[0])
    goto out;
  /* Literals first: no lookup at all. */
  if (inet_pton(AF_INET, addr->host, bin) == 1) {
    local = ip_is_local(AF_INET, bin, &ifs);
    goto out;
  }
  if (parse_ipv6(addr->host, bin)) {
    local = ip_is_local(AF_INET6, bin, &ifs);
    goto out;
  }
  if (same_name(addr->host, "localhost")) {
    local = 1;
    goto out;
  }
  if (gethostname(me, sizeof me) == 0) {
    me[sizeof me - 1] = '\0';
    if (same_name(addr->host, me)) {
      local = 1;
      goto out;
    }
  }
  /* A name: resolve it (hosts file or DNS) and look for one of ours. */
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(addr->host, NULL, &hints, &res) != 0) {
    res = NULL;
    goto out;
  }
  for (ai = res; ai && !local; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      a = (const unsigned char *)&(
              (const struct sockaddr_in *)(const void *)ai->ai_addr)
              ->sin_addr;
      local = ip_is_local(AF_INET, a, &ifs);
    } else if (ai->ai_family == AF_INET6) {
      a = (const unsigned char *)&(
              (const struct sockaddr_in6 *)(const void *)ai->ai_addr)
              ->sin6_addr;
      local = ip_is_local(AF_INET6, a, &ifs);
    }
  }
out:
  if (res)
    freeaddrinfo(res);
  if (ifs)
    freeifaddrs(ifs);
  return local;
}
