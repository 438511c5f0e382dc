/* Unit tests for common/spec/spec.c: valid specs and their defaults, every kind
 * of mistake (each with its JSON path, all reported at once), JSON syntax
 * errors, the sync settings (defaults from the cluster size, settings of the
 * wrong mode, bounds, liveness timings), loading from a file, --task parsing,
 * task resolution precedence (--task, the spec, TF_CONFIG),
 * cm_addr_is_local on literals that send no traffic, and the checkpoint
 * settings (defaults, bounds, a relative dir resolved against the spec
 * file's directory), and the optimizer (every key, schedules, per-variable
 * overrides and which rule a variable gets, and their mistakes), and the input
 * limits (job.max_message_mb, job.nonfinite). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setenv, mkstemp under -std=c11 */
#endif

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "spec.h"
#include "unit.h"

#define MIN_SPEC                                                               \
  "{\"cluster\": {\"ps\": [\"127.0.0.1:7100\"],"                               \
  " \"worker\": [\"127.0.0.1:7200\", \"localhost:7201\"]}}"

static char err[8192];

/* Parses text as "t.json" into *out, returning cm_spec_parse's code. */
static int parse(const char *text, struct cm_spec **out) {
  return cm_spec_parse(text, strlen(text), "t.json", out, err, sizeof err);
}

/* Parses text, expects CM_ESPEC and no spec. */
static void parse_bad(const char *text) {
  struct cm_spec *spec = (struct cm_spec *)1;
  int rc = parse(text, &spec);

  ck_assert_msg(rc == CM_ESPEC, "rc %d (%s), err: %s", rc, cm_err_name(rc),
                err);
  ck_assert_ptr_null(spec);
}

/* Asserts err holds line as one of its lines, exactly. */
static void has_line(const char *line) {
  const char *p = err;
  size_t n = strlen(line);

  while ((p = strstr(p, line)) != NULL) {
    if ((p == err || p[-1] == '\n') && (p[n] == '\0' || p[n] == '\n'))
      return;
    p++;
  }
  ck_abort_msg("missing line\n  %s\nin err:\n%s", line, err);
}

/* Asserts err contains text somewhere. */
static void has_text(const char *text) {
  ck_assert_msg(strstr(err, text) != NULL, "missing \"%s\" in err:\n%s", text,
                err);
}

static int count_lines(const char *s) {
  int n = *s ? 1 : 0;

  for (; *s; s++)
    n += *s == '\n';
  return n;
}

START_TEST(test_minimal_defaults) {
  struct cm_spec *spec = NULL;

  ck_assert_int_eq(parse(MIN_SPEC, &spec), 0);
  ck_assert_ptr_nonnull(spec);
  ck_assert_str_eq(err, "");
  ck_assert_str_eq(spec->source, "t.json");
  ck_assert_int_eq(spec->nps, 1);
  ck_assert_str_eq(spec->ps[0].host, "127.0.0.1");
  ck_assert_int_eq(spec->ps[0].port, 7100);
  ck_assert_str_eq(spec->ps[0].text, "127.0.0.1:7100");
  ck_assert_int_eq(spec->nworker, 2);
  ck_assert_str_eq(spec->worker[1].host, "localhost");
  ck_assert_int_eq(spec->worker[1].port, 7201);
  ck_assert_int_eq(spec->task.type, CM_TASK_NONE);

  ck_assert_str_eq(spec->job.name, "psd-job");
  ck_assert_str_eq(spec->job.model, "mlp");
  ck_assert_int_eq(spec->job.nhidden, 2);
  ck_assert_int_eq(spec->job.hidden[0], 256);
  ck_assert_int_eq(spec->job.hidden[1], 128);
  ck_assert_str_eq(spec->job.data_dir, "/usr/share/datasets/fashion-mnist");
  ck_assert_int_eq(spec->job.epochs, 3);
  ck_assert_int_eq(spec->job.batch_size, 64);
  ck_assert_int_eq(spec->job.optim.def.type, CM_OPT_MOMENTUM);
  ck_assert_double_eq(spec->job.optim.def.lr, 0.05);
  ck_assert_double_eq(spec->job.optim.def.momentum, 0.9);
  ck_assert_double_eq(spec->job.optim.def.weight_decay, 0);
  ck_assert_double_eq(spec->job.optim.def.beta1, 0.9);
  ck_assert_double_eq(spec->job.optim.def.beta2, 0.999);
  ck_assert_double_eq(spec->job.optim.def.eps, 1e-8);
  ck_assert_int_eq(spec->job.optim.def.schedule.type, CM_SCHED_CONSTANT);
  ck_assert_uint_eq(spec->job.optim.def.schedule.warmup_steps, 0);
  ck_assert_int_eq(spec->job.optim.nrules, 0);
  ck_assert_double_eq(spec->job.clip_norm, 0);
  ck_assert_str_eq(spec->job.mode, "async");
  ck_assert_uint_eq(spec->job.seed, 1);
  ck_assert_int_eq(spec->job.log_every, 100);
  ck_assert_int_eq(spec->job.timeout_ms, 30000);
  ck_assert_int_eq(spec->job.max_steps, 0);
  ck_assert_int_eq(spec->job.staleness, -1);
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 2);
  ck_assert_int_eq(spec->job.min_replicas, 2);
  ck_assert_double_eq(spec->job.deadline_multiple, 3.0);
  ck_assert_int_eq(spec->job.deadline_floor_ms, 1000);
  ck_assert_int_eq(spec->job.deterministic, 0);
  ck_assert_int_eq(spec->job.heartbeat_ms, 500);
  ck_assert_int_eq(spec->job.dead_after_ms, 5000);
  ck_assert_int_eq(spec->job.unix_sockets, 1);
  ck_assert_str_eq(spec->job.ckpt_dir, "");
  ck_assert_int_eq(spec->job.ckpt_every_steps, 0);
  ck_assert_double_eq(spec->job.ckpt_every_s, 0);
  ck_assert_int_eq(spec->job.ckpt_keep, 3);
  ck_assert_int_eq(spec->job.channels[0], 16);
  ck_assert_int_eq(spec->job.channels[1], 32);
  ck_assert_double_eq(spec->job.retry_s, 120);
  cm_spec_free(spec);
}
END_TEST

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

START_TEST(test_full) {
  static const char text[] =
      "{\n"
      "  \"cluster\": {\n"
      "    \"ps\": [\"10.0.0.1:7100\", \"[::1]:7101\"],\n"
      "    \"worker\": [\"node-1.example.com:7200\", \"[fe80::1%eth0]:7201\","
      " \"10.0.0.1:7200\"]\n"
      "  },\n"
      "  \"task\": {\"type\": \"ps\", \"index\": 1},\n"
      "  \"job\": {\n"
      "    \"name\": \"fashion-mnist-mlp\", \"model\": \"mlp\",\n"
      "    \"hidden\": [512, 256, 64], \"data_dir\": \"/data/fm\",\n"
      "    \"epochs\": 7, \"batch_size\": 32,\n"
      "    \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1, \"momentum\": 0},\n"
      "    \"sync\": {\"mode\": \"async\", \"staleness\": 0},"
      " \"seed\": 12345678901,\n"
      "    \"log_every\": 10, \"rpc_timeout_ms\": 500, \"max_steps\": 40,\n"
      "    \"heartbeat_ms\": 200, \"dead_after_ms\": 201\n"
      "  }\n"
      "}\n";
  struct cm_spec *spec = NULL;

  ck_assert_msg(parse(text, &spec) == 0, "err: %s", err);
  ck_assert_int_eq(spec->nps, 2);
  ck_assert_str_eq(spec->ps[1].host, "::1");
  ck_assert_int_eq(spec->ps[1].port, 7101);
  ck_assert_str_eq(spec->ps[1].text, "[::1]:7101");
  ck_assert_int_eq(spec->nworker, 3);
  ck_assert_str_eq(spec->worker[0].host, "node-1.example.com");
  ck_assert_str_eq(spec->worker[1].host, "fe80::1%eth0");
  ck_assert_int_eq(spec->task.type, CM_TASK_PS);
  ck_assert_int_eq(spec->task.index, 1);
  ck_assert_str_eq(spec->job.name, "fashion-mnist-mlp");
  ck_assert_int_eq(spec->job.nhidden, 3);
  ck_assert_int_eq(spec->job.hidden[0], 512);
  ck_assert_int_eq(spec->job.hidden[2], 64);
  ck_assert_str_eq(spec->job.data_dir, "/data/fm");
  ck_assert_int_eq(spec->job.epochs, 7);
  ck_assert_int_eq(spec->job.batch_size, 32);
  ck_assert_int_eq(spec->job.optim.def.type, CM_OPT_SGD);
  ck_assert_double_eq(spec->job.optim.def.lr, 0.1);
  ck_assert_double_eq(spec->job.optim.def.momentum, 0.0);
  ck_assert_uint_eq(spec->job.seed, 12345678901ull);
  ck_assert_int_eq(spec->job.log_every, 10);
  ck_assert_int_eq(spec->job.timeout_ms, 500);
  ck_assert_int_eq(spec->job.max_steps, 40);
  ck_assert_str_eq(spec->job.mode, "async");
  ck_assert_int_eq(spec->job.staleness, 0);
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 3);
  ck_assert_int_eq(spec->job.min_replicas, 3);
  ck_assert_int_eq(spec->job.heartbeat_ms, 200);
  ck_assert_int_eq(spec->job.dead_after_ms, 201);
  cm_spec_free(spec);
}
END_TEST

START_TEST(test_cluster_missing) {
  parse_bad("{\"cluster\": {\"worker\": [\"127.0.0.1:7200\"]}}");
  has_line("t.json: cluster.ps: missing; expected an array of \"host:port\" "
           "strings");
  parse_bad("{\"job\": {}}");
  has_text("t.json: cluster: missing; expected an object");
  parse_bad("{\"cluster\": {\"ps\": [], \"worker\": \"127.0.0.1:7200\"}}");
  has_line("t.json: cluster.ps: empty; expected at least one \"host:port\" "
           "string");
  has_line("t.json: cluster.worker: expected an array of \"host:port\" "
           "strings, got \"127.0.0.1:7200\"");
}
END_TEST

START_TEST(test_bad_addresses) {
  parse_bad("{\"cluster\": {\"ps\": [\"127.0.0.1:7100\", \"127.0.0.1\"],"
            " \"worker\": [\"127.0.0.1:70000\", \"::1:7000\", 7000,"
            " \"[::1]\", \"[nope]:7000\", \"h:7x\", \":7000\", \"1.2.3:7\","
            " \"a b:7\", \"h:0\"]}}");
  has_line("t.json: cluster.ps[1]: \"127.0.0.1\" has no port; expected "
           "\"host:port\"");
  has_line("t.json: cluster.worker[0]: port 70000 out of range; expected "
           "1..65535");
  has_line("t.json: cluster.worker[1]: \"::1:7000\": an IPv6 address needs "
           "brackets; expected \"[host]:port\", e.g. \"[::1]:7000\"");
  has_line("t.json: cluster.worker[2]: expected a \"host:port\" string, got "
           "7000");
  has_line("t.json: cluster.worker[3]: \"[::1]\" has no port; expected "
           "\"[IPv6]:port\"");
  has_text("t.json: cluster.worker[4]: \"[nope]:7000\": \"nope\" is not an "
           "IPv6 address");
  has_line("t.json: cluster.worker[5]: \"h:7x\": port \"7x\" is not a number; "
           "expected 1..65535");
  has_line("t.json: cluster.worker[6]: \":7000\" has no host; expected "
           "\"host:port\"");
  has_text("t.json: cluster.worker[7]: \"1.2.3:7\": \"1.2.3\" is not an IPv4 "
           "address");
  has_text("t.json: cluster.worker[8]: \"a b:7\": \"a b\" is not a valid host "
           "name");
  has_line("t.json: cluster.worker[9]: port 0 out of range; expected "
           "1..65535");
  ck_assert_int_eq(count_lines(err), 11);
}
END_TEST

START_TEST(test_duplicates) {
  parse_bad("{\"cluster\": {\"ps\": [\"127.0.0.1:7100\", \"[::1]:7100\"],"
            " \"worker\": [\"127.0.0.1:7100\", \"[0:0::1]:7100\","
            " \"LOCALHOST:7000\", \"localhost:7000\"]}}");
  has_line("t.json: cluster.worker[0]: \"127.0.0.1:7100\" is also "
           "cluster.ps[0]; expected every task to have its own address");
  has_line("t.json: cluster.worker[1]: \"[0:0::1]:7100\" is also "
           "cluster.ps[1]; expected every task to have its own address");
  has_line("t.json: cluster.worker[3]: \"localhost:7000\" is also "
           "cluster.worker[2]; expected every task to have its own address");
  ck_assert_int_eq(count_lines(err), 3);
}
END_TEST

START_TEST(test_unknown_keys) {
  parse_bad("{\"clustr\": {}, \"cluster\": {\"ps\": [\"h:1\"], \"worker\":"
            " [\"h:2\"], \"chief\": [\"h:3\"]}, \"job\": {\"optimizr\": {},"
            " \"optimizer\": {\"typ\": \"sgd\"}, \"sync\": {\"mode\":"
            " \"async\", \"stalenes\": 2, \"lag\": 1}, \"zzz\": 1}}");
  has_line("t.json: clustr: unknown key (did you mean cluster?); expected one "
           "of cluster, task, job, auth");
  has_line("t.json: cluster.chief: unknown key; expected one of ps, worker");
  has_line("t.json: job.optimizr: unknown key (did you mean optimizer?); "
           "expected one of name, model, hidden, data_dir, epochs, "
           "batch_size, optimizer, sync, seed, log_every, rpc_timeout_ms, "
           "max_steps, heartbeat_ms, dead_after_ms, unix_sockets, checkpoint, "
           "optimizer_overrides, channels, max_message_mb, nonfinite, "
           "retry_s");
  has_line("t.json: job.optimizer.typ: unknown key (did you mean type?); "
           "expected one of type, lr, momentum, weight_decay, beta1, beta2, "
           "eps, schedule, clip_norm");
  has_line("t.json: job.sync.stalenes: unknown key (did you mean staleness?); "
           "expected one of mode, staleness, replicas_to_aggregate, "
           "min_replicas, deadline, deterministic");
  has_text("t.json: job.sync.lag: unknown key; expected one of mode, ");
  has_text("t.json: job.zzz: unknown key; expected one of name,");
  ck_assert_int_eq(count_lines(err), 7);
}
END_TEST

START_TEST(test_wrong_types) {
  parse_bad(
      "{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
      " \"job\": {\"epochs\": \"3\", \"batch_size\": 0,"
      " \"hidden\": [64, 0, 2.5], \"model\": \"rnn\","
      " \"name\": \"my job\", \"data_dir\": \"\","
      " \"optimizer\": {\"type\": \"rmsprop\", \"lr\": 0, \"momentum\": 1},"
      " \"sync\": {\"mode\": \"bsp\"}, \"seed\": -1,"
      " \"log_every\": 0, \"rpc_timeout_ms\": 3.0, \"max_steps\": -5}}");
  has_line("t.json: job.epochs: expected a positive integer, got \"3\"");
  has_line("t.json: job.batch_size: expected a positive integer, got 0");
  has_line("t.json: job.hidden[1]: expected a positive integer, got 0");
  has_line("t.json: job.hidden[2]: expected a positive integer, got 2.5");
  has_line("t.json: job.model: expected \"softmax\", \"mlp\" or \"cnn\", got "
           "\"rnn\"");
  has_text("t.json: job.name: \"my job\" has a character other than");
  has_line("t.json: job.data_dir: empty; expected a non-empty string");
  has_line("t.json: job.optimizer.type: expected \"sgd\", \"momentum\", "
           "\"nesterov\", \"adagrad\", \"adam\" or \"adamw\", got \"rmsprop\"");
  has_line("t.json: job.optimizer.lr: expected a positive number, got 0");
  has_line("t.json: job.optimizer.momentum: expected a number in [0, 1), got "
           "1");
  has_line("t.json: job.sync.mode: expected \"async\" or \"sync\", got "
           "\"bsp\"");
  has_line("t.json: job.seed: expected a non-negative integer, got -1");
  has_line("t.json: job.log_every: expected a positive integer, got 0");
  has_line("t.json: job.rpc_timeout_ms: expected a positive integer, got "
           "3.0");
  has_line("t.json: job.max_steps: expected a non-negative integer, got -5");
  ck_assert_int_eq(count_lines(err), 15);

  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"job\": {\"hidden\": [], \"epochs\": 99999999999,"
            " \"optimizer\": \"sgd\"}}");
  has_line("t.json: job.hidden: empty; expected 1..16 positive integers");
  has_line("t.json: job.epochs: 99999999999 out of range; expected a positive "
           "integer up to 2147483647");
  has_text("t.json: job.optimizer: expected an object like");
  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"job\": {\"hidden\": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}}");
  has_line("t.json: job.hidden: 17 entries; expected at most 16");
}
END_TEST

START_TEST(test_task_in_spec) {
  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\", "
            "\"h:3\"]}, \"task\": {\"type\": \"worker\", \"index\": 5}}");
  has_line("t.json: task.index: 5 out of range; cluster.worker has 2 entries");
  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"task\": {\"type\": \"chief\", \"index\": -1, \"x\": 0}}");
  has_line("t.json: task.type: expected \"ps\" or \"worker\", got \"chief\"");
  has_line("t.json: task.index: expected a non-negative integer, got -1");
  has_line("t.json: task.x: unknown key; expected one of type, index");
  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"task\": {}}");
  has_line("t.json: task.type: missing; expected \"ps\" or \"worker\"");
  has_line("t.json: task.index: missing; expected a non-negative integer");
}
END_TEST

/* Several mistakes in different places, all reported, one per line. */
START_TEST(test_many_mistakes) {
  parse_bad("{\"cluster\": {\"ps\": [\"127.0.0.1\"], \"worker\":"
            " [\"127.0.0.1:70000\", \"127.0.0.1:7200\"]},"
            " \"task\": {\"type\": \"worker\", \"index\": 5},"
            " \"job\": {\"optimizr\": {}, \"epochs\": \"3\"}, \"extra\": 1}");
  has_line(
      "t.json: extra: unknown key; expected one of cluster, task, job, auth");
  has_line("t.json: cluster.ps[0]: \"127.0.0.1\" has no port; expected "
           "\"host:port\"");
  has_line("t.json: cluster.worker[0]: port 70000 out of range; expected "
           "1..65535");
  has_line("t.json: task.index: 5 out of range; cluster.worker has 2 entries");
  has_text("t.json: job.optimizr: unknown key (did you mean optimizer?); "
           "expected one of name, model, hidden, ");
  has_line("t.json: job.epochs: expected a positive integer, got \"3\"");
  ck_assert_int_eq(count_lines(err), 6);
}
END_TEST

START_TEST(test_syntax_error) {
  parse_bad("{\n  \"cluster\": {\n    \"ps\": [\"h:1\",]\n  }\n}\n");
  ck_assert_msg(strncmp(err, "t.json:3:", 9) == 0, "err: %s", err);
  has_text(": JSON syntax error: ");
  ck_assert_int_eq(count_lines(err), 1);

  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},\n"
            " \"cluster\": {}}");
  ck_assert_msg(strncmp(err, "t.json:2:", 9) == 0, "err: %s", err);
  has_text("duplicate");

  parse_bad("");
  has_text("t.json:");
  has_text("JSON syntax error");

  parse_bad("[1, 2]");
  has_line("t.json: expected a JSON object with \"cluster\" at the top level, "
           "got an array");
}
END_TEST

START_TEST(test_truncation) {
  static const char text[] =
      "{\"cluster\": {\"ps\": [\"a\", \"b\", \"c\", \"d\"], \"worker\": "
      "[\"e\", \"f\"]}}";
  struct cm_spec *spec = (struct cm_spec *)1;
  char small[100];
  size_t i;

  ck_assert_int_eq(
      cm_spec_parse(text, strlen(text), "t.json", &spec, small, sizeof small),
      CM_ESPEC);
  ck_assert_ptr_null(spec);
  ck_assert_uint_lt(strlen(small), sizeof small);
  ck_assert_msg(strstr(small, "more not shown)") != NULL, "small: %s", small);
  ck_assert_msg(
      strncmp(small, "t.json: cluster.ps[0]: \"a\" has no port", 38) == 0,
      "small: %s", small);

  /* Every size from nothing up keeps the buffer terminated. */
  for (i = 1; i < sizeof small; i++) {
    memset(small, 'X', sizeof small);
    ck_assert_int_eq(
        cm_spec_parse(text, strlen(text), "t.json", &spec, small, i), CM_ESPEC);
    ck_assert_uint_lt(strlen(small), i);
  }
  ck_assert_int_eq(cm_spec_parse(text, strlen(text), "t.json", &spec, NULL, 0),
                   CM_ESPEC);
  ck_assert_ptr_null(spec);
}
END_TEST

START_TEST(test_load) {
  char path[] = "/tmp/test-spec-XXXXXX";
  struct cm_spec *spec = NULL;
  char want[128];
  FILE *f;
  int fd;

  fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  f = fdopen(fd, "w");
  ck_assert_ptr_nonnull(f);
  fputs(MIN_SPEC, f);
  fclose(f);
  ck_assert_msg(cm_spec_load(path, &spec, err, sizeof err) == 0, "err: %s",
                err);
  ck_assert_str_eq(spec->source, path);
  ck_assert_int_eq(spec->nworker, 2);
  cm_spec_free(spec);
  spec = NULL;

  f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs("{\"cluster\": {\"ps\": [\"h\"], \"worker\": [\"h:1\"]}}", f);
  fclose(f);
  ck_assert_int_eq(cm_spec_load(path, &spec, err, sizeof err), CM_ESPEC);
  ck_assert_ptr_null(spec);
  snprintf(want, sizeof want, "%s: cluster.ps[0]: \"h\" has no port", path);
  has_text(want);
  unlink(path);

  ck_assert_int_eq(cm_spec_load(path, &spec, err, sizeof err), CM_ENOENT);
  ck_assert_ptr_null(spec);
  snprintf(want, sizeof want, "%s: No such file or directory", path);
  ck_assert_str_eq(err, want);

  ck_assert_int_eq(cm_spec_load("/tmp", &spec, err, sizeof err), CM_EIO);
  ck_assert_str_eq(err, "/tmp: Is a directory");
}
END_TEST

START_TEST(test_task_parse) {
  struct cm_task t;

  ck_assert_int_eq(cm_task_parse("ps:1", &t, err, sizeof err), 0);
  ck_assert_int_eq(t.type, CM_TASK_PS);
  ck_assert_int_eq(t.index, 1);
  ck_assert_int_eq(cm_task_parse("worker:0", &t, err, sizeof err), 0);
  ck_assert_int_eq(t.type, CM_TASK_WORKER);
  ck_assert_int_eq(t.index, 0);

  ck_assert_int_eq(cm_task_parse("worker", &t, err, sizeof err), CM_EINVAL);
  ck_assert_str_eq(err, "--task \"worker\": expected TYPE:INDEX, e.g. "
                        "worker:0");
  ck_assert_int_eq(cm_task_parse("chief:0", &t, err, sizeof err), CM_EINVAL);
  ck_assert_str_eq(err, "--task \"chief:0\": unknown type \"chief\"; expected "
                        "ps or worker");
  ck_assert_int_eq(cm_task_parse("ps:-1", &t, err, sizeof err), CM_EINVAL);
  ck_assert_str_eq(err, "--task \"ps:-1\": index \"-1\" is not a non-negative "
                        "integer");
  ck_assert_int_eq(cm_task_parse("ps:", &t, err, sizeof err), CM_EINVAL);
  ck_assert_int_eq(cm_task_parse("ps:99999999999", &t, err, sizeof err),
                   CM_EINVAL);
  has_text("index out of range");

  ck_assert_str_eq(cm_task_type_name(CM_TASK_PS), "ps");
  ck_assert_str_eq(cm_task_type_name(CM_TASK_WORKER), "worker");
}
END_TEST

#define TWO_WORKERS                                                            \
  "\"cluster\": {\"ps\": [\"h:1\", \"h:2\"], \"worker\": [\"h:3\", \"h:4\"]}"

START_TEST(test_resolve_precedence) {
  struct cm_spec *with = NULL, *without = NULL;

  ck_assert_int_eq(parse("{" TWO_WORKERS ", \"task\": {\"type\": \"worker\","
                         " \"index\": 1}}",
                         &with),
                   0);
  ck_assert_int_eq(parse("{" TWO_WORKERS "}", &without), 0);
  setenv("TF_CONFIG",
         "{\"cluster\": {\"chief\": [\"x:1\"]}, \"task\": {\"type\": \"ps\","
         " \"index\": 0, \"trial\": \"7\"}}",
         1);

  /* --task beats the spec and TF_CONFIG. */
  ck_assert_int_eq(cm_spec_resolve_task(with, "ps:1", err, sizeof err), 0);
  ck_assert_int_eq(with->task.type, CM_TASK_PS);
  ck_assert_int_eq(with->task.index, 1);

  /* The spec's "task" beats TF_CONFIG. */
  with->task.type = CM_TASK_WORKER;
  with->task.index = 1;
  ck_assert_int_eq(cm_spec_resolve_task(with, NULL, err, sizeof err), 0);
  ck_assert_int_eq(with->task.type, CM_TASK_WORKER);
  ck_assert_int_eq(with->task.index, 1);

  /* TF_CONFIG is the last resort. */
  ck_assert_msg(cm_spec_resolve_task(without, NULL, err, sizeof err) == 0,
                "err: %s", err);
  ck_assert_int_eq(without->task.type, CM_TASK_PS);
  ck_assert_int_eq(without->task.index, 0);

  unsetenv("TF_CONFIG");
  cm_spec_free(with);
  cm_spec_free(without);
}
END_TEST

START_TEST(test_resolve_errors) {
  struct cm_spec *spec = NULL;

  unsetenv("TF_CONFIG");
  ck_assert_int_eq(parse("{" TWO_WORKERS "}", &spec), 0);

  ck_assert_int_eq(cm_spec_resolve_task(spec, NULL, err, sizeof err), CM_ESPEC);
  ck_assert_str_eq(err, "no task given: pass --task TYPE:INDEX, set \"task\" "
                        "in t.json, or TF_CONFIG");
  ck_assert_int_eq(spec->task.type, CM_TASK_NONE);

  ck_assert_int_eq(cm_spec_resolve_task(spec, "worker:5", err, sizeof err),
                   CM_ESPEC);
  ck_assert_str_eq(err, "--task \"worker:5\": index 5 out of range; "
                        "cluster.worker has 2 entries");
  ck_assert_int_eq(spec->task.type, CM_TASK_NONE);

  ck_assert_int_eq(cm_spec_resolve_task(spec, "boss:1", err, sizeof err),
                   CM_ESPEC);
  has_text("--task \"boss:1\": unknown type");

  setenv("TF_CONFIG", "{\"task\": {\"type\": \"worker\", ", 1);
  ck_assert_int_eq(cm_spec_resolve_task(spec, NULL, err, sizeof err), CM_ESPEC);
  ck_assert_msg(strncmp(err, "TF_CONFIG:1:", 12) == 0, "err: %s", err);
  has_text("JSON syntax error");

  setenv("TF_CONFIG", "{\"task\": {\"type\": \"worker\", \"index\": 2}}", 1);
  ck_assert_int_eq(cm_spec_resolve_task(spec, NULL, err, sizeof err), CM_ESPEC);
  ck_assert_str_eq(err, "TF_CONFIG: task.index: 2 out of range; "
                        "cluster.worker has 2 entries");

  setenv("TF_CONFIG", "{\"task\": {\"type\": \"chief\", \"index\": 0}}", 1);
  ck_assert_int_eq(cm_spec_resolve_task(spec, NULL, err, sizeof err), CM_ESPEC);
  ck_assert_str_eq(err, "TF_CONFIG: task.type: expected \"ps\" or "
                        "\"worker\", got \"chief\"");

  setenv("TF_CONFIG", "{\"cluster\": {}}", 1);
  ck_assert_int_eq(cm_spec_resolve_task(spec, NULL, err, sizeof err), CM_ESPEC);
  has_text("no task given");
  has_text("(TF_CONFIG has no \"task\")");

  /* A --task makes TF_CONFIG irrelevant, even a broken one. */
  setenv("TF_CONFIG", "not json", 1);
  ck_assert_int_eq(cm_spec_resolve_task(spec, "ps:1", err, sizeof err), 0);
  ck_assert_int_eq(spec->task.type, CM_TASK_PS);
  ck_assert_int_eq(spec->task.index, 1);

  unsetenv("TF_CONFIG");
  cm_spec_free(spec);
}
END_TEST

/* Builds an address the way the parser would, without a spec. */
static int is_local(const char *host) {
  struct cm_addr a;

  memset(&a, 0, sizeof a);
  snprintf(a.host, sizeof a.host, "%s", host);
  a.port = 7000;
  return cm_addr_is_local(&a);
}

START_TEST(test_addr_is_local) {
  char me[256];

  ck_assert_int_eq(is_local("127.0.0.1"), 1);
  ck_assert_int_eq(is_local("127.1.2.3"), 1);
  ck_assert_int_eq(is_local("localhost"), 1);
  ck_assert_int_eq(is_local("LocalHost."), 1);
  ck_assert_int_eq(is_local("::1"), 1);
  ck_assert_int_eq(is_local("::ffff:127.0.0.1"), 1);
  /* TEST-NET-1 and the IPv6 documentation prefix belong to no host. */
  ck_assert_int_eq(is_local("192.0.2.1"), 0);
  ck_assert_int_eq(is_local("2001:db8::1"), 0);
  ck_assert_int_eq(is_local(""), 0);
  ck_assert_int_eq(cm_addr_is_local(NULL), 0);
  if (gethostname(me, sizeof me) == 0) {
    me[sizeof me - 1] = '\0';
    ck_assert_int_eq(is_local(me), 1);
  }
}
END_TEST

/* A spec with four workers and the given text inside "job": {...}. */
#define FOUR_WORKERS(job)                                                      \
  "{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\", \"h:3\", \"h:4\","  \
  " \"h:5\"]}, \"job\": {" job "}}"

START_TEST(test_sync_defaults) {
  struct cm_spec *spec = NULL;

  /* Sync mode alone: k is every worker, m is k, the rest their defaults. */
  ck_assert_msg(parse(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\"}"), &spec) ==
                    0,
                "err: %s", err);
  ck_assert_str_eq(spec->job.mode, "sync");
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 4);
  ck_assert_int_eq(spec->job.min_replicas, 4);
  ck_assert_double_eq(spec->job.deadline_multiple, 3.0);
  ck_assert_int_eq(spec->job.deadline_floor_ms, 1000);
  ck_assert_int_eq(spec->job.deterministic, 0);
  ck_assert_int_eq(spec->job.staleness, -1);
  ck_assert_int_eq(spec->job.heartbeat_ms, 500);
  ck_assert_int_eq(spec->job.dead_after_ms, 5000);
  cm_spec_free(spec);
  spec = NULL;

  /* m follows a given k. */
  ck_assert_msg(parse(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\","
                                   " \"replicas_to_aggregate\": 3}"),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 3);
  ck_assert_int_eq(spec->job.min_replicas, 3);
  cm_spec_free(spec);
  spec = NULL;

  /* A partial deadline keeps the other half's default. */
  ck_assert_msg(parse(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\","
                                   " \"deadline\": {\"floor_ms\": 1}}"),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_double_eq(spec->job.deadline_multiple, 3.0);
  ck_assert_int_eq(spec->job.deadline_floor_ms, 1);
  cm_spec_free(spec);
  spec = NULL;

  /* Async, explicitly and by default: unbounded staleness, k and m filled. */
  ck_assert_msg(parse(FOUR_WORKERS("\"sync\": {\"mode\": \"async\"}"), &spec) ==
                    0,
                "err: %s", err);
  ck_assert_str_eq(spec->job.mode, "async");
  ck_assert_int_eq(spec->job.staleness, -1);
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 4);
  ck_assert_int_eq(spec->job.min_replicas, 4);
  cm_spec_free(spec);
  spec = NULL;
  ck_assert_msg(parse(FOUR_WORKERS("\"sync\": {\"staleness\": 3}"), &spec) == 0,
                "err: %s", err);
  ck_assert_str_eq(spec->job.mode, "async");
  ck_assert_int_eq(spec->job.staleness, 3);
  cm_spec_free(spec);
}
END_TEST

START_TEST(test_sync_full) {
  static const char text[] =
      "{\"cluster\": {\"ps\": [\"h:1\", \"h:2\"],"
      " \"worker\": [\"h:3\", \"h:4\", \"h:5\", \"h:6\"]},\n"
      " \"job\": {\"sync\": {\"mode\": \"sync\", \"replicas_to_aggregate\": 3,"
      " \"min_replicas\": 2,\n"
      "   \"deadline\": {\"multiple\": 2.5, \"floor_ms\": 250},"
      " \"deterministic\": true},\n"
      "  \"heartbeat_ms\": 100, \"dead_after_ms\": 1000}}\n";
  struct cm_spec *spec = NULL;

  ck_assert_msg(parse(text, &spec) == 0, "err: %s", err);
  ck_assert_str_eq(err, "");
  ck_assert_str_eq(spec->job.mode, "sync");
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 3);
  ck_assert_int_eq(spec->job.min_replicas, 2);
  ck_assert_double_eq(spec->job.deadline_multiple, 2.5);
  ck_assert_int_eq(spec->job.deadline_floor_ms, 250);
  ck_assert_int_eq(spec->job.deterministic, 1);
  ck_assert_int_eq(spec->job.staleness, -1);
  ck_assert_int_eq(spec->job.heartbeat_ms, 100);
  ck_assert_int_eq(spec->job.dead_after_ms, 1000);
  cm_spec_free(spec);
  spec = NULL;

  /* The edges: k = n, m = k = 1 of one worker, an integer multiple,
   * deterministic false. */
  ck_assert_msg(parse(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\","
                                   " \"replicas_to_aggregate\": 4,"
                                   " \"min_replicas\": 4, \"deadline\":"
                                   " {\"multiple\": 1}, \"deterministic\":"
                                   " false}"),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 4);
  ck_assert_int_eq(spec->job.min_replicas, 4);
  ck_assert_double_eq(spec->job.deadline_multiple, 1.0);
  ck_assert_int_eq(spec->job.deterministic, 0);
  cm_spec_free(spec);
  spec = NULL;
  ck_assert_msg(parse("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\":"
                      " [\"h:2\"]}, \"job\": {\"sync\": {\"mode\": \"sync\","
                      " \"replicas_to_aggregate\": 1, \"min_replicas\": 1}}}",
                      &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 1);
  ck_assert_int_eq(spec->job.min_replicas, 1);
  cm_spec_free(spec);
}
END_TEST

/* Settings of the other mode are mistakes, whether the mode is written or
 * defaulted. */
START_TEST(test_sync_wrong_mode) {
  parse_bad(FOUR_WORKERS("\"sync\": {\"replicas_to_aggregate\": 3,"
                         " \"min_replicas\": 2, \"deadline\": {},"
                         " \"deterministic\": true}"));
  has_line("t.json: job.sync.replicas_to_aggregate: only meaningful with "
           "\"mode\": \"sync\"");
  has_line("t.json: job.sync.min_replicas: only meaningful with \"mode\": "
           "\"sync\"");
  has_line("t.json: job.sync.deadline: only meaningful with \"mode\": "
           "\"sync\"");
  has_line("t.json: job.sync.deterministic: only meaningful with \"mode\": "
           "\"sync\"");
  ck_assert_int_eq(count_lines(err), 4);

  /* The value is not judged as well: one line per key. */
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"async\", \"min_replicas\":"
                         " 0, \"deadline\": 7}"));
  has_line("t.json: job.sync.min_replicas: only meaningful with \"mode\": "
           "\"sync\"");
  has_line("t.json: job.sync.deadline: only meaningful with \"mode\": "
           "\"sync\"");
  ck_assert_int_eq(count_lines(err), 2);

  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"staleness\": 2}"));
  ck_assert_str_eq(err, "t.json: job.sync.staleness: only meaningful with "
                        "\"mode\": \"async\"");

  /* With the mode itself wrong, each setting is judged on its own. */
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"bsp\", \"staleness\": -1,"
                         " \"replicas_to_aggregate\": 2, \"min_replicas\":"
                         " 0}"));
  has_line("t.json: job.sync.mode: expected \"async\" or \"sync\", got "
           "\"bsp\"");
  has_line("t.json: job.sync.staleness: expected a non-negative integer, got "
           "-1");
  has_line("t.json: job.sync.min_replicas: expected a positive integer, got "
           "0");
  ck_assert_int_eq(count_lines(err), 3);
}
END_TEST

START_TEST(test_sync_bounds) {
  parse_bad(FOUR_WORKERS(
      "\"sync\": {\"mode\": \"sync\", \"replicas_to_aggregate\": 5}"));
  ck_assert_str_eq(err, "t.json: job.sync.replicas_to_aggregate: 5 is more "
                        "than the 4 workers in cluster.worker");
  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"job\": {\"sync\": {\"mode\": \"sync\","
            " \"replicas_to_aggregate\": 2}}}");
  ck_assert_str_eq(err, "t.json: job.sync.replicas_to_aggregate: 2 is more "
                        "than the 1 worker in cluster.worker");
  parse_bad(FOUR_WORKERS(
      "\"sync\": {\"mode\": \"sync\", \"replicas_to_aggregate\": 0}"));
  ck_assert_str_eq(err, "t.json: job.sync.replicas_to_aggregate: expected a "
                        "positive integer, got 0");
  parse_bad(FOUR_WORKERS(
      "\"sync\": {\"mode\": \"sync\", \"replicas_to_aggregate\": \"all\"}"));
  ck_assert_str_eq(err, "t.json: job.sync.replicas_to_aggregate: expected a "
                        "positive integer, got \"all\"");

  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\","
                         " \"replicas_to_aggregate\": 3, \"min_replicas\":"
                         " 4}"));
  ck_assert_str_eq(err, "t.json: job.sync.min_replicas: 4 is more than "
                        "replicas_to_aggregate (3)");
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"min_replicas\":"
                         " 5}"));
  ck_assert_str_eq(err, "t.json: job.sync.min_replicas: 5 is more than "
                        "replicas_to_aggregate (4, by default the number of "
                        "workers)");
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"min_replicas\":"
                         " 0}"));
  ck_assert_str_eq(err, "t.json: job.sync.min_replicas: expected a positive "
                        "integer, got 0");
  /* A wrong k is reported once; m is not compared with it. */
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\","
                         " \"replicas_to_aggregate\": 9, \"min_replicas\":"
                         " 6}"));
  ck_assert_str_eq(err, "t.json: job.sync.replicas_to_aggregate: 9 is more "
                        "than the 4 workers in cluster.worker");

  parse_bad(FOUR_WORKERS("\"sync\": {\"staleness\": -1}"));
  ck_assert_str_eq(err, "t.json: job.sync.staleness: expected a non-negative "
                        "integer, got -1");
  parse_bad(FOUR_WORKERS("\"sync\": {\"staleness\": 1.5}"));
  ck_assert_str_eq(err, "t.json: job.sync.staleness: expected a non-negative "
                        "integer, got 1.5");
}
END_TEST

START_TEST(test_sync_deadline_deterministic) {
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deadline\": 3}"));
  ck_assert_str_eq(err, "t.json: job.sync.deadline: expected an object like "
                        "{\"multiple\": 3.0, \"floor_ms\": 1000}, got 3");
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deadline\":"
                         " {\"multiple\": 0, \"floor_ms\": 0, \"flor_ms\": 5,"
                         " \"max_ms\": 9}}"));
  has_line("t.json: job.sync.deadline.multiple: expected a positive number, "
           "got 0");
  has_line("t.json: job.sync.deadline.floor_ms: expected a positive integer, "
           "got 0");
  has_line("t.json: job.sync.deadline.flor_ms: unknown key (did you mean "
           "floor_ms?); expected one of multiple, floor_ms");
  has_line("t.json: job.sync.deadline.max_ms: unknown key; expected one of "
           "multiple, floor_ms");
  ck_assert_int_eq(count_lines(err), 4);
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deadline\":"
                         " {\"multiple\": -2.5, \"floor_ms\": 10.5}}"));
  has_line("t.json: job.sync.deadline.multiple: expected a positive number, "
           "got -2.5");
  has_line("t.json: job.sync.deadline.floor_ms: expected a positive integer, "
           "got 10.5");
  ck_assert_int_eq(count_lines(err), 2);
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deadline\":"
                         " {\"multiple\": \"3\"}}"));
  ck_assert_str_eq(err, "t.json: job.sync.deadline.multiple: expected a "
                        "positive number, got \"3\"");

  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deterministic\":"
                         " 1}"));
  ck_assert_str_eq(err, "t.json: job.sync.deterministic: expected true or "
                        "false, got 1");
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deterministic\":"
                         " \"true\"}"));
  ck_assert_str_eq(err, "t.json: job.sync.deterministic: expected true or "
                        "false, got \"true\"");
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deterministic\":"
                         " null}"));
  ck_assert_str_eq(err, "t.json: job.sync.deterministic: expected true or "
                        "false, got null");
}
END_TEST

START_TEST(test_liveness) {
  struct cm_spec *spec = NULL;

  parse_bad(FOUR_WORKERS("\"heartbeat_ms\": 500, \"dead_after_ms\": 500"));
  ck_assert_str_eq(err, "t.json: job.dead_after_ms: 500 is not more than "
                        "job.heartbeat_ms (500); expected a longer silence, "
                        "e.g. 5000 (10 heartbeats)");
  parse_bad(FOUR_WORKERS("\"dead_after_ms\": 400"));
  ck_assert_str_eq(err, "t.json: job.dead_after_ms: 400 is not more than "
                        "job.heartbeat_ms (500, the default); expected a "
                        "longer silence, e.g. 5000 (10 heartbeats)");
  parse_bad(FOUR_WORKERS("\"heartbeat_ms\": 6000"));
  ck_assert_str_eq(err, "t.json: job.heartbeat_ms: 6000 is not less than "
                        "job.dead_after_ms (5000, the default); expected "
                        "less, or set job.dead_after_ms, e.g. to 60000 (10 "
                        "heartbeats)");
  /* A wrong value is reported alone, not compared as well. */
  parse_bad(FOUR_WORKERS("\"heartbeat_ms\": 0, \"dead_after_ms\": -1"));
  has_line("t.json: job.heartbeat_ms: expected a positive integer, got 0");
  has_line("t.json: job.dead_after_ms: expected a positive integer, got -1");
  ck_assert_int_eq(count_lines(err), 2);
  parse_bad(FOUR_WORKERS("\"heartbeat_ms\": 2147483647, \"dead_after_ms\":"
                         " 1000"));
  has_text("e.g. 2147483647 (10 heartbeats)");

  ck_assert_msg(parse(FOUR_WORKERS("\"heartbeat_ms\": 4999"), &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.heartbeat_ms, 4999);
  ck_assert_int_eq(spec->job.dead_after_ms, 5000);
  cm_spec_free(spec);
}
END_TEST

/* Misspelt new keys get a hint; every sync mistake comes out at once. */
START_TEST(test_sync_many_mistakes) {
  parse_bad(
      FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"replica_to_aggregate\":"
                   " 2, \"min_replica\": 1, \"staleness\": 1,"
                   " \"deadline\": {\"multiple\": 0}, \"deterministic\":"
                   " \"yes\"}, \"heartbeat_msec\": 100, \"dead_after\":"
                   " 1, \"heartbeat_ms\": 900, \"dead_after_ms\": 800"));
  has_text("t.json: job.sync.replica_to_aggregate: unknown key (did you mean "
           "replicas_to_aggregate?); expected one of mode, ");
  has_text("t.json: job.sync.min_replica: unknown key (did you mean "
           "min_replicas?); expected one of mode, ");
  has_text("t.json: job.heartbeat_msec: unknown key (did you mean "
           "heartbeat_ms?); expected one of name, ");
  has_text("t.json: job.dead_after: unknown key; expected one of name, ");
  has_line("t.json: job.sync.staleness: only meaningful with \"mode\": "
           "\"async\"");
  has_line("t.json: job.sync.deadline.multiple: expected a positive number, "
           "got 0");
  has_line("t.json: job.sync.deterministic: expected true or false, got "
           "\"yes\"");
  has_line("t.json: job.dead_after_ms: 800 is not more than job.heartbeat_ms "
           "(900); expected a longer silence, e.g. 9000 (10 heartbeats)");
  ck_assert_int_eq(count_lines(err), 8);

  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\","
                         " \"replicas_to_aggregate\": 5, \"min_replicas\": 0,"
                         " \"deterministic\": 0}, \"dead_after_ms\": 10"));
  has_line("t.json: job.sync.replicas_to_aggregate: 5 is more than the 4 "
           "workers in cluster.worker");
  has_line("t.json: job.sync.min_replicas: expected a positive integer, got "
           "0");
  has_line("t.json: job.sync.deterministic: expected true or false, got 0");
  has_text("t.json: job.dead_after_ms: 10 is not more than job.heartbeat_ms "
           "(500, the default)");
  ck_assert_int_eq(count_lines(err), 4);

  parse_bad(FOUR_WORKERS("\"sync\": \"sync\""));
  ck_assert_str_eq(err, "t.json: job.sync: expected an object like "
                        "{\"mode\": \"sync\", \"replicas_to_aggregate\": 2}, "
                        "got \"sync\"");
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

/* A one-worker spec with the given text inside "job": {...}. */
#define ONE_WORKER(job)                                                        \
  "{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]}, \"job\": {" job   \
  "}}"

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

/* cm_spec_load resolves a relative dir against the spec file's directory,
 * and leaves an absolute one alone. */
START_TEST(test_checkpoint_dir_relative_to_spec) {
  char dir[] = "/tmp/test-spec-dir-XXXXXX", path[256], want[512];
  struct cm_spec *spec = NULL;
  FILE *f;

  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/job.json", dir);
  f = fopen(path, "w");
  fputs(ONE_WORKER("\"checkpoint\": {\"dir\": \"state/ck\"}"), f);
  fclose(f);
  ck_assert_msg(cm_spec_load(path, &spec, err, sizeof err) == 0, "err: %s",
                err);
  snprintf(want, sizeof want, "%s/state/ck", dir);
  ck_assert_str_eq(spec->job.ckpt_dir, want);
  cm_spec_free(spec);
  spec = NULL;

  /* A relative spec path: still the spec's directory, made absolute. */
  ck_assert_int_eq(chdir("/tmp"), 0);
  ck_assert_msg(cm_spec_load(path + 5, &spec, err, sizeof err) == 0, "err: %s",
                err);
  ck_assert_str_eq(spec->job.ckpt_dir, want);
  cm_spec_free(spec);
  spec = NULL;

  f = fopen(path, "w");
  fputs(ONE_WORKER("\"checkpoint\": {\"dir\": \"/srv/ck\"}"), f);
  fclose(f);
  ck_assert_msg(cm_spec_load(path, &spec, err, sizeof err) == 0, "err: %s",
                err);
  ck_assert_str_eq(spec->job.ckpt_dir, "/srv/ck");
  cm_spec_free(spec);
  unlink(path);
  rmdir(dir);
}
END_TEST

/* Every optimizer key, a schedule, clipping and two overrides; which rule
 * each variable gets. */
START_TEST(test_optimizer_full) {
  struct cm_spec *spec = NULL;
  const struct cm_optim *o;
  int rule;

  ck_assert_msg(
      parse(ONE_WORKER(
                "\"optimizer\": {\"type\": \"adamw\", \"lr\": 0.002,"
                " \"weight_decay\": 0.01, \"beta1\": 0.8, \"beta2\": 0.99,"
                " \"eps\": 1e-6, \"clip_norm\": 5,"
                " \"schedule\": {\"type\": \"cosine\", \"warmup_steps\": 10,"
                " \"total_steps\": 1000, \"min_lr\": 0.0001}},"
                " \"optimizer_overrides\": {"
                " \"*/bias\": {\"weight_decay\": 0},"
                " \"dense0/bias\": {\"type\": \"nesterov\", \"lr\": 0.1,"
                " \"momentum\": 0.5, \"schedule\": {\"type\": \"step\","
                " \"decay_every\": 100, \"gamma\": 0.5}}}"),
            &spec) == 0,
      "err: %s", err);
  o = &spec->job.optim.def;
  ck_assert_int_eq(o->type, CM_OPT_ADAMW);
  ck_assert_double_eq(o->lr, 0.002);
  ck_assert_double_eq(o->weight_decay, 0.01);
  ck_assert_double_eq(o->beta1, 0.8);
  ck_assert_double_eq(o->beta2, 0.99);
  ck_assert_double_eq(o->eps, 1e-6);
  ck_assert_double_eq(o->momentum, 0.9); /* default, unused */
  ck_assert_int_eq(o->schedule.type, CM_SCHED_COSINE);
  ck_assert_uint_eq(o->schedule.warmup_steps, 10);
  ck_assert_uint_eq(o->schedule.total_steps, 1000);
  ck_assert_double_eq(o->schedule.min_lr, 0.0001);
  ck_assert_double_eq(spec->job.clip_norm, 5);
  ck_assert_int_eq(spec->job.optim.nrules, 2);

  /* An override starts from the job's optimizer and keeps its schedule. */
  o = cm_optim_pick(&spec->job.optim, "dense1/bias", &rule);
  ck_assert_int_eq(rule, 0);
  ck_assert_str_eq(spec->job.optim.rules[0].pattern, "*/bias");
  ck_assert_int_eq(o->type, CM_OPT_ADAMW);
  ck_assert_double_eq(o->weight_decay, 0);
  ck_assert_double_eq(o->lr, 0.002);
  ck_assert_double_eq(o->beta1, 0.8);
  ck_assert_int_eq(o->schedule.type, CM_SCHED_COSINE);
  /* An exact name beats an earlier glob; its schedule replaces the job's
   * whole (no warm-up left over). */
  o = cm_optim_pick(&spec->job.optim, "dense0/bias", &rule);
  ck_assert_int_eq(rule, 1);
  ck_assert_int_eq(o->type, CM_OPT_NESTEROV);
  ck_assert_double_eq(o->lr, 0.1);
  ck_assert_double_eq(o->momentum, 0.5);
  ck_assert_double_eq(o->weight_decay, 0.01);
  ck_assert_int_eq(o->schedule.type, CM_SCHED_STEP);
  ck_assert_uint_eq(o->schedule.decay_every, 100);
  ck_assert_double_eq(o->schedule.gamma, 0.5);
  ck_assert_uint_eq(o->schedule.warmup_steps, 0);
  /* No rule: the job's. */
  o = cm_optim_pick(&spec->job.optim, "dense0/kernel", &rule);
  ck_assert_int_eq(rule, -1);
  ck_assert_ptr_eq(o, &spec->job.optim.def);
  cm_spec_free(spec);
  spec = NULL;

  /* Warm-up alone, with the default gamma of a step schedule unused. */
  ck_assert_msg(parse(ONE_WORKER("\"optimizer\": {\"type\": \"adam\","
                                 " \"schedule\": {\"warmup_steps\": 50}}"),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.optim.def.type, CM_OPT_ADAM);
  ck_assert_int_eq(spec->job.optim.def.schedule.type, CM_SCHED_CONSTANT);
  ck_assert_uint_eq(spec->job.optim.def.schedule.warmup_steps, 50);
  cm_spec_free(spec);
}
END_TEST

START_TEST(test_optimizer_mistakes) {
  parse_bad(ONE_WORKER("\"optimizer\": {\"type\": \"adam\", \"beta1\": 1,"
                       " \"beta2\": -0.1, \"eps\": 0, \"weight_decay\": -1,"
                       " \"clip_norm\": 0, \"schedul\": {}}"));
  has_line("t.json: job.optimizer.beta1: expected a number in [0, 1), got 1");
  has_line("t.json: job.optimizer.beta2: expected a number in [0, 1), got "
           "-0.1");
  has_line("t.json: job.optimizer.eps: expected a positive number, got 0");
  has_line("t.json: job.optimizer.weight_decay: expected a number >= 0, got "
           "-1");
  has_line("t.json: job.optimizer.clip_norm: expected a positive number (the "
           "largest global L2 norm of a worker's gradient), got 0");
  has_text("t.json: job.optimizer.schedul: unknown key (did you mean "
           "schedule?)");
  ck_assert_int_eq(count_lines(err), 6);

  parse_bad(ONE_WORKER("\"optimizer\": {\"type\": \"nesterov\","
                       " \"momentum\": 0}"));
  ck_assert_str_eq(err, "t.json: job.optimizer.momentum: nesterov needs a "
                        "momentum above 0 (with 0 it is plain sgd)");
}
END_TEST

START_TEST(test_schedule_mistakes) {
  /* Keys of another schedule type, and what a type needs. */
  parse_bad(ONE_WORKER("\"optimizer\": {\"schedule\": {\"type\": \"step\","
                       " \"total_steps\": 10, \"gamma\": 1.5}}"));
  has_line("t.json: job.optimizer.schedule.total_steps: only meaningful with "
           "\"type\": \"cosine\"");
  has_line("t.json: job.optimizer.schedule: \"type\": \"step\" needs "
           "\"decay_every\" (steps between decays, e.g. 1000) and takes "
           "\"gamma\" (default 0.1)");
  has_line("t.json: job.optimizer.schedule.gamma: expected a number in (0, "
           "1], got 1.5");
  ck_assert_int_eq(count_lines(err), 3);

  parse_bad(ONE_WORKER("\"optimizer\": {\"lr\": 0.1, \"schedule\":"
                       " {\"type\": \"cosine\", \"warmup_steps\": 100,"
                       " \"total_steps\": 100, \"min_lr\": 0.5,"
                       " \"decay_every\": 3}}"));
  has_line("t.json: job.optimizer.schedule.decay_every: only meaningful with "
           "\"type\": \"step\"");
  has_line("t.json: job.optimizer.schedule.total_steps: 100 is not more than "
           "warmup_steps (100); expected the step at which the decay ends, "
           "counted from the first");
  has_line("t.json: job.optimizer.schedule.min_lr: 0.5 is more than the "
           "optimizer's lr (0.1)");
  ck_assert_int_eq(count_lines(err), 3);

  parse_bad(ONE_WORKER("\"optimizer\": {\"schedule\": {\"type\": \"cosine\","
                       " \"warmup_steps\": -1}}"));
  has_line("t.json: job.optimizer.schedule: \"type\": \"cosine\" needs "
           "\"total_steps\" (the step at which lr reaches min_lr, warm-up "
           "included)");
  has_line("t.json: job.optimizer.schedule.warmup_steps: expected a "
           "non-negative integer, got -1");
  ck_assert_int_eq(count_lines(err), 2);

  parse_bad(
      ONE_WORKER("\"optimizer\": {\"schedule\": {\"type\": \"linear\"}}"));
  ck_assert_str_eq(err, "t.json: job.optimizer.schedule.type: expected "
                        "\"constant\", \"step\" or \"cosine\", got \"linear\"");
}
END_TEST

START_TEST(test_override_mistakes) {
  parse_bad(ONE_WORKER("\"optimizer_overrides\": {\"*/bias\": {\"lr\": -1,"
                       " \"clip_norm\": 1}, \"dense0/kernel\": 0.1,"
                       " \"dense1/kernel\": {\"type\": \"lion\"}}"));
  has_line("t.json: job.optimizer_overrides[\"*/bias\"].lr: expected a "
           "positive number, got -1");
  has_line("t.json: job.optimizer_overrides[\"*/bias\"].clip_norm: clipping "
           "is per job, not per variable (the global norm is over every "
           "variable's gradient); set job.optimizer.clip_norm");
  has_line("t.json: job.optimizer_overrides[\"dense0/kernel\"]: expected an "
           "object of optimizer keys like {\"type\": \"sgd\", \"lr\": 0.1}, "
           "got 0.1");
  has_text("t.json: job.optimizer_overrides[\"dense1/kernel\"].type: expected "
           "\"sgd\", ");
  ck_assert_int_eq(count_lines(err), 4);

  /* An lr under the min_lr of the cosine an entry keeps from the job. */
  parse_bad(ONE_WORKER("\"optimizer\": {\"lr\": 0.1, \"schedule\": {\"type\":"
                       " \"cosine\", \"total_steps\": 10, \"min_lr\": 0.01}},"
                       " \"optimizer_overrides\": {\"b\": {\"lr\": 0.001}}"));
  ck_assert_str_eq(err, "t.json: job.optimizer_overrides.b.lr: 0.001 is "
                        "below the min_lr (0.01) of the schedule it keeps from "
                        "job.optimizer; give this entry a \"schedule\" of its "
                        "own");

  parse_bad(ONE_WORKER("\"optimizer_overrides\": [\"*/bias\"]"));
  has_text("t.json: job.optimizer_overrides: expected an object like "
           "{\"*/bias\": {\"weight_decay\": 0}}");
  parse_bad(ONE_WORKER("\"optimizer_overrides\": {\"\": {}}"));
  ck_assert_str_eq(err, "t.json: job.optimizer_overrides[\"\"]: expected a "
                        "variable name or glob of 1..200 characters");
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

static Suite *spec_suite(void) {
  Suite *s = suite_create("spec");
  TCase *tc = tcase_create("parse");

  tcase_add_test(tc, test_minimal_defaults);
  tcase_add_test(tc, test_full);
  tcase_add_test(tc, test_models);
  tcase_add_test(tc, test_cluster_missing);
  tcase_add_test(tc, test_bad_addresses);
  tcase_add_test(tc, test_duplicates);
  tcase_add_test(tc, test_unknown_keys);
  tcase_add_test(tc, test_wrong_types);
  tcase_add_test(tc, test_task_in_spec);
  tcase_add_test(tc, test_many_mistakes);
  tcase_add_test(tc, test_syntax_error);
  tcase_add_test(tc, test_truncation);
  tcase_add_test(tc, test_load);
  tcase_add_test(tc, test_unix_sockets);
  tcase_add_test(tc, test_auth);
  tcase_add_test(tc, test_input_limits);
  suite_add_tcase(s, tc);

  tc = tcase_create("sync");
  tcase_add_test(tc, test_sync_defaults);
  tcase_add_test(tc, test_sync_full);
  tcase_add_test(tc, test_sync_wrong_mode);
  tcase_add_test(tc, test_sync_bounds);
  tcase_add_test(tc, test_sync_deadline_deterministic);
  tcase_add_test(tc, test_liveness);
  tcase_add_test(tc, test_sync_many_mistakes);
  suite_add_tcase(s, tc);

  tc = tcase_create("checkpoint");
  tcase_add_test(tc, test_checkpoint_settings);
  tcase_add_test(tc, test_checkpoint_mistakes);
  tcase_add_test(tc, test_checkpoint_dir_relative_to_spec);
  suite_add_tcase(s, tc);

  tc = tcase_create("optimizer");
  tcase_add_test(tc, test_optimizer_full);
  tcase_add_test(tc, test_optimizer_mistakes);
  tcase_add_test(tc, test_schedule_mistakes);
  tcase_add_test(tc, test_override_mistakes);
  suite_add_tcase(s, tc);

  tc = tcase_create("faults");
  tcase_add_test(tc, test_retry_budget);
  suite_add_tcase(s, tc);

  tc = tcase_create("task");
  tcase_add_test(tc, test_task_parse);
  tcase_add_test(tc, test_resolve_precedence);
  tcase_add_test(tc, test_resolve_errors);
  suite_add_tcase(s, tc);

  tc = tcase_create("local");
  tcase_add_test(tc, test_addr_is_local);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(spec_suite(), 0); }
