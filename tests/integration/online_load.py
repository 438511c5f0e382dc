"""A load of lookups for test_online.py and bench_serve.py: one process that
asks the serving tasks of SPEC (psd.Serving) for BATCH ids of TABLE drawn
from the ids in IDS (a .npy of uint64), again and again until the file STOP
exists, then writes OUT (JSON): calls, failures (with their messages),
rows looked up, seconds, and, with --samples N, every N-th answer (ids,
rows, found, versions) into OUT's .npz beside it.
Run: /usr/bin/python3 online_load.py SPEC TABLE IDS STOP OUT [--batch B]
     [--samples N] [--seed S] [--replica R]"""
import argparse
import json
import os
import sys
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    for a in ("spec", "table", "ids", "stop", "out"):
        ap.add_argument(a)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--samples", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replica", type=int, default=None)
    ap.add_argument("--build", default=None)
    a = ap.parse_args()
    if a.build:
        sys.path.insert(0, os.path.join(a.build, "worker", "python"))
    import psd
    pool = np.load(a.ids)
    rng = np.random.default_rng(a.seed)
    calls = fails = rows = 0
    errors, kept = [], {"ids": [], "rows": [], "found": [], "versions": []}
    s = psd.Serving(a.spec, replica=a.replica)
    print("load: ready", flush=True)
    t0 = time.monotonic()
    while not os.path.exists(a.stop):
        ids = pool[rng.integers(0, len(pool), a.batch)]
        try:
            r, found, versions = s.lookup(a.table, ids)
        except psd.Error as e:  # counted, and the load goes on
            fails += 1
            if len(errors) < 20:
                errors.append(str(e))
            continue
        finally:
            calls += 1
        rows += len(ids)
        if a.samples and calls % a.samples == 0:
            kept["ids"].append(ids)
            kept["rows"].append(r)
            kept["found"].append(found)
            kept["versions"].append(np.asarray(versions, np.uint64))
    secs = time.monotonic() - t0
    s.close()
    if a.samples and kept["ids"]:
        np.savez(os.path.splitext(a.out)[0] + ".npz",
                 **{k: np.stack(v) for k, v in kept.items()})
    with open(a.out, "w") as f:
        json.dump({"calls": calls, "failures": fails, "errors": errors,
                   "rows": rows, "seconds": secs,
                   "samples": len(kept["ids"])}, f)


if __name__ == "__main__":
    main()
