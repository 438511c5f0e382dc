"""Fault tests of what a retry and a load must not break: a push sent twice
is applied once (also across a checkpoint and a kill -9), and many clients
pushing and pulling for a while keep every update exact and psd's memory
flat. Run by test_faults.py."""
import json
import os
import re
import signal
import threading
import time

import harness as h
from faults import (LOAD_TABLE, SOAK, Checkpointer, Faults, fields, psctl, status,
                    table_totals)



class DedupTest(Faults):
    def push(self, spec, *ident, value="1"):
        r = h.pstool(spec, *ident, "push", "w", "4,3", "0", ",".join([value] * 12))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.strip(), "OK")

    def value(self, spec):
        r = h.pstool(spec, "pull", "w", "0", "12")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        m = re.match(r"OK version=(\d+) values=([-\d.e,]+)", r.stdout)
        vals = [float(v) for v in m.group(2).split(",")]
        self.assertEqual(len(set(vals)), 1, vals)
        return int(m.group(1)), vals[0]

    def test_same_push_twice_is_applied_once(self):
        spec = h.spec_in(self.d, {"name": "dedup", "optimizer": {"type": "sgd", "lr": 0.5}},
                         nps=1, nworker=1)
        p = self.psd(spec, 0, env={"PSD_LOG": "debug"})
        r = h.pstool(spec, "declare", "w", "4,3")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        ident = ("--client-id", "0x5eed", "--seq", "1", "--chunk-id", "0")
        self.push(spec, *ident)
        self.push(spec, *ident)  # the retry: acknowledged, no effect
        self.assertEqual(self.value(spec), (1, -0.5))
        self.assertIn("(client 0000000000005eed, seq 1, chunk 0): acknowledged without "
                      "effect", p.wait_for("duplicate push from"))
        # Another chunk of the same push, then the next push: applied.
        self.push(spec, "--client-id", "0x5eed", "--seq", "1", "--chunk-id", "1")
        self.push(spec, "--client-id", "0x5eed", "--seq", "2", "--chunk-id", "0")
        self.assertEqual(self.value(spec), (3, -1.5))
        # A late copy of the older push, any chunk: a duplicate.
        self.push(spec, *ident)
        self.push(spec, "--client-id", "0x5eed", "--seq", "1", "--chunk-id", "7")
        # Another client's same (seq, chunk) is its own.
        self.push(spec, "--client-id", "0x5eef", "--seq", "1", "--chunk-id", "0")
        self.assertEqual(self.value(spec), (4, -2.0))
        # Without an identity every message is applied (stock clients).
        self.push(spec)
        self.push(spec)
        self.assertEqual(self.value(spec), (6, -3.0))
        st = status(spec)[0]
        self.assertEqual((st["pushes"], st["duplicates"], st["dedup_clients"]), (6, 3, 2))
        m = psctl(spec, "metrics")
        self.assertIn('psd_duplicate_pushes_total{shard="0"} 3', m.stdout)
        self.stop_all([p])

    def test_retry_after_kill9_and_restart_is_applied_once(self):
        """The push is applied and checkpointed, and the shard is killed
        before its answer reaches the client; the client's retry reaches the
        restarted shard. Before the table was saved in the checkpoint, the
        restarted shard's table was empty and the retry was applied again
        (version 2, value -1.0, no duplicate counted)."""
        root = os.path.join(self.d, "ck")
        spec = h.spec_in(self.d, {"name": "dedupck",
                                  "optimizer": {"type": "sgd", "lr": 0.5},
                                  "checkpoint": {"dir": root}}, nps=1, nworker=1)
        p = self.psd(spec, 0)
        r = h.pstool(spec, "declare", "w", "4,3")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        ident = ("--client-id", "0x5eed", "--seq", "1", "--chunk-id", "0")
        self.push(spec, *ident)
        self.assertEqual(self.value(spec), (1, -0.5))
        r = psctl(spec, "checkpoint", "--wait")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(root, "dedupck", "ps-0", "ckpt-0000000001",
                               "manifest.json")) as f:
            self.assertEqual(json.load(f)["dedup"],
                             [{"client": "0000000000005eed", "seq": "0000000000000001",
                               "chunks": ["0000000000000001"]}])
        p.p.send_signal(signal.SIGKILL)
        self.assertEqual(p.wait(), -signal.SIGKILL)
        p = self.psd(spec, 0)
        line = p.wait_for("resumed from step ")
        self.assertIn("resumed from step 1: ", line)
        self.assertIn(", applied pushes of 1 client, ", line)
        # The retry: acknowledged, no effect.
        self.push(spec, *ident)
        self.assertEqual(self.value(spec), (1, -0.5))
        st = status(spec)[0]
        self.assertEqual((st["pushes"], st["duplicates"], st["dedup_clients"]), (0, 1, 1))
        # The client's next push is applied.
        self.push(spec, "--client-id", "0x5eed", "--seq", "2", "--chunk-id", "0")
        self.assertEqual(self.value(spec), (2, -1.0))
        st = status(spec)[0]
        self.assertEqual((st["pushes"], st["duplicates"]), (1, 1))
        self.stop_all([p])


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class LoadTest(Faults):
    """Clients pushing and pulling for a while, dense variables and rows of
    a table (pstool load): no call fails, every dense update and every hot
    row is exact at every pull and at the end, the table admits and evicts
    rows under checkpoints taken throughout (psctl checkpoint), and psd's
    resident memory stays flat."""

    def test_load_no_failed_calls_flat_memory(self):
        clients, seconds = (64, 60) if SOAK else (16, 10)
        if h.SANITIZED:
            # ASan holds up to 256 MiB of freed memory back (its quarantine,
            # to catch a use after free), so a sanitized shard's RSS grows
            # until that fills, whatever psd does (make asan saw 300 MiB
            # become 394 MiB): a small quarantine lets flat mean psd's own.
            was = os.environ.get("ASAN_OPTIONS")
            os.environ["ASAN_OPTIONS"] = ((was + ":") if was else "") + "quarantine_size_mb=4"
            self.addCleanup(lambda: os.environ.__setitem__("ASAN_OPTIONS", was) if was
                            is not None else os.environ.pop("ASAN_OPTIONS", None))
        spec = h.spec_in(self.d, {"name": "load", "optimizer": {"type": "sgd", "lr": 0.5},
                                  "unix_sockets": False, "checkpoint": {"dir": "ck"},
                                  "tables": [LOAD_TABLE]}, nworker=1)
        ps = [self.psd(spec, i) for i in range(2)]
        c = self.proc([h.build_path("tests", "pstool"), "--cluster", spec, "--clients",
                       str(clients), "--seconds", str(seconds), "load"])
        c.wait_for("load started", timeout=120)
        t0 = time.monotonic()
        ck = Checkpointer(spec)
        samples, stop = [], threading.Event()

        def sample():
            while not stop.wait(0.2):
                samples.append((time.monotonic() - t0, [rss_bytes(p.p.pid) for p in ps]))

        th = threading.Thread(target=sample)
        th.start()
        try:
            rc = c.wait(timeout=seconds + 300)
        finally:
            stop.set()
            th.join()
            ck.stop()
        self.assertEqual(rc, 0, c.output()[-3000:])
        res = fields(c.lines[-1])
        # The last checkpoint evicts what the last rounds left below min_count.
        r = psctl(spec, "checkpoint", "--wait", timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        tab = table_totals(spec)
        # After the first quarter (warm-up), the first and the last quarter
        # of what is left: the most each shard held in each.
        after = [s for t, s in samples if t >= seconds / 4 and t <= seconds]
        q = max(1, len(after) // 4)
        first = [max(s[i] for s in after[:q]) for i in range(2)]
        last = [max(s[i] for s in after[-q:]) for i in range(2)]
        print("load: %d clients x %.0f s against 2 shards on loopback TCP: %s calls "
              "(%s/s), %s failed, %s retried; %s dense pushes, %s table pushes, "
              "%s checkpoints, table rows admitted %d, not admitted %d, evicted %d, "
              "left %d; psd RSS after warm-up, first quarter %s, last quarter %s"
              % (clients, float(res["seconds"]), res["calls"], res["calls_per_s"],
                 res["failed_calls"], res["retries"], res["pushes"], res["row_pushes"],
                 ck.written, tab["admitted"], tab["not_admitted"], tab["evicted"],
                 tab["rows"],
                 " ".join("%.1f MiB" % (b / 2**20) for b in first),
                 " ".join("%.1f MiB" % (b / 2**20) for b in last)))
        self.assertEqual((res["failed_calls"], res["mismatches"], res["row_mismatches"]),
                         ("0", "0", "0"), c.lines[-1])
        self.assertGreater(int(res["pushes"]), clients)
        self.assertGreater(int(res["row_pushes"]), clients)
        self.assertEqual((ck.failed, ck.errors), (0, []))
        self.assertGreater(ck.written, 0)
        # Admission and eviction ran: ids only counted, rows stored, rows
        # evicted; what is left is bounded by the clients' ids (8 hot and
        # 512 cold each).
        self.assertGreater(tab["not_admitted"], 0, tab)
        self.assertGreater(tab["admitted"], clients * 8, tab)
        self.assertGreater(tab["evicted"], 0, tab)
        self.assertLessEqual(tab["rows"], clients * (8 + 512), tab)
        st = status(spec)
        self.assertEqual(sum(s["duplicates"] for s in st), 0)
        for i in range(2):
            # Flat: within 10% of the first quarter's peak.
            self.assertLessEqual(last[i], first[i] * 1.10, (i, first, last))
        self.stop_all(ps)
