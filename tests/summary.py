"""Prints meson's test results as one closing line: 'N passed, N failed, N skipped'."""
import json
import sys

counts = {"passed": 0, "failed": 0, "skipped": 0}
try:
    with open(sys.argv[1] + "/meson-logs/testlog.json") as f:
        for line in f:
            r = json.loads(line).get("result", "")
            if r in ("OK", "EXPECTEDFAIL"):
                counts["passed"] += 1
            elif r == "SKIP":
                counts["skipped"] += 1
            else:
                counts["failed"] += 1
except OSError as e:
    print("summary: no test log (%s)" % e)
    sys.exit(0)
print("%d passed, %d failed, %d skipped" % (counts["passed"], counts["failed"], counts["skipped"]))
