"""Workers that follow a job resharded under them (docs/faults.md, "A
reshard under running workers"): libpsclient re-plans on "layout moved".

An async job whose spec lists 3 ps addresses and starts on 2 (job.shards),
sgd with lr 1; two client processes (relayout_pusher.py, psd.Client over
libpsclient) push known gradients, multiples of 1/8 so that every sum is
exact, to a split dense variable, a small one held whole and a table. Both
shards are stopped with SIGTERM (each writes its final checkpoint), `psd
--reshard --shards 3` cuts the job onto 3, and ps:0..ps:2 start again; the
SAME client processes, which retried through the outage, are answered
"layout moved", re-plan ("layout moved: now layout 1 of 3 shards (was 0 of
2); re-planned") and go on. Then again down to 2, ps:2 left running as a
standby. At the end every acknowledged push is applied exactly once: a
fresh client (opened on the spec's layout 0 of 2, so its declare is
answered "moved" too) reads every value back, and it equals minus the sum
of the acknowledged pushes, bit for bit.
Run: /usr/bin/python3 test_relayout.py BUILD_DIR"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time

import numpy as np

import harness as h
import pyshards
from faults import SOAK
from netns import Net, ip, netns_argv

HERE = os.path.dirname(os.path.abspath(__file__))
psd = None


def setUpModule():
    global psd
    psd = pyshards.import_psd()


class RelayoutTest(h.ProcTest):
    def start(self, n, env=None):
        """Shards 0..n-1, with env (a dict: shard -> its extra environment)."""
        ps = [h.Proc([h.build_path("ps-server", "psd"), "--cluster", self.spec,
                      "--task", "ps:%d" % i], env=(env or {}).get(i)) for i in range(n)]
        self.procs += ps
        for p in ps:
            p.wait_for("ready: listening on")
        return ps

    def stop(self, ps):
        for p in ps:
            self.assertEqual(p.stop(signal.SIGTERM), 0, p.output()[-3000:])
        for p in ps:
            if "(standing by)" not in p.output():  # a standby holds nothing
                self.assertIn("checkpoint (at exit)", p.output())

    def reshard(self, m):
        r = h.run([h.build_path("ps-server", "psd"), "--cluster", self.spec,
                   "--reshard", "--shards", str(m)], timeout=300)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        self.assertIn("reshard: done in", out)

    @staticmethod
    def last(p, key):
        """The last "KEY=N;" p said (0: none)."""
        got = re.findall(r"%s=(\d+);" % key, p.output())
        return int(got[-1]) if got else 0

    def acked(self, p):
        return self.last(p, "acked")

    def go_on(self, clients, line, shards, more=4):
        """Each client says line, then acknowledges `more` pushes past the
        count it had when the shards went down, now on `shards` shards."""
        for c in clients:
            n = self.acked(c)
            c.wait_for(line, timeout=180)
            got = c.wait_for("acked=%d;" % (n + more), timeout=180)
            self.assertIn("shards=%d" % shards, got)

    def job(self, serve=False):
        """The spec: 3 addresses, a job that starts on 2; two pushers. With
        serve, the shards publish every 0.2 s and a serving task per
        address follows them."""
        self.spec = os.path.join(self.d, "spec.json")
        job = {"name": "rl", "shards": 2, "optimizer": {"type": "sgd", "lr": 1.0},
               "tables": [{"name": "cnt", "dim": 2, "init": "zeros",
                           "optimizer": {"type": "sgd", "lr": 1.0}},
                          {"name": "mono", "dim": 1, "init": "zeros",
                           "optimizer": {"type": "sgd", "lr": 1.0}}],
               "checkpoint": {"dir": os.path.join(self.d, "ck")}, "retry_s": 240}
        if serve:
            job["publish"] = {"dir": os.path.join(self.d, "pub"), "interval_s": 0.2}
        cfg = h.write_spec(self.spec, nps=3, nworker=2, job=job)
        if serve:
            cfg["cluster"]["serve"] = ["127.0.0.1:%d" % p for p in h.free_ports(3)]
            with open(self.spec, "w") as f:
                json.dump(cfg, f)
        self.stopfile = os.path.join(self.d, "stop")

    def pushers(self):
        self.pausefile = os.path.join(self.d, "pause")
        clients = [h.Proc(["/usr/bin/python3", os.path.join(HERE, "relayout_pusher.py"),
                           h.BUILD, self.spec, str(k), self.stopfile,
                           os.path.join(self.d, "sums%d.npz" % k), self.pausefile])
                   for k in range(2)]
        self.procs += clients
        for c in clients:
            # The job's count, not the pool's.
            self.assertIn("shards=2", c.wait_for("acked=6;", timeout=120))
        return clients

    def test_every_acknowledged_push_applied_once_across_reshards(self):
        self.job()
        ps = self.start(2)
        clients = self.pushers()

        # 2 -> 3: the clients retry through the stop, then re-plan.
        self.stop(ps)
        self.reshard(3)
        ps = self.start(3)
        self.go_on(clients, "psd: layout moved: now layout 1 of 3 shards (was 0 of 2); "
                   "re-planned", 3)

        # 3 -> 2, ps:2 left standing by: a call to it is answered "moved".
        self.stop(ps)
        self.reshard(2)
        ps = self.start(3)
        self.assertIn("standing by", ps[2].output())
        self.go_on(clients, "psd: layout moved: now layout 2 of 2 shards (was 1 of 3); "
                   "re-planned", 2)
        self.verify(clients, 2)
        self.stop(ps)

    def serving(self):
        """A serving task per address, and a serving client looking up
        every row of the table and the split dense variable throughout
        (relayout_looker.py), once it found them all."""
        serve = [h.Proc([h.build_path("ps-server", "psd"), "--cluster", self.spec,
                         "--task", "serve:%d" % j]) for j in range(3)]
        self.procs += serve
        for p in serve:
            p.wait_for("ready: listening on")
        self.look = [os.path.join(self.d, n) for n in ("lookstop", "save", "looked.npz")]
        looker = h.Proc(["/usr/bin/python3", os.path.join(HERE, "relayout_looker.py"),
                         h.BUILD, self.spec] + self.look)
        self.procs.append(looker)
        return serve, looker

    def served(self, serve, looker):
        """After verify (the pushers stopped): the served values come to
        equal every acknowledged push; no lookup failed and no row once
        found was answered not found."""
        sums = [np.load(os.path.join(self.d, "sums%d.npz" % k)) for k in range(2)]
        want_rows = -(sums[0]["rows"] + sums[1]["rows"])
        want_d = -(sums[0]["d"] + sums[1]["d"])
        bad = None

        def equal():
            nonlocal bad
            n = looker.output().count("saved ")
            with open(self.look[1], "w"):
                pass
            h.until("the looker's save", lambda: looker.output().count("saved ") > n,
                    timeout=60)
            got = np.load(self.look[2])
            bad = (np.count_nonzero(got["rows"] != want_rows),
                   np.count_nonzero(got["d"] != want_d))
            return bad == (0, 0)
        try:
            h.until("the served values to equal every acknowledged push", equal,
                    timeout=60, every=0.3)
        except AssertionError:
            raise AssertionError("served values differ (rows, d): %s\nlooker: %s\n%s" % (
                bad, looker.output()[-1500:],
                "\n".join(p.output()[-1500:] for p in serve)))
        with open(self.look[0], "w"):
            pass
        self.assertEqual(looker.wait(timeout=60), 0, looker.output()[-3000:])
        last = looker.output().strip().splitlines()[-1]
        self.assertRegex(last, r"done looked=\d+; failed=0; unfound=0; went_back=0$",
                         "\n".join(l for l in looker.lines if l.startswith("failed"))[:3000])
        print("serving: %s (%s); serve:2 applied %d publications" % (
            last, re.findall(r"slowest round [0-9.]+ ms", looker.output())[-1],
            serve[2].output().count("serving version")))

    def test_live_reshard_under_pushers(self):
        """psctl reshard --shards M as a user types it (the job's table rows
        moved live, 8 buckets a batch, then the switch) and with --stop (the
        shards re-executing themselves): the same counters, 2 -> 3 -> 2
        each way. Serving tasks follow throughout (one per address), and a
        serving client looks up every row of the table and the split dense
        variable: not one lookup fails, no row once found is answered not
        found, and once the pushers stop the served values equal every
        acknowledged push (ps:2 published the rows moved to it while
        standing by, and serve:2 answered them). ps:2, the first move's
        destination, loses its first MOVE_DONE (as past its tries across a
        link cut longer than the call's deadline): the source keeps that
        move open, refusing every other, until ps:2 tells it at its next
        move."""
        self.job(serve=True)
        ps = self.start(3, {2: {"PSD_TEST_LOSE_MOVE_DONE": "1"}})  # ps:2 stands by
        serve, looker = self.serving()
        clients = self.pushers()
        looker.wait_for("all_found=1", timeout=120)
        for how, m, line in (([], 3, "now layout 1 of 3 shards (was 0 of 2"),
                             ([], 2, "now layout 2 of 2 shards (was 1 of 3"),
                             (["--stop"], 3, "now layout 3 of 3 shards (was 2 of 2)"),
                             (["--stop"], 2, "now layout 4 of 2 shards (was 3 of 3)")):
            # live: 8 buckets a batch, 171 hand-overs each way, lookups between
            r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec,
                       "reshard", "--shards", str(m)] + (how or ["--batch", "8"]),
                      timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("ps:0 says done" if not how else "reshard done in", r.stdout)
            self.go_on(clients, "psd: layout moved: " + line, m)
            looker.wait_for("looked=%d;" % (self.last(looker, "looked") + 3), timeout=60)
            if m == 3 and not how:
                self.assertRegex(ps[2].output(), r"move [0-9a-f]+: told ps:\d that its "
                                 r"buckets are owned here \(its MOVE_DONE had not "
                                 r"reached it\)")
                # The standby shard published the rows moved to it; its task served them.
                self.assertIn("publication 1 (full)", ps[2].output())
                self.assertIn("serving version 1 (full", serve[2].output())
        self.verify(clients, 4)
        self.served(serve, looker)
        # psctl serving names the layout each task's version holds
        r = h.psctl(self.spec, "serving")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        rows = {l.split()[0]: l for l in r.stdout.splitlines()[1:]}
        for j in (0, 1):
            self.assertTrue(rows["serve:%d" % j].endswith(" 4 of 2"), r.stdout)
        self.stop(ps)

    def test_live_reshards_with_kills_under_pushers(self):
        """Live reshards by stop and cut (--stop) while two clients push, a
        shard killed (kill -9)
        in each once its final checkpoint is written and started again as a
        supervisor would: ps:1 (a source: the reshard goes on), or ps:0 (it
        is interrupted, the job stays in its layout, and asked again it is
        done). Every acknowledged push is applied once. make test: 2 -> 3
        with ps:1 killed, 3 -> 2 with ps:0 killed; make soak: 10 rounds."""
        self.job()
        ps = self.start(3)
        clients = self.pushers()
        rounds = [(3, 1), (2, 0)] + ([(3, 0), (2, 1), (3, 1), (2, 0), (3, 1), (2, 1),
                                      (3, 0), (2, 0)] if SOAK else [])
        layout = 0
        for m, victim in rounds:
            p = h.Proc([h.build_path("ps-server", "psctl"), "--cluster", self.spec,
                        "reshard", "--shards", str(m), "--stop"])
            self.procs.append(p)
            n = ps[victim].output().count("checkpoint (at exit)")
            while ps[victim].output().count("checkpoint (at exit)") == n:
                ps[victim].wait_for("checkpoint (at exit)", timeout=120, new=True)
            ps[victim].stop(signal.SIGKILL)
            ps[victim] = h.Proc([h.build_path("ps-server", "psd"), "--cluster", self.spec,
                                 "--task", "ps:%d" % victim])
            self.procs.append(ps[victim])
            rc = p.wait(timeout=300)
            if victim == 0:
                # Interrupted: the job stays in its layout; asked again.
                self.assertEqual(rc, 1, p.output())
                self.assertIn("reshard not done: ps:0 says interrupted", p.output())
                r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec,
                           "reshard", "--shards", str(m), "--stop"], timeout=300)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            else:
                self.assertEqual(rc, 0, p.output())
            layout += 1  # an interrupted reshard makes no layout
            ps[victim].wait_for("ready: listening on", timeout=120)
            prev = 3 if m == 2 else 2
            self.go_on(clients, "psd: layout moved: now layout %d of %d shards" % (layout, m),
                       m)
            print("round: %d -> %d, ps:%d killed, layout %d" % (prev, m, victim, layout))
        self.verify(clients, layout)
        self.stop(ps)

    def test_live_moves_with_kills_under_pushers(self):
        """psctl reshard --shards M (the table's rows moved live, a bucket a
        batch) while two clients push, and a shard killed (kill -9) in the
        middle of the moves: the clients paused and every shard
        checkpointed first, so that no push is past a checkpoint (the
        documented loss), then the victim started again as a supervisor
        would, the clients going on, and psctl reshard asked again until
        it is done. Every acknowledged push is applied once. make test:
        2 -> 3 with the destination (ps:2) killed; make soak: 8 rounds,
        each shard the victim, sources and destinations."""
        self.job()
        ps = self.start(3)
        clients = self.pushers()
        rounds = [(3, 2)] + ([(2, 0), (3, 1), (2, 2), (3, 0), (2, 1), (3, 2), (2, 0)]
                             if SOAK else [])
        rng = random.Random(37)
        per = 1 if SOAK else 4  # buckets a batch
        layout = 0
        for m, victim in rounds:
            ctl = h.Proc([h.build_path("ps-server", "psctl"), "--cluster", self.spec,
                          "reshard", "--shards", str(m), "--batch", str(per)])
            self.procs.append(ctl)
            # A batch of this round (ps:0's log holds its earlier rounds').
            seen_n = len(re.findall(r"live move: batch \d+, ", ps[0].output()))
            batch = rng.randint(20, 1365 // per // 3)
            h.until("ps:0's batch %d of this round" % batch,
                    lambda: len(re.findall(r"live move: batch \d+, ", ps[0].output()))
                    - seen_n >= batch, timeout=120, every=0.01)
            # No push past the checkpoints: the clients paused, every shard
            # (those holding moved rows by move files too) checkpointed.
            paused = [c.output().count("paused acked=") for c in clients]
            with open(self.pausefile, "w"):
                pass
            h.until("both clients paused",
                    lambda: all(c.output().count("paused acked=") > n
                                for c, n in zip(clients, paused)), timeout=120, every=0.01)
            r = h.psctl(self.spec, "checkpoint", "--wait", timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            ps[victim].stop(signal.SIGKILL)
            ps[victim] = h.Proc([h.build_path("ps-server", "psd"), "--cluster", self.spec,
                                 "--task", "ps:%d" % victim])
            self.procs.append(ps[victim])
            ps[victim].wait_for("ready: listening on", timeout=120)
            os.remove(self.pausefile)
            rc, tries, said = ctl.wait(timeout=300), 1, ctl.output()
            while rc != 0:
                if tries >= 5:  # what the shards said, for the failure below
                    for i, p in enumerate(ps):
                        print("=== ps:%d\n" % i + "\n".join(
                            l for l in p.output().splitlines()[-400:]
                            if "live move: batch" not in l and "moved buckets" not in l
                            and "handed over 1 buckets" not in l))
                self.assertLess(tries, 5, said)
                again = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec,
                               "reshard", "--shards", str(m), "--batch", str(per)],
                              timeout=300)
                rc, tries, said = again.returncode, tries + 1, again.stdout + again.stderr
            layout += 1
            self.go_on(clients, "psd: layout moved: now layout %d of %d shards" % (layout, m),
                       m)
            print("round: -> %d shards, ps:%d killed at batch %d, psctl asked %d times"
                  % (m, victim, batch, tries))
        self.verify(clients, layout, m)
        self.stop(ps)

    def test_live_moves_across_a_cut_link(self):
        """psctl reshard --shards 3 with each shard in a network namespace
        of its own on a bridge (this process on it too), two clients
        pushing: mid-move the link between ps:0 (a source) and ps:2 (the
        destination) is cut both ways (each drops what it sends the other,
        iptables; the clients still reach both) for 3 s and restored.
        The batch under way waits and goes on, psctl ends done, every
        bucket on one owner and every push applied once."""
        if not shutil.which("iptables"):
            self.skipTest("the iptables command is not installed (make setup-test)")
        net = Net(self, "psdr")
        br = net.netns("b")
        ip("-n", br, "link", "add", "br0", "type", "bridge")
        ip("-n", br, "link", "set", "br0", "up")
        sub = "10.215.%d" % random.randrange(1, 250)
        addr = ["%s.%d" % (sub, 10 + i) for i in range(3)]
        ns = []
        for i in range(3):
            ns.append(net.netns(str(i)))
            net.veth("eth0", "p%d" % i, ns[i], br, addr[i] + "/24")
            ip("-n", br, "link", "set", "p%d" % i, "master", "br0")
        net.veth("psdr" + net.tag, "q", None, br, sub + ".2/24")  # this process
        ip("-n", br, "link", "set", "q", "master", "br0")
        self.job()
        with open(self.spec) as f:
            spec = json.load(f)
        spec["cluster"]["ps"] = ["%s:7100" % a for a in addr]
        spec["job"]["unix_sockets"] = False  # every call over the bridge
        with open(self.spec, "w") as f:
            json.dump(spec, f)
        ps = []
        for i in range(3):
            ps.append(h.Proc(netns_argv(ns[i], [h.build_path("ps-server", "psd"),
                                                "--cluster", self.spec, "--task",
                                                "ps:%d" % i])))
            self.procs.append(ps[-1])
        for p in ps:
            p.wait_for("ready: listening on", timeout=60)
        clients = self.pushers()
        ctl = h.Proc([h.build_path("ps-server", "psctl"), "--cluster", self.spec,
                      "reshard", "--shards", "3", "--batch", "8"])
        self.procs.append(ctl)
        # Cut once ps:0 has given ps:2 a few batches.
        h.until("ps:0's third batch handed over",
                lambda: len(re.findall(r"move \d+: handed over", ps[0].output())) >= 3,
                timeout=120, every=0.01)
        # Each end drops what it sends the other (iptables in its
        # namespace): packets vanish, connections in flight stall, new
        # ones hang.
        cut = [(ns[0], addr[2]), (ns[2], addr[0])]
        for n, a in cut:
            subprocess.run(["ip", "netns", "exec", n, "iptables", "-A", "OUTPUT", "-d", a,
                            "-j", "DROP"], check=True)
        time.sleep(3)  # the cut's length, not a wait for anything
        for n, a in cut:
            subprocess.run(["ip", "netns", "exec", n, "iptables", "-D", "OUTPUT", "-d", a,
                            "-j", "DROP"], check=True)
        self.assertEqual(ctl.wait(timeout=300), 0, ctl.output() + "\n".join(
            l for l in ps[0].output().splitlines()[-60:] if "live move: batch" not in l))
        self.assertRegex(ctl.output(), r"ps:0 says done: layout 1 of 3 shards from 2, "
                                       r"1365 bucket moves")
        # The move felt the cut: ps:0 (its driver) waited over 2.5 s for a
        # batch (its MoveBuckets to ps:2 crosses the cut too).
        at = [3600 * int(a) + 60 * int(b) + float(c) for a, b, c in re.findall(
            r"^(\d\d):(\d\d):([\d.]+) psd ps:0 info: live move: batch ", ps[0].output(),
            re.M)]
        self.assertGreater(max(y - x for x, y in zip(at, at[1:])), 2.5)
        self.go_on(clients, "psd: layout moved: now layout 1 of 3 shards", 3)
        self.verify(clients, 1, 3)
        self.stop(ps)

    def verify(self, clients, layout, shards=2):
        """Stops the pushers; a fresh client reads back minus the sum of
        every acknowledged push, bit for bit."""
        with open(self.stopfile, "w"):
            pass
        sums = []
        for k, c in enumerate(clients):
            self.assertEqual(c.wait(timeout=120), 0, c.output()[-3000:])
            self.assertIn("done ", c.output())
            # A move is no outage given up on, nor a failed call.
            self.assertNotIn("Traceback", c.output())
            sums.append(np.load(os.path.join(self.d, "sums%d.npz" % k)))
        want_d = -(sums[0]["d"] + sums[1]["d"])
        want_b = -(sums[0]["b"] + sums[1]["b"])
        want_rows = -(sums[0]["rows"] + sums[1]["rows"])
        ids = sums[0]["ids"]

        # A fresh client opens on the spec's layout 0 of 2: its declare is
        # answered "moved", and it follows.
        lines = []
        psd.set_log_callback(lambda level, line: lines.append(line))
        try:
            with psd.Client(self.spec, None) as c:
                c.declare("d", (want_d.size,))
                c.declare("b", (want_b.size,))
                c.declare_table("cnt", 2)
                d = np.empty_like(want_d)
                b = np.empty_like(want_b)
                rows = np.empty_like(want_rows)
                c.pull(["d", "b"], [d, b])
                c.pull_rows("cnt", ids, rows)
        finally:
            psd.set_log_callback(None)
        self.assertIn("layout moved: now layout %d of %d shards (was 0 of 2); re-planned"
                      % (layout, shards), lines)
        for what, got, want in (("d", d, want_d), ("b", b, want_b),
                                ("cnt", rows, want_rows)):
            bad = np.flatnonzero(got.ravel() != want.ravel())
            self.assertEqual(bad.size, 0, "%s: %d elements differ, first %s: %s, "
                             "acknowledged %s" % (what, bad.size, bad[:5],
                                                  got.ravel()[bad[:5]],
                                                  want.ravel()[bad[:5]]))
        for c in clients:
            print("\n".join(l for l in c.lines if l.startswith("psd:")))
        n = sum(self.acked(c) for c in clients)
        print("relayout: %d pushes acknowledged across layouts 0 (2 shards), 1 (3), "
              "2 (2), each applied once" % n)


if __name__ == "__main__":
    h.main()
