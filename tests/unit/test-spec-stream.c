/* job.ctr.stream (common/spec/job_ctr.c): its defaults, a directory or a
 * file (one of them), the end marker's name, poll_s's bounds, window with a
 * file only, not with format "criteo"'s file nor in sync mode; every
 * mistake named with its path. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "spec.h"
#include "spec_fixture.h"
#include "unit.h"

#define CTR(ctr)                                                               \
  "{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"                  \
  " \"job\": {\"model\": \"ctr\", \"ctr\": " ctr "}}"

START_TEST(test_stream_settings) {
  struct cm_spec *spec = NULL;

  ck_assert_int_eq(parse(CTR("{}"), &spec), 0);
  ck_assert_str_eq(spec->job.ctr.stream_dir, "");
  ck_assert_str_eq(spec->job.ctr.stream_file, "");
  ck_assert_str_eq(spec->job.ctr.stream_end, "END");
  ck_assert(spec->job.ctr.stream_poll_s == 0.5);
  cm_spec_free(spec);
  spec = NULL;
  ck_assert_int_eq(parse(CTR("{\"stream\": {\"dir\": \"parts\"}}"), &spec), 0);
  ck_assert_str_eq(spec->job.ctr.stream_dir, "parts");
  cm_spec_free(spec);
  spec = NULL;
  ck_assert_int_eq(parse(CTR("{\"stream\": {\"file\": \"/var/log/c.svm\", "
                             "\"window\": 500, \"poll_s\": 0.1, \"end\": "
                             "\"DONE\"}}"),
                         &spec),
                   0);
  ck_assert_str_eq(spec->job.ctr.stream_file, "/var/log/c.svm");
  ck_assert_int_eq(spec->job.ctr.stream_window, 500);
  ck_assert(spec->job.ctr.stream_poll_s == 0.1);
  ck_assert_str_eq(spec->job.ctr.stream_end, "DONE");
  cm_spec_free(spec);

  parse_bad(CTR("{\"stream\": {}}"));
  has_line("t.json: job.ctr.stream: needs one of \"dir\" (a directory of "
           "parts) or \"file\" (one growing file), got neither");
  ck_assert_int_eq(count_lines(err), 1);
  parse_bad(CTR("{\"stream\": {\"dir\": \"a\", \"file\": \"b\", \"window\": "
                "0, \"poll_s\": 0, \"end\": \"x/y\", \"every\": 1}}"));
  has_line("t.json: job.ctr.stream.every: unknown key; expected one of dir, "
           "file, poll_s, end, window");
  has_line("t.json: job.ctr.stream: needs one of \"dir\" (a directory of "
           "parts) or \"file\" (one growing file), not both");
  has_line("t.json: job.ctr.stream.end: a file name, not a path ('x/y' has "
           "a '/')");
  has_line("t.json: job.ctr.stream.poll_s: expected a number of seconds in "
           "(0, 60), got 0");
  has_line("t.json: job.ctr.stream.window: expected a positive integer, got "
           "0");
  ck_assert_int_eq(count_lines(err), 5);
  parse_bad(CTR("{\"stream\": {\"dir\": \"a\", \"window\": 10}}"));
  has_line("t.json: job.ctr.stream.window: only with \"file\" (a "
           "directory's window is a part)");
  ck_assert_int_eq(count_lines(err), 1);
  parse_bad(CTR("{\"format\": \"criteo\", \"stream\": {\"file\": \"a\"}}"));
  has_line("t.json: job.ctr.stream.file: only for format \"libsvm\" "
           "(Criteo parts: use \"dir\")");
  ck_assert_int_eq(count_lines(err), 1);
  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"job\": {\"model\": \"ctr\", \"sync\": {\"mode\": \"sync\"}, "
            "\"ctr\": {\"stream\": {\"dir\": \"a\"}}}}");
  has_line("t.json: job.ctr.stream: only with job.sync.mode \"async\" (a "
           "stream has no step count for the workers to share)");
  ck_assert_int_eq(count_lines(err), 1);
}
END_TEST

static Suite *spec_stream_suite(void) {
  Suite *s = suite_create("spec-stream");
  TCase *tc = tcase_create("spec-stream");
  tcase_add_test(tc, test_stream_settings);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(spec_stream_suite(), 0); }
