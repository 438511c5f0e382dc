/* What the spec suites (tests/unit/test-spec*.c) share: the buffer every
 * spec call writes its mistakes into, parsing with the source "t.json",
 * assertions on the lines of that buffer, and small clusters to wrap a "job"
 * in. */
#ifndef TU_SPEC_FIXTURE_H
#define TU_SPEC_FIXTURE_H

#include "spec.h"

/* A one-worker spec with the given text inside "job": {...}. */
#define ONE_WORKER(job)                                                        \
  "{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]}, \"job\": {" job   \
  "}}"

/* A spec with four workers and the given text inside "job": {...}. */
#define FOUR_WORKERS(job)                                                      \
  "{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\", \"h:3\", \"h:4\","  \
  " \"h:5\"]}, \"job\": {" job "}}"

/* The mistakes of the last spec call: the suites pass it (and its size) to
 * cm_spec_parse, cm_spec_load and the task calls, and assert on it. */
extern char err[8192];

/* Parses text as "t.json" into *out, returning cm_spec_parse's code. */
int parse(const char *text, struct cm_spec **out);

/* Parses text, expects CM_ESPEC and no spec. */
void parse_bad(const char *text);

/* Asserts err holds line as one of its lines, exactly. */
void has_line(const char *line);

/* Asserts err contains text somewhere. */
void has_text(const char *text);

/* Lines in s ("" has none). */
int count_lines(const char *s);

/* The addresses of list[0..n) joined by spaces, in a static buffer (the
 * derived specs' clusters, as the Slurm and Kubernetes suites compare
 * them). */
const char *addrs(const struct cm_addr *list, int n);

/* Writes text into job.json of a new directory /tmp/test-TAG-XXXXXX (the
 * job files of the derived specs' suites); returns its path, in a static
 * buffer. */
const char *job_file(const char *tag, const char *text);

/* Removes the file job_file made and its directory. */
void remove_job_file(const char *path);

#endif
