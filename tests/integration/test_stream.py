"""Training on a stream (docs/ctr.md, "Training on a stream"): dworker's CTR
model follows job.ctr.stream while the test feeds it.

- a directory: pslaunch runs 2 shards and 2 workers on an empty directory;
  the test renames the parts of `psd-ctrgen --drift` into it one at a time,
  each after both workers said they took the one before (a temporary name
  and a file of another suffix lie there all along and are never taken),
  then creates the end marker. Every part is trained once (the workers'
  window lines' examples add up to each part's, the result lines' to the
  stream's), every window is scored before it is trained on (a "window N
  (part): logloss=... auc=... before training" line per worker and part,
  and worker 0's TensorBoard events "window/auc" per window), later windows
  score an AUC within BOUND of the part's true AUC, and the job ends
  cleanly at the marker;
- SIGTERM: a worker following a directory with no marker finishes the
  batch it is on and reports (the final: line, exit 0);
- a growing file: lines appended in pieces, a last line without its
  newline held back, windows of job.ctr.stream.window lines, the rest at
  the marker;
- the Python dataset psd.stream.StreamDir follows a directory the same way.
Run: /usr/bin/python3 test_stream.py BUILD_DIR"""
import glob
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import unittest
import warnings

import harness as h

# From the third window on, every worker's AUC of a window, scored before
# training on it, is at least the part's true AUC (truth.json) minus this.
# (The learner cannot know the ids new in a part, which take the top ranks
# and carry full signal: here it scores 0.03-0.11 under the truth.)
BOUND = 0.15
PARTS = 6
PER_PART = 40000
WINDOW = re.compile(r"(worker:\d+)? ?\|? ?window (\d+) \(([^)]*)\): logloss=([\d.]+) "
                    r"auc=([\d.]+) examples=(\d+) before training")

TABLES = [
    {"name": "emb", "dim": 8, "init": "uniform", "init_scale": 0.05,
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1}},
    {"name": "wide", "dim": 1, "init": "zeros",
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1}},
]


def job(name, stream, extra=None):
    j = {"name": name, "model": "ctr", "ctr": {"fields": 8, "stream": stream},
         "hidden": [32, 16], "batch_size": 256,
         "optimizer": {"type": "adam", "lr": 0.002}, "tables": TABLES,
         "seed": 1, "log_every": 50}
    j.update(extra or {})
    return j


def windows(out):
    """[(worker, N, part, logloss, auc, examples)] of the window lines."""
    got = []
    for line in out.splitlines():
        m = WINDOW.search(line)
        if m:
            w = (m.group(1) or "worker:0")
            got.append((w, int(m.group(2)), m.group(3), float(m.group(4)),
                        float(m.group(5)), int(m.group(6))))
    return got


def figures(line, tag):
    return dict(p.split("=", 1) for p in line.split(tag, 1)[1].split() if "=" in p)


def drift(out, *args):
    r = h.run([h.build_path("worker", "psd-ctrgen"), "--drift", "--out", out,
               "--parts", str(PARTS), "--per-part", str(PER_PART)] + list(args), timeout=300)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(out, "truth.json")) as f:
        return json.load(f)


class CtrgenDriftTest(unittest.TestCase):
    """psd-ctrgen --drift's options: mistakes named, exit 2; a range with
    --delay-s and --end lands part by part, then the marker."""

    def test_usage_and_release(self):
        gen = h.build_path("worker", "psd-ctrgen")
        with tempfile.TemporaryDirectory(prefix="psd-test-") as d:
            for args, said in [(["--parts", "3"], "--parts, --per-part, --shift, --turn, "
                                "--parts-from, --parts-to, --delay-s and --end are --drift's"),
                               (["--drift", "--parts", "0"],
                                "--parts takes a whole number >= 1, not '0'"),
                               (["--drift", "--delay-s", "-1"],
                                "--delay-s takes a number of seconds >= 0, not '-1'"),
                               (["--drift", "--end", "a/b"], "--end takes a file name, not 'a/b'"),
                               (["--drift", "--format", "criteo"],
                                "--drift writes LIBSVM parts only")]:
                r = h.run([gen, "--out", d] + args, timeout=30)
                self.assertEqual(r.returncode, 2, (args, r.stderr))
                self.assertEqual(r.stderr.strip(), "psd-ctrgen: " + said)
                self.assertEqual(os.listdir(d), [])
            p = h.Proc([gen, "--drift", "--out", d, "--parts", "4", "--per-part", "100",
                        "--parts-from", "1", "--parts-to", "3", "--delay-s", "1",
                        "--end", "END"])
            p.wait_for("part part-00001.svm", timeout=30)
            # psd's mark goes down first, then each part as it lands.
            self.assertEqual(sorted(os.listdir(d)), ["part-00001.svm", "truth.json"])
            self.assertEqual(p.wait(timeout=30), 0, p.output())
            self.assertEqual(sorted(os.listdir(d)),
                             ["END", "part-00001.svm", "part-00002.svm", "truth.json"])
            self.assertIn("wrote %s: parts 1..2 of 4, 100 examples each, 8 fields" % d,
                          p.output())
            # psd's own stream, written again: parts 0 and 3 join the others.
            r = h.run([gen, "--drift", "--out", d, "--parts", "4", "--per-part", "100",
                       "--end", "END"], timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(sorted(os.listdir(d)), ["END"] + ["part-%05d.svm" % k for k in
                                                               range(4)] + ["truth.json"])

    def test_never_writes_into_the_users_directory(self):
        """A directory holding files psd did not write (a truth.json of the
        user's, their data) is refused, every byte kept."""
        gen = h.build_path("worker", "psd-ctrgen")
        with tempfile.TemporaryDirectory(prefix="psd-test-") as d:
            mine = {"truth.json": b'{"true_auc": 0.9}', "part-00000.svm": b"1 1:1\n",
                    "clicks.txt": b"mine\n"}
            for name in ("truth.json", "clicks.txt"):
                for n, text in mine.items():
                    with open(os.path.join(d, n), "wb") as f:
                        f.write(text)
                r = h.run([gen, "--drift", "--out", d, "--parts", "2", "--per-part", "10"],
                          timeout=30)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertIn("psd-ctrgen: the directory %s holds " % d, r.stderr)
                self.assertIn("which psd did not write", r.stderr)
                self.assertEqual({n: open(os.path.join(d, n), "rb").read()
                                  for n in os.listdir(d)}, mine)
                self.assertRegex(r.stderr, "holds (%s), which" % "|".join(mine))
                # one file fewer: still refused
                os.unlink(os.path.join(d, name))
                mine = {n: t for n, t in mine.items() if n != name}
            # a part named as psd names them, without psd's truth.json: refused
            self.assertEqual(list(mine), ["part-00000.svm"])
            r = h.run([gen, "--drift", "--out", d, "--parts", "2", "--per-part", "10"],
                      timeout=30)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertEqual(os.listdir(d), ["part-00000.svm"])


class StreamDirTest(unittest.TestCase):
    def test_parts_fed_one_at_a_time(self):
        with tempfile.TemporaryDirectory(prefix="psd-test-") as tmp:
            gen, parts = os.path.join(tmp, "gen"), os.path.join(tmp, "parts")
            os.mkdir(parts)
            truth = drift(gen)
            # Never parts: a temporary name, another suffix.
            with open(os.path.join(parts, ".part-00000.svm"), "w") as f:
                f.write("1 1:1\n0 2:1\n")
            with open(os.path.join(parts, ".part-00009.svm.tmp-1"), "w") as f:
                f.write("1 1:1\n")
            with open(os.path.join(parts, "notes.txt"), "w") as f:
                f.write("0 1:1\n")
            spec = os.path.join(tmp, "spec.json")
            h.write_spec(spec, nps=2, nworker=2,
                         job=job("stream", {"dir": "parts", "poll_s": 0.1},
                                 {"tensorboard_dir": "tb"}))
            p = h.Proc([h.build_path("deploy", "pslaunch"), spec])
            try:
                for w in (0, 1):
                    p.wait_for("worker:%d | " % w, timeout=120)
                for k in range(PARTS):
                    name = "part-%05d.svm" % k
                    os.rename(os.path.join(gen, name), os.path.join(parts, name))
                    for w in (0, 1):
                        p.wait_for("worker:%d | window %d (%s)" % (w, k + 1, name),
                                   timeout=120)
                open(os.path.join(parts, "END"), "w").close()
                rc = p.wait(timeout=300)
            finally:
                p.stop()
            out = p.output()
            self.assertEqual(rc, 0, out[-4000:])
            got = windows(out)
            self.assertEqual(len(got), 2 * PARTS, out[-4000:])
            for k in range(PARTS):
                name = "part-%05d.svm" % k
                mine = [g for g in got if g[2] == name]
                self.assertEqual(sorted(g[0] for g in mine), ["worker:0", "worker:1"], mine)
                self.assertEqual({g[1] for g in mine}, {k + 1})
                # Worker k of 2 takes lines k, k + 2, ...: together the part once.
                self.assertEqual(sum(g[5] for g in mine), PER_PART, mine)
                print("\n%s: true_auc=%.4f window auc %s" % (
                    name, truth["parts"][k]["true_auc"],
                    " ".join("%.4f" % g[4] for g in sorted(mine))), end="")
            for k in range(2, PARTS):
                true = truth["parts"][k]["true_auc"]
                for g in got:
                    if g[1] == k + 1:
                        self.assertGreater(g[4], true - BOUND, (g, true))
            final = [l for l in out.splitlines() if "final:" in l]
            done = [l for l in out.splitlines() if "done:" in l and "worker:1" in l]
            self.assertEqual(len(final), 1, out[-4000:])
            self.assertEqual(len(done), 1, out[-4000:])
            f0, f1 = figures(final[0], "final:"), figures(done[0], "done:")
            for f in (f0, f1):
                self.assertEqual(f["windows"], str(PARTS), f)
            self.assertEqual(int(f0["examples"]) + int(f1["examples"]), PARTS * PER_PART)
            self.assertEqual(int(f0["window_examples"]) + int(f1["window_examples"]),
                             PARTS * PER_PART)
            self.assertIn("the stream ended (its end marker) after %d windows" % PARTS, out)
            # TensorBoard: worker 0's window/auc, one per window, as printed.
            from test_tensorboard import decode_event, read_records
            files = sorted(glob.glob(os.path.join(tmp, "tb", "events.out.tfevents.*.0")))
            self.assertEqual(len(files), 1, os.listdir(tmp))
            events = [decode_event(d) for d in read_records(self, files[0])[1:]]
            tb = [e for e in events if "window/auc" in e["scalars"]]
            self.assertEqual([e["step"] for e in tb], list(range(1, PARTS + 1)))
            mine0 = sorted((g[1], g[4]) for g in got if g[0] == "worker:0")
            for e, (n, auc) in zip(tb, mine0):
                self.assertAlmostEqual(e["scalars"]["window/auc"], auc, places=3)


class StreamWorkerTest(h.ProcTest):
    """Shards and one dworker started here, so the test can signal it."""

    def start(self, tmp, stream):
        spec = os.path.join(tmp, "spec.json")
        h.write_spec(spec, nps=1, nworker=1, job=job("stream-one", stream))
        self.procs.append(h.start_psd(spec, 0))
        w = h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                    "worker:0"])
        self.procs.append(w)
        return w

    def test_sigterm_finishes_cleanly(self):
        with tempfile.TemporaryDirectory(prefix="psd-test-") as tmp:
            parts = os.path.join(tmp, "parts")
            drift(parts, "--parts-to", "2")
            w = self.start(tmp, {"dir": "parts", "poll_s": 0.1})
            w.wait_for("window 2 (part-00001.svm)", timeout=120)
            w.wait_for("step", timeout=60, new=True)
            w.p.send_signal(signal.SIGTERM)
            rc = w.wait(timeout=60)
            out = w.output()
            self.assertEqual(rc, 0, out[-3000:])
            # In window 2 (stopped after a batch), or waiting for window 3.
            self.assertIn("the stream ended (SIGTERM) after 2 windows", out)
            f = figures([l for l in out.splitlines() if "final:" in l][0], "final:")
            self.assertEqual(f["windows"], "2")
            self.assertEqual(f["window_examples"], str(2 * PER_PART))
            self.assertGreater(int(f["examples"]), PER_PART)
            self.assertLessEqual(int(f["examples"]), 2 * PER_PART)

    def test_criteo_parts(self):
        """format "criteo": parts *.tsv and *.tsv.gz (psd-ctrgen's), in name
        order; a *.svm there is not a part of this stream."""
        with tempfile.TemporaryDirectory(prefix="psd-test-") as tmp:
            parts = os.path.join(tmp, "parts")
            os.mkdir(parts)
            for k, (n, gz) in enumerate([(3000, []), (4000, ["--gzip"])]):
                out = os.path.join(tmp, "g%d" % k)
                r = h.run([h.build_path("worker", "psd-ctrgen"), "--format", "criteo",
                           "--out", out, "--train", str(n), "--test", "10"] + gz, timeout=120)
                self.assertEqual(r.returncode, 0, r.stderr)
                name = "train.tsv" + (".gz" if gz else "")
                os.rename(os.path.join(out, name),
                          os.path.join(parts, "p%d.tsv%s" % (k, ".gz" if gz else "")))
            with open(os.path.join(parts, "p2.svm"), "w") as f:
                f.write("1 1:1\n")
            open(os.path.join(parts, "END"), "w").close()
            spec = os.path.join(tmp, "spec.json")
            j = job("stream-criteo", {"dir": "parts", "poll_s": 0.1})
            j["ctr"] = {"format": "criteo", "stream": {"dir": "parts", "poll_s": 0.1}}
            h.write_spec(spec, nps=1, nworker=1, job=j)
            self.procs.append(h.start_psd(spec, 0))
            w = h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                        "worker:0"])
            self.procs.append(w)
            rc = w.wait(timeout=120)
            out = w.output()
            self.assertEqual(rc, 0, out[-3000:])
            self.assertEqual([(g[2], g[5]) for g in windows(out)],
                             [("p0.tsv", 3000), ("p1.tsv.gz", 4000)], out[-3000:])

    def test_growing_file(self):
        with tempfile.TemporaryDirectory(prefix="psd-test-") as tmp:
            drift(os.path.join(tmp, "gen"), "--parts-to", "2")
            lines = []
            for k in range(2):
                with open(os.path.join(tmp, "gen", "part-%05d.svm" % k)) as f:
                    lines += f.read().splitlines(keepends=True)
            path = os.path.join(tmp, "clicks.svm")
            open(path, "w").close()
            W = 30000
            w = self.start(tmp, {"file": "clicks.svm", "poll_s": 0.05, "window": W})
            text = "".join(lines)
            at = lambda n: len("".join(lines[:n]))  # bytes of the first n lines
            with open(path, "a") as f:
                f.write(text[:at(W) + 7])  # 7 bytes into line W + 1
            w.wait_for("window 1 (clicks.svm:1-%d)" % W, timeout=120)
            with open(path, "a") as f:
                f.write(text[at(W) + 7:at(2 * W)])
            w.wait_for("window 2 (clicks.svm:%d-%d)" % (W + 1, 2 * W), timeout=120)
            with open(path, "a") as f:
                f.write(text[at(2 * W):])
                f.write("1 5:1")  # never finished: dropped at the marker
            open(os.path.join(tmp, "END"), "w").close()
            rc = w.wait(timeout=120)
            out = w.output()
            self.assertEqual(rc, 0, out[-3000:])
            got = windows(out)
            n = 2 * PER_PART
            self.assertEqual([(g[2], g[5]) for g in got],
                             [("clicks.svm:1-%d" % W, W), ("clicks.svm:%d-%d" % (W + 1, 2 * W), W),
                              ("clicks.svm:%d-%d" % (2 * W + 1, n), n - 2 * W)], out[-3000:])
            self.assertIn("a last line without its newline (5 bytes): dropped", out)
            self.assertIn("examples=%d" % n, [l for l in out.splitlines() if "final:" in l][0])


class StreamPythonTest(unittest.TestCase):
    def test_dataset_follows_a_directory(self):
        sys.path.insert(0, h.build_path("worker", "python"))
        from psd.stream import StreamDir
        with tempfile.TemporaryDirectory(prefix="psd-test-") as tmp:
            gen, parts = os.path.join(tmp, "gen"), os.path.join(tmp, "parts")
            os.mkdir(parts)
            drift(gen, "--parts-to", "3")
            for hidden in (".part-00000.svm", ".part-00009.svm.tmp-1"):  # never parts
                with open(os.path.join(parts, hidden), "w") as f:
                    f.write("1 1:1\n0 2:1\n")
            ds = StreamDir(parts, batch_size=1000, share=1, nshares=2, poll_s=0.05)
            seen = []

            def feed():
                for k in range(3):
                    name = "part-%05d.svm" % k
                    os.rename(os.path.join(gen, name), os.path.join(parts, name))
                    while len({b.part for b in seen}) <= k:
                        time.sleep(0.01)
                # Late: named before the last part taken; skipped, said once.
                shutil.copy(os.path.join(parts, "part-00002.svm"),
                            os.path.join(tmp, "late"))
                os.rename(os.path.join(tmp, "late"), os.path.join(parts, "part-00001b.svm"))
                time.sleep(0.2)
                open(os.path.join(parts, "END"), "w").close()

            t = threading.Thread(target=feed)
            t.start()
            with warnings.catch_warnings(record=True) as warned:
                warnings.simplefilter("always")
                for b in ds:
                    seen.append(b)
            t.join()
            self.assertEqual([str(x.message) for x in warned],
                             ["stream %s: part part-00001b.svm appeared after "
                              "part-00002.svm was taken: skipped" % parts])
            runs = [p for i, p in enumerate(b.part for b in seen)
                    if i == 0 or seen[i - 1].part != p]
            self.assertEqual(runs, ["part-00000.svm", "part-00001.svm", "part-00002.svm"])
            for k in range(3):  # this share of each part: half its lines
                self.assertEqual(sum(len(b.labels) for b in seen
                                     if b.part == "part-%05d.svm" % k), PER_PART // 2)
            self.assertEqual(sum(len(b.labels) for b in seen), 3 * PER_PART // 2)
            with open(os.path.join(parts, "part-00000.svm")) as f:
                first = f.read().splitlines()[1]  # share 1 of 2: line 1
            b = seen[0]
            label, *feats = first.split()
            self.assertEqual(b.labels[0], float(label))
            ids = [int(x.split(":")[0]) for x in feats]
            self.assertEqual(list(b.ids[b.offsets[0]:b.offsets[1]]), ids)
            self.assertEqual(b.labels.dtype.name, "float32")
            self.assertEqual(b.ids.dtype.name, "int64")
            try:
                import torch
                import torch.utils.data as tud
            except ImportError:
                return
            # With torch: an IterableDataset, through a DataLoader of 2
            # loader processes each taking its part of the share.
            self.assertIsInstance(ds, tud.IterableDataset)
            loaded = list(tud.DataLoader(StreamDir(parts, 4096, share=1, nshares=2, poll_s=0.05),
                                         batch_size=None, num_workers=2))
            # (part-00001b.svm too: a new reader takes it in its place.)
            self.assertEqual(sum(len(b.labels) for b in loaded), 4 * PER_PART // 2)
            self.assertIsInstance(loaded[0].labels, torch.Tensor)


if __name__ == "__main__":
    h.main()
