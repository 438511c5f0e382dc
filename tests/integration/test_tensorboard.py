"""job.tensorboard_dir: each dworker writes a TensorBoard event file of its
progress. A short real job (pslaunch, one psd shard, two dworkers) runs with
a relative tensorboard_dir; then a reader written here, on the standard
library alone (its own CRC-32C, struct, a small protobuf decoder), checks
every record's framing and both CRCs, the file_version record, and the
scalars against the progress and final lines the workers printed. Also a
directory that cannot be made: dworker says so and exits 1. Run:
/usr/bin/python3 test_tensorboard.py BUILD_DIR"""
import os
import re
import socket
import struct
import time
import unittest

import harness as h

DATA = "/usr/share/datasets/fashion-mnist"
STEPS, LOG_EVERY = 120, 20


def _crc32c_table():
    table = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    """The varint at buf[i:], and the offset after it."""
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def fields(buf):
    """Yields (field number, wire type, value) of a protobuf message: an int
    for varints, bytes for the rest (8 for fixed64, 4 for fixed32)."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise AssertionError("wire type %d in an Event" % wire)
        if i > len(buf):
            raise AssertionError("field %d runs past its message" % num)
        yield num, wire, v


def decode_event(data):
    """An Event (event.proto) as a dict: wall_time, step, file_version and
    the scalars of its summary as {tag: simple_value}."""
    ev = {"step": 0, "scalars": {}}
    for num, wire, v in fields(data):
        if (num, wire) == (1, 1):
            ev["wall_time"] = struct.unpack("<d", v)[0]
        elif (num, wire) == (2, 0):
            ev["step"] = v
        elif (num, wire) == (3, 2):
            ev["file_version"] = v.decode()
        elif (num, wire) == (5, 2):
            for snum, swire, value in fields(v):  # Summary.value = 1
                assert (snum, swire) == (1, 2), (snum, swire)
                tag = val = None
                for vnum, vwire, x in fields(value):
                    if (vnum, vwire) == (1, 2):
                        tag = x.decode()
                    elif (vnum, vwire) == (2, 5):
                        val = struct.unpack("<f", x)[0]
                ev["scalars"][tag] = val
        else:
            raise AssertionError("unexpected Event field %d (wire %d)" % (num, wire))
    return ev


def read_records(test, path):
    """Every record of a TFRecord file, each length and CRC checked, and the
    file used up exactly."""
    with open(path, "rb") as f:
        buf = f.read()
    out, off = [], 0
    while off < len(buf):
        test.assertGreaterEqual(len(buf) - off, 12, "a truncated header at %d" % off)
        n, = struct.unpack_from("<Q", buf, off)
        lcrc, = struct.unpack_from("<I", buf, off + 8)
        test.assertEqual(lcrc, masked(crc32c(buf[off:off + 8])), "length CRC at %d" % off)
        test.assertGreaterEqual(len(buf) - off - 12, n + 4, "a truncated record at %d" % off)
        data = buf[off + 12:off + 12 + n]
        dcrc, = struct.unpack_from("<I", buf, off + 12 + n)
        test.assertEqual(dcrc, masked(crc32c(data)), "data CRC at %d" % off)
        out.append(data)
        off += 12 + n + 4
    return out


class ReaderTest(unittest.TestCase):
    def test_crc32c_check_value(self):
        self.assertEqual(crc32c(b"123456789"), 0xE3069283)


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class TensorBoardTest(unittest.TestCase):
    def test_two_workers_write_their_progress(self):
        with h.TempDir() as d:
            spec = os.path.join(d, "job.json")
            h.write_spec(spec, nps=1, nworker=2,
                         job={"name": "tb", "max_steps": STEPS, "log_every": LOG_EVERY,
                              "batch_size": 64, "tensorboard_dir": "runs/tb",
                              # the demo's optimizer (the default SGD's step
                              # made two async workers' loss jump about)
                              "optimizer": {"type": "momentum", "lr": 0.02,
                                            "momentum": 0.9}})
            t0 = time.time()
            r = h.run([h.build_path("deploy", "pslaunch"), spec], timeout=120)
            t1 = time.time()
            self.assertEqual(r.returncode, 0, (r.stdout + r.stderr)[-4000:])
            printed = {0: [], 1: []}
            final = None
            for line in r.stdout.splitlines():
                m = re.match(r"worker:(\d+)\s*\| (.*)", line)
                if not m:
                    continue
                p = re.search(r"loss ([\d.]+) acc ([\d.]+) ex/s", m.group(2))
                if p:
                    printed[int(m.group(1))].append((float(p.group(1)), float(p.group(2))))
                f = re.search(r"final: test_accuracy=([\d.]+)", m.group(2))
                if f:
                    final = float(f.group(1))
            self.assertIsNotNone(final, r.stdout[-2000:])

            # Relative to the spec's directory; one file per worker.
            tb = os.path.join(d, "runs", "tb")
            names = sorted(os.listdir(tb))
            self.assertEqual(len(names), 2, names)
            host = socket.gethostname()
            by_worker = {}
            for name in names:
                m = re.fullmatch(r"events\.out\.tfevents\.(\d+)\.(.+)\.(\d+)\.(\d+)", name)
                self.assertIsNotNone(m, name)
                self.assertEqual(m.group(2), host)
                self.assertTrue(int(t0) <= int(m.group(1)) <= t1, name)
                by_worker[int(m.group(4))] = os.path.join(tb, name)
            self.assertEqual(sorted(by_worker), [0, 1])
            self.assertNotEqual(names[0].split(".")[-2], names[1].split(".")[-2])

            for w, path in sorted(by_worker.items()):
                events = [decode_event(x) for x in read_records(self, path)]
                first = events[0]
                self.assertEqual(first["file_version"], "brain.Event:2")
                self.assertEqual(first["scalars"], {})
                for ev in events:
                    self.assertTrue(t0 - 1 <= ev["wall_time"] <= t1 + 1, ev)
                train = [e for e in events[1:] if "train/loss" in e["scalars"]]
                # One event per progress line, at steps 20, 40, ... 120.
                self.assertEqual([e["step"] for e in train],
                                 list(range(LOG_EVERY, STEPS + 1, LOG_EVERY)))
                self.assertEqual(len(train), len(printed[w]))
                pulled = pushed = 0
                for e, (loss, acc) in zip(train, printed[w]):
                    s = e["scalars"]
                    self.assertEqual(set(s), {"train/loss", "train/accuracy",
                                              "train/examples_per_s", "train/step_ms",
                                              "net/bytes_pulled", "net/bytes_pushed"})
                    # The figures of the line printed for the same step.
                    self.assertAlmostEqual(s["train/loss"], loss, delta=6e-5)
                    self.assertAlmostEqual(s["train/accuracy"], acc, delta=6e-5)
                    self.assertTrue(0 < s["train/accuracy"] <= 1, s)
                    self.assertGreater(s["train/examples_per_s"], 0)
                    self.assertGreater(s["train/step_ms"], 0)
                    self.assertLess(s["train/step_ms"], 10000)
                    # Counted from the start, so they only grow.
                    self.assertGreater(s["net/bytes_pulled"], pulled)
                    self.assertGreater(s["net/bytes_pushed"], pushed)
                    pulled, pushed = s["net/bytes_pulled"], s["net/bytes_pushed"]
                # A model that learns: the loss falls from the first line.
                losses = [e["scalars"]["train/loss"] for e in train]
                # Falling: the second half's best window below the first
                # one (async windows of 20 steps are noisy one by one).
                self.assertLess(min(losses[len(losses) // 2:]), losses[0], losses)
                tests = [e for e in events if "test/accuracy" in e["scalars"]]
                if w != 0:
                    self.assertEqual(tests, [])
                    self.assertEqual(len(events), 1 + len(train))
                    continue
                # Worker 0: the final line's accuracy, at the last step.
                self.assertEqual(len(tests), 1)
                self.assertIs(events[-1], tests[0])
                self.assertEqual(tests[0]["step"], STEPS)
                acc = tests[0]["scalars"]["test/accuracy"]
                self.assertTrue(0 < acc <= 1, acc)
                self.assertAlmostEqual(acc, final, delta=6e-5)
                self.assertGreater(tests[0]["scalars"]["test/loss"], 0)
                print("\nworker:0 %d events, loss %.4f -> %.4f, test accuracy %.4f"
                      % (len(events), losses[0], losses[-1], acc))


class TensorBoardErrorTest(unittest.TestCase):
    def test_a_directory_that_cannot_be_made_fails_the_worker(self):
        with h.TempDir() as d:
            blocker = os.path.join(d, "file")
            open(blocker, "w").close()
            spec = os.path.join(d, "job.json")
            h.write_spec(spec, nps=1, nworker=1, job={"tensorboard_dir": "file/tb"})
            r = h.run([h.build_path("worker", "dworker"), "--cluster", spec,
                       "--standalone"], timeout=60)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("job.tensorboard_dir %s/tb: cannot create an event file there: "
                          "Not a directory" % blocker, r.stderr)


if __name__ == "__main__":
    h.main()
