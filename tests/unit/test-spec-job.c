/* Unit tests for common/spec/job.c, the job's settings apart from sync and
 * the optimizers: the models and their own settings, job.unix_sockets and
 * job.socket_owner, "auth", the checkpoint settings (defaults, bounds), the
 * retry budget, the input limits (job.max_message_mb, job.nonfinite) and
 * job.worker_command, what pslaunch runs for a worker. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "spec.h"
#include "spec_fixture.h"
#include "unit.h"

/* The three models, each with its own settings; another model's settings
 * are refused with the path. */
START_TEST(test_models) {
  struct cm_spec *spec = NULL;

  ck_assert_int_eq(
      parse("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"job\": {\"model\": \"cnn\", \"channels\": [8, 24]}}",
            &spec),
      0);
  ck_assert_str_eq(spec->job.model, "cnn");
  ck_assert_int_eq(spec->job.channels[0], 8);
  ck_assert_int_eq(spec->job.channels[1], 24);
  cm_spec_free(spec);
  spec = NULL;
  ck_assert_int_eq(
      parse("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"job\": {\"model\": \"softmax\"}}",
            &spec),
      0);
  ck_assert_str_eq(spec->job.model, "softmax");
  cm_spec_free(spec);

  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"job\": {\"model\": \"softmax\", \"hidden\": [10],"
            " \"channels\": [8, 8]}}");
  has_line("t.json: job.hidden: only for job.model \"mlp\" (this job's is "
           "\"softmax\")");
  has_line("t.json: job.channels: only for job.model \"cnn\" (this job's is "
           "\"softmax\")");
  ck_assert_int_eq(count_lines(err), 2);
  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"job\": {\"model\": \"cnn\", \"channels\": [0, 2000]}}");
  has_line("t.json: job.channels[0]: expected a positive integer, got 0");
  has_line("t.json: job.channels[1]: 2000 out of range; expected a positive "
           "integer up to 1024");
  ck_assert_int_eq(count_lines(err), 2);
  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"job\": {\"model\": \"cnn\", \"channels\": [16]}}");
  has_line("t.json: job.channels: expected an array of 2 integers in 1..1024 "
           "(the channels of the two convolutions), got an array");
  ck_assert_int_eq(count_lines(err), 1);
}
END_TEST

/* job.ctr.format: "libsvm" by default; "criteo" takes 39 fields and its
 * own sizes, and refuses fields and generate.zipf. */
START_TEST(test_ctr_format) {
  struct cm_spec *spec = NULL;
#define CTR(ctr)                                                               \
  "{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"                  \
  " \"job\": {\"model\": \"ctr\", \"ctr\": " ctr "}}"

  ck_assert_int_eq(parse(CTR("{}"), &spec), 0);
  ck_assert_str_eq(spec->job.ctr.format, "libsvm");
  ck_assert_int_eq(spec->job.ctr.fields, 8);
  ck_assert_int_eq(spec->job.ctr.train, 500000);
  cm_spec_free(spec);
  spec = NULL;
  ck_assert_int_eq(parse(CTR("{\"format\": \"criteo\"}"), &spec), 0);
  ck_assert_str_eq(spec->job.ctr.format, "criteo");
  ck_assert_int_eq(spec->job.ctr.fields, 39);
  ck_assert_int_eq(spec->job.ctr.train, 5000000);
  ck_assert_int_eq(spec->job.ctr.test, 100000);
  cm_spec_free(spec);
  spec = NULL;
  ck_assert_int_eq(parse(CTR("{\"format\": \"criteo\", \"generate\": "
                             "{\"train\": 200000, \"seed\": 3}}"),
                         &spec),
                   0);
  ck_assert_int_eq(spec->job.ctr.train, 200000);
  ck_assert_uint_eq(spec->job.ctr.data_seed, 3);
  cm_spec_free(spec);
  parse_bad(CTR("{\"format\": \"csv\"}"));
  has_text("t.json: job.ctr.format:");
  has_text("\"csv\"");
  parse_bad(CTR("{\"format\": \"criteo\", \"fields\": 26, \"generate\": "
                "{\"zipf\": 1.2}}"));
  has_line("t.json: job.ctr.fields: not with format \"criteo\" (its 39 fields "
           "are 26 categorical and 13 integer features)");
  has_line("t.json: job.ctr.generate.zipf: only for format \"libsvm\" (the "
           "Criteo format's draws are its own: docs/ctr.md)");
  ck_assert_int_eq(count_lines(err), 2);
#undef CTR
}
END_TEST

/* job.hidden: 1..16 widths, each at its own path; a list with any mistake
 * is refused whole. */
START_TEST(test_hidden) {
  struct cm_spec *spec = NULL;

  ck_assert_int_eq(parse(ONE_WORKER("\"hidden\": [5, 6, 7]"), &spec), 0);
  ck_assert_int_eq(spec->job.nhidden, 3);
  ck_assert_int_eq(spec->job.hidden[2], 7);
  cm_spec_free(spec);

  parse_bad(ONE_WORKER("\"hidden\": 5"));
  has_line("t.json: job.hidden: expected an array of 1..16 positive integers "
           "(layer widths), got 5");
  parse_bad(ONE_WORKER("\"hidden\": []"));
  has_line("t.json: job.hidden: empty; expected 1..16 positive integers");
  parse_bad(ONE_WORKER("\"hidden\": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
                       "1, 1, 1, 1]"));
  has_line("t.json: job.hidden: 17 entries; expected at most 16");
  ck_assert_int_eq(count_lines(err), 1);
  parse_bad(ONE_WORKER("\"hidden\": [0, 8, \"x\"]"));
  has_line("t.json: job.hidden[0]: expected a positive integer, got 0");
  has_line("t.json: job.hidden[2]: expected a positive integer, got \"x\"");
  ck_assert_int_eq(count_lines(err), 2);
}
END_TEST

/* job.unix_sockets: a JSON boolean, nothing else. */
START_TEST(test_unix_sockets) {
  struct cm_spec *spec = NULL;
  ck_assert_int_eq(parse(FOUR_WORKERS("\"unix_sockets\": false"), &spec), 0);
  ck_assert_int_eq(spec->job.unix_sockets, 0);
  cm_spec_free(spec);
  parse_bad(FOUR_WORKERS("\"unix_sockets\": \"no\""));
  has_line("t.json: job.unix_sockets: expected true or false, got "
           "\"no\"");
}
END_TEST

/* job.socket_owner: a user name or a numeric uid (string or integer),
 * default none; anything else named by its path with what is expected. */
START_TEST(test_socket_owner) {
  static const char *const good[][2] = {{"\"psd\"", "psd"},
                                        {"\"svc.user-1_x\"", "svc.user-1_x"},
                                        {"\"65534\"", "65534"},
                                        {"0", "0"},
                                        {"4294967294", "4294967294"}};
  static const char *const bad[] = {
      "\"-psd\"",       "\"ps d\"", "\"\"",
      "\"4294967295\"", "true",     "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\""};
  struct cm_spec *spec = NULL;
  char text[256];

  ck_assert_int_eq(parse(ONE_WORKER("\"seed\": 1"), &spec), 0);
  ck_assert_str_eq(spec->job.socket_owner, "");
  cm_spec_free(spec);
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    spec = NULL;
    snprintf(text, sizeof text, ONE_WORKER("\"socket_owner\": %s"), good[i][0]);
    ck_assert_int_eq(parse(text, &spec), 0);
    ck_assert_str_eq(spec->job.socket_owner, good[i][1]);
    cm_spec_free(spec);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(text, sizeof text, ONE_WORKER("\"socket_owner\": %s"), bad[i]);
    parse_bad(text);
    has_text("t.json: job.socket_owner: expected the user psd runs as, a "
             "user name (letters, digits, '.', '_', '-'; not starting with "
             "'-') or a numeric uid, got ");
    ck_assert_int_eq(count_lines(err), 1);
  }
  parse_bad(ONE_WORKER("\"socket_owner\": -1"));
  has_line("t.json: job.socket_owner: expected a non-negative integer, got -1");
}
END_TEST

/* "auth": a token file and TLS material, never an inline token; every
 * missing piece named by its key. */
#define WITH_AUTH(auth)                                                        \
  "{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]}, \"auth\": " auth  \
  "}"

START_TEST(test_auth) {
  struct cm_spec *spec = NULL;
  ck_assert_int_eq(parse(WITH_AUTH("{\"token_file\": \"/etc/psd/token\","
                                   " \"tls\": {\"ca\": \"ca.pem\", \"cert\":"
                                   " \"s.pem\", \"key\": \"s.key\", \"mutual\":"
                                   " true, \"client_cert\": \"c.pem\","
                                   " \"client_key\": \"c.key\","
                                   " \"server_name\": \"psd\"}}"),
                         &spec),
                   0);
  ck_assert_str_eq(spec->auth.token_file, "/etc/psd/token");
  ck_assert_int_eq(spec->auth.tls, 1);
  ck_assert_int_eq(spec->auth.mutual, 1);
  ck_assert_str_eq(spec->auth.ca, "ca.pem"); /* cm_spec_load resolves */
  ck_assert_str_eq(spec->auth.client_key, "c.key");
  ck_assert_str_eq(spec->auth.server_name, "psd");
  cm_spec_free(spec);

  /* No auth at all: everything empty. */
  ck_assert_int_eq(parse("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\":"
                         " [\"h:2\"]}}",
                         &spec),
                   0);
  ck_assert_int_eq(spec->auth.tls, 0);
  ck_assert_str_eq(spec->auth.token_file, "");
  cm_spec_free(spec);

  parse_bad(WITH_AUTH("{\"token\": \"s3cret\"}"));
  has_text("t.json: auth.token: a token is never written in the spec");
  ck_assert_ptr_null(strstr(err, "s3cret"));

  parse_bad(WITH_AUTH("{\"tls\": {\"mutual\": \"yes\", \"cert\": \"s.pem\"}}"));
  has_line("t.json: auth.tls.mutual: expected true or false, got \"yes\"");
  has_text("t.json: auth.tls.ca: missing;");
  has_text("t.json: auth.tls.key: missing; the shards need a certificate and "
           "its key");

  parse_bad(WITH_AUTH("{\"tls\": {\"ca\": \"a\", \"cert\": \"b\", \"key\":"
                      " \"c\", \"mutual\": true, \"client_cert\": \"d\"}}"));
  has_text("t.json: auth.tls.client_key: missing; with \"mutual\": true");

  parse_bad(WITH_AUTH("{\"token_fil\": \"x\"}"));
  has_text("t.json: auth.token_fil: unknown key (did you mean token_file?)");
}
END_TEST

START_TEST(test_checkpoint_settings) {
  struct cm_spec *spec = NULL;

  ck_assert_msg(parse(ONE_WORKER("\"checkpoint\": {\"dir\": \"/var/ck\","
                                 " \"every_steps\": 500, \"every_s\": 1.5,"
                                 " \"keep\": 1}"),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_str_eq(spec->job.ckpt_dir, "/var/ck");
  ck_assert_int_eq(spec->job.ckpt_every_steps, 500);
  ck_assert_double_eq(spec->job.ckpt_every_s, 1.5);
  ck_assert_int_eq(spec->job.ckpt_keep, 1);
  cm_spec_free(spec);
  spec = NULL;

  /* Only a dir: on demand and at exit; zeros are "never"; parse leaves a
   * relative dir as written. */
  ck_assert_msg(parse(ONE_WORKER("\"checkpoint\": {\"dir\": \"ck\","
                                 " \"every_steps\": 0, \"every_s\": 0}"),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_str_eq(spec->job.ckpt_dir, "ck");
  ck_assert_int_eq(spec->job.ckpt_every_steps, 0);
  ck_assert_double_eq(spec->job.ckpt_every_s, 0);
  ck_assert_int_eq(spec->job.ckpt_keep, 3);
  cm_spec_free(spec);
}
END_TEST

/* job.tensorboard_dir: parse keeps it as written (cm_spec_load resolves
 * it, test-spec.c); a string, never empty. */
START_TEST(test_tensorboard_dir) {
  struct cm_spec *spec = NULL;

  ck_assert_msg(parse(ONE_WORKER("\"tensorboard_dir\": \"runs/a\""), &spec) ==
                    0,
                "err: %s", err);
  ck_assert_str_eq(spec->job.tensorboard_dir, "runs/a");
  cm_spec_free(spec);

  parse_bad(ONE_WORKER("\"tensorboard_dir\": \"\""));
  ck_assert_str_eq(err, "t.json: job.tensorboard_dir: empty; expected a "
                        "non-empty string");
  parse_bad(ONE_WORKER("\"tensorboard_dir\": true"));
  ck_assert_str_eq(err, "t.json: job.tensorboard_dir: expected a string, got "
                        "true");
}
END_TEST

START_TEST(test_retry_budget) {
  struct cm_spec *spec = NULL;

  ck_assert_msg(parse(ONE_WORKER("\"retry_s\": 2.5"), &spec) == 0, "err: %s",
                err);
  ck_assert_double_eq(spec->job.retry_s, 2.5);
  cm_spec_free(spec);
  spec = NULL;
  ck_assert_msg(parse(ONE_WORKER("\"retry_s\": 0"), &spec) == 0, "err: %s",
                err);
  ck_assert_double_eq(spec->job.retry_s, 0);
  cm_spec_free(spec);

  parse_bad(ONE_WORKER("\"retry_s\": -1"));
  ck_assert_str_eq(err, "t.json: job.retry_s: expected a number of seconds "
                        ">= 0 (0: never retry), got -1");
  parse_bad(ONE_WORKER("\"retry_s\": \"120\""));
  ck_assert_str_eq(err, "t.json: job.retry_s: expected a number of seconds "
                        ">= 0 (0: never retry), got \"120\"");
  parse_bad(ONE_WORKER("\"retry\": 5"));
  has_text("t.json: job.retry: unknown key (did you mean retry_s?)");
}
END_TEST

START_TEST(test_checkpoint_mistakes) {
  parse_bad(ONE_WORKER("\"checkpoint\": {\"dir\": \"\", \"every_steps\": -1,"
                       " \"every_s\": -0.5, \"keep\": 0, \"kep\": 2}"));
  has_line("t.json: job.checkpoint.dir: empty; expected a non-empty string");
  has_line("t.json: job.checkpoint.every_steps: expected a non-negative "
           "integer, got -1");
  has_line("t.json: job.checkpoint.every_s: expected a number of seconds >= 0 "
           "(0: never), got -0.5");
  has_line("t.json: job.checkpoint.keep: expected a positive integer, got 0");
  has_line("t.json: job.checkpoint.kep: unknown key (did you mean keep?); "
           "expected one of dir, every_steps, every_s, keep");
  ck_assert_int_eq(count_lines(err), 5);

  parse_bad(ONE_WORKER("\"checkpoint\": {\"dir\": 7, \"every_steps\": 1.5,"
                       " \"every_s\": \"60\", \"keep\": true}"));
  has_line("t.json: job.checkpoint.dir: expected a string, got 7");
  has_line("t.json: job.checkpoint.every_steps: expected a non-negative "
           "integer, got 1.5");
  has_line("t.json: job.checkpoint.every_s: expected a number of seconds >= 0 "
           "(0: never), got \"60\"");
  has_line("t.json: job.checkpoint.keep: expected a positive integer, got "
           "true");
  ck_assert_int_eq(count_lines(err), 4);

  parse_bad(ONE_WORKER("\"checkpoint\": \"/var/ck\""));
  ck_assert_str_eq(err, "t.json: job.checkpoint: expected an object like "
                        "{\"dir\": \"ckpt\", \"every_steps\": 1000, "
                        "\"keep\": 3}, got \"/var/ck\"");
  parse_bad(ONE_WORKER("\"checkpoints\": {}"));
  has_text("t.json: job.checkpoints: unknown key (did you mean checkpoint?)");
}
END_TEST

/* job.max_message_mb and job.nonfinite: defaults, values, and mistakes
 * with their JSON paths (a limit too small for a 2 MiB chunk says so). */
START_TEST(test_input_limits) {
  struct cm_spec *spec = NULL;

  ck_assert_int_eq(parse(ONE_WORKER(""), &spec), 0);
  ck_assert_int_eq(spec->job.max_message_mb, 64);
  ck_assert_str_eq(spec->job.nonfinite, "reject");
  cm_spec_free(spec);
  ck_assert_msg(parse(ONE_WORKER("\"max_message_mb\": 4, \"nonfinite\":"
                                 " \"skip\""),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.max_message_mb, 4);
  ck_assert_str_eq(spec->job.nonfinite, "skip");
  cm_spec_free(spec);
  ck_assert_int_eq(parse(ONE_WORKER("\"max_message_mb\": 2047, \"nonfinite\":"
                                    " \"apply\""),
                         &spec),
                   0);
  ck_assert_int_eq(spec->job.max_message_mb, 2047);
  ck_assert_str_eq(spec->job.nonfinite, "apply");
  cm_spec_free(spec);

  parse_bad(ONE_WORKER("\"max_message_mb\": 2, \"nonfinite\": \"drop\""));
  has_line("t.json: job.max_message_mb: 2 MiB is too small; expected at least "
           "4 (a 2 MiB chunk of tensor data plus its message head and "
           "headroom)");
  has_line("t.json: job.nonfinite: expected \"reject\", \"skip\" or "
           "\"apply\", got \"drop\"");
  ck_assert_int_eq(count_lines(err), 2);

  parse_bad(ONE_WORKER("\"max_message_mb\": 4096, \"nonfinite\": false"));
  has_line("t.json: job.max_message_mb: 4096 out of range; expected a "
           "positive integer up to 2047");
  has_line("t.json: job.nonfinite: expected \"reject\", \"skip\" or "
           "\"apply\", got false");
  parse_bad(ONE_WORKER("\"max_message_mb\": 0"));
  has_line("t.json: job.max_message_mb: expected a positive integer, got 0");
  parse_bad(ONE_WORKER("\"max_message_mb\": \"64\""));
  has_line("t.json: job.max_message_mb: expected a positive integer, got "
           "\"64\"");
  parse_bad(ONE_WORKER("\"max_mesage_mb\": 8"));
  has_text("t.json: job.max_mesage_mb: unknown key (did you mean "
           "max_message_mb?)");
}
END_TEST

/* job.wire_dtype: f32 by default, bf16 when asked, a clear error else. */
START_TEST(test_wire_dtype) {
  struct cm_spec *spec = NULL;

  ck_assert_int_eq(parse(ONE_WORKER(""), &spec), 0);
  ck_assert_str_eq(spec->job.wire_dtype, "f32");
  cm_spec_free(spec);
  ck_assert_int_eq(parse(ONE_WORKER("\"wire_dtype\": \"bf16\""), &spec), 0);
  ck_assert_str_eq(spec->job.wire_dtype, "bf16");
  cm_spec_free(spec);
  parse_bad(ONE_WORKER("\"wire_dtype\": \"fp16\""));
  has_line("t.json: job.wire_dtype: expected \"f32\" or \"bf16\", got "
           "\"fp16\"");
  parse_bad(ONE_WORKER("\"wire_type\": \"bf16\""));
  has_text("t.json: job.wire_type: unknown key (did you mean wire_dtype?)");
}
END_TEST

/* job.worker_command: absent by default; an array of 1..32 non-empty
 * strings of under 1024 bytes each, kept as written; each mistake named by
 * its path with what was expected, and a command with one is not kept. */
START_TEST(test_worker_command) {
  static char text[64 * 1024], arg[1100];
  struct cm_spec *spec = NULL;
  size_t n;
  int i;

  ck_assert_int_eq(parse(ONE_WORKER(""), &spec), 0);
  ck_assert_int_eq(spec->job.nworker_command, 0);
  cm_spec_free(spec);
  ck_assert_msg(parse(ONE_WORKER("\"worker_command\": [\"python3\", \"-u\","
                                 " \"train dir/t.py\", \"--x=\\\"1\\\"\"]"),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.nworker_command, 4);
  ck_assert_str_eq(spec->job.worker_command[0], "python3");
  ck_assert_str_eq(spec->job.worker_command[1], "-u");
  ck_assert_str_eq(spec->job.worker_command[2], "train dir/t.py");
  ck_assert_str_eq(spec->job.worker_command[3], "--x=\"1\"");
  cm_spec_free(spec);

  /* At the limits: 32 strings, one of them 1023 bytes long. */
  memset(arg, 'a', 1023);
  arg[1023] = '\0';
  n = (size_t)snprintf(text, sizeof text,
                       "{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": "
                       "[\"h:2\"]}, \"job\": {\"worker_command\": [\"%s\"",
                       arg);
  for (i = 1; i < 32; i++)
    n += (size_t)snprintf(text + n, sizeof text - n, ", \"a%d\"", i);
  snprintf(text + n, sizeof text - n, "]}}");
  ck_assert_msg(parse(text, &spec) == 0, "err: %s", err);
  ck_assert_int_eq(spec->job.nworker_command, 32);
  ck_assert_uint_eq(strlen(spec->job.worker_command[0]), 1023);
  ck_assert_str_eq(spec->job.worker_command[31], "a31");
  cm_spec_free(spec);
  /* One past each. */
  snprintf(text + n, sizeof text - n, ", \"a32\"]}}");
  parse_bad(text);
  has_line("t.json: job.worker_command: 33 entries; expected at most 32");
  ck_assert_int_eq(count_lines(err), 1);
  arg[1023] = 'a';
  arg[1024] = '\0';
  snprintf(text, sizeof text,
           "{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]}, "
           "\"job\": {\"worker_command\": [\"python3\", \"%s\"]}}",
           arg);
  parse_bad(text);
  has_line("t.json: job.worker_command[1]: 1024 bytes long; expected at most "
           "1023");
  ck_assert_int_eq(count_lines(err), 1);

  /* Every mistaken entry is reported, each with its path. */
  parse_bad(ONE_WORKER("\"worker_command\": [\"python3\", 5, \"\", true,"
                       " null, {\"a\": 1}, 2.5, \"ok\"]"));
  has_line("t.json: job.worker_command[1]: 5 is a number; expected a string");
  has_line("t.json: job.worker_command[2]: empty; expected a non-empty "
           "string");
  has_line("t.json: job.worker_command[3]: true is a boolean; expected a "
           "string");
  has_line("t.json: job.worker_command[4]: null; expected a string");
  has_line("t.json: job.worker_command[5]: an object; expected a string");
  has_line("t.json: job.worker_command[6]: 2.5 is a number; expected a "
           "string");
  ck_assert_int_eq(count_lines(err), 6);
  parse_bad(ONE_WORKER("\"worker_command\": \"python3 train.py\""));
  has_line("t.json: job.worker_command: \"python3 train.py\"; expected an "
           "array of 1..32 non-empty strings, the program and its arguments "
           "(e.g. [\"python3\", \"train.py\"])");
  ck_assert_int_eq(count_lines(err), 1);
  parse_bad(ONE_WORKER("\"worker_command\": []"));
  has_line("t.json: job.worker_command: empty; expected an array of 1..32 "
           "non-empty strings, the program and its arguments (e.g. "
           "[\"python3\", \"train.py\"])");
  parse_bad(ONE_WORKER("\"worker_commands\": [\"python3\"]"));
  has_text("t.json: job.worker_commands: unknown key (did you mean "
           "worker_command?)");
}
END_TEST

static Suite *spec_job_suite(void) {
  Suite *s = suite_create("spec-job");
  TCase *tc;

  tc = tcase_create("parse");
  tcase_add_test(tc, test_models);
  tcase_add_test(tc, test_ctr_format);
  tcase_add_test(tc, test_hidden);
  tcase_add_test(tc, test_wire_dtype);
  tcase_add_test(tc, test_unix_sockets);
  tcase_add_test(tc, test_socket_owner);
  tcase_add_test(tc, test_auth);
  tcase_add_test(tc, test_input_limits);
  tcase_add_test(tc, test_worker_command);
  suite_add_tcase(s, tc);

  tc = tcase_create("checkpoint");
  tcase_add_test(tc, test_checkpoint_settings);
  tcase_add_test(tc, test_checkpoint_mistakes);
  suite_add_tcase(s, tc);

  tc = tcase_create("faults");
  tcase_add_test(tc, test_retry_budget);
  tcase_add_test(tc, test_tensorboard_dir);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(spec_job_suite(), 0); }
