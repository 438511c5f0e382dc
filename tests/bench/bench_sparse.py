"""bench sparse (tests/bench/bench.py): embedding-table rows per second over
the network against the same work in one process (docs/performance.md).
Set PSD_BENCH_SPARSE_ROWS for a quick run on a smaller table."""
import os

import harness as h

SPARSE_ROWS = int(os.environ.get("PSD_BENCH_SPARSE_ROWS", 10_000_000))  # table rows
SPARSE_SECONDS = 4        # each timed phase
SPARSE_ROUNDS = 2         # rounds, alternating psd and the in-memory baseline
# Ids per call: the old benchmark's 1,024, and a realistic one, a CTR
# model's batch of 4,096 examples of 26 categorical fields (Criteo's),
# its ids Zipf draws that repeat as real ones do.
EXAMPLES, FIELDS = 4096, 26
BATCHES = (1024, EXAMPLES * FIELDS)


def sparse(d, b):
    """Embedding-table rows per second: 2 shards and 2 clients pull, then
    push (adagrad), batches of 1,024 and of 106,496 (4,096 examples x 26
    fields) Zipf-distributed ids (s 1.1) against a table of 10 million
    rows, at dim 16 and 64 (pstool sparse), alternated with the same
    lookups and updates in one process on psd's own table code with no
    network (sparse-mem, the same batches); the ratio is psd's aggregate
    over the baseline's. A rate counts every id of every call, repeats
    included (the client asks a shard for each row once). The shards'
    memory for the rows is read from Status's tables (bytes held over the
    rows' value and state bytes). b is bench.py's module: its helpers run
    the commands and report failures."""
    for dim in (16, 64):
        spec = os.path.join(d, "sparse%d.json" % dim)
        h.write_spec(spec, nps=2, nworker=2,
                     job={"name": "bench-sparse", "rpc_timeout_ms": 120000,
                          "tables": [{"name": "bench/%d" % dim, "dim": dim,
                                      "optimizer": {"type": "adagrad", "lr": 0.05}}]})
        got = {(k, n): [] for k in ("pull", "push", "mem_pull", "mem_push")
               for n in BATCHES}
        overhead = mem_overhead = None
        for _ in range(SPARSE_ROUNDS):
            with b.procs("sparse") as started:
                for i in range(2):
                    b.start_psd("sparse", started, spec, i)
                for batch in BATCHES:
                    # The baseline right before psd, at the same batch.
                    r = b.run_ok("sparse", [h.build_path("tests", "sparse-mem"), str(dim),
                                          str(SPARSE_ROWS), str(SPARSE_SECONDS), str(batch)])
                    m = b.line_kv("sparse", ["sparse-mem"], r.stdout.splitlines(),
                                  "sparse_mem")
                    got[("mem_pull", batch)].append(float(m["pull_rows_per_s"]))
                    got[("mem_push", batch)].append(float(m["push_rows_per_s"]))
                    mem_overhead = float(m["overhead"])
                    # pstool fills the table first (on the second batch the
                    # rows exist: the fill only pulls them again).
                    argv = b.pstool(spec, "--clients", "2", "--bytes", str(SPARSE_ROWS),
                                    "--seconds", str(SPARSE_SECONDS), "--timeout", "120000",
                                    "--chunk", str(batch), "sparse", str(dim))
                    r = b.run_ok("sparse", argv)
                    k = b.line_kv("sparse", argv, r.stdout.splitlines(), "sparse")
                    got[("pull", batch)].append(float(k["pull_rows_per_s"]))
                    got[("push", batch)].append(float(k["push_rows_per_s"]))
                st = b.psctl_status("sparse", spec)["shards"]
                held = sum(t["bytes"] for s in st for t in s.get("tables", []))
                raw = sum(t["raw_bytes"] for s in st for t in s.get("tables", []))
                rows = sum(t["rows"] for s in st for t in s.get("tables", []))
                if rows != SPARSE_ROWS:
                    b.fail("sparse", argv, "the shards hold %d rows; %d were filled"
                           % (rows, SPARSE_ROWS), r.stdout + r.stderr)
                overhead = held / raw
        for batch in BATCHES:
            pull, push = b.median(got[("pull", batch)]), b.median(got[("push", batch)])
            mpull = b.median(got[("mem_pull", batch)])
            mpush = b.median(got[("mem_push", batch)])
            shape = ("" if batch == 1024 else
                     " examples=%d fields=%d" % (EXAMPLES, FIELDS))
            print("bench sparse dim=%d rows=%d shards=2 clients=2 batch=%d%s "
                  "pull_rows_per_s=%.0f push_rows_per_s=%.0f mem_pull_rows_per_s=%.0f "
                  "mem_push_rows_per_s=%.0f pull_ratio=%.2f push_ratio=%.2f "
                  "memory_overhead=%.3f mem_overhead=%.3f"
                  % (dim, SPARSE_ROWS, batch, shape, pull, push, mpull, mpush,
                     pull / mpull, push / mpush, overhead, mem_overhead), flush=True)
