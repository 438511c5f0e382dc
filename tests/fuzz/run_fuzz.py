"""Runs the libFuzzer target over psd's request handling (tests/fuzz).

First every committed input is replayed once, the regressions (inputs that
once crashed psd) and the corpus; then, with --seconds, the fuzzer runs for
that long from the corpus and freshly written seeds, keeping what it finds
new in --work. A crash fails with the input saved under --work/artifacts
and the command to replay it. Without --fuzzer (clang with -fsanitize=fuzzer
was not found) it exits 77, which meson reports as skipped.

  run_fuzz.py --fuzzer F --seeds fuzz-seeds --corpus DIR --regressions DIR
              --work DIR [--seconds N] [--merge]
--merge minimizes the work corpus into --corpus (to commit it)."""
import argparse
import os
import re
import shutil
import subprocess
import sys


def inputs(d):
    if not os.path.isdir(d):
        return []
    return sorted(os.path.join(d, f) for f in os.listdir(d)
                  if not f.startswith(".") and f != "README")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fuzzer")
    ap.add_argument("--seeds", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--regressions", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--merge", action="store_true")
    a = ap.parse_args()
    if not a.fuzzer or not os.path.exists(a.fuzzer):
        print("fuzz: skipped, the fuzzer is not built (it needs clang with "
              "-fsanitize=fuzzer; meson option fuzz)")
        return 77
    seeds = os.path.join(a.work, "seeds")
    found = os.path.join(a.work, "corpus")
    artifacts = os.path.join(a.work, "artifacts") + os.sep
    for d in (seeds, found, artifacts):
        os.makedirs(d, exist_ok=True)
    subprocess.run([a.seeds, seeds], check=True)
    env = dict(os.environ)
    # A leak is a finding too; gRPC's and c-ares' own are not ours.
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")

    # Replay: each committed input once, as a test of its own.
    old = inputs(a.regressions) + inputs(a.corpus) + inputs(seeds)
    r = subprocess.run([a.fuzzer, "-rss_limit_mb=1024", "-timeout=30"] + old,
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stdout + r.stderr[-20000:])
        print("fuzz: FAILED replaying the committed inputs")
        return 1
    print("fuzz: replayed %d inputs (%d regressions, %d corpus, %d seeds): "
          "all handled" % (len(old), len(inputs(a.regressions)),
                           len(inputs(a.corpus)), len(inputs(seeds))))

    if a.seconds > 0:
        cmd = [a.fuzzer, "-max_total_time=%d" % a.seconds, "-rss_limit_mb=1024",
               "-timeout=30", "-print_final_stats=1",
               "-artifact_prefix=" + artifacts, found, seeds, a.corpus,
               a.regressions]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        done = [l for l in r.stderr.splitlines() if re.match(r"#\d+\s+DONE", l)]
        stats = [l for l in r.stderr.splitlines() if l.startswith("stat::")]
        if r.returncode != 0:
            sys.stdout.write(r.stderr[-20000:])
            crash = [l for l in r.stderr.splitlines() if "Test unit written to" in l]
            print("fuzz: FAILED: %s" % (crash[-1] if crash else "the fuzzer exited %d"
                                        % r.returncode))
            print("replay: %s %s" % (a.fuzzer, crash[-1].split()[-1] if crash else ""))
            return 1
        print("fuzz: %d s: %s" % (a.seconds, done[-1] if done else "(no summary)"))
        for l in stats:
            print("fuzz:   " + l)
        print("fuzz: %d inputs in %s" % (len(inputs(found)), found))

    if a.merge:
        merged = os.path.join(a.work, "merged")
        shutil.rmtree(merged, ignore_errors=True)
        os.makedirs(merged)
        subprocess.run([a.fuzzer, "-merge=1", "-rss_limit_mb=1024", merged,
                        a.corpus, found, seeds], env=env, check=True,
                       capture_output=True)
        for f in inputs(a.corpus):
            os.remove(f)
        for f in inputs(merged):
            shutil.copy(f, a.corpus)
        print("fuzz: corpus minimized to %d inputs in %s"
              % (len(inputs(a.corpus)), a.corpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
