"""`bench multihost`'s machinery, small (tests/bench/bench_multihost.py): at
one link speed, 150 steps per worker and rank, psd in fp32 and bf16 and
DDP in fp32 (DDP's fp16 hook is make bench's alone: 10 s of make test for
a baseline's variant), the lines it prints are there and whole, the
examples add up, the bytes the links counted are those of the model's
gradients and values (fp32: a push and a pull of 235,146 floats per step;
bf16: half), the shaper holds the
link to its rate; every namespace, veth and qdisc made is gone at the end,
also after an exception inside the links' block and after SIGTERM. Needs
root and iproute2 (else exit 77), python3-torch and the dataset. Run:
/usr/bin/python3 test_multihost.py BUILD_DIR"""
import importlib.util
import os
import signal
import sys
import tempfile
import unittest

import harness as h
import netns as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import bench  # noqa: E402
import bench_multihost as mh  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
STEPS = 150
MBIT = 1000
RUNS = (("psd", "fp32"), ("ddp", "fp32"), ("psd", "bf16"))
MODEL_BYTES = 4 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)  # the demo's MLP


def mine(tag):
    """The namespaces and interfaces here whose names carry tag."""
    left = [n for n in nn.netns_names() if n.startswith(mh.PREFIX + tag)]
    left += [n for n in os.listdir("/sys/class/net") if n.startswith(mh.PREFIX + tag)]
    return left


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class MultihostTest(unittest.TestCase):
    def setUp(self):
        why = nn.why_no_netns()
        if why:
            self.skipTest(why)

    def test_links_are_made_shaped_and_all_deleted_after_an_exception(self):
        with self.assertRaisesRegex(KeyError, "on purpose"):
            with mh.Links() as links:
                links.set_rate(MBIT)
                self.assertEqual(len([n for n in nn.netns_names()
                                      if n.startswith(mh.PREFIX + links.tag)]), 5)
                self.assertEqual(len(links.qdiscs()), 8)  # 4 links, both ends
                raise KeyError("on purpose")
        self.assertEqual(mine(links.tag), [])

    @unittest.skipUnless(importlib.util.find_spec("torch"), "python3-torch is not installed")
    def test_small_run_lines_examples_bytes_and_cleanup(self):
        lines = []
        with tempfile.TemporaryDirectory(prefix="test-multihost-") as d:
            links = mh.bench(d, bench, speeds=[MBIT], max_steps=STEPS, epochs=1,
                             say=lines.append, runs=RUNS)
        print("\n" + "\n".join(lines))
        self.assertEqual(mine(links.tag), [])
        self.assertEqual(links.leftovers(), [])
        self.assertTrue(all(l.startswith("bench multihost link=1gbit ") for l in lines), lines)
        check = [bench.kv(l) for l in lines if "check_Mbps=" in l]
        self.assertEqual(len(check), 1, lines)
        # The shaper holds a stream to the rate (a bound above only: below
        # it is the machine's load, not the shaper).
        self.assertLess(float(check[0]["check_Mbps"]), 1.1 * MBIT)
        runs = {(r["run"], r["wire"]): r for r in map(bench.kv, lines) if "run" in r}
        self.assertEqual(set(runs), set(RUNS), lines)
        for (run, wire), r in runs.items():
            self.assertEqual(int(r["examples"]), 2 * STEPS * 64, r)
            self.assertEqual(int(r["steps"]), 2 * STEPS, r)
            self.assertGreater(float(r["examples_per_s"]), 0, r)
            self.assertTrue(0.5 < float(r["test_accuracy"]) <= 1, r)
            # Through a worker's link per step: its push (or all-reduce
            # send) and its pull (or receive), each the model's bytes in
            # fp32, half in bf16 or fp16; plus headers and acks.
            want = (2 if wire == "fp32" else 1) * MODEL_BYTES
            got = float(r["bytes_per_step"])
            self.assertTrue(0.95 * want <= got <= 1.3 * want, (want, r))
            self.assertTrue(0.45 * got <= float(r["tx_per_step"]) <= 0.55 * got, r)
            if run == "psd":  # what the workers sent and got, the shards got and sent
                self.assertTrue(0.95 * got <= float(r["shard_bytes_per_step"]) <= 1.05 * got, r)
            else:  # the shards' hosts see nothing of DDP
                self.assertLess(float(r["other_bytes_per_step"]), 0.01 * got, r)
        summary = [bench.kv(l) for l in lines if "ratio=" in l]
        self.assertEqual(len(summary), 1, lines)
        s = summary[0]
        self.assertIn(s["best_psd"], ("fp32", "bf16"))
        self.assertEqual(s["best_ddp"], "fp32")
        self.assertAlmostEqual(float(s["ratio"]), float(s["psd_examples_per_s"])
                               / float(s["ddp_examples_per_s"]), delta=0.01)
        self.assertIn(s["goal_met"], ("yes", "no"))
        self.assertAlmostEqual(float(s["fp32_ratio"]),
                               float(runs[("psd", "fp32")]["examples_per_s"])
                               / float(runs[("ddp", "fp32")]["examples_per_s"]), delta=0.01)

    def test_sigterm_deletes_everything(self):
        argv = [sys.executable, os.path.join(os.path.dirname(mh.__file__),
                                             "bench_multihost.py"), h.BUILD, "--speeds",
                str(MBIT), "--epochs", "1"]
        p = h.Proc(argv)
        try:
            p.wait_for("check_Mbps=", timeout=60)
            tag = "%d" % (p.p.pid % 10000)
            self.assertNotEqual(mine(tag), [])  # up while it runs
            p.p.send_signal(signal.SIGTERM)
            rc = p.wait(timeout=60)
        finally:
            if p.p.poll() is None:
                p.stop(signal.SIGKILL)
        self.assertEqual(rc, 128 + signal.SIGTERM, p.output())
        self.assertEqual(mine(tag), [])


if __name__ == "__main__":
    h.main()
