"""bench dlrm (tests/bench/bench.py): the DLRM example through psd against
the same model in one PyTorch process (docs/performance.md).

  local: deploy/examples/torch/dlrm_local.py, one process, one thread:
         nn.EmbeddingBag(sparse=True), torch.optim.Adagrad for the rows,
         torch.optim.Adam for the dense part
  psd:   `pslaunch SPEC`, deploy/examples/torch-dlrm.json on free ports:
         2 shards and 2 workers (dlrm.py, one thread each)

Both train one epoch of the same `psd-ctrgen --format criteo` set (its
defaults: 4M training and 100k held-out examples, in torch-dlrm.json's
data_dir, made once and kept) with the spec's batch, optimizers and tables
(all of psd.criteo.CARDINALITIES' rows), alternating over ROUNDS (3) rounds,
the order rotated. A rate is counted examples over wall time: the
baseline's from its first step to its last (its final: line), psd's
pslaunch's job: line (every worker's examples over the first step of any
worker to the last step of any). Rows pulled and pushed per second are the
workers' (unique ids per step and table) added up. Test AUC: each run's
(psd: worker 0's, after its last step). Lines:

  bench dlrm round=1 contender=local examples=4000000 seconds=160.2
        examples_per_s=24969 test_auc=0.7801
  bench dlrm round=1 contender=psd examples=4000000 seconds=...
        examples_per_s=... test_auc=... rows_pulled_per_s=... rows_pushed_per_s=...
  bench dlrm contender=psd ... ratio_to_local=1.31 round_ratios=1.29,1.31,1.40
  bench dlrm goal psd/local=1.31 (goal >= 1.2): met; auc psd-local=-0.0012
        (goal |.| <= 0.005): met; true_auc-psd=0.0100 (goal <= 0.02): met

PSD_BENCH_DLRM_TRAIN=N (and PSD_BENCH_DLRM_MAX_ROWS=R) make a quick run on
N examples (tables of at most R rows) in a scratch directory;
PSD_BENCH_DLRM_ROUNDS sets the rounds."""
import json
import os
import time

import harness as h

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.normpath(os.path.join(HERE, "..", "..", "deploy", "examples"))
TRAIN = int(os.environ.get("PSD_BENCH_DLRM_TRAIN", "0"))  # 0: psd-ctrgen's default
MAX_ROWS = int(os.environ.get("PSD_BENCH_DLRM_MAX_ROWS", "0"))  # 0: CARDINALITIES
ROUNDS = int(os.environ.get("PSD_BENCH_DLRM_ROUNDS", "3"))
TIMEOUT_S = 1800  # one run, data generation included
GOAL_RATE, GOAL_AUC_LOCAL, GOAL_AUC_TRUE = 1.2, 0.005, 0.02



def final_kv(b, argv, out, who):
    for line in out.splitlines():
        if "final: " + who in line:
            return b.kv(line.split("final: ", 1)[1])
    b.fail("dlrm", argv, "printed no 'final: %s' line" % who, out)


def spec(d, build):
    """torch-dlrm.json on free ports, data_dir, sizes and caps as asked;
    returns (spec path, its job, the extra arguments of both scripts)."""
    with open(os.path.join(EXAMPLES, "torch-dlrm.json")) as f:
        job = json.load(f)["job"]
    extra = []
    if TRAIN:
        job["data_dir"] = os.path.join(d, "dlrm-data")
        extra += ["--train", str(TRAIN), "--test", str(max(TRAIN // 20, 10000))]
    if MAX_ROWS:
        import sys
        sys.path.insert(0, os.path.join(EXAMPLES, "torch"))
        sys.path.insert(0, os.path.join(build, "worker", "python"))
        import dlrm_model
        job["tables"] = dlrm_model.capped_tables(job, MAX_ROWS)
        extra += ["--max-rows", str(MAX_ROWS)]
    job["log_every"] = 1000
    job["worker_command"] = ["/usr/bin/python3", os.path.join(EXAMPLES, "torch", "dlrm.py")] \
        + extra
    path = os.path.join(d, "dlrm.json")
    h.write_spec(path, nps=2, nworker=2, job=job)
    return path, job, extra


def run_local(b, path, extra, e):
    argv = ["/usr/bin/python3", os.path.join(EXAMPLES, "torch", "dlrm_local.py"), "--spec",
            path] + extra
    r = h.run(argv, timeout=TIMEOUT_S, env=e)
    if r.returncode != 0:
        b.fail("dlrm", argv, "exited %d" % r.returncode, r.stdout + r.stderr)
    f = final_kv(b, argv, r.stdout, "local")
    return {"examples": int(f["examples"]), "seconds": float(f["train_s"]),
            "rate": int(f["examples"]) / float(f["train_s"]), "auc": float(f["test_auc"]),
            "true_auc": float(f["true_auc"])}


def run_psd(b, path, e):
    argv = [h.build_path("deploy", "pslaunch"), path]
    r = h.run(argv, timeout=TIMEOUT_S, env=e)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        b.fail("dlrm", argv, "exited %d" % r.returncode, out)
    j = b.line_kv("dlrm", argv, r.stdout.splitlines(), "job:")
    if j.get("reported") != j.get("workers") or j.get("workers") != "2":
        b.fail("dlrm", argv, "the job: line covers %s of %s workers"
               % (j.get("reported"), j.get("workers")), out)
    fs = [final_kv(b, argv, r.stdout, "worker=%d" % i) for i in range(2)]
    examples = int(float(j["examples"]))
    if examples != sum(int(f["examples"]) for f in fs):
        b.fail("dlrm", argv, "the job: line counts %d examples, the workers %s"
               % (examples, [f["examples"] for f in fs]), out)
    secs = float(j["wall_s"])
    return {"examples": examples, "seconds": secs, "rate": examples / secs,
            "auc": float(fs[0]["test_auc"]), "true_auc": float(fs[0]["true_auc"]),
            "pulled": sum(int(f["rows_pulled"]) for f in fs) / secs,
            "pushed": sum(int(f["rows_pushed"]) for f in fs) / secs}


def dlrm(d, b):
    """bench.py's part dlrm (d: its scratch directory, b: bench.py's module)."""
    e = h.torch_env(h.BUILD)
    path, job, extra = spec(d, h.BUILD)
    t0 = time.monotonic()
    # The data, made once (the first run would make it inside its timing
    # otherwise: the scripts' own generation is outside their timed span,
    # but not outside pslaunch's).
    gen = ["/usr/bin/python3", "-c",
           "import sys; sys.path.insert(0, %r); import dlrm_model as dm; "
           "a = dm.parse_args(sys.argv[1:]); "
           "dm.ensure_data(%r, a.train, a.test, a.data_seed, 'bench')"
           % (os.path.join(EXAMPLES, "torch"), job["data_dir"])] + extra
    r = h.run(gen, timeout=TIMEOUT_S, env=e)
    if r.returncode != 0:
        b.fail("dlrm", gen, "exited %d" % r.returncode, r.stdout + r.stderr)
    print("bench dlrm data=%s ready in %.0f s" % (job["data_dir"], time.monotonic() - t0),
          flush=True)
    runs = [("local", lambda: run_local(b, path, extra, e)), ("psd", lambda: run_psd(b, path, e))]
    got = {"local": [], "psd": []}
    for i in range(ROUNDS):
        for name, fn in runs[i % 2:] + runs[:i % 2]:
            res = fn()
            got[name].append(res)
            line = ("bench dlrm round=%d contender=%s examples=%d seconds=%.1f "
                    "examples_per_s=%.0f test_auc=%.4f"
                    % (i + 1, name, res["examples"], res["seconds"], res["rate"], res["auc"]))
            if name == "psd":
                line += " rows_pulled_per_s=%.0f rows_pushed_per_s=%.0f" % (res["pulled"],
                                                                            res["pushed"])
            print(line, flush=True)
    ratios = [p["rate"] / l["rate"] for p, l in zip(got["psd"], got["local"])]
    ratio = b.median(ratios)
    dauc = b.median([p["auc"] - l["auc"] for p, l in zip(got["psd"], got["local"])])
    true_gap = b.median([p["true_auc"] - p["auc"] for p in got["psd"]])
    for name in ("local", "psd"):
        rs = got[name]
        line = ("bench dlrm contender=%s procs=%d shards=%d rounds=%d batch=%d epochs=%d "
                "examples=%d examples_per_s=%.0f test_auc=%.4f true_auc=%.4f"
                % (name, 1 if name == "local" else 2, 0 if name == "local" else 2, len(rs),
                   job["batch_size"], job["epochs"], rs[0]["examples"],
                   b.median([r["rate"] for r in rs]), b.median([r["auc"] for r in rs]),
                   rs[0]["true_auc"]))
        if name == "psd":
            line += (" rows_pulled_per_s=%.0f rows_pushed_per_s=%.0f ratio_to_local=%.2f"
                     " round_ratios=%s"
                     % (b.median([r["pulled"] for r in rs]),
                        b.median([r["pushed"] for r in rs]), ratio,
                        ",".join("%.2f" % q for q in ratios)))
        print(line, flush=True)
    print("bench dlrm goal psd/local=%.2f (goal >= %.1f): %s; auc psd-local=%+.4f "
          "(goal |.| <= %.3f): %s; true_auc-psd=%.4f (goal <= %.2f): %s"
          % (ratio, GOAL_RATE, "met" if ratio >= GOAL_RATE else "NOT met", dauc,
             GOAL_AUC_LOCAL, "met" if abs(dauc) <= GOAL_AUC_LOCAL else "NOT met", true_gap,
             GOAL_AUC_TRUE, "met" if true_gap <= GOAL_AUC_TRUE else "NOT met"), flush=True)
