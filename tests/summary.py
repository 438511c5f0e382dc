"""Prints meson's test results as one closing line:
'N passed, N failed, N skipped', where a suite counts as skipped when it
could not run here at all (exit 77, meson's SKIP: the GPU suites without a
GPU, an integration module whose every case was skipped). Cases skipped
inside suites that passed are counted apart, and each is listed with its
reason (harness.main prints them), so a skip never reads as a pass."""
import json
import sys

counts = {"passed": 0, "failed": 0, "skipped": 0}
skipped_cases = []
try:
    with open(sys.argv[1] + "/meson-logs/testlog.json") as f:
        for line in f:
            t = json.loads(line)
            r = t.get("result", "")
            if r in ("OK", "EXPECTEDFAIL"):
                counts["passed"] += 1
            elif r == "SKIP":
                counts["skipped"] += 1
            else:
                counts["failed"] += 1
            for out in (t.get("stdout") or "").splitlines():
                if out.startswith("harness: skipped ") and ": " in out[17:]:
                    skipped_cases.append("%s: %s" % (t.get("name", "?"), out[17:]))
except OSError as e:
    print("summary: no test log (%s)" % e)
    sys.exit(0)
for c in skipped_cases:
    print("skipped case in %s" % c)
print("%d passed, %d failed, %d skipped (suites); %d test cases skipped inside "
      "passing suites" % (counts["passed"], counts["failed"], counts["skipped"],
                          len(skipped_cases)))
