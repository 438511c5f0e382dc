#!/usr/bin/env python3
"""ps:0 drives a whole live move (psctl reshard --moves, docs/reshard.md
"Moving rows live"): batches, progress, --rate, --cancel and resume, the
switch at the end, 2 -> 3 -> 2 while a client pushes counted rows; and
kills (-9) of a destination, a source, a destination between its move file
and MOVE_DONE, and a shard after the switch, each leaving one owner per
bucket and every acknowledged push applied once. The shard side of a move
and of the switch is test_live_moves.py's."""
import json
import os
import signal
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import test_live_moves as lm  # noqa: E402
import test_reshard as tr  # noqa: E402
from test_live_moves import Rounds  # noqa: E402

psd = None


def setUpModule():
    global psd
    lm.setUpModule()
    psd = lm.psd


class DriveMoveTest(tr.ReshardBase):
    """ps:0 drives a whole live move (psctl reshard --moves, docs/reshard.md
    "Live: psctl reshard"): 2 -> 3 shards, every batch of cm_layout_moves
    a MoveBuckets from ps:0's thread, then the switch, while a psd.Client
    pushes counted gradients to table rows; psctl prints progress lines
    and the result. Every acknowledged push is counted once after it,
    every bucket has one owner; a rate paces the batches, --cancel stops
    after the batch under way, and asked again the move resumes from the
    shards' move state."""
    JOB = "dm"
    POOL, PER_PUSH = 3000, 300
    def setUp(self):
        super().setUp()
        self.client, self.rounds = None, None

    def tearDown(self):
        # The pushing client stops before the shards do.
        if self.rounds:
            self.rounds.finish()
        if self.client:
            self.client.close()
        super().tearDown()

    def job_up(self, job_extra=None, envs=None):
        """An async job of 2 shards and a table on 3 addresses (ps:2
        standing by), and a client that pushes (push()) to 300 of 3000 ids
        a round, each gradient counted in self.sums: (spec, shards)."""
        job = {"name": self.JOB, "shards": 2, "optimizer": {"type": "sgd", "lr": 1.0},
               "tables": [{"name": "cnt", "dim": 2, "init": "zeros",
                           "optimizer": {"type": "sgd", "lr": 1.0}}]}
        job.update(job_extra or {})
        spec = tr.specs(self.d, job, [3], nworker=1)[3]
        ps = self.shards(spec, 3, envs)
        rng = np.random.default_rng(11)
        self.pool = np.arange(1, self.POOL + 1, dtype=np.uint64) * np.uint64(7919)
        self.sums = np.zeros((self.POOL, 2), np.float32)
        self.touched = np.zeros(self.POOL, bool)
        self.client = c = psd.Client(spec, None)
        c.declare_table("cnt", 2)

        def push_once():
            pick = rng.choice(self.POOL, self.PER_PUSH, replace=False)
            g = (rng.integers(-8, 9, (self.PER_PUSH, 2)) / 8).astype(np.float32)
            c.push_rows("cnt", self.pool[pick], g)
            self.sums[pick] -= g
            self.touched[pick] = True
        self.push_once = push_once
        return spec, ps

    def pushing(self):
        """The client pushing round after round on a thread (2 rounds done)."""
        self.rounds = Rounds(self.push_once)
        self.rounds.wait(self, 2)
        return self.rounds

    def stop_pushing(self):
        """After 2 more rounds."""
        self.rounds.wait(self, self.rounds.n + 2)
        self.rounds.finish()

    def assert_counted_once(self, spec, done, frm=2, to=3, pulled=False):
        """Each shard owns its buckets of the map after `done` moves of frm
        -> to (4096 in all), holds the rows of those alone, and a new client
        reads every acknowledged push once. pulled: an earlier call's pull
        stored rows of ids never pushed (a shard restarted since holds those
        its checkpoint did), so each shard holds from its pushed rows to
        every id of the pool in its buckets."""
        from hashes import bucket_map, moves, splitmix64_at  # pylint: disable=import-outside-toplevel
        mv, mt = moves(frm, to), bucket_map(to)
        owner = list(bucket_map(frm))
        for b in mv[:done]:
            owner[b] = mt[b]
        r = h.psctl(spec, "--json", "status")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        doc = json.loads(r.stdout)["shards"]
        self.assertEqual(sum(d["buckets_owned"] for d in doc), 4096)
        held, pool = [0, 0, 0], [0, 0, 0]
        for i, t in zip(self.pool, self.touched):
            home = owner[splitmix64_at(int(i)) >> 52]
            held[home] += int(t)
            pool[home] += 1
        for s in range(3):
            self.assertEqual(doc[s]["buckets_owned"], owner.count(s), s)
            rows = sum(t["rows"] for t in doc[s]["tables"])
            if pulled:
                self.assertTrue(held[s] <= rows <= pool[s], (s, held[s], rows, pool[s]))
            else:
                self.assertEqual(rows, held[s], s)
        with psd.Client(spec, None) as c:
            c.declare_table("cnt", 2)
            got = np.empty((self.POOL, 2), np.float32)
            c.pull_rows("cnt", self.pool, got)
            np.testing.assert_array_equal(got, self.sums)
        return doc

    def test_moves_2_to_3_while_a_client_pushes(self):
        from hashes import bucket_map, moves  # pylint: disable=import-outside-toplevel
        spec, ps = self.job_up({"checkpoint": {"dir": os.path.join(self.d, "ck")}})
        mv, m2, m3 = moves(2, 3), bucket_map(2), bucket_map(3)
        batches, k = 0, 0
        while k < len(mv):
            j = k
            while j < len(mv) and j - k < 64 and (m2[mv[j]], m3[mv[j]]) == (m2[mv[k]],
                                                                              m3[mv[k]]):
                j += 1
            batches, k = batches + 1, j
        self.pushing()
        # Unpaced: batches of a few ms each, many moves under one call of
        # the client (which follows them all: client-moved's
        # move_steps_under_one_call_followed).
        r = h.psctl(spec, "reshard", "--shards", "3", "--moves", "--batch", "64")
        out = r.stdout + r.stderr
        self.stop_pushing()
        self.assertIn("moving table rows live from 2 to 3 shards: 1365 bucket moves (0 "
                      "made), %d batches of at most 64 buckets" % batches, out)
        progress = [x for x in r.stdout.splitlines() if x.startswith("moving: ")]
        self.assertGreaterEqual(len(progress), 1, out)
        self.assertTrue(progress[-1].startswith(
            "moving: 1365 of 1365 bucket moves made, 0 left; "), progress[-1])
        self.assertEqual(r.returncode, 0, out)
        self.assertIn("reshard done in ", out)
        self.assertIn("ps:0 says done: layout 1 of 3 shards from 2, 1365 bucket moves (1365 in "
                      "%d batches now)" % batches, out)
        doc = self.assert_counted_once(spec, len(mv))
        m = doc[0]["move"]
        self.assertEqual((m["running"], m["from"], m["to"], m["moves"], m["moved"], m["left"],
                          m["batch"], m["batches"], m["cancelled"], m["rate_mbps"]),
                         (False, 2, 3, 1365, 1365, 0, 64, batches, False, 0))
        self.assertGreater(m["rows"], 0)
        self.assertGreater(m["bytes"], 32 * m["rows"] - 1)
        self.assertGreater(m["bytes_per_s"], 0)
        self.assertGreaterEqual(m["last_rounds"], 1)
        self.assertGreaterEqual(m["max_pause_us"], m["last_pause_us"])
        self.assertTrue(doc[0]["reshard"].startswith("last: done: layout 1 of 3"),
                        doc[0]["reshard"])
        for s in range(3):  # the switch ended the move: layout 1 of 3, no move state
            self.assertEqual((doc[s]["layout"], doc[s]["move_to"], doc[s]["moved"]), (1, 0, 0), s)
            self.assertNotIn("move", doc[s] if s else {}, s)
        # The client's calls answered "layout moved" meanwhile (every call
        # naming a bucket moved away) are routine: no shard counts them as
        # errors or warns of them.
        for s in range(3):
            self.assertEqual(doc[s]["errors"], 0, s)
            self.assertEqual([x for x in ps[s].output().splitlines()
                              if " warn: " in x and "layout moved" in x], [], s)
        r = h.psctl(spec, "metrics")
        for line in ('psd_move_buckets_left{shard="0"} 0',
                     'psd_move_buckets_moved{shard="0"} 1365',
                     'psd_move_batches_total{shard="0"} %d' % batches,
                     'psd_move_running{shard="0"} 0'):
            self.assertIn(line, r.stdout)
        # The same count again: refused, nothing changes.
        r = h.psctl(spec, "reshard", "--shards", "3", "--moves")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("refused by ps:0", r.stderr)
        # And back to 2, live, while the client pushes: ps:2 ends standing by.
        self.pushing()
        r = h.psctl(spec, "reshard", "--shards", "2", "--moves", "--batch", "64", "--rate",
                    "0.1")
        out = r.stdout + r.stderr
        self.stop_pushing()
        self.assertEqual(r.returncode, 0, out)
        self.assertIn("ps:0 says done: layout 2 of 2 shards from 3, 1365 bucket moves", out)
        doc = self.assert_counted_once(spec, len(mv), 3, 2)
        self.assertEqual([d["layout"] for d in doc], [2, 2, 2])
        self.assertTrue(doc[2]["standby"], doc[2])

    def test_derived_batch_holds_16384_rows_at_most(self):
        """Without --batch, ps:0 sizes a batch by the fullest source's rows
        per bucket: 16,384 rows at most (a hand-over's pause walks the
        batch's rows), 256 buckets at most. 600,000 rows (about 146 a
        bucket on each of 2 shards): batches of 111-113 buckets, where a
        bytes-only rule gave 256."""
        from hashes import bucket_map, moves  # pylint: disable=import-outside-toplevel
        spec, _ = self.job_up()
        ids = np.arange(600000, dtype=np.uint64)
        for b in range(0, len(ids), 100000):
            self.client.push_rows("cnt", ids[b:b + 100000],
                                  np.zeros((100000, 2), np.float32))
        doc = json.loads(h.psctl(spec, "--json", "status").stdout)["shards"]
        per = max(sum(t["rows"] for t in doc[s]["tables"]) / doc[s]["buckets_owned"]
                  for s in range(2))
        want = min(256, int(16384 / per))
        self.assertTrue(100 < want < 128, (per, want))
        mv, m2, m3 = moves(2, 3), bucket_map(2), bucket_map(3)
        batches, k = 0, 0
        while k < len(mv):
            j = k
            while j < len(mv) and j - k < want and (m2[mv[j]], m3[mv[j]]) == (m2[mv[k]],
                                                                                m3[mv[k]]):
                j += 1
            batches, k = batches + 1, j
        r = h.psctl(spec, "reshard", "--shards", "3", "--moves")
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        self.assertIn("1365 bucket moves (0 made), %d batches of at most %d buckets"
                      % (batches, want), out)
        self.assertIn("ps:0 says done: layout 1 of 3 shards from 2, 1365 bucket moves (1365 in "
                      "%d batches now)" % batches, out)

    def test_rate_paces_cancel_stops_then_resumes(self):
        spec, ps = self.job_up()
        self.pushing()
        first = self.reshard_bg(spec, "--batch", "16", "--rate", "0.0001")
        # The first batch is 16 buckets of about 12 rows, 32 bytes each: at
        # 100 bytes/s ps:0 waits seconds before the next; the cancel ends it.
        ps[0].wait_for("before the next batch to keep to 0.0001 MB/s (--rate)")
        r = h.psctl(spec, "reshard", "--cancel")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("the live move to 3 shards stops after its batch under way", r.stdout)
        self.assertEqual(first.wait(), 1, first.output())
        said = ("ps:0 says stopped: cancelled (psctl reshard --cancel) after 1 batch: 16 of "
                "1365 bucket moves made, every bucket has one owner")
        self.assertIn(said, first.output())
        self.assertIn(said, r.stdout)
        self.assertIn("moving: 16 of 1365 bucket moves made, 1349 left; ", first.output())
        self.stop_pushing()
        doc = self.assert_counted_once(spec, 16)
        m = doc[0]["move"]
        self.assertEqual((m["moved"], m["batches"], m["waits"], m["cancelled"], m["rate_mbps"]),
                         (16, 1, 1, True, 0.0001))
        st = h.psctl(spec, "status").stdout
        self.assertIn("MOVE: table rows to 3 shards, 16 of 1365 bucket moves made", st)
        r = h.psctl(spec, "reshard", "--cancel")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("no live move is under way; nothing to cancel", r.stderr)
        # Resumed from the shards' 16 moves, in batches of 512 at most.
        self.pushing()
        r = h.psctl(spec, "reshard", "--shards", "3", "--moves", "--batch", "512")
        self.stop_pushing()
        out = r.stdout + r.stderr
        self.assertIn("1365 bucket moves (resumed: 16 made), 4 batches of at most 512", out)
        self.assertEqual(r.returncode, 0, out)
        self.assertIn("ps:0 says done: layout 1 of 3 shards from 2", out)
        self.assert_counted_once(spec, 1365)

    def moved_16_then_killed(self, victim, checkpoint):
        """Pushes (then paused, so that counts are exact), optionally a
        checkpoint of every shard, then a live move cancelled after its
        first batch (16 of 1365 moves, to ps:2), then the shard `victim`
        (-1: that batch's source) killed (kill -9) and started again: it
        owns the map's buckets after 16 moves and every push is counted
        once; then the move finishes. Returns the restarted shard's log."""
        from hashes import bucket_map, moves  # pylint: disable=import-outside-toplevel
        spec, ps = self.job_up({"checkpoint": {"dir": os.path.join(self.d, "ck"),
                                               "every_s": 3600}})
        self.pushing()
        self.stop_pushing()
        if checkpoint:
            r = h.psctl(spec, "checkpoint", "--wait")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        first = self.reshard_bg(spec, "--batch", "16", "--rate", "0.0001")
        ps[0].wait_for("before the next batch to keep to 0.0001 MB/s (--rate)")
        r = h.psctl(spec, "reshard", "--cancel")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(first.wait(), 1, first.output())
        if victim < 0:
            victim = bucket_map(2)[moves(2, 3)[0]]
        ps[victim].stop(signal.SIGKILL)
        again = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec, "--task",
                        "ps:%d" % victim])
        self.procs.append(again)
        again.wait_for("ready: listening on")
        out = again.output()
        self.assertIn("live move: ps:%d goes on with the move from 2 to 3 shards after 16 of "
                      "1365 moves" % victim, out)
        self.assert_counted_once(spec, 16)
        # The move goes on from the shards' 16 and ends with the switch.
        self.finish_resumed(spec, 16)
        return out

    def test_destination_killed_after_a_batch_keeps_its_rows(self):
        """ps:2 (standing by, no checkpoint) received 16 buckets; killed
        and started again, it finds them in its move file."""
        out = self.moved_16_then_killed(2, False)
        self.assertIn("its move files 16, the other shards 16): owns 16 buckets; 1 move "
                      "file applied", out)

    def test_source_killed_after_a_batch_drops_what_it_gave(self):
        """The batch's source, restarted from its checkpoint taken before
        the move (which holds the 16 buckets' rows), learns the job's 16
        moves from the other shards and drops those rows: one owner each."""
        out = self.moved_16_then_killed(-1, True)
        self.assertIn("(its checkpoint 0, its move files 0, the other shards 16)", out)
        self.assertRegex(out, r"owns 20[0-9][0-9] buckets; 0 move files applied \(0 rows\), "
                         r"[1-9][0-9]* rows of buckets owned elsewhere dropped")

    def test_destination_killed_before_done_the_source_move_ends(self):
        """ps:2, the destination, killed (-9, by its test-only
        PSD_TEST_KILL_AFTER_MOVE_FILE) after its first batch's move file and
        before its MOVE_DONE reaches the source, which keeps that move open
        and would refuse the next; started again, ps:2 applies the file and
        tells the source the move is done, and the move resumes and ends,
        every push counted once."""
        from hashes import bucket_map, moves  # pylint: disable=import-outside-toplevel
        spec, ps = self.job_up({"checkpoint": {"dir": os.path.join(self.d, "ck"),
                                               "every_s": 3600}})
        self.pushing()
        self.stop_pushing()
        self.assertEqual(ps[2].stop(signal.SIGTERM), 0, ps[2].output())
        ps[2] = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec, "--task", "ps:2"],
                       env=dict(os.environ, PSD_TEST_KILL_AFTER_MOVE_FILE="1"))
        self.procs.append(ps[2])
        ps[2].wait_for("ready: listening on")
        r = h.psctl(spec, "reshard", "--shards", "3", "--moves", "--batch", "16")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("stopped: batch 1 ", r.stdout + r.stderr)
        self.assertEqual(ps[2].wait(), -signal.SIGKILL, ps[2].output()[-2000:])
        src = bucket_map(2)[moves(2, 3)[0]]
        again = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec, "--task", "ps:2"])
        self.procs.append(again)
        again.wait_for("ready: listening on")
        out = again.output()
        self.assertIn("live move: ps:2 goes on with the move from 2 to 3 shards after 16 of "
                      "1365 moves", out)
        self.assertRegex(out, r"live move: told ps:%d that move [0-9a-f]{16}'s buckets are "
                              r"owned here" % src)
        self.assert_counted_once(spec, 16)
        self.finish_resumed(spec, 16)

    def test_switched_shard_killed_serves_the_new_layout(self):
        """After a finished move 2 -> 3 (a split dense variable and a whole
        one besides the table), each shard checkpoints layout 1 of 3 on
        its COMMIT; ps:2 (taken in by the switch, until now no checkpoint)
        and then ps:0, killed (kill -9) and started again, serve layout 1
        of 3 with their dense slices and table rows, every push once, and
        write checkpoints of it."""
        ck = os.path.join(self.d, "ck")
        spec, ps, check = self.dense_job()
        r = h.psctl(spec, "reshard", "--shards", "3", "--moves", "--batch", "512")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for p in ps:  # each shard's checkpoint of the new layout, asked by its COMMIT
            p.wait_for("checkpoint (layout switch) at step")
        check(False)
        for victim in (2, 0):
            ps[victim].stop(signal.SIGKILL)
            again = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec, "--task",
                            "ps:%d" % victim])
            self.procs.append(again)
            again.wait_for("ready: listening on")
            self.assertIn("shard %d of 3, job" % victim, again.output())
            ps[victim] = again
            doc = json.loads(h.psctl(spec, "--json", "status").stdout)["shards"]
            self.assertEqual([(d["layout"], d.get("standby", False)) for d in doc],
                             [(1, False)] * 3)
            check(True)
            r = h.psctl(spec, "checkpoint", "--wait")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(os.path.join(ck, self.JOB, "ps-%d" % victim,
                                   sorted(x for x in os.listdir(os.path.join(
                                       ck, self.JOB, "ps-%d" % victim))
                                          if x.startswith("ckpt-"))[-1],
                                   "manifest.json")) as f:
                m = json.load(f)
            self.assertEqual((m["layout"], m["nshards"]), (1, 3))

    def dense_job(self, envs=None):
        """job_up's job with checkpoints, rows pushed and counted, and a
        split dense variable and a whole one pushed: (spec, shards, check),
        check(pulled) asserting every push once, table and dense; shard i
        started with envs[i] (test-only kill points) when given."""
        ck = os.path.join(self.d, "ck")
        spec, ps = self.job_up({"checkpoint": {"dir": ck, "every_s": 3600}}, envs)
        c, rng = self.client, np.random.default_rng(5)
        dense = {"d": np.zeros(70000, np.float32), "w": np.zeros(100, np.float32)}
        for name, v in dense.items():
            c.declare(name, v.shape)
        self.pushing()
        self.stop_pushing()
        for name, v in dense.items():
            g = (rng.integers(-8, 9, v.size) / 8).astype(np.float32)
            c.push(name, g)
            v -= g
        # Every shard's checkpoint of it all (a shard killed before its next
        # loses what it applied since: async's limit).
        r = h.psctl(spec, "checkpoint", "--wait")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

        def check(pulled):
            self.assert_counted_once(spec, 1365, pulled=pulled)
            with psd.Client(spec, None) as c2:
                for name, v in dense.items():
                    c2.declare(name, v.shape)
                    got = np.empty(v.size, np.float32)
                    c2.pull(name, got)
                    np.testing.assert_array_equal(got, v, name)
        return spec, ps, check

    def finish_resumed(self, spec, made):
        """psctl reshard --moves again while the client pushes: it resumes
        from the shards' `made` moves and ends with the switch, every push
        counted once."""
        self.pushing()
        r = h.psctl(spec, "reshard", "--shards", "3", "--moves", "--batch", "512")
        self.stop_pushing()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("(resumed: %d made)" % made, r.stdout + r.stderr)
        self.assert_counted_once(spec, 1365)

    def reshard_bg(self, spec, *args):
        """`psctl reshard --shards 3 --moves ARGS` started (stopped at the
        end if still running): its Proc."""
        p = h.Proc([h.build_path("ps-server", "psctl"), "--cluster", spec, "reshard",
                    "--shards", "3", "--moves"] + list(args))
        self.procs.append(p)
        return p

    def again(self, spec, i):
        p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec, "--task",
                    "ps:%d" % i])
        self.procs.append(p)
        p.wait_for("ready: listening on")
        return p

    def test_shard_killed_after_its_commit_resumes_into_the_switch(self):
        """ps:1 killed (-9, by its test-only PSD_TEST_KILL_AFTER_COMMIT) when
        it has swapped in its new slices and before it checkpointed them:
        its COMMIT's answer never reaches ps:0, which decided the switch
        (its switch-L1.commit) and sends the COMMIT again; started again,
        ps:1 resumes into layout 1 of 3 from the slices it staged on disk
        at PREPARE and its checkpoint of layout 0, answers the COMMIT done,
        and checkpoints layout 1; every push is counted once, table and
        dense. Before, it came back in layout 0 and its dense slices of
        layout 1 were lost."""
        spec, ps, check = self.dense_job({1: {"PSD_TEST_KILL_AFTER_COMMIT": "1"}})
        root = os.path.join(self.d, "ck", self.JOB)
        p = self.reshard_bg(spec, "--batch", "512")
        self.assertEqual(ps[1].wait(), -signal.SIGKILL, ps[1].output()[-2000:])
        # ps:0's decision (until its own checkpoint of layout 1, which
        # removes it, stands for it), and ps:1's staging
        ps0 = os.path.join(root, "ps-0")

        def layout_of(ck):
            try:
                with open(os.path.join(ps0, ck, "manifest.json")) as f:
                    return json.load(f).get("layout")
            except (OSError, ValueError):  # pruned meanwhile
                return None
        self.assertTrue(os.path.exists(os.path.join(ps0, "switch-L1.commit"))
                        or 1 in [layout_of(x) for x in os.listdir(ps0)
                                 if x.startswith("ckpt-")])
        self.assertIn("switch-L1", os.listdir(os.path.join(root, "ps-1")))
        ps[0].wait_for("the switch's COMMIT did not reach ps:1")
        ps[1] = self.again(spec, 1)
        out = ps[1].output()
        self.assertIn("layout switch: this shard was stopped after the switch from layout 0 "
                      "of 2 shards to layout 1 of 3 shards was decided and before it "
                      "checkpointed the new one: it resumes into layout 1", out)
        self.assertIn("shard 1 of 3, job", out)
        self.assertEqual(p.wait(), 0, p.output())
        self.assertIn("ps:0 says done: layout 1 of 3 shards from 2", p.output())
        ps[1].wait_for("checkpoint (layout switch, resumed at start) at step")
        doc = json.loads(h.psctl(spec, "--json", "status").stdout)["shards"]
        self.assertEqual([(d["layout"], d.get("standby", False)) for d in doc],
                         [(1, False)] * 3)
        check(False)
        for i in range(3):  # each checkpointed layout 1: staging and decision gone
            ps[i].wait_for("at step") if i != 1 else None
            r = h.psctl(spec, "checkpoint", "--wait")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual([x for x in os.listdir(os.path.join(root, "ps-%d" % i))
                              if x.startswith("switch-")], [], i)

    def test_shard_taken_in_killed_after_its_commit_resumes_into_the_switch(self):
        """ps:2, which the switch takes in (standing by until then, no
        checkpoint of its own: its rows are in its move files), killed (-9,
        PSD_TEST_KILL_AFTER_COMMIT) when it has swapped in its slices and
        before its first checkpoint: started again it resumes into layout
        1 of 3 from its move files and its staged variables, and every
        push is counted once."""
        spec, ps, check = self.dense_job({2: {"PSD_TEST_KILL_AFTER_COMMIT": "1"}})
        p = self.reshard_bg(spec, "--batch", "512")
        self.assertEqual(ps[2].wait(), -signal.SIGKILL, ps[2].output()[-2000:])
        ps[2] = self.again(spec, 2)
        self.assertIn("it resumes into layout 1", ps[2].output())
        self.assertIn("shard 2 of 3, job", ps[2].output())
        self.assertEqual(p.wait(), 0, p.output())
        ps[2].wait_for("checkpoint (layout switch, resumed at start) at step")
        doc = json.loads(h.psctl(spec, "--json", "status").stdout)["shards"]
        self.assertEqual([(d["layout"], d.get("standby", False)) for d in doc],
                         [(1, False)] * 3)
        check(False)

    def test_shard_killed_in_its_prepare_the_switch_aborts(self):
        """ps:2, the shard the switch takes in, killed (-9, by its test-only
        PSD_TEST_KILL_AFTER_PREPARE) once it staged its slices on disk and
        before it answered PREPARE: ps:0 decided nothing, sends ABORT and
        says the move stopped; started again, ps:2 drops the staging (ps:0
        never committed it) and stays in layout 0 with its moved rows, and
        psctl reshard --moves again makes the switch; every push once."""
        spec, ps, check = self.dense_job({2: {"PSD_TEST_KILL_AFTER_PREPARE": "1"}})
        root = os.path.join(self.d, "ck", self.JOB)
        r = h.psctl(spec, "reshard", "--shards", "3", "--moves", "--batch", "512")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("the switch's PREPARE failed on ps:2", r.stdout + r.stderr)
        self.assertEqual(ps[2].wait(), -signal.SIGKILL, ps[2].output()[-2000:])
        self.assertNotIn("switch-L1.commit", os.listdir(os.path.join(root, "ps-0")))
        ps[2] = self.again(spec, 2)
        self.assertIn("which ps:0 never committed", ps[2].output())
        self.assertNotIn("switch-L1", os.listdir(os.path.join(root, "ps-2")))
        r = h.psctl(spec, "reshard", "--shards", "3", "--moves")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("(resumed: 1365 made)", r.stdout + r.stderr)
        check(True)

    def test_ps0_killed_after_its_decision_finishes_the_switch_at_start(self):
        """ps:0 killed (-9, by its test-only PSD_TEST_KILL_AFTER_DECISION)
        once it wrote its decision to commit layout 1 and before it sent
        any COMMIT: ps:1 and ps:2 stay frozen, prepared; started again,
        ps:0 resumes into layout 1 from its staging and sends the COMMIT
        its last process did not, and every shard serves layout 1 of 3,
        every push counted once."""
        spec, ps, check = self.dense_job({0: {"PSD_TEST_KILL_AFTER_DECISION": "1"}})
        # psctl loses ps:0 (it waits for it to come back: stopped at the end)
        self.reshard_bg(spec, "--batch", "512")
        self.assertEqual(ps[0].wait(), -signal.SIGKILL, ps[0].output()[-2000:])
        for i in (1, 2):
            self.assertIn("PREPARE: ", ps[i].output())
            self.assertNotIn("COMMIT: ", ps[i].output())
        ps[0] = self.again(spec, 0)
        self.assertIn("it resumes into layout 1", ps[0].output())
        ps[0].wait_for("layout switch: every shard holds layout 1 of 3 shards (the COMMIT "
                       "sent again by ps:0, resumed into it)")
        for i in (1, 2):
            ps[i].wait_for("COMMIT: ps:%d serves layout 1 of 3 shards" % i)
        doc = json.loads(h.psctl(spec, "--json", "status").stdout)["shards"]
        self.assertEqual([(d["layout"], d.get("standby", False)) for d in doc],
                         [(1, False)] * 3)
        check(True)

    def test_ps0_killed_before_its_decision_the_others_thaw(self):
        """ps:0 killed (-9, by its test-only PSD_TEST_KILL_AFTER_FREEZE) once
        every shard froze for the switch, before any decision: started
        again, ps:0 holds layout 0 and runs no move, so ps:1 and ps:2,
        which ask it (3 s after they froze, then every second), abort the
        switch themselves and take dense calls again; psctl reshard
        --moves makes the switch, every push counted once."""
        spec, ps, check = self.dense_job({0: {"PSD_TEST_KILL_AFTER_FREEZE": "1"}})
        self.reshard_bg(spec, "--batch", "512")
        self.assertEqual(ps[0].wait(), -signal.SIGKILL, ps[0].output()[-2000:])
        ps[0] = self.again(spec, 0)
        for i in (1, 2):
            ps[i].wait_for("ABORT (by this shard: ps:0 answers in an older layout and runs "
                           "no switch, its last process lost this one)")
        r = h.psctl(spec, "reshard", "--shards", "3", "--moves")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("(resumed: 1365 made)", r.stdout + r.stderr)
        check(True)

    def test_usage_and_a_job_that_cannot_move(self):
        job = {"name": self.JOB, "shards": 2}
        spec = tr.specs(self.d, job, [2], nworker=1)[2]
        for args in (["--moves"], ["--shards", "2", "--moves", "--stop"],
                     ["--shards", "2", "--stop", "--batch", "8"],
                     ["--shards", "2", "--stop", "--rate", "1"],
                     ["--shards", "2", "--moves", "--batch", "0"],
                     ["--shards", "2", "--moves", "--batch", "4097"],
                     ["--shards", "2", "--moves", "--rate", "0"],
                     ["--shards", "2", "--moves", "--rate", "fast"],
                     ["--cancel", "--shards", "2"], ["--cancel", "--moves"]):
            r = h.psctl(spec, "reshard", *args)
            self.assertEqual(r.returncode, 2, (args, r.stdout + r.stderr))
        r = h.psctl(spec, "status", "--moves")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("belong to 'reshard'", r.stderr)
        self.shards(spec, 2)
        r = h.psctl(spec, "reshard", "--shards", "1", "--moves")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("a live move cannot be made: the job has no embedding table", r.stderr)


if __name__ == "__main__":
    h.main()
