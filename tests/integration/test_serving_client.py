"""The serving client (psc_serving of psd/client.h, psd.Serving, psctl
serving) against stand-in serving tasks (servestub.py: Serve/Lookup and
Admin/Status as proto/ps.proto words them): ids routed to their training
shard's replica, rows in the caller's order, failover to the next replica
of a shard, the errors' codes and words, a dense variable assembled from
every shard's rows, and psctl's table of the serving tasks. The stand-ins
answer from threads of this very process, so every lookup here also shows
that psd.Serving's calls release the GIL (held, no stand-in could answer)."""
import json
import os
import shutil
import sys
import unittest

import numpy as np

import harness as h
import pyshards

try:
    import grpc  # noqa: F401
    import servestub as ss
except ImportError as e:  # python3-grpcio missing
    ss = None
    WHY = str(e)

psd = None
NPS, REPS, DIM = 2, 2, 4
JOB = "servejob"
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def setUpModule():
    global psd
    if ss is None:
        raise unittest.SkipTest("python3-grpcio is not installed: %s" % WHY)
    psd = pyshards.import_psd()


def write_spec(path, nps=NPS, reps=REPS, job=None):
    """A spec of nps shards and nps * reps serving tasks on free ports."""
    spec = h.write_spec(path, nps=nps, nworker=1,
                        job=dict({"name": JOB, "retry_s": 1,
                                  "rpc_timeout_ms": 3000}, **(job or {})))
    ports = h.free_ports(nps * reps)
    spec["cluster"]["serve"] = ["127.0.0.1:%d" % p for p in ports]
    with open(path, "w") as f:
        json.dump(spec, f, indent=2)
    return spec


# A program of the test's own over the public C API (psd/client.h), built
# against the build tree's header and libpsclient.so: one line per check.
LOOKUP_C = r"""
#include <stdio.h>
#include <stdlib.h>

#include <psd/client.h>

int main(int argc, char **argv) {
  struct psc_serving_options o;
  psc_serving *s = NULL;
  char err[1024] = "";
  int rc;
  rc = psc_serving_open(&s, argv[2], NULL, err, sizeof err);
  printf("open_plain rc=%d %s\n", rc, err);
  psc_serving_options_init(&o);
  o.replica = 1;
  o.name = "ctest";
  if ((rc = psc_serving_open(&s, argv[1], &o, err, sizeof err))) {
    printf("open rc=%d %s\n", rc, err);
    return 1;
  }
  printf("counts shards=%d replicas=%d task0=%d task1=%d task2=%d\n",
         psc_serving_shards(s), psc_serving_replicas(s), psc_serving_task(s, 0),
         psc_serving_task(s, 1), psc_serving_task(s, 2));
  int dim = psc_lookup_dim(s, "emb");
  uint64_t ids[6] = {9, 4, 9, 123456789, 0, 77}, versions[2];
  float *rows = calloc(6 * (size_t)dim, sizeof *rows);
  uint8_t found[6];
  rc = psc_lookup(s, "emb", ids, 6, rows, NULL, NULL); /* found, versions NULL */
  printf("lookup_bare rc=%d dim=%d\n", rc, dim);
  rc = psc_lookup(s, "emb", ids, 6, rows, found, versions);
  printf("lookup rc=%d versions=%llu,%llu\n", rc, (unsigned long long)versions[0],
         (unsigned long long)versions[1]);
  for (int i = 0; i < 6; i++)
    printf("row %llu %d %g %g\n", (unsigned long long)ids[i], found[i],
           rows[i * dim], rows[i * dim + dim - 1]);
  rc = psc_lookup(s, "nope", ids, 6, rows, found, versions);
  printf("nope rc=%d status=%d %s\n", rc, psc_serving_grpc_status(s),
         psc_serving_error(s));
  size_t numel = 0;
  rc = psc_lookup_dense(s, "w", NULL, 0, &numel, NULL);
  printf("dense_size rc=%d numel=%zu\n", rc, numel);
  float w[5];
  rc = psc_lookup_dense(s, "w", w, 5, NULL, versions);
  printf("dense_short rc=%d %s\n", rc, psc_serving_error(s));
  float *wv = calloc(numel, sizeof *wv);
  rc = psc_lookup_dense(s, "w", wv, numel, NULL, versions);
  printf("dense rc=%d first=%g last=%g\n", rc, wv[0], wv[numel - 1]);
  rc = psc_lookup(s, NULL, ids, 1, rows, found, versions);
  printf("no_table rc=%d %s\n", rc, psc_serving_error(s));
  free(rows);
  free(wv);
  psc_serving_close(s);
  psc_serving_close(NULL);
  return 0;
}
"""


class ServingClientTest(h.ProcTest):

    def setUp(self):
        super().setUp()
        self.spec = os.path.join(self.d, "spec.json")
        self.cfg = write_spec(self.spec)
        self.stubs = {}

    def tearDown(self):
        for s in self.stubs.values():
            s.stop()
        super().tearDown()

    def stub(self, task, **kw):
        kw.setdefault("tables", {"emb": DIM})
        s = ss.Stub(self.cfg["cluster"]["serve"][task], task, NPS, **kw)
        self.stubs[task] = s
        return s

    def serving(self, **kw):
        s = psd.Serving(self.spec, **kw)
        self.addCleanup(s.close)
        return s

    def expect_rows(self, ids, rows, found, held=None):
        for k, i in enumerate(ids):
            sh = ss.shard_of(i, NPS)
            if held is None or i in held:
                self.assertTrue(found[k], "id %d" % i)
                np.testing.assert_array_equal(rows[k], ss.row_of(i, DIM, sh))
            else:
                self.assertFalse(found[k], "id %d" % i)
                np.testing.assert_array_equal(rows[k], [0.0] * DIM)

    def test_ids_go_to_their_shard_and_rows_come_back_in_order(self):
        for t in range(NPS * REPS):
            self.stub(t, version=7 + t, held=set(range(0, 300, 3)))
        s = self.serving(replica=0)
        self.assertEqual((s.shards, s.replicas), (NPS, REPS))
        self.assertEqual(s.dim("emb"), DIM)
        ids = list(range(200, 0, -1)) + [5, 5, 17, 5]
        rows, found, versions = s.lookup("emb", ids)
        self.assertEqual(rows.shape, (len(ids), DIM))
        self.expect_rows(ids, rows, found, held=set(range(0, 300, 3)))
        self.assertEqual(list(versions), [7, 8])  # serve:0 and serve:1
        for t in range(NPS * REPS):
            self.assertEqual(self.stubs[t].misrouted, [], "serve:%d" % t)
        # One message per shard, the shard's ids in the caller's order.
        got = self.stubs[1].lookups[-1]
        self.assertEqual(got[1], [i for i in ids if ss.shard_of(i, NPS) == 1])
        self.assertEqual((self.stubs[2].lookups, self.stubs[3].lookups), ([], []))
        # Replica 1 of each shard: serve:2 and serve:3.
        s1 = self.serving(replica=1)
        _, _, versions = s1.lookup("emb", ids)
        self.assertEqual(list(versions), [9, 10])
        self.assertEqual((s1.task(0), s1.task(1)), (2, 3))
        # Ids of one shard alone: the other is not asked (version 0).
        one = [i for i in range(100) if ss.shard_of(i, NPS) == 1][:5]
        _, _, versions = s.lookup("emb", one)
        self.assertEqual(list(versions), [0, 8])

    def test_publications_of_modulo_rows_are_followed(self):
        """Serving tasks of a job resumed from a checkpoint written before
        bucket maps place rows by splitmix64(id) % nps: the client, which
        groups by buckets first, is told "rows moved" once per task it
        asked, takes the rule and asks again; every id reaches its shard."""
        for t in range(NPS):
            self.stub(t, rule="modulo")
        s = self.serving(replica=0)
        ids = list(range(200))
        rows, found, _ = s.lookup("emb", ids)
        for k, i in enumerate(ids):
            np.testing.assert_array_equal(
                rows[k], ss.row_of(i, DIM, ss.shard_of(i, NPS, "modulo")))
        self.assertTrue(all(found))
        for t in range(NPS):
            self.assertEqual(self.stubs[t].misrouted, [], "serve:%d" % t)
            self.assertLessEqual(self.stubs[t].moved, 1, "serve:%d" % t)
        self.assertGreaterEqual(sum(self.stubs[t].moved for t in range(NPS)), 1)
        # Planned by modulo from now on: no more "rows moved".
        s.lookup("emb", ids)
        self.assertLessEqual(sum(self.stubs[t].moved for t in range(NPS)), NPS)

    def test_a_replica_that_is_down_is_left_for_the_next(self):
        self.stub(0)
        self.stub(3)  # serve:1, shard 1's replica 0, is not there
        s = self.serving(replica=0)
        ids = list(range(50))
        s.dim("emb")  # learnt before the first lookup (id 0's shard asked)
        rows, found, versions = s.lookup("emb", ids)
        self.expect_rows(ids, rows, found)
        self.assertEqual((s.task(0), s.task(1)), (0, 3))
        self.assertEqual(self.stubs[3].lookups[-1][1],
                         [i for i in ids if ss.shard_of(i, NPS) == 1])
        calls = len(self.stubs[3].lookups)
        s.lookup("emb", ids)  # stays on serve:3
        self.assertEqual(len(self.stubs[3].lookups), calls + 1)

    def test_an_unavailable_answer_moves_to_the_next_replica(self):
        self.stub(0, fail=(grpc.StatusCode.UNAVAILABLE, "draining"))
        self.stub(1)
        self.stub(2, version=42)
        s = self.serving(replica=0)
        _, _, versions = s.lookup("emb", list(range(20)))
        self.assertEqual(list(versions), [42, 1])
        self.assertEqual(s.task(0), 2)

    def test_no_replica_answering_fails_unavail_naming_each(self):
        self.stub(0)
        self.stub(2)  # shard 1 has neither serve:1 nor serve:3
        s = self.serving(replica=0, retry_s=0.5)
        with self.assertRaises(psd.Error) as cm:
            s.lookup("emb", list(range(20)))
        e = cm.exception
        self.assertEqual(e.code, psd.EUNAVAIL)
        msg = str(e)
        self.assertIn("lookup of table 'emb': no serving task of shard 1", msg)
        for t in (1, 3):
            self.assertIn("serve:%d (%s): connection refused" %
                          (t, self.cfg["cluster"]["serve"][t]), msg)

    def test_a_serving_tasks_refusal_is_its_code_naming_table_and_task(self):
        for t in range(2):
            self.stub(t)
        s = self.serving(replica=0)
        with self.assertRaises(psd.Error) as cm:
            s.dim("nope")
        e = cm.exception
        self.assertEqual((e.code, e.grpc_name), (psd.ENOENT, "NOT_FOUND"))
        self.assertRegex(str(e), r"lookup of table 'nope' at serve:\d \(127\.0\.0\.1:\d+\): "
                         r"NOT_FOUND: serve:\d: no table 'nope'")
        self.stubs[1].fail = (grpc.StatusCode.FAILED_PRECONDITION, "job mismatch")
        with self.assertRaises(psd.Error) as cm:
            s.lookup("emb", list(range(20)))
        self.assertEqual((cm.exception.code, cm.exception.grpc_name),
                         (psd.ERPC, "FAILED_PRECONDITION"))
        self.assertIn("lookup of table 'emb' at serve:1 (%s): FAILED_PRECONDITION: job "
                      "mismatch" % self.cfg["cluster"]["serve"][1], str(cm.exception))

    def test_dense_variable_assembled_from_every_shard(self):
        w = np.arange(15, dtype=np.float32)
        self.stub(0, dense={"w": (0, 2, w[:6].tolist()),
                            "b": (0, 0, [])})
        self.stub(1, dense={"w": (2, 5, w[6:].tolist()),
                            "b": (0, 3, [1.5, 2.5, 3.5])})
        s = self.serving(replica=0)
        got, versions = s.dense("w", shape=(5, 3), versions=True)
        np.testing.assert_array_equal(got, w.reshape(5, 3))
        self.assertEqual(list(versions), [1, 1])
        np.testing.assert_array_equal(s.dense("b"), [1.5, 2.5, 3.5])
        # Held whole by shard 1: shard 0 answers NOT_FOUND.
        self.stubs[1].dense["v"] = (0, 2, [7.0, 8.0])
        np.testing.assert_array_equal(s.dense("v"), [7.0, 8.0])
        with self.assertRaises(psd.Error) as cm:
            s.dense("nothing")
        self.assertEqual(cm.exception.code, psd.ENOENT)
        self.assertIn("lookup of dense variable 'nothing': no serving task holds it "
                      "(asked serve:0, serve:1, one of each shard)", str(cm.exception))
        # Rows that do not fit together are refused.
        self.stubs[1].dense["w"] = (3, 5, w[9:].tolist())
        with self.assertRaises(psd.Error) as cm:
            s.dense("w")
        self.assertEqual(cm.exception.code, psd.EPROTO if hasattr(psd, "EPROTO")
                         else -6)
        self.assertIn("the shards' rows do not fit together", str(cm.exception))

    def test_the_c_api_directly(self):
        if not shutil.which("cc"):
            self.skipTest("no cc to build a program against libpsclient")
        w = np.arange(9, dtype=np.float32)
        self.stub(2, version=3, dense={"w": (0, 2, w[:6].tolist())})
        self.stub(3, version=4, held={9, 4, 0},
                  dense={"w": (2, 3, w[6:].tolist())})
        src = os.path.join(self.d, "lookup.c")
        exe = os.path.join(self.d, "lookup")
        with open(src, "w") as f:
            f.write(LOOKUP_C)
        lib = h.build_path("worker", "psclient")
        inc = os.path.join(SRC, "worker", "psclient", "include")
        r = h.run(["cc", "-std=c11", "-Wall", "-Werror", "-I" + inc, src, "-o", exe,
                   "-L" + lib, "-Wl,-rpath," + lib, "-lpsclient"])
        self.assertEqual(r.returncode, 0, r.stderr)
        plain = os.path.join(self.d, "plain.json")
        h.write_spec(plain, nps=2, nworker=1)
        r = h.run([exe, self.spec, plain], timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = dict(l.split(" ", 1) for l in r.stdout.splitlines()
                   if not l.startswith("row "))
        self.assertRegex(out["open_plain"], r"^rc=-1 .*no cluster.serve")
        self.assertEqual(out["counts"], "shards=2 replicas=2 task0=2 task1=3 task2=-1")
        self.assertEqual(out["lookup_bare"], "rc=0 dim=%d" % DIM)
        self.assertEqual(out["lookup"], "rc=0 versions=3,4")
        rows = [l.split()[1:] for l in r.stdout.splitlines() if l.startswith("row ")]
        for i, fl, first, last in rows:
            i, sh = int(i), ss.shard_of(int(i), NPS)
            held = sh == 0 or i in (9, 4, 0)
            self.assertEqual(fl, "1" if held else "0", i)
            want = ss.row_of(i, DIM, sh) if held else [0.0] * DIM
            self.assertEqual((float(first), float(last)), (want[0], want[-1]), i)
        self.assertRegex(out["nope"], r"^rc=-4 status=5 lookup of table 'nope' at "
                         r"serve:[23] \(127\.0\.0\.1:\d+\): NOT_FOUND")
        self.assertEqual(out["dense_size"], "rc=0 numel=9")
        self.assertEqual(out["dense_short"], "rc=-9 lookup of dense variable 'w': it has "
                         "9 elements; the buffer holds 5")
        self.assertEqual(out["dense"], "rc=0 first=0 last=8")
        self.assertEqual(out["no_table"], "rc=-1 lookup: no table name, or one longer "
                         "than 200 bytes")

    def test_a_spec_without_serving_tasks_is_refused(self):
        spec = os.path.join(self.d, "plain.json")
        h.write_spec(spec, nps=2, nworker=1)
        with self.assertRaises(psd.Error) as cm:
            psd.Serving(spec)
        self.assertEqual(cm.exception.code, psd.EINVAL)
        self.assertIn("no cluster.serve", str(cm.exception))

    def test_psctl_serving_shows_each_task_and_names_one_down(self):
        now = 1_700_000_000_000
        self.stub(0, version=5, newest_seen=7, step=120, rows=1000,
                  bytes_=3 << 20, refused=1, last_refusal="pub-0000000006: bad crc",
                  time_unix_ms=now, layout=(1, 2, 3, 40))
        self.stub(1, version=4, step=118, rows=900, bytes_=2 << 20, layout=(1, 3, 0, 0))
        self.stub(2, version=5, step=120, rows=1000, bytes_=3 << 20)
        r = h.psctl(self.spec, "serving")
        self.assertEqual(r.returncode, 1, r.stderr)  # serve:3 is down
        addr3 = self.cfg["cluster"]["serve"][3]
        self.assertRegex(r.stderr, r"psctl: serve:3 \(%s\): connection refused" % addr3)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0].split(), ["TASK", "ADDRESS", "SHARD", "VERSION", "STEP",
                                            "AGE", "BEHIND", "ROWS", "MEMORY", "REFUSED",
                                            "LOOKUPS", "LAYOUT"])
        row0 = lines[1].split()
        self.assertEqual(row0[:5], ["serve:0", self.cfg["cluster"]["serve"][0], "0", "5",
                                    "120"])
        # the layout of the version held: mid-move, after the switch, none said
        self.assertEqual(" ".join(row0[-14:]),
                         "2 1000 3.0 MiB 1 0 1 of 2, to 3 after 40 moves")
        self.assertEqual(lines[2].split()[-3:], ["1", "of", "3"])
        self.assertEqual(lines[3].split()[-1], "-")
        self.assertEqual(lines[4].split()[:4], ["serve:3", addr3, "1", "down"])
        self.assertIn("serve:3 (%s) is down" % addr3, r.stdout)
        self.assertIn("serve:0 last refused a publication: pub-0000000006: bad crc",
                      r.stdout)
        r = h.psctl(self.spec, "--json", "serving")
        self.assertEqual(r.returncode, 1, r.stderr)
        doc = json.loads(r.stdout)
        first = doc["serving"][0]
        self.assertEqual((first["index"], first["shard"], first["version"],
                          first["newest_seen"], first["behind"], first["step"],
                          first["rows"], first["bytes"], first["refused"]),
                         (0, 0, 5, 7, 2, 120, 1000, 3 << 20, 1))
        self.assertGreater(first["age_ms"], 0)
        self.assertEqual(first["layout"], {"version": 1, "shards": 2, "move_to": 3,
                                           "moved": 40})
        self.assertNotIn("layout", doc["serving"][2])
        self.assertEqual([d["index"] for d in doc["down"]], [3])
        # All up: exit 0.
        self.stub(3)
        r = h.psctl(self.spec, "serving")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_psctl_serving_without_serving_tasks(self):
        spec = os.path.join(self.d, "plain.json")
        h.write_spec(spec, nps=2, nworker=1)
        r = h.psctl(spec, "serving")
        self.assertEqual(r.returncode, 1)
        self.assertIn("psctl: serving: %s has no cluster.serve" % spec, r.stderr)


if __name__ == "__main__":
    h.main(sys.argv)
