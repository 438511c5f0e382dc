"""Embedding tables end to end (docs/tables.md): real shards, libpsclient's
sparse calls through `pstool rows`, and a stock gRPC client for the bad
input the client library never sends.

- a sparse push then pull returns the optimizer's formula for exactly the
  rows touched; untouched rows keep their initial values;
- duplicate ids in one push are summed;
- libpsclient asks a shard for each row once per call: a pull naming
  every id several times, its ids over both shards and cut into many
  messages (pstool --chunk), answers every position and makes the shards
  answer each id once; a push whose repeats of an id fall in different
  messages is one push of it (summed in order, applied and counted once);
  a pull of 12,000 ids in one message per shard (ids split across the
  received slices) answers the rows a pull of small messages does;
- row-wise optimizers (adagrad) follow their formula in float32;
- admission by count: pulls of an id not admitted get its initial row and
  store nothing; pushes are counted, and the push that reaches the count
  creates and updates the row;
- bad input (an id past the bound, a row gradient of the wrong width, too
  many ids for one answer, a table declared again with another dim) gets
  its status naming the table, the id or the widths, and changes nothing;
- psctl tables, get TABLE --ids (value, optimizer state and stats), top,
  shrink (eviction by push count) and export (one safetensors file that
  numpy reads: ids sorted, values as pulled, the same bytes twice), and
  the tables' metrics;
- a shard killed with SIGKILL and restarted restores its newest checkpoint,
  a full one and a delta after it, bit for bit.
Run: /usr/bin/python3 test_tables.py BUILD_DIR"""
import hashlib
import importlib.util
import json
import math
import os
import signal
import struct
import sys
import unittest

import harness as h
from hashes import shard_of
import pb

f32 = h.f32


TABLES = [
    {"name": "emb", "dim": 4, "init": "uniform", "init_scale": 0.1,
     "optimizer": {"type": "sgd", "lr": 0.5}},
    {"name": "ada", "dim": 3, "init": "uniform", "init_scale": 0.1,
     "optimizer": {"type": "adagrad", "lr": 0.1, "eps": 1e-8, "initial_accumulator": 0.1}},
    {"name": "bounded", "dim": 2, "id_bound": 1000, "optimizer": {"type": "sgd", "lr": 0.5}},
    {"name": "admit", "dim": 2, "init": "zeros", "optimizer": {"type": "sgd", "lr": 1.0},
     "admission": {"type": "count", "count": 2}},
    {"name": "hot", "dim": 2, "optimizer": {"type": "sgd", "lr": 0.5}},
    {"name": "evict", "dim": 2, "optimizer": {"type": "sgd", "lr": 0.5},
     "eviction": {"min_count": 2}},
]
DIMS = {t["name"]: "%d%s" % (t["dim"], ":%d" % t["id_bound"] if "id_bound" in t else "")
        for t in TABLES}


class TablesTest(h.ShardsTest):
    @classmethod
    def job(cls):
        return {"name": "tab", "tables": TABLES,
                "checkpoint": {"dir": os.path.join(cls.tmp.name, "ckpt")}}

    def rows(self, table, op, ids, grads=None, chunk=None, lines=False):
        """pstool rows: a pull's rows in ids' order (lines: every printed
        line's (id, row), in order), None for a push; chunk: the bytes of
        rows per message (--chunk)."""
        args = ["rows", table, DIMS[table], op, ",".join(str(i) for i in ids)]
        if grads is not None:
            args.append(",".join(repr(float(g)) for g in grads))
        if chunk is not None:
            args = ["--chunk", str(chunk)] + args
        r = h.pstool(self.spec, *args)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        if op == "push":
            return None
        got = [(int(line.split()[0]), [f32(float(x)) for x in line.split()[1:]])
               for line in r.stdout.splitlines()[1:]]
        if lines:
            return got
        out = {}
        for i, row in got:
            out.setdefault(i, row)
        return [out[i] for i in ids]

    def fails(self, *args):
        r = h.pstool(self.spec, *args)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        return r.stdout + r.stderr

    def table_sum(self, name, field):
        """A field of table `name` in Status, summed over the shards."""
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "--json",
                   "status"])
        self.assertEqual(r.returncode, 0, r.stderr)
        return sum(t[field] for shard in json.loads(r.stdout)["shards"]
                   for t in shard["tables"] if t["name"] == name)

    def test_push_then_pull_is_the_formula_for_touched_rows_only(self):
        ids = [11, 12, 13, 10**12 + 7, 2**63 + 5]
        before = self.rows("emb", "pull", ids)
        for r in before:  # uniform in [-0.1, 0.1), not all zero
            self.assertTrue(all(-0.1 <= x < 0.1 for x in r), r)
        self.assertTrue(any(x != 0 for r in before for x in r))
        self.assertEqual(before, self.rows("emb", "pull", ids))  # same again
        g = [0.5, -1.0, 0.25, 2.0, -0.75, 0.125, 1.5, -2.5]
        self.rows("emb", "push", [11, 10**12 + 7], g)
        after = self.rows("emb", "pull", ids)
        lr = f32(0.5)
        want11 = [f32(w - f32(lr * f32(x))) for w, x in zip(before[0], g[:4])]
        want_big = [f32(w - f32(lr * f32(x))) for w, x in zip(before[3], g[4:])]
        self.assertEqual(after[0], want11)
        self.assertEqual(after[3], want_big)
        self.assertEqual(after[1], before[1])
        self.assertEqual(after[2], before[2])
        self.assertEqual(after[4], before[4])

    def test_duplicate_ids_are_summed(self):
        before = self.rows("emb", "pull", [21])[0]
        g = [1.0, 2.0, 3.0, 4.0, 0.5, 0.5, 0.5, 0.5, -0.25, 1.0, 0.0, 8.0]
        self.rows("emb", "push", [21, 21, 21], g)
        after = self.rows("emb", "pull", [21])[0]
        s = [f32(f32(g[j] + g[4 + j]) + g[8 + j]) for j in range(4)]
        self.assertEqual(after, [f32(w - f32(f32(0.5) * x)) for w, x in zip(before, s)])

    def test_a_pull_asks_each_shard_for_each_row_once(self):
        ids = list(range(101, 109))
        self.assertEqual({shard_of(i, 2) for i in ids}, {0, 1})
        want = dict(zip(ids, self.rows("emb", "pull", ids)))
        pulled = self.table_sum("emb", "rows_pulled")
        many = [i for _ in range(3) for i in reversed(ids)] + ids  # each 4 times
        got = self.rows("emb", "pull", many, chunk=16, lines=True)  # 1 row a message
        self.assertEqual([i for i, _ in got], many)
        for i, row in got:
            self.assertEqual(row, want[i], i)
        self.assertEqual(self.table_sum("emb", "rows_pulled") - pulled, len(ids))
        pulled = self.table_sum("emb", "rows_pulled")
        got = self.rows("emb", "pull", [103] * 50, lines=True)  # every id the same
        self.assertEqual(got, [(103, want[103])] * 50)
        self.assertEqual(self.table_sum("emb", "rows_pulled") - pulled, 1)

    def test_repeats_in_different_messages_are_one_push(self):
        ids = [91, 92, 91, 93, 91]
        self.assertEqual({shard_of(i, 2) for i in ids}, {0, 1})
        before = self.rows("emb", "pull", [91])[0]
        g = [0.5, -1.0, 0.25, 2.0, 0.125, 0.5, 1.0, -1.0, 0.75, 0.25, -0.5, 1.5,
             1.0, 1.0, 1.0, 1.0, -0.25, 0.5, 2.0, 0.5]
        self.rows("emb", "push", ids, g, chunk=16)  # 1 row a message
        s = [f32(f32(g[j] + g[8 + j]) + g[16 + j]) for j in range(4)]
        self.assertEqual(self.rows("emb", "pull", [91])[0],
                         [f32(w - f32(f32(0.5) * x)) for w, x in zip(before, s)])
        self.assertEqual(self.get_rows("emb", [91])[91]["count"], 1)
        self.assertEqual(self.get_rows("emb", [92])[92]["count"], 1)

    def test_a_large_pull_reads_ids_across_slices(self):
        ids = [200000 + 7 * i for i in range(10000)] + [200000 + 7 * i for i in range(2000)]
        big = self.rows("emb", "pull", ids)  # about 48 KB of ids per shard
        self.assertEqual(big, self.rows("emb", "pull", ids, chunk=1024))  # 64 rows a message

    def test_adagrad_rows_follow_the_formula(self):
        before = self.rows("ada", "pull", [31])[0]
        g = [0.5, -1.0, 2.0]
        self.rows("ada", "push", [31], g)
        after = self.rows("ada", "pull", [31])[0]
        for w0, x, w1 in zip(before, g, after):
            a = f32(f32(0.1) + f32(x * x))
            want = f32(w0 - f32(f32(f32(0.1) * x) / f32(f32(math.sqrt(a)) + f32(1e-8))))
            self.assertLessEqual(abs(w1 - want), 2 * abs(want) * 2**-23, (w1, want))

    def test_admission_by_count(self):
        self.assertEqual(self.rows("admit", "pull", [41])[0], [0.0, 0.0])
        self.assertEqual(self.table_sum("admit", "rows"), 0)  # not stored
        self.rows("admit", "push", [41], [1.0, 2.0])  # counted, not applied
        self.assertEqual(self.rows("admit", "pull", [41])[0], [0.0, 0.0])
        self.assertEqual(self.table_sum("admit", "rows"), 0)
        self.assertEqual(self.table_sum("admit", "pending"), 1)
        self.rows("admit", "push", [41], [0.5, -0.5])  # the second: admitted
        self.assertEqual(self.rows("admit", "pull", [41])[0], [-0.5, 0.5])
        self.assertEqual(self.table_sum("admit", "rows"), 1)
        self.assertEqual(self.table_sum("admit", "pending"), 0)
        self.assertEqual(self.table_sum("admit", "admitted"), 1)
        self.assertGreaterEqual(self.table_sum("admit", "not_admitted"), 3)

    def test_client_refuses_an_id_past_the_bound(self):
        out = self.fails("rows", "bounded", "2:1000", "pull", "5,1000")
        self.assertIn("id 1000", out)
        self.assertIn("id_bound 1000", out)

    def test_table_declared_again_with_another_dim(self):
        before = self.rows("emb", "pull", [51])
        out = self.fails("rows", "emb", "8", "pull", "51")
        self.assertIn("ALREADY_EXISTS", out)
        self.assertIn("dim 4", out)
        self.assertIn("dim 8", out)
        self.assertEqual(self.rows("emb", "pull", [51]), before)

    @unittest.skipUnless(importlib.util.find_spec("grpc"), "python3-grpcio is not installed")
    def test_bad_input_from_a_stock_client(self):
        import grpc  # pylint: disable=import-outside-toplevel
        mine = [i for i in range(2000) if shard_of(i, 2) == 0]
        theirs = [i for i in range(2000) if shard_of(i, 2) == 1]
        before = self.rows("emb", "pull", mine[:3])
        with grpc.insecure_channel(self.addrs[0]) as ch:
            pull = ch.unary_unary("/psd.v1.Data/SparsePull")
            push = ch.unary_unary("/psd.v1.Data/SparsePush")

            def ids(xs):
                return struct.pack("<%dQ" % len(xs), *xs)

            def code(call, msg, *needles):
                with self.assertRaises(grpc.RpcError) as e:
                    call(msg, timeout=30)
                for n in needles:
                    self.assertIn(n, e.exception.details())
                return e.exception.code()

            far = [i for i in range(1000, 100000) if shard_of(i, 2) == 0][0]
            self.assertEqual(code(pull, pb.caller("tab") + pb.ld(2, "bounded") +
                                  pb.ld(15, ids([far])), "id %d" % far, "1000"),
                             grpc.StatusCode.OUT_OF_RANGE)
            self.assertEqual(code(pull, pb.caller("tab") + pb.ld(2, "emb") +
                                  pb.ld(15, ids([theirs[0]])), "shard 1"),
                             grpc.StatusCode.INVALID_ARGUMENT)
            wrong = (pb.caller("tab") + pb.ld(2, "emb") + pb.ld(14, ids(mine[:3])) +
                     pb.ld(15, struct.pack("<9f", *[1.0] * 9)))
            self.assertEqual(code(push, wrong, "'emb'", "width 3", "width 4"),
                             grpc.StatusCode.INVALID_ARGUMENT)
            many = pb.caller("tab") + pb.ld(2, "emb") + pb.ld(15, ids(mine[:1] * 300000))
            self.assertEqual(code(pull, many, "300000 ids"),
                             grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertEqual(code(pull, pb.caller("tab") + pb.ld(2, "nope") +
                                  pb.ld(15, ids(mine[:1])), "'nope'"),
                             grpc.StatusCode.NOT_FOUND)
        self.assertEqual(self.rows("emb", "pull", mine[:3]), before)
        self.assertIsNone(self.ps[0].p.poll(), "psd exited:\n" + self.ps[0].output())

    @unittest.skipUnless(importlib.util.find_spec("grpc"), "python3-grpcio is not installed")
    def test_empty_push_from_a_stock_client(self):
        """A SparsePush with no ids (it once killed the shard with SIGSEGV):
        OK and nothing applied without data; INVALID_ARGUMENT naming the
        table with data. The shard lives on and the table is as it was."""
        import grpc  # pylint: disable=import-outside-toplevel
        mine = [i for i in range(2000) if shard_of(i, 2) == 0][10:13]
        self.rows("emb", "push", mine, [0.5] * 12)
        before = self.rows("emb", "pull", mine)
        pushed = self.table_sum("emb", "rows_pushed")
        with grpc.insecure_channel(self.addrs[0]) as ch:
            push = ch.unary_unary("/psd.v1.Data/SparsePush")
            head = pb.caller("tab") + pb.ld(2, "emb") + pb.uint(3, 32)
            for body in (head, head + pb.ld(14, b""), head + pb.ld(15, b"")):
                push(body, timeout=30)  # OK: raises nothing
            for data in (struct.pack("<2f", 1.0, 2.0), struct.pack("<f", 1.0)):
                with self.assertRaises(grpc.RpcError) as e:
                    push(head + pb.ld(14, b"") + pb.ld(15, data), timeout=30)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("SparsePush 'emb': no ids, but data holds %d bytes"
                              % len(data), e.exception.details())
        self.assertIsNone(self.ps[0].p.poll(), "psd exited:\n" + self.ps[0].output())
        self.assertEqual(self.rows("emb", "pull", mine), before)
        self.assertEqual(self.table_sum("emb", "rows_pushed"), pushed)

    def get_rows(self, table, ids):
        doc = json.loads(self.psctl("--json", "get", table, "--ids",
                                    ",".join(str(i) for i in ids)))
        return {r["id"]: r for r in doc["rows"]}

    def test_psctl_get_shows_value_and_state(self):
        before = self.rows("ada", "pull", [61])[0]
        g = [0.5, -1.0, 2.0]
        self.rows("ada", "push", [61], g)
        row = self.get_rows("ada", [61, 62])
        self.assertTrue(row[61]["found"])
        self.assertFalse(row[62]["found"])  # never touched
        self.assertEqual([f32(x) for x in row[61]["value"]], self.rows("ada", "pull", [61])[0])
        self.assertEqual([f32(x) for x in row[61]["state"]],
                         [f32(f32(0.1) + f32(x * x)) for x in g])
        self.assertEqual(row[61]["state_parts"], ["accum"])
        self.assertEqual((row[61]["count"], row[61]["t"]), (1, 1))
        self.assertNotEqual(before, row[61]["value"])
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "get", "ada",
                   "--ids", "1,x"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("'x' is not an unsigned 64-bit id", r.stderr)
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "top", "nope"])
        self.assertEqual(r.returncode, 1)
        self.assertIn("no table 'nope'", r.stderr)

    def test_psctl_top_export_and_tables(self):
        for _ in range(3):
            self.rows("hot", "push", [71], [1.0, 1.0])
        # A push naming an id twice counts once: 72 is pushed twice.
        self.rows("hot", "push", [72, 72], [1.0, 1.0, 1.0, 1.0])
        self.rows("hot", "push", [72], [1.0, 1.0])
        self.rows("hot", "push", [73], [1.0, 1.0])
        top = json.loads(self.psctl("--json", "top", "hot", "--top", "2"))["top"]
        self.assertEqual([(t["id"], t["count"]) for t in top], [(71, 3), (72, 2)])
        tables = json.loads(self.psctl("--json", "tables"))["tables"]
        hot = [t for t in tables if t["name"] == "hot"]
        self.assertEqual(len(hot), 2)  # one entry per shard
        self.assertEqual(sum(t["rows"] for t in hot), 3)
        self.assertIn("hot", self.psctl("tables"))
        import numpy as np  # pylint: disable=import-outside-toplevel
        out = os.path.join(self.tmp.name, "hot.safetensors")
        digests = []
        for _ in range(2):
            self.psctl("export", "hot", "--out", out)
            with open(out, "rb") as f:
                b = f.read()
            digests.append(hashlib.sha256(b).hexdigest())
        self.assertEqual(digests[0], digests[1])
        n = struct.unpack("<Q", b[:8])[0]
        head = json.loads(b[8:8 + n])
        data = b[8 + n:]
        ids = np.frombuffer(data[slice(*head["ids"]["data_offsets"])], dtype="<u8")
        vals = np.frombuffer(data[slice(*head["values"]["data_offsets"])],
                             dtype="<f4").reshape(head["values"]["shape"])
        self.assertEqual(list(ids), [71, 72, 73])
        pulled = self.rows("hot", "pull", [71, 72, 73])
        self.assertEqual([[f32(x) for x in r] for r in vals.tolist()], pulled)
        metrics = self.psctl("metrics")
        self.assertIn('psd_table_rows{table="hot",shard=', metrics)

    def test_psctl_shrink_evicts_by_count(self):
        self.rows("evict", "push", [81], [1.0, 1.0])
        self.rows("evict", "push", [82, 82], [1.0, 1.0, 1.0, 1.0])
        self.rows("evict", "push", [82], [1.0, 1.0])
        self.rows("evict", "push", [83, 83], [1.0, 1.0, 1.0, 1.0])  # one push
        doc = json.loads(self.psctl("--json", "shrink", "evict"))
        self.assertEqual(sum(s["evicted"] for s in doc["shards"]), 2)
        self.assertEqual(sum(s["rows"] for s in doc["shards"]), 1)
        rows = self.get_rows("evict", [81, 82, 83])
        self.assertFalse(rows[81]["found"])
        self.assertTrue(rows[82]["found"])
        self.assertFalse(rows[83]["found"])  # named twice, pushed once
        self.assertEqual(self.table_sum("evict", "evicted"), 2)

    def test_z_kill9_restores_full_and_delta_bit_for_bit(self):
        # Runs last (z): it restarts the shards.
        ids = list(range(100, 140))
        g1 = [0.25 * ((i % 7) - 3) for i in range(len(ids) * 3)]
        self.rows("ada", "push", ids, g1)
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "checkpoint",
                   "--wait"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        g2 = [0.5] * (10 * 3)
        self.rows("ada", "push", ids[:10], g2)
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "checkpoint",
                   "--wait"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        want = self.rows("ada", "pull", ids)
        want_rows = self.get_rows("ada", ids)  # values, state and stats
        ckroot = os.path.join(self.tmp.name, "ckpt", "tab")
        for i in range(2):
            shard_dir = os.path.join(ckroot, "ps-%d" % i)
            newest = sorted(d for d in os.listdir(shard_dir) if d.startswith("ckpt-"))[-1]
            with open(os.path.join(shard_dir, newest, "manifest.json")) as f:
                m = json.load(f)
            ada = [t for t in m["tables"] if t["name"] == "ada"][0]
            self.assertTrue(ada["delta"], ada)
            self.assertEqual(len(ada["chain"]), 2, ada)
            self.assertLessEqual(ada["rows"], 10, ada)  # only the rows changed
        for i in range(2):
            self.assertEqual(self.ps[i].stop(signal.SIGKILL), -signal.SIGKILL)
        self.__class__.ps = [h.start_psd(self.spec, i) for i in range(2)]
        for p in self.ps:
            p.wait_for("table 'ada': restored from 2 files")
        self.assertEqual(self.get_rows("ada", ids), want_rows)
        self.assertEqual(self.rows("ada", "pull", ids), want)


if __name__ == "__main__":
    h.main(sys.argv)
