"""Serving tasks (psd --task serve:J, docs/serving.md) following a job that
trains: a CTR job trained by real shards and dworkers, publishing every
0.5 s, and one serving task per shard, called through a stock gRPC client.

- each serving task follows its shard's chain while it trains, to the
  shard's newest version (ServingStatus.version and applied);
- after training, every row of both tables and every dense variable a
  serving task answers is as `psctl export` has it, bit for bit, found 1;
  ids never trained are found 0 with the table's initial row;
- a training shard killed with SIGKILL leaves its serving task answering
  the same version.
Run: /usr/bin/python3 test_serve_train.py BUILD_DIR"""
import importlib.util
import json
import os
import signal
import struct
import time
import unittest

import harness as h
from hashes import shard_of
import pb
from test_serve import bits, decode, initial_row

CTR_TABLES = [
    {"name": "emb", "dim": 4, "init": "uniform", "init_scale": 0.05,
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1}},
    {"name": "wide", "dim": 1, "init": "zeros",
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1}},
]


def load_safetensors(path):
    """{name: (dtype letter, shape, raw bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    data = b[8 + n:]
    return {k: (t["dtype"], t["shape"], data[t["data_offsets"][0]:t["data_offsets"][1]])
            for k, t in head.items() if k != "__metadata__"}


@unittest.skipUnless(importlib.util.find_spec("grpc"), "python3-grpcio is not installed")
class TrainedServeTest(h.ProcTest):
    """A CTR job whose shards publish every 0.5 s, served by one serving
    task per shard: after training, every row and dense variable answered
    equals psctl export bit for bit; a training shard killed leaves its
    serving task answering that version."""

    def test_serving_equals_the_training_export_and_outlives_a_shard(self):
        import grpc  # pylint: disable=import-outside-toplevel
        spec = os.path.join(self.d, "spec.json")
        gen = {"train": 16000, "test": 500, "seed": 7, "zipf": 1.6}
        cfg = h.write_spec(spec, nps=2, nworker=2, job={
            "name": "ctrsrv", "model": "ctr", "data_dir": "data",
            "ctr": {"fields": 6, "generate": dict(gen)}, "hidden": [8], "epochs": 4,
            "batch_size": 64, "optimizer": {"type": "adam", "lr": 0.002},
            "tables": CTR_TABLES, "seed": 3, "log_every": 1000,
            "publish": {"dir": "pub", "interval_s": 0.5}})
        cfg["cluster"]["serve"] = ["127.0.0.1:%d" % p for p in h.free_ports(2)]
        with open(spec, "w") as f:
            json.dump(cfg, f)
        r = h.run([h.build_path("worker", "psd-ctrgen"), "--out", os.path.join(self.d, "data"),
                   "--train", str(gen["train"]), "--test", str(gen["test"]), "--fields", "6",
                   "--zipf", str(gen["zipf"]), "--seed", str(gen["seed"])], timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        shards = [h.start_psd(spec, i) for i in range(2)]
        self.procs += shards
        serving = []
        for j in range(2):
            p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec,
                        "--task", "serve:%d" % j])
            p.wait_for("ready: listening on")
            self.procs.append(p)
            serving.append(p)
        chans = [grpc.insecure_channel(a) for a in cfg["cluster"]["serve"]]
        self.addCleanup(lambda: [c.close() for c in chans])

        def lookup(j, table, ids, dense=()):
            msg = pb.caller("ctrsrv") + (pb.ld(2, table) if table else b"")
            msg += b"".join(pb.ld(3, d) for d in dense)
            msg += pb.ld(14, struct.pack("<%dQ" % len(ids), *ids)) if ids else b""
            return decode(chans[j].unary_unary("/psd.v1.Serve/Lookup")(msg, timeout=30))

        ws = [h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                      "worker:%d" % i]) for i in range(2)]
        self.procs += ws
        for w in ws:
            self.assertEqual(w.wait(timeout=300), 0, w.output()[-3000:])

        def export(what):
            out = os.path.join(self.d, "export-%s.safetensors" % (what or "dense"))
            r = h.psctl(spec, *(["export"] + ([what] if what else []) + ["--out", out]))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            return load_safetensors(out)

        dense = export(None)
        tables = {t["name"]: export(t["name"]) for t in CTR_TABLES}

        def differences():
            """What the serving tasks answer differently from the export."""
            diffs = []
            for t in CTR_TABLES:
                ex = tables[t["name"]]
                ids = list(struct.unpack("<%dQ" % (len(ex["ids"][2]) // 8), ex["ids"][2]))
                rowb = t["dim"] * 4
                for j in range(2):
                    mine = [(k, i) for k, i in enumerate(ids) if shard_of(i, 2) == j]
                    r = lookup(j, t["name"], [i for _, i in mine])
                    data, found = r[15][0], r[5][0]
                    if set(found) != {1}:
                        diffs.append("%s on serve:%d: %d ids not found" % (
                            t["name"], j, len(found) - sum(found)))
                    for n, (k, i) in enumerate(mine):
                        if data[n * rowb:(n + 1) * rowb] != ex["values"][2][k * rowb:(k + 1) * rowb]:
                            diffs.append("%s id %d on serve:%d" % (t["name"], i, j))
                            break
            for name, (_, shape, raw) in dense.items():
                got = {}
                for j in range(2):
                    r = lookup(j, "", [], dense=[name])
                    sl = decode(r[6][0])
                    if r.get(15, [b""])[0]:  # placed whole: one shard's
                        got[sl.get(2, [0])[0]] = r[15][0]
                if b"".join(got[k] for k in sorted(got)) != raw:
                    diffs.append("dense %s (shape %s)" % (name, shape))
            return diffs

        deadline = time.monotonic() + 60
        while True:
            try:
                diffs = differences()
            except grpc.RpcError as e:  # nothing loaded yet
                diffs = [e.details()]
            if not diffs:
                break
            if time.monotonic() > deadline:
                self.fail("serving differs from psctl export: %s" % diffs[:5])
            time.sleep(0.2)
        # Each serving task followed its shard's chain while it trained, to
        # the shard's newest version.
        r = h.psctl(spec, "--json", "status")
        self.assertEqual(r.returncode, 0, r.stderr)
        for j, shard in enumerate(json.loads(r.stdout)["shards"]):
            st = decode(decode(chans[j].unary_unary("/psd.v1.Admin/Status")(
                pb.caller("ctrsrv"), timeout=30))[92][0])
            self.assertEqual(st[4][0], shard["publish"]["version"])
            self.assertGreaterEqual(st[10][0], 2, "publications applied by serve:%d" % j)
        # Ids never trained: found 0 and the table's initial row.
        never = [i for i in range(10**12, 10**12 + 200) if shard_of(i, 2) == 1][:3]
        r = lookup(1, "emb", never)
        self.assertEqual(list(r[5][0]), [0, 0, 0])
        self.assertEqual(r[15][0], bits([x for i in never
                                         for x in initial_row(i, CTR_TABLES[0], 3)]))
        # A training shard killed: its serving task answers on, the same.
        shards[1].stop(signal.SIGKILL)
        version = lookup(1, "emb", never)[1]
        self.assertEqual(differences(), [])
        self.assertEqual(lookup(1, "emb", never)[1], version)
        self.assertEqual(serving[1].stop(signal.SIGTERM), 0)
        self.assertEqual(serving[0].stop(signal.SIGTERM), 0)


if __name__ == "__main__":
    h.main()
