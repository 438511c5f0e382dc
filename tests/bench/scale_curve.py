"""The sync scale curve, past bench scale's 32 workers: the same job and the
same light clients (tests/bench/bench.py, function scale: 2 psd shards, n
`pstool syncload` workers of 100 steps each), for n up to 64, with where the
CPU went. On a 2-core machine the n clients and the 2 shards share the
cores, so each point also prints the CPU seconds the shards used and the CPU
seconds the clients used: whether a fall in pushes per second is the
server's or the clients'.

Run: /usr/bin/python3 tests/bench/scale_curve.py BUILD_DIR [--repeats R]
         [--steps S] [--perf N] [--base BUILD_DIR2] [N ...]
  N ...      the worker counts (default 1 2 4 8 16 32 64)
  --base B   alternate, at every point, with the psd of build B (the same
             clients): a baseline measured in the same run
  --perf N   at n = N, record each shard and client 0 with `perf record -g`
             for the run (profiles psd0-N.data, psd1-N.data, client-N.data:
             perf report --stdio -i ...)
             and print each busy shard thread's CPU, time waiting for a CPU
             and context switches

Each line: workers, pushes_per_s (the shards' pushes over the slowest
client's wall time, as bench scale counts them), step_ms, dropped (gradients
left out of steps), psd_cpu_s and clients_cpu_s (CPU seconds, user + system),
pushes_per_psd_cpu_s (the shards' pushes over their CPU seconds: the server's
cost per push, whatever share of the cores it got),
and the machine's load average at the start. Medians over the repeats end
the output, with the ratio of each n to n = 8."""
import json
import os
import resource
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness as h  # noqa: E402
from bench import kv, median  # noqa: E402


def proc_cpu_s(pid):
    """utime + stime of a live process, seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads(pid):
    """Each thread of a live process: name, CPU seconds, voluntary and
    involuntary context switches, seconds runnable but waiting for a CPU."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        base = "/proc/%d/task/%s/" % (pid, tid)
        try:
            with open(base + "stat") as f:
                st = f.read()
            with open(base + "schedstat") as f:
                run_ns, wait_ns = [int(x) for x in f.read().split()[:2]]
            with open(base + "status") as f:
                sw = dict(l.split(":\t") for l in f.read().splitlines() if ":\t" in l)
        except OSError:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        fields = st.rsplit(")", 1)[1].split()
        out[tid] = [name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
                    int(sw["voluntary_ctxt_switches"]), int(sw["nonvoluntary_ctxt_switches"]),
                    wait_ns / 1e9]
    return out


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def start_psd(psd, spec, index):
    p = h.Proc([psd, "--cluster", spec, "--task", "ps:%d" % index])
    p.wait_for("ready: listening on")
    return p


def one(d, n, steps, perf, psd):
    spec = os.path.join(d, "scale%d.json" % n)
    h.write_spec(spec, nps=2, nworker=n,
                 job={"name": "bench-scale", "optimizer": {"type": "momentum"},
                      "sync": {"mode": "sync"}, "heartbeat_ms": 1000,
                      "dead_after_ms": 60000})
    load = os.getloadavg()[0]
    ps = [start_psd(psd, spec, i) for i in range(2)]
    rec = []
    try:
        cpu0 = [proc_cpu_s(p.p.pid) for p in ps]
        kids0 = children_cpu_s()
        th0 = [threads(p.p.pid) for p in ps]
        if perf:
            rec = [subprocess.Popen(["perf", "record", "-g", "-o", "psd%d-%d.data" % (i, n),
                                     "-p", str(p.p.pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for i, p in enumerate(ps)]
        # With --perf, client 0 runs under perf record too (client-N.data).
        procs = [h.Proc((["perf", "record", "-g", "-q", "-o", "client-%d.data" % n, "--"]
                         if perf and i == 0 else []) +
                        [h.build_path("tests", "pstool"), "--cluster", spec, "--worker",
                         str(i), "--rounds", str(steps), "--timeout", "120000", "syncload"])
                 for i in range(n)]
        walls, dropped = [], 0
        for p in procs:
            if p.wait(timeout=900) != 0:
                raise SystemExit("scale n=%d FAILED:\n%s" % (n, p.output()[-2000:]))
            r = kv([l for l in p.lines if l.startswith("syncload")][-1])
            walls.append(float(r["wall_s"]))
            dropped += int(r["dropped"])
        kids = children_cpu_s() - kids0
        cpu = sum(proc_cpu_s(p.p.pid) for p in ps) - sum(cpu0)
        for r in rec:
            r.send_signal(2)
            r.wait(timeout=60)
        if perf:
            for i, p in enumerate(ps):
                for tid, (name, c, vol, inv, wait) in sorted(threads(p.p.pid).items()):
                    b = th0[i].get(tid, [name, 0, 0, 0, 0])
                    if c - b[1] < 0.05:
                        continue
                    print("thread ps:%d %s %s cpu_s=%.2f runqueue_wait_s=%.2f voluntary_cs=%d "
                          "involuntary_cs=%d" % (i, tid, name, c - b[1], wait - b[4],
                                                 vol - b[2], inv - b[3]))
        st = json.loads(h.run([h.build_path("ps-server", "psctl"), "--cluster", spec,
                               "--json", "status"]).stdout)["shards"]
    finally:
        for p in ps:
            p.stop()
    wall = max(walls)
    pushes = sum(s["pushes"] for s in st)
    return {"workers": n, "pushes": pushes, "pushes_per_s": pushes / wall, "step_ms": 1000.0 * wall / steps,
            "dropped": dropped, "psd_cpu_s": cpu, "clients_cpu_s": kids, "load": load}


def main(argv):
    build, ns, repeats, steps, perf, base = argv[0], [], 2, 100, [], None
    i = 1
    while i < len(argv):
        if argv[i] == "--repeats":
            repeats, i = int(argv[i + 1]), i + 2
        elif argv[i] == "--steps":
            steps, i = int(argv[i + 1]), i + 2
        elif argv[i] == "--base":
            base, i = argv[i + 1], i + 2
        elif argv[i] == "--perf":
            perf, i = perf + [int(argv[i + 1])], i + 2
        else:
            ns, i = ns + [int(argv[i])], i + 1
    ns = ns or [1, 2, 4, 8, 16, 32, 64]
    h.BUILD = os.path.abspath(build)
    psds = [("psd", h.build_path("ps-server", "psd"))]
    if base:
        psds.append(("base", os.path.join(os.path.abspath(base), "ps-server", "psd")))
    res = {(name, n): [] for name, _ in psds for n in ns}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(repeats):
            for n in ns:
                for name, psd in psds:
                    r = one(d, n, steps, n in perf, psd)
                    res[(name, n)].append(r)
                    print("scale %s workers=%d pushes_per_s=%.0f step_ms=%.2f dropped=%d "
                          "psd_cpu_s=%.2f clients_cpu_s=%.2f pushes_per_psd_cpu_s=%.0f "
                          "load=%.2f"
                          % (name, n, r["pushes_per_s"], r["step_ms"], r["dropped"],
                             r["psd_cpu_s"], r["clients_cpu_s"],
                             r["pushes"] / r["psd_cpu_s"],
                             r["load"]), flush=True)
    for name, _ in psds:
        at8 = median([r["pushes_per_s"] for r in res[(name, 8)]]) if 8 in ns else None
        for n in ns:
            rs = res[(name, n)]
            m = median([r["pushes_per_s"] for r in rs])
            print("median %s workers=%d pushes_per_s=%.0f step_ms=%.2f psd_cpu_s=%.2f "
                  "clients_cpu_s=%.2f%s" % (
                      name, n, m, median([r["step_ms"] for r in rs]),
                      median([r["psd_cpu_s"] for r in rs]),
                      median([r["clients_cpu_s"] for r in rs]),
                      " vs_8=%.2f" % (m / at8) if at8 else ""), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
