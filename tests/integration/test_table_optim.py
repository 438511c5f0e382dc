"""Every per-row optimizer of an embedding table on real shards, checked
against docs/tables.md alone: this file recomputes in Python what the doc
says the shards compute, bit for bit (float32 arithmetic is each operation
in double rounded to float32, which is exact for + - * / and sqrt).

- a fresh row is its initializer's, recomputed from the doc's recipe
  (splitmix64, FNV-1a of the table's name, the job's seed, the id), on
  both shards; its optimizer state starts as documented (the accumulators
  at initial_accumulator, FTRL's n too and the z that gives back the
  initial weight, Adam's m and v at zero);
- sgd, adagrad, rowwise_adagrad, adam and ftrl follow the doc's float
  formulas with double constants bit for bit, values and state, through
  pushes that repeat an id (summed in request order);
- each table survives a full then a delta checkpoint, kill -9 of every
  shard and a restart: values, state, count and t come back bit for bit,
  and training goes on from them as the formulas say;
- an async SparsePull's and SparsePush's version is the pushes applied to
  the table on that shard (4 pushes naming 13 rows make 4), restored with
  the checkpoint;
- Rows.found is false for an id never touched, true once a pull stored
  it (admission "always"), false for a pulled or pushed id that admission
  keeps out; a push naming an id twice counts once, for count and for
  admission.
Run: /usr/bin/python3 test_table_optim.py BUILD_DIR"""
import importlib.util
import json
import math
import os
import signal
import struct
import sys
import unittest

import harness as h
import pb
from hashes import M64, fnv1a64, mix64, shard_of, splitmix64_at

f = h.f32
SEED = 12345

# ---- docs/tables.md, "Where rows live" and "Per-row optimizers" ----




def initial_row(seed, table, i):
    """The initial row of id i of table (a dict as in the spec)."""
    if table.get("init", "uniform") == "zeros":
        return [0.0] * table["dim"]
    scale = f(table.get("init_scale", 0.01))
    key = mix64(splitmix64_at(seed ^ fnv1a64(table["name"])) ^ splitmix64_at(i))
    out = []
    for j in range(table["dim"]):
        u = (splitmix64_at((key + j) & M64) >> 40) * 2.0**-24
        out.append(f((2 * u - 1) * scale))
    return out


def fsqrt(x):
    return f(math.sqrt(x))


class Row:
    """One row's value and optimizer state, updated as the doc says."""

    def __init__(self, table, w):
        o = table["optimizer"]
        self.type, self.o, self.dim = o["type"], o, table["dim"]
        self.w, self.t = list(w), 0
        acc = f(o.get("initial_accumulator", 0.1))
        self.lr, self.eps = f(o.get("lr", 0.05)), f(o.get("eps", 1e-8))
        if self.type == "adagrad":
            self.state = [acc] * self.dim
        elif self.type == "rowwise_adagrad":
            self.state = [acc]
        elif self.type == "adam":
            self.state = [0.0] * (2 * self.dim)
        elif self.type == "ftrl":
            self.l1, self.l2 = f(o.get("l1", 0.0)), f(o.get("l2", 0.0))
            self.beta = f(o.get("beta", 1.0))
            d = self.ftrl_den(acc)
            z = [0.0 if x == 0 else -f(f(x * d) + math.copysign(self.l1, x)) for x in self.w]
            self.state = z + [acc] * self.dim
        else:
            self.state = []

    def ftrl_den(self, n):
        return f(f(f(self.beta + fsqrt(n)) / self.lr) + self.l2)

    def apply(self, g):
        self.t += 1
        w, s, lr, eps, dim = self.w, self.state, self.lr, self.eps, self.dim
        if self.type == "sgd":
            for i in range(dim):
                w[i] = f(w[i] - f(lr * g[i]))
        elif self.type == "adagrad":
            for i in range(dim):
                s[i] = f(s[i] + f(g[i] * g[i]))
                w[i] = f(w[i] - f(f(lr * g[i]) / f(fsqrt(s[i]) + eps)))
        elif self.type == "rowwise_adagrad":
            q = 0.0
            for i in range(dim):
                q = f(q + f(g[i] * g[i]))
            s[0] = f(s[0] + f(q / dim))
            d = f(fsqrt(s[0]) + eps)
            for i in range(dim):
                w[i] = f(w[i] - f(f(lr * g[i]) / d))
        elif self.type == "adam":
            b1, b2 = self.o.get("beta1", 0.9), self.o.get("beta2", 0.999)
            step = f(self.o.get("lr", 0.05) / (1.0 - math.pow(b1, self.t)))
            rbc2 = f(1.0 / math.sqrt(1.0 - math.pow(b2, self.t)))
            fb1, fb2, omb1, omb2 = f(b1), f(b2), f(1.0 - b1), f(1.0 - b2)
            for i in range(dim):
                m = s[i] = f(f(fb1 * s[i]) + f(omb1 * g[i]))
                v = s[dim + i] = f(f(fb2 * s[dim + i]) + f(omb2 * f(g[i] * g[i])))
                w[i] = f(w[i] - f(step * f(m / f(f(fsqrt(v) * rbc2) + eps))))
        elif self.type == "ftrl":
            for i in range(dim):
                n, n1 = s[dim + i], f(s[dim + i] + f(g[i] * g[i]))
                sigma = f(f(fsqrt(n1) - fsqrt(n)) / lr)
                z = s[i] = f(s[i] + f(g[i] - f(sigma * w[i])))
                s[dim + i] = n1
                if abs(z) <= self.l1:
                    w[i] = 0.0
                else:
                    w[i] = f(-f(z - math.copysign(self.l1, z)) / self.ftrl_den(n1))


# ---- the job ----

OPT = [
    {"name": "o_sgd", "dim": 3, "init_scale": 0.1, "optimizer": {"type": "sgd", "lr": 0.3}},
    {"name": "o_adagrad", "dim": 3, "init_scale": 0.1,
     "optimizer": {"type": "adagrad", "lr": 0.1, "eps": 1e-8, "initial_accumulator": 0.1}},
    {"name": "o_rowwise", "dim": 5, "init_scale": 0.05,
     "optimizer": {"type": "rowwise_adagrad", "lr": 0.07, "initial_accumulator": 0.2}},
    {"name": "o_adam", "dim": 4, "init_scale": 0.1,
     "optimizer": {"type": "adam", "lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}},
    {"name": "o_ftrl", "dim": 3, "init_scale": 0.1,
     "optimizer": {"type": "ftrl", "lr": 0.05, "l1": 0.001, "l2": 0.1, "beta": 1,
                   "initial_accumulator": 0.1}},
    {"name": "o_ftrl0", "dim": 2, "init": "zeros",
     "optimizer": {"type": "ftrl", "lr": 0.1, "l1": 0.5, "l2": 0.01, "beta": 1}},
]
OTHER = [
    {"name": "ver", "dim": 2, "init_scale": 0.01, "optimizer": {"type": "sgd", "lr": 1.0}},
    {"name": "cnt", "dim": 1, "init": "zeros", "optimizer": {"type": "sgd", "lr": 1.0},
     "admission": {"type": "count", "count": 2}},
]
# job.table_defaults: the settings of a table a client declares that
# job.tables does not list (every entry above gives its own).
DEFAULTS = {"init_scale": 0.125, "optimizer": {"type": "adagrad", "lr": 0.25, "eps": 1e-8,
                                               "initial_accumulator": 0.5}}
IDS = [3, 17, 29, 1000003, 2**40 + 9, 2**64 - 2]


def grads(k, n, dim):
    """Round k's gradient rows: multiples of 1/64, exact in float32."""
    return [((7 * k + 3 * r + 5 * j) % 23 - 11) / 64.0 for r in range(n) for j in range(dim)]


class TableOptimTest(h.ShardsTest):
    @classmethod
    def job(cls):
        return {"name": "topt", "seed": SEED, "tables": OPT + OTHER,
                "table_defaults": DEFAULTS,
                "checkpoint": {"dir": os.path.join(cls.tmp.name, "ckpt")}}

    def rows(self, table, op, ids, g=None):
        args = ["rows", table["name"], str(table["dim"]), op, ",".join(str(i) for i in ids)]
        if g is not None:
            args.append(",".join(repr(x) for x in g))
        r = h.pstool(self.spec, *args)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        if op == "push":
            return None
        out = {}
        for line in r.stdout.splitlines()[1:]:
            parts = line.split()
            out[int(parts[0])] = [f(float(x)) for x in parts[1:]]
        return [out[i] for i in ids]

    def get(self, name, ids):
        doc = json.loads(self.psctl("--json", "get", name, "--ids",
                                    ",".join(str(i) for i in ids)))
        return {r["id"] & M64: r for r in doc["rows"]}

    def push(self, table, ids, g, want):
        """Pushes g for ids and applies it to the reference rows `want`:
        duplicates summed in request order, one update per id."""
        self.rows(table, "push", ids, g)
        dim, summed = table["dim"], {}
        for k, i in enumerate(ids):
            row = g[k * dim:(k + 1) * dim]
            summed[i] = [f(a + b) for a, b in zip(summed[i], row)] if i in summed else row
        for i, s in summed.items():
            want[i].apply(s)

    def check(self, table, want, what):
        """The shards' rows (pulled, and psctl get's value, state, count
        and t) are the reference's, bit for bit."""
        ids = sorted(want)
        pulled = self.rows(table, "pull", ids)
        got = self.get(table["name"], ids)
        for i, p in zip(ids, pulled):
            r = want[i]
            self.assertEqual(p, r.w, "%s %s: id %d's value" % (what, table["name"], i))
            self.assertTrue(got[i]["found"], got[i])
            self.assertEqual([f(x) for x in got[i]["value"]], r.w)
            self.assertEqual([f(x) for x in got[i]["state"]], r.state,
                             "%s %s: id %d's state %s" % (what, table["name"], i,
                                                          got[i]["state_parts"]))
            self.assertEqual(got[i]["t"], r.t)
        return {i: (got[i]["value"], got[i]["state"], got[i]["count"], got[i]["t"]) for i in ids}

    def checkpoint(self):
        out = self.psctl("checkpoint", "--wait")
        return out

    def test_every_optimizer_trains_and_survives_kill9(self):
        # Both shards hold some of the ids.
        self.assertEqual({shard_of(i, 2) for i in IDS}, {0, 1})
        want = {}
        for t in OPT:
            fresh = self.rows(t, "pull", IDS)
            self.assertEqual(fresh, [initial_row(SEED, t, i) for i in IDS], t["name"])
            want[t["name"]] = {i: Row(t, w) for i, w in zip(IDS, fresh)}
            self.check(t, want[t["name"]], "fresh")
        # Round 1: every id, the first one twice (summed).
        for t in OPT:
            ids = IDS + IDS[:1]
            self.push(t, ids, grads(1, len(ids), t["dim"]), want[t["name"]])
        self.checkpoint()
        # Round 2: a few ids on both shards; then the delta checkpoint.
        few = [IDS[0], IDS[1], IDS[3]]
        self.assertEqual({shard_of(i, 2) for i in few}, {0, 1})
        for k in (2, 3):
            for t in OPT:
                self.push(t, few, grads(k, len(few), t["dim"]), want[t["name"]])
        self.checkpoint()
        before = {t["name"]: self.check(t, want[t["name"]], "before the kill") for t in OPT}
        for i in range(2):
            d = os.path.join(self.tmp.name, "ckpt", "topt", "ps-%d" % i)
            newest = sorted(x for x in os.listdir(d) if x.startswith("ckpt-"))[-1]
            with open(os.path.join(d, newest, "manifest.json")) as fh:
                m = {e["name"]: e for e in json.load(fh)["tables"]}
            for t in OPT:
                self.assertTrue(m[t["name"]]["delta"], m[t["name"]])
                self.assertEqual(len(m[t["name"]]["chain"]), 2, m[t["name"]])
        for i in range(2):
            self.assertEqual(self.ps[i].stop(signal.SIGKILL), -signal.SIGKILL)
        self.__class__.ps = [h.start_psd(self.spec, i) for i in range(2)]
        for p in self.ps:
            for t in OPT:
                p.wait_for("table '%s': restored from 2 files" % t["name"])
        for t in OPT:
            self.assertEqual(self.check(t, want[t["name"]], "restored"), before[t["name"]])
        # Training goes on from the restored state (Adam's t, m and v,
        # FTRL's z and n, the accumulators).
        for t in OPT:
            self.push(t, IDS, grads(4, len(IDS), t["dim"]), want[t["name"]])
            self.check(t, want[t["name"]], "after the restart")
        # FTRL with zeros as the initializer is McMahan's start: z = 0, and
        # an L1 of 0.5 holds small weights at exactly 0.
        z0 = self.get("o_ftrl0", IDS)
        self.assertTrue(any(x == 0.0 for r in z0.values() for x in r["value"]))

    @unittest.skipUnless(importlib.util.find_spec("grpc"), "python3-grpcio is not installed")
    def test_version_counts_pushes_not_rows(self):
        import grpc  # pylint: disable=import-outside-toplevel
        mine = [i for i in range(10**6, 10**6 + 200) if shard_of(i, 2) == 0]

        def ids(xs):
            return struct.pack("<%dQ" % len(xs), *xs)

        def version(call, msg):
            return pb.fields(call(msg, timeout=30)).get(1, [0])[0]

        with grpc.insecure_channel(self.addrs[0]) as ch:
            pull = ch.unary_unary("/psd.v1.Data/SparsePull")
            push = ch.unary_unary("/psd.v1.Data/SparsePush")


            base = version(pull, pb.caller("topt") + pb.ld(2, "ver") + pb.ld(15, ids(mine[:1])))
            got = []
            for lo, hi in ((0, 4), (4, 8), (8, 11), (11, 13)):  # 4 pushes, 13 rows
                xs = mine[lo:hi]
                got.append(version(push, pb.caller("topt") + pb.ld(2, "ver") +
                                   pb.ld(14, ids(xs)) +
                                   pb.ld(15, struct.pack("<%df" % (2 * len(xs)),
                                                         *[0.5] * (2 * len(xs))))))
            self.assertEqual(got, [base + 1, base + 2, base + 3, base + 4])
            self.assertEqual(version(pull, pb.caller("topt") + pb.ld(2, "ver") +
                                     pb.ld(15, ids(mine[:13]))), base + 4)
        # ps:0's checkpoint keeps it: the manifest says it, a restart
        # answers it.
        self.psctl("checkpoint", "--wait")
        d = os.path.join(self.tmp.name, "ckpt", "topt", "ps-0")
        newest = sorted(x for x in os.listdir(d) if x.startswith("ckpt-"))[-1]
        with open(os.path.join(d, newest, "manifest.json")) as fh:
            m = {e["name"]: e for e in json.load(fh)["tables"]}
        self.assertEqual(m["ver"]["pushes"], base + 4)
        self.assertEqual(self.ps[0].stop(signal.SIGKILL), -signal.SIGKILL)
        self.ps[0] = h.start_psd(self.spec, 0)
        self.ps[0].wait_for("table 'ver': restored")
        with grpc.insecure_channel(self.addrs[0]) as ch:
            pull = ch.unary_unary("/psd.v1.Data/SparsePull")
            self.assertEqual(version(pull, pb.caller("topt") + pb.ld(2, "ver") +
                                     pb.ld(15, ids(mine[:1]))), base + 4)

    def test_a_declared_table_takes_table_defaults(self):
        # pstool declares "declared" (not in job.tables): its rows start
        # from job.table_defaults' init_scale and train by its optimizer.
        table = dict(DEFAULTS, name="declared", dim=3)
        ids = [5, 77, 2**50 + 1]
        want = {i: Row(table, initial_row(SEED, table, i)) for i in ids}
        self.assertEqual(self.rows(table, "pull", ids), [want[i].w for i in ids])
        self.push(table, ids, grads(1, len(ids), 3), want)
        self.push(table, ids[:2], grads(2, 2, 3), want)
        self.check(table, want, "table_defaults")
        out = self.psctl("tables")
        self.assertIn("adagrad(lr=0.25", out)

    def test_found_and_an_id_named_twice(self):
        ver, cnt = OTHER
        # found: false until a pull or push stores the row.
        self.rows(ver, "pull", [501])
        got = self.get("ver", [501, 502])
        self.assertTrue(got[501]["found"])  # stored by the pull
        self.assertEqual((got[501]["count"], got[501]["t"]), (0, 0))
        self.assertEqual([f(x) for x in got[501]["value"]], initial_row(SEED, ver, 501))
        self.assertFalse(got[502]["found"])  # never touched
        # An id named three times in one push: summed, one update, count 1.
        self.rows(ver, "push", [503, 503, 503], [1.0, 2.0, 0.5, 0.5, 0.25, 0.25])
        got = self.get("ver", [503])[503]
        self.assertEqual((got["count"], got["t"]), (1, 1))
        w0 = initial_row(SEED, ver, 503)
        self.assertEqual([f(x) for x in got["value"]],
                         [f(w0[0] - 1.75), f(w0[1] - 2.75)])
        # Admission by count 2: a pull stores nothing; one push naming the id
        # twice is one push (not admitted); the next push admits it.
        self.assertEqual(self.rows(cnt, "pull", [601]), [[0.0]])
        self.assertFalse(self.get("cnt", [601])[601]["found"])
        self.rows(cnt, "push", [601, 601], [1.0, 2.0])
        self.assertFalse(self.get("cnt", [601])[601]["found"])
        self.assertEqual(self.rows(cnt, "pull", [601]), [[0.0]])
        self.rows(cnt, "push", [601], [0.5])
        got = self.get("cnt", [601])[601]
        self.assertTrue(got["found"])
        self.assertEqual((got["count"], got["t"], got["value"]), (2, 1, [-0.5]))


if __name__ == "__main__":
    h.main(sys.argv)
