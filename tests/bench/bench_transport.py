"""bench transport and bench transport shards=2 clients=2 (the `aggregate`
section) of tests/bench/bench.py: pstool roundtrip's push and pull rates over
TCP, over the Unix socket and through shared memory, each against a plain
loopback TCP stream of the same bytes, alternating (docs/performance.md,
"bench transport"). b is the bench module (its helpers and SIZES, REPEATS),
as bench_torch takes it."""
import json
import os

import harness as h


def tcp_mbps(b, part, size, rounds):
    argv = [h.build_path("tests", "pstool"), "--bytes", str(max(size, 1 << 20)),
            "--rounds", str(max(rounds, 16)), "tcp"]
    return float(b.line_kv(part, argv, b.run_ok(part, argv).stdout.splitlines(), "tcp")["MBps"])


def tcp_rt_p50_us(b, part, size, rounds):
    """The latency baseline: a plain loopback TCP ping-pong of size bytes
    out and 64 back (pstool tcp --pingpong), p50 in microseconds."""
    argv = [h.build_path("tests", "pstool"), "--bytes", str(size), "--rounds", str(rounds),
            "--pingpong", "tcp"]
    return float(b.line_kv(part, argv, b.run_ok(part, argv).stdout.splitlines(),
                         "tcp pingpong")["rt_p50_us"])


def via_specs(spec, cfg, name):
    """The spec (shared memory, what a client on the shard's host picks)
    beside its variants over TCP (job.unix_sockets false, as between hosts)
    and over the Unix socket without shared memory (job.shared_memory
    false), in the order they run: [(via, path)]."""
    out = []
    for via, key in (("tcp", "unix_sockets"), ("unix", "shared_memory")):
        c = json.loads(json.dumps(cfg))
        c["job"][key] = False
        path = os.path.join(os.path.dirname(spec), "%s-%s.json" % (name, via))
        with open(path, "w") as f:
            json.dump(c, f)
        out.append((via, path))
    return out + [("shm", spec)]


def via_of(rt):
    """The path a roundtrip line says it took: tcp, unix or shm."""
    return "shm" if rt.get("shm") == "yes" else rt.get("via")


def transport(d, b):
    """gRPC over TCP (the spec's job.unix_sockets false, as between hosts),
    over the shard's Unix socket (job.shared_memory false) and through shared
    memory (what a client on the same host picks), each against a loopback
    TCP stream of the same bytes, alternating."""
    spec = os.path.join(d, "bench.json")
    cfg = h.write_spec(spec, nps=1, nworker=1, job={"name": "bench", "optimizer": {"type": "sgd"}})
    vias = via_specs(spec, cfg, "bench")
    with b.procs("transport") as started:
        b.start_psd("transport", started, spec, 0)
        for size, rounds in b.SIZES:
            res = {via: ([], [], []) for via, _ in vias}
            tcp, tcp_rt = [], []
            for _ in range(b.REPEATS):
                for via, sp in vias:
                    argv = b.pstool(sp, "--bytes", str(size), "--rounds", str(rounds), "roundtrip")
                    r = b.run_ok("transport", argv)
                    rt = b.line_kv("transport", argv, r.stdout.splitlines(), "roundtrip")
                    if via_of(rt) != via:
                        b.fail("transport", argv, "used via=%s, not %s" % (via_of(rt), via),
                             r.stdout)
                    res[via][0].append(float(rt["push_MBps"]))
                    res[via][1].append(float(rt["pull_MBps"]))
                    res[via][2].append(rt)
                tcp.append(tcp_mbps(b, "transport", size, rounds))
                if size <= 4096:
                    tcp_rt.append(tcp_rt_p50_us(b, "transport", size, rounds))
            for via, _ in vias:
                push, pull, lat = res[via]
                line = ("bench transport size=%d via=%s push_MBps=%.0f pull_MBps=%.0f "
                        "tcp_MBps=%.0f push_ratio=%.2f pull_ratio=%.2f"
                        % (size, via, b.median(push), b.median(pull), b.median(tcp),
                           b.median(push) / b.median(tcp), b.median(pull) / b.median(tcp)))
                if size <= 4096:
                    line += (" pull_p50_us=%.0f pull_p99_us=%.0f push_p50_us=%.0f "
                             "push_p99_us=%.0f" % (
                                 b.median([float(x["pull_p50_us"]) for x in lat]),
                                 b.median([float(x["pull_p99_us"]) for x in lat]),
                                 b.median([float(x["push_p50_us"]) for x in lat]),
                                 b.median([float(x["push_p99_us"]) for x in lat])))
                    # The machine's own floor for a small round trip, and
                    # psd's pull p50 over it.
                    line += " tcp_rt_p50_us=%.0f pull_p50_ratio_to_tcp_rt=%.2f" % (
                        b.median(tcp_rt),
                        b.median([float(x["pull_p50_us"]) for x in lat]) / b.median(tcp_rt))
                print(line, flush=True)


def aggregate(d, b):
    """2 shards and 2 clients at once, 64 MiB each, over TCP, over the Unix
    sockets and through shared memory, against one TCP stream."""
    spec = os.path.join(d, "agg.json")
    cfg = h.write_spec(spec, nps=2, nworker=2,
                       job={"name": "bench-agg", "optimizer": {"type": "sgd"}})
    vias = via_specs(spec, cfg, "agg")
    size, rounds = 64 << 20, 4
    with b.procs("aggregate") as started:
        for i in range(2):
            b.start_psd("aggregate", started, spec, i)
        totals = {via: [] for via, _ in vias}
        for _ in range(b.REPEATS):
            for via, sp in vias:
                clients = []
                for i in range(2):
                    clients.append(h.Proc(b.pstool(sp, "--bytes", str(size), "--rounds",
                                                 str(rounds), "--worker", str(i), "roundtrip")))
                    started.append(clients[-1])
                b.wait_all_ok("aggregate", clients)
                rs = []
                for p in clients:
                    rs.append(b.line_kv("aggregate", p.argv, p.lines, "roundtrip"))
                    if via_of(rs[-1]) != via:
                        b.fail("aggregate", p.argv, "used via=%s, not %s"
                             % (via_of(rs[-1]), via), p.output())
                totals[via].append((sum(float(r["push_MBps"]) for r in rs),
                                    sum(float(r["pull_MBps"]) for r in rs)))
        tcp = tcp_mbps(b, "aggregate", size, rounds)
        for via, _ in vias:
            push = b.median([t[0] for t in totals[via]])
            pull = b.median([t[1] for t in totals[via]])
            print("bench transport shards=2 clients=2 size=%d via=%s push_MBps=%.0f "
                  "pull_MBps=%.0f tcp_MBps=%.0f push_ratio=%.2f pull_ratio=%.2f"
                  % (size, via, push, pull, tcp, push / tcp, pull / tcp), flush=True)
