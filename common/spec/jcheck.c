/* Typed reads of the spec's JSON (jcheck.h): the text parsed with its
 * syntax errors reported, and members checked for type and range, each
 * mistake reported at its path with what was expected and what was found. */
#include "jcheck.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "err.h"

/* How an integer range reads in a message: "a positive integer" etc. */
static const char *int_kind(long long min) {
  if (min == 1)
    return "a positive integer";
  if (min == 0)
    return "a non-negative integer";
  return "an integer";
}

int cm__want_int(struct cm__errs *e, const json_t *v, const char *path,
                 long long min, long long max, long long *val) {
  char got[CM__SPEC_QUOTE_MAX];
  long long x;

  if (!json_is_integer(v)) {
    cm__report(e, path, "expected %s, got %s", int_kind(min),
               cm__describe(got, sizeof got, v));
    return 0;
  }
  x = json_integer_value(v);
  if (x < min) {
    cm__report(e, path, "expected %s, got %lld", int_kind(min), x);
    return 0;
  }
  if (x > max) {
    cm__report(e, path, "%lld out of range; expected %s up to %lld", x,
               int_kind(min), max);
    return 0;
  }
  *val = x;
  return 1;
}

void cm__opt_int(struct cm__errs *e, json_t *obj, const char *parent,
                 const char *key, long long min, long long max, int *dst) {
  char path[CM__SPEC_PATH_MAX];
  json_t *v = json_object_get(obj, key);
  long long x;

  if (!v)
    return;
  cm__path_key(path, sizeof path, parent, key);
  if (cm__want_int(e, v, path, min, max, &x))
    *dst = (int)x;
}

int cm__opt_string(struct cm__errs *e, json_t *obj, const char *parent,
                   const char *key, char *dst, size_t cap) {
  char path[CM__SPEC_PATH_MAX], got[CM__SPEC_QUOTE_MAX];
  json_t *v = json_object_get(obj, key);
  size_t n;

  if (!v)
    return 0;
  cm__path_key(path, sizeof path, parent, key);
  if (!json_is_string(v)) {
    cm__report(e, path, "expected a string, got %s",
               cm__describe(got, sizeof got, v));
    return 0;
  }
  n = json_string_length(v);
  if (n == 0) {
    cm__report(e, path, "empty; expected a non-empty string");
    return 0;
  }
  if (n >= cap) {
    cm__report(e, path, "%zu characters long; expected at most %zu", n,
               cap - 1);
    return 0;
  }
  memcpy(dst, json_string_value(v), n + 1);
  return 1;
}

void cm__opt_bool(struct cm__errs *e, json_t *obj, const char *parent,
                  const char *key, int *dst) {
  char path[CM__SPEC_PATH_MAX], got[CM__SPEC_QUOTE_MAX];
  json_t *v = json_object_get(obj, key);

  if (!v)
    return;
  if (json_is_boolean(v)) {
    *dst = json_is_true(v);
    return;
  }
  cm__path_key(path, sizeof path, parent, key);
  cm__report(e, path, "expected true or false, got %s",
             cm__describe(got, sizeof got, v));
}

void cm__opt_choice(struct cm__errs *e, json_t *obj, const char *parent,
                    const char *key, const char *const *one_of, char *dst,
                    size_t cap) {
  char path[CM__SPEC_PATH_MAX], got[CM__SPEC_QUOTE_MAX], expect[128];
  json_t *v = json_object_get(obj, key);
  size_t i, used = 0;
  int w;

  if (!v)
    return;
  cm__path_key(path, sizeof path, parent, key);
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
  cm__report(e, path, "expected %s, got %s", expect,
             cm__describe(got, sizeof got, v));
}

void cm__opt_number(struct cm__errs *e, json_t *obj, const char *parent,
                    const char *key, double lo, int lo_in, double hi,
                    const char *expect, double *dst) {
  char path[CM__SPEC_PATH_MAX], got[CM__SPEC_QUOTE_MAX];
  json_t *v = json_object_get(obj, key);
  double x;

  if (!v)
    return;
  cm__path_key(path, sizeof path, parent, key);
  if (!json_is_number(v)) {
    cm__report(e, path, "expected %s, got %s", expect,
               cm__describe(got, sizeof got, v));
    return;
  }
  x = json_number_value(v);
  if (!isfinite(x) || x < lo || (x == lo && !lo_in) || x >= hi) {
    cm__report(e, path, "expected %s, got %s", expect,
               cm__describe(got, sizeof got, v));
    return;
  }
  *dst = x;
}

json_t *cm__opt_object(struct cm__errs *e, json_t *obj, const char *parent,
                       const char *key, const char *expect) {
  char path[CM__SPEC_PATH_MAX], got[CM__SPEC_QUOTE_MAX];
  json_t *v = json_object_get(obj, key);

  if (!v || json_is_object(v))
    return v;
  cm__path_key(path, sizeof path, parent, key);
  cm__report(e, path, "expected %s, got %s", expect,
             cm__describe(got, sizeof got, v));
  return NULL;
}

int cm__want_object(struct cm__errs *e, json_t *v, const char *path,
                    const char *example, const char *const *keys,
                    size_t nkeys) {
  char got[CM__SPEC_QUOTE_MAX];
  if (!json_is_object(v)) {
    cm__report(e, path, "expected an object like %s, got %s", example,
               cm__describe(got, sizeof got, v));
    return 0;
  }
  cm__check_keys(e, v, path, keys, nkeys);
  return 1;
}

json_t *cm__opt_array(struct cm__errs *e, json_t *obj, const char *parent,
                      const char *key, size_t min, size_t max,
                      const char *expect, ...) {
  char path[CM__SPEC_PATH_MAX], got[CM__SPEC_QUOTE_MAX], what[256];
  json_t *v = json_object_get(obj, key);
  va_list ap;

  if (!v || (json_is_array(v) && json_array_size(v) >= min &&
             json_array_size(v) <= max))
    return v;
  va_start(ap, expect);
  vsnprintf(what, sizeof what, expect, ap);
  va_end(ap);
  cm__path_key(path, sizeof path, parent, key);
  cm__report(e, path, "expected %s, got %s", what,
             cm__describe(got, sizeof got, v));
  return NULL;
}

json_t *cm__load_json(struct cm__errs *e, const char *text, size_t len,
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
    cm__report(e, NULL, "%s:%d:%d: JSON syntax error: %s", source, jerr.line,
               jerr.column, jerr.text);
  else
    cm__report(e, NULL, "%s: JSON syntax error: %s", source, jerr.text);
  e->source = source;
  return NULL;
}
