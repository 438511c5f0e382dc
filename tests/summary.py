"""Prints meson's test results as one closing line:
'N passed, N failed, N skipped', where a suite counts as skipped when it
could not run here at all (exit 77, meson's SKIP: the GPU suites without a
GPU, an integration module whose every case was skipped). Cases skipped
inside suites that passed are counted apart, and each is listed with its
reason (harness.main prints them), so a skip never reads as a pass. A
second line counts the cases the suites ran (harness.main's 'harness: ran N
cases', check's 'Checks: N'), so that a suite split in two, or merged, shows
whether any case was lost."""
import json
import re
import sys

counts = {"passed": 0, "failed": 0, "skipped": 0}
skipped_cases = []
cases = 0  # cases the suites that said so ran
uncounted = 0  # suites that ran and said no count (each one case)
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
            n = None
            for out in (t.get("stdout") or "").splitlines():
                if out.startswith("harness: skipped ") and ": " in out[17:]:
                    skipped_cases.append("%s: %s" % (t.get("name", "?"), out[17:]))
                m = re.match(r"harness: ran (\d+) cases$", out) or \
                    re.search(r"\d+%: Checks: (\d+),", out)
                if m:
                    n = (n or 0) + int(m.group(1))
            if n is None:  # a unittest module not run by harness.main
                m = re.search(r"^Ran (\d+) tests? in ", t.get("stderr") or "", re.M)
                n = int(m.group(1)) if m else None
            if n is not None:
                cases += n
            elif r != "SKIP":
                uncounted += 1
except OSError as e:
    print("summary: no test log (%s)" % e)
    sys.exit(0)
for c in skipped_cases:
    print("skipped case in %s" % c)
print("cases: %d run by the suites that count them, %d suites more that ran "
      "without a count" % (cases, uncounted))
print("%d passed, %d failed, %d skipped (suites); %d test cases skipped inside "
      "passing suites" % (counts["passed"], counts["failed"], counts["skipped"],
                          len(skipped_cases)))
