"""The Python client's side of bench torch's client figure: what
`pstool roundtrip` times for the C client (tests/tools/pstool_bench.c),
done through psd.Client from Python.

  client_bench.py --cluster SPEC --bytes N --rounds R

declares an f32 variable of N bytes split across every shard of SPEC
(placement "split", zeros; the name tells it apart from pstool's), pushes
and pulls it once untimed, then times R pushes of a preallocated numpy
gradient and R pulls into a preallocated numpy array (each call one
psd.Client.push / .pull, the wall time over all R by time.monotonic), and
prints one line in pstool's form:

  pyclient bytes=16777216 push_MBps=1234 pull_MBps=1234 push_us=... pull_us=...

MB is 10^6 bytes, as pstool's. Needs PYTHONPATH=<build>/worker/python.
Exit status 0, 1 on a failure (psd.Error said on stderr), 2 on a bad
command line.
"""
import argparse
import sys
import time

import numpy as np

import psd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", required=True, help="the job's cluster spec")
    ap.add_argument("--bytes", type=int, required=True, help="the variable's bytes")
    ap.add_argument("--rounds", type=int, default=12, help="timed pushes and pulls (12)")
    args = ap.parse_args()
    n = args.bytes // 4
    if n < 1 or args.rounds < 1:
        ap.error("--bytes takes at least 4, --rounds at least 1")
    # pstool's shape: rows of 256 when they divide, else one column.
    shape = (n // 256, 256) if n % 256 == 0 else (n, 1)
    grad = ((np.arange(n, dtype=np.uint64) * 2654435761 % 1000).astype(np.float32)
            / 1000.0 - 0.5).reshape(shape)
    value = np.empty(shape, np.float32)
    try:
        with psd.Client(args.cluster) as c:
            v = c.declare("pyclient/%d" % args.bytes, shape, placement="split")
            c.pull(v, value)  # connections up, pages touched
            c.push(v, grad)
            c.pull(v, value)
            t0 = time.monotonic()
            for _ in range(args.rounds):
                c.push(v, grad)
            t1 = time.monotonic()
            for _ in range(args.rounds):
                c.pull(v, value)
            t2 = time.monotonic()
            if not np.isfinite(value).all():
                print("client_bench: the pulled values are not finite", file=sys.stderr)
                return 1
    except psd.Error as e:
        print("client_bench: %s [%s]" % (e, e.grpc_name), file=sys.stderr)
        return 1
    mb = args.bytes * args.rounds / 1e6
    print("pyclient bytes=%d push_MBps=%.0f pull_MBps=%.0f push_us=%.0f pull_us=%.0f"
          % (args.bytes, mb / (t1 - t0), mb / (t2 - t1),
             (t1 - t0) / args.rounds * 1e6, (t2 - t1) / args.rounds * 1e6), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
