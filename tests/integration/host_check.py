#!/usr/bin/python3
"""meson's first and last tests (host-before, host-after; tests/meson.build):
the host-wide settings that psd's tests may change (hostsys.SETTINGS,
net.core.wmem_max among them) are read before any test of the run starts
and again once every other test has ended, and must be the same: a run
leaves the host as it found it, whatever ran in between and in which order.

Both read under the host lock (hostsys.py), so neither sees a value that a
test of another run holds changed just then. The first writes what it read
to BUILD/tests/host-settings.json; the last compares with it (naming each
setting that differs, as found and as left), then removes it. Without the
first's record (the last run alone) the last exits 77.

Usage: host_check.py record|check BUILD_DIR
"""
import json
import os
import sys

import hostsys

EXIT_SKIP = 77


def read_all():
    """The settings now, under the host lock; reports a killed test's
    change that taking the lock undid."""
    left = hostsys.hold()
    try:
        for name, value in left.items():
            print("host_check: %s was left changed by a test killed before its "
                  "cleanup; restored to %s" % (name, value))
        return {n: hostsys.read(n) for n in hostsys.SETTINGS
                if hostsys.read(n) is not None}
    finally:
        hostsys.release()


def main(argv):
    if len(argv) != 3 or argv[1] not in ("record", "check"):
        sys.stderr.write("usage: %s record|check BUILD_DIR\n" % argv[0])
        return 2
    record = os.path.join(argv[2], "tests", "host-settings.json")
    now = read_all()
    if argv[1] == "record":
        with open(record, "w") as f:
            json.dump(now, f)
        print("host_check: found %s" % " ".join("%s=%s" % kv for kv in sorted(now.items())))
        return 0
    try:
        with open(record) as f:
            found = json.load(f)
    except FileNotFoundError:
        print("host_check: no record of the settings found before this run "
              "(%s): host-before did not run" % record)
        return EXIT_SKIP
    os.unlink(record)
    bad = ["%s was %s before the run and is %s after it" % (n, found[n], now.get(n))
           for n in sorted(found) if now.get(n) != found[n]]
    for line in bad:
        print("host_check: " + line)
    if not bad:
        print("host_check: left as found: %s"
              % " ".join("%s=%s" % kv for kv in sorted(now.items())))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
