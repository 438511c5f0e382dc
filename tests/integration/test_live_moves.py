#!/usr/bin/env python3
"""Live moves of table rows (psctl reshard --moves, docs/reshard.md "Moving
rows live" and "Live moves (the shard side)"): buckets handed from shard to
shard while clients push, the client following each hand-over, the switch
that ends a move (dense variables re-placed, layout V+1), ps:0 driving a
whole move with its progress, rate and cancel, and kills (-9) of a source,
a destination and a shard after the switch, each leaving one owner per
bucket and every acknowledged push applied once."""
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import test_reshard as tr  # noqa: E402

psd = None


def setUpModule():
    global psd
    tr.setUpModule()
    psd = tr.psd


class Rounds:
    """body() called round after round on a thread of its own until
    finish(), counted; the first exception ends it and is kept."""

    def __init__(self, body):
        import threading  # pylint: disable=import-outside-toplevel
        self.n, self.errors = 0, []
        self.stop = threading.Event()
        self.cv = threading.Condition()
        self.t = threading.Thread(target=self._run, args=(body,))
        self.t.start()

    def _run(self, body):
        try:
            while not self.stop.is_set():
                body()
                with self.cv:
                    self.n += 1
                    self.cv.notify_all()
        except Exception as e:  # pylint: disable=broad-except
            self.errors.append(repr(e))
        with self.cv:
            self.cv.notify_all()

    def wait(self, test, k):
        """Until k rounds are done (test fails on an error or after 60 s)."""
        with self.cv:
            test.assertTrue(self.cv.wait_for(lambda: self.n >= k or self.errors,
                                             timeout=60), self.n)
        test.assertEqual(self.errors, [])

    def finish(self):
        self.stop.set()
        self.t.join()


class LiveMoveTest(tr.ReshardBase):
    """A live move of buckets, the shard side (docs/reshard.md "Live moves
    (the shard side)"): MoveBuckets to ps:1 takes half of ps:0's buckets
    while a pusher keeps pushing to ids in them, sending a batch refused
    "layout moved: ... bucket B ..." again to the other shard."""
    JOB = "mv"

    def test_buckets_move_while_pushes_go_on(self):
        import importlib.util  # pylint: disable=import-outside-toplevel
        if not importlib.util.find_spec("grpc"):
            self.skipTest("python3-grpcio is not installed")
        import struct  # pylint: disable=import-outside-toplevel
        import grpc  # pylint: disable=import-outside-toplevel
        import pb  # pylint: disable=import-outside-toplevel
        from hashes import bucket_map, splitmix64_at  # pylint: disable=import-outside-toplevel
        job = {"name": self.JOB, "shards": 2,
               "tables": [{"name": "cnt", "dim": 1, "init": "zeros",
                           "optimizer": {"type": "sgd", "lr": 1.0}}]}
        spec = tr.specs(self.d, job, [2], nworker=1)[2]
        self.shards(spec, 2)
        with open(spec) as f:
            addrs = json.load(f)["cluster"]["ps"]
        m2 = bucket_map(2)
        mine = [b for b in range(4096) if m2[b] == 0]
        moving = set(mine[::2])
        bits = bytearray(512)
        for b in moving:
            bits[b >> 3] |= 1 << (b & 7)

        def bucket(i):
            return splitmix64_at(i) >> 52
        ids = list(range(1, 601))
        owner = {i: m2[bucket(i)] for i in ids}
        self.assertGreater(sum(bucket(i) in moving for i in ids), 100)
        acked = {i: 0 for i in ids}
        chans = [grpc.insecure_channel(a) for a in addrs]
        push = [c.unary_unary("/psd.v1.Data/SparsePush") for c in chans]
        pull = [c.unary_unary("/psd.v1.Data/SparsePull") for c in chans]
        refused = [0]

        def send(s, xs):
            msg = (pb.caller(self.JOB) + pb.ld(2, "cnt") +
                   pb.ld(14, struct.pack("<%dQ" % len(xs), *xs)) +
                   pb.ld(15, struct.pack("<%df" % len(xs), *[-1.0] * len(xs))))
            push[s](msg, timeout=30)

        def push_all():
            todo = list(ids)
            while todo:
                s = owner[todo[0]]
                xs = [i for i in todo if owner[i] == s]
                try:
                    send(s, xs)
                except grpc.RpcError as e:
                    d = e.details() or ""
                    if e.code() != grpc.StatusCode.FAILED_PRECONDITION or \
                            not d.startswith("layout moved: "):
                        raise
                    b = int(d.split("; bucket ")[1].split()[0])
                    refused[0] += 1
                    for i in ids:  # nothing of it applied: again
                        if bucket(i) == b:
                            owner[i] = 1 - s
                    continue
                for i in xs:
                    acked[i] += 1
                todo = [i for i in todo if owner[i] != s]

        rounds = Rounds(push_all)
        try:
            rounds.wait(self, 3)
            r = pb.fields(chans[1].unary_unary("/psd.v1.Admin/MoveBuckets")(
                pb.caller(self.JOB) + pb.uint(2, 0) + pb.ld(3, bytes(bits)),
                timeout=60))
            rounds.wait(self, rounds.n + 3)
        finally:
            rounds.finish()
        self.assertEqual(rounds.errors, [])
        self.assertGreater(r[1][0], 0)   # rows
        self.assertGreater(r[3][0], 0)   # rounds of copies
        self.assertIn(4, r)              # the pause, in µs
        self.assertGreater(refused[0], 0)
        # Every id once, on its one shard, worth every acknowledged push.
        for s in (0, 1):
            st = pb.fields(chans[s].unary_unary("/psd.v1.Admin/Status")(
                pb.caller(self.JOB), timeout=30))
            self.assertEqual(st[99][0], 1024 if s == 0 else 3072)
            rows = pb.fields(st[90][0])[5][0]
            self.assertEqual(rows, sum(1 for i in ids if owner[i] == s), s)
        for i in ids:
            want = 1 if bucket(i) in moving or m2[bucket(i)] == 1 else 0
            self.assertEqual(owner[i], want, i)
        for s in (0, 1):
            xs = [i for i in ids if owner[i] == s]
            got = pb.fields(pull[s](pb.caller(self.JOB) + pb.ld(2, "cnt") +
                                    pb.ld(15, struct.pack("<%dQ" % len(xs), *xs)),
                                    timeout=30))[15][0]
            vals = struct.unpack("<%df" % len(xs), got)
            self.assertEqual(list(vals), [float(acked[i]) for i in xs])
            try:
                pull[1 - s](pb.caller(self.JOB) + pb.ld(2, "cnt") +
                            pb.ld(15, struct.pack("<Q", xs[0])), timeout=30)
                self.fail("ps:%d answered a pull of id %d" % (1 - s, xs[0]))
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
                self.assertTrue(e.details().startswith("layout moved: "), e.details())
        for c in chans:
            c.close()


class FollowMoveTest(tr.ReshardBase):
    """Clients follow a live move of table rows (docs/reshard.md "Live
    moves (the shard side)"): 2 -> 3 shards, batch by batch in
    cm_layout_moves's order, each batch a MoveBuckets to ps:2 from its
    source naming the move's state after it (move_to 3, moved k), while a
    psd.Client pushes counted gradients to table rows and a split dense
    variable between the batches. Every acknowledged push is applied once,
    each id lives on its shard in the map after every move (a new client
    that starts from the 2-shard layout finds them), and the dense
    variable, which this phase does not move, is whole."""
    JOB = "fm"
    BATCH = 256  # buckets per MoveBuckets
    POOL, PER_PUSH, D = 3000, 300, 70000

    def test_client_follows_2_to_3(self):
        import grpc  # pylint: disable=import-outside-toplevel
        import pb  # pylint: disable=import-outside-toplevel
        from hashes import bucket_map, moves  # pylint: disable=import-outside-toplevel
        job = {"name": self.JOB, "shards": 2, "optimizer": {"type": "sgd", "lr": 1.0},
               "tables": [{"name": "cnt", "dim": 2, "init": "zeros",
                           "optimizer": {"type": "sgd", "lr": 1.0}}]}
        spec = tr.specs(self.d, job, [3], nworker=1)[3]
        self.shards(spec, 3)  # ps:2 stands by
        with open(spec) as f:
            addrs = json.load(f)["cluster"]["ps"]
        rng = np.random.default_rng(7)
        pool = np.arange(1, self.POOL + 1, dtype=np.uint64) * np.uint64(7919)
        sums = np.zeros((self.POOL, 2), np.float32)
        dense = np.zeros(self.D, np.float32)
        c = psd.Client(spec, None)
        c.declare("d", (self.D,))
        c.declare_table("cnt", 2)

        def push_once():
            pick = rng.choice(self.POOL, self.PER_PUSH, replace=False)
            g = (rng.integers(-8, 9, (self.PER_PUSH, 2)) / 8).astype(np.float32)
            c.push_rows("cnt", pool[pick], g)
            sums[pick] -= g
            gd = (rng.integers(-8, 9, self.D) / 8).astype(np.float32)
            c.push("d", gd)
            dense[:] -= gd

        mv, m2, m3 = moves(2, 3), bucket_map(2), bucket_map(3)
        chan = grpc.insecure_channel(addrs[2])
        move = chan.unary_unary("/psd.v1.Admin/MoveBuckets")
        calls, pauses, last = 0, [], {}
        rounds = Rounds(push_once)
        try:
            rounds.wait(self, 2)
            k = 0
            while k < len(mv):
                src, j = m2[mv[k]], k
                while j < len(mv) and j - k < self.BATCH and m2[mv[j]] == src:
                    j += 1
                bits = bytearray(512)
                for b in mv[k:j]:
                    bits[b >> 3] |= 1 << (b & 7)
                r = pb.fields(move(pb.caller(self.JOB) + pb.uint(2, src) + pb.ld(3, bytes(bits))
                                   + pb.uint(5, 3) + pb.uint(6, j), timeout=60))
                pauses.append(r.get(4, [0])[0])
                calls += 1
                last[src] = last[2] = j
                k = j
                rounds.wait(self, rounds.n + 2)  # the client steps between batches
        finally:
            rounds.finish()
            c.close()
            chan.close()
        self.assertEqual(rounds.errors, [])
        print("\nfollow: %d moves in %d MoveBuckets, %d client rounds, hand-overs %s us"
              % (len(mv), calls, rounds.n, pauses))
        self.assertEqual(k, len(mv))
        # Every shard owns its buckets of the 3-shard map, and knows the move.
        chans = [grpc.insecure_channel(a) for a in addrs]
        try:
            for s in range(3):
                st = pb.fields(chans[s].unary_unary("/psd.v1.Admin/Status")(
                    pb.caller(self.JOB), timeout=30))
                self.assertEqual(st[99][0], sum(1 for b in m3 if b == s), s)
                # The move as of its last hand-over: ps:2 took part in all.
                self.assertEqual((st[97][0], st[98][0]), (3, last[s]), s)
        finally:
            for ch in chans:
                ch.close()
        # psctl status: each shard's buckets, and the move as far as a
        # shard knows it.
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", spec, "status"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("BUCKETS: " + " ".join("ps:%d %d" % (s, sum(1 for b in m3 if b == s))
                                             for s in range(3)), r.stdout)
        self.assertIn("MOVE: table rows to 3 shards, %d of %d bucket moves made (ps:2's count)"
                      % (len(mv), len(mv)), r.stdout)
        # A new client starts from the 2-shard layout, follows the move, and
        # reads every acknowledged push once.
        with psd.Client(spec, None) as c:
            c.declare("d", (self.D,))
            c.declare_table("cnt", 2)
            got = np.empty((self.POOL, 2), np.float32)
            c.pull_rows("cnt", pool, got)
            np.testing.assert_array_equal(got, sums)
            gd = np.empty(self.D, np.float32)
            c.pull("d", gd)
            np.testing.assert_array_equal(gd, dense)


class SwitchTest(tr.ReshardBase):
    """The step that ends a live move (Admin/SwitchLayout, docs/reshard.md
    "Live moves (the shard side)"): a 2-shard async job with a split dense
    variable, a whole one and a table moves every bucket to 3 shards, then
    FREEZE, PREPARE, COMMIT on all 3 make layout 1 of 3: every pushed
    amount is in the values once, the split variable's rows on 3 shards,
    the whole one where cm_layout_replace puts it, a dense pull made while
    frozen is retried by the client until the commit, and the client goes
    on in the new layout. An ABORT after PREPARE changes nothing; a wrong
    version and a switch before the moves are refused naming both; 3 -> 2
    leaves ps:2 standing by."""
    JOB = "sw"
    D, W = 70000, 100

    def test_switch_2_3_2(self):
        import threading  # pylint: disable=import-outside-toplevel
        import grpc  # pylint: disable=import-outside-toplevel
        import pb  # pylint: disable=import-outside-toplevel
        from hashes import bucket_map, fnv1a64, moves  # pylint: disable=import-outside-toplevel
        job = {"name": self.JOB, "shards": 2, "optimizer": {"type": "sgd", "lr": 1.0},
               "tables": [{"name": "cnt", "dim": 2, "init": "zeros",
                           "optimizer": {"type": "sgd", "lr": 1.0}}]}
        spec = tr.specs(self.d, job, [3], nworker=1)[3]
        self.shards(spec, 3)  # ps:2 stands by
        with open(spec) as f:
            addrs = json.load(f)["cluster"]["ps"]
        chans = [grpc.insecure_channel(a) for a in addrs]
        rng = np.random.default_rng(11)
        ids = np.arange(1, 501, dtype=np.uint64) * np.uint64(104729)
        sums = {"cnt": np.zeros((len(ids), 2), np.float32),
                "d": np.zeros(self.D, np.float32), "w": np.zeros(self.W, np.float32)}
        c = psd.Client(spec, None)
        self.addCleanup(c.close)
        c.declare("d", (self.D,))
        c.declare("w", (self.W,))
        c.declare_table("cnt", 2)

        def push_once():
            g = (rng.integers(-8, 9, (len(ids), 2)) / 8).astype(np.float32)
            c.push_rows("cnt", ids, g)
            sums["cnt"] -= g
            for name, n in (("d", self.D), ("w", self.W)):
                gd = (rng.integers(-8, 9, n) / 8).astype(np.float32)
                c.push(name, gd)
                sums[name] -= gd

        def check_values():
            got = np.empty((len(ids), 2), np.float32)
            c.pull_rows("cnt", ids, got)
            np.testing.assert_array_equal(got, sums["cnt"])
            for name, n in (("d", self.D), ("w", self.W)):
                out = np.empty(n, np.float32)
                c.pull(name, out)
                np.testing.assert_array_equal(out, sums[name], name)

        def call(s, method, msg):
            return pb.fields(chans[s].unary_unary(method)(msg, timeout=60))

        def status(s):
            st = call(s, "/psd.v1.Admin/Status", pb.caller(self.JOB))
            st["vars_"] = {}
            for v in st.get(12, []):
                f = pb.fields(v)
                st["vars_"][f[1][0].decode()] = (f.get(3, [0])[0], f.get(4, [0])[0])
            return st

        def switch(s, phase, frm, to, layout):
            return call(s, "/psd.v1.Admin/SwitchLayout",
                        pb.caller(self.JOB) + pb.uint(2, phase) + pb.uint(3, frm)
                        + pb.uint(4, to) + pb.uint(5, layout))

        def refused(s, phase, frm, to, layout):
            try:
                switch(s, phase, frm, to, layout)
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
                return e.details()
            self.fail("ps:%d took SwitchLayout %d %d->%d layout %d" % (s, phase, frm, to, layout))

        def move_all(frm, to):
            mv, mf, mt = moves(frm, to), bucket_map(frm), bucket_map(to)
            k = 0
            while k < len(mv):
                src, dst, j = mf[mv[k]], mt[mv[k]], k
                while j < len(mv) and j - k < 1024 and mf[mv[j]] == src and mt[mv[j]] == dst:
                    j += 1
                bits = bytearray(512)
                for b in mv[k:j]:
                    bits[b >> 3] |= 1 << (b & 7)
                call(dst, "/psd.v1.Admin/MoveBuckets",
                     pb.caller(self.JOB) + pb.uint(2, src) + pb.ld(3, bytes(bits))
                     + pb.uint(5, to) + pb.uint(6, j))
                k = j
                push_once()  # the client steps between batches

        def assert_split(sts, n):
            """d's rows: contiguous ranges of ps:0..n-1 in order, balanced."""
            at = 0
            for s in range(n):
                b, e = sts[s]["vars_"]["d"]
                self.assertEqual(b, at, s)
                self.assertIn(e - b, (self.D // n, self.D // n + 1), s)
                at = e
            self.assertEqual(at, self.D)

        push_once()
        # Before the moves: refused, naming what the shard owns.
        self.assertIn("the moves to 3 shards are not done on ps:0", refused(0, 0, 2, 3, 1))
        move_all(2, 3)
        # A wrong version, refused naming both.
        d = refused(1, 0, 2, 3, 5)
        self.assertIn("to layout 5", d)
        self.assertIn("ps:1 holds layout 0 of 2 shards", d)
        t0 = time.monotonic()
        for s in range(3):
            switch(s, 0, 2, 3, 1)
        self.assertIn("switching to layout 1 of 3", status(0)[95][0].decode())
        try:
            chans[0].unary_unary("/psd.v1.Data/Pull")(pb.pull(self.JOB, [("d", 0, 10)]), timeout=30)
            self.fail("a frozen shard answered a dense pull")
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIn("layout switching to layout 1 of 3 shards", e.details())
        # A dense pull while frozen: retried by the client until the commit.
        frozen_pull = {}

        def pull_frozen():
            c2 = psd.Client(spec, None)
            try:
                c2.declare("d", (self.D,))
                out = np.empty(self.D, np.float32)
                c2.pull("d", out)
                frozen_pull["d"], frozen_pull["t"] = out, time.monotonic()
            except Exception as e:  # pylint: disable=broad-except
                frozen_pull["err"] = repr(e)
            finally:
                c2.close()
        th = threading.Thread(target=pull_frozen)
        th.start()
        prep = [pb.fields(b"") for _ in range(3)]
        for s in range(3):
            prep[s] = switch(s, 1, 2, 3, 1)
            self.assertEqual(switch(s, 1, 2, 3, 1).get(1, [0]), prep[s].get(1, [0]))  # again: OK
        self.assertGreater(prep[2][1][0], 0)  # ps:2 fetched its slices
        self.assertNotIn("t", frozen_pull)    # still waiting
        t_commit = time.monotonic()
        for s in range(3):
            r = switch(s, 2, 2, 3, 1)
            self.assertGreater(r[2][0], 0, s)  # the pause
        switch(0, 2, 2, 3, 1)  # COMMIT again: OK
        th.join(60)
        self.assertNotIn("err", frozen_pull)
        np.testing.assert_array_equal(frozen_pull["d"], sums["d"])
        self.assertGreater(frozen_pull["t"], t_commit)
        print("\nswitch 2 -> 3: %.0f ms from the first FREEZE to the first COMMIT"
              % ((t_commit - t0) * 1000))
        # Layout 1 of 3: the split variable in 3 ranges, the whole one where
        # cm_layout_replace puts an auto one (by name).
        home = fnv1a64(b"w") % 3
        sts = [status(s) for s in range(3)]
        for s, st in enumerate(sts):
            self.assertEqual((st[93][0], st[2][0], st.get(94, [0])[0]), (1, 3, 0), s)
            self.assertEqual(st.get(97, [0])[0], 0, s)  # no move state
            self.assertEqual("w" in st["vars_"], s == home, s)
        assert_split(sts, 3)
        check_values()
        push_once()
        check_values()
        # ABORT after PREPARE: nothing changes.
        self.assertIn("not done", refused(2, 0, 3, 2, 2))
        move_all(3, 2)
        for s in range(3):
            switch(s, 0, 3, 2, 2)
        for s in range(3):
            switch(s, 1, 3, 2, 2)
        for s in range(3):
            self.assertIn(b"aborted", switch(s, 3, 3, 2, 2)[3][0])
        sts = [status(s) for s in range(3)]
        for s, st in enumerate(sts):
            self.assertEqual((st[93][0], st[2][0]), (1, 3), s)
            self.assertEqual("w" in st["vars_"], s == home, s)
        assert_split(sts, 3)
        check_values()
        push_once()
        # 3 -> 2 for real: ps:2 stands by.
        for phase in (0, 1, 2):
            for s in range(3):
                switch(s, phase, 3, 2, 2)
        sts = [status(s) for s in range(3)]
        for s, st in enumerate(sts):
            self.assertEqual((st[93][0], st[2][0], st.get(94, [0])[0]),
                             (2, 2, int(s == 2)), s)
        self.assertEqual(sts[2]["vars_"], {})  # standing by: holds nothing
        self.assertEqual(sum("w" in st["vars_"] for st in sts), 1)
        assert_split(sts, 2)
        push_once()
        check_values()
        for ch in chans:
            ch.close()


if __name__ == "__main__":
    h.main()
