"""bench multihost: the demo job with links like real hosts' between its
processes, against PyTorch DDP on the same links.

Four network namespaces ("hosts"): ps0 and ps1 (one shard each), w0 and w1
(one worker each), every one joined to a bridge in a fifth namespace (the
"switch") by a veth pair whose two ends are shaped by a tbf qdisc at the
link's rate: the host's end shapes what it sends, the switch's end what it
receives, so each host has a full-duplex link of that rate, as behind a
switch. Addresses are private (10.77.0.0/24, or the next /24 up to
10.99.0.0/24 that none of this host's addresses and routes touch). Only the
bandwidth is emulated: `netem` is not in this kernel, so there is no added
latency and no loss; a round trip costs what a veth and a bridge cost.

At each link speed (1 and 10 Gbit/s) one round runs, in an order rotated
each round:
  psd fp32   the demo job (deploy/examples/local.json's MLP, Fashion-MNIST,
             2 shards and 2 workers, async), over TCP (no Unix sockets or
             shared memory between namespaces), each psd and dworker in its
             host; the rate is ps:0's job rate (every worker's examples over
             first step of any to last step of any, `psctl status`)
  psd bf16   the same with job.wire_dtype "bf16"
  ddp fp32   tests/bench/torch_baseline.py --mode ddp: 2 ranks, one in w0,
             one in w1, gloo bound to their eth0, the rendezvous at w0
  ddp fp16   the same with DDP's fp16_compress_hook
The bytes of each are counted by the links (rx and tx bytes of each host's
eth0, `ip -s link`, before and after), never computed: per step of a worker
or rank, through its own link, and for psd through the shards' links.

Lines (key=value, one per run, then one summary per link speed):

  bench multihost link=1gbit check_Mbps=941
  bench multihost link=1gbit run=psd wire=fp32 round=1 examples=300000
      examples_per_s=... test_accuracy=... steps=... bytes_per_step=...
      tx_per_step=... rx_per_step=... shard_bytes_per_step=... wall_s=...
  bench multihost link=1gbit run=ddp wire=fp16 ... (or SKIP: the reason)
  bench multihost link=1gbit best_psd=bf16 psd_examples_per_s=...
      psd_test_accuracy=... best_ddp=fp32 ddp_examples_per_s=...
      ddp_test_accuracy=... ratio=... goal=1.5 goal_met=yes|no fp32_ratio=...

A side's best is its fastest run that reached test accuracy 0.85 (its
fastest run when none did); ratio is psd's best over DDP's best, and the
goal is met when it is >= 1.5 with both bests at test accuracy >= 0.85;
fp32_ratio is psd fp32 over DDP fp32, the same bytes on the wire.

Everything made is deleted by name at the end, whatever happens (a failed
run, an exception, SIGTERM), and checked to be gone: a namespace left
behind fails the part. Where namespaces cannot be made (not root, no ip or
tc) the part says why and skips: exit 77 run alone, a SKIP line in bench.py.

Run: /usr/bin/python3 tests/bench/bench_multihost.py BUILD_DIR
       [--speeds 1000,10000] [--rounds N] [--max-steps N] [--epochs N]
(docs/performance.md's "bench multihost" says how to read the lines)"""
import argparse
import ipaddress
import json
import os
import random
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import harness as h  # noqa: E402
import netns as nn  # noqa: E402

PART = "multihost"
SPEEDS_MBIT = (1000, 10000)
ROUNDS = 1
GOAL_RATIO = 1.5
GOAL_ACCURACY = 0.85
PREFIX = "psmh"  # every namespace's name starts with it, then the run's tag
HOSTS = ("ps0", "ps1", "w0", "w1")  # in address order: .1, .2, .3, .4
PS_PORT, WORKER_PORT, CHECK_PORT = 7100, 7200, 7300
TBF_LATENCY = "20ms"  # the most a packet may wait in a link's queue
RUNS = (("psd", "fp32"), ("ddp", "fp32"), ("psd", "bf16"), ("ddp", "fp16"))


class Skip(Exception):
    """Namespaces cannot be made here; the message says why."""


def speed_name(mbit):
    return "%dgbit" % (mbit // 1000) if mbit % 1000 == 0 else "%dmbit" % mbit


def host_networks():
    """Every network this host's own namespace has an address or a route in."""
    nets = []
    for what in ("addr", "route"):
        r = nn.ip("-j", "-4", what, "show", check=False)
        try:
            rows = json.loads(r.stdout or "[]")
        except ValueError:
            rows = []
        for row in rows:
            prefixes = ["%s/%s" % (a["local"], a["prefixlen"])
                        for a in row.get("addr_info", []) if "local" in a]
            if row.get("dst") and row["dst"] != "default":
                prefixes.append(row["dst"])
            for p in prefixes:
                try:
                    nets.append(ipaddress.ip_network(p, strict=False))
                except ValueError:
                    pass
    return nets


def pick_network():
    """10.77.0.0/24, or the first of 10.78 ... 10.99 none of this host's
    addresses and routes overlap (a spec naming an address this host also
    has would be ambiguous to whoever reads it)."""
    used = host_networks()
    for second in range(77, 100):
        net = ipaddress.ip_network("10.%d.0.0/24" % second)
        if not any(net.overlaps(u) for u in used):
            return net
    raise Skip("every /24 from 10.77.0.0 to 10.99.0.0 overlaps an address or route here")


class Links:
    """The hosts, the switch and the shaped links (a context manager). Made
    in namespaces only: nothing is added to this host's own, so deleting
    the namespaces by name (the veths and qdiscs go with them) undoes it
    all; close() does that and checks."""

    def __init__(self, hosts=HOSTS):
        why = nn.why_no_netns()
        if why:
            raise Skip(why)
        self.hosts = hosts
        # Unique to this run, so that parallel runs never clash.
        self.tag = "%d%02d" % (os.getpid() % 10000, random.randrange(100))
        self.net = pick_network()
        self.addr = {x: str(self.net[i + 1]) for i, x in enumerate(hosts)}
        self.ns = {x: PREFIX + self.tag + x for x in hosts}
        self.hub = PREFIX + self.tag + "sw"
        self.made = []  # the namespaces made so far, to delete
        self.mbit = None  # the links' rate now

    def __enter__(self):
        nn._exit_on_sigterm()
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind, value, tb):
        left = self.close()
        if left and kind is None:
            raise RuntimeError("bench multihost left behind: " + "; ".join(left))

    def _netns(self, name):
        nn.ip("netns", "add", name)
        self.made.append(name)
        nn.ip("-n", name, "link", "set", "lo", "up")

    def _make(self):
        self._netns(self.hub)
        nn.ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        nn.ip("-n", self.hub, "link", "set", "br0", "up")
        for x in self.hosts:
            self._netns(self.ns[x])
            # Each end made in its namespace (the host's eth0, the switch's
            # port named after the host), never in this host's own.
            nn.ip("link", "add", "eth0", "netns", self.ns[x], "type", "veth", "peer", "name", x,
                  "netns", self.hub)
            nn.ip("-n", self.ns[x], "addr", "add", "%s/%d" % (self.addr[x], self.net.prefixlen),
                  "dev", "eth0")
            nn.ip("-n", self.ns[x], "link", "set", "eth0", "up")
            nn.ip("-n", self.hub, "link", "set", x, "master", "br0", "up")

    def ends(self):
        """Each link's two ends: (namespace, interface)."""
        for x in self.hosts:
            yield self.ns[x], "eth0"
            yield self.hub, x

    def set_rate(self, mbit):
        """Every link's both directions to mbit Mbit/s: a tbf on each end
        whose bucket holds 1 ms at the rate (at least 64 KiB, a GSO packet:
        tbf splits a larger one)."""
        burst = max(mbit * 1000 // 8, 64 << 10)
        for ns, dev in self.ends():
            cmd = ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                   "%dmbit" % mbit, "burst", str(burst), "latency", TBF_LATENCY]
            r = h.run(cmd, timeout=30)
            if r.returncode != 0:
                raise Skip("%s: %s" % (" ".join(cmd), r.stderr.strip()))
        self.mbit = mbit

    def qdiscs(self):
        """The tbf qdiscs on the links' ends: [(namespace, interface)]."""
        out = []
        for ns, dev in self.ends():
            r = h.run(["tc", "-n", ns, "-j", "qdisc", "show", "dev", dev], timeout=30)
            for q in json.loads(r.stdout or "[]"):
                if q.get("kind") == "tbf":
                    out.append((ns, dev))
        return out

    def counters(self):
        """{host: (rx bytes, tx bytes)} of each host's eth0."""
        out = {}
        for x in self.hosts:
            r = nn.ip("-n", self.ns[x], "-s", "-j", "link", "show", "dev", "eth0")
            st = json.loads(r.stdout)[0]["stats64"]
            out[x] = (st["rx"]["bytes"], st["tx"]["bytes"])
        return out

    def argv(self, host, argv):
        return nn.netns_argv(self.ns[host], argv)

    def close(self):
        """Deletes every namespace made, by name, the last made first, and
        checks that none of this run's names is left, here or in this
        host's own namespace; returns what is left (empty when all went)."""
        left = []
        while self.made:
            why = nn.netns_delete(self.made.pop())
            if why:
                left.append(why)
        left += self.leftovers()
        return left

    def leftovers(self):
        """This run's namespaces and interfaces that still exist."""
        mine = PREFIX + self.tag
        left = ["namespace %s" % n for n in sorted(nn.netns_names()) if n.startswith(mine)]
        r = nn.ip("-j", "link", "show", check=False)
        for link in json.loads(r.stdout or "[]"):
            if link.get("ifname", "").startswith(mine):
                left.append("interface %s" % link["ifname"])
        return left


# ---- The link check: a TCP stream w0 -> ps0 ----

SINK = """import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
print("listening", flush=True)
c, _ = s.accept()
n, t0, t1 = 0, None, None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    if t0 is None:
        t0 = time.monotonic()
    else:
        n += len(b)
    t1 = time.monotonic()
print("got bytes=%d s=%.6f" % (n, t1 - t0), flush=True)
"""

SOURCE = """import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
buf = b"x" * (1 << 20)
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    c.sendall(buf)
c.close()
"""


def link_check(b, links, seconds=1.5):
    """Mbit/s of one TCP stream from w0 to ps0 over the shaped links (the
    receiver's bytes over its time, its first read left out)."""
    sink = h.Proc(links.argv("ps0", [sys.executable, "-c", SINK, links.addr["ps0"],
                                     str(CHECK_PORT)]))
    try:
        sink.wait_for("listening", timeout=30)
        b.run_ok(PART, links.argv("w0", [sys.executable, "-c", SOURCE, links.addr["ps0"],
                                         str(CHECK_PORT), str(seconds)]), timeout=60)
        got = b.kv(sink.wait_for("got bytes=", timeout=30))
    finally:
        sink.stop()
    return 8 * int(got["bytes"]) / float(got["s"]) / 1e6


# ---- The runs ----

def traffic(links, before, after, steps, workers):
    """The bytes the links counted, per step of a worker (or rank)."""
    d = {x: (after[x][0] - before[x][0], after[x][1] - before[x][1]) for x in links.hosts}
    rx = sum(d[x][0] for x in workers)
    tx = sum(d[x][1] for x in workers)
    others = sum(d[x][0] + d[x][1] for x in links.hosts if x not in workers)
    return {"bytes_per_step": (rx + tx) / steps, "tx_per_step": tx / steps,
            "rx_per_step": rx / steps, "others_per_step": others / steps,
            "all_tx": sum(d[x][1] for x in links.hosts),
            "all_rx": sum(d[x][0] for x in links.hosts), "by_host": d}


def write_spec(d, links, job, wire):
    cfg = {"cluster": {"ps": ["%s:%d" % (links.addr["ps%d" % i], PS_PORT) for i in range(2)],
                       "worker": ["%s:%d" % (links.addr["w%d" % i], WORKER_PORT)
                                  for i in range(2)]},
           "job": dict(job)}
    cfg["job"]["unix_sockets"] = False  # between hosts: TCP
    if wire == "bf16":
        cfg["job"]["wire_dtype"] = "bf16"
    path = os.path.join(d, "multihost-%s.json" % wire)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


def job_rate(b, links, spec):
    """ps:0's job rate (psctl status from w0)."""
    argv = links.argv("w0", [h.build_path("ps-server", "psctl"), "--cluster", spec, "--json",
                             "status"])
    r = b.run_ok(PART, argv)
    try:
        rate = json.loads(r.stdout)["shards"][0]["job_rate"]
    except (ValueError, KeyError, IndexError) as e:
        b.fail(PART, argv, "printed no job_rate (%s)" % e, r.stdout)
    return rate


def run_psd(b, d, links, job, wire, want, max_steps):
    spec = write_spec(d, links, job, wire)
    extra = ["--max-steps", str(max_steps)] if max_steps else []
    with b.procs(PART) as started:
        for i in range(2):
            p = h.Proc(links.argv("ps%d" % i, [h.build_path("ps-server", "psd"), "--cluster",
                                               spec, "--task", "ps:%d" % i]))
            started.append(p)
            try:
                p.wait_for("ready: listening on", timeout=60)
            except AssertionError as e:
                b.fail(PART, p.argv, "did not get ready", str(e))
        before = links.counters()
        t0 = time.monotonic()
        ws = []
        for i in range(2):
            ws.append(h.Proc(links.argv("w%d" % i, [h.build_path("worker", "dworker"),
                                                    "--cluster", spec, "--task",
                                                    "worker:%d" % i] + extra)))
            started.append(ws[-1])
        b.wait_all_ok(PART, ws)
        wall = time.monotonic() - t0
        after = links.counters()
        final = b.final_line(ws[0].output())
        if final is None:
            b.fail(PART, ws[0].argv, "printed no final: line", ws[0].output())
        done = b.line_kv(PART, ws[1].argv, ws[1].lines, "done:")
        rate = job_rate(b, links, spec)
    if int(rate.get("workers", 0)) != 2:
        b.fail(PART, ws[0].argv, "the job rate covers %s of 2 workers" % rate.get("workers"),
               json.dumps(rate))
    b.check_examples(PART, ws[0].argv, ws[0].output(), int(rate["examples"]), want)
    steps = int(final["steps"]) + int(done["steps"])
    return dict(traffic(links, before, after, steps, ("w0", "w1")),
                rate=float(rate["examples_per_s"]), acc=float(final["test_accuracy"]),
                examples=int(rate["examples"]), steps=steps, wall_s=wall)


def run_ddp(b, d, links, job, wire, want, max_steps):
    spec = write_spec(d, links, job, "fp32")
    argv = [sys.executable, os.path.join(HERE, "torch_baseline.py"), "--mode", "ddp",
            "--procs", "2", "--spec", spec, "--epochs", str(job["epochs"]), "--threads", "1",
            "--timeout", str(b.RUN_TIMEOUT_S - 30), "--master", links.addr["w0"],
            "--ifname", "eth0", "--netns", links.ns["w0"], "--netns", links.ns["w1"]]
    if max_steps:
        argv += ["--max-steps", str(max_steps)]
    if wire == "fp16":
        argv += ["--comm-hook", "fp16"]
    before = links.counters()
    r = b.run_ok(PART, argv)
    after = links.counters()
    t = b.line_kv(PART, argv, r.stdout.splitlines(), "torch:")
    b.check_examples(PART, argv, r.stdout, int(t["examples"]), want)
    steps = int(t["steps"])
    return dict(traffic(links, before, after, steps, ("w0", "w1")),
                rate=float(t["examples_per_s"]), acc=float(t["test_accuracy"]),
                examples=int(t["examples"]), steps=steps, wall_s=float(t["wall_s"]))


def examples(train_size, epochs, batch, max_steps, workers=2):
    """The examples the workers (or ranks) train on together: each its
    share of the training set, epochs times, or its first max_steps
    batches (an epoch's last batch holds what is left)."""
    share = train_size // workers
    spe = (share + batch - 1) // batch
    steps = epochs * spe if not max_steps else min(max_steps, epochs * spe)
    return workers * ((steps // spe) * share + min((steps % spe) * batch, share))


def best(results):
    """The fastest of results ({wire: result}) that reached the accuracy
    goal, or the fastest when none did: (wire, result)."""
    ok = {w: r for w, r in results.items() if r["acc"] >= GOAL_ACCURACY} or results
    return max(ok.items(), key=lambda wr: wr[1]["rate"])


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def bench(d, b, speeds=SPEEDS_MBIT, rounds=ROUNDS, max_steps=None, epochs=None, say=print,
          runs=RUNS):
    """The part: its lines through say, the runs of runs (RUNS: all). Raises
    Skip where namespaces cannot be made, b.BenchFailed when a run fails."""
    with open(os.path.join(HERE, "..", "..", "deploy", "examples", "local.json")) as f:
        job = dict(json.load(f)["job"], log_every=100000)
    if epochs:
        job["epochs"] = epochs
    want = examples(b.training_set_size(job["data_dir"]), job["epochs"], job["batch_size"],
                    max_steps)
    skipped = {}  # (run, wire): why it cannot run here
    with Links() as links:
        for mbit in speeds:
            link = speed_name(mbit)
            links.set_rate(mbit)
            say("bench multihost link=%s check_Mbps=%.0f"
                % (link, link_check(b, links)))
            got = {}  # (run, wire): [results over the rounds]
            for rnd in range(rounds):
                for run, wire in runs[rnd % len(runs):] + runs[:rnd % len(runs)]:
                    if (run, wire) in skipped:
                        continue
                    fn = run_psd if run == "psd" else run_ddp
                    try:
                        r = fn(b, d, links, job, wire, want, max_steps)
                    except b.BenchFailed as e:
                        if (run, wire) != ("ddp", "fp16"):
                            raise
                        # The hook is optional: say why it did not run.
                        why = [l for l in str(e).splitlines() if l.strip()][-1]
                        skipped[(run, wire)] = why
                        say("bench multihost link=%s run=ddp wire=fp16 SKIP: DDP's "
                            "fp16_compress_hook failed under gloo: %s" % (link, why[:300]))
                        continue
                    got.setdefault((run, wire), []).append(r)
                    say("bench multihost link=%s run=%s wire=%s round=%d examples=%d "
                        "examples_per_s=%.0f test_accuracy=%.4f steps=%d bytes_per_step=%.0f "
                        "tx_per_step=%.0f rx_per_step=%.0f %s_bytes_per_step=%.0f wall_s=%.1f"
                        % (link, run, wire, rnd + 1, r["examples"], r["rate"], r["acc"],
                           r["steps"], r["bytes_per_step"], r["tx_per_step"],
                           r["rx_per_step"], "shard" if run == "psd" else "other",
                           r["others_per_step"], r["wall_s"]))
            med = {}
            for (run, wire), rs in got.items():
                med.setdefault(run, {})[wire] = {"rate": median([r["rate"] for r in rs]),
                                                 "acc": median([r["acc"] for r in rs])}
            if "psd" not in med or "ddp" not in med:
                continue
            pw, p = best(med["psd"])
            dw, q = best(med["ddp"])
            ratio = p["rate"] / q["rate"]
            met = ratio >= GOAL_RATIO and min(p["acc"], q["acc"]) >= GOAL_ACCURACY
            say("bench multihost link=%s best_psd=%s psd_examples_per_s=%.0f "
                "psd_test_accuracy=%.4f best_ddp=%s ddp_examples_per_s=%.0f "
                "ddp_test_accuracy=%.4f ratio=%.2f goal=%.1f goal_met=%s%s"
                % (link, pw, p["rate"], p["acc"], dw, q["rate"], q["acc"], ratio, GOAL_RATIO,
                   "yes" if met else "no",
                   " fp32_ratio=%.2f" % (med["psd"]["fp32"]["rate"] / med["ddp"]["fp32"]["rate"])
                   if "fp32" in med["psd"] and "fp32" in med["ddp"] else ""))
    return links


def multihost(d, b):
    """bench.py's part: a SKIP line where namespaces cannot be made."""
    try:
        bench(d, b, say=lambda line: print(line, flush=True))
    except Skip as e:
        print("bench multihost SKIP: %s" % e, flush=True)


def main():
    ap = argparse.ArgumentParser(description="bench multihost (tests/bench/bench_multihost.py)")
    ap.add_argument("build")
    ap.add_argument("--speeds", default=",".join(str(s) for s in SPEEDS_MBIT),
                    help="link rates in Mbit/s, comma-separated (default 1000,10000)")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--max-steps", type=int, help="each worker and rank stops after N steps")
    ap.add_argument("--epochs", type=int, help="instead of the demo's job.epochs")
    args = ap.parse_args()
    try:
        speeds = [int(s) for s in args.speeds.split(",")]
    except ValueError:
        ap.error("--speeds takes Mbit/s as integers, comma-separated")
    h.BUILD = os.path.abspath(args.build)
    import bench as b
    core = h.blas_core()
    if core and not os.environ.get("OPENBLAS_CORETYPE"):
        os.environ["OPENBLAS_CORETYPE"] = core
    try:
        with tempfile.TemporaryDirectory(prefix="psd-multihost-") as d:
            bench(d, b, speeds, args.rounds, args.max_steps, args.epochs,
                  say=lambda line: print(line, flush=True))
    except Skip as e:
        print("bench multihost SKIP: %s" % e, flush=True)
        return 77
    except b.BenchFailed as e:
        sys.stderr.write("%s\n" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
