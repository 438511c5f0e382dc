"""A process of counted pushes for test_relayout.py: one psd.Client that
pushes known gradients (multiples of 1/8, so every sum is exact in any
order) to a split dense variable "d", a small one "b" held whole, and the
rows of table "cnt", and raises the first MONO rows of table "mono" by 1
(a gradient of -1, sgd lr 1: values that only grow), until the file STOP
exists; each push, once
acknowledged, is added to what it pushed and said ("acked=N; shards=M",
M the client's psc_num_shards: the layout's count). The
library's log lines are printed ("psd: ..."). While the file PAUSE (when
given) exists, it pushes nothing and says "paused acked=N" once (a test's
checkpoint and kill at a known count). At the end it saves the sums of its
acknowledged pushes (OUT.npz) and says "done N".

Run: /usr/bin/python3 relayout_pusher.py BUILD_DIR SPEC SEED STOP OUT [PAUSE]"""
import os
import sys
import time

import numpy as np

D, B, POOL, PER_PUSH = 70000, 10, 4000, 300
MONO = 500  # rows of table "mono" that every push raises by 1


def main():
    build, spec, seed, stop, out = sys.argv[1:6]
    pause = sys.argv[6] if len(sys.argv) > 6 else None
    sys.path.insert(0, os.path.join(build, "worker", "python"))
    import psd
    psd.set_log_callback(lambda level, line: print("psd:", line, flush=True))
    rng = np.random.default_rng(int(seed))
    pool = np.arange(1, POOL + 1, dtype=np.uint64) * np.uint64(7919)
    sum_d = np.zeros(D, np.float32)
    sum_b = np.zeros(B, np.float32)
    sum_rows = np.zeros((POOL, 2), np.float32)
    n = 0
    with psd.Client(spec, None) as c:
        c.declare("d", (D,))  # 280 KB: split across the shards
        c.declare("b", (B,))  # whole, on the shard its name hashes to
        c.declare_table("cnt", 2)
        c.declare_table("mono", 1)
        print("declared", flush=True)
        while not os.path.exists(stop):
            if pause and os.path.exists(pause):
                print("paused acked=%d" % n, flush=True)
                while os.path.exists(pause) and not os.path.exists(stop):
                    time.sleep(0.005)
                continue
            gd = (rng.integers(-8, 9, D) / 8).astype(np.float32)
            gb = (rng.integers(-8, 9, B) / 8).astype(np.float32)
            c.push(["d", "b"], [gd, gb])
            sum_d += gd
            sum_b += gb
            n += 1
            pick = rng.choice(POOL, PER_PUSH, replace=False)
            g = (rng.integers(-8, 9, (PER_PUSH, 2)) / 8).astype(np.float32)
            c.push_rows("cnt", pool[pick], g)
            sum_rows[pick] += g
            n += 1
            c.push_rows("mono", pool[:MONO], -np.ones((MONO, 1), np.float32))
            print("acked=%d; shards=%d" % (n, c.num_shards), flush=True)
    np.savez(out, d=sum_d, b=sum_b, rows=sum_rows, ids=pool)
    print("done %d" % n, flush=True)


if __name__ == "__main__":
    main()
