"""A serving client for test_relayout.py: one psd.Serving that looks up,
until the file STOP exists, the rows of table "cnt" that
relayout_pusher.py pushes (ids 7919 * 1..4000) and the dense variable "d",
as a user's serving path would while the job is resharded under it. Each
round it says "looked=N; failed=F; unfound=U" (F: lookups that failed and
U: ids answered not found, after every one had been found once, which a
move must never cause; at the end also W, went_back: rows of table "mono",
whose values only grow, answered below a value answered before, which a
stale answer from a task that lost the row would cause; failures before, while the job starts and its
first publications lack the rows, are said as "starting: ..."), and
at the end its slowest round ("slowest round T ms"; a figure, not asserted), and
each failure's message ("failed: ..."). When the file SAVE exists it
writes the round's rows and dense values to OUT (an .npz), removes SAVE
and says "saved N".

Run: /usr/bin/python3 relayout_looker.py BUILD_DIR SPEC STOP SAVE OUT"""
import os
import sys
import time

import numpy as np

POOL = 4000
MONO = 500  # relayout_pusher.py's rows of "mono", whose values only grow


def main():
    build, spec, stop, save, out = sys.argv[1:6]
    sys.path.insert(0, os.path.join(build, "worker", "python"))
    import psd
    psd.set_log_callback(lambda level, line: print("psd:", line, flush=True))
    ids = np.arange(1, POOL + 1, dtype=np.uint64) * np.uint64(7919)
    looked = failed = unfound = went_back = 0
    last_mono = None
    slowest = 0.0
    all_found = False
    with psd.Serving(spec) as s:
        while not os.path.exists(stop):
            t0 = time.monotonic()
            try:
                rows, found, _ = s.lookup("cnt", ids)
                d = s.dense("d")
                mono, _, _ = s.lookup("mono", ids[:MONO])
            except Exception as e:  # a failed lookup: counted, said
                if not all_found:  # the job still starting: not yet published
                    print("starting: %s" % e, flush=True)
                    time.sleep(0.01)
                    continue
                failed += 1
                print("failed: %s" % e, flush=True)
                time.sleep(0.01)
                continue
            looked += 1
            if all_found and last_mono is not None:
                went_back += int(np.count_nonzero(mono < last_mono))
            last_mono = mono if last_mono is None else np.maximum(mono, last_mono)
            slowest = max(slowest, time.monotonic() - t0)
            if all_found:
                unfound += int(len(found) - np.count_nonzero(found))
            all_found = all_found or bool(np.all(found))
            print("looked=%d; failed=%d; unfound=%d; all_found=%d" % (
                looked, failed, unfound, all_found), flush=True)
            if os.path.exists(save):
                np.savez(out + ".tmp.npz", rows=rows, d=d)
                os.replace(out + ".tmp.npz", out)
                os.unlink(save)
                print("saved %d" % looked, flush=True)
    print("slowest round %.1f ms" % (slowest * 1000), flush=True)
    print("done looked=%d; failed=%d; unfound=%d; went_back=%d" % (
        looked, failed, unfound, went_back), flush=True)


if __name__ == "__main__":
    main()
