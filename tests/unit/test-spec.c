/* Unit tests for common/spec/spec.c, the entry points, and errs.c, the
 * mistakes they report: valid specs and their defaults, every kind of
 * mistake anywhere in a spec (each with its JSON path, all reported at
 * once, unknown keys with a hint), JSON syntax errors, a full err buffer,
 * and loading from a file (a missing or unreadable one, a relative
 * checkpoint dir resolved against the spec file's directory), and
 * fingerprint.c (what tells two specs' clusters apart). The parts of
 * a spec have suites of their own: test-spec-addr.c, test-spec-task.c,
 * test-spec-job.c, test-spec-sync.c and test-spec-optim.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkstemp, mkdtemp under -std=c11 */
#endif

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "spec.h"
#include "spec_fixture.h"
#include "unit.h"

#define MIN_SPEC                                                               \
  "{\"cluster\": {\"ps\": [\"127.0.0.1:7100\"],"                               \
  " \"worker\": [\"127.0.0.1:7200\", \"localhost:7201\"]}}"

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
  ck_assert_str_eq(spec->job.tensorboard_dir, "");
  ck_assert_int_eq(spec->job.ckpt_every_steps, 0);
  ck_assert_double_eq(spec->job.ckpt_every_s, 0);
  ck_assert_int_eq(spec->job.ckpt_keep, 3);
  ck_assert_int_eq(spec->job.channels[0], 16);
  ck_assert_int_eq(spec->job.channels[1], 32);
  ck_assert_double_eq(spec->job.retry_s, 120);
  cm_spec_free(spec);
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

START_TEST(test_unknown_keys) {
  parse_bad("{\"clustr\": {}, \"cluster\": {\"ps\": [\"h:1\"], \"worker\":"
            " [\"h:2\"], \"chef\": [\"h:3\"]}, \"job\": {\"optimizr\": {},"
            " \"optimizer\": {\"typ\": \"sgd\"}, \"sync\": {\"mode\":"
            " \"async\", \"stalenes\": 2, \"lag\": 1}, \"zzz\": 1}}");
  has_line("t.json: clustr: unknown key (did you mean cluster?); expected one "
           "of cluster, task, job, auth, environment");
  has_line("t.json: cluster.chef: unknown key (did you mean chief?); expected "
           "one of ps, worker, chief, evaluator, serve");
  has_line("t.json: job.optimizr: unknown key (did you mean optimizer?); "
           "expected one of name, model, hidden, data_dir, epochs, "
           "batch_size, optimizer, sync, seed, log_every, rpc_timeout_ms, "
           "max_steps, heartbeat_ms, dead_after_ms, unix_sockets, "
           "shared_memory, checkpoint, "
           "optimizer_overrides, channels, max_message_mb, nonfinite, "
           "retry_s, socket_owner, wire_dtype, tables, table_defaults, ctr, "
           "worker_command, "
           "tensorboard_dir, metrics_listen, exit_when_done, publish, shards");
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
  has_line("t.json: job.model: expected \"softmax\", \"mlp\", \"cnn\" or "
           "\"ctr\", got "
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

/* Several mistakes in different places, all reported, one per line. */
START_TEST(test_many_mistakes) {
  parse_bad("{\"cluster\": {\"ps\": [\"127.0.0.1\"], \"worker\":"
            " [\"127.0.0.1:70000\", \"127.0.0.1:7200\"]},"
            " \"task\": {\"type\": \"worker\", \"index\": 5},"
            " \"job\": {\"optimizr\": {}, \"epochs\": \"3\"}, \"extra\": 1}");
  has_line(
      "t.json: extra: unknown key; expected one of cluster, task, job, auth, "
      "environment");
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

/* cm_spec_load resolves a relative dir against the spec file's directory,
 * and leaves an absolute one alone. */
START_TEST(test_checkpoint_dir_relative_to_spec) {
  char dir[] = "/tmp/test-spec-dir-XXXXXX", path[256], want[512];
  struct cm_spec *spec = NULL;
  FILE *f;

  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/job.json", dir);
  f = fopen(path, "w");
  fputs(ONE_WORKER("\"checkpoint\": {\"dir\": \"state/ck\"}, "
                   "\"tensorboard_dir\": \"tb\""),
        f);
  fclose(f);
  ck_assert_msg(cm_spec_load(path, &spec, err, sizeof err) == 0, "err: %s",
                err);
  snprintf(want, sizeof want, "%s/tb", dir);
  ck_assert_str_eq(spec->job.tensorboard_dir, want);
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

/* The fingerprint of text, parsed. */
static uint64_t fp_of(const char *text) {
  struct cm_spec *spec = NULL;
  ck_assert_msg(parse(text, &spec) == 0, "err: %s", err);
  uint64_t fp = cm_spec_fingerprint(spec);
  cm_spec_free(spec);
  return fp;
}

#define CLUSTER(ps, workers, job)                                              \
  "{\"cluster\": {\"ps\": [" ps "], \"worker\": [" workers "]}, "              \
  "\"job\": {" job "}}"

START_TEST(test_fingerprint) {
  uint64_t base = fp_of(
      CLUSTER("\"a:1\", \"b:2\"", "\"c:3\", \"d:4\"", "\"name\": \"demo\""));
  ck_assert_uint_ne(base, 0);
  /* Only the job's name and the address lists count. */
  ck_assert_uint_eq(
      base, fp_of("{\"cluster\": {\"ps\": [\"a:1\", \"b:2\"], \"worker\": "
                  "[\"c:3\", \"d:4\"]}, \"task\": {\"type\": \"worker\", "
                  "\"index\": 1}, \"job\": {\"name\": \"demo\", \"epochs\": 7, "
                  "\"sync\": {\"mode\": \"sync\"}}}"));
  /* Anything else they hold tells them apart: the name, an address, the
   * order, a shard more or less, an address moved between the lists. */
  const char *other[] = {
      CLUSTER("\"a:1\", \"b:2\"", "\"c:3\", \"d:4\"", "\"name\": \"demo2\""),
      CLUSTER("\"a:1\", \"b:2\"", "\"c:3\", \"d:4\"", ""),
      CLUSTER("\"a:1\", \"b:5\"", "\"c:3\", \"d:4\"", "\"name\": \"demo\""),
      CLUSTER("\"b:2\", \"a:1\"", "\"c:3\", \"d:4\"", "\"name\": \"demo\""),
      CLUSTER("\"a:1\"", "\"c:3\", \"d:4\"", "\"name\": \"demo\""),
      CLUSTER("\"a:1\", \"b:2\", \"c:3\"", "\"d:4\"", "\"name\": \"demo\""),
      CLUSTER("\"a:1\", \"b:2\"", "\"d:4\", \"c:3\"", "\"name\": \"demo\""),
  };
  for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
    uint64_t fp = fp_of(other[i]);
    ck_assert_msg(fp != base && fp != 0, "spec %zu: %s", i, other[i]);
  }
  /* FNV-1a over "psd-job\0", 1 (le32), "h:1\0", 1, "h:2\0": pinned, since
   * tasks of different builds compare it on the wire. */
  ck_assert_uint_eq(fp_of(ONE_WORKER("")), 0x1e24fd57fc5c4bb1ull);
}
END_TEST

/* Kubeflow's TFJob TF_CONFIG, as it is: the chief first among the workers,
 * the evaluator and "environment" noted and ignored. */
START_TEST(test_kubeflow_tf_config) {
  struct cm_spec *spec = NULL;
  char err[2048];
  const char *tf =
      "{\"cluster\": {\"chief\": [\"c-0:2222\"], \"ps\": [\"p-0:2222\"],"
      " \"worker\": [\"w-0:2222\", \"w-1:2222\"],"
      " \"evaluator\": [\"e-0:2222\"]},"
      " \"task\": {\"type\": \"worker\", \"index\": 1},"
      " \"environment\": \"cloud\"}";
  ck_assert_int_eq(
      cm_spec_parse(tf, strlen(tf), "TF_CONFIG", &spec, err, sizeof err), 0);
  ck_assert_int_eq(spec->nps, 1);
  ck_assert_int_eq(spec->nworker, 3);
  ck_assert_int_eq(spec->nchief, 1);
  ck_assert_str_eq(spec->worker[0].text, "c-0:2222");
  ck_assert_str_eq(spec->worker[2].text, "w-1:2222");
  ck_assert_int_eq(spec->task.type, CM_TASK_WORKER);
  ck_assert_int_eq(spec->task.index, 2); /* worker 1 after the chief */
  ck_assert_ptr_nonnull(strstr(spec->notes, "cluster.evaluator (1 task)"));
  cm_spec_free(spec);

  const char *chief = "{\"cluster\": {\"chief\": [\"c-0:2222\"],"
                      " \"ps\": [\"p-0:2222\"]},"
                      " \"task\": {\"type\": \"chief\", \"index\": 0}}";
  ck_assert_int_eq(
      cm_spec_parse(chief, strlen(chief), "TF_CONFIG", &spec, err, sizeof err),
      0);
  ck_assert_int_eq(spec->nworker, 1);
  ck_assert_int_eq(spec->task.type, CM_TASK_WORKER);
  ck_assert_int_eq(spec->task.index, 0);
  cm_spec_free(spec);

  const char *eval = "{\"cluster\": {\"ps\": [\"p-0:2222\"],"
                     " \"worker\": [\"w-0:2222\"],"
                     " \"evaluator\": [\"e-0:2222\"]},"
                     " \"task\": {\"type\": \"evaluator\", \"index\": 0}}";
  ck_assert_int_eq(
      cm_spec_parse(eval, strlen(eval), "TF_CONFIG", &spec, err, sizeof err),
      0);
  ck_assert_int_eq(spec->task.type, CM_TASK_NONE);
  ck_assert_ptr_nonnull(strstr(spec->notes, "\"evaluator\" is not a psd"));
  cm_spec_free(spec);
}
END_TEST

static Suite *spec_suite(void) {
  Suite *s = suite_create("spec");
  TCase *tc;

  tc = tcase_create("parse");
  tcase_add_test(tc, test_minimal_defaults);
  tcase_add_test(tc, test_full);
  tcase_add_test(tc, test_unknown_keys);
  tcase_add_test(tc, test_kubeflow_tf_config);
  tcase_add_test(tc, test_wrong_types);
  tcase_add_test(tc, test_many_mistakes);
  tcase_add_test(tc, test_syntax_error);
  tcase_add_test(tc, test_truncation);
  tcase_add_test(tc, test_load);
  suite_add_tcase(s, tc);

  tc = tcase_create("checkpoint");
  tcase_add_test(tc, test_checkpoint_dir_relative_to_spec);
  suite_add_tcase(s, tc);

  tc = tcase_create("fingerprint");
  tcase_add_test(tc, test_fingerprint);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(spec_suite(), 0); }
