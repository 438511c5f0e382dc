#!/usr/bin/python3
"""Integration test of libpsclient's calls, from programs of the test's
own built against the installed library with `cc` and pkg-config's flags
alone (clib_install.py), run against 2 real shards.

- values: psc_declare_values from two clients, one after the other and at
  once: every variable (whole, split, split past a message) holds one
  client's values, the first's, and both pull them.
- late shard: a client whose declare started before its shard connects
  within 1 s of the shard's readiness line.
- log: psc_set_log sends the library's lines to a callback, drops them
  (PSC_LOG_OFF), or writes them to stderr again.
- errors: a small program of the test's own gets clear errors for a missing
  spec file, a variable of 0 dimensions and a handle never declared, and
  one code per condition (another shape: PSC_EEXIST from this client or a
  shard; a table never declared: PSC_ENOENT; an id at the bound:
  PSC_ERANGE), naming no internal function; two
  clients declaring the same variables (PSC_PLACE_AUTO) in opposite orders
  both succeed against the same shards and see one variable each.

Installed, header, man and linreg: test_clib.py. Usage: test_clib_calls.py
BUILD_DIR [unittest args...]. Waits on the shards' ready lines, never a
fixed sleep.
"""

import json
import os
import re
import subprocess
import time

import clib_install as ci
import harness as h

# The test's own program: what bad input gets, one line per check
# ("name rc=N ..."), the error texts with their newlines flattened.
ERRORS_C = r"""
#include <stdio.h>
#include <string.h>

#include <psd/client.h>

static const char *flat(const char *s) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *p = buf; *p; p++)
    if (*p == '\n')
      *p = '|';
  return buf;
}

/* Declares the variables names[order[0..4)] one by one. */
static void declare_all(psc_client *c, const char *who, const int *order) {
  static const char *names[4] = {"ord/small", "ord/mid", "ord/big",
                                 "ord/matrix"};
  static const int64_t shapes[4][2] = {{16, 1}, {1000, 1}, {65536, 1},
                                       {300, 300}};
  static const int ndims[4] = {1, 1, 1, 2};
  /* Placed by the shards' rule; SGD with lr 1, so that a pull shows the
   * pushed gradient exactly. */
  struct psc_var_opts o = {.placement = PSC_PLACE_AUTO,
                           .optimizer = "{\"type\": \"sgd\", \"lr\": 1}"};
  for (int k = 0; k < 4; k++) {
    int i = order[k];
    int rc = psc_declare(c, names[i], ndims[i], shapes[i], &o);
    printf("declare_%s %s rc=%d grpc=%d err=%s\n", who, names[i], rc,
           psc_grpc_status(c), flat(psc_error(c)));
  }
}

int main(int argc, char **argv) {
  char err[4096] = "";
  psc_client *a = NULL, *b = NULL;
  int rc;
  if (argc != 3) {
    fprintf(stderr, "usage: %s SPEC MISSING_SPEC\n", argv[0]);
    return 2;
  }

  rc = psc_open(&a, argv[2], NULL, err, sizeof err);
  printf("open_missing rc=%d null=%d strerror=%s err=%s\n", rc, a == NULL,
         psc_strerror(rc), flat(err));
  psc_close(a);

  if ((rc = psc_open(&a, argv[1], NULL, err, sizeof err)) ||
      (rc = psc_open(&b, argv[1], NULL, err, sizeof err))) {
    printf("open rc=%d err=%s\n", rc, flat(err));
    return 1;
  }
  printf("open rc=0 shards=%d\n", psc_num_shards(a));

  int64_t shape[1] = {4};
  rc = psc_declare(a, "bad/ndim0", 0, shape, NULL);
  printf("declare_ndim0 rc=%d err=%s\n", rc, flat(psc_error(a)));

  float buf[4];
  float *dst[1] = {buf};
  int never = 0;
  rc = psc_pull(a, &never, dst, 1);
  printf("pull_undeclared rc=%d err=%s\n", rc, flat(psc_error(a)));

  static const int fwd[4] = {0, 1, 2, 3}, rev[4] = {3, 2, 1, 0};
  declare_all(a, "a", fwd);
  declare_all(b, "b", rev);
  never = 99;
  rc = psc_pull(a, &never, dst, 1);
  printf("pull_undeclared99 rc=%d err=%s\n", rc, flat(psc_error(a)));

  /* One variable each: a's push (SGD, lr 1: value -= grad) is what b
   * pulls, whole on its shard or split. */
  int va = psc_find(a, "ord/small"), vb = psc_find(b, "ord/small");
  int wa = psc_find(a, "ord/big"), wb = psc_find(b, "ord/big");
  static float g16[16], g64k[65536], p16[16], p64k[65536];
  for (int i = 0; i < 16; i++)
    g16[i] = (float)i;
  for (int i = 0; i < 65536; i++)
    g64k[i] = (float)(i % 7);
  const float *grads[2] = {g16, g64k};
  float *dsts[2] = {p16, p64k};
  int av[2] = {va, wa}, bv[2] = {vb, wb};
  rc = psc_push(a, av, grads, 2, 1);
  printf("push_a rc=%d err=%s\n", rc, flat(psc_error(a)));
  rc = psc_pull(b, bv, dsts, 2);
  printf("pull_b rc=%d err=%s\n", rc, flat(psc_error(b)));
  int same = 1;
  for (int i = 0; i < 16; i++)
    same &= p16[i] == -g16[i];
  for (int i = 0; i < 65536; i++)
    same &= p64k[i] == -g64k[i];
  printf("pull_b_sees_a same=%d numel_big=%lld\n", same,
         (long long)psc_numel(b, wb));

  /* One condition, one code, whoever finds it: another shape for a
   * variable or table (this client, or a shard for another client), a
   * table never declared, an id at the table's bound. */
  int64_t four[1] = {4}, five[1] = {5};
  rc = psc_declare(a, "err/x", 1, four, NULL);
  printf("declare_x rc=%d\n", rc < 0 ? rc : 0);
  rc = psc_declare(b, "err/x", 1, five, NULL);
  printf("exists_other rc=%d grpc=%d err=%s\n", rc, psc_grpc_status(b),
         flat(psc_error(b)));
  rc = psc_declare(a, "err/x", 1, five, NULL);
  printf("exists_same rc=%d grpc=%d err=%s\n", rc, psc_grpc_status(a),
         flat(psc_error(a)));
  rc = psc_declare_table(a, "err/t", 4, 10);
  printf("table_t rc=%d err=%s\n", rc, flat(psc_error(a)));
  rc = psc_declare_table(b, "err/t", 8, 10);
  printf("table_exists_other rc=%d grpc=%d err=%s\n", rc, psc_grpc_status(b),
         flat(psc_error(b)));
  uint64_t ids[2] = {3, 10};
  float rows[16];
  rc = psc_pull_rows(a, "err/none", ids, 1, rows, 0);
  printf("table_undeclared rc=%d grpc=%d err=%s\n", rc, psc_grpc_status(a),
         flat(psc_error(a)));
  rc = psc_push_rows(a, "err/t", ids, 2, rows, 0, NULL);
  printf("id_past_bound rc=%d grpc=%d err=%s\n", rc, psc_grpc_status(a),
         flat(psc_error(a)));
  /* Many tables in one call: the same rows as one table at a time, and an
   * error names the table at fault. */
  rc = psc_declare_table(a, "err/u", 2, 0);
  uint64_t uids[3] = {7, 123456789, 7};
  float one_t[8], one_u[6], many_t[8], many_u[6], gt[8] = {0}, gu[6] = {0};
  struct psc_rows mr[2] = {{"err/t", ids, 1, many_t, gt},
                           {"err/u", uids, 3, many_u, gu}};
  rc = psc_pull_rows(a, "err/t", ids, 1, one_t, 0) ||
       psc_pull_rows(a, "err/u", uids, 3, one_u, 0);
  int rc2 = psc_pull_rows_many(a, mr, 2, 0);
  int rc3 = psc_push_rows_many(a, mr, 2, 0, NULL);
  printf("many rc=%d rc2=%d rc3=%d same=%d\n", rc, rc2, rc3,
         !memcmp(one_t, many_t, 4 * sizeof(float)) &&
             !memcmp(one_u, many_u, sizeof one_u));
  mr[0].n = 2; /* id 10 of err/t is past its bound */
  rc = psc_pull_rows_many(a, mr, 2, 0);
  printf("many_past_bound rc=%d err=%s\n", rc, flat(psc_error(a)));
  mr[0].n = 1;
  mr[1].table = "err/none";
  rc = psc_push_rows_many(a, mr, 2, 0, NULL);
  printf("many_undeclared rc=%d err=%s\n", rc, flat(psc_error(a)));
  psc_close(a);
  psc_close(b);
  return 0;
}
"""

# Declares variables with initial values of its own and says whose values
# it pulls back: values SPEC WHO PREFIX, WHO "a" (values i + 1) or "b"
# (-(i + 1)). One line per variable: "NAME rc=N from=a|b|mixed|zeros".
VALUES_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <psd/client.h>

int main(int argc, char **argv) {
  static const char *names[4] = {"small", "split", "big", "null"};
  static const int64_t shapes[4][2] = {{3, 4}, {1000, 300}, {3000, 1000},
                                       {5, 2}};
  char err[4096], name[128];
  psc_client *c = NULL;
  if (argc != 4 || psc_open(&c, argv[1], NULL, err, sizeof err)) {
    fprintf(stderr, "values: %s\n", argc != 4 ? "usage" : err);
    return 2;
  }
  float sign = strcmp(argv[2], "a") ? -1.0f : 1.0f;
  for (int k = 0; k < 4; k++) {
    size_t n = (size_t)(shapes[k][0] * shapes[k][1]);
    float *mine = malloc(n * sizeof *mine), *got = malloc(n * sizeof *got);
    for (size_t i = 0; i < n; i++)
      mine[i] = sign * (float)(i + 1);
    snprintf(name, sizeof name, "%s/%s", argv[3], names[k]);
    /* "null": NULL values, as psc_declare. */
    int v = psc_declare_values(c, name, 2, shapes[k], NULL,
                               k == 3 ? NULL : mine);
    int rc = v < 0 ? v : psc_pull(c, &v, &got, 1);
    size_t a = 0, b = 0, z = 0;
    for (size_t i = 0; i < n; i++) {
      a += got[i] == (float)(i + 1);
      b += got[i] == -(float)(i + 1);
      z += got[i] == 0.0f;
    }
    printf("%s rc=%d from=%s err=%s\n", name, rc,
           a == n ? "a" : b == n ? "b" : z == n ? "zeros" : "mixed",
           rc ? psc_error(c) : "");
    free(mine);
    free(got);
  }
  psc_close(c);
  return 0;
}
"""

# Declares one variable of LATE_SPEC's shards, started after it: prints
# "declaring", then "declared rc=N" once the declare returned.
LATE_C = r"""
#include <stdio.h>

#include <psd/client.h>

int main(int argc, char **argv) {
  char err[4096];
  psc_client *c = NULL;
  int64_t shape[1] = {4};
  if (argc != 2 || psc_open(&c, argv[1], NULL, err, sizeof err)) {
    fprintf(stderr, "late: %s\n", argc != 2 ? "usage" : err);
    return 2;
  }
  printf("declaring\n");
  fflush(stdout);
  int v = psc_declare(c, "late/w", 1, shape, NULL);
  printf("declared rc=%d err=%s\n", v < 0 ? v : 0, v < 0 ? psc_error(c) : "");
  fflush(stdout);
  psc_close(c);
  return v < 0;
}
"""

# The library's log lines against a spec whose shard nobody runs (each
# declare fails after 1.5 s, having said "not reachable" after 0.7 s): to a
# callback at PSC_LOG_WARN, dropped at PSC_LOG_OFF, on stderr again with no
# callback; each phase's start said on stderr.
LOG_C = r"""
#include <stdio.h>

#include <psd/client.h>

static void to_stdout(void *arg, int level, const char *line) {
  printf("cb %s level=%d line=%s\n", (const char *)arg, level, line);
  fflush(stdout);
}

static void declare(const char *spec) {
  struct psc_options o;
  char err[4096];
  psc_client *c = NULL;
  int64_t shape[1] = {4};
  psc_options_init(&o);
  o.connect_timeout_ms = 1500;
  if (psc_open(&c, spec, &o, err, sizeof err)) {
    printf("open failed: %s\n", err);
    return;
  }
  printf("declare rc=%d\n", psc_declare(c, "log/w", 1, shape, NULL));
  psc_close(c);
}

int main(int argc, char **argv) {
  if (argc != 2)
    return 2;
  printf("bad_level rc=%d\n", psc_set_log(PSC_LOG_OFF + 1, NULL, NULL));
  fprintf(stderr, "phase callback\n");
  printf("set rc=%d\n", psc_set_log(PSC_LOG_WARN, to_stdout, "mine"));
  declare(argv[1]);
  fprintf(stderr, "phase off\n");
  printf("set rc=%d\n", psc_set_log(PSC_LOG_OFF, NULL, NULL));
  declare(argv[1]);
  fprintf(stderr, "phase stderr\n");
  printf("set rc=%d\n", psc_set_log(PSC_LOG_INFO, NULL, NULL));
  declare(argv[1]);
  return 0;
}
"""


def tearDownModule():
    ci.cleanup()


class CallsTest(ci.ClientCase):
    """The test's own programs, run against 2 shards of their own."""

    def values_program(self):
        src = os.path.join(self.d, "values.c")
        with open(src, "w") as f:
            f.write(VALUES_C)
        return self.cc(src, os.path.join(self.d, "values"))

    @staticmethod
    def whose(out):
        """{name: (rc, from)} of a values program's lines."""
        got = {}
        for line in out.splitlines():
            m = re.match(r"(\S+) rc=(-?\d+) from=(\S+)", line)
            if m:
                got[m.group(1)] = (int(m.group(2)), m.group(3))
        return got

    def test_declare_values_first_client_wins(self):
        """psc_declare_values: the first client's values are the
        variable's, whole on one shard, split (each shard its rows) and
        split past a message (staged over several Declares); a second
        client with other values pulls the first's; NULL values are the
        initializer's (zeros)."""
        exe = self.values_program()
        outs = {}
        for who in ("a", "b"):
            r = h.run([exe, self.spec, who, "v"], timeout=60, env=self.run_env)
            outs[who] = r.stdout + r.stderr
            self.assertEqual(r.returncode, 0, outs[who])
        for who in ("a", "b"):
            self.assertEqual(self.whose(outs[who]),
                             {"v/small": (0, "a"), "v/split": (0, "a"),
                              "v/big": (0, "a"), "v/null": (0, "zeros")}, outs[who])
        # Where they went: small whole on one shard, the others on both.
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "--json",
                   "vars"], timeout=30)
        held = {v["name"]: sorted(s["shard"] for s in v["shards"])
                for v in json.loads(r.stdout)["vars"]}
        self.assertEqual(len(held["v/small"]), 1, held)
        self.assertEqual(held["v/split"], [0, 1], held)
        self.assertEqual(held["v/big"], [0, 1], held)

    def test_declare_values_at_once_one_client_wins_whole(self):
        """Two clients declaring the same variables with different values
        at the same moment: each variable holds one client's values, every
        row of a split one, and both pull the same."""
        exe = self.values_program()
        env = dict(os.environ, **self.run_env)
        procs = [subprocess.Popen([exe, self.spec, who, "race"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env)
                 for who in ("a", "b")]
        outs = [p.communicate(timeout=60)[0] for p in procs]
        for p, out in zip(procs, outs):
            self.assertEqual(p.returncode, 0, out)
        a, b = self.whose(outs[0]), self.whose(outs[1])
        self.assertEqual(sorted(a), ["race/big", "race/null", "race/small", "race/split"],
                         outs[0])
        self.assertEqual(a, b, outs)
        for name, (rc, src) in a.items():
            self.assertEqual(rc, 0, outs)
            self.assertIn(src, ("zeros",) if name == "race/null" else ("a", "b"), outs)

    def test_declare_connects_soon_after_the_shard_listens(self):
        """A client started before its shard (declare waiting, its first
        attempts refused) connects within ~100 ms of the shard's readiness
        line, not after gRPC's reconnect backoff (it took 5-6.8 s): the
        bound here is a generous 1 s."""
        src = os.path.join(self.d, "late.c")
        with open(src, "w") as f:
            f.write(LATE_C)
        exe = self.cc(src, os.path.join(self.d, "late"))
        spec = os.path.join(self.d, "late.json")
        h.write_spec(spec, nps=1, nworker=1, job={"name": "late"})
        c = h.Proc([exe, spec], env=self.run_env)
        self.procs.append(c)
        c.wait_for("declaring")
        # Refused for a while, so that gRPC's backoff has grown.
        c.wait_for("not reachable: connection refused", timeout=10)
        self.procs.append(h.start_psd(spec, 0))
        ready = time.monotonic()
        line = c.wait_for("declared rc=", timeout=30)
        took = time.monotonic() - ready
        self.assertIn("declared rc=0 ", line, c.output())
        self.assertLess(took, 1.0, c.output())
        self.assertEqual(c.wait(timeout=30), 0, c.output())

    def test_log_level_and_callback(self):
        """psc_set_log: a callback gets the library's lines (level, the
        message alone) and nothing reaches stderr; PSC_LOG_OFF drops them;
        with no callback they are on stderr again, labelled psd."""
        src = os.path.join(self.d, "log.c")
        with open(src, "w") as f:
            f.write(LOG_C)
        exe = self.cc(src, os.path.join(self.d, "log"))
        spec = os.path.join(self.d, "nobody.json")
        addr = h.write_spec(spec, nps=1, nworker=1, job={"name": "log"})["cluster"]["ps"][0]
        r = h.run([exe, spec], timeout=60, env=self.run_env)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        self.assertIn("bad_level rc=-1", r.stdout)
        self.assertEqual(r.stdout.count("set rc=0"), 3, out)
        self.assertEqual(r.stdout.count("declare rc=-17"), 3, out)
        line = ("ps:0 (%s) not reachable: connection refused (nothing listens "
                "there?); waiting up to 2 s for it" % addr)
        cb = [l for l in r.stdout.splitlines() if l.startswith("cb ")]
        self.assertEqual(cb, ["cb mine level=2 line=" + line], out)
        phases = re.split(r"(?m)^phase (\w+)\n", r.stderr)
        self.assertEqual(phases[1::2], ["callback", "off", "stderr"], r.stderr)
        self.assertEqual(phases[2], "", r.stderr)  # to the callback alone
        self.assertEqual(phases[4], "", r.stderr)  # off
        self.assertRegex(phases[6], r"(?m)^\d\d:\d\d:\d\d\.\d{3} psd warn: %s$"
                         % re.escape(line))

    def test_errors_and_declare_order(self):
        src = os.path.join(self.d, "errors.c")
        with open(src, "w") as f:
            f.write(ERRORS_C)
        exe = self.cc(src, os.path.join(self.d, "errors"))
        missing = os.path.join(self.d, "no-such-spec.json")
        r = h.run([exe, self.spec, missing], timeout=60, env=self.run_env)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        lines = {}
        for line in r.stdout.splitlines():
            name, _, rest = line.partition(" ")
            lines.setdefault(name, []).append(rest)

        def rc(name, k=0):
            return int(re.match(r"(?:\S+ )?rc=(-?\d+)", lines[name][k]).group(1))

        # A missing spec file: a code, no client, and the file named.
        self.assertLess(rc("open_missing"), 0, out)
        self.assertIn("null=1", lines["open_missing"][0])
        self.assertIn(missing, lines["open_missing"][0])
        self.assertEqual(lines["open"][0], "rc=0 shards=2")
        # ndim 0: PSC_EINVAL (-1), naming the variable.
        self.assertEqual(rc("declare_ndim0"), -1, out)
        self.assertIn("'bad/ndim0'", lines["declare_ndim0"][0])
        self.assertIn("0 dimensions", lines["declare_ndim0"][0])
        # A handle never declared: PSC_ENOENT (-4), before and after declares.
        self.assertEqual(rc("pull_undeclared"), -4, out)
        self.assertIn("handle 0", lines["pull_undeclared"][0])
        self.assertEqual(rc("pull_undeclared99"), -4, out)
        self.assertIn("handle 99", lines["pull_undeclared99"][0])
        # Both orders succeed: no ALREADY_EXISTS (6), handles in each one's
        # own declaration order.
        for who, order in (("a", ["ord/small", "ord/mid", "ord/big", "ord/matrix"]),
                           ("b", ["ord/matrix", "ord/big", "ord/mid", "ord/small"])):
            got = lines["declare_" + who]
            self.assertEqual(len(got), 4, out)
            for k, name in enumerate(order):
                self.assertTrue(got[k].startswith("%s rc=%d grpc=0 " % (name, k)),
                                "client %s: %s\n%s" % (who, got[k], out))
        self.assertEqual(rc("push_a"), 0, out)
        self.assertEqual(rc("pull_b"), 0, out)
        self.assertEqual(lines["pull_b_sees_a"][0], "same=1 numel_big=65536", out)
        # One condition, one code (psclient(3), ERRORS): another shape is
        # PSC_EEXIST (-10) whether a shard (ALREADY_EXISTS, 6) or this
        # client found it; a table never declared PSC_ENOENT (-4); an id at
        # the bound PSC_ERANGE (-11).
        self.assertEqual(lines["declare_x"][0], "rc=0", out)
        self.assertTrue(lines["exists_other"][0].startswith("rc=-10 grpc=6 "), out)
        self.assertIn("'err/x'", lines["exists_other"][0])
        self.assertTrue(lines["exists_same"][0].startswith("rc=-10 grpc=0 "), out)
        self.assertIn("'err/x'", lines["exists_same"][0])
        self.assertTrue(lines["table_t"][0].startswith("rc=0 "), out)
        self.assertTrue(lines["table_exists_other"][0].startswith("rc=-10 grpc=6 "), out)
        self.assertIn("err/t", lines["table_exists_other"][0])
        self.assertEqual(lines["table_undeclared"][0],
                         "rc=-4 grpc=0 err=pull rows of 'err/none': this client has "
                         "declared no table 'err/none'; declare it first", out)
        self.assertEqual(lines["id_past_bound"][0],
                         "rc=-11 grpc=0 err=push rows of 'err/t': id 10 (position 1) is "
                         "not below the table's id_bound 10", out)
        # Many tables in one call: the rows of one table at a time, and the
        # table at fault named.
        self.assertEqual(lines["many"][0], "rc=0 rc2=0 rc3=0 same=1", out)
        self.assertEqual(lines["many_past_bound"][0],
                         "rc=-11 err=pull rows of 'err/t': id 10 (position 1) is "
                         "not below the table's id_bound 10", out)
        self.assertEqual(lines["many_undeclared"][0],
                         "rc=-4 err=push rows of 'err/none': this client has "
                         "declared no table 'err/none'; declare it first", out)
        # No message names a function of the library's insides.
        self.assertNotRegex(out, r"\b(dw|cm|psd)_[a-z_]+\b", out)
        # Where the shards put them: split at 256 KiB and more (ord/big is
        # exactly 256 KiB), else whole on one shard; each variable once.
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "--json",
                   "vars"], timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        held = {v["name"]: sorted(s["shard"] for s in v["shards"])
                for v in json.loads(r.stdout)["vars"] if v["name"].startswith("ord/")}
        self.assertEqual(sorted(held), ["ord/big", "ord/matrix", "ord/mid", "ord/small"])
        self.assertEqual(held["ord/big"], [0, 1], held)
        self.assertEqual(held["ord/matrix"], [0, 1], held)
        self.assertEqual(len(held["ord/small"]), 1, held)
        self.assertEqual(len(held["ord/mid"]), 1, held)


if __name__ == "__main__":
    ci.main()
