"""Fault tests (docs/faults.md): real psd, dworker and pstool processes that
are broken on purpose while they work.

- kill -9 of a psd mid-training (shard 0: data and the coordinator); restarted
  as systemd would, it resumes from its newest checkpoint, the workers retry,
  join its coordinator again, and the job ends within 0.01 of the accuracy of
  the same spec without the fault;
- SIGSTOP of a psd past the call deadline: clients see DEADLINE_EXCEEDED,
  retry, go on after SIGCONT, and nothing is applied twice (a counted sgd
  variable ends exactly at pushes x lr x g; a deterministic sync job ends with
  bit-identical parameters);
- kill -9 of a worker, async and sync, while a shard is stopped: the others
  finish, every shard applied the same steps;
- a worker in a network namespace whose veth link goes down past the dead
  time and comes back: it joins again and the job completes;
- the checkpoint disk full (a real tmpfs) and then read-only: the write fails
  and says why, the previous checkpoint stays byte for byte, the shard serves;
- a push sent twice with the same (client, seq, chunk) is applied once, also
  when the shard was checkpointed and killed (kill -9) between the two: the
  restored table of applied pushes makes the retry a duplicate;
- 16 clients (PSD_SOAK=1: 64) pushing and pulling dense variables and the
  rows of a table (admission and eviction running, a checkpoint every
  second) against 2 shards for 10 s (60 s): no failed call, every update
  exact, psd's resident memory flat; and 8 clients doing the same while a
  random shard is stopped (SIGTERM) and started again, 2 times (8): every
  push, dense or sparse, applied exactly once.

Run: /usr/bin/python3 test_faults.py BUILD_DIR [TEST...]; exit 77 when every
test was skipped. The cases live in faults_kill.py, faults_outage.py and
faults_dedup.py, their helpers in faults.py."""

import harness as h
from faults_dedup import DedupTest, LoadTest  # noqa: F401
from faults_kill import KillPsdSyncTest, KillPsdTest, KillWorkerTest  # noqa: F401
from faults_outage import DiskTest, NetnsTest, StopTest  # noqa: F401
from faults_term import CutTest, RestartLoadTest, TermPsdTest  # noqa: F401
import os
import re
import unittest


class PartsTest(unittest.TestCase):
    """make test runs this module in parts, each naming its classes
    (faults_parts in tests/meson.build): every class here is in exactly
    one part, so that none is left out of make test."""

    def test_every_class_in_one_part(self):
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                               "meson.build")) as f:
            text = f.read()
        parts = text[text.index("faults_parts = ["):]
        parts = parts[:parts.index("\n]\n")]
        named = re.findall(r"'([A-Za-z]+Test)'", parts)
        here = sorted(n for n, v in globals().items()
                      if isinstance(v, type) and issubclass(v, unittest.TestCase)
                      and n.endswith("Test"))
        self.assertEqual(sorted(named), here)


if __name__ == "__main__":
    h.main()
