/* What the spec suites (tests/unit/test-spec*.c) share: parse helpers and
 * assertions on the mistakes a parse reported (spec_fixture.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkdtemp under -std=c11 */
#endif

#include "spec_fixture.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"

char err[8192];

int parse(const char *text, struct cm_spec **out) {
  return cm_spec_parse(text, strlen(text), "t.json", out, err, sizeof err);
}

void parse_bad(const char *text) {
  struct cm_spec *spec = (struct cm_spec *)1;
  int rc = parse(text, &spec);

  ck_assert_msg(rc == CM_ESPEC, "rc %d (%s), err: %s", rc, cm_err_name(rc),
                err);
  ck_assert_ptr_null(spec);
}

void has_line(const char *line) {
  const char *p = err;
  size_t n = strlen(line);

  while ((p = strstr(p, line)) != NULL) {
    if ((p == err || p[-1] == '\n') && (p[n] == '\0' || p[n] == '\n'))
      return;
    p++;
  }
  ck_abort_msg("missing line\n  %s\nin err:\n%s", line, err);
}

void has_text(const char *text) {
  ck_assert_msg(strstr(err, text) != NULL, "missing \"%s\" in err:\n%s", text,
                err);
}

int count_lines(const char *s) {
  int n = *s ? 1 : 0;

  for (; *s; s++)
    n += *s == '\n';
  return n;
}

const char *addrs(const struct cm_addr *list, int n) {
  static char buf[4096];

  buf[0] = '\0';
  for (int i = 0; i < n; i++) {
    if (i)
      strcat(buf, " ");
    strcat(buf, list[i].text);
  }
  return buf;
}

const char *job_file(const char *tag, const char *text) {
  static char path[256];
  char dir[128];
  FILE *f;

  snprintf(dir, sizeof dir, "/tmp/test-%s-XXXXXX", tag);
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/job.json", dir);
  f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
  return path;
}

void remove_job_file(const char *path) {
  char dir[256];

  unlink(path);
  snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(path, '/') - path), path);
  rmdir(dir);
}
