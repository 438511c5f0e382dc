"""The server-side optimizers end to end with real psd and dworker processes
on 127.0.0.1: what a shard applies is the published formula (Adam with its
bias correction, where a step pushed in two calls counts once, and a 16 MiB
variable pushed in many chunks; AdamW with decoupled decay and a warm-up;
Nesterov as PyTorch) with each variable's own optimizer from the spec
(job.optimizer_overrides), shown by psctl vars and exported with every slot
by psctl export --slots; a checkpoint keeps the optimizer's steps and
refuses another optimizer; the demo job trains with Adam; a sync job equals
dworker --standalone bit for bit with clipping on; clipping scales a step
to the global norm.
Run: /usr/bin/python3 test_optim.py BUILD_DIR"""
import json
import os
import re
import signal
import struct
import unittest

import numpy as np

import harness as h
from harness import psctl

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DATA = "/usr/share/datasets/fashion-mnist"
B1, B2, EPS = 0.9, 0.999, 1e-8


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {name: np.frombuffer(data[t["data_offsets"][0]:t["data_offsets"][1]],
                                dtype="<f4").reshape(t["shape"])
            for name, t in header.items()}


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def pulled(out):
    line = out.strip().splitlines()[-1]
    assert line.startswith("OK "), line
    return np.array([float(v) for v in line.split("values=", 1)[1].split(",")])


def adam(w, grads, lrs, wd=0.0, decoupled=False):
    """Kingma & Ba, Algorithm 1, in double; L2 in the gradient, or AdamW's
    decoupled decay. Returns w, m, v after the steps."""
    w = np.array(w, dtype=np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, (g, lr) in enumerate(zip(grads, lrs), 1):
        g = np.array(g, dtype=np.float64)
        if decoupled:
            w = w - lr * wd * w
        else:
            g = g + wd * w
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        w = w - lr * (m / (1 - B1 ** t)) / (np.sqrt(v / (1 - B2 ** t)) + EPS)
    return w, m, v


def nesterov(w, grads, lr, mu):
    """PyTorch's SGD(momentum=mu, nesterov=True)."""
    w = np.array(w, dtype=np.float64)
    b = np.zeros_like(w)
    for g in grads:
        b = mu * b + np.array(g)
        w = w - lr * (np.array(g) + mu * b)
    return w, b


def close(test, got, want, what, rel=1e-5):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    err = np.max(np.abs(got - want) / (np.abs(want) + 1e-3))
    test.assertLess(err, rel, "%s: got %s, want %s" % (what, got, want))


class ServerTest(h.ProcTest):
    """One shard driven by pstool's single calls: exact, no dataset."""

    def spec(self, job, name="spec.json", nps=1):
        path = os.path.join(self.d, name)
        h.write_spec(path, nps=nps, nworker=1, job=dict({"name": "opt"}, **job))
        return path

    def psd(self, spec, i=0, *args):
        p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec, "--task",
                    "ps:%d" % i] + list(args))
        p.wait_for("ready: listening on")
        self.procs.append(p)
        return p

    def tool(self, spec, *args):
        r = h.pstool(spec, "--shard", "0", *args)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def push(self, spec, name, shape, g, offset=0):
        self.tool(spec, "push", name, shape, str(offset), ",".join(repr(float(x)) for x in g))

    def test_adam_is_the_published_formula_with_overrides(self):
        spec = self.spec({"optimizer": {"type": "adam", "lr": 0.1},
                          "optimizer_overrides": {
                              "b": {"type": "nesterov", "lr": 0.05, "momentum": 0.8},
                              "d*": {"type": "adamw", "weight_decay": 0.1,
                                     "schedule": {"warmup_steps": 2}}}})
        p = self.psd(spec)
        self.tool(spec, "declare", "w", "4,3")
        self.tool(spec, "declare", "b", "3")
        self.tool(spec, "declare", "decay", "2")
        rng = np.random.default_rng(7)
        gw = [rng.uniform(-1, 1, 12).astype(np.float32) for _ in range(3)]
        gb = [rng.uniform(-1, 1, 3).astype(np.float32) for _ in range(3)]
        gd = [[0.5, -0.25], [0.125, 1.0], [-0.75, 0.5]]
        # Step 1 of 'w' in two calls (rows [0, 2), then [2, 4)): one step.
        self.push(spec, "w", "4,3", gw[0][:6])
        self.push(spec, "w", "4,3", gw[0][6:], offset=6)
        for g in gw[1:]:
            self.push(spec, "w", "4,3", g)
        for g in gb:
            self.push(spec, "b", "3", g)
        for g in gd:
            self.push(spec, "decay", "2", g)
        want, wm, wv = adam(np.zeros(12), gw, [0.1] * 3)
        close(self, pulled(self.tool(spec, "pull", "w", "0", "12")), want, "adam w")
        wantb, mb = nesterov(np.zeros(3), gb, 0.05, 0.8)
        close(self, pulled(self.tool(spec, "pull", "b", "0", "3")), wantb, "nesterov b")
        # AdamW, decoupled decay, warm-up of 2 steps: lr 0.05, 0.1, 0.1.
        wantd, _, _ = adam(np.zeros(2), gd, [0.05, 0.1, 0.1], wd=0.1, decoupled=True)
        close(self, pulled(self.tool(spec, "pull", "decay", "0", "2")), wantd, "adamw decay")
        # psctl vars shows each variable's own optimizer ...
        vs = json.loads(psctl(spec, "--json", "vars").stdout)["vars"]
        opt = {v["name"]: v["optimizer"] for v in vs}
        self.assertEqual(opt["w"], "adam(lr=0.1, beta1=0.9, beta2=0.999, eps=1e-08)")
        self.assertEqual(opt["b"], "nesterov(lr=0.05, momentum=0.8)")
        self.assertEqual(opt["decay"], "adamw(lr=0.1, beta1=0.9, beta2=0.999, eps=1e-08, "
                         "weight_decay=0.1, schedule=constant(warmup_steps=2))")
        table = psctl(spec, "vars").stdout
        self.assertRegex(table, r"\bb\s.*nesterov\(lr=0\.05, momentum=0\.8\)")
        self.assertRegex(p.output(), r"'b': optimizer nesterov\(lr=0\.05, momentum=0\.8\) "
                         r"\(job.optimizer_overrides\[\"b\"\]\)")
        # ... and export --slots writes every slot under its name.
        out = os.path.join(self.d, "model.safetensors")
        r = psctl(spec, "export", "--out", out, "--slots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        a = read_safetensors(out)
        self.assertEqual(sorted(a), ["b", "b/momentum", "decay", "decay/m", "decay/v",
                                     "w", "w/m", "w/v"])
        close(self, a["w/m"].reshape(-1), wm, "w/m")
        close(self, a["w/v"].reshape(-1), wv, "w/v")
        close(self, a["b/momentum"], mb, "b/momentum")

    def test_chunked_pushes_count_one_step(self):
        """A 16 MiB variable over 2 shards arrives in many messages per push;
        Adam's step count (bias correction) must count pushes, not messages:
        with a constant gradient every update moves an element by lr
        exactly (m^ = g, v^ = g^2), so after P pushes it is -P lr sign(g)."""
        spec = self.spec({"optimizer": {"type": "adam", "lr": 0.01}}, nps=2)
        self.psd(spec, 0)
        self.psd(spec, 1)
        size, rounds = 16 << 20, 3
        r = h.pstool(spec, "--bytes", str(size), "--rounds", str(rounds), "roundtrip",
                     timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = os.path.join(self.d, "big.safetensors")
        r = psctl(spec, "export", "--out", out, "--slots")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        a = read_safetensors(out)
        name = "roundtrip/%d/0" % size
        w = a[name].reshape(-1).astype(np.float64)
        n = w.size
        # pstool's gradient: ((i * 2654435761) mod 1000) / 1000 - 0.5 in f32
        i = np.arange(n, dtype=np.uint64)
        g = ((i * np.uint64(2654435761)) % np.uint64(1000)).astype(
            np.float32) / np.float32(1000) - np.float32(0.5)
        pushes = 1 + rounds
        want = -pushes * 0.01 * np.sign(g) * (np.abs(g) / (np.abs(g) + EPS))
        err = np.max(np.abs(w - want))
        self.assertLess(err, 1e-6, "largest error %g" % err)
        st = json.loads(psctl(spec, "--json", "status").stdout)["shards"]
        versions = [v["version"] for s in st for v in s["vars"] if v["name"] == name]
        self.assertTrue(all(v > pushes for v in versions),
                        "the pushes were not chunked (versions %s)" % versions)

    def variant(self, spec, name, **job):
        """A copy of spec (same cluster, same directory) with job keys changed."""
        with open(spec) as f:
            s = json.load(f)
        s["job"].update(job)
        path = os.path.join(self.d, name)
        with open(path, "w") as f:
            json.dump(s, f)
        return path

    def test_checkpoint_keeps_steps_and_refuses_another_optimizer(self):
        spec = self.spec({"optimizer": {"type": "adam", "lr": 0.1}, "checkpoint": {"dir": "ck"}})
        p = self.psd(spec)
        self.tool(spec, "declare", "w", "3")
        gs = [[0.5, -0.3, 0.2], [0.1, 0.2, -0.4], [-0.6, 0.6, 0.1]]
        for g in gs[:2]:
            self.push(spec, "w", "3", g)
        self.assertEqual(p.stop(signal.SIGTERM), 0, p.output())
        # Momentum now: refused loudly, nothing older tried, exit 1.
        other = self.variant(spec, "momentum.json", optimizer={"type": "momentum", "lr": 0.1})
        q = h.Proc([h.build_path("ps-server", "psd"), "--cluster", other, "--task", "ps:0"])
        self.assertEqual(q.wait(timeout=60), 1, q.output())
        self.assertIn("REFUSED checkpoint", q.output())
        self.assertIn("'w' was trained with optimizer adam, and the spec gives it momentum "
                      "(job.optimizer)", q.output())
        self.assertIn("older checkpoints are not tried", q.output())
        # Adam with another lr resumes, and its step count goes on at 3.
        slower = self.variant(spec, "slower.json", optimizer={"type": "adam", "lr": 0.05})
        p = self.psd(slower)
        p.wait_for("resumed from step 2")
        p.wait_for("the spec now says adam(lr=0.05")
        self.push(slower, "w", "3", gs[2])
        want, _, _ = adam(np.zeros(3), gs, [0.1, 0.1, 0.05])
        close(self, pulled(self.tool(slower, "pull", "w", "0", "3")), want, "adam after resume")


def final(out):
    line = [l for l in out.splitlines() if "final:" in l][-1]
    return dict(re.findall(r"(\w+)=([\d.]+)", line.split("final:", 1)[1]))


def example_job(**over):
    with open(os.path.join(ROOT, "deploy", "examples", "local-adam.json")) as f:
        job = json.load(f)["job"]
    job.update(over)
    return job


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class TrainTest(h.ProcTest):
    def dworker(self, spec, *args):
        return h.Proc([h.build_path("worker", "dworker"), "--cluster", spec] + list(args))

    def test_adam_example_trains_and_overrides_show_in_psctl_vars(self):
        """deploy/examples/local-adam.json, 800 steps per worker."""
        spec = os.path.join(self.d, "adam.json")
        h.write_spec(spec, nps=2, nworker=2, job=example_job(log_every=100000))
        ps = [h.start_psd(spec, i) for i in range(2)]
        self.procs += ps
        ws = [self.dworker(spec, "--task", "worker:%d" % i, "--max-steps", "800")
              for i in range(2)]
        for w in ws:
            self.assertEqual(w.wait(timeout=600), 0, w.output()[-3000:])
        acc = float(final(ws[0].output())["test_accuracy"])
        print("\nadam, 2 x 800 async steps: test_accuracy=%.4f" % acc)
        self.assertGreaterEqual(acc, 0.8)
        for w in ws:
            self.assertRegex(w.output(), r"gradient clipping at global norm 5: \d+ of 800 steps")
        vs = json.loads(psctl(spec, "--json", "vars").stdout)["vars"]
        for v in vs:
            kind = v["name"].split("/")[1]
            self.assertTrue(v["optimizer"].startswith("adam(lr=0.002"), v)
            self.assertEqual("weight_decay=0.0001" in v["optimizer"], kind == "kernel", v)
            self.assertIn("schedule=cosine(warmup_steps=200, total_steps=4690", v["optimizer"])
        table = psctl(spec, "vars").stdout
        self.assertRegex(table, r"dense0/bias .*adam\(lr=0\.002, beta1=0\.9, beta2=0\.999, "
                         r"eps=1e-08, schedule")
        self.assertIn("'dense0/bias': optimizer adam(lr=0.002", ps[0].output() + ps[1].output())

    def test_sync_job_equals_standalone_with_clipping(self):
        """Sync, one worker: the shards apply exactly what --standalone
        applies (the same clipped gradient, Adam at the same t and lr)."""
        spec = os.path.join(self.d, "sync.json")
        job = example_job(log_every=100000, sync={"mode": "sync"})
        job["optimizer"] = dict(job["optimizer"], clip_norm=0.5,
                                schedule={"type": "cosine", "warmup_steps": 5,
                                          "total_steps": 30})
        h.write_spec(spec, nps=2, nworker=1, job=job)
        ps = [h.start_psd(spec, i) for i in range(2)]
        self.procs += ps
        dist, alone = os.path.join(self.d, "dist.f32"), os.path.join(self.d, "alone.f32")
        w = self.dworker(spec, "--task", "worker:0", "--max-steps", "30",
                         "--save-params", dist)
        self.assertEqual(w.wait(timeout=600), 0, w.output()[-3000:])
        s = self.dworker(spec, "--standalone", "--max-steps", "30", "--save-params", alone)
        self.assertEqual(s.wait(timeout=600), 0, s.output()[-3000:])
        for p in (w, s):
            m = re.search(r"gradient clipping at global norm 0.5: (\d+) of 30 steps", p.output())
            self.assertTrue(m and int(m.group(1)) > 0, p.output()[-2000:])
        a, b = np.fromfile(dist, dtype="<f4"), np.fromfile(alone, dtype="<f4")
        self.assertEqual(a.size, b.size)
        self.assertTrue(np.array_equal(bits(a), bits(b)),
                        "relative L2 %g" % (np.linalg.norm(a - b) / np.linalg.norm(b)))

    def test_clipping_scales_the_step_to_the_global_norm(self):
        """One sgd step: p = p0 - lr g. Without clipping at lr and at 2 lr
        gives g and p0; with clip_norm c below |g| the step is lr c g / |g|."""
        def one_step(name, **opt):
            spec = os.path.join(self.d, name + ".json")
            h.write_spec(spec, nps=1, nworker=1, job={
                "name": "clip", "optimizer": dict({"type": "sgd"}, **opt)})
            out = os.path.join(self.d, name + ".f32")
            r = h.run([h.build_path("worker", "dworker"), "--cluster", spec, "--standalone",
                       "--max-steps", "1", "--save-params", out], timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            return np.fromfile(out, dtype="<f4").astype(np.float64), r.stderr
        lr, c = 1.0, 0.2
        p1, _ = one_step("plain", lr=lr)
        p2, _ = one_step("double", lr=2 * lr)
        pc, log = one_step("clipped", lr=lr, clip_norm=c)
        g = (p1 - p2) / lr
        p0 = 2 * p1 - p2
        norm = np.linalg.norm(g)
        self.assertGreater(norm, 2 * c)  # so clipping does something
        m = re.search(r"global norm 0.2: 1 of 1 steps clipped, largest norm ([\d.]+)", log)
        self.assertTrue(m, log)
        self.assertAlmostEqual(float(m.group(1)) / norm, 1.0, delta=1e-3)
        step = p0 - pc
        self.assertAlmostEqual(np.linalg.norm(step) / (lr * c), 1.0, delta=1e-4)
        cos = np.dot(step, g) / (np.linalg.norm(step) * norm)
        self.assertAlmostEqual(cos, 1.0, delta=1e-6)


if __name__ == "__main__":
    h.main()
